//! On-disk inodes (`struct ext4_inode`) and the metadata_csum inode checksum.
//!
//! An inode record is `s_inode_size` bytes: the 128-byte original layout, then `i_extra_isize`
//! bytes of extra fields (`i_checksum_hi` among them), then in-inode extended attributes.
//! [`Inode::parse`] requires the extra fields to fit the record and be 4-byte aligned, as
//! `ext4_iget` does.
//!
//! The checksum covers the whole record with the checksum fields zeroed, seeded per inode:
//!
//! | step | crc32c over                                   |
//! |------|-----------------------------------------------|
//! | 1    | `csum_seed()` ⊕ le32(inode number)            |
//! | 2    | le32(`i_generation`) → the inode's seed       |
//! | 3    | record, `i_checksum_lo` (0x7C) as zero        |
//! |      | and `i_checksum_hi` (0x82) as zero if present |
//!
//! With `i_checksum_hi` present (extra_isize >= 4) all 32 bits are compared, else the low 16.

use super::bytes::{le16, le32, put_le16, put_le32};
use super::superblock::{Superblock, CREATOR_OS_LINUX, INODE_SIZE_MIN};
use crate::crc::crc32c_raw;
use crate::OnDiskError;

/// `i_flags`: the inode maps its blocks with an extent tree rooted in `i_block`.
pub const EXTENTS_FL: u32 = 0x0008_0000;
/// `i_flags`: the file's data lives in the inode (inline_data).
pub const INLINE_DATA_FL: u32 = 0x1000_0000;
/// `i_flags`: a directory with an htree index (dir_index).
pub const INDEX_FL: u32 = 0x0000_1000;
/// `i_flags`: `i_blocks` counts file-system blocks instead of 512-byte sectors (huge_file).
pub const HUGE_FILE_FL: u32 = 0x0004_0000;
/// `i_flags`: the inode has large extended-attribute values in inodes (ea_inode).
pub const EA_INODE_FL: u32 = 0x0020_0000;
/// The root directory.
pub const ROOT_INO: u32 = 2;
/// The journal inode of an internal journal.
pub const JOURNAL_INO: u32 = 8;
/// `i_mode` file-type bits and the regular-file type.
pub const MODE_TYPE_MASK: u16 = 0xF000;
pub const MODE_REGULAR: u16 = 0x8000;
pub const MODE_DIR: u16 = 0x4000;
pub const MODE_SYMLINK: u16 = 0xA000;
pub const MODE_CHRDEV: u16 = 0x2000;
pub const MODE_BLKDEV: u16 = 0x6000;
pub const MODE_FIFO: u16 = 0x1000;
pub const MODE_SOCKET: u16 = 0xC000;
/// Size of `i_block`: 15 32-bit words, the extent-tree root for extent inodes.
pub const INODE_BLOCK_SIZE: usize = 60;

const BASE_SIZE: usize = INODE_SIZE_MIN as usize;

mod off {
    pub const MODE: usize = 0x0;
    pub const UID_LO: usize = 0x2;
    pub const SIZE_LO: usize = 0x4;
    pub const ATIME: usize = 0x8;
    pub const CTIME: usize = 0xC;
    pub const MTIME: usize = 0x10;
    pub const DTIME: usize = 0x14;
    pub const GID_LO: usize = 0x18;
    pub const LINKS_COUNT: usize = 0x1A;
    pub const BLOCKS_LO: usize = 0x1C;
    pub const FLAGS: usize = 0x20;
    pub const BLOCK: usize = 0x28;
    pub const GENERATION: usize = 0x64;
    pub const FILE_ACL_LO: usize = 0x68;
    pub const SIZE_HIGH: usize = 0x6C;
    pub const BLOCKS_HIGH: usize = 0x74;
    pub const FILE_ACL_HIGH: usize = 0x76;
    pub const UID_HIGH: usize = 0x78;
    pub const GID_HIGH: usize = 0x7A;
    pub const CHECKSUM_LO: usize = 0x7C;
    pub const EXTRA_ISIZE: usize = 0x80;
    pub const CHECKSUM_HI: usize = 0x82;
    pub const CTIME_EXTRA: usize = 0x84;
    pub const MTIME_EXTRA: usize = 0x88;
    pub const ATIME_EXTRA: usize = 0x8C;
    pub const CRTIME: usize = 0x90;
    pub const CRTIME_EXTRA: usize = 0x94;
    pub const PROJID: usize = 0x9C;
}

