//! A block device on a regular file or a Linux block device node.
//!
//! The four durability primitives map onto the kernel as follows:
//!
//! | primitive      | system call                                                          |
//! |----------------|----------------------------------------------------------------------|
//! | `read_at`      | `pread`, looped until the buffer is full                             |
//! | `write_at`     | `pwrite`, looped until everything is written                         |
//! | `write_fua_at` | `pwritev2(RWF_DSYNC)`; if the kernel lacks it, `pwrite` + `fdatasync` |
//! | `flush`        | `fdatasync`                                                          |
//!
//! Invariants:
//! - a short read or write is continued, and one that makes no progress is an error: a call
//!   returns `Ok` only when every byte moved;
//! - every error names the op and the byte offset of the piece that failed;
//! - with `direct` (O_DIRECT) the kernel requires memory aligned to the logical block size, which
//!   callers' ordinary slices are not, so all I/O goes through 4096-aligned bounce buffers of at
//!   most [`BOUNCE_BYTES_MAX`]. Offsets and lengths are only checked against 512-byte sectors; on
//!   a device with 4 KiB logical blocks the kernel rejects smaller I/O with EINVAL, reported as an
//!   ordinary `Io` error;
//! - the size is a multiple of [`SECTOR_SIZE`]: a trailing partial sector of a file is ignored.
//!
//! `write_batch` submits from up to `parallelism` threads when the batch is large enough for the
//! thread start-up to pay off, so the cooperative I/O paths of the journal keep several writes in
//! flight on devices that have internal parallelism.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use parking_lot::Mutex;

use crate::aligned::AlignedBuf;
use crate::{check_range, BlockDevice, DeviceError, Op, Write, SECTOR_SIZE};

pub use crate::aligned::DIRECT_ALIGN;

/// Largest bounce buffer one O_DIRECT call allocates; larger I/O is done in pieces of this size
/// so that a huge request does not double its memory footprint.
pub const BOUNCE_BYTES_MAX: usize = 1024 * 1024;

/// Batches of at most this many writes are submitted from the calling thread: spawning threads
/// costs tens of microseconds, more than a few buffered writes take.
pub const BATCH_SEQUENTIAL_MAX: usize = 4;

/// Default number of submitting threads for a large `write_batch`.
pub const PARALLELISM_DEFAULT: usize = 4;

/// Upper bound on `parallelism`: more threads than this only add scheduling overhead.
pub const PARALLELISM_MAX: usize = 64;

const _: () = assert!(BOUNCE_BYTES_MAX.is_multiple_of(DIRECT_ALIGN));
const _: () = assert!((DIRECT_ALIGN as u64).is_multiple_of(SECTOR_SIZE));

/// How to open a [`FileDevice`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileOptions {
    /// Open read-only; writes fail with EROFS without reaching the kernel.
    pub read_only: bool,
    /// Open with O_DIRECT, bypassing the page cache.
    pub direct: bool,
}

/// A device backed by a file. See the module documentation.
#[derive(Debug)]
pub struct FileDevice {
    file: File,
    path: PathBuf,
    size_bytes: u64,
    options: FileOptions,
    parallelism: usize,
    /// Set once `pwritev2(RWF_DSYNC)` reported itself unsupported; FUA then uses pwrite + fdatasync.
    fua_emulated: AtomicBool,
}

impl FileDevice {
    /// Opens an existing file or block device.
    pub fn open(path: impl AsRef<Path>, options: FileOptions) -> Result<FileDevice, DeviceError> {
        let path = path.as_ref();
        let mut open = OpenOptions::new();
        open.read(true).write(!options.read_only);
        if options.direct {
            open.custom_flags(libc::O_DIRECT);
        }
        let file = open.open(path).map_err(|source| open_error(path, source))?;
        FileDevice::from_file(file, path, options)
    }

    /// Creates (or truncates) a sparse file of `size_bytes` and opens it read-write, buffered.
    pub fn create(path: impl AsRef<Path>, size_bytes: u64) -> Result<FileDevice, DeviceError> {
        assert!(
            size_bytes.is_multiple_of(SECTOR_SIZE),
            "device size {size_bytes} is not a multiple of {SECTOR_SIZE}"
        );
        let path = path.as_ref();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(|source| open_error(path, source))?;
        file.set_len(size_bytes).map_err(|source| open_error(path, source))?;
        FileDevice::from_file(file, path, FileOptions::default())
    }

