//! Support for the FUSE mount tests: preconditions (root, /dev/fuse, tools) with a SKIP line
//! when one is missing, mounts that are always unmounted (drop guards), the image lock the
//! daemon holds until the image is clean, kernel loop mounts, and tree manifests to compare
//! what two mounts show.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

// The helpers every CLI test shares (running quill and tools, mkfs.ext4); this module adds
// what mounts need, including a Scratch that never deletes through a live mount.
#[path = "../common/mod.rs"]
mod common;
#[allow(unused_imports)] // each test binary uses its own subset
pub use common::{mkfs as mkfs_ext4, quill, run, text};

/// A scratch directory removed on drop (after everything mounted in it is gone).
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("quill-mnt-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }

    /// A new empty directory in the scratch directory.
    pub fn dir(&self, name: &str) -> PathBuf {
        let dir = self.path(name);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Never recurse into a mount that is still there (a failed test's guard detached it,
        // but be sure): remove_dir_all would delete through it.
        if !mounted_under(&self.0) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Whether the FUSE tests can run here: root, /dev/fuse usable, and `tools` installed.
/// Prints `SKIP <test>: <reason>` when not.
pub fn ready(test: &str, tools: &[&str]) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIP {test}: needs root (FUSE mounts with default options, loop mounts)");
        return false;
    }
    if let Err(e) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse") {
        println!("SKIP {test}: /dev/fuse is not usable ({e})");
        return false;
    }
    for tool in ["fusermount3", "e2fsck", "mkfs.ext4"].iter().chain(tools) {
        let found = Command::new("sh")
            .arg("-c")
            .arg(format!("command -v {tool}"))
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !found {
            println!("SKIP {test}: {tool} is not installed");
            return false;
        }
    }
    true
}

/// Runs `cmd` and asserts it succeeded; returns its output.
pub fn ok(cmd: &mut Command) -> Output {
    let o = run(cmd);
    assert!(o.status.success(), "{cmd:?} failed ({}):\n{}", o.status, text(&o));
    o
}

/// A fresh image made by `quill mkfs` (4 KiB blocks).
pub fn quill_mkfs(image: &Path, size: &str) {
    ok(quill().arg("mkfs").arg(image).arg(size));
}

/// `e2fsck -fn` is clean, and the superblock says clean with no journal to replay.
pub fn assert_clean(image: &Path) {
    let o = run(Command::new("e2fsck").arg("-fn").arg(image));
    if o.status.code() != Some(0) {
        let kept =
            std::env::temp_dir().join(format!("quill-mount-failed-{}.img", std::process::id()));
        let _ = std::fs::copy(image, &kept);
        panic!(
            "e2fsck -fn {} is not clean (kept as {}):\n{}",
            image.display(),
            kept.display(),
            text(&o)
        );
    }
    let o = ok(Command::new("dumpe2fs").arg("-h").arg(image));
    let header = String::from_utf8_lossy(&o.stdout);
    assert!(
        !header.contains("needs_recovery"),
        "{} still needs recovery:\n{header}",
        image.display()
    );
    assert!(
        crashtest::check::dumpe2fs_field(&header, "Filesystem state") == "clean",
        "{} is not marked clean:\n{header}",
        image.display()
    );
}

/// The mount entry (source, fstype) at `dir` in this mount namespace, if any.
pub fn mount_entry(dir: &Path) -> Option<(String, String)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let want = dir.to_string_lossy();
    info.lines().rev().find_map(|line| {
        // id parent maj:min root mountpoint options... - fstype source superoptions
        let (left, right) = line.split_once(" - ")?;
        let mountpoint = left.split(' ').nth(4)?;
        if unescape(mountpoint) != want {
            return None;
        }
        let mut r = right.split(' ');
        let fstype = r.next()?.to_string();
        let source = unescape(r.next()?);
        Some((source, fstype))
    })
}

/// Whether anything is mounted at or below `dir`.
pub fn mounted_under(dir: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let want = dir.to_string_lossy().to_string();
    info.lines()
        .any(|line| line.split(' ').nth(4).map(|m| unescape(m).starts_with(&want)).unwrap_or(false))
}

