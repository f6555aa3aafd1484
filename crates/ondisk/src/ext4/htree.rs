//! Hashed directory indexes (htree, the dir_index feature): the name hashes of
//! `fs/ext4/hash.c` / e2fsprogs `lib/ext2fs/dirhash.c`, the index blocks of `fs/ext4/namei.c`,
//! and the index-block checksum.
//!
//! An indexed directory keeps its entries in ordinary leaf blocks (see [`super::dir`]) and adds
//! an index over their name hashes. Block 0 is the root:
//!
//! | offset | size | field                                                            |
//! |--------|------|------------------------------------------------------------------|
//! | 0      | 12   | "." record (rec_len 12)                                          |
//! | 12     | 12   | ".." record whose rec_len covers the rest of the block           |
//! | 24     | 8    | `dx_root_info`: reserved_zero u32, hash_version, info_length (8), |
//! |        |      | indirect_levels, unused_flags                                    |
//! | 32     | 4    | `dx_countlimit`: limit u16, count u16 (over entry 0's hash)       |
//! | 36     | 4    | entry 0's block                                                  |
//! | 40     | 8·n  | `dx_entry` {hash u32, block u32} for entries 1..count            |
//!
//! An interior node (only with `indirect_levels` = 1) starts with a fake record (inode 0,
//! rec_len = block size, name_len 0) and has its count/limit at offset 8. Entry `i` covers the
//! hashes from its own hash up to the next entry's; entry 0's range starts at the parent's
//! bound. Bit 0 of an entry's hash is the collision bit: set when the entries of that hash
//! continue from the previous block. With metadata_csum, `limit` leaves room for an 8-byte
//! `dx_tail` {reserved u32, checksum u32} right after the `limit` entries.
//!
//! Invariants kept here:
//! - Parsers validate everything one block can say about itself, as `dx_probe` and e2fsck
//!   pass 2 do: the fake records, `info_length` 8, a hash version of 0..=2, at most two indirect
//!   levels (two only with largedir: the `fs` layer checks the feature), `limit` equal to the
//!   computed limit,
//!   `1 <= count <= limit`, hashes in order and no entry pointing at block 0. Whether block
//!   numbers lie inside the directory is the `fs` layer's check.
//! - Encoders write whole blocks from the parsed form, so what they write parses back to it.
//! - Hash functions match the kernel bit for bit (the tests hold them to values from
//!   e2fsprogs' debugfs), including the signed/unsigned `char` variants and the kernel's
//!   adjustment of the 32-bit EOF hash.

use super::bytes::{le16, le32, put_le16, put_le32};
use super::dir::{dir_rec_len, rec_len_from_disk, rec_len_to_disk, DIR_BLOCK_SIZE_MAX};
use crate::crc::crc32c_raw;
use crate::OnDiskError;

/// Hash versions (`DX_HASH_*`). On disk a root holds 0..=2; the unsigned variants are what the
/// kernel uses when the superblock's `s_flags` has EXT2_FLAGS_UNSIGNED_HASH.
pub const DX_HASH_LEGACY: u8 = 0;
pub const DX_HASH_HALF_MD4: u8 = 1;
pub const DX_HASH_TEA: u8 = 2;
pub const DX_HASH_LEGACY_UNSIGNED: u8 = 3;
pub const DX_HASH_HALF_MD4_UNSIGNED: u8 = 4;
pub const DX_HASH_TEA_UNSIGNED: u8 = 5;
/// Casefolded + encrypted directories; quill implements neither.
pub const DX_HASH_SIPHASH: u8 = 6;
/// The seed used when the superblock's `s_hash_seed` is all zero.
pub const DX_HASH_DEFAULT_SEED: [u32; 4] = [0x6745_2301, 0xefcd_ab89, 0x98ba_dcfe, 0x1032_5476];
/// `EXT4_HTREE_EOF_32BIT`: the 32-bit readdir position past the last entry. No name may hash to
/// `EOF << 1`, so the kernel moves that one hash down by 2.
pub const HTREE_EOF_32BIT: u32 = 0x7fff_ffff;
/// Bit 0 of an index entry's hash: this block continues the previous block's last hash.
pub const DX_HASH_CONTINUED: u32 = 1;
/// The bits of an index entry's block number that are a block number (`dx_get_block`).
pub const DX_BLOCK_MASK: u32 = 0x0fff_ffff;
/// Deepest index without the largedir feature: a root and one level of nodes
/// (`ext4_dir_htree_level`).
pub const DX_INDIRECT_LEVELS_MAX: u8 = 1;
/// Deepest index with largedir: a root and two levels of nodes.
pub const DX_INDIRECT_LEVELS_MAX_LARGEDIR: u8 = 2;

pub const DX_ENTRY_SIZE: usize = 8;
pub const DX_TAIL_SIZE: usize = 8;
/// Where `dx_root_info` starts in the root.
pub const DX_ROOT_INFO_OFFSET: usize = 24;
/// `dx_root_info.info_length`, the only value the kernel accepts.
pub const DX_ROOT_INFO_LEN: usize = 8;
/// Where the count/limit (and so the entries) start in a root and in a node.
pub const DX_ROOT_COUNT_OFFSET: usize = DX_ROOT_INFO_OFFSET + DX_ROOT_INFO_LEN;
pub const DX_NODE_COUNT_OFFSET: usize = 8;
/// Smallest block an index lives in (ext4's smallest block size).
pub const DX_BLOCK_SIZE_MIN: usize = 1024;

const _: () = assert!(DX_ROOT_INFO_OFFSET == dir_rec_len(1) + dir_rec_len(2));
const _: () = assert!(DX_ROOT_COUNT_OFFSET == 32);
const _: () = assert!(DX_NODE_COUNT_OFFSET == dir_rec_len(0));

mod off {
    pub const INFO_RESERVED_ZERO: usize = 24;
    pub const INFO_HASH_VERSION: usize = 28;
    pub const INFO_LENGTH: usize = 29;
    pub const INFO_INDIRECT_LEVELS: usize = 30;
    pub const INFO_UNUSED_FLAGS: usize = 31;
    /// Inside a count/limit.
    pub const LIMIT: usize = 0;
    pub const COUNT: usize = 2;
    /// Inside a record header.
    pub const REC_INODE: usize = 0;
    pub const REC_LEN: usize = 4;
    pub const REC_NAME_LEN: usize = 6;
    pub const REC_FILE_TYPE: usize = 7;
    pub const REC_NAME: usize = 8;
}

// ---------------------------------------------------------------------------------------------
// Hashes

/// The (major, minor) hash of `name` for hash `version` (0..=5, see `DX_HASH_*`) and the
/// superblock's `s_hash_seed` (all zero: [`DX_HASH_DEFAULT_SEED`]), as `ext4fs_dirhash`
/// computes it: the major hash has bit 0 clear and is never `HTREE_EOF_32BIT << 1`; legacy
/// hashes have minor 0.
pub fn dx_hash(name: &[u8], version: u8, seed: &[u32; 4]) -> Result<(u32, u32), OnDiskError> {
    let mut buf = if seed.iter().all(|&w| w == 0) { DX_HASH_DEFAULT_SEED } else { *seed };
    let unsigned = version >= DX_HASH_LEGACY_UNSIGNED;
    let (hash, minor) = match version {
        DX_HASH_LEGACY | DX_HASH_LEGACY_UNSIGNED => (legacy_hash(name, unsigned), 0),
        DX_HASH_HALF_MD4 | DX_HASH_HALF_MD4_UNSIGNED => {
            // Each 32-byte chunk is padded with the length of what remains from it onwards.
            for start in (0..name.len()).step_by(32) {
                let input = str_to_hash_buf::<8>(&name[start..], unsigned);
                half_md4_transform(&mut buf, &input);
            }
            (buf[1], buf[2])
        }
        DX_HASH_TEA | DX_HASH_TEA_UNSIGNED => {
            for start in (0..name.len()).step_by(16) {
                let input = str_to_hash_buf::<4>(&name[start..], unsigned);
                tea_transform(&mut buf, &input);
            }
            (buf[0], buf[1])
        }
        DX_HASH_SIPHASH => {
            return Err(OnDiskError::unsupported(
                "htree hash",
                "siphash (casefolded encrypted directories)",
            ))
        }
        other => return Err(OnDiskError::unsupported("htree hash", format!("version {other}"))),
    };
    let mut hash = hash & !1;
    if hash == HTREE_EOF_32BIT << 1 {
        hash = (HTREE_EOF_32BIT - 1) << 1;
    }
    Ok((hash, minor))
}

/// A name byte as the C code sees it: through `signed char` (sign-extended) or `unsigned char`.
fn char_value(byte: u8, unsigned: bool) -> u32 {
    if unsigned {
        u32::from(byte)
    } else {
        byte as i8 as i32 as u32
    }
}

/// `dx_hack_hash`: the original ext3 hash, 31 bits shifted left by one.
fn legacy_hash(name: &[u8], unsigned: bool) -> u32 {
    let (mut hash0, mut hash1) = (0x12a3_fe2du32, 0x37ab_e8f9u32);
    for &byte in name {
        let mixed = char_value(byte, unsigned).wrapping_mul(7_152_373);
        let mut hash = hash1.wrapping_add(hash0 ^ mixed);
        if hash & 0x8000_0000 != 0 {
            hash = hash.wrapping_sub(0x7fff_ffff);
        }
        hash1 = hash0;
        hash0 = hash;
    }
    hash0 << 1
}

