//! Hashed-index (htree) directories: the root and index nodes, descending to a leaf, and
//! insertion with leaf and node splits and root growth (`ext4_dx_add_entry`).

use super::*;

impl<'a> Dir<'a> {
    pub(super) fn write_root(&mut self, root: &DxRoot) -> Result<()> {
        let mut data = vec![0u8; self.block_size];
        htree::encode_dx_root(&mut data, root, self.has_csum);
        if let Some(seed) = self.ctx.csum_seed {
            htree::set_dx_checksum(seed, &mut data);
        }
        self.io.write_dir_block(0, &data)
    }

    pub(super) fn write_node(&mut self, lblk: u32, entries: &[DxEntry]) -> Result<()> {
        let mut data = vec![0u8; self.block_size];
        htree::encode_dx_node(&mut data, entries, self.has_csum);
        if let Some(seed) = self.ctx.csum_seed {
            htree::set_dx_checksum(seed, &mut data);
        }
        self.io.write_dir_block(lblk, &data)
    }

    pub(super) fn write_frame(&mut self, path: &mut Path, level: usize) -> Result<()> {
        if level == 0 {
            path.root.entries = path.frames[0].entries.clone();
            self.write_root(&path.root)
        } else {
            self.write_node(path.frames[level].lblk, &path.frames[level].entries)
        }
    }

    pub(super) fn read_root(&mut self) -> Result<(DxRoot, u8)> {
        let data = self.read_raw(0)?;
        if let Some(seed) = self.ctx.csum_seed {
            if !htree::dx_checksum_ok(seed, &data) {
                return Err(self.corrupted(0, "index root checksum mismatch"));
            }
        }
        let root =
            htree::parse_dx_root(&data, self.has_csum).map_err(|err| self.on_disk(0, err))?;
        if root.indirect_levels > self.levels_max() {
            // As dx_probe: deeper than the feature allows is damage ("htree depth exceeds").
            let reason = format!("{} indirect index levels without largedir", root.indirect_levels);
            return Err(self.corrupted(0, reason));
        }
        self.check_index_entries(0, &root.entries, &[])?;
        let version = effective_version(root.hash_version, self.ctx.hash_version);
        Ok((root, version))
    }

    /// Index levels below the root the directory may have: 1, or 2 with largedir.
    pub(super) fn levels_max(&self) -> u8 {
        if self.ctx.largedir {
            htree::DX_INDIRECT_LEVELS_MAX_LARGEDIR
        } else {
            htree::DX_INDIRECT_LEVELS_MAX
        }
    }

    /// Index node `lblk`, below the index blocks of `above` (the root's frame first): none of
    /// its entries may name one of those blocks' children (an index node at a shallower level).
    pub(super) fn read_node(&mut self, lblk: u32, above: &[Frame]) -> Result<Vec<DxEntry>> {
        let data = self.read_raw(lblk)?;
        if let Some(seed) = self.ctx.csum_seed {
            if !htree::dx_checksum_ok(seed, &data) {
                return Err(self.corrupted(lblk, "index node checksum mismatch"));
            }
        }
        let entries =
            htree::parse_dx_node(&data, self.has_csum).map_err(|err| self.on_disk(lblk, err))?;
        let index_nodes: Vec<DxEntry> =
            above.iter().flat_map(|frame| frame.entries.iter().copied()).collect();
        self.check_index_entries(lblk, &entries, &index_nodes)?;
        Ok(entries)
    }

    pub(super) fn check_index_entries(
        &mut self,
        lblk: u32,
        entries: &[DxEntry],
        index_nodes: &[DxEntry],
    ) -> Result<()> {
        let blocks = self.blocks();
        for entry in entries {
            if entry.block >= blocks {
                let reason = format!("index entry names block {} of {blocks}", entry.block);
                return Err(self.corrupted(lblk, reason));
            }
            if index_nodes.iter().any(|node| node.block == entry.block) {
                let reason = format!("leaf block {} is also an index node", entry.block);
                return Err(self.corrupted(lblk, reason));
            }
        }
        Ok(())
    }

    pub(super) fn descend(&mut self, root: DxRoot, version: u8, hash: Option<u32>) -> Result<Path> {
        let search = |entries: &[DxEntry]| match hash {
            // The last entry whose hash is <= hash; entry 0 has none and covers the rest.
            Some(hash) => entries[1..].partition_point(|e| e.hash <= hash),
            None => 0,
        };
        let at = search(&root.entries);
        let mut frames = vec![Frame { lblk: 0, entries: root.entries.clone(), at }];
        for _ in 0..root.indirect_levels {
            let parent = frames.last().expect("the root's frame");
            let lblk = parent.entries[parent.at].block;
            let entries = self.read_node(lblk, &frames)?;
            let at = search(&entries);
            frames.push(Frame { lblk, entries, at });
        }
        Ok(Path { root, version, frames })
    }

