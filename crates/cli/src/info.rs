//! `quill info IMAGE [--json]`: what `dumpe2fs -h` says about an image, plus what quill sees:
//! free counts summed over the group descriptors next to the superblock's, the orphan state,
//! and the transactions in a journal that needs recovery.
//!
//! Read-only: the image is opened without write access and read through [`fs::Ext4Image`] and
//! the journal's scan, never through the mounting `Filesystem`, so neither the journal nor the
//! orphan list is processed.

use anyhow::Result;
use blockdev::BlockDevice;
use fs::Ext4Image;
use journal::LogScan;
use ondisk::ext4::{self, feature};
use ondisk::jbd2::{self, ChecksumVersion};
use serde_json::{json, Value};
use std::path::PathBuf;

use crate::dump;

#[derive(clap::Args)]
#[command(after_help = "\
Prints, like `dumpe2fs -h`: volume name, UUID, geometry, features, free blocks and inodes (from \
the superblock and summed over the group descriptors), state, needs_recovery, the orphan list, \
mount count and times, and the journal (location, size, format, sequence, start). When the \
journal is not empty (it needs recovery), the committed transactions a scan finds are listed.\n\
The image is only read: nothing is replayed or written. Exit status 0; 1 when the image \
cannot be read as ext4; 2 for bad usage.")]
pub struct InfoArgs {
    /// The ext4 image (or block device).
    image: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Everything `info` reports, gathered before anything is printed.
struct Info {
    sb: ext4::Superblock,
    groups: u32,
    gd_free_blocks: u64,
    gd_free_inodes: u64,
    journal: JournalInfo,
}

enum JournalInfo {
    None,
    /// An external journal (`s_journal_dev`): quill does not read it.
    Device(u32),
    Inode {
        inum: u32,
        extents: usize,
        scan: LogScan,
    },
}

pub fn run(args: InfoArgs) -> Result<()> {
    let (dev, image) = dump::open_read_only(&args.image)?;
    let info = gather(&*dev, &image)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&to_json(&info))?);
    } else {
        print!("{}", to_text(&info));
    }
    Ok(())
}

fn gather(dev: &dyn BlockDevice, image: &Ext4Image) -> Result<Info> {
    let sb = image.superblock().clone();
    let descs = image.group_descs();
    let gd_free_blocks = descs.iter().map(|d| u64::from(d.free_blocks)).sum();
    let gd_free_inodes = descs.iter().map(|d| u64::from(d.free_inodes)).sum();
    let journal = if !sb.has_journal() {
        JournalInfo::None
    } else if sb.journal_dev != 0 {
        JournalInfo::Device(sb.journal_dev)
    } else {
        let (location, scan) = dump::scan_journal(dev, image)?;
        JournalInfo::Inode { inum: sb.journal_inum, extents: location.extents().len(), scan }
    };
    Ok(Info { groups: descs.len() as u32, sb, gd_free_blocks, gd_free_inodes, journal })
}

fn volume_name(sb: &ext4::Superblock) -> String {
    let end = sb.volume_name.iter().position(|&b| b == 0).unwrap_or(sb.volume_name.len());
    String::from_utf8_lossy(&sb.volume_name[..end]).into_owned()
}

/// As dumpe2fs: "clean" or "not clean", then " with errors" when errors were recorded.
fn state(sb: &ext4::Superblock) -> String {
    let mut text =
        if sb.state & ext4::STATE_VALID_FS != 0 { "clean" } else { "not clean" }.to_string();
    if sb.state & ext4::STATE_ERROR_FS != 0 {
        text.push_str(" with errors");
    }
    text
}

fn errors_behavior(errors: u16) -> String {
    match errors {
        1 => "Continue".into(),
        2 => "Remount read-only".into(),
        3 => "Panic".into(),
        other => format!("Unknown ({other})"),
    }
}

fn features(sb: &ext4::Superblock) -> Vec<String> {
    feature::feature_list(sb.feature_compat, sb.feature_incompat, sb.feature_ro_compat)
}

