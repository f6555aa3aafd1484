//! Fast-commit replay: the ext4 side of recovery's fast-commit step (the kernel's
//! `ext4_fc_replay` in fs/ext4/fast_commit.c, e2fsck's `ext4_fc_replay` in e2fsck/journal.c).
//!
//! It lives in the fs crate because the records are ext4 operations on inodes, extent trees,
//! directories and bitmaps; the journal crate finds and scans the area and calls
//! [`FastCommitReplayer`] through its [`journal::FastCommitReplay`] seam after the full commits
//! are replayed and flushed, before the journal is marked clean ([`crate::Ext4Image::recover_journal`],
//! which `Filesystem::open` and `quill recover` both use).
//!
//! Each valid record is replayed in order, as the kernel does:
//!
//! | record    | replay                                                                          |
//! |-----------|---------------------------------------------------------------------------------|
//! | INODE     | copy the record over the inode except `i_block` (an empty extent root when it has none, or when the generation changed: a reused inode, whose old blocks are freed), mark the inode used |
//! | ADD_RANGE | map the range (in use inodes only): holes are mapped, parts mapped elsewhere or written where the record says unwritten are mapped again, unwritten parts the record says are written are converted |
//! | DEL_RANGE | unmap the range and free its blocks (in use inodes only)                         |
//! | CREAT     | mark the inode used, a directory gets a fresh "." / ".." block, add the name to the parent (already there is fine), 1 link (a directory 2, and its parent one more) |
//! | LINK      | add the name (already there is fine: no change), one more link                   |
//! | UNLINK    | remove the name if it names this inode (absent: nothing), one link fewer; an empty directory goes, and its parent's link for ".." |
//! | HEAD, PAD, TAIL | nothing                                                                  |
//!
//! Afterwards every block of every inode a record changed is marked used (the kernel's
//! `ext4_fc_set_bitmaps_and_counters`), inodes an UNLINK left without links are deleted (what
//! e2fsck's check makes of them), `i_blocks` is recomputed, and the group descriptors'
//! counts and checksums and the superblock's free counts are made to agree with the bitmaps.
//!
//! Cases the kernel handles but this code does not yet are refused with one line naming them
//! ("fast-commit record X ... is not replayed yet"): a LINK to a directory; an UNLINK of a
//! directory that is not empty; an inode without extents (block-mapped, inline, fast symlink,
//! device); a huge_file inode. Every change is staged in
//! memory and written only when the whole replay succeeded, so a refusal or an error leaves
//! the fast commits unreplayed and the journal still needing recovery (the full commits,
//! already replayed, replay again idempotently).
//!
//! Where quill departs from the kernel's replay, it is to leave what e2fsck -fn finds
//! consistent (the kernel relies on a later check, and its own replay leaves these wrong):
//!
//! | case                                   | kernel                         | quill                        |
//! |----------------------------------------|--------------------------------|------------------------------|
//! | INODE of a reused inode (new generation) | keeps the old file's extents | starts from an empty tree    |
//! | INODE of an inode in use               | frees its blocks until the end | keeps them used (a CREAT's directory block cannot take one) |
//! | CREAT of a directory                   | 1 link, parent unchanged       | 2 links, parent one more     |
//! | UNLINK of an empty directory           | one link fewer                 | removed, parent one fewer    |
//! | an inode left without links            | left in place by the replay    | deleted                      |
//! | superblock free counts                 | left to the mount              | the descriptors' sums        |
//!
//! A crash while the staged blocks are being written leaves the journal needing recovery, and
//! the next recovery replays everything again over what reached the disk. Block records are
//! idempotent; a dentry record whose directory block reached the disk while the inode's block
//! did not may then leave a link count e2fsck corrects (the kernel's replay has the same
//! window).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use blockdev::BlockDevice;
use journal::{FastCommitArea, FastCommitReplay, FastCommitReport, JournalError};
use ondisk::ext4::{self, Extent, GroupDesc, Superblock, INODE_BLOCK_SIZE};
use ondisk::jbd2::fast_commit::{FcDentryOp, FcRecord, FcScan};

use crate::adapters::DirAccess;
use crate::dir::{self, DirCtx};
use crate::error::{FsError, Result};
use crate::extent_tree::{self, ExtentCtx, Lookup};
use crate::groups::{Geometry, Groups};
use crate::image::Ext4Image;
use crate::inodes::InodeData;
use crate::meta_io::MetaIo;

/// `offsetof(struct ext4_inode, i_block)` and `i_generation`: an INODE record is copied over
/// the inode on disk except for the bytes between them (`i_block`).
const I_BLOCK: usize = 0x28;
const I_GENERATION: usize = 0x64;
/// `EXT4_LINK_MAX`: a directory with this many links counts as 1 (dir_nlink).
const DIR_LINKS_MAX: i32 = 65000;

/// The file system's [`FastCommitReplay`]: replays into the device it was made for.
pub(crate) struct FastCommitReplayer {
    pub dev: Arc<dyn BlockDevice>,
    pub inode_size: u16,
    /// The superblock had ERROR_FS before recovery: see `check`.
    pub errors_recorded: bool,
}

impl FastCommitReplay for FastCommitReplayer {
    fn inode_size(&self) -> u16 {
        self.inode_size
    }

