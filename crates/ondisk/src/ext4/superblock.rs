//! The ext4 superblock: 1024 bytes at byte 1024 of the device.
//!
//! [`Superblock::parse`] accepts only superblocks whose geometry every other parser and the
//! `fs` layer can rely on without re-checking: block size 1 KiB..=64 KiB, non-zero and
//! bitmap-sized group sizes, a power-of-two inode size that fits a block, a valid descriptor
//! size, an inode count that matches the group count, and (with metadata_csum) a correct crc32c.
//! The arithmetic helpers (`block_size`, `group_count`, ...) assert those invariants, so a
//! caller that edits the public fields into nonsense gets a panic, not a wrong answer.
//!
//! The superblock keeps all 1024 raw bytes: [`Superblock::encode`] writes the decoded fields
//! over them, so fields quill does not model (timestamps, error records, hash seeds, ...) survive
//! a read-modify-write unchanged.

use std::fmt;

use super::bytes::{le16, le32, put_le16, put_le32};
use super::feature;
use crate::crc::crc32c_raw;
use crate::OnDiskError;

/// Byte offset of the primary superblock on the device, whatever the block size.
pub const SUPERBLOCK_OFFSET: u64 = 1024;
/// Size of the superblock structure.
pub const SUPERBLOCK_SIZE: usize = 1024;
/// `s_magic`.
pub const EXT4_MAGIC: u16 = 0xEF53;
/// `s_checksum_type` value for crc32c, the only algorithm ext4 defines.
pub const CHECKSUM_TYPE_CRC32C: u8 = 1;
/// `s_state` bit: cleanly unmounted.
pub const STATE_VALID_FS: u16 = 0x1;
/// s_state: errors were detected (ext4's EXT4_ERROR_FS).
pub const STATE_ERROR_FS: u16 = 0x2;
/// `s_state`: a fast-commit replay is being written (EXT4_FC_REPLAY): a crash left it half
/// done, and only e2fsck's full check can tell what reached the disk.
pub const STATE_FC_REPLAY: u16 = 0x20;
/// `s_creator_os` value for Linux; the inode checksum exists only in Linux's inode layout.
pub const CREATOR_OS_LINUX: u32 = 0;
/// Largest `s_log_block_size`: 1024 << 6 = 64 KiB (EXT4_MAX_BLOCK_LOG_SIZE 16).
pub const LOG_BLOCK_SIZE_MAX: u32 = 6;
/// Smallest inode size (EXT4_GOOD_OLD_INODE_SIZE).
pub const INODE_SIZE_MIN: u16 = 128;
/// Group descriptor sizes (EXT4_MIN_DESC_SIZE, EXT4_MIN_DESC_SIZE_64BIT, EXT4_MAX_DESC_SIZE).
pub const DESC_SIZE_MIN: u16 = 32;
pub const DESC_SIZE_MIN_64BIT: u16 = 64;
pub const DESC_SIZE_MAX: u16 = 1024;
/// The first inode number that is not reserved (EXT4_GOOD_OLD_FIRST_INO).
pub const FIRST_INO_MIN: u32 = 11;

/// Offsets of the fields quill reads or writes (`struct ext4_super_block`).
mod off {
    pub const INODES_COUNT: usize = 0x0;
    pub const BLOCKS_COUNT_LO: usize = 0x4;
    pub const R_BLOCKS_COUNT_LO: usize = 0x8;
    pub const FREE_BLOCKS_COUNT_LO: usize = 0xC;
    pub const FREE_INODES_COUNT: usize = 0x10;
    pub const MTIME: usize = 0x2C;
    pub const WTIME: usize = 0x30;
    pub const MNT_COUNT: usize = 0x34;
    pub const ERRORS: usize = 0x3C;
    pub const LAST_ORPHAN: usize = 0xE8;
    pub const HASH_SEED: usize = 0xEC;
    pub const DEF_HASH_VERSION: usize = 0xFC;
    pub const MIN_EXTRA_ISIZE: usize = 0x15C;
    pub const RESERVED_GDT_BLOCKS: usize = 0xCE;
    pub const FLAGS: usize = 0x160;
    pub const KBYTES_WRITTEN: usize = 0x178;
    pub const R_BLOCKS_COUNT_HI: usize = 0x154;
    pub const FREE_BLOCKS_COUNT_HI: usize = 0x158;
    pub const ORPHAN_FILE_INUM: usize = 0x280;
    pub const FIRST_DATA_BLOCK: usize = 0x14;
    pub const LOG_BLOCK_SIZE: usize = 0x18;
    /// s_log_cluster_size (bigalloc; otherwise equal to s_log_block_size).
    pub const LOG_CLUSTER_SIZE: usize = 0x1C;
    pub const BLOCKS_PER_GROUP: usize = 0x20;
    pub const INODES_PER_GROUP: usize = 0x28;
    pub const MAGIC: usize = 0x38;
    pub const STATE: usize = 0x3A;
    pub const CREATOR_OS: usize = 0x48;
    pub const REV_LEVEL: usize = 0x4C;
    pub const FIRST_INO: usize = 0x54;
    pub const INODE_SIZE: usize = 0x58;
    pub const FEATURE_COMPAT: usize = 0x5C;
    pub const FEATURE_INCOMPAT: usize = 0x60;
    pub const FEATURE_RO_COMPAT: usize = 0x64;
    pub const UUID: usize = 0x68;
    pub const VOLUME_NAME: usize = 0x78;
    pub const JOURNAL_INUM: usize = 0xE0;
    pub const JOURNAL_DEV: usize = 0xE4;
    pub const JNL_BACKUP_TYPE: usize = 0xFD;
    pub const DESC_SIZE: usize = 0xFE;
    pub const FIRST_META_BG: usize = 0x104;
    pub const JNL_BLOCKS: usize = 0x10C;
    pub const BLOCKS_COUNT_HI: usize = 0x150;
    pub const CHECKSUM_TYPE: usize = 0x175;
    pub const BACKUP_BGS: usize = 0x24C;
    pub const CHECKSUM_SEED: usize = 0x270;
    pub const USR_QUOTA_INUM: usize = 0x240;
    pub const GRP_QUOTA_INUM: usize = 0x244;
    pub const PRJ_QUOTA_INUM: usize = 0x26C;
    pub const CHECKSUM: usize = 0x3FC;
    pub const CLUSTERS_PER_GROUP: usize = 0x24;
    pub const MAX_MNT_COUNT: usize = 0x36;
    pub const LASTCHECK: usize = 0x40;
    pub const BLOCK_GROUP_NR: usize = 0x5A;
    pub const DEFAULT_MOUNT_OPTS: usize = 0x100;
    pub const MKFS_TIME: usize = 0x108;
    pub const WANT_EXTRA_ISIZE: usize = 0x15E;
    pub const LOG_GROUPS_PER_FLEX: usize = 0x174;
    pub const OVERHEAD_CLUSTERS: usize = 0x248;
    pub const MMP_UPDATE_INTERVAL: usize = 0x166;
    pub const MMP_BLOCK: usize = 0x168;
    // The error record (EXT4_S_ERR_START..EXT4_S_ERR_END, plus the high time bytes and the
    // error codes kernels from 5.10 on keep past s_checksum_seed).
    pub const ERROR_COUNT: usize = 0x194;
    pub const FIRST_ERROR_TIME: usize = 0x198;
    pub const FIRST_ERROR_INO: usize = 0x19C;
    pub const FIRST_ERROR_BLOCK: usize = 0x1A0;
    pub const FIRST_ERROR_FUNC: usize = 0x1A8;
    pub const FIRST_ERROR_LINE: usize = 0x1C8;
    pub const LAST_ERROR_TIME: usize = 0x1CC;
    pub const LAST_ERROR_INO: usize = 0x1D0;
    pub const LAST_ERROR_LINE: usize = 0x1D4;
    pub const LAST_ERROR_BLOCK: usize = 0x1D8;
    pub const LAST_ERROR_FUNC: usize = 0x1E0;
    pub const MOUNT_OPTS: usize = 0x200;
    pub const FIRST_ERROR_TIME_HI: usize = 0x278;
    pub const LAST_ERROR_TIME_HI: usize = 0x279;
    pub const FIRST_ERROR_ERRCODE: usize = 0x27A;
    pub const LAST_ERROR_ERRCODE: usize = 0x27B;
}