    pub(super) fn next_leaf(
        &mut self,
        path: &mut Path,
        same_hash: Option<u32>,
    ) -> Result<Option<u32>> {
        let mut level = path.frames.len() - 1;
        loop {
            let frame = &mut path.frames[level];
            frame.at += 1;
            if frame.at < frame.entries.len() {
                break;
            }
            if level == 0 {
                return Ok(None);
            }
            level -= 1;
        }
        let start = path.frames[level].entries[path.frames[level].at].hash;
        if same_hash.is_some_and(|hash| start & !DX_HASH_CONTINUED != hash) {
            return Ok(None);
        }
        for below in level + 1..path.frames.len() {
            let parent = &path.frames[below - 1];
            let lblk = parent.entries[parent.at].block;
            let entries = self.read_node(lblk, &path.frames[..below])?;
            path.frames[below] = Frame { lblk, entries, at: 0 };
        }
        Ok(Some(start))
    }

    pub(super) fn dx_find(&mut self, name: &[u8]) -> Result<Option<Found>> {
        let (root, version) = self.read_root()?;
        let (hash, _) = self.hash(name, version)?;
        let mut path = self.descend(root, version, Some(hash))?;
        loop {
            let lblk = path.leaf();
            let data = self.read_leaf(lblk)?;
            let hit = self
                .leaf_live(lblk, &data)?
                .iter()
                .find(|e| e.name == name)
                .map(|e| (e.inode, e.file_type));
            if let Some((ino, file_type)) = hit {
                return Ok(Some(Found { lblk, data, ino, file_type }));
            }
            if self.next_leaf(&mut path, Some(hash))?.is_none() {
                return Ok(None);
            }
        }
    }

    pub(super) fn dx_add(&mut self, name: &[u8], ino: u32, file_type: u8) -> Result<Added> {
        for attempt in 0..ADD_RESTARTS_MAX {
            let (root, version) = self.read_root()?;
            let (hash, _) = self.hash(name, version)?;
            let mut path = self.descend(root, version, Some(hash))?;
            let leaf = path.leaf();
            let mut data = self.read_leaf(leaf)?;
            let inserted = dirent::insert_dir_entry(&mut data, self.has_csum, name, ino, file_type)
                .map_err(|err| self.on_disk(leaf, err))?;
            if inserted {
                self.write_leaf(leaf, data)?;
                return Ok(Added { lblk: leaf, in_place: attempt == 0 });
            }
            let bottom = path.frames.len() - 1;
            if path.frames[bottom].entries.len() >= self.index_limit(bottom) {
                // The deepest index block on the path with room takes the split of the full
                // one below it; when every one is full the root grows a level, unless the
                // index is as deep as it may be: ext4's "directory index full".
                let room = (0..bottom)
                    .rev()
                    .find(|&level| path.frames[level].entries.len() < self.index_limit(level));
                match room {
                    Some(parent) => self.dx_split_node(path, parent + 1)?,
                    None if path.root.indirect_levels < self.levels_max() => {
                        self.dx_grow_root(path)?
                    }
                    None => return Err(FsError::NoSpace),
                }
                continue;
            }
            if let Some(lblk) = self.dx_split_leaf(&mut path, &data, hash, name, ino, file_type)? {
                return Ok(Added { lblk, in_place: false });
            }
        }
        Err(FsError::NoSpace)
    }

    /// Whether [`Dir::dx_add`] can place `name`: its leaf has room, or some index block on
    /// the way to it does (the full ones below it split), or the root can grow a level.
    pub(super) fn dx_room(&mut self, name: &[u8]) -> Result<bool> {
        let (root, version) = self.read_root()?;
        if root.indirect_levels < self.levels_max() {
            // The root can always grow a level: nothing more to read.
            return Ok(true);
        }
        let (hash, _) = self.hash(name, version)?;
        let path = self.descend(root, version, Some(hash))?;
        let leaf = path.leaf();
        let mut data = self.read_leaf(leaf)?;
        let fits = dirent::insert_dir_entry(&mut data, self.has_csum, name, 1, 0)
            .map_err(|err| self.on_disk(leaf, err))?;
        let room = |level: usize| path.frames[level].entries.len() < self.index_limit(level);
        Ok(fits
            || (0..path.frames.len()).any(room)
            || path.root.indirect_levels < self.levels_max())
    }

    pub(super) fn index_limit(&self, level: usize) -> usize {
        if level == 0 {
            htree::dx_root_limit(self.block_size, self.has_csum)
        } else {
            htree::dx_node_limit(self.block_size, self.has_csum)
        }
    }

