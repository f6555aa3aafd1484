//! rename, including replacing a target, RENAME_NOREPLACE, RENAME_EXCHANGE and
//! RENAME_WHITEOUT.
//!
//! Locking follows `filesystem.rs`: a rename between two directories first takes
//! `rename_lock`, so no other rename can change ancestry; it then finds out whether one
//! directory is an ancestor of the other by walking `..` (which also rejects moving a
//! directory into its own subtree, EINVAL), and locks the ancestor first, or the lower inode
//! number first when neither is. The entries' inodes are locked after both directories, in
//! inode-number order.
//!
//! The whole rename is one handle, so it is atomic across a crash: the new name appears, the
//! old one disappears (or names the whiteout) and a replaced target loses its link in the
//! same transaction.

use crate::dir;
use crate::error::{FsError, Result};
use crate::filesystem::{now, Filesystem, Txn};
use crate::inode_flags;
use crate::inodes::InodeData;
use crate::ops::{check_name, dec_link, inc_link, txn_write_inode, RenameFlags, ROOT_INO};

/// Journal credits of a rename: two directory updates, up to four inodes, a `..` block,
/// orphan list and allocation updates.
const RENAME_CREDITS: u32 = 160;
/// Blocks a rename may allocate (the new entry's directory may grow or split).
const RENAME_BLOCKS: u64 = 16;
/// Deepest directory tree the ancestry walk follows before calling the tree corrupt.
const DEPTH_MAX: usize = 1 << 16;

/// The two directories of a rename; `new` is `None` when they are the same directory.
struct Parents<'a> {
    old_ino: u32,
    old: &'a mut InodeData,
    new_ino: u32,
    new: Option<&'a mut InodeData>,
}

impl Parents<'_> {
    fn new_dir(&mut self) -> &mut InodeData {
        match self.new.as_deref_mut() {
            Some(new) => new,
            None => &mut *self.old,
        }
    }
}

