//! Adapters that let the structure modules work on a live inode: [`ReadIo`] (a [`MetaIo`]
//! for lookups outside any transaction) and [`DirAccess`] (a [`DirIo`] over a directory
//! inode's extent tree).

use crate::block_map;
use crate::dir::{DirCtx, DirIo};
use crate::error::{FsError, Result};
use crate::extent_tree::{ExtentCtx, Lookup};
use crate::filesystem::Filesystem;
use crate::groups::Groups;
use crate::inline::InlineDir;
use crate::inodes::InodeData;
use crate::meta_io::MetaIo;
use ondisk::ext4;

/// Metadata reads through the journal's buffer cache, for operations that change nothing.
pub(crate) struct ReadIo<'a> {
    pub fs: &'a Filesystem,
}

impl MetaIo for ReadIo<'_> {
    fn block_size(&self) -> usize {
        self.fs.block_size() as usize
    }

    fn cluster_blocks(&self) -> u32 {
        self.fs.groups.geo.cluster_blocks()
    }

    fn blocks_count(&self) -> u64 {
        self.fs.params.blocks_count
    }

    fn read_meta(&mut self, block: u64) -> Result<Vec<u8>> {
        let blocks_count = self.fs.params.blocks_count;
        if block == 0 || block >= blocks_count {
            return Err(FsError::BlockOutOfRange { block, blocks_count });
        }
        let buffer = self.fs.journal.read_buffer(block);
        Ok(buffer.map_err(|e| self.fs.check_fs_error(0, e.into()))?.to_vec())
    }

    fn write_meta(&mut self, block: u64, _: &[u8]) -> Result<()> {
        Err(read_only_misuse(block))
    }

    fn alloc_meta_block(&mut self, _: u64) -> Result<u64> {
        Err(read_only_misuse(0))
    }

    fn free_meta_block(&mut self, block: u64) -> Result<()> {
        Err(read_only_misuse(block))
    }

    fn free_data_blocks(&mut self, start: u64, _: u64) -> Result<()> {
        Err(read_only_misuse(start))
    }

    fn system_zone_overlap(&self, start: u64, len: u64) -> Option<u64> {
        self.fs.groups.system_zone_overlap(start, len)
    }
}

/// What a [`MetaIo`] that only reads answers a call that would change something: a logic
/// error, never an on-disk problem.
pub(crate) fn read_only_misuse(block: u64) -> FsError {
    FsError::Invalid(format!("a read-only operation tried to change block {block}"))
}

/// The extent context of an inode: its checksum seed and an allocation goal in its group.
pub(crate) fn extent_ctx(fs: &Filesystem, ino: u32, data: &InodeData) -> ExtentCtx {
    let geo = &fs.groups.geo;
    let group = geo.group_of_inode(ino);
    ExtentCtx {
        ino,
        inode_block: fs.inode_table_location(ino).map_or(0, |(block, _)| block),
        csum_seed: fs.inode_csum_seed(ino, data.inode.generation),
        goal: geo.group_first_block(group),
    }
}

/// The directory context of directory `ino`.
pub(crate) fn dir_ctx(fs: &Filesystem, ino: u32, data: &InodeData) -> DirCtx {
    let sb = &fs.params;
    DirCtx {
        ino,
        csum_seed: fs.inode_csum_seed(ino, data.inode.generation),
        dir_index: sb.feature_compat & ext4::feature::COMPAT_DIR_INDEX != 0,
        largedir: sb.feature_incompat & ext4::feature::INCOMPAT_LARGEDIR != 0,
        hash_version: sb.effective_hash_version(),
        hash_seed: sb.hash_seed,
    }
}

/// A directory inode's blocks as the directory module sees them. Appending a block allocates
/// it, maps it in the extent tree, and grows `i_size`; the caller writes the inode afterwards.
/// An inline directory is one block (`inline.rs`) until a change does not fit the inode.
pub(crate) struct DirAccess<'a, M: MetaIo> {
    pub io: &'a mut M,
    pub data: &'a mut InodeData,
    pub ectx: ExtentCtx,
    pub block_size: u32,
    /// For the system-zone check of mapped directory blocks.
    pub groups: &'a Groups,
    /// The directory while it is inline.
    pub inline: Option<InlineDir>,
    /// A directory moved out of its inode gets an extent tree (the extent feature).
    pub extents: bool,
}

impl<M: MetaIo> DirAccess<'_, M> {
    /// Moves the inline directory into a new block holding `block` (its first), in the
    /// caller's transaction: the block is journaled and mapped, the inline data dropped.
    fn move_out(&mut self, block: &[u8]) -> Result<()> {
        let pblk =
            crate::clusters::alloc_block(self.io, &self.ectx, &self.data.inode, 0, self.ectx.goal)?;
        let tid = self.io.fast_commit_tid();
        crate::inline::leave_inode(self.data, self.extents, tid)?;
        let ectx = ExtentCtx { goal: pblk, ..self.ectx };
        block_map::insert(self.io, &ectx, &mut self.data.inode, 0, pblk, 1, false)?;
        self.data.inode.size = u64::from(self.block_size);
        self.io.write_meta(pblk, block)?;
        self.inline = None;
        Ok(())
    }

    fn map(&mut self, lblk: u32) -> Result<u64> {
        match block_map::lookup(self.io, &self.ectx, &self.data.inode, lblk)? {
            // A directory block mapped onto file-system metadata (ext4_inode_block_valid):
            // reading it would misparse the metadata, writing it would destroy it.
            Lookup::Mapped { pblk, .. } if self.groups.system_zone_overlap(pblk, 1).is_some() => {
                Err(FsError::corrupted(
                    self.ectx.inode_block,
                    format!(
                        "directory inode {}: block {lblk} is mapped onto metadata block {pblk}",
                        self.ectx.ino
                    ),
                ))
            }
            Lookup::Mapped { pblk, .. } => Ok(pblk),
            Lookup::Hole { .. } => Err(FsError::corrupted(
                0,
                format!("directory block {lblk} is not mapped (a hole inside a directory)"),
            )),
        }
    }
}