/// The bytes of the error record proper (`EXT4_S_ERR_START..EXT4_S_ERR_END`): what ext4 keeps
/// across a journal replay, which would otherwise put back an older superblock copy.
pub const ERROR_RECORD_RANGE: std::ops::Range<usize> = off::ERROR_COUNT..off::MOUNT_OPTS;
/// Length of `s_first_error_func` / `s_last_error_func`.
pub const ERROR_FUNC_LEN: usize = 32;

const _: () = assert!(off::FIRST_ERROR_FUNC + ERROR_FUNC_LEN == off::FIRST_ERROR_LINE);
const _: () = assert!(off::LAST_ERROR_FUNC + ERROR_FUNC_LEN == off::MOUNT_OPTS);
const _: () = assert!(off::LAST_ERROR_ERRCODE + 5 == off::ORPHAN_FILE_INUM);

/// `s_*_error_errcode` values (ext4's EXT4_ERR_*), from [`error_code_of_errno`].
pub mod error_code {
    pub const UNKNOWN: u8 = 1;
    pub const EIO: u8 = 2;
    pub const ENOMEM: u8 = 3;
    pub const EFSBADCRC: u8 = 4;
    pub const EFSCORRUPTED: u8 = 5;
    pub const ENOSPC: u8 = 6;
    pub const EROFS: u8 = 8;
    pub const EFBIG: u8 = 9;
    pub const EEXIST: u8 = 10;
    pub const ERANGE: u8 = 11;
    pub const ENOTDIR: u8 = 14;
    pub const ENOTEMPTY: u8 = 15;
}

/// ext4_errno_to_code: the error code recorded for a (positive, Linux) errno. This crate
/// does no I/O and has no errno table: the numbers are Linux's (EBADMSG is ext4's EFSBADCRC,
/// EUCLEAN its EFSCORRUPTED).
pub fn error_code_of_errno(errno: i32) -> u8 {
    match errno {
        0 => 0,
        5 => error_code::EIO,            // EIO
        12 => error_code::ENOMEM,        // ENOMEM
        74 => error_code::EFSBADCRC,     // EBADMSG
        117 => error_code::EFSCORRUPTED, // EUCLEAN
        28 => error_code::ENOSPC,        // ENOSPC
        30 => error_code::EROFS,         // EROFS
        27 => error_code::EFBIG,         // EFBIG
        17 => error_code::EEXIST,        // EEXIST
        34 => error_code::ERANGE,        // ERANGE
        20 => error_code::ENOTDIR,       // ENOTDIR
        39 => error_code::ENOTEMPTY,     // ENOTEMPTY
        _ => error_code::UNKNOWN,
    }
}

/// One of the superblock's two error records (`s_first_error_*`, `s_last_error_*`): where and
/// when ext4_error was called. All zero when no error was recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ErrorRecord {
    /// Seconds since the epoch (`_time` plus `_time_hi << 32`); 0 for no record.
    pub time: u64,
    pub ino: u32,
    pub block: u64,
    /// The function that found the error, NUL-padded (not necessarily NUL-terminated).
    pub func: [u8; ERROR_FUNC_LEN],
    pub line: u32,
    /// An [`error_code`] value.
    pub errcode: u8,
}

impl ErrorRecord {
    /// A record of `func` (cut to [`ERROR_FUNC_LEN`] bytes) at `time`.
    pub fn new(time: u64, func: &str, ino: u32, block: u64, line: u32, errcode: u8) -> Self {
        let mut name = [0u8; ERROR_FUNC_LEN];
        let len = func.len().min(ERROR_FUNC_LEN);
        name[..len].copy_from_slice(&func.as_bytes()[..len]);
        ErrorRecord { time, ino, block, func: name, line, errcode }
    }

    /// The function name, without the padding.
    pub fn func_name(&self) -> &[u8] {
        let len = self.func.iter().position(|&b| b == 0).unwrap_or(ERROR_FUNC_LEN);
        &self.func[..len]
    }
}

/// Field offsets of one error record: (time, time_hi, ino, block, func, line, errcode).
struct ErrorOffsets {
    time: usize,
    time_hi: usize,
    ino: usize,
    block: usize,
    func: usize,
    line: usize,
    errcode: usize,
}

const FIRST_ERROR: ErrorOffsets = ErrorOffsets {
    time: off::FIRST_ERROR_TIME,
    time_hi: off::FIRST_ERROR_TIME_HI,
    ino: off::FIRST_ERROR_INO,
    block: off::FIRST_ERROR_BLOCK,
    func: off::FIRST_ERROR_FUNC,
    line: off::FIRST_ERROR_LINE,
    errcode: off::FIRST_ERROR_ERRCODE,
};

const LAST_ERROR: ErrorOffsets = ErrorOffsets {
    time: off::LAST_ERROR_TIME,
    time_hi: off::LAST_ERROR_TIME_HI,
    ino: off::LAST_ERROR_INO,
    block: off::LAST_ERROR_BLOCK,
    func: off::LAST_ERROR_FUNC,
    line: off::LAST_ERROR_LINE,
    errcode: off::LAST_ERROR_ERRCODE,
};

impl ErrorOffsets {
    fn decode(&self, b: &[u8; SUPERBLOCK_SIZE]) -> ErrorRecord {
        let mut func = [0u8; ERROR_FUNC_LEN];
        func.copy_from_slice(&b[self.func..self.func + ERROR_FUNC_LEN]);
        ErrorRecord {
            time: u64::from(le32(b, self.time)) | (u64::from(b[self.time_hi]) << 32),
            ino: le32(b, self.ino),
            block: u64::from(le32(b, self.block)) | (u64::from(le32(b, self.block + 4)) << 32),
            func,
            line: le32(b, self.line),
            errcode: b[self.errcode],
        }
    }

    fn encode(&self, b: &mut [u8; SUPERBLOCK_SIZE], record: &ErrorRecord) {
        put_le32(b, self.time, record.time as u32);
        b[self.time_hi] = (record.time >> 32) as u8;
        put_le32(b, self.ino, record.ino);
        put_le32(b, self.block, record.block as u32);
        put_le32(b, self.block + 4, (record.block >> 32) as u32);
        b[self.func..self.func + ERROR_FUNC_LEN].copy_from_slice(&record.func);
        put_le32(b, self.line, record.line);
        b[self.errcode] = record.errcode;
    }
}

const _: () = assert!(off::CHECKSUM + 4 == SUPERBLOCK_SIZE);

