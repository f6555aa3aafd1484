//! ext3 images, whose files and directories map their blocks indirectly (12 direct blocks,
//! then single-, double- and triple-indirect blocks), both ways: a tree the kernel writes
//! there is read identically by quill, with 1 KiB blocks (where a 70 MiB offset takes the
//! triple-indirect block) and 4 KiB; a tree quill writes there (new files indirect-mapped,
//! grown, truncated across the levels, punched, deleted) is e2fsck-clean and read identically
//! by the kernel; and on the image converted to ext4 (`tune2fs -O extents`, which leaves the
//! old files indirect) quill changes the old files and directories in place, as the kernel
//! reads them after. ext2 and ext4 made without a journal are read and written the same way,
//! and so is bigalloc (clusters of blocks), whose files are extent-mapped.
//! Damaged indirect maps give errors where the walk meets them, never a panic, a hang or a
//! write.
//! Needs root, loop devices and e2fsprogs; skips with a printed reason otherwise.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{
    assert_fsck_clean, can_loop_mount, compare, kernel_tree, mkfs, open_device, quill_tree, Entry,
    Mount, Rng, Scratch,
};
use fs::{Ext4Image, FallocateMode, Filesystem, FsError, MountOptions, ROOT_INO};

/// A varied tree, written by the kernel: files of every mapping depth, a sparse file with
/// data after holes in the direct, single-indirect and `far` ranges, an indexed directory,
/// and a slow symlink.
fn kernel_writes_a_tree(m: &Path, rng: &mut Rng, far: u64) {
    std::fs::create_dir_all(m.join("a/b")).unwrap();
    for (i, size) in [0usize, 1, 1024, 4096, 12 * 1024 + 1, 300 << 10, 5 << 20].iter().enumerate() {
        std::fs::write(m.join(format!("a/f{i}")), rng.bytes(*size)).unwrap();
    }
    let sparse = std::fs::File::create(m.join("sparse")).unwrap();
    sparse.write_all_at(b"start", 0).unwrap();
    sparse.write_all_at(b"past the direct blocks", 40 << 10).unwrap();
    sparse.write_all_at(b"far out", far).unwrap();
    for i in 0..400 {
        std::fs::write(m.join(format!("a/b/entry-{i}")), format!("entry {i}")).unwrap();
    }
    std::os::unix::fs::symlink("x".repeat(300), m.join("slow-link")).unwrap();
}

/// `i_block` slot `slot` of the inode at `path` (0 = none), and whether it has the extents
/// flag, read straight from the image.
fn mapping_of(image: &Path, fs: &Filesystem, path: &str, slot: usize) -> (u32, bool) {
    let ino = fs.resolve(path).unwrap();
    let inode = Ext4Image::open(open_device(image)).unwrap().read_inode(ino).unwrap();
    let pointer = u32::from_le_bytes(inode.block[slot * 4..slot * 4 + 4].try_into().unwrap());
    (pointer, inode.uses_extents())
}

/// A fresh image made with `mkfs_options`, the kernel's tree written on it (the far write at
/// `far`), checked clean, and opened read-only. `None` (after a SKIP line) where the kernel
/// cannot mount it.
fn kernel_tree_opened_read_only(
    scratch: &Scratch,
    mkfs_options: &[&str],
    far: u64,
) -> Option<(PathBuf, BTreeMap<String, Entry>, Filesystem)> {
    let image = scratch.path("fs.img");
    mkfs(&image, "128M", mkfs_options);
    let expected = {
        let mount = Mount::new(&image, scratch.path("mnt"))?;
        kernel_writes_a_tree(&mount.dir, &mut Rng::new(3), far);
        kernel_tree(&mount.dir)
    };
    assert_fsck_clean(&image);
    let read_only = MountOptions { read_only: true, ..MountOptions::default() };
    let fs = Filesystem::open(open_device(&image), read_only).unwrap();
    Some((image, expected, fs))
}

