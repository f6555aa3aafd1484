//! Behaviour: a failed operation does not half-happen, and damage quill finds is recorded as
//! ext4_error records it (issue 14, item 3).
//!
//! Each test makes an image with mkfs.ext4, populates it with quill, damages one structure
//! with the ondisk codecs, runs `e2fsck -fn` (the verdict before), opens it with quill and runs
//! an operation that meets the damage, unmounts, and checks:
//! - the operation failed with EUCLEAN and changed nothing: the name is still there, and
//!   `e2fsck -fn` finds exactly what it found before;
//! - the superblock records the error: ERROR_FS in s_state, s_error_count >= 1, the first and
//!   last error (time, inode, where quill found it, error code), and `dumpe2fs -h` shows them;
//! - errors=remount-ro (the default) turns every later change into EROFS; errors=continue lets
//!   later changes go on.
//!
//! Also: readdir lists no name of a deleted inode (getattr would say it does not exist), and
//! listxattr lists no name getxattr cannot find.

mod common;

use std::path::Path;

use common::Scratch;
use fs::{ErrorPolicy, Filesystem, FsError, MountOptions, SetMode, ROOT_INO};
use ondisk::ext4::{
    self, error_code, parse_extent_node, set_inode_checksum, ExtentEntries, Superblock,
};

use fs::error::errno::{ENOENT, EROFS, EUCLEAN};

fn tools_present(test: &str) -> bool {
    ["mkfs.ext4", "e2fsck", "dumpe2fs"].iter().all(|tool| common::have(tool, test))
}

/// A fresh 1 KiB-block image with metadata_csum, populated by `populate` through quill.
fn image(scratch: &Scratch, populate: impl FnOnce(&Filesystem)) -> std::path::PathBuf {
    let path = scratch.path("fs.img");
    common::mkfs(&path, "8M", &["-b", "1024", "-I", "256"]);
    let fs = Filesystem::open(common::open_device(&path), MountOptions::default()).unwrap();
    populate(&fs);
    fs.unmount().unwrap();
    common::assert_fsck_clean(&path);
    path
}

fn open(path: &Path, errors: ErrorPolicy) -> Filesystem {
    Filesystem::open(common::open_device(path), MountOptions { errors, ..Default::default() })
        .expect("open the damaged image")
}

fn home_superblock(path: &Path) -> Superblock {
    let bytes = std::fs::read(path).unwrap();
    let at = ext4::SUPERBLOCK_OFFSET as usize;
    Superblock::parse(&bytes[at..at + ext4::SUPERBLOCK_SIZE]).unwrap()
}

/// The problem lines of `e2fsck -fn`: no version, pass headers or summary. A journal left by
/// a file system that turned read-only is replayed first (`e2fsck -E journal_only`), as the
/// next mount would: the verdict is on what was committed.
fn fsck_verdict(path: &Path) -> Vec<String> {
    if home_superblock(path).needs_recovery() {
        let out = std::process::Command::new("e2fsck")
            .args(["-y", "-E", "journal_only"])
            .arg(path)
            .output()
            .expect("run e2fsck -E journal_only");
        assert!(out.status.code().is_some_and(|c| c <= 1), "journal replay: {out:?}");
    }
    let (_, text) = common::e2fsck(path);
    let name = path.display().to_string();
    text.lines()
        .map(|l| l.replace(&name, "IMG"))
        .filter(|l| {
            !(l.is_empty()
                || l.starts_with("e2fsck ")
                || l.starts_with("Pass ")
                || l.contains("files (")
                || common::e2fsck_clock_line(l))
        })
        .collect()
}

/// The inode record's bytes in the image (inode-table block from the group descriptor).
fn edit_inode(path: &Path, ino: u32, edit: impl FnOnce(&mut [u8])) {
    let mut bytes = std::fs::read(path).unwrap();
    let image = fs::Ext4Image::open(common::open_device(path)).unwrap();
    let sb = image.superblock().clone();
    let bs = u64::from(sb.block_size());
    let group = (ino - 1) / sb.inodes_per_group;
    let index = u64::from((ino - 1) % sb.inodes_per_group);
    let table = image.group_descs()[group as usize].inode_table;
    let at = (table * bs + index * u64::from(sb.inode_size)) as usize;
    let raw = &mut bytes[at..at + usize::from(sb.inode_size)];
    edit(raw);
    set_inode_checksum(&sb, ino, raw);
    std::fs::write(path, bytes).unwrap();
}

