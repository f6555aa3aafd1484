//! `quill journal dump IMAGE`: what the journal holds, transaction by transaction (read-only).

use anyhow::{Context, Result};
use blockdev::file::{FileDevice, FileOptions};
use blockdev::BlockDevice;
use fs::Ext4Image;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(clap::Args)]
pub struct DumpArgs {
    /// The ext4 image (or block device).
    image: PathBuf,
    /// List every logged block, not just counts.
    #[arg(long)]
    blocks: bool,
}

pub fn run(args: DumpArgs) -> Result<()> {
    let dev = FileDevice::open(&args.image, FileOptions { read_only: true, direct: false })?;
    let dev: Arc<dyn BlockDevice> = Arc::new(dev);
    let image = Ext4Image::open(dev.clone())
        .with_context(|| format!("{} is not a usable ext4 image", args.image.display()))?;
    let location = image.journal_location().context("cannot locate the journal")?;
    let scan = journal::scan_log(&*dev, &location).context("cannot scan the journal")?;
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
        println!(
            "transaction {} at block {}: {} blocks, {} revokes, committed at {}.{:09}",
            txn.tid,
            txn.log_start,
            txn.tags.len(),
            txn.revokes.len(),
            txn.commit_sec,
            txn.commit_nsec
        );
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
    println!(
        "end of log at journal block {} (tid {}): {}",
        scan.stop_block, scan.end_tid, scan.stop_reason
    );
    Ok(())
}
