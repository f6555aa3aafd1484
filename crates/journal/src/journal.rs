//! The journal: shared state, handle admission, fsync, open and shutdown.
//!
//! Threads: a commit stage (`commit.rs`) that locks the running transaction, freezes its
//! versions and writes its log blocks; a flush stage (`flush.rs`) that makes groups of written
//! transactions durable (flush, then commit blocks). With `committing_max == 1` there is no
//! separate flush thread: the commit thread makes each transaction durable itself before it
//! takes the next one, exactly as JBD2's kjournald2 does. Checkpointing (`checkpoint.rs`) runs
//! in whichever thread needs log space, one at a time under the checkpoint mutex, or, with
//! `checkpoint_io=cooperative`, in every such thread at once. With `commit_io=cooperative`
//! threads about to sleep on `changed` help write the committing transaction's log blocks
//! (`commit_io.rs`).
//!
//! Lock order (outermost first): `checkpoint_lock` → `state` → a buffer's mutex → a cache shard;
//! `state` → `superblock`, a leaf; `cooperative.checkpoint` (the round slot, held only while a
//! round is decided, never across I/O) → `state`; `state` → `cooperative.log_writes`, a leaf; a
//! work set's own locks (`coop_io.rs`) are leaves. No lock is held across device I/O except `checkpoint_lock`
//! and `superblock`, which is held across its own write so that superblock writes land in the
//! order their contents were made; an abort takes it to record its errno, so no code may abort
//! while holding it.
//!
//! Invariants kept under `state`:
//! - `txns` is ordered by tid, oldest first, with states non-increasing from front to back:
//!   Durable (awaiting checkpoint) ... Written ... Committing ... Locked/Running (at most one,
//!   at the back);
//! - `log.used() + Σ txn.log_reserved <= log.capacity()`: every transaction can always be
//!   written once it has been admitted;
//! - `last_durable` is the newest tid whose commit block is durable; every older tid is
//!   durable too.

use crate::buffer::{Buffer, BufferCache};
use crate::checkpoint;
use crate::config::JournalConfig;
use crate::coop_io::Published;
use crate::error::{JournalError, Result};
use crate::handle::Handle;
use crate::location::JournalLocation;
use crate::log_space::LogSpace;
use crate::recovery::{self, RecoveryReport};
use crate::stats::{self, Counters, JournalStats};
use crate::superblock::{read_superblock, write_superblock};
use crate::transaction::{Transaction, TxnState};
use crate::{commit, commit_io, flush};
use blockdev::BlockDevice;
use ondisk::jbd2::{feature, JournalSuperblock, LogFormat};
use ondisk::Tid;
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

/// errno reported when a stage thread or a cooperative helper panics: the journal can no longer
/// promise durability.
pub(crate) const EIO: i32 = 5;

pub(crate) struct State {
    pub txns: VecDeque<Transaction>,
    pub next_tid: Tid,
    pub log: LogSpace,
    pub last_durable: Tid,
    /// The newest tid somebody asked to commit (fsync, full transaction, shutdown).
    pub commit_request: Option<Tid>,
    pub abort: Option<(String, i32)>,
    /// No new handles (shutdown in progress).
    pub closing: bool,
    /// Background threads must exit.
    pub stop_threads: bool,
}

impl State {
    pub fn txn(&self, tid: Tid) -> Option<&Transaction> {
        let front = self.txns.front()?;
        if !tid.is_at_or_after(front.tid) {
            return None;
        }
        self.txns.get(tid.distance_from(front.tid) as usize)
    }

    pub fn txn_mut(&mut self, tid: Tid) -> Option<&mut Transaction> {
        let front = self.txns.front()?;
        if !tid.is_at_or_after(front.tid) {
            return None;
        }
        self.txns.get_mut(tid.distance_from(front.tid) as usize)
    }

    /// Transactions between Locked and Written (they hold a committing slot).
    pub fn in_flight(&self) -> usize {
        self.txns
            .iter()
            .filter(|t| {
                matches!(t.state, TxnState::Locked | TxnState::Committing | TxnState::Written)
            })
            .count()
    }

    /// Log blocks written or promised: used plus every reservation.
    pub fn log_committed(&self) -> u64 {
        self.log.used() as u64 + self.txns.iter().map(|t| t.log_reserved as u64).sum::<u64>()
    }

