//! quill replays what the kernel writes: loop-mount a fresh image with the kernel, write and
//! fsync files, copy the backing file while still mounted (a crash image with a dirty journal),
//! then replay one copy with `quill recover` and one with `e2fsck -fy`: every block quill
//! replayed must be identical in both, and both must then be clean and equal everywhere but
//! the superblock, which e2fsck stamps with its check time.

mod common;

use common::*;
use std::io::Write;
use std::path::Path;
use std::process::Command;

fn loop_mount(image: &Path, mountpoint: &Path) -> Result<(), String> {
    let o = run(Command::new("mount").arg("-o").arg("loop").arg(image).arg(mountpoint));
    if o.status.success() {
        Ok(())
    } else {
        Err(text(&o))
    }
}

fn umount(mountpoint: &Path) {
    let o = run(Command::new("umount").arg(mountpoint));
    assert!(o.status.success(), "umount failed: {}", text(&o));
}

/// Makes an image with `mkfs_args`, loop-mounts it, runs `work` on the mount point and copies
/// the backing file while still mounted (the crash image).
fn kernel_crash_image(
    scratch: &Scratch,
    mkfs_args: &[&str],
    test: &str,
    work: impl FnOnce(&Path),
) -> Option<std::path::PathBuf> {
    let image = scratch.path("kernel.img");
    mkfs(&image, "64M", mkfs_args);
    let mnt = scratch.path("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    if let Err(why) = loop_mount(&image, &mnt) {
        eprintln!("SKIP {test}: cannot loop-mount an image here: {why}");
        return None;
    }
    work(&mnt);
    let crash = scratch.path("crash.img");
    std::fs::copy(&image, &crash).unwrap();
    umount(&mnt);
    Some(crash)
}

/// Files of several sizes in four directories, each fsynced: the journal holds their metadata.
fn fsynced_files_in_directories(mnt: &Path) {
    for dir in 0..4 {
        let d = mnt.join(format!("dir{dir}"));
        std::fs::create_dir(&d).unwrap();
        for i in 0..25 {
            let mut f = std::fs::File::create(d.join(format!("file{i}"))).unwrap();
            f.write_all(&vec![(dir * 25 + i) as u8; 1000 * (i + 1)]).unwrap();
            f.sync_all().unwrap();
        }
        std::fs::File::open(&d).unwrap().sync_all().unwrap();
    }
}

fn check(mkfs_args: &[&str], name: &str, block_size: u64) {
    let test = format!("kernel_replay/{name}");
    for tool in ["mkfs.ext4", "e2fsck", "mount", "umount"] {
        if !have(tool, &test) {
            return;
        }
    }
    let scratch = Scratch::new(&format!("kernel-{name}"));
    let Some(crash) = kernel_crash_image(&scratch, mkfs_args, &test, fsynced_files_in_directories)
    else {
        return;
    };
    let by_quill = scratch.path("quill.img");
    let by_e2fsck = scratch.path("e2fsck.img");
    std::fs::copy(&crash, &by_quill).unwrap();
    std::fs::copy(&crash, &by_e2fsck).unwrap();

    let o = run(quill().arg("recover").arg("--json").arg(&by_quill));
    assert!(o.status.success(), "{name}: quill recover failed: {}", text(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["needed"], true, "{name}: the copied image has a dirty journal");
    let replayed: Vec<u64> =
        report["replayed_blocks"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap()).collect();
    assert!(!replayed.is_empty(), "{name}: the kernel's journal had transactions to replay");

    let (code, out) = e2fsck(&by_e2fsck, true);
    assert!(code <= 1, "{name}: e2fsck -fy failed ({code}):\n{out}");
    let superblock_block = if block_size == 1024 { 1 } else { 0 };
    for &block in replayed.iter().filter(|&&b| b != superblock_block) {
        assert!(
            read_block(&by_quill, block, block_size) == read_block(&by_e2fsck, block, block_size),
            "{name}: replayed block {block} differs between quill and e2fsck"
        );
    }
    // After quill's replay the file system needs nothing but what e2fsck would do anyway.
    let (code, out) = e2fsck(&by_quill, true);
    assert!(code <= 1, "{name}: e2fsck -fy after quill recover failed ({code}):\n{out}");
    assert_fsck_clean(&by_quill);
    assert_fsck_clean(&by_e2fsck);
    let a = std::fs::read(&by_quill).unwrap();
    let b = std::fs::read(&by_e2fsck).unwrap();
    let differing: Vec<u64> = (0..a.len() as u64 / block_size)
        .filter(|&blk| {
            let r = (blk * block_size) as usize..((blk + 1) * block_size) as usize;
            a[r.clone()] != b[r]
        })
        .collect();
    assert!(
        differing.iter().all(|&b| b == superblock_block),
        "{name}: images differ outside the superblock in blocks {differing:?}"
    );
    eprintln!("{name}: quill replayed {} blocks, identical to e2fsck's replay", replayed.len());
}

#[test]
fn quill_replays_a_kernel_journal_like_e2fsck_4k() {
    check(&["-b", "4096"], "4k", 4096);
}

#[test]
fn quill_replays_a_kernel_journal_like_e2fsck_1k() {
    check(&["-b", "1024"], "1k", 1024);
}

/// New files on a `fast_commit` file system, each fsynced: the kernel writes fast commits for
/// them. `quill recover` replays them (and says so), and every file is there afterwards with
/// its contents, in an image e2fsck -fn finds clean.
#[test]
fn quill_recover_replays_a_kernel_journal_ending_in_fast_commits() {
    let test = "kernel_replay/fast_commit";
    for tool in ["mkfs.ext4", "e2fsck", "debugfs", "mount", "umount"] {
        if !have(tool, test) {
            return;
        }
    }
    let scratch = Scratch::new("kernel-fast-commit");
    // New files in the root (a new directory would force full commits).
    let contents = |i: usize| vec![i as u8; 1000 * (i + 1)];
    let fsynced_files = |mnt: &Path| {
        for i in 0..20 {
            let mut f = std::fs::File::create(mnt.join(format!("file{i}"))).unwrap();
            f.write_all(&contents(i)).unwrap();
            f.sync_all().unwrap();
        }
    };
    let Some(crash) = kernel_crash_image(&scratch, &["-O", "fast_commit"], test, fsynced_files)
    else {
        return;
    };
    let by_quill = scratch.path("quill.img");
    std::fs::copy(&crash, &by_quill).unwrap();
    let o = run(quill().args(["recover", "--json"]).arg(&by_quill));
    assert!(o.status.success(), "quill recover failed: {}", text(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let commits = report["fast_commits"]["commits"].as_u64().unwrap();
    assert!(commits > 0, "the kernel wrote no fast commits: {report}");
    assert!(report["fast_commits"]["records"].as_u64().unwrap() > commits, "{report}");
    assert_fsck_clean(&by_quill);
    for i in 0..20 {
        let dumped = scratch.path("dumped");
        let o = run(Command::new("debugfs")
            .arg("-R")
            .arg(format!("dump /file{i} {}", dumped.display()))
            .arg(&by_quill));
        assert!(o.status.success(), "debugfs: {}", text(&o));
        assert_eq!(std::fs::read(&dumped).unwrap(), contents(i), "file{i}");
    }
    // The text report names the fast commits too.
    let again = scratch.path("again.img");
    std::fs::copy(&crash, &again).unwrap();
    let o = run(quill().arg("recover").arg(&again));
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains(&format!("replayed {commits} fast commits")), "{}", text(&o));
}
