//! `quill journal dump IMAGE`: what the journal holds, transaction by transaction (read-only).
//!
//! The read-only opening of an image and the description of scanned transactions are shared
//! with `quill info` (which lists the transactions of a journal that needs recovery).

use anyhow::{Context, Result};
use blockdev::file::{FileDevice, FileOptions};
use blockdev::BlockDevice;
use fs::Ext4Image;
use journal::recovery::ScannedTransaction;
use journal::{JournalLocation, LogScan};
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
    let dev = FileDevice::open(path, FileOptions { read_only: true, direct: false })?;
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

/// `YYYY-MM-DD HH:MM:SS UTC` for a Unix time; "n/a" for 0 (never), as dumpe2fs.
pub fn utc(secs: u64) -> String {
    if secs == 0 {
        return "n/a".into();
    }
    let days = (secs / 86_400) as i64;
    let rest = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

pub fn run(args: DumpArgs) -> Result<()> {
    let (dev, image) = open_read_only(&args.image)?;
    let (_, scan) = scan_journal(&*dev, &image)?;
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_formats_unix_times() {
        assert_eq!(utc(0), "n/a");
        assert_eq!(utc(1), "1970-01-01 00:00:01 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_700_000_000), "2023-11-14 22:13:20 UTC");
        assert_eq!(utc(u64::from(u32::MAX)), "2106-02-07 06:28:15 UTC");
    }
}
