//! The journal: its shared state and locks, the public API, and the stage threads.
//!
//! Threads: a commit stage (`commit.rs`) that locks the running transaction, freezes its
//! versions and writes its log blocks; a flush stage (`flush.rs`) that makes groups of written
//! transactions durable (flush, then commit blocks). With `committing_max == 1` there is no
//! separate flush thread: the commit thread makes each transaction durable itself before it
//! takes the next one, exactly as JBD2's kjournald2 does. Checkpointing (`checkpoint.rs`) runs
//! in whichever thread needs log space: one at a time under the checkpoint mutex, or, with
//! `checkpoint_io=cooperative`, in every such thread at once. With `commit_io=cooperative`
//! threads about to sleep help write the committing transaction's log blocks (`commit_io.rs`).
//! Handle admission is in `handle.rs`, superblock writes in `superblock.rs`, aborting in
//! `abort.rs`.
//!
//! ## Locks (JBD2's structure; each field below names its guard)
//!
//! Lock order, outermost first, as jbd2.h ranks them:
//!
//! `j_checkpoint_mutex` → `j_state_lock` (rw) → a buffer's state lock → `j_list_lock` /
//! `j_revoke_lock` → a cache shard; the superblock lock is a leaf. The cooperative slots
//! (`cooperative.checkpoint`, held only while a round is decided, never across I/O) come before
//! `j_state_lock`; `cooperative.log_writes` and a work set's own locks (`coop_io.rs`) are
//! leaves.
//!
//! - `j_state_lock` ([`crate::state::State`]): the transaction queue and each transaction's
//!   state, the log area, tid counters, the commit request and the mode. Handle admission takes
//!   it to read; state changes take it to write.
//! - `j_list_lock` ([`crate::transaction::ListLock`]): the running transaction's buffer,
//!   ordered-data and conflict lists (lock-free instead with `lists = lockfree`).
//! - buffer state lock (`Buffer::lock`): a buffer's versions and journal bookkeeping.
//! - `j_revoke_lock`: a transaction's revoke table.
//! - `j_checkpoint_mutex`: one checkpointer at a time.
//! - transaction counters (`t_updates`, credits, handles, log reservation) are atomics.
//!
//! No lock is held across device I/O except the checkpoint mutex and the superblock lock
//! (held across its own write, so superblock writes land in the order their contents were
//! made). Every wait happens on a [`WaitQueue`] with no lock held. Every lock's contended
//! waits are timed ([`crate::locks`]) and reported in [`JournalStats::locks`].

use crate::buffer::{Buffer, BufferCache};
use crate::checkpoint;
use crate::config::{CommitRecord, JournalConfig};
use crate::coop_io::Published;
use crate::error::{JournalError, Result};
use crate::fc_commit::{FastCommitOutcome, FcArea};
use crate::handle::{start_handle, Handle};
use crate::location::JournalLocation;
use crate::locks::{DoneQueues, LockCounters, LockId, TimedMutex, TimedRwLock, WaitQueue};
use crate::log_space::LogSpace;
use crate::recovery::{self, RecoveryReport};
use crate::state::State;
use crate::stats::{Counters, JournalStats};
use crate::superblock::{read_superblock, SuperblockWriter};
use crate::transaction::{ListLock, TxnState};
use crate::{commit, commit_io, flush};
use blockdev::BlockDevice;
use ondisk::jbd2::fast_commit::FcRecord;
use ondisk::jbd2::{feature, JournalSuperblock, LogFormat};
use ondisk::Tid;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// The stand-in log's length for [`Journal::without_log`]: 32768 blocks (128 MiB at 4 KiB),
/// so a transaction may hold as many blocks as with mke2fs's journal for a mid-sized file
/// system (a quarter of the log).
const LOGLESS_LOG_BLOCKS: u32 = 32768;

