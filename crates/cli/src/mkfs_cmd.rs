//! `quill mkfs [OPTIONS] IMAGE [SIZE]`: format an image or block device as ext4, the way
//! `mkfs.ext4` does (see `fs::mkfs` for what is identical and what differs).
//!
//! The command never asks: where mke2fs would prompt before overwriting an existing file
//! system, quill refuses unless `-F` is given. Option values are checked before anything is
//! touched; a bad value is a usage error ([`UsageError`], exit status 2, one line).
//!
//! A regular file is created when missing (SIZE is then required) and extended when SIZE is
//! larger. When the file system covers the whole file, the file is emptied and re-extended
//! first, which is what mke2fs's discard does to a file: every block then reads as zeros, so the
//! inode tables and the journal need not be written.

use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use blockdev::file::{FileDevice, FileOptions};
use blockdev::BlockDevice;
use fs::mkfs::{self, Features, MkfsOptions, MkfsProgress, MkfsReport};

use crate::progress::Progress;

/// Offset of `s_magic` in the superblock, which starts at byte 1024.
const MAGIC_OFFSET: u64 = 1024 + 0x38;
const EXT_MAGIC: u16 = 0xEF53;

/// A bad option value: printed on one line, exit status 2.
#[derive(Debug)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

fn usage(message: String) -> anyhow::Error {
    UsageError(message).into()
}

#[derive(clap::Args)]
#[command(after_help = "Defaults are mkfs.ext4's (e2fsprogs 1.47.0), except the block size: \
quill uses 4096 unless -b is given, where mkfs.ext4 uses 1024 below 512 MiB.\n\
Default features (-t ext4): has_journal ext_attr resize_inode dir_index filetype extent 64bit \
flex_bg sparse_super large_file huge_file dir_nlink extra_isize metadata_csum. -t ext3: \
has_journal ext_attr resize_inode dir_index filetype sparse_super large_file (files, \
directories and the journal mapped by indirect blocks). -t ext2: the same without has_journal.")]
pub struct MkfsArgs {
    /// File-system type: ext2, ext3 or ext4, each with mkfs.ext4's feature set for it
    /// (Debian's mke2fs.conf); -O edits it further [default: ext4]
    #[arg(short = 't', value_name = "TYPE", default_value = "ext4")]
    fs_type: String,
    /// Block size in bytes: 1024, 2048, 4096, 8192, 16384, 32768 or 65536 (a k suffix is
    /// allowed) [default: 4096]
    #[arg(short = 'b', value_name = "BLOCK_SIZE")]
    block_size: Option<String>,
    /// Bytes per inode: one inode per this many bytes, 1024 to 64M (k and m suffixes allowed)
    /// [default: mkfs.ext4's for the size: 4096 below 512 MiB, 16384 below 4 TiB, more above]
    #[arg(short = 'i', value_name = "BYTES_PER_INODE")]
    bytes_per_inode: Option<String>,
    /// Inode size in bytes: a power of two from 128 to the block size [default: 256]
    #[arg(short = 'I', value_name = "INODE_SIZE")]
    inode_size: Option<String>,
    /// Journal options, comma-separated: size=MIB, the log's size in MiB (1024 to 10240000
    /// blocks) [default: mkfs.ext4's size for the file system: 4 MiB to 1 GiB];
    /// fast_commit_size=KIB, with -O fast_commit the fast-commit area's size in KiB, added to
    /// the log [default: a 64th of the log]
    #[arg(short = 'J', value_name = "size=MIB,fast_commit_size=KIB")]
    journal: Option<String>,
    /// Features to add, or remove with ^, separated by commas (repeatable), e.g.
    /// ^metadata_csum,orphan_file. Accepted: has_journal ext_attr resize_inode dir_index
    /// fast_commit orphan_file meta_bg extent 64bit mmp flex_bg ea_inode metadata_csum_seed large_dir
    /// inline_data
    /// sparse_super large_file huge_file uninit_bg (gdt_csum) dir_nlink extra_isize
    /// metadata_csum project quota bigalloc
    #[arg(short = 'O', value_name = "FEATURES")]
    features: Vec<String>,
    /// With -O bigalloc: the cluster size in bytes, a power of two from the block size up to
    /// 65536 blocks (a k or m suffix is allowed) [default: 16 blocks]
    #[arg(short = 'C', value_name = "CLUSTER_SIZE")]
    cluster_size: Option<String>,
    /// Volume label, at most 16 bytes [default: none]
    #[arg(short = 'L', value_name = "LABEL")]
    label: Option<String>,
    /// File-system UUID: a UUID such as 0f6ab5c4-5d9e-4c63-9a5e-1b2c3d4e5f60, "random" or
    /// "clear" [default: random]
    #[arg(short = 'U', value_name = "UUID")]
    uuid: Option<String>,
    /// Percentage of blocks reserved for root, 0 to 50 [default: 5]
    #[arg(short = 'm', value_name = "RESERVED%")]
    reserved_percent: Option<String>,
    /// Overwrite an image that already holds an ext2/ext3/ext4 file system
    #[arg(short = 'F')]
    force: bool,
    /// Print nothing but errors
    #[arg(short = 'q')]
    quiet: bool,
    /// The image file (created if missing) or block device to format
    image: PathBuf,
    /// File-system size: bytes with a K, M, G or T suffix (powers of 1024) or s (512-byte
    /// sectors), or a bare number of blocks as mkfs.ext4 counts them (of -b bytes, or 1 KiB
    /// without -b) [default: the whole image]
    size: Option<String>,
}

