//! Crash tests through the file system: each scenario runs on a [`RecordingDevice`] over an
//! image made by mkfs.ext4 and notes, with a mark, every persistence point it reached (an
//! fsync, fdatasync or sync that returned). Then every crash state the recording allows
//! (every flush boundary, plus sampled subsets, reorderings and torn sectors of the writes in
//! flight) is materialized and
//! - opened with quill, which replays the journal and processes the orphan list;
//! - checked against what the newest acknowledged persistence point promised (and against the
//!   operations that may have reached the disk after it, and nothing else);
//! - unmounted, and found clean by `e2fsck -fn`;
//! - for every 10th state, the raw crash image is also repaired by stock `e2fsck -fy`, which
//!   must reach the same tree as quill's recovery.
//!
//! The checks rely only on what fsync, fdatasync and sync acknowledged: data that was written
//! but not made durable may or may not be there (and a write in place may be torn), but never
//! stale data inside `i_size`, never a lost acknowledged change, never a leaked inode.
//!
//! `QUILL_CRASH_STATES=n` changes the number of states per scenario (default 240); QUILL_SEED
//! replays the sampling of a failing run (the recording itself depends on thread timing).

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockdev::memory::MemDevice;
use blockdev::recording::{CrashKind, CrashOptions, CrashState, RecordingDevice};
use common::{
    create_fsynced, dumpe2fs_field, dumpe2fs_header, e2fsck, e2fsck_preen, have, mkfs, read_all,
    seed, Scratch,
};
use fs::{DataMode, Filesystem, MountOptions, RenameFlags, SetAttr, ROOT_INO};

// ---------------------------------------------------------------------------------------------
// Trees: read through quill as quill crashtest reads them (names, kinds, modes, sizes,
// contents, link counts, inode numbers, xattrs).

use crashtest::explore::tears_primary_superblock;
use crashtest::tree::{read_tree as tree_of, tree_difference, Node, Tree};

// ---------------------------------------------------------------------------------------------
// Expectations

/// Recognisable non-zero bytes: a stale or zeroed byte never passes for one of them.
fn pattern(tag: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| 1 + ((i * 31 + usize::from(tag) * 101 + (i >> 12) * 7) % 251) as u8).collect()
}

fn file<'t>(tree: &'t Tree, path: &str) -> Result<Option<&'t Node>, String> {
    match tree.get(path) {
        None => Ok(None),
        Some(n) if n.kind == 'f' => Ok(Some(n)),
        Some(n) => Err(format!("{path} is of kind {} instead of a regular file", n.kind)),
    }
}

fn describe_mismatch(path: &str, got: &[u8], want: &[u8]) -> String {
    let first = got.iter().zip(want).position(|(a, b)| a != b);
    format!(
        "{path}: {} bytes, expected {} bytes; first differing byte {first:?}",
        got.len(),
        want.len()
    )
}

/// `path` is a regular file holding exactly `want`.
fn exact(tree: &Tree, path: &str, want: &[u8]) -> Result<(), String> {
    match file(tree, path)? {
        None => Err(format!("{path} is missing (acknowledged durable)")),
        Some(n) if n.data == want => Ok(()),
        Some(n) => Err(describe_mismatch(path, &n.data, want)),
    }
}

/// `path` is missing, or holds a prefix of `want` (not-yet-durable creation and write: never
/// bytes that were not written).
fn absent_or_prefix(tree: &Tree, path: &str, want: &[u8]) -> Result<(), String> {
    match file(tree, path)? {
        Some(n) if n.data.len() > want.len() || n.data[..] != want[..n.data.len()] => {
            Err(format!("{path} (not yet durable): {}", describe_mismatch(path, &n.data, want)))
        }
        _ => Ok(()),
    }
}

/// `path` holds exactly one of `candidates` (all or nothing: a rename target).
fn one_of(tree: &Tree, path: &str, candidates: &[&[u8]]) -> Result<usize, String> {
    let Some(n) = file(tree, path)? else {
        return Err(format!("{path} is missing; expected one of {} versions", candidates.len()));
    };
    candidates.iter().position(|c| n.data == *c).ok_or_else(|| {
        let sizes: Vec<usize> = candidates.iter().map(|c| c.len()).collect();
        format!("{path}: {} bytes matching none of the versions (sizes {sizes:?})", n.data.len())
    })
}

/// The file has the size of one of `candidates`, and every byte inside that size is the byte
/// some candidate long enough has there (an in-place write may land in part, torn at any
/// sector, but no byte is stale or zero unless some version has it so).
fn bytes_from(tree: &Tree, path: &str, candidates: &[&[u8]]) -> Result<(), String> {
    let Some(n) = file(tree, path)? else {
        return Err(format!("{path} is missing"));
    };
    let sizes: Vec<usize> = candidates.iter().map(|c| c.len()).collect();
    if !sizes.contains(&n.data.len()) {
        return Err(format!("{path}: size {} is none of {sizes:?}", n.data.len()));
    }
    for (i, b) in n.data.iter().enumerate() {
        if !candidates.iter().any(|c| c.get(i) == Some(b)) {
            return Err(format!(
                "{path} (size {}): byte {i} is {b:#x}, which no version has there",
                n.data.len()
            ));
        }
    }
    Ok(())
}

fn is_dir(tree: &Tree, path: &str) -> Result<(), String> {
    match tree.get(path) {
        Some(n) if n.kind == 'd' => Ok(()),
        Some(n) => Err(format!("{path} is of kind {} instead of a directory", n.kind)),
        None => Err(format!("directory {path} is missing (acknowledged durable)")),
    }
}

/// Nothing but `allowed` (and their parents' entries) exists.
fn only(tree: &Tree, allowed: &[&str]) -> Result<(), String> {
    match tree.keys().find(|p| !allowed.contains(&p.as_str())) {
        Some(p) => Err(format!("unexpected path {p}")),
        None => Ok(()),
    }
}

// ---------------------------------------------------------------------------------------------
// The harness

