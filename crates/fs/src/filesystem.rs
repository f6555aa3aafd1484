//! A mounted ext4 file system: opening (feature checks, journal recovery, orphan cleanup),
//! inode access, the per-operation context [`Txn`], and a clean unmount.
//!
//! # Lock order
//! Taken top to bottom; a lock is never taken while one below it is held.
//! 1. `rename_lock`: only renames that move an entry between two directories take it (as the
//!    VFS's `s_vfs_rename_mutex`), so directory ancestry cannot change while they lock.
//! 2. Directory inode locks: a parent before its child; two unrelated directories (only under
//!    `rename_lock`) by inode number.
//! 3. Non-directory inode locks, by inode number. One exception: a new inode's lock is taken
//!    inside the creating handle, right after its number is allocated (`create_node`); no
//!    one holding a free inode's lock starts a handle, so that cannot deadlock.
//! 4. Starting a journal handle (`Journal::start` may wait for a commit, which never needs an
//!    inode lock, so holding inode locks here cannot deadlock). Block reservations are taken
//!    before the handle starts, because a reservation may wait for a commit.
//! 5. A quota file's mutex (`quota.rs`: charges made by inode writes, inside the handle;
//!    under it the quota inode's own write, which takes none of these locks).
//! 6. `orphans` (the orphan list; then the superblock copy `sb`).
//! 7. One group lock at a time (allocation; `groups.rs`).
//! 8. The journal's internal locks (state, buffers, cache shards).
//!
//! # Errors
//! An operation checks everything that can fail for ordinary reasons (ENOENT, EEXIST, ENOSPC
//! through its reservation, …) before it changes metadata, and reads the metadata it will
//! change or free (directory blocks, the extent tree and xattrs of an inode it deletes)
//! before the first change too, so damage found there fails it with nothing changed. An error
//! after the first change (an I/O error, damage that could only be found half way) cannot be
//! rolled back, so it aborts the journal and the file system turns read-only
//! (`errors=remount-ro`): the half-done change never commits, and nothing more is written.
//! Either way the error is recorded in the superblock as ext4_error does
//! (`error_policy.rs`).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use blockdev::BlockDevice;

use crate::clean_cache::CachedDevice;
use journal::{Handle, HomeOrder, Journal, JournalConfig};
use ondisk::ext4::{self, feature, Superblock};
use parking_lot::Mutex;

use crate::data::DeferredData;
use crate::dcache::DentryCache;
use crate::error::{FsError, Result};
use crate::error_policy::ErrorRecordSaved;
use crate::groups::{Groups, Reservation};
use crate::image::Ext4Image;
use crate::inodes::{self, InodeCache, InodeData, InodeGuard, InodeSlot};
use crate::meta_io::MetaIo;
use crate::page_cache::DirtyInodes;

/// How file data is written, as ext4's `data=` mount option.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DataMode {
    /// Data blocks a transaction exposes reach the disk before its commit block (default).
    #[default]
    Ordered,
    /// Data goes through the journal like metadata.
    Journal,
    /// Data is written with no ordering against metadata.
    Writeback,
}

/// What an error found while changing metadata does, as ext4's `errors=` mount option.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ErrorPolicy {
    /// Abort the journal (the half-done change never commits) and refuse writes from then on.
    #[default]
    RemountReadOnly,
    /// Report the error to the caller and go on; the file system is marked as having errors
    /// (`s_state`), so the next e2fsck checks it in full. A change cut short by the error may
    /// commit half done, as with ext4's `errors=continue`.
    Continue,
}

/// How to open a file system.
#[derive(Debug, Clone)]
pub struct MountOptions {
    /// Open without writing anything to the device. A journal that needs replaying is
    /// replayed into memory (the device is never written), unless `no_recovery`.
    pub read_only: bool,
    /// Read-only only: do not replay the journal; show the image as it is on the device
    /// (the kernel's `norecovery`), which may be inconsistent after a crash.
    pub no_recovery: bool,
    /// When reads update access times (`relatime` by default, as ext4).
    pub atime: crate::AtimeMode,
    /// Directory listings never update access times (`nodiratime`).
    pub no_dir_atime: bool,
    /// POSIX ACLs (ext4's `acl`, the default; `noacl` turns them off): the
    /// `system.posix_acl_*` xattrs stored in ext4's encoding, kept in step with the mode, and
    /// a directory's default ACL given to what is created in it (`acl.rs`).
    pub acl: bool,
    pub data: DataMode,
    pub journal: JournalConfig,
    pub errors: ErrorPolicy,
    /// Most inodes kept in the in-memory cache.
    pub inode_cache_max: usize,
    /// Most names kept in the dentry cache (`dcache.rs`), which answers lookups without the
    /// directory's lock; 0 turns it off.
    pub dentry_cache_max: usize,
    /// Bytes of cached metadata blocks kept (the journal's buffer cache); blocks the journal
    /// still needs are kept regardless.
    pub metadata_cache_bytes: u64,
    /// Bytes of clean file data kept in memory after it was read from the device, so
    /// re-reads cost no I/O (the file device bypasses the host page cache); 0 caches nothing.
    /// Least recently used blocks go first; every write to a block drops its copy.
    pub clean_cache_bytes: u64,
    /// Bytes of written file data held in memory before writes start writing back.
    pub dirty_bytes_max: u64,
    /// Written data older than this is written back by the flusher
    /// ([`Filesystem::start_flusher`]).
    pub dirty_expire: Duration,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            read_only: false,
            no_recovery: false,
            atime: crate::AtimeMode::Relative,
            no_dir_atime: false,
            acl: true,
            data: DataMode::Ordered,
            journal: JournalConfig::classic(),
            errors: ErrorPolicy::RemountReadOnly,
            inode_cache_max: 65536,
            dentry_cache_max: 65536,
            metadata_cache_bytes: 64 << 20,
            clean_cache_bytes: 64 << 20,
            dirty_bytes_max: 64 << 20,
            dirty_expire: Duration::from_secs(5),
        }
    }
}

