//! The orphan file (feature orphan_file): quill records orphans in it, frees them at the next
//! open after a crash, and leaves blocks e2fsck accepts; e2fsck's own replay frees what quill
//! recorded; orphan_present is set while mounted and cleared at a clean unmount. And an
//! ext3-style orphan (an indirect-mapped file) is finished at mount as the others are.

mod common;

use std::process::Command;
use std::sync::Arc;

use blockdev::BlockDevice;
use common::{assert_fsck_clean, debugfs_write, e2fsck, have_tools, mkfs, open_device, Scratch};
use fs::{Ext4Image, Filesystem, MountOptions, ROOT_INO};
use ondisk::ext4::feature;

fn ro_compat(dev: &Arc<dyn BlockDevice>) -> u32 {
    Ext4Image::open(dev.clone()).unwrap().superblock().feature_ro_compat
}

/// Leaves `count` files unlinked while open on a crashed image; returns the free inode count
/// of the file system as it was before they were created.
fn crash_with_open_unlinked_files(image: &std::path::Path, count: usize) -> u64 {
    let dev = open_device(image);
    let fs = Filesystem::open(dev.clone(), MountOptions::default()).unwrap();
    assert!(ro_compat(&dev) & feature::RO_COMPAT_ORPHAN_PRESENT != 0, "set while mounted");
    let free_before = fs.statfs().inodes_free;
    let mut open = Vec::new();
    for i in 0..count {
        let name = format!("doomed{i}");
        let ino = fs.create(ROOT_INO, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
        fs.write(ino, 0, &vec![i as u8; 50_000]).unwrap();
        fs.fsync(ino, false).unwrap();
        open.push(fs.open_inode(ino).unwrap());
        fs.unlink(ROOT_INO, name.as_bytes()).unwrap();
    }
    fs.sync().unwrap();
    fs.crash();
    free_before
}

#[test]
fn unlinked_open_files_in_the_orphan_file_are_freed_after_a_crash() {
    if !have_tools(&["mkfs.ext4", "e2fsck"]) {
        return;
    }
    let scratch = Scratch::new("orphan-file");
    let image = scratch.path("fs.img");
    mkfs(&image, "32M", &["-b", "1024", "-O", "orphan_file"]);
    // More orphans than one 1 KiB orphan block holds (254), to use several blocks.
    let free_before = crash_with_open_unlinked_files(&image, 300);

    // e2fsck's replay (a copy) frees what quill recorded: the orphan blocks parse and their
    // checksums hold.
    let copy = scratch.path("copy.img");
    std::fs::copy(&image, &copy).unwrap();
    let out = Command::new("e2fsck").arg("-fy").arg(&copy).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.code().is_some_and(|c| c <= 1), "e2fsck -fy: {text}");
    assert_fsck_clean(&copy);

    // quill's open frees them too, and leaves the same free counts.
    let dev = open_device(&image);
    let fs = Filesystem::open(dev.clone(), MountOptions::default()).unwrap();
    assert_eq!(fs.statfs().inodes_free, free_before, "every orphan was freed");
    fs.unmount().unwrap();
    assert!(ro_compat(&dev) & feature::RO_COMPAT_ORPHAN_PRESENT == 0, "cleared at unmount");
    assert_fsck_clean(&image);
}