/// `str2hashbuf`: packs up to `N * 4` bytes of `rest` (the name from the current chunk to its
/// end) big-end-first into `N` words, filling the unused words with a pad made from the length
/// of `rest`.
fn str_to_hash_buf<const N: usize>(rest: &[u8], unsigned: bool) -> [u32; N] {
    let len = rest.len() as u32;
    let mut pad = len | (len << 8);
    pad |= pad << 16;
    let mut out = [pad; N];
    let mut val = pad;
    let mut word = 0;
    for (i, &byte) in rest.iter().take(N * 4).enumerate() {
        val = char_value(byte, unsigned).wrapping_add(val << 8);
        if i % 4 == 3 {
            out[word] = val;
            word += 1;
            val = pad;
        }
    }
    if word < N {
        out[word] = val;
    }
    out
}

/// The cut-down MD4 transform of `half_md4_transform` (lib/halfmd4.c): three rounds of eight
/// steps over eight input words.
fn half_md4_transform(buf: &mut [u32; 4], input: &[u32; 8]) {
    const K1: u32 = 0;
    const K2: u32 = 0o13240474631;
    const K3: u32 = 0o15666365641;
    let f = |x: u32, y: u32, z: u32| z ^ (x & (y ^ z));
    let g = |x: u32, y: u32, z: u32| (x & y).wrapping_add((x ^ y) & z);
    let h = |x: u32, y: u32, z: u32| x ^ y ^ z;
    let step =
        |a: u32, mix: u32, x: u32, s: u32| a.wrapping_add(mix).wrapping_add(x).rotate_left(s);
    let [mut a, mut b, mut c, mut d] = *buf;

    // Round 1.
    for &(i, j, k, l) in &[(0, 1, 2, 3), (4, 5, 6, 7)] {
        a = step(a, f(b, c, d), input[i].wrapping_add(K1), 3);
        d = step(d, f(a, b, c), input[j].wrapping_add(K1), 7);
        c = step(c, f(d, a, b), input[k].wrapping_add(K1), 11);
        b = step(b, f(c, d, a), input[l].wrapping_add(K1), 19);
    }
    // Round 2.
    for &(i, j, k, l) in &[(1, 3, 5, 7), (0, 2, 4, 6)] {
        a = step(a, g(b, c, d), input[i].wrapping_add(K2), 3);
        d = step(d, g(a, b, c), input[j].wrapping_add(K2), 5);
        c = step(c, g(d, a, b), input[k].wrapping_add(K2), 9);
        b = step(b, g(c, d, a), input[l].wrapping_add(K2), 13);
    }
    // Round 3.
    for &(i, j, k, l) in &[(3, 7, 2, 6), (1, 5, 0, 4)] {
        a = step(a, h(b, c, d), input[i].wrapping_add(K3), 3);
        d = step(d, h(a, b, c), input[j].wrapping_add(K3), 9);
        c = step(c, h(d, a, b), input[k].wrapping_add(K3), 11);
        b = step(b, h(c, d, a), input[l].wrapping_add(K3), 15);
    }

    buf[0] = buf[0].wrapping_add(a);
    buf[1] = buf[1].wrapping_add(b);
    buf[2] = buf[2].wrapping_add(c);
    buf[3] = buf[3].wrapping_add(d);
}

/// `TEA_transform`: 16 rounds of TEA in a Davies-Meyer construction over four input words.
fn tea_transform(buf: &mut [u32; 4], input: &[u32; 4]) {
    const DELTA: u32 = 0x9E37_79B9;
    let (mut b0, mut b1) = (buf[0], buf[1]);
    let [a, b, c, d] = *input;
    let mut sum = 0u32;
    for _ in 0..16 {
        sum = sum.wrapping_add(DELTA);
        b0 = b0.wrapping_add(
            (b1 << 4).wrapping_add(a) ^ b1.wrapping_add(sum) ^ (b1 >> 5).wrapping_add(b),
        );
        b1 = b1.wrapping_add(
            (b0 << 4).wrapping_add(c) ^ b0.wrapping_add(sum) ^ (b0 >> 5).wrapping_add(d),
        );
    }
    buf[0] = buf[0].wrapping_add(b0);
    buf[1] = buf[1].wrapping_add(b1);
}

// ---------------------------------------------------------------------------------------------
// Index blocks

/// Entries a root can hold (`dx_root_limit`): 507 in 4 KiB with metadata_csum, 508 without.
pub fn dx_root_limit(block_size: usize, has_csum: bool) -> usize {
    let tail = if has_csum { DX_TAIL_SIZE } else { 0 };
    block_size.saturating_sub(DX_ROOT_COUNT_OFFSET + tail) / DX_ENTRY_SIZE
}

/// Entries a node can hold (`dx_node_limit`): 510 in 4 KiB with metadata_csum, 511 without.
pub fn dx_node_limit(block_size: usize, has_csum: bool) -> usize {
    let tail = if has_csum { DX_TAIL_SIZE } else { 0 };
    block_size.saturating_sub(DX_NODE_COUNT_OFFSET + tail) / DX_ENTRY_SIZE
}

/// One index entry: hashes from `hash` on live in directory block `block`. In entry 0 of a
/// block the hash field holds the count/limit instead; parsers report it as 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DxEntry {
    pub hash: u32,
    pub block: u32,
}

/// The root of an index (directory block 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DxRoot {
    /// The fake "." and ".." records in front of the index.
    pub dot_inode: u32,
    pub dot_file_type: u8,
    pub dotdot_inode: u32,
    pub dotdot_file_type: u8,
    /// On-disk hash version, 0..=2 (the unsigned variants come from the superblock).
    pub hash_version: u8,
    /// 0: entries point at leaves; 1: at nodes.
    pub indirect_levels: u8,
    /// 1..=limit entries; `entries[0].hash` is 0.
    pub entries: Vec<DxEntry>,
}

/// Decodes and checks the root of an indexed directory (see the module documentation).
/// `has_csum`: metadata_csum, which reserves the `dx_tail`.
pub fn parse_dx_root(block: &[u8], has_csum: bool) -> Result<DxRoot, OnDiskError> {
    let size = check_block_size(block, "htree root")?;
    let dot = fake_record(block, 0, b".", 12, "htree root")?;
    let dotdot = fake_record(block, 12, b"..", size - 12, "htree root")?;
    let info_length = usize::from(block[off::INFO_LENGTH]);
    let reserved_zero = le32(block, off::INFO_RESERVED_ZERO);
    if reserved_zero != 0 || info_length != DX_ROOT_INFO_LEN {
        return Err(root_corrupted(format!(
            "dx_root_info reserved_zero {reserved_zero:#x}, info_length {info_length}"
        )));
    }
    let hash_version = block[off::INFO_HASH_VERSION];
    match hash_version {
        DX_HASH_LEGACY | DX_HASH_HALF_MD4 | DX_HASH_TEA => {}
        DX_HASH_SIPHASH => {
            return Err(OnDiskError::unsupported("htree root", "siphash directory index"))
        }
        other => return Err(root_corrupted(format!("unknown hash version {other}"))),
    }
    let indirect_levels = block[off::INFO_INDIRECT_LEVELS];
    if indirect_levels > DX_INDIRECT_LEVELS_MAX_LARGEDIR {
        return Err(root_corrupted(format!("{indirect_levels} indirect levels")));
    }
    let flags = block[off::INFO_UNUSED_FLAGS];
    if flags & 1 != 0 {
        return Err(root_corrupted(format!("unimplemented hash flags {flags:#x}")));
    }
    let entries =
        parse_entries(block, DX_ROOT_COUNT_OFFSET, dx_root_limit(size, has_csum), "htree root")?;
    Ok(DxRoot {
        dot_inode: dot.0,
        dot_file_type: dot.1,
        dotdot_inode: dotdot.0,
        dotdot_file_type: dotdot.1,
        hash_version,
        indirect_levels,
        entries,
    })
}

/// Decodes and checks an interior node of an index; returns its 1..=limit entries
/// (`entries[0].hash` is 0: the node's lower bound is its parent entry's hash).
pub fn parse_dx_node(block: &[u8], has_csum: bool) -> Result<Vec<DxEntry>, OnDiskError> {
    let size = check_block_size(block, "htree node")?;
    let inode = le32(block, off::REC_INODE);
    let rec_len = rec_len_from_disk(le16(block, off::REC_LEN), size);
    let name_len = block[off::REC_NAME_LEN];
    if inode != 0 || rec_len != size || name_len != 0 {
        return Err(OnDiskError::corrupted(
            "htree node",
            format!("fake record has inode {inode}, rec_len {rec_len}, name_len {name_len}"),
        ));
    }
    parse_entries(block, DX_NODE_COUNT_OFFSET, dx_node_limit(size, has_csum), "htree node")
}

fn check_block_size(block: &[u8], what: &'static str) -> Result<usize, OnDiskError> {
    let size = block.len();
    if !size.is_power_of_two() || !(DX_BLOCK_SIZE_MIN..=DIR_BLOCK_SIZE_MAX).contains(&size) {
        return Err(OnDiskError::corrupted(what, format!("{size}-byte block")));
    }
    Ok(size)
}

