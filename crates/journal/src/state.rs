//! What `j_state_lock` guards: the transaction queue, the log area, tid counters, the commit
//! request and the journal's mode. Every field is private behind a type that asserts its own
//! invariants:
//! - [`TxnQueue`]: transactions ordered by tid, oldest first, with states non-increasing from
//!   front to back (Durable ... Written ... Committing ... Locked/Running, at most one of the
//!   last two, at the back); `last_durable` is the newest durable tid and every older one is
//!   durable ([`TxnQueue::mark_durable`] checks `tid == last_durable + 1`);
//! - the log: `log.used() + Σ reservations <= log.capacity()`, so every admitted transaction
//!   can be written ([`State::reserve_log`] is the only way a reservation grows);
//! - [`Mode`]: one of Open, Closing, Stopping, Aborted; Aborted is final.

use crate::error::{JournalError, Result};
use crate::log_space::LogSpace;
use crate::transaction::{Transaction, TxnEntry, TxnState};
use ondisk::Tid;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Log blocks a transaction needs beyond its handles' reservations: its commit block and the
/// rounding of its last revoke block. Counted for the running transaction in every admission
/// check; part of its exact size once frozen.
pub(crate) const TXN_LOG_OVERHEAD: u32 = 2;

/// The journal's mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Handles may start.
    Open,
    /// Shutting down (or read-only): no new handles; the stages finish what is running.
    Closing,
    /// The stage threads must exit.
    Stopping,
    /// A fatal error: nothing more is committed. Final.
    Aborted { cause: String, errno: i32 },
}

/// The state `j_state_lock` guards. See the module documentation for the invariants.
pub(crate) struct State {
    txns: TxnQueue,
    log: LogSpace,
    /// The newest tid somebody asked to commit (fsync, full transaction, shutdown).
    commit_request: Option<Tid>,
    mode: Mode,
}

impl State {
    pub fn new(next_tid: Tid, log: LogSpace, read_only: bool) -> Self {
        State {
            txns: TxnQueue::new(next_tid),
            log,
            commit_request: None,
            mode: if read_only { Mode::Closing } else { Mode::Open },
        }
    }

    pub fn txns(&self) -> &TxnQueue {
        &self.txns
    }

    pub fn txns_mut(&mut self) -> &mut TxnQueue {
        &mut self.txns
    }

    pub fn log(&self) -> &LogSpace {
        &self.log
    }

    /// The sticky error, if aborted.
    pub fn aborted(&self) -> Result<()> {
        match &self.mode {
            Mode::Aborted { cause, errno } => {
                Err(JournalError::Aborted { cause: cause.clone(), errno: *errno })
            }
            _ => Ok(()),
        }
    }

    /// Whether background stages must exit (stopping or aborted).
    pub fn stopping(&self) -> bool {
        matches!(self.mode, Mode::Stopping | Mode::Aborted { .. })
    }

    /// Whether a handle may start: Err once aborted or shutting down.
    pub fn check_admission(&self) -> Result<()> {
        self.aborted()?;
        match self.mode {
            Mode::Open => Ok(()),
            _ => Err(JournalError::ShutDown),
        }
    }

    /// Records the first fatal error; returns whether this call was the first.
    pub fn set_aborted(&mut self, cause: String, errno: i32) -> bool {
        if matches!(self.mode, Mode::Aborted { .. }) {
            return false;
        }
        self.mode = Mode::Aborted { cause, errno };
        true
    }

    /// Open → Closing (shutdown). An aborted journal stays aborted.
    pub fn set_closing(&mut self) {
        if self.mode == Mode::Open {
            self.mode = Mode::Closing;
        }
    }

    /// → Stopping. An aborted journal stays aborted.
    pub fn set_stopping(&mut self) {
        if !matches!(self.mode, Mode::Aborted { .. }) {
            self.mode = Mode::Stopping;
        }
    }

    pub fn commit_request(&self) -> Option<Tid> {
        self.commit_request
    }

