//! Extended attributes of one inode: get, list, set, remove, and dropping the inode's reference
//! to its xattr block when the inode is deleted.
//!
//! The caller hands in the inode's in-inode area (the record's bytes after `128 +
//! i_extra_isize`) and its `i_file_acl` (0 = no block), and writes both back after a successful
//! change; blocks are read, written, allocated and freed through [`MetaIo`], so they are journaled
//! and accounted (i_blocks) by the caller's implementation. The on-disk codec is
//! [`ondisk::ext4::xattr`].
//!
//! Placement follows the kernel's `ext4_xattr_set_handle`:
//!
//! | new value fits ...              | result                                                   |
//! |---------------------------------|----------------------------------------------------------|
//! | in the inode area               | stored in the inode; an old copy in the block is removed |
//! | not in the inode, in the block  | stored in the block; an old copy in the inode is removed |
//! | in neither, or larger than a block less 56 bytes, with ea_inode | in an inode of its own (`ea_inode.rs`), the entry in the inode area or else the block |
//! | in neither, without ea_inode    | `NoSpace`, nothing changes                                 |
//!
//! With ea_inode, the value inode an entry names is released (one reference fewer, freed at
//! none) when the entry is replaced or removed, when its xattr block is freed, and when its
//! inode is deleted ([`release_inode_values`]); an xattr block shared with other inodes
//! (h_refcount > 1) that names value inodes is not changed (NotSupported: a copy would need
//! every value inode's count raised). The owner is charged each value's size, rounded up to
//! blocks, in its i_blocks, as the kernel charges it to the owner's quota
//! ([`value_inode_charge`]).
//!
//! Invariants kept:
//! - A block with `h_refcount > 1` is shared with other inodes and is never changed except for
//!   its refcount: a change writes a fresh block (refcount 1) and the old block goes back with
//!   refcount - 1 (copy-on-write, as `ext4_xattr_block_set` clones).
//! - A block left without entries is released (refcount - 1, or freed at refcount 1) and
//!   `i_file_acl` becomes 0: no inode points at an empty block.
//! - Every block read is validated before use: inside the file system, checksum (when
//!   metadata_csum is on), header, entries and values, refcount >= 1.
//! - On error nothing the caller sees has changed: new images are computed and allocation is done
//!   before any write, the in-inode area and `file_acl` are updated last. (A device error in the
//!   middle of the writes aborts the caller's journal handle, which discards them all.)
//!
//! Names: the full name ("user.foo") picks the name index by its namespace (an unknown one is
//! `NotSupported`); the suffix must be 1..=255 bytes (`Range` when longer, `Invalid` when empty,
//! except for the whole-name ACL attributes) and hold no NUL. `system.data` belongs to the
//! inline_data feature (`inline.rs`): it is neither listed nor read, set or removed here
//! (EOPNOTSUPP, as the kernel, which has no handler for it), and the other changes keep it.
//!
//! Errors in the in-inode area are returned as [`FsError::OnDisk`] (this module does not know
//! which inode-table block the area came from); errors in the xattr block are
//! [`FsError::Corrupted`] naming the block.

use ondisk::ext4::xattr::{
    self as codec, encode_inode_xattrs, encode_xattr_block, parse_inode_xattrs, parse_xattr_block,
    ValueInode, XattrEntry, XATTR_INDEX_SYSTEM, XATTR_NAME_LEN_MAX,
};

use crate::error::{FsError, Result};
use crate::meta_io::MetaIo;

/// What an xattr operation needs to know about the file system.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XattrCtx {
    /// `Superblock::csum_seed()` when metadata_csum is on: xattr blocks are checksummed.
    pub fs_csum_seed: Option<u32>,
    /// Allocation goal for a new xattr block (the kernel uses the first block of the inode's
    /// group).
    pub goal: u64,
    /// The ea_inode feature: entries may keep their values in inodes of their own. Without
    /// it such an entry is damage (`ext4_xattr_check_entries`).
    pub ea_inode: bool,
    /// The inode whose attributes these are, and its owner and group, which a value inode
    /// made for it takes (0s where nothing is made).
    pub owner: (u32, u32, u32),
    /// The owner's mode (its type decides whether a value inode may be made for it).
    pub owner_mode: u16,
}

/// Values kept in inodes of their own (the ea_inode feature), made and dropped by the file
/// system inside the caller's transaction ([`MetaIo::value_inodes`]).
pub trait ValueInodes {
    /// Makes an inode holding `value`, the value of attribute `suffix` of `ctx.owner`, with
    /// one reference; returns the entry's reference, its hash computed.
    fn create_value_inode(
        &mut self,
        ctx: &XattrCtx,
        suffix: &[u8],
        value: &[u8],
    ) -> Result<ValueInode>;
    /// Drops one reference `ctx.owner` held to `value`'s inode, freeing the inode with the
    /// last.
    fn release_value_inode(&mut self, ctx: &XattrCtx, value: &ValueInode) -> Result<()>;
}

/// `EXT4_XATTR_MIN_LARGE_EA_SIZE(b)` is `b` less this: a value padded past it goes to an inode
/// of its own (a block less its header, one entry of a 3-byte name and the terminator).
const LARGE_VALUE_OVERHEAD: usize = 32 + 20 + 4;

/// A value as [`get`] finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stored {
    /// In the entry's place (in the inode or the block).
    Here(Vec<u8>),
    /// In an inode of its own (ea_inode): the caller reads that inode's data.
    InInode(ValueInode),
}

/// The flags of setxattr(2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetMode {
    /// Create or replace.
    Any,
    /// XATTR_CREATE: fail with `Exists` if the attribute exists.
    Create,
    /// XATTR_REPLACE: fail with `NoData` if the attribute does not exist.
    Replace,
}

