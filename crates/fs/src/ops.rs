//! Namespace operations: lookup, getattr, setattr, mknod/create, mkdir, symlink, link,
//! unlink, rmdir, rename, readlink, readdir, statfs, sync, fsync, and extended attributes.
//!
//! Each changing operation follows one shape: lock the inodes involved (lock order in
//! `filesystem.rs`), check everything that can fail for ordinary reasons, reserve blocks and
//! start a handle ([`Filesystem::begin`]), change metadata, write the inodes, stop the handle.
//! Errors after the first change go through [`Filesystem::fail`].

use std::sync::Arc;

use ondisk::ext4::{self, Inode, Timestamp};

use crate::acl;
use crate::adapters::ReadIo;
use crate::block_map;
use crate::dir;
use crate::error::{FsError, Result};
use crate::extent_tree;
use crate::filesystem::{now, Filesystem, Txn};
use crate::fsync_journal::FsyncPlan;
use crate::inode_flags;
use crate::inodes::{self, InodeData, InodeGuard, InodeSlot};
use crate::xattr::{self, SetMode, XattrCtx};

/// The root directory's inode number.
pub const ROOT_INO: u32 = ext4::ROOT_INO;
/// ext4's link-count limit (EXT4_LINK_MAX); directories past it count 1 with dir_nlink.
pub const LINK_MAX: u16 = 65000;
/// Longest symlink target stored in `i_block` (a fast symlink).
const FAST_SYMLINK_MAX: usize = ext4::INODE_BLOCK_SIZE - 1;
/// Journal credits of a namespace operation: directory blocks (htree leaf and index splits),
/// two extent-tree paths, inode table blocks, bitmaps, descriptors, superblock.
const NAMESPACE_CREDITS: u32 = 96;
/// Blocks a namespace operation may allocate: a directory block, htree splits, extent nodes.
const NAMESPACE_BLOCKS: u64 = 16;

/// An inode's attributes, as stat reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    pub ino: u32,
    pub mode: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    /// 512-byte sectors allocated.
    pub blocks: u64,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    pub crtime: Timestamp,
    /// Device number of a character or block special file.
    pub rdev: u32,
    pub generation: u32,
    pub block_size: u32,
}

/// Which attributes setattr changes.
#[derive(Debug, Clone, Default)]
pub struct SetAttr {
    pub mode: Option<u16>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<Timestamp>,
    pub mtime: Option<Timestamp>,
    /// The times given are the current time (utimensat with UTIME_NOW or no times, `touch`),
    /// which the owner of an append-only file may still set; explicit times it may not.
    pub times_to_now: bool,
}

impl SetAttr {
    /// EPERM where the inode's flags forbid the change (the VFS's `notify_change` checks): an
    /// immutable inode takes none, an append-only one no mode, owner, size or explicit time.
    fn check_flags(&self, inode: &ondisk::ext4::Inode) -> Result<()> {
        let times = self.atime.is_some() || self.mtime.is_some();
        if self.mode.is_some() || self.uid.is_some() || self.gid.is_some() || self.size.is_some() {
            return inode_flags::check_unpinned(inode);
        }
        if times && !self.times_to_now {
            return inode_flags::check_unpinned(inode);
        }
        if times {
            return inode_flags::check_mutable(inode);
        }
        Ok(())
    }
}

/// One directory entry returned by readdir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub ino: u32,
    pub file_type: u8,
    /// Pass this to the next readdir call to continue after this entry.
    pub next_cookie: u64,
}

/// rename flags (renameat2).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RenameFlags {
    pub noreplace: bool,
    pub exchange: bool,
    /// RENAME_WHITEOUT (overlayfs): the old name is left to a whiteout, a character device
    /// 0:0 with mode 0, owned by this uid and gid, made in the same transaction.
    pub whiteout: Option<(u32, u32)>,
}

/// File-system statistics (statfs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatFs {
    pub block_size: u32,
    pub blocks: u64,
    pub blocks_free: u64,
    pub blocks_available: u64,
    pub inodes: u64,
    pub inodes_free: u64,
    pub name_max: u32,
}

impl Filesystem {
    /// The attributes of a locked inode: the size and block count include cached writes.
    pub(crate) fn attr_of(&self, ino: u32, data: &InodeData) -> Attr {
        let inode = &data.inode;
        let delayed_blocks = data.cache.hole_blocks(self.groups.geo.cluster_bits);
        let delayed_512 = delayed_blocks * u64::from(self.block_size() / 512);
        let rdev = if matches!(inode.file_type(), ext4::MODE_CHRDEV | ext4::MODE_BLKDEV) {
            decode_rdev(&inode.block)
        } else {
            0
        };
        Attr {
            ino,
            mode: inode.mode,
            nlink: u32::from(inode.links_count),
            uid: inode.uid,
            gid: inode.gid,
            size: data.size(),
            blocks: inode.blocks_512(self.block_size()) + delayed_512,
            atime: inode.atime,
            mtime: inode.mtime,
            ctime: inode.ctime,
            crtime: inode.crtime,
            rdev,
            generation: inode.generation,
            block_size: self.block_size(),
        }
    }

