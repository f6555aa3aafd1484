//! PASS_SCAN over several threads (FAST'18 §3.2.4, "parallel scan"), reaching the
//! [`LogScan`] of the one-thread reference ([`super::scan::scan_log`]) for every log.
//!
//! JBD2's scan is sequential where the format makes it so: whether log block n+1 is read at all
//! depends on block n's magic, tid and type, and a descriptor's tag count says where the next
//! control block is. Everything else depends only on a block's own bytes: the checksums of
//! descriptor and revoke tails and of commit blocks, the compat-v1 CRC over a transaction's
//! descriptor and data blocks, and the revoke records. So the scan is three steps:
//!
//! 1. the walk (calling thread) reads control blocks only, following magic, tid, type and tag
//!    counts, and hands each transaction's control blocks to the workers as one unit (in
//!    batches of [`UNITS_PER_BATCH`]). It goes on
//!    past every commit block whatever its checksum: only the verdict may judge checksums;
//! 2. the checks (worker threads, overlapping the walk) verify each unit's checksums, compute its
//!    v1 CRC (reading its data blocks) and parse its revoke records;
//! 3. the verdict (calling thread, no I/O) applies JBD2's rules to the checked units in log
//!    order, and so ends or fails the log exactly where the one-thread scan does.
//!
//! | the walk stops at | because |
//! |---|---|
//! | a transaction longer than the log | the log is a loop of valid blocks |
//! | a block without magic, with another tid, of an unknown type | end of log |
//! | an unreadable descriptor or commit block | end of log |
//! | a read error | the verdict returns it, if it gets that far |
//!
//! The walk may go further than the verdict keeps (past a commit block whose checksum fails);
//! what lies beyond the verdict's end is dropped, and an error met there is never reported, as
//! the one-thread scan never reads there.

use super::{read_log_block, read_log_run, v1_commit_checksum_ok, LogScan, ScannedTransaction};
use crate::error::{JournalError, Result};
use crate::location::JournalLocation;
use crate::superblock::read_superblock;
use blockdev::BlockDevice;
use ondisk::jbd2::{
    self, feature, parse_commit_block, parse_descriptor_tags, parse_header, parse_revoke_block,
    verify_block_tail, verify_commit_checksum, verify_commit_checksum_partial, BlockType,
    ChecksumVersion, CommitBlock, DescriptorTag, JournalSuperblock, LogFormat,
};
use ondisk::Tid;
use parking_lot::Mutex;
use std::sync::mpsc;

/// Units handed to a worker at once: a unit is often one small transaction whose checks take
/// a microsecond or two, less than passing it between threads costs.
const UNITS_PER_BATCH: usize = 256;

/// Batches the walk may run ahead of the checks: bounds the control blocks held in memory.
const BATCHES_IN_FLIGHT_MAX: usize = 8;

/// Blocks the walk reads at once when the next control block is not in its window yet: JBD2's
/// recovery reads ahead 128 KiB the same way (`do_readahead`).
const WALK_WINDOW_BYTES: usize = 128 * 1024;

/// A control block as the walk met it: where, what kind, and its bytes for the checks.
struct Control {
    at: u32,
    kind: ControlKind,
    bytes: Vec<u8>,
}

enum ControlKind {
    /// The tags, each with the log block its image sits in.
    Descriptor(Vec<(u32, DescriptorTag)>),
    Revoke,
    Commit(CommitBlock),
}

/// The control blocks after one commit block up to and including the next (the last unit may
/// lack its commit): what a v1 CRC covers, and the checks' unit of work.
struct Unit {
    index: usize,
    controls: Vec<Control>,
}

/// How the walk ended.
enum WalkEnd {
    Stop { reason: String, at: u32 },
    Failed(JournalError),
}

/// A control block with its checks done.
enum Checked {
    Descriptor {
        tags: Vec<(u32, DescriptorTag)>,
        tail_ok: bool,
        /// v1: the CRC of the unit up to and including this descriptor's data blocks.
        v1_crc: Result<u32>,
    },
    Revoke {
        at: u32,
        tail_ok: bool,
        records: std::result::Result<Vec<u64>, String>,
    },
    Commit {
        at: u32,
        commit: CommitBlock,
        /// v2/v3: the commit block's checksum (over the block, or its header only) holds.
        checksum_ok: bool,
    },
}

