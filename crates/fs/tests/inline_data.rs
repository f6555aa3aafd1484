//! inline_data images, both ways: files, symlinks and directories that live in their inode
//! (`i_block` and `system.data`) — made by e2fsprogs (`mkfs.ext4 -d`, which also makes inline
//! symlinks) and by the kernel — read identically by quill; quill's changes to them (writes
//! that keep a file inline or move it out, truncates and fallocate that move it out, new
//! small files that go inline, names added to and removed from inline directories, which
//! stay inline while they fit and move out when not, directories moved between parents,
//! removed, made anew) leave an image e2fsck finds clean and the kernel reads as quill did.
//! 1 KiB and 4 KiB blocks, with and without metadata_csum. Damaged inline data gives errors,
//! never panics, hangs or spreading damage.
//! Needs root, loop devices and e2fsprogs; skips with a printed reason otherwise.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::{
    assert_fsck_clean, can_loop_mount, compare, kernel_tree, open_device, quill_tree, Entry, Mount,
    Rng, Scratch,
};
use fs::{
    Ext4Image, FallocateMode, Filesystem, FsError, MountOptions, RenameFlags, SetMode, ROOT_INO,
};
use ondisk::ext4::INLINE_DATA_FL;

/// What `mkfs.ext4 -d` copies in: small files, an empty one, a directory of a few names, and
/// symlinks of 10 and 100 bytes (the long one inline: e2fsprogs writes it so).
fn seed_directory(dir: &Path, rng: &mut Rng) {
    std::fs::create_dir_all(dir.join("seeded/few")).unwrap();
    for (name, size) in [("empty", 0), ("one", 1), ("tiny", 40), ("edge", 60), ("over", 90)] {
        std::fs::write(dir.join("seeded").join(name), rng.bytes(size)).unwrap();
    }
    for i in 0..3 {
        std::fs::write(dir.join(format!("seeded/few/n{i}")), format!("n{i}")).unwrap();
    }
    std::os::unix::fs::symlink("short/link", dir.join("seeded/short-link")).unwrap();
    std::os::unix::fs::symlink("t".repeat(100), dir.join("seeded/long-link")).unwrap();
}

/// What the kernel adds: files around the inline limit, directories that stay inline and
/// one that outgrows its inode, a file with an xattr beside its inline data, a hard link.
fn kernel_writes(m: &Path, rng: &mut Rng) {
    std::fs::create_dir_all(m.join("k/small")).unwrap();
    for size in [0usize, 1, 59, 60, 61, 100, 150, 400, 5000] {
        std::fs::write(m.join(format!("k/small/f{size}")), rng.bytes(size)).unwrap();
    }
    std::fs::create_dir_all(m.join("k/inline-dir")).unwrap();
    std::fs::create_dir_all(m.join("k/empty-dir")).unwrap();
    std::fs::create_dir_all(m.join("k/to-move/inner")).unwrap();
    for i in 0..3 {
        std::fs::write(m.join(format!("k/inline-dir/e{i}")), b"x").unwrap();
    }
    // Six names: more than i_block's 56 bytes hold, so system.data holds records too.
    std::fs::create_dir_all(m.join("k/value-dir")).unwrap();
    for i in 0..6 {
        std::fs::write(m.join(format!("k/value-dir/v{i}")), b"y").unwrap();
    }
    std::fs::create_dir_all(m.join("k/grown")).unwrap();
    for i in 0..60 {
        std::fs::write(m.join(format!("k/grown/entry-number-{i}")), b"").unwrap();
    }
    let with_xattr = m.join("k/with-xattr");
    std::fs::write(&with_xattr, b"inline bytes beside an attribute").unwrap();
    // setfattr (package attr, which CI installs) sets it through the kernel.
    match std::process::Command::new("setfattr")
        .args(["-n", "user.k", "-v", "v"])
        .arg(&with_xattr)
        .status()
    {
        Ok(status) => assert!(status.success(), "setfattr failed"),
        Err(e) => println!("SKIP the kernel's xattr beside inline data: setfattr: {e}"),
    }
    std::fs::hard_link(m.join("k/small/f59"), m.join("k/hard")).unwrap();
}

