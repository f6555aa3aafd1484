//! Compound transactions and their life cycle (DESIGN.md §3.2).
//!
//! `Running → Locked → Committing → Written → Durable → (checkpointed, dropped)`
//!
//! | state | meaning | who moves it on |
//! |---|---|---|
//! | Running | handles join it and modify its buffers | commit stage, when asked to commit |
//! | Locked | no new handles; waits for open handles (and, without coalescing, for conflicts) | commit stage, when `updates == 0` |
//! | Committing | versions frozen; ordered data, then log blocks being written | commit stage |
//! | Written | log blocks complete, commit block not yet durable | flush stage |
//! | Durable | a flush covered its log blocks and its commit block is durable: fsync returns | checkpoint |
//!
//! A transaction is split by what guards it, as JBD2's `transaction_t` is:
//! - [`Transaction`] (shared by its handles through an `Arc`): what handles change without
//!   `j_state_lock`: the counters (atomics, JBD2's `t_updates`, `t_outstanding_credits`,
//!   `t_handle_count`), the buffer, ordered-data and conflict lists (`j_list_lock`, or
//!   lock-free with `lists = lockfree`) and the revoke table (`j_revoke_lock`);
//! - [`TxnEntry`] (in the journal state's queue): what only `j_state_lock` guards: the state,
//!   log placement, and what the commit froze.

use crate::buffer::Buffer;
use crate::lockfree_list::LfList;
use crate::locks::{LockCounters, LockId, TimedMutex};
use crate::ordered::OrderedData;
use ondisk::Tid;
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnState {
    Running,
    Locked,
    Committing,
    Written,
    Durable,
}

/// `j_list_lock`: one lock for the lists of every transaction of a journal (JBD2 has one
/// spinlock per journal for them). The per-list mutexes of [`TxnList::Locked`] are taken only
/// under it, so they are never contended; they exist so the lists are safe Rust.
pub(crate) struct ListLock {
    lock: TimedMutex<()>,
    counters: Arc<LockCounters>,
}

impl ListLock {
    pub fn new(counters: Arc<LockCounters>) -> Self {
        ListLock { lock: TimedMutex::new(LockId::List, ()), counters }
    }

    fn hold(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.lock.lock(&self.counters)
    }
}

/// One of a transaction's lists: under `j_list_lock` (JBD2, `lists = locked`) or lock-free
/// (FAST'18 S1, `lists = lockfree`: insert with a CAS, removal marked and unlinked when the
/// transaction is dropped).
pub(crate) enum TxnList<T> {
    /// [j_list_lock]
    Locked(Mutex<Vec<T>>),
    /// [lock-free]
    LockFree(LfList<T>),
}

impl<T: Clone + Send + Sync> TxnList<T> {
    pub fn new(lock_free: bool) -> Self {
        if lock_free {
            TxnList::LockFree(LfList::new())
        } else {
            TxnList::Locked(Mutex::new(Vec::new()))
        }
    }

    pub fn push(&self, lists: &ListLock, value: T) {
        match self {
            TxnList::Locked(list) => {
                let _j_list_lock = lists.hold();
                list.lock().push(value);
            }
            TxnList::LockFree(list) => {
                list.push(value);
            }
        }
    }

    /// Removes the first element `matches` accepts (JBD2's forget); whether one was removed.
    pub fn remove_first(&self, lists: &ListLock, matches: impl Fn(&T) -> bool) -> bool {
        match self {
            TxnList::Locked(list) => {
                let _j_list_lock = lists.hold();
                let mut list = list.lock();
                match list.iter().position(matches) {
                    Some(at) => {
                        list.swap_remove(at);
                        true
                    }
                    None => false,
                }
            }
            TxnList::LockFree(list) => list.remove_first(matches),
        }
    }

    /// A copy of the live elements (the caller then takes buffer locks without `j_list_lock`,
    /// which JBD2's order puts inside the buffer lock).
    pub fn snapshot(&self, lists: &ListLock) -> Vec<T> {
        match self {
            TxnList::Locked(list) => {
                let _j_list_lock = lists.hold();
                list.lock().clone()
            }
            TxnList::LockFree(list) => list.iter().cloned().collect(),
        }
    }

    /// Moves every element out (the commit, once no handle can add any).
    pub fn take(&self, lists: &ListLock) -> Vec<T> {
        match self {
            TxnList::Locked(list) => {
                let _j_list_lock = lists.hold();
                std::mem::take(&mut *list.lock())
            }
            TxnList::LockFree(list) => list.take_live(),
        }
    }
}

