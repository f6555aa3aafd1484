//! Linear directory blocks (`struct ext4_dir_entry_2`) and the directory-leaf checksum tail
//! (`struct ext4_dir_entry_tail`), as `fs/ext4/namei.c` and e2fsprogs read and write them.
//!
//! A directory block is a chain of records that covers the block exactly:
//!
//! | offset | size       | field                                              |
//! |--------|------------|----------------------------------------------------|
//! | 0      | 4          | `inode` (0: the record is unused)                  |
//! | 4      | 2          | `rec_len`: bytes to the next record                |
//! | 6      | 1          | `name_len`                                         |
//! | 7      | 1          | `file_type` (`FT_*`; needs the filetype feature)   |
//! | 8      | `name_len` | name, not NUL-terminated, padded to 4 bytes        |
//!
//! A record needs [`dir_rec_len`]`(name_len)` bytes; whatever its `rec_len` holds beyond that is
//! slack where a new entry can go. With metadata_csum the last 12 bytes of a leaf are a fake
//! record (inode 0, rec_len 12, name_len 0, file_type 0xDE) whose last 4 bytes hold crc32c(inode
//! seed, everything before the tail); the chain then ends where the tail starts.
//!
//! Invariants kept by every function here:
//! - Bytes are untrusted. Before returning or changing anything, a function checks the whole
//!   chain the way `ext4_check_dir_entry` does: each `rec_len` is at least 12, a multiple of 4,
//!   large enough for its name and inside the block, and the chain ends exactly at the tail (or
//!   the end of the block). Violations are [`OnDiskError::Corrupted`], never a panic, and every
//!   walk terminates because each step advances by at least 12 bytes.
//! - A live record (inode != 0) has a non-empty name, as e2fsck requires.
//! - The mutators leave a valid chain: inserting carves the new record out of the first unused
//!   record or live record's slack that is large enough (first fit, like
//!   `ext4_find_dest_de`/`ext4_insert_dentry`), removing merges the record into its predecessor
//!   (or, for the first record of a block, marks it unused), like `ext4_generic_delete_entry`.
//!   Existing records never move, which is what keeps linear-directory readdir positions stable.
//! - Nothing here checks for duplicate names or looks at inode numbers beyond "zero or not": the
//!   `fs` layer looks a name up before inserting it and validates inode numbers when it uses
//!   them.

use super::bytes::{le16, le32, put_le16, put_le32};
use crate::crc::crc32c_raw;
use crate::OnDiskError;

/// Bytes of a record before its name: inode, rec_len, name_len, file_type.
pub const DIR_ENTRY_HEADER_SIZE: usize = 8;
/// Size of the metadata_csum tail at the end of every leaf block.
pub const DIR_TAIL_SIZE: usize = 12;
/// Longest name a record can hold (`name_len` is one byte).
pub const NAME_LEN_MAX: usize = 255;
/// Smallest valid record (`EXT4_DIR_REC_LEN(1)`).
pub const DIR_ENTRY_LEN_MIN: usize = 12;
/// Largest block whose record lengths this module encodes: with 64 KiB blocks a whole-block
/// record is stored as 65535 (`EXT4_MAX_REC_LEN`); larger blocks are not ext4 blocks quill reads.
pub const DIR_BLOCK_SIZE_MAX: usize = 1 << 16;

/// `file_type` values (`EXT4_FT_*`).
pub const FT_UNKNOWN: u8 = 0;
pub const FT_REG_FILE: u8 = 1;
pub const FT_DIR: u8 = 2;
pub const FT_CHRDEV: u8 = 3;
pub const FT_BLKDEV: u8 = 4;
pub const FT_FIFO: u8 = 5;
pub const FT_SOCK: u8 = 6;
pub const FT_SYMLINK: u8 = 7;
/// `det_reserved_ft` of the checksum tail (`EXT4_FT_DIR_CSUM`).
pub const FT_DIR_CSUM: u8 = 0xDE;

/// `rec_len` that stands for a whole 64 KiB block (`EXT4_MAX_REC_LEN`).
const REC_LEN_MAX_ON_DISK: u16 = 0xFFFF;

mod off {
    pub const INODE: usize = 0;
    pub const REC_LEN: usize = 4;
    pub const NAME_LEN: usize = 6;
    pub const FILE_TYPE: usize = 7;
    pub const NAME: usize = 8;
    /// Offsets inside the tail.
    pub const TAIL_CHECKSUM: usize = 8;
}

