//! The journal's locks, each timed when contended, and its wait queues (DESIGN.md §3.7: "per
//! lock: wait time"; the FAST'18 paper's lock-contention breakdown).
//!
//! A lock is first tried; only when that fails is the clock read and the blocking acquisition
//! timed, so an uncontended acquisition costs what the bare lock costs. Every lock of the
//! engine has a [`LockId`], and its waits and wait time appear in [`LockWaits`].
//!
//! [`WaitQueue`] is JBD2's `wait_queue_head_t` for conditions guarded by a reader-writer lock
//! (parking_lot's condition variables only pair with a mutex): a waiter takes a ticket, checks
//! its condition under whatever lock guards it, and sleeps only if nobody woke the queue since
//! the ticket. A waker changes the state first, then wakes. No wake-up is lost: the ticket is
//! taken before the check, and the sleeper re-reads the sequence under the queue's own mutex,
//! which the waker takes before notifying.

use parking_lot::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// The journal's locks, outermost first (the lock order; see journal.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LockId {
    /// `j_checkpoint_mutex`: one checkpointer at a time (classic checkpoint I/O).
    Checkpoint,
    /// `j_state_lock` taken to read (handle admission, lookups).
    StateRead,
    /// `j_state_lock` taken to write (transaction state changes, log allocation).
    StateWrite,
    /// A buffer's state lock (`b_state_lock`: the journal head of one buffer).
    Buffer,
    /// `j_list_lock`: the running transaction's buffer, ordered-data and conflict lists.
    List,
    /// `j_revoke_lock`: a transaction's revoke table.
    Revoke,
    /// The journal superblock as last written (a leaf, held across its own FUA write).
    Superblock,
}

const LOCKS: usize = 7;

/// How often and how long threads waited for each lock.
#[derive(Default)]
pub(crate) struct LockCounters {
    waits: [AtomicU64; LOCKS],
    ns: [AtomicU64; LOCKS],
}

impl LockCounters {
    fn record(&self, id: LockId, since: Instant) {
        self.waits[id as usize].fetch_add(1, Relaxed);
        let ns = since.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        self.ns[id as usize].fetch_add(ns, Relaxed);
    }

    pub fn snapshot(&self) -> LockWaits {
        let get = |id: LockId| LockWait {
            waits: self.waits[id as usize].load(Relaxed),
            ms: self.ns[id as usize].load(Relaxed) as f64 / 1e6,
        };
        LockWaits {
            checkpoint: get(LockId::Checkpoint),
            state_read: get(LockId::StateRead),
            state_write: get(LockId::StateWrite),
            buffer: get(LockId::Buffer),
            list: get(LockId::List),
            revoke: get(LockId::Revoke),
            superblock: get(LockId::Superblock),
        }
    }
}

/// Contended acquisitions of one lock and the time spent waiting for it.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct LockWait {
    pub waits: u64,
    pub ms: f64,
}

/// Lock waits per lock of the engine (JBD2's names in the field docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct LockWaits {
    /// `j_checkpoint_mutex`.
    pub checkpoint: LockWait,
    /// `j_state_lock`, read side.
    pub state_read: LockWait,
    /// `j_state_lock`, write side.
    pub state_write: LockWait,
    /// Buffer state locks (`b_state_lock`), all buffers together.
    pub buffer: LockWait,
    /// `j_list_lock`.
    pub list: LockWait,
    /// `j_revoke_lock`.
    pub revoke: LockWait,
    /// The journal superblock.
    pub superblock: LockWait,
}

impl LockWaits {
    /// `(name, wait)` for every lock, in lock order (tables and plots).
    pub fn named(&self) -> [(&'static str, LockWait); LOCKS] {
        [
            ("j_checkpoint_mutex", self.checkpoint),
            ("j_state_lock(read)", self.state_read),
            ("j_state_lock(write)", self.state_write),
            ("b_state_lock", self.buffer),
            ("j_list_lock", self.list),
            ("j_revoke_lock", self.revoke),
            ("superblock", self.superblock),
        ]
    }

    /// Milliseconds waited for any lock.
    pub fn total_ms(&self) -> f64 {
        self.named().iter().map(|(_, w)| w.ms).sum()
    }
}

/// Takes a lock: first without blocking; only when that fails is the blocking acquisition
/// timed and counted against `id`.
fn acquire<G>(
    counters: &LockCounters,
    id: LockId,
    try_take: impl FnOnce() -> Option<G>,
    take: impl FnOnce() -> G,
) -> G {
    if let Some(guard) = try_take() {
        return guard;
    }
    let since = Instant::now();
    let guard = take();
    counters.record(id, since);
    guard
}

/// A mutex whose contended acquisitions are timed into [`LockCounters`].
pub(crate) struct TimedMutex<T> {
    id: LockId,
    lock: Mutex<T>,
}

impl<T> TimedMutex<T> {
    pub fn new(id: LockId, value: T) -> Self {
        TimedMutex { id, lock: Mutex::new(value) }
    }

    pub fn lock(&self, counters: &LockCounters) -> MutexGuard<'_, T> {
        acquire(counters, self.id, || self.lock.try_lock(), || self.lock.lock())
    }

    /// Without blocking (the cache's eviction sweep, which must not wait out of lock order).
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        self.lock.try_lock()
    }
}

/// A reader-writer lock (`j_state_lock`) whose contended acquisitions are timed.
pub(crate) struct TimedRwLock<T> {
    lock: RwLock<T>,
}

impl<T> TimedRwLock<T> {
    pub fn new(value: T) -> Self {
        TimedRwLock { lock: RwLock::new(value) }
    }

