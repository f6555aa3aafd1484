//! Inline data (the inline_data feature) in the file system: files, symlinks and directories
//! whose contents live in the inode ([`ondisk::ext4::inline`] has the layout).
//!
//! | inode     | read                                    | changed                                |
//! |-----------|-----------------------------------------|----------------------------------------|
//! | file      | `i_block` + `system.data`, up to i_size | a write caches the bytes as page 0;    |
//! |           |                                         | writeback keeps the file inline while  |
//! |           |                                         | it fits, else moves it out with page 0 |
//! |           |                                         | (truncate, fallocate: moved out first) |
//! | symlink   | the same (readlink)                     | never (a symlink's target is fixed)    |
//! | directory | as a one-block directory whose block is | stays inline while the entries fit the |
//! |           | what the kernel would convert it to     | inode (`system.data` grows as the      |
//! |           | ([`inline_dir_block`])                  | in-inode xattr area allows), else      |
//! |           |                                         | moves into a block (`adapters.rs`)     |
//!
//! The directory code sees an inline directory as that one block, so lookups, readdir (in
//! hash order with dir_index, as a one-block directory: a listing's cookies stay good when the
//! directory later moves into a block) and emptiness need nothing of their own. A change
//! writes the block back; [`InlineDir::store`] puts the entries back in the inode when they
//! fit, and otherwise the block becomes the directory's first real block, as the kernel's
//! `ext4_convert_inline_data_nolock` does.
//!
//! Moving out is one transaction: the block is written (a file's data as ordered data, a
//! directory's block journaled) before the commit that drops the inline flag and maps it, so a
//! crash shows the contents inline or in the block, never lost. The moved inode gets an
//! extent tree when the file system has extents (as the kernel's
//! `ext4_destroy_inline_data_nolock`), else an empty block map.
//!
//! What quill makes: a new directory starts inline, as the kernel's (`ext4_try_create_inline_dir`),
//! when its record has room for `system.data`; a file whose data, at writeback, is one page
//! that fits the inode goes there when the file maps no block yet
//! ([`Filesystem::writeback_inline`], as `ext4_try_to_write_inline_data`). Not under
//! data=journal. Inline data is journaled with the inode, so it is as durable as metadata.

use ondisk::ext4::inline::{self as layout, InlineEntry, INLINE_XATTR_INDEX, INLINE_XATTR_NAME};
use ondisk::ext4::xattr::{encode_inode_xattrs, parse_inode_xattrs, XattrEntry};
use ondisk::ext4::{self, dir as dirent, INODE_BLOCK_SIZE};

use ondisk::Tid;

use crate::error::{FsError, Result};
use crate::extent_tree;
use crate::filesystem::{Filesystem, Txn};
use crate::groups::Reservation;
use crate::inodes::InodeData;
use crate::ops::txn_write_inode;

/// The value of `system.data` in `data`'s in-inode xattr area; empty when the attribute is
/// missing (the kernel then keeps only `i_block`'s 60 bytes inline).
pub(crate) fn inline_value(data: &InodeData) -> Result<Vec<u8>> {
    let area = &data.raw[data.inode.xattr_area_range(data.raw.len())];
    let entries = parse_inode_xattrs(area)?;
    Ok(layout::inline_value(&entries).map(<[u8]>::to_vec).unwrap_or_default())
}

/// Sets (`Some`) or removes (`None`) `system.data` in `data`'s in-inode area, keeping the
/// other attributes. Returns false, changing nothing, when the value does not fit.
fn set_inline_value(data: &mut InodeData, value: Option<&[u8]>) -> Result<bool> {
    set_inline_value_in(&data.inode, &mut data.raw, value)
}