const _: () = assert!(off::NAME == DIR_ENTRY_HEADER_SIZE);
const _: () = assert!(off::TAIL_CHECKSUM + 4 == DIR_TAIL_SIZE);
const _: () = assert!(dir_rec_len(1) == DIR_ENTRY_LEN_MIN);
const _: () = assert!(dir_rec_len(NAME_LEN_MAX) == 264);

/// The `file_type` for an inode of mode `mode` (`fs_umode_to_ftype`).
pub fn file_type_from_mode(mode: u16) -> u8 {
    match mode & 0xF000 {
        0x8000 => FT_REG_FILE,
        0x4000 => FT_DIR,
        0x2000 => FT_CHRDEV,
        0x6000 => FT_BLKDEV,
        0x1000 => FT_FIFO,
        0xC000 => FT_SOCK,
        0xA000 => FT_SYMLINK,
        _ => FT_UNKNOWN,
    }
}

/// Bytes a record with a `name_len`-byte name needs: header plus name, rounded up to 4
/// (`EXT4_DIR_REC_LEN`).
pub const fn dir_rec_len(name_len: usize) -> usize {
    (DIR_ENTRY_HEADER_SIZE + name_len + 3) & !3
}

/// Decodes an on-disk `rec_len` (`ext4_rec_len_from_disk`, e2fsprogs `ext2fs_get_rec_len`):
/// below 64 KiB blocks the value is the length; with 64 KiB blocks 65535 and 0 mean the whole
/// block and the two low bits carry bits 16-17.
pub fn rec_len_from_disk(raw: u16, block_size: usize) -> usize {
    let len = usize::from(raw);
    if block_size < DIR_BLOCK_SIZE_MAX {
        len
    } else if raw == REC_LEN_MAX_ON_DISK || raw == 0 {
        block_size
    } else {
        (len & 0xFFFC) | ((len & 3) << 16)
    }
}

/// Encodes a record length for the disk (`ext4_rec_len_to_disk`). `len` must be a multiple of
/// 4 no larger than `block_size`, and `block_size` at most 64 KiB: callers compute lengths
/// inside blocks they validated, so anything else is a bug here.
pub fn rec_len_to_disk(len: usize, block_size: usize) -> u16 {
    assert!(
        len <= block_size && len.is_multiple_of(4),
        "rec_len {len} in a {block_size}-byte block"
    );
    assert!(block_size <= DIR_BLOCK_SIZE_MAX, "{block_size}-byte directory block");
    if len < DIR_BLOCK_SIZE_MAX {
        len as u16
    } else {
        REC_LEN_MAX_ON_DISK
    }
}

/// One record of a directory block, borrowed from the block's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirEntry<'a> {
    /// Byte offset of the record in its block.
    pub offset: usize,
    /// 0 for an unused record.
    pub inode: u32,
    /// Decoded record length: bytes from this record to the next.
    pub rec_len: usize,
    pub file_type: u8,
    pub name: &'a [u8],
}

impl DirEntry<'_> {
    pub fn is_live(&self) -> bool {
        self.inode != 0
    }

    /// Bytes a new record could take from this one: the whole record when it is unused, its
    /// slack beyond its own name when it is live (the test in `ext4_find_dest_de`).
    pub fn room(&self) -> usize {
        if self.is_live() {
            self.rec_len - dir_rec_len(self.name.len())
        } else {
            self.rec_len
        }
    }
}

/// Where the record chain of a `len`-byte block must end: before the tail when `has_tail`.
/// Checks the block size and, with `has_tail`, that the tail is well formed.
fn entries_end(block: &[u8], has_tail: bool) -> Result<usize, OnDiskError> {
    let len = block.len();
    let tail = if has_tail { DIR_TAIL_SIZE } else { 0 };
    if !len.is_multiple_of(4) || !(DIR_ENTRY_LEN_MIN + tail..=DIR_BLOCK_SIZE_MAX).contains(&len) {
        return Err(corrupted(format!("{len}-byte block")));
    }
    if has_tail && !dir_tail_ok(block) {
        return Err(corrupted("the checksum tail is missing or malformed".to_string()));
    }
    Ok(len - tail)
}

