//! bigalloc: a file's blocks in clusters.
//!
//! With bigalloc the allocator hands out clusters of 2^n blocks (`groups.rs` keeps a bit per
//! cluster), and a file's block map must keep the kernel's rules, which e2fsck's pass 1 checks:
//! - logical cluster `c` of a file (its blocks `c·n .. c·n + n`) lies in one physical cluster,
//!   block for block (`lblk % n == pblk % n`); no two logical clusters of a file, and no two
//!   files, share a physical cluster. A block of a logical cluster the file already maps part
//!   of goes into that cluster, without an allocation ([`alloc_run`]);
//! - a cluster is freed when the last block the file maps in it is unmapped: a removal that
//!   leaves blocks of an edge cluster mapped keeps that cluster ([`remove_range`]), and a
//!   whole-file release frees each cluster once however many runs name it ([`free_runs`]);
//! - i_blocks counts whole clusters: a data cluster once, each extent-tree node and xattr block
//!   as a cluster of its own (`MetaIo::alloc_meta_block` takes one; `Txn` counts it).
//!
//! Without bigalloc (`MetaIo::cluster_blocks` is 1) each function is the plain operation.
//! bigalloc requires extents (mke2fs refuses it without), so these maps are extent trees; an
//! indirect map on such a file system follows the same rules through the same calls.

use std::collections::BTreeSet;

use ondisk::ext4::{self, Extent};

use crate::block_map;
use crate::error::{FsError, Result};
use crate::extent_tree::{ExtentCtx, Lookup};
use crate::meta_io::MetaIo;

/// Blocks [`alloc_run`] found for a hole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewRun {
    /// The physical block for the hole's first block.
    pub pblk: u64,
    /// How many of the hole's blocks the run covers (at least one).
    pub len: u32,
    /// The blocks taken from the allocator for it (whole clusters with bigalloc), to give back
    /// with [`MetaIo::free_data_blocks`] if the run ends up not mapped; `None` when the run
    /// lies in a cluster the file owned already.
    pub taken: Option<(u64, u64)>,
}

/// Physical blocks for logical blocks `lblk .. lblk + want` of `inode`, which must all be
/// holes, near `goal`: a run of at least one of them. `meta`: the blocks will be written as
/// metadata (directory blocks, quota and value-inode blocks) through `write_meta`.
pub fn alloc_run(
    io: &mut dyn MetaIo,
    ctx: &ExtentCtx,
    inode: &ext4::Inode,
    lblk: u32,
    goal: u64,
    want: u32,
    meta: bool,
) -> Result<NewRun> {
    let want = want.max(1);
    let n = u64::from(io.cluster_blocks());
    if n == 1 {
        let (pblk, len) =
            if meta { (io.alloc_meta_block(goal)?, 1) } else { io.alloc_data_blocks(goal, want)? };
        return Ok(NewRun { pblk, len, taken: Some((pblk, u64::from(len))) });
    }
    let first = u64::from(lblk);
    let cluster_first = first - first % n;
    if let Some(owned) = owned_cluster(io, ctx, inode, cluster_first, cluster_first + n)? {
        let len = (cluster_first + n - first).min(u64::from(want)) as u32;
        let pblk = owned + (first - cluster_first);
        if meta {
            io.claim_fresh(pblk);
        }
        return Ok(NewRun { pblk, len, taken: None });
    }
    // New clusters, but not for a later logical cluster the file already maps part of: the
    // hole may end inside one (its blocks after the hole go where its mapped blocks are).
    let mut end = first + u64::from(want);
    let last_cluster = end - 1 - (end - 1) % n;
    if last_cluster > cluster_first
        && !end.is_multiple_of(n)
        && owned_cluster(io, ctx, inode, last_cluster, last_cluster + n)?.is_some()
    {
        end = last_cluster;
    }
    let blocks = u32::try_from(end - cluster_first).unwrap_or(u32::MAX);
    let (start, got) = io.alloc_data_blocks(goal - goal % n, blocks)?;
    if start % n != 0 || u64::from(got) % n != 0 || got == 0 {
        return Err(FsError::Invalid(format!(
            "the allocator returned blocks {start}+{got}, not whole clusters of {n} blocks"
        )));
    }
    let offset = first - cluster_first;
    let pblk = start + offset;
    let len = (end - first).min(u64::from(got) - offset) as u32;
    if meta {
        io.claim_fresh(pblk);
    }
    Ok(NewRun { pblk, len, taken: Some((start, u64::from(got))) })
}