/// Makes /deep, a file whose extent tree has a leaf block (200 one-block extents with holes
/// between them), and /other, an undamaged file.
fn populate_deep(fs: &Filesystem) {
    let bs = u64::from(fs.block_size());
    let deep = fs.create(ROOT_INO, b"deep", 0o644, 0, 0).unwrap();
    for i in 0..200u64 {
        fs.write(deep.ino, 2 * i * bs, &[i as u8; 64]).unwrap();
    }
    let other = fs.create(ROOT_INO, b"other", 0o644, 0, 0).unwrap();
    fs.write(other.ino, 0, b"undamaged\n").unwrap();
}

/// Damages /deep's extent leaf: its checksum no longer matches (a flipped byte).
fn damage_deep_leaf(path: &Path) -> u32 {
    let image = fs::Ext4Image::open(common::open_device(path)).unwrap();
    let fsr = Filesystem::open(
        common::open_device(path),
        MountOptions { read_only: true, ..Default::default() },
    )
    .unwrap();
    let ino = fsr.resolve("/deep").unwrap();
    drop(fsr);
    let inode = image.read_inode(ino).unwrap();
    let (header, entries) = parse_extent_node(&inode.block).unwrap();
    assert!(header.depth >= 1, "/deep must have a tree block");
    let ExtentEntries::Index(indexes) = entries else { panic!("depth >= 1 has indexes") };
    let leaf = indexes[0].leaf;
    let bs = u64::from(image.block_size());
    drop(image);
    let mut bytes = std::fs::read(path).unwrap();
    bytes[(leaf * bs) as usize + 40] ^= 0x01;
    std::fs::write(path, bytes).unwrap();
    ino
}

/// Checks the superblock's error record after an error in inode `ino` (0: any).
fn assert_error_recorded(path: &Path, ino: u32) {
    let sb = home_superblock(path);
    assert_ne!(sb.state & ext4::STATE_ERROR_FS, 0, "ERROR_FS is not set");
    assert!(sb.error_count >= 1, "s_error_count is 0");
    let first = sb.first_error;
    assert!(first.time != 0 && !first.func_name().is_empty(), "no first error: {first:?}");
    assert!(sb.last_error.time >= first.time, "last error before the first");
    assert_eq!(first.errcode, error_code::EFSCORRUPTED);
    if ino != 0 {
        assert_eq!(first.ino, ino, "first error names another inode");
    }
    let header = common::dumpe2fs_header(path);
    for field in ["FS Error count:", "First error time:", "First error function:", "Last error"] {
        assert!(header.contains(field), "dumpe2fs -h does not show {field:?}:\n{header}");
    }
}

/// Every change `fs` is asked for gives EROFS.
fn assert_every_change_refused(fs: &Filesystem) {
    let other = fs.resolve("/other").unwrap();
    let results: Vec<(&str, Result<(), FsError>)> = vec![
        ("write", fs.write(other, 0, b"x").map(drop)),
        ("create", fs.create(ROOT_INO, b"new", 0o644, 0, 0).map(drop)),
        ("mkdir", fs.mkdir(ROOT_INO, b"newdir", 0o755, 0, 0).map(drop)),
        ("truncate", fs.truncate(other, 1)),
        ("setxattr", fs.setxattr(other, b"user.a", b"1", SetMode::Any)),
        ("unlink", fs.unlink(ROOT_INO, b"other")),
    ];
    for (op, result) in results {
        assert_eq!(result.map_err(|e| e.errno()), Err(EROFS), "{op} after the error");
    }
}