    /// A live (linked or open) inode's slot, locked. Inode numbers come from callers (FUSE)
    /// and directory entries, so a free or out-of-range inode is an error, not a panic.
    pub(crate) fn lock_live<'a>(&self, slot: &'a InodeSlot) -> Result<InodeGuard<'a>> {
        let guard = self.lock_inode(slot)?;
        if guard.as_ref().expect("loaded").is_deleted() {
            return Err(FsError::NotFound);
        }
        Ok(guard)
    }

    pub fn getattr(&self, ino: u32) -> Result<Attr> {
        let slot = self.inodes.slot(ino);
        let guard = self.lock_live(&slot)?;
        Ok(self.attr_of(ino, guard.as_ref().expect("loaded")))
    }

    /// An inode by its number alone, as a file handle names it (NFS export,
    /// open_by_handle_at): its attributes, with the generation the handle is checked against.
    /// Numbers no file can have (the reserved inodes but the root, past the inode count),
    /// free inodes and unlinked ones still open are `NotFound`, as ext4's handle lookup
    /// (`ext4_nfs_get_inode`) answers ESTALE for them; so are value inodes (ea_inode), which
    /// hold an xattr value, not a file (the kernel's iget refuses them as files).
    pub fn lookup_by_number(&self, ino: u32) -> Result<Attr> {
        let sb = &self.params;
        if ino != ROOT_INO && !(sb.first_ino..=sb.inodes_count).contains(&ino) {
            return Err(FsError::NotFound);
        }
        {
            let slot = self.inodes.slot(ino);
            let guard = self.lock_live(&slot)?;
            // Value inodes and the project quota file are no files to a lookup, as the
            // kernel's iget refuses them (EXT4_IGET_SPECIAL).
            if guard.as_ref().expect("loaded").inode.flags & ext4::EA_INODE_FL != 0
                || sb.quota_inums.contains(&ino)
            {
                return Err(FsError::NotFound);
            }
        }
        let attr = self.getattr(ino)?;
        if attr.nlink == 0 {
            return Err(FsError::NotFound);
        }
        Ok(attr)
    }

    /// Looks `name` up in directory `parent`; returns the child's attributes.
    pub fn lookup(&self, parent: u32, name: &[u8]) -> Result<Attr> {
        let ino = self.lookup_ino(parent, name)?;
        self.getattr(ino)
    }

    pub(crate) fn lookup_ino(&self, parent: u32, name: &[u8]) -> Result<u32> {
        // The dentry cache answers without the directory's lock (see dcache.rs for why that
        // is coherent); a miss searches under the lock and fills it.
        if let Some(entry) = self.dentries.get(parent, name) {
            return entry.map(|(ino, _)| ino).ok_or(FsError::NotFound);
        }
        let slot = self.inodes.slot(parent);
        let mut guard = self.lock_live(&slot)?;
        let data = guard.as_mut().expect("loaded");
        self.dir_lookup_locked(parent, data, name)?.map(|(ino, _)| ino).ok_or(FsError::NotFound)
    }

    /// The parent of directory `dir` (its `..` entry).
    pub(crate) fn lookup_dotdot(&self, dir: u32) -> Result<u32> {
        let slot = self.inodes.slot(dir);
        let mut guard = self.lock_live(&slot)?;
        let data = guard.as_mut().expect("loaded");
        if !data.inode.is_dir() {
            return Err(FsError::NotDir);
        }
        self.with_dir_read(dir, data, |access, ctx| dir::lookup(access, ctx, b".."))?
            .map(|(ino, _)| ino)
            .ok_or_else(|| FsError::corrupted(0, format!("directory {dir} has no `..` entry")))
    }

    /// `NoSpace` when directory `dir_ino` (locked; `data` its record) cannot take `name`:
    /// its hashed index is full where the name goes (`dir::check_room`). Checked before an
    /// operation changes anything, as ext4 fails such an add before it commits a change.
    pub(crate) fn dir_check_room(
        &self,
        dir_ino: u32,
        data: &mut InodeData,
        name: &[u8],
    ) -> Result<()> {
        self.with_dir_read(dir_ino, data, |access, ctx| dir::check_room(access, ctx, name))
    }

    pub(crate) fn dir_lookup_locked(
        &self,
        dir_ino: u32,
        data: &mut InodeData,
        name: &[u8],
    ) -> Result<Option<(u32, u8)>> {
        if !data.inode.is_dir() {
            return Err(FsError::NotDir);
        }
        check_name(name)?;
        // Under the directory's lock the cache is exact.
        if let Some(entry) = self.dentries.get(dir_ino, name) {
            return Ok(entry);
        }
        let found =
            self.with_dir_read(dir_ino, data, |access, ctx| dir::lookup(access, ctx, name))?;
        self.dentries.insert(dir_ino, name, found);
        Ok(found)
    }

    /// Resolves an absolute path ("/a/b") to an inode number.
    pub fn resolve(&self, path: &str) -> Result<u32> {
        let mut ino = ROOT_INO;
        for part in path.split('/').filter(|p| !p.is_empty()) {
            ino = self.lookup_ino(ino, part.as_bytes())?;
        }
        Ok(ino)
    }

    /// Reads up to `max` entries of directory `ino` after `cookie` (0 = from the start).
    pub fn readdir(&self, ino: u32, cookie: u64, max: usize) -> Result<Vec<DirEntry>> {
        let slot = self.inodes.slot(ino);
        let mut guard = self.lock_live(&slot)?;
        let data = guard.as_mut().expect("loaded");
        if !data.inode.is_dir() {
            return Err(FsError::NotDir);
        }
        // Names of deleted inodes are left out: getattr says they do not exist (lock_live).
        let entries: Vec<DirEntry> = self
            .with_dir_read(ino, data, |access, ctx| dir::read_dir(access, ctx, cookie, max))?
            .into_iter()
            .filter(|e| e.ino == ino || e.name == b".." || !self.names_deleted_inode(e.ino))
            .map(|e| DirEntry {
                name: e.name,
                ino: e.ino,
                file_type: e.file_type,
                next_cookie: e.next_cookie,
            })
            .collect();
        let atime_due = self.atime_due(&data.inode, true);
        drop(guard);
        if atime_due {
            // As iterate_dir's file_accessed; a failed update fails no listing.
            let _ = self.touch_atime(ino, true);
        }
        Ok(entries)
    }

    /// Whether a directory entry's inode `ino` is deleted, for readdir. The directory is locked,
    /// and an entry of a damaged directory may name an ancestor: the inode is only tried (a
    /// locked one is someone's live inode), and one that cannot be read is listed (getattr
    /// reports the error).
    fn names_deleted_inode(&self, ino: u32) -> bool {
        let slot = self.inodes.slot(ino);
        let Some(mut guard) = slot.state.try_lock() else { return false };
        if guard.is_none() {
            match self.load_inode(ino) {
                Ok(data) => *guard = Some(data),
                Err(_) => return false,
            }
        }
        guard.as_ref().is_some_and(InodeData::is_deleted)
    }

    pub fn readlink(&self, ino: u32) -> Result<Vec<u8>> {
        let slot = self.inodes.slot(ino);
        let mut guard = self.lock_live(&slot)?;
        let data = guard.as_mut().expect("loaded");
        if !data.inode.is_symlink() {
            return Err(FsError::Invalid(format!("inode {ino} is not a symbolic link")));
        }
        let len = data.size() as usize;
        if data.inode.has_inline_data() {
            // A target kept inline (e2fsprogs writes long ones so): i_block and system.data.
            return self.inline_file_bytes(ino, data).map_err(|e| self.check_fs_error(ino, e));
        }
        if data.inode.flags & ext4::EXTENTS_FL == 0 && len < ext4::INODE_BLOCK_SIZE {
            // A fast symlink: the target lives in i_block.
            return Ok(data.inode.block[..len].to_vec());
        }
        if len > self.block_size() as usize {
            let err = FsError::corrupted(0, format!("symlink {ino} of {len} bytes"));
            return Err(self.check_fs_error(ino, err));
        }
        // A slow symlink's block is journaled metadata: read it through the journal's cache,
        // which has it even before it is checkpointed home.
        let mut block = self.with_dir_read(ino, data, |access, _| access.read_dir_block(0))?;
        block.truncate(len);
        Ok(block)
    }

    pub fn statfs(&self) -> StatFs {
        let counters = &self.groups.counters;
        let free = self.groups.available_blocks();
        StatFs {
            block_size: self.block_size(),
            blocks: self.params.blocks_count,
            blocks_free: free,
            blocks_available: free
                .saturating_sub(self.params.r_blocks_count)
                .saturating_sub(self.groups.metadata_pool as u64),
            inodes: u64::from(self.params.inodes_count),
            inodes_free: counters.free_inodes.load(std::sync::atomic::Ordering::Acquire).max(0)
                as u64,
            name_max: 255,
        }
    }

    /// Makes everything done so far durable (syncfs).
    pub fn sync(&self) -> Result<()> {
        self.writeback_all()?;
        self.journal.commit_all()?;
        self.dev.flush()?;
        Ok(())
    }

    /// fsync / fdatasync: waits for the newest transaction that changed the inode (for
    /// fdatasync, that changed its size or mappings) and flushes the device, so data written
    /// in place is durable too. Like ext4, fsync of a new file also covers its directory entry:
    /// the entry was added in the same transaction that created the inode, or an earlier one.
    pub fn fsync(&self, ino: u32, datasync: bool) -> Result<()> {
        let slot = self.inodes.slot(ino);
        // The transaction to make durable, if it is not yet, and how (fsync_journal.rs).
        let pending = {
            let mut guard = self.lock_live(&slot)?;
            let data = guard.as_mut().expect("loaded");
            self.writeback_locked(ino, data)?;
            match if datasync { data.last_data_tid } else { data.last_tid } {
                Some(tid) if !self.journal.last_durable().is_at_or_after(tid) => {
                    let plan = self.fsync_plan(ino, data, tid)?;
                    // Queued under the inode's lock, in the order of the plans.
                    let ticket = match &plan {
                        FsyncPlan::FastCommit(fc) => self.queue_fast_commit(fc),
                        _ => None,
                    };
                    Some((tid, plan, ticket))
                }
                _ => None,
            }
        };
        match pending {
            // Durable already: data written in place still needs the device's flush.
            None => self.dev.flush()?,
            Some((_, FsyncPlan::AlreadyDurable, _)) => {}
            // iJournaling: the file alone, as a fast commit, when it can; else the
            // transaction, whose commit flushes the device before its commit block.
            Some((tid, plan, ticket)) => {
                let fast = match (&plan, ticket) {
                    (FsyncPlan::FastCommit(fc), Some(ticket)) => {
                        self.wait_fast_commit(fc, ticket)?
                    }
                    _ => false,
                };
                if !fast {
                    self.journal.commit_and_wait(tid)?;
                    if self.journal.fast_commits_enabled() && self.group_initialized_in_log() {
                        self.journal.checkpoint_all()?;
                    }
                }
            }
        }
        self.journal.check_aborted()?;
        Ok(())
    }

    pub fn setattr(&self, ino: u32, set: &SetAttr) -> Result<Attr> {
        if set.size.is_some() {
            // Before the truncate: an append-only file refuses the whole request.
            let slot = self.inodes.slot(ino);
            let guard = self.lock_live(&slot)?;
            set.check_flags(&guard.as_ref().expect("loaded").inode)?;
        }
        if let Some(size) = set.size {
            self.truncate(ino, size)?;
        }
        let slot = self.inodes.slot(ino);
        let mut guard = self.lock_live(&slot)?;
        let data = guard.as_mut().expect("loaded");
        SetAttr { size: None, ..set.clone() }.check_flags(&data.inode)?;
        if set.mode.is_none()
            && set.uid.is_none()
            && set.gid.is_none()
            && set.atime.is_none()
            && set.mtime.is_none()
        {
            return Ok(self.attr_of(ino, data));
        }
        if set.uid.is_some() || set.gid.is_some() {
            let inode = &data.inode;
            let owner = (set.uid.unwrap_or(inode.uid), set.gid.unwrap_or(inode.gid));
            self.quota_prepare([owner.0, owner.1, inode.projid])?;
        }
        let mut txn = self.begin(8, 2)?;
        let acl_changed = match set.mode {
            Some(mode) => match self.chmod_acl(&mut txn, ino, data, mode) {
                Ok(changed) => changed,
                Err(err) => return self.finish(Err(err), txn),
            },
            None => false,
        };
        let inode = &mut data.inode;
        if let Some(mode) = set.mode {
            inode.mode = (inode.mode & ext4::MODE_TYPE_MASK) | (mode & 0o7777);
        }
        if let Some(uid) = set.uid {
            inode.uid = uid;
        }
        if let Some(gid) = set.gid {
            inode.gid = gid;
        }
        if let Some(atime) = set.atime {
            inode.atime = atime;
        }
        if let Some(mtime) = set.mtime {
            inode.mtime = mtime;
        }
        inode.ctime = now();
        // Mode, owner and times: an INODE record says it all (a size change went through
        // truncate above, which is not expressible); not an ACL chmod changed.
        if acl_changed {
            data.fc.ineligible_next("xattr");
        } else {
            data.fc.expressible_next();
        }
        self.finish(txn_write_inode(self, &mut txn, ino, data, false), txn)?;
        Ok(self.attr_of(ino, data))
    }

    /// Creates a regular file.
    pub fn create(&self, parent: u32, name: &[u8], mode: u16, uid: u32, gid: u32) -> Result<Attr> {
        self.mknod(parent, name, ext4::MODE_REGULAR | (mode & 0o7777), 0, uid, gid)
    }

    /// Creates a file of any non-directory type (`mode` includes the type bits; `rdev` is the
    /// device number of character and block special files).
    pub fn mknod(
        &self,
        parent: u32,
        name: &[u8],
        mode: u16,
        rdev: u32,
        uid: u32,
        gid: u32,
    ) -> Result<Attr> {
        self.mknod_umask(parent, name, mode, rdev, (uid, gid), 0)
    }

    /// [`Filesystem::mknod`] with the caller's `umask` not yet applied to `mode`: the
    /// directory's default ACL limits the mode instead where it has one (`acl.rs`), as
    /// `posix_acl_create` decides.
    pub fn mknod_umask(
        &self,
        parent: u32,
        name: &[u8],
        mode: u16,
        rdev: u32,
        (uid, gid): (u32, u32),
        umask: u16,
    ) -> Result<Attr> {
        let kind = mode & ext4::MODE_TYPE_MASK;
        let kind = if kind == 0 { ext4::MODE_REGULAR } else { kind };
        if kind == ext4::MODE_DIR {
            return self.mkdir_umask(parent, name, mode, (uid, gid), umask);
        }
        if !matches!(
            kind,
            ext4::MODE_REGULAR
                | ext4::MODE_CHRDEV
                | ext4::MODE_BLKDEV
                | ext4::MODE_FIFO
                | ext4::MODE_SOCKET
                | ext4::MODE_SYMLINK
        ) {
            return Err(FsError::Invalid(format!("file type {kind:#o}")));
        }
        let owner = (uid, gid, umask);
        self.create_node(parent, name, kind | (mode & 0o7777), owner, None, |_, inode| {
            // Device, fifo and socket inodes map nothing: ext4 gives them no extent header
            // (e2fsck calls one that has it an illegal inode); devices keep their number in
            // i_block.
            if matches!(
                kind,
                ext4::MODE_CHRDEV | ext4::MODE_BLKDEV | ext4::MODE_FIFO | ext4::MODE_SOCKET
            ) {
                inode.flags &= !ext4::EXTENTS_FL;
                inode.block = [0; ext4::INODE_BLOCK_SIZE];
            }
            if matches!(kind, ext4::MODE_CHRDEV | ext4::MODE_BLKDEV) {
                encode_rdev(&mut inode.block, rdev);
            }
            Ok(())
        })
    }

    pub fn mkdir(&self, parent: u32, name: &[u8], mode: u16, uid: u32, gid: u32) -> Result<Attr> {
        self.mkdir_umask(parent, name, mode, (uid, gid), 0)
    }

    /// [`Filesystem::mkdir`] with the caller's `umask` not yet applied (see
    /// [`Filesystem::mknod_umask`]).
    pub fn mkdir_umask(
        &self,
        parent: u32,
        name: &[u8],
        mode: u16,
        (uid, gid): (u32, u32),
        umask: u16,
    ) -> Result<Attr> {
        let mode = ext4::MODE_DIR | (mode & 0o7777);
        self.create_node(parent, name, mode, (uid, gid, umask), None, |_, _| Ok(()))
    }

    pub fn symlink(
        &self,
        parent: u32,
        name: &[u8],
        target: &[u8],
        uid: u32,
        gid: u32,
    ) -> Result<Attr> {
        if target.is_empty() || target.len() >= self.block_size() as usize || target.len() > 4095 {
            return Err(FsError::NameTooLong);
        }
        let fast = target.len() <= FAST_SYMLINK_MAX;
        let slow_block = (!fast).then_some(target);
        let mode = ext4::MODE_SYMLINK | 0o777;
        let attr =
            self.create_node(parent, name, mode, (uid, gid, 0), slow_block, |_, inode| {
                if fast {
                    inode.flags &= !ext4::EXTENTS_FL;
                    inode.block = [0; ext4::INODE_BLOCK_SIZE];
                    inode.block[..target.len()].copy_from_slice(target);
                    inode.size = target.len() as u64;
                }
                Ok(())
            })?;
        self.getattr(attr.ino)
    }

    /// Creates an inode of `mode` and links it as `name` in `parent`. `init` finishes the new
    /// inode (device numbers, fast symlink targets) before it is written.
    fn create_node(
        &self,
        parent: u32,
        name: &[u8],
        mode: u16,
        (uid, gid, umask): (u32, u32, u16),
        first_block: Option<&[u8]>,
        init: impl FnOnce(u32, &mut Inode) -> Result<()>,
    ) -> Result<Attr> {
        check_name(name)?;
        let is_dir = mode & ext4::MODE_TYPE_MASK == ext4::MODE_DIR;
        let pslot = self.inodes.slot(parent);
        let mut pguard = self.lock_live(&pslot)?;
        let pdata = pguard.as_mut().expect("loaded");
        inode_flags::check_mutable(&pdata.inode)?;
        // The umask, or the directory's default ACL (which then gives the inode its own).
        let mut mode = mode;
        let acls = self.new_inode_acls(parent, pdata, &mut mode, umask)?;
        if self.dir_lookup_locked(parent, pdata, name)?.is_some() {
            return Err(FsError::Exists);
        }
        self.dir_check_room(parent, pdata, name)?;
        if is_dir && pdata.inode.links_count >= LINK_MAX && !self.has_dir_nlink() {
            return Err(FsError::TooManyLinks);
        }
        let projid = self.project_inherited(&pdata.inode).unwrap_or(0);
        self.quota_prepare([uid, gid, projid])?;
        let mut txn = self.begin(NAMESPACE_CREDITS, NAMESPACE_BLOCKS)?;
        let parent_group = self.groups.geo.group_of_inode(parent);
        let ino =
            match self.groups.alloc_inode(&self.journal, &mut txn.handle, parent_group, is_dir) {
                Ok(ino) => ino,
                // No free inode: an ordinary ENOSPC met before anything changed (ext4_new_inode
                // fails so without ext4_error), not a reason to abort the journal.
                Err(FsError::NoSpace) => {
                    txn.stop()?;
                    return Err(FsError::NoSpace);
                }
                Err(err) => return self.finish(Err(err), txn),
            };
        // The new inode's lock, held from here until its state is in the slot. Its name is
        // visible without the parent's lock as soon as `dir_add` fills the dentry cache, and
        // its record as soon as `write_inode` runs: another thread that locked the slot in
        // between would load that record, change it (a setxattr), and have the change
        // overwritten when the slot is filled here. Taking an inode lock inside a handle is
        // the one exception to the lock order (`filesystem.rs`), and cannot deadlock: the
        // number was free until `alloc_inode`, and every operation finds a free inode deleted
        // (`lock_live`) and lets go of it without starting a handle.
        let new_slot = self.inodes.slot(ino);
        let mut new_guard = new_slot.state.lock();
        // The new inode as far as it got (its blocks, whether its record was written), for
        // undoing it when a later step fails.
        let mut made: Option<(InodeData, bool)> = None;
        let result = (|| {
            let fs = self;
            let extra = fs.new_inode_extra_isize();
            let (mut inode, mut raw) = fs.new_inode_record(mode, (uid, gid));
            inode.flags |= inode_flags::inherited(pdata.inode.flags, mode);
            if fs.project_inherited(&pdata.inode).is_some() {
                // ext4_new_inode: a PROJINHERIT directory gives its project to what is made in
                // it; otherwise the default project, 0.
                inode.projid = pdata.inode.projid;
            }
            let t = inode.ctime;
            init(ino, &mut inode)?;
            fs.put_new_acls(&mut txn, ino, &mut inode, &mut raw, &acls)?;
            let (data, written) = made.insert((InodeData::new(inode, raw, false), false));
            if is_dir && fs.has_inline_data() {
                // As ext4_try_create_inline_dir: the new directory starts in its inode
                // when the record has room for system.data (init_dir below then fills it).
                crate::inline::make_inline_dir(data, parent)?;
            }
            if is_dir {
                fs.with_dir(&mut txn, ino, data, |access, ctx| {
                    dir::init_dir(access, ctx, ino, parent)
                })?;
                let delta = txn.take_blocks_delta();
                add_blocks(&mut data.inode, delta, fs.block_size());
            } else if let Some(content) = first_block {
                // A slow symlink's block, journaled in the creating transaction as ext4 does
                // (ext4_init_symlink_block): a crash never leaves the link without its target.
                fs.with_dir(&mut txn, ino, data, |access, _| {
                    let lblk = access.append_dir_block()?;
                    let mut block = vec![0u8; access.block_size()];
                    block[..content.len()].copy_from_slice(content);
                    access.write_dir_block(lblk, &block)
                })?;
                data.inode.size = content.len() as u64;
                let delta = txn.take_blocks_delta();
                add_blocks(&mut data.inode, delta, fs.block_size());
            }
            let stale_slot = fs.journal.fast_commits_enabled()
                && !fs.inode_slot_tail_clean(ino, 128 + usize::from(extra))?;
            data.fc.expressible_next();
            fs.write_inode(&mut txn, ino, data, true)?;
            *written = true;
            let data = &mut made.as_mut().expect("made above").0;
            let file_type = ondisk::ext4::dir::file_type_from_mode(mode);
            let added = fs.dir_add(&mut txn, parent, pdata, name, ino, file_type)?;
            let tid = txn.handle.tid();
            let record = if stale_slot {
                Err(crate::fsync_journal::STALE_XATTRS)
            } else if acls.any() {
                // An INODE record carries no xattr: replay would give the file no ACL.
                Err("xattr")
            } else {
                fs.create_record(tid, parent, pdata, ino, mode, name, added.lblk)
            };
            data.fc.created(tid, record);
            if is_dir {
                data.fc.block_creates(tid, "parent directory new");
            }
            if is_dir {
                inc_link(&mut pdata.inode, self.has_dir_nlink());
            }
            pdata.inode.mtime = t;
            pdata.inode.ctime = t;
            pdata.fc.ineligible_next("create");
            txn_write_inode(fs, &mut txn, parent, pdata, true)?;
            Ok(fs.attr_of(ino, data))
        })();
        match &result {
            Ok(_) => {
                let (data, _) = made.take().expect("made on success");
                *new_guard = Some(data);
            }
            Err(_) => {
                // ext4's error path (drop_nlink + iput) frees the new inode: do the same in
                // this handle, so that under errors=continue nothing half made commits. If
                // that fails too, the handle is beyond use and `finish` deals with it.
                let _ = self.unmake_inode(&mut txn, ino, is_dir, made.take());
            }
        }
        let (dirsync, tid) = (inode_flags::dirsync(&pdata.inode), txn.handle.tid());
        let attr = self.finish(result, txn)?;
        self.dirsync_commit(dirsync, tid)?;
        Ok(attr)
    }

    /// `i_extra_isize` of a new inode.
    fn new_inode_extra_isize(&self) -> u16 {
        self.params.min_extra_isize.max(32)
    }

    /// A new inode's record: `mode`, owned by `uid`:`gid`, every time now, one link (two for
    /// a directory), a fresh generation and an empty extent tree.
    pub(crate) fn new_inode_record(&self, mode: u16, (uid, gid): (u32, u32)) -> (Inode, Vec<u8>) {
        let extra = self.new_inode_extra_isize();
        let (mut inode, raw) = inodes::new_inode_record(self.params.inode_size, extra);
        let t = now();
        inode.mode = mode;
        inode.uid = uid;
        inode.gid = gid;
        inode.atime = t;
        inode.mtime = t;
        inode.ctime = t;
        inode.crtime = t;
        inode.links_count = if mode & ext4::MODE_TYPE_MASK == ext4::MODE_DIR { 2 } else { 1 };
        inode.generation = self.new_generation();
        if self.params.feature_incompat & ext4::feature::INCOMPAT_EXTENTS != 0 {
            extent_tree::init_root(&mut inode.block);
        } else {
            // ext2 and ext3: files map their blocks by pointers (`indirect.rs`), as the
            // kernel's ext4 makes them where the extent feature is off.
            inode.flags &= !ext4::EXTENTS_FL;
        }
        (inode, raw)
    }

    /// Undoes [`Filesystem::create_node`]'s allocation of inode `ino` under `txn`: frees the
    /// blocks it was given, marks its record deleted if it was written, and frees the number.
    pub(crate) fn unmake_inode(
        &self,
        txn: &mut Txn<'_>,
        ino: u32,
        is_dir: bool,
        made: Option<(InodeData, bool)>,
    ) -> Result<()> {
        if let Some((mut data, written)) = made {
            let ectx = crate::adapters::extent_ctx(self, ino, &data);
            // A new directory's or slow symlink's blocks were journaled: revoke them.
            txn.revoke_freed_data = true;
            let (runs, map_blocks) = block_map::runs_and_map_blocks(txn, &ectx, &data.inode)?;
            crate::clusters::free_runs(txn, &runs, &map_blocks)?;
            if written {
                data.inode.links_count = 0;
                data.inode.mode = 0;
                data.inode.dtime = now().sec as u32;
                data.inode.block = [0; ext4::INODE_BLOCK_SIZE];
                if data.inode.uses_extents() {
                    extent_tree::init_root(&mut data.inode.block);
                }
                data.inode.size = 0;
                let delta = txn.take_blocks_delta();
                add_blocks(&mut data.inode, delta, self.block_size());
                data.fc.ineligible_next("delete");
                self.write_inode(txn, ino, &mut data, true)?;
            }
        }
        self.groups.free_inode(&self.journal, &mut txn.handle, ino, is_dir)
    }

    /// Adds `name → ino` to directory `dir` under `txn`, updating the directory's size and
    /// i_blocks in `ddata` (the caller writes the inode); returns where the name went.
    pub(crate) fn dir_add(
        &self,
        txn: &mut Txn<'_>,
        dir: u32,
        ddata: &mut InodeData,
        name: &[u8],
        ino: u32,
        file_type: u8,
    ) -> Result<dir::Added> {
        txn.take_blocks_delta();
        self.dentries.forget(dir, name);
        let added = self.with_dir(txn, dir, ddata, |access, ctx| {
            dir::add_entry_at(access, ctx, name, ino, file_type)
        })?;
        self.dentries.insert(dir, name, Some((ino, file_type)));
        let delta = txn.take_blocks_delta();
        if delta != 0 || !added.in_place {
            ddata.fc.block_creates(txn.handle.tid(), "parent directory grew or was reshaped");
        }
        add_blocks(&mut ddata.inode, delta, self.block_size());
        Ok(added)
    }

    /// Removes `name` from directory `dir` under `txn`; returns the inode it named.
    pub(crate) fn dir_remove(
        &self,
        txn: &mut Txn<'_>,
        dir: u32,
        ddata: &mut InodeData,
        name: &[u8],
    ) -> Result<u32> {
        self.dentries.forget(dir, name);
        let (ino, lblk) =
            self.with_dir(txn, dir, ddata, |access, ctx| dir::remove_entry_at(access, ctx, name))?;
        self.dentries.insert(dir, name, None);
        if self.journal.fast_commits_enabled() {
            ddata.fc.note_removal(txn.handle.tid(), lblk, name);
        }
        Ok(ino)
    }

    pub(crate) fn dir_is_empty(&self, dir: u32, ddata: &mut InodeData) -> Result<bool> {
        self.with_dir_read(dir, ddata, |access, ctx| dir::is_empty(access, ctx))
    }

    /// The project a directory gives what is made or moved into it: its own, when the
    /// project feature is on and the directory has PROJINHERIT.
    pub(crate) fn project_inherited(&self, dir: &ext4::Inode) -> Option<u32> {
        let project = self.params.feature_ro_compat & ext4::feature::RO_COMPAT_PROJECT != 0;
        (project && dir.flags & ondisk::ext4::iflags::PROJINHERIT_FL != 0).then_some(dir.projid)
    }

    /// EXDEV when `inode` may not get a name in `dir`: `dir` passes its project on and the
    /// inode is in another (ext4_link, ext4_rename).
    pub(crate) fn check_same_project(&self, dir: &ext4::Inode, inode: &ext4::Inode) -> Result<()> {
        match self.project_inherited(dir) {
            Some(projid) if projid != inode.projid => Err(FsError::CrossProject),
            _ => Ok(()),
        }
    }

    pub(crate) fn has_dir_nlink(&self) -> bool {
        self.params.feature_ro_compat & ext4::feature::RO_COMPAT_DIR_NLINK != 0
    }

    /// Stops `txn` after `result`: on success returns the value; on an error after changes
    /// began, turns the file system read-only (see the module docs).
    pub(crate) fn finish<T>(&self, result: Result<T>, txn: Txn<'_>) -> Result<T> {
        match result {
            Ok(value) => {
                txn.stop()?;
                Ok(value)
            }
            Err(err) => {
                let err = self.fail(err);
                let mut txn = txn;
                self.save_error_state_in(&mut txn.handle);
                let _ = txn.stop();
                self.save_error_state();
                Err(err)
            }
        }
    }

    /// Adds a hard link `new_parent/new_name` to inode `ino`.
    pub fn link(&self, ino: u32, new_parent: u32, new_name: &[u8]) -> Result<Attr> {
        check_name(new_name)?;
        let pslot = self.inodes.slot(new_parent);
        let mut pguard = self.lock_live(&pslot)?;
        let pdata = pguard.as_mut().expect("loaded");
        let slot = self.inodes.slot(ino);
        if ino == new_parent {
            return Err(FsError::IsDir);
        }
        let mut guard = self.lock_live(&slot)?;
        let data = guard.as_mut().expect("loaded");
        if data.inode.is_dir() {
            return Err(FsError::IsDir);
        }
        if data.inode.links_count >= LINK_MAX {
            return Err(FsError::TooManyLinks);
        }
        if data.inode.links_count == 0 {
            return Err(FsError::NotFound);
        }
        inode_flags::check_unpinned(&data.inode)?;
        inode_flags::check_mutable(&pdata.inode)?;
        self.check_same_project(&pdata.inode, &data.inode)?;
        if self.dir_lookup_locked(new_parent, pdata, new_name)?.is_some() {
            return Err(FsError::Exists);
        }
        self.dir_check_room(new_parent, pdata, new_name)?;
        let mut txn = self.begin(NAMESPACE_CREDITS, NAMESPACE_BLOCKS)?;
        let (dirsync, tid) = (inode_flags::dirsync(&pdata.inode), txn.handle.tid());
        let result = (|| {
            let file_type = ondisk::ext4::dir::file_type_from_mode(data.inode.mode);
            self.dir_add(&mut txn, new_parent, pdata, new_name, ino, file_type)?;
            let t = now();
            pdata.inode.mtime = t;
            pdata.inode.ctime = t;
            pdata.fc.ineligible_next("link");
            txn_write_inode(self, &mut txn, new_parent, pdata, true)?;
            data.inode.links_count += 1;
            data.inode.ctime = t;
            data.fc.ineligible_next("link");
            txn_write_inode(self, &mut txn, ino, data, false)?;
            Ok(self.attr_of(ino, data))
        })();
        let attr = self.finish(result, txn)?;
        self.dirsync_commit(dirsync, tid)?;
        Ok(attr)
    }

    pub fn unlink(&self, parent: u32, name: &[u8]) -> Result<()> {
        self.remove_name(parent, name, false)
    }

    pub fn rmdir(&self, parent: u32, name: &[u8]) -> Result<()> {
        self.remove_name(parent, name, true)
    }

    fn remove_name(&self, parent: u32, name: &[u8], want_dir: bool) -> Result<()> {
        if name == b"." {
            return Err(FsError::Invalid("cannot remove \".\"".into()));
        }
        if name == b".." {
            return Err(FsError::NotEmpty);
        }
        let pslot = self.inodes.slot(parent);
        let mut pguard = self.lock_live(&pslot)?;
        let pdata = pguard.as_mut().expect("loaded");
        let (ino, _) = self.dir_lookup_locked(parent, pdata, name)?.ok_or(FsError::NotFound)?;
        let slot = self.inodes.slot(ino);
        let mut guard = self.lock_live(&slot)?;
        let data = guard.as_mut().expect("loaded");
        let is_dir = data.inode.is_dir();
        if want_dir && !is_dir {
            return Err(FsError::NotDir);
        }
        if !want_dir && is_dir {
            return Err(FsError::IsDir);
        }
        inode_flags::check_unpinned(&pdata.inode)?;
        inode_flags::check_unpinned(&data.inode)?;
        if is_dir && !self.dir_is_empty(ino, data)? {
            return Err(FsError::NotEmpty);
        }
        if is_dir || data.inode.links_count <= 1 {
            self.check_releasable(ino, data)?;
        }
        // Removing an entry allocates nothing: no reservation, so a full disk can be emptied.
        let mut txn = self.begin(NAMESPACE_CREDITS, 0)?;
        let (dirsync, tid) = (inode_flags::dirsync(&pdata.inode), txn.handle.tid());
        let result = (|| {
            // Whether a fast commit can delete the file at replay, read before the removal
            // writes it (and marks it changed in this transaction).
            let tid = txn.handle.tid();
            let unlinked = if self.journal.fast_commits_enabled() && !is_dir {
                self.unlink_record(ino, data, tid)?
            } else {
                None
            };
            self.dir_remove(&mut txn, parent, pdata, name)?;
            if let Some(records) = unlinked {
                pdata.fc.note_unlinked(tid, name, records);
            }
            let t = now();
            pdata.inode.mtime = t;
            pdata.inode.ctime = t;
            if is_dir {
                dec_link(&mut pdata.inode);
            }
            pdata.fc.ineligible_next("unlink");
            txn_write_inode(self, &mut txn, parent, pdata, true)?;
            data.inode.ctime = t;
            self.drop_link(&mut txn, &slot, data, is_dir)
        })();
        let release = self.finish(result, txn)?;
        if release {
            self.release_inode(&slot, data)?;
        }
        self.dirsync_commit(dirsync, tid)
    }

    /// Removes one link from `data` under `txn`. When none remain, the inode goes on the orphan
    /// list; returns whether the caller should release it now (it is not open).
    pub(crate) fn drop_link(
        &self,
        txn: &mut Txn<'_>,
        slot: &InodeSlot,
        data: &mut InodeData,
        is_dir: bool,
    ) -> Result<bool> {
        let ino = slot.ino;
        if is_dir {
            data.inode.links_count = 0;
        } else {
            dec_link(&mut data.inode);
        }
        if data.inode.links_count > 0 {
            data.fc.ineligible_next("unlink");
            txn_write_inode(self, txn, ino, data, false)?;
            return Ok(false);
        }
        // Orphan first, so a crash before the blocks are freed still frees them at mount.
        crate::orphan::add(self, txn, ino, data)?;
        data.fc.ineligible_next("unlink");
        txn_write_inode(self, txn, ino, data, true)?;
        Ok(slot.open_count.load(std::sync::atomic::Ordering::Acquire) == 0)
    }

    /// Reads everything [`Filesystem::release_inode`] will read to free inode `ino` (its
    /// extent tree, in-inode xattrs and xattr block), so that an operation dropping its last
    /// link finds damage there before its first change, as ext4 reads them before it starts:
    /// it then fails with nothing changed (the error recorded, see `error_policy.rs`) instead
    /// of removing the name and leaving an inode it cannot free. Values stored in an inode of
    /// their own (ea_inode, which a writable quill file system does not have) are damage too:
    /// freeing this inode would leak that one.
    pub(crate) fn check_releasable(&self, ino: u32, data: &InodeData) -> Result<()> {
        self.check_extent_tree(ino, data)?;
        let area = data.inode.xattr_area_range(data.raw.len());
        let ctx = self.xattr_ctx(ino);
        let check = || {
            xattr::list(&mut ReadIo { fs: self }, &ctx, &data.raw[area], data.inode.file_acl)?;
            let xattr_block = (data.inode.file_acl != 0).then_some((data.inode.file_acl, 1));
            self.groups.check_in_use(&self.journal, Some(ino), xattr_block.as_slice())
        };
        check().map_err(|e| self.check_fs_error(ino, e))
    }

    /// Frees an unlinked inode's blocks, xattr block and the inode itself, and takes it off
    /// the orphan list. Runs in as many transactions as the file's size needs.
    pub(crate) fn release_inode(&self, slot: &InodeSlot, data: &mut InodeData) -> Result<()> {
        let ino = slot.ino;
        self.drop_cached(ino, data);
        self.truncate_blocks(ino, data, 0)?;
        self.release_value_inodes_of(ino, data)?;
        let ctx = self.xattr_ctx(ino);
        let area = data.inode.xattr_area_range(data.raw.len());
        let mut txn = self.begin(NAMESPACE_CREDITS, 0)?;
        let result = (|| {
            let mut file_acl = data.inode.file_acl;
            // None are left but a shared block's, which go with the block's last owner.
            xattr::release_inode_values(&mut txn, &ctx, &data.raw[area])?;
            txn.take_blocks_delta();
            xattr::release_block(&mut txn, &ctx, &mut file_acl)?;
            data.inode.file_acl = file_acl;
            let delta = txn.take_blocks_delta();
            add_blocks(&mut data.inode, delta, self.block_size());
            crate::orphan::remove(self, &mut txn, ino, data)?;
            data.inode.dtime = now().sec as u32;
            let is_dir = data.inode.is_dir();
            data.inode.mode = 0;
            data.fc.ineligible_next("delete");
            txn_write_inode(self, &mut txn, ino, data, true)?;
            self.groups.free_inode(&self.journal, &mut txn.handle, ino, is_dir)
        })();
        self.finish(result, txn)
    }

    /// Releases the value inodes (ea_inode) deleted inode `ino` (`data`, locked) names, one
    /// per handle with the entry naming it: a file may name more value blocks than one
    /// transaction can revoke, and each handle leaves entries and counts in step, so a crash
    /// between them leaves the rest for orphan recovery to release.
    fn release_value_inodes_of(&self, ino: u32, data: &mut InodeData) -> Result<()> {
        let ctx = self.xattr_ctx_of(ino, &data.inode);
        if !ctx.ea_inode {
            return Ok(());
        }
        let bs = u64::from(self.block_size());
        let cluster = self.groups.geo.cluster_blocks();
        loop {
            let range = data.inode.xattr_area_range(data.raw.len());
            let io = &mut ReadIo { fs: self };
            let names =
                xattr::value_inode_names(io, &ctx, &data.raw[range.clone()], data.inode.file_acl)
                    .map_err(|e| self.check_fs_error(ino, e))?;
            let Some((name, size)) = names.into_iter().next() else { return Ok(()) };
            let blocks = xattr::value_charge_blocks(size, bs, cluster);
            let mut txn = self.begin(24 + 2 * u32::try_from(blocks).unwrap_or(u32::MAX / 4), 0)?;
            let result = (|| {
                let mut area = data.raw[range.clone()].to_vec();
                let mut file_acl = data.inode.file_acl;
                xattr::remove(&mut txn, &ctx, &mut area, &mut file_acl, &name)?;
                data.raw[range.clone()].copy_from_slice(&area);
                data.inode.file_acl = file_acl;
                let freed = txn.take_blocks_delta() - blocks as i64;
                add_blocks(&mut data.inode, freed, self.block_size());
                data.fc.ineligible_next("xattr");
                txn_write_inode(self, &mut txn, ino, data, false)
            })();
            self.finish(result, txn)?;
        }
    }

    pub(crate) fn fs_csum_seed(&self) -> Option<u32> {
        self.params.has_metadata_csum().then(|| self.params.csum_seed())
    }

    /// Marks inode `ino` open (the FUSE open/release pair): an unlinked inode stays allocated
    /// until its last close.
    pub fn open_inode(&self, ino: u32) -> Result<Arc<InodeSlot>> {
        let slot = self.inodes.slot(ino);
        drop(self.lock_live(&slot)?);
        slot.open_count.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Ok(slot)
    }

    /// Closes what [`Filesystem::open_inode`] opened; frees the inode if it was unlinked.
    pub fn close_inode(&self, slot: &Arc<InodeSlot>) -> Result<()> {
        let before = slot.open_count.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        assert!(before > 0, "inode {} closed more often than opened", slot.ino);
        if before > 1 {
            return Ok(());
        }
        let mut guard = self.lock_inode(slot)?;
        let data = guard.as_mut().expect("loaded");
        if data.inode.links_count == 0 && data.inode.mode != 0 && !self.is_read_only() {
            self.release_inode(slot, data)?;
        } else if std::mem::take(&mut data.flush_on_close) && !self.is_read_only() {
            // ext4's auto_da_alloc on close after a truncate to zero.
            self.writeback_locked(slot.ino, data)?;
        }
        Ok(())
    }

    pub fn getxattr(&self, ino: u32, name: &[u8]) -> Result<Vec<u8>> {
        if acl::is_acl(name) {
            return self.get_acl(ino, name);
        }
        self.getxattr_stored(ino, name)
    }

    /// Xattr `name` as stored (an ACL in ext4's encoding).
    pub(crate) fn getxattr_stored(&self, ino: u32, name: &[u8]) -> Result<Vec<u8>> {
        let slot = self.inodes.slot(ino);
        let guard = self.lock_live(&slot)?;
        let data = guard.as_ref().expect("loaded");
        self.stored_xattr(ino, data, name)?.ok_or(FsError::NoData)
    }

    pub fn listxattr(&self, ino: u32) -> Result<Vec<Vec<u8>>> {
        let slot = self.inodes.slot(ino);
        let guard = self.lock_live(&slot)?;
        let data = guard.as_ref().expect("loaded");
        let area = data.inode.xattr_area_range(data.raw.len());
        let ctx = self.xattr_ctx(ino);
        let mut names =
            xattr::list(&mut ReadIo { fs: self }, &ctx, &data.raw[area], data.inode.file_acl)
                .map_err(|e| self.check_fs_error(ino, e))?;
        if !self.options.acl {
            // As ext4 mounted noacl: the ACL names are not listed.
            names.retain(|name| !acl::is_acl(name));
        }
        Ok(names)
    }

    pub fn setxattr(&self, ino: u32, name: &[u8], value: &[u8], mode: SetMode) -> Result<()> {
        if acl::is_acl(name) {
            return self.set_acl(ino, name, Some(value));
        }
        self.change_xattr_and_mode(ino, value.len(), |txn, ctx, area, file_acl, _| {
            xattr::set(txn, ctx, area, file_acl, name, value, mode)
        })
    }

    pub fn removexattr(&self, ino: u32, name: &[u8]) -> Result<()> {
        if acl::is_acl(name) {
            return self.set_acl(ino, name, None);
        }
        self.change_xattr_and_mode(ino, 0, |txn, ctx, area, file_acl, _| {
            xattr::remove(txn, ctx, area, file_acl, name)
        })
    }

    /// [`Filesystem::xattr_ctx`] for changes of `inode`'s attributes: a value inode made for
    /// it takes its owner and group, and its type.
    pub(crate) fn xattr_ctx_of(&self, ino: u32, inode: &Inode) -> XattrCtx {
        XattrCtx {
            owner: (ino, inode.uid, inode.gid),
            owner_mode: inode.mode,
            ..self.xattr_ctx(ino)
        }
    }

    /// How xattr blocks of inode `ino` are checksummed and where a new one goes (its group).
    pub(crate) fn xattr_ctx(&self, ino: u32) -> XattrCtx {
        let geo = &self.groups.geo;
        XattrCtx {
            fs_csum_seed: self.fs_csum_seed(),
            goal: geo.group_first_block(geo.group_of_inode(ino)),
            ea_inode: self.params.feature_incompat & ext4::feature::INCOMPAT_EA_INODE != 0,
            owner: (ino, 0, 0),
            owner_mode: 0,
        }
    }

    /// Changes inode `ino`'s extended attributes (a value of up to `value_len` bytes may be
    /// stored); the change may also set the inode's mode (an access ACL sets its permission
    /// bits): `change` gets a copy of the inode, of which only `mode` is kept. With ea_inode
    /// the transaction has room for a value inode of `value_len` bytes, and the owner's
    /// i_blocks follows the charge for its value inodes (`xattr::value_inode_charge`).
    pub(crate) fn change_xattr_and_mode(
        &self,
        ino: u32,
        value_len: usize,
        change: impl FnOnce(&mut Txn<'_>, &XattrCtx, &mut [u8], &mut u64, &mut Inode) -> Result<()>,
    ) -> Result<()> {
        let slot = self.inodes.slot(ino);
        let mut guard = self.lock_live(&slot)?;
        let data = guard.as_mut().expect("loaded");
        inode_flags::check_unpinned(&data.inode)?;
        let ctx = self.xattr_ctx_of(ino, &data.inode);
        // A new value inode's blocks (journaled: a credit each, and their bitmap and
        // descriptor blocks), its record, bitmap and extent-tree blocks; and the blocks of the
        // value inodes the change may free (revoked: a credit each).
        let bs = u64::from(self.block_size());
        let value_blocks = if ctx.ea_inode { (value_len as u64).div_ceil(bs) } else { 0 };
        let range = data.inode.xattr_area_range(data.raw.len());
        let charged = xattr::value_inode_charge(
            &mut ReadIo { fs: self },
            &ctx,
            &data.raw[range.clone()],
            data.inode.file_acl,
        )
        .map_err(|e| self.check_fs_error(ino, e))?;
        let blocks_credits = 3 * value_blocks + 2 * (charged / bs);
        let credits = 24 + u32::try_from(blocks_credits).unwrap_or(u32::MAX / 2);
        let mut txn = self.begin(credits, 2 + value_blocks + 2)?;
        // Work on copies so an ordinary failure (ENODATA, EEXIST, ENOSPC, ERANGE) leaves the
        // inode as it was; only the block writes it made are then already journaled, and the
        // xattr module makes those only once it knows the change will succeed.
        let mut area = data.raw[range.clone()].to_vec();
        let mut file_acl = data.inode.file_acl;
        let mut inode = data.inode.clone();
        match change(&mut txn, &ctx, &mut area, &mut file_acl, &mut inode) {
            Ok(()) => {}
            Err(
                err @ (FsError::NoData
                | FsError::Exists
                | FsError::NoSpace
                | FsError::Range
                | FsError::Invalid(_)
                | FsError::NotSupported(_)
                | FsError::AccessDenied(_)
                | FsError::NameTooLong),
            ) => {
                txn.stop()?;
                return Err(err);
            }
            Err(err) => return self.finish(Err(err), txn),
        }
        let charge = match xattr::value_inode_charge(&mut txn, &ctx, &area, file_acl) {
            Ok(bytes) => (bytes as i64 - charged as i64) / i64::from(self.block_size()),
            Err(err) => return self.finish(Err(err), txn),
        };
        data.raw[range].copy_from_slice(&area);
        data.inode.file_acl = file_acl;
        data.inode.mode = inode.mode;
        let delta = txn.take_blocks_delta() + charge;
        add_blocks(&mut data.inode, delta, self.block_size());
        data.inode.ctime = now();
        data.fc.ineligible_next("xattr");
        let result = txn_write_inode(self, &mut txn, ino, data, false);
        self.finish(result, txn)
    }
}