/// What a transaction's handles share (see the module documentation for the guards).
pub(crate) struct Transaction {
    /// [immutable]
    pub tid: Tid,
    /// [immutable]
    pub started_at: Instant,
    /// [atomic] Handles started and not yet stopped (`t_updates`). Raised only under
    /// `j_state_lock` (read) while the transaction is Running, so once the commit stage has
    /// locked it (under the write lock) it only falls.
    pub updates: AtomicU32,
    /// [atomic] Credits reserved by open handles plus those used by stopped ones
    /// (`t_outstanding_credits`); never above the journal's per-transaction maximum once a
    /// handle holds them.
    pub credits: AtomicU32,
    /// [atomic] Handles that joined (`t_handle_count`): the coalescing degree.
    pub handles: AtomicU32,
    /// [atomic; raised under `j_state_lock` read, set under write] Log blocks reserved while
    /// Running/Locked: at least the worst case of its credits (see `State::reserve_log`).
    pub log_reserved: AtomicU32,
    /// [j_list_lock | lock-free] Buffers filed by `dirty_metadata` (`t_buffers`).
    pub buffers: TxnList<Arc<Buffer>>,
    /// [j_list_lock | lock-free] Data to write before the commit block (`t_inode_list`).
    pub ordered: TxnList<Arc<dyn OrderedData>>,
    /// [j_list_lock | lock-free] Buffers that had `versions_max` in-flight versions when a
    /// handle of this transaction took them: it cannot freeze its own version of them until an
    /// older one becomes durable.
    pub conflicts: TxnList<Arc<Buffer>>,
    /// [j_revoke_lock] Blocks revoked by this transaction.
    pub revokes: TimedMutex<HashSet<u64>>,
    /// [atomic] Fast commits of this transaction being written (the kernel's
    /// `JBD2_FAST_COMMIT_ONGOING`, per transaction). Raised only under `j_state_lock` (read)
    /// while the transaction is Running and no commit of it is requested, so once the commit
    /// stage has requested its own (under the write lock) it only falls.
    pub fc_writers: AtomicU32,
    /// [its own lock, a leaf] Without a log only: blocks whose home write must come before
    /// or after the transaction's other blocks ([`HomeOrder`]).
    pub home_order: Mutex<HashMap<u64, HomeOrder>>,
}

/// Without a log ([`crate::Journal::without_log`]) a commit writes its blocks home, where a
/// crash can leave any subset of them. The file system names the blocks whose order matters so
/// that every such subset is one e2fsck repairs without losing what earlier commits made
/// durable: a commit writes its `Early` blocks, flushes, writes the unmarked ones, flushes,
/// then writes its `Late` ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HomeOrder {
    /// New blocks nothing on the device points to yet (a directory block an htree split fills,
    /// a new extent leaf): written before the blocks that will point to them.
    Early,
    /// Blocks that lose what another block of the transaction gains (the directory block an
    /// entry moves out of): written after it, so a crash leaves the entry twice (e2fsck keeps
    /// one) rather than nowhere.
    Late,
}

impl Transaction {
    pub fn new(tid: Tid, lock_free_lists: bool) -> Self {
        Transaction {
            tid,
            started_at: Instant::now(),
            updates: AtomicU32::new(0),
            fc_writers: AtomicU32::new(0),
            credits: AtomicU32::new(0),
            handles: AtomicU32::new(0),
            log_reserved: AtomicU32::new(0),
            buffers: TxnList::new(lock_free_lists),
            ordered: TxnList::new(lock_free_lists),
            conflicts: TxnList::new(lock_free_lists),
            revokes: TimedMutex::new(LockId::Revoke, HashSet::new()),
            home_order: Mutex::new(HashMap::new()),
        }
    }

    pub fn handles(&self) -> u32 {
        self.handles.load(Ordering::Acquire)
    }

    pub fn updates(&self) -> u32 {
        self.updates.load(Ordering::Acquire)
    }

    /// Conflicting buffers that still have `versions_max` in-flight versions.
    pub fn conflicts_pending(&self, lists: &ListLock, versions_max: usize) -> bool {
        self.conflicts.snapshot(lists).iter().any(|b| b.lock().versions.len() >= versions_max)
    }
}

