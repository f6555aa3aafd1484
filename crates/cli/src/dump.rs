//! `quill journal dump IMAGE`: what the journal holds, transaction by transaction (read-only).
//!
//! The read-only opening of an image and the description of scanned transactions are shared
//! with `quill info` (which lists the transactions of a journal that needs recovery).

use anyhow::{Context, Result};
use blockdev::file::{FileDevice, FileOptions};
use blockdev::BlockDevice;
use fs::Ext4Image;
use journal::recovery::{read_log_block, ScannedTransaction};
use journal::{JournalLocation, LogScan};
use ondisk::jbd2::fast_commit::{scan_fast_commit_area, FcDentryOp, FcRecord};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(clap::Args)]
pub struct DumpArgs {
    /// The ext4 image (or block device).
    image: PathBuf,
    /// List every logged block, not just counts.
    #[arg(long)]
    blocks: bool,
}

/// Opens `path` read-only (the file is opened without write access, so nothing can write it)
/// and validates it as ext4.
pub fn open_read_only(path: &Path) -> Result<(Arc<dyn BlockDevice>, Ext4Image)> {
    let dev = FileDevice::open(path, FileOptions::read_only())?;
    let dev: Arc<dyn BlockDevice> = Arc::new(dev);
    let image = Ext4Image::open(dev.clone())
        .with_context(|| format!("{} is not a usable ext4 image", path.display()))?;
    Ok((dev, image))
}

/// Locates the internal journal and runs recovery's PASS_SCAN over it (reads only).
pub fn scan_journal(
    dev: &dyn BlockDevice,
    image: &Ext4Image,
) -> Result<(JournalLocation, LogScan)> {
    let location = image.journal_location().context("cannot locate the journal")?;
    let scan = journal::scan_log(dev, &location).context("cannot scan the journal")?;
    Ok((location, scan))
}

/// `transaction TID at block N: B blocks, R revokes, committed at SEC.NSEC (DATE TIME UTC)`.
pub fn transaction_line(txn: &ScannedTransaction) -> String {
    format!(
        "transaction {} at block {}: {} blocks, {} revokes, committed at {}.{:09} ({})",
        txn.tid,
        txn.log_start,
        txn.tags.len(),
        txn.revokes.len(),
        txn.commit_sec,
        txn.commit_nsec,
        utc(txn.commit_sec)
    )
}

/// The same facts as [`transaction_line`], as JSON.
pub fn transaction_json(txn: &ScannedTransaction) -> serde_json::Value {
    serde_json::json!({
        "tid": txn.tid.0,
        "log_start": txn.log_start,
        "blocks": txn.tags.len(),
        "revokes": txn.revokes.len(),
        "commit_sec": txn.commit_sec,
        "commit_nsec": txn.commit_nsec,
    })
}

/// `end of log at journal block N (tid T): REASON`.
pub fn end_of_log_line(scan: &LogScan) -> String {
    format!(
        "end of log at journal block {} (tid {}): {}",
        scan.stop_block, scan.end_tid, scan.stop_reason
    )
}

/// The proleptic Gregorian date `days` after 1970-01-01 (Howard Hinnant's `civil_from_days`);
/// `quill journal dump`, `quill info` and the mount log print dates with it.
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11]
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    assert!((1..=12).contains(&month) && (1..=31).contains(&day));
    (year, month, day)
}

