//! The commit stage (JBD2 commit.c, CJFS's commit thread).
//!
//! For each transaction, in tid order:
//! 1. `commit_lock_up`: wait for a committing slot (`committing_max`), lock the transaction so
//!    no new handle joins, wait for its open handles. Conflicts (buffers whose `versions_max`
//!    versions are all in flight) are waited out; with coalescing the transaction first goes
//!    back to Running and keeps absorbing handles while it waits.
//! 2. `commit_freeze`: every buffer gets a frozen version (an `Arc` clone; writers copy on
//!    write from now on). The transaction becomes Committing and the next one may start.
//! 3. ordered data is written (data=ordered).
//! 4. `commit_write_log_blocks`: log space is allocated and revoke blocks, descriptor blocks and
//!    the frozen (escaped where needed) block images are written in one batch (with
//!    `commit_io=cooperative`, in chunks that waiting threads help write: `commit_io.rs`).
//! 5. The transaction is Written and goes to the flush stage (`flush.rs`), or, with
//!    `committing_max == 1`, is made durable right here as JBD2 does.

use crate::buffer::{BlockData, Buffer, IoFlagGuard};
use crate::commit_io;
use crate::config::CommitIo;
use crate::error::{JournalError, Result};
use crate::flush;
use crate::journal::{Shared, State};
use crate::stats;
use crate::transaction::TxnState;
use blockdev::Write;
use ondisk::jbd2::{encode_revoke_blocks, ChecksumVersion, DescriptorBuilder, JBD2_MAGIC};
use ondisk::Tid;
use parking_lot::MutexGuard;
use std::sync::Arc;
use std::time::Instant;

/// The commit thread's loop. Exits when the journal aborts or is told to stop.
pub(crate) fn commit_stage(shared: &Arc<Shared>) {
    loop {
        let st = shared.state.lock();
        let Some((st, tid)) = wait_for_commit_work(shared, st) else { return };
        let Some(st) = commit_lock_up(shared, st, tid) else { continue };
        let committing = commit_freeze(shared, st, tid);
        if let Err(e) = commit_write(shared, tid, committing) {
            // The transaction's blocks may be half written: nothing more may be committed.
            shared.abort(format!("commit of {tid:?} failed: {e}"), e.errno());
            return;
        }
        if shared.config.committing_max == 1 {
            // JBD2: the commit thread makes the transaction durable before taking the next.
            if flush::make_durable(shared, &[tid]).is_err() {
                return;
            }
        } else {
            shared.flush_wake.notify_all();
        }
    }
}

/// Waits until the running transaction should be committed and a committing slot is free.
fn wait_for_commit_work<'a>(
    shared: &'a Shared,
    mut st: MutexGuard<'a, State>,
) -> Option<(MutexGuard<'a, State>, Tid)> {
    loop {
        if st.abort.is_some() || st.stop_threads {
            return None;
        }
        let mut timeout = None;
        let candidate = st
            .txns
            .back()
            .filter(|t| t.state == TxnState::Running && t.handles > 0)
            .map(|t| (t.tid, t.started_at.elapsed()));
        if let Some((tid, age)) = candidate {
            let requested = st.commit_request.is_some_and(|r| r.is_at_or_after(tid));
            let expired = age >= shared.config.commit_interval;
            let slot_free = st.in_flight() < shared.config.committing_max;
            if (requested || expired) && slot_free {
                return Some((st, tid));
            }
            if !expired {
                timeout = Some(shared.config.commit_interval - age);
            }
        }
        match timeout {
            Some(t) => {
                shared.commit_wake.wait_for(&mut st, t);
            }
            None => shared.commit_wake.wait(&mut st),
        }
    }
}

