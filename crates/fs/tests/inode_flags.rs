//! chattr's flags through the library (`Filesystem::set_inode_flags`, `fs::inode_flags`):
//! who may set them, what immutable, append-only, noatime, sync and dirsync inodes refuse or
//! do, what new inodes inherit, and that the image keeps them as ext4 does (`e2fsck -fn`
//! clean, debugfs reads the same `i_flags`). The mount tests compare the same through FUSE
//! with the kernel's ext4 (crates/cli/tests/mount_posix.rs).

mod common;

use common::{assert_fsck_clean, mkfs, open_device, read_all, Scratch};
use fs::error::errno::{EOPNOTSUPP, EPERM};
use fs::{FallocateMode, Filesystem, MountOptions, OpenIntent, SetAttr, SetMode, ROOT_INO};
use ondisk::ext4::iflags::{
    APPEND_FL, DIRSYNC_FL, IMMUTABLE_FL, JOURNAL_DATA_FL, NOATIME_FL, NODUMP_FL, SYNC_FL,
};
use ondisk::ext4::EXTENTS_FL;

fn errno(result: Result<impl std::fmt::Debug, fs::FsError>) -> i32 {
    result.expect_err("refused").errno()
}

fn image(scratch: &Scratch) -> Option<std::path::PathBuf> {
    if !common::have("mkfs.ext4", "inode_flags") || !common::have("e2fsck", "inode_flags") {
        return None;
    }
    let path = scratch.path("flags.img");
    mkfs(&path, "16M", &[]);
    Some(path)
}

#[test]
fn immutable_and_append_only_inodes_refuse_what_ext4_refuses() {
    let scratch = Scratch::new("inode-flags-refusals");
    let Some(path) = image(&scratch) else { return };
    let fs = Filesystem::open(open_device(&path), MountOptions::default()).unwrap();
    let f = fs.create(ROOT_INO, b"f", 0o644, 1000, 1000).unwrap().ino;
    fs.write(f, 0, b"first").unwrap();
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, 0, 0).unwrap().ino;
    fs.create(d, b"inside", 0o644, 0, 0).unwrap();

    // Only root changes i and a; the owner may change the others, nobody else any.
    assert_eq!(errno(fs.set_inode_flags(f, EXTENTS_FL | IMMUTABLE_FL, 1000)), EPERM);
    assert_eq!(errno(fs.set_inode_flags(f, EXTENTS_FL | NODUMP_FL, 1001)), EPERM);
    fs.set_inode_flags(f, EXTENTS_FL | NODUMP_FL, 1000).unwrap();
    // What quill does not do.
    assert_eq!(errno(fs.set_inode_flags(f, EXTENTS_FL | JOURNAL_DATA_FL, 0)), EOPNOTSUPP);
    assert_eq!(errno(fs.set_inode_flags(f, 0, 0)), EOPNOTSUPP, "clearing e");
    assert_eq!(errno(fs.set_inode_flags(f, EXTENTS_FL | DIRSYNC_FL, 0)), EOPNOTSUPP, "D on a file");

    fs.set_inode_flags(f, EXTENTS_FL | IMMUTABLE_FL, 0).unwrap();
    fs.set_inode_flags(d, EXTENTS_FL | IMMUTABLE_FL, 0).unwrap();
    assert_eq!(fs.inode_flags(f).unwrap(), EXTENTS_FL | IMMUTABLE_FL);
    assert_eq!(errno(fs.write(f, 5, b"more")), EPERM);
    assert_eq!(errno(fs.truncate(f, 0)), EPERM);
    assert_eq!(errno(fs.fallocate(f, FallocateMode::Allocate, 0, 8192)), EPERM);
    assert_eq!(errno(fs.setattr(f, &SetAttr { mode: Some(0o600), ..SetAttr::default() })), EPERM);
    let now = SetAttr {
        mtime: Some(ondisk::ext4::Timestamp { sec: 1_700_000_000, nsec: 0 }),
        times_to_now: true,
        ..SetAttr::default()
    };
    assert_eq!(errno(fs.setattr(f, &now)), EPERM);
    assert_eq!(errno(fs.setxattr(f, b"user.x", b"1", SetMode::Any)), EPERM);
    assert_eq!(errno(fs.link(f, ROOT_INO, b"g")), EPERM);
    assert_eq!(errno(fs.unlink(ROOT_INO, b"f")), EPERM);
    assert_eq!(errno(fs.rename(ROOT_INO, b"f", ROOT_INO, b"h", Default::default())), EPERM);
    assert_eq!(errno(fs.create(d, b"new", 0o644, 0, 0)), EPERM);
    assert_eq!(errno(fs.unlink(d, b"inside")), EPERM);
    assert_eq!(errno(fs.check_open(f, OpenIntent { write: true, ..Default::default() })), EPERM);
    fs.check_open(f, OpenIntent::default()).unwrap();
    // Nothing else changes while i stays; clearing it is allowed.
    assert_eq!(errno(fs.set_inode_flags(f, EXTENTS_FL | IMMUTABLE_FL | NODUMP_FL, 0)), EPERM);
    fs.set_inode_flags(f, EXTENTS_FL, 0).unwrap();
    fs.set_inode_flags(d, EXTENTS_FL, 0).unwrap();

    // Append only: writes at the end, times to now, new names in the directory.
    fs.set_inode_flags(f, EXTENTS_FL | APPEND_FL, 0).unwrap();
    fs.set_inode_flags(d, EXTENTS_FL | APPEND_FL, 0).unwrap();
    fs.write(f, 5, b" second").unwrap();
    assert_eq!(errno(fs.write(f, 0, b"X")), EPERM);
    assert_eq!(errno(fs.truncate(f, 3)), EPERM);
    assert_eq!(errno(fs.fallocate(f, FallocateMode::PunchHole, 0, 4096)), EPERM);
    fs.fallocate(f, FallocateMode::KeepSize, 0, 8192).unwrap();
    fs.setattr(f, &now).unwrap();
    let explicit = SetAttr {
        mtime: Some(ondisk::ext4::Timestamp { sec: 1_700_000_000, nsec: 0 }),
        ..SetAttr::default()
    };
    assert_eq!(errno(fs.setattr(f, &explicit)), EPERM);
    let open = |append, truncate| OpenIntent { write: true, append, truncate };
    assert_eq!(errno(fs.check_open(f, open(false, false))), EPERM);
    assert_eq!(errno(fs.check_open(f, open(true, true))), EPERM);
    fs.check_open(f, open(true, false)).unwrap();
    fs.create(d, b"new", 0o644, 0, 0).unwrap();
    assert_eq!(errno(fs.unlink(d, b"new")), EPERM);
    assert_eq!(read_all(&fs, f).unwrap(), b"first second");
    fs.unmount().unwrap();
    assert_fsck_clean(&path);

    // The flags are on disk as ext4 keeps them.
    let out = std::process::Command::new("debugfs").args(["-R", "stat /f"]).arg(&path).output();
    if let Ok(out) = out {
        let stat = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(stat.contains("Flags: 0x80020"), "{stat}");
    }
}

