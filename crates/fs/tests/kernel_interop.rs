//! Kernel interoperability both ways: a tree quill writes is read back identically through a
//! kernel loop mount, and a tree the kernel writes is read identically by quill, which can
//! then change it and leave it e2fsck-clean. Device nodes, fifos and sockets go both ways
//! (type, mode, owner, rdev); RENAME_EXCHANGE done by quill is checked through the kernel
//! (including every directory's `..`); fallocated and punched files are compared with the
//! kernel's view (contents, st_blocks, and the written/unwritten mapping `filefrag` reports),
//! both ways. Needs root, loop devices and e2fsprogs (filefrag and util-linux's fallocate for
//! the fallocate test); skips with a printed reason otherwise.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use common::{
    assert_fsck_clean, can_loop_mount, compare, have, kernel_tree, mkfs, open_device, quill_tree,
    Mount, Rng, Scratch,
};
use fs::{Filesystem, MountOptions, SetMode, ROOT_INO};

#[test]
fn a_tree_quill_writes_reads_back_identically_through_the_kernel() {
    let test = "quill_to_kernel";
    if !can_loop_mount(test) {
        return;
    }
    for (label, opts) in [("4k", vec!["-b", "4096"]), ("1k", vec!["-b", "1024"])] {
        let scratch = Scratch::new(&format!("interop-q2k-{label}"));
        let image = scratch.path("fs.img");
        mkfs(&image, "128M", &opts);
        let fs = Filesystem::open(open_device(&image), MountOptions::default()).unwrap();
        let mut rng = Rng::new(42);
        let root = ROOT_INO;
        // Files of many sizes.
        let files = fs.mkdir(root, b"files", 0o750, 1000, 1000).unwrap().ino;
        for (i, size) in
            [0usize, 1, 511, 4095, 4096, 4097, 65536, 1 << 20, 3 << 20].iter().enumerate()
        {
            let ino = fs
                .create(files, format!("f{i}").as_bytes(), 0o640, 1000 + i as u32, 100)
                .unwrap()
                .ino;
            fs.write(ino, 0, &rng.bytes(*size)).unwrap();
        }
        // A sparse file.
        let sparse = fs.create(root, b"sparse", 0o600, 0, 0).unwrap().ino;
        fs.write(sparse, 10 << 20, b"tail").unwrap();
        fs.write(sparse, 5000, b"middle").unwrap();
        // Deep directories.
        let mut dir = root;
        for depth in 0..20 {
            dir = fs.mkdir(dir, format!("d{depth}").as_bytes(), 0o755, 0, 0).unwrap().ino;
        }
        fs.create(dir, b"deep-file", 0o644, 0, 0).unwrap();
        // A directory large enough to be indexed.
        let big = fs.mkdir(root, b"big", 0o755, 0, 0).unwrap().ino;
        for i in 0..1500 {
            fs.create(big, format!("entry-number-{i}").as_bytes(), 0o644, 0, 0).unwrap();
        }
        // Symlinks, fast and slow; hard links; xattrs in the inode and in a block.
        fs.symlink(root, b"fast-link", b"files/f1", 0, 0).unwrap();
        let long_target = vec![b'x'; 300];
        fs.symlink(root, b"slow-link", &long_target, 0, 0).unwrap();
        let target = fs.lookup(files, b"f3").unwrap().ino;
        fs.link(target, root, b"hard-link").unwrap();
        fs.setxattr(target, b"user.small", b"value", SetMode::Any).unwrap();
        fs.setxattr(target, b"user.large", &vec![7u8; 700], SetMode::Any).unwrap();
        let expected = quill_tree(&fs);
        fs.unmount().unwrap();
        assert_fsck_clean(&image);
        let Some(mount) = Mount::new(&image, scratch.path("mnt")) else { return };
        let seen = kernel_tree(&mount.dir);
        drop(mount);
        compare(&expected, &seen);
        assert_fsck_clean(&image);
        println!("{label}: {} paths identical through the kernel", expected.len());
    }
}