    pub fn aborted(&self) -> Result<()> {
        match &self.abort {
            Some((cause, errno)) => {
                Err(JournalError::Aborted { cause: cause.clone(), errno: *errno })
            }
            None => Ok(()),
        }
    }
}

pub(crate) struct Shared {
    pub dev: Arc<dyn BlockDevice>,
    pub location: JournalLocation,
    pub format: LogFormat,
    pub config: JournalConfig,
    pub state: Mutex<State>,
    /// Transaction states, durability, log space or abort changed (handles, fsync waiters).
    pub changed: Condvar,
    /// Work for the commit stage: a commit request, a handle stop, a durable transaction.
    pub commit_wake: Condvar,
    /// Work for the flush stage: a transaction became Written.
    pub flush_wake: Condvar,
    pub checkpoint_lock: Mutex<()>,
    /// The superblock as last written; tail updates rewrite it.
    pub superblock: Mutex<JournalSuperblock>,
    pub cache: BufferCache,
    /// Cooperative I/O work that threads about to sleep help with (`coop_io.rs`).
    pub cooperative: Published,
    pub counters: Counters,
    /// Most credits one transaction may hold (JBD2: a quarter of the journal).
    pub max_txn_credits: u32,
    /// Opened with [`Journal::open_read_only`]: no handles, no threads, nothing written.
    pub read_only: bool,
    /// `state.abort` is set: readable without the state lock (the file system checks it on
    /// every change).
    pub aborted: AtomicBool,
    /// The superblock naming the new log start is not written yet: the first commit writes it
    /// before its log blocks (see `attach`).
    pub superblock_unwritten: AtomicBool,
}

impl Shared {
    pub fn block_size(&self) -> usize {
        self.location.block_size() as usize
    }

    /// Device byte offset of journal block `log_block`.
    pub fn log_offset(&self, log_block: u32) -> u64 {
        self.location.device_offset(log_block).expect("log block inside the journal location")
    }

    /// Device byte offset of file-system block `block` (the buffer's home).
    pub fn home_offset(&self, block: u64) -> u64 {
        block * self.location.block_size() as u64
    }

    /// Worst-case log blocks for a transaction holding `credits` credits (each credit is one
    /// buffer or one revoke record): the blocks, their descriptors, a revoke block's rounding,
    /// and the commit block.
    pub fn log_blocks_bound(&self, credits: u32) -> u32 {
        let per_descriptor = self.format.tags_per_descriptor() as u32;
        credits + credits.div_ceil(per_descriptor) + 2
    }

    /// Exact log blocks of a transaction with `buffers` tags and `revokes` records.
    pub fn log_blocks_exact(&self, buffers: usize, revokes: usize) -> u32 {
        let descriptors = buffers.div_ceil(self.format.tags_per_descriptor());
        let revoke_blocks = revokes.div_ceil(self.format.revoke_records_per_block());
        (buffers + descriptors + revoke_blocks + 1) as u32
    }

    /// Records the first fatal error, wakes everybody, records the errno in the on-disk
    /// superblock, and returns the sticky error. The caller must not hold the superblock lock.
    pub fn abort(&self, cause: String, errno: i32) -> JournalError {
        let mut st = self.state.lock();
        let first = st.abort.is_none();
        if first {
            st.abort = Some((cause, errno));
            self.aborted.store(true, Ordering::Release);
        }
        let err = st.aborted().unwrap_err();
        drop(st);
        self.changed.notify_all();
        self.commit_wake.notify_all();
        self.flush_wake.notify_all();
        if first {
            self.record_errno(errno);
        }
        err
    }

    /// jbd2_journal_update_sb_errno: the abort's errno goes into `s_errno` (negated, as Linux
    /// stores it) with a FUA write, so the next mount (quill's, the kernel's `ext4_clear_
    /// journal_err`) or e2fsck marks the file system as having errors and checks it in full.
    /// Best effort: the device that failed may refuse this write too, and the abort stands
    /// either way.
    fn record_errno(&self, errno: i32) {
        if self.read_only {
            return;
        }
        let mut sb = self.superblock.lock();
        sb.errno = if errno > 0 { -errno } else { -EIO };
        let mut on_disk = sb.clone();
        if self.superblock_unwritten.load(Ordering::Acquire) {
            // Nothing was committed since attach: the device still has the clean superblock
            // (no log start; the previous tail tid), and it keeps saying so.
            on_disk.start = 0;
            on_disk.sequence = on_disk.sequence.prev();
        }
        let _ = write_superblock(&*self.dev, &self.location, &on_disk);
    }

