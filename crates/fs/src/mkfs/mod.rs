//! `mkfs`: format a block device as ext4 exactly as e2fsprogs 1.47.0's `mkfs.ext4` does with its
//! default configuration (Debian's `/etc/mke2fs.conf`), so that `e2fsck`, the kernel and quill
//! itself accept the result and `dumpe2fs` shows the same geometry as the stock tool.
//!
//! The layout is not approximated: the geometry (`ext2fs_initialize`), the table placement
//! (`ext2fs_allocate_group_table` with flex_bg packing), the allocator (`ext2fs_new_block2`,
//! `ext2fs_new_range`, `ext2fs_get_free_blocks2`) and the order in which mke2fs allocates
//! (root, lost+found, resize inode, journal, orphan file) are reproduced, so with the same UUID,
//! hash seed and clock the image is byte-identical to mke2fs's except for the fields listed under
//! "Deliberate differences". The tests compare whole images to prove it.
//!
//! Invariants kept while planning (see `Planner`):
//! - every block is either free or in exactly one used run of `UsedBlocks`; group free counts,
//!   bitmaps and the superblock's counts are all derived from that one set, so they cannot
//!   disagree;
//! - a group keeps `BLOCK_UNINIT` only while no block was allocated in it after the initial
//!   reservation of its superblock backup and descriptor copies (and, without flex_bg, its own
//!   tables), which is exactly what the kernel recomputes for an uninitialized bitmap;
//! - nothing is written until the whole layout is planned; the primary superblock is written
//!   last, after a flush, so a failed mkfs never leaves a superblock describing a half-written
//!   file system (the old primary superblock is wiped first).
//!
//! What is written: superblocks, descriptor tables, initialized bitmaps, the used part of each
//! inode table, the directory, resize, journal and orphan-file blocks. The data area is never
//! touched. With [`MkfsOptions::device_zeroed`] (a freshly created or hole-punched file, as after
//! mke2fs's discard) the inode tables and journal are taken as zero and every group is marked
//! `ITABLE_ZEROED`; otherwise the used part of each inode table, the journal and the last 64 KiB
//! are zeroed and the kernel's lazy-init thread zeroes the rest, as mke2fs does without discard.
//!
//! Deliberate differences from mkfs.ext4 1.47.0:
//!
//! | what                         | mkfs.ext4                          | quill                              |
//! |------------------------------|------------------------------------|------------------------------------|
//! | default block size           | 1 KiB below 512 MiB ("small")      | 4 KiB unless given                 |
//! | journal superblock features  | none (the kernel adds them)        | 64bit, csum v3 with metadata_csum  |
//! | `s_kbytes_written`           | 1 + bytes its I/O layer wrote      | 1 + bytes quill wrote              |
//! | over-long label              | truncated with a warning           | refused                            |

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::mmp::hostname;
use blockdev::BlockDevice;
use journal::{JournalLocation, LocationExtent};
use ondisk::crc::crc32c_raw;
use ondisk::ext4::dir::{self as dirent, FT_DIR};
use ondisk::ext4::mmp::{MmpBlock, MMP_CHECK_INTERVAL_MIN, MMP_SIZE};
use ondisk::ext4::{
    self, bitmap_checksum, feature, inode_csum_seed, set_group_desc_checksum, set_inode_checksum,
    Extent, ExtentEntries, ExtentHeader, ExtentIndex, GroupDesc, Inode, Superblock, Timestamp,
};
use ondisk::jbd2::ChecksumVersion;

use crate::error::{FsError, Result};

/// Smallest and largest block sizes ext4 defines.
pub const BLOCK_SIZE_MIN: u32 = 1024;
pub const BLOCK_SIZE_MAX: u32 = 65536;
/// quill's default block size (mkfs.ext4 uses 1 KiB below 512 MiB; see the module docs).
pub const BLOCK_SIZE_DEFAULT: u32 = 4096;
/// Default inode record size (`inode_size` in mke2fs.conf).
pub const INODE_SIZE_DEFAULT: u16 = 256;
/// Default percentage of blocks reserved for root (`-m`).
pub const RESERVED_PERCENT_DEFAULT: f64 = 5.0;
/// Largest `-m` mke2fs accepts.
pub const RESERVED_PERCENT_MAX: f64 = 50.0;
/// Bounds of `-i` (bytes per inode), as mke2fs checks them.
pub const INODE_RATIO_MIN: u32 = 1024;
pub const INODE_RATIO_MAX: u32 = 65536 * 1024;
/// Bounds of an explicitly sized journal, in blocks (mke2fs `figure_journal_size`).
pub const JOURNAL_BLOCKS_MIN: u32 = 1024;
pub const JOURNAL_BLOCKS_MAX: u32 = 10_240_000;
/// Longest volume label (`s_volume_name`).
pub const LABEL_BYTES_MAX: usize = 16;

