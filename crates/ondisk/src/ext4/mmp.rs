//! The multiple-mount-protection block (`struct mmp_struct`, the mmp feature): a sequence
//! number the host that has the file system mounted keeps changing, so another host that
//! sees it change knows the file system is in use (`Documentation/filesystems/ext4/mmp.rst`,
//! `fs/ext4/mmp.c`).
//!
//! | offset | field                | meaning                                              |
//! |--------|----------------------|------------------------------------------------------|
//! | 0x0    | `mmp_magic`          | [`MMP_MAGIC`]                                        |
//! | 0x4    | `mmp_seq`            | [`MMP_SEQ_CLEAN`], [`MMP_SEQ_FSCK`], or 1..=[`MMP_SEQ_MAX`] while mounted |
//! | 0x8    | `mmp_time`           | last update, seconds since the epoch                 |
//! | 0x10   | `mmp_nodename[64]`   | the updating host's name                             |
//! | 0x50   | `mmp_bdevname[32]`   | its device's name                                    |
//! | 0x70   | `mmp_check_interval` | seconds between checks                               |
//! | 0x3FC  | `mmp_checksum`       | crc32c of the bytes before it (metadata_csum)        |

use super::bytes::{le16, le32, put_le16, put_le32};
use crate::crc::crc32c_raw;
use crate::OnDiskError;

type Result<T> = std::result::Result<T, OnDiskError>;

/// `EXT4_MMP_MAGIC`.
pub const MMP_MAGIC: u32 = 0x004D_4D50;
/// `EXT4_MMP_SEQ_CLEAN`: cleanly unmounted, nobody holds the file system.
pub const MMP_SEQ_CLEAN: u32 = 0xFF4D_4D50;
/// `EXT4_MMP_SEQ_FSCK`: e2fsck is running.
pub const MMP_SEQ_FSCK: u32 = 0xE24D_4D50;
/// `EXT4_MMP_SEQ_MAX`: the largest sequence number of a mounted file system.
pub const MMP_SEQ_MAX: u32 = 0xE24D_4D4F;
/// `EXT4_MMP_MIN_CHECK_INTERVAL`, `EXT4_MMP_MAX_CHECK_INTERVAL` (seconds) and
/// `EXT4_MMP_CHECK_MULT`.
pub const MMP_CHECK_INTERVAL_MIN: u16 = 5;
pub const MMP_CHECK_INTERVAL_MAX: u16 = 300;
pub const MMP_CHECK_MULT: u16 = 2;
/// The bytes of the structure (it sits at the start of its block).
pub const MMP_SIZE: usize = 1024;
const NODENAME: usize = 0x10;
const NODENAME_LEN: usize = 64;
const BDEVNAME: usize = 0x50;
const BDEVNAME_LEN: usize = 32;
const CHECK_INTERVAL: usize = 0x70;
const CHECKSUM: usize = 0x3FC;

/// A decoded MMP block; the bytes it was read from are kept, so encoding changes only the
/// fields quill sets.
#[derive(Clone, PartialEq, Eq)]
pub struct MmpBlock {
    pub seq: u32,
    pub time: u64,
    pub nodename: [u8; NODENAME_LEN],
    pub bdevname: [u8; BDEVNAME_LEN],
    pub check_interval: u16,
    raw: [u8; MMP_SIZE],
}

impl std::fmt::Debug for MmpBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MmpBlock")
            .field("seq", &format_args!("{:#x}", self.seq))
            .field("time", &self.time)
            .field("nodename", &String::from_utf8_lossy(self.nodename_str()))
            .field("check_interval", &self.check_interval)
            .finish_non_exhaustive()
    }
}

impl MmpBlock {
    /// A released block (`ext2fs_mmp_reset`): the magic, `MMP_SEQ_CLEAN`, no time, no names.
    pub fn clean(check_interval: u16) -> MmpBlock {
        let mut raw = [0u8; MMP_SIZE];
        put_le32(&mut raw, 0, MMP_MAGIC);
        put_le32(&mut raw, 4, MMP_SEQ_CLEAN);
        put_le16(&mut raw, CHECK_INTERVAL, check_interval);
        MmpBlock::parse(&raw, None).expect("a block with the magic parses")
    }

