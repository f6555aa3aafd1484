//! Crash images made by the kernel with fast commits (`quill crashtest --kernel-fast-commit N`).
//!
//! Each workload (a single-thread ACE one from [`crate::workload::ace`]) runs on a kernel loop
//! mount of a fresh `mkfs.ext4 -O fast_commit` image, with a commit interval of ten minutes, so
//! what makes changes durable is the workload's own fsync and fdatasync (fast commits, or a
//! full commit where the kernel finds the change ineligible) and sync (`syncfs`, a full
//! commit). The setup runs first and is committed with `syncfs`. After every persistence
//! operation returns, and after the last operation, the backing file is copied while still
//! mounted: a crash image at a point where every operation so far was acknowledged.
//!
//! Every crash image is checked; the names count into the explorer's [`Totals`]:
//!
//! | check                     | what                                                                 |
//! |---------------------------|----------------------------------------------------------------------|
//! | kernel-fc-recovers        | quill opens a copy read-write (full commits, then fast commits replayed) and reads its tree |
//! | kernel-fc-acknowledged    | that tree passes [`check_acknowledged`] with every operation up to the copy acknowledged, allowing what ext4's data=ordered shows of unacknowledged writes ([`Ext4Ordered`]) |
//! | kernel-fc-unmount         | quill unmounts it                                                    |
//! | kernel-fc-e2fsck-fn       | stock `e2fsck -fn` finds quill's image clean                          |
//! | kernel-fc-same-tree       | stock `e2fsck -fy` on another copy reaches quill's tree              |
//!
//! Two outcomes are counted apart ([`Totals::noted`]) and printed, not failed:
//! **kernel-fc-refused**, quill refusing by name a fast-commit record it does not replay yet
//! (the refusal the project's rules ask for; it is no pass either), and
//! **kernel-fc-e2fsck-differs**, e2fsck's tree differing from quill's (or e2fsck -fy left
//! errors; the note says whether e2fsck's tree keeps what was acknowledged): e2fsck 1.47.0
//! mishandles some fast-commit replays (a directory made in a fast
//! commit, the link an UNLINK drops, a new file in a reused inode; see
//! crates/fs/tests/fast_commit_replay.rs).
//!
//! Workloads alternate 1 KiB and 4 KiB blocks; one whose xattrs need more room than a 1 KiB
//! xattr block gives runs at 4 KiB (the model allows what fits in 4 KiB), and the next one that
//! fits takes its turn at 1 KiB.
//!
//! The negative control (`lying` in [`KernelOptions`]) copies each image *before* its
//! persistence operation while the checks still take that operation as acknowledged; the
//! acknowledged check must then fail.
//!
//! Needs root, loop devices, mkfs.ext4 and e2fsck: [`unavailable`] says why not. Loop devices
//! are set up and torn down under the same machine-wide lock the tests use
//! (`$TMPDIR/quill-loop-mount.lock`, with util-linux `flock`).

use std::ffi::{CString, OsStr};
use std::fs::{DirBuilder, File, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use blockdev::file::{FileDevice, FileOptions};
use fs::{Filesystem, MountOptions};

use crate::check::Unacknowledged::Ext4Ordered;
use crate::check::{check_acknowledged, e2fsck_clean, run_tool, FsyncPromise};
use crate::explore::{read_only_tree, workload_seed, Failure, Scratch, Totals};
use crate::run::{end_mark, start_mark, Expected};
use crate::tree::{read_tree, tree_difference};
use crate::workload::{
    ace, pattern, symlink_target, tag, xattr_value, Config, Op, Workload, SETUP,
};

/// The image size: small, because each crash image is copied twice (the crash copy, and
/// quill's copy of it).
pub const IMAGE_SIZE: &str = "32M";

/// Xattr bytes (values plus 32 per name) an inode may need for its workload to run at 1 KiB
/// blocks: a 1 KiB xattr block holds about 950 bytes of entries and values.
const XATTR_BYTES_1K_MAX: usize = 800;

/// The refusal quill's fast-commit replay gives for a record it cannot replay.
const REFUSAL: &str = "not replayed yet";

#[derive(Debug, Clone)]
pub struct KernelOptions {
    pub workloads: usize,
    pub seed: u64,
    /// Stop after this many failing workloads.
    pub max_failures: usize,
    /// The negative control: copy each image before its persistence operation.
    pub lying: bool,
}

/// Why kernel-made images cannot be had on this machine, or None when they can.
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("loop mounts need root".into());
    }
    for tool in ["mkfs.ext4", "mount", "umount", "e2fsck", "cp"] {
        let found = Command::new("sh").arg("-c").arg(format!("command -v {tool}")).output();
        if !found.is_ok_and(|o| o.status.success()) {
            return Some(format!("{tool} is not installed"));
        }
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("no loop devices (/dev/loop-control is missing)".into());
    }
    let scratch = Scratch::new("kernel-fc-probe");
    let image = scratch.path("probe.img");
    if let Err(e) = mkfs(&image, 4096) {
        return Some(e);
    }
    match Mount::new(&image, scratch.path("mnt")) {
        Ok(mount) => mount.unmount().err(),
        Err(e) => Some(e),
    }
}