/// Writes inode `ino` under `txn`.
pub(crate) fn txn_write_inode(
    fs: &Filesystem,
    txn: &mut Txn<'_>,
    ino: u32,
    data: &mut InodeData,
    data_change: bool,
) -> Result<()> {
    fs.write_inode(txn, ino, data, data_change)
}

/// Adds `delta` file-system blocks to i_blocks (in the inode's unit).
pub(crate) fn add_blocks(inode: &mut Inode, delta: i64, block_size: u32) {
    if delta == 0 {
        return;
    }
    let per_block =
        if inode.flags & ext4::HUGE_FILE_FL != 0 { 1 } else { i64::from(block_size / 512) };
    inode.blocks_raw = (inode.blocks_raw as i64 + delta * per_block).max(0) as u64;
}

/// One link more. A directory at ext4's limit, or already counting "many" (1), counts 1
/// with dir_nlink (`ext4_inc_count`).
pub(crate) fn inc_link(inode: &mut Inode, dir_nlink: bool) {
    let many = inode.links_count == 1 || (dir_nlink && inode.links_count >= LINK_MAX - 1);
    if inode.is_dir() && many {
        inode.links_count = 1;
    } else {
        inode.links_count += 1;
    }
}

/// One link fewer (`ext4_dec_count`): a directory keeps at least 2 (itself and `.`), and one
/// counting "many" (1) stays so.
pub(crate) fn dec_link(inode: &mut Inode) {
    if !inode.is_dir() {
        inode.links_count = inode.links_count.saturating_sub(1);
    } else if inode.links_count > 2 {
        inode.links_count -= 1;
    }
}

