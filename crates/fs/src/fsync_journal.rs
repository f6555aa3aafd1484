//! iJournaling's file-level fsync transactions (ATC'17; DESIGN.md §3.6), written as ext4 fast
//! commits (`fsync_journal = on`): the file system's side.
//!
//! An fsync of a file whose changes all sit in the running transaction writes only that file:
//! the ranges whose mapping changed (ADD_RANGE for what is mapped now, DEL_RANGE for what is not)
//! and then the INODE record, the order ext4's fast commit writes an inode in. The journal makes
//! them durable in its fast-commit area (`journal::Journal::fast_commit`) and the transaction
//! commits later on its own, superseding them. Recovery by quill (`fast_commit.rs`), e2fsck and
//! the kernel replays them on top of the last full commit.
//!
//! Which changes a fast commit expresses is a whitelist, kept per inode for the transaction its
//! last change joined ([`FcTrack`]): every inode write is inexpressible unless its caller said
//! otherwise just before it. Expressible today:
//!
//! | change | records |
//! |---|---|
//! | a writeback step (data written, blocks mapped or unwritten ones converted, size grown) | the step's logical range, then INODE |
//! | attributes without a size change (mode, owner, times; `setattr`) | INODE |
//! | an access time (`relatime`) | INODE |
//! | a regular file created (`create`), where replay can add its name ([`Filesystem::create_record`]) | INODE, its ranges, CREAT, INODE |
//! | ... under a name removed in the same transaction, whose old file replay can delete ([`Filesystem::unlink_record`]) | the old file's DEL_RANGE, INODE and UNLINK first |
//! | a regular file renamed (`rename`), where replay can add the new name as it would a created one ([`Filesystem::rename_record`]) | LINK of the new name, UNLINK of the old, then its ranges and INODE |
//! | ... over another file, or to a name removed in the same transaction, whose file replay can delete | that file's DEL_RANGE, INODE and UNLINK first |
//!
//! A file's names (CREAT, renames) are carried by each fast commit until one carrying them is
//! durable, and then never again: replay applies a transaction's fast commits in order.
//!
//! Everything else falls back to committing the transaction, counted by reason in the journal's
//! figures (`fast_commit_fallbacks`): the kernel's ineligible operations (xattrs, exchanges,
//! fallocate ranges, journaled data); renames of directories, special files and symlinks, and
//! renames that leave a whiteout; a creation or rename replay could not redo (a directory,
//! special file or symlink; a parent that is new or grew in the same transaction, or lost a
//! name from the leaf where replay would have no room for it; an inode number freed in it; a
//! name removed in it whose old file replay could not delete); hard links and a file's own
//! unlinks; truncation (the orphan list); and fsync of a directory, of a hard-linked inode, of
//! an inode without extents or with an external xattr block, or of one in the journal inode's
//! inode-table block (the last two for the kernel's and e2fsck 1.47.0's replays).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use journal::FastCommitOutcome;
use ondisk::ext4::{self, Extent};
use ondisk::jbd2::fast_commit::{FcDentryOp, FcRecord};
use ondisk::Tid;

use crate::adapters::{extent_ctx, ReadIo};
use crate::error::Result;
use crate::extent_tree::{self, Lookup};
use crate::filesystem::{DataMode, Filesystem};
use crate::inodes::InodeData;

/// The reason counted for every fsync with fsync_journal on a file system without the
/// fast_commit feature (no area e2fsck or the kernel would read).
pub const NO_FEATURE: &str = "no fast_commit feature";
/// ... and on one whose journal is too small for the area beside JBD2's minimum log (1024
/// blocks), where the kernel turns fast commits off too.
pub const NO_ROOM: &str = "journal too small";

/// The reason counted for an inode in the journal inode's inode-table block
/// ([`Filesystem::shares_journal_inode_block`]): e2fsck 1.47.0 would lose its neighbours.
pub const E2FSCK_ITABLE: &str = "journal inode's table block (e2fsck 1.47.0)";

/// The reason counted while a group initialized in this mount (BLOCK_UNINIT or INODE_UNINIT
/// cleared) is not checkpointed ([`Filesystem::group_initialized_in_log`]).
pub const E2FSCK_UNINIT: &str = "group initialized in the log (e2fsck 1.47.0)";

/// The reason counted for a file created in an inode whose slot still holds another inode's
/// in-inode xattrs ([`Filesystem::inode_slot_tail_clean`]).
pub const STALE_XATTRS: &str = "inode slot with old in-inode xattrs";

/// The reason counted for a file with an external xattr block: the kernel's fast-commit
/// replay (`ext4_ext_replay_set_iblocks`) and e2fsck 1.47.0's recompute its i_blocks from the
/// extent tree alone and drop the xattr block from it (seen in the crash explorer; quill's
/// replay counts it, and e2fsck then has to fix the kernel's and its own).
pub const XATTR_BLOCK: &str = "xattr block (kernel and e2fsck 1.47.0 replays miscount i_blocks)";

