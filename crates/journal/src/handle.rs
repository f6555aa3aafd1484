//! Handles: tickets to modify buffers inside the running transaction (JBD2 transaction.c).
//!
//! `start(credits) → get_write_access(buf) → modify → dirty_metadata(buf) / revoke(block) →
//! stop()`. [`Handle::modify`] does the middle three in one call.
//!
//! Credits: each buffer a handle puts on the transaction's list and each revoke record costs one
//! credit; reusing a buffer already on the list is free. Running out is a caller bug reported
//! as [`JournalError::CreditsExhausted`]. Unused credits return to the transaction at `stop`.
//!
//! Revoke across transactions (what recovery may replay of block B):
//!
//! | B logged in | B revoked in | B logged again in | replayed |
//! |---|---|---|---|
//! | T1 | T2 | — | nothing (the revoke covers T1) |
//! | T1 | T2 | T3 | T3's copy only |
//! | T1 | T2, then logged again in T2 | — | T2's copy (the revoke is cancelled in T2) |

use crate::buffer::Buffer;
use crate::checkpoint;
use crate::commit_io;
use crate::error::{JournalError, Result};
use crate::journal::Shared;
use crate::ordered::OrderedData;
use crate::stats;
use crate::transaction::{HomeOrder, Transaction, TxnState};
use ondisk::Tid;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

pub struct Handle {
    shared: Arc<Shared>,
    txn: Arc<Transaction>,
    credits: u32,
    used: u32,
    /// Credits [`Handle::set_aside`] keeps out of [`Handle::credits_left`].
    aside: u32,
    /// Log blocks this handle reserved for its credits (`Shared::handle_log_blocks`).
    log_reserved: u32,
    stopped: bool,
}

/// Why a handle could not join the running transaction on this try.
enum Admission {
    Joined(Handle),
    /// No running transaction: open one (needs the write lock).
    NoRunning,
    /// Locked: wait for it to become Committing (JBD2 `wait_transaction_locked`).
    Locked,
    /// Its credits would pass the maximum: have it committed and join the next.
    Full(Tid),
    /// The log cannot hold the reservation: make space.
    NoLogSpace(Tid),
}

/// Handle admission (JBD2 `start_this_handle`): under `j_state_lock` taken to read, join the
/// running transaction by adding to its atomic counters, once it is not locked, has room for
/// `credits`, and the log can hold them; otherwise wait with no lock held, and try again.
pub(crate) fn start_handle(shared: &Arc<Shared>, credits: u32) -> Result<Handle> {
    if credits == 0 || credits > shared.max_txn_credits {
        return Err(JournalError::TooManyCredits {
            requested: credits,
            max: shared.max_txn_credits,
        });
    }
    let started = Instant::now();
    let mut waited = false;
    loop {
        let ticket = shared.changed.ticket();
        match try_join(shared, credits)? {
            Admission::Joined(handle) => {
                if waited {
                    stats::add(&shared.counters.handle_start_waits, 1);
                    stats::add_time(&shared.counters.ns_handle_start_wait, started.elapsed());
                }
                return Ok(handle);
            }
            Admission::NoRunning => {
                let mut st = shared.state.write(&shared.locks);
                if st.txns().running().is_none() {
                    st.check_admission()?;
                    st.txns_mut().open(shared.config.lock_free_lists());
                }
                continue;
            }
            Admission::Locked => {
                // JBD2: new handles wait while the transaction is locked (FAST'18: they help
                // write the committing transaction's log blocks first).
                waited = true;
                if !commit_io::help_write_log(shared) {
                    shared.changed.wait(ticket);
                }
            }
            Admission::Full(tid) => {
                waited = true;
                shared.request_commit(tid);
                if !commit_io::help_write_log(shared) {
                    shared.changed.wait(ticket);
                }
            }
            Admission::NoLogSpace(running) => {
                waited = true;
                stats::add(&shared.counters.space_waits, 1);
                wait_for_log_space(shared, running, ticket)?;
            }
        }
    }
}

/// One admission attempt under the read lock.
fn try_join(shared: &Arc<Shared>, credits: u32) -> Result<Admission> {
    let st = shared.state.read(&shared.locks);
    st.check_admission()?;
    let Some(running) = st.txns().running() else { return Ok(Admission::NoRunning) };
    let txn = &running.txn;
    if running.state() == TxnState::Locked {
        return Ok(Admission::Locked);
    }
    // A Running transaction cannot be locked while this read lock is held, so its updates
    // count, raised here, is seen by the commit stage's lock-up.
    let total = txn.credits.fetch_add(credits, Ordering::AcqRel) + credits;
    if total > shared.max_txn_credits {
        txn.credits.fetch_sub(credits, Ordering::AcqRel);
        return Ok(Admission::Full(txn.tid));
    }
    let log_blocks = shared.handle_log_blocks(credits);
    if !st.reserve_log(txn, log_blocks) {
        txn.credits.fetch_sub(credits, Ordering::AcqRel);
        return Ok(Admission::NoLogSpace(txn.tid));
    }
    txn.updates.fetch_add(1, Ordering::AcqRel);
    txn.handles.fetch_add(1, Ordering::AcqRel);
    let txn = txn.clone();
    drop(st);
    Ok(Admission::Joined(Handle {
        shared: shared.clone(),
        txn,
        credits,
        used: 0,
        aside: 0,
        log_reserved: log_blocks,
        stopped: false,
    }))
}

