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
//! - `revoked_by`: the newest transaction that revoked this block.
//!
//! Lock order: the journal state lock may be held while taking a buffer lock, never the
//! reverse. No buffer lock is held across I/O.

use ondisk::Tid;
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::collections::HashMap;
use std::sync::Arc;

pub(crate) type BlockData = Arc<Vec<u8>>;

pub struct Buffer {
    block: u64,
    pub(crate) inner: Mutex<BufferInner>,
    /// Signalled when `shadow` or `checkpoint_writing` clears.
    pub(crate) io_done: Condvar,
}

pub(crate) struct BufferInner {
    pub data: BlockData,
    pub access: Option<Tid>,
    pub listed: Option<Tid>,
    pub versions: Vec<(Tid, BlockData)>,
    pub shadow: bool,
    pub checkpoint: Option<(Tid, BlockData)>,
    pub checkpoint_writing: bool,
    pub revoked_by: Option<Tid>,
    /// `revoked_by` before a revoke in the running transaction, restored if that revoke is
    /// cancelled by journaling the block again in the same transaction.
    pub revoked_before: Option<Tid>,
}

impl Buffer {
    pub(crate) fn new(block: u64, data: Vec<u8>) -> Self {
        Buffer {
            block,
            inner: Mutex::new(BufferInner {
                data: Arc::new(data),
                access: None,
                listed: None,
                versions: Vec::new(),
                shadow: false,
                checkpoint: None,
                checkpoint_writing: false,
                revoked_by: None,
                revoked_before: None,
            }),
            io_done: Condvar::new(),
        }
    }

    /// The file-system block this buffer caches.
    pub fn block(&self) -> u64 {
        self.block
    }

    /// Reads the current contents.
    pub fn read<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        let inner = self.inner.lock();
        f(&inner.data)
    }

    /// A copy of the current contents.
    pub fn to_vec(&self) -> Vec<u8> {
        self.read(|d| d.to_vec())
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, BufferInner> {
        self.inner.lock()
    }

    /// Modifies the contents on behalf of the running transaction `tid`, which must have been
    /// granted write access. Copies the block first if an in-flight version shares it.
    pub(crate) fn modify<R>(&self, tid: Tid, f: impl FnOnce(&mut [u8]) -> R) -> R {
        let mut inner = self.inner.lock();
        assert_eq!(
            inner.access,
            Some(tid),
            "block {} modified by {tid:?} without get_write_access",
            self.block
        );
        f(Arc::make_mut(&mut inner.data).as_mut_slice())
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
}

const CACHE_SHARDS: usize = 64;

impl BufferCache {
    pub fn new() -> Self {
        BufferCache { shards: (0..CACHE_SHARDS).map(|_| Mutex::new(HashMap::new())).collect() }
    }

    fn shard(&self, block: u64) -> &Mutex<HashMap<u64, Arc<Buffer>>> {
        &self.shards[(block as usize).wrapping_mul(0x9E37_79B9) % CACHE_SHARDS]
    }

    pub fn get(&self, block: u64) -> Option<Arc<Buffer>> {
        self.shard(block).lock().get(&block).cloned()
    }

    /// Returns the cached buffer or inserts the one `fill` builds (called without the shard
    /// lock held, so it may do I/O; a racing insert wins and `fill`'s result is dropped).
    pub fn get_or_insert_with<E>(
        &self,
        block: u64,
        fill: impl FnOnce() -> Result<Vec<u8>, E>,
    ) -> Result<Arc<Buffer>, E> {
        if let Some(b) = self.get(block) {
            return Ok(b);
        }
        let data = fill()?;
        let mut shard = self.shard(block).lock();
        Ok(shard.entry(block).or_insert_with(|| Arc::new(Buffer::new(block, data))).clone())
    }

    /// Drops buffers nobody else references and the journal no longer needs. Returns how many.
    pub fn evict_clean(&self) -> usize {
        let mut evicted = 0;
        for shard in &self.shards {
            shard.lock().retain(|_, buffer| {
                if Arc::strong_count(buffer) > 1 {
                    return true;
                }
                let inner = buffer.inner.lock();
                let busy = inner.listed.is_some()
                    || !inner.versions.is_empty()
                    || inner.checkpoint.is_some()
                    || inner.revoked_by.is_some();
                if !busy {
                    evicted += 1;
                }
                busy
            });
        }
        evicted
    }
}
