//! Mounting an image through FUSE: `quill mount [-f] [-o OPTIONS] IMAGE MOUNTPOINT` and the
//! mount(8) helper `mount.quill` (both binaries include this module).
//!
//! Order of events, chosen so that bad input never touches the image and a mount is either
//! live or reported failed:
//! 1. Parse the options; check the image exists and the mount point is a directory, and that
//!    /dev/fuse opens (nothing is opened for writing yet).
//! 2. Open the log (`mount_log.rs`: stderr with `-f`, else syslog, `-o log=PATH`, or a default
//!    file where there is no syslog). Without `-f`, fork while the process is still
//!    single-threaded (the file system starts journal threads, which a fork would not carry
//!    over). The parent waits on a pipe for the child's one-line verdict and exits 0 once the
//!    mount is live (printing the log file's path if it is the default one), or reaps the
//!    child, which exits after a failed verdict, and prints the error.
//! 3. The child (or the `-f` process) starts a new session, blocks SIGINT/SIGTERM in every
//!    thread it will start, takes an exclusive lock on the image (a second mount of the same
//!    image fails instead of corrupting it), opens the file system (which refuses unsupported
//!    features before writing anything), and mounts it.
//! 4. It serves until the mount point is unmounted (`umount`, `fusermount3 -u`, or SIGTERM /
//!    SIGINT, which unmount it), then unmounts the file system cleanly — committed,
//!    checkpointed, marked clean — and only then exits and releases the image lock, so
//!    `flock IMAGE true` waits for the image to be clean.
//!
//! Everything after the mount went live (a request's I/O error, a journal abort, a panic, a
//! failed unmount) is logged (`log::error!`); a daemon has no other way to tell anyone.

use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use blockdev::file::{FileDevice, FileOptions};
use blockdev::BlockDevice;
use parking_lot::Mutex;

use crate::mount_log::MountLog;
use crate::mount_test_fault::{self, TestFault};

/// What to mount, how, and where.
#[derive(Debug, Clone)]
pub struct MountRequest {
    pub image: PathBuf,
    pub mountpoint: PathBuf,
    /// `-o` lists, in order.
    pub options: Vec<String>,
    /// Stay in the foreground (`quill mount -f`).
    pub foreground: bool,
    /// Ignore unknown options (mount(8)'s `-s`).
    pub sloppy: bool,
    /// Say what is being done on stderr (mount(8)'s `-v`).
    pub verbose: bool,
    /// Check everything, mount nothing (mount(8)'s `-f`).
    pub fake: bool,
}

/// Why a mount did not happen or did not end cleanly; the message is one line.
#[derive(Debug)]
pub enum MountError {
    /// Bad options or arguments (exit 2).
    Usage(String),
    /// Everything else (exit 1).
    Failed(String),
    /// A failure after the mount went live, already in the log (exit 1); with `-f` the log
    /// includes stderr, so the caller must not print it again.
    Logged(String),
}

impl MountError {
    pub fn exit_code(&self) -> u8 {
        match self {
            MountError::Usage(_) => 2,
            MountError::Failed(_) | MountError::Logged(_) => 1,
        }
    }

    pub fn message(&self) -> &str {
        match self {
            MountError::Usage(m) | MountError::Failed(m) | MountError::Logged(m) => m,
        }
    }

    pub fn is_logged(&self) -> bool {
        matches!(self, MountError::Logged(_))
    }
}

/// Logs `msg` as an error and returns it as a [`MountError::Logged`].
fn logged(msg: String) -> MountError {
    log::error!("{msg}");
    MountError::Logged(msg)
}

fn failed(msg: impl Into<String>) -> MountError {
    MountError::Failed(msg.into())
}