    fn from_file(
        mut file: File,
        path: &Path,
        options: FileOptions,
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
            parallelism: PARALLELISM_DEFAULT,
            fua_emulated: AtomicBool::new(false),
        })
    }

    /// Sets how many threads a large `write_batch` submits from (1 = always sequential).
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

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write(&self, op: Op, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        check_range(op, offset, data.len(), self.size_bytes)?;
        if self.options.read_only {
            let source = io::Error::from_raw_os_error(libc::EROFS);
            return Err(DeviceError::Io { op, offset, source });
        }
        let fua = op == Op::WriteFua;
        if !self.options.direct {
            return self.write_piece(fua, offset, data);
        }
        if data.is_empty() {
            return Ok(());
        }
        let mut bounce = AlignedBuf::new(data.len().min(BOUNCE_BYTES_MAX));
        for (i, piece) in data.chunks(BOUNCE_BYTES_MAX).enumerate() {
            let piece_offset = offset + (i * BOUNCE_BYTES_MAX) as u64;
            let staged = &mut bounce.as_mut_slice()[..piece.len()];
            staged.copy_from_slice(piece);
            self.write_piece(fua, piece_offset, staged)?;
        }
        Ok(())
    }

    /// Writes `data` (already staged for O_DIRECT if needed) at `offset`, durably if `fua`.
    fn write_piece(&self, fua: bool, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        if !fua {
            return self.file.write_all_at(data, offset).map_err(|source| DeviceError::Io {
                op: Op::Write,
                offset,
                source,
            });
        }
        let io_error = |source| DeviceError::Io { op: Op::WriteFua, offset, source };
        if !self.fua_emulated.load(Ordering::Relaxed) {
            match pwritev2_dsync_all(&self.file, offset, data) {
                Ok(()) => return Ok(()),
                Err(e) if is_unsupported(&e) => self.fua_emulated.store(true, Ordering::Relaxed),
                Err(e) => return Err(io_error(e)),
            }
        }
        // Emulation: rewriting the whole piece is harmless even if pwritev2 got partway, and
        // fdatasync makes it (and, as a side effect, earlier writes) durable.
        self.file.write_all_at(data, offset).map_err(io_error)?;
        self.file.sync_data().map_err(io_error)
    }

    fn write_one(&self, w: &Write<'_>) -> Result<(), DeviceError> {
        self.write(if w.fua { Op::WriteFua } else { Op::Write }, w.offset, w.data)
    }
}

fn open_error(path: &Path, source: io::Error) -> DeviceError {
    DeviceError::Open { path: path.to_path_buf(), source }
}

fn is_unsupported(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS))
}

/// `pwritev2(RWF_DSYNC)` looped over short writes; each returned byte count is already durable.
fn pwritev2_dsync_all(file: &File, offset: u64, data: &[u8]) -> io::Result<()> {
    let mut done = 0usize;
    while done < data.len() {
        let rest = &data[done..];
        let iov = libc::iovec { iov_base: rest.as_ptr() as *mut libc::c_void, iov_len: rest.len() };
        let at = libc::off_t::try_from(offset + done as u64)
            .map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
        // SAFETY: `iov` points at `rest`, which is alive and unaliased-for-write for the call;
        // the kernel only reads from it.
        let n = unsafe { libc::pwritev2(file.as_raw_fd(), &iov, 1, at, libc::RWF_DSYNC) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "pwritev2 wrote nothing"));
        }
        done += n as usize;
    }
    Ok(())
}

impl BlockDevice for FileDevice {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        check_range(Op::Read, offset, buf.len(), self.size_bytes)?;
        let io_error =
            |piece_offset, source| DeviceError::Io { op: Op::Read, offset: piece_offset, source };
        if !self.options.direct {
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
        self.write(Op::Write, offset, data)
    }

    fn write_fua_at(&self, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        self.write(Op::WriteFua, offset, data)
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
            let op = if w.fua { Op::WriteFua } else { Op::Write };
            check_range(op, w.offset, w.data.len(), self.size_bytes)?;
        }
        if writes.len() <= BATCH_SEQUENTIAL_MAX || self.parallelism == 1 {
            return writes.iter().try_for_each(|w| self.write_one(w));
        }
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let first_error: Mutex<Option<DeviceError>> = Mutex::new(None);
        std::thread::scope(|scope| {
            for _ in 0..self.parallelism.min(writes.len()) {
                scope.spawn(|| {
                    // Each thread claims the next unclaimed write; after a failure the rest are
                    // left unsubmitted, as the sequential path would.
                    while !failed.load(Ordering::Relaxed) {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(w) = writes.get(i) else { break };
                        if let Err(e) = self.write_one(w) {
                            failed.store(true, Ordering::Relaxed);
                            first_error.lock().get_or_insert(e);
                        }
                    }
                });
            }
        });
        match first_error.into_inner() {
            Some(e) => Err(e),
            None => Ok(()),
        }
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
}
