//! Quota accounting (the quota feature): every inode's blocks and the inode itself are charged
//! to its user, group and project in the quota files, in the transaction that changes them,
//! as ext4's journaled quota does; e2fsck recomputes each id's usage and compares.
//!
//! | piece | where |
//! |---|---|
//! | the quota file format and its tree | `ondisk::ext4::quota` |
//! | what an inode is charged ([`Charge`]) | [`Quotas::charge_of`] |
//! | charging a change | `Filesystem::write_inode` calls [`Quotas::transfer`] with the charge as last written and the new one |
//! | a quota file's blocks | [`QuotaFile`]: its inode, kept here (never in the inode cache), and where each id's entry is |
//! | checking the files before a read-write open writes | [`scan_files`], whose findings [`Quotas::load`] keeps |
//!
//! What an inode is charged, as e2fsck 1.47.0's pass 1 counts it (`check_blocks`) and
//! `quota_compute_usage` does: the root and every inode from `s_first_ino` on, but not the
//! project quota file, the orphan file or a value inode (EA_INODE_FL); a live inode (a link,
//! or on the orphan list: the kernel charges an open unlinked file until it is freed) is
//! charged i_blocks in bytes and one inode, plus one inode per xattr value kept in an inode of
//! its own (ea_inode: the owner is charged for it, `ext4_xattr_inode_alloc_quota`).
//!
//! The charge an inode carries on disk is kept in its [`InodeData`] (loaded with it), so an
//! inode write charges the difference whatever the operation was: allocation, truncate,
//! chown, a change of project, deletion. Usage only: limits are kept as they are and not
//! enforced (the kernel enforces them only with the usrquota/grpquota/prjquota mount options).
//!
//! Locking: a quota file's mutex is a leaf lock taken inside a handle, after inode locks;
//! under it only buffer modifications, block allocation (group locks) and the quota inode's
//! own write happen. Every change to a quota file's blocks is made under its mutex, so the
//! tree code's read-modify-write of whole quota blocks never loses another handle's change.

use std::collections::HashMap;

use ondisk::ext4::quota::{
    self as qf, DiskDquot, QuotaFileIo, QuotaInfo, QuotaType, QUOTA_BLOCK_SIZE,
};
use ondisk::ext4::{self, feature};
use parking_lot::Mutex;

use crate::adapters::{extent_ctx, ReadIo};
use crate::block_map;
use crate::clusters;
use crate::error::{FsError, Result};
use crate::extent_tree::Lookup;
use crate::filesystem::{Filesystem, Txn};
use crate::inodes::InodeData;
use crate::meta_io::MetaIo;

/// The reason counted for an fsync whose inode's usage changed (`fsync_journal.rs`): a fast
/// commit's replay would not charge it.
pub const QUOTA_CHANGE: &str = "quota usage change";

/// Journal credits a handle takes per quota file: the entry blocks of the ids it moves a
/// charge between, and a new id's entry (four tree blocks, a data block and its free-list
/// neighbours, the header) with the blocks the file may grow by and their bitmaps,
/// descriptors, map blocks and the quota inode (ext4's `EXT4_QUOTA_INIT_BLOCKS` is 25).
pub const CREDITS_PER_FILE: u32 = 25;

/// Blocks one new entry may take: five quota blocks (four tree levels and a data block),
/// each at worst a file-system block of its own, and the quota file's map blocks.
const INSERT_BLOCKS_MAX: u64 = 5 + 4;

/// What one inode is charged: its ids and the usage they carry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Charge {
    /// User, group and project id (indexed by `QuotaType`).
    pub ids: [u32; 3],
    pub space: u64,
    pub inodes: u64,
}

/// The quota files of a file system mounted read-write with the quota feature.
pub(crate) struct Quotas {
    files: Vec<QuotaFile>,
    first_ino: u32,
    /// Inodes never charged besides the reserved ones: the project quota file, the orphan file.
    uncharged: [u32; 2],
}

