//! `quill recover IMAGE`: replay the journal of an ext4 image (its full commits, then the fast
//! commits that extend the last of them) and mark the file system as not needing recovery, as
//! e2fsck's journal replay (and the kernel's mount) do.

use anyhow::{bail, Context, Result};
use blockdev::file::{FileDevice, FileOptions};
use blockdev::BlockDevice;
use fs::Ext4Image;
use std::path::PathBuf;
use std::sync::Arc;

use crate::progress::Progress;

#[derive(clap::Args)]
pub struct RecoverArgs {
    /// The ext4 image (or block device).
    image: PathBuf,
    /// Threads replaying the log (1 is JBD2's single-threaded replay).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: RecoverArgs) -> Result<()> {
    if !(1..=64).contains(&args.threads) {
        bail!("--threads {} is outside 1..=64", args.threads);
    }
    let dev = FileDevice::open(&args.image, FileOptions::default())?;
    let dev: Arc<dyn BlockDevice> = Arc::new(dev);
    let image = Ext4Image::open(dev.clone())
        .with_context(|| format!("{} is not a usable ext4 image", args.image.display()))?;
    image.journal_location().context("cannot locate the journal")?;
    let bar = Progress::new("Replaying the journal", 0, !args.json, false);
    let (report, flag_was_set) =
        Ext4Image::recover_offline(dev, args.threads, &|done, total| bar.set(done, total))
            .context("journal recovery failed")?;
    bar.finish();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    if !report.needed {
        println!("{}: journal is clean, nothing to replay", args.image.display());
    } else {
        println!(
            "{}: replayed {} transactions (tids {}..{}), {} block writes to {} blocks; \
             {} revoke records skipped {} blocks; log ended because: {}",
            args.image.display(),
            report.transactions,
            report.first_tid,
            report.end_tid,
            report.blocks_replayed,
            report.replayed_blocks.len(),
            report.revoke_records,
            report.revoke_hits,
            report.stop_reason
        );
        if report.fast_commits.commits > 0 {
            println!(
                "{}: replayed {} fast commits of tid {} ({} records)",
                args.image.display(),
                report.fast_commits.commits,
                report.end_tid,
                report.fast_commits.records
            );
        }
    }
    if flag_was_set {
        println!("{}: needs_recovery cleared; the journal is clean", args.image.display());
    }
    Ok(())
}
