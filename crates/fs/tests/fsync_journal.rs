//! `fsync_journal = on` (iJournaling as ext4 fast commits, `fsync_journal.rs`): an fsync of a
//! file whose changes all sit in the running transaction writes a fast commit instead of
//! committing; after a crash quill's recovery, `e2fsck -fy` and the kernel's mount all bring
//! back every acknowledged fsync; everything a fast commit cannot express commits the
//! transaction and is counted by reason.

mod common;

use std::path::Path;

use common::{
    assert_fsck_clean, can_loop_mount, have_tools, mkfs, open_device, read_all, Mount, Scratch,
};
use fs::{Filesystem, MountOptions, ROOT_INO};
use journal::JournalConfig;

fn fsync_journal() -> MountOptions {
    MountOptions {
        journal: JournalConfig { fsync_journal: true, ..JournalConfig::classic() },
        ..MountOptions::default()
    }
}

fn fallbacks(fs: &Filesystem) -> Vec<(String, u64)> {
    fs.journal().stats().fast_commit_fallbacks
}

/// Bytes `i` of a recognizable pattern for append number `round`.
fn chunk(round: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| round.wrapping_mul(37).wrapping_add(i as u8) | 1).collect()
}

/// The file `name` in the root of the image at `image`, read by a read-only quill open (which
/// replays into memory what the device still needs).
fn read_back(image: &Path, name: &[u8]) -> Vec<u8> {
    let options = MountOptions { read_only: true, ..MountOptions::default() };
    let fs = Filesystem::open(open_device(image), options).expect("open read-only");
    let ino = fs.lookup(ROOT_INO, name).expect("lookup").ino;
    let bytes = read_all(&fs, ino).unwrap();
    fs.unmount().unwrap();
    bytes
}

#[test]
fn appends_fsynced_as_fast_commits_come_back_after_a_crash_with_quill_e2fsck_and_the_kernel() {
    if !have_tools(&["mkfs.ext4", "e2fsck"]) {
        return;
    }
    let scratch = Scratch::new("fsync-journal-appends");
    let image = scratch.path("fc.img");
    mkfs(&image, "64M", &["-O", "fast_commit"]);
    let fs = Filesystem::open(open_device(&image), fsync_journal()).unwrap();
    // Created and fsynced: a directory-entry change, so a full commit.
    let ino = fs.create(ROOT_INO, b"log", 0o644, 0, 0).unwrap().ino;
    let mut expected = chunk(0, 5000);
    fs.write(ino, 0, &expected).unwrap();
    fs.fsync(ino, false).unwrap();
    assert_eq!(fs.journal().stats().fast_commits, 0);
    assert!(fallbacks(&fs).iter().any(|(r, _)| r == "create"), "{:?}", fallbacks(&fs));
    // Appends, each fsynced: fast commits, and the transaction stays uncommitted.
    let committed = fs.journal().stats().transactions;
    for round in 1..=5u8 {
        let more = chunk(round, 3000 + 700 * usize::from(round));
        fs.write(ino, expected.len() as u64, &more).unwrap();
        expected.extend_from_slice(&more);
        fs.fsync(ino, round % 2 == 0).unwrap();
    }
    let stats = fs.journal().stats();
    assert_eq!(stats.fast_commits, 5, "{stats:?}");
    assert_eq!(stats.transactions, committed, "no full commit for the fast-committed fsyncs");
    // A second fsync with nothing new writes nothing.
    fs.fsync(ino, false).unwrap();
    assert_eq!(fs.journal().stats().fast_commits, 5);
    fs.crash();

    // The crash image, three ways.
    let by_e2fsck = scratch.path("e2fsck.img");
    let by_kernel = scratch.path("kernel.img");
    std::fs::copy(&image, &by_e2fsck).unwrap();
    std::fs::copy(&image, &by_kernel).unwrap();

    let fs =
        Filesystem::open(open_device(&image), MountOptions::default()).expect("quill recovery");
    let got = read_all(&fs, fs.lookup(ROOT_INO, b"log").unwrap().ino).unwrap();
    assert_eq!(got.len(), expected.len(), "quill's replay: the size of the last fsync");
    assert!(got == expected, "quill's replay: the bytes of every fsync");
    fs.unmount().unwrap();
    assert_fsck_clean(&image);

    let out = std::process::Command::new("e2fsck").arg("-fy").arg(&by_e2fsck).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(matches!(out.status.code(), Some(0 | 1)), "e2fsck -fy: {text}");
    assert!(read_back(&by_e2fsck, b"log") == expected, "e2fsck's replay of the fast commits");
    assert_fsck_clean(&by_e2fsck);

    if can_loop_mount("fsync_journal kernel replay") {
        let mount = Mount::new(&by_kernel, scratch.path("mnt")).expect("loop mount");
        let got = std::fs::read(mount.dir.join("log")).unwrap();
        assert!(got == expected, "the kernel's replay of the fast commits");
        drop(mount);
        assert_fsck_clean(&by_kernel);
    }
}

