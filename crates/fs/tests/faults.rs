//! Device faults and full file systems, through the file system.
//!
//! 1. Device errors during a multi-threaded workload: four threads create files, append,
//!    overwrite, fsync or fdatasync and rename them, on a [`FaultDevice`] over a
//!    [`RecordingDevice`] over an image made by mkfs.ext4. One fault (EIO on a journal write,
//!    on a data or metadata write home, on a FUA commit write, on a flush, on a read; ENOSPC
//!    from the device on writes) is injected at positions spread over the run. Under
//!    errors=remount-ro the file system must turn read-only and refuse every later change;
//!    under errors=continue the caller sees the error and the superblock records it. No
//!    thread may hang (watchdog) or panic. Then the file system crashes, and the final media
//!    state, a sample of flush-boundary crash states and of subset crash states are each
//!    recovered by quill, checked against every fsync that returned Ok (the file present, under
//!    its name at that fsync or a later one, with the bytes acknowledged or bytes of later
//!    writes to it), unmounted and found clean by `e2fsck -fn`; stock `e2fsck -fy` on the raw
//!    crash image may only replay the journal, process orphans and fix free counts. Every
//!    case runs under every journal preset of `journal::config::PRESETS` (a preset added later
//!    joins on its own), with fault positions placed from that preset's own run without faults.
//! 2. A full file system under many threads: writers fill the blocks and creators the inodes;
//!    every failure is ENOSPC, fsync of what was written still works, e2fsck is clean, and
//!    deleting files makes room again.
//! 3. A full journal under many threads: the smallest journal (1024 blocks) and metadata-heavy
//!    work in shared and private directories, so the log wraps many times and handles wait
//!    for checkpoints; for every preset.
//! 4. An aborted journal records its errno in the journal superblock (`s_errno`), which
//!    dumpe2fs shows and e2fsck and quill's next mount turn into the error state (ERROR_FS).
//!
//! Under errors=continue an image whose recovered superblock records the error may need
//! e2fsck's repairs (an operation cut short commits half done, as in ext4), which must leave
//! it clean.
//!
//! Counts: `QUILL_FAULT_RUNS` (fault positions per case, default 2), `QUILL_FAULT_OPS` (ops
//! per thread, default 80; five times that in the journal test), `QUILL_FAULT_STATES`
//! (flush-boundary and subset states per run, default 3 of each, besides the final media
//! state), `QUILL_SEED` replays a run's choices (thread timing still varies).

mod common;

use std::collections::{BTreeMap, HashSet};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use blockdev::fault::{Fault, FaultDevice, FaultOn};
use blockdev::memory::MemDevice;
use blockdev::recording::{CrashKind, CrashOptions, CrashState, RecordingDevice};
use blockdev::{BlockDevice, DeviceError, Write};
use common::{
    bytes_from, create_fsynced, dumpe2fs_field, dumpe2fs_header, e2fsck, e2fsck_fix, env_count,
    have, head, mkfs, read_all, run_watched, seed, superblock_state, unexpected_fsck_lines, Rng,
    Scratch,
};
use fs::error::errno;
use fs::{ErrorPolicy, Filesystem, FsError, MountOptions, RenameFlags, SetMode, ROOT_INO};
use journal::config::PRESETS;
use journal::JournalConfig;
use parking_lot::Mutex;

const WATCHDOG: Duration = Duration::from_secs(60);

fn have_tools(test: &str) -> bool {
    have("mkfs.ext4", test) && have("e2fsck", test)
}

/// Nonzero random bytes: a zero or stale byte never passes for written data.
fn nonzero_bytes(rng: &mut Rng, len: usize) -> Vec<u8> {
    (0..len).map(|_| (rng.next() as u8) | 1).collect()
}

