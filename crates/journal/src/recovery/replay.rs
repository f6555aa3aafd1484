//! PASS_REPLAY: write each logged block home. One thread replays in log order, block by block,
//! as JBD2 does ([`pass_replay`], the reference); several threads leave the same device
//! contents and the same verdict ([`pass_replay_parallel`]).

use super::{read_log_block, read_log_run, LogScan};
use crate::error::{JournalError, Result};
use crate::location::JournalLocation;
use crate::revoke::RevokeTable;
use blockdev::{BlockDevice, Write};
use ondisk::jbd2::{tag_checksum_matches, unescape_block, DescriptorTag, LogFormat};
use ondisk::Tid;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

#[derive(Default)]
pub(super) struct ReplayOutcome {
    pub writes: u64,
    pub revoke_hits: u64,
    pub written: std::collections::HashSet<u64>,
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

/// The byte offset of home block `block`, logged at `log_block`; `Corrupted` when it lies
/// outside the device.
fn home_offset(
    dev: &dyn BlockDevice,
    format: &LogFormat,
    log_block: u32,
    block: u64,
) -> Result<u64> {
    block
        .checked_mul(format.block_size as u64)
        .filter(|o| o + format.block_size as u64 <= dev.size_bytes())
        .ok_or_else(|| JournalError::Corrupted {
            log_block,
            reason: format!("logged block {block} lies outside the device"),
        })
}

/// PASS_REPLAY in log order, one thread (JBD2).
pub(super) fn pass_replay(
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
            dev.write_at(home_offset(dev, &format, *log_block, tag.block)?, &image)?;
            outcome.writes += 1;
            outcome.written.insert(tag.block);
        }
    }
    finish_replay(outcome)
}

/// One copy the parallel replay plans to deal with: a logged block no revoke record covers.
#[derive(Clone, Copy)]
struct PlannedCopy {
    tid: Tid,
    log_block: u32,
    tag: DescriptorTag,
    /// The newest planned copy of its home block: the one the in-order replay leaves there.
    newest: bool,
}

/// Copies one replay worker takes at a time; bounds its memory (16 MiB of 4 KiB blocks) and
/// sets the size of the sorted batches it hands the device.
const SEGMENT_COPIES_MAX: usize = 4096;

/// Segments per worker at least, so the workers finish close together.
const SEGMENTS_PER_THREAD_MIN: usize = 4;

/// Adjacent log blocks read with one call.
const RUN_BLOCKS_MAX: usize = 256;

/// What one segment of the parallel replay found.
struct SegmentOutcome {
    /// Index of the segment's first copy in the plan.
    first: usize,
    /// Per copy: its tag checksum holds.
    passed: Vec<bool>,
    /// The first copy (by plan index) that passed but names a block outside the device.
    outside: Option<(usize, JournalError)>,
}

/// PASS_REPLAY over `threads` threads (FAST'18 §3.2.4), leaving what [`pass_replay`] leaves:
///
/// 1. plan: the copies no revoke record covers, in log order; each home block's newest copy is
///    the one to write, as later copies overwrite earlier ones in the in-order replay;
/// 2. segments: workers take the next run of consecutive copies from an atomic counter, read it
///    with one call per run of adjacent log blocks, check **every** copy's tag checksum (the
///    in-order replay checks superseded copies too, and fails recovery on a damaged one), and
///    write the segment's newest copies as one batch sorted by home block;
/// 3. fallback: a home block whose newest copy failed its checksum gets its newest older copy
///    that passed, as the in-order replay leaves it;
/// 4. verdict: the first copy in log order that names a block outside the device is the error
///    the in-order replay returns; otherwise checksum failures fail recovery as in JBD2.
pub(super) fn pass_replay_parallel(
    dev: &dyn BlockDevice,
    location: &JournalLocation,
    scan: &LogScan,
    revokes: &RevokeTable,
    threads: usize,
    total: u64,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<ReplayOutcome> {
    assert!(threads > 1, "one thread replays in log order");
    let format = scan.superblock.format();
    let mut outcome = ReplayOutcome::default();
    let mut plan: Vec<PlannedCopy> = Vec::new();
    let mut newest: HashMap<u64, usize> = HashMap::new();
    for txn in &scan.transactions {
        for &(log_block, tag) in &txn.tags {
            if revokes.is_revoked(tag.block, txn.tid) {
                outcome.revoke_hits += 1;
                continue;
            }
            newest.insert(tag.block, plan.len());
            plan.push(PlannedCopy { tid: txn.tid, log_block, tag, newest: false });
        }
    }
    for &index in newest.values() {
        plan[index].newest = true;
    }
    let done = AtomicU64::new(outcome.revoke_hits);
    progress(outcome.revoke_hits, total);
    let segments = threads * SEGMENTS_PER_THREAD_MIN;
    let segment_len = plan.len().div_ceil(segments).clamp(1, SEGMENT_COPIES_MAX);
    let next_segment = AtomicUsize::new(0);
    let (plan_ref, done, next_segment) = (&plan, &done, &next_segment);
    let results: Vec<Result<Vec<SegmentOutcome>>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(move || {
                    let mut outcomes = Vec::new();
                    loop {
                        let first = next_segment.fetch_add(1, Ordering::Relaxed) * segment_len;
                        if first >= plan_ref.len() {
                            return Ok(outcomes);
                        }
                        let copies = &plan_ref[first..(first + segment_len).min(plan_ref.len())];
                        outcomes.push(replay_segment(dev, location, &format, first, copies)?);
                        let n = copies.len() as u64;
                        progress(done.fetch_add(n, Ordering::Relaxed) + n, total);
                    }
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("replay worker panicked")).collect()
    });
    let mut passed = vec![false; plan.len()];
    let mut outside: Option<(usize, JournalError)> = None;
    for result in results {
        for segment in result? {
            passed[segment.first..segment.first + segment.passed.len()]
                .copy_from_slice(&segment.passed);
            if let Some((index, e)) = segment.outside {
                if outside.as_ref().is_none_or(|(first, _)| index < *first) {
                    outside = Some((index, e));
                }
            }
        }
    }
    if let Some((_, e)) = outside {
        return Err(e);
    }
    replay_fallback(dev, location, &format, &plan, &passed)?;
    for (copy, passed) in plan.iter().zip(&passed) {
        if *passed {
            outcome.writes += 1;
            outcome.written.insert(copy.tag.block);
        } else {
            outcome.checksum_failures.push((copy.log_block, copy.tag.block));
        }
    }
    finish_replay(outcome)
}

