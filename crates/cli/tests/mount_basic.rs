//! `quill mount` end to end: every FUSE operation through a real mount, the daemon and its
//! signals, mount options, bad input that must leave the image untouched, and the mount(8)
//! helper. Each test needs root, /dev/fuse and fusermount3, and prints SKIP otherwise.

mod mount_support;

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, FileExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use mount_support::*;

fn cstr(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).unwrap()
}

fn errno_of<T>(result: std::io::Result<T>) -> i32 {
    result.err().and_then(|e| e.raw_os_error()).unwrap_or(0)
}

/// One call of every kind the adapter maps, checked through the mount, then the same tree
/// through a kernel loop mount after a clean unmount.
#[test]
fn every_operation_through_fuse_then_the_kernel_agrees() {
    if !ready("every_operation_through_fuse_then_the_kernel_agrees", &["dumpe2fs"]) {
        return;
    }
    let s = Scratch::new("ops");
    let image = s.path("img");
    quill_mkfs(&image, "64M");
    let mnt = s.dir("mnt");
    let m = QuillMount::foreground(&image, &mnt, "");
    let (source, fstype) = mount_entry(&mnt).unwrap();
    assert_eq!(fstype, "fuse", "no subtype: df -T must say fuse");
    assert_eq!(source, image.display().to_string(), "fsname is the image path");
    assert_eq!(fs::metadata(&mnt).unwrap().ino(), 1, "FUSE root is inode 1");

    // Files: create, write, read, overwrite in the middle, append, truncate.
    let a = mnt.join("a.txt");
    fs::write(&a, b"hello, fuse").unwrap();
    assert_eq!(fs::read(&a).unwrap(), b"hello, fuse");
    let mut f = OpenOptions::new().read(true).write(true).open(&a).unwrap();
    f.seek(SeekFrom::Start(7)).unwrap();
    f.write_all(b"FUSE").unwrap();
    f.sync_all().unwrap();
    f.sync_data().unwrap();
    drop(f);
    assert_eq!(fs::read(&a).unwrap(), b"hello, FUSE");
    let mut f = OpenOptions::new().append(true).open(&a).unwrap();
    f.write_all(b"!!").unwrap();
    drop(f);
    assert_eq!(fs::read(&a).unwrap(), b"hello, FUSE!!");
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 + i / 4096) as u8).collect();
    fs::write(mnt.join("big"), &big).unwrap();
    assert_eq!(fs::read(mnt.join("big")).unwrap(), big);
    let f = OpenOptions::new().write(true).open(mnt.join("big")).unwrap();
    f.set_len(1_000_001).unwrap();
    drop(f);
    assert_eq!(fs::read(mnt.join("big")).unwrap(), &big[..1_000_001]);

    // Directories, rename (plain, NOREPLACE, EXCHANGE, across directories), links.
    fs::create_dir(mnt.join("d1")).unwrap();
    fs::create_dir_all(mnt.join("d2/sub")).unwrap();
    fs::rename(&a, mnt.join("d1/a.txt")).unwrap();
    fs::write(mnt.join("d2/b.txt"), b"bee").unwrap();
    let rename2 = |from: &str, to: &str, flags: u32| -> i32 {
        let (f, t) = (cstr(&mnt.join(from)), cstr(&mnt.join(to)));
        // SAFETY: valid NUL-terminated paths.
        let r = unsafe {
            libc::renameat2(libc::AT_FDCWD, f.as_ptr(), libc::AT_FDCWD, t.as_ptr(), flags)
        };
        if r == 0 {
            0
        } else {
            std::io::Error::last_os_error().raw_os_error().unwrap()
        }
    };
    assert_eq!(rename2("d1/a.txt", "d2/b.txt", libc::RENAME_NOREPLACE), libc::EEXIST);
    assert_eq!(rename2("d1/a.txt", "d2/b.txt", libc::RENAME_EXCHANGE), 0);
    assert_eq!(fs::read(mnt.join("d1/a.txt")).unwrap(), b"bee");
    assert_eq!(fs::read(mnt.join("d2/b.txt")).unwrap(), b"hello, FUSE!!");
    // RENAME_WHITEOUT with RENAME_EXCHANGE is EINVAL (whiteouts alone: mount_posix.rs).
    let whiteout_exchange = libc::RENAME_WHITEOUT | libc::RENAME_EXCHANGE;
    assert_eq!(rename2("d1/a.txt", "d2/b.txt", whiteout_exchange), libc::EINVAL);
    fs::hard_link(mnt.join("d2/b.txt"), mnt.join("d1/hard")).unwrap();
    assert_eq!(fs::metadata(mnt.join("d1/hard")).unwrap().nlink(), 2);
    symlink("d2/b.txt", mnt.join("short-link")).unwrap();
    let long_target = "t/".repeat(100) + "end";
    symlink(&long_target, mnt.join("long-link")).unwrap();
    assert_eq!(fs::read_link(mnt.join("long-link")).unwrap().to_str().unwrap(), long_target);
    assert_eq!(fs::read(mnt.join("short-link")).unwrap(), b"hello, FUSE!!");
    assert_eq!(errno_of(fs::remove_dir(mnt.join("d2"))), libc::ENOTEMPTY);
    assert_eq!(errno_of(fs::create_dir(mnt.join("d1"))), libc::EEXIST);
    assert_eq!(errno_of(fs::read(mnt.join("nope"))), libc::ENOENT);
    fs::remove_dir(mnt.join("d2/sub")).unwrap();

    // A directory big enough to need several readdir replies (and an htree).
    fs::create_dir(mnt.join("many")).unwrap();
    for i in 0..600 {
        File::create(mnt.join(format!("many/entry-with-a-longish-name-{i:04}"))).unwrap();
    }
    let mut names: Vec<String> = fs::read_dir(mnt.join("many"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names.len(), 600);
    assert_eq!(names[599], "entry-with-a-longish-name-0599");

    // Attributes: chmod, chown, utimens (explicit and UTIME_NOW), set-group-ID inheritance.
    fs::set_permissions(mnt.join("d1/hard"), fs::Permissions::from_mode(0o640)).unwrap();
    std::os::unix::fs::chown(mnt.join("d1/hard"), Some(1234), Some(5678)).unwrap();
    let meta = fs::metadata(mnt.join("d1/hard")).unwrap();
    assert_eq!((meta.mode() & 0o7777, meta.uid(), meta.gid()), (0o640, 1234, 5678));
    let times = [
        libc::timespec { tv_sec: 1_000_000_000, tv_nsec: 123_456_789 },
        libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_NOW },
    ];
    let p = cstr(&mnt.join("d1/a.txt"));
    // SAFETY: valid path and two timespecs.
    assert_eq!(unsafe { libc::utimensat(libc::AT_FDCWD, p.as_ptr(), times.as_ptr(), 0) }, 0);
    let meta = fs::metadata(mnt.join("d1/a.txt")).unwrap();
    assert_eq!((meta.atime(), meta.atime_nsec()), (1_000_000_000, 123_456_789));
    assert!(meta.mtime() > 1_600_000_000, "UTIME_NOW set mtime to now");
    fs::create_dir(mnt.join("sgid")).unwrap();
    std::os::unix::fs::chown(mnt.join("sgid"), None, Some(4321)).unwrap();
    fs::set_permissions(mnt.join("sgid"), fs::Permissions::from_mode(0o2775)).unwrap();
    fs::create_dir(mnt.join("sgid/sub")).unwrap();
    File::create(mnt.join("sgid/file")).unwrap();
    let sub = fs::metadata(mnt.join("sgid/sub")).unwrap();
    assert_eq!(sub.gid(), 4321);
    assert_ne!(sub.mode() & libc::S_ISGID, 0, "subdirectories inherit set-group-ID");
    assert_eq!(fs::metadata(mnt.join("sgid/file")).unwrap().gid(), 4321);

    // Special files; they stay for e2fsck and the kernel comparison after the unmount.
    let fifo = cstr(&mnt.join("fifo"));
    // SAFETY: valid path.
    assert_eq!(unsafe { libc::mknod(fifo.as_ptr(), libc::S_IFIFO | 0o600, 0) }, 0);
    assert!(fs::metadata(mnt.join("fifo")).unwrap().file_type().is_fifo());
    let dev = cstr(&mnt.join("null-dev"));
    // SAFETY: valid path; makedev(1, 3) is /dev/null's number.
    assert_eq!(unsafe { libc::mknod(dev.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) }, 0);
    assert_eq!(fs::metadata(mnt.join("null-dev")).unwrap().rdev(), libc::makedev(1, 3));

    // Extended attributes: set, the size-0 probe, ERANGE, list, XATTR_CREATE, remove.
    let x = cstr(&mnt.join("d1/a.txt"));
    let name = CString::new("user.colour").unwrap();
    // SAFETY (all xattr calls below): valid paths, names and buffers sized as passed.
    unsafe {
        assert_eq!(libc::setxattr(x.as_ptr(), name.as_ptr(), b"blue".as_ptr().cast(), 4, 0), 0);
        assert_eq!(libc::getxattr(x.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0), 4);
        let mut small = [0u8; 2];
        assert_eq!(libc::getxattr(x.as_ptr(), name.as_ptr(), small.as_mut_ptr().cast(), 2), -1);
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::ERANGE));
        let mut value = [0u8; 16];
        assert_eq!(libc::getxattr(x.as_ptr(), name.as_ptr(), value.as_mut_ptr().cast(), 16), 4);
        assert_eq!(&value[..4], b"blue");
        let r = libc::setxattr(
            x.as_ptr(),
            name.as_ptr(),
            b"red".as_ptr().cast(),
            3,
            libc::XATTR_CREATE,
        );
        assert_eq!(r, -1);
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EEXIST));
        let list_len = libc::listxattr(x.as_ptr(), std::ptr::null_mut(), 0);
        assert_eq!(list_len, "user.colour\0".len() as isize);
        let gone = CString::new("user.gone").unwrap();
        assert_eq!(libc::setxattr(x.as_ptr(), gone.as_ptr(), b"1".as_ptr().cast(), 1, 0), 0);
        assert_eq!(libc::removexattr(x.as_ptr(), gone.as_ptr()), 0);
        assert_eq!(libc::getxattr(x.as_ptr(), gone.as_ptr(), std::ptr::null_mut(), 0), -1);
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::ENODATA));
        // POSIX ACLs (the mount behaves as ext4 with acl, its default): an ACL the mode says
        // all of sets the mode and is not stored (mount_posix.rs compares the rest with the
        // kernel).
        let acl = CString::new("system.posix_acl_access").unwrap();
        // A valid minimal ACL (the kernel checks it first): version 2, then user::rw-,
        // group::r--, other::r-- as (tag, perm, id).
        let mut minimal = 2u32.to_le_bytes().to_vec();
        for (tag, perm) in [(0x01u16, 6u16), (0x04, 4), (0x20, 4)] {
            minimal.extend_from_slice(&tag.to_le_bytes());
            minimal.extend_from_slice(&perm.to_le_bytes());
            minimal.extend_from_slice(&u32::MAX.to_le_bytes());
        }
        let r = libc::setxattr(x.as_ptr(), acl.as_ptr(), minimal.as_ptr().cast(), minimal.len(), 0);
        assert_eq!(r, 0);
        assert_eq!(libc::getxattr(x.as_ptr(), acl.as_ptr(), std::ptr::null_mut(), 0), -1);
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::ENODATA));
    }

    // fallocate: allocate, keep size, punch a hole; other modes are EOPNOTSUPP.
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(mnt.join("falloc"))
        .unwrap();
    let fd = f.as_raw_fd();
    // SAFETY (fallocate calls): a valid descriptor.
    unsafe {
        assert_eq!(libc::fallocate(fd, 0, 0, 1 << 20), 0);
        assert_eq!(libc::fallocate(fd, libc::FALLOC_FL_KEEP_SIZE, 1 << 20, 1 << 20), 0);
    }
    assert_eq!(f.metadata().unwrap().len(), 1 << 20);
    assert!(f.metadata().unwrap().blocks() >= 2 * (1 << 20) / 512);
    (&f).write_all(&vec![0xAB; 65536]).unwrap();
    // SAFETY: as above.
    unsafe {
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        assert_eq!(libc::fallocate(fd, mode, 4096, 8192), 0);
        // Not supported yet (ZERO_RANGE is: mount_posix.rs).
        assert_eq!(libc::fallocate(fd, libc::FALLOC_FL_COLLAPSE_RANGE, 0, 4096), -1);
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EOPNOTSUPP));
    }
    let mut head = vec![0u8; 16384];
    f.read_exact_at(&mut head, 0).unwrap();
    assert!(head[..4096].iter().all(|b| *b == 0xAB));
    assert!(head[4096..12288].iter().all(|b| *b == 0), "the punched range reads as zeros");
    assert!(head[12288..].iter().all(|b| *b == 0xAB));
    drop(f);

    // Unlink while open: the data stays readable and writable until the last close.
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(mnt.join("ghost"))
        .unwrap();
    f.write_all(b"still here").unwrap();
    fs::remove_file(mnt.join("ghost")).unwrap();
    assert!(!mnt.join("ghost").exists());
    f.write_all(b", and more").unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut back = String::new();
    f.read_to_string(&mut back).unwrap();
    assert_eq!(back, "still here, and more");
    drop(f);

    // statfs.
    let p = cstr(&mnt);
    // SAFETY: a zeroed statvfs filled by the call.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(p.as_ptr(), &mut st) }, 0);
    assert_eq!(st.f_bsize, 4096);
    assert_eq!(st.f_blocks, 16384);
    assert!(st.f_bfree > 0 && st.f_bfree < st.f_blocks);
    assert_eq!(st.f_namemax, 255);

    // fsync of a directory (fsyncdir).
    File::open(mnt.join("d1")).unwrap().sync_all().unwrap();

    let through_fuse = manifest(&mnt);
    m.unmount();
    assert_clean(&image);
    let kmnt = s.dir("kernel");
    let kernel = LoopMount::new(&image, &kmnt);
    assert_same_tree("FUSE view vs kernel loop mount", &through_fuse, &manifest(&kernel.dir));
}

