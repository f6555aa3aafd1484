//! What a daemonized `quill mount` leaves behind: a log a user can find (syslog, `-o log=`, or
//! the default file `quill mount` names when there is no syslog) holding every failure after
//! the mount went live (a journal abort from a failing device, a panic in a request thread with
//! its backtrace, a failed unmount), requests answered EIO instead of hanging, the daemon's exit
//! code, and no zombie processes. Faults are injected with the test-only `QUILL_TEST_FAULT`
//! (crates/cli/src/mount_test_fault.rs).
//!
//! This test process is a child subreaper ([`become_subreaper`]): each daemon becomes its child
//! once `quill mount` exits, so the tests reap the daemons themselves, read their exit codes,
//! and see any process quill failed to reap as a zombie child. The tests take one lock so that
//! one test's daemons are not counted as another's zombies.

mod mount_support;

use std::fs;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use mount_support::*;

/// Held by each test: zombie counts are per process, and the tests share this one.
static SERIAL: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

/// The name whose lookup fires the injected fault (mount_test_fault.rs).
const TRIGGER: &str = ".quill-test-fault";

fn test_pid() -> u32 {
    std::process::id()
}

/// What every test here starts with: the scratch directory, a fresh `quill mkfs` image in
/// it and a mount point.
struct Setup {
    /// Held for the whole test (see [`SERIAL`]).
    _serial: parking_lot::MutexGuard<'static, ()>,
    s: Scratch,
    image: PathBuf,
    mnt: PathBuf,
}

/// Takes the lock, checks the machine can run `test` (`None` after its SKIP line), makes
/// this process the subreaper and prepares image `image_name` of `size`.
fn setup(test: &str, tools: &[&str], image_name: &str, size: &str) -> Option<Setup> {
    let serial = SERIAL.lock();
    if !ready(test, tools) {
        return None;
    }
    become_subreaper();
    let s = Scratch::new(&test[..test.len().min(24)]);
    let image = s.path(image_name);
    quill_mkfs(&image, size);
    let mnt = s.dir("mnt");
    Some(Setup { _serial: serial, s, image, mnt })
}

/// No zombie child of this test process, nor of process `daemon` if given.
fn assert_no_zombies(when: &str, daemon: Option<u32>) {
    let mine = zombie_children(test_pid());
    assert!(mine.is_empty(), "{when}: zombie children of the test: {mine:?}");
    if let Some(daemon) = daemon {
        let its = zombie_children(daemon);
        assert!(its.is_empty(), "{when}: zombie children of the daemon {daemon}: {its:?}");
    }
}

fn read_log(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("read the log {}: {e}", path.display()))
}

/// Asserts the log holds a line with `needle` that carries a timestamp and `level`.
fn assert_logged(log: &str, level: &str, needle: &str) {
    let found = log.lines().find(|l| l.contains(needle));
    let Some(line) = found else { panic!("the log has no line with {needle:?}:\n{log}") };
    let (stamp, rest) = line.split_once(' ').unwrap();
    assert!(
        stamp.len() == "2026-11-25T13:16:00.123Z".len() && stamp.ends_with('Z'),
        "no timestamp: {line}"
    );
    assert!(rest.starts_with(level), "not {level}: {line}");
}

/// Writes `data` to `path` and fsyncs it; the error's errno if either fails.
fn write_fsync(path: &Path, data: &[u8]) -> Result<(), i32> {
    use std::io::Write;
    let errno = |e: std::io::Error| e.raw_os_error().unwrap_or(0);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(path)
        .map_err(errno)?;
    f.write_all(data).map_err(errno)?;
    f.sync_all().map_err(errno)
}

/// The errno of `stat(path)`, run on another thread so that a request that is never answered
/// fails the test instead of hanging it.
fn stat_errno_within(path: &Path, limit: Duration) -> i32 {
    let (tx, rx) = mpsc::channel();
    let path = path.to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(fs::metadata(&path).err().and_then(|e| e.raw_os_error()).unwrap_or(0));
    });
    rx.recv_timeout(limit).unwrap_or_else(|_| panic!("stat was not answered in {limit:?}"))
}

