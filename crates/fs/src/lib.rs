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

pub use error::FsError;
pub use image::Ext4Image;
