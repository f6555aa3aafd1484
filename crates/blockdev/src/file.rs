//! A block device on a regular file or a Linux block device node.
//!
//! Two I/O paths, both durable (every primitive below ends in `RWF_DSYNC` or `fdatasync`):
//! - buffered (the default, [`IoMode::Buffered`]): writes go through the host page cache and
//!   `fdatasync` writes back whatever the cache holds dirty for the image;
//! - direct ([`IoMode::Direct`], or [`IoMode::Auto`] where the file system takes O_DIRECT):
//!   writes reach the device when they complete, `flush` is only the device's cache flush, and
//!   quill's own caches serve reads.
//!
//! Buffered is the default because it measured faster: varmail-shared on this project's
//! 2-core VM disk, direct ran at 0.5-0.7x of buffered from 1 to 32 threads (probe
//! write+fdatasync p50 233 us). quill's writeback issues one synchronous data write per file,
//! each paying the device's latency under O_DIRECT (about 200 us against 47 us into the page
//! cache), on the fsync's critical path; the page cache batches them into one writeback at the
//! flush. Direct becomes the better default once writeback batches its data writes into one
//! `write_batch` (see the issue notes). The four durability primitives map onto the kernel as
//! follows:
//!
//! | primitive      | system call                                                              |
//! |----------------|--------------------------------------------------------------------------|
//! | `read_at`      | `pread`, looped until the buffer is full                                 |
//! | `write_at`     | `pwritev2`, looped until everything is written                           |
//! | `write_fua_at` | `pwritev2(RWF_DSYNC)`; if the kernel lacks it, `pwritev2` + `fdatasync`  |
//! | `flush`        | `fdatasync`, and nothing else                                            |
//! | `write_batch`  | adjacent writes merged into runs; one run: `pwritev2` from the caller; several: one `IORING_OP_WRITEV` each (FUA: `RWF_DSYNC` in `rw_flags`), or `pwritev2` from a persistent thread pool where io_uring cannot be set up |
//!
//! Which I/O path a device uses ([`IoMode`], [`FileDevice::io_path`]):
//!
//! | asked for  | file system             | path                                                  |
//! |------------|-------------------------|-------------------------------------------------------|
//! | `Auto`     | takes 512-byte O_DIRECT | direct                                                |
//! | `Auto`     | tmpfs / ramfs           | buffered: the page cache is the storage itself        |
//! | `Auto`     | refuses O_DIRECT        | buffered, and the reason is reported                  |
//! | `Auto`     | read-only open          | buffered: nothing to make durable, the cache helps reads |
//! | `Direct`   | any                     | direct, or the open fails                             |
//! | `Buffered` | any                     | buffered                                              |
//!
//! Buffered is as durable as direct; its flush writes back more, its writes return sooner.
//!
//! Invariants:
//! - a short read or write is continued, and one that makes no progress is an error: a call
//!   returns `Ok` only when every byte moved;
//! - every error names the op and the byte offset of the piece (run) that failed;
//! - with O_DIRECT the kernel requires memory aligned to the logical block size: caller memory
//!   aligned to [`DIRECT_ALIGN`] is used in place, other memory goes through aligned bounce
//!   buffers of at most [`BOUNCE_BYTES_MAX`]. Offsets and lengths are only checked against
//!   512-byte sectors; `Auto` checks at open that the file takes 512-byte direct I/O;
//! - the size is a multiple of [`SECTOR_SIZE`]: a trailing partial sector of a file is ignored;
//! - no call returns while the kernel or a pool thread may still read the caller's memory.

mod runs;
mod submit;

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

use parking_lot::Mutex;

use crate::aligned::AlignedBuf;
use crate::{check_range, BlockDevice, DeviceError, Op, Write, SECTOR_SIZE};

pub use crate::aligned::DIRECT_ALIGN;
pub use runs::{RUN_BYTES_MAX, RUN_PIECES_MAX};
pub use submit::RING_ENTRIES;

use runs::Staged;
use submit::{RingPool, ThreadPool};

/// Largest bounce buffer one O_DIRECT call allocates; larger I/O is done in pieces of this size
/// so that a huge request does not double its memory footprint.
pub const BOUNCE_BYTES_MAX: usize = RUN_BYTES_MAX;

/// Buffered batches of at most this many runs are written from the calling thread: a ring or
/// pool threads cost more than a few writes into the page cache take.
pub const BATCH_SEQUENTIAL_MAX: usize = 4;

/// Default number of threads (the caller included) a batch is written from without io_uring.
pub const PARALLELISM_DEFAULT: usize = 4;

