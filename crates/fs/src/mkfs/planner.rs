//! mke2fs's in-memory file system: the used-block set, table placement, the allocator, and
//! the files it creates (root, lost+found, resize inode, journal, orphan file), in its order.

use super::*;
use ondisk::ext4::quota::{DiskDquot, MemQuotaFile, QuotaType, QUOTA_BLOCK_SIZE};

/// The set of used blocks: disjoint, coalesced half-open runs keyed by start.
#[derive(Debug, Default)]
pub(super) struct UsedBlocks {
    pub(super) runs: BTreeMap<u64, u64>,
}

impl UsedBlocks {
    pub(super) fn insert(&mut self, start: u64, len: u64) {
        assert!(len > 0, "empty run at {start}");
        let mut new_start = start;
        let mut new_end = start + len;
        assert!(self.first_used_in(start, new_end).is_none(), "block run {start}+{len} is used");
        if let Some((&s, &e)) = self.runs.range(..start).next_back() {
            if e == start {
                new_start = s;
                self.runs.remove(&s);
            }
        }
        if let Some(&e) = self.runs.get(&new_end) {
            self.runs.remove(&new_end);
            new_end = e;
        }
        self.runs.insert(new_start, new_end);
    }

    /// The first used block in `[start, end)`.
    pub(super) fn first_used_in(&self, start: u64, end: u64) -> Option<u64> {
        if let Some((_, &e)) = self.runs.range(..=start).next_back() {
            if e > start {
                return Some(start);
            }
        }
        self.runs.range(start..end).next().map(|(&s, _)| s)
    }

    /// The first free block at or after `block` (the end of the run holding it, if any).
    pub(super) fn next_free(&self, block: u64) -> u64 {
        match self.runs.range(..=block).next_back() {
            Some((_, &e)) if e > block => e,
            _ => block,
        }
    }

    /// The first free block in `[start, end]`, `ext2fs_find_first_zero_block_bitmap2`.
    pub(super) fn first_free_in(&self, start: u64, end: u64) -> Option<u64> {
        let b = self.next_free(start);
        (b <= end).then_some(b)
    }

    /// Used runs overlapping `[start, end)`, clipped to it.
    pub(super) fn overlapping(
        &self,
        start: u64,
        end: u64,
    ) -> impl Iterator<Item = (u64, u64)> + '_ {
        let first = self.runs.range(..=start).next_back().map_or(start, |(&s, _)| s);
        self.runs
            .range(first..end)
            .map(move |(&s, &e)| (s.max(start), e.min(end)))
            .filter(|(s, e)| s < e)
    }

    pub(super) fn count_in(&self, start: u64, end: u64) -> u64 {
        self.overlapping(start, end).map(|(s, e)| e - s).sum()
    }
}

/// Per-group state mke2fs keeps in its descriptors while it allocates.
#[derive(Debug, Clone, Default)]
pub(super) struct GroupState {
    pub(super) block_bitmap: u64,
    pub(super) inode_bitmap: u64,
    pub(super) inode_table: u64,
    pub(super) block_uninit: bool,
    pub(super) inode_uninit: bool,
    pub(super) itable_unused: u32,
    pub(super) used_dirs: u32,
}

/// mke2fs's in-memory file system while it lays out tables and creates the first files.
pub(super) struct Planner {
    pub(super) g: Geometry,
    pub(super) used: UsedBlocks,
    pub(super) groups: Vec<GroupState>,
    /// Inodes in use (all are among the first few).
    pub(super) inodes_used: Vec<u32>,
    /// Clusters in use once the tables are placed (mke2fs's "overhead", before the
    /// journal).
    pub(super) overhead_tables: u64,
}

/// A file's blocks as mke2fs maps them: its data as runs (logical start, physical start,
/// length), and how the inode finds them: extents (with a leaf block when the runs outgrow the
/// inode's four slots), or, without the extent feature, indirect blocks.
#[derive(Debug, Clone, Default)]
pub(super) struct FileBlocks {
    pub(super) extents: Vec<(u32, u64, u32)>,
    /// The extent-tree leaf block when the extents outgrow the inode's four slots.
    pub(super) leaf: Option<u64>,
    /// Without the extent feature: the block map.
    pub(super) indirect: Option<Indirect>,
}

/// An indirect block map (ext2/ext3): `i_block` holds 12 direct pointers, then the single-,
/// double- and triple-indirect blocks'; each indirect block holds `block size / 4` pointers.
#[derive(Debug, Clone, Default)]
pub(super) struct Indirect {
    pub(super) slots: [u32; ext4::INODE_BLOCK_SIZE / 4],
    /// Every indirect block with its pointers.
    pub(super) blocks: BTreeMap<u64, Vec<u32>>,
}