    fn check(&mut self, _area: &FastCommitArea, scan: &FcScan<'_>) -> journal::Result<()> {
        // A replay cut short by a crash leaves ERROR_FS (see `Replay::write_staged`) with the
        // fast commits still to replay; replaying them again over what reached the disk could
        // follow a tree root into a block that did not. Errors recorded for another reason
        // ask for e2fsck's full check all the same. Every other refusal depends on the file
        // system as the full commits leave it, which `replay` sees.
        if self.errors_recorded && scan.commits > 0 {
            return Err(JournalError::Unsupported(
                "the file system has errors recorded (ERROR_FS) and its journal ends in fast \
                 commits, as a fast-commit replay cut short leaves it: run e2fsck -fy, which \
                 replays them and checks the whole file system"
                    .into(),
            ));
        }
        Ok(())
    }

    fn replay(
        &mut self,
        area: &FastCommitArea,
        scan: &FcScan<'_>,
    ) -> journal::Result<FastCommitReport> {
        let valid = &scan.records[..scan.records_valid];
        let result = Ext4Image::open(self.dev.clone()).and_then(|image| {
            let mut replay = Replay::new(&image, valid)?;
            for record in valid {
                replay.apply(record)?;
            }
            replay.finish()
        });
        match result {
            Ok(()) => Ok(FastCommitReport { commits: scan.commits, records: scan.records_valid }),
            Err(FsError::Device(error)) => Err(JournalError::Device(error)),
            Err(FsError::Unsupported(what)) => Err(JournalError::Unsupported(format!(
                "{what}: the full commits were replayed, the fast commits of tid {} were not, and \
                 the journal still needs recovery (the kernel's mount replays them)",
                area.expected_tid
            ))),
            Err(error) => Err(JournalError::Corrupted {
                log_block: area.first_log_block,
                reason: format!("fast-commit replay: {error}"),
            }),
        }
    }
}

/// Refuses a file system whose last fast-commit replay, by e2fsck, was cut short (it leaves
/// EXT4_FC_REPLAY in `s_state`): replaying again over the blocks that reached the disk could
/// follow them into garbage; e2fsck's full check repairs it.
pub(crate) fn check_no_interrupted_replay(sb: &Superblock) -> Result<()> {
    if sb.state & ext4::STATE_FC_REPLAY != 0 {
        return Err(FsError::Unsupported(
            "a fast-commit replay was interrupted (EXT4_FC_REPLAY is set in s_state): run \
             e2fsck -fy, which checks the whole file system"
                .into(),
        ));
    }
    Ok(())
}

fn not_replayed(what: String) -> FsError {
    FsError::Unsupported(format!("{what} is not replayed yet"))
}

/// One replay: the file system as the full commits left it, with every change staged.
struct Replay {
    dev: Arc<dyn BlockDevice>,
    sb: Superblock,
    geo: Geometry,
    groups: Arc<Groups>,
    descs: Vec<GroupDesc>,
    /// Blocks changed so far, by block number: reads see them, `finish` writes them.
    staged: BTreeMap<u64, Vec<u8>>,
    /// Blocks the valid ADD_RANGE records map: never handed out for a new tree or directory
    /// block (`ext4_fc_replay_check_excluded`).
    excluded: Vec<(u64, u64)>,
    /// Blocks whose bits this replay cleared, as `[start, end)`: never handed out either. An
    /// INODE record clears the bits of the blocks the inode maps on disk and `finish` sets
    /// them again for the blocks it still maps; in between they are not free, and a directory
    /// or tree block allocated there would overwrite the file's data.
    released: Vec<(u64, u64)>,
    /// Inodes whose blocks are marked used at the end (`fc_modified_inodes`), in order.
    modified: Vec<u32>,
    /// Inodes an UNLINK dropped a link of: deleted at the end if they have none left.
    unlinked: BTreeSet<u32>,
    /// Groups whose bitmaps changed.
    touched: BTreeSet<u32>,
}

