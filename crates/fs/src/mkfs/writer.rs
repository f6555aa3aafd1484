//! The planned image as writes: inodes, directory blocks, the resize inode, the journal,
//! the orphan file, group metadata and superblocks, issued in order with the primary
//! superblock last.

use super::*;
use ondisk::ext4::inline;

/// Writes queued by offset, coalesced and issued in order; zero ranges are streamed.
#[derive(Default)]
pub(super) struct WriteQueue {
    pub(super) writes: BTreeMap<u64, Vec<u8>>,
    pub(super) zero_ranges: Vec<(u64, u64)>,
}

impl WriteQueue {
    pub(super) fn put(&mut self, offset: u64, data: Vec<u8>) {
        debug_assert!(
            self.writes
                .range(..offset + data.len() as u64)
                .next_back()
                .is_none_or(|(&o, d)| { o + d.len() as u64 <= offset || o == offset }),
            "overlapping metadata writes at byte {offset}"
        );
        let previous = self.writes.insert(offset, data);
        assert!(previous.is_none(), "metadata written twice at byte {offset}");
    }

    pub(super) fn zero(&mut self, offset: u64, len: u64) {
        if len > 0 {
            self.zero_ranges.push((offset, len));
        }
    }

    pub(super) fn bytes(&self) -> u64 {
        self.writes.values().map(|d| d.len() as u64).sum::<u64>()
            + self.zero_ranges.iter().map(|z| z.1).sum::<u64>()
    }
}

/// The planned image: every block to write, and the superblock.
pub(super) struct ImageWriter {
    pub(super) queue: WriteQueue,
    pub(super) sb: Superblock,
    pub(super) block_size: u32,
    pub(super) journal: Option<(JournalLocation, journal::superblock::FormatOptions)>,
    /// Groups whose first block gets a backup superblock, written once `s_kbytes_written` is
    /// final.
    pub(super) backup_groups: Vec<u32>,
    pub(super) first_data_block: u64,
    pub(super) blocks_per_group: u32,
    pub(super) report: MkfsReport,
}

impl ImageWriter {
    pub(super) fn build(
        opts: &MkfsOptions,
        planner: &Planner,
        files: &Files,
    ) -> Result<ImageWriter> {
        let g = &planner.g;
        let now = opts.now.unwrap_or_else(|| {
            SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
        });
        let uuid = opts.uuid.unwrap_or_else(random_uuid);
        let hash_seed = opts.hash_seed.unwrap_or_else(random_uuid);
        let layout = Layout::compute(planner, opts.device_zeroed);
        let mut features = g.features;
        let resize_size = resize_inode_size(g);
        if resize_size >> 32 != 0 && g.features.compat(feature::COMPAT_RESIZE_INODE) {
            features.ro_compat |= feature::RO_COMPAT_LARGE_FILE;
        }
        let journal_root = files.journal.inode_root();
        let raw = SuperblockFields {
            g,
            features,
            layout: &layout,
            uuid,
            hash_seed,
            label: &opts.label,
            now,
            overhead: files.overhead,
            journal_root: (g.journal_blocks > 0)
                .then(|| (journal_root, u64::from(g.journal_blocks) * u64::from(g.block_size))),
            orphan_ino: files.orphan.as_ref().map_or(0, |o| o.0),
            mmp_block: files.mmp_block,
            quota_inums: files.quota_inums(),
        }
        .encode();
        let sb = Superblock::parse(&raw)?;
        let mut writer = ImageWriter {
            queue: WriteQueue::default(),
            sb,
            block_size: g.block_size,
            journal: None,
            backup_groups: Vec::new(),
            first_data_block: g.first_data_block,
            blocks_per_group: g.blocks_per_group,
            report: MkfsReport {
                block_size: g.block_size,
                cluster_blocks: g.cluster_blocks() as u32,
                blocks_count: g.blocks_count,
                inodes_count: g.inodes_per_group * g.groups,
                groups: g.groups,
                blocks_per_group: g.blocks_per_group,
                inodes_per_group: g.inodes_per_group,
                reserved_gdt_blocks: g.reserved_gdt_blocks,
                reserved_blocks: g.reserved_blocks,
                free_blocks: layout.free_blocks,
                free_inodes: layout.free_inodes,
                journal_blocks: g.journal_blocks,
                fast_commit_blocks: g.fast_commit_blocks,
                backup_superblocks: backup_groups(g).iter().map(|&b| g.group_first(b)).collect(),
                uuid,
                features,
                bytes_written: 0,
            },
        };
        writer.plan_zeroing(planner, files, opts.device_zeroed);
        writer.plan_group_metadata(planner, &layout);
        writer.plan_inodes(planner, files, now);
        writer.plan_directories(planner, files);
        writer.plan_resize_inode(planner, files);
        writer.plan_journal(planner, files, uuid)?;
        writer.plan_orphan_file(planner, files);
        writer.plan_quota_files(planner, files);
        writer.plan_mmp(files);
        // 1 (mke2fs starts the counter at 1 for ext4) plus what this run writes.
        let backups = writer.backup_groups.len() as u64 * u64::from(g.block_size);
        let total = writer.queue.bytes() + backups + u64::from(g.block_size.max(4096));
        writer.sb.kbytes_written = 1 + (total >> 10);
        writer.report.bytes_written = total;
        Ok(writer)
    }

