//! Block groups: descriptors, bitmaps, and the block and inode allocators.
//!
//! Each group has its own lock ([`Groups::slots`]), so allocations in different groups run in
//! parallel; a thread holds at most one group lock at a time, and takes it after any inode
//! locks and before the journal's internal locks (see `filesystem.rs` for the whole order).
//!
//! Invariants:
//! - A group's descriptor in memory (`GroupState::desc`) equals what the last handle that
//!   changed it wrote into the descriptor table block; the table block, the bitmap and the
//!   descriptor change in the same handle, so a committed transaction never shows one without
//!   the other.
//! - Freed blocks are cleared in the bitmap at once (in the transaction that stops using them),
//!   but are not handed out again until that transaction is durable (`pending_free`). Otherwise
//!   file data written straight to a reused block could overwrite what the last durable state
//!   still owns, and a crash would show one file's data inside another.
//! - The global counters (`free_blocks`, `pending_blocks`, `reserved_blocks`) satisfy
//!   `reserved_blocks <= free_blocks - pending_blocks`, so a [`Reservation`] taken before a
//!   handle starts guarantees the allocations it covers succeed (no ENOSPC half way through an
//!   operation, which the journal could not roll back).
//! - Lazily initialized groups (BLOCK_UNINIT / INODE_UNINIT) get their bitmap built as the
//!   kernel's `ext4_init_block_bitmap` / `ext4_init_inode_bitmap` do the first time quill
//!   allocates from them, and the flag is cleared in the same handle.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use journal::{Buffer, Handle, Journal};
use ondisk::ext4::{self, GroupDesc, Superblock};
use ondisk::Tid;
use parking_lot::Mutex;

use crate::error::{FsError, Result};

/// The fixed shape of the file system, computed once from the superblock.
#[derive(Debug, Clone)]
pub(crate) struct Geometry {
    pub block_size: u32,
    pub blocks_count: u64,
    pub first_data_block: u32,
    pub blocks_per_group: u32,
    pub inodes_per_group: u32,
    pub inodes_count: u32,
    pub inode_size: u16,
    pub group_count: u32,
    pub desc_size: usize,
    pub descs_per_block: u32,
    pub itable_blocks: u32,
    /// Group descriptors carry checksums, so the UNINIT flags and itable_unused mean something.
    pub uninit_flags: bool,
    pub metadata_csum: bool,
    /// log2 of the blocks per allocation cluster (bigalloc; 0 otherwise). The block bitmaps,
    /// the descriptors' free counts and `pending_free` count clusters; every other count here
    /// (the global counters, reservations, what allocation returns) counts blocks.
    pub cluster_bits: u32,
    /// Bits of a block bitmap a group uses: its clusters (its blocks without bigalloc).
    pub clusters_per_group: u32,
}

impl Geometry {
    pub fn new(sb: &Superblock) -> Self {
        let block_size = sb.block_size();
        let desc_size = sb.desc_size();
        Geometry {
            block_size,
            blocks_count: sb.blocks_count,
            first_data_block: sb.first_data_block,
            blocks_per_group: sb.blocks_per_group,
            inodes_per_group: sb.inodes_per_group,
            inodes_count: sb.inodes_count,
            inode_size: sb.inode_size,
            group_count: sb.group_count(),
            desc_size,
            descs_per_block: (block_size as usize / desc_size) as u32,
            itable_blocks: (u64::from(sb.inodes_per_group) * u64::from(sb.inode_size))
                .div_ceil(u64::from(block_size)) as u32,
            uninit_flags: sb.has_group_desc_csum(),
            metadata_csum: sb.has_metadata_csum(),
            cluster_bits: sb.cluster_ratio().trailing_zeros(),
            clusters_per_group: if sb.has_bigalloc() {
                sb.clusters_per_group
            } else {
                sb.blocks_per_group
            },
        }
    }

    /// Blocks per allocation cluster (1 without bigalloc).
    pub fn cluster_blocks(&self) -> u32 {
        1 << self.cluster_bits
    }

    /// Blocks to reserve for `blocks` new metadata blocks: each takes a cluster.
    pub fn meta_blocks(&self, blocks: u64) -> u64 {
        blocks << self.cluster_bits
    }

    /// Blocks to reserve for `blocks` new data blocks in a row: whole clusters, one more for
    /// a run that starts inside one (none extra without bigalloc).
    pub fn data_blocks(&self, blocks: u64) -> u64 {
        if self.cluster_bits == 0 {
            return blocks;
        }
        let cluster = u64::from(self.cluster_blocks());
        blocks.div_ceil(cluster) * cluster + cluster
    }

    /// Bits of `group`'s block bitmap that stand for clusters of the file system (the last
    /// group may be short).
    pub fn clusters_in_group(&self, group: u32) -> u32 {
        self.blocks_in_group(group).div_ceil(self.cluster_blocks())
    }

    pub fn group_first_block(&self, group: u32) -> u64 {
        u64::from(self.first_data_block) + u64::from(group) * u64::from(self.blocks_per_group)
    }

    /// Blocks in `group` (the last group may be short).
    pub fn blocks_in_group(&self, group: u32) -> u32 {
        let first = self.group_first_block(group);
        (self.blocks_count - first).min(u64::from(self.blocks_per_group)) as u32
    }

    pub fn group_of_block(&self, block: u64) -> u32 {
        ((block - u64::from(self.first_data_block)) / u64::from(self.blocks_per_group)) as u32
    }

    pub fn group_of_inode(&self, ino: u32) -> u32 {
        (ino - 1) / self.inodes_per_group
    }

