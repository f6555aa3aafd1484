//! An opened ext4 image, read side: the superblock, the group descriptor table, inodes, extent
//! trees, and where the journal lives.
//!
//! [`Ext4Image::open`] validates before it trusts: the superblock (geometry and checksum), the
//! incompatible features (it refuses the ones that change how metadata must be read), that the
//! device holds the whole file system, and every group descriptor (checksum, and bitmaps and
//! inode table inside the file system). After `open`, these hold for the image's lifetime:
//! - every group descriptor's inode table lies inside the file system, so inode locations
//!   computed from it are readable blocks;
//! - `blocks_count * block_size` fits in u64 and in the device, so block offsets do not
//!   overflow.
//!
//! Extent trees are walked defensively: a child block must lie inside the file system, must be
//! exactly one level below its parent, must start at its index entry's logical block and stay
//! below the next one, must carry a valid checksum, and may be visited only once. Depth falls
//! by one per level from at most 5, so the walk terminates; the visited set and
//! [`EXTENT_TREE_BLOCKS_MAX`] bound its work even on a hostile image.
//!
//! Memory: the descriptor table is kept in memory, one entry per group; a validated superblock
//! that fits the device bounds the group count by the device size.

use std::collections::HashSet;
use std::sync::Arc;

use blockdev::BlockDevice;
use journal::{JournalLocation, LocationExtent};
use ondisk::ext4::{
    self, feature, Extent, ExtentEntries, ExtentIndex, GroupDesc, Inode, Superblock,
};

use crate::adapters::read_only_misuse;
use crate::FsError;

/// Most extent-tree blocks one [`Ext4Image::extents`] call reads. One 4 KiB leaf holds 340
/// extents (84 at 1 KiB), so this many blocks describe far more extents than any file quill
/// meets: a file of 2^32 blocks in maximal 32768-block extents needs about 400 leaves. The limit
/// exists so a hostile image cannot make a walk read without end.
pub const EXTENT_TREE_BLOCKS_MAX: usize = 1 << 20;

/// An ext4 file system on a block device, opened for reading (and for toggling the
/// needs_recovery flag).
pub struct Ext4Image {
    dev: Arc<dyn BlockDevice>,
    superblock: Superblock,
    group_descs: Vec<GroupDesc>,
}

impl std::fmt::Debug for Ext4Image {
    // The descriptor table can have millions of entries; its length is what a reader needs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ext4Image")
            .field("superblock", &self.superblock)
            .field("groups", &self.group_descs.len())
            .finish_non_exhaustive()
    }
}

/// Where an inode's record lives.
#[derive(Debug, Clone, Copy)]
struct InodeLocation {
    block: u64,
    offset: usize,
    /// The record lies in a part of the inode table that was never initialized (lazy init),
    /// so it is free and its bytes mean nothing.
    uninitialized: bool,
}

impl Ext4Image {
    /// Reads and validates the superblock at byte 1024 and the group descriptor table.
    pub fn open(dev: Arc<dyn BlockDevice>) -> Result<Self, FsError> {
        let mut raw = vec![0u8; ext4::SUPERBLOCK_SIZE];
        dev.read_at(ext4::SUPERBLOCK_OFFSET, &mut raw)?;
        let superblock = Superblock::parse(&raw)?;
        let unreadable = superblock.feature_incompat & feature::INCOMPAT_UNREADABLE;
        if unreadable != 0 {
            return Err(FsError::Unsupported(format!(
                "incompatible features {}",
                feature::incompat_names(unreadable)
            )));
        }
        let block_size = u64::from(superblock.block_size());
        let fs_bytes = superblock.blocks_count.checked_mul(block_size).ok_or_else(|| {
            FsError::corrupted(
                superblock.superblock_block(),
                format!("{} blocks of {block_size} bytes", superblock.blocks_count),
            )
        })?;
        let device_bytes = dev.size_bytes();
        if fs_bytes > device_bytes {
            return Err(FsError::DeviceTooSmall { fs_bytes, device_bytes });
        }
        let group_descs = read_group_descs(dev.as_ref(), &superblock)?;
        let image = Ext4Image { dev, superblock, group_descs };
        image.check_group_descs()?;
        Ok(image)
    }

    pub fn superblock(&self) -> &Superblock {
        &self.superblock
    }