    /// Ranges mke2fs zeroes on a device it could not discard: the used part of the inode tables,
    /// the journal, and the device's last 64 KiB. Block 0's boot sectors and the old superblock
    /// are cleared in all cases.
    pub(super) fn plan_zeroing(&mut self, planner: &Planner, files: &Files, device_zeroed: bool) {
        let g = &planner.g;
        let bs = u64::from(g.block_size);
        if device_zeroed {
            return;
        }
        // Zeroing runs before any metadata write, so ranges may cover blocks written later.
        let isz = u64::from(g.inode_size);
        for state in &planner.groups {
            let used = u64::from(g.inodes_per_group - state.itable_unused);
            self.queue.zero(state.inode_table * bs, (used * isz).div_ceil(bs) * bs);
        }
        for &(_, start, len) in &files.journal.extents {
            // Journal block 0 gets the journal superblock; the rest of its block is zeroed with
            // the first extent.
            self.queue.zero(start * bs, u64::from(len) * bs);
        }
        let rsv = END_WIPE_BYTES.div_ceil(bs).max(1);
        let blocks = g.blocks_count;
        let mut start = blocks & !(rsv - 1);
        if start > rsv {
            start -= rsv;
        }
        if start > 0 {
            self.queue.zero(start * bs, (blocks - start) * bs);
        }
    }

    /// Superblock backups, descriptor tables and initialized bitmaps of every group.
    pub(super) fn plan_group_metadata(&mut self, planner: &Planner, layout: &Layout) {
        let g = &planner.g;
        let bs = g.block_size as usize;
        let desc_size = usize::from(g.desc_size);
        let mut table = vec![0u8; g.desc_blocks as usize * bs];
        for (group, desc) in layout.descs.iter().enumerate() {
            let mut desc = *desc;
            if self.sb.has_metadata_csum() {
                let (blocks, inodes) = &layout.bitmaps[group];
                if let Some(bm) = blocks {
                    desc.block_bitmap_csum =
                        bitmap_checksum(&self.sb, &bm[..g.bitmap_bytes_blocks()]);
                }
                if let Some(bm) = inodes {
                    desc.inode_bitmap_csum =
                        bitmap_checksum(&self.sb, &bm[..g.bitmap_bytes_inodes()]);
                }
            }
            let raw = &mut table[group * desc_size..(group + 1) * desc_size];
            desc.encode_into(raw, desc_size);
            set_group_desc_checksum(&self.sb, group as u32, raw);
        }
        let meta_bg = g.features.incompat(feature::INCOMPAT_META_BG);
        for group in 0..g.groups {
            let has_super = g.has_super(group);
            if has_super && group > 0 {
                self.backup_groups.push(group);
            }
            // The table (or, with meta_bg, the meta group's block of it) after the superblock
            // copy, if the group has one.
            let at = (g.superblock_block(group) + u64::from(has_super)) * bs as u64;
            if !meta_bg && has_super {
                self.queue.put(at, table.clone());
            } else if meta_bg && g.holds_meta_bg_descriptors(group) {
                let nr = (group / g.descs_per_block()) as usize;
                self.queue.put(at, table[nr * bs..(nr + 1) * bs].to_vec());
            }
        }
        for (group, bitmaps) in layout.bitmaps.iter().enumerate() {
            let state = &planner.groups[group];
            if let Some(blocks) = &bitmaps.0 {
                self.queue.put(state.block_bitmap * bs as u64, blocks.clone());
            }
            if let Some(inodes) = &bitmaps.1 {
                self.queue.put(state.inode_bitmap * bs as u64, inodes.clone());
            }
        }
    }