/// Whether each of `paths` keeps its data inline, read from the image (unmounted: the
/// journal's changes are home).
fn inline_flags(image: &Path, paths: &[&str]) -> Vec<bool> {
    let read_only = MountOptions { read_only: true, ..MountOptions::default() };
    let fs = Filesystem::open(open_device(image), read_only).unwrap();
    let on_disk = Ext4Image::open(open_device(image)).unwrap();
    let flags = paths
        .iter()
        .map(|path| {
            let inode = on_disk.read_inode(fs.resolve(path).unwrap()).unwrap();
            inode.flags & INLINE_DATA_FL != 0
        })
        .collect();
    fs.unmount().unwrap();
    flags
}

/// quill's changes; the caller compares what quill then shows with the kernel's view.
fn quill_changes(fs: &Filesystem, rng: &mut Rng) {
    let small = fs.resolve("/k/small").unwrap();
    let ino = |name: &str| fs.lookup(small, name.as_bytes()).unwrap().ino;
    // Writes move files out of their inodes.
    let appended = rng.bytes(10);
    for name in ["f1", "f60", "f100"] {
        let size = fs.getattr(ino(name)).unwrap().size;
        fs.write(ino(name), size, &appended).unwrap();
    }
    fs.write(ino("f59"), 3, b"overwritten").unwrap();
    fs.truncate(ino("f61"), 30).unwrap();
    fs.truncate(ino("f150"), 2000).unwrap();
    fs.fallocate(ino("f0"), FallocateMode::KeepSize, 0, 8192).unwrap();
    let seeded = fs.resolve("/seeded").unwrap();
    let tiny = fs.lookup(seeded, b"tiny").unwrap().ino;
    fs.write(tiny, 40, &rng.bytes(3000)).unwrap();
    // A write far past an inline file's end: its bytes move out with the first block.
    let one = fs.lookup(seeded, b"one").unwrap().ino;
    fs.write(one, 20_000, b"far").unwrap();
    // An xattr set on an inline file keeps the data; system.data is no attribute.
    let with_xattr = fs.resolve("/k/with-xattr").unwrap();
    fs.setxattr(with_xattr, b"user.q", b"quill", SetMode::Any).unwrap();
    assert!(fs.listxattr(with_xattr).unwrap().iter().all(|n| n != b"system.data"));
    assert!(matches!(fs.getxattr(with_xattr, b"system.data"), Err(FsError::NotSupported(_))));
    assert!(matches!(
        fs.setxattr(with_xattr, b"system.data", b"x", SetMode::Any),
        Err(FsError::NotSupported(_))
    ));
    // Names in inline directories: a few stay inline, many move the directory out.
    let inline_dir = fs.resolve("/k/inline-dir").unwrap();
    fs.create(inline_dir, b"added", 0o644, 0, 0).unwrap();
    fs.unlink(inline_dir, b"e1").unwrap();
    let few = fs.resolve("/seeded/few").unwrap();
    for i in 0..40 {
        fs.create(few, format!("many-names-{i}").as_bytes(), 0o644, 0, 0).unwrap();
    }
    // An inline directory moved to another parent ("..", kept in i_block, follows), one
    // removed, and new ones, which start inline.
    let k = fs.resolve("/k").unwrap();
    let to_move = fs.resolve("/k/to-move").unwrap();
    fs.rename(to_move, b"inner", ROOT_INO, b"moved", RenameFlags::default()).unwrap();
    assert_eq!(fs.lookup(fs.resolve("/moved").unwrap(), b"..").unwrap().ino, ROOT_INO);
    fs.rmdir(k, b"empty-dir").unwrap();
    let made = fs.mkdir(k, b"made", 0o755, 0, 0).unwrap().ino;
    let sub = fs.mkdir(made, b"sub", 0o700, 0, 0).unwrap().ino;
    let file = fs.create(sub, b"file", 0o600, 0, 0).unwrap().ino;
    fs.write(file, 0, b"in a new directory").unwrap();
    fs.link(ino("f400"), inline_dir, b"linked").unwrap();
    fs.unlink(small, b"f5000").unwrap();
    // Symlinks kept inline read back; they never change.
    assert_eq!(fs.readlink(fs.resolve("/seeded/long-link").unwrap()).unwrap(), vec![b't'; 100]);
}

