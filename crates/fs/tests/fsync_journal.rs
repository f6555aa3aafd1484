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

/// Files `f0`, `f1`, ... in the root (past the journal inode's inode-table block once there
/// are more than 16 or so), their inode numbers in order.
fn create_files(fs: &Filesystem, count: usize) -> Vec<u32> {
    (0..count)
        .map(|k| fs.create(ROOT_INO, format!("f{k}").as_bytes(), 0o644, 0, 0).unwrap().ino)
        .collect()
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

/// Recovers the crash image at `image` three ways: quill's recovery (in place), `e2fsck -fy`
/// and a kernel loop mount (each on a copy; the kernel's only where loop mounts work). Each
/// recovered image must pass `e2fsck -fn`, and `check` runs on each through quill, with the
/// recoverer's name.
fn recover_three_ways(scratch: &Scratch, image: &Path, check: impl Fn(&Filesystem, &str)) {
    let by_e2fsck = scratch.path("e2fsck.img");
    let by_kernel = scratch.path("kernel.img");
    std::fs::copy(image, &by_e2fsck).unwrap();
    std::fs::copy(image, &by_kernel).unwrap();
    let mut recovered = vec![(image.to_path_buf(), "quill")];
    println!("e2fsck -fy:\n{}", e2fsck_fy(&by_e2fsck));
    recovered.push((by_e2fsck, "e2fsck"));
    if can_loop_mount("fsync_journal kernel replay") {
        drop(Mount::new(&by_kernel, scratch.path("mnt")).expect("loop mount"));
        recovered.push((by_kernel, "kernel"));
    }
    for (path, who) in recovered {
        let fs = Filesystem::open(open_device(&path), MountOptions::default()).unwrap();
        check(&fs, who);
        fs.unmount().unwrap();
        assert_fsck_clean(&path);
    }
}

#[test]
fn appends_fsynced_as_fast_commits_come_back_after_a_crash_with_quill_e2fsck_and_the_kernel() {
    let Some((scratch, image)) = fresh_image("fsync-journal-appends", &["-O", "fast_commit"])
    else {
        return;
    };
    let fs = Filesystem::open(open_device(&image), fsync_journal()).unwrap();
    // Created, written and fsynced: a fast commit with a CREAT record.
    let committed = fs.journal().stats().transactions;
    let ino = fs.create(ROOT_INO, b"log", 0o644, 0, 0).unwrap().ino;
    let mut expected = chunk(0, 5000);
    fs.write(ino, 0, &expected).unwrap();
    fs.fsync(ino, false).unwrap();
    assert_eq!(fs.journal().stats().fast_commits, 1, "{:?}", fallbacks(&fs));
    // Appends, each fsynced: fast commits, and the transaction stays uncommitted.
    for round in 1..=5u8 {
        let more = chunk(round, 3000 + 700 * usize::from(round));
        fs.write(ino, expected.len() as u64, &more).unwrap();
        expected.extend_from_slice(&more);
        fs.fsync(ino, round % 2 == 0).unwrap();
    }
    let stats = fs.journal().stats();
    assert_eq!(stats.fast_commits, 6, "{stats:?}");
    assert_eq!(stats.transactions, committed, "no full commit for the fast-committed fsyncs");
    // A second fsync with nothing new writes nothing.
    fs.fsync(ino, false).unwrap();
    assert_eq!(fs.journal().stats().fast_commits, 6);
    fs.crash();

    // The crash image, three ways.
    recover_three_ways(&scratch, &image, |fs, who| {
        let got = read_all(fs, fs.lookup(ROOT_INO, b"log").unwrap().ino).unwrap();
        assert_eq!(got.len(), expected.len(), "{who}'s replay: the size of the last fsync");
        assert!(got == expected, "{who}'s replay: the bytes of every fsync");
    });
}

/// Two files written in turn, a block every other block (a hole between), each write
/// fsynced: each file's mapping is many short extents and holes. A fast commit carries only
/// the ranges changed since the file's last durable one (as the kernel's does), so each stays
/// one area block instead of growing with every extent and hole the transaction made; replay
/// applies them one after the other, and quill, e2fsck and the kernel all bring back every
/// byte.
#[test]
fn a_fast_commit_carries_only_the_ranges_changed_since_the_files_last_one() {
    let Some((scratch, image)) =
        fresh_image("fsync-journal-deltas", &["-b", "1024", "-O", "fast_commit"])
    else {
        return;
    };
    let fs = Filesystem::open(open_device(&image), fsync_journal()).unwrap();
    let files = create_files(&fs, 18);
    let (a, b) = (files[16], files[17]);
    fs.sync().unwrap();
    let mut expected = [Vec::new(), Vec::new()];
    for round in 0..150u8 {
        for (k, ino) in [a, b].into_iter().enumerate() {
            let more = chunk(round.wrapping_add(k as u8 * 101), 1024);
            expected[k].resize(expected[k].len() + 1024, 0);
            fs.write(ino, expected[k].len() as u64, &more).unwrap();
            expected[k].extend_from_slice(&more);
            fs.fsync(ino, round % 2 == 1).unwrap();
        }
    }
    let stats = fs.journal().stats();
    println!(
        "{} fast commits in {} writes of {} blocks; fallbacks {:?}",
        stats.fast_commits,
        stats.fast_commit_writes,
        stats.fast_commit_blocks,
        fallbacks(&fs)
    );
    assert!(stats.fast_commits >= 200, "{stats:?}");
    // Carrying every extent and hole since the transaction began took 335 blocks for 295.
    assert!(stats.fast_commit_blocks * 10 <= stats.fast_commit_writes * 11, "{stats:?}");
    fs.crash();

    recover_three_ways(&scratch, &image, |fs, who| {
        for (k, name) in ["f16", "f17"].into_iter().enumerate() {
            let got = read_all(fs, fs.lookup(ROOT_INO, name.as_bytes()).unwrap().ino).unwrap();
            assert!(
                got == expected[k],
                "{who}: {name} has {} of {} bytes",
                got.len(),
                expected[k].len()
            );
        }
    });
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
    assert_eq!(fs.journal().stats().fast_commits, 4);
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
    fs.create(ROOT_INO, b"x", 0o644, 0, 0).unwrap();
    fs.sync().unwrap();
    let before = fs.journal().stats();
    // Each change below, then an fsync that must commit.
    fs.setxattr(a, b"user.k", b"v", fs::SetMode::Any).unwrap();
    fs.fsync(a, false).unwrap();
    // An exchange: ext4's fast commit has no record for it either.
    let exchange = fs::RenameFlags { exchange: true, ..fs::RenameFlags::default() };
    fs.rename(ROOT_INO, b"a", ROOT_INO, b"x", exchange).unwrap();
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
    for reason in ["xattr", "rename", "link", "mkdir"] {
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

/// A regular file created and fsynced in the running transaction is a fast commit ending in a
/// CREAT record, where replay can add its name to the parent as the last full commit left it;
/// where it could not (`Filesystem::create_record`), the fsync commits and says why. After a
/// crash, quill, `e2fsck -fy` and the kernel all bring back every fast-committed file.
#[test]
fn created_files_fsynced_as_fast_commits_come_back_and_what_replay_could_not_link_commits() {
    let Some((scratch, image)) =
        fresh_image("fsync-journal-creates", &["-b", "1024", "-O", "fast_commit"])
    else {
        return;
    };
    let fs = Filesystem::open(open_device(&image), fsync_journal()).unwrap();
    // Past the journal inode's table block, and a directory of its own that commits.
    for k in 0..16 {
        fs.create(ROOT_INO, format!("pre{k}").as_bytes(), 0o644, 0, 0).unwrap();
    }
    let dir = fs.mkdir(ROOT_INO, b"dir", 0o755, 0, 0).unwrap().ino;
    let doomed = fs.create(ROOT_INO, b"doomed", 0o644, 0, 0).unwrap().ino;
    fs.sync().unwrap();
    let reasons = |fs: &Filesystem| -> Vec<String> {
        fallbacks(fs).into_iter().map(|(r, _)| r).collect::<Vec<_>>()
    };
    let mut expected: Vec<(u32, &[u8], Vec<u8>)> = Vec::new();

    // Files created in `dir` (which has room) and fsynced: fast commits, but for the first.
    // `dir` went to a group of its own, initialized in the last commit: e2fsck 1.47.0 would
    // replay with that group's old descriptor, so the first fsync commits and checkpoints.
    let commits = fs.journal().stats().transactions;
    for (k, name) in [&b"a"[..], b"b", b"c"].into_iter().enumerate() {
        let ino = fs.create(dir, name, 0o640, 0, 0).unwrap().ino;
        let bytes = chunk(k as u8, 1500 + 2000 * k);
        fs.write(ino, 0, &bytes).unwrap();
        fs.fsync(ino, k == 1).unwrap();
        expected.push((dir, name, bytes));
    }
    let stats = fs.journal().stats();
    assert_eq!((stats.fast_commits, stats.transactions), (2, commits + 1), "{:?}", reasons(&fs));
    assert_eq!(reasons(&fs), ["group initialized in the log (e2fsck 1.47.0)"]);

    // A name removed from the root (one block) in this transaction: its space is still in use
    // at the last commit, but the block had room for the new name then, and replay puts it in
    // that block (the only one): a fast commit.
    let fast = fs.journal().stats().fast_commits;
    fs.unlink(ROOT_INO, b"doomed").unwrap();
    let after_unlink = fs.create(ROOT_INO, b"after-unlink", 0o644, 0, 0).unwrap().ino;
    assert_ne!(after_unlink, doomed, "a number freed in the running transaction is taken last");
    fs.write(after_unlink, 0, b"root").unwrap();
    fs.fsync(after_unlink, false).unwrap();
    assert_eq!(fs.journal().stats().fast_commits, fast + 1, "{:?}", reasons(&fs));
    expected.push((ROOT_INO, b"after-unlink", b"root".to_vec()));
    // A name removed and made again in one transaction: the fast commit deletes the old file
    // first.
    fs.sync().unwrap();
    fs.unlink(dir, b"c").unwrap();
    let again = fs.create(dir, b"c", 0o644, 0, 0).unwrap().ino;
    fs.write(again, 0, b"again").unwrap();
    fs.fsync(again, false).unwrap();
    assert_eq!(fs.journal().stats().fast_commits, fast + 2, "{:?}", reasons(&fs));
    expected.retain(|(_, name, _)| *name != b"c");
    expected.push((dir, b"c", b"again".to_vec()));
    // A file made in the same transaction has no name at replay unless a fast commit gave it
    // one: its name reused commits, for that reason.
    let short_lived = fs.create(dir, b"d", 0o644, 0, 0).unwrap().ino;
    fs.write(short_lived, 0, b"first").unwrap();
    fs.unlink(dir, b"d").unwrap();
    let d = fs.create(dir, b"d", 0o644, 0, 0).unwrap().ino;
    fs.write(d, 0, b"second").unwrap();
    fs.fsync(d, false).unwrap();
    assert!(reasons(&fs).contains(&"name reused".to_string()), "{:?}", reasons(&fs));
    expected.push((dir, b"d", b"second".to_vec()));

    // A file in a directory made in the same transaction; then names until `dir`, with 1 KiB
    // blocks, needs a new block: the file whose entry grew it commits, and so do the next.
    let new_dir = fs.mkdir(dir, b"new", 0o755, 0, 0).unwrap().ino;
    let inner = fs.create(new_dir, b"inner", 0o644, 0, 0).unwrap().ino;
    fs.fsync(inner, false).unwrap();
    assert!(reasons(&fs).contains(&"parent directory new".to_string()));
    let blocks = fs.getattr(dir).unwrap().blocks;
    let mut k = 0;
    while fs.getattr(dir).unwrap().blocks == blocks {
        fs.create(dir, format!("filler-{k:03}-{}", "x".repeat(40)).as_bytes(), 0o644, 0, 0)
            .unwrap();
        k += 1;
    }
    let grown = fs.create(dir, b"grown", 0o644, 0, 0).unwrap().ino;
    fs.fsync(grown, false).unwrap();
    let grew = "parent directory grew or was reshaped".to_string();
    assert!(reasons(&fs).contains(&grew), "{:?}", reasons(&fs));
    fs.sync().unwrap();

    // And after that commit, fast commits again: in `dir`, now with room, and in the root.
    for (k, (parent, name)) in
        [(dir, &b"late"[..]), (ROOT_INO, b"late-root")].into_iter().enumerate()
    {
        let ino = fs.create(parent, name, 0o600, 0, 0).unwrap().ino;
        let bytes = chunk(9 + k as u8, 9000);
        fs.write(ino, 0, &bytes).unwrap();
        fs.fsync(ino, false).unwrap();
        expected.push((parent, name, bytes));
    }
    let stats = fs.journal().stats();
    assert_eq!(stats.fast_commits, 6, "a, b, after-unlink, c, late, late-root: {:?}", reasons(&fs));
    fs.crash();

    recover_three_ways(&scratch, &image, |fs, who| {
        for (parent, name, bytes) in &expected {
            let name_text = String::from_utf8_lossy(name);
            let ino =
                fs.lookup(*parent, name).unwrap_or_else(|e| panic!("{who}: {name_text}: {e}"));
            assert!(read_all(fs, ino.ino).unwrap() == *bytes, "{who}: {name_text}'s bytes");
        }
    });
}

/// A linear directory of more than one block (no dir_index): replay puts a name in the first
/// block with room for it, which need not be the block it is in now, so a file created in a
/// block that lost a name in the running transaction commits instead.
#[test]
fn a_creation_in_a_linear_directory_block_that_lost_a_name_commits() {
    let Some((_scratch, image)) =
        fresh_image("fsync-journal-linear", &["-b", "1024", "-O", "fast_commit,^dir_index"])
    else {
        return;
    };
    let fs = Filesystem::open(open_device(&image), fsync_journal()).unwrap();
    let long = "x".repeat(60);
    let mut k = 0;
    while fs.getattr(ROOT_INO).unwrap().size < 3 * 1024 {
        fs.create(ROOT_INO, format!("{long}-{k:03}").as_bytes(), 0o644, 0, 0).unwrap();
        k += 1;
    }
    fs.sync().unwrap();
    // The first name, in the first block, which is full but for it.
    fs.unlink(ROOT_INO, format!("{long}-000").as_bytes()).unwrap();
    let ino = fs.create(ROOT_INO, b"new", 0o644, 0, 0).unwrap().ino;
    fs.fsync(ino, false).unwrap();
    let reasons: Vec<String> = fallbacks(&fs).into_iter().map(|(r, _)| r).collect();
    assert!(reasons.contains(&"directory block lost a name".to_string()), "{reasons:?}");
    fs.unmount().unwrap();
    common::assert_fsck_clean(&image);
}

/// Renames of regular files, then an fsync of the file: fast commits with a LINK of the new
/// name and an UNLINK of the old, as ext4's rename tracks them, the file a new name replaced
/// deleted first. To a free name, over another file, into another directory, of a file
/// created in the same transaction (once its CREAT is durable, and before), twice in a row,
/// and back to a name that lost its file earlier in the transaction. After a crash, quill,
/// `e2fsck -fy` and the kernel each find every such file under its new name only, with its
/// bytes, and no replaced file left.
#[test]
fn renamed_files_fsynced_as_fast_commits_have_their_new_names_after_a_crash() {
    let Some((scratch, image)) = fresh_image("fsync-journal-renames", &["-O", "fast_commit"])
    else {
        return;
    };
    let fs = Filesystem::open(open_device(&image), fsync_journal()).unwrap();
    create_files(&fs, 20);
    let sub = fs.mkdir(ROOT_INO, b"sub", 0o755, 0, 0).unwrap().ino;
    let mut old_files = Vec::new();
    for name in ["plain", "src", "target", "mover", "victim", "twice", "gone", "back"] {
        let ino = fs.create(ROOT_INO, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
        fs.write(ino, 0, &chunk(old_files.len() as u8, 3000)).unwrap();
        old_files.push((name, ino));
    }
    fs.sync().unwrap();
    // A first fsync that commits whatever the mkdir's group left in the log
    // (`group initialized in the log`), so that the renames below are all fast commits.
    let plain = old_files[0].1;
    fs.write(plain, 0, b"warm").unwrap();
    fs.fsync(plain, false).unwrap();
    let before = fs.journal().stats();
    let ino_of = |name: &str| old_files.iter().find(|(n, _)| *n == name).unwrap().1;
    let rename = |from: (u32, &str), to: (u32, &str)| {
        let (a, b) = (from.1.as_bytes(), to.1.as_bytes());
        fs.rename(from.0, a, to.0, b, fs::RenameFlags::default()).unwrap();
    };
    // (parent, name, bytes): what each recovery must find; and the names it must not.
    let mut expected: Vec<(u32, &str, Vec<u8>)> = Vec::new();
    let mut fsync_after = |ino: u32, parent: u32, name: &'static str, more: &[u8]| {
        fs.write(ino, 0, more).unwrap();
        fs.fsync(ino, false).unwrap();
        expected.push((parent, name, read_all(&fs, ino).unwrap()));
    };
    // To a free name.
    rename((ROOT_INO, "plain"), (ROOT_INO, "plain-renamed"));
    fsync_after(plain, ROOT_INO, "plain-renamed", b"one");
    // Over another file, which replay deletes first.
    rename((ROOT_INO, "src"), (ROOT_INO, "target"));
    fsync_after(ino_of("src"), ROOT_INO, "target", b"two");
    // Into another directory.
    rename((ROOT_INO, "mover"), (sub, "moved"));
    fsync_after(ino_of("mover"), sub, "moved", b"three");
    // A file created here: fsynced (its CREAT durable), renamed, fsynced again.
    let born = fs.create(ROOT_INO, b"tmp-a", 0o644, 0, 0).unwrap().ino;
    fs.write(born, 0, &chunk(40, 5000)).unwrap();
    fs.fsync(born, false).unwrap();
    rename((ROOT_INO, "tmp-a"), (ROOT_INO, "final-a"));
    fsync_after(born, ROOT_INO, "final-a", b"four");
    // A file created here and renamed over another before its first fsync (write, rename
    // over: the way editors save).
    let saved = fs.create(sub, b"tmp-b", 0o644, 0, 0).unwrap().ino;
    fs.write(saved, 0, &chunk(41, 7000)).unwrap();
    rename((sub, "tmp-b"), (ROOT_INO, "victim"));
    fsync_after(saved, ROOT_INO, "victim", b"five");
    // Twice, then one fsync.
    rename((ROOT_INO, "twice"), (ROOT_INO, "twice-1"));
    rename((ROOT_INO, "twice-1"), (sub, "twice-2"));
    fsync_after(ino_of("twice"), sub, "twice-2", b"six");
    // To a name whose file was deleted earlier in this transaction.
    fs.unlink(ROOT_INO, b"gone").unwrap();
    rename((ROOT_INO, "back"), (ROOT_INO, "gone"));
    fsync_after(ino_of("back"), ROOT_INO, "gone", b"seven");
    let stats = fs.journal().stats();
    assert_eq!(stats.fast_commits, before.fast_commits + 8, "{:?}", fallbacks(&fs));
    assert_eq!(stats.transactions, before.transactions, "no full commit for the renames");
    fs.crash();

    let absent: [(u32, &str); 7] = [
        (ROOT_INO, "plain"),
        (ROOT_INO, "src"),
        (ROOT_INO, "mover"),
        (ROOT_INO, "tmp-a"),
        (sub, "tmp-b"),
        (ROOT_INO, "twice"),
        (ROOT_INO, "twice-1"),
    ];
    let replaced = [ino_of("target"), ino_of("victim"), ino_of("gone")];
    recover_three_ways(&scratch, &image, |fs, who| {
        for (parent, name, bytes) in &expected {
            let ino = fs
                .lookup(*parent, name.as_bytes())
                .unwrap_or_else(|e| panic!("{who}: {name}: {e}"))
                .ino;
            assert!(read_all(fs, ino).unwrap() == *bytes, "{who}: {name}'s bytes");
        }
        for (parent, name) in absent {
            assert!(fs.lookup(parent, name.as_bytes()).is_err(), "{who}: {name} is still there");
        }
        for ino in replaced {
            assert!(fs.getattr(ino).is_err(), "{who}: replaced inode {ino} is still in use");
        }
    });
}

/// A rename over a file with in-inode xattrs commits: the fast commit's INODE record would
/// not reach the xattrs, and e2fsck 1.47.0's replay would leave the deleted file unattached
/// with them, for its full check to reconnect to lost+found (crash explorer seed
/// 1795867448165962330). Without xattrs the same rename is a fast commit.
#[test]
fn a_rename_over_a_file_with_in_inode_xattrs_commits_so_e2fsck_has_nothing_to_reconnect() {
    let Some((scratch, image)) = fresh_image("fsync-journal-rename-xattr", &["-O", "fast_commit"])
    else {
        return;
    };
    let fs = Filesystem::open(open_device(&image), fsync_journal()).unwrap();
    create_files(&fs, 20);
    let make = |name: &str, round: u8| {
        let ino = fs.create(ROOT_INO, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
        fs.write(ino, 0, &chunk(round, 3000)).unwrap();
        ino
    };
    let (plain_src, plain_dst) = (make("plain-src", 1), make("plain-dst", 2));
    let (tagged_src, tagged_dst) = (make("tagged-src", 3), make("tagged-dst", 4));
    fs.setxattr(tagged_dst, b"user.q1", b"xy", fs::SetMode::Any).unwrap();
    fs.sync().unwrap();
    // Commits whatever the creations' group left in the log (`group initialized in the log`).
    fs.write(plain_src, 0, b"warm").unwrap();
    fs.fsync(plain_src, false).unwrap();
    let rename_over = |src: &str, dst: &str| {
        let flags = fs::RenameFlags::default();
        fs.rename(ROOT_INO, src.as_bytes(), ROOT_INO, dst.as_bytes(), flags).unwrap();
    };
    let before = fs.journal().stats();
    rename_over("plain-src", "plain-dst");
    fs.fsync(plain_src, false).unwrap();
    let after_plain = fs.journal().stats();
    assert_eq!(after_plain.fast_commits, before.fast_commits + 1, "{:?}", fallbacks(&fs));
    rename_over("tagged-src", "tagged-dst");
    fs.fsync(tagged_src, false).unwrap();
    let after_tagged = fs.journal().stats();
    assert_eq!(after_tagged.fast_commits, after_plain.fast_commits, "{:?}", fallbacks(&fs));
    assert!(fallbacks(&fs).iter().any(|(r, _)| r == "name reused"), "{:?}", fallbacks(&fs));
    let expected = [
        ("plain-dst", read_all(&fs, plain_src).unwrap()),
        ("tagged-dst", read_all(&fs, tagged_src).unwrap()),
    ];
    fs.crash();

    let repaired = scratch.path("repaired.img");
    std::fs::copy(&image, &repaired).unwrap();
    let report = e2fsck_fy(&repaired);
    assert!(!report.contains("Unattached") && !report.contains("lost+found"), "{report}");
    recover_three_ways(&scratch, &image, |fs, who| {
        for (name, bytes) in &expected {
            let ino = fs.lookup(ROOT_INO, name.as_bytes()).unwrap().ino;
            assert!(read_all(fs, ino).unwrap() == *bytes, "{who}: {name}'s bytes");
        }
        for gone in [plain_dst, tagged_dst] {
            assert!(fs.getattr(gone).is_err(), "{who}: replaced inode {gone} is still in use");
        }
    });
}

/// varmail's pattern in one large (indexed) directory: delete a file, create another (one in
/// three under the name just removed), write and fsync it. A creation is a fast commit unless
/// its leaf lost a name in the running transaction and had no room left at its start for the
/// names fast-committed into it; after a crash, quill, `e2fsck -fy` and the kernel each bring back
/// every fsynced file, and a deleted file is either gone or whole.
#[test]
fn delete_then_create_in_a_large_directory_fast_commits_where_the_leaf_allows() {
    let Some((scratch, image)) =
        // A fast-commit area of 1,024 blocks holds every fast commit of the run: a full area
        // would commit the transaction, and each commit gives the leaves their room back
        // before one has run out (the default area, 64 blocks here, filled 4 times in one
        // CI run and no leaf ran out in 280 creations).
        fresh_image(
            "fsync-journal-varmail",
            &["-b", "1024", "-O", "fast_commit", "-J", "fast_commit_size=1024"],
        )
    else {
        return;
    };
    // No commit on the interval: the transactions end only where fallbacks end them, so
    // which leaves run out of room does not depend on the machine's speed.
    let mut options = fsync_journal();
    options.journal.commit_interval = std::time::Duration::from_secs(3600);
    let fs = Filesystem::open(open_device(&image), options).unwrap();
    let dir = fs.mkdir(ROOT_INO, b"mail", 0o755, 0, 0).unwrap().ino;
    let mut live: Vec<(String, Vec<u8>)> = Vec::new();
    for k in 0..300 {
        let name = format!("message-{k:04}");
        let ino = fs.create(dir, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
        let bytes = chunk(k as u8, 700);
        fs.write(ino, 0, &bytes).unwrap();
        live.push((name, bytes));
    }
    fs.sync().unwrap();
    assert!(fs.getattr(dir).unwrap().size >= 4 * 1024, "several leaves");
    let mut deleted: Vec<(String, Vec<u8>)> = Vec::new();
    let mut fsynced: Vec<(String, Vec<u8>)> = Vec::new();
    // Crash images taken along the way: each with what must (and may) be there.
    type Files = Vec<(String, Vec<u8>)>;
    let mut cuts: Vec<(std::path::PathBuf, Files, Files, Files)> = Vec::new();
    let seed = 0x5eed_u64;
    println!("seed {seed:#x}");
    let mut rng = seed;
    let mut next = |n: usize| {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((rng >> 33) as usize) % n
    };
    let leaf_full = "directory leaf without room at the last commit".to_string();
    let mut k = 0usize;
    // 60 creations at least, and on until a leaf has run out of its room (which leaves do
    // depends on mkfs.ext4's random hash seed, so not on a fixed count).
    while k < 60 || !fallbacks(&fs).iter().any(|(r, _)| *r == leaf_full) {
        assert!(k < 280, "no leaf ran out of room in {k} creations: {:?}", fallbacks(&fs));
        let (name, bytes) = live.swap_remove(next(live.len()));
        fs.unlink(dir, name.as_bytes()).unwrap();
        // One creation in three takes the name just removed (of a file from before the
        // transaction): its fast commit deletes the old file first.
        let name = if k.is_multiple_of(3) {
            name
        } else {
            deleted.push((name, bytes));
            format!("new-{k:03}-{}", next(1000))
        };
        let ino = fs.create(dir, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
        let bytes = chunk((100 + k) as u8, 500 + 97 * (k % 60));
        fs.write(ino, 0, &bytes).unwrap();
        fs.fsync(ino, false).unwrap();
        fsynced.push((name, bytes));
        if k == 19 || k == 39 {
            // A crash here: what the device holds now (all of it written, some not flushed).
            let cut = scratch.path(&format!("cut-{k}.img"));
            std::fs::copy(&image, &cut).unwrap();
            cuts.push((cut, fsynced.clone(), live.clone(), deleted.clone()));
        }
        k += 1;
    }
    let stats = fs.journal().stats();
    println!("{} fast commits, fallbacks {:?}", stats.fast_commits, stats.fast_commit_fallbacks);
    // A leaf that lost a name admits new names while its room at the last commit holds
    // them all, so most creations fast-commit.
    assert!(stats.fast_commits * 10 >= k as u64 * 8, "{k} creations: {stats:?}");
    let reasons: Vec<String> = fallbacks(&fs).into_iter().map(|(r, _)| r).collect();
    assert!(!reasons.contains(&"directory block lost a name".to_string()), "{reasons:?}");
    assert!(!reasons.contains(&"name reused".to_string()), "{reasons:?}");
    fs.crash();
    cuts.push((image, fsynced, live, deleted));

    for (image, fsynced, live, deleted) in &cuts {
        let at = image.file_name().unwrap().to_string_lossy().into_owned();
        recover_three_ways(&scratch, image, |fs, who| {
            let read = |name: &str| -> Option<Vec<u8>> {
                let ino = fs.lookup(dir, name.as_bytes()).ok()?.ino;
                Some(read_all(fs, ino).unwrap())
            };
            for (name, bytes) in fsynced.iter().chain(live) {
                assert!(read(name).as_ref() == Some(bytes), "{at}, {who}: {name}");
            }
            for (name, bytes) in deleted {
                let got = read(name);
                assert!(got.is_none() || got.as_ref() == Some(bytes), "{at}, {who}: {name}");
            }
        });
    }
}

/// A new file in the inode slot of a deleted one whose in-inode xattrs are still there: the
/// INODE record carries only the first `128 + i_extra_isize` bytes, so a replay would give the
/// new file the old one's xattrs (found by the crash explorer). The fsync commits instead.
#[test]
fn a_file_created_where_a_deleted_inode_left_xattrs_commits_so_they_do_not_come_back() {
    let Some((_scratch, image)) =
        fresh_image("fsync-journal-stale-xattrs", &["-b", "4096", "-O", "fast_commit"])
    else {
        return;
    };
    let fs = Filesystem::open(open_device(&image), fsync_journal()).unwrap();
    for k in 0..16 {
        fs.create(ROOT_INO, format!("pre{k}").as_bytes(), 0o644, 0, 0).unwrap();
    }
    let old = fs.create(ROOT_INO, b"old", 0o644, 0, 0).unwrap().ino;
    fs.setxattr(old, b"user.tag", b"small", fs::SetMode::Any).unwrap();
    fs.sync().unwrap();
    fs.unlink(ROOT_INO, b"old").unwrap();
    fs.sync().unwrap();
    let new = fs.create(ROOT_INO, b"new", 0o644, 0, 0).unwrap().ino;
    assert_eq!(new, old, "the slot is reused once the delete is committed");
    fs.write(new, 0, b"fresh").unwrap();
    fs.fsync(new, false).unwrap();
    let stats = fs.journal().stats();
    assert_eq!(stats.fast_commits, 0, "{stats:?}");
    assert!(fallbacks(&fs).iter().any(|(r, _)| r == "inode slot with old in-inode xattrs"));
    fs.crash();
    e2fsck_fy(&image);
    let fs = Filesystem::open(open_device(&image), MountOptions::default()).unwrap();
    assert!(fs.listxattr(new).unwrap().is_empty(), "the old file's xattrs came back");
    assert_eq!(read_all(&fs, new).unwrap(), b"fresh");
    fs.unmount().unwrap();
}

/// The journal superblock of the image at `image`.
fn journal_superblock(image: &Path) -> ondisk::jbd2::JournalSuperblock {
    let dev = open_device(image);
    let location = fs::Ext4Image::open(dev.clone()).unwrap().journal_location().unwrap();
    journal::superblock::read_superblock(&*dev, &location).unwrap()
}

fn per_core_areas() -> MountOptions {
    let mut options = fsync_journal();
    options.journal.fc_areas = 2;
    options
}

/// iJournaling's per-core areas (`fc_areas = 2`): fast commits of files with odd and even
/// inode numbers go to two areas, written each under its own lock. While they hold fast
/// commits the journal has INCOMPAT_QUILL_FC_AREAS: after a crash stock e2fsck and the kernel
/// refuse the image (changing nothing) and quill recovers every fsync; a full commit, or an
/// unmount, leaves a standard journal that both accept.
#[test]
fn per_core_areas_are_flagged_while_they_hold_fast_commits_and_only_quill_replays_them() {
    let Some((scratch, image)) =
        fresh_image("fsync-journal-per-core", &["-b", "4096", "-O", "fast_commit"])
    else {
        return;
    };
    let quill_flag = ondisk::jbd2::feature::INCOMPAT_QUILL_FC_AREAS;
    let fs = Filesystem::open(open_device(&image), per_core_areas()).unwrap();
    let files: Vec<u32> = (0..24)
        .map(|k| fs.create(ROOT_INO, format!("f{k}").as_bytes(), 0o644, 0, 0).unwrap().ino)
        .collect();
    let files = &files[16..];
    fs.sync().unwrap();
    assert_eq!(journal_superblock(&image).feature_incompat & quill_flag, 0);
    let mut expected = Vec::new();
    for (k, &ino) in files.iter().enumerate() {
        let bytes = chunk(k as u8, 3000 + 500 * k);
        fs.write(ino, 0, &bytes).unwrap();
        fs.fsync(ino, false).unwrap();
        expected.push((ino, bytes));
    }
    assert_eq!(fs.journal().stats().fast_commits, files.len() as u64);
    let sb = journal_superblock(&image);
    assert_ne!(sb.feature_incompat & quill_flag, 0, "flagged while the areas hold fast commits");
    assert_eq!(sb.fc_areas, 2);
    // A full commit supersedes them: the journal is standard again (the commit stage
    // clears the flag once it has woken the commit's waiters).
    fs.sync().unwrap();
    let cleared = (0..500).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(10));
        journal_superblock(&image).feature_incompat & quill_flag == 0
    });
    assert!(cleared, "the flag outlived the full commit that superseded the areas");
    for (k, (ino, bytes)) in expected.iter_mut().enumerate() {
        let more = chunk(50 + k as u8, 2000);
        fs.write(*ino, bytes.len() as u64, &more).unwrap();
        bytes.extend_from_slice(&more);
        fs.fsync(*ino, true).unwrap();
    }
    fs.crash();

    // Stock tools refuse the crash image, and change nothing.
    let before = std::fs::read(&image).unwrap();
    let out = std::process::Command::new("e2fsck").arg("-fy").arg(&image).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.code().unwrap_or(0) >= 4, "e2fsck -fy accepted it: {text}");
    assert!(text.contains("unknown incompatible feature"), "{text}");
    assert!(std::fs::read(&image).unwrap() == before, "e2fsck changed the image");
    if can_loop_mount("per-core areas refused by the kernel") {
        let copy = scratch.path("kernel.img");
        std::fs::copy(&image, &copy).unwrap();
        let mounted = common::loop_device_command("mount")
            .args(["-o", "loop"])
            .arg(&copy)
            .arg(scratch.path("mnt"))
            .output()
            .unwrap();
        assert!(!mounted.status.success(), "the kernel mounted per-core areas");
    }

    // quill recovers every fsync from both areas, and leaves a standard journal.
    let fs = Filesystem::open(open_device(&image), MountOptions::default()).unwrap();
    for (ino, bytes) in &expected {
        assert!(read_all(&fs, *ino).unwrap() == *bytes, "inode {ino} after quill's recovery");
    }
    fs.unmount().unwrap();
    assert_fsck_clean(&image);
    let sb = journal_superblock(&image);
    assert_eq!((sb.feature_incompat & quill_flag, sb.fc_areas), (0, 0));

    // A mount with per-core areas that fast-commits and unmounts leaves a standard journal.
    let fs = Filesystem::open(open_device(&image), per_core_areas()).unwrap();
    fs.write(files[0], 0, b"after").unwrap();
    fs.fsync(files[0], false).unwrap();
    fs.write(files[1], 0, b"after").unwrap();
    fs.fsync(files[1], false).unwrap();
    fs.unmount().unwrap();
    assert_fsck_clean(&image);
    assert_eq!(journal_superblock(&image).feature_incompat & quill_flag, 0);
}

/// Per-core areas and names taken over. A file's fast commits all go to its own area, the
/// records that delete the file whose name it took included (they used to follow the first
/// INODE record, the replaced file's, into that file's area, where recovery replayed them
/// before the renamed file's own CREAT: crash explorer seed 3012557888514903091). A file
/// fast-committed in the transaction is deleted by a fast commit only from its own area
/// (recovery replays area 0 before area 1, so its older fast commit would bring it back);
/// from the other area the rename commits.
#[test]
fn per_core_areas_delete_a_replaced_file_in_order_or_commit() {
    let Some((_scratch, image)) =
        fresh_image("fsync-journal-per-core-rename", &["-b", "4096", "-O", "fast_commit"])
    else {
        return;
    };
    let fs = Filesystem::open(open_device(&image), per_core_areas()).unwrap();
    let files = create_files(&fs, 40);
    let mut spare = files[16..].iter().copied();
    let mut take = |odd: bool| spare.find(|ino| (ino % 2 == 1) == odd).unwrap();
    let name_of = |ino: u32| format!("f{}", files.iter().position(|&f| f == ino).unwrap());
    for &ino in &files {
        fs.write(ino, 0, &chunk(ino as u8, 2500)).unwrap();
    }
    fs.sync().unwrap();
    let rename_over = |src: &str, dst: &str| {
        let flags = fs::RenameFlags::default();
        fs.rename(ROOT_INO, src.as_bytes(), ROOT_INO, dst.as_bytes(), flags).unwrap();
    };
    let count = |fs: &Filesystem| {
        let stats = fs.journal().stats();
        (stats.fast_commits, stats.transactions)
    };
    // What recovery must find: names with their bytes, names gone, inodes freed.
    let mut expected: Vec<(String, Vec<u8>)> = Vec::new();
    let mut absent: Vec<String> = Vec::new();
    let mut freed: Vec<u32> = Vec::new();

    // A file in area 1 fast-committed, and renamed over one in area 0 from a file in area 0:
    // its delete would follow its own fast commit in area 1; the rename commits.
    let (kept, taker) = (take(true), take(false));
    fs.write(kept, 0, b"fast-committed").unwrap();
    fs.fsync(kept, false).unwrap();
    let before = count(&fs);
    rename_over(&name_of(taker), &name_of(kept));
    fs.fsync(taker, false).unwrap();
    let after = count(&fs);
    assert_eq!(after.0, before.0, "{:?}", fallbacks(&fs));
    assert!(after.1 > before.1, "the rename committed");
    let elsewhere = "replaced file's fast commits in another area";
    assert!(fallbacks(&fs).iter().any(|(r, _)| r == elsewhere), "{:?}", fallbacks(&fs));
    expected.push((name_of(kept), read_all(&fs, taker).unwrap()));
    absent.push(name_of(taker));
    freed.push(kept);

    // The same from a file in the same area (1): a fast commit.
    let (kept, taker) = (take(true), take(true));
    fs.write(kept, 0, b"fast-committed").unwrap();
    fs.fsync(kept, false).unwrap();
    let before = count(&fs);
    rename_over(&name_of(taker), &name_of(kept));
    fs.write(taker, 0, b"same area").unwrap();
    fs.fsync(taker, false).unwrap();
    assert_eq!(count(&fs), (before.0 + 1, before.1), "{:?}", fallbacks(&fs));
    expected.push((name_of(kept), read_all(&fs, taker).unwrap()));
    absent.push(name_of(taker));
    freed.push(kept);

    // A file created and fast-committed in area 1, then renamed over a file in area 0 that
    // has no fast commit: the rename's fast commit goes to area 1, after the CREAT.
    let new = (0..2)
        .map(|k| fs.create(ROOT_INO, format!("new{k}").as_bytes(), 0o644, 0, 0).unwrap().ino)
        .collect::<Vec<_>>();
    let created = *new.iter().find(|&&ino| ino % 2 == 1).unwrap();
    let created_name = format!("new{}", new.iter().position(|&n| n == created).unwrap());
    fs.write(created, 0, &chunk(7, 6000)).unwrap();
    fs.fsync(created, false).unwrap();
    let replaced = take(false);
    let before = count(&fs);
    rename_over(&created_name, &name_of(replaced));
    fs.fsync(created, false).unwrap();
    assert_eq!(count(&fs), (before.0 + 1, before.1), "{:?}", fallbacks(&fs));
    expected.push((name_of(replaced), read_all(&fs, created).unwrap()));
    absent.push(created_name);
    freed.push(replaced);
    fs.crash();

    let fs = Filesystem::open(open_device(&image), MountOptions::default()).unwrap();
    let mut named = Vec::new();
    for (name, bytes) in &expected {
        let ino = fs.lookup(ROOT_INO, name.as_bytes()).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(read_all(&fs, ino.ino).unwrap() == *bytes, "{name}'s bytes");
        named.push(ino.ino);
    }
    for name in &absent {
        assert!(fs.lookup(ROOT_INO, name.as_bytes()).is_err(), "{name} is still there");
    }
    // A number freed by a committed rename may be a new file's by now.
    for ino in freed.into_iter().filter(|ino| !named.contains(ino)) {
        assert!(fs.getattr(ino).is_err(), "replaced inode {ino} is still in use");
    }
    fs.unmount().unwrap();
    assert_fsck_clean(&image);
}

/// A device whose flushes and FUA writes take a few milliseconds, as a disk's do: concurrent
/// fsyncs then meet at the fast-commit area.
struct SlowSync(std::sync::Arc<dyn blockdev::BlockDevice>);

impl blockdev::BlockDevice for SlowSync {
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), blockdev::DeviceError> {
        self.0.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), blockdev::DeviceError> {
        self.0.write_at(offset, data)
    }
    fn write_fua_at(&self, offset: u64, data: &[u8]) -> Result<(), blockdev::DeviceError> {
        std::thread::sleep(std::time::Duration::from_millis(1));
        self.0.write_fua_at(offset, data)
    }
    fn flush(&self) -> Result<(), blockdev::DeviceError> {
        std::thread::sleep(std::time::Duration::from_millis(3));
        self.0.flush()
    }
}

/// Concurrent fsyncs share fast commits (group commit): eight threads appending to their own
/// files and fsyncing take fewer area writes than fsyncs, and after a crash quill, e2fsck and
/// the kernel bring back every file as its last fsync left it.
#[test]
fn concurrent_fsyncs_share_fast_commits_and_each_comes_back() {
    let Some((scratch, image)) =
        fresh_image("fsync-journal-group", &["-b", "4096", "-O", "fast_commit"])
    else {
        return;
    };
    for fc_areas in [1, 2] {
        let copy = scratch.path(&format!("group-{fc_areas}.img"));
        std::fs::copy(&image, &copy).unwrap();
        let mut options = fsync_journal();
        options.journal.fc_areas = fc_areas;
        let dev = std::sync::Arc::new(SlowSync(open_device(&copy)));
        let fs = std::sync::Arc::new(Filesystem::open(dev, options).unwrap());
        let files: Vec<u32> = (0..24)
            .map(|k| fs.create(ROOT_INO, format!("f{k}").as_bytes(), 0o644, 0, 0).unwrap().ino)
            .collect();
        fs.sync().unwrap();
        let threads: Vec<_> = files[16..]
            .iter()
            .enumerate()
            .map(|(t, &ino)| {
                let fs = fs.clone();
                std::thread::spawn(move || {
                    let mut written = Vec::new();
                    for round in 0..15u8 {
                        let more = chunk(round.wrapping_add(t as u8 * 16), 700 + 37 * t);
                        fs.write(ino, written.len() as u64, &more).unwrap();
                        written.extend_from_slice(&more);
                        fs.fsync(ino, round % 3 == 0).unwrap();
                    }
                    (ino, written)
                })
            })
            .collect();
        let expected: Vec<(u32, Vec<u8>)> =
            threads.into_iter().map(|h| h.join().unwrap()).collect();
        let stats = fs.journal().stats();
        println!(
            "fc_areas={fc_areas}: {} fsyncs as fast commits in {} area writes, {} transactions",
            stats.fast_commits, stats.fast_commit_writes, stats.transactions
        );
        assert!(stats.fast_commits > 0, "{stats:?}");
        assert!(stats.fast_commit_writes < stats.fast_commits, "no fsyncs shared: {stats:?}");
        let Ok(fs) = std::sync::Arc::try_unwrap(fs) else { panic!("threads joined") };
        fs.crash();
        if fc_areas > 1 {
            // Only quill replays per-core areas.
            let fs = Filesystem::open(open_device(&copy), MountOptions::default()).unwrap();
            for (ino, bytes) in &expected {
                assert!(read_all(&fs, *ino).unwrap() == *bytes, "inode {ino}");
            }
            fs.unmount().unwrap();
            assert_fsck_clean(&copy);
            continue;
        }
        recover_three_ways(&scratch, &copy, |fs, who| {
            for (ino, bytes) in &expected {
                assert!(read_all(fs, *ino).unwrap() == *bytes, "{who}: inode {ino}");
            }
        });
    }
}

/// Fast commits that fill the area to its end: the kernel's and e2fsck's recovery read area
/// blocks until one stops the scan, up to one block past the journal, where the read fails and
/// the mount with it. The area's last block is left zero, so a full area still stops the scan:
/// the crash image mounts, and both bring back every fsync.
#[test]
fn a_full_fast_commit_area_still_stops_the_kernels_scan() {
    let Some((scratch, image)) =
        fresh_image("fsync-journal-full-area", &["-b", "4096", "-O", "fast_commit"])
    else {
        return;
    };
    // How many one-block fast commits the area takes before the first "area full".
    let probe = scratch.path("probe.img");
    std::fs::copy(&image, &probe).unwrap();
    let fits = {
        let fs = Filesystem::open(open_device(&probe), fsync_journal()).unwrap();
        let ino = *create_files(&fs, 20).last().unwrap();
        fs.sync().unwrap();
        let mut n = 0;
        while fallbacks(&fs).is_empty() {
            fs.write(ino, n * 100, &chunk(n as u8, 100)).unwrap();
            fs.fsync(ino, false).unwrap();
            n += 1;
        }
        assert_eq!(fallbacks(&fs), vec![("area full".to_string(), 1)]);
        fs.unmount().unwrap();
        n - 1
    };
    let fs = Filesystem::open(open_device(&image), fsync_journal()).unwrap();
    let ino = *create_files(&fs, 20).last().unwrap();
    fs.sync().unwrap();
    let mut expected = Vec::new();
    for n in 0..fits {
        let bytes = chunk(n as u8, 100);
        fs.write(ino, n * 100, &bytes).unwrap();
        expected.extend_from_slice(&bytes);
        fs.fsync(ino, false).unwrap();
    }
    assert_eq!(fs.journal().stats().fast_commits, fits, "every fsync a fast commit");
    fs.crash();
    recover_three_ways(&scratch, &image, |fs, who| {
        assert!(read_all(fs, ino).unwrap() == expected, "{who}: the last fsync's contents");
    });
}

/// Threads appending to one shared log and fdatasyncing it (oltp-insert's redo log): each
/// fast commit carries the file as its plan saw it, so one file's fast commits must reach
/// the area in plan order (they are queued under the inode's lock). After a crash every
/// acknowledged append is there, through quill, e2fsck and the kernel.
#[test]
fn concurrent_fdatasyncs_of_one_file_keep_every_acknowledged_append() {
    let Some((scratch, image)) =
        fresh_image("fsync-journal-shared-log", &["-b", "4096", "-O", "fast_commit"])
    else {
        return;
    };
    let dev = std::sync::Arc::new(SlowSync(open_device(&image)));
    let fs = std::sync::Arc::new(Filesystem::open(dev, fsync_journal()).unwrap());
    let log = *create_files(&fs, 20).last().unwrap();
    fs.sync().unwrap();
    const RECORD: usize = 1000;
    let next = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let threads: Vec<_> = (0..6u8)
        .map(|t| {
            let (fs, next) = (fs.clone(), next.clone());
            std::thread::spawn(move || {
                let mut acknowledged = Vec::new();
                for _ in 0..12 {
                    let at = next.fetch_add(RECORD as u64, std::sync::atomic::Ordering::SeqCst);
                    fs.write(log, at, &vec![t + 1; RECORD]).unwrap();
                    fs.fsync(log, true).unwrap();
                    acknowledged.push((at, t + 1));
                }
                acknowledged
            })
        })
        .collect();
    let acknowledged: Vec<(u64, u8)> =
        threads.into_iter().flat_map(|h| h.join().unwrap()).collect();
    assert!(fs.journal().stats().fast_commits > 0);
    let Ok(fs) = std::sync::Arc::try_unwrap(fs) else { panic!("threads joined") };
    fs.crash();
    recover_three_ways(&scratch, &image, |fs, who| {
        let got = read_all(fs, log).unwrap();
        for &(at, byte) in &acknowledged {
            let at = at as usize;
            assert!(
                got.len() >= at + RECORD && got[at..at + RECORD].iter().all(|&b| b == byte),
                "{who}: the acknowledged append at {at} (file of {} bytes)",
                got.len()
            );
        }
    });
}

/// The first fast commit of a transaction puts its HEAD in the area's block 0. Where that fast
/// commit is larger than a sector, a write of block 0 torn after its first sector would leave a
/// damaged record before the first good TAIL, and every recovery (the kernel's mount too)
/// refuses such an area. So the HEAD goes alone into block 0 with a TAIL of its own, and the
/// records follow in blocks flushed before it: with block 0 torn that way, quill, e2fsck and
/// the kernel still recover, and the fsynced file is whole.
#[test]
fn a_first_fast_commit_larger_than_a_sector_survives_a_torn_first_block() {
    use ondisk::jbd2::fast_commit::{fast_commit_records, FcRecord};
    let Some((scratch, image)) = fresh_image("fsync-journal-torn-head", &["-O", "fast_commit"])
    else {
        return;
    };
    let fs = Filesystem::open(open_device(&image), fsync_journal()).unwrap();
    create_files(&fs, 20);
    fs.sync().unwrap();
    // Two INODE records and a CREAT with a long name: well over 512 bytes.
    let name = format!("long-{}", "n".repeat(240));
    let ino = fs.create(ROOT_INO, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
    let bytes = chunk(3, 6000);
    fs.write(ino, 0, &bytes).unwrap();
    fs.fsync(ino, false).unwrap();
    assert_eq!(fs.journal().stats().fast_commits, 1, "{:?}", fallbacks(&fs));
    fs.crash();

    let dev = open_device(&image);
    let fs_image = fs::Ext4Image::open(dev.clone()).unwrap();
    let location = fs_image.journal_location().unwrap();
    let scan = journal::scan_log(&*dev, &location).unwrap();
    let area = journal::FastCommitArea::read(&*dev, &location, &scan.superblock, scan.end_tid)
        .unwrap()
        .expect("the journal has a fast-commit area");
    let inode_size = fs_image.superblock().inode_size;
    let first: Vec<_> =
        fast_commit_records(&area.blocks[0], inode_size).map(|r| r.unwrap().record).collect();
    assert!(
        matches!(first[..], [FcRecord::Head { .. }, FcRecord::Tail { .. }]),
        "block 0: {first:?}"
    );
    let offset = location.device_offset(area.first_log_block).unwrap();
    drop((fs_image, dev));
    // Block 0 torn: its first sector new, the rest as before the write (zeros).
    let file = std::fs::OpenOptions::new().write(true).open(&image).unwrap();
    use std::os::unix::fs::FileExt;
    let block_size = area.blocks[0].len();
    file.write_all_at(&vec![0u8; block_size - 512], offset + 512).unwrap();
    drop(file);

    recover_three_ways(&scratch, &image, |fs, who| {
        let got = fs.lookup(ROOT_INO, name.as_bytes()).unwrap_or_else(|e| panic!("{who}: {e}"));
        assert!(read_all(fs, got.ino).unwrap() == bytes, "{who}: the fsynced bytes");
    });
}

/// An fsync that finds another file's fast commit being written returns only once a fast
/// commit carrying its own records is durable. The kernel's (6.18) does not always: an
/// `ext4_fc_commit` that finds a fast commit ongoing waits for it and, if it was a fast commit
/// that ended (`s_fc_subtid` moved), returns (EXT4_FC_STATUS_SKIPPED) without asking whether
/// that fast commit carried the file, and a change made after it began was in none. The
/// same two-thread pattern on a kernel loop mount, then a quiet crash image, loses the
/// acknowledged byte in about one trial in four here (`tools/kernel-fc-skip.py`; README,
/// "The file-system benchmark"). Here one thread appends to `a` and fsyncs it while the other,
/// a moment later (staggered over the rounds), appends a byte to `b` and fsyncs; every round
/// ends in a crash with no thread in the file system, and quill, e2fsck and the kernel must each
/// bring back `b` as long as its fsync said. Rounds go on until six had `b`'s write inside
/// `a`'s fsync (at most 40; at least one must, or the pattern was not exercised).
#[test]
fn an_fsync_during_another_files_fast_commit_returns_once_its_own_records_are_durable() {
    use std::time::{Duration, Instant};
    let Some((scratch, image)) =
        fresh_image("fsync-journal-overlap", &["-b", "4096", "-O", "fast_commit"])
    else {
        return;
    };
    let fs = Filesystem::open(open_device(&image), fsync_journal()).unwrap();
    let files = create_files(&fs, 18);
    fs.write(files[17], 0, &chunk(0, 100)).unwrap();
    fs.sync().unwrap();
    fs.unmount().unwrap();
    let mut b_expected = chunk(0, 100);
    let mut a_len = 0u64;
    let (mut overlapped, mut rounds) = (0, 0);
    while overlapped < 6 && rounds < 40 {
        let fs = Filesystem::open(open_device(&image), fsync_journal()).unwrap();
        let (a, b) = (files[16], files[17]);
        let stagger = Duration::from_micros(250 * (rounds % 12) as u64);
        let (a_fsync, b_write) = std::thread::scope(|scope| {
            let appender = scope.spawn(|| {
                fs.write(a, a_len, &chunk(rounds as u8, 4096)).unwrap();
                let started = Instant::now();
                fs.fsync(a, false).unwrap();
                (started, Instant::now())
            });
            std::thread::sleep(stagger);
            let written = Instant::now();
            fs.write(b, b_expected.len() as u64, &[rounds as u8 | 1]).unwrap();
            fs.fsync(b, false).unwrap();
            (appender.join().unwrap(), written)
        });
        b_expected.push(rounds as u8 | 1);
        a_len += 4096;
        if a_fsync.0 <= b_write && b_write <= a_fsync.1 {
            overlapped += 1;
        }
        rounds += 1;
        let stats = fs.journal().stats();
        assert!(stats.fast_commits >= 2, "round {rounds}: {stats:?} {:?}", fallbacks(&fs));
        fs.crash();
        recover_three_ways(&scratch, &image, |fs, who| {
            let got = read_all(fs, b).unwrap();
            assert!(
                got == b_expected,
                "{who}, round {rounds}: b has {} of the {} bytes its fsyncs acknowledged",
                got.len(),
                b_expected.len()
            );
        });
    }
    println!("{rounds} rounds, {overlapped} with b's write inside a's fsync");
    assert!(overlapped >= 1, "in {rounds} rounds b's write never fell inside a's fsync");
}
