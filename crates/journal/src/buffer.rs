//! Buffers: cached metadata blocks and the journal's bookkeeping about them.
//!
//! A buffer's contents are an `Arc<Vec<u8>>`. Freezing a version for a committing transaction
//! is an `Arc` clone; a later modification goes through `Arc::make_mut`, which copies the block
//! only while some in-flight transaction still holds the old version. That is shadow paging with
//! a copy exactly when one is needed, for any number of versions (CJFS MVSP, or JBD2's single
//! frozen copy when `versions_max == 1`).
//!
//! Per buffer (all under the buffer's own mutex):
//! - `access`: the running transaction whose handles may modify it (set by get_write_access);
//! - `listed`: the running transaction whose buffer list holds it (set by dirty_metadata);
//! - `versions`: frozen contents held by in-flight transactions (Committing..Written), oldest
//!   first; they leave when their transaction becomes durable;
//! - `shadow`: a log write of a frozen version is in progress (JBD2's BJ_Shadow; with one
//!   version allowed, a writer waits it out as JBD2 does);
//! - `checkpoint`: the newest durable version not yet written to its home location;
//! - `checkpoint_writing`: a checkpoint is writing that version home right now;
//! - `revoked_durable`: the newest transaction whose revoke of this block is durable (set by
//!   the flush stage once the commit block is durable, never by a revoke still in flight).
//!
//! Lock order (see journal.rs): `j_state_lock` may be held while taking a buffer lock, never
//! the reverse; a buffer lock may be held while taking `j_list_lock` (filing the buffer on a
//! list, as JBD2 does) or a cache shard lock (`evict_clean` only tries buffer locks under a
//! shard lock). No buffer lock is held across I/O.

use crate::locks::{LockCounters, LockId, TimedMutex};
use ondisk::Tid;
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

pub(crate) type BlockData = Arc<Vec<u8>>;

pub struct Buffer {
    /// [immutable]
    block: u64,
    /// The buffer's state lock (JBD2's `b_state_lock`).
    inner: TimedMutex<BufferInner>,
    /// Signalled when `shadow` or `checkpoint_writing` clears.
    pub(crate) io_done: Condvar,
    /// [immutable] Where waits for `inner` are counted (the journal's lock statistics).
    locks: Arc<LockCounters>,
}

pub(crate) struct BufferInner {
    pub data: BlockData,
    pub access: Option<Tid>,
    pub listed: Option<Tid>,
    pub versions: Vec<(Tid, BlockData)>,
    pub shadow: bool,
    pub checkpoint: Option<(Tid, BlockData)>,
    pub checkpoint_writing: bool,
    pub revoked_durable: Option<Tid>,
}

impl Buffer {
    pub(crate) fn new(block: u64, data: Vec<u8>, locks: Arc<LockCounters>) -> Self {
        Buffer {
            block,
            locks,
            inner: TimedMutex::new(
                LockId::Buffer,
                BufferInner {
                    data: Arc::new(data),
                    access: None,
                    listed: None,
                    versions: Vec::new(),
                    shadow: false,
                    checkpoint: None,
                    checkpoint_writing: false,
                    revoked_durable: None,
                },
            ),
            io_done: Condvar::new(),
        }
    }

    /// The file-system block this buffer caches.
    pub fn block(&self) -> u64 {
        self.block
    }

    /// Reads the current contents.
    pub fn read<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        let inner = self.lock();
        f(&inner.data)
    }

    /// A copy of the current contents.
    pub fn to_vec(&self) -> Vec<u8> {
        self.read(|d| d.to_vec())
    }

    /// Fills a buffer that holds only zeros and that no transaction has touched with contents
    /// computed in memory (a lazily initialized bitmap the file system builds instead of
    /// reading). Returns whether it did; a buffer already in use keeps its contents.
    pub fn init_if_zero(&self, image: &[u8]) -> bool {
        let mut inner = self.lock();
        let untouched = inner.access.is_none()
            && inner.listed.is_none()
            && inner.versions.is_empty()
            && inner.checkpoint.is_none()
            && inner.data.len() == image.len()
            && inner.data.iter().all(|&b| b == 0);
        if untouched {
            Arc::make_mut(&mut inner.data).copy_from_slice(image);
        }
        untouched
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, BufferInner> {
        self.inner.lock(&self.locks)
    }

    /// Modifies the contents on behalf of the running transaction `tid`, which must have been
    /// granted write access. Copies the block first if an in-flight version shares it.
    pub(crate) fn modify<R>(&self, tid: Tid, f: impl FnOnce(&mut [u8]) -> R) -> R {
        let mut inner = self.lock();
        assert_eq!(
            inner.access,
            Some(tid),
            "block {} modified by {tid:?} without get_write_access",
            self.block
        );
        f(Arc::make_mut(&mut inner.data).as_mut_slice())
    }
}

/// Clears a per-buffer I/O flag (`shadow`, `checkpoint_writing`) on every listed buffer and
/// wakes its waiters when dropped, so the flag cannot outlive the I/O even if that I/O fails
/// or panics.
pub(crate) struct IoFlagGuard<'a> {
    buffers: Vec<&'a Buffer>,
    clear: fn(&mut BufferInner),
}

impl<'a> IoFlagGuard<'a> {
    /// Sets the flag with `set` on each buffer now; `clear` undoes it on drop.
    pub fn new(
        buffers: impl IntoIterator<Item = &'a Buffer>,
        set: fn(&mut BufferInner),
        clear: fn(&mut BufferInner),
    ) -> Self {
        let buffers: Vec<&Buffer> = buffers.into_iter().collect();
        for buffer in &buffers {
            set(&mut buffer.lock());
        }
        IoFlagGuard { buffers, clear }
    }
}