#[test]
fn a_tree_the_kernel_writes_reads_identically_in_quill_which_can_then_change_it() {
    let test = "kernel_to_quill";
    if !can_loop_mount(test) {
        return;
    }
    let scratch = Scratch::new("interop-k2q");
    let image = scratch.path("fs.img");
    mkfs(&image, "128M", &["-b", "4096"]);
    let expected = {
        let Some(mount) = Mount::new(&image, scratch.path("mnt")) else { return };
        let m = &mount.dir;
        let mut rng = Rng::new(7);
        std::fs::create_dir_all(m.join("a/b/c")).unwrap();
        for (i, size) in [0usize, 100, 4096, 70000, 2 << 20].iter().enumerate() {
            std::fs::write(m.join(format!("a/file{i}")), rng.bytes(*size)).unwrap();
        }
        std::fs::create_dir(m.join("many")).unwrap();
        for i in 0..2000 {
            std::fs::write(m.join(format!("many/n{i}")), format!("{i}")).unwrap();
        }
        std::os::unix::fs::symlink("a/file1", m.join("link")).unwrap();
        std::fs::hard_link(m.join("a/file2"), m.join("a/b/hard")).unwrap();
        std::fs::File::create(m.join("sparse")).unwrap().set_len(50 << 20).unwrap();
        let _ = Command::new("setfattr")
            .args(["-n", "user.k", "-v", "v1"])
            .arg(m.join("a/file1"))
            .status();
        let tree = kernel_tree(m);
        drop(mount);
        tree
    };
    let fs = Filesystem::open(open_device(&image), MountOptions::default()).unwrap();
    compare(&quill_tree(&fs), &expected);
    // Change it: delete half of "many", write into a kernel file, rename a directory.
    let many = fs.lookup(ROOT_INO, b"many").unwrap().ino;
    for i in (0..2000).step_by(2) {
        fs.unlink(many, format!("n{i}").as_bytes()).unwrap();
    }
    let a = fs.lookup(ROOT_INO, b"a").unwrap().ino;
    let f3 = fs.lookup(a, b"file3").unwrap().ino;
    fs.write(f3, 1000, b"quill was here").unwrap();
    fs.rename(a, b"b", ROOT_INO, b"b-moved", Default::default()).unwrap();
    let after = quill_tree(&fs);
    fs.unmount().unwrap();
    assert_fsck_clean(&image);
    let Some(mount) = Mount::new(&image, scratch.path("mnt")) else { return };
    let seen = kernel_tree(&mount.dir);
    drop(mount);
    compare(&after, &seen);
}

// ---------------------------------------------------------------------------------------------
// Special files, RENAME_EXCHANGE and fallocate

/// A device number as quill's `mknod` and `Attr::rdev` carry it (the kernel's
/// `new_encode_dev`: 12-bit major, 20-bit minor).
fn quill_dev(major: u32, minor: u32) -> u32 {
    (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12)
}

fn quill_major_minor(rdev: u32) -> (u32, u32) {
    ((rdev >> 8) & 0xfff, (rdev & 0xff) | ((rdev >> 12) & 0xfff00))
}

/// glibc's `major`/`minor` of a `st_rdev`.
fn kernel_major_minor(dev: u64) -> (u32, u32) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    (major as u32, minor as u32)
}

/// One special file: name, type bits, (major, minor) for devices, permission bits, owner.
struct Special {
    name: &'static str,
    kind: u16,
    dev: (u32, u32),
    perm: u16,
    uid: u32,
}

const S_IFCHR: u16 = 0o020000;
const S_IFBLK: u16 = 0o060000;
const S_IFIFO: u16 = 0o010000;
const S_IFSOCK: u16 = 0o140000;

/// The special files of one side.
fn specials(prefix: &'static str) -> Vec<Special> {
    all_specials(prefix)
}

