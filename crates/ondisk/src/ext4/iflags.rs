//! `i_flags` as users see and change them: the bits chattr and lsattr name
//! (`FS_IOC_GETFLAGS` / `FS_IOC_SETFLAGS`), which of them a caller may change, which a new
//! inode takes from its directory, and the `struct fsxattr` view of them
//! (`FS_IOC_FSGETXATTR` / `FS_IOC_FSSETXATTR`, xfs_io's `lsattr` and `chattr`). Values and
//! masks are the kernel's (fs/ext4/ext4.h, include/uapi/linux/fs.h); what a file system does
//! about each flag is the `fs` crate's business.

use super::inode::{EXTENTS_FL, INDEX_FL, INLINE_DATA_FL};

/// Secure deletion (`s`; stored, not acted on, as by ext4).
pub const SECRM_FL: u32 = 0x0000_0001;
/// Undelete (`u`; stored only).
pub const UNRM_FL: u32 = 0x0000_0002;
/// Compress (`c`; stored only: ext4 does not compress).
pub const COMPR_FL: u32 = 0x0000_0004;
/// Synchronous updates (`S`).
pub const SYNC_FL: u32 = 0x0000_0008;
/// Immutable (`i`): no change to data, metadata or names.
pub const IMMUTABLE_FL: u32 = 0x0000_0010;
/// Append only (`a`): writes only at the end; no truncation, rename or removal.
pub const APPEND_FL: u32 = 0x0000_0020;
/// Not for dump(8) (`d`).
pub const NODUMP_FL: u32 = 0x0000_0040;
/// No access-time updates (`A`).
pub const NOATIME_FL: u32 = 0x0000_0080;
/// Compression bits, visible but not settable.
pub const DIRTY_FL: u32 = 0x0000_0100;
pub const COMPRBLK_FL: u32 = 0x0000_0200;
pub const NOCOMPR_FL: u32 = 0x0000_0400;
/// An encrypted inode (visible only).
pub const ENCRYPT_FL: u32 = 0x0000_0800;
/// Data journaling for this file (`j`).
pub const JOURNAL_DATA_FL: u32 = 0x0000_4000;
/// No tail merging (`t`; stored only).
pub const NOTAIL_FL: u32 = 0x0000_8000;
/// Synchronous directory updates (`D`, directories only).
pub const DIRSYNC_FL: u32 = 0x0001_0000;
/// Top of a directory hierarchy (`T`, directories only; an Orlov allocator hint).
pub const TOPDIR_FL: u32 = 0x0002_0000;
/// A verity file (visible only).
pub const VERITY_FL: u32 = 0x0010_0000;
/// Blocks past the end of file (deprecated, still settable).
pub const EOFBLOCKS_FL: u32 = 0x0040_0000;
/// Direct access (`x`).
pub const DAX_FL: u32 = 0x0200_0000;
/// New inodes take the directory's project id (`P`).
pub const PROJINHERIT_FL: u32 = 0x2000_0000;
/// Case-insensitive names (`F`, directories only).
pub const CASEFOLD_FL: u32 = 0x4000_0000;

/// `EXT4_FL_USER_MODIFIABLE`: the flags FS_IOC_SETFLAGS may change (others it leaves alone).
pub const USER_MODIFIABLE: u32 = SECRM_FL
    | UNRM_FL
    | COMPR_FL
    | SYNC_FL
    | IMMUTABLE_FL
    | APPEND_FL
    | NODUMP_FL
    | NOATIME_FL
    | JOURNAL_DATA_FL
    | NOTAIL_FL
    | DIRSYNC_FL
    | TOPDIR_FL
    | EXTENTS_FL
    | EOFBLOCKS_FL
    | DAX_FL
    | PROJINHERIT_FL
    | CASEFOLD_FL;

/// `EXT4_FL_USER_VISIBLE`: the flags FS_IOC_GETFLAGS shows.
pub const USER_VISIBLE: u32 = USER_MODIFIABLE
    | DIRTY_FL
    | COMPRBLK_FL
    | NOCOMPR_FL
    | ENCRYPT_FL
    | INDEX_FL
    | VERITY_FL
    | INLINE_DATA_FL;

/// `EXT4_FL_INHERITED`: what a new inode takes from its directory (then masked by its kind,
/// [`mask_for_kind`]).
pub const INHERITED: u32 = SECRM_FL
    | UNRM_FL
    | COMPR_FL
    | SYNC_FL
    | NODUMP_FL
    | NOATIME_FL
    | NOCOMPR_FL
    | JOURNAL_DATA_FL
    | NOTAIL_FL
    | DIRSYNC_FL
    | PROJINHERIT_FL
    | CASEFOLD_FL
    | DAX_FL;

/// `FS_COMMON_FL`: the flags the fsxattr view has a bit for.
pub const COMMON: u32 =
    SYNC_FL | IMMUTABLE_FL | APPEND_FL | NODUMP_FL | NOATIME_FL | DAX_FL | PROJINHERIT_FL;

/// Which kind of inode a set of flags is for ([`mask_for_kind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagsKind {
    Directory,
    Regular,
    /// Symlinks, devices, fifos and sockets.
    Other,
}

