//! ea_inode images: extended-attribute values the kernel keeps in inodes of their own (values
//! too large for the inode and an xattr block, one inode shared by equal values, values of
//! several blocks) read identically by quill; damaged value inodes (flag cleared, size or
//! value changed) give corruption errors on that attribute alone; values quill writes (in
//! the inode, in a block, in inodes of their own; replaced, removed, their files deleted,
//! a shared value inode released by one of its two owners) leave an image e2fsck finds
//! clean, with the owners' i_blocks charged as the kernel charges them, and the kernel reads
//! them as quill does. Needs root, loop devices and e2fsprogs; skips with a printed reason
//! otherwise.

mod common;

use std::path::Path;
use std::process::Command;

use common::{
    assert_fsck_clean, can_loop_mount, compare, kernel_tree, open_device, quill_tree, Mount,
    Scratch,
};
use fs::{Ext4Image, Filesystem, FsError, MountOptions, SetMode, ROOT_INO};

/// `setfattr -n name -v value path` through the kernel; false (after a SKIP line) without
/// setfattr.
fn setfattr(path: &Path, name: &str, value: &str) -> bool {
    match Command::new("setfattr").args(["-n", name, "-v", value]).arg(path).status() {
        Ok(status) => {
            assert!(status.success(), "setfattr {name} on {}", path.display());
            true
        }
        Err(e) => {
            println!("SKIP ea_inode values: setfattr: {e}");
            false
        }
    }
}

/// The kernel's tree: values in the inode, in a block, and in inodes of their own (one shared
/// by two files, one of 60,000 bytes over several blocks).
fn kernel_writes(m: &Path) -> bool {
    let big = "b".repeat(8000);
    let bigger: String = (0..60_000).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
    std::fs::write(m.join("one"), b"first file").unwrap();
    std::fs::write(m.join("two"), b"second file").unwrap();
    std::fs::create_dir(m.join("dir")).unwrap();
    setfattr(&m.join("one"), "user.small", "in the inode")
        && setfattr(&m.join("one"), "user.big", &big)
        && setfattr(&m.join("two"), "user.same", &big)
        && setfattr(&m.join("two"), "user.block", &"k".repeat(600))
        && setfattr(&m.join("dir"), "user.bigger", &bigger)
}

/// Inode `ino`'s record offset in the image and the record.
fn record(image: &Path, ino: u32) -> (usize, Vec<u8>) {
    let at = common::inode_offset(image, ino) as usize;
    let bytes = std::fs::read(image).unwrap();
    let isz = Ext4Image::open(open_device(image)).unwrap().superblock().inode_size as usize;
    (at, bytes[at..at + isz].to_vec())
}

#[test]
fn values_in_inodes_of_their_own_read_as_the_kernel_wrote_them() {
    let test = "ea_inode_kernel_to_quill";
    if !can_loop_mount(test) {
        return;
    }
    let scratch = Scratch::new("ea-inode");
    let image = scratch.path("fs.img");
    // Without metadata_csum, so that the damage below meets the value checks, not a checksum.
    common::mkfs(&image, "64M", &["-O", "ea_inode,^metadata_csum", "-b", "4096"]);
    let expected = {
        let Some(mount) = Mount::new(&image, scratch.path("mnt")) else { return };
        if !kernel_writes(&mount.dir) {
            return;
        }
        kernel_tree(&mount.dir)
    };
    assert_fsck_clean(&image);
    let read_only = MountOptions { read_only: true, ..MountOptions::default() };
    let fs = Filesystem::open(open_device(&image), read_only.clone()).unwrap();
    let tree = quill_tree(&fs);
    compare(&expected, &tree);
    assert_eq!(tree["dir"].xattrs[&b"user.bigger"[..]].len(), 60_000);
    assert_eq!(tree["one"].xattrs[&b"user.big"[..]], vec![b'b'; 8000]);
    // Which inode holds each value, for the damage below.
    let one = fs.resolve("/one").unwrap();
    fs.unmount().unwrap();
    let (_, one_record) = record(&image, one);
    // The value inode of /one's user.big: e_value_inum of the entry after the small one.
    let area = &one_record[128 + u16::from_le_bytes([one_record[128], one_record[129]]) as usize..];
    let entries = ondisk::ext4::xattr::parse_inode_xattrs(area).unwrap();
    let value_ino = entries.iter().find_map(|e| e.value_inode).expect("a value inode").ino;
    // A value inode is no file to a handle lookup (the kernel's iget refuses it as one).
    let fs = Filesystem::open(open_device(&image), read_only.clone()).unwrap();
    assert!(matches!(fs.lookup_by_number(value_ino), Err(FsError::NotFound)));
    assert!(fs.lookup_by_number(one).is_ok());
    fs.unmount().unwrap();
    let clean = std::fs::read(&image).unwrap();
    let (at, value_record) = record(&image, value_ino);
    let block_of = |rec: &[u8]| {
        // The first extent's start (depth 0): ee_start_lo at i_block + 12 + 8.
        u64::from(u32::from_le_bytes(rec[0x28 + 20..0x28 + 24].try_into().unwrap()))
    };
    let value_block = block_of(&value_record) as usize * 4096;
    let cases: Vec<(&str, usize, Vec<u8>)> = vec![
        // i_flags' third byte holds EA_INODE_FL (0x0020_0000).
        ("EA_INODE_FL cleared", at + 0x22, vec![value_record[0x22] & !0x20]),
        ("size changed", at + 0x04, 7999u32.to_le_bytes().to_vec()),
        ("value changed", value_block + 100, b"X".to_vec()),
    ];
    for (case, offset, bytes) in cases {
        let mut damaged = clean.clone();
        damaged[offset..offset + bytes.len()].copy_from_slice(&bytes);
        std::fs::write(&image, &damaged).unwrap();
        let fs = Filesystem::open(open_device(&image), read_only.clone()).unwrap();
        let got = fs.getxattr(one, b"user.big");
        assert!(got.as_ref().is_err_and(FsError::is_corruption), "{case}: {got:?}");
        assert_eq!(fs.getxattr(one, b"user.small").unwrap(), b"in the inode", "{case}");
        let _ = fs.unmount();
        assert!(std::fs::read(&image).unwrap() == damaged, "{case}: a read-only open wrote");
        println!("{case}: corruption on that value, the others read");
    }
}

