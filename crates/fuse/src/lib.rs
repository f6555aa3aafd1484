//! quill's FUSE adapter: serves an [`fs::Filesystem`] to the kernel through fuser's low-level,
//! inode-based protocol. This is the one place where file-system errors become errno values
//! for a caller ([`fs::FsError::errno`]).
//!
//! - Inode numbers are ext4's, except that FUSE's root is 1 and ext4's is 2: the two are
//!   swapped ([`to_fuse`], [`from_fuse`]), so the mapping is a bijection (ext4 inode 1 is the
//!   bad-blocks inode, which no directory entry names).
//! - Requests run in parallel: fuser reads from `threads` cloned `/dev/fuse` descriptors, each
//!   in its own thread, and the file system locks per inode (its lock order is in
//!   `fs/src/filesystem.rs`), so independent operations never wait for each other here.
//! - Permission checks are the kernel's (`default_permissions`): the adapter never calls
//!   `access`, and it trusts the uid/gid of each request.
//! - Open files are counted through [`Filesystem::open_inode`] so an unlinked file lives until
//!   its last release; the handle table maps each FUSE file handle to its inode slot.
//! - Nothing fails without a trace: messages go through the `log` facade (the mounting program
//!   chooses where: `quill mount` writes syslog, a file or stderr). A request that fails with
//!   an I/O error or corruption is logged, and so is the journal abort it may cause (once,
//!   with its cause). A panic in a request handler (a bug: disk contents are validated, never
//!   trusted) aborts the journal, so nothing the handler left half-done commits, answers the
//!   request EIO and keeps the worker thread serving ([`QuillFuse::guarded`]).
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! fn serve(fs: fs::Filesystem) -> Result<(), Box<dyn std::error::Error>> {
//!     let fs = Arc::new(fs);
//!     let config = quill_fuse::MountConfig::default();
//!     let session = quill_fuse::mount(fs.clone(), "/mnt".as_ref(), &config)?;
//!     session.run()?; // returns once the mount point is unmounted
//!     quill_fuse::unmount_fs(fs)?; // commit, checkpoint, mark the image clean
//!     Ok(())
//! }
//! ```

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fs::{Attr, FallocateMode, FsError, InodeSlot, RenameFlags, SetAttr, SetMode, ROOT_INO};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, KernelConfig,
    LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request,
    Session, SessionACL, TimeOrNow, WriteFlags,
};
use ondisk::ext4::{self, dir as ext4dir, Timestamp};
use parking_lot::Mutex;

mod fsync_waiters;
pub mod options;
mod privileges;
pub mod read_ahead;
mod request_stats;

/// The fuser crate this adapter is built on (its `Session` is what [`mount`] returns).
pub use fuser;
pub use request_stats::{RequestFigures, RequestStats};

/// How long the kernel may cache what it got from quill (libfuse's `entry_timeout`,
/// `attr_timeout` and `negative_timeout`). Every change goes through this mount, and the
/// kernel drops what a change it sends makes stale (a directory's attributes after a create
/// in it, a file's size and times after a write, its atime after a read, a negative entry
/// once the name is created) or takes the new attributes from the reply (SETATTR, which it
/// also sends before a write that drops set-id bits). quill changes nothing visible on its
/// own, so longer timeouts show nothing stale (the mount tests check it against the kernel's
/// ext4); they bound how long a change behind the mount's back could go unseen, and there is
/// none: the image is locked while mounted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Names (LOOKUP replies): how long the kernel trusts a name to stand for an inode.
    pub entry: Duration,
    /// Attributes (GETATTR, LOOKUP, SETATTR replies).
    pub attr: Duration,
    /// Absent names: how long a LOOKUP that found nothing is remembered as a negative entry
    /// (0: not at all, so every lookup of an absent name reaches quill).
    pub negative: Duration,
}

impl Default for Timeouts {
    /// Measured (dbench 16 clients, varmail-shared 16 threads, tokubench 1 and 4 threads, 3
    /// rounds each): 60-second entry and attribute timeouts spared no request (the GETATTRs
    /// left come from the kernel dropping a changed directory's attributes, not from
    /// timeouts); negative entries cut dbench from 2.80 to 2.60 requests per operation, its
    /// LOOKUPs of absent names, and ran it 6.6% faster with 1 second, 6.8% with 60 (45,476,
    /// 48,467 and 48,563 ops/s), so 1 second, as the entries themselves.
    fn default() -> Self {
        Timeouts {
            entry: Duration::from_secs(1),
            attr: Duration::from_secs(1),
            negative: Duration::from_secs(1),
        }
    }
}

impl Timeouts {
    /// The one timeout of replies that carry a name and attributes under a single TTL
    /// (CREATE, READDIRPLUS entries).
    fn both(&self) -> Duration {
        self.entry.min(self.attr)
    }
}

/// Entries read from the file system per step of a FUSE readdir.
const READDIR_BATCH: usize = 128;

/// How to mount (the FUSE side; the file system's own options are `fs::MountOptions`).
#[derive(Debug, Clone)]
pub struct MountConfig {
    /// Threads serving requests.
    pub threads: usize,
    /// The most fsyncs that wait for the journal on request threads; later ones wait on
    /// waiter threads (`fsync_waiters.rs`). `None`: [`default_fsync_inline`].
    pub fsync_inline: Option<usize>,
    /// The kernel's writeback cache (FUSE_WRITEBACK_CACHE): writes land in the kernel's page
    /// cache and reach quill in batches, at writeback, fsync or close (see `init`).
    pub writeback_cache: bool,
    /// Leave dropping set-id bits and file capabilities on write, truncate and chown to the
    /// kernel's FUSE client (`killpriv=kernel`), which asks for `security.capability` before
    /// every write, instead of quill (the default: `privileges.rs`).
    pub killpriv_in_kernel: bool,
    /// READDIRPLUS (see [`Readdirplus`]).
    pub readdirplus: Readdirplus,
    /// How long the kernel caches names, attributes and absent names ([`Timeouts`]).
    pub timeouts: Timeouts,
    /// The mount's readahead window in KiB, set once it is live (`read_ahead.rs`); 0 leaves
    /// the kernel's (128 KiB).
    pub read_ahead_kb: u32,
    /// Lookups and listings in one directory run at once (FUSE_PARALLEL_DIROPS) instead of
    /// one at a time, which the kernel's FUSE client otherwise enforces with a lock per
    /// directory (see [`DEFAULT_PARALLEL_DIROPS`]).
    pub parallel_dirops: bool,
    /// Let users other than the mounting one in (`allow_other`).
    pub allow_other: bool,
    /// Mount read-only (the kernel then refuses writes before they reach us).
    pub read_only: bool,
    /// The mount's source as `mount` and `df` show it (the image path).
    pub fsname: String,
    /// Generic VFS flags passed through to the kernel (`nosuid`, `noexec`, `noatime`, …).
    pub vfs_flags: Vec<MountOption>,
    /// Where the mount counts its requests ([`RequestStats`]): keep a clone to read them.
    pub request_stats: Arc<RequestStats>,
    /// Tests only (fault injection); `None` in every production mount.
    #[doc(hidden)]
    pub test_trigger: Option<LookupTrigger>,
}