/// What a check gets: the recovered file system, its tree, and the newest acknowledged
/// persistence point (0 before the first).
type Check<'a> = dyn Fn(&Filesystem, &Tree, u64) -> Result<(), String> + 'a;

/// The recorded operations; `ack(n)` right after persistence point `n` (1, 2, ...) returned.
type Workload<'a> = dyn Fn(&Filesystem, &dyn Fn(u64)) + 'a;

struct Scenario<'a> {
    name: &'a str,
    mkfs: &'a [&'a str],
    size: &'a str,
    mount: MountOptions,
    /// Runs on the fresh image before recording starts; its result is the initial image.
    setup: &'a dyn Fn(&Filesystem),
    workload: &'a Workload<'a>,
    check: &'a Check<'a>,
    /// Crash states to check (all flush boundaries are kept if they fit).
    states: usize,
}

#[derive(Debug, Default)]
struct Outcome {
    images: usize,
    kinds: BTreeMap<String, usize>,
    fsck_fy: usize,
    /// Of those, how many found orphans to process (crashes inside unlink or truncate).
    fsck_orphans: usize,
    failures: Vec<String>,
}

impl Outcome {
    fn assert_clean(&self, name: &str) {
        if self.failures.is_empty() {
            return;
        }
        let shown: Vec<&String> = self.failures.iter().take(4).collect();
        panic!(
            "{name}: {} of {} crash images failed; the first {}:\n{}",
            self.failures.len(),
            self.images,
            shown.len(),
            shown.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n---\n")
        );
    }
}

fn states_wanted(default: usize) -> usize {
    common::env_count("QUILL_CRASH_STATES", default)
}

fn have_tools(test: &str) -> bool {
    have("mkfs.ext4", test) && have("e2fsck", test)
}

fn mount_options(data: DataMode) -> MountOptions {
    MountOptions { data, ..MountOptions::default() }
}

/// Keeps every flush boundary (when they fit in `max`) and spreads the rest of the budget
/// evenly over the other states.
fn pick_states(all: Vec<CrashState>, max: usize) -> Vec<CrashState> {
    let (boundaries, others): (Vec<_>, Vec<_>) =
        all.into_iter().partition(|s| s.kind == CrashKind::FlushBoundary);
    let mut keep = if boundaries.len() > max / 2 {
        let n = boundaries.len();
        (0..max / 2).map(|i| boundaries[i * n / (max / 2)].clone()).collect()
    } else {
        boundaries
    };
    let room = max.saturating_sub(keep.len());
    let n = others.len();
    if n <= room {
        keep.extend(others);
    } else {
        keep.extend((0..room).map(|i| others[i * n / room].clone()));
    }
    keep.sort_by_key(|s| s.crash_at);
    keep
}

/// Runs the scenario and checks the crash states it picks.
fn explore(s: &Scenario<'_>, seed: u64) -> Outcome {
    let started = Instant::now();
    let scratch = Scratch::new(&format!("crash-{}", s.name));
    let formatted = scratch.path("mkfs.img");
    mkfs(&formatted, s.size, s.mkfs);
    let initial = {
        let dev = Arc::new(MemDevice::from_bytes(std::fs::read(&formatted).unwrap()));
        let fs = Filesystem::open(dev.clone(), s.mount.clone()).expect("open the fresh image");
        (s.setup)(&fs);
        fs.unmount().expect("unmount after setup");
        dev.snapshot()
    };
    let recording = Arc::new(RecordingDevice::new(initial));
    let fs = Filesystem::open(recording.clone(), s.mount.clone()).expect("open for recording");
    (s.workload)(&fs, &|n| recording.mark(n));
    fs.crash();

    let options = CrashOptions {
        subsets_per_gap: 10,
        torn_per_gap: 5,
        seed,
        max_states: None,
        ..CrashOptions::default()
    };
    let mut all = recording.crash_states(&options);
    let generated = all.len();
    // Out of the model: the primary superblock torn between its two sectors. ext4 and quill
    // both write it outside the journal at mount and rely on it not tearing (a 4 KiB atomic
    // sector); a torn one fails its checksum, and only e2fsck's backup superblocks help.
    let ops = recording.ops();
    all.retain(|state| !tears_primary_superblock(&ops, state));
    let torn_superblock = generated - all.len();
    let states = pick_states(all, s.states);
    let mut out = Outcome::default();
    let recovered_path = scratch.path("recovered.img");
    let raw_path = scratch.path("raw.img");
    for (i, state) in states.iter().enumerate() {
        *out.kinds.entry(format!("{:?}", state.kind)).or_default() += 1;
        out.images += 1;
        let image = recording.materialize(state);
        let raw = (i % 10 == 0).then(|| image.clone());
        let context = || format!("{} seed {seed}: {}", s.name, state.describe());
        let ack = state.marks.iter().copied().max().unwrap_or(0);
        let quill_tree = match recover_and_check(s, image, ack, &recovered_path) {
            Ok(tree) => tree,
            Err(e) => {
                out.failures.push(format!("{}\n{e}", context()));
                continue;
            }
        };
        if let Some(raw) = raw {
            out.fsck_fy += 1;
            match e2fsck_repairs_to(&raw, &raw_path, &quill_tree, &s.mount) {
                Ok(orphans) => out.fsck_orphans += usize::from(orphans),
                Err(e) => out
                    .failures
                    .push(format!("{} (raw image repaired by e2fsck -fy)\n{e}", context())),
            }
        }
    }
    println!(
        "{}: {} crash images checked ({:?}) of {generated} generated from {} ops; e2fsck -fy \
         compared on {} ({} with orphans); {} failures; {:.1} s ({torn_superblock} states with a torn primary \
         superblock left out)",
        s.name,
        out.images,
        out.kinds,
        ops.len(),
        out.fsck_fy,
        out.fsck_orphans,
        out.failures.len(),
        started.elapsed().as_secs_f64()
    );
    out
}

