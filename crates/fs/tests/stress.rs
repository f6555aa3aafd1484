//! The journal under stress, through the file system, for every preset of
//! `journal::config::PRESETS` (a preset added there is stressed the moment it exists).
//!
//! [`THREADS`] threads create, append to, overwrite, fsync, fdatasync and unlink files, half
//! in a directory of their own and half in one directory they all share, for a fixed time, on
//! an image made by mkfs.ext4 with the smallest journal it makes (1024 blocks of 1 KiB), so
//! handles keep waiting for log space and checkpoints run all the time (the journal's
//! checkpoint counter must be above zero, and is printed).
//!
//! - Unmount: the file system is unmounted, `e2fsck -fn` must find it clean, and after a
//!   remount every file holds exactly what was last written to it (every fsync that returned
//!   Ok among them), every unlinked file is gone and no other name exists.
//! - Crash (data=journal): the run is recorded; the file system stops without unmounting and
//!   three crash images are checked: the flush boundaries half way through the recording
//!   and at its end (only what the device had made durable) and the final media state (every
//!   write that completed). quill recovers each;
//!   every file whose fsync or fdatasync returned Ok before the crash point must be present
//!   with those bytes or bytes of later writes; nothing else is invented; the recovered image
//!   unmounts and `e2fsck -fn` finds it clean.
//!
//! `QUILL_STRESS_MS` sets each run's length (default 1500 ms); `QUILL_SEED` replays a run's
//! random choices (thread timing still varies). The seed is printed.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockdev::memory::MemDevice;
use blockdev::recording::{CrashKind, RecordingDevice};
use blockdev::BlockDevice;
use common::{assert_fsck_clean, bytes_from, have, list_dir, mkfs, read_all, run_watched};
use common::{env_count, seed, Rng, Scratch};
use fs::{DataMode, Filesystem, FsError, MountOptions, ROOT_INO};
use journal::config::PRESETS;
use journal::JournalConfig;

/// Threads of the workload (the 64: many handles per transaction, many waiting for
/// log space).
const THREADS: usize = 64;
/// A run that has not finished this long after its time is up is hung.
const WATCHDOG: Duration = Duration::from_secs(120);
/// The shared directory's name; each thread's own is `t<N>`.
const SHARED: &str = "shared";
/// Live files and bytes one thread keeps at most: the workload runs for a fixed time, so the
/// faster the file system the more it would create and append, and 64 threads once ran the
/// 48 MB image out of inodes. 64 x 48 files and 64 x 256 KiB stay well inside it.
const LIVE_FILES_MAX: usize = 48;
const LIVE_BYTES_MAX: usize = 256 << 10;

fn run_length() -> Duration {
    Duration::from_millis(env_count("QUILL_STRESS_MS", 1500) as u64)
}

/// One file of a thread's model.
#[derive(Debug, Clone)]
struct FileModel {
    /// The directory it lives in (`t<N>` or [`SHARED`]) and its name there.
    dir: String,
    name: String,
    ino: u32,
    /// Its contents after each write (versions[0] is empty); sizes never shrink.
    versions: Vec<Vec<u8>>,
    /// (mark, version) of each fsync or fdatasync that returned Ok, oldest first.
    acks: Vec<(u64, usize)>,
    unlinked: bool,
}

impl FileModel {
    fn path(&self) -> String {
        format!("/{}/{}", self.dir, self.name)
    }
}

#[derive(Debug, Default)]
struct ThreadLog {
    files: Vec<FileModel>,
    ops: u64,
    fsyncs: u64,
}

/// Nonzero random bytes: a zero or stale byte never passes for written data.
fn nonzero_bytes(rng: &mut Rng, len: usize) -> Vec<u8> {
    (0..len).map(|_| (rng.next() as u8) | 1).collect()
}

fn write_all(fs: &Filesystem, ino: u32, offset: u64, data: &[u8]) -> Result<(), FsError> {
    let mut done = 0;
    while done < data.len() {
        let n = fs.write(ino, offset + done as u64, &data[done..])?;
        assert!(n > 0, "inode {ino}: a write made no progress");
        done += n;
    }
    Ok(())
}

