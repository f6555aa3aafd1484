//! Compound transactions and their life cycle (DESIGN.md §3.2).
//!
//! `Running → Locked → Committing → Written → Durable → (checkpointed, dropped)`
//!
//! | state | meaning | who moves it on |
//! |---|---|---|
//! | Running | handles join it and modify its buffers | commit stage, when asked to commit |
//! | Locked | no new handles; waits for open handles (and, without coalescing, for conflicts) | commit stage, when `updates == 0` |
//! | Committing | versions frozen; ordered data, then log blocks being written | commit stage |
//! | Written | log blocks complete, commit block not yet durable | flush stage |
//! | Durable | a flush covered its log blocks and its commit block is durable: fsync returns | checkpoint |
//!
//! Every transition asserts the state it leaves. All fields are guarded by the journal's state
//! lock; the buffer list is moved out to the commit stage once the transaction is Committing.

use crate::buffer::Buffer;
use crate::ordered::OrderedData;
use ondisk::Tid;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnState {
    Running,
    Locked,
    Committing,
    Written,
    Durable,
}

pub(crate) struct Transaction {
    pub tid: Tid,
    pub state: TxnState,
    /// Handles started and not yet stopped.
    pub updates: u32,
    /// Credits reserved by open handles plus credits used by stopped ones.
    pub credits: u32,
    pub handles: u32,
    pub buffers: Vec<Arc<Buffer>>,
    pub revokes: HashSet<u64>,
    pub ordered: Vec<Arc<dyn OrderedData>>,
    /// Buffers that had `versions_max` in-flight versions when this transaction took them:
    /// it cannot freeze its own version of them until an older one becomes durable.
    pub conflicts: Vec<Arc<Buffer>>,
    /// Log blocks reserved for this transaction before it was allocated (its worst case while
    /// Running, its exact size once Committing), 0 once allocated.
    pub log_reserved: u32,
    /// First log block and block count, once allocated.
    pub log_start: Option<u32>,
    pub log_blocks: u32,
    /// Number of metadata blocks it logged (kept after `buffers` moves to checkpointing).
    pub blocks_logged: u32,
    /// Compat-CHECKSUM (v1) crc of the descriptor and data blocks, for the commit block.
    pub v1_crc: Option<u32>,
    pub started_at: Instant,
    pub locked_at: Option<Instant>,
    pub committing_at: Option<Instant>,
    pub written_at: Option<Instant>,
}

impl Transaction {
    pub fn new(tid: Tid) -> Self {
        Transaction {
            tid,
            state: TxnState::Running,
            updates: 0,
            credits: 0,
            handles: 0,
            buffers: Vec::new(),
            revokes: HashSet::new(),
            ordered: Vec::new(),
            conflicts: Vec::new(),
            log_reserved: 0,
            log_start: None,
            log_blocks: 0,
            blocks_logged: 0,
            v1_crc: None,
            started_at: Instant::now(),
            locked_at: None,
            committing_at: None,
            written_at: None,
        }
    }

    /// Moves to `to`, asserting the transaction is in the only state `to` may follow.
    pub fn transition(&mut self, to: TxnState) {
        use TxnState::*;
        let from_ok = match to {
            Running => self.state == Locked, // a locked transaction reopened by coalescing
            Locked => self.state == Running,
            Committing => self.state == Locked,
            Written => self.state == Committing,
            Durable => self.state == Written,
        };
        assert!(from_ok, "{:?}: illegal transition {:?} -> {to:?}", self.tid, self.state);
        let now = Instant::now();
        match to {
            Locked => self.locked_at = Some(now),
            Committing => self.committing_at = Some(now),
            Written => self.written_at = Some(now),
            Running | Durable => {}
        }
        self.state = to;
    }

    /// Conflicting buffers that still have `versions_max` in-flight versions.
    pub fn conflicts_pending(&self, versions_max: usize) -> bool {
        self.conflicts.iter().any(|b| b.lock().versions.len() >= versions_max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transaction_walks_the_whole_life_cycle() {
        let mut t = Transaction::new(Tid(7));
        for to in [TxnState::Locked, TxnState::Committing, TxnState::Written, TxnState::Durable] {
            t.transition(to);
        }
        assert_eq!(t.state, TxnState::Durable);
    }

    #[test]
    fn coalescing_may_reopen_a_locked_transaction() {
        let mut t = Transaction::new(Tid(1));
        t.transition(TxnState::Locked);
        t.transition(TxnState::Running);
        assert_eq!(t.state, TxnState::Running);
    }

    #[test]
    #[should_panic(expected = "illegal transition")]
    fn skipping_a_state_is_a_bug() {
        let mut t = Transaction::new(Tid(1));
        t.transition(TxnState::Committing);
    }
}
