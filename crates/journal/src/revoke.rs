//! The recovery revoke table (JBD2 revoke.c, recovery side).
//!
//! PASS_REVOKE records, for every revoked block, the newest tid that revoked it. PASS_REPLAY
//! then skips a block logged in transaction `t` if a revoke with tid `r` exists and `t` is not
//! after `r` (`jbd2_journal_test_revoke`: revoked unless `tid_gt(t, r)`). Tids wrap, so "newest"
//! is by wrap-around comparison.

use ondisk::Tid;
use std::collections::HashMap;

#[derive(Debug, Default, Clone)]
pub struct RevokeTable {
    newest: HashMap<u64, Tid>,
}

impl RevokeTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that `tid` revoked `block`, keeping the newest revoking tid.
    pub fn set(&mut self, block: u64, tid: Tid) {
        self.newest
            .entry(block)
            .and_modify(|r| {
                if tid.is_after(*r) {
                    *r = tid;
                }
            })
            .or_insert(tid);
    }

    /// Whether a copy of `block` logged in transaction `logged_in` must not be replayed.
    pub fn is_revoked(&self, block: u64, logged_in: Tid) -> bool {
        self.newest.get(&block).is_some_and(|&r| !logged_in.is_after(r))
    }

    pub fn len(&self) -> usize {
        self.newest.len()
    }

    pub fn is_empty(&self) -> bool {
        self.newest.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revoke_covers_its_own_and_earlier_transactions_only() {
        let mut table = RevokeTable::new();
        table.set(100, Tid(5));
        assert!(table.is_revoked(100, Tid(4)));
        assert!(table.is_revoked(100, Tid(5)));
        assert!(!table.is_revoked(100, Tid(6)));
        assert!(!table.is_revoked(101, Tid(1)));
    }

    #[test]
    fn revoke_table_keeps_the_newest_tid_across_wrap_around() {
        let mut table = RevokeTable::new();
        table.set(7, Tid(2)); // issued after u32::MAX wrapped
        table.set(7, Tid(u32::MAX - 1));
        assert!(table.is_revoked(7, Tid(1)));
        assert!(table.is_revoked(7, Tid(u32::MAX)));
        assert!(!table.is_revoked(7, Tid(3)));
        assert_eq!(table.len(), 1);
    }

    #[test]
    fn many_revoked_blocks_hash_independently() {
        let mut table = RevokeTable::new();
        for block in 0..10_000u64 {
            table.set(block * 7919, Tid(block as u32 % 13));
        }
        for block in 0..10_000u64 {
            let tid = Tid(block as u32 % 13);
            assert!(table.is_revoked(block * 7919, tid));
            assert!(!table.is_revoked(block * 7919, tid.next()));
        }
    }
}