/// Where a pointer lives: an `i_block` slot, or an entry of an indirect block.
#[derive(Debug, Clone, Copy)]
enum Pointer {
    Slot(usize),
    Entry(u64, usize),
}

impl FileBlocks {
    /// An empty map, indirect when `extents` is off.
    pub(super) fn new(extents: bool) -> FileBlocks {
        FileBlocks { indirect: (!extents).then(Indirect::default), ..FileBlocks::default() }
    }

    pub(super) fn blocks(&self) -> u64 {
        self.extents.iter().map(|e| u64::from(e.2)).sum()
    }

    /// What i_blocks counts, in blocks: the data and map blocks, or with bigalloc (`cluster`
    /// blocks per cluster) each cluster they touch, whole.
    pub(super) fn allocated(&self, cluster: u64) -> u64 {
        let mut clusters = std::collections::BTreeSet::new();
        for &(_, start, len) in &self.extents {
            clusters.extend(start / cluster..=(start + u64::from(len) - 1) / cluster);
        }
        (clusters.len() as u64 + self.map_blocks()) * cluster
    }

    /// Blocks the map itself takes: the extent leaf, or the indirect blocks.
    pub(super) fn map_blocks(&self) -> u64 {
        u64::from(self.leaf.is_some()) + self.indirect.as_ref().map_or(0, |i| i.blocks.len() as u64)
    }

    /// The data runs as (initialized) extents.
    pub(super) fn as_extents(&self) -> Vec<Extent> {
        self.extents
            .iter()
            .map(|&(logical, start, len)| Extent { logical, len, start, unwritten: false })
            .collect()
    }

    /// The inode flags the map needs (EXTENTS_FL for an extent map).
    pub(super) fn inode_flags(&self) -> u32 {
        if self.indirect.is_some() {
            0
        } else {
            ext4::EXTENTS_FL
        }
    }

    /// Appends a run, merging it into the last extent when physically contiguous.
    pub(super) fn push(&mut self, physical: u64, len: u32) {
        let logical = self.blocks() as u32;
        if let Some(last) = self.extents.last_mut() {
            if last.1 + u64::from(last.2) == physical && last.2 + len <= ext4::EXTENT_LEN_INIT_MAX {
                last.2 += len;
                return;
            }
        }
        self.extents.push((logical, physical, len));
    }
}

impl FileBlocks {
    /// The block logical block `logical` is mapped to, if any.
    pub(super) fn physical(&self, logical: u64) -> Option<u64> {
        self.extents.iter().find_map(|&(l, start, len)| {
            let l = u64::from(l);
            (l..l + u64::from(len)).contains(&logical).then(|| start + logical - l)
        })
    }

    /// Maps logical block `logical` (a hole) to `physical`, merging with a neighbouring run
    /// as ext2fs's extent code does: into the run before it when contiguous, else into the
    /// run after it (never both: with bigalloc, quota blocks 0, 2..5, then 1 of one cluster
    /// end up as mke2fs leaves them, two extents). An indirect map takes direct
    /// blocks only (the quota files mkfs makes are six quota blocks).
    pub(super) fn map_at(&mut self, logical: u64, physical: u64) -> Result<()> {
        if let Some(indirect) = self.indirect.as_mut() {
            if logical >= NDIR_BLOCKS {
                return Err(FsError::Unsupported(format!(
                    "mkfs maps only direct blocks out of order (block {logical})"
                )));
            }
            indirect.slots[logical as usize] = physical as u32;
        }
        let logical = logical as u32;
        let at = self.extents.partition_point(|e| e.0 < logical);
        let joins_left = at > 0 && {
            let (l, start, len) = self.extents[at - 1];
            l + len == logical && start + u64::from(len) == physical
        };
        let joins_right = self
            .extents
            .get(at)
            .is_some_and(|&(l, start, _)| logical + 1 == l && physical + 1 == start);
        match (joins_left, joins_right) {
            (true, _) => self.extents[at - 1].2 += 1,
            (false, true) => {
                let right = &mut self.extents[at];
                (right.0, right.1, right.2) = (logical, physical, right.2 + 1);
            }
            (false, false) => self.extents.insert(at, (logical, physical, 1)),
        }
        Ok(())
    }
}

impl Indirect {
    /// The chain of indices from `i_block` down to logical block `logical`'s pointer: the slot,
    /// then an index into each indirect block below it.
    fn path(logical: u64, per_block: u64) -> Vec<usize> {
        const DIRECT: u64 = NDIR_BLOCKS;
        if logical < DIRECT {
            return vec![logical as usize];
        }
        let mut rest = logical - DIRECT;
        let mut span = per_block;
        for level in 1..=3usize {
            if rest < span {
                let mut path = vec![DIRECT as usize + level - 1];
                for depth in (0..level as u32).rev() {
                    path.push((rest / per_block.pow(depth) % per_block) as usize);
                }
                return path;
            }
            rest -= span;
            span *= per_block;
        }
        panic!("logical block {logical} beyond the triple-indirect range");
    }

