//! Indirect block maps: how ext2, ext3 and ext4 inodes without the extents flag
//! (`EXTENTS_FL`) map logical blocks (`fs/ext4/indirect.c`). `i_block` holds 15
//! little-endian block numbers: 12 direct blocks, then one single-, one double- and one
//! triple-indirect block; an indirect block is an array of `block_size / 4` block numbers,
//! each naming a data block (single) or an indirect block one level down. Zero is a hole, at
//! any level. There are no unwritten blocks.
//!
//! Reading: every block number met is checked to lie inside the file system before it is
//! used or read: a damaged map is reported as corruption of the block (or inode) that holds
//! it, never followed. The walk is bounded by the three levels, so a block naming itself
//! cannot loop it.
//!
//! Changing ([`insert`], [`remove_range`]): as the kernel's `ext4_ind_map_blocks` and
//! `ext4_ind_truncate`, through [`MetaIo`] (indirect blocks are metadata, journaled; a freed
//! one is revoked). A new indirect block is allocated next to the data it maps and written
//! whole (zeros and the new pointers) before its parent names it. One [`insert`] stays within
//! one array of data pointers ([`run_room`]), so it writes at most one block per level and
//! the inode: what [`WORST_CASE_BLOCKS_TOUCHED`] counts. A removal frees indirect blocks left
//! all zeros. Block numbers are 32 bits: a data block past 2^32 cannot be mapped here.
//! Which functions the file system calls for which inode is `block_map.rs`'s business.

use std::collections::HashSet;

use ondisk::ext4::{Extent, INODE_BLOCK_SIZE};

use crate::error::{FsError, Result};
use crate::extent_tree::{ExtentCtx, Lookup};
use crate::meta_io::MetaIo;

/// Direct block pointers in `i_block`.
const DIRECT: u64 = 12;

/// One indirect map being read.
struct Walk<'a> {
    io: &'a mut dyn MetaIo,
    ctx: &'a ExtentCtx,
    /// Block numbers per indirect block.
    per_block: u64,
    blocks_count: u64,
    /// Indirect blocks met by a whole-map walk (a removal, [`walk_all`]) or on an insert's
    /// path: one met twice is a damaged map, two pointers to one block, which a removal would
    /// free twice and an insert write twice.
    seen: HashSet<u64>,
}

/// What logical block `lblk` maps to in the indirect map `root` (an inode's `i_block`):
/// mapped, with how many following blocks continue it physically, or a hole, with the
/// distance to the next mapped block.
pub fn lookup(
    io: &mut dyn MetaIo,
    ctx: &ExtentCtx,
    root: &[u8; INODE_BLOCK_SIZE],
    lblk: u32,
) -> Result<Lookup> {
    let per_block = io.block_size() as u64 / 4;
    let blocks_count = io.blocks_count();
    let mut walk = Walk { io, ctx, per_block, blocks_count, seen: HashSet::new() };
    let lblk = u64::from(lblk);
    match walk.leaf(root, lblk)? {
        Some((pointers, at, holder)) if pointers[at] != 0 => {
            let pblk = walk.checked(pointers[at], holder)?;
            // The run continues while the next pointers in the same leaf are the next blocks
            // (and inside the file system: past its end they are damage, met when reached).
            let run = pointers[at..]
                .iter()
                .enumerate()
                .take_while(|(i, &p)| {
                    u64::from(p) == pblk + *i as u64 && u64::from(p) < walk.blocks_count
                })
                .count();
            Ok(Lookup::Mapped { pblk, len: run as u32, unwritten: false })
        }
        _ => {
            let next = walk.first_mapped_from(root, lblk + 1)?;
            let len_to_next = next.map(|n| u32::try_from(n - lblk).unwrap_or(u32::MAX));
            Ok(Lookup::Hole { len_to_next })
        }
    }
}

