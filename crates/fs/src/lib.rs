//! quill's ext4 file-system layer: format an image ([`mkfs`]), open it ([`Filesystem`]),
//! and work on it with inode-based POSIX operations, all journaled through the `journal`
//! crate so e2fsck and the kernel can replay what a crash leaves.
//!
//! ```
//! use std::sync::Arc;
//! use blockdev::{memory::MemDevice, BlockDevice};
//! use fs::{Filesystem, MountOptions, ROOT_INO};
//!
//! let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(32 << 20));
//! let options = fs::mkfs::MkfsOptions { device_zeroed: true, ..Default::default() };
//! fs::mkfs::mkfs(dev.as_ref(), &options)?;
//!
//! let fs = Filesystem::open(dev.clone(), MountOptions::default())?;
//! let docs = fs.mkdir(ROOT_INO, b"docs", 0o755, 1000, 1000)?;
//! let file = fs.create(docs.ino, b"hello.txt", 0o644, 1000, 1000)?;
//! fs.write(file.ino, 0, b"hello, ext4")?;
//! fs.fsync(file.ino, false)?;
//!
//! let mut buf = [0u8; 11];
//! assert_eq!(fs.read(fs.resolve("/docs/hello.txt")?, 0, &mut buf)?, 11);
//! assert_eq!(&buf, b"hello, ext4");
//! fs.unmount()?;
//! # Ok::<(), fs::FsError>(())
//! ```

pub mod block_map;
pub mod dir;
pub mod error;
pub mod extent_tree;
pub mod image;
pub mod indirect;
pub mod meta_io;
pub mod mkfs;
pub mod xattr;

mod acl;
mod adapters;
mod atime;
mod clean_cache;
mod clusters;
mod data;
mod dcache;
mod ea_inode;
mod error_policy;
mod fast_commit;
mod file;
mod filesystem;
mod fsync_journal;
mod groups;
mod inline;
mod inode_flags;
mod inodes;
mod mmp;
mod ops;
mod orphan;
mod page_cache;
mod quota;
mod rename;
mod seek;
mod writeback;

pub use atime::AtimeMode;
pub use data::FallocateMode;
pub use error::FsError;
pub use file::File;
pub use filesystem::{DataMode, ErrorPolicy, Filesystem, MountOptions};
pub use image::Ext4Image;
pub use inode_flags::OpenIntent;
pub use inodes::InodeSlot;
pub use ops::{Attr, DirEntry, RenameFlags, SetAttr, StatFs, ROOT_INO};
pub use seek::SeekTarget;
pub use writeback::Flusher;
pub use xattr::SetMode;