/// Opens a crash image with quill, checks it, unmounts it and runs `e2fsck -fn`; returns the
/// tree quill recovered.
fn recover_and_check(
    s: &Scenario<'_>,
    image: Vec<u8>,
    ack: u64,
    path: &Path,
) -> Result<Tree, String> {
    let dev = Arc::new(MemDevice::from_bytes(image));
    let fs = Filesystem::open(dev.clone(), s.mount.clone())
        .map_err(|e| format!("quill cannot open the crash image: {e}"))?;
    let tree = tree_of(&fs)?;
    let checked = (s.check)(&fs, &tree, ack).map_err(|e| format!("acknowledged point {ack}: {e}"));
    fs.unmount().map_err(|e| format!("unmount after recovery: {e}"))?;
    checked?;
    std::fs::write(path, dev.snapshot()).unwrap();
    let (code, text) = e2fsck(path);
    if code != 0 {
        return Err(format!("e2fsck -fn after quill's recovery exits {code}:\n{}", head(&text)));
    }
    Ok(tree)
}

fn head(text: &str) -> String {
    common::head(text, 20)
}

/// Stock `e2fsck -fy` repairs a copy of the raw crash image: it must only replay the journal,
/// process orphans and fix the superblock's counts, leave the image clean, and reach the tree
/// quill's recovery reached. Returns whether e2fsck processed orphans.
fn e2fsck_repairs_to(
    raw: &[u8],
    path: &Path,
    quill_tree: &Tree,
    mount: &MountOptions,
) -> Result<bool, String> {
    std::fs::write(path, raw).unwrap();
    let (code, text) = common::e2fsck_fix(path);
    let orphans = text.contains("orphaned inode");
    if code > 1 {
        return Err(format!("e2fsck -fy exits {code}:\n{}", head(&text)));
    }
    let unexpected = common::unexpected_fsck_lines(&text);
    if !unexpected.is_empty() {
        return Err(format!(
            "e2fsck -fy had to repair more than a crash leaves ({}):\n{}",
            unexpected.join(" | "),
            head(&text)
        ));
    }
    let (code, text) = e2fsck(path);
    if code != 0 {
        return Err(format!("e2fsck -fn after e2fsck -fy exits {code}:\n{}", head(&text)));
    }
    let dev = Arc::new(MemDevice::from_bytes(std::fs::read(path).unwrap()));
    let options = MountOptions { read_only: true, ..mount.clone() };
    let fs = Filesystem::open(dev, options)
        .map_err(|e| format!("quill cannot open the image e2fsck repaired: {e}"))?;
    let tree = tree_of(&fs)?;
    fs.unmount().map_err(|e| format!("read-only unmount: {e}"))?;
    match tree_difference(quill_tree, &tree) {
        None => Ok(orphans),
        Some(d) => Err(format!("quill's recovery and e2fsck's differ (quill vs e2fsck): {d}")),
    }
}

fn inodes_used(fs: &Filesystem) -> u64 {
    let st = fs.statfs();
    st.inodes - st.inodes_free
}

/// A shared cell the workload fills and the check reads (inode numbers, counts).
#[derive(Default)]
struct Noted(std::sync::Mutex<BTreeMap<&'static str, u64>>);

impl Noted {
    fn set(&self, key: &'static str, value: u64) {
        self.0.lock().unwrap().insert(key, value);
    }
    fn get(&self, key: &'static str) -> u64 {
        self.0.lock().unwrap()[key]
    }
}

/// No inode leaked or lost: the inodes in use are those in use before the workload plus one
/// per path (the scenarios make no hard links), so every orphan was released at open.
fn no_leak(fs: &Filesystem, tree: &Tree, base: u64) -> Result<(), String> {
    let used = inodes_used(fs);
    let want = base + tree.len() as u64;
    if used != want {
        return Err(format!(
            "{used} inodes in use for {} paths (expected {want}): an inode leaked",
            tree.len()
        ));
    }
    Ok(())
}

/// Notes the inodes in use besides the tree's paths before the workload, for [`no_leak`].
fn note_base(fs: &Filesystem, noted: &Noted) {
    let paths = tree_of(fs).expect("tree before the workload").len() as u64;
    noted.set("base", inodes_used(fs) - paths);
}

fn run(s: &Scenario<'_>) -> Option<Outcome> {
    if !have_tools(s.name) {
        return None;
    }
    let seed = seed(s.name);
    Some(explore(s, seed))
}

// ---------------------------------------------------------------------------------------------
// Scenario: fsync of a new file makes its directory entry durable

const FSYNC_NEW_PATHS: &[&str] = &["A", "A/new", "A/later", "B", "B/new2", "C", "C/D", "C/D/new3"];

/// Creates files and fsyncs (or fdatasyncs) only the files, never their directories; with
/// `skip_fsync` (the negative control) the persistence points are claimed without syncing.
fn fsync_new_workload(fs: &Filesystem, ack: &dyn Fn(u64), noted: &Noted, skip_fsync: bool) {
    note_base(fs, noted);
    let sync_file = |ino: u32, datasync: bool| {
        if !skip_fsync {
            fs.fsync(ino, datasync).unwrap();
        }
    };
    let a = fs.mkdir(ROOT_INO, b"A", 0o755, 0, 0).unwrap().ino;
    fs.sync().unwrap();
    ack(1);
    // A new file in an old directory.
    let f = fs.create(a, b"new", 0o644, 0, 0).unwrap().ino;
    fs.write(f, 0, &pattern(1, 10_000)).unwrap();
    sync_file(f, false);
    ack(2);
    // A new file in a new directory: fsync of the file covers the directory's creation.
    let b = fs.mkdir(ROOT_INO, b"B", 0o755, 0, 0).unwrap().ino;
    let g = fs.create(b, b"new2", 0o600, 0, 0).unwrap().ino;
    fs.write(g, 0, &pattern(2, 5000)).unwrap();
    sync_file(g, false);
    ack(3);
    // Two levels of new directories, and fdatasync (the size changed, so it commits too).
    let c = fs.mkdir(ROOT_INO, b"C", 0o755, 0, 0).unwrap().ino;
    let d = fs.mkdir(c, b"D", 0o755, 0, 0).unwrap().ino;
    let h = fs.create(d, b"new3", 0o644, 0, 0).unwrap().ino;
    fs.write(h, 0, &pattern(3, 70_000)).unwrap();
    sync_file(h, true);
    ack(4);
    // Never acknowledged: may or may not survive.
    let l = fs.create(a, b"later", 0o644, 0, 0).unwrap().ino;
    fs.write(l, 0, &pattern(4, 3000)).unwrap();
}

fn fsync_new_check(fs: &Filesystem, tree: &Tree, ack: u64, noted: &Noted) -> Result<(), String> {
    only(tree, FSYNC_NEW_PATHS)?;
    if ack >= 1 {
        is_dir(tree, "A")?;
    }
    let files: [(&str, u8, usize, u64, &[&str]); 3] = [
        ("A/new", 1, 10_000, 2, &["A"]),
        ("B/new2", 2, 5000, 3, &["B"]),
        ("C/D/new3", 3, 70_000, 4, &["C", "C/D"]),
    ];
    for (path, tag, len, durable_at, parents) in files {
        let want = pattern(tag, len);
        if ack >= durable_at {
            for p in parents {
                is_dir(tree, p)?;
            }
            exact(tree, path, &want)?;
        } else {
            absent_or_prefix(tree, path, &want)?;
        }
    }
    absent_or_prefix(tree, "A/later", &pattern(4, 3000))?;
    no_leak(fs, tree, noted.get("base"))
}

fn fsync_new_scenario<'a>(
    name: &'a str,
    workload: &'a Workload<'a>,
    check: &'a Check<'a>,
    states: usize,
) -> Scenario<'a> {
    Scenario {
        name,
        mkfs: &["-b", "1024"],
        size: "8M",
        mount: MountOptions::default(),
        setup: &|_| {},
        workload,
        check,
        states,
    }
}

