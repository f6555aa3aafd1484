//! Fast commits written by the kernel: an image whose journal ends in fast commits (the kernel
//! uses them for fsync on a `fast_commit` file system) is copied while still mounted (a crash
//! image). quill's recovery must replay those fast commits and reach the tree e2fsck -fy
//! reaches (names, kinds, modes, owners, sizes, contents, link counts), leaving an image
//! `e2fsck -fn` finds clean; never attach without them (the fsynced files would be lost for
//! good when it marks the journal clean). Each workload runs at 1 KiB and 4 KiB blocks. Needs
//! root, loop mounts and e2fsprogs; skips with a printed reason otherwise.

mod common;

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{
    assert_fsck_clean, can_loop_mount, compare, dumpe2fs_header, kernel_tree, list_dir, mkfs,
    open_device, quill_tree, read_all, Mount, Scratch,
};
use fs::{Ext4Image, Filesystem, MountOptions, ROOT_INO};
use journal::RecoveryReport;

/// Builds a crash image with the kernel: a `fast_commit` file system of `size` and
/// `block_size`, loop-mounted with a long commit interval (so no timer commit turns the fast
/// commits into a full one), `work` run on the mount point, then the backing file copied
/// (sparse) while still mounted. Returns the copy; `None` (after a SKIP line) when the machine
/// cannot do it.
fn kernel_crash_image(
    scratch: &Scratch,
    test: &str,
    size: &str,
    block_size: u32,
    work: impl FnOnce(&Path),
) -> Option<PathBuf> {
    if !can_loop_mount(test) {
        return None;
    }
    let live = scratch.path("live.img");
    let crash = scratch.path("crash.img");
    mkfs(&live, size, &["-O", "fast_commit", "-b", &block_size.to_string()]);
    let mount = Mount::with_options(&live, scratch.path("mnt"), "loop,commit=600")?;
    work(&mount.dir);
    copy_sparse(&live, &crash);
    drop(mount);
    Some(crash)
}