/// The reason counted for a file that took the name of a file fast-committed in the same
/// transaction, with per-core areas that put the two files' fast commits in different areas:
/// recovery replays the areas in index order, and the replaced file's own fast commit, replayed
/// after the one that deletes it, would bring it back (`fc_commit.rs` in the journal crate).
pub const REPLACED_ELSEWHERE: &str = "replaced file's fast commits in another area";

/// The reason counted for an inode write whose caller did not say what it was.
const OTHER_CHANGE: &str = "metadata change";
/// An inode whose in-inode attributes name a value inode (ea_inode): its i_blocks carries a
/// charge a replay would not put back.
pub const VALUE_INODE: &str = "xattr value in an inode of its own";
/// A name made in, moved into or out of a directory that was inline at the last commit:
/// quill's replay adds and removes names only in directories with blocks.
pub const INLINE_DIRECTORY: &str = "inline directory";

/// What one inode's changes in one transaction are, for a fast commit of them.
#[derive(Debug, Default)]
pub(crate) struct FcTrack {
    /// The transaction the rest describes: the one the inode's last change joined.
    tid: Option<Tid>,
    /// Why a fast commit cannot express the changes (the first reason seen).
    ineligible: Option<&'static str>,
    /// Logical blocks whose mapping changed since the last durable fast commit of the inode
    /// (first and last), each with its number in `range_notes`. A fast commit carries the
    /// ranges changed since the one before it that is durable, as the kernel's does
    /// (`ext4_fc_reset_inode` after a commit): replay applies a transaction's fast commits
    /// one after the other. Not since the last one queued: that one may still fall back.
    ranges: Vec<(u64, u32, u32)>,
    /// Ranges noted in `tid` so far, and how many of them the newest fast commit planned
    /// carries.
    range_notes: u64,
    range_notes_planned: u64,
    /// Inode writes in `tid`, and how many of them a fast commit has made durable.
    changes: u64,
    synced: u64,
    /// What the next inode write is: expressible (`Ok`), or inexpressible for this reason.
    next: Option<std::result::Result<(), &'static str>>,
    /// The file's names made and moved in `tid` (its CREAT, its renames), in order, each with
    /// its number in `dentry_notes`, until a fast commit carrying them is durable: replay
    /// applies a transaction's fast commits one after the other, so each is written once.
    dentries: Vec<(u64, DentryNote)>,
    dentry_notes: u64,
    /// Whether the inode was created in `tid` (whether or not a CREAT record expresses it).
    born: bool,
    /// Whether a fast commit of the inode was planned in `tid` (durable or not).
    fast_committed: bool,
    /// Whether the file was renamed in `tid`: its name at replay is the last commit's unless a
    /// fast commit of the rename is durable, so no other file's records may UNLINK it
    /// ([`Filesystem::unlink_record`]).
    moved: bool,
    /// A directory: why no file created in it during `tid` from now on can be a CREAT record
    /// ([`Filesystem::create_record`]).
    creates_blocked: Option<&'static str>,
    /// A directory: the leaf blocks that lost a name during `tid`, and the names lost, each
    /// with the records that delete its file at replay where fast commits can
    /// ([`Filesystem::unlink_record`]).
    removed_from: BTreeSet<u32>,
    removed_names: HashMap<Box<[u8]>, Option<Arc<Unlinked>>>,
    /// A directory: each block written during `tid`, with the room a replay finds in it and
    /// what the CREAT records of names put there take ([`FcTrack::admit_create`]).
    leaf_room: BTreeMap<u32, LeafRoom>,
}

/// A file whose last name was removed in the running transaction, as a fast commit deletes it
/// at replay: DEL_RANGE of everything it maps, an INODE record with one link, no size and an
/// empty extent tree, then UNLINK of its name. The kernel's replay (`__ext4_unlink`) drops the
/// link and frees the inode; quill's does the same; e2fsck 1.47.0's removes the name only, and
/// its full check then clears the unattached zero-length inode the records left (the
/// explorer allows exactly that for inodes an UNLINK record names). An INODE record with no
/// links would serve e2fsck better, but the kernel's replay refuses it (`ext4_iget`: ESTALE),
/// and without the records the kernel would keep the old entry and the new file no name.
#[derive(Debug)]
pub(crate) struct Unlinked {
    ino: u32,
    /// One past the last logical block it mapped: DEL_RANGE `0..mapped_end` (none for 0).
    mapped_end: u32,
    /// The INODE record's raw inode.
    raw: Box<[u8]>,
    /// Whether a fast commit of the file was planned in the transaction that removed its name:
    /// the fast commit that deletes it must then go to the same area ([`REPLACED_ELSEWHERE`]).
    fast_committed: bool,
}

/// The reason counted for a file created under a name removed in the same transaction whose
/// old file the fast commit cannot delete at replay (see [`Filesystem::unlink_record`]).
pub const NAME_REUSED: &str = "name reused";

/// A name a file was given in the running transaction, as its fast commit writes it.
#[derive(Debug, Clone)]
enum DentryNote {
    /// Created as `name` in `parent` (CREAT), where `replaces` is the file that name named at
    /// the last commit, deleted first.
    Create { parent: u32, name: Box<[u8]>, replaces: Option<Arc<Unlinked>> },
    /// Renamed from one name to another (LINK of the new, UNLINK of the old, as ext4's rename
    /// tracks it), where `replaces` is the file the new name named, deleted first.
    Rename { from: (u32, Box<[u8]>), to: (u32, Box<[u8]>), replaces: Option<Arc<Unlinked>> },
}