/// The image after a journal abort, recovered by `quill recover`, passes `e2fsck -fn` and
/// holds `file` with `contents` (committed before the fault).
fn assert_recovers_with(s: &Scratch, image: &Path, file: &str, contents: &[u8]) {
    let o = ok(quill().arg("recover").arg(image));
    println!("quill recover: {}", text(&o).trim());
    // The abort's errno, where it reached the journal superblock, marks the file system as
    // having errors; e2fsck -fy clears the mark after its full check finds nothing else.
    let o = run(Command::new("e2fsck").arg("-fy").arg(image));
    assert!(matches!(o.status.code(), Some(0) | Some(1)), "e2fsck -fy:\n{}", text(&o));
    assert!(!text(&o).contains("Inode"), "e2fsck -fy repaired metadata:\n{}", text(&o));
    assert_clean(image);
    let kernel = LoopMount::new(image, &s.dir("kernel"));
    assert_eq!(fs::read(kernel.dir.join(file)).unwrap(), contents);
}

/// Without syslog and without `-o log=`, `quill mount` names the file its daemon logs to; the
/// daemon logs its mount and unmount there and exits 0; a failed mount and a clean unmount
/// leave no zombie (a failed daemon child is reaped by `quill mount`, not left to PID 1).
#[test]
fn daemon_names_its_default_log_file_and_leaves_no_zombie() {
    let test = "daemon_names_its_default_log_file_and_leaves_no_zombie";
    let name = format!("default-log-{}.img", test_pid());
    let Some(Setup { _serial, s, image, mnt }) = setup(test, &["dumpe2fs"], &name, "32M") else {
        return;
    };
    let syslog =
        std::os::unix::net::UnixDatagram::unbound().and_then(|u| u.connect("/dev/log")).is_ok();

    let (m, o) = QuillMount::daemon_with_env(&image, &mnt, "", &[]);
    let daemon = m.pid();
    let stderr = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(o.stdout.is_empty(), "stdout: {:?}", o.stdout);
    let default_log: Option<PathBuf> = if syslog {
        println!("SKIP default log file part: a syslog daemon listens on /dev/log here");
        assert!(stderr.is_empty(), "with syslog, quill mount prints nothing: {stderr}");
        None
    } else {
        assert_eq!(stderr.lines().count(), 1, "one line naming the log: {stderr:?}");
        let path = stderr.trim_end().rsplit(' ').next().unwrap();
        assert!(path.ends_with(&format!("default-log-{}.img.log", test_pid())), "{stderr}");
        Some(PathBuf::from(path))
    };
    fs::write(mnt.join("a"), b"a").unwrap();
    assert_no_zombies("after the mount", Some(daemon));

    // A second mount of the image fails in the daemon child, after the fork.
    let mnt2 = s.dir("mnt2");
    let o = run(quill().arg("mount").arg(&image).arg(&mnt2));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("in use"), "{}", text(&o));
    assert_no_zombies("after a failed mount", Some(daemon));

    m.unmount();
    assert_eq!(reap(daemon), Some(0), "the daemon's exit code after a clean unmount");
    assert_no_zombies("after the unmount", None);
    assert_clean(&image);
    if let Some(path) = default_log {
        let log = read_log(&path);
        let _ = fs::remove_file(&path);
        assert_logged(&log, "INFO", &format!("mounted {} on {}", image.display(), mnt.display()));
        assert_logged(&log, "INFO", &format!("unmounted {}: the image is clean", mnt.display()));
        assert_logged(&log, "ERROR", "is in use (another quill mount holds it)");
        assert!(!log.contains("WARN"), "a clean mount and unmount warn of nothing:\n{log}");
    }
}

/// Runs `quill mount image dir` in a private mount namespace whose /dev is a tmpfs holding
/// fuse, null and, bound onto /dev/log, the socket at `syslog` (the test listens on it): a
/// machine with a syslog daemon, without touching this one's /dev. The daemon stays in that
/// namespace; its mount is reached through /proc/PID/root.
fn quill_mount_with_syslog(image: &Path, dir: &Path, syslog: &Path) -> std::process::Output {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::process::CommandExt;
    let socket = CString::new(syslog.as_os_str().as_bytes()).unwrap();
    let mut cmd = quill();
    cmd.arg("mount").arg(image).arg(dir).stdin(std::process::Stdio::null());
    // SAFETY: the closure runs in the forked child before exec and only makes system calls on
    // strings prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let check = |r: i32| if r == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) };
            check(libc::unshare(libc::CLONE_NEWNS))?;
            let (none, root, dev) = (c"none", c"/", c"/dev");
            let private = libc::MS_REC | libc::MS_PRIVATE;
            check(libc::mount(
                none.as_ptr(),
                root.as_ptr(),
                std::ptr::null(),
                private,
                std::ptr::null(),
            ))?;
            check(libc::mount(
                none.as_ptr(),
                dev.as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                std::ptr::null(),
            ))?;
            check(libc::mknod(
                c"/dev/fuse".as_ptr(),
                libc::S_IFCHR | 0o666,
                libc::makedev(10, 229),
            ))?;
            check(libc::mknod(c"/dev/null".as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)))?;
            check(libc::mknod(c"/dev/log".as_ptr(), libc::S_IFREG | 0o666, 0))?;
            let bind = libc::MS_BIND;
            check(libc::mount(
                socket.as_ptr(),
                c"/dev/log".as_ptr(),
                std::ptr::null(),
                bind,
                std::ptr::null(),
            ))
        });
    }
    run(&mut cmd)
}

