//! The error type of the `fs` crate.
//!
//! Device and parser errors convert upward with `From`. Anything wrong with what the disk
//! says is `Corrupted` with the block it was found in (block 0 for the superblock region),
//! so an operator can look at that block; a valid feature quill does not implement is
//! `Unsupported` and names it.

/// What went wrong while reading or updating an ext4 image.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FsError {
    #[error("device: {0}")]
    Device(#[from] blockdev::DeviceError),
    #[error(transparent)]
    OnDisk(#[from] ondisk::OnDiskError),
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
}

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
}