impl Replay {
    fn new(image: &Ext4Image, valid: &[FcRecord<'_>]) -> Result<Replay> {
        let sb = image.superblock().clone();
        // The replay writes the file system as quill does: refuse features it cannot write
        // (casefold names, encryption, ea_inode …) before anything is staged.
        crate::filesystem::check_features(&sb, false)?;
        // Its bitmaps and block maps go block by block; quill writes no fast commits on
        // bigalloc, the kernel's are replayed by its own mount or e2fsck.
        if sb.has_bigalloc() {
            return Err(FsError::Unsupported(
                "fast commits on a bigalloc file system (quill replays them block by block,                  not in clusters)"
                    .into(),
            ));
        }
        let descs = image.group_descs().to_vec();
        let groups = Arc::new(Groups::new(&sb, &descs)?);
        let excluded = valid
            .iter()
            .filter_map(|record| match record {
                FcRecord::AddRange { extent, .. } => {
                    Some((extent.start, extent.start + u64::from(extent.len)))
                }
                _ => None,
            })
            .collect();
        assert_eq!(descs.len(), sb.group_count() as usize, "descriptors of every group");
        Ok(Replay {
            dev: image.device().clone(),
            geo: Geometry::new(&sb),
            sb,
            groups,
            descs,
            staged: BTreeMap::new(),
            excluded,
            released: Vec::new(),
            modified: Vec::new(),
            unlinked: BTreeSet::new(),
            touched: BTreeSet::new(),
        })
    }

    fn apply(&mut self, record: &FcRecord<'_>) -> Result<()> {
        match *record {
            FcRecord::Head { .. } | FcRecord::Pad { .. } | FcRecord::Tail { .. } => Ok(()),
            FcRecord::Inode { ino, raw } => self.replay_inode(ino, raw),
            FcRecord::AddRange { ino, extent } => self.replay_add_range(ino, extent),
            FcRecord::DelRange { ino, logical, len } => self.replay_del_range(ino, logical, len),
            FcRecord::Dentry { op, parent_ino, ino, name } => match op {
                FcDentryOp::Create => self.replay_create(parent_ino, ino, name),
                FcDentryOp::Link => self.replay_link(parent_ino, ino, name),
                FcDentryOp::Unlink => self.replay_unlink(parent_ino, ino, name),
            },
        }
    }

    // ---- records ----

    /// `ext4_fc_replay_inode`.
    fn replay_inode(&mut self, ino: u32, fc_raw: &[u8]) -> Result<()> {
        if !self.valid_ino(ino) {
            return Ok(());
        }
        let old = self.read_inode_raw(ino)?;
        // A record whose generation differs from a file the inode held (in use, or until an
        // UNLINK of this replay) is a new file in a reused inode: the old file's mapping is
        // not this one's, and every block the new file has comes in ADD_RANGE records (all
        // its writes are after the last full commit). The kernel keeps the old mapping,
        // which leaves the old file's blocks past the new end of file (e2fsck then grows
        // i_size over them); quill frees them and starts from an empty tree.
        // Only an inode whose file an UNLINK of this replay removed can be reused here: a live
        // file's generation may change by itself (EXT4_IOC_SETVERSION without metadata_csum),
        // and taking that for reuse would drop the file's blocks.
        let held_file =
            self.unlinked.contains(&ino) && ext4::inode_checksum_ok(&self.sb, ino, &old);
        let reused = held_file && le32(&old, I_GENERATION) != le32(fc_raw, I_GENERATION);
        // The kernel frees the blocks of every inode in use here and marks what the inode
        // maps used again at the end; quill keeps the mapping on disk (the record's i_block
        // is not copied), so only a reused inode's blocks are free. Freeing the others too
        // would let a later record's allocation (a CREAT's directory block) take a block
        // the file still maps, one no ADD_RANGE carries (allocated before the last full
        // commit).
        if reused {
            self.set_inode_blocks_bits(ino, &old, false)?;
        }
        self.note_modified(ino);
        let old_copy = old.clone();
        let mut raw = old;
        let len = fc_raw.len().min(raw.len());
        raw[..I_BLOCK].copy_from_slice(&fc_raw[..I_BLOCK]);
        raw[I_GENERATION..len].copy_from_slice(&fc_raw[I_GENERATION..len]);
        let flags = ext4::Inode::parse(&raw)?.flags;
        if flags & ext4::EXTENTS_FL == 0 {
            return Err(not_replayed(format!(
                "fast-commit record INODE of inode {ino} without extents (flags {flags:#x})"
            )));
        }
        if reused || u16::from_le_bytes([raw[I_BLOCK], raw[I_BLOCK + 1]]) != ext4::EXTENT_MAGIC {
            let mut root = [0u8; INODE_BLOCK_SIZE];
            extent_tree::init_root(&mut root);
            raw[I_BLOCK..I_BLOCK + INODE_BLOCK_SIZE].copy_from_slice(&root);
        }
        self.write_inode_raw(ino, &mut raw)?;
        let was_dir = is_dir(&old_copy);
        if !self.mark_inode_used(ino, &raw)? && was_dir != is_dir(&raw) {
            // A used inode that changes kind (a directory removed and its inode reused by a
            // file, or the reverse) moves between the group's directory count and the rest.
            let desc = &mut self.descs[self.geo.group_of_inode(ino) as usize];
            desc.used_dirs =
                if was_dir { desc.used_dirs.saturating_sub(1) } else { desc.used_dirs + 1 };
            self.touch(self.geo.group_of_inode(ino));
        }
        Ok(())
    }

    /// `ext4_fc_replay_add_range`.
    fn replay_add_range(&mut self, ino: u32, extent: Extent) -> Result<()> {
        let Some(mut raw) = self.existing_inode(ino)? else { return Ok(()) };
        self.note_modified(ino);
        let (ctx, mut root) = self.extent_root(ino, &raw, "ADD_RANGE")?;
        let start = u64::from(extent.logical);
        let end = start + u64::from(extent.len);
        let mut cur = start;
        while cur < end {
            let remaining = end - cur;
            let pblk_wanted = extent.start + (cur - start);
            let lblk = cur as u32; // cur < end <= 2^32 (the parser checks the extent)
            match extent_tree::lookup(self, &ctx, &root, lblk)? {
                Lookup::Hole { len_to_next } => {
                    let len = remaining.min(len_to_next.map_or(u64::MAX, u64::from)) as u32;
                    let mapped = Extent { logical: lblk, len, start: pblk_wanted, ..extent };
                    self.map_range(&ctx, &mut root, mapped)?;
                    cur += u64::from(len);
                }
                Lookup::Mapped { pblk, len, unwritten } => {
                    let len = remaining.min(u64::from(len)) as u32;
                    if pblk != pblk_wanted || (!unwritten && extent.unwritten) {
                        // ext4_ext_replay_update_ex: the range moved (removed and allocated
                        // again within the fast commits) or turned unwritten. Unmapping frees
                        // the old blocks; blocks still used elsewhere are marked used again at
                        // the end, as the kernel does.
                        let end = u64::from(lblk) + u64::from(len);
                        extent_tree::remove_range(self, &ctx, &mut root, lblk, end)?;
                        let mapped = Extent { logical: lblk, len, start: pblk_wanted, ..extent };
                        self.map_range(&ctx, &mut root, mapped)?;
                    } else if unwritten && !extent.unwritten {
                        extent_tree::mark_written(self, &ctx, &mut root, lblk, len)?;
                    }
                    cur += u64::from(len);
                }
            }
        }
        raw[I_BLOCK..I_BLOCK + INODE_BLOCK_SIZE].copy_from_slice(&root);
        self.write_inode_raw(ino, &mut raw)
    }

    /// Maps `extent` (an unmapped range) in `root`, new tree blocks allocated near it.
    fn map_range(
        &mut self,
        ctx: &ExtentCtx,
        root: &mut [u8; INODE_BLOCK_SIZE],
        extent: Extent,
    ) -> Result<()> {
        let ctx = ExtentCtx { goal: extent.start, ..*ctx };
        let Extent { logical, len, start, unwritten } = extent;
        extent_tree::insert(self, &ctx, root, logical, start, len, unwritten)
    }

    /// `ext4_fc_replay_del_range`.
    fn replay_del_range(&mut self, ino: u32, logical: u32, len: u32) -> Result<()> {
        let Some(mut raw) = self.existing_inode(ino)? else { return Ok(()) };
        self.note_modified(ino);
        let (ctx, mut root) = self.extent_root(ino, &raw, "DEL_RANGE")?;
        let start = u64::from(logical);
        let end = (start + u64::from(len)).min(1 << 32);
        extent_tree::remove_range(self, &ctx, &mut root, logical, end)?;
        raw[I_BLOCK..I_BLOCK + INODE_BLOCK_SIZE].copy_from_slice(&root);
        self.write_inode_raw(ino, &mut raw)
    }

    /// `ext4_fc_replay_create`.
    fn replay_create(&mut self, parent: u32, ino: u32, name: &[u8]) -> Result<()> {
        if !self.valid_ino(ino) {
            return Err(FsError::Invalid(format!("CREAT of inode {ino}, which cannot exist")));
        }
        let raw = self.read_inode_raw(ino)?;
        self.mark_inode_used(ino, &raw)?;
        let Some(mut raw) = self.existing_inode(ino)? else {
            return Err(FsError::Invalid(format!("CREAT of inode {ino}, which is not in use")));
        };
        let dir = is_dir(&raw);
        if dir {
            // ext4_init_new_dir: a fresh first block with "." and "..". A directory's blocks
            // are metadata no fast commit carries, so whatever the inode maps is dropped.
            let (ctx, mut root) = self.extent_root(ino, &raw, "CREAT")?;
            extent_tree::remove_range(self, &ctx, &mut root, 0, 1 << 32)?;
            raw[I_BLOCK..I_BLOCK + INODE_BLOCK_SIZE].copy_from_slice(&root);
            edit(&mut raw, |inode| inode.size = 0)?;
            self.with_dir(ino, &mut raw, |io, ctx| dir::init_dir(io, ctx, ino, parent))?;
        }
        let added = self.add_name(parent, ino, name, &raw)?;
        // The kernel sets one link even for a directory and leaves the parent's count to a
        // later INODE record (e2fsck fixes both when none comes); quill counts them: "." and
        // the name, and the new ".." in the parent.
        edit(&mut raw, |inode| inode.links_count = if dir { 2 } else { 1 })?;
        self.write_inode_raw(ino, &mut raw)?;
        if dir && added {
            self.change_dir_links(parent, 1)?;
        }
        Ok(())
    }

    /// Moves directory `dir_ino`'s link count by `delta` (a subdirectory's ".." came or
    /// went), as `ext4_inc_count` / `ext4_dec_count`: a count of 1 means "too many to count"
    /// (dir_nlink) and stays 1.
    fn change_dir_links(&mut self, dir_ino: u32, delta: i32) -> Result<()> {
        assert!(delta == 1 || delta == -1);
        let Some(mut raw) = self.existing_inode(dir_ino)? else { return Ok(()) };
        edit(&mut raw, |inode| {
            let links = i32::from(inode.links_count);
            inode.links_count = match links + delta {
                _ if links == 1 => 1,
                next if next >= DIR_LINKS_MAX => 1,
                next => next.max(2) as u16,
            };
        })?;
        self.write_inode_raw(dir_ino, &mut raw)
    }

    /// `ext4_fc_replay_link`.
    fn replay_link(&mut self, parent: u32, ino: u32, name: &[u8]) -> Result<()> {
        let Some(mut raw) = self.existing_inode(ino)? else { return Ok(()) };
        if is_dir(&raw) {
            return Err(not_replayed(format!(
                "fast-commit record LINK of a directory (inode {ino})"
            )));
        }
        if self.add_name(parent, ino, name, &raw)? {
            edit(&mut raw, |inode| inode.links_count = inode.links_count.saturating_add(1))?;
            self.write_inode_raw(ino, &mut raw)?;
        }
        Ok(())
    }

    /// `ext4_fc_replay_unlink` (`__ext4_unlink` in replay mode).
    fn replay_unlink(&mut self, parent: u32, ino: u32, name: &[u8]) -> Result<()> {
        let Some(mut raw) = self.existing_inode(ino)? else { return Ok(()) };
        let Some(mut parent_raw) = self.existing_inode(parent)? else { return Ok(()) };
        let found = self.with_dir(parent, &mut parent_raw, |io, ctx| dir::lookup(io, ctx, name))?;
        let Some((entry_ino, _)) = found else { return Ok(()) };
        if is_dir(&raw) {
            // rmdir: the name and the directory go, and with it its ".." in the parent.
            if entry_ino != ino {
                return Ok(());
            }
            if !self.with_dir(ino, &mut raw, |io, ctx| dir::is_empty(io, ctx))? {
                return Err(not_replayed(format!(
                    "fast-commit record UNLINK of directory inode {ino}, which is not empty,"
                )));
            }
            self.with_dir(parent, &mut parent_raw, |io, ctx| dir::remove_entry(io, ctx, name))?;
            edit(&mut raw, |inode| inode.links_count = 0)?;
            self.write_inode_raw(ino, &mut raw)?;
            self.unlinked.insert(ino);
            return self.change_dir_links(parent, -1);
        }
        if entry_ino == ino {
            self.with_dir(parent, &mut parent_raw, |io, ctx| dir::remove_entry(io, ctx, name))?;
        }
        if ext4::Inode::parse(&raw)?.links_count > 0 {
            edit(&mut raw, |inode| inode.links_count -= 1)?;
            self.write_inode_raw(ino, &mut raw)?;
            self.unlinked.insert(ino);
        }
        Ok(())
    }

    // ---- the end ----

    fn finish(mut self) -> Result<()> {
        for ino in std::mem::take(&mut self.unlinked) {
            let raw = self.read_inode_raw(ino)?;
            if ext4::Inode::parse(&raw)?.links_count == 0 {
                self.delete_inode(ino, raw)?;
                self.modified.retain(|&m| m != ino);
            }
        }
        // ext4_fc_set_bitmaps_and_counters, and the i_blocks each inode's tree gives.
        for ino in self.modified.clone() {
            let Some(mut raw) = self.existing_inode(ino)? else { continue };
            let blocks = self.set_inode_blocks_bits(ino, &raw, true)?;
            let inode = ext4::Inode::parse(&raw)?;
            if inode.flags & ext4::HUGE_FILE_FL != 0 {
                return Err(not_replayed(format!("fast-commit replay of huge_file inode {ino}")));
            }
            let xattr_blocks = u64::from(inode.file_acl != 0);
            let sectors = (blocks + xattr_blocks) * u64::from(self.geo.block_size / 512);
            edit(&mut raw, |inode| inode.blocks_raw = sectors)?;
            self.write_inode_raw(ino, &mut raw)?;
        }
        self.write_group_counts()?;
        self.write_staged()
    }

    /// Writes the staged blocks so that a crash part way is never replayed again over what
    /// reached the disk (which could follow a tree root to a leaf that did not): first the
    /// superblock records an error (ERROR_FS, which asks e2fsck for its full check), flushed;
    /// then every other block, flushed; then the superblock as the replay leaves it, flushed.
    /// A recovery that finds ERROR_FS with fast commits to replay refuses
    /// ([`FastCommitReplay::check`]).
    fn write_staged(&mut self) -> Result<()> {
        let block_size = u64::from(self.geo.block_size);
        let sb_block = self.sb.superblock_block();
        let sb_offset = (ext4::SUPERBLOCK_OFFSET % block_size) as usize;
        // Nothing wrote the device since `Replay::new` read the superblock.
        let mut marked = self.sb.clone();
        let final_sb_block = match self.staged.remove(&sb_block) {
            Some(bytes) => bytes,
            None => {
                let mut bytes = vec![0u8; block_size as usize];
                self.dev.read_at(sb_block * block_size, &mut bytes)?;
                bytes
            }
        };
        // ERROR_FS, not EXT4_FC_REPLAY: e2fsck 1.47.0 started on an image with EXT4_FC_REPLAY
        // set stops after its journal replay ("Superblock checksum does not match superblock
        // while trying to re-open") and needs a second run.
        marked.state |= ext4::STATE_ERROR_FS;
        self.dev.write_at(ext4::SUPERBLOCK_OFFSET, &marked.encode())?;
        self.dev.flush()?;
        for (block, bytes) in &self.staged {
            assert!(*block < self.geo.blocks_count && bytes.len() == self.geo.block_size as usize);
            self.dev.write_at(block * block_size, bytes)?;
        }
        self.dev.flush()?;
        let done = Superblock::parse(&final_sb_block[sb_offset..])?;
        assert_eq!(done.state & ext4::STATE_FC_REPLAY, 0, "the replay's own superblock");
        self.dev.write_at(sb_block * block_size, &final_sb_block)?;
        self.dev.flush()?;
        Ok(())
    }

    /// What e2fsck's check makes of an inode left without links: deleted, its blocks free.
    fn delete_inode(&mut self, ino: u32, mut raw: Vec<u8>) -> Result<()> {
        self.set_inode_blocks_bits(ino, &raw, false)?;
        let dir = is_dir(&raw);
        if self.set_inode_bit(ino, false)? && dir {
            let group = self.geo.group_of_inode(ino) as usize;
            self.descs[group].used_dirs = self.descs[group].used_dirs.saturating_sub(1);
        }
        let now = crate::filesystem::now().sec as u32;
        edit(&mut raw, |inode| inode.dtime = now)?;
        self.write_inode_raw(ino, &mut raw)
    }

    /// Recounts the free blocks and inodes of every group whose bitmaps changed, reseals the
    /// descriptors and bitmaps, and sets the superblock's free counts to the descriptors' sums.
    fn write_group_counts(&mut self) -> Result<()> {
        let touched = std::mem::take(&mut self.touched);
        for &group in &touched {
            let g = group as usize;
            let in_group = self.geo.blocks_in_group(group);
            let bitmap = self.read_meta(self.descs[g].block_bitmap)?;
            let free_blocks = (0..in_group).filter(|&bit| !bit_set(&bitmap, bit)).count() as u32;
            let inode_bitmap = self.read_meta(self.descs[g].inode_bitmap)?;
            let free_inodes = (0..self.geo.inodes_per_group)
                .filter(|&bit| !bit_set(&inode_bitmap, bit))
                .count() as u32;
            assert!(free_blocks <= in_group && free_inodes <= self.geo.inodes_per_group);
            let desc = &mut self.descs[g];
            desc.free_blocks = free_blocks;
            desc.free_inodes = free_inodes;
            if self.geo.metadata_csum {
                let block_bytes = (self.geo.blocks_per_group / 8) as usize;
                let inode_bytes = (self.geo.inodes_per_group / 8) as usize;
                desc.block_bitmap_csum = ext4::bitmap_checksum(&self.sb, &bitmap[..block_bytes]);
                desc.inode_bitmap_csum =
                    ext4::bitmap_checksum(&self.sb, &inode_bitmap[..inode_bytes]);
            }
            let desc = *desc;
            let table_block = self.sb.group_desc_block(group / self.geo.descs_per_block);
            let offset = (group % self.geo.descs_per_block) as usize * self.geo.desc_size;
            let mut table = self.read_meta(table_block)?;
            let slot = &mut table[offset..offset + self.geo.desc_size];
            desc.encode_into(slot, self.geo.desc_size);
            ext4::set_group_desc_checksum(&self.sb, group, slot);
            self.write_meta(table_block, &table)?;
        }
        if touched.is_empty() {
            return Ok(());
        }
        // The kernel keeps the superblock's counts only roughly up to date and sums the
        // descriptors at mount; e2fsck wants them exact, so they are the descriptors' sums.
        let mut sb = self.sb.clone();
        sb.free_blocks_count = self.descs.iter().map(|d| u64::from(d.free_blocks)).sum();
        sb.free_inodes_count = self.descs.iter().map(|d| d.free_inodes).sum();
        let bytes = sb.encode();
        let block = self.sb.superblock_block();
        let offset = (ext4::SUPERBLOCK_OFFSET % u64::from(self.geo.block_size)) as usize;
        let mut staged = self.read_meta(block)?;
        staged[offset..offset + bytes.len()].copy_from_slice(&bytes);
        self.write_meta(block, &staged)
    }

    // ---- inodes ----

    /// What the kernel's `EXT4_IGET_NORMAL` lets a fast commit name: the root or an ordinary
    /// inode, never a reserved one (journal, resize, quota …) or the orphan file.
    fn valid_ino(&self, ino: u32) -> bool {
        (ino == ext4::ROOT_INO || (self.sb.first_ino..=self.geo.inodes_count).contains(&ino))
            && ino != self.sb.orphan_file_inum
            && ino != self.sb.journal_inum
    }

    fn inode_location(&self, ino: u32) -> (u64, usize) {
        assert!(self.valid_ino(ino));
        let group = self.geo.group_of_inode(ino) as usize;
        self.geo.inode_location(self.descs[group].inode_table, ino)
    }

    fn read_inode_raw(&mut self, ino: u32) -> Result<Vec<u8>> {
        let (block, offset) = self.inode_location(ino);
        let bytes = self.read_meta(block)?;
        Ok(bytes[offset..offset + usize::from(self.geo.inode_size)].to_vec())
    }

    /// Writes `raw` (checksum updated) into inode `ino`'s record.
    fn write_inode_raw(&mut self, ino: u32, raw: &mut [u8]) -> Result<()> {
        ext4::set_inode_checksum(&self.sb, ino, raw);
        let (block, offset) = self.inode_location(ino);
        let mut bytes = self.read_meta(block)?;
        bytes[offset..offset + raw.len()].copy_from_slice(raw);
        self.write_meta(block, &bytes)
    }

    /// What `ext4_iget` accepts during replay: a record with links and a good checksum.
    fn in_use(&self, ino: u32, raw: &[u8]) -> bool {
        ext4::Inode::parse(raw).is_ok_and(|inode| inode.links_count != 0)
            && ext4::inode_checksum_ok(&self.sb, ino, raw)
    }

    /// Inode `ino`'s record when `ext4_iget` would find it (`None`: the record is skipped).
    fn existing_inode(&mut self, ino: u32) -> Result<Option<Vec<u8>>> {
        if !self.valid_ino(ino) {
            return Ok(None);
        }
        let raw = self.read_inode_raw(ino)?;
        Ok(self.in_use(ino, &raw).then_some(raw))
    }

    fn note_modified(&mut self, ino: u32) {
        if !self.modified.contains(&ino) {
            self.modified.push(ino);
        }
    }

    /// `ext4_mark_inode_used`: sets the inode's bit; a newly used inode counts in its group's
    /// directories and moves `itable_unused` past it. Whether the bit was clear.
    fn mark_inode_used(&mut self, ino: u32, raw: &[u8]) -> Result<bool> {
        if !self.set_inode_bit(ino, true)? {
            return Ok(false);
        }
        let group = self.geo.group_of_inode(ino) as usize;
        let desc = &mut self.descs[group];
        if is_dir(raw) {
            desc.used_dirs += 1;
        }
        if self.geo.uninit_flags {
            let index = (ino - 1) % self.geo.inodes_per_group + 1;
            if index > self.geo.inodes_per_group.saturating_sub(desc.itable_unused) {
                desc.itable_unused = self.geo.inodes_per_group - index;
            }
        }
        Ok(true)
    }

    /// The extent context and root of an in-use inode a range record names.
    fn extent_root(
        &self,
        ino: u32,
        raw: &[u8],
        record: &str,
    ) -> Result<(ExtentCtx, [u8; INODE_BLOCK_SIZE])> {
        let inode = ext4::Inode::parse(raw)?;
        if !inode.uses_extents() {
            return Err(not_replayed(format!(
                "fast-commit record {record} on inode {ino} without extents"
            )));
        }
        let (inode_block, _) = self.inode_location(ino);
        let generation = inode.generation;
        let ctx = ExtentCtx {
            ino,
            inode_block,
            csum_seed: self
                .geo
                .metadata_csum
                .then(|| ext4::inode_csum_seed(&self.sb, ino, generation)),
            goal: self.geo.group_first_block(self.geo.group_of_inode(ino)),
        };
        let mut root = [0u8; INODE_BLOCK_SIZE];
        root.copy_from_slice(&raw[I_BLOCK..I_BLOCK + INODE_BLOCK_SIZE]);
        Ok((ctx, root))
    }

    /// Sets (or clears) the bits of every data and tree block of inode `ino` (`raw`), as
    /// `ext4_fc_set_bitmaps_and_counters` (or `ext4_ext_clear_bb`) do; returns how many blocks
    /// that is. Inodes without extents own no blocks here (INODE refuses them).
    fn set_inode_blocks_bits(&mut self, ino: u32, raw: &[u8], used: bool) -> Result<u64> {
        if !ext4::Inode::parse(raw)?.uses_extents() {
            return Ok(0);
        }
        let (ctx, root) = self.extent_root(ino, raw, "INODE")?;
        let extents = extent_tree::extents(self, &ctx, &root)?;
        let tree = extent_tree::tree_blocks(self, &ctx, &root)?;
        let mut count = tree.len() as u64;
        for block in tree {
            self.set_block_bits(block, 1, used)?;
        }
        for extent in extents {
            self.set_block_bits(extent.start, u64::from(extent.len), used)?;
            count += u64::from(extent.len);
        }
        Ok(count)
    }

    /// Runs a directory-module operation on directory `dir_ino` (record `raw`, written back
    /// afterwards with whatever the operation changed: size, flags, extent root).
    fn with_dir<R>(
        &mut self,
        dir_ino: u32,
        raw: &mut Vec<u8>,
        op: impl FnOnce(&mut dyn dir::DirIo, &DirCtx) -> Result<R>,
    ) -> Result<R> {
        if !is_dir(raw) {
            return Err(FsError::NotDir);
        }
        let (ectx, _) = self.extent_root(dir_ino, raw, "directory entry")?;
        let inode = ext4::Inode::parse(raw)?;
        let ctx = DirCtx {
            ino: dir_ino,
            csum_seed: ectx.csum_seed,
            dir_index: self.sb.feature_compat & ext4::feature::COMPAT_DIR_INDEX != 0,
            largedir: self.sb.feature_incompat & ext4::feature::INCOMPAT_LARGEDIR != 0,
            hash_version: self.sb.effective_hash_version(),
            hash_seed: self.sb.hash_seed,
        };
        let mut data = InodeData::new(inode, raw.clone(), false);
        let groups = self.groups.clone();
        let block_size = self.geo.block_size;
        // An inline directory has no extent root: `extent_root` refused it above.
        let mut access = DirAccess {
            io: self,
            data: &mut data,
            ectx,
            block_size,
            groups: &groups,
            inline: None,
            extents: true,
        };
        let value = op(&mut access, &ctx)?;
        data.inode.encode_into(&mut data.raw);
        if data.raw != *raw {
            *raw = data.raw;
            self.write_inode_raw(dir_ino, raw)?;
            self.note_modified(dir_ino);
        }
        Ok(value)
    }

    /// `ext4_fc_replay_link_internal`: adds `name` -> `ino` to directory `parent`; `Ok(false)`
    /// when the name is there already or the parent is not in use (nothing changed).
    fn add_name(&mut self, parent: u32, ino: u32, name: &[u8], raw: &[u8]) -> Result<bool> {
        let Some(mut parent_raw) = self.existing_inode(parent)? else { return Ok(false) };
        let file_type = ondisk::ext4::dir::file_type_from_mode(ext4::Inode::parse(raw)?.mode);
        let present =
            self.with_dir(parent, &mut parent_raw, |io, ctx| dir::lookup(io, ctx, name))?;
        if present.is_some() {
            return Ok(false);
        }
        self.with_dir(parent, &mut parent_raw, |io, ctx| {
            dir::add_entry(io, ctx, name, ino, file_type)
        })?;
        Ok(true)
    }

    // ---- bitmaps ----

    fn touch(&mut self, group: u32) {
        self.touched.insert(group);
    }

    /// Sets or clears the bits of blocks `start .. start + count`.
    fn set_block_bits(&mut self, start: u64, count: u64, used: bool) -> Result<()> {
        let end = start.saturating_add(count);
        if start < u64::from(self.geo.first_data_block) || end > self.geo.blocks_count {
            return Err(FsError::BlockOutOfRange {
                block: start,
                blocks_count: self.geo.blocks_count,
            });
        }
        if !used && count > 0 {
            self.released.push((start, end));
        }
        let mut block = start;
        while block < end {
            let group = self.geo.group_of_block(block);
            let group_end =
                self.geo.group_first_block(group) + u64::from(self.geo.blocks_in_group(group));
            let run_end = end.min(group_end);
            self.group_bitmap(group, ext4::BG_BLOCK_UNINIT)?;
            self.touch(group);
            let bitmap_block = self.descs[group as usize].block_bitmap;
            let mut bitmap = self.read_meta(bitmap_block)?;
            let first = self.geo.group_first_block(group);
            for b in block..run_end {
                set_bit(&mut bitmap, (b - first) as u32, used);
            }
            self.write_meta(bitmap_block, &bitmap)?;
            block = run_end;
        }
        Ok(())
    }

    /// Sets or clears inode `ino`'s bit; whether it changed.
    fn set_inode_bit(&mut self, ino: u32, used: bool) -> Result<bool> {
        let group = self.geo.group_of_inode(ino);
        self.group_bitmap(group, ext4::BG_INODE_UNINIT)?;
        let bitmap_block = self.descs[group as usize].inode_bitmap;
        let mut bitmap = self.read_meta(bitmap_block)?;
        let bit = (ino - 1) % self.geo.inodes_per_group;
        if bit_set(&bitmap, bit) == used {
            return Ok(false);
        }
        self.touch(group);
        set_bit(&mut bitmap, bit, used);
        self.write_meta(bitmap_block, &bitmap)?;
        Ok(true)
    }

    /// Builds group `group`'s bitmap of `kind` when it was never written (BLOCK_UNINIT /
    /// INODE_UNINIT), as `ext4_mark_inode_used` and the block bitmap read do during the
    /// kernel's replay: the image an uninitialized group has, staged, and the flag cleared. A
    /// new directory often lands in such a group (the Orlov allocator spreads directories).
    fn group_bitmap(&mut self, group: u32, uninit_flag: u16) -> Result<()> {
        let g = group as usize;
        if !self.geo.uninit_flags || self.descs[g].flags & uninit_flag == 0 {
            return Ok(());
        }
        let (block, image) = if uninit_flag == ext4::BG_INODE_UNINIT {
            (self.descs[g].inode_bitmap, self.groups.uninit_inode_bitmap())
        } else {
            (self.descs[g].block_bitmap, self.groups.uninit_block_bitmap(group))
        };
        self.write_meta(block, &image)?;
        self.descs[g].flags &= !uninit_flag;
        self.touch(group);
        if uninit_flag == ext4::BG_INODE_UNINIT {
            // ext4_mark_inode_used builds the group's block bitmap too, if it was never built.
            self.group_bitmap(group, ext4::BG_BLOCK_UNINIT)?;
        }
        Ok(())
    }

    fn block_is_free(&mut self, block: u64) -> Result<bool> {
        if self
            .excluded
            .iter()
            .chain(&self.released)
            .any(|&(start, end)| (start..end).contains(&block))
            || self.groups.system_zone_overlap(block, 1).is_some()
        {
            return Ok(false);
        }
        let group = self.geo.group_of_block(block);
        let desc = &self.descs[group as usize];
        if self.geo.uninit_flags && desc.flags & ext4::BG_BLOCK_UNINIT != 0 {
            return Ok(false);
        }
        let bitmap = self.read_meta(desc.block_bitmap)?;
        Ok(!bit_set(&bitmap, (block - self.geo.group_first_block(group)) as u32))
    }
}

impl MetaIo for Replay {
    fn block_size(&self) -> usize {
        self.geo.block_size as usize
    }