impl<M: MetaIo> DirIo for DirAccess<'_, M> {
    fn block_size(&self) -> usize {
        self.block_size as usize
    }

    fn dir_blocks(&self) -> u32 {
        if self.inline.is_some() {
            return 1;
        }
        (self.data.inode.size / u64::from(self.block_size)).min(u64::from(u32::MAX)) as u32
    }

    fn read_dir_block(&mut self, lblk: u32) -> Result<Vec<u8>> {
        if let Some(inline) = &self.inline {
            if lblk == 0 {
                return Ok(inline.block.clone());
            }
        }
        let pblk = self.map(lblk)?;
        self.io.read_meta(pblk)
    }

    fn write_dir_block(&mut self, lblk: u32, data: &[u8]) -> Result<()> {
        if let Some(inline) = &mut self.inline {
            // Only a leaf is written while the directory is inline: the conversion to an
            // htree appends a block (moving the directory out) before it writes a root.
            debug_assert!(lblk == 0 && self.data.inode.flags & ext4::INDEX_FL == 0);
            if inline.store(self.data, data)? {
                return Ok(());
            }
            return self.move_out(data);
        }
        let pblk = self.map(lblk)?;
        if let Some(tid) = self.io.fast_commit_tid() {
            // The block as the transaction found it, for the CREAT records of names put in
            // it (`FcTrack::admit_create`): what a replay finds there.
            if !self.data.fc.leaf_room_known(tid, lblk) {
                let before = self.io.read_meta(pblk)?;
                let room = crate::dir::largest_room(&before, self.ectx.csum_seed.is_some());
                self.data.fc.note_leaf_room(tid, lblk, room);
            }
        }
        self.io.write_meta(pblk, data)
    }

    fn append_dir_block(&mut self) -> Result<u32> {
        if let Some(inline) = self.inline.take() {
            self.move_out(&inline.block)?;
        }
        let lblk = self.dir_blocks();
        let goal = match lblk.checked_sub(1) {
            Some(last) => self.map(last)? + 1,
            None => self.ectx.goal,
        };
        let pblk = crate::clusters::alloc_block(self.io, &self.ectx, &self.data.inode, lblk, goal)?;
        let ectx = ExtentCtx { goal: pblk, ..self.ectx };
        block_map::insert(self.io, &ectx, &mut self.data.inode, lblk, pblk, 1, false)?;
        self.data.inode.size += u64::from(self.block_size);
        Ok(lblk)
    }

    fn physical_block(&mut self, lblk: u32) -> u64 {
        if self.inline.is_some() {
            // The directory's bytes are in its inode's record.
            return self.ectx.inode_block;
        }
        self.map(lblk).unwrap_or(0)
    }

    fn indexed(&self) -> bool {
        self.data.inode.flags & ext4::INDEX_FL != 0
    }

    fn set_indexed(&mut self, on: bool) {
        if on {
            self.data.inode.flags |= ext4::INDEX_FL;
        } else {
            self.data.inode.flags &= !ext4::INDEX_FL;
        }
    }

    fn order_late(&mut self, lblk: u32) {
        if self.inline.is_some() {
            return;
        }
        if let Ok(pblk) = self.map(lblk) {
            self.io.order_late(pblk);
        }
    }
}

impl Filesystem {
    /// [`Filesystem::with_dir`] outside any transaction (lookups, readdir, readlink): damage
    /// found in a directory (or slow symlink) block is a file-system error (ext4_error). In a
    /// transaction, `finish` reports it.
    pub(crate) fn with_dir_read<R>(
        &self,
        ino: u32,
        data: &mut InodeData,
        op: impl FnOnce(&mut dyn DirIo, &DirCtx) -> Result<R>,
    ) -> Result<R> {
        self.with_dir(&mut ReadIo { fs: self }, ino, data, op)
            .map_err(|e| self.check_fs_error(ino, e))
    }

    /// Runs a directory-module operation on directory `ino` (locked by the caller; `data` is
    /// its record) over `io`: a transaction, or [`ReadIo`] for lookups.
    pub(crate) fn with_dir<M: MetaIo, R>(
        &self,
        io: &mut M,
        ino: u32,
        data: &mut InodeData,
        op: impl FnOnce(&mut dyn DirIo, &DirCtx) -> Result<R>,
    ) -> Result<R> {
        let ctx = dir_ctx(self, ino, data);
        let ectx = extent_ctx(self, ino, data);
        let inline = if data.inode.has_inline_data() && data.inode.is_dir() {
            let block = crate::inline::inline_dir_block(
                ino,
                data,
                self.block_size() as usize,
                ctx.csum_seed,
            )
            .map_err(|e| self.at_inode(ino, e))?;
            Some(InlineDir { block, has_tail: ctx.csum_seed.is_some() })
        } else {
            None
        };
        let mut access = DirAccess {
            io,
            data,
            ectx,
            block_size: self.block_size(),
            groups: &self.groups,
            inline,
            extents: self.has_extents(),
        };
        op(&mut access, &ctx)
    }
}
