//! The explorer: generates workloads, records each, derives its crash states, checks every
//! crash image, counts, and turns a failure into a minimal reproducer.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use blockdev::memory::MemDevice;
use blockdev::recording::{CrashKind, CrashOptions, CrashState, RecordedOp, TornWrite};
use fs::{Filesystem, MountOptions};
use ondisk::ext4;
use parking_lot::Mutex;

use crate::check::{
    check_acknowledged, check_fsynced_intact, e2fsck_clean, e2fsck_repairs,
    e2fsck_repairs_without_journal, fast_commit_state, FastCommitState, FsyncPromise,
    Unacknowledged::WholeVersions,
};
use crate::run::{record, Recording};
use crate::tree::{read_tree, tree_difference};
use crate::workload::{ace, mailbox, threaded, Config, Op, Workload};

/// How much to explore.
#[derive(Debug, Clone)]
pub struct Options {
    /// Stop starting workloads once this many crash images have been checked.
    pub images: u64,
    pub seed: u64,
    /// Worker threads, each checking one workload at a time.
    pub jobs: usize,
    /// Every n-th workload is a threaded one (0: none).
    pub threaded_every: usize,
    /// Every n-th of the single-threaded workloads is a [`mailbox`] one (0: none).
    pub mailbox_every: usize,
    pub threads: usize,
    pub threaded_length: usize,
    /// Crash states per workload at most (flush boundaries first); None: all.
    pub max_states: Option<usize>,
    pub crash: CrashOptions,
    /// Configurations the workloads rotate through.
    pub configs: Vec<Config>,
    /// Where reproducers are written.
    pub out: PathBuf,
    /// Stop after this many failing workloads (`usize::MAX`: never).
    pub max_failures: usize,
    /// Every n-th crash image of a workload with `fsync_journal` is also recovered by a kernel
    /// loop mount (0: none; needs root and loop devices, see [`crate::kernel_fc::unavailable`]).
    pub kernel_mount_every: u64,
    /// Every n-th workload runs on an ext3 image (`image=ext3`; 0: none; needs mkfs.ext3, see
    /// [`crate::run::ext3_available`]).
    pub ext3_every: usize,
    /// Every n-th workload runs on an ext2 image (`image=ext2`, no journal; 0: none; needs
    /// mkfs.ext2, see [`crate::run::ext2_available`]). Where it falls on an ext3 workload,
    /// ext2 wins.
    pub ext2_every: usize,
    /// Every n-th workload runs on an inline_data image (`image=inline`, quill's mkfs with
    /// inline_data and ea_inode: small files and directories live in their inodes, moving
    /// out as they grow, and xattrs past one block in inodes of their own; 0: none). Where it
    /// falls on an ext2 or ext3 workload, those win.
    pub inline_every: usize,
    /// Every n-th workload runs on a quota image (`image=quota`, quill's mkfs with quota and
    /// project: every change of blocks or inodes is charged in the quota files, which
    /// e2fsck checks on every crash image; 0: none). The earlier kinds win where they fall.
    pub quota_every: usize,
    /// Every n-th workload runs on a bigalloc image (`image=bigalloc`, made by mkfs.ext4 with
    /// 4-block clusters: files own whole clusters, partly mapped ones kept until their last
    /// block goes; 0: none; needs mkfs.ext4, see [`crate::run::bigalloc_available`]). The
    /// earlier kinds win where they fall.
    pub bigalloc_every: usize,
}

impl Options {
    /// CI's size: about 1,000 crash images.
    pub fn standard(seed: u64) -> Options {
        Options {
            images: 1000,
            seed,
            jobs: std::thread::available_parallelism().map_or(2, |n| n.get()),
            threaded_every: 8,
            mailbox_every: 8,
            threads: 3,
            threaded_length: 6,
            max_states: Some(120),
            crash: CrashOptions {
                subsets_per_gap: 6,
                torn_per_gap: 3,
                seed,
                max_states: None,
                exhaustive_up_to: 10,
                orderings: true,
            },
            configs: default_configs(),
            out: PathBuf::from("crashtest-out"),
            max_failures: 3,
            kernel_mount_every: 0,
            ext3_every: 0,
            ext2_every: 0,
            inline_every: 0,
            quota_every: 0,
            bigalloc_every: 0,
        }
    }
}

/// Every journal preset of `journal::config::PRESETS` (a preset added there joins the rotation
/// on its own), and CJFS as the paper runs it on a device with a cache barrier (the recording
/// device has one), and iJournaling with per-core areas; ordered and journalled data; a page
/// cache that holds the whole workload or one that writes back every few blocks.
pub fn default_configs() -> Vec<Config> {
    let mut out = Vec::new();
    let variants = ["cjfs,commit_record=barrier", "ijournal,fc_areas=2"];
    let specs = journal::config::PRESETS.iter().copied().chain(variants);
    for dirty_kib in [64 * 1024, 16] {
        for data in ["ordered", "journal"] {
            for preset in specs.clone() {
                let config = Config {
                    preset: preset.to_string(),
                    data: data.into(),
                    dirty_kib,
                    ..Config::default()
                };
                out.push(config);
            }
        }
    }
    out
}