/// Upper bound on `parallelism`: more threads than this only add scheduling overhead.
pub const PARALLELISM_MAX: usize = 64;

const _: () = assert!((DIRECT_ALIGN as u64).is_multiple_of(SECTOR_SIZE));

/// Whether the page cache is bypassed. See the module documentation's table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum IoMode {
    /// Direct where the file system takes it, buffered otherwise (and said so).
    Auto,
    /// O_DIRECT; opening fails where the file system refuses it.
    Direct,
    /// Through the host page cache (the default: see the module documentation).
    #[default]
    Buffered,
}

impl FromStr for IoMode {
    type Err = String;

    fn from_str(text: &str) -> Result<IoMode, String> {
        match text {
            "auto" => Ok(IoMode::Auto),
            "direct" => Ok(IoMode::Direct),
            "buffered" => Ok(IoMode::Buffered),
            _ => Err(format!("io={text}? (auto, direct or buffered)")),
        }
    }
}

/// How a batch of several runs is submitted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SubmitMode {
    /// io_uring where it can be set up, the thread pool otherwise.
    #[default]
    Auto,
    /// Always the thread pool (for measuring, and for testing the fallback).
    Threads,
}

/// How to open a [`FileDevice`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileOptions {
    /// Open read-only; writes fail with EROFS without reaching the kernel.
    pub read_only: bool,
    pub io: IoMode,
    pub submit: SubmitMode,
}

impl FileOptions {
    /// Read-only, every other choice the default.
    pub fn read_only() -> FileOptions {
        FileOptions { read_only: true, ..FileOptions::default() }
    }
}

/// The I/O path a device ended up with, and why; shown by `quill mount` and `quill bench`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IoPath {
    pub direct: bool,
    /// True when batches go through io_uring, false for the thread pool.
    pub uring: bool,
    /// Why buffered (when `Auto` fell back) or why no io_uring; empty when there is nothing to say.
    pub notes: Vec<String>,
}

impl fmt::Display for IoPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let io = if self.direct { "direct I/O" } else { "buffered I/O" };
        let submit = if self.uring { "io_uring" } else { "thread-pool" };
        write!(f, "{io}, {submit} submission")?;
        if !self.notes.is_empty() {
            write!(f, " ({})", self.notes.join("; "))?;
        }
        Ok(())
    }
}

/// A device backed by a file. See the module documentation.
#[derive(Debug)]
pub struct FileDevice {
    file: File,
    path: PathBuf,
    size_bytes: u64,
    options: FileOptions,
    io_path: IoPath,
    parallelism: usize,
    /// Set once `RWF_DSYNC` reported itself unsupported; FUA then uses a write + fdatasync.
    fua_emulated: AtomicBool,
    /// `Some` when batches go through io_uring.
    rings: Option<RingPool>,
    /// Started on the first batch that needs it.
    threads: OnceLock<ThreadPool>,
}

impl FileDevice {
    /// Opens an existing file or block device.
    pub fn open(path: impl AsRef<Path>, options: FileOptions) -> Result<FileDevice, DeviceError> {
        let path = path.as_ref();
        let (file, direct, mut notes) = open_file(path, options)?;
        let rings = match options.submit {
            SubmitMode::Threads => {
                notes.push("thread pool asked for".into());
                None
            }
            SubmitMode::Auto => match RingPool::new() {
                Ok(rings) => Some(rings),
                Err(e) => {
                    notes.push(format!("io_uring unavailable: {e}"));
                    None
                }
            },
        };
        let io_path = IoPath { direct, uring: rings.is_some(), notes };
        FileDevice::from_file(file, path, options, io_path, rings)
    }

    /// Creates (or truncates) a sparse file of `size_bytes` and opens it read-write, with the
    /// default options.
    pub fn create(path: impl AsRef<Path>, size_bytes: u64) -> Result<FileDevice, DeviceError> {
        FileDevice::create_with(path, size_bytes, FileOptions::default())
    }

    /// Creates (or truncates) a sparse file of `size_bytes` and opens it with `options`.
    pub fn create_with(
        path: impl AsRef<Path>,
        size_bytes: u64,
        options: FileOptions,
    ) -> Result<FileDevice, DeviceError> {
        assert!(
            size_bytes.is_multiple_of(SECTOR_SIZE),
            "device size {size_bytes} is not a multiple of {SECTOR_SIZE}"
        );
        assert!(!options.read_only, "creating a device read-only");
        let path = path.as_ref();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(|source| open_error(path, source))?;
        file.set_len(size_bytes).map_err(|source| open_error(path, source))?;
        drop(file);
        FileDevice::open(path, options)
    }