fn orphan_present(sb: &ext4::Superblock) -> bool {
    sb.feature_ro_compat & feature::RO_COMPAT_ORPHAN_PRESENT != 0
}

fn checksum_name(version: ChecksumVersion) -> &'static str {
    match version {
        ChecksumVersion::None => "none",
        ChecksumVersion::V1 => "v1",
        ChecksumVersion::V2 => "v2",
        ChecksumVersion::V3 => "v3",
    }
}

fn journal_version(jsb: &jbd2::JournalSuperblock) -> &'static str {
    if jsb.block_type == jbd2::BlockType::SuperblockV2 as u32 {
        "v2"
    } else {
        "v1"
    }
}

/// A count from the superblock and the same count summed over the group descriptors.
fn free_count(superblock: u64, descriptors: u64) -> String {
    if superblock == descriptors {
        format!("{superblock}")
    } else {
        format!(
            "{superblock} in the superblock, {descriptors} summed over the group descriptors \
             (they disagree)"
        )
    }
}

fn to_text(info: &Info) -> String {
    let sb = &info.sb;
    let mut out = String::new();
    let mut field = |label: &str, value: String| {
        out.push_str(&format!("{:<26}{value}\n", format!("{label}:")));
    };
    let name = volume_name(sb);
    field("Filesystem volume name", if name.is_empty() { "<none>".into() } else { name });
    field("Filesystem UUID", fs::mkfs::format_uuid(&sb.uuid));
    field("Filesystem features", features(sb).join(" "));
    field("Filesystem state", state(sb));
    field("Errors behavior", errors_behavior(sb.errors));
    field("Block size", sb.block_size().to_string());
    field("Block count", sb.blocks_count.to_string());
    field("Reserved block count", sb.r_blocks_count.to_string());
    field("First block", sb.first_data_block.to_string());
    field("Inode count", sb.inodes_count.to_string());
    field("Inode size", sb.inode_size.to_string());
    field("Block groups", info.groups.to_string());
    field("Blocks per group", sb.blocks_per_group.to_string());
    field("Inodes per group", sb.inodes_per_group.to_string());
    field("Free blocks", free_count(sb.free_blocks_count, info.gd_free_blocks));
    field("Free inodes", free_count(u64::from(sb.free_inodes_count), info.gd_free_inodes));
    field("Needs recovery", yes_no(sb.needs_recovery()));
    let orphan_head = if sb.last_orphan == 0 {
        "0 (empty)".to_string()
    } else {
        format!("inode {}", sb.last_orphan)
    };
    field("Orphan list head", orphan_head);
    field("Orphan present", yes_no(orphan_present(sb)));
    field("Mount count", sb.mnt_count.to_string());
    field("Last mount time", dump::utc(u64::from(sb.mtime)));
    field("Last write time", dump::utc(u64::from(sb.wtime)));
    match &info.journal {
        JournalInfo::None => field("Journal", "none".into()),
        JournalInfo::Device(dev) => {
            field("Journal location", format!("external device {dev:#x} (not read)"))
        }
        JournalInfo::Inode { inum, extents, scan } => {
            let jsb = &scan.superblock;
            let format = jsb.format();
            let plural = if *extents == 1 { "" } else { "s" };
            field("Journal location", format!("inode {inum}, {extents} extent{plural}"));
            field("Journal size", format!("{} blocks of {} bytes", jsb.max_len, jsb.block_size));
            field(
                "Journal format",
                format!(
                    "{}, 64bit {}, checksum {}, revoke {}",
                    journal_version(jsb),
                    yes_no(format.is_64bit),
                    checksum_name(format.checksum),
                    yes_no(jsb.has_incompat(jbd2::feature::INCOMPAT_REVOKE)),
                ),
            );
            let names = journal_features(jsb);
            field(
                "Journal features",
                if names.is_empty() { "(none)".into() } else { names.join(" ") },
            );
            field("Journal sequence", format!("{:#010x} ({})", jsb.sequence.0, jsb.sequence.0));
            if jsb.errno != 0 {
                // As dumpe2fs: an aborted journal's error, for the next mount or e2fsck.
                field("Journal errno", jsb.errno.to_string());
            }
            if jsb.start == 0 {
                field("Journal start", "0 (empty)".into());
            } else {
                field("Journal start", format!("{} (not empty: needs recovery)", jsb.start));
                field("Journal transactions", scan.transactions.len().to_string());
                for txn in &scan.transactions {
                    out.push_str(&format!("  {}\n", dump::transaction_line(txn)));
                }
                out.push_str(&format!("  {}\n", dump::end_of_log_line(scan)));
            }
        }
    }
    out
}