/// Makes log space: checkpoint the oldest durable transaction if there is one, else get the
/// running transaction committed and wait for something to become durable.
fn wait_for_log_space(
    shared: &Arc<Shared>,
    running: Tid,
    ticket: crate::locks::Ticket,
) -> Result<()> {
    let (checkpointable, running_has_work, in_flight, capacity) = {
        let st = shared.state.read(&shared.locks);
        st.aborted()?;
        let front_durable = st.txns().front().is_some_and(|e| e.state() == TxnState::Durable);
        let has_work = st.txns().get(running).is_some_and(|e| e.txn.handles() > 0);
        (front_durable, has_work, st.txns().in_flight() > 0, st.log().capacity())
    };
    if checkpointable {
        checkpoint::checkpoint_oldest(shared)?;
        return Ok(());
    }
    if !running_has_work && !in_flight {
        return Err(JournalError::Invalid(format!(
            "log of {capacity} blocks cannot hold one transaction"
        )));
    }
    if running_has_work {
        shared.request_commit(running);
    }
    if !commit_io::help_write_log(shared) {
        shared.changed.wait(ticket);
    }
    Ok(())
}

impl Handle {
    /// The transaction this handle belongs to (what `commit_and_wait` takes).
    pub fn tid(&self) -> Tid {
        self.txn.tid
    }

    /// Credits left for the caller's plan: those not used, less those set aside.
    pub fn credits_left(&self) -> u32 {
        (self.credits - self.used).saturating_sub(self.aside)
    }

    /// Sets `credits` of this handle's credits aside for changes its caller's plan does not
    /// count (a file system's quota charges, which any inode write may make): callers that
    /// spend credits as [`Handle::credits_left`] allows stop short of them, and the handle may
    /// still use them. Conservative once used: `credits_left` keeps subtracting all of them.
    pub fn set_aside(&mut self, credits: u32) {
        self.aside = credits.min(self.credits);
    }

    /// Announces that this handle will modify `buffer` (JBD2 `get_write_access`).
    ///
    /// With one version allowed (`versions_max == 1`, JBD2) this waits while the buffer's frozen
    /// copy is being written to the log. A buffer that already has `versions_max` in-flight
    /// versions is a conflict: the handle proceeds, but the transaction cannot freeze its own
    /// version until an older one becomes durable.
    pub fn get_write_access(&self, buffer: &Arc<Buffer>) -> Result<()> {
        assert!(!self.stopped, "{:?}: a handle used after it stopped", self.tid());
        let shared = &self.shared;
        let tid = self.tid();
        let versions_max = shared.config.versions_max;
        let conflict = {
            let mut inner = buffer.lock();
            if versions_max == 1 && inner.shadow {
                let waited = Instant::now();
                while inner.shadow {
                    buffer.io_done.wait(&mut inner);
                }
                stats::add(&shared.counters.shadow_waits, 1);
                stats::add_time(&shared.counters.ns_shadow_wait, waited.elapsed());
            }
            if inner.access == Some(tid) {
                return Ok(());
            }
            inner.access = Some(tid);
            inner.versions.len() >= versions_max
        };
        if conflict {
            stats::add(&shared.counters.conflicts, 1);
            shared.check_aborted()?;
            self.txn.conflicts.push(&shared.lists, buffer.clone());
        }
        Ok(())
    }

    /// Files `buffer` on the transaction's list (JBD2 `dirty_metadata`). The caller obtained
    /// write access and changed the contents through [`Handle::modify`] or
    /// [`Handle::write_buffer`].
    pub fn dirty_metadata(&mut self, buffer: &Arc<Buffer>) -> Result<()> {
        assert!(!self.stopped, "{:?}: a handle used after it stopped", self.tid());
        self.check_block_fits(buffer.block())?;
        self.shared.check_aborted()?;
        let tid = self.tid();
        {
            let mut inner = buffer.lock();
            assert_eq!(inner.access, Some(tid), "{buffer:?} dirtied without write access");
            if inner.listed == Some(tid) {
                return Ok(());
            }
            if self.used == self.credits {
                return Err(JournalError::CreditsExhausted { tid, credits: self.credits });
            }
            self.used += 1;
            inner.listed = Some(tid);
            // JBD2 files the buffer under its state lock, with j_list_lock inside it.
            self.txn.buffers.push(&self.shared.lists, buffer.clone());
        }
        // Journaling a block again in the transaction that revoked it cancels that revoke.
        self.txn.revokes.lock(&self.shared.locks).remove(&buffer.block());
        Ok(())
    }

