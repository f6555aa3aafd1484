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

/// The fast-commit area of `image`, read through `debugfs` (the journal inode's contents):
/// its blocks, the block size and the tid its HEAD names.
fn fast_commit_area(image: &Path) -> (Vec<Vec<u8>>, ondisk::Tid) {
    let o = run(Command::new("debugfs").arg("-R").arg("cat <8>").arg(image));
    assert!(o.status.success(), "debugfs cat <8>: {}", text(&o));
    let journal = o.stdout;
    let sb = ondisk::jbd2::JournalSuperblock::parse(&journal[..1024]).unwrap();
    let bs = sb.block_size as usize;
    // As jbd2 places it: the log ends at `max_len - fc blocks`, the area starts after it.
    let first = (sb.max_len - sb.configured_fast_commit_blocks() + 1) as usize;
    let blocks: Vec<Vec<u8>> =
        journal[first * bs..sb.max_len as usize * bs].chunks(bs).map(<[u8]>::to_vec).collect();
    // HEAD: tag and length (4 bytes), features (4), tid (4).
    let tid = ondisk::Tid(u32::from_le_bytes(blocks[0][8..12].try_into().unwrap()));
    (blocks, tid)
}

/// Splits the complete fast commits of an area into their records and lays each out again as
/// the kernel's `ext4_fc_perform_commit` does (`pack_fast_commit`): the blocks must come back
/// byte for byte. Returns how many fast commits the area held.
fn assert_area_round_trips(blocks: &[Vec<u8>], tid: ondisk::Tid, inode_size: u16) -> usize {
    use ondisk::jbd2::fast_commit::{pack_fast_commit, scan_fast_commit_area, FcRecord};
    let scan = scan_fast_commit_area(blocks.iter().map(Vec::as_slice), inode_size, tid).unwrap();
    assert!(scan.commits > 0, "no complete fast commit: {:?}", scan.stop);
    let (mut packed, mut records, mut head) = (Vec::new(), Vec::new(), false);
    for record in &scan.records[..scan.records_valid] {
        match *record {
            FcRecord::Head { .. } => head = true,
            FcRecord::Pad { .. } => {}
            FcRecord::Tail { .. } => {
                packed.extend(pack_fast_commit(&records, blocks[0].len(), tid, head));
                records.clear();
                head = false;
            }
            other => records.push(other),
        }
    }
    for (index, block) in packed.iter().enumerate() {
        assert!(*block == blocks[index], "fast-commit block {index} does not round-trip");
    }
    scan.commits
}

/// The records `quill journal dump --blocks` lists for the area, after its summary line.
fn dumped_fast_commit_records(image: &Path) -> (String, Vec<String>) {
    let o = run(quill().args(["journal", "dump", "--blocks"]).arg(image));
    assert!(o.status.success(), "journal dump: {}", text(&o));
    let out = String::from_utf8(o.stdout).unwrap();
    let mut lines = out.lines().skip_while(|l| !l.starts_with("fast-commit area"));
    let summary = lines.next().unwrap_or_else(|| panic!("no fast-commit area in:\n{out}"));
    (summary.to_string(), lines.map(|l| l.trim().to_string()).collect())
}

/// Fast commits written by the kernel and by quill (`fsync_journal`): `quill journal dump`
/// lists their records (the CREAT of each new file among them), and each area's fast commits,
/// laid out again from their records, are the area's bytes.
#[test]
fn journal_dump_shows_kernel_and_quill_fast_commits_and_both_areas_round_trip() {
    let test = "kernel_replay/fast_commit_dump";
    for tool in ["mkfs.ext4", "debugfs"] {
        if !have(tool, test) {
            return;
        }
    }
    let scratch = Scratch::new("fast-commit-dump");

    // quill's: files made after the journal inode's table block, each created, written and
    // fsynced as a fast commit, then a crash.
    let image = scratch.path("quill.img");
    mkfs(&image, "64M", &["-b", "4096", "-O", "fast_commit"]);
    let dev = blockdev::file::FileDevice::open(&image, blockdev::file::FileOptions::default());
    let options = fs::MountOptions {
        journal: journal::JournalConfig {
            fsync_journal: true,
            ..journal::JournalConfig::classic()
        },
        ..fs::MountOptions::default()
    };
    let mounted = fs::Filesystem::open(std::sync::Arc::new(dev.unwrap()), options.clone()).unwrap();
    for i in 0..16 {
        mounted.create(fs::ROOT_INO, format!("pre{i}").as_bytes(), 0o644, 0, 0).unwrap();
    }
    mounted.sync().unwrap();
    let mut created = Vec::new();
    for i in 0..6 {
        let name = format!("new{i}");
        let ino = mounted.create(fs::ROOT_INO, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
        mounted.write(ino, 0, &vec![i as u8; 3000 * (i + 1)]).unwrap();
        mounted.fsync(ino, false).unwrap();
        created.push(format!("create 2/{name} -> inode {ino}"));
    }
    assert_eq!(mounted.journal().stats().fast_commits, 6);
    mounted.crash();
    let (summary, records) = dumped_fast_commit_records(&image);
    assert!(summary.contains(": 6 fast commits of tid"), "{summary}");
    for line in &created {
        assert!(records.contains(line), "{line} not in {records:#?}");
    }
    assert!(records.iter().any(|r| r.starts_with("add range inode")), "{records:#?}");
    let (blocks, tid) = fast_commit_area(&image);
    assert_eq!(assert_area_round_trips(&blocks, tid, 256), 6);

    // quill's per-core areas (fc_areas=2): the dump lists each area's fast commits.
    let image = scratch.path("per-core.img");
    mkfs(&image, "64M", &["-b", "4096", "-O", "fast_commit"]);
    let dev = blockdev::file::FileDevice::open(&image, blockdev::file::FileOptions::default());
    let mut per_core = options.clone();
    per_core.journal.fc_areas = 2;
    let mounted = fs::Filesystem::open(std::sync::Arc::new(dev.unwrap()), per_core).unwrap();
    let files: Vec<u32> = (0..20)
        .map(|i| mounted.create(fs::ROOT_INO, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap().ino)
        .collect();
    mounted.sync().unwrap();
    for &ino in &files[16..] {
        mounted.write(ino, 0, &[7u8; 5000]).unwrap();
        mounted.fsync(ino, false).unwrap();
    }
    mounted.crash();
    let o = run(quill().args(["journal", "dump"]).arg(&image));
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    for area in 0..2 {
        let at = out.find(&format!("per-core fast-commit area {area} of 2:")).expect(&out);
        assert!(out[at..].contains(": 2 fast commits of tid"), "area {area}: {out}");
    }

    // The kernel's: new files in the root, each fsynced, copied while still mounted.
    let fsynced_files = |mnt: &Path| {
        for i in 0..12 {
            let mut f = std::fs::File::create(mnt.join(format!("file{i}"))).unwrap();
            f.write_all(&vec![i as u8; 2500 * (i + 1)]).unwrap();
            f.sync_all().unwrap();
        }
    };
    let Some(crash) =
        kernel_crash_image(&scratch, &["-b", "4096", "-O", "fast_commit"], test, fsynced_files)
    else {
        return;
    };
    let (summary, records) = dumped_fast_commit_records(&crash);
    assert!(records.iter().any(|r| r.starts_with("create 2/file11 -> inode")), "{records:#?}");
    let (blocks, tid) = fast_commit_area(&crash);
    let commits = assert_area_round_trips(&blocks, tid, 256);
    assert!(summary.contains(&format!(": {commits} fast commits of tid {tid}")), "{summary}");
}
