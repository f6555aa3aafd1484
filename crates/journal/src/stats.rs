//! What the engine measures about itself (DESIGN.md §3.7): per transaction the handles it
//! absorbed (coalescing degree), blocks, conflicts and the time it spent in each state; flushes
//! issued; waits of handles. Counters are relaxed atomics: they are statistics, not
//! synchronization, and a snapshot may be a few events out of step between fields.

pub use crate::locks::{LockWait, LockWaits};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

#[derive(Default)]
pub(crate) struct Counters {
    pub transactions: AtomicU64,
    pub handles: AtomicU64,
    pub blocks_logged: AtomicU64,
    pub log_blocks_written: AtomicU64,
    pub revokes: AtomicU64,
    pub conflicts: AtomicU64,
    pub coalesce_rounds: AtomicU64,
    pub flushes: AtomicU64,
    pub checkpoint_flushes: AtomicU64,
    pub fua_writes: AtomicU64,
    pub checkpoints: AtomicU64,
    pub checkpoint_blocks: AtomicU64,
    pub commit_chunks: AtomicU64,
    pub commit_chunks_owner: AtomicU64,
    pub commit_chunks_helped: AtomicU64,
    pub checkpoint_batches: AtomicU64,
    pub checkpoint_batches_owner: AtomicU64,
    pub checkpoint_batches_helped: AtomicU64,
    pub shadow_waits: AtomicU64,
    pub handle_start_waits: AtomicU64,
    pub space_waits: AtomicU64,
    pub ns_running: AtomicU64,
    pub ns_locked: AtomicU64,
    pub ns_writing: AtomicU64,
    pub ns_flushing: AtomicU64,
    pub ns_checkpoint: AtomicU64,
    pub ns_shadow_wait: AtomicU64,
    pub ns_handle_start_wait: AtomicU64,
    pub ns_device_flush: AtomicU64,
    pub ns_slot_wait: AtomicU64,
    pub ns_conflict_wait: AtomicU64,
    pub ns_flush_queue: AtomicU64,
    pub ns_commit_fua: AtomicU64,
    pub ns_ordered_wait: AtomicU64,
    pub in_flight_max: AtomicU64,
    pub fast_commits: AtomicU64,
    pub fast_commit_blocks: AtomicU64,
    pub fast_commit_syncs: AtomicU64,
    pub fast_commit_writes: AtomicU64,
    pub ns_fast_commit: AtomicU64,
    pub ns_fast_commit_wait: AtomicU64,
}

pub(crate) fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Relaxed);
}

pub(crate) fn max(counter: &AtomicU64, n: u64) {
    counter.fetch_max(n, Relaxed);
}

pub(crate) fn add_time(counter: &AtomicU64, d: Duration) {
    counter.fetch_add(d.as_nanos().min(u64::MAX as u128) as u64, Relaxed);
}

/// A snapshot of the engine's counters since the journal was opened.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct JournalStats {
    /// Transactions made durable.
    pub transactions: u64,
    /// Handles those transactions absorbed.
    pub handles: u64,
    /// Metadata blocks logged (tags), excluding descriptor, revoke and commit blocks.
    pub blocks_logged: u64,
    /// Every block written to the log, control blocks included.
    pub log_blocks_written: u64,
    pub revokes: u64,
    /// Buffers a running transaction touched while `versions_max` in-flight versions existed.
    pub conflicts: u64,
    /// Times a transaction stayed Running because of conflicts (opportunistic coalescing).
    pub coalesce_rounds: u64,
    /// Device flushes issued to make transactions durable (compound flush shares one).
    pub flushes: u64,
    /// Device flushes issued by checkpoints before the tail moves.
    pub checkpoint_flushes: u64,
    pub fua_writes: u64,
    /// Transactions checkpointed (freed from the log).
    pub checkpoints: u64,
    pub checkpoint_blocks: u64,
    /// Log-write chunks of cooperative commits (`commit_io=cooperative`), and how many of them
    /// the commit thread wrote and how many threads that would have slept wrote.
    pub commit_chunks: u64,
    pub commit_chunks_by_owner: u64,
    pub commit_chunks_by_helpers: u64,
    /// Home-write batches of cooperative checkpoints (`checkpoint_io=cooperative`), and how
    /// many the round's starter and how many joining threads wrote. `checkpoint_flushes`
    /// counts one per round with home writes.
    pub checkpoint_batches: u64,
    pub checkpoint_batches_by_owner: u64,
    pub checkpoint_batches_by_helpers: u64,
    /// Handles that waited for a frozen copy's log write (JBD2's shadow wait).
    pub shadow_waits: u64,
    /// Handle starts that waited (locked transaction, transaction full, or log space).
    pub handle_start_waits: u64,
    /// Handle starts that had to wait for log space (checkpoint).
    pub space_waits: u64,
    /// Total time transactions spent Running, Locked (waiting for handles and conflicts),
    /// writing log blocks, and waiting for their flush + commit block.
    pub ms_running: f64,
    pub ms_locked: f64,
    pub ms_writing: f64,
    pub ms_flushing: f64,
    pub ms_checkpoint: f64,
    pub ms_shadow_wait: f64,
    pub ms_handle_start_wait: f64,
    /// Time in the device flushes that precede commit blocks (the flush stage's own I/O,
    /// without its commit-block writes).
    pub ms_device_flush: f64,
    /// Transactions due to commit (requested or expired) waiting for a committing slot
    /// (`committing_max`), summed over transactions.
    pub ms_slot_wait: f64,
    /// Transactions held back by conflicts (buffers whose versions are all in flight):
    /// Running under coalescing, or Locked without it, summed over transactions.
    pub ms_conflict_wait: f64,
    /// Written transactions waiting for the flush stage to take them (the previous group's
    /// flush and commit blocks), summed over transactions.
    pub ms_flush_queue: f64,
    /// Writing commit blocks (FUA, one after the other), summed over groups.
    pub ms_commit_fua: f64,
    /// The commit stage writing ordered data or waiting for its writers (part of
    /// `ms_writing`), summed over transactions.
    pub ms_ordered_wait: f64,
    /// The most transactions ever in flight at once (Locked to Written: committing slots).
    pub in_flight_max: u64,
    /// File-level fsync transactions written as fast commits (`fsync_journal`), the area
    /// blocks they took, and the time they took from the area's lock to durable.
    pub fast_commits: u64,
    pub fast_commit_blocks: u64,
    pub ms_fast_commit: f64,
    /// The commit stage waiting, before it locks a transaction, for that transaction's fast
    /// commits being written, summed over transactions (handles still join meanwhile).
    pub ms_fast_commit_wait: f64,
    /// Device flushes and FUA writes of the fast-commit area: two per fast commit (a flush,
    /// then its first block with FUA) and one per retirement of superseded ones.
    pub fast_commit_syncs: u64,
    /// Fast commits written to the area: batches, each carrying the fast commits of one or
    /// more fsyncs (`fast_commits`).
    pub fast_commit_writes: u64,
    /// fsyncs that wanted a fast commit and committed the transaction instead, by reason (the
    /// journal's and the file system's; filled by `Journal::stats`).
    pub fast_commit_fallbacks: Vec<(String, u64)>,
    /// Waits for each of the engine's locks (filled by `Journal::stats`).
    pub locks: LockWaits,
}