fn all_specials(prefix: &'static str) -> Vec<Special> {
    let s = |name, kind, dev, perm, uid| Special { name, kind, dev, perm, uid };
    let names: [&'static str; 6] = match prefix {
        "q" => ["q-chr", "q-blk", "q-chr-big", "q-blk-big", "q-fifo", "q-sock"],
        _ => ["k-chr", "k-blk", "k-chr-big", "k-blk-big", "k-fifo", "k-sock"],
    };
    vec![
        s(names[0], S_IFCHR, (4, 5), 0o620, 1000),
        s(names[1], S_IFBLK, (8, 1), 0o660, 0),
        // Past 8 bits: the new encoding in i_block[1].
        s(names[2], S_IFCHR, (300, 70_000), 0o600, 7),
        s(names[3], S_IFBLK, (259, 1_048_575), 0o640, 0),
        s(names[4], S_IFIFO, (0, 0), 0o644, 1000),
        s(names[5], S_IFSOCK, (0, 0), 0o755, 0),
    ]
}

fn kernel_kind(meta: &std::fs::Metadata) -> u16 {
    use std::os::unix::fs::FileTypeExt;
    let ft = meta.file_type();
    if ft.is_char_device() {
        S_IFCHR
    } else if ft.is_block_device() {
        S_IFBLK
    } else if ft.is_fifo() {
        S_IFIFO
    } else if ft.is_socket() {
        S_IFSOCK
    } else {
        0
    }
}

#[test]
fn device_fifo_and_socket_nodes_round_trip_between_quill_and_the_kernel() {
    let test = "special_files";
    if !can_loop_mount(test) || !have("mknod", test) {
        return;
    }
    let scratch = Scratch::new("interop-special");
    let image = scratch.path("fs.img");
    mkfs(&image, "32M", &["-b", "4096"]);
    // quill makes them.
    let fs = Filesystem::open(open_device(&image), MountOptions::default()).unwrap();
    for s in specials("q") {
        let rdev = quill_dev(s.dev.0, s.dev.1);
        let attr =
            fs.mknod(ROOT_INO, s.name.as_bytes(), s.kind | s.perm, rdev, s.uid, 100).unwrap();
        assert_eq!(attr.mode, s.kind | s.perm, "{}: mode", s.name);
        if matches!(s.kind, S_IFCHR | S_IFBLK) {
            assert_eq!(quill_major_minor(attr.rdev), s.dev, "{}: rdev as created", s.name);
        }
    }
    fs.unmount().unwrap();
    assert_fsck_clean(&image);
    // The kernel reads them, and makes its own.
    {
        let Some(mount) = Mount::new(&image, scratch.path("mnt")) else { return };
        for s in specials("q") {
            let meta = std::fs::symlink_metadata(mount.dir.join(s.name)).unwrap();
            assert_eq!(kernel_kind(&meta), s.kind, "{}: type through the kernel", s.name);
            assert_eq!(meta.permissions().mode() & 0o7777, u32::from(s.perm), "{}: mode", s.name);
            assert_eq!((meta.uid(), meta.gid()), (s.uid, 100), "{}: owner", s.name);
            assert_eq!(meta.nlink(), 1, "{}: links", s.name);
            if matches!(s.kind, S_IFCHR | S_IFBLK) {
                assert_eq!(kernel_major_minor(meta.rdev()), s.dev, "{}: rdev", s.name);
            }
        }
        for s in specials("k") {
            let path = mount.dir.join(s.name);
            match s.kind {
                S_IFSOCK => drop(std::os::unix::net::UnixListener::bind(&path).unwrap()),
                _ => {
                    let kind = match s.kind {
                        S_IFCHR => "c",
                        S_IFBLK => "b",
                        _ => "p",
                    };
                    let mut cmd = Command::new("mknod");
                    cmd.arg(&path).arg(kind);
                    if kind != "p" {
                        cmd.arg(s.dev.0.to_string()).arg(s.dev.1.to_string());
                    }
                    let out = cmd.output().unwrap();
                    assert!(
                        out.status.success(),
                        "mknod: {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
            }
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(u32::from(s.perm)))
                .unwrap();
            std::os::unix::fs::chown(&path, Some(s.uid), Some(100)).unwrap();
        }
    }
    assert_fsck_clean(&image);
    // quill reads the kernel's.
    let fs = Filesystem::open(open_device(&image), MountOptions::default()).unwrap();
    for s in specials("k").into_iter().chain(specials("q")) {
        let attr = fs.lookup(ROOT_INO, s.name.as_bytes()).unwrap();
        assert_eq!(attr.mode, s.kind | s.perm, "{}: mode in quill", s.name);
        assert_eq!((attr.uid, attr.gid, attr.nlink), (s.uid, 100, 1), "{}: owner", s.name);
        assert_eq!(attr.size, 0, "{}: size", s.name);
        if matches!(s.kind, S_IFCHR | S_IFBLK) {
            assert_eq!(quill_major_minor(attr.rdev), s.dev, "{}: rdev in quill", s.name);
        }
    }
    // quill removes one of each side; the kernel sees the rest.
    fs.unlink(ROOT_INO, b"k-chr-big").unwrap();
    fs.unlink(ROOT_INO, b"q-blk-big").unwrap();
    fs.unmount().unwrap();
    assert_fsck_clean(&image);
    let Some(mount) = Mount::new(&image, scratch.path("mnt")) else { return };
    let mut names: Vec<String> = std::fs::read_dir(&mount.dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "lost+found")
        .collect();
    names.sort();
    let mut want: Vec<String> = specials("k")
        .into_iter()
        .chain(specials("q"))
        .map(|s| s.name.to_string())
        .filter(|n| n != "k-chr-big" && n != "q-blk-big")
        .collect();
    want.sort();
    assert_eq!(names, want);
    drop(mount);
    println!("special files: 10 nodes identical both ways");
}

/// The inode of `d/..` is `d`'s parent for every directory `d` under `dir` (kernel view).
fn kernel_dotdot_ok(dir: &Path) {
    let parent_ino = std::fs::metadata(dir).unwrap().ino();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        if meta.is_dir() && path.file_name().is_some_and(|n| n != "lost+found") {
            let dotdot = std::fs::metadata(path.join("..")).unwrap().ino();
            assert_eq!(dotdot, parent_ino, "{}: .. is not its parent", path.display());
            kernel_dotdot_ok(&path);
        }
    }
}