    fn from_file(
        mut file: File,
        path: &Path,
        options: FileOptions,
        io_path: IoPath,
        rings: Option<RingPool>,
    ) -> Result<FileDevice, DeviceError> {
        let meta = file.metadata().map_err(|source| open_error(path, source))?;
        let file_type = meta.file_type();
        let size_raw = if file_type.is_block_device() {
            // Seeking to the end of a block device node yields its size, as BLKGETSIZE64 does,
            // without an ioctl number that differs between architectures. The file position is
            // otherwise unused: all I/O is positional.
            file.seek(SeekFrom::End(0)).map_err(|source| open_error(path, source))?
        } else if file_type.is_file() {
            meta.len()
        } else {
            let source = io::Error::new(
                io::ErrorKind::InvalidInput,
                "neither a regular file nor a block device",
            );
            return Err(open_error(path, source));
        };
        Ok(FileDevice {
            file,
            path: path.to_path_buf(),
            size_bytes: size_raw - size_raw % SECTOR_SIZE,
            options,
            io_path,
            parallelism: PARALLELISM_DEFAULT,
            fua_emulated: AtomicBool::new(false),
            rings,
            threads: OnceLock::new(),
        })
    }

    /// Sets how many threads (the caller included) a batch is written from without io_uring;
    /// 1 writes every batch from the caller, one run after another, also with io_uring.
    pub fn with_parallelism(mut self, threads: usize) -> FileDevice {
        assert!(
            (1..=PARALLELISM_MAX).contains(&threads),
            "parallelism {threads} outside 1..={PARALLELISM_MAX}"
        );
        self.parallelism = threads;
        self
    }

    pub fn parallelism(&self) -> usize {
        self.parallelism
    }

    pub fn options(&self) -> FileOptions {
        self.options
    }

    /// Whether the page cache is bypassed (O_DIRECT).
    pub fn is_direct(&self) -> bool {
        self.io_path.direct
    }