/// Locks transaction `tid` and waits for its handles (and conflicts). Returns `None` when the
/// transaction went back to Running (coalescing) or the journal is stopping.
fn commit_lock_up<'a>(
    shared: &'a Shared,
    mut st: MutexGuard<'a, State>,
    tid: Tid,
) -> Option<MutexGuard<'a, State>> {
    let versions_max = shared.config.versions_max;
    let coalescing = shared.config.coalescing;
    let txn = st.txn_mut(tid).expect("the running transaction exists");
    if coalescing && txn.conflicts_pending(versions_max) {
        // CJFS opportunistic coalescing: stay Running until the conflicts drain.
        stats::add(&shared.counters.coalesce_rounds, 1);
        shared.commit_wake.wait(&mut st);
        return None;
    }
    txn.transition(TxnState::Locked);
    loop {
        if st.abort.is_some() || st.stop_threads {
            return None;
        }
        let txn = st.txn_mut(tid).expect("the locked transaction exists");
        let conflicts = txn.conflicts_pending(versions_max);
        if txn.updates == 0 && !conflicts {
            return Some(st);
        }
        if txn.updates == 0 && conflicts && coalescing {
            // Handles that were open while locked touched in-flight buffers: reopen.
            txn.transition(TxnState::Running);
            stats::add(&shared.counters.coalesce_rounds, 1);
            shared.changed.notify_all();
            shared.commit_wake.wait(&mut st);
            return None;
        }
        shared.commit_wake.wait(&mut st);
    }
}

/// What the commit stage needs after the state lock is dropped.
pub(crate) struct Committing {
    /// Each buffer with the version frozen for this transaction.
    buffers: Vec<(Arc<Buffer>, BlockData)>,
    revokes: Vec<u64>,
    ordered: Vec<Arc<dyn crate::ordered::OrderedData>>,
    log_blocks: u32,
}

/// Freezes every buffer's version for `tid` and lets the next transaction start.
fn commit_freeze(shared: &Shared, mut st: MutexGuard<'_, State>, tid: Tid) -> Committing {
    let txn = st.txn_mut(tid).expect("the locked transaction exists");
    let mut buffers = Vec::with_capacity(txn.buffers.len());
    for buffer in &txn.buffers {
        let mut inner = buffer.lock();
        assert!(
            inner.versions.len() < shared.config.versions_max,
            "{buffer:?}: freezing a version beyond versions_max"
        );
        let version = inner.data.clone();
        inner.versions.push((tid, version.clone()));
        inner.listed = None;
        if inner.access == Some(tid) {
            inner.access = None;
        }
        buffers.push((buffer.clone(), version));
    }
    let mut revokes: Vec<u64> = txn.revokes.iter().copied().collect();
    revokes.sort_unstable();
    let ordered = std::mem::take(&mut txn.ordered);
    let log_blocks = shared.log_blocks_exact(buffers.len(), revokes.len());
    txn.log_reserved = log_blocks;
    txn.blocks_logged = buffers.len() as u32;
    txn.conflicts.clear();
    txn.transition(TxnState::Committing);
    let locked_at = txn.locked_at.expect("locked before committing");
    stats::add_time(&shared.counters.ns_running, locked_at - txn.started_at);
    stats::add_time(&shared.counters.ns_locked, locked_at.elapsed());
    drop(st);
    shared.changed.notify_all();
    Committing { buffers, revokes, ordered, log_blocks }
}

