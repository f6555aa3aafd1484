//! Recovery (JBD2 recovery.c): replay the log into the file system's blocks.
//!
//! Three passes over the log from the superblock's tail (`s_sequence` at `s_start`):
//! - PASS_SCAN finds the end of the log: the first transaction without a valid commit block;
//! - PASS_REVOKE builds the revoke table from the committed transactions;
//! - PASS_REPLAY writes every logged block that is not revoked and whose tag checksum holds,
//!   in log order (later copies overwrite earlier ones).
//!
//! Our scan reads every control block once and keeps what the later passes need, so REVOKE and
//! REPLAY read only data blocks. With `threads > 1` the replay is partitioned by home block:
//! each block's newest valid copy wins, which is the state the in-order replay leaves.
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
use ondisk::jbd2::{
    self, feature, parse_commit_block, parse_descriptor_tags, parse_header, parse_revoke_block,
    tag_checksum_matches, unescape_block, verify_block_tail, verify_commit_checksum,
    verify_commit_checksum_partial, BlockType, ChecksumVersion, DescriptorTag, JournalSuperblock,
    LogFormat,
};
use ondisk::Tid;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// One transaction found by the scan.
#[derive(Debug, Clone)]
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
#[derive(Debug, Clone)]
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
    let scan = scan_log(dev, location)?;
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
    let total: u64 = scan.transactions.iter().map(|t| t.tags.len() as u64).sum();
    progress(0, total);
    let replay = if threads > 1 {
        pass_replay_parallel(dev, location, &scan, &revokes, threads, total, progress)?
    } else {
        pass_replay(dev, location, &scan, &revokes, total, progress)?
    };
    dev.flush()?;
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
    })
}

/// Reads journal block `block` into `buf` (block-sized); `Corrupted` when the journal does not
/// map it.
pub fn read_log_block(
    dev: &dyn BlockDevice,
    location: &JournalLocation,
    block: u32,
    buf: &mut [u8],
) -> Result<()> {
    let offset = location.device_offset(block).ok_or_else(|| JournalError::Corrupted {
        log_block: block,
        reason: "log block outside the journal".into(),
    })?;
    dev.read_at(offset, buf)?;
    Ok(())
}