/// The value of attribute `name` (full name, "user.foo"); `NoData` when the inode has none.
pub fn get(
    io: &mut dyn MetaIo,
    ctx: &XattrCtx,
    inode_area: &[u8],
    file_acl: u64,
    name: &[u8],
) -> Result<Stored> {
    let (index, suffix) = resolve_name(name)?;
    refuse_inline_data(index, suffix)?;
    let inode = parse_area(ctx, inode_area)?;
    let stored = |entry: &XattrEntry| match entry.value_inode {
        Some(reference) => Stored::InInode(reference),
        None => Stored::Here(entry.value.clone()),
    };
    if let Some(at) = position(&inode, index, suffix) {
        return Ok(stored(&inode[at]));
    }
    let block = read_block(io, ctx, file_acl)?;
    let entries = block.as_ref().map_or(&[][..], |b| &b.entries);
    match position(entries, index, suffix) {
        Some(at) => Ok(stored(&entries[at])),
        None => Err(FsError::NoData),
    }
}

/// The in-inode area's entries, values in inodes of their own allowed only with ea_inode.
fn parse_area(ctx: &XattrCtx, area: &[u8]) -> Result<Vec<XattrEntry>> {
    let entries = parse_inode_xattrs(area)?;
    if !ctx.ea_inode {
        if let Some(e) = entries.iter().find_map(|e| e.value_inode) {
            return Err(FsError::OnDisk(ondisk::OnDiskError::corrupted(
                "in-inode xattrs",
                format!("a value in inode {} without the ea_inode feature", e.ino),
            )));
        }
    }
    Ok(entries)
}

/// A shared xattr block (other inodes' too) that names value inodes is not changed: its copy
/// would name them once more each (the kernel raises every count, `ext4_xattr_inode_inc_ref_all`).
fn refuse_shared_value_inodes(block: Option<&XattrBlock>) -> Result<()> {
    if block.is_some_and(|b| b.refcount > 1 && b.entries.iter().any(|e| e.value_inode.is_some())) {
        return Err(FsError::NotSupported(
            "changing a shared xattr block that names values in inodes of their own".into(),
        ));
    }
    Ok(())
}

/// Drops the references `values` held (entries replaced or removed).
fn release_values(io: &mut dyn MetaIo, ctx: &XattrCtx, values: &[ValueInode]) -> Result<()> {
    for value in values {
        value_inodes(io)?.release_value_inode(ctx, value)?;
    }
    Ok(())
}

fn value_inodes(io: &mut dyn MetaIo) -> Result<&mut dyn ValueInodes> {
    io.value_inodes().ok_or_else(|| {
        FsError::NotSupported("values in inodes of their own (ea_inode) here".into())
    })
}

/// Drops the references the in-inode entries of a deleted inode hold (its xattr block's go
/// with the block, [`release_block`]).
pub fn release_inode_values(io: &mut dyn MetaIo, ctx: &XattrCtx, inode_area: &[u8]) -> Result<()> {
    let entries = parse_area(ctx, inode_area)?;
    let values: Vec<ValueInode> = entries.iter().filter_map(|e| e.value_inode).collect();
    release_values(io, ctx, &values)
}

/// The full names and sizes of the attributes of `inode_area` and `file_acl` whose values are
/// in inodes of their own and are this inode's to release: in the inode area, or in an xattr
/// block it does not share (a shared block's go with its last owner).
pub fn value_inode_names(
    io: &mut dyn MetaIo,
    ctx: &XattrCtx,
    inode_area: &[u8],
    file_acl: u64,
) -> Result<Vec<(Vec<u8>, u32)>> {
    let inode = parse_area(ctx, inode_area)?;
    let block = read_block(io, ctx, file_acl)?;
    let unshared = block.as_ref().filter(|b| b.refcount == 1).map_or(&[][..], |b| &b.entries);
    Ok(inode
        .iter()
        .chain(unshared)
        .filter_map(|e| e.value_inode.map(|v| (codec::full_name(e.name_index, &e.name), v.size)))
        .collect())
}

/// How many values in inodes of their own the attributes of `inode_area` and `file_acl`
/// name, a shared block's included: each is one inode charged to the owner's quota, as
/// `ext4_xattr_inode_alloc_quota` charges it and e2fsck counts it (`ea_block_quota`, every
/// owner of a shared block charged alike).
pub fn value_inode_count(
    io: &mut dyn MetaIo,
    ctx: &XattrCtx,
    inode_area: &[u8],
    file_acl: u64,
) -> Result<u64> {
    let inode = parse_area(ctx, inode_area)?;
    let block = read_block(io, ctx, file_acl)?;
    let in_block = block.as_ref().map_or(&[][..], |b| &b.entries);
    Ok(inode.iter().chain(in_block).filter(|e| e.value_inode.is_some()).count() as u64)
}

/// Bytes of i_blocks the owner of `inode_area` and `file_acl` is charged for the values it
/// keeps in inodes of their own: each value's size rounded up to whole blocks (clusters with
/// bigalloc: `round_up_cluster`), as `ext4_xattr_inode_alloc_quota` charges the owner's quota
/// (and with it i_blocks).
pub fn value_inode_charge(
    io: &mut dyn MetaIo,
    ctx: &XattrCtx,
    inode_area: &[u8],
    file_acl: u64,
) -> Result<u64> {
    if !ctx.ea_inode {
        return Ok(0);
    }
    let (block_size, cluster) = (io.block_size() as u64, io.cluster_blocks());
    let inode = parse_area(ctx, inode_area)?;
    let block = read_block(io, ctx, file_acl)?;
    let block_entries = block.as_ref().map_or(&[][..], |b| &b.entries);
    Ok(inode
        .iter()
        .chain(block_entries)
        .filter_map(|e| e.value_inode)
        .map(|v| value_charge_blocks(v.size, block_size, cluster) * block_size)
        .sum())
}

/// Blocks of i_blocks the owner is charged for one value of `size` bytes in an inode of its
/// own: the size in whole clusters of `cluster` blocks (`round_up_cluster`).
pub fn value_charge_blocks(size: u32, block_size: u64, cluster: u32) -> u64 {
    let cluster = u64::from(cluster);
    u64::from(size).div_ceil(block_size * cluster) * cluster
}