/// TEST ONLY: a lookup of `name` (in any directory) runs `action` before it is answered, so a
/// test can inject a fault at a moment it chooses, through the mount (`quill mount` builds one
/// only from its `QUILL_TEST_FAULT` environment variable). Without one, lookups do nothing
/// extra.
#[derive(Clone)]
pub struct LookupTrigger {
    pub name: Vec<u8>,
    pub action: Arc<dyn Fn() + Send + Sync>,
}

impl std::fmt::Debug for LookupTrigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LookupTrigger").field("name", &OsStr::from_bytes(&self.name)).finish()
    }
}

impl Default for MountConfig {
    fn default() -> Self {
        MountConfig {
            threads: default_threads(),
            fsync_inline: None,
            writeback_cache: false,
            killpriv_in_kernel: false,
            readdirplus: Readdirplus::default(),
            timeouts: Timeouts::default(),
            read_ahead_kb: read_ahead::DEFAULT_READ_AHEAD_KB,
            parallel_dirops: DEFAULT_PARALLEL_DIROPS,
            allow_other: false,
            read_only: false,
            fsname: "quill".into(),
            vfs_flags: Vec::new(),
            request_stats: Arc::default(),
            test_trigger: None,
        }
    }
}

/// Default worker count: two per core (a thread waiting for a commit leaves its core to
/// another request), at least 4 so one fsync cannot stall the whole mount on a small machine.
pub fn default_threads() -> usize {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(4);
    (2 * cores).clamp(4, 64)
}

/// Whether directory listings carry each entry's attributes (FUSE READDIRPLUS), so that the
/// kernel caches the names and attributes a listing shows and a following `stat` or open of
/// them costs no LOOKUP or GETATTR: never, always, or where the kernel judges it pays
/// (`auto`: the first batch of a listing, and later ones after a lookup in the directory).
/// Off by default: on dbench (16 clients, 3 rounds) off, auto and on ran 40,723, 39,909 and
/// 38,416 ops/s, inside each other's spread; a listing with attributes costs quill 48 µs a
/// request against 35 without, and dbench's lookups are mostly of names no listing showed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Readdirplus {
    #[default]
    Off,
    On,
    Auto,
}

/// Default for [`MountConfig::parallel_dirops`]: off, the kernel's own default. Measured
/// level (3 rounds): varmail-shared 26,813 / 33,750 / 33,142 ops/s at 4 / 16 / 32 threads
/// with it against 26,084 / 34,921 / 34,135 without, dbench 16 clients 42,467 against 41,983,
/// each inside the other's spread: their lookups are few (0.08 and 0.35 per operation), and
/// the creates and unlinks that dominate hold the directory's lock in the VFS either way.
pub const DEFAULT_PARALLEL_DIROPS: bool = false;

/// Default for [`MountConfig::fsync_inline`]: every request thread but one (at least one), so
/// that fsyncs never take every request thread from the writes and creates that would join
/// their commit. Measured on varmail-shared with 4 request threads: 3 beat 2 by 8% at 4
/// workload threads (fewer handoffs) and were level at 16 and 32; with all 4 (no waiters)
/// 16 and 32 workload threads ran 11-13% slower.
pub fn default_fsync_inline(threads: usize) -> usize {
    threads.saturating_sub(1).max(1)
}

/// Mounts `fs` on `mountpoint` and completes the FUSE handshake; the mount is live when this
/// returns. Serve it with [`Session::run`], which returns once it is unmounted (by
/// `umount`/`fusermount3 -u`, or a [`fuser::SessionUnmounter`]); then call [`unmount_fs`].
pub fn mount(
    fs: Arc<fs::Filesystem>,
    mountpoint: &Path,
    config: &MountConfig,
) -> std::io::Result<Session<QuillFuse>> {
    let mut options = vec![
        MountOption::FSName(config.fsname.clone()),
        MountOption::DefaultPermissions,
        // Device nodes and set-id programs on an image behave as on the kernel's ext4 mount;
        // fuser would otherwise add nodev and nosuid (root only: the kernel refuses them to
        // others anyway).
        MountOption::Dev,
        MountOption::Suid,
    ];
    options.push(if config.read_only { MountOption::RO } else { MountOption::RW });
    for flag in &config.vfs_flags {
        // A later flag overrides the defaults above (nodev after dev, as mount(8) reads them).
        let opposite = match flag {
            MountOption::NoDev => Some(MountOption::Dev),
            MountOption::NoSuid => Some(MountOption::Suid),
            _ => None,
        };
        options.retain(|o| Some(o) != opposite.as_ref());
        if !options.contains(flag) {
            options.push(flag.clone());
        }
    }
    let mut fuse_config = fuser::Config::default();
    fuse_config.mount_options = options;
    fuse_config.acl = if config.allow_other { SessionACL::All } else { SessionACL::Owner };
    fuse_config.n_threads = Some(config.threads.max(1));
    fuse_config.clone_fd = true;
    let adapter = QuillFuse::new(fs, config);
    // Resolved now: once mounted, resolving it would be a request to this session, which
    // serves nothing until it runs.
    let resolved = mountpoint.canonicalize();
    let session = Session::new(adapter, mountpoint, &fuse_config)?;
    if config.read_ahead_kb > 0 {
        let set = resolved.and_then(|at| read_ahead::set(&at, config.read_ahead_kb));
        if let Err(err) = set {
            // Root only (sysfs); the mount works either way, with the kernel's window.
            log::warn!("readahead left at the kernel's default: {err}");
        }
    }
    Ok(session)
}

/// Unmounts the file system cleanly once the FUSE session is over (every clone of the `Arc`
/// dropped): commits, checkpoints and marks the image clean.
pub fn unmount_fs(fs: Arc<fs::Filesystem>) -> Result<(), FsError> {
    match Arc::try_unwrap(fs) {
        Ok(fs) => fs.unmount(),
        Err(fs) => {
            // Someone still holds the file system: at least make everything durable.
            fs.sync()?;
            Err(FsError::Invalid(
                "the file system is still in use; it was synced, not unmounted".into(),
            ))
        }
    }
}

/// How often the flusher looks for expired dirty data.
const FLUSHER_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// FUSE inode number of ext4 inode `ino`.
pub fn to_fuse(ino: u32) -> INodeNo {
    match ino {
        ROOT_INO => INodeNo::ROOT,
        1 => INodeNo(u64::from(ROOT_INO)),
        n => INodeNo(u64::from(n)),
    }
}

/// ext4 inode number of FUSE inode `ino` (the inverse of [`to_fuse`]).
pub fn from_fuse(ino: INodeNo) -> Result<u32, Errno> {
    match ino.0 {
        1 => Ok(ROOT_INO),
        2 => Ok(1),
        n => u32::try_from(n).map_err(|_| Errno::ENOENT),
    }
}