/// Without -f the command returns once the mount is live; SIGTERM unmounts and the daemon
/// leaves a clean image; a busy mount is detached on SIGTERM and finished after its last
/// file closes.
#[test]
fn daemon_mounts_in_background_and_sigterm_unmounts_cleanly() {
    if !ready("daemon_mounts_in_background_and_sigterm_unmounts_cleanly", &["dumpe2fs"]) {
        return;
    }
    let s = Scratch::new("daemon");
    let image = s.path("img");
    mkfs_ext4(&image, "32M", &[]);
    let mnt = s.dir("mnt");

    // Plain umount of a daemon.
    let m = QuillMount::daemon(&image, &mnt, "");
    assert!(image_locked(&image), "the daemon holds the image lock");
    fs::write(mnt.join("one"), b"1").unwrap();
    m.unmount();
    assert_clean(&image);

    // A second mount of a mounted image is refused, without touching it.
    let m = QuillMount::daemon(&image, &mnt, "");
    let mnt2 = s.dir("mnt2");
    let o = run(quill().arg("mount").arg(&image).arg(&mnt2));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("in use"), "{}", text(&o));
    assert!(mount_entry(&mnt2).is_none());

    // SIGTERM on an idle mount.
    fs::write(mnt.join("two"), b"22").unwrap();
    let pid = m.pid();
    // SAFETY: signalling the daemon.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    assert!(
        wait_for(Duration::from_secs(20), || mount_entry(&mnt).is_none()),
        "SIGTERM did not unmount"
    );
    let mut m = m;
    m.wait_exit();
    assert_clean(&image);

    // SIGTERM while a file is open: the mount is detached at once, the daemon finishes when
    // the file closes.
    let m = QuillMount::daemon(&image, &mnt, "");
    let mut open =
        OpenOptions::new().write(true).create(true).truncate(true).open(mnt.join("three")).unwrap();
    let pid = m.pid();
    // SAFETY: as above.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    assert!(
        wait_for(Duration::from_secs(20), || mount_entry(&mnt).is_none()),
        "SIGTERM did not detach"
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(image_locked(&image), "the daemon must keep serving the open file");
    open.write_all(b"333").unwrap();
    open.sync_all().unwrap();
    drop(open);
    let mut m = m;
    m.wait_exit();
    assert_clean(&image);

    let kmnt = s.dir("kernel");
    let kernel = LoopMount::new(&image, &kmnt);
    assert_eq!(fs::read(kernel.dir.join("one")).unwrap(), b"1");
    assert_eq!(fs::read(kernel.dir.join("two")).unwrap(), b"22");
    assert_eq!(fs::read(kernel.dir.join("three")).unwrap(), b"333");
}