impl Walk<'_> {
    /// Logical blocks one pointer at `level` covers (level 0: a data block).
    fn span(&self, level: u32) -> u64 {
        self.per_block.pow(level)
    }

    /// The region of the map `lblk` falls in: the `i_block` slot of its top pointer, that
    /// pointer's level (1: single indirect) and the region's first logical block.
    fn region(&self, lblk: u64) -> Option<(usize, u32, u64)> {
        let mut base = DIRECT;
        for (slot, level) in [(12, 1), (13, 2), (14, 3)] {
            if lblk < base + self.span(level) {
                return Some((slot, level, base));
            }
            base += self.span(level);
        }
        None
    }

    /// Block number `pointer` read from `holder` (an indirect block, or 0 for `i_block`),
    /// checked to lie inside the file system and outside its own metadata (the kernel's
    /// `ext4_check_indirect_blockref`): an indirect block that is really an inode table or a
    /// bitmap must never be written as one.
    fn checked(&self, pointer: u32, holder: u64) -> Result<u64> {
        let block = u64::from(pointer);
        let at = if holder == 0 { self.ctx.inode_block } else { holder };
        let damage = |what: String| {
            FsError::corrupted(at, format!("inode {}: indirect map names {what}", self.ctx.ino))
        };
        if block == 0 || block >= self.blocks_count {
            return Err(damage(format!("block {block}, outside the file system")));
        }
        if self.io.system_zone_overlap(block, 1).is_some() {
            return Err(damage(format!("block {block}, which holds file-system metadata")));
        }
        Ok(block)
    }

    /// Notes a whole-map walk's visit to indirect block `block`: a second visit is damage.
    fn first_visit(&mut self, block: u64) -> Result<()> {
        if self.seen.insert(block) {
            return Ok(());
        }
        Err(FsError::corrupted(
            block,
            format!("inode {}: indirect block {block} is named twice in its map", self.ctx.ino),
        ))
    }

    /// The pointers of indirect block `block`.
    fn pointers(&mut self, block: u64) -> Result<Vec<u32>> {
        let bytes = self.io.read_meta(block)?;
        Ok(bytes.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect())
    }

    /// The array of data-block pointers holding `lblk`'s (`i_block`'s direct slots, or a
    /// single-indirect block), the index in it, and the block holding the array (0 for the
    /// inode); `None` where an indirect block on the way is a hole, or `lblk` is past what
    /// the map can address.
    fn leaf(
        &mut self,
        root: &[u8; INODE_BLOCK_SIZE],
        lblk: u64,
    ) -> Result<Option<(Vec<u32>, usize, u64)>> {
        let slots = root_pointers(root);
        if lblk < DIRECT {
            return Ok(Some((slots[..DIRECT as usize].to_vec(), lblk as usize, 0)));
        }
        let Some((slot, level, base)) = self.region(lblk) else {
            return Ok(None);
        };
        let mut offset = lblk - base;
        let (mut pointer, mut holder) = (slots[slot], 0);
        for level in (1..=level).rev() {
            if pointer == 0 {
                return Ok(None);
            }
            let block = self.checked(pointer, holder)?;
            let pointers = self.pointers(block)?;
            let index = (offset / self.span(level - 1)) as usize;
            offset %= self.span(level - 1);
            if level == 1 {
                return Ok(Some((pointers, index, block)));
            }
            (pointer, holder) = (pointers[index], block);
        }
        unreachable!("the loop returns at level 1")
    }

    /// The first mapped logical block at or after `from`, skipping holes a whole indirect
    /// block (or subtree) at a time.
    fn first_mapped_from(
        &mut self,
        root: &[u8; INODE_BLOCK_SIZE],
        from: u64,
    ) -> Result<Option<u64>> {
        let slots = root_pointers(root);
        if let Some(l) = (from..DIRECT).find(|&l| slots[l as usize] != 0) {
            return Ok(Some(l));
        }
        let mut base = DIRECT;
        for (slot, level) in [(12, 1), (13, 2), (14, 3)] {
            let span = self.span(level);
            if from < base + span && slots[slot] != 0 {
                let block = self.checked(slots[slot], 0)?;
                let start = from.saturating_sub(base);
                if let Some(offset) = self.first_in(block, level, start)? {
                    return Ok(Some(base + offset));
                }
            }
            base += span;
        }
        Ok(None)
    }

    /// The first mapped block at or after `start` under indirect block `block` of `level`,
    /// as an offset into what it covers.
    fn first_in(&mut self, block: u64, level: u32, start: u64) -> Result<Option<u64>> {
        let child_span = self.span(level - 1);
        let pointers = self.pointers(block)?;
        let first = (start / child_span) as usize;
        for (i, &pointer) in pointers.iter().enumerate().skip(first) {
            if pointer == 0 {
                continue;
            }
            let child = self.checked(pointer, block)?;
            if level == 1 {
                return Ok(Some(i as u64));
            }
            let sub_start = if i == first { start % child_span } else { 0 };
            if let Some(offset) = self.first_in(child, level - 1, sub_start)? {
                return Ok(Some(i as u64 * child_span + offset));
            }
        }
        Ok(None)
    }
}