impl Filesystem {
    pub fn rename(
        &self,
        parent: u32,
        name: &[u8],
        new_parent: u32,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        self.check_writable()?;
        check_name(name)?;
        check_name(new_name)?;
        for n in [name, new_name] {
            if n == b"." || n == b".." {
                return Err(FsError::Invalid("cannot rename \".\" or \"..\"".into()));
            }
        }
        if flags.exchange && (flags.noreplace || flags.whiteout.is_some()) {
            return Err(FsError::Invalid(
                "RENAME_EXCHANGE with RENAME_NOREPLACE or RENAME_WHITEOUT".into(),
            ));
        }
        if !flags.exchange {
            // ext4's auto_da_alloc: replacing a file by rename writes the new file's cached
            // data back first, in a transaction no later than the rename's, so after a crash
            // the name holds the old file or all of the new one, never an empty file.
            if let (Ok(src), Ok(_)) =
                (self.lookup_ino(parent, name), self.lookup_ino(new_parent, new_name))
            {
                self.writeback_inode(&self.inodes.slot(src))?;
            }
        }
        let cross = parent != new_parent;
        let _rename_guard = cross.then(|| self.rename_lock.lock());
        let new_parent_chain = if cross { self.ancestors(new_parent)? } else { Vec::new() };
        let parent_chain = if cross { self.ancestors(parent)? } else { Vec::new() };
        let parent_first = !cross
            || new_parent_chain.contains(&parent)
            || (!parent_chain.contains(&new_parent) && parent < new_parent);
        let (first, second) =
            if parent_first { (parent, new_parent) } else { (new_parent, parent) };
        let slot_first = self.inodes.slot(first);
        let slot_second = self.inodes.slot(second);
        let mut guard_first = self.lock_live(&slot_first)?;
        let mut guard_second = if cross { Some(self.lock_live(&slot_second)?) } else { None };
        let a = guard_first.as_mut().expect("loaded");
        let b = guard_second.as_mut().map(|g| g.as_mut().expect("loaded"));
        let mut parents = match b {
            None => Parents { old_ino: parent, old: a, new_ino: new_parent, new: None },
            Some(b) if parent_first => {
                Parents { old_ino: parent, old: a, new_ino: new_parent, new: Some(b) }
            }
            Some(b) => Parents { old_ino: parent, old: b, new_ino: new_parent, new: Some(a) },
        };
        let (src, _) =
            self.dir_lookup_locked(parent, parents.old, name)?.ok_or(FsError::NotFound)?;
        let dst = self.dir_lookup_locked(new_parent, parents.new_dir(), new_name)?;
        if cross && (src == new_parent || new_parent_chain.contains(&src)) {
            return Err(FsError::Invalid("cannot move a directory into itself".into()));
        }
        if flags.exchange && dst.is_none() {
            return Err(FsError::NotFound);
        }
        if flags.noreplace && dst.is_some() {
            return Err(FsError::Exists);
        }
        if dst.is_none() {
            self.dir_check_room(new_parent, parents.new_dir(), new_name)?;
        }
        if dst.is_some_and(|(d, _)| d == src) {
            // Both names are links to one inode: POSIX says do nothing.
            return Ok(());
        }
        if let Some((dst_ino, _)) = dst {
            // The target is an ancestor of the source: it is not empty (it holds the source),
            // and exchanging would move it into its own subtree. Its inode is already locked
            // as a directory above, so this must be decided before the entries are locked.
            if cross && (dst_ino == parent || parent_chain.contains(&dst_ino)) {
                return Err(if flags.exchange {
                    FsError::Invalid("cannot move a directory into itself".into())
                } else {
                    FsError::NotEmpty
                });
            }
        }
        // The entries' inodes, in number order.
        let src_slot = self.inodes.slot(src);
        let dst_slot = dst.map(|(d, _)| self.inodes.slot(d));
        let (mut src_guard, mut dst_guard) = match &dst_slot {
            Some(ds) if ds.ino < src => {
                let d = self.lock_live(ds)?;
                (self.lock_live(&src_slot)?, Some(d))
            }
            Some(ds) => {
                let s = self.lock_live(&src_slot)?;
                (s, Some(self.lock_live(ds)?))
            }
            None => (self.lock_live(&src_slot)?, None),
        };
        let sdata = src_guard.as_mut().expect("loaded");
        let mut ddata = dst_guard.as_mut().map(|g| g.as_mut().expect("loaded"));
        // The flags' rules (`may_delete` and `may_create` on immutable and append-only
        // inodes): the old name is removed, the new one added, a replaced target removed; an
        // exchange removes and adds in both directories.
        inode_flags::check_unpinned(&sdata.inode)?;
        inode_flags::check_unpinned(&parents.old.inode)?;
        inode_flags::check_mutable(&parents.new_dir().inode)?;
        if let Some(d) = ddata.as_ref() {
            inode_flags::check_unpinned(&d.inode)?;
            inode_flags::check_unpinned(&parents.new_dir().inode)?;
        }
        // Project inheritance (ext4_rename, ext4_cross_rename): what moves into a directory
        // that passes its project on must be in that project.
        self.check_same_project(&parents.new_dir().inode, &sdata.inode)?;
        if let (true, Some(d)) = (flags.exchange, ddata.as_ref()) {
            self.check_same_project(&parents.old.inode, &d.inode)?;
        }
        let dirsync = inode_flags::dirsync(&parents.old.inode)
            || inode_flags::dirsync(&parents.new_dir().inode);
        let src_is_dir = sdata.inode.is_dir();
        let dst_is_dir = ddata.as_ref().is_some_and(|d| d.inode.is_dir());
        if let (Some(d), Some((dst_ino, _))) = (ddata.as_mut(), dst) {
            if !flags.exchange {
                if src_is_dir && !dst_is_dir {
                    return Err(FsError::NotDir);
                }
                if !src_is_dir && dst_is_dir {
                    return Err(FsError::IsDir);
                }
                if dst_is_dir && !self.dir_is_empty(dst_ino, d)? {
                    return Err(FsError::NotEmpty);
                }
                if dst_is_dir || d.inode.links_count <= 1 {
                    self.check_releasable(dst_ino, d)?;
                }
            }
        }
        if let Some((uid, gid)) = flags.whiteout {
            // The whiteout is a new inode of the caller's (project 0, as mknod's).
            self.quota_prepare([uid, gid, 0])?;
        }
        let mut txn = self.begin(RENAME_CREDITS, RENAME_BLOCKS)?;
        let tid = txn.handle.tid();
        let t = now();
        let has_dir_nlink = self.has_dir_nlink();
        // Whether a fast commit can express the rename (`fsync_journal.rs`), and how a replaced
        // target is deleted at replay, read before the rename writes it.
        let fast_commit = self.journal.fast_commits_enabled()
            && !flags.exchange
            && flags.whiteout.is_none()
            && sdata.inode.mode & ondisk::ext4::MODE_TYPE_MASK == ondisk::ext4::MODE_REGULAR;
        let replaced = match (&ddata, dst) {
            (Some(d), Some((dst_ino, _))) if fast_commit => {
                Some(self.unlink_record(dst_ino, d, tid)?.ok_or(()))
            }
            _ => None,
        };
        let result = (|| {
            let src_ft = ondisk::ext4::dir::file_type_from_mode(sdata.inode.mode);
            let (old_ino, new_ino) = (parents.old_ino, parents.new_ino);
            // Whether a replaced target lost its last link and, not being open, is released
            // once the handle stops.
            let mut release = false;
            // The leaf block the new name went into (not for an exchange).
            let mut new_lblk = None;
            match (flags.exchange, ddata.as_deref_mut(), dst) {
                (true, Some(d), Some((dst_ino, _))) => {
                    let dst_ft = ondisk::ext4::dir::file_type_from_mode(d.inode.mode);
                    self.dir_replace(&mut txn, old_ino, parents.old, name, dst_ino, dst_ft)?;
                    self.dir_replace(&mut txn, new_ino, parents.new_dir(), new_name, src, src_ft)?;
                    if cross {
                        if src_is_dir {
                            self.dir_set_parent(&mut txn, src, sdata, new_ino)?;
                        }
                        if dst_is_dir {
                            self.dir_set_parent(&mut txn, dst_ino, d, old_ino)?;
                        }
                        match (src_is_dir, dst_is_dir) {
                            (true, false) => {
                                dec_link(&mut parents.old.inode);
                                inc_link(&mut parents.new_dir().inode, has_dir_nlink);
                            }
                            (false, true) => {
                                inc_link(&mut parents.old.inode, has_dir_nlink);
                                dec_link(&mut parents.new_dir().inode);
                            }
                            _ => {}
                        }
                    }
                    d.inode.ctime = t;
                    d.fc.ineligible_next("rename");
                    txn_write_inode(self, &mut txn, dst_ino, d, false)?;
                }
                (false, Some(d), Some(_)) => {
                    let (_, lblk) = self.dir_replace(
                        &mut txn,
                        new_ino,
                        parents.new_dir(),
                        new_name,
                        src,
                        src_ft,
                    )?;
                    new_lblk = Some(lblk);
                    self.leave_old_name(&mut txn, old_ino, parents.old, name, flags)?;
                    if dst_is_dir {
                        // The replaced directory's `..` no longer counts against new_parent.
                        dec_link(&mut parents.new_dir().inode);
                    }
                    d.inode.ctime = t;
                    let dst_slot = dst_slot.as_ref().expect("locked");
                    release = self.drop_link(&mut txn, dst_slot, d, dst_is_dir)?;
                }
                _ => {
                    let added =
                        self.dir_add(&mut txn, new_ino, parents.new_dir(), new_name, src, src_ft)?;
                    new_lblk = Some(added.lblk);
                    self.leave_old_name(&mut txn, old_ino, parents.old, name, flags)?;
                }
            }
            if !flags.exchange && cross && src_is_dir {
                self.dir_set_parent(&mut txn, src, sdata, new_ino)?;
                dec_link(&mut parents.old.inode);
                inc_link(&mut parents.new_dir().inode, has_dir_nlink);
            }
            sdata.inode.ctime = t;
            match new_lblk {
                Some(lblk) if fast_commit => {
                    // The UNLINK from the old directory too needs it to have blocks at the last
                    // commit: not inline now, nor moved out in `tid` (which blocked creates).
                    let old_was_inline = parents.old.inode.has_inline_data()
                        || (self.has_inline_data() && parents.old.fc.creates_blocked(tid));
                    let record = if sdata.inode.links_count != 1 {
                        Err("hard link")
                    } else if old_was_inline {
                        Err(crate::fsync_journal::INLINE_DIRECTORY)
                    } else {
                        self.rename_record(tid, parents.new_dir(), new_name, lblk, replaced)
                    };
                    sdata.fc.renamed(tid, (old_ino, name), (new_ino, new_name), record);
                }
                _ => sdata.fc.ineligible_next("rename"),
            }
            txn_write_inode(self, &mut txn, src, sdata, false)?;
            for dir_data in
                [Some(&mut *parents.old), parents.new.as_deref_mut()].into_iter().flatten()
            {
                dir_data.inode.mtime = t;
                dir_data.inode.ctime = t;
            }
            parents.old.fc.ineligible_next("rename");
            txn_write_inode(self, &mut txn, old_ino, parents.old, true)?;
            if let Some(new) = parents.new.as_deref_mut() {
                new.fc.ineligible_next("rename");
                txn_write_inode(self, &mut txn, new_ino, new, true)?;
            }
            Ok(release)
        })();
        let release = self.finish(result, txn)?;
        if release {
            let dst_slot = dst_slot.as_ref().expect("locked");
            let d = ddata.expect("locked");
            self.release_inode(dst_slot, d)?;
        }
        self.dirsync_commit(dirsync, tid)
    }

