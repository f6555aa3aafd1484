//! Extent-tree nodes (`fs/ext4/ext4_extents.h`) and the extent-block checksum.
//!
//! A node is a 12-byte header followed by `eh_max` 12-byte slots, of which the first
//! `eh_entries` are used: extents in a leaf (depth 0), indexes otherwise. The root lives in the
//! inode's 60-byte `i_block` (at most 4 slots); every other node fills a block and is followed,
//! right after its `eh_max` slots, by a 4-byte crc32c tail seeded with the inode's seed.
//!
//! [`parse_extent_node`] checks what one node can check on its own, following the kernel's
//! `__ext4_ext_check`: magic, `0 < max`, slots within the bytes, `entries <= max`,
//! `depth <= 5`, no empty index node, no zero-length or wrapping extent, extents sorted without
//! overlap, indexes strictly increasing. Whether blocks lie inside the file system, whether a
//! child's depth and range match its parent, and the checksum are the tree walker's job.
//!
//! Extent lengths: `ee_len` <= 32768 is an initialized extent of that length; larger values are
//! unwritten (preallocated) extents of `ee_len - 32768` blocks; 0 is invalid.
//!
//! The write side is a set of methods on the same types, so that the `fs` crate reaches them
//! through the re-exported types: [`ExtentHeader::encode_node`] lays out a whole node,
//! [`ExtentHeader::slots_for`] gives `eh_max` for a node size as the kernel computes it, and
//! [`ExtentHeader::seal_block`] / [`ExtentHeader::block_checksum`] write and compute the tail.
//! Encoders assert their arguments (lengths in range, block numbers within 48 bits, entries
//! matching the header): a violation is a bug in the caller, never a property of disk bytes.

use super::bytes::{block48, le16, le32, put_le16, put_le32};
use super::inode::inode_csum_seed;
use super::superblock::Superblock;
use crate::crc::crc32c_raw;
use crate::OnDiskError;

/// `eh_magic`.
pub const EXTENT_MAGIC: u16 = 0xF30A;
/// Deepest tree the kernel accepts (EXT4_MAX_EXTENT_DEPTH).
pub const EXTENT_DEPTH_MAX: u16 = 5;
/// Longest initialized extent (EXT_INIT_MAX_LEN); `ee_len` above it marks unwritten extents.
pub const EXTENT_LEN_INIT_MAX: u32 = 32768;
/// Size of the header and of each slot (`ext4_extent` and `ext4_extent_idx` are both 12 bytes).
pub const EXTENT_HEADER_SIZE: usize = 12;
pub const EXTENT_ENTRY_SIZE: usize = 12;
/// Size of the checksum tail of a non-root node.
pub const EXTENT_TAIL_SIZE: usize = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtentHeader {
    pub entries: u16,
    pub max: u16,
    pub depth: u16,
    pub generation: u32,
}

impl ExtentHeader {
    /// `eh_max` for a node of `node_bytes` bytes, as the kernel's `ext4_ext_space_root` and
    /// `ext4_ext_space_block` compute it: 4 for the 60-byte `i_block`, `(block_size - 12) / 12`
    /// for a tree block (84 at 1 KiB, 340 at 4 KiB). The 4-byte checksum tail of a tree block
    /// always fits in the slack this division leaves. Saturates at `u16::MAX`.
    pub fn slots_for(node_bytes: usize) -> u16 {
        let slots = node_bytes.saturating_sub(EXTENT_HEADER_SIZE) / EXTENT_ENTRY_SIZE;
        u16::try_from(slots).unwrap_or(u16::MAX)
    }

    /// Byte offset of the checksum tail of a tree block with this header: right after its
    /// `max` slots (`EXT4_EXTENT_TAIL_OFFSET`).
    pub fn tail_offset(&self) -> usize {
        EXTENT_HEADER_SIZE + usize::from(self.max) * EXTENT_ENTRY_SIZE
    }

