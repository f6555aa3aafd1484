//! ext4 extent trees: map, insert, remove and convert extents of one inode, as the kernel's
//! `fs/ext4/extents.c` does, over [`MetaIo`].
//!
//! The tree's root is the inode's 60-byte `i_block` (at most 4 slots); every other node is one
//! metadata block of `(block_size - 12) / 12` slots followed by a crc32c tail when
//! metadata_csum is on. Leaves (depth 0) hold extents, index nodes hold `(logical, child)`
//! pairs. Callers pass the root in and persist it (with the inode) after a successful call; a
//! call changes the root buffer only once every tree block it needed is written.
//!
//! Invariants every tree written here keeps, because `e2fsck -fn` and the kernel's
//! `__ext4_ext_check` require them:
//! - entries of a node are sorted by logical block, extents do not overlap, and every entry
//!   lies inside the range its parent index gives it (`ei_block` up to the next `ei_block`);
//! - each index's `ei_block` equals the first logical block of its child
//!   (`ext4_ext_correct_indexes`), so inserts at the front and removals at the front of a node
//!   update the indexes above it;
//! - `eh_max` is 4 in the root and `(block_size - 12) / 12` in new tree blocks; a child's depth
//!   is its parent's minus one; no tree block is empty (an emptied node is freed and its index
//!   removed; an emptied tree returns to an empty depth-0 root, as the kernel's truncate does);
//! - every tree block written carries its checksum tail when [`ExtentCtx::csum_seed`] is set;
//! - extents stay within 32768 blocks (32767 unwritten), and depth within 5.
//!
//! Bytes read back are untrusted. Every node read is checked (magic, sizes, sort order, depth
//! one below its parent, `eh_max` within the two slots of slack e2fsck allows, entries inside
//! the parent's range and the first equal to the parent's index, block numbers inside the file
//! system, checksum) and a violation is `FsError::Corrupted` naming the block. Walks terminate:
//! depth falls by one per level from at most 5, and whole-tree walks refuse a block seen twice
//! and stop after [`EXTENT_TREE_BLOCKS_MAX`] blocks.
//!
//! How a change that overflows a node is absorbed (the kernel's `ext4_ext_create_new_leaf`):
//!
//! | node that overflows         | action                                                     |
//! |-----------------------------|------------------------------------------------------------|
//! | tree block, change at end   | keep `eh_max` entries, move the rest to a new block:       |
//! |                             | appends leave full nodes, as the kernel's split does       |
//! | tree block, change elsewhere| split in half into the block and a new block               |
//! | tree block, after a split   | insert the new block's index into the parent (which may    |
//! |                             | overflow in turn)                                          |
//! | root                        | grow: move the root's entries into a new block and make    |
//! |                             | the root a one-entry index one level deeper                |
//!
//! Blocks a change needs are allocated before anything is modified, so `NoSpace` leaves the
//! tree as it was. Freed blocks (data and tree) are released only after the nodes that
//! referenced them are written.
//!
//! Journal credits: [`worst_case_blocks_touched`] bounds the tree blocks plus the inode block
//! one [`insert`], one [`mark_written`] confined to one extent (the kernel converts one extent
//! per handle), or one [`remove_range`] that punches inside one extent may modify or allocate.
//! The allocator's own bitmap and descriptor blocks (for at most `depth + 1` allocations) are
//! not included. A [`remove_range`] spanning many extents touches every tree block overlapping
//! the range; callers with a credit budget remove in pieces.
//!
//! ## Files
//! This module holds the API and the in-memory node types; `check.rs` reads and checks nodes
//! and walks paths and whole trees, `change.rs` edits leaves and settles overflows upward,
//! `remove.rs` removes ranges, `tests.rs` the model-based and hostile-tree tests.

use std::collections::HashSet;

use ondisk::ext4::{
    parse_extent_node, Extent, ExtentEntries, ExtentHeader, ExtentIndex, EXTENT_DEPTH_MAX,
    INODE_BLOCK_SIZE,
};