/// quill's read-only view of `image` is `expected`, what the kernel wrote; the image is
/// e2fsck-clean after quill unmounts.
fn assert_reads_as_written(
    label: &str,
    image: &Path,
    expected: &BTreeMap<String, Entry>,
    fs: Filesystem,
) {
    compare(expected, &quill_tree(&fs));
    fs.unmount().unwrap();
    assert_fsck_clean(image);
    println!("{label}: {} paths identical in quill", expected.len());
}

#[test]
fn a_tree_the_kernel_writes_on_ext3_reads_identically_in_quill() {
    let test = "ext3_kernel_to_quill";
    if !can_loop_mount(test) {
        return;
    }
    // (label, block size, the far write's offset, the i_block slot that offset lands under)
    for (label, block_size, far, slot) in
        [("1k", "1024", 70u64 << 20, 14), ("4k", "4096", 20 << 20, 13)]
    {
        let scratch = Scratch::new(&format!("ext3-{label}"));
        let ext3 = ["-t", "ext3", "-b", block_size];
        let Some((image, expected, fs)) = kernel_tree_opened_read_only(&scratch, &ext3, far) else {
            return;
        };
        let (pointer, extents) = mapping_of(&image, &fs, "/sparse", slot);
        assert!(!extents && pointer != 0, "{label}: the far write is under i_block[{slot}]");
        let (double, _) = mapping_of(&image, &fs, "/a/f6", 13);
        assert!(double != 0, "{label}: the 5 MiB file reaches its double-indirect block");
        assert_reads_as_written(label, &image, &expected, fs);
    }
}

/// ext2 (indirect-mapped, no journal) and ext4 made without a journal (extent-mapped): a
/// tree the kernel writes reads identically in quill, read-only (with a journal that has no
/// log) and read-write; quill's changes (the ext3 test's, through a journal whose commits
/// write home) leave an image e2fsck finds clean and the kernel reads identically. While
/// quill has it mounted read-write the superblock says "not clean" (VALID_FS cleared, as
/// ext2 and the kernel's no-journal mode do), and a clean unmount sets it back.
#[test]
fn without_a_journal_ext2_and_ext4_are_read_and_written_as_the_kernel_does() {
    let test = "no_journal_both_ways";
    if !can_loop_mount(test) {
        return;
    }
    let kinds: [(&str, &[&str]); 2] = [
        ("ext2", &["-t", "ext2", "-b", "1024"]),
        ("ext4-no-journal", &["-O", "^has_journal", "-b", "4096"]),
    ];
    for (label, mkfs_options) in kinds {
        let scratch = Scratch::new(&format!("no-journal-{label}"));
        let Some((image, expected, fs)) =
            kernel_tree_opened_read_only(&scratch, mkfs_options, 70 << 20)
        else {
            return;
        };
        let (_, extents) = mapping_of(&image, &fs, "/a/f6", 0);
        assert_eq!(extents, label != "ext2", "{label}: how the files are mapped");
        assert_reads_as_written(label, &image, &expected, fs);
        let fs = Filesystem::open(open_device(&image), MountOptions::default()).unwrap();
        compare(&expected, &quill_tree(&fs));
        let state = || Ext4Image::open(open_device(&image)).unwrap().superblock().state;
        assert_eq!(state() & 1, 0, "{label}: VALID_FS is cleared while mounted");
        // The kernel's sparse file goes (its blocks under every level freed) to make room
        // for quill's.
        fs.unlink(ROOT_INO, b"sparse").unwrap();
        quill_changes_a_tree(&fs, &mut Rng::new(8), 70 << 20);
        let changed = quill_tree(&fs);
        fs.unmount().unwrap();
        assert_eq!(state() & 1, 1, "{label}: VALID_FS is set again by a clean unmount");
        let sb = Ext4Image::open(open_device(&image)).unwrap().superblock().clone();
        assert!(!sb.has_journal() && !sb.needs_recovery(), "{label}: still without a journal");
        kernel_reads_what_quill_wrote(&scratch, &image, &changed);
        println!("{label}: {} paths identical in the kernel after quill's changes", changed.len());
    }
}

