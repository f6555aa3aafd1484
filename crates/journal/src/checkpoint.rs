//! Checkpointing (JBD2 checkpoint.c): writing durable transactions home and freeing their log.
//!
//! A buffer's pending home write belongs to the newest durable transaction that logged it
//! (JBD2 keeps a buffer on one checkpoint list only: the newest). So a checkpoint
//! 1. writes home the buffers whose pending version belongs to the oldest durable transaction,
//!    and flushes once;
//! 2. moves the superblock's tail (one FUA write) past every leading durable transaction that
//!    owns no pending version any more — often many, since later transactions superseded their
//!    blocks — and frees their log blocks.
//!
//! Who does it (`checkpoint_io`):
//! - `mutex` (JBD2): one thread at a time under the checkpoint mutex; the others queue on it.
//!   It writes the pending versions in one batch, in checkpoint-list order, then flushes once.
//!   That is what jbd2_log_do_checkpoint does: it gathers up to JBD2_NR_BATCH (64) dirty
//!   buffers, submits them with write_dirty_buffer under one blk plug (the block layer merges
//!   adjacent requests, and older kernels sorted the plug list; JBD2's own code never sorts),
//!   repeats until the list is empty, and issues no flush per batch: jbd2_cleanup_journal_tail
//!   issues the one flush before the tail update. So classic keeps its one unsorted batch and
//!   one flush per checkpoint; sorting is left to the device, as JBD2 leaves it to the block
//!   layer.
//! - `cooperative` (FAST'18 + KIPS'18): no mutex. The first thread that needs log space starts
//!   a round; its pending versions are sorted by block number and cut into batches that every
//!   thread arriving meanwhile claims and writes; the starter flushes once for the round and
//!   moves the tail, and only then can the next round start (`checkpoint_cooperatively`).
//!   Deciding and marking a version (`checkpoint_collect`) happens while no other round runs,
//!   exactly as under the mutex, so the table below holds unchanged.
//!
//! A crash at any point leaves the tail at or before every transaction whose blocks are not yet
//! home, so recovery replays them again (replay is idempotent).
//!
//! A commit never waits on a checkpoint: checkpointing waits only for device I/O, and the
//! flush stage waits only for checkpoint writes of blocks it revokes, which complete on their
//! own.
//!
//! | pending version of a buffer in transaction T | revoked after it? | T's checkpoint |
//! |---|---|---|
//! | none (already home) | — | nothing to do |
//! | from a newer durable transaction | — | nothing: the newer one writes it |
//! | from T | no | write it home |
//! | from T | yes, revoke durable | drop it: the block may already hold new data |
//! | from T | yes, revoke not durable | write it home (a crash would replay it anyway; the caller does not reuse the block before the revoke is durable) |

use crate::abort::EIO;
use crate::buffer::{BlockData, Buffer, IoFlagGuard};
use crate::config::CheckpointIo;
use crate::coop_io::{self, Failure, Round, RoundEnd};
use crate::error::Result;
use crate::journal::Shared;
use crate::stats;
use crate::transaction::{TxnEntry, TxnState};
use blockdev::{DeviceError, Write};
use ondisk::Tid;
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

/// Buffers with the version a checkpoint writes home for them.
type Pending = Vec<(Arc<Buffer>, BlockData)>;

/// Checkpoints the oldest durable transaction (and frees every transaction it leaves with
/// nothing to write). Returns `false` when no transaction is durable.
pub(crate) fn checkpoint_oldest(shared: &Shared) -> Result<bool> {
    match shared.config.checkpoint_io {
        CheckpointIo::Mutex => checkpoint_oldest_locked(shared),
        CheckpointIo::Cooperative => checkpoint_cooperatively(shared),
    }
}

/// JBD2: one thread at a time under the checkpoint mutex writes the transaction's pending
/// versions in one batch, flushes once, and moves the tail.
fn checkpoint_oldest_locked(shared: &Shared) -> Result<bool> {
    let _one_at_a_time = shared.checkpoint_mutex.lock(&shared.locks);
    let started = Instant::now();
    let Some((tid, pending)) = checkpoint_begin(shared)? else { return Ok(false) };
    {
        // Marked by checkpoint_collect under each buffer's lock; cleared however the write ends.
        let _writing = IoFlagGuard::new(
            pending.iter().map(|(b, _)| &**b),
            |_| {},
            |inner| inner.checkpoint_writing = false,
        );
        checkpoint_write_home(shared, &pending)?;
        checkpoint_forget_written(tid, &pending);
    }
    checkpoint_move_tail(shared, tid, pending.len(), started)?;
    Ok(true)
}