/// INCOMPAT features quill writes correctly.
const INCOMPAT_WRITABLE: u32 = feature::INCOMPAT_FILETYPE
    | feature::INCOMPAT_RECOVER
    | feature::INCOMPAT_EXTENTS
    | feature::INCOMPAT_64BIT
    | feature::INCOMPAT_FLEX_BG
    | feature::INCOMPAT_CSUM_SEED
    | feature::INCOMPAT_MMP
    | feature::INCOMPAT_META_BG
    | feature::INCOMPAT_LARGEDIR
    | feature::INCOMPAT_INLINE_DATA
    | feature::INCOMPAT_EA_INODE;

/// RO_COMPAT features quill writes correctly.
const RO_COMPAT_WRITABLE: u32 = feature::RO_COMPAT_SPARSE_SUPER
    | feature::RO_COMPAT_LARGE_FILE
    | feature::RO_COMPAT_HUGE_FILE
    | feature::RO_COMPAT_GDT_CSUM
    | feature::RO_COMPAT_DIR_NLINK
    | feature::RO_COMPAT_EXTRA_ISIZE
    | feature::RO_COMPAT_METADATA_CSUM
    | feature::RO_COMPAT_PROJECT
    | feature::RO_COMPAT_QUOTA
    | feature::RO_COMPAT_BIGALLOC;

/// An open ext4 file system.
pub struct Filesystem {
    pub(crate) dev: Arc<dyn BlockDevice>,
    /// The same device as `dev`, for file data reads through the clean data cache.
    pub(crate) clean_cache: Arc<CachedDevice>,
    /// The superblock as of the last write (free counts and the orphan head change).
    pub(crate) sb: Mutex<Superblock>,
    /// The superblock as opened: immutable parameters (checksum seed, geometry, features).
    pub(crate) params: Superblock,
    pub(crate) groups: Groups,
    pub(crate) journal: Journal,
    pub(crate) inodes: InodeCache,
    /// What names in directories refer to, for lookups without the directory's lock.
    pub(crate) dentries: DentryCache,
    pub(crate) options: MountOptions,
    pub(crate) rename_lock: Mutex<()>,
    /// The orphan list in order, head first (see `orphan.rs`).
    pub(crate) orphans: Mutex<crate::orphan::Orphans>,
    /// Inodes with written data not yet written back (`page_cache.rs`).
    pub(crate) dirty: DirtyInodes,
    pub(crate) read_only: AtomicBool,
    /// An error was met under `errors=continue` (in `s_state` from then on).
    pub(crate) errors_seen: AtomicBool,
    /// `sb` has an error record not yet journaled ([`Filesystem::save_error_state`]).
    pub(crate) error_unsaved: AtomicBool,
    /// `s_state` as found at mount (ext4's `s_mount_state`), which a clean unmount writes
    /// back: VALID_FS is cleared while a file system without a journal is mounted.
    mount_state: u16,
    /// The MMP block this read-write mount holds (the mmp feature; `mmp.rs`).
    mmp: Option<crate::mmp::Mmp>,
    next_generation: AtomicU32,
    /// Serializes reference-count changes of value inodes (ea_inode): the kernel shares one
    /// among owners whose operations hold only their own inode's lock. A leaf lock, taken
    /// inside a handle.
    pub(crate) value_inode_refs: Mutex<()>,
    /// The quota files a read-write mount charges (the quota feature; `quota.rs`). Set once,
    /// while opening, before any inode is loaded: every loaded inode knows its charge.
    pub(crate) quotas: std::sync::OnceLock<crate::quota::Quotas>,
}

