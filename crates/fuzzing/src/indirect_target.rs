//! The `indirect_map` target: quill's walker of ext2/ext3 indirect block maps
//! (`fs::indirect`), and its changes (a removal, an insert), over a map the input describes.

use fs::error::{FsError, Result};
use fs::extent_tree::{ExtentCtx, Lookup};
use fs::indirect;
use fs::meta_io::mem::MemMetaIo;
use fs::meta_io::MetaIo;
use ondisk::ext4::INODE_BLOCK_SIZE;

use crate::input::Input;

/// The most logical blocks a run list covers (bounds the work of one input).
const RUNS_SPAN: u32 = 1 << 22;

/// `indirect_map`: `[block size: 1 KiB << (u8 % 3)][blocks in the file system, u16 + 16]
/// [query count u8 % 16][queries, u32 each][i_block, 60 bytes]` then blocks until the input
/// ends, each `[block number u16][block bytes]`. Every lookup (the queries, the first 64
/// blocks, the first block of each indirect level) and the run list answer without panicking
/// (an error for a damaged map); a mapped block lies inside the file system; a hole's distance
/// to the next data leads to mapped data. Then a removal (from the first query, as long as
/// the second says) leaves holes where it succeeded, and an insert (at the third query, or
/// the single-indirect range) maps what it was given where it succeeded.
pub fn indirect_map(data: &[u8]) {
    let mut input = Input::new(data);
    let block_size = 1024usize << (input.u8() % 3);
    let blocks_count = u64::from(input.u16()) + 16;
    let queries: Vec<u32> = (0..input.u8() % 16).map(|_| input.u32()).collect();
    let mut root = [0u8; INODE_BLOCK_SIZE];
    root.copy_from_slice(&{
        let mut bytes = input.bytes(INODE_BLOCK_SIZE).to_vec();
        bytes.resize(INODE_BLOCK_SIZE, 0);
        bytes
    });
    let mut io = MemMetaIo::new(block_size, blocks_count);
    while !input.is_empty() {
        let number = u64::from(input.u16()) % blocks_count;
        let mut block = input.bytes(block_size).to_vec();
        block.resize(block_size, 0);
        io.blocks.insert(number, block);
    }
    let ctx = ExtentCtx { ino: 12, inode_block: 1, csum_seed: None, goal: 0 };
    let per = block_size as u32 / 4;
    let level_starts = [12, 12 + per, 12 + per + per * per];
    for lblk in queries.iter().copied().chain(0..64).chain(level_starts) {
        match indirect::lookup(&mut io, &ctx, &root, lblk) {
            Err(_) => {}
            Ok(Lookup::Mapped { pblk, len, unwritten }) => {
                assert!(pblk > 0 && pblk + u64::from(len) <= blocks_count, "mapped outside");
                assert!(len >= 1 && !unwritten, "a mapped run of {len} blocks");
            }
            Ok(Lookup::Hole { len_to_next: Some(n) }) => {
                assert!(n >= 1, "a hole of no length");
                if let Some(next) = lblk.checked_add(n) {
                    let there = indirect::lookup(&mut io, &ctx, &root, next);
                    assert!(
                        !matches!(there, Ok(Lookup::Hole { .. })),
                        "the data a hole leads to is not there"
                    );
                }
            }
            Ok(Lookup::Hole { len_to_next: None }) => {}
        }
    }
    if let Ok(runs) = indirect::runs(&mut io, &ctx, &root, RUNS_SPAN) {
        for pair in runs.windows(2) {
            assert!(pair[0].0 + pair[0].2 <= pair[1].0, "runs out of order or overlapping");
        }
    }
    let mut io = Lenient { inner: io, next_free: blocks_count - 1 };
    let start = queries.first().copied().unwrap_or(0);
    let len = queries.get(1).map_or(RUNS_SPAN, |l| l % RUNS_SPAN);
    let end = (u64::from(start) + u64::from(len)).min(1 << 32);
    if indirect::remove_range(&mut io, &ctx, &mut root, start, end).is_ok()
        && end > u64::from(start)
    {
        let last = (end - 1) as u32;
        for lblk in [start, start.saturating_add(1).min(last), start + (last - start) / 2, last] {
            let there = indirect::lookup(&mut io, &ctx, &root, lblk);
            assert!(!matches!(there, Ok(Lookup::Mapped { .. })), "block {lblk} still mapped");
        }
    }
    let lblk = queries.get(2).copied().unwrap_or(12 + per);
    let run = indirect::run_room(block_size, lblk).min(4).min((blocks_count - 1) as u32);
    if indirect::insert(&mut io, &ctx, &mut root, lblk, 1, run).is_ok() {
        match indirect::lookup(&mut io, &ctx, &root, lblk) {
            Ok(Lookup::Mapped { pblk: 1, len, .. }) => assert!(len >= run, "inserted {run}"),
            other => panic!("inserted {run} blocks at {lblk} from block 1, found {other:?}"),
        }
    }
}

/// A [`MemMetaIo`] whose frees only count (a damaged map may name a block twice, or one the
/// test never allocated) and whose allocations come down from the top of the file system.
struct Lenient {
    inner: MemMetaIo,
    next_free: u64,
}

impl MetaIo for Lenient {
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }
    fn blocks_count(&self) -> u64 {
        self.inner.blocks_count()
    }
    fn read_meta(&mut self, block: u64) -> Result<Vec<u8>> {
        self.inner.read_meta(block)
    }
    fn write_meta(&mut self, block: u64, data: &[u8]) -> Result<()> {
        self.inner.write_meta(block, data)
    }
    fn alloc_meta_block(&mut self, _goal: u64) -> Result<u64> {
        while self.next_free > 1 && self.inner.blocks.contains_key(&self.next_free) {
            self.next_free -= 1;
        }
        if self.next_free <= 1 {
            return Err(FsError::NoSpace);
        }
        self.next_free -= 1;
        Ok(self.next_free + 1)
    }
    fn free_meta_block(&mut self, _block: u64) -> Result<()> {
        Ok(())
    }
    fn free_data_blocks(&mut self, _start: u64, _count: u64) -> Result<()> {
        Ok(())
    }
}
