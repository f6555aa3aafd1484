//! Extended attributes (`fs/ext4/xattr.h`, `fs/ext4/xattr.c`): the in-inode area, the xattr
//! block, the entry and block hashes and the block checksum.
//!
//! An inode's attributes live in two places, each a list of 16-byte entry headers (each followed
//! by its name, padded to 4 bytes) ended by a zero u32, with the values packed from the other end:
//!
//! | place        | starts with                               | `e_value_offs` relative to |
//! |--------------|-------------------------------------------|----------------------------|
//! | inode area   | le32 magic (bytes after 128 + extra_isize) | the first entry (area + 4) |
//! | xattr block  | 32-byte header (magic, refcount, blocks=1, | the start of the block     |
//! |              | hash, checksum, reserved)                 |                            |
//!
//! Parsing follows the kernel's `check_xattrs` and e2fsck's `check_ext_attr` /
//! `check_ea_in_inode`: the entry list must end (with room for its terminator) inside the bytes,
//! names hold no NUL and have a non-zero index (e2fsck's "bad name"), every value (padded to 4) lies after the terminator and inside the bytes,
//! no two values overlap, and no name appears twice. A value stored in an inode of its own
//! (`e_value_inum != 0`, the ea_inode feature) is read as a [`ValueInode`] reference (its
//! inode, size and entry hash, which are written back as they were); the caller reads the
//! value from that inode. Entry hashes are not checked on read (the kernel does not either);
//! [`xattr_block_hashes_ok`] checks them for tools (an EA-inode entry's hash covers the value
//! inode's own hash, which the block does not hold: those are not checked).
//!
//! Encoding writes what the current kernel writes: block entries sorted by (name index, name
//! length, name) as `xattr_find_entry` keeps them, each block entry hashed with
//! `ext4_xattr_hash_entry` and the block hashed with `ext4_xattr_rehash`; in-inode entries in the
//! order given with a zero hash (the kernel hashes only block entries there, and e2fsck accepts
//! zero as "not hashed"); values zero-padded to 4 bytes and packed from the end; an empty value at
//! offset 0. Entry hashes read names as unsigned bytes, as Linux 6.2+ and e2fsprogs 1.47+ compute
//! them; both also accept the legacy signed-char hash that older x86 kernels wrote
//! ([`xattr_entry_hash_signed`]), so a name with bytes >= 0x80 verifies with either.
//!
//! The block checksum (`ext4_xattr_block_csum`) is crc32c seeded with the file system's checksum
//! seed, over the block number as le64 and then the whole block with `h_checksum` read as zero.

use std::collections::BTreeSet;

use super::bytes::{le16, le32, put_le16, put_le32};
use crate::crc::crc32c_raw;
use crate::OnDiskError;

/// `h_magic` of a block and the le32 that opens a used in-inode area (EXT4_XATTR_MAGIC).
pub const XATTR_MAGIC: u32 = 0xEA02_0000;
/// Size of `struct ext4_xattr_header`, the xattr block header.
pub const XATTR_BLOCK_HEADER_SIZE: usize = 32;
/// Size of `struct ext4_xattr_ibody_header`, the magic that opens the in-inode area.
pub const XATTR_IBODY_HEADER_SIZE: usize = 4;
/// Size of `struct ext4_xattr_entry` without its name.
pub const XATTR_ENTRY_HEADER_SIZE: usize = 16;
/// Names and values are padded to this many bytes (EXT4_XATTR_PAD).
pub const XATTR_PAD: usize = 4;
/// Longest name suffix (`e_name_len` is one byte; the VFS limit is the same).
pub const XATTR_NAME_LEN_MAX: usize = 255;
/// Most inodes the kernel lets share one block (EXT4_XATTR_REFCOUNT_MAX).
pub const XATTR_REFCOUNT_MAX: u32 = 1024;
/// The largest block whose value offsets fit `e_value_offs` (u16): 64 KiB, ext4's largest.
pub const XATTR_BLOCK_SIZE_MAX: usize = 1 << 16;

/// Name indexes (`e_name_index`): which namespace prefix the stored name suffix belongs to.
pub const XATTR_INDEX_USER: u8 = 1;
pub const XATTR_INDEX_POSIX_ACL_ACCESS: u8 = 2;
pub const XATTR_INDEX_POSIX_ACL_DEFAULT: u8 = 3;
pub const XATTR_INDEX_TRUSTED: u8 = 4;
pub const XATTR_INDEX_SECURITY: u8 = 6;
pub const XATTR_INDEX_SYSTEM: u8 = 7;
pub const XATTR_INDEX_RICHACL: u8 = 8;

/// Offsets in `struct ext4_xattr_header` and `struct ext4_xattr_entry`.
mod off {
    pub const H_MAGIC: usize = 0x0;
    pub const H_REFCOUNT: usize = 0x4;
    pub const H_BLOCKS: usize = 0x8;
    pub const H_HASH: usize = 0xC;
    pub const H_CHECKSUM: usize = 0x10;
    pub const H_RESERVED: usize = 0x14;

    pub const E_NAME_LEN: usize = 0x0;
    pub const E_NAME_INDEX: usize = 0x1;
    pub const E_VALUE_OFFS: usize = 0x2;
    pub const E_VALUE_INUM: usize = 0x4;
    pub const E_VALUE_SIZE: usize = 0x8;
    pub const E_HASH: usize = 0xC;
    pub const E_NAME: usize = 0x10;
}

const _: () = assert!(off::H_RESERVED + 3 * 4 == XATTR_BLOCK_HEADER_SIZE);
const _: () = assert!(off::H_CHECKSUM + 4 == off::H_RESERVED);
const _: () = assert!(off::E_HASH + 4 == off::E_NAME);
const _: () = assert!(off::E_NAME == XATTR_ENTRY_HEADER_SIZE);

/// Entry-hash shifts (NAME_HASH_SHIFT, VALUE_HASH_SHIFT) and the block-hash shift.
const NAME_HASH_SHIFT: u32 = 5;
const VALUE_HASH_SHIFT: u32 = 16;
const BLOCK_HASH_SHIFT: u32 = 16;

