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

use std::collections::HashSet;

use ondisk::ext4::{
    parse_extent_node, Extent, ExtentEntries, ExtentHeader, ExtentIndex, EXTENT_DEPTH_MAX,
    INODE_BLOCK_SIZE,
};

use crate::error::{FsError, Result};
use crate::image::EXTENT_TREE_BLOCKS_MAX;
use crate::meta_io::MetaIo;

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

fn check_block_size(io: &dyn MetaIo) {
    assert!(io.block_size() >= BLOCK_SIZE_MIN, "block size {} below 1 KiB", io.block_size());
}

fn corrupted(ctx: &ExtentCtx, block: u64, reason: impl std::fmt::Display) -> FsError {
    FsError::corrupted(block, format!("inode {}: extent tree: {reason}", ctx.ino))
}

/// parse_extent_node, with a corrupted node reported at `block`.
fn parse_node(ctx: &ExtentCtx, block: u64, bytes: &[u8]) -> Result<(ExtentHeader, ExtentEntries)> {
    parse_extent_node(bytes).map_err(|err| match err {
        ondisk::OnDiskError::Corrupted { .. } => corrupted(ctx, block, err),
        other => FsError::OnDisk(other),
    })
}

/// Decodes and checks the root in `i_block`.
fn read_root(io: &dyn MetaIo, ctx: &ExtentCtx, root: &[u8; INODE_BLOCK_SIZE]) -> Result<Node> {
    let (header, entries) = parse_node(ctx, ctx.inode_block, root)?;
    if header.max.saturating_add(SLOTS_SLACK_MAX) < ROOT_SLOTS {
        return Err(corrupted(ctx, ctx.inode_block, format!("root eh_max {}", header.max)));
    }
    let node = Node {
        block: None,
        depth: header.depth,
        max: header.max,
        generation: header.generation,
        entries,
        lo: 0,
        hi: LOGICAL_END,
    };
    check_entries(io, ctx, &node)?;
    Ok(node)
}

/// Reads and checks the child `index` of a depth-`parent_depth` node found in `parent_block`;
/// the child's entries must lie in `lo .. hi` and start at `lo`.
fn read_child(
    io: &mut dyn MetaIo,
    ctx: &ExtentCtx,
    parent_block: u64,
    parent_depth: u16,
    index: ExtentIndex,
    hi: u64,
) -> Result<Node> {
    let block = index.leaf;
    let data = io.read_meta(block)?;
    let block_size = io.block_size();
    if data.len() != block_size {
        return Err(corrupted(ctx, block, format!("read {} bytes of a block", data.len())));
    }
    let (header, entries) = parse_node(ctx, block, &data)?;
    if header.depth + 1 != parent_depth {
        return Err(corrupted(
            ctx,
            block,
            format!(
                "depth-{} node under a depth-{parent_depth} index in block {parent_block}",
                header.depth
            ),
        ));
    }
    let slots = ExtentHeader::slots_for(block_size);
    if header.max > slots || header.max.saturating_add(SLOTS_SLACK_MAX) < slots {
        return Err(corrupted(
            ctx,
            block,
            format!("eh_max {} in a {slots}-slot block", header.max),
        ));
    }
    if let Some(seed) = ctx.csum_seed {
        let expected = header.block_checksum(seed, &data);
        if expected.is_none() || expected != header.stored_block_checksum(&data) {
            return Err(corrupted(ctx, block, "checksum mismatch"));
        }
    }
    let node = Node {
        block: Some(block),
        depth: header.depth,
        max: header.max,
        generation: header.generation,
        entries,
        lo: u64::from(index.logical),
        hi,
    };
    if let Some(first) = node.entries.first_logical() {
        if first != index.logical {
            return Err(corrupted(
                ctx,
                block,
                format!("node starts at logical {first}, its index says {}", index.logical),
            ));
        }
    }
    check_entries(io, ctx, &node)?;
    Ok(node)
}