/// The full names of the inode's attributes: in-inode ones first, then the block's, each once.
/// Only names [`get`] finds are listed: entries of a namespace quill does not know are skipped,
/// as the kernel's listxattr skips them, and so are damaged names that do not read back as
/// the entry they came from (an empty `user.` name, `system.` + "posix_acl_access" stored
/// under the wrong index, ...), and a second copy of a name.
pub fn list(
    io: &mut dyn MetaIo,
    ctx: &XattrCtx,
    inode_area: &[u8],
    file_acl: u64,
) -> Result<Vec<Vec<u8>>> {
    let inode = parse_area(ctx, inode_area)?;
    let block = read_block(io, ctx, file_acl)?;
    let block_entries = block.as_ref().map_or(&[][..], |b| &b.entries);
    let mut names: Vec<Vec<u8>> = Vec::new();
    for e in inode.iter().chain(block_entries) {
        // Inline data is the file's contents, not an attribute (the kernel has no handler
        // for its index and lists nothing of it).
        if codec::name_prefix(e.name_index).is_none() || ondisk::ext4::inline::is_inline_xattr(e) {
            continue;
        }
        let full = codec::full_name(e.name_index, &e.name);
        let reads_back = resolve_name(&full).is_ok_and(|(i, s)| i == e.name_index && s == e.name);
        if reads_back && !names.contains(&full) {
            names.push(full);
        }
    }
    Ok(names)
}

/// Sets attribute `name` to `value`, creating or replacing it as `mode` allows. On success the
/// caller writes back `inode_area` and `file_acl` (both may have changed).
pub fn set(
    io: &mut dyn MetaIo,
    ctx: &XattrCtx,
    inode_area: &mut [u8],
    file_acl: &mut u64,
    name: &[u8],
    value: &[u8],
    mode: SetMode,
) -> Result<()> {
    let (index, suffix) = resolve_name(name)?;
    refuse_inline_data(index, suffix)?;
    let inode = parse_area(ctx, inode_area)?;
    let block = read_block(io, ctx, *file_acl)?;
    refuse_shared_value_inodes(block.as_ref())?;
    let block_entries = block.as_ref().map_or(&[][..], |b| &b.entries);
    let in_inode = position(&inode, index, suffix);
    let in_block = position(block_entries, index, suffix);
    let exists = in_inode.is_some() || in_block.is_some();
    match mode {
        SetMode::Create if exists => return Err(FsError::Exists),
        SetMode::Replace if !exists => return Err(FsError::NoData),
        _ => {}
    }
    // An unchanged value costs nothing (ext4_xattr_value_same; one in an inode of its own
    // is rewritten).
    let same = |entries: &[XattrEntry], at: Option<usize>| {
        at.is_some_and(|at| entries[at].value_inode.is_none() && entries[at].value == value)
    };
    if same(&inode, in_inode) || same(block_entries, in_block) {
        return Ok(());
    }
    // The value inodes of the entries this one replaces, released once it is in place.
    let replaced: Vec<ValueInode> =
        [in_inode.map(|at| &inode[at]), in_block.map(|at| &block_entries[at])]
            .into_iter()
            .flatten()
            .filter_map(|e| e.value_inode)
            .collect();
    let place = Placement { inode: &inode, block: block.as_ref(), in_inode, in_block };
    let large = ctx.ea_inode
        && value.len().div_ceil(4) * 4 > io.block_size().saturating_sub(LARGE_VALUE_OVERHEAD);
    if !large {
        match place.put(io, ctx, inode_area, file_acl, XattrEntry::new(index, suffix, value)) {
            Ok(()) => return release_values(io, ctx, &replaced),
            // As ext4_xattr_set_handle, a value that fits neither place goes to an inode.
            Err(FsError::NoSpace) if ctx.ea_inode => {}
            Err(err) => return Err(err),
        }
    }
    let reference = value_inodes(io)?.create_value_inode(ctx, suffix, value)?;
    let entry = XattrEntry {
        name_index: index,
        name: suffix.to_vec(),
        value: Vec::new(),
        value_inode: Some(reference),
    };
    match place.put(io, ctx, inode_area, file_acl, entry) {
        Ok(()) => release_values(io, ctx, &replaced),
        Err(err) => {
            // Made in this transaction and named by nothing: freed again.
            value_inodes(io)?.release_value_inode(ctx, &reference)?;
            Err(err)
        }
    }
}

/// Where an entry goes among an inode's attributes, as read.
struct Placement<'a> {
    inode: &'a [XattrEntry],
    block: Option<&'a XattrBlock>,
    /// The same name's entry in the inode area and in the block, if any.
    in_inode: Option<usize>,
    in_block: Option<usize>,
}

impl Placement<'_> {
    /// Puts `entry` in the inode area if it fits there (the same name leaving the block),
    /// else in the block (leaving the inode area): the module's placement table. `NoSpace`,
    /// with nothing written, when it fits neither.
    fn put(
        &self,
        io: &mut dyn MetaIo,
        ctx: &XattrCtx,
        inode_area: &mut [u8],
        file_acl: &mut u64,
        entry: XattrEntry,
    ) -> Result<()> {
        let mut inode_new = self.inode.to_vec();
        upsert(&mut inode_new, self.in_inode, entry.clone());
        if let Some(area) = encode_inode_xattrs(&inode_new, inode_area.len()) {
            if let (Some(block), Some(at)) = (self.block, self.in_block) {
                let mut remaining = block.entries.clone();
                remaining.remove(at);
                update_block(io, ctx, file_acl, Some(block), remaining)?;
            }
            inode_area.copy_from_slice(&area);
            return Ok(());
        }
        let mut block_new = self.block.map_or(&[][..], |b| &b.entries).to_vec();
        upsert(&mut block_new, self.in_block, entry);
        // Plan the in-inode side before any block I/O so that nothing is written on failure.
        let area = match self.in_inode {
            Some(at) => Some(inode_without(self.inode, at, inode_area.len())?),
            None => None,
        };
        update_block(io, ctx, file_acl, self.block, block_new)?;
        if let Some(area) = area {
            inode_area.copy_from_slice(&area);
        }
        Ok(())
    }
}