/// One thread's share: until `until`, create (in its own or the shared directory), append,
/// overwrite, fsync or fdatasync (`mark(n)` labels the recording right after one returns Ok)
/// and unlink files. No call may fail.
fn stress_thread(
    fs: &Filesystem,
    thread: usize,
    seed: u64,
    until: Instant,
    mark: &dyn Fn(u64),
) -> ThreadLog {
    static NEXT_MARK: AtomicU64 = AtomicU64::new(1);
    let mut rng = Rng::for_thread(seed, thread);
    let own = format!("t{thread}");
    let dirs =
        [fs.resolve(&format!("/{own}")).unwrap(), fs.resolve(&format!("/{SHARED}")).unwrap()];
    let mut log = ThreadLog::default();
    while Instant::now() < until {
        log.ops += 1;
        let live: Vec<usize> = (0..log.files.len()).filter(|&i| !log.files[i].unlinked).collect();
        let live_bytes: usize =
            live.iter().map(|&i| log.files[i].versions.last().map_or(0, Vec::len)).sum();
        let full = live.len() >= LIVE_FILES_MAX || live_bytes >= LIVE_BYTES_MAX;
        if !full && (live.len() < 3 || rng.chance(6)) {
            let shared = rng.chance(2);
            let (dir, name) = match shared {
                true => (SHARED.to_string(), format!("t{thread}-f{}", log.files.len())),
                false => (own.clone(), format!("f{}", log.files.len())),
            };
            let attr = fs
                .create(dirs[shared as usize], name.as_bytes(), 0o644, 0, 0)
                .unwrap_or_else(|e| panic!("thread {thread}: create {dir}/{name}: {e}"));
            let versions = vec![Vec::new()];
            let file =
                FileModel { dir, name, ino: attr.ino, versions, acks: vec![], unlinked: false };
            log.files.push(file);
            continue;
        }
        let file = &mut log.files[live[rng.below(live.len() as u64) as usize]];
        let current = file.versions.last().unwrap().clone();
        // At the bound, appends become overwrites and creates become unlinks.
        let op = match rng.below(12) {
            0..=2 if full && !current.is_empty() => 3,
            _ if full && rng.chance(3) => 11,
            op => op,
        };
        match op {
            op @ 0..=5 => {
                let len = 1 + rng.below(3000) as usize;
                let offset = if op < 3 || current.is_empty() {
                    current.len()
                } else {
                    rng.below(current.len() as u64) as usize
                };
                let bytes = nonzero_bytes(&mut rng, len);
                write_all(fs, file.ino, offset as u64, &bytes)
                    .unwrap_or_else(|e| panic!("thread {thread}: write {}: {e}", file.path()));
                let mut next = current;
                next.resize(next.len().max(offset + len), 0);
                next[offset..offset + len].copy_from_slice(&bytes);
                file.versions.push(next);
            }
            6..=10 => {
                let datasync = rng.chance(2);
                fs.fsync(file.ino, datasync)
                    .unwrap_or_else(|e| panic!("thread {thread}: fsync {}: {e}", file.path()));
                let n = NEXT_MARK.fetch_add(1, Ordering::Relaxed);
                mark(n);
                file.acks.push((n, file.versions.len() - 1));
                log.fsyncs += 1;
            }
            _ => {
                let dir = dirs[(file.dir == SHARED) as usize];
                fs.unlink(dir, file.name.as_bytes())
                    .unwrap_or_else(|e| panic!("thread {thread}: unlink {}: {e}", file.path()));
                file.unlinked = true;
            }
        }
    }
    log
}

/// A fresh image with the smallest journal mke2fs makes, its directories made by quill.
fn formatted(scratch: &Scratch) -> Vec<u8> {
    let path = scratch.path("fs.img");
    // 1 KiB blocks and a 1024-block journal: the log wraps every few dozen transactions.
    mkfs(&path, "48M", &["-b", "1024", "-J", "size=1", "-N", "16384"]);
    let dev = Arc::new(MemDevice::from_bytes(std::fs::read(&path).unwrap()));
    let fs = Filesystem::open(dev.clone(), MountOptions::default()).unwrap();
    for dir in (0..THREADS).map(|t| format!("t{t}")).chain([SHARED.to_string()]) {
        fs.mkdir(ROOT_INO, dir.as_bytes(), 0o755, 0, 0).unwrap();
    }
    fs.unmount().unwrap();
    dev.snapshot()
}