/// Checks what parse_extent_node cannot: entries inside the node's range, and block numbers
/// inside the file system.
fn check_entries(io: &dyn MetaIo, ctx: &ExtentCtx, node: &Node) -> Result<()> {
    let at = node.block.unwrap_or(ctx.inode_block);
    let blocks_count = io.blocks_count();
    match &node.entries {
        ExtentEntries::Leaf(extents) => {
            for e in extents {
                if u64::from(e.logical) < node.lo || e.logical_end() > node.hi {
                    return Err(corrupted(
                        ctx,
                        at,
                        format!(
                            "extent {}+{} outside its range {}..{}",
                            e.logical, e.len, node.lo, node.hi
                        ),
                    ));
                }
                let end = e.start.checked_add(u64::from(e.len));
                if e.start == 0 || end.is_none_or(|end| end > blocks_count) {
                    return Err(corrupted(
                        ctx,
                        at,
                        format!(
                            "extent at logical {} maps to blocks {}+{}",
                            e.logical, e.start, e.len
                        ),
                    ));
                }
            }
        }
        ExtentEntries::Index(indexes) => {
            for index in indexes {
                let logical = u64::from(index.logical);
                if logical < node.lo || logical >= node.hi {
                    return Err(corrupted(
                        ctx,
                        at,
                        format!("index at logical {logical} outside {}..{}", node.lo, node.hi),
                    ));
                }
                if index.leaf == 0 || index.leaf >= blocks_count {
                    return Err(corrupted(
                        ctx,
                        at,
                        format!("child block {} outside the file system", index.leaf),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The path from the root to the leaf whose range holds `lblk` (the first leaf when `lblk` lies
/// before every extent). At most 6 levels: depth falls by one per level from at most 5.
fn find_path(
    io: &mut dyn MetaIo,
    ctx: &ExtentCtx,
    root: &[u8; INODE_BLOCK_SIZE],
    lblk: u32,
) -> Result<Vec<Level>> {
    let mut path = vec![Level { node: read_root(io, ctx, root)?, pos: 0, dirty: false }];
    loop {
        let level = path.last_mut().expect("the path holds the root");
        let ExtentEntries::Index(indexes) = &level.node.entries else {
            return Ok(path);
        };
        // parse_extent_node rejects empty index nodes, so `pos` is a valid entry.
        let pos = indexes.partition_point(|i| i.logical <= lblk).saturating_sub(1);
        let hi = indexes.get(pos + 1).map_or(level.node.hi, |next| u64::from(next.logical));
        let index = indexes[pos];
        level.pos = pos;
        let parent_block = level.node.block.unwrap_or(ctx.inode_block);
        let child = read_child(io, ctx, parent_block, level.node.depth, index, hi)?;
        path.push(Level { node: child, pos: 0, dirty: false });
    }
}

/// Whether `b` can be appended to `a` as one extent (`ext4_can_extents_be_merged`).
fn mergeable(a: &Extent, b: &Extent) -> bool {
    a.unwritten == b.unwritten
        && a.logical_end() == u64::from(b.logical)
        && a.start + u64::from(a.len) == b.start
        && a.len + b.len <= Extent::len_max(a.unwritten)
}

/// How converting `pos .. end` of the unwritten extent `extents[j]` (which holds `pos`)
/// changes the leaf: replace `extents[from..to]` by the returned extents. Also returns where
/// the conversion stopped.
fn mark_written_plan(
    extents: &[Extent],
    j: usize,
    pos: u64,
    end: u64,
) -> (usize, usize, Vec<Extent>, u64) {
    let extent = extents[j];
    let first = u64::from(extent.logical);
    let stop = extent.logical_end().min(end);
    let at = |logical: u64| extent.start + (logical - first);
    let mut middle =
        Extent { logical: pos as u32, len: (stop - pos) as u32, start: at(pos), unwritten: false };
    let (mut from, mut to) = (j, j + 1);
    let mut replacement = Vec::with_capacity(3);
    if pos > first {
        replacement.push(Extent { len: (pos - first) as u32, ..extent });
    } else if let Some(left) = j.checked_sub(1).map(|i| extents[i]) {
        if mergeable(&left, &middle) {
            middle = Extent { len: left.len + middle.len, ..left };
            from = j - 1;
        }
    }
    let tail = (stop < extent.logical_end()).then(|| Extent {
        logical: stop as u32,
        len: (extent.logical_end() - stop) as u32,
        start: at(stop),
        unwritten: true,
    });
    if tail.is_none() {
        if let Some(right) = extents.get(j + 1) {
            if mergeable(&middle, right) {
                middle.len += right.len;
                to = j + 2;
            }
        }
    }
    replacement.push(middle);
    replacement.extend(tail);
    (from, to, replacement, stop)
}

/// The remove_range case that needs a new extent: `start .. end` lies strictly inside one
/// extent, which becomes a head and a tail. Returns None when the range is not such a case.
fn remove_range_inside_one_extent(
    io: &mut dyn MetaIo,
    ctx: &ExtentCtx,
    root: &mut [u8; INODE_BLOCK_SIZE],
    start: u32,
    end: u64,
) -> Result<Option<u64>> {
    let mut path = find_path(io, ctx, root, start)?;
    let extents = path[path.len() - 1].node.extents();
    let i = extents.partition_point(|e| e.logical <= start);
    let Some(j) = i.checked_sub(1) else {
        return Ok(None);
    };
    let extent = extents[j];
    let first = u64::from(extent.logical);
    if first >= u64::from(start) || extent.logical_end() <= end {
        return Ok(None);
    }
    let head = Extent { len: start - extent.logical, ..extent };
    let tail = Extent {
        logical: end as u32, // end < logical_end <= 2^32 - 1
        len: (extent.logical_end() - end) as u32,
        start: extent.start + (end - first),
        unwritten: extent.unwritten,
    };
    leaf_replace(io, ctx, root, &mut path, j, j + 1, vec![head, tail])?;
    let count = end - u64::from(start);
    io.free_data_blocks(extent.start + u64::from(start - extent.logical), count)?;
    Ok(Some(count))
}

/// Replaces `extents[from..to]` of the path's leaf by `replacement` (at most two entries more
/// than it replaces), splitting nodes and growing the tree as needed, and writes every changed
/// node, the root last.
fn leaf_replace(
    io: &mut dyn MetaIo,
    ctx: &ExtentCtx,
    root: &mut [u8; INODE_BLOCK_SIZE],
    path: &mut Vec<Level>,
    from: usize,
    to: usize,
    replacement: Vec<Extent>,
) -> Result<()> {
    let leaf_level = path.len() - 1;
    let old_len = path[leaf_level].node.entries.len();
    assert!(from <= to && to <= old_len, "replace {from}..{to} of {old_len} extents");
    assert!(replacement.len() <= to - from + 2, "a change adds at most two extents");
    let new_len = old_len - (to - from) + replacement.len();
    let needed = blocks_needed(path, new_len)?;
    let mut fresh = alloc_blocks(io, ctx, needed)?;
    path[leaf_level].node.extents_mut().splice(from..to, replacement);
    path[leaf_level].dirty = true;
    settle(io, ctx, path, leaf_level, to == old_len, &mut fresh)?;
    assert!(fresh.is_empty(), "{} preallocated blocks unused", fresh.len());
    for level in &path[1..] {
        if level.dirty {
            write_block_node(io, ctx, &level.node)?;
        }
    }
    if path[0].dirty {
        encode_root(&path[0].node, root);
    }
    Ok(())
}

/// How many new blocks absorbing a leaf of `leaf_len` entries takes: one per consecutive
/// overflowing level from the leaf up (a split each, or the root's growth).
fn blocks_needed(path: &[Level], leaf_len: usize) -> Result<usize> {
    let mut needed = 0;
    let mut level = path.len() - 1;
    let mut len = leaf_len;
    loop {
        let node = &path[level].node;
        if len <= usize::from(node.max) {
            return Ok(needed);
        }
        needed += 1;
        if level == 0 {
            if node.depth >= EXTENT_DEPTH_MAX {
                // The kernel's limit too: the file maps as many extents as ext4 allows.
                return Err(FsError::FileTooLarge);
            }
            return Ok(needed);
        }
        level -= 1;
        len = path[level].node.entries.len() + 1;
    }
}

/// Allocates `count` tree blocks near the goal; on failure frees those already taken.
fn alloc_blocks(io: &mut dyn MetaIo, ctx: &ExtentCtx, count: usize) -> Result<Vec<u64>> {
    let mut fresh = Vec::with_capacity(count);
    for _ in 0..count {
        match io.alloc_meta_block(ctx.goal) {
            Ok(block) => {
                assert!(block != 0 && block < io.blocks_count(), "allocator returned {block}");
                fresh.push(block);
            }
            Err(err) => {
                for block in fresh {
                    // The allocation error is the one to report; a failing free has already
                    // turned the file system read-only.
                    let _ = io.free_meta_block(block);
                }
                return Err(err);
            }
        }
    }
    Ok(fresh)
}

/// Absorbs an overflow at `level` upward (see the module table), consuming `fresh` blocks, and
/// corrects the indexes above every node whose first logical block changed. `at_end`: the
/// change was at the end of the node.
fn settle(
    io: &mut dyn MetaIo,
    ctx: &ExtentCtx,
    path: &mut Vec<Level>,
    mut level: usize,
    mut at_end: bool,
    fresh: &mut Vec<u64>,
) -> Result<()> {
    loop {
        let len = path[level].node.entries.len();
        let max = usize::from(path[level].node.max);
        if len <= max {
            correct_indexes(path, level);
            return Ok(());
        }
        let block = fresh.pop().expect("blocks_needed counted this split");
        if level == 0 {
            grow(io, path, block);
            return Ok(());
        }
        // len <= max + 2 <= 2 * max, so both halves fit.
        let split = if at_end { max } else { len / 2 };
        if let Some(moved_from) = path[level].node.block {
            // Its upper half moves to the new node (see `MetaIo::order_late`).
            io.order_late(moved_from);
        }
        let node = &mut path[level].node;
        let right_entries = match &mut node.entries {
            ExtentEntries::Leaf(extents) => ExtentEntries::Leaf(extents.split_off(split)),
            ExtentEntries::Index(indexes) => ExtentEntries::Index(indexes.split_off(split)),
        };
        let right_first = right_entries.first_logical().expect("the split leaves both halves");
        let right = Node {
            block: Some(block),
            depth: node.depth,
            max: ExtentHeader::slots_for(io.block_size()),
            generation: 0,
            entries: right_entries,
            lo: u64::from(right_first),
            hi: node.hi,
        };
        node.hi = u64::from(right_first);
        write_block_node(io, ctx, &right)?;
        path[level].dirty = true;
        correct_indexes(path, level);
        let parent = &mut path[level - 1];
        let at = parent.pos + 1;
        let indexes = parent.node.indexes_mut();
        at_end = at == indexes.len();
        indexes.insert(at, ExtentIndex { logical: right_first, leaf: block });
        parent.dirty = true;
        level -= 1;
    }
}

/// Moves the overflowing root's entries into `block` and makes the root a one-entry index
/// one level deeper (`ext4_ext_grow_indepth`). A root holds at most 4 + 2 entries here, which
/// a block node always holds.
fn grow(io: &dyn MetaIo, path: &mut Vec<Level>, block: u64) {
    let root = &mut path[0];
    let entries = std::mem::replace(&mut root.node.entries, ExtentEntries::Index(Vec::new()));
    let first = entries.first_logical().expect("an overflowing root is not empty");
    let moved = Node {
        block: Some(block),
        depth: root.node.depth,
        max: ExtentHeader::slots_for(io.block_size()),
        generation: root.node.generation,
        entries,
        lo: u64::from(first),
        hi: LOGICAL_END,
    };
    assert!(moved.entries.len() <= usize::from(moved.max));
    root.node.entries = ExtentEntries::Index(vec![ExtentIndex { logical: first, leaf: block }]);
    root.node.depth += 1;
    root.dirty = true;
    let pos = std::mem::replace(&mut root.pos, 0);
    path.insert(1, Level { node: moved, pos, dirty: true });
}

/// After the first logical block of `path[level]` changed, sets the index pointing at it, and
/// those above while the node is its parent's first child (`ext4_ext_correct_indexes`).
fn correct_indexes(path: &mut [Level], level: usize) {
    let Some(first) = path[level].node.entries.first_logical() else {
        return;
    };
    for above in path[..level].iter_mut().rev() {
        let pos = above.pos;
        let index = &mut above.node.indexes_mut()[pos];
        if index.logical == first {
            return;
        }
        index.logical = first;
        above.dirty = true;
        if pos != 0 {
            return;
        }
    }
}

fn write_block_node(io: &mut dyn MetaIo, ctx: &ExtentCtx, node: &Node) -> Result<()> {
    let block = node.block.expect("only tree blocks are written as blocks");
    let mut data = vec![0u8; io.block_size()];
    let header = node.header();
    header.encode_node(&node.entries, &mut data);
    if let Some(seed) = ctx.csum_seed {
        header.seal_block(seed, &mut data);
    }
    io.write_meta(block, &data)
}

fn encode_root(node: &Node, root: &mut [u8; INODE_BLOCK_SIZE]) {
    let mut bytes = [0u8; INODE_BLOCK_SIZE];
    node.header().encode_node(&node.entries, &mut bytes);
    *root = bytes;
}

/// Refuses a block seen before in this walk, and walks beyond the size limit.
fn visit(ctx: &ExtentCtx, visited: &mut HashSet<u64>, parent: u64, child: u64) -> Result<()> {
    if !visited.insert(child) {
        return Err(corrupted(ctx, parent, format!("tree block {child} is referenced twice")));
    }
    if visited.len() > EXTENT_TREE_BLOCKS_MAX {
        return Err(FsError::Unsupported(format!(
            "inode {}: extent tree of more than {EXTENT_TREE_BLOCKS_MAX} blocks",
            ctx.ino
        )));
    }
    Ok(())
}

/// State of a whole-tree walk for [`extents`] and [`tree_blocks`].
struct Walk {
    visited: HashSet<u64>,
    extents: Vec<Extent>,
    blocks: Vec<u64>,
}

impl Walk {
    /// Visits `node`; reads leaves only when `want_extents`.
    fn node(
        &mut self,
        io: &mut dyn MetaIo,
        ctx: &ExtentCtx,
        node: &Node,
        want_extents: bool,
    ) -> Result<()> {
        let ExtentEntries::Index(indexes) = &node.entries else {
            self.extents.extend_from_slice(node.extents());
            return Ok(());
        };
        let parent = node.block.unwrap_or(ctx.inode_block);
        for (i, &index) in indexes.iter().enumerate() {
            visit(ctx, &mut self.visited, parent, index.leaf)?;
            self.blocks.push(index.leaf);
            if node.depth == 1 && !want_extents {
                continue;
            }
            let hi = indexes.get(i + 1).map_or(node.hi, |next| u64::from(next.logical));
            let child = read_child(io, ctx, parent, node.depth, index, hi)?;
            self.node(io, ctx, &child, want_extents)?;
        }
        Ok(())
    }
}

/// State of the general case of [`remove_range`]: no extent needs splitting in two.
struct Removal {
    start: u64,
    end: u64,
    visited: HashSet<u64>,
    /// Data blocks to free as (first, count), physically contiguous runs merged.
    data_runs: Vec<(u64, u64)>,
    /// Tree blocks no longer referenced.
    tree_blocks_freed: Vec<u64>,
}

impl Removal {
    /// Removes the range from `node`'s subtree, writing changed children and dropping emptied
    /// ones. Returns whether `node` itself changed (the caller writes it).
    fn node(&mut self, io: &mut dyn MetaIo, ctx: &ExtentCtx, node: &mut Node) -> Result<bool> {
        let at = node.block.unwrap_or(ctx.inode_block);
        if let ExtentEntries::Leaf(extents) = &mut node.entries {
            let old = std::mem::take(extents);
            let mut changed = false;
            for extent in old {
                match self.cut_extent(ctx, at, extent)? {
                    None => extents.push(extent),
                    Some(kept) => {
                        changed = true;
                        extents.extend(kept);
                    }
                }
            }
            return Ok(changed);
        }
        let hi = node.hi;
        let depth = node.depth;
        let indexes = node.indexes_mut();
        let old = std::mem::take(indexes);
        let mut changed = false;
        for (i, &index) in old.iter().enumerate() {
            let child_hi = old.get(i + 1).map_or(hi, |next| u64::from(next.logical));
            if child_hi <= self.start || u64::from(index.logical) >= self.end {
                indexes.push(index);
                continue;
            }
            visit(ctx, &mut self.visited, at, index.leaf)?;
            let mut child = read_child(io, ctx, at, depth, index, child_hi)?;
            let child_changed = self.node(io, ctx, &mut child)?;
            let Some(first) = child.entries.first_logical() else {
                self.tree_blocks_freed.push(index.leaf);
                changed = true;
                continue;
            };
            if child_changed {
                write_block_node(io, ctx, &child)?;
            }
            if first != index.logical {
                changed = true;
            }
            indexes.push(ExtentIndex { logical: first, leaf: index.leaf });
        }
        Ok(changed)
    }

    /// What remains of `extent` outside the range (None: untouched), recording the data
    /// blocks cut off.
    fn cut_extent(
        &mut self,
        ctx: &ExtentCtx,
        at: u64,
        extent: Extent,
    ) -> Result<Option<Vec<Extent>>> {
        let first = u64::from(extent.logical);
        let end = extent.logical_end();
        if end <= self.start || first >= self.end {
            return Ok(None);
        }
        if first < self.start && end > self.end {
            // remove_range_inside_one_extent handles this case before the walk starts.
            return Err(corrupted(ctx, at, format!("extent at {first} straddles the whole range")));
        }
        let cut_first = first.max(self.start);
        let cut_end = end.min(self.end);
        self.push_data_run(extent.start + (cut_first - first), cut_end - cut_first);
        let mut kept = Vec::with_capacity(1);
        if first < self.start {
            kept.push(Extent { len: (self.start - first) as u32, ..extent });
        }
        if end > self.end {
            kept.push(Extent {
                logical: self.end as u32, // self.end < end <= 2^32 - 1
                len: (end - self.end) as u32,
                start: extent.start + (self.end - first),
                unwritten: extent.unwritten,
            });
        }
        Ok(Some(kept))
    }

    fn push_data_run(&mut self, first: u64, count: u64) {
        match self.data_runs.last_mut() {
            Some((run_first, run_count)) if *run_first + *run_count == first => *run_count += count,
            _ => self.data_runs.push((first, count)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta_io::mem::MemMetaIo;
    use ondisk::testing::Rng;
    use std::collections::{BTreeMap, BTreeSet};

    /// Data blocks live above this block; tree blocks are allocated below it (goal 1).
    const DATA_BASE: u64 = 1 << 22;
    const BLOCKS_COUNT: u64 = 1 << 28;

    /// A tree in a MemMetaIo, the model it must match (logical block → (physical, unwritten)),
    /// and the data blocks the test owns.
    struct Harness {
        io: MemMetaIo,
        ctx: ExtentCtx,
        root: [u8; INODE_BLOCK_SIZE],
        model: BTreeMap<u32, (u64, bool)>,
        data_next: u64,
    }

    impl Harness {
        fn new(block_size: usize, csum: bool) -> Harness {
            let mut root = [0u8; INODE_BLOCK_SIZE];
            init_root(&mut root);
            Harness {
                io: MemMetaIo::new(block_size, BLOCKS_COUNT),
                ctx: ExtentCtx {
                    ino: 12,
                    inode_block: 77,
                    csum_seed: csum.then_some(0x1234_5678),
                    goal: 1,
                },
                root,
                model: BTreeMap::new(),
                data_next: DATA_BASE,
            }
        }

        fn mapped_in(&self, lblk: u32, len: u32) -> bool {
            self.model.range(lblk..=lblk + (len - 1)).next().is_some()
        }

        /// Allocates `len` data blocks, at `want` when those are free.
        fn alloc_data(&mut self, len: u32, want: Option<u64>) -> u64 {
            let len = u64::from(len);
            if let Some(want) = want {
                if want >= DATA_BASE
                    && want + len <= BLOCKS_COUNT
                    && self.io.allocated.range(want..want + len).next().is_none()
                {
                    self.io.mark_allocated(want, len);
                    return want;
                }
            }
            let mut start = self.data_next;
            while self.io.allocated.range(start..start + len).next().is_some() {
                start += len + 1;
            }
            self.data_next = start + len + 1; // a gap, so bump allocations are not contiguous
            self.io.mark_allocated(start, len);
            start
        }

        /// Inserts through the API and the model; `contiguous` asks for physical blocks that
        /// continue the extent before `lblk` (or precede the one after), to exercise merges.
        fn insert(&mut self, lblk: u32, len: u32, unwritten: bool, contiguous: bool) {
            if self.mapped_in(lblk, len) {
                let before = self.root;
                let err = insert(
                    &mut self.io,
                    &self.ctx,
                    &mut self.root,
                    lblk,
                    DATA_BASE,
                    len,
                    unwritten,
                )
                .expect_err("inserting over mapped blocks must fail");
                assert!(matches!(err, FsError::Invalid(_)), "{err}");
                assert_eq!(before, self.root);
                return;
            }
            let want = contiguous.then(|| {
                let left =
                    lblk.checked_sub(1).and_then(|l| self.model.get(&l)).map(|&(p, _)| p + 1);
                let right =
                    self.model.get(&(lblk + len)).and_then(|&(p, _)| p.checked_sub(u64::from(len)));
                left.or(right)
            });
            let pblk = self.alloc_data(len, want.flatten());
            insert(&mut self.io, &self.ctx, &mut self.root, lblk, pblk, len, unwritten).unwrap();
            for i in 0..len {
                self.model.insert(lblk + i, (pblk + u64::from(i), unwritten));
            }
        }

        fn remove(&mut self, start: u32, end: u64) {
            let freed = remove_range(&mut self.io, &self.ctx, &mut self.root, start, end).unwrap();
            let gone: Vec<u32> = self
                .model
                .range(start..)
                .map(|(&l, _)| l)
                .take_while(|&l| u64::from(l) < end)
                .collect();
            for l in &gone {
                self.model.remove(l);
            }
            assert_eq!(freed, gone.len() as u64, "blocks freed by remove_range({start}, {end})");
        }

        fn mark_written(&mut self, lblk: u32, len: u32) {
            mark_written(&mut self.io, &self.ctx, &mut self.root, lblk, len).unwrap();
            let end = u64::from(lblk) + u64::from(len);
            for (_, (_, unwritten)) in
                self.model.range_mut(lblk..).take_while(|(&l, _)| u64::from(l) < end)
            {
                *unwritten = false;
            }
        }

        /// Checks `lookup(lblk)` against the model and the extent list.
        fn check_lookup(&mut self, lblk: u32, extents: &[Extent]) {
            let found = lookup(&mut self.io, &self.ctx, &self.root, lblk).unwrap();
            match self.model.get(&lblk) {
                Some(&(pblk, unwritten)) => {
                    let e = extents
                        .iter()
                        .find(|e| e.logical <= lblk && e.logical_end() > u64::from(lblk))
                        .unwrap();
                    let len = (e.logical_end() - u64::from(lblk)) as u32;
                    assert_eq!(found, Lookup::Mapped { pblk, len, unwritten }, "lookup({lblk})");
                }
                None => {
                    let next = self.model.range(lblk..).next().map(|(&l, _)| l - lblk);
                    assert_eq!(found, Lookup::Hole { len_to_next: next }, "lookup({lblk})");
                }
            }
        }

        /// Full check: the extent list matches the model, the tree keeps every structural
        /// invariant, and the allocated blocks are exactly the tree's plus the model's.
        fn check(&mut self, rng: &mut Rng) {
            let extents = extents(&mut self.io, &self.ctx, &self.root).unwrap();
            let mut mapped = BTreeMap::new();
            for e in &extents {
                for i in 0..e.len {
                    mapped.insert(e.logical + i, (e.start + u64::from(i), e.unwritten));
                }
            }
            assert!(mapped == self.model, "extent list differs from the model");
            let structure = check_structure(&self.io, &self.ctx, &self.root);
            assert_eq!(structure.extents, extents);
            assert_eq!(tree_blocks(&mut self.io, &self.ctx, &self.root).unwrap(), structure.blocks);
            assert_eq!(depth(&self.root), structure.depth);
            let mut expected: BTreeSet<u64> = structure.blocks.iter().copied().collect();
            expected.extend(self.model.values().map(|&(p, _)| p));
            assert!(self.io.allocated == expected, "leaked or lost blocks");
            for _ in 0..16 {
                let lblk = match (rng.below(3), extents.is_empty()) {
                    (0, false) => {
                        let e = extents[rng.below(extents.len() as u64) as usize];
                        e.logical.wrapping_add((rng.below(3) as u32).wrapping_sub(1))
                    }
                    _ => rng.below(1 << 16) as u32,
                };
                self.check_lookup(lblk, &extents);
            }
        }
    }

    struct Structure {
        depth: u16,
        blocks: Vec<u64>,
        extents: Vec<Extent>,
    }

    /// Walks the tree with the on-disk parser alone (not the module's reader) and asserts every
    /// invariant e2fsck checks.
    fn check_structure(
        io: &MemMetaIo,
        ctx: &ExtentCtx,
        root: &[u8; INODE_BLOCK_SIZE],
    ) -> Structure {
        let (header, entries) = parse_extent_node(root).unwrap();
        assert_eq!(header.max, 4, "root eh_max");
        let mut structure =
            Structure { depth: header.depth, blocks: Vec::new(), extents: Vec::new() };
        check_node(io, ctx, header.depth, entries, 0, LOGICAL_END, &mut structure);
        let unique: BTreeSet<u64> = structure.blocks.iter().copied().collect();
        assert_eq!(unique.len(), structure.blocks.len(), "a tree block is referenced twice");
        structure
    }

    fn check_node(
        io: &MemMetaIo,
        ctx: &ExtentCtx,
        depth: u16,
        entries: ExtentEntries,
        lo: u64,
        hi: u64,
        structure: &mut Structure,
    ) {
        match entries {
            ExtentEntries::Leaf(extents) => {
                for e in extents {
                    assert!(
                        u64::from(e.logical) >= lo && e.logical_end() <= hi,
                        "{e:?} outside {lo}..{hi}"
                    );
                    for b in e.start..e.start + u64::from(e.len) {
                        assert!(io.allocated.contains(&b), "data block {b} not allocated");
                    }
                    structure.extents.push(e);
                }
            }
            ExtentEntries::Index(indexes) => {
                for (i, index) in indexes.iter().enumerate() {
                    let child_hi = indexes.get(i + 1).map_or(hi, |n| u64::from(n.logical));
                    assert!(u64::from(index.logical) >= lo && u64::from(index.logical) < child_hi);
                    assert!(
                        io.allocated.contains(&index.leaf),
                        "tree block {} not allocated",
                        index.leaf
                    );
                    structure.blocks.push(index.leaf);
                    let data = io.blocks.get(&index.leaf).expect("tree block written");
                    let (header, child) = parse_extent_node(data).unwrap();
                    assert_eq!(header.depth + 1, depth);
                    assert_eq!(header.max, ExtentHeader::slots_for(io.block_size), "eh_max");
                    assert!(!child.is_empty(), "empty tree block {}", index.leaf);
                    assert_eq!(
                        child.first_logical(),
                        Some(index.logical),
                        "ei_block of {}",
                        index.leaf
                    );
                    if let Some(seed) = ctx.csum_seed {
                        let stored = header.stored_block_checksum(data);
                        assert_eq!(
                            stored,
                            header.block_checksum(seed, data),
                            "csum of {}",
                            index.leaf
                        );
                    }
                    check_node(
                        io,
                        ctx,
                        header.depth,
                        child,
                        u64::from(index.logical),
                        child_hi,
                        structure,
                    );
                }
            }
        }
    }

    /// One random step on the harness.
    fn random_step(h: &mut Harness, rng: &mut Rng, span: u32) {
        match rng.below(20) {
            0..=10 => {
                let lblk = rng.below(u64::from(span)) as u32;
                let len = if rng.chance(50) {
                    1 + rng.below(32768) as u32
                } else {
                    1 + rng.below(8) as u32
                };
                let unwritten = rng.chance(3);
                let len = len.min(Extent::len_max(unwritten));
                h.insert(lblk, len, unwritten, rng.chance(2));
            }
            11..=12 => {
                let start = rng.below(u64::from(span)) as u32;
                h.remove(start, u64::from(start) + 1 + rng.below(64));
            }
            13 => {
                let start = rng.below(u64::from(span)) as u32;
                h.remove(start, LOGICAL_END);
            }
            14..=16 => {
                let lblk = rng.below(u64::from(span)) as u32;
                h.mark_written(lblk, 1 + rng.below(40) as u32);
            }
            _ => {
                let lblk = rng.below(u64::from(span) + 100) as u32;
                let extents = extents(&mut h.io, &h.ctx, &h.root).unwrap();
                h.check_lookup(lblk, &extents);
            }
        }
    }

    #[test]
    fn random_operations_match_a_model_after_every_step() {
        let mut rng = Rng::from_env("random_operations_match_a_model_after_every_step");
        for (block_size, csum) in [(1024, true), (4096, false), (1024, false), (4096, true)] {
            let mut h = Harness::new(block_size, csum);
            let span = 4000 + rng.below(6000) as u32;
            for _ in 0..2500 {
                random_step(&mut h, &mut rng, span);
                h.check(&mut rng);
            }
            h.remove(0, LOGICAL_END);
            h.check(&mut rng);
            assert_eq!(depth(&h.root), 0);
            assert!(h.io.allocated.is_empty(), "removing everything frees every block");
        }
    }

    #[test]
    fn sequential_appends_grow_a_1k_tree_to_depth_three_and_removal_frees_it_all() {
        let mut rng = Rng::from_env("sequential_appends_grow_a_1k_tree_to_depth_three");
        let mut h = Harness::new(1024, true);
        // Every other logical block: nothing merges, and appends fill nodes completely
        // (4 * 84 * 84 extents fit in depth 2).
        let count = 4 * 84 * 84 + 200;
        for i in 0..count {
            h.insert(2 * i, 1, i % 3 == 0, true);
            if i % 4000 == 0 {
                h.check(&mut rng);
            }
        }
        h.check(&mut rng);
        assert_eq!(depth(&h.root), 3);
        let blocks = tree_blocks(&mut h.io, &h.ctx, &h.root).unwrap();
        // Appends split at the end, so leaves are full: 28424 / 84 rounded up.
        let leaves = blocks.len()
            - blocks
                .iter()
                .filter(|&&b| parse_extent_node(&h.io.blocks[&b]).unwrap().0.depth > 0)
                .count();
        assert_eq!(leaves, (count as usize).div_ceil(84));
        // Punch holes and truncate in random places, then remove the rest from the front.
        for _ in 0..200 {
            let start = rng.below(2 * u64::from(count)) as u32;
            h.remove(start, u64::from(start) + 1 + rng.below(400));
        }
        h.check(&mut rng);
        h.remove(count, LOGICAL_END);
        h.check(&mut rng);
        let mut front = 0u32;
        while front < 2 * count {
            front += 1 + rng.below(3000) as u32;
            h.remove(0, u64::from(front));
            h.check(&mut rng);
        }
        assert!(h.io.allocated.is_empty(), "{} blocks leaked", h.io.allocated.len());
        assert_eq!(h.root, {
            let mut empty = [0u8; INODE_BLOCK_SIZE];
            init_root(&mut empty);
            empty
        });
    }

    #[test]
    fn descending_inserts_split_in_half_and_keep_indexes_at_each_childs_first_block() {
        let mut rng = Rng::from_env("descending_inserts_split_in_half");
        for block_size in [1024, 4096] {
            let mut h = Harness::new(block_size, block_size == 1024);
            // Inserting in front of everything moves every ancestor index down each time.
            let count = if block_size == 1024 { 12_000 } else { 1500 };
            for i in (0..count).rev() {
                h.insert(3 * i + 1, 1 + i % 2, false, false);
                if i % 1000 == 0 {
                    h.check(&mut rng);
                }
            }
            let expected_depth = if block_size == 1024 { 3 } else { 2 };
            assert_eq!(depth(&h.root), expected_depth, "{block_size}-byte blocks");
            // Random removals and conversions on the deep tree, fully checked each step.
            for _ in 0..300 {
                random_step(&mut h, &mut rng, 3 * count);
                h.check(&mut rng);
            }
            h.remove(0, LOGICAL_END);
            h.check(&mut rng);
            assert!(h.io.allocated.is_empty());
        }
    }

    #[test]
    fn insert_merges_physically_contiguous_neighbours_up_to_the_length_limit() {
        let mut h = Harness::new(4096, true);
        let p = DATA_BASE;
        h.io.mark_allocated(p, 70000);
        let add = |h: &mut Harness, l: u32, off: u64, len: u32, unwritten: bool| {
            insert(&mut h.io, &h.ctx, &mut h.root, l, p + off, len, unwritten).unwrap();
        };
        add(&mut h, 10, 10, 5, false);
        add(&mut h, 15, 15, 5, false); // merges left
        add(&mut h, 5, 5, 5, false); // merges right
        add(&mut h, 25, 25, 5, false);
        add(&mut h, 20, 20, 5, false); // bridges both
        add(&mut h, 30, 31, 1, false); // physically discontiguous: no merge
        add(&mut h, 31, 32, 1, true); // different state: no merge
        let got = extents(&mut h.io, &h.ctx, &h.root).unwrap();
        assert_eq!(
            got,
            vec![
                Extent { logical: 5, len: 25, start: p + 5, unwritten: false },
                Extent { logical: 30, len: 1, start: p + 31, unwritten: false },
                Extent { logical: 31, len: 1, start: p + 32, unwritten: true },
            ]
        );
        // Length limits: 32768 written, 32767 unwritten.
        add(&mut h, 1000, 1000, 32000, false);
        add(&mut h, 33000, 33000, 768, false); // exactly 32768
        add(&mut h, 33768, 33768, 1, false); // would be 32769
        add(&mut h, 40000, 40000, 32000, true);
        add(&mut h, 72000, 72000 - 40000 + 40000, 767, true); // exactly 32767 when contiguous
        let got = extents(&mut h.io, &h.ctx, &h.root).unwrap();
        assert_eq!(got[3], Extent { logical: 1000, len: 32768, start: p + 1000, unwritten: false });
        assert_eq!(got[4], Extent { logical: 33768, len: 1, start: p + 33768, unwritten: false });
        assert_eq!(got[5].len, 32767, "{got:?}");
        let err = insert(&mut h.io, &h.ctx, &mut h.root, 90000, p, 32768, true).unwrap_err();
        assert!(matches!(err, FsError::Invalid(_)));
        let err = insert(&mut h.io, &h.ctx, &mut h.root, u32::MAX - 1, p, 2, false).unwrap_err();
        assert!(matches!(err, FsError::FileTooLarge));
        let err =
            insert(&mut h.io, &h.ctx, &mut h.root, 0, BLOCKS_COUNT - 1, 2, false).unwrap_err();
        assert!(matches!(err, FsError::Invalid(_)));
        let err = insert(&mut h.io, &h.ctx, &mut h.root, 29, p + 500, 2, false).unwrap_err();
        assert!(matches!(err, FsError::Invalid(_)), "overlaps the first extent's end");
    }

    #[test]
    fn mark_written_splits_unwritten_extents_and_merges_converted_neighbours() {
        let mut h = Harness::new(1024, true);
        let p = DATA_BASE;
        h.io.mark_allocated(p, 100);
        insert(&mut h.io, &h.ctx, &mut h.root, 0, p, 10, false).unwrap();
        insert(&mut h.io, &h.ctx, &mut h.root, 10, p + 10, 20, true).unwrap();
        // The middle: head and tail stay unwritten.
        mark_written(&mut h.io, &h.ctx, &mut h.root, 15, 5).unwrap();
        let got = extents(&mut h.io, &h.ctx, &h.root).unwrap();
        let e = |logical, len, unwritten| Extent {
            logical,
            len,
            start: p + u64::from(logical),
            unwritten,
        };
        assert_eq!(got, vec![e(0, 10, false), e(10, 5, true), e(15, 5, false), e(20, 10, true)]);
        // The head joins the written extents on both sides: one extent 0..20.
        mark_written(&mut h.io, &h.ctx, &mut h.root, 10, 5).unwrap();
        assert_eq!(
            extents(&mut h.io, &h.ctx, &h.root).unwrap(),
            vec![e(0, 20, false), e(20, 10, true)]
        );
        // A range over written blocks, the rest, and a hole past the end.
        mark_written(&mut h.io, &h.ctx, &mut h.root, 5, 100).unwrap();
        assert_eq!(extents(&mut h.io, &h.ctx, &h.root).unwrap(), vec![e(0, 30, false)]);
        assert_eq!(
            lookup(&mut h.io, &h.ctx, &h.root, 7).unwrap(),
            Lookup::Mapped { pblk: p + 7, len: 23, unwritten: false }
        );
        assert_eq!(
            lookup(&mut h.io, &h.ctx, &h.root, 30).unwrap(),
            Lookup::Hole { len_to_next: None }
        );
    }

    #[test]
    fn mark_written_in_the_middle_of_a_full_leaf_splits_it_once() {
        let mut h = Harness::new(1024, true);
        let mut rng = Rng(4);
        // Appends leave the first leaf full (84 extents).
        for i in 0..100 {
            h.insert(10 * i, 4, true, false);
        }
        let first_leaf = tree_blocks(&mut h.io, &h.ctx, &h.root).unwrap()[0];
        assert_eq!(parse_extent_node(&h.io.blocks[&first_leaf]).unwrap().0.entries, 84);
        // Converting the middle of extent 40 needs two more slots in that leaf.
        h.mark_written(401, 2);
        h.check(&mut rng);
        assert_eq!(tree_blocks(&mut h.io, &h.ctx, &h.root).unwrap().len(), 3);
        assert_eq!(extents(&mut h.io, &h.ctx, &h.root).unwrap().len(), 102);
        // And punching inside an extent of a full leaf splits it the same way.
        h.remove(10 * 83 + 1, 10 * 83 + 3);
        h.check(&mut rng);
    }

    #[test]
    fn punching_inside_an_extent_of_a_full_root_grows_the_tree() {
        let mut h = Harness::new(1024, true);
        for i in 0..4 {
            h.insert(100 * i, 50, false, false);
        }
        assert_eq!(depth(&h.root), 0);
        let mut rng = Rng(1);
        h.remove(110, 120);
        assert_eq!(depth(&h.root), 1);
        h.check(&mut rng);
        assert_eq!(extents(&mut h.io, &h.ctx, &h.root).unwrap().len(), 5);
        // Removing all of the only leaf's entries frees it and returns to an empty root.
        h.remove(0, 1000);
        h.check(&mut rng);
        assert_eq!(depth(&h.root), 0);
        assert!(h.io.allocated.is_empty());
        assert_eq!(h.io.meta_freed.len(), 1);
    }

    #[test]
    fn removal_at_the_front_of_a_leaf_moves_its_index() {
        let mut h = Harness::new(1024, true);
        let mut rng = Rng(2);
        for i in 0..300 {
            h.insert(10 * i, 4, false, false);
        }
        assert_eq!(depth(&h.root), 1);
        let (_, ExtentEntries::Index(before)) = parse_extent_node(&h.root).unwrap() else {
            panic!()
        };
        let second = before[1].logical;
        // Cut the first extent of the second leaf in half, then remove it entirely.
        h.remove(second, u64::from(second) + 2);
        h.check(&mut rng);
        let (_, ExtentEntries::Index(after)) = parse_extent_node(&h.root).unwrap() else {
            panic!()
        };
        assert_eq!(after[1].logical, second + 2);
        h.remove(second, u64::from(second) + 10);
        h.check(&mut rng);
        let (_, ExtentEntries::Index(after)) = parse_extent_node(&h.root).unwrap() else {
            panic!()
        };
        assert_eq!(after[1].logical, second + 10);
        // Data frees come as contiguous runs: a truncate of physically contiguous extents
        // frees them in one call.
        let mut h = Harness::new(4096, false);
        h.io.mark_allocated(DATA_BASE, 64);
        for i in 0..4 {
            let state = i % 2 == 1; // alternate states so the extents do not merge
            insert(
                &mut h.io,
                &h.ctx,
                &mut h.root,
                16 * i,
                DATA_BASE + 16 * u64::from(i),
                16,
                state,
            )
            .unwrap();
        }
        assert_eq!(remove_range(&mut h.io, &h.ctx, &mut h.root, 8, LOGICAL_END).unwrap(), 56);
        assert_eq!(h.io.data_freed, vec![(DATA_BASE + 8, 56)]);
    }

    #[test]
    fn lookup_reports_holes_up_to_the_next_extent_across_leaves() {
        let mut h = Harness::new(1024, false);
        let mut rng = Rng(3);
        for i in 0..500 {
            h.insert(1000 + 7 * i, 3, i % 5 == 0, false);
        }
        assert!(depth(&h.root) >= 1);
        let extents = extents(&mut h.io, &h.ctx, &h.root).unwrap();
        for lblk in (0..5000).chain([u32::MAX - 1, u32::MAX]) {
            h.check_lookup(lblk, &extents);
        }
        h.check(&mut rng);
    }

    /// `mapping` over a range says, block for block, what `lookup` says: for random trees of
    /// every depth and random ranges, including past the last extent and to `u32::MAX`.
    #[test]
    fn mapping_of_a_range_agrees_with_lookup_block_by_block() {
        let mut rng = Rng::from_env("mapping_of_a_range_agrees_with_lookup_block_by_block");
        for block_size in [1024, 4096] {
            let mut h = Harness::new(block_size, block_size == 1024);
            for round in 0..40 {
                for _ in 0..60 {
                    let lblk = rng.below(6000) as u32;
                    let len = 1 + rng.below(if round % 4 == 0 { 300 } else { 4 }) as u32;
                    h.insert(lblk, len, rng.chance(4), rng.chance(2));
                }
                let ranges = [(0, 7000), (rng.below(6000) as u32, 6100), (5990, u32::MAX)];
                for (first, last) in ranges {
                    let first = first.min(last);
                    let runs = mapping(&mut h.io, &h.ctx, &h.root, first, last).unwrap();
                    let mut lblk = u64::from(first);
                    for (start, run) in runs {
                        assert_eq!(u64::from(start), lblk, "runs follow one another");
                        let len = match run {
                            Lookup::Mapped { len, .. } => len,
                            Lookup::Hole { len_to_next } => len_to_next.unwrap(),
                        };
                        assert!(len > 0);
                        // Spot-check the run's first and last block against lookup.
                        for at in [start, start + (len - 1)] {
                            let want = lookup(&mut h.io, &h.ctx, &h.root, at).unwrap();
                            match (run, want) {
                                (
                                    Lookup::Mapped { pblk, unwritten, .. },
                                    Lookup::Mapped { pblk: p, unwritten: u, .. },
                                ) => {
                                    assert_eq!(
                                        (pblk + u64::from(at - start), unwritten),
                                        (p, u),
                                        "block {at}"
                                    );
                                }
                                (Lookup::Hole { .. }, Lookup::Hole { .. }) => {}
                                (got, want) => panic!("block {at}: {got:?} vs {want:?}"),
                            }
                        }
                        lblk += u64::from(len);
                    }
                    assert_eq!(lblk, u64::from(last) + 1, "the runs cover the range");
                }
            }
            assert!(depth(&h.root) >= 1, "the tree grew past the root");
        }
    }

    #[test]
    fn allocation_failure_leaves_the_tree_unchanged() {
        let mut h = Harness::new(1024, true);
        for i in 0..4 {
            h.insert(10 * i, 1, false, false);
        }
        // No block left for the root to grow into.
        h.io.blocks_count = DATA_BASE + (1 << 20);
        h.io.first_free = h.io.blocks_count;
        let before = h.root;
        let err =
            insert(&mut h.io, &h.ctx, &mut h.root, 100, DATA_BASE + 500, 1, false).unwrap_err();
        assert!(matches!(err, FsError::NoSpace), "{err}");
        assert_eq!(h.root, before);
    }

    #[test]
    fn worst_case_blocks_touched_covers_splits_at_every_level_and_growth() {
        assert_eq!(worst_case_blocks_touched(0), 2);
        assert_eq!(worst_case_blocks_touched(3), 8);
        assert_eq!(worst_case_blocks_touched(9), 12, "depth is capped at 5");
        // Measure: appends that overflow every level at once.
        let mut h = Harness::new(1024, false);
        let mut most = 0;
        for i in 0..(4 * 84 * 84 + 1) {
            let depth_before = depth(&h.root);
            let root_before = h.root;
            let allocated_before = h.io.allocated.len();
            h.insert(2 * i, 1, false, false);
            // Touched: the new tree blocks, the old ones on the path (one per level, each
            // rewritten at most once), and the inode when the root changed.
            let new_blocks = h.io.allocated.len() - allocated_before - 1;
            let touched =
                new_blocks + usize::from(depth_before) + usize::from(root_before != h.root);
            most = most.max(touched);
            assert!(touched as u32 <= worst_case_blocks_touched(depth_before), "insert {i}");
        }
        assert_eq!(depth(&h.root), 3);
        assert_eq!(most as u32, worst_case_blocks_touched(2), "growing from depth 2 to 3");
    }

    /// A MemMetaIo that tolerates frees of blocks it never handed out (a hostile tree points
    /// anywhere).
    struct LenientIo(MemMetaIo);

    impl MetaIo for LenientIo {
        fn block_size(&self) -> usize {
            self.0.block_size
        }
        fn blocks_count(&self) -> u64 {
            self.0.blocks_count
        }
        fn read_meta(&mut self, block: u64) -> Result<Vec<u8>> {
            self.0.read_meta(block)
        }
        fn write_meta(&mut self, block: u64, data: &[u8]) -> Result<()> {
            self.0.write_meta(block, data)
        }
        fn alloc_meta_block(&mut self, goal: u64) -> Result<u64> {
            self.0.alloc_meta_block(goal)
        }
        fn free_meta_block(&mut self, block: u64) -> Result<()> {
            self.0.allocated.remove(&block);
            Ok(())
        }
        fn free_data_blocks(&mut self, start: u64, count: u64) -> Result<()> {
            assert!(start.checked_add(count).is_some_and(|end| end <= self.0.blocks_count));
            Ok(())
        }
    }

    #[test]
    fn hostile_tree_blocks_never_panic_or_hang_any_operation() {
        let mut rng = Rng::from_env("hostile_tree_blocks_never_panic_or_hang_any_operation");
        for (block_size, csum) in [(1024, false), (1024, true), (4096, false)] {
            let mut h = Harness::new(block_size, csum);
            h.io.blocks_count = DATA_BASE * 2;
            for _ in 0..700 {
                let lblk = rng.below(20_000) as u32;
                h.insert(lblk, 1 + rng.below(4) as u32, rng.chance(3), rng.chance(2));
            }
            let blocks = tree_blocks(&mut h.io, &h.ctx, &h.root).unwrap();
            assert!(depth(&h.root) >= 2 || block_size == 4096);
            let mut corrupted = 0;
            for round in 0..1500 {
                let mut io = LenientIo(h.io.clone());
                let mut root = h.root;
                for _ in 0..=rng.below(3) {
                    let target = rng.below(blocks.len() as u64 + 1) as usize;
                    let bytes: &mut [u8] = if target == blocks.len() {
                        &mut root
                    } else {
                        io.0.blocks.get_mut(&blocks[target]).unwrap()
                    };
                    match rng.below(8) {
                        0 => bytes.iter_mut().for_each(|b| *b = rng.next() as u8),
                        _ => {
                            for _ in 0..=rng.below(4) {
                                let at = rng.below(bytes.len() as u64) as usize;
                                bytes[at] = match rng.below(4) {
                                    0 => 0,
                                    1 => 0xFF,
                                    2 => bytes[at] ^ (1 << rng.below(8)),
                                    _ => rng.next() as u8,
                                };
                            }
                        }
                    }
                    // Reseal so that mutations get past the checksum to the structure checks.
                    if let (Some(seed), true) =
                        (h.ctx.csum_seed, target < blocks.len() && rng.chance(2))
                    {
                        if let Ok((header, _)) = parse_extent_node(bytes) {
                            if header.block_checksum(seed, bytes).is_some() {
                                header.seal_block(seed, bytes);
                            }
                        }
                    }
                }
                let ctx = h.ctx;
                let mut failed = false;
                let lblk = rng.below(20_000) as u32;
                failed |= lookup(&mut io, &ctx, &root, lblk).is_err();
                failed |= extents(&mut io, &ctx, &root).is_err();
                failed |= tree_blocks(&mut io, &ctx, &root).is_err();
                let len = 1 + rng.below(5) as u32;
                let pblk = DATA_BASE + 500_000 + round * 8;
                failed |= insert(&mut io, &ctx, &mut root, lblk, pblk, len, false).is_err();
                failed |=
                    mark_written(&mut io, &ctx, &mut root, lblk.saturating_sub(50), 100).is_err();
                let start = rng.below(20_000) as u32;
                failed |= remove_range(
                    &mut io,
                    &ctx,
                    &mut root,
                    start,
                    u64::from(start) + rng.below(3000),
                )
                .is_err();
                failed |= remove_range(&mut io, &ctx, &mut root, start, LOGICAL_END).is_err();
                corrupted += usize::from(failed);
            }
            println!(
                "{block_size}-byte blocks, csum {csum}: {corrupted} of 1500 rounds saw errors"
            );
            assert!(corrupted > 0, "mutations must be detected sometimes");
        }
    }

    #[test]
    fn corrupted_nodes_are_reported_with_their_block() {
        let mut h = Harness::new(1024, true);
        for i in 0..200 {
            h.insert(5 * i, 2, false, false);
        }
        let blocks = tree_blocks(&mut h.io, &h.ctx, &h.root).unwrap();
        type Edit = fn(&mut Vec<u8>);
        let cases: [(&str, Edit); 4] = [
            ("checksum", |b| b[20] ^= 1),
            ("magic", |b| b[0] = 0),
            ("depth", |b| {
                b[6] = 1;
            }),
            ("eh_max", |b| {
                b[4] = 80;
            }),
        ];
        for (name, edit) in cases {
            let mut io = h.io.clone();
            let block = blocks[1];
            edit(io.blocks.get_mut(&block).unwrap());
            if name != "checksum" {
                let (header, _) = match parse_extent_node(&io.blocks[&block]) {
                    Ok(parsed) => parsed,
                    Err(_) => (
                        ExtentHeader { entries: 0, max: 84, depth: 0, generation: 0 },
                        ExtentEntries::Leaf(vec![]),
                    ),
                };
                header.seal_block(0x1234_5678, io.blocks.get_mut(&block).unwrap());
            }
            let err = extents(&mut io, &h.ctx, &h.root).unwrap_err();
            assert!(
                matches!(err, FsError::Corrupted { block: b, .. } if b == block),
                "{name}: {err}"
            );
        }
        // A root that is not an extent header is reported at the inode's block.
        let mut root = h.root;
        root[0] = 0;
        let err = lookup(&mut h.io, &h.ctx, &root, 0).unwrap_err();
        assert!(matches!(err, FsError::Corrupted { block: 77, .. }), "{err}");
        // An index pointing at a child that starts elsewhere.
        let mut io = h.io.clone();
        let data = io.blocks.get_mut(&blocks[1]).unwrap();
        data[12] = data[12].wrapping_add(1);
        let (header, _) = parse_extent_node(data).unwrap();
        header.seal_block(0x1234_5678, data);
        let err = extents(&mut io, &h.ctx, &h.root).unwrap_err();
        assert!(matches!(err, FsError::Corrupted { .. }), "{err}");
    }
}