/// The options, checked, and what to do with the image.
struct Plan {
    options: MkfsOptions,
    quiet: bool,
}

pub fn run(args: MkfsArgs) -> Result<()> {
    let plan = parse_options(&args)?;
    let mut options = plan.options;
    let (dev, created) = prepare_image(&args, &mut options)?;
    let result = format(&dev, &options, plan.quiet);
    if result.is_err() && created {
        // Do not leave a half-made image behind that we created ourselves.
        let _ = std::fs::remove_file(&args.image);
    }
    let report = result?;
    if !plan.quiet {
        print_summary(&args.image, &report);
    }
    Ok(())
}

fn parse_options(args: &MkfsArgs) -> Result<Plan> {
    let mut options = MkfsOptions::default();
    if let Some(text) = &args.block_size {
        let bytes = parse_number_with_suffix(text, &[('k', 10)])
            .filter(|b| b.is_power_of_two() && (1024..=65536).contains(b))
            .ok_or_else(|| {
                usage(format!("invalid block size '{text}' (1024 to 65536, a power of two)"))
            })?;
        options.block_size = bytes as u32;
    }
    if let Some(text) = &args.bytes_per_inode {
        let ratio = parse_number_with_suffix(text, &[('k', 10), ('m', 20)])
            .filter(|r| {
                (u64::from(mkfs::INODE_RATIO_MIN)..=u64::from(mkfs::INODE_RATIO_MAX)).contains(r)
            })
            .ok_or_else(|| usage(format!("invalid bytes per inode '{text}' (1024 to 64M)")))?;
        options.inode_ratio = Some(ratio as u32);
    }
    if let Some(text) = &args.inode_size {
        let size = text
            .parse::<u16>()
            .ok()
            .filter(|s| s.is_power_of_two() && *s >= 128 && u32::from(*s) <= options.block_size)
            .ok_or_else(|| {
                usage(format!(
                    "invalid inode size '{text}' (a power of two from 128 to {})",
                    options.block_size
                ))
            })?;
        options.inode_size = size;
    }
    if let Some(text) = &args.journal {
        (options.journal_blocks, options.fast_commit_blocks) =
            parse_journal(text, options.block_size)?;
    }
    let mut features = Features::for_fs_type(&args.fs_type).map_err(|e| usage(e.to_string()))?;
    for list in &args.features {
        features.edit(list).map_err(|e| usage(e.to_string()))?;
    }
    options.features = features;
    if let Some(text) = &args.cluster_size {
        let bytes = parse_number_with_suffix(text, &[('k', 10), ('m', 20)])
            .filter(|b| b.is_power_of_two() && *b >= u64::from(options.block_size))
            .and_then(|b| u32::try_from(b).ok())
            .ok_or_else(|| {
                usage(format!(
                    "invalid cluster size '{text}' (a power of two, at least the block size)"
                ))
            })?;
        options.cluster_size = Some(bytes);
    }
    if let Some(label) = &args.label {
        if label.len() > mkfs::LABEL_BYTES_MAX {
            return Err(usage(format!("label '{label}' is longer than 16 bytes")));
        }
        options.label = label.clone();
    }
    if let Some(text) = &args.uuid {
        options.uuid = match text.to_ascii_lowercase().as_str() {
            "random" => None,
            "clear" | "null" => Some([0; 16]),
            _ => Some(
                mkfs::parse_uuid(text).ok_or_else(|| usage(format!("invalid UUID '{text}'")))?,
            ),
        };
    }
    if let Some(text) = &args.reserved_percent {
        let percent = text
            .parse::<f64>()
            .ok()
            .filter(|p| (0.0..=mkfs::RESERVED_PERCENT_MAX).contains(p))
            .ok_or_else(|| {
                usage(format!("invalid reserved blocks percentage '{text}' (0 to 50)"))
            })?;
        options.reserved_percent = percent;
    }
    if let Some(text) = &args.size {
        let block_unit =
            if args.block_size.is_some() { u64::from(options.block_size) } else { 1024 };
        let bytes = parse_size(text, block_unit)
            .filter(|&b| b >= u64::from(options.block_size))
            .ok_or_else(|| usage(format!("invalid size '{text}'")))?;
        options.size_bytes = Some(bytes);
    }
    Ok(Plan { options, quiet: args.quiet })
}

