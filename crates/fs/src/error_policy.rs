//! What the file system does when it finds an error in itself, as ext4's `ext4_error` and
//! `ext4_handle_error`: damaged metadata, a metadata block that cannot be read, or a failure
//! after an operation's first change.
//!
//! Every such error
//! 1. is recorded in the superblock: `s_state` gets ERROR_FS, `s_error_count` grows, the first
//!    error since the last e2fsck and the latest one are kept (time, inode, block, where quill
//!    found it, error code), so `dumpe2fs -h` and the next e2fsck see it;
//! 2. is written straight to the home superblock and flushed (`ext4_commit_super`), not only
//!    through the journal: under errors=remount-ro the journal is aborted and commits nothing
//!    more, and a crash must not lose the record;
//! 3. then obeys the errors= policy ([`ErrorPolicy`]): remount-ro aborts the journal (so a
//!    half-done change never commits) and turns every later change into EROFS; continue
//!    reports the error and goes on.
//!
//! The record is also kept in the in-memory superblock, so that every superblock the journal
//! writes later carries it (a checkpoint of such a copy cannot erase it), and unmount writes
//! it. Journal replay at the next open keeps the home copy's record, as `ext4_load_journal`
//! saves `EXT4_S_ERR_START..EXT4_S_ERR_END` around `jbd2_journal_load`: a replayed superblock
//! is older than the error.
//!
//! Operations find damage before they change anything wherever they can (see `ops.rs`): then
//! the failed operation leaves the file system exactly as it was, apart from this record.

use std::panic::Location;
use std::sync::atomic::Ordering;

use blockdev::BlockDevice;
use journal::Handle;
use ondisk::ext4::{self, ErrorRecord, Superblock};

use crate::error::{FsError, Result};
use crate::filesystem::{now, ErrorPolicy, Filesystem};

impl Filesystem {
    /// ext4_handle_error: records `err` in the superblock (see the module docs) and applies
    /// errors=: with remount-ro, aborts the journal (so a half-done operation never commits)
    /// and refuses writes from now on; with continue, only records. Returns `err` for the
    /// caller to report. The caller's location is recorded as where the error was found.
    #[track_caller]
    pub(crate) fn fail(&self, err: FsError) -> FsError {
        self.fail_in(0, err)
    }

    /// [`Filesystem::fail`] for an error found in inode `ino` (0: none in particular).
    #[track_caller]
    pub(crate) fn fail_in(&self, ino: u32, err: FsError) -> FsError {
        let site = Location::caller();
        // The journal itself failing (aborted, a handle misused) cannot be continued past; a
        // metadata block that could not be read (a device error met through the journal's
        // buffer cache) is an ordinary I/O error, as ext4_error treats it.
        let journal_failed =
            matches!(&err, FsError::Journal(e) if !matches!(e, journal::JournalError::Device(_)));
        if self.options.errors == ErrorPolicy::Continue && !journal_failed {
            self.errors_seen.store(true, Ordering::Release);
        } else if !self.read_only.load(Ordering::Acquire) {
            // The journal aborts before the file system turns read-only, so whoever sees it
            // read-only sees the abort too: an fsync that starts then fails (as ext4_sync_file
            // does on a shut-down file system) instead of returning Ok in the window between
            // the two. Two errors racing here both abort; the journal keeps the first cause.
            let _ = self.journal.abort(format!("file system error: {err}"), err.errno());
            self.read_only.store(true, Ordering::Release);
        }
        // After the abort: no commit or checkpoint can now write an older superblock over the
        // record (under continue, the journaled copies carry it, see `record_error`).
        self.record_error(&err, ino, site);
        err
    }

    /// ext4_error for errors found outside a change: damaged metadata (a checksum, a header,
    /// an entry that does not hold together) or a metadata block that could not be read is a
    /// file-system error even when the operation had changed nothing yet, and goes through
    /// [`Filesystem::fail_in`]. Other errors (ENOENT, ENOSPC, ...) pass through.
    #[track_caller]
    pub(crate) fn check_fs_error(&self, ino: u32, err: FsError) -> FsError {
        let meta_read_failed = matches!(
            &err,
            FsError::Journal(journal::JournalError::Device(blockdev::DeviceError::Io {
                op: blockdev::Op::Read,
                ..
            }))
        );
        if meta_read_failed || err.is_corruption() {
            return self.fail_in(ino, err);
        }
        err
    }

