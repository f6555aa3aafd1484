//! A copy-on-write view of another device: reads come from the base device except where this
//! view was written; writes stay in memory and never reach the base. Used to replay a journal
//! for a read-only mount without writing the image (the image may not even be writable), as
//! fuse2fs does.
//!
//! Writes are kept per sector ([`SECTOR_SIZE`]), the unit every I/O is aligned to, so a later
//! read of any range sees exactly the sectors written over the base. Flush and FUA have nothing
//! to make durable: the view is gone when dropped.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;

use crate::{check_range, BlockDevice, DeviceError, Op, SECTOR_SIZE};

const SECTOR: usize = SECTOR_SIZE as usize;

/// See the module documentation.
pub struct OverlayDevice {
    base: Arc<dyn BlockDevice>,
    /// Written sectors by sector number.
    sectors: RwLock<HashMap<u64, Box<[u8; SECTOR]>>>,
}

impl OverlayDevice {
    pub fn new(base: Arc<dyn BlockDevice>) -> OverlayDevice {
        OverlayDevice { base, sectors: RwLock::new(HashMap::new()) }
    }

    /// Bytes held in memory for written sectors.
    pub fn bytes_written(&self) -> u64 {
        self.sectors.read().len() as u64 * SECTOR_SIZE
    }
}

impl BlockDevice for OverlayDevice {
    fn size_bytes(&self) -> u64 {
        self.base.size_bytes()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        check_range(Op::Read, offset, buf.len(), self.size_bytes())?;
        let sectors = self.sectors.read();
        let first = offset / SECTOR_SIZE;
        let count = (buf.len() / SECTOR) as u64;
        if (first..first + count).any(|sector| !sectors.contains_key(&sector)) {
            self.base.read_at(offset, buf)?;
        }
        for (sector, chunk) in (first..).zip(buf.chunks_exact_mut(SECTOR)) {
            if let Some(written) = sectors.get(&sector) {
                chunk.copy_from_slice(&written[..]);
            }
        }
        Ok(())
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        check_range(Op::Write, offset, data.len(), self.size_bytes())?;
        let mut sectors = self.sectors.write();
        let first = offset / SECTOR_SIZE;
        for (i, chunk) in data.chunks_exact(SECTOR).enumerate() {
            let sector: [u8; SECTOR] = chunk.try_into().expect("a whole sector");
            sectors.insert(first + i as u64, Box::new(sector));
        }
        Ok(())
    }

    fn write_fua_at(&self, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        self.write_at(offset, data)
    }

    fn flush(&self) -> Result<(), DeviceError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemDevice;

    #[test]
    fn writes_stay_in_the_overlay_and_reads_merge_them_over_the_base() {
        let base = Arc::new(MemDevice::from_bytes((0..8192u32).map(|i| i as u8).collect()));
        let before = base.snapshot();
        let overlay = OverlayDevice::new(base.clone());
        overlay.write_at(1024, &[0xAA; 1024]).unwrap();
        overlay.write_fua_at(4096, &[0xBB; 512]).unwrap();
        overlay.flush().unwrap();
        assert_eq!(base.snapshot(), before, "the base is never written");
        let mut all = vec![0; 8192];
        overlay.read_at(0, &mut all).unwrap();
        let mut want = before.clone();
        want[1024..2048].fill(0xAA);
        want[4096..4608].fill(0xBB);
        assert_eq!(all, want);
        // A read wholly inside written sectors, and one of base sectors only.
        let mut part = vec![0; 512];
        overlay.read_at(1536, &mut part).unwrap();
        assert_eq!(part, vec![0xAA; 512]);
        overlay.read_at(7680, &mut part).unwrap();
        assert_eq!(part, before[7680..]);
        assert_eq!(overlay.bytes_written(), 1024 + 512);
        assert!(overlay.write_at(8192, &[0; 512]).is_err(), "past the end");
        assert!(overlay.read_at(100, &mut part).is_err(), "misaligned");
    }
}