/// One quota file.
struct QuotaFile {
    kind: QuotaType,
    ino: u32,
    state: Mutex<FileState>,
}

struct FileState {
    /// The quota inode (not in the inode cache: nothing else ever locks it).
    data: InodeData,
    info: QuotaInfo,
    /// Where each id's entry is: its file-system block and the byte in it (a quota file only
    /// grows, so an entry never moves, and a charge looks nothing up).
    entries: HashMap<u32, (u64, usize)>,
}

/// A quota file as [`scan_files`] found it, before the open wrote anything.
pub(crate) struct ScannedFile {
    kind: QuotaType,
    ino: u32,
    info: QuotaInfo,
    /// Each id's entry, as a byte offset in the file.
    entries: Vec<(u32, u64)>,
}

impl Quotas {
    /// The quota files [`scan_files`] found sound, with their inodes loaded through the
    /// journal, or `None` without the quota feature.
    pub fn load(fs: &Filesystem, scanned: Vec<ScannedFile>) -> Result<Option<Quotas>> {
        let sb = &fs.params;
        if sb.feature_ro_compat & feature::RO_COMPAT_QUOTA == 0 {
            return Ok(None);
        }
        let files = scanned
            .into_iter()
            .map(|file| {
                let (kind, ino) = (file.kind, file.ino);
                QuotaFile::load(fs, file).map_err(|err| refusal(kind, ino, &err))
            })
            .collect::<Result<_>>()?;
        let prj = sb.quota_inums[QuotaType::Project as usize];
        Ok(Some(Quotas { files, first_ino: sb.first_ino, uncharged: [prj, sb.orphan_file_inum] }))
    }

    /// Journal credits every handle adds for quota changes.
    pub fn credits(&self) -> u32 {
        CREDITS_PER_FILE * self.files.len() as u32
    }

    /// Whether inode `ino` is one a quota file counts (the quota files themselves are not).
    pub fn counts(&self, ino: u32) -> bool {
        (ino == ext4::ROOT_INO || ino >= self.first_ino)
            && !self.uncharged.contains(&ino)
            && !self.files.iter().any(|f| f.ino == ino)
    }

    /// The charge inode `ino` (`data`) carries as it is in memory; `io` reads its xattr block
    /// (for the value inodes it names).
    pub fn charge_of(
        &self,
        fs: &Filesystem,
        io: &mut dyn MetaIo,
        ino: u32,
        data: &InodeData,
    ) -> Result<Charge> {
        let inode = &data.inode;
        let live = inode.mode != 0 && (inode.links_count > 0 || data.orphan);
        if !self.counts(ino) || inode.flags & ext4::EA_INODE_FL != 0 || !live {
            return Ok(Charge::default());
        }
        let value_inodes = if fs.params.feature_incompat & feature::INCOMPAT_EA_INODE != 0 {
            let ctx = fs.xattr_ctx_of(ino, inode);
            let area = inode.xattr_area_range(data.raw.len());
            crate::xattr::value_inode_count(io, &ctx, &data.raw[area], inode.file_acl)?
        } else {
            0
        };
        Ok(Charge { inodes: 1 + value_inodes, ..self.base_charge(fs, data) })
    }

    /// A live counted inode's ids and space (its inodes are the caller's to count).
    fn base_charge(&self, fs: &Filesystem, data: &InodeData) -> Charge {
        let inode = &data.inode;
        Charge {
            ids: [inode.uid, inode.gid, inode.projid],
            space: inode.blocks_512(fs.block_size()) * 512,
            inodes: 0,
        }
    }