/// `i_block`'s 15 block numbers.
fn root_pointers(root: &[u8; INODE_BLOCK_SIZE]) -> [u32; 15] {
    let mut slots = [0u32; 15];
    for (slot, bytes) in slots.iter_mut().zip(root.chunks_exact(4)) {
        *slot = u32::from_le_bytes(bytes.try_into().unwrap());
    }
    slots
}

/// Every mapped run of an indirect map below `len_blocks`, in logical order, as (logical,
/// physical, length), physically contiguous runs merged across pointer arrays: what an extent
/// list says of an extent-mapped inode (the journal inode of an ext3 image).
pub fn runs(
    io: &mut dyn MetaIo,
    ctx: &ExtentCtx,
    root: &[u8; INODE_BLOCK_SIZE],
    len_blocks: u32,
) -> Result<Vec<(u32, u64, u32)>> {
    let mut runs: Vec<(u32, u64, u32)> = Vec::new();
    let Some(last) = len_blocks.checked_sub(1) else { return Ok(runs) };
    for (lblk, run) in mapping(io, ctx, root, 0, last)? {
        let Lookup::Mapped { pblk, len, .. } = run else { continue };
        match runs.last_mut() {
            Some((l, p, n)) if *l + *n == lblk && *p + u64::from(*n) == pblk => *n += len,
            _ => runs.push((lblk, pblk, len)),
        }
    }
    Ok(runs)
}

/// Metadata blocks one [`insert`] may write: an array of data pointers, the double- and
/// triple-indirect blocks above it, each maybe new (allocating it changes a bitmap and a group
/// descriptor, counted by the caller's allocation), and the inode.
pub const WORST_CASE_BLOCKS_TOUCHED: u32 = 2 * 3 + 2;

/// Block numbers per indirect block.
fn per_block(block_size: usize) -> u64 {
    block_size as u64 / 4
}

/// Logical blocks from `lblk` to the end of the array of data pointers holding it (the 12
/// direct slots, or one single-indirect block): the longest run one [`insert`] maps.
pub fn run_room(block_size: usize, lblk: u32) -> u32 {
    let lblk = u64::from(lblk);
    if lblk < DIRECT {
        return (DIRECT - lblk) as u32;
    }
    let per = per_block(block_size);
    (per - (lblk - DIRECT) % per) as u32
}

/// Logical blocks an indirect map can address: 12 direct, then one, two and three levels.
pub fn addressable_blocks(block_size: usize) -> u64 {
    let per = per_block(block_size);
    DIRECT + per + per * per + per * per * per
}

/// The largest size of an indirect-mapped file, as the kernel's `ext4_max_bitmap_size`
/// (`s_bitmap_maxbytes`): what the map addresses, or less where i_blocks (32 bits of
/// 512-byte sectors without huge_file, 48 bits of blocks with it) could not count a dense file
/// and its indirect blocks.
pub fn max_file_bytes(block_size: usize, huge_file: bool) -> u64 {
    let bits = block_size.trailing_zeros();
    let per = per_block(block_size);
    let mut upper_limit: u64 =
        if huge_file { (1 << 48) - 1 } else { ((1u64 << 32) - 1) >> (bits - 9) };
    let addressable = addressable_blocks(block_size);
    let meta_blocks = 1 + (1 + per) + (1 + per + per * per);
    let blocks = if addressable + meta_blocks <= upper_limit {
        addressable
    } else {
        let res = upper_limit;
        upper_limit -= DIRECT + per;
        let meta = if upper_limit < per * per {
            1 + 1 + upper_limit.div_ceil(per)
        } else {
            upper_limit -= per * per;
            1 + (1 + per) + 1 + upper_limit.div_ceil(per) + upper_limit.div_ceil(per * per)
        };
        res - meta
    };
    (blocks << bits).min(i64::MAX as u64)
}

/// The error for a block number an indirect map cannot hold.
fn beyond_32_bits(ctx: &ExtentCtx, block: u64) -> FsError {
    FsError::Unsupported(format!(
        "inode {}: block {block} is past 2^32, which an indirect block map cannot name",
        ctx.ino
    ))
}