    /// The inode table block and byte offset of inode `ino`'s record.
    pub fn inode_location(&self, inode_table: u64, ino: u32) -> (u64, usize) {
        let index = (ino - 1) % self.inodes_per_group;
        let byte = u64::from(index) * u64::from(self.inode_size);
        (
            inode_table + byte / u64::from(self.block_size),
            (byte % u64::from(self.block_size)) as usize,
        )
    }
}

/// Where a group's bitmaps and inode table are; fixed for the file system's life.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GroupLayout {
    pub block_bitmap: u64,
    pub inode_bitmap: u64,
    pub inode_table: u64,
}

pub(crate) struct GroupState {
    pub desc: GroupDesc,
    /// Blocks freed by transactions that are not yet durable: group offset → (length, tid).
    pending_free: BTreeMap<u32, (u32, Tid)>,
    /// Inodes freed by the running transaction (or a newer one), or by one not yet durable:
    /// inode number → tid. A new inode given one of these numbers was in use at the last
    /// commit, which a fast commit's CREAT record would be replayed onto (`fsync_journal.rs`),
    /// and without a journal, may be in use still after a crash.
    freed_inodes: BTreeMap<u32, Tid>,
    /// Whether this mount has verified the block (0) and inode (1) bitmap's checksum.
    verified: [bool; 2],
}

/// Which of a group's two bitmaps.
#[derive(Debug, Clone, Copy)]
enum BitmapKind {
    Block = 0,
    Inode = 1,
}

impl BitmapKind {
    fn name(self) -> &'static str {
        match self {
            BitmapKind::Block => "block",
            BitmapKind::Inode => "inode",
        }
    }
}

/// Blocks set aside for one operation before its handle starts; unused blocks return to the
/// pool when it drops.
#[derive(Debug)]
pub(crate) struct Reservation {
    counters: Arc<Counters>,
    pub blocks: i64,
}

impl Reservation {
    /// Moves up to `blocks` of this reservation into a new one.
    pub fn split(&mut self, blocks: i64) -> Reservation {
        let moved = blocks.clamp(0, self.blocks.max(0));
        self.blocks -= moved;
        Reservation { counters: self.counters.clone(), blocks: moved }
    }

    /// Takes over `other`'s blocks.
    pub fn absorb(&mut self, mut other: Reservation) {
        self.blocks += std::mem::take(&mut other.blocks);
    }

    /// A reservation of `blocks` counted in `counters`, for unit tests of its holders.
    #[cfg(test)]
    pub fn for_tests(counters: Arc<Counters>, blocks: i64) -> Reservation {
        counters.reserved_blocks.fetch_add(blocks, Ordering::AcqRel);
        Reservation { counters, blocks }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.counters.reserved_blocks.fetch_sub(self.blocks, Ordering::AcqRel);
    }
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub free_blocks: AtomicI64,
    pub pending_blocks: AtomicI64,
    pub reserved_blocks: AtomicI64,
    pub free_inodes: AtomicI64,
    pub used_dirs: AtomicI64,
}

pub(crate) struct Groups {
    pub geo: Geometry,
    /// The superblock as opened: checksum seed, uuid and features for descriptor checksums.
    sb: Superblock,
    pub layouts: Vec<GroupLayout>,
    slots: Vec<Mutex<GroupState>>,
    /// Unlocked copies of each group's free counts, for choosing a group without locking all.
    free_blocks_hint: Vec<AtomicU32>,
    free_inodes_hint: Vec<AtomicU32>,
    pub counters: Arc<Counters>,
    /// The system zone (the kernel's `s_system_blks`): sorted, disjoint `[start, end)` ranges
    /// of every group's superblock backup and descriptor blocks, bitmaps and inode table. No
    /// allocation may hand these out and no free may release them, whatever a bitmap or an
    /// extent says.
    system_zone: Vec<(u64, u64)>,
    /// Blocks ordinary reservations leave free (ext4's `s_resv_clusters`: 2% of the file
    /// system or 4096 blocks, whichever is smaller), so that writing back delayed-allocation
    /// data, whose blocks were reserved when it was written, can still find blocks for the
    /// extent-tree nodes it needs.
    pub metadata_pool: i64,
    /// The last transaction that cleared a group's BLOCK_UNINIT or INODE_UNINIT flag, as
    /// `1 << 32 | tid` (0: none this mount). e2fsck 1.47.0 replays fast commits with the group
    /// descriptors it read before replaying the log (`fsync_journal.rs`).
    uninit_cleared: AtomicU64,
}

impl Groups {
    pub fn new(sb: &Superblock, descs: &[GroupDesc]) -> Result<Self> {
        let geo = Geometry::new(sb);
        let counters = Arc::new(Counters::default());
        let mut free_blocks = 0i64;
        let mut free_inodes = 0i64;
        let mut used_dirs = 0i64;
        for desc in descs {
            free_blocks += i64::from(desc.free_blocks) << geo.cluster_bits;
            free_inodes += i64::from(desc.free_inodes);
            used_dirs += i64::from(desc.used_dirs);
        }
        counters.free_blocks.store(free_blocks, Ordering::Release);
        counters.free_inodes.store(free_inodes, Ordering::Release);
        counters.used_dirs.store(used_dirs, Ordering::Release);
        let system_zone = system_zone(sb, descs, &geo);
        Ok(Groups {
            system_zone,
            layouts: descs
                .iter()
                .map(|d| GroupLayout {
                    block_bitmap: d.block_bitmap,
                    inode_bitmap: d.inode_bitmap,
                    inode_table: d.inode_table,
                })
                .collect(),
            free_blocks_hint: descs.iter().map(|d| AtomicU32::new(d.free_blocks)).collect(),
            free_inodes_hint: descs.iter().map(|d| AtomicU32::new(d.free_inodes)).collect(),
            slots: descs
                .iter()
                .map(|d| {
                    Mutex::new(GroupState {
                        desc: *d,
                        pending_free: BTreeMap::new(),
                        freed_inodes: BTreeMap::new(),
                        verified: [false; 2],
                    })
                })
                .collect(),
            geo,
            sb: sb.clone(),
            counters,
            metadata_pool: (sb.blocks_count / 50).min(4096) as i64,
            uninit_cleared: AtomicU64::new(0),
        })
    }