/// The seed of workload `k` of a run seeded `seed`.
pub fn workload_seed(seed: u64, k: usize) -> u64 {
    seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (k as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93)
}

/// The kinds of workload the explorer runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkloadKind {
    /// [`ace`]: ACE's small file set, 1 to 3 operations.
    Ace,
    /// [`threaded`]: several threads of longer random sequences.
    Threaded,
    /// [`mailbox`]: varmail's deletes and creates in one large directory.
    Mailbox,
}

/// Which kind workload `k` is, and which configuration it takes: every `threaded_every`-th
/// workload is threaded, and every `mailbox_every`-th of the others a mailbox. Each kind
/// rotates through every configuration in turn: one rotation over `k` would give a kind taken
/// every n-th time only the configurations `k mod len` reaches when `len` is a multiple of n.
pub fn rotation(opts: &Options, k: usize) -> (WorkloadKind, usize) {
    let len = opts.configs.len();
    let every = opts.threaded_every;
    if every > 0 && k % every == every - 1 {
        return (WorkloadKind::Threaded, (k / every) % len);
    }
    // The index of `k` among the single-threaded workloads.
    let single = k - k.checked_div(every).unwrap_or(0);
    let m = opts.mailbox_every;
    if m > 0 && single % m == m - 1 {
        return (WorkloadKind::Mailbox, (single / m) % len);
    }
    let ace = single - single.checked_div(m).unwrap_or(0);
    (WorkloadKind::Ace, ace % len)
}

/// Workload `k` of a run seeded `opts.seed`.
pub fn workload(opts: &Options, k: usize) -> Workload {
    let seed = workload_seed(opts.seed, k);
    let (kind, config) = rotation(opts, k);
    let mut config = opts.configs[config].clone();
    let every = |n: usize| n > 0 && k % n == n - 1;
    let ext2 = every(opts.ext2_every);
    let indirect = ext2 || every(opts.ext3_every);
    if ext2 {
        // No journal: data goes home like the metadata, in order (data=journal needs one).
        config.image = "ext2".into();
        config.data = "ordered".into();
    } else if indirect {
        config.image = "ext3".into();
    } else if every(opts.inline_every) {
        config.image = "inline".into();
    } else if every(opts.quota_every) {
        config.image = "quota".into();
    } else if every(opts.bigalloc_every) {
        config.image = "bigalloc".into();
    }
    let mut w = match kind {
        WorkloadKind::Threaded => threaded(seed, opts.threads, opts.threaded_length, config),
        WorkloadKind::Mailbox => mailbox(seed, config),
        WorkloadKind::Ace => ace(seed, config),
    };
    if indirect {
        // ext4_fallocate refuses to preallocate in an indirect-mapped file (EOPNOTSUPP), and
        // the vocabulary has no punch: a write of the same range takes each fallocate's place.
        for op in w.setup.iter_mut().chain(w.threads.iter_mut().flatten()) {
            if let Op::Falloc { path, offset, len, .. } = op {
                *op = Op::Write { path: std::mem::take(path), offset: *offset, len: *len };
            }
        }
    }
    w
}

/// One failed check.
#[derive(Debug, Clone)]
pub struct Failure {
    pub workload: Workload,
    /// None when the workload itself failed (an operation the model allows returned an error).
    pub state: Option<CrashState>,
    pub check: &'static str,
    pub message: String,
    /// [`fingerprint`] of the recording the crash state belongs to (None when the workload
    /// itself failed).
    pub recording: Option<String>,
}

impl Failure {
    /// The reproducer file's text: the workload, the crash state, and what failed; with
    /// `with_recording`, also the recording's fingerprint (which `--replay` compares).
    pub fn reproducer(&self, with_recording: bool) -> String {
        let mut out = "# quill crashtest reproducer: `quill crashtest --replay FILE`\n".to_string();
        out += &format!("# failed check: {}\n", self.check);
        for line in self.message.lines().take(12) {
            out += &format!("#   {line}\n");
        }
        if let Some(recording) = self.recording.as_ref().filter(|_| with_recording) {
            out += &format!("# recording: {recording}\n");
        }
        out += &self.workload.to_text();
        if let Some(state) = &self.state {
            out += &format!("{}\n", state_line(state));
        }
        out
    }
}

/// The numbers a run reports.
#[derive(Debug, Default, Clone)]
pub struct Totals {
    pub workloads: u64,
    pub threaded_workloads: u64,
    pub mailbox_workloads: u64,
    pub operations: u64,
    pub images: u64,
    /// Crash images checked, by journal preset (`preset@ext3` for ext3 images).
    pub images_by_preset: BTreeMap<String, u64>,
    pub kinds: BTreeMap<String, u64>,
    /// Checks passed, by name.
    pub passed: BTreeMap<&'static str, u64>,
    /// Crash states left out because they tear the primary superblock (see [`explore_workload`]).
    pub torn_superblock_skipped: u64,
    /// Outcomes that are neither passes nor failures, by name (crate::kernel_fc's refusals
    /// and e2fsck's differing replays), and a line about each.
    pub noted: BTreeMap<&'static str, u64>,
    pub notes: Vec<String>,
    pub failures: Vec<Failure>,
    pub seconds: f64,
}