/// One array of block numbers being changed: `i_block`'s (`None`) or an indirect block's.
struct Array {
    block: Option<u64>,
    pointers: Vec<u32>,
}

/// Maps logical blocks `lblk .. lblk + len` to `pblk .. pblk + len`, allocating (with
/// `io.alloc_meta_block`, near `ctx.goal`) the indirect blocks on the way that do not exist
/// yet. The range must be unmapped and lie in one array of data pointers (`len` at most
/// [`run_room`]); `Invalid` otherwise, before anything changes.
pub fn insert(
    io: &mut dyn MetaIo,
    ctx: &ExtentCtx,
    root: &mut [u8; INODE_BLOCK_SIZE],
    lblk: u32,
    pblk: u64,
    len: u32,
) -> Result<()> {
    let bs = io.block_size();
    if len == 0 || len > run_room(bs, lblk) {
        return Err(FsError::Invalid(format!(
            "inode {}: an indirect insert of {len} blocks at {lblk} crosses a pointer array",
            ctx.ino
        )));
    }
    if u64::from(lblk) + u64::from(len) > addressable_blocks(bs) {
        return Err(FsError::FileTooLarge);
    }
    let end = pblk + u64::from(len);
    if pblk == 0 || end > io.blocks_count() {
        return Err(FsError::Invalid(format!(
            "blocks {pblk}+{len} are outside the file system ({} blocks)",
            io.blocks_count()
        )));
    }
    if end > 1 << 32 {
        return Err(beyond_32_bits(ctx, end - 1));
    }
    let blocks_count = io.blocks_count();
    let per = per_block(bs);
    let mut walk = Walk { io, ctx, per_block: per, blocks_count, seen: HashSet::new() };
    let slots = root_pointers(root);
    let lblk = u64::from(lblk);
    // The arrays from i_block down to the one holding the run, and the index in each.
    let mut path: Vec<(Array, usize)> = Vec::new();
    let mut fresh: Vec<u64> = Vec::new();
    let result = (|| {
        let leaf_index = if lblk < DIRECT {
            path.push((Array { block: None, pointers: slots.to_vec() }, lblk as usize));
            lblk as usize
        } else {
            let (slot, level, base) = walk.region(lblk).expect("inside the addressable range");
            path.push((Array { block: None, pointers: slots.to_vec() }, slot));
            let mut offset = lblk - base;
            for level in (1..=level).rev() {
                let (parent, index) = path.last_mut().expect("i_block is on the path");
                let pointer = parent.pointers[*index];
                let block = if pointer == 0 {
                    let block = walk.io.alloc_meta_block(walk.ctx.goal)?;
                    fresh.push(block);
                    if block >= 1 << 32 {
                        return Err(beyond_32_bits(walk.ctx, block));
                    }
                    parent.pointers[*index] = block as u32;
                    Array { block: Some(block), pointers: vec![0; per as usize] }
                } else {
                    let holder = parent.block.unwrap_or(0);
                    let block = walk.checked(pointer, holder)?;
                    // A block twice on the path (a map naming itself) would be written twice,
                    // the parent's stale copy over the child's change.
                    walk.first_visit(block)?;
                    Array { block: Some(block), pointers: walk.pointers(block)? }
                };
                let index = (offset / walk.span(level - 1)) as usize;
                offset %= walk.span(level - 1);
                path.push((block, index));
            }
            path.last().expect("a leaf array").1
        };
        let (leaf, _) = path.last_mut().expect("a leaf array");
        let run = leaf_index..leaf_index + len as usize;
        if leaf.pointers[run.clone()].iter().any(|&p| p != 0) {
            return Err(FsError::Invalid(format!(
                "inode {}: logical blocks {lblk}+{len} are already mapped",
                walk.ctx.ino
            )));
        }
        for (k, pointer) in leaf.pointers[run].iter_mut().enumerate() {
            *pointer = (pblk + k as u64) as u32;
        }
        Ok(())
    })();
    if let Err(err) = result {
        for block in fresh {
            walk.io.free_meta_block(block)?;
        }
        return Err(err);
    }
    // Children before parents; i_block last, in place (the caller writes the inode).
    for (array, _) in path.iter().rev() {
        match array.block {
            Some(block) => walk.io.write_meta(block, &encode_pointers(&array.pointers))?,
            None => set_root_pointers(root, &array.pointers),
        }
    }
    Ok(())
}

