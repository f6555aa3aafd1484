//! The recovery study (`quill bench --recovery-study WORKLOAD`): FAST'18's Table 3 on this
//! machine. One crash image with a large journal (1 GiB by default) filled to about 70% by a
//! workload, without a checkpoint, then each replayer times its own fresh copy of it, with the
//! host page cache dropped first, `rounds` times (the median is reported):
//!
//! | row | what is timed |
//! |---|---|
//! | `quill tN` | [`Ext4Image::recover_offline`] with `recovery_threads = N` (1 is JBD2's one-thread recovery, the classic row) |
//! | `e2fsck` | `e2fsck -fy -E journal_only` (e2fsprogs' replay) |
//! | `kernel` | `mount -o loop` of the image (the kernel replays at mount); unmounted untimed |
//!
//! quill's rows also give the median scan, replay and flush times from the recovery report,
//! and every replayed copy must be clean under `e2fsck -fn`.
//!
//! The image is filled by running the workload in rounds (each in its own directory, its
//! smallest size, ending with a sync: a commit, never a checkpoint) until the log holds
//! `fill_percent` of its capacity; a round that makes
//! the log shrink (a checkpoint) ends the fill too, and the fill reached is reported.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockdev::file::{FileDevice, FileOptions};
use blockdev::BlockDevice;
use fs::{DataMode, Ext4Image, Filesystem, MountOptions};

use crate::fsapi::{FsApi, LibApi, OpenFile};
use crate::percentile::median;
use crate::recovery::drop_caches;
use crate::targets::{fsck, run_tool, umount};
use crate::workloads::{self, Size, Workload, WorkloadParams};

/// What to study.
#[derive(Debug, Clone)]
pub struct StudyParams {
    pub workload: Workload,
    pub data: DataMode,
    pub journal_mib: u64,
    pub fill_percent: u64,
    /// quill's recovery thread counts (1 is the classic row).
    pub threads: Vec<usize>,
    pub rounds: usize,
    pub scratch: PathBuf,
    /// Give up filling after this long (the fill reached is reported).
    pub fill_seconds_max: f64,
}

/// The crashed image.
#[derive(Debug, Clone)]
pub struct StudyImage {
    pub path: PathBuf,
    pub log_capacity: u32,
    pub log_used: u32,
    pub transactions: u64,
    pub fill_seconds: f64,
    pub rounds: u64,
}

/// One replayer's timings.
#[derive(Debug, Clone, Default)]
pub struct StudyRow {
    pub label: String,
    pub seconds: Vec<f64>,
    /// quill only: scan, replay and flush seconds of each run.
    pub split: Vec<[f64; 3]>,
    /// No replayed copy was found unclean by `e2fsck -fn` (true when e2fsck is missing).
    pub all_clean: bool,
    pub error: Option<String>,
}

/// Workload rounds the fill may run before it gives up.
const FILL_ROUNDS_MAX: u64 = 100_000;

/// Image bytes beyond the journal, per journal byte: room for the workload's files (the image
/// is sparse), at least [`IMAGE_BYTES_BEYOND_JOURNAL_MIN`].
const IMAGE_BYTES_PER_JOURNAL_BYTE: u64 = 6;
const IMAGE_BYTES_BEYOND_JOURNAL_MIN: u64 = 256 << 20;

/// One inode per this many bytes: tokubench fills a 1 GiB log with about a million 200-byte
/// files (some 20 inode-table blocks logged per 300 files).
const INODE_RATIO_BYTES: u32 = 2048;

/// The workload's directories live under this one, one per round.
fn round_dir(round: u64) -> String {
    format!("round{round}")
}

/// Paths of the workload under `round{n}/`, so each round gets a fresh tree.
struct Under<'a> {
    api: &'a dyn FsApi,
    dir: String,
}

impl FsApi for Under<'_> {
    fn mkdir(&self, path: &str) -> std::io::Result<()> {
        self.api.mkdir(&format!("{}/{path}", self.dir))
    }
    fn create(&self, path: &str) -> std::io::Result<Box<dyn OpenFile>> {
        self.api.create(&format!("{}/{path}", self.dir))
    }
    fn open(&self, path: &str) -> std::io::Result<Box<dyn OpenFile>> {
        self.api.open(&format!("{}/{path}", self.dir))
    }
    fn unlink(&self, path: &str) -> std::io::Result<()> {
        self.api.unlink(&format!("{}/{path}", self.dir))
    }
    fn stat(&self, path: &str) -> std::io::Result<u64> {
        self.api.stat(&format!("{}/{path}", self.dir))
    }
    fn sync(&self) -> std::io::Result<()> {
        // quill's sync commits (as ext4's sync_fs does); it never checkpoints.
        self.api.sync()
    }
}