/// Every entry of directory `dir` but `.` and `..`, as (name, inode).
fn entries(fs: &Filesystem, dir: u32) -> Result<Vec<(String, u32)>, FsError> {
    let mut out = Vec::new();
    let mut cookie = 0;
    loop {
        let got = fs.readdir(dir, cookie, 64)?;
        let Some(last) = got.last() else { return Ok(out) };
        cookie = last.next_cookie;
        for e in got {
            if e.name != b"." && e.name != b".." {
                out.push((String::from_utf8_lossy(&e.name).into_owned(), e.ino));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Device errors during a multi-threaded workload

const THREADS: usize = 4;
const IMAGE_SIZE: &str = "32M";
// One group per flex group: the journal is one extent (with the default, mke2fs splits it
// around the packed inode tables).
const MKFS_OPTIONS: &[&str] = &["-b", "4096", "-G", "1"];

/// One file of a thread's model: what a crash check needs to know about it.
#[derive(Debug, Clone)]
struct FileModel {
    ino: u32,
    /// Its names in its thread's directory, oldest first (each rename appends one).
    names: Vec<String>,
    /// Its contents after each write that may have reached it (versions[0] is empty). The
    /// workload only appends at EOF and overwrites, so sizes never shrink.
    versions: Vec<Vec<u8>>,
    /// Acknowledgements, oldest first: (mark, newest version acknowledged, oldest name the
    /// file may have after a crash that follows it).
    acks: Vec<(u64, usize, usize)>,
    /// A write or rename on it failed: its state is uncertain (the failed call may have
    /// reached the cache or the disk in part), so the workload leaves it alone.
    dead: bool,
}

#[derive(Debug, Default)]
struct ThreadLog {
    files: Vec<FileModel>,
    /// Names whose create failed: such an entry may exist, as an empty file.
    maybe_created: Vec<String>,
    ops: usize,
    /// (what, errno) of every call that failed.
    errors: Vec<(String, i32)>,
    violations: Vec<String>,
}

/// Where the fault goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// Plain writes to the journal area (log blocks; descriptors; revoke blocks).
    JournalWrite,
    /// Plain writes outside the journal (file data, checkpoints of metadata home).
    HomeWrite,
    /// Commit blocks (FUA writes, or plain ones under commit_record = chained).
    CommitWrite,
    Flush,
    Read,
    /// ENOSPC from the device on any write (a thin-provisioned device out of space).
    NoSpaceWrite,
}

/// The first eight bytes of every JBD2 commit block (magic, block type).
fn commit_header() -> Vec<u8> {
    let mut header = ondisk::jbd2::JBD2_MAGIC.to_be_bytes().to_vec();
    header.extend_from_slice(&(ondisk::jbd2::BlockType::Commit as u32).to_be_bytes());
    header
}

impl Target {
    fn fault(self, journal: &Range<u64>, image_bytes: u64) -> Fault {
        match self {
            Target::JournalWrite => Fault::new(FaultOn::Write).in_range(journal.clone()),
            Target::HomeWrite => {
                // Everything but the journal: the journal sits inside the image, so two ranges
                // would be needed; the part after it is the larger and holds file data.
                Fault::new(FaultOn::Write).in_range(journal.end..image_bytes)
            }
            // A FUA write, or a plain one under commit_record = chained: matched by header.
            Target::CommitWrite => Fault::new(FaultOn::AnyWrite)
                .in_range(journal.clone())
                .data_prefix(&commit_header()),
            Target::Flush => Fault::new(FaultOn::Flush),
            Target::Read => Fault::new(FaultOn::Read),
            Target::NoSpaceWrite => Fault::new(FaultOn::AnyWrite).errno(errno::ENOSPC),
        }
    }

    /// The [`CountingDevice`] counter of the ops this target's fault hits.
    fn counter(self) -> &'static str {
        match self {
            Target::JournalWrite => "journal",
            Target::HomeWrite => "home",
            Target::CommitWrite => "commit",
            Target::Flush => "flush",
            Target::Read => "read",
            Target::NoSpaceWrite => "any-write",
        }
    }

    fn errno(self) -> i32 {
        if self == Target::NoSpaceWrite {
            errno::ENOSPC
        } else {
            errno::EIO
        }
    }
}

/// Counts ops of each [`Target`] kind (for a run without faults, to place the faults).
struct CountingDevice {
    inner: Arc<dyn BlockDevice>,
    journal: Range<u64>,
    counts: Mutex<BTreeMap<&'static str, u64>>,
}

impl CountingDevice {
    fn count(&self, what: &'static str) {
        *self.counts.lock().entry(what).or_default() += 1;
    }

    fn count_write(&self, offset: u64, data: &[u8], fua: bool) {
        let len = data.len();
        let in_journal = offset < self.journal.end && self.journal.start < offset + len as u64;
        if in_journal && data.starts_with(&commit_header()) {
            self.count("commit");
        } else if in_journal && !fua {
            self.count("journal");
        } else if !in_journal && offset + len as u64 > self.journal.end {
            self.count("home");
        }
        self.count("any-write");
    }

    fn get(&self, what: &str) -> u64 {
        self.counts.lock().get(what).copied().unwrap_or(0)
    }
}

impl BlockDevice for CountingDevice {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        self.count("read");
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        self.count_write(offset, data, false);
        self.inner.write_at(offset, data)
    }
    fn write_fua_at(&self, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        self.count_write(offset, data, true);
        self.inner.write_fua_at(offset, data)
    }
    fn flush(&self) -> Result<(), DeviceError> {
        self.count("flush");
        self.inner.flush()
    }
    fn write_batch(&self, writes: &[Write<'_>]) -> Result<(), DeviceError> {
        for w in writes {
            self.count_write(w.offset, w.data, w.fua);
        }
        self.inner.write_batch(writes)
    }
}

/// The formatted image the fault runs start from, with its thread directories.
struct Formatted {
    image: Vec<u8>,
    /// Byte range of the journal on the device.
    journal: Range<u64>,
    /// Matching ops of each kind in a run without faults, per preset.
    counts: BTreeMap<&'static str, BTreeMap<&'static str, u64>>,
}

fn fault_mount(policy: ErrorPolicy, preset: &str) -> MountOptions {
    MountOptions {
        errors: policy,
        journal: JournalConfig::preset(preset).unwrap(),
        // Small caches, so metadata is read again during the run (read faults hit it).
        inode_cache_max: 32,
        metadata_cache_bytes: 64 * 4096,
        ..MountOptions::default()
    }
}

fn ops_per_thread() -> usize {
    env_count("QUILL_FAULT_OPS", 80)
}

/// mkfs.ext4 once per test binary, the thread directories, and a run without faults per preset
/// whose op counts place the faults.
fn formatted() -> &'static Formatted {
    static FORMATTED: OnceLock<Formatted> = OnceLock::new();
    FORMATTED.get_or_init(|| {
        let scratch = Scratch::new("faults-mkfs");
        let path = scratch.path("fs.img");
        mkfs(&path, IMAGE_SIZE, MKFS_OPTIONS);
        let dev = Arc::new(MemDevice::from_bytes(std::fs::read(&path).unwrap()));
        let image = fs::Ext4Image::open(dev.clone() as Arc<dyn BlockDevice>).unwrap();
        let location = image.journal_location().unwrap();
        drop(image);
        let bs = u64::from(location.block_size());
        let last = location.len_blocks() - 1;
        let start = location.device_offset(0).unwrap();
        let end = location.device_offset(last).unwrap() + bs;
        assert_eq!(end - start, u64::from(last + 1) * bs, "mkfs.ext4 made a contiguous journal");
        let fs = Filesystem::open(dev.clone(), MountOptions::default()).unwrap();
        for t in 0..THREADS {
            fs.mkdir(ROOT_INO, format!("t{t}").as_bytes(), 0o755, 0, 0).unwrap();
        }
        fs.unmount().unwrap();
        let image = dev.snapshot();
        let counts = PRESETS.iter().map(|&p| (p, count_ops(&image, start..end, p))).collect();
        Formatted { image, journal: start..end, counts }
    })
}

/// The ops of each [`Target`] kind in a run of the workload without faults under `preset`.
fn count_ops(image: &[u8], journal: Range<u64>, preset: &str) -> BTreeMap<&'static str, u64> {
    let counting = Arc::new(CountingDevice {
        inner: Arc::new(MemDevice::from_bytes(image.to_vec())),
        journal,
        counts: Mutex::new(BTreeMap::new()),
    });
    let options = fault_mount(ErrorPolicy::RemountReadOnly, preset);
    let fs = Arc::new(Filesystem::open(counting.clone(), options).unwrap());
    let before: BTreeMap<_, _> = counting.counts.lock().clone();
    let dirs = thread_dirs(&fs);
    let shared = fs.clone();
    let logs = run_watched(THREADS, WATCHDOG, move |t| {
        fault_workload(&shared, t, dirs[t], 1, ops_per_thread(), &[], &|_| {})
    });
    for log in &logs {
        assert!(log.errors.is_empty(), "{preset}: a run without faults failed: {:?}", log.errors);
    }
    let counts = ["journal", "home", "commit", "flush", "read", "any-write"]
        .into_iter()
        .map(|k| (k, counting.get(k) - before.get(k).copied().unwrap_or(0)))
        .collect();
    Arc::try_unwrap(fs).unwrap().unmount().unwrap();
    println!("{preset}: a run without faults: {counts:?}");
    counts
}

