//! Cooperative I/O (FAST'18 §3.1.2): a set of I/O units that any number of threads claim and
//! perform together, instead of one thread doing the I/O while the others sleep.
//!
//! A [`WorkSet`] holds its units from the start (they never change). A thread joins with
//! [`WorkSet::help`]: it claims the next unit with one atomic increment of the claim index,
//! performs it, completes it, and claims again until no unit is left. Its own wait list is the
//! units it performed: device writes complete when the call returns, so once `help` returns
//! that thread waits for nothing more of the set. Only a thread that needs the whole set done
//! (the owner: the commit thread before its transaction becomes Written, the checkpoint owner
//! before its flush) blocks in [`WorkSet::wait`] until the last unit completes.
//!
//! Invariants (asserted):
//! - each unit is claimed by exactly one thread: the claim index only grows;
//! - `completed <= claimed <= len`, and the set is finished exactly when `completed == len`;
//!   the thread that completes the last unit marks it finished and wakes the waiters, once;
//! - after the first failure the units not yet performed are completed without I/O (skipped),
//!   so the set still finishes; the first error is kept for the owner, who aborts the journal;
//! - a helper that panics between claim and completion completes its unit as failed (a drop
//!   guard), so no waiter sleeps forever.
//!
//! | event | claim index | completed | failed | finished |
//! |---|---|---|---|---|
//! | `help` claims unit i | i + 1 | — | — | — |
//! | unit performed | — | + 1 | — | when it reaches `len` |
//! | unit fails | — | + 1 | set (first error kept) | when it reaches `len` |
//! | unit claimed after a failure | i + 1 | + 1 (skipped, no I/O) | — | when it reaches `len` |
//!
//! [`Slot`] publishes the current set (or checkpoint round) so threads about to sleep can find
//! it; `scripts/loom.sh` model-checks both at the bottom of this file.

use crate::sync::{AtomicBool, AtomicUsize, Ordering};
#[cfg(loom)]
use loom::sync::{Condvar, Mutex, MutexGuard};
use std::ops::Range;
use std::sync::{Arc, PoisonError};
#[cfg(not(loom))]
use std::sync::{Condvar, Mutex, MutexGuard};

/// Why a set did not complete.
#[derive(Debug)]
pub(crate) enum Failure<E> {
    /// The first unit that failed, failed with this.
    Error(E),
    /// A helper panicked while performing a unit.
    Panic,
}

