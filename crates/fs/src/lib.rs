//! quill's ext4 file-system layer.
//!
//! ```
//! use std::sync::Arc;
//!
//! /// How many blocks the journal of the ext4 image on `dev` has.
//! fn journal_blocks(dev: Arc<dyn blockdev::BlockDevice>) -> Result<u32, fs::FsError> {
//!     let image = fs::Ext4Image::open(dev)?;
//!     Ok(image.journal_location()?.len_blocks())
//! }
//! ```

pub mod dir;
pub mod error;
pub mod extent_tree;
pub mod image;
pub mod meta_io;
pub mod mkfs;
pub mod xattr;

// The read-write file system (integrated once the structure modules land).
#[cfg(quill_rw)]
mod adapters;
#[cfg(quill_rw)]
mod data;
#[cfg(quill_rw)]
mod filesystem;
#[cfg(quill_rw)]
mod groups;
#[cfg(quill_rw)]
mod inodes;
#[cfg(quill_rw)]
mod ops;
#[cfg(quill_rw)]
mod orphan;
#[cfg(quill_rw)]
mod rename;

pub use error::FsError;
#[cfg(quill_rw)]
pub use data::FallocateMode;
#[cfg(quill_rw)]
pub use filesystem::{DataMode, Filesystem, MountOptions};
pub use image::Ext4Image;
#[cfg(quill_rw)]
pub use inodes::InodeSlot;
#[cfg(quill_rw)]
pub use ops::{Attr, DirEntry, RenameFlags, SetAttr, StatFs, ROOT_INO};