    /// A journal without INCOMPAT_64BIT records 32-bit block numbers only.
    fn check_block_fits(&self, block: u64) -> Result<()> {
        if !self.shared.format.is_64bit && block > u64::from(u32::MAX) {
            return Err(JournalError::Invalid(format!(
                "block {block} does not fit a journal without the 64bit feature"
            )));
        }
        Ok(())
    }

    /// Overwrites part of `buffer` under this handle. Requires prior write access.
    pub fn write_buffer(&self, buffer: &Buffer, offset: usize, bytes: &[u8]) {
        buffer.modify(self.tid(), |data| data[offset..offset + bytes.len()].copy_from_slice(bytes));
    }

    /// get_write_access + change + dirty_metadata in one call.
    pub fn modify<R>(&mut self, buffer: &Arc<Buffer>, f: impl FnOnce(&mut [u8]) -> R) -> Result<R> {
        self.get_write_access(buffer)?;
        let result = buffer.modify(self.tid(), f);
        self.dirty_metadata(buffer)?;
        Ok(result)
    }

    /// Revokes `block`: no copy of it logged in this or an earlier transaction will be replayed,
    /// and no older version is written home once the revoke is durable. The caller must not
    /// reuse the block for unjournaled data until this transaction is durable.
    pub fn revoke(&mut self, block: u64) -> Result<()> {
        assert!(!self.stopped, "{:?}: a handle used after it stopped", self.tid());
        self.check_block_fits(block)?;
        let tid = self.tid();
        if self.used == self.credits {
            return Err(JournalError::CreditsExhausted { tid, credits: self.credits });
        }
        self.shared.check_aborted()?;
        if !self.txn.revokes.lock(&self.shared.locks).insert(block) {
            return Ok(());
        }
        self.used += 1;
        stats::add(&self.shared.counters.revokes, 1);
        if let Some(buffer) = self.shared.cache.get(block) {
            let mut inner = buffer.lock();
            if inner.listed == Some(tid) {
                // JBD2 forget: the block is being freed, so its new contents are not logged.
                inner.listed = None;
                let removed =
                    self.txn.buffers.remove_first(&self.shared.lists, |b| Arc::ptr_eq(b, &buffer));
                assert!(removed, "{buffer:?} listed in {tid:?} but not on its list");
            }
        }
        Ok(())
    }

    /// Without a log, writes `block` home before (`Early`) or after (`Late`) the transaction's
    /// other blocks ([`HomeOrder`]). `Early` wins: a block nothing on the device points to yet
    /// is safe to write first whatever it loses later in the transaction (what it held is new
    /// in the transaction), and written after the block that comes to point to it, a crash
    /// in between would leave a pointer to garbage. With a log the commit is atomic and this
    /// does nothing.
    pub fn order_home_write(&self, block: u64, order: HomeOrder) {
        if !self.shared.logless {
            return;
        }
        let mut orders = self.txn.home_order.lock();
        let entry = orders.entry(block).or_insert(order);
        if order == HomeOrder::Early {
            *entry = HomeOrder::Early;
        }
    }

    /// Registers data that must be durable before this transaction's commit block.
    pub fn add_ordered_data(&self, data: Arc<dyn OrderedData>) -> Result<()> {
        self.shared.check_aborted()?;
        self.txn.ordered.push(&self.shared.lists, data);
        Ok(())
    }

    /// Ends the handle; returns its transaction id.
    pub fn stop(mut self) -> Result<Tid> {
        self.stop_in_place()
    }

    /// [`Handle::stop`] for a handle its owner cannot give up by value (the owner's other
    /// work continues after the stop). The handle is spent: it must not be used again, and
    /// dropping it does nothing more.
    pub fn stop_in_place(&mut self) -> Result<Tid> {
        self.release();
        self.shared.check_aborted()?;
        Ok(self.tid())
    }

    /// JBD2 `stop_this_handle`: unused credits and their log reservation go back to the
    /// transaction; the last handle out wakes the commit stage. No lock is taken.
    fn release(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        let unused = self.credits - self.used;
        if unused > 0 {
            let keep = self.shared.handle_log_blocks(self.used);
            self.txn.log_reserved.fetch_sub(self.log_reserved - keep, Ordering::AcqRel);
            self.txn.credits.fetch_sub(unused, Ordering::AcqRel);
        }
        let last_out = self.txn.updates.fetch_sub(1, Ordering::AcqRel) == 1;
        if last_out {
            self.shared.commit_wake.wake_all();
        }
        if unused > 0 {
            // Returned credits and log space may let a waiting handle in.
            self.shared.changed.wake_all();
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.release();
    }
}
