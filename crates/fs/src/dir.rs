//! Directories: lookup, insertion, removal, replacement, ".." updates, emptiness and readdir
//! over ext4's linear and hashed-index (htree) directories, built on the block codecs in
//! `ondisk::ext4::{dir, htree}`.
//!
//! Everything here works on one directory through [`DirIo`], which hands out and takes whole
//! blocks by logical number (the `fs` layer implements it on journal handles, the tests in
//! memory), and a [`DirCtx`] with what the superblock and inode say about it. The operations
//! follow `fs/ext4/namei.c` so that the kernel and e2fsck accept what quill writes:
//!
//! | directory                       | adding a name                                   |
//! |---------------------------------|-------------------------------------------------|
//! | linear, one block, dir_index on | first fit; when block 0 is full, convert to an  |
//! |                                 | htree (`make_indexed_dir`): the root replaces   |
//! |                                 | block 0, its entries are split over two leaves  |
//! | linear otherwise                | first fit over all blocks, else a new block     |
//! | htree                           | the leaf the hash selects; a full leaf is split |
//! |                                 | at a hash boundary (collision bit set when the  |
//! |                                 | split hash continues); a full index node is     |
//! |                                 | split, a full root grows to one indirect level; |
//! |                                 | with both levels full: `NoSpace` (ext4 without  |
//! |                                 | largedir: "directory index full")               |
//!
//! Removing never merges blocks and never shrinks a directory, as in ext4.
//!
//! ## Readdir cookies
//! A cookie says where the next [`read_dir`] call resumes; each returned entry carries the cookie
//! that resumes right after it. Cookie 0 starts with ".", 1 resumes at "..", and a cookie
//! `c >= 2` resumes at the first entry whose position is at least `c - 2`. Positions:
//!
//! | directory                                        | position of an entry                     |
//! |--------------------------------------------------|------------------------------------------|
//! | dir_index on and (htree, or exactly one block)   | `(major_hash >> 1) << 32 \| minor_hash`   |
//! |                                                  | (ext4's 64-bit `hash2pos`), hash order   |
//! | otherwise (linear, entries never move)           | `block * block_size + offset`            |
//!
//! A name's hash position depends only on the name, so an entry that exists for the whole
//! sequence of calls is returned exactly once whatever is added or removed in between, and a
//! one-block directory converting to an htree keeps its cookies meaningful (the conversion can
//! only happen from one block). Entries that share a hash position are returned together: a batch
//! stops before a group that would exceed `max_entries`, except that a call which would otherwise
//! return nothing returns the whole group. Callers must therefore consume whole batches (resuming
//! from the cookie of an entry in the middle of a group skips the rest of the group).
//!
//! ## Invariants
//! - Bytes read are untrusted. Every block is checked before use: its checksum when
//!   `csum_seed` is set, its record chain, and for index blocks their layout, that every block
//!   they name lies inside the directory, that no block 0 or index node is used as a leaf, and
//!   that readdir visits no leaf twice. Violations are [`FsError::Corrupted`] naming the physical
//!   block. Unlike the kernel, quill never falls back to a linear scan of a damaged index.
//! - Every walk is bounded: linear scans visit each block once, index walks move strictly
//!   forward through at most two levels of at most `limit` entries, and insertion re-probes the
//!   index at most [`ADD_RESTARTS_MAX`] times.
//! - Every block written carries a fresh checksum (leaf tail or dx tail) when `csum_seed` is set.
//! - What is written keeps e2fsck's pass-2 rules for htrees: every block of an indexed directory
//!   is referenced exactly once by the index, all leaves sit at the same depth, and every leaf
//!   holds only hashes inside its index range.

use std::collections::HashSet;

use ondisk::ext4::dir::{self as dirent, DirEntry, NAME_LEN_MAX};
use ondisk::ext4::htree::{self, DxEntry, DxRoot, DX_HASH_CONTINUED};
use ondisk::OnDiskError;

use crate::error::{FsError, Result};

/// Access to one directory's blocks during one operation (the fs layer implements it on journal
/// handles; tests implement it in memory).
pub trait DirIo {
    fn block_size(&self) -> usize;
    /// The directory's size in blocks (i_size / block_size).
    fn dir_blocks(&self) -> u32;
    fn read_dir_block(&mut self, lblk: u32) -> Result<Vec<u8>>;
    /// Writes one whole block (journaled by the implementation).
    fn write_dir_block(&mut self, lblk: u32, data: &[u8]) -> Result<()>;
    /// Adds a block at the end (i_size grows by one block) and returns its index; its contents
    /// are unspecified until written.
    fn append_dir_block(&mut self) -> Result<u32>;
    /// The physical block behind `lblk`, for error messages (0 when unknown).
    fn physical_block(&mut self, lblk: u32) -> u64;
    /// The inode's EXT4_INDEX_FL (0x1000).
    fn indexed(&self) -> bool;
    fn set_indexed(&mut self, on: bool);
    /// Block `lblk` loses entries another block of the operation gains: without a journal it
    /// is written after the others ([`crate::meta_io::MetaIo::order_late`]), so a crash
    /// leaves a moved entry in both blocks rather than in neither.
    fn order_late(&mut self, _lblk: u32) {}
}

/// What the file system and the directory's inode say about a directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirCtx {
    /// The directory's inode number (for error messages).
    pub ino: u32,
    /// The inode's checksum seed when metadata_csum is on: leaves then end with a checksum tail
    /// and index blocks with a dx tail.
    pub csum_seed: Option<u32>,
    /// The dir_index feature.
    pub dir_index: bool,
    /// The effective hash version, 0..=5: `s_def_hash_version`, +3 when the superblock's
    /// `s_flags` has EXT2_FLAGS_UNSIGNED_HASH. Existing indexes keep their own version; the
    /// +3 still applies to them.
    pub hash_version: u8,
    /// `s_hash_seed`.
    pub hash_seed: [u32; 4],
}

/// One entry returned by [`read_dir`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntryInfo {
    pub name: Vec<u8>,
    pub ino: u32,
    pub file_type: u8,
    /// Pass this to [`read_dir`] to continue after this entry.
    pub next_cookie: u64,
}

/// The cookie that starts a listing from the beginning.
pub const READDIR_START: u64 = 0;
const COOKIE_AFTER_DOT: u64 = 1;
const COOKIE_AFTER_DOTDOT: u64 = 2;
/// Cookies of real entries are positions shifted past the two cookies "." and ".." use.
const COOKIE_POSITION_BASE: u64 = 2;
/// Largest hash position: `hash2pos(0xfffffffc, u32::MAX)` (no name hashes to 0xfffffffe).
const HASH_POSITION_MAX: u64 = (((htree::HTREE_EOF_32BIT - 1) as u64) << 32) | 0xffff_ffff;
/// How often one insertion may re-probe an htree after changing it. A normal insertion needs at
/// most three: after growing the root, after splitting a node, after a leaf split whose chosen
/// half still cannot hold the name.
pub const ADD_RESTARTS_MAX: usize = 8;

/// Writes the first block of a new directory: "." (`self_ino`, normally `ctx.ino`) and ".."
/// (`parent_ino`). The directory must have no blocks yet (one is appended) or exactly one.
pub fn init_dir(io: &mut dyn DirIo, ctx: &DirCtx, self_ino: u32, parent_ino: u32) -> Result<()> {
    if self_ino == 0 || parent_ino == 0 {
        return Err(FsError::Invalid(format!("directory {self_ino} with parent {parent_ino}")));
    }
    let mut dir = Dir::new(io, ctx)?;
    match dir.blocks() {
        0 => {
            dir.append()?;
        }
        1 => {}
        blocks => {
            return Err(FsError::Invalid(format!(
                "initializing directory {} which has {blocks} blocks",
                ctx.ino
            )))
        }
    }
    let mut data = vec![0u8; dir.block_size];
    dirent::init_first_dir_block(&mut data, dir.has_csum, self_ino, parent_ino);
    dir.io.set_indexed(false);
    dir.write_leaf(0, data)
}

/// The inode and file type `name` refers to, or None. "." and ".." are answered from the first
/// block.
pub fn lookup(io: &mut dyn DirIo, ctx: &DirCtx, name: &[u8]) -> Result<Option<(u32, u8)>> {
    let mut dir = Dir::open(io, ctx)?;
    if name == b"." || name == b".." {
        let (dot, dotdot) = dir.dots()?;
        return Ok(Some(if name == b"." { dot } else { dotdot }));
    }
    check_name(name)?;
    Ok(dir.find(name)?.map(|found| (found.ino, found.file_type)))
}