    pub fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.dev
    }

    pub fn block_size(&self) -> u32 {
        self.superblock.block_size()
    }

    /// The group descriptors, indexed by group number.
    pub fn group_descs(&self) -> &[GroupDesc] {
        &self.group_descs
    }

    /// Reads file-system block `block`.
    pub fn read_block(&self, block: u64) -> Result<Vec<u8>, FsError> {
        read_block_from(self.dev.as_ref(), &self.superblock, block)
    }

    /// Reads inode `ino` from its group's inode table and verifies its checksum. An inode in a
    /// never-initialized part of a table reads as all zeros (a free inode).
    pub fn read_inode(&self, ino: u32) -> Result<Inode, FsError> {
        let location = self.inode_location(ino)?;
        let inode_size = usize::from(self.superblock.inode_size);
        if location.uninitialized {
            return Ok(Inode::default());
        }
        let data = self.read_block(location.block)?;
        // inode_size is a power of two <= block size, so records never straddle blocks.
        let raw = &data[location.offset..location.offset + inode_size];
        if !ext4::inode_checksum_ok(&self.superblock, ino, raw) {
            return Err(FsError::corrupted(
                location.block,
                format!("inode {ino}: checksum mismatch"),
            ));
        }
        Inode::parse(raw).map_err(FsError::at_block(location.block))
    }

    fn inode_location(&self, ino: u32) -> Result<InodeLocation, FsError> {
        let sb = &self.superblock;
        if ino == 0 || ino > sb.inodes_count {
            return Err(FsError::NoSuchInode { ino, inodes_count: sb.inodes_count });
        }
        let group = (ino - 1) / sb.inodes_per_group;
        let index = (ino - 1) % sb.inodes_per_group;
        // inodes_count == groups * inodes_per_group (validated), so the group exists.
        let desc = &self.group_descs[group as usize];
        let byte = u64::from(index) * u64::from(sb.inode_size);
        let block_size = u64::from(sb.block_size());
        let used = sb.inodes_per_group.saturating_sub(desc.itable_unused);
        let uninitialized =
            sb.has_group_desc_csum() && (desc.flags & ext4::BG_INODE_UNINIT != 0 || index >= used);
        Ok(InodeLocation {
            block: desc.inode_table + byte / block_size,
            offset: (byte % block_size) as usize,
            uninitialized,
        })
    }

    /// The extents of inode `ino`, in logical order, from its whole extent tree; for an inode
    /// that maps its blocks indirectly, its mapped runs up to `i_size` as extents (none
    /// unwritten, none longer than an extent can be).
    pub fn extents(&self, ino: u32, inode: &Inode) -> Result<Vec<Extent>, FsError> {
        let root_block = self.inode_location(ino)?.block;
        if inode.has_inline_data() {
            return Ok(Vec::new());
        }
        if !inode.uses_extents() {
            let len_blocks = inode.size.div_ceil(u64::from(self.block_size()));
            let len_blocks = u32::try_from(len_blocks).unwrap_or(u32::MAX);
            let ctx = crate::extent_tree::ExtentCtx {
                ino,
                inode_block: root_block,
                csum_seed: None,
                goal: 0,
            };
            let runs = crate::indirect::runs(&mut ImageIo(self), &ctx, &inode.block, len_blocks)?;
            let mut extents = Vec::new();
            for (logical, start, len) in runs {
                for part in (0..len).step_by(ondisk::ext4::EXTENT_LEN_INIT_MAX as usize) {
                    let take = (len - part).min(ondisk::ext4::EXTENT_LEN_INIT_MAX);
                    let (logical, start) = (logical + part, start + u64::from(part));
                    extents.push(Extent { logical, len: take, start, unwritten: false });
                }
            }
            return Ok(extents);
        }
        let (header, entries) =
            ext4::parse_extent_node(&inode.block).map_err(FsError::at_block(root_block))?;
        let mut walk = ExtentWalk {
            image: self,
            ino,
            generation: inode.generation,
            visited: HashSet::new(),
            extents: Vec::new(),
        };
        walk.node(root_block, header.depth, entries, 0, LOGICAL_END)?;
        Ok(walk.extents)
    }

    /// Where the internal journal lives: inode `s_journal_inum`'s blocks `0 .. i_size / block
    /// size`, which must all be mapped (unwritten extents count: JBD2 writes them before it
    /// reads them).
    pub fn journal_location(&self) -> Result<JournalLocation, FsError> {
        let sb = &self.superblock;
        if !sb.has_journal() {
            return Err(FsError::NoJournal);
        }
        if sb.journal_dev != 0 {
            return Err(FsError::Unsupported(format!(
                "external journal on device {:#x}",
                sb.journal_dev
            )));
        }
        if sb.journal_inum == 0 {
            return Err(FsError::corrupted(
                sb.superblock_block(),
                "has_journal is set but there is no journal inode or device",
            ));
        }
        let ino = sb.journal_inum;
        let inode = self.read_inode(ino)?;
        let inode_block = self.inode_location(ino)?.block;
        if inode.links_count == 0 || !inode.is_regular() {
            return Err(FsError::corrupted(
                inode_block,
                format!(
                    "journal inode {ino} is not a regular file in use (mode {:#o}, {} links)",
                    inode.mode, inode.links_count
                ),
            ));
        }
        let len_blocks = inode.size / u64::from(sb.block_size());
        let len_blocks = match u32::try_from(len_blocks) {
            Ok(len) if len > 0 => len,
            _ => {
                return Err(FsError::corrupted(
                    inode_block,
                    format!("journal inode {ino} is {} bytes long", inode.size),
                ))
            }
        };
        let extents = self.extents(ino, &inode)?;
        let runs = journal_runs(&extents, len_blocks).map_err(|reason| {
            FsError::corrupted(inode_block, format!("journal inode {ino}: {reason}"))
        })?;
        JournalLocation::new(sb.block_size(), runs)
            .map_err(|err| FsError::corrupted(inode_block, err.to_string()))
    }

    /// Replays the journal if it needs it and marks it clean (JBD2 recovery, as e2fsck and the
    /// kernel's mount do), calling `progress(done, total)` as the log replay goes, then the
    /// fast commits that extend the last full commit (`fast_commit.rs`), before the journal is
    /// marked clean. The one recovery every path uses (`Filesystem::open`, `quill recover`); a
    /// fast commit it cannot replay yet is refused with one line naming it, and the journal
    /// then still needs recovery. needs_recovery in the ext4 superblock is left to the caller.
    pub fn recover_journal(
        &self,
        threads: usize,
        progress: &(dyn Fn(u64, u64) + Sync),
    ) -> Result<journal::RecoveryReport, FsError> {
        crate::fast_commit::check_no_interrupted_replay(&self.superblock)?;
        let location = self.journal_location()?;
        let mut fast_commits = crate::fast_commit::FastCommitReplayer {
            dev: self.dev.clone(),
            inode_size: self.superblock.inode_size,
            errors_recorded: self.superblock.state & ext4::STATE_ERROR_FS != 0,
        };
        Ok(journal::recover_with_fast_commits(
            &*self.dev,
            &location,
            threads,
            progress,
            &mut fast_commits,
        )?)
    }

    /// `quill recover`, e2fsck's journal replay (`e2fsck -E journal_only`): opens the image on
    /// `dev`, replays its journal with [`Ext4Image::recover_journal`] and clears needs_recovery
    /// in the superblock now on disk (recovery may have replayed the superblock, so not the
    /// copy read before). Returns the report and whether needs_recovery was set.
    pub fn recover_offline(
        dev: Arc<dyn BlockDevice>,
        threads: usize,
        progress: &(dyn Fn(u64, u64) + Sync),
    ) -> Result<(journal::RecoveryReport, bool), FsError> {
        let image = Ext4Image::open(dev.clone())?;
        let report = image.recover_journal(threads, progress)?;
        let flag_was_set = image.superblock().needs_recovery();
        if flag_was_set {
            Ext4Image::open(dev)?.set_needs_recovery(false)?;
        }
        Ok((report, flag_was_set))
    }

    /// Sets or clears INCOMPAT_RECOVER in the primary superblock (checksum updated), then
    /// flushes the device. Backup superblocks are left alone, as the kernel does. Refuses file
    /// systems with INCOMPAT features quill cannot write correctly.
    pub fn set_needs_recovery(&mut self, on: bool) -> Result<(), FsError> {
        let unsupported = self.superblock.unsupported_incompat();
        if unsupported != 0 {
            return Err(FsError::Unsupported(format!(
                "refusing to write a file system with incompatible features {}",
                feature::incompat_names(unsupported)
            )));
        }
        if self.superblock.feature_ro_compat & feature::RO_COMPAT_READONLY != 0 {
            return Err(FsError::Unsupported(
                "refusing to write a file system marked read-only (ro_compat readonly)".into(),
            ));
        }
        let mut updated = self.superblock.clone();
        updated.set_needs_recovery(on);
        let bytes = updated.encode();
        assert_eq!(bytes.len(), ext4::SUPERBLOCK_SIZE);
        self.dev.write_at(ext4::SUPERBLOCK_OFFSET, &bytes)?;
        self.dev.flush()?;
        // Only a durable write changes what this image believes is on disk.
        self.superblock = updated;
        Ok(())
    }

    /// Checks that every group's bitmaps and inode table lie inside the file system and do
    /// not overlap the primary superblock.
    fn check_group_descs(&self) -> Result<(), FsError> {
        let sb = &self.superblock;
        let block_size = u64::from(sb.block_size());
        let itable_blocks =
            (u64::from(sb.inodes_per_group) * u64::from(sb.inode_size)).div_ceil(block_size);
        let per_block = sb.block_size() as usize / sb.desc_size();
        // The primary superblock, descriptor blocks and reserved descriptor blocks.
        let primary_desc_blocks = if sb.feature_incompat & feature::INCOMPAT_META_BG != 0 {
            sb.group_desc_blocks().min(sb.first_meta_bg)
        } else {
            sb.group_desc_blocks()
        };
        let primary_end = sb.superblock_block()
            + 1
            + u64::from(primary_desc_blocks)
            + u64::from(sb.reserved_gdt_blocks);
        for (group, desc) in self.group_descs.iter().enumerate() {
            let areas = [
                ("block bitmap", desc.block_bitmap, 1),
                ("inode bitmap", desc.inode_bitmap, 1),
                ("inode table", desc.inode_table, itable_blocks),
            ];
            // group < group_count() <= u32::MAX, and so is its descriptor block index.
            let table_block = sb.group_desc_block((group / per_block) as u32);
            for (what, start, len) in areas {
                if !self.blocks_inside(start, len) {
                    return Err(FsError::corrupted(
                        table_block,
                        format!("group {group}: {what} at blocks {start}+{len} is outside the file system"),
                    ));
                }
                // ext4_check_descriptors: nothing may overlap the primary superblock and
                // descriptor table (with its reserved blocks), which quill writes itself.
                if start < primary_end {
                    return Err(FsError::corrupted(
                        table_block,
                        format!(
                            "group {group}: {what} at blocks {start}+{len} overlaps the superblock \
                             or the group descriptors (blocks up to {primary_end})"
                        ),
                    ));
                }
            }
            // A group's bitmaps and inode table are distinct blocks: one written over another
            // corrupts both.
            for (i, &(what, start, len)) in areas.iter().enumerate() {
                for &(other, other_start, other_len) in &areas[i + 1..] {
                    if start < other_start + other_len && other_start < start + len {
                        return Err(FsError::corrupted(
                            table_block,
                            format!("group {group}: {what} at {start}+{len} overlaps the {other} at {other_start}+{other_len}"),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Whether blocks `start .. start + len` are inside the file system and past the primary
    /// superblock (the kernel's `ext4_inode_block_valid`, minus the system-zone check).
    fn blocks_inside(&self, start: u64, len: u64) -> bool {
        start > self.superblock.superblock_block()
            && start.checked_add(len).is_some_and(|end| end <= self.superblock.blocks_count)
    }
}

/// One past the largest logical block number.
const LOGICAL_END: u64 = 1 << 32;

/// State of one extent-tree walk.
/// Block reads from the image for the indirect walker (`indirect.rs`), which changes nothing.
struct ImageIo<'a>(&'a Ext4Image);

impl crate::meta_io::MetaIo for ImageIo<'_> {
    fn block_size(&self) -> usize {
        self.0.block_size() as usize
    }

    fn blocks_count(&self) -> u64 {
        self.0.superblock.blocks_count
    }

    fn read_meta(&mut self, block: u64) -> Result<Vec<u8>, FsError> {
        self.0.read_block(block)
    }

    fn write_meta(&mut self, block: u64, _: &[u8]) -> Result<(), FsError> {
        Err(read_only_misuse(block))
    }

    fn alloc_meta_block(&mut self, _: u64) -> Result<u64, FsError> {
        Err(read_only_misuse(0))
    }

    fn free_meta_block(&mut self, block: u64) -> Result<(), FsError> {
        Err(read_only_misuse(block))
    }

    fn free_data_blocks(&mut self, start: u64, _: u64) -> Result<(), FsError> {
        Err(read_only_misuse(start))
    }
}

struct ExtentWalk<'a> {
    image: &'a Ext4Image,
    ino: u32,
    generation: u32,
    visited: HashSet<u64>,
    extents: Vec<Extent>,
}

impl ExtentWalk<'_> {
    /// Visits a parsed node found in `block` (the inode table block for the root) at `depth`,
    /// whose entries must lie in logical blocks `start .. end`.
    fn node(
        &mut self,
        block: u64,
        depth: u16,
        entries: ExtentEntries,
        start: u64,
        end: u64,
    ) -> Result<(), FsError> {
        match entries {
            ExtentEntries::Leaf(extents) => {
                for extent in extents {
                    self.node_leaf_extent(block, extent, start, end)?;
                }
            }
            ExtentEntries::Index(indexes) => {
                for (i, index) in indexes.iter().enumerate() {
                    let child_end = indexes.get(i + 1).map_or(end, |next| u64::from(next.logical));
                    self.node_child(block, depth, index, start, child_end)?;
                }
            }
        }
        Ok(())
    }

    fn node_leaf_extent(
        &mut self,
        block: u64,
        extent: Extent,
        start: u64,
        end: u64,
    ) -> Result<(), FsError> {
        let ino = self.ino;
        if u64::from(extent.logical) < start || extent.logical_end() > end {
            return Err(FsError::corrupted(
                block,
                format!(
                    "inode {ino}: extent at logical {}+{} lies outside its index range {start}..{end}",
                    extent.logical, extent.len
                ),
            ));
        }
        if !self.image.blocks_inside(extent.start, u64::from(extent.len)) {
            return Err(FsError::corrupted(
                block,
                format!(
                    "inode {ino}: extent at logical {} maps to blocks {}+{}, outside the file system",
                    extent.logical, extent.start, extent.len
                ),
            ));
        }
        if let Some(prev) = self.extents.last() {
            if u64::from(extent.logical) < prev.logical_end() {
                return Err(FsError::corrupted(
                    block,
                    format!(
                        "inode {ino}: extent at logical {} overlaps its predecessor",
                        extent.logical
                    ),
                ));
            }
        }
        self.extents.push(extent);
        Ok(())
    }

    fn node_child(
        &mut self,
        parent: u64,
        depth: u16,
        index: &ExtentIndex,
        start: u64,
        end: u64,
    ) -> Result<(), FsError> {
        let ino = self.ino;
        let child = index.leaf;
        if u64::from(index.logical) < start || u64::from(index.logical) >= end {
            return Err(FsError::corrupted(
                parent,
                format!(
                    "inode {ino}: index at logical {} lies outside {start}..{end}",
                    index.logical
                ),
            ));
        }
        if !self.image.blocks_inside(child, 1) {
            return Err(FsError::corrupted(
                parent,
                format!("inode {ino}: extent tree block {child} is outside the file system"),
            ));
        }
        if !self.visited.insert(child) {
            return Err(FsError::corrupted(
                parent,
                format!("inode {ino}: extent tree block {child} is referenced twice"),
            ));
        }
        if self.visited.len() > EXTENT_TREE_BLOCKS_MAX {
            return Err(FsError::Unsupported(format!(
                "inode {ino}: extent tree of more than {EXTENT_TREE_BLOCKS_MAX} blocks"
            )));
        }
        let data = self.image.read_block(child)?;
        let (header, entries) = ext4::parse_extent_node(&data).map_err(FsError::at_block(child))?;
        // depth >= 1 here (only index nodes have children).
        if header.depth + 1 != depth {
            return Err(FsError::corrupted(
                child,
                format!("inode {ino}: depth-{} node under a depth-{depth} index", header.depth),
            ));
        }
        if !ext4::extent_block_checksum_ok(&self.image.superblock, ino, self.generation, &data) {
            return Err(FsError::corrupted(
                child,
                format!("inode {ino}: extent block checksum mismatch"),
            ));
        }
        if let Some(first) = entries.first_logical() {
            if first != index.logical {
                return Err(FsError::corrupted(
                    child,
                    format!(
                        "inode {ino}: node starts at logical {first}, its index says {}",
                        index.logical
                    ),
                ));
            }
        }
        self.node(child, header.depth, entries, u64::from(index.logical), end)
    }
}

/// Turns the journal inode's extents into journal runs covering blocks `0 .. len_blocks`
/// without a hole, merging extents that are also physically contiguous. Extents past
/// `len_blocks` are ignored, as JBD2 ignores blocks past `i_size`.
fn journal_runs(extents: &[Extent], len_blocks: u32) -> Result<Vec<LocationExtent>, String> {
    let mut runs: Vec<LocationExtent> = Vec::new();
    let mut next = 0u32;
    for extent in extents {
        if next == len_blocks {
            break;
        }
        if extent.logical != next {
            return Err(format!(
                "journal block {next} is not mapped (the next extent starts at {})",
                extent.logical
            ));
        }
        let take = extent.len.min(len_blocks - next);
        match runs.last_mut() {
            Some(run) if run.fs_block + u64::from(run.len) == extent.start => run.len += take,
            _ => runs.push(LocationExtent { log_start: next, fs_block: extent.start, len: take }),
        }
        next += take;
    }
    if next < len_blocks {
        return Err(format!("only {next} of the journal's {len_blocks} blocks are mapped"));
    }
    Ok(runs)
}

fn read_block_from(dev: &dyn BlockDevice, sb: &Superblock, block: u64) -> Result<Vec<u8>, FsError> {
    if block >= sb.blocks_count {
        return Err(FsError::BlockOutOfRange { block, blocks_count: sb.blocks_count });
    }
    let block_size = sb.block_size();
    let mut data = vec![0u8; block_size as usize];
    // block < blocks_count and blocks_count * block_size fits u64 (checked in open).
    dev.read_at(block * u64::from(block_size), &mut data)?;
    Ok(data)
}

/// Reads the whole group descriptor table, verifying each descriptor's checksum.
fn read_group_descs(dev: &dyn BlockDevice, sb: &Superblock) -> Result<Vec<GroupDesc>, FsError> {
    let groups = sb.group_count() as usize;
    let desc_size = sb.desc_size();
    let mut descs = Vec::with_capacity(groups);
    for nr in 0..sb.group_desc_blocks() {
        let block = sb.group_desc_block(nr);
        let data = read_block_from(dev, sb, block)?;
        for raw in data.chunks_exact(desc_size) {
            if descs.len() == groups {
                break;
            }
            // descs.len() < groups <= u32::MAX.
            let group = descs.len() as u32;
            if !ext4::group_desc_checksum_ok(sb, group, raw) {
                return Err(FsError::corrupted(
                    block,
                    format!("group {group}: descriptor checksum mismatch"),
                ));
            }
            descs.push(GroupDesc::parse(raw, desc_size).map_err(FsError::at_block(block))?);
        }
    }
    assert_eq!(descs.len(), groups, "descriptor table blocks cover every group");
    Ok(descs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extent(logical: u32, len: u32, start: u64) -> Extent {
        Extent { logical, len, start, unwritten: false }
    }

    #[test]
    fn journal_runs_merge_physically_contiguous_extents() {
        let extents = [extent(0, 32768, 1000), extent(32768, 100, 33768), extent(32868, 50, 90000)];
        let runs = journal_runs(&extents, 32918).unwrap();
        assert_eq!(
            runs,
            vec![
                LocationExtent { log_start: 0, fs_block: 1000, len: 32868 },
                LocationExtent { log_start: 32868, fs_block: 90000, len: 50 },
            ]
        );
    }

    #[test]
    fn journal_runs_stop_at_the_inode_size() {
        let runs = journal_runs(&[extent(0, 10, 100), extent(10, 10, 500)], 5).unwrap();
        assert_eq!(runs, vec![LocationExtent { log_start: 0, fs_block: 100, len: 5 }]);
    }

    #[test]
    fn journal_runs_reject_holes_and_short_maps() {
        assert!(journal_runs(&[extent(1, 10, 100)], 5).unwrap_err().contains("block 0"));
        assert!(journal_runs(&[extent(0, 2, 100), extent(3, 2, 200)], 5).is_err());
        assert!(journal_runs(&[extent(0, 2, 100)], 5).unwrap_err().contains("2 of"));
        assert!(journal_runs(&[], 1).is_err());
    }
}