    /// Sets aside `blocks` blocks for an operation, or fails with NoSpace. When only blocks
    /// freed by not-yet-durable transactions stand in the way, waits for them to become durable
    /// (the caller holds no handle) and tries again, as ext4_should_retry_alloc does.
    pub fn reserve(&self, journal: &Journal, blocks: u64) -> Result<Reservation> {
        self.reserve_above(journal, blocks, self.metadata_pool)
    }

    /// Reserves as many of `blocks` as are available, down to none (never waits or fails):
    /// the extent-tree blocks a writeback step may need, from the metadata pool. A step that
    /// needs a tree block and got none allocates unreserved; the pool exists so that this is
    /// rare.
    pub fn reserve_up_to(&self, blocks: u64) -> Reservation {
        let c = &self.counters;
        let mut reserved = c.reserved_blocks.load(Ordering::Acquire);
        loop {
            let available = c.free_blocks.load(Ordering::Acquire)
                - c.pending_blocks.load(Ordering::Acquire)
                - reserved;
            let take = (blocks as i64).min(available.max(0));
            match c.reserved_blocks.compare_exchange(
                reserved,
                reserved + take,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Reservation { counters: c.clone(), blocks: take },
                Err(now) => reserved = now,
            }
        }
    }

    /// An empty reservation (to gather blocks into with [`Reservation::absorb`]).
    pub fn no_reservation(&self) -> Reservation {
        Reservation { counters: self.counters.clone(), blocks: 0 }
    }

    /// Reserves `blocks` if that leaves at least `floor` blocks available.
    fn reserve_above(&self, journal: &Journal, blocks: u64, floor: i64) -> Result<Reservation> {
        let want = blocks as i64;
        if want == 0 {
            // Nothing to set aside: even a file system whose pool is drawn on can do it.
            return Ok(self.no_reservation());
        }
        for attempt in 0..3 {
            let c = &self.counters;
            let mut reserved = c.reserved_blocks.load(Ordering::Acquire);
            loop {
                let available = c.free_blocks.load(Ordering::Acquire)
                    - c.pending_blocks.load(Ordering::Acquire)
                    - reserved
                    - floor;
                if available < want {
                    break;
                }
                match c.reserved_blocks.compare_exchange(
                    reserved,
                    reserved + want,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => return Ok(Reservation { counters: c.clone(), blocks: want }),
                    Err(now) => reserved = now,
                }
            }
            if c.pending_blocks.load(Ordering::Acquire) == 0 || attempt == 2 {
                break;
            }
            // Make the frees durable, then drop them from every group's pending set.
            journal.commit_all()?;
            let durable = journal.last_durable();
            for slot in &self.slots {
                let mut state = slot.lock();
                self.sweep_pending(&mut state, durable);
            }
        }
        Err(FsError::NoSpace)
    }

    fn sweep_pending(&self, state: &mut GroupState, durable: Tid) {
        let before: u64 = state.pending_free.values().map(|(len, _)| u64::from(*len)).sum();
        state.pending_free.retain(|_, (_, tid)| !durable.is_at_or_after(*tid));
        let after: u64 = state.pending_free.values().map(|(len, _)| u64::from(*len)).sum();
        let blocks = ((before - after) << self.geo.cluster_bits) as i64;
        self.counters.pending_blocks.fetch_sub(blocks, Ordering::AcqRel);
    }

    /// Allocates up to `want` contiguous blocks, preferring `goal`; returns (first, count).
    /// Searches the goal's group from the goal, then the following groups. With bigalloc it
    /// hands out whole clusters: `first` is a cluster's first block and `count` a multiple of
    /// the cluster size, at least `want` rounded up to one when the space is there.
    pub fn alloc_blocks(
        &self,
        journal: &Journal,
        handle: &mut Handle,
        reservation: &mut Reservation,
        goal: u64,
        want: u32,
    ) -> Result<(u64, u32)> {
        assert!(want > 0);
        let geo = &self.geo;
        let goal = if goal < u64::from(geo.first_data_block) || goal >= geo.blocks_count {
            u64::from(geo.first_data_block)
        } else {
            goal
        };
        let goal_group = geo.group_of_block(goal);
        let bits = geo.cluster_bits;
        let want = want.min(reservation.blocks.max(1) as u32).div_ceil(geo.cluster_blocks());
        for step in 0..geo.group_count {
            let group = (goal_group + step) % geo.group_count;
            if self.free_blocks_hint[group as usize].load(Ordering::Relaxed) == 0 {
                continue;
            }
            let start =
                if step == 0 { ((goal - geo.group_first_block(group)) >> bits) as u32 } else { 0 };
            if let Some((offset, len)) = self.alloc_in_group(journal, handle, group, start, want)? {
                let blocks = len << bits;
                let consumed = i64::from(blocks).min(reservation.blocks);
                reservation.blocks -= consumed;
                self.counters.reserved_blocks.fetch_sub(consumed, Ordering::AcqRel);
                return Ok((geo.group_first_block(group) + (u64::from(offset) << bits), blocks));
            }
        }
        Err(FsError::NoSpace)
    }

