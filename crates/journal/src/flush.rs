//! The flush stage: makes Written transactions durable (DESIGN.md §3.3).
//!
//! Userspace has no cache-barrier command, so a commit block may be written only after a flush
//! has made its transaction's log blocks durable:
//!
//! `log blocks of T1..Tk (written) → one flush → commit blocks of T1..Tk, each with FUA, in tid
//! order → T1..Tk durable, fsync waiters wake`
//!
//! k is at most `flush_batch_max` (compound flush); the group is whatever Written transactions
//! are waiting, so a lone transaction is flushed at once. Stock recovery stops at the first
//! transaction without a valid commit block, so every crash leaves a prefix of whole
//! transactions. Groups are made durable strictly in tid order.
//!
//! With `commit_record = chained` a commit block is written plainly and the next flush makes
//! it durable along with the next transactions' log blocks (`flush_stage_chained`).
//!
//! With `commit_record = barrier` (a device with a cache barrier, as BarrierFS and CJFS assume)
//! the order comes from the device instead of a flush:
//!
//! `log blocks of T1..Tk (written) → commit blocks of T1..Tk, each an order-preserving write,
//! in tid order → one flush → T1..Tk durable`
//!
//! Each commit block reaches the media after everything written before it: its own log
//! blocks and every earlier commit block. So a crash still leaves a prefix of whole
//! transactions and no valid commit block past the end recovery finds, with one flush per
//! group and no FUA write.

use crate::commit::commit_block_position;
use crate::config::CommitRecord;
use crate::error::Result;
use crate::journal::Shared;
use crate::stats;
use crate::transaction::{Frozen, TxnState};
use ondisk::jbd2::encode_commit_block;
use ondisk::Tid;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The flush thread's loop (only with `committing_max > 1`).
pub(crate) fn flush_stage(shared: &Arc<Shared>) {
    if shared.config.commit_record == CommitRecord::Chained {
        return flush_stage_chained(shared);
    }
    loop {
        let Some(group) = wait_for_written(shared, shared.config.flush_batch_max, false) else {
            return;
        };
        if make_durable(shared, &group).is_err() {
            return;
        }
    }
}

/// Waits until transactions are Written (the first `max` of the consecutive Written ones after
/// the durable prefix, `tid` order), or, with `pending`, returns at once with what is Written
/// now (maybe nothing). `None`: the journal aborted or is stopping.
fn wait_for_written(shared: &Shared, max: usize, pending: bool) -> Option<Vec<Tid>> {
    loop {
        let ticket = shared.flush_wake.ticket();
        let st = shared.state.read(&shared.locks);
        if st.aborted().is_err() {
            return None;
        }
        let group: Vec<Tid> = st
            .txns()
            .iter()
            .skip_while(|e| e.state() == TxnState::Durable)
            .skip(usize::from(pending))
            .take_while(|e| e.state() == TxnState::Written)
            .take(max)
            .map(|e| e.tid())
            .collect();
        if !group.is_empty() || pending {
            return Some(group);
        }
        if st.stopping() {
            return None;
        }
        drop(st);
        shared.flush_wake.wait(ticket);
    }
}

/// `commit_record = chained`: a commit block is a plain write that the *next* flush makes
/// durable, the flush that also covers the log blocks of the transactions written meanwhile,
/// so a stream of transactions costs one flush each instead of a flush and a FUA write.
///
/// | step | durable after it |
/// |---|---|
/// | flush | the pending commit block (T-1 durable); T's log blocks (T was Written before) |
/// | write T's commit block (no FUA) | nothing more: it waits for the next flush |
///
/// At most one commit block is ever written and not yet flushed, and it is the first
/// non-durable transaction's, written only after its own log blocks and every earlier commit
/// block were flushed: every crash leaves a prefix of whole transactions, and no valid commit
/// block lies past the end recovery finds (T+1's commit block is written only once T's is
/// durable). A transaction is acknowledged (fsync returns) after the flush that follows its
/// commit block. One commit block per flush: `flush_batch_max` does not apply.
fn flush_stage_chained(shared: &Arc<Shared>) {
    // The transaction whose commit block is written and waits for the next flush.
    let mut pending: Option<Tid> = None;
    loop {
        let Some(written) = wait_for_written(shared, 1, pending.is_some()) else { return };
        let next = written.first().copied();
        let flush_started = Instant::now();
        if device_flush(shared, "flushing log and commit blocks").is_err() {
            return;
        }
        if let Some(tid) = pending.take() {
            mark_durable(shared, &[tid], flush_started);
        }
        if let Some(tid) = next {
            if write_commit_blocks(shared, &[tid], CommitWrite::Plain).is_err() {
                return;
            }
            pending = Some(tid);
        }
    }
}

/// Makes the consecutive Written transactions `group` durable: one flush, then their commit
/// blocks with FUA; or, with `commit_record = barrier`, their commit blocks as ordered writes,
/// then one flush. On error the journal aborts.
pub(crate) fn make_durable(shared: &Shared, group: &[Tid]) -> Result<()> {
    assert!(!group.is_empty() && group.len() <= shared.config.flush_batch_max);
    let started = Instant::now();
    if shared.logless {
        // The blocks are home already; no commit block exists.
        device_flush(shared, "flushing home writes of a commit")?;
    } else if shared.config.commit_record == CommitRecord::Barrier {
        write_commit_blocks(shared, group, CommitWrite::Barrier)?;
        device_flush(shared, "flushing log and commit blocks")?;
    } else {
        device_flush(shared, "flushing log blocks")?;
        // FUA, in tid order, one after the other: a commit block is written only once every
        // earlier one is durable. So no crash leaves a valid commit block past the end
        // recovery finds, and a tid reused after recovery can never meet a stale commit block
        // of its own (JBD2 has the same guarantee with one committing transaction). The group
        // still shares its single flush.
        write_commit_blocks(shared, group, CommitWrite::Fua)?;
    }
    mark_durable(shared, group, started);
    Ok(())
}

