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
//! |                                 | split into its parent; when every index block   |
//! |                                 | on the path is full the root grows a level (one |
//! |                                 | level of nodes, two with largedir); at that     |
//! |                                 | depth: `NoSpace` ("directory index full"), which|
//! |                                 | [`check_room`] tells before anything changes    |
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
//!
//! ## Files
//! This module holds the API and the types; `block.rs` one directory's blocks during an
//! operation (`Dir`), `linear.rs` linear directories and their conversion to an htree, `dx.rs`
//! the hashed index, `readdir.rs` readdir in hash order, `tests.rs` the model-based tests.

use std::collections::HashSet;

use ondisk::ext4::dir::{self as dirent, DirEntry, NAME_LEN_MAX};
use ondisk::ext4::htree::{self, DxEntry, DxRoot, DX_HASH_CONTINUED};
use ondisk::OnDiskError;

use crate::error::{FsError, Result};

mod block;
mod dx;
mod linear;
mod readdir;
#[cfg(test)]
mod tests;

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
    /// The largedir feature: the index may have two levels of nodes below the root (without
    /// it, one).
    pub largedir: bool,
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

/// Whether `name` (not present) can be added, reading only: `NoSpace` when its leaf is full and
/// so is every index block above it, at the deepest index the directory may have (ext4's
/// "directory index full"), which [`add_entry`] would find only after it had split blocks.
/// Callers check this before they change anything.
pub fn check_room(io: &mut dyn DirIo, ctx: &DirCtx, name: &[u8]) -> Result<()> {
    check_name(name)?;
    let mut dir = Dir::open(io, ctx)?;
    if !dir.indexed() {
        return Ok(());
    }
    if dir.dx_room(name)? {
        Ok(())
    } else {
        Err(FsError::NoSpace)
    }
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