    /// A backup superblock as `ext2fs_flush` writes it: its group number, and the state
    /// cleared (e2fsck restores it from the primary when it uses a backup).
    pub(super) fn backup_superblock(&self, group: u32) -> Vec<u8> {
        let mut backup = self.sb.clone();
        backup.state = 0;
        backup.block_group_nr = u16::try_from(group).unwrap_or(0);
        let raw = backup.encode();
        let mut block = vec![0u8; self.block_size as usize];
        block[..ext4::SUPERBLOCK_SIZE].copy_from_slice(&raw);
        block
    }

    /// The used part of group 0's inode table (and of any other group holding reserved
    /// inodes): every used inode, the reserved ones zeroed but checksummed.
    pub(super) fn plan_inodes(&mut self, planner: &Planner, files: &Files, now: u64) {
        let g = &planner.g;
        let bs = u64::from(g.block_size);
        let isz = usize::from(g.inode_size);
        let mut records: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
        let time = Timestamp { sec: now as i64, nsec: 0 };
        let new_inode = |mode: u16, links: u16, size: u64, blocks: u64| Inode {
            mode,
            links_count: links,
            size,
            blocks_raw: blocks * bs / 512,
            atime: time,
            ctime: time,
            mtime: time,
            crtime: time,
            extra_isize: if isz > 128 { EXTRA_ISIZE } else { 0 },
            ..Inode::default()
        };
        // Reserved inodes are written zeroed (with checksums) when metadata_csum is on.
        if g.csum() {
            for ino in 1..FIRST_INO {
                records.insert(ino, vec![0u8; isz]);
            }
        }
        let mut bad = Inode { atime: time, ctime: time, mtime: time, ..Inode::default() };
        bad.extra_isize = 0;
        records.insert(BAD_INO, encode_inode(&bad, isz));

        let cluster = g.cluster_blocks();
        let mut root = new_inode(ext4::MODE_DIR | 0o755, 3, bs, files.root.allocated(cluster));
        root.flags = files.root.inode_flags();
        root.block = files.root.inode_root();
        records.insert(ROOT_INO, encode_inode(&root, isz));

        let lf_blocks = files.lost_found.blocks();
        let lf_all = files.lost_found.allocated(cluster);
        let mut lost_found = new_inode(ext4::MODE_DIR | 0o700, 2, lf_blocks * bs, lf_all);
        lost_found.flags = files.lost_found.inode_flags();
        lost_found.block = files.lost_found.inode_root();
        let mut raw = encode_inode(&lost_found, isz);
        if g.features.incompat(feature::INCOMPAT_INLINE_DATA) {
            // Moved out of the inode (`Planner::create_files`), lost+found keeps the in-inode
            // xattr header that held system.data, as ext2fs_inline_data_ea_remove leaves it.
            let at = lost_found.xattr_area_range(isz).start;
            raw[at..at + 4].copy_from_slice(&ondisk::ext4::xattr::XATTR_MAGIC.to_le_bytes());
        }
        records.insert(FIRST_INO, raw);

        if let Some(dind) = files.resize_dind {
            let backups = backup_groups(g).len() as u64;
            let rsv = u64::from(g.reserved_gdt_blocks);
            // ext2fs_iblk_add_blocks counts each block as a cluster.
            let blocks = (1 + rsv + rsv * backups) * cluster;
            let mut resize = new_inode(ext4::MODE_REGULAR | 0o600, 1, resize_inode_size(g), blocks);
            resize.block[DIND_SLOT * 4..DIND_SLOT * 4 + 4]
                .copy_from_slice(&(dind as u32).to_le_bytes());
            records.insert(RESIZE_INO, encode_inode(&resize, isz));
        }
        if g.journal_blocks > 0 {
            let blocks = files.journal.allocated(cluster);
            let size = u64::from(g.journal_blocks) * bs;
            let mut journal = new_inode(ext4::MODE_REGULAR | 0o600, 1, size, blocks);
            journal.flags = files.journal.inode_flags();
            journal.block = files.journal.inode_root();
            records.insert(JOURNAL_INO, encode_inode(&journal, isz));
        }
        if let Some((ino, map)) = &files.orphan {
            let mut orphan =
                new_inode(ext4::MODE_REGULAR | 0o600, 1, map.blocks() * bs, map.allocated(cluster));
            orphan.flags = map.inode_flags();
            orphan.block = map.inode_root();
            records.insert(*ino, encode_inode(&orphan, isz));
        }
        for quota in &files.quota {
            // quota_inode_init_new: immutable, owned by root, only the 1 KiB quota blocks
            // written counted in i_size.
            let map = &quota.map;
            let blocks = map.allocated(cluster);
            let size = quota.bytes.len() as u64;
            let mut inode = new_inode(ext4::MODE_REGULAR | 0o600, 1, size, blocks);
            inode.flags = map.inode_flags() | ext4::iflags::IMMUTABLE_FL;
            inode.block = map.inode_root();
            records.insert(quota.ino, encode_inode(&inode, isz));
        }
        // Gather the records into whole inode-table blocks.
        let mut blocks: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        for (ino, mut raw) in records {
            set_inode_checksum(&self.sb, ino, &mut raw);
            let group = (ino - 1) / g.inodes_per_group;
            let index = u64::from((ino - 1) % g.inodes_per_group);
            let byte = index * isz as u64;
            let block = planner.groups[group as usize].inode_table + byte / bs;
            let data = blocks.entry(block).or_insert_with(|| vec![0u8; bs as usize]);
            let at = (byte % bs) as usize;
            data[at..at + isz].copy_from_slice(&raw);
        }
        for (block, data) in blocks {
            self.queue.put(block * bs, data);
        }
    }

