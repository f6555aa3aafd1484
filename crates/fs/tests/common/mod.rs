//! Helpers for the file-system tests: scratch images made by mkfs.ext4, e2fsck, and a seed.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use blockdev::file::{FileDevice, FileOptions};
use blockdev::BlockDevice;
use fs::{Filesystem, ROOT_INO};

/// A scratch directory under the system temp dir, unique per process and call, removed on
/// drop.
pub struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("quill-fs-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch { dir }
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }
}

impl Drop for Scratch {
    /// Removes the directory, except under a failing test: its images are the evidence.
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept the failing test's files in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Whether `tool` is installed; prints a SKIP line for `test` when it is not.
pub fn have(tool: &str, test: &str) -> bool {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !found {
        println!("SKIP {test}: {tool} is not installed");
    }
    found
}

/// Whether every tool in `tools` is installed; prints a SKIP line naming the first missing.
pub fn have_tools(tools: &[&str]) -> bool {
    tools.iter().all(|tool| have(tool, "this test"))
}

/// Whether this machine can loop-mount ext4 images (root, mount, mkfs.ext4, e2fsck); prints a
/// SKIP line for `test` when it cannot.
pub fn can_loop_mount(test: &str) -> bool {
    if !have("mount", test) || !have("mkfs.ext4", test) || !have("e2fsck", test) {
        return false;
    }
    let root = Command::new("id").arg("-u").output().map(|o| o.stdout == b"0\n").unwrap_or(false);
    if !root {
        println!("SKIP {test}: loop mounts need root");
    }
    root
}

/// A kernel loop mount of an image at `dir`, unmounted on drop.
pub struct Mount {
    pub dir: PathBuf,
}

impl Mount {
    /// Loop-mounts `image` at `dir`; `None` (after a SKIP line) when the kernel refuses.
    pub fn new(image: &Path, dir: PathBuf) -> Option<Mount> {
        Mount::with_options(image, dir, "loop")
    }