/// Writes ordered data and the transaction's log blocks; marks it Written.
fn commit_write(shared: &Shared, tid: Tid, committing: Committing) -> Result<()> {
    let started = Instant::now();
    for item in &committing.ordered {
        item.write_out().map_err(JournalError::from)?;
    }
    // Allocate, and map the transaction's log blocks (all but the commit block) to device
    // offsets while the log geometry is at hand.
    let offsets: Vec<u64> = {
        let mut st = shared.state.lock();
        st.aborted()?;
        let start = st.log.allocate(committing.log_blocks);
        let txn = st.txn_mut(tid).expect("the committing transaction exists");
        txn.log_start = Some(start);
        txn.log_blocks = committing.log_blocks;
        txn.log_reserved = 0;
        (0..committing.log_blocks - 1)
            .map(|i| shared.log_offset(st.log.advance(start, i)))
            .collect()
    };
    if shared.superblock_unwritten.swap(false, std::sync::atomic::Ordering::AcqRel) {
        // The first commit since the journal was attached: the superblock names the log start
        // and this transaction's tid as the tail before any log block can be replayed.
        shared.update_superblock(|_| {})?;
    }
    let (blocks, v1_crc) = commit_build_log_blocks(shared, tid, &committing);
    assert_eq!(blocks.len(), offsets.len(), "{tid:?}: log size mismatch");
    let logged = blocks.len() as u64;
    let result = match shared.config.commit_io {
        CommitIo::Thread => commit_write_log_blocks(shared, &committing, &offsets, &blocks),
        CommitIo::Cooperative => {
            commit_io::write_log_blocks_cooperatively(shared, &committing.buffers, offsets, blocks)
        }
    };
    let mut st = shared.state.lock();
    result?;
    let txn = st.txn_mut(tid).expect("the committing transaction exists");
    txn.v1_crc = v1_crc;
    txn.transition(TxnState::Written);
    stats::add_time(&shared.counters.ns_writing, started.elapsed());
    stats::add(&shared.counters.log_blocks_written, logged);
    stats::add(&shared.counters.blocks_logged, committing.buffers.len() as u64);
    Ok(())
}

/// The transaction's log blocks in order: revoke blocks, then each descriptor followed by the
/// blocks it describes. Also the compat-CHECKSUM (v1) running crc of descriptors and data.
fn commit_build_log_blocks(
    shared: &Shared,
    tid: Tid,
    c: &Committing,
) -> (Vec<BlockData>, Option<u32>) {
    let format = shared.format;
    let mut blocks: Vec<BlockData> = Vec::with_capacity(c.log_blocks as usize);
    for revoke_block in encode_revoke_blocks(&format, tid, &c.revokes) {
        blocks.push(Arc::new(revoke_block));
    }
    let v1 = format.checksum == ChecksumVersion::V1;
    let mut v1_crc = !0u32;
    for chunk in c.buffers.chunks(format.tags_per_descriptor()) {
        let mut descriptor = DescriptorBuilder::new(format, tid);
        let mut images = Vec::with_capacity(chunk.len());
        for (buffer, version) in chunk {
            let block = buffer.block();
            let image = if version.get(..4) == Some(&JBD2_MAGIC.to_be_bytes()[..]) {
                // The block would look like a journal header: log an escaped copy.
                let mut escaped = version.to_vec();
                let was_escaped = descriptor.push(block, &mut escaped);
                debug_assert!(was_escaped);
                Arc::new(escaped)
            } else {
                descriptor.push_unescaped(block, version);
                version.clone()
            };
            images.push(image);
        }
        let descriptor = descriptor.finish();
        if v1 {
            v1_crc = ondisk::jbd2::v1_crc_update(v1_crc, &descriptor);
            for image in &images {
                v1_crc = ondisk::jbd2::v1_crc_update(v1_crc, image);
            }
        }
        blocks.push(Arc::new(descriptor));
        blocks.extend(images);
    }
    (blocks, v1.then_some(v1_crc))
}

/// Submits the log blocks as one batch. While they are in flight the buffers are shadowed, so
/// with `versions_max == 1` a writer waits as in JBD2.
fn commit_write_log_blocks(
    shared: &Shared,
    committing: &Committing,
    offsets: &[u64],
    blocks: &[BlockData],
) -> Result<()> {
    let _shadow = IoFlagGuard::new(
        committing.buffers.iter().map(|(buffer, _)| &**buffer),
        |inner| inner.shadow = true,
        |inner| inner.shadow = false,
    );
    let writes: Vec<Write<'_>> = blocks
        .iter()
        .zip(offsets)
        .map(|(data, &offset)| Write { offset, data: data.as_slice(), fua: false })
        .collect();
    shared.dev.write_batch(&writes).map_err(JournalError::from)
}

/// The log block holding `tid`'s commit block.
pub(crate) fn commit_block_position(st: &State, tid: Tid) -> u32 {
    let txn = st.txn(tid).expect("the transaction exists");
    let start = txn.log_start.expect("allocated before its commit block is written");
    st.log.advance(start, txn.log_blocks - 1)
}
