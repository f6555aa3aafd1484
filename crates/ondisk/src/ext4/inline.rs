//! Inline data (INCOMPAT_INLINE_DATA): a small file's bytes, or a small directory's entries,
//! kept in the inode itself instead of in blocks (`fs/ext4/inline.c`,
//! `Documentation/filesystems/ext4/inlinedata.rst`).
//!
//! An inode with [`INLINE_DATA_FL`](super::INLINE_DATA_FL) keeps its first 60 bytes in
//! `i_block` and the rest in the value of the in-inode extended attribute `system.data`
//! ([`XATTR_INDEX_SYSTEM`], name `data`), which exists, empty if need be, for as long as the
//! flag is set. It maps no blocks.
//!
//! | inode       | `i_block` (60 bytes)                      | `system.data` value               |
//! |-------------|-------------------------------------------|-----------------------------------|
//! | file, link  | bytes 0..60 of the contents               | bytes 60..i_size                  |
//! | directory   | le32 parent inode, then 56 bytes of dirents| more dirents, a chain of its own  |
//!
//! A directory has no "." or ".." records: ".." is the parent number, "." is implicit. Each
//! of its two regions is a record chain that covers the region exactly (no checksum tail);
//! `i_size` is 60 plus the value's length. When a directory leaves the inode, the kernel lays
//! its first block out as [`dir_block_image`] does: "." and ".." of 12 bytes each, the two
//! regions' records copied after them, the last record stretched to the end
//! (`ext4_finish_convert_inline_dir`).
//!
//! Everything here is pure and takes untrusted bytes: a parser returns
//! [`OnDiskError::Corrupted`] and never panics.

use super::dir::{
    self as dirent, dir_rec_len, parse_dir_block_records, write_record, DIR_ENTRY_LEN_MIN,
    DIR_TAIL_SIZE, FT_DIR,
};
use super::inode::INODE_BLOCK_SIZE;
use super::xattr::{XattrEntry, XATTR_INDEX_SYSTEM};
use crate::ext4::bytes::{le32, put_le32};
use crate::OnDiskError;

/// The name index of the attribute holding inline data past `i_block`.
pub const INLINE_XATTR_INDEX: u8 = XATTR_INDEX_SYSTEM;
/// Its name (after the index's prefix): `system.data`.
pub const INLINE_XATTR_NAME: &[u8] = b"data";
/// Bytes of an inline directory's `i_block` that hold the parent's inode number.
pub const INLINE_DOTDOT_SIZE: usize = 4;
/// Bytes of `i_block` holding directory records after the parent number.
pub const INLINE_DIR_REGION: usize = INODE_BLOCK_SIZE - INLINE_DOTDOT_SIZE;

/// Whether `entry` is the inline-data attribute.
pub fn is_inline_xattr(entry: &XattrEntry) -> bool {
    entry.name_index == INLINE_XATTR_INDEX && entry.name == INLINE_XATTR_NAME
}

/// The value of `system.data` among the in-inode attributes, if present.
pub fn inline_value(entries: &[XattrEntry]) -> Option<&[u8]> {
    entries.iter().find(|e| is_inline_xattr(e)).map(|e| e.value.as_slice())
}

/// The `size` bytes of an inline file or symlink: `i_block`, then the attribute's value.
/// A size past what the two hold is corruption (the kernel's `ext4_read_inline_data` would
/// read past the value).
pub fn file_bytes(
    i_block: &[u8; INODE_BLOCK_SIZE],
    value: &[u8],
    size: u64,
) -> Result<Vec<u8>, OnDiskError> {
    let capacity = INODE_BLOCK_SIZE + value.len();
    if size > capacity as u64 {
        return Err(corrupted(format!(
            "i_size {size} is past the {capacity} bytes of inline data (60 in the inode, \
             {} in system.data)",
            value.len()
        )));
    }
    let size = size as usize;
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&i_block[..size.min(INODE_BLOCK_SIZE)]);
    if size > INODE_BLOCK_SIZE {
        out.extend_from_slice(&value[..size - INODE_BLOCK_SIZE]);
    }
    Ok(out)
}

/// Splits `bytes` (at most 60 + whatever the attribute will hold) into `i_block` and the
/// attribute's value, as [`file_bytes`] reads them.
pub fn split_file_bytes(bytes: &[u8]) -> ([u8; INODE_BLOCK_SIZE], Vec<u8>) {
    let mut i_block = [0u8; INODE_BLOCK_SIZE];
    let head = bytes.len().min(INODE_BLOCK_SIZE);
    i_block[..head].copy_from_slice(&bytes[..head]);
    (i_block, bytes[head..].to_vec())
}

/// One live record of an inline directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InlineEntry {
    pub name: Vec<u8>,
    pub inode: u32,
    pub file_type: u8,
}

/// An inline directory as read: its parent and its live records in chain order (the
/// `i_block` region's, then the attribute's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InlineDir {
    pub parent: u32,
    pub entries: Vec<InlineEntry>,
}

