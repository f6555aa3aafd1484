//! S1 lock-free lists (`lists=lockfree`; FAST'18, Son et al., §3.1.1): the list a running
//! transaction files its buffers on (JBD2's `t_buffers`), the checkpoint list of a committed
//! transaction (`t_checkpoint_list`) and the journal's list of transactions, updated by many
//! threads without `j_list_lock`.
//!
//! An [`LfList`] is a non-circular singly linked list with a head, a tail hint and a claim
//! cursor. Four operations run concurrently from any number of threads through `&self`:
//!
//! | operation | paper | how | linearizes at |
//! |---|---|---|---|
//! | [`push`](LfList::push) | INSERT | CAS the last node's `next` from null to the new node (the head if empty) | that CAS |
//! | [`mark_removed`](LfList::mark_removed) | REMOVE, first phase | set the node's REMOVED bit (`fetch_or`) | that `fetch_or` |
//! | [`claim`](LfList::claim) | FETCH | CAS a node's state from 0 (live, unclaimed) to CLAIMED | that CAS |
//! | [`iter`](LfList::iter) | traversal | follow `next` pointers, skip REMOVED nodes | each node's state load |
//!
//! and three need `&mut self`, which is the paper's *safe point* (the transaction is locked and
//! has no handles, or one thread owns it): [`collect_garbage`](LfList::collect_garbage) (REMOVE,
//! second phase: unlink and free the removed nodes), [`drain`](LfList::drain) and `Drop`.
//!
//! A node's state only gains bits: 0 → CLAIMED, 0 → REMOVED, CLAIMED → CLAIMED|REMOVED. So a
//! node is claimed at most once (one CAS from 0 wins), removed at most once (one `fetch_or`
//! sees the bit clear), and a node removed before a claim looks at it is never claimed. A
//! claimed node stays live, visible to `iter`, until its claimer (or anyone) removes it: a
//! buffer being written by a committing thread is still part of the transaction, and a forget
//! that arrives during the write marks it removed, which the claimer sees after its I/O
//! (FAST'18 Procedure 3, line 28).
//!
//! Two departures from the paper, each for a reason:
//! - INSERT uses a CAS on the last node's `next` rather than the paper's exchange of the tail
//!   followed by a store to the old tail's `next`. With the exchange, a push that has returned
//!   can be unreachable from the head while an earlier push is between its two steps; JBD2
//!   tolerates that because commit waits for `t_updates == 0`, but the checkpoint and
//!   transaction lists are fed while others fetch from them. With the CAS a returned push is
//!   always reachable (the loom model `loom_push_is_visible_once_it_returns` checks exactly this).
//! - FETCH does not advance the head: it CASes the node's state, and a claim cursor (a hint:
//!   every node before it is already claimed or removed) keeps repeated claims from rescanning.
//!   The head stays put so that `iter` (the committing thread) runs concurrently with `claim`
//!   (checkpointing threads), and so every node stays reachable from the head until the safe
//!   point. That is what the paper's per-transaction GC list is for (fetched nodes are
//!   unreachable from its advanced head, so removed ones must be kept somewhere to be freed);
//!   here the list itself is the GC list, and `collect_garbage` frees its removed nodes.
//!
//! Memory reclamation is safe without epochs or hazard pointers because nothing reachable from
//! the list is freed while the list is shared: every `&self` operation only reads nodes and
//! only moves `head`, `tail`, the cursor and `next` pointers to nodes of the list, and nodes are
//! unlinked, their values dropped and the list's reference released only in `collect_garbage`,
//! `drain` and `Drop`, which hold `&mut self`. Holding `&mut self` means no `&self` borrow is
//! alive, so no `Iter`, `Claim` or `push`/`claim` in progress points into the list. The one
//! handle that outlives borrows, [`NodeRef`], counts as a reference on its node (as an `Arc`
//! does): a node's memory is freed by whoever drops the last of {the list's link, the
//! `NodeRef`s}. A `NodeRef` never reads the value, only the node's state, so the list drops the
//! value when it unlinks the node, and a buffer holding the `NodeRef` of a list that holds the
//! buffer forms no cycle.
//!
//! Invariants (asserted in `collect_garbage` and the tests):
//! - `head` is null or the first node; following `next` from it reaches every linked node once.
//! - `tail` is null or a linked node: a hint pushes walk on from (from the head when null).
//! - `claim_cursor` is null or a linked node, and every node before it has a nonzero state.
//! - A linked node holds its value and one reference for the list; an unlinked node has REMOVED
//!   set and no value.
//! - `live` is the number of linked nodes without REMOVED (exact whenever no `&self` operation
//!   is running, for example under `&mut self`).
//!
//! Loops: `push` retries its CAS once per concurrent push that beat it and walks at most as far
//! as the tail hint lags (bounded by the number of concurrent pushes); `claim` and `iter` walk
//! at most the list once. Nothing spins waiting for another thread.

// The engine's transaction lists use push, remove_first, iter and take_live (transaction.rs's
// `TxnList::LockFree`); claim, NodeRef removal, collect_garbage and drain serve the tests, the
// benchmark and the cooperative paths that may fetch from these lists later.
#![allow(dead_code)]

use crate::sync::{AtomicPtr, AtomicU32, AtomicUsize, Ordering};
use std::cell::UnsafeCell;
use std::fmt;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::ptr::{self, NonNull};

/// A node's state bit: handed to one claimer by [`LfList::claim`].
const STATE_CLAIMED: u32 = 1;
/// A node's state bit: logically removed (first phase); unlinked at the next safe point.
const STATE_REMOVED: u32 = 2;

/// References a fresh node starts with: the list's link and the [`NodeRef`] `push` returns.
const NODE_REFS_INITIAL: usize = 2;
/// Beyond this many references a `NodeRef` clone panics instead of risking an overflow (as
/// `Arc` does): no engine keeps more than a handful per node.
const NODE_REFS_MAX: usize = isize::MAX as usize;

/// Source of list identities, so `mark_removed` can assert a [`NodeRef`] is its own. A plain std
/// atomic even under loom: it is read once per list construction, outside every race modelled.
static LIST_ID_NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

struct Node<T> {
    /// Present while the node is linked; taken or dropped under `&mut LfList` when it is
    /// unlinked. [only read through `&LfList`; written under `&mut LfList`]
    value: UnsafeCell<ManuallyDrop<T>>,
    /// The next node, or null at the end. [atomic; changed from null under `&LfList`, any
    /// change under `&mut LfList`]
    next: AtomicPtr<Node<T>>,
    /// `STATE_CLAIMED | STATE_REMOVED` bits; bits are only ever added. [atomic]
    state: AtomicU32,
    /// The list's link (while linked) plus one per live `NodeRef`. [atomic]
    refs: AtomicUsize,
    /// The owning list's identity. [immutable]
    list_id: u64,
}

