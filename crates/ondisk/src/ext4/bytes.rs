//! Explicit little-endian field access for the fixed ext4 layouts.
//!
//! These helpers index directly: every caller first proves that `off + width` lies inside the
//! slice (by checking the slice length against the structure size, or by reading from a
//! fixed-size array with constant offsets). An out-of-range offset here is a bug in this crate,
//! never a consequence of disk contents.

pub(crate) fn le16(bytes: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([bytes[off], bytes[off + 1]])
}

pub(crate) fn le32(bytes: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([bytes[off], bytes[off + 1], bytes[off + 2], bytes[off + 3]])
}

pub(crate) fn put_le16(bytes: &mut [u8], off: usize, value: u16) {
    bytes[off..off + 2].copy_from_slice(&value.to_le_bytes());
}

pub(crate) fn put_le32(bytes: &mut [u8], off: usize, value: u32) {
    bytes[off..off + 4].copy_from_slice(&value.to_le_bytes());
}

/// A 48-bit block number stored as a 32-bit low half and a 16-bit high half, as extents,
/// extent indexes and several inode fields do.
pub(crate) fn block48(lo: u32, hi: u16) -> u64 {
    u64::from(lo) | (u64::from(hi) << 32)
}