/// An inline_data image made with `mkfs_options`, seeded by `mkfs.ext4 -d` and written by
/// the kernel, checked clean; and the tree the kernel showed. `None` (after a SKIP line) where
/// the kernel cannot mount it.
fn made_image(
    scratch: &Scratch,
    mkfs_options: &[&str],
) -> Option<(PathBuf, BTreeMap<String, Entry>)> {
    let seed_dir = scratch.path("seed");
    seed_directory(&seed_dir, &mut Rng::new(11));
    let image = scratch.path("fs.img");
    let mut options = vec!["-O", "inline_data", "-d", seed_dir.to_str().unwrap()];
    options.extend_from_slice(mkfs_options);
    common::mkfs(&image, "64M", &options);
    let expected: BTreeMap<String, Entry> = {
        let mount = Mount::new(&image, scratch.path("mnt"))?;
        kernel_writes(&mount.dir, &mut Rng::new(12));
        kernel_tree(&mount.dir)
    };
    assert_fsck_clean(&image);
    Some((image, expected))
}

fn run(label: &str, mkfs_options: &[&str]) -> Option<()> {
    let scratch = Scratch::new(&format!("inline-{label}"));
    let (image, expected) = made_image(&scratch, mkfs_options)?;
    // Read-only, then read-write: the same tree, inline data and all.
    let read_only = MountOptions { read_only: true, ..MountOptions::default() };
    assert_eq!(
        inline_flags(&image, &["/seeded/long-link", "/k/small/f59", "/k/inline-dir", "/k/grown"]),
        [true, true, true, false],
        "{label}: e2fsprogs and the kernel keep links, files and directories inline"
    );
    let fs = Filesystem::open(open_device(&image), read_only).unwrap();
    compare(&expected, &quill_tree(&fs));
    fs.unmount().unwrap();
    let fs = Filesystem::open(open_device(&image), MountOptions::default()).unwrap();
    compare(&expected, &quill_tree(&fs));
    quill_changes(&fs, &mut Rng::new(13));
    let changed = quill_tree(&fs);
    fs.unmount().unwrap();
    assert_fsck_clean(&image);
    assert_eq!(
        inline_flags(&image, &["/k/inline-dir", "/seeded/few", "/k/made", "/k/made/sub", "/moved"]),
        [true, false, true, true, true],
        "{label}: a few names stay inline, forty move out, new directories start inline"
    );
    let files = [
        "/k/small/f1",
        "/k/small/f100",
        "/k/made/sub/file",
        "/k/with-xattr",
        "/k/small/f61",
        "/k/small/f150",
        "/seeded/tiny",
        "/seeded/one",
    ];
    assert_eq!(
        inline_flags(&image, &files),
        [true, true, true, true, true, false, false, false],
        "{label}: small files stay (or, new, go) inline, cut ones too; grown ones move out"
    );
    let mount = Mount::new(&image, scratch.path("mnt-check"))?;
    compare(&changed, &kernel_tree(&mount.dir));
    drop(mount);
    assert_fsck_clean(&image);
    println!("{label}: {} paths identical in quill and the kernel", changed.len());
    Some(())
}

#[test]
fn inline_files_symlinks_and_directories_are_read_and_changed_as_the_kernel_does() {
    let test = "inline_data_both_ways";
    if !can_loop_mount(test) {
        return;
    }
    let kinds: [(&str, &[&str]); 3] = [
        ("4k", &["-b", "4096"]),
        ("1k", &["-b", "1024"]),
        ("4k-nocsum-512-inodes", &["-b", "4096", "-O", "^metadata_csum", "-I", "512"]),
    ];
    for (label, options) in kinds {
        if run(label, options).is_none() {
            return;
        }
    }
}

/// Offsets in an inode record (`fs/ext4/ext4.h`).
const I_SIZE: usize = 0x04;
const I_BLOCK: usize = 0x28;
/// The in-inode xattr area of a record with `i_extra_isize` 32, and in it the first entry's
/// `e_value_size` (after the 4-byte header: name_len, index, value_offs, value_inum).
const XATTR_AREA: usize = 128 + 32;
const FIRST_VALUE_SIZE: usize = XATTR_AREA + 4 + 8;

/// One damage to one inode record: (case, path, offset in the record, new little-endian
/// bytes).
type Damage = (&'static str, &'static str, usize, Vec<u8>);