    /// Aborts on a device error and returns the sticky journal error.
    pub fn abort_on(&self, what: &str, err: blockdev::DeviceError) -> JournalError {
        let errno = err.errno();
        self.abort(format!("{what}: {err}"), errno)
    }

    /// Writes the superblock with a new tail (`tail_tid` at `tail_block`; `tail_block == 0`
    /// marks the journal clean).
    pub fn write_tail(&self, tail_tid: Tid, tail_block: u32) -> Result<()> {
        self.update_superblock(|sb| {
            sb.sequence = tail_tid;
            sb.start = tail_block;
        })
    }

    /// Applies `change` to the superblock and writes it (FUA) under the superblock mutex, so
    /// writes land in the order their contents were made; a failed write aborts the journal,
    /// after the mutex is released (the abort records its errno through it).
    pub fn update_superblock(&self, change: impl FnOnce(&mut JournalSuperblock)) -> Result<()> {
        let mut sb = self.superblock.lock();
        change(&mut sb);
        let written = write_superblock(&*self.dev, &self.location, &sb);
        drop(sb);
        written.map_err(|e| self.abort(format!("writing the journal superblock: {e}"), e.errno()))
    }

    /// Asks the commit stage to commit up to `tid`.
    pub fn request_commit(&self, st: &mut MutexGuard<'_, State>, tid: Tid) {
        if st.commit_request.is_none_or(|r| tid.is_after(r)) {
            st.commit_request = Some(tid);
        }
        self.commit_wake.notify_all();
    }
}

/// A JBD2 journal attached to a block device.
pub struct Journal {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl Journal {
    /// Attaches to the journal at `location`. A journal that needs recovery is refused; use
    /// [`Journal::recover_and_open`] for the JBD2 mount behaviour (replay, then attach).
    pub fn open(
        dev: Arc<dyn BlockDevice>,
        location: JournalLocation,
        config: JournalConfig,
    ) -> Result<Journal> {
        Journal::attach(dev, location, config, false)
    }

    /// Attaches to a clean journal without writing anything: metadata reads go through the
    /// buffer cache as usual, but no handle can start, no thread runs, and neither this call
    /// nor [`Journal::shutdown`] writes the device (a read-only mount). A journal that needs
    /// recovery is refused, as in [`Journal::open`].
    pub fn open_read_only(
        dev: Arc<dyn BlockDevice>,
        location: JournalLocation,
        config: JournalConfig,
    ) -> Result<Journal> {
        Journal::attach(dev, location, config, true)
    }

    fn attach(
        dev: Arc<dyn BlockDevice>,
        location: JournalLocation,
        config: JournalConfig,
        read_only: bool,
    ) -> Result<Journal> {
        config.validate().map_err(JournalError::Invalid)?;
        let mut sb = read_superblock(&*dev, &location)?;
        // A read-only journal never writes and never replays: attached to a log that still
        // holds transactions (a norecovery mount), reads see the home blocks as they are.
        if sb.start != 0 && !read_only {
            return Err(JournalError::NeedsRecovery { start: sb.start });
        }
        // JBD2 journal_reset: the first tid is one past the clean superblock's sequence; the
        // log starts over at s_first; the superblock now names that tid and block, so a crash
        // from here on is recovered from this point.
        let capacity = sb.log_end() - sb.first;
        if capacity < 16 {
            return Err(JournalError::Invalid(format!(
                "log area of {capacity} blocks is too small"
            )));
        }
        let next_tid = sb.sequence.next();
        sb.feature_incompat |= feature::INCOMPAT_REVOKE;
        sb.sequence = next_tid;
        sb.start = sb.first;
        // The superblock is written before the first commit's log blocks, not now (JBD2's
        // JBD2_FLUSHED): an empty log needs no recovery, and a crash between this point and
        // the file system marking itself as needing recovery must not leave a journal that
        // claims data (e2fsck: "needs_recovery flag is clear, but journal has data").

        let format = sb.format();
        let max_txn_credits = {
            // JBD2 caps a transaction at a quarter of the journal; leave room for descriptors.
            let quarter = capacity / 4;
            let per_descriptor = format.tags_per_descriptor() as u32;
            quarter.saturating_sub(quarter.div_ceil(per_descriptor) + 2).max(1)
        };
        let state = State {
            txns: VecDeque::new(),
            next_tid,
            log: LogSpace::new(sb.first, sb.log_end(), sb.first),
            last_durable: next_tid.prev(),
            commit_request: None,
            abort: None,
            closing: read_only,
            stop_threads: false,
        };
        let shared = Arc::new(Shared {
            dev,
            location,
            format,
            config,
            state: Mutex::new(state),
            changed: Condvar::new(),
            commit_wake: Condvar::new(),
            flush_wake: Condvar::new(),
            checkpoint_lock: Mutex::new(()),
            superblock: Mutex::new(sb),
            cache: BufferCache::new(),
            cooperative: Published::new(),
            counters: Counters::default(),
            max_txn_credits,
            read_only,
            aborted: AtomicBool::new(false),
            superblock_unwritten: AtomicBool::new(!read_only),
        });
        // A failed spawn drops `journal`, which stops the threads already running.
        let mut journal = Journal { shared, threads: Vec::new() };
        if read_only {
            return Ok(journal);
        }
        journal.spawn_stage("commit", commit::commit_stage)?;
        if journal.shared.config.committing_max > 1 {
            journal.spawn_stage("flush", flush::flush_stage)?;
        }
        Ok(journal)
    }