    fn alloc_in_group(
        &self,
        journal: &Journal,
        handle: &mut Handle,
        group: u32,
        start: u32,
        want: u32,
    ) -> Result<Option<(u32, u32)>> {
        let mut state = self.slots[group as usize].lock();
        if state.desc.free_blocks == 0 {
            return Ok(None);
        }
        let durable = journal.last_durable();
        if !state.pending_free.is_empty() {
            self.sweep_pending(&mut state, durable);
        }
        let bitmap = self.bitmap(journal, group, &mut state, BitmapKind::Block)?;
        let limit = self.geo.clusters_in_group(group);
        let found = bitmap.read(|bits| {
            let is_free =
                |i: u32| bits[(i / 8) as usize] & (1 << (i % 8)) == 0 && !pending_covers(&state, i);
            let first = next_allocatable(bits, &state, start, limit)
                .or_else(|| next_allocatable(bits, &state, 0, start.min(limit)))?;
            let mut len = 1;
            while len < want && first + len < limit && is_free(first + len) {
                len += 1;
            }
            Some((first, len))
        });
        let Some((offset, len)) = found else {
            return Ok(None);
        };
        // ext4_mb_mark_diskspace_used: a bitmap that offers metadata blocks is corrupted, and
        // handing them out would overwrite the metadata.
        let bits = self.geo.cluster_bits;
        let first = self.geo.group_first_block(group) + (u64::from(offset) << bits);
        if let Some(meta) = self.system_zone_overlap(first, u64::from(len) << bits) {
            return Err(FsError::corrupted(
                bitmap.block(),
                format!("group {group}: the block bitmap marks metadata block {meta} free"),
            ));
        }
        let csum = handle.modify(&bitmap, |bits| {
            for i in offset..offset + len {
                bits[(i / 8) as usize] |= 1 << (i % 8);
            }
            self.bitmap_csum(BitmapKind::Block, bits)
        })?;
        let desc = &mut state.desc;
        desc.free_blocks -= len;
        desc.block_bitmap_csum = csum;
        desc.flags &= !ext4::BG_BLOCK_UNINIT;
        self.write_desc(journal, handle, group, desc)?;
        self.free_blocks_hint[group as usize].store(desc.free_blocks, Ordering::Relaxed);
        self.counters.free_blocks.fetch_sub(i64::from(len) << bits, Ordering::AcqRel);
        Ok(Some((offset, len)))
    }

    /// Frees `count` blocks from `start` (which may span groups) in `handle`'s transaction.
    /// Freeing a block that is already free is corruption (a doubly owned block): the caller's
    /// metadata and the bitmap disagree. With bigalloc the range must be whole clusters (the
    /// callers decide when a cluster's last block goes: `block_map::free_runs`).
    pub fn free_blocks(
        &self,
        journal: &Journal,
        handle: &mut Handle,
        start: u64,
        count: u64,
    ) -> Result<()> {
        let geo = &self.geo;
        let end = start.checked_add(count).filter(|&e| e <= geo.blocks_count);
        if start < u64::from(geo.first_data_block) || end.is_none() {
            return Err(FsError::BlockOutOfRange { block: start, blocks_count: geo.blocks_count });
        }
        let mask = u64::from(geo.cluster_blocks()) - 1;
        if start & mask != 0 || count & mask != 0 {
            return Err(FsError::Invalid(format!(
                "freeing blocks {start}+{count}: not whole clusters of {} blocks",
                mask + 1
            )));
        }
        // ext4_free_blocks: "freeing blocks not in datazone" (an extent or xattr block that
        // claims metadata blocks must not release them).
        if let Some(meta) = self.system_zone_overlap(start, count) {
            return Err(FsError::corrupted(
                start,
                format!("freeing blocks {start}+{count}, which include metadata block {meta}"),
            ));
        }
        let mut block = start;
        let end = start + count;
        while block < end {
            let group = geo.group_of_block(block);
            let group_end = geo.group_first_block(group) + u64::from(geo.blocks_in_group(group));
            let piece_end = end.min(group_end);
            let offset = ((block - geo.group_first_block(group)) >> geo.cluster_bits) as u32;
            let len = (piece_end - block).div_ceil(u64::from(geo.cluster_blocks())) as u32;
            self.free_in_group(journal, handle, group, offset, len)?;
            block = piece_end;
        }
        Ok(())
    }

    fn free_in_group(
        &self,
        journal: &Journal,
        handle: &mut Handle,
        group: u32,
        offset: u32,
        len: u32,
    ) -> Result<()> {
        let mut state = self.slots[group as usize].lock();
        let bitmap = self.bitmap(journal, group, &mut state, BitmapKind::Block)?;
        let all_set = bitmap.read(|bits| {
            (offset..offset + len).all(|i| bits[(i / 8) as usize] & (1 << (i % 8)) != 0)
        });
        if !all_set {
            return Err(FsError::corrupted(
                bitmap.block(),
                format!("group {group}: freeing blocks {offset}+{len} that are already free"),
            ));
        }
        let csum = handle.modify(&bitmap, |bits| {
            for i in offset..offset + len {
                bits[(i / 8) as usize] &= !(1 << (i % 8));
            }
            self.bitmap_csum(BitmapKind::Block, bits)
        })?;
        let desc = &mut state.desc;
        desc.free_blocks += len;
        desc.block_bitmap_csum = csum;
        self.write_desc(journal, handle, group, desc)?;
        self.free_blocks_hint[group as usize].store(desc.free_blocks, Ordering::Relaxed);
        state.pending_free.insert(offset, (len, handle.tid()));
        let blocks = i64::from(len) << self.geo.cluster_bits;
        self.counters.pending_blocks.fetch_add(blocks, Ordering::AcqRel);
        self.counters.free_blocks.fetch_add(blocks, Ordering::AcqRel);
        Ok(())
    }

