//! Quota images (the quota feature): quill charges every change of blocks, inodes, owners
//! and projects in the user, group and project quota files, in the transaction that makes
//! it, so `e2fsck -fn` (which recomputes every id's usage and compares) finds them right after
//! a clean unmount and after a crash and quill's recovery, open-but-unlinked files included.
//! mke2fs's `-d` tree (with its quota files) is written on; the kernel reads quill's tree
//! (read-only: a kernel without CONFIG_QUOTA mounts quota images no other way); a damaged
//! quota file refuses read-write, naming it. Needs e2fsprogs (and root with loop devices for
//! the kernel's reading); skips with a printed reason otherwise.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::{
    assert_fsck_clean, can_loop_mount, compare, have, kernel_tree, open_device, quill_tree, Mount,
    Scratch,
};
use fs::{Filesystem, FsError, MountOptions, SetAttr, SetMode, ROOT_INO};
use ondisk::ext4::quota::QuotaType;

/// A fresh image of `size` made by mkfs.ext4 with `args`, in a scratch directory named for
/// `test` (kept while the first is); `None`, after a SKIP line, without mkfs.ext4 and e2fsck.
fn formatted(test: &str, size: &str, args: &[&str]) -> Option<(Scratch, PathBuf)> {
    if !have("mkfs.ext4", test) || !have("e2fsck", test) {
        return None;
    }
    let scratch = Scratch::new(test);
    let image = scratch.path("fs.img");
    common::mkfs(&image, size, args);
    Some((scratch, image))
}

fn open(image: &Path) -> Filesystem {
    Filesystem::open(open_device(image), MountOptions::default()).unwrap()
}

/// Usage by (type, id) from the tree: each file's i_blocks in bytes and one inode, to its
/// user, group and project (no value inodes here).
fn usage_of_tree(fs: &Filesystem) -> BTreeMap<(QuotaType, u32), (u64, u64)> {
    let mut usage = BTreeMap::new();
    let mut stack = vec![ROOT_INO];
    let mut seen = std::collections::HashSet::new();
    while let Some(dir) = stack.pop() {
        for e in common::list_dir(fs, dir, 64) {
            if e.name == b"." || e.name == b".." || !seen.insert(e.ino) {
                continue;
            }
            let attr = fs.getattr(e.ino).unwrap();
            let project = fs.fsxattr(e.ino).unwrap().projid;
            for key in [
                (QuotaType::User, attr.uid),
                (QuotaType::Group, attr.gid),
                (QuotaType::Project, project),
            ] {
                let entry: &mut (u64, u64) = usage.entry(key).or_default();
                entry.0 += attr.blocks * 512;
                entry.1 += 1;
            }
            if attr.mode & 0o170000 == 0o040000 {
                stack.push(e.ino);
            }
        }
    }
    // The root itself.
    let attr = fs.getattr(ROOT_INO).unwrap();
    for kind in QuotaType::ALL {
        let entry = usage.entry((kind, 0)).or_default();
        entry.0 += attr.blocks * 512;
        entry.1 += 1;
    }
    usage
}

/// What the quota files say, ids with nothing charged left out.
fn usage_recorded(fs: &Filesystem) -> BTreeMap<(QuotaType, u32), (u64, u64)> {
    fs.quota_usage()
        .unwrap()
        .into_iter()
        .filter(|&(_, _, space, inodes)| space != 0 || inodes != 0)
        .map(|(kind, id, space, inodes)| ((kind, id), (space, inodes)))
        .collect()
}

