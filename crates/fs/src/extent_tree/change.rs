//! Changing a tree: the leaf edits of insert and mark_written, and settling overflows upward
//! (node splits, root growth) with the indexes corrected above every changed node.

use super::*;

/// Whether `b` can be appended to `a` as one extent (`ext4_can_extents_be_merged`).
pub(super) fn mergeable(a: &Extent, b: &Extent) -> bool {
    a.unwritten == b.unwritten
        && a.logical_end() == u64::from(b.logical)
        && a.start + u64::from(a.len) == b.start
        && a.len + b.len <= Extent::len_max(a.unwritten)
}

/// How converting `pos .. end` of the unwritten extent `extents[j]` (which holds `pos`)
/// changes the leaf: replace `extents[from..to]` by the returned extents. Also returns where
/// the conversion stopped.
pub(super) fn mark_written_plan(
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

/// Replaces `extents[from..to]` of the path's leaf by `replacement` (at most two entries more
/// than it replaces), splitting nodes and growing the tree as needed, and writes every changed
/// node, the root last.
pub(super) fn leaf_replace(
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
pub(super) fn blocks_needed(path: &[Level], leaf_len: usize) -> Result<usize> {
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
pub(super) fn alloc_blocks(io: &mut dyn MetaIo, ctx: &ExtentCtx, count: usize) -> Result<Vec<u64>> {
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
pub(super) fn settle(
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
pub(super) fn grow(io: &dyn MetaIo, path: &mut Vec<Level>, block: u64) {
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
pub(super) fn correct_indexes(path: &mut [Level], level: usize) {
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

pub(super) fn write_block_node(io: &mut dyn MetaIo, ctx: &ExtentCtx, node: &Node) -> Result<()> {
    let block = node.block.expect("only tree blocks are written as blocks");
    let mut data = vec![0u8; io.block_size()];
    let header = node.header();
    header.encode_node(&node.entries, &mut data);
    if let Some(seed) = ctx.csum_seed {
        header.seal_block(seed, &mut data);
    }
    io.write_meta(block, &data)
}

pub(super) fn encode_root(node: &Node, root: &mut [u8; INODE_BLOCK_SIZE]) {
    let mut bytes = [0u8; INODE_BLOCK_SIZE];
    node.header().encode_node(&node.entries, &mut bytes);
    *root = bytes;
}