/// Namespace prefixes as the kernel's handlers match them: the ACL and richacl handlers own one
/// whole name each, the others a prefix. Whole names are tried first, so
/// `system.posix_acl_access` is index 2 with an empty suffix while `system.posix_acl_accessX`
/// falls to the `system.` prefix.
const NAMESPACES: [(u8, &[u8], NameKind); 7] = [
    (XATTR_INDEX_POSIX_ACL_ACCESS, b"system.posix_acl_access", NameKind::Whole),
    (XATTR_INDEX_POSIX_ACL_DEFAULT, b"system.posix_acl_default", NameKind::Whole),
    (XATTR_INDEX_RICHACL, b"system.richacl", NameKind::Whole),
    (XATTR_INDEX_USER, b"user.", NameKind::Prefix),
    (XATTR_INDEX_TRUSTED, b"trusted.", NameKind::Prefix),
    (XATTR_INDEX_SECURITY, b"security.", NameKind::Prefix),
    (XATTR_INDEX_SYSTEM, b"system.", NameKind::Prefix),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NameKind {
    Whole,
    Prefix,
}

/// One extended attribute: `name` is the suffix after the namespace prefix of `name_index`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XattrEntry {
    pub name_index: u8,
    pub name: Vec<u8>,
    /// The value; empty when it lives in an inode of its own (`value_inode`).
    pub value: Vec<u8>,
    /// Where the value lives when it is not here (the ea_inode feature).
    pub value_inode: Option<ValueInode>,
}

/// A value kept in an inode of its own (`e_value_inum`, the ea_inode feature): the inode's
/// data is the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValueInode {
    /// `e_value_inum`.
    pub ino: u32,
    /// `e_value_size`: the value's length (the inode's i_size must say the same).
    pub size: u32,
    /// `e_hash` as found: over the name and the value inode's hash, written back unchanged.
    pub entry_hash: u32,
}

/// The largest value an entry may keep in an inode of its own (`EXT4_XATTR_SIZE_MAX`).
pub const XATTR_VALUE_INODE_SIZE_MAX: u32 = 1 << 24;

impl XattrEntry {
    /// Bytes this entry takes in the entry list: header plus name padded to 4 (EXT4_XATTR_LEN).
    pub fn entry_len(&self) -> usize {
        entry_len(self.name.len())
    }

    /// Bytes this entry's value takes in the value area: padded to 4 (EXT4_XATTR_SIZE).
    pub fn value_len_padded(&self) -> usize {
        pad(self.value.len())
    }

    /// An attribute with its value here.
    pub fn new(name_index: u8, name: &[u8], value: &[u8]) -> XattrEntry {
        XattrEntry { name_index, name: name.to_vec(), value: value.to_vec(), value_inode: None }
    }

    fn sort_key(&self) -> (u8, usize, &[u8]) {
        (self.name_index, self.name.len(), &self.name)
    }
}

/// The fields of an xattr block header that vary (`h_magic` and `h_blocks` are checked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XattrBlockHeader {
    pub refcount: u32,
    pub hash: u32,
    pub checksum: u32,
}

/// Splits a full attribute name ("user.foo") into its name index and stored suffix ("foo"), as
/// the kernel's handlers match them; `None` when no namespace ext4 stores matches.
pub fn split_name(full: &[u8]) -> Option<(u8, &[u8])> {
    NAMESPACES.iter().find_map(|&(index, prefix, kind)| match kind {
        NameKind::Whole => (full == prefix).then_some((index, &full[full.len()..])),
        NameKind::Prefix => full.strip_prefix(prefix).map(|suffix| (index, suffix)),
    })
}

/// Whether names of `index` are whole names (the ACLs, richacl) rather than prefix + suffix.
pub fn name_index_is_whole_name(index: u8) -> bool {
    NAMESPACES.iter().any(|&(i, _, kind)| i == index && kind == NameKind::Whole)
}

/// The namespace prefix of `index`, if ext4 defines one quill knows.
pub fn name_prefix(index: u8) -> Option<&'static [u8]> {
    NAMESPACES.iter().find(|&&(i, _, _)| i == index).map(|&(_, prefix, _)| prefix)
}

/// The full name of a stored attribute: prefix of `index` followed by `name`. An index without
/// a known prefix contributes nothing, as e2fsprogs prints such names; check [`name_prefix`]
/// first where that ambiguity matters (listing skips them, as the kernel does).
pub fn full_name(index: u8, name: &[u8]) -> Vec<u8> {
    let prefix = name_prefix(index).unwrap_or(b"");
    let mut full = Vec::with_capacity(prefix.len() + name.len());
    full.extend_from_slice(prefix);
    full.extend_from_slice(name);
    full
}

/// `ext4_xattr_hash_entry`: the entry hash over the name (bytes as unsigned char, as Linux 6.2+
/// and e2fsprogs 1.47+ compute it) and the value read as le32 words, zero-padded to 4 bytes.
pub fn xattr_entry_hash(name: &[u8], value: &[u8]) -> u32 {
    hash_value(name.iter().fold(0, |hash, &b| hash_name_step(hash, u32::from(b))), value)
}

/// `ext4_xattr_hash_entry_signed`: the legacy hash older x86 kernels and e2fsprogs wrote, with
/// name bytes sign-extended. Equal to [`xattr_entry_hash`] for ASCII names.
pub fn xattr_entry_hash_signed(name: &[u8], value: &[u8]) -> u32 {
    hash_value(name.iter().fold(0, |hash, &b| hash_name_step(hash, b as i8 as i32 as u32)), value)
}

/// `ext4_xattr_rehash`: the block hash over the entry hashes in list order; 0 (never share) when
/// any entry hash is 0.
pub fn xattr_block_hash(entry_hashes: impl IntoIterator<Item = u32>) -> u32 {
    let mut hash = 0u32;
    for entry_hash in entry_hashes {
        if entry_hash == 0 {
            return 0;
        }
        hash = hash.rotate_left(BLOCK_HASH_SHIFT) ^ entry_hash;
    }
    hash
}