impl JournalStats {
    pub fn handles_per_transaction(&self) -> f64 {
        ratio(self.handles, self.transactions)
    }
    pub fn flushes_per_transaction(&self) -> f64 {
        ratio(self.flushes, self.transactions)
    }
    pub fn blocks_per_transaction(&self) -> f64 {
        ratio(self.blocks_logged, self.transactions)
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

impl Counters {
    pub fn snapshot(&self) -> JournalStats {
        let ms = |c: &AtomicU64| c.load(Relaxed) as f64 / 1e6;
        JournalStats {
            transactions: self.transactions.load(Relaxed),
            handles: self.handles.load(Relaxed),
            blocks_logged: self.blocks_logged.load(Relaxed),
            log_blocks_written: self.log_blocks_written.load(Relaxed),
            revokes: self.revokes.load(Relaxed),
            conflicts: self.conflicts.load(Relaxed),
            coalesce_rounds: self.coalesce_rounds.load(Relaxed),
            flushes: self.flushes.load(Relaxed),
            checkpoint_flushes: self.checkpoint_flushes.load(Relaxed),
            fua_writes: self.fua_writes.load(Relaxed),
            checkpoints: self.checkpoints.load(Relaxed),
            checkpoint_blocks: self.checkpoint_blocks.load(Relaxed),
            commit_chunks: self.commit_chunks.load(Relaxed),
            commit_chunks_by_owner: self.commit_chunks_owner.load(Relaxed),
            commit_chunks_by_helpers: self.commit_chunks_helped.load(Relaxed),
            checkpoint_batches: self.checkpoint_batches.load(Relaxed),
            checkpoint_batches_by_owner: self.checkpoint_batches_owner.load(Relaxed),
            checkpoint_batches_by_helpers: self.checkpoint_batches_helped.load(Relaxed),
            shadow_waits: self.shadow_waits.load(Relaxed),
            handle_start_waits: self.handle_start_waits.load(Relaxed),
            space_waits: self.space_waits.load(Relaxed),
            ms_running: ms(&self.ns_running),
            ms_locked: ms(&self.ns_locked),
            ms_writing: ms(&self.ns_writing),
            ms_flushing: ms(&self.ns_flushing),
            ms_checkpoint: ms(&self.ns_checkpoint),
            ms_shadow_wait: ms(&self.ns_shadow_wait),
            ms_handle_start_wait: ms(&self.ns_handle_start_wait),
            ms_device_flush: ms(&self.ns_device_flush),
            ms_slot_wait: ms(&self.ns_slot_wait),
            ms_conflict_wait: ms(&self.ns_conflict_wait),
            ms_flush_queue: ms(&self.ns_flush_queue),
            ms_commit_fua: ms(&self.ns_commit_fua),
            ms_ordered_wait: ms(&self.ns_ordered_wait),
            in_flight_max: self.in_flight_max.load(Relaxed),
            fast_commits: self.fast_commits.load(Relaxed),
            fast_commit_blocks: self.fast_commit_blocks.load(Relaxed),
            ms_fast_commit: ms(&self.ns_fast_commit),
            ms_fast_commit_wait: ms(&self.ns_fast_commit_wait),
            fast_commit_syncs: self.fast_commit_syncs.load(Relaxed),
            fast_commit_writes: self.fast_commit_writes.load(Relaxed),
            fast_commit_fallbacks: Vec::new(),
            locks: LockWaits::default(),
        }
    }
}
