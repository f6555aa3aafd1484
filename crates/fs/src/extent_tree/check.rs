//! Reading a tree defensively: node parsing and checks (checksum, depth, ranges, blocks inside
//! the file system and visited once), the path from the root to a logical block, and the
//! whole-tree walk.

use super::*;

pub(super) fn check_block_size(io: &dyn MetaIo) {
    assert!(io.block_size() >= BLOCK_SIZE_MIN, "block size {} below 1 KiB", io.block_size());
}

pub(super) fn corrupted(ctx: &ExtentCtx, block: u64, reason: impl std::fmt::Display) -> FsError {
    FsError::corrupted(block, format!("inode {}: extent tree: {reason}", ctx.ino))
}

/// parse_extent_node, with a corrupted node reported at `block`.
pub(super) fn parse_node(
    ctx: &ExtentCtx,
    block: u64,
    bytes: &[u8],
) -> Result<(ExtentHeader, ExtentEntries)> {
    parse_extent_node(bytes).map_err(|err| match err {
        ondisk::OnDiskError::Corrupted { .. } => corrupted(ctx, block, err),
        other => FsError::OnDisk(other),
    })
}

/// Decodes and checks the root in `i_block`.
pub(super) fn read_root(
    io: &dyn MetaIo,
    ctx: &ExtentCtx,
    root: &[u8; INODE_BLOCK_SIZE],
) -> Result<Node> {
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
pub(super) fn read_child(
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
pub(super) fn check_entries(io: &dyn MetaIo, ctx: &ExtentCtx, node: &Node) -> Result<()> {
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
pub(super) fn find_path(
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

/// Refuses a block seen before in this walk, and walks beyond the size limit.
pub(super) fn visit(
    ctx: &ExtentCtx,
    visited: &mut HashSet<u64>,
    parent: u64,
    child: u64,
) -> Result<()> {
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
pub(super) struct Walk {
    pub(super) visited: HashSet<u64>,
    pub(super) extents: Vec<Extent>,
    pub(super) blocks: Vec<u64>,
}

impl Walk {
    /// Visits `node`; reads leaves only when `want_extents`.
    pub(super) fn node(
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