fn damages(value_offset: usize) -> Vec<Damage> {
    vec![
        ("file size past its inline data", "/k/small/f100", I_SIZE, 5000u32.to_le_bytes().to_vec()),
        (
            "system.data value past the inode",
            "/k/small/f100",
            FIRST_VALUE_SIZE,
            4000u32.to_le_bytes().to_vec(),
        ),
        (
            "symlink size past its inline data",
            "/seeded/long-link",
            I_SIZE,
            300u32.to_le_bytes().to_vec(),
        ),
        ("directory parent 0", "/k/inline-dir", I_BLOCK, 0u32.to_le_bytes().to_vec()),
        (
            "record longer than i_block",
            "/k/inline-dir",
            I_BLOCK + 4 + 4,
            200u16.to_le_bytes().to_vec(),
        ),
        (
            "record naming a reserved inode",
            "/k/inline-dir",
            I_BLOCK + 4,
            5u32.to_le_bytes().to_vec(),
        ),
        (
            "system.data record of length 0",
            "/k/value-dir",
            value_offset + 4,
            0u16.to_le_bytes().to_vec(),
        ),
    ]
}

/// Where the value of the first in-inode xattr (system.data) starts in the record.
fn first_value_offset(record: &[u8]) -> usize {
    let offs = u16::from_le_bytes([record[XATTR_AREA + 4 + 2], record[XATTR_AREA + 4 + 3]]);
    XATTR_AREA + 4 + usize::from(offs)
}

/// Damaged inline data (inode records edited on an image without metadata_csum, so that the
/// damage meets the structural checks rather than a checksum): sizes past the inline bytes,
/// a system.data value past the inode, a directory whose parent is 0, records too long, of
/// length 0 or naming a reserved inode. Read-only, the damaged path answers an error naming
/// corruption, everything else reads as before, and the image is not written; read-write
/// (errors=continue, so every change is tried), changes through the damage answer errors
/// too, nothing panics or hangs, and e2fsck finds nothing new outside the damaged inode.
#[test]
fn damaged_inline_data_gives_errors_never_panics_hangs_or_spreading_damage() {
    let test = "inline_data_damaged";
    if !can_loop_mount(test) {
        return;
    }
    let scratch = Scratch::new("inline-damaged");
    let Some((image, _)) = made_image(&scratch, &["-b", "4096", "-O", "^metadata_csum"]) else {
        return;
    };
    let read_only = MountOptions { read_only: true, ..MountOptions::default() };
    let fs = Filesystem::open(open_device(&image), read_only).unwrap();
    let clean = common::read_everything(&fs);
    assert!(clean.values().all(|r| r.is_ok()), "the clean image reads whole");
    let value_dir = fs.resolve("/k/value-dir").unwrap();
    let inos: BTreeMap<&str, u32> =
        damages(0).iter().map(|(_, path, _, _)| (*path, fs.resolve(path).unwrap())).collect();
    fs.unmount().unwrap();
    let clean_bytes = std::fs::read(&image).unwrap();
    let record = |ino: u32| common::inode_offset(&image, ino) as usize;
    let value_offset = first_value_offset(&clean_bytes[record(value_dir)..]);
    for (case, path, at, bytes) in damages(value_offset) {
        let ino = inos[path];
        let mut damaged = clean_bytes.clone();
        let at = record(ino) + at;
        damaged[at..at + bytes.len()].copy_from_slice(&bytes);
        std::fs::write(&image, &damaged).unwrap();
        let (_, fsck_before) = common::e2fsck(&image);
        // Read-only: in a thread of its own, so a hang is a failure, not a stuck test.
        let seen = in_thread(case, image.clone(), |image| {
            let read_only = MountOptions { read_only: true, ..MountOptions::default() };
            let fs = Filesystem::open(open_device(&image), read_only).unwrap();
            let seen = common::read_everything(&fs);
            let _ = fs.unmount();
            seen
        });
        let failed = if path.starts_with("/k/small/") || path.ends_with("-link") {
            path.to_string()
        } else {
            format!("{path}/")
        };
        let got = seen.get(&failed).unwrap_or_else(|| panic!("{case}: {failed} not reached"));
        assert!(got.as_ref().is_err_and(|e| e.contains("corrupt")), "{case}: {failed}: {got:?}");
        for (p, read) in &seen {
            assert!(p == &failed || read == &clean[p], "{case}: {p} changed: {read:?}");
        }
        assert!(std::fs::read(&image).unwrap() == damaged, "{case}: a read-only open wrote");
        // Read-write: every change through the damage fails as corruption.
        let results = in_thread(case, image.clone(), move |image| {
            let options =
                MountOptions { errors: fs::ErrorPolicy::Continue, ..MountOptions::default() };
            let fs = Filesystem::open(open_device(&image), options).unwrap();
            let results: Vec<(&str, Result<(), FsError>)> = if failed.ends_with('/') {
                vec![
                    ("create", fs.create(ino, b"new-name", 0o644, 0, 0).map(drop)),
                    ("mkdir", fs.mkdir(ino, b"new-dir", 0o755, 0, 0).map(drop)),
                    ("lookup", fs.lookup(ino, b"anything").map(drop)),
                ]
            } else if failed.ends_with("-link") {
                vec![("readlink", fs.readlink(ino).map(drop))]
            } else {
                vec![
                    ("read", fs.read(ino, 0, &mut [0u8; 64]).map(drop)),
                    ("write", fs.write(ino, 0, b"through the damage").map(drop)),
                    ("truncate", fs.truncate(ino, 10)),
                    ("fallocate", fs.fallocate(ino, FallocateMode::KeepSize, 0, 4096)),
                ]
            };
            let results: Vec<(String, String)> = results
                .into_iter()
                .filter(|(_, r)| !r.as_ref().is_err_and(FsError::is_corruption))
                .map(|(op, r)| (op.to_string(), format!("{r:?}")))
                .collect();
            let _ = fs.unmount();
            results
        });
        assert!(results.is_empty(), "{case}: changes that did not fail as corruption: {results:?}");
        let (_, fsck_after) = common::e2fsck(&image);
        let before: Vec<&str> = fsck_before.lines().collect();
        let new: Vec<&str> = fsck_after
            .lines()
            .filter(|line| !before.contains(line) && !common::e2fsck_clock_line(line))
            .filter(|line| {
                !line.contains(&ino.to_string())
                    && !line.contains("blocks")
                    && !line.contains("files")
            })
            .collect();
        assert!(new.is_empty(), "{case}: e2fsck finds new damage: {new:#?}\nbefore:\n{fsck_before}\nafter:\n{fsck_after}");
        println!("{case}: errors where the damage is met, nothing else changed");
    }
}