/// Options reach the file system: ro refuses writes, the journal settings and data modes
/// mount and work; bad options are usage errors that touch nothing.
#[test]
fn mount_options_take_effect_and_bad_ones_are_usage_errors() {
    if !ready("mount_options_take_effect_and_bad_ones_are_usage_errors", &["dumpe2fs"]) {
        return;
    }
    let s = Scratch::new("options");
    let image = s.path("img");
    quill_mkfs(&image, "32M");
    let mnt = s.dir("mnt");

    let m = QuillMount::foreground(
        &image,
        &mnt,
        "data=journal,preset=cjfs,committing_max=2,commit=1,threads=2",
    );
    let payload: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    fs::write(mnt.join("journaled"), &payload).unwrap();
    File::open(mnt.join("journaled")).unwrap().sync_all().unwrap();
    m.unmount();
    assert_clean(&image);

    let m = QuillMount::foreground(
        &image,
        &mnt,
        "data=writeback,preset=dual,coalescing=1,errors=remount-ro,allow_other,nosuid,noatime",
    );
    fs::write(mnt.join("writeback"), b"wb").unwrap();
    m.unmount();
    assert_clean(&image);

    let before = image_hash(&image);
    let m = QuillMount::foreground(&image, &mnt, "ro");
    assert_eq!(fs::read(mnt.join("journaled")).unwrap(), payload);
    assert_eq!(errno_of(fs::write(mnt.join("new"), b"x")), libc::EROFS);
    m.unmount();
    assert_eq!(image_hash(&image), before, "a read-only mount wrote to the image");

    for opts in
        ["bogus", "errors=panic", "data=fast", "preset=turbo", "commit=x", "threads=0", "ro=1"]
    {
        let o = run(quill().args(["mount", "-f", "-o", opts]).arg(&image).arg(&mnt));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "-o {opts}: {}", text(&o));
        assert_eq!(err.lines().count(), 1, "-o {opts}: one line, got {err:?}");
        assert!(mount_entry(&mnt).is_none());
    }
    assert_eq!(image_hash(&image), before, "a refused mount touched the image");
}