/// Decodes an inline directory from its `i_block` and `system.data` value, checking both
/// record chains as a directory block's (every record inside its region, lengths that add up,
/// no live record without a name) and that the parent is a real inode number.
pub fn parse_dir(i_block: &[u8; INODE_BLOCK_SIZE], value: &[u8]) -> Result<InlineDir, OnDiskError> {
    let parent = le32(i_block, 0);
    if parent == 0 {
        return Err(corrupted("inline directory whose parent is inode 0".to_string()));
    }
    let mut entries = Vec::new();
    for region in regions(i_block, value) {
        let records = parse_dir_block_records(region, false).map_err(inline_region)?;
        for record in records.into_iter().filter(|r| r.is_live()) {
            entries.push(InlineEntry {
                name: record.name.to_vec(),
                inode: record.inode,
                file_type: record.file_type,
            });
        }
    }
    Ok(InlineDir { parent, entries })
}

/// The directory's two record regions; the attribute's only when it has a value.
fn regions<'a>(i_block: &'a [u8; INODE_BLOCK_SIZE], value: &'a [u8]) -> Vec<&'a [u8]> {
    let mut out = vec![&i_block[INLINE_DOTDOT_SIZE..]];
    if !value.is_empty() {
        out.push(value);
    }
    out
}

/// The first block of the directory once it leaves the inode, as the kernel builds it
/// (module docs): "." (`self_ino`) and ".." (the parent), each 12 bytes, then both regions'
/// records as they lie, the last record reaching the end of the block (or its checksum tail
/// when `has_tail`; the checksum itself is the caller's to set). The regions must have
/// passed [`parse_dir`], and the block must hold them.
pub fn dir_block_image(
    i_block: &[u8; INODE_BLOCK_SIZE],
    value: &[u8],
    self_ino: u32,
    block_size: usize,
    has_tail: bool,
) -> Result<Vec<u8>, OnDiskError> {
    let dir = parse_dir(i_block, value)?;
    let dots = 2 * dir_rec_len(2);
    let end = block_size - if has_tail { DIR_TAIL_SIZE } else { 0 };
    let records_len = INLINE_DIR_REGION + value.len();
    if dots + records_len > end {
        return Err(corrupted(format!(
            "{records_len} bytes of inline records do not fit a {block_size}-byte block"
        )));
    }
    let mut block = vec![0u8; block_size];
    write_record(&mut block, 0, self_ino, dir_rec_len(1), FT_DIR, b".");
    write_record(&mut block, dir_rec_len(1), dir.parent, dir_rec_len(2), FT_DIR, b"..");
    block[dots..dots + INLINE_DIR_REGION].copy_from_slice(&i_block[INLINE_DOTDOT_SIZE..]);
    block[dots + INLINE_DIR_REGION..dots + records_len].copy_from_slice(value);
    // Stretch the last record of the chain (which ends at dots + records_len) to `end`.
    let chain =
        parse_dir_block_records(&block[..dots + records_len], false).map_err(inline_region)?;
    let last = chain.last().expect("\".\" and \"..\" at least");
    let stretched = last.rec_len + end - (dots + records_len);
    let at = last.offset;
    block[at + 4..at + 6]
        .copy_from_slice(&dirent::rec_len_to_disk(stretched, block_size).to_le_bytes());
    if has_tail {
        dirent::init_dir_tail(&mut block);
    }
    Ok(block)
}

/// Encodes a directory into `i_block` and a `system.data` value: `entries` packed in order,
/// into the `i_block` region first and then the value, each region's last record stretched
/// to its end. The value is at least `value_len_min` bytes (the kernel never shrinks it while
/// the directory stays inline) and grows by what the entries need, in multiples of 4. `None`
/// when the value would pass `value_len_max` bytes.
pub fn encode_dir(
    parent: u32,
    entries: &[InlineEntry],
    value_len_min: usize,
    value_len_max: usize,
) -> Option<([u8; INODE_BLOCK_SIZE], Vec<u8>)> {
    assert!(parent != 0, "inline directory with parent 0");
    let mut i_block = [0u8; INODE_BLOCK_SIZE];
    put_le32(&mut i_block, 0, parent);
    // The i_block region takes entries while they fit, the value the rest.
    let mut first = 0;
    let mut used = 0;
    while first < entries.len()
        && used + dir_rec_len(entries[first].name.len()) <= INLINE_DIR_REGION
    {
        used += dir_rec_len(entries[first].name.len());
        first += 1;
    }
    let rest = &entries[first..];
    let rest_len: usize = rest.iter().map(|e| dir_rec_len(e.name.len())).sum();
    let value_len = value_len_min.max(rest_len);
    if value_len > value_len_max {
        return None;
    }
    // A value shorter than one record cannot hold a chain; 0 means no records at all.
    let value_len = if value_len == 0 { 0 } else { value_len.max(DIR_ENTRY_LEN_MIN) };
    let value_len = value_len.next_multiple_of(4);
    if value_len > value_len_max {
        return None;
    }
    pack_region(&mut i_block[INLINE_DOTDOT_SIZE..], &entries[..first]);
    let mut value = vec![0u8; value_len];
    if value_len > 0 {
        pack_region(&mut value, rest);
    }
    Some((i_block, value))
}

