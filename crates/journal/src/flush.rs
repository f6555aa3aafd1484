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

use crate::commit::commit_block_position;
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
    loop {
        let group: Vec<Tid> = loop {
            let ticket = shared.flush_wake.ticket();
            let st = shared.state.read(&shared.locks);
            if st.aborted().is_err() {
                return;
            }
            let group: Vec<Tid> = st
                .txns()
                .iter()
                .skip_while(|e| e.state() == TxnState::Durable)
                .take_while(|e| e.state() == TxnState::Written)
                .take(shared.config.flush_batch_max)
                .map(|e| e.tid())
                .collect();
            if !group.is_empty() {
                break group;
            }
            if st.stopping() {
                return;
            }
            drop(st);
            shared.flush_wake.wait(ticket);
        };
        if make_durable(shared, &group).is_err() {
            return;
        }
    }
}

/// Makes the consecutive Written transactions `group` durable. On error the journal aborts.
pub(crate) fn make_durable(shared: &Shared, group: &[Tid]) -> Result<()> {
    assert!(!group.is_empty() && group.len() <= shared.config.flush_batch_max);
    let flush_started = Instant::now();
    shared.dev.flush().map_err(|e| shared.abort_on("flushing log blocks", e))?;
    stats::add(&shared.counters.flushes, 1);
    stats::add_time(&shared.counters.ns_device_flush, flush_started.elapsed());

    let (sec, nsec) = commit_time();
    // Each commit block with its device offset, and what each transaction froze.
    type Commits = (Vec<(u64, Vec<u8>)>, Vec<(Tid, Arc<Frozen>)>);
    let (commits, frozen): Commits = {
        let st = shared.state.read(&shared.locks);
        group
            .iter()
            .map(|&tid| {
                let entry = st.txns().get(tid).expect("a written transaction exists");
                assert_eq!(entry.state(), TxnState::Written, "{tid:?} flushed out of order");
                let block = encode_commit_block(&shared.format, tid, sec, nsec, entry.v1_crc);
                let offset = shared.log_offset(commit_block_position(&st, tid));
                ((offset, block), (tid, entry.frozen.clone()))
            })
            .unzip()
    };
    // FUA, in tid order, one after the other: a commit block is written only once every
    // earlier one is durable. So no crash leaves a valid commit block past the end recovery
    // finds, and a tid reused after recovery can never meet a stale commit block of its own
    // (JBD2 has the same guarantee with one committing transaction). The group still shares
    // its single flush.
    let fua_started = Instant::now();
    for (offset, block) in &commits {
        shared
            .dev
            .write_fua_at(*offset, block)
            .map_err(|e| shared.abort_on("writing a commit block", e))?;
    }
    stats::add_time(&shared.counters.ns_commit_fua, fua_started.elapsed());
    stats::add(&shared.counters.fua_writes, commits.len() as u64);
    stats::add(&shared.counters.log_blocks_written, commits.len() as u64);
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
            // The newest durable version is what a checkpoint writes home.
            inner.checkpoint = Some((*tid, version));
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
    Ok(())
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