/// Removes attribute `name`; `NoData` when the inode has none. On success the caller writes
/// back `inode_area` and `file_acl`.
pub fn remove(
    io: &mut dyn MetaIo,
    ctx: &XattrCtx,
    inode_area: &mut [u8],
    file_acl: &mut u64,
    name: &[u8],
) -> Result<()> {
    let (index, suffix) = resolve_name(name)?;
    refuse_inline_data(index, suffix)?;
    let inode = parse_area(ctx, inode_area)?;
    let block = read_block(io, ctx, *file_acl)?;
    refuse_shared_value_inodes(block.as_ref())?;
    let in_inode = position(&inode, index, suffix);
    let in_block = block.as_ref().and_then(|b| position(&b.entries, index, suffix));
    if in_inode.is_none() && in_block.is_none() {
        return Err(FsError::NoData);
    }
    let removed: Vec<ValueInode> = [
        in_inode.map(|at| &inode[at]),
        in_block.and_then(|at| block.as_ref().map(|b| &b.entries[at])),
    ]
    .into_iter()
    .flatten()
    .filter_map(|e| e.value_inode)
    .collect();
    // A name in both places (which the kernel would not write) is removed from both.
    let area = match in_inode {
        Some(at) => Some(inode_without(&inode, at, inode_area.len())?),
        None => None,
    };
    if let (Some(block), Some(at)) = (&block, in_block) {
        let mut remaining = block.entries.clone();
        remaining.remove(at);
        update_block(io, ctx, file_acl, Some(block), remaining)?;
    }
    if let Some(area) = area {
        inode_area.copy_from_slice(&area);
    }
    release_values(io, ctx, &removed)
}

/// Drops the inode's reference to its xattr block, for inode deletion: a shared block goes back
/// with refcount - 1, an unshared one is freed (and the value inodes its entries name are
/// released). `file_acl` becomes 0.
pub fn release_block(io: &mut dyn MetaIo, ctx: &XattrCtx, file_acl: &mut u64) -> Result<()> {
    if let Some(block) = read_block(io, ctx, *file_acl)? {
        if block.refcount == 1 {
            let values: Vec<ValueInode> =
                block.entries.iter().filter_map(|e| e.value_inode).collect();
            release_values(io, ctx, &values)?;
        }
        release(io, ctx, &block)?;
    }
    *file_acl = 0;
    Ok(())
}

/// A validated xattr block as read.
#[derive(Debug)]
struct XattrBlock {
    nr: u64,
    refcount: u32,
    entries: Vec<XattrEntry>,
    /// The block's bytes, for refcount-only updates that keep everything else as it is.
    raw: Vec<u8>,
}

/// Reads and validates block `file_acl`; `None` when it is 0 (no block).
fn read_block(io: &mut dyn MetaIo, ctx: &XattrCtx, file_acl: u64) -> Result<Option<XattrBlock>> {
    if file_acl == 0 {
        return Ok(None);
    }
    let blocks_count = io.blocks_count();
    if file_acl >= blocks_count {
        return Err(FsError::corrupted(
            file_acl,
            format!("xattr block lies outside the file system ({blocks_count} blocks)"),
        ));
    }
    let raw = io.read_meta(file_acl)?;
    if let Some(seed) = ctx.fs_csum_seed {
        if !codec::xattr_block_checksum_ok(seed, file_acl, &raw) {
            return Err(FsError::corrupted(file_acl, "xattr block: checksum mismatch"));
        }
    }
    let (header, entries) = parse_xattr_block(&raw).map_err(FsError::at_block(file_acl))?;
    if header.refcount == 0 {
        return Err(FsError::corrupted(file_acl, "xattr block: refcount 0 but referenced"));
    }
    if let Some(e) = entries.iter().find_map(|e| e.value_inode).filter(|_| !ctx.ea_inode) {
        let why = format!("xattr block: a value in inode {} without the ea_inode feature", e.ino);
        return Err(FsError::corrupted(file_acl, why));
    }
    Ok(Some(XattrBlock { nr: file_acl, refcount: header.refcount, entries, raw }))
}

/// Replaces the inode's block entries by `entries`: written in place when the block is the
/// inode's alone, into a new block when it is shared or there is none, and the block released
/// when `entries` is empty. Updates `file_acl` last.
fn update_block(
    io: &mut dyn MetaIo,
    ctx: &XattrCtx,
    file_acl: &mut u64,
    old: Option<&XattrBlock>,
    entries: Vec<XattrEntry>,
) -> Result<()> {
    assert_eq!(old.map_or(0, |b| b.nr), *file_acl, "update_block on another inode's block");
    if entries.is_empty() {
        if let Some(old) = old {
            release(io, ctx, old)?;
        }
        *file_acl = 0;
        return Ok(());
    }
    let mut image = encode_xattr_block(&entries, 1, io.block_size()).ok_or(FsError::NoSpace)?;
    if let Some(old) = old.filter(|b| b.refcount == 1) {
        seal(ctx, old.nr, &mut image);
        return io.write_meta(old.nr, &image);
    }
    let nr = io.alloc_meta_block(ctx.goal)?;
    assert!(nr != 0 && nr < io.blocks_count(), "allocator handed out block {nr}");
    seal(ctx, nr, &mut image);
    if let Err(err) = io.write_meta(nr, &image) {
        // Best effort: the handle is aborting anyway, but do not leak the block if it is not.
        let _ = io.free_meta_block(nr);
        return Err(err);
    }
    if let Some(old) = old {
        release(io, ctx, old)?;
    }
    *file_acl = nr;
    Ok(())
}

/// Drops one reference to `block`: refcount - 1 written back (entries untouched), or the block
/// freed when this was the last reference.
fn release(io: &mut dyn MetaIo, ctx: &XattrCtx, block: &XattrBlock) -> Result<()> {
    assert!(block.refcount >= 1, "read_block lets no unreferenced block through");
    if block.refcount == 1 {
        return io.free_meta_block(block.nr);
    }
    let mut raw = block.raw.clone();
    codec::set_xattr_block_refcount(&mut raw, block.refcount - 1);
    seal(ctx, block.nr, &mut raw);
    io.write_meta(block.nr, &raw)
}