/// Units that threads claim by index, perform and complete; see the module documentation.
pub(crate) struct WorkSet<U, E> {
    units: Vec<U>,
    /// Index of the next unit to claim (may run past `units.len()`: nothing left).
    next: AtomicUsize,
    /// Units completed, performed or skipped.
    completed: AtomicUsize,
    /// A unit failed: the rest are skipped.
    failed: AtomicBool,
    first_failure: Mutex<Option<Failure<E>>>,
    /// Set once, by the thread that completes the last unit (the per-set wait list).
    finished: Mutex<bool>,
    finished_wake: Condvar,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<U, E> WorkSet<U, E> {
    pub fn new(units: Vec<U>) -> Self {
        let empty = units.is_empty();
        WorkSet {
            units,
            next: AtomicUsize::new(0),
            completed: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
            first_failure: Mutex::new(None),
            finished: Mutex::new(empty),
            finished_wake: Condvar::new(),
        }
    }

    pub fn units(&self) -> &[U] {
        &self.units
    }

    /// Claims and performs units until none is left; returns how many this thread performed.
    /// `perform` runs without any lock of the set held.
    pub fn help(&self, mut perform: impl FnMut(&U) -> Result<(), E>) -> usize {
        let mut performed = 0;
        loop {
            let index = self.next.fetch_add(1, Ordering::AcqRel);
            let Some(unit) = self.units.get(index) else { return performed };
            let mut claim = Claim { set: self, failure: Some(Failure::Panic) };
            if self.failed.load(Ordering::Acquire) {
                claim.failure = None; // skipped: the set has failed already
            } else {
                claim.failure = perform(unit).err().map(Failure::Error);
                performed += 1;
            }
            drop(claim);
        }
    }

    /// Whether some unit is still unclaimed (a thread that helps now finds work).
    pub fn has_unclaimed(&self) -> bool {
        self.next.load(Ordering::Acquire) < self.units.len()
    }

    /// Blocks until every unit completed; then the first failure, if any (taken: the owner
    /// reports it once).
    pub fn wait(&self) -> Result<(), Failure<E>> {
        let mut finished = lock(&self.finished);
        while !*finished {
            finished = self.finished_wake.wait(finished).unwrap_or_else(PoisonError::into_inner);
        }
        drop(finished);
        assert_eq!(self.completed.load(Ordering::Acquire), self.units.len());
        match lock(&self.first_failure).take() {
            Some(failure) => Err(failure),
            None if self.failed.load(Ordering::Acquire) => Err(Failure::Panic),
            None => Ok(()),
        }
    }

    fn complete(&self, failure: Option<Failure<E>>) {
        if let Some(failure) = failure {
            let mut first = lock(&self.first_failure);
            if !self.failed.swap(true, Ordering::AcqRel) {
                *first = Some(failure);
            }
        }
        let completed = self.completed.fetch_add(1, Ordering::AcqRel) + 1;
        assert!(completed <= self.units.len(), "a unit completed twice");
        if completed == self.units.len() {
            let mut finished = lock(&self.finished);
            assert!(!*finished, "a work set finished twice");
            *finished = true;
            drop(finished);
            self.finished_wake.notify_all();
        }
    }
}

/// One claimed unit; completing it on drop keeps a panicking helper from stranding waiters.
struct Claim<'a, U, E> {
    set: &'a WorkSet<U, E>,
    failure: Option<Failure<E>>,
}

impl<U, E> Drop for Claim<'_, U, E> {
    fn drop(&mut self) {
        self.set.complete(self.failure.take());
    }
}

/// Cuts `0..len` into consecutive ranges of about `len / units_target` items, each of at
/// least `min` and at most `max` items (the last may be shorter), so a set is shared by
/// several threads without units too small to be worth a claim.
pub(crate) fn cut(len: usize, units_target: usize, min: usize, max: usize) -> Vec<Range<usize>> {
    assert!(units_target >= 1 && min >= 1 && min <= max);
    let size = len.div_ceil(units_target).clamp(min, max);
    let ranges: Vec<Range<usize>> =
        (0..len).step_by(size).map(|start| start..(start + size).min(len)).collect();
    debug_assert_eq!(ranges.iter().map(|r| r.len()).sum::<usize>(), len);
    ranges
}

/// Units a set is cut into when it is large enough: enough that several threads (the paper's
/// joiners; up to the SSD's channel count) find one to claim.
pub(crate) const UNITS_PER_SET_TARGET: usize = 8;
/// Fewest blocks in one unit: a smaller unit costs more in claims and wake-ups than its writes.
pub(crate) const UNIT_BLOCKS_MIN: usize = 4;
/// Most blocks in one unit: JBD2's JBD2_NR_BATCH (checkpoint batches of 64 buffers).
pub(crate) const UNIT_BLOCKS_MAX: usize = 64;

/// A round of cooperative work with a second phase only its owner runs (a checkpoint: write
/// the batches, then flush and move the tail). Joiners help with the units, then wait for
/// the owner to end the round, so they return only once what they came for is done.
pub(crate) struct Round<W, U, E> {
    pub work: W,
    pub set: WorkSet<U, E>,
    ended: Mutex<bool>,
    ended_wake: Condvar,
}

impl<W, U, E> Round<W, U, E> {
    pub fn new(work: W, units: Vec<U>) -> Self {
        Round {
            work,
            set: WorkSet::new(units),
            ended: Mutex::new(false),
            ended_wake: Condvar::new(),
        }
    }