/// Every record of a directory block in chain order, unused ones included, after validating
/// the whole chain (see the module documentation).
pub fn parse_dir_block_records(
    block: &[u8],
    has_tail: bool,
) -> Result<Vec<DirEntry<'_>>, OnDiskError> {
    let end = entries_end(block, has_tail)?;
    let mut records = Vec::new();
    let mut offset = 0;
    while offset < end {
        // end - offset >= 12 is not yet known: check the header before reading it.
        if end - offset < DIR_ENTRY_HEADER_SIZE {
            return Err(corrupted(format!("record at {offset} runs past the end at {end}")));
        }
        let rec_len = rec_len_from_disk(le16(block, offset + off::REC_LEN), block.len());
        let name_len = usize::from(block[offset + off::NAME_LEN]);
        let inode = le32(block, offset + off::INODE);
        let reason = if rec_len < DIR_ENTRY_LEN_MIN {
            Some("rec_len is smaller than minimal")
        } else if !rec_len.is_multiple_of(4) {
            Some("rec_len is not a multiple of 4")
        } else if rec_len < dir_rec_len(name_len) {
            Some("rec_len is too small for name_len")
        } else if rec_len > end - offset {
            Some("record runs past the end of the block")
        } else if inode != 0 && name_len == 0 {
            Some("live record with an empty name")
        } else {
            None
        };
        if let Some(reason) = reason {
            return Err(corrupted(format!(
                "record at {offset} (rec_len {rec_len}, name_len {name_len}): {reason}"
            )));
        }
        records.push(DirEntry {
            offset,
            inode,
            rec_len,
            file_type: block[offset + off::FILE_TYPE],
            name: &block[offset + off::NAME..offset + off::NAME + name_len],
        });
        offset += rec_len;
    }
    Ok(records)
}

/// The live records (inode != 0) of a directory block, in chain order, after validating the
/// whole chain. `has_tail`: the block ends with the metadata_csum tail.
pub fn parse_dir_block(block: &[u8], has_tail: bool) -> Result<Vec<DirEntry<'_>>, OnDiskError> {
    let mut records = parse_dir_block_records(block, has_tail)?;
    records.retain(DirEntry::is_live);
    Ok(records)
}

/// The live record named `name`, if any.
pub fn find_dir_entry<'a>(
    block: &'a [u8],
    has_tail: bool,
    name: &[u8],
) -> Result<Option<DirEntry<'a>>, OnDiskError> {
    Ok(parse_dir_block(block, has_tail)?.into_iter().find(|e| e.name == name))
}

/// Makes `block` an empty leaf: one unused record covering everything before the tail.
pub fn init_empty_dir_block(block: &mut [u8], has_tail: bool) {
    let end = init_check_len(block, has_tail);
    block.fill(0);
    put_le16(block, off::REC_LEN, rec_len_to_disk(end, block.len()));
    if has_tail {
        init_dir_tail(block);
    }
}

/// Makes `block` the first block of a new directory: "." (`self_ino`, rec_len 12) and ".."
/// (`parent_ino`, the rest of the block), as mke2fs and `ext4_init_new_dir` lay it out.
pub fn init_first_dir_block(block: &mut [u8], has_tail: bool, self_ino: u32, parent_ino: u32) {
    let end = init_check_len(block, has_tail);
    assert!(self_ino != 0 && parent_ino != 0, "\".\" {self_ino} / \"..\" {parent_ino}");
    block.fill(0);
    let dot_len = dir_rec_len(1);
    write_record(block, 0, self_ino, dot_len, FT_DIR, b".");
    write_record(block, dot_len, parent_ino, end - dot_len, FT_DIR, b"..");
    if has_tail {
        init_dir_tail(block);
    }
}

fn init_check_len(block: &[u8], has_tail: bool) -> usize {
    let len = block.len();
    let tail = if has_tail { DIR_TAIL_SIZE } else { 0 };
    assert!(
        len.is_multiple_of(4) && (2 * DIR_ENTRY_LEN_MIN + tail..=DIR_BLOCK_SIZE_MAX).contains(&len),
        "{len}-byte directory block"
    );
    len - tail
}