/// PASS_SCAN with the checks on `threads` worker threads; the same result as
/// [`super::scan::scan_log`].
pub fn scan_log_parallel(
    dev: &dyn BlockDevice,
    location: &JournalLocation,
    threads: usize,
) -> Result<LogScan> {
    assert!(threads >= 1, "a scan needs at least one thread");
    let sb = read_superblock(dev, location)?;
    let format = sb.format();
    let (send, receive) = mpsc::sync_channel::<Vec<Unit>>(BATCHES_IN_FLIGHT_MAX);
    let receive = Mutex::new(receive);
    let checked: Mutex<Vec<(usize, Vec<Checked>)>> = Mutex::new(Vec::new());
    let end = std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                // The lock is held only to take the next batch.
                let next = receive.lock().recv();
                let Ok(batch) = next else { break };
                let done: Vec<(usize, Vec<Checked>)> = batch
                    .into_iter()
                    .map(|unit| (unit.index, check_unit(dev, location, &format, unit)))
                    .collect();
                checked.lock().extend(done);
            });
        }
        let mut batch = Vec::with_capacity(UNITS_PER_BATCH);
        let end = walk(dev, location, &sb, &mut |unit| {
            batch.push(unit);
            if batch.len() == UNITS_PER_BATCH {
                let full = std::mem::replace(&mut batch, Vec::with_capacity(UNITS_PER_BATCH));
                send.send(full).expect("the check workers outlive the walk");
            }
        });
        if !batch.is_empty() {
            send.send(batch).expect("the check workers outlive the walk");
        }
        drop(send);
        end
    });
    let mut checked = checked.into_inner();
    checked.sort_unstable_by_key(|(index, _)| *index);
    assert!(checked.iter().enumerate().all(|(i, (index, _))| i == *index), "a unit went unchecked");
    verdict(sb, checked.into_iter().flat_map(|(_, unit)| unit), end)
}

/// The log blocks of one lap, for the walk and the verdict.
#[derive(Clone, Copy)]
struct Lap {
    first: u32,
    end: u32,
}

impl Lap {
    fn of(sb: &JournalSuperblock) -> Lap {
        let lap = Lap { first: sb.first, end: sb.log_end() };
        assert!(lap.first < lap.end, "the superblock reader checks s_first against s_maxlen");
        lap
    }
    fn capacity(self) -> u32 {
        self.end - self.first
    }
    fn next(self, block: u32) -> u32 {
        if block + 1 >= self.end {
            block + 1 - self.capacity()
        } else {
            block + 1
        }
    }
    fn start(self, sb: &JournalSuperblock) -> u32 {
        if sb.start != 0 {
            sb.start
        } else {
            self.first
        }
    }
}

/// Log blocks read ahead together, so the walk waits on the device once per window rather
/// than once per control block.
struct WalkWindow {
    first: u32,
    blocks: u32,
    bytes: Vec<u8>,
}

impl WalkWindow {
    fn read(
        &mut self,
        dev: &dyn BlockDevice,
        location: &JournalLocation,
        lap: Lap,
        block: u32,
        out: &mut [u8],
    ) -> Result<()> {
        let size = out.len();
        if !(self.first..self.first + self.blocks).contains(&block) {
            let blocks =
                ((WALK_WINDOW_BYTES / size) as u32).min(lap.end.saturating_sub(block)).max(1);
            self.bytes.resize(blocks as usize * size, 0);
            if read_log_run(dev, location, block, &mut self.bytes).is_err() {
                // Read the one block alone, so an error names the block the walk needed.
                self.blocks = 0;
                return read_log_block(dev, location, block, out);
            }
            (self.first, self.blocks) = (block, blocks);
        }
        let slot = (block - self.first) as usize * size;
        out.copy_from_slice(&self.bytes[slot..slot + size]);
        Ok(())
    }
}