/// Packs `entries` into `region` from its start, the last stretched to its end; an empty
/// list leaves one unused record over the whole region.
fn pack_region(region: &mut [u8], entries: &[InlineEntry]) {
    let len = region.len();
    region.fill(0);
    if entries.is_empty() {
        write_record(region, 0, 0, len, 0, b"");
        return;
    }
    let mut offset = 0;
    for (i, e) in entries.iter().enumerate() {
        let rec_len = if i + 1 == entries.len() { len - offset } else { dir_rec_len(e.name.len()) };
        write_record(region, offset, e.inode, rec_len, e.file_type, &e.name);
        offset += rec_len;
    }
}

fn inline_region(err: OnDiskError) -> OnDiskError {
    corrupted(format!("inline directory records: {err}"))
}

fn corrupted(reason: String) -> OnDiskError {
    OnDiskError::corrupted("inline data", reason)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ext4::dir::{parse_dir_block, parse_dots};

    fn entry(name: &str, inode: u32) -> InlineEntry {
        InlineEntry { name: name.as_bytes().to_vec(), inode, file_type: 1 }
    }

    #[test]
    fn file_bytes_join_i_block_and_the_value() {
        let bytes: Vec<u8> = (0..100u8).collect();
        let (i_block, value) = split_file_bytes(&bytes);
        assert_eq!(value.len(), 40);
        assert_eq!(file_bytes(&i_block, &value, 100).unwrap(), bytes);
        assert_eq!(file_bytes(&i_block, &value, 7).unwrap(), &bytes[..7]);
        assert!(file_bytes(&i_block, &value, 101).is_err());
        assert!(file_bytes(&i_block, &[], u64::MAX).is_err());
    }

    #[test]
    fn a_directory_round_trips_through_both_regions() {
        let entries: Vec<InlineEntry> =
            (0..9).map(|i| entry(&format!("name-{i}"), 20 + i)).collect();
        // Nine 16-byte records: three fit the 56-byte region, six go to the value.
        let (i_block, value) = encode_dir(2, &entries, 0, 400).unwrap();
        assert_eq!(value.len(), 6 * 16);
        let dir = parse_dir(&i_block, &value).unwrap();
        assert_eq!(dir, InlineDir { parent: 2, entries: entries.clone() });
        // Too little room for the value: None.
        assert!(encode_dir(2, &entries, 0, 80).is_none());
        // An empty directory: one unused record over the region, no value.
        let (i_block, value) = encode_dir(11, &[], 0, 0).unwrap();
        assert!(value.is_empty());
        assert_eq!(parse_dir(&i_block, &value).unwrap().entries, vec![]);
        // The value never shrinks below what it was.
        let (_, value) = encode_dir(11, &[], 60, 400).unwrap();
        assert_eq!(value.len(), 60);
        assert_eq!(parse_dir(&i_block, &value).unwrap().entries, vec![]);
    }

    #[test]
    fn the_block_image_is_the_kernels_conversion() {
        let entries: Vec<InlineEntry> = (0..5).map(|i| entry(&format!("f{i}"), 30 + i)).collect();
        let (i_block, value) = encode_dir(2, &entries, 0, 400).unwrap();
        for has_tail in [false, true] {
            let block = dir_block_image(&i_block, &value, 12, 1024, has_tail).unwrap();
            let (dot, dotdot) = parse_dots(&block).unwrap();
            assert_eq!((dot.inode, dot.rec_len, dotdot.inode, dotdot.rec_len), (12, 12, 2, 12));
            let live = parse_dir_block(&block, has_tail).unwrap();
            let names: Vec<&[u8]> = live.iter().skip(2).map(|e| e.name).collect();
            let want: Vec<&[u8]> = entries.iter().map(|e| e.name.as_slice()).collect();
            assert_eq!(names, want);
            // The region records keep their offsets: the first is right after "..".
            assert_eq!(live[2].offset, 24);
        }
        assert!(dir_block_image(&i_block, &value, 12, 64, false).is_err());
    }

    #[test]
    fn damaged_directories_are_errors() {
        let (mut i_block, value) = encode_dir(2, &[entry("a", 12)], 0, 0).unwrap();
        put_le32(&mut i_block, 0, 0);
        assert!(parse_dir(&i_block, &value).is_err());
        put_le32(&mut i_block, 0, 2);
        i_block[8] = 200; // rec_len past the region
        assert!(parse_dir(&i_block, &value).is_err());
        // A value that is no record chain.
        let (i_block, _) = encode_dir(2, &[], 0, 0).unwrap();
        assert!(parse_dir(&i_block, &[1, 2, 3]).is_err());
        assert!(parse_dir(&i_block, &[0; 12]).is_err());
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..20_000 {
            let mut i_block = [0u8; INODE_BLOCK_SIZE];
            i_block.iter_mut().for_each(|b| *b = next() as u8);
            let value: Vec<u8> = (0..next() % 80).map(|_| next() as u8).collect();
            let _ = parse_dir(&i_block, &value);
            let _ = dir_block_image(&i_block, &value, 12, 1024, next() % 2 == 0);
            let _ = file_bytes(&i_block, &value, next() % 200);
        }
    }
}