/// Writes a record header and name at `offset`, zeroing the name's padding.
pub(crate) fn write_record(
    block: &mut [u8],
    offset: usize,
    ino: u32,
    rec_len: usize,
    ft: u8,
    name: &[u8],
) {
    let size = block.len();
    put_le32(block, offset + off::INODE, ino);
    put_le16(block, offset + off::REC_LEN, rec_len_to_disk(rec_len, size));
    block[offset + off::NAME_LEN] = name.len() as u8;
    block[offset + off::FILE_TYPE] = ft;
    let name_at = offset + off::NAME;
    block[name_at..name_at + name.len()].copy_from_slice(name);
    block[name_at + name.len()..offset + dir_rec_len(name.len())].fill(0);
}

/// Adds the record `name` → `ino` in the first unused record or live record's slack that can
/// hold it. Returns false, changing nothing, when no such room exists. The caller has made sure
/// `name` is not present (see the module documentation).
pub fn insert_dir_entry(
    block: &mut [u8],
    has_tail: bool,
    name: &[u8],
    ino: u32,
    file_type: u8,
) -> Result<bool, OnDiskError> {
    assert!((1..=NAME_LEN_MAX).contains(&name.len()), "name of {} bytes", name.len());
    assert!(ino != 0, "directory entry for inode 0");
    let needed = dir_rec_len(name.len());
    let Some(target) = parse_dir_block_records(block, has_tail)?
        .into_iter()
        .find(|r| r.room() >= needed)
        .map(|r| (r.offset, r.rec_len, r.is_live().then(|| dir_rec_len(r.name.len()))))
    else {
        return Ok(false);
    };
    match target {
        (offset, rec_len, Some(own_len)) => {
            put_le16(block, offset + off::REC_LEN, rec_len_to_disk(own_len, block.len()));
            write_record(block, offset + own_len, ino, rec_len - own_len, file_type, name);
        }
        (offset, rec_len, None) => write_record(block, offset, ino, rec_len, file_type, name),
    }
    Ok(true)
}

/// Rebuilds `block` as a leaf holding `entries` (name, inode, file type) packed from offset 0 in
/// the given order, the last record taking the rest of the block: what `dx_move_dirents` and
/// `dx_pack_dirents` leave when a leaf is split. Returns false, leaving an empty leaf, when the
/// entries do not fit.
pub fn pack_dir_block(block: &mut [u8], has_tail: bool, entries: &[(&[u8], u32, u8)]) -> bool {
    let end = init_check_len(block, has_tail);
    init_empty_dir_block(block, has_tail);
    let needed: usize = entries.iter().map(|(name, _, _)| dir_rec_len(name.len())).sum();
    if needed > end {
        return false;
    }
    let mut offset = 0;
    for (i, &(name, ino, file_type)) in entries.iter().enumerate() {
        assert!((1..=NAME_LEN_MAX).contains(&name.len()) && ino != 0, "entry {i}: inode {ino}");
        let rec_len = if i + 1 == entries.len() { end - offset } else { dir_rec_len(name.len()) };
        write_record(block, offset, ino, rec_len, file_type, name);
        offset += rec_len;
    }
    true
}

/// Removes the live record `name` and returns its inode, or None when absent. The record's
/// space goes to the previous record; the first record of a block becomes unused instead. The
/// freed bytes are zeroed, as current kernels do.
pub fn remove_dir_entry(
    block: &mut [u8],
    has_tail: bool,
    name: &[u8],
) -> Result<Option<u32>, OnDiskError> {
    let records = parse_dir_block_records(block, has_tail)?;
    let Some(at) = records.iter().position(|r| r.is_live() && r.name == name) else {
        return Ok(None);
    };
    let (offset, rec_len, ino) = (records[at].offset, records[at].rec_len, records[at].inode);
    let previous = at.checked_sub(1).map(|p| (records[p].offset, records[p].rec_len));
    match previous {
        Some((prev_offset, prev_len)) => {
            let merged = rec_len_to_disk(prev_len + rec_len, block.len());
            put_le16(block, prev_offset + off::REC_LEN, merged);
            block[offset..offset + rec_len].fill(0);
        }
        None => {
            put_le32(block, offset + off::INODE, 0);
            block[offset + off::NAME_LEN..offset + rec_len].fill(0);
        }
    }
    Ok(Some(ino))
}

/// Points the live record `name` at `ino` (with `file_type`) and returns the inode it pointed
/// at, or None when absent.
pub fn replace_dir_entry(
    block: &mut [u8],
    has_tail: bool,
    name: &[u8],
    ino: u32,
    file_type: u8,
) -> Result<Option<u32>, OnDiskError> {
    assert!(ino != 0, "directory entry for inode 0");
    let Some(offset) = find_dir_entry(block, has_tail, name)?.map(|e| e.offset) else {
        return Ok(None);
    };
    let old = le32(block, offset + off::INODE);
    put_le32(block, offset + off::INODE, ino);
    block[offset + off::FILE_TYPE] = file_type;
    Ok(Some(old))
}

