//! POSIX ACLs, as ext4 mounted `acl` (its default) keeps them: `system.posix_acl_access` and
//! `system.posix_acl_default` stored under name indexes 2 and 3 in ext4's own encoding
//! ([`ondisk::ext4::acl`]), handed to callers in the kernel's xattr encoding, and kept in step
//! with the mode (`ext4_set_acl`, `posix_acl_update_mode`):
//!
//! - setting an access ACL sets the mode's permission bits from it (the group bits from the
//!   MASK where there is one); an ACL the mode says all of (only the owner, group and other
//!   entries) is not stored, the mode alone holds it;
//! - a default ACL is for directories only (EACCES on others); removing either ACL leaves the
//!   mode as it is;
//! - a file, directory or device created in a directory with a default ACL takes it as its
//!   access ACL, limited by the requested mode (which it limits in turn), instead of the
//!   umask; a directory takes the default ACL itself too (`posix_acl_create`). Symlinks take
//!   none and ignore the umask. Both are written in the creating transaction, so a crash never
//!   leaves the new inode with the mode and not the ACL.
//!
//! Who may set an ACL (the owner or CAP_FOWNER) and how an ACL grants access are the kernel's
//! to decide through the mount (FUSE_POSIX_ACL: it reads the ACLs with getxattr and checks
//! them with default_permissions), as for ext4. `noacl` turns all of this off: the names are
//! EOPNOTSUPP and the umask always applies.

use ondisk::ext4::acl::Acl;
use ondisk::ext4::Inode;

use crate::error::{FsError, Result};
use crate::filesystem::{Filesystem, Txn};
use crate::inodes::InodeData;
use crate::xattr::{self, SetMode};

/// The two ACL names.
pub(crate) const ACCESS: &[u8] = b"system.posix_acl_access";
pub(crate) const DEFAULT: &[u8] = b"system.posix_acl_default";

/// Whether `name` is one of the ACL names.
pub(crate) fn is_acl(name: &[u8]) -> bool {
    name == ACCESS || name == DEFAULT
}

fn invalid(err: ondisk::ext4::acl::AclError) -> FsError {
    FsError::Invalid(format!("POSIX ACL: {}", err.0))
}

/// The ACLs a new inode gets from its directory, in ext4's encoding.
#[derive(Debug, Default)]
pub(crate) struct NewAcls {
    access: Option<Vec<u8>>,
    default: Option<Vec<u8>>,
}

impl NewAcls {
    /// Whether there is any to store.
    pub(crate) fn any(&self) -> bool {
        self.access.is_some() || self.default.is_some()
    }
}

impl Filesystem {
    fn check_acl_enabled(&self) -> Result<()> {
        if !self.options.acl {
            return Err(FsError::NotSupported("POSIX ACLs (mounted noacl)".into()));
        }
        Ok(())
    }

    /// getxattr of an ACL name: the stored ACL in the kernel's xattr encoding.
    pub(crate) fn get_acl(&self, ino: u32, name: &[u8]) -> Result<Vec<u8>> {
        self.check_acl_enabled()?;
        let stored = self.getxattr_stored(ino, name)?;
        // A stored ACL that does not decode is EINVAL, as ext4_acl_from_disk answers.
        let acl = Acl::from_disk(&stored).map_err(invalid)?;
        Ok(acl.to_xattr())
    }

    /// setxattr (`value`) or removexattr (`None`) of an ACL name, with the mode kept in step
    /// (module docs). An empty ACL removes it, as the kernel's `posix_acl_from_xattr` reads
    /// it; removing an ACL that is not there succeeds, as ext4's `set_acl(NULL)` does.
    pub(crate) fn set_acl(&self, ino: u32, name: &[u8], value: Option<&[u8]>) -> Result<()> {
        self.check_acl_enabled()?;
        let acl = match value {
            Some(bytes) => Acl::from_xattr(bytes).map_err(invalid)?,
            None => None,
        };
        let access = name == ACCESS;
        let stored_len = acl.as_ref().map_or(0, |acl| acl.to_disk().len());
        self.change_xattr_and_mode(ino, stored_len, |txn, ctx, area, file_acl, inode| {
            if !access && !inode.is_dir() {
                return match acl {
                    Some(_) => Err(FsError::AccessDenied("a default ACL on a non-directory")),
                    None => Ok(()),
                };
            }
            let store = match &acl {
                Some(acl) if access => {
                    let (bits, equivalent) = acl.mode_bits();
                    inode.mode = (inode.mode & !0o777) | bits;
                    (!equivalent).then(|| acl.to_disk())
                }
                Some(acl) => Some(acl.to_disk()),
                None => None,
            };
            match store {
                Some(bytes) => xattr::set(txn, ctx, area, file_acl, name, &bytes, SetMode::Any),
                None => match xattr::remove(txn, ctx, area, file_acl, name) {
                    Err(FsError::NoData) => Ok(()),
                    other => other,
                },
            }
        })
    }