impl std::fmt::Debug for Filesystem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Filesystem")
            .field("blocks", &self.params.blocks_count)
            .field("block_size", &self.params.block_size())
            .finish_non_exhaustive()
    }
}

impl Filesystem {
    /// Opens the ext4 file system on `dev`: refuses features quill cannot honour (naming them),
    /// replays the journal if it needs it, marks the file system in use, and cleans up the
    /// orphan list left by a crash.
    pub fn open(dev: Arc<dyn BlockDevice>, options: MountOptions) -> Result<Filesystem> {
        if options.no_recovery && !options.read_only {
            return Err(FsError::Invalid("norecovery needs a read-only open".into()));
        }
        let image = Ext4Image::open(dev.clone())?;
        let sb = image.superblock().clone();
        check_features(&sb, options.read_only)?;
        // Multiple mount protection comes before anything is written, replay included (as
        // ext4_fill_super takes it before loading the journal); read-only opens skip it.
        let mmp = if !options.read_only && sb.feature_incompat & feature::INCOMPAT_MMP != 0 {
            Some(crate::mmp::Mmp::take(dev.clone(), &sb, &std::thread::sleep)?)
        } else {
            None
        };
        // A file system without a journal (ext2, ext4 -O ^has_journal) gets a journal without
        // a log: its commits write home (`Journal::without_log`).
        let location = if sb.has_journal() { Some(image.journal_location()?) } else { None };
        if location.is_none() && !options.read_only && options.data == DataMode::Journal {
            return Err(FsError::Invalid(
                "data=journal needs a journal; this file system has none (has_journal is off)"
                    .into(),
            ));
        }
        let needs_recovery = sb.needs_recovery();
        if needs_recovery && location.is_none() {
            return Err(FsError::corrupted(
                sb.superblock_block(),
                "needs_recovery is set but the file system has no journal",
            ));
        }
        drop(image);
        // A read-only open writes nothing to `dev`: a journal that needs replaying is replayed
        // into an in-memory overlay (as fuse2fs does; the kernel would write the device), so
        // the image may even be read-only. norecovery shows the image as it is, unreplayed.
        let dev: Arc<dyn BlockDevice> = if options.read_only && needs_recovery {
            Arc::new(blockdev::overlay::OverlayDevice::new(dev))
        } else {
            dev
        };
        if location.is_some() && !options.no_recovery && (!options.read_only || needs_recovery) {
            // JBD2's jbd2_journal_load, first half: replay the log, and then its fast commits,
            // if it needs it. The replay may put back a superblock older than an error
            // recorded since: keep the record.
            let saved = ErrorRecordSaved::take(&*dev);
            Ext4Image::open(dev.clone())?
                .recover_journal(options.journal.recovery_threads, &|_, _| {})?;
            saved.restore(&*dev)?;
        }
        if options.read_only && needs_recovery && !options.no_recovery {
            // Then it marks the file system recovered (in the overlay) and attaches.
            let image = Ext4Image::open(dev.clone())?;
            let mut sb = image.superblock().clone();
            sb.set_needs_recovery(false);
            dev.write_at(ext4::SUPERBLOCK_OFFSET, &sb.encode())?;
        }
        // Recovery may have replayed the superblock and descriptors: read them again.
        let image = Ext4Image::open(dev.clone())?;
        let mut sb = image.superblock().clone();
        let groups = Groups::new(&sb, image.group_descs())?;
        // Quota files quill could not charge refuse the open before anything is written.
        let quota_files =
            if options.read_only { Vec::new() } else { crate::quota::scan_files(&image)? };
        drop(image);
        // The state to restore at a clean unmount (ext4's s_mount_state).
        let mount_state = sb.state;
        if !options.read_only {
            match &location {
                Some(location) => {
                    // ext4_clear_journal_err: an aborted journal recorded its errno (quill's or
                    // the kernel's); the file system is marked as having errors, for e2fsck's
                    // full check, before the journal forgets it.
                    let recorded_errno =
                        journal::superblock::read_superblock(&*dev, location)?.errno;
                    if recorded_errno != 0 {
                        sb.state |= ext4::STATE_ERROR_FS;
                    }
                    // As ext4 does while mounted: the journal may hold transactions
                    // (RECOVER). VALID_FS stays as it was: with a journal, ext4_setup_super
                    // leaves it on, since replay makes the file system consistent again.
                    // Clearing it would make every crash look like an unchecked file system
                    // (the kernel's "mounting unchecked fs", e2fsck -p's forced full check)
                    // until e2fsck ran.
                    sb.set_needs_recovery(true);
                    mark_mounted(&*dev, &mut sb)?;
                    if recorded_errno != 0 {
                        journal::superblock::clear_errno(&*dev, location)?;
                    }
                }
                None => {
                    // Without a journal nothing makes a crash consistent again but e2fsck: as
                    // ext4_setup_super (and ext2) do, VALID_FS is cleared while mounted, so
                    // a crash leaves a file system that every checker and mount sees as
                    // unchecked; a clean unmount sets it back as it was.
                    sb.state &= !ext4::STATE_VALID_FS;
                    mark_mounted(&*dev, &mut sb)?;
                }
            }
        }
        // The journal superblock naming a live log start is written by the first commit, so
        // after RECOVER is durable (above): the journal never holds data that a superblock
        // without RECOVER would tell e2fsck and the kernel to ignore (the kernel wipes such a
        // journal).
        // From here on the journal and the file system reach the device only through the
        // clean data cache, so every write drops the cached copies it makes stale.
        let clean_cache =
            Arc::new(CachedDevice::new(dev, sb.block_size(), options.clean_cache_bytes));
        let dev: Arc<dyn BlockDevice> = clean_cache.clone();
        // fsync_journal writes fast commits only where e2fsck and the kernel look for them: on
        // a file system with the fast_commit feature. Without it fsyncs commit the transaction,
        // and each counts as a fallback for that reason (fsync_journal.rs).
        let mut journal_config = options.journal.clone();
        // Nor on bigalloc: quill's replay does not allocate in clusters (`fast_commit.rs`
        // refuses such a replay), so every fsync commits the transaction there.
        journal_config.fsync_journal &=
            sb.feature_compat & feature::COMPAT_FAST_COMMIT != 0 && !sb.has_bigalloc();
        let journal = match location {
            None if options.read_only => {
                Journal::without_log_read_only(dev.clone(), sb.block_size(), journal_config)?
            }
            None => Journal::without_log(dev.clone(), sb.block_size(), journal_config)?,
            Some(location) if options.read_only => {
                Journal::open_read_only(dev.clone(), location, journal_config)?
            }
            Some(location) => Journal::open(dev.clone(), location, journal_config)?,
        };
        let block_size = u64::from(sb.block_size());
        journal.set_cache_limit((options.metadata_cache_bytes / block_size).max(64) as usize);
        let fs = Filesystem {
            dev,
            clean_cache,
            params: sb.clone(),
            sb: Mutex::new(sb),
            groups,
            journal,
            inodes: InodeCache::new(options.inode_cache_max),
            dentries: DentryCache::new(options.dentry_cache_max),
            read_only: AtomicBool::new(options.read_only),
            options,
            rename_lock: Mutex::new(()),
            orphans: Mutex::new(crate::orphan::Orphans::default()),
            dirty: DirtyInodes::default(),
            errors_seen: AtomicBool::new(false),
            error_unsaved: AtomicBool::new(false),
            mount_state,
            mmp,
            next_generation: AtomicU32::new(now().nsec),
            value_inode_refs: Mutex::new(()),
            quotas: std::sync::OnceLock::new(),
        };
        if !fs.options.read_only {
            match crate::quota::Quotas::load(&fs, quota_files) {
                Ok(Some(quotas)) => {
                    let _ = fs.quotas.set(quotas);
                }
                Ok(None) => {}
                Err(err) => {
                    // Refused before anything changed, as an orphan quill cannot finish is.
                    fs.unmount()?;
                    return Err(err);
                }
            }
            if let Err(err) = fs.process_orphans() {
                // An orphan quill cannot finish is refused before anything changed: leave the
                // image as a clean unmount would (needs_recovery cleared again), orphans kept.
                if matches!(err, FsError::Unsupported(_)) && !fs.is_read_only() {
                    fs.unmount()?;
                }
                return Err(err);
            }
        }
        Ok(fs)
    }