// SAFETY: a shared `Node` hands out `&T` (through `&LfList`) and atomics only; its value is
// taken or dropped only by whoever has exclusive access to the list. So sharing a node across
// threads shares `&T`, which `T: Sync` permits. `Send` follows from the fields (`T: Send`).
unsafe impl<T: Sync> Sync for Node<T> {}

impl<T> Node<T> {
    fn is_live(&self) -> bool {
        self.state.load(Ordering::Acquire) & STATE_REMOVED == 0
    }

    /// The node's value.
    ///
    /// # Safety
    /// The node must be linked into a list the caller borrows shared for as long as the result
    /// lives: the value is only taken under `&mut` of that list.
    unsafe fn value(&self) -> &T {
        // SAFETY: per the contract the value is present and nobody mutates it meanwhile.
        unsafe { &*self.value.get() }
    }
}

/// Drops one reference to `node`, freeing its memory if it was the last.
///
/// # Safety
/// The caller owns one of the node's references and gives it up. If the list's link reference
/// is among the remaining ones, the value must still be present; if not, it must be gone (the
/// list takes the value before releasing its link, so this holds for every caller here).
unsafe fn node_release<T>(node: NonNull<Node<T>>) {
    // SAFETY: the caller's reference keeps the node allocated until this decrement.
    let refs_before = unsafe { node.as_ref() }.refs.fetch_sub(1, Ordering::AcqRel);
    assert!(refs_before >= 1, "node reference count underflow");
    if refs_before == 1 {
        // SAFETY: that was the last reference; AcqRel orders every earlier use before this
        // free. The value is `ManuallyDrop` and already gone, so only memory is released.
        drop(unsafe { Box::from_raw(node.as_ptr()) });
    }
}

/// The node behind a pointer loaded from a list's `head`, `tail`, cursor or a `next` field.
///
/// # Safety
/// `ptr` must be null or a node linked into a list the caller borrows (shared or exclusive) for
/// `'a`; nodes leave a list only under `&mut`, so such a node outlives the borrow.
unsafe fn node_at<'a, T>(ptr: *mut Node<T>) -> Option<&'a Node<T>> {
    // SAFETY: per the contract, non-null means allocated and initialized for 'a (the Acquire
    // load that produced `ptr` synchronized with the Release CAS that published it).
    unsafe { ptr.as_ref() }
}

/// A lock-free, non-circular singly linked list: concurrent push, logical removal, claim and
/// iteration through `&self`; physical removal at the safe point through `&mut self`. See the
/// module documentation for the protocol and why reclamation is safe.
pub(crate) struct LfList<T> {
    /// First node, or null. [atomic; null → first under `&self`, anything under `&mut self`]
    head: AtomicPtr<Node<T>>,
    /// Hint: a linked node at or before the last one, or null. Only moves forward under
    /// `&self`. [atomic]
    tail: AtomicPtr<Node<T>>,
    /// Hint: null (start at the head) or a linked node; every node before it has a nonzero
    /// state. Only moves forward under `&self`. [atomic]
    claim_cursor: AtomicPtr<Node<T>>,
    /// Linked nodes without `STATE_REMOVED`. [atomic; exact under `&mut self`]
    live: AtomicUsize,
    /// This list's identity, written into its nodes. [immutable]
    id: u64,
    /// The list owns `T`s (drop check, and `Send`/`Sync` are written out below).
    _owns: PhantomData<T>,
}

// SAFETY: moving the list moves ownership of its `T`s, which are dropped or drained wherever the
// list ends up: `T: Send` is what that needs.
unsafe impl<T: Send> Send for LfList<T> {}
// SAFETY: through `&LfList` threads push `T`s that another thread later drops or drains (needs
// `T: Send`) and read `&T` concurrently (needs `T: Sync`); all shared mutation is atomic.
unsafe impl<T: Send + Sync> Sync for LfList<T> {}

impl<T> Default for LfList<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for LfList<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LfList").field("id", &self.id).field("live", &self.len()).finish()
    }
}

impl<T> LfList<T> {
    pub(crate) fn new() -> Self {
        let id = LIST_ID_NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        assert!(id != 0 && id != u64::MAX, "list identities exhausted");
        LfList {
            head: AtomicPtr::new(ptr::null_mut()),
            tail: AtomicPtr::new(ptr::null_mut()),
            claim_cursor: AtomicPtr::new(ptr::null_mut()),
            live: AtomicUsize::new(0),
            id,
            _owns: PhantomData,
        }
    }

