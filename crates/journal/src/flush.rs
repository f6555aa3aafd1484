//! The flush stage: makes Written transactions durable (DESIGN.md §3.3).
//!
//! Userspace has no cache-barrier command, so a commit block may be written only after a flush
//! has made its transaction's log blocks durable:
//!
//! `log blocks of T1..Tk (written) → one flush → commit blocks of T1..Tk with FUA →
//! T1..Tk durable, fsync waiters wake`
//!
//! k is at most `flush_batch_max` (compound flush); the group is whatever Written transactions
//! are waiting, so a lone transaction is flushed at once. Stock recovery stops at the first
//! transaction without a valid commit block, so every crash leaves a prefix of whole
//! transactions. Groups are made durable strictly in tid order.

use crate::commit::commit_block_position;
use crate::error::Result;
use crate::journal::Shared;
use crate::stats;
use crate::transaction::TxnState;
use blockdev::Write;
use ondisk::jbd2::encode_commit_block;
use ondisk::Tid;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// The flush thread's loop (only with `committing_max > 1`).
pub(crate) fn flush_stage(shared: &Arc<Shared>) {
    loop {
        let group: Vec<Tid> = {
            let mut st = shared.state.lock();
            loop {
                if st.abort.is_some() {
                    return;
                }
                let group: Vec<Tid> = st
                    .txns
                    .iter()
                    .skip_while(|t| t.state == TxnState::Durable)
                    .take_while(|t| t.state == TxnState::Written)
                    .take(shared.config.flush_batch_max)
                    .map(|t| t.tid)
                    .collect();
                if !group.is_empty() {
                    break group;
                }
                if st.stop_threads {
                    return;
                }
                shared.flush_wake.wait(&mut st);
            }
        };
        if make_durable(shared, &group).is_err() {
            return;
        }
    }
}

/// Makes the consecutive Written transactions `group` durable. On error the journal aborts.
pub(crate) fn make_durable(shared: &Shared, group: &[Tid]) -> Result<()> {
    assert!(!group.is_empty() && group.len() <= shared.config.flush_batch_max);
    shared.dev.flush().map_err(|e| shared.abort_on("flushing log blocks", e))?;
    stats::add(&shared.counters.flushes, 1);

    let (sec, nsec) = commit_time();
    let commits: Vec<(u64, Vec<u8>)> = {
        let st = shared.state.lock();
        group
            .iter()
            .map(|&tid| {
                let txn = st.txn(tid).expect("a written transaction exists");
                assert_eq!(txn.state, TxnState::Written, "{tid:?} flushed out of order");
                let block = encode_commit_block(&shared.format, tid, sec, nsec, txn.v1_crc);
                (shared.log_offset(commit_block_position(&st, tid)), block)
            })
            .collect()
    };
    // FUA, not another flush: a group of k transactions costs one flush and k FUA writes,
    // submitted together so the device serves them in parallel.
    let writes: Vec<Write<'_>> =
        commits.iter().map(|(offset, data)| Write { offset: *offset, data, fua: true }).collect();
    shared.dev.write_batch(&writes).map_err(|e| shared.abort_on("writing commit blocks", e))?;
    stats::add(&shared.counters.fua_writes, commits.len() as u64);
    stats::add(&shared.counters.log_blocks_written, commits.len() as u64);
    wait_for_revoked_checkpoint_writes(shared, group);

    let mut st = shared.state.lock();
    for &tid in group {
        let txn = st.txn_mut(tid).expect("a written transaction exists");
        txn.transition(TxnState::Durable);
        let written_at = txn.written_at.expect("written before durable");
        stats::add_time(&shared.counters.ns_flushing, written_at.elapsed());
        stats::add(&shared.counters.transactions, 1);
        stats::add(&shared.counters.handles, txn.handles as u64);
        for buffer in &txn.buffers {
            let mut inner = buffer.lock();
            let at = inner
                .versions
                .iter()
                .position(|(t, _)| *t == tid)
                .expect("a committed buffer holds its transaction's version");
            let (_, version) = inner.versions.remove(at);
            // The newest durable version is what a checkpoint writes home.
            inner.checkpoint = Some((tid, version));
        }
        st.last_durable = tid;
    }
    drop(st);
    shared.changed.notify_all();
    // Durable versions free conflicts and committing slots.
    shared.commit_wake.notify_all();
    Ok(())
}

/// A checkpoint may be writing an old version of a block these transactions revoke. Once the
/// revoke is durable the caller may reuse the block, so that write must land first.
fn wait_for_revoked_checkpoint_writes(shared: &Shared, group: &[Tid]) {
    let revoked: Vec<u64> = {
        let st = shared.state.lock();
        group
            .iter()
            .flat_map(|&tid| st.txn(tid).into_iter().flat_map(|t| t.revokes.iter().copied()))
            .collect()
    };
    for block in revoked {
        if let Some(buffer) = shared.cache.get(block) {
            let mut inner = buffer.lock();
            while inner.checkpoint_writing {
                buffer.io_done.wait(&mut inner);
            }
        }
    }
}

fn commit_time() -> (u64, u32) {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    (now.as_secs(), now.subsec_nanos())
}