    /// Blocks until the owner ended the round.
    pub fn wait_ended(&self) {
        let mut ended = lock(&self.ended);
        while !*ended {
            ended = self.ended_wake.wait(ended).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// Held by a round's owner: on drop (however the owner's phase ends) withdraws the round from
/// its slot, then wakes the joiners, so a new round can start once they see this one ended.
pub(crate) struct RoundEnd<'a, W, U, E> {
    slot: &'a Slot<Round<W, U, E>>,
    round: Arc<Round<W, U, E>>,
}

impl<'a, W, U, E> RoundEnd<'a, W, U, E> {
    pub fn new(slot: &'a Slot<Round<W, U, E>>, round: Arc<Round<W, U, E>>) -> Self {
        RoundEnd { slot, round }
    }
}

impl<W, U, E> Drop for RoundEnd<'_, W, U, E> {
    fn drop(&mut self) {
        self.slot.withdraw(&self.round);
        let mut ended = lock(&self.round.ended);
        assert!(!*ended, "a round ended twice");
        *ended = true;
        drop(ended);
        self.round.ended_wake.notify_all();
    }
}

/// The current work (a commit's log writes, a checkpoint round) of one kind, published so a
/// thread about to sleep can find it and help. At most one at a time.
pub(crate) struct Slot<T> {
    current: Mutex<Option<Arc<T>>>,
}

impl<T> Slot<T> {
    pub fn new() -> Self {
        Slot { current: Mutex::new(None) }
    }

    /// The published work, if any.
    pub fn current(&self) -> Option<Arc<T>> {
        lock(&self.current).clone()
    }

    /// Joins the published work, or publishes what `start` builds (it runs under the slot's
    /// lock, so no other work of this kind can start meanwhile; it does no I/O). Returns the
    /// work and whether this thread started it (and so must [`Slot::withdraw`] it), or `None`
    /// when there is none and `start` made none.
    pub fn join_or_start<E>(
        &self,
        start: impl FnOnce() -> Result<Option<T>, E>,
    ) -> Result<Option<(Arc<T>, bool)>, E> {
        let mut current = lock(&self.current);
        if let Some(work) = current.as_ref() {
            return Ok(Some((work.clone(), false)));
        }
        let Some(work) = start()? else { return Ok(None) };
        let work = Arc::new(work);
        *current = Some(work.clone());
        Ok(Some((work, true)))
    }

    /// Publishes `work`; nothing may be published already.
    pub fn publish(&self, work: Arc<T>) {
        let mut current = lock(&self.current);
        assert!(current.is_none(), "two works of one kind published at once");
        *current = Some(work);
    }