impl FlagsKind {
    /// The kind of an inode of `mode` (its type bits).
    pub fn of_mode(mode: u16) -> FlagsKind {
        match mode & super::MODE_TYPE_MASK {
            super::MODE_DIR => FlagsKind::Directory,
            super::MODE_REGULAR => FlagsKind::Regular,
            _ => FlagsKind::Other,
        }
    }
}

/// `ext4_mask_flags`: the flags an inode of `kind` can carry. Directories take all; regular
/// files all but the directory-only ones; other inodes only `d` and `A`.
pub fn mask_for_kind(kind: FlagsKind, flags: u32) -> u32 {
    match kind {
        FlagsKind::Directory => flags,
        FlagsKind::Regular => flags & !(DIRSYNC_FL | TOPDIR_FL | CASEFOLD_FL | PROJINHERIT_FL),
        FlagsKind::Other => flags & (NODUMP_FL | NOATIME_FL),
    }
}

/// `struct fsxattr` (28 bytes) as FS_IOC_FSGETXATTR and FS_IOC_FSSETXATTR pass it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FsXattr {
    pub xflags: u32,
    pub extsize: u32,
    pub nextents: u32,
    pub projid: u32,
    pub cowextsize: u32,
}

/// `FS_XFLAG_*` bits with an `i_flags` counterpart, in [`COMMON`]'s order.
const XFLAG_OF: [(u32, u32); 7] = [
    (SYNC_FL, 0x0000_0020),
    (IMMUTABLE_FL, 0x0000_0008),
    (APPEND_FL, 0x0000_0010),
    (NODUMP_FL, 0x0000_0080),
    (NOATIME_FL, 0x0000_0040),
    (DAX_FL, 0x0000_8000),
    (PROJINHERIT_FL, 0x0000_0200),
];

/// Every `FS_XFLAG_*` bit with an `i_flags` counterpart.
pub const XFLAGS_COMMON: u32 = 0x20 | 0x08 | 0x10 | 0x80 | 0x40 | 0x8000 | 0x200;

impl FsXattr {
    /// The encoded size.
    pub const LEN: usize = 28;

    /// The xflags `i_flags` show (`fileattr_fill_flags`).
    pub fn xflags_of(flags: u32) -> u32 {
        XFLAG_OF.iter().filter(|(fl, _)| flags & fl != 0).fold(0, |x, (_, bit)| x | bit)
    }

    /// The `i_flags` bits (of [`COMMON`]) `xflags` set (`fileattr_fill_xflags`).
    pub fn flags_of(xflags: u32) -> u32 {
        XFLAG_OF.iter().filter(|(_, bit)| xflags & bit != 0).fold(0, |f, (fl, _)| f | fl)
    }

    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        for (k, v) in [self.xflags, self.extsize, self.nextents, self.projid, self.cowextsize]
            .iter()
            .enumerate()
        {
            out[4 * k..4 * k + 4].copy_from_slice(&v.to_ne_bytes());
        }
        out
    }

    /// Decodes the first [`FsXattr::LEN`] bytes; `None` when there are fewer.
    pub fn decode(bytes: &[u8]) -> Option<FsXattr> {
        let word = |k: usize| -> Option<u32> {
            Some(u32::from_ne_bytes(bytes.get(4 * k..4 * k + 4)?.try_into().ok()?))
        };
        if bytes.len() < Self::LEN {
            return None;
        }
        Some(FsXattr {
            xflags: word(0)?,
            extsize: word(1)?,
            nextents: word(2)?,
            projid: word(3)?,
            cowextsize: word(4)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_masks_are_the_kernels_values() {
        // EXT4_FL_USER_VISIBLE and EXT4_FL_USER_MODIFIABLE as 6.x writes them out.
        assert_eq!(USER_MODIFIABLE, 0x624B_C0FF);
        assert_eq!(USER_VISIBLE, 0x725B_DFFF);
    }

    #[test]
    fn xflags_map_both_ways_and_fsxattr_round_trips() {
        assert_eq!(FsXattr::xflags_of(IMMUTABLE_FL | APPEND_FL | EXTENTS_FL), 0x18);
        assert_eq!(FsXattr::flags_of(0x18 | 0x1), IMMUTABLE_FL | APPEND_FL);
        for fl in [SYNC_FL, IMMUTABLE_FL, APPEND_FL, NODUMP_FL, NOATIME_FL, DAX_FL, PROJINHERIT_FL]
        {
            assert_eq!(FsXattr::flags_of(FsXattr::xflags_of(fl)), fl);
        }
        assert_eq!(FsXattr::xflags_of(COMMON), XFLAGS_COMMON);
        let x = FsXattr { xflags: 0x18, extsize: 0, nextents: 3, projid: 7, cowextsize: 0 };
        assert_eq!(FsXattr::decode(&x.encode()), Some(x));
        assert_eq!(FsXattr::decode(&[0u8; 27]), None);
    }

    #[test]
    fn kinds_keep_only_their_flags() {
        let all = USER_MODIFIABLE;
        assert_eq!(mask_for_kind(FlagsKind::Directory, all), all);
        assert_eq!(mask_for_kind(FlagsKind::Regular, DIRSYNC_FL | NOATIME_FL), NOATIME_FL);
        assert_eq!(mask_for_kind(FlagsKind::Other, all), NODUMP_FL | NOATIME_FL);
    }
}