fn thread_dirs(fs: &Filesystem) -> Vec<u32> {
    (0..THREADS).map(|t| fs.resolve(&format!("/t{t}")).unwrap()).collect()
}

/// A write length: small, about a block, or up to ten blocks.
fn random_len(rng: &mut Rng, bs: u64) -> usize {
    match rng.below(3) {
        0 => 1 + rng.below(200) as usize,
        1 => (bs - 3 + rng.below(7)) as usize,
        _ => 1 + rng.below(10 * bs) as usize,
    }
}

/// One thread's share of the fault workload, in its own directory `dir`. `allowed` are the
/// errnos a failing call may report (empty: none may fail); `mark(n)` labels the recording
/// right after an fsync returned.
fn fault_workload(
    fs: &Filesystem,
    thread: usize,
    dir: u32,
    seed: u64,
    ops: usize,
    allowed: &[i32],
    mark: &dyn Fn(u64),
) -> ThreadLog {
    static NEXT_MARK: AtomicU64 = AtomicU64::new(1);
    let mut rng = Rng::for_thread(seed, thread);
    let bs = u64::from(fs.block_size());
    let mut log = ThreadLog::default();
    let mut next_name = 0;
    for _ in 0..ops {
        let live: Vec<usize> = (0..log.files.len()).filter(|&i| !log.files[i].dead).collect();
        let read_only_before = fs.is_read_only();
        log.ops += 1;
        let (what, result): (String, Result<(), FsError>) = if live.len() < 2 || rng.chance(10) {
            let name = format!("f{next_name}");
            next_name += 1;
            let result = match fs.create(dir, name.as_bytes(), 0o644, 0, 0) {
                Ok(attr) => {
                    log.files.push(FileModel {
                        ino: attr.ino,
                        names: vec![name.clone()],
                        versions: vec![Vec::new()],
                        acks: Vec::new(),
                        dead: false,
                    });
                    Ok(())
                }
                Err(e) => {
                    log.maybe_created.push(name.clone());
                    Err(e)
                }
            };
            (format!("create {name}"), result)
        } else {
            let file = &mut log.files[live[rng.below(live.len() as u64) as usize]];
            let current = file.versions.last().unwrap().clone();
            let name = file.names.last().unwrap().clone();
            match rng.below(20) {
                op @ 0..=11 => {
                    // Append, or overwrite (possibly past EOF) when there is something.
                    let len = random_len(&mut rng, bs);
                    let offset = if op < 6 || current.is_empty() {
                        current.len()
                    } else {
                        rng.below(current.len() as u64) as usize
                    };
                    let bytes = nonzero_bytes(&mut rng, len);
                    let result = fs.write(file.ino, offset as u64, &bytes);
                    let taken = match &result {
                        Ok(n) => *n,
                        Err(_) => len,
                    };
                    let mut next = current;
                    if next.len() < offset + taken {
                        next.resize(offset + taken, 0);
                    }
                    next[offset..offset + taken].copy_from_slice(&bytes[..taken]);
                    file.versions.push(next);
                    file.dead |= result.is_err();
                    (format!("write {len} at {offset} to {name}"), result.map(|_| ()))
                }
                12..=17 => {
                    let datasync = rng.chance(2);
                    let result = fs.fsync(file.ino, datasync);
                    if result.is_ok() {
                        let n = NEXT_MARK.fetch_add(1, Ordering::Relaxed);
                        mark(n);
                        let floor = file.acks.last().map_or(0, |a| a.2);
                        let floor = if datasync { floor } else { file.names.len() - 1 };
                        file.acks.push((n, file.versions.len() - 1, floor));
                    }
                    let what = if datasync { "fdatasync" } else { "fsync" };
                    (format!("{what} {name}"), result)
                }
                _ => {
                    let new = format!("f{next_name}");
                    next_name += 1;
                    let result = fs.rename(
                        dir,
                        name.as_bytes(),
                        dir,
                        new.as_bytes(),
                        RenameFlags::default(),
                    );
                    file.names.push(new.clone());
                    file.dead |= result.is_err();
                    (format!("rename {name} to {new}"), result)
                }
            }
        };
        match &result {
            Ok(()) if read_only_before => log
                .violations
                .push(format!("{what} returned Ok after the file system turned read-only")),
            Ok(()) => {}
            Err(e) => {
                let n = e.errno();
                if !allowed.contains(&n) {
                    log.violations.push(format!("{what}: unexpected error {e} (errno {n})"));
                }
                log.errors.push((what, n));
            }
        }
    }
    log
}