fn hash_name_step(hash: u32, byte: u32) -> u32 {
    hash.rotate_left(NAME_HASH_SHIFT) ^ byte
}

fn hash_value(mut hash: u32, value: &[u8]) -> u32 {
    for word in value.chunks(4) {
        let mut padded = [0u8; 4];
        padded[..word.len()].copy_from_slice(word);
        hash = hash.rotate_left(VALUE_HASH_SHIFT) ^ u32::from_le_bytes(padded);
    }
    hash
}

/// Decodes the in-inode area (the bytes of an inode record after `128 + i_extra_isize`). An area
/// that does not open with the magic holds no attributes.
pub fn parse_inode_xattrs(area: &[u8]) -> Result<Vec<XattrEntry>, OnDiskError> {
    if area.len() < XATTR_IBODY_HEADER_SIZE || le32(area, 0) != XATTR_MAGIC {
        return Ok(Vec::new());
    }
    if area.len() < XATTR_IBODY_HEADER_SIZE + 4 {
        return Err(OnDiskError::corrupted(
            "in-inode xattrs",
            format!("{}-byte area has no room for the entry list", area.len()),
        ));
    }
    let raw =
        parse_entries(area, XATTR_IBODY_HEADER_SIZE, XATTR_IBODY_HEADER_SIZE, "in-inode xattrs")?;
    Ok(raw.into_iter().map(RawEntry::into_entry).collect())
}

/// Encodes `entries` (in the order given) into an in-inode area of `area_len` bytes; `None` when
/// they do not fit. No entries encode as an all-zero area (no magic), as the kernel clears it.
pub fn encode_inode_xattrs(entries: &[XattrEntry], area_len: usize) -> Option<Vec<u8>> {
    let mut area = vec![0u8; area_len];
    if entries.is_empty() {
        return Some(area);
    }
    check_distinct_names(entries.iter());
    if area_len < XATTR_IBODY_HEADER_SIZE {
        return None;
    }
    // Values are addressed relative to the first entry; keep them 4-byte aligned from there.
    let values_end = XATTR_IBODY_HEADER_SIZE + round_down(area_len - XATTR_IBODY_HEADER_SIZE);
    let ordered: Vec<&XattrEntry> = entries.iter().collect();
    if !fits(&ordered, XATTR_IBODY_HEADER_SIZE, values_end) {
        return None;
    }
    put_le32(&mut area, 0, XATTR_MAGIC);
    write_entries(
        &mut area,
        &ordered,
        XATTR_IBODY_HEADER_SIZE,
        XATTR_IBODY_HEADER_SIZE,
        values_end,
        false,
    );
    Some(area)
}

/// Decodes and checks an xattr block (magic, `h_blocks == 1`, entries and values). The checksum
/// is the caller's to check, with [`xattr_block_checksum_ok`], because it needs the block number.
pub fn parse_xattr_block(block: &[u8]) -> Result<(XattrBlockHeader, Vec<XattrEntry>), OnDiskError> {
    let header = parse_block_header(block)?;
    let raw = parse_entries(block, XATTR_BLOCK_HEADER_SIZE, 0, "xattr block")?;
    Ok((header, raw.into_iter().map(RawEntry::into_entry).collect()))
}

/// Encodes an xattr block of `block_size` bytes holding `entries` (sorted as the kernel keeps
/// them) with `refcount` references; `None` when they do not fit. Entry and block hashes are
/// computed; `h_checksum` is left zero for [`set_xattr_block_checksum`].
pub fn encode_xattr_block(
    entries: &[XattrEntry],
    refcount: u32,
    block_size: usize,
) -> Option<Vec<u8>> {
    assert!(
        block_size.is_multiple_of(XATTR_PAD) && block_size <= XATTR_BLOCK_SIZE_MAX,
        "xattr block size {block_size}"
    );
    let mut sorted: Vec<&XattrEntry> = entries.iter().collect();
    sorted.sort_by(|a, b| a.sort_key().cmp(&b.sort_key()));
    for pair in sorted.windows(2) {
        assert!(pair[0].sort_key() != pair[1].sort_key(), "xattr name encoded twice");
    }
    if block_size < XATTR_BLOCK_HEADER_SIZE || !fits(&sorted, XATTR_BLOCK_HEADER_SIZE, block_size) {
        return None;
    }
    let mut block = vec![0u8; block_size];
    put_le32(&mut block, off::H_MAGIC, XATTR_MAGIC);
    put_le32(&mut block, off::H_REFCOUNT, refcount);
    put_le32(&mut block, off::H_BLOCKS, 1);
    let hashes = write_entries(&mut block, &sorted, XATTR_BLOCK_HEADER_SIZE, 0, block_size, true);
    put_le32(&mut block, off::H_HASH, xattr_block_hash(hashes));
    Some(block)
}

/// Rewrites `h_refcount` of an xattr block in place (the entries are left byte for byte as they
/// are); the checksum must be set again afterwards. Does nothing to a block shorter than its
/// header.
pub fn set_xattr_block_refcount(block: &mut [u8], refcount: u32) {
    if block.len() >= XATTR_BLOCK_HEADER_SIZE {
        put_le32(block, off::H_REFCOUNT, refcount);
    }
}

/// `ext4_xattr_block_csum`: crc32c seeded with the file system's checksum seed
/// (`Superblock::csum_seed`) over le64 `block_nr`, then `block` with `h_checksum` as zero.
pub fn xattr_block_checksum(fs_csum_seed: u32, block_nr: u64, block: &[u8]) -> Option<u32> {
    if block.len() < XATTR_BLOCK_HEADER_SIZE {
        return None;
    }
    let mut crc = crc32c_raw(fs_csum_seed, &block_nr.to_le_bytes());
    crc = crc32c_raw(crc, &block[..off::H_CHECKSUM]);
    crc = crc32c_raw(crc, &[0; 4]);
    Some(crc32c_raw(crc, &block[off::H_CHECKSUM + 4..]))
}