#[test]
fn unlink_of_a_file_with_a_damaged_extent_tree_changes_nothing_and_records_the_error() {
    if !tools_present("unlink_damaged_extent_tree") {
        return;
    }
    for errors in [ErrorPolicy::RemountReadOnly, ErrorPolicy::Continue] {
        let scratch = Scratch::new("errors-unlink");
        let path = image(&scratch, populate_deep);
        let ino = damage_deep_leaf(&path);
        let before = fsck_verdict(&path);
        let fs = open(&path, errors);
        let err = fs.unlink(ROOT_INO, b"deep").expect_err("unlink of a damaged file");
        assert_eq!(err.errno(), EUCLEAN, "{err}");
        assert_eq!(fs.resolve("/deep").ok(), Some(ino), "{errors:?}: the name is gone");
        match errors {
            ErrorPolicy::RemountReadOnly => assert_every_change_refused(&fs),
            _ => {
                // The write goes on.
                let other = fs.resolve("/other").unwrap();
                fs.write(other, 0, b"changed").expect("write under errors=continue");
                fs.fsync(other, false).unwrap();
            }
        }
        let _ = fs.unmount();
        assert_error_recorded(&path, ino);
        assert_eq!(home_superblock(&path).error_count, 1, "{errors:?}: one error, counted once");
        assert_eq!(fsck_verdict(&path), before, "{errors:?}: e2fsck's verdict changed");
        // The next mount reads the name and the record back.
        let fs = open(&path, ErrorPolicy::Continue);
        assert_eq!(fs.resolve("/deep").ok(), Some(ino));
        fs.unmount().unwrap();
        assert!(home_superblock(&path).error_count >= 1, "the record did not survive a mount");
    }
}

#[test]
fn truncate_of_a_file_with_a_damaged_extent_tree_changes_nothing() {
    if !tools_present("truncate_damaged_extent_tree") {
        return;
    }
    let scratch = Scratch::new("errors-truncate");
    let path = image(&scratch, populate_deep);
    let ino = damage_deep_leaf(&path);
    let before = fsck_verdict(&path);
    let fs = open(&path, ErrorPolicy::Continue);
    let size = fs.getattr(ino).unwrap().size;
    let err = fs.truncate(ino, 1000).expect_err("truncate of a damaged file");
    assert_eq!(err.errno(), EUCLEAN, "{err}");
    assert_eq!(fs.getattr(ino).unwrap().size, size, "the size changed");
    fs.unmount().unwrap();
    assert_error_recorded(&path, ino);
    assert_eq!(fsck_verdict(&path), before, "e2fsck's verdict changed");
}

/// Where the first in-inode xattr entry of inode record `raw` starts (after the 128-byte base
/// record, `i_extra_isize` and the area's magic).
fn first_xattr_entry(raw: &[u8]) -> usize {
    128 + usize::from(u16::from_le_bytes([raw[0x80], raw[0x81]])) + 4
}

/// Points the first in-inode xattr entry of `ino` at inode `value_ino` (`e_value_inum`), as
/// only the ea_inode feature may.
fn set_value_inum(path: &Path, ino: u32, value_ino: u32) {
    edit_inode(path, ino, |raw| {
        let entry = first_xattr_entry(raw);
        raw[entry + 4..entry + 8].copy_from_slice(&value_ino.to_le_bytes());
    });
}

#[test]
fn unlink_of_a_file_with_an_xattr_in_another_inode_without_ea_inode_is_refused() {
    if !tools_present("unlink_ea_inode_reference") {
        return;
    }
    for errors in [ErrorPolicy::RemountReadOnly, ErrorPolicy::Continue] {
        let scratch = Scratch::new("errors-ea-inode");
        let mut inos = (0, 0);
        let path = image(&scratch, |fs| {
            let file = fs.create(ROOT_INO, b"file", 0o644, 0, 0).unwrap();
            fs.setxattr(file.ino, b"user.v", b"value", SetMode::Create).unwrap();
            let holder = fs.create(ROOT_INO, b"holder", 0o644, 0, 0).unwrap();
            inos = (file.ino, holder.ino);
            let other = fs.create(ROOT_INO, b"other", 0o644, 0, 0).unwrap();
            fs.write(other.ino, 0, b"undamaged\n").unwrap();
        });
        set_value_inum(&path, inos.0, inos.1);
        let before = fsck_verdict(&path);
        let fs = open(&path, errors);
        let err = fs.unlink(ROOT_INO, b"file").expect_err("unlink with an ea_inode reference");
        assert_eq!(err.errno(), EUCLEAN, "{err}");
        assert_eq!(fs.resolve("/file").ok(), Some(inos.0), "{errors:?}: the name is gone");
        if errors == ErrorPolicy::RemountReadOnly {
            assert_every_change_refused(&fs);
        }
        let _ = fs.unmount();
        assert_error_recorded(&path, inos.0);
        assert_eq!(fsck_verdict(&path), before, "{errors:?}: e2fsck's verdict changed");
    }
}