/// Request errors logged one by one; after these, one line says the rest are not (a dying
/// disk fails every request, and the log must stay readable).
const REQUEST_ERRORS_LOGGED_MAX: u64 = 64;

/// The text of a panic's payload (`panic!` with a message gives a `&str` or a `String`).
fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    journal::panic_message(payload).unwrap_or("a panic without a message")
}

/// The FUSE file system: the adapter between fuser's requests and [`fs::Filesystem`].
pub struct QuillFuse {
    fs: Arc<fs::Filesystem>,
    /// Writes back cached file data older than `MountOptions::dirty_expire` while mounted;
    /// stopped at `destroy`, before the final sync.
    flusher: Option<fs::Flusher>,
    /// Open files: FUSE file handle → the inode slot [`Filesystem::open_inode`] returned.
    handles: Mutex<HashMap<u64, Arc<InodeSlot>>>,
    next_fh: AtomicU64,
    /// Errors, aborts and panics to the log, from request threads and fsync waiters alike.
    report: Arc<Reporter>,
    /// Where fsyncs wait for the journal (`fsync_waiters.rs`).
    fsyncs: fsync_waiters::FsyncWaiters,
    /// What the mount was asked for: the FUSE options the handlers and `init` read, the
    /// request figures (`request_stats`), the test trigger.
    config: MountConfig,
    /// Whether quill drops privileges itself, the kernel having taken
    /// FUSE_HANDLE_KILLPRIV_V2 (set at `init`, see [`MountConfig::killpriv_in_kernel`]).
    kills_privileges: bool,
}

impl std::fmt::Debug for QuillFuse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuillFuse").field("open_files", &self.handles.lock().len()).finish()
    }
}

/// What requests leave in the log: errors, the journal's abort, panics (see the module
/// documentation). Shared by the request threads and the fsync waiters.
struct Reporter {
    fs: Arc<fs::Filesystem>,
    /// The journal abort was logged (it is logged once, by whichever request meets it first,
    /// or at `destroy`).
    abort_logged: AtomicBool,
    /// Request errors logged so far (see [`REQUEST_ERRORS_LOGGED_MAX`]).
    errors_logged: AtomicU64,
}

impl Reporter {
    /// Runs one request's handler. A panic in it must neither leave the request unanswered
    /// (its caller would wait forever) nor let what the handler half changed commit: the
    /// journal is aborted (the file system turns read-only, as after any error the journal
    /// cannot undo), the reply, dropped while unwinding, answers EIO (fuser's `ReplyRaw`
    /// answers every reply dropped unsent so), and the thread goes on serving. The panic's
    /// message and backtrace are logged by the panic hook (the mounting program's); this adds
    /// what became of the request. Locks are `parking_lot`'s, released while unwinding and
    /// never poisoned, so later requests (reads) still run.
    fn unwinding(&self, op: &'static str, handler: impl FnOnce()) {
        let Err(payload) = std::panic::catch_unwind(AssertUnwindSafe(handler)) else { return };
        let what = panic_message(&*payload);
        let _ = self.fs.journal().abort(format!("panic in a FUSE {op} request: {what}"), libc::EIO);
        log::error!(
            "a {op} request panicked ({what}): answered EIO; the journal is aborted and the file \
             system is read-only until it is unmounted (then run e2fsck)"
        );
        self.log_abort_once();
    }

    /// The errno a failed request answers; the one place where file-system errors become
    /// errno values. Errors that are not a caller's ordinary outcome (I/O errors, corruption,
    /// a failed journal) are logged, and so is a journal abort the first time a request meets it
    /// (the abort's sticky error, which every later change returns, is not logged again).
    fn errno(&self, err: FsError) -> Errno {
        let errno = err.errno();
        let aborted = matches!(err, FsError::Journal(journal::JournalError::Aborted { .. }));
        let serious = !aborted
            && (err.is_corruption()
                || matches!(err, FsError::Device(_) | FsError::Journal(_))
                || errno == libc::EIO);
        if serious {
            let logged = self.errors_logged.fetch_add(1, Ordering::Relaxed);
            if logged < REQUEST_ERRORS_LOGGED_MAX {
                log::error!("a request failed: {err} (errno {errno})");
            } else if logged == REQUEST_ERRORS_LOGGED_MAX {
                log::error!(
                    "{REQUEST_ERRORS_LOGGED_MAX} request errors logged; later ones are not"
                );
            }
        }
        self.log_abort_once();
        Errno::from_i32(errno)
    }

    /// Logs the journal's abort and its first cause, once per mount: from then on every change
    /// fails (EROFS) and nothing more is committed.
    fn log_abort_once(&self) {
        if !self.fs.journal().is_aborted() || self.abort_logged.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Err(err) = self.fs.journal().check_aborted() {
            log::error!(
                "{err}: the file system is read-only from now on; what was committed before \
                 stays, and recovery (the next mount, `quill recover` or e2fsck) finishes it"
            );
        }
    }
}

impl QuillFuse {
    pub fn new(fs: Arc<fs::Filesystem>, config: &MountConfig) -> QuillFuse {
        let inline = config.fsync_inline.unwrap_or_else(|| default_fsync_inline(config.threads));
        let fs_for_reports = fs.clone();
        // Without a flusher (the thread could not start), data is still written back by
        // fsync, sync, memory pressure and unmount.
        let flusher = fs.start_flusher(FLUSHER_INTERVAL).ok();
        QuillFuse {
            fs,
            flusher,
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            report: Arc::new(Reporter {
                fs: fs_for_reports,
                abort_logged: AtomicBool::new(false),
                errors_logged: AtomicU64::new(0),
            }),
            fsyncs: fsync_waiters::FsyncWaiters::new(inline),
            config: config.clone(),
            kills_privileges: false,
        }
    }

    /// What an open tells the kernel about the file's page cache. With `noatime`,
    /// FOPEN_KEEP_CACHE: the kernel keeps the cache across opens instead of dropping it at
    /// each one. Every change to a file's data comes through this mount (quill changes none
    /// by itself), and the kernel updates or drops the cached pages for the writes, truncates
    /// and fallocates it sends, so what it kept is what quill holds. With `relatime` or
    /// `strictatime` reads must reach quill, which sets the access time as ext4 does (the
    /// kernel's FUSE client does not): a read served from the cache would leave a file
    /// written since it was last read looking unread.
    fn open_flags(&self) -> FopenFlags {
        if self.fs.options().atime == fs::AtimeMode::Never {
            FopenFlags::FOPEN_KEEP_CACHE
        } else {
            FopenFlags::empty()
        }
    }

    /// Runs one request's handler, counted in the request figures and under
    /// [`Reporter::unwinding`] (a panic answers EIO and aborts the journal).
    fn guarded(&self, op: &'static str, handler: impl FnOnce()) {
        let _counted = self.config.request_stats.begin(op);
        self.report.unwinding(op, handler);
    }

    /// The errno a failed request answers ([`Reporter::errno`]).
    fn errno(&self, err: FsError) -> Errno {
        self.report.errno(err)
    }