    /// JBD2's `jbd2_journal_load`: replays the log if it needs it, then attaches.
    pub fn recover_and_open(
        dev: Arc<dyn BlockDevice>,
        location: JournalLocation,
        config: JournalConfig,
    ) -> Result<(Journal, RecoveryReport)> {
        let report = recovery::recover(&*dev, &location, config.recovery_threads)?;
        let journal = Journal::open(dev, location, config)?;
        Ok((journal, report))
    }

    /// Starts a handle that may dirty or revoke up to `credits` blocks in the running
    /// transaction. Blocks while the running transaction is locked, full, or the log lacks
    /// space (then checkpoints). A thread must not start a handle while it holds another.
    pub fn start(&self, credits: u32) -> Result<Handle> {
        start_handle(&self.shared, credits)
    }

    /// The buffer of file-system block `block`, read from its home location if not cached.
    pub fn read_buffer(&self, block: u64) -> Result<Arc<Buffer>> {
        let shared = &self.shared;
        shared.cache.get_or_insert_with(block, || {
            let mut data = vec![0u8; shared.block_size()];
            shared.dev.read_at(shared.home_offset(block), &mut data)?;
            Ok(data)
        })
    }

    /// The buffer of a block whose old contents do not matter (JBD2's get_create_access): a
    /// zeroed buffer if not cached, without reading the device.
    pub fn new_buffer(&self, block: u64) -> Arc<Buffer> {
        let size = self.shared.block_size();
        self.shared
            .cache
            .get_or_insert_with::<std::convert::Infallible>(block, || Ok(vec![0u8; size]))
            .unwrap_or_else(|never| match never {})
    }

    /// Commits transaction `tid` if it is not yet durable and waits until it is (fsync).
    pub fn commit_and_wait(&self, tid: Tid) -> Result<()> {
        commit_and_wait(&self.shared, tid)
    }

    /// Asks for everything started so far to be committed, and waits for it.
    pub fn commit_all(&self) -> Result<()> {
        let tid = {
            let st = self.shared.state.lock();
            match st.txns.back() {
                Some(t) if t.handles > 0 || t.state != TxnState::Running => t.tid,
                _ => return st.aborted(),
            }
        };
        self.commit_and_wait(tid)
    }

    /// Writes every durable transaction home and frees its log space.
    pub fn checkpoint_all(&self) -> Result<()> {
        while checkpoint::checkpoint_oldest(&self.shared)? {}
        Ok(())
    }

    /// The newest durable tid.
    pub fn last_durable(&self) -> Tid {
        self.shared.state.lock().last_durable
    }

    /// Aborts the journal on the file system's behalf (ext4_handle_error with errors=remount-ro):
    /// the running transaction and everything after it never commit, so metadata an operation
    /// left half-changed is not made durable. Returns the sticky error.
    pub fn abort(&self, cause: String, errno: i32) -> JournalError {
        self.shared.abort(cause, errno)
    }

    /// Whether the journal aborted (cheap: no lock).
    pub fn is_aborted(&self) -> bool {
        self.shared.aborted.load(Ordering::Acquire)
    }

    /// The sticky error, if the journal aborted.
    pub fn check_aborted(&self) -> Result<()> {
        self.shared.state.lock().aborted()
    }

