//! An inode's block map, whichever way the inode maps its blocks: an extent tree
//! (`extent_tree.rs`, inodes with `EXTENTS_FL`) or direct and indirect block pointers
//! (`indirect.rs`: ext2 and ext3 files, and files of images converted to ext4). The file
//! system asks here, with the inode, and the inode's flag picks the module; both answer in
//! the extent tree's terms ([`Lookup`], [`Extent`]).
//!
//! What differs, and what callers must respect:
//! - an indirect map has no unwritten blocks: [`insert`] of unwritten blocks is
//!   `Unsupported` there (ext4's fallocate refuses indirect files, EOPNOTSUPP);
//! - one [`insert`] into an indirect map stays within one array of data pointers
//!   ([`run_room`]), so that its metadata writes are bounded as an extent insert's are
//!   ([`worst_case_blocks_touched`]);
//! - The runs ([`runs_in`]) of an indirect map are split at the arrays' edges, so a removal of a few of
//!   them touches a few indirect blocks.
//!
//! An inode with inline data (`inline.rs`) maps nothing: its `i_block` holds data, never
//! pointers. Lookups find holes, walks find no runs and removals free nothing; mapping
//! blocks into it is a bug (its data must move out first) and is refused.

use ondisk::ext4::{self, Extent};

use crate::error::{FsError, Result};
use crate::extent_tree::{self, ExtentCtx, Lookup};
use crate::indirect;
use crate::meta_io::MetaIo;

/// Where logical block `lblk` of `inode` is mapped.
pub fn lookup(
    io: &mut dyn MetaIo,
    ctx: &ExtentCtx,
    inode: &ext4::Inode,
    lblk: u32,
) -> Result<Lookup> {
    if inode.has_inline_data() {
        return Ok(Lookup::Hole { len_to_next: None });
    }
    if inode.uses_extents() {
        extent_tree::lookup(io, ctx, &inode.block, lblk)
    } else {
        indirect::lookup(io, ctx, &inode.block, lblk)
    }
}

/// How logical blocks `first ..= last` of `inode` are mapped ([`extent_tree::mapping`]).
pub fn mapping(
    io: &mut dyn MetaIo,
    ctx: &ExtentCtx,
    inode: &ext4::Inode,
    first: u32,
    last: u32,
) -> Result<Vec<(u32, Lookup)>> {
    if inode.has_inline_data() {
        return Ok(vec![(first, Lookup::Hole { len_to_next: None })]);
    }
    if inode.uses_extents() {
        extent_tree::mapping(io, ctx, &inode.block, first, last)
    } else {
        indirect::mapping(io, ctx, &inode.block, first, last)
    }
}

/// Maps logical blocks `lblk .. lblk + len` of `inode` to `pblk .. pblk + len` (unmapped
/// before). `len` must be within [`run_room`].
pub fn insert(
    io: &mut dyn MetaIo,
    ctx: &ExtentCtx,
    inode: &mut ext4::Inode,
    lblk: u32,
    pblk: u64,
    len: u32,
    unwritten: bool,
) -> Result<()> {
    refuse_inline(ctx, inode)?;
    if inode.uses_extents() {
        extent_tree::insert(io, ctx, &mut inode.block, lblk, pblk, len, unwritten)
    } else if unwritten {
        Err(FsError::Unsupported(format!(
            "inode {} maps its blocks indirectly, which has no unwritten blocks",
            ctx.ino
        )))
    } else {
        indirect::insert(io, ctx, &mut inode.block, lblk, pblk, len)
    }
}

/// Unmaps logical blocks `start .. end` of `inode` and frees their blocks (data and emptied
/// map blocks); returns the data blocks unmapped ([`extent_tree::remove_range`]). With
/// bigalloc a cluster is freed once none of its blocks stays mapped (`clusters.rs`).
pub fn remove_range(
    io: &mut dyn MetaIo,
    ctx: &ExtentCtx,
    inode: &mut ext4::Inode,
    start: u32,
    end: u64,
) -> Result<u64> {
    crate::clusters::remove_range(io, ctx, inode, start, end)
}

/// [`remove_range`] with every unmapped data run handed to `io.free_data_blocks` as it is.
pub(crate) fn remove_range_blocks(
    io: &mut dyn MetaIo,
    ctx: &ExtentCtx,
    inode: &mut ext4::Inode,
    start: u32,
    end: u64,
) -> Result<u64> {
    if inode.has_inline_data() {
        return Ok(0);
    }
    if inode.uses_extents() {
        extent_tree::remove_range(io, ctx, &mut inode.block, start, end)
    } else {
        indirect::remove_range(io, ctx, &mut inode.block, start, end)
    }
}