/// Writes the checksum of block `block_nr` into its header (`ext4_xattr_block_csum_set`).
/// Does nothing to a block shorter than its header.
pub fn set_xattr_block_checksum(fs_csum_seed: u32, block_nr: u64, block: &mut [u8]) {
    if let Some(checksum) = xattr_block_checksum(fs_csum_seed, block_nr, block) {
        put_le32(block, off::H_CHECKSUM, checksum);
    }
}

/// Whether block `block_nr` carries its checksum; false for bytes shorter than the header.
pub fn xattr_block_checksum_ok(fs_csum_seed: u32, block_nr: u64, block: &[u8]) -> bool {
    xattr_block_checksum(fs_csum_seed, block_nr, block)
        .is_some_and(|checksum| checksum == le32(block, off::H_CHECKSUM))
}

/// Whether every entry hash of a valid block matches its name and value (unsigned or legacy
/// signed variant), as e2fsck checks them, and `h_hash` is the block hash of the entry hashes or
/// 0, the kernel's "never share" value (e2fsprogs writes blocks with `h_hash` 0). False for a
/// block that does not parse.
pub fn xattr_block_hashes_ok(block: &[u8]) -> bool {
    let Ok(header) = parse_block_header(block) else {
        return false;
    };
    let Ok(raw) = parse_entries(block, XATTR_BLOCK_HEADER_SIZE, 0, "xattr block") else {
        return false;
    };
    let entries_ok = raw.iter().all(|e| {
        e.value_inode.is_some()
            || e.hash == xattr_entry_hash(e.name, e.value)
            || e.hash == xattr_entry_hash_signed(e.name, e.value)
    });
    entries_ok && (header.hash == 0 || header.hash == xattr_block_hash(raw.iter().map(|e| e.hash)))
}

/// An entry as found on disk, borrowing its name and value.
struct RawEntry<'a> {
    name_index: u8,
    name: &'a [u8],
    value: &'a [u8],
    hash: u32,
    value_inode: Option<ValueInode>,
}

impl RawEntry<'_> {
    fn into_entry(self) -> XattrEntry {
        XattrEntry {
            name_index: self.name_index,
            name: self.name.to_vec(),
            value: self.value.to_vec(),
            value_inode: self.value_inode,
        }
    }
}

fn parse_block_header(block: &[u8]) -> Result<XattrBlockHeader, OnDiskError> {
    if block.len() < XATTR_BLOCK_HEADER_SIZE + 4 {
        return Err(OnDiskError::corrupted("xattr block", format!("{} bytes", block.len())));
    }
    let magic = le32(block, off::H_MAGIC);
    if magic != XATTR_MAGIC {
        return Err(OnDiskError::corrupted("xattr block", format!("magic {magic:#010x}")));
    }
    let blocks = le32(block, off::H_BLOCKS);
    if blocks != 1 {
        return Err(OnDiskError::corrupted(
            "xattr block",
            format!("h_blocks {blocks}, expected 1"),
        ));
    }
    Ok(XattrBlockHeader {
        refcount: le32(block, off::H_REFCOUNT),
        hash: le32(block, off::H_HASH),
        checksum: le32(block, off::H_CHECKSUM),
    })
}

/// Walks the entry list of `bytes` from `first` and checks every value, whose offsets count from
/// `value_base`. Each step advances at least 16 bytes and stays inside `bytes`, so the walk
/// ends.
fn parse_entries<'a>(
    bytes: &'a [u8],
    first: usize,
    value_base: usize,
    what: &'static str,
) -> Result<Vec<RawEntry<'a>>, OnDiskError> {
    let corrupted = |reason: String| OnDiskError::corrupted(what, reason);
    let mut entries = Vec::new();
    let mut value_ranges: Vec<(usize, usize)> = Vec::new();
    let mut names = BTreeSet::new();
    let mut at = first;
    // Headers first, so that the end of the list (where values may begin) is known.
    let mut headers = Vec::new();
    loop {
        if at + 4 > bytes.len() {
            return Err(corrupted(format!(
                "entry list runs past byte {} without a terminator",
                bytes.len()
            )));
        }
        if le32(bytes, at) == 0 {
            break;
        }
        if at + XATTR_ENTRY_HEADER_SIZE > bytes.len() {
            return Err(corrupted(format!("entry at byte {at} runs past the end")));
        }
        let next = at + entry_len(usize::from(bytes[at + off::E_NAME_LEN]));
        if next + 4 > bytes.len() {
            return Err(corrupted(format!("entry at byte {at} runs past the end")));
        }
        headers.push(at);
        at = next;
    }
    let values_start = at + 4;
    for at in headers {
        let name_len = usize::from(bytes[at + off::E_NAME_LEN]);
        let name = &bytes[at + off::E_NAME..at + off::E_NAME + name_len];
        if name.contains(&0) {
            return Err(corrupted(format!("entry at byte {at}: name holds a NUL byte")));
        }
        let name_index = bytes[at + off::E_NAME_INDEX];
        if name_index == 0 {
            // e2fsck's "bad name"; an empty one would also re-encode as the terminator.
            return Err(corrupted(format!("entry at byte {at}: name index 0")));
        }
        if !names.insert((name_index, name)) {
            return Err(corrupted(format!("entry at byte {at}: name appears twice")));
        }
        let value_inum = le32(bytes, at + off::E_VALUE_INUM);
        let value_size = le32(bytes, at + off::E_VALUE_SIZE);
        let hash = le32(bytes, at + off::E_HASH);
        if value_inum != 0 {
            // The value is the inode's data: nothing of it lies here (ext4_xattr_check_entries
            // checks only the size).
            if value_size > XATTR_VALUE_INODE_SIZE_MAX {
                return Err(corrupted(format!(
                    "entry at byte {at}: {value_size}-byte value in inode {value_inum}"
                )));
            }
            let value_inode =
                Some(ValueInode { ino: value_inum, size: value_size, entry_hash: hash });
            entries.push(RawEntry { name_index, name, value: &bytes[..0], hash, value_inode });
            continue;
        }
        let value = if value_size == 0 {
            &bytes[..0]
        } else {
            let start = value_base + usize::from(le16(bytes, at + off::E_VALUE_OFFS));
            // In u64 so that a hostile size cannot overflow; padded, as e2fsck checks it.
            let end = start as u64 + u64::from(value_size).div_ceil(4) * 4;
            if start < values_start || end > bytes.len() as u64 {
                return Err(corrupted(format!(
                    "entry at byte {at}: {value_size}-byte value at byte {start} lies outside \
                     {values_start}..{}",
                    bytes.len()
                )));
            }
            // end <= bytes.len(), so these conversions and slices are in range.
            value_ranges.push((start, end as usize));
            &bytes[start..start + value_size as usize]
        };
        entries.push(RawEntry { name_index, name, value, hash, value_inode: None });
    }
    value_ranges.sort_unstable();
    for pair in value_ranges.windows(2) {
        if pair[1].0 < pair[0].1 {
            return Err(corrupted(format!(
                "values at bytes {} and {} overlap",
                pair[0].0, pair[1].0
            )));
        }
    }
    Ok(entries)
}