/// Checks one of the root's fake "." / ".." records; returns its inode and file type.
fn fake_record(
    block: &[u8],
    at: usize,
    name: &[u8],
    rec_len_expected: usize,
    what: &'static str,
) -> Result<(u32, u8), OnDiskError> {
    let inode = le32(block, at + off::REC_INODE);
    let rec_len = rec_len_from_disk(le16(block, at + off::REC_LEN), block.len());
    let name_len = usize::from(block[at + off::REC_NAME_LEN]);
    let name_at = at + off::REC_NAME;
    if inode == 0
        || rec_len != rec_len_expected
        || name_len != name.len()
        || &block[name_at..name_at + name.len()] != name
    {
        return Err(OnDiskError::corrupted(
            what,
            format!(
                "{:?} record at {at}: inode {inode}, rec_len {rec_len} (want \
                 {rec_len_expected}), name_len {name_len}",
                String::from_utf8_lossy(name)
            ),
        ));
    }
    Ok((inode, block[at + off::REC_FILE_TYPE]))
}

fn parse_entries(
    block: &[u8],
    count_offset: usize,
    limit_expected: usize,
    what: &'static str,
) -> Result<Vec<DxEntry>, OnDiskError> {
    let limit = usize::from(le16(block, count_offset + off::LIMIT));
    let count = usize::from(le16(block, count_offset + off::COUNT));
    if limit != limit_expected {
        return Err(OnDiskError::corrupted(what, format!("limit {limit}, want {limit_expected}")));
    }
    if count == 0 || count > limit {
        return Err(OnDiskError::corrupted(what, format!("count {count}, limit {limit}")));
    }
    // count <= limit and limit entries fit the block by construction of the limit.
    let mut entries = Vec::with_capacity(count);
    for i in 0..count {
        let at = count_offset + i * DX_ENTRY_SIZE;
        let hash = if i == 0 { 0 } else { le32(block, at) };
        let block_nr = le32(block, at + 4) & DX_BLOCK_MASK;
        if block_nr == 0 {
            return Err(OnDiskError::corrupted(what, format!("entry {i} points at block 0")));
        }
        // e2fsck compares hashes without the collision bit.
        if let Some(prev) = entries.last().filter(|_| i >= 2).map(|e: &DxEntry| e.hash) {
            if hash & !DX_HASH_CONTINUED < prev & !DX_HASH_CONTINUED {
                return Err(OnDiskError::corrupted(
                    what,
                    format!("entry {i} hash {hash:#x} below the previous {prev:#x}"),
                ));
            }
        }
        entries.push(DxEntry { hash, block: block_nr });
    }
    Ok(entries)
}

/// Writes `root` as a whole root block (everything else zeroed, the dx_tail's checksum
/// included: set it with [`set_dx_checksum`]).
pub fn encode_dx_root(block: &mut [u8], root: &DxRoot, has_csum: bool) {
    let size = block.len();
    let limit = dx_root_limit(size, has_csum);
    assert!(
        size.is_power_of_two() && (DX_BLOCK_SIZE_MIN..=DIR_BLOCK_SIZE_MAX).contains(&size),
        "{size}-byte htree root"
    );
    assert!(root.hash_version <= DX_HASH_TEA, "on-disk hash version {}", root.hash_version);
    assert!(
        root.indirect_levels <= DX_INDIRECT_LEVELS_MAX_LARGEDIR,
        "{} levels",
        root.indirect_levels
    );
    block.fill(0);
    put_record(block, 0, root.dot_inode, 12, root.dot_file_type, b".");
    put_record(block, 12, root.dotdot_inode, size - 12, root.dotdot_file_type, b"..");
    block[off::INFO_HASH_VERSION] = root.hash_version;
    block[off::INFO_LENGTH] = DX_ROOT_INFO_LEN as u8;
    block[off::INFO_INDIRECT_LEVELS] = root.indirect_levels;
    put_entries(block, DX_ROOT_COUNT_OFFSET, limit, &root.entries);
}

/// Writes a whole node block holding `entries` (`entries[0].hash` is not stored).
pub fn encode_dx_node(block: &mut [u8], entries: &[DxEntry], has_csum: bool) {
    let size = block.len();
    assert!(
        size.is_power_of_two() && (DX_BLOCK_SIZE_MIN..=DIR_BLOCK_SIZE_MAX).contains(&size),
        "{size}-byte htree node"
    );
    block.fill(0);
    put_le16(block, off::REC_LEN, rec_len_to_disk(size, size));
    put_entries(block, DX_NODE_COUNT_OFFSET, dx_node_limit(size, has_csum), entries);
}

fn put_record(block: &mut [u8], at: usize, inode: u32, rec_len: usize, ft: u8, name: &[u8]) {
    assert!(inode != 0, "fake {:?} record for inode 0", String::from_utf8_lossy(name));
    put_le32(block, at + off::REC_INODE, inode);
    put_le16(block, at + off::REC_LEN, rec_len_to_disk(rec_len, block.len()));
    block[at + off::REC_NAME_LEN] = name.len() as u8;
    block[at + off::REC_FILE_TYPE] = ft;
    block[at + off::REC_NAME..at + off::REC_NAME + name.len()].copy_from_slice(name);
}

fn put_entries(block: &mut [u8], count_offset: usize, limit: usize, entries: &[DxEntry]) {
    assert!((1..=limit).contains(&entries.len()), "{} index entries, limit {limit}", entries.len());
    for (i, entry) in entries.iter().enumerate() {
        let at = count_offset + i * DX_ENTRY_SIZE;
        assert!(entry.block != 0 && entry.block <= DX_BLOCK_MASK, "index entry {entry:?}");
        if i > 0 {
            put_le32(block, at, entry.hash);
        }
        put_le32(block, at + 4, entry.block);
    }
    put_le16(block, count_offset + off::LIMIT, limit as u16);
    put_le16(block, count_offset + off::COUNT, entries.len() as u16);
}

/// Where the count/limit of an index block is, judged from its first record the way
/// `get_dx_countlimit` does: a record covering the whole block is a node (offset 8); "." of
/// length 12 followed by ".." covering the rest and a sane `dx_root_info` is a root (32).
fn dx_count_offset(block: &[u8]) -> Option<usize> {
    let size = block.len();
    if !(DX_BLOCK_SIZE_MIN..=DIR_BLOCK_SIZE_MAX).contains(&size) {
        return None;
    }
    match rec_len_from_disk(le16(block, off::REC_LEN), size) {
        len if len == size => Some(DX_NODE_COUNT_OFFSET),
        12 if rec_len_from_disk(le16(block, 12 + off::REC_LEN), size) == size - 12
            && le32(block, off::INFO_RESERVED_ZERO) == 0
            && usize::from(block[off::INFO_LENGTH]) == DX_ROOT_INFO_LEN =>
        {
            Some(DX_ROOT_COUNT_OFFSET)
        }
        _ => None,
    }
}

/// The index-block checksum (`ext4_dx_csum`): crc32c seeded with the directory inode's seed
/// over the block up to the last used entry, then over the 8-byte `dx_tail` (which sits after
/// `limit` entries) with its checksum field as zero. None when the block's layout leaves no
/// place for the tail or its count exceeds its limit.
pub fn dx_csum(inode_csum_seed: u32, block: &[u8]) -> Option<u32> {
    let count_offset = dx_count_offset(block)?;
    let limit = usize::from(le16(block, count_offset + off::LIMIT));
    let count = usize::from(le16(block, count_offset + off::COUNT));
    let tail = count_offset + limit * DX_ENTRY_SIZE;
    if count > limit || tail + DX_TAIL_SIZE > block.len() {
        return None;
    }
    let crc = crc32c_raw(inode_csum_seed, &block[..count_offset + count * DX_ENTRY_SIZE]);
    let crc = crc32c_raw(crc, &block[tail..tail + 4]);
    Some(crc32c_raw(crc, &[0; 4]))
}

/// Stores the checksum in the `dx_tail` of an index block this crate encoded (or parsed: the
/// layout is then known to have a tail).
pub fn set_dx_checksum(inode_csum_seed: u32, block: &mut [u8]) {
    let checksum = dx_csum(inode_csum_seed, block).expect("index block without room for dx_tail");
    let at = dx_tail_offset(block).expect("index block without room for dx_tail");
    put_le32(block, at + 4, checksum);
}

/// Whether the `dx_tail` of an index block holds the right checksum
/// (`ext4_dx_csum_verify`); false when there is no tail to check.
pub fn dx_checksum_ok(inode_csum_seed: u32, block: &[u8]) -> bool {
    match (dx_csum(inode_csum_seed, block), dx_tail_offset(block)) {
        (Some(checksum), Some(at)) => le32(block, at + 4) == checksum,
        _ => false,
    }
}

fn dx_tail_offset(block: &[u8]) -> Option<usize> {
    let count_offset = dx_count_offset(block)?;
    let limit = usize::from(le16(block, count_offset + off::LIMIT));
    let tail = count_offset + limit * DX_ENTRY_SIZE;
    (tail + DX_TAIL_SIZE <= block.len()).then_some(tail)
}