/// A value of `len` bytes, different for each `seed`.
fn value(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

#[test]
fn values_quill_writes_in_inodes_of_their_own_are_clean_and_read_by_the_kernel() {
    let test = "ea_inode_quill_to_kernel";
    if !can_loop_mount(test) {
        return;
    }
    for (label, block_size) in [("4k", "4096"), ("1k", "1024")] {
        let scratch = Scratch::new(&format!("ea-inode-rw-{label}"));
        let image = scratch.path("fs.img");
        common::mkfs(&image, "64M", &["-O", "ea_inode", "-b", block_size]);
        {
            let Some(mount) = Mount::new(&image, scratch.path("mnt")) else { return };
            if !kernel_writes(&mount.dir) {
                return;
            }
        }
        let fs = Filesystem::open(open_device(&image), MountOptions::default()).unwrap();
        let bs: usize = block_size.parse().unwrap();
        let file = fs.create(ROOT_INO, b"quill", 0o644, 1000, 1000).unwrap().ino;
        // In the inode, in a block, and past a block less 56 bytes: in an inode of its own;
        // 64 KiB (XATTR_SIZE_MAX) over many blocks.
        let sizes =
            [("user.small", 20), ("user.medium", bs / 2), ("user.large", bs), ("user.max", 65536)];
        for (i, (name, len)) in sizes.iter().enumerate() {
            fs.setxattr(file, name.as_bytes(), &value(*len, i as u8), SetMode::Create).unwrap();
        }
        for (i, (name, len)) in sizes.iter().enumerate() {
            assert_eq!(fs.getxattr(file, name.as_bytes()).unwrap(), value(*len, i as u8), "{name}");
        }
        let charged = fs.getattr(file).unwrap().blocks;
        assert!(charged * 512 >= (bs + 65536) as u64, "{label}: the owner is charged: {charged}");
        // Replaced by a small value, by another large one; removed.
        fs.setxattr(file, b"user.large", b"now small", SetMode::Replace).unwrap();
        fs.setxattr(file, b"user.medium", &value(3 * bs, 9), SetMode::Replace).unwrap();
        fs.removexattr(file, b"user.max").unwrap();
        // A file whose large values go with it, in the inode and in its block.
        let doomed = fs.create(ROOT_INO, b"doomed", 0o644, 0, 0).unwrap().ino;
        fs.setxattr(doomed, b"user.filler", &value(bs / 2, 1), SetMode::Create).unwrap();
        for i in 0..6 {
            let name = format!("user.value-{i}");
            fs.setxattr(doomed, name.as_bytes(), &value(2 * bs, i), SetMode::Create).unwrap();
        }
        fs.unlink(ROOT_INO, b"doomed").unwrap();
        // The kernel's shared value inode (ref 2) loses one owner.
        let two = fs.resolve("/two").unwrap();
        fs.removexattr(two, b"user.same").unwrap();
        let changed = quill_tree(&fs);
        fs.unmount().unwrap();
        assert_fsck_clean(&image);
        let Some(mount) = Mount::new(&image, scratch.path("mnt-check")) else { return };
        compare(&changed, &kernel_tree(&mount.dir));
        drop(mount);
        assert_fsck_clean(&image);
        println!("{label}: quill's values read identically by the kernel, e2fsck clean");
    }
}