/// A timestamp as ext4 stores it: seconds since the epoch (a signed 32-bit field extended by
/// two epoch bits in the `_extra` word) and nanoseconds (also in the `_extra` word).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Hash)]
pub struct Timestamp {
    pub sec: i64,
    pub nsec: u32,
}

impl Timestamp {
    /// Decodes `(i_xtime, i_xtime_extra)`; `extra` is `None` when the record has no such field.
    fn decode(base: u32, extra: Option<u32>) -> Self {
        let mut sec = i64::from(base as i32);
        let mut nsec = 0;
        if let Some(extra) = extra {
            // ext4_decode_extra_time: the two epoch bits extend the signed 32-bit seconds.
            sec += i64::from(extra & 3) << 32;
            nsec = (extra >> 2).min(999_999_999);
        }
        Timestamp { sec, nsec }
    }

    /// Encodes into `(i_xtime, i_xtime_extra)` as `ext4_encode_extra_time` does.
    fn encode(self) -> (u32, u32) {
        let epoch = ((self.sec - i64::from(self.sec as i32)) >> 32) as u32 & 3;
        (self.sec as u32, epoch | (self.nsec.min(999_999_999) << 2))
    }
}

const _: () = assert!(off::BLOCK + INODE_BLOCK_SIZE == off::GENERATION);
const _: () = assert!(off::CHECKSUM_LO + 4 == BASE_SIZE);

/// The fields of an inode quill reads and writes. Fields it does not model (`i_version`,
/// `i_projid`, the in-inode xattr area) are preserved by [`Inode::encode_into`], which writes
/// over the record it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inode {
    pub mode: u16,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub atime: Timestamp,
    pub ctime: Timestamp,
    pub mtime: Timestamp,
    /// Creation time; zero when the record has no room for `i_crtime`.
    pub crtime: Timestamp,
    /// Deletion time, or the next inode of the orphan list while the inode is an orphan.
    pub dtime: u32,
    pub links_count: u16,
    /// `i_blocks_lo | l_i_blocks_high << 32`, in the unit the flags say (see
    /// [`Inode::blocks_512`]).
    pub blocks_raw: u64,
    pub flags: u32,
    pub generation: u32,
    /// `i_file_acl`: the extended-attribute block, 0 for none.
    pub file_acl: u64,
    /// `i_block`: an extent-tree root, block map, inline data or symlink target.
    pub block: [u8; INODE_BLOCK_SIZE],
    /// `i_extra_isize`; 0 for 128-byte records.
    pub extra_isize: u16,
    /// `i_projid` (the project feature); 0 when the record has no room for it.
    pub projid: u32,
}

impl Default for Inode {
    fn default() -> Self {
        Inode {
            mode: 0,
            uid: 0,
            gid: 0,
            size: 0,
            atime: Timestamp::default(),
            ctime: Timestamp::default(),
            mtime: Timestamp::default(),
            crtime: Timestamp::default(),
            dtime: 0,
            links_count: 0,
            blocks_raw: 0,
            flags: 0,
            generation: 0,
            file_acl: 0,
            block: [0; INODE_BLOCK_SIZE],
            extra_isize: 0,
            projid: 0,
        }
    }
}