fn seal(ctx: &XattrCtx, nr: u64, image: &mut [u8]) {
    if let Some(seed) = ctx.fs_csum_seed {
        codec::set_xattr_block_checksum(seed, nr, image);
    }
}

/// The in-inode area without entry `at`. Fewer entries always fit an area that held them in our
/// own packing; an area laid out by someone else that does not repack is refused as corrupt.
fn inode_without(inode: &[XattrEntry], at: usize, area_len: usize) -> Result<Vec<u8>> {
    let mut remaining = inode.to_vec();
    remaining.remove(at);
    encode_inode_xattrs(&remaining, area_len).ok_or_else(|| {
        FsError::OnDisk(ondisk::OnDiskError::corrupted(
            "in-inode xattrs",
            format!("{} entries do not repack into {area_len} bytes", remaining.len()),
        ))
    })
}

/// Replaces entry `at` by `entry`, or appends it (the kernel appends in-inode entries; block
/// entries are sorted by the encoder).
fn upsert(entries: &mut Vec<XattrEntry>, at: Option<usize>, entry: XattrEntry) {
    match at {
        Some(at) => entries[at] = entry,
        None => entries.push(entry),
    }
}

fn position(entries: &[XattrEntry], index: u8, suffix: &[u8]) -> Option<usize> {
    entries.iter().position(|e| e.name_index == index && e.name == suffix)
}

/// Splits and checks a full name as setxattr(2) would see it.
fn resolve_name(name: &[u8]) -> Result<(u8, &[u8])> {
    let (index, suffix) = codec::split_name(name).ok_or_else(|| {
        FsError::NotSupported(format!(
            "extended attribute namespace of {:?}",
            String::from_utf8_lossy(name)
        ))
    })?;
    if suffix.len() > XATTR_NAME_LEN_MAX {
        return Err(FsError::Range);
    }
    if suffix.is_empty() && !codec::name_index_is_whole_name(index) {
        return Err(FsError::Invalid("extended attribute name without a suffix".into()));
    }
    if suffix.contains(&0) {
        return Err(FsError::Invalid("extended attribute name holds a NUL byte".into()));
    }
    Ok((index, suffix))
}