/// Runs the workload on `dev` under `options`; returns the threads' logs and a line of figures.
fn run_stress(
    dev: Arc<dyn BlockDevice>,
    options: &MountOptions,
    seed: u64,
    mark: Arc<dyn Fn(u64) + Send + Sync>,
) -> (Filesystem, Vec<ThreadLog>, String) {
    let fs = Arc::new(Filesystem::open(dev, options.clone()).unwrap());
    let (capacity, _) = fs.journal().log_usage();
    assert!(capacity <= 1024, "a log of {capacity} blocks");
    let until = Instant::now() + run_length();
    let shared = fs.clone();
    let logs = run_watched(THREADS, run_length() + WATCHDOG, move |t| {
        stress_thread(&shared, t, seed, until, &*mark)
    });
    let stats = fs.journal().stats();
    let figures = format!(
        "{} ops, {} fsyncs acknowledged; {} transactions, {:.1} handles each, the log written \
         {:.1} times over, {} checkpoints ({} blocks), {} handle starts waited for log space",
        logs.iter().map(|l| l.ops).sum::<u64>(),
        logs.iter().map(|l| l.fsyncs).sum::<u64>(),
        stats.transactions,
        stats.handles as f64 / stats.transactions.max(1) as f64,
        stats.log_blocks_written as f64 / f64::from(capacity),
        stats.checkpoints,
        stats.checkpoint_blocks,
        stats.space_waits,
    );
    assert!(stats.checkpoints > 0, "no checkpoint ran: {figures}");
    let fs = Arc::try_unwrap(fs).unwrap_or_else(|_| panic!("the workers are done"));
    (fs, logs, figures)
}

/// Checks the tree of a file system after the workload. `marks`: the acknowledgements made
/// before the crash (None: a clean unmount, where every file holds exactly its last version).
/// Returns how many acknowledged files were checked.
fn check_tree(
    fs: &Filesystem,
    logs: &[ThreadLog],
    marks: Option<&HashSet<u64>>,
) -> Result<usize, String> {
    let files: HashMap<String, &FileModel> =
        logs.iter().flat_map(|l| &l.files).map(|f| (f.path(), f)).collect();
    let mut present = HashSet::new();
    for dir in (0..THREADS).map(|t| format!("t{t}")).chain([SHARED.to_string()]) {
        let ino = fs.resolve(&format!("/{dir}")).map_err(|e| format!("/{dir}: {e}"))?;
        for entry in list_dir(fs, ino, 256) {
            if entry.name == b"." || entry.name == b".." {
                continue;
            }
            let path = format!("/{dir}/{}", String::from_utf8_lossy(&entry.name));
            let Some(file) = files.get(&path) else {
                return Err(format!("{path}: never created"));
            };
            if entry.ino != file.ino {
                return Err(format!("{path}: inode {} instead of {}", entry.ino, file.ino));
            }
            present.insert(path);
        }
    }
    let mut checked = 0;
    for (path, file) in &files {
        let is_there = present.contains(path);
        let Some(marks) = marks else {
            // A clean unmount: exactly the last state.
            if is_there == file.unlinked {
                return Err(format!("{path}: present {is_there}, unlinked {}", file.unlinked));
            }
            if is_there {
                let data = read_all(fs, file.ino).map_err(|e| format!("read {path}: {e}"))?;
                if data != *file.versions.last().unwrap() {
                    return Err(format!("{path}: not its last contents ({} bytes)", data.len()));
                }
                checked += usize::from(!file.acks.is_empty());
            }
            continue;
        };
        let ack = file.acks.iter().rev().find(|a| marks.contains(&a.0));
        if !is_there {
            // Unlinking is not acknowledged by these fsyncs, so only a file never unlinked
            // must be there once acknowledged.
            if let (Some(a), false) = (ack, file.unlinked) {
                return Err(format!("{path}: missing, fsync acknowledged with mark {}", a.0));
            }
            continue;
        }
        let first = match ack {
            Some(a) if !file.unlinked => a.1,
            _ => 0,
        };
        let data = read_all(fs, file.ino).map_err(|e| format!("read {path}: {e}"))?;
        bytes_from(&data, &file.versions[first..])
            .map_err(|e| format!("{path} (acknowledged {ack:?}): {e}"))?;
        checked += usize::from(ack.is_some());
    }
    Ok(checked)
}