/// `-J size=MIB,fast_commit_size=KIB` → (log blocks, fast-commit blocks), as mke2fs's
/// `jsize_to_blks` and `figure_journal_size` count them (the area in whole blocks, rounded
/// down). Either may be left out.
fn parse_journal(text: &str, block_size: u32) -> Result<(Option<u32>, Option<u32>)> {
    let (mut blocks, mut fast_commit) = (None, None);
    let kib_per_block = u64::from(block_size) / 1024;
    for option in text.split(',') {
        match option.split_once('=') {
            Some(("size", mib)) => {
                let mib: u64 =
                    mib.parse().map_err(|_| usage(format!("invalid journal size '{mib}'")))?;
                let n = mib * 1024 / kib_per_block;
                let n = u32::try_from(n)
                    .ok()
                    .filter(|n| (mkfs::JOURNAL_BLOCKS_MIN..=mkfs::JOURNAL_BLOCKS_MAX).contains(n))
                    .ok_or_else(|| {
                        usage(format!(
                            "a journal of {mib} MiB is {n} blocks, outside 1024 to 10240000 blocks"
                        ))
                    })?;
                blocks = Some(n);
            }
            Some(("fast_commit_size", kib)) => {
                let kib: u64 = kib
                    .parse()
                    .map_err(|_| usage(format!("invalid fast-commit area size '{kib}' (KiB)")))?;
                let n = u32::try_from(kib / kib_per_block)
                    .ok()
                    .filter(|&n| n <= mkfs::JOURNAL_BLOCKS_MAX)
                    .ok_or_else(|| usage(format!("a fast-commit area of {kib} KiB is too big")))?;
                // As mke2fs: 0 asks for nothing (the default stays); less than a block asks
                // for an empty area.
                fast_commit = (kib > 0).then_some(n);
            }
            _ => {
                return Err(usage(format!(
                    "unsupported journal option '{option}' (size=MIB, fast_commit_size=KIB)"
                )))
            }
        }
    }
    Ok((blocks, fast_commit))
}

/// A decimal (or 0x hex) number with at most one suffix from `suffixes` (letter, shift).
fn parse_number_with_suffix(text: &str, suffixes: &[(char, u32)]) -> Option<u64> {
    let (digits, shift) = match text.chars().last()? {
        c if c.is_ascii_alphabetic() => {
            let &(_, shift) = suffixes.iter().find(|(s, _)| *s == c.to_ascii_lowercase())?;
            (&text[..text.len() - 1], shift)
        }
        _ => (text, 0),
    };
    let n = match digits.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok()?,
        None => digits.parse::<u64>().ok()?,
    };
    n.checked_mul(1u64 << shift)
}

/// mkfs.ext4's SIZE (`parse_num_blocks2`): K/M/G/T bytes, s sectors, or bare blocks.
fn parse_size(text: &str, block_unit: u64) -> Option<u64> {
    if text.ends_with(|c: char| c.is_ascii_digit()) {
        return parse_number_with_suffix(text, &[])?.checked_mul(block_unit);
    }
    parse_number_with_suffix(text, &[('k', 10), ('m', 20), ('g', 30), ('t', 40), ('s', 9)])
}

/// Creates, extends or checks the image; returns the device and whether we created the file.
fn prepare_image(args: &MkfsArgs, options: &mut MkfsOptions) -> Result<(FileDevice, bool)> {
    let path = &args.image;
    let metadata = match std::fs::metadata(path) {
        Ok(m) => Some(m),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("cannot examine {}", path.display())),
    };
    let Some(metadata) = metadata else {
        let Some(size) = options.size_bytes else {
            return Err(usage(format!(
                "{} does not exist; give a SIZE to create it",
                path.display()
            )));
        };
        let file = std::fs::File::create_new(path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        file.set_len(size).with_context(|| format!("cannot size {}", path.display()))?;
        options.device_zeroed = true;
        let dev = FileDevice::open(path, FileOptions::default())?;
        return Ok((dev, true));
    };
    if !args.force && holds_ext_file_system(path)? {
        bail!("{} contains an ext2/ext3/ext4 file system; use -F to overwrite it", path.display());
    }
    if metadata.is_file() {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        let len = metadata.len();
        let fs_bytes = options.size_bytes.unwrap_or(len);
        if fs_bytes >= len {
            // Discard, as mke2fs does for a file: empty it and give it its size back.
            file.set_len(0).with_context(|| format!("cannot truncate {}", path.display()))?;
            file.set_len(fs_bytes).with_context(|| format!("cannot size {}", path.display()))?;
            options.device_zeroed = true;
        }
    }
    let dev = FileDevice::open(path, FileOptions::default())?;
    Ok((dev, false))
}