    /// [`Mount::new`] with mount options `options` (which must include `loop`).
    pub fn with_options(image: &Path, dir: PathBuf, options: &str) -> Option<Mount> {
        std::fs::create_dir_all(&dir).unwrap();
        let out = loop_device_command("mount").args(["-o", options]).arg(image).arg(&dir).output();
        let out = out.unwrap();
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
            match loop_device_command("umount").arg(&self.dir).output() {
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

/// `tool` (mount or umount) under the machine-wide loop-device lock (shared with the crash
/// explorer's kernel images).
pub fn loop_device_command(tool: &str) -> Command {
    crashtest::kernel_fc::loop_device_command(tool)
}

/// Makes an ext4 image of `size` (mkfs.ext4 syntax) with extra mkfs options.
pub fn mkfs(image: &Path, size: &str, extra: &[&str]) {
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .args(extra)
        .arg(image)
        .arg(size)
        .output()
        .expect("run mkfs.ext4");
    assert!(out.status.success(), "mkfs.ext4 failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// Runs `program flag image` and returns (exit code, stdout then stderr).
fn run_on_image(program: &str, flag: &str, image: &Path) -> (i32, String) {
    let out = Command::new(program)
        .arg(flag)
        .arg(image)
        .output()
        .unwrap_or_else(|e| panic!("run {program} {flag}: {e}"));
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

/// Runs `e2fsck -fn` and returns (exit code, output).
pub fn e2fsck(image: &Path) -> (i32, String) {
    run_on_image("e2fsck", "-fn", image)
}

/// Runs `e2fsck -p` (boot-time preen: a full check only when the superblock asks for one) and
/// returns (exit code, output).
pub fn e2fsck_preen(image: &Path) -> (i32, String) {
    run_on_image("e2fsck", "-p", image)
}

/// `dumpe2fs -h`: the superblock and journal superblock, as e2fsprogs reads them.
pub fn dumpe2fs_header(image: &Path) -> String {
    run_on_image("dumpe2fs", "-h", image).1
}

#[allow(unused_imports)]
pub use crashtest::check::dumpe2fs_field;

/// The superblock's `s_state` on `dev` (VALID_FS, ERROR_FS).
pub fn superblock_state(dev: Arc<dyn BlockDevice>) -> u16 {
    fs::Ext4Image::open(dev).expect("open the image").superblock().state
}

/// Creates `name` in the root directory with `bytes` and fsyncs it; returns its inode.
pub fn create_fsynced(fs: &fs::Filesystem, name: &[u8], bytes: &[u8]) -> u32 {
    let ino = fs.create(fs::ROOT_INO, name, 0o644, 0, 0).expect("create").ino;
    fs.write(ino, 0, bytes).expect("write");
    fs.fsync(ino, false).expect("fsync");
    ino
}

/// The whole contents of inode `ino`.
pub fn read_all(fs: &fs::Filesystem, ino: u32) -> Result<Vec<u8>, fs::FsError> {
    let size = fs.getattr(ino)?.size as usize;
    let mut buf = vec![0u8; size];
    let n = fs.read(ino, 0, &mut buf)?;
    buf.truncate(n);
    Ok(buf)
}

/// Whether `got` is what a file whose candidate versions are `candidates` (oldest first, sizes
/// non-decreasing) may hold after a crash: a size from the oldest candidate's to the newest's,
/// and every byte one that some candidate long enough has there (later writes may have landed
/// in part, torn at any sector, but no byte is stale, zero or invented).
pub fn bytes_from(got: &[u8], candidates: &[Vec<u8>]) -> Result<(), String> {
    let min = candidates.first().map_or(0, |c| c.len());
    let max = candidates.iter().map(|c| c.len()).max().unwrap_or(0);
    if got.len() < min || got.len() > max {
        return Err(format!("size {} outside {min}..={max}", got.len()));
    }
    for (i, b) in got.iter().enumerate() {
        if !candidates.iter().any(|c| c.get(i) == Some(b)) {
            return Err(format!("byte {i} of {} is {b:#x}, which no version has there", got.len()));
        }
    }
    Ok(())
}

/// Asserts `e2fsck -fn` finds nothing; on failure keeps a copy of the image for inspection.
pub fn assert_fsck_clean(image: &Path) {
    let (code, text) = e2fsck(image);
    if code != 0 {
        let kept = std::env::temp_dir().join(format!("quill-failed-{}.img", std::process::id()));
        let _ = std::fs::copy(image, &kept);
        panic!(
            "e2fsck -fn found problems in {} (kept as {}):\n{text}",
            image.display(),
            kept.display()
        );
    }
}

pub fn open_device(image: &Path) -> Arc<dyn BlockDevice> {
    Arc::new(FileDevice::open(image, FileOptions::default()).expect("open image"))
}

/// The seed convention and generator of every randomized test.
#[allow(unused_imports)] // each test binary uses its own share of this module
pub use ondisk::testing::{seed, Rng};

/// Every entry of directory `dir`, read in batches of `batch` by following the cookies
/// (small batches exercise cookie resumption).
pub fn list_dir(fs: &fs::Filesystem, dir: u32, batch: usize) -> Vec<fs::DirEntry> {
    let mut entries = Vec::new();
    let mut cookie = 0;
    loop {
        let got = fs.readdir(dir, cookie, batch).expect("readdir");
        let Some(last) = got.last() else { return entries };
        cookie = last.next_cookie;
        entries.extend(got);
    }
}

/// What a crash legitimately leaves for e2fsck, as quill crashtest judges it.
#[allow(unused_imports)]
pub use crashtest::check::benign_fsck_line;

/// The lines of `e2fsck -fy` output `text` that are not [`benign_fsck_line`]s (a "Fix? yes"
/// answer belongs to the message before it).
pub fn unexpected_fsck_lines(text: &str) -> Vec<&str> {
    crashtest::check::unexpected_fsck_lines(text, &|_| false)
}

/// Whether `line` is e2fsck's note about the clock, never a problem of the image: e2fsck reads
/// the coarse clock (time(2)), which can lag the precise one quill stamped s_wtime with by a
/// tick, so a run right after an unmount may see the write time a second "in the future"
/// (and adds that it is by less than a day).
pub fn e2fsck_clock_line(line: &str) -> bool {
    line.starts_with("Superblock last write time is in the future")
        || line.contains("probably due to the hardware clock being incorrectly set")
}

/// Runs `e2fsck -fy` (repairing the image in place) and returns (exit code, output).
pub fn e2fsck_fix(image: &Path) -> (i32, String) {
    run_on_image("e2fsck", "-fy", image)
}

/// The first `n` lines of `text`.
pub fn head(text: &str, n: usize) -> String {
    text.lines().take(n).collect::<Vec<_>>().join("\n")
}

/// Runs `threads` copies of `work` (each given its index) on their own threads and returns
/// their results in index order. A watchdog: if they have not all finished within `limit`,
/// panics naming the ones still running (they are left behind; the test process ends with
/// them). A panic in a worker is re-raised here with its index.
pub fn run_watched<T, F>(threads: usize, limit: std::time::Duration, work: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(usize) -> T + Send + Sync + 'static,
{
    let work = Arc::new(work);
    let (tx, rx) = std::sync::mpsc::channel();
    for i in 0..threads {
        let (work, tx) = (work.clone(), tx.clone());
        std::thread::Builder::new()
            .name(format!("worker-{i}"))
            .spawn(move || {
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(i)));
                // Before reporting: once all have reported, what `work` holds is free again.
                drop(work);
                let _ = tx.send((i, result));
            })
            .expect("spawn a worker");
    }
    drop((tx, work));
    let deadline = std::time::Instant::now() + limit;
    let mut results: Vec<Option<T>> = (0..threads).map(|_| None).collect();
    for _ in 0..threads {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok((i, Ok(value))) => results[i] = Some(value),
            Ok((i, Err(payload))) => {
                let what = payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panic!("worker {i} panicked: {what}");
            }
            Err(_) => {
                let running: Vec<usize> = (0..threads).filter(|&i| results[i].is_none()).collect();
                panic!("workers {running:?} did not finish within {limit:?} (hang or deadlock)");
            }
        }
    }
    results.into_iter().map(|r| r.expect("every worker reported")).collect()
}

/// A count from environment variable `var`, else `default`.
pub fn env_count(var: &str, default: usize) -> usize {
    std::env::var(var).ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// Runs a `debugfs -w` script (one request a line) on `image`, returning its output; for
/// crafting images e2fsprogs can describe but mkfs cannot make.
pub fn debugfs_write(image: &Path, script: &str) -> String {
    use std::io::Write;
    let mut child = Command::new("debugfs")
        .args(["-w", "-f", "-"])
        .arg(image)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run debugfs");
    child.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "debugfs failed: {}", String::from_utf8_lossy(&out.stderr));
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// What both sides must agree on for one path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub kind: char,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub nlink: u32,
    pub contents: Vec<u8>,
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

/// Every path under the root (but lost+found) as quill reads it.
pub fn quill_tree(fs: &Filesystem) -> BTreeMap<String, Entry> {
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

/// Every path under the mount point `root` (but lost+found) as the kernel reads it.
pub fn kernel_tree(root: &Path) -> BTreeMap<String, Entry> {
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

/// getfattr (package `attr`) reads xattrs through the kernel; without it they are not compared.
fn have_getfattr() -> bool {
    Command::new("sh")
        .args(["-c", "command -v getfattr"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Asserts two trees agree: the same paths, and for each its kind, mode, owner, size, link
/// count, contents and (where getfattr is installed) user.* extended attributes.
pub fn compare(a: &BTreeMap<String, Entry>, b: &BTreeMap<String, Entry>) {
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

/// Runs util-linux `fallocate` with `args`, asserting it succeeds.
pub fn fallocate(args: &[&str]) {
    let out = Command::new("fallocate").args(args).output().unwrap();
    assert!(out.status.success(), "fallocate {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Where inode `ino`'s record starts in the image file (`i_block` is 0x28 bytes in).
pub fn inode_offset(image: &Path, ino: u32) -> u64 {
    let img = fs::Ext4Image::open(open_device(image)).unwrap();
    let sb = img.superblock();
    let (group, index) = ((ino - 1) / sb.inodes_per_group, (ino - 1) % sb.inodes_per_group);
    let table = img.group_descs()[group as usize].inode_table;
    table * u64::from(sb.block_size()) + u64::from(index) * u64::from(sb.inode_size)
}

/// Everything quill reads of the tree (each file whole, each symlink's target, each
/// directory listed), by path: what it read, or the error.
pub fn read_everything(fs: &Filesystem) -> BTreeMap<String, Result<Vec<u8>, String>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![(ROOT_INO, String::new())];
    while let Some((dir, path)) = todo.pop() {
        let mut cookie = 0;
        let mut names = Vec::new();
        loop {
            match fs.readdir(dir, cookie, 64) {
                Ok(batch) if batch.is_empty() => break,
                Ok(batch) => {
                    cookie = batch.last().unwrap().next_cookie;
                    names.extend(batch);
                }
                Err(e) => {
                    out.insert(format!("{path}/"), Err(e.to_string()));
                    break;
                }
            }
        }
        for e in names.iter().filter(|e| e.name != b"." && e.name != b"..") {
            let child = format!("{path}/{}", String::from_utf8_lossy(&e.name));
            match fs.getattr(e.ino) {
                Ok(attr) if attr.mode & 0o170000 == 0o040000 => todo.push((e.ino, child)),
                Ok(attr) if attr.mode & 0o170000 == 0o100000 => {
                    let mut buf = vec![0u8; attr.size as usize];
                    let read = fs.read(e.ino, 0, &mut buf).map(|_| buf);
                    out.insert(child, read.map_err(|e| e.to_string()));
                }
                Ok(attr) if attr.mode & 0o170000 == 0o120000 => {
                    out.insert(child, fs.readlink(e.ino).map_err(|e| e.to_string()));
                }
                Ok(_) => {}
                Err(err) => {
                    out.insert(child, Err(err.to_string()));
                }
            }
        }
    }
    out
}