    /// The root directory block and lost+found's blocks.
    pub(super) fn plan_directories(&mut self, planner: &Planner, files: &Files) {
        let g = &planner.g;
        let bs = g.block_size as usize;
        self.put_indirect_blocks(&files.root, bs);
        self.put_indirect_blocks(&files.lost_found, bs);
        let csum = g.csum();
        // filetype is always on (quill mkfs cannot clear it): entries carry FT_DIR.
        debug_assert!(g.features.incompat(feature::INCOMPAT_FILETYPE));
        let mut root = vec![0u8; bs];
        dirent::init_first_dir_block(&mut root, csum, ROOT_INO, ROOT_INO);
        let added = dirent::insert_dir_entry(&mut root, csum, b"lost+found", FIRST_INO, FT_DIR);
        assert!(matches!(added, Ok(true)), "lost+found fits the root's first block");
        self.seal_dir_block(ROOT_INO, &mut root);
        self.queue.put(files.root.extents[0].1 * bs as u64, root);

        let mut logical = 0;
        for &(_, start, len) in &files.lost_found.extents {
            for block in start..start + u64::from(len) {
                let mut data = vec![0u8; bs];
                if logical == 0 && g.features.incompat(feature::INCOMPAT_INLINE_DATA) {
                    // The empty inline directory's block (ext2fs_inline_data_dir_expand).
                    let (i_block, value) = inline::encode_dir(ROOT_INO, &[], 0, 0)
                        .expect("an empty inline directory fits");
                    data = inline::dir_block_image(&i_block, &value, FIRST_INO, bs, csum)
                        .expect("an empty inline directory converts");
                } else if logical == 0 {
                    dirent::init_first_dir_block(&mut data, csum, FIRST_INO, ROOT_INO);
                } else {
                    dirent::init_empty_dir_block(&mut data, csum);
                }
                self.seal_dir_block(FIRST_INO, &mut data);
                self.queue.put(block * bs as u64, data);
                logical += 1;
            }
        }
    }