/// [`set_inline_value`] on `inode`'s record `raw`.
fn set_inline_value_in(inode: &ext4::Inode, raw: &mut [u8], value: Option<&[u8]>) -> Result<bool> {
    let range = inode.xattr_area_range(raw.len());
    let mut entries = parse_inode_xattrs(&raw[range.clone()])?;
    entries.retain(|e| !layout::is_inline_xattr(e));
    if let Some(value) = value {
        // The kernel keeps system.data first among the in-inode entries.
        let entry = XattrEntry::new(INLINE_XATTR_INDEX, INLINE_XATTR_NAME, value);
        entries.insert(0, entry);
    }
    match encode_inode_xattrs(&entries, range.len()) {
        Some(area) => {
            raw[range].copy_from_slice(&area);
            Ok(true)
        }
        None => Ok(false),
    }
}

/// Drops `data`'s inline data: `system.data` removed, the flag cleared, `i_block` an empty
/// extent root (`extents`) or an empty block map. The caller maps the contents' block and
/// writes the inode in the same transaction, `tid` (when fast commits may run): no fast
/// commit of `tid` may express the inode, though the write that maps the block would say it
/// can (replay maps ranges only into inodes with extents, and the last commit's is inline).
pub(crate) fn leave_inode(data: &mut InodeData, extents: bool, tid: Option<Tid>) -> Result<()> {
    set_inline_value(data, None)?;
    let inode = &mut data.inode;
    inode.flags &= !ext4::INLINE_DATA_FL;
    inode.block = [0; INODE_BLOCK_SIZE];
    if extents {
        inode.flags |= ext4::EXTENTS_FL;
        extent_tree::init_root(&mut inode.block);
    }
    data.fc.ineligible_next("inline data moved out");
    if let Some(tid) = tid {
        data.fc.ineligible_in(tid, "inline data moved out");
    }
    Ok(())
}

/// The block an inline directory (`ino`) reads as: what it would become moved out, with a
/// checksum tail when the file system has metadata_csum.
pub(crate) fn inline_dir_block(
    ino: u32,
    data: &InodeData,
    block_size: usize,
    csum_seed: Option<u32>,
) -> Result<Vec<u8>> {
    let value = inline_value(data)?;
    let mut block =
        layout::dir_block_image(&data.inode.block, &value, ino, block_size, csum_seed.is_some())?;
    if let Some(seed) = csum_seed {
        dirent::set_dir_block_checksum(seed, &mut block);
    }
    Ok(block)
}

/// An inline directory while one directory operation runs on it (`adapters::DirAccess`).
pub(crate) struct InlineDir {
    /// The directory's one block as the operation last wrote it (or as first read).
    pub block: Vec<u8>,
    /// The block has a checksum tail.
    pub has_tail: bool,
}

impl InlineDir {
    /// Puts the entries of `block` (a leaf with "." and "..") back into the inode, in
    /// `data`'s `i_block` and `system.data`, growing the value as far as the in-inode area
    /// allows. Returns false, changing nothing, when they do not fit: the caller then moves
    /// the directory into a block.
    pub fn store(&mut self, data: &mut InodeData, block: &[u8]) -> Result<bool> {
        let (_, dotdot) = dirent::parse_dots(block)?;
        let parent = dotdot.inode;
        let entries: Vec<InlineEntry> = dirent::parse_dir_block(block, self.has_tail)?
            .into_iter()
            .filter(|e| e.offset > dotdot.offset)
            .map(|e| InlineEntry { name: e.name.to_vec(), inode: e.inode, file_type: e.file_type })
            .collect();
        let value_len = inline_value(data)?.len();
        let area_len = data.inode.xattr_area_range(data.raw.len()).len();
        let Some((i_block, value)) = layout::encode_dir(parent, &entries, value_len, area_len)
        else {
            return Ok(false);
        };
        if !set_inline_value(data, Some(&value))? {
            return Ok(false);
        }
        data.inode.block = i_block;
        data.inode.size = (INODE_BLOCK_SIZE + value.len()) as u64;
        data.fc.ineligible_next("inline directory");
        self.block = block.to_vec();
        Ok(true)
    }
}