/// Checks one recovered file system against the threads' logs; `marks` are the
/// acknowledgements made before the crash (`None`: all of them).
fn check_tree(
    fs: &Filesystem,
    logs: &[ThreadLog],
    marks: Option<&HashSet<u64>>,
) -> Result<usize, String> {
    let mut acked_checked = 0;
    for (t, log) in logs.iter().enumerate() {
        let dir = fs.resolve(&format!("/t{t}")).map_err(|e| format!("/t{t}: {e}"))?;
        let listed = entries(fs, dir).map_err(|e| format!("readdir /t{t}: {e}"))?;
        let mut seen = HashSet::new();
        for (name, ino) in &listed {
            let path = format!("/t{t}/{name}");
            if !seen.insert(*ino) {
                return Err(format!("{path}: inode {ino} has two names"));
            }
            match log.files.iter().find(|f| f.ino == *ino) {
                Some(f) if f.names.contains(name) => {}
                Some(f) => return Err(format!("{path}: inode {ino} never had that name {f:?}")),
                None if log.maybe_created.contains(name) => {
                    let data = read_all(fs, *ino).map_err(|e| format!("read {path}: {e}"))?;
                    if !data.is_empty() {
                        return Err(format!("{path}: a failed create left {} bytes", data.len()));
                    }
                }
                None => return Err(format!("{path}: inode {ino} was never created there")),
            }
        }
        for f in &log.files {
            let ack = f.acks.iter().rev().find(|a| marks.is_none_or(|m| m.contains(&a.0)));
            let entry = listed.iter().find(|(_, ino)| *ino == f.ino);
            let Some((name, _)) = entry else {
                if let Some(a) = ack {
                    return Err(format!(
                        "/t{t}/{}: missing (inode {}, fsync acknowledged with mark {})",
                        f.names[a.2], f.ino, a.0
                    ));
                }
                continue;
            };
            let path = format!("/t{t}/{name}");
            let first = ack.map_or(0, |a| a.1);
            if let Some(a) = ack {
                acked_checked += 1;
                if !f.names[a.2..].contains(name) {
                    return Err(format!(
                        "{path}: an older name than {} (fsync acknowledged with mark {})",
                        f.names[a.2], a.0
                    ));
                }
            }
            let data = read_all(fs, f.ino).map_err(|e| format!("read {path}: {e}"))?;
            bytes_from(&data, &f.versions[first..])
                .map_err(|e| format!("{path} (inode {}, acknowledged {ack:?}): {e}", f.ino))?;
        }
    }
    Ok(acked_checked)
}

/// Recovers `image` with quill, checks it, unmounts, and runs `e2fsck -fn`; then stock
/// `e2fsck -fy` on the raw image must need no repair beyond what a crash leaves. Returns how
/// many acknowledged files were checked.
fn check_crash_image(
    image: Vec<u8>,
    logs: &[ThreadLog],
    marks: Option<&HashSet<u64>>,
    (policy, preset): (ErrorPolicy, &str),
    scratch: &Scratch,
) -> Result<usize, String> {
    let raw_path = scratch.path("raw.img");
    std::fs::write(&raw_path, &image).unwrap();
    let dev = Arc::new(MemDevice::from_bytes(image));
    let fs = Filesystem::open(dev.clone(), fault_mount(policy, preset))
        .map_err(|e| format!("quill cannot open the crash image: {e}"))?;
    let checked = check_tree(&fs, logs, marks);
    fs.unmount().map_err(|e| format!("unmount after recovery: {e}"))?;
    let checked = checked?;
    let path = scratch.path("recovered.img");
    let recovered = dev.snapshot();
    // errors=continue lets an operation an error cut short commit half done (as ext4's does),
    // and records the error in s_state (journaled with it) for e2fsck: an image whose
    // recovered superblock has the error may need e2fsck's repairs, which must then leave it
    // clean.
    let state = superblock_state(dev.clone());
    let errors_recorded =
        policy == ErrorPolicy::Continue && state & ondisk::ext4::STATE_ERROR_FS != 0;
    std::fs::write(&path, recovered).unwrap();
    let (code, text) = e2fsck(&path);
    if code != 0 && !errors_recorded {
        return Err(format!(
            "e2fsck -fn after quill's recovery exits {code}:\n{}",
            head(&text, 20)
        ));
    }
    let (code, text) = e2fsck_fix(&raw_path);
    let unexpected = if errors_recorded { Vec::new() } else { unexpected_fsck_lines(&text) };
    if code > 1 || !unexpected.is_empty() {
        return Err(format!(
            "e2fsck -fy on the raw image exits {code}, repairing more than a crash leaves \
             ({}):\n{}",
            unexpected.join(" | "),
            head(&text, 20)
        ));
    }
    let (code, text) = e2fsck(&raw_path);
    if code != 0 {
        return Err(format!("e2fsck -fn after e2fsck -fy exits {code}:\n{}", head(&text, 20)));
    }
    Ok(checked)
}

/// The states a fault run checks: flush boundaries (evenly sampled down to `boundaries`) and
/// a few subsets (all pending writes, none, random ones) near them.
fn pick_states(recording: &RecordingDevice, seed: u64, boundaries: usize) -> Vec<CrashState> {
    let options = CrashOptions {
        subsets_per_gap: 1,
        torn_per_gap: 0,
        seed,
        max_states: None,
        ..Default::default()
    };
    let all = recording.crash_states(&options);
    let (flush, subset): (Vec<_>, Vec<_>) =
        all.into_iter().partition(|s| s.kind == CrashKind::FlushBoundary);
    let mut picked: Vec<CrashState> = Vec::new();
    for list in [flush, subset] {
        let n = list.len();
        let want = boundaries.min(n);
        // The last of each kind always (the newest durable state), the rest spread evenly.
        picked.extend((0..want).map(|i| list[n - 1 - i * n / want.max(1)].clone()));
    }
    picked.sort_by_key(|s| s.crash_at);
    picked.dedup();
    picked
}

#[derive(Debug, Default)]
struct Figures {
    runs: usize,
    fired: usize,
    ops: usize,
    acked: usize,
    states: usize,
    files_checked: usize,
}