/// Files of 40 users, 20 groups and 5 projects (more ids than one quota data block holds, so
/// the quota trees grow), with writes, truncates, hard links, renames over files, owners and
/// projects changed, and files removed.
fn varied_changes(fs: &Filesystem, block_size: u64) {
    let dir = fs.mkdir(ROOT_INO, b"d", 0o755, 7, 7).unwrap().ino;
    let mut files = Vec::new();
    for i in 0..60u32 {
        let parent = if i % 2 == 0 { ROOT_INO } else { dir };
        let ino =
            fs.create(parent, format!("f{i}").as_bytes(), 0o644, i % 40, 100 + i % 20).unwrap().ino;
        let len = (i as usize * 1237) % (6 * block_size as usize);
        fs.write(ino, 0, &vec![i as u8; len]).unwrap();
        fs.set_project(ino, i % 5, 0).unwrap();
        files.push((parent, i, ino));
    }
    fs.sync().unwrap();
    for &(parent, i, ino) in &files {
        match i % 6 {
            0 => {
                fs.setattr(ino, &SetAttr { size: Some(u64::from(i) * 100), ..Default::default() })
                    .unwrap();
            }
            1 => {
                let set = SetAttr { uid: Some(1000 + i), gid: Some(2000), ..Default::default() };
                fs.setattr(ino, &set).unwrap();
            }
            2 => fs.unlink(parent, format!("f{i}").as_bytes()).unwrap(),
            3 => {
                fs.link(ino, dir, format!("link{i}").as_bytes()).unwrap();
            }
            4 => fs.set_project(ino, 9, 0).unwrap(),
            _ => {
                fs.write(ino, 20 * block_size, b"far").unwrap();
            }
        }
    }
    fs.rename(ROOT_INO, b"f0", dir, b"f1", fs::RenameFlags::default()).unwrap();
    fs.symlink(dir, b"long-link", &[b'x'; 300], 33, 33).unwrap();
    fs.setxattr(dir, b"user.note", &[5u8; 900], SetMode::Any).unwrap();
    fs.sync().unwrap();
}

#[test]
fn quill_charges_what_e2fsck_counts_after_unmount_and_after_a_crash() {
    let test = "quota_usage";
    if !have("mkfs.ext4", test) || !have("e2fsck", test) {
        return;
    }
    let configs: [(&str, &[&str], u64); 3] = [
        ("4k-usr-grp-prj", &["-O", "quota,project", "-b", "4096"], 4096),
        ("1k-nocsum", &["-O", "quota,project,^metadata_csum", "-b", "1024"], 1024),
        ("ext4-no-journal", &["-O", "quota,project,^has_journal", "-b", "4096"], 4096),
    ];
    for (label, mkfs, block_size) in configs {
        let scratch = Scratch::new(&format!("quota-{label}"));
        let image = scratch.path("fs.img");
        common::mkfs(&image, "64M", mkfs);
        let fs = open(&image);
        varied_changes(&fs, block_size);
        assert_eq!(usage_recorded(&fs), usage_of_tree(&fs), "{label}: quota files vs the tree");
        fs.unmount().unwrap();
        assert_fsck_clean(&image);
        if label == "ext4-no-journal" {
            // Without a journal a crash is e2fsck's to repair (crash_no_journal.rs).
            continue;
        }
        // A crash with an open unlinked file and changes in the running transaction: the
        // recovery frees the orphan and takes its charge back.
        let fs = open(&image);
        let open_file = fs.resolve("/f4").unwrap();
        let _slot = fs.open_inode(open_file).unwrap();
        fs.write(open_file, 0, &vec![1u8; 3 * block_size as usize]).unwrap();
        fs.unlink(ROOT_INO, b"f4").unwrap();
        fs.sync().unwrap();
        fs.create(ROOT_INO, b"after-sync", 0o644, 77, 77).unwrap();
        fs.crash();
        let fs = open(&image);
        assert_eq!(usage_recorded(&fs), usage_of_tree(&fs), "{label}: after the crash");
        fs.unmount().unwrap();
        assert_fsck_clean(&image);
        println!("{label}: usage as e2fsck counts it, after unmount and after a crash");
    }
}