    /// Moves the full root's entries into a new node and points the root at it alone: the
    /// index gets one level deeper.
    pub(super) fn dx_grow_root(&mut self, path: Path) -> Result<()> {
        let node = self.append()?;
        self.io.order_late(0);
        let mut root = path.root;
        root.entries = path.frames[0].entries.clone();
        self.write_node(node, &root.entries)?;
        root.entries = vec![DxEntry { hash: 0, block: node }];
        root.indirect_levels += 1;
        self.write_root(&root)
    }

    /// Moves the upper half of the full node at `level` of the path into a new node, indexed
    /// from the node above it (which has room).
    pub(super) fn dx_split_node(&mut self, mut path: Path, level: usize) -> Result<()> {
        assert!(level >= 1, "the root is grown, not split");
        let new_node = self.append()?;
        let node = &mut path.frames[level];
        let keep = node.entries.len() / 2;
        let moved = node.entries.split_off(keep);
        let split_hash = moved[0].hash;
        let node_lblk = node.lblk;
        let kept = node.entries.clone();
        self.io.order_late(node_lblk);
        self.write_node(new_node, &moved)?;
        self.write_node(node_lblk, &kept)?;
        let parent = &mut path.frames[level - 1];
        parent.entries.insert(parent.at + 1, DxEntry { hash: split_hash, block: new_node });
        self.write_frame(&mut path, level - 1)
    }

    pub(super) fn dx_split_leaf(
        &mut self,
        path: &mut Path,
        data: &[u8],
        hash: u32,
        name: &[u8],
        ino: u32,
        file_type: u8,
    ) -> Result<Option<u32>> {
        let leaf = path.leaf();
        let mut recs = Vec::new();
        for record in self.leaf_live(leaf, data)? {
            let (record_hash, _) = self.hash(record.name, path.version)?;
            recs.push(LeafRec {
                name: record.name.to_vec(),
                ino: record.inode,
                file_type: record.file_type,
                hash: record_hash,
                size: record.rec_len,
            });
        }
        if recs.len() < 2 {
            // Nothing to split between: the room is fragmented by unused records. Compacting
            // keeps every hash in place.
            let mut packed = self.pack_leaf(&recs);
            let inserted =
                dirent::insert_dir_entry(&mut packed, self.has_csum, name, ino, file_type)
                    .map_err(|err| self.on_disk(leaf, err))?;
            self.write_leaf(leaf, packed)?;
            return Ok(inserted.then_some(leaf));
        }
        let bottom = path.frames.len() - 1;
        assert!(
            path.frames[bottom].entries.len() < self.index_limit(bottom),
            "no room to index a split"
        );
        let (left, right, split_hash) = self.split_recs(recs);
        let new_leaf = self.append()?;
        self.io.order_late(leaf);
        let mut left_block = self.pack_leaf(&left);
        let mut right_block = self.pack_leaf(&right);
        let (target, target_lblk) = if hash >= split_hash & !DX_HASH_CONTINUED {
            (&mut right_block, new_leaf)
        } else {
            (&mut left_block, leaf)
        };
        let inserted = dirent::insert_dir_entry(target, self.has_csum, name, ino, file_type)
            .map_err(|err| self.on_disk(target_lblk, err))?;
        self.write_leaf(leaf, left_block)?;
        self.write_leaf(new_leaf, right_block)?;
        let frame = &mut path.frames[bottom];
        frame.entries.insert(frame.at + 1, DxEntry { hash: split_hash, block: new_leaf });
        self.write_frame(path, bottom)?;
        Ok(inserted.then_some(target_lblk))
    }

    pub(super) fn split_recs(&self, recs: Vec<LeafRec>) -> (Vec<LeafRec>, Vec<LeafRec>, u32) {
        let count = recs.len();
        assert!(count >= 2, "splitting {count} entries");
        let mut order: Vec<usize> = (0..count).collect();
        order.sort_by_key(|&i| recs[i].hash);
        let half = self.block_size / 2;
        let (mut size, mut moved, mut stopped) = (0, 0, false);
        for &i in order.iter().rev() {
            if size + recs[i].size / 2 > half {
                stopped = true;
                break;
            }
            size += recs[i].size;
            moved += 1;
        }
        let split = if stopped { count - moved } else { count / 2 }.clamp(1, count - 1);
        let split_hash = recs[order[split]].hash;
        let continued = u32::from(split_hash == recs[order[split - 1]].hash);
        let mut slots: Vec<Option<LeafRec>> = recs.into_iter().map(Some).collect();
        let upper: Vec<LeafRec> = order[split..].iter().filter_map(|&i| slots[i].take()).collect();
        let lower: Vec<LeafRec> = slots.into_iter().flatten().collect();
        assert_eq!(lower.len() + upper.len(), count);
        (lower, upper, split_hash | (continued * DX_HASH_CONTINUED))
    }
}