/// A validated ext4 superblock. Fields are decoded values (64-bit counts already combined);
/// see the module documentation for the invariants `parse` establishes.
#[derive(Clone, PartialEq, Eq)]
pub struct Superblock {
    pub inodes_count: u32,
    /// `s_blocks_count_lo`, plus `s_blocks_count_hi << 32` when the 64bit feature is on.
    pub blocks_count: u64,
    pub first_data_block: u32,
    pub log_block_size: u32,
    pub blocks_per_group: u32,
    pub inodes_per_group: u32,
    pub state: u16,
    pub creator_os: u32,
    pub rev_level: u32,
    pub first_ino: u32,
    pub inode_size: u16,
    pub feature_compat: u32,
    pub feature_incompat: u32,
    pub feature_ro_compat: u32,
    pub uuid: [u8; 16],
    pub volume_name: [u8; 16],
    pub journal_inum: u32,
    pub journal_dev: u32,
    pub jnl_blocks: [u32; 17],
    pub jnl_backup_type: u8,
    /// Raw `s_desc_size`; meaningful only with the 64bit feature (see [`Superblock::desc_size`]).
    pub desc_size: u16,
    pub first_meta_bg: u32,
    pub checksum_type: u8,
    /// `s_backup_bgs`: the only groups holding backups when sparse_super2 is on.
    pub backup_bgs: [u32; 2],
    pub checksum_seed: u32,
    /// `s_r_blocks_count` (with the high half under 64bit): blocks reserved for root.
    pub r_blocks_count: u64,
    /// `s_free_blocks_count`; the kernel keeps it only approximately up to date on disk.
    pub free_blocks_count: u64,
    pub free_inodes_count: u32,
    /// Last mount and last write time (low 32 bits; quill leaves the `_hi` bytes alone).
    pub mtime: u32,
    pub wtime: u32,
    pub mnt_count: u16,
    /// `s_errors`: 1 continue, 2 remount read-only, 3 panic.
    pub errors: u16,
    /// `s_last_orphan`: head of the orphan inode list (0 = empty).
    pub last_orphan: u32,
    /// `s_hash_seed`: the htree hash seed (four little-endian words).
    pub hash_seed: [u32; 4],
    /// `s_def_hash_version`: htree hash of new directories (0 legacy, 1 half_md4, 2 tea).
    pub def_hash_version: u8,
    /// `s_min_extra_isize`: the extra inode space new inodes should reserve.
    pub min_extra_isize: u16,
    /// `s_flags`: 0x1 signed hash, 0x2 unsigned hash, 0x4 test filesystem.
    pub flags: u32,
    /// `s_kbytes_written`: lifetime KiB written.
    pub kbytes_written: u64,
    /// `s_orphan_file_inum`: the orphan file (orphan_file feature), 0 for none.
    pub orphan_file_inum: u32,
    /// `s_usr_quota_inum`, `s_grp_quota_inum`, `s_prj_quota_inum`: the user, group and
    /// project quota files (quota feature), 0 where a type has none.
    pub quota_inums: [u32; 3],
    /// `s_reserved_gdt_blocks`: descriptor blocks reserved after the table for online resize.
    pub reserved_gdt_blocks: u16,
    /// `s_log_cluster_size` and `s_clusters_per_group` (the block size and blocks per group
    /// without bigalloc).
    pub log_cluster_size: u32,
    pub clusters_per_group: u32,
    /// `s_max_mnt_count` (as stored; -1 disables the mount-count check) and `s_lastcheck`.
    pub max_mnt_count: u16,
    pub lastcheck: u32,
    /// `s_block_group_nr`: the group a backup copy lives in (0 in the primary).
    pub block_group_nr: u16,
    /// `s_default_mount_opts` (EXT4_DEFM_*), `s_mkfs_time`.
    pub default_mount_opts: u32,
    pub mkfs_time: u32,
    /// `s_want_extra_isize`: the extra inode space new inodes should get.
    pub want_extra_isize: u16,
    /// `s_log_groups_per_flex` (flex_bg).
    pub log_groups_per_flex: u8,
    /// `s_overhead_clusters`: blocks of metadata, as mke2fs counts them (0: unknown).
    pub overhead_clusters: u32,
    /// `s_mmp_update_interval` (seconds) and `s_mmp_block` (the mmp feature).
    pub mmp_update_interval: u16,
    pub mmp_block: u64,
    /// `s_error_count`: errors recorded since the last e2fsck (which zeroes it).
    pub error_count: u32,
    /// `s_first_error_*`: the first error since the last e2fsck.
    pub first_error: ErrorRecord,
    /// `s_last_error_*`: the most recent error.
    pub last_error: ErrorRecord,
    raw: [u8; SUPERBLOCK_SIZE],
}

impl Superblock {
    /// A superblock with every field zero (every byte of its encoding zero but the magic), for
    /// mkfs to fill in before it encodes: unvalidated until [`Superblock::parse`] reads its
    /// encoding back.
    pub fn blank() -> Self {
        Self::decode([0u8; SUPERBLOCK_SIZE])
    }