#[test]
fn rename_exchange_done_by_quill_is_what_the_kernel_sees() {
    let test = "rename_exchange";
    if !can_loop_mount(test) {
        return;
    }
    let scratch = Scratch::new("interop-exchange");
    let image = scratch.path("fs.img");
    mkfs(&image, "32M", &["-b", "1024"]);
    let fs = Filesystem::open(open_device(&image), MountOptions::default()).unwrap();
    let exchange = fs::RenameFlags { exchange: true, ..fs::RenameFlags::default() };
    let mut rng = Rng::new(5);
    let root = ROOT_INO;
    let dir1 = fs.mkdir(root, b"dir1", 0o755, 0, 0).unwrap().ino;
    let dir2 = fs.mkdir(root, b"dir2", 0o700, 0, 0).unwrap().ino;
    let x = fs.create(root, b"x", 0o644, 1, 1).unwrap().ino;
    fs.write(x, 0, &rng.bytes(5000)).unwrap();
    let y = fs.create(dir1, b"y", 0o600, 2, 2).unwrap().ino;
    fs.write(y, 0, &rng.bytes(70_000)).unwrap();
    let sub = fs.mkdir(dir1, b"sub", 0o750, 0, 0).unwrap().ino;
    fs.create(sub, b"inner", 0o644, 0, 0).unwrap();
    let deep = fs.mkdir(dir2, b"deep", 0o755, 0, 0).unwrap().ino;
    fs.mkdir(deep, b"deeper", 0o755, 0, 0).unwrap();
    fs.symlink(dir2, b"link", b"../x", 0, 0).unwrap();
    // Two files in one directory, two files across directories.
    let z = fs.create(root, b"z", 0o640, 3, 3).unwrap().ino;
    fs.write(z, 0, b"zzz").unwrap();
    fs.rename(root, b"x", root, b"z", exchange).unwrap();
    fs.rename(root, b"x", dir1, b"y", exchange).unwrap();
    // A directory and a file across directories: the link counts of both parents change.
    fs.rename(dir1, b"sub", root, b"z", exchange).unwrap();
    // Two directories across directories, one of them holding a subdirectory.
    fs.rename(root, b"z", dir2, b"deep", exchange).unwrap();
    // A symlink and a directory in one directory.
    fs.rename(dir2, b"link", dir2, b"deep", exchange).unwrap();
    assert_eq!(fs.lookup(dir2, b"link").unwrap().ino, sub);
    let expected = quill_tree(&fs);
    fs.unmount().unwrap();
    assert_fsck_clean(&image);
    let Some(mount) = Mount::new(&image, scratch.path("mnt")) else { return };
    let seen = kernel_tree(&mount.dir);
    kernel_dotdot_ok(&mount.dir);
    drop(mount);
    compare(&expected, &seen);
    assert_fsck_clean(&image);
    println!("rename exchange: {} paths identical through the kernel", expected.len());
}

