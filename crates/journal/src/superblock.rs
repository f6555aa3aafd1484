//! Reading, writing and creating the journal superblock (journal block 0).

use crate::error::{JournalError, Result};
use crate::location::JournalLocation;
use crate::locks::{LockCounters, LockId, TimedMutex};
use blockdev::BlockDevice;
use ondisk::jbd2::{feature, ChecksumVersion, JournalSuperblock, JBD2_SUPERBLOCK_SIZE};
use ondisk::Tid;
use std::sync::atomic::{AtomicBool, Ordering};

pub(crate) fn superblock_offset(location: &JournalLocation) -> u64 {
    location.device_offset(0).expect("a journal location has at least one block")
}

pub fn read_superblock(
    dev: &dyn BlockDevice,
    location: &JournalLocation,
) -> Result<JournalSuperblock> {
    let mut bytes = vec![0u8; JBD2_SUPERBLOCK_SIZE];
    dev.read_at(superblock_offset(location), &mut bytes)?;
    let sb = JournalSuperblock::parse(&bytes)?;
    check_geometry(&sb, location)?;
    Ok(sb)
}

/// The superblock must describe the journal we were pointed at: same block size, no more
/// blocks than the location holds, and a non-empty log area.
fn check_geometry(sb: &JournalSuperblock, location: &JournalLocation) -> Result<()> {
    let fail = |reason: String| Err(JournalError::Corrupted { log_block: 0, reason });
    if sb.block_size != location.block_size() {
        return fail(format!(
            "journal block size {} differs from the file system's {}",
            sb.block_size,
            location.block_size()
        ));
    }
    if sb.max_len > location.len_blocks() {
        return fail(format!(
            "journal claims {} blocks but its file holds {}",
            sb.max_len,
            location.len_blocks()
        ));
    }
    if sb.first == 0 || sb.first >= sb.log_end() {
        return fail(format!("log area [{}, {}) is empty", sb.first, sb.log_end()));
    }
    if sb.start != 0 && !(sb.first..sb.log_end()).contains(&sb.start) {
        return fail(format!("log tail {} outside [{}, {})", sb.start, sb.first, sb.log_end()));
    }
    Ok(())
}

/// Writes the superblock durably (FUA), as JBD2 does whenever the tail moves.
pub fn write_superblock(
    dev: &dyn BlockDevice,
    location: &JournalLocation,
    sb: &JournalSuperblock,
) -> Result<()> {
    dev.write_fua_at(superblock_offset(location), &sb.encode())?;
    Ok(())
}

/// jbd2_journal_clear_err: forgets the errno an aborted journal recorded (the caller has
/// made the file system's error state durable first).
pub fn clear_errno(dev: &dyn BlockDevice, location: &JournalLocation) -> Result<()> {
    let mut sb = read_superblock(dev, location)?;
    sb.errno = 0;
    write_superblock(dev, location, &sb)
}

/// How to create a journal on a raw device (tests, benchmarks; real images get theirs from
/// mkfs).
#[derive(Debug, Clone, Copy)]
pub struct FormatOptions {
    pub checksum: ChecksumVersion,
    pub is_64bit: bool,
    pub uuid: [u8; 16],
    /// Blocks reserved at the end for ext4 fast commits (`s_num_fc_blks`; 0: none).
    pub fast_commit_blocks: u32,
    /// Whether the journal's INCOMPAT_FAST_COMMIT is set now, making the area part of the
    /// layout at once (as a kernel mounted with fast commits leaves it), or left clear (as
    /// mke2fs leaves it: the log then spans the area until a mount turns it on).
    pub fast_commit_feature: bool,
}

impl Default for FormatOptions {
    fn default() -> Self {
        FormatOptions {
            checksum: ChecksumVersion::V3,
            is_64bit: true,
            uuid: *b"quill-journal-id",
            fast_commit_blocks: 0,
            fast_commit_feature: false,
        }
    }
}

/// Writes a fresh, clean journal superblock covering the whole location, as mke2fs does.
pub fn format(
    dev: &dyn BlockDevice,
    location: &JournalLocation,
    options: FormatOptions,
) -> Result<()> {
    let mut incompat = feature::INCOMPAT_REVOKE;
    let mut compat = 0;
    match options.checksum {
        ChecksumVersion::None => {}
        ChecksumVersion::V1 => compat |= feature::COMPAT_CHECKSUM,
        ChecksumVersion::V2 => incompat |= feature::INCOMPAT_CSUM_V2,
        ChecksumVersion::V3 => incompat |= feature::INCOMPAT_CSUM_V3,
    }
    if options.is_64bit {
        incompat |= feature::INCOMPAT_64BIT;
    }
    if options.fast_commit_feature {
        incompat |= feature::INCOMPAT_FAST_COMMIT;
    }
    let mut sb = JournalSuperblock::new(
        location.block_size(),
        location.len_blocks(),
        options.uuid,
        compat,
        incompat,
    );
    sb.num_fc_blocks = options.fast_commit_blocks;
    if sb.log_end() <= sb.first + 8 {
        return Err(JournalError::Invalid(format!(
            "journal of {} blocks leaves no room for a log",
            location.len_blocks()
        )));
    }
    write_superblock(dev, location, &sb)?;
    dev.flush()?;
    Ok(())
}