/// Turns unwritten blocks of `lblk .. lblk + len` into written ones (an indirect map has
/// none: nothing to do).
pub fn mark_written(
    io: &mut dyn MetaIo,
    ctx: &ExtentCtx,
    inode: &mut ext4::Inode,
    lblk: u32,
    len: u32,
) -> Result<()> {
    refuse_inline(ctx, inode)?;
    if inode.uses_extents() {
        extent_tree::mark_written(io, ctx, &mut inode.block, lblk, len)
    } else {
        Ok(())
    }
}

/// Every mapped run of `inode`, in logical order, and the map's own blocks (extent-tree
/// nodes, or indirect blocks), parents before children: one walk of an indirect map.
pub fn runs_and_map_blocks(
    io: &mut dyn MetaIo,
    ctx: &ExtentCtx,
    inode: &ext4::Inode,
) -> Result<(Vec<Extent>, Vec<u64>)> {
    if inode.has_inline_data() {
        return Ok((Vec::new(), Vec::new()));
    }
    if inode.uses_extents() {
        let extents = extent_tree::extents(io, ctx, &inode.block)?;
        Ok((extents, extent_tree::tree_blocks(io, ctx, &inode.block)?))
    } else {
        indirect::walk_all(io, ctx, &inode.block)
    }
}

/// The mapped runs of `inode` inside logical blocks `first .. end` (`end` at most 2^32), in
/// logical order, each cut to the range: what a removal of the range frees, found without
/// walking the rest of the map.
pub fn runs_in(
    io: &mut dyn MetaIo,
    ctx: &ExtentCtx,
    inode: &ext4::Inode,
    first: u64,
    end: u64,
) -> Result<Vec<Extent>> {
    let end = end.min(1 << 32);
    if first >= end {
        return Ok(Vec::new());
    }
    let runs = mapping(io, ctx, inode, first as u32, (end - 1) as u32)?;
    Ok(runs
        .into_iter()
        .filter_map(|(logical, run)| match run {
            Lookup::Mapped { pblk, len, unwritten } => {
                Some(Extent { logical, len, start: pblk, unwritten })
            }
            Lookup::Hole { .. } => None,
        })
        .collect())
}

/// Most metadata blocks one [`insert`] (within [`run_room`]) or one [`mark_written`] may
/// modify or allocate.
pub fn worst_case_blocks_touched(inode: &ext4::Inode) -> u32 {
    if inode.uses_extents() {
        extent_tree::worst_case_blocks_touched(extent_tree::depth(&inode.block))
    } else {
        indirect::WORST_CASE_BLOCKS_TOUCHED
    }
}

/// Credits one mapped run (of [`runs_in`]) takes in a removal: the map blocks it rewrites or
/// frees (revoked) and the bitmap and group descriptor its blocks return to. An indirect run
/// lies in one array of data pointers, under a double- and a triple-indirect block.
pub fn removal_credits(inode: &ext4::Inode) -> u32 {
    if inode.uses_extents() {
        4
    } else {
        6
    }
}

/// Map blocks one [`insert`] may allocate, at most (a metadata pool's share per insert).
pub fn new_blocks_per_insert(inode: &ext4::Inode) -> u64 {
    if inode.uses_extents() {
        u64::from(extent_tree::depth(&inode.block)) + 2
    } else {
        3
    }
}

/// The longest run one [`insert`] at `lblk` may map.
pub fn run_room(inode: &ext4::Inode, block_size: u32, lblk: u32) -> u32 {
    if inode.uses_extents() {
        u32::MAX
    } else {
        indirect::run_room(block_size as usize, lblk)
    }
}

/// The largest size `inode` may have: 2^32 blocks for an extent tree, what the kernel allows
/// an indirect map (`s_bitmap_maxbytes`).
pub fn max_file_bytes(inode: &ext4::Inode, block_size: u32, huge_file: bool) -> u64 {
    if inode.uses_extents() {
        u64::from(block_size) << 32
    } else {
        indirect::max_file_bytes(block_size as usize, huge_file)
    }
}

/// Mapping blocks into an inode whose data is inline would mix data and pointers in
/// `i_block`: a caller that did not move the data out first.
fn refuse_inline(ctx: &ExtentCtx, inode: &ext4::Inode) -> Result<()> {
    if inode.has_inline_data() {
        return Err(FsError::Invalid(format!(
            "inode {} keeps its data inline: it maps no blocks",
            ctx.ino
        )));
    }
    Ok(())
}