    fn get(&self, at: Pointer) -> u32 {
        match at {
            Pointer::Slot(slot) => self.slots[slot],
            Pointer::Entry(block, index) => self.blocks[&block][index],
        }
    }

    fn set(&mut self, at: Pointer, value: u32) {
        match at {
            Pointer::Slot(slot) => self.slots[slot] = value,
            Pointer::Entry(block, index) => {
                self.blocks.get_mut(&block).expect("an indirect block")[index] = value
            }
        }
    }
}

/// Where the files mke2fs creates ended up.
pub(super) struct Files {
    pub(super) root: FileBlocks,
    pub(super) lost_found: FileBlocks,
    pub(super) resize_dind: Option<u64>,
    pub(super) journal: FileBlocks,
    pub(super) orphan: Option<(u32, FileBlocks)>,
    /// The MMP block (mmp feature).
    pub(super) mmp_block: Option<u64>,
    /// The quota files (quota feature), in type order.
    pub(super) quota: Vec<QuotaFileMade>,
    /// `s_overhead_clusters`.
    pub(super) overhead: u64,
}

/// A quota file mkfs made: its type, inode, blocks and contents.
pub(super) struct QuotaFileMade {
    pub(super) kind: QuotaType,
    pub(super) ino: u32,
    pub(super) map: FileBlocks,
    pub(super) bytes: Vec<u8>,
}

impl Files {
    /// `s_usr_quota_inum`, `s_grp_quota_inum`, `s_prj_quota_inum`.
    pub(super) fn quota_inums(&self) -> [u32; 3] {
        let mut inums = [0; 3];
        for quota in &self.quota {
            inums[quota.kind as usize] = quota.ino;
        }
        inums
    }
}

/// Extents hold at most this many inode-root entries.
pub(super) const EXTENTS_IN_INODE: usize = 4;

impl Planner {
    pub(super) fn new(g: Geometry) -> Planner {
        let mut used = UsedBlocks::default();
        let mut groups = vec![GroupState::default(); g.groups as usize];
        let mut reserved_inos = FIRST_INO;
        for (i, state) in groups.iter_mut().enumerate() {
            let group = i as u32;
            if g.group_desc_csum() {
                state.block_uninit = group != g.groups - 1;
                state.inode_uninit = true;
                let mut unused = g.inodes_per_group;
                if unused > reserved_inos {
                    unused -= reserved_inos;
                    reserved_inos = 0;
                } else {
                    reserved_inos -= unused;
                    unused = 0;
                }
                state.itable_unused = unused;
            }
            let n = g.super_and_gdt_blocks(group);
            if n > 0 {
                // A group's backup may run past the end of a tiny last group. With 1 KiB
                // blocks and bigalloc, group 0 starts at the boot block, which is reserved too.
                let start = g.group_first(group);
                let n = n + (g.superblock_block(group) - start);
                used.insert(start, n.min(g.blocks_count - start));
            }
        }
        Planner { g, used, groups, inodes_used: Vec::new(), overhead_tables: 0 }
    }

    /// `ext2fs_allocate_tables`.
    pub(super) fn allocate_tables(&mut self) {
        for group in 0..self.g.groups {
            if self.g.flex_size > 0 {
                self.allocate_group_table_flex(group);
            } else {
                self.allocate_group_table_plain(group);
            }
        }
        if self.g.cluster_bits > 0 {
            self.convert_to_clusters();
        }
        let fdb = self.g.first_data_block;
        self.overhead_tables = self.used.count_in(fdb, self.g.blocks_count) >> self.g.cluster_bits;
    }

    /// `ext2fs_convert_subcluster_bitmap`: mke2fs places the tables block by block, then
    /// allocates in clusters, a cluster in use when any of its blocks is. Every used run
    /// grows to whole clusters, so from here on free space starts on a cluster boundary.
    fn convert_to_clusters(&mut self) {
        let mask = self.g.cluster_blocks() - 1;
        let mut clustered = UsedBlocks::default();
        let mut pending: Option<(u64, u64)> = None;
        for (&start, &end) in &self.used.runs {
            let (start, end) = (start & !mask, (end + mask) & !mask);
            pending = match pending {
                Some((s, e)) if start <= e => Some((s, e.max(end))),
                Some((s, e)) => {
                    clustered.insert(s, e - s);
                    Some((start, end))
                }
                None => Some((start, end)),
            };
        }
        if let Some((s, e)) = pending {
            clustered.insert(s, e - s);
        }
        self.used = clustered;
    }

