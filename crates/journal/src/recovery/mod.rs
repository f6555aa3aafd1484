//! Recovery (JBD2 recovery.c): replay the log into the file system's blocks.
//!
//! Three passes over the log from the superblock's tail (`s_sequence` at `s_start`):
//! - PASS_SCAN finds the end of the log: the first transaction without a valid commit block;
//! - PASS_REVOKE builds the revoke table from the committed transactions;
//! - PASS_REPLAY writes every logged block that is not revoked and whose tag checksum holds,
//!   in log order (later copies overwrite earlier ones).
//!
//! Our scan reads every control block once and keeps what the later passes need, so REVOKE and
//! REPLAY read only data blocks. One thread is JBD2's recovery ([`scan::scan_log`],
//! [`replay::pass_replay`]: one block at a time, in log order), the reference. With
//! `threads > 1` (FAST'18's parallel recovery) the scan's checksum checks run on worker threads
//! beside the sequential walk that finds the end of the log ([`scan_parallel`]), and the replay
//! reads, checks and writes home segments of the log in parallel, each block's newest valid copy
//! once, in batches sorted by home block ([`replay::pass_replay_parallel`]); both reach the
//! reference's result for every log, and the tests hold them to it.
//!
//! The scan stops (successfully) at the first block that:
//!
//! | condition | JBD2 rule |
//! |---|---|
//! | has no JBD2 magic | end of log |
//! | carries another tid than expected | end of log (stale block from an earlier lap) |
//! | is of an unknown type | end of log |
//! | is a commit block whose checksum fails | end of log at this tid (`async_commit`: go on, but nothing from it on is replayed) |
//! | is a commit block after a descriptor/revoke block whose checksum failed | older commit time: stale block, end of log; otherwise corruption (error) |
//!
//! Afterwards the journal is marked clean with `s_sequence` one past the end tid, so the tid
//! that may be half written in the log is never reused (JBD2 and e2fsck do the same).

use crate::error::{JournalError, Result};
use crate::fast_commit::{FastCommitArea, FastCommitReplay, FastCommitReport, RefuseFastCommits};
use crate::location::JournalLocation;
use crate::revoke::RevokeTable;
use crate::superblock::{read_superblock, write_superblock};
use blockdev::BlockDevice;
use ondisk::jbd2::{self, CommitBlock, DescriptorTag, JournalSuperblock};
use ondisk::Tid;
use std::time::Instant;

mod replay;
mod scan;
mod scan_parallel;

pub use scan::scan_log;
pub use scan_parallel::scan_log_parallel;

/// One transaction found by the scan.
#[derive(Debug, Clone, PartialEq)]
pub struct ScannedTransaction {
    pub tid: Tid,
    /// Log block of the transaction's first block.
    pub log_start: u32,
    /// Each logged block: where its image sits in the log, and its tag.
    pub tags: Vec<(u32, DescriptorTag)>,
    pub revokes: Vec<u64>,
    pub commit_sec: u64,
    pub commit_nsec: u32,
}

/// What PASS_SCAN found.
#[derive(Debug, Clone, PartialEq)]
pub struct LogScan {
    pub superblock: JournalSuperblock,
    /// Committed transactions, oldest first (only those before `end_tid`).
    pub transactions: Vec<ScannedTransaction>,
    /// The first tid that is not completely committed.
    pub end_tid: Tid,
    /// Why the scan stopped.
    pub stop_reason: String,
    /// The log block at which the scan stopped.
    pub stop_block: u32,
}

/// What a recovery did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RecoveryReport {
    /// The journal needed recovery (`s_start != 0`).
    pub needed: bool,
    pub first_tid: u32,
    pub end_tid: u32,
    pub transactions: usize,
    /// Block writes the in-order replay performs (the same block may count more than once).
    pub blocks_replayed: u64,
    /// Distinct file-system blocks written, sorted.
    pub replayed_blocks: Vec<u64>,
    pub revoke_records: usize,
    pub revoke_hits: u64,
    pub stop_reason: String,
    /// The tid the next transaction will use.
    pub next_tid: u32,
    /// Fast commits of `end_tid` replayed after the full commits.
    pub fast_commits: FastCommitReport,
    /// Time spent in PASS_SCAN and PASS_REVOKE (and reading the fast-commit area).
    pub scan_us: u64,
    /// Time spent in PASS_REPLAY: reading, checking and writing the logged blocks.
    pub replay_us: u64,
    /// Time of the flush that makes the replayed blocks durable.
    pub flush_us: u64,
}

