//! Crashes of a file system without a journal (ext2): there is no log to replay, so the
//! promise is e2fsck's: every crash image `e2fsck -fy` repairs to a clean image, and every file
//! made durable before (here by the setup's clean unmount) and not touched since is intact,
//! under its name, whatever the operations after it were doing to its directory when the
//! crash came. The operations chosen move names between blocks: creates that split the htree
//! leaves holding the durable names (the moved half goes to a new block), renames between
//! directories, unlinks; their commits write home in the order that keeps a moved name in
//! at least one block (`journal::HomeOrder`).
//!
//! Every crash state the recording allows with whole-block writes is checked: each flush
//! boundary, every subset of the writes between two flushes (up to 12 writes; sampled above
//! that), the in-order prefixes and one-dropped orderings. Torn sectors are left out (see
//! `torn_per_gap` below).
//! Needs e2fsprogs; skips with a printed reason otherwise. `QUILL_CRASH_STATES=n` bounds the
//! states (default 600).

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use blockdev::memory::MemDevice;
use blockdev::recording::{CrashOptions, RecordingDevice};
use common::{have, mkfs, seed, Scratch};
use crashtest::explore::tears_primary_superblock;
use crashtest::tree::read_tree;
use fs::{Filesystem, MountOptions, RenameFlags, ROOT_INO};

/// What the setup made durable: path → contents.
fn durable_files() -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    for i in 0..60 {
        let bytes = format!("durable file {i}, a name the later creates move").repeat(1 + i % 5);
        files.insert(format!("mail/held-{i:03}-with-a-long-name-to-fill-blocks"), bytes.into());
    }
    files.insert("a/kept".into(), b"in a directory a rename leaves".to_vec());
    files
}

fn setup(fs: &Filesystem) {
    let mail = fs.mkdir(ROOT_INO, b"mail", 0o755, 0, 0).unwrap().ino;
    let a = fs.mkdir(ROOT_INO, b"a", 0o755, 0, 0).unwrap().ino;
    fs.mkdir(ROOT_INO, b"b", 0o755, 0, 0).unwrap();
    for (path, bytes) in durable_files() {
        let (dir, name) = path.split_once('/').unwrap();
        let parent = if dir == "mail" { mail } else { a };
        let ino = fs.create(parent, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
        fs.write(ino, 0, &bytes).unwrap();
    }
    for i in 0..4 {
        let ino = fs.create(a, format!("moving-{i}").as_bytes(), 0o644, 0, 0).unwrap().ino;
        fs.write(ino, 0, format!("moved {i}").as_bytes()).unwrap();
    }
}

/// Operations on the durable files' directories, each its own commit (a sync after each, so
/// each commit's writes are one epoch of the recording).
fn workload(fs: &Filesystem) {
    let mail = fs.resolve("/mail").unwrap();
    let (a, b) = (fs.resolve("/a").unwrap(), fs.resolve("/b").unwrap());
    for i in 0..4 {
        let (from, to) = (format!("moving-{i}"), format!("moved-{i}"));
        fs.rename(a, from.as_bytes(), b, to.as_bytes(), RenameFlags::default()).unwrap();
        fs.sync().unwrap();
    }
    for round in 0..6 {
        for i in 0..12 {
            let name = format!("new-{round}-{i:02}-with-a-long-name-to-fill-the-leaves");
            let ino = fs.create(mail, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
            fs.write(ino, 0, b"new").unwrap();
        }
        fs.unlink(mail, format!("new-{round}-00-with-a-long-name-to-fill-the-leaves").as_bytes())
            .unwrap();
        fs.sync().unwrap();
    }
}

#[test]
fn without_a_journal_every_crash_is_repaired_with_the_durable_files_intact() {
    let test = "no_journal_crash";
    if !have("mkfs.ext2", test) || !have("e2fsck", test) {
        return;
    }
    let seed = seed(test);
    let scratch = Scratch::new("crash-no-journal");
    let formatted = scratch.path("mkfs.img");
    mkfs(&formatted, "8M", &["-t", "ext2", "-b", "1024"]);
    let initial = {
        let dev = Arc::new(MemDevice::from_bytes(std::fs::read(&formatted).unwrap()));
        let fs = Filesystem::open(dev.clone(), MountOptions::default()).unwrap();
        setup(&fs);
        fs.unmount().unwrap();
        dev.snapshot()
    };
    let recording = Arc::new(RecordingDevice::new(initial));
    let fs = Filesystem::open(recording.clone(), MountOptions::default()).unwrap();
    workload(&fs);
    assert!(fs.resolve("/mail").is_ok());
    fs.crash();
    let options = CrashOptions {
        subsets_per_gap: 16,
        // Whole-block writes only: a sector torn inside a directory block that an htree split
        // repacks can lose a name the block keeps (it moved within the block), which no
        // order of whole blocks prevents (ext2 has the same exposure); see the README.
        torn_per_gap: 0,
        seed,
        max_states: Some(common::env_count("QUILL_CRASH_STATES", 600)),
        exhaustive_up_to: 12,
        orderings: true,
    };
    let ops = recording.ops();
    let mut states = recording.crash_states(&options);
    states.retain(|state| !tears_primary_superblock(&ops, state));
    let raw = scratch.path("raw.img");
    let durable = durable_files();
    let mut failures = Vec::new();
    let mut repaired = 0;
    for state in &states {
        std::fs::write(&raw, recording.materialize(state)).unwrap();
        let context = || format!("seed {seed}: {}", state.describe());
        let (code, text) = common::e2fsck_fix(&raw);
        if code > 1 {
            failures.push(format!("{}: e2fsck -fy exits {code}:\n{}", context(), head(&text)));
            continue;
        }
        repaired += usize::from(code == 1);
        let (code, text) = common::e2fsck(&raw);
        if code != 0 {
            failures.push(format!("{}: not clean after e2fsck -fy:\n{}", context(), head(&text)));
            continue;
        }
        let options = MountOptions { read_only: true, ..MountOptions::default() };
        let dev = Arc::new(MemDevice::from_bytes(std::fs::read(&raw).unwrap()));
        let fs = Filesystem::open(dev, options).unwrap();
        let tree = match read_tree(&fs) {
            Ok(tree) => tree,
            Err(e) => {
                failures.push(format!("{}: quill cannot read the repaired tree: {e}", context()));
                continue;
            }
        };
        for (path, bytes) in &durable {
            if tree.get(path).map(|n| &n.data) != Some(bytes) {
                failures.push(format!("{}: {path} is lost or changed", context()));
                break;
            }
        }
        // A renamed file is under its old name, its new one, or both (a rename's commit
        // writes the new name before it removes the old), never under neither.
        for i in 0..4 {
            let want = format!("moved {i}").into_bytes();
            let found = [format!("a/moving-{i}"), format!("b/moved-{i}")]
                .iter()
                .any(|p| tree.get(p).is_some_and(|n| n.data == want));
            if !found {
                failures.push(format!("{}: renamed file {i} is under neither name", context()));
            }
        }
        fs.unmount().unwrap();
    }
    println!(
        "{test}: {} crash states of {} recorded ops, {repaired} repaired by e2fsck -fy, {} failed",
        states.len(),
        ops.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "{} failures; the first:\n{}", failures.len(), failures[0]);
}

fn head(text: &str) -> String {
    common::head(text, 20)
}