/// The oldest transaction if it is durable, with the versions it still owns marked as being
/// written.
fn checkpoint_begin(shared: &Shared) -> Result<Option<(Tid, Pending)>> {
    let (tid, frozen) = {
        let st = shared.state.read(&shared.locks);
        st.aborted()?;
        match st.txns().front() {
            Some(e) if e.state() == TxnState::Durable => (e.tid(), e.frozen.clone()),
            _ => return Ok(None),
        }
    };
    Ok(Some((tid, checkpoint_collect(tid, &frozen.buffers))))
}

/// The written versions are home and durable: `tid` no longer owns them.
fn checkpoint_forget_written(tid: Tid, written: &[(Arc<Buffer>, BlockData)]) {
    for (buffer, _) in written {
        let mut inner = buffer.lock();
        if inner.checkpoint.as_ref().is_some_and(|(t, _)| *t == tid) {
            inner.checkpoint = None;
        }
    }
}

/// Home locations are durable: moves the tail past every finished transaction (in commit
/// order, from `tid`, the oldest), durably, then frees their log.
fn checkpoint_move_tail(shared: &Shared, tid: Tid, written: usize, started: Instant) -> Result<()> {
    let (done, tail_tid, tail_block) = {
        let st = shared.state.read(&shared.locks);
        assert_eq!(st.txns().front().map(|e| e.tid()), Some(tid), "checkpointed out of order");
        let done = st
            .txns()
            .iter()
            .take_while(|e| e.state() == TxnState::Durable && checkpoint_done(e))
            .count();
        assert!(done >= 1, "{tid:?} still owns pending versions after its checkpoint");
        let (tail_tid, tail_block) = st.tail_after(done);
        (done, tail_tid, tail_block)
    };
    shared.write_tail(tail_tid, tail_block)?;
    let mut st = shared.state.write(&shared.locks);
    let first = st.txns().front().expect("the checkpointed transaction is still first").tid();
    assert_eq!(first, tid, "checkpointed out of order");
    st.retire(done);
    drop(st);
    stats::add(&shared.counters.checkpoints, done as u64);
    stats::add(&shared.counters.checkpoint_blocks, written as u64);
    stats::add_time(&shared.counters.ns_checkpoint, started.elapsed());
    shared.changed.wake_all();
    Ok(())
}

/// Whether `entry` owns no pending home write (its blocks are home or superseded).
fn checkpoint_done(entry: &TxnEntry) -> bool {
    let tid = entry.tid();
    entry.frozen.buffers.iter().all(|buffer| {
        let mut inner = buffer.lock();
        match &inner.checkpoint {
            Some((version_tid, _)) if *version_tid == tid => {
                if revoked_durably(inner.revoked_durable, *version_tid) {
                    inner.checkpoint = None;
                    true
                } else {
                    false
                }
            }
            _ => true,
        }
    })
}

/// A durable revoke at or after the version's transaction: the block may hold new data now,
/// and recovery will not replay the version, so it must never be written home.
fn revoked_durably(revoked_durable: Option<Tid>, version_tid: Tid) -> bool {
    revoked_durable.is_some_and(|r| r.is_at_or_after(version_tid))
}

/// Picks the versions `tid` owns and marks them as being written.
/// The decision and the `checkpoint_writing` mark are made under the buffer lock, and the
/// flush stage publishes a durable revoke under that lock after waiting out the mark: so either
/// the revoke is seen here, or the write completes before the revoking fsync returns.
fn checkpoint_collect(tid: Tid, buffers: &[Arc<Buffer>]) -> Pending {
    let mut pending = Vec::new();
    for buffer in buffers {
        let mut inner = buffer.lock();
        let Some((version_tid, data)) = inner.checkpoint.clone() else { continue };
        if version_tid != tid {
            continue; // a newer durable transaction owns this block's home write
        }
        if revoked_durably(inner.revoked_durable, version_tid) {
            inner.checkpoint = None;
            continue;
        }
        inner.checkpoint_writing = true;
        pending.push((buffer.clone(), data));
    }
    pending
}