impl Totals {
    /// Adds `other`'s counts, notes and failures (not its time).
    pub fn add(&mut self, other: Totals) {
        self.workloads += other.workloads;
        self.threaded_workloads += other.threaded_workloads;
        self.mailbox_workloads += other.mailbox_workloads;
        self.operations += other.operations;
        self.images += other.images;
        for (k, v) in other.images_by_preset {
            *self.images_by_preset.entry(k).or_default() += v;
        }
        for (k, v) in other.kinds {
            *self.kinds.entry(k).or_default() += v;
        }
        for (k, v) in other.passed {
            *self.passed.entry(k).or_default() += v;
        }
        self.torn_superblock_skipped += other.torn_superblock_skipped;
        for (k, v) in other.noted {
            *self.noted.entry(k).or_default() += v;
        }
        self.notes.extend(other.notes);
        self.failures.extend(other.failures);
    }

    pub fn checks(&self) -> u64 {
        self.passed.values().sum()
    }

    pub fn summary(&self) -> String {
        let kinds: Vec<String> = self.kinds.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let passed: Vec<String> = self.passed.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let noted: Vec<String> = self.noted.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let noted = if noted.is_empty() {
            String::new()
        } else {
            format!("; noted ({})", noted.join(", "))
        };
        let presets: Vec<String> =
            self.images_by_preset.iter().map(|(k, v)| format!("{k} {v}")).collect();
        format!(
            "{} workloads ({} threaded, {} mailbox), {} operations; {} crash images ({}; by preset: {}); {} \
             checks passed ({}){noted}; {} failed; {:.1} s ({} states with a torn primary \
             superblock left out)",
            self.workloads,
            self.threaded_workloads,
            self.mailbox_workloads,
            self.operations,
            self.images,
            kinds.join(", "),
            presets.join(", "),
            self.checks(),
            passed.join(", "),
            self.failures.len(),
            self.seconds,
            self.torn_superblock_skipped
        )
    }
}

/// A short account of a recording, to tell whether a replay recorded the same I/O.
pub fn fingerprint(rec: &Recording) -> String {
    let ops = rec.device.ops();
    let writes = ops.iter().filter(|o| matches!(o, RecordedOp::Write { .. })).count();
    let flushes = ops.iter().filter(|o| matches!(o, RecordedOp::Flush { .. })).count();
    format!("{} ops, {writes} writes, {flushes} flushes", ops.len())
}

/// `crash at=N kind=K applied=a,b,c torn=OP:s1,s2` ([`parse_state_line`] reads it).
pub fn state_line(s: &CrashState) -> String {
    let list = |v: &[usize]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",");
    let mut out = format!("crash at={} kind={:?} applied={}", s.crash_at, s.kind, list(&s.applied));
    if let Some(t) = &s.torn {
        let sectors: Vec<String> = t.sectors.iter().map(|x| x.to_string()).collect();
        out += &format!(" torn={}:{}", t.op_index, sectors.join(","));
    }
    out
}

/// The crash state of a reproducer's `crash` line, against recording `rec`.
pub fn parse_state_line(line: &str, rec: &Recording) -> Result<CrashState, String> {
    let bad = |why: &str| format!("crash line {line:?}: {why}");
    let list = |v: &str| -> Result<Vec<usize>, String> {
        v.split(',')
            .filter(|x| !x.is_empty())
            .map(|x| x.parse().map_err(|_| bad("bad number")))
            .collect()
    };
    let (mut crash_at, mut kind, mut applied, mut torn) = (0, CrashKind::Subset, Vec::new(), None);
    for word in line.split_whitespace().skip(1) {
        match word.split_once('=') {
            Some(("at", v)) => crash_at = v.parse().map_err(|_| bad("bad at"))?,
            Some(("kind", v)) => {
                kind = match v {
                    "FlushBoundary" => CrashKind::FlushBoundary,
                    "Subset" => CrashKind::Subset,
                    "Torn" => CrashKind::Torn,
                    _ => return Err(bad("unknown kind")),
                }
            }
            Some(("applied", v)) => applied = list(v)?,
            Some(("torn", v)) => {
                let (op, sectors) = v.split_once(':').ok_or_else(|| bad("torn=OP:SECTORS"))?;
                let op_index = op.parse().map_err(|_| bad("bad torn op"))?;
                torn = Some(TornWrite {
                    op_index,
                    sectors: list(sectors)?.into_iter().map(|s| s as u32).collect(),
                });
            }
            _ => return Err(bad(&format!("unknown word {word:?}"))),
        }
    }
    rec.device.crash_state(crash_at, kind, applied, torn).map_err(|e| bad(&e))
}