    fn log_abort_once(&self) {
        self.report.log_abort_once();
    }

    /// An fsync or fsyncdir request: runs where [`fsync_waiters`] puts it, this request
    /// thread or a waiter, under the same guard as every request.
    fn fsync_request(&self, op: &'static str, ino: INodeNo, datasync: bool, reply: ReplyEmpty) {
        let counted = self.config.request_stats.begin(op);
        let (fs, report) = (self.fs.clone(), self.report.clone());
        self.fsyncs.run(move || {
            let _counted = counted;
            report.clone().unwinding(op, move || {
                let ino = match from_fuse(ino) {
                    Ok(ino) => ino,
                    Err(e) => return reply.error(e),
                };
                match fs.fsync(ino, datasync) {
                    Ok(()) => reply.ok(),
                    Err(err) => reply.error(report.errno(err)),
                }
            });
        });
    }

    fn open_handle(&self, ino: u32) -> Result<FileHandle, FsError> {
        let slot = self.fs.open_inode(ino)?;
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.lock().insert(fh, slot);
        Ok(FileHandle(fh))
    }

    fn close_handle(&self, fh: FileHandle) -> Result<(), Errno> {
        let slot = self.handles.lock().remove(&fh.0).ok_or(Errno::EBADF)?;
        self.fs.close_inode(&slot).map_err(|e| self.errno(e))
    }

    /// Owner and group of a new inode in directory `parent`, and its mode: a set-group-ID
    /// directory hands its group down, and its set-group-ID bit to subdirectories (as
    /// `inode_init_owner` does; the kernel leaves this to a FUSE file system).
    fn new_owner(&self, req: &Request, parent: u32, mode: u16) -> Result<(u32, u32, u16), Errno> {
        let pattr = self.fs.getattr(parent).map_err(|e| self.errno(e))?;
        if pattr.mode & libc::S_ISGID as u16 == 0 {
            return Ok((req.uid(), req.gid(), mode));
        }
        let is_dir = mode & ext4::MODE_TYPE_MASK == ext4::MODE_DIR;
        let mode = if is_dir { mode | libc::S_ISGID as u16 } else { mode };
        Ok((req.uid(), pattr.gid, mode))
    }

    /// The mode `ino` must get before `req` writes, truncates or fallocates it, when that
    /// drops its set-user-ID or set-group-ID bit (see `privileges.rs`); `None` otherwise.
    /// `mode` (permission bits) is the one the request itself sets, if any.
    fn mode_dropping_privileges(
        &self,
        req: &Request,
        ino: u32,
        mode: Option<u16>,
    ) -> Result<Option<u16>, Errno> {
        let attr = self.fs.getattr(ino).map_err(|e| self.errno(e))?;
        let mode = mode.map_or(attr.mode, |m| (attr.mode & ext4::MODE_TYPE_MASK) | m);
        if mode & (libc::S_ISUID | libc::S_ISGID) as u16 == 0 {
            return Ok(None);
        }
        Ok(privileges::Caller::of(req).mode_after_change(mode, attr.gid).map(|m| m & 0o7777))
    }

    /// Drops what [`Self::mode_dropping_privileges`] says, and the file's capabilities, before
    /// a write or fallocate.
    fn drop_privileges(&self, req: &Request, ino: u32) -> Result<(), Errno> {
        if let Some(mode) = self.mode_dropping_privileges(req, ino, None)? {
            let set = SetAttr { mode: Some(mode), ..SetAttr::default() };
            self.fs.setattr(ino, &set).map_err(|e| self.errno(e))?;
        }
        self.drop_capabilities(ino)
    }

    /// Removes `security.capability` from `ino` where quill kills privileges
    /// (`kills_privileges`; otherwise the kernel asks and removes it itself): a write,
    /// truncate, fallocate or chown takes a file's capabilities away, as
    /// `cap_inode_killpriv` does for ext4.
    fn drop_capabilities(&self, ino: u32) -> Result<(), Errno> {
        if !self.kills_privileges {
            return Ok(());
        }
        match self.fs.getxattr(ino, privileges::CAPABILITY) {
            Err(FsError::NoData) => Ok(()),
            Err(err) => Err(self.errno(err)),
            Ok(_) => match self.fs.removexattr(ino, privileges::CAPABILITY) {
                Ok(()) | Err(FsError::NoData) => Ok(()),
                Err(err) => Err(self.errno(err)),
            },
        }
    }

    /// Walks directory `ino` from cookie `offset` in batches, handing each entry to `add` until
    /// it says the reply is full (`Ok(true)`) or the directory ends. The kernel resumes at the
    /// cookie of the last entry it kept, so an entry that did not fit comes again in the next
    /// call.
    fn list_from(
        &self,
        ino: u32,
        offset: u64,
        mut add: impl FnMut(&fs::DirEntry) -> Result<bool, Errno>,
    ) -> Result<(), Errno> {
        let mut cookie = offset;
        loop {
            let entries = self.fs.readdir(ino, cookie, READDIR_BATCH).map_err(|e| self.errno(e))?;
            if entries.is_empty() {
                return Ok(());
            }
            for entry in &entries {
                if add(entry)? {
                    return Ok(());
                }
                cookie = entry.next_cookie;
            }
        }
    }

    fn reply_entry(&self, reply: ReplyEntry, result: Result<Attr, FsError>) {
        match result {
            Ok(attr) => reply.entry_with_ttls(
                &self.config.timeouts.attr,
                &self.config.timeouts.entry,
                &file_attr(&attr),
                Generation(attr.generation.into()),
            ),
            Err(err) => reply.error(self.errno(err)),
        }
    }
}

/// Applies `umask` to `mode` (the kernel already did unless the file system asked it not to;
/// masking twice changes nothing).
/// The mode a create request asks for. The umask comes apart (FUSE_DONT_MASK): the library
/// applies it, or the directory's default ACL instead (`fs` crate, `acl.rs`).
fn unmasked(mode: u32) -> u16 {
    (mode & 0o177777) as u16
}

/// The request's umask (permission bits).
fn umask16(umask: u32) -> u16 {
    (umask & 0o777) as u16
}

fn kind_of_mode(mode: u16) -> FileType {
    match mode & ext4::MODE_TYPE_MASK {
        ext4::MODE_DIR => FileType::Directory,
        ext4::MODE_SYMLINK => FileType::Symlink,
        ext4::MODE_CHRDEV => FileType::CharDevice,
        ext4::MODE_BLKDEV => FileType::BlockDevice,
        ext4::MODE_FIFO => FileType::NamedPipe,
        ext4::MODE_SOCKET => FileType::Socket,
        _ => FileType::RegularFile,
    }
}

fn kind_of_dirent(file_type: u8) -> Option<FileType> {
    Some(match file_type {
        ext4dir::FT_REG_FILE => FileType::RegularFile,
        ext4dir::FT_DIR => FileType::Directory,
        ext4dir::FT_CHRDEV => FileType::CharDevice,
        ext4dir::FT_BLKDEV => FileType::BlockDevice,
        ext4dir::FT_FIFO => FileType::NamedPipe,
        ext4dir::FT_SOCK => FileType::Socket,
        ext4dir::FT_SYMLINK => FileType::Symlink,
        _ => return None,
    })
}