fn copy_sparse(from: &Path, to: &Path) {
    let out = Command::new("cp").arg("--sparse=always").arg(from).arg(to).output().unwrap();
    assert!(out.status.success(), "cp failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// Writes `bytes` to a new file `path` and fsyncs it.
fn create_fsynced(path: &Path, bytes: &[u8]) {
    let mut file = std::fs::File::create(path).unwrap();
    file.write_all(bytes).unwrap();
    file.sync_all().unwrap();
}

/// Runs `e2fsck -fy` on `image` (journal replay included) and asserts it ends with a
/// consistent file system (exit 0 or 1).
fn e2fsck_replay(image: &Path) {
    let out = Command::new("e2fsck").arg("-fy").arg(image).output().unwrap();
    let code = out.status.code().unwrap_or(-1);
    assert!(
        code == 0 || code == 1,
        "e2fsck -fy exited {code}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The names in the root directory (without `.`, `..` and `lost+found`) and each file's bytes.
fn root_files(fs: &Filesystem) -> BTreeSet<(Vec<u8>, Vec<u8>)> {
    list_dir(fs, ROOT_INO, 64)
        .into_iter()
        .filter(|e| !matches!(&e.name[..], b"." | b".." | b"lost+found"))
        .map(|e| (e.name.clone(), read_all(fs, e.ino).unwrap()))
        .collect()
}

fn read_only() -> MountOptions {
    MountOptions { read_only: true, ..MountOptions::default() }
}

/// The issue's reproduction: 50 files synced, 30 more created and fsynced one by one (fast
/// commits), the backing file copied while mounted.
fn fifty_synced_thirty_fsynced(dir: &Path) {
    for i in 1..=50 {
        std::fs::write(dir.join(format!("s{i}")), format!("synced {i}\n")).unwrap();
    }
    Command::new("sync").status().unwrap();
    for i in 1..=30 {
        create_fsynced(&dir.join(format!("f{i}")), format!("fsynced {i}\n").as_bytes());
    }
}

fn expected_eighty() -> BTreeSet<(Vec<u8>, Vec<u8>)> {
    let synced = (1..=50).map(|i| (format!("s{i}"), format!("synced {i}\n")));
    let fsynced = (1..=30).map(|i| (format!("f{i}"), format!("fsynced {i}\n")));
    synced.chain(fsynced).map(|(n, c)| (n.into_bytes(), c.into_bytes())).collect()
}

/// Replays the crash image `work` leaves at `block_size` three times: with quill's recovery,
/// with the kernel's (a loop mount) and with e2fsck -fy. quill's tree must be the kernel's,
/// and e2fsck's too where `e2fsck_agrees` (e2fsck 1.47's replay is known to differ for some
/// workloads, see `work_unlinks_and_links`); quill's image must be e2fsck-clean right after
/// the replay and after quill mounted and unmounted it. Returns what quill's recovery
/// replayed (`None` after a SKIP line).
fn replay_matches_kernel(
    test: &str,
    block_size: u32,
    e2fsck_agrees: bool,
    work: impl FnOnce(&Path),
) -> Option<RecoveryReport> {
    let scratch = Scratch::new(test);
    let crash = kernel_crash_image(&scratch, test, "64M", block_size, work)?;

    let by_kernel = scratch.path("kernel.img");
    copy_sparse(&crash, &by_kernel);
    let kernel = kernel_tree(&Mount::new(&by_kernel, scratch.path("replay"))?.dir);

    let replayed = scratch.path("quill.img");
    copy_sparse(&crash, &replayed);
    let image = Ext4Image::open(open_device(&replayed)).unwrap();
    let report = image.recover_journal(1, &|_, _| {}).unwrap();
    assert!(report.needed, "{test}: the crash image's journal is clean");
    let mut image = Ext4Image::open(open_device(&replayed)).unwrap();
    image.set_needs_recovery(false).unwrap();
    drop(image);
    assert_fsck_clean(&replayed);
    let fs = Filesystem::open(open_device(&replayed), MountOptions::default()).unwrap();
    let tree = quill_tree(&fs);
    fs.unmount().unwrap();
    assert_fsck_clean(&replayed);

    let checked = scratch.path("e2fsck.img");
    copy_sparse(&crash, &checked);
    e2fsck_replay(&checked);
    assert_fsck_clean(&checked);
    let by_e2fsck = quill_tree(&Filesystem::open(open_device(&checked), read_only()).unwrap());
    if kernel != tree && e2fsck_agrees && by_e2fsck == tree {
        // Seen once under load: the kernel's replay mount showed the tree without a file a
        // complete fast commit created, which quill and e2fsck both replay.
        println!("{test}: the kernel's replay differs from quill's and e2fsck's, which agree");
    } else {
        compare(&kernel, &tree);
    }
    if e2fsck_agrees {
        compare(&by_e2fsck, &tree);
    } else {
        let differing: Vec<&String> = tree
            .keys()
            .chain(by_e2fsck.keys())
            .filter(|p| tree.get(*p) != by_e2fsck.get(*p))
            .collect();
        println!("{test}: e2fsck's replay differs from the kernel's and quill's at {differing:?}");
    }
    println!("{test}: {:?}", report.fast_commits);
    Some(report)
}

/// [`replay_matches_kernel`], asserting the kernel did write fast commits for the workload
/// (so the replay is what the test exercises).
fn fast_commits_replay_like_the_kernel(test: &str, block_size: u32, work: impl FnOnce(&Path)) {
    if let Some(report) = replay_matches_kernel(test, block_size, true, work) {
        assert!(report.fast_commits.commits > 0, "{test}: the kernel wrote no fast commits");
    }
}

/// Files, a directory and their contents made durable with a full commit (`sync`): the state
/// fast commits then build on.
fn synced_base(dir: &Path) {
    std::fs::create_dir(dir.join("d1")).unwrap();
    std::fs::create_dir(dir.join("d2")).unwrap();
    for (name, len) in [("a", 3000), ("b", 70_000), ("c", 200_000), ("d1/x", 5000), ("d2/y", 10)] {
        let bytes: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(dir.join(name), bytes).unwrap();
    }
    Command::new("sync").status().unwrap();
}

fn fsync(path: &Path) {
    std::fs::OpenOptions::new().read(true).open(path).unwrap().sync_all().unwrap();
}

fn work_creates(dir: &Path) {
    synced_base(dir);
    for i in 0..12 {
        let at =
            if i % 2 == 0 { dir.join(format!("new{i}")) } else { dir.join(format!("d1/new{i}")) };
        create_fsynced(&at, &vec![i as u8 + 1; 1000 * i + 1]);
    }
}

fn work_appends_and_overwrites(dir: &Path) {
    synced_base(dir);
    for round in 0..5u8 {
        let mut file = std::fs::OpenOptions::new().append(true).open(dir.join("a")).unwrap();
        file.write_all(&vec![round; 5000]).unwrap();
        file.sync_all().unwrap();
    }
    let mut file = std::fs::OpenOptions::new().write(true).open(dir.join("b")).unwrap();
    use std::io::{Seek, SeekFrom};
    file.seek(SeekFrom::Start(10_000)).unwrap();
    file.write_all(&[0xEE; 20_000]).unwrap();
    file.sync_all().unwrap();
}

fn work_truncates(dir: &Path) {
    synced_base(dir);
    let file = std::fs::OpenOptions::new().write(true).open(dir.join("c")).unwrap();
    file.set_len(10_000).unwrap();
    file.sync_all().unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(dir.join("b")).unwrap();
    file.set_len(100_000).unwrap();
    file.sync_all().unwrap();
}

fn work_unlinks_and_links(dir: &Path) {
    synced_base(dir);
    std::fs::remove_file(dir.join("a")).unwrap();
    std::fs::hard_link(dir.join("c"), dir.join("d1/c-link")).unwrap();
    std::fs::remove_file(dir.join("d2/y")).unwrap();
    create_fsynced(&dir.join("after"), b"written after the unlinks");
    fsync(&dir.join("c"));
}

fn work_renames(dir: &Path) {
    synced_base(dir);
    std::fs::rename(dir.join("a"), dir.join("a-renamed")).unwrap();
    fsync(&dir.join("a-renamed"));
    std::fs::rename(dir.join("d1/x"), dir.join("d2/x-moved")).unwrap();
    fsync(&dir.join("d2/x-moved"));
    create_fsynced(&dir.join("d1/fresh"), b"fresh");
    std::fs::rename(dir.join("d1/fresh"), dir.join("fresh-moved")).unwrap();
    fsync(&dir.join("fresh-moved"));
}

fn work_fallocate_and_punch(dir: &Path) {
    synced_base(dir);
    let run = common::fallocate;
    let c = dir.join("c").to_string_lossy().to_string();
    let fresh = dir.join("preallocated").to_string_lossy().to_string();
    run(&["-l", "300000", &fresh]);
    fsync(Path::new(&fresh));
    run(&["-p", "-o", "8192", "-l", "16384", &c]);
    fsync(Path::new(&c));
    run(&["-n", "-o", "200000", "-l", "50000", &c]);
    fsync(Path::new(&c));
}

macro_rules! at_both_block_sizes {
    ($check:ident, $work:ident, $name_1k:ident, $name_4k:ident) => {
        #[test]
        fn $name_1k() {
            $check(stringify!($name_1k), 1024, $work);
        }

        #[test]
        fn $name_4k() {
            $check(stringify!($name_4k), 4096, $work);
        }
    };
}

at_both_block_sizes!(
    fast_commits_replay_like_the_kernel,
    work_creates,
    created_files_replay_like_the_kernel_1k,
    created_files_replay_like_the_kernel_4k
);
at_both_block_sizes!(
    fast_commits_replay_like_the_kernel,
    work_appends_and_overwrites,
    appends_and_overwrites_replay_like_the_kernel_1k,
    appends_and_overwrites_replay_like_the_kernel_4k
);
at_both_block_sizes!(
    fast_commits_replay_like_the_kernel,
    work_truncates,
    truncates_replay_like_the_kernel_1k,
    truncates_replay_like_the_kernel_4k
);
/// e2fsck 1.47.0's replay of these records differs from the kernel's: it keeps the link an
/// UNLINK drops (the unlinked d2/y ends in lost+found with two links), and for the new file
/// in a reused inode it keeps the old file's blocks past the end of file, which its check then
/// turns into a larger i_size (1 KiB blocks: `after` grows from 25 to 3072 bytes). quill
/// follows the kernel, checked against the kernel's own replay.
fn unlinks_replay_like_the_kernel(test: &str, block_size: u32, work: impl FnOnce(&Path)) {
    if let Some(report) = replay_matches_kernel(test, block_size, false, work) {
        assert!(report.fast_commits.commits > 0, "{test}: the kernel wrote no fast commits");
    }
}

at_both_block_sizes!(
    unlinks_replay_like_the_kernel,
    work_unlinks_and_links,
    unlinks_and_links_replay_like_the_kernel_1k,
    unlinks_and_links_replay_like_the_kernel_4k
);
at_both_block_sizes!(
    fast_commits_replay_like_the_kernel,
    work_renames,
    renames_replay_like_the_kernel_1k,
    renames_replay_like_the_kernel_4k
);

/// fallocate range operations make the kernel fall back to a full commit (ineligible); the
/// replay must still match, whatever the kernel wrote.
fn fallocate_replays_like_the_kernel(test: &str, block_size: u32, work: impl FnOnce(&Path)) {
    if common::have("fallocate", test) {
        replay_matches_kernel(test, block_size, true, work);
    }
}

at_both_block_sizes!(
    fallocate_replays_like_the_kernel,
    work_fallocate_and_punch,
    fallocate_and_punch_replay_like_the_kernel_1k,
    fallocate_and_punch_replay_like_the_kernel_4k
);

/// A fast commit quill cannot replay yet (a directory created within it) is refused with one
/// line naming it; the journal still needs recovery afterwards, so the kernel's replay and
/// e2fsck -fy each reach the same tree from quill's copy as from an untouched one.
#[test]
fn a_fast_commit_quill_cannot_replay_is_refused_by_name_and_left_for_the_next_recovery() {
    let test =
        "a_fast_commit_quill_cannot_replay_is_refused_by_name_and_left_for_the_next_recovery";
    let scratch = Scratch::new("fc-refused");
    let Some(crash) = kernel_crash_image(&scratch, test, "64M", 4096, |dir| {
        synced_base(dir);
        std::fs::create_dir(dir.join("made-after-sync")).unwrap();
        create_fsynced(&dir.join("made-after-sync/file"), b"in a new directory");
    }) else {
        return;
    };
    let refused = scratch.path("quill.img");
    copy_sparse(&crash, &refused);
    for options in [MountOptions::default(), read_only()] {
        let error = Filesystem::open(open_device(&refused), options)
            .expect_err("a directory created in a fast commit is not replayed yet");
        let message = error.to_string();
        assert!(message.contains("fast-commit record CREAT of a directory"), "{message}");
        assert!(message.contains("is not replayed yet"), "{message}");
        assert!(!message.contains('\n'), "one line: {message}");
    }
    assert!(dumpe2fs_header(&refused).contains("needs_recovery"), "recovery was marked done");
    // The kernel's replay and e2fsck's each reach the same tree from quill's copy as from an
    // untouched one (e2fsck 1.47.0 does not bring the new directory back; the kernel does).
    let copies = |name: &str| {
        let (from_refused, untouched) =
            (scratch.path(&format!("{name}-refused.img")), scratch.path(&format!("{name}.img")));
        copy_sparse(&refused, &from_refused);
        copy_sparse(&crash, &untouched);
        (from_refused, untouched)
    };
    let (from_refused, untouched) = copies("kernel");
    let Some(mount) = Mount::new(&untouched, scratch.path("mnt-untouched")) else { return };
    let expected = kernel_tree(&mount.dir);
    drop(mount);
    assert!(expected.contains_key("made-after-sync/file"), "{:?}", expected.keys());
    let Some(mount) = Mount::new(&from_refused, scratch.path("mnt-refused")) else { return };
    compare(&expected, &kernel_tree(&mount.dir));
    drop(mount);
    let (from_refused, untouched) = copies("e2fsck");
    let tree = |image: &Path| {
        e2fsck_replay(image);
        assert_fsck_clean(image);
        quill_tree(&Filesystem::open(open_device(image), read_only()).unwrap())
    };
    compare(&tree(&untouched), &tree(&from_refused));
}

/// The issue's reproduction at `block_size`: quill mounts the crash image with all 80 files,
/// as e2fsck -fy recovers it, and leaves it e2fsck-clean.
fn open_replays_the_issues_fast_commits(block_size: u32) {
    let test = format!("open_replays_the_issues_fast_commits_{block_size}");
    let scratch = Scratch::new(&test);
    let Some(crash) =
        kernel_crash_image(&scratch, &test, "512M", block_size, fifty_synced_thirty_fsynced)
    else {
        return;
    };
    let checked = scratch.path("e2fsck.img");
    copy_sparse(&crash, &checked);
    e2fsck_replay(&checked);
    assert_fsck_clean(&checked);
    let fs = Filesystem::open(open_device(&checked), read_only()).unwrap();
    assert_eq!(root_files(&fs), expected_eighty());

    let fs = Filesystem::open(open_device(&crash), MountOptions::default()).unwrap();
    assert_eq!(root_files(&fs), expected_eighty());
    fs.unmount().unwrap();
    assert_fsck_clean(&crash);
}

#[test]
fn open_replays_the_issues_fast_commits_1k() {
    open_replays_the_issues_fast_commits(1024);
}

#[test]
fn open_replays_the_issues_fast_commits_4k() {
    open_replays_the_issues_fast_commits(4096);
}

/// Fast commits followed by a full commit (`sync`) leave a stale area: its HEAD carries a tid
/// recovery does not replay, so the refusal must not fire. quill opens the crash image,
/// replays the full commits and finds every file, as e2fsck -fy does, and leaves it
/// e2fsck-clean.
#[test]
fn fast_commits_superseded_by_a_full_commit_do_not_block_open() {
    let test = "fast_commits_superseded_by_a_full_commit_do_not_block_open";
    let scratch = Scratch::new("fc-stale");
    let Some(crash) = kernel_crash_image(&scratch, test, "256M", 4096, |dir| {
        fifty_synced_thirty_fsynced(dir);
        Command::new("sync").status().unwrap();
    }) else {
        return;
    };
    assert!(dumpe2fs_header(&crash).contains("needs_recovery"), "the crash image is clean");

    let checked = scratch.path("e2fsck.img");
    copy_sparse(&crash, &checked);
    e2fsck_replay(&checked);
    let e2fsck_files = root_files(&Filesystem::open(open_device(&checked), read_only()).unwrap());
    assert_eq!(e2fsck_files, expected_eighty());

    let fs = Filesystem::open(open_device(&crash), MountOptions::default()).unwrap();
    assert_eq!(root_files(&fs), e2fsck_files);
    fs.unmount().unwrap();
    assert_fsck_clean(&crash);
}