/// Where a syslog daemon listens on /dev/log, a daemon logs there (facility daemon, ident
/// quill, its pid), prints nothing, and SIGTERM unmounts it cleanly (exit 0).
#[test]
fn daemon_logs_to_syslog_where_a_syslog_daemon_listens() {
    let test = "daemon_logs_to_syslog_where_a_syslog_daemon_listens";
    let Some(Setup { _serial, s, image, mnt }) = setup(test, &["dumpe2fs"], "img", "32M") else {
        return;
    };
    let socket_path = s.path("syslog.sock");
    let syslog = std::os::unix::net::UnixDatagram::bind(&socket_path).unwrap();
    syslog.set_read_timeout(Some(Duration::from_secs(20))).unwrap();

    let o = quill_mount_with_syslog(&image, &mnt, &socket_path);
    assert!(o.status.success(), "quill mount in a namespace with syslog: {}", text(&o));
    assert!(o.stderr.is_empty() && o.stdout.is_empty(), "printed: {}", text(&o));
    let daemon = daemon_pid(&mnt).expect("the daemon runs");
    let mut guard = QuillMount::adopt(&image, &mnt);
    let through =
        PathBuf::from(format!("/proc/{daemon}/root")).join(mnt.strip_prefix("/").unwrap());
    fs::write(through.join("via-syslog-mount"), b"s").unwrap();
    // SAFETY: signalling the daemon.
    unsafe { libc::kill(daemon as i32, libc::SIGTERM) };
    assert_eq!(reap(daemon), Some(0), "SIGTERM unmounts cleanly");
    guard.wait_exit();
    assert_no_zombies("after the unmount", None);

    let mut lines = Vec::new();
    let mut buf = [0u8; 4096];
    while lines.len() < 4 {
        let n = syslog.recv(&mut buf).expect("four syslog lines within 20 s");
        lines.push(String::from_utf8_lossy(&buf[..n]).to_string());
    }
    // <30> is facility daemon (3 << 3) with priority info (6).
    let tag = format!("quill[{daemon}]: ");
    // The I/O path the image was opened with depends on the file system under it.
    let io_line = lines.remove(0);
    let io_prefix = format!("{tag}{}: ", image.display());
    assert!(io_line.starts_with("<30>"), "{io_line}");
    assert!(io_line.contains(&io_prefix) && io_line.contains(" I/O, "), "{io_line:?}");
    let want = [
        format!("mounted {} on {} (rw)", image.display(), mnt.display()),
        format!("signal {}: unmounting {}", libc::SIGTERM, mnt.display()),
        format!("unmounted {}: the image is clean", mnt.display()),
    ];
    for (line, want) in lines.iter().zip(&want) {
        assert!(line.starts_with("<30>"), "{line}");
        assert!(line.ends_with(&format!("{tag}{want}")), "{line:?} is not {want:?}");
    }
    assert_clean(&image);
    let kernel = LoopMount::new(&image, &s.dir("kernel"));
    assert_eq!(fs::read(kernel.dir.join("via-syslog-mount")).unwrap(), b"s");
}

/// A daemon mounted with `QUILL_TEST_FAULT=fault`, logging to a file, with `before` written
/// and fsynced; `None` (after a SKIP line) where FUSE tests cannot run.
struct FaultyMount {
    mount: QuillMount,
    daemon: u32,
    mnt: PathBuf,
    log_path: PathBuf,
    /// Declared last, so it is dropped last: the mount goes before the scratch directory.
    setup: Setup,
}