/// One fault run: inject `target` after `after` matching ops, run the workload under
/// `preset`, check the policy's promises, crash, and check the chosen crash states.
fn fault_run(
    (target, preset): (Target, &str),
    after: u64,
    policy: ErrorPolicy,
    seed: u64,
    figures: &mut Figures,
) {
    let base = formatted();
    let label = format!("{preset}: {target:?} after {after} ({policy:?}, seed {seed})");
    let scratch = Scratch::new("faults-run");
    let recording = Arc::new(RecordingDevice::new(base.image.clone()));
    let faulty = Arc::new(FaultDevice::new(recording.clone()));
    let fs = Arc::new(Filesystem::open(faulty.clone(), fault_mount(policy, preset)).expect("open"));
    let dirs = thread_dirs(&fs);
    faulty.inject(target.fault(&base.journal, base.image.len() as u64).after(after));
    let allowed = vec![target.errno(), errno::EIO, errno::EROFS];
    let shared = fs.clone();
    let rec = recording.clone();
    let started = Instant::now();
    let logs = run_watched(THREADS, WATCHDOG, move |t| {
        fault_workload(&shared, t, dirs[t], seed, ops_per_thread(), &allowed, &|n| rec.mark(n))
    });
    let elapsed = started.elapsed();
    let fired = faulty.injected_failures() > 0;
    let violations: Vec<&String> = logs.iter().flat_map(|l| &l.violations).collect();
    assert!(violations.is_empty(), "{label}: {violations:#?}");
    let errors: Vec<&(String, i32)> = logs.iter().flat_map(|l| &l.errors).collect();
    let read_only = fs.is_read_only();
    figures.runs += 1;
    figures.ops += logs.iter().map(|l| l.ops).sum::<usize>();
    figures.acked += logs.iter().flat_map(|l| &l.files).map(|f| f.acks.len()).sum::<usize>();
    if fired {
        figures.fired += 1;
        assert!(!errors.is_empty(), "{label}: the fault fired and no caller saw an error");
        match policy {
            ErrorPolicy::RemountReadOnly => {
                // A read error before an operation changed anything (and a flush error of an
                // fsync whose transaction was durable already) fails only its caller, as in
                // ext4; every write error, and any error during a change, is fatal.
                let fatal_needed = !matches!(target, Target::Read | Target::Flush);
                if fatal_needed {
                    assert!(read_only, "{label}: not read-only after {errors:?}");
                }
                if read_only {
                    let err = fs.create(dirs_first(&fs), b"after", 0o644, 0, 0).unwrap_err();
                    assert_eq!(err.errno(), errno::EROFS, "{label}: create after the abort");
                }
            }
            ErrorPolicy::Continue => {}
        }
    }
    let fs = Arc::try_unwrap(fs).expect("the workers are done");
    // A read error is a file-system error only for metadata (ext4_error); one on file data
    // fails its caller alone, so a read fault need not leave a recorded error.
    let error_state = match policy {
        ErrorPolicy::Continue => fired && !read_only && target != Target::Read,
        // The abort's errno reaches the journal superblock when the fault spares it, and the
        // next mount records the error.
        ErrorPolicy::RemountReadOnly => {
            read_only && matches!(target, Target::HomeWrite | Target::Read)
        }
    };
    fs.crash();

    // The final media state (every completed write) and the chosen crash states.
    let mut images: Vec<(String, Vec<u8>, Option<HashSet<u64>>)> =
        vec![("final media state".into(), recording.live_image(), None)];
    for state in pick_states(&recording, seed, env_count("QUILL_FAULT_STATES", 3)) {
        let marks = state.marks.iter().copied().collect();
        images.push((state.describe(), recording.materialize(&state), Some(marks)));
    }
    if error_state {
        // errors=continue: the error is recorded in the superblock, journaled, so a crash
        // keeps it and the next e2fsck checks in full. errors=remount-ro: the journal's
        // s_errno carries it to the next mount.
        let dev = Arc::new(MemDevice::from_bytes(images[0].1.clone()));
        let fs =
            Filesystem::open(dev.clone(), fault_mount(policy, preset)).expect("open after the run");
        fs.unmount().unwrap();
        let state = superblock_state(dev);
        assert!(state & ondisk::ext4::STATE_ERROR_FS != 0, "{label}: s_state {state:#x}");
    }
    let mut failures = Vec::new();
    for (what, image, marks) in images {
        figures.states += 1;
        match check_crash_image(image, &logs, marks.as_ref(), (policy, preset), &scratch) {
            Ok(n) => figures.files_checked += n,
            Err(e) => failures.push(format!("{what}: {e}")),
        }
    }
    println!(
        "{label}: fired {fired}, {} ops in {:.2} s, {} errors (first {:?}), read-only {read_only}, \
         {} fsyncs acknowledged, {} ops recorded",
        logs.iter().map(|l| l.ops).sum::<usize>(),
        elapsed.as_secs_f64(),
        errors.len(),
        errors.first(),
        logs.iter().flat_map(|l| &l.files).map(|f| f.acks.len()).sum::<usize>(),
        recording.ops_len(),
    );
    assert!(failures.is_empty(), "{label}:\n{}", failures.join("\n---\n"));
}

fn dirs_first(fs: &Filesystem) -> u32 {
    fs.resolve("/t0").unwrap()
}

/// Runs `target` under every preset, at `QUILL_FAULT_RUNS` positions spread over the matching
/// ops of the preset's run without faults, under `policy`.
fn fault_case(name: &str, target: Target, policy: ErrorPolicy) {
    if !have_tools(name) {
        return;
    }
    let seed = seed(name);
    let base = formatted();
    let key = target.counter();
    let runs = env_count("QUILL_FAULT_RUNS", 2) as u64;
    let mut rng = Rng::new(seed);
    for preset in PRESETS {
        let started = Instant::now();
        let total = base.counts[preset][key];
        assert!(total >= 4, "{name}, {preset}: only {total} {key} ops in a run without faults");
        let mut figures = Figures::default();
        for i in 0..runs {
            // Spread over the first 70% of the ops (thread timing varies between runs), with
            // a random offset inside each slice.
            let slice = (total * 7 / 10).max(runs) / runs;
            let after = i * slice + rng.below(slice.max(1));
            fault_run((target, preset), after, policy, seed.wrapping_add(i), &mut figures);
        }
        println!("{name}, {preset}: {figures:?} in {:.1} s", started.elapsed().as_secs_f64());
        assert!(figures.fired > 0, "{name}, {preset}: the fault never fired ({figures:?})");
    }
}

#[test]
fn eio_on_a_journal_write_turns_the_file_system_read_only_and_keeps_every_fsync() {
    fault_case("journal_write_eio", Target::JournalWrite, ErrorPolicy::RemountReadOnly);
}

#[test]
fn eio_on_a_data_or_metadata_write_home_turns_the_file_system_read_only() {
    fault_case("home_write_eio", Target::HomeWrite, ErrorPolicy::RemountReadOnly);
}