use crate::error::{FsError, Result};
use crate::image::EXTENT_TREE_BLOCKS_MAX;
use crate::meta_io::MetaIo;

mod change;
mod check;
mod remove;
#[cfg(test)]
mod tests;

use change::*;
use check::*;
use remove::*;

/// One past the largest logical block number.
const LOGICAL_END: u64 = 1 << 32;
/// Slots of the root in `i_block` (`ext4_ext_space_root`).
const ROOT_SLOTS: u16 = 4;
/// `ext2fs_extent_header_verify` accepts `eh_max` up to this many slots below the capacity.
const SLOTS_SLACK_MAX: u16 = 2;
/// Smallest block size: a block node must hold a grown root plus the two entries one change
/// adds (6 slots), and splitting in half must leave both halves within `eh_max`.
const BLOCK_SIZE_MIN: usize = 1024;

/// Per-inode context of an extent-tree operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtentCtx {
    /// The inode number, for error messages.
    pub ino: u32,
    /// The inode-table block holding the inode: where a corrupted root is reported.
    pub inode_block: u64,
    /// The inode's checksum seed (`ondisk::ext4::inode_csum_seed`) when metadata_csum is on.
    pub csum_seed: Option<u32>,
    /// Allocation goal for new tree blocks (0: no preference).
    pub goal: u64,
}

/// What a logical block maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// Mapped at `pblk`; the extent continues for `len` blocks from the queried block.
    Mapped { pblk: u64, len: u32, unwritten: bool },
    /// Not mapped; the next mapped block is `len_to_next` blocks on (None: nothing follows).
    Hole { len_to_next: Option<u32> },
}

/// Writes an empty depth-0 root (`ext4_ext_tree_init`) into `root`.
pub fn init_root(root: &mut [u8; INODE_BLOCK_SIZE]) {
    root.fill(0);
    let header = ExtentHeader { entries: 0, max: ROOT_SLOTS, depth: 0, generation: 0 };
    header.encode_node(&ExtentEntries::Leaf(Vec::new()), root);
}

/// The depth field of the root, capped at 5 and not otherwise validated: what
/// [`worst_case_blocks_touched`] needs before an operation reads (and checks) the tree.
pub fn depth(root: &[u8; INODE_BLOCK_SIZE]) -> u16 {
    u16::from_le_bytes([root[6], root[7]]).min(EXTENT_DEPTH_MAX)
}

/// Most metadata blocks (tree blocks and the inode's block) one [`insert`] or one
/// [`mark_written`] within one extent may modify or allocate in a tree of `depth`: each of the
/// `depth` block levels may split (the node and its new sibling), the root may grow (one new
/// block), and the inode holds the root.
pub fn worst_case_blocks_touched(depth: u16) -> u32 {
    2 * u32::from(depth.min(EXTENT_DEPTH_MAX)) + 2
}

/// Where logical block `lblk` is mapped.
pub fn lookup(
    io: &mut dyn MetaIo,
    ctx: &ExtentCtx,
    root: &[u8; INODE_BLOCK_SIZE],
    lblk: u32,
) -> Result<Lookup> {
    let path = find_path(io, ctx, root, lblk)?;
    let leaf = &path[path.len() - 1].node;
    let extents = leaf.extents();
    let i = extents.partition_point(|e| e.logical <= lblk);
    if let Some(extent) = i.checked_sub(1).map(|j| extents[j]) {
        if extent.logical_end() > u64::from(lblk) {
            let offset = lblk - extent.logical;
            return Ok(Lookup::Mapped {
                pblk: extent.start + u64::from(offset),
                len: extent.len - offset,
                unwritten: extent.unwritten,
            });
        }
    }
    // The leaf covers lblk's position (find_path descends by range), so the next mapped
    // block is the next extent here or the first block of the next leaf: the leaf's end.
    let next = extents.get(i).map_or(leaf.hi, |e| u64::from(e.logical));
    let len_to_next = (next < LOGICAL_END).then(|| (next - u64::from(lblk)) as u32);
    Ok(Lookup::Hole { len_to_next })
}

