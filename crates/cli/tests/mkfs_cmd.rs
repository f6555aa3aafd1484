//! Behaviour of `quill mkfs`: it creates images e2fsck finds clean, passes its options through,
//! describes every option in `--help`, rejects bad values with one line and exit status 2, and
//! refuses to overwrite an existing ext4 image without `-F` (exit status 1, image untouched).

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use common::*;

/// `dumpe2fs -h` as key → value.
fn dumpe2fs_header(image: &Path) -> BTreeMap<String, String> {
    let o = run(Command::new("dumpe2fs").arg("-h").arg(image));
    assert!(o.status.success(), "dumpe2fs: {}", text(&o));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|line| line.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

fn assert_usage_error(args: &[&str], what: &str, must_name: &str) {
    let o = run(quill().arg("mkfs").args(args));
    assert_eq!(o.status.code(), Some(2), "{what}: {}", text(&o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(stderr.trim_end().lines().count(), 1, "{what}: one line: {stderr}");
    assert!(stderr.starts_with("quill: "), "{what}: {stderr}");
    assert!(stderr.contains(must_name), "{what}: should name '{must_name}': {stderr}");
}

#[test]
fn mkfs_creates_a_missing_image_of_the_given_size_that_e2fsck_finds_clean() {
    let test = "mkfs_creates_a_missing_image_of_the_given_size_that_e2fsck_finds_clean";
    if !have("e2fsck", test) || !have("dumpe2fs", test) {
        return;
    }
    let scratch = Scratch::new("mkfs-create");
    let image = scratch.path("new.img");
    let o = run(quill().args(["mkfs"]).arg(&image).arg("64M"));
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("Creating filesystem with 16384 4k blocks"), "{out}");
    assert_eq!(std::fs::metadata(&image).unwrap().len(), 64 << 20);
    assert_fsck_clean(&image);
    let header = dumpe2fs_header(&image);
    assert_eq!(
        header["Filesystem features"],
        "has_journal ext_attr resize_inode dir_index filetype extent 64bit flex_bg \
         sparse_super large_file huge_file dir_nlink extra_isize metadata_csum"
    );
    assert_eq!(header["Block size"], "4096");
    assert_eq!(header["Reserved block count"], "819");
}

#[test]
fn mkfs_passes_every_option_to_the_file_system() {
    let test = "mkfs_passes_every_option_to_the_file_system";
    if !have("e2fsck", test) || !have("dumpe2fs", test) {
        return;
    }
    let scratch = Scratch::new("mkfs-options");
    let image = scratch.path("opts.img");
    let uuid = "0f6ab5c4-5d9e-4c63-9a5e-1b2c3d4e5f60";
    let o = run(quill()
        .args(["mkfs", "-q", "-b", "1024", "-i", "8192", "-I", "512"])
        .args(["-J", "size=8,fast_commit_size=100"])
        .args(["-O", "^metadata_csum", "-O", "orphan_file,fast_commit", "-L", "quill-test"])
        .args(["-U", uuid])
        .args(["-m", "1"])
        .arg(&image)
        .arg("100M"));
    assert!(o.status.success(), "{}", text(&o));
    assert!(o.stdout.is_empty(), "-q printed: {}", text(&o));
    assert_fsck_clean(&image);
    let h = dumpe2fs_header(&image);
    assert_eq!(h["Block size"], "1024");
    assert_eq!(h["Block count"], "102400");
    // 12800 asked for, rounded per group as mkfs.ext4 does (it reports the same).
    assert_eq!(h["Inode count"], "12792");
    assert_eq!(h["Inode size"], "512");
    // 8 MiB of log and 100 KiB of fast-commit area.
    assert_eq!(h["Total journal blocks"], "8292");
    assert_eq!(h["Fast commit length"], "100");
    assert_eq!(h["Filesystem volume name"], "quill-test");
    assert_eq!(h["Filesystem UUID"], uuid);
    assert_eq!(h["Reserved block count"], "1024");
    let features = &h["Filesystem features"];
    assert!(features.contains("orphan_file") && !features.contains("metadata_csum"), "{features}");
    assert!(features.contains("fast_commit"), "{features}");
}

/// `-t ext2` and `-t ext3`: mke2fs.conf's feature sets (no extents; a journal for ext3, mapped
/// by indirect blocks like the root and lost+found), e2fsck-clean, and quill opens both
/// read-write and writes a file the way the type wants it (indirect-mapped).
#[test]
fn mkfs_makes_ext2_and_ext3_images() {
    let test = "mkfs_makes_ext2_and_ext3_images";
    if !have("e2fsck", test) || !have("dumpe2fs", test) {
        return;
    }
    let scratch = Scratch::new("mkfs-types");
    for (fs_type, journal) in [("ext2", false), ("ext3", true)] {
        let image = scratch.path(&format!("{fs_type}.img"));
        let o = run(quill().args(["mkfs", "-q", "-t", fs_type]).arg(&image).arg("64M"));
        assert!(o.status.success(), "{fs_type}: {}", text(&o));
        assert_fsck_clean(&image);
        let h = dumpe2fs_header(&image);
        let features: Vec<&str> = h["Filesystem features"].split_whitespace().collect();
        let mut want = vec!["ext_attr", "resize_inode", "dir_index", "filetype", "sparse_super"];
        want.push("large_file");
        if journal {
            want.insert(0, "has_journal");
        }
        assert_eq!(features, want, "{fs_type}");
        let open = || -> std::sync::Arc<dyn blockdev::BlockDevice> {
            let options = blockdev::file::FileOptions::default();
            std::sync::Arc::new(blockdev::file::FileDevice::open(&image, options).unwrap())
        };
        let fs = fs::Filesystem::open(open(), fs::MountOptions::default()).unwrap();
        let ino = fs.create(fs::ROOT_INO, b"file", 0o644, 0, 0).unwrap().ino;
        fs.write(ino, 0, &vec![7u8; 100_000]).unwrap();
        fs.unmount().unwrap();
        let inode = fs::Ext4Image::open(open()).unwrap().read_inode(ino).unwrap();
        assert!(!inode.uses_extents(), "{fs_type}: a new file is indirect-mapped");
        assert_eq!(inode.size, 100_000, "{fs_type}");
        assert_fsck_clean(&image);
    }
}

#[test]
fn mkfs_help_describes_every_option() {
    let o = run(quill().args(["mkfs", "--help"]));
    assert!(o.status.success(), "{}", text(&o));
    let help = String::from_utf8_lossy(&o.stdout);
    for option in
        ["-t", "-b", "-i", "-I", "-J", "-O", "-L", "-U", "-m", "-F", "-q", "IMAGE", "SIZE"]
    {
        assert!(help.contains(option), "--help does not mention {option}:\n{help}");
    }
    for words in [
        "File-system type",
        "Block size",
        "Bytes per inode",
        "Inode size",
        "size=MIB",
        "Features",
        "label",
        "UUID",
        "reserved for root",
        "Overwrite",
    ] {
        assert!(help.contains(words), "--help does not describe '{words}':\n{help}");
    }
}

#[test]
fn mkfs_rejects_bad_option_values_with_one_line_and_status_2() {
    let scratch = Scratch::new("mkfs-usage");
    let image = scratch.path("never.img");
    let img = image.to_str().unwrap();
    let cases: [(&[&str], &str, &str); 13] = [
        (&["-t", "ext5", img, "64M"], "unknown type", "ext5"),
        (&["-b", "3000", img, "64M"], "block size 3000", "3000"),
        (&["-i", "10", img, "64M"], "bytes per inode 10", "10"),
        (&["-I", "100", img, "64M"], "inode size 100", "100"),
        (&["-m", "60", img, "64M"], "reserved 60%", "60"),
        (&["-J", "size=x", img, "64M"], "journal size x", "x"),
        (&["-J", "fast_commit_size=-1", img, "64M"], "fast-commit area -1", "-1"),
        (&["-J", "device=/dev/sdz", img, "64M"], "external journal", "device"),
        (&["-U", "not-a-uuid", img, "64M"], "bad UUID", "not-a-uuid"),
        (&["-L", "a-label-longer-than-16", img, "64M"], "long label", "a-label-longer-than-16"),
        (&[img, "12Q"], "bad size suffix", "12Q"),
        (&["-O", "casefold", img, "64M"], "unsupported feature", "casefold"),
        (&[img], "missing image without a size", "SIZE"),
    ];
    for (args, what, must_name) in cases {
        assert_usage_error(args, what, must_name);
    }
    assert!(!image.exists(), "a rejected mkfs created the image");
}

#[test]
fn mkfs_refuses_to_overwrite_an_ext4_image_without_force() {
    let test = "mkfs_refuses_to_overwrite_an_ext4_image_without_force";
    if !have("e2fsck", test) {
        return;
    }
    let scratch = Scratch::new("mkfs-force");
    let image = scratch.path("existing.img");
    let first = run(quill().args(["mkfs", "-q", "-U", "random"]).arg(&image).arg("32M"));
    assert!(first.status.success(), "{}", text(&first));
    let before = std::fs::read(&image).unwrap();
    let o = run(quill().args(["mkfs", "-q"]).arg(&image));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("-F"), "{stderr}");
    assert_eq!(std::fs::read(&image).unwrap(), before, "the image was modified");
    let forced = run(quill().args(["mkfs", "-q", "-F", "-b", "1024"]).arg(&image));
    assert!(forced.status.success(), "{}", text(&forced));
    assert_ne!(std::fs::read(&image).unwrap(), before);
    assert_fsck_clean(&image);
}

#[test]
fn mkfs_formats_an_existing_file_that_is_not_an_ext4_image_in_place() {
    let test = "mkfs_formats_an_existing_file_that_is_not_an_ext4_image_in_place";
    if !have("e2fsck", test) {
        return;
    }
    let scratch = Scratch::new("mkfs-existing");
    let image = scratch.path("junk.img");
    let junk: Vec<u8> = (0..16u32 << 20).map(|i| (i.wrapping_mul(7919) >> 5) as u8).collect();
    std::fs::write(&image, junk).unwrap();
    let o = run(quill().args(["mkfs", "-q"]).arg(&image));
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(std::fs::metadata(&image).unwrap().len(), 16 << 20);
    assert_fsck_clean(&image);
}