/// Runs `opts.workloads` workloads on the kernel and checks their crash images.
pub fn explore_kernel(opts: &KernelOptions) -> Totals {
    let started = Instant::now();
    let mut totals = Totals::default();
    for name in ["kernel-fc-refused", "kernel-fc-e2fsck-differs"] {
        totals.noted.insert(name, 0);
    }
    let scratch = Scratch::new("kernel-fc");
    let mut failed = 0;
    let mut small_next = true;
    for k in 0..opts.workloads {
        if failed >= opts.max_failures {
            break;
        }
        let w = ace(workload_seed(opts.seed, k), Config::default());
        let t = kernel_workload(&w, k, &mut small_next, opts, &scratch);
        failed += usize::from(!t.failures.is_empty());
        totals.add(t);
    }
    totals.seconds = started.elapsed().as_secs_f64();
    totals
}

/// Runs workload `w` (the `k`-th) on the kernel and checks its crash images; stops at the
/// first failure. It runs at 1 KiB blocks when `small_next` is set and its xattrs fit (then
/// `small_next` is cleared), at 4 KiB otherwise (then `small_next` is set).
fn kernel_workload(
    w: &Workload,
    k: usize,
    small_next: &mut bool,
    opts: &KernelOptions,
    scratch: &Scratch,
) -> Totals {
    let mut totals = Totals { workloads: 1, operations: w.ops() as u64, ..Totals::default() };
    let expected = match Expected::of(w) {
        Ok(expected) => expected,
        Err(e) => return failed(totals, w, "kernel-fc-workload-runs", e),
    };
    let small = *small_next && fits_1k_blocks(&expected);
    *small_next = !small;
    let block_size = if small { 1024 } else { 4096 };
    let place = |i: Option<usize>| {
        let at = match i {
            Some(i) => format!("after op {i} ({})", w.threads[0][i]),
            None => "before the first op".into(),
        };
        format!(
            "kernel fast-commit image, {} KiB blocks, {at}{}; rerun with quill crashtest \
             --images 0 --kernel-fast-commit {} --seed {}",
            block_size / 1024,
            if opts.lying { " (negative control)" } else { "" },
            k + 1,
            opts.seed
        )
    };
    let images = match kernel_images(w, block_size, opts.lying, scratch) {
        Ok(images) => images,
        Err(e) => return failed(totals, w, "kernel-fc-workload-runs", e),
    };
    for (acknowledged, image) in &images {
        totals.images += 1;
        *totals.kinds.entry(format!("kernel-fc-{}k", block_size / 1024)).or_default() += 1;
        let marks: Vec<u64> = (0..acknowledged.map_or(0, |i| i + 1))
            .flat_map(|i| [start_mark(0, i), end_mark(0, i)])
            .collect();
        let checked = check_kernel_image(w, &expected, &marks, image, scratch, &mut totals);
        match checked {
            Ok(None) => {}
            Ok(Some((noted, why))) => {
                *totals.noted.entry(noted).or_default() += 1;
                let seed = w.seed;
                let at = place(*acknowledged);
                totals
                    .notes
                    .push(format!("{noted}: workload {} (seed {seed}), {at}: {why}", w.name));
            }
            Err((check, message)) => {
                let message = format!("{}\n{message}", place(*acknowledged));
                return failed(totals, w, check, message);
            }
        }
    }
    totals
}