/// One device flush, counted and timed; on error the journal aborts, saying it was `doing`.
pub(crate) fn device_flush(shared: &Shared, doing: &str) -> Result<()> {
    let started = Instant::now();
    shared.dev.flush().map_err(|e| shared.abort_on(doing, e))?;
    stats::add(&shared.counters.flushes, 1);
    stats::add_time(&shared.counters.ns_device_flush, started.elapsed());
    Ok(())
}

/// How a commit block is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CommitWrite {
    /// Durable on completion.
    Fua,
    /// Durable after a later flush.
    Plain,
    /// Ordered after every earlier write, durable after a later flush.
    Barrier,
}

/// Writes the commit blocks of the Written transactions `group`, in tid order, one after the
/// other (timed as the commit-block share of the flush stage).
fn write_commit_blocks(shared: &Shared, group: &[Tid], how: CommitWrite) -> Result<()> {
    let started = Instant::now();
    let (sec, nsec) = commit_time();
    let commits: Vec<(u64, Vec<u8>)> = {
        let st = shared.state.read(&shared.locks);
        group
            .iter()
            .map(|&tid| {
                let entry = st.txns().get(tid).expect("a written transaction exists");
                assert_eq!(entry.state(), TxnState::Written, "{tid:?} flushed out of order");
                let block = encode_commit_block(&shared.format, tid, sec, nsec, entry.v1_crc);
                (shared.log_offset(commit_block_position(&st, tid)), block)
            })
            .collect()
    };
    for (offset, block) in &commits {
        let written = match how {
            CommitWrite::Fua => shared.dev.write_fua_at(*offset, block),
            CommitWrite::Plain => shared.dev.write_at(*offset, block),
            CommitWrite::Barrier => shared.dev.write_barrier_at(*offset, block),
        };
        written.map_err(|e| shared.abort_on("writing a commit block", e))?;
    }
    if how == CommitWrite::Fua {
        stats::add(&shared.counters.fua_writes, commits.len() as u64);
    }
    stats::add(&shared.counters.log_blocks_written, commits.len() as u64);
    stats::add_time(&shared.counters.ns_commit_fua, started.elapsed());
    Ok(())
}

/// The Written transactions `group` are durable (their commit blocks are on the media): the
/// frozen versions become what checkpoints write home, fsync waiters wake. `flush_started`:
/// when the flush that made them durable began.
fn mark_durable(shared: &Shared, group: &[Tid], flush_started: Instant) {
    let frozen: Vec<(Tid, Arc<Frozen>)> = {
        let st = shared.state.read(&shared.locks);
        group
            .iter()
            .map(|&tid| (tid, st.txns().get(tid).expect("a written transaction").frozen.clone()))
            .collect()
    };
    publish_durable_revokes(shared, &frozen);

    // The versions become what checkpoints write home before the transactions are marked
    // Durable, so a checkpoint never sees a Durable transaction whose versions are in flight.
    for (tid, frozen) in &frozen {
        for buffer in &frozen.buffers {
            let mut inner = buffer.lock();
            let at = inner
                .versions
                .iter()
                .position(|(t, _)| t == tid)
                .expect("a committed buffer holds its transaction's version");
            let (_, version) = inner.versions.remove(at);
            // The newest durable version is what a checkpoint writes home. Without a log the
            // commit wrote it home already.
            if !shared.logless {
                inner.checkpoint = Some((*tid, version));
            }
        }
    }
    let mut st = shared.state.write(&shared.locks);
    for &tid in group {
        st.txns_mut().mark_durable(tid);
        shared.durable.store(tid.0, Ordering::Release);
        let entry = st.txns().get(tid).expect("just made durable");
        let written_at = entry.written_at.expect("written before durable");
        stats::add_time(&shared.counters.ns_flushing, written_at.elapsed());
        // Written until this group's flush started: the wait for the flush stage.
        let queued = flush_started.saturating_duration_since(written_at);
        stats::add_time(&shared.counters.ns_flush_queue, queued);
        stats::add(&shared.counters.transactions, 1);
        stats::add(&shared.counters.handles, entry.txn.handles() as u64);
    }
    drop(st);
    for &tid in group {
        shared.done.of(tid).wake_all();
    }
    // Log-space waiters may checkpoint what became durable.
    shared.changed.wake_all();
    // Durable versions free conflicts and committing slots.
    shared.commit_wake.wake_all();
    if let Some(&newest) = group.last() {
        // An error aborted the journal; the next commit or fsync reports it.
        let _ = crate::fc_commit::retire_superseded(shared, newest);
    }
}

/// The group's revokes are durable: record it on the revoked buffers, so no checkpoint writes
/// an older version home from now on. A checkpoint already writing one is waited out first,
/// because once the revoking fsync returns the caller may reuse the block.
fn publish_durable_revokes(shared: &Shared, group: &[(Tid, Arc<Frozen>)]) {
    for (tid, frozen) in group {
        for &block in &frozen.revokes {
            if let Some(buffer) = shared.cache.get(block) {
                let mut inner = buffer.lock();
                while inner.checkpoint_writing {
                    buffer.io_done.wait(&mut inner);
                }
                if inner.revoked_durable.is_none_or(|r| tid.is_after(r)) {
                    inner.revoked_durable = Some(*tid);
                }
            }
        }
    }
}

fn commit_time() -> (u64, u32) {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    (now.as_secs(), now.subsec_nanos())
}