/// How logical blocks `first ..= last` are mapped, in order: each mapped run as
/// [`Lookup::Mapped`] from its first block in the range (`len` cut at `last`), each hole as
/// [`Lookup::Hole`] with its length (cut at `last`), paired with the logical block it starts
/// at. One descent per leaf the range touches, where [`lookup`] per run descends and decodes
/// the leaf once for every run (quadratic in the extents of a fragmented file: a fast commit
/// of a shared log spent half its CPU there).
pub fn mapping(
    io: &mut dyn MetaIo,
    ctx: &ExtentCtx,
    root: &[u8; INODE_BLOCK_SIZE],
    first: u32,
    last: u32,
) -> Result<Vec<(u32, Lookup)>> {
    let mut out = Vec::new();
    let end = u64::from(last) + 1;
    let mut lblk = u64::from(first);
    while lblk < end {
        let path = find_path(io, ctx, root, lblk as u32)?;
        let leaf = &path[path.len() - 1].node;
        let leaf_end = leaf.hi.min(end);
        if leaf_end <= lblk {
            // find_path returns the leaf whose range holds lblk; anything else is a bug.
            return Err(FsError::Invalid(format!(
                "extent leaf ending at {} for block {lblk}",
                leaf.hi
            )));
        }
        let extents = leaf.extents();
        let mut i = extents.partition_point(|e| u64::from(e.logical) + u64::from(e.len) <= lblk);
        while lblk < leaf_end {
            match extents.get(i) {
                Some(e) if u64::from(e.logical) <= lblk => {
                    let run_end = e.logical_end().min(leaf_end);
                    let offset = (lblk - u64::from(e.logical)) as u32;
                    let len = (run_end - lblk) as u32;
                    let mapped = Lookup::Mapped {
                        pblk: e.start + u64::from(offset),
                        len,
                        unwritten: e.unwritten,
                    };
                    out.push((lblk as u32, mapped));
                    lblk = run_end;
                    i += 1;
                }
                next => {
                    let hole_end = next.map_or(leaf_end, |e| u64::from(e.logical).min(leaf_end));
                    let len = (hole_end - lblk) as u32;
                    out.push((lblk as u32, Lookup::Hole { len_to_next: Some(len) }));
                    lblk = hole_end;
                }
            }
        }
    }
    Ok(out)
}

