//! Checkpointing (JBD2 checkpoint.c): writing durable transactions home and freeing their log.
//!
//! One thread at a time, under the checkpoint mutex (classic JBD2). A buffer's pending home
//! write belongs to the newest durable transaction that logged it (JBD2 keeps a buffer on one
//! checkpoint list only: the newest). So a checkpoint
//! 1. writes home the buffers whose pending version belongs to the oldest durable transaction,
//!    and flushes;
//! 2. moves the superblock's tail (one FUA write) past every leading durable transaction that
//!    owns no pending version any more — often many, since later transactions superseded their
//!    blocks — and frees their log blocks.
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

use crate::buffer::{BlockData, Buffer, IoFlagGuard};
use crate::error::Result;
use crate::journal::Shared;
use crate::stats;
use crate::transaction::{TxnEntry, TxnState};
use blockdev::Write;
use ondisk::Tid;
use std::sync::Arc;
use std::time::Instant;

/// Checkpoints the oldest durable transaction (and frees every transaction it leaves with
/// nothing to write). Returns `false` when no transaction is durable.
pub(crate) fn checkpoint_oldest(shared: &Shared) -> Result<bool> {
    let _one_at_a_time = shared.checkpoint_mutex.lock(&shared.locks);
    let started = Instant::now();
    let (tid, frozen) = {
        let st = shared.state.read(&shared.locks);
        st.aborted()?;
        match st.txns().front() {
            Some(e) if e.state() == TxnState::Durable => (e.tid(), e.frozen.clone()),
            _ => return Ok(false),
        }
    };

    let pending = checkpoint_collect(tid, &frozen.buffers);
    {
        // Marked by checkpoint_collect under each buffer's lock; cleared however the write ends.
        let _writing = IoFlagGuard::new(
            pending.iter().map(|(b, _)| &**b),
            |_| {},
            |inner| inner.checkpoint_writing = false,
        );
        checkpoint_write_home(shared, &pending)?;
        for (buffer, _) in &pending {
            let mut inner = buffer.lock();
            if inner.checkpoint.as_ref().is_some_and(|(t, _)| *t == tid) {
                inner.checkpoint = None;
            }
        }
    }

    // Home locations are durable: move the tail past every finished transaction, durably,
    // then free their log.
    let (done, tail_tid, tail_block) = {
        let st = shared.state.read(&shared.locks);
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
    stats::add(&shared.counters.checkpoint_blocks, pending.len() as u64);
    stats::add_time(&shared.counters.ns_checkpoint, started.elapsed());
    shared.changed.wake_all();
    Ok(true)
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
fn checkpoint_collect(tid: Tid, buffers: &[Arc<Buffer>]) -> Vec<(Arc<Buffer>, BlockData)> {
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
    let writes: Vec<Write<'_>> = pending
        .iter()
        .map(|(buffer, data)| Write {
            offset: shared.home_offset(buffer.block()),
            data: data.as_slice(),
            fua: false,
        })
        .collect();
    shared.dev.write_batch(&writes).map_err(|e| shared.abort_on("checkpoint write", e))?;
    shared.dev.flush().map_err(|e| shared.abort_on("checkpoint flush", e))?;
    stats::add(&shared.counters.checkpoint_flushes, 1);
    Ok(())
}