fn root_corrupted(reason: String) -> OnDiskError {
    OnDiskError::corrupted("htree root", reason)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ext4::dir::FT_DIR;
    use crate::testing::Rng;

    fn sample_root(has_csum: bool, levels: u8, entries: &[DxEntry]) -> Vec<u8> {
        let mut block = vec![0u8; 4096];
        let root = DxRoot {
            dot_inode: 12,
            dot_file_type: FT_DIR,
            dotdot_inode: 2,
            dotdot_file_type: FT_DIR,
            hash_version: DX_HASH_HALF_MD4,
            indirect_levels: levels,
            entries: entries.to_vec(),
        };
        encode_dx_root(&mut block, &root, has_csum);
        block
    }

    fn e(hash: u32, block: u32) -> DxEntry {
        DxEntry { hash, block }
    }

    #[test]
    fn limits_match_the_kernel_for_every_block_size() {
        assert_eq!((dx_root_limit(4096, false), dx_root_limit(4096, true)), (508, 507));
        assert_eq!((dx_node_limit(4096, false), dx_node_limit(4096, true)), (511, 510));
        assert_eq!((dx_root_limit(1024, false), dx_root_limit(1024, true)), (124, 123));
        assert_eq!((dx_node_limit(1024, false), dx_node_limit(1024, true)), (127, 126));
        assert_eq!(dx_node_limit(65536, true), 8190);
    }

    #[test]
    fn root_encodes_and_parses_back_with_its_fake_dot_entries() {
        for has_csum in [false, true] {
            let entries = [e(0, 1), e(0x1000, 3), e(0x1001, 2), e(0x8000_0000, 4)];
            let block = sample_root(has_csum, 0, &entries);
            let root = parse_dx_root(&block, has_csum).unwrap();
            assert_eq!(root.entries, entries);
            assert_eq!((root.dot_inode, root.dotdot_inode), (12, 2));
            assert_eq!(block[off::REC_FILE_TYPE], FT_DIR);
            // The fake ".." covers the rest of the block, so a linear reader sees two entries.
            let records = super::super::dir::parse_dir_block_records(&block, false).unwrap();
            assert_eq!(records.len(), 2);
            assert_eq!(records[1].rec_len, 4096 - 12);
            // The other layout's limit does not match.
            assert!(parse_dx_root(&block, !has_csum).is_err());
        }
    }

    #[test]
    fn node_encodes_and_parses_back() {
        let mut block = vec![0u8; 1024];
        let entries = [e(0, 7), e(0x10, 8)];
        encode_dx_node(&mut block, &entries, true);
        assert_eq!(parse_dx_node(&block, true).unwrap(), entries);
        assert!(parse_dx_node(&block, false).is_err());
        // A node is one empty record to a linear reader.
        let records = super::super::dir::parse_dir_block_records(&block, false).unwrap();
        assert_eq!((records.len(), records[0].inode, records[0].rec_len), (1, 0, 1024));
    }

    #[test]
    fn malformed_roots_are_rejected() {
        type Edit = fn(&mut [u8]);
        let cases: [(&str, Edit); 11] = [
            ("dot rec_len", |b| put_le16(b, 4, 16)),
            ("dotdot rec_len", |b| put_le16(b, 16, 1000)),
            ("dotdot name", |b| b[12 + 9] = b'x'),
            ("reserved_zero", |b| b[24] = 1),
            ("info_length", |b| b[29] = 12),
            ("hash version 3 on disk", |b| b[28] = 3),
            ("indirect levels", |b| b[30] = 3),
            ("hash flag bit 0", |b| b[31] = 1),
            ("limit", |b| put_le16(b, 32, 100)),
            ("count above limit", |b| put_le16(b, 34, 600)),
            ("count zero", |b| put_le16(b, 34, 0)),
        ];
        for (name, edit) in cases {
            let mut block = sample_root(false, 0, &[e(0, 1), e(10, 2)]);
            edit(&mut block);
            let err = parse_dx_root(&block, false).expect_err(name);
            assert!(matches!(err, OnDiskError::Corrupted { .. }), "{name}: {err}");
        }
        let unordered = sample_root(false, 0, &[e(0, 1), e(10, 2), e(20, 3)]);
        let mut block = unordered.clone();
        put_le32(&mut block, 32 + 16, 4);
        assert!(parse_dx_root(&block, false).is_err(), "hashes out of order");
        let mut block = unordered;
        put_le32(&mut block, 32 + 12, 0);
        assert!(parse_dx_root(&block, false).is_err(), "entry pointing at the root");
        let mut largedir = sample_root(false, 0, &[e(0, 1)]);
        largedir[30] = 2;
        assert_eq!(parse_dx_root(&largedir, false).unwrap().indirect_levels, 2, "largedir's depth");
        largedir[30] = 3;
        assert!(matches!(parse_dx_root(&largedir, false), Err(OnDiskError::Corrupted { .. })));
    }

    #[test]
    fn index_checksum_covers_used_entries_and_the_tail_but_not_unused_slots() {
        let seed = 0x1234_5678;
        let mut root = sample_root(true, 0, &[e(0, 1), e(10, 2)]);
        set_dx_checksum(seed, &mut root);
        assert!(dx_checksum_ok(seed, &root));
        assert!(!dx_checksum_ok(seed + 1, &root));
        // By hand: bytes up to the last used entry, then the tail with a zero checksum.
        let tail = 32 + 507 * 8;
        assert_eq!(tail, 4088);
        let crc = crc32c_raw(seed, &root[..32 + 2 * 8]);
        let crc = crc32c_raw(crc32c_raw(crc, &root[tail..tail + 4]), &[0; 4]);
        assert_eq!(le32(&root, tail + 4), crc);
        let mut unused_slot = root.clone();
        unused_slot[32 + 3 * 8] ^= 1;
        assert!(dx_checksum_ok(seed, &unused_slot));
        let mut used = root.clone();
        used[32 + 8] ^= 1;
        assert!(!dx_checksum_ok(seed, &used));
        let mut node = vec![0u8; 1024];
        encode_dx_node(&mut node, &[e(0, 3)], true);
        set_dx_checksum(seed, &mut node);
        assert!(dx_checksum_ok(seed, &node));
        // Without the csum layout the tail would overlap the entries: nothing to verify.
        let no_room = sample_root(false, 0, &[e(0, 1)]);
        assert!(!dx_checksum_ok(seed, &no_room));
        assert!(!dx_checksum_ok(seed, &[0u8; 100]));
    }

    #[test]
    fn hashes_avoid_the_eof_position_and_keep_bit_zero_clear() {
        for version in 0..=5 {
            for name in [&b"a"[..], b"", &[0xFF; 255], b"0123456789abcdef0123456789abcdefX"] {
                let (major, _) = dx_hash(name, version, &[0; 4]).unwrap();
                assert_eq!(major & 1, 0);
                assert_ne!(major, HTREE_EOF_32BIT << 1);
            }
        }
        assert!(matches!(dx_hash(b"a", 6, &[0; 4]), Err(OnDiskError::Unsupported { .. })));
        assert!(dx_hash(b"a", 7, &[0; 4]).is_err());
        // An all-zero seed means the default seed.
        assert_eq!(dx_hash(b"abc", 1, &[0; 4]), dx_hash(b"abc", 1, &DX_HASH_DEFAULT_SEED));
    }

    #[test]
    fn random_and_mutated_index_blocks_never_panic_the_parsers() {
        let mut rng = Rng::from_env("htree block");
        let valid_root = sample_root(true, 1, &[e(0, 1), e(0x100, 2), e(0x201, 3)]);
        let mut valid_node = vec![0u8; 4096];
        encode_dx_node(&mut valid_node, &[e(0, 4), e(0x300, 5)], true);
        for round in 0..6000 {
            let mut block = match round % 3 {
                0 => valid_root.clone(),
                1 => valid_node.clone(),
                _ => {
                    let len = [4096usize, 1024, 2000, 16][rng.below(4) as usize];
                    (0..len).map(|_| rng.next() as u8).collect()
                }
            };
            for _ in 0..=rng.below(4) {
                let at = rng.below(block.len() as u64) as usize;
                block[at] = rng.next() as u8;
            }
            let has_csum = rng.below(2) == 0;
            if let Ok(root) = parse_dx_root(&block, has_csum) {
                let mut again = vec![0u8; block.len()];
                encode_dx_root(&mut again, &root, has_csum);
                assert_eq!(parse_dx_root(&again, has_csum).unwrap(), root);
            }
            if let Ok(entries) = parse_dx_node(&block, has_csum) {
                let mut again = vec![0u8; block.len()];
                encode_dx_node(&mut again, &entries, has_csum);
                assert_eq!(parse_dx_node(&again, has_csum).unwrap(), entries);
            }
            let _ = dx_checksum_ok(5, &block);
            let _ = super::super::dir::parse_dots(&block);
        }
    }

    /// splitmix64, the generator the debugfs tables below were made with (a Python copy of
    /// `debugfs_names` wrote the debugfs command file).
    struct SplitMix(u64);

    impl SplitMix {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
    }

    /// `count` names: the chunk-boundary lengths first (1..255 around 4, 16 and 32), then random
    /// lengths; two names in three mix in bytes >= 0x80, where the signed and unsigned hash
    /// variants differ. Printable bytes leave out the quotes, backslash and '#' that the debugfs
    /// command parser would interpret.
    fn debugfs_names(count: usize) -> Vec<Vec<u8>> {
        const LENGTHS: [usize; 24] = [
            1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 32, 33, 47, 48, 63, 64, 65, 100, 127, 128, 200,
            254, 255,
        ];
        let printable: Vec<u8> = (0x21..0x7F).filter(|b| !b"\"'\\#".contains(b)).collect();
        let mut rng = SplitMix(0x5eed_d1a5_4a54_0001);
        (0..count)
            .map(|i| {
                let len = match LENGTHS.get(i) {
                    Some(&len) => len,
                    None => 1 + (rng.next() % if i % 4 == 0 { 255 } else { 40 }) as usize,
                };
                (0..len)
                    .map(|_| {
                        let r = rng.next();
                        if i % 3 != 0 && r.is_multiple_of(2) {
                            0x80 + ((r >> 8) % 128) as u8
                        } else {
                            printable[((r >> 8) % printable.len() as u64) as usize]
                        }
                    })
                    .collect()
            })
            .collect()
    }

    /// Checks `dx_hash` against a table with one line per name of [`debugfs_names`]: ten hex
    /// words, the major hash of versions 0, 1 (+ minor), 2 (+ minor), 3, 4 (+ minor), 5 (+ minor).
    fn check_against_debugfs(table: &str, seed: &[u32; 4]) {
        let lines: Vec<&str> = table.split_whitespace().collect();
        let names = debugfs_names(lines.len());
        for (name, line) in names.iter().zip(&lines) {
            let words: Vec<u32> = (0..10)
                .map(|i| u32::from_str_radix(&line[i * 8..i * 8 + 8], 16).unwrap())
                .collect();
            let expected = [
                (0, words[0], 0),
                (1, words[1], words[2]),
                (2, words[3], words[4]),
                (3, words[5], 0),
                (4, words[6], words[7]),
                (5, words[8], words[9]),
            ];
            for (version, major, minor) in expected {
                assert_eq!(
                    dx_hash(name, version, seed).unwrap(),
                    (major, minor),
                    "version {version}, name {name:02x?}"
                );
            }
        }
    }

    /// debugfs 1.47.0 `dx_hash -h H -s 9c5f0a3e-71d2-4b8e-a6f4-2d13c08e5b97 -- NAME` for H in
    /// legacy, half_md4, tea, HASHALG_3, HASHALG_4, HASHALG_5 (the unsigned variants).
    const DEBUGFS_SEEDED: &str = "
b6f82444704a53d6fb7cfb849fa4f8d8a7a53667b6f82444704a53d6fb7cfb849fa4f8d8a7a53667
9b0e4a804cfd12ce2022c65f38d19cb02a95bbaf2f50b87eb8e58226acba51292ad2d5e88535199f
6a9dc0c059f823f645a51d032e9dbd90ec256de73a1e2cd0694646e600e8a8f9ad44a150c209fd4c
4524f8a89953f374516e643a0a208cbace951bd74524f8a89953f374516e643a0a208cbace951bd7
531749127b6f786aeb4187066eebb432ecd44d84fdc45f129e78e40aa990e9db3d1981dcad1061d9
237a3bc80e410b16fa3ab92c2988bf6e6884a51e36dd23b0742f76e6e93b7b0e2133d262366bf005
699e4e9207f70950d5f87a393f1f212839f8a1d7699e4e9207f70950d5f87a393f1f212839f8a1d7
ee988834fbd7a00a8a99453672c3c3ba702d162dff0bd75a6964d788a6f11bd46369074aabf764ec
6f286c4e3aea0ef44e4b5c505b58644a135604d7ab88624a0d6b2e62bbb877b6c509041e12258140
a5d18014acaa3334416e6207832e172a21f3eb90a5d18014acaa3334416e6207832e172a21f3eb90
8a731c5468779b2618e4b7495ad9e0ae5f662e2a77c4b51a07f5a98e54fac35693fccf663598a216
21d5a8cafa299ad406e60de9c127d490215a7be556b5ad32594bc8f0fae69f36363657daf974bf4b
042f2cbcfa7323bad66ebe80edef2c024df4d326042f2cbcfa7323bad66ebe80edef2c024df4d326
7e43f8c0caec86863fd1ae8cb53edc48c5e4b3ac793f61a89cd2468cd381fb6facf0a88e96ae81b4
c643b4728e592324b31356bf3a1e142cf32740202e0adb80d90a11bab65d69dec7a92568a765b87c
fd05c61698fa9fc037fde540c5eef8ea63f80309fd05c61698fa9fc037fde540c5eef8ea63f80309
098351a444b1d94ea8e560ec376840320d2f79fa675ba53eaf78395affc3383ded9417629c43ab61
46448c7853c4aa4a22aa14768d518480fd49d2bd8b1a856e9f57ba74998feda5080e0254c2dd6e54
1e25b552c4a5304af47dc3ca930d98c2c33e99501e25b552c4a5304af47dc3ca930d98c2c33e9950
e9734bc82e36b7564e0f8be80640719e845f90ca1d502fbe4e40a2647a0e79bff4ad243016eb739d
6605d2288b18b6dc9aaa1f8f11e69e4a5cb90b5d82aac0149c4171ccccda095bb3c8e678b8ff32a1
76b09f502ad5a34e789e658768e6deceae6412e876b09f502ad5a34e789e658768e6deceae6412e8
3476f866f90dc4ec501be8a91022b1809a51acf3d450115e4fbe37e85a3309da4e6ddcd6661b88dd
4c82b78ed7f5d77879b39df53b63ea761c292d00031b73a03e9f5742cb53c7db914cbb08170cce79
fab44a208920e480518df0763cc2c2bad04d3912fab44a208920e480518df0763cc2c2bad04d3912
c4e548f06076f702a39e50170cc9429a6b553295267bde64585cd9dae733fa2db2f8b1e4f0e28c72
368f5f68f906b68c9143306c956f895ac48fc8294302b68a72af513c7175f7e6fa473f7e1a1c0867
3468aee6c1d86f9e23ec63f491698222e06553e83468aee6c1d86f9e23ec63f491698222e06553e8
97d81c60ee901650ebaeea61582b9f2cda415679925cfc04dfb5dd705b26513f9c4da694792c2516
3f592ab2fa17bd12a9b0560cd1fe78567b49c47fea5c3dcec282d96eee865982c3441d1259909d5e
35c074e00187238ce1693487df5c341efa1f06c235c074e00187238ce1693487df5c341efa1f06c2
4b1a8dd864f32b8e4d2401577a49b65cef4151f56e9aade0ab870718a04fdb2db1038b4435f89ac6
790ec06ef80f055ed0bd58813ba128bca04acefa56d6aefe04fcb200f332c2750163708e23565597
0716acd6ddccabd2a9f2d6d446485b3828855c220716acd6ddccabd2a9f2d6d446485b3828855c22
e42ba228c433a29a1e05d5d1e1a817004235836a5684282afea8a26acfc5da852498dd9cc6ae2f7b
c0a7048c43d97bc2fe312d40d4262b34ffe6557ee91e0b726b162030e6bb3bdc3bb5898e2160ea14
587949761145cde2be0d5fbf20b4559a6f78d4e6587949761145cde2be0d5fbf20b4559a6f78d4e6
7dbb781216d68e58fe35e4151b26807ebcb80e6d1e2a6ffa5a537872b9fa7a931760cd361c3c1baa
8f2d54cc0e092baa73f1cf1cf94d4fded2bacc2a24dba0c0fe7d8574c67d30f015938ddca0dfeb14
5316283a489f48a008a0fd8e2fd37b7465f8a1185316283a489f48a008a0fd8e2fd37b7465f8a118
dba8c8fc9b780b82777b457002421b08e3a9dedeea6fccec2064fe6a03bba896ee8a31a4efc385da
163d7c0243676aeaa91f6d84029f449cb0e7fa83760f9f16ae1d176ccc6e4f79c2a13e18f1d4cd52
b03d199a8c35299a8c1459f3ce8c9ebce1cfa991b03d199a8c35299a8c1459f3ce8c9ebce1cfa991
ed4b981894e4103e28663b5a08491a42c42bab74e1fbae125c654f5697a671ca15ee593cf0336fcc
8171adfc88712d30a33f432b714ae630c30fbb2de155c69cf3e85e8ee87e25a45c9fedea1c703b36
91fd9a6a2a895d0a79d92c198504f1e61a41a0b191fd9a6a2a895d0a79d92c198504f1e61a41a0b1
0b95006c2ef3d8d6fbe97680b3b01c9ce4ef3af75ba0a4a4a826a5b2d664bad701601e749eab9996
537f14347668a07e30c6f1f811ab6ece1370679f5efbd572657e240cf7fbfe6b05fbba76fae2d15b
cb7ebd2e0aa5763a158b8d060ee15d44445e327ecb7ebd2e0aa5763a158b8d060ee15d44445e327e
8ffca79461cd28baa487a097bce54d4413e7db4f0f90c39628214fd623b284de7c19cf569ab157ae
e1183e0a2b3a58c4082432c8bcc5f27a5f6e8a9e190eebe835a5f5105467aae8ec5583d8cec073ea
6cec12de72c059b0b49d512086f2b4ae6f96a0f86cec12de72c059b0b49d512086f2b4ae6f96a0f8
5c5fed602bfb70e6f1dfd10532f60de2aa93aacfd624156cec82fa2c3256295e151f0e4e81074b5c
347e73a62f5baafaa9c379144ca30824963942ccc62dd158905f46b8bfea439340e1c1729663a24f
880d93a4b02574489eec5ade2a110f66e47f7728880d93a4b02574489eec5ade2a110f66e47f7728
172e1cf2a71bf31e83c3d7397f8462dc07cdfff0b1b51ff05aad6be8b20a0f017d012c6e5cd6e7dc
1c3020de442385e817b7354162486c1ad55ec27b1959ed7e2d5860f2804dc5eb8d03f23ee08410d7
f5c7ba1e6f28628421cef2c7791597daa3592e16f5c7ba1e6f28628421cef2c7791597daa3592e16
607a69d0fac963a4ab0719ddefbcae6ae0113017c269e2788faa165c52dce31d4094b474ccde1101
4bf10484da1ff7d65397bccc3e844526f576f05885e3adb2e039baec899477d707def41c5e45cc65
282198d038bfad4ae0393eb5d4195b7efc115464282198d038bfad4ae0393eb5d4195b7efc115464
06de9f8413016c449b4048d63577c7f04b97565c83a4c182216d25d0f8da2519306d8372576465cd
39760ed8275ae1ea19801bb4a4db7bf0670f6d9a65d6b1e6f273f5200cce958d348ca7d0e4107775
c275de8ed700d1c0c85e0055e423f402cc8e8a9cc275de8ed700d1c0c85e0055e423f402cc8e8a9c
70239042ca365fc4ef85f0be5e92c76a008682b246219860f3db731676cd341bf75e2b4e829701ca
a16275ded7d1ea7452254975a41130363ced797d19f9c5426cc96c1a76fa5741fa6397b8e428e174
f47499a8c4843cfe9597e18998e1e62a8494d69ff47499a8c4843cfe9597e18998e1e62a8494d69f
c2d2f0e07b65eca82da06b0dec5db4ee4595c6e7eec01328bc0d944e0820a7365a061dd205d7608a
1024895a6e3af11ccde57d6f8d18fe72c736f7ff2383fd740ef63da6f6a0f71d1eaecaee70a558c8
193ce6de992cb9de28807ae80bf8c3dc55990b02193ce6de992cb9de28807ae80bf8c3dc55990b02
b1e0f414827f817c81a47cca6c2eb8b47f66e4c24387f9b4078c1a222e0b32481a6f7248f11999ff
2cc3b6fcba8f8e84fe5540f1dedd902622f1cb8e4e697cfa42eb56f680ea2583cb56d2ea37dd1bda
68461dc630187d5adec83a3291739ec46e4c130e68461dc630187d5adec83a3291739ec46e4c130e
78ddce24c6400554425c503f514d2d7ca4a177c51310442ed567351cfcc191b9185c9936e3e8269f
ba96994292fdedd26899f9ab9c6c3a5cfa027b11f5b30d408d040ae4b790791e013865f6c5e392eb
32b588ec994fba94a430b6482f346cb4aaf6582132b588ec994fba94a430b6482f346cb4aaf65821
2eee4b9efd4eda28e5c0c926765c1fe0f421f8292dd499182160069af333d3bea64ef00e5a7f162f
cf75bb0a5f67c648b254238e5e593e5c3a8b53869f56e8f05f67c648b254238e5e593e5c3a8b5386
8264bfa0987a7da403a526530a6ecad237b0e0ed8264bfa0987a7da403a526530a6ecad237b0e0ed
afbbd4843aa6e990989cc39b2f1c3bdaf8d2b0ecda1f5936b1252446186e781bde6a1ca24176bd4f
f94356f6e64654beed06471cf4847dfe50aaa035bd0766d8f2be4b7cbc54e5827ff998020533025a
0c21e64ea214540478294743570fed8c56bcf7d70c21e64ea214540478294743570fed8c56bcf7d7
1864536cc3f87c0ef25e922c99c22e022ddfbb716fd4e2d26dc649a034dbe2e45e9469a8674eaf77
45d35226a67f68e64624934f80545930c92af616ec09684869273fa0bb0248474d38d6e0359a0a1e
e605243460508e325cabfa2efb1a6d32a4bcfda6e605243460508e325cabfa2efb1a6d32a4bcfda6
29f804baf5e44df40aa5c67bb19f8d0063900e1f11e91750a386f2724839121d8c6f4060e7794404
0d235cd8f128403a6beaca882b78bc8861755085abd0ce9ec1c20184837ef3a46d0bd8e87853fbee
b0746908364ed8ae1eaf295244bcc98a421ff105b0746908364ed8ae1eaf295244bcc98a421ff105
2b7cab86484cd94a5e315af912868812a33fe69256cf8b62cf73a38e58e619662345cb8287e10d67
fba5c9f65e76a01ef7f065ecda917bfa19bfe50adf76ca5677c6e7d2e01b7f9cb839b24edc0bdad9
5fb880dad6035cc241c836bdb8d16dea8b2d731d5fb880dad6035cc241c836bdb8d16dea8b2d731d
05e6d23ed78c412cfb5403ca210929c606eb4c28c820ec3c0d3a8288cf5fe75366663f6ac67ee669
bdea0ab2468588b8b4c327521f6c981860ba3aafcc6490b0f94829980cb97831ec9a43184238adea
b1b6826cb5776b9a1ede4a7339d5f0f019965c4eb1b6826cb5776b9a1ede4a7339d5f0f019965c4e
325f19f05f2018eeae943d4b970e21f284b0407e96d6ad6646e34ab64e876ec0ccf5def6f321e764
d9cabdec97d7441a2d588797d713302c27500524a4cac5f0cc4f54d0e215f719585ceb5a4fe5b6a2
ed1ded748baac83244429741eba5753ea4a88737ed1ded748baac83244429741eba5753ea4a88737
edabf52004cef5eaa55dfa7473eb0b78f137ab62a63746d24ba8a548e36df74aaa2f50c450ad2438
ac0c62ec51307d568a82cd9c78ca9f2cc247bba86ba198b0e65fc4e0357abdd3f5b9e8f8fb4bfad9
360e6a10009c1d847c462dcbfc357b82e867c17c360e6a10009c1d847c462dcbfc357b82e867c17c
e528d1beabc7179c405bbab6b9c0d794585e10fa28785be469bd6d04fb949d4acb691de2dd42b779
f7c8d00c8d27e164f96299efefa82b9c27da3b6c3d7737e07a672d84837da543fb1e935a0dea3661
26737b28d2c9f09876fc791e304f294664b2bbb326737b28d2c9f09876fc791e304f294664b2bbb3
39c4940c460afc8a58b077de01e7a34865453f3a0ee47166c8c67860d2e9d0b23e620fb278340e93
806c26f26d9883141260e57ed0b91b16c8d441cb3734729c1f3e24b20d2755c3d28efa9238f9b103
5baf90bcfee3b9dc8c9ba0700a5c5c84f34aeb135baf90bcfee3b9dc8c9ba0700a5c5c84f34aeb13
eec0f5220644fb1670662dcea3809b166a60e84d63b1a2e217c80080cf685f22a9dc280432475f0d
d8025a4cf052993caffab0d18addc56860aa280ef7973c3674a1b6c6bfa93c232b720bd8933d3a3f
56d4d0c61d2885fa878efab488bb8f8059d1937956d4d0c61d2885fa878efab488bb8f8059d19379
7f796ceab4c0383ad583a9321a5129e49f4ee64e59fee84e2342023eb88c9e6e86470b72d806a068
54869df00ddbc1dac17b2cb22e514c90bfc5d3fe0e5d31443d8c71b65c79329d4e1ab07033d5507e
ee7ee0b0f52c30c8b5629d0d687fe4a4efc6ed51ee7ee0b0f52c30c8b5629d0d687fe4a4efc6ed51
84ac8fec90952740fe39aa58d3f6ebb6baa754dcbea4e28c5b1fd52a79b737ab25ab53f67ed9d74a
ef63f3d0b9c317fccafe21082229c01409de571c2f464dd26d0073c6b71a86664d92770852f0b20c
df453042264a0aa4c136b2d8c9c8a788a4296a24df453042264a0aa4c136b2d8c9c8a788a4296a24
be58f32c19ce0aba039e31d678cfc9ea9a0eac43f00ecd2ce5a6be2a4e5ae588cea874b8ebe9e769
5fcc4736119d8f24e7e3fd5ce96385d0454bfe8b61048c8247b580a2e26fba4897109920b61b576b
907c35b47434fdfe6b89006211a0d648dcae83fd907c35b47434fdfe6b89006211a0d648dcae83fd
b752f0f0b66b89327272be0eae1bc72c995bd2d1a582b88eabae978e7d4a5fb59388a07e580f839e
5e127d5684ffd0f21c09d1cd1cf6964a60cd4816f25c8f56eb3489f43f2c4de2e36834988214a74d
ec470b2493147e3c72477e21d3408df822521d6aec470b2493147e3c72477e21d3408df822521d6a
b304e68c4394d2a66ce2f846eea09e5e05dee138d8cf2c8421d1400c3a7c62e9af5e7bd097c07fbf
7177c83acb90f9409f014ba1d36d088c3986a74abbee143eaf53d0ca860ed2960a0c69782dd6abfc
0297ecd4f99bf002b9d378a28dc7b3e45d64683f0297ecd4f99bf002b9d378a28dc7b3e45d64683f
9032256aa83b3df0e4187ef6b81e237850f27050a30b58502e546270cd5514f4768f9d543d409367
5d79b98ab66173182adf6ff87f0810a2a14f8c99ace7f41866f67b1eff170d0153a36c4eaede586e
193b1a502441c760f638b32bb760af3e3700b77a193b1a502441c760f638b32bb760af3e3700b77a
01c6071aeae3f60e117d2fcb13253564819e1f7adedddfca13192db4ea09aa2e622b94d250f29b64
c25b66b29b47ea6404138cdeebf05442f7fb3d2da1cd7e3cb5d942e8e17f979a5501b468c968e6a9
822ee5661fc0010eba730c68b226a5927f2f5c0a822ee5661fc0010eba730c68b226a5927f2f5c0a
f979e464ac7bce7eca28b554ee113fbeff159307ce7ae5fa828d06d03de5965d8aeba1b0ce7127f2
a376e912b4eafa2a8e55cd8115b8977c708fe5ab9943658ec802d6e25f67c871368ed51276b3800b
5bf8e01207507906dae7fbaaa3b7e4805af61f8d5bf8e01207507906dae7fbaaa3b7e4805af61f8d
b0dcbdc47e2056e6596aa0869d8466120aebf0efb380a5ae5c862016622bee0de31328ae270cd5ea
8d0d2ed6306955f8057ebdb022fddc2a3f1a55968b7fe408b0b9a3a8cbd78f48c60c56fe37f60ea0
7dcdad76c0311e2aedadfb0cdcb799c0518985607dcdad76c0311e2aedadfb0cdcb799c051898560
3d6becb0059015be6f4dac75e5dfbb88bc2672abe920b6f2816541664ba7aa9ce22638d83fb837bf
4276cdcaf41a2e5a23af640ffd3e3ac23a2704199563f4328acc08769db3dfa3d4980d3e0c147fb5
24aae6f671187a6a73951cdbbc048a063539085c24aae6f671187a6a73951cdbbc048a063539085c
4ad127c487351a4a6bc3c1a8bed1c474370f69f43bbf8f60a9200042bd790845c60c3b2cdf3dfdbe
3462d40abb139f1ecc3c5d8f9da55b10b16642a8c987b59ec56fc4082197a567c6db6a460781eb84
011848a09bf5e21c0e08edb0ee4f5c0acbdfb75e011848a09bf5e21c0e08edb0ee4f5c0acbdfb75e
150b31f281feef761f94bd2584c99434ce2bb4146392ab0a9deed76e09e8b1eb682a380c58821e84
94b22b3241f4ecd084ad15308b48b29abca02562449beb7e9565a01a1f64be6cf32facea93d9dc98
cf1537802c19586e1a56e6b63d1accb01bf9e275cf1537802c19586e1a56e6b63d1accb01bf9e275
81840e225aea94900d82553887bfcb28ed37b52081840e225aea94900d82553887bfcb28ed37b520
295da094f21f74aaf5752c085aa75652422356ddc2658e6cf3f74ca61997e1d16bf597369122032f
8ff8dc862977d842030ea0994e8162680ccbc4428ff8dc862977d842030ea0994e8162680ccbc442
a8bbbaba93b75d9a49b8533476b126a2892b688f5fdbeac0e4c680c8296ee9dea20b9c4a67db0945
1407e6d47e02e27a22b3bf754de4484e61cea589f573846afd85916a5117622ff28684a045c82def
b4aac174df42a8caa10179a32e89556a7f63c534b4aac174df42a8caa10179a32e89556a7f63c534
93decc2a70c76e240e83fcd2419f0958fa7ddccee649aa2aba9f15d0ae919e53ffd6dfaa39ff4207
8147d1ee9c17eb666eb20fd1d80eec2aa8d6ec3bc1630974cd44ef42c05910ac6d3eef080e6f3efb
3b743db42324569e2aa92ae30d6b8f8c464e2a193b743db42324569e2aa92ae30d6b8f8c464e2a19
0fbe0d881575e4f86e721b2f8bcb1aa212cd59f9e56e0d884cd74834b26973a2999a3cc05222e8d4
4ab76b50507c36103dfc9dc2ee0ec87ade2a431edcdbf3aeae370f644f4620756e13df8aa2924789
1e5b9f18d8a6ce8c0ca82dbb9893463ecacaa3041e5b9f18d8a6ce8c0ca82dbb9893463ecacaa304
8311dce08e750120138fd10b0ae4e808f06b9f930304c752ba81731eaaef120e26572e32266ca872
aa466db6f96eb32423cea794a28a72aad5972809aa466db6f96eb32423cea794a28a72aad5972809
25fbf10863f2e964e080812eb4c3761079880e5f25fbf10863f2e964e080812eb4c3761079880e5f
e695398a52b235ae85ff222aa99769208fb31e876349f038ca59c73e2831f16e532d1902079eaf36
1b607d703f2311208c1b805a7e23c9229ea946eb1b607d703f2311208c1b805a7e23c9229ea946eb
78c88f3813ef25307cd29e6017e50eb2cb84490578c88f3813ef25307cd29e6017e50eb2cb844905
1923b3fccda1aef250b606c5a5f65958b0645f1498d88994562286329fc8567ecf0166d0c8fe4e17
3b3ca4da2022a716b78bfb177c4d57ea917e85ca0312417aa8fadbf85b701fe34fda36aa2a698d06
e4499a5e14e28c88fb7f8b88df2d855a36e58352e4499a5e14e28c88fb7f8b88df2d855a36e58352
d480271a78ede9367e85a606d92c49a822c928eeea5fa7fe599251d2950c9e5527fefdecb9054cb3
266d2ed6d82890c440a2baccee1eca5eb9431d3fc19d7a4cbf4f5070a54e052c22a708fcbc73baec
70ed97c047108db0e7da69ce930976a2d88e49e670ed97c047108db0e7da69ce930976a2d88e49e6
d92b3a1a71c92fc2604f116784b376923b0f669c214f8f721760d3d6284fcdfb0c7830960365e511
2bb7c63a48681a0eb8d836aea8032fe66ab4da5c9e906dbc93cd6ee411c4b072f9d01aa81332882d
f5633164ee893b24bbe0d766f8a41fec55c902fff5633164ee893b24bbe0d766f8a41fec55c902ff
f4c2cfe6fa3362c0208369bbb64f50627f6d85810db282cce77a4988c330858e37ac217cf5f33371
026b4580bdb1a20c318a4bce1ea703c0f8d35d51d6eb55d89cc35466ab5d95ee737caa8c42d15495
0759e4482111d934c6fe33b53beb5e56164aab720759e4482111d934c6fe33b53beb5e56164aab72
8854e4c2fa740ae4ef167e076c3f064ad789df1e97b6a59087ab06dcfc64d92f40402a6c94373e2c
5849a87a5c7745c25ecb03553769618a9bfcae25f5cbca789db5a1947430987046d820fc70b7aed7
22aded78f26be1668f7995854c57568ef0a68d7a22aded78f26be1668f7995854c57568ef0a68d7a
6b381cfa1f51361494436cea1cf95c2616cab635a9d42cf846def4f4ec4dff273ea48916653ef92c
3e4344249da882fafc746e1a63e59d56fe0f90d1d9abf7987cf9682aa4cbd318cea087f63ed124e0
d4c57ad2fd7456eafa5583300428579c5b568c4ed4c57ad2fd7456eafa5583300428579c5b568c4e
f0fd02acc05f9e2031e779a1f787694c94ff2f3c21d4c932a74d5cc02ee3d2f3a46121c023d0c462
86a4571ee13f462284e9056df3f5e73e475d35646a17187e89b25e9e15e435f03845696ae02a78d0
8250e9aec2938c02f797082ad80926c21b49f4c58250e9aec2938c02f797082ad80926c21b49f4c5
238b784463512350c88c48f560ca45be24c6c52a16123bbad59a3c72cae0485df81888f04536de89
b14960580bb0427c2f39ccf3554dd9e8bd7d7266c1ac485e43b5e2c4be61714a70038312bcbbd067
d5159d6e244d528e363b97cdfbea74623a1a1d05d5159d6e244d528e363b97cdfbea74623a1a1d05
da81b7f243d3d39480e12bca98b59d0a84c8745a2738fe92616e7e12a152b6bc5b0e0d6692de6713
8bfa5634d50c5f0e5f17e5f40c973ac650186187b92d9028a920535c615d39d16a41f3fa47498a1b
7bc0560a7bb73c9a30ce5e1045f4df46240032417bc0560a7bb73c9a30ce5e1045f4df4624003241
1f0dc67ee44d16e6d97a4b529297fefcbe29d64674f6f47ceb708ed67567f1aa2b1cf28af7b34f36
7efc0efc24b6743840d1e2904318896cef1c0439941f37b48765da4e34f9b7a028d8160ea7080a5b
8ea1604a4e4aea18b3bc47445f9b81d62a3f544b8ea1604a4e4aea18b3bc47445f9b81d62a3f544b
877293985556de421cf8a434cc2a1c32601511c2b611a764a7bc0706a23876d14f6f6ecef290a3a8
60f3e26a068cbd421f44da8925455b2c79168adae438e1fe890ca94650bba7736996f2f69d5d2614
7abcbf84e62468e46b7b69e7789a008a8efa89807abcbf84e62468e46b7b69e7789a008a8efa8980
de79a770f84ec4129f87ace0be20c0eab803c8e24d205adcff8448aca094998af3d7966423740ef4
5e9792ec6ce774be3cf90d8a81a9942ec2c574b9a15cc4dc166835645a29df2b3410dd2246ad780e
42f8832c406f57bc051cfbb674c1a9084a48042942f8832c406f57bc051cfbb674c1a9084a480429
b4a1d1867637fa32045fd592635fa258a6eb037e878b8290984776c6b3abb615861386f267b55ec0
a6bbae56d2e1f9d67a38cf7957b4d4264bf104f691baf2808de6179a818700705c50db48371c28b3
1079f91c1d328fdaf0eb7d923e1c44b2d8e8844e1079f91c1d328fdaf0eb7d923e1c44b2d8e8844e
81916464d4f118505e422308ca86277ec06b73c6e5bbe884789bb3d8b052682054d39f2404f7b980
d56bb26a9ab401706e95f6fa126ef370d35ace7db2c59b72725ff80cc98bb9b27f233806bada3982
9fc3b6763627e2840d8e95c8dc7f1de0a40668da9fc3b6763627e2840d8e95c8dc7f1de0a40668da
2b5352d8275c2f246de95fb8c1527420020fb478f7dac4d818e6a23cae6387859a2602f81d4fb9e4
1df81360a40a05e235bf7a01a2200df41c14aa8aff055ea2bda475ba6ba237fb3ac2ceca6b9150c7
8c81a5385f45520650de230a78a669ae7adb40fd8c81a5385f45520650de230a78a669ae7adb40fd
ac1ea2f89fe910d065c9bf702cca09ca621af15eac5f8c60348e1a3ae0e3299d986fed448446886c
51a67148d01bc56a783b01027dd619a246798dd66f5ce9f4a260d22cf0c58f15b63c274cd4bd8cef
a8aa6ae28502228e6614e94afd3653ce4e2d761ba8aa6ae28502228e6614e94afd3653ce4e2d761b
65fa6e328e98bebc4a4c7746b308a1007bf7d4fe0ea18a08cb1223a8ba19070c2a787ebc7ac94541
aa33dc9c6379b696f685b13b2125c6527bff3c1be7a92ec2a3892674ce4e72b40a1bf3607455edc8
2d3985306a885390414e4961c2b8b846a355b4da2d3985306a885390414e4961c2b8b846a355b4da
c2e9e434ec47866ee921637d38671eaa08734de3960353fa3395c5f0e949cd63fadc2d4c268c4d37
f749ba3cfe31177873ca3e2828d4eea89f0428bcbe515fe47d84b87e2140cf8fa21c092c66d68d2e
c7cc8ec4763ae2ae7109465b30fcd6c88d4ad975c7cc8ec4763ae2ae7109465b30fcd6c88d4ad975
5da92716a477756c0ec5087c96acaa30d09cae18e1c69e76ac52842837e80c8ff368cdd06fd3564f
7c824bded27077647dfd5f29f60fa8c0a01d23aa8059c1761d279fce22698ac967336f8647f58802
72cd19d23efd5d42fc6e8c77c91f3938a4558cfc72cd19d23efd5d42fc6e8c77c91f3938a4558cfc
15977b78f4a5744e3c462a09d3817666c1377187a3d7e98ef292cec0efa1bc3a79ef3314a3f04323
7ccaa48ab6a3af6e6a204ae2bcce79d69c04521333bebe92722b0ab80c6a6b6bc7fd676e1917f1de
ec300f2650784bd8c0109fb280332c0083e0fdeaec300f2650784bd8c0109fb280332c0083e0fdea
06d7b8bc9842451e45cc0e76fed46e369c70133c1281a9aab9266aa6c429b1dd58f99cdaebd835a4
6aac377a3e3947b4d00ef85b04bae090a70af8358d42381466f4a1b20fe5bba3233e18bae227c811
817c162809f95e9ae4f89cb6cb44759e69b3b8e9817c162809f95e9ae4f89cb6cb44759e69b3b8e9
bed8232e463c9cd8d1c058e60ccaefd60a0a8b7ce1752b2263bd42bef6c5c258a3c1b6e6a3529602
809b4d6614664dbe502851a640d2940c3c311f726e912c04c250c634bdf70f3968414cc2f39d208b
26b784aa3276a24aad365809daaf9fea4201ddd926b784aa3276a24aad365809daaf9fea4201ddd9
52e3cd60537fc776fda67ec63323f3765d45222b784633b4f9cbf490451232e358d1c658326d9810
74056be847b8282097f69abf124c05e0ee295091039361d45b0b5616ab9b2ac1d2789ad8713c771c
2529825a1d4bf9dc94bdb194df3eee0a9c6557382529825a1d4bf9dc94bdb194df3eee0a9c655738
ce4ac58ed19f256c11ffe27052165cc6963a350eec085bf88c07e2aed59dddb51fd77f568a5c7d17
2f92b2b026e0166ee9a0a9747e37b4b839f561556cb6d6b29b73dc72da96fb44962cbeac2c228568
596541ca40701380eab6cb6b1d7e167a6d6d657f596541ca40701380eab6cb6b1d7e167a6d6d657f
dc7014a4dfbb48a47ac48ea0c590a050ee31fde285c0549eff59c6b2210ac3e304c2a440b0fba101
b3682b3e62bf6396a9ae7483e7662ff87bf4dd3d043a3a023fd74116bb44beed0ae8f2ec6b4fbbb9
c5ed71e8975ff3b24b616587700a101e9027da48c5ed71e8975ff3b24b616587700a101e9027da48
301277aea5808dd42333c7f21ee10334d619a465b62489366d8f2f54263e8c5c703b1b02c3e2db62
75378560440dead86685b893ad5e47d8b3ec8583f0945d0a9f39760e7ad5b29b041fa488b8be2c13
";

    /// The same without `-s`: an all-zero seed, which means the default seed.
    const DEBUGFS_DEFAULT_SEED: &str = "
b6f8244469e704020914fd8d5fb4a0bc258431aeb6f8244469e704020914fd8d5fb4a0bc258431ae
9b0e4a80434838d639ba3633f4494a647992743d2f50b87ee2503ee26b9d489d0cdb1a8e0cbeb1c1
6a9dc0c0756c41927167af5ba6786e06db8216533a1e2cd0abec19e481ab65878ef7d9f844de19f3
4524f8a808ece8ba7858b84354c24904ec8806c64524f8a808ece8ba7858b84354c24904ec8806c6
531749124a4319bcb4c5756c473dcabc946d294efdc45f1218874630dd84fcb7f653e27c963202c5
237a3bc8e07e23c86fdbaaa23a3ef7100872904a36dd23b083ca8dbe304d4b3f77e1ea9ce7586d66
699e4e9227f4bd28d184d7b60db165146e4d4333699e4e9227f4bd28d184d7b60db165146e4d4333
ee988834bb49d78c10033f656a8c9b3ea04a81d6ff0bd75aedb46ee09e9881f4ae7980f82de96042
6f286c4e004928b2e32ad39951976b3edefbf98fab88624a7d550f54527b9b58d9029af4b3415e25
a5d18014679c2818bdd33f356a9b6e1200b5dd96a5d18014679c2818bdd33f356a9b6e1200b5dd96
8a731c544a6ee37cea7a1ee22810366c022074f277c4b51a41e281284eb02746e2249674e244318f
21d5a8ca2006e6d6a2a63e7073885f48fe0eee8456b5ad32e0ec3f5e640b44a84eb03cd02da02148
042f2cbc1202fadc1c02e67216ec7dbc8b960214042f2cbc1202fadc1c02e67216ec7dbc8b960214
7e43f8c095c0bba270efdf00c23234cef93bce56793f61a891cc4f165770c45d90538320e802ab40
c643b47246ae25901e0307d8d9d4821cbb1aa5a12e0adb80995e34a8948b33fa9de59caca3926bca
fd05c6169c13ba5a235ae2d86e14328e89a24ca2fd05c6169c13ba5a235ae2d86e14328e89a24ca2
098351a4dc891ff4bdce98583738acac375672d3675ba53e28ae8a903d8aabff8f3d358c707d310b
46448c7874ddb7eec2ef091165e6af46759a432e8b1a856e82bcae483770145974f8e9300509df8b
1e25b552e6ae84d63227a4fc360255d61e7674ef1e25b552e6ae84d63227a4fc360255d61e7674ef
e9734bc84dde62ec48787cf6a1a7c96691d81bc61d502fbe5cd194060fae7575965bd4b0499b9d41
6605d228bff7c42291342388fb459e1085d2a6c182aac0141b079eaedd8b21a3b3d4d8ecace51897
76b09f50b980f4628f232d2933b627d4d380671476b09f50b980f4628f232d2933b627d4d3806714
3476f8668ec3ccd68927cb5fb1688878dcc3b410d450115e716cbe1a7daa6d9f045447ce9cfbbfb8
4c82b78e9e343e323c871cf286afb71093f8b0a2031b73a02ac1b6d81f00ded38e1a8dfc483703fb
";

    #[test]
    fn hashes_match_debugfs_for_every_version_with_a_seed() {
        // The UUID-form seed, read as four little-endian words like s_hash_seed.
        let seed = [0x3e0a_5f9c, 0x8e4b_d271, 0x132d_f4a6, 0x975b_8ec0];
        check_against_debugfs(DEBUGFS_SEEDED, &seed);
        assert_eq!(DEBUGFS_SEEDED.split_whitespace().count(), 240);
    }

    #[test]
    fn hashes_match_debugfs_for_every_version_with_the_default_seed() {
        check_against_debugfs(DEBUGFS_DEFAULT_SEED, &[0; 4]);
        assert_eq!(DEBUGFS_DEFAULT_SEED.split_whitespace().count(), 24);
    }
}