    /// Takes `name` out of directory `dir` for a rename (not an exchange): removes it, or with
    /// RENAME_WHITEOUT points it at a new whiteout instead, as ext4 does
    /// (`ext4_whiteout_for_rename`, then `ext4_setent`).
    fn leave_old_name(
        &self,
        txn: &mut Txn<'_>,
        dir: u32,
        ddata: &mut InodeData,
        name: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        let Some(owner) = flags.whiteout else {
            self.dir_remove(txn, dir, ddata, name)?;
            return Ok(());
        };
        let whiteout = self.make_whiteout(txn, dir, owner)?;
        self.dir_replace(txn, dir, ddata, name, whiteout, ondisk::ext4::dir::FT_CHRDEV)?;
        Ok(())
    }

    /// A whiteout made in `txn` near directory `dir`: a character device 0:0 with mode 0 (no
    /// extent header, its device number in i_block, as mknod makes one), one link. Its slot is
    /// filled before anything names it.
    fn make_whiteout(&self, txn: &mut Txn<'_>, dir: u32, owner: (u32, u32)) -> Result<u32> {
        let group = self.groups.geo.group_of_inode(dir);
        let ino = self.groups.alloc_inode(&self.journal, &mut txn.handle, group, false)?;
        let slot = self.inodes.slot(ino);
        let mut guard = slot.state.lock();
        let (mut inode, raw) = self.new_inode_record(ondisk::ext4::MODE_CHRDEV, owner);
        inode.flags &= !ondisk::ext4::EXTENTS_FL;
        inode.block = [0; ondisk::ext4::INODE_BLOCK_SIZE];
        let mut data = InodeData::new(inode, raw, false);
        data.fc.ineligible_next("rename");
        if let Err(err) = self.write_inode(txn, ino, &mut data, true) {
            // Free the number again in this handle, as a failed create does.
            let _ = self.unmake_inode(txn, ino, false, Some((data, false)));
            return Err(err);
        }
        *guard = Some(data);
        Ok(ino)
    }