fn failed(mut totals: Totals, w: &Workload, check: &'static str, message: String) -> Totals {
    let failure = Failure { workload: w.clone(), state: None, check, message, recording: None };
    totals.failures.push(failure);
    totals
}

/// Whether every inode's xattrs, in every state, fit a 1 KiB block's room.
fn fits_1k_blocks(expected: &Expected) -> bool {
    expected.states.iter().flatten().flat_map(|m| &m.inodes).all(|inode| {
        inode.xattrs.values().map(|v| v.len() + 32).sum::<usize>() <= XATTR_BYTES_1K_MAX
    })
}

/// Runs `w` on a fresh kernel mount; returns its crash images, each with the last operation
/// acknowledged before it was copied (None: none).
fn kernel_images(
    w: &Workload,
    block_size: u32,
    lying: bool,
    scratch: &Scratch,
) -> Result<Vec<(Option<usize>, PathBuf)>, String> {
    assert_eq!(w.threads.len(), 1, "kernel workloads are single-thread ones");
    let live = scratch.path("live.img");
    mkfs(&live, block_size)?;
    let mount = Mount::new(&live, scratch.path("mnt"))?;
    let ran = kernel_images_run(w, &live, &mount.dir, lying, scratch);
    let unmounted = mount.unmount();
    let images = ran?;
    unmounted?;
    Ok(images)
}

/// [`kernel_images`] on the mounted file system at `dir`, whose backing file is `live`.
fn kernel_images_run(
    w: &Workload,
    live: &Path,
    dir: &Path,
    lying: bool,
    scratch: &Scratch,
) -> Result<Vec<(Option<usize>, PathBuf)>, String> {
    for (k, op) in w.setup.iter().enumerate() {
        exec(dir, op, tag(SETUP, k)).map_err(|e| format!("setup: {e}"))?;
    }
    exec(dir, &Op::Sync, 0).map_err(|e| format!("setup: {e}"))?;
    let mut images = Vec::new();
    let mut copy = |acknowledged: Option<usize>| -> Result<(), String> {
        let image = scratch.path(&format!("crash-{}.img", images.len()));
        copy_sparse(live, &image)?;
        images.push((acknowledged, image));
        Ok(())
    };
    let ops = &w.threads[0];
    for (i, op) in ops.iter().enumerate() {
        if lying && op.is_persistence() {
            copy(Some(i))?;
        }
        exec(dir, op, tag(0, i)).map_err(|e| format!("op {i}: {e}"))?;
        if !lying && op.is_persistence() {
            copy(Some(i))?;
        }
    }
    if !ops.last().is_some_and(Op::is_persistence) {
        copy(ops.len().checked_sub(1))?;
    }
    Ok(images)
}