    pub fn stats(&self) -> JournalStats {
        self.shared.counters.snapshot()
    }

    pub fn config(&self) -> &JournalConfig {
        &self.shared.config
    }

    pub fn format(&self) -> LogFormat {
        self.shared.format
    }

    /// Most credits a single handle (and transaction) may hold.
    pub fn max_transaction_credits(&self) -> u32 {
        self.shared.max_txn_credits
    }

    /// Log capacity in blocks and blocks in use.
    pub fn log_usage(&self) -> (u32, u32) {
        let st = self.shared.state.lock();
        (st.log.capacity(), st.log.used())
    }

    /// Where the next transaction's log blocks go, and the log area `[first, end)`.
    pub fn log_head(&self) -> (u32, std::ops::Range<u32>) {
        let st = self.shared.state.lock();
        let sb = self.shared.superblock.lock();
        (st.log.head(), sb.first..sb.log_end())
    }

    /// Drops cached buffers the journal no longer needs; returns how many.
    pub fn evict_clean_buffers(&self) -> usize {
        self.shared.cache.evict_clean()
    }

    /// Bounds the metadata buffer cache to about `buffers` blocks (0: unbounded): when it
    /// grows past that, buffers the journal no longer needs are dropped. Buffers in use
    /// (in a transaction, awaiting checkpoint, held by a caller) always stay.
    pub fn set_cache_limit(&self, buffers: usize) {
        self.shared.cache.set_limit(buffers);
    }

    /// Metadata buffers cached now.
    pub fn cached_buffers(&self) -> usize {
        self.shared.cache.len()
    }

    /// Clean unmount: commits what is running, waits for it to be durable, checkpoints
    /// everything and marks the journal empty (`s_start = 0`).
    pub fn shutdown(mut self) -> Result<()> {
        let shared = self.shared.clone();
        if shared.read_only {
            return Ok(());
        }
        {
            let mut st = shared.state.lock();
            st.closing = true;
            // A transaction nobody joined has nothing to commit.
            if st.txns.back().is_some_and(|t| t.state == TxnState::Running && t.handles == 0) {
                st.txns.pop_back();
            }
            if let Some(last) = st.txns.back().map(|t| t.tid) {
                shared.request_commit(&mut st, last);
                while st.abort.is_none() && st.txns.iter().any(|t| t.state != TxnState::Durable) {
                    shared.changed.wait(&mut st);
                }
            }
            st.aborted()?;
        }
        self.stop_threads();
        while checkpoint::checkpoint_oldest(&shared)? {}
        let next_tid = shared.state.lock().next_tid;
        // jbd2_mark_journal_empty: the tail tid is the next tid, s_start = 0 means clean.
        shared.dev.flush().map_err(|e| shared.abort_on("flushing before unmount", e))?;
        shared.write_tail(next_tid, 0)?;
        Ok(())
    }

    /// Stops the background threads and leaves the device as it is, without committing or
    /// checkpointing: what a crash leaves behind (committed transactions stay in the log).
    pub fn abandon(mut self) {
        self.stop_threads();
    }

    /// Runs a stage on its own thread. A panic in it aborts the journal (so fsync waiters and
    /// shutdown get an error instead of waiting forever) rather than vanishing with the thread.
    fn spawn_stage(&mut self, name: &'static str, stage: fn(&Arc<Shared>)) -> Result<()> {
        let shared = self.shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("quill-{name}"))
            .spawn(move || {
                let outcome =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| stage(&shared)));
                if let Err(payload) = outcome {
                    let what = panic_message(&*payload).unwrap_or("unknown panic");
                    shared.abort(format!("the {name} stage panicked: {what}"), EIO);
                }
            })
            .map_err(|e| JournalError::Invalid(format!("spawning the {name} thread: {e}")))?;
        self.threads.push(thread);
        Ok(())
    }

    fn stop_threads(&mut self) {
        self.shared.state.lock().stop_threads = true;
        self.shared.commit_wake.notify_all();
        self.shared.flush_wake.notify_all();
        self.shared.changed.notify_all();
        for t in self.threads.drain(..) {
            // Stages catch their own panics (and abort the journal), so join cannot fail.
            let _ = t.join();
        }
    }
}

impl Drop for Journal {
    /// Dropping without `shutdown` stops the threads and leaves a dirty (recoverable) journal.
    fn drop(&mut self) {
        self.stop_threads();
    }
}