    fn blocks_count(&self) -> u64 {
        self.geo.blocks_count
    }

    fn read_meta(&mut self, block: u64) -> Result<Vec<u8>> {
        if block >= self.geo.blocks_count {
            return Err(FsError::BlockOutOfRange { block, blocks_count: self.geo.blocks_count });
        }
        if let Some(bytes) = self.staged.get(&block) {
            return Ok(bytes.clone());
        }
        let mut bytes = vec![0u8; self.geo.block_size as usize];
        self.dev.read_at(block * u64::from(self.geo.block_size), &mut bytes)?;
        Ok(bytes)
    }

    fn write_meta(&mut self, block: u64, data: &[u8]) -> Result<()> {
        assert_eq!(data.len(), self.geo.block_size as usize);
        if block >= self.geo.blocks_count {
            return Err(FsError::BlockOutOfRange { block, blocks_count: self.geo.blocks_count });
        }
        self.staged.insert(block, data.to_vec());
        Ok(())
    }

    /// The replay's allocator: the first free block from `goal` on that no valid ADD_RANGE
    /// maps (as the kernel's, which excludes those regions).
    fn alloc_meta_block(&mut self, goal: u64) -> Result<u64> {
        let first = u64::from(self.geo.first_data_block);
        let goal = goal.clamp(first, self.geo.blocks_count - 1);
        let candidates = (goal..self.geo.blocks_count).chain(first..goal);
        for block in candidates {
            if self.block_is_free(block)? {
                self.set_block_bits(block, 1, true)?;
                return Ok(block);
            }
        }
        Err(FsError::NoSpace)
    }