    /// Moves usage from `old` (the charge on disk) to `new` in every quota file, under `txn`.
    pub fn transfer(&self, txn: &mut Txn<'_>, old: &Charge, new: &Charge) -> Result<()> {
        for file in &self.files {
            let t = file.kind as usize;
            let delta = |a: u64, b: u64| b as i64 - a as i64;
            if old.ids[t] == new.ids[t] {
                let (space, inodes) = (delta(old.space, new.space), delta(old.inodes, new.inodes));
                if space != 0 || inodes != 0 {
                    file.add(txn, new.ids[t], space, inodes)?;
                }
                continue;
            }
            if old.space != 0 || old.inodes != 0 {
                file.add(txn, old.ids[t], -(old.space as i64), -(old.inodes as i64))?;
            }
            if new.space != 0 || new.inodes != 0 {
                file.add(txn, new.ids[t], new.space as i64, new.inodes as i64)?;
            }
        }
        Ok(())
    }

    /// Makes sure every quota file has an entry for its id among `ids` (user, group,
    /// project), in a handle of its own with blocks reserved, before an operation that may
    /// charge a new id changes anything (as the kernel's `dquot_initialize`): a full file
    /// system then fails the operation with ENOSPC and nothing changed, instead of in the
    /// middle of it. Entries are never removed, so they stay for the operation.
    pub fn prepare(&self, fs: &Filesystem, ids: [u32; 3]) -> Result<()> {
        let missing: Vec<&QuotaFile> = self
            .files
            .iter()
            .filter(|f| !f.state.lock().entries.contains_key(&ids[f.kind as usize]))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        // A new entry takes at most the four tree blocks and a data block, with their map
        // blocks: blocks of at least 1 KiB, an extent tree at most a few levels deep.
        let mut txn = fs.begin(1, INSERT_BLOCKS_MAX * missing.len() as u64)?;
        let result = missing.iter().try_for_each(|file| {
            file.entry(&mut txn, &mut file.state.lock(), ids[file.kind as usize]).map(drop)
        });
        fs.finish(result, txn)
    }

    /// The usage each quota file records, as (type, id, bytes, inodes) in type and id
    /// order ([`Filesystem::quota_usage`]).
    pub fn usage(&self, fs: &Filesystem) -> Result<Vec<(QuotaType, u32, u64, u64)>> {
        let mut out = Vec::new();
        for file in &self.files {
            let state = file.state.lock();
            let mut ids: Vec<_> = state.entries.iter().map(|(&id, &home)| (id, home)).collect();
            ids.sort_unstable();
            for (id, (block, at)) in ids {
                let entry = fs.journal.read_buffer(block)?.read(|b| {
                    DiskDquot::parse(b[at..at + qf::ENTRY_SIZE].try_into().expect("entry"))
                });
                out.push((file.kind, id, entry.curspace, entry.curinodes));
            }
        }
        Ok(out)
    }
}

/// Reads every quota file the superblock names, before a read-write open writes anything:
/// one that is not a sound quota tree refuses the open, naming it (charging into it could only
/// spread the damage; e2fsck rebuilds it). [`Quotas::load`] keeps what was found.
pub(crate) fn scan_files(image: &crate::image::Ext4Image) -> Result<Vec<ScannedFile>> {
    let sb = image.superblock();
    if sb.feature_ro_compat & feature::RO_COMPAT_QUOTA == 0 {
        return Ok(Vec::new());
    }
    let mut files = Vec::new();
    for kind in QuotaType::ALL {
        let ino = sb.quota_inums[kind as usize];
        if ino == 0 {
            continue;
        }
        let scan = || {
            let inode = image.read_inode(ino)?;
            check_quota_inode(kind, ino, &inode)?;
            let extents = image.extents(ino, &inode)?;
            let mut io = ImageFile { image, size: inode.size, extents };
            let info = QuotaInfo::parse(kind, &io.read_block(0)?)?;
            let entries = qf::scan(&mut io, &info)?;
            Ok::<_, FsError>(ScannedFile { kind, ino, info, entries })
        };
        files.push(scan().map_err(|err| refusal(kind, ino, &err))?);
    }
    Ok(files)
}

