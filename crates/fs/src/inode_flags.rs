//! chattr and lsattr: `i_flags` read and changed as ext4's FS_IOC_GETFLAGS / FS_IOC_SETFLAGS
//! and FS_IOC_FSGETXATTR / FS_IOC_FSSETXATTR do (`ext4_fileattr_get`, `ext4_fileattr_set`,
//! the VFS's `vfs_fileattr_set`), and what each flag does here.
//!
//! The kernel's VFS enforces immutable and append-only inodes itself (IS_IMMUTABLE,
//! IS_APPEND in `may_open`, `may_delete`, `notify_change`, `vfs_fallocate`, ...) before it calls
//! ext4. It makes none of those checks for a FUSE file system (a FUSE inode never carries
//! S_IMMUTABLE), so the library makes them, for every caller, with the kernel's errno (EPERM):
//!
//! | flag | what quill does |
//! |---|---|
//! | `i` immutable | no write, truncate, fallocate, attribute or xattr change, link, rename or removal of it; no name added to or removed from it (a directory); opening it for writing fails |
//! | `a` append only | writes only at the end of file (opening it for writing needs O_APPEND, O_TRUNC fails); no truncate, punch or zero range, no mode, owner, explicit time or xattr change, link, rename or removal of it; no name removed from it (a directory), new names allowed |
//! | `A` noatime | no access-time update |
//! | `S` sync | a write returns once it is durable (an fsync follows it, as O_SYNC) |
//! | `D` dirsync (and `S` on a directory) | a name created, linked, renamed or removed in the directory is committed before the call returns |
//! | `d s u c t T x P` and the deprecated EOFBLOCKS bit | kept and shown, not acted on (as by ext4, which compresses, undeletes and shreds nothing either) |
//! | `j` journal data | changing it: EOPNOTSUPP (quill journals data per mount, `data=journal`, not per file) |
//! | `F` casefold | changing it: EOPNOTSUPP (quill refuses casefold file systems) |
//! | `e` extents | clearing it: EOPNOTSUPP (quill maps new files by extents only); setting it: kept |
//!
//! New inodes take `EXT4_FL_INHERITED` from their directory, masked by their kind
//! ([`ext4::iflags::mask_for_kind`]), as `ext4_new_inode` does.

use ondisk::ext4::iflags::{self, FlagsKind, FsXattr};
use ondisk::ext4::{self, Inode};
use ondisk::Tid;

use crate::error::{FsError, Result};
use crate::filesystem::{now, Filesystem};
use crate::ops::txn_write_inode;

/// EPERM unless `inode` may change at all: neither its data nor its attributes nor its names
/// change while it is immutable (`IS_IMMUTABLE`).
pub(crate) fn check_mutable(inode: &Inode) -> Result<()> {
    if inode.flags & iflags::IMMUTABLE_FL != 0 {
        return Err(FsError::NotPermitted("the inode is immutable (chattr +i)"));
    }
    Ok(())
}

/// EPERM unless `inode` may lose or gain a name, change mode, owner, explicit times, size or
/// xattrs: neither immutable nor append only (the VFS's `IS_APPEND(inode) || IS_IMMUTABLE`).
pub(crate) fn check_unpinned(inode: &Inode) -> Result<()> {
    check_mutable(inode)?;
    if inode.flags & iflags::APPEND_FL != 0 {
        return Err(FsError::NotPermitted("the inode is append only (chattr +a)"));
    }
    Ok(())
}

/// Whether changes of directory `dir`'s names are committed before the call returns
/// (`IS_DIRSYNC`: `D`, or `S` on the directory).
pub(crate) fn dirsync(dir: &Inode) -> bool {
    dir.flags & (iflags::DIRSYNC_FL | iflags::SYNC_FL) != 0
}

/// The flags a new inode of `mode` takes from its directory's `parent_flags`.
pub(crate) fn inherited(parent_flags: u32, mode: u16) -> u32 {
    iflags::mask_for_kind(FlagsKind::of_mode(mode), parent_flags & iflags::INHERITED)
}

/// How an open asks to use a file ([`Filesystem::check_open`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenIntent {
    /// Opened for writing (O_WRONLY or O_RDWR).
    pub write: bool,
    /// With O_APPEND.
    pub append: bool,
    /// With O_TRUNC.
    pub truncate: bool,
}