    /// What a new inode of `mode` (type and permission bits as asked for) gets in directory
    /// `parent` (`pdata`, locked): `mode` limited by the directory's default ACL, or by `umask` where it
    /// has none (or ACLs are off, or it is a symlink, which keeps its mode), and the ACLs to
    /// store with it ([`Filesystem::put_new_acls`]).
    pub(crate) fn new_inode_acls(
        &self,
        parent: u32,
        pdata: &InodeData,
        mode: &mut u16,
        umask: u16,
    ) -> Result<NewAcls> {
        let kind = *mode & ondisk::ext4::MODE_TYPE_MASK;
        if kind == ondisk::ext4::MODE_SYMLINK {
            return Ok(NewAcls::default());
        }
        let default =
            if self.options.acl { self.stored_xattr(parent, pdata, DEFAULT)? } else { None };
        let Some(stored) = default else {
            *mode &= !(umask & 0o777);
            return Ok(NewAcls::default());
        };
        let mut acl = Acl::from_disk(&stored).map_err(invalid)?;
        let not_equivalent = acl.create_masq(mode);
        Ok(NewAcls {
            access: not_equivalent.then(|| acl.to_disk()),
            default: (kind == ondisk::ext4::MODE_DIR).then_some(stored),
        })
    }

    /// Writes `acls` into new inode `ino`'s xattrs under `txn`, before its record is written.
    pub(crate) fn put_new_acls(
        &self,
        txn: &mut Txn<'_>,
        ino: u32,
        inode: &mut Inode,
        raw: &mut [u8],
        acls: &NewAcls,
    ) -> Result<()> {
        for (name, value) in [(ACCESS, &acls.access), (DEFAULT, &acls.default)] {
            if let Some(value) = value {
                self.put_acl(txn, ino, inode, raw, name, value)?;
            }
        }
        Ok(())
    }

    /// Stores ACL `name` (`value` in ext4's encoding) in locked inode `ino`'s xattrs
    /// (`inode`, its record `raw`) under `txn`, counting an xattr block it takes.
    fn put_acl(
        &self,
        txn: &mut Txn<'_>,
        ino: u32,
        inode: &mut Inode,
        raw: &mut [u8],
        name: &[u8],
        value: &[u8],
    ) -> Result<()> {
        let ctx = self.xattr_ctx_of(ino, inode);
        let range = inode.xattr_area_range(raw.len());
        let area = &mut raw[range];
        let charged = xattr::value_inode_charge(txn, &ctx, area, inode.file_acl)?;
        xattr::set(txn, &ctx, area, &mut inode.file_acl, name, value, SetMode::Any)?;
        // The value-inode charge (ea_inode) moves with the blocks, as in
        // `change_xattr_and_mode`.
        let charge =
            xattr::value_inode_charge(txn, &ctx, area, inode.file_acl)? as i64 - charged as i64;
        let delta = txn.take_blocks_delta() + charge / i64::from(self.block_size());
        crate::ops::add_blocks(inode, delta, self.block_size());
        Ok(())
    }

    /// After a chmod of locked inode `ino` to `mode`, under `txn`: its access ACL, if it has
    /// one, takes the new bits (`posix_acl_chmod`, which ext4's setattr calls). Returns
    /// whether it had one (an xattr changed, which no fast commit carries).
    pub(crate) fn chmod_acl(
        &self,
        txn: &mut Txn<'_>,
        ino: u32,
        data: &mut InodeData,
        mode: u16,
    ) -> Result<bool> {
        if !self.options.acl {
            return Ok(false);
        }
        let Some(stored) = self.stored_xattr(ino, data, ACCESS)? else { return Ok(false) };
        let mut acl = Acl::from_disk(&stored).map_err(invalid)?;
        acl.chmod_masq(mode);
        self.put_acl(txn, ino, &mut data.inode, &mut data.raw, ACCESS, &acl.to_disk())?;
        Ok(true)
    }

    /// The stored value of xattr `name` of a locked inode, if it has one.
    pub(crate) fn stored_xattr(
        &self,
        ino: u32,
        data: &InodeData,
        name: &[u8],
    ) -> Result<Option<Vec<u8>>> {
        let area = data.inode.xattr_area_range(data.raw.len());
        let ctx = self.xattr_ctx(ino);
        let io = &mut crate::adapters::ReadIo { fs: self };
        match xattr::get(io, &ctx, &data.raw[area], data.inode.file_acl, name) {
            Ok(xattr::Stored::Here(value)) => Ok(Some(value)),
            Ok(xattr::Stored::InInode(reference)) => self
                .read_value_inode(ino, name, reference)
                .map(Some)
                .map_err(|e| self.check_fs_error(ino, e)),
            Err(FsError::NoData) => Ok(None),
            // Damage is recorded as ext4_error records it (`error_policy.rs`).
            Err(err) => Err(self.check_fs_error(ino, err)),
        }
    }
}