    /// Writes this header and `entries` into `node` (the 60-byte `i_block` or a whole tree
    /// block) and zeroes the unused slots up to `max`. Bytes past the slots (the checksum tail
    /// and any slack) are left alone.
    ///
    /// Panics when the header disagrees with `entries` (count, or leaf-ness versus depth), when
    /// `entries > max`, when the slots do not fit in `node`, or when an entry cannot be encoded
    /// (see [`Extent::encode`], [`ExtentIndex::encode`]).
    pub fn encode_node(&self, entries: &ExtentEntries, node: &mut [u8]) {
        assert_eq!(usize::from(self.entries), entries.len(), "header entries != entries given");
        assert_eq!(self.depth == 0, matches!(entries, ExtentEntries::Leaf(_)), "depth vs kind");
        assert!(self.entries <= self.max, "{} entries, max {}", self.entries, self.max);
        assert!(self.depth <= EXTENT_DEPTH_MAX, "depth {}", self.depth);
        let slots_end = self.tail_offset();
        assert!(slots_end <= node.len(), "{} slots do not fit {} bytes", self.max, node.len());
        put_le16(node, 0, EXTENT_MAGIC);
        put_le16(node, 2, self.entries);
        put_le16(node, 4, self.max);
        put_le16(node, 6, self.depth);
        put_le32(node, 8, self.generation);
        let slot = |i: usize| EXTENT_HEADER_SIZE + i * EXTENT_ENTRY_SIZE;
        match entries {
            ExtentEntries::Leaf(extents) => {
                for (i, extent) in extents.iter().enumerate() {
                    extent.encode(&mut node[slot(i)..slot(i + 1)]);
                }
            }
            ExtentEntries::Index(indexes) => {
                for (i, index) in indexes.iter().enumerate() {
                    index.encode(&mut node[slot(i)..slot(i + 1)]);
                }
            }
        }
        node[slot(entries.len())..slots_end].fill(0);
    }

    /// The crc32c the tail of tree block `block` must hold (`ext4_extent_block_csum`): the
    /// inode's checksum seed (see [`inode_csum_seed`]) over the block up to the tail. `None`
    /// when the tail does not fit in `block`.
    pub fn block_checksum(&self, inode_seed: u32, block: &[u8]) -> Option<u32> {
        block_checksum_at(inode_seed, block, self.tail_offset())
    }

    /// The checksum stored in the tail of `block`, `None` when the tail does not fit.
    pub fn stored_block_checksum(&self, block: &[u8]) -> Option<u32> {
        let tail = self.tail_offset();
        block.get(tail..tail + EXTENT_TAIL_SIZE).map(|stored| le32(stored, 0))
    }

    /// Writes the checksum tail of tree block `block` (`ext4_extent_block_csum_set`). Panics
    /// when the tail does not fit in `block`.
    pub fn seal_block(&self, inode_seed: u32, block: &mut [u8]) {
        let tail = self.tail_offset();
        let crc = block_checksum_at(inode_seed, block, tail)
            .unwrap_or_else(|| panic!("extent tail at {tail} does not fit {} bytes", block.len()));
        put_le32(block, tail, crc);
    }
}

/// One leaf extent: file blocks `logical .. logical + len` live at `start .. start + len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub logical: u32,
    /// Real length in blocks, 1..=32768 (1..=32767 when unwritten).
    pub len: u32,
    pub start: u64,
    /// Preallocated: the blocks are allocated but read as zeros.
    pub unwritten: bool,
}

impl Extent {
    /// Longest unwritten extent (EXT_UNINIT_MAX_LEN): `ee_len` 65535.
    pub const LEN_UNWRITTEN_MAX: u32 = EXTENT_LEN_INIT_MAX - 1;

    /// Longest extent of this kind: 32768 blocks initialized, 32767 unwritten.
    pub fn len_max(unwritten: bool) -> u32 {
        if unwritten {
            Self::LEN_UNWRITTEN_MAX
        } else {
            EXTENT_LEN_INIT_MAX
        }
    }

    /// Writes this extent into a 12-byte slot (`ext4_extent`). Panics when the length is 0 or
    /// above [`Extent::len_max`], when the extent wraps past logical block 2^32 - 1, or when
    /// `start` needs more than 48 bits.
    pub fn encode(&self, slot: &mut [u8]) {
        assert!(
            (1..=Self::len_max(self.unwritten)).contains(&self.len),
            "extent length {} (unwritten: {})",
            self.len,
            self.unwritten
        );
        assert!(self.logical.checked_add(self.len).is_some(), "extent wraps: {self:?}");
        assert!(self.start < 1 << 48, "extent start {} beyond 48 bits", self.start);
        let raw_len = if self.unwritten { self.len + EXTENT_LEN_INIT_MAX } else { self.len };
        put_le32(slot, 0, self.logical);
        put_le16(slot, 4, raw_len as u16);
        put_le16(slot, 6, (self.start >> 32) as u16);
        put_le32(slot, 8, self.start as u32);
    }