    /// Decodes and validates the first [`SUPERBLOCK_SIZE`] bytes of `bytes`.
    pub fn parse(bytes: &[u8]) -> Result<Self, OnDiskError> {
        let raw: [u8; SUPERBLOCK_SIZE] = bytes
            .get(..SUPERBLOCK_SIZE)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| corrupted(format!("{} bytes, need {SUPERBLOCK_SIZE}", bytes.len())))?;
        let magic = le16(&raw, off::MAGIC);
        if magic != EXT4_MAGIC {
            return Err(corrupted(format!("magic {magic:#06x}, expected {EXT4_MAGIC:#06x}")));
        }
        let sb = Self::decode(raw);
        sb.validate_revision()?;
        sb.validate_checksum()?;
        sb.validate_layout_features()?;
        sb.validate_geometry()?;
        Ok(sb)
    }

    /// bigalloc counts bitmaps and free counts in clusters of `2^(log_cluster_size -
    /// log_block_size)` blocks: a group has `clusters_per_group` clusters, so legitimately more
    /// blocks than one bitmap block has bits. The cluster geometry must agree with itself.
    fn validate_layout_features(&self) -> Result<(), OnDiskError> {
        if !self.has_bigalloc() {
            return Ok(());
        }
        let (log_block, log_cluster) = (self.log_block_size, self.log_cluster_size);
        // The kernel caps a cluster at 2^16 blocks.
        if log_cluster < log_block || log_cluster - log_block > 16 {
            return Err(corrupted(format!(
                "bigalloc cluster size 2^{log_cluster} KiB with 2^{log_block} KiB blocks"
            )));
        }
        let ratio = 1u64 << (log_cluster - log_block);
        if u64::from(self.clusters_per_group) * ratio != u64::from(self.blocks_per_group) {
            return Err(corrupted(format!(
                "{} clusters of {ratio} blocks per group, but {} blocks per group",
                self.clusters_per_group, self.blocks_per_group
            )));
        }
        Ok(())
    }

    /// The bigalloc feature: space is allocated in clusters.
    pub fn has_bigalloc(&self) -> bool {
        self.feature_ro_compat & feature::RO_COMPAT_BIGALLOC != 0
    }

    /// Blocks per allocation cluster (1 without bigalloc).
    pub fn cluster_ratio(&self) -> u64 {
        if self.has_bigalloc() {
            1 << self.log_cluster_size.saturating_sub(self.log_block_size).min(16)
        } else {
            1
        }
    }

    fn decode(raw: [u8; SUPERBLOCK_SIZE]) -> Self {
        let b = &raw;
        let feature_incompat = le32(b, off::FEATURE_INCOMPAT);
        let blocks_hi_on = feature_incompat & feature::INCOMPAT_64BIT != 0;
        let blocks_hi = if blocks_hi_on { u64::from(le32(b, off::BLOCKS_COUNT_HI)) } else { 0 };
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[off::UUID..off::UUID + 16]);
        let mut volume_name = [0u8; 16];
        volume_name.copy_from_slice(&b[off::VOLUME_NAME..off::VOLUME_NAME + 16]);
        let mut jnl_blocks = [0u32; 17];
        for (i, word) in jnl_blocks.iter_mut().enumerate() {
            *word = le32(b, off::JNL_BLOCKS + 4 * i);
        }
        Superblock {
            inodes_count: le32(b, off::INODES_COUNT),
            blocks_count: u64::from(le32(b, off::BLOCKS_COUNT_LO)) | (blocks_hi << 32),
            first_data_block: le32(b, off::FIRST_DATA_BLOCK),
            log_block_size: le32(b, off::LOG_BLOCK_SIZE),
            blocks_per_group: le32(b, off::BLOCKS_PER_GROUP),
            inodes_per_group: le32(b, off::INODES_PER_GROUP),
            state: le16(b, off::STATE),
            creator_os: le32(b, off::CREATOR_OS),
            rev_level: le32(b, off::REV_LEVEL),
            first_ino: le32(b, off::FIRST_INO),
            inode_size: le16(b, off::INODE_SIZE),
            feature_compat: le32(b, off::FEATURE_COMPAT),
            feature_incompat,
            feature_ro_compat: le32(b, off::FEATURE_RO_COMPAT),
            uuid,
            volume_name,
            journal_inum: le32(b, off::JOURNAL_INUM),
            journal_dev: le32(b, off::JOURNAL_DEV),
            jnl_blocks,
            jnl_backup_type: b[off::JNL_BACKUP_TYPE],
            desc_size: le16(b, off::DESC_SIZE),
            first_meta_bg: le32(b, off::FIRST_META_BG),
            checksum_type: b[off::CHECKSUM_TYPE],
            backup_bgs: [le32(b, off::BACKUP_BGS), le32(b, off::BACKUP_BGS + 4)],
            checksum_seed: le32(b, off::CHECKSUM_SEED),
            r_blocks_count: u64::from(le32(b, off::R_BLOCKS_COUNT_LO))
                | (u64::from(if blocks_hi_on { le32(b, off::R_BLOCKS_COUNT_HI) } else { 0 }) << 32),
            free_blocks_count: u64::from(le32(b, off::FREE_BLOCKS_COUNT_LO))
                | (u64::from(if blocks_hi_on { le32(b, off::FREE_BLOCKS_COUNT_HI) } else { 0 })
                    << 32),
            free_inodes_count: le32(b, off::FREE_INODES_COUNT),
            mtime: le32(b, off::MTIME),
            wtime: le32(b, off::WTIME),
            mnt_count: le16(b, off::MNT_COUNT),
            errors: le16(b, off::ERRORS),
            last_orphan: le32(b, off::LAST_ORPHAN),
            hash_seed: [
                le32(b, off::HASH_SEED),
                le32(b, off::HASH_SEED + 4),
                le32(b, off::HASH_SEED + 8),
                le32(b, off::HASH_SEED + 12),
            ],
            def_hash_version: b[off::DEF_HASH_VERSION],
            min_extra_isize: le16(b, off::MIN_EXTRA_ISIZE),
            flags: le32(b, off::FLAGS),
            kbytes_written: u64::from(le32(b, off::KBYTES_WRITTEN))
                | (u64::from(le32(b, off::KBYTES_WRITTEN + 4)) << 32),
            orphan_file_inum: le32(b, off::ORPHAN_FILE_INUM),
            quota_inums: [
                le32(b, off::USR_QUOTA_INUM),
                le32(b, off::GRP_QUOTA_INUM),
                le32(b, off::PRJ_QUOTA_INUM),
            ],
            reserved_gdt_blocks: le16(b, off::RESERVED_GDT_BLOCKS),
            log_cluster_size: le32(b, off::LOG_CLUSTER_SIZE),
            clusters_per_group: le32(b, off::CLUSTERS_PER_GROUP),
            max_mnt_count: le16(b, off::MAX_MNT_COUNT),
            lastcheck: le32(b, off::LASTCHECK),
            block_group_nr: le16(b, off::BLOCK_GROUP_NR),
            default_mount_opts: le32(b, off::DEFAULT_MOUNT_OPTS),
            mkfs_time: le32(b, off::MKFS_TIME),
            want_extra_isize: le16(b, off::WANT_EXTRA_ISIZE),
            log_groups_per_flex: b[off::LOG_GROUPS_PER_FLEX],
            overhead_clusters: le32(b, off::OVERHEAD_CLUSTERS),
            mmp_update_interval: le16(b, off::MMP_UPDATE_INTERVAL),
            mmp_block: u64::from(le32(b, off::MMP_BLOCK))
                | (u64::from(le32(b, off::MMP_BLOCK + 4)) << 32),
            error_count: le32(b, off::ERROR_COUNT),
            first_error: FIRST_ERROR.decode(b),
            last_error: LAST_ERROR.decode(b),
            raw,
        }
    }

    fn validate_revision(&self) -> Result<(), OnDiskError> {
        // Revision 0 has no feature words and therefore no journal, extents or checksums;
        // revisions above 1 do not exist (EXT4_MAX_SUPP_REV).
        match self.rev_level {
            1 => Ok(()),
            0 => Err(OnDiskError::unsupported(
                "ext4 superblock",
                "revision 0 (GOOD_OLD_REV) file systems have no feature flags",
            )),
            rev => Err(OnDiskError::unsupported("ext4 superblock", format!("revision {rev}"))),
        }
    }

    fn validate_checksum(&self) -> Result<(), OnDiskError> {
        if !self.has_metadata_csum() {
            return Ok(());
        }
        if self.checksum_type != CHECKSUM_TYPE_CRC32C {
            return Err(corrupted(format!(
                "metadata_csum with checksum type {}, expected {CHECKSUM_TYPE_CRC32C} (crc32c)",
                self.checksum_type
            )));
        }
        let stored = le32(&self.raw, off::CHECKSUM);
        let computed = raw_checksum(&self.raw);
        if stored != computed {
            return Err(corrupted(format!("checksum {stored:#010x}, computed {computed:#010x}")));
        }
        Ok(())
    }

    fn validate_geometry(&self) -> Result<(), OnDiskError> {
        if self.log_block_size > LOG_BLOCK_SIZE_MAX {
            return Err(corrupted(format!("log block size {}", self.log_block_size)));
        }
        let block_size = self.block_size();
        // A group's block and inode bitmaps are one block each (bits_per_block = 8 * size).
        let bits_per_block = 8 * block_size;
        // With bigalloc the block bitmap has a bit per cluster (validate_layout_features has
        // checked clusters_per_group against blocks_per_group).
        let bitmap_units =
            if self.has_bigalloc() { self.clusters_per_group } else { self.blocks_per_group };
        if self.blocks_per_group == 0 || bitmap_units == 0 || bitmap_units > bits_per_block {
            return Err(corrupted(format!("{} blocks per group", self.blocks_per_group)));
        }
        if self.inodes_per_group == 0 || self.inodes_per_group > bits_per_block {
            return Err(corrupted(format!("{} inodes per group", self.inodes_per_group)));
        }
        if !self.inode_size.is_power_of_two()
            || self.inode_size < INODE_SIZE_MIN
            || u32::from(self.inode_size) > block_size
        {
            return Err(corrupted(format!("inode size {}", self.inode_size)));
        }
        if self.is_64bit()
            && (self.desc_size < DESC_SIZE_MIN_64BIT
                || self.desc_size > DESC_SIZE_MAX
                || !self.desc_size.is_power_of_two())
        {
            return Err(corrupted(format!("64bit descriptor size {}", self.desc_size)));
        }
        // The superblock lives in block first_data_block: block 1 with 1 KiB blocks (block 0
        // is the boot block), block 0 otherwise. bigalloc with 1 KiB blocks may use 0.
        let first_data_block_ok = match block_size {
            1024 => self.first_data_block <= 1,
            _ => self.first_data_block == 0,
        };
        if !first_data_block_ok || u64::from(self.first_data_block) >= self.blocks_count {
            return Err(corrupted(format!(
                "first data block {} with {} blocks of {block_size} bytes",
                self.first_data_block, self.blocks_count
            )));
        }
        let groups = self.group_count_u64();
        if groups > u64::from(u32::MAX) {
            return Err(corrupted(format!("{groups} block groups")));
        }
        // The kernel refuses a superblock whose inode count disagrees with its groups.
        if u64::from(self.inodes_count) != groups * u64::from(self.inodes_per_group) {
            return Err(corrupted(format!(
                "{} inodes, but {groups} groups of {} inodes",
                self.inodes_count, self.inodes_per_group
            )));
        }
        if self.first_ino < FIRST_INO_MIN || self.first_ino > self.inodes_count {
            return Err(corrupted(format!("first inode {}", self.first_ino)));
        }
        Ok(())
    }

    /// Block size in bytes: 1024 << `log_block_size`.
    pub fn block_size(&self) -> u32 {
        assert!(self.log_block_size <= LOG_BLOCK_SIZE_MAX, "superblock not validated");
        1024 << self.log_block_size
    }

    fn group_count_u64(&self) -> u64 {
        assert!(self.blocks_per_group != 0, "superblock not validated");
        assert!(u64::from(self.first_data_block) < self.blocks_count, "superblock not validated");
        (self.blocks_count - u64::from(self.first_data_block))
            .div_ceil(u64::from(self.blocks_per_group))
    }

    /// Number of block groups: the blocks after `first_data_block`, in groups, rounded up.
    pub fn group_count(&self) -> u32 {
        let groups = self.group_count_u64();
        assert!(groups <= u64::from(u32::MAX), "superblock not validated");
        groups as u32
    }

    pub fn is_64bit(&self) -> bool {
        self.feature_incompat & feature::INCOMPAT_64BIT != 0
    }

    pub fn has_journal(&self) -> bool {
        self.feature_compat & feature::COMPAT_HAS_JOURNAL != 0
    }

    pub fn has_metadata_csum(&self) -> bool {
        self.feature_ro_compat & feature::RO_COMPAT_METADATA_CSUM != 0
    }

    /// Whether group descriptors carry the old crc16 checksum (gdt_csum / uninit_bg). When
    /// metadata_csum is also set, metadata_csum's crc32c wins, as in the kernel.
    pub fn has_gdt_csum(&self) -> bool {
        self.feature_ro_compat & feature::RO_COMPAT_GDT_CSUM != 0
    }

    /// Whether group descriptors are checksummed at all, by either algorithm.
    pub fn has_group_desc_csum(&self) -> bool {
        self.has_metadata_csum() || self.has_gdt_csum()
    }

    /// Size of one group descriptor: 32 bytes without the 64bit feature, `s_desc_size` with it.
    pub fn desc_size(&self) -> usize {
        if self.is_64bit() {
            usize::from(self.desc_size)
        } else {
            usize::from(DESC_SIZE_MIN)
        }
    }

    /// The seed of every metadata_csum checksum: `s_checksum_seed` when the csum_seed feature
    /// stored it (so the UUID can change), otherwise crc32c(~0, uuid).
    pub fn csum_seed(&self) -> u32 {
        if self.feature_incompat & feature::INCOMPAT_CSUM_SEED != 0 {
            self.checksum_seed
        } else {
            crc32c_raw(!0, &self.uuid)
        }
    }

    /// The htree hash version new directory entries use: `s_def_hash_version`, moved to its
    /// unsigned variant (+3) when `s_flags` says chars are unsigned (EXT2_FLAGS_UNSIGNED_HASH).
    pub fn effective_hash_version(&self) -> u8 {
        const FLAGS_UNSIGNED_HASH: u32 = 0x2;
        if self.flags & FLAGS_UNSIGNED_HASH != 0 && self.def_hash_version <= 2 {
            self.def_hash_version + 3
        } else {
            self.def_hash_version
        }
    }

    pub fn needs_recovery(&self) -> bool {
        self.feature_incompat & feature::INCOMPAT_RECOVER != 0
    }

    pub fn set_needs_recovery(&mut self, on: bool) {
        if on {
            self.feature_incompat |= feature::INCOMPAT_RECOVER;
        } else {
            self.feature_incompat &= !feature::INCOMPAT_RECOVER;
        }
    }

    /// INCOMPAT bits outside [`feature::INCOMPAT_SUPPORTED`]: what a read-write user must refuse.
    pub fn unsupported_incompat(&self) -> u32 {
        self.feature_incompat & !feature::INCOMPAT_SUPPORTED
    }

    /// The block holding the primary superblock: 1 with 1 KiB blocks, 0 otherwise (it always
    /// starts at byte 1024).
    pub fn superblock_block(&self) -> u64 {
        SUPERBLOCK_OFFSET / u64::from(self.block_size())
    }

    /// First block of `group`.
    pub fn group_first_block(&self, group: u32) -> u64 {
        u64::from(self.first_data_block) + u64::from(group) * u64::from(self.blocks_per_group)
    }

    /// Whether `group` holds a copy of the superblock (and, without meta_bg, of the group
    /// descriptor table): `ext4_bg_has_super`.
    pub fn group_has_superblock(&self, group: u32) -> bool {
        if group == 0 {
            return true;
        }
        if self.feature_compat & feature::COMPAT_SPARSE_SUPER2 != 0 {
            return group == self.backup_bgs[0] || group == self.backup_bgs[1];
        }
        if group <= 1 || self.feature_ro_compat & feature::RO_COMPAT_SPARSE_SUPER == 0 {
            return true;
        }
        if group.is_multiple_of(2) {
            return false;
        }
        is_power_of(group, 3) || is_power_of(group, 5) || is_power_of(group, 7)
    }

    /// Blocks at the start of `group` that hold a superblock copy and descriptor blocks
    /// (with the reserved GDT blocks after them): `ext4_num_base_meta_blocks`. Without meta_bg
    /// (or below `first_meta_bg`'s groups) a group with a superblock copy holds the whole
    /// table and the reserved blocks; with meta_bg, a meta group's descriptor block sits in
    /// its first, second and last group.
    pub fn group_base_meta_blocks(&self, group: u32) -> u32 {
        let has_super = u32::from(self.group_has_superblock(group));
        let per_block = (self.block_size() as usize / self.desc_size()) as u32;
        let meta_bg = self.feature_incompat & feature::INCOMPAT_META_BG != 0;
        if !meta_bg || u64::from(group) < u64::from(self.first_meta_bg) * u64::from(per_block) {
            if has_super == 0 {
                return 0;
            }
            let table = if meta_bg { self.first_meta_bg } else { self.group_desc_blocks() };
            return has_super + table + u32::from(self.reserved_gdt_blocks);
        }
        let first = group - group % per_block;
        let holds_copy = group == first || group == first + 1 || group == first + per_block - 1;
        has_super + u32::from(holds_copy)
    }

    /// Number of blocks the group descriptor table occupies.
    pub fn group_desc_blocks(&self) -> u32 {
        let per_block = self.block_size() as usize / self.desc_size();
        assert!(per_block > 0, "superblock not validated");
        // group_count() < 2^32 and per_block >= 1, so the quotient fits.
        (self.group_count() as usize).div_ceil(per_block) as u32
    }

    /// Where block `nr` of the group descriptor table lives (`descriptor_loc` in the kernel).
    /// Without meta_bg the table follows the superblock; with meta_bg, block `nr` (from
    /// `first_meta_bg` on) sits in the first group of its meta group, after that group's
    /// superblock backup if it has one.
    pub fn group_desc_block(&self, nr: u32) -> u64 {
        let sb_block = self.superblock_block();
        let meta_bg = self.feature_incompat & feature::INCOMPAT_META_BG != 0;
        if !meta_bg || nr < self.first_meta_bg {
            return sb_block + u64::from(nr) + 1;
        }
        let per_block = (self.block_size() as usize / self.desc_size()) as u64;
        let group = u64::from(nr) * per_block;
        // Callers pass nr < group_desc_blocks(), so the group exists and fits u32.
        let group = u32::try_from(group).unwrap_or(u32::MAX);
        let mut has_super = u64::from(self.group_has_superblock(group));
        // 1 KiB blocks with first_data_block 0 (bigalloc): group 0 starts at block 0, but the
        // superblock occupies block 1, so the descriptors start at block 2.
        if self.block_size() == 1024 && nr == 0 && self.first_data_block == 0 {
            has_super += 1;
        }
        self.group_first_block(group) + has_super
    }

    /// The 1024-byte superblock: the raw bytes it was parsed from with every field written
    /// over them, and `s_checksum` recomputed when metadata_csum is on.
    pub fn encode(&self) -> Vec<u8> {
        let mut raw = self.raw;
        let b = &mut raw;
        put_le32(b, off::INODES_COUNT, self.inodes_count);
        put_le32(b, off::BLOCKS_COUNT_LO, self.blocks_count as u32);
        if self.is_64bit() {
            put_le32(b, off::BLOCKS_COUNT_HI, (self.blocks_count >> 32) as u32);
        }
        put_le32(b, off::FIRST_DATA_BLOCK, self.first_data_block);
        put_le32(b, off::LOG_BLOCK_SIZE, self.log_block_size);
        put_le32(b, off::BLOCKS_PER_GROUP, self.blocks_per_group);
        put_le32(b, off::INODES_PER_GROUP, self.inodes_per_group);
        put_le16(b, off::MAGIC, EXT4_MAGIC);
        put_le16(b, off::STATE, self.state);
        put_le32(b, off::CREATOR_OS, self.creator_os);
        put_le32(b, off::REV_LEVEL, self.rev_level);
        put_le32(b, off::FIRST_INO, self.first_ino);
        put_le16(b, off::INODE_SIZE, self.inode_size);
        put_le32(b, off::FEATURE_COMPAT, self.feature_compat);
        put_le32(b, off::FEATURE_INCOMPAT, self.feature_incompat);
        put_le32(b, off::FEATURE_RO_COMPAT, self.feature_ro_compat);
        b[off::UUID..off::UUID + 16].copy_from_slice(&self.uuid);
        b[off::VOLUME_NAME..off::VOLUME_NAME + 16].copy_from_slice(&self.volume_name);
        put_le32(b, off::JOURNAL_INUM, self.journal_inum);
        put_le32(b, off::JOURNAL_DEV, self.journal_dev);
        for (i, word) in self.jnl_blocks.iter().enumerate() {
            put_le32(b, off::JNL_BLOCKS + 4 * i, *word);
        }
        b[off::JNL_BACKUP_TYPE] = self.jnl_backup_type;
        put_le16(b, off::DESC_SIZE, self.desc_size);
        put_le32(b, off::FIRST_META_BG, self.first_meta_bg);
        b[off::CHECKSUM_TYPE] = self.checksum_type;
        put_le32(b, off::BACKUP_BGS, self.backup_bgs[0]);
        put_le32(b, off::BACKUP_BGS + 4, self.backup_bgs[1]);
        put_le32(b, off::CHECKSUM_SEED, self.checksum_seed);
        put_le32(b, off::R_BLOCKS_COUNT_LO, self.r_blocks_count as u32);
        put_le32(b, off::FREE_BLOCKS_COUNT_LO, self.free_blocks_count as u32);
        if self.is_64bit() {
            put_le32(b, off::R_BLOCKS_COUNT_HI, (self.r_blocks_count >> 32) as u32);
            put_le32(b, off::FREE_BLOCKS_COUNT_HI, (self.free_blocks_count >> 32) as u32);
        }
        put_le32(b, off::FREE_INODES_COUNT, self.free_inodes_count);
        put_le32(b, off::MTIME, self.mtime);
        put_le32(b, off::WTIME, self.wtime);
        put_le16(b, off::MNT_COUNT, self.mnt_count);
        put_le16(b, off::ERRORS, self.errors);
        put_le32(b, off::LAST_ORPHAN, self.last_orphan);
        for (i, word) in self.hash_seed.iter().enumerate() {
            put_le32(b, off::HASH_SEED + 4 * i, *word);
        }
        b[off::DEF_HASH_VERSION] = self.def_hash_version;
        put_le16(b, off::MIN_EXTRA_ISIZE, self.min_extra_isize);
        put_le32(b, off::FLAGS, self.flags);
        put_le32(b, off::KBYTES_WRITTEN, self.kbytes_written as u32);
        put_le32(b, off::KBYTES_WRITTEN + 4, (self.kbytes_written >> 32) as u32);
        put_le32(b, off::ORPHAN_FILE_INUM, self.orphan_file_inum);
        put_le32(b, off::USR_QUOTA_INUM, self.quota_inums[0]);
        put_le32(b, off::GRP_QUOTA_INUM, self.quota_inums[1]);
        put_le32(b, off::PRJ_QUOTA_INUM, self.quota_inums[2]);
        put_le16(b, off::RESERVED_GDT_BLOCKS, self.reserved_gdt_blocks);
        put_le32(b, off::LOG_CLUSTER_SIZE, self.log_cluster_size);
        put_le32(b, off::CLUSTERS_PER_GROUP, self.clusters_per_group);
        put_le16(b, off::MAX_MNT_COUNT, self.max_mnt_count);
        put_le32(b, off::LASTCHECK, self.lastcheck);
        put_le16(b, off::BLOCK_GROUP_NR, self.block_group_nr);
        put_le32(b, off::DEFAULT_MOUNT_OPTS, self.default_mount_opts);
        put_le32(b, off::MKFS_TIME, self.mkfs_time);
        put_le16(b, off::WANT_EXTRA_ISIZE, self.want_extra_isize);
        b[off::LOG_GROUPS_PER_FLEX] = self.log_groups_per_flex;
        put_le32(b, off::OVERHEAD_CLUSTERS, self.overhead_clusters);
        put_le16(b, off::MMP_UPDATE_INTERVAL, self.mmp_update_interval);
        put_le32(b, off::MMP_BLOCK, self.mmp_block as u32);
        put_le32(b, off::MMP_BLOCK + 4, (self.mmp_block >> 32) as u32);
        put_le32(b, off::ERROR_COUNT, self.error_count);
        FIRST_ERROR.encode(b, &self.first_error);
        LAST_ERROR.encode(b, &self.last_error);
        if self.has_metadata_csum() {
            set_superblock_checksum(b);
        }
        raw.to_vec()
    }
}