impl Inode {
    /// Decodes one inode record (`s_inode_size` bytes, at least 128).
    pub fn parse(raw: &[u8]) -> Result<Self, OnDiskError> {
        if raw.len() < BASE_SIZE {
            return Err(OnDiskError::corrupted(
                "inode",
                format!("{} bytes, need at least {BASE_SIZE}", raw.len()),
            ));
        }
        let extra_isize =
            if raw.len() >= off::EXTRA_ISIZE + 2 { le16(raw, off::EXTRA_ISIZE) } else { 0 };
        if BASE_SIZE + usize::from(extra_isize) > raw.len() || !extra_isize.is_multiple_of(4) {
            return Err(OnDiskError::corrupted(
                "inode",
                format!("extra isize {extra_isize} in a {}-byte inode", raw.len()),
            ));
        }
        let mut block = [0u8; INODE_BLOCK_SIZE];
        block.copy_from_slice(&raw[off::BLOCK..off::BLOCK + INODE_BLOCK_SIZE]);
        let extra_end = BASE_SIZE + usize::from(extra_isize);
        let extra = |field: usize| (field + 4 <= extra_end).then(|| le32(raw, field));
        Ok(Inode {
            atime: Timestamp::decode(le32(raw, off::ATIME), extra(off::ATIME_EXTRA)),
            ctime: Timestamp::decode(le32(raw, off::CTIME), extra(off::CTIME_EXTRA)),
            mtime: Timestamp::decode(le32(raw, off::MTIME), extra(off::MTIME_EXTRA)),
            crtime: extra(off::CRTIME)
                .map(|base| Timestamp::decode(base, extra(off::CRTIME_EXTRA)))
                .unwrap_or_default(),
            dtime: le32(raw, off::DTIME),
            blocks_raw: u64::from(le32(raw, off::BLOCKS_LO))
                | (u64::from(le16(raw, off::BLOCKS_HIGH)) << 32),
            file_acl: u64::from(le32(raw, off::FILE_ACL_LO))
                | (u64::from(le16(raw, off::FILE_ACL_HIGH)) << 32),
            mode: le16(raw, off::MODE),
            uid: u32::from(le16(raw, off::UID_LO)) | (u32::from(le16(raw, off::UID_HIGH)) << 16),
            gid: u32::from(le16(raw, off::GID_LO)) | (u32::from(le16(raw, off::GID_HIGH)) << 16),
            size: u64::from(le32(raw, off::SIZE_LO)) | (u64::from(le32(raw, off::SIZE_HIGH)) << 32),
            links_count: le16(raw, off::LINKS_COUNT),
            flags: le32(raw, off::FLAGS),
            generation: le32(raw, off::GENERATION),
            block,
            extra_isize,
            projid: extra(off::PROJID).unwrap_or(0),
        })
    }

    /// Writes every modelled field over `raw` (an existing record of `s_inode_size` bytes, or
    /// zeros for a new inode), leaving the bytes it does not model alone. Fields the record has
    /// no room for (extra times when `i_extra_isize` is small) are dropped. The checksum is not
    /// updated: call [`set_inode_checksum`] afterwards.
    pub fn encode_into(&self, raw: &mut [u8]) {
        assert!(raw.len() >= BASE_SIZE, "inode record of {} bytes", raw.len());
        let extra_isize = if raw.len() > BASE_SIZE { self.extra_isize } else { 0 };
        assert!(BASE_SIZE + usize::from(extra_isize) <= raw.len(), "extra_isize overflows");
        put_le16(raw, off::MODE, self.mode);
        put_le16(raw, off::UID_LO, self.uid as u16);
        put_le16(raw, off::UID_HIGH, (self.uid >> 16) as u16);
        put_le16(raw, off::GID_LO, self.gid as u16);
        put_le16(raw, off::GID_HIGH, (self.gid >> 16) as u16);
        put_le32(raw, off::SIZE_LO, self.size as u32);
        put_le32(raw, off::SIZE_HIGH, (self.size >> 32) as u32);
        put_le32(raw, off::DTIME, self.dtime);
        put_le16(raw, off::LINKS_COUNT, self.links_count);
        put_le32(raw, off::BLOCKS_LO, self.blocks_raw as u32);
        put_le16(raw, off::BLOCKS_HIGH, (self.blocks_raw >> 32) as u16);
        put_le32(raw, off::FLAGS, self.flags);
        raw[off::BLOCK..off::BLOCK + INODE_BLOCK_SIZE].copy_from_slice(&self.block);
        put_le32(raw, off::GENERATION, self.generation);
        put_le32(raw, off::FILE_ACL_LO, self.file_acl as u32);
        put_le16(raw, off::FILE_ACL_HIGH, (self.file_acl >> 32) as u16);
        let extra_end = BASE_SIZE + usize::from(extra_isize);
        if raw.len() > BASE_SIZE {
            put_le16(raw, off::EXTRA_ISIZE, extra_isize);
        }
        let times = [
            (off::ATIME, off::ATIME_EXTRA, self.atime),
            (off::CTIME, off::CTIME_EXTRA, self.ctime),
            (off::MTIME, off::MTIME_EXTRA, self.mtime),
        ];
        for (base, extra, time) in times {
            let (sec, extra_word) = time.encode();
            put_le32(raw, base, sec);
            if extra + 4 <= extra_end {
                put_le32(raw, extra, extra_word);
            }
        }
        if off::PROJID + 4 <= extra_end {
            put_le32(raw, off::PROJID, self.projid);
        }
        if off::CRTIME + 4 <= extra_end {
            let (sec, extra_word) = self.crtime.encode();
            put_le32(raw, off::CRTIME, sec);
            if off::CRTIME_EXTRA + 4 <= extra_end {
                put_le32(raw, off::CRTIME_EXTRA, extra_word);
            }
        }
    }

