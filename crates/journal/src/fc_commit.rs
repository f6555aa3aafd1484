//! File-level fsync transactions (iJournaling, ATC'17; DESIGN.md §3.6) written as ext4 fast
//! commits: the engine's side of `fsync_journal`.
//!
//! The file system builds the records of one file (its INODE and the ranges whose mapping
//! changed, as ext4's fast commit does); [`crate::Journal::fast_commit`] makes them durable in
//! the journal's fast-commit area as part of the running transaction, without committing it.
//! Recovery (quill's, e2fsck's, the kernel's) replays the fast commits of the tid after the last
//! complete full commit on top of the full commits, so such a fast commit counts exactly while
//! its transaction has not committed; once the transaction is durable it supersedes them.
//!
//! The protocol (the kernel's `jbd2_fc_begin_commit` / `jbd2_fc_end_commit` rules, in quill's
//! pipeline):
//!
//! | step | what | why |
//! |---|---|---|
//! | 1 | queue the records, take `j_fc_lock` (the file's area's, with per-core areas); if an earlier holder wrote them, return its outcome; else take every queued request of the newest transaction as one batch | one fast commit at a time owns an area (as the kernel); concurrent fsyncs share one fast commit (group commit, see `AreaSlot`) |
//! | 2 | pin transaction `tid` if it is the running one and no full commit of it is requested, else fall back | its full commit waits for the pins before it locks the transaction, as the kernel's waits for an ongoing fast commit; handles go on joining meanwhile |
//! | 3 | write the superblock naming the log if nothing has since attach | in the first transaction it may still say "clean" (`s_start = 0`), and recovery would read nothing (the kernel instead refuses fast commits before the first full commit) |
//! | 4 | wait until `tid - 1` is durable | recovery replays fast commits only of the tid right after the last complete full commit; with several transactions in flight the previous one may still be committing |
//! | 5 | per-core areas: INCOMPAT_QUILL_FC_AREAS durable in the superblock; area reset when it holds another tid's fast commits | stock tools must refuse what they would misread; the old fast commits were superseded when their transaction became durable (step 4 for this tid) |
//! | 6 | write the blocks but the first, flush, then the first with FUA | the file's data (written by the caller) and the later blocks are durable before the block that makes them reachable: the first block holds the HEAD at area block 0, or follows a good TAIL, so a crash before it leaves a scan that stops there; a HEAD whose fast commit does not fit in one sector gets a block of its own ([`pack`]) |
//! | 7 | unpin | the transaction may lock and commit |
//!
//! Step 6 orders every crash state: the first block's write (FUA) is the single point where the
//! fast commit becomes visible, and everything after it in the area was flushed before. A torn or
//! missing first block is a stale or foreign record where the scan stops (after the previous good
//! TAIL), a HEAD of another tid (no fast commits) or an empty fast commit whole, never a damaged
//! area before any good TAIL (which would fail the kernel's recovery with EFSBADCRC).
//!
//! Lock order: `j_fc_lock` is taken before `j_state_lock` and held across the area's I/O and
//! the wait for the previous transaction, which needs none of the engine's other locks.

use crate::error::Result;
use crate::journal::Shared;
use crate::stats;
use crate::transaction::{Transaction, TxnState};
use ondisk::jbd2::fast_commit::{fast_commit_len, fast_commit_records, pack_fast_commit, FcRecord};
use ondisk::jbd2::feature::INCOMPAT_QUILL_FC_AREAS;
use ondisk::Tid;
use parking_lot::Mutex;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// Why a fast commit was not written: the caller commits the transaction instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FcFallback {
    /// The journal was not opened with `fsync_journal`.
    Off,
    /// The transaction is no longer running: its full commit has begun.
    NotRunning,
    /// The area has no room left for this fast commit before the next full commit.
    AreaFull,
}

impl FcFallback {
    /// The name the engine figures count it under.
    pub fn name(self) -> &'static str {
        match self {
            FcFallback::Off => "off",
            FcFallback::NotRunning => "transaction committing",
            FcFallback::AreaFull => "area full",
        }
    }
}

/// What [`crate::Journal::fast_commit`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FastCommitOutcome {
    /// The records are durable: `blocks` area blocks were written.
    Durable { blocks: u32 },
    /// Nothing was written; commit the transaction instead.
    Fallback(FcFallback),
}