/// A full commit supersedes the fast commits before it; the next fast commit starts the area
/// over with its own HEAD, and the crash after it replays only that one on top of the commit.
#[test]
fn a_full_commit_supersedes_earlier_fast_commits_and_the_area_starts_over() {
    if !have_tools(&["mkfs.ext4", "e2fsck"]) {
        return;
    }
    let scratch = Scratch::new("fsync-journal-supersede");
    let image = scratch.path("fc.img");
    mkfs(&image, "64M", &["-O", "fast_commit"]);
    let fs = Filesystem::open(open_device(&image), fsync_journal()).unwrap();
    let ino = fs.create(ROOT_INO, b"f", 0o644, 0, 0).unwrap().ino;
    let mut expected = chunk(1, 10_000);
    fs.write(ino, 0, &expected).unwrap();
    fs.fsync(ino, false).unwrap();
    for round in 2..=4u8 {
        let more = chunk(round, 9000);
        fs.write(ino, expected.len() as u64, &more).unwrap();
        expected.extend_from_slice(&more);
        fs.fsync(ino, false).unwrap();
        if round == 3 {
            fs.sync().unwrap(); // the full commit
        }
    }
    assert_eq!(fs.journal().stats().fast_commits, 3);
    fs.crash();
    let fs = Filesystem::open(open_device(&image), MountOptions::default()).unwrap();
    assert!(read_all(&fs, ino).unwrap() == expected);
    fs.unmount().unwrap();
    assert_fsck_clean(&image);
}

#[test]
fn what_a_fast_commit_cannot_express_commits_the_transaction_and_is_counted() {
    if !have_tools(&["mkfs.ext4"]) {
        return;
    }
    let scratch = Scratch::new("fsync-journal-fallbacks");
    let image = scratch.path("fc.img");
    mkfs(&image, "64M", &["-O", "fast_commit"]);
    let fs = Filesystem::open(open_device(&image), fsync_journal()).unwrap();
    let a = fs.create(ROOT_INO, b"a", 0o644, 0, 0).unwrap().ino;
    fs.write(a, 0, b"a").unwrap();
    fs.sync().unwrap();
    let before = fs.journal().stats();
    // Each change below, then an fsync that must commit.
    fs.setxattr(a, b"user.k", b"v", fs::SetMode::Any).unwrap();
    fs.fsync(a, false).unwrap();
    fs.rename(ROOT_INO, b"a", ROOT_INO, b"b", fs::RenameFlags::default()).unwrap();
    fs.fsync(a, false).unwrap();
    fs.link(a, ROOT_INO, b"c").unwrap();
    fs.write(a, 1, b"b").unwrap();
    fs.fsync(a, false).unwrap();
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, 0, 0).unwrap().ino;
    fs.fsync(d, false).unwrap();
    let stats = fs.journal().stats();
    assert_eq!(stats.fast_commits, before.fast_commits, "none of these is a fast commit");
    assert!(stats.transactions >= before.transactions + 4, "each committed");
    let reasons: Vec<&str> = stats.fast_commit_fallbacks.iter().map(|(r, _)| r.as_str()).collect();
    for reason in ["xattr", "rename", "link", "create"] {
        assert!(reasons.contains(&reason), "{reason} not counted: {reasons:?}");
    }
    fs.unmount().unwrap();
}

#[test]
fn fsync_journal_on_a_file_system_without_fast_commit_is_refused_by_name() {
    if !have_tools(&["mkfs.ext4"]) {
        return;
    }
    let scratch = Scratch::new("fsync-journal-refused");
    let image = scratch.path("plain.img");
    mkfs(&image, "64M", &[]);
    let Err(err) = Filesystem::open(open_device(&image), fsync_journal()) else {
        panic!("fsync_journal=on opened a file system without fast_commit");
    };
    let text = err.to_string();
    assert!(text.contains("fast_commit") && !text.contains('\n'), "{text}");
    // Read-only needs no fast commits and opens.
    let ro = MountOptions { read_only: true, ..fsync_journal() };
    Filesystem::open(open_device(&image), ro).unwrap().unmount().unwrap();
}