fn faulty_mount(test: &str, fault: &str, opts: &str, before: &[u8]) -> Option<FaultyMount> {
    let setup = setup(test, &["dumpe2fs"], "img", "32M")?;
    let (image, mnt) = (setup.image.clone(), setup.mnt.clone());
    let log_path = setup.s.path("quill.log");
    let opts = format!("log={},{opts}", log_path.display());
    let env = [("QUILL_TEST_FAULT", fault)];
    let (mount, o) = QuillMount::daemon_with_env(&image, &mnt, &opts, &env);
    assert!(o.stderr.is_empty(), "log= chosen: nothing to print: {}", text(&o));
    let daemon = mount.pid();
    write_fsync(&mnt.join("before"), before).unwrap();
    Some(FaultyMount { mount, daemon, mnt, log_path, setup })
}

impl FaultyMount {
    /// Unmounts, reaps the daemon and asserts it exited `code`, with no zombie left; then the
    /// image, recovered, holds `before` as [`faulty_mount`] wrote it. Returns the log.
    fn unmount_and_recover(self, code: i32, before: &[u8]) -> String {
        self.mount.unmount();
        assert_eq!(reap(self.daemon), Some(code), "the daemon's exit code");
        assert_no_zombies("after the unmount", None);
        assert_recovers_with(&self.setup.s, &self.setup.image, "before", before);
        read_log(&self.log_path)
    }
}

/// A device that starts failing under a live daemon: the fsync that meets it fails EIO, the
/// journal aborts, and the log says so with the cause; the unmount that cannot complete exits 1
/// and says why in the log; the image recovers to what was committed before.
#[test]
fn journal_abort_from_a_failing_device_is_logged_and_the_daemon_exits_1() {
    let test = "journal_abort_from_a_failing_device_is_logged_and_the_daemon_exits_1";
    let before = b"committed before the fault";
    let Some(f) = faulty_mount(test, "device-eio", "", before) else { return };
    let mnt = f.mnt.clone();

    assert_eq!(stat_errno_within(&mnt.join(TRIGGER), Duration::from_secs(20)), libc::ENOENT);
    assert_eq!(write_fsync(&mnt.join("after"), b"never durable"), Err(libc::EIO));
    let refused = write_fsync(&mnt.join("later"), b"x");
    assert!(matches!(refused, Err(libc::EROFS) | Err(libc::EIO)), "{refused:?}");
    assert_eq!(fs::read(mnt.join("before")).unwrap(), before);

    // The unmount cannot finish: exit 1.
    let log = f.unmount_and_recover(1, before);
    assert_logged(&log, "WARN", "TEST ONLY: QUILL_TEST_FAULT=device-eio is set");
    assert_logged(&log, "ERROR", "a request failed: device: Write at byte");
    assert_logged(&log, "ERROR", "journal aborted: file system error: device: Write at byte");
    assert_logged(&log, "ERROR", &format!("unmounting {} failed: journal", mnt.display()));
}

/// A panic in a request handler: the request is answered EIO within seconds (not left
/// hanging), the journal is aborted so the file system is read-only, reads still work, the
/// log holds the panic's message, place and backtrace and what became of the request, and the
/// daemon still unmounts (exit 1: the aborted journal cannot be checkpointed).
#[test]
fn panic_in_a_request_thread_answers_eio_aborts_the_journal_and_logs_a_backtrace() {
    let test = "panic_in_a_request_thread_answers_eio_aborts_the_journal_and_logs_a_backtrace";
    let before = b"committed before the panic";
    let Some(f) = faulty_mount(test, "panic", "threads=2", before) else { return };
    let mnt = f.mnt.clone();

    // More panics than worker threads: each thread survives its panic and serves on.
    for _ in 0..3 {
        assert_eq!(stat_errno_within(&mnt.join(TRIGGER), Duration::from_secs(20)), libc::EIO);
    }
    assert_eq!(write_fsync(&mnt.join("after"), b"x"), Err(libc::EROFS));
    assert_eq!(fs::read(mnt.join("before")).unwrap(), before);
    assert_no_zombies("after the panic", Some(f.daemon));

    // The aborted journal cannot be checkpointed: exit 1.
    let log = f.unmount_and_recover(1, before);
    assert_logged(&log, "ERROR", "panic in thread 'fuser-");
    assert_logged(&log, "ERROR", "QUILL_TEST_FAULT=panic: injected panic (tests only)");
    assert_logged(&log, "ERROR", "backtrace:");
    // The backtrace names the frames between the request and the panic.
    assert_logged(&log, "ERROR", "quill_fuse::QuillFuse::guarded");
    assert_logged(&log, "ERROR", "as fuser::Filesystem>::lookup");
    assert_logged(&log, "ERROR", "journal aborted: panic in a FUSE lookup request");
    assert_logged(&log, "ERROR", "a lookup request panicked");
    assert_logged(&log, "ERROR", &format!("unmounting {} failed", mnt.display()));
    assert_eq!(log.matches("a lookup request panicked").count(), 3, "{log}");
    assert_eq!(log.matches("]: journal aborted: panic").count(), 1, "the abort is logged once");
}