/// Maps logical blocks `lblk .. lblk + len` to `pblk .. pblk + len`, merging with a
/// neighbouring extent of the same state that is logically and physically contiguous when the
/// result stays within the length limit. The range must be unmapped (`Invalid` otherwise) and
/// `len` within 1 ..= 32768 (32767 unwritten).
#[allow(clippy::too_many_arguments)] // the brief's signature: the extent's fields, spelled out
pub fn insert(
    io: &mut dyn MetaIo,
    ctx: &ExtentCtx,
    root: &mut [u8; INODE_BLOCK_SIZE],
    lblk: u32,
    pblk: u64,
    len: u32,
    unwritten: bool,
) -> Result<()> {
    check_block_size(io);
    if len == 0 || len > Extent::len_max(unwritten) {
        return Err(FsError::Invalid(format!(
            "extent of {len} blocks (unwritten: {unwritten}) is outside 1..={}",
            Extent::len_max(unwritten)
        )));
    }
    if lblk.checked_add(len).is_none() {
        return Err(FsError::FileTooLarge);
    }
    if pblk == 0 || pblk.checked_add(u64::from(len)).is_none_or(|end| end > io.blocks_count()) {
        return Err(FsError::Invalid(format!(
            "blocks {pblk}+{len} are outside the file system ({} blocks)",
            io.blocks_count()
        )));
    }
    let new = Extent { logical: lblk, len, start: pblk, unwritten };
    let mut path = find_path(io, ctx, root, lblk)?;
    let leaf = &path[path.len() - 1].node;
    let extents = leaf.extents();
    let i = extents.partition_point(|e| e.logical <= lblk);
    let prev_end = i.checked_sub(1).map_or(0, |j| extents[j].logical_end());
    let next_start = extents.get(i).map_or(leaf.hi, |e| u64::from(e.logical));
    if prev_end > u64::from(lblk) || new.logical_end() > next_start {
        return Err(FsError::Invalid(format!(
            "inode {}: logical blocks {lblk}+{len} are already mapped",
            ctx.ino
        )));
    }
    let left = i.checked_sub(1).map(|j| extents[j]).filter(|l| mergeable(l, &new));
    let right = extents.get(i).copied().filter(|r| mergeable(&new, r));
    let (from, to, merged) = match (left, right) {
        (Some(l), Some(r)) if l.len + len + r.len <= Extent::len_max(unwritten) => {
            (i - 1, i + 1, Extent { len: l.len + len + r.len, ..l })
        }
        (Some(l), _) => (i - 1, i, Extent { len: l.len + len, ..l }),
        (None, Some(r)) => (i, i + 1, Extent { len: len + r.len, ..new }),
        (None, None) => (i, i, new),
    };
    leaf_replace(io, ctx, root, &mut path, from, to, vec![merged])
}

/// Unmaps logical blocks `start .. end` (`end` exclusive, up to 2^32 for "to the end": a
/// truncate) and frees their data blocks with `io.free_data_blocks`, physically contiguous
/// runs in one call. An extent straddling an edge of the range is cut; a range strictly inside
/// one extent splits it in two (which may split tree nodes). Tree blocks left empty are freed
/// and their indexes removed; an emptied tree becomes an empty depth-0 root. Returns the
/// number of data blocks freed.
pub fn remove_range(
    io: &mut dyn MetaIo,
    ctx: &ExtentCtx,
    root: &mut [u8; INODE_BLOCK_SIZE],
    start: u32,
    end: u64,
) -> Result<u64> {
    check_block_size(io);
    if end > LOGICAL_END {
        return Err(FsError::Invalid(format!("range end {end} is beyond 2^32")));
    }
    if u64::from(start) >= end {
        return Ok(0);
    }
    if let Some(freed) = remove_range_inside_one_extent(io, ctx, root, start, end)? {
        return Ok(freed);
    }
    let mut node = read_root(io, ctx, root)?;
    let mut removal = Removal {
        start: u64::from(start),
        end,
        visited: HashSet::new(),
        data_runs: Vec::new(),
        tree_blocks_freed: Vec::new(),
    };
    if removal.node(io, ctx, &mut node)? {
        if node.entries.is_empty() {
            init_root(root);
        } else {
            encode_root(&node, root);
        }
    }
    for block in removal.tree_blocks_freed {
        io.free_meta_block(block)?;
    }
    let mut freed = 0;
    for (first, count) in removal.data_runs {
        io.free_data_blocks(first, count)?;
        freed += count;
    }
    Ok(freed)
}