/// The fast-commit area: one standard area, or (`fc_areas` > 1) iJournaling's per-core areas,
/// each with its own `j_fc_lock` and laid out as a standard area.
///
/// A file's fast commits always go to the same area (chosen by inode number), so each area
/// keeps one file's in order; fast commits of different files commute, because within a
/// transaction they share no block (freed blocks are not reused before the transaction that
/// freed them is durable), no inode number and no name (`fsync_journal.rs` in the fs crate
/// keeps creations that would from being fast commits). The one inode two files' fast
/// commits share is a file deleted by another's (a name it had taken by a create or a
/// rename over it): its own fast commits of the transaction must then be in the deleting
/// file's area, written and replayed before the delete (`fsync_journal.rs` commits
/// otherwise). Recovery replays the areas one after the other.
///
/// Per-core areas are quill's own encoding: while any of them holds fast commits the journal
/// superblock has INCOMPAT_QUILL_FC_AREAS (written before the first of them, cleared once a
/// full commit has superseded them all), so stock tools refuse a journal they would misread,
/// and a clean journal is always standard (DESIGN.md §1).
///
/// Lock order: area locks (in index order) before the superblock's, both before
/// `j_state_lock`.
pub(crate) struct FcArea {
    areas: Vec<AreaSlot>,
    /// The journal block after the area (`s_maxlen`).
    end: u32,
}

/// One area: its `j_fc_lock` and the fast commits waiting for it.
///
/// Fast commits are group-committed, as JBD2 group-commits fsyncs and as the kernel's
/// `ext4_fc_commit` lets an fsync whose changes another fast commit carries return with it: an
/// fsync queues its records; if the area's lock is free it leads, writing every queued request
/// of the newest transaction as one fast commit (one flush, one FUA write), batch after batch
/// while requests keep coming; otherwise it parks until a batch carries its request (the
/// leader unparks each owner) or the lock comes free (whoever lets it go unparks the owner of
/// the first queued request). Waiters are never woken through a shared lock: on a 2-core
/// machine with 32 fsyncing threads, a lock passed through every done waiter, one wake-up
/// after another, held the next batch back (two fsyncs per write). Without batches at all, N
/// concurrent fsyncs paid N flush and FUA pairs in turn.
///
/// Lock order: the area lock before `queue`; `queue` is held only to push or take requests,
/// never while taking the area lock.
struct AreaSlot {
    state: Mutex<AreaState>,
    queue: Mutex<Vec<Arc<Request>>>,
}

impl AreaSlot {
    /// After the area's lock was let go: the owner of the first queued request (if any) must
    /// look again, to lead.
    fn wake_next(&self) {
        if let Some(next) = self.queue.lock().first() {
            next.owner.unpark();
        }
    }
}

/// One fsync's fast commit, waiting in an area's queue.
struct Request {
    tid: Tid,
    /// Its records, TLV-encoded (so a batch owns them).
    encoded: Vec<u8>,
    /// Set by the batch that carried it: the outcome, or `Err` when the batch failed (the
    /// journal is then aborted and says why).
    done: Mutex<Option<std::result::Result<FastCommitOutcome, ()>>>,
    /// The fsync's thread, unparked when `done` is set or when it may lead.
    owner: std::thread::Thread,
}

struct AreaState {
    /// Journal block of area block 0 (`j_fc_first`) and the area's length in blocks.
    first: u32,
    len: u32,
    /// The tid whose fast commits the area holds, and the next free area block.
    tid: Option<Tid>,
    next: u32,
}

/// The area's last block is left zero. The kernel's and e2fsck's recovery (jbd2's
/// `fc_do_one_pass`) read area blocks until the replay callback says stop, up to
/// `j_fc_last`, which is `s_maxlen`: one block past the journal, where `jread` fails ("JBD2:
/// corrupted journal superblock") and the mount with it. A zero block stops the scan (tag 0 is
/// no record), so an area whose fast commits fill it to the end would make the image
/// unmountable; the kernel's own writer stops one block short too (`jbd2_fc_get_buf`). Seen
/// when concurrent fsyncs filled a 15-block area. The block is zeroed when the journal
/// attaches with fast commits ([`zero_area_end`]).
pub(crate) const AREA_END_GUARD: u32 = 1;