impl Filesystem {
    /// FS_IOC_GETFLAGS: the inode's flags a user sees (`EXT4_FL_USER_VISIBLE`).
    pub fn inode_flags(&self, ino: u32) -> Result<u32> {
        let slot = self.inodes.slot(ino);
        let guard = self.lock_live(&slot)?;
        Ok(guard.as_ref().expect("loaded").inode.flags & iflags::USER_VISIBLE)
    }

    /// FS_IOC_SETFLAGS (chattr) by user `uid`: sets the user-modifiable flags to those of
    /// `flags` (the others `flags` names are ignored, as chattr passes back what lsattr read)
    /// and returns the inode's visible flags after. As `vfs_fileattr_set` and
    /// `ext4_fileattr_set`: only the owner or root (CAP_FOWNER) may (EPERM), only root
    /// (CAP_LINUX_IMMUTABLE) may change `i` or `a` (EPERM), an immutable inode changes nothing
    /// else while it stays immutable (EPERM), flags outside `EXT4_FL_USER_VISIBLE` or not for
    /// the inode's kind are EOPNOTSUPP; and what quill does not do (module docs) is EOPNOTSUPP.
    pub fn set_inode_flags(&self, ino: u32, flags: u32, uid: u32) -> Result<u32> {
        self.check_writable()?;
        if flags & !iflags::USER_VISIBLE != 0 {
            return Err(FsError::NotSupported(format!("inode flags {flags:#x}")));
        }
        let slot = self.inodes.slot(ino);
        let mut guard = self.lock_live(&slot)?;
        let data = guard.as_mut().expect("loaded");
        let old = data.inode.flags;
        let wanted = flags & iflags::USER_MODIFIABLE;
        if iflags::mask_for_kind(FlagsKind::of_mode(data.inode.mode), wanted) != wanted {
            return Err(FsError::NotSupported(format!(
                "inode flags {wanted:#x} on this kind of inode"
            )));
        }
        let privileged = uid == 0;
        if !privileged && uid != data.inode.uid {
            return Err(FsError::NotPermitted("only the owner may change the flags"));
        }
        let changed = (old ^ wanted) & iflags::USER_MODIFIABLE;
        if changed & (iflags::IMMUTABLE_FL | iflags::APPEND_FL) != 0 && !privileged {
            return Err(FsError::NotPermitted("changing i or a takes CAP_LINUX_IMMUTABLE"));
        }
        if old & wanted & iflags::IMMUTABLE_FL != 0 && changed != 0 {
            return Err(FsError::NotPermitted("the inode is immutable (chattr +i)"));
        }
        if changed & iflags::JOURNAL_DATA_FL != 0 {
            return Err(FsError::NotSupported(
                "per-file data journaling (chattr +j); use the data=journal mount option".into(),
            ));
        }
        if changed & iflags::CASEFOLD_FL != 0 {
            return Err(FsError::NotSupported("casefold (chattr +F)".into()));
        }
        if changed & ext4::EXTENTS_FL != 0 && old & ext4::EXTENTS_FL != 0 {
            return Err(FsError::NotSupported(
                "mapping a file by indirect blocks (chattr -e)".into(),
            ));
        }
        if changed == 0 {
            return Ok(old & iflags::USER_VISIBLE);
        }
        if data.inode.is_regular() && wanted & iflags::IMMUTABLE_FL != 0 {
            // Cached writes go out first (ext4 writes the mapping back before it sets `i`):
            // from now on nothing may change the file.
            self.writeback_locked(ino, data)?;
        }
        let mut txn = self.begin(1, 0)?;
        // EXTENTS_FL changes only by migration (never here): keep the inode's own.
        let keep = !iflags::USER_MODIFIABLE | ext4::EXTENTS_FL | iflags::JOURNAL_DATA_FL;
        data.inode.flags = (old & keep) | (wanted & !(ext4::EXTENTS_FL | iflags::JOURNAL_DATA_FL));
        data.inode.ctime = now();
        data.fc.ineligible_next("inode flags");
        self.finish(txn_write_inode(self, &mut txn, ino, data, false), txn)?;
        Ok(data.inode.flags & iflags::USER_VISIBLE)
    }

