//! In-memory inodes: a bounded cache of inode records, each behind its own lock.
//!
//! An [`InodeSlot`]'s mutex is *the* inode lock: an operation that reads or changes an inode
//! holds it for the whole operation (see the lock order in `filesystem.rs`). The record is
//! loaded from the inode table the first time it is locked and kept as both the decoded
//! [`Inode`] and the raw bytes, so fields quill does not model (in-inode extended attributes
//! among them) survive a write unchanged.
//!
//! Invariants:
//! - The raw record in memory is what the last handle that changed this inode wrote into the
//!   inode table buffer (with its checksum), so a later write never resurrects older bytes.
//! - A slot is evicted only when nothing but the cache refers to it and it is not open, so a
//!   locked or open inode's in-memory state is never lost.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use ondisk::ext4::{self, Inode};
use ondisk::Tid;
use parking_lot::{Mutex, MutexGuard};

use crate::error::Result;
use crate::page_cache::FileCache;

/// One inode's in-memory state (valid while its slot is locked).
#[derive(Debug)]
pub(crate) struct InodeData {
    pub inode: Inode,
    /// The whole on-disk record (`s_inode_size` bytes).
    pub raw: Vec<u8>,
    /// The newest transaction that changed anything about this inode (what fsync waits for).
    pub last_tid: Option<Tid>,
    /// The newest transaction fdatasync must wait for: changes to size and block mappings, not
    /// timestamps alone.
    pub last_data_tid: Option<Tid>,
    /// The inode is on the orphan list (its i_dtime is the list's next pointer).
    pub orphan: bool,
    /// Written data not yet written back (`page_cache.rs`); `inode.size` is the on-disk size.
    pub cache: FileCache,
    /// Truncated to zero: write back at the last close (ext4's auto_da_alloc
    /// `DA_ALLOC_CLOSE`), so truncate-and-rewrite without fsync does not come back empty
    /// after a crash.
    pub flush_on_close: bool,
    /// What a fast commit of this inode's changes would hold (`fsync_journal.rs`).
    pub fc: crate::fsync_journal::FcTrack,
    /// What the quota files charge this inode for, as last written (`quota.rs`; zero without
    /// quotas).
    pub quota: crate::quota::Charge,
}

impl InodeData {
    pub fn new(inode: Inode, raw: Vec<u8>, orphan: bool) -> InodeData {
        InodeData {
            inode,
            raw,
            last_tid: None,
            last_data_tid: None,
            orphan,
            cache: FileCache::default(),
            flush_on_close: false,
            fc: Default::default(),
            quota: Default::default(),
        }
    }

    /// The inode was deleted (released, or freed by the kernel or e2fsck: no links and a
    /// deletion time). An orphan's i_dtime is the orphan list's link, not a deletion time.
    pub fn is_deleted(&self) -> bool {
        let inode = &self.inode;
        inode.links_count == 0 && (inode.mode == 0 || (inode.dtime != 0 && !self.orphan))
    }

    /// The file's size as callers see it: the on-disk size, or further when cached writes
    /// extend the file.
    pub fn size(&self) -> u64 {
        self.cache.size.unwrap_or(self.inode.size).max(self.inode.size)
    }
}

/// A cached inode and its lock.
#[derive(Debug)]
pub struct InodeSlot {
    pub(crate) ino: u32,
    pub(crate) state: Mutex<Option<InodeData>>,
    /// Open file handles; an unlinked inode is freed when the last one closes.
    pub(crate) open_count: AtomicU32,
}

pub(crate) type InodeGuard<'a> = MutexGuard<'a, Option<InodeData>>;

const SHARDS: usize = 64;

/// The inode cache: sharded maps from inode number to slot.
pub(crate) struct InodeCache {
    shards: Vec<Mutex<HashMap<u32, Arc<InodeSlot>>>>,
    /// Most slots kept per shard before unused ones are evicted.
    per_shard_max: usize,
}

impl InodeCache {
    pub fn new(slots_max: usize) -> Self {
        InodeCache {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            per_shard_max: (slots_max / SHARDS).max(16),
        }
    }

    /// The slot of inode `ino` (not yet loaded: lock it through `Filesystem::lock_inode`).
    pub fn slot(&self, ino: u32) -> Arc<InodeSlot> {
        let mut shard = self.shards[ino as usize % SHARDS].lock();
        if let Some(slot) = shard.get(&ino) {
            return slot.clone();
        }
        if shard.len() >= self.per_shard_max {
            // Evict slots only the cache refers to; a slot someone holds (locked, or about to
            // be) has a second reference and stays.
            shard.retain(|_, slot| {
                Arc::strong_count(slot) > 1 || slot.open_count.load(Ordering::Acquire) > 0
            });
        }
        let slot =
            Arc::new(InodeSlot { ino, state: Mutex::new(None), open_count: AtomicU32::new(0) });
        shard.insert(ino, slot.clone());
        slot
    }
}

/// A fresh record for a new inode: zeros, with the extra fields sized as the file system
/// wants (`s_min_extra_isize`, 32 by default, when the record has room).
pub(crate) fn new_inode_record(inode_size: u16, extra_isize: u16) -> (Inode, Vec<u8>) {
    let raw = vec![0u8; usize::from(inode_size)];
    let extra = if inode_size > 128 { extra_isize.min(inode_size - 128) & !3 } else { 0 };
    let inode = Inode { extra_isize: extra, flags: ext4::EXTENTS_FL, ..Inode::default() };
    (inode, raw)
}

/// Parses a loaded record, mapping parser errors to the table block it came from.
pub(crate) fn parse_record(block: u64, raw: &[u8]) -> Result<Inode> {
    Inode::parse(raw).map_err(crate::FsError::at_block(block))
}