/// Rejects names the directory layer never stores.
pub(crate) fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > 255 {
        return Err(FsError::NameTooLong);
    }
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return Err(FsError::Invalid(format!("bad file name {:?}", String::from_utf8_lossy(name))));
    }
    Ok(())
}

/// Device numbers as ext4 stores them in i_block (old 16-bit form in word 0 when it fits,
/// else the new 32-bit form in word 1).
fn encode_rdev(block: &mut [u8; ext4::INODE_BLOCK_SIZE], rdev: u32) {
    *block = [0; ext4::INODE_BLOCK_SIZE];
    let major = (rdev >> 8) & 0xfff;
    let minor = (rdev & 0xff) | ((rdev >> 12) & 0xfff00);
    if major < 256 && minor < 256 {
        block[..4].copy_from_slice(&((major << 8) | minor).to_le_bytes());
    } else {
        let new = (minor & 0xff) | (major << 8) | ((minor & !0xff) << 12);
        block[4..8].copy_from_slice(&new.to_le_bytes());
    }
}

fn decode_rdev(block: &[u8; ext4::INODE_BLOCK_SIZE]) -> u32 {
    let old = u32::from_le_bytes([block[0], block[1], block[2], block[3]]);
    if old != 0 {
        return old;
    }
    let new = u32::from_le_bytes([block[4], block[5], block[6], block[7]]);
    let major = (new & 0xfff00) >> 8;
    let minor = (new & 0xff) | ((new >> 12) & 0xfff00);
    (major << 8) | (minor & 0xff) | ((minor & !0xff) << 12)
}