/// The "." and ".." records that open the first block of every directory, linear or indexed
/// (in a dx_root they are the fake entries in front of the index). Only these two records are
/// checked, so this reads both layouts: "." at offset 0, ".." right after it, both live and
/// named so, both inside the block.
pub fn parse_dots(block: &[u8]) -> Result<(DirEntry<'_>, DirEntry<'_>), OnDiskError> {
    let dot = dot_record(block, 0, b".")?;
    let dotdot = dot_record(block, dot.rec_len, b"..")?;
    Ok((dot, dotdot))
}

fn dot_record<'a>(
    block: &'a [u8],
    offset: usize,
    want: &[u8],
) -> Result<DirEntry<'a>, OnDiskError> {
    let size = block.len();
    if size > DIR_BLOCK_SIZE_MAX || offset + DIR_ENTRY_LEN_MIN > size {
        return Err(corrupted(format!("no room for {:?} at {offset}", ascii(want))));
    }
    let rec_len = rec_len_from_disk(le16(block, offset + off::REC_LEN), size);
    let name_len = usize::from(block[offset + off::NAME_LEN]);
    let inode = le32(block, offset + off::INODE);
    let name_end = offset + off::NAME + name_len;
    if rec_len < DIR_ENTRY_LEN_MIN
        || !rec_len.is_multiple_of(4)
        || rec_len > size - offset
        || name_end > size
        || &block[offset + off::NAME..name_end] != want
        || inode == 0
    {
        return Err(corrupted(format!(
            "expected {:?} at {offset}, found inode {inode}, rec_len {rec_len}, name_len \
             {name_len}",
            ascii(want)
        )));
    }
    Ok(DirEntry {
        offset,
        inode,
        rec_len,
        file_type: block[offset + off::FILE_TYPE],
        name: &block[offset + off::NAME..name_end],
    })
}

/// Points ".." (see [`parse_dots`]) at `parent_ino` and returns the inode it pointed at.
pub fn set_dotdot(block: &mut [u8], parent_ino: u32) -> Result<u32, OnDiskError> {
    assert!(parent_ino != 0, "\"..\" pointing at inode 0");
    let (_, dotdot) = parse_dots(block)?;
    let (offset, old) = (dotdot.offset, dotdot.inode);
    put_le32(block, offset + off::INODE, parent_ino);
    Ok(old)
}

/// Whether the last 12 bytes of `block` are a well-formed checksum tail
/// (`get_dirent_tail`: inode 0, rec_len 12, name_len 0, file_type 0xDE).
pub fn dir_tail_ok(block: &[u8]) -> bool {
    let len = block.len();
    if !(DIR_ENTRY_LEN_MIN + DIR_TAIL_SIZE..=DIR_BLOCK_SIZE_MAX).contains(&len) {
        return false;
    }
    let tail = &block[len - DIR_TAIL_SIZE..];
    le32(tail, off::INODE) == 0
        && rec_len_from_disk(le16(tail, off::REC_LEN), len) == DIR_TAIL_SIZE
        && tail[off::NAME_LEN] == 0
        && tail[off::FILE_TYPE] == FT_DIR_CSUM
}

/// Writes an empty checksum tail (checksum 0) into the last 12 bytes of `block`.
pub fn init_dir_tail(block: &mut [u8]) {
    let len = block.len();
    assert!(len >= DIR_ENTRY_LEN_MIN + DIR_TAIL_SIZE, "{len}-byte directory block");
    let tail = &mut block[len - DIR_TAIL_SIZE..];
    tail.fill(0);
    put_le16(tail, off::REC_LEN, DIR_TAIL_SIZE as u16);
    tail[off::FILE_TYPE] = FT_DIR_CSUM;
}

/// The leaf checksum of `block` (`ext4_dirblock_csum`): crc32c seeded with the directory
/// inode's checksum seed ([`inode_csum_seed`](super::inode_csum_seed)) over everything before
/// the tail.
pub fn dir_block_csum(inode_csum_seed: u32, block: &[u8]) -> u32 {
    crc32c_raw(inode_csum_seed, &block[..block.len().saturating_sub(DIR_TAIL_SIZE)])
}