/// An ext4 timestamp as a `SystemTime` (before the epoch too).
pub fn system_time(ts: Timestamp) -> SystemTime {
    let nanos = Duration::from_nanos(u64::from(ts.nsec.min(999_999_999)));
    let t = if ts.sec >= 0 {
        UNIX_EPOCH.checked_add(Duration::from_secs(ts.sec as u64))
    } else {
        UNIX_EPOCH.checked_sub(Duration::from_secs(ts.sec.unsigned_abs()))
    };
    t.and_then(|t| t.checked_add(nanos)).unwrap_or(UNIX_EPOCH)
}

/// A `SystemTime` as an ext4 timestamp (the inverse of [`system_time`]).
pub fn timestamp(t: SystemTime) -> Timestamp {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timestamp { sec: d.as_secs() as i64, nsec: d.subsec_nanos() },
        Err(before) => {
            let d = before.duration();
            let (mut sec, mut nsec) = (-(d.as_secs() as i64), d.subsec_nanos());
            if nsec > 0 {
                sec -= 1;
                nsec = 1_000_000_000 - nsec;
            }
            Timestamp { sec, nsec }
        }
    }
}

fn time_or_now(t: TimeOrNow) -> Timestamp {
    match t {
        TimeOrNow::SpecificTime(t) => timestamp(t),
        TimeOrNow::Now => timestamp(SystemTime::now()),
    }
}

/// What a negative LOOKUP reply carries: node 0, which tells the kernel the name is absent.
fn absent_entry() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

/// The attributes FUSE sends for `attr`.
pub fn file_attr(attr: &Attr) -> FileAttr {
    FileAttr {
        ino: to_fuse(attr.ino),
        size: attr.size,
        blocks: attr.blocks,
        atime: system_time(attr.atime),
        mtime: system_time(attr.mtime),
        ctime: system_time(attr.ctime),
        crtime: system_time(attr.crtime),
        kind: kind_of_mode(attr.mode),
        perm: attr.mode & 0o7777,
        nlink: attr.nlink,
        uid: attr.uid,
        gid: attr.gid,
        rdev: attr.rdev,
        blksize: attr.block_size,
        flags: 0,
    }
}

/// Unwraps an inode number from FUSE or replies with the error and returns.
macro_rules! ino {
    ($ino:expr, $reply:expr) => {
        match from_fuse($ino) {
            Ok(ino) => ino,
            Err(e) => return $reply.error(e),
        }
    };
}