/// Makes new directory `data` (no blocks yet) inline, with `parent` and no entries, when
/// its record has room for an empty `system.data`; otherwise leaves it as it is (it then gets
/// a block).
pub(crate) fn make_inline_dir(data: &mut InodeData, parent: u32) -> Result<()> {
    let (i_block, value) = layout::encode_dir(parent, &[], 0, 0).expect("no entries fit");
    if !set_inline_value(data, Some(&value))? {
        return Ok(());
    }
    let inode = &mut data.inode;
    inode.flags = (inode.flags & !ext4::EXTENTS_FL) | ext4::INLINE_DATA_FL;
    inode.block = i_block;
    inode.size = INODE_BLOCK_SIZE as u64;
    Ok(())
}

impl Filesystem {
    /// The inline_data feature: new directories start in their inode.
    pub(crate) fn has_inline_data(&self) -> bool {
        self.params.feature_incompat & ext4::feature::INCOMPAT_INLINE_DATA != 0
    }

    /// The contents of inline file or symlink `ino`.
    pub(crate) fn inline_file_bytes(&self, ino: u32, data: &InodeData) -> Result<Vec<u8>> {
        let bytes = inline_value(data)
            .and_then(|value| Ok(layout::file_bytes(&data.inode.block, &value, data.inode.size)?));
        bytes.map_err(|e| self.at_inode(ino, e))
    }

    /// Before a truncate or fallocate, which work on blocks: file `ino` (locked: `data`)
    /// leaves its inode. Its cached writes are written back first, since writeback may put
    /// them inline (a small new file) or keep them there; then the inline bytes move out.
    pub(crate) fn move_inline_out(&self, ino: u32, data: &mut InodeData) -> Result<()> {
        if !self.has_inline_data() || !data.inode.is_regular() {
            return Ok(());
        }
        if !data.cache.is_empty() {
            self.writeback_locked(ino, data)?;
        }
        self.uninline_file(ino, data)
    }

    /// Before a cached write to inline file `slot` (locked: `data`): its bytes become the
    /// cache's page 0 (a block reserved for it, as for any page over a hole), so that the
    /// write lands on them and writeback has the whole file in the cache: it keeps the file
    /// inline if it still fits ([`Filesystem::writeback_inline`]) or moves it out with page
    /// 0 in its first handle. The times are the caller's to set.
    pub(crate) fn cache_inline_bytes(
        &self,
        slot: &std::sync::Arc<crate::inodes::InodeSlot>,
        data: &mut InodeData,
    ) -> Result<()> {
        if !data.inode.has_inline_data() || data.cache.pages.contains_key(&0) {
            return Ok(());
        }
        let ino = slot.ino;
        let bytes = self.inline_file_bytes(ino, data).map_err(|e| self.check_fs_error(ino, e))?;
        if bytes.is_empty() {
            return Ok(());
        }
        let times = (data.inode.mtime, data.inode.ctime);
        let taken = self.cache_write(slot, data, 0, &bytes)?;
        (data.inode.mtime, data.inode.ctime) = times;
        if taken < bytes.len() {
            return Err(FsError::NoSpace);
        }
        Ok(())
    }

    /// A write of `bytes` at `offset` to inline file `ino` (`data`, locked, nothing cached)
    /// made in its inode, in one transaction, when the file still fits there afterwards (as
    /// `ext4_write_inline_data_end`): no block is reserved, so a full file system can still
    /// overwrite a small file. Returns false, having changed nothing, otherwise.
    pub(crate) fn write_inline(
        &self,
        ino: u32,
        data: &mut InodeData,
        offset: u64,
        bytes: &[u8],
    ) -> Result<bool> {
        let end = offset + bytes.len() as u64;
        if !data.inode.has_inline_data()
            || !data.cache.is_empty()
            || self.options.data == crate::filesystem::DataMode::Journal
            || end > u64::from(self.block_size())
        {
            return Ok(false);
        }
        let mut content =
            self.inline_file_bytes(ino, data).map_err(|e| self.check_fs_error(ino, e))?;
        if content.len() < end as usize {
            content.resize(end as usize, 0);
        }
        content[offset as usize..end as usize].copy_from_slice(bytes);
        self.rewrite_inline_file(ino, data, &content)
    }