impl DentryNote {
    /// The file this name replaced, deleted first at replay.
    fn replaces(&self) -> Option<&Unlinked> {
        match self {
            DentryNote::Create { replaces, .. } | DentryNote::Rename { replaces, .. } => {
                replaces.as_deref()
            }
        }
    }
}

/// One directory block's room for CREAT records in a transaction.
#[derive(Debug, Clone, Copy)]
struct LeafRoom {
    /// The largest room one record of the block had when the transaction first wrote it
    /// ([`crate::dir::largest_room`]): the block as the last full commit left it.
    at_start: usize,
    /// What the names admitted as CREAT records into the block take (`dir_rec_len` each).
    admitted: usize,
}

/// The reason counted for a file created in an indexed directory's leaf that lost a name in
/// the running transaction and had too little room at its start ([`FcTrack::admit_create`]).
pub const LEAF_FULL: &str = "directory leaf without room at the last commit";

impl FcTrack {
    /// Starts over when `tid` is a newer transaction than the one tracked.
    fn at(&mut self, tid: Tid) -> &mut Self {
        if self.tid != Some(tid) {
            let next = self.next.take();
            *self = FcTrack { tid: Some(tid), next, ..FcTrack::default() };
        }
        self
    }

    /// No fast commit expresses this inode's changes in `tid`, for `reason`, whatever later
    /// writes in `tid` say ([`FcTrack::expressible_next`] does not undo it).
    pub fn ineligible_in(&mut self, tid: Tid, reason: &'static str) {
        self.at(tid).ineligible.get_or_insert(reason);
    }

    /// The caller's next inode write is one a fast commit expresses (see the module table).
    pub fn expressible_next(&mut self) {
        self.next = Some(Ok(()));
    }

    /// The caller's next inode write is one a fast commit cannot express, for `reason`.
    pub fn ineligible_next(&mut self, reason: &'static str) {
        self.next = Some(Err(reason));
    }

    /// Logical blocks `first..=last` may map differently after `tid`'s changes.
    pub fn note_range(&mut self, tid: Tid, first: u32, last: u32) {
        let t = self.at(tid);
        t.range_notes += 1;
        let note = t.range_notes;
        let planned = t.range_notes_planned;
        match t.ranges.last_mut() {
            // An append extends the last note while no fast commit carries that one yet.
            Some((n, a, b)) if *n > planned && *a <= first && first <= b.saturating_add(1) => {
                (*n, *b) = (note, (*b).max(last));
            }
            _ => t.ranges.push((note, first, last)),
        }
    }

    /// The inode, written in `tid` already, was created there as `name` in `parent`: a CREAT
    /// record expresses that (or cannot, for `Err(reason)`).
    pub fn created(
        &mut self,
        tid: Tid,
        dentry: std::result::Result<CreateRecord<'_>, &'static str>,
    ) {
        let t = self.at(tid);
        t.born = true;
        match dentry {
            Ok(CreateRecord { parent, name, replaces }) => {
                t.note_dentry(DentryNote::Create { parent, name: name.into(), replaces });
            }
            Err(reason) => {
                t.ineligible.get_or_insert(reason);
            }
        }
    }

    /// The file, about to be written in `tid`, was renamed from `from` to `to`: LINK and UNLINK
    /// records express that (`Ok`, with the file `to` named at the last commit, deleted
    /// first), or cannot (`Err(reason)`, for the inode write that follows).
    pub fn renamed(
        &mut self,
        tid: Tid,
        from: (u32, &[u8]),
        to: (u32, &[u8]),
        record: std::result::Result<Option<Arc<Unlinked>>, &'static str>,
    ) {
        match record {
            Ok(replaces) => {
                let t = self.at(tid);
                t.moved = true;
                let (from, to) = ((from.0, from.1.into()), (to.0, to.1.into()));
                t.note_dentry(DentryNote::Rename { from, to, replaces });
                self.expressible_next();
            }
            Err(reason) => self.ineligible_next(reason),
        }
    }

    fn note_dentry(&mut self, note: DentryNote) {
        self.dentry_notes += 1;
        self.dentries.push((self.dentry_notes, note));
    }

    /// A directory: files created in it during `tid` from now on cannot be CREAT records.
    pub fn block_creates(&mut self, tid: Tid, reason: &'static str) {
        self.at(tid).creates_blocked.get_or_insert(reason);
    }

    /// A directory: whether creations in it are blocked in `tid` ([`FcTrack::block_creates`]).
    pub fn creates_blocked(&self, tid: Tid) -> bool {
        self.tid == Some(tid) && self.creates_blocked.is_some()
    }

    /// A directory: `name` was removed from its leaf block `lblk` during `tid`.
    pub fn note_removal(&mut self, tid: Tid, lblk: u32, name: &[u8]) {
        let t = self.at(tid);
        t.removed_from.insert(lblk);
        t.removed_names.insert(name.into(), None);
    }