    pub(super) fn allocate_group_table_plain(&mut self, group: u32) {
        let first = self.g.group_first(group);
        let last = self.g.group_last(group);
        let ibpg = self.g.inode_blocks_per_group;
        let bb = self.get_free_blocks(first, last, 1).expect("room for a block bitmap");
        self.used.insert(bb, 1);
        let ib = self.get_free_blocks(first, last, 1).expect("room for an inode bitmap");
        self.used.insert(ib, 1);
        let it = self.get_free_blocks(first, last, ibpg).expect("room for an inode table");
        self.used.insert(it, ibpg);
        let state = &mut self.groups[group as usize];
        (state.block_bitmap, state.inode_bitmap, state.inode_table) = (bb, ib, it);
    }

    pub(super) fn allocate_group_table_flex(&mut self, group: u32) {
        let flex = self.g.flex_size;
        let group_first = self.g.group_first(group);
        let last_grp = (group | (flex - 1)).min(self.g.groups - 1);
        let rem_grps = u64::from(last_grp - group + 1);
        let last_blk = self.g.group_last(last_grp);
        let ibpg = self.g.inode_blocks_per_group;
        let mut table_offset = u64::from(flex);
        let prev = if !group.is_multiple_of(flex) {
            self.groups[group as usize - 1].block_bitmap + 1
        } else {
            if last_grp == self.g.groups - 1 {
                // The last flex group keeps its tables contiguous.
                table_offset = u64::from(last_grp & (flex - 1));
                table_offset = if table_offset == 0 { u64::from(flex) } else { table_offset + 1 };
            }
            0
        };
        let start = self.flexbg_offset(group, prev, rem_grps, 1);
        let bb = self
            .get_free_blocks(start, last_blk, 1)
            .or_else(|| self.get_free_blocks(group_first, last_blk, 1))
            .expect("room for a block bitmap");
        self.claim_table(bb, 1);
        self.groups[group as usize].block_bitmap = bb;

        let prev = if !group.is_multiple_of(flex) {
            self.groups[group as usize - 1].inode_bitmap + 1
        } else {
            bb + table_offset
        };
        let start = self.flexbg_offset(group, prev, rem_grps, 1);
        let ib = self
            .get_free_blocks(start, last_blk, 1)
            .or_else(|| self.get_free_blocks(group_first, last_blk, 1))
            .expect("room for an inode bitmap");
        self.claim_table(ib, 1);
        self.groups[group as usize].inode_bitmap = ib;

        let prev = if !group.is_multiple_of(flex) {
            self.groups[group as usize - 1].inode_table + ibpg
        } else {
            ib + table_offset
        };
        let start = self.flexbg_offset(group, prev, rem_grps, ibpg);
        let it = self.get_free_blocks(start, last_blk, ibpg).expect("room for an inode table");
        self.claim_table(it, ibpg);
        self.groups[group as usize].inode_table = it;
    }

    /// Marks flex_bg table blocks used; the groups they land in lose BLOCK_UNINIT.
    pub(super) fn claim_table(&mut self, start: u64, len: u64) {
        self.used.insert(start, len);
        self.touch_groups(start, len);
    }

    pub(super) fn touch_groups(&mut self, start: u64, len: u64) {
        let first = self.g.group_of(start);
        let last = self.g.group_of(start + len - 1);
        for group in first..=last {
            self.groups[group as usize].block_uninit = false;
        }
    }

    /// `flexbg_offset`: where a flex group's run of one kind of table continues.
    pub(super) fn flexbg_offset(
        &self,
        group: u32,
        start_blk: u64,
        rem_grp: u64,
        elem_size: u64,
    ) -> u64 {
        let flex = self.g.flex_size;
        let flexbg = group / flex;
        let size = (rem_grp * elem_size).min(u64::from(self.g.blocks_per_group / 4));
        if start_blk != 0 && start_blk < self.g.blocks_count {
            if let Some(b) = self.get_free_blocks(start_blk, start_blk + size, elem_size) {
                return b;
            }
        }
        let start = self.g.group_first(flex * flexbg);
        let last_grp = (group | (flex - 1)).min(self.g.groups - 1);
        let last = self.g.group_last(last_grp);
        self.get_free_blocks(start, last, size)
            .or_else(|| self.get_free_blocks(start, last, elem_size))
            .or_else(|| self.get_free_blocks(0, last, elem_size))
            .unwrap_or(0)
    }

