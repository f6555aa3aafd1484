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

/// A fresh 64 MiB image made by mkfs.ext4 with `extra` options, in its own scratch
/// directory; `None` (after a SKIP line) without e2fsprogs.
fn fresh_image(name: &str, extra: &[&str]) -> Option<(Scratch, std::path::PathBuf)> {
    if !have_tools(&["mkfs.ext4", "e2fsck"]) {
        return None;
    }
    let scratch = Scratch::new(name);
    let image = scratch.path("fc.img");
    mkfs(&image, "64M", extra);
    Some((scratch, image))
}

/// `e2fsck -fy` (its own journal and fast-commit replay) must end with a consistent image;
/// returns what it printed.
fn e2fsck_fy(image: &Path) -> String {
    let out = std::process::Command::new("e2fsck").arg("-fy").arg(image).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(matches!(out.status.code(), Some(0 | 1)), "e2fsck -fy: {text}");
    text
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
    let Some((scratch, image)) = fresh_image("fsync-journal-appends", &["-O", "fast_commit"])
    else {
        return;
    };
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

    e2fsck_fy(&by_e2fsck);
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
    let Some((_scratch, image)) = fresh_image("fsync-journal-supersede", &["-O", "fast_commit"])
    else {
        return;
    };
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
    let Some((_scratch, image)) = fresh_image("fsync-journal-fallbacks", &["-O", "fast_commit"])
    else {
        return;
    };
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

/// Without the fast_commit feature there is no area e2fsck or the kernel would read: the
/// journal keeps its whole log, every fsync commits, and each says why in the figures.
#[test]
fn fsync_journal_on_a_file_system_without_fast_commit_commits_and_says_why() {
    let Some((_scratch, image)) = fresh_image("fsync-journal-no-feature", &[]) else { return };
    let fs = Filesystem::open(open_device(&image), fsync_journal()).unwrap();
    assert!(!fs.journal().fast_commits_enabled());
    let ino = fs.create(ROOT_INO, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write(ino, 0, b"x").unwrap();
    fs.fsync(ino, false).unwrap();
    fs.write(ino, 1, b"y").unwrap();
    fs.fsync(ino, false).unwrap();
    let stats = fs.journal().stats();
    assert_eq!(stats.fast_commits, 0);
    assert_eq!(stats.fast_commit_fallbacks, vec![("no fast_commit feature".to_string(), 2)]);
    fs.unmount().unwrap();
    assert_fsck_clean(&image);
    assert!(
        !common::dumpe2fs_header(&image).contains("journal_incompat_fast_commit"),
        "the journal never turned fast commits on"
    );
}

/// The first transaction of a mount may fast-commit too: the fast commit first writes the
/// journal superblock naming the live log (a clean one would make recovery skip the area).
#[test]
fn the_first_fsync_after_mounting_is_a_fast_commit_that_survives_a_crash() {
    let Some((scratch, image)) = fresh_image("fsync-journal-first", &["-O", "fast_commit"]) else {
        return;
    };
    let fs = Filesystem::open(open_device(&image), fsync_journal()).unwrap();
    let ino = fs.create(ROOT_INO, b"f", 0o644, 0, 0).unwrap().ino;
    let mut expected = chunk(1, 6000);
    fs.write(ino, 0, &expected).unwrap();
    fs.unmount().unwrap();
    let fs = Filesystem::open(open_device(&image), fsync_journal()).unwrap();
    let more = chunk(2, 7000);
    fs.write(ino, expected.len() as u64, &more).unwrap();
    expected.extend_from_slice(&more);
    fs.fsync(ino, false).unwrap();
    let stats = fs.journal().stats();
    assert_eq!((stats.fast_commits, stats.transactions), (1, 0), "{stats:?}");
    fs.crash();
    let copy = scratch.path("e2fsck.img");
    std::fs::copy(&image, &copy).unwrap();
    let fs = Filesystem::open(open_device(&image), MountOptions::default()).unwrap();
    assert!(read_all(&fs, ino).unwrap() == expected, "quill's replay");
    fs.unmount().unwrap();
    assert_fsck_clean(&image);
    e2fsck_fy(&copy);
    assert!(read_back(&copy, b"f") == expected, "e2fsck's replay");
}

/// e2fsck 1.47.0 loses the log's changes to the neighbours of a fast-committed inode in the
/// journal inode's inode-table block (`Filesystem::shares_journal_inode_block`): such inodes
/// (1 to 16 with 4 KiB blocks) commit instead, and a crash is then repaired alike by e2fsck.
#[test]
fn inodes_beside_the_journal_inode_commit_so_e2fsck_1_47_replays_them_right() {
    let Some((_scratch, image)) =
        fresh_image("fsync-journal-itable", &["-b", "4096", "-O", "fast_commit"])
    else {
        return;
    };
    let fs = Filesystem::open(open_device(&image), fsync_journal()).unwrap();
    let near = fs.create(ROOT_INO, b"near", 0o644, 0, 0).unwrap().ino;
    let beside = fs.create(ROOT_INO, b"beside", 0o644, 0, 0).unwrap().ino;
    let far: Vec<u32> = (0..16)
        .map(|k| fs.create(ROOT_INO, format!("far{k}").as_bytes(), 0o644, 0, 0).unwrap().ino)
        .collect();
    let far = *far.last().unwrap();
    assert!(near <= 16 && beside <= 16 && far > 16, "{near} {beside} {far}");
    fs.write(near, 0, &chunk(1, 4000)).unwrap();
    fs.write(far, 0, &chunk(1, 4000)).unwrap();
    fs.write(beside, 0, &chunk(2, 1000)).unwrap();
    fs.sync().unwrap();
    // The full commit changes `beside`; the fsyncs after it are of `near` and `far`.
    fs.setattr(beside, &fs::SetAttr { size: Some(3005), ..Default::default() }).unwrap();
    fs.sync().unwrap();
    fs.write(near, 4000, &chunk(3, 5000)).unwrap();
    fs.fsync(near, false).unwrap();
    fs.write(far, 4000, &chunk(3, 5000)).unwrap();
    fs.fsync(far, false).unwrap();
    let stats = fs.journal().stats();
    assert_eq!(stats.fast_commits, 1, "only `far` is a fast commit: {stats:?}");
    assert!(
        stats.fast_commit_fallbacks.iter().any(|(r, _)| r.contains("journal inode's table block")),
        "{:?}",
        stats.fast_commit_fallbacks
    );
    fs.crash();
    e2fsck_fy(&image);
    assert_eq!(read_back(&image, b"beside").len(), 3005, "e2fsck kept the full commit");
    assert_eq!(read_back(&image, b"near").len(), 9000);
    assert_eq!(read_back(&image, b"far15").len(), 9000);
}

/// A file with an external xattr block commits: the kernel's fast-commit replay and e2fsck
/// 1.47.0's recompute i_blocks from the extent tree alone, without the xattr block (found by
/// the crash explorer: "i_blocks is 16, should be 24" after either replay).
#[test]
fn a_file_with_an_xattr_block_commits_so_the_kernel_and_e2fsck_count_its_blocks() {
    let Some((scratch, image)) =
        fresh_image("fsync-journal-xattr-block", &["-b", "4096", "-O", "fast_commit"])
    else {
        return;
    };
    let fs = Filesystem::open(open_device(&image), fsync_journal()).unwrap();
    let names: Vec<u32> = (0..20)
        .map(|k| fs.create(ROOT_INO, format!("f{k}").as_bytes(), 0o644, 0, 0).unwrap().ino)
        .collect();
    let (plain, tagged) = (names[18], names[19]);
    // A value too large for the inode's extra space: it goes to an xattr block.
    fs.setxattr(tagged, b"user.big", &[7u8; 1500], fs::SetMode::Any).unwrap();
    for ino in [plain, tagged] {
        fs.write(ino, 0, &chunk(1, 5000)).unwrap();
    }
    fs.sync().unwrap();
    assert_ne!(fs.getattr(tagged).unwrap().blocks, fs.getattr(plain).unwrap().blocks);
    for ino in [plain, tagged] {
        fs.write(ino, 5000, &chunk(2, 3000)).unwrap();
        fs.fsync(ino, false).unwrap();
    }
    let stats = fs.journal().stats();
    assert_eq!(stats.fast_commits, 1, "only the file without an xattr block: {stats:?}");
    assert!(stats.fast_commit_fallbacks.iter().any(|(r, _)| r.starts_with("xattr block")));
    fs.crash();
    let copy = scratch.path("kernel.img");
    std::fs::copy(&image, &copy).unwrap();
    let repaired = e2fsck_fy(&image);
    assert!(!repaired.contains("i_blocks"), "e2fsck's replay miscounted:\n{repaired}");
    assert_fsck_clean(&image);
    if can_loop_mount("fsync_journal xattr block") {
        drop(Mount::new(&copy, scratch.path("mnt")).expect("loop mount"));
        assert_fsck_clean(&copy);
    }
}