pub(crate) struct Shared {
    /// [immutable] (this and the next six fields)
    pub dev: Arc<dyn BlockDevice>,
    pub location: JournalLocation,
    pub format: LogFormat,
    pub config: JournalConfig,
    /// Most credits one transaction may hold (JBD2: a quarter of the journal).
    pub max_txn_credits: u32,
    /// Opened with [`Journal::open_read_only`]: no handles, no threads, nothing written.
    pub read_only: bool,
    /// Attached with [`Journal::without_log`]: commits write their blocks home (`commit.rs`),
    /// and nothing is ever written to the stand-in log or its superblock.
    pub logless: bool,
    /// `j_state_lock`.
    pub state: TimedRwLock<State>,
    /// `j_list_lock`.
    pub lists: ListLock,
    /// `j_checkpoint_mutex`: held by the one thread checkpointing.
    pub checkpoint_mutex: TimedMutex<()>,
    /// [superblock lock, a leaf] The superblock as last written.
    pub superblock: SuperblockWriter,
    /// [shard locks, buffer locks] The metadata buffer cache.
    pub cache: BufferCache,
    /// [its own slot locks] Cooperative I/O work that threads about to sleep help with
    /// (`coop_io.rs`).
    pub cooperative: Published,
    /// [atomic] Engine statistics.
    pub counters: Counters,
    /// [atomic] Lock-wait statistics of every lock above.
    pub locks: Arc<LockCounters>,
    /// [atomic] The mode is Aborted: readable without the state lock (the file system checks
    /// it on every change).
    pub aborted: AtomicBool,
    /// [written under `j_state_lock` (write), read without it] The newest durable tid, as
    /// `TxnQueue::last_durable`: fsync waiters woken by a durable transaction check it without
    /// taking `j_state_lock`, so a wake-up of every waiter does not queue them all on its read
    /// side.
    pub durable: AtomicU32,
    /// [written under `j_state_lock` (write), read without it] The mode is Stopping.
    pub stopping: AtomicBool,
    /// Transaction states, durability, log space, credits or the mode changed (handles
    /// waiting to start or for log space): JBD2's `j_wait_transaction_locked` and
    /// `j_wait_reserved` together.
    pub changed: WaitQueue,
    /// A transaction became durable (fsync waiters and shutdown, one queue per tid): JBD2's
    /// `j_wait_done_commit`.
    pub done: DoneQueues,
    /// Work for the commit stage: a commit request, a handle stop, a durable transaction
    /// (`j_wait_commit` and `j_wait_updates`).
    pub commit_wake: WaitQueue,
    /// Work for the flush stage: a transaction became Written.
    pub flush_wake: WaitQueue,
    /// [`j_fc_lock`, outermost] The fast-commit area, with `fsync_journal` on.
    pub fc_area: Option<FcArea>,
    /// [its own lock, a leaf] Fast commits that fell back to a full commit, by reason.
    pub fc_fallbacks: parking_lot::Mutex<Vec<(&'static str, u64)>>,
}

impl Shared {
    /// Counts a fast commit that fell back to a full commit (the journal's reasons and the
    /// file system's), as the kernel's `/proc/fs/ext4/*/fc_info` counts them.
    pub fn note_fast_commit_fallback(&self, reason: &'static str) {
        let mut counts = self.fc_fallbacks.lock();
        match counts.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, n)) => *n += 1,
            None => counts.push((reason, 1)),
        }
    }

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

    /// Log blocks a handle of `credits` credits reserves: its blocks (each credit is one buffer
    /// or one revoke record) and their descriptors. The sum over a transaction's handles plus
    /// `state::TXN_LOG_OVERHEAD` (commit block, revoke rounding) is at least the exact size of
    /// the transaction, since rounding up is subadditive and a revoke block holds many records.
    pub fn handle_log_blocks(&self, credits: u32) -> u32 {
        credits + self.descriptors_bound(credits)
    }

    fn descriptors_bound(&self, credits: u32) -> u32 {
        credits.div_ceil(self.format.tags_per_descriptor() as u32)
    }

    /// Exact log blocks of a transaction with `buffers` tags and `revokes` records.
    pub fn log_blocks_exact(&self, buffers: usize, revokes: usize) -> u32 {
        let descriptors = buffers.div_ceil(self.format.tags_per_descriptor());
        let revoke_blocks = revokes.div_ceil(self.format.revoke_records_per_block());
        (buffers + descriptors + revoke_blocks + 1) as u32
    }

    /// Writes the superblock with a new tail (`tail_tid` at `tail_block`; `tail_block == 0`
    /// marks the journal clean).
    pub fn write_tail(&self, tail_tid: Tid, tail_block: u32) -> Result<()> {
        self.update_superblock(|sb| {
            sb.sequence = tail_tid;
            sb.start = tail_block;
        })
    }

    /// Applies `change` to the superblock and writes it (FUA); a failed write aborts the
    /// journal after the superblock lock is released (the abort records its errno through it).
    pub fn update_superblock(
        &self,
        change: impl FnOnce(&mut ondisk::jbd2::JournalSuperblock),
    ) -> Result<()> {
        self.update_superblock_if(|_| true, change).map(drop)
    }

    /// [`Shared::update_superblock`] only when `needed` says so of the superblock as it is
    /// (checked under its lock); returns whether it wrote.
    pub fn update_superblock_if(
        &self,
        needed: impl FnOnce(&ondisk::jbd2::JournalSuperblock) -> bool,
        change: impl FnOnce(&mut ondisk::jbd2::JournalSuperblock),
    ) -> Result<bool> {
        let written =
            self.superblock.update_if(&*self.dev, &self.location, &self.locks, needed, change);
        written.map_err(|e| self.abort(format!("writing the journal superblock: {e}"), e.errno()))
    }

    /// See [`SuperblockWriter::ensure_written`]; a failed write aborts the journal.
    pub fn ensure_superblock_written(&self) -> Result<()> {
        let written = self.superblock.ensure_written(&*self.dev, &self.location, &self.locks);
        written.map_err(|e| self.abort(format!("writing the journal superblock: {e}"), e.errno()))
    }

    /// Asks the commit stage to commit up to `tid`. As JBD2's `jbd2_complete_transaction`, a
    /// request that is already there is seen under the read lock, so concurrent fsyncs of one
    /// transaction take the write lock once, not once each.
    pub fn request_commit(&self, tid: Tid) {
        let requested = self.state.read(&self.locks).commit_request();
        if requested.is_some_and(|r| r.is_at_or_after(tid)) {
            return;
        }
        self.state.write(&self.locks).request_commit(tid);
        self.commit_wake.wake_all();
    }

    /// The newest durable tid, without `j_state_lock` (see `durable`).
    pub fn durable_tid(&self) -> Tid {
        Tid(self.durable.load(Ordering::Acquire))
    }

    /// Wakes every wait queue (abort, stop).
    pub fn wake_everybody(&self) {
        self.changed.wake_all();
        self.done.wake_all();
        self.commit_wake.wake_all();
        self.flush_wake.wake_all();
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

    /// A journal with no log, for reading a file system that has none (ext2, ext4 without
    /// has_journal) read-only: metadata reads go through the buffer cache as with
    /// [`Journal::open_read_only`], no handle can start and nothing is written.
    pub fn without_log_read_only(
        dev: Arc<dyn BlockDevice>,
        block_size: u32,
        config: JournalConfig,
    ) -> Result<Journal> {
        Journal::attach_logless(dev, block_size, config, true)
    }

    /// A journal with no log, for writing a file system that has none (ext2, ext4 without
    /// has_journal), as the kernel's ext4 does in no-journal mode. Handles, transactions and
    /// their ordered data work as with a log, but a commit writes the transaction's blocks
    /// straight home (in the [`crate::HomeOrder`] its handles asked for) and a flush makes it
    /// durable: one transaction at a time, so a crash leaves every earlier commit whole and
    /// some of the blocks of one more, which e2fsck repairs. There is no atomicity beyond
    /// that, no fast commit and no revoke record. The stand-in log (the size of a mid-sized
    /// JBD2 journal, bounding a transaction as one would) is never read or written.
    pub fn without_log(
        dev: Arc<dyn BlockDevice>,
        block_size: u32,
        mut config: JournalConfig,
    ) -> Result<Journal> {
        // One transaction in flight: its blocks go home and are flushed before the next
        // commit writes any (so at most one commit is ever half on the device); commit
        // records do not exist.
        config.committing_max = 1;
        config.flush_batch_max = 1;
        config.commit_record = CommitRecord::Fua;
        config.fsync_journal = false;
        Journal::attach_logless(dev, block_size, config, false)
    }

    /// The stand-in log of a journal without one: a clean log at block 0, never touched.
    fn attach_logless(
        dev: Arc<dyn BlockDevice>,
        block_size: u32,
        config: JournalConfig,
        read_only: bool,
    ) -> Result<Journal> {
        let len =
            if read_only { ondisk::jbd2::JBD2_MIN_JOURNAL_BLOCKS } else { LOGLESS_LOG_BLOCKS };
        let location = JournalLocation::contiguous(block_size, 0, len)
            .map_err(|e| JournalError::Invalid(e.to_string()))?;
        let sb = JournalSuperblock::new(block_size, len, [0; 16], 0, 0);
        Journal::attach_to(dev, location, sb, config, read_only, true)
    }

    fn attach(
        dev: Arc<dyn BlockDevice>,
        location: JournalLocation,
        config: JournalConfig,
        read_only: bool,
    ) -> Result<Journal> {
        let sb = read_superblock(&*dev, &location)?;
        Journal::attach_to(dev, location, sb, config, read_only, false)
    }

    /// [`Journal::attach`] with the journal superblock `sb` already read.
    fn attach_to(
        dev: Arc<dyn BlockDevice>,
        location: JournalLocation,
        mut sb: JournalSuperblock,
        config: JournalConfig,
        read_only: bool,
        logless: bool,
    ) -> Result<Journal> {
        config.validate().map_err(JournalError::Invalid)?;
        if config.commit_record == CommitRecord::Barrier && !read_only && !dev.has_cache_barrier() {
            return Err(JournalError::Invalid(
                "commit_record = barrier needs a device with a cache barrier; this one has none \
                 (use fua or chained)"
                    .into(),
            ));
        }
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
        // fsync_journal: the fast-commit area takes the end of the journal, as the kernel's
        // mount with fast commits does (`jbd2_fc_init`); the log is empty, so it may shrink.
        // Like the kernel, not when the log would keep fewer than JBD2's minimum of blocks
        // (the superblock would then be invalid): fsyncs commit instead.
        let fast_commits = config.fsync_journal
            && !read_only
            && sb.max_len.saturating_sub(sb.configured_fast_commit_blocks())
                >= ondisk::jbd2::JBD2_MIN_JOURNAL_BLOCKS;
        if fast_commits {
            sb.feature_incompat |= feature::INCOMPAT_FAST_COMMIT;
        }
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
        let log = LogSpace::new(sb.first, sb.log_end(), sb.first);
        let fc_area = match fast_commits {
            false => None,
            true => Some(
                FcArea::new(sb.log_end() + 1, sb.max_len, config.fc_areas as u32)
                    .map_err(JournalError::Invalid)?,
            ),
        };
        let locks = Arc::new(LockCounters::default());
        let shared = Arc::new(Shared {
            dev,
            location,
            format,
            config,
            max_txn_credits,
            read_only,
            logless,
            state: TimedRwLock::new(State::new(next_tid, log, read_only)),
            lists: ListLock::new(locks.clone()),
            checkpoint_mutex: TimedMutex::new(LockId::Checkpoint, ()),
            superblock: SuperblockWriter::new(sb, !read_only, !logless),
            cache: BufferCache::new(locks.clone()),
            cooperative: Published::new(),
            counters: Counters::default(),
            locks,
            aborted: AtomicBool::new(false),
            durable: AtomicU32::new(next_tid.prev().0),
            stopping: AtomicBool::new(false),
            changed: WaitQueue::new(),
            done: DoneQueues::new(),
            commit_wake: WaitQueue::new(),
            flush_wake: WaitQueue::new(),
            fc_area,
            fc_fallbacks: parking_lot::Mutex::new(Vec::new()),
        });
        // A failed spawn drops `journal`, which stops the threads already running.
        let mut journal = Journal { shared, threads: Vec::new() };
        if read_only {
            return Ok(journal);
        }
        crate::fc_commit::zero_area_end(&journal.shared)?;
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

    /// iJournaling's file-level transaction (`fc_commit.rs`): makes `records` (file `file`'s
    /// INODE, ADD_RANGE and DEL_RANGE records, and those of the names it made or took, in
    /// replay order) durable in the fast-commit area as part of transaction `tid`, which must
    /// be the running one, without committing it. The caller has written the file's data (not
    /// flushed it: this does). On [`FastCommitOutcome::Fallback`] nothing was written: commit
    /// `tid` instead.
    pub fn fast_commit(
        &self,
        tid: Tid,
        file: u32,
        records: &[FcRecord<'_>],
    ) -> Result<FastCommitOutcome> {
        match self.queue_fast_commit(tid, file, records) {
            Ok(ticket) => self.wait_fast_commit(ticket),
            Err(fallback) => Ok(fallback),
        }
    }

    /// [`Journal::fast_commit`] in two steps. Queue under the file's lock: one file's fast
    /// commits are written, and replayed, in the order they are queued, so an older one can
    /// never land after a newer one. `Err` is the fallback when there is nothing to queue.
    pub fn queue_fast_commit(
        &self,
        tid: Tid,
        file: u32,
        records: &[FcRecord<'_>],
    ) -> std::result::Result<crate::fc_commit::FcTicket, FastCommitOutcome> {
        crate::fc_commit::queue(&self.shared, tid, file, records).map_err(|fallback| {
            self.shared.note_fast_commit_fallback(fallback.name());
            FastCommitOutcome::Fallback(fallback)
        })
    }

    /// The area file `file`'s fast commits go to (0 with one area, or none): recovery
    /// replays the areas in index order, so records of two files in different areas are
    /// replayed in that order, whichever was written first.
    pub fn fast_commit_area(&self, file: u32) -> usize {
        self.shared.fc_area.as_ref().map_or(0, |fc| crate::fc_commit::area_of(fc, file))
    }

    /// Then wait, without the file's lock, until a batch has written it (see
    /// [`Journal::fast_commit`] for the outcome).
    pub fn wait_fast_commit(
        &self,
        ticket: crate::fc_commit::FcTicket,
    ) -> Result<FastCommitOutcome> {
        ticket.wait(&self.shared)
    }

    /// Whether fast commits can be written (`fsync_journal` on, and an area to write them).
    pub fn fast_commits_enabled(&self) -> bool {
        self.shared.fc_area.is_some()
    }

    /// Counts a fast commit the file system did not attempt, by its reason (a directory, a
    /// hard-linked inode, a rename, ...), in [`JournalStats::fast_commit_fallbacks`].
    pub fn note_fast_commit_fallback(&self, reason: &'static str) {
        self.shared.note_fast_commit_fallback(reason);
    }

    /// Commits transaction `tid` if it is not yet durable and waits until it is (fsync).
    pub fn commit_and_wait(&self, tid: Tid) -> Result<()> {
        commit_and_wait(&self.shared, tid)
    }

    /// Asks for everything started so far to be committed, and waits for it.
    pub fn commit_all(&self) -> Result<()> {
        let tid = {
            let st = self.shared.state.read(&self.shared.locks);
            match st.txns().back() {
                Some(e) if e.txn.handles() > 0 || e.state() != TxnState::Running => e.tid(),
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
        self.shared.durable_tid()
    }

    /// Aborts the journal on the file system's behalf (ext4_handle_error with errors=remount-ro):
    /// the running transaction and everything after it never commit, so metadata an operation
    /// left half-changed is not made durable. Returns the sticky error.
    pub fn abort(&self, cause: String, errno: i32) -> JournalError {
        self.shared.abort(cause, errno)
    }

    /// Attached with [`Journal::without_log`] (or its read-only form): commits write home.
    pub fn is_logless(&self) -> bool {
        self.shared.logless
    }

    /// Whether the journal aborted (cheap: no lock).
    pub fn is_aborted(&self) -> bool {
        self.shared.aborted.load(Ordering::Acquire)
    }

    /// The sticky error, if the journal aborted.
    pub fn check_aborted(&self) -> Result<()> {
        self.shared.check_aborted()
    }

    pub fn stats(&self) -> JournalStats {
        let mut stats = self.shared.counters.snapshot();
        stats.locks = self.shared.locks.snapshot();
        stats.fast_commit_fallbacks =
            self.shared.fc_fallbacks.lock().iter().map(|&(r, n)| (r.to_string(), n)).collect();
        stats
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
        let st = self.shared.state.read(&self.shared.locks);
        (st.log().capacity(), st.log().used())
    }

    /// Where the next transaction's log blocks go, and the log area `[first, end)`.
    pub fn log_head(&self) -> (u32, std::ops::Range<u32>) {
        let head = self.shared.state.read(&self.shared.locks).log().head();
        (head, self.shared.superblock.log_area(&self.shared.locks))
    }

    /// Whether transaction `tid` is committed and checkpointed: its blocks are in place and
    /// no recovery would replay it (the superblock's log starts after it, or is empty).
    pub fn checkpointed(&self, tid: Tid) -> bool {
        self.last_durable().is_at_or_after(tid)
            && self
                .shared
                .superblock
                .log_start_tid(&self.shared.locks)
                .is_none_or(|start| start.is_after(tid))
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
        let last = {
            let mut st = shared.state.write(&shared.locks);
            st.set_closing();
            // A transaction nobody joined has nothing to commit.
            st.txns_mut().drop_unused_running();
            let last = st.txns().back().map(|e| e.tid());
            if let Some(last) = last {
                st.request_commit(last);
            }
            last
        };
        shared.changed.wake_all(); // handles waiting to start see the journal closing
        if let Some(last) = last {
            shared.commit_wake.wake_all();
            loop {
                let ticket = shared.done.of(last).ticket();
                let st = shared.state.read(&shared.locks);
                st.aborted()?;
                if st.txns().all_durable() {
                    break;
                }
                drop(st);
                shared.done.of(last).wait(ticket);
            }
        }
        shared.check_aborted()?;
        self.stop_threads();
        while checkpoint::checkpoint_oldest(&shared)? {}
        let next_tid = shared.state.read(&shared.locks).txns().next_tid();
        // jbd2_mark_journal_empty: the tail tid is the next tid, s_start = 0 means clean. As
        // Linux's unmount, the fast-commit bit goes too: a clean journal is plain JBD2, and
        // the next mount with fast commits sets it again.
        shared.dev.flush().map_err(|e| shared.abort_on("flushing before unmount", e))?;
        shared.update_superblock(|sb| {
            sb.sequence = next_tid;
            sb.start = 0;
            sb.feature_incompat &= !feature::INCOMPAT_FAST_COMMIT;
            sb.set_fc_areas(None);
        })?;
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
                    shared.abort(format!("the {name} stage panicked: {what}"), crate::abort::EIO);
                }
            })
            .map_err(|e| JournalError::Invalid(format!("spawning the {name} thread: {e}")))?;
        self.threads.push(thread);
        Ok(())
    }

    fn stop_threads(&mut self) {
        self.shared.state.write(&self.shared.locks).set_stopping();
        self.shared.stopping.store(true, Ordering::Release);
        self.shared.wake_everybody();
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

/// fsync: asks for `tid` to be committed and waits until it is durable.
///
/// An aborted journal fails the call even when `tid` is durable, as JBD2's
/// `jbd2_log_wait_commit` returns -EIO: the caller's later changes will never commit, and an
/// fsync that reports success would hide that.
pub(crate) fn commit_and_wait(shared: &Shared, tid: Tid) -> Result<()> {
    {
        let st = shared.state.read(&shared.locks);
        st.aborted()?;
        if st.txns().last_durable().is_at_or_after(tid) {
            return Ok(());
        }
        let next = st.txns().next_tid();
        if tid.is_at_or_after(next) {
            return Err(JournalError::UnknownTid { tid, next });
        }
    }
    shared.request_commit(tid);
    let done = shared.done.of(tid);
    loop {
        let ticket = done.ticket();
        shared.check_aborted()?;
        if shared.durable_tid().is_at_or_after(tid) {
            return Ok(());
        }
        if shared.stopping.load(Ordering::Acquire) {
            return Err(JournalError::ShutDown);
        }
        if !commit_io::help_write_log(shared) {
            done.wait(ticket);
        }
    }
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