    /// Raises the commit request to `tid` (never lowers it).
    pub fn request_commit(&mut self, tid: Tid) {
        assert!(self.txns.next_tid().is_after(tid), "commit requested for unborn {tid:?}");
        if self.commit_request.is_none_or(|r| tid.is_after(r)) {
            self.commit_request = Some(tid);
        }
    }

    /// Log blocks the running transaction may still reserve: the capacity less what is used,
    /// what every other transaction holds, and the running transaction's own fixed overhead
    /// ([`TXN_LOG_OVERHEAD`]: its commit block and revoke rounding). Only the running
    /// transaction's reservation changes under the read lock, so this bound is stable while
    /// the read lock is held.
    fn log_room_for_running(&self, running: Tid) -> u32 {
        let others: u64 = self
            .txns
            .iter()
            .filter(|e| e.tid() != running)
            .map(|e| e.txn.log_reserved.load(Ordering::Acquire) as u64)
            .sum();
        let taken = self.log.used() as u64 + others + TXN_LOG_OVERHEAD as u64;
        (self.log.capacity() as u64).saturating_sub(taken) as u32
    }

    /// Adds `blocks` to the running transaction's log reservation if the log can hold them
    /// (CAS: concurrent handles under the read lock never over-commit the log).
    pub fn reserve_log(&self, txn: &Transaction, blocks: u32) -> bool {
        debug_assert!(self.txns.running().is_some_and(|e| e.tid() == txn.tid));
        let room = self.log_room_for_running(txn.tid);
        txn.log_reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                let total = held.checked_add(blocks)?;
                (total <= room).then_some(total)
            })
            .is_ok()
    }

    /// Sets a transaction's reservation to `blocks` (its exact size at freeze; never more than
    /// it held).
    pub fn shrink_reservation(&mut self, tid: Tid, blocks: u32) {
        let entry = self.txns.get(tid).expect("the transaction exists");
        let held = entry.txn.log_reserved.swap(blocks, Ordering::AcqRel);
        assert!(
            blocks <= held + TXN_LOG_OVERHEAD,
            "{tid:?}: exact size {blocks} beyond its reservation {held} + {TXN_LOG_OVERHEAD}"
        );
    }

    /// Turns `tid`'s reservation into allocated log blocks; returns the first.
    pub fn allocate_log(&mut self, tid: Tid, blocks: u32) -> u32 {
        let entry = self.txns.get_mut(tid).expect("the transaction exists");
        let held = entry.txn.log_reserved.swap(0, Ordering::AcqRel);
        assert_eq!(held, blocks, "{tid:?}: allocating {blocks} log blocks, reserved {held}");
        let start = self.log.allocate(blocks);
        entry.log_start = Some(start);
        entry.log_blocks = blocks;
        self.assert_log_within_capacity();
        start
    }

    /// Drops the first `n` transactions (all Durable and checkpointed) and frees their log.
    pub fn retire(&mut self, n: usize) -> usize {
        let freed = self.txns.retire_front(n);
        self.log.release(freed);
        n
    }

    fn assert_log_within_capacity(&self) {
        // A running transaction no handle joined needs nothing yet; the first handle's
        // admission counts its overhead.
        let running_overhead = self
            .txns
            .running()
            .filter(|e| e.txn.handles() > 0)
            .map_or(0, |_| TXN_LOG_OVERHEAD as u64);
        let reserved: u64 = running_overhead
            + self
                .txns
                .iter()
                .map(|e| e.txn.log_reserved.load(Ordering::Acquire) as u64)
                .sum::<u64>();
        assert!(
            self.log.used() as u64 + reserved <= self.log.capacity() as u64,
            "log over-committed: {} used + {reserved} reserved > {}",
            self.log.used(),
            self.log.capacity()
        );
    }

    /// The superblock tail once the first `done` transactions are gone: the next
    /// transaction's first block (or the head, where the next one will be allocated).
    pub fn tail_after(&self, done: usize) -> (Tid, u32) {
        match self.txns.nth(done) {
            Some(next) => (next.tid(), next.log_start.unwrap_or(self.log.head())),
            None => (self.txns.next_tid(), self.log.head()),
        }
    }
}