/// bigalloc (clusters of 16 blocks, 4 KiB and 1 KiB blocks): a tree the kernel writes reads
/// identically in quill, read-only and read-write, and statfs counts free space in blocks;
/// quill's changes (the ext3 test's, plus preallocation and punches inside clusters the file
/// keeps) leave an image e2fsck finds clean (cluster rules, i_blocks in clusters, free
/// clusters) and the kernel reads identically; the kernel then changes quill's files and
/// quill reads what it wrote.
#[test]
fn bigalloc_images_are_read_and_written_both_ways() {
    let test = "bigalloc_both_ways";
    if !can_loop_mount(test) {
        return;
    }
    for (label, block_size) in [("4k", "4096"), ("1k", "1024")] {
        let scratch = Scratch::new(&format!("bigalloc-{label}"));
        let options = [
            "-O",
            "bigalloc",
            "-b",
            block_size,
            "-C",
            &format!("{}", 16 * block_size.parse::<u32>().unwrap()),
        ];
        let Some((image, expected, fs)) =
            kernel_tree_opened_read_only(&scratch, &options, 20 << 20)
        else {
            return;
        };
        let statfs = fs.statfs();
        assert!(statfs.blocks_free < statfs.blocks, "{label}: {statfs:?}");
        assert!(
            statfs.blocks_free * 2 > statfs.blocks,
            "{label}: free space in blocks: {statfs:?}"
        );
        assert_reads_as_written(label, &image, &expected, fs);
        let fs = Filesystem::open(open_device(&image), MountOptions::default()).unwrap();
        compare(&expected, &quill_tree(&fs));
        fs.unlink(ROOT_INO, b"sparse").unwrap();
        quill_changes_a_tree(&fs, &mut Rng::new(9), 20 << 20);
        let cluster = 16 * u64::from(fs.block_size());
        let held = fs.create(ROOT_INO, b"held", 0o644, 0, 0).unwrap().ino;
        fs.write(held, 0, &Rng::new(10).bytes(5 * cluster as usize + 123)).unwrap();
        // Punches that leave part of a cluster mapped (it stays allocated), that empty one
        // whole, and preallocation beside mapped blocks of the same cluster.
        fs.fallocate(held, FallocateMode::PunchHole, cluster / 4, cluster / 2).unwrap();
        fs.fallocate(held, FallocateMode::PunchHole, cluster, cluster).unwrap();
        fs.fallocate(held, FallocateMode::KeepSize, cluster / 4, cluster / 8).unwrap();
        fs.fallocate(held, FallocateMode::KeepSize, 7 * cluster, 3 * cluster).unwrap();
        fs.truncate(held, 3 * cluster + 5).unwrap();
        let changed = quill_tree(&fs);
        fs.unmount().unwrap();
        kernel_reads_what_quill_wrote(&scratch, &image, &changed);
        let expected = {
            let Some(mount) = Mount::new(&image, scratch.path("mnt-kernel")) else { return };
            let held = mount.dir.join("held");
            let file = std::fs::OpenOptions::new().write(true).open(&held).unwrap();
            file.write_all_at(b"the kernel writes into quill's clusters", cluster / 3).unwrap();
            file.write_all_at(b"and past them", 9 * cluster).unwrap();
            std::fs::remove_file(mount.dir.join("q/f5")).unwrap();
            kernel_tree(&mount.dir)
        };
        assert_fsck_clean(&image);
        let fs = Filesystem::open(open_device(&image), MountOptions::default()).unwrap();
        compare(&expected, &quill_tree(&fs));
        fs.unmount().unwrap();
        assert_fsck_clean(&image);
        println!("{label}: {} paths identical both ways on bigalloc", expected.len());
    }
}