    pub fn block_size(&self) -> u32 {
        self.params.block_size()
    }

    /// Bytes of file data the clean data cache holds now (at most
    /// [`MountOptions::clean_cache_bytes`]).
    pub fn clean_cache_bytes(&self) -> u64 {
        self.clean_cache.cached_bytes()
    }

    /// Lookups the dentry cache answered, and lookups that searched a directory, since the
    /// file system was opened.
    pub fn dentry_cache_hits_and_misses(&self) -> (u64, u64) {
        self.dentries.hits_and_misses()
    }

    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    /// Opened read-only, or turned read-only by an error. A journal that aborted on its own
    /// (an I/O error in the commit thread or a checkpoint) counts at once: nothing can be
    /// committed any more, so every later change must fail, as ext4's "Detected aborted
    /// journal" makes it read-only at the next handle start.
    pub fn is_read_only(&self) -> bool {
        self.read_only.load(Ordering::Acquire) || self.journal.is_aborted() || self.mmp_lost()
    }

    pub(crate) fn check_writable(&self) -> Result<()> {
        if self.is_read_only() {
            return Err(FsError::ReadOnly);
        }
        Ok(())
    }

    /// Another host took the MMP block: nothing more may be written. The journal aborts (the
    /// running transaction never commits), as ext4's kmmpd calls `ext4_error(sb, "abort")`.
    fn mmp_lost(&self) -> bool {
        let Some(why) = self.mmp.as_ref().and_then(|m| m.lost()) else { return false };
        if !self.journal.is_aborted() {
            self.journal
                .abort(format!("multiple mount protection: {why}"), crate::error::errno::EIO);
        }
        true
    }