/// Replays the journal at `location` if it needs it, then marks it clean.
pub fn recover(
    dev: &dyn BlockDevice,
    location: &JournalLocation,
    threads: usize,
) -> Result<RecoveryReport> {
    recover_with_progress(dev, location, threads, &|_, _| {})
}

/// [`recover`], calling `progress(done, total)` as the replay goes: `total` is the number of
/// logged blocks the scan found, `done` how many of them the replay has dealt with (written,
/// skipped as revoked, or superseded by a newer copy). With `threads > 1` the calls come from
/// the replay threads, in no particular order of `done`.
///
/// A journal whose fast-commit area holds fast commits to replay is refused before anything is
/// written ([`RefuseFastCommits`]); a file system that replays them calls
/// [`recover_with_fast_commits`].
pub fn recover_with_progress(
    dev: &dyn BlockDevice,
    location: &JournalLocation,
    threads: usize,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<RecoveryReport> {
    let mut refuse = RefuseFastCommits::default();
    recover_with_fast_commits(dev, location, threads, progress, &mut refuse)
}

/// [`recover_with_progress`], with `fast_commits` replaying the fast commits that extend the
/// last full commit (see [`crate::fast_commit`] for when each of its calls is made).
pub fn recover_with_fast_commits(
    dev: &dyn BlockDevice,
    location: &JournalLocation,
    threads: usize,
    progress: &(dyn Fn(u64, u64) + Sync),
    fast_commits: &mut dyn FastCommitReplay,
) -> Result<RecoveryReport> {
    let sb = read_superblock(dev, location)?;
    if sb.start == 0 {
        return Ok(RecoveryReport {
            needed: false,
            first_tid: sb.sequence.0,
            end_tid: sb.sequence.0,
            next_tid: sb.sequence.next().0,
            stop_reason: "journal is clean".into(),
            ..Default::default()
        });
    }
    let began = Instant::now();
    let scan = scan_log_with_threads(dev, location, threads)?;
    let area = FastCommitArea::read(dev, location, &scan.superblock, scan.end_tid)?;
    let area_scan = match &area {
        Some(area) => Some(area.scan(fast_commits.inode_size())?),
        None => None,
    };
    let pending = area.as_ref().zip(area_scan.as_ref()).filter(|(_, scan)| scan.commits > 0);
    if let Some((area, area_scan)) = pending {
        fast_commits.check(area, area_scan)?;
    }
    let revokes = pass_revoke(&scan);
    let scanned = Instant::now();
    let total: u64 = scan.transactions.iter().map(|t| t.tags.len() as u64).sum();
    progress(0, total);
    let replay = if threads > 1 {
        replay::pass_replay_parallel(dev, location, &scan, &revokes, threads, total, progress)?
    } else {
        replay::pass_replay(dev, location, &scan, &revokes, total, progress)?
    };
    let replayed = Instant::now();
    dev.flush()?;
    let flushed = Instant::now();
    let fast_commit_report = match pending {
        Some((area, area_scan)) => {
            let report = fast_commits.replay(area, area_scan)?;
            dev.flush()?;
            report
        }
        None => FastCommitReport::default(),
    };
    let mut clean = scan.superblock.clone();
    clean.sequence = scan.end_tid.next();
    clean.start = 0;
    // Per-core areas replayed (or superseded): the clean journal is standard again.
    clean.set_fc_areas(None);
    write_superblock(dev, location, &clean)?;
    dev.flush()?;
    let mut replayed_blocks: Vec<u64> = replay.written.into_iter().collect();
    replayed_blocks.sort_unstable();
    Ok(RecoveryReport {
        needed: true,
        first_tid: scan.superblock.sequence.0,
        end_tid: scan.end_tid.0,
        transactions: scan.transactions.len(),
        blocks_replayed: replay.writes,
        replayed_blocks,
        revoke_records: revokes.len(),
        revoke_hits: replay.revoke_hits,
        stop_reason: scan.stop_reason,
        next_tid: clean.sequence.next().0,
        fast_commits: fast_commit_report,
        scan_us: scanned.duration_since(began).as_micros() as u64,
        replay_us: replayed.duration_since(scanned).as_micros() as u64,
        flush_us: flushed.duration_since(replayed).as_micros() as u64,
    })
}

/// PASS_SCAN: the one-thread reference, or with `threads > 1` its checks on worker threads
/// (the same result).
pub fn scan_log_with_threads(
    dev: &dyn BlockDevice,
    location: &JournalLocation,
    threads: usize,
) -> Result<LogScan> {
    if threads > 1 {
        scan_log_parallel(dev, location, threads)
    } else {
        scan_log(dev, location)
    }
}

/// Reads journal block `block` into `buf` (block-sized); `Corrupted` when the journal does not
/// map it.
pub fn read_log_block(
    dev: &dyn BlockDevice,
    location: &JournalLocation,
    block: u32,
    buf: &mut [u8],
) -> Result<()> {
    dev.read_at(log_block_offset(location, block)?, buf)?;
    Ok(())
}

/// The device offset of journal block `block`; `Corrupted` when the journal does not map it.
fn log_block_offset(location: &JournalLocation, block: u32) -> Result<u64> {
    location.device_offset(block).ok_or_else(|| JournalError::Corrupted {
        log_block: block,
        reason: "log block outside the journal".into(),
    })
}

/// `do_one_pass` on a compat-v1 commit block: its CRC32 must be `crc`, the CRC of the
/// transaction's descriptor and data blocks; a commit without a checksum passes only until one
/// with a checksum has been seen (`checksum_seen`, updated).
fn v1_commit_checksum_ok(commit: &CommitBlock, crc: u32, checksum_seen: &mut bool) -> bool {
    let matches = commit.checksum == crc
        && commit.chksum_type == jbd2::JBD2_CRC32_CHKSUM
        && commit.chksum_size == jbd2::JBD2_CRC32_CHKSUM_SIZE;
    let unused = commit.chksum_type == 0
        && commit.chksum_size == 0
        && commit.checksum == 0
        && !*checksum_seen;
    if commit.chksum_type == jbd2::JBD2_CRC32_CHKSUM {
        *checksum_seen = true;
    }
    matches || unused
}

/// Reads the journal blocks from `first` on into `buf` (a whole number of blocks, none past the
/// end of the journal), with one device read per stretch the journal maps contiguously.
pub fn read_log_run(
    dev: &dyn BlockDevice,
    location: &JournalLocation,
    first: u32,
    buf: &mut [u8],
) -> Result<()> {
    let size = location.block_size() as usize;
    assert!(buf.len().is_multiple_of(size), "a run is whole blocks");
    let blocks = (buf.len() / size) as u32;
    let mut start = 0u32;
    while start < blocks {
        let offset = log_block_offset(location, first + start)?;
        let mut end = start + 1;
        while end < blocks
            && location.device_offset(first + end)
                == Some(offset + (end - start) as u64 * size as u64)
        {
            end += 1;
        }
        dev.read_at(offset, &mut buf[start as usize * size..end as usize * size])?;
        start = end;
    }
    Ok(())
}

impl ScannedTransaction {
    fn new(tid: Tid, log_start: u32) -> Self {
        ScannedTransaction {
            tid,
            log_start,
            tags: Vec::new(),
            revokes: Vec::new(),
            commit_sec: 0,
            commit_nsec: 0,
        }
    }
}

/// PASS_REVOKE.
pub fn pass_revoke(scan: &LogScan) -> RevokeTable {
    let mut table = RevokeTable::new();
    for txn in &scan.transactions {
        for &block in &txn.revokes {
            table.set(block, txn.tid);
        }
    }
    table
}