    /// A directory: the file `name` named until its removal in `tid` (noted already) is
    /// deleted at replay by `records`.
    pub fn note_unlinked(&mut self, tid: Tid, name: &[u8], records: Unlinked) {
        if let Some(slot) = self.at(tid).removed_names.get_mut(name) {
            *slot = Some(Arc::new(records));
        }
    }

    /// A directory: whether `tid` has noted the room of its block `lblk` yet.
    pub fn leaf_room_known(&self, tid: Tid, lblk: u32) -> bool {
        self.tid == Some(tid) && self.leaf_room.contains_key(&lblk)
    }

    /// A directory: its block `lblk`, about to be written in `tid` for the first time, has
    /// `room` ([`crate::dir::largest_room`]).
    pub fn note_leaf_room(&mut self, tid: Tid, lblk: u32, room: usize) {
        self.at(tid).leaf_room.entry(lblk).or_insert(LeafRoom { at_start: room, admitted: 0 });
    }

    /// A directory: whether a file created in it now, in `tid`, as `name` in leaf block `lblk`,
    /// can be a CREAT record ([`Filesystem::create_record`]); `Err` says why not. An admitted
    /// name counts against the leaf's room. `leaf_by_name`: replay puts the name in `lblk` too
    /// (an htree, or a directory of one block: [`Filesystem::leaf_by_name`]).
    ///
    /// A leaf that lost a name in `tid` holds that name still at the last commit, so the room
    /// the name went into may not be there at replay. Replay puts each CREAT's name in the
    /// first record with room for it (`ext4_find_dest_de`, e2fsprogs' `link_proc`), and
    /// taking `n` bytes from a record leaves it `n` bytes less room: so if one record had room
    /// for all the names admitted into the leaf together, each of them finds room, in
    /// whatever order the fast commits replay them. An htree puts a name in the leaf its hash
    /// selects, at replay as now (its index did not change in `tid`: that blocks every
    /// creation, `creates_blocked`), and a directory of one block has one leaf; a longer
    /// linear directory's replay may put it in any block, so there a lost name still blocks
    /// the creation.
    ///
    /// A name removed in `tid` is admitted only with the records that delete its old file at
    /// replay first (returned): the kernel's replay keeps an entry it finds (`-EEXIST` is
    /// success there), and the new inode would have no name. The old entry's space is then free
    /// at replay, but the name is still counted against the leaf's room: replay may put it in
    /// another record of the leaf, one the other names counted on.
    fn admit_create(
        &mut self,
        tid: Tid,
        lblk: u32,
        name: &[u8],
        leaf_by_name: bool,
    ) -> std::result::Result<Option<Arc<Unlinked>>, &'static str> {
        let t = self.at(tid);
        if let Some(reason) = t.creates_blocked {
            return Err(reason);
        }
        let replaces = match t.removed_names.get(name) {
            None => None,
            Some(None) => return Err(NAME_REUSED),
            Some(Some(unlinked)) => Some(unlinked.clone()),
        };
        let lost_a_name = t.removed_from.contains(&lblk);
        if lost_a_name && !leaf_by_name {
            return Err("directory block lost a name");
        }
        let needed = ext4::dir::dir_rec_len(name.len());
        match t.leaf_room.get_mut(&lblk) {
            Some(room) => {
                if lost_a_name && room.admitted + needed > room.at_start {
                    return Err(LEAF_FULL);
                }
                room.admitted += needed;
                Ok(replaces)
            }
            None if lost_a_name => Err(LEAF_FULL),
            None => Ok(replaces),
        }
    }

    /// An inode write in `tid` (`Filesystem::write_inode`): expressible only if its caller said
    /// so just before it.
    pub fn note_write(&mut self, tid: Tid) {
        let next = self.next.take().unwrap_or(Err(OTHER_CHANGE));
        let t = self.at(tid);
        t.changes += 1;
        if let Err(reason) = next {
            t.ineligible.get_or_insert(reason);
        }
    }
}

/// How much of an inode's `raw_len`-byte record an INODE record carries, as ext4's fast
/// commit writes it: the 128-byte base and the extra fields in use
/// (`EXT4_GOOD_OLD_INODE_SIZE + i_extra_isize`).
fn fc_inode_len(inode: &ext4::Inode, raw_len: usize) -> usize {
    (128 + usize::from(inode.extra_isize)).min(raw_len)
}

/// Whether the in-inode area of `raw` (the inode's whole slot) opens with the xattr magic, as
/// e2fsck's pass 4 tests it.
/// Whether the in-inode attributes name a value inode (ea_inode): a replay sets i_blocks from
/// the extent tree, without the owner's charge for its value inodes.
fn names_value_inodes(inode: &ext4::Inode, raw: &[u8]) -> bool {
    let area = &raw[inode.xattr_area_range(raw.len())];
    match ext4::xattr::parse_inode_xattrs(area) {
        Ok(entries) => entries.iter().any(|e| e.value_inode.is_some()),
        // Damage: no fast commit vouches for it.
        Err(_) => true,
    }
}

