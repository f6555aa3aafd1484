//! On-disk structures of ext4 and JBD2: parse → validate → encode, and the checksums they use.
//!
//! Nothing here performs I/O. Every parser treats its input as untrusted bytes read from a disk:
//! it returns [`OnDiskError::Corrupted`] instead of panicking or indexing out of bounds.
//! Every encoder writes explicit little-endian (ext4) or big-endian (JBD2) fields.

pub mod crc;
pub mod error;
pub mod ext4;
pub mod jbd2;
pub mod testing;
pub mod tid;

pub use error::OnDiskError;
pub use tid::Tid;