    /// Withdraws `work`, which must be the published one.
    pub fn withdraw(&self, work: &Arc<T>) {
        let mut current = lock(&self.current);
        let published = current.take().expect("withdrawing unpublished work");
        assert!(Arc::ptr_eq(&published, work), "withdrawing somebody else's work");
    }
}

/// What cooperative I/O publishes for threads about to sleep (one field of `Shared`).
pub(crate) struct Published {
    /// The committing transaction's log writes (`commit_io=cooperative`).
    pub log_writes: Slot<crate::commit_io::LogWrites>,
    /// The running checkpoint round (`checkpoint_io=cooperative`).
    pub checkpoint: Slot<crate::checkpoint::CheckpointRound>,
}

impl Published {
    pub fn new() -> Self {
        Published { log_writes: Slot::new(), checkpoint: Slot::new() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_shares_a_set_between_several_threads_within_bounds() {
        assert_eq!(cut(0, 8, 4, 64), Vec::<Range<usize>>::new());
        assert_eq!(cut(3, 8, 4, 64), vec![0..3]);
        assert_eq!(cut(40, 8, 4, 64), (0..8).map(|i| i * 5..i * 5 + 5).collect::<Vec<_>>());
        assert_eq!(cut(1000, 8, 4, 64).len(), 16, "units are at most 64");
        assert_eq!(cut(10, 8, 4, 64), vec![0..4, 4..8, 8..10]);
    }

    #[test]
    fn every_unit_is_performed_once_by_some_helper() {
        let set = WorkSet::<usize, ()>::new((0..100).collect());
        let hits: Vec<AtomicUsize> = (0..100).map(|_| AtomicUsize::new(0)).collect();
        let performed: usize = std::thread::scope(|scope| {
            let helpers: Vec<_> = (0..4)
                .map(|_| {
                    scope.spawn(|| {
                        set.help(|&u| {
                            hits[u].fetch_add(1, Ordering::Relaxed);
                            Ok(())
                        })
                    })
                })
                .collect();
            helpers.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(performed, 100);
        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        assert!(set.wait().is_ok(), "finished, without another thread to complete it");
    }

    #[test]
    fn the_first_error_is_kept_and_the_rest_of_the_set_is_skipped() {
        let set = WorkSet::<usize, String>::new((0..10).collect());
        let performed = set.help(|&u| if u == 3 { Err(format!("unit {u}")) } else { Ok(()) });
        assert_eq!(performed, 4, "units after the failure are skipped");
        match set.wait() {
            Err(Failure::Error(e)) => assert_eq!(e, "unit 3"),
            other => panic!("expected the first error, got {other:?}"),
        }
    }

    #[test]
    fn a_panicking_helper_still_lets_the_set_finish_as_failed() {
        let set = WorkSet::<usize, ()>::new((0..3).collect());
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            set.help(|&u| if u == 1 { panic!("helper bug") } else { Ok(()) })
        }));
        assert!(outcome.is_err());
        set.help(|_| Ok(()));
        assert!(matches!(set.wait(), Err(Failure::Panic)));
    }

    #[test]
    fn a_slot_has_one_work_at_a_time_and_late_threads_join_it() {
        let slot = Slot::<u32>::new();
        let (work, started) = slot.join_or_start(|| Ok::<_, ()>(Some(7))).unwrap().unwrap();
        assert!(started);
        let (joined, started) = slot.join_or_start(|| Ok::<_, ()>(Some(8))).unwrap().unwrap();
        assert!(!started && Arc::ptr_eq(&work, &joined));
        slot.withdraw(&work);
        assert!(slot.current().is_none());
        assert!(slot.join_or_start(|| Ok::<_, ()>(None)).unwrap().is_none());
    }
}

/// Model checks (`scripts/loom.sh`): every interleaving of the claim, complete, wait and
/// error paths, and of the two protocols built on them, with up to three threads.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::thread;

    /// The cooperative commit: the commit thread publishes a transaction's chunks, two threads
    /// about to sleep find them and help, the commit thread helps, waits and withdraws them.
    /// Every chunk is written exactly once, and the transaction becomes Written only after
    /// every chunk, whoever wrote it.
    #[test]
    fn loom_commit_chunks_are_written_once_and_the_owner_waits_for_the_last() {
        loom::model(|| {
            let slot = Arc::new(Slot::<WorkSet<usize, ()>>::new());
            let written: Arc<[AtomicUsize; 3]> = Arc::new(Default::default());
            let helpers: Vec<_> = (0..2)
                .map(|_| {
                    let (slot, written) = (slot.clone(), written.clone());
                    thread::spawn(move || match slot.current() {
                        Some(set) => set.help(|&chunk| {
                            written[chunk].fetch_add(1, Ordering::Relaxed);
                            Ok(())
                        }),
                        None => 0,
                    })
                })
                .collect();
            let set = Arc::new(WorkSet::new(vec![0, 1, 2]));
            slot.publish(set.clone());
            let mine = set.help(|&chunk| {
                written[chunk].fetch_add(1, Ordering::Relaxed);
                Ok(())
            });
            set.wait().expect("no chunk fails");
            slot.withdraw(&set);
            // Written: every chunk is on the device, seen through the set's completion alone.
            for chunk in written.iter() {
                assert_eq!(chunk.load(Ordering::Relaxed), 1);
            }
            let helped: usize = helpers.into_iter().map(|h| h.join().unwrap()).sum();
            assert_eq!(mine + helped, 3);
        });
    }