/// PASS_SCAN. Works on any journal, clean or not (a clean one is scanned from `s_first`
/// with tid `s_sequence`, which is what `journal dump` shows).
pub fn scan_log(dev: &dyn BlockDevice, location: &JournalLocation) -> Result<LogScan> {
    let sb = read_superblock(dev, location)?;
    let format = sb.format();
    let (first, end) = (sb.first, sb.log_end());
    let capacity = end - first;
    let wrap = |b: u32| if b >= end { b - capacity } else { b };
    let async_commit = sb.has_incompat(feature::INCOMPAT_ASYNC_COMMIT);
    let v1 = format.checksum == ChecksumVersion::V1;
    let v2_or_3 = matches!(format.checksum, ChecksumVersion::V2 | ChecksumVersion::V3);

    let mut pos = if sb.start != 0 { sb.start } else { first };
    let mut next_commit = sb.sequence;
    let mut transactions = Vec::new();
    let mut current = ScannedTransaction::new(next_commit, pos);
    let mut end_tid: Option<Tid> = None;
    let mut need_check_commit_time = false;
    let mut last_commit_time = 0u64;
    let mut v1_crc = !0u32;
    let mut v1_checksum_seen = false;
    let mut blocks_in_transaction = 0u32;
    let mut block = vec![0u8; format.block_size as usize];
    let mut data = vec![0u8; format.block_size as usize];

    let (stop_reason, stop_block) = loop {
        if blocks_in_transaction > capacity {
            // A transaction cannot be longer than the log; the log is a loop of valid blocks.
            break (format!("transaction {next_commit} runs around the whole log"), pos);
        }
        let here = pos;
        read_log_block(dev, location, here, &mut block)?;
        pos = wrap(pos + 1);
        blocks_in_transaction += 1;
        let Some(header) = parse_header(&block) else {
            break ("no journal magic".into(), here);
        };
        if header.sequence != next_commit {
            break (format!("block has tid {}, expected {next_commit}", header.sequence), here);
        }
        match header.block_type {
            t if t == BlockType::Descriptor as u32 => {
                if v2_or_3 && !verify_block_tail(&format, &block) {
                    need_check_commit_time = true;
                }
                let tags = match parse_descriptor_tags(&format, &block) {
                    Ok(tags) => tags,
                    Err(e) => break (format!("unreadable descriptor: {e}"), here),
                };
                let accumulate_v1 = v1 && !need_check_commit_time && end_tid.is_none();
                if accumulate_v1 {
                    v1_crc = jbd2::v1_crc_update(v1_crc, &block);
                }
                for tag in tags {
                    if accumulate_v1 {
                        read_log_block(dev, location, pos, &mut data)?;
                        v1_crc = jbd2::v1_crc_update(v1_crc, &data);
                    }
                    current.tags.push((pos, tag));
                    pos = wrap(pos + 1);
                    blocks_in_transaction += 1;
                }
            }
            t if t == BlockType::Revoke as u32 => {
                let tail_ok = !v2_or_3 || verify_block_tail(&format, &block);
                if !tail_ok {
                    need_check_commit_time = true;
                }
                match parse_revoke_block(&format, &block) {
                    Ok(records) => current.revokes.extend(records),
                    // A revoke block with a bad checksum may be stale; the commit decides.
                    Err(_) if !tail_ok => {}
                    Err(e) => {
                        return Err(JournalError::Corrupted {
                            log_block: here,
                            reason: e.to_string(),
                        })
                    }
                }
            }
            t if t == BlockType::Commit as u32 => {
                let commit = match parse_commit_block(&format, &block) {
                    Ok(c) => c,
                    Err(e) => break (format!("unreadable commit block: {e}"), here),
                };
                let commit_time = commit.commit_sec;
                if need_check_commit_time {
                    if commit_time >= last_commit_time {
                        return Err(JournalError::Corrupted {
                            log_block: here,
                            reason: format!("invalid checksum found in transaction {next_commit}"),
                        });
                    }
                    break (
                        format!("stale blocks in transaction {next_commit} (older commit time)"),
                        here,
                    );
                }
                let mut checksum_ok = true;
                if v1 {
                    if end_tid.is_some() {
                        break (format!("transaction {next_commit} follows a failed commit"), here);
                    }
                    // do_one_pass: a commit without a checksum passes only until one with a
                    // checksum has been seen.
                    let matches = commit.checksum == v1_crc
                        && commit.chksum_type == jbd2::JBD2_CRC32_CHKSUM
                        && commit.chksum_size == jbd2::JBD2_CRC32_CHKSUM_SIZE;
                    let unused = commit.chksum_type == 0
                        && commit.chksum_size == 0
                        && commit.checksum == 0
                        && !v1_checksum_seen;
                    checksum_ok = matches || unused;
                    if commit.chksum_type == jbd2::JBD2_CRC32_CHKSUM {
                        v1_checksum_seen = true;
                    }
                    v1_crc = !0;
                }
                // Recent kernels also accept a checksum over the 64-byte header only.
                let commit_checksum_ok = verify_commit_checksum(&format, &block)
                    || verify_commit_checksum_partial(&format, &block);
                if v2_or_3 && !commit_checksum_ok {
                    checksum_ok = false;
                }
                if !checksum_ok {
                    if commit_time < last_commit_time {
                        break (format!("stale commit block for transaction {next_commit}"), here);
                    }
                    end_tid = Some(next_commit);
                    if !async_commit {
                        break (
                            format!("commit block of transaction {next_commit} has a bad checksum"),
                            here,
                        );
                    }
                }
                last_commit_time = commit_time;
                current.commit_sec = commit.commit_sec;
                current.commit_nsec = commit.commit_nsec;
                let done = std::mem::replace(
                    &mut current,
                    ScannedTransaction::new(next_commit.next(), pos),
                );
                if end_tid.is_none() {
                    transactions.push(done);
                }
                next_commit = next_commit.next();
                blocks_in_transaction = 0;
            }
            other => break (format!("unknown block type {other}"), here),
        }
    };
    Ok(LogScan {
        superblock: sb,
        transactions,
        end_tid: end_tid.unwrap_or(next_commit),
        stop_reason,
        stop_block,
    })
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

#[derive(Default)]
struct ReplayOutcome {
    writes: u64,
    revoke_hits: u64,
    written: std::collections::HashSet<u64>,
    checksum_failures: Vec<(u32, u64)>,
}

/// Reads a logged block image, checks its tag, restores an escaped magic, and returns the
/// home block it belongs to; `None` when the tag checksum fails.
fn read_logged_image(
    dev: &dyn BlockDevice,
    location: &JournalLocation,
    format: &LogFormat,
    tid: Tid,
    log_block: u32,
    tag: &DescriptorTag,
    image: &mut [u8],
) -> Result<bool> {
    read_log_block(dev, location, log_block, image)?;
    if !tag_checksum_matches(format, tid, tag, image) {
        return Ok(false);
    }
    if tag.is_escaped() {
        unescape_block(image);
    }
    Ok(true)
}

fn write_home(
    dev: &dyn BlockDevice,
    format: &LogFormat,
    log_block: u32,
    block: u64,
    image: &[u8],
) -> Result<()> {
    let offset = block
        .checked_mul(format.block_size as u64)
        .filter(|o| o + format.block_size as u64 <= dev.size_bytes())
        .ok_or_else(|| JournalError::Corrupted {
            log_block,
            reason: format!("logged block {block} lies outside the device"),
        })?;
    dev.write_at(offset, image)?;
    Ok(())
}

/// PASS_REPLAY in log order, one thread (JBD2).
fn pass_replay(
    dev: &dyn BlockDevice,
    location: &JournalLocation,
    scan: &LogScan,
    revokes: &RevokeTable,
    total: u64,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<ReplayOutcome> {
    let format = scan.superblock.format();
    let mut outcome = ReplayOutcome::default();
    let mut image = vec![0u8; format.block_size as usize];
    let mut done = 0u64;
    for txn in &scan.transactions {
        for (log_block, tag) in &txn.tags {
            done += 1;
            progress(done, total);
            if revokes.is_revoked(tag.block, txn.tid) {
                outcome.revoke_hits += 1;
                continue;
            }
            if !read_logged_image(dev, location, &format, txn.tid, *log_block, tag, &mut image)? {
                outcome.checksum_failures.push((*log_block, tag.block));
                continue;
            }
            write_home(dev, &format, *log_block, tag.block, &image)?;
            outcome.writes += 1;
            outcome.written.insert(tag.block);
        }
    }
    finish_replay(outcome)
}

/// One logged copy of a block: its transaction, where it sits in the log, and its tag.
type LoggedCopy = (Tid, u32, DescriptorTag);

/// PASS_REPLAY partitioned by home block over `threads` threads: each block's newest copy
/// whose checksum holds is written once.
fn pass_replay_parallel(
    dev: &dyn BlockDevice,
    location: &JournalLocation,
    scan: &LogScan,
    revokes: &RevokeTable,
    threads: usize,
    total: u64,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<ReplayOutcome> {
    let format = scan.superblock.format();
    let mut outcome = ReplayOutcome::default();
    // Every copy of each block, newest last.
    let mut copies: HashMap<u64, Vec<LoggedCopy>> = HashMap::new();
    for txn in &scan.transactions {
        for (log_block, tag) in &txn.tags {
            if revokes.is_revoked(tag.block, txn.tid) {
                outcome.revoke_hits += 1;
                continue;
            }
            outcome.writes += 1;
            copies.entry(tag.block).or_default().push((txn.tid, *log_block, *tag));
        }
    }
    let mut blocks: Vec<&Vec<LoggedCopy>> = copies.values().collect();
    blocks.sort_by_key(|c| c[0].2.block);
    // Revoked copies are dealt with already; each home block's copies count when it is done.
    let done = AtomicU64::new(outcome.revoke_hits);
    progress(outcome.revoke_hits, total);
    let done = &done;
    let chunk = blocks.len().div_ceil(threads.max(1)).max(1);
    // Per worker: the home blocks written, and (log block, home block) of failed checksums.
    type WorkerOutcome = Result<(Vec<u64>, Vec<(u32, u64)>)>;
    let results: Vec<WorkerOutcome> = std::thread::scope(|scope| {
        let workers: Vec<_> = blocks
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || {
                    let mut image = vec![0u8; format.block_size as usize];
                    let mut written = Vec::new();
                    let mut failures = Vec::new();
                    for copies in part {
                        for (tid, log_block, tag) in copies.iter().rev() {
                            if read_logged_image(
                                dev, location, &format, *tid, *log_block, tag, &mut image,
                            )? {
                                write_home(dev, &format, *log_block, tag.block, &image)?;
                                written.push(tag.block);
                                break;
                            }
                            failures.push((*log_block, tag.block));
                        }
                        let n = copies.len() as u64;
                        progress(done.fetch_add(n, Ordering::Relaxed) + n, total);
                    }
                    Ok((written, failures))
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("replay worker panicked")).collect()
    });
    for result in results {
        let (written, failures) = result?;
        outcome.written.extend(written);
        outcome.checksum_failures.extend(failures);
    }
    finish_replay(outcome)
}

/// JBD2 replays every other block and then fails recovery when a tag checksum failed.
fn finish_replay(outcome: ReplayOutcome) -> Result<ReplayOutcome> {
    if let Some(&(log_block, block)) = outcome.checksum_failures.first() {
        return Err(JournalError::Corrupted {
            log_block,
            reason: format!(
                "invalid checksum recovering data block {block} ({} such blocks)",
                outcome.checksum_failures.len()
            ),
        });
    }
    Ok(outcome)
}
