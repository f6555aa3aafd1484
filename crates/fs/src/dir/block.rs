//! One directory during one operation ([`Dir`]): reading, checking and writing its blocks,
//! leaf records, `.` and `..`, and finding a name whichever way the directory is organized.

use super::*;

impl<'a> Dir<'a> {
    pub(super) fn new(io: &'a mut dyn DirIo, ctx: &'a DirCtx) -> Result<Self> {
        let block_size = io.block_size();
        if !block_size.is_power_of_two()
            || !(htree::DX_BLOCK_SIZE_MIN..=dirent::DIR_BLOCK_SIZE_MAX).contains(&block_size)
        {
            return Err(FsError::Invalid(format!("directory block size {block_size}")));
        }
        Ok(Dir { io, ctx, block_size, has_csum: ctx.csum_seed.is_some() })
    }

    pub(super) fn open(io: &'a mut dyn DirIo, ctx: &'a DirCtx) -> Result<Self> {
        let mut dir = Dir::new(io, ctx)?;
        if dir.blocks() == 0 {
            return Err(dir.corrupted(0, "the directory has no blocks"));
        }
        if dir.indexed() && !ctx.dir_index {
            return Err(dir.corrupted(0, "indexed directory on a file system without dir_index"));
        }
        Ok(dir)
    }

    pub(super) fn blocks(&self) -> u32 {
        self.io.dir_blocks()
    }

    pub(super) fn indexed(&self) -> bool {
        self.io.indexed()
    }

    pub(super) fn hash_ordered(&self) -> bool {
        self.ctx.dir_index && (self.indexed() || self.blocks() == 1)
    }

    pub(super) fn corrupted(&mut self, lblk: u32, reason: impl std::fmt::Display) -> FsError {
        let block = self.io.physical_block(lblk);
        FsError::corrupted(
            block,
            format!("directory inode {}, block {lblk}: {reason}", self.ctx.ino),
        )
    }

    pub(super) fn on_disk(&mut self, lblk: u32, err: OnDiskError) -> FsError {
        match err {
            OnDiskError::Corrupted { .. } => self.corrupted(lblk, err),
            other => FsError::OnDisk(other),
        }
    }

    pub(super) fn hash(&self, name: &[u8], version: u8) -> Result<(u32, u32)> {
        name_hash(name, version, &self.ctx.hash_seed)
    }

    pub(super) fn read_raw(&mut self, lblk: u32) -> Result<Vec<u8>> {
        let blocks = self.blocks();
        if lblk >= blocks {
            return Err(self.corrupted(lblk, format!("past the directory's {blocks} blocks")));
        }
        let data = self.io.read_dir_block(lblk)?;
        if data.len() != self.block_size {
            return Err(self.corrupted(lblk, format!("read {} bytes", data.len())));
        }
        Ok(data)
    }

    pub(super) fn read_leaf(&mut self, lblk: u32) -> Result<Vec<u8>> {
        let data = self.read_raw(lblk)?;
        if let Some(seed) = self.ctx.csum_seed {
            if !dirent::dir_block_checksum_ok(seed, &data) {
                return Err(self.corrupted(lblk, "leaf checksum mismatch or no checksum tail"));
            }
        }
        if let Err(err) = dirent::parse_dir_block_records(&data, self.has_csum) {
            return Err(self.on_disk(lblk, err));
        }
        Ok(data)
    }

    pub(super) fn leaf_live<'b>(&mut self, lblk: u32, data: &'b [u8]) -> Result<Vec<DirEntry<'b>>> {
        let entries =
            dirent::parse_dir_block(data, self.has_csum).map_err(|err| self.on_disk(lblk, err))?;
        if let Some(bad) = entries.iter().find(|e| is_reserved_ino(e.inode)) {
            let (ino, name) = (bad.inode, String::from_utf8_lossy(bad.name).into_owned());
            return Err(self.corrupted(lblk, format!("entry {name:?} names reserved inode {ino}")));
        }
        Ok(entries)
    }

    pub(super) fn linear_entries<'b>(
        &mut self,
        lblk: u32,
        data: &'b [u8],
    ) -> Result<Vec<DirEntry<'b>>> {
        let mut entries = self.leaf_live(lblk, data)?;
        if lblk == 0 {
            let (dot, dotdot) = dirent::parse_dots(data).map_err(|err| self.on_disk(0, err))?;
            entries.retain(|e| e.offset != dot.offset && e.offset != dotdot.offset);
        }
        Ok(entries)
    }

    pub(super) fn write_leaf(&mut self, lblk: u32, mut data: Vec<u8>) -> Result<()> {
        if let Some(seed) = self.ctx.csum_seed {
            dirent::set_dir_block_checksum(seed, &mut data);
        }
        self.io.write_dir_block(lblk, &data)
    }

    pub(super) fn append(&mut self) -> Result<u32> {
        let before = self.blocks();
        if before >= htree::DX_BLOCK_MASK {
            // Index entries cannot name more blocks; ext4 caps directories far below this.
            return Err(FsError::NoSpace);
        }
        let lblk = self.io.append_dir_block()?;
        assert_eq!(lblk, before, "DirIo::append_dir_block must add the next block");
        Ok(lblk)
    }

    pub(super) fn dots(&mut self) -> Result<((u32, u8), (u32, u8))> {
        let dots = if self.indexed() {
            let (root, _) = self.read_root()?;
            ((root.dot_inode, root.dot_file_type), (root.dotdot_inode, root.dotdot_file_type))
        } else {
            let data = self.read_leaf(0)?;
            let (dot, dotdot) = dirent::parse_dots(&data).map_err(|err| self.on_disk(0, err))?;
            ((dot.inode, dot.file_type), (dotdot.inode, dotdot.file_type))
        };
        for (name, (ino, _)) in [(".", dots.0), ("..", dots.1)] {
            if is_reserved_ino(ino) {
                return Err(self.corrupted(0, format!("{name:?} names reserved inode {ino}")));
            }
        }
        Ok(dots)
    }

    pub(super) fn find(&mut self, name: &[u8]) -> Result<Option<Found>> {
        if self.indexed() {
            self.dx_find(name)
        } else {
            self.linear_find(name)
        }
    }

    pub(super) fn tail_size(&self) -> usize {
        if self.has_csum {
            dirent::DIR_TAIL_SIZE
        } else {
            0
        }
    }

    pub(super) fn pack_leaf(&self, recs: &[LeafRec]) -> Vec<u8> {
        let entries: Vec<(&[u8], u32, u8)> =
            recs.iter().map(|r| (&r.name[..], r.ino, r.file_type)).collect();
        let mut data = vec![0u8; self.block_size];
        let packed = dirent::pack_dir_block(&mut data, self.has_csum, &entries);
        assert!(packed, "entries that shared one leaf fit in an empty one");
        data
    }
}