#[test]
fn orphan_file_slots_are_given_back_when_files_close() {
    if !have_tools(&["mkfs.ext4", "e2fsck"]) {
        return;
    }
    let scratch = Scratch::new("orphan-file-close");
    let image = scratch.path("fs.img");
    mkfs(&image, "32M", &["-O", "orphan_file"]);
    let fs = Arc::new(Filesystem::open(open_device(&image), MountOptions::default()).unwrap());
    // Eight threads unlink open files and close them, over and over: slots are taken and given
    // back concurrently; a truncate (also an orphan while it runs) joins in.
    std::thread::scope(|s| {
        for t in 0..8 {
            let fs = fs.clone();
            s.spawn(move || {
                let dir = fs.mkdir(ROOT_INO, format!("t{t}").as_bytes(), 0o755, 0, 0).unwrap().ino;
                for i in 0..40 {
                    let name = format!("f{i}");
                    let ino = fs.create(dir, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
                    fs.write(ino, 0, &vec![7u8; 20_000]).unwrap();
                    fs.truncate(ino, 3000).unwrap();
                    let handle = fs.open_inode(ino).unwrap();
                    fs.unlink(dir, name.as_bytes()).unwrap();
                    fs.close_inode(&handle).unwrap();
                }
            });
        }
    });
    Arc::into_inner(fs).unwrap().unmount().unwrap();
    // e2fsck checks that every orphan block is empty, with its magic and checksum.
    assert_fsck_clean(&image);
}

/// An image (4 KiB blocks, extent journal) with `/f`, inode 12: 32 KiB mapped by eight direct
/// block pointers and no extents flag, as ext3 writes files; e2fsck -fn finds it clean.
fn image_with_an_indirect_mapped_file(scratch: &Scratch) -> std::path::PathBuf {
    let image = scratch.path("fs.img");
    mkfs(&image, "64M", &["-b", "4096"]);
    let free = debugfs_write(&image, "ffb 8 5000\n");
    let blocks: Vec<u64> = free
        .split("Free blocks found:")
        .nth(1)
        .expect("ffb output")
        .split_whitespace()
        .map_while(|w| w.parse().ok())
        .collect();
    assert_eq!(blocks.len(), 8, "debugfs ffb: {free}");
    // The blocks are marked in use; e2fsck -fy then fixes the free counts.
    let mut script = String::from("write /dev/null f\nsif f flags 0\nsif f size 32768\n");
    for (i, b) in blocks.iter().enumerate() {
        script += &format!("sif f block[{i}] {b}\nsetb {b}\n");
    }
    script += "sif f blocks 64\n";
    debugfs_write(&image, &script);
    let out = Command::new("e2fsck").arg("-fy").arg(&image).output().unwrap();
    assert!(out.status.code().is_some_and(|c| c <= 1), "{out:?}");
    assert_fsck_clean(&image);
    image
}

/// The free blocks of the unmounted image at `image`, as a read-only open counts them (blocks
/// freed while mounted count only once their transaction is checkpointed).
fn free_blocks(image: &std::path::Path) -> u64 {
    let read_only = MountOptions { read_only: true, ..MountOptions::default() };
    let fs = Filesystem::open(open_device(image), read_only).unwrap();
    let free = fs.statfs().blocks_free;
    fs.unmount().unwrap();
    free
}

/// An orphan whose truncate to 0 was cut short, on a file mapped by block pointers (no extents
/// flag, as ext3 writes), on an extent-journal image: a read-write open finishes it as the
/// kernel would (the blocks freed, the orphan list emptied), where dropping it from the list
/// with its blocks allocated would let e2fsck make the stale blocks the file's contents.
#[test]
fn an_indirect_mapped_orphan_is_finished_at_mount() {
    if !have_tools(&["mkfs.ext4", "e2fsck", "debugfs"]) {
        return;
    }
    let scratch = Scratch::new("orphan-indirect");
    let image = image_with_an_indirect_mapped_file(&scratch);
    let free_before = free_blocks(&image);
    // The crash: i_size already 0, the blocks not yet freed, the inode on the orphan list.
    debugfs_write(&image, "sif f size 0\nssv last_orphan 12\n");
    let (_, before) = e2fsck(&image);
    assert!(before.contains("i_size is 0, should be 32768"), "{before}");

    let fs = Filesystem::open(open_device(&image), MountOptions::default()).unwrap();
    let f = fs.lookup(ROOT_INO, b"f").unwrap();
    assert_eq!((f.size, f.blocks), (0, 0), "the truncate is finished");
    fs.unmount().unwrap();
    assert_eq!(free_blocks(&image), free_before + 8, "its blocks are free");
    let sb = Ext4Image::open(open_device(&image)).unwrap().superblock().clone();
    assert_eq!(sb.last_orphan, 0, "the orphan list is empty");
    assert_fsck_clean(&image);
}

/// Unlinking an indirect-mapped file frees its blocks; e2fsck finds the image clean.
#[test]
fn unlinking_an_indirect_mapped_file_frees_its_blocks() {
    if !have_tools(&["mkfs.ext4", "e2fsck", "debugfs"]) {
        return;
    }
    let scratch = Scratch::new("unlink-indirect");
    let image = image_with_an_indirect_mapped_file(&scratch);
    let free_before = free_blocks(&image);
    let fs = Filesystem::open(open_device(&image), MountOptions::default()).unwrap();
    fs.unlink(ROOT_INO, b"f").unwrap();
    assert!(fs.lookup(ROOT_INO, b"f").is_err());
    fs.unmount().unwrap();
    assert_eq!(free_blocks(&image), free_before + 8);
    assert_fsck_clean(&image);
}