/// Whether the superblock magic of ext2/3/4 sits at byte 1024 + 0x38.
fn holds_ext_file_system(path: &Path) -> Result<bool> {
    use std::os::unix::fs::FileExt;
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut magic = [0u8; 2];
    match file.read_exact_at(&mut magic, MAGIC_OFFSET) {
        Ok(()) => Ok(u16::from_le_bytes(magic) == EXT_MAGIC),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// Runs mkfs, with a progress bar on stderr when it is a terminal (and -q is not given).
fn format(dev: &dyn BlockDevice, options: &MkfsOptions, quiet: bool) -> Result<MkfsReport> {
    let bar = Progress::new("Writing metadata", 0, !quiet, true);
    let mut progress = |p: MkfsProgress| bar.set(p.bytes_done, p.bytes_total);
    let report = mkfs::mkfs_with_progress(dev, options, &mut progress).context("mkfs failed");
    bar.finish();
    report
}

fn print_summary(image: &Path, r: &MkfsReport) {
    let unit = if r.block_size >= 1024 {
        format!("{}k", r.block_size / 1024)
    } else {
        r.block_size.to_string()
    };
    println!(
        "Creating filesystem with {} {unit} blocks and {} inodes on {}",
        r.blocks_count,
        r.inodes_count,
        image.display()
    );
    println!("Filesystem UUID: {}", mkfs::format_uuid(&r.uuid));
    println!("Features: {}", r.features.names().join(" "));
    if !r.backup_superblocks.is_empty() {
        let list: Vec<String> = r.backup_superblocks.iter().map(u64::to_string).collect();
        println!("Superblock backups stored on blocks:\n\t{}", list.join(", "));
    }
    if r.cluster_blocks > 1 {
        println!(
            "Cluster size: {} bytes ({} blocks)",
            r.block_size * r.cluster_blocks,
            r.cluster_blocks
        );
    }
    println!(
        "{} block groups of {} blocks and {} inodes; {} blocks ({:.2}%) reserved for root",
        r.groups,
        r.blocks_per_group,
        r.inodes_per_group,
        r.reserved_blocks,
        100.0 * r.reserved_blocks as f64 / r.blocks_count as f64
    );
    if r.fast_commit_blocks > 0 {
        println!(
            "Journal: {} blocks, of which {} for fast commits",
            r.journal_blocks, r.fast_commit_blocks
        );
    } else if r.journal_blocks > 0 {
        println!("Journal: {} blocks", r.journal_blocks);
    }
    println!("{} free blocks, {} free inodes", r.free_blocks, r.free_inodes);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_mkfs_ext4_units() {
        assert_eq!(parse_size("64M", 1024), Some(64 << 20));
        assert_eq!(parse_size("2g", 1024), Some(2 << 30));
        assert_eq!(parse_size("8s", 1024), Some(4096));
        assert_eq!(parse_size("100", 4096), Some(409_600));
        assert_eq!(parse_size("100", 1024), Some(102_400));
        assert_eq!(parse_size("12Q", 1024), None);
        assert_eq!(parse_size("M", 1024), None);
    }

    #[test]
    fn journal_size_in_mib_and_fast_commit_area_in_kib_become_blocks() {
        assert_eq!(parse_journal("size=64", 4096).unwrap(), (Some(16384), None));
        assert_eq!(parse_journal("size=4", 1024).unwrap(), (Some(4096), None));
        // KiB rounded down to blocks; 0 asks for the default, under a block for none.
        assert_eq!(parse_journal("fast_commit_size=401", 4096).unwrap(), (None, Some(100)));
        assert_eq!(parse_journal("fast_commit_size=0", 4096).unwrap(), (None, None));
        assert_eq!(parse_journal("fast_commit_size=1", 4096).unwrap(), (None, Some(0)));
        assert_eq!(
            parse_journal("size=16,fast_commit_size=8", 1024).unwrap(),
            (Some(16384), Some(8))
        );
        assert!(parse_journal("size=1", 4096).is_err());
        assert!(parse_journal("device=/dev/sdb", 4096).is_err());
    }
}