/// Half-open block ranges.
type Ranges = Vec<(u64, u64)>;

/// Logical block ranges of `path` the kernel maps, from `filefrag -v` (FIEMAP):
/// (written, unwritten), adjacent extents merged.
fn kernel_mapped_blocks(path: &Path, block_size: u64) -> (Ranges, Ranges) {
    let (written, unwritten) = kernel_mapped_block_list(path, block_size);
    (ranges(&written), ranges(&unwritten))
}

/// Sorted block numbers as half-open ranges.
fn ranges(blocks: &[u64]) -> Vec<(u64, u64)> {
    let mut sorted = blocks.to_vec();
    sorted.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for b in sorted {
        match out.last_mut() {
            Some(last) if last.1 == b => last.1 += 1,
            _ => out.push((b, b + 1)),
        }
    }
    out
}

fn kernel_mapped_block_list(path: &Path, block_size: u64) -> (Vec<u64>, Vec<u64>) {
    let out = Command::new("filefrag").arg("-v").arg(path).output().expect("run filefrag");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("blocks of {block_size} bytes")),
        "filefrag reports another block size:\n{text}"
    );
    let (mut written, mut unwritten) = (Vec::new(), Vec::new());
    for line in text.lines() {
        // "   1:       16..    1023:      14353..     15360:   1008:             last,unwritten"
        let fields: Vec<&str> = line.split(':').map(str::trim).collect();
        if fields.len() < 4 || fields[0].parse::<u32>().is_err() {
            continue;
        }
        let (from, to) = fields[1].split_once("..").expect("logical range");
        let (from, to): (u64, u64) = (from.trim().parse().unwrap(), to.trim().parse().unwrap());
        let target = if line.contains("unwritten") { &mut unwritten } else { &mut written };
        target.extend(from..=to);
    }
    (written, unwritten)
}

fn have_fallocate_tools(test: &str) -> bool {
    have("filefrag", test) && have("fallocate", test)
}

