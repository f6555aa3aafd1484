//! The commit stage (JBD2 commit.c, CJFS's commit thread).
//!
//! For each transaction, in tid order:
//! 1. `commit_lock_up`: wait for a committing slot (`committing_max`), close the transaction
//!    to fast commits and wait for those being written (`fc_commit.rs`), lock the transaction
//!    so no new handle joins, wait for its open handles. Conflicts (buffers whose `versions_max`
//!    versions are all in flight) are waited out; with coalescing the transaction first goes
//!    back to Running and keeps absorbing handles while it waits.
//! 2. `commit_freeze`: every buffer gets a frozen version (an `Arc` clone; writers copy on
//!    write from now on). The transaction becomes Committing and the next one may start.
//! 3. `commit_write_log_blocks`: log space is allocated and revoke blocks, descriptor blocks and
//!    the frozen (escaped where needed) block images are written in one batch (with
//!    `commit_io=cooperative`, in chunks that waiting threads help write: `commit_io.rs`).
//! 4. ordered data (data=ordered) is written, or waited for where its writer writes it; as in
//!    JBD2, after the log blocks and before the flush that precedes the commit block.
//! 5. The transaction is Written and goes to the flush stage (`flush.rs`), or, with
//!    `committing_max == 1`, is made durable right here as JBD2 does.

use crate::buffer::{BlockData, Buffer, IoFlagGuard};
use crate::commit_io;
use crate::config::CommitIo;
use crate::error::{JournalError, Result};
use crate::flush;
use crate::journal::Shared;
use crate::state::State;
use crate::stats;
use crate::transaction::{Frozen, HomeOrder, Transaction, TxnState};
use blockdev::Write;
use ondisk::jbd2::{encode_revoke_blocks, ChecksumVersion, DescriptorBuilder, JBD2_MAGIC};
use ondisk::Tid;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// The commit thread's loop. Exits when the journal aborts or is told to stop.
pub(crate) fn commit_stage(shared: &Arc<Shared>) {
    let mut due_since = None;
    loop {
        let Some(txn) = wait_for_commit_work(shared, &mut due_since) else { return };
        let tid = txn.tid;
        if !commit_lock_up(shared, &txn) {
            continue;
        }
        let committing = commit_freeze(shared, &txn);
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
            shared.flush_wake.wake_all();
        }
    }
}

/// Waits until the running transaction should be committed and a committing slot is free.
/// `due_since` remembers when the transaction became due while no slot was free (the slot
/// wait, counted when it gets one).
fn wait_for_commit_work(
    shared: &Shared,
    due_since: &mut Option<(Tid, Instant)>,
) -> Option<Arc<Transaction>> {
    loop {
        let ticket = shared.commit_wake.ticket();
        let st = shared.state.read(&shared.locks);
        if st.stopping() {
            return None;
        }
        let mut timeout = None;
        let candidate = st
            .txns()
            .back()
            .filter(|e| e.state() == TxnState::Running && e.txn.handles() > 0)
            .map(|e| (e.txn.clone(), e.txn.started_at.elapsed()));
        if let Some((txn, age)) = candidate {
            let requested = st.commit_request().is_some_and(|r| r.is_at_or_after(txn.tid));
            let expired = age >= shared.config.commit_interval;
            let slot_free = st.txns().in_flight() < shared.config.committing_max;
            if requested || expired {
                if slot_free {
                    if let Some((_, since)) = due_since.take().filter(|(t, _)| *t == txn.tid) {
                        stats::add_time(&shared.counters.ns_slot_wait, since.elapsed());
                    }
                    stats::max(&shared.counters.in_flight_max, st.txns().in_flight() as u64 + 1);
                    return Some(txn);
                }
                if due_since.is_none_or(|(t, _)| t != txn.tid) {
                    *due_since = Some((txn.tid, Instant::now()));
                }
            }
            if !expired {
                timeout = Some(shared.config.commit_interval - age);
            }
        }
        drop(st);
        match timeout {
            Some(t) => shared.commit_wake.wait_for(ticket, t),
            None => shared.commit_wake.wait(ticket),
        }
    }
}