#[test]
fn values_in_inodes_of_their_own_and_inline_files_are_charged_as_e2fsck_counts() {
    let Some((_scratch, image)) =
        formatted("quota_ea_inode", "64M", &["-O", "quota,ea_inode,inline_data", "-b", "1024"])
    else {
        return;
    };
    let fs = open(&image);
    for i in 0..12u32 {
        let ino = fs.create(ROOT_INO, format!("v{i}").as_bytes(), 0o644, i, i).unwrap().ino;
        fs.write(ino, 0, &vec![3u8; 40 * i as usize]).unwrap();
        // Values past a block live in inodes of their own: one more inode charged each.
        fs.setxattr(ino, b"user.big", &vec![i as u8; 3000 + 100 * i as usize], SetMode::Any)
            .unwrap();
        if i % 3 == 0 {
            fs.setxattr(ino, b"user.big", b"small now", SetMode::Any).unwrap();
        }
        if i % 4 == 1 {
            fs.unlink(ROOT_INO, format!("v{i}").as_bytes()).unwrap();
        }
    }
    fs.unmount().unwrap();
    assert_fsck_clean(&image);
}

/// A tree mke2fs copied (`-d`), with its owners: mke2fs 1.47.0 writes its quota files before
/// it copies the tree (they charge root and lost+found only), so `e2fsck -fy` charges the
/// tree first; quill changes it from there.
#[test]
fn a_tree_mke2fs_copied_with_its_owners_is_changed_and_stays_clean() {
    let test = "quota_mke2fs_d";
    if !have("mkfs.ext4", test) || !have("e2fsck", test) {
        return;
    }
    let scratch = Scratch::new("quota-mke2fs-d");
    let source = scratch.path("source");
    std::fs::create_dir_all(source.join("sub")).unwrap();
    for i in 0..20u32 {
        let path = source.join(if i % 2 == 0 { format!("a{i}") } else { format!("sub/b{i}") });
        std::fs::write(&path, vec![b'q'; 700 * i as usize]).unwrap();
        std::os::unix::fs::chown(&path, Some(500 + i), Some(600 + i % 3)).unwrap();
    }
    let image = scratch.path("fs.img");
    let source_arg = source.to_str().unwrap().to_string();
    common::mkfs(&image, "64M", &["-O", "quota", "-d", &source_arg]);
    let (code, text) = common::e2fsck_fix(&image);
    assert!(code <= 1, "e2fsck -fy after mke2fs -d: {text}");
    assert_fsck_clean(&image);
    let read_only = MountOptions { read_only: true, ..MountOptions::default() };
    let fs = Filesystem::open(open_device(&image), read_only).unwrap();
    assert_eq!(fs.getattr(fs.resolve("/a4").unwrap()).unwrap().uid, 504);
    assert!(fs.quota_usage().unwrap().is_empty(), "a read-only open charges nothing");
    fs.unmount().unwrap();
    let fs = open(&image);
    for i in (0..20u32).step_by(3) {
        let name = if i % 2 == 0 { format!("/a{i}") } else { format!("/sub/b{i}") };
        let ino = fs.resolve(&name).unwrap();
        let set = SetAttr { uid: Some(9), ..Default::default() };
        fs.setattr(ino, &set).unwrap();
        fs.write(ino, 0, &[1u8; 5000]).unwrap();
    }
    fs.unlink(ROOT_INO, b"a2").unwrap();
    let recorded = usage_recorded(&fs);
    assert_eq!(recorded.get(&(QuotaType::User, 9)).map(|u| u.1), Some(7));
    fs.unmount().unwrap();
    assert_fsck_clean(&image);
}

#[test]
fn the_kernel_reads_a_quota_image_quill_wrote() {
    let test = "quota_kernel_reads";
    if !can_loop_mount(test) {
        return;
    }
    let scratch = Scratch::new("quota-kernel");
    let image = scratch.path("fs.img");
    common::mkfs(&image, "64M", &["-O", "quota,project", "-b", "4096"]);
    let fs = open(&image);
    varied_changes(&fs, 4096);
    let tree = quill_tree(&fs);
    fs.unmount().unwrap();
    assert_fsck_clean(&image);
    // Read-only: the kernel mounts quota images read-write only with CONFIG_QUOTA.
    let Some(mount) = Mount::with_options(&image, scratch.path("mnt"), "loop,ro") else { return };
    compare(&tree, &kernel_tree(&mount.dir));
    drop(mount);
    assert_fsck_clean(&image);
}