    /// One past the last logical block (at most 2^32 - 1: parse rejects wrapping extents).
    pub fn logical_end(&self) -> u64 {
        u64::from(self.logical) + u64::from(self.len)
    }
}

/// One index entry: the subtree at block `leaf` covers logical blocks from `logical` up to the
/// next index entry's `logical`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtentIndex {
    pub logical: u32,
    pub leaf: u64,
}

impl ExtentIndex {
    /// Writes this index into a 12-byte slot (`ext4_extent_idx`, `ei_unused` zero). Panics
    /// when `leaf` needs more than 48 bits.
    pub fn encode(&self, slot: &mut [u8]) {
        assert!(self.leaf < 1 << 48, "index leaf {} beyond 48 bits", self.leaf);
        put_le32(slot, 0, self.logical);
        put_le32(slot, 4, self.leaf as u32);
        put_le16(slot, 8, (self.leaf >> 32) as u16);
        put_le16(slot, 10, 0);
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExtentEntries {
    Leaf(Vec<Extent>),
    Index(Vec<ExtentIndex>),
}

impl ExtentEntries {
    /// Logical block of the first entry, if any.
    pub fn first_logical(&self) -> Option<u32> {
        match self {
            ExtentEntries::Leaf(extents) => extents.first().map(|e| e.logical),
            ExtentEntries::Index(indexes) => indexes.first().map(|i| i.logical),
        }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        match self {
            ExtentEntries::Leaf(extents) => extents.len(),
            ExtentEntries::Index(indexes) => indexes.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Decodes and checks one extent-tree node: the inode's `i_block` or a whole tree block.
pub fn parse_extent_node(bytes: &[u8]) -> Result<(ExtentHeader, ExtentEntries), OnDiskError> {
    let header = parse_header(bytes)?;
    let entries = usize::from(header.entries);
    let slot = |i: usize| EXTENT_HEADER_SIZE + i * EXTENT_ENTRY_SIZE;
    // parse_header proved slot(max) <= bytes.len() and entries <= max, so every slot read
    // below is in bounds.
    if header.depth == 0 {
        let mut extents = Vec::with_capacity(entries);
        let mut prev_end = 0u64;
        for i in 0..entries {
            let at = slot(i);
            let extent = decode_extent(bytes, at).map_err(|reason| node_corrupted(i, reason))?;
            if u64::from(extent.logical) < prev_end {
                return Err(node_corrupted(
                    i,
                    format!("extent at logical {} overlaps the previous one", extent.logical),
                ));
            }
            prev_end = extent.logical_end();
            extents.push(extent);
        }
        Ok((header, ExtentEntries::Leaf(extents)))
    } else {
        let mut indexes: Vec<ExtentIndex> = Vec::with_capacity(entries);
        for i in 0..entries {
            let at = slot(i);
            let index = ExtentIndex {
                logical: le32(bytes, at),
                leaf: block48(le32(bytes, at + 4), le16(bytes, at + 8)),
            };
            if let Some(prev) = indexes.last() {
                if index.logical <= prev.logical {
                    return Err(node_corrupted(
                        i,
                        format!(
                            "index at logical {} does not follow {}",
                            index.logical, prev.logical
                        ),
                    ));
                }
            }
            indexes.push(index);
        }
        Ok((header, ExtentEntries::Index(indexes)))
    }
}

fn parse_header(bytes: &[u8]) -> Result<ExtentHeader, OnDiskError> {
    if bytes.len() < EXTENT_HEADER_SIZE {
        return Err(header_corrupted(format!("{} bytes", bytes.len())));
    }
    let magic = le16(bytes, 0);
    if magic != EXTENT_MAGIC {
        return Err(header_corrupted(format!("magic {magic:#06x}")));
    }
    let header = ExtentHeader {
        entries: le16(bytes, 2),
        max: le16(bytes, 4),
        depth: le16(bytes, 6),
        generation: le32(bytes, 8),
    };
    let slots_end = EXTENT_HEADER_SIZE + usize::from(header.max) * EXTENT_ENTRY_SIZE;
    if header.max == 0 || slots_end > bytes.len() {
        return Err(header_corrupted(format!(
            "max {} slots in a {}-byte node",
            header.max,
            bytes.len()
        )));
    }
    if header.entries > header.max {
        return Err(header_corrupted(format!("{} entries, max {}", header.entries, header.max)));
    }
    if header.depth > EXTENT_DEPTH_MAX {
        return Err(header_corrupted(format!("depth {}", header.depth)));
    }
    if header.depth > 0 && header.entries == 0 {
        return Err(header_corrupted(format!("empty index node at depth {}", header.depth)));
    }
    Ok(header)
}

/// Decodes the 12-byte `ext4_extent` at byte `at` of `bytes` (`ee_len` above 32768 marks an
/// unwritten extent), refusing a zero length and a range that wraps. Shared with the
/// fast-commit ADD_RANGE record, which carries the same bytes.
pub(crate) fn decode_extent(bytes: &[u8], at: usize) -> Result<Extent, String> {
    let logical = le32(bytes, at);
    let raw_len = u32::from(le16(bytes, at + 4));
    let start = block48(le32(bytes, at + 8), le16(bytes, at + 6));
    if raw_len == 0 {
        return Err(format!("zero-length extent at logical {logical}"));
    }
    let (len, unwritten) = if raw_len <= EXTENT_LEN_INIT_MAX {
        (raw_len, false)
    } else {
        (raw_len - EXTENT_LEN_INIT_MAX, true)
    };
    // The kernel rejects `lblock + len <= lblock` in 32-bit arithmetic: the last block must be
    // representable and the end must not wrap to 0.
    if logical.checked_add(len).is_none() {
        return Err(format!("extent at logical {logical} of {len} blocks wraps"));
    }
    Ok(Extent { logical, len, start, unwritten })
}

/// Whether the extent-tree block `block` of inode `ino` (generation `generation`) carries a
/// valid crc32c tail. True when metadata_csum is off; false when the tail does not fit.
pub fn extent_block_checksum_ok(sb: &Superblock, ino: u32, generation: u32, block: &[u8]) -> bool {
    if !sb.has_metadata_csum() {
        return true;
    }
    if block.len() < EXTENT_HEADER_SIZE {
        return false;
    }
    let tail = EXTENT_HEADER_SIZE + usize::from(le16(block, 4)) * EXTENT_ENTRY_SIZE;
    let Some(stored) = block.get(tail..tail + EXTENT_TAIL_SIZE) else {
        return false;
    };
    block_checksum_at(inode_csum_seed(sb, ino, generation), block, tail) == Some(le32(stored, 0))
}

/// crc32c from `inode_seed` over `block[..tail]`, if the 4-byte tail at `tail` fits.
fn block_checksum_at(inode_seed: u32, block: &[u8], tail: usize) -> Option<u32> {
    if tail.checked_add(EXTENT_TAIL_SIZE)? > block.len() {
        return None;
    }
    Some(crc32c_raw(inode_seed, &block[..tail]))
}

fn header_corrupted(reason: String) -> OnDiskError {
    OnDiskError::corrupted("extent header", reason)
}

fn node_corrupted(entry: usize, reason: String) -> OnDiskError {
    OnDiskError::corrupted("extent node", format!("entry {entry}: {reason}"))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ext4::superblock::tests::sample;

    pub(crate) fn header(bytes: &mut [u8], entries: u16, max: u16, depth: u16) {
        put_le16(bytes, 0, EXTENT_MAGIC);
        put_le16(bytes, 2, entries);
        put_le16(bytes, 4, max);
        put_le16(bytes, 6, depth);
    }

    pub(crate) fn put_extent(bytes: &mut [u8], i: usize, logical: u32, raw_len: u16, start: u64) {
        let at = EXTENT_HEADER_SIZE + i * EXTENT_ENTRY_SIZE;
        put_le32(bytes, at, logical);
        put_le16(bytes, at + 4, raw_len);
        put_le16(bytes, at + 6, (start >> 32) as u16);
        put_le32(bytes, at + 8, start as u32);
    }

    pub(crate) fn put_index(bytes: &mut [u8], i: usize, logical: u32, leaf: u64) {
        let at = EXTENT_HEADER_SIZE + i * EXTENT_ENTRY_SIZE;
        put_le32(bytes, at, logical);
        put_le32(bytes, at + 4, leaf as u32);
        put_le16(bytes, at + 8, (leaf >> 32) as u16);
    }

    #[test]
    fn leaf_root_decodes_initialized_and_unwritten_extents() {
        let mut root = [0u8; 60];
        header(&mut root, 3, 4, 0);
        put_extent(&mut root, 0, 0, 32768, 0x1_0000_0010);
        put_extent(&mut root, 1, 32768, 32768 + 5, 500);
        put_extent(&mut root, 2, 40000, 1, 900);
        let (h, entries) = parse_extent_node(&root).unwrap();
        assert_eq!((h.entries, h.max, h.depth), (3, 4, 0));
        let ExtentEntries::Leaf(extents) = entries else { panic!("leaf expected") };
        assert_eq!(
            extents[0],
            Extent { logical: 0, len: 32768, start: 0x1_0000_0010, unwritten: false }
        );
        assert_eq!(extents[1], Extent { logical: 32768, len: 5, start: 500, unwritten: true });
        assert_eq!(extents[2].logical_end(), 40001);
    }

    #[test]
    fn index_root_decodes_48_bit_leaf_pointers() {
        let mut root = [0u8; 60];
        header(&mut root, 2, 4, 1);
        put_index(&mut root, 0, 0, 0xABCD_0000_1234);
        put_index(&mut root, 1, 100, 77);
        let (h, entries) = parse_extent_node(&root).unwrap();
        assert_eq!(h.depth, 1);
        assert_eq!(
            entries,
            ExtentEntries::Index(vec![
                ExtentIndex { logical: 0, leaf: 0xABCD_0000_1234 },
                ExtentIndex { logical: 100, leaf: 77 },
            ])
        );
    }

    #[test]
    fn malformed_extent_nodes_are_rejected() {
        type Edit = fn(&mut [u8; 60]);
        let cases: [(&str, Edit); 10] = [
            ("bad magic", |b| put_le16(b, 0, 0xF30B)),
            ("zero max", |b| header(b, 0, 0, 0)),
            ("max beyond the bytes", |b| header(b, 1, 5, 0)),
            ("entries above max", |b| header(b, 5, 4, 0)),
            ("depth 6", |b| header(b, 1, 4, 6)),
            ("empty index node", |b| header(b, 0, 4, 1)),
            ("zero-length extent", |b| put_extent(b, 0, 0, 0, 10)),
            ("wrapping extent", |b| put_extent(b, 0, u32::MAX, 1, 10)),
            ("overlapping extents", |b| {
                header(b, 2, 4, 0);
                put_extent(b, 1, 5, 1, 10);
            }),
            ("unsorted indexes", |b| {
                header(b, 2, 4, 1);
                put_index(b, 0, 10, 1);
                put_index(b, 1, 10, 2);
            }),
        ];
        for (name, edit) in cases {
            let mut root = [0u8; 60];
            header(&mut root, 1, 4, 0);
            put_extent(&mut root, 0, 0, 8, 100);
            edit(&mut root);
            let err = parse_extent_node(&root).expect_err(name);
            assert!(matches!(err, OnDiskError::Corrupted { .. }), "{name}: {err}");
        }
        assert!(parse_extent_node(&[0x0A, 0xF3]).is_err());
    }

    #[test]
    fn extent_block_checksum_covers_header_and_all_slots() {
        let sb = sample();
        let mut block = vec![0u8; 4096];
        let max = ((4096 - EXTENT_HEADER_SIZE) / EXTENT_ENTRY_SIZE) as u16; // 340, as the kernel
        header(&mut block, 1, max, 0);
        put_extent(&mut block, 0, 0, 10, 1000);
        let tail = EXTENT_HEADER_SIZE + usize::from(max) * EXTENT_ENTRY_SIZE;
        let crc = crc32c_raw(inode_csum_seed(&sb, 8, 3), &block[..tail]);
        put_le32(&mut block, tail, crc);
        assert!(extent_block_checksum_ok(&sb, 8, 3, &block));
        assert!(!extent_block_checksum_ok(&sb, 8, 4, &block));
        assert!(!extent_block_checksum_ok(&sb, 9, 3, &block));
        block[tail - 1] ^= 1; // an unused slot is still covered
        assert!(!extent_block_checksum_ok(&sb, 8, 3, &block));
        // A max whose tail falls off the block cannot verify.
        header(&mut block, 1, 341, 0);
        assert!(!extent_block_checksum_ok(&sb, 8, 3, &block));
    }

    #[test]
    fn slots_for_matches_the_kernel_and_leaves_room_for_the_tail() {
        assert_eq!(ExtentHeader::slots_for(60), 4);
        assert_eq!(ExtentHeader::slots_for(1024), 84);
        assert_eq!(ExtentHeader::slots_for(4096), 340);
        assert_eq!(ExtentHeader::slots_for(65536), 5460);
        assert_eq!(ExtentHeader::slots_for(3), 0);
        for block_size in [1024, 2048, 4096, 8192, 65536] {
            let header = ExtentHeader {
                entries: 0,
                max: ExtentHeader::slots_for(block_size),
                depth: 0,
                generation: 0,
            };
            assert!(header.tail_offset() + EXTENT_TAIL_SIZE <= block_size, "{block_size}");
        }
    }

    #[test]
    fn encoded_nodes_parse_back_to_the_same_entries() {
        let extents = vec![
            Extent { logical: 0, len: 32768, start: 0xABCD_0000_0010, unwritten: false },
            Extent { logical: 40000, len: 32767, start: 77, unwritten: true },
            Extent { logical: u32::MAX - 2, len: 2, start: 1, unwritten: false },
        ];
        let mut root = [0xEEu8; 60];
        let header = ExtentHeader { entries: 3, max: 4, depth: 0, generation: 9 };
        header.encode_node(&ExtentEntries::Leaf(extents.clone()), &mut root);
        assert_eq!(&root[48..60], &[0u8; 12], "the unused slot is zeroed");
        let (parsed, entries) = parse_extent_node(&root).unwrap();
        assert_eq!(parsed, header);
        assert_eq!(entries, ExtentEntries::Leaf(extents));

        let indexes = vec![
            ExtentIndex { logical: 5, leaf: 0xFFFF_FFFF_FFFF },
            ExtentIndex { logical: 6, leaf: 2 },
        ];
        let mut block = vec![0xEEu8; 1024];
        let header = ExtentHeader { entries: 2, max: 84, depth: 3, generation: 0 };
        let entries = ExtentEntries::Index(indexes);
        header.encode_node(&entries, &mut block);
        assert_eq!(parse_extent_node(&block).unwrap(), (header, entries.clone()));
        assert_eq!(entries.len(), 2);
        assert!(!entries.is_empty());
        // The reserved ei_unused half-word is written as zero.
        assert_eq!(&block[12 + 10..12 + 12], &[0, 0]);
    }

    #[test]
    fn sealed_blocks_verify_with_the_superblock_checksum_predicate() {
        let sb = sample();
        let seed = inode_csum_seed(&sb, 12, 7);
        for block_size in [1024usize, 4096] {
            let max = ExtentHeader::slots_for(block_size);
            let header = ExtentHeader { entries: 1, max, depth: 0, generation: 0 };
            let mut block = vec![0u8; block_size];
            let extent = Extent { logical: 3, len: 1, start: 500, unwritten: false };
            header.encode_node(&ExtentEntries::Leaf(vec![extent]), &mut block);
            header.seal_block(seed, &mut block);
            assert!(extent_block_checksum_ok(&sb, 12, 7, &block));
            assert!(!extent_block_checksum_ok(&sb, 12, 8, &block));
            assert_eq!(header.stored_block_checksum(&block), header.block_checksum(seed, &block));
            block[20] ^= 1;
            assert_ne!(header.stored_block_checksum(&block), header.block_checksum(seed, &block));
        }
        let header = ExtentHeader { entries: 0, max: 4, depth: 0, generation: 0 };
        assert_eq!(header.block_checksum(seed, &[0u8; 60]), None, "i_block has no tail");
        assert_eq!(header.stored_block_checksum(&[0u8; 60]), None);
    }

    #[test]
    fn extent_length_limits_depend_on_the_unwritten_flag() {
        assert_eq!(Extent::len_max(false), 32768);
        assert_eq!(Extent::len_max(true), 32767);
        let mut slot = [0u8; 12];
        Extent { logical: 0, len: 32767, start: 1, unwritten: true }.encode(&mut slot);
        assert_eq!(le16(&slot, 4), 65535);
        let result = std::panic::catch_unwind(|| {
            let mut slot = [0u8; 12];
            Extent { logical: 0, len: 32768, start: 1, unwritten: true }.encode(&mut slot);
        });
        assert!(result.is_err(), "an unwritten extent of 32768 blocks cannot be encoded");
    }
}