/// `pointers` as the bytes of an indirect block.
fn encode_pointers(pointers: &[u32]) -> Vec<u8> {
    pointers.iter().flat_map(|p| p.to_le_bytes()).collect()
}

/// Writes 15 block numbers into `i_block`.
fn set_root_pointers(root: &mut [u8; INODE_BLOCK_SIZE], pointers: &[u32]) {
    for (bytes, p) in root.chunks_exact_mut(4).zip(pointers) {
        bytes.copy_from_slice(&p.to_le_bytes());
    }
}

/// What a removal found to free.
struct Removal {
    /// Data blocks, physically contiguous runs as (first, count).
    data: Vec<(u64, u64)>,
    /// Indirect blocks left mapping nothing.
    meta: Vec<u64>,
}

impl Removal {
    fn data_block(&mut self, block: u64) {
        match self.data.last_mut() {
            Some((first, count)) if *first + *count == block => *count += 1,
            _ => self.data.push((block, 1)),
        }
    }
}

/// Unmaps logical blocks `start .. end` (`end` exclusive; past the map's reach means "to the
/// end": a truncate), frees their data blocks with `io.free_data_blocks` (contiguous runs in
/// one call) and the indirect blocks left mapping nothing with `io.free_meta_block`. Returns
/// the number of data blocks freed. Every block number is checked before anything changes.
pub fn remove_range(
    io: &mut dyn MetaIo,
    ctx: &ExtentCtx,
    root: &mut [u8; INODE_BLOCK_SIZE],
    start: u32,
    end: u64,
) -> Result<u64> {
    let bs = io.block_size();
    let end = end.min(addressable_blocks(bs));
    let start = u64::from(start);
    if start >= end {
        return Ok(0);
    }
    let blocks_count = io.blocks_count();
    let mut walk = Walk { io, ctx, per_block: per_block(bs), blocks_count, seen: HashSet::new() };
    let mut slots = root_pointers(root);
    let mut removal = Removal { data: Vec::new(), meta: Vec::new() };
    // Indirect blocks rewritten, written once every block number has been checked.
    let mut rewrites: Vec<(u64, Vec<u32>)> = Vec::new();
    for l in start..end.min(DIRECT) {
        if slots[l as usize] != 0 {
            let block = walk.checked(slots[l as usize], 0)?;
            removal.data_block(block);
            slots[l as usize] = 0;
        }
    }
    let mut base = DIRECT;
    for (slot, level) in [(12, 1), (13, 2), (14, 3)] {
        let span = walk.span(level);
        if start < base + span && end > base && slots[slot] != 0 {
            let block = walk.checked(slots[slot], 0)?;
            let (from, to) = (start.saturating_sub(base), (end - base).min(span));
            if walk.remove_in(block, level, from, to, &mut removal, &mut rewrites)? {
                removal.meta.push(block);
                slots[slot] = 0;
            }
        }
        base += span;
    }
    for (block, pointers) in rewrites {
        walk.io.write_meta(block, &encode_pointers(&pointers))?;
    }
    set_root_pointers(root, &slots);
    for block in removal.meta {
        walk.io.free_meta_block(block)?;
    }
    let mut freed = 0;
    for (first, count) in removal.data {
        walk.io.free_data_blocks(first, count)?;
        freed += count;
    }
    Ok(freed)
}

