//! Kernel interoperability both ways: a tree quill writes is read back identically through a
//! kernel loop mount, and a tree the kernel writes is read identically by quill, which can
//! then change it and leave it e2fsck-clean. Needs root, loop devices and e2fsprogs; skips
//! with a printed reason otherwise.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{assert_fsck_clean, have, list_dir, mkfs, open_device, Rng, Scratch};
use fs::{Filesystem, MountOptions, SetMode, ROOT_INO};

/// What both sides must agree on for one path.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    kind: char,
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    nlink: u32,
    contents: Vec<u8>,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

fn can_loop_mount(test: &str) -> bool {
    if !have("mount", test) || !have("mkfs.ext4", test) || !have("e2fsck", test) {
        return false;
    }
    let root = Command::new("id").arg("-u").output().map(|o| o.stdout == b"0\n").unwrap_or(false);
    if !root {
        println!("SKIP {test}: loop mounts need root");
    }
    root
}

struct Mount {
    dir: PathBuf,
}

impl Mount {
    fn new(image: &Path, dir: PathBuf) -> Option<Mount> {
        std::fs::create_dir_all(&dir).unwrap();
        let out = Command::new("mount").args(["-o", "loop"]).arg(image).arg(&dir).output().unwrap();
        if !out.status.success() {
            println!("SKIP: loop mount failed: {}", String::from_utf8_lossy(&out.stderr));
            return None;
        }
        Some(Mount { dir })
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        // A failed umount would leave quill reading an image the kernel has not written back.
        // "Target is busy" can be transient (something else on the machine looking into the
        // directory), so try a few times before giving up.
        let mut last_error = String::new();
        for _ in 0..10 {
            match Command::new("umount").arg(&self.dir).output() {
                Ok(out) if out.status.success() => return,
                Ok(out) => last_error = String::from_utf8_lossy(&out.stderr).trim().to_string(),
                Err(err) => last_error = err.to_string(),
            }
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
        if !std::thread::panicking() {
            panic!("umount {} failed: {last_error}", self.dir.display());
        }
    }
}

fn kernel_tree(root: &Path) -> BTreeMap<String, Entry> {
    let mut out = BTreeMap::new();
    kernel_walk(root, root, &mut out);
    out
}

fn kernel_walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Entry>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let path = entry.path();
        let rel = path.strip_prefix(root).unwrap().to_string_lossy().to_string();
        if rel == "lost+found" {
            continue;
        }
        let meta = std::fs::symlink_metadata(&path).unwrap();
        let ft = meta.file_type();
        let (kind, contents) = if ft.is_dir() {
            ('d', Vec::new())
        } else if ft.is_symlink() {
            ('l', std::fs::read_link(&path).unwrap().into_os_string().into_encoded_bytes())
        } else {
            ('f', std::fs::read(&path).unwrap())
        };
        let mut xattrs = BTreeMap::new();
        if !ft.is_symlink() {
            let out =
                Command::new("getfattr").args(["-d", "-m", "-", "-e", "hex"]).arg(&path).output();
            if let Ok(out) = out {
                for line in String::from_utf8_lossy(&out.stdout).lines() {
                    if let Some((k, v)) = line.split_once('=') {
                        let v = v.trim_start_matches("0x");
                        let bytes = (0..v.len() / 2)
                            .map(|i| u8::from_str_radix(&v[2 * i..2 * i + 2], 16).unwrap())
                            .collect();
                        xattrs.insert(k.as_bytes().to_vec(), bytes);
                    }
                }
            }
        }
        out.insert(
            rel,
            Entry {
                kind,
                mode: meta.permissions().mode() & 0o7777,
                uid: meta.uid(),
                gid: meta.gid(),
                size: meta.len(),
                nlink: meta.nlink() as u32,
                contents,
                xattrs,
            },
        );
        if ft.is_dir() {
            kernel_walk(root, &path, out);
        }
    }
}

fn quill_tree(fs: &Filesystem) -> BTreeMap<String, Entry> {
    let mut out = BTreeMap::new();
    quill_walk(fs, ROOT_INO, "", &mut out);
    out
}

fn quill_walk(fs: &Filesystem, dir: u32, prefix: &str, out: &mut BTreeMap<String, Entry>) {
    for e in list_dir(fs, dir, 64) {
        if e.name == b"." || e.name == b".." || (prefix.is_empty() && e.name == b"lost+found") {
            continue;
        }
        let name = String::from_utf8(e.name).unwrap();
        let rel = if prefix.is_empty() { name } else { format!("{prefix}/{name}") };
        let attr = fs.getattr(e.ino).unwrap();
        let kind = match attr.mode & 0o170000 {
            0o040000 => 'd',
            0o120000 => 'l',
            _ => 'f',
        };
        let contents = match kind {
            'l' => fs.readlink(e.ino).unwrap(),
            'f' => {
                let mut buf = vec![0u8; attr.size as usize];
                fs.read(e.ino, 0, &mut buf).unwrap();
                buf
            }
            _ => Vec::new(),
        };
        let mut xattrs = BTreeMap::new();
        if kind != 'l' {
            for k in fs.listxattr(e.ino).unwrap() {
                let v = fs.getxattr(e.ino, &k).unwrap();
                xattrs.insert(k, v);
            }
        }
        out.insert(
            rel.clone(),
            Entry {
                kind,
                mode: u32::from(attr.mode) & 0o7777,
                uid: attr.uid,
                gid: attr.gid,
                size: attr.size,
                nlink: attr.nlink,
                contents,
                xattrs,
            },
        );
        if kind == 'd' {
            quill_walk(fs, e.ino, &rel, out);
        }
    }
}

/// getfattr (package `attr`) reads xattrs through the kernel; without it they are not compared.
fn have_getfattr() -> bool {
    Command::new("sh")
        .args(["-c", "command -v getfattr"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn compare(a: &BTreeMap<String, Entry>, b: &BTreeMap<String, Entry>) {
    let names_a: Vec<_> = a.keys().collect();
    let names_b: Vec<_> = b.keys().collect();
    assert_eq!(names_a, names_b, "path sets differ");
    for (path, ea) in a {
        let eb = &b[path];
        assert_eq!(
            (ea.kind, ea.mode, ea.uid, ea.gid, ea.size, ea.nlink),
            (eb.kind, eb.mode, eb.uid, eb.gid, eb.size, eb.nlink),
            "{path}: attributes differ"
        );
        assert!(ea.contents == eb.contents, "{path}: contents differ");
        // The kernel lists security/system attributes only when asked for them; compare user.*
        let user = |x: &BTreeMap<Vec<u8>, Vec<u8>>| -> BTreeMap<Vec<u8>, Vec<u8>> {
            x.iter()
                .filter(|(k, _)| k.starts_with(b"user."))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        };
        if have_getfattr() {
            assert_eq!(user(&ea.xattrs), user(&eb.xattrs), "{path}: xattrs differ");
        } else {
            println!("SKIP xattr comparison of {path}: getfattr (package attr) is not installed");
        }
    }
}

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