#[test]
fn eio_on_a_commit_block_write_turns_the_file_system_read_only() {
    fault_case("commit_write_eio", Target::CommitWrite, ErrorPolicy::RemountReadOnly);
}

#[test]
fn eio_on_a_flush_fails_its_caller_and_keeps_every_fsync() {
    fault_case("flush_eio", Target::Flush, ErrorPolicy::RemountReadOnly);
}

#[test]
fn eio_on_a_read_fails_its_caller_and_keeps_every_fsync() {
    fault_case("read_eio", Target::Read, ErrorPolicy::RemountReadOnly);
}

#[test]
fn enospc_from_the_device_turns_the_file_system_read_only() {
    fault_case("device_enospc", Target::NoSpaceWrite, ErrorPolicy::RemountReadOnly);
}

#[test]
fn errors_continue_reports_the_failing_call_and_records_the_error() {
    for (name, target) in [
        ("continue_home_write_eio", Target::HomeWrite),
        ("continue_read_eio", Target::Read),
        ("continue_commit_write_eio", Target::CommitWrite),
    ] {
        fault_case(name, target, ErrorPolicy::Continue);
    }
}

// ---------------------------------------------------------------------------------------------
// 2. A full file system under many threads

const WRITERS: usize = 16;
const CREATORS: usize = 4;

/// A writer thread: appends 64 KiB pieces to its file until the file system is full; every
/// failure must be ENOSPC (a short write counts as the last one). Then fsync must work: the
/// cached data's blocks were reserved when it was written. Returns the file's contents.
fn fill_with_data(fs: &Filesystem, ino: u32, mut contents: Vec<u8>, rng: &mut Rng) -> Vec<u8> {
    loop {
        let bytes = nonzero_bytes(rng, 64 << 10);
        match fs.write(ino, contents.len() as u64, &bytes) {
            Ok(n) => {
                contents.extend_from_slice(&bytes[..n]);
                if n < bytes.len() {
                    break;
                }
            }
            Err(e) => {
                assert_eq!(
                    e.errno(),
                    errno::ENOSPC,
                    "a write failed otherwise: {e} ({:?})",
                    fs.journal().check_aborted()
                );
                break;
            }
        }
    }
    // Another write fails with ENOSPC too, unless other threads' writeback returned blocks
    // they had reserved and did not need (then it is taken, or part of it).
    let bytes = nonzero_bytes(rng, 8192);
    match fs.write(ino, contents.len() as u64, &bytes) {
        Ok(n) => contents.extend_from_slice(&bytes[..n]),
        Err(e) => assert_eq!(e.errno(), errno::ENOSPC, "a write past the fill: {e}"),
    }
    fs.fsync(ino, false).unwrap_or_else(|e| panic!("fsync of inode {ino} after the fill: {e}"));
    contents
}

/// A creator thread: creates empty files in the shared directory until no inode (or no
/// directory block) is left; every failure must be ENOSPC. Returns how many it made.
fn fill_with_inodes(fs: &Filesystem, dir: u32, thread: usize) -> usize {
    let mut made = 0;
    loop {
        match fs.create(dir, format!("c{thread}_{made}").as_bytes(), 0o644, 0, 0) {
            Ok(_) => made += 1,
            Err(e) => {
                assert_eq!(
                    e.errno(),
                    errno::ENOSPC,
                    "create {made} failed otherwise: {e} ({:?})",
                    fs.journal().check_aborted()
                );
                return made;
            }
        }
    }
}

#[test]
fn a_full_file_system_under_many_threads_fails_with_enospc_only_and_makes_room_again() {
    let name = "full_file_system";
    if !have_tools(name) {
        return;
    }
    let started = Instant::now();
    let seed = seed(name);
    let scratch = Scratch::new("faults-full");
    let path = scratch.path("fs.img");
    // 16 MiB of 4 KiB blocks and few inodes, so both run out.
    mkfs(&path, "16M", &["-b", "4096", "-N", "128"]);
    let dev = Arc::new(MemDevice::from_bytes(std::fs::read(&path).unwrap()));
    let options = MountOptions { dirty_bytes_max: 1 << 20, ..MountOptions::default() };
    let fs = Arc::new(Filesystem::open(dev.clone(), options.clone()).unwrap());
    let data_dir = fs.mkdir(ROOT_INO, b"w", 0o755, 0, 0).unwrap().ino;
    let shared_dir = fs.mkdir(ROOT_INO, b"c", 0o755, 0, 0).unwrap().ino;
    // Written before the fill and not yet synced: fsync after the fill must still work.
    let mut rng = Rng::new(seed);
    let mut before = Vec::new();
    for w in 0..WRITERS {
        let ino = fs.create(data_dir, format!("w{w}").as_bytes(), 0o644, 0, 0).unwrap().ino;
        let bytes = nonzero_bytes(&mut rng, 5000 + 1000 * w);
        fs.write(ino, 0, &bytes).unwrap();
        before.push((ino, bytes));
    }
    let shared = fs.clone();
    let starts = before.clone();
    let results = run_watched(WRITERS + CREATORS, WATCHDOG, move |t| {
        let mut rng = Rng::for_thread(seed, t);
        if t < WRITERS {
            let (ino, first) = starts[t].clone();
            (t, fill_with_data(&shared, ino, first, &mut rng), 0)
        } else {
            (t, Vec::new(), fill_with_inodes(&shared, shared_dir, t))
        }
    });
    let created: usize = results.iter().map(|r| r.2).sum();
    let written: usize = results.iter().map(|r| r.1.len()).sum();
    let st = fs.statfs();
    println!(
        "{name}: {written} bytes written by {WRITERS} writers, {created} files by {CREATORS} \
         creators; statfs {st:?}"
    );
    assert!(st.inodes_free == 0 || st.blocks_available < 64, "the file system filled: {st:?}");
    for (t, contents, _) in results.iter().filter(|r| r.0 < WRITERS) {
        let ino = before[*t].0;
        assert!(contents.starts_with(&before[*t].1));
        assert!(read_all(&fs, ino).unwrap() == *contents, "w{t} read back");
    }
    let fs = Arc::try_unwrap(fs).expect("the workers are done");
    fs.unmount().unwrap();
    let image = scratch.path("full.img");
    std::fs::write(&image, dev.snapshot()).unwrap();
    common::assert_fsck_clean(&image);

    // Everything is there after a remount; deleting makes room for writes and creates again.
    let fs = Filesystem::open(dev.clone(), options).unwrap();
    for (t, contents, _) in results.iter().filter(|r| r.0 < WRITERS) {
        let ino = fs.resolve(&format!("/w/w{t}")).unwrap();
        assert!(read_all(&fs, ino).unwrap() == *contents, "w{t} after remount");
    }
    for t in (0..WRITERS).step_by(2) {
        fs.unlink(data_dir, format!("w{t}").as_bytes()).unwrap();
    }
    fs.sync().unwrap();
    // With blocks to spare now, creators from several threads run the inodes out.
    let fs = Arc::new(fs);
    let shared = fs.clone();
    let more = run_watched(CREATORS, WATCHDOG, move |t| {
        (WRITERS + CREATORS + t, 0, fill_with_inodes(&shared, shared_dir, WRITERS + CREATORS + t))
    });
    let st = fs.statfs();
    println!("{name}: {} more files; statfs {st:?}", more.iter().map(|r| r.2).sum::<usize>());
    assert_eq!(st.inodes_free, 0, "the inodes ran out");
    let fs = Arc::try_unwrap(fs).expect("the workers are done");
    let made = results.iter().filter(|r| r.0 >= WRITERS).map(|r| (r.0, r.2));
    for (t, made) in made.chain(more.iter().map(|r| (r.0, r.2))) {
        for k in (0..made).step_by(3) {
            fs.unlink(shared_dir, format!("c{t}_{k}").as_bytes()).unwrap();
        }
    }
    fs.sync().unwrap();
    let ino = fs.create(data_dir, b"after", 0o644, 0, 0).unwrap().ino;
    let bytes = nonzero_bytes(&mut rng, 1 << 20);
    assert_eq!(fs.write(ino, 0, &bytes).unwrap(), bytes.len());
    fs.fsync(ino, false).unwrap();
    assert!(read_all(&fs, ino).unwrap() == bytes);
    fs.unmount().unwrap();
    std::fs::write(&image, dev.snapshot()).unwrap();
    common::assert_fsck_clean(&image);
    println!("{name}: {:.1} s", started.elapsed().as_secs_f64());
}