/// `YYYY-MM-DD HH:MM:SS UTC` for a Unix time; "n/a" for 0 (never), as dumpe2fs.
pub fn utc(secs: u64) -> String {
    if secs == 0 {
        return "n/a".into();
    }
    let rest = secs % 86_400;
    let (year, month, day) = civil_from_days((secs / 86_400) as i64);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

pub fn run(args: DumpArgs) -> Result<()> {
    let (dev, image) = open_read_only(&args.image)?;
    let (location, scan) = scan_journal(&*dev, &image)?;
    let sb = &scan.superblock;
    let format = sb.format();
    println!(
        "journal: {} blocks of {} bytes, log [{}, {}), {} fast-commit blocks, checksum {:?}, 64bit {}",
        sb.max_len,
        sb.block_size,
        sb.first,
        sb.log_end(),
        sb.fast_commit_blocks(),
        format.checksum,
        format.is_64bit
    );
    let state = if sb.start == 0 {
        "clean".to_string()
    } else {
        format!("needs recovery from block {}", sb.start)
    };
    println!("state: {state}; tail tid {}", sb.sequence);
    for txn in &scan.transactions {
        println!("{}", transaction_line(txn));
        if args.blocks {
            for (log_block, tag) in &txn.tags {
                let escaped = if tag.is_escaped() { " (escaped)" } else { "" };
                println!("  fs block {} logged at journal block {log_block}{escaped}", tag.block);
            }
            for block in &txn.revokes {
                println!("  revoke fs block {block}");
            }
        }
    }
    println!("{}", end_of_log_line(&scan));
    if let Some(area) = fast_commit_area(image.superblock(), sb) {
        let inode_size = image.superblock().inode_size;
        // quill's per-core areas (INCOMPAT_QUILL_FC_AREAS): each is a standard area.
        let parts = ondisk::jbd2::fast_commit_parts(area.start, area.end, sb.fc_areas.max(1));
        for (k, part) in parts.iter().enumerate() {
            let blocks = read_fast_commit_area(&*dev, &location, part.clone())?;
            if parts.len() > 1 {
                println!("per-core fast-commit area {k} of {}:", parts.len());
            }
            for line in fast_commit_lines(&blocks, inode_size, scan.end_tid, args.blocks) {
                println!("{line}");
            }
        }
    }
    Ok(())
}

/// Where the fast-commit area is, in journal blocks: `[log_end + 1, max_len)`. Linux clears the
/// journal's fast-commit bit at a clean unmount and sets it again at mount from the ext4
/// feature, so the ext4 superblock's fast_commit also counts (with `s_num_fc_blks`, 0 meaning
/// the default), as `jbd2_journal_get_num_fc_blks` sizes it then.
fn fast_commit_area(
    ext4_sb: &ondisk::ext4::Superblock,
    sb: &ondisk::jbd2::JournalSuperblock,
) -> Option<std::ops::Range<u32>> {
    let ext4_fast_commit = ext4_sb.feature_compat & ondisk::ext4::feature::COMPAT_FAST_COMMIT != 0;
    if sb.fast_commit_blocks() == 0 && !ext4_fast_commit {
        return None;
    }
    let blocks = sb.configured_fast_commit_blocks();
    // A parsed superblock leaves at least 1024 log blocks beside its own fast-commit area; an
    // area the journal's bit does not size must be checked here.
    let log_end = sb.max_len.checked_sub(blocks).filter(|end| *end > sb.first)?;
    Some(log_end + 1..sb.max_len)
}

/// The blocks of the fast-commit area `area` (journal blocks).
fn read_fast_commit_area(
    dev: &dyn BlockDevice,
    location: &JournalLocation,
    area: std::ops::Range<u32>,
) -> Result<Vec<Vec<u8>>> {
    let mut blocks = Vec::new();
    for log_block in area {
        let mut block = vec![0u8; location.block_size() as usize];
        read_log_block(dev, location, log_block, &mut block)
            .with_context(|| format!("reading fast-commit block {log_block}"))?;
        blocks.push(block);
    }
    Ok(blocks)
}

/// What the fast-commit area holds for transaction `tid` (the one after the last complete full
/// commit, which recovery would extend), as recovery's scan judges it; with `records`, one line
/// per record.
pub fn fast_commit_lines(
    blocks: &[Vec<u8>],
    inode_size: u16,
    tid: ondisk::Tid,
    records: bool,
) -> Vec<String> {
    let scan = match scan_fast_commit_area(blocks.iter().map(Vec::as_slice), inode_size, tid) {
        Ok(scan) => scan,
        Err(error) => return vec![format!("fast-commit area ({} blocks): {error}", blocks.len())],
    };
    let mut lines = vec![format!(
        "fast-commit area ({} blocks): {} fast commits of tid {tid}, {} records ({} replayable){}",
        blocks.len(),
        scan.commits,
        scan.records.len(),
        scan.records_valid,
        scan.stop.as_ref().map(|reason| format!("; {reason}")).unwrap_or_default()
    )];
    if records {
        lines.extend(scan.records.iter().map(|record| format!("  {}", fast_commit_record(record))));
    }
    lines
}

fn fast_commit_record(record: &FcRecord<'_>) -> String {
    match *record {
        FcRecord::Head { features, tid } => format!("head tid {tid} features {features:#x}"),
        FcRecord::AddRange { ino, extent } => format!(
            "add range inode {ino}: blocks {}+{} at {}{}",
            extent.logical,
            extent.len,
            extent.start,
            if extent.unwritten { " (unwritten)" } else { "" }
        ),
        FcRecord::DelRange { ino, logical, len } => {
            format!("del range inode {ino}: blocks {logical}+{len}")
        }
        FcRecord::Dentry { op, parent_ino, ino, name } => {
            let verb = match op {
                FcDentryOp::Create => "create",
                FcDentryOp::Link => "link",
                FcDentryOp::Unlink => "unlink",
            };
            format!("{verb} {parent_ino}/{} -> inode {ino}", String::from_utf8_lossy(name))
        }
        FcRecord::Inode { ino, raw } => format!("inode {ino} ({} bytes)", raw.len()),
        FcRecord::Pad { len } => format!("pad {len}"),
        FcRecord::Tail { tid, crc, .. } => format!("tail tid {tid} crc {crc:#010x}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_commit_lines_describe_the_area_as_recovery_scans_it() {
        use ondisk::jbd2::fast_commit::append_tail;
        use ondisk::Tid;
        let mut block = Vec::new();
        FcRecord::Head { features: 0, tid: Tid(5) }.encode(&mut block);
        let op = FcDentryOp::Unlink;
        FcRecord::Dentry { op, parent_ino: 2, ino: 12, name: b"gone" }.encode(&mut block);
        let crc = append_tail(&mut block, 1024, 0, Tid(5));
        let blocks = vec![block, vec![0u8; 1024]];
        let lines = fast_commit_lines(&blocks, 256, Tid(5), true);
        assert!(lines[0].starts_with("fast-commit area (2 blocks): 1 fast commits of tid 5, 3"));
        assert!(lines[0].contains("(3 replayable); block 1: corrupted"), "{lines:?}");
        assert_eq!(
            &lines[1..],
            [
                "  head tid 5 features 0x0",
                "  unlink 2/gone -> inode 12",
                &format!("  tail tid 5 crc {crc:#010x}")
            ]
        );
        // Another transaction's area: nothing to replay.
        let lines = fast_commit_lines(&blocks, 256, Tid(6), false);
        assert_eq!(lines.len(), 1);
        assert!(lines[0].contains("0 records (0 replayable); block 0: HEAD of tid 5"), "{lines:?}");
        let lines = fast_commit_lines(&[vec![9u8; 1024]], 256, Tid(6), false);
        assert!(lines[0].contains("does not start with a HEAD"), "{lines:?}");
    }

    #[test]
    fn utc_formats_unix_times() {
        assert_eq!(utc(0), "n/a");
        assert_eq!(utc(1), "1970-01-01 00:00:01 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_700_000_000), "2023-11-14 22:13:20 UTC");
        assert_eq!(utc(u64::from(u32::MAX)), "2106-02-07 06:28:15 UTC");
    }
}
