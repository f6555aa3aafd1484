//! PASS_SCAN on one thread: the reference. A transcription of JBD2's `do_one_pass(PASS_SCAN)`
//! that reads one block at a time; [`super::scan_parallel`] must reach the same [`LogScan`] for
//! every log, and the tests hold it to this one.

use super::{read_log_block, v1_commit_checksum_ok, LogScan, ScannedTransaction};
use crate::error::{JournalError, Result};
use crate::location::JournalLocation;
use crate::superblock::read_superblock;
use blockdev::BlockDevice;
use ondisk::jbd2::{
    self, feature, parse_commit_block, parse_descriptor_tags, parse_header, parse_revoke_block,
    verify_block_tail, verify_commit_checksum, verify_commit_checksum_partial, BlockType,
    ChecksumVersion,
};
use ondisk::Tid;

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
                    checksum_ok = v1_commit_checksum_ok(&commit, v1_crc, &mut v1_checksum_seen);
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