/// Turns the unwritten blocks of `lblk .. lblk + len` into written ones, splitting extents at
/// the range's edges and merging the converted part with written, contiguous neighbours in the
/// same leaf. Written blocks and holes in the range are left alone. Extents are converted one
/// at a time: after an error (say `NoSpace` for a split) the extents before the failing one
/// stay converted, and `root` shows them.
pub fn mark_written(
    io: &mut dyn MetaIo,
    ctx: &ExtentCtx,
    root: &mut [u8; INODE_BLOCK_SIZE],
    lblk: u32,
    len: u32,
) -> Result<()> {
    check_block_size(io);
    let end = (u64::from(lblk) + u64::from(len)).min(LOGICAL_END);
    let mut pos = u64::from(lblk);
    // Every round moves `pos` strictly forward (past an extent or to the next one), so the
    // loop ends after at most one round per extent and hole in the range.
    while pos < end {
        let pos_lblk = pos as u32; // pos < end <= 2^32
        let mut path = find_path(io, ctx, root, pos_lblk)?;
        let leaf = &path[path.len() - 1].node;
        let extents = leaf.extents();
        let i = extents.partition_point(|e| e.logical <= pos_lblk);
        let containing = i.checked_sub(1).filter(|&j| extents[j].logical_end() > pos);
        let Some(j) = containing else {
            match extents.get(i).map_or(leaf.hi, |e| u64::from(e.logical)) {
                next if next < LOGICAL_END => pos = next,
                _ => break,
            }
            continue;
        };
        let extent = extents[j];
        if !extent.unwritten {
            pos = extent.logical_end();
            continue;
        }
        let (from, to, replacement, converted_end) = mark_written_plan(extents, j, pos, end);
        leaf_replace(io, ctx, root, &mut path, from, to, replacement)?;
        pos = converted_end;
    }
    Ok(())
}

/// Every extent of the tree, in logical order.
pub fn extents(
    io: &mut dyn MetaIo,
    ctx: &ExtentCtx,
    root: &[u8; INODE_BLOCK_SIZE],
) -> Result<Vec<Extent>> {
    let node = read_root(io, ctx, root)?;
    let mut walk = Walk { visited: HashSet::new(), extents: Vec::new(), blocks: Vec::new() };
    walk.node(io, ctx, &node, true)?;
    Ok(walk.extents)
}

/// The tree's index and leaf blocks (not data blocks), parents before children.
pub fn tree_blocks(
    io: &mut dyn MetaIo,
    ctx: &ExtentCtx,
    root: &[u8; INODE_BLOCK_SIZE],
) -> Result<Vec<u64>> {
    let node = read_root(io, ctx, root)?;
    let mut walk = Walk { visited: HashSet::new(), extents: Vec::new(), blocks: Vec::new() };
    walk.node(io, ctx, &node, false)?;
    Ok(walk.blocks)
}

/// One decoded node and the logical range its entries must lie in.
#[derive(Debug, Clone)]
struct Node {
    /// The tree block holding the node; None for the root in `i_block`.
    block: Option<u64>,
    depth: u16,
    max: u16,
    generation: u32,
    entries: ExtentEntries,
    /// Entries lie in logical blocks `lo .. hi` (from the parent's index entries).
    lo: u64,
    hi: u64,
}

impl Node {
    // parse_extent_node returns leaf entries exactly for depth 0, so these match the depth.
    fn extents(&self) -> &[Extent] {
        match &self.entries {
            ExtentEntries::Leaf(extents) => extents,
            ExtentEntries::Index(_) => panic!("depth-{} node holds no extents", self.depth),
        }
    }

    fn extents_mut(&mut self) -> &mut Vec<Extent> {
        match &mut self.entries {
            ExtentEntries::Leaf(extents) => extents,
            ExtentEntries::Index(_) => panic!("depth-{} node holds no extents", self.depth),
        }
    }

    fn indexes_mut(&mut self) -> &mut Vec<ExtentIndex> {
        match &mut self.entries {
            ExtentEntries::Index(indexes) => indexes,
            ExtentEntries::Leaf(_) => panic!("leaf holds no indexes"),
        }
    }

    fn header(&self) -> ExtentHeader {
        let entries = u16::try_from(self.entries.len()).expect("entries <= eh_max, a u16");
        ExtentHeader { entries, max: self.max, depth: self.depth, generation: self.generation }
    }
}

/// One level of a root-to-leaf path: the node, the child taken (index nodes), and whether the
/// node changed and must be written.
#[derive(Debug)]
struct Level {
    node: Node,
    pos: usize,
    dirty: bool,
}