    /// Clean unmount: commits and checkpoints everything, writes the superblock with the free
    /// counts and the clean state, and flushes.
    pub fn unmount(self) -> Result<()> {
        // Cached data first: writing it back needs the journal.
        let writeback = if self.is_read_only() { Ok(()) } else { self.writeback_all() };
        if writeback.is_err() {
            if self.is_read_only() {
                // The failure aborted the journal (errors=remount-ro): what is committed is
                // what a crash would leave; recovery takes it from there.
                let _ = self.journal.shutdown();
                return writeback;
            }
            // Not fatal (a failed step changes nothing, or errors=continue): the data that
            // could not be written is lost, everything else is committed as usual, and the
            // image is marked for e2fsck.
            self.errors_seen.store(true, Ordering::Release);
        }
        let read_only = self.options.read_only || self.is_read_only();
        let errors_seen = self.errors_seen.load(Ordering::Acquire);
        // Inodes still open and unlinked at unmount stay in the orphan file for the next
        // mount to free; orphan_present must then stay set.
        let orphan_file_used =
            self.orphans.lock().file.as_ref().is_some_and(|f| !f.recorded().is_empty());
        let Filesystem { dev, sb, groups, journal, mount_state, mmp, .. } = self;
        journal.shutdown()?;
        if read_only {
            return writeback;
        }
        let mut sb = sb.into_inner();
        let counters = &groups.counters;
        sb.free_blocks_count = counters.free_blocks.load(Ordering::Acquire).max(0) as u64;
        sb.free_inodes_count = counters.free_inodes.load(Ordering::Acquire).max(0) as u32;
        // Everything is checkpointed: the home superblock is current except for what only
        // the in-memory copy knows.
        let mut raw = vec![0u8; ext4::SUPERBLOCK_SIZE];
        dev.read_at(ext4::SUPERBLOCK_OFFSET, &mut raw)?;
        let mut home = Superblock::parse(&raw)?;
        home.free_blocks_count = sb.free_blocks_count;
        home.free_inodes_count = sb.free_inodes_count;
        home.set_needs_recovery(false);
        if !orphan_file_used {
            home.feature_ro_compat &= !feature::RO_COMPAT_ORPHAN_PRESENT;
        }
        // ext4_put_super writes back the state found at mount (s_mount_state): a file system
        // mounted unchecked stays so until e2fsck, and errors are kept.
        home.state = (home.state & !ext4::STATE_VALID_FS) | (mount_state & ext4::STATE_VALID_FS);
        if errors_seen {
            home.state |= ext4::STATE_ERROR_FS;
        }
        // Errors recorded while mounted: the home copy has them unless a checkpoint wrote an
        // older journaled superblock since.
        crate::error_policy::copy_error_record(&mut home, &sb);
        home.wtime = now().sec as u32;
        dev.write_at(ext4::SUPERBLOCK_OFFSET, &home.encode())?;
        dev.flush()?;
        // Last: another host may take the file system once the MMP block says clean.
        if let Some(mmp) = mmp {
            mmp.release()?;
        }
        // A writeback failure is still reported, after everything else was kept.
        writeback
    }

    /// Leaves the device as a crash would (tests): nothing more is committed or written.
    pub fn crash(self) {
        self.journal.abandon();
        if let Some(mmp) = self.mmp {
            mmp.abandon();
        }
    }

    pub fn options(&self) -> &MountOptions {
        &self.options
    }