    /// Appends `value` at the end of the list and returns a handle for removing it later.
    ///
    /// Concurrency: lock-free, callable from any number of threads at once and concurrently
    /// with every other `&self` method. Once it returns, the node is reachable from the head, so
    /// any `iter` or `claim` that starts after (happens-after) the return sees it. Nodes pushed
    /// by one thread keep that thread's order; concurrent pushes from different threads are
    /// ordered by whose CAS won.
    pub(crate) fn push(&self, value: T) -> NodeRef<T> {
        let node = NonNull::from(Box::leak(Box::new(Node {
            value: UnsafeCell::new(ManuallyDrop::new(value)),
            next: AtomicPtr::new(ptr::null_mut()),
            state: AtomicU32::new(0),
            refs: AtomicUsize::new(NODE_REFS_INITIAL),
            list_id: self.id,
        })));
        // Counted before the node is reachable, so a claimer that removes it at once never
        // takes `live` below zero.
        self.live.fetch_add(1, Ordering::Relaxed);
        let tail_seen = self.tail.load(Ordering::Acquire);
        let mut at = tail_seen;
        loop {
            if at.is_null() {
                match self.head.compare_exchange(
                    ptr::null_mut(),
                    node.as_ptr(),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => break,
                    Err(first) => at = first,
                }
                continue;
            }
            // SAFETY: `at` came from `tail`, `head` or a `next` field of this list, which we
            // borrow: it is linked and stays allocated.
            let last = unsafe { node_at(at) }.expect("non-null");
            match last.next.compare_exchange(
                ptr::null_mut(),
                node.as_ptr(),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(next) => at = next,
            }
        }
        // Best effort: if another push moved the tail meanwhile, it moved it forward already.
        let _ = self.tail.compare_exchange(
            tail_seen,
            node.as_ptr(),
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
        NodeRef { node }
    }

    /// Logically removes `node` (first phase of REMOVE): it disappears from `iter`, `claim` and
    /// `len` now and is freed at the next `collect_garbage`. Returns true if this call removed
    /// it, false if it was already removed (by another call, a claimer, or because the list has
    /// since been drained or collected).
    ///
    /// Concurrency: lock-free (one `fetch_or`), callable from any thread concurrently with
    /// everything through `&self`. Of any number of concurrent calls on one node exactly one
    /// returns true. A claimed node can still be removed (a forget during its write-out); its
    /// claimer sees it with [`Claim::is_removed`].
    ///
    /// Panics if `node` belongs to another list.
    pub(crate) fn mark_removed(&self, node: &NodeRef<T>) -> bool {
        let node = node.node();
        assert_eq!(node.list_id, self.id, "mark_removed with another list's node");
        self.mark_removed_node(node)
    }

    fn mark_removed_node(&self, node: &Node<T>) -> bool {
        let state_before = node.state.fetch_or(STATE_REMOVED, Ordering::AcqRel);
        assert_eq!(state_before & !(STATE_CLAIMED | STATE_REMOVED), 0, "corrupt node state");
        if state_before & STATE_REMOVED != 0 {
            return false;
        }
        let live_before = self.live.fetch_sub(1, Ordering::Relaxed);
        assert!(live_before >= 1, "live count underflow");
        true
    }

    /// Removes the first live node whose value `matches` accepts (JBD2's forget of a buffer on
    /// a running transaction's list); whether one was removed by this call.
    ///
    /// Concurrency: as [`mark_removed`](Self::mark_removed), for a node found by walking the
    /// list: of concurrent calls that pick the same node, one removes it and the others go on
    /// to the next match.
    pub(crate) fn remove_first(&self, matches: impl Fn(&T) -> bool) -> bool {
        // SAFETY: `head` of this borrowed list, then `next` fields of its linked nodes.
        let mut at = unsafe { node_at(self.head.load(Ordering::Acquire)) };
        while let Some(node) = at {
            // SAFETY: a linked node of the borrowed list: its value stays until `&mut self`.
            if node.is_live() && matches(unsafe { node.value() }) && self.mark_removed_node(node) {
                return true;
            }
            // SAFETY: as above.
            at = unsafe { node_at(node.next.load(Ordering::Acquire)) };
        }
        false
    }

    /// Removes every live node and returns a copy of each value, in list order (the commit
    /// takes a locked transaction's list; its nodes are freed when the list is dropped or
    /// collected).
    ///
    /// Concurrency: a node pushed or removed concurrently may or may not be taken; every value
    /// is returned by at most one `take_live` or `remove_first`.
    pub(crate) fn take_live(&self) -> Vec<T>
    where
        T: Clone,
    {
        let mut taken = Vec::with_capacity(self.len());
        // SAFETY: as in `remove_first`.
        let mut at = unsafe { node_at(self.head.load(Ordering::Acquire)) };
        while let Some(node) = at {
            if self.mark_removed_node(node) {
                // SAFETY: as in `remove_first`.
                taken.push(unsafe { node.value() }.clone());
            }
            // SAFETY: as in `remove_first`.
            at = unsafe { node_at(node.next.load(Ordering::Acquire)) };
        }
        taken
    }

    /// Fetches a live node no one has claimed yet and hands it to the caller alone (FETCH): of
    /// any number of concurrent claimers, each node goes to exactly one. Nodes come in push
    /// order as far as concurrent claims allow. Returns `None` when every node reachable when
    /// the claim looked was claimed or removed.
    ///
    /// A claim does not remove the node: it stays visible to `iter` until someone removes it,
    /// usually the claimer with [`Claim::remove`] once its write is done.
    ///
    /// Concurrency: lock-free, concurrent with everything through `&self`. A push that returned
    /// before the claim started is seen; a concurrent one may or may not be.
    pub(crate) fn claim(&self) -> Option<Claim<'_, T>> {
        let cursor_seen = self.claim_cursor.load(Ordering::Acquire);
        let mut at =
            if cursor_seen.is_null() { self.head.load(Ordering::Acquire) } else { cursor_seen };
        let mut last_seen = cursor_seen;
        // SAFETY: `at` came from the cursor, `head` or a `next` field of this borrowed list.
        while let Some(node) = unsafe { node_at(at) } {
            if node.state.load(Ordering::Relaxed) == 0
                && node
                    .state
                    .compare_exchange(0, STATE_CLAIMED, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                // Every node from the cursor up to this one had a nonzero state, and states
                // never return to 0, so this node is a valid cursor.
                self.claim_cursor_advance(cursor_seen, at);
                return Some(Claim { list: self, node });
            }
            last_seen = at;
            at = node.next.load(Ordering::Acquire);
        }
        if !last_seen.is_null() {
            self.claim_cursor_advance(cursor_seen, last_seen);
        }
        None
    }

    /// Moves the cursor from `from` to `to`, a node at or after it whose predecessors are all
    /// claimed or removed. If another claimer moved it first, theirs stands: either is valid.
    fn claim_cursor_advance(&self, from: *mut Node<T>, to: *mut Node<T>) {
        assert!(!to.is_null());
        if from != to {
            let _ =
                self.claim_cursor.compare_exchange(from, to, Ordering::AcqRel, Ordering::Relaxed);
        }
    }