    /// Allocates an inode number. Directories go to the group with the most free inodes and
    /// blocks among those with at least average free inodes (spreading the tree, as Orlov
    /// does for top-level directories); files go to their parent's group or the next with room.
    pub fn alloc_inode(
        &self,
        journal: &Journal,
        handle: &mut Handle,
        parent_group: u32,
        is_dir: bool,
    ) -> Result<u32> {
        let groups = self.geo.group_count;
        let first = if is_dir { self.pick_dir_group(parent_group) } else { parent_group };
        for step in 0..groups {
            let group = (first + step) % groups;
            if self.free_inodes_hint[group as usize].load(Ordering::Relaxed) == 0 {
                continue;
            }
            if let Some(ino) = self.alloc_inode_in_group(journal, handle, group, is_dir)? {
                return Ok(ino);
            }
        }
        Err(FsError::NoSpace)
    }

    fn pick_dir_group(&self, parent_group: u32) -> u32 {
        let groups = self.geo.group_count;
        let avg_inodes =
            (self.counters.free_inodes.load(Ordering::Relaxed).max(0) as u64) / u64::from(groups);
        let mut best = parent_group;
        let mut best_blocks = 0u32;
        for step in 0..groups {
            let group = (parent_group + step) % groups;
            let inodes = self.free_inodes_hint[group as usize].load(Ordering::Relaxed);
            let blocks = self.free_blocks_hint[group as usize].load(Ordering::Relaxed);
            if u64::from(inodes) >= avg_inodes.max(1) && blocks > best_blocks {
                best = group;
                best_blocks = blocks;
            }
        }
        best
    }

    fn alloc_inode_in_group(
        &self,
        journal: &Journal,
        handle: &mut Handle,
        group: u32,
        is_dir: bool,
    ) -> Result<Option<u32>> {
        let geo = &self.geo;
        let mut state = self.slots[group as usize].lock();
        if state.desc.free_inodes == 0 {
            return Ok(None);
        }
        // Like ext4_new_inode: a group whose block bitmap was never built gets it now.
        if geo.uninit_flags && state.desc.flags & ext4::BG_BLOCK_UNINIT != 0 {
            let bitmap = self.bitmap(journal, group, &mut state, BitmapKind::Block)?;
            let csum = handle.modify(&bitmap, |bits| self.bitmap_csum(BitmapKind::Block, bits))?;
            state.desc.block_bitmap_csum = csum;
            state.desc.flags &= !ext4::BG_BLOCK_UNINIT;
        }
        let bitmap = self.bitmap(journal, group, &mut state, BitmapKind::Inode)?;
        // Reserved inodes (below s_first_ino) are never handed out.
        let first_ino = self.sb.first_ino;
        let base = group * geo.inodes_per_group;
        // With fast commits, a number the running transaction freed is taken last: a file
        // given it could not be fast-committed (`Groups::inode_freed_in`). Without a journal,
        // so is a number any transaction not yet durable freed: its commit may be half on the
        // device when a crash comes, the freed inode's names still there, and e2fsck must not
        // find them naming the new file.
        let tid = handle.tid();
        let durable = journal.last_durable();
        let logless = journal.is_logless();
        let avoid = |index: u32| match state.freed_inodes.get(&(base + index + 1)) {
            Some(freed) if logless => freed.is_after(durable),
            Some(freed) => journal.fast_commits_enabled() && *freed == tid,
            None => false,
        };
        let found = bitmap.read(|bits| {
            let reserved_below = first_ino.saturating_sub(base + 1).min(geo.inodes_per_group);
            let first = next_clear_bit(bits, reserved_below, geo.inodes_per_group)?;
            let mut index = first;
            while avoid(index) {
                match next_clear_bit(bits, index + 1, geo.inodes_per_group) {
                    Some(next) => index = next,
                    None => return Some(first),
                }
            }
            Some(index)
        });
        let Some(index) = found else {
            return Err(FsError::corrupted(
                bitmap.block(),
                format!(
                    "group {group}: descriptor says {} inodes free, bitmap none",
                    state.desc.free_inodes
                ),
            ));
        };
        // The bitmap is all the kernel consults here; one that hides an inode in use would
        // make the new inode overwrite it. Where the table was initialised, the record must
        // say the inode is free (no links).
        let ino = base + index + 1;
        let used = geo.inodes_per_group - state.desc.itable_unused.min(geo.inodes_per_group);
        let initialised =
            !geo.uninit_flags || (state.desc.flags & ext4::BG_INODE_UNINIT == 0 && index < used);
        if initialised {
            let byte = u64::from(index) * u64::from(geo.inode_size);
            let block = self.layouts[group as usize].inode_table + byte / u64::from(geo.block_size);
            let at = (byte % u64::from(geo.block_size)) as usize + INODE_LINKS_OFFSET;
            let links =
                journal.read_buffer(block)?.read(|b| u16::from_le_bytes([b[at], b[at + 1]]));
            if links != 0 {
                // After an abort, an operation the abort cut short may have freed the bit in
                // memory without its inode write (unmake_inode under errors): that is the
                // abort's error, not a corrupted image (seen once in the journal-EIO fault test,
                // preset fast18, not reproduced by its seed).
                journal.check_aborted()?;
                return Err(FsError::corrupted(
                    bitmap.block(),
                    format!("group {group}: the inode bitmap marks inode {ino} free, but it has {links} links"),
                ));
            }
        }
        let csum = handle.modify(&bitmap, |bits| {
            bits[(index / 8) as usize] |= 1 << (index % 8);
            self.bitmap_csum(BitmapKind::Inode, bits)
        })?;
        let desc = &mut state.desc;
        desc.free_inodes -= 1;
        desc.inode_bitmap_csum = csum;
        desc.flags &= !ext4::BG_INODE_UNINIT;
        if is_dir {
            desc.used_dirs += 1;
        }
        if geo.uninit_flags {
            let used = geo.inodes_per_group - desc.itable_unused.min(geo.inodes_per_group);
            if index + 1 > used {
                desc.itable_unused = geo.inodes_per_group - (index + 1);
            }
        }
        self.write_desc(journal, handle, group, desc)?;
        self.free_inodes_hint[group as usize].store(desc.free_inodes, Ordering::Relaxed);
        self.counters.free_inodes.fetch_sub(1, Ordering::AcqRel);
        if is_dir {
            self.counters.used_dirs.fetch_add(1, Ordering::AcqRel);
        }
        Ok(Some(ino))
    }