/// mountinfo's octal escapes (\040 for a space, …).
fn unescape(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let digits = std::str::from_utf8(&bytes[i + 1..i + 4]).unwrap_or("");
            if let Ok(v) = u8::from_str_radix(digits, 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Polls `cond` every 20 ms until it holds or `limit` passes.
pub fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

/// Whether the image is locked (a quill mount process still holds it).
pub fn image_locked(image: &Path) -> bool {
    let file = File::open(image).expect("open image");
    // SAFETY: flock on a descriptor we own; the lock goes with the file.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) != 0 }
}

/// Waits until the quill process serving `image` is gone (it releases the image lock only
/// after the image is clean).
pub fn wait_released(image: &Path) {
    assert!(
        wait_for(Duration::from_secs(30), || !image_locked(image)),
        "the quill mount process still holds {} 30 s after unmount",
        image.display()
    );
}

/// A live quill FUSE mount; dropping it (a failed test) detaches the mount and kills the
/// process, so nothing stays mounted.
pub struct QuillMount {
    pub image: PathBuf,
    pub dir: PathBuf,
    /// The `-f` process (None for a daemon, which has no parent here).
    pub child: Option<Child>,
    stderr: Option<PathBuf>,
    finished: bool,
}

impl QuillMount {
    /// `quill mount -f [-o opts] image dir` in the background; returns once the mount is live.
    pub fn foreground(image: &Path, dir: &Path, opts: &str) -> QuillMount {
        let stderr = dir.with_extension("stderr");
        let mut cmd = quill();
        cmd.arg("mount").arg("-f");
        if !opts.is_empty() {
            cmd.arg("-o").arg(opts);
        }
        cmd.arg(image).arg(dir);
        cmd.stdin(Stdio::null()).stdout(Stdio::null());
        cmd.stderr(File::create(&stderr).unwrap());
        let child = cmd.spawn().expect("start quill mount -f");
        let mut mount = QuillMount {
            image: image.to_path_buf(),
            dir: dir.to_path_buf(),
            child: Some(child),
            stderr: Some(stderr),
            finished: false,
        };
        let live = wait_for(Duration::from_secs(30), || {
            mount_entry(dir).is_some() || mount.child_exited()
        });
        assert!(
            live && mount_entry(dir).is_some(),
            "quill mount -f did not mount: {}",
            mount.stderr_text()
        );
        mount
    }

    /// `quill mount [-o opts] image dir` (daemon); asserts it exits 0 with the mount live.
    pub fn daemon(image: &Path, dir: &Path, opts: &str) -> QuillMount {
        QuillMount::daemon_with_env(image, dir, opts, &[]).0
    }

    /// As [`QuillMount::daemon`], with `env` added to quill's environment; also returns what
    /// `quill mount` printed.
    pub fn daemon_with_env(
        image: &Path,
        dir: &Path,
        opts: &str,
        env: &[(&str, &str)],
    ) -> (QuillMount, Output) {
        let mut cmd = quill();
        cmd.arg("mount");
        if !opts.is_empty() {
            cmd.arg("-o").arg(opts);
        }
        cmd.envs(env.iter().copied());
        let o = run(cmd.arg(image).arg(dir).stdin(Stdio::null()));
        let mount = QuillMount {
            image: image.to_path_buf(),
            dir: dir.to_path_buf(),
            child: None,
            stderr: None,
            finished: !o.status.success(),
        };
        assert!(o.status.success(), "quill mount failed ({}): {}", o.status, text(&o));
        assert!(
            mount_entry(dir).is_some(),
            "quill mount exited 0 but {} is not mounted",
            dir.display()
        );
        (mount, o)
    }

    /// Adopts a mount made some other way (the mount helper), served by a daemon.
    pub fn adopt(image: &Path, dir: &Path) -> QuillMount {
        QuillMount {
            image: image.to_path_buf(),
            dir: dir.to_path_buf(),
            child: None,
            stderr: None,
            finished: false,
        }
    }

    fn child_exited(&mut self) -> bool {
        self.child.as_mut().map(|c| c.try_wait().ok().flatten().is_some()).unwrap_or(false)
    }

    pub fn stderr_text(&self) -> String {
        self.stderr.as_ref().and_then(|p| std::fs::read_to_string(p).ok()).unwrap_or_default()
    }

    /// Unmounts with `umount` and waits for the quill process to finish; asserts it exited 0
    /// (for `-f`) and released the image, with nothing on stderr.
    pub fn unmount(mut self) {
        if let Err(err) = umount(&self.dir) {
            panic!("{err}");
        }
        self.wait_exit();
    }

    /// Waits for the serving process to end after an unmount that happened elsewhere.
    pub fn wait_exit(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let start = Instant::now();
            let status = loop {
                if let Some(status) = child.try_wait().unwrap() {
                    break status;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(30),
                    "quill mount -f still runs 30 s after unmount"
                );
                std::thread::sleep(Duration::from_millis(20));
            };
            let stderr = self.stderr_text();
            assert!(status.success(), "quill mount -f exited with {status}: {stderr}");
            assert!(stderr.is_empty(), "quill mount -f wrote to stderr: {stderr}");
        }
        wait_released(&self.image);
        self.finished = true;
    }

    /// SIGKILLs the `-f` process (a crash) and detaches its dead mount.
    pub fn kill9(mut self) {
        let child = self.child.as_mut().expect("kill9 needs a -f mount");
        child.kill().unwrap();
        child.wait().unwrap();
        ok(Command::new("fusermount3").arg("-uz").arg(&self.dir));
        self.finished = true;
    }

    /// The pid of the process serving this mount.
    pub fn pid(&self) -> u32 {
        if let Some(child) = &self.child {
            return child.id();
        }
        daemon_pid(&self.dir).expect("find the quill daemon")
    }
}

impl Drop for QuillMount {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let _ = Command::new("fusermount3").arg("-uz").arg(&self.dir).output();
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        } else if let Some(pid) = daemon_pid(&self.dir) {
            // SAFETY: signalling a process by id.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    }
}

/// How long [`umount`] waits out "target is busy"; a fork child holds its copies for
/// microseconds to milliseconds, so a refusal this long is a file really left open.
pub const UMOUNT_BUSY_WAIT: Duration = Duration::from_secs(5);

/// `umount DIR`, waiting out a transient "target is busy". A test binary runs its tests on
/// parallel threads, and they spawn tools: a child forked while another thread has a file
/// open on a mount holds a copy of that file (its copy of the descriptor table) until it
/// execs, and the kernel refuses to unmount while the copy exists, though the test closed its
/// file before calling umount. A refusal that outlasts [`UMOUNT_BUSY_WAIT`] is an error naming
/// the processes that hold files under `dir`.
pub fn umount(dir: &Path) -> Result<(), String> {
    let start = Instant::now();
    loop {
        let o = run(Command::new("umount").arg(dir));
        if o.status.success() {
            return Ok(());
        }
        let busy = text(&o).contains("target is busy");
        if !busy || start.elapsed() > UMOUNT_BUSY_WAIT {
            return Err(format!(
                "umount {} failed ({}): {}; processes using it: {:?}",
                dir.display(),
                o.status,
                text(&o).trim(),
                users_of(dir)
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The processes (pid, command name) with an open file, working directory or root under `dir`.
pub fn users_of(dir: &Path) -> Vec<(u32, String)> {
    let under = |link: PathBuf| std::fs::read_link(link).is_ok_and(|p| p.starts_with(dir));
    let mut users = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let proc_dir = entry.path();
        let fds = std::fs::read_dir(proc_dir.join("fd")).into_iter().flatten().flatten();
        let uses = under(proc_dir.join("cwd"))
            || under(proc_dir.join("root"))
            || fds.into_iter().any(|fd| under(fd.path()));
        if uses {
            let comm = std::fs::read_to_string(proc_dir.join("comm")).unwrap_or_default();
            users.push((pid, comm.trim().to_string()));
        }
    }
    users
}

/// Makes this test process the reaper of its orphaned descendants (PR_SET_CHILD_SUBREAPER): a
/// quill daemon, whose parent exits once it has mounted, then becomes this process's child
/// instead of PID 1's, so a test sees (and must reap) what a daemon leaves when it exits, and
/// what `quill mount` itself failed to reap shows up as a zombie child of the test.
pub fn become_subreaper() {
    // SAFETY: prctl with integer arguments.
    let r = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    assert_eq!(r, 0, "PR_SET_CHILD_SUBREAPER: {}", std::io::Error::last_os_error());
}

/// The zombie (defunct) children of process `parent`, as (pid, command name).
pub fn zombie_children(parent: u32) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // pid (comm) state ppid ...: comm may hold spaces and parentheses, so split at the
        // last ')'.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else { continue };
        let mut rest = stat[close + 1..].split_whitespace();
        let (Some(state), Some(ppid)) = (rest.next(), rest.next()) else { continue };
        if state == "Z" && ppid.parse::<u32>() == Ok(parent) {
            found.push((pid, stat[open + 1..close].to_string()));
        }
    }
    found
}

/// Waits up to 30 s for child `pid` (a daemon this subreaper adopted) to exit, reaps it and
/// returns its exit code (`None` if a signal killed it).
pub fn reap(pid: u32) -> Option<i32> {
    let start = Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: waiting for a child of this process, without blocking.
        let r = unsafe { libc::waitpid(pid as i32, &mut status, libc::WNOHANG) };
        assert!(r >= 0, "waitpid({pid}): {}", std::io::Error::last_os_error());
        if r == pid as i32 {
            return libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
        }
        assert!(start.elapsed() < Duration::from_secs(30), "process {pid} still runs after 30 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The pid of a `quill mount`/`mount.quill` process whose arguments name `dir`.
pub fn daemon_pid(dir: &Path) -> Option<u32> {
    let want = dir.as_os_str().as_bytes();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_quill = args
            .first()
            .map(|a| a.ends_with(b"quill") || a.ends_with(b"mount.quill"))
            .unwrap_or(false);
        // The daemon canonicalized nothing in its argv: match the path as passed.
        if is_quill && args.contains(&want) {
            let status = std::fs::read_to_string(entry.path().join("status")).unwrap_or_default();
            if !status.contains("State:\tZ") {
                return Some(pid);
            }
        }
    }
    None
}

/// A kernel loop mount of an image (read-only unless made by `read_write`), unmounted on drop.
pub struct LoopMount {
    pub dir: PathBuf,
}

impl LoopMount {
    pub fn new(image: &Path, dir: &Path) -> LoopMount {
        ok(Command::new("mount").args(["-t", "ext4", "-o", "loop,ro,noload"]).arg(image).arg(dir));
        LoopMount { dir: dir.to_path_buf() }
    }

    /// A read-write kernel mount with extra options (`opts` may be empty), to compare what
    /// the kernel's ext4 does with what quill does.
    pub fn read_write(image: &Path, dir: &Path, opts: &str) -> LoopMount {
        let opts = if opts.is_empty() { "loop".to_string() } else { format!("loop,{opts}") };
        ok(Command::new("mount").args(["-t", "ext4", "-o", &opts]).arg(image).arg(dir));
        LoopMount { dir: dir.to_path_buf() }
    }
}

impl Drop for LoopMount {
    fn drop(&mut self) {
        let o = run(Command::new("umount").arg(&self.dir));
        if !o.status.success() {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).output();
        }
    }
}

/// FNV-1a, 64 bits: enough to tell file contents apart in a manifest.
pub fn fnv(data: &[u8]) -> u64 {
    data.iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3))
}

/// Every entry under `root` (relative path → type, mode, owner, size, link count, mtime,
/// symlink target or content hash, extended attributes), for comparing what two mounts of the
/// same image show.
pub fn manifest(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        let meta = std::fs::symlink_metadata(&path).unwrap();
        let rel = path.strip_prefix(root).unwrap().to_string_lossy().into_owned();
        let ft = meta.file_type();
        let what = if ft.is_symlink() {
            format!("-> {}", std::fs::read_link(&path).unwrap().display())
        } else if ft.is_file() {
            format!("fnv {:016x}", fnv(&std::fs::read(&path).unwrap()))
        } else {
            String::new()
        };
        let line = format!(
            "mode {:o} uid {} gid {} size {} nlink {} mtime {}.{:09} rdev {:x} {} xattrs [{}]",
            meta.mode(),
            meta.uid(),
            meta.gid(),
            meta.size(),
            meta.nlink(),
            meta.mtime(),
            meta.mtime_nsec(),
            meta.rdev(),
            what,
            xattrs(&path)
        );
        out.insert(rel, line);
        if ft.is_dir() {
            walk(root, &path, out);
        }
    }
}