impl Walk<'_> {
    /// Clears the pointers of indirect block `block` (of `level`) covering offsets `from ..
    /// to` of what it maps, collecting what to free; whether the block now maps nothing (its
    /// caller frees it, or it is queued in `rewrites` with its new pointers).
    fn remove_in(
        &mut self,
        block: u64,
        level: u32,
        from: u64,
        to: u64,
        removal: &mut Removal,
        rewrites: &mut Vec<(u64, Vec<u32>)>,
    ) -> Result<bool> {
        self.first_visit(block)?;
        let child_span = self.span(level - 1);
        let mut pointers = self.pointers(block)?;
        let mut changed = false;
        let first = (from / child_span) as usize;
        let last = (to.div_ceil(child_span) as usize).min(pointers.len());
        for (i, pointer) in pointers.iter_mut().enumerate().take(last).skip(first) {
            if *pointer == 0 {
                continue;
            }
            let child = self.checked(*pointer, block)?;
            if level == 1 {
                removal.data_block(child);
                *pointer = 0;
                changed = true;
                continue;
            }
            let child_start = i as u64 * child_span;
            let (c_from, c_to) =
                (from.saturating_sub(child_start), (to - child_start).min(child_span));
            if self.remove_in(child, level - 1, c_from, c_to, removal, rewrites)? {
                removal.meta.push(child);
                *pointer = 0;
                changed = true;
            }
        }
        let empty = pointers.iter().all(|&p| p == 0);
        if changed && !empty {
            rewrites.push((block, pointers));
        }
        Ok(empty)
    }

    /// Every mapped run under indirect block `block` of `level` (whose first logical block is
    /// `base`), each within one array of data pointers, and the indirect blocks, parents first.
    fn collect(
        &mut self,
        block: u64,
        level: u32,
        base: u64,
        out: &mut Vec<Extent>,
        blocks: &mut Vec<u64>,
    ) -> Result<()> {
        self.first_visit(block)?;
        blocks.push(block);
        let pointers = self.pointers(block)?;
        if level == 1 {
            push_runs(self, &pointers, base, block, out)?;
            return Ok(());
        }
        let child_span = self.span(level - 1);
        for (i, &pointer) in pointers.iter().enumerate() {
            if pointer != 0 {
                let child = self.checked(pointer, block)?;
                self.collect(child, level - 1, base + i as u64 * child_span, out, blocks)?;
            }
        }
        Ok(())
    }
}

/// The runs of one array of data pointers (whose first logical block is `base`, held by
/// `holder`: 0 for `i_block`), physically contiguous pointers merged.
fn push_runs(
    walk: &Walk<'_>,
    pointers: &[u32],
    base: u64,
    holder: u64,
    out: &mut Vec<Extent>,
) -> Result<()> {
    let first_run = out.len();
    for (i, &pointer) in pointers.iter().enumerate() {
        if pointer == 0 {
            continue;
        }
        let start = walk.checked(pointer, holder)?;
        let logical = (base + i as u64) as u32;
        let ours = out.len() > first_run;
        match out.last_mut() {
            Some(e)
                if ours
                    && e.logical_end() == u64::from(logical)
                    && e.start + u64::from(e.len) == start =>
            {
                e.len += 1
            }
            _ => out.push(Extent { logical, len: 1, start, unwritten: false }),
        }
    }
    Ok(())
}

/// Every mapped run of the map in logical order, as extents (none unwritten), each within one
/// array of data pointers; and the indirect blocks, parents before children.
pub fn walk_all(
    io: &mut dyn MetaIo,
    ctx: &ExtentCtx,
    root: &[u8; INODE_BLOCK_SIZE],
) -> Result<(Vec<Extent>, Vec<u64>)> {
    let blocks_count = io.blocks_count();
    let per = per_block(io.block_size());
    let mut walk = Walk { io, ctx, per_block: per, blocks_count, seen: HashSet::new() };
    let slots = root_pointers(root);
    let (mut extents, mut blocks) = (Vec::new(), Vec::new());
    push_runs(&walk, &slots[..DIRECT as usize], 0, 0, &mut extents)?;
    let mut base = DIRECT;
    for (slot, level) in [(12, 1), (13, 2), (14, 3)] {
        if slots[slot] != 0 {
            let block = walk.checked(slots[slot], 0)?;
            walk.collect(block, level, base, &mut extents, &mut blocks)?;
        }
        base += walk.span(level);
    }
    Ok((extents, blocks))
}