    pub fn read(&self, counters: &LockCounters) -> RwLockReadGuard<'_, T> {
        acquire(counters, LockId::StateRead, || self.lock.try_read(), || self.lock.read())
    }

    pub fn write(&self, counters: &LockCounters) -> RwLockWriteGuard<'_, T> {
        acquire(counters, LockId::StateWrite, || self.lock.try_write(), || self.lock.write())
    }
}

/// A wait queue for conditions guarded by any lock (see the module documentation).
pub(crate) struct WaitQueue {
    sequence: AtomicU64,
    sleepers: Mutex<()>,
    wake: Condvar,
}

/// Taken before checking a condition; [`WaitQueue::wait`] returns at once if the queue was
/// woken since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub(crate) struct Ticket(u64);

impl WaitQueue {
    pub fn new() -> Self {
        WaitQueue { sequence: AtomicU64::new(0), sleepers: Mutex::new(()), wake: Condvar::new() }
    }

    pub fn ticket(&self) -> Ticket {
        Ticket(self.sequence.load(std::sync::atomic::Ordering::Acquire))
    }

    /// Sleeps until the queue is woken after `ticket` was taken (or already was).
    pub fn wait(&self, ticket: Ticket) {
        let mut sleepers = self.sleepers.lock();
        while self.sequence.load(std::sync::atomic::Ordering::Acquire) == ticket.0 {
            self.wake.wait(&mut sleepers);
        }
    }

    /// As [`WaitQueue::wait`], giving up after `timeout`.
    pub fn wait_for(&self, ticket: Ticket, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut sleepers = self.sleepers.lock();
        while self.sequence.load(std::sync::atomic::Ordering::Acquire) == ticket.0 {
            if self.wake.wait_until(&mut sleepers, deadline).timed_out() {
                return;
            }
        }
    }

    /// Wakes every sleeper and invalidates every outstanding ticket. Call after the state
    /// change the sleepers wait for.
    pub fn wake_all(&self) {
        self.sequence.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        let _sleepers = self.sleepers.lock();
        self.wake.notify_all();
    }
}

/// How many [`DoneQueues`] there are: more than the transactions that can be in flight at once
/// under any preset (`committing_max` plus the running one), so waiters of different in-flight
/// transactions share a queue only when the limit is set far above the presets'. Sharing costs
/// a spurious wake-up, never a lost one.
const DONE_QUEUES: usize = 16;

/// JBD2's `j_wait_done_commit`, split by tid: an fsync sleeps on the queue of the transaction
/// it waits for, so a transaction becoming durable wakes its own waiters, not every fsync in
/// flight (the waiters of the running transaction used to wake at every durable transaction,
/// and at every handle stop, only to sleep again).
pub(crate) struct DoneQueues {
    queues: [WaitQueue; DONE_QUEUES],
}

impl DoneQueues {
    pub fn new() -> Self {
        DoneQueues { queues: std::array::from_fn(|_| WaitQueue::new()) }
    }

    /// The queue the waiters of `tid` sleep on.
    pub fn of(&self, tid: ondisk::Tid) -> &WaitQueue {
        &self.queues[tid.0 as usize % DONE_QUEUES]
    }

    /// Wakes the waiters of every tid (abort, stop, cooperative work to help with).
    pub fn wake_all(&self) {
        for queue in &self.queues {
            queue.wake_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[test]
    fn a_wake_between_ticket_and_wait_is_not_lost() {
        let queue = WaitQueue::new();
        let ticket = queue.ticket();
        queue.wake_all();
        queue.wait(ticket); // returns at once
        let later = queue.ticket();
        assert_ne!(later, ticket);
    }

    #[test]
    fn sleepers_wake_when_the_condition_changes() {
        let queue = Arc::new(WaitQueue::new());
        let flag = Arc::new(AtomicBool::new(false));
        let waiter = {
            let (queue, flag) = (queue.clone(), flag.clone());
            std::thread::spawn(move || loop {
                let ticket = queue.ticket();
                if flag.load(Ordering::Acquire) {
                    return;
                }
                queue.wait(ticket);
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        flag.store(true, Ordering::Release);
        queue.wake_all();
        waiter.join().unwrap();
    }

    #[test]
    fn contended_acquisitions_are_counted_and_uncontended_ones_are_not() {
        let counters = Arc::new(LockCounters::default());
        let lock = Arc::new(TimedMutex::new(LockId::List, 0u32));
        *lock.lock(&counters) += 1;
        assert_eq!(counters.snapshot().list.waits, 0);
        // The other thread must reach the lock while it is held; on a loaded machine it may be
        // scheduled late, so a round where it did not is tried again.
        for _round in 0..10 {
            let held = lock.lock(&counters);
            let (ready_tx, ready_rx) = std::sync::mpsc::channel();
            let other = {
                let (lock, counters) = (lock.clone(), counters.clone());
                std::thread::spawn(move || {
                    ready_tx.send(()).unwrap();
                    *lock.lock(&counters) += 1;
                })
            };
            ready_rx.recv().unwrap();
            std::thread::sleep(Duration::from_millis(30));
            drop(held);
            other.join().unwrap();
            let waits = counters.snapshot().list;
            if waits.waits > 0 {
                assert_eq!(waits.waits, 1);
                assert!(waits.ms > 0.0, "{waits:?}");
                assert_eq!(counters.snapshot().state_read.waits, 0, "other locks untouched");
                return;
            }
        }
        panic!("the contended acquisition was never counted");
    }
}