#[test]
fn fsync_of_a_new_file_makes_its_directory_entry_durable() {
    let noted = Noted::default();
    let workload = |fs: &Filesystem, ack: &dyn Fn(u64)| fsync_new_workload(fs, ack, &noted, false);
    let check = |fs: &Filesystem, tree: &Tree, ack: u64| fsync_new_check(fs, tree, ack, &noted);
    let s = fsync_new_scenario("fsync_new_file", &workload, &check, states_wanted(240));
    if let Some(out) = run(&s) {
        out.assert_clean(s.name);
    }
}

/// The negative control: the same checks on a run that claims its persistence points without
/// syncing must fail, or the checks could not catch a lost fsync.
/// The same on ext3 (1 KiB blocks): files and directories indirect-mapped, the journal too.
#[test]
fn fsync_of_a_new_file_makes_its_directory_entry_durable_on_ext3() {
    let noted = Noted::default();
    let workload = |fs: &Filesystem, ack: &dyn Fn(u64)| fsync_new_workload(fs, ack, &noted, false);
    let check = |fs: &Filesystem, tree: &Tree, ack: u64| fsync_new_check(fs, tree, ack, &noted);
    let mut s = fsync_new_scenario("fsync_new_file_ext3", &workload, &check, states_wanted(240));
    s.mkfs = &["-t", "ext3", "-b", "1024"];
    s.size = "16M";
    if let Some(out) = run(&s) {
        out.assert_clean(s.name);
    }
}