/// One block for logical block `lblk` of `inode` (a hole) that will hold metadata written
/// with `write_meta`: a directory, quota file or xattr value block.
pub fn alloc_block(
    io: &mut dyn MetaIo,
    ctx: &ExtentCtx,
    inode: &ext4::Inode,
    lblk: u32,
    goal: u64,
) -> Result<u64> {
    Ok(alloc_run(io, ctx, inode, lblk, goal, 1, true)?.pblk)
}

/// Unmaps logical blocks `start .. end` of `inode` and frees what they held
/// ([`block_map::remove_range`]), keeping any cluster whose other blocks stay mapped.
pub fn remove_range(
    io: &mut dyn MetaIo,
    ctx: &ExtentCtx,
    inode: &mut ext4::Inode,
    start: u32,
    end: u64,
) -> Result<u64> {
    let n = u64::from(io.cluster_blocks());
    if n == 1 {
        return block_map::remove_range_blocks(io, ctx, inode, start, end);
    }
    let first = u64::from(start);
    let end = end.min(1 << 32);
    if first >= end {
        return Ok(0);
    }
    // The edge clusters: blocks before `start` and from `end` on in the same logical clusters
    // stay mapped, and keep their physical cluster.
    let mut kept = BTreeSet::new();
    let left = first - first % n;
    if left < first {
        if let Some(owned) = owned_cluster(io, ctx, inode, left, first)? {
            kept.insert(owned / n);
        }
    }
    if !end.is_multiple_of(n) {
        // (2^32, the end of every map, is a whole number of clusters.)
        if let Some(owned) = owned_cluster(io, ctx, inode, end, end - end % n + n)? {
            kept.insert(owned / n);
        }
    }
    let mut deferred = DeferredFrees { io, freed: Vec::new() };
    let removed = block_map::remove_range_blocks(&mut deferred, ctx, inode, start, end)?;
    let freed = std::mem::take(&mut deferred.freed);
    free_clusters(io, &freed, &kept)?;
    Ok(removed)
}

/// Frees the blocks of a file being released whole: its mapped `runs` and its map blocks
/// (`block_map::runs_and_map_blocks`). With clusters, each cluster once.
pub fn free_runs(io: &mut dyn MetaIo, runs: &[Extent], map_blocks: &[u64]) -> Result<()> {
    if io.cluster_blocks() == 1 {
        for run in runs {
            io.free_data_blocks(run.start, u64::from(run.len))?;
        }
    } else {
        let freed: Vec<(u64, u64)> = runs.iter().map(|r| (r.start, u64::from(r.len))).collect();
        free_clusters(io, &freed, &BTreeSet::new())?;
    }
    for &block in map_blocks {
        io.free_meta_block(block)?;
    }
    Ok(())
}

/// Frees every cluster the block ranges `freed` (the blocks the file mapped, revoked where
/// the operation journals them) touch but those in `kept` (cluster numbers), each once, as
/// runs of whole clusters.
fn free_clusters(io: &mut dyn MetaIo, freed: &[(u64, u64)], kept: &BTreeSet<u64>) -> Result<()> {
    let n = u64::from(io.cluster_blocks());
    let mut clusters = BTreeSet::new();
    for &(start, count) in freed {
        if count == 0 {
            continue;
        }
        io.revoke_data(start, count)?;
        clusters.extend((start / n..=(start + count - 1) / n).filter(|c| !kept.contains(c)));
    }
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for cluster in clusters {
        match runs.last_mut() {
            Some((first, len)) if *first + *len == cluster => *len += 1,
            _ => runs.push((cluster, 1)),
        }
    }
    for (first, len) in runs {
        io.free_data_blocks(first * n, len * n)?;
    }
    Ok(())
}