    fn free_meta_block(&mut self, block: u64) -> Result<()> {
        self.set_block_bits(block, 1, false)
    }

    fn free_data_blocks(&mut self, start: u64, count: u64) -> Result<()> {
        self.set_block_bits(start, count, false)
    }
}

fn is_dir(raw: &[u8]) -> bool {
    ext4::Inode::parse(raw).is_ok_and(|inode| inode.is_dir())
}

/// Changes inode record `raw` through its decoded fields (the checksum is set on writing).
fn edit(raw: &mut [u8], change: impl FnOnce(&mut ext4::Inode)) -> Result<()> {
    let mut inode = ext4::Inode::parse(raw)?;
    change(&mut inode);
    inode.encode_into(raw);
    Ok(())
}

fn le32(raw: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([raw[at], raw[at + 1], raw[at + 2], raw[at + 3]])
}

fn bit_set(bitmap: &[u8], bit: u32) -> bool {
    bitmap[(bit / 8) as usize] & (1 << (bit % 8)) != 0
}

fn set_bit(bitmap: &mut [u8], bit: u32, on: bool) {
    let byte = &mut bitmap[(bit / 8) as usize];
    if on {
        *byte |= 1 << (bit % 8);
    } else {
        *byte &= !(1 << (bit % 8));
    }
}