    /// save_error_info + ext4_commit_super: `err` goes into the in-memory superblock (journaled
    /// with the next superblock change) and straight into the home superblock.
    fn record_error(&self, err: &FsError, ino: u32, site: &Location<'_>) {
        let func = site.file().rsplit('/').next().unwrap_or(site.file());
        let block = match err {
            FsError::Corrupted { block, .. } | FsError::BlockOutOfRange { block, .. } => *block,
            _ => 0,
        };
        let code = ext4::error_code_of_errno(err.errno());
        let record = ErrorRecord::new(now().sec as u64, func, ino, block, site.line(), code);
        let mut sb = self.sb.lock();
        add_error(&mut sb, record);
        if self.options.read_only {
            // Opened read-only: nothing is written (the kernel's ro mount does not either).
            return;
        }
        self.error_unsaved.store(true, Ordering::Release);
        // Under the superblock lock, so two errors write their records in order.
        let _ = write_error_record(&*self.dev, &sb);
    }

    /// Journals the superblock with the error state [`Filesystem::fail`] recorded under
    /// errors=continue, once. The caller holds no handle. A failure here is not reported:
    /// the record is in the home superblock already, and unmount writes it too.
    pub(crate) fn save_error_state(&self) {
        // Called at every handle start: read first, so the common case writes nothing shared.
        if !self.error_unsaved.load(Ordering::Acquire)
            || self.is_read_only()
            || !self.error_unsaved.swap(false, Ordering::AcqRel)
        {
            return;
        }
        let Ok(mut txn) = self.begin_with(1, self.groups.no_reservation()) else { return };
        let sb = self.sb.lock();
        let _ = self.write_superblock(&mut txn.handle, &sb);
        drop(sb);
        let _ = txn.stop();
    }

    /// Journals the error state under `handle`, the failing operation's own, if it has a
    /// credit left: then the error is in the same transaction as the half-done change, and no
    /// crash can keep the one without the other. Otherwise [`Filesystem::save_error_state`]
    /// does it after the handle stops.
    pub(crate) fn save_error_state_in(&self, handle: &mut Handle) {
        if !self.error_unsaved.load(Ordering::Acquire)
            || self.is_read_only()
            || handle.credits_left() == 0
        {
            return;
        }
        let sb = self.sb.lock();
        if self.write_superblock(handle, &sb).is_ok() {
            self.error_unsaved.store(false, Ordering::Release);
        }
    }
}

/// Adds one error to the superblock's record: ERROR_FS, the count, the first error (kept
/// until e2fsck clears it) and the last.
pub(crate) fn add_error(sb: &mut Superblock, record: ErrorRecord) {
    sb.state |= ext4::STATE_ERROR_FS;
    sb.error_count = sb.error_count.saturating_add(1);
    if sb.first_error.time == 0 {
        sb.first_error = record;
    }
    sb.last_error = record;
}

/// Copies `from`'s error state (ERROR_FS, count, first and last error) into `to`.
pub(crate) fn copy_error_record(to: &mut Superblock, from: &Superblock) {
    to.state |= from.state & ext4::STATE_ERROR_FS;
    to.error_count = from.error_count;
    to.first_error = from.first_error;
    to.last_error = from.last_error;
}

/// Puts `sb`'s error record into the home superblock on `dev`, leaving every other field as
/// the device has it (what is committed), and flushes.
fn write_error_record(dev: &dyn BlockDevice, sb: &Superblock) -> Result<()> {
    let mut raw = vec![0u8; ext4::SUPERBLOCK_SIZE];
    dev.read_at(ext4::SUPERBLOCK_OFFSET, &mut raw)?;
    let mut home = Superblock::parse(&raw)?;
    copy_error_record(&mut home, sb);
    dev.write_at(ext4::SUPERBLOCK_OFFSET, &home.encode())?;
    dev.flush()?;
    Ok(())
}