/// quill changes a tree on an indirect-mapped image (files grown into and cut back out of
/// the double- and triple-indirect ranges, punched, renamed, linked, deleted; directories
/// grown) and returns what the kernel must then read there. `far` is an offset under the
/// triple-indirect block.
fn quill_changes_a_tree(fs: &Filesystem, rng: &mut Rng, far: u64) {
    let root = ROOT_INO;
    let dir = fs.mkdir(root, b"q", 0o755, 0, 0).unwrap().ino;
    let sub = fs.mkdir(dir, b"sub", 0o755, 0, 0).unwrap().ino;
    let file = |parent: u32, name: &str, bytes: &[u8]| {
        let ino = fs.create(parent, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
        fs.write(ino, 0, bytes).unwrap();
        ino
    };
    for (i, size) in [0usize, 1, 1024, 12 * 1024 + 1, 300 << 10, 3 << 20].iter().enumerate() {
        file(dir, &format!("f{i}"), &rng.bytes(*size));
    }
    // Data after holes in every range, then cut back level by level.
    let sparse = file(root, "sparse", b"start");
    for offset in [40u64 << 10, 2 << 20, far] {
        fs.write(sparse, offset, b"further out").unwrap();
    }
    let cut = file(root, "cut", b"head");
    fs.write(cut, far, &rng.bytes(100 << 10)).unwrap();
    fs.truncate(cut, 3 << 20).unwrap();
    fs.truncate(cut, 20 << 10).unwrap();
    fs.truncate(cut, 5).unwrap();
    fs.write(cut, 100, b"after the cuts").unwrap();
    // A punch through direct, single- and double-indirect blocks of a dense file.
    let punched = file(root, "punched", &rng.bytes(4 << 20));
    fs.fallocate(punched, FallocateMode::PunchHole, 5000, 3 << 20).unwrap();
    // Deleted whole: every data and indirect block goes back.
    let doomed = file(root, "doomed", &rng.bytes(3 << 20));
    fs.write(doomed, far, b"far").unwrap();
    fs.unlink(root, b"doomed").unwrap();
    // A directory grown past its direct blocks, then thinned; names moved and linked.
    for i in 0..600 {
        file(sub, &format!("entry-{i:04}-with-a-longer-name"), format!("entry {i}").as_bytes());
    }
    for i in (0..600).step_by(3) {
        fs.unlink(sub, format!("entry-{i:04}-with-a-longer-name").as_bytes()).unwrap();
    }
    let f1 = fs.lookup(dir, b"f1").unwrap().ino;
    fs.link(f1, sub, b"f1-again").unwrap();
    fs.rename(dir, b"f2", sub, b"f2-moved", fs::RenameFlags::default()).unwrap();
    fs.symlink(root, b"slow-link-by-quill", "y".repeat(300).as_bytes(), 0, 0).unwrap();
}

/// quill's tree on `image` (unmounted by the caller) is e2fsck-clean and what the kernel
/// reads there.
fn kernel_reads_what_quill_wrote(
    scratch: &Scratch,
    image: &Path,
    expected: &BTreeMap<String, Entry>,
) {
    assert_fsck_clean(image);
    let Some(mount) = Mount::new(image, scratch.path("mnt-check")) else { return };
    compare(expected, &kernel_tree(&mount.dir));
    drop(mount);
    assert_fsck_clean(image);
}

/// ext3, 1 KiB and 4 KiB blocks: a tree quill writes (new files without the extents flag,
/// indirect-mapped to the triple-indirect block) is e2fsck-clean and read identically by the
/// kernel; an indirect file's size limit is the kernel's (EFBIG past it, a write across it
/// cut short); preallocation is refused as ext4 refuses it for such files (EOPNOTSUPP).
#[test]
fn a_tree_quill_writes_on_ext3_reads_identically_in_the_kernel() {
    let test = "ext3_quill_to_kernel";
    if !can_loop_mount(test) {
        return;
    }
    // (label, block size, an offset under the triple-indirect block, the indirect size limit)
    for (label, block_size, far, limit) in [
        ("1k", "1024", 70u64 << 20, 17_247_252_480u64),
        ("4k", "4096", 5u64 << 30, 2_196_873_666_560),
    ] {
        let scratch = Scratch::new(&format!("ext3-quill-{label}"));
        let image = scratch.path("fs.img");
        mkfs(&image, "256M", &["-t", "ext3", "-b", block_size]);
        let fs = Filesystem::open(open_device(&image), MountOptions::default()).unwrap();
        quill_changes_a_tree(&fs, &mut Rng::new(7), far);
        let probe = fs.create(ROOT_INO, b"limit", 0o644, 0, 0).unwrap().ino;
        assert!(matches!(fs.write(probe, limit, b"x"), Err(FsError::FileTooLarge)));
        assert!(matches!(fs.truncate(probe, limit + 1), Err(FsError::FileTooLarge)));
        assert_eq!(fs.write(probe, limit - 3, b"abcdef").unwrap(), 3, "{label}: cut short");
        fs.truncate(probe, 0).unwrap();
        let refused = fs.fallocate(probe, FallocateMode::KeepSize, 0, 4096);
        assert!(matches!(refused, Err(FsError::Unsupported(_))), "{refused:?}");
        fs.unlink(ROOT_INO, b"limit").unwrap();
        let expected = quill_tree(&fs);
        fs.unmount().unwrap();
        let (pointer, extents) = mapping_after(&image, "/sparse", 14);
        assert!(!extents && pointer != 0, "{label}: the far write is under i_block[14]");
        kernel_reads_what_quill_wrote(&scratch, &image, &expected);
        println!("{label}: {} paths identical in the kernel", expected.len());
    }
}

/// [`mapping_of`] on an image quill has unmounted (every inode home).
fn mapping_after(image: &Path, path: &str, slot: usize) -> (u32, bool) {
    let read_only = MountOptions { read_only: true, ..MountOptions::default() };
    let fs = Filesystem::open(open_device(image), read_only).unwrap();
    let mapping = mapping_of(image, &fs, path, slot);
    fs.unmount().unwrap();
    mapping
}

/// On ext3 converted to ext4 (`tune2fs -O extents`): the kernel's old files and directories
/// stay indirect-mapped and quill changes them in place (new files are extent-mapped), as
/// the kernel then reads them.
#[test]
fn on_ext3_converted_to_ext4_quill_changes_indirect_files_in_place() {
    let test = "ext3_converted";
    if !can_loop_mount(test) {
        return;
    }
    let scratch = Scratch::new("ext3-converted");
    let image = scratch.path("fs.img");
    mkfs(&image, "128M", &["-t", "ext3", "-b", "4096"]);
    {
        let Some(mount) = Mount::new(&image, scratch.path("mnt")) else { return };
        kernel_writes_a_tree(&mount.dir, &mut Rng::new(4), 20 << 20);
    }
    let tune = Command::new("tune2fs").args(["-O", "extents"]).arg(&image).output().unwrap();
    assert!(tune.status.success(), "tune2fs: {}", String::from_utf8_lossy(&tune.stderr));
    assert_fsck_clean(&image);
    let fs = Filesystem::open(open_device(&image), MountOptions::default()).unwrap();
    let file = fs.resolve("/a/f5").unwrap();
    let dir = fs.resolve("/a/b").unwrap();
    fs.write(file, 0, b"overwritten in place").unwrap();
    fs.write(file, 6 << 20, b"appended into the double-indirect range").unwrap();
    fs.truncate(file, 100 << 10).unwrap();
    fs.fallocate(file, FallocateMode::PunchHole, 50_000, 30_000).unwrap();
    let refused = fs.fallocate(file, FallocateMode::KeepSize, 0, 4096);
    assert!(matches!(refused, Err(FsError::Unsupported(_))), "{refused:?}");
    for i in 0..200 {
        fs.create(dir, format!("new-{i}").as_bytes(), 0o644, 0, 0).unwrap();
    }
    let new = fs.resolve("/a/b/new-0").unwrap();
    fs.write(new, 0, b"new file").unwrap();
    fs.unlink(fs.resolve("/a").unwrap(), b"f6").unwrap();
    let a = fs.resolve("/a").unwrap();
    fs.link(file, a, b"f5-again").unwrap();
    fs.rename(a, b"f1", dir, b"f1-moved", fs::RenameFlags::default()).unwrap();
    let expected = quill_tree(&fs);
    fs.unmount().unwrap();
    let (_, extents) = mapping_after(&image, "/a/b/new-0", 0);
    assert!(extents, "a new file on the converted image is extent-mapped");
    let (_, extents) = mapping_after(&image, "/a/f5", 0);
    assert!(!extents, "the kernel's old file stays indirect-mapped");
    kernel_reads_what_quill_wrote(&scratch, &image, &expected);
}

/// Damaged indirect maps on a kernel-written ext3 image (1 KiB blocks), opened read-only:
/// block numbers outside the file system, a data pointer onto the superblock's group
/// metadata, an indirect block naming itself, a directory's first block out of range. The
/// files and directories that meet the damage answer errors (a loop reads garbage, bounded by
/// the three levels), nothing panics or hangs, everything else reads as the kernel wrote it,
/// and the image is not written.
#[test]
fn damaged_indirect_maps_give_errors_never_panics_hangs_or_writes() {
    let test = "ext3_damaged_maps";
    if !can_loop_mount(test) {
        return;
    }
    let scratch = Scratch::new("ext3-damaged");
    let Some((image, _, fs)) =
        kernel_tree_opened_read_only(&scratch, &["-t", "ext3", "-b", "1024"], 70 << 20)
    else {
        return;
    };
    let clean = common::read_everything(&fs);
    assert!(clean.values().all(|r| r.is_ok()), "the clean image reads whole");
    let (big, dir) = (fs.resolve("/a/f6").unwrap(), fs.resolve("/a/b").unwrap());
    let blocks_count = Ext4Image::open(open_device(&image)).unwrap().superblock().blocks_count;
    fs.unmount().unwrap();
    let clean_bytes = std::fs::read(&image).unwrap();
    let slot = |ino: u32, i: u64| common::inode_offset(&image, ino) + 0x28 + 4 * i;
    let pointer_at = |offset: u64| {
        u32::from_le_bytes(clean_bytes[offset as usize..offset as usize + 4].try_into().unwrap())
    };
    let single = u64::from(pointer_at(slot(big, 12)));
    let double = u64::from(pointer_at(slot(big, 13)));
    let out_of_range = (blocks_count + 7) as u32;
    // (case, byte offset in the image, new pointer, the path that must fail)
    let cases: [(&str, u64, u32, Option<&str>); 5] = [
        ("single-indirect block out of range", slot(big, 12), out_of_range, Some("/a/f6")),
        ("a data pointer out of range", single * 1024, u32::MAX, Some("/a/f6")),
        ("a data pointer onto group metadata", single * 1024 + 4, 2, Some("/a/f6")),
        ("a double-indirect block naming itself", double * 1024, double as u32, None),
        ("a directory's first block out of range", slot(dir, 0), out_of_range, Some("/a/b/")),
    ];
    for (case, offset, pointer, fails) in cases {
        let mut damaged = clean_bytes.clone();
        damaged[offset as usize..offset as usize + 4].copy_from_slice(&pointer.to_le_bytes());
        std::fs::write(&image, &damaged).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let path = image.clone();
        std::thread::spawn(move || {
            let read_only = MountOptions { read_only: true, ..MountOptions::default() };
            let fs = Filesystem::open(open_device(&path), read_only).unwrap();
            let seen = common::read_everything(&fs);
            let _ = fs.unmount();
            let _ = tx.send(seen);
        });
        let seen = rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("{case}: quill panicked or hung"));
        if let Some(path) = fails {
            let got = seen.get(path).unwrap_or_else(|| panic!("{case}: {path} not reached"));
            assert!(got.as_ref().is_err_and(|e| e.contains("corrupt")), "{case}: {path}: {got:?}");
        }
        for (path, read) in &seen {
            let damaged_path = path == "/a/f6" || path.starts_with("/a/b/");
            assert!(damaged_path || read == &clean[path], "{case}: {path} changed: {read:?}");
        }
        assert!(std::fs::read(&image).unwrap() == damaged, "{case}: the image was written");
    }
}