/// The first block of the physical cluster holding the blocks `inode` maps in logical blocks
/// `from .. to` (all in one logical cluster), if it maps any. Blocks of one logical cluster
/// in different physical clusters, or out of step with their cluster, break bigalloc's rule:
/// corruption, not something to allocate around.
fn owned_cluster(
    io: &mut dyn MetaIo,
    ctx: &ExtentCtx,
    inode: &ext4::Inode,
    from: u64,
    to: u64,
) -> Result<Option<u64>> {
    let n = u64::from(io.cluster_blocks());
    let to = to.min(1 << 32);
    if from >= to {
        return Ok(None);
    }
    let pieces = block_map::mapping(io, ctx, inode, from as u32, (to - 1) as u32)?;
    let mut owned = None;
    for (logical, piece) in pieces {
        let Lookup::Mapped { pblk, .. } = piece else { continue };
        let logical = u64::from(logical);
        if pblk % n != logical % n {
            return Err(FsError::corrupted(
                ctx.inode_block,
                format!(
                    "inode {}: logical block {logical} at physical block {pblk} violates the \
                     cluster allocation rules ({n}-block clusters)",
                    ctx.ino
                ),
            ));
        }
        let cluster = pblk - pblk % n;
        match owned {
            None => owned = Some(cluster),
            Some(seen) if seen == cluster => {}
            Some(seen) => {
                return Err(FsError::corrupted(
                    ctx.inode_block,
                    format!(
                        "inode {}: logical cluster of block {logical} maps physical clusters at \
                         {seen} and {cluster}",
                        ctx.ino
                    ),
                ))
            }
        }
    }
    Ok(owned)
}

/// A [`MetaIo`] that passes everything through but data frees, which it collects: the
/// removal's caller frees their clusters once it knows which stay in use.
struct DeferredFrees<'a> {
    io: &'a mut dyn MetaIo,
    freed: Vec<(u64, u64)>,
}

impl MetaIo for DeferredFrees<'_> {
    fn block_size(&self) -> usize {
        self.io.block_size()
    }

    fn blocks_count(&self) -> u64 {
        self.io.blocks_count()
    }

    fn read_meta(&mut self, block: u64) -> Result<Vec<u8>> {
        self.io.read_meta(block)
    }

    fn write_meta(&mut self, block: u64, data: &[u8]) -> Result<()> {
        self.io.write_meta(block, data)
    }

    fn alloc_meta_block(&mut self, goal: u64) -> Result<u64> {
        self.io.alloc_meta_block(goal)
    }

    fn free_meta_block(&mut self, block: u64) -> Result<()> {
        self.io.free_meta_block(block)
    }

    fn free_data_blocks(&mut self, start: u64, count: u64) -> Result<()> {
        self.freed.push((start, count));
        Ok(())
    }

    fn cluster_blocks(&self) -> u32 {
        self.io.cluster_blocks()
    }

    fn alloc_data_blocks(&mut self, goal: u64, want: u32) -> Result<(u64, u32)> {
        self.io.alloc_data_blocks(goal, want)
    }

    fn claim_fresh(&mut self, block: u64) {
        self.io.claim_fresh(block)
    }

    fn revoke_data(&mut self, start: u64, count: u64) -> Result<()> {
        self.io.revoke_data(start, count)
    }

    fn system_zone_overlap(&self, start: u64, len: u64) -> Option<u64> {
        self.io.system_zone_overlap(start, len)
    }

    fn order_late(&mut self, block: u64) {
        self.io.order_late(block)
    }

    fn fast_commit_tid(&self) -> Option<ondisk::Tid> {
        self.io.fast_commit_tid()
    }

    fn value_inodes(&mut self) -> Option<&mut dyn crate::xattr::ValueInodes> {
        self.io.value_inodes()
    }
}