fn has_in_inode_xattrs(inode: &ext4::Inode, raw: &[u8]) -> bool {
    let area = &raw[inode.xattr_area_range(raw.len())];
    area.len() >= 4 && area[..4] == ext4::xattr::XATTR_MAGIC.to_le_bytes()
}

/// What a CREAT record of a new file names, and the old file it replaces.
pub(crate) struct CreateRecord<'n> {
    parent: u32,
    name: &'n [u8],
    replaces: Option<Arc<Unlinked>>,
}

/// A fast commit of one inode, built under its lock: its ADD_RANGE / DEL_RANGE records (which
/// borrow nothing) and the raw inode its INODE record carries.
pub(crate) struct FcPlan {
    tid: Tid,
    ino: u32,
    ranges: Vec<FcRecord<'static>>,
    raw: Vec<u8>,
    /// The names the file was given in `tid` not yet durable, in order.
    dentries: Vec<DentryNote>,
    /// `FcTrack::changes` when built: what the fast commit makes durable.
    changes: u64,
    /// `FcTrack::range_notes` and `FcTrack::dentry_notes` when built: the ranges and names
    /// it carries.
    range_notes: u64,
    dentry_notes: u64,
}

/// What fsync should do about the inode's changes in transaction `tid`.
pub(crate) enum FsyncPlan {
    /// Write this fast commit.
    FastCommit(FcPlan),
    /// A fast commit made every change durable already.
    AlreadyDurable,
    /// Commit the transaction (the reason, if a fast commit was wanted, is counted).
    Commit,
}

impl Filesystem {
    /// Decides, under the inode's lock and after its writeback, how fsync makes `ino`'s
    /// changes of transaction `tid` durable.
    pub(crate) fn fsync_plan(&self, ino: u32, data: &mut InodeData, tid: Tid) -> Result<FsyncPlan> {
        if !self.journal.fast_commits_enabled() {
            if self.options.journal.fsync_journal && !self.options.read_only {
                let reason = if self.params.feature_compat & ext4::feature::COMPAT_FAST_COMMIT == 0
                {
                    NO_FEATURE
                } else {
                    NO_ROOM
                };
                self.journal.note_fast_commit_fallback(reason);
            }
            return Ok(FsyncPlan::Commit);
        }
        let track = &data.fc;
        if track.tid != Some(tid) {
            // fdatasync of a file whose data changes are older than its last change: they
            // are in a transaction that is committing already.
            return Ok(FsyncPlan::Commit);
        }
        if track.changes == track.synced {
            return Ok(FsyncPlan::AlreadyDurable);
        }
        let inode = &data.inode;
        let reason = if let Some(reason) = track.ineligible {
            Some(reason)
        } else if inode.is_dir() {
            Some("directory")
        } else if inode.mode & ext4::MODE_TYPE_MASK != ext4::MODE_REGULAR {
            Some("not a regular file")
        } else if inode.links_count != 1 {
            Some("hard link")
        } else if inode.flags & ext4::EXTENTS_FL == 0 {
            Some("no extents")
        } else if inode.flags & ext4::HUGE_FILE_FL != 0 {
            Some("huge file")
        } else if self.options.data == DataMode::Journal {
            Some("journal data")
        } else if inode.file_acl != 0 {
            Some(XATTR_BLOCK)
        } else if names_value_inodes(inode, &data.raw) {
            Some(VALUE_INODE)
        } else if self.shares_journal_inode_block(ino)? {
            Some(E2FSCK_ITABLE)
        } else if self.group_initialized_in_log() {
            Some(E2FSCK_UNINIT)
        } else if track.dentries.iter().filter_map(|(_, note)| note.replaces()).any(|old| {
            old.fast_committed
                && self.journal.fast_commit_area(old.ino) != self.journal.fast_commit_area(ino)
        }) {
            Some(REPLACED_ELSEWHERE)
        } else {
            None
        };
        if let Some(reason) = reason {
            self.journal.note_fast_commit_fallback(reason);
            return Ok(FsyncPlan::Commit);
        }
        let mut ranges = Vec::new();
        let span = track.ranges.iter().fold(None, |span, &(_, first, last)| match span {
            None => Some((first, last)),
            Some((a, b)) => Some((first.min(a), last.max(b))),
        });
        if let Some((first, last)) = span {
            let ectx = extent_ctx(self, ino, data);
            let mut io = ReadIo { fs: self };
            for (lblk, run) in extent_tree::mapping(&mut io, &ectx, &inode.block, first, last)? {
                match run {
                    Lookup::Mapped { pblk, len, unwritten } => {
                        // A run lies within one extent, so it fits one ADD_RANGE (whose extent
                        // has the on-disk encoding's length limit).
                        debug_assert!(len <= Extent::len_max(unwritten));
                        let extent = Extent { logical: lblk, len, start: pblk, unwritten };
                        ranges.push(FcRecord::AddRange { ino, extent });
                    }
                    Lookup::Hole { len_to_next } => {
                        let len = len_to_next.expect("mapping gives a hole its length");
                        ranges.push(FcRecord::DelRange { ino, logical: lblk, len });
                    }
                }
            }
        }
        let raw = data.raw[..fc_inode_len(inode, data.raw.len())].to_vec();
        let dentries = track.dentries.iter().map(|(_, note)| note.clone()).collect();
        let (changes, range_notes, dentry_notes) =
            (track.changes, track.range_notes, track.dentry_notes);
        data.fc.range_notes_planned = range_notes;
        data.fc.fast_committed = true;
        Ok(FsyncPlan::FastCommit(FcPlan {
            tid,
            ino,
            ranges,
            raw,
            dentries,
            changes,
            range_notes,
            dentry_notes,
        }))
    }