    pub fn free_inode(
        &self,
        journal: &Journal,
        handle: &mut Handle,
        ino: u32,
        is_dir: bool,
    ) -> Result<()> {
        let geo = &self.geo;
        let group = geo.group_of_inode(ino);
        let index = (ino - 1) % geo.inodes_per_group;
        let mut state = self.slots[group as usize].lock();
        let bitmap = self.bitmap(journal, group, &mut state, BitmapKind::Inode)?;
        let was_set = bitmap.read(|bits| bits[(index / 8) as usize] & (1 << (index % 8)) != 0);
        if !was_set {
            return Err(FsError::corrupted(
                bitmap.block(),
                format!("freeing inode {ino}, which the bitmap says is free"),
            ));
        }
        let csum = handle.modify(&bitmap, |bits| {
            bits[(index / 8) as usize] &= !(1 << (index % 8));
            self.bitmap_csum(BitmapKind::Inode, bits)
        })?;
        let desc = &mut state.desc;
        desc.free_inodes += 1;
        desc.inode_bitmap_csum = csum;
        if is_dir {
            desc.used_dirs = desc.used_dirs.saturating_sub(1);
            self.counters.used_dirs.fetch_sub(1, Ordering::AcqRel);
        }
        self.write_desc(journal, handle, group, desc)?;
        self.free_inodes_hint[group as usize].store(desc.free_inodes, Ordering::Relaxed);
        self.counters.free_inodes.fetch_add(1, Ordering::AcqRel);
        // Frees of older transactions no longer matter: every later allocation is in `tid` or
        // a newer one, and those transactions commit before any fast commit of it is written;
        // without a journal, once they are durable.
        let tid = handle.tid();
        let durable = journal.last_durable();
        state.freed_inodes.retain(|_, freed| freed.is_at_or_after(tid) || freed.is_after(durable));
        state.freed_inodes.insert(ino, tid);
        Ok(())
    }

    /// Whether inode number `ino` was freed by transaction `tid`: in use at the commit before it.
    pub fn inode_freed_in(&self, ino: u32, tid: Tid) -> bool {
        let group = self.geo.group_of_inode(ino);
        self.slots[group as usize].lock().freed_inodes.get(&ino) == Some(&tid)
    }

    /// Checks, changing nothing, that inode `ino` (if any) and the blocks `start..start+count`
    /// of each range are marked in use by their groups' bitmaps (read and verified): what
    /// [`Groups::free_inode`] and [`Groups::free_blocks`] will require, so that a deletion
    /// finds a bitmap that disagrees before its first change.
    pub fn check_in_use(
        &self,
        journal: &Journal,
        ino: Option<u32>,
        ranges: &[(u64, u64)],
    ) -> Result<()> {
        let geo = &self.geo;
        if let Some(ino) = ino {
            let group = geo.group_of_inode(ino);
            let index = (ino - 1) % geo.inodes_per_group;
            let mut state = self.slots[group as usize].lock();
            let bitmap = self.bitmap(journal, group, &mut state, BitmapKind::Inode)?;
            if !bitmap.read(|bits| bits[(index / 8) as usize] & (1 << (index % 8)) != 0) {
                return Err(FsError::corrupted(
                    bitmap.block(),
                    format!("inode {ino} is in use but the bitmap says it is free"),
                ));
            }
        }
        for &(start, count) in ranges {
            let end = start.saturating_add(count).min(geo.blocks_count);
            let mut block = start.max(u64::from(geo.first_data_block));
            while block < end {
                let group = geo.group_of_block(block);
                let first = geo.group_first_block(group);
                let piece_end = end.min(first + u64::from(geo.blocks_in_group(group)));
                let cluster = u64::from(geo.cluster_blocks());
                let from = ((block - first) / cluster) as u32;
                let to = (piece_end - first).div_ceil(cluster) as u32;
                let mut state = self.slots[group as usize].lock();
                let bitmap = self.bitmap(journal, group, &mut state, BitmapKind::Block)?;
                let all_set = bitmap
                    .read(|bits| (from..to).all(|i| bits[(i / 8) as usize] & (1 << (i % 8)) != 0));
                if !all_set {
                    return Err(FsError::corrupted(
                        bitmap.block(),
                        format!("group {group}: blocks in use in {from}..{to} are marked free"),
                    ));
                }
                block = piece_end;
            }
        }
        Ok(())
    }