/// Step 1: follows the log's structure from its tail, handing each unit to `send`.
fn walk(
    dev: &dyn BlockDevice,
    location: &JournalLocation,
    sb: &JournalSuperblock,
    send: &mut dyn FnMut(Unit),
) -> WalkEnd {
    let format = sb.format();
    let lap = Lap::of(sb);
    let mut window = WalkWindow { first: 0, blocks: 0, bytes: Vec::new() };
    let mut pos = lap.start(sb);
    let mut tid = sb.sequence;
    let mut controls = Vec::new();
    let mut units = 0usize;
    let mut blocks_in_transaction = 0u32;
    let end = loop {
        if blocks_in_transaction > lap.capacity() {
            let reason = format!("transaction {tid} runs around the whole log");
            break WalkEnd::Stop { reason, at: pos };
        }
        let here = pos;
        let mut block = vec![0u8; format.block_size as usize];
        if let Err(e) = window.read(dev, location, lap, here, &mut block) {
            break WalkEnd::Failed(e);
        }
        pos = lap.next(pos);
        blocks_in_transaction += 1;
        let Some(header) = parse_header(&block) else {
            break WalkEnd::Stop { reason: "no journal magic".into(), at: here };
        };
        if header.sequence != tid {
            let reason = format!("block has tid {}, expected {tid}", header.sequence);
            break WalkEnd::Stop { reason, at: here };
        }
        let kind = match header.block_type {
            t if t == BlockType::Descriptor as u32 => {
                match parse_descriptor_tags(&format, &block) {
                    Ok(tags) => {
                        let mut placed = Vec::with_capacity(tags.len());
                        for tag in tags {
                            placed.push((pos, tag));
                            pos = lap.next(pos);
                            blocks_in_transaction += 1;
                        }
                        ControlKind::Descriptor(placed)
                    }
                    Err(e) => {
                        let reason = format!("unreadable descriptor: {e}");
                        break WalkEnd::Stop { reason, at: here };
                    }
                }
            }
            t if t == BlockType::Revoke as u32 => ControlKind::Revoke,
            t if t == BlockType::Commit as u32 => match parse_commit_block(&format, &block) {
                Ok(commit) => ControlKind::Commit(commit),
                Err(e) => {
                    let reason = format!("unreadable commit block: {e}");
                    break WalkEnd::Stop { reason, at: here };
                }
            },
            other => {
                break WalkEnd::Stop { reason: format!("unknown block type {other}"), at: here }
            }
        };
        let is_commit = matches!(kind, ControlKind::Commit(_));
        controls.push(Control { at: here, kind, bytes: block });
        if is_commit {
            send(Unit { index: units, controls: std::mem::take(&mut controls) });
            units += 1;
            tid = tid.next();
            blocks_in_transaction = 0;
        }
    };
    if !controls.is_empty() {
        send(Unit { index: units, controls });
    }
    end
}

/// Step 2: the checks of one unit; reads only the data blocks a v1 CRC covers.
fn check_unit(
    dev: &dyn BlockDevice,
    location: &JournalLocation,
    format: &LogFormat,
    unit: Unit,
) -> Vec<Checked> {
    let v1 = format.checksum == ChecksumVersion::V1;
    let v2_or_3 = matches!(format.checksum, ChecksumVersion::V2 | ChecksumVersion::V3);
    // The unit's running v1 CRC; after a failed read the verdict stops at that descriptor
    // (or, after a failed commit, never looks at a CRC), so later ones need no value.
    let mut crc = !0u32;
    let mut crc_failed = false;
    let mut data = vec![0u8; format.block_size as usize];
    let mut checked = Vec::with_capacity(unit.controls.len());
    for control in unit.controls {
        let tail_ok = !v2_or_3 || verify_block_tail(format, &control.bytes);
        checked.push(match control.kind {
            ControlKind::Descriptor(tags) => {
                let v1_crc = if v1 && !crc_failed {
                    let updated = v1_crc_update_descriptor(
                        dev,
                        location,
                        crc,
                        &control.bytes,
                        &tags,
                        &mut data,
                    );
                    crc = *updated.as_ref().unwrap_or(&crc);
                    crc_failed = updated.is_err();
                    updated
                } else {
                    Ok(crc)
                };
                Checked::Descriptor { tags, tail_ok, v1_crc }
            }
            ControlKind::Revoke => Checked::Revoke {
                at: control.at,
                tail_ok,
                records: parse_revoke_block(format, &control.bytes).map_err(|e| e.to_string()),
            },
            ControlKind::Commit(commit) => Checked::Commit {
                at: control.at,
                commit,
                checksum_ok: verify_commit_checksum(format, &control.bytes)
                    || verify_commit_checksum_partial(format, &control.bytes),
            },
        });
    }
    checked
}