/// Why a read-write open is refused: the quota file cannot be charged.
fn refusal(kind: QuotaType, ino: u32, err: &FsError) -> FsError {
    FsError::Unsupported(format!(
        "the {} quota file (inode {ino}) cannot be used: {err}; run e2fsck",
        kind.name()
    ))
}

fn check_quota_inode(kind: QuotaType, ino: u32, inode: &ext4::Inode) -> Result<()> {
    // The user and group files live in reserved inodes (3 and 4: mke2fs, tune2fs); elsewhere
    // e2fsck would charge them like files, and quill would charge a quota file to itself.
    if kind != QuotaType::Project && ino >= ext4::FIRST_INO_MIN {
        return Err(FsError::Unsupported(format!("a {} quota file in inode {ino}", kind.name())));
    }
    if inode.mode & ext4::MODE_TYPE_MASK != ext4::MODE_REGULAR || inode.links_count == 0 {
        return Err(FsError::corrupted(0, format!("inode {ino} is not a live regular file")));
    }
    if inode.has_inline_data() {
        return Err(FsError::corrupted(0, format!("inode {ino} keeps its data inline")));
    }
    Ok(())
}

/// A quota file read straight from the image, before the file system is opened.
struct ImageFile<'a> {
    image: &'a crate::image::Ext4Image,
    size: u64,
    extents: Vec<ext4::Extent>,
}

impl QuotaFileIo for ImageFile<'_> {
    type Error = FsError;

    fn read_block(&mut self, blk: u32) -> Result<[u8; QUOTA_BLOCK_SIZE]> {
        let offset = u64::from(blk) * QUOTA_BLOCK_SIZE as u64;
        let mut out = [0u8; QUOTA_BLOCK_SIZE];
        let bs = u64::from(self.image.block_size());
        let lblk = offset / bs;
        let mapped = self.extents.iter().find(|e| {
            (u64::from(e.logical)..u64::from(e.logical) + u64::from(e.len)).contains(&lblk)
        });
        if let Some(e) = mapped.filter(|e| offset < self.size && !e.unwritten) {
            let block = self.image.read_block(e.start + lblk - u64::from(e.logical))?;
            let at = (offset % bs) as usize;
            out.copy_from_slice(&block[at..at + QUOTA_BLOCK_SIZE]);
        }
        Ok(out)
    }

    fn write_block(&mut self, blk: u32, _: &[u8; QUOTA_BLOCK_SIZE]) -> Result<()> {
        Err(crate::adapters::read_only_misuse(u64::from(blk)))
    }
}

impl QuotaFile {
    /// The quota file `scanned` describes, its inode loaded through the journal (the same
    /// bytes the scan read: nothing was written in between).
    fn load(fs: &Filesystem, scanned: ScannedFile) -> Result<QuotaFile> {
        let ScannedFile { kind, ino, info, entries } = scanned;
        let data = fs.load_inode(ino)?;
        let entries = entries
            .into_iter()
            .map(|(id, offset)| Ok((id, entry_home(fs, ino, &data, id, offset)?)))
            .collect::<Result<_>>()?;
        Ok(QuotaFile { kind, ino, state: Mutex::new(FileState { data, info, entries }) })
    }

    /// Where `id`'s entry is, made (with nothing charged) if the file has none yet.
    fn entry(&self, txn: &mut Txn<'_>, state: &mut FileState, id: u32) -> Result<(u64, usize)> {
        if let Some(&home) = state.entries.get(&id) {
            return Ok(home);
        }
        let offset = self.insert(txn, state, id)?;
        let home = entry_home(txn.fs, self.ino, &state.data, id, offset)?;
        state.entries.insert(id, home);
        Ok(home)
    }

    /// Adds `space` bytes and `inodes` inodes to `id`'s entry, making the entry if the file
    /// has none for `id` yet.
    fn add(&self, txn: &mut Txn<'_>, id: u32, space: i64, inodes: i64) -> Result<()> {
        let fs = txn.fs;
        let mut state = self.state.lock();
        let (block, at) = self.entry(txn, &mut state, id)?;
        let buffer = fs.journal.read_buffer(block)?;
        txn.handle
            .modify(&buffer, |b| qf::add_usage(&mut b[at..at + qf::ENTRY_SIZE], space, inodes))?;
        Ok(())
    }