    /// The group's block or inode bitmap buffer. A lazily initialized (UNINIT) bitmap is built
    /// in memory, not yet journaled. A bitmap read from disk has its checksum verified the first
    /// time this mount reads it; after that only handles holding the group lock change it, and
    /// they keep the descriptor's checksum in step, so verifying again on every allocation
    /// would recompute the same crc for nothing.
    fn bitmap(
        &self,
        journal: &Journal,
        group: u32,
        state: &mut GroupState,
        kind: BitmapKind,
    ) -> Result<Arc<Buffer>> {
        let layout = &self.layouts[group as usize];
        let (block, uninit_flag, stored) = match kind {
            BitmapKind::Block => {
                (layout.block_bitmap, ext4::BG_BLOCK_UNINIT, state.desc.block_bitmap_csum)
            }
            BitmapKind::Inode => {
                (layout.inode_bitmap, ext4::BG_INODE_UNINIT, state.desc.inode_bitmap_csum)
            }
        };
        if self.geo.uninit_flags && state.desc.flags & uninit_flag != 0 {
            let buffer = journal.new_buffer(block);
            let image = match kind {
                BitmapKind::Block => self.uninit_block_bitmap(group),
                BitmapKind::Inode => self.uninit_inode_bitmap(),
            };
            buffer.init_if_zero(&image);
            return Ok(buffer);
        }
        let buffer = journal.read_buffer(block)?;
        let verified = &mut state.verified[kind as usize];
        if self.geo.metadata_csum && !*verified {
            let crc = buffer.read(|bits| self.bitmap_csum(kind, bits));
            let ok =
                if self.geo.desc_size >= 64 { crc == stored } else { crc as u16 == stored as u16 };
            if !ok {
                return Err(FsError::corrupted(
                    block,
                    format!("group {group}: {} bitmap checksum mismatch", kind.name()),
                ));
            }
        }
        *verified = true;
        Ok(buffer)
    }

    fn bitmap_csum(&self, kind: BitmapKind, bits: &[u8]) -> u32 {
        let per_group = match kind {
            BitmapKind::Block => self.geo.clusters_per_group,
            BitmapKind::Inode => self.geo.inodes_per_group,
        };
        ext4::bitmap_checksum(&self.sb, &bits[..(per_group / 8) as usize])
    }

    /// `ext4_init_inode_bitmap`: no inode used, the bits past the group's inodes set.
    pub(crate) fn uninit_inode_bitmap(&self) -> Vec<u8> {
        let mut image = vec![0u8; self.geo.block_size as usize];
        mark_bitmap_end(&mut image, self.geo.inodes_per_group);
        image
    }

    /// `ext4_init_block_bitmap`: the group's own superblock backup and descriptor blocks, every
    /// group's bitmaps and inode table that live inside this group (flex_bg packs them), and the
    /// bits past the end of a short last group.
    pub(crate) fn uninit_block_bitmap(&self, group: u32) -> Vec<u8> {
        let geo = &self.geo;
        let mut bits = vec![0u8; geo.block_size as usize];
        let first = geo.group_first_block(group);
        let in_group = geo.blocks_in_group(group);
        let mut mark = |block: u64, len: u64| {
            for b in block..block + len {
                if b >= first && b < first + u64::from(in_group) {
                    let i = ((b - first) >> geo.cluster_bits) as usize;
                    bits[i / 8] |= 1 << (i % 8);
                }
            }
        };
        mark(first, u64::from(self.sb.group_base_meta_blocks(group)));
        for layout in &self.layouts {
            mark(layout.block_bitmap, 1);
            mark(layout.inode_bitmap, 1);
            mark(layout.inode_table, u64::from(geo.itable_blocks));
        }
        mark_bitmap_end(&mut bits, geo.clusters_in_group(group));
        bits
    }

    /// Writes `desc` into group `group`'s slot of the descriptor table, with its checksum.
    pub fn write_desc(
        &self,
        journal: &Journal,
        handle: &mut Handle,
        group: u32,
        desc: &GroupDesc,
    ) -> Result<()> {
        let geo = &self.geo;
        let table_block = self.sb.group_desc_block(group / geo.descs_per_block);
        let offset = (group % geo.descs_per_block) as usize * geo.desc_size;
        let buffer = journal.read_buffer(table_block)?;
        let uninit = ext4::BG_BLOCK_UNINIT | ext4::BG_INODE_UNINIT;
        let cleared = handle.modify(&buffer, |bytes| {
            let raw = &mut bytes[offset..offset + geo.desc_size];
            let old_flags = GroupDesc::parse(raw, geo.desc_size).map_or(0, |old| old.flags);
            desc.encode_into(raw, geo.desc_size);
            ext4::set_group_desc_checksum(&self.sb, group, raw);
            old_flags & uninit & !desc.flags != 0
        })?;
        if cleared {
            self.uninit_cleared.store(1 << 32 | u64::from(handle.tid().0), Ordering::Release);
        }
        Ok(())
    }

    /// The last transaction of this mount that cleared a group's BLOCK_UNINIT or INODE_UNINIT.
    pub fn uninit_cleared(&self) -> Option<Tid> {
        let v = self.uninit_cleared.load(Ordering::Acquire);
        (v != 0).then_some(Tid(v as u32))
    }

    /// The first block of `start .. start + len` that belongs to the system zone (a superblock
    /// or descriptor block, a bitmap, an inode table), if any: file data or tree blocks mapped
    /// there are corruption (the kernel's `ext4_inode_block_valid`).
    pub fn system_zone_overlap(&self, start: u64, len: u64) -> Option<u64> {
        let end = start.saturating_add(len);
        let i = self.system_zone.partition_point(|&(_, zone_end)| zone_end <= start);
        let &(zone_start, _) = self.system_zone.get(i)?;
        (zone_start < end).then(|| zone_start.max(start))
    }

