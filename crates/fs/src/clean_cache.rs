//! The clean data cache: file data blocks recently read from the device, kept in memory so
//! re-reads are served without I/O. The file device bypasses the host page cache (O_DIRECT),
//! so without this every read of file data not dirty in the file data cache (`page_cache.rs`)
//! would reach the disk.
//!
//! [`CachedDevice`] wraps the file system's device; the journal and the file system write
//! only through it, so every write invalidates the blocks it covers and the cache can never
//! serve bytes older than the device holds. Metadata reads pass through uncached (the journal's
//! buffer cache holds metadata); only [`CachedDevice::read_data`] (what it read) and
//! [`CachedDevice::write_data_batch`] (file data written back) fill the cache.
//!
//! A read that misses races with writes to the same block:
//!
//! | order of events                                   | outcome                              |
//! |---------------------------------------------------|--------------------------------------|
//! | write completes, then the read starts             | the read sees the new bytes, caches them |
//! | the read starts, a write completes, read inserts  | insert refused: the shard logged the write after the read's snapshot |
//! | the read inserts, then a write completes          | the write's invalidation removes the entry |
//!
//! Invariants (per shard, under its lock): `bytes` is the sum of the cached blocks' sizes and
//! stays at most the shard's share of the bound; `order` holds exactly the cached blocks, each
//! under its last use; `writes_seq` counts completed writes touching the shard and `recent`
//! holds the last [`RECENT_WRITES_MAX`] of their blocks.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use blockdev::{BlockDevice, DeviceError, Write};
use parking_lot::Mutex;

/// Shards of the cache, each with its own lock and its share of the bound.
const SHARDS: usize = 16;

/// Completed writes a shard remembers for refusing a racing insert; a read that overlapped
/// more writes than this does not cache its blocks.
const RECENT_WRITES_MAX: usize = 64;

#[derive(Default)]
struct Shard {
    blocks: HashMap<u64, (Box<[u8]>, u64)>,
    /// Last-use tick → block; the smallest tick is evicted first.
    order: BTreeMap<u64, u64>,
    tick: u64,
    bytes: u64,
    writes_seq: u64,
    recent: VecDeque<(u64, u64)>,
}

impl Shard {
    fn touch(&mut self, block: u64) {
        self.tick += 1;
        let tick = self.tick;
        if let Some((_, last)) = self.blocks.get_mut(&block) {
            self.order.remove(last);
            *last = tick;
            self.order.insert(tick, block);
        }
    }

    fn remove(&mut self, block: u64) {
        if let Some((data, last)) = self.blocks.remove(&block) {
            self.order.remove(&last);
            self.bytes -= data.len() as u64;
        }
    }

    fn insert(&mut self, block: u64, data: &[u8], bytes_max: u64) {
        if self.blocks.contains_key(&block) || data.len() as u64 > bytes_max {
            return;
        }
        while self.bytes + data.len() as u64 > bytes_max {
            let (_, oldest) = self.order.pop_first().expect("bytes > 0 means a cached block");
            let (gone, _) = self.blocks.remove(&oldest).expect("order names cached blocks");
            self.bytes -= gone.len() as u64;
        }
        self.tick += 1;
        self.blocks.insert(block, (data.into(), self.tick));
        self.order.insert(self.tick, block);
        self.bytes += data.len() as u64;
        debug_assert_eq!(self.blocks.len(), self.order.len());
    }

    /// Records a completed write of `block` (after its cached copy was removed).
    fn log_write(&mut self, block: u64) {
        self.writes_seq += 1;
        let seq = self.writes_seq;
        if self.recent.len() == RECENT_WRITES_MAX {
            self.recent.pop_front();
        }
        self.recent.push_back((seq, block));
    }

    /// Whether `block` may be cached from a read that snapshot `writes_seq` as `since`.
    fn unwritten_since(&self, block: u64, since: u64) -> bool {
        let missed = self.writes_seq - since;
        if missed as usize > self.recent.len() {
            return false;
        }
        self.recent.iter().rev().take(missed as usize).all(|&(_, b)| b != block)
    }
}