/// Mounts as `request` says; see the module docs. Returns in the parent once the daemon has
/// mounted (or failed), and in the daemon (or with `-f`) once the file system is unmounted.
pub fn run(request: MountRequest) -> Result<(), MountError> {
    let mut spec =
        quill_fuse::options::parse(&request.options, request.sloppy).map_err(MountError::Usage)?;
    let image = check_image(&request.image)?;
    let mountpoint = check_mountpoint(&request.mountpoint)?;
    check_dev_fuse()?;
    let fault = mount_test_fault::from_env().map_err(MountError::Usage)?;
    spec.fuse.fsname = image.display().to_string();
    if request.verbose {
        for ignored in &spec.ignored {
            eprintln!("quill: ignoring mount option {ignored:?}");
        }
        eprintln!(
            "quill: mounting {} on {} ({}, data={:?}, {} threads)",
            image.display(),
            mountpoint.display(),
            if spec.fs.read_only { "ro" } else { "rw" },
            spec.fs.data,
            spec.fuse.threads
        );
    }
    if request.fake {
        return Ok(());
    }
    let log = MountLog::open(spec.log_file.as_deref(), request.foreground, &image)
        .map_err(MountError::Failed)?;
    let note = log.note();
    log.install();
    let reporter = if request.foreground { Reporter::Foreground } else { daemonize(note)? };
    mount_and_report(&image, &mountpoint, spec, fault, reporter)?.serve()
}

/// The image must exist and be a regular file or a block device.
fn check_image(image: &Path) -> Result<PathBuf, MountError> {
    let meta = std::fs::metadata(image)
        .map_err(|e| failed(format!("cannot use image {}: {}", image.display(), io_reason(&e))))?;
    let kind = meta.file_type();
    if !(kind.is_file() || kind.is_block_device()) {
        return Err(failed(format!(
            "cannot use image {}: not a regular file or block device",
            image.display()
        )));
    }
    std::fs::canonicalize(image)
        .map_err(|e| failed(format!("cannot use image {}: {}", image.display(), io_reason(&e))))
}

fn check_mountpoint(mountpoint: &Path) -> Result<PathBuf, MountError> {
    let meta = std::fs::metadata(mountpoint)
        .map_err(|e| failed(format!("mount point {}: {}", mountpoint.display(), io_reason(&e))))?;
    if !meta.is_dir() {
        return Err(failed(format!("mount point {} is not a directory", mountpoint.display())));
    }
    std::fs::canonicalize(mountpoint)
        .map_err(|e| failed(format!("mount point {}: {}", mountpoint.display(), io_reason(&e))))
}

/// FUSE must be usable before the image is opened for writing, or a failed mount would
/// still have replayed the journal and bumped the mount count.
fn check_dev_fuse() -> Result<(), MountError> {
    std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse").map(drop).map_err(|e| {
        failed(format!(
            "cannot open /dev/fuse: {} (is the fuse module loaded, and /dev/fuse accessible?)",
            io_reason(&e)
        ))
    })
}

/// An io::Error's reason without Rust's " (os error N)" suffix.
pub(crate) fn io_reason(err: &std::io::Error) -> String {
    let text = err.to_string();
    match text.find(" (os error") {
        Some(at) => text[..at].to_string(),
        None => text,
    }
}

/// Where the verdict of the mount goes.
enum Reporter {
    /// `-f`: errors are returned to the caller, who prints them.
    Foreground,
    /// The daemon: one line through the pipe to the waiting parent.
    Daemon(File),
}

impl Reporter {
    /// Tells the parent the mount is live, then lets go of the terminal.
    fn success(self) {
        if let Reporter::Daemon(mut pipe) = self {
            // If the parent is gone there is nobody to tell; the mount is live regardless.
            let _ = pipe.write_all(b"ok\n");
            drop(pipe);
            detach_stdio();
        }
    }

    /// Hands `err` to the parent (daemon) or back to the caller (`-f`).
    fn failure(self, err: MountError) -> MountError {
        match self {
            Reporter::Foreground => err,
            Reporter::Daemon(mut pipe) => {
                log::error!("{}", err.message());
                let line = format!("{} {}\n", err.exit_code(), err.message().replace('\n', " "));
                let _ = pipe.write_all(line.as_bytes());
                // The parent prints it; the daemon has nothing more to do.
                std::process::exit(i32::from(err.exit_code()));
            }
        }
    }
}