    /// Visits the live (not removed) values in list order, claimed ones included.
    ///
    /// Concurrency: runs concurrently with everything through `&self`. It sees every push that
    /// returned before it started and may or may not see concurrent ones; a node removed
    /// concurrently may or may not be visited. It never visits a value twice.
    pub(crate) fn iter(&self) -> Iter<'_, T> {
        // SAFETY: `head` of this borrowed list.
        Iter { next: unsafe { node_at(self.head.load(Ordering::Acquire)) } }
    }

    /// The number of live (not removed) nodes. Exact when no `&self` operation is running (for
    /// example under `&mut self`); a snapshot that may lag concurrent ones otherwise.
    pub(crate) fn len(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    /// True when no live node is left; the same exactness as [`len`](Self::len).
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Second phase of REMOVE, at the safe point: unlinks every removed node, drops its value
    /// and frees it (at once, or when its last `NodeRef` goes). Claimed live nodes stay, still
    /// claimed. Returns how many nodes were unlinked.
    ///
    /// Concurrency: `&mut self` is the safe point: no other thread can be inside the list.
    pub(crate) fn collect_garbage(&mut self) -> usize {
        // Null hints first (always valid: pushes walk from the head, claims start there), so a
        // value whose drop panics below cannot leave a hint at a freed node.
        self.tail.store(ptr::null_mut(), Ordering::Relaxed);
        self.claim_cursor.store(ptr::null_mut(), Ordering::Relaxed);
        let mut unlinked = 0;
        let mut linked = 0;
        let mut prev: *mut Node<T> = ptr::null_mut();
        let mut at = self.head.load(Ordering::Relaxed);
        // SAFETY (each `node_at`): `at`/`prev` are linked nodes of this list, held exclusively.
        while let Some(node) = unsafe { node_at(at) } {
            let next = node.next.load(Ordering::Relaxed);
            if node.is_live() {
                linked += 1;
                prev = at;
            } else {
                match unsafe { node_at(prev) } {
                    None => self.head.store(next, Ordering::Relaxed),
                    Some(prev_node) => prev_node.next.store(next, Ordering::Relaxed),
                }
                // SAFETY: `at` was linked and is now unreachable from the list, held
                // exclusively; the `&Node` above is not used past this point.
                drop(unsafe { Self::node_unlinked(at) });
                unlinked += 1;
            }
            at = next;
        }
        self.tail.store(prev, Ordering::Relaxed);
        assert_eq!(linked, self.len(), "live count disagrees with the list");
        unlinked
    }

    /// Moves every live value out in list order (claimed ones included) and frees every node,
    /// leaving the list empty. Values of removed nodes are dropped. Dropping the iterator early
    /// drops the rest.
    ///
    /// Concurrency: `&mut self`, the safe point. `NodeRef`s of drained nodes report removed.
    pub(crate) fn drain(&mut self) -> Drain<'_, T> {
        let first = self.head.swap(ptr::null_mut(), Ordering::Relaxed);
        self.tail.store(ptr::null_mut(), Ordering::Relaxed);
        self.claim_cursor.store(ptr::null_mut(), Ordering::Relaxed);
        self.live.store(0, Ordering::Relaxed);
        Drain { next: first, _list: PhantomData }
    }

    /// Takes the value of a node that was just made unreachable from its list, marks it removed
    /// (for its `NodeRef`s) and releases the list's reference. Returns the value and whether the
    /// node was live.
    ///
    /// # Safety
    /// `node` was linked into a list the caller holds exclusively and is now unreachable from
    /// it; the caller holds no reference into the node.
    unsafe fn node_unlinked(node: *mut Node<T>) -> (T, bool) {
        let node = NonNull::new(node).expect("unlinked node is not null");
        // SAFETY: still allocated: the list's reference is released only below.
        let node_ref = unsafe { node.as_ref() };
        let state_before = node_ref.state.fetch_or(STATE_REMOVED, Ordering::AcqRel);
        // SAFETY: exclusive access to the list means no `&T` into this value exists, and a
        // linked node always holds its value; it is taken exactly once, here.
        let value = unsafe { ManuallyDrop::take(&mut *node_ref.value.get()) };
        // SAFETY: gives up the list's reference, after the value is gone.
        unsafe { node_release(node) };
        (value, state_before & STATE_REMOVED == 0)
    }
}

impl<T> Drop for LfList<T> {
    fn drop(&mut self) {
        self.drain().for_each(drop);
    }
}

/// A counted handle on one node, returned by [`LfList::push`], for removing the node later
/// ([`LfList::mark_removed`]) from any thread. It keeps the node's memory (not its value)
/// alive, so it may outlive the node's place in the list and even the list; it never gives
/// access to the value.
pub(crate) struct NodeRef<T> {
    node: NonNull<Node<T>>,
}

// SAFETY: a `NodeRef` only touches the node's atomics, and dropping the last one frees memory
// whose value the list has already taken (`node_release`'s contract); no `T` is ever reached.
unsafe impl<T> Send for NodeRef<T> {}
// SAFETY: as for `Send`: shared use is atomic loads only.
unsafe impl<T> Sync for NodeRef<T> {}

impl<T> NodeRef<T> {
    fn node(&self) -> &Node<T> {
        // SAFETY: this handle owns one of the node's references, so the node is allocated; only
        // its atomics and immutable `list_id` are read through the result.
        unsafe { self.node.as_ref() }
    }

    /// True once the node was removed (by `mark_removed`, `Claim::remove`, or because its list
    /// was drained, collected or dropped). Never goes back to false.
    pub(crate) fn is_removed(&self) -> bool {
        !self.node().is_live()
    }
}

impl<T> Clone for NodeRef<T> {
    fn clone(&self) -> Self {
        let refs_before = self.node().refs.fetch_add(1, Ordering::Relaxed);
        assert!((1..NODE_REFS_MAX).contains(&refs_before), "node reference count");
        NodeRef { node: self.node }
    }
}

impl<T> Drop for NodeRef<T> {
    fn drop(&mut self) {
        // SAFETY: gives up this handle's reference. If the list's link remains, it still owns
        // the value; if not, the list already took it.
        unsafe { node_release(self.node) };
    }
}

impl<T> fmt::Debug for NodeRef<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeRef").field("removed", &self.is_removed()).finish()
    }
}

/// A node handed to one claimer by [`LfList::claim`]; derefs to its value. Dropping it leaves
/// the node claimed and live: call [`remove`](Self::remove) when the node's work is done.
pub(crate) struct Claim<'a, T> {
    list: &'a LfList<T>,
    node: &'a Node<T>,
}

impl<'a, T> Claim<'a, T> {
    /// The claimed value, for as long as the list is borrowed.
    pub(crate) fn value(&self) -> &'a T {
        // SAFETY: the node was linked when claimed and `self.list` is borrowed for 'a.
        unsafe { self.node.value() }
    }

    /// True if the node was removed since (or by) this claim, for example by a forget that
    /// arrived while the claimer was writing it.
    pub(crate) fn is_removed(&self) -> bool {
        !self.node.is_live()
    }

    /// Removes the claimed node, as [`LfList::mark_removed`]; false if someone removed it
    /// first.
    pub(crate) fn remove(&self) -> bool {
        self.list.mark_removed_node(self.node)
    }
}

impl<T> Deref for Claim<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        self.value()
    }
}

/// Iterator over the live values of an [`LfList`], from [`LfList::iter`].
pub(crate) struct Iter<'a, T> {
    next: Option<&'a Node<T>>,
}

impl<'a, T> Iterator for Iter<'a, T> {
    type Item = &'a T;