/// Whether `state` tears a write covering the primary superblock (bytes 1024..2048): out of
/// the crash model (see [`states_of`]).
pub fn tears_primary_superblock(ops: &[RecordedOp], state: &CrashState) -> bool {
    let Some(torn) = &state.torn else { return false };
    match &ops[torn.op_index] {
        RecordedOp::Write { offset, data, .. } => {
            let superblock =
                ext4::SUPERBLOCK_OFFSET..ext4::SUPERBLOCK_OFFSET + ext4::SUPERBLOCK_SIZE as u64;
            *offset < superblock.end && offset + data.len() as u64 > superblock.start
        }
        _ => false,
    }
}

/// Keeps every flush boundary (when they fit in `max`) and spreads the rest evenly.
fn pick_states(all: Vec<CrashState>, max: Option<usize>) -> Vec<CrashState> {
    let Some(max) = max else { return all };
    if all.len() <= max {
        return all;
    }
    let (boundaries, others): (Vec<_>, Vec<_>) =
        all.into_iter().partition(|s| s.kind == CrashKind::FlushBoundary);
    let spread = |v: Vec<CrashState>, n: usize| -> Vec<CrashState> {
        let len = v.len();
        if len <= n {
            return v;
        }
        (0..n).map(|i| v[i * len / n].clone()).collect()
    };
    let mut keep = spread(boundaries, max / 2);
    let room = max - keep.len();
    keep.extend(spread(others, room));
    keep.sort_by_key(|s| s.crash_at);
    keep
}