    /// Locks inode `slot`, loading its record on first use.
    pub(crate) fn lock_inode<'a>(&self, slot: &'a InodeSlot) -> Result<InodeGuard<'a>> {
        let mut guard = slot.state.lock();
        if guard.is_none() {
            let ino = slot.ino;
            *guard = Some(self.load_inode(ino).map_err(|e| self.check_fs_error(ino, e))?);
        }
        Ok(guard)
    }

    pub(crate) fn inode_table_location(&self, ino: u32) -> Result<(u64, usize)> {
        let geo = &self.groups.geo;
        if ino == 0 || ino > geo.inodes_count {
            return Err(FsError::NoSuchInode { ino, inodes_count: geo.inodes_count });
        }
        let group = geo.group_of_inode(ino);
        Ok(geo.inode_location(self.groups.layouts[group as usize].inode_table, ino))
    }

    pub(crate) fn load_inode(&self, ino: u32) -> Result<InodeData> {
        let (block, offset) = self.inode_table_location(ino)?;
        let size = usize::from(self.params.inode_size);
        let buffer = self.journal.read_buffer(block)?;
        let raw = buffer.read(|b| b[offset..offset + size].to_vec());
        if !ext4::inode_checksum_ok(&self.params, ino, &raw) {
            return Err(FsError::corrupted(block, format!("inode {ino}: checksum mismatch")));
        }
        let inode = inodes::parse_record(block, &raw)?;
        let orphan = self.orphans.lock().contains(ino);
        let mut data = InodeData::new(inode, raw, orphan);
        self.recharge(ino, &mut data)?;
        Ok(data)
    }

    /// Writes `data`'s inode into the inode table under `txn`, with its checksum, and charges
    /// the quota files for what changed in its usage or owners (`quota.rs`).
    pub(crate) fn write_inode(
        &self,
        txn: &mut Txn<'_>,
        ino: u32,
        data: &mut InodeData,
        data_change: bool,
    ) -> Result<()> {
        if let Some(quotas) = self.quotas.get() {
            let charge = quotas.charge_of(self, txn, ino, data)?;
            if charge != data.quota {
                quotas.transfer(txn, &data.quota, &charge)?;
                data.quota = charge;
                // A fast commit's replay charges nothing.
                data.fc.ineligible_in(txn.handle.tid(), crate::quota::QUOTA_CHANGE);
            }
        }
        let handle = &mut txn.handle;
        let (block, offset) = self.inode_table_location(ino)?;
        let buffer = self.journal.read_buffer(block)?;
        // An orphan's i_dtime is the orphan list's next pointer, which another inode's removal
        // may have changed: take it from the list, under the list's lock (orphan.rs).
        let orphans = data.orphan.then(|| self.orphans.lock());
        if let Some(next) = orphans.as_ref().and_then(|o| crate::orphan::next_of(&o.list, ino)) {
            data.inode.dtime = next;
        }
        data.inode.encode_into(&mut data.raw);
        ext4::set_inode_checksum(&self.params, ino, &mut data.raw);
        handle
            .modify(&buffer, |b| b[offset..offset + data.raw.len()].copy_from_slice(&data.raw))?;
        drop(orphans);
        data.fc.note_write(handle.tid());
        data.last_tid = Some(handle.tid());
        if data_change {
            data.last_data_tid = Some(handle.tid());
        }
        Ok(())
    }

    /// A generation number for a new inode.
    pub(crate) fn new_generation(&self) -> u32 {
        self.next_generation.fetch_add(0x9E37_79B9, Ordering::Relaxed)
    }

    /// The most credits one operation's own changes may plan for: a transaction's maximum
    /// less what [`Filesystem::begin_with`] sets aside for quota charges.
    pub(crate) fn max_op_credits(&self) -> u32 {
        let quota = self.quotas.get().map_or(0, |q| q.credits());
        self.journal.max_transaction_credits().saturating_sub(quota).max(1)
    }

    /// Starts an operation: reserves `blocks` new metadata blocks (directory, tree, xattr
    /// blocks: a cluster each with bigalloc), then starts a handle with `credits`.
    pub(crate) fn begin(&self, credits: u32, blocks: u64) -> Result<Txn<'_>> {
        self.check_writable()?;
        let reservation =
            self.groups.reserve(&self.journal, self.groups.geo.meta_blocks(blocks))?;
        self.begin_with(credits, reservation)
    }

    /// Starts an operation with blocks reserved already (writeback of cached data, whose
    /// blocks were reserved when it was written; freeing, which needs none).
    pub(crate) fn begin_with(
        &self,
        credits: u32,
        reservation: crate::groups::Reservation,
    ) -> Result<Txn<'_>> {
        self.check_writable()?;
        // No handle is held here: the place to journal an error recorded by `fail`.
        self.save_error_state();
        // Quota charges come on top of what the operation planned, set aside so that an
        // operation spending credits as they last never spends those.
        let quota = self.quotas.get().map_or(0, |q| q.credits());
        let credits = credits.saturating_add(quota).min(self.journal.max_transaction_credits());
        let mut handle = self.journal.start(credits)?;
        handle.set_aside(quota);
        Ok(Txn {
            fs: self,
            handle,
            reservation,
            blocks_delta: 0,
            fresh: HashSet::new(),
            revoke_freed_data: self.options.data == DataMode::Journal,
            deferred: DeferredData::default(),
        })
    }

    /// The inode's checksum seed for its extent, directory and xattr blocks.
    pub(crate) fn inode_csum_seed(&self, ino: u32, generation: u32) -> Option<u32> {
        self.params
            .has_metadata_csum()
            .then(|| ext4::inode_csum_seed(&self.params, ino, generation))
    }

    /// Writes the superblock (orphan head, counters) into its block under `handle`.
    pub(crate) fn write_superblock(&self, handle: &mut Handle, sb: &Superblock) -> Result<()> {
        let block_size = u64::from(self.block_size());
        let block = ext4::SUPERBLOCK_OFFSET / block_size;
        let offset = (ext4::SUPERBLOCK_OFFSET % block_size) as usize;
        let buffer = self.journal.read_buffer(block)?;
        let bytes = sb.encode();
        handle.modify(&buffer, |b| b[offset..offset + bytes.len()].copy_from_slice(&bytes))?;
        Ok(())
    }

    fn process_orphans(&self) -> Result<()> {
        crate::orphan::process_orphans(self)
    }
}