    /// Makes an entry for `id` (nothing charged), growing the file as the tree needs, and
    /// writes the info and the quota inode back; returns the entry's offset.
    fn insert(&self, txn: &mut Txn<'_>, state: &mut FileState, id: u32) -> Result<u64> {
        let fs = txn.fs;
        // The caller's operation may be counting blocks for its own inode.
        let pending = txn.take_blocks_delta();
        let before = state.data.inode.clone();
        let mut info = state.info;
        let result = (|| {
            let mut io = WriteFile { txn: &mut *txn, ino: self.ino, data: &mut state.data };
            let offset = qf::insert(&mut io, &mut info, &DiskDquot { id, ..DiskDquot::default() })?;
            let mut block0 = io.read_block(0)?;
            info.encode_into(self.kind, &mut block0);
            io.write_block(0, &block0)?;
            Ok::<_, FsError>(offset)
        })();
        let grown = txn.take_blocks_delta();
        txn.blocks_delta = pending;
        // Blocks mapped before a failure stay the file's, counted and written with its inode
        // (what commits under errors=continue is then a file with unused blocks, not blocks
        // nothing owns).
        let data = &mut state.data;
        crate::ops::add_blocks(&mut data.inode, grown, fs.block_size());
        if data.inode != before {
            data.fc.ineligible_next(QUOTA_CHANGE);
            let written = fs.write_inode(txn, self.ino, data, true);
            if result.is_ok() {
                written?;
            }
        }
        let offset = result?;
        state.info = info;
        Ok(offset)
    }
}

/// The file system block holding byte `offset` of quota file `ino` and the offset in it,
/// `None` in a hole.
fn locate(
    fs: &Filesystem,
    ino: u32,
    data: &InodeData,
    offset: u64,
) -> Result<Option<(u64, usize)>> {
    let bs = u64::from(fs.block_size());
    let lblk = u32::try_from(offset / bs)
        .map_err(|_| FsError::corrupted(0, format!("quota file offset {offset}")))?;
    let ectx = extent_ctx(fs, ino, data);
    match block_map::lookup(&mut ReadIo { fs }, &ectx, &data.inode, lblk)? {
        Lookup::Mapped { pblk, .. } => Ok(Some((pblk, (offset % bs) as usize))),
        Lookup::Hole { .. } => Ok(None),
    }
}

/// The block and byte of `id`'s entry at byte `offset` of quota file `ino`.
fn entry_home(
    fs: &Filesystem,
    ino: u32,
    data: &InodeData,
    id: u32,
    offset: u64,
) -> Result<(u64, usize)> {
    locate(fs, ino, data, offset)?
        .ok_or_else(|| FsError::corrupted(0, format!("quota entry of id {id} in a hole")))
}

/// A quota block as the file holds it now (zeros in a hole or past the end, as e2fsprogs
/// reads one).
fn read_quota_block(
    fs: &Filesystem,
    ino: u32,
    data: &InodeData,
    blk: u32,
) -> Result<[u8; QUOTA_BLOCK_SIZE]> {
    let offset = u64::from(blk) * QUOTA_BLOCK_SIZE as u64;
    let mut out = [0u8; QUOTA_BLOCK_SIZE];
    if offset >= data.inode.size {
        return Ok(out);
    }
    if let Some((block, at)) = locate(fs, ino, data, offset)? {
        let buffer = fs.journal.read_buffer(block)?;
        buffer.read(|b| out.copy_from_slice(&b[at..at + QUOTA_BLOCK_SIZE]));
    }
    Ok(out)
}

