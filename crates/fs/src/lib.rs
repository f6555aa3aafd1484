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

mod adapters;
mod data;
mod filesystem;
mod groups;
mod inodes;
mod ops;
mod orphan;
mod rename;

pub use data::FallocateMode;
pub use error::FsError;
pub use filesystem::{DataMode, Filesystem, MountOptions};
pub use image::Ext4Image;
pub use inodes::InodeSlot;
pub use ops::{Attr, DirEntry, RenameFlags, SetAttr, StatFs, ROOT_INO};
pub use xattr::SetMode;