// ---------------------------------------------------------------------------------------------
// 3. A full journal under many threads

const JOURNAL_THREADS: usize = 16;

/// Errors the metadata workload may meet: names raced away or taken in the shared directory.
fn journal_workload_allows(e: &FsError) -> bool {
    matches!(e, FsError::NotFound | FsError::Exists)
}

/// One thread of metadata-heavy work: creates, xattrs, renames and unlinks in its private
/// directory and in the shared one, with an fsync now and then. Returns (ops, fsyncs).
fn metadata_workload(fs: &Filesystem, thread: usize, seed: u64, ops: usize) -> (usize, usize) {
    let mut rng = Rng::for_thread(seed, thread);
    let private = fs.resolve(&format!("/p{thread}")).unwrap();
    let shared = fs.resolve("/s").unwrap();
    let mut fsyncs = 0;
    let check = |what: &str, r: Result<(), FsError>| {
        if let Err(e) = r {
            assert!(journal_workload_allows(&e), "thread {thread}: {what}: {e}");
        }
    };
    for i in 0..ops {
        let (dir, name) = if rng.chance(2) {
            (private, format!("f{}", rng.below(24)))
        } else {
            (shared, format!("s{}", rng.below(48)))
        };
        match rng.below(10) {
            0..=2 => {
                let r = fs.create(dir, name.as_bytes(), 0o644, 0, 0).map(|a| {
                    let len = 40 + rng.below(200) as usize;
                    let value = nonzero_bytes(&mut rng, len);
                    // The file may be gone again already (the shared directory).
                    let _ = fs.setxattr(a.ino, b"user.q", &value, SetMode::Any);
                    if rng.chance(3) && fs.fsync(a.ino, false).is_ok() {
                        fsyncs += 1;
                    }
                });
                check("create", r);
            }
            3..=4 => {
                let to = if rng.chance(2) { private } else { shared };
                let new = format!("{}{}", if to == private { "f" } else { "s" }, rng.below(48));
                let r = fs.rename(dir, name.as_bytes(), to, new.as_bytes(), RenameFlags::default());
                // A directory never takes part (only files are created), so only races fail.
                check("rename", r);
            }
            5..=6 => check("unlink", fs.unlink(dir, name.as_bytes())),
            7..=8 => {
                if let Ok(a) = fs.lookup(dir, name.as_bytes()) {
                    let len = 1 + rng.below(300) as usize;
                    let value = nonzero_bytes(&mut rng, len);
                    let key = format!("user.k{}", rng.below(4));
                    let r = fs.setxattr(a.ino, key.as_bytes(), &value, SetMode::Any);
                    // ENOSPC: no room left in the inode and the xattr block for this value.
                    if let Err(e) = r {
                        assert!(
                            journal_workload_allows(&e) || matches!(e, FsError::NoSpace),
                            "thread {thread}: setxattr: {e}"
                        );
                    }
                }
            }
            _ => {
                if let Ok(a) = fs.lookup(dir, name.as_bytes()) {
                    match fs.fsync(a.ino, i % 2 == 0) {
                        Ok(()) => fsyncs += 1,
                        Err(e) => assert!(journal_workload_allows(&e), "fsync: {e}"),
                    }
                }
            }
        }
    }
    (ops, fsyncs)
}

/// Every file reachable, read through quill (a walk that must not fail).
fn walk_all(fs: &Filesystem) -> usize {
    let mut count = 0;
    let mut dirs = vec![ROOT_INO];
    while let Some(dir) = dirs.pop() {
        for (name, ino) in entries(fs, dir).unwrap() {
            let attr = fs.getattr(ino).unwrap_or_else(|e| panic!("getattr {name}: {e}"));
            if attr.mode & 0o170000 == 0o040000 {
                dirs.push(ino);
            } else {
                fs.listxattr(ino).unwrap_or_else(|e| panic!("listxattr {name}: {e}"));
            }
            count += 1;
        }
    }
    count
}