/// Transactions in tid order (see the module documentation).
pub(crate) struct TxnQueue {
    txns: VecDeque<TxnEntry>,
    next_tid: Tid,
    last_durable: Tid,
}

impl TxnQueue {
    fn new(next_tid: Tid) -> Self {
        TxnQueue { txns: VecDeque::new(), next_tid, last_durable: next_tid.prev() }
    }

    pub fn next_tid(&self) -> Tid {
        self.next_tid
    }

    pub fn last_durable(&self) -> Tid {
        self.last_durable
    }

    pub fn iter(&self) -> impl Iterator<Item = &TxnEntry> {
        self.txns.iter()
    }

    pub fn front(&self) -> Option<&TxnEntry> {
        self.txns.front()
    }

    pub fn back(&self) -> Option<&TxnEntry> {
        self.txns.back()
    }

    pub fn nth(&self, n: usize) -> Option<&TxnEntry> {
        self.txns.get(n)
    }

    pub fn get(&self, tid: Tid) -> Option<&TxnEntry> {
        let front = self.txns.front()?;
        if !tid.is_at_or_after(front.tid()) {
            return None;
        }
        let entry = self.txns.get(tid.distance_from(front.tid()) as usize)?;
        debug_assert_eq!(entry.tid(), tid);
        Some(entry)
    }

    pub fn get_mut(&mut self, tid: Tid) -> Option<&mut TxnEntry> {
        let front = self.txns.front()?.tid();
        if !tid.is_at_or_after(front) {
            return None;
        }
        self.txns.get_mut(tid.distance_from(front) as usize)
    }

    /// The transaction handles join or wait for: Running or Locked, at the back.
    pub fn running(&self) -> Option<&TxnEntry> {
        self.txns.back().filter(|e| matches!(e.state(), TxnState::Running | TxnState::Locked))
    }

    /// Starts a new running transaction with the next tid.
    pub fn open(&mut self, lock_free_lists: bool) -> &TxnEntry {
        assert!(self.running().is_none(), "a second running transaction");
        let tid = self.next_tid;
        if let Some(back) = self.txns.back() {
            assert_eq!(back.tid().next(), tid, "tids skip");
        }
        self.next_tid = tid.next();
        self.txns.push_back(TxnEntry::new(Arc::new(Transaction::new(tid, lock_free_lists))));
        self.txns.back().expect("just pushed")
    }

    /// Drops the running transaction if no handle ever joined it (shutdown).
    pub fn drop_unused_running(&mut self) {
        let unused = self
            .txns
            .back()
            .is_some_and(|e| e.state() == TxnState::Running && e.txn.handles() == 0);
        if unused {
            self.txns.pop_back();
        }
    }

    /// Transactions between Locked and Written (they hold a committing slot).
    pub fn in_flight(&self) -> usize {
        self.txns
            .iter()
            .filter(|e| {
                matches!(e.state(), TxnState::Locked | TxnState::Committing | TxnState::Written)
            })
            .count()
    }

    /// `tid` (Written) becomes Durable: it must be the oldest one that is not.
    pub fn mark_durable(&mut self, tid: Tid) {
        assert_eq!(tid, self.last_durable.next(), "{tid:?} durable out of order");
        self.get_mut(tid).expect("a written transaction exists").transition(TxnState::Durable);
        self.last_durable = tid;
    }

    /// Removes the first `n` transactions, which must all be Durable; returns their log
    /// blocks.
    fn retire_front(&mut self, n: usize) -> u32 {
        assert!(n <= self.txns.len());
        let mut freed = 0;
        for entry in self.txns.drain(..n) {
            assert_eq!(entry.state(), TxnState::Durable, "{:?} retired early", entry.tid());
            freed += entry.log_blocks;
        }
        freed
    }

    /// Whether every transaction is durable (shutdown waits for this).
    pub fn all_durable(&self) -> bool {
        self.txns.iter().all(|e| e.state() == TxnState::Durable)
    }
}