#[test]
fn the_crash_checks_catch_a_persistence_point_that_was_not_synced() {
    let noted = Noted::default();
    let workload = |fs: &Filesystem, ack: &dyn Fn(u64)| fsync_new_workload(fs, ack, &noted, true);
    let check = |fs: &Filesystem, tree: &Tree, ack: u64| fsync_new_check(fs, tree, ack, &noted);
    let s = fsync_new_scenario("control_without_fsync", &workload, &check, 40);
    if let Some(out) = run(&s) {
        assert!(
            out.failures.iter().any(|f| f.contains("acknowledged durable")),
            "no crash image lost the unsynced files: the checks cannot fail ({out:?})"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Scenario: unlink while open

#[test]
fn an_unlinked_open_file_never_leaks_and_its_name_goes_with_the_unlink() {
    let noted = Noted::default();
    let workload = |fs: &Filesystem, ack: &dyn Fn(u64)| {
        note_base(fs, &noted);
        let v = fs.create(ROOT_INO, b"victim", 0o644, 0, 0).unwrap().ino;
        noted.set("victim", u64::from(v));
        fs.write(v, 0, &pattern(1, 12_288)).unwrap();
        let k = fs.create(ROOT_INO, b"keep", 0o644, 0, 0).unwrap().ino;
        fs.write(k, 0, &pattern(2, 5000)).unwrap();
        fs.sync().unwrap();
        ack(1);
        let slot = fs.open_inode(v).unwrap();
        fs.unlink(ROOT_INO, b"victim").unwrap();
        // The orphan grows and is fsynced: that commits the unlink too.
        fs.write(v, 12_288, &pattern(3, 40_000)).unwrap();
        fs.fsync(v, false).unwrap();
        ack(2);
        // (Truncating the orphan is covered by
        // truncating_an_unlinked_open_file_keeps_it_on_the_orphan_list.)
        fs.write(v, 0, &pattern(4, 8192)).unwrap();
        fs.sync().unwrap();
        ack(3);
        // The last close frees it.
        fs.close_inode(&slot).unwrap();
        fs.sync().unwrap();
        ack(4);
        // A second victim, unlinked while open and never closed before the crash.
        let w = fs.create(ROOT_INO, b"victim2", 0o644, 0, 0).unwrap().ino;
        fs.write(w, 0, &pattern(5, 30_000)).unwrap();
        fs.fsync(w, false).unwrap();
        ack(5);
        let _open = fs.open_inode(w).unwrap();
        fs.unlink(ROOT_INO, b"victim2").unwrap();
        fs.write(w, 30_000, &pattern(6, 9000)).unwrap();
        fs.sync().unwrap();
        ack(6);
    };
    let check = |fs: &Filesystem, tree: &Tree, ack: u64| {
        only(tree, &["victim", "keep", "victim2"])?;
        let p1 = pattern(1, 12_288);
        if ack >= 1 {
            exact(tree, "keep", &pattern(2, 5000))?;
        } else {
            absent_or_prefix(tree, "keep", &pattern(2, 5000))?;
        }
        match ack {
            0 => absent_or_prefix(tree, "victim", &p1)?,
            // The unlink may be durable or not; the name shows the file as last synced.
            1 => {
                if tree.contains_key("victim") {
                    exact(tree, "victim", &p1)?;
                }
            }
            _ => {
                if tree.contains_key("victim") {
                    return Err("victim still has its name after the unlink was fsynced".into());
                }
            }
        }
        if !tree.contains_key("victim") && ack <= 3 {
            // The orphan was released at open: its inode is free (victim2, created after
            // point 4, may reuse it).
            let v = noted.get("victim") as u32;
            if let Ok(attr) = fs.getattr(v) {
                return Err(format!(
                    "inode {v} of the unlinked victim is still allocated: {attr:?}, {} inodes \
                     used",
                    inodes_used(fs)
                ));
            }
        }
        let p5 = pattern(5, 30_000);
        match ack {
            0..=3 => {}
            4 => absent_or_prefix(tree, "victim2", &p5)?,
            5 => {
                if tree.contains_key("victim2") {
                    exact(tree, "victim2", &p5)?;
                }
            }
            _ => {
                if tree.contains_key("victim2") {
                    return Err("victim2 still has its name after sync".into());
                }
            }
        }
        no_leak(fs, tree, noted.get("base"))
    };
    let s = Scenario {
        name: "unlink_while_open",
        mkfs: &["-b", "4096"],
        size: "16M",
        mount: MountOptions::default(),
        setup: &|_| {},
        workload: &workload,
        check: &check,
        states: states_wanted(240),
    };
    if let Some(out) = run(&s) {
        out.assert_clean(s.name);
    }
}

// ---------------------------------------------------------------------------------------------
// Scenario: truncate in steps

/// Versions of the truncated file: the setup's 4 MiB, then each fsynced step.
fn truncate_versions() -> Vec<Vec<u8>> {
    let original = pattern(7, 4 << 20);
    let mut versions = vec![original.clone()];
    for size in [(3 << 20) + 100, (1 << 20) + 5, 8193] {
        versions.push(original[..size].to_vec());
    }
    let mut grown = original[..8193].to_vec();
    grown.resize(2 << 20, 0);
    versions.push(grown.clone());
    let mut tail = grown;
    tail.resize((2 << 20) + 10, 0);
    tail[(2 << 20) - 10..].copy_from_slice(&pattern(8, 20));
    versions.push(tail);
    versions.push(Vec::new());
    versions
}

/// The recorded truncate steps: each version after the first, made durable by fsync.
fn truncate_steps(fs: &Filesystem, big: u32, versions: &[Vec<u8>], ack: &dyn Fn(u64)) {
    for (k, v) in versions.iter().enumerate().skip(1) {
        if k == 5 {
            fs.write(big, (2 << 20) - 10, &pattern(8, 20)).unwrap();
        } else if k == 4 {
            fs.setattr(big, &SetAttr { size: Some(v.len() as u64), ..Default::default() }).unwrap();
        } else {
            fs.truncate(big, v.len() as u64).unwrap();
        }
        fs.fsync(big, false).unwrap();
        ack(k as u64);
    }
}

fn truncate_scenario(data: DataMode, name: &str, mkfs: &[&str], size: &str) {
    let versions = truncate_versions();
    let block_size = 4096;
    let noted = Noted::default();
    let setup = |fs: &Filesystem| {
        // 4 MiB in 8 KiB runs interleaved with another file's blocks: 512 extents, so
        // freeing them takes many orphan-protected steps.
        let big = fs.create(ROOT_INO, b"big", 0o644, 0, 0).unwrap().ino;
        let filler = fs.create(ROOT_INO, b"filler", 0o644, 0, 0).unwrap().ino;
        let original = &versions[0];
        for (i, chunk) in original.chunks(8 << 10).enumerate() {
            fs.write(big, (i * (8 << 10)) as u64, chunk).unwrap();
            fs.write(filler, (i * 4096) as u64, &pattern(9, 4096)).unwrap();
        }
    };
    let workload = |fs: &Filesystem, ack: &dyn Fn(u64)| {
        note_base(fs, &noted);
        let big = fs.resolve("/big").unwrap();
        // Another thread syncs all the time (as a concurrent syncfs would), so the truncate's
        // orphan-protected steps commit in separate transactions and crashes fall between them.
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let stop = AtomicBool::new(false);
        let syncs = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                while !stop.load(Ordering::Acquire) {
                    fs.sync().unwrap();
                    syncs.fetch_add(1, Ordering::AcqRel);
                    std::thread::sleep(Duration::from_micros(20));
                }
            });
            while syncs.load(Ordering::Acquire) < 2 {
                std::thread::yield_now();
            }
            truncate_steps(fs, big, &versions, ack);
            stop.store(true, Ordering::Release);
        });
    };
    let check = |fs: &Filesystem, tree: &Tree, ack: u64| {
        only(tree, &["big", "filler"])?;
        exact(tree, "filler", &pattern(9, 4096).repeat(512))?;
        let k = ack as usize;
        let mut candidates: Vec<&[u8]> =
            versions[k..(k + 2).min(versions.len())].iter().map(|v| v.as_slice()).collect();
        // A shrinking truncate zeroes the tail of the new last block in place before the
        // transaction that shrinks the size commits (as ext4 may write back the zeroed page
        // early): with the old size, those bytes may read as zeros.
        let zeroed_tail;
        if let Some(next) = versions.get(k + 1).filter(|n| n.len() < versions[k].len()) {
            let mut v = versions[k].clone();
            let end = next.len().next_multiple_of(block_size).min(v.len());
            v[next.len()..end].fill(0);
            zeroed_tail = v;
            candidates.push(&zeroed_tail);
        }
        bytes_from(tree, "big", &candidates)?;
        no_leak(fs, tree, noted.get("base"))
    };
    // Commit often, so the truncate's steps land in different transactions.
    let mut mount = mount_options(data);
    mount.journal.commit_interval = Duration::from_millis(1);
    let s = Scenario {
        name,
        mkfs,
        size,
        mount,
        setup: &setup,
        workload: &workload,
        check: &check,
        states: states_wanted(240),
    };
    if let Some(out) = run(&s) {
        out.assert_clean(s.name);
    }
}