/// Starts, on another thread, a child process that holds a copy of every descriptor this
/// process has open for `hold` before it execs, as a tool spawned by a parallel test does
/// between its fork and its exec; returns once the child exists (so the copies do), with the
/// thread that waits for it.
fn spawn_fork_holding_copies(hold: Duration) -> std::thread::JoinHandle<()> {
    use std::os::unix::process::CommandExt;
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 fills both descriptors.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    let [read_end, write_end] = fds;
    let waiter = std::thread::spawn(move || {
        let mut cmd = Command::new("true");
        // SAFETY: the closure runs in the forked child before exec and only makes system
        // calls (write, nanosleep).
        unsafe {
            cmd.pre_exec(move || {
                libc::write(write_end, b"f".as_ptr().cast(), 1);
                std::thread::sleep(hold);
                Ok(())
            });
        }
        let status = cmd.status().unwrap();
        assert!(status.success());
        // SAFETY: our descriptor, closed once.
        unsafe { libc::close(write_end) };
    });
    let mut byte = 0u8;
    // SAFETY: reading one byte from our pipe into a local.
    let n = unsafe { libc::read(read_end, (&mut byte as *mut u8).cast(), 1) };
    assert_eq!(n, 1, "the child did not start");
    // SAFETY: as above.
    unsafe { libc::close(read_end) };
    waiter
}

/// `umount` right after `rm -rf` of a few thousand files unmounts, and the daemon exits 0
/// with a clean image, round after round. The "target is busy" this sometimes gave was not
/// the daemon's: a test process, whose tests spawn tools from parallel threads, had a child
/// forked while it had a file open on the mount; the child holds a copy of that file until it
/// execs, so a `umount` right after the test closed its own copy was refused. Each round makes
/// that happen for sure (a child that holds its copies for a second) and unmounts through
/// `mount_support::umount`, which waits out such a refusal (and names any process that keeps
/// a file open longer).
#[test]
fn umount_right_after_rm_rf_of_a_large_tree_is_not_busy() {
    let test = "umount_right_after_rm_rf_of_a_large_tree_is_not_busy";
    let tools = ["dumpe2fs", "tar", "rm"];
    let Some(Setup { _serial, s, image, mnt }) = setup(test, &tools, "img", "128M") else {
        return;
    };
    // 3,000 files of 3 KiB in 30 directories, as a tarball.
    let tree = s.dir("tree");
    for d in 0..30 {
        let dir = tree.join(format!("dir-{d:02}/sub"));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..100 {
            fs::write(dir.join(format!("file-{f:03}")), vec![(d * 100 + f) as u8; 3000]).unwrap();
        }
    }
    let tarball = s.path("tree.tar");
    ok(Command::new("tar").arg("-cf").arg(&tarball).arg("-C").arg(&tree).arg("."));
    let log_path = s.path("quill.log");
    for round in 0..5 {
        let (m, _) =
            QuillMount::daemon_with_env(&image, &mnt, &format!("log={}", log_path.display()), &[]);
        let daemon = m.pid();
        let top = mnt.join("tree");
        fs::create_dir(&top).unwrap();
        ok(Command::new("tar").arg("-xf").arg(&tarball).arg("-C").arg(&top));
        ok(Command::new("rm").arg("-rf").arg(&top));
        // This process looks at what is left, while a parallel test spawns a tool.
        let open = fs::File::open(&mnt).unwrap();
        let spawned = spawn_fork_holding_copies(Duration::from_secs(1));
        let left: Vec<_> = fs::read_dir(&mnt).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, ["lost+found"], "round {round}: rm -rf left entries");
        drop(open);
        if let Err(err) = umount(&mnt) {
            panic!("round {round}: {err}");
        }
        spawned.join().unwrap();
        let mut m = m;
        m.wait_exit();
        assert_eq!(reap(daemon), Some(0), "round {round}: the daemon's exit code");
        assert_clean(&image);
    }
    assert_no_zombies("after the rounds", None);
    let log = read_log(&log_path);
    assert_eq!(log.matches("the image is clean").count(), 5, "{log}");
    assert!(!log.contains("ERROR") && !log.contains("WARN"), "{log}");
}
