//! The error type of the `fs` crate.
//!
//! Device, journal and parser errors convert upward with `From`. Anything wrong with what the
//! disk says is `Corrupted` with the block it was found in (block 0 for the superblock region),
//! so an operator can look at that block; a valid feature quill does not implement is
//! `Unsupported` and names it. The POSIX outcomes of operations (no such entry, exists, not
//! empty, no space, …) have their own variants; [`FsError::errno`] is the one place they
//! become errno values.

/// What went wrong while reading or updating an ext4 image.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FsError {
    #[error("device: {0}")]
    Device(#[from] blockdev::DeviceError),
    #[error(transparent)]
    OnDisk(#[from] ondisk::OnDiskError),
    #[error("journal: {0}")]
    Journal(#[from] journal::JournalError),
    /// The on-disk metadata at `block` is inconsistent.
    #[error("corrupted file system at block {block}: {reason}")]
    Corrupted { block: u64, reason: String },
    /// The file system uses a feature quill does not implement.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The file system has no journal (has_journal is off).
    #[error("the file system has no journal")]
    NoJournal,
    /// A block number at or past the end of the file system was requested.
    #[error("block {block} is beyond the end of the file system ({blocks_count} blocks)")]
    BlockOutOfRange { block: u64, blocks_count: u64 },
    /// An inode number of 0 or above the inode count was requested.
    #[error("inode {ino} does not exist (the file system has {inodes_count} inodes)")]
    NoSuchInode { ino: u32, inodes_count: u32 },
    /// The superblock describes a file system larger than the device holding it.
    #[error("the file system needs {fs_bytes} bytes but the device holds {device_bytes}")]
    DeviceTooSmall { fs_bytes: u64, device_bytes: u64 },
    /// ENOENT: no such directory entry (or path component).
    #[error("no such file or directory")]
    NotFound,
    /// EEXIST: the name (or extended attribute, with XATTR_CREATE) already exists.
    #[error("file exists")]
    Exists,
    /// ENOTDIR: a directory was required.
    #[error("not a directory")]
    NotDir,
    /// EISDIR: the operation does not apply to a directory.
    #[error("is a directory")]
    IsDir,
    /// ENOTEMPTY: rmdir or rename over a directory that still has entries.
    #[error("directory not empty")]
    NotEmpty,
    /// ENOSPC: no free blocks or inodes (or no room for an extended attribute).
    #[error("no space left on device")]
    NoSpace,
    /// ENAMETOOLONG: a name longer than 255 bytes (or an xattr name longer than 255).
    #[error("file name too long")]
    NameTooLong,
    /// ENODATA: no such extended attribute.
    #[error("no such extended attribute")]
    NoData,
    /// ERANGE: an extended attribute value too large to store, or a buffer too small.
    #[error("value out of range")]
    Range,
    /// EMLINK: the link count would exceed ext4's limit.
    #[error("too many links")]
    TooManyLinks,
    /// EINVAL: a request that makes no sense (renaming a directory into itself, bad flags, …).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// EOPNOTSUPP: a valid request quill does not implement (for example a fallocate mode).
    #[error("operation not supported: {0}")]
    NotSupported(String),
    /// EROFS: the file system is read-only (opened so, or turned so by an error).
    #[error("read-only file system")]
    ReadOnly,

    /// A link or rename into a directory whose project is inherited (PROJINHERIT) by an inode
    /// of another project (EXDEV, as ext4 answers it).
    #[error("cross-project link or rename (the directory's project is inherited)")]
    CrossProject,

    /// Multiple mount protection: another host (or e2fsck) has the file system (EBUSY).
    #[error("the file system is in use elsewhere (multiple mount protection): {0}")]
    InUse(String),
    /// EFBIG: the file would exceed the largest size ext4 can map.
    #[error("file too large")]
    FileTooLarge,

    #[error("no data or hole at or after that offset")]
    NoSuchOffset,
    /// EPERM: the inode's flags forbid the change (immutable, append only), or the caller may
    /// not change the flags.
    #[error("operation not permitted: {0}")]
    NotPermitted(&'static str),
    /// EACCES: a request the inode's kind forbids (a default ACL on a file).
    #[error("permission denied: {0}")]
    AccessDenied(&'static str),
}

/// Result alias of the `fs` crate.
pub type Result<T, E = FsError> = std::result::Result<T, E>;

impl FsError {
    pub(crate) fn corrupted(block: u64, reason: impl Into<String>) -> Self {
        FsError::Corrupted { block, reason: reason.into() }
    }

    /// Attaches the block a structure came from to a parser's `Corrupted` error; other parser
    /// errors (`Unsupported`) pass through unchanged.
    pub(crate) fn at_block(block: u64) -> impl FnOnce(ondisk::OnDiskError) -> FsError {
        move |err| match err {
            ondisk::OnDiskError::Corrupted { .. } => FsError::corrupted(block, err.to_string()),
            other => FsError::OnDisk(other),
        }
    }

    /// Whether the error reports damaged metadata (EUCLEAN), as opposed to a caller's mistake
    /// or an ordinary condition. An inode number past the inode count comes from a damaged
    /// directory entry (callers get inode numbers from lookups).
    pub fn is_corruption(&self) -> bool {
        matches!(
            self,
            FsError::OnDisk(_)
                | FsError::Corrupted { .. }
                | FsError::BlockOutOfRange { .. }
                | FsError::NoSuchInode { .. }
        )
    }

    /// The errno this error stands for (positive, as libc defines them).
    pub fn errno(&self) -> i32 {
        match self {
            FsError::Device(e) => e.errno(),
            FsError::Journal(e) => e.errno(),
            FsError::OnDisk(_)
            | FsError::Corrupted { .. }
            | FsError::BlockOutOfRange { .. }
            | FsError::NoSuchInode { .. } => errno::EUCLEAN,
            FsError::Unsupported(_) | FsError::NotSupported(_) => errno::EOPNOTSUPP,
            FsError::NoJournal | FsError::DeviceTooSmall { .. } | FsError::Invalid(_) => {
                errno::EINVAL
            }
            FsError::NotFound => errno::ENOENT,
            FsError::Exists => errno::EEXIST,
            FsError::NotDir => errno::ENOTDIR,
            FsError::IsDir => errno::EISDIR,
            FsError::NotEmpty => errno::ENOTEMPTY,
            FsError::NoSpace => errno::ENOSPC,
            FsError::NameTooLong => errno::ENAMETOOLONG,
            FsError::NoData => errno::ENODATA,
            FsError::Range => errno::ERANGE,
            FsError::TooManyLinks => errno::EMLINK,
            FsError::ReadOnly => errno::EROFS,
            FsError::InUse(_) => errno::EBUSY,
            FsError::CrossProject => errno::EXDEV,
            FsError::FileTooLarge => errno::EFBIG,
            FsError::NoSuchOffset => errno::ENXIO,
            FsError::NotPermitted(_) => errno::EPERM,
            FsError::AccessDenied(_) => errno::EACCES,
        }
    }
}

/// Linux errno values (x86-64 and aarch64 agree on all of these).
pub mod errno {
    pub const EPERM: i32 = 1;
    pub const EACCES: i32 = 13;
    pub const ENOENT: i32 = 2;
    pub const EIO: i32 = 5;
    pub const ENXIO: i32 = 6;
    pub const EEXIST: i32 = 17;
    pub const EXDEV: i32 = 18;
    pub const ENOTDIR: i32 = 20;
    pub const EBUSY: i32 = 16;
    pub const EISDIR: i32 = 21;
    pub const EINVAL: i32 = 22;
    pub const EFBIG: i32 = 27;
    pub const ENOSPC: i32 = 28;
    pub const EROFS: i32 = 30;
    pub const EMLINK: i32 = 31;
    pub const ERANGE: i32 = 34;
    pub const ENAMETOOLONG: i32 = 36;
    pub const ENOTEMPTY: i32 = 39;
    pub const ENODATA: i32 = 61;
    pub const EOPNOTSUPP: i32 = 95;
    pub const EUCLEAN: i32 = 117;
}