fn checkpoint_write_home(shared: &Shared, pending: &[(Arc<Buffer>, BlockData)]) -> Result<()> {
    if pending.is_empty() {
        return Ok(());
    }
    let writes = home_writes(shared, pending);
    shared.dev.write_batch(&writes).map_err(|e| shared.abort_on("checkpoint write", e))?;
    checkpoint_flush(shared)
}

fn home_writes<'a>(shared: &Shared, pending: &'a [(Arc<Buffer>, BlockData)]) -> Vec<Write<'a>> {
    pending
        .iter()
        .map(|(buffer, data)| Write {
            offset: shared.home_offset(buffer.block()),
            data: data.as_slice(),
            fua: false,
        })
        .collect()
}

/// Makes the home writes durable before the tail moves past their log copies.
fn checkpoint_flush(shared: &Shared) -> Result<()> {
    shared.dev.flush().map_err(|e| shared.abort_on("checkpoint flush", e))?;
    stats::add(&shared.counters.checkpoint_flushes, 1);
    Ok(())
}

/// A cooperative checkpoint round (`checkpoint_io=cooperative`): the oldest durable
/// transaction's pending home writes in batches that every thread needing log space claims.
pub(crate) type CheckpointRound = Round<RoundWork, Range<usize>, DeviceError>;

pub(crate) struct RoundWork {
    tid: Tid,
    started: Instant,
    /// Sorted by block number (KIPS'18), so a batch is as sequential as the blocks allow.
    pending: Pending,
}

/// FAST'18's cooperative checkpoint with KIPS'18's sorted batches: no checkpoint mutex. The
/// first thread to need log space starts a round for the oldest durable transaction; threads
/// that arrive while it runs join it and write batches instead of queueing, then wait for its
/// end. The owner (the starter) waits for every batch, flushes once for the whole round, and
/// moves the tail exactly as the mutex protocol does; only then can the next round start, so
/// transactions are checkpointed strictly in commit order (the paper's Property 3) and a block
/// is never written home by two rounds at once.
fn checkpoint_cooperatively(shared: &Shared) -> Result<bool> {
    let slot = &shared.cooperative.checkpoint;
    let Some((round, owner)) = slot.join_or_start(|| checkpoint_round_start(shared))? else {
        return Ok(false);
    };
    let write_batch = |batch: &Range<usize>| {
        shared.dev.write_batch(&home_writes(shared, &round.work.pending[batch.clone()]))
    };
    if !owner {
        let performed = round.set.help(write_batch);
        stats::add(&shared.counters.checkpoint_batches_helped, performed as u64);
        round.wait_ended();
        shared.check_aborted()?;
        return Ok(true);
    }
    // Dropped last: the joiners wake once the tail moved (or the round failed).
    let _end = RoundEnd::new(slot, round.clone());
    let work = &round.work;
    // Marked by checkpoint_collect under each buffer's lock; cleared however the round ends.
    let writing = IoFlagGuard::new(
        work.pending.iter().map(|(b, _)| &**b),
        |_| {},
        |inner| inner.checkpoint_writing = false,
    );
    let mine = round.set.help(write_batch);
    stats::add(&shared.counters.checkpoint_batches, round.set.units().len() as u64);
    stats::add(&shared.counters.checkpoint_batches_owner, mine as u64);
    match round.set.wait() {
        Ok(()) => {}
        Err(Failure::Error(e)) => return Err(shared.abort_on("checkpoint write", e)),
        Err(Failure::Panic) => {
            return Err(shared.abort("a thread helping with a checkpoint panicked".into(), EIO))
        }
    }
    if !work.pending.is_empty() {
        checkpoint_flush(shared)?;
    }
    checkpoint_forget_written(work.tid, &work.pending);
    drop(writing);
    checkpoint_move_tail(shared, work.tid, work.pending.len(), work.started)?;
    Ok(true)
}

/// A round for the oldest durable transaction, if there is one: its pending versions sorted
/// by block and cut into batches.
fn checkpoint_round_start(shared: &Shared) -> Result<Option<CheckpointRound>> {
    let started = Instant::now();
    let Some((tid, mut pending)) = checkpoint_begin(shared)? else { return Ok(None) };
    pending.sort_unstable_by_key(|(buffer, _)| buffer.block());
    let batches = coop_io::cut(
        pending.len(),
        coop_io::UNITS_PER_SET_TARGET,
        coop_io::UNIT_BLOCKS_MIN,
        coop_io::UNIT_BLOCKS_MAX,
    );
    Ok(Some(Round::new(RoundWork { tid, started, pending }, batches)))
}
