//! Removing a range: cutting extents and freeing the blocks and emptied nodes, walked
//! depth first (`ext4_ext_remove_space`).

use super::*;

/// The remove_range case that needs a new extent: `start .. end` lies strictly inside one
/// extent, which becomes a head and a tail. Returns None when the range is not such a case.
pub(super) fn remove_range_inside_one_extent(
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

/// State of the general case of [`remove_range`]: no extent needs splitting in two.
pub(super) struct Removal {
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) visited: HashSet<u64>,
    /// Data blocks to free as (first, count), physically contiguous runs merged.
    pub(super) data_runs: Vec<(u64, u64)>,
    /// Tree blocks no longer referenced.
    pub(super) tree_blocks_freed: Vec<u64>,
}

impl Removal {
    /// Removes the range from `node`'s subtree, writing changed children and dropping emptied
    /// ones. Returns whether `node` itself changed (the caller writes it).
    pub(super) fn node(
        &mut self,
        io: &mut dyn MetaIo,
        ctx: &ExtentCtx,
        node: &mut Node,
    ) -> Result<bool> {
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
    pub(super) fn cut_extent(
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

    pub(super) fn push_data_run(&mut self, first: u64, count: u64) {
        match self.data_runs.last_mut() {
            Some((run_first, run_count)) if *run_first + *run_count == first => *run_count += count,
            _ => self.data_runs.push((first, count)),
        }
    }
}
