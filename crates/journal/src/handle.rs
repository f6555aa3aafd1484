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
use crate::error::{JournalError, Result};
use crate::journal::Shared;
use crate::ordered::OrderedData;
use crate::stats;
use crate::transaction::TxnState;
use ondisk::Tid;
use std::sync::Arc;
use std::time::Instant;

pub struct Handle {
    shared: Arc<Shared>,
    tid: Tid,
    credits: u32,
    used: u32,
    stopped: bool,
}

impl Handle {
    pub(crate) fn new(shared: Arc<Shared>, tid: Tid, credits: u32) -> Self {
        Handle { shared, tid, credits, used: 0, stopped: false }
    }

    /// The transaction this handle belongs to (what `commit_and_wait` takes).
    pub fn tid(&self) -> Tid {
        self.tid
    }

    pub fn credits_left(&self) -> u32 {
        self.credits - self.used
    }

    /// Announces that this handle will modify `buffer` (JBD2 `get_write_access`).
    ///
    /// With one version allowed (`versions_max == 1`, JBD2) this waits while the buffer's frozen
    /// copy is being written to the log. A buffer that already has `versions_max` in-flight
    /// versions is a conflict: the handle proceeds, but the transaction cannot freeze its own
    /// version until an older one becomes durable.
    pub fn get_write_access(&self, buffer: &Arc<Buffer>) -> Result<()> {
        let shared = &self.shared;
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
            if inner.access == Some(self.tid) {
                return Ok(());
            }
            inner.access = Some(self.tid);
            inner.versions.len() >= versions_max
        };
        if conflict {
            stats::add(&shared.counters.conflicts, 1);
            let mut st = shared.state.lock();
            st.aborted()?;
            let txn = st.txn_mut(self.tid).expect("a handle's transaction is open");
            txn.conflicts.push(buffer.clone());
        }
        Ok(())
    }

    /// Files `buffer` on the transaction's list (JBD2 `dirty_metadata`). The caller obtained
    /// write access and changed the contents through [`Handle::modify`] or
    /// [`Handle::write_buffer`].
    pub fn dirty_metadata(&mut self, buffer: &Arc<Buffer>) -> Result<()> {
        self.check_block_fits(buffer.block())?;
        let mut st = self.shared.state.lock();
        st.aborted()?;
        let txn = st.txn_mut(self.tid).expect("a handle's transaction is open");
        debug_assert!(matches!(txn.state, TxnState::Running | TxnState::Locked));
        let mut inner = buffer.lock();
        assert_eq!(inner.access, Some(self.tid), "{buffer:?} dirtied without write access");
        if inner.listed == Some(self.tid) {
            return Ok(());
        }
        if self.used == self.credits {
            return Err(JournalError::CreditsExhausted { tid: self.tid, credits: self.credits });
        }
        self.used += 1;
        inner.listed = Some(self.tid);
        // Journaling a block again in the transaction that revoked it cancels that revoke.
        txn.revokes.remove(&buffer.block());
        drop(inner);
        txn.buffers.push(buffer.clone());
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
        buffer.modify(self.tid, |data| data[offset..offset + bytes.len()].copy_from_slice(bytes));
    }

    /// get_write_access + change + dirty_metadata in one call.
    pub fn modify<R>(&mut self, buffer: &Arc<Buffer>, f: impl FnOnce(&mut [u8]) -> R) -> Result<R> {
        self.get_write_access(buffer)?;
        let result = buffer.modify(self.tid, f);
        self.dirty_metadata(buffer)?;
        Ok(result)
    }

    /// Revokes `block`: no copy of it logged in this or an earlier transaction will be replayed,
    /// and no older version is written home once the revoke is durable. The caller must not
    /// reuse the block for unjournaled data until this transaction is durable.
    pub fn revoke(&mut self, block: u64) -> Result<()> {
        self.check_block_fits(block)?;
        if self.used == self.credits {
            return Err(JournalError::CreditsExhausted { tid: self.tid, credits: self.credits });
        }
        let mut st = self.shared.state.lock();
        st.aborted()?;
        let txn = st.txn_mut(self.tid).expect("a handle's transaction is open");
        if !txn.revokes.insert(block) {
            return Ok(());
        }
        self.used += 1;
        stats::add(&self.shared.counters.revokes, 1);
        if let Some(buffer) = self.shared.cache.get(block) {
            let mut inner = buffer.lock();
            if inner.listed == Some(self.tid) {
                // JBD2 forget: the block is being freed, so its new contents are not logged.
                inner.listed = None;
                txn.buffers.retain(|b| !Arc::ptr_eq(b, &buffer));
            }
        }
        Ok(())
    }

    /// Registers data that must be durable before this transaction's commit block.
    pub fn add_ordered_data(&self, data: Arc<dyn OrderedData>) -> Result<()> {
        let mut st = self.shared.state.lock();
        st.aborted()?;
        st.txn_mut(self.tid).expect("a handle's transaction is open").ordered.push(data);
        Ok(())
    }

    /// Ends the handle; returns its transaction id.
    pub fn stop(mut self) -> Result<Tid> {
        self.release();
        self.shared.state.lock().aborted()?;
        Ok(self.tid)
    }

    fn release(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        let mut st = self.shared.state.lock();
        let unused = self.credits - self.used;
        let txn = st.txn_mut(self.tid).expect("a handle's transaction is open");
        txn.credits -= unused;
        txn.log_reserved = self.shared.log_blocks_bound(txn.credits);
        txn.updates -= 1;
        let last_out = txn.updates == 0;
        drop(st);
        if last_out {
            self.shared.commit_wake.notify_all();
        }
        if unused > 0 {
            // Returned credits may let a waiting handle in.
            self.shared.changed.notify_all();
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.release();
    }
}