/// The journal superblock as last written, and how it is rewritten while the journal runs.
///
/// Its lock is a leaf held across its own FUA write, so superblock writes land in the order
/// their contents were made. An abort records its errno through it, so no code may abort while
/// holding it: [`SuperblockWriter::update_if`] returns the device error and the caller aborts.
pub(crate) struct SuperblockWriter {
    /// [superblock lock]
    sb: TimedMutex<JournalSuperblock>,
    /// [atomic] The superblock naming the new log start is not written yet: the first commit
    /// writes it before its log blocks (JBD2's JBD2_FLUSHED; see `Journal::attach`).
    unwritten: AtomicBool,
    /// [immutable] The superblock is on the device. A journal without a log
    /// (`Journal::without_log`) keeps it in memory only: every write is skipped.
    persistent: bool,
}

impl SuperblockWriter {
    pub fn new(sb: JournalSuperblock, unwritten: bool, persistent: bool) -> Self {
        SuperblockWriter {
            sb: TimedMutex::new(LockId::Superblock, sb),
            unwritten: AtomicBool::new(unwritten && persistent),
            persistent,
        }
    }

    fn write(
        &self,
        dev: &dyn BlockDevice,
        location: &JournalLocation,
        sb: &JournalSuperblock,
    ) -> Result<()> {
        if !self.persistent {
            return Ok(());
        }
        write_superblock(dev, location, sb)
    }

    /// The tid of the log's first transaction as the superblock names it, or `None` when it
    /// marks the log empty (`s_start == 0`).
    pub fn log_start_tid(&self, locks: &LockCounters) -> Option<Tid> {
        let sb = self.sb.lock(locks);
        (sb.start != 0).then_some(sb.sequence)
    }

    /// The log area `[first, end)`.
    pub fn log_area(&self, locks: &LockCounters) -> std::ops::Range<u32> {
        let sb = self.sb.lock(locks);
        sb.first..sb.log_end()
    }

    /// Applies `change` and writes the superblock (FUA) under its lock, when `needed` says so
    /// of the superblock as it is (checked under the same lock); returns whether it wrote.
    pub fn update_if(
        &self,
        dev: &dyn BlockDevice,
        location: &JournalLocation,
        locks: &LockCounters,
        needed: impl FnOnce(&JournalSuperblock) -> bool,
        change: impl FnOnce(&mut JournalSuperblock),
    ) -> Result<bool> {
        let mut sb = self.sb.lock(locks);
        if !needed(&sb) {
            return Ok(false);
        }
        change(&mut sb);
        self.unwritten.store(false, Ordering::Release);
        self.write(dev, location, &sb).map(|()| true)
    }

    /// Writes the superblock naming the log start if nothing has written it since attach: the
    /// first commit does so before its log blocks, and the first fast commit before its
    /// blocks (`fc_commit.rs`). The check and the write happen under the superblock lock, so a
    /// caller that comes second returns only once the first caller's write is done. Once it
    /// is written (the flag is cleared only after the write) every commit returns at once,
    /// without the lock.
    pub fn ensure_written(
        &self,
        dev: &dyn BlockDevice,
        location: &JournalLocation,
        locks: &LockCounters,
    ) -> Result<()> {
        if !self.unwritten.load(Ordering::Acquire) {
            return Ok(());
        }
        let sb = self.sb.lock(locks);
        if !self.unwritten.load(Ordering::Acquire) {
            return Ok(());
        }
        self.write(dev, location, &sb)?;
        self.unwritten.store(false, Ordering::Release);
        Ok(())
    }

    /// jbd2_journal_update_sb_errno: the abort's errno goes into `s_errno` (negated, as Linux
    /// stores it) with a FUA write, so the next mount (quill's, the kernel's
    /// `ext4_clear_journal_err`) or e2fsck marks the file system as having errors and checks it
    /// in full. Best effort: the device that failed may refuse this write too.
    pub fn record_errno(
        &self,
        dev: &dyn BlockDevice,
        location: &JournalLocation,
        locks: &LockCounters,
        errno: i32,
    ) {
        let mut sb = self.sb.lock(locks);
        sb.errno = -errno;
        let mut on_disk = sb.clone();
        if self.unwritten.load(Ordering::Acquire) {
            // Nothing was committed since attach: the device still has the clean superblock
            // (no log start; the previous tail tid), and it keeps saying so.
            on_disk.start = 0;
            on_disk.sequence = on_disk.sequence.prev();
        }
        let _ = self.write(dev, location, &on_disk);
    }
}