    /// [`Filesystem::store_inline_file`] for a change of the contents (a write, a truncate):
    /// mtime and ctime move to now with them, and stay as they were when they do not fit.
    fn rewrite_inline_file(&self, ino: u32, data: &mut InodeData, bytes: &[u8]) -> Result<bool> {
        let times = (data.inode.mtime, data.inode.ctime);
        let now = crate::filesystem::now();
        (data.inode.mtime, data.inode.ctime) = (now, now);
        let stored = self.store_inline_file(ino, data, bytes)?;
        if !stored {
            (data.inode.mtime, data.inode.ctime) = times;
        }
        Ok(stored)
    }

    /// Writeback of a small file into its inode, as the kernel writes a small file's data
    /// (`ext4_try_to_write_inline_data`): when the file is inline already, or maps no block
    /// and is empty on disk, its cached contents are one page at most, and they fit `i_block`
    /// and a `system.data` the in-inode area has room for, they go there in one transaction
    /// (journaled with the inode) and the page and its reserved block are let go. Returns
    /// false, having changed nothing, where that does not apply (the pages then go to blocks,
    /// moving an inline file out). Not under data=journal, nor without the feature.
    pub(crate) fn writeback_inline(&self, ino: u32, data: &mut InodeData) -> Result<bool> {
        if !self.has_inline_data()
            || self.options.data == crate::filesystem::DataMode::Journal
            || !data.inode.is_regular()
        {
            return Ok(false);
        }
        let bs = u64::from(self.block_size());
        let size = data.size();
        if size > bs || data.cache.pages.keys().any(|&lblk| lblk != 0) {
            return Ok(false);
        }
        let inline_now = data.inode.has_inline_data();
        if !inline_now && (data.inode.size != 0 || self.maps_any_block(ino, data)?) {
            return Ok(false);
        }
        let mut bytes = match data.cache.pages.get(&0) {
            Some(page) => page.data[..size as usize].to_vec(),
            None if inline_now => self.inline_file_bytes(ino, data)?,
            None => Vec::new(),
        };
        bytes.resize(size as usize, 0);
        if !self.store_inline_file(ino, data, &bytes)? {
            return Ok(false);
        }
        if data.cache.pages.remove(&0).is_some() {
            self.dirty.sub_bytes(bs);
        }
        data.cache.size = None;
        Ok(true)
    }

    /// Writes `bytes` as regular file `ino`'s whole contents into its inode (`data`, which
    /// maps no block), in one transaction. Returns false, changing nothing, when they do not
    /// fit `i_block` and a `system.data` the in-inode area has room for.
    fn store_inline_file(&self, ino: u32, data: &mut InodeData, bytes: &[u8]) -> Result<bool> {
        let (i_block, value) = layout::split_file_bytes(bytes);
        let mut raw = data.raw.clone();
        if !set_inline_value_in(&data.inode, &mut raw, Some(&value))? {
            return Ok(false);
        }
        let mut txn = self.begin(4, 0)?;
        data.raw = raw;
        data.inode.flags = (data.inode.flags & !ext4::EXTENTS_FL) | ext4::INLINE_DATA_FL;
        data.inode.block = i_block;
        data.inode.size = bytes.len() as u64;
        data.fc.ineligible_next("inline data");
        let result = txn_write_inode(self, &mut txn, ino, data, true);
        self.finish(result, txn)?;
        Ok(true)
    }