#[test]
fn a_damaged_quota_file_refuses_read_write_naming_it_and_reads_read_only() {
    let Some((_scratch, image)) =
        formatted("quota_damaged", "64M", &["-O", "quota,^metadata_csum", "-b", "1024"])
    else {
        return;
    };
    let fs = open(&image);
    fs.create(ROOT_INO, b"kept", 0o644, 3, 3).unwrap();
    fs.unmount().unwrap();
    // The group quota file's first block (its header and info): the first extent of inode 4.
    let at = common::inode_offset(&image, 4) as usize;
    let mut bytes = std::fs::read(&image).unwrap();
    let first_block =
        u32::from_le_bytes(bytes[at + 0x28 + 20..at + 0x28 + 24].try_into().unwrap()) as usize;
    let clean = bytes.clone();
    for (case, offset, value) in
        [("wrong magic", 0usize, 0xD9C0_1F11u32), ("free-entry list past the file", 28, 100)]
    {
        bytes.clone_from(&clean);
        let at = first_block * 1024 + offset;
        bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
        std::fs::write(&image, &bytes).unwrap();
        let err = Filesystem::open(open_device(&image), MountOptions::default()).unwrap_err();
        assert!(matches!(err, FsError::Unsupported(_)), "{case}: {err}");
        assert!(err.to_string().contains("group quota file (inode 4)"), "{case}: {err}");
        let fs = Filesystem::open(
            open_device(&image),
            MountOptions { read_only: true, ..MountOptions::default() },
        )
        .unwrap();
        assert!(fs.resolve("/kept").is_ok(), "{case}");
        fs.unmount().unwrap();
        assert!(std::fs::read(&image).unwrap() == bytes, "{case}: the refusal wrote");
        println!("{case}: {err}");
    }
}

/// A new id on a full file system: its quota entries need blocks, taken before the change
/// starts (as the kernel's dquot_initialize), so the change fails with ENOSPC and nothing
/// changed, and the file system stays writable.
#[test]
fn a_new_id_on_a_full_file_system_is_enospc_before_anything_changes() {
    let Some((_scratch, image)) =
        formatted("quota_full", "16M", &["-O", "quota,project", "-b", "1024", "-m", "0"])
    else {
        return;
    };
    let fs = open(&image);
    let small = fs.create(ROOT_INO, b"small", 0o644, 0, 0).unwrap().ino;
    let big = fs.create(ROOT_INO, b"big", 0o644, 0, 0).unwrap().ino;
    let chunk = vec![7u8; 256 * 1024];
    let mut at = 0u64;
    loop {
        match fs.write(big, at, &chunk) {
            Ok(n) if n == chunk.len() => at += n as u64,
            Ok(_) | Err(FsError::NoSpace) => break,
            Err(err) => panic!("filling: {err}"),
        }
    }
    // Whatever the cache still holds goes to disk; the last blocks, one at a time.
    let _ = fs.sync();
    while fs.write(big, at, &[1u8; 1024]).is_ok() && fs.sync().is_ok() {
        at += 1024;
    }
    let chown = SetAttr { uid: Some(4242), gid: Some(4242), ..Default::default() };
    let r = fs.setattr(small, &chown);
    assert!(matches!(r, Err(FsError::NoSpace)), "chown to a new id on a full fs: {r:?}");
    let r = fs.set_project(small, 77, 0);
    assert!(matches!(r, Err(FsError::NoSpace)), "a new project on a full fs: {r:?}");
    assert!(!fs.is_read_only(), "ENOSPC must not turn the file system read-only");
    assert_eq!(fs.getattr(small).unwrap().uid, 0, "nothing changed");
    fs.unlink(ROOT_INO, b"big").unwrap();
    fs.setattr(small, &chown).unwrap();
    fs.set_project(small, 77, 0).unwrap();
    assert!(usage_recorded(&fs).contains_key(&(QuotaType::User, 4242)));
    fs.unmount().unwrap();
    assert_fsck_clean(&image);
}
