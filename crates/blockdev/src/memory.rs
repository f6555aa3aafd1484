//! An in-memory block device for tests and as the backing store of the simulated SSD.
//!
//! The image is split into chunks of [`CHUNK_BYTES`], each behind its own mutex, so that threads
//! doing I/O to different places do not serialize on one lock. Invariants:
//! - every chunk is `CHUNK_BYTES` long except possibly the last, and their lengths add up to
//!   `size_bytes`;
//! - `CHUNK_BYTES` is a multiple of [`SECTOR_SIZE`], so a sector never straddles two chunks and
//!   every sector is written atomically with respect to concurrent readers (the same promise a
//!   real device makes, and no more: a multi-sector I/O may be observed half done);
//! - an I/O holds at most one chunk lock at a time, and [`MemDevice::snapshot`] takes all of them
//!   in ascending order, so no lock order can deadlock.
//!
//! `write_at` completes straight into the image and `flush` is a no-op: the memory device has no
//! volatile cache, so every completed write is durable (use the recording device to model one).

use parking_lot::{Mutex, MutexGuard};

use crate::{check_range, BlockDevice, DeviceError, Op, SECTOR_SIZE};

/// Bytes per independently locked chunk. 64 KiB keeps the lock count small (16 per MiB) while
/// concurrent 4 KiB writers to different blocks rarely meet on the same lock.
pub const CHUNK_BYTES: usize = 64 * 1024;

const _: () = assert!((CHUNK_BYTES as u64).is_multiple_of(SECTOR_SIZE));

/// A byte-array block device. See the module documentation.
pub struct MemDevice {
    size_bytes: u64,
    chunks: Vec<Mutex<Box<[u8]>>>,
}

impl MemDevice {
    /// A zero-filled device of `size_bytes`, which must be a multiple of [`SECTOR_SIZE`].
    pub fn new(size_bytes: u64) -> MemDevice {
        let len = usize::try_from(size_bytes).expect("memory device size must fit in memory");
        MemDevice::from_bytes(vec![0; len])
    }

    /// A device whose contents are `bytes`; the length must be a multiple of [`SECTOR_SIZE`]
    /// (pad an image read from elsewhere before handing it over).
    pub fn from_bytes(bytes: Vec<u8>) -> MemDevice {
        assert!(
            (bytes.len() as u64).is_multiple_of(SECTOR_SIZE),
            "memory device size {} is not a multiple of {SECTOR_SIZE}",
            bytes.len()
        );
        let size_bytes = bytes.len() as u64;
        let chunks: Vec<Mutex<Box<[u8]>>> =
            bytes.chunks(CHUNK_BYTES).map(|c| Mutex::new(c.to_vec().into_boxed_slice())).collect();
        assert_eq!(chunks.iter().map(|c| c.lock().len() as u64).sum::<u64>(), size_bytes);
        MemDevice { size_bytes, chunks }
    }

    /// A copy of the whole image at one instant: every chunk lock is held while copying, so no
    /// write is seen half applied across chunks.
    pub fn snapshot(&self) -> Vec<u8> {
        let guards: Vec<MutexGuard<'_, Box<[u8]>>> = self.chunks.iter().map(|c| c.lock()).collect();
        let mut image = Vec::with_capacity(self.size_bytes as usize);
        for g in &guards {
            image.extend_from_slice(g);
        }
        assert_eq!(image.len() as u64, self.size_bytes);
        image
    }

    /// Calls `f(chunk, range within chunk, range within the caller's buffer)` for each chunk the
    /// already-checked byte range `offset..offset + len` touches, in ascending order.
    fn for_each_chunk(
        &self,
        offset: u64,
        len: usize,
        mut f: impl FnMut(&mut [u8], std::ops::Range<usize>),
    ) {
        let mut done = 0usize;
        while done < len {
            let pos = offset as usize + done;
            let index = pos / CHUNK_BYTES;
            let within = pos % CHUNK_BYTES;
            let mut chunk = self.chunks[index].lock();
            let n = (chunk.len() - within).min(len - done);
            assert!(n > 0, "chunk walk made no progress at byte {pos}");
            f(&mut chunk[within..within + n], done..done + n);
            done += n;
        }
    }

    fn write(&self, op: Op, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        check_range(op, offset, data.len(), self.size_bytes)?;
        self.for_each_chunk(offset, data.len(), |chunk, range| {
            chunk.copy_from_slice(&data[range]);
        });
        Ok(())
    }
}

impl BlockDevice for MemDevice {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        check_range(Op::Read, offset, buf.len(), self.size_bytes)?;
        self.for_each_chunk(offset, buf.len(), |chunk, range| {
            buf[range].copy_from_slice(chunk);
        });
        Ok(())
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        self.write(Op::Write, offset, data)
    }

    fn write_fua_at(&self, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        self.write(Op::WriteFua, offset, data)
    }

    fn flush(&self) -> Result<(), DeviceError> {
        Ok(())
    }

    /// Memory has no volatile cache, so every write is ordered.
    fn has_cache_barrier(&self) -> bool {
        true
    }

    fn write_barrier_at(&self, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        self.write(Op::WriteBarrier, offset, data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_spanning_chunk_boundaries_round_trips() {
        let dev = MemDevice::new(3 * CHUNK_BYTES as u64 + 1024);
        let data: Vec<u8> = (0..CHUNK_BYTES + 2048).map(|i| (i % 251) as u8).collect();
        let offset = CHUNK_BYTES as u64 - 1024;
        dev.write_at(offset, &data).unwrap();
        let mut back = vec![0; data.len()];
        dev.read_at(offset, &mut back).unwrap();
        assert_eq!(back, data);
        let image = dev.snapshot();
        assert_eq!(&image[offset as usize..offset as usize + data.len()], &data[..]);
        assert!(image[..offset as usize].iter().all(|&b| b == 0));
    }

    #[test]
    fn last_partial_chunk_is_addressable_to_the_device_end() {
        let dev = MemDevice::new(CHUNK_BYTES as u64 + 512);
        dev.write_at(CHUNK_BYTES as u64, &[7; 512]).unwrap();
        let mut back = [0; 512];
        dev.read_at(CHUNK_BYTES as u64, &mut back).unwrap();
        assert_eq!(back, [7; 512]);
        assert!(matches!(
            dev.write_at(CHUNK_BYTES as u64 + 512, &[0; 512]),
            Err(DeviceError::OutOfRange { .. })
        ));
    }

    #[test]
    fn misaligned_io_is_rejected_without_touching_the_image() {
        let dev = MemDevice::from_bytes(vec![1; 4096]);
        assert!(matches!(dev.write_at(100, &[0; 512]), Err(DeviceError::Misaligned { .. })));
        assert!(matches!(dev.write_fua_at(0, &[0; 100]), Err(DeviceError::Misaligned { .. })));
        assert_eq!(dev.snapshot(), vec![1; 4096]);
    }

    #[test]
    fn empty_device_and_empty_io_are_fine() {
        let dev = MemDevice::new(0);
        assert_eq!(dev.size_bytes(), 0);
        dev.read_at(0, &mut []).unwrap();
        assert!(dev.snapshot().is_empty());
    }
}