    /// `ext2fs_get_free_blocks2`: the first `num` free blocks starting at `b` in
    /// `start..finish` (wrapping to the first data block when `finish <= start`).
    pub(super) fn get_free_blocks(&self, start: u64, finish: u64, num: u64) -> Option<u64> {
        let fdb = self.g.first_data_block;
        let blocks = self.g.blocks_count;
        let mut b = if start == 0 { fdb } else { start };
        let finish = if finish == 0 { start } else { finish };
        let mut wraps = 0;
        loop {
            if b + num > blocks {
                if finish > start || wraps > 1 {
                    return None;
                }
                wraps += 1;
                b = fdb;
            }
            let Some(used) = self.used.first_used_in(b, b + num) else {
                return Some(b);
            };
            // Skip every start position whose range still meets this used run.
            let next = self.used.next_free(used).min(blocks.saturating_sub(num - 1).max(b + 1));
            if b < finish && finish <= next {
                return None;
            }
            b = next;
        }
    }

    /// `ext2fs_new_block2` + `ext2fs_block_alloc_stats2`: the first free block at or after
    /// `goal`, wrapping around.
    /// With bigalloc the goal rounds down to its cluster and a whole cluster is taken: the
    /// block returned is its first.
    pub(super) fn alloc_block(&mut self, goal: u64) -> Result<u64> {
        let fdb = self.g.first_data_block;
        let last = self.g.blocks_count - 1;
        let mask = self.g.cluster_blocks() - 1;
        let goal = if goal == 0 || goal > last { fdb } else { goal } & !mask;
        let block = self
            .used
            .first_free_in(goal, last)
            .or_else(|| if goal > fdb { self.used.first_free_in(fdb, goal - 1) } else { None })
            .ok_or(FsError::NoSpace)?;
        self.used.insert(block, mask + 1);
        self.touch_groups(block, mask + 1);
        Ok(block)
    }

    /// `ext2fs_new_range` with no flags: the free run at or after `goal` (wrapping), at most
    /// `len` long, claimed.
    pub(super) fn alloc_range(&mut self, goal: u64, len: u64) -> Result<(u64, u64)> {
        let fdb = self.g.first_data_block;
        let last = self.g.blocks_count - 1;
        let goal = if goal == 0 || goal > last { fdb } else { goal };
        // With bigalloc the bitmap finds clusters: a free block is its cluster's first, and
        // the run claims the clusters it touches.
        let mask = self.g.cluster_blocks() - 1;
        let start = self
            .used
            .first_free_in(goal, last)
            .or_else(|| self.used.first_free_in(fdb, last))
            .ok_or(FsError::NoSpace)?
            & !mask;
        let limit = (start + len - 1).min(last);
        let end = self.used.first_used_in(start, limit + 1).unwrap_or(limit + 1);
        let claimed = ((end - start) + mask) & !mask;
        self.used.insert(start, claimed);
        self.touch_groups(start, claimed);
        Ok((start, end - start))
    }

    /// `ext2fs_inode_alloc_stats2(ino, +1)`.
    pub(super) fn use_inode(&mut self, ino: u32, is_dir: bool) {
        let ipg = self.g.inodes_per_group;
        let group = ((ino - 1) / ipg) as usize;
        let state = &mut self.groups[group];
        state.inode_uninit = false;
        if is_dir {
            state.used_dirs += 1;
        }
        if self.g.group_desc_csum() {
            let group_base = group as u32 * ipg;
            let first_unused = ipg - state.itable_unused + group_base + 1;
            if ino >= first_unused {
                state.itable_unused = group_base + ipg - ino;
            }
        }
        assert!(!self.inodes_used.contains(&ino), "inode {ino} used twice");
        self.inodes_used.push(ino);
    }