#[test]
fn truncate_in_steps_leaves_the_old_or_the_new_size_and_never_stale_data() {
    truncate_scenario(DataMode::Ordered, "truncate_steps", &["-b", "4096"], "16M");
}

/// The stepped truncate of an indirect-mapped file (ext3): each step frees whole runs and the
/// indirect blocks they empty.
#[test]
fn truncate_in_steps_on_ext3() {
    truncate_scenario(
        DataMode::Ordered,
        "truncate_steps_ext3",
        &["-t", "ext3", "-b", "4096"],
        "16M",
    );
}

#[test]
fn truncate_in_steps_under_data_journal() {
    // An 8 MiB journal (a 4 MiB one is covered by
    // truncate_under_data_journal_fits_a_small_journal).
    truncate_scenario(
        DataMode::Journal,
        "truncate_steps_data_journal",
        &["-b", "4096", "-J", "size=8"],
        "24M",
    );
}

// ---------------------------------------------------------------------------------------------
// Scenario: writeback of scattered pages

const SCATTER_GROUPS: usize = 3;
const SCATTER_WRITES: usize = 24;

/// Where write `i` of group `g` goes: 1,000 bytes at the start of every other block, each
/// group past the last, so one writeback meets many separate runs of cached pages.
fn scatter_offset(g: usize, i: usize) -> u64 {
    ((g * 64 + 2 * i) * 4096) as u64
}

/// The file after each write (the first is the empty file the setup made).
fn scatter_versions() -> Vec<Vec<u8>> {
    let mut versions = vec![Vec::new()];
    for g in 0..SCATTER_GROUPS {
        for i in 0..SCATTER_WRITES {
            let mut v = versions.last().unwrap().clone();
            let at = scatter_offset(g, i) as usize;
            v.resize(at + 1000, 0);
            v[at..].copy_from_slice(&pattern((g * SCATTER_WRITES + i) as u8, 1000));
            versions.push(v);
        }
    }
    versions
}

/// A writeback of many runs of pages (here one fsync after many scattered writes) must not
/// commit its runs apart: a crash would show the file ending at the end of some run's block,
/// a size it never had. Another thread rewrites and fsyncs another file all the time, and
/// commits are due every millisecond, so a commit between two runs of one writeback would be
/// caught.
#[test]
fn a_writeback_of_scattered_pages_leaves_a_size_the_file_had() {
    let versions = scatter_versions();
    let noted = Noted::default();
    let setup = |fs: &Filesystem| {
        fs.create(ROOT_INO, b"scattered", 0o644, 0, 0).unwrap();
        let other = fs.create(ROOT_INO, b"other", 0o644, 0, 0).unwrap().ino;
        fs.write(other, 0, b"x").unwrap();
    };
    let workload = |fs: &Filesystem, ack: &dyn Fn(u64)| {
        note_base(fs, &noted);
        let ino = fs.resolve("/scattered").unwrap();
        let other = fs.resolve("/other").unwrap();
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let stop = AtomicBool::new(false);
        let fsyncs = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                while !stop.load(Ordering::Acquire) {
                    fs.write(other, 0, b"x").unwrap();
                    fs.fsync(other, false).unwrap();
                    fsyncs.fetch_add(1, Ordering::AcqRel);
                }
            });
            while fsyncs.load(Ordering::Acquire) < 2 {
                std::thread::yield_now();
            }
            for g in 0..SCATTER_GROUPS {
                for i in 0..SCATTER_WRITES {
                    let tag = (g * SCATTER_WRITES + i) as u8;
                    fs.write(ino, scatter_offset(g, i), &pattern(tag, 1000)).unwrap();
                }
                fs.fsync(ino, false).unwrap();
                ack(g as u64 + 1);
            }
            stop.store(true, Ordering::Release);
        });
    };
    let check = |fs: &Filesystem, tree: &Tree, ack: u64| {
        only(tree, &["scattered", "other"])?;
        exact(tree, "other", b"x")?;
        // Durable: every write up to the last acknowledged fsync; maybe: any of the next
        // group's writes, in the order they were made.
        let first = ack as usize * SCATTER_WRITES;
        let last = (first + SCATTER_WRITES).min(versions.len() - 1);
        let candidates: Vec<&[u8]> = versions[first..=last].iter().map(|v| v.as_slice()).collect();
        bytes_from(tree, "scattered", &candidates)?;
        no_leak(fs, tree, noted.get("base"))
    };
    let mut mount = mount_options(DataMode::Ordered);
    mount.journal.commit_interval = Duration::from_millis(1);
    let s = Scenario {
        name: "scattered_writeback",
        mkfs: &["-b", "4096"],
        size: "16M",
        mount,
        setup: &setup,
        workload: &workload,
        check: &check,
        states: states_wanted(240),
    };
    if let Some(out) = run(&s) {
        out.assert_clean(s.name);
    }
}

// ---------------------------------------------------------------------------------------------
// Scenario: rename over an existing file

