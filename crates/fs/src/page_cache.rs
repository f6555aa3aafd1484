//! The file data cache: written data waits in memory until it is written back.
//!
//! A `write` copies its bytes into whole-block pages kept with the inode ([`FileCache`], under
//! the inode lock) and returns; blocks are not allocated yet (ext4's delayed allocation).
//! Writeback (`writeback.rs`) later allocates blocks for runs of pages, writes the data, and
//! only then maps it and grows the on-disk size in one handle, so data=ordered holds by
//! construction: no transaction ever maps a block whose data is not on the device.
//!
//! Space is reserved when the data is cached, one block per page over a hole (with bigalloc,
//! one cluster per logical cluster that such pages first fall in), so writeback
//! never meets ENOSPC for data that `write` accepted; the extent-tree blocks writeback may
//! need come from the file system's metadata pool (`Groups::reserve_up_to`), which ordinary
//! reservations leave free.
//!
//! Two sizes: `Inode::size` is what the disk says (ext4's `i_disksize`); the cache's
//! [`FileCache::size`] adds cached writes past it (ext4's `i_size`). Callers see the latter.
//!
//! Bounds: the bytes held in dirty pages across the file system are counted in
//! [`DirtyInodes`]; a write that takes the total over `MountOptions::dirty_bytes_max` writes
//! back before it returns (as the kernel's `balance_dirty_pages`), and a flusher writes back
//! inodes whose oldest dirty data is older than `MountOptions::dirty_expire`.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use crate::groups::Reservation;
use crate::inodes::InodeSlot;

/// One cached block of file data.
#[derive(Debug)]
pub(crate) struct Page {
    pub data: Box<[u8]>,
    /// The block is a hole on disk: writeback must allocate it (one reserved block).
    pub hole: bool,
}

/// An inode's dirty data (empty for clean inodes).
#[derive(Debug, Default)]
pub(crate) struct FileCache {
    /// Dirty pages by logical block; bytes past [`FileCache::size`] are zero.
    pub pages: BTreeMap<u32, Page>,
    /// The file size including cached writes; `None` when no cached write extends the file.
    pub size: Option<u64>,
    /// Blocks reserved for the pages over holes.
    pub reservation: Option<Reservation>,
    /// When the oldest dirty page was cached.
    pub dirty_since: Option<Instant>,
}

impl FileCache {
    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// Blocks the file will own after writeback for its pages over holes (counted in
    /// `st_blocks`, as ext4 counts delayed-allocation blocks): [`hole_blocks`].
    pub fn hole_blocks(&self, cluster_bits: u32) -> u64 {
        let holes = self.pages.iter().filter(|(_, p)| p.hole).map(|(&lblk, _)| lblk);
        hole_blocks(cluster_bits, holes) as u64
    }

    /// Adds `reservation` to the blocks held for hole pages.
    pub fn hold(&mut self, reservation: Reservation) {
        match &mut self.reservation {
            Some(held) => held.absorb(reservation),
            None => self.reservation = Some(reservation),
        }
    }

    /// Blocks to reserve for new pages over holes at `lblks` (ascending): [`hole_blocks`],
    /// less the logical clusters a cached hole page holds a reservation for already.
    pub fn new_hole_blocks(&self, cluster_bits: u32, lblks: impl Iterator<Item = u32>) -> i64 {
        if cluster_bits == 0 {
            // A block each: a new or dropped page is not in the cache (no lookups on the
            // write path of a file system without clusters).
            return lblks.count() as i64;
        }
        let fresh = lblks.filter(|&lblk| !self.hole_cached_in_cluster(cluster_bits, lblk));
        hole_blocks(cluster_bits, fresh)
    }

    /// Whether a cached page over a hole lies in `lblk`'s logical cluster.
    fn hole_cached_in_cluster(&self, cluster_bits: u32, lblk: u32) -> bool {
        let first = lblk >> cluster_bits << cluster_bits;
        let end = u64::from(first) + (1u64 << cluster_bits);
        let end = u32::try_from(end).unwrap_or(u32::MAX);
        self.pages.range(first..end).any(|(_, page)| page.hole)
    }

    /// Drops the pages at or past block `first`; returns how many. The blocks reserved for
    /// their holes are released: a block each, or with bigalloc a cluster for each logical
    /// cluster no cached hole page is left in.
    pub fn drop_from(&mut self, first: u32, cluster_bits: u32) -> usize {
        let gone = self.pages.split_off(&first);
        let gone_holes = gone.iter().filter(|(_, p)| p.hole).map(|(&lblk, _)| lblk);
        let holes = self.new_hole_blocks(cluster_bits, gone_holes);
        if let Some(held) = &mut self.reservation {
            drop(held.split(holes));
        }
        gone.len()
    }

    /// Drops everything (the inode is being freed, or the file system crashed); returns how
    /// many pages were dropped.
    pub fn clear(&mut self) -> usize {
        let pages = self.pages.len();
        *self = FileCache::default();
        pages
    }
}

