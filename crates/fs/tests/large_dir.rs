//! large_dir (`mkfs.ext4 -O large_dir`): a directory whose hashed index needs a third level
//! (1 KiB blocks and 255-byte names fill a two-level index at about 31,000 names) grows one
//! in quill, as the kernel's ext4 grows it, where without the feature the directory is full
//! (ENOSPC, "directory index full"). e2fsck finds the tree clean, and the kernel finds every
//! name; quill reads the directory back after a remount.
//! Needs e2fsprogs (and root with loop devices for the kernel's part); skips with a printed
//! reason otherwise.

mod common;

use common::{assert_fsck_clean, can_loop_mount, have, mkfs, open_device, Mount, Scratch};
use fs::{Ext4Image, Filesystem, FsError, MountOptions, ROOT_INO};
use ondisk::ext4::htree;

/// Name `n`: 255 bytes, so three fit a 1 KiB leaf.
fn name(n: u32) -> Vec<u8> {
    let mut name = format!("{n:08}-").into_bytes();
    name.resize(255, b'q');
    name
}

/// The index depth below the root of directory `/big` on the unmounted `image`.
fn index_levels(image: &std::path::Path) -> u8 {
    let read_only = MountOptions { read_only: true, ..MountOptions::default() };
    let fs = Filesystem::open(open_device(image), read_only).unwrap();
    let ino = fs.resolve("/big").unwrap();
    fs.unmount().unwrap();
    let img = Ext4Image::open(open_device(image)).unwrap();
    let inode = img.read_inode(ino).unwrap();
    let first = img.extents(ino, &inode).unwrap()[0].start;
    let block = img.read_block(first).unwrap();
    htree::parse_dx_root(&block, img.superblock().has_metadata_csum()).unwrap().indirect_levels
}

#[test]
fn a_directory_grows_a_third_index_level_with_large_dir_and_is_full_without() {
    let test = "large_dir";
    if !have("mkfs.ext4", test) || !have("e2fsck", test) {
        return;
    }
    let scratch = Scratch::new("large-dir");
    // Without large_dir: names until the two-level index is full.
    let plain = scratch.path("plain.img");
    mkfs(&plain, "300M", &["-b", "1024", "-N", "80000", "-O", "^large_dir"]);
    let fs = Filesystem::open(open_device(&plain), MountOptions::default()).unwrap();
    let dir = fs.mkdir(ROOT_INO, b"big", 0o755, 0, 0).unwrap().ino;
    let mut full_at = 0;
    let err = loop {
        match fs.create(dir, &name(full_at), 0o644, 0, 0) {
            Ok(_) => full_at += 1,
            Err(e) => break e,
        }
        assert!(full_at < 60_000, "the index never filled");
    };
    assert!(matches!(err, FsError::NoSpace), "{err}");
    fs.unmount().unwrap();
    assert_fsck_clean(&plain);
    assert_eq!(index_levels(&plain), 1);
    // With large_dir: the same names and 5,000 more, under a third level.
    let large = scratch.path("large.img");
    mkfs(&large, "300M", &["-b", "1024", "-N", "80000", "-O", "large_dir"]);
    let fs = Filesystem::open(open_device(&large), MountOptions::default()).unwrap();
    let dir = fs.mkdir(ROOT_INO, b"big", 0o755, 0, 0).unwrap().ino;
    let n = full_at + 5000;
    for i in 0..n {
        fs.create(dir, &name(i), 0o644, 0, 0).unwrap();
    }
    fs.unmount().unwrap();
    assert_fsck_clean(&large);
    assert_eq!(index_levels(&large), 2);
    let fs = Filesystem::open(open_device(&large), MountOptions::default()).unwrap();
    let dir = fs.resolve("/big").unwrap();
    for i in (0..n).step_by(997) {
        assert!(fs.lookup(dir, &name(i)).is_ok(), "name {i} after remount");
    }
    fs.unmount().unwrap();
    println!("{full_at} names fill a two-level index; {n} fit under three levels");
    if !can_loop_mount(test) {
        return;
    }
    let Some(mount) = Mount::new(&large, scratch.path("mnt")) else { return };
    let listed = std::fs::read_dir(mount.dir.join("big")).unwrap().count();
    assert_eq!(listed, n as usize, "the kernel lists every name");
    for i in (0..n).step_by(1009) {
        let path = mount.dir.join("big").join(String::from_utf8(name(i)).unwrap());
        assert!(path.exists(), "the kernel finds name {i}");
    }
    drop(mount);
    assert_fsck_clean(&large);
}