    /// The checksum in the tail of a directory block (metadata_csum only; the tail is there).
    pub(super) fn seal_dir_block(&self, ino: u32, block: &mut [u8]) {
        if self.sb.has_metadata_csum() {
            dirent::set_dir_block_checksum(inode_csum_seed(&self.sb, ino, 0), block);
        }
    }

    /// `ext2fs_create_resize_inode`: the double-indirect block maps the primary reserved GDT
    /// blocks, and each primary reserved block lists its backups.
    pub(super) fn plan_resize_inode(&mut self, planner: &Planner, files: &Files) {
        let Some(dind) = files.resize_dind else {
            return;
        };
        let g = &planner.g;
        let bs = g.block_size as usize;
        let apb = (bs / 4) as u64;
        let backups = backup_groups(g);
        let mut dind_block = vec![0u8; bs];
        for r in 0..u64::from(g.reserved_gdt_blocks) {
            let gdt_off = ((g.desc_blocks + r) % apb) as usize;
            // res_gdt.c: with 1 KiB blocks and bigalloc the superblock is still block 1.
            let gdt_blk = g.superblock_block(0) + 1 + g.desc_blocks + r;
            dind_block[gdt_off * 4..gdt_off * 4 + 4]
                .copy_from_slice(&(gdt_blk as u32).to_le_bytes());
            let mut list = vec![0u8; bs];
            for (i, &group) in backups.iter().enumerate().take(apb as usize) {
                let expect = gdt_blk + u64::from(group) * u64::from(g.blocks_per_group);
                list[i * 4..i * 4 + 4].copy_from_slice(&(expect as u32).to_le_bytes());
            }
            self.queue.put(gdt_blk * bs as u64, list);
        }
        self.queue.put(dind * bs as u64, dind_block);
    }

    /// The MMP block as `ext2fs_mmp_reset` writes it and `ext2fs_mmp_stop` leaves it: clean,
    /// this host's name, the check interval, the time, the rest of the block zero.
    pub(super) fn plan_mmp(&mut self, files: &Files) {
        let Some(block) = files.mmp_block else { return };
        let bs = self.block_size as usize;
        let mut mmp = MmpBlock::clean(MMP_UPDATE_INTERVAL.max(MMP_CHECK_INTERVAL_MIN));
        mmp.set_nodename(&hostname());
        mmp.set_bdevname(b"quill");
        // ext2fs_mmp_stop stamps it when mke2fs closes the file system, from the real clock
        // (E2FSPROGS_FAKE_TIME does not reach it).
        mmp.time = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let seed = self.sb.has_metadata_csum().then(|| self.sb.csum_seed());
        let mut data = vec![0u8; bs];
        data[..MMP_SIZE].copy_from_slice(&mmp.encode(seed));
        self.queue.put(block * bs as u64, data);
    }

    /// The indirect blocks of a block-mapped file (none for an extent map): their pointers,
    /// little-endian.
    fn put_indirect_blocks(&mut self, map: &FileBlocks, bs: usize) {
        let Some(indirect) = &map.indirect else { return };
        for (&block, pointers) in &indirect.blocks {
            let bytes: Vec<u8> = pointers.iter().flat_map(|p| p.to_le_bytes()).collect();
            debug_assert_eq!(bytes.len(), bs);
            self.queue.put(block * bs as u64, bytes);
        }
    }