/// Refuses what quill cannot honour, naming the features.
pub(crate) fn check_features(sb: &Superblock, read_only: bool) -> Result<()> {
    let unreadable = sb.feature_incompat & feature::INCOMPAT_UNREADABLE;
    if unreadable != 0 {
        return Err(FsError::Unsupported(format!(
            "incompatible features {}",
            feature::incompat_names(unreadable)
        )));
    }
    if read_only {
        return Ok(());
    }
    // ext4_fill_super: "Can't support bigalloc feature without extents feature" (mke2fs
    // refuses to make one).
    if sb.has_bigalloc() && sb.feature_incompat & feature::INCOMPAT_EXTENTS == 0 {
        return Err(FsError::Unsupported(
            "cannot write a file system with bigalloc but without extents (open it read-only)"
                .into(),
        ));
    }
    // Clusters line up with block 0 only when groups start there (mke2fs makes it so).
    if sb.has_bigalloc() && sb.first_data_block != 0 {
        return Err(FsError::Unsupported(format!(
            "cannot write a bigalloc file system whose first data block is {} (open it \
             read-only)",
            sb.first_data_block
        )));
    }
    let incompat = sb.feature_incompat & !INCOMPAT_WRITABLE;
    if incompat != 0 {
        return Err(FsError::Unsupported(format!(
            "cannot write a file system with {} (open it read-only)",
            feature::incompat_names(incompat)
        )));
    }
    // orphan_present only says the orphan file may hold entries, which open processes.
    let orphan_present = if sb.feature_compat & feature::COMPAT_ORPHAN_FILE != 0 {
        feature::RO_COMPAT_ORPHAN_PRESENT
    } else {
        0
    };
    let ro_compat = sb.feature_ro_compat & !(RO_COMPAT_WRITABLE | orphan_present);
    if ro_compat != 0 {
        return Err(FsError::Unsupported(format!(
            "cannot write a file system with {} (open it read-only)",
            feature::ro_compat_names(ro_compat)
        )));
    }
    Ok(())
}

/// Writes the superblock of a file system being mounted read-write (`sb`, with its state and
/// needs_recovery as the mount wants them), with the mount count and time, and flushes.
fn mark_mounted(dev: &dyn BlockDevice, sb: &mut Superblock) -> Result<()> {
    if sb.feature_compat & feature::COMPAT_ORPHAN_FILE != 0 {
        // As ext4_setup_super: the orphan file may hold entries until unmount.
        sb.feature_ro_compat |= feature::RO_COMPAT_ORPHAN_PRESENT;
    }
    sb.mnt_count = sb.mnt_count.wrapping_add(1);
    sb.mtime = now().sec as u32;
    dev.write_at(ext4::SUPERBLOCK_OFFSET, &sb.encode())?;
    dev.flush()?;
    Ok(())
}

/// The current time as an ext4 timestamp.
pub(crate) fn now() -> ext4::Timestamp {
    let since =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    ext4::Timestamp { sec: since.as_secs() as i64, nsec: since.subsec_nanos() }
}

/// One operation's journal handle, block reservation, and bookkeeping; implements [`MetaIo`]
/// for the structure modules.
pub(crate) struct Txn<'a> {
    pub fs: &'a Filesystem,
    pub handle: Handle,
    pub reservation: Reservation,
    /// Blocks allocated minus blocks freed through [`MetaIo`] since the last
    /// [`Txn::take_blocks_delta`]: the i_blocks change of the inode being worked on.
    pub blocks_delta: i64,
    /// Blocks allocated in this operation (their old contents need not be read).
    fresh: HashSet<u64>,
    /// Revoke the "data" blocks this operation frees: they were journaled (a directory's
    /// blocks, or file data under data=journal), so neither recovery nor a checkpoint may write
    /// an old copy over the blocks' next owner.
    pub revoke_freed_data: bool,
    /// File data the handle's changes refer to, written once the handle stops (`data.rs`).
    pub deferred: DeferredData,
}

impl Drop for Txn<'_> {
    fn drop(&mut self) {
        // Given up without `stop` (an error path): whatever data the transaction maps is
        // written still, so its commit is not kept waiting; a failure surfaces through that
        // commit.
        let _ = self.deferred.write(&self.fs.clean_cache, true);
    }
}