    /// The in-inode extended-attribute area of `raw`: from the end of the extra fields to the
    /// end of the record (empty for 128-byte records).
    pub fn xattr_area_range(&self, inode_size: usize) -> std::ops::Range<usize> {
        let start = (BASE_SIZE + usize::from(self.extra_isize)).min(inode_size);
        start..inode_size
    }

    /// `i_blocks` in 512-byte sectors, whatever unit the record uses.
    pub fn blocks_512(&self, block_size: u32) -> u64 {
        if self.flags & HUGE_FILE_FL != 0 {
            self.blocks_raw.saturating_mul(u64::from(block_size / 512))
        } else {
            self.blocks_raw
        }
    }

    pub fn uses_extents(&self) -> bool {
        self.flags & EXTENTS_FL != 0
    }

    /// The inode keeps its contents in itself (`i_block` and `system.data`: [`super::inline`])
    /// and maps no blocks.
    pub fn has_inline_data(&self) -> bool {
        self.flags & INLINE_DATA_FL != 0
    }

    pub fn file_type(&self) -> u16 {
        self.mode & MODE_TYPE_MASK
    }

    pub fn is_dir(&self) -> bool {
        self.file_type() == MODE_DIR
    }

    pub fn is_symlink(&self) -> bool {
        self.file_type() == MODE_SYMLINK
    }

    pub fn is_regular(&self) -> bool {
        self.mode & MODE_TYPE_MASK == MODE_REGULAR
    }
}

/// The per-inode checksum seed, which also seeds the checksums of the inode's extent blocks:
/// crc32c(crc32c(csum_seed, le32 ino), le32 generation).
pub fn inode_csum_seed(sb: &Superblock, ino: u32, generation: u32) -> u32 {
    let seed = crc32c_raw(sb.csum_seed(), &ino.to_le_bytes());
    crc32c_raw(seed, &generation.to_le_bytes())
}

/// Whether the inode record `raw` of inode `ino` carries a valid checksum
/// (`ext4_inode_csum_verify`). True when metadata_csum is off or the creator OS is not Linux
/// (other OSes lay out `osd2` differently and the kernel skips the check); false when `raw` is
/// shorter than `s_inode_size`. An all-zero base record is accepted, as e2fsprogs does, because
/// a never-initialized (lazily zeroed) inode is free, not corrupt.
pub fn inode_checksum_ok(sb: &Superblock, ino: u32, raw: &[u8]) -> bool {
    if !sb.has_metadata_csum() || sb.creator_os != CREATOR_OS_LINUX {
        return true;
    }
    let size = usize::from(sb.inode_size);
    let Some(raw) = raw.get(..size) else {
        return false;
    };
    if size < BASE_SIZE {
        return false;
    }
    let seed = inode_csum_seed(sb, ino, le32(raw, off::GENERATION));
    let has_hi = size >= off::CHECKSUM_HI + 2
        && BASE_SIZE + usize::from(le16(raw, off::EXTRA_ISIZE)) >= off::CHECKSUM_HI + 2;
    let mut crc = crc32c_raw(seed, &raw[..off::CHECKSUM_LO]);
    crc = crc32c_raw(crc, &[0, 0]);
    let matches = if has_hi {
        crc = crc32c_raw(crc, &raw[off::CHECKSUM_LO + 2..off::CHECKSUM_HI]);
        crc = crc32c_raw(crc, &[0, 0]);
        crc = crc32c_raw(crc, &raw[off::CHECKSUM_HI + 2..]);
        let stored =
            u32::from(le16(raw, off::CHECKSUM_LO)) | (u32::from(le16(raw, off::CHECKSUM_HI)) << 16);
        stored == crc
    } else {
        crc = crc32c_raw(crc, &raw[off::CHECKSUM_LO + 2..]);
        le16(raw, off::CHECKSUM_LO) == crc as u16
    };
    matches || raw[..BASE_SIZE].iter().all(|&b| b == 0)
}