    /// The I/O path in use and why.
    pub fn io_path(&self) -> &IoPath {
        &self.io_path
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `writes` (already range-checked) as merged runs.
    fn write_runs(&self, writes: &[Write<'_>]) -> Result<(), DeviceError> {
        if self.options.read_only {
            let first = writes.first().map(|w| (w.fua, w.offset));
            let (fua, offset) = first.unwrap_or((false, 0));
            let source = io::Error::from_raw_os_error(libc::EROFS);
            return Err(DeviceError::Io { op: write_op(fua), offset, source });
        }
        let staged: Vec<Staged<'_>> = runs::merge(writes)
            .into_iter()
            .map(|run| Staged::new(run, self.io_path.direct))
            .collect();
        // A few buffered writes are copies into the page cache: submitting them through a ring
        // (where ext4 punts buffered writes to io-wq workers) or to pool threads costs more
        // than writing them here (a writeback of 2-3 runs per fsync measured 0.18 ms more per
        // commit through the ring at 32 threads).
        let few_buffered = !self.io_path.direct && staged.len() <= BATCH_SEQUENTIAL_MAX;
        if staged.len() <= 1 || self.parallelism == 1 || few_buffered {
            return staged.iter().try_for_each(|run| self.write_run_from(run, 0));
        }
        if let Some(rings) = &self.rings {
            return self.write_runs_ring(rings, &staged);
        }
        self.write_runs_threads(&staged)
    }

    /// Writes `run` from byte `done` on with `pwritev2`, durably if it is FUA.
    fn write_run_from(&self, run: &Staged<'_>, done: usize) -> Result<(), DeviceError> {
        let io_error =
            |source| DeviceError::Io { op: write_op(run.fua), offset: run.offset, source };
        if !run.fua {
            return run.write_from(&self.file, done, 0).map_err(io_error);
        }
        if !self.fua_emulated.load(Ordering::Relaxed) {
            match run.write_from(&self.file, done, libc::RWF_DSYNC) {
                Ok(()) => return Ok(()),
                Err(e) if is_unsupported(&e) => self.fua_emulated.store(true, Ordering::Relaxed),
                Err(e) => return Err(io_error(e)),
            }
        }
        // Emulation: rewriting the whole run is harmless even if pwritev2 got partway, and
        // fdatasync makes it (and, as a side effect, earlier writes) durable.
        run.write_from(&self.file, 0, 0).map_err(io_error)?;
        self.file.sync_data().map_err(io_error)
    }

    fn write_runs_ring(&self, rings: &RingPool, staged: &[Staged<'_>]) -> Result<(), DeviceError> {
        let emulated = self.fua_emulated.load(Ordering::Relaxed);
        let flags = |run: &Staged<'_>| if run.fua && !emulated { libc::RWF_DSYNC } else { 0 };
        let outcomes = match rings.write(self.file.as_raw_fd(), staged, flags) {
            Ok(outcomes) => outcomes,
            // No ring could be had for this batch (e.g. out of locked memory): write it from
            // the caller rather than fail it.
            Err(_) => return staged.iter().try_for_each(|run| self.write_run_from(run, 0)),
        };
        // Runs in offset order: the first failure reported is the lowest-addressed one.
        for (run, outcome) in staged.iter().zip(outcomes) {
            match outcome {
                None => {}
                Some(res) if res < 0 => {
                    let e = io::Error::from_raw_os_error(-res);
                    if run.fua && is_unsupported(&e) {
                        self.fua_emulated.store(true, Ordering::Relaxed);
                        self.write_run_from(run, 0)?;
                    } else {
                        return Err(DeviceError::Io {
                            op: write_op(run.fua),
                            offset: run.offset,
                            source: e,
                        });
                    }
                }
                // A short write: finish it synchronously (RWF_DSYNC covers each part).
                Some(res) if (res as usize) < run.len => self.write_run_from(run, res as usize)?,
                Some(_) => {}
            }
        }
        // A run left unsubmitted follows a failed one, which returned above.
        Ok(())
    }

    fn write_runs_threads(&self, staged: &[Staged<'_>]) -> Result<(), DeviceError> {
        let pool = self.threads.get_or_init(|| ThreadPool::new(self.parallelism - 1));
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let first_error: Mutex<Option<(u64, DeviceError)>> = Mutex::new(None);
        pool.run(self.parallelism - 1, &|| {
            // Each thread claims the next unclaimed run; after a failure the rest are left
            // unsubmitted, as the sequential path would.
            while !failed.load(Ordering::Relaxed) {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(run) = staged.get(i) else { break };
                if let Err(e) = self.write_run_from(run, 0) {
                    failed.store(true, Ordering::Relaxed);
                    let mut first = first_error.lock();
                    // Keep the lowest-addressed failure, as the ring path reports.
                    if first.as_ref().is_none_or(|(offset, _)| run.offset < *offset) {
                        *first = Some((run.offset, e));
                    }
                }
            }
        });
        match first_error.into_inner() {
            Some((_, e)) => Err(e),
            None => Ok(()),
        }
    }
}

fn write_op(fua: bool) -> Op {
    if fua {
        Op::WriteFua
    } else {
        Op::Write
    }
}

/// Opens `path` as `options` ask; returns the file, whether it is O_DIRECT, and notes on why not.
fn open_file(path: &Path, options: FileOptions) -> Result<(File, bool, Vec<String>), DeviceError> {
    let open = |direct: bool| {
        let mut open = OpenOptions::new();
        open.read(true).write(!options.read_only);
        if direct {
            open.custom_flags(libc::O_DIRECT);
        }
        open.open(path).map_err(|source| open_error(path, source))
    };
    match options.io {
        IoMode::Buffered => Ok((open(false)?, false, vec!["buffered I/O asked for".into()])),
        IoMode::Direct => Ok((open(true)?, true, Vec::new())),
        IoMode::Auto if options.read_only => {
            let note = "read-only: the page cache serves reads".to_string();
            Ok((open(false)?, false, vec![note]))
        }
        IoMode::Auto => {
            let buffered = open(false)?;
            if is_memory_fs(&buffered) {
                let note = "tmpfs: the page cache is the storage".to_string();
                return Ok((buffered, false, vec![note]));
            }
            let direct = match open(true) {
                Ok(file) => file,
                Err(e) if e.errno() == libc::EINVAL => {
                    let note = "the file system refuses O_DIRECT".to_string();
                    return Ok((buffered, false, vec![note]));
                }
                Err(e) => return Err(e),
            };
            match direct_sector_read(&direct) {
                Ok(()) => Ok((direct, true, Vec::new())),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    let note = "512-byte O_DIRECT refused (larger logical blocks)".to_string();
                    Ok((buffered, false, vec![note]))
                }
                Err(source) => Err(open_error(path, source)),
            }
        }
    }
}

/// `RAMFS_MAGIC` of linux/magic.h, which the libc crate does not export.
const RAMFS_MAGIC: libc::c_long = 0x8584_58f6;

/// Whether `file` lives on tmpfs or ramfs, where the page cache is the file's only copy.
fn is_memory_fs(file: &File) -> bool {
    // SAFETY: statfs is plain data, filled in by the kernel on success.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a valid pointer to a statfs.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut stat) } != 0 {
        return false;
    }
    stat.f_type == libc::TMPFS_MAGIC || stat.f_type == RAMFS_MAGIC
}

/// One sector read with O_DIRECT at offset 0: fails with EINVAL where the device's logical
/// blocks are larger than a sector. (Past the end of an empty file it reads nothing.)
fn direct_sector_read(file: &File) -> io::Result<()> {
    let mut sector = AlignedBuf::new(DIRECT_ALIGN);
    let buf = &mut sector.as_mut_slice()[..SECTOR_SIZE as usize];
    loop {
        match file.read_at(buf, 0) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            result => return result.map(drop),
        }
    }
}

fn open_error(path: &Path, source: io::Error) -> DeviceError {
    DeviceError::Open { path: path.to_path_buf(), source }
}

fn is_unsupported(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS))
}