/// Whether `entries` fit an entry list from `first` plus terminator, with values packed below
/// `values_end`.
fn fits(entries: &[&XattrEntry], first: usize, values_end: usize) -> bool {
    let names: usize = entries.iter().map(|e| e.entry_len()).sum();
    let values: usize = entries.iter().map(|e| e.value_len_padded()).sum();
    first + names + 4 + values <= values_end
}

/// Writes the entry list from `first` and the values packed down from `values_end` into the
/// zeroed `bytes`, which [`fits`] said hold them; returns the entry hashes written.
fn write_entries(
    bytes: &mut [u8],
    entries: &[&XattrEntry],
    first: usize,
    value_base: usize,
    values_end: usize,
    hashed: bool,
) -> Vec<u32> {
    let mut at = first;
    let mut value_at = values_end;
    let mut hashes = Vec::with_capacity(entries.len());
    for entry in entries {
        assert!(entry.name.len() <= XATTR_NAME_LEN_MAX, "xattr name of {} bytes", entry.name.len());
        assert!(entry.name_index != 0, "xattr name index 0 would end the entry list");
        let value_offs = if entry.value.is_empty() {
            0
        } else {
            value_at -= entry.value_len_padded();
            bytes[value_at..value_at + entry.value.len()].copy_from_slice(&entry.value);
            u16::try_from(value_at - value_base).expect("value offsets fit u16 in blocks <= 64 KiB")
        };
        let (hash, inum, size) = match entry.value_inode {
            // As found: the hash covers the value inode's hash, which is not here.
            Some(v) => (v.entry_hash, v.ino, v.size),
            None if hashed => {
                (xattr_entry_hash(&entry.name, &entry.value), 0, entry.value.len() as u32)
            }
            None => (0, 0, entry.value.len() as u32),
        };
        bytes[at + off::E_NAME_LEN] = entry.name.len() as u8;
        bytes[at + off::E_NAME_INDEX] = entry.name_index;
        put_le16(bytes, at + off::E_VALUE_OFFS, value_offs);
        put_le32(bytes, at + off::E_VALUE_INUM, inum);
        put_le32(bytes, at + off::E_VALUE_SIZE, size);
        put_le32(bytes, at + off::E_HASH, hash);
        bytes[at + off::E_NAME..at + off::E_NAME + entry.name.len()].copy_from_slice(&entry.name);
        hashes.push(hash);
        at += entry.entry_len();
    }
    debug_assert!(at + 4 <= value_at, "entry list ran into the values");
    hashes
}

fn check_distinct_names<'a>(entries: impl Iterator<Item = &'a XattrEntry>) {
    let mut seen = BTreeSet::new();
    for entry in entries {
        assert!(seen.insert(entry.sort_key()), "xattr name encoded twice");
    }
}

/// EXT4_XATTR_LEN: entry header plus name, padded to 4.
fn entry_len(name_len: usize) -> usize {
    pad(XATTR_ENTRY_HEADER_SIZE + name_len)
}

/// EXT4_XATTR_SIZE: `len` rounded up to 4 (callers pass buffer lengths, far from usize::MAX).
fn pad(len: usize) -> usize {
    len.div_ceil(XATTR_PAD) * XATTR_PAD
}