/// Writes the checksum of record `raw` of inode `ino` (`ext4_inode_csum_set`); does nothing
/// when metadata_csum is off or the creator OS is not Linux.
pub fn set_inode_checksum(sb: &Superblock, ino: u32, raw: &mut [u8]) {
    if !sb.has_metadata_csum() || sb.creator_os != CREATOR_OS_LINUX {
        return;
    }
    let size = usize::from(sb.inode_size).min(raw.len());
    let raw = &mut raw[..size];
    let has_hi = size >= off::CHECKSUM_HI + 2
        && BASE_SIZE + usize::from(le16(raw, off::EXTRA_ISIZE)) >= off::CHECKSUM_HI + 2;
    put_le16(raw, off::CHECKSUM_LO, 0);
    if has_hi {
        put_le16(raw, off::CHECKSUM_HI, 0);
    }
    let seed = inode_csum_seed(sb, ino, le32(raw, off::GENERATION));
    let crc = crc32c_raw(seed, raw);
    put_le16(raw, off::CHECKSUM_LO, crc as u16);
    if has_hi {
        put_le16(raw, off::CHECKSUM_HI, (crc >> 16) as u16);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ext4::bytes::{put_le16, put_le32};
    use crate::ext4::superblock::tests::sample;

    /// A 256-byte journal-like inode: regular, extents, 4 MiB, with a valid checksum for `ino`.
    pub(crate) fn sample_raw(sb: &Superblock, ino: u32) -> Vec<u8> {
        let mut raw = vec![0u8; usize::from(sb.inode_size)];
        put_le16(&mut raw, off::MODE, MODE_REGULAR | 0o600);
        put_le32(&mut raw, off::SIZE_LO, 4 << 20);
        put_le16(&mut raw, off::LINKS_COUNT, 1);
        put_le32(&mut raw, off::FLAGS, EXTENTS_FL);
        put_le32(&mut raw, off::GENERATION, 0x55AA);
        put_le16(&mut raw, off::UID_HIGH, 1);
        put_le16(&mut raw, off::EXTRA_ISIZE, 32);
        raw[off::BLOCK] = 0x0A;
        raw[off::BLOCK + 1] = 0xF3;
        seal(sb, ino, &mut raw);
        raw
    }

    /// Writes the checksum of `raw` into it, the way the kernel's `ext4_inode_csum_set` does.
    pub(crate) fn seal(sb: &Superblock, ino: u32, raw: &mut [u8]) {
        put_le16(raw, off::CHECKSUM_LO, 0);
        put_le16(raw, off::CHECKSUM_HI, 0);
        let seed = inode_csum_seed(sb, ino, le32(raw, off::GENERATION));
        let crc = crc32c_raw(seed, raw);
        put_le16(raw, off::CHECKSUM_LO, crc as u16);
        put_le16(raw, off::CHECKSUM_HI, (crc >> 16) as u16);
    }

    #[test]
    fn inode_fields_decode_with_high_halves() {
        let sb = sample();
        let inode = Inode::parse(&sample_raw(&sb, 8)).unwrap();
        assert!(inode.is_regular());
        assert!(inode.uses_extents());
        assert_eq!(inode.size, 4 << 20);
        assert_eq!(inode.uid, 1 << 16);
        assert_eq!(inode.links_count, 1);
        assert_eq!(inode.generation, 0x55AA);
        assert_eq!(inode.extra_isize, 32);
        assert_eq!(&inode.block[..2], &[0x0A, 0xF3]);
    }

    #[test]
    fn inode_checksum_is_bound_to_the_inode_number_and_contents() {
        let sb = sample();
        let mut raw = sample_raw(&sb, 8);
        assert!(inode_checksum_ok(&sb, 8, &raw));
        assert!(!inode_checksum_ok(&sb, 9, &raw));
        // The xattr area past the extra fields is covered too.
        raw[200] ^= 1;
        assert!(!inode_checksum_ok(&sb, 8, &raw));
        assert!(!inode_checksum_ok(&sb, 8, &raw[..255]));
    }

    #[test]
    fn inode_without_checksum_hi_compares_the_low_half_only() {
        let sb = sample();
        let mut raw = sample_raw(&sb, 8);
        put_le16(&mut raw, off::EXTRA_ISIZE, 0);
        put_le16(&mut raw, off::CHECKSUM_LO, 0);
        let seed = inode_csum_seed(&sb, 8, 0x55AA);
        let mut crc = crc32c_raw(seed, &raw[..off::CHECKSUM_LO]);
        crc = crc32c_raw(crc, &[0, 0]);
        crc = crc32c_raw(crc, &raw[off::CHECKSUM_LO + 2..]);
        put_le16(&mut raw, off::CHECKSUM_LO, crc as u16);
        // Bytes at 0x82 are not a checksum now: they are covered like any other byte.
        assert!(inode_checksum_ok(&sb, 8, &raw));
        raw[off::CHECKSUM_HI] ^= 1;
        assert!(!inode_checksum_ok(&sb, 8, &raw));
    }

    #[test]
    fn encoded_inode_round_trips_with_nanosecond_times_and_a_valid_checksum() {
        let sb = sample();
        let mut raw = sample_raw(&sb, 8);
        let mut inode = Inode::parse(&raw).unwrap();
        inode.atime = Timestamp { sec: -5, nsec: 7 };
        inode.mtime = Timestamp { sec: (1 << 33) + 12, nsec: 999_999_999 };
        inode.ctime = Timestamp { sec: 1_700_000_000, nsec: 123_456_789 };
        inode.crtime = Timestamp { sec: 1, nsec: 2 };
        inode.file_acl = (3 << 32) | 77;
        inode.blocks_raw = (5 << 32) | 9;
        inode.dtime = 42;
        inode.encode_into(&mut raw);
        set_inode_checksum(&sb, 8, &mut raw);
        assert!(inode_checksum_ok(&sb, 8, &raw));
        assert_eq!(Inode::parse(&raw).unwrap(), inode);
    }

    #[test]
    fn small_records_drop_the_extra_times() {
        let sb = sample();
        let mut raw = vec![0u8; 128];
        let inode = Inode {
            mode: MODE_DIR | 0o755,
            mtime: Timestamp { sec: 10, nsec: 5 },
            extra_isize: 32,
            ..Inode::default()
        };
        inode.encode_into(&mut raw);
        let back = Inode::parse(&raw).unwrap();
        assert_eq!(back.mtime, Timestamp { sec: 10, nsec: 0 });
        assert!(back.is_dir());
        let _ = sb;
    }

    #[test]
    fn all_zero_inode_passes_the_checksum() {
        let sb = sample();
        assert!(inode_checksum_ok(&sb, 12, &vec![0u8; 256]));
    }

    #[test]
    fn inode_with_oversized_or_misaligned_extra_isize_is_rejected() {
        let sb = sample();
        let mut raw = sample_raw(&sb, 8);
        put_le16(&mut raw, off::EXTRA_ISIZE, 130);
        assert!(Inode::parse(&raw).is_err());
        put_le16(&mut raw, off::EXTRA_ISIZE, 30);
        assert!(Inode::parse(&raw).is_err());
        assert!(Inode::parse(&raw[..127]).is_err());
        // A 128-byte record has no extra fields at all.
        assert_eq!(Inode::parse(&raw[..128]).unwrap().extra_isize, 0);
    }
}