/// Extends a v1 CRC over a descriptor block and the data blocks of its tags, in log order.
fn v1_crc_update_descriptor(
    dev: &dyn BlockDevice,
    location: &JournalLocation,
    mut crc: u32,
    descriptor: &[u8],
    tags: &[(u32, DescriptorTag)],
    data: &mut [u8],
) -> Result<u32> {
    crc = jbd2::v1_crc_update(crc, descriptor);
    for (at, _) in tags {
        read_log_block(dev, location, *at, data)?;
        crc = jbd2::v1_crc_update(crc, data);
    }
    Ok(crc)
}

/// Step 3: JBD2's `do_one_pass(PASS_SCAN)` rules over the checked control blocks in log order
/// (the table in [`super`]), then the walk's own end if the rules did not end the log first.
fn verdict(
    sb: JournalSuperblock,
    checked: impl Iterator<Item = Checked>,
    walk_end: WalkEnd,
) -> Result<LogScan> {
    let format = sb.format();
    let lap = Lap::of(&sb);
    let async_commit = sb.has_incompat(feature::INCOMPAT_ASYNC_COMMIT);
    let v1 = format.checksum == ChecksumVersion::V1;
    let v2_or_3 = matches!(format.checksum, ChecksumVersion::V2 | ChecksumVersion::V3);

    let mut next_commit = sb.sequence;
    let mut transactions = Vec::new();
    let mut current = ScannedTransaction::new(next_commit, lap.start(&sb));
    let mut end_tid: Option<Tid> = None;
    let mut need_check_commit_time = false;
    let mut last_commit_time = 0u64;
    let mut v1_crc = !0u32;
    let mut v1_checksum_seen = false;

    let mut stop = None;
    for step in checked {
        match step {
            Checked::Descriptor { tags, tail_ok, v1_crc: unit_crc } => {
                if v2_or_3 && !tail_ok {
                    need_check_commit_time = true;
                }
                if v1 && !need_check_commit_time && end_tid.is_none() {
                    v1_crc = unit_crc?;
                }
                current.tags.extend(tags);
            }
            Checked::Revoke { at, tail_ok, records } => {
                if !tail_ok {
                    need_check_commit_time = true;
                }
                match records {
                    Ok(records) => current.revokes.extend(records),
                    // A revoke block with a bad checksum may be stale; the commit decides.
                    Err(_) if !tail_ok => {}
                    Err(reason) => return Err(JournalError::Corrupted { log_block: at, reason }),
                }
            }
            Checked::Commit { at, commit, checksum_ok: commit_checksum_ok } => {
                let commit_time = commit.commit_sec;
                if need_check_commit_time {
                    if commit_time >= last_commit_time {
                        return Err(JournalError::Corrupted {
                            log_block: at,
                            reason: format!("invalid checksum found in transaction {next_commit}"),
                        });
                    }
                    let reason =
                        format!("stale blocks in transaction {next_commit} (older commit time)");
                    stop = Some((reason, at));
                    break;
                }
                let mut checksum_ok = true;
                if v1 {
                    if end_tid.is_some() {
                        stop = Some((
                            format!("transaction {next_commit} follows a failed commit"),
                            at,
                        ));
                        break;
                    }
                    checksum_ok = v1_commit_checksum_ok(&commit, v1_crc, &mut v1_checksum_seen);
                    v1_crc = !0;
                }
                if v2_or_3 && !commit_checksum_ok {
                    checksum_ok = false;
                }
                if !checksum_ok {
                    if commit_time < last_commit_time {
                        stop =
                            Some((format!("stale commit block for transaction {next_commit}"), at));
                        break;
                    }
                    end_tid = Some(next_commit);
                    if !async_commit {
                        let reason =
                            format!("commit block of transaction {next_commit} has a bad checksum");
                        stop = Some((reason, at));
                        break;
                    }
                }
                last_commit_time = commit_time;
                current.commit_sec = commit.commit_sec;
                current.commit_nsec = commit.commit_nsec;
                let next = ScannedTransaction::new(next_commit.next(), lap.next(at));
                let done = std::mem::replace(&mut current, next);
                if end_tid.is_none() {
                    transactions.push(done);
                }
                next_commit = next_commit.next();
            }
        }
    }
    let (stop_reason, stop_block) = match (stop, walk_end) {
        (Some(stop), _) => stop,
        (None, WalkEnd::Stop { reason, at }) => (reason, at),
        (None, WalkEnd::Failed(e)) => return Err(e),
    };
    Ok(LogScan {
        superblock: sb,
        transactions,
        end_tid: end_tid.unwrap_or(next_commit),
        stop_reason,
        stop_block,
    })
}