fn yes_no(on: bool) -> String {
    if on { "yes" } else { "no" }.into()
}

fn journal_features(jsb: &jbd2::JournalSuperblock) -> Vec<String> {
    jbd2::feature::names(jsb.feature_compat, jsb.feature_incompat, jsb.feature_ro_compat)
}

fn to_json(info: &Info) -> Value {
    let sb = &info.sb;
    let journal = match &info.journal {
        JournalInfo::None => Value::Null,
        JournalInfo::Device(dev) => json!({ "location": "device", "device": dev }),
        JournalInfo::Inode { inum, extents, scan } => {
            let jsb = &scan.superblock;
            let format = jsb.format();
            let mut journal = json!({
                "location": "inode",
                "inode": inum,
                "extents": extents,
                "size_blocks": jsb.max_len,
                "block_size": jsb.block_size,
                "version": journal_version(jsb),
                "is_64bit": format.is_64bit,
                "checksum": checksum_name(format.checksum),
                "revoke": jsb.has_incompat(jbd2::feature::INCOMPAT_REVOKE),
                "features": journal_features(jsb),
                "sequence": jsb.sequence.0,
                "start": jsb.start,
                "empty": jsb.start == 0,
                "errno": jsb.errno,
            });
            if jsb.start != 0 {
                let transactions: Vec<Value> =
                    scan.transactions.iter().map(dump::transaction_json).collect();
                journal["transactions"] = Value::Array(transactions);
                journal["end_tid"] = json!(scan.end_tid.0);
                journal["stop_block"] = json!(scan.stop_block);
                journal["stop_reason"] = json!(scan.stop_reason);
            }
            journal
        }
    };
    json!({
        "volume_name": volume_name(sb),
        "uuid": fs::mkfs::format_uuid(&sb.uuid),
        "features": features(sb),
        "feature_compat": sb.feature_compat,
        "feature_incompat": sb.feature_incompat,
        "feature_ro_compat": sb.feature_ro_compat,
        "state": state(sb),
        "errors_behavior": errors_behavior(sb.errors),
        "block_size": sb.block_size(),
        "blocks_count": sb.blocks_count,
        "reserved_blocks": sb.r_blocks_count,
        "first_data_block": sb.first_data_block,
        "inodes_count": sb.inodes_count,
        "inode_size": sb.inode_size,
        "groups": info.groups,
        "blocks_per_group": sb.blocks_per_group,
        "inodes_per_group": sb.inodes_per_group,
        "free_blocks": {
            "superblock": sb.free_blocks_count,
            "group_descriptors": info.gd_free_blocks,
            "agree": sb.free_blocks_count == info.gd_free_blocks,
        },
        "free_inodes": {
            "superblock": sb.free_inodes_count,
            "group_descriptors": info.gd_free_inodes,
            "agree": u64::from(sb.free_inodes_count) == info.gd_free_inodes,
        },
        "needs_recovery": sb.needs_recovery(),
        "orphan_head": sb.last_orphan,
        "orphan_present": orphan_present(sb),
        "mount_count": sb.mnt_count,
        "last_mount_time": sb.mtime,
        "last_write_time": sb.wtime,
        "journal": journal,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_counts_say_when_they_disagree() {
        assert_eq!(free_count(10, 10), "10");
        let text = free_count(10, 12);
        assert!(text.contains("10 in the superblock") && text.contains("12 summed"), "{text}");
        assert!(text.contains("disagree"), "{text}");
    }
}