/// `system.data` holds inline file data (inline_data feature); only the data path may touch it.
fn refuse_inline_data(index: u8, suffix: &[u8]) -> Result<()> {
    if index == XATTR_INDEX_SYSTEM && suffix == b"data" {
        return Err(FsError::NotSupported("system.data belongs to inline data".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta_io::mem::MemMetaIo;
    use ondisk::testing::Rng;
    use std::collections::BTreeMap;

    const SEED: u32 = 0x5EED_C5C5;
    const BLOCKS: u64 = 64;

    /// One inode's xattr state plus the device it lives on.
    struct Inode {
        io: MemMetaIo,
        ctx: XattrCtx,
        area: Vec<u8>,
        file_acl: u64,
    }

    impl Inode {
        fn new(area_len: usize, block_size: usize, checksums: bool) -> Inode {
            Inode {
                io: MemMetaIo::new(block_size, BLOCKS),
                ctx: XattrCtx {
                    fs_csum_seed: checksums.then_some(SEED),
                    goal: 10,
                    ea_inode: false,
                    owner: (12, 0, 0),
                    owner_mode: 0o100644,
                },
                area: vec![0; area_len],
                file_acl: 0,
            }
        }
        fn get(&mut self, name: &[u8]) -> Result<Vec<u8>> {
            match get(&mut self.io, &self.ctx, &self.area, self.file_acl, name)? {
                Stored::Here(value) => Ok(value),
                Stored::InInode(v) => panic!("a value in inode {} in a unit test", v.ino),
            }
        }
        fn list(&mut self) -> Result<Vec<Vec<u8>>> {
            list(&mut self.io, &self.ctx, &self.area, self.file_acl)
        }
        fn set(&mut self, name: &[u8], value: &[u8], mode: SetMode) -> Result<()> {
            set(&mut self.io, &self.ctx, &mut self.area, &mut self.file_acl, name, value, mode)
        }
        fn remove(&mut self, name: &[u8]) -> Result<()> {
            remove(&mut self.io, &self.ctx, &mut self.area, &mut self.file_acl, name)
        }
        fn block(&self) -> (codec::XattrBlockHeader, Vec<XattrEntry>) {
            parse_xattr_block(&self.io.blocks[&self.file_acl]).unwrap()
        }
        /// Turns the inode's block into one shared by `refcount` inodes.
        fn share_block(&mut self, refcount: u32) {
            let nr = self.file_acl;
            let mut raw = self.io.blocks[&nr].clone();
            codec::set_xattr_block_refcount(&mut raw, refcount);
            seal(&self.ctx, nr, &mut raw);
            self.io.blocks.insert(nr, raw);
        }
        /// Another inode (empty in-inode area) pointing at the same block, on the same device.
        fn sibling(&self) -> (Vec<u8>, u64) {
            (vec![0; self.area.len()], self.file_acl)
        }
    }

    /// What an inode's xattrs must look like whatever happened: a valid in-inode area, a valid
    /// unshared non-empty block (or none) that is the only allocated block, no name stored twice,
    /// and contents equal to `model`.
    fn check_against_model(inode: &mut Inode, model: &BTreeMap<Vec<u8>, Vec<u8>>) {
        let in_inode = parse_inode_xattrs(&inode.area).unwrap();
        let mut names: Vec<Vec<u8>> =
            in_inode.iter().map(|e| codec::full_name(e.name_index, &e.name)).collect();
        if inode.file_acl == 0 {
            assert!(inode.io.allocated.is_empty(), "leaked blocks {:?}", inode.io.allocated);
        } else {
            let raw = &inode.io.blocks[&inode.file_acl];
            if let Some(seed) = inode.ctx.fs_csum_seed {
                assert!(codec::xattr_block_checksum_ok(seed, inode.file_acl, raw));
            }
            assert!(codec::xattr_block_hashes_ok(raw));
            let (header, entries) = inode.block();
            assert_eq!(header.refcount, 1);
            assert!(!entries.is_empty(), "empty xattr block left behind");
            assert_eq!(inode.io.allocated.iter().copied().collect::<Vec<_>>(), [inode.file_acl]);
            names.extend(entries.iter().map(|e| codec::full_name(e.name_index, &e.name)));
        }
        let mut listed = inode.list().unwrap();
        listed.sort();
        names.sort();
        assert_eq!(listed, names);
        assert_eq!(listed, model.keys().cloned().collect::<Vec<_>>(), "names stored twice?");
        for (name, value) in model {
            assert_eq!(&inode.get(name).unwrap(), value);
        }
    }

    fn random_name(rng: &mut Rng) -> Vec<u8> {
        const PREFIXES: [&[u8]; 3] = [b"user.", b"trusted.", b"security."];
        const SUFFIX_LENS: [usize; 8] = [1, 2, 4, 7, 13, 40, 120, 255];
        if rng.below(16) == 0 {
            return b"system.posix_acl_access".to_vec();
        }
        let mut name = PREFIXES[rng.below(3) as usize].to_vec();
        let len = SUFFIX_LENS[rng.below(8) as usize];
        // Few distinct suffixes per length, so that names repeat.
        let letter = b'a' + rng.below(3) as u8;
        name.extend(std::iter::repeat_n(letter, len));
        name
    }

    fn random_value(rng: &mut Rng, block_size: usize) -> Vec<u8> {
        let len = match rng.below(8) {
            0 => 0,
            1..=3 => rng.below(24) as usize,
            4 | 5 => rng.below(200) as usize,
            6 => rng.below(block_size as u64) as usize,
            _ => block_size - 40 - rng.below(64) as usize,
        };
        rng.bytes(len)
    }

    /// Whether the kernel's policy leaves no place for `name = value`: it fits neither the inode
    /// area nor the block, each with its other entries as they are.
    fn no_room(inode: &Inode, name: &[u8], value: &[u8]) -> bool {
        let (index, suffix) = codec::split_name(name).unwrap();
        let entry = XattrEntry::new(index, suffix, value);
        let mut in_inode = parse_inode_xattrs(&inode.area).unwrap();
        in_inode.retain(|e| (e.name_index, &e.name[..]) != (index, suffix));
        in_inode.push(entry.clone());
        let mut in_block = if inode.file_acl == 0 { Vec::new() } else { inode.block().1 };
        in_block.retain(|e| (e.name_index, &e.name[..]) != (index, suffix));
        in_block.push(entry);
        encode_inode_xattrs(&in_inode, inode.area.len()).is_none()
            && encode_xattr_block(&in_block, 1, inode.io.block_size).is_none()
    }

    fn run_model(rng: &mut Rng, area_len: usize, block_size: usize, checksums: bool) {
        let mut inode = Inode::new(area_len, block_size, checksums);
        let mut model = BTreeMap::new();
        for step in 0..250 {
            let name = random_name(rng);
            let what = format!("step {step}: area {area_len}, block {block_size}");
            match rng.below(4) {
                0 | 1 => {
                    let value = random_value(rng, block_size);
                    let mode =
                        [SetMode::Any, SetMode::Create, SetMode::Replace][rng.below(3) as usize];
                    let before = (inode.area.clone(), inode.file_acl, inode.io.blocks.clone());
                    let present = model.contains_key(&name);
                    match inode.set(&name, &value, mode) {
                        Ok(()) => {
                            assert!(mode != SetMode::Create || !present, "{what}");
                            assert!(mode != SetMode::Replace || present, "{what}");
                            model.insert(name, value);
                        }
                        Err(FsError::Exists) => assert!(mode == SetMode::Create && present),
                        Err(FsError::NoData) => assert!(mode == SetMode::Replace && !present),
                        Err(FsError::NoSpace) => {
                            let after =
                                (inode.area.clone(), inode.file_acl, inode.io.blocks.clone());
                            assert!(before == after, "{what}: NoSpace changed the inode");
                            assert!(no_room(&inode, &name, &value), "{what}: spurious NoSpace");
                        }
                        Err(other) => panic!("{what}: set failed: {other}"),
                    }
                }
                2 => match inode.remove(&name) {
                    Ok(()) => assert!(model.remove(&name).is_some(), "{what}"),
                    Err(FsError::NoData) => assert!(!model.contains_key(&name), "{what}"),
                    Err(other) => panic!("{what}: remove failed: {other}"),
                },
                _ => match inode.get(&name) {
                    Ok(value) => assert_eq!(Some(&value), model.get(&name), "{what}"),
                    Err(FsError::NoData) => assert!(!model.contains_key(&name), "{what}"),
                    Err(other) => panic!("{what}: get failed: {other}"),
                },
            }
            check_against_model(&mut inode, &model);
        }
        // Deleting the inode frees its block.
        let block = inode.file_acl;
        release_block(&mut inode.io, &inode.ctx, &mut inode.file_acl).unwrap();
        assert_eq!(inode.file_acl, 0);
        assert!(inode.io.allocated.is_empty());
        assert!(block == 0 || inode.io.meta_freed.contains(&block));
    }

    #[test]
    fn random_operations_agree_with_a_map_for_every_inode_and_block_size() {
        let mut rng = Rng::from_env("xattr");
        for area_len in [0, 32, 96, 384] {
            for block_size in [1024, 4096] {
                for checksums in [false, true] {
                    run_model(&mut rng, area_len, block_size, checksums);
                }
            }
        }
    }

    #[test]
    fn small_values_stay_in_the_inode_and_large_ones_move_to_the_block_and_back() {
        let mut inode = Inode::new(96, 1024, true);
        inode.set(b"user.k", b"small", SetMode::Any).unwrap();
        assert_eq!(inode.file_acl, 0);
        assert_eq!(parse_inode_xattrs(&inode.area).unwrap().len(), 1);
        inode.set(b"user.k", &[9; 500], SetMode::Replace).unwrap();
        assert_ne!(inode.file_acl, 0);
        assert!(parse_inode_xattrs(&inode.area).unwrap().is_empty());
        assert_eq!(inode.block().1.len(), 1);
        let block = inode.file_acl;
        inode.set(b"user.k", b"small again", SetMode::Any).unwrap();
        assert_eq!(inode.file_acl, 0, "the emptied block is released");
        assert_eq!(inode.io.meta_freed, [block]);
        assert_eq!(inode.get(b"user.k").unwrap(), b"small again");
    }

    #[test]
    fn create_and_replace_modes_and_missing_names_fail_as_setxattr_does() {
        let mut inode = Inode::new(96, 1024, false);
        assert!(matches!(inode.set(b"user.a", b"1", SetMode::Replace), Err(FsError::NoData)));
        inode.set(b"user.a", b"1", SetMode::Create).unwrap();
        assert!(matches!(inode.set(b"user.a", b"2", SetMode::Create), Err(FsError::Exists)));
        inode.set(b"user.a", b"2", SetMode::Replace).unwrap();
        assert_eq!(inode.get(b"user.a").unwrap(), b"2");
        assert!(matches!(inode.get(b"user.b"), Err(FsError::NoData)));
        assert!(matches!(inode.remove(b"user.b"), Err(FsError::NoData)));
        inode.remove(b"user.a").unwrap();
        assert!(matches!(inode.remove(b"user.a"), Err(FsError::NoData)));
        assert_eq!(inode.area, vec![0; 96]);
    }

    #[test]
    fn bad_names_and_oversized_values_are_refused() {
        let mut inode = Inode::new(96, 1024, false);
        let long = [b"user.".as_slice(), &[b'x'; 256]].concat();
        assert!(matches!(inode.set(&long, b"v", SetMode::Any), Err(FsError::Range)));
        assert!(matches!(inode.get(&long), Err(FsError::Range)));
        let longest = [b"user.".as_slice(), &[b'x'; 255]].concat();
        inode.set(&longest, b"v", SetMode::Any).unwrap();
        assert!(matches!(inode.set(b"gnu.x", b"v", SetMode::Any), Err(FsError::NotSupported(_))));
        assert!(matches!(inode.get(b"nonsense"), Err(FsError::NotSupported(_))));
        assert!(matches!(inode.set(b"user.", b"v", SetMode::Any), Err(FsError::Invalid(_))));
        assert!(matches!(inode.set(b"user.a\0b", b"v", SetMode::Any), Err(FsError::Invalid(_))));
        assert!(matches!(
            inode.set(b"system.data", b"v", SetMode::Any),
            Err(FsError::NotSupported(_))
        ));
        inode.set(b"system.posix_acl_access", &[2, 0, 0, 0], SetMode::Any).unwrap();
        let mut names = inode.list().unwrap();
        names.sort();
        assert_eq!(names, [b"system.posix_acl_access".to_vec(), longest]);
        // 1024 - 32 header - 20 entry - 4 terminator = 968 bytes at most in an empty block.
        let mut empty = Inode::new(96, 1024, false);
        assert!(matches!(empty.set(b"user.b", &[1; 969], SetMode::Any), Err(FsError::NoSpace)));
        empty.set(b"user.b", &[1; 968], SetMode::Any).unwrap();
        assert_eq!(empty.get(b"user.b").unwrap(), [1; 968]);
    }

    #[test]
    fn changing_a_shared_block_copies_it_and_leaves_the_other_inodes_alone() {
        let mut a = Inode::new(0, 1024, true);
        a.set(b"user.a", b"alpha", SetMode::Any).unwrap();
        a.set(b"user.b", b"beta", SetMode::Any).unwrap();
        let shared = a.file_acl;
        a.share_block(2);
        let (mut b_area, mut b_acl) = a.sibling();
        set(&mut a.io, &a.ctx, &mut b_area, &mut b_acl, b"user.c", b"gamma", SetMode::Any).unwrap();
        assert_ne!(b_acl, shared, "a shared block is never changed in place");
        let (header, entries) = parse_xattr_block(&a.io.blocks[&b_acl]).unwrap();
        assert_eq!(header.refcount, 1);
        assert_eq!(entries.len(), 3);
        assert!(codec::xattr_block_checksum_ok(SEED, b_acl, &a.io.blocks[&b_acl]));
        let (header, entries) = a.block();
        assert_eq!(header.refcount, 1, "the old block lost one reference");
        assert_eq!(entries.len(), 2);
        assert!(codec::xattr_block_checksum_ok(SEED, shared, &a.io.blocks[&shared]));
        assert!(matches!(a.get(b"user.c"), Err(FsError::NoData)));

        // Removing from a shared block copies too; removing its last entry just lets go.
        a.share_block(2);
        let (mut c_area, mut c_acl) = a.sibling();
        remove(&mut a.io, &a.ctx, &mut c_area, &mut c_acl, b"user.a").unwrap();
        assert!(c_acl != shared && c_acl != b_acl);
        assert_eq!(a.block().0.refcount, 1);
        assert_eq!(a.get(b"user.a").unwrap(), b"alpha");
        remove(&mut a.io, &a.ctx, &mut c_area, &mut c_acl, b"user.b").unwrap();
        assert_eq!(c_acl, 0);

        a.share_block(3);
        let (_, mut d_acl) = a.sibling();
        release_block(&mut a.io, &a.ctx, &mut d_acl).unwrap();
        assert_eq!((d_acl, a.block().0.refcount), (0, 2));
        let (mut e_area, mut e_acl) = a.sibling();
        remove(&mut a.io, &a.ctx, &mut e_area, &mut e_acl, b"user.a").unwrap();
        remove(&mut a.io, &a.ctx, &mut e_area, &mut e_acl, b"user.b").unwrap();
        assert_eq!(e_acl, 0);
        assert_eq!(a.block().0.refcount, 1);
        assert!(!a.io.meta_freed.contains(&shared));
        release_block(&mut a.io, &a.ctx, &mut a.file_acl).unwrap();
        assert!(a.io.meta_freed.contains(&shared));
        let freed_copies = [b_acl];
        assert!(a.io.allocated.iter().eq(freed_copies.iter()), "only b's copy is left");
    }

    #[test]
    fn corrupt_or_misplaced_blocks_are_reported_with_their_block_number() {
        let mut inode = Inode::new(0, 1024, true);
        inode.set(b"user.a", b"alpha", SetMode::Any).unwrap();
        let nr = inode.file_acl;
        inode.io.blocks.get_mut(&nr).unwrap()[1000] ^= 1;
        let err = inode.get(b"user.a").unwrap_err();
        assert!(matches!(err, FsError::Corrupted { block, .. } if block == nr), "{err}");
        inode.io.blocks.get_mut(&nr).unwrap()[1000] ^= 1;
        inode.share_block(0);
        assert!(matches!(inode.list(), Err(FsError::Corrupted { block, .. }) if block == nr));
        inode.file_acl = BLOCKS;
        assert!(matches!(inode.list(), Err(FsError::Corrupted { block: BLOCKS, .. })));
        let mut acl = BLOCKS + 5;
        assert!(release_block(&mut inode.io, &inode.ctx, &mut acl).is_err());
        // Without metadata_csum a bad magic is still caught.
        let mut plain = Inode::new(0, 1024, false);
        plain.set(b"user.a", b"alpha", SetMode::Any).unwrap();
        plain.io.blocks.get_mut(&plain.file_acl).unwrap()[0] ^= 1;
        assert!(matches!(plain.get(b"user.a"), Err(FsError::Corrupted { .. })));
    }

    #[test]
    fn allocation_failure_leaves_the_inode_unchanged() {
        let mut inode = Inode::new(32, 1024, false);
        inode.io.first_free = BLOCKS; // nothing left to allocate
        inode.set(b"user.a", b"fits", SetMode::Any).unwrap();
        let area = inode.area.clone();
        assert!(matches!(inode.set(b"user.big", &[1; 300], SetMode::Any), Err(FsError::NoSpace)));
        assert_eq!((inode.area.clone(), inode.file_acl), (area, 0));
        assert!(matches!(inode.set(b"user.a", &[1; 300], SetMode::Any), Err(FsError::NoSpace)));
        assert_eq!(inode.get(b"user.a").unwrap(), b"fits");
    }

    /// Runs every operation on an inode whose area and block hold `area` and `block`; anything
    /// but a panic is fine, and whatever succeeds must leave valid structures behind.
    fn exercise_hostile(area: Vec<u8>, block: Option<Vec<u8>>, ctx: XattrCtx, rng: &mut Rng) {
        let block_size = 1024;
        let mut io = MemMetaIo::new(block_size, BLOCKS);
        let mut file_acl = 0;
        if let Some(mut raw) = block {
            file_acl = 7;
            raw.resize(block_size, 0);
            if let Some(seed) = ctx.fs_csum_seed {
                codec::set_xattr_block_checksum(seed, file_acl, &mut raw);
            }
            io.mark_allocated(file_acl, 1);
            io.blocks.insert(file_acl, raw);
        }
        let names: [&[u8]; 4] = [b"user.a", b"user.mid", b"security.selinux", b"trusted.x"];
        let _ = get(&mut io, &ctx, &area, file_acl, names[rng.below(4) as usize]);
        let _ = list(&mut io, &ctx, &area, file_acl);
        let mut area = area;
        let name = names[rng.below(4) as usize];
        let value_len = rng.below(300) as usize;
        let value = rng.bytes(value_len);
        let op = rng.below(3);
        let outcome = match op {
            0 => set(&mut io, &ctx, &mut area, &mut file_acl, name, &value, SetMode::Any),
            1 => remove(&mut io, &ctx, &mut area, &mut file_acl, name),
            _ => release_block(&mut io, &ctx, &mut file_acl),
        };
        if outcome.is_ok() {
            if op != 2 {
                parse_inode_xattrs(&area).unwrap();
            }
            if file_acl != 0 {
                parse_xattr_block(&io.blocks[&file_acl]).unwrap();
            }
        }
    }

    #[test]
    fn random_and_mutated_areas_and_blocks_never_panic() {
        let mut rng = Rng::from_env("xattr");
        let entries = vec![
            XattrEntry::new(1, b"a", b"alpha"),
            XattrEntry::new(1, b"mid", &[3; 40]),
            XattrEntry::new(6, b"selinux", b"ctx\0"),
        ];
        let valid_area = encode_inode_xattrs(&entries[..2], 96).unwrap();
        let valid_block = encode_xattr_block(&entries, 1, 1024).unwrap();
        for round in 0..3000 {
            let ctx = XattrCtx {
                fs_csum_seed: (round % 2 == 0).then_some(SEED),
                goal: 0,
                ea_inode: false,
                owner: (12, 0, 0),
                owner_mode: 0o100644,
            };
            let (mut area, mut block) = if round % 3 == 0 {
                let area_len = rng.below(200) as usize;
                let mut area = rng.bytes(area_len);
                if area.len() >= 4 {
                    area[..4].copy_from_slice(&codec::XATTR_MAGIC.to_le_bytes());
                }
                let mut block = rng.bytes(1024);
                block[..4].copy_from_slice(&codec::XATTR_MAGIC.to_le_bytes());
                block[8..12].copy_from_slice(&1u32.to_le_bytes());
                (area, block)
            } else {
                (valid_area.clone(), valid_block.clone())
            };
            for _ in 0..=rng.below(4) {
                let target = if rng.below(2) == 0 { &mut area } else { &mut block };
                if !target.is_empty() {
                    let at = rng.below(target.len() as u64) as usize;
                    target[at] = [0, 0xFF, rng.next() as u8][rng.below(3) as usize];
                }
            }
            let block = (rng.below(4) != 0).then_some(block);
            exercise_hostile(area, block, ctx, &mut rng);
        }
    }
}