    /// Decodes the start of an MMP block. `csum_seed`: the file system's checksum seed with
    /// metadata_csum (the checksum is then checked), `None` without.
    pub fn parse(bytes: &[u8], csum_seed: Option<u32>) -> Result<MmpBlock> {
        let raw: [u8; MMP_SIZE] = bytes
            .get(..MMP_SIZE)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| corrupted(format!("{} bytes", bytes.len())))?;
        let magic = le32(&raw, 0);
        if magic != MMP_MAGIC {
            return Err(corrupted(format!("magic {magic:#010x}, expected {MMP_MAGIC:#010x}")));
        }
        if let Some(seed) = csum_seed {
            let (stored, computed) = (le32(&raw, CHECKSUM), crc32c_raw(seed, &raw[..CHECKSUM]));
            if stored != computed {
                return Err(corrupted(format!(
                    "checksum {stored:#010x}, computed {computed:#010x}"
                )));
            }
        }
        let mut nodename = [0u8; NODENAME_LEN];
        nodename.copy_from_slice(&raw[NODENAME..NODENAME + NODENAME_LEN]);
        let mut bdevname = [0u8; BDEVNAME_LEN];
        bdevname.copy_from_slice(&raw[BDEVNAME..BDEVNAME + BDEVNAME_LEN]);
        Ok(MmpBlock {
            seq: le32(&raw, 4),
            time: u64::from(le32(&raw, 8)) | (u64::from(le32(&raw, 12)) << 32),
            nodename,
            bdevname,
            check_interval: le16(&raw, CHECK_INTERVAL),
            raw,
        })
    }

    /// The structure's bytes, with the checksum set under `csum_seed` (metadata_csum).
    pub fn encode(&self, csum_seed: Option<u32>) -> [u8; MMP_SIZE] {
        let mut raw = self.raw;
        put_le32(&mut raw, 0, MMP_MAGIC);
        put_le32(&mut raw, 4, self.seq);
        put_le32(&mut raw, 8, self.time as u32);
        put_le32(&mut raw, 12, (self.time >> 32) as u32);
        raw[NODENAME..NODENAME + NODENAME_LEN].copy_from_slice(&self.nodename);
        raw[BDEVNAME..BDEVNAME + BDEVNAME_LEN].copy_from_slice(&self.bdevname);
        put_le16(&mut raw, CHECK_INTERVAL, self.check_interval);
        if let Some(seed) = csum_seed {
            let crc = crc32c_raw(seed, &raw[..CHECKSUM]);
            put_le32(&mut raw, CHECKSUM, crc);
        }
        raw
    }

    /// The node name up to its first NUL.
    pub fn nodename_str(&self) -> &[u8] {
        let end = self.nodename.iter().position(|&b| b == 0).unwrap_or(NODENAME_LEN);
        &self.nodename[..end]
    }

    /// Sets the node name (cut to 64 bytes, NUL-padded).
    pub fn set_nodename(&mut self, name: &[u8]) {
        self.nodename = [0; NODENAME_LEN];
        let len = name.len().min(NODENAME_LEN);
        self.nodename[..len].copy_from_slice(&name[..len]);
    }

    /// Sets the device name (cut to 32 bytes, NUL-padded).
    pub fn set_bdevname(&mut self, name: &[u8]) {
        self.bdevname = [0; BDEVNAME_LEN];
        let len = name.len().min(BDEVNAME_LEN);
        self.bdevname[..len].copy_from_slice(&name[..len]);
    }
}

fn corrupted(reason: String) -> OnDiskError {
    OnDiskError::corrupted("MMP block", reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_round_trips_and_its_checksum_and_magic_are_checked() {
        let mut raw = [0u8; MMP_SIZE];
        put_le32(&mut raw, 0, MMP_MAGIC);
        put_le32(&mut raw, 4, MMP_SEQ_CLEAN);
        let mut block = MmpBlock::parse(&raw, None).unwrap();
        assert_eq!(block.seq, MMP_SEQ_CLEAN);
        block.seq = 7;
        block.time = 1 << 33;
        block.set_nodename(b"host-a");
        block.check_interval = 10;
        let seed = Some(0x1234_5678);
        let bytes = block.encode(seed);
        let back = MmpBlock::parse(&bytes, seed).unwrap();
        assert_eq!(back, MmpBlock::parse(&bytes, None).unwrap());
        assert_eq!((back.seq, back.time, back.check_interval), (7, 1 << 33, 10));
        assert_eq!(back.nodename_str(), b"host-a");
        let mut bad = bytes;
        bad[200] ^= 1;
        assert!(MmpBlock::parse(&bad, seed).is_err(), "checksum");
        assert!(MmpBlock::parse(&bad, None).is_ok(), "no checksum without metadata_csum");
        bad[0] ^= 1;
        assert!(MmpBlock::parse(&bad, None).is_err(), "magic");
        assert!(MmpBlock::parse(&bytes[..100], None).is_err(), "short");
    }
}
