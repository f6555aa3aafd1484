//! Fast commits written by the kernel: an image whose journal ends in fast commits (the kernel
//! uses them for fsync on a `fast_commit` file system) is copied while still mounted (a crash
//! image), and quill must either replay those fast commits as e2fsck does or refuse to open it,
//! never attach without them (the fsynced files would be lost for good when it marks the
//! journal clean). Needs root, loop mounts and e2fsprogs; skips with a printed reason otherwise.

mod common;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{
    assert_fsck_clean, can_loop_mount, dumpe2fs_header, list_dir, mkfs, open_device, read_all,
    Mount, Scratch,
};
use fs::{Filesystem, MountOptions, ROOT_INO};

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

/// Whether the two files hold the same bytes.
fn same_bytes(a: &Path, b: &Path) -> bool {
    let (mut a, mut b) = (std::fs::File::open(a).unwrap(), std::fs::File::open(b).unwrap());
    let (mut buf_a, mut buf_b) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let n = a.read(&mut buf_a).unwrap();
        if n == 0 {
            return b.read(&mut buf_b).unwrap() == 0;
        }
        if b.read_exact(&mut buf_b[..n]).is_err() || buf_a[..n] != buf_b[..n] {
            return false;
        }
    }
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

/// The reproduction: 50 files synced, 30 more created and fsynced one by one (fast
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

/// The reproduction at `block_size`: open (read-write, and read-only, which replays
/// too) must refuse by name and leave the crash image byte-identical; e2fsck -fy on a copy
/// recovers all 80 files.
fn open_refuses_fast_commits_it_cannot_replay(block_size: u32) {
    let test = format!("open_refuses_fast_commits_it_cannot_replay_{block_size}");
    let scratch = Scratch::new(&test);
    let Some(crash) =
        kernel_crash_image(&scratch, &test, "512M", block_size, fifty_synced_thirty_fsynced)
    else {
        return;
    };
    let quill = scratch.path("quill.img");
    copy_sparse(&crash, &quill);
    for options in [MountOptions::default(), read_only()] {
        let error = Filesystem::open(open_device(&quill), options.clone())
            .expect_err("an image with fast commits to replay must not open");
        let message = error.to_string();
        assert!(message.contains("fast-commit records INODE, ADD_RANGE, CREAT are"), "{message}");
        assert!(message.contains("not replayed yet"), "{message}");
        assert!(!message.contains('\n'), "one line: {message}");
        assert!(same_bytes(&crash, &quill), "open ({options:?}) changed the image");
    }

    // e2fsck replays the full commit and the 30 fast commits: every file is there.
    let checked = scratch.path("e2fsck.img");
    copy_sparse(&crash, &checked);
    e2fsck_replay(&checked);
    assert_fsck_clean(&checked);
    let fs = Filesystem::open(open_device(&checked), read_only()).unwrap();
    assert_eq!(root_files(&fs), expected_eighty());
}

#[test]
fn open_refuses_fast_commits_it_cannot_replay_1k() {
    open_refuses_fast_commits_it_cannot_replay(1024);
}

#[test]
fn open_refuses_fast_commits_it_cannot_replay_4k() {
    open_refuses_fast_commits_it_cannot_replay(4096);
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
