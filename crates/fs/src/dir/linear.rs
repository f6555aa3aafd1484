//! Linear directories: first-fit insertion over the blocks, the linear scan, readdir by
//! block offset, and the conversion of a full one-block directory to an htree
//! (`make_indexed_dir`).

use super::*;

impl<'a> Dir<'a> {
    pub(super) fn linear_find(&mut self, name: &[u8]) -> Result<Option<Found>> {
        for lblk in 0..self.blocks() {
            let data = self.read_leaf(lblk)?;
            let hit = self
                .linear_entries(lblk, &data)?
                .iter()
                .find(|e| e.name == name)
                .map(|e| (e.inode, e.file_type));
            if let Some((ino, file_type)) = hit {
                return Ok(Some(Found { lblk, data, ino, file_type }));
            }
        }
        Ok(None)
    }

    pub(super) fn linear_add(&mut self, name: &[u8], ino: u32, file_type: u8) -> Result<Added> {
        let blocks = self.blocks();
        for lblk in 0..blocks {
            let mut data = self.read_leaf(lblk)?;
            let inserted = dirent::insert_dir_entry(&mut data, self.has_csum, name, ino, file_type)
                .map_err(|err| self.on_disk(lblk, err))?;
            if inserted {
                self.write_leaf(lblk, data)?;
                return Ok(Added { lblk, in_place: true });
            }
            if blocks == 1 && self.ctx.dir_index {
                if let Some(lblk) = self.make_indexed(&data, name, ino, file_type)? {
                    return Ok(Added { lblk, in_place: false });
                }
            }
        }
        let lblk = self.append()?;
        let mut data = vec![0u8; self.block_size];
        dirent::init_empty_dir_block(&mut data, self.has_csum);
        let inserted = dirent::insert_dir_entry(&mut data, self.has_csum, name, ino, file_type)
            .map_err(|err| self.on_disk(lblk, err))?;
        assert!(inserted, "an empty block holds any name");
        self.write_leaf(lblk, data)?;
        Ok(Added { lblk, in_place: false })
    }

    pub(super) fn make_indexed(
        &mut self,
        block0: &[u8],
        name: &[u8],
        ino: u32,
        file_type: u8,
    ) -> Result<Option<u32>> {
        let version = disk_version(self.ctx.hash_version)?;
        let records = dirent::parse_dir_block_records(block0, self.has_csum)
            .map_err(|err| self.on_disk(0, err))?;
        let (dot, dotdot) = dirent::parse_dots(block0).map_err(|err| self.on_disk(0, err))?;
        if dot.rec_len != dirent::dir_rec_len(1) {
            return Ok(None);
        }
        // The kernel slides the records after ".." to the start of the new leaf and stretches
        // the last one to its end; the split balances those record lengths.
        let moved_from = dotdot.offset + dotdot.rec_len;
        let mut recs = Vec::new();
        for record in records.iter().filter(|r| r.offset >= moved_from && r.is_live()) {
            let (hash, _) = self.hash(record.name, self.ctx.hash_version)?;
            let mut size = record.rec_len;
            if record.offset + record.rec_len == block0.len() - self.tail_size() {
                size += moved_from;
            }
            recs.push(LeafRec {
                name: record.name.to_vec(),
                ino: record.inode,
                file_type: record.file_type,
                hash,
                size,
            });
        }
        let mut root = DxRoot {
            dot_inode: dot.inode,
            dot_file_type: dot.file_type,
            dotdot_inode: dotdot.inode,
            dotdot_file_type: dotdot.file_type,
            hash_version: version,
            indirect_levels: 0,
            entries: Vec::new(),
        };
        let first = self.append()?;
        self.io.order_late(0);
        if recs.len() < 2 {
            // Nothing to split between (the room was fragmented): one compact leaf, then the
            // ordinary indexed insertion.
            let leaf = self.pack_leaf(&recs);
            self.write_leaf(first, leaf)?;
            root.entries = vec![DxEntry { hash: 0, block: first }];
            self.write_root(&root)?;
            self.io.set_indexed(true);
            return Ok(Some(self.dx_add(name, ino, file_type)?.lblk));
        }
        let second = self.append()?;
        let (hash, _) = self.hash(name, self.ctx.hash_version)?;
        let (left, right, split_hash) = self.split_recs(recs);
        let mut left_block = self.pack_leaf(&left);
        let mut right_block = self.pack_leaf(&right);
        let (target, target_lblk) = if hash >= split_hash & !DX_HASH_CONTINUED {
            (&mut right_block, second)
        } else {
            (&mut left_block, first)
        };
        let inserted = dirent::insert_dir_entry(target, self.has_csum, name, ino, file_type)
            .map_err(|err| self.on_disk(target_lblk, err))?;
        self.write_leaf(first, left_block)?;
        self.write_leaf(second, right_block)?;
        root.entries =
            vec![DxEntry { hash: 0, block: first }, DxEntry { hash: split_hash, block: second }];
        self.write_root(&root)?;
        self.io.set_indexed(true);
        if !inserted {
            return Ok(Some(self.dx_add(name, ino, file_type)?.lblk));
        }
        Ok(Some(target_lblk))
    }

    pub(super) fn read_linear(&mut self, start: u64, want: usize) -> Result<Vec<DirEntryInfo>> {
        let block_size = self.block_size as u64;
        let mut out = Vec::new();
        let Ok(mut lblk) = u32::try_from(start / block_size) else {
            return Ok(out);
        };
        while lblk < self.blocks() && out.len() < want {
            let data = self.read_leaf(lblk)?;
            for entry in self.linear_entries(lblk, &data)? {
                let position = u64::from(lblk) * block_size + entry.offset as u64;
                if position >= start && out.len() < want {
                    out.push(DirEntryInfo {
                        name: entry.name.to_vec(),
                        ino: entry.inode,
                        file_type: entry.file_type,
                        next_cookie: position + 1 + COOKIE_POSITION_BASE,
                    });
                }
            }
            lblk += 1;
        }
        Ok(out)
    }
}