/// `name=fnv(value)` for each extended attribute of `path` (not following symlinks).
pub fn xattrs(path: &Path) -> String {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut names = vec![0u8; 65536];
    // SAFETY: buffers sized as passed.
    let n = unsafe { libc::llistxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    if n <= 0 {
        return String::new();
    }
    let mut parts = Vec::new();
    for name in names[..n as usize].split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let cname = CString::new(name).unwrap();
        let mut value = vec![0u8; 65536];
        // SAFETY: as above.
        let len = unsafe {
            libc::lgetxattr(c.as_ptr(), cname.as_ptr(), value.as_mut_ptr().cast(), value.len())
        };
        let hash = if len >= 0 { fnv(&value[..len as usize]) } else { 0 };
        parts.push(format!("{}={hash:x}", String::from_utf8_lossy(name)));
    }
    parts.sort();
    parts.join(",")
}

/// Asserts two manifests are equal, naming the first entries that differ.
pub fn assert_same_tree(what: &str, a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) {
    if a == b {
        return;
    }
    let mut diffs = Vec::new();
    for key in a.keys().chain(b.keys()).collect::<std::collections::BTreeSet<_>>() {
        if a.get(key) != b.get(key) {
            diffs.push(format!("  {key}:\n    {:?}\n    {:?}", a.get(key), b.get(key)));
        }
    }
    let shown: Vec<_> = diffs.iter().take(20).cloned().collect();
    panic!("{what}: {} entries differ:\n{}", diffs.len(), shown.join("\n"));
}

/// The image's bytes, hashed (to show a failed mount left it untouched).
pub fn image_hash(image: &Path) -> u64 {
    fnv(&std::fs::read(image).unwrap())
}

/// `diff -r` of two trees; asserts they are the same.
pub fn assert_diff_clean(a: &Path, b: &Path) {
    let o = run(Command::new("diff").arg("-r").arg("--no-dereference").arg(a).arg(b));
    assert!(o.status.success(), "diff -r {} {}:\n{}", a.display(), b.display(), text(&o));
}