#[test]
fn fallocated_and_punched_files_look_the_same_to_quill_and_the_kernel() {
    let test = "fallocate_interop";
    if !can_loop_mount(test) || !have_fallocate_tools(test) {
        return;
    }
    let bs = 4096u64;
    let scratch = Scratch::new("interop-fallocate");
    let image = scratch.path("fs.img");
    mkfs(&image, "64M", &["-b", "4096"]);
    let fs = Filesystem::open(open_device(&image), MountOptions::default()).unwrap();
    let mut rng = Rng::new(11);
    // "punched": 1 MiB of data; whole blocks 10..16 punched out; an unaligned punch inside
    // blocks 0 and 1 (zeroed in place); 1 MiB more allocated past EOF with KEEP_SIZE.
    let punched = fs.create(ROOT_INO, b"punched", 0o644, 0, 0).unwrap().ino;
    let mut want_punched = rng.bytes(1 << 20);
    fs.write(punched, 0, &want_punched).unwrap();
    fs.fallocate(punched, fs::FallocateMode::PunchHole, 10 * bs, 6 * bs).unwrap();
    want_punched[10 * bs as usize..16 * bs as usize].fill(0);
    fs.fallocate(punched, fs::FallocateMode::PunchHole, 100, 4900).unwrap();
    want_punched[100..5000].fill(0);
    fs.fallocate(punched, fs::FallocateMode::KeepSize, 1 << 20, 1 << 20).unwrap();
    // "allocated": 4 blocks and a bit allocated (the size grows), then 10 bytes written into
    // the second block, which splits the unwritten extent.
    let allocated = fs.create(ROOT_INO, b"allocated", 0o644, 0, 0).unwrap().ino;
    fs.fallocate(allocated, fs::FallocateMode::Allocate, 0, 3 * bs + 100).unwrap();
    let mut want_allocated = vec![0u8; 3 * bs as usize + 100];
    fs.write(allocated, 5000, b"0123456789").unwrap();
    want_allocated[5000..5010].copy_from_slice(b"0123456789");
    // "sparse-tail": a hole, then a punch past EOF that must not change the size.
    let tail = fs.create(ROOT_INO, b"sparse-tail", 0o644, 0, 0).unwrap().ino;
    fs.write(tail, 3 * bs, b"tail").unwrap();
    fs.fallocate(tail, fs::FallocateMode::PunchHole, 2 * bs, 10 * bs).unwrap();
    let want_tail = vec![0u8; 3 * bs as usize + 4];
    let quill_blocks: Vec<u64> =
        [punched, allocated, tail].iter().map(|&i| fs.getattr(i).unwrap().blocks).collect();
    for (ino, want) in [(punched, &want_punched), (allocated, &want_allocated), (tail, &want_tail)]
    {
        let mut got = vec![0u8; want.len()];
        assert_eq!(fs.read(ino, 0, &mut got).unwrap(), want.len());
        assert!(got == *want, "inode {ino}: quill reads other contents");
    }
    fs.unmount().unwrap();
    assert_fsck_clean(&image);

    let sectors = bs / 512;
    let Some(mount) = Mount::new(&image, scratch.path("mnt")) else { return };
    let m = &mount.dir;
    let files = [
        ("punched", &want_punched, 1 << 20),
        ("allocated", &want_allocated, 3 * bs + 100),
        ("sparse-tail", &want_tail, 3 * bs + 4),
    ];
    for (i, (name, want, size)) in files.iter().enumerate() {
        let meta = std::fs::metadata(m.join(name)).unwrap();
        assert_eq!(meta.len(), *size, "{name}: size through the kernel");
        assert!(std::fs::read(m.join(name)).unwrap() == **want, "{name}: contents differ");
        assert_eq!(meta.blocks(), quill_blocks[i], "{name}: st_blocks vs quill's i_blocks");
    }
    // What is mapped, and how, as the kernel's FIEMAP reports it.
    let (written, unwritten) = kernel_mapped_blocks(&m.join("punched"), bs);
    assert_eq!((written, unwritten), (vec![(0, 10), (16, 256)], vec![(256, 512)]), "punched");
    assert_eq!(quill_blocks[0], (250 + 256) * sectors, "punched: blocks (extents in the inode)");
    let (written, unwritten) = kernel_mapped_blocks(&m.join("allocated"), bs);
    assert_eq!((written, unwritten), (vec![(1, 2)], vec![(0, 1), (2, 4)]), "allocated");
    assert_eq!(quill_blocks[1], 4 * sectors, "allocated: blocks");
    let (written, unwritten) = kernel_mapped_blocks(&m.join("sparse-tail"), bs);
    assert_eq!((written, unwritten), (vec![(3, 4)], vec![]), "sparse-tail: mapping");
    // The kernel's own fallocate, for quill to read next.
    let run = common::fallocate;
    let k = m.join("kernel-file");
    let mut want_kernel = rng.bytes(256 << 10);
    std::fs::write(&k, &want_kernel).unwrap();
    let k_str = k.to_str().unwrap();
    run(&["-p", "-o", "8192", "-l", "16384", k_str]);
    want_kernel[8192..24_576].fill(0);
    run(&["-p", "-o", "70000", "-l", "1000", k_str]);
    want_kernel[70_000..71_000].fill(0);
    run(&["-n", "-o", "262144", "-l", "131072", k_str]);
    run(&["-o", "393216", "-l", "10000", k_str]);
    want_kernel.resize(393_216 + 10_000, 0);
    let kernel_meta = std::fs::metadata(&k).unwrap();
    drop(mount);
    assert_fsck_clean(&image);

    let fs = Filesystem::open(open_device(&image), MountOptions::default()).unwrap();
    let ino = fs.lookup(ROOT_INO, b"kernel-file").unwrap().ino;
    let attr = fs.getattr(ino).unwrap();
    assert_eq!(attr.size, kernel_meta.len(), "kernel-file: size in quill");
    assert_eq!(attr.blocks, kernel_meta.blocks(), "kernel-file: blocks in quill");
    let mut got = vec![0u8; want_kernel.len()];
    assert_eq!(fs.read(ino, 0, &mut got).unwrap(), got.len());
    assert!(got == want_kernel, "kernel-file: quill reads other contents");
    // quill writes into the kernel's unwritten range and punches the kernel's data.
    fs.write(ino, 300_000, b"quill in the unwritten range").unwrap();
    want_kernel[300_000..300_028].copy_from_slice(b"quill in the unwritten range");
    fs.fallocate(ino, fs::FallocateMode::PunchHole, 100_000, 50_000).unwrap();
    want_kernel[100_000..150_000].fill(0);
    fs.unmount().unwrap();
    assert_fsck_clean(&image);
    let Some(mount) = Mount::new(&image, scratch.path("mnt")) else { return };
    let got = std::fs::read(mount.dir.join("kernel-file")).unwrap();
    drop(mount);
    assert!(got == want_kernel, "kernel-file after quill's changes: contents differ");
    println!("fallocate: quill's and the kernel's views agree");
}