    /// FS_IOC_FSGETXATTR: the flags as xflags and the project id; no extent count, as ext4
    /// reports them.
    pub fn fsxattr(&self, ino: u32) -> Result<FsXattr> {
        let flags = self.inode_flags(ino)?;
        let slot = self.inodes.slot(ino);
        let projid = self.lock_live(&slot)?.as_ref().expect("loaded").inode.projid;
        Ok(FsXattr { xflags: FsXattr::xflags_of(flags), projid, ..FsXattr::default() })
    }

    /// FS_IOC_FSSETXATTR by user `uid`: the xflags with an `i_flags` counterpart replace those
    /// flags, the others stay ([`Filesystem::set_inode_flags`]'s rules), then the project id
    /// ([`Filesystem::set_project`]). An xflag without a counterpart is EOPNOTSUPP.
    pub fn set_fsxattr(&self, ino: u32, fsx: &FsXattr, uid: u32) -> Result<()> {
        if fsx.xflags & !iflags::XFLAGS_COMMON != 0 {
            return Err(FsError::NotSupported(format!("xflags {:#x}", fsx.xflags)));
        }
        let old = self.inode_flags(ino)?;
        let flags = (old & !iflags::COMMON) | FsXattr::flags_of(fsx.xflags);
        self.set_inode_flags(ino, flags, uid)?;
        self.set_project(ino, fsx.projid, uid)
    }

    /// `ext4_ioctl_setproject`: inode `ino` joins project `projid`. The same id changes
    /// nothing; another needs the project feature (EOPNOTSUPP without, as for the default
    /// project 0 it is never needed) and room for `i_projid` in the record (EOPNOTSUPP in a
    /// 128-byte inode); only the owner or root may change it.
    pub fn set_project(&self, ino: u32, projid: u32, uid: u32) -> Result<()> {
        let slot = self.inodes.slot(ino);
        let mut guard = self.lock_live(&slot)?;
        let data = guard.as_mut().expect("loaded");
        if data.inode.projid == projid {
            return Ok(());
        }
        if self.params.feature_ro_compat & ext4::feature::RO_COMPAT_PROJECT == 0 {
            return Err(FsError::NotSupported("project ids (no project feature)".into()));
        }
        // i_projid ends at 0xA0: the record needs extra_isize >= 32.
        if usize::from(data.inode.extra_isize) + 128 < 0xA0 {
            return Err(FsError::NotSupported("project ids in an inode without room".into()));
        }
        if uid != 0 && uid != data.inode.uid {
            return Err(FsError::NotPermitted("only the owner may change the project"));
        }
        check_mutable(&data.inode)?;
        self.quota_prepare([data.inode.uid, data.inode.gid, projid])?;
        let mut txn = self.begin(1, 0)?;
        data.inode.projid = projid;
        data.inode.ctime = now();
        data.fc.ineligible_next("project id");
        self.finish(txn_write_inode(self, &mut txn, ino, data, false), txn)
    }

    /// Whether `ino` may be opened as `intent` says (`may_open`'s checks of IS_IMMUTABLE and
    /// IS_APPEND): for writing not if immutable; if append only, only with O_APPEND and
    /// without O_TRUNC.
    pub fn check_open(&self, ino: u32, intent: OpenIntent) -> Result<()> {
        let slot = self.inodes.slot(ino);
        let guard = self.lock_live(&slot)?;
        let inode = &guard.as_ref().expect("loaded").inode;
        if intent.write || intent.truncate {
            check_mutable(inode)?;
        }
        if inode.flags & iflags::APPEND_FL != 0
            && ((intent.write && !intent.append) || intent.truncate)
        {
            return Err(FsError::NotPermitted("the inode is append only (chattr +a)"));
        }
        Ok(())
    }

    /// After a change of names in transaction `tid` in a directory that is [`dirsync`]:
    /// commits it before the call returns, as ext4's `ext4_handle_sync` does for IS_DIRSYNC.
    pub(crate) fn dirsync_commit(&self, dirsync: bool, tid: Tid) -> Result<()> {
        if dirsync {
            self.journal.commit_and_wait(tid)?;
        }
        Ok(())
    }
}