impl BlockDevice for FileDevice {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        check_range(Op::Read, offset, buf.len(), self.size_bytes)?;
        let io_error =
            |piece_offset, source| DeviceError::Io { op: Op::Read, offset: piece_offset, source };
        if !self.io_path.direct || runs::is_direct_aligned(buf) {
            return self.file.read_exact_at(buf, offset).map_err(|e| io_error(offset, e));
        }
        if buf.is_empty() {
            return Ok(());
        }
        let mut bounce = AlignedBuf::new(buf.len().min(BOUNCE_BYTES_MAX));
        for (i, piece) in buf.chunks_mut(BOUNCE_BYTES_MAX).enumerate() {
            let piece_offset = offset + (i * BOUNCE_BYTES_MAX) as u64;
            let staged = &mut bounce.as_mut_slice()[..piece.len()];
            self.file.read_exact_at(staged, piece_offset).map_err(|e| io_error(piece_offset, e))?;
            piece.copy_from_slice(staged);
        }
        Ok(())
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        check_range(Op::Write, offset, data.len(), self.size_bytes)?;
        self.write_runs(&[Write { offset, data, fua: false }])
    }

    fn write_fua_at(&self, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        check_range(Op::WriteFua, offset, data.len(), self.size_bytes)?;
        self.write_runs(&[Write { offset, data, fua: true }])
    }

    fn flush(&self) -> Result<(), DeviceError> {
        if self.options.read_only {
            return Ok(());
        }
        self.file.sync_data().map_err(|source| DeviceError::Io { op: Op::Flush, offset: 0, source })
    }

    fn write_batch(&self, writes: &[Write<'_>]) -> Result<(), DeviceError> {
        // Reject a bad batch before any of it is written.
        for w in writes {
            check_range(write_op(w.fua), w.offset, w.data.len(), self.size_bytes)?;
        }
        if writes.is_empty() {
            return Ok(());
        }
        self.write_runs(writes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsupported_errnos_select_the_fdatasync_fallback() {
        assert!(is_unsupported(&io::Error::from_raw_os_error(libc::EOPNOTSUPP)));
        assert!(is_unsupported(&io::Error::from_raw_os_error(libc::ENOSYS)));
        assert!(!is_unsupported(&io::Error::from_raw_os_error(libc::EIO)));
    }

    #[test]
    fn opening_a_missing_file_names_it() {
        let err =
            FileDevice::open("/nonexistent/quill-device", FileOptions::default()).unwrap_err();
        assert_eq!(err.errno(), libc::ENOENT);
        assert!(err.to_string().contains("/nonexistent/quill-device"), "{err}");
    }

    #[test]
    fn io_modes_parse_from_their_option_names() {
        assert_eq!("auto".parse::<IoMode>(), Ok(IoMode::Auto));
        assert_eq!("direct".parse::<IoMode>(), Ok(IoMode::Direct));
        assert_eq!("buffered".parse::<IoMode>(), Ok(IoMode::Buffered));
        assert!("cached".parse::<IoMode>().is_err());
    }

    #[test]
    fn io_path_names_its_choices_and_reasons() {
        let path = IoPath { direct: false, uring: true, notes: vec!["tmpfs: x".into()] };
        assert_eq!(path.to_string(), "buffered I/O, io_uring submission (tmpfs: x)");
        let path = IoPath { direct: true, uring: false, notes: Vec::new() };
        assert_eq!(path.to_string(), "direct I/O, thread-pool submission");
    }
}