    /// The files mke2fs creates after the tables, in its order.
    pub(super) fn create_files(&mut self) -> Result<Files> {
        // create_root_dir: ext2fs_mkdir with the goal of the root's flex group.
        let extents = self.g.features.incompat(feature::INCOMPAT_EXTENTS);
        let mut root = FileBlocks::new(extents);
        self.map_next(&mut root, self.inode_goal(ROOT_INO))?;
        self.use_inode(ROOT_INO, true);
        // create_lost_and_found: the first free inode, one block, then grown block by block.
        // With inline_data ext2fs_mkdir makes it inline (it is past the reserved inodes),
        // and the first ext2fs_expand_dir moves it into a block found from the start of the
        // file system (ext2fs_inline_data_dir_expand: ext2fs_new_block2 with goal 0): one
        // block fewer in the end.
        let lost_found_ino = FIRST_INO;
        let mut lost_found = FileBlocks::new(extents);
        let mut last = if self.g.features.incompat(feature::INCOMPAT_INLINE_DATA) {
            None
        } else {
            Some(self.map_next(&mut lost_found, self.inode_goal(lost_found_ino))?)
        };
        self.use_inode(lost_found_ino, true);
        let bs = self.g.block_size;
        let mut lpf_size = 0u32;
        for _ in 1..NDIR_BLOCKS {
            lpf_size += bs;
            if lpf_size >= LOST_FOUND_BYTES_MIN && lpf_size >= 2 * bs {
                break;
            }
            let goal = last.unwrap_or(self.g.first_data_block);
            last = Some(self.map_next(&mut lost_found, goal)?);
        }
        if lost_found.extents.len() > EXTENTS_IN_INODE {
            return Err(FsError::Unsupported("lost+found would need an extent tree".into()));
        }
        // reserve_inodes and create_bad_block_inode.
        for ino in ROOT_INO + 1..FIRST_INO {
            self.use_inode(ino, false);
        }
        self.use_inode(BAD_INO, false);
        // ext2fs_create_resize_inode makes the inode even when no GDT block is reserved.
        let resize_dind = if self.g.features.compat(feature::COMPAT_RESIZE_INODE) {
            let g = &self.g;
            let goal = g.first_data_block
                + g.desc_blocks
                + u64::from(g.reserved_gdt_blocks)
                + 2
                + g.inode_blocks_per_group;
            Some(self.alloc_block(goal)?)
        } else {
            None
        };
        let mut overhead = self.overhead_tables + self.g.first_data_block;
        let journal = if self.g.journal_blocks > 0 {
            overhead += u64::from(self.g.journal_blocks).div_ceil(self.g.cluster_blocks());
            self.create_journal()?
        } else {
            FileBlocks::default()
        };
        // ext2fs_mmp_init: the first free block from the start.
        let mmp_block = if self.g.features.incompat(feature::INCOMPAT_MMP) {
            Some(self.alloc_block(0)?)
        } else {
            None
        };
        // create_quota_inodes: root and lost+found are all there is to charge, to id 0.
        let quota = if self.g.features.ro_compat(feature::RO_COMPAT_QUOTA) {
            let bs = u64::from(self.g.block_size);
            let cluster = self.g.cluster_blocks();
            let space = (root.allocated(cluster) + lost_found.allocated(cluster)) * bs;
            self.create_quota_files(space, 2)?
        } else {
            Vec::new()
        };
        let orphan = if self.g.orphan_blocks > 0 { Some(self.create_orphan_file()?) } else { None };
        Ok(Files { root, lost_found, resize_dind, journal, orphan, mmp_block, quota, overhead })
    }

    /// `ext2fs_find_inode_goal` for an inode without blocks: its flex group's first block.
    pub(super) fn inode_goal(&self, ino: u32) -> u64 {
        let mut group = (ino - 1) / self.g.inodes_per_group;
        if self.g.flex_size > 0 {
            group &= !(self.g.flex_size - 1);
        }
        self.g.group_first(group)
    }

    /// `get_midpoint_journal_block`: the emptiest group around the middle of the disk.
    pub(super) fn journal_goal(&self) -> u64 {
        let g = &self.g;
        let free = |group: u32| {
            g.group_blocks(group) - {
                let first = g.group_first(group);
                self.used.count_in(first, first + g.group_blocks(group))
            }
        };
        let mut group = g.group_of((g.blocks_count - g.first_data_block) / 2);
        let log_flex = if g.flex_size > 0 { g.flex_size } else { 1 };
        let start = if g.flex_size > 0 && group > log_flex {
            group &= !(log_flex - 1);
            while group < g.groups && free(group) == 0 {
                group += 1;
            }
            if group == g.groups {
                group = 0;
            }
            group
        } else if group > 0 {
            group - 1
        } else {
            group
        };
        let end = if group + 1 < g.groups { group + 1 } else { group };
        let mut best = start;
        for candidate in start + 1..=end {
            if free(candidate) > free(best) {
                best = candidate;
            }
        }
        g.group_first(best)
    }