/// Damaged indirect maps met by changes (a read-write open, errors=continue so that every
/// change is tried): the single-indirect pointer of a file aimed at an inode-table block, and
/// one of its data pointers aimed at a block bitmap. Writes, truncates, a punch and the
/// unlink through them answer errors, nothing panics, and neither metadata block is written
/// as the file's.
#[test]
fn changes_through_damaged_indirect_maps_fail_without_spreading_the_damage() {
    let test = "ext3_damaged_maps_rw";
    if !can_loop_mount(test) {
        return;
    }
    let scratch = Scratch::new("ext3-damaged-rw");
    let Some((image, _, fs)) =
        kernel_tree_opened_read_only(&scratch, &["-t", "ext3", "-b", "1024"], 70 << 20)
    else {
        return;
    };
    let big = fs.resolve("/a/f6").unwrap();
    fs.unmount().unwrap();
    let img = Ext4Image::open(open_device(&image)).unwrap();
    let (itable, bitmap) = (img.group_descs()[0].inode_table, img.group_descs()[0].block_bitmap);
    drop(img);
    let clean_bytes = std::fs::read(&image).unwrap();
    let single_slot = common::inode_offset(&image, big) + 0x28 + 4 * 12;
    let single = u64::from(u32::from_le_bytes(
        clean_bytes[single_slot as usize..single_slot as usize + 4].try_into().unwrap(),
    ));
    // (case, byte offset in the image, new pointer, the metadata block it now names)
    let cases = [
        ("single-indirect block onto the inode table", single_slot, itable as u32, itable),
        ("a data pointer onto a block bitmap", single * 1024 + 8, bitmap as u32, bitmap),
    ];
    for (case, offset, pointer, target) in cases {
        let mut damaged = clean_bytes.clone();
        damaged[offset as usize..offset as usize + 4].copy_from_slice(&pointer.to_le_bytes());
        std::fs::write(&image, &damaged).unwrap();
        let block =
            |bytes: &[u8]| bytes[target as usize * 1024..(target as usize + 1) * 1024].to_vec();
        let target_before = block(&damaged);
        let options = MountOptions { errors: fs::ErrorPolicy::Continue, ..MountOptions::default() };
        let fs = Filesystem::open(open_device(&image), options).unwrap();
        let a = fs.resolve("/a").unwrap();
        let in_single = 14 * 1024 + 100;
        let results = [
            ("write", fs.write(big, in_single, b"through the damage").map(drop)),
            ("truncate", fs.truncate(big, 13 * 1024)),
            ("punch", fs.fallocate(big, FallocateMode::PunchHole, 12 * 1024, 8192)),
            ("unlink", fs.unlink(a, b"f6")),
        ];
        for (op, result) in &results {
            assert!(result.as_ref().is_err_and(|e| e.is_corruption()), "{case}: {op}: {result:?}");
        }
        let _ = fs.unmount();
        assert!(block(&std::fs::read(&image).unwrap()) == target_before, "{case}: written over");
    }
}