/// How logical blocks `first ..= last` are mapped, as `extent_tree::mapping` says it.
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
        let left = (end - lblk).min(u64::from(u32::MAX)) as u32;
        let (run, len) = match lookup(io, ctx, root, lblk as u32)? {
            Lookup::Mapped { pblk, len, unwritten } => {
                let len = len.min(left);
                (Lookup::Mapped { pblk, len, unwritten }, len)
            }
            Lookup::Hole { len_to_next } => {
                let len = len_to_next.unwrap_or(u32::MAX).min(left);
                (Lookup::Hole { len_to_next: Some(len) }, len)
            }
        };
        out.push((lblk as u32, run));
        lblk += u64::from(len);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta_io::mem::MemMetaIo;

    const BS: usize = 1024;
    const PER: u64 = BS as u64 / 4;

    fn ctx() -> ExtentCtx {
        ExtentCtx { ino: 12, inode_block: 5, csum_seed: None, goal: 0 }
    }

    fn block_of(pointers: &[(usize, u32)]) -> Vec<u8> {
        let mut block = vec![0u8; BS];
        for &(i, p) in pointers {
            block[i * 4..i * 4 + 4].copy_from_slice(&p.to_le_bytes());
        }
        block
    }

    /// A map with direct blocks 0-1 (physically contiguous), a hole, single-indirect blocks
    /// at logical 12 and 40, and one triple-indirect block far out; lookups give runs, holes
    /// with the distance to the next data, and nothing past the end.
    #[test]
    fn lookups_walk_every_level_and_measure_holes() {
        let mut io = MemMetaIo::new(BS, 1 << 20);
        let mut root = [0u8; INODE_BLOCK_SIZE];
        let mut set =
            |slot: usize, p: u32| root[slot * 4..slot * 4 + 4].copy_from_slice(&p.to_le_bytes());
        set(0, 100);
        set(1, 101);
        set(12, 200);
        set(14, 300);
        io.blocks.insert(200, block_of(&[(0, 500), (28, 600)]));
        io.blocks.insert(300, block_of(&[(2, 301)]));
        io.blocks.insert(301, block_of(&[(3, 302)]));
        io.blocks.insert(302, block_of(&[(4, 700)]));
        let triple_base = 12 + PER + PER * PER;
        let far = triple_base + 2 * PER * PER + 3 * PER + 4;
        let at = |io: &mut MemMetaIo, l: u64| lookup(io, &ctx(), &root, l as u32).unwrap();
        assert_eq!(at(&mut io, 0), Lookup::Mapped { pblk: 100, len: 2, unwritten: false });
        assert_eq!(at(&mut io, 1), Lookup::Mapped { pblk: 101, len: 1, unwritten: false });
        assert_eq!(at(&mut io, 2), Lookup::Hole { len_to_next: Some(10) });
        assert_eq!(at(&mut io, 12), Lookup::Mapped { pblk: 500, len: 1, unwritten: false });
        assert_eq!(at(&mut io, 13), Lookup::Hole { len_to_next: Some(27) });
        assert_eq!(at(&mut io, 40), Lookup::Mapped { pblk: 600, len: 1, unwritten: false });
        let to_far = u32::try_from(far - 41).unwrap();
        assert_eq!(at(&mut io, 41), Lookup::Hole { len_to_next: Some(to_far) });
        assert_eq!(at(&mut io, far), Lookup::Mapped { pblk: 700, len: 1, unwritten: false });
        assert_eq!(at(&mut io, far + 1), Lookup::Hole { len_to_next: None });
        let runs = runs(&mut io, &ctx(), &root, (far + 1) as u32).unwrap();
        assert_eq!(runs, vec![(0, 100, 2), (12, 500, 1), (40, 600, 1), (far as u32, 700, 1)]);
    }

    /// Runs inserted in every range (direct, single, double, triple) read back through
    /// lookup and the full walk; removing part of them frees exactly their data blocks and the
    /// indirect blocks left empty; removing the rest leaves nothing allocated and an empty map.
    #[test]
    fn inserts_and_removals_allocate_and_free_exactly_what_they_should() {
        let mut io = MemMetaIo::new(BS, 1 << 22);
        io.first_free = 1 << 21; // indirect blocks come from up here, data from below
        let ctx = ExtentCtx { goal: 1 << 21, ..ctx() };
        let mut root = [0u8; INODE_BLOCK_SIZE];
        let triple = 12 + PER + PER * PER;
        let runs: [(u64, u64, u32); 6] = [
            (0, 1000, 12),
            (12, 2000, PER as u32),
            (12 + PER + 5, 3000, 10),
            (12 + PER + 3 * PER, 4000, PER as u32),
            (triple + 7, 5000, 3),
            (triple + PER * PER + 2 * PER, 6000, 1),
        ];
        for &(lblk, pblk, len) in &runs {
            io.mark_allocated(pblk, u64::from(len));
            assert!(run_room(BS, lblk as u32) >= len);
            insert(&mut io, &ctx, &mut root, lblk as u32, pblk, len).unwrap();
        }
        // An overlap and a run across an array's edge are refused, changing nothing.
        let before = (root, io.blocks.clone());
        assert!(insert(&mut io, &ctx, &mut root, (12 + PER + 7) as u32, 9000, 1).is_err());
        assert!(insert(&mut io, &ctx, &mut root, (12 + PER - 1) as u32, 9000, 2).is_err());
        assert!(before == (root, io.blocks.clone()));
        for &(lblk, pblk, len) in &runs {
            let got = lookup(&mut io, &ctx, &root, lblk as u32).unwrap();
            assert_eq!(got, Lookup::Mapped { pblk, len, unwritten: false }, "at {lblk}");
        }
        let (extents, blocks) = walk_all(&mut io, &ctx, &root).unwrap();
        let found: Vec<_> =
            extents.iter().map(|e| (u64::from(e.logical), e.start, e.len)).collect();
        assert_eq!(found, runs.to_vec());
        // single, double + 2 of its arrays, triple + 2 doubles under it + 2 arrays
        assert_eq!(blocks.len(), 1 + 3 + 5, "{blocks:?}");
        let meta_before: Vec<u64> = blocks.clone();
        // Remove the middle of the double-indirect range: its first array's run and half the
        // second's.
        let freed =
            remove_range(&mut io, &ctx, &mut root, (12 + PER) as u32, 12 + PER + 3 * PER + 10)
                .unwrap();
        assert_eq!(freed, 10 + 10);
        assert_eq!(io.data_freed, vec![(3000, 10), (4000, 10)]);
        assert_eq!(io.meta_freed.len(), 1, "the emptied array goes: {:?}", io.meta_freed);
        assert_eq!(
            lookup(&mut io, &ctx, &root, (12 + PER + 3 * PER + 10) as u32).unwrap(),
            Lookup::Mapped { pblk: 4010, len: PER as u32 - 10, unwritten: false }
        );
        // Everything else (a truncate to 0): nothing left allocated, an empty map.
        remove_range(&mut io, &ctx, &mut root, 0, 1 << 32).unwrap();
        assert!(io.allocated.is_empty(), "leaked: {:?}", io.allocated);
        assert!(root.iter().all(|&b| b == 0));
        let mut all_meta = io.meta_freed.clone();
        all_meta.sort_unstable();
        let mut expected_meta = meta_before;
        expected_meta.sort_unstable();
        assert_eq!(all_meta, expected_meta);
    }

    /// The size limit is the kernel's `ext4_max_bitmap_size` (checked against a kernel mount:
    /// ftruncate's largest accepted size on ext3).
    #[test]
    fn the_size_limit_is_the_kernels() {
        assert_eq!(max_file_bytes(1024, false), 17_247_252_480);
        assert_eq!(max_file_bytes(4096, false), 2_196_873_666_560);
        assert!(max_file_bytes(4096, true) > max_file_bytes(4096, false));
    }

    /// A block number outside the file system, in the inode or in an indirect block, is
    /// reported as corruption of what holds it, not followed.
    #[test]
    fn pointers_outside_the_file_system_are_corruption() {
        let mut io = MemMetaIo::new(BS, 1000);
        let mut root = [0u8; INODE_BLOCK_SIZE];
        root[12 * 4..12 * 4 + 4].copy_from_slice(&200u32.to_le_bytes());
        io.blocks.insert(200, block_of(&[(0, 5000)]));
        let err = lookup(&mut io, &ctx(), &root, 12).unwrap_err();
        assert!(err.is_corruption() && err.to_string().contains("5000"), "{err}");
        root[13 * 4..13 * 4 + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        let err = lookup(&mut io, &ctx(), &root, (12 + PER) as u32).unwrap_err();
        assert!(err.is_corruption(), "{err}");
        // A run of contiguous pointers stops at the file system's end; the pointer past it is
        // damage when it is reached.
        for (slot, pointer) in [(0, 998u32), (1, 999), (2, 1000)] {
            root[slot * 4..slot * 4 + 4].copy_from_slice(&pointer.to_le_bytes());
        }
        let run = lookup(&mut io, &ctx(), &root, 0).unwrap();
        assert_eq!(run, Lookup::Mapped { pblk: 998, len: 2, unwritten: false });
        assert!(lookup(&mut io, &ctx(), &root, 2).unwrap_err().is_corruption());
    }
}