    fn next(&mut self) -> Option<&'a T> {
        while let Some(node) = self.next {
            // SAFETY: `next` of a linked node of the list this iterator borrows for 'a.
            self.next = unsafe { node_at(node.next.load(Ordering::Acquire)) };
            if node.is_live() {
                // SAFETY: linked node of the list borrowed for 'a.
                return Some(unsafe { node.value() });
            }
        }
        None
    }
}

/// Draining iterator from [`LfList::drain`]: owns the detached chain of nodes.
pub(crate) struct Drain<'a, T> {
    next: *mut Node<T>,
    _list: PhantomData<&'a mut LfList<T>>,
}

impl<T> Iterator for Drain<'_, T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        while !self.next.is_null() {
            let at = self.next;
            // SAFETY: the detached chain is owned by this iterator alone (taken under `&mut`);
            // `at` is its first node, still allocated.
            self.next = unsafe { node_at(at) }.expect("non-null").next.load(Ordering::Relaxed);
            // SAFETY: `at` is unreachable now: the list was emptied and the chain moved past it.
            let (value, was_live) = unsafe { LfList::node_unlinked(at) };
            if was_live {
                return Some(value);
            }
            drop(value);
        }
        None
    }
}

impl<T> Drop for Drain<'_, T> {
    fn drop(&mut self) {
        self.for_each(drop);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use std::collections::HashSet;
    use std::sync::atomic::AtomicUsize as StdAtomicUsize;
    use std::sync::{Arc, Mutex};

    /// Counts its drops, to check every value is dropped exactly once.
    struct Counted(u64, Arc<StdAtomicUsize>);

    impl Drop for Counted {
        fn drop(&mut self) {
            self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    fn values(list: &LfList<u64>) -> Vec<u64> {
        list.iter().copied().collect()
    }

    fn claim_all(list: &LfList<u64>) -> Vec<u64> {
        std::iter::from_fn(|| list.claim().map(|claim| *claim)).collect()
    }

    #[test]
    fn remove_first_forgets_one_match_and_take_live_empties_the_list_once() {
        let list = LfList::new();
        for value in [1u64, 2, 3, 2] {
            list.push(value);
        }
        assert!(list.remove_first(|v| *v == 2));
        assert_eq!(values(&list), vec![1, 3, 2]);
        assert!(list.remove_first(|v| *v == 2));
        assert!(!list.remove_first(|v| *v == 2));
        assert_eq!(list.take_live(), vec![1, 3]);
        assert!(list.is_empty());
        assert!(list.take_live().is_empty(), "a value is taken once");
        // Concurrent takers split the values between them, none twice.
        let list = LfList::new();
        for value in 0..2000u64 {
            list.push(value);
        }
        let taken: Vec<Vec<u64>> = std::thread::scope(|scope| {
            let takers: Vec<_> = (0..4).map(|_| scope.spawn(|| list.take_live())).collect();
            takers.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let mut all: Vec<u64> = taken.into_iter().flatten().collect();
        all.sort_unstable();
        assert_eq!(all, (0..2000).collect::<Vec<_>>());
    }

    #[test]
    fn push_keeps_order_and_iter_visits_every_live_value() {
        let list = LfList::new();
        assert!(list.is_empty());
        assert_eq!(values(&list), Vec::<u64>::new());
        for value in 0..5 {
            list.push(value);
        }
        assert_eq!(values(&list), vec![0, 1, 2, 3, 4]);
        assert_eq!(list.len(), 5);
    }

    #[test]
    fn mark_removed_succeeds_once_and_hides_the_value() {
        let list = LfList::new();
        let nodes: Vec<_> = (0..4).map(|value| list.push(value)).collect();
        assert!(list.mark_removed(&nodes[1]));
        assert!(!list.mark_removed(&nodes[1]), "a node is removed once");
        assert!(nodes[1].is_removed());
        assert!(!nodes[0].is_removed());
        assert!(list.mark_removed(&nodes[3]));
        assert_eq!(values(&list), vec![0, 2]);
        assert_eq!(list.len(), 2);
    }

    #[test]
    fn claim_hands_out_live_nodes_once_in_push_order_and_never_removed_ones() {
        let list = LfList::new();
        let nodes: Vec<_> = (0..6).map(|value| list.push(value)).collect();
        list.mark_removed(&nodes[0]);
        list.mark_removed(&nodes[3]);
        assert_eq!(claim_all(&list), vec![1, 2, 4, 5]);
        assert!(list.claim().is_none(), "every live node was claimed");
        list.push(6);
        assert_eq!(claim_all(&list), vec![6], "a later push is claimable");
    }

    #[test]
    fn claimed_node_stays_live_until_its_claimer_removes_it() {
        let list = LfList::new();
        let node = list.push(7u64);
        let claim = list.claim().expect("one live node");
        assert_eq!(*claim, 7);
        assert_eq!(values(&list), vec![7], "claimed is still live");
        assert!(!claim.is_removed());
        assert!(claim.remove());
        assert!(claim.is_removed() && node.is_removed());
        assert!(!list.mark_removed(&node), "removed once, by the claimer");
        assert!(list.is_empty());
    }

    #[test]
    fn forget_during_write_out_is_seen_by_the_claimer() {
        let list = LfList::new();
        let node = list.push(1u64);
        let claim = list.claim().expect("claimable");
        assert!(list.mark_removed(&node), "a claimed node can still be forgotten");
        assert!(claim.is_removed());
        assert!(!claim.remove());
    }

    #[test]
    fn collect_garbage_unlinks_removed_nodes_and_keeps_claims() {
        let mut list = LfList::new();
        let nodes: Vec<_> = (0..6).map(|value| list.push(value)).collect();
        let first = list.claim().map(|claim| *claim);
        assert_eq!(first, Some(0));
        list.mark_removed(&nodes[1]);
        list.mark_removed(&nodes[4]);
        assert_eq!(list.collect_garbage(), 2);
        assert_eq!(list.collect_garbage(), 0);
        assert_eq!(values(&list), vec![0, 2, 3, 5]);
        assert_eq!(claim_all(&list), vec![2, 3, 5], "0 stays claimed after collection");
        assert!(!list.mark_removed(&nodes[4]), "a collected node reports removed");
        list.push(9);
        assert_eq!(values(&list), vec![0, 2, 3, 5, 9], "the tail is right after collection");
        list.mark_removed(&nodes[5]);
        list.mark_removed(&nodes[0]);
        list.mark_removed(&nodes[2]);
        list.collect_garbage();
        assert_eq!(values(&list), vec![3, 9]);
        list.push(10);
        assert_eq!(values(&list), vec![3, 9, 10]);
    }

    #[test]
    fn collect_garbage_of_every_node_leaves_a_usable_empty_list() {
        let mut list = LfList::new();
        let nodes: Vec<_> = (0..3).map(|value| list.push(value)).collect();
        nodes.iter().for_each(|node| assert!(list.mark_removed(node)));
        assert_eq!(list.collect_garbage(), 3);
        assert!(list.is_empty() && list.iter().next().is_none() && list.claim().is_none());
        list.push(4);
        assert_eq!(values(&list), vec![4]);
        assert_eq!(claim_all(&list), vec![4]);
    }

    #[test]
    fn drain_moves_live_values_in_order_and_drops_the_rest_once() {
        let drops = Arc::new(StdAtomicUsize::new(0));
        let mut list = LfList::new();
        let nodes: Vec<_> = (0..5).map(|value| list.push(Counted(value, drops.clone()))).collect();
        list.mark_removed(&nodes[2]);
        let _claim_leaves_it_live = list.claim().map(|claim| claim.0);
        let drained: Vec<u64> = list.drain().map(|value| value.0).collect();
        assert_eq!(drained, vec![0, 1, 3, 4]);
        assert_eq!(drops.load(std::sync::atomic::Ordering::SeqCst), 5);
        assert!(list.is_empty() && list.iter().next().is_none());
        assert!(nodes.iter().all(NodeRef::is_removed), "drained nodes report removed");
        assert!(!list.mark_removed(&nodes[0]));
        list.push(Counted(5, drops.clone()));
        assert_eq!(list.len(), 1);
    }

    #[test]
    fn dropping_a_partial_drain_drops_the_remaining_values() {
        let drops = Arc::new(StdAtomicUsize::new(0));
        let mut list = LfList::new();
        (0..4).for_each(|value| drop(list.push(Counted(value, drops.clone()))));
        let first = list.drain().next().map(|value| value.0);
        assert_eq!(first, Some(0));
        assert_eq!(drops.load(std::sync::atomic::Ordering::SeqCst), 4);
    }

    #[test]
    fn node_refs_outlive_the_list_and_values_drop_with_the_list() {
        let drops = Arc::new(StdAtomicUsize::new(0));
        let list = LfList::new();
        let nodes: Vec<_> = (0..3).map(|value| list.push(Counted(value, drops.clone()))).collect();
        let copy = nodes[1].clone();
        list.mark_removed(&nodes[0]);
        drop(list);
        assert_eq!(drops.load(std::sync::atomic::Ordering::SeqCst), 3);
        assert!(nodes.iter().all(NodeRef::is_removed) && copy.is_removed());
    }

    /// Panics on drop when its flag is set.
    struct PanicOnDrop(u64, bool);

    impl Drop for PanicOnDrop {
        fn drop(&mut self) {
            if self.1 && !std::thread::panicking() {
                panic!("value {} refuses to drop", self.0);
            }
        }
    }

    /// The hints must never point at a freed node, even when a value's drop panics halfway
    /// through a collection (under miri a stale tail or cursor is a use after free).
    #[test]
    fn list_stays_usable_after_a_value_panics_during_collection() {
        let mut list = LfList::new();
        // No `NodeRef` kept, so collection frees the nodes' memory at once.
        (0..3).for_each(|value| drop(list.push(PanicOnDrop(value, value == 1))));
        // Claim and finish 0 and 1: the claim cursor now points at 1.
        for expected in 0..2 {
            let claimed = list.claim().map(|claim| (claim.0, claim.remove()));
            assert_eq!(claimed, Some((expected, true)));
        }
        let collected = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            list.collect_garbage();
        }));
        assert!(collected.is_err(), "value 1's drop panicked after its node was freed");
        drop(list.push(PanicOnDrop(3, false)));
        let claimed: Vec<u64> = std::iter::from_fn(|| list.claim().map(|claim| claim.0)).collect();
        assert_eq!(claimed, vec![2, 3]);
        assert_eq!(list.iter().map(|value| value.0).collect::<Vec<_>>(), vec![2, 3]);
    }

    #[test]
    #[should_panic(expected = "another list's node")]
    fn mark_removed_with_a_node_of_another_list_panics() {
        let list = LfList::new();
        let other = LfList::new();
        let node = other.push(1u64);
        list.push(1u64);
        list.mark_removed(&node);
    }

    /// Sequential randomized model: every operation against a `Vec` of (value, claimed, removed)
    /// kept beside the list, compared after each step.
    #[test]
    fn random_operations_match_a_sequential_model() {
        let seed = std::env::var("QUILL_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(15);
        eprintln!(
            "random_operations_match_a_sequential_model: seed {seed} (set QUILL_SEED to change)"
        );
        let mut rng = StdRng::seed_from_u64(seed);
        let mut list = LfList::new();
        // (value, node, claimed, removed), in push order; collected entries leave it.
        let mut model: Vec<(u64, NodeRef<u64>, bool, bool)> = Vec::new();
        let mut value_next = 0;
        // Miri interprets every step: a shorter run there.
        let steps = if cfg!(miri) { 400 } else { 20_000 };
        for step in 0..steps {
            match rng.gen_range(0..100) {
                0..=39 => {
                    model.push((value_next, list.push(value_next), false, false));
                    value_next += 1;
                }
                40..=59 if !model.is_empty() => {
                    let pick = rng.gen_range(0..model.len());
                    let entry = &mut model[pick];
                    assert_eq!(list.mark_removed(&entry.1), !entry.3, "seed {seed} step {step}");
                    entry.3 = true;
                }
                60..=84 => {
                    let expected = model.iter_mut().find(|entry| !entry.2 && !entry.3);
                    let claimed = list.claim().map(|claim| *claim);
                    assert_eq!(claimed, expected.as_ref().map(|entry| entry.0), "seed {seed}");
                    if let Some(entry) = expected {
                        entry.2 = true;
                        if rng.gen_bool(0.5) {
                            assert!(list.mark_removed(&entry.1));
                            entry.3 = true;
                        }
                    }
                }
                85..=94 => {
                    let removed = model.iter().filter(|entry| entry.3).count();
                    assert_eq!(list.collect_garbage(), removed, "seed {seed} step {step}");
                    model.retain(|entry| !entry.3);
                }
                95..=96 => {
                    let live: Vec<u64> =
                        model.iter().filter(|entry| !entry.3).map(|entry| entry.0).collect();
                    assert_eq!(list.drain().collect::<Vec<_>>(), live, "seed {seed}");
                    assert!(model.iter().all(|entry| entry.1.is_removed()));
                    model.clear();
                }
                _ => {}
            }
            let live: Vec<u64> =
                model.iter().filter(|entry| !entry.3).map(|entry| entry.0).collect();
            assert_eq!(values(&list), live, "seed {seed} step {step}");
            assert_eq!(list.len(), live.len(), "seed {seed} step {step}");
        }
    }

    /// What one stress thread did, to check against the list afterwards.
    #[derive(Default)]
    struct StressLog {
        pushed: Vec<u64>,
        removed: Vec<u64>,
        claimed: Vec<u64>,
    }

    /// 16 threads push, remove (their own and other threads' nodes, so removals race), claim
    /// and iterate, 100,000 operations in all; then the counts must add up.
    #[test]
    fn sixteen_threads_of_mixed_operations_lose_and_duplicate_nothing() {
        // Miri interprets every operation: a smaller run there.
        const THREADS: u64 = if cfg!(miri) { 4 } else { 16 };
        const OPS_PER_THREAD: u64 = if cfg!(miri) { 200 } else { 100_000 / THREADS };
        let seed = std::env::var("QUILL_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(15);
        eprintln!("sixteen_threads_of_mixed_operations: seed {seed} (set QUILL_SEED to change)");
        let list: LfList<u64> = LfList::new();
        // Nodes every thread may remove: (value, node).
        let shared: Mutex<Vec<(u64, NodeRef<u64>)>> = Mutex::new(Vec::new());
        let logs: Vec<StressLog> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..THREADS)
                .map(|thread| {
                    let (list, shared) = (&list, &shared);
                    scope.spawn(move || {
                        let mut rng = StdRng::seed_from_u64(seed ^ thread);
                        let mut log = StressLog::default();
                        let mut removed_by_me = HashSet::new();
                        for op in 0..OPS_PER_THREAD {
                            match rng.gen_range(0..10) {
                                0..=3 => {
                                    let value = thread << 32 | op;
                                    let node = list.push(value);
                                    log.pushed.push(value);
                                    shared.lock().unwrap().push((value, node));
                                }
                                4..=5 => {
                                    let pick = {
                                        let shared = shared.lock().unwrap();
                                        (!shared.is_empty()).then(|| {
                                            let (value, node) =
                                                &shared[rng.gen_range(0..shared.len())];
                                            (*value, node.clone())
                                        })
                                    };
                                    if let Some((value, node)) = pick {
                                        if list.mark_removed(&node) {
                                            log.removed.push(value);
                                        }
                                        removed_by_me.insert(value);
                                    }
                                }
                                6..=8 => {
                                    if let Some(claim) = list.claim() {
                                        assert!(
                                            !removed_by_me.contains(&*claim),
                                            "claimed {} after removing it",
                                            *claim
                                        );
                                        log.claimed.push(*claim);
                                        if rng.gen_bool(0.3) && claim.remove() {
                                            log.removed.push(*claim);
                                            removed_by_me.insert(*claim);
                                        }
                                    }
                                }
                                _ => {
                                    let seen: Vec<u64> = list.iter().copied().collect();
                                    let distinct: HashSet<u64> = seen.iter().copied().collect();
                                    assert_eq!(distinct.len(), seen.len(), "iter repeated a value");
                                    let own: Vec<u64> = seen
                                        .iter()
                                        .copied()
                                        .filter(|value| value >> 32 == thread)
                                        .collect();
                                    assert!(own.windows(2).all(|w| w[0] < w[1]), "own order");
                                }
                            }
                        }
                        log
                    })
                })
                .collect();
            workers.into_iter().map(|worker| worker.join().unwrap()).collect()
        });
        let mut list = list;
        let pushed: HashSet<u64> = logs.iter().flat_map(|log| log.pushed.clone()).collect();
        let removed: Vec<u64> = logs.iter().flat_map(|log| log.removed.clone()).collect();
        let removed_set: HashSet<u64> = removed.iter().copied().collect();
        assert_eq!(removed_set.len(), removed.len(), "a node was removed twice");
        let mut claimed: Vec<u64> = logs.iter().flat_map(|log| log.claimed.clone()).collect();
        let claimed_concurrently = claimed.len();
        claimed.extend(claim_all(&list));
        let claimed_set: HashSet<u64> = claimed.iter().copied().collect();
        assert_eq!(claimed_set.len(), claimed.len(), "a node was claimed twice");
        let live: HashSet<u64> = pushed.difference(&removed_set).copied().collect();
        assert!(live.is_subset(&claimed_set), "a live node was never claimed");
        assert!(claimed_set.is_subset(&pushed) && removed_set.is_subset(&pushed));
        assert_eq!(list.len(), live.len());
        for (value, node) in shared.lock().unwrap().iter() {
            assert_eq!(node.is_removed(), removed_set.contains(value));
        }
        assert_eq!(list.collect_garbage(), removed_set.len());
        let remaining: HashSet<u64> = list.iter().copied().collect();
        assert_eq!(remaining, live);
        eprintln!(
            "pushed {}, removed {}, claimed {} concurrently and {} after, {} live",
            pushed.len(),
            removed.len(),
            claimed_concurrently,
            claimed.len() - claimed_concurrently,
            live.len()
        );
    }
}