/// An ext3 journal (indirect-mapped, JBD2 without checksums or 64-bit tags) that needs
/// recovery: a copy of the image taken while the kernel has it mounted, after a sync. quill
/// opened read-only replays it in memory and reads the tree the kernel had synced; the copy
/// is not written.
#[test]
fn a_crashed_ext3_journal_is_replayed_by_a_read_only_open() {
    let test = "ext3_crashed_journal";
    if !can_loop_mount(test) {
        return;
    }
    let scratch = Scratch::new("ext3-crashed");
    let image = scratch.path("fs.img");
    let crashed = scratch.path("crashed.img");
    mkfs(&image, "128M", &["-t", "ext3", "-b", "1024"]);
    let expected = {
        let Some(mount) = Mount::new(&image, scratch.path("mnt")) else { return };
        kernel_writes_a_tree(&mount.dir, &mut Rng::new(6), 300 << 10);
        assert!(Command::new("sync").status().unwrap().success());
        std::fs::copy(&image, &crashed).unwrap();
        kernel_tree(&mount.dir)
    };
    let sb = Ext4Image::open(open_device(&crashed)).unwrap().superblock().clone();
    if !sb.needs_recovery() {
        println!("SKIP {test}: the kernel checkpointed everything before the copy");
        return;
    }
    let before = std::fs::read(&crashed).unwrap();
    let read_only = MountOptions { read_only: true, ..MountOptions::default() };
    let fs = Filesystem::open(open_device(&crashed), read_only).unwrap();
    compare(&expected, &quill_tree(&fs));
    fs.unmount().unwrap();
    assert!(std::fs::read(&crashed).unwrap() == before, "a read-only open wrote the image");
}