/// Handle admission: join the running transaction, creating it if needed, once it is not
/// locked, has room for `credits`, and the log can hold it.
pub(crate) fn start_handle(shared: &Arc<Shared>, credits: u32) -> Result<Handle> {
    if credits == 0 || credits > shared.max_txn_credits {
        return Err(JournalError::TooManyCredits {
            requested: credits,
            max: shared.max_txn_credits,
        });
    }
    let started = Instant::now();
    let mut waited = false;
    let mut st = shared.state.lock();
    loop {
        st.aborted()?;
        if st.closing || st.stop_threads {
            return Err(JournalError::ShutDown);
        }
        match st.txns.back().map(|t| t.state) {
            Some(TxnState::Locked) => {
                // JBD2: new handles wait while the transaction is locked (FAST'18: they
                // help write the committing transaction's log blocks first).
                waited = true;
                if !commit_io::help_write_log(shared, &mut st) {
                    shared.changed.wait(&mut st);
                }
                continue;
            }
            Some(TxnState::Running) => {}
            _ => {
                let tid = st.next_tid;
                st.next_tid = tid.next();
                st.txns.push_back(Transaction::new(tid));
            }
        }
        let running = st.txns.back().expect("running transaction exists");
        let tid = running.tid;
        if running.credits + credits > shared.max_txn_credits {
            // Full: commit it and join the next one.
            waited = true;
            shared.request_commit(&mut st, tid);
            if !commit_io::help_write_log(shared, &mut st) {
                shared.changed.wait(&mut st);
            }
            continue;
        }
        let reserved_now = running.log_reserved;
        let reserved_new = shared.log_blocks_bound(running.credits + credits);
        let needed = st.log_committed() - reserved_now as u64 + reserved_new as u64;
        if needed > st.log.capacity() as u64 {
            waited = true;
            stats::add(&shared.counters.space_waits, 1);
            st = wait_for_log_space(shared, st, tid)?;
            continue;
        }
        let running = st.txns.back_mut().expect("running transaction exists");
        running.credits += credits;
        running.log_reserved = reserved_new;
        running.updates += 1;
        running.handles += 1;
        drop(st);
        if waited {
            stats::add(&shared.counters.handle_start_waits, 1);
            stats::add_time(&shared.counters.ns_handle_start_wait, started.elapsed());
        }
        return Ok(Handle::new(shared.clone(), tid, credits));
    }
}

/// Makes log space: checkpoint the oldest durable transaction if there is one, else get the
/// running transaction committed and wait for something to become durable.
fn wait_for_log_space<'a>(
    shared: &'a Arc<Shared>,
    mut st: MutexGuard<'a, State>,
    running: Tid,
) -> Result<MutexGuard<'a, State>> {
    let checkpointable = st.txns.front().is_some_and(|t| t.state == TxnState::Durable);
    if checkpointable {
        drop(st);
        checkpoint::checkpoint_oldest(shared)?;
        return Ok(shared.state.lock());
    }
    let running_has_work = st.txn(running).is_some_and(|t| t.credits > 0);
    let in_flight = st.in_flight() > 0;
    if !running_has_work && !in_flight {
        return Err(JournalError::Invalid(format!(
            "log of {} blocks cannot hold one transaction",
            st.log.capacity()
        )));
    }
    if running_has_work {
        shared.request_commit(&mut st, running);
    }
    if !commit_io::help_write_log(shared, &mut st) {
        shared.changed.wait(&mut st);
    }
    Ok(st)
}

pub(crate) fn commit_and_wait(shared: &Shared, tid: Tid) -> Result<()> {
    let mut st = shared.state.lock();
    if st.last_durable.is_at_or_after(tid) {
        return Ok(());
    }
    st.aborted()?;
    if tid.is_at_or_after(st.next_tid) {
        return Err(JournalError::UnknownTid { tid, next: st.next_tid });
    }
    shared.request_commit(&mut st, tid);
    while !st.last_durable.is_at_or_after(tid) {
        st.aborted()?;
        if st.stop_threads {
            return Err(JournalError::ShutDown);
        }
        if !commit_io::help_write_log(shared, &mut st) {
            shared.changed.wait(&mut st);
        }
    }
    Ok(())
}

/// The message a panic carried (`panic!("...")` gives a `&str` or a `String` payload); `None`
/// for any other payload. The journal's stages and the FUSE adapter's request threads report
/// panics with it.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> Option<&str> {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
}
