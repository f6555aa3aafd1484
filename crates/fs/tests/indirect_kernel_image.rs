//! ext3 images, whose files and directories map their blocks indirectly (12 direct blocks,
//! then single-, double- and triple-indirect blocks): a tree the kernel writes there is read
//! identically by quill opened read-only, with 1 KiB blocks (where a 70 MiB offset takes the
//! triple-indirect block) and 4 KiB; quill refuses to open ext3 read-write, naming the extent
//! feature; and on the image converted to ext4 (`tune2fs -O extents`, which leaves the old
//! files indirect) quill refuses every change to the old files and directories with
//! EOPNOTSUPP before changing anything, and stays writable, the image e2fsck-clean and still
//! what the kernel wrote. ext2 and ext4 made without a journal read the same way, read-only.
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
use fs::{Ext4Image, FallocateMode, Filesystem, FsError, MountOptions, SetAttr, ROOT_INO};

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
/// `far`), checked clean; a read-write open refused with a reason containing `refusal`; and
/// the image opened read-only. `None` (after a SKIP line) where the kernel cannot mount it.
fn kernel_tree_opened_read_only(
    scratch: &Scratch,
    mkfs_options: &[&str],
    far: u64,
    refusal: &str,
) -> Option<(PathBuf, BTreeMap<String, Entry>, Filesystem)> {
    let image = scratch.path("fs.img");
    mkfs(&image, "128M", mkfs_options);
    let expected = {
        let mount = Mount::new(&image, scratch.path("mnt"))?;
        kernel_writes_a_tree(&mount.dir, &mut Rng::new(3), far);
        kernel_tree(&mount.dir)
    };
    assert_fsck_clean(&image);
    match Filesystem::open(open_device(&image), MountOptions::default()) {
        Err(FsError::Unsupported(why)) => assert!(why.contains(refusal), "{why}"),
        Err(other) => panic!("{mkfs_options:?}: read-write open failed otherwise: {other}"),
        Ok(_) => panic!("{mkfs_options:?}: quill opened the image read-write"),
    }
    let read_only = MountOptions { read_only: true, ..MountOptions::default() };
    let fs = Filesystem::open(open_device(&image), read_only).unwrap();
    Some((image, expected, fs))
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
        let Some((image, expected, fs)) =
            kernel_tree_opened_read_only(&scratch, &ext3, far, "extent feature")
        else {
            return;
        };
        let (pointer, extents) = mapping_of(&image, &fs, "/sparse", slot);
        assert!(!extents && pointer != 0, "{label}: the far write is under i_block[{slot}]");
        let (double, _) = mapping_of(&image, &fs, "/a/f6", 13);
        assert!(double != 0, "{label}: the 5 MiB file reaches its double-indirect block");
        let seen = quill_tree(&fs);
        compare(&expected, &seen);
        fs.unmount().unwrap();
        assert_fsck_clean(&image);
        println!("{label}: {} paths identical in quill", expected.len());
    }
}

/// ext2 (indirect-mapped, no journal) and ext4 made without a journal (extent-mapped): a
/// tree the kernel writes reads identically in quill opened read-only (with a journal that
/// has no log); a read-write open is refused, naming the missing journal.
#[test]
fn without_a_journal_ext2_and_ext4_read_identically_read_only() {
    let test = "no_journal_kernel_to_quill";
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
            kernel_tree_opened_read_only(&scratch, mkfs_options, 70 << 20, "without a journal")
        else {
            return;
        };
        let (_, extents) = mapping_of(&image, &fs, "/a/f6", 0);
        assert_eq!(extents, label != "ext2", "{label}: how the files are mapped");
        compare(&expected, &quill_tree(&fs));
        fs.unmount().unwrap();
        assert_fsck_clean(&image);
        println!("{label}: {} paths identical in quill", expected.len());
    }
}

#[test]
fn on_ext3_converted_to_ext4_quill_refuses_to_change_indirect_files_and_stays_writable() {
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
    let before = quill_tree(&fs);
    let file = fs.resolve("/a/f5").unwrap();
    let dir = fs.resolve("/a").unwrap();
    let refused = |what: &str, result: Result<(), FsError>| match result {
        Err(FsError::Unsupported(why)) => assert!(why.contains("indirectly"), "{what}: {why}"),
        other => panic!("{what}: {other:?}, expected EOPNOTSUPP"),
    };
    refused("write", fs.write(file, 0, b"x").map(drop));
    refused("append", fs.write(file, 300 << 10, b"x").map(drop));
    refused("truncate", fs.truncate(file, 10));
    refused("fallocate", fs.fallocate(file, FallocateMode::KeepSize, 0, 4096));
    refused("create", fs.create(dir, b"new", 0o644, 0, 0).map(drop));
    refused("mkdir in the root", fs.mkdir(ROOT_INO, b"new", 0o755, 0, 0).map(drop));
    refused("link", fs.link(file, dir, b"second").map(drop));
    refused("rename", fs.rename(dir, b"f1", dir, b"f1-renamed", fs::RenameFlags::default()));
    assert!(fs.unlink(dir, b"f2").is_err(), "unlinking an indirect file frees its blocks");
    // Nothing was marked broken: what changes no mapping still works.
    let chmod = SetAttr { mode: Some(0o600), ..SetAttr::default() };
    fs.setattr(file, &chmod).unwrap();
    let mut after = quill_tree(&fs);
    after.get_mut("a/f5").unwrap().mode = before["a/f5"].mode;
    compare(&before, &after);
    fs.unmount().unwrap();
    assert_fsck_clean(&image);
}