/// One crash image's checks. Ok(Some((name, why))): an outcome counted apart
/// ([`Totals::noted`]); Err((check, why)): a failure.
fn check_kernel_image(
    w: &Workload,
    expected: &Expected,
    marks: &[u64],
    image: &Path,
    scratch: &Scratch,
    totals: &mut Totals,
) -> Result<Option<(&'static str, String)>, (&'static str, String)> {
    let mut pass = |name: &'static str| *totals.passed.entry(name).or_default() += 1;
    let ours = scratch.path("quill.img");
    copy_sparse(image, &ours).map_err(|e| ("kernel-fc-recovers", e))?;
    let device = FileDevice::open(&ours, FileOptions::default())
        .map_err(|e| ("kernel-fc-recovers", format!("open {}: {e}", ours.display())))?;
    let fs = match Filesystem::open(Arc::new(device), MountOptions::default()) {
        Ok(fs) => fs,
        Err(e) if e.to_string().contains(REFUSAL) => {
            return Ok(Some(("kernel-fc-refused", e.to_string())));
        }
        Err(e) => return Err(("kernel-fc-recovers", format!("quill cannot open it: {e}"))),
    };
    let tree = read_tree(&fs).map_err(|e| ("kernel-fc-recovers", e))?;
    pass("kernel-fc-recovers");
    let acknowledged =
        check_acknowledged(w, expected, marks, &tree, Ext4Ordered, FsyncPromise::Ext4Kernel);
    let unmounted = fs.unmount();
    acknowledged.map_err(|e| ("kernel-fc-acknowledged", e))?;
    pass("kernel-fc-acknowledged");
    unmounted.map_err(|e| ("kernel-fc-unmount", format!("unmount after recovery: {e}")))?;
    pass("kernel-fc-unmount");
    e2fsck_clean(&ours)
        .map_err(|e| ("kernel-fc-e2fsck-fn", format!("after quill's recovery: {e}")))?;
    pass("kernel-fc-e2fsck-fn");

    // The crash image itself is e2fsck's: quill worked on its own copy, and nothing reads
    // the image after this check.
    let theirs = image;
    let (code, text) = run_tool(Command::new("e2fsck").arg("-fy").arg(theirs))
        .map_err(|e| ("kernel-fc-same-tree", e))?;
    if code > 1 {
        let last = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
        return Ok(Some(("kernel-fc-e2fsck-differs", format!("e2fsck -fy exits {code}: {last}"))));
    }
    let repaired = std::fs::read(theirs).map_err(|e| ("kernel-fc-same-tree", e.to_string()))?;
    let their_tree = read_only_tree(repaired, &MountOptions::default())
        .map_err(|e| ("kernel-fc-same-tree", e))?;
    match tree_difference(&tree, &their_tree) {
        None => {
            pass("kernel-fc-same-tree");
            Ok(None)
        }
        Some(d) => {
            // Which of the two is wrong: quill's tree passed; e2fsck's is judged the same way.
            let theirs = check_acknowledged(
                w,
                expected,
                marks,
                &their_tree,
                Ext4Ordered,
                FsyncPromise::Ext4Kernel,
            )
            .map_or_else(
                |e| format!("e2fsck's tree loses what was acknowledged: {e}"),
                |()| "both keep what was acknowledged".into(),
            );
            Ok(Some(("kernel-fc-e2fsck-differs", format!("quill vs e2fsck -fy: {d} ({theirs})"))))
        }
    }
}

fn mkfs(image: &Path, block_size: u32) -> Result<(), String> {
    let _ = std::fs::remove_file(image);
    let (code, text) = run_tool(
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-O", "fast_commit", "-b", &block_size.to_string()])
            .arg(image)
            .arg(IMAGE_SIZE),
    )?;
    if code != 0 {
        return Err(format!("mkfs.ext4 exits {code}: {}", text.trim()));
    }
    Ok(())
}

fn copy_sparse(from: &Path, to: &Path) -> Result<(), String> {
    let (code, text) = run_tool(Command::new("cp").arg("--sparse=always").arg(from).arg(to))?;
    if code != 0 {
        return Err(format!("cp {}: {}", from.display(), text.trim()));
    }
    Ok(())
}

/// `tool` (mount or umount) under the machine-wide loop-device lock (util-linux `flock`, when
/// installed): loop devices set up at once by several processes (tests, crashtest) were seen to
/// show one image at another's mount point, so they are set up and torn down one at a time.
pub fn loop_device_command(tool: &str) -> Command {
    static HAVE_FLOCK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let lock = std::env::temp_dir().join("quill-loop-mount.lock");
    let have_flock = *HAVE_FLOCK.get_or_init(|| {
        let found = Command::new("sh").args(["-c", "command -v flock"]).output();
        found.is_ok_and(|o| o.status.success())
    });
    if have_flock {
        let mut command = Command::new("flock");
        command.arg(lock).arg(tool);
        command
    } else {
        Command::new(tool)
    }
}

/// A kernel loop mount with a ten-minute commit interval; [`Mount::unmount`] (or drop)
/// unmounts it.
pub(crate) struct Mount {
    dir: PathBuf,
    mounted: bool,
}

impl Mount {
    pub(crate) fn new(image: &Path, dir: PathBuf) -> Result<Mount, String> {
        std::fs::create_dir_all(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        let (code, text) = run_tool(
            loop_device_command("mount").args(["-o", "loop,commit=600"]).arg(image).arg(&dir),
        )?;
        if code != 0 {
            return Err(format!("loop mount failed: {}", text.trim()));
        }
        Ok(Mount { dir, mounted: true })
    }

    /// Unmounts, trying a few times ("target is busy" can be transient).
    pub(crate) fn unmount(mut self) -> Result<(), String> {
        self.umount()
    }

    fn umount(&mut self) -> Result<(), String> {
        let mut last_error = String::new();
        for _ in 0..10 {
            match run_tool(loop_device_command("umount").arg(&self.dir)) {
                Ok((0, _)) => {
                    self.mounted = false;
                    return Ok(());
                }
                Ok((_, text)) => last_error = text.trim().to_string(),
                Err(e) => last_error = e,
            }
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
        Err(format!("umount {}: {last_error}", self.dir.display()))
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.mounted {
            let _ = self.umount();
        }
    }
}

fn c_path(path: &Path) -> Result<CString, String> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| format!("{}: a NUL", path.display()))
}