/// A scratch directory for e2fsck's image copies (in /dev/shm when there is one).
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        static N: AtomicUsize = AtomicUsize::new(0);
        let base = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir = base.join(format!("quill-crashtest-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the crash-test scratch directory");
        Scratch(dir)
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs every check on one crash image; counts the ones passed into `passed`. With
/// `QUILL_CRASHTEST_KEEP=DIR`, the raw image of every state that fails a check is kept in DIR
/// (`crash-N.img`, its path printed) for e2fsck, debugfs or a loop mount.
/// With `kernel`, the kernel's recovery (a loop mount) is checked too: see
/// [`check_kernel_mount`].
pub fn check_state(
    w: &Workload,
    rec: &Recording,
    state: &CrashState,
    scratch: &Scratch,
    passed: &mut BTreeMap<&'static str, u64>,
    kernel: bool,
) -> Result<(), (&'static str, String)> {
    let Some(dir) = std::env::var_os("QUILL_CRASHTEST_KEEP") else {
        let image = rec.device.materialize(state);
        return check_state_here(w, rec, state, scratch, passed, image, kernel);
    };
    static KEPT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = KEPT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let kept = Path::new(&dir).join(format!("crash-{n}.img"));
    let image = rec.device.materialize(state);
    let _ = std::fs::write(&kept, &image);
    let result = check_state_here(w, rec, state, scratch, passed, image, kernel);
    match &result {
        Ok(()) => drop(std::fs::remove_file(&kept)),
        Err((check, _)) => eprintln!("kept the raw image failing {check}: {}", kept.display()),
    }
    result
}

fn check_state_here(
    w: &Workload,
    rec: &Recording,
    state: &CrashState,
    scratch: &Scratch,
    passed: &mut BTreeMap<&'static str, u64>,
    image: Vec<u8>,
    kernel: bool,
) -> Result<(), (&'static str, String)> {
    if w.config.image == "ext2" {
        return check_state_without_journal(w, rec, state, scratch, passed, image);
    }
    let mut pass = |name: &'static str| *passed.entry(name).or_default() += 1;
    // The raw crash image goes to e2fsck later; write it now so quill can take the buffer.
    let raw = scratch.path("raw.img");
    std::fs::write(&raw, &image).map_err(|e| ("e2fsck-fy", e.to_string()))?;
    let dev = Arc::new(MemDevice::from_bytes(image));
    // What e2fsck will find in the fast-commit area, judged before quill recovers the image.
    let fast_commits = fast_commit_state(dev.clone());
    let fs = Filesystem::open(dev.clone(), rec.mount.clone())
        .map_err(|e| ("quill-recovers", format!("quill cannot open the crash image: {e}")))?;
    let tree = read_tree(&fs).map_err(|e| ("quill-recovers", e))?;
    pass("quill-recovers");
    // With fsync_journal an fsync may be a fast commit: the file alone (check.rs).
    let promise = if rec.mount.journal.fsync_journal {
        FsyncPromise::PerFile
    } else {
        FsyncPromise::Transaction
    };
    let acknowledged =
        check_acknowledged(w, &rec.expected, &state.marks, &tree, WholeVersions, promise);
    let unmounted = fs.unmount();
    acknowledged.map_err(|e| ("acknowledged", e))?;
    pass("acknowledged");
    unmounted.map_err(|e| ("unmount", format!("unmount after recovery: {e}")))?;
    pass("unmount");
    let recovered = scratch.path("recovered.img");
    std::fs::write(&recovered, dev.snapshot()).map_err(|e| ("e2fsck-fn", e.to_string()))?;
    e2fsck_clean(&recovered).map_err(|e| ("e2fsck-fn", format!("after quill's recovery: {e}")))?;
    pass("e2fsck-fn");
    if kernel && fast_commits.state == FastCommitState::QuillAreas {
        kernel_refuses(scratch, &raw).map_err(|e| ("kernel-mount", e))?;
        pass("kernel-refused-per-core-fc-areas");
    } else if kernel {
        check_kernel_mount(w, rec, state, scratch, &raw, &tree)?.into_iter().for_each(&mut pass);
    }
    let repairs =
        e2fsck_repairs(&raw, state.torn.is_some(), &fast_commits).map_err(|e| ("e2fsck-fy", e))?;
    if let Some(known_bug) = repairs.gave_up {
        // e2fsck 1.47.0's bug, not the image's (check.rs): quill's recovery was checked above.
        pass(known_bug);
        return Ok(());
    }
    pass(if repairs.miscounted_dirs {
        "e2fsck-fy-but-1.47.0-miscounted-dirs"
    } else if !repairs.unlinked_cleared.is_empty() {
        "e2fsck-fy-cleared-fast-commit-unlinked-inodes"
    } else if !repairs.value_inodes_leaked.is_empty() {
        "e2fsck-fy-but-1.47.0-leaked-orphans-value-inodes"
    } else {
        "e2fsck-fy"
    });
    let repaired = std::fs::read(&raw).map_err(|e| ("same-tree", e.to_string()))?;
    let mut their_tree = read_only_tree(repaired, &rec.mount).map_err(|e| ("same-tree", e))?;
    // e2fsck 1.47.0 drops the xattr block of the orphans it truncates (Repairs), keeping the
    // xattrs stored in the inode: compare the rest.
    let mut orphan_xattrs = false;
    for (path, node) in their_tree.iter_mut() {
        if !repairs.orphan_xattrs_dropped.contains(&node.ino) {
            continue;
        }
        let Some(ours) = tree.get(path).filter(|n| n.ino == node.ino) else { continue };
        let kept_in_inode =
            node.xattrs.iter().all(|(name, value)| ours.xattrs.get(name) == Some(value));
        if kept_in_inode && node.xattrs.len() < ours.xattrs.len() {
            node.xattrs = ours.xattrs.clone();
            orphan_xattrs = true;
        }
    }
    // e2fsck 1.47.0 grows a bigalloc orphan's i_size back over the blocks its truncation
    // left in the last cluster (Repairs::orphans_regrown): compare what the file had.
    let mut orphans_regrown = false;
    for node in their_tree.values_mut() {
        let Some(&(_, size)) = repairs.orphans_regrown.iter().find(|(ino, _)| *ino == node.ino)
        else {
            continue;
        };
        if node.size > size && node.data.len() as u64 > size {
            node.size = size;
            node.data.truncate(size as usize);
            orphans_regrown = true;
        }
    }
    // e2fsck's recovery must keep what was acknowledged too, unless it dropped a torn commit
    // and, finding errors, left the orphans to its full check (see check::e2fsck_repairs).
    if !repairs.dropped_torn_commit {
        check_acknowledged(w, &rec.expected, &state.marks, &their_tree, WholeVersions, promise)
            .map_err(|e| ("same-tree", format!("e2fsck's recovery: {e}")))?;
    }
    match tree_difference(&tree, &their_tree) {
        None if orphan_xattrs => pass("same-tree-but-e2fsck-dropped-orphan-xattrs"),
        None if orphans_regrown => pass("same-tree-but-e2fsck-1.47.0-regrew-bigalloc-orphans"),
        None => pass("same-tree"),
        // A commit block whose tail (past its header) was lost: quill replays the transaction,
        // as Linux does since 6.6 (jbd2_commit_block_csum_verify_partial); e2fsck 1.47.0
        // does not. Both trees are legal (checked above); the run counts these.
        Some(_) if repairs.dropped_torn_commit => pass("same-tree-but-torn-commit"),
        Some(d) => {
            let why = format!("quill's recovery and e2fsck's differ (quill vs e2fsck): {d}");
            return Err(("same-tree", why));
        }
    }
    Ok(())
}

/// The checks of a crash image without a journal (ext2): `e2fsck -fy` repairs it to an image
/// `e2fsck -fn` finds clean (**e2fsck-fy-repairs**); quill reads the whole repaired tree
/// (**quill-reads-repaired**); every file a persistence point made durable and nothing changed
/// since is there, whole (**fsynced-intact**, `check::check_fsynced_intact`). That is what
/// ext2 promises across a crash; the journal's stronger checks (each operation all or
/// nothing, the acknowledged prefix) do not apply.
fn check_state_without_journal(
    w: &Workload,
    rec: &Recording,
    state: &CrashState,
    scratch: &Scratch,
    passed: &mut BTreeMap<&'static str, u64>,
    image: Vec<u8>,
) -> Result<(), (&'static str, String)> {
    let mut pass = |name: &'static str| *passed.entry(name).or_default() += 1;
    let raw = scratch.path("raw.img");
    std::fs::write(&raw, &image).map_err(|e| ("e2fsck-fy-repairs", e.to_string()))?;
    e2fsck_repairs_without_journal(&raw).map_err(|e| ("e2fsck-fy-repairs", e))?;
    pass("e2fsck-fy-repairs");
    let repaired = std::fs::read(&raw).map_err(|e| ("quill-reads-repaired", e.to_string()))?;
    let tree = read_only_tree(repaired, &rec.mount).map_err(|e| ("quill-reads-repaired", e))?;
    pass("quill-reads-repaired");
    check_fsynced_intact(w, &rec.expected, &state.marks, &tree)
        .map_err(|e| ("fsynced-intact", e))?;
    pass("fsynced-intact");
    Ok(())
}

/// The kernel's recovery of the crash image (a loop mount, which replays the log and the fast
/// commits, then an unmount) must reach quill's tree, keep what was acknowledged, and leave an
/// image `e2fsck -fn` finds clean. Counted as kernel-mount (the mount and unmount),
/// kernel-mount-e2fsck-fn and kernel-mount-same-tree.
fn check_kernel_mount(
    w: &Workload,
    rec: &Recording,
    state: &CrashState,
    scratch: &Scratch,
    raw: &Path,
    ours: &crate::tree::Tree,
) -> Result<[&'static str; 3], (&'static str, String)> {
    let copy = scratch.path("kernel.img");
    std::fs::copy(raw, &copy).map_err(|e| ("kernel-mount", e.to_string()))?;
    let mount = crate::kernel_fc::Mount::new(&copy, scratch.path("kernel-mnt"))
        .map_err(|e| ("kernel-mount", format!("the kernel cannot mount the crash image: {e}")))?;
    mount.unmount().map_err(|e| ("kernel-mount", e))?;
    e2fsck_clean(&copy)
        .map_err(|e| ("kernel-mount-e2fsck-fn", format!("after the kernel's recovery: {e}")))?;
    let recovered = std::fs::read(&copy).map_err(|e| ("kernel-mount-same-tree", e.to_string()))?;
    let theirs =
        read_only_tree(recovered, &rec.mount).map_err(|e| ("kernel-mount-same-tree", e))?;
    let promise = FsyncPromise::PerFile;
    check_acknowledged(w, &rec.expected, &state.marks, &theirs, WholeVersions, promise)
        .map_err(|e| ("kernel-mount-same-tree", format!("the kernel's recovery: {e}")))?;
    if let Some(d) = tree_difference(ours, &theirs) {
        let why = format!("quill's recovery and the kernel's differ (quill vs kernel): {d}");
        return Err(("kernel-mount-same-tree", why));
    }
    Ok(["kernel-mount", "kernel-mount-e2fsck-fn", "kernel-mount-same-tree"])
}

/// The kernel must refuse to mount a crash image whose journal has quill's per-core
/// fast-commit areas (INCOMPAT_QUILL_FC_AREAS), as `jbd2_journal_load` refuses unknown
/// incompatible features, rather than replay the log without them.
fn kernel_refuses(scratch: &Scratch, raw: &Path) -> Result<(), String> {
    let copy = scratch.path("kernel.img");
    std::fs::copy(raw, &copy).map_err(|e| e.to_string())?;
    match crate::kernel_fc::Mount::new(&copy, scratch.path("kernel-mnt")) {
        Ok(mount) => {
            mount.unmount()?;
            Err("the kernel mounted a journal with per-core fast-commit areas".into())
        }
        Err(_) => Ok(()),
    }
}

/// The tree of `image` read by quill read-only.
pub fn read_only_tree(image: Vec<u8>, mount: &MountOptions) -> Result<crate::tree::Tree, String> {
    let options = MountOptions { read_only: true, ..mount.clone() };
    let fs = Filesystem::open(Arc::new(MemDevice::from_bytes(image)), options)
        .map_err(|e| format!("quill cannot open the image e2fsck repaired: {e}"))?;
    let tree = read_tree(&fs)?;
    fs.unmount().map_err(|e| format!("read-only unmount: {e}"))?;
    Ok(tree)
}

/// The crash states of a recording the explorer checks.
pub fn states_of(rec: &Recording, opts: &Options) -> (Vec<CrashState>, u64) {
    let ops = rec.device.ops();
    let mut all = rec.device.crash_states(&opts.crash);
    let generated = all.len();
    // Out of the model: the primary superblock torn between its two sectors. ext4 and quill
    // both write it outside the journal and rely on a 4 KiB sector not tearing; a torn one
    // fails its checksum and only e2fsck's backups help.
    all.retain(|s| !tears_primary_superblock(&ops, s));
    let skipped = (generated - all.len()) as u64;
    (pick_states(all, opts.max_states), skipped)
}

/// Records `w` and checks its crash states; stops at the first failure.
pub fn explore_workload(w: &Workload, opts: &Options, scratch: &Scratch) -> Totals {
    let mut totals = Totals { workloads: 1, operations: w.ops() as u64, ..Totals::default() };
    if w.threads.len() > 1 {
        totals.threaded_workloads = 1;
    }
    if w.name.starts_with("mailbox-") {
        totals.mailbox_workloads = 1;
    }
    let recorded = record(w).and_then(|rec| match rec.failures.first() {
        Some(e) => Err(e.clone()),
        None => Ok(rec),
    });
    let rec = match recorded {
        Ok(rec) => rec,
        Err(message) => {
            let check = "workload-runs";
            let failure =
                Failure { workload: w.clone(), state: None, check, message, recording: None };
            totals.failures.push(failure);
            return totals;
        }
    };
    let (mut states, skipped) = states_of(&rec, opts);
    if w.config.image == "ext2" {
        // Without a journal the promise holds for whole-block writes only: a sector torn
        // inside a directory block an htree split repacks can lose a name the block keeps
        // (crash_no_journal.rs, the README).
        states.retain(|s| s.torn.is_none());
    }
    totals.torn_superblock_skipped = skipped;
    for state in states {
        totals.images += 1;
        // ext3 and ext2 images count apart: `ijournal@ext3`.
        let preset = match w.config.image.as_str() {
            "ext4" => w.config.preset.clone(),
            image => format!("{}@{image}", w.config.preset),
        };
        *totals.images_by_preset.entry(preset).or_default() += 1;
        *totals.kinds.entry(format!("{:?}", state.kind)).or_default() += 1;
        // A kernel without CONFIG_QUOTA (as CI's) mounts a quota image read-only only.
        let kernel = rec.mount.journal.fsync_journal
            && w.config.image != "quota"
            && opts.kernel_mount_every > 0
            && totals.images % opts.kernel_mount_every == 1 % opts.kernel_mount_every;
        let checked = check_state(w, &rec, &state, scratch, &mut totals.passed, kernel);
        if let Err((check, message)) = checked {
            let message = format!("{}\n{message}", state.describe());
            totals.failures.push(Failure {
                workload: w.clone(),
                state: Some(state),
                check,
                message,
                recording: Some(fingerprint(&rec)),
            });
            break;
        }
    }
    totals
}

/// Shrinks a failing workload: drops operations one at a time (keeping the workload valid)
/// while the same check still fails in one of its first 400 crash states; at most `budget`
/// re-runs and about three minutes.
pub fn minimize(failure: &Failure, opts: &Options, scratch: &Scratch, budget: usize) -> Failure {
    let started = Instant::now();
    let shrink_opts = Options { max_states: Some(400), ..opts.clone() };
    let mut best = failure.clone();
    let mut runs = 0;
    let mut progress = true;
    while progress && runs < budget && started.elapsed().as_secs() < 180 {
        progress = false;
        let w = best.workload.clone();
        let mut candidates: Vec<Workload> = Vec::new();
        for t in 0..w.threads.len() {
            for i in (0..w.threads[t].len()).rev() {
                let mut c = w.clone();
                c.threads[t].remove(i);
                candidates.push(c);
            }
        }
        for i in (0..w.setup.len()).rev() {
            let mut c = w.clone();
            c.setup.remove(i);
            candidates.push(c);
        }
        for c in candidates {
            if runs >= budget || started.elapsed().as_secs() >= 180 {
                break;
            }
            if crate::run::model_states(&c).is_err() {
                continue;
            }
            runs += 1;
            let t = explore_workload(&c, &shrink_opts, scratch);
            if let Some(f) = t.failures.into_iter().find(|f| f.check == failure.check) {
                best = f;
                progress = true;
                break;
            }
        }
    }
    best
}

/// Progress reports from [`explore`].
pub trait Progress: Sync {
    fn images(&self, _checked: u64, _target: u64) {}
    fn failure(&self, _f: &Failure) {}
}

impl Progress for () {}

/// How many workloads give every journal preset of `opts.configs` one at least: the rotation
/// hands configurations out in turn, but a run that reaches its image count early (workloads
/// with many crash states) would otherwise leave the last presets of the list out (seen in
/// CI: ten workloads, no `cjfs,commit_record=barrier`).
pub fn workloads_covering_presets(opts: &Options) -> usize {
    let mut missing: BTreeSet<&str> = opts.configs.iter().map(|c| c.preset.as_str()).collect();
    let limit = 64 * opts.configs.len().max(1);
    let mut k = 0;
    while !missing.is_empty() && k < limit {
        missing.remove(opts.configs[rotation(opts, k).1].preset.as_str());
        k += 1;
    }
    k
}

/// Runs workloads on `opts.jobs` threads until `opts.images` crash images are checked and
/// every journal preset had a workload ([`workloads_covering_presets`]), or
/// `opts.max_failures` workloads failed. Failures are minimized and their reproducers
/// written to `opts.out`.
pub fn explore(opts: &Options, progress: &dyn Progress) -> Totals {
    let started = Instant::now();
    // `--images 0` runs no workload at all (the kernel's fast-commit images alone).
    let covering = if opts.images == 0 { 0 } else { workloads_covering_presets(opts) };
    let next = AtomicUsize::new(0);
    let images = AtomicU64::new(0);
    let failed = AtomicUsize::new(0);
    let totals = Mutex::new(Totals::default());
    std::thread::scope(|s| {
        for job in 0..opts.jobs.max(1) {
            let (next, images, failed, totals) = (&next, &images, &failed, &totals);
            s.spawn(move || {
                let scratch = Scratch::new(&format!("job{job}"));
                while (images.load(Ordering::Relaxed) < opts.images
                    || next.load(Ordering::Relaxed) < covering)
                    && failed.load(Ordering::Relaxed) < opts.max_failures
                {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let w = workload(opts, k);
                    let mut t = explore_workload(&w, opts, &scratch);
                    let checked = images.fetch_add(t.images, Ordering::Relaxed) + t.images;
                    progress.images(checked, opts.images);
                    if !t.failures.is_empty() {
                        failed.fetch_add(1, Ordering::Relaxed);
                        t.failures =
                            t.failures.iter().map(|f| minimize(f, opts, &scratch, 60)).collect();
                        for f in &t.failures {
                            progress.failure(f);
                        }
                    }
                    totals.lock().add(t);
                }
            });
        }
    });
    let mut totals = totals.into_inner();
    totals.seconds = started.elapsed().as_secs_f64();
    totals
}

/// Writes every failure's reproducer under `dir`; returns the paths.
pub fn write_reproducers(failures: &[Failure], dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut paths = Vec::new();
    for (i, f) in failures.iter().enumerate() {
        let path = dir.join(format!("repro-{}-{i}.txt", f.workload.seed));
        std::fs::write(&path, f.reproducer(true))?;
        paths.push(path);
    }
    Ok(paths)
}

/// Replays a reproducer: records its workload again and checks its crash state (or, without a
/// `crash` line, all the workload's states). Returns what happened, and whether all passed.
pub fn replay(text: &str, opts: &Options) -> Result<(String, bool), String> {
    let w = Workload::parse(text)?;
    let scratch = Scratch::new("replay");
    let rec = record(&w)?;
    let mut out = w.to_text();
    let recorded = fingerprint(&rec);
    out += &format!("recorded: {recorded}\n");
    out += &op_log(&rec);
    if let Some(line) = text.lines().find(|l| l.trim_start().starts_with("# recording: ")) {
        let was = line.trim_start().trim_start_matches("# recording: ");
        if was != recorded {
            out += &format!("warning: the reproducer was recorded with {was}; the crash state may name other writes\n");
        }
    }
    if let Some(e) = rec.failures.first() {
        out += &format!("FAIL workload-runs: {e}\n");
        return Ok((out, false));
    }
    let states = match text.lines().find(|l| l.trim_start().starts_with("crash ")) {
        Some(line) => vec![parse_state_line(line.trim(), &rec)?],
        None => states_of(&rec, opts).0,
    };
    let mut passed = BTreeMap::new();
    let mut ok = true;
    for state in &states {
        let kernel = rec.mount.journal.fsync_journal && opts.kernel_mount_every > 0;
        if let Err((check, message)) = check_state(&w, &rec, state, &scratch, &mut passed, kernel) {
            out += &format!("FAIL {check}: {}\n{message}\n", state_line(state));
            ok = false;
        }
    }
    let counts: Vec<String> = passed.iter().map(|(k, v)| format!("{k} {v}")).collect();
    out += &format!("{} crash images; checks passed: {}\n", states.len(), counts.join(", "));
    Ok((out, ok))
}

/// The recording's op log, one line per op (what a crash line's numbers refer to).
pub fn op_log(rec: &Recording) -> String {
    let mut out = String::new();
    for (i, op) in rec.device.ops().iter().enumerate() {
        let line = match op {
            RecordedOp::Write { offset, data, fua, seq } => {
                let fua = if *fua { " FUA" } else { "" };
                let block = offset / u64::from(crate::run::BLOCK_SIZE);
                format!("write #{seq} block {block} (+{}) {} bytes{fua}", offset % 4096, data.len())
            }
            RecordedOp::Flush { covers } => format!("flush covering writes #0..#{covers}"),
            RecordedOp::Barrier => {
                "barrier: the next write is ordered after every earlier one".to_string()
            }
            RecordedOp::Mark(label) => {
                let (t, k, end) = crate::run::decode_mark(*label);
                format!("mark: thread {t} op {k} {}", if end { "returned" } else { "starts" })
            }
        };
        out += &format!("  op {i}: {line}\n");
    }
    out
}
