//! quill's ext4 file-system layer. For now: opening an image read-only, reading inodes and
//! extent trees, locating the internal journal, and toggling the needs_recovery flag.
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

pub mod error;
pub mod image;

pub use error::FsError;
pub use image::Ext4Image;