    /// The chain of directories from `dir` up to the root (excluding `dir`), by `..`.
    fn ancestors(&self, dir: u32) -> Result<Vec<u32>> {
        let mut chain = Vec::new();
        let mut at = dir;
        while at != ROOT_INO {
            let parent = self.lookup_dotdot(at)?;
            if chain.len() >= DEPTH_MAX || chain.contains(&parent) || parent == dir {
                return Err(FsError::corrupted(0, format!("directory {dir}: `..` chain loops")));
            }
            chain.push(parent);
            at = parent;
        }
        Ok(chain)
    }

    fn dir_replace(
        &self,
        txn: &mut Txn<'_>,
        dir_ino: u32,
        ddata: &mut InodeData,
        name: &[u8],
        ino: u32,
        file_type: u8,
    ) -> Result<(u32, u32)> {
        self.dentries.forget(dir_ino, name);
        let old = self.with_dir(txn, dir_ino, ddata, |access, ctx| {
            dir::replace_entry(access, ctx, name, ino, file_type)
        })?;
        self.dentries.insert(dir_ino, name, Some((ino, file_type)));
        Ok(old)
    }

    fn dir_set_parent(
        &self,
        txn: &mut Txn<'_>,
        dir_ino: u32,
        ddata: &mut InodeData,
        parent: u32,
    ) -> Result<()> {
        self.with_dir(txn, dir_ino, ddata, |access, ctx| dir::set_parent(access, ctx, parent))
    }
}