fn last_os_error(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

/// Runs one operation on the mounted file system at `root` as a program would, with the
/// semantics of [`crate::run::exec`] (which runs it through quill): files opened around data
/// operations and closed after; new files 0644 and directories 0755 whatever the umask; the
/// fsync of a symlink fsyncs its directory;
/// `sync` is `syncfs` of this file system only (a global sync would also write back the
/// images other processes are copying).
pub fn exec(root: &Path, op: &Op, tag: u64) -> Result<(), String> {
    let at = |p: &str| if p.is_empty() { root.to_path_buf() } else { root.join(p) };
    let io = |e: std::io::Error| format!("{op}: {e}");
    let chmod = |p: &Path, mode: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).map_err(io)
    };
    let open_rw = |p: &str| OpenOptions::new().write(true).open(at(p)).map_err(io);
    // A symlink cannot be opened to be fsynced: its directory is (ext4 commits every change
    // queued so far whichever inode is fsynced, so the symlink's creation goes with it).
    let syncable = |p: &str| -> Result<PathBuf, String> {
        let is_symlink = std::fs::symlink_metadata(at(p)).map_err(io)?.file_type().is_symlink();
        Ok(if is_symlink { at(crate::model::split(p).0) } else { at(p) })
    };
    match op {
        Op::Creat(p) => {
            OpenOptions::new().write(true).create_new(true).mode(0o644).open(at(p)).map_err(io)?;
            chmod(&at(p), 0o644)
        }
        Op::Mkdir(p) => {
            DirBuilder::new().mode(0o755).create(at(p)).map_err(io)?;
            chmod(&at(p), 0o755)
        }
        Op::Rmdir(p) => std::fs::remove_dir(at(p)).map_err(io),
        Op::Unlink(p) => std::fs::remove_file(at(p)).map_err(io),
        Op::Link { from, to } => std::fs::hard_link(at(from), at(to)).map_err(io),
        Op::Rename { from, to, whiteout: false } => std::fs::rename(at(from), at(to)).map_err(io),
        Op::Rename { from, to, whiteout: true } => {
            let c = |p: &str| std::ffi::CString::new(at(p).into_os_string().into_encoded_bytes());
            let (from, to) =
                (c(from).map_err(|e| e.to_string())?, c(to).map_err(|e| e.to_string())?);
            // SAFETY: renameat2 with NUL-terminated paths owned here.
            let r = unsafe {
                libc::renameat2(
                    libc::AT_FDCWD,
                    from.as_ptr(),
                    libc::AT_FDCWD,
                    to.as_ptr(),
                    libc::RENAME_WHITEOUT,
                )
            };
            if r == 0 {
                Ok(())
            } else {
                Err(io(std::io::Error::last_os_error()))
            }
        }
        Op::Write { path, offset, len } => {
            open_rw(path)?.write_all_at(&pattern(tag, *offset, *len), *offset).map_err(io)
        }
        Op::Falloc { path, offset, len, keep_size, zero } => {
            let file = open_rw(path)?;
            let mode = if *keep_size { libc::FALLOC_FL_KEEP_SIZE } else { 0 }
                | if *zero { libc::FALLOC_FL_ZERO_RANGE } else { 0 };
            let (offset, len) = (*offset as libc::off_t, *len as libc::off_t);
            // SAFETY: the descriptor is open for the call's duration.
            if unsafe { libc::fallocate(file.as_raw_fd(), mode, offset, len) } != 0 {
                return Err(last_os_error(&op.to_string()));
            }
            Ok(())
        }
        Op::Truncate { path, size } => open_rw(path)?.set_len(*size).map_err(io),
        Op::Symlink { path, len } => {
            let target = symlink_target(tag, *len);
            std::os::unix::fs::symlink(OsStr::from_bytes(&target), at(path)).map_err(io)
        }
        Op::SetXattr { path, name, len } => {
            let value = xattr_value(tag, *len);
            let (p, n) =
                (c_path(&at(path))?, CString::new(name.as_str()).map_err(|e| e.to_string())?);
            // SAFETY: both strings are NUL-terminated and the value outlives the call.
            let rc = unsafe {
                libc::setxattr(p.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), 0)
            };
            if rc != 0 {
                return Err(last_os_error(&op.to_string()));
            }
            Ok(())
        }
        Op::RemoveXattr { path, name } => {
            let (p, n) =
                (c_path(&at(path))?, CString::new(name.as_str()).map_err(|e| e.to_string())?);
            // SAFETY: both strings are NUL-terminated.
            if unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) } != 0 {
                return Err(last_os_error(&op.to_string()));
            }
            Ok(())
        }
        Op::Fsync(p) => File::open(syncable(p)?).and_then(|f| f.sync_all()).map_err(io),
        Op::Fdatasync(p) => File::open(syncable(p)?).and_then(|f| f.sync_data()).map_err(io),
        Op::Sync => {
            let dir = File::open(root).map_err(io)?;
            // SAFETY: the descriptor is open for the call's duration.
            if unsafe { libc::syncfs(dir.as_raw_fd()) } != 0 {
                return Err(last_os_error("syncfs"));
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_xattrs_move_a_workload_to_4k_blocks() {
        let mut w = ace(1, Config::default());
        w.setup = vec![Op::Creat("foo".into())];
        w.threads =
            vec![vec![Op::SetXattr { path: "foo".into(), name: "user.q0".into(), len: 100 }]];
        assert!(fits_1k_blocks(&Expected::of(&w).unwrap()));
        w.threads[0].push(Op::SetXattr { path: "foo".into(), name: "user.q1".into(), len: 900 });
        assert!(!fits_1k_blocks(&Expected::of(&w).unwrap()));
    }

    #[test]
    fn the_executor_leaves_the_models_tree() {
        let scratch = Scratch::new("kernel-fc-exec");
        let root = scratch.path("root");
        std::fs::create_dir(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        for k in 0..40 {
            let w = ace(workload_seed(7, k), Config::default());
            let dir = root.join(format!("w{k}"));
            DirBuilder::new().mode(0o755).create(&dir).unwrap();
            for (i, op) in w.setup.iter().enumerate() {
                exec(&dir, op, tag(SETUP, i)).unwrap();
            }
            let mut no_zero_range = false;
            for (i, op) in w.threads[0].iter().enumerate() {
                let r = exec(&dir, op, tag(0, i));
                // tmpfs may not take user xattrs, nor FALLOC_FL_ZERO_RANGE (the workload then
                // cannot reach the model's tree); everything else must run.
                if let Err(e) = r {
                    if matches!(op, Op::Falloc { zero: true, .. }) && e.contains("os error 95") {
                        no_zero_range = true;
                        break;
                    }
                    assert!(
                        matches!(op, Op::SetXattr { .. } | Op::RemoveXattr { .. }),
                        "{e} in\n{}",
                        w.to_text()
                    );
                }
            }
            if no_zero_range {
                println!("workload {k} left out: the scratch file system has no ZERO_RANGE");
                continue;
            }
            let model = &Expected::of(&w).unwrap().states[0];
            let last = model.last().unwrap();
            let mut names: Vec<String> =
                last.names.keys().filter(|p| !p.is_empty()).cloned().collect();
            names.sort();
            let mut found = Vec::new();
            walk(&dir, &dir, &mut found);
            found.sort();
            assert_eq!(found, names, "seed {}", w.seed);
            for p in &names {
                let inode = last.get(p).unwrap();
                if inode.kind == crate::model::Kind::File {
                    assert_eq!(
                        std::fs::read(dir.join(p)).unwrap(),
                        inode.data,
                        "seed {}: {p}",
                        w.seed
                    );
                }
            }
        }
    }

    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            out.push(p.strip_prefix(root).unwrap().to_string_lossy().into_owned());
            if e.file_type().unwrap().is_dir() {
                walk(root, &p, out);
            }
        }
    }
}