/// Step 2 of [`pass_replay_parallel`] for the copies `first..first + copies.len()` of the plan.
fn replay_segment(
    dev: &dyn BlockDevice,
    location: &JournalLocation,
    format: &LogFormat,
    first: usize,
    copies: &[PlannedCopy],
) -> Result<SegmentOutcome> {
    let size = format.block_size as usize;
    let mut images = vec![0u8; copies.len() * size];
    let mut start = 0;
    while start < copies.len() {
        let mut end = start + 1;
        while end < copies.len()
            && end - start < RUN_BLOCKS_MAX
            && copies[end].log_block == copies[end - 1].log_block + 1
        {
            end += 1;
        }
        read_log_run(
            dev,
            location,
            copies[start].log_block,
            &mut images[start * size..end * size],
        )?;
        start = end;
    }
    let mut outcome = SegmentOutcome { first, passed: vec![false; copies.len()], outside: None };
    let mut batch: Vec<(u64, usize)> = Vec::new();
    for (i, (copy, image)) in copies.iter().zip(images.chunks_exact_mut(size)).enumerate() {
        if !tag_checksum_matches(format, copy.tid, &copy.tag, image) {
            continue;
        }
        outcome.passed[i] = true;
        let offset = match home_offset(dev, format, copy.log_block, copy.tag.block) {
            Ok(offset) => offset,
            Err(e) => {
                outcome.outside.get_or_insert((first + i, e));
                continue;
            }
        };
        if copy.newest {
            if copy.tag.is_escaped() {
                unescape_block(image);
            }
            batch.push((offset, i));
        }
    }
    if outcome.outside.is_none() {
        batch.sort_unstable_by_key(|(offset, _)| *offset);
        let writes: Vec<Write> = batch
            .iter()
            .map(|&(offset, i)| Write {
                offset,
                data: &images[i * size..(i + 1) * size],
                fua: false,
            })
            .collect();
        dev.write_batch(&writes)?;
    }
    Ok(outcome)
}

/// Step 3 of [`pass_replay_parallel`]: home blocks whose newest copy failed its checksum get
/// their newest older copy that passed (rare: only a damaged log gets here).
fn replay_fallback(
    dev: &dyn BlockDevice,
    location: &JournalLocation,
    format: &LogFormat,
    plan: &[PlannedCopy],
    passed: &[bool],
) -> Result<()> {
    let mut wanted: HashSet<u64> = plan
        .iter()
        .zip(passed)
        .filter(|(c, p)| c.newest && !**p)
        .map(|(c, _)| c.tag.block)
        .collect();
    let mut image = vec![0u8; format.block_size as usize];
    for (copy, _) in plan.iter().zip(passed).rev().filter(|(_, p)| **p) {
        if wanted.remove(&copy.tag.block) {
            read_log_block(dev, location, copy.log_block, &mut image)?;
            if copy.tag.is_escaped() {
                unescape_block(&mut image);
            }
            let offset = home_offset(dev, format, copy.log_block, copy.tag.block)?;
            dev.write_at(offset, &image)?;
        }
    }
    Ok(())
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