#[test]
fn rename_over_an_existing_file_shows_the_old_or_the_new_contents_at_every_crash_point() {
    let old = pattern(1, 20_000);
    let new = pattern(2, 30_001);
    let third = pattern(3, 4096);
    let noted = Noted::default();
    let workload = |fs: &Filesystem, ack: &dyn Fn(u64)| {
        note_base(fs, &noted);
        let t = fs.create(ROOT_INO, b"target", 0o644, 0, 0).unwrap().ino;
        fs.write(t, 0, &old).unwrap();
        fs.fsync(t, false).unwrap();
        ack(1);
        let n = fs.create(ROOT_INO, b"target.tmp", 0o644, 0, 0).unwrap().ino;
        fs.write(n, 0, &new).unwrap();
        fs.fsync(n, false).unwrap();
        ack(2);
        fs.rename(ROOT_INO, b"target.tmp", ROOT_INO, b"target", RenameFlags::default()).unwrap();
        fs.sync().unwrap();
        ack(3);
        // Across directories this time.
        let d = fs.mkdir(ROOT_INO, b"D", 0o755, 0, 0).unwrap().ino;
        let m = fs.create(d, b"next", 0o644, 0, 0).unwrap().ino;
        fs.write(m, 0, &third).unwrap();
        fs.fsync(m, false).unwrap();
        ack(4);
        fs.rename(d, b"next", ROOT_INO, b"target", RenameFlags::default()).unwrap();
        fs.sync().unwrap();
        ack(5);
    };
    let check = |fs: &Filesystem, tree: &Tree, ack: u64| {
        only(tree, &["target", "target.tmp", "D", "D/next"])?;
        match ack {
            0 => absent_or_prefix(tree, "target", &old)?,
            1..=2 => {
                let which = one_of(tree, "target", &[&old, &new])?;
                if which == 1 && tree.contains_key("target.tmp") {
                    return Err("target has the new contents but target.tmp still exists".into());
                }
                if ack == 2 && which == 0 {
                    exact(tree, "target.tmp", &new)?;
                } else if which == 0 {
                    absent_or_prefix(tree, "target.tmp", &new)?;
                }
            }
            _ => {
                if tree.contains_key("target.tmp") {
                    return Err("target.tmp exists after the rename was synced".into());
                }
                let which = if ack < 5 {
                    one_of(tree, "target", &[&new, &third])?
                } else {
                    one_of(tree, "target", &[&third])? + 1
                };
                if ack >= 4 {
                    is_dir(tree, "D")?;
                }
                match (which, ack) {
                    (1, _) if tree.contains_key("D/next") => {
                        return Err("target has the third contents but D/next still exists".into())
                    }
                    (0, 4) => exact(tree, "D/next", &third)?,
                    (0, _) => absent_or_prefix(tree, "D/next", &third)?,
                    _ => {}
                }
            }
        }
        if let Some(n) = tree.get("target") {
            if n.nlink != 1 {
                return Err(format!("target has {} links", n.nlink));
            }
        }
        no_leak(fs, tree, noted.get("base"))
    };
    let s = Scenario {
        name: "rename_over",
        mkfs: &["-b", "1024"],
        size: "8M",
        mount: MountOptions::default(),
        setup: &|_| {},
        workload: &workload,
        check: &check,
        states: states_wanted(240),
    };
    if let Some(out) = run(&s) {
        out.assert_clean(s.name);
    }
}

// ---------------------------------------------------------------------------------------------
// Scenario: fdatasync and fsync on overwrite and append

/// The file's versions: each is made durable by the persistence point of its index.
fn datasync_versions() -> Vec<Vec<u8>> {
    let mut v = vec![Vec::new(), pattern(1, 65_536)];
    let mut next = v[1].clone();
    next[4096..12_288].copy_from_slice(&pattern(2, 8192)); // aligned overwrite, fdatasync
    v.push(next.clone());
    next.extend_from_slice(&pattern(3, 10_000)); // append, fdatasync
    v.push(next.clone());
    next[..100].copy_from_slice(&pattern(4, 100)); // unaligned overwrites, fsync
    next[60_000..70_000].copy_from_slice(&pattern(5, 10_000));
    v.push(next.clone());
    next.extend_from_slice(&pattern(6, 5000)); // unaligned append, fsync
    v.push(next.clone());
    next[70_000..75_536].copy_from_slice(&pattern(7, 5536)); // overwrite up to EOF, fdatasync
    v.push(next);
    v
}

fn datasync_scenario(data: DataMode, name: &str) {
    let versions = datasync_versions();
    let noted = Noted::default();
    let workload = |fs: &Filesystem, ack: &dyn Fn(u64)| {
        note_base(fs, &noted);
        let f = fs.create(ROOT_INO, b"data", 0o644, 0, 0).unwrap().ino;
        fs.write(f, 0, &versions[1]).unwrap();
        fs.fsync(f, false).unwrap();
        ack(1);
        fs.write(f, 4096, &pattern(2, 8192)).unwrap();
        fs.fsync(f, true).unwrap();
        ack(2);
        fs.write(f, 65_536, &pattern(3, 10_000)).unwrap();
        fs.fsync(f, true).unwrap();
        ack(3);
        fs.write(f, 0, &pattern(4, 100)).unwrap();
        fs.write(f, 60_000, &pattern(5, 10_000)).unwrap();
        fs.fsync(f, false).unwrap();
        ack(4);
        fs.write(f, 75_536, &pattern(6, 5000)).unwrap();
        fs.fsync(f, false).unwrap();
        ack(5);
        fs.write(f, 70_000, &pattern(7, 5536)).unwrap();
        fs.fsync(f, true).unwrap();
        ack(6);
    };
    let check = |fs: &Filesystem, tree: &Tree, ack: u64| {
        only(tree, &["data"])?;
        let k = ack as usize;
        if k == 0 {
            absent_or_prefix(tree, "data", &versions[1])?;
        } else {
            let candidates: Vec<&[u8]> =
                versions[k..(k + 2).min(versions.len())].iter().map(|v| v.as_slice()).collect();
            bytes_from(tree, "data", &candidates)?;
        }
        no_leak(fs, tree, noted.get("base"))
    };
    let s = Scenario {
        name,
        mkfs: &["-b", "4096"],
        size: "16M",
        mount: mount_options(data),
        setup: &|_| {},
        workload: &workload,
        check: &check,
        states: states_wanted(200),
    };
    if let Some(out) = run(&s) {
        out.assert_clean(s.name);
    }
}

#[test]
fn fdatasync_and_fsync_make_overwrites_and_appends_durable() {
    datasync_scenario(DataMode::Ordered, "datasync");
}