    /// The journal's extent leaf (if any); its superblock is written by `journal::format`.
    pub(super) fn plan_journal(
        &mut self,
        planner: &Planner,
        files: &Files,
        uuid: [u8; 16],
    ) -> Result<()> {
        let g = &planner.g;
        if g.journal_blocks == 0 {
            return Ok(());
        }
        let bs = g.block_size as usize;
        self.put_indirect_blocks(&files.journal, bs);
        if let Some(leaf) = files.journal.leaf {
            let mut block = vec![0u8; bs];
            let entries = ExtentEntries::Leaf(files.journal.as_extents());
            let header = ExtentHeader {
                entries: entries.len() as u16,
                max: ExtentHeader::slots_for(bs),
                depth: 0,
                generation: 0,
            };
            header.encode_node(&entries, &mut block);
            if self.sb.has_metadata_csum() {
                header.seal_block(inode_csum_seed(&self.sb, JOURNAL_INO, 0), &mut block);
            }
            self.queue.put(leaf * bs as u64, block);
        }
        let runs = files
            .journal
            .extents
            .iter()
            .map(|&(logical, start, len)| LocationExtent {
                log_start: logical,
                fs_block: start,
                len,
            })
            .collect();
        let location = JournalLocation::new(g.block_size, runs)
            .map_err(|e| FsError::Invalid(format!("journal layout: {e}")))?;
        let options = journal::superblock::FormatOptions {
            checksum: if g.csum() { ChecksumVersion::V3 } else { ChecksumVersion::None },
            is_64bit: g.features.incompat(feature::INCOMPAT_64BIT),
            uuid,
            // mke2fs records the area's size only; the kernel turns the journal's own
            // fast-commit feature on when it mounts with fast commits (the log is empty then).
            fast_commit_blocks: g.fast_commit_blocks,
            fast_commit_feature: false,
        };
        self.journal = Some((location, options));
        Ok(())
    }

    /// Orphan-file blocks: empty slots, the tail's magic and (metadata_csum) checksum.
    pub(super) fn plan_orphan_file(&mut self, planner: &Planner, files: &Files) {
        let Some((ino, map)) = &files.orphan else {
            return;
        };
        let bs = planner.g.block_size as usize;
        for &(_, start, len) in &map.extents {
            for block in start..start + u64::from(len) {
                let mut data = vec![0u8; bs];
                let tail = bs - ORPHAN_TAIL_SIZE;
                data[tail..tail + 4].copy_from_slice(&ORPHAN_BLOCK_MAGIC.to_le_bytes());
                if self.sb.has_metadata_csum() {
                    let mut crc = inode_csum_seed(&self.sb, *ino, 0);
                    crc = crc32c_raw(crc, &block.to_le_bytes());
                    crc = crc32c_raw(crc, &data[..tail]);
                    data[tail + 4..].copy_from_slice(&crc.to_le_bytes());
                }
                self.queue.put(block * bs as u64, data);
            }
        }
    }

    /// The quota files' blocks (`Planner::create_quota_files` placed them).
    pub(super) fn plan_quota_files(&mut self, planner: &Planner, files: &Files) {
        let bs = planner.g.block_size as usize;
        for quota in &files.quota {
            self.put_indirect_blocks(&quota.map, bs);
            for &(logical, start, len) in &quota.map.extents {
                for i in 0..u64::from(len) {
                    let at = (u64::from(logical) + i) as usize * bs;
                    let mut data = vec![0u8; bs];
                    let end = (at + bs).min(quota.bytes.len());
                    data[..end - at].copy_from_slice(&quota.bytes[at..end]);
                    self.queue.put((start + i) * bs as u64, data);
                }
            }
        }
    }