/// Writes zeros over the area's guard block (made durable by the first fast commit's flush,
/// before any block it writes could lead a scan there).
pub(crate) fn zero_area_end(shared: &Shared) -> Result<()> {
    let Some(fc) = &shared.fc_area else { return Ok(()) };
    let last = fc.end - 1;
    let zeros = vec![0u8; shared.location.block_size() as usize];
    shared
        .dev
        .write_at(shared.log_offset(last), &zeros)
        .map_err(|e| shared.abort_on("zeroing the fast-commit area's last block", e))
}

/// Blocks a per-core area needs at least: a fast commit of a few blocks, and another.
pub(crate) const FC_AREA_BLOCKS_MIN: u32 = 4;

impl FcArea {
    /// The area `[first, end)` of the journal (`log_end + 1 .. max_len`), in `parts` equal
    /// areas (1: the standard one). Its last block is never written (see
    /// [`AREA_END_GUARD`]). `Err` when per-core areas would be smaller than
    /// [`FC_AREA_BLOCKS_MIN`].
    pub fn new(first: u32, end: u32, parts: u32) -> std::result::Result<FcArea, String> {
        let usable = end - AREA_END_GUARD - first;
        if parts > 1 && usable / parts < FC_AREA_BLOCKS_MIN {
            return Err(format!(
                "fc_areas = {parts}: the fast-commit area of {usable} blocks leaves fewer than \
                 {FC_AREA_BLOCKS_MIN} blocks to each"
            ));
        }
        let areas = ondisk::jbd2::fast_commit_parts(first, end - AREA_END_GUARD, parts)
            .into_iter()
            .map(|r| AreaSlot {
                state: Mutex::new(AreaState {
                    first: r.start,
                    len: r.end - r.start,
                    tid: None,
                    next: 0,
                }),
                queue: Mutex::new(Vec::new()),
            })
            .collect();
        Ok(FcArea { areas, end })
    }

    fn per_core(&self) -> bool {
        self.areas.len() > 1
    }
}

/// The superblock's INCOMPAT_QUILL_FC_AREAS set (and the area count), durable before a per-core
/// area is written; called under that area's lock. The superblock itself says whether it is
/// set already.
fn flag_areas(shared: &Shared, fc: &FcArea) -> Result<()> {
    let areas = fc.areas.len() as u32;
    let written = shared.update_superblock_if(
        |sb| !sb.has_incompat(INCOMPAT_QUILL_FC_AREAS),
        |sb| sb.set_fc_areas(Some(areas)),
    )?;
    if written {
        stats::add(&shared.counters.fast_commit_syncs, 1);
    }
    Ok(())
}

/// Called once transactions became durable, the newest being `durable`: when the area holds
/// the fast commits of a transaction that is durable now, its first block (the HEAD) is zeroed
/// with a FUA write. They are superseded, and a HEAD of an older tid than recovery expects is
/// one e2fsck 1.47.0 refuses ("Invalid argument while recovering journal": its
/// `ext4_fc_replay_scan` returns EINVAL where the kernel's stops), after which it checks the
/// file system without replaying the log. A zeroed first block is "no fast commits" to
/// every reader. An area whose lock a fast commit holds is left to it: that fast commit is of a
/// newer transaction and rewrites the first block itself.
///
/// Per-core areas: once every area is empty, the superblock's INCOMPAT_QUILL_FC_AREAS is
/// cleared, with every area lock held so that no fast commit is being written meanwhile.
pub(crate) fn retire_superseded(shared: &Shared, durable: Tid) -> Result<()> {
    let Some(fc) = &shared.fc_area else { return Ok(()) };
    let retired = retire_areas(shared, fc, durable);
    // An fsync that found an area's lock taken here waits for a leader: it must look again
    // (also after an error, which aborted the journal: it then gets the abort).
    for slot in &fc.areas {
        slot.wake_next();
    }
    retired
}