    /// Free blocks not set aside: neither freed by a transaction that is not durable yet, nor
    /// reserved (delayed-allocation data waiting for writeback, operations in progress).
    pub fn available_blocks(&self) -> u64 {
        let c = &self.counters;
        (c.free_blocks.load(Ordering::Acquire)
            - c.pending_blocks.load(Ordering::Acquire)
            - c.reserved_blocks.load(Ordering::Acquire))
        .max(0) as u64
    }
}

fn pending_covers(state: &GroupState, offset: u32) -> bool {
    pending_end(state, offset).is_some()
}

/// The end of the pending-free range that covers `offset`, if one does.
fn pending_end(state: &GroupState, offset: u32) -> Option<u32> {
    state
        .pending_free
        .range(..=offset)
        .next_back()
        .map(|(&start, &(len, _))| start + len)
        .filter(|&end| offset < end)
}

/// The first clear bit of `bits` in `from..limit`. Whole bytes of set bits are skipped eight
/// bytes at a time: an allocator scanning a nearly full group bit by bit spent a tenth of
/// tokubench's time here.
fn next_clear_bit(bits: &[u8], from: u32, limit: u32) -> Option<u32> {
    let mut i = from;
    while i < limit {
        if i.is_multiple_of(64) && i + 64 <= limit {
            let at = (i / 8) as usize;
            let word = u64::from_le_bytes(bits[at..at + 8].try_into().expect("eight bytes"));
            if word == u64::MAX {
                i += 64;
                continue;
            }
            // The lowest clear bit of the word (bit k of byte j is bit 8j + k).
            return Some(i + (!word).trailing_zeros());
        }
        if bits[(i / 8) as usize] & (1 << (i % 8)) == 0 {
            return Some(i);
        }
        i += 1;
    }
    None
}

/// The first block in `from..limit` that is clear in `bits` and not pending free (freed by a
/// transaction not yet durable); pending ranges are stepped over whole.
fn next_allocatable(bits: &[u8], state: &GroupState, from: u32, limit: u32) -> Option<u32> {
    let mut at = from;
    while let Some(free) = next_clear_bit(bits, at, limit) {
        match pending_end(state, free) {
            Some(end) => at = end,
            None => return Some(free),
        }
    }
    None
}

/// Byte offset of `i_links_count` in an inode record.
const INODE_LINKS_OFFSET: usize = 0x1A;

/// The system zone of a file system: every group's superblock backup with its descriptor and
/// reserved descriptor blocks, block and inode bitmaps and inode table, as sorted, merged
/// `[start, end)` ranges (clamped to the file system).
fn system_zone(sb: &Superblock, descs: &[GroupDesc], geo: &Geometry) -> Vec<(u64, u64)> {
    let mut ranges = Vec::with_capacity(descs.len() * 3 + 1);
    let mut add = |start: u64, len: u64| {
        let end = start.saturating_add(len).min(geo.blocks_count);
        if start < end {
            ranges.push((start, end));
        }
    };
    // Block 0 holds the boot sector and, with 1 KiB blocks, lies before group 0 (or, with
    // bigalloc, is group 0's first block: its superblock is block 1, its tables follow).
    add(0, u64::from(geo.first_data_block));
    for (group, desc) in descs.iter().enumerate() {
        let group = group as u32;
        let first = geo.group_first_block(group);
        let boot = if group == 0 { sb.superblock_block().saturating_sub(first) } else { 0 };
        add(first, boot + u64::from(sb.group_base_meta_blocks(group)));
        add(desc.block_bitmap, 1);
        add(desc.inode_bitmap, 1);
        add(desc.inode_table, u64::from(geo.itable_blocks));
    }
    ranges.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (start, end) in ranges {
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    merged
}

/// Sets the padding bits from `used` to the end of the bitmap block (`ext4_mark_bitmap_end`).
fn mark_bitmap_end(bits: &mut [u8], used: u32) {
    for i in used as usize..bits.len() * 8 {
        bits[i / 8] |= 1 << (i % 8);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bit-by-bit answer the word-skipping scan must give.
    fn slow_clear_bit(bits: &[u8], from: u32, limit: u32) -> Option<u32> {
        (from..limit).find(|&i| bits[(i / 8) as usize] & (1 << (i % 8)) == 0)
    }

    #[test]
    fn the_word_skipping_scan_finds_what_a_bit_by_bit_scan_finds() {
        let mut rng = ondisk::testing::Rng::new(7);
        for _ in 0..2000 {
            let mut bits = vec![0xFFu8; 64];
            // A few clear bits anywhere, sometimes none.
            for _ in 0..rng.below(4) {
                let i = rng.below(512) as usize;
                bits[i / 8] &= !(1 << (i % 8));
            }
            let from = rng.below(512) as u32;
            let limit = from + rng.below(513 - u64::from(from)) as u32;
            assert_eq!(
                next_clear_bit(&bits, from, limit),
                slow_clear_bit(&bits, from, limit),
                "{bits:x?} from {from} limit {limit}"
            );
        }
    }

    #[test]
    fn pending_free_blocks_are_stepped_over() {
        let mut state = GroupState {
            desc: GroupDesc::parse(&[0u8; 64], 64).expect("zeros parse"),
            pending_free: BTreeMap::new(),
            freed_inodes: BTreeMap::new(),
            verified: [false; 2],
        };
        let bits = vec![0u8; 16];
        state.pending_free.insert(3, (5, Tid(9)));
        state.pending_free.insert(8, (2, Tid(9)));
        assert_eq!(next_allocatable(&bits, &state, 0, 128), Some(0));
        assert_eq!(next_allocatable(&bits, &state, 3, 128), Some(10));
        assert_eq!(next_allocatable(&bits, &state, 3, 10), None);
    }
}