/// The inodes with dirty pages, and the bytes those pages hold. The map holds each dirty
/// inode's slot, which keeps the inode cache from evicting it (and its pages) until it is
/// written back. Its lock is a leaf: nothing is locked while it is held.
#[derive(Default)]
pub(crate) struct DirtyInodes {
    inodes: Mutex<DirtySet>,
    bytes: AtomicU64,
    /// Held by the one writer writing back for everybody over `dirty_bytes_max`
    /// (`Filesystem::balance_dirty`); the others wait on it, as the kernel's
    /// balance_dirty_pages throttles writers while the flusher catches up.
    pub balancing: Mutex<()>,
}

/// Dirty inodes by number, and in the order they became dirty (so the oldest are found
/// without sorting: tokubench keeps tens of thousands dirty, and sorted them on every write).
#[derive(Default)]
struct DirtySet {
    by_ino: HashMap<u32, Instant>,
    by_age: BTreeMap<(Instant, u32), Arc<InodeSlot>>,
}

impl DirtyInodes {
    /// Bytes held in dirty pages across the file system.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Acquire)
    }

    pub fn add_bytes(&self, bytes: u64) {
        self.bytes.fetch_add(bytes, Ordering::AcqRel);
    }

    pub fn sub_bytes(&self, bytes: u64) {
        self.bytes.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Records that `slot`'s inode has dirty pages since `since` (no-op if already recorded).
    pub fn mark(&self, slot: &Arc<InodeSlot>, since: Instant) {
        let mut set = self.inodes.lock();
        if let std::collections::hash_map::Entry::Vacant(entry) = set.by_ino.entry(slot.ino) {
            entry.insert(since);
            set.by_age.insert((since, slot.ino), slot.clone());
        }
    }

    /// Records that inode `ino` has no dirty pages any more.
    pub fn clear(&self, ino: u32) {
        let mut set = self.inodes.lock();
        if let Some(since) = set.by_ino.remove(&ino) {
            set.by_age.remove(&(since, ino));
        }
        debug_assert_eq!(set.by_ino.len(), set.by_age.len());
    }

    /// The dirty inodes, oldest first, at most `max`; with `older_than`, only those dirty since
    /// before it.
    pub fn oldest_first(&self, older_than: Option<Instant>, max: usize) -> Vec<Arc<InodeSlot>> {
        self.inodes
            .lock()
            .by_age
            .iter()
            .take_while(|((since, _), _)| older_than.is_none_or(|limit| *since < limit))
            .take(max)
            .map(|(_, slot)| slot.clone())
            .collect()
    }
}

/// Blocks to reserve for cached pages over holes at `lblks` (ascending): a block each, or with
/// bigalloc (`cluster_bits` > 0) a cluster for each logical cluster they fall in (it may be one
/// the file owns already, and then is reserved for nothing until writeback gives it back).
pub(crate) fn hole_blocks(cluster_bits: u32, lblks: impl Iterator<Item = u32>) -> i64 {
    let mut blocks = 0;
    let mut last_cluster = None;
    for lblk in lblks {
        let cluster = lblk >> cluster_bits;
        if last_cluster != Some(cluster) {
            blocks += 1i64 << cluster_bits;
            last_cluster = Some(cluster);
        }
    }
    blocks
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache_with_holes(lblks: &[u32]) -> FileCache {
        let mut cache = FileCache::default();
        for &lblk in lblks {
            cache.pages.insert(lblk, Page { data: Box::new([]), hole: true });
        }
        cache
    }

    #[test]
    fn hole_reservations_count_each_logical_cluster_once() {
        // Without clusters: a block per new hole page.
        assert_eq!(cache_with_holes(&[]).new_hole_blocks(0, [3, 4, 9].into_iter()), 3);
        // 4-block clusters: blocks 0, 1 and 3 share one, 9 is in the third.
        let empty = cache_with_holes(&[]);
        assert_eq!(empty.new_hole_blocks(2, [0, 1, 3, 9].into_iter()), 8);
        // A cached hole page in the cluster holds its reservation already.
        let cached = cache_with_holes(&[2]);
        assert_eq!(cached.new_hole_blocks(2, [0, 1, 3].into_iter()), 0);
        assert_eq!(cached.new_hole_blocks(2, [4, 9].into_iter()), 8);
    }

    #[test]
    fn dropping_pages_releases_the_clusters_no_hole_page_is_left_in() {
        let counters = Arc::new(crate::groups::Counters::default());
        let held = |blocks| Reservation::for_tests(counters.clone(), blocks);
        // Clusters 0 (pages 0, 1) and 1 (page 5): 8 blocks held.
        let mut cache = cache_with_holes(&[0, 1, 5]);
        cache.reservation = Some(held(8));
        assert_eq!(cache.drop_from(1, 2), 2);
        // Page 0 keeps cluster 0's reservation; cluster 1's goes.
        assert_eq!(cache.reservation.as_ref().map(|r| r.blocks), Some(4));
        assert_eq!(cache.drop_from(0, 2), 1);
        assert_eq!(cache.reservation.as_ref().map(|r| r.blocks), Some(0));
    }
}