fn full_journal(preset: &str) {
    let name = format!("full_journal_{preset}");
    if !have_tools(&name) {
        return;
    }
    let started = Instant::now();
    let seed = seed(&name);
    let scratch = Scratch::new("faults-journal");
    let path = scratch.path("fs.img");
    // The smallest journal mke2fs makes: 1024 blocks of 1 KiB.
    mkfs(&path, "16M", &["-b", "1024", "-J", "size=1"]);
    let dev = Arc::new(MemDevice::from_bytes(std::fs::read(&path).unwrap()));
    let options =
        MountOptions { journal: JournalConfig::preset(preset).unwrap(), ..MountOptions::default() };
    let fs = Filesystem::open(dev.clone(), options.clone()).unwrap();
    let (capacity, _) = fs.journal().log_usage();
    assert!(capacity <= 1024, "{name}: a log of {capacity} blocks");
    fs.mkdir(ROOT_INO, b"s", 0o755, 0, 0).unwrap();
    for t in 0..JOURNAL_THREADS {
        fs.mkdir(ROOT_INO, format!("p{t}").as_bytes(), 0o755, 0, 0).unwrap();
    }
    let ops = env_count("QUILL_FAULT_OPS", 80) * 5;
    let mut figures = Vec::new();
    let mut fs = Arc::new(fs);
    // Twice: the first round ends in a crash and recovery, the second in an unmount.
    for round in 0..2u64 {
        let shared = fs.clone();
        let results = run_watched(JOURNAL_THREADS, WATCHDOG, move |t| {
            metadata_workload(&shared, t, seed.wrapping_add(round), ops)
        });
        let stats = fs.journal().stats();
        figures.push(format!(
            "round {round}: {} ops, {} fsyncs; {} transactions, {} log blocks written \
             ({:.1} times the log), {} checkpoints, {} handle starts waited for log space",
            results.iter().map(|r| r.0).sum::<usize>(),
            results.iter().map(|r| r.1).sum::<usize>(),
            stats.transactions,
            stats.log_blocks_written,
            stats.log_blocks_written as f64 / f64::from(capacity),
            stats.checkpoints,
            stats.space_waits,
        ));
        assert!(
            stats.log_blocks_written > 2 * u64::from(capacity),
            "{name}: the log did not wrap: {}",
            figures.last().unwrap()
        );
        let done = Arc::try_unwrap(fs).expect("the workers are done");
        if round == 0 {
            done.crash();
            let recovered = Filesystem::open(dev.clone(), options.clone())
                .unwrap_or_else(|e| panic!("{name}: recovery after the crash: {e}"));
            walk_all(&recovered);
            recovered.unmount().unwrap();
            let image = scratch.path("recovered.img");
            std::fs::write(&image, dev.snapshot()).unwrap();
            common::assert_fsck_clean(&image);
            fs = Arc::new(Filesystem::open(dev.clone(), options.clone()).unwrap());
        } else {
            let files = walk_all(&done);
            done.unmount().unwrap();
            let image = scratch.path("unmounted.img");
            std::fs::write(&image, dev.snapshot()).unwrap();
            common::assert_fsck_clean(&image);
            figures.push(format!("{files} paths at unmount"));
            break;
        }
    }
    println!("{name}: {} in {:.1} s", figures.join("; "), started.elapsed().as_secs_f64());
}

#[test]
fn a_full_journal_under_many_threads_wraps_without_deadlock_under_every_preset() {
    for preset in PRESETS {
        full_journal(preset);
    }
}

/// An abort's errno reaches the journal superblock (JBD2's `s_errno`, which dumpe2fs shows
/// and e2fsck and the kernel turn into the error state); quill's next mount turns it into
/// ERROR_FS too, then forgets it, and everything fsynced before the abort is there.
#[test]
fn an_aborted_journal_marks_the_file_system_with_errors_at_the_next_mount() {
    if !have_tools("aborted journal errno") || !have("dumpe2fs", "aborted journal errno") {
        return;
    }
    let scratch = Scratch::new("faults-errno");
    let image = scratch.path("fs.img");
    mkfs(&image, "16M", &[]);
    {
        let fs = Filesystem::open(common::open_device(&image), MountOptions::default()).unwrap();
        create_fsynced(&fs, b"kept", b"acknowledged");
        // What errors=remount-ro does on an I/O error in the middle of an operation.
        fs.journal().abort("an injected file-system error".into(), errno::EIO);
        assert_eq!(fs.create(ROOT_INO, b"late", 0o644, 0, 0).unwrap_err().errno(), errno::EROFS);
        fs.crash();
    }
    let dump = dumpe2fs_header(&image);
    assert_eq!(dumpe2fs_field(&dump, "Journal errno"), "-5", "{dump}");
    assert!(!dumpe2fs_field(&dump, "Filesystem state").contains("with errors"), "{dump}");

    // Stock e2fsck, on a copy, reads quill's errno as it reads the kernel's.
    let copy = scratch.path("copy.img");
    std::fs::copy(&image, &copy).unwrap();
    let (code, text) = e2fsck_fix(&copy);
    assert!(code <= 1, "e2fsck -fy exits {code}:\n{text}");
    assert!(!dumpe2fs_header(&copy).contains("Journal errno:"), "e2fsck clears s_errno");

    let dev = common::open_device(&image);
    let fs = Filesystem::open(dev.clone(), MountOptions::default()).unwrap();
    let on_disk = superblock_state(dev.clone());
    assert!(on_disk & ondisk::ext4::STATE_ERROR_FS != 0, "s_state {on_disk:#x} after mount");
    let ino = fs.lookup(ROOT_INO, b"kept").unwrap().ino;
    assert_eq!(read_all(&fs, ino).unwrap(), b"acknowledged");
    assert!(fs.lookup(ROOT_INO, b"late").is_err());
    fs.unmount().unwrap();
    drop(dev);
    let dump = dumpe2fs_header(&image);
    assert!(!dump.contains("Journal errno:"), "the mount took the errno over:\n{dump}");
    assert_eq!(dumpe2fs_field(&dump, "Filesystem state"), "clean with errors", "{dump}");
    let (code, text) = e2fsck(&image);
    assert_eq!(code, 0, "e2fsck -fn:\n{text}");
}