/// Unmounts `fs` and checks the image with `e2fsck -fn`.
fn unmount_and_check(fs: Filesystem, dev: &MemDevice, scratch: &Scratch) {
    fs.unmount().unwrap();
    let image = scratch.path("unmounted.img");
    std::fs::write(&image, dev.snapshot()).unwrap();
    assert_fsck_clean(&image);
}

/// Runs `body(preset, fresh image, seed, scratch)` for every preset in PRESETS, printing how
/// long each took; skips (with a line saying so) without mkfs.ext4 or e2fsck.
fn for_every_preset(name: &str, body: impl Fn(&str, &[u8], u64, &Scratch)) {
    if !have("mkfs.ext4", name) || !have("e2fsck", name) {
        return;
    }
    let seed = seed(name);
    let scratch = Scratch::new(name);
    let image = formatted(&scratch);
    for preset in PRESETS {
        let started = Instant::now();
        body(preset, &image, seed, &scratch);
        println!("{preset}: {name} took {:.1} s", started.elapsed().as_secs_f64());
    }
}

#[test]
fn sixty_four_threads_with_a_small_journal_keep_every_fsync_and_unmount_clean_under_every_preset() {
    for_every_preset("stress_unmount", |preset, image, seed, scratch| {
        let dev = Arc::new(MemDevice::from_bytes(image.to_vec()));
        let options =
            MountOptions { journal: JournalConfig::preset(preset).unwrap(), ..Default::default() };
        let (fs, logs, figures) = run_stress(dev.clone(), &options, seed, Arc::new(|_| {}));
        unmount_and_check(fs, &dev, scratch);
        let fs = Filesystem::open(dev.clone(), options.clone()).unwrap();
        let checked =
            check_tree(&fs, &logs, None).unwrap_or_else(|e| panic!("{preset}, seed {seed}: {e}"));
        unmount_and_check(fs, &dev, scratch);
        println!("{preset}: {figures}; {checked} acknowledged files checked after the remount");
    });
}

#[test]
fn sixty_four_threads_with_a_small_journal_keep_every_fsync_across_a_crash_under_every_preset() {
    for_every_preset("stress_crash", |preset, image, seed, scratch| {
        let recording = Arc::new(RecordingDevice::new(image.to_vec()));
        let options = MountOptions {
            journal: JournalConfig::preset(preset).unwrap(),
            data: DataMode::Journal,
            ..Default::default()
        };
        let rec = recording.clone();
        let (fs, logs, figures) =
            run_stress(recording.clone(), &options, seed, Arc::new(move |n| rec.mark(n)));
        fs.crash();
        let end = recording.ops_len();
        let durable = recording
            .crash_state(end, CrashKind::FlushBoundary, Vec::new(), None)
            .expect("the end of the log is a flush boundary");
        let middle = recording
            .crash_state(end / 2, CrashKind::FlushBoundary, Vec::new(), None)
            .expect("any point of the log has its flush boundary");
        let states = [
            ("a flush boundary half way", recording.materialize(&middle), Some(&middle.marks)),
            ("the last flush boundary", recording.materialize(&durable), Some(&durable.marks)),
            ("the final media state", recording.live_image(), None),
        ];
        let all_marks: HashSet<u64> =
            logs.iter().flat_map(|l| &l.files).flat_map(|f| &f.acks).map(|a| a.0).collect();
        let mut checked = Vec::new();
        for (what, bytes, marks) in states {
            let marks: HashSet<u64> =
                marks.map_or(all_marks.clone(), |m| m.iter().copied().collect());
            let dev = Arc::new(MemDevice::from_bytes(bytes));
            let fs = Filesystem::open(dev.clone(), options.clone())
                .unwrap_or_else(|e| panic!("{preset}, {what}: recovery failed: {e}"));
            let n = check_tree(&fs, &logs, Some(&marks))
                .unwrap_or_else(|e| panic!("{preset}, {what}, seed {seed}: {e}"));
            unmount_and_check(fs, &dev, scratch);
            checked.push(format!("{what}: {n} acknowledged files checked"));
        }
        println!("{preset} (data=journal): {figures}; recovered {}", checked.join(", "));
    });
}