/// [`retire_superseded`] under the areas' locks (those it can take at once).
fn retire_areas(shared: &Shared, fc: &FcArea, durable: Tid) -> Result<()> {
    let mut idle = true;
    let mut held = Vec::with_capacity(fc.areas.len());
    for area in &fc.areas {
        let Some(mut area) = area.state.try_lock() else {
            idle = false;
            continue;
        };
        match area.tid {
            Some(tid) if durable.is_at_or_after(tid) => {
                let zeros = vec![0u8; shared.location.block_size() as usize];
                shared
                    .dev
                    .write_fua_at(shared.log_offset(area.first), &zeros)
                    .map_err(|e| shared.abort_on("retiring superseded fast commits", e))?;
                stats::add(&shared.counters.fast_commit_syncs, 1);
                area.tid = None;
                area.next = 0;
            }
            Some(_) => idle = false,
            None => {}
        }
        held.push(area);
    }
    if fc.per_core() && idle {
        clear_flag(shared)?;
    }
    Ok(())
}

/// The superblock's INCOMPAT_QUILL_FC_AREAS cleared, every area being empty and locked.
fn clear_flag(shared: &Shared) -> Result<()> {
    let written = shared.update_superblock_if(
        |sb| sb.has_incompat(INCOMPAT_QUILL_FC_AREAS),
        |sb| sb.set_fc_areas(None),
    )?;
    if written {
        stats::add(&shared.counters.fast_commit_syncs, 1);
    }
    Ok(())
}

/// A running transaction kept from being locked while its fast commit is written (the
/// kernel's `JBD2_FAST_COMMIT_ONGOING`): the commit stage waits for its pins before it locks
/// the transaction ([`wait_fast_commits`]). Handles go on joining meanwhile, as in the
/// kernel, whose full commit waits for an ongoing fast commit before `T_LOCKED`; a pin counted
/// as an open handle instead held every new handle back for the fast commit's flush and FUA
/// write.
struct Pin<'a> {
    shared: &'a Shared,
    txn: Arc<Transaction>,
}

impl Drop for Pin<'_> {
    fn drop(&mut self) {
        if self.txn.fc_writers.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.shared.commit_wake.wake_all();
        }
    }
}

/// Pins transaction `tid` if it is the running one and no full commit of it has been asked
/// for (the kernel's `JBD2_FULL_COMMIT_ONGOING`). Once one has (an fsync that fell back, a
/// sync, a full area, or the commit stage itself: [`wait_fast_commits`]), a fast commit would
/// only hold that commit back for its own flush and FUA write: its fsyncs join the full
/// commit instead, which makes them durable at the same time and writes nothing more for
/// them.
fn pin_running(shared: &Shared, tid: Tid) -> Result<Option<Pin<'_>>> {
    let st = shared.state.read(&shared.locks);
    st.aborted()?;
    let Some(running) = st.txns().running() else { return Ok(None) };
    if running.tid() != tid
        || running.state() != TxnState::Running
        || st.commit_request().is_some_and(|r| r.is_at_or_after(tid))
    {
        return Ok(None);
    }
    // Under the read lock no commit can be requested (that takes the write lock), so the
    // commit stage's wait sees this pin.
    running.txn.fc_writers.fetch_add(1, Ordering::AcqRel);
    Ok(Some(Pin { shared, txn: running.txn.clone() }))
}

/// The commit stage's step before it locks `txn`: no new fast commit of it may begin (its
/// commit is requested, if the interval and not a request brought it here), and those being
/// written finish (jbd2_journal_commit_transaction's wait for `JBD2_FAST_COMMIT_ONGOING`,
/// then `JBD2_FULL_COMMIT_ONGOING`). A fast commit must not be in flight while its
/// transaction commits: once the transaction is durable its fast commits are retired
/// (`retire_superseded`), which takes for granted that a fast commit holding an area's lock
/// is of a newer transaction.
pub(crate) fn wait_fast_commits(shared: &Shared, txn: &Transaction) {
    if shared.fc_area.is_none() {
        return;
    }
    shared.request_commit(txn.tid);
    let waited = Instant::now();
    loop {
        let ticket = shared.commit_wake.ticket();
        if txn.fc_writers.load(Ordering::Acquire) == 0 {
            break;
        }
        shared.commit_wake.wait(ticket);
    }
    stats::add_time(&shared.counters.ns_fast_commit_wait, waited.elapsed());
}

/// A fast commit queued in its area ([`queue`]); [`FcTicket::wait`] returns its outcome.
pub struct FcTicket {
    area: usize,
    request: Arc<Request>,
}

/// The area of file `file`'s fast commits.
pub(crate) fn area_of(fc: &FcArea, file: u32) -> usize {
    file as usize % fc.areas.len()
}