    /// A truncate of file `ino` (`data`, locked) to `size`, done in its inode when the file
    /// is inline (after its cached writes are written back) and the result still fits, as
    /// `ext4_inline_data_truncate` does: no block needed, so a full file system can still
    /// empty it. Returns whether it was done; otherwise an inline file has moved out and the
    /// caller truncates blocks.
    pub(crate) fn truncate_inline(
        &self,
        ino: u32,
        data: &mut InodeData,
        size: u64,
    ) -> Result<bool> {
        if !self.has_inline_data() || !data.inode.is_regular() {
            return Ok(false);
        }
        if !data.cache.is_empty() {
            self.writeback_locked(ino, data)?;
        }
        if !data.inode.has_inline_data() {
            return Ok(false);
        }
        let mut bytes =
            self.inline_file_bytes(ino, data).map_err(|e| self.check_fs_error(ino, e))?;
        if size <= u64::from(self.block_size()) {
            bytes.resize(size as usize, 0);
            if self.rewrite_inline_file(ino, data, &bytes)? {
                return Ok(true);
            }
        }
        self.uninline_file(ino, data)?;
        Ok(false)
    }

    /// Whether `ino` maps any block (data or map), reading its map.
    fn maps_any_block(&self, ino: u32, data: &InodeData) -> Result<bool> {
        let ectx = crate::adapters::extent_ctx(self, ino, data);
        let io = &mut crate::adapters::ReadIo { fs: self };
        let (runs, map_blocks) = crate::block_map::runs_and_map_blocks(io, &ectx, &data.inode)?;
        Ok(!runs.is_empty() || !map_blocks.is_empty())
    }

    /// Moves inline file `ino` (locked: `data`) into a block before its data changes, in one
    /// transaction (module docs); nothing to do for a file that is not inline. ENOSPC, with
    /// nothing changed, when no block is free. The file's cached pages, if any, do not hold
    /// its inline bytes (`cache_inline_bytes` has not run, or writeback let page 0 go).
    pub(crate) fn uninline_file(&self, ino: u32, data: &mut InodeData) -> Result<()> {
        if !data.inode.has_inline_data() {
            return Ok(());
        }
        let bytes = self.inline_file_bytes(ino, data).map_err(|e| self.check_fs_error(ino, e))?;
        let mut held = if bytes.is_empty() {
            self.groups.no_reservation()
        } else {
            self.groups.reserve(&self.journal, self.groups.geo.meta_blocks(1))?
        };
        let credits = self.write_step_credits(data, 1).credits + 4;
        let mut txn = self.begin_with(credits, self.groups.no_reservation())?;
        // The inode as the disk has it, put back if the move fails part way: memory must not
        // say "not inline" over a record that still is (a later inode write would drop the
        // bytes).
        let before = (data.inode.clone(), data.raw.clone());
        let result = self.move_out(&mut txn, ino, data, &bytes, &mut held);
        if result.is_err() {
            (data.inode, data.raw) = before;
        }
        self.finish(result, txn)
    }

    fn move_out(
        &self,
        txn: &mut Txn<'_>,
        ino: u32,
        data: &mut InodeData,
        bytes: &[u8],
        held: &mut Reservation,
    ) -> Result<()> {
        leave_inode(data, self.has_extents(), Some(txn.handle.tid()))?;
        if bytes.is_empty() {
            return txn_write_inode(self, txn, ino, data, true);
        }
        // One step maps the block, writes the bytes as the transaction's ordered data and
        // writes the inode.
        let mut mapped = false;
        let written = self.write_step(txn, ino, data, 0, bytes, held, &mut mapped)?;
        if written != bytes.len() {
            return Err(FsError::Invalid(format!(
                "moving inline file {ino} out wrote {written} of {} bytes",
                bytes.len()
            )));
        }
        Ok(())
    }

    /// The extent feature: moved-out inodes get an extent tree.
    pub(crate) fn has_extents(&self) -> bool {
        self.params.feature_incompat & ext4::feature::INCOMPAT_EXTENTS != 0
    }

    /// Damage in inode `ino`'s own record (its inline data, its in-inode attributes), named
    /// by the inode-table block that holds it.
    pub(crate) fn at_inode(&self, ino: u32, err: FsError) -> FsError {
        match err {
            FsError::OnDisk(e) => {
                let block = self.inode_table_location(ino).map_or(0, |(block, _)| block);
                FsError::corrupted(block, format!("inode {ino}: {e}"))
            }
            other => other,
        }
    }
}