    /// A chunk that fails, whoever claims it: the set still finishes, the owner gets that
    /// error, and no chunk claimed after the failure was seen is written.
    #[test]
    fn loom_a_failed_unit_reaches_the_owner_and_the_set_still_finishes() {
        loom::model(|| {
            let set = Arc::new(WorkSet::<usize, &'static str>::new(vec![0, 1, 2]));
            let perform = |&unit: &usize| if unit == 0 { Err("EIO") } else { Ok(()) };
            let helper = {
                let set = set.clone();
                thread::spawn(move || {
                    set.help(perform);
                })
            };
            set.help(perform);
            match set.wait() {
                Err(Failure::Error(e)) => assert_eq!(e, "EIO"),
                other => panic!("expected the unit's error, got {other:?}"),
            }
            helper.join().unwrap();
        });
    }

    const TXNS: usize = 2;
    const WRITES: usize = 2;

    /// The checkpoint protocol of checkpoint.rs, abstracted: `tail` is the oldest transaction
    /// not yet checkpointed, `homes[t][w]` counts home write `w` of transaction `t`.
    struct Checkpoints {
        slot: Slot<Round<usize, usize, ()>>,
        tail: AtomicUsize,
        homes: [[AtomicUsize; WRITES]; TXNS],
    }

    /// One thread that needs log space, until nothing is left to checkpoint: join the running
    /// round or start one for the oldest transaction, write batches, and, as the starter, wait
    /// for every batch, check they are all home ("flush"), move the tail by one, end the round.
    fn checkpoint_until_empty(c: &Checkpoints) {
        loop {
            let start = || {
                Ok::<_, ()>({
                    let tail = c.tail.load(Ordering::Acquire);
                    (tail < TXNS).then(|| Round::new(tail, (0..WRITES).collect()))
                })
            };
            let Some((round, owner)) = c.slot.join_or_start(start).unwrap() else { return };
            let txn = round.work;
            let write = |&w: &usize| {
                c.homes[txn][w].fetch_add(1, Ordering::Relaxed);
                Ok(())
            };
            if !owner {
                round.set.help(write);
                round.wait_ended();
                assert!(
                    c.tail.load(Ordering::Acquire) > txn,
                    "a joiner returns after the tail moved"
                );
                continue;
            }
            let _end = RoundEnd::new(&c.slot, round.clone());
            round.set.help(write);
            round.set.wait().unwrap();
            for home in &c.homes[txn] {
                assert_eq!(home.load(Ordering::Relaxed), 1, "the tail passes only complete writes");
            }
            assert_eq!(c.tail.load(Ordering::Relaxed), txn, "checkpointed in commit order");
            c.tail.store(txn + 1, Ordering::Release);
        }
    }

    /// Two durable transactions, three threads that need log space: every home write happens
    /// exactly once, the tail moves in commit order and never past a transaction whose writes
    /// are not all complete, and every thread returns.
    #[test]
    fn loom_checkpoint_rounds_move_the_tail_in_order_past_complete_writes_only() {
        loom::model(|| {
            let c = Arc::new(Checkpoints {
                slot: Slot::new(),
                tail: AtomicUsize::new(0),
                homes: Default::default(),
            });
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    let c = c.clone();
                    thread::spawn(move || checkpoint_until_empty(&c))
                })
                .collect();
            checkpoint_until_empty(&c);
            for t in threads {
                t.join().unwrap();
            }
            assert_eq!(c.tail.load(Ordering::Acquire), TXNS);
            for home in c.homes.iter().flatten() {
                assert_eq!(home.load(Ordering::Relaxed), 1);
            }
        });
    }
}
