//! Checkpointing (JBD2 checkpoint.c): writing durable transactions home and freeing their log.
//!
//! The oldest durable transaction is checkpointed by one thread at a time, under the
//! checkpoint mutex (classic JBD2): its buffers' newest durable versions are written to their
//! home locations, the device is flushed, and only then does the superblock's tail move past
//! the transaction (FUA write) and its log blocks become free. A crash at any point leaves the
//! tail at or before the transaction, so recovery replays it again (replay is idempotent).
//!
//! A commit never waits on a checkpoint: checkpointing waits only for device I/O, and the
//! flush stage waits only for checkpoint writes of blocks it revokes, which complete on their
//! own.
//!
//! | buffer's pending version | revoked after it? | action |
//! |---|---|---|
//! | none (written by a newer checkpoint) | — | nothing |
//! | tid v | no | write v home |
//! | tid v | yes, revoke durable | drop v: the block may already hold new data |
//! | tid v | yes, revoke not durable | write v home (a crash would replay it anyway; the caller does not reuse the block before the revoke is durable) |

use crate::buffer::{BlockData, Buffer};
use crate::error::Result;
use crate::journal::Shared;
use crate::stats;
use crate::transaction::TxnState;
use blockdev::Write;
use ondisk::Tid;
use std::sync::Arc;
use std::time::Instant;

/// Checkpoints the oldest durable transaction. Returns `false` when there is none.
pub(crate) fn checkpoint_oldest(shared: &Shared) -> Result<bool> {
    let _one_at_a_time = shared.checkpoint_lock.lock();
    let started = Instant::now();
    let (tid, buffers, last_durable) = {
        let st = shared.state.lock();
        st.aborted()?;
        match st.txns.front() {
            Some(t) if t.state == TxnState::Durable => (t.tid, t.buffers.clone(), st.last_durable),
            _ => return Ok(false),
        }
    };

    let pending = checkpoint_collect(&buffers, last_durable);
    let result = checkpoint_write_home(shared, &pending);
    for (buffer, version_tid, _) in &pending {
        let mut inner = buffer.lock();
        inner.checkpoint_writing = false;
        if result.is_ok() && inner.checkpoint.as_ref().is_some_and(|(t, _)| t == version_tid) {
            inner.checkpoint = None;
        }
        drop(inner);
        buffer.io_done.notify_all();
    }
    result?;

    // The home locations are durable: move the tail past `tid`, durably, then free its log.
    let (tail_tid, tail_block, freed) = {
        let st = shared.state.lock();
        let mut rest = st.txns.iter().skip(1);
        let freed =
            st.txns.front().expect("the checkpointed transaction is still first").log_blocks;
        match rest.next() {
            Some(next) => (next.tid, next.log_start.unwrap_or(st.log.head()), freed),
            None => (st.next_tid, st.log.head(), freed),
        }
    };
    shared.write_tail(tail_tid, tail_block)?;
    let mut st = shared.state.lock();
    let done = st.txns.pop_front().expect("the checkpointed transaction is still first");
    assert_eq!(done.tid, tid, "checkpointed out of order");
    st.log.release(freed);
    drop(st);
    stats::add(&shared.counters.checkpoints, 1);
    stats::add(&shared.counters.checkpoint_blocks, pending.len() as u64);
    stats::add_time(&shared.counters.ns_checkpoint, started.elapsed());
    shared.changed.notify_all();
    Ok(true)
}

/// Picks the versions to write home and marks them as being written.
fn checkpoint_collect(
    buffers: &[Arc<Buffer>],
    last_durable: Tid,
) -> Vec<(Arc<Buffer>, Tid, BlockData)> {
    let mut pending = Vec::new();
    for buffer in buffers {
        let mut inner = buffer.lock();
        let Some((version_tid, data)) = inner.checkpoint.clone() else { continue };
        let revoked_durably = inner
            .revoked_by
            .is_some_and(|r| r.is_at_or_after(version_tid) && last_durable.is_at_or_after(r));
        if revoked_durably {
            inner.checkpoint = None;
            continue;
        }
        inner.checkpoint_writing = true;
        pending.push((buffer.clone(), version_tid, data));
    }
    pending
}

fn checkpoint_write_home(shared: &Shared, pending: &[(Arc<Buffer>, Tid, BlockData)]) -> Result<()> {
    if pending.is_empty() {
        return Ok(());
    }
    let writes: Vec<Write<'_>> = pending
        .iter()
        .map(|(buffer, _, data)| Write {
            offset: shared.home_offset(buffer.block()),
            data: data.as_slice(),
            fua: false,
        })
        .collect();
    shared.dev.write_batch(&writes).map_err(|e| shared.abort_on("checkpoint write", e))?;
    shared.dev.flush().map_err(|e| shared.abort_on("checkpoint flush", e))?;
    stats::add(&shared.counters.flushes, 1);
    Ok(())
}