/// Locks `txn` (no new handles join) and waits for its handles (and conflicts): JBD2's
/// T_LOCKED and `jbd2_journal_wait_updates`. Returns `false` when the transaction went back to
/// Running (coalescing) or the journal is stopping.
fn commit_lock_up(shared: &Shared, txn: &Transaction) -> bool {
    let tid = txn.tid;
    let versions_max = shared.config.versions_max;
    let coalescing = shared.config.coalescing;
    if coalescing && txn.conflicts_pending(&shared.lists, versions_max) {
        // CJFS opportunistic coalescing: stay Running until the conflicts drain.
        let waited = Instant::now();
        stats::add(&shared.counters.coalesce_rounds, 1);
        let ticket = shared.commit_wake.ticket();
        if txn.conflicts_pending(&shared.lists, versions_max) {
            shared.commit_wake.wait(ticket);
        }
        stats::add_time(&shared.counters.ns_conflict_wait, waited.elapsed());
        return false;
    }
    crate::fc_commit::wait_fast_commits(shared, txn);
    {
        // Under the write lock no handle is between its Running check and its updates
        // increment (both happen under the read lock), so from here `updates` only falls.
        let mut st = shared.state.write(&shared.locks);
        st.txns_mut()
            .get_mut(tid)
            .expect("the running transaction exists")
            .transition(TxnState::Locked);
    }
    // Since when the handles are gone and only conflicts hold the transaction back.
    let mut conflicts_since: Option<Instant> = None;
    let count_conflict_wait = |since: Option<Instant>| {
        if let Some(since) = since {
            stats::add_time(&shared.counters.ns_conflict_wait, since.elapsed());
        }
    };
    loop {
        let ticket = shared.commit_wake.ticket();
        if shared.state.read(&shared.locks).stopping() {
            count_conflict_wait(conflicts_since);
            return false;
        }
        if txn.updates() == 0 {
            let conflicts = txn.conflicts_pending(&shared.lists, versions_max);
            if !conflicts {
                count_conflict_wait(conflicts_since);
                return true;
            }
            conflicts_since.get_or_insert_with(Instant::now);
            if coalescing {
                count_conflict_wait(conflicts_since);
                // Handles that were open while locked touched in-flight buffers: reopen.
                let mut st = shared.state.write(&shared.locks);
                let entry = st.txns_mut().get_mut(tid).expect("the locked transaction exists");
                entry.transition(TxnState::Running);
                drop(st);
                stats::add(&shared.counters.coalesce_rounds, 1);
                shared.changed.wake_all();
                shared.commit_wake.wait(ticket);
                return false;
            }
        }
        shared.commit_wake.wait(ticket);
    }
}

/// What the commit stage needs after the state lock is dropped.
pub(crate) struct Committing {
    /// Each buffer with the version frozen for this transaction.
    buffers: Vec<(Arc<Buffer>, BlockData)>,
    revokes: Vec<u64>,
    ordered: Vec<Arc<dyn crate::ordered::OrderedData>>,
    log_blocks: u32,
    /// Without a log: blocks to write home before or after the others.
    home_order: HashMap<u64, HomeOrder>,
}

/// Freezes every buffer's version for the locked transaction `txn` (no handle is open, so
/// nothing else touches its lists), then makes it Committing so the next one may start.
fn commit_freeze(shared: &Shared, txn: &Transaction) -> Committing {
    let tid = txn.tid;
    assert_eq!(txn.updates(), 0, "{tid:?} frozen with open handles");
    let listed = txn.buffers.take(&shared.lists);
    let mut buffers = Vec::with_capacity(listed.len());
    for buffer in &listed {
        let mut inner = buffer.lock();
        assert!(
            inner.versions.len() < shared.config.versions_max,
            "{buffer:?}: freezing a version beyond versions_max"
        );
        assert_eq!(inner.listed, Some(tid), "{buffer:?} on {tid:?}'s list but not listed there");
        let version = inner.data.clone();
        inner.versions.push((tid, version.clone()));
        inner.listed = None;
        if inner.access == Some(tid) {
            inner.access = None;
        }
        buffers.push((buffer.clone(), version));
    }
    let mut revokes: Vec<u64> = txn.revokes.lock(&shared.locks).iter().copied().collect();
    revokes.sort_unstable();
    let ordered = txn.ordered.take(&shared.lists);
    txn.conflicts.take(&shared.lists);
    let home_order = std::mem::take(&mut *txn.home_order.lock());
    let log_blocks = shared.log_blocks_exact(buffers.len(), revokes.len());
    let frozen = Arc::new(Frozen { buffers: listed, revokes: revokes.clone() });
    let mut st = shared.state.write(&shared.locks);
    st.shrink_reservation(tid, log_blocks);
    let entry = st.txns_mut().get_mut(tid).expect("the locked transaction exists");
    entry.frozen = frozen;
    entry.transition(TxnState::Committing);
    let locked_at = entry.locked_at.expect("locked before committing");
    drop(st);
    stats::add_time(&shared.counters.ns_running, locked_at - txn.started_at);
    stats::add_time(&shared.counters.ns_locked, locked_at.elapsed());
    shared.changed.wake_all();
    Committing { buffers, revokes, ordered, log_blocks, home_order }
}