impl Txn<'_> {
    pub fn take_blocks_delta(&mut self) -> i64 {
        std::mem::take(&mut self.blocks_delta)
    }

    /// Allocates up to `want` contiguous data blocks near `goal` (whole clusters with
    /// bigalloc: [`MetaIo::alloc_data_blocks`]).
    fn alloc_data(&mut self, goal: u64, want: u32) -> Result<(u64, u32)> {
        let fs = self.fs;
        let (start, len) = fs.groups.alloc_blocks(
            &fs.journal,
            &mut self.handle,
            &mut self.reservation,
            goal,
            want,
        )?;
        self.blocks_delta += i64::from(len);
        Ok((start, len))
    }

    /// Stops the handle, then writes the data its changes refer to ([`DeferredData`]). A
    /// failed data write is a file-system error ([`Filesystem::fail`]), as a failed write
    /// inside the handle was.
    pub fn stop(mut self) -> Result<ondisk::Tid> {
        let stopped = self.handle.stop_in_place();
        let written = self.deferred.write(&self.fs.clean_cache, stopped.is_ok());
        let tid = stopped?;
        written.map_err(|err| self.fs.fail(err))?;
        Ok(tid)
    }
}

impl MetaIo for Txn<'_> {
    fn block_size(&self) -> usize {
        self.fs.block_size() as usize
    }

    fn blocks_count(&self) -> u64 {
        self.fs.params.blocks_count
    }

    fn read_meta(&mut self, block: u64) -> Result<Vec<u8>> {
        check_block(self.fs, block)?;
        Ok(self.fs.journal.read_buffer(block)?.to_vec())
    }

    fn write_meta(&mut self, block: u64, data: &[u8]) -> Result<()> {
        check_block(self.fs, block)?;
        let buffer = if self.fresh.contains(&block) {
            // Nothing on the device points to it yet: without a journal it goes home before
            // the blocks that will (`journal::HomeOrder`).
            self.handle.order_home_write(block, HomeOrder::Early);
            self.fs.journal.new_buffer(block)
        } else {
            self.fs.journal.read_buffer(block)?
        };
        self.handle.modify(&buffer, |b| b.copy_from_slice(data))?;
        Ok(())
    }

    fn alloc_meta_block(&mut self, goal: u64) -> Result<u64> {
        let (block, _) = self.alloc_data(goal, 1)?;
        self.fresh.insert(block);
        Ok(block)
    }

    fn free_meta_block(&mut self, block: u64) -> Result<()> {
        self.handle.revoke(block)?;
        let fs = self.fs;
        // With bigalloc the block took a cluster of its own (the kernel's
        // `ext4_new_meta_blocks`): the cluster goes, and i_blocks counted all of it.
        let cluster = u64::from(fs.groups.geo.cluster_blocks());
        fs.groups.free_blocks(&fs.journal, &mut self.handle, block - block % cluster, cluster)?;
        self.blocks_delta -= cluster as i64;
        Ok(())
    }

    fn free_data_blocks(&mut self, start: u64, count: u64) -> Result<()> {
        let fs = self.fs;
        if fs.groups.geo.cluster_bits == 0 {
            self.revoke_data(start, count)?;
        }
        fs.groups.free_blocks(&fs.journal, &mut self.handle, start, count)?;
        self.blocks_delta -= count as i64;
        Ok(())
    }

    fn cluster_blocks(&self) -> u32 {
        self.fs.groups.geo.cluster_blocks()
    }

    fn alloc_data_blocks(&mut self, goal: u64, want: u32) -> Result<(u64, u32)> {
        self.alloc_data(goal, want)
    }

    fn claim_fresh(&mut self, block: u64) {
        self.fresh.insert(block);
    }

    fn revoke_data(&mut self, start: u64, count: u64) -> Result<()> {
        if self.revoke_freed_data {
            for block in start..start + count {
                self.handle.revoke(block)?;
            }
        }
        Ok(())
    }

    fn order_late(&mut self, block: u64) {
        self.handle.order_home_write(block, HomeOrder::Late);
    }

    fn fast_commit_tid(&self) -> Option<ondisk::Tid> {
        self.fs.journal.fast_commits_enabled().then(|| self.handle.tid())
    }

    fn system_zone_overlap(&self, start: u64, len: u64) -> Option<u64> {
        self.fs.groups.system_zone_overlap(start, len)
    }

    fn value_inodes(&mut self) -> Option<&mut dyn crate::xattr::ValueInodes> {
        Some(self)
    }
}

fn check_block(fs: &Filesystem, block: u64) -> Result<()> {
    let blocks_count = fs.params.blocks_count;
    if block == 0 || block >= blocks_count {
        return Err(FsError::BlockOutOfRange { block, blocks_count });
    }
    Ok(())
}