/// Forks. The parent waits for the child's verdict and exits from here (printing `note` once
/// the mount is live); the child returns its end of the pipe.
fn daemonize(note: Option<String>) -> Result<Reporter, MountError> {
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 fills both descriptors on success.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(failed(format!("pipe: {}", std::io::Error::last_os_error())));
    }
    // SAFETY: both descriptors are fresh and owned from here on.
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the process is single-threaded here (nothing has started a thread: option
    // parsing and the checks above run on the main thread only), so the child may do anything.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(failed(format!("fork: {}", std::io::Error::last_os_error())));
    }
    if pid == 0 {
        drop(read_end);
        // SAFETY: plain system calls in the child.
        unsafe {
            // Leave the caller's session, so its terminal's hangup does not reach the daemon.
            libc::setsid();
            // Do not keep the caller's working directory busy (paths are absolute by now).
            libc::chdir(c"/".as_ptr());
        }
        return Ok(Reporter::Daemon(File::from(write_end)));
    }
    drop(write_end);
    let mut verdict = String::new();
    let _ = File::from(read_end).read_to_string(&mut verdict);
    let verdict = verdict.trim_end();
    if verdict == "ok" {
        // The daemon lives on; whoever adopts it when this process exits reaps it.
        if let Some(note) = note {
            eprintln!("quill: {note}");
        }
        std::process::exit(0);
    }
    // The child exits right after a failed verdict (or died without one): reap it, or it
    // stays a zombie for whoever adopts it, and where that is a PID 1 that does not reap
    // (many containers), for good.
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    if let Some((code, msg)) = verdict.split_once(' ') {
        eprintln!("quill: {msg}");
        std::process::exit(code.parse().unwrap_or(1));
    }
    // The child died without a word (killed, or a panic before it could answer).
    eprintln!("quill: the mount process exited before mounting (wait status {status:#x})");
    std::process::exit(1);
}

/// Points stdin, stdout and stderr at /dev/null: a daemon must not hold its caller's pipes or
/// terminal open (a caller reading its output would wait for the unmount).
fn detach_stdio() {
    if let Ok(null) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null") {
        for fd in 0..3 {
            // SAFETY: duplicating a valid descriptor over the standard ones.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
}

/// A live mount: the FUSE session, the file system it serves, and the image lock.
struct Mounted {
    session: quill_fuse::fuser::Session<quill_fuse::QuillFuse>,
    fs: Arc<fs::Filesystem>,
    mountpoint: PathBuf,
    _lock: File,
}

/// Opens, mounts, and reports the verdict.
fn mount_and_report(
    image: &Path,
    mountpoint: &Path,
    spec: quill_fuse::options::MountSpec,
    fault: Option<TestFault>,
    reporter: Reporter,
) -> Result<Mounted, MountError> {
    // Every thread started from here on (journal, FUSE workers) inherits this mask, so the
    // signal thread is the only one that ever sees SIGINT and SIGTERM.
    block_termination_signals();
    let mode = if spec.fs.read_only { "ro" } else { "rw" };
    match open_and_mount(image, mountpoint, spec, fault) {
        Ok(mounted) => {
            log::info!("mounted {} on {} ({mode})", image.display(), mountpoint.display());
            reporter.success();
            Ok(mounted)
        }
        Err(err) => Err(reporter.failure(err)),
    }
}

fn open_and_mount(
    image: &Path,
    mountpoint: &Path,
    mut spec: quill_fuse::options::MountSpec,
    fault: Option<TestFault>,
) -> Result<Mounted, MountError> {
    let shown = image.display();
    let lock = lock_image(image)?;
    let read_only = spec.fs.read_only;
    let dev = FileDevice::open(image, FileOptions { read_only, io: spec.io, ..Default::default() })
        .map_err(|e| failed(format!("cannot open {shown}: {e}")))?;
    log::info!("{shown}: {}", dev.io_path());
    // Opened read-only, the device refuses writes; Filesystem::open with read_only writes
    // nothing (a journal that needs replaying is replayed in memory), so nothing ever tries.
    let mut dev: Arc<dyn BlockDevice> = Arc::new(dev);
    if let Some(fault) = fault {
        let (faulty, trigger) = fault.arm(dev);
        dev = faulty;
        spec.fuse.test_trigger = Some(trigger);
    }
    let filesystem = fs::Filesystem::open(dev, spec.fs.clone())
        .map_err(|e| failed(format!("cannot mount {shown}: {e}")))?;
    let fs = Arc::new(filesystem);
    match quill_fuse::mount(fs.clone(), mountpoint, &spec.fuse) {
        Ok(session) => {
            Ok(Mounted { session, fs, mountpoint: mountpoint.to_path_buf(), _lock: lock })
        }
        Err(err) => {
            // Leave the image as clean as it was found.
            let cleanup = quill_fuse::unmount_fs(fs);
            let mut msg = format!("cannot mount on {}: {}", mountpoint.display(), io_reason(&err));
            if let Err(e) = cleanup {
                msg.push_str(&format!("; and unmounting the image failed: {e}"));
            }
            Err(failed(msg))
        }
    }
}

/// An exclusive, non-blocking lock on the image for as long as it is mounted.
fn lock_image(image: &Path) -> Result<File, MountError> {
    let file = File::open(image)
        .map_err(|e| failed(format!("cannot open {}: {}", image.display(), io_reason(&e))))?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(failed(format!(
                "{} is in use (another quill mount holds it)",
                image.display()
            )));
        }
        return Err(failed(format!("cannot lock {}: {}", image.display(), io_reason(&err))));
    }
    Ok(file)
}