/// Groups per flex group (`flex_bg_size` default 16, stored as log2).
const GROUPS_PER_FLEX_LOG: u32 = 4;
/// `EXT2_MAX_BLOCKS_PER_GROUP`: group descriptors count free blocks in 16 bits.
const BLOCKS_PER_GROUP_MAX: u32 = 65536 - 8;
/// Page size mke2fs rounds a whole-device size down to (x86-64 and most arm64 kernels).
const PAGE_SIZE_ASSUMED: u64 = 4096;
/// `EXT2_GOOD_OLD_FIRST_INO` and the reserved inodes mke2fs creates.
const FIRST_INO: u32 = 11;
const BAD_INO: u32 = 1;
const ROOT_INO: u32 = ext4::ROOT_INO;
const RESIZE_INO: u32 = 7;
const JOURNAL_INO: u32 = ext4::JOURNAL_INO;
/// `EXT2_NDIR_BLOCKS`, `EXT2_DIND_BLOCK`: the block-map slots of the resize inode.
const NDIR_BLOCKS: u64 = 12;
const DIND_SLOT: usize = 13;
/// lost+found is grown to at least this many bytes (and two blocks), within 12 blocks.
const LOST_FOUND_BYTES_MIN: u32 = 16 * 1024;
/// `s_default_mount_opts`: user_xattr (0x4) and acl (0x8), mke2fs.conf's default_mntopts.
const DEFAULT_MOUNT_OPTS: u32 = 0x0004 | 0x0008;
/// `s_flags` bits for the htree hash of `char` (signed on x86, unsigned on arm).
const FLAGS_SIGNED_HASH: u32 = 0x1;
const FLAGS_UNSIGNED_HASH: u32 = 0x2;
/// `s_def_hash_version`: half_md4.
const HASH_HALF_MD4: u8 = 1;
/// `EXT4_MMP_UPDATE_INTERVAL`: `s_mmp_update_interval` mke2fs sets (seconds).
const MMP_UPDATE_INTERVAL: u16 = 5;
/// `s_jnl_backup_type`: `s_jnl_blocks` holds a copy of the journal inode's `i_block`.
const JNL_BACKUP_BLOCKS: u8 = 1;
/// Extra inode fields mke2fs reserves (`sizeof(ext2_inode_large) - 128`).
const EXTRA_ISIZE: u16 = 32;
/// `EXT4_ORPHAN_BLOCK_MAGIC` and the size of an orphan block's tail.
const ORPHAN_BLOCK_MAGIC: u32 = 0x0B10_CA04;
const ORPHAN_TAIL_SIZE: usize = 8;
/// Writes are coalesced into runs of at most this many bytes, and zeroing uses a buffer of
/// this size: large enough to stream, small enough not to matter for memory.
const WRITE_BATCH_BYTES_MAX: usize = 8 << 20;
const ZERO_CHUNK_BYTES: usize = 1 << 20;
/// mke2fs zeroes the last 64 KiB (MD RAID superblock area) of a device it could not discard.
const END_WIPE_BYTES: u64 = 65536;
/// `BSD_DISKMAGIC` at byte 64 of sector 0: mke2fs leaves a BSD disklabel alone.
const BSD_DISKMAGIC: u32 = 0x8256_4557;

mod features;
mod geometry;
mod layout;
mod planner;
#[cfg(test)]
mod tests;
mod writer;

pub use features::Features;
pub use geometry::default_journal_blocks;

use geometry::*;
use layout::*;
use planner::*;
use writer::*;

/// How to format. `Default` is mkfs.ext4's defaults (with quill's 4 KiB block size).
#[derive(Debug, Clone)]
pub struct MkfsOptions {
    /// Block size in bytes, a power of two in 1024..=65536.
    pub block_size: u32,
    /// File-system size; `None` uses the whole device, rounded down to 4 KiB as mke2fs does.
    pub size_bytes: Option<u64>,
    /// Bytes per inode (`-i`); `None` picks mke2fs's ratio for the size: 8192 below 3 MiB
    /// ("floppy"), 4096 below 512 MiB ("small"), 16384 below 4 TiB, 32768 below 16 TiB ("big"),
    /// 65536 above ("huge"), and never less than the block size.
    pub inode_ratio: Option<u32>,
    /// Inode record size, a power of two in 128..=block size.
    pub inode_size: u16,
    /// Journal size in blocks; `None` is `ext2fs_default_journal_size` for the block count.
    pub journal_blocks: Option<u32>,
    /// With fast_commit: the fast-commit area's size in blocks (`-J fast_commit_size=`, in
    /// KiB there), added to the journal. `None` is a 64th of the journal, as mke2fs's
    /// `EXT2_JOURNAL_TO_FC_BLKS_RATIO`. Ignored without fast_commit, as mke2fs ignores it.
    pub fast_commit_blocks: Option<u32>,
    pub features: Features,
    /// With bigalloc: the cluster size in bytes (`-C`), a power of two from the block size
    /// up; `None` is 16 blocks, as mke2fs.conf's default. Refused without bigalloc.
    pub cluster_size: Option<u32>,
    /// Volume label, at most 16 bytes.
    pub label: String,
    /// File-system UUID; `None` generates a random (version 4) one.
    pub uuid: Option<[u8; 16]>,
    /// Directory hash seed; `None` generates a random one.
    pub hash_seed: Option<[u8; 16]>,
    /// Percentage of blocks reserved for root, 0..=50.
    pub reserved_percent: f64,
    /// Creation time in seconds since the epoch; `None` reads the clock. (Tests pin it to
    /// compare images with mke2fs run under `E2FSPROGS_FAKE_TIME`.)
    pub now: Option<u64>,
    /// The caller guarantees every block of the device reads as zeros (a new sparse file, or a
    /// file whose range was punched out, as mke2fs's discard does): inode tables and the journal
    /// are then not written and every group is marked ITABLE_ZEROED.
    pub device_zeroed: bool,
}