impl fmt::Debug for Superblock {
    // The raw copy is left out: 1024 bytes of numbers hide the fields that matter.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Superblock")
            .field("inodes_count", &self.inodes_count)
            .field("blocks_count", &self.blocks_count)
            .field("first_data_block", &self.first_data_block)
            .field("log_block_size", &self.log_block_size)
            .field("blocks_per_group", &self.blocks_per_group)
            .field("inodes_per_group", &self.inodes_per_group)
            .field("state", &self.state)
            .field("rev_level", &self.rev_level)
            .field("inode_size", &self.inode_size)
            .field("feature_compat", &format_args!("{:#x}", self.feature_compat))
            .field("feature_incompat", &format_args!("{:#x}", self.feature_incompat))
            .field("feature_ro_compat", &format_args!("{:#x}", self.feature_ro_compat))
            .field("journal_inum", &self.journal_inum)
            .field("journal_dev", &self.journal_dev)
            .field("desc_size", &self.desc_size)
            .field("checksum_type", &self.checksum_type)
            .finish_non_exhaustive()
    }
}

/// Writes `s_checksum` of the raw superblock `raw` (`ext4_superblock_csum_set`), whatever its
/// features: the checksum [`Superblock::parse`] requires under metadata_csum.
pub fn set_superblock_checksum(raw: &mut [u8; SUPERBLOCK_SIZE]) {
    let checksum = raw_checksum(raw);
    put_le32(raw, off::CHECKSUM, checksum);
}