    /// `write_journal_inode` via `ext2fs_fallocate`: free runs from the goal on, each extent at
    /// most 32768 blocks; the fifth extent moves the tree into a leaf block placed just before
    /// the first extent if that block is free.
    pub(super) fn create_journal(&mut self) -> Result<FileBlocks> {
        if !self.g.features.incompat(feature::INCOMPAT_EXTENTS) {
            return self.create_indirect_journal();
        }
        let goal = self.journal_goal();
        let mut map = FileBlocks::default();
        let mut pblk = self.used.first_free_in(goal, self.g.blocks_count - 1).unwrap_or(goal);
        let mut remaining = u64::from(self.g.journal_blocks);
        let leaf_capacity =
            (self.g.block_size as usize - ext4::EXTENT_HEADER_SIZE) / ext4::EXTENT_ENTRY_SIZE;
        while remaining > 0 {
            let want = remaining.min(u64::from(ext4::EXTENT_LEN_INIT_MAX));
            let (start, len) = self.alloc_range(pblk, want)?;
            map.push(start, len as u32);
            if map.extents.len() > EXTENTS_IN_INODE && map.leaf.is_none() {
                let first = map.extents[0].1;
                map.leaf = Some(self.alloc_block(first - 1)?);
            }
            if map.extents.len() > leaf_capacity {
                return Err(FsError::Unsupported(format!(
                    "a journal of {} blocks would need more than one extent leaf",
                    self.g.journal_blocks
                )));
            }
            remaining -= len;
            pblk = start + len;
            if pblk >= self.g.blocks_count {
                pblk = self.g.first_data_block;
            }
        }
        Ok(map)
    }

    /// The journal without the extent feature (ext3): `ext2fs_fallocate` of a block-mapped
    /// inode maps one block at a time through `ext2fs_bmap2`, from the inode's goal (its
    /// group's first block; the midpoint goal is for extent-mapped journals only), each
    /// indirect block just before the first block it maps.
    fn create_indirect_journal(&mut self) -> Result<FileBlocks> {
        let mut map = FileBlocks::new(false);
        let mut last = self.inode_goal(JOURNAL_INO);
        for _ in 0..self.g.journal_blocks {
            last = self.map_next(&mut map, last)?;
        }
        Ok(map)
    }

    /// bigalloc's `implied_cluster_alloc` in `ext2fs_bmap2`: where `map` already maps a block
    /// of `logical`'s logical cluster, `logical` goes into that block's physical cluster,
    /// at its offset, without an allocation.
    fn implied_block(&self, map: &FileBlocks, logical: u64) -> Option<u64> {
        let n = self.g.cluster_blocks();
        if n == 1 {
            return None;
        }
        let first = logical - logical % n;
        (first..first + n).find_map(|l| map.physical(l).map(|p| p - l % n + logical % n))
    }

    /// `ext2fs_bmap2` with BMAP_ALLOC for `file`'s next logical block: with an indirect map,
    /// first the indirect blocks its pointer still lacks, each the first free block from the
    /// last one allocated on (`ext2fs_alloc_block` with the previous pointer as its goal, which
    /// in a run allocated in order is the same block), then the data block; with an extent
    /// map, the data block alone. `goal`: the block the data should follow.
    fn map_next(&mut self, file: &mut FileBlocks, goal: u64) -> Result<u64> {
        let logical = file.blocks();
        let Some(indirect) = file.indirect.as_mut() else {
            // expand_dir_proc: with bigalloc the next block of the last one's cluster, if it
            // is in the same cluster, without an allocation (a file mapped in order from a
            // cluster's first block, so its logical and physical clusters line up).
            let block = match self.implied_block(file, logical) {
                Some(block) => block,
                None => self.alloc_block(goal)?,
            };
            file.push(block, 1);
            return Ok(block);
        };
        let per_block = u64::from(self.g.block_size / 4);
        let path = Indirect::path(logical, per_block);
        let mut goal = goal;
        let mut at = Pointer::Slot(path[0]);
        for &index in &path[1..] {
            let mut block = u64::from(indirect.get(at));
            if block == 0 {
                block = self.alloc_block(goal)?;
                indirect.blocks.insert(block, vec![0; per_block as usize]);
                indirect.set(at, block as u32);
            }
            goal = block;
            at = Pointer::Entry(block, index);
        }
        let data = self.alloc_block(goal)?;
        indirect.set(at, data as u32);
        file.push(data, 1);
        Ok(data)
    }