fn termination_signals() -> libc::sigset_t {
    // SAFETY: sigset manipulation on a local.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        set
    }
}

fn block_termination_signals() {
    let set = termination_signals();
    // SAFETY: changes only this thread's mask (all later threads inherit it).
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

impl Mounted {
    /// Serves until unmounted, then unmounts the file system cleanly.
    fn serve(self) -> Result<(), MountError> {
        let Mounted { session, fs, mountpoint, _lock } = self;
        // Set once the session is over, under the lock, so a late signal cannot unmount
        // whatever is mounted on the same directory next.
        let over = Arc::new(Mutex::new(false));
        spawn_signal_thread(mountpoint.clone(), over.clone());
        let served = session.run();
        *over.lock() = true;
        let shown = mountpoint.display();
        let served = served.map_err(|e| logged(format!("the FUSE session on {shown} failed: {e}")));
        // The session and its threads are gone: this is the last reference.
        match quill_fuse::unmount_fs(fs) {
            Ok(()) => {
                served?;
                log::info!("unmounted {shown}: the image is clean");
                Ok(())
            }
            Err(err) => Err(logged(format!(
                "unmounting {shown} failed: {err}; the image is left as a crash would leave \
                 it (the next mount, `quill recover` or `e2fsck -fy` recovers it)"
            ))),
        }
    }
}

/// Waits for SIGINT/SIGTERM and unmounts the mount point, which ends the session; the main
/// thread then finishes as after `umount`.
fn spawn_signal_thread(mountpoint: PathBuf, over: Arc<Mutex<bool>>) {
    let spawned = std::thread::Builder::new().name("quill-signals".into()).spawn(move || loop {
        let set = termination_signals();
        let mut signal = 0;
        // SAFETY: the set is blocked in every thread, so sigwait is the one to take it.
        if unsafe { libc::sigwait(&set, &mut signal) } != 0 {
            continue;
        }
        let over = over.lock();
        if *over {
            return;
        }
        log::info!("signal {signal}: unmounting {}", mountpoint.display());
        if let Err(msg) = unmount_mountpoint(&mountpoint) {
            log::error!("{msg}");
        }
    });
    if let Err(err) = spawned {
        log::error!("cannot start the signal thread (SIGTERM will not unmount): {err}");
    }
}

/// Unmounts `mountpoint` as `umount` would; when it is busy, detaches it (the session ends,
/// and the image is cleaned up, once the last open file there is closed).
fn unmount_mountpoint(mountpoint: &Path) -> Result<(), String> {
    let path = CString::new(mountpoint.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: umount2 with a NUL-terminated path.
    if unsafe { libc::umount2(path.as_ptr(), 0) } == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    match err.raw_os_error() {
        // SAFETY: as above.
        Some(libc::EBUSY) if unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } == 0 => {
            Ok(())
        }
        Some(libc::EPERM) => {
            // Not root: the setuid helper may unmount what this user mounted.
            for args in [["-u", "-q"], ["-u", "-z"]] {
                let status = std::process::Command::new("fusermount3")
                    .args(args)
                    .arg(mountpoint)
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .status();
                if status.map(|s| s.success()).unwrap_or(false) {
                    return Ok(());
                }
            }
            Err(format!("cannot unmount {}: fusermount3 -u failed", mountpoint.display()))
        }
        _ => Err(format!("cannot unmount {}: {}", mountpoint.display(), io_reason(&err))),
    }
}