/// Makes the crash image at `path`: quill's mkfs with a `journal_mib` journal, the workload
/// in rounds until the log is `fill_percent` full, then a crash (nothing checkpointed or
/// unmounted).
pub fn make_study_image(params: &StudyParams, path: &Path) -> Result<StudyImage, String> {
    let began = Instant::now();
    let block_size = 4096u64;
    let journal_blocks = (params.journal_mib << 20) / block_size;
    let journal_bytes = params.journal_mib << 20;
    let image_bytes = journal_bytes
        + (journal_bytes * IMAGE_BYTES_PER_JOURNAL_BYTE).max(IMAGE_BYTES_BEYOND_JOURNAL_MIN);
    let dev = Arc::new(FileDevice::create(path, image_bytes).map_err(|e| e.to_string())?);
    let mkfs = fs::mkfs::MkfsOptions {
        device_zeroed: true,
        journal_blocks: Some(journal_blocks as u32),
        inode_ratio: Some(INODE_RATIO_BYTES),
        ..Default::default()
    };
    fs::mkfs::mkfs(dev.as_ref(), &mkfs).map_err(|e| format!("mkfs: {e}"))?;
    let options = MountOptions { data: params.data, ..Default::default() };
    let filesystem = Arc::new(Filesystem::open(dev, options).map_err(|e| e.to_string())?);
    let api = LibApi::new(filesystem.clone());
    let deadline = Duration::from_secs_f64(params.fill_seconds_max);
    let (mut capacity, mut used, mut used_before) = (0u32, 0u32, 0u32);
    let mut rounds = 0;
    while rounds < FILL_ROUNDS_MAX && began.elapsed() < deadline {
        api.mkdir(&round_dir(rounds)).map_err(|e| e.to_string())?;
        let under = Under { api: &api, dir: round_dir(rounds) };
        let mut run = WorkloadParams::new(2, Duration::from_millis(500), Size::Smallest);
        run.seed = rounds;
        workloads::run(params.workload, &under, None, &run)
            .map_err(|e| format!("filling, round {rounds}: {e}"))?;
        // Each round ends with a commit, as the commit timer would end it on the kernel: a
        // workload without fsync (tokubench) fills the log this way too.
        under.sync().map_err(|e| format!("filling, round {rounds}: {e}"))?;
        rounds += 1;
        (capacity, used) = filesystem.journal().log_usage();
        if used as u64 * 100 >= capacity as u64 * params.fill_percent || used < used_before {
            break;
        }
        used_before = used;
    }
    let transactions = filesystem.journal().stats().transactions;
    drop(api);
    let filesystem = Arc::try_unwrap(filesystem).map_err(|_| "file system still in use")?;
    filesystem.crash();
    Ok(StudyImage {
        path: path.to_path_buf(),
        log_capacity: capacity,
        log_used: used,
        transactions,
        fill_seconds: began.elapsed().as_secs_f64(),
        rounds,
    })
}

/// A replayer of the study.
#[derive(Debug, Clone, Copy)]
enum Replayer {
    Quill(usize),
    E2fsck,
    Kernel,
}

impl Replayer {
    fn label(self) -> String {
        match self {
            Replayer::Quill(1) => "quill t1 (classic)".to_string(),
            Replayer::Quill(n) => format!("quill t{n}"),
            Replayer::E2fsck => "e2fsck -E journal_only".to_string(),
            Replayer::Kernel => "kernel mount -o loop".to_string(),
        }
    }
}

/// One timed replay: seconds; quill's scan, replay and flush seconds; the `e2fsck -fn` verdict
/// on the replayed copy (`None` without e2fsck).
type OneReplay = (f64, Option<[f64; 3]>, Option<bool>);

/// Replays a fresh copy of `image` with `replayer`, cold; returns seconds and, for quill, the
/// scan/replay/flush split, after checking the copy with `e2fsck -fn`.
fn replay_once(replayer: Replayer, image: &Path, scratch: &Path) -> Result<OneReplay, String> {
    let copy = scratch.join("study-copy.img");
    let mountpoint = scratch.join("study-mnt");
    run_tool(Command::new("cp").arg("--sparse=always").arg(image).arg(&copy))?;
    drop_caches();
    let timed = (|| -> Result<(f64, Option<[f64; 3]>), String> {
        let began = Instant::now();
        match replayer {
            Replayer::Quill(threads) => {
                let dev =
                    FileDevice::open(&copy, FileOptions::default()).map_err(|e| e.to_string())?;
                let dev: Arc<dyn BlockDevice> = Arc::new(dev);
                let (report, _) = Ext4Image::recover_offline(dev, threads, &|_, _| {})
                    .map_err(|e| format!("quill recovery: {e}"))?;
                let us = |v: u64| v as f64 / 1e6;
                let split = [us(report.scan_us), us(report.replay_us), us(report.flush_us)];
                Ok((began.elapsed().as_secs_f64(), Some(split)))
            }
            Replayer::E2fsck => {
                let status = Command::new("e2fsck")
                    .args(["-fy", "-E", "journal_only"])
                    .arg(&copy)
                    .output()
                    .map_err(|e| format!("e2fsck: {e}"))?;
                if status.status.code().is_none_or(|c| c > 1) {
                    return Err(format!("e2fsck -E journal_only: {}", status.status));
                }
                Ok((began.elapsed().as_secs_f64(), None))
            }
            Replayer::Kernel => {
                std::fs::create_dir_all(&mountpoint).map_err(|e| e.to_string())?;
                run_tool(
                    Command::new("mount")
                        .args(["-t", "ext4", "-o", "loop"])
                        .arg(&copy)
                        .arg(&mountpoint),
                )?;
                let seconds = began.elapsed().as_secs_f64();
                umount(&mountpoint)?;
                Ok((seconds, None))
            }
        }
    })();
    let checked = timed.and_then(|(seconds, split)| Ok((seconds, split, fsck(&copy)?)));
    let _ = std::fs::remove_file(&copy);
    let _ = std::fs::remove_dir(&mountpoint);
    checked
}