/// Bad input: a one-line error, a non-zero exit, and the image bytes unchanged, with and
/// without -f.
#[test]
fn bad_input_is_one_line_and_never_touches_the_image() {
    if !ready("bad_input_is_one_line_and_never_touches_the_image", &[]) {
        return;
    }
    let s = Scratch::new("badinput");
    let mnt = s.dir("mnt");
    let good = s.path("good.img");
    mkfs_ext4(&good, "16M", &[]);
    let zeros = s.path("zeros.img");
    fs::write(&zeros, vec![0u8; 4 << 20]).unwrap();
    let text_file = s.path("notes.txt");
    fs::write(&text_file, "not a file system\n".repeat(1000)).unwrap();
    let unsupported = s.path("casefold.img");
    mkfs_ext4(&unsupported, "16M", &["-O", "casefold"]);
    let encrypt = s.path("encrypt.img");
    mkfs_ext4(&encrypt, "16M", &["-O", "encrypt"]);
    let file_as_mnt = s.path("plainfile");
    fs::write(&file_as_mnt, b"x").unwrap();

    let missing = s.path("missing.img");
    let nowhere = s.path("nowhere");
    let cases: Vec<(&str, &Path, &Path, &str)> = vec![
        ("missing image", &missing, &mnt, "No such file"),
        ("zeros", &zeros, &mnt, "zeros.img"),
        ("text file", &text_file, &mnt, "notes.txt"),
        ("casefold", &unsupported, &mnt, "casefold"),
        ("encrypt", &encrypt, &mnt, "encrypt"),
        ("missing mount point", &good, &nowhere, "nowhere"),
        ("mount point is a file", &good, &file_as_mnt, "not a directory"),
    ];
    for foreground in [true, false] {
        for (what, image, dir, needle) in &cases {
            let before = image.exists().then(|| image_hash(image));
            let mut cmd = quill();
            cmd.arg("mount");
            if foreground {
                cmd.arg("-f");
            }
            let o = run(cmd.arg(image).arg(dir).stdin(Stdio::null()));
            let err = String::from_utf8_lossy(&o.stderr).to_string();
            let label = format!("{what} (-f: {foreground})");
            assert_eq!(o.status.code(), Some(1), "{label}: {}", text(&o));
            assert_eq!(err.lines().count(), 1, "{label}: one line, got {err:?}");
            assert!(err.starts_with("quill: "), "{label}: {err}");
            assert!(err.contains(needle), "{label}: {err:?} does not mention {needle:?}");
            assert!(o.stdout.is_empty(), "{label}: stdout {:?}", o.stdout);
            assert!(mount_entry(&mnt).is_none(), "{label}: something got mounted");
            if let Some(before) = before {
                assert_eq!(image_hash(image), before, "{label}: the image changed");
            }
        }
    }
    // The well-formed image really mounts (the cases above failed for their own reasons).
    let m = QuillMount::foreground(&good, &mnt, "");
    m.unmount();
}