    /// Zeroes, then metadata, then (after a flush) the journal superblock and the primary
    /// superblock.
    pub(super) fn write(
        mut self,
        dev: &dyn BlockDevice,
        progress: &mut dyn FnMut(MkfsProgress),
    ) -> Result<MkfsReport> {
        let total = self.report.bytes_written;
        let mut done = 0u64;
        let mut report = |n: u64, progress: &mut dyn FnMut(MkfsProgress)| {
            done += n;
            progress(MkfsProgress { bytes_done: done.min(total), bytes_total: total });
        };
        // Kill the old primary superblock first, so an interrupted run is not mistaken for a
        // file system.
        dev.write_at(ext4::SUPERBLOCK_OFFSET, &[0u8; ext4::SUPERBLOCK_SIZE])?;
        let zeros = vec![0u8; ZERO_CHUNK_BYTES];
        for &(offset, len) in &self.queue.zero_ranges {
            let mut at = 0;
            while at < len {
                let n = (len - at).min(ZERO_CHUNK_BYTES as u64);
                dev.write_at(offset + at, &zeros[..n as usize])?;
                at += n;
                report(n, progress);
            }
        }
        let mut run_start = 0u64;
        let mut run: Vec<u8> = Vec::new();
        for (offset, data) in std::mem::take(&mut self.queue.writes) {
            if !run.is_empty()
                && (run_start + run.len() as u64 != offset || run.len() >= WRITE_BATCH_BYTES_MAX)
            {
                dev.write_at(run_start, &run)?;
                report(run.len() as u64, progress);
                run.clear();
            }
            if run.is_empty() {
                run_start = offset;
            }
            run.extend_from_slice(&data);
        }
        if !run.is_empty() {
            dev.write_at(run_start, &run)?;
            report(run.len() as u64, progress);
        }
        for &group in &self.backup_groups {
            let block = self.first_data_block + u64::from(group) * u64::from(self.blocks_per_group);
            let data = self.backup_superblock(group);
            dev.write_at(block * u64::from(self.block_size), &data)?;
            report(data.len() as u64, progress);
        }
        if let Some((location, options)) = &self.journal {
            journal::superblock::format(dev, location, *options)?;
        }
        dev.flush()?;
        let head = self.primary_head(dev)?;
        dev.write_at(0, &head)?;
        report(head.len() as u64, progress);
        dev.flush()?;
        Ok(self.report)
    }

    /// Bytes 0..max(block, 4 KiB) as mke2fs leaves them for block sizes of 4 KiB and up (boot
    /// sectors cleared unless they hold a BSD disklabel, the superblock, zeros), or bytes
    /// 0..2048 for smaller blocks.
    pub(super) fn primary_head(&self, dev: &dyn BlockDevice) -> Result<Vec<u8>> {
        let len = if self.block_size >= 4096 { 4096 } else { 2048 };
        let mut head = vec![0u8; len];
        let mut sector = vec![0u8; 1024];
        dev.read_at(0, &mut sector)?;
        let magic = u32::from_le_bytes([sector[64], sector[65], sector[66], sector[67]]);
        if magic == BSD_DISKMAGIC || magic.swap_bytes() == BSD_DISKMAGIC {
            head[..1024].copy_from_slice(&sector);
        }
        let off = ext4::SUPERBLOCK_OFFSET as usize;
        head[off..off + ext4::SUPERBLOCK_SIZE].copy_from_slice(&self.sb.encode());
        Ok(head)
    }
}

/// `(apb² + apb + 12) × block size`: the resize inode's nominal size.
pub(super) fn resize_inode_size(g: &Geometry) -> u64 {
    let apb = u64::from(g.block_size / 4);
    (apb * apb + apb + NDIR_BLOCKS) * u64::from(g.block_size)
}

pub(super) fn encode_inode(inode: &Inode, isz: usize) -> Vec<u8> {
    let mut raw = vec![0u8; isz];
    inode.encode_into(&mut raw);
    raw
}