impl fuser::Filesystem for QuillFuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // ext4 keeps nanoseconds.
        let _ = config.set_time_granularity(Duration::from_nanos(1));
        // File handles (name_to_handle_at, NFS export) that outlive the kernel's caches and a
        // remount: the node id is the inode number and the generation ext4's i_generation, and
        // the kernel decodes a handle whose inode it no longer caches by a LOOKUP of "." in
        // it (see `lookup`).
        let _ = config.add_capabilities(fuser::InitFlags::FUSE_EXPORT_SUPPORT);
        // lsattr on directories too (see `ioctl`).
        let _ = config.add_capabilities(fuser::InitFlags::FUSE_HAS_IOCTL_DIR);
        // Create requests carry the umask apart from the mode: a directory's default ACL
        // replaces it (posix_acl_create), which only the file system can know.
        let _ = config.add_capabilities(fuser::InitFlags::FUSE_DONT_MASK);
        if self.config.writeback_cache && !self.fs.is_read_only() {
            // The kernel keeps written pages and the file's size and times itself and sends
            // them later: WRITE requests at writeback, fsync and close (FUSE_WRITE_CACHE), and
            // the times in a SETATTR before fsync's FSYNC. It may READ a page through a
            // write-only handle to fill a partial write (quill's reads do not look at the
            // handle), and it keeps its own idea of the size while it holds dirty pages.
            // fsync still reaches quill only after the pages it covers did. (sync(2) makes
            // nothing durable on a FUSE mount either way: the kernel sends FUSE_SYNCFS to
            // virtiofs only. The README says so.)
            if config.add_capabilities(fuser::InitFlags::FUSE_WRITEBACK_CACHE).is_err() {
                log::warn!("the kernel has no FUSE writeback cache; writes go through");
            }
        }
        if !self.config.killpriv_in_kernel && !self.fs.is_read_only() {
            // quill drops set-id bits and file capabilities itself (`privileges.rs`); the
            // kernel then skips its GETXATTR of security.capability before each write.
            self.kills_privileges =
                config.add_capabilities(fuser::InitFlags::FUSE_HANDLE_KILLPRIV_V2).is_ok();
        }
        let plus = match self.config.readdirplus {
            Readdirplus::Off => fuser::InitFlags::empty(),
            Readdirplus::On => fuser::InitFlags::FUSE_DO_READDIRPLUS,
            Readdirplus::Auto => {
                fuser::InitFlags::FUSE_DO_READDIRPLUS | fuser::InitFlags::FUSE_READDIRPLUS_AUTO
            }
        };
        if !plus.is_empty() && config.add_capabilities(plus).is_err() {
            log::warn!("the kernel has no FUSE readdirplus; listings carry names only");
        }
        if self.config.parallel_dirops
            && config.add_capabilities(fuser::InitFlags::FUSE_PARALLEL_DIROPS).is_err()
        {
            log::warn!("the kernel has no FUSE parallel directory operations");
        }
        if self.fs.options().acl {
            // POSIX ACLs as ext4 mounted `acl`: the kernel reads them with getxattr and
            // enforces them (with default_permissions), and hands chmod's mask update and
            // setfacl to setxattr; quill stores them in ext4's encoding and keeps the mode in
            // step (`fs` crate, `acl.rs`).
            let _ = config.add_capabilities(fuser::InitFlags::FUSE_POSIX_ACL);
        }
        Ok(())
    }

    /// The session is over (unmounted): close what the kernel left open (an unlinked file
    /// open at unmount is freed now instead of staying an orphan) and make everything durable.
    /// The owner then unmounts the file system ([`unmount_fs`]).
    fn destroy(&mut self) {
        // Fsyncs still waiting on waiter threads answer first.
        self.fsyncs.wait_idle();
        if let Some(flusher) = self.flusher.take() {
            flusher.stop();
        }
        let open: Vec<Arc<InodeSlot>> = self.handles.lock().drain().map(|(_, s)| s).collect();
        for slot in open {
            if let Err(err) = self.fs.close_inode(&slot) {
                log::error!("closing an inode left open at unmount: {err}");
            }
        }
        // A journal that aborted in the background (commit or checkpoint I/O) with no request
        // to meet it is reported here at the latest.
        self.log_abort_once();
        if !self.fs.is_read_only() {
            if let Err(err) = self.fs.sync() {
                log::error!("sync at unmount: {err}");
            }
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.guarded("lookup", move || {
            if let Some(trigger) = &self.config.test_trigger {
                if trigger.name == name.as_bytes() {
                    (trigger.action)();
                }
            }
            let parent = ino!(parent, reply);
            if name.as_bytes() == b"." {
                // Only the kernel's handle decoding asks for "." (path walks never send it),
                // of any inode, a regular file too; ENOENT becomes ESTALE there.
                return self.reply_entry(reply, self.fs.lookup_by_number(parent));
            }
            match self.fs.lookup(parent, name.as_bytes()) {
                // A negative entry: node 0 with a timeout (`fuse_lookup_name`), which the
                // kernel keeps as a negative dentry until it expires or the name is created
                // through the mount.
                Err(FsError::NotFound) if !self.config.timeouts.negative.is_zero() => reply
                    .entry_with_ttls(
                        &Duration::ZERO,
                        &self.config.timeouts.negative,
                        &absent_entry(),
                        Generation(0),
                    ),
                result => self.reply_entry(reply, result),
            }
        })
    }

    // forget: the default no-op; the file system caches inodes itself and evicts them when
    // nothing refers to them.

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.guarded("getattr", move || {
            let ino = ino!(ino, reply);
            match self.fs.getattr(ino) {
                Ok(attr) => reply.attr(&self.config.timeouts.attr, &file_attr(&attr)),
                Err(err) => reply.error(self.errno(err)),
            }
        })
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.guarded("setattr", move || {
            let ino = ino!(ino, reply);
            let mut mode = mode.map(|m| (m & 0o7777) as u16);
            if size.is_some() {
                // A truncate drops set-id bits as a write does; the kernel may send the mode
                // its own, older rule left in the same request.
                match self.mode_dropping_privileges(req, ino, mode) {
                    Ok(Some(dropped)) => mode = Some(dropped),
                    Ok(None) => {}
                    Err(e) => return reply.error(e),
                }
            }
            // A chown: with FUSE_HANDLE_KILLPRIV_V2 the kernel sends the new owner without the
            // mode its own rule would drop (and chown(-1, -1), which still drops set-id bits,
            // as a SETATTR of nothing). quill applies `chown_common`'s rule.
            let nothing = mode.is_none()
                && size.is_none()
                && atime.is_none()
                && mtime.is_none()
                && ctime.is_none();
            let chown = uid.is_some() || gid.is_some() || nothing;
            if self.kills_privileges && (size.is_some() || chown) {
                let attr = match self.fs.getattr(ino) {
                    Ok(attr) => attr,
                    Err(err) => return reply.error(self.errno(err)),
                };
                if chown && mode.is_none() {
                    let caller = privileges::Caller::of(req);
                    if let Some(dropped) = caller.mode_after_chown(attr.mode, attr.gid) {
                        mode = Some(dropped & 0o7777);
                    }
                }
                if attr.mode & ext4::MODE_TYPE_MASK != ext4::MODE_DIR {
                    if let Err(e) = self.drop_capabilities(ino) {
                        return reply.error(e);
                    }
                }
            }
            let now = |t: &Option<TimeOrNow>| !matches!(t, Some(TimeOrNow::SpecificTime(_)));
            let set = SetAttr {
                mode,
                uid,
                gid,
                size,
                atime: atime.map(time_or_now),
                mtime: mtime.map(time_or_now),
                times_to_now: now(&atime) && now(&mtime),
            };
            match self.fs.setattr(ino, &set) {
                Ok(attr) => reply.attr(&self.config.timeouts.attr, &file_attr(&attr)),
                Err(err) => reply.error(self.errno(err)),
            }
        })
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.guarded("readlink", move || {
            let ino = ino!(ino, reply);
            match self.fs.readlink(ino) {
                Ok(target) => reply.data(&target),
                Err(err) => reply.error(self.errno(err)),
            }
        })
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.guarded("mknod", move || {
            let parent = ino!(parent, reply);
            let (uid, gid, mode) = match self.new_owner(req, parent, unmasked(mode)) {
                Ok(owner) => owner,
                Err(e) => return reply.error(e),
            };
            let made = self.fs.mknod_umask(
                parent,
                name.as_bytes(),
                mode,
                rdev,
                (uid, gid),
                umask16(umask),
            );
            self.reply_entry(reply, made);
        })
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        self.guarded("mkdir", move || {
            let parent = ino!(parent, reply);
            let mode = ext4::MODE_DIR | (unmasked(mode) & 0o7777);
            let (uid, gid, mode) = match self.new_owner(req, parent, mode) {
                Ok(owner) => owner,
                Err(e) => return reply.error(e),
            };
            let made = self.fs.mkdir_umask(
                parent,
                name.as_bytes(),
                mode & 0o7777,
                (uid, gid),
                umask16(umask),
            );
            self.reply_entry(reply, made);
        })
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.guarded("unlink", move || {
            let parent = ino!(parent, reply);
            match self.fs.unlink(parent, name.as_bytes()) {
                Ok(()) => reply.ok(),
                Err(err) => reply.error(self.errno(err)),
            }
        })
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.guarded("rmdir", move || {
            let parent = ino!(parent, reply);
            match self.fs.rmdir(parent, name.as_bytes()) {
                Ok(()) => reply.ok(),
                Err(err) => reply.error(self.errno(err)),
            }
        })
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.guarded("symlink", move || {
            let parent = ino!(parent, reply);
            let (uid, gid, _) = match self.new_owner(req, parent, ext4::MODE_SYMLINK | 0o777) {
                Ok(owner) => owner,
                Err(e) => return reply.error(e),
            };
            let target = target.as_os_str().as_bytes();
            self.reply_entry(
                reply,
                self.fs.symlink(parent, link_name.as_bytes(), target, uid, gid),
            );
        })
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.guarded("rename", move || {
            let parent = ino!(parent, reply);
            let newparent = ino!(newparent, reply);
            let known = fuser::RenameFlags::RENAME_NOREPLACE
                | fuser::RenameFlags::RENAME_EXCHANGE
                | fuser::RenameFlags::RENAME_WHITEOUT;
            if !known.contains(flags) {
                return reply.error(Errno::EINVAL);
            }
            // The whiteout is owned as a new node in the old directory would be (the caller,
            // or the directory's group where it is set-group-ID), as ext4's is.
            let whiteout = if flags.contains(fuser::RenameFlags::RENAME_WHITEOUT) {
                match self.new_owner(req, parent, ext4::MODE_CHRDEV) {
                    Ok((uid, gid, _)) => Some((uid, gid)),
                    Err(e) => return reply.error(e),
                }
            } else {
                None
            };
            let flags = RenameFlags {
                noreplace: flags.contains(fuser::RenameFlags::RENAME_NOREPLACE),
                exchange: flags.contains(fuser::RenameFlags::RENAME_EXCHANGE),
                whiteout,
            };
            match self.fs.rename(parent, name.as_bytes(), newparent, newname.as_bytes(), flags) {
                Ok(()) => reply.ok(),
                Err(err) => reply.error(self.errno(err)),
            }
        })
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.guarded("link", move || {
            let ino = ino!(ino, reply);
            let newparent = ino!(newparent, reply);
            self.reply_entry(reply, self.fs.link(ino, newparent, newname.as_bytes()));
        })
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.guarded("open", move || {
            let ino = ino!(ino, reply);
            // What the kernel's `may_open` checks of immutable and append-only inodes, which
            // it does not make for a FUSE inode.
            let intent = fs::OpenIntent {
                write: flags.0 & libc::O_ACCMODE != libc::O_RDONLY,
                append: flags.0 & libc::O_APPEND != 0,
                truncate: flags.0 & libc::O_TRUNC != 0,
            };
            if let Err(err) = self.fs.check_open(ino, intent) {
                return reply.error(self.errno(err));
            }
            match self.open_handle(ino) {
                Ok(fh) => reply.opened(fh, self.open_flags()),
                Err(err) => reply.error(self.errno(err)),
            }
        })
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.guarded("read", move || {
            let ino = ino!(ino, reply);
            let mut buf = vec![0u8; size as usize];
            match self.fs.read(ino, offset, &mut buf) {
                Ok(n) => reply.data(&buf[..n]),
                Err(err) => reply.error(self.errno(err)),
            }
        })
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.guarded("write", move || {
            let ino = ino!(ino, reply);
            if let Err(e) = self.drop_privileges(req, ino) {
                return reply.error(e);
            }
            match self.fs.write(ino, offset, data) {
                // A write request is at most max_write (16 MiB), so the count fits.
                Ok(n) => reply.written(n as u32),
                Err(err) => reply.error(self.errno(err)),
            }
        })
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.guarded("flush", move || {
            // Writes reach the file system before their request is answered: close has nothing
            // left to push. ENOSYS tells the kernel so for good (`fc->no_flush`): it answers
            // every later close itself, with success, instead of a round trip here per close
            // (a fifth of varmail's requests). POSIX locks are the kernel's own (no lock
            // handlers), so no lock waits for a flush to be released.
            reply.error(Errno::ENOSYS);
        })
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.guarded("release", move || match self.close_handle(fh) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        })
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.fsync_request("fsync", ino, datasync, reply);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.guarded("opendir", move || {
            // Directory streams are stateless: readdir cookies are stable across changes.
            let ino = ino!(ino, reply);
            match self.fs.getattr(ino) {
                Ok(attr) if attr.mode & ext4::MODE_TYPE_MASK == ext4::MODE_DIR => {
                    reply.opened(FileHandle(0), FopenFlags::empty())
                }
                Ok(_) => reply.error(Errno::ENOTDIR),
                Err(err) => reply.error(self.errno(err)),
            }
        })
    }

    /// A listing with each entry's attributes (see [`Readdirplus`]): the same entries and
    /// cookies as `readdir`. An entry whose inode went away between the listing and its
    /// attributes (an unlink racing the listing) is left out, as if listed a moment later.
    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: fuser::ReplyDirectoryPlus,
    ) {
        self.guarded("readdirplus", move || {
            let ino = ino!(ino, reply);
            let listed = self.list_from(ino, offset, |entry| {
                let attr = match self.fs.getattr(entry.ino) {
                    Ok(attr) => attr,
                    Err(FsError::NotFound) => return Ok(false),
                    Err(err) => return Err(self.errno(err)),
                };
                let name = OsStr::from_bytes(&entry.name);
                let generation = Generation(attr.generation.into());
                let (fuse_ino, attr) = (to_fuse(entry.ino), file_attr(&attr));
                let ttl = self.config.timeouts.both();
                Ok(reply.add(fuse_ino, entry.next_cookie, name, &ttl, &attr, generation))
            });
            match listed {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        })
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.guarded("readdir", move || {
            let ino = ino!(ino, reply);
            let listed = self.list_from(ino, offset, |entry| {
                let kind = match kind_of_dirent(entry.file_type) {
                    Some(kind) => kind,
                    // No filetype feature: ask the inode.
                    None => match self.fs.getattr(entry.ino) {
                        Ok(attr) => kind_of_mode(attr.mode),
                        Err(err) => return Err(self.errno(err)),
                    },
                };
                let name = OsStr::from_bytes(&entry.name);
                Ok(reply.add(to_fuse(entry.ino), entry.next_cookie, kind, name))
            });
            match listed {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        })
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.guarded("releasedir", move || {
            reply.ok();
        })
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.fsync_request("fsyncdir", ino, datasync, reply);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.guarded("statfs", move || {
            let s = self.fs.statfs();
            reply.statfs(
                s.blocks,
                s.blocks_free,
                s.blocks_available,
                s.inodes,
                s.inodes_free,
                s.block_size,
                s.name_max,
                s.block_size,
            );
        })
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        position: u32,
        reply: ReplyEmpty,
    ) {
        self.guarded("setxattr", move || {
            let ino = ino!(ino, reply);
            if position != 0 {
                // Resource forks (macOS only).
                return reply.error(Errno::EINVAL);
            }
            let mode = match flags {
                0 => SetMode::Any,
                libc::XATTR_CREATE => SetMode::Create,
                libc::XATTR_REPLACE => SetMode::Replace,
                _ => return reply.error(Errno::EINVAL),
            };
            match self.fs.setxattr(ino, name.as_bytes(), value, mode) {
                Ok(()) => reply.ok(),
                Err(err) => reply.error(self.errno(err)),
            }
        })
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.guarded("getxattr", move || {
            let ino = ino!(ino, reply);
            match self.fs.getxattr(ino, name.as_bytes()) {
                Ok(value) => reply_sized(reply, &value, size),
                Err(err) => reply.error(self.errno(err)),
            }
        })
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.guarded("listxattr", move || {
            let ino = ino!(ino, reply);
            match self.fs.listxattr(ino) {
                Ok(names) => {
                    let mut list = Vec::new();
                    for name in &names {
                        list.extend_from_slice(name);
                        list.push(0);
                    }
                    reply_sized(reply, &list, size)
                }
                Err(err) => reply.error(self.errno(err)),
            }
        })
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.guarded("removexattr", move || {
            let ino = ino!(ino, reply);
            match self.fs.removexattr(ino, name.as_bytes()) {
                Ok(()) => reply.ok(),
                Err(err) => reply.error(self.errno(err)),
            }
        })
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        self.guarded("create", move || {
            let parent = ino!(parent, reply);
            let (uid, gid, mode) = match self.new_owner(req, parent, unmasked(mode)) {
                Ok(owner) => owner,
                Err(e) => return reply.error(e),
            };
            let mode = ext4::MODE_REGULAR | (mode & 0o7777);
            let made =
                self.fs.mknod_umask(parent, name.as_bytes(), mode, 0, (uid, gid), umask16(umask));
            let attr = match made {
                Ok(attr) => attr,
                Err(err) => return reply.error(self.errno(err)),
            };
            match self.open_handle(attr.ino) {
                Ok(fh) => reply.created(
                    &self.config.timeouts.both(),
                    &file_attr(&attr),
                    Generation(attr.generation.into()),
                    fh,
                    FopenFlags::empty(),
                ),
                Err(err) => reply.error(self.errno(err)),
            }
        })
    }

    /// The inode-flag ioctls, which the kernel's FUSE module sends for lsattr, chattr and
    /// xfs_io (`fuse_fileattr_get/set`) after its own checks of the caller (owner or
    /// CAP_FOWNER, CAP_LINUX_IMMUTABLE for `i` and `a`), which the library makes again with the
    /// request's uid: FS_IOC_GETFLAGS and FS_IOC_SETFLAGS (a 4-byte value, either encoding of
    /// the command), FS_IOC_FSGETXATTR and FS_IOC_FSSETXATTR (`struct fsxattr`); what each flag
    /// does is `fs::inode_flags`'s table. FS_IOC_GETVERSION (`lsattr -v`) answers the inode's
    /// generation; FS_IOC_SETVERSION is ENOTTY, as ext4 answers it with metadata_csum (the
    /// generation seeds the inode's checksum; without metadata_csum ext4 would set it). Other
    /// ioctls are ENOTTY, as for a file system without them.
    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        /// FS_IOC_GETFLAGS, FS_IOC_SETFLAGS (`_IOR/_IOW('f', 1|2, long)`) and their 32-bit
        /// forms; FS_IOC_FSGETXATTR and FS_IOC_FSSETXATTR (`_IOR/_IOW('X', 31|32, struct
        /// fsxattr)`).
        const GETFLAGS: [u32; 2] = [0x8008_6601, 0x8004_6601];
        const SETFLAGS: [u32; 2] = [0x4008_6602, 0x4004_6602];
        const FSGETXATTR: u32 = 0x801C_581F;
        const FSSETXATTR: u32 = 0x401C_5820;
        /// FS_IOC_GETVERSION (`_IOR('v', 1, long)`, and its 32-bit form): `lsattr -v`.
        const GETVERSION: [u32; 2] = [0x8008_7601, 0x8004_7601];
        self.guarded("ioctl", move || {
            let ino = ino!(ino, reply);
            let answer = |bytes: &[u8]| -> Vec<u8> {
                bytes[..(out_size as usize).min(bytes.len())].to_vec()
            };
            let result = match cmd {
                c if GETFLAGS.contains(&c) => {
                    self.fs.inode_flags(ino).map(|flags| answer(&flags.to_ne_bytes()))
                }
                c if SETFLAGS.contains(&c) => match in_data.get(..4) {
                    Some(word) => {
                        let flags = u32::from_ne_bytes(word.try_into().expect("4 bytes"));
                        self.fs.set_inode_flags(ino, flags, req.uid()).map(|_| Vec::new())
                    }
                    None => return reply.error(Errno::EINVAL),
                },
                FSGETXATTR => self.fs.fsxattr(ino).map(|fsx| answer(&fsx.encode())),
                // The inode's generation, as ext4 answers EXT4_IOC_GETVERSION.
                c if GETVERSION.contains(&c) => {
                    self.fs.getattr(ino).map(|attr| answer(&attr.generation.to_ne_bytes()))
                }
                FSSETXATTR => match ondisk::ext4::iflags::FsXattr::decode(in_data) {
                    Some(fsx) => self.fs.set_fsxattr(ino, &fsx, req.uid()).map(|_| Vec::new()),
                    None => return reply.error(Errno::EINVAL),
                },
                _ => return reply.error(Errno::ENOTTY),
            };
            match result {
                Ok(bytes) => reply.ioctl(0, &bytes),
                Err(err) => reply.error(self.errno(err)),
            }
        })
    }

    /// SEEK_DATA and SEEK_HOLE (the kernel answers SEEK_SET, SEEK_CUR and SEEK_END itself and
    /// sends only these), from the extent map and the cached writes (`fs::SeekTarget`).
    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        self.guarded("lseek", move || {
            let ino = ino!(ino, reply);
            let target = match whence {
                libc::SEEK_DATA => fs::SeekTarget::Data,
                libc::SEEK_HOLE => fs::SeekTarget::Hole,
                _ => return reply.error(Errno::EINVAL),
            };
            let Ok(offset) = u64::try_from(offset) else { return reply.error(Errno::ENXIO) };
            match self.fs.seek_data_hole(ino, offset, target) {
                Ok(at) => reply.offset(at as i64),
                Err(err) => reply.error(self.errno(err)),
            }
        })
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.guarded("fallocate", move || {
            let ino = ino!(ino, reply);
            let mode = match mode {
                0 => FallocateMode::Allocate,
                libc::FALLOC_FL_KEEP_SIZE => FallocateMode::KeepSize,
                m if m == libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE => {
                    FallocateMode::PunchHole
                }
                libc::FALLOC_FL_ZERO_RANGE => FallocateMode::ZeroRange { keep_size: false },
                m if m == libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE => {
                    FallocateMode::ZeroRange { keep_size: true }
                }
                // COLLAPSE_RANGE, INSERT_RANGE, PUNCH_HOLE without KEEP_SIZE (which Linux
                // rejects as EOPNOTSUPP too).
                _ => return reply.error(Errno::EOPNOTSUPP),
            };
            // ext4_fallocate's file_modified: set-id bits go as on write.
            if let Err(e) = self.drop_privileges(req, ino) {
                return reply.error(e);
            }
            match self.fs.fallocate(ino, mode, offset, length) {
                Ok(()) => reply.ok(),
                Err(err) => reply.error(self.errno(err)),
            }
        })
    }
}