#[test]
fn readdir_lists_no_name_of_a_deleted_inode() {
    if !tools_present("readdir_deleted_inode") {
        return;
    }
    // Deleted as the kernel leaves it (mode kept, dtime set) and as quill does (mode 0).
    for clear_mode in [false, true] {
        let scratch = Scratch::new("errors-readdir");
        let mut ino = 0;
        let path = image(&scratch, |fs| {
            ino = fs.create(ROOT_INO, b"gone", 0o644, 0, 0).unwrap().ino;
            fs.create(ROOT_INO, b"kept", 0o644, 0, 0).unwrap();
        });
        edit_inode(&path, ino, |raw| {
            raw[0x1A..0x1C].copy_from_slice(&0u16.to_le_bytes());
            raw[0x14..0x18].copy_from_slice(&1_700_000_000u32.to_le_bytes());
            if clear_mode {
                raw[0..2].copy_from_slice(&0u16.to_le_bytes());
            }
        });
        let fs = open(&path, ErrorPolicy::Continue);
        let names: Vec<Vec<u8>> =
            common::list_dir(&fs, ROOT_INO, 2).into_iter().map(|e| e.name).collect();
        assert!(names.contains(&b"kept".to_vec()));
        for entry in common::list_dir(&fs, ROOT_INO, 64) {
            assert!(
                fs.getattr(entry.ino).is_ok(),
                "readdir lists {:?} but getattr says it does not exist",
                String::from_utf8_lossy(&entry.name)
            );
        }
        assert!(!names.contains(&b"gone".to_vec()), "mode cleared {clear_mode}: listed");
        assert_eq!(fs.lookup(ROOT_INO, b"gone").map_err(|e| e.errno()), Err(ENOENT));
        fs.unmount().unwrap();
    }
}

#[test]
fn listxattr_lists_only_names_getxattr_finds() {
    if !tools_present("listxattr_consistent") {
        return;
    }
    let scratch = Scratch::new("errors-listxattr");
    let mut ino = 0;
    let path = image(&scratch, |fs| {
        ino = fs.create(ROOT_INO, b"file", 0o644, 0, 0).unwrap().ino;
        fs.setxattr(ino, b"user.posix_acl_access", b"v", SetMode::Create).unwrap();
        fs.setxattr(ino, b"user.fine", b"w", SetMode::Create).unwrap();
    });
    // The first entry's name index becomes 7 (system.): "system.posix_acl_access", which
    // names another attribute (index 2).
    edit_inode(&path, ino, |raw| {
        let entry = first_xattr_entry(raw);
        assert_eq!(&raw[entry + 16..entry + 32], b"posix_acl_access");
        raw[entry + 1] = 7;
    });
    let fs = open(&path, ErrorPolicy::Continue);
    let names = fs.listxattr(ino).expect("listxattr");
    assert!(names.contains(&b"user.fine".to_vec()), "{names:?}");
    for name in &names {
        assert!(
            fs.getxattr(ino, name).is_ok(),
            "listxattr lists {:?} but getxattr does not find it",
            String::from_utf8_lossy(name)
        );
    }
    fs.unmount().unwrap();
}

#[test]
fn mkdir_meeting_a_damaged_block_bitmap_under_errors_continue_leaves_no_inode_behind() {
    if !tools_present("mkdir_damaged_block_bitmap") {
        return;
    }
    let scratch = Scratch::new("errors-mkdir");
    let path = image(&scratch, |fs| {
        let other = fs.create(ROOT_INO, b"other", 0o644, 0, 0).unwrap();
        fs.write(other.ino, 0, b"undamaged\n").unwrap();
    });
    // The block bitmap's checksum no longer matches (the 8 MiB image has one group): the
    // directory's first block cannot be allocated, after its inode was.
    let image = fs::Ext4Image::open(common::open_device(&path)).unwrap();
    let bitmap = image.group_descs()[0].block_bitmap;
    let bs = u64::from(image.block_size());
    drop(image);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[(bitmap * bs) as usize + 900] ^= 0x10;
    std::fs::write(&path, bytes).unwrap();
    let before = fsck_verdict(&path);
    let fs = open(&path, ErrorPolicy::Continue);
    let err = fs.mkdir(ROOT_INO, b"new", 0o755, 0, 0).expect_err("mkdir with a bad bitmap");
    assert_eq!(err.errno(), EUCLEAN, "{err}");
    assert_eq!(fs.lookup(ROOT_INO, b"new").map_err(|e| e.errno()), Err(ENOENT));
    let _ = fs.unmount();
    assert_error_recorded(&path, 0);
    assert_eq!(fsck_verdict(&path), before, "e2fsck's verdict changed");
}