/// Writes the transaction's log blocks, then its ordered data (or waits for the writers
/// writing it); marks it Written. As JBD2's commit waits for ordered data
/// (`journal_finish_inode_data_buffers`) only after its log blocks are out: the data need only
/// be complete before the flush that precedes the commit block, and log blocks without a
/// commit block are never replayed, so data writes still in flight overlap the log writes.
fn commit_write(shared: &Shared, tid: Tid, committing: Committing) -> Result<()> {
    if shared.logless {
        return commit_write_home(shared, tid, committing);
    }
    let started = Instant::now();
    // Allocate, and map the transaction's log blocks (all but the commit block) to device
    // offsets while the log geometry is at hand.
    let offsets: Vec<u64> = {
        let mut st = shared.state.write(&shared.locks);
        st.aborted()?;
        let start = st.allocate_log(tid, committing.log_blocks);
        (0..committing.log_blocks - 1)
            .map(|i| shared.log_offset(st.log().advance(start, i)))
            .collect()
    };
    // The first commit since the journal was attached: the superblock names the log start
    // and this transaction's tid as the tail before any log block can be replayed.
    shared.ensure_superblock_written()?;
    let (blocks, v1_crc) = commit_build_log_blocks(shared, tid, &committing);
    assert_eq!(blocks.len(), offsets.len(), "{tid:?}: log size mismatch");
    let logged = blocks.len() as u64;
    match shared.config.commit_io {
        CommitIo::Thread => commit_write_log_blocks(shared, &committing, &offsets, &blocks)?,
        CommitIo::Cooperative => {
            commit_io::write_log_blocks_cooperatively(shared, &committing.buffers, offsets, blocks)?
        }
    }
    let ordered_since = Instant::now();
    for item in &committing.ordered {
        item.write_out().map_err(JournalError::from)?;
    }
    stats::add_time(&shared.counters.ns_ordered_wait, ordered_since.elapsed());
    let mut st = shared.state.write(&shared.locks);
    let entry = st.txns_mut().get_mut(tid).expect("the committing transaction exists");
    entry.v1_crc = v1_crc;
    entry.transition(TxnState::Written);
    drop(st);
    stats::add_time(&shared.counters.ns_writing, started.elapsed());
    stats::add(&shared.counters.log_blocks_written, logged);
    stats::add(&shared.counters.blocks_logged, committing.buffers.len() as u64);
    Ok(())
}

/// Without a log ([`crate::Journal::without_log`]): the transaction's ordered data, then its
/// blocks, straight home, in the order its handles asked for:
///
/// `data → flush → Early blocks → flush → other blocks → flush → Late blocks`
///
/// (an empty step and its flush are skipped; the flush after the last step is the one that
/// makes the transaction durable, `flush::make_durable`). Data first, so no crash leaves
/// metadata pointing at a block that still holds what it held before (ordered mode's promise).
/// The log space reserved for the transaction is allocated, as with a log, only so that the
/// accounting of the stand-in log stays as it always is; nothing is written there.
fn commit_write_home(shared: &Shared, tid: Tid, committing: Committing) -> Result<()> {
    let started = Instant::now();
    {
        let mut st = shared.state.write(&shared.locks);
        st.aborted()?;
        st.allocate_log(tid, committing.log_blocks);
    }
    let ordered_since = Instant::now();
    for item in &committing.ordered {
        item.write_out().map_err(JournalError::from)?;
    }
    if !committing.ordered.is_empty() {
        flush::device_flush(shared, "flushing data before its metadata")?;
    }
    stats::add_time(&shared.counters.ns_ordered_wait, ordered_since.elapsed());
    let order_of = |buffer: &Buffer| committing.home_order.get(&buffer.block()).copied();
    let steps = [Some(HomeOrder::Early), None, Some(HomeOrder::Late)];
    let mut written_before = false;
    for step in steps {
        let batch: Vec<&(Arc<Buffer>, BlockData)> =
            committing.buffers.iter().filter(|(buffer, _)| order_of(buffer) == step).collect();
        if batch.is_empty() {
            continue;
        }
        if written_before {
            flush::device_flush(shared, "flushing home writes of a commit")?;
        }
        let _shadow = IoFlagGuard::new(
            batch.iter().map(|(buffer, _)| &**buffer),
            |inner| inner.shadow = true,
            |inner| inner.shadow = false,
        );
        let writes: Vec<Write<'_>> = batch
            .iter()
            .map(|(buffer, version)| Write {
                offset: shared.home_offset(buffer.block()),
                data: version.as_slice(),
                fua: false,
            })
            .collect();
        shared.dev.write_batch(&writes).map_err(JournalError::from)?;
        written_before = true;
    }
    let mut st = shared.state.write(&shared.locks);
    let entry = st.txns_mut().get_mut(tid).expect("the committing transaction exists");
    entry.transition(TxnState::Written);
    drop(st);
    stats::add_time(&shared.counters.ns_writing, started.elapsed());
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
    let entry = st.txns().get(tid).expect("the transaction exists");
    let start = entry.log_start.expect("allocated before its commit block is written");
    st.log().advance(start, entry.log_blocks - 1)
}
