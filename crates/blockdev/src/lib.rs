//! Block devices: the lowest layer of quill and its test seam.
//!
//! Every device implements [`BlockDevice`], a byte-addressed interface whose offsets and lengths
//! are multiples of [`SECTOR_SIZE`] (512 bytes, the unit a power failure can tear). The journal
//! depends on exactly four durability primitives:
//! - `write_at`: the write completes into the device's volatile cache; it is durable only after a
//!   later `flush` *issued after this write completed* returns;
//! - `write_fua_at`: the write is durable when the call returns (FUA; `RWF_DSYNC` on a file);
//! - `flush`: every write that completed before the call was issued is durable when it returns;
//! - `write_batch`: several writes submitted together, possibly in parallel; each write of the
//!   batch has the durability of its own `fua` flag. Completion order inside a batch is unspecified.
//!
//! Implementations: [`file::FileDevice`], [`memory::MemDevice`], [`recording::RecordingDevice`]
//! (crash images), [`fault::FaultDevice`] (EIO injection), [`overlay::OverlayDevice`] (writes kept
//! in memory over a read-only device), [`simssd::SimSsd`] (deterministic
//! latency model).

pub mod aligned;
pub mod fault;
pub mod file;
pub mod memory;
pub mod overlay;
pub mod recording;
pub mod simssd;

use std::io;
use std::path::PathBuf;

/// The smallest unit the device writes atomically; torn writes tear at this granularity.
pub const SECTOR_SIZE: u64 = 512;

/// Which device operation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    WriteFua,
    /// An order-preserving write ([`BlockDevice::write_barrier_at`]).
    WriteBarrier,
    Flush,
}

/// The error type of the `blockdev` crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    #[error("{op:?} at byte {offset} failed: {source}")]
    Io { op: Op, offset: u64, source: io::Error },
    #[error("{op:?} of {len} bytes at byte {offset} is beyond the device end ({size} bytes)")]
    OutOfRange { op: Op, offset: u64, len: usize, size: u64 },
    #[error("{op:?} of {len} bytes at byte {offset} is not aligned to {SECTOR_SIZE}-byte sectors")]
    Misaligned { op: Op, offset: u64, len: usize },
    /// The device has no such operation (a cache barrier on a device without one).
    #[error("{op:?} at byte {offset}: this device does not support it")]
    Unsupported { op: Op, offset: u64 },
    /// Opening or creating a device failed (including finding its size).
    #[error("cannot open {}: {source}", path.display())]
    Open { path: PathBuf, source: io::Error },
}

impl DeviceError {
    /// The `errno` this error stands for, for the layers that report errno values.
    pub fn errno(&self) -> i32 {
        match self {
            DeviceError::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            DeviceError::OutOfRange { .. } => libc::ENOSPC,
            DeviceError::Misaligned { .. } => libc::EINVAL,
            DeviceError::Unsupported { .. } => libc::EOPNOTSUPP,
            DeviceError::Open { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        }
    }
}

/// One write of a batch.
#[derive(Debug, Clone, Copy)]
pub struct Write<'a> {
    pub offset: u64,
    pub data: &'a [u8],
    /// Durable on completion (FUA) rather than only after a later flush.
    pub fua: bool,
}

/// A block device. Shared between threads; every method may be called concurrently.
pub trait BlockDevice: Send + Sync {
    /// Device size in bytes (a multiple of [`SECTOR_SIZE`]).
    fn size_bytes(&self) -> u64;
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError>;
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), DeviceError>;
    fn write_fua_at(&self, offset: u64, data: &[u8]) -> Result<(), DeviceError>;
    fn flush(&self) -> Result<(), DeviceError>;
    /// Whether [`BlockDevice::write_barrier_at`] works: a cache barrier, as eMMC devices and
    /// the barrier-enabled I/O stack (BarrierFS) offer and the CJFS paper assumes of its SSD.
    /// Files, and so quill's image devices, have none.
    fn has_cache_barrier(&self) -> bool {
        false
    }
    /// An order-preserving write (BarrierFS's `REQ_ORDERED | REQ_BARRIER`): `data` reaches the
    /// media only after every write that completed before this call did. Like a plain write it
    /// is durable only after a later flush, and it says nothing about writes issued after it.
    /// Without a cache barrier: [`DeviceError::Unsupported`].
    fn write_barrier_at(&self, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        check_range(Op::WriteBarrier, offset, data.len(), self.size_bytes())?;
        Err(DeviceError::Unsupported { op: Op::WriteBarrier, offset })
    }
    /// Submit several writes together. The default submits them one after another; devices
    /// with internal parallelism override it.
    fn write_batch(&self, writes: &[Write<'_>]) -> Result<(), DeviceError> {
        for w in writes {
            if w.fua {
                self.write_fua_at(w.offset, w.data)?;
            } else {
                self.write_at(w.offset, w.data)?;
            }
        }
        Ok(())
    }
}

/// Checks that an I/O of `len` bytes at `offset` is sector-aligned and inside a device of `size`
/// bytes. Every device calls this first so that all of them reject the same requests.
pub fn check_range(op: Op, offset: u64, len: usize, size: u64) -> Result<(), DeviceError> {
    if !offset.is_multiple_of(SECTOR_SIZE) || !(len as u64).is_multiple_of(SECTOR_SIZE) {
        return Err(DeviceError::Misaligned { op, offset, len });
    }
    match offset.checked_add(len as u64) {
        Some(end) if end <= size => Ok(()),
        _ => Err(DeviceError::OutOfRange { op, offset, len, size }),
    }
}

impl<T: BlockDevice + ?Sized> BlockDevice for std::sync::Arc<T> {
    fn size_bytes(&self) -> u64 {
        (**self).size_bytes()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        (**self).read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        (**self).write_at(offset, data)
    }
    fn write_fua_at(&self, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        (**self).write_fua_at(offset, data)
    }
    fn flush(&self) -> Result<(), DeviceError> {
        (**self).flush()
    }
    fn has_cache_barrier(&self) -> bool {
        (**self).has_cache_barrier()
    }
    fn write_barrier_at(&self, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        (**self).write_barrier_at(offset, data)
    }
    fn write_batch(&self, writes: &[Write<'_>]) -> Result<(), DeviceError> {
        (**self).write_batch(writes)
    }
}