/// A quota file changed under a handle: blocks are journaled as metadata (as
/// `ext4_quota_write` does), and a write into a hole or past the end maps a new block.
struct WriteFile<'t, 'a, 'd> {
    txn: &'t mut Txn<'a>,
    ino: u32,
    data: &'d mut InodeData,
}

impl QuotaFileIo for WriteFile<'_, '_, '_> {
    type Error = FsError;

    fn read_block(&mut self, blk: u32) -> Result<[u8; QUOTA_BLOCK_SIZE]> {
        read_quota_block(self.txn.fs, self.ino, self.data, blk)
    }

    fn write_block(&mut self, blk: u32, bytes: &[u8; QUOTA_BLOCK_SIZE]) -> Result<()> {
        let fs = self.txn.fs;
        let offset = u64::from(blk) * QUOTA_BLOCK_SIZE as u64;
        let (block, at) = match locate(fs, self.ino, self.data, offset)? {
            Some(found) => found,
            None => self.map_new_block(offset)?,
        };
        let buffer = fs.journal.read_buffer(block)?;
        self.txn.handle.modify(&buffer, |b| b[at..at + QUOTA_BLOCK_SIZE].copy_from_slice(bytes))?;
        // ext4_quota_write: the size follows what was written.
        let end = offset + QUOTA_BLOCK_SIZE as u64;
        if self.data.inode.size < end {
            self.data.inode.size = end;
        }
        Ok(())
    }
}

impl WriteFile<'_, '_, '_> {
    /// Maps a new, zeroed block at the file block holding byte `offset`, after the block
    /// before it where there is one.
    fn map_new_block(&mut self, offset: u64) -> Result<(u64, usize)> {
        let fs = self.txn.fs;
        let bs = u64::from(fs.block_size());
        let lblk = u32::try_from(offset / bs)
            .map_err(|_| FsError::corrupted(0, format!("quota file offset {offset}")))?;
        let ectx = extent_ctx(fs, self.ino, self.data);
        let goal = match lblk.checked_sub(1) {
            Some(prev) => match locate(fs, self.ino, self.data, u64::from(prev) * bs)? {
                Some((block, _)) => block + 1,
                None => ectx.goal,
            },
            None => ectx.goal,
        };
        let block = clusters::alloc_block(&mut *self.txn, &ectx, &self.data.inode, lblk, goal)?;
        self.txn.write_meta(block, &vec![0u8; bs as usize])?;
        block_map::insert(&mut *self.txn, &ectx, &mut self.data.inode, lblk, block, 1, false)?;
        Ok((block, (offset % bs) as usize))
    }
}

impl Filesystem {
    /// Takes the charge of `ino` to be what `data` says now (an inode loaded before its
    /// orphan state was known).
    pub(crate) fn recharge(&self, ino: u32, data: &mut InodeData) -> Result<()> {
        if let Some(quotas) = self.quotas.get() {
            data.quota = match quotas.charge_of(self, &mut ReadIo { fs: self }, ino, data) {
                Ok(charge) => charge,
                // An xattr block that cannot be read (value inodes uncounted): the inode still
                // loads, for reading; a write of it meets the damage again and fails.
                Err(err) if err.is_corruption() => {
                    Charge { inodes: 1, ..quotas.base_charge(self, data) }
                }
                Err(err) => return Err(err),
            };
        }
        Ok(())
    }

    /// Entries for the ids a new inode or a change of owner or project will charge, made
    /// before the operation starts ([`Quotas::prepare`]); nothing without quotas.
    pub(crate) fn quota_prepare(&self, ids: [u32; 3]) -> Result<()> {
        self.quotas.get().map_or(Ok(()), |q| q.prepare(self, ids))
    }

    /// The usage the quota files record, as (type, id, bytes, inodes), in type and id order;
    /// empty without the quota feature or on a read-only open (which charges nothing).
    pub fn quota_usage(&self) -> Result<Vec<(QuotaType, u32, u64, u64)>> {
        self.quotas.get().map_or(Ok(Vec::new()), |q| q.usage(self))
    }
}