/// Runs the study: the image, then `rounds` cold replays per replayer, interleaved.
pub fn recovery_study(
    params: &StudyParams,
    say: &mut dyn FnMut(&str),
) -> Result<(StudyImage, Vec<StudyRow>), String> {
    assert!(params.rounds >= 1 && !params.threads.is_empty());
    let path = params.scratch.join("study-crashed.img");
    say(&format!(
        "making the crash image: {} ({:?}), {} MiB journal, to {}% ...",
        params.workload.name(),
        params.data,
        params.journal_mib,
        params.fill_percent
    ));
    let image = make_study_image(params, &path)?;
    say(&format!(
        "crash image: {} of {} log blocks ({:.1}%), {} transactions, {} rounds, {:.0} s",
        image.log_used,
        image.log_capacity,
        image.log_used as f64 * 100.0 / image.log_capacity.max(1) as f64,
        image.transactions,
        image.rounds,
        image.fill_seconds
    ));
    let mut replayers: Vec<Replayer> = params.threads.iter().map(|&t| Replayer::Quill(t)).collect();
    replayers.push(Replayer::E2fsck);
    replayers.push(Replayer::Kernel);
    let mut rows: Vec<StudyRow> = replayers
        .iter()
        .map(|r| StudyRow { label: r.label(), all_clean: true, ..Default::default() })
        .collect();
    for round in 0..params.rounds {
        for (replayer, row) in replayers.iter().zip(rows.iter_mut()) {
            if row.error.is_some() {
                continue;
            }
            match replay_once(*replayer, &path, &params.scratch) {
                Ok((seconds, split, clean)) => {
                    let verdict = match clean {
                        Some(true) => "e2fsck -fn clean",
                        Some(false) => "e2fsck -fn NOT clean",
                        None => "no e2fsck to check",
                    };
                    say(&format!("round {}: {}: {seconds:.3} s, {verdict}", round + 1, row.label));
                    row.seconds.push(seconds);
                    row.split.extend(split);
                    row.all_clean &= clean != Some(false);
                }
                Err(e) => {
                    say(&format!("{}: {e}", row.label));
                    row.error = Some(e);
                }
            }
        }
    }
    let _ = std::fs::remove_file(&path);
    Ok((image, rows))
}

/// The study's table: median seconds (min..max), time against quill's classic row and
/// against the kernel, and quill's split.
pub fn format_study(rows: &[StudyRow]) -> String {
    let median_of = |row: &StudyRow| (!row.seconds.is_empty()).then(|| median(&row.seconds));
    let classic = rows.iter().find(|r| r.label.starts_with("quill t1")).and_then(median_of);
    let kernel = rows.iter().find(|r| r.label.starts_with("kernel")).and_then(median_of);
    let mut out = format!(
        "{:<24} {:>9} {:>17} {:>10} {:>10}  {}\n",
        "replayer",
        "median s",
        "min..max",
        "÷ classic",
        "÷ kernel",
        "scan / replay / flush s (median)"
    );
    for row in rows {
        let Some(m) = median_of(row) else {
            out.push_str(&format!(
                "{:<24} {}\n",
                row.label,
                row.error.as_deref().unwrap_or("no runs")
            ));
            continue;
        };
        let min = row.seconds.iter().cloned().fold(f64::INFINITY, f64::min);
        let max = row.seconds.iter().cloned().fold(0.0, f64::max);
        let ratio = |base: Option<f64>| base.map(|b| format!("{:.2}×", m / b)).unwrap_or_default();
        let split = if row.split.is_empty() {
            String::new()
        } else {
            let part = |i: usize| {
                let v: Vec<f64> = row.split.iter().map(|s| s[i]).collect();
                median(&v)
            };
            format!("{:.3} / {:.3} / {:.3}", part(0), part(1), part(2))
        };
        out.push_str(&format!(
            "{:<24} {:>9.3} {:>17} {:>10} {:>10}  {split}{}\n",
            row.label,
            m,
            format!("{min:.3}..{max:.3}"),
            ratio(classic),
            ratio(kernel),
            if row.all_clean { "" } else { "  (e2fsck -fn NOT clean)" }
        ));
    }
    out
}