/// Adds `name` → `ino`. `Exists` when the name is present, `NameTooLong` beyond 255 bytes,
/// `Invalid` for an empty name, ".", "..", or a name with '/' or NUL, `NoSpace` when an htree
/// is full.
pub fn add_entry(
    io: &mut dyn DirIo,
    ctx: &DirCtx,
    name: &[u8],
    ino: u32,
    file_type: u8,
) -> Result<()> {
    add_entry_at(io, ctx, name, ino, file_type).map(|_| ())
}

/// Where [`add_entry_at`] put a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Added {
    /// The leaf block that holds it.
    pub lblk: u32,
    /// Whether the name went into room its leaf had, changing nothing else: no block added,
    /// no entry moved (a split, a compaction, an index made or grown).
    pub in_place: bool,
}

/// [`add_entry`], saying where the name went.
pub fn add_entry_at(
    io: &mut dyn DirIo,
    ctx: &DirCtx,
    name: &[u8],
    ino: u32,
    file_type: u8,
) -> Result<Added> {
    check_name(name)?;
    if ino == 0 {
        return Err(FsError::Invalid("directory entry for inode 0".to_string()));
    }
    let mut dir = Dir::open(io, ctx)?;
    if dir.find(name)?.is_some() {
        return Err(FsError::Exists);
    }
    if dir.indexed() {
        dir.dx_add(name, ino, file_type)
    } else {
        dir.linear_add(name, ino, file_type)
    }
}

/// The most bytes one new record could take in directory block `block` (the largest
/// [`DirEntry::room`]), where `ext4_find_dest_de` and e2fsprogs' `link_proc` look for room. 0
/// for a block that does not parse as a chain of records (an htree node): no name goes there.
pub fn largest_room(block: &[u8], has_tail: bool) -> usize {
    dirent::parse_dir_block_records(block, has_tail)
        .map(|records| records.iter().map(DirEntry::room).max().unwrap_or(0))
        .unwrap_or(0)
}

/// Removes `name` and returns the inode it referred to (`NotFound` when absent).
pub fn remove_entry(io: &mut dyn DirIo, ctx: &DirCtx, name: &[u8]) -> Result<u32> {
    remove_entry_at(io, ctx, name).map(|(ino, _)| ino)
}

/// [`remove_entry`], returning the inode and the leaf block the name was in.
pub fn remove_entry_at(io: &mut dyn DirIo, ctx: &DirCtx, name: &[u8]) -> Result<(u32, u32)> {
    check_name(name)?;
    let mut dir = Dir::open(io, ctx)?;
    let found = dir.find(name)?.ok_or(FsError::NotFound)?;
    let mut data = found.data;
    let removed = dirent::remove_dir_entry(&mut data, dir.has_csum, name)
        .map_err(|err| dir.on_disk(found.lblk, err))?;
    assert_eq!(removed, Some(found.ino), "the entry just found is in its block");
    // Without a journal the name goes last: a rename's new name, an unlinked inode's freeing
    // land first, so a crash leaves the name twice, or naming a freed inode (which e2fsck
    // clears), never a file without a name.
    dir.io.order_late(found.lblk);
    dir.write_leaf(found.lblk, data)?;
    Ok((found.ino, found.lblk))
}

/// Points `name` at `ino` (with `file_type`) and returns the inode it referred to (`NotFound`
/// when absent) and the leaf block the name is in: the in-place update of a rename over an
/// existing name.
pub fn replace_entry(
    io: &mut dyn DirIo,
    ctx: &DirCtx,
    name: &[u8],
    ino: u32,
    file_type: u8,
) -> Result<(u32, u32)> {
    check_name(name)?;
    if ino == 0 {
        return Err(FsError::Invalid("directory entry for inode 0".to_string()));
    }
    let mut dir = Dir::open(io, ctx)?;
    let found = dir.find(name)?.ok_or(FsError::NotFound)?;
    let mut data = found.data;
    let old = dirent::replace_dir_entry(&mut data, dir.has_csum, name, ino, file_type)
        .map_err(|err| dir.on_disk(found.lblk, err))?;
    assert_eq!(old, Some(found.ino), "the entry just found is in its block");
    dir.write_leaf(found.lblk, data)?;
    Ok((found.ino, found.lblk))
}

/// Points ".." at `parent_ino` (a directory moved to a new parent).
pub fn set_parent(io: &mut dyn DirIo, ctx: &DirCtx, parent_ino: u32) -> Result<()> {
    if parent_ino == 0 {
        return Err(FsError::Invalid("\"..\" pointing at inode 0".to_string()));
    }
    let mut dir = Dir::open(io, ctx)?;
    if dir.indexed() {
        let (mut root, _) = dir.read_root()?;
        root.dotdot_inode = parent_ino;
        dir.write_root(&root)
    } else {
        let mut data = dir.read_leaf(0)?;
        dirent::set_dotdot(&mut data, parent_ino).map_err(|err| dir.on_disk(0, err))?;
        dir.write_leaf(0, data)
    }
}