/// A device whose file data reads are cached. See the module documentation.
pub struct CachedDevice {
    inner: Arc<dyn BlockDevice>,
    block_size: u64,
    shard_bytes_max: u64,
    shards: Vec<Mutex<Shard>>,
}

impl CachedDevice {
    /// Caches blocks of `block_size` bytes, at most `bytes_max` in all (0: no caching).
    pub fn new(inner: Arc<dyn BlockDevice>, block_size: u32, bytes_max: u64) -> CachedDevice {
        assert!(block_size.is_power_of_two() && block_size >= 512, "block size {block_size}");
        CachedDevice {
            inner,
            block_size: u64::from(block_size),
            shard_bytes_max: bytes_max / SHARDS as u64,
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
        }
    }

    fn shard(&self, block: u64) -> &Mutex<Shard> {
        &self.shards[(block % SHARDS as u64) as usize]
    }

    /// Bytes cached now (for tests and figures).
    pub fn cached_bytes(&self) -> u64 {
        self.shards.iter().map(|s| s.lock().bytes).sum()
    }

    /// Reads whole blocks of file data at block `first` into `out` (a whole number of blocks):
    /// from the cache if every block is there, else from the device, caching what was read.
    pub fn read_data(&self, first: u64, out: &mut [u8]) -> Result<(), DeviceError> {
        let bs = self.block_size as usize;
        assert!(out.len().is_multiple_of(bs), "{} bytes is not whole blocks", out.len());
        if self.shard_bytes_max < self.block_size {
            return self.inner.read_at(first * self.block_size, out);
        }
        let mut snapshots = Vec::with_capacity(out.len() / bs);
        let mut all_hit = true;
        for (i, chunk) in out.chunks_mut(bs).enumerate() {
            let block = first + i as u64;
            let mut shard = self.shard(block).lock();
            match shard.blocks.get(&block) {
                Some((data, _)) if all_hit => {
                    chunk.copy_from_slice(data);
                    shard.touch(block);
                }
                _ => all_hit = false,
            }
            snapshots.push(shard.writes_seq);
        }
        if all_hit {
            return Ok(());
        }
        self.inner.read_at(first * self.block_size, out)?;
        for (i, chunk) in out.chunks(bs).enumerate() {
            let block = first + i as u64;
            let mut shard = self.shard(block).lock();
            if shard.unwritten_since(block, snapshots[i]) {
                shard.insert(block, chunk, self.shard_bytes_max);
            }
        }
        Ok(())
    }

    /// Writes file data (whole blocks) and keeps it cached, as a page cache keeps what was
    /// written: the re-read that so often follows (varmail reads back the files it appends
    /// to) then costs no I/O, whether or not the device bypasses the host's page cache. A
    /// block is cached only if no other write touched it between this write's start and its
    /// completion (the read-miss rule of the module docs, applied to writes); otherwise, or if
    /// the write failed, it is only invalidated.
    pub fn write_data_batch(&self, writes: &[Write<'_>]) -> Result<(), DeviceError> {
        let bs = self.block_size;
        let caching = self.shard_bytes_max >= bs;
        let aligned =
            |w: &Write<'_>| w.offset.is_multiple_of(bs) && (w.data.len() as u64).is_multiple_of(bs);
        // Each block's shard sequence before the write is issued.
        let snapshots: Vec<Vec<u64>> = writes
            .iter()
            .map(|w| {
                if !caching || !aligned(w) {
                    return Vec::new();
                }
                let first = w.offset / bs;
                (0..w.data.len() as u64 / bs)
                    .map(|i| self.shard(first + i).lock().writes_seq)
                    .collect()
            })
            .collect();
        let result = self.inner.write_batch(writes);
        for (w, since) in writes.iter().zip(&snapshots) {
            if result.is_err() || since.is_empty() {
                self.written(w.offset, w.data.len());
                continue;
            }
            let first = w.offset / bs;
            for (i, block_bytes) in w.data.chunks(bs as usize).enumerate() {
                let block = first + i as u64;
                let mut shard = self.shard(block).lock();
                let alone = shard.unwritten_since(block, since[i]);
                shard.remove(block);
                shard.log_write(block);
                if alone {
                    shard.insert(block, block_bytes, self.shard_bytes_max);
                }
            }
        }
        result
    }

    /// Forgets the blocks `offset .. offset + len` touches, and logs the write per shard.
    fn written(&self, offset: u64, len: usize) {
        if len == 0 {
            return;
        }
        let first = offset / self.block_size;
        let last = (offset + len as u64 - 1) / self.block_size;
        for block in first..=last {
            let mut shard = self.shard(block).lock();
            shard.remove(block);
            shard.log_write(block);
        }
    }
}

impl BlockDevice for CachedDevice {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        self.inner.read_at(offset, buf)
    }

