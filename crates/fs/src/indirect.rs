//! Indirect block maps, the read side: how ext2, ext3 and ext4 inodes without the extents
//! flag (`EXTENTS_FL`) map logical blocks (`fs/ext4/indirect.c`). `i_block` holds 15
//! little-endian block numbers: 12 direct blocks, then one single-, one double- and one
//! triple-indirect block; an indirect block is an array of `block_size / 4` block numbers,
//! each naming a data block (single) or an indirect block one level down. Zero is a hole, at
//! any level. There are no unwritten blocks.
//!
//! Every block number met is checked to lie inside the file system before it is used or
//! read: a damaged map is reported as corruption of the block (or inode) that holds it,
//! never followed. The walk is bounded by the three levels, so a block naming itself cannot
//! loop it. Changing an indirect map (allocating, truncating, punching) is not here: quill
//! refuses, before anything changes, to change an indirect-mapped file's data or add names
//! to an indirect-mapped directory (`data::check_extent_mapped`), or to free indirect-mapped
//! blocks (`data::indirect_mapping`).

use ondisk::ext4::{self, INODE_BLOCK_SIZE};

use crate::error::{FsError, Result};
use crate::extent_tree::{self, ExtentCtx, Lookup};
use crate::meta_io::MetaIo;

/// Direct block pointers in `i_block`.
const DIRECT: u64 = 12;

/// What logical block `lblk` of an inode maps to, whichever way the inode maps its blocks.
pub fn lookup_inode(
    io: &mut dyn MetaIo,
    ctx: &ExtentCtx,
    inode: &ext4::Inode,
    lblk: u32,
) -> Result<Lookup> {
    if inode.uses_extents() {
        extent_tree::lookup(io, ctx, &inode.block, lblk)
    } else {
        lookup(io, ctx, &inode.block, lblk)
    }
}

/// One indirect map being read.
struct Walk<'a> {
    io: &'a mut dyn MetaIo,
    ctx: &'a ExtentCtx,
    /// Block numbers per indirect block.
    per_block: u64,
    blocks_count: u64,
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
    let mut walk = Walk { io, ctx, per_block, blocks_count };
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
    /// checked to lie inside the file system.
    fn checked(&self, pointer: u32, holder: u64) -> Result<u64> {
        let block = u64::from(pointer);
        if block == 0 || block >= self.blocks_count {
            let at = if holder == 0 { self.ctx.inode_block } else { holder };
            return Err(FsError::corrupted(
                at,
                format!(
                    "inode {}: indirect map names block {block}, outside the file system",
                    self.ctx.ino
                ),
            ));
        }
        Ok(block)
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

/// Every mapped run of an indirect map, in logical order, as (logical, physical, length):
/// what an extent list says of an extent-mapped inode (the journal inode of an ext3 image).
pub fn runs(
    io: &mut dyn MetaIo,
    ctx: &ExtentCtx,
    root: &[u8; INODE_BLOCK_SIZE],
    len_blocks: u32,
) -> Result<Vec<(u32, u64, u32)>> {
    let mut runs: Vec<(u32, u64, u32)> = Vec::new();
    let mut lblk = 0u32;
    while lblk < len_blocks {
        match lookup(io, ctx, root, lblk)? {
            Lookup::Mapped { pblk, len, .. } => {
                let len = len.min(len_blocks - lblk);
                match runs.last_mut() {
                    Some((l, p, n)) if *l + *n == lblk && *p + u64::from(*n) == pblk => *n += len,
                    _ => runs.push((lblk, pblk, len)),
                }
                lblk += len;
            }
            Lookup::Hole { len_to_next: Some(n) } => lblk = lblk.saturating_add(n),
            Lookup::Hole { len_to_next: None } => break,
        }
    }
    Ok(runs)
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