/// A transaction as the journal state's queue holds it. All fields: [j_state_lock].
pub(crate) struct TxnEntry {
    pub txn: Arc<Transaction>,
    state: TxnState,
    /// First log block and block count, once allocated.
    pub log_start: Option<u32>,
    pub log_blocks: u32,
    /// The buffers the commit froze (the transaction's checkpoint list once Durable) and its
    /// revoked blocks, sorted.
    pub frozen: Arc<Frozen>,
    /// Compat-CHECKSUM (v1) crc of the descriptor and data blocks, for the commit block.
    pub v1_crc: Option<u32>,
    pub locked_at: Option<Instant>,
    pub written_at: Option<Instant>,
}

/// What a commit froze of a transaction: fixed from Committing on.
#[derive(Default)]
pub(crate) struct Frozen {
    pub buffers: Vec<Arc<Buffer>>,
    pub revokes: Vec<u64>,
}

impl TxnEntry {
    pub fn new(txn: Arc<Transaction>) -> Self {
        TxnEntry {
            txn,
            state: TxnState::Running,
            log_start: None,
            log_blocks: 0,
            frozen: Arc::new(Frozen::default()),
            v1_crc: None,
            locked_at: None,
            written_at: None,
        }
    }

    pub fn tid(&self) -> Tid {
        self.txn.tid
    }

    pub fn state(&self) -> TxnState {
        self.state
    }

    /// Moves to `to`, asserting the transaction is in the only state `to` may follow.
    pub fn transition(&mut self, to: TxnState) {
        use TxnState::*;
        let from_ok = match to {
            Running => self.state == Locked, // a locked transaction reopened by coalescing
            Locked => self.state == Running,
            Committing => self.state == Locked,
            Written => self.state == Committing,
            Durable => self.state == Written,
        };
        assert!(from_ok, "{:?}: illegal transition {:?} -> {to:?}", self.tid(), self.state);
        if to == Committing {
            assert_eq!(self.txn.updates(), 0, "{:?} committing with open handles", self.tid());
        }
        let now = Instant::now();
        match to {
            Locked => self.locked_at = Some(now),
            Written => {
                assert!(self.log_start.is_some(), "{:?} written before allocation", self.tid());
                self.written_at = Some(now);
            }
            Running | Committing | Durable => {}
        }
        self.state = to;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(tid: u32) -> TxnEntry {
        TxnEntry::new(Arc::new(Transaction::new(Tid(tid), false)))
    }

    #[test]
    fn transaction_walks_the_whole_life_cycle() {
        let mut t = entry(7);
        t.transition(TxnState::Locked);
        t.transition(TxnState::Committing);
        t.log_start = Some(1);
        t.transition(TxnState::Written);
        t.transition(TxnState::Durable);
        assert_eq!(t.state(), TxnState::Durable);
    }

    #[test]
    fn coalescing_may_reopen_a_locked_transaction() {
        let mut t = entry(1);
        t.transition(TxnState::Locked);
        t.transition(TxnState::Running);
        assert_eq!(t.state(), TxnState::Running);
    }

    #[test]
    #[should_panic(expected = "illegal transition")]
    fn skipping_a_state_is_a_bug() {
        entry(1).transition(TxnState::Committing);
    }

    #[test]
    #[should_panic(expected = "with open handles")]
    fn committing_with_an_open_handle_is_a_bug() {
        let mut t = entry(1);
        t.txn.updates.fetch_add(1, Ordering::AcqRel);
        t.transition(TxnState::Locked);
        t.transition(TxnState::Committing);
    }

    #[test]
    fn both_list_kinds_push_forget_and_take_alike() {
        let lists = ListLock::new(Arc::new(LockCounters::default()));
        for lock_free in [false, true] {
            let list = TxnList::new(lock_free);
            for v in 0..10u32 {
                list.push(&lists, v);
            }
            assert!(list.remove_first(&lists, |v| *v == 3));
            assert!(!list.remove_first(&lists, |v| *v == 3));
            let mut seen = list.snapshot(&lists);
            seen.sort_unstable();
            assert_eq!(seen, [0, 1, 2, 4, 5, 6, 7, 8, 9]);
            let mut taken = list.take(&lists);
            taken.sort_unstable();
            assert_eq!(taken, seen);
            assert!(list.snapshot(&lists).is_empty(), "lock_free={lock_free}");
        }
    }
}
