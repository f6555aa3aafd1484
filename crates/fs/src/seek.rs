//! lseek's SEEK_DATA and SEEK_HOLE, answered as ext4 answers them (`ext4_llseek` →
//! `iomap_seek_data` / `iomap_seek_hole` over `ext4_iomap_report_ops`), block by block:
//!
//! - data: a block a written extent maps, or one with dirty cached data (ext4 reports its
//!   delayed allocations as data too, and data written into an unwritten extent);
//! - hole: a block nothing maps, or an unwritten (fallocated) one without cached data;
//! - the end of the file is a hole, and an offset at or past it is ENXIO for both.
//!
//! The kernel also counts as data the page-cache folios up to date over an unwritten extent
//! (a read of it brings them in, and a ZERO_RANGE over cached writes leaves them) until they
//! are dropped; quill caches no clean pages there, so such a range stays a hole.

use crate::adapters::{extent_ctx, ReadIo};
use crate::block_map;
use crate::error::{FsError, Result};
use crate::extent_tree::Lookup;
use crate::filesystem::Filesystem;

/// What lseek looks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeekTarget {
    /// SEEK_DATA: the first byte at or after the offset that holds data.
    Data,
    /// SEEK_HOLE: the first byte at or after the offset in a hole (the end of the file at
    /// the latest).
    Hole,
}

impl Filesystem {
    /// The offset lseek(`offset`, SEEK_DATA or SEEK_HOLE) of regular file `ino` returns;
    /// [`FsError::NoSuchOffset`] (ENXIO) at or past the end of the file, or for SEEK_DATA
    /// with no data after `offset`.
    pub fn seek_data_hole(&self, ino: u32, offset: u64, target: SeekTarget) -> Result<u64> {
        let slot = self.inodes.slot(ino);
        let guard = self.lock_file(&slot)?;
        let data = guard.as_ref().expect("loaded");
        let size = data.size();
        if offset >= size {
            return Err(FsError::NoSuchOffset);
        }
        if data.inode.has_inline_data() {
            // Inline data is data up to the end of the file.
            return Ok(match target {
                SeekTarget::Data => offset,
                SeekTarget::Hole => size,
            });
        }
        let bs = u64::from(self.block_size());
        let first = (offset / bs) as u32;
        let last = ((size - 1) / bs) as u32;
        let ectx = extent_ctx(self, ino, data);
        let mut io = ReadIo { fs: self };
        let runs = block_map::mapping(&mut io, &ectx, &data.inode, first, last)
            .map_err(|e| self.check_fs_error(ino, e))?;
        let cached = |lblk: u32| data.cache.pages.contains_key(&lblk);
        let wanted = |lblk: u32, written: bool| {
            let is_data = written || cached(lblk);
            is_data == (target == SeekTarget::Data)
        };
        for (start, run) in runs {
            let (len, written) = match run {
                Lookup::Mapped { len, unwritten, .. } => (len, !unwritten),
                Lookup::Hole { len_to_next } => (len_to_next.unwrap_or(u32::MAX), false),
            };
            let len = len.min(last - start + 1);
            // Dirty pages make blocks data one at a time; a written run is data throughout.
            let found = if written || data.cache.pages.range(start..start + len).next().is_none() {
                wanted(start, written).then_some(start)
            } else {
                (start..start + len).find(|&lblk| wanted(lblk, written))
            };
            if let Some(lblk) = found {
                return Ok((u64::from(lblk) * bs).max(offset).min(size));
            }
        }
        match target {
            SeekTarget::Data => Err(FsError::NoSuchOffset),
            SeekTarget::Hole => Ok(size),
        }
    }
}