#[test]
fn fifo_and_socket_nodes_made_by_quill_are_e2fsck_clean() {
    let test = "quill_fifo_socket";
    if !have("mkfs.ext4", test) || !have("e2fsck", test) {
        return;
    }
    let scratch = Scratch::new("quill-fifo-socket");
    let image = scratch.path("fs.img");
    mkfs(&image, "16M", &["-b", "4096"]);
    let fs = Filesystem::open(open_device(&image), MountOptions::default()).unwrap();
    let specials: Vec<Special> =
        all_specials("q").into_iter().filter(|s| matches!(s.kind, S_IFIFO | S_IFSOCK)).collect();
    for s in &specials {
        fs.mknod(ROOT_INO, s.name.as_bytes(), s.kind | s.perm, 0, s.uid, 100).unwrap();
    }
    fs.unmount().unwrap();
    assert_fsck_clean(&image);
    if !can_loop_mount(test) {
        return;
    }
    let Some(mount) = Mount::new(&image, scratch.path("mnt")) else { return };
    for s in &specials {
        let meta = std::fs::symlink_metadata(mount.dir.join(s.name)).unwrap();
        assert_eq!(kernel_kind(&meta), s.kind, "{}: type through the kernel", s.name);
        assert_eq!(meta.permissions().mode() & 0o7777, u32::from(s.perm), "{}: mode", s.name);
    }
}