#[test]
fn new_inodes_inherit_and_noatime_sync_dirsync_act() {
    let scratch = Scratch::new("inode-flags-inherit");
    let Some(path) = image(&scratch) else { return };
    let options = MountOptions { atime: fs::AtimeMode::Strict, ..MountOptions::default() };
    let fs = Filesystem::open(open_device(&path), options).unwrap();
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, 0, 0).unwrap().ino;
    fs.set_inode_flags(d, EXTENTS_FL | SYNC_FL | NOATIME_FL | NODUMP_FL | DIRSYNC_FL, 0).unwrap();
    let file = fs.create(d, b"file", 0o644, 0, 0).unwrap().ino;
    let sub = fs.mkdir(d, b"sub", 0o755, 0, 0).unwrap().ino;
    let link = fs.symlink(d, b"link", b"file", 0, 0).unwrap().ino;
    assert_eq!(fs.inode_flags(file).unwrap(), EXTENTS_FL | SYNC_FL | NOATIME_FL | NODUMP_FL);
    let dir_flags = EXTENTS_FL | SYNC_FL | NOATIME_FL | NODUMP_FL | DIRSYNC_FL;
    assert_eq!(fs.inode_flags(sub).unwrap(), dir_flags);
    assert_eq!(fs.inode_flags(link).unwrap() & !EXTENTS_FL, NOATIME_FL | NODUMP_FL);

    // D: the creation was committed before create returned; S: the write is durable too.
    let committed = fs.journal().stats().transactions;
    fs.create(d, b"second", 0o644, 0, 0).unwrap();
    assert!(fs.journal().stats().transactions > committed, "dirsync commits");
    let before = fs.journal().stats().transactions;
    fs.write(file, 0, b"synchronous").unwrap();
    assert!(fs.journal().stats().transactions > before, "S makes the write durable");

    // A: reading leaves the access time alone (strictatime would update it).
    let atime = fs.getattr(file).unwrap().atime;
    std::thread::sleep(std::time::Duration::from_millis(20));
    let mut buf = [0u8; 4];
    fs.read(file, 0, &mut buf).unwrap();
    assert_eq!(fs.getattr(file).unwrap().atime, atime);
    fs.crash();
    // The crash right after: the dirsync creation and the sync write are there.
    let fs = Filesystem::open(open_device(&path), MountOptions::default()).unwrap();
    assert!(fs.lookup(d, b"second").is_ok());
    assert_eq!(read_all(&fs, file).unwrap(), b"synchronous");
    fs.unmount().unwrap();
    assert_fsck_clean(&path);
}