impl Default for MkfsOptions {
    fn default() -> Self {
        MkfsOptions {
            block_size: BLOCK_SIZE_DEFAULT,
            size_bytes: None,
            inode_ratio: None,
            inode_size: INODE_SIZE_DEFAULT,
            journal_blocks: None,
            fast_commit_blocks: None,
            features: Features::default(),
            cluster_size: None,
            label: String::new(),
            uuid: None,
            hash_seed: None,
            reserved_percent: RESERVED_PERCENT_DEFAULT,
            now: None,
            device_zeroed: false,
        }
    }
}

/// What [`mkfs`] made.
#[derive(Debug, Clone, PartialEq)]
pub struct MkfsReport {
    pub block_size: u32,
    /// Blocks per allocation cluster (bigalloc; 1 otherwise).
    pub cluster_blocks: u32,
    pub blocks_count: u64,
    pub inodes_count: u32,
    pub groups: u32,
    pub blocks_per_group: u32,
    pub inodes_per_group: u32,
    pub reserved_gdt_blocks: u32,
    pub reserved_blocks: u64,
    pub free_blocks: u64,
    pub free_inodes: u32,
    /// Journal size in blocks (0 without a journal), the fast-commit area included.
    pub journal_blocks: u32,
    /// Of which the fast-commit area (0 without fast_commit).
    pub fast_commit_blocks: u32,
    /// Blocks of the backup superblocks, in group order.
    pub backup_superblocks: Vec<u64>,
    pub uuid: [u8; 16],
    pub features: Features,
    /// Bytes written to the device (metadata and zeroing).
    pub bytes_written: u64,
}

/// Progress of the write phase, reported after each device write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MkfsProgress {
    pub bytes_done: u64,
    pub bytes_total: u64,
}

/// Formats `dev` as ext4. See the module documentation.
pub fn mkfs(dev: &dyn BlockDevice, opts: &MkfsOptions) -> Result<MkfsReport> {
    mkfs_with_progress(dev, opts, &mut |_| {})
}

/// [`mkfs`], calling `progress` as the writes proceed.
pub fn mkfs_with_progress(
    dev: &dyn BlockDevice,
    opts: &MkfsOptions,
    progress: &mut dyn FnMut(MkfsProgress),
) -> Result<MkfsReport> {
    let geometry = Geometry::plan(opts, dev.size_bytes())?;
    let mut planner = Planner::new(geometry);
    planner.allocate_tables();
    let files = planner.create_files()?;
    let image = ImageWriter::build(opts, &planner, &files)?;
    image.write(dev, progress)
}

fn invalid(reason: String) -> FsError {
    FsError::Invalid(reason)
}

fn too_small(blocks: u64, bs: u32) -> FsError {
    invalid(format!("{blocks} blocks of {bs} bytes are too small for an ext4 file system"))
}

/// A random (version 4, RFC 4122 variant) UUID from the kernel's generator; the clock and the
/// process id are mixed in only if /dev/urandom cannot be read.
fn random_uuid() -> [u8; 16] {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    if read.is_err() {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let mixed = nanos ^ (u128::from(std::process::id()) << 64);
        bytes = mixed.wrapping_mul(0x2545_F491_4F6C_DD1D_9E37_79B9_7F4A_7C15).to_le_bytes();
    }
    bytes[6] = (bytes[6] & 0x0F) | 0x40;
    bytes[8] = (bytes[8] & 0x3F) | 0x80;
    bytes
}

/// Parses a UUID written as 32 hex digits with optional dashes.
pub fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let hex: Vec<u8> = text.bytes().filter(|&c| c != b'-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

/// Formats a UUID the usual 8-4-4-4-12 way.
pub fn format_uuid(uuid: &[u8; 16]) -> String {
    let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}