/// Queues a fast commit of `records` for transaction `tid` in file `file`'s area, or says why
/// there is none to queue. Fast commits of one file reach the area in the order they are
/// queued, and recovery replays them in that order: a caller queues under the file's lock,
/// so that an older fast commit of the file (its INODE, its DEL_RANGEs) can never be
/// written after a newer one. The area is the fsynced file's, named by the caller, not that
/// of the first inode in `records`: a rename over another file opens with the replaced
/// file's records, and its fast commit would land in that file's area, to be replayed
/// before or after the CREAT of the renamed file (an earlier fast commit, in its own area)
/// by area order alone (crash explorer seed 3012557888514903091, per-core areas: the
/// renamed file kept its old name, and the name it took was lost).
pub(crate) fn queue(
    shared: &Shared,
    tid: Tid,
    file: u32,
    records: &[FcRecord<'_>],
) -> std::result::Result<FcTicket, FcFallback> {
    let Some(fc) = &shared.fc_area else { return Err(FcFallback::Off) };
    // One file's fast commits in one area, in order (see FcArea).
    let area = area_of(fc, file);
    let mut encoded = Vec::new();
    for record in records {
        record.encode(&mut encoded);
    }
    let request =
        Arc::new(Request { tid, encoded, done: Mutex::new(None), owner: std::thread::current() });
    fc.areas[area].queue.lock().push(request.clone());
    Ok(FcTicket { area, request })
}

impl FcTicket {
    /// Waits until a batch carries the fast commit, leading the area's batches when it is free.
    pub(crate) fn wait(self, shared: &Shared) -> Result<FastCommitOutcome> {
        let fc = shared.fc_area.as_ref().expect("queued in an area");
        let slot = &fc.areas[self.area];
        let me = &self.request;
        loop {
            if let Some(done) = me.done.lock().take() {
                // A batch carried it (this thread's, or the leader's of the moment).
                let outcome = done_outcome(shared, done);
                if let Ok(FastCommitOutcome::Fallback(reason)) = &outcome {
                    shared.note_fast_commit_fallback(reason.name());
                }
                return outcome;
            }
            if let Some(mut area) = slot.state.try_lock() {
                lead(shared, fc, slot, &mut area, me);
                drop(area);
                slot.wake_next();
                continue;
            }
            // Unparked when a batch carries the request or the lock comes free (an unpark
            // that comes first makes this return at once); the timeout is only a guard.
            std::thread::park_timeout(PARK_GUARD);
        }
    }
}

/// How long an fsync waiting for its fast commit sleeps at most before looking again: a guard,
/// not the mechanism (it is unparked).
const PARK_GUARD: std::time::Duration = std::time::Duration::from_millis(20);

/// Batches a leader writes after its own request's, at most, before it hands the area over
/// (its fsync has returned nothing until then).
const LEAD_AFTER_DONE: usize = 4;

/// The leader's loop, holding the area's lock: takes what is queued as one batch, writes it,
/// marks each request done and unparks its owner, and goes on while requests keep coming
/// (handing the lock over would cost a wake-up per batch), at most [`LEAD_AFTER_DONE`]
/// batches after its own.
fn lead(shared: &Shared, fc: &FcArea, slot: &AreaSlot, area: &mut AreaState, me: &Arc<Request>) {
    let mut after_done = 0;
    while after_done <= LEAD_AFTER_DONE {
        let batch = std::mem::take(&mut *slot.queue.lock());
        if batch.is_empty() {
            break;
        }
        // The newest transaction among them: only it can still be running (the others fall
        // back).
        let tid = batch.iter().map(|r| r.tid).reduce(|a, b| if b.is_after(a) { b } else { a });
        let tid = tid.expect("a batch is not empty");
        let outcome = write_batch(shared, fc, area, tid, &batch);
        for request in &batch {
            let result = match &outcome {
                Err(_) => Err(()),
                Ok(_) if request.tid != tid => {
                    Ok(FastCommitOutcome::Fallback(FcFallback::NotRunning))
                }
                Ok(outcome) => Ok(*outcome),
            };
            *request.done.lock() = Some(result);
            request.owner.unpark();
        }
        if me.done.lock().is_some() {
            after_done += 1;
        }
    }
}

/// What a request's batch left it.
fn done_outcome(
    shared: &Shared,
    done: std::result::Result<FastCommitOutcome, ()>,
) -> Result<FastCommitOutcome> {
    match done {
        Ok(outcome) => Ok(outcome),
        Err(()) => {
            shared.check_aborted()?;
            // Not aborted (every failure of a batch aborts the journal, so this is a guard).
            Err(crate::error::JournalError::Aborted {
                cause: "the fast commit carrying this fsync failed".into(),
                errno: EIO,
            })
        }
    }
}

/// errno EIO.
const EIO: i32 = 5;

/// The smallest write a device may tear: what the crash explorer's torn writes keep or lose.
const SECTOR: usize = 512;

/// Lays out the fast commit of `records` ([`pack_fast_commit`]). The first fast commit of a
/// transaction (`head`) makes the area's block 0 new, and the scan of every recovery fails
/// (the kernel's with ECANCELED or EFSCORRUPTED, refusing the mount) on a damaged record
/// before the first good TAIL. A torn write of block 0 that kept the HEAD's sector but not
/// the rest of the fast commit would leave just that. So where the HEAD, the records and the
/// TAIL's crc do not all fit in block 0's first sector, the HEAD goes alone in block 0,
/// closed by a TAIL of its own (an empty fast commit, which replays as nothing), and the
/// records follow in the next blocks: a tear of block 0 then keeps or loses the empty fast
/// commit whole, and the blocks after it were flushed before it (step 6).
fn pack(records: &[FcRecord<'_>], block_size: usize, tid: Tid, head: bool) -> Vec<Vec<u8>> {
    let blocks = pack_fast_commit(records, block_size, tid, head);
    if !head || (blocks.len() == 1 && fast_commit_len(records, true) <= SECTOR) {
        return blocks;
    }
    let mut split = pack_fast_commit(&[], block_size, tid, true);
    split.extend(pack_fast_commit(records, block_size, tid, false));
    split
}

/// Writes the requests of `batch` that belong to transaction `tid` as one fast commit, under
/// the area's lock. The outcome applies to each of them (the others fall back).
fn write_batch(
    shared: &Shared,
    fc: &FcArea,
    area: &mut AreaState,
    tid: Tid,
    batch: &[Arc<Request>],
) -> Result<FastCommitOutcome> {
    let started = Instant::now();
    let Some(pin) = pin_running(shared, tid)? else {
        return Ok(FastCommitOutcome::Fallback(FcFallback::NotRunning));
    };
    // Recovery reads the area only of a journal whose superblock names a live log: in the
    // first transaction since attach nothing may have written it yet.
    shared.ensure_superblock_written()?;
    crate::journal::commit_and_wait(shared, tid.prev())?;
    if fc.per_core() {
        flag_areas(shared, fc)?;
    }
    let mut records = Vec::new();
    for request in batch.iter().filter(|r| r.tid == tid) {
        for tlv in fast_commit_records(&request.encoded, u16::MAX) {
            records.push(tlv.expect("records this journal encoded").record);
        }
    }
    let carried = batch.iter().filter(|r| r.tid == tid).count() as u64;
    let head = area.tid != Some(tid);
    let start = if head { 0 } else { area.next };
    let blocks = pack(&records, shared.location.block_size() as usize, tid, head);
    let count = blocks.len() as u32;
    if start + count > area.len {
        return Ok(FastCommitOutcome::Fallback(FcFallback::AreaFull));
    }
    let offset = |i: usize| shared.log_offset(area.first + start + i as u32);
    for (i, block) in blocks.iter().enumerate().skip(1) {
        shared
            .dev
            .write_at(offset(i), block)
            .map_err(|e| shared.abort_on("writing a fast commit", e))?;
    }
    shared.dev.flush().map_err(|e| shared.abort_on("flushing before a fast commit", e))?;
    shared
        .dev
        .write_fua_at(offset(0), &blocks[0])
        .map_err(|e| shared.abort_on("writing a fast commit", e))?;
    area.tid = Some(tid);
    area.next = start + count;
    drop(pin);
    stats::add(&shared.counters.fast_commits, carried);
    stats::add(&shared.counters.fast_commit_writes, 1);
    stats::add(&shared.counters.fast_commit_blocks, u64::from(count));
    stats::add(&shared.counters.fast_commit_syncs, 2);
    stats::add_time(&shared.counters.ns_fast_commit, started.elapsed());
    Ok(FastCommitOutcome::Durable { blocks: count })
}