/// `mount.quill` (the quill binary under that name) takes mount(8)'s helper arguments;
/// `mount -t quill` finds it in /sbin.
#[test]
fn mount_helper_follows_mounts_calling_convention() {
    if !ready("mount_helper_follows_mounts_calling_convention", &["dumpe2fs", "mount"]) {
        return;
    }
    let s = Scratch::new("helper");
    let image = s.path("img");
    quill_mkfs(&image, "32M");
    let mnt = s.dir("mnt");
    let helper = s.path("mount.quill");
    symlink(env!("CARGO_BIN_EXE_quill"), &helper).unwrap();

    // Fake (-f): checks, mounts nothing, writes nothing.
    let before = image_hash(&image);
    ok(Command::new(&helper).arg(&image).arg(&mnt).args(["-f", "-v", "-o", "rw,defaults"]));
    assert!(mount_entry(&mnt).is_none());
    assert_eq!(image_hash(&image), before);
    let o = run(Command::new(&helper).arg(&image).arg(&mnt).args(["-o", "bogus"]));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).starts_with("mount.quill: unknown mount option"));
    // Sloppy (-s) ignores unknown options.
    let o = ok(Command::new(&helper)
        .arg(&image)
        .arg(&mnt)
        .args(["-s", "-n", "-o", "bogus,commit=2"])
        .stdin(Stdio::null()));
    assert!(o.stdout.is_empty());
    let m = QuillMount::adopt(&image, &mnt);
    assert_eq!(mount_entry(&mnt).map(|e| e.1), Some("fuse".to_string()));
    fs::write(mnt.join("via-helper"), b"h").unwrap();
    m.unmount();
    assert_clean(&image);

    // mount(8) itself: it runs /sbin/mount.quill. Install the link only if nothing is there.
    let sbin = Path::new("/sbin/mount.quill");
    if fs::symlink_metadata(sbin).is_ok() {
        println!("SKIP mount -t quill part: /sbin/mount.quill already exists");
        return;
    }
    struct Unlink<'a>(&'a Path);
    impl Drop for Unlink<'_> {
        fn drop(&mut self) {
            let _ = fs::remove_file(self.0);
        }
    }
    symlink(env!("CARGO_BIN_EXE_quill"), sbin).unwrap();
    let _unlink = Unlink(sbin);
    ok(Command::new("mount")
        .args(["-t", "quill", "-o", "commit=3"])
        .arg(&image)
        .arg(&mnt)
        .stdin(Stdio::null()));
    let m = QuillMount::adopt(&image, &mnt);
    assert!(mount_entry(&mnt).is_some());
    assert_eq!(fs::read(mnt.join("via-helper")).unwrap(), b"h");
    fs::write(mnt.join("via-mount"), b"m").unwrap();
    m.unmount();
    assert_clean(&image);
    let kmnt = s.dir("kernel");
    let kernel = LoopMount::new(&image, &kmnt);
    assert_eq!(fs::read(kernel.dir.join("via-mount")).unwrap(), b"m");
}