/// getxattr/listxattr's size protocol: a size-0 request asks for the length; a buffer too
/// small for the value is ERANGE.
fn reply_sized(reply: ReplyXattr, value: &[u8], size: u32) {
    if size == 0 {
        reply.size(value.len() as u32);
    } else if value.len() > size as usize {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inode_numbers_swap_the_two_roots() {
        assert_eq!(to_fuse(ROOT_INO), INodeNo::ROOT);
        assert_eq!(from_fuse(INodeNo::ROOT), Ok(ROOT_INO));
        for ino in [1u32, 3, 11, 12, 4096, u32::MAX] {
            assert_eq!(from_fuse(to_fuse(ino)), Ok(ino), "inode {ino}");
        }
        assert_eq!(from_fuse(INodeNo(u64::from(u32::MAX) + 1)), Err(Errno::ENOENT));
    }

    #[test]
    fn timestamps_round_trip_before_and_after_the_epoch() {
        for ts in [
            Timestamp { sec: 0, nsec: 0 },
            Timestamp { sec: 1_700_000_000, nsec: 123_456_789 },
            Timestamp { sec: -1, nsec: 999_999_999 },
            Timestamp { sec: -86_400, nsec: 1 },
        ] {
            assert_eq!(timestamp(system_time(ts)), ts);
        }
    }

    #[test]
    fn umask_is_applied_once() {
        assert_eq!(unmasked(0o100666), 0o100666);
        assert_eq!(umask16(0o022), 0o022);
    }
}