/// loom models (`sh scripts/loom.sh`): every interleaving, up to the preemption bound, of the
/// list's concurrent operations, with the checks the engine relies on.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::sync::AtomicBool;
    use loom::sync::Arc;
    use loom::thread;

    const A: u32 = 1;
    const B: u32 = 2;
    const C: u32 = 3;

    fn values(list: &LfList<u32>) -> Vec<u32> {
        list.iter().copied().collect()
    }

    fn claim_all(list: &LfList<u32>) -> Vec<u32> {
        std::iter::from_fn(|| list.claim().map(|claim| *claim)).collect()
    }

    fn assert_distinct(values: &[u32]) {
        let mut sorted = values.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), values.len(), "duplicate in {values:?}");
    }

    fn unwrap(list: Arc<LfList<u32>>) -> LfList<u32> {
        Arc::try_unwrap(list).unwrap_or_else(|_| panic!("every thread joined"))
    }

    /// Spawns a thread that pushes `value` and then raises the returned flag (Release), so
    /// another thread that sees the flag (Acquire) knows the push returned.
    fn spawn_push_then_flag(
        list: &Arc<LfList<u32>>,
        value: u32,
    ) -> (thread::JoinHandle<()>, Arc<AtomicBool>) {
        let returned = Arc::new(AtomicBool::new(false));
        let pusher = {
            let (list, returned) = (list.clone(), returned.clone());
            thread::spawn(move || {
                drop(list.push(value));
                returned.store(true, Ordering::Release);
            })
        };
        (pusher, returned)
    }

    /// (a) Two pushers race on an empty list (the head CAS, then `next`) while a third thread
    /// iterates. The iterator never sees a value twice or out of push order, and once it knows
    /// a push returned (the flag), it must see that value: a returned push is reachable.
    #[test]
    fn loom_push_is_visible_once_it_returns() {
        loom::model(|| {
            let list = Arc::new(LfList::new());
            let (pusher_a, a_returned) = spawn_push_then_flag(&list, A);
            let pusher_b = {
                let list = list.clone();
                thread::spawn(move || drop(list.push(B)))
            };
            let a_known = a_returned.load(Ordering::Acquire);
            let seen = values(&list);
            assert_distinct(&seen);
            assert!(seen.iter().all(|value| [A, B].contains(value)));
            if a_known {
                assert!(seen.contains(&A), "a returned push is missing: {seen:?}");
            }
            pusher_a.join().unwrap();
            pusher_b.join().unwrap();
            let mut list = unwrap(list);
            let mut all = values(&list);
            all.sort_unstable();
            assert_eq!(all, vec![A, B]);
            assert_eq!(list.len(), 2);
            assert_eq!(list.collect_garbage(), 0);
            assert_eq!(list.drain().count(), 2);
        });
    }

    /// (a') A claimer racing two pushers, one of which then claims too: a push that returned
    /// before a claim started is claimable, and each value is claimed exactly once overall.
    #[test]
    fn loom_claim_sees_a_returned_push_and_claims_once() {
        loom::model(|| {
            let list = Arc::new(LfList::new());
            let (pusher_a, a_returned) = spawn_push_then_flag(&list, A);
            let pusher_b = {
                let list = list.clone();
                thread::spawn(move || {
                    drop(list.push(B));
                    list.claim().map(|claim| *claim)
                })
            };
            let a_known = a_returned.load(Ordering::Acquire);
            let claimed_main = claim_all(&list);
            pusher_a.join().unwrap();
            let claimed_b = pusher_b.join().unwrap();
            if a_known {
                assert!(
                    claimed_main.contains(&A) || claimed_b == Some(A),
                    "a returned push was not claimable: {claimed_main:?} {claimed_b:?}"
                );
            }
            let mut claimed = claimed_main;
            claimed.extend(claimed_b);
            claimed.extend(claim_all(&list));
            assert_distinct(&claimed);
            claimed.sort_unstable();
            assert_eq!(claimed, vec![A, B], "every live value claimed exactly once");
        });
    }

    /// (b) The engine's mix: A and B are filed; a handle files C, forgets A and claims; a
    /// committing thread iterates; a checkpointing thread claims twice and finishes (removes)
    /// what it claims. No value is lost or duplicated, a claim after a completed removal never returns
    /// the removed value, every live value is claimed exactly once, and collection leaves
    /// exactly the live ones.
    #[test]
    fn loom_push_remove_claim_against_commit_and_checkpoint() {
        loom::model(|| {
            let list = Arc::new(LfList::new());
            let node_a = list.push(A);
            drop(list.push(B));
            let committing = {
                let list = list.clone();
                thread::spawn(move || {
                    let seen = values(&list);
                    assert_distinct(&seen);
                    let mut sorted = seen.clone();
                    sorted.sort_unstable();
                    assert_eq!(seen, sorted, "iteration follows push order");
                    assert!(seen.iter().all(|value| [A, B, C].contains(value)));
                })
            };
            let checkpointing = {
                let list = list.clone();
                thread::spawn(move || {
                    let mut claimed = Vec::new();
                    let mut removed = Vec::new();
                    // Two claims keep the model under a minute; the rest is claimed after.
                    for claim in std::iter::from_fn(|| list.claim()).take(2) {
                        claimed.push(*claim);
                        if claim.remove() {
                            removed.push(*claim);
                        }
                    }
                    (claimed, removed)
                })
            };
            // The handle.
            let node_c = list.push(C);
            let handle_removed_a = list.mark_removed(&node_a);
            let handle_claimed = list.claim().map(|claim| *claim);
            assert_ne!(handle_claimed, Some(A), "claimed a value after removing it");
            committing.join().unwrap();
            let (mut claimed, mut removed) = checkpointing.join().unwrap();
            claimed.extend(handle_claimed);
            let claimed_late = claim_all(&list);
            claimed.extend(&claimed_late);
            assert_distinct(&claimed);
            if handle_removed_a {
                removed.push(A);
            }
            assert_distinct(&removed);
            assert!(removed.contains(&A) && node_a.is_removed());
            // Live = pushed − removed; each is claimed exactly once overall.
            let mut live: Vec<u32> =
                [A, B, C].into_iter().filter(|value| !removed.contains(value)).collect();
            for value in &live {
                assert!(claimed.contains(value), "live {value} never claimed: {claimed:?}");
            }
            assert!(claimed_late.iter().all(|value| !removed.contains(value)));
            let mut list = unwrap(list);
            assert_eq!(list.len(), live.len());
            assert_eq!(list.collect_garbage(), removed.len());
            live.sort_unstable();
            assert_eq!(values(&list), live, "collection keeps exactly the live values");
            assert_eq!(node_c.is_removed(), removed.contains(&C));
            assert_eq!(list.drain().collect::<Vec<_>>(), live);
        });
    }

    /// (c) Two threads forget the same node while a third claims: exactly one removal succeeds,
    /// and the claim gets the node only if it came first.
    #[test]
    fn loom_concurrent_removals_of_one_node_succeed_once() {
        loom::model(|| {
            let list = Arc::new(LfList::new());
            let node_a = list.push(A);
            let removers: Vec<_> = (0..2)
                .map(|_| {
                    let (list, node_a) = (list.clone(), node_a.clone());
                    thread::spawn(move || list.mark_removed(&node_a))
                })
                .collect();
            let claim = list.claim();
            let claimed_while_live = claim.as_ref().map(|claim| **claim);
            let removed: Vec<bool> =
                removers.into_iter().map(|remover| remover.join().unwrap()).collect();
            assert_eq!(removed.iter().filter(|&&removed| removed).count(), 1, "{removed:?}");
            assert!(claim.map_or(true, |claim| claim.is_removed() && !claim.remove()));
            assert!(claimed_while_live.map_or(true, |value| value == A));
            assert!(list.claim().is_none() && list.is_empty());
        });
    }
}
