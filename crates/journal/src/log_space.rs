//! The circular log area and its accounting.
//!
//! Log blocks are journal-relative numbers in `[first, end)`, where `end` is JBD2's `j_last`
//! (the fast-commit area, if any, lies beyond it and is never used by the log). `tail` is the
//! first block still needed by recovery (the oldest transaction not yet checkpointed); `head`
//! is where the next transaction's blocks go. `used` counts blocks from `tail` to `head`, so a
//! full log and an empty log are told apart without sacrificing a block.
//!
//! | event | head | tail | used |
//! |---|---|---|---|
//! | commit allocates n blocks | += n (wraps at `end` to `first`) | — | += n |
//! | checkpoint frees a transaction of n blocks | — | moves to the next transaction | -= n |
//! | everything checkpointed | — | = head | 0 |

/// Head, tail and usage of the log area. Invariant: `used == distance(tail, head)` modulo the
/// area, and `used <= capacity`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSpace {
    first: u32,
    end: u32,
    head: u32,
    tail: u32,
    used: u32,
}

impl LogSpace {
    /// An empty log over `[first, end)` whose head and tail start at `start`.
    pub fn new(first: u32, end: u32, start: u32) -> Self {
        assert!(first < end, "log area [{first}, {end}) is empty");
        assert!((first..end).contains(&start), "log start {start} outside [{first}, {end})");
        LogSpace { first, end, head: start, tail: start, used: 0 }
    }

    pub fn capacity(&self) -> u32 {
        self.end - self.first
    }
    pub fn used(&self) -> u32 {
        self.used
    }
    pub fn free(&self) -> u32 {
        self.capacity() - self.used
    }
    pub fn head(&self) -> u32 {
        self.head
    }
    pub fn tail(&self) -> u32 {
        self.tail
    }

    /// The log block `n` blocks after `block`, wrapping at `end` (JBD2's `wrap()`).
    pub fn advance(&self, block: u32, n: u32) -> u32 {
        debug_assert!((self.first..self.end).contains(&block));
        let offset = (block - self.first) as u64 + n as u64;
        self.first + (offset % self.capacity() as u64) as u32
    }

    /// Takes `n` blocks at the head; returns the first of them.
    pub fn allocate(&mut self, n: u32) -> u32 {
        assert!(n <= self.free(), "allocating {n} log blocks with only {} free", self.free());
        let start = self.head;
        self.head = self.advance(self.head, n);
        self.used += n;
        start
    }

    /// Releases the `n` oldest blocks: the tail moves forward by `n`.
    pub fn release(&mut self, n: u32) {
        assert!(n <= self.used, "releasing {n} log blocks with only {} used", self.used);
        self.tail = self.advance(self.tail, n);
        self.used -= n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_wraps_at_the_end_of_the_log_area() {
        let mut log = LogSpace::new(1, 11, 8); // ten blocks, head near the end
        assert_eq!(log.allocate(2), 8);
        assert_eq!(log.allocate(3), 10); // occupies 10, 1, 2
        assert_eq!(log.head(), 3);
        assert_eq!(log.used(), 5);
        assert_eq!(log.free(), 5);
        log.release(2);
        assert_eq!(log.tail(), 10);
        log.release(3);
        assert_eq!((log.tail(), log.head(), log.used()), (3, 3, 0));
    }

    #[test]
    fn a_full_log_is_distinguished_from_an_empty_one() {
        let mut log = LogSpace::new(1, 5, 1);
        log.allocate(4);
        assert_eq!(log.head(), log.tail());
        assert_eq!(log.free(), 0);
        log.release(4);
        assert_eq!(log.head(), log.tail());
        assert_eq!(log.free(), 4);
    }

    #[test]
    #[should_panic(expected = "only 1 free")]
    fn allocating_more_than_free_space_is_a_bug() {
        let mut log = LogSpace::new(1, 5, 1);
        log.allocate(3);
        log.allocate(2);
    }

    #[test]
    fn advance_wraps_any_distance() {
        let log = LogSpace::new(3, 8, 3);
        assert_eq!(log.advance(7, 1), 3);
        assert_eq!(log.advance(5, 12), 7);
    }
}