/// Runs `work` on `image` in a thread of its own; a panic or 20 s without an answer fails
/// `case`.
fn in_thread<T: Send + 'static>(
    case: &str,
    image: PathBuf,
    work: impl FnOnce(PathBuf) -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(work(image));
    });
    rx.recv_timeout(std::time::Duration::from_secs(20))
        .unwrap_or_else(|_| panic!("{case}: quill panicked or hung"))
}

/// On a full file system a small inline file is still overwritten and truncated in its
/// inode (no block needed, as the kernel's inline writes); growing it past the inode is
/// ENOSPC with nothing changed; the image stays clean.
#[test]
fn a_full_file_system_still_rewrites_inline_files() {
    if !common::have("mkfs.ext4", "inline_full") || !common::have("e2fsck", "inline_full") {
        return;
    }
    let scratch = Scratch::new("inline-full");
    let image = scratch.path("fs.img");
    common::mkfs(&image, "16M", &["-O", "inline_data", "-b", "1024"]);
    let fs = Filesystem::open(open_device(&image), MountOptions::default()).unwrap();
    let small = fs.create(ROOT_INO, b"small", 0o644, 0, 0).unwrap().ino;
    fs.write(small, 0, b"thirty bytes of inline data!!!").unwrap();
    fs.fsync(small, false).unwrap();
    let filler = fs.create(ROOT_INO, b"filler", 0o644, 0, 0).unwrap().ino;
    let chunk = vec![7u8; 256 << 10];
    let mut at = 0u64;
    loop {
        match fs.write(filler, at, &chunk) {
            Ok(n) if n > 0 => at += n as u64,
            Ok(_) | Err(FsError::NoSpace) => break,
            Err(e) => panic!("filling: {e}"),
        }
    }
    fs.fsync(filler, false).unwrap();
    assert!(matches!(fs.write(filler, at, &chunk), Err(FsError::NoSpace)), "the disk is full");
    fs.write(small, 7, b"BYTES").unwrap();
    fs.truncate(small, 12).unwrap();
    let mut buf = vec![0u8; 64];
    let n = fs.read(small, 0, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"thirty BYTES");
    assert!(matches!(fs.write(small, 0, &[1u8; 4096]), Err(FsError::NoSpace)));
    let n = fs.read(small, 0, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"thirty BYTES", "a refused write changes nothing");
    fs.unmount().unwrap();
    assert_fsck_clean(&image);
    assert_eq!(inline_flags(&image, &["/small"]), [true]);
}