    /// `quota_write_inode`: the user and group quota files in inodes 3 and 4, the project
    /// one (with the project feature) in the first free inode, each holding id 0's usage of
    /// `space` bytes and `inodes` inodes. ext2fs's file writes allocate a file system block
    /// when they first leave it, so blocks are placed in the order the tree code first writes
    /// to them (0, 2, 3, 4, 5, 1 with 1 KiB blocks), each from the block before it
    /// (`ext2fs_bmap2` with BMAP_ALLOC).
    fn create_quota_files(&mut self, space: u64, inodes: u64) -> Result<Vec<QuotaFileMade>> {
        let mut kinds = vec![QuotaType::User, QuotaType::Group];
        if self.g.features.ro_compat(feature::RO_COMPAT_PROJECT) {
            kinds.push(QuotaType::Project);
        }
        let extents = self.g.features.incompat(feature::INCOMPAT_EXTENTS);
        let per_block = u64::from(self.g.block_size) / QUOTA_BLOCK_SIZE as u64;
        let mut made = Vec::new();
        for kind in kinds {
            let ino = match kind {
                QuotaType::User => 3,
                QuotaType::Group => 4,
                QuotaType::Project => {
                    let ino = (FIRST_INO..=self.g.inodes_per_group * self.g.groups)
                        .find(|ino| !self.inodes_used.contains(ino))
                        .ok_or(FsError::NoSpace)?;
                    self.use_inode(ino, false);
                    ino
                }
            };
            let usage =
                DiskDquot { id: 0, curspace: space, curinodes: inodes, ..Default::default() };
            let file = MemQuotaFile::create(kind, &[usage]).map_err(FsError::OnDisk)?;
            let mut map = FileBlocks::new(extents);
            let mut placed: Vec<u64> = Vec::new();
            for &blk in &file.writes {
                let logical = u64::from(blk) / per_block;
                if placed.contains(&logical) {
                    continue;
                }
                placed.push(logical);
                let goal = match logical.checked_sub(1).and_then(|prev| map.physical(prev)) {
                    Some(prev) => prev,
                    None if logical == 0 => self.inode_goal(ino),
                    None => 0,
                };
                let block = match self.implied_block(&map, logical) {
                    Some(block) => block,
                    None => self.alloc_block(goal)?,
                };
                map.map_at(logical, block)?;
            }
            if map.extents.len() > EXTENTS_IN_INODE {
                return Err(FsError::Unsupported("a quota file would need an extent tree".into()));
            }
            made.push(QuotaFileMade { kind, ino, map, bytes: file.bytes() });
        }
        Ok(made)
    }

    /// `ext2fs_create_orphan_file`: the first free inode, blocks allocated one at a time from
    /// the first free block on.
    pub(super) fn create_orphan_file(&mut self) -> Result<(u32, FileBlocks)> {
        let ino = (FIRST_INO..=self.g.inodes_per_group * self.g.groups)
            .find(|ino| !self.inodes_used.contains(ino))
            .ok_or(FsError::NoSpace)?;
        self.use_inode(ino, false);
        let mut map = FileBlocks::default();
        let mut last = 0u64;
        for logical in 0..u64::from(self.g.orphan_blocks) {
            last = match self.implied_block(&map, logical) {
                Some(block) => block,
                None => self.alloc_block(last)?,
            };
            map.push(last, 1);
        }
        if map.extents.len() > EXTENTS_IN_INODE {
            return Err(FsError::Unsupported("the orphan file would need an extent tree".into()));
        }
        Ok((ino, map))
    }
}

impl FileBlocks {
    /// `i_block`: the extents themselves, one index to the leaf, or the block map's pointers.
    pub(super) fn inode_root(&self) -> [u8; ext4::INODE_BLOCK_SIZE] {
        let mut root = [0u8; ext4::INODE_BLOCK_SIZE];
        if let Some(indirect) = &self.indirect {
            for (slot, pointer) in indirect.slots.iter().enumerate() {
                root[slot * 4..slot * 4 + 4].copy_from_slice(&pointer.to_le_bytes());
            }
            return root;
        }
        let extents = self.as_extents();
        let in_inode = extents.len().min(EXTENTS_IN_INODE);
        let max = EXTENTS_IN_INODE as u16;
        let leaf_header =
            |entries: usize| ExtentHeader { entries: entries as u16, max, depth: 0, generation: 0 };
        match self.leaf {
            None => {
                assert!(extents.len() <= EXTENTS_IN_INODE, "extents overflow the inode");
                let entries = ExtentEntries::Leaf(extents);
                leaf_header(entries.len()).encode_node(&entries, &mut root);
            }
            Some(leaf) => {
                // ext2fs's split rewrites only the header and the first slot: the other slots
                // keep the extents the root held before. Reproduced so the inode (and
                // s_jnl_blocks) match mke2fs's byte for byte; readers ignore them.
                let before = ExtentEntries::Leaf(extents[..in_inode].to_vec());
                leaf_header(in_inode).encode_node(&before, &mut root);
                let index = ExtentEntries::Index(vec![ExtentIndex { logical: 0, leaf }]);
                let mut node = [0u8; ext4::INODE_BLOCK_SIZE];
                ExtentHeader { entries: 1, max, depth: 1, generation: 0 }
                    .encode_node(&index, &mut node);
                let first_slot = ext4::EXTENT_HEADER_SIZE + ext4::EXTENT_ENTRY_SIZE;
                root[..first_slot].copy_from_slice(&node[..first_slot]);
            }
        }
        root
    }
}