#[test]
fn fdatasync_and_fsync_make_overwrites_and_appends_durable_under_data_journal() {
    datasync_scenario(DataMode::Journal, "datasync_data_journal");
}

// ---------------------------------------------------------------------------------------------
// Regressions: bugs these tests found, fixed since

/// A fresh 16 MiB image with 4 KiB blocks (a 1024-block journal) on a memory device.
fn fresh_image(scratch: &Scratch, mount: MountOptions) -> Option<(Arc<MemDevice>, Filesystem)> {
    if !have_tools("bug reproducer") {
        return None;
    }
    let path = scratch.path("fresh.img");
    mkfs(&path, "16M", &["-b", "4096"]);
    let dev = Arc::new(MemDevice::from_bytes(std::fs::read(&path).unwrap()));
    let fs = Filesystem::open(dev.clone(), mount).unwrap();
    Some((dev, fs))
}

#[test]
fn truncating_an_unlinked_open_file_keeps_it_on_the_orphan_list() {
    let scratch = Scratch::new("bug-orphan-truncate");
    let Some((dev, fs)) = fresh_image(&scratch, MountOptions::default()) else { return };
    let base = inodes_used(&fs);
    let ino = fs.create(ROOT_INO, b"victim", 0o644, 0, 0).unwrap().ino;
    fs.write(ino, 0, &pattern(1, 12_288)).unwrap();
    let _open = fs.open_inode(ino).unwrap();
    fs.unlink(ROOT_INO, b"victim").unwrap();
    fs.truncate(ino, 4096).unwrap();
    fs.sync().unwrap();
    fs.crash();
    // As after a power failure: the orphan must be released at the next open.
    let crashed = Arc::new(MemDevice::from_bytes(dev.snapshot()));
    let fs = Filesystem::open(crashed.clone(), MountOptions::default()).unwrap();
    let still = fs.getattr(ino).ok().map(|a| (a.nlink, a.size));
    let used = inodes_used(&fs);
    fs.unmount().unwrap();
    let path = scratch.path("after.img");
    std::fs::write(&path, crashed.snapshot()).unwrap();
    let (code, text) = e2fsck(&path);
    assert_eq!(still, None, "inode {ino} survived the crash unlinked (nlink, size)");
    assert_eq!(used, base, "inodes in use after recovery");
    assert_eq!(code, 0, "e2fsck -fn:\n{}", head(&text));
}

#[test]
fn a_large_write_under_data_journal_fits_its_handle() {
    let scratch = Scratch::new("bug-journal-write");
    let Some((_dev, fs)) = fresh_image(&scratch, mount_options(DataMode::Journal)) else {
        return;
    };
    let ino = fs.create(ROOT_INO, b"f", 0o644, 0, 0).unwrap().ino;
    let data = pattern(1, 128 * 4096);
    let r = fs.write(ino, 0, &data);
    assert!(matches!(r, Ok(n) if n == data.len()), "write of 128 blocks: {r:?}");
    assert!(!fs.is_read_only());
    fs.unmount().unwrap();
}

#[test]
fn truncate_under_data_journal_fits_a_small_journal() {
    let scratch = Scratch::new("bug-journal-truncate");
    let Some((_dev, fs)) = fresh_image(&scratch, mount_options(DataMode::Journal)) else {
        return;
    };
    let ino = fs.create(ROOT_INO, b"f", 0o644, 0, 0).unwrap().ino;
    // 512 blocks in writes small enough to fit their handles.
    for i in 0..64u64 {
        fs.write(ino, i * (32 << 10), &pattern(1, 32 << 10)).unwrap();
    }
    let r = fs.truncate(ino, 0);
    assert!(r.is_ok(), "truncate of 512 blocks: {r:?}");
    assert!(!fs.is_read_only());
    fs.unmount().unwrap();
}

/// A crash leaves what ext4 leaves: the superblock says "clean" (VALID_FS stays on while a
/// journaled file system is mounted) and needs_recovery, so boot-time `e2fsck -p` replays the
/// journal and skips the full check, and the kernel does not call it unchecked.
#[test]
fn a_crashed_image_needs_only_its_journal_replayed_before_e2fsck_p_calls_it_clean() {
    if !have_tools("crash then e2fsck -p") || !have("dumpe2fs", "crash then e2fsck -p") {
        return;
    }
    let scratch = Scratch::new("crash-preen");
    let image = scratch.path("fs.img");
    mkfs(&image, "16M", &[]);
    let fs = Filesystem::open(common::open_device(&image), MountOptions::default()).unwrap();
    create_fsynced(&fs, b"kept", b"acknowledged");
    fs.crash();
    let dump = dumpe2fs_header(&image);
    assert_eq!(dumpe2fs_field(&dump, "Filesystem state"), "clean", "a crashed image's state");
    let features = dumpe2fs_field(&dump, "Filesystem features");
    assert!(features.contains("needs_recovery"), "{features}");

    let copy = scratch.path("preen.img");
    std::fs::copy(&image, &copy).unwrap();
    let (code, text) = e2fsck_preen(&copy);
    assert!((0..=1).contains(&code), "e2fsck -p:\n{text}");
    assert!(text.contains("recovering journal") && text.contains(": clean,"), "e2fsck -p:\n{text}");
    let (code, text) = e2fsck(&copy);
    assert_eq!(code, 0, "e2fsck -fn after e2fsck -p:\n{text}");

    let fs = Filesystem::open(common::open_device(&image), MountOptions::default()).unwrap();
    let ino = fs.lookup(ROOT_INO, b"kept").unwrap().ino;
    assert_eq!(read_all(&fs, ino).unwrap(), b"acknowledged");
    fs.unmount().unwrap();
    let dump = dumpe2fs_header(&image);
    assert_eq!(dumpe2fs_field(&dump, "Filesystem state"), "clean");
    let features = dumpe2fs_field(&dump, "Filesystem features");
    assert!(!features.contains("needs_recovery"), "{features}");
}