/// Stores the leaf checksum in the tail of `block`, which must already have one (blocks this
/// crate builds always do; blocks from disk were checked by [`parse_dir_block`]).
pub fn set_dir_block_checksum(inode_csum_seed: u32, block: &mut [u8]) {
    assert!(dir_tail_ok(block), "directory block without a checksum tail");
    let checksum = dir_block_csum(inode_csum_seed, block);
    let at = block.len() - DIR_TAIL_SIZE + off::TAIL_CHECKSUM;
    put_le32(block, at, checksum);
}

/// Whether `block` has a well-formed tail holding the right checksum
/// (`ext4_dirblock_csum_verify`).
pub fn dir_block_checksum_ok(inode_csum_seed: u32, block: &[u8]) -> bool {
    dir_tail_ok(block)
        && le32(block, block.len() - DIR_TAIL_SIZE + off::TAIL_CHECKSUM)
            == dir_block_csum(inode_csum_seed, block)
}

fn corrupted(reason: String) -> OnDiskError {
    OnDiskError::corrupted("directory block", reason)
}

fn ascii(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A 1 KiB leaf holding `names` (inode 100 + index) after "." and "..".
    pub(crate) fn sample_block(has_tail: bool, names: &[&[u8]]) -> Vec<u8> {
        let mut block = vec![0u8; 1024];
        init_first_dir_block(&mut block, has_tail, 12, 2);
        for (i, name) in names.iter().enumerate() {
            assert!(
                insert_dir_entry(&mut block, has_tail, name, 100 + i as u32, FT_REG_FILE).unwrap()
            );
        }
        block
    }

    fn live_names(block: &[u8], has_tail: bool) -> Vec<Vec<u8>> {
        parse_dir_block(block, has_tail).unwrap().iter().map(|e| e.name.to_vec()).collect()
    }

    #[test]
    fn rec_len_of_a_whole_64k_block_round_trips_through_65535() {
        assert_eq!(rec_len_to_disk(65536, 65536), 0xFFFF);
        assert_eq!(rec_len_from_disk(0xFFFF, 65536), 65536);
        assert_eq!(rec_len_from_disk(0, 65536), 65536);
        assert_eq!(rec_len_to_disk(65524, 65536), 65524);
        assert_eq!(rec_len_from_disk(65524, 65536), 65524);
        // Below 64 KiB the raw value is the length, 0 included (and then rejected).
        assert_eq!(rec_len_from_disk(0, 4096), 0);
        assert_eq!(rec_len_to_disk(4096, 4096), 4096);
    }

    #[test]
    fn record_lengths_round_names_up_to_four_bytes() {
        assert_eq!(dir_rec_len(1), 12);
        assert_eq!(dir_rec_len(4), 12);
        assert_eq!(dir_rec_len(5), 16);
        assert_eq!(dir_rec_len(255), 264);
        assert_eq!(file_type_from_mode(0o100644), FT_REG_FILE);
        assert_eq!(file_type_from_mode(0o040755), FT_DIR);
        assert_eq!(file_type_from_mode(0o120777), FT_SYMLINK);
        assert_eq!(file_type_from_mode(0o020600), FT_CHRDEV);
        assert_eq!(file_type_from_mode(0o060600), FT_BLKDEV);
        assert_eq!(file_type_from_mode(0o010600), FT_FIFO);
        assert_eq!(file_type_from_mode(0o140600), FT_SOCK);
        assert_eq!(file_type_from_mode(0), FT_UNKNOWN);
    }

    #[test]
    fn first_block_holds_dot_and_dotdot_with_dotdot_taking_the_rest() {
        for has_tail in [false, true] {
            let mut block = vec![0u8; 4096];
            init_first_dir_block(&mut block, has_tail, 12, 2);
            let records = parse_dir_block_records(&block, has_tail).unwrap();
            assert_eq!(records.len(), 2);
            assert_eq!(
                (records[0].name, records[0].inode, records[0].rec_len),
                (&b"."[..], 12, 12)
            );
            let rest = if has_tail { 4096 - 12 - 12 } else { 4096 - 12 };
            assert_eq!(
                (records[1].name, records[1].inode, records[1].rec_len),
                (&b".."[..], 2, rest)
            );
            assert_eq!(records[1].file_type, FT_DIR);
            let (dot, dotdot) = parse_dots(&block).unwrap();
            assert_eq!((dot.inode, dotdot.inode), (12, 2));
        }
    }

    #[test]
    fn insert_uses_the_first_slack_large_enough_and_remove_merges_into_the_previous_record() {
        let mut block = sample_block(true, &[b"alpha", b"beta", b"gamma"]);
        assert_eq!(live_names(&block, true), [&b"."[..], b"..", b"alpha", b"beta", b"gamma"]);
        // Removing "beta" gives its space to "alpha"; a new short name goes right after "alpha".
        assert_eq!(remove_dir_entry(&mut block, true, b"beta").unwrap(), Some(101));
        let alpha = find_dir_entry(&block, true, b"alpha").unwrap().unwrap();
        assert_eq!(alpha.rec_len, dir_rec_len(5) + dir_rec_len(4));
        let alpha_offset = alpha.offset;
        assert!(insert_dir_entry(&mut block, true, b"b", 7, FT_DIR).unwrap());
        let b = find_dir_entry(&block, true, b"b").unwrap().unwrap();
        assert_eq!(b.offset, alpha_offset + dir_rec_len(5));
        assert_eq!((b.inode, b.file_type), (7, FT_DIR));
        assert_eq!(live_names(&block, true), [&b"."[..], b"..", b"alpha", b"b", b"gamma"]);
        assert_eq!(remove_dir_entry(&mut block, true, b"missing").unwrap(), None);
    }

    #[test]
    fn removing_the_first_record_of_a_block_marks_it_unused_and_it_is_reused() {
        let mut block = vec![0u8; 1024];
        init_empty_dir_block(&mut block, false);
        assert!(insert_dir_entry(&mut block, false, b"first", 5, FT_REG_FILE).unwrap());
        assert!(insert_dir_entry(&mut block, false, b"second", 6, FT_REG_FILE).unwrap());
        assert_eq!(remove_dir_entry(&mut block, false, b"first").unwrap(), Some(5));
        let records = parse_dir_block_records(&block, false).unwrap();
        assert_eq!((records[0].inode, records[0].rec_len, records[0].name), (0, 16, &b""[..]));
        // A name that fits the unused 16-byte record goes there; a longer one does not.
        assert!(insert_dir_entry(&mut block, false, b"longer-name", 8, FT_REG_FILE).unwrap());
        assert_ne!(find_dir_entry(&block, false, b"longer-name").unwrap().unwrap().offset, 0);
        assert!(insert_dir_entry(&mut block, false, b"tiny", 9, FT_REG_FILE).unwrap());
        assert_eq!(find_dir_entry(&block, false, b"tiny").unwrap().unwrap().offset, 0);
    }

    #[test]
    fn insert_reports_a_full_block_without_changing_it() {
        let mut block = vec![0u8; 1024];
        init_empty_dir_block(&mut block, true);
        let name = [b'x'; 255];
        let mut n = 0u32;
        while insert_dir_entry(&mut block, true, &name[..250 + n as usize % 5], 10 + n, 1).unwrap()
        {
            n += 1;
        }
        assert_eq!(n, 3, "three 264-byte records fit in 1012 bytes");
        let before = block.clone();
        assert!(!insert_dir_entry(&mut block, true, &name, 99, 1).unwrap());
        assert_eq!(block, before);
    }

    #[test]
    fn packing_places_records_back_to_back_and_gives_the_last_one_the_rest() {
        let mut block = vec![0xAAu8; 1024];
        let entries: [(&[u8], u32, u8); 3] = [(b"c", 3, 1), (b"a-long-name", 4, 2), (b"b", 5, 1)];
        assert!(pack_dir_block(&mut block, true, &entries));
        let records = parse_dir_block_records(&block, true).unwrap();
        let layout: Vec<_> = records.iter().map(|r| (r.offset, r.rec_len, r.name)).collect();
        assert_eq!(layout, [(0, 12, &b"c"[..]), (12, 20, b"a-long-name"), (32, 1012 - 32, b"b")]);
        assert!(pack_dir_block(&mut block, false, &[]));
        assert!(parse_dir_block(&block, false).unwrap().is_empty());
        let big = [b'n'; 255];
        assert!(!pack_dir_block(&mut block, true, &[(&big[..], 1, 1); 4]));
        assert!(parse_dir_block(&block, true).unwrap().is_empty());
    }

    #[test]
    fn replace_and_set_dotdot_return_the_previous_inode() {
        let mut block = sample_block(false, &[b"file"]);
        assert_eq!(
            replace_dir_entry(&mut block, false, b"file", 77, FT_SYMLINK).unwrap(),
            Some(100)
        );
        let file = find_dir_entry(&block, false, b"file").unwrap().unwrap();
        assert_eq!((file.inode, file.file_type), (77, FT_SYMLINK));
        assert_eq!(replace_dir_entry(&mut block, false, b"nope", 1, 1).unwrap(), None);
        assert_eq!(set_dotdot(&mut block, 40).unwrap(), 2);
        assert_eq!(parse_dots(&block).unwrap().1.inode, 40);
    }

    #[test]
    fn malformed_record_chains_are_rejected() {
        type Edit = fn(&mut [u8]);
        let cases: [(&str, Edit); 7] = [
            ("rec_len below 12", |b| put_le16(b, 16, 8)),
            ("rec_len not a multiple of 4", |b| put_le16(b, 16, 30)),
            ("rec_len too small for the name", |b| b[6] = 9),
            ("record past the end", |b| put_le16(b, 16, 2000)),
            ("chain ending short of the tail", |b| put_le16(b, 16, 1024 - 12 - 12 - 4)),
            ("live record with an empty name", |b| b[12 + 6] = 0),
            ("malformed tail", |b| b[1024 - 12 + 7] = 0),
        ];
        for (name, edit) in cases {
            let mut block = vec![0u8; 1024];
            init_first_dir_block(&mut block, true, 12, 2);
            parse_dir_block(&block, true).unwrap();
            edit(&mut block);
            let err = parse_dir_block(&block, true).expect_err(name);
            assert!(matches!(err, OnDiskError::Corrupted { .. }), "{name}: {err}");
            assert!(insert_dir_entry(&mut block, true, b"n", 3, 1).is_err(), "{name}");
            assert!(remove_dir_entry(&mut block, true, b"..").is_err(), "{name}");
        }
        assert!(parse_dir_block(&[0u8; 10], false).is_err());
        assert!(parse_dir_block(&[], true).is_err());
    }

    #[test]
    fn leaf_checksum_covers_everything_before_the_tail() {
        let mut block = sample_block(true, &[b"a", b"b"]);
        assert!(!dir_block_checksum_ok(7, &block));
        set_dir_block_checksum(7, &mut block);
        assert!(dir_block_checksum_ok(7, &block));
        assert!(!dir_block_checksum_ok(8, &block));
        assert_eq!(le32(&block, 1020), crc32c_raw(7, &block[..1012]));
        let mut changed = block.clone();
        changed[500] ^= 1; // slack bytes are covered too
        assert!(!dir_block_checksum_ok(7, &changed));
        // Without a tail there is nothing to verify.
        assert!(!dir_block_checksum_ok(7, &sample_block(false, &[b"a"])));
    }

    #[test]
    fn random_and_mutated_blocks_never_panic_the_block_functions() {
        let mut rng = crate::testing::Rng::from_env("dir block");
        let valid = sample_block(true, &[b"one", b"two", b"three", &[b'z'; 200]]);
        for round in 0..6000 {
            let mut block = if round % 2 == 0 {
                let mut b = valid.clone();
                for _ in 0..=rng.below(4) {
                    let at = rng.below(b.len() as u64) as usize;
                    b[at] = rng.next() as u8;
                }
                b
            } else {
                let len = [1024usize, 1000, 36, 8, 4096][rng.below(5) as usize];
                (0..len).map(|_| rng.next() as u8).collect()
            };
            let has_tail = rng.below(2) == 0;
            let _ = parse_dir_block(&block, has_tail);
            let _ = parse_dots(&block);
            let _ = dir_block_checksum_ok(1, &block);
            if let Ok(true) = insert_dir_entry(&mut block, has_tail, b"new", 5, 1) {
                assert!(find_dir_entry(&block, has_tail, b"new").unwrap().is_some());
            }
            if let Ok(Some(_)) = remove_dir_entry(&mut block, has_tail, b"one") {
                parse_dir_block(&block, has_tail).unwrap();
            }
            let _ = replace_dir_entry(&mut block, has_tail, b"two", 9, 1);
            let _ = set_dotdot(&mut block, 3);
        }
    }
}