/// The error record of the home superblock before a journal replay; [`ErrorRecordSaved::restore`]
/// puts it back over what the replay wrote (ext4_load_journal's save of EXT4_S_ERR_*).
pub(crate) struct ErrorRecordSaved(Option<Superblock>);

impl ErrorRecordSaved {
    pub(crate) fn take(dev: &dyn BlockDevice) -> Self {
        let mut raw = vec![0u8; ext4::SUPERBLOCK_SIZE];
        let home = dev.read_at(ext4::SUPERBLOCK_OFFSET, &mut raw).ok().and_then(|()| {
            Superblock::parse(&raw)
                .ok()
                .filter(|sb| sb.error_count != 0 || sb.state & ext4::STATE_ERROR_FS != 0)
        });
        ErrorRecordSaved(home)
    }

    /// Writes the saved record back if the replay changed it.
    pub(crate) fn restore(self, dev: &dyn BlockDevice) -> Result<()> {
        let Some(saved) = self.0 else { return Ok(()) };
        let mut raw = vec![0u8; ext4::SUPERBLOCK_SIZE];
        dev.read_at(ext4::SUPERBLOCK_OFFSET, &mut raw)?;
        let home = Superblock::parse(&raw)?;
        let same = home.error_count == saved.error_count
            && home.first_error == saved.first_error
            && home.last_error == saved.last_error
            && home.state & ext4::STATE_ERROR_FS == saved.state & ext4::STATE_ERROR_FS;
        if same {
            return Ok(());
        }
        write_error_record(dev, &saved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockdev::memory::MemDevice;

    fn fresh() -> (MemDevice, Superblock) {
        let dev = MemDevice::new(16 << 20);
        let options = crate::mkfs::MkfsOptions { device_zeroed: true, ..Default::default() };
        crate::mkfs::mkfs(&dev, &options).unwrap();
        let mut raw = vec![0u8; ext4::SUPERBLOCK_SIZE];
        dev.read_at(ext4::SUPERBLOCK_OFFSET, &mut raw).unwrap();
        let sb = Superblock::parse(&raw).unwrap();
        (dev, sb)
    }

    fn home(dev: &MemDevice) -> Superblock {
        let mut raw = vec![0u8; ext4::SUPERBLOCK_SIZE];
        dev.read_at(ext4::SUPERBLOCK_OFFSET, &mut raw).unwrap();
        Superblock::parse(&raw).unwrap()
    }

    #[test]
    fn first_error_is_kept_and_last_error_follows_each_new_one() {
        let (_, mut sb) = fresh();
        let one = ErrorRecord::new(100, "ops.rs", 12, 7, 1, 5);
        let two = ErrorRecord::new(200, "data.rs", 13, 8, 2, 2);
        add_error(&mut sb, one);
        add_error(&mut sb, two);
        assert_eq!(sb.error_count, 2);
        assert_eq!((sb.first_error, sb.last_error), (one, two));
        assert_ne!(sb.state & ext4::STATE_ERROR_FS, 0);
    }

    #[test]
    fn replayed_superblock_gets_the_saved_error_record_back() {
        let (dev, clean) = fresh();
        let mut errored = clean.clone();
        add_error(&mut errored, ErrorRecord::new(100, "ops.rs", 12, 7, 1, 5));
        write_error_record(&dev, &errored).unwrap();
        let saved = ErrorRecordSaved::take(&dev);
        // A replay writes an older superblock copy over the home one.
        dev.write_at(ext4::SUPERBLOCK_OFFSET, &clean.encode()).unwrap();
        assert_eq!(home(&dev).error_count, 0);
        saved.restore(&dev).unwrap();
        let after = home(&dev);
        assert_eq!((after.error_count, after.first_error), (1, errored.first_error));
        assert_ne!(after.state & ext4::STATE_ERROR_FS, 0);
        // Everything else is the replayed copy's.
        assert_eq!(after.free_blocks_count, clean.free_blocks_count);
    }
}