/// Whether the directory holds nothing but "." and "..".
pub fn is_empty(io: &mut dyn DirIo, ctx: &DirCtx) -> Result<bool> {
    let mut dir = Dir::open(io, ctx)?;
    dir.dots()?;
    if dir.indexed() {
        let (root, version) = dir.read_root()?;
        let mut path = dir.descend(root, version, None)?;
        let mut visited = HashSet::new();
        loop {
            let lblk = dir.visit_leaf(&path, &mut visited)?;
            let data = dir.read_leaf(lblk)?;
            if !dir.leaf_live(lblk, &data)?.is_empty() {
                return Ok(false);
            }
            if dir.next_leaf(&mut path, None)?.is_none() {
                return Ok(true);
            }
        }
    }
    for lblk in 0..dir.blocks() {
        let data = dir.read_leaf(lblk)?;
        if !dir.linear_entries(lblk, &data)?.is_empty() {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Up to `max_entries` entries from `cookie` on (see the module documentation for the cookie
/// scheme; [`READDIR_START`] begins with "." and ".."). An empty result means the end.
pub fn read_dir(
    io: &mut dyn DirIo,
    ctx: &DirCtx,
    cookie: u64,
    max_entries: usize,
) -> Result<Vec<DirEntryInfo>> {
    let mut dir = Dir::open(io, ctx)?;
    let mut out = Vec::new();
    if max_entries == 0 {
        return Ok(out);
    }
    if cookie < COOKIE_AFTER_DOTDOT {
        let (dot, dotdot) = dir.dots()?;
        if cookie == READDIR_START {
            out.push(info(b".", dot, COOKIE_AFTER_DOT));
        }
        if out.len() < max_entries {
            out.push(info(b"..", dotdot, COOKIE_AFTER_DOTDOT));
        }
        if out.len() >= max_entries {
            return Ok(out);
        }
    }
    let start = cookie.saturating_sub(COOKIE_POSITION_BASE);
    let want = max_entries - out.len();
    let must_progress = out.is_empty();
    let batch = if dir.hash_ordered() {
        dir.read_hashed(start, want, must_progress)?
    } else {
        dir.read_linear(start, want)?
    };
    out.extend(batch);
    Ok(out)
}

fn info(name: &[u8], (ino, file_type): (u32, u8), next_cookie: u64) -> DirEntryInfo {
    DirEntryInfo { name: name.to_vec(), ino, file_type, next_cookie }
}

/// Names a directory may hold: 1..=255 bytes, not "." or "..", no '/' or NUL (e2fsck's pass 2
/// flags those).
fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > NAME_LEN_MAX {
        return Err(FsError::NameTooLong);
    }
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0)
    {
        return Err(FsError::Invalid(format!(
            "directory entry name {:?}",
            String::from_utf8_lossy(name)
        )));
    }
    Ok(())
}

/// The version an existing index hashes with: its on-disk version, moved to the unsigned
/// variant when the file system says so (as `dx_probe` adds `s_hash_unsigned`).
fn effective_version(disk_version: u8, ctx_version: u8) -> u8 {
    let unsigned =
        (htree::DX_HASH_LEGACY_UNSIGNED..=htree::DX_HASH_TEA_UNSIGNED).contains(&ctx_version);
    if unsigned && disk_version <= htree::DX_HASH_TEA {
        disk_version + htree::DX_HASH_LEGACY_UNSIGNED
    } else {
        disk_version
    }
}

/// The version a new root records: the file system's default without the unsigned offset.
fn disk_version(ctx_version: u8) -> Result<u8> {
    match ctx_version {
        0..=2 => Ok(ctx_version),
        3..=5 => Ok(ctx_version - htree::DX_HASH_LEGACY_UNSIGNED),
        other => Err(FsError::Unsupported(format!("directory hash version {other}"))),
    }
}

/// The readdir position of a name with hashes (`major`, `minor`): ext4's 64-bit `hash2pos`.
fn hash_position(major: u32, minor: u32) -> u64 {
    (u64::from(major >> 1) << 32) | u64::from(minor)
}

#[cfg(test)]
thread_local! {
    /// Tests narrow hashes with this mask to force many names onto one hash (collisions are
    /// rare with the real functions, and they are what the continuation logic is for).
    static TEST_HASH_MASK: std::cell::Cell<u32> = const { std::cell::Cell::new(!0) };
}

/// The (major, minor) hash of `name`.
fn name_hash(name: &[u8], version: u8, seed: &[u32; 4]) -> Result<(u32, u32)> {
    let (major, minor) = htree::dx_hash(name, version, seed)?;
    #[cfg(test)]
    let (major, minor) = {
        let mask = TEST_HASH_MASK.with(|m| m.get());
        (major & mask, minor & mask)
    };
    Ok((major, minor))
}

/// A live entry of a leaf with its hash, as `dx_make_map` records it.
struct LeafRec {
    name: Vec<u8>,
    ino: u32,
    file_type: u8,
    hash: u32,
    /// The record's length in its block (slack included): what the split balances.
    size: usize,
}

/// Where a name was found: its block (contents included, for an update) and what it refers to.
struct Found {
    lblk: u32,
    data: Vec<u8>,
    ino: u32,
    file_type: u8,
}

/// One level of the path from the root to a leaf: an index block's entries and the one taken.
struct Frame {
    lblk: u32,
    entries: Vec<DxEntry>,
    at: usize,
}

/// The path from the root to a leaf (`dx_frame` array): `frames[0]` is the root, `frames[1]`
/// the node below it when the index has an indirect level.
struct Path {
    root: DxRoot,
    version: u8,
    frames: Vec<Frame>,
}

impl Path {
    fn leaf(&self) -> u32 {
        let frame = &self.frames[self.frames.len() - 1];
        frame.entries[frame.at].block
    }
}

/// One directory during one operation.
struct Dir<'a> {
    io: &'a mut dyn DirIo,
    ctx: &'a DirCtx,
    block_size: usize,
    has_csum: bool,
}

impl<'a> Dir<'a> {
    fn new(io: &'a mut dyn DirIo, ctx: &'a DirCtx) -> Result<Self> {
        let block_size = io.block_size();
        if !block_size.is_power_of_two()
            || !(htree::DX_BLOCK_SIZE_MIN..=dirent::DIR_BLOCK_SIZE_MAX).contains(&block_size)
        {
            return Err(FsError::Invalid(format!("directory block size {block_size}")));
        }
        Ok(Dir { io, ctx, block_size, has_csum: ctx.csum_seed.is_some() })
    }

    /// A directory that already has its first block.
    fn open(io: &'a mut dyn DirIo, ctx: &'a DirCtx) -> Result<Self> {
        let mut dir = Dir::new(io, ctx)?;
        if dir.blocks() == 0 {
            return Err(dir.corrupted(0, "the directory has no blocks"));
        }
        if dir.indexed() && !ctx.dir_index {
            return Err(dir.corrupted(0, "indexed directory on a file system without dir_index"));
        }
        Ok(dir)
    }

    fn blocks(&self) -> u32 {
        self.io.dir_blocks()
    }

    fn indexed(&self) -> bool {
        self.io.indexed()
    }

    /// Whether readdir walks in hash order (see the module documentation).
    fn hash_ordered(&self) -> bool {
        self.ctx.dir_index && (self.indexed() || self.blocks() == 1)
    }

    fn corrupted(&mut self, lblk: u32, reason: impl std::fmt::Display) -> FsError {
        let block = self.io.physical_block(lblk);
        FsError::corrupted(
            block,
            format!("directory inode {}, block {lblk}: {reason}", self.ctx.ino),
        )
    }

    fn on_disk(&mut self, lblk: u32, err: OnDiskError) -> FsError {
        match err {
            OnDiskError::Corrupted { .. } => self.corrupted(lblk, err),
            other => FsError::OnDisk(other),
        }
    }

    fn hash(&self, name: &[u8], version: u8) -> Result<(u32, u32)> {
        name_hash(name, version, &self.ctx.hash_seed)
    }

    // -- Block I/O ----------------------------------------------------------------------------

    fn read_raw(&mut self, lblk: u32) -> Result<Vec<u8>> {
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

    /// A leaf (or linear block) whose checksum verified and whose record chain is valid.
    fn read_leaf(&mut self, lblk: u32) -> Result<Vec<u8>> {
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

    fn leaf_live<'b>(&mut self, lblk: u32, data: &'b [u8]) -> Result<Vec<DirEntry<'b>>> {
        let entries =
            dirent::parse_dir_block(data, self.has_csum).map_err(|err| self.on_disk(lblk, err))?;
        if let Some(bad) = entries.iter().find(|e| is_reserved_ino(e.inode)) {
            let (ino, name) = (bad.inode, String::from_utf8_lossy(bad.name).into_owned());
            return Err(self.corrupted(lblk, format!("entry {name:?} names reserved inode {ino}")));
        }
        Ok(entries)
    }

    /// The live entries of a linear directory's block; in block 0, after checking that it
    /// starts with "." and "..", without them.
    fn linear_entries<'b>(&mut self, lblk: u32, data: &'b [u8]) -> Result<Vec<DirEntry<'b>>> {
        let mut entries = self.leaf_live(lblk, data)?;
        if lblk == 0 {
            let (dot, dotdot) = dirent::parse_dots(data).map_err(|err| self.on_disk(0, err))?;
            entries.retain(|e| e.offset != dot.offset && e.offset != dotdot.offset);
        }
        Ok(entries)
    }

    fn write_leaf(&mut self, lblk: u32, mut data: Vec<u8>) -> Result<()> {
        if let Some(seed) = self.ctx.csum_seed {
            dirent::set_dir_block_checksum(seed, &mut data);
        }
        self.io.write_dir_block(lblk, &data)
    }

    fn write_root(&mut self, root: &DxRoot) -> Result<()> {
        let mut data = vec![0u8; self.block_size];
        htree::encode_dx_root(&mut data, root, self.has_csum);
        if let Some(seed) = self.ctx.csum_seed {
            htree::set_dx_checksum(seed, &mut data);
        }
        self.io.write_dir_block(0, &data)
    }

    fn write_node(&mut self, lblk: u32, entries: &[DxEntry]) -> Result<()> {
        let mut data = vec![0u8; self.block_size];
        htree::encode_dx_node(&mut data, entries, self.has_csum);
        if let Some(seed) = self.ctx.csum_seed {
            htree::set_dx_checksum(seed, &mut data);
        }
        self.io.write_dir_block(lblk, &data)
    }

    /// Writes the index block of `path` at `level` with its current entries.
    fn write_frame(&mut self, path: &mut Path, level: usize) -> Result<()> {
        if level == 0 {
            path.root.entries = path.frames[0].entries.clone();
            self.write_root(&path.root)
        } else {
            self.write_node(path.frames[level].lblk, &path.frames[level].entries)
        }
    }

    fn append(&mut self) -> Result<u32> {
        let before = self.blocks();
        if before >= htree::DX_BLOCK_MASK {
            // Index entries cannot name more blocks; ext4 caps directories far below this.
            return Err(FsError::NoSpace);
        }
        let lblk = self.io.append_dir_block()?;
        assert_eq!(lblk, before, "DirIo::append_dir_block must add the next block");
        Ok(lblk)
    }

    /// "." and ".." (inode, file type) from block 0, linear or root.
    fn dots(&mut self) -> Result<((u32, u8), (u32, u8))> {
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

    // -- Index walking ------------------------------------------------------------------------

    /// The root, checked, with the hash version its names use.
    fn read_root(&mut self) -> Result<(DxRoot, u8)> {
        let data = self.read_raw(0)?;
        if let Some(seed) = self.ctx.csum_seed {
            if !htree::dx_checksum_ok(seed, &data) {
                return Err(self.corrupted(0, "index root checksum mismatch"));
            }
        }
        let root =
            htree::parse_dx_root(&data, self.has_csum).map_err(|err| self.on_disk(0, err))?;
        self.check_index_entries(0, &root.entries, &[])?;
        let version = effective_version(root.hash_version, self.ctx.hash_version);
        Ok((root, version))
    }

    /// An index node below `root`, checked.
    fn read_node(&mut self, lblk: u32, root: &DxRoot) -> Result<Vec<DxEntry>> {
        let data = self.read_raw(lblk)?;
        if let Some(seed) = self.ctx.csum_seed {
            if !htree::dx_checksum_ok(seed, &data) {
                return Err(self.corrupted(lblk, "index node checksum mismatch"));
            }
        }
        let entries =
            htree::parse_dx_node(&data, self.has_csum).map_err(|err| self.on_disk(lblk, err))?;
        // The node's children are leaves: none may be one of the root's nodes.
        self.check_index_entries(lblk, &entries, &root.entries)?;
        Ok(entries)
    }

    fn check_index_entries(
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

    /// The path to the leaf for `hash` (`dx_probe`), or to the first leaf when None.
    fn descend(&mut self, root: DxRoot, version: u8, hash: Option<u32>) -> Result<Path> {
        let search = |entries: &[DxEntry]| match hash {
            // The last entry whose hash is <= hash; entry 0 has none and covers the rest.
            Some(hash) => entries[1..].partition_point(|e| e.hash <= hash),
            None => 0,
        };
        let at = search(&root.entries);
        let mut frames = vec![Frame { lblk: 0, entries: root.entries.clone(), at }];
        if root.indirect_levels > 0 {
            let lblk = root.entries[at].block;
            let entries = self.read_node(lblk, &root)?;
            let at = search(&entries);
            frames.push(Frame { lblk, entries, at });
        }
        Ok(Path { root, version, frames })
    }

    /// Moves `path` to the next leaf in hash order (`ext4_htree_next_block`) and returns the
    /// hash its index entry starts at. With `same_hash`, it moves only when that leaf continues
    /// `same_hash` (collision chains); None at the end or when it does not continue. Every call
    /// advances some frame, so a walk ends after at most every index entry once.
    fn next_leaf(&mut self, path: &mut Path, same_hash: Option<u32>) -> Result<Option<u32>> {
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
            let entries = self.read_node(lblk, &path.root)?;
            path.frames[below] = Frame { lblk, entries, at: 0 };
        }
        Ok(Some(start))
    }

    /// The current leaf of `path`, refusing one already visited (a leaf named twice).
    fn visit_leaf(&mut self, path: &Path, visited: &mut HashSet<u32>) -> Result<u32> {
        let lblk = path.leaf();
        if !visited.insert(lblk) {
            return Err(self.corrupted(lblk, "leaf referenced twice by the index"));
        }
        Ok(lblk)
    }

    // -- Lookup -------------------------------------------------------------------------------

    fn find(&mut self, name: &[u8]) -> Result<Option<Found>> {
        if self.indexed() {
            self.dx_find(name)
        } else {
            self.linear_find(name)
        }
    }

    fn linear_find(&mut self, name: &[u8]) -> Result<Option<Found>> {
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

    /// `ext4_dx_find_entry`: the leaf the hash selects, then the following leaves as long as
    /// they continue the same hash.
    fn dx_find(&mut self, name: &[u8]) -> Result<Option<Found>> {
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

    // -- Insertion ----------------------------------------------------------------------------

    /// `ext4_add_entry` for a directory without an index.
    fn linear_add(&mut self, name: &[u8], ino: u32, file_type: u8) -> Result<Added> {
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

    /// `make_indexed_dir`: turns the full one-block directory `block0` into an htree holding
    /// the new name. The root takes block 0 (keeping "." and ".."), the entries after ".." are
    /// split over two new leaves. Returns the leaf the name went to, or `None`, changing
    /// nothing, when block 0 does not start with a 12-byte "." followed by ".." (then the caller
    /// grows the directory linearly, as the kernel's fallback does).
    fn make_indexed(
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

    fn tail_size(&self) -> usize {
        if self.has_csum {
            dirent::DIR_TAIL_SIZE
        } else {
            0
        }
    }

    /// `ext4_dx_add_entry`: insert into the leaf the hash selects, making room by splitting the
    /// leaf, an index node, or growing the root, and re-probing after each index change.
    fn dx_add(&mut self, name: &[u8], ino: u32, file_type: u8) -> Result<Added> {
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
                if bottom == 0 {
                    self.dx_grow_root(path)?;
                } else if path.frames[0].entries.len() >= self.index_limit(0) {
                    // Both levels are full: ext4 without largedir says "directory index full".
                    return Err(FsError::NoSpace);
                } else {
                    self.dx_split_node(path)?;
                }
                continue;
            }
            if let Some(lblk) = self.dx_split_leaf(&mut path, &data, hash, name, ino, file_type)? {
                return Ok(Added { lblk, in_place: false });
            }
        }
        Err(FsError::NoSpace)
    }

    fn index_limit(&self, level: usize) -> usize {
        if level == 0 {
            htree::dx_root_limit(self.block_size, self.has_csum)
        } else {
            htree::dx_node_limit(self.block_size, self.has_csum)
        }
    }

    /// Moves the full root's entries into a new node and points the root at it alone.
    fn dx_grow_root(&mut self, path: Path) -> Result<()> {
        let node = self.append()?;
        self.io.order_late(0);
        let mut root = path.root;
        root.entries = path.frames[0].entries.clone();
        self.write_node(node, &root.entries)?;
        root.entries = vec![DxEntry { hash: 0, block: node }];
        root.indirect_levels = 1;
        self.write_root(&root)
    }

    /// Moves the upper half of the full node into a new node and indexes it from the root.
    fn dx_split_node(&mut self, mut path: Path) -> Result<()> {
        let new_node = self.append()?;
        let node = &mut path.frames[1];
        let keep = node.entries.len() / 2;
        let moved = node.entries.split_off(keep);
        let split_hash = moved[0].hash;
        let node_lblk = node.lblk;
        let kept = node.entries.clone();
        self.io.order_late(node_lblk);
        self.write_node(new_node, &moved)?;
        self.write_node(node_lblk, &kept)?;
        let at = path.frames[0].at;
        path.frames[0].entries.insert(at + 1, DxEntry { hash: split_hash, block: new_node });
        self.write_frame(&mut path, 0)
    }

    /// `do_split`: moves the upper half (by hash) of the full leaf into a new leaf, indexes it
    /// and puts the new name where its hash belongs. Returns the leaf the name went in, or
    /// `None` when it does not fit its half (the caller re-probes).
    fn dx_split_leaf(
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

    /// Splits the entries of a full leaf (in their order in the block) as `do_split` does:
    /// sorted by hash, entries move from the top while the moved part stays within half a block
    /// (current kernels split where that stops; when everything fits in half a block, by count).
    /// Returns the lower half in block order (what `dx_pack_dirents` keeps), the upper half in
    /// hash order (what `dx_move_dirents` writes) and the upper half's index hash, with the
    /// collision bit when the split falls inside a run of equal hashes. Needs two entries.
    fn split_recs(&self, recs: Vec<LeafRec>) -> (Vec<LeafRec>, Vec<LeafRec>, u32) {
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

    /// A leaf holding `recs` back to back.
    fn pack_leaf(&self, recs: &[LeafRec]) -> Vec<u8> {
        let entries: Vec<(&[u8], u32, u8)> =
            recs.iter().map(|r| (&r.name[..], r.ino, r.file_type)).collect();
        let mut data = vec![0u8; self.block_size];
        let packed = dirent::pack_dir_block(&mut data, self.has_csum, &entries);
        assert!(packed, "entries that shared one leaf fit in an empty one");
        data
    }

    // -- Readdir ------------------------------------------------------------------------------

    /// Linear order: entries at block offsets >= `start`.
    fn read_linear(&mut self, start: u64, want: usize) -> Result<Vec<DirEntryInfo>> {
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

    /// Hash order: entries at hash positions >= `start`, whole position groups only.
    fn read_hashed(
        &mut self,
        start: u64,
        want: usize,
        must_progress: bool,
    ) -> Result<Vec<DirEntryInfo>> {
        if start > HASH_POSITION_MAX {
            return Ok(Vec::new());
        }
        // Entries with a position below `complete_below` have all been collected.
        let (mut found, complete_below) = if self.indexed() {
            self.collect_hashed_htree(start, want)?
        } else {
            let data = self.read_leaf(0)?;
            let mut found = Vec::new();
            for entry in self.linear_entries(0, &data)? {
                let (major, minor) = self.hash(entry.name, self.ctx.hash_version)?;
                found.push((hash_position(major, minor), entry_info(&entry)));
            }
            (found, u64::MAX)
        };
        found.retain(|(position, _)| *position >= start && *position < complete_below);
        found.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.name.cmp(&b.1.name)));
        let mut out = Vec::new();
        let mut i = 0;
        while i < found.len() && out.len() < want {
            let position = found[i].0;
            let group = found[i..].iter().take_while(|(p, _)| *p == position).count();
            if out.len() + group > want && !(out.is_empty() && must_progress) {
                break;
            }
            let next_cookie = position + 1 + COOKIE_POSITION_BASE;
            out.extend(
                found[i..i + group].iter().map(|(_, e)| DirEntryInfo { next_cookie, ..e.clone() }),
            );
            i += group;
        }
        Ok(out)
    }

    /// Walks leaves from the one holding `start`'s hash until at least `want` collected entries
    /// are known complete (every later leaf starts at a higher hash). Returns the entries and
    /// the position below which the collection is complete.
    fn collect_hashed_htree(
        &mut self,
        start: u64,
        want: usize,
    ) -> Result<(Vec<(u64, DirEntryInfo)>, u64)> {
        let start_hash = ((start >> 32) as u32) << 1;
        let (root, version) = self.read_root()?;
        let mut path = self.descend(root, version, Some(start_hash))?;
        let mut visited = HashSet::new();
        let mut found = Vec::new();
        loop {
            let lblk = self.visit_leaf(&path, &mut visited)?;
            let data = self.read_leaf(lblk)?;
            for entry in self.leaf_live(lblk, &data)? {
                let (major, minor) = self.hash(entry.name, version)?;
                let position = hash_position(major, minor);
                if position >= start {
                    found.push((position, entry_info(&entry)));
                }
            }
            let Some(next_hash) = self.next_leaf(&mut path, None)? else {
                return Ok((found, u64::MAX));
            };
            let bound = hash_position(next_hash & !DX_HASH_CONTINUED, 0);
            if found.iter().filter(|(position, _)| *position < bound).count() >= want {
                return Ok((found, bound));
            }
        }
    }
}

/// Inodes below ext4's first ordinary inode (`EXT4_GOOD_OLD_FIRST_INO`, 11: the bad-blocks,
/// journal, resize, quota, ... inodes), except the root, never appear in a directory: the
/// kernel's lookup refuses them (`__ext4_iget` without EXT4_IGET_SPECIAL: "bad inode number"),
/// and handing one out would let a file operation change the journal or the resize inode.
fn is_reserved_ino(ino: u32) -> bool {
    (1..GOOD_OLD_FIRST_INO).contains(&ino) && ino != ondisk::ext4::ROOT_INO
}

/// `EXT4_GOOD_OLD_FIRST_INO`: `s_first_ino` is never below it.
const GOOD_OLD_FIRST_INO: u32 = 11;

fn entry_info(entry: &DirEntry<'_>) -> DirEntryInfo {
    DirEntryInfo {
        name: entry.name.to_vec(),
        ino: entry.inode,
        file_type: entry.file_type,
        next_cookie: 0,
    }
}

#[cfg(test)]
mod tests {
    use ondisk::testing::Rng;
    use std::collections::{BTreeMap, HashMap};

    use ondisk::ext4::dir::{FT_DIR, FT_REG_FILE, FT_SYMLINK};

    use super::*;

    /// An in-memory directory: its blocks and its index flag. Appended blocks start as 0xA5
    /// garbage, since their contents are unspecified until written.
    #[derive(Clone)]
    struct MemDir {
        block_size: usize,
        blocks: Vec<Vec<u8>>,
        indexed: bool,
    }

    impl MemDir {
        fn new(block_size: usize) -> MemDir {
            MemDir { block_size, blocks: Vec::new(), indexed: false }
        }
    }

    impl DirIo for MemDir {
        fn block_size(&self) -> usize {
            self.block_size
        }
        fn dir_blocks(&self) -> u32 {
            self.blocks.len() as u32
        }
        fn read_dir_block(&mut self, lblk: u32) -> Result<Vec<u8>> {
            self.blocks
                .get(lblk as usize)
                .cloned()
                .ok_or_else(|| FsError::Invalid(format!("read of block {lblk}")))
        }
        fn write_dir_block(&mut self, lblk: u32, data: &[u8]) -> Result<()> {
            assert_eq!(data.len(), self.block_size);
            self.blocks[lblk as usize].copy_from_slice(data);
            Ok(())
        }
        fn append_dir_block(&mut self) -> Result<u32> {
            self.blocks.push(vec![0xA5; self.block_size]);
            Ok(self.blocks.len() as u32 - 1)
        }
        fn physical_block(&mut self, lblk: u32) -> u64 {
            1000 + u64::from(lblk)
        }
        fn indexed(&self) -> bool {
            self.indexed
        }
        fn set_indexed(&mut self, on: bool) {
            self.indexed = on;
        }
    }

    const DIR_INO: u32 = 12;
    const PARENT_INO: u32 = 2;

    fn ctx(csum: bool, dir_index: bool, hash_version: u8) -> DirCtx {
        DirCtx {
            ino: DIR_INO,
            csum_seed: csum.then_some(0x5EED_C0DE),
            dir_index,
            hash_version,
            hash_seed: [0x3e0a_5f9c, 0x8e4b_d271, 0x132d_f4a6, 0x975b_8ec0],
        }
    }

    fn new_dir(block_size: usize, ctx: &DirCtx) -> MemDir {
        let mut io = MemDir::new(block_size);
        init_dir(&mut io, ctx, DIR_INO, PARENT_INO).unwrap();
        io
    }

    /// 1..=24 bytes mostly, sometimes 100..=255 or exactly 255; any byte but NUL and '/'.
    fn random_name(rng: &mut Rng) -> Vec<u8> {
        let len = match rng.below(20) {
            0 => 255,
            1 => 100 + rng.below(156),
            _ => 1 + rng.below(24),
        } as usize;
        let mut name: Vec<u8> = (0..len)
            .map(|_| loop {
                let byte = rng.next() as u8;
                if byte != 0 && byte != b'/' {
                    break byte;
                }
            })
            .collect();
        if name == b"." || name == b".." {
            name.push(b'x');
        }
        name
    }

    type Model = BTreeMap<Vec<u8>, (u32, u8)>;

    /// An e2fsck-pass-2-like walk written independently of the code under test: every block's
    /// checksum and chain, "." and "..", and for an htree the limits, every block referenced
    /// exactly once, and every leaf's hashes inside its index range. Returns the names found.
    fn fsck(io: &MemDir, ctx: &DirCtx) -> Model {
        let has_csum = ctx.csum_seed.is_some();
        let mut names = Model::new();
        let add = |names: &mut Model, lblk: usize, block: &[u8], lo: u32, hi: u32, version| {
            if let Some(seed) = ctx.csum_seed {
                assert!(dirent::dir_block_checksum_ok(seed, block), "leaf {lblk} checksum");
            }
            let mut entries = dirent::parse_dir_block(block, has_csum).unwrap();
            if lblk == 0 {
                let (dot, dotdot) = dirent::parse_dots(block).unwrap();
                assert_eq!((dot.inode, dotdot.offset), (DIR_INO, 12));
                entries.drain(..2);
            }
            for entry in entries {
                if let Some(version) = version {
                    let (hash, _) = name_hash(entry.name, version, &ctx.hash_seed).unwrap();
                    assert!(
                        lo <= hash && hash <= hi,
                        "leaf {lblk}: hash {hash:#x} outside {lo:#x}..={hi:#x}"
                    );
                }
                let old = names.insert(entry.name.to_vec(), (entry.inode, entry.file_type));
                assert!(old.is_none(), "{:?} twice", entry.name);
            }
        };
        if !io.indexed {
            for (lblk, block) in io.blocks.iter().enumerate() {
                add(&mut names, lblk, block, 0, u32::MAX, None);
            }
            return names;
        }
        assert!(ctx.dir_index);
        let root = htree::parse_dx_root(&io.blocks[0], has_csum).unwrap();
        if let Some(seed) = ctx.csum_seed {
            assert!(htree::dx_checksum_ok(seed, &io.blocks[0]));
        }
        let version = Some(effective_version(root.hash_version, ctx.hash_version));
        let mut references = vec![0u32; io.blocks.len()];
        references[0] += 1;
        let ranges = |entries: &[DxEntry], lo: u32, hi: u32| -> Vec<(u32, u32, u32)> {
            (0..entries.len())
                .map(|i| {
                    let start = if i == 0 { lo } else { entries[i].hash & !1 };
                    let end = entries.get(i + 1).map_or(hi, |e| e.hash & !1);
                    assert!(lo <= start && start <= end && end <= hi, "index ranges out of order");
                    (entries[i].block, start, end)
                })
                .collect()
        };
        for (child, lo, hi) in ranges(&root.entries, 0, u32::MAX) {
            references[child as usize] += 1;
            let block = &io.blocks[child as usize];
            if root.indirect_levels == 0 {
                add(&mut names, child as usize, block, lo, hi, version);
                continue;
            }
            let entries = htree::parse_dx_node(block, has_csum).unwrap();
            if let Some(seed) = ctx.csum_seed {
                assert!(htree::dx_checksum_ok(seed, block), "node {child} checksum");
            }
            for (leaf, lo, hi) in ranges(&entries, lo, hi) {
                references[leaf as usize] += 1;
                add(&mut names, leaf as usize, &io.blocks[leaf as usize], lo, hi, version);
            }
        }
        assert!(references.iter().all(|&n| n == 1), "block references {references:?}");
        names
    }

    /// The whole listing, in batches of random size; checks cookies move forward.
    fn list_all(io: &mut MemDir, ctx: &DirCtx, rng: &mut Rng) -> Vec<DirEntryInfo> {
        let mut cookie = READDIR_START;
        let mut all = Vec::new();
        for _ in 0..1_000_000 {
            let batch = read_dir(io, ctx, cookie, 1 + rng.below(100) as usize).unwrap();
            let Some(last) = batch.last() else {
                return all;
            };
            assert!(last.next_cookie > cookie, "cookie {cookie} did not advance");
            cookie = last.next_cookie;
            all.extend(batch);
        }
        panic!("readdir did not end");
    }

    /// Everything the public operations can say about the directory matches the model.
    fn check_against_model(io: &mut MemDir, ctx: &DirCtx, model: &Model, rng: &mut Rng) {
        assert_eq!(&fsck(io, ctx), model);
        let listing = list_all(io, ctx, rng);
        assert_eq!((&listing[0].name[..], listing[0].ino), (&b"."[..], DIR_INO));
        assert_eq!((&listing[1].name[..], listing[1].ino), (&b".."[..], PARENT_INO));
        let listed: Model =
            listing[2..].iter().map(|e| (e.name.clone(), (e.ino, e.file_type))).collect();
        assert_eq!(listing.len() - 2, listed.len(), "an entry was listed twice");
        assert_eq!(&listed, model);
        for (name, &found) in model {
            assert_eq!(lookup(io, ctx, name).unwrap(), Some(found));
        }
        assert_eq!(is_empty(io, ctx).unwrap(), model.is_empty());
    }

    /// Random adds, removes, lookups and replaces, each checked against a map; the whole
    /// directory is compared with the map every `check_every` steps and at the end.
    fn run_model(
        rng: &mut Rng,
        io: &mut MemDir,
        ctx: &DirCtx,
        steps: usize,
        extra: &[Vec<u8>],
    ) -> Model {
        let mut model = Model::new();
        let mut names: Vec<Vec<u8>> = Vec::new();
        let mut next_ino = 100u32;
        let check_every = 1000;
        for step in 0..steps {
            match rng.below(100) {
                0..=54 => {
                    let name = if !extra.is_empty() && rng.below(4) == 0 {
                        extra[rng.below(extra.len() as u64) as usize].clone()
                    } else {
                        random_name(rng)
                    };
                    let ft = [FT_REG_FILE, FT_DIR, FT_SYMLINK][rng.below(3) as usize];
                    next_ino += 1;
                    let result = add_entry(io, ctx, &name, next_ino, ft);
                    if model.contains_key(&name) {
                        assert!(matches!(result, Err(FsError::Exists)), "{result:?}");
                    } else {
                        result.unwrap();
                        model.insert(name.clone(), (next_ino, ft));
                        names.push(name.clone());
                    }
                    assert_eq!(lookup(io, ctx, &name).unwrap(), model.get(&name).copied());
                }
                55..=74 if !names.is_empty() => {
                    let name = names.swap_remove(rng.below(names.len() as u64) as usize);
                    let (ino, _) = model.remove(&name).unwrap();
                    assert_eq!(remove_entry(io, ctx, &name).unwrap(), ino);
                    assert_eq!(lookup(io, ctx, &name).unwrap(), None);
                    assert!(matches!(remove_entry(io, ctx, &name), Err(FsError::NotFound)));
                }
                75..=89 => {
                    let name = match names.len() {
                        0 => random_name(rng),
                        n => names[rng.below(n as u64) as usize].clone(),
                    };
                    assert_eq!(lookup(io, ctx, &name).unwrap(), model.get(&name).copied());
                }
                _ if !names.is_empty() => {
                    let name = names[rng.below(names.len() as u64) as usize].clone();
                    next_ino += 1;
                    let old = model.insert(name.clone(), (next_ino, FT_REG_FILE)).unwrap();
                    assert_eq!(
                        replace_entry(io, ctx, &name, next_ino, FT_REG_FILE).unwrap().0,
                        old.0
                    );
                }
                _ => {}
            }
            if step % check_every == check_every - 1 || step + 1 == steps {
                check_against_model(io, ctx, &model, rng);
            }
        }
        model
    }

    #[test]
    fn random_operations_match_a_model_for_every_layout() {
        let mut rng = Rng::from_env("directory model");
        let mut config = 0u8;
        for block_size in [1024, 4096] {
            for csum in [false, true] {
                for dir_index in [false, true] {
                    let version = ((rng.next() as u8) ^ config) % 6;
                    config += 1;
                    let ctx = ctx(csum, dir_index, version);
                    println!(
                        "block {block_size}, csum {csum}, dir_index {dir_index}, hash {version}"
                    );
                    let mut io = new_dir(block_size, &ctx);
                    let steps = if block_size == 1024 && dir_index { 9000 } else { 5000 };
                    let model = run_model(&mut rng, &mut io, &ctx, steps, &[]);
                    assert!(model.len() > 1000);
                    assert_eq!(io.indexed, dir_index, "dir_index directories become htrees");
                    if dir_index && block_size == 1024 {
                        let root = htree::parse_dx_root(&io.blocks[0], csum).unwrap();
                        assert_eq!(root.indirect_levels, 1, "the 1 KiB htrees reach two levels");
                    }
                }
            }
        }
    }

    #[test]
    fn colliding_hashes_spill_across_leaves_and_stay_findable() {
        // Sixteen hash values for thousands of names: long chains of leaves that continue one
        // hash, entries sharing a readdir position, splits inside runs of equal hashes.
        TEST_HASH_MASK.with(|mask| mask.set(0xF000_0000));
        let mut rng = Rng::from_env("colliding hashes");
        for (block_size, csum) in [(1024, true), (4096, false)] {
            let ctx = ctx(csum, true, htree::DX_HASH_HALF_MD4);
            let mut io = new_dir(block_size, &ctx);
            let model = run_model(&mut rng, &mut io, &ctx, 5000, &[]);
            assert!(model.len() > 1000 && io.indexed);
            // Some index entry (in the root or, in a two-level tree, an interior node) marks
            // a leaf that continues its predecessor's hash.
            let root = htree::parse_dx_root(&io.blocks[0], csum).unwrap();
            let mut entries = root.entries.clone();
            if root.indirect_levels > 0 {
                for entry in &root.entries {
                    let node = &io.blocks[entry.block as usize];
                    entries.extend(htree::parse_dx_node(node, csum).unwrap());
                }
            }
            assert!(entries.iter().any(|e| e.hash & DX_HASH_CONTINUED != 0));
        }
        TEST_HASH_MASK.with(|mask| mask.set(!0));
    }

    /// Names with equal legacy hashes, found by search (the legacy hash ignores the seed and
    /// has a minor hash of 0, so these share a whole readdir position).
    fn legacy_collisions(pairs_wanted: usize) -> Vec<Vec<u8>> {
        let mut seen: HashMap<u32, Vec<u8>> = HashMap::new();
        let mut colliding = Vec::new();
        for i in 0u32..4_000_000 {
            let name = format!("c{i:x}").into_bytes();
            let (hash, _) = htree::dx_hash(&name, htree::DX_HASH_LEGACY, &[0; 4]).unwrap();
            if let Some(other) = seen.insert(hash, name.clone()) {
                colliding.push(other);
                colliding.push(name);
                if colliding.len() >= 2 * pairs_wanted {
                    break;
                }
            }
        }
        assert!(colliding.len() >= 2 * pairs_wanted, "no legacy collisions found");
        colliding
    }

    #[test]
    fn real_legacy_hash_collisions_are_found_listed_and_removed_independently() {
        let colliding = legacy_collisions(4);
        let mut rng = Rng::from_env("legacy collisions");
        let ctx = ctx(true, true, htree::DX_HASH_LEGACY);
        let mut io = new_dir(1024, &ctx);
        let model = run_model(&mut rng, &mut io, &ctx, 3000, &colliding);
        assert!(io.indexed);
        for pair in colliding.chunks(2) {
            let (a, b) = (&pair[0], &pair[1]);
            assert_eq!(
                htree::dx_hash(a, 0, &[0; 4]).unwrap(),
                htree::dx_hash(b, 0, &[0; 4]).unwrap()
            );
            assert_eq!(lookup(&mut io, &ctx, a).unwrap(), model.get(a).copied());
            assert_eq!(lookup(&mut io, &ctx, b).unwrap(), model.get(b).copied());
        }
        // Both of the first pair present, then remove one: the other stays.
        let (a, b) = (&colliding[0], &colliding[1]);
        for name in [a, b] {
            if lookup(&mut io, &ctx, name).unwrap().is_none() {
                add_entry(&mut io, &ctx, name, 77, FT_REG_FILE).unwrap();
            }
        }
        remove_entry(&mut io, &ctx, a).unwrap();
        assert!(lookup(&mut io, &ctx, b).unwrap().is_some());
        assert!(lookup(&mut io, &ctx, a).unwrap().is_none());
    }

    #[test]
    fn full_single_block_directory_converts_to_an_htree_with_two_leaves() {
        for csum in [false, true] {
            let ctx = ctx(csum, true, htree::DX_HASH_TEA_UNSIGNED);
            let mut io = new_dir(1024, &ctx);
            let mut n = 0;
            while !io.indexed {
                add_entry(&mut io, &ctx, format!("file-{n:04}").as_bytes(), 100 + n, FT_REG_FILE)
                    .unwrap();
                n += 1;
            }
            assert_eq!(io.blocks.len(), 3, "root plus two leaves");
            let root = htree::parse_dx_root(&io.blocks[0], csum).unwrap();
            assert_eq!(root.hash_version, htree::DX_HASH_TEA, "the unsigned +3 is not stored");
            assert_eq!((root.indirect_levels, root.entries.len()), (0, 2));
            assert_eq!((root.dot_inode, root.dotdot_inode), (DIR_INO, PARENT_INO));
            let names = fsck(&io, &ctx);
            assert_eq!(names.len(), n as usize);
            // Both leaves got a share of the entries.
            for leaf in [1, 2] {
                assert!(dirent::parse_dir_block(&io.blocks[leaf], csum).unwrap().len() > 5);
            }
        }
    }

    #[test]
    fn index_grows_to_two_levels_and_reports_no_space_when_both_are_full() {
        // 1 KiB blocks and 255-byte names: three names per leaf, 123 x 126 leaves at most.
        let ctx = ctx(true, true, htree::DX_HASH_HALF_MD4);
        let mut io = new_dir(1024, &ctx);
        let name = |n: u32| {
            let mut name = format!("{n:08}-").into_bytes();
            name.resize(255, b'q');
            name
        };
        let mut n = 0;
        let err = loop {
            match add_entry(&mut io, &ctx, &name(n), 100 + n, FT_REG_FILE) {
                Ok(()) => n += 1,
                Err(err) => break err,
            }
            assert!(n < 100_000, "the index never filled up");
        };
        assert!(matches!(err, FsError::NoSpace), "{err}");
        let root = htree::parse_dx_root(&io.blocks[0], true).unwrap();
        assert_eq!((root.indirect_levels, root.entries.len()), (1, 123));
        assert_eq!(fsck(&io, &ctx).len(), n as usize);
        for i in (0..n).step_by(97) {
            assert_eq!(lookup(&mut io, &ctx, &name(i)).unwrap(), Some((100 + i, FT_REG_FILE)));
        }
        // Removing a name makes room in its leaf again.
        assert_eq!(remove_entry(&mut io, &ctx, &name(5)).unwrap(), 105);
        add_entry(&mut io, &ctx, &name(5), 5, FT_REG_FILE).unwrap();
        assert!(!is_empty(&mut io, &ctx).unwrap());
    }

    #[test]
    fn readdir_returns_every_stable_entry_exactly_once_while_entries_come_and_go() {
        let mut rng = Rng::from_env("readdir stability");
        // (block size, csum, dir_index, names before the listing starts)
        let cases = [
            (1024, true, true, 10),  // converts from one block to an htree mid-listing
            (4096, false, true, 30), // the same with 4 KiB blocks
            (1024, false, true, 2500),
            (4096, true, true, 3000),
            (1024, true, false, 800), // linear, several blocks, growing
            (4096, false, false, 400),
        ];
        for (block_size, csum, dir_index, initial) in cases {
            let ctx = ctx(csum, dir_index, rng.below(6) as u8);
            let mut io = new_dir(block_size, &ctx);
            let was_indexed = io.indexed;
            let mut stable = Vec::new();
            let mut volatile = Vec::new();
            for i in 0..initial {
                let name = format!("s{i}-{}", rng.below(1 << 20)).into_bytes();
                add_entry(&mut io, &ctx, &name, 1000 + i, FT_REG_FILE).unwrap();
                if i % 3 == 0 {
                    volatile.push(name);
                } else {
                    stable.push(name);
                }
            }
            let mut seen: HashMap<Vec<u8>, u32> = HashMap::new();
            let mut cookie = READDIR_START;
            let mut fresh = 0u32;
            loop {
                let batch = read_dir(&mut io, &ctx, cookie, 1 + rng.below(40) as usize).unwrap();
                let Some(last) = batch.last() else { break };
                cookie = last.next_cookie;
                for entry in batch {
                    *seen.entry(entry.name).or_default() += 1;
                }
                // In the small cases, fill the one block right after the first batch, so that
                // it converts to an htree between two calls.
                while dir_index && initial <= 30 && !io.indexed {
                    fresh += 1;
                    let name = format!("v{fresh}-{}", rng.below(1 << 20)).into_bytes();
                    add_entry(&mut io, &ctx, &name, 50_000 + fresh, FT_REG_FILE).unwrap();
                    volatile.push(name);
                }
                for _ in 0..rng.below(6) {
                    fresh += 1;
                    let name = format!("v{fresh}-{}", rng.below(1 << 20)).into_bytes();
                    add_entry(&mut io, &ctx, &name, 50_000 + fresh, FT_REG_FILE).unwrap();
                    volatile.push(name);
                }
                for _ in 0..rng.below(3) {
                    if !volatile.is_empty() {
                        let name = volatile.swap_remove(rng.below(volatile.len() as u64) as usize);
                        remove_entry(&mut io, &ctx, &name).unwrap();
                    }
                }
                if !stable.is_empty() {
                    let name = &stable[rng.below(stable.len() as u64) as usize];
                    replace_entry(&mut io, &ctx, name, 77, FT_REG_FILE).unwrap();
                }
            }
            for name in stable.iter().chain([&b"."[..].to_vec(), &b"..".to_vec()]) {
                assert_eq!(seen.get(name), Some(&1), "{:?}", String::from_utf8_lossy(name));
            }
            assert!(seen.values().all(|&n| n == 1), "an entry was listed twice");
            if dir_index && initial <= 30 {
                assert!(!was_indexed && io.indexed, "the directory converted while listed");
            }
        }
    }

    #[test]
    fn entries_naming_reserved_inodes_are_corruption() {
        for (csum, dir_index, names) in [(true, true, 1), (false, false, 1), (true, true, 400)] {
            let ctx = ctx(csum, dir_index, 1);
            let mut io = new_dir(1024, &ctx);
            for i in 0..names {
                add_entry(&mut io, &ctx, format!("f{i}").as_bytes(), 100 + i, FT_REG_FILE).unwrap();
            }
            // The root is no reserved inode: ".." of a top-level directory names it.
            replace_entry(&mut io, &ctx, b"f0", 2, FT_DIR).unwrap();
            assert_eq!(lookup(&mut io, &ctx, b"f0").unwrap(), Some((2, FT_DIR)));
            // The journal's inode (8) behind a name, as a damaged block may say.
            replace_entry(&mut io, &ctx, b"f0", 8, FT_REG_FILE).unwrap();
            let err = lookup(&mut io, &ctx, b"f0").unwrap_err();
            assert!(
                matches!(&err, FsError::Corrupted { reason, .. } if reason.contains("reserved inode 8")),
                "{err}"
            );
            assert!(read_dir(&mut io, &ctx, READDIR_START, 10_000).is_err());
            assert!(remove_entry(&mut io, &ctx, b"f0").is_err());
        }
    }

    #[test]
    fn names_are_checked_before_anything_is_read() {
        let ctx = ctx(true, true, 1);
        let mut io = new_dir(4096, &ctx);
        add_entry(&mut io, &ctx, b"a", 20, FT_REG_FILE).unwrap();
        assert!(matches!(add_entry(&mut io, &ctx, b"a", 21, FT_REG_FILE), Err(FsError::Exists)));
        let long = [b'l'; 256];
        assert!(matches!(add_entry(&mut io, &ctx, &long, 21, 1), Err(FsError::NameTooLong)));
        assert!(matches!(lookup(&mut io, &ctx, &long), Err(FsError::NameTooLong)));
        add_entry(&mut io, &ctx, &long[..255], 22, 1).unwrap();
        for bad in [&b""[..], b".", b"..", b"a/b", b"nul\0"] {
            assert!(matches!(add_entry(&mut io, &ctx, bad, 21, 1), Err(FsError::Invalid(_))));
        }
        assert!(matches!(remove_entry(&mut io, &ctx, b"zz"), Err(FsError::NotFound)));
        assert!(matches!(replace_entry(&mut io, &ctx, b"zz", 3, 1), Err(FsError::NotFound)));
        assert_eq!(lookup(&mut io, &ctx, b".").unwrap(), Some((DIR_INO, FT_DIR)));
        assert_eq!(lookup(&mut io, &ctx, b"..").unwrap(), Some((PARENT_INO, FT_DIR)));
    }

    #[test]
    fn set_parent_and_is_empty_work_on_linear_and_indexed_directories() {
        for dir_index in [false, true] {
            let ctx = ctx(true, dir_index, 1);
            let mut io = new_dir(1024, &ctx);
            assert!(is_empty(&mut io, &ctx).unwrap());
            for i in 0..200 {
                add_entry(&mut io, &ctx, format!("entry-{i}").as_bytes(), 100 + i, 1).unwrap();
            }
            assert_eq!(io.indexed, dir_index);
            set_parent(&mut io, &ctx, 77).unwrap();
            assert_eq!(lookup(&mut io, &ctx, b"..").unwrap(), Some((77, FT_DIR)));
            let listing = read_dir(&mut io, &ctx, READDIR_START, 2).unwrap();
            assert_eq!((listing[1].ino, listing[1].next_cookie), (77, COOKIE_AFTER_DOTDOT));
            assert!(!is_empty(&mut io, &ctx).unwrap());
            for i in 0..200 {
                remove_entry(&mut io, &ctx, format!("entry-{i}").as_bytes()).unwrap();
            }
            // Blocks stay (ext4 never shrinks directories), the directory is empty.
            assert!(io.blocks.len() > 1);
            assert!(is_empty(&mut io, &ctx).unwrap());
            assert_eq!(read_dir(&mut io, &ctx, READDIR_START, 10).unwrap().len(), 2);
            assert!(fsck(&io, &ctx).is_empty());
        }
    }

    #[test]
    fn checksum_mismatches_and_bad_index_pointers_are_corruption() {
        let ctx = ctx(true, true, 1);
        let mut io = new_dir(1024, &ctx);
        for i in 0..300 {
            add_entry(&mut io, &ctx, format!("n{i}").as_bytes(), 100 + i, 1).unwrap();
        }
        let good = io.clone();
        let corrupted = |io: &mut MemDir| {
            let err = lookup(io, &ctx, b"n17").unwrap_err();
            assert!(matches!(err, FsError::Corrupted { .. }), "{err}");
        };
        io.blocks[0][40] ^= 1; // a root hash
        corrupted(&mut io);
        let mut io = good.clone();
        let leaf = good.blocks.len() - 1;
        io.blocks[leaf][io.block_size - 20] ^= 1; // slack before the tail is covered too
        let err = read_dir(&mut io, &ctx, READDIR_START, 1000).unwrap_err();
        assert!(matches!(err, FsError::Corrupted { block, .. } if block == 1000 + leaf as u64));
        // An index entry past the directory's end, checksum resealed.
        let mut io = good.clone();
        ondisk_put_le32(&mut io.blocks[0], 36, 5000);
        htree::set_dx_checksum(0x5EED_C0DE, &mut io.blocks[0]);
        corrupted(&mut io);
        // Indexed directories need dir_index.
        let mut io = good;
        let no_index = DirCtx { dir_index: false, ..ctx };
        assert!(matches!(lookup(&mut io, &no_index, b"n1"), Err(FsError::Corrupted { .. })));
    }

    fn ondisk_put_le32(block: &mut [u8], at: usize, value: u32) {
        block[at..at + 4].copy_from_slice(&value.to_le_bytes());
    }

    /// Runs every operation on a possibly damaged directory; any outcome but a panic or a hang
    /// is acceptable.
    fn exercise(io: &mut MemDir, ctx: &DirCtx, rng: &mut Rng, names: &[Vec<u8>]) {
        let pick = |rng: &mut Rng| names[rng.below(names.len() as u64) as usize].clone();
        let _ = lookup(io, ctx, &pick(rng));
        let _ = lookup(io, ctx, b"..");
        let _ = add_entry(io, ctx, &random_name(rng), 9, 1);
        let _ = remove_entry(io, ctx, &pick(rng));
        let _ = replace_entry(io, ctx, &pick(rng), 10, 1);
        let _ = set_parent(io, ctx, 3);
        let _ = is_empty(io, ctx);
        let mut cookie = rng.below(3);
        for _ in 0..50 {
            match read_dir(io, ctx, cookie, 1 + rng.below(200) as usize) {
                Ok(batch) if !batch.is_empty() => cookie = batch[batch.len() - 1].next_cookie,
                _ => break,
            }
        }
        let _ = read_dir(io, ctx, rng.next(), 5);
    }

    #[test]
    fn random_and_mutated_directories_never_panic_any_operation() {
        let mut rng = Rng::from_env("hostile directory");
        let mut bases = Vec::new();
        for (block_size, csum, dir_index, names) in [
            (1024, false, true, 20),
            (1024, false, true, 600),
            (1024, true, true, 3000),
            (1024, false, false, 200),
        ] {
            let ctx = ctx(csum, dir_index, 1);
            let mut io = new_dir(block_size, &ctx);
            let mut all = Vec::new();
            for i in 0..names {
                let name = format!("{i}-{}", "x".repeat(rng.below(60) as usize)).into_bytes();
                add_entry(&mut io, &ctx, &name, 100 + i, 1).unwrap();
                all.push(name);
            }
            bases.push((io, ctx, all));
        }
        for round in 0..1500 {
            let (base, ctx, names) = &bases[round % bases.len()];
            let mut io = base.clone();
            let mut ctx = *ctx;
            match rng.below(8) {
                0 => {
                    let at = rng.below(io.blocks.len() as u64) as usize;
                    io.blocks[at] = (0..io.block_size).map(|_| rng.next() as u8).collect();
                }
                1 => io.indexed = !io.indexed,
                2 => io.blocks.truncate(1 + rng.below(io.blocks.len() as u64) as usize),
                3 => ctx.hash_version = rng.below(8) as u8,
                _ => {
                    for _ in 0..=rng.below(8) {
                        let block = rng.below(io.blocks.len() as u64) as usize;
                        let at = rng.below(io.block_size as u64) as usize;
                        io.blocks[block][at] = match rng.below(3) {
                            0 => 0,
                            1 => 0xFF,
                            _ => rng.next() as u8,
                        };
                    }
                }
            }
            if ctx.csum_seed.is_some() && rng.below(2) == 0 {
                // Reseal, so that the damage gets past the checksums to the parsers.
                let seed = ctx.csum_seed.unwrap_or_default();
                for block in &mut io.blocks {
                    if dirent::dir_tail_ok(block) {
                        dirent::set_dir_block_checksum(seed, block);
                    } else if htree::dx_csum(seed, block).is_some() {
                        htree::set_dx_checksum(seed, block);
                    }
                }
            }
            exercise(&mut io, &ctx, &mut rng, names);
            exercise(&mut io, &ctx, &mut rng, names);
        }
    }
}