impl Drop for IoFlagGuard<'_> {
    fn drop(&mut self) {
        for buffer in &self.buffers {
            (self.clear)(&mut buffer.lock());
            buffer.io_done.notify_all();
        }
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buffer({})", self.block)
    }
}

/// The buffer cache: one `Buffer` per cached block, sharded to keep lookups from contending.
/// Buffers stay cached while the journal references them; clean ones can be dropped with
/// [`BufferCache::evict_clean`].
pub(crate) struct BufferCache {
    shards: Vec<Mutex<HashMap<u64, Arc<Buffer>>>>,
    /// Buffers cached (kept in step with the shards, read without their locks).
    len: AtomicUsize,
    /// Size at which [`BufferCache::get_or_insert_with`] sweeps clean buffers out; 0 means
    /// unbounded. After a sweep that leaves most buffers busy, the next sweep waits until the
    /// cache grows by a quarter of the limit again, so a cache full of busy buffers is not
    /// swept on every insert.
    limit: AtomicUsize,
    next_sweep: AtomicUsize,
    /// Buffers evicted so far. A fill that read the device while a buffer of the same block
    /// was modified, checkpointed and evicted would insert a copy older than the disk: a fill
    /// during which this changed reads again.
    evictions: AtomicU64,
    /// Handed to every buffer for its lock statistics.
    locks: Arc<LockCounters>,
}

const CACHE_SHARDS: usize = 64;

impl BufferCache {
    pub fn new(locks: Arc<LockCounters>) -> Self {
        BufferCache {
            locks,
            shards: (0..CACHE_SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            len: AtomicUsize::new(0),
            limit: AtomicUsize::new(0),
            next_sweep: AtomicUsize::new(usize::MAX),
            evictions: AtomicU64::new(0),
        }
    }

    /// Bounds the cache to about `buffers` buffers (0: unbounded). Busy buffers (dirty, in a
    /// transaction, awaiting checkpoint, or referenced by a caller) are never dropped, so the
    /// cache can exceed the bound while that many are busy.
    pub fn set_limit(&self, buffers: usize) {
        self.limit.store(buffers, Ordering::Release);
        self.next_sweep.store(if buffers == 0 { usize::MAX } else { buffers }, Ordering::Release);
    }

    /// Buffers cached now.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    fn shard(&self, block: u64) -> &Mutex<HashMap<u64, Arc<Buffer>>> {
        &self.shards[(block as usize).wrapping_mul(0x9E37_79B9) % CACHE_SHARDS]
    }

    pub fn get(&self, block: u64) -> Option<Arc<Buffer>> {
        self.shard(block).lock().get(&block).cloned()
    }

    /// Returns the cached buffer or inserts the one `fill` builds (called without the shard
    /// lock held, so it may do I/O; a racing insert wins and `fill`'s result is dropped; an
    /// eviction during the fill makes it fill again).
    pub fn get_or_insert_with<E>(
        &self,
        block: u64,
        mut fill: impl FnMut() -> Result<Vec<u8>, E>,
    ) -> Result<Arc<Buffer>, E> {
        let buffer = loop {
            if let Some(b) = self.get(block) {
                return Ok(b);
            }
            let evictions = self.evictions.load(Ordering::Acquire);
            let data = fill()?;
            let mut shard = self.shard(block).lock();
            if let Some(b) = shard.get(&block) {
                break b.clone();
            }
            if self.evictions.load(Ordering::Acquire) != evictions {
                continue;
            }
            self.len.fetch_add(1, Ordering::AcqRel);
            let buffer = Arc::new(Buffer::new(block, data, self.locks.clone()));
            shard.insert(block, buffer.clone());
            break buffer;
        };
        if self.len() > self.next_sweep.load(Ordering::Acquire) {
            self.sweep();
        }
        Ok(buffer)
    }

    /// Drops clean buffers when the cache is over its limit (see `limit`).
    fn sweep(&self) {
        let limit = self.limit.load(Ordering::Acquire);
        if limit == 0 {
            return;
        }
        // One sweeper at a time: others go on (the cache is briefly over the bound).
        let threshold = self.next_sweep.swap(usize::MAX, Ordering::AcqRel);
        if threshold == usize::MAX {
            return;
        }
        self.evict_clean();
        let next = limit.max(self.len() + limit / 4);
        self.next_sweep.store(next, Ordering::Release);
    }

    /// Drops buffers nobody else references and the journal no longer needs. Returns how many.
    pub fn evict_clean(&self) -> usize {
        let mut evicted = 0;
        for shard in &self.shards {
            shard.lock().retain(|_, buffer| {
                if Arc::strong_count(buffer) > 1 {
                    return true;
                }
                // The lock order puts buffers before shards, so only try: a buffer somebody
                // holds is busy anyway.
                let Some(inner) = buffer.inner.try_lock() else { return true };
                let busy = inner.listed.is_some()
                    || !inner.versions.is_empty()
                    || inner.checkpoint.is_some()
                    || inner.checkpoint_writing;
                if !busy {
                    // Counted before the entry goes, under its shard's lock (see `evictions`).
                    self.evictions.fetch_add(1, Ordering::AcqRel);
                    evicted += 1;
                }
                busy
            });
        }
        self.len.fetch_sub(evicted, Ordering::AcqRel);
        evicted
    }
}