    /// Whether the creation of inode `ino` (of `mode`) as `name` in directory `parent` during
    /// `tid`, its entry added already to leaf block `lblk`, can be a fast commit's CREAT
    /// record: `Ok` with what the record names, or why not.
    ///
    /// Replay adds the name to the parent as the last full commit left it (e2fsck's
    /// `ext2fs_link`, the kernel's `__ext4_link`, quill's `replay_create`), and e2fsck 1.47.0
    /// cannot grow a directory there (it stops with "No free space in the directory", or
    /// would allocate a block a later record may claim). So the name must fit where replay
    /// puts it:
    /// - it went into room its leaf block had, no block was added to the parent and no entry
    ///   moved (a split, a compaction: [`crate::dir::Added::in_place`]), this creation
    ///   included: replay then finds the leaf as it was;
    /// - where the leaf lost a name in `tid` (whose space is still in use at the last commit),
    ///   the leaf's room at the start of `tid` must hold every name admitted into it
    ///   ([`FcTrack::admit_create`]); in a linear directory such a creation commits.
    ///
    /// Names added in `tid` and not fast-committed only leave more room. A name removed from
    /// the parent in `tid` takes the records that delete its old file at replay first
    /// ([`Filesystem::unlink_record`]), or commits. The inode must have been free at the last
    /// commit too: a number freed in `tid` and taken again
    /// would be replayed over the file still using it there (the allocator avoids such
    /// numbers while fast commits are on). Freed blocks are no concern: none is reused before
    /// the transaction that freed it is durable (`groups.rs`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn create_record<'n>(
        &self,
        tid: Tid,
        parent: u32,
        pdata: &mut InodeData,
        ino: u32,
        mode: u16,
        name: &'n [u8],
        lblk: u32,
    ) -> std::result::Result<CreateRecord<'n>, &'static str> {
        match mode & ext4::MODE_TYPE_MASK {
            ext4::MODE_REGULAR => {}
            ext4::MODE_DIR => return Err("mkdir"),
            _ => return Err("mknod or symlink"),
        }
        if self.groups.inode_freed_in(ino, tid) {
            return Err("inode number reused");
        }
        if pdata.inode.has_inline_data() {
            // Replay adds names to directories with blocks (`fast_commit.rs`); one that moved
            // out of its inode in `tid` has creations blocked (it grew).
            return Err(INLINE_DIRECTORY);
        }
        let leaf_by_name = self.leaf_by_name(pdata);
        let replaces = pdata.fc.admit_create(tid, lblk, name, leaf_by_name)?;
        Ok(CreateRecord { parent, name, replaces })
    }

    /// Whether replay adds a name to directory `pdata` in the leaf block it is in now: an htree
    /// selects the leaf by the name's hash, and a directory of one block has one (a directory
    /// never shrinks, and one that grew in the transaction admits no CREAT).
    fn leaf_by_name(&self, pdata: &InodeData) -> bool {
        pdata.inode.flags & ext4::INDEX_FL != 0 || pdata.inode.size <= u64::from(self.block_size())
    }

    /// Whether the rename of a regular file to `name` in directory `new_parent` during `tid`,
    /// its entry now in leaf block `lblk`, can be a fast commit's LINK record (with the UNLINK
    /// of the old name after it, which every replay finds: the old name is the file's at the
    /// last commit or one its earlier records gave it). `replaced`: the file `name` named
    /// until this rename, as [`Filesystem::unlink_record`] deletes it at replay (`Err` when it
    /// cannot), or `None` for a name that was free. `Ok` with the file to delete first.
    ///
    /// The LINK adds the name where a CREAT would ([`Filesystem::create_record`]'s rules).
    /// Over a name, it goes in after the UNLINK of the replaced file, which replay finds in the
    /// same leaf (the entry is rewritten in place): that is a name lost and one added, as a
    /// delete and a create in one transaction are ([`FcTrack::admit_create`]).
    pub(crate) fn rename_record(
        &self,
        tid: Tid,
        pdata: &mut InodeData,
        name: &[u8],
        lblk: u32,
        replaced: Option<std::result::Result<Unlinked, ()>>,
    ) -> std::result::Result<Option<Arc<Unlinked>>, &'static str> {
        if pdata.inode.has_inline_data() {
            return Err(INLINE_DIRECTORY);
        }
        match replaced {
            None => {}
            Some(Err(())) => return Err(NAME_REUSED),
            Some(Ok(records)) => {
                pdata.fc.note_removal(tid, lblk, name);
                pdata.fc.note_unlinked(tid, name, records);
            }
        }
        let leaf_by_name = self.leaf_by_name(pdata);
        pdata.fc.admit_create(tid, lblk, name, leaf_by_name)
    }

    /// The records that delete file `ino` at replay, its last name removed in `tid` (under its
    /// lock, before the removal writes it): `None` where fast commits cannot. The file must be
    /// at replay what it was at the last commit, give or take fast-committed ranges, so that
    /// DEL_RANGE over what it maps now frees every block it has there, and an UNLINK finds its
    /// name: not created or renamed in `tid` (no such name at replay unless a fast commit made
    /// it; e2fsck's replay stops at an UNLINK whose name it does not find), no other
    /// change in `tid` a fast commit could not express (a truncation, an xattr), one link. And
    /// replay must handle it as it does the files fsync fast-commits: a regular file with
    /// extents, no xattr block (i_blocks), not beside the journal inode (e2fsck 1.47.0). And
    /// no in-inode xattrs: the INODE record does not reach them (it ends at i_extra_isize), so
    /// e2fsck's replay leaves them in the slot, and its full check then reconnects the
    /// unattached inode to lost+found instead of clearing it as zero-length (pass 4 clears
    /// only an inode whose in-inode area lacks the xattr magic; crash explorer seed
    /// 1795867448165962330: a rename over a file given an xattr earlier).
    pub(crate) fn unlink_record(
        &self,
        ino: u32,
        data: &InodeData,
        tid: Tid,
    ) -> Result<Option<Unlinked>> {
        let inode = &data.inode;
        let track = &data.fc;
        let changed_in_tid = track.tid == Some(tid);
        if (changed_in_tid && (track.born || track.moved || track.ineligible.is_some()))
            || inode.mode & ext4::MODE_TYPE_MASK != ext4::MODE_REGULAR
            || inode.links_count != 1
            || inode.flags & ext4::EXTENTS_FL == 0
            || inode.flags & ext4::HUGE_FILE_FL != 0
            || inode.file_acl != 0
            || has_in_inode_xattrs(inode, &data.raw)
            || self.options.data == DataMode::Journal
            // A replay that deletes the file would not take its usage off the quota files.
            || self.quotas.get().is_some()
            || self.shares_journal_inode_block(ino)?
        {
            return Ok(None);
        }
        let ectx = extent_ctx(self, ino, data);
        let extents = extent_tree::extents(&mut ReadIo { fs: self }, &ectx, &inode.block)?;
        let end = extents.iter().map(|e| u64::from(e.logical) + u64::from(e.len)).max();
        // DEL_RANGE's length is 32 bits: it cannot reach a file's very last logical block.
        let Ok(mapped_end) = u32::try_from(end.unwrap_or(0)) else { return Ok(None) };
        let mut gone = inode.clone();
        gone.links_count = 1;
        gone.size = 0;
        gone.blocks_raw = 0;
        gone.dtime = 0;
        extent_tree::init_root(&mut gone.block);
        let mut raw = data.raw.clone();
        gone.encode_into(&mut raw);
        ext4::set_inode_checksum(&self.params, ino, &mut raw);
        raw.truncate(fc_inode_len(inode, raw.len()));
        let fast_committed = changed_in_tid && track.fast_committed;
        Ok(Some(Unlinked { ino, mapped_end, raw: raw.into_boxed_slice(), fast_committed }))
    }

    /// Whether inode `ino` sits in the inode-table block of the journal inode. e2fsck 1.47.0
    /// replays a fast commit's INODE record through an inode-table buffer it read before it
    /// replayed the log (the journal inode's block, read to find the journal): the record's
    /// inode is written back with that block's stale copy of its neighbours, and the log's
    /// changes to them are lost (seen in the crash explorer and reproduced by hand: a file's
    /// size, synced, back to its old one; the kernel's replay is right). With 4 KiB blocks and
    /// 256-byte inodes that is inodes 1 to 16, the first five files of a new file system.
    fn shares_journal_inode_block(&self, ino: u32) -> Result<bool> {
        let journal = self.params.journal_inum;
        if journal == 0 {
            return Ok(false);
        }
        Ok(self.inode_table_location(ino)?.0 == self.inode_table_location(journal)?.0)
    }

    /// Whether a group was initialized (its BLOCK_UNINIT or INODE_UNINIT flag cleared) in a
    /// transaction that is not checkpointed. e2fsck 1.47.0 replays fast commits inside its
    /// journal recovery, with the group descriptors it read before replaying the log: such a
    /// group's bitmaps are then read as never initialized, and the replay goes wrong from
    /// there (seen in `delete_then_create_in_a_large_directory...` in tests/fsync_journal.rs:
    /// a block handed to two files, inodes "in the unused area", files lost). Fsync commits
    /// instead, and checkpoints ([`Filesystem::fsync`]), so that later fsyncs can fast-commit.
    pub(crate) fn group_initialized_in_log(&self) -> bool {
        self.groups.uninit_cleared().is_some_and(|tid| !self.journal.checkpointed(tid))
    }

    /// Whether inode `ino`'s slot in the inode table is all zeros from byte `from` on: what a
    /// fast commit's INODE record of a new inode leaves in place. The record carries the first
    /// `128 + i_extra_isize` bytes, and every replay (the kernel's, e2fsck's, quill's) copies
    /// only those: in-inode xattrs a deleted inode left in the slot would come back on the new
    /// one (seen in the crash explorer). Read before the new inode is written.
    pub(crate) fn inode_slot_tail_clean(&self, ino: u32, from: usize) -> Result<bool> {
        let (block, offset) = self.inode_table_location(ino)?;
        let size = usize::from(self.params.inode_size);
        let buffer = self.journal.read_buffer(block)?;
        Ok(buffer.read(|b| b[offset + from.min(size)..offset + size].iter().all(|&x| x == 0)))
    }

    /// Queues `plan` as a fast commit, under the inode's lock (`Journal::queue_fast_commit`:
    /// one file's fast commits are written in the order they are queued, and each carries
    /// the file's whole state as of its plan, so a newer one must never be replayed before an
    /// older one). `None`: nothing was queued, commit the transaction.
    pub(crate) fn queue_fast_commit<'a>(&self, plan: &'a FcPlan) -> Option<journal::FcTicket> {
        let inode = FcRecord::Inode { ino: plan.ino, raw: &plan.raw };
        let mut records: Vec<FcRecord<'_>> = Vec::with_capacity(plan.ranges.len() + 8);
        // The file a name named at the last commit goes first, as ext4 writes an inode
        // (ranges, then INODE), then its name ([`Unlinked`]).
        let delete = |records: &mut Vec<FcRecord<'a>>, old: &'a Unlinked, parent_ino, name| {
            if old.mapped_end > 0 {
                records.push(FcRecord::DelRange { ino: old.ino, logical: 0, len: old.mapped_end });
            }
            records.push(FcRecord::Inode { ino: old.ino, raw: &old.raw });
            records.push(FcRecord::Dentry {
                op: FcDentryOp::Unlink,
                parent_ino,
                ino: old.ino,
                name,
            });
        };
        let mut ranges_written = false;
        for note in &plan.dentries {
            match note {
                DentryNote::Create { parent, name, replaces } => {
                    if let Some(old) = replaces {
                        delete(&mut records, old, *parent, name);
                    }
                    // As ext4 writes a created inode (ext4_fc_commit_dentry_updates): INODE
                    // first, so that replay has an inode to map ranges into and to link, then
                    // its ranges, then CREAT; and INODE again after them (below), as ext4's
                    // pass over the committing inodes writes it, so that i_blocks and the size
                    // are the file's after its ranges.
                    records.push(inode);
                    records.extend(plan.ranges.iter().copied());
                    ranges_written = true;
                    records.push(FcRecord::Dentry {
                        op: FcDentryOp::Create,
                        parent_ino: *parent,
                        ino: plan.ino,
                        name,
                    });
                }
                DentryNote::Rename { from, to, replaces } => {
                    // As ext4_rename tracks it: the replaced file's UNLINK, the LINK of the new
                    // name, the UNLINK of the old one; the INODE record after them sets the
                    // link count the LINK and UNLINK moved.
                    if let Some(old) = replaces {
                        delete(&mut records, old, to.0, &to.1);
                    }
                    let link = |op, (parent_ino, name): &'a (u32, Box<[u8]>)| FcRecord::Dentry {
                        op,
                        parent_ino: *parent_ino,
                        ino: plan.ino,
                        name,
                    };
                    records.push(link(FcDentryOp::Link, to));
                    records.push(link(FcDentryOp::Unlink, from));
                }
            }
        }
        if !ranges_written {
            records.extend(plan.ranges.iter().copied());
        }
        records.push(inode);
        self.journal.queue_fast_commit(plan.tid, plan.ino, &records).ok()
    }

    /// Waits for the fast commit queued for `plan`. `Ok(true)`: durable (and recorded in the
    /// inode's tracking); `Ok(false)`: the journal fell back, commit the transaction.
    pub(crate) fn wait_fast_commit(
        &self,
        plan: &FcPlan,
        ticket: journal::FcTicket,
    ) -> Result<bool> {
        match self.journal.wait_fast_commit(ticket)? {
            FastCommitOutcome::Fallback(_) => Ok(false),
            FastCommitOutcome::Durable { .. } => {
                let slot = self.inodes.slot(plan.ino);
                let mut guard = self.lock_live(&slot)?;
                let track = &mut guard.as_mut().expect("loaded").fc;
                if track.tid == Some(plan.tid) {
                    track.synced = track.synced.max(plan.changes);
                    track.ranges.retain(|&(note, _, _)| note > plan.range_notes);
                    // Replay has these names now, and later fast commits must not give them
                    // again: a repeated CREAT would bring back a name a rename took away, and a
                    // repeated delete of a replaced file its INODE record until the UNLINK
                    // after it dropped its link again.
                    track.dentries.retain(|&(note, _)| note > plan.dentry_notes);
                }
                Ok(true)
            }
        }
    }
}