    // Every write invalidates after it returned, failed or not: what the device holds is then
    // unknown to the cache, and a read from then on sees the device.
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        let result = self.inner.write_at(offset, data);
        self.written(offset, data.len());
        result
    }

    fn write_fua_at(&self, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        let result = self.inner.write_fua_at(offset, data);
        self.written(offset, data.len());
        result
    }

    fn flush(&self) -> Result<(), DeviceError> {
        self.inner.flush()
    }

    fn has_cache_barrier(&self) -> bool {
        self.inner.has_cache_barrier()
    }

    fn write_barrier_at(&self, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        let result = self.inner.write_barrier_at(offset, data);
        self.written(offset, data.len());
        result
    }

    fn write_batch(&self, writes: &[Write<'_>]) -> Result<(), DeviceError> {
        let result = self.inner.write_batch(writes);
        for w in writes {
            self.written(w.offset, w.data.len());
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockdev::memory::MemDevice;

    fn device(blocks: u64, bytes_max: u64) -> (Arc<MemDevice>, CachedDevice) {
        let mem = Arc::new(MemDevice::new(blocks * 4096));
        let cached = CachedDevice::new(mem.clone(), 4096, bytes_max);
        (mem, cached)
    }

    #[test]
    fn a_reread_is_served_from_the_cache() {
        let (mem, cached) = device(64, 1 << 20);
        cached.write_at(4096, &[7; 8192]).unwrap();
        let mut out = vec![0; 8192];
        cached.read_data(1, &mut out).unwrap();
        assert_eq!(out, vec![7; 8192]);
        assert_eq!(cached.cached_bytes(), 8192);
        // Behind the cache's back (only a test can): the cached copy is what a re-read sees.
        mem.write_at(4096, &[9; 4096]).unwrap();
        cached.read_data(1, &mut out).unwrap();
        assert_eq!(out, vec![7; 8192]);
    }

    #[test]
    fn every_kind_of_write_invalidates_the_blocks_it_touches() {
        let (_mem, cached) = device(64, 1 << 20);
        let mut out = vec![0; 4096 * 4];
        cached.read_data(0, &mut out).unwrap();
        cached.write_at(512, &[1; 512]).unwrap();
        cached.write_fua_at(4096, &[2; 4096]).unwrap();
        cached.write_batch(&[Write { offset: 8192 + 1024, data: &[3; 1024], fua: false }]).unwrap();
        cached.read_data(0, &mut out).unwrap();
        assert_eq!(&out[512..1024], &[1; 512]);
        assert_eq!(&out[4096..8192], &[2; 4096]);
        assert_eq!(&out[8192 + 1024..8192 + 2048], &[3; 1024]);
        assert_eq!(&out[12288..], &[0; 4096]);
    }

    #[test]
    fn a_read_overlapping_a_write_does_not_cache_the_old_bytes() {
        let (_mem, cached) = device(64, 1 << 20);
        let block = 5;
        let since = cached.shard(block).lock().writes_seq;
        // A write completes while the read is at the device.
        cached.write_at(block * 4096, &[4; 4096]).unwrap();
        let shard = cached.shard(block).lock();
        assert!(!shard.unwritten_since(block, since));
        assert!(shard.unwritten_since(block + SHARDS as u64, since));
    }

    #[test]
    fn the_cache_stays_under_its_bound_evicting_the_least_recently_used() {
        let bound = SHARDS as u64 * 2 * 4096; // two blocks per shard
        let (_mem, cached) = device(256, bound);
        let mut out = vec![0; 4096];
        for block in 0..128 {
            cached.read_data(block, &mut out).unwrap();
            assert!(cached.cached_bytes() <= bound);
        }
        assert_eq!(cached.cached_bytes(), bound);
        let shard = cached.shard(0).lock();
        // Shard 0 saw blocks 0, 16, ..., 112: the last two stay.
        let mut kept: Vec<u64> = shard.blocks.keys().copied().collect();
        kept.sort();
        assert_eq!(kept, vec![96, 112]);
    }

    #[test]
    fn written_data_is_cached_and_a_later_write_replaces_it() {
        let (mem, cached) = device(64, 1 << 20);
        let batch = [
            Write { offset: 4 * 4096, data: &[7; 8192], fua: false },
            // Not whole blocks: written, not cached.
            Write { offset: 10 * 4096 + 512, data: &[8; 512], fua: false },
        ];
        cached.write_data_batch(&batch).unwrap();
        assert_eq!(cached.cached_bytes(), 8192);
        // Served from the cache: the device no longer holds what the cache says.
        mem.write_at(4 * 4096, &[0; 8192]).unwrap();
        let mut out = vec![0; 8192];
        cached.read_data(4, &mut out).unwrap();
        assert_eq!(out, vec![7; 8192]);
        // Any write through the cache replaces or drops the copy.
        cached
            .write_data_batch(&[Write { offset: 4 * 4096, data: &[9; 4096], fua: false }])
            .unwrap();
        cached.write_at(5 * 4096, &[6; 4096]).unwrap();
        cached.read_data(4, &mut out).unwrap();
        assert_eq!((&out[..4096], &out[4096..]), (&[9; 4096][..], &[6; 4096][..]));
    }

    #[test]
    fn a_write_overlapped_by_another_write_of_its_block_is_not_cached() {
        let (_mem, cached) = device(64, 1 << 20);
        // Another writer's write of block 3 completes between this batch's snapshot and its
        // completion: replay that order by hand.
        let since = cached.shard(3).lock().writes_seq;
        cached.write_at(3 * 4096, &[1; 4096]).unwrap();
        let mut shard = cached.shard(3).lock();
        assert!(!shard.unwritten_since(3, since), "the overlapping write is seen");
        drop(shard);
        cached
            .write_data_batch(&[Write { offset: 3 * 4096, data: &[2; 4096], fua: false }])
            .unwrap();
        // Alone from its own snapshot on, this one is cached.
        shard = cached.shard(3).lock();
        assert_eq!(shard.blocks.get(&3).map(|(d, _)| d[0]), Some(2));
    }

    #[test]
    fn a_failed_data_write_leaves_nothing_cached() {
        let mem = Arc::new(MemDevice::new(16 * 4096));
        let cached = CachedDevice::new(mem, 4096, 1 << 20);
        let beyond = Write { offset: 20 * 4096, data: &[1; 4096], fua: false };
        assert!(cached.write_data_batch(&[beyond]).is_err());
        assert_eq!(cached.cached_bytes(), 0);
    }

    #[test]
    fn a_zero_bound_caches_nothing() {
        let (_mem, cached) = device(8, 0);
        let mut out = vec![0; 4096];
        cached.read_data(0, &mut out).unwrap();
        assert_eq!(cached.cached_bytes(), 0);
    }
}