fn round_down(len: usize) -> usize {
    len / XATTR_PAD * XATTR_PAD
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Rng;

    fn entry(name_index: u8, name: &[u8], value: &[u8]) -> XattrEntry {
        XattrEntry::new(name_index, name, value)
    }

    fn sample_entries() -> Vec<XattrEntry> {
        vec![
            entry(XATTR_INDEX_USER, b"zeta", b"last by name"),
            entry(XATTR_INDEX_SECURITY, b"selinux", b"system_u:object_r:etc_t:s0\0"),
            entry(XATTR_INDEX_USER, b"a", b""),
            entry(XATTR_INDEX_POSIX_ACL_ACCESS, b"", &[2, 0, 0, 0, 1, 0, 6, 0]),
            entry(XATTR_INDEX_USER, b"mid", &[0xAB; 37]),
        ]
    }

    #[test]
    fn split_name_matches_whole_acl_names_before_prefixes() {
        assert_eq!(split_name(b"user.foo"), Some((XATTR_INDEX_USER, &b"foo"[..])));
        assert_eq!(split_name(b"trusted.x"), Some((XATTR_INDEX_TRUSTED, &b"x"[..])));
        assert_eq!(split_name(b"security.selinux"), Some((XATTR_INDEX_SECURITY, &b"selinux"[..])));
        assert_eq!(split_name(b"system.posix_acl_access"), Some((2, &b""[..])));
        assert_eq!(split_name(b"system.posix_acl_default"), Some((3, &b""[..])));
        assert_eq!(split_name(b"system.richacl"), Some((8, &b""[..])));
        assert_eq!(split_name(b"system.data"), Some((XATTR_INDEX_SYSTEM, &b"data"[..])));
        assert_eq!(
            split_name(b"system.posix_acl_accessX"),
            Some((XATTR_INDEX_SYSTEM, &b"posix_acl_accessX"[..]))
        );
        assert_eq!(split_name(b"user."), Some((XATTR_INDEX_USER, &b""[..])));
        assert_eq!(split_name(b"gnu.translator"), None);
        assert_eq!(split_name(b"user"), None);
        assert_eq!(split_name(b""), None);
    }

    #[test]
    fn full_name_inverts_split_name_and_leaves_unknown_indexes_bare() {
        for full in [&b"user.foo"[..], b"system.posix_acl_default", b"security.ima", b"system.x"] {
            let (index, suffix) = split_name(full).unwrap();
            assert_eq!(full_name(index, suffix), full);
        }
        assert_eq!(name_prefix(5), None);
        assert_eq!(full_name(5, b"lustre"), b"lustre");
        assert!(name_index_is_whole_name(XATTR_INDEX_POSIX_ACL_ACCESS));
        assert!(!name_index_is_whole_name(XATTR_INDEX_USER));
    }

    #[test]
    fn entry_hash_matches_a_hand_computed_value() {
        // name "u.x": 0x75 → rotl5 ^ 0x2e = 0xE8E → rotl5 ^ 0x78 = 0x1D1B8.
        assert_eq!(xattr_entry_hash(b"u.x", b""), 0x0001_D1B8);
        // "x" then one value word 0x11112222 (little-endian bytes): rotl16(0x78) ^ word.
        assert_eq!(xattr_entry_hash(b"x", &[0x22, 0x22, 0x11, 0x11]), 0x1169_2222);
        // A short last word is zero-padded.
        assert_eq!(xattr_entry_hash(b"x", &[0x22]), xattr_entry_hash(b"x", &[0x22, 0, 0, 0]));
    }

    #[test]
    fn signed_and_unsigned_entry_hashes_differ_only_for_high_bytes() {
        assert_eq!(xattr_entry_hash(b"ascii", b"v"), xattr_entry_hash_signed(b"ascii", b"v"));
        assert_eq!(xattr_entry_hash(b"\x80", b""), 0x80);
        assert_eq!(xattr_entry_hash_signed(b"\x80", b""), 0xFFFF_FF80);
    }

    #[test]
    fn block_hash_is_zero_when_any_entry_hash_is_zero() {
        assert_eq!(xattr_block_hash([]), 0);
        assert_eq!(xattr_block_hash([1, 0, 2]), 0);
        assert_eq!(xattr_block_hash([0x1234_5678]), 0x1234_5678);
        assert_eq!(xattr_block_hash([0x1234_5678, 1]), 0x5678_1235);
    }

    #[test]
    fn block_encoding_sorts_entries_and_parses_back() {
        let entries = sample_entries();
        let block = encode_xattr_block(&entries, 3, 1024).unwrap();
        let (header, parsed) = parse_xattr_block(&block).unwrap();
        assert_eq!(header.refcount, 3);
        assert_eq!(header.checksum, 0);
        let mut expected = entries.clone();
        expected.sort_by(|a, b| a.sort_key().cmp(&b.sort_key()));
        assert_eq!(parsed, expected);
        assert_eq!(parsed[0].name_index, XATTR_INDEX_USER);
        assert_eq!(parsed[0].name, b"a");
        assert_eq!(parsed[1].name, b"mid");
        assert!(xattr_block_hashes_ok(&block));
        assert_ne!(header.hash, 0);
    }

    #[test]
    fn block_values_are_packed_from_the_end_and_aligned_to_four() {
        let entries = vec![entry(1, b"a", b"12345"), entry(1, b"b", b""), entry(1, b"c", b"xy")];
        let block = encode_xattr_block(&entries, 1, 1024).unwrap();
        let first = XATTR_BLOCK_HEADER_SIZE;
        // "a": 5 bytes padded to 8 at the very end.
        assert_eq!(le16(&block, first + off::E_VALUE_OFFS), 1024 - 8);
        assert_eq!(&block[1016..1021], b"12345");
        assert_eq!(&block[1021..1024], &[0, 0, 0]);
        // "b": empty value at offset 0.
        let second = first + entry_len(1);
        assert_eq!(le16(&block, second + off::E_VALUE_OFFS), 0);
        assert_eq!(le32(&block, second + off::E_VALUE_SIZE), 0);
        // "c" right below "a"; the list ends with a zero u32.
        let third = second + entry_len(1);
        assert_eq!(le16(&block, third + off::E_VALUE_OFFS), 1024 - 12);
        assert_eq!(le32(&block, third + entry_len(1)), 0);
    }

    #[test]
    fn inode_area_values_count_from_the_first_entry_and_keep_the_given_order() {
        let entries = vec![entry(1, b"zz", b"value"), entry(1, b"aa", b"")];
        let area = encode_inode_xattrs(&entries, 96).unwrap();
        assert_eq!(le32(&area, 0), XATTR_MAGIC);
        let offs = usize::from(le16(&area, 4 + off::E_VALUE_OFFS));
        assert_eq!(offs, 96 - 4 - 8);
        assert_eq!(&area[4 + offs..4 + offs + 5], b"value");
        // In-inode entries carry no hash, like the kernel writes them.
        assert_eq!(le32(&area, 4 + off::E_HASH), 0);
        assert_eq!(parse_inode_xattrs(&area).unwrap(), entries);
    }

    #[test]
    fn empty_attribute_lists_encode_as_zeroed_areas_and_parse_as_empty() {
        assert_eq!(encode_inode_xattrs(&[], 96).unwrap(), vec![0; 96]);
        assert_eq!(encode_inode_xattrs(&[], 0).unwrap(), Vec::<u8>::new());
        assert!(parse_inode_xattrs(&[0; 96]).unwrap().is_empty());
        assert!(parse_inode_xattrs(&[]).unwrap().is_empty());
        assert!(parse_inode_xattrs(&[0xAA; 3]).unwrap().is_empty());
        let block = encode_xattr_block(&[], 1, 1024).unwrap();
        assert!(parse_xattr_block(&block).unwrap().1.is_empty());
    }

    #[test]
    fn encoders_fill_to_the_last_byte_and_refuse_one_more() {
        // 96-byte area: magic 4 + entry 20 + terminator 4 leaves 68 bytes of value.
        let exact = [entry(1, b"abcd", &[7; 68])];
        assert!(encode_inode_xattrs(&exact, 96).is_some());
        assert!(encode_inode_xattrs(&[entry(1, b"abcd", &[7; 69])], 96).is_none());
        assert!(encode_inode_xattrs(&[entry(1, b"a", b"")], 7).is_none());
        assert!(encode_inode_xattrs(&[entry(1, b"a", b"")], 0).is_none());
        assert_eq!(parse_inode_xattrs(&encode_inode_xattrs(&exact, 96).unwrap()).unwrap(), exact);
        // 1024-byte block: header 32 + entry 20 + terminator 4 leaves 968.
        let exact = [entry(1, b"abcd", &[7; 968])];
        assert!(encode_xattr_block(&exact, 1, 1024).is_some());
        assert!(encode_xattr_block(&[entry(1, b"abcd", &[7; 969])], 1, 1024).is_none());
        let (_, parsed) = parse_xattr_block(&encode_xattr_block(&exact, 1, 1024).unwrap()).unwrap();
        assert_eq!(parsed, exact);
    }

    #[test]
    fn block_checksum_is_bound_to_the_block_number_and_contents() {
        let mut block = encode_xattr_block(&sample_entries(), 1, 4096).unwrap();
        set_xattr_block_checksum(0xDEAD_BEEF, 77, &mut block);
        assert!(xattr_block_checksum_ok(0xDEAD_BEEF, 77, &block));
        assert!(!xattr_block_checksum_ok(0xDEAD_BEEF, 78, &block));
        assert!(!xattr_block_checksum_ok(0xDEAD_BEEE, 77, &block));
        assert_eq!(parse_xattr_block(&block).unwrap().0.checksum, le32(&block, off::H_CHECKSUM));
        block[4000] ^= 1;
        assert!(!xattr_block_checksum_ok(0xDEAD_BEEF, 77, &block));
        assert!(!xattr_block_checksum_ok(0xDEAD_BEEF, 77, &block[..31]));
        // Refcount updates keep everything else and need a new checksum.
        block[4000] ^= 1;
        set_xattr_block_refcount(&mut block, 2);
        assert!(!xattr_block_checksum_ok(0xDEAD_BEEF, 77, &block));
        assert_eq!(parse_xattr_block(&block).unwrap().0.refcount, 2);
    }

    #[test]
    fn legacy_signed_entry_hashes_verify_too() {
        let entries = vec![entry(1, "caf\u{e9}".as_bytes(), b"v")];
        let mut block = encode_xattr_block(&entries, 1, 1024).unwrap();
        assert!(xattr_block_hashes_ok(&block));
        let at = XATTR_BLOCK_HEADER_SIZE + off::E_HASH;
        let signed = xattr_entry_hash_signed(&entries[0].name, &entries[0].value);
        assert_ne!(signed, le32(&block, at));
        put_le32(&mut block, at, signed);
        assert!(!xattr_block_hashes_ok(&block), "block hash must follow the entry hashes");
        put_le32(&mut block, off::H_HASH, xattr_block_hash([signed]));
        assert!(xattr_block_hashes_ok(&block));
        put_le32(&mut block, at, signed ^ 1);
        assert!(!xattr_block_hashes_ok(&block));
        // A block hash of 0 means "never share", whatever the entries.
        put_le32(&mut block, at, signed);
        put_le32(&mut block, off::H_HASH, 0);
        assert!(xattr_block_hashes_ok(&block));
    }

    fn corrupted_reason(
        result: Result<(XattrBlockHeader, Vec<XattrEntry>), OnDiskError>,
    ) -> String {
        match result {
            Err(OnDiskError::Corrupted { reason, .. }) => reason,
            other => panic!("expected Corrupted, got {other:?}"),
        }
    }

    #[test]
    fn block_with_bad_magic_or_block_count_is_rejected() {
        let good = encode_xattr_block(&sample_entries(), 1, 1024).unwrap();
        let mut bad = good.clone();
        bad[0] ^= 1;
        assert!(corrupted_reason(parse_xattr_block(&bad)).contains("magic"));
        let mut bad = good.clone();
        put_le32(&mut bad, off::H_BLOCKS, 2);
        assert!(corrupted_reason(parse_xattr_block(&bad)).contains("h_blocks"));
        assert!(parse_xattr_block(&good[..35]).is_err());
    }

    #[test]
    fn entries_that_run_past_the_end_or_lack_a_terminator_are_rejected() {
        let mut block = encode_xattr_block(&[entry(1, b"abc", b"v")], 1, 64).unwrap();
        // A name length that carries the entry past the block.
        block[XATTR_BLOCK_HEADER_SIZE] = 200;
        assert!(corrupted_reason(parse_xattr_block(&block)).contains("past the end"));
        // No terminator: non-zero words all the way to the end.
        let mut area = vec![0x11u8; 40];
        put_le32(&mut area, 0, XATTR_MAGIC);
        area[4] = 0; // name_len 0: every entry is 16 bytes
        assert!(parse_inode_xattrs(&area).is_err());
        let mut area = vec![0u8; 7];
        put_le32(&mut area, 0, XATTR_MAGIC);
        assert!(parse_inode_xattrs(&area).is_err());
    }

    #[test]
    fn values_out_of_range_overlapping_or_inside_the_entry_list_are_rejected() {
        let entries = vec![entry(1, b"a", b"1234"), entry(1, b"b", b"5678")];
        let good = encode_xattr_block(&entries, 1, 1024).unwrap();
        let first = XATTR_BLOCK_HEADER_SIZE;
        let second = first + entry_len(1);
        // Past the end.
        let mut bad = good.clone();
        put_le16(&mut bad, first + off::E_VALUE_OFFS, 1022);
        assert!(corrupted_reason(parse_xattr_block(&bad)).contains("outside"));
        let mut bad = good.clone();
        put_le32(&mut bad, first + off::E_VALUE_SIZE, u32::MAX);
        assert!(corrupted_reason(parse_xattr_block(&bad)).contains("outside"));
        // Overlapping the other value.
        let mut bad = good.clone();
        let other = le16(&bad, second + off::E_VALUE_OFFS);
        put_le16(&mut bad, first + off::E_VALUE_OFFS, other + 2);
        assert!(parse_xattr_block(&bad).is_err());
        let mut bad = good.clone();
        put_le16(&mut bad, first + off::E_VALUE_OFFS, other);
        assert!(corrupted_reason(parse_xattr_block(&bad)).contains("overlap"));
        // Inside the header / entry list / terminator.
        for offs in [0u16, 8, first as u16, (second + entry_len(1)) as u16] {
            let mut bad = good.clone();
            put_le16(&mut bad, first + off::E_VALUE_OFFS, offs);
            assert!(parse_xattr_block(&bad).is_err(), "value at {offs}");
        }
    }

    #[test]
    fn ea_inode_references_round_trip_and_oversized_ones_are_rejected() {
        let entries = vec![entry(1, b"a", b"1234"), entry(1, b"b", b"5678")];
        let good = encode_xattr_block(&entries, 1, 1024).unwrap();
        let first = XATTR_BLOCK_HEADER_SIZE;
        let mut with_inode = good.clone();
        put_le32(&mut with_inode, first + off::E_VALUE_INUM, 13);
        put_le32(&mut with_inode, first + off::E_VALUE_SIZE, 8000);
        put_le32(&mut with_inode, first + off::E_HASH, 0xabcd);
        let (_, parsed) = parse_xattr_block(&with_inode).unwrap();
        let reference = ValueInode { ino: 13, size: 8000, entry_hash: 0xabcd };
        assert_eq!((parsed[0].value_inode, parsed[0].value.len()), (Some(reference), 0));
        let again = encode_xattr_block(&parsed, 1, 1024).unwrap();
        assert_eq!(parse_xattr_block(&again).unwrap().1, parsed);
        let area = encode_inode_xattrs(&parsed, 100).unwrap();
        assert_eq!(parse_inode_xattrs(&area).unwrap(), parsed);
        put_le32(&mut with_inode, first + off::E_VALUE_SIZE, XATTR_VALUE_INODE_SIZE_MAX + 1);
        assert!(parse_xattr_block(&with_inode).is_err());
    }

    #[test]
    fn nul_names_index_zero_and_duplicate_names_are_rejected() {
        let entries = vec![entry(1, b"a", b"1234"), entry(1, b"b", b"5678")];
        let good = encode_xattr_block(&entries, 1, 1024).unwrap();
        let first = XATTR_BLOCK_HEADER_SIZE;
        let mut bad = good.clone();
        bad[first + off::E_NAME] = 0;
        assert!(corrupted_reason(parse_xattr_block(&bad)).contains("NUL"));
        let mut bad = good.clone();
        bad[first + entry_len(1) + off::E_NAME] = b'a';
        assert!(corrupted_reason(parse_xattr_block(&bad)).contains("twice"));
        let mut bad = good.clone();
        bad[first + off::E_NAME_INDEX] = 0;
        assert!(corrupted_reason(parse_xattr_block(&bad)).contains("index 0"));
    }

    #[test]
    fn random_bytes_never_panic_the_xattr_parsers() {
        let mut rng = Rng::from_env("xattr");
        for _ in 0..5000 {
            let len = rng.below(1100) as usize;
            let mut bytes = rng.bytes(len);
            if len >= 4 && rng.below(2) == 0 {
                put_le32(&mut bytes, 0, XATTR_MAGIC);
            }
            if len >= 12 && rng.below(2) == 0 {
                put_le32(&mut bytes, off::H_BLOCKS, 1);
            }
            exercise(&bytes);
        }
    }

    #[test]
    fn mutated_valid_areas_and_blocks_never_panic_and_reencode_faithfully() {
        let mut rng = Rng::from_env("xattr");
        let entries = sample_entries();
        let block = encode_xattr_block(&entries, 1, 1024).unwrap();
        let area = encode_inode_xattrs(&entries[..3], 160).unwrap();
        for _ in 0..5000 {
            let mut bytes = if rng.below(2) == 0 { block.clone() } else { area.clone() };
            for _ in 0..=rng.below(4) {
                let at = rng.below(bytes.len() as u64) as usize;
                bytes[at] = match rng.below(3) {
                    0 => 0,
                    1 => 0xFF,
                    _ => rng.next() as u8,
                };
            }
            exercise(&bytes);
        }
    }

    /// Every parser on `bytes`; whatever parses must re-encode (when it fits) to the same list.
    fn exercise(bytes: &[u8]) {
        let _ = xattr_block_hashes_ok(bytes);
        let _ = xattr_block_checksum_ok(1, 2, bytes);
        if let Ok((header, parsed)) = parse_xattr_block(bytes) {
            let size = bytes.len() / 4 * 4;
            if size <= XATTR_BLOCK_SIZE_MAX {
                if let Some(again) = encode_xattr_block(&parsed, header.refcount, size) {
                    let (_, reparsed) = parse_xattr_block(&again).unwrap();
                    let mut expected = parsed.clone();
                    expected.sort_by(|a, b| a.sort_key().cmp(&b.sort_key()));
                    assert_eq!(reparsed, expected);
                }
            }
        }
        if let Ok(parsed) = parse_inode_xattrs(bytes) {
            if let Some(again) = encode_inode_xattrs(&parsed, bytes.len()) {
                assert_eq!(parse_inode_xattrs(&again).unwrap(), parsed);
            }
        }
    }
}
