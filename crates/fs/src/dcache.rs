//! The dentry cache: what a name in a directory refers to, found without the directory's lock.
//!
//! A lookup used to lock the directory's inode and search its blocks, so every thread opening a
//! file in one shared directory queued on one mutex (varmail-shared at 32 threads: a third of
//! all context switches). The kernel's dcache answers such lookups without touching the
//! directory; this is quill's: `(directory, name) → entry or no entry`, sharded by a hash of
//! both, each shard behind a reader-writer lock.
//!
//! Coherence: every change to a directory's entries happens under the directory's inode lock
//! and goes through `Filesystem::dir_add`, `dir_remove` or `dir_replace`, which
//! [`DentryCache::forget`] the name *before* changing the block and [`DentryCache::insert`] the
//! new answer only after the change succeeded, still under the lock. A lookup that misses
//! takes the directory's lock, searches the blocks and inserts what it found under that lock.
//! So at any moment a cached answer is what the directory's blocks (the journal's buffers) say,
//! or the answer from just before a change that is still holding the lock, which is the
//! change's linearization point seen from outside. A change that fails half-way leaves the
//! name forgotten, so the next lookup reads the blocks again.
//!
//! | event (directory lock held) | cache |
//! |---|---|
//! | lookup missed and searched the blocks | insert what was found (an entry or none) |
//! | add `name` | forget, change, then insert the entry |
//! | remove `name` | forget, change, then insert "none" |
//! | replace `name` (rename over) | forget, change, then insert the new entry |
//! | a change fails | the name stays forgotten |
//!
//! A directory is removed only when empty, so all that can remain cached under its number is
//! "none" answers, which stay true if the number is reused for a new (empty) directory.
//! `.` and `..` are not cached (`..` changes with a rename of the directory itself).
//!
//! Bounded: each shard holds at most `max / SHARDS` names; a full shard drops half of them.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

/// Shards: enough that 32 threads rarely meet on one lock; a power of two.
const SHARDS: usize = 64;

/// What a name in a directory refers to: `Some((inode, file type))`, or `None` for no entry.
pub(crate) type Dentry = Option<(u32, u8)>;

/// One cached name.
struct Slot {
    dir: u32,
    name: Box<[u8]>,
    entry: Dentry,
}

/// Names whose (directory, name) hashes collide share a bucket: almost always one slot.
type Shard = HashMap<u64, Vec<Slot>>;

pub(crate) struct DentryCache {
    shards: Vec<RwLock<Shard>>,
    hasher: RandomState,
    /// Most names per shard (0: the cache is off).
    per_shard_max: usize,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl DentryCache {
    /// A cache of at most `max` names (0 turns it off).
    pub fn new(max: usize) -> Self {
        DentryCache {
            shards: (0..SHARDS).map(|_| RwLock::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
            per_shard_max: max.div_ceil(SHARDS),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    fn hash(&self, dir: u32, name: &[u8]) -> u64 {
        self.hasher.hash_one((dir, name))
    }

    fn shard(&self, hash: u64) -> &RwLock<Shard> {
        &self.shards[(hash as usize) & (SHARDS - 1)]
    }

    fn cacheable(&self, name: &[u8]) -> bool {
        self.per_shard_max > 0 && name != b"." && name != b".."
    }

    /// The cached answer for `name` in `dir`: `None` if nothing is cached, `Some(entry)` if
    /// the cache knows (an entry or no entry). Takes no directory lock.
    pub fn get(&self, dir: u32, name: &[u8]) -> Option<Dentry> {
        if !self.cacheable(name) {
            return None;
        }
        let hash = self.hash(dir, name);
        let shard = self.shard(hash).read();
        let found = shard
            .get(&hash)
            .and_then(|bucket| bucket.iter().find(|s| s.dir == dir && *s.name == *name))
            .map(|s| s.entry);
        drop(shard);
        let counter = if found.is_some() { &self.hits } else { &self.misses };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// Records that `name` in `dir` is `entry`. The caller holds `dir`'s inode lock and got
    /// `entry` from the directory's blocks (or just changed them to say it).
    pub fn insert(&self, dir: u32, name: &[u8], entry: Dentry) {
        if !self.cacheable(name) {
            return;
        }
        let hash = self.hash(dir, name);
        let mut shard = self.shard(hash).write();
        if let Some(slot) = shard
            .get_mut(&hash)
            .and_then(|bucket| bucket.iter_mut().find(|s| s.dir == dir && *s.name == *name))
        {
            slot.entry = entry;
            return;
        }
        if shard.len() >= self.per_shard_max {
            // Full: keep every other bucket. Crude, but bounded and O(1) amortized, and what
            // goes is only a cached answer the blocks still hold.
            let mut keep = false;
            shard.retain(|_, _| {
                keep = !keep;
                keep
            });
        }
        shard.entry(hash).or_default().push(Slot { dir, name: name.into(), entry });
    }

    /// Forgets `name` in `dir` (the caller holds `dir`'s inode lock and is about to change
    /// that name's entry).
    pub fn forget(&self, dir: u32, name: &[u8]) {
        if !self.cacheable(name) {
            return;
        }
        let hash = self.hash(dir, name);
        let mut shard = self.shard(hash).write();
        if let Some(bucket) = shard.get_mut(&hash) {
            bucket.retain(|s| !(s.dir == dir && *s.name == *name));
            if bucket.is_empty() {
                shard.remove(&hash);
            }
        }
    }

    /// Lookups answered from the cache and lookups that had to search, since the mount.
    pub fn hits_and_misses(&self) -> (u64, u64) {
        (self.hits.load(Ordering::Relaxed), self.misses.load(Ordering::Relaxed))
    }

    /// Names cached now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().values().map(Vec::len).sum::<usize>()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_answer_is_returned_until_forgotten() {
        let cache = DentryCache::new(1000);
        assert_eq!(cache.get(2, b"a"), None);
        cache.insert(2, b"a", Some((12, 1)));
        cache.insert(2, b"b", None);
        assert_eq!(cache.get(2, b"a"), Some(Some((12, 1))));
        assert_eq!(cache.get(2, b"b"), Some(None));
        assert_eq!(cache.get(3, b"a"), None, "another directory's name is another entry");
        cache.forget(2, b"a");
        assert_eq!(cache.get(2, b"a"), None);
        cache.insert(2, b"b", Some((13, 2)));
        assert_eq!(cache.get(2, b"b"), Some(Some((13, 2))));
        assert_eq!(cache.hits_and_misses(), (3, 3));
    }

    #[test]
    fn dot_and_dotdot_and_a_zero_sized_cache_cache_nothing() {
        let cache = DentryCache::new(1000);
        cache.insert(2, b".", Some((2, 2)));
        cache.insert(2, b"..", Some((2, 2)));
        assert_eq!((cache.get(2, b"."), cache.get(2, b"..")), (None, None));
        let off = DentryCache::new(0);
        off.insert(2, b"a", Some((12, 1)));
        assert_eq!(off.get(2, b"a"), None);
    }

    #[test]
    fn a_full_cache_stays_within_its_bound() {
        let max = 10 * SHARDS;
        let cache = DentryCache::new(max);
        for i in 0..100_000u32 {
            cache.insert(i % 7, format!("name{i}").as_bytes(), Some((i, 1)));
        }
        assert!(cache.len() <= max, "{} names cached, bound {max}", cache.len());
        // The newest name is always there: a full shard makes room before inserting.
        assert_eq!(cache.get(99_999 % 7, b"name99999"), Some(Some((99_999, 1))));
    }
}