/// `ext4_superblock_csum`: crc32c(~0) over everything before `s_checksum`.
fn raw_checksum(raw: &[u8; SUPERBLOCK_SIZE]) -> u32 {
    crc32c_raw(!0, &raw[..off::CHECKSUM])
}

fn is_power_of(mut n: u32, base: u32) -> bool {
    while n > 1 && n.is_multiple_of(base) {
        n /= base;
    }
    n == 1
}

fn corrupted(reason: String) -> OnDiskError {
    OnDiskError::corrupted("ext4 superblock", reason)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A superblock like `mkfs.ext4 -b 4096` makes for 64 MiB: 4K blocks, 1 group of 32768
    /// blocks (16384 of them present), 256-byte inodes, 64bit, metadata_csum.
    pub(crate) fn sample_raw() -> [u8; SUPERBLOCK_SIZE] {
        let mut b = [0u8; SUPERBLOCK_SIZE];
        put_le32(&mut b, off::INODES_COUNT, 16384);
        put_le32(&mut b, off::BLOCKS_COUNT_LO, 16384);
        put_le32(&mut b, off::FIRST_DATA_BLOCK, 0);
        put_le32(&mut b, off::LOG_BLOCK_SIZE, 2);
        put_le32(&mut b, off::BLOCKS_PER_GROUP, 32768);
        put_le32(&mut b, off::INODES_PER_GROUP, 16384);
        put_le16(&mut b, off::MAGIC, EXT4_MAGIC);
        put_le16(&mut b, off::STATE, STATE_VALID_FS);
        put_le32(&mut b, off::REV_LEVEL, 1);
        put_le32(&mut b, off::FIRST_INO, 11);
        put_le16(&mut b, off::INODE_SIZE, 256);
        put_le32(
            &mut b,
            off::FEATURE_COMPAT,
            feature::COMPAT_HAS_JOURNAL | feature::COMPAT_EXT_ATTR | feature::COMPAT_DIR_INDEX,
        );
        put_le32(
            &mut b,
            off::FEATURE_INCOMPAT,
            feature::INCOMPAT_FILETYPE
                | feature::INCOMPAT_EXTENTS
                | feature::INCOMPAT_64BIT
                | feature::INCOMPAT_FLEX_BG,
        );
        put_le32(
            &mut b,
            off::FEATURE_RO_COMPAT,
            feature::RO_COMPAT_SPARSE_SUPER
                | feature::RO_COMPAT_LARGE_FILE
                | feature::RO_COMPAT_METADATA_CSUM,
        );
        for (i, byte) in b[off::UUID..off::UUID + 16].iter_mut().enumerate() {
            *byte = 0x10 + i as u8;
        }
        b[off::VOLUME_NAME..off::VOLUME_NAME + 5].copy_from_slice(b"quill");
        put_le32(&mut b, off::JOURNAL_INUM, 8);
        b[off::JNL_BACKUP_TYPE] = 1;
        put_le16(&mut b, off::DESC_SIZE, 64);
        b[off::CHECKSUM_TYPE] = CHECKSUM_TYPE_CRC32C;
        // A field quill does not model (s_mkfs_time at 0x108) must survive encode.
        put_le32(&mut b, 0x108, 0x6543_2100);
        set_superblock_checksum(&mut b);
        b
    }

    pub(crate) fn sample() -> Superblock {
        Superblock::parse(&sample_raw()).unwrap()
    }

    #[test]
    fn sample_superblock_parses_to_its_fields() {
        let sb = sample();
        assert_eq!(sb.block_size(), 4096);
        assert_eq!(sb.group_count(), 1);
        assert!(sb.is_64bit());
        assert!(sb.has_metadata_csum());
        assert_eq!(sb.desc_size(), 64);
        assert_eq!(sb.journal_inum, 8);
        assert_eq!(&sb.volume_name[..5], b"quill");
        assert_eq!(sb.csum_seed(), crc32c_raw(!0, &sb.uuid));
        assert!(!sb.needs_recovery());
        assert_eq!(sb.unsupported_incompat(), 0);
        assert_eq!(sb.superblock_block(), 0);
        assert_eq!(sb.group_desc_block(0), 1);
    }

    #[test]
    fn superblock_encode_reproduces_the_parsed_bytes() {
        let raw = sample_raw();
        assert_eq!(Superblock::parse(&raw).unwrap().encode(), raw.to_vec());
    }

    #[test]
    fn error_records_round_trip_at_the_kernels_offsets() {
        let mut sb = sample();
        assert_eq!(
            (sb.error_count, sb.first_error, sb.last_error),
            (0, ErrorRecord::default(), ErrorRecord::default())
        );
        sb.error_count = 3;
        sb.first_error = ErrorRecord::new(0x1_2345_6789, "ext4_ext_check", 12, 0x1_0000_0007, 9, 5);
        sb.last_error =
            ErrorRecord::new(0x2_0000_0001, "a_function_name_longer_than_32_bytes", 13, 42, 0, 4);
        let raw = sb.encode();
        let again = Superblock::parse(&raw).unwrap();
        assert_eq!(again.error_count, 3);
        assert_eq!(again.first_error, sb.first_error);
        assert_eq!(again.last_error, sb.last_error);
        assert_eq!(again.first_error.func_name(), b"ext4_ext_check");
        assert_eq!(again.last_error.func_name(), b"a_function_name_longer_than_32_b");
        // The bytes where ext4.h puts them.
        assert_eq!(le32(&raw, 0x194), 3);
        assert_eq!(le32(&raw, 0x198), 0x2345_6789);
        assert_eq!(raw[0x278], 1);
        assert_eq!(le32(&raw, 0x19C), 12);
        assert_eq!((le32(&raw, 0x1A0), le32(&raw, 0x1A4)), (7, 1));
        assert_eq!(&raw[0x1A8..0x1B6], b"ext4_ext_check");
        assert_eq!(le32(&raw, 0x1C8), 9);
        assert_eq!((le32(&raw, 0x1CC), raw[0x279]), (1, 2));
        assert_eq!((le32(&raw, 0x1D0), le32(&raw, 0x1D8)), (13, 42));
        assert_eq!(&raw[0x1E0..0x1E6], b"a_func");
        assert_eq!((raw[0x27A], raw[0x27B]), (5, 4));
        // Nothing else moved: the only bytes that differ from the sample are the record's and
        // the checksum.
        let sample = sample_raw();
        for (i, (a, b)) in sample.iter().zip(&raw).enumerate() {
            let in_record = ERROR_RECORD_RANGE.contains(&i) || (0x278..0x27C).contains(&i);
            assert!(a == b || in_record || i >= off::CHECKSUM, "byte {i:#x} changed");
        }
    }

    #[test]
    fn errno_maps_to_the_kernels_error_codes() {
        assert_eq!(error_code_of_errno(117), error_code::EFSCORRUPTED);
        assert_eq!(error_code_of_errno(74), error_code::EFSBADCRC);
        assert_eq!(error_code_of_errno(5), error_code::EIO);
        assert_eq!(error_code_of_errno(30), error_code::EROFS);
        assert_eq!(error_code_of_errno(0), 0);
        assert_eq!(error_code_of_errno(1000), error_code::UNKNOWN);
    }

    #[test]
    fn superblock_encode_recomputes_the_checksum_after_a_change() {
        let mut sb = sample();
        sb.set_needs_recovery(true);
        let encoded = sb.encode();
        let reparsed = Superblock::parse(&encoded).unwrap();
        assert!(reparsed.needs_recovery());
        assert_eq!(reparsed, sb_with_raw(&sb, &encoded));
        // Untouched, unmodelled fields survive.
        assert_eq!(le32(&encoded, 0x108), 0x6543_2100);
        sb.set_needs_recovery(false);
        assert_eq!(sb.encode(), sample_raw().to_vec());
    }

    fn sb_with_raw(sb: &Superblock, raw: &[u8]) -> Superblock {
        let mut copy = sb.clone();
        copy.raw.copy_from_slice(raw);
        copy
    }

    #[test]
    fn superblock_with_a_corrupted_checksum_is_rejected() {
        let mut raw = sample_raw();
        raw[off::CHECKSUM] ^= 1;
        let err = Superblock::parse(&raw).unwrap_err();
        assert!(matches!(err, OnDiskError::Corrupted { .. }), "{err}");
        assert!(err.to_string().contains("checksum"), "{err}");
        // A flipped payload bit is caught the same way.
        let mut raw = sample_raw();
        raw[off::INODES_COUNT] ^= 0x80;
        assert!(Superblock::parse(&raw).unwrap_err().to_string().contains("checksum"));
    }

    #[test]
    fn superblock_without_metadata_csum_ignores_the_checksum_field() {
        let mut raw = sample_raw();
        let ro = le32(&raw, off::FEATURE_RO_COMPAT) & !feature::RO_COMPAT_METADATA_CSUM;
        put_le32(&mut raw, off::FEATURE_RO_COMPAT, ro);
        put_le32(&mut raw, off::CHECKSUM, 0xDEAD_BEEF);
        let sb = Superblock::parse(&raw).unwrap();
        assert!(!sb.has_metadata_csum());
        // encode leaves s_checksum alone when no checksum is defined.
        assert_eq!(le32(&sb.encode(), off::CHECKSUM), 0xDEAD_BEEF);
    }

    /// Applies `edit` to the sample's raw bytes, re-seals the checksum, and parses.
    fn parse_edited(
        edit: impl FnOnce(&mut [u8; SUPERBLOCK_SIZE]),
    ) -> Result<Superblock, OnDiskError> {
        let mut raw = sample_raw();
        edit(&mut raw);
        set_superblock_checksum(&mut raw);
        Superblock::parse(&raw)
    }

    #[test]
    fn superblock_with_bad_geometry_is_rejected() {
        type Edit = fn(&mut [u8; SUPERBLOCK_SIZE]);
        let cases: [(&str, Edit); 12] = [
            ("log block size 7", |b| put_le32(b, off::LOG_BLOCK_SIZE, 7)),
            ("log block size huge", |b| put_le32(b, off::LOG_BLOCK_SIZE, 40)),
            ("zero blocks per group", |b| put_le32(b, off::BLOCKS_PER_GROUP, 0)),
            ("blocks per group beyond a bitmap", |b| put_le32(b, off::BLOCKS_PER_GROUP, 32769)),
            ("zero inodes per group", |b| put_le32(b, off::INODES_PER_GROUP, 0)),
            ("inode size 100", |b| put_le16(b, off::INODE_SIZE, 100)),
            ("inode size 8192", |b| put_le16(b, off::INODE_SIZE, 8192)),
            ("64bit desc size 32", |b| put_le16(b, off::DESC_SIZE, 32)),
            ("64bit desc size 96", |b| put_le16(b, off::DESC_SIZE, 96)),
            ("zero blocks", |b| put_le32(b, off::BLOCKS_COUNT_LO, 0)),
            ("inode count off by one", |b| put_le32(b, off::INODES_COUNT, 16385)),
            ("first inode 3", |b| put_le32(b, off::FIRST_INO, 3)),
        ];
        for (name, edit) in cases {
            let err = parse_edited(edit).expect_err(name);
            assert!(matches!(err, OnDiskError::Corrupted { .. }), "{name}: {err}");
        }
    }

    #[test]
    fn a_bigalloc_superblock_parses_with_its_cluster_geometry_checked() {
        // As mkfs.ext4 -O bigalloc -b 4096 writes it: 16-block clusters, so 32768 clusters
        // per group are 524288 blocks.
        let bigalloc = |clusters_per_group: u32| {
            parse_edited(move |b| {
                let ro = le32(b, off::FEATURE_RO_COMPAT) | feature::RO_COMPAT_BIGALLOC;
                put_le32(b, off::FEATURE_RO_COMPAT, ro);
                let log_cluster = le32(b, off::LOG_BLOCK_SIZE) + 4;
                put_le32(b, off::LOG_CLUSTER_SIZE, log_cluster);
                put_le32(b, off::CLUSTERS_PER_GROUP, clusters_per_group);
                put_le32(b, off::BLOCKS_PER_GROUP, 16 * 8 * 1024);
            })
        };
        let sb = bigalloc(8 * 1024).unwrap();
        assert_eq!((sb.cluster_ratio(), sb.clusters_per_group), (16, 8192));
        let err = bigalloc(8 * 1024 + 8).unwrap_err();
        assert!(matches!(err, OnDiskError::Corrupted { .. }), "{err}");
    }

    #[test]
    fn superblock_with_wrong_magic_or_revision_or_checksum_type_is_rejected() {
        assert!(parse_edited(|b| put_le16(b, off::MAGIC, 0xEF54)).is_err());
        assert!(matches!(
            parse_edited(|b| put_le32(b, off::REV_LEVEL, 0)),
            Err(OnDiskError::Unsupported { .. })
        ));
        assert!(parse_edited(|b| put_le32(b, off::REV_LEVEL, 2)).is_err());
        assert!(parse_edited(|b| b[off::CHECKSUM_TYPE] = 2).is_err());
        assert!(Superblock::parse(&sample_raw()[..1023]).is_err());
    }

    #[test]
    fn csum_seed_feature_uses_the_stored_seed() {
        let sb = parse_edited(|b| {
            let incompat = le32(b, off::FEATURE_INCOMPAT) | feature::INCOMPAT_CSUM_SEED;
            put_le32(b, off::FEATURE_INCOMPAT, incompat);
            put_le32(b, off::CHECKSUM_SEED, 0x1234_5678);
        })
        .unwrap();
        assert_eq!(sb.csum_seed(), 0x1234_5678);
    }

    #[test]
    fn without_64bit_descriptors_are_32_bytes_and_blocks_count_ignores_the_high_word() {
        let sb = parse_edited(|b| {
            let incompat = le32(b, off::FEATURE_INCOMPAT) & !feature::INCOMPAT_64BIT;
            put_le32(b, off::FEATURE_INCOMPAT, incompat);
            put_le32(b, off::BLOCKS_COUNT_HI, 7);
            put_le16(b, off::DESC_SIZE, 0);
        })
        .unwrap();
        assert_eq!(sb.desc_size(), 32);
        assert_eq!(sb.blocks_count, 16384);
    }

    #[test]
    fn sparse_super_backups_are_in_groups_zero_one_and_powers_of_three_five_seven() {
        let sb = sample();
        let with: Vec<u32> = (0..130).filter(|&g| sb.group_has_superblock(g)).collect();
        assert_eq!(with, vec![0, 1, 3, 5, 7, 9, 25, 27, 49, 81, 125]);
    }

    #[test]
    fn meta_bg_descriptor_blocks_follow_their_meta_group() {
        // 1 KiB blocks, 8192 blocks per group, 64-byte descriptors: 16 per block, so
        // descriptor block nr describes groups 16*nr.. and lives in group 16*nr.
        let sb = parse_edited(|b| {
            put_le32(b, off::LOG_BLOCK_SIZE, 0);
            put_le32(b, off::FIRST_DATA_BLOCK, 1);
            put_le32(b, off::BLOCKS_PER_GROUP, 8192);
            put_le32(b, off::BLOCKS_COUNT_LO, 1 + 64 * 8192);
            put_le32(b, off::INODES_PER_GROUP, 2048);
            put_le32(b, off::INODES_COUNT, 64 * 2048);
            let incompat = le32(b, off::FEATURE_INCOMPAT) | feature::INCOMPAT_META_BG;
            put_le32(b, off::FEATURE_INCOMPAT, incompat);
            put_le32(b, off::FIRST_META_BG, 1);
        })
        .unwrap();
        assert_eq!(sb.group_count(), 64);
        assert_eq!(sb.group_desc_blocks(), 4);
        // Block 0 precedes first_meta_bg: right after the superblock.
        assert_eq!(sb.group_desc_block(0), 2);
        // Group 16 has no backup superblock: the descriptors open the group.
        assert_eq!(sb.group_desc_block(1), 1 + 16 * 8192);
        // Group 32 neither; group 48 neither (not a power of 3, 5 or 7).
        assert_eq!(sb.group_desc_block(2), 1 + 32 * 8192);
        assert_eq!(sb.group_desc_block(3), 1 + 48 * 8192);
    }
}
