//! Extended-attribute values kept in inodes of their own (the ea_inode feature), read side.
//!
//! An xattr entry with `e_value_inum` names a regular inode flagged `EA_INODE_FL` whose data is
//! the value (`fs/ext4/xattr.c`, `ext4_xattr_inode_get`). The kernel keeps, in that inode:
//!
//! | field            | holds                                                            |
//! |------------------|------------------------------------------------------------------|
//! | `i_atime` (sec)  | the value's hash: crc32c seeded with the file system's checksum seed |
//! | `i_ctime` (sec), `l_i_version` | the reference count, high and low 32 bits (entries naming it; the kernel shares one inode among equal values) |
//! | `i_size`         | the value's length, which the entry's `e_value_size` repeats      |
//!
//! and the entry's `e_hash` is the entry hash of its name over that value hash (one word).
//! Reading checks what the kernel's `ext4_xattr_inode_iget` and
//! `ext4_xattr_inode_verify_hashes` check: a real, non-reserved inode with the flag, the size,
//! the value's hash and the entry's. Any mismatch is corruption.
//!
//! Writing (`ValueInodes for Txn`): a value goes to an inode of its own as the kernel's
//! `ext4_xattr_set_entry` puts it there (`xattr.rs` decides when), one inode per entry with
//! one reference (the kernel may share one among equal values, found by hash; quill reads
//! and counts shared ones, and makes none); a replaced or removed entry's inode loses a
//! reference and is freed with its last. The inode is made as `ext4_xattr_inode_create` makes
//! it: regular, 0600, the owner's uid and gid, EA_INODE_FL (and extents where the file system
//! has them), one link, no name.

use ondisk::ext4::xattr::{
    split_name, xattr_entry_hash, xattr_entry_hash_signed, ValueInode, XATTR_VALUE_INODE_SIZE_MAX,
};
use ondisk::ext4::{self, Timestamp, EA_INODE_FL};

use crate::adapters::{extent_ctx, ReadIo};
use crate::block_map;
use crate::clusters;
use crate::error::{FsError, Result};
use crate::extent_tree::Lookup;
use crate::filesystem::{Filesystem, Txn};
use crate::inodes::InodeData;
use crate::meta_io::MetaIo;
use crate::ops::add_blocks;
use crate::xattr::{ValueInodes, XattrCtx};

/// `i_atime`'s seconds in an inode record: the value's hash.
const I_ATIME: usize = 0x08;

impl Filesystem {
    /// The value of attribute `name` (full name) of inode `owner`, kept in the inode
    /// `reference` names.
    pub(crate) fn read_value_inode(
        &self,
        owner: u32,
        name: &[u8],
        reference: ValueInode,
    ) -> Result<Vec<u8>> {
        let entry_hash = reference.entry_hash;
        let value_inode = self.load_value_inode(owner, &reference)?;
        let bad = |why: String| self.bad_value_inode(owner, reference.ino, why);
        let ino = reference.ino;
        let value = self.value_inode_bytes(ino, &value_inode)?;
        let hash = ondisk::crc::crc32c_raw(self.params.csum_seed(), &value);
        let stored = u32::from_le_bytes(value_inode.raw[I_ATIME..I_ATIME + 4].try_into().unwrap());
        if hash != stored {
            return Err(bad(format!("value hash {hash:#x}, the inode says {stored:#x}")));
        }
        let suffix = split_name(name).map_or(name, |(_, suffix)| suffix);
        let word = hash.to_le_bytes();
        if entry_hash != xattr_entry_hash(suffix, &word)
            && entry_hash != xattr_entry_hash_signed(suffix, &word)
        {
            return Err(bad(format!("entry hash {entry_hash:#x} does not match the value")));
        }
        Ok(value)
    }

    /// Value inode `reference.ino` of `owner`'s attribute, as read and checked as
    /// `ext4_xattr_inode_iget` checks it: a real inode other than the owner and the reserved
    /// ones, regular, EA_INODE_FL, linked, of the entry's size. Releasing one trusts no more
    /// than reading it: a hostile reference must not free the owner or a stranger.
    fn load_value_inode(&self, owner: u32, reference: &ValueInode) -> Result<InodeData> {
        let ino = reference.ino;
        let bad = |why: String| self.bad_value_inode(owner, ino, why);
        if ino < self.params.first_ino || ino > self.groups.geo.inodes_count || ino == owner {
            return Err(bad("not an inode a value may live in".into()));
        }
        let value_inode = self.load_inode(ino)?;
        let inode = &value_inode.inode;
        if inode.flags & EA_INODE_FL == 0 || !inode.is_regular() || inode.links_count == 0 {
            return Err(bad(format!(
                "not a value inode (flags {:#x}, mode {:#o}, {} links)",
                inode.flags, inode.mode, inode.links_count
            )));
        }
        if inode.size != u64::from(reference.size) {
            return Err(bad(format!("{} bytes, the entry says {}", inode.size, reference.size)));
        }
        Ok(value_inode)
    }

    fn bad_value_inode(&self, owner: u32, ino: u32, why: String) -> FsError {
        let block = self.inode_table_location(owner).map_or(0, |(block, _)| block);
        FsError::corrupted(block, format!("inode {owner}: xattr value in inode {ino}: {why}"))
    }

    /// The data of value inode `ino` (`data`), i_size bytes: holes and unwritten blocks read
    /// as zeros.
    fn value_inode_bytes(&self, ino: u32, data: &InodeData) -> Result<Vec<u8>> {
        let size = data.inode.size as usize;
        let mut out = vec![0u8; size];
        if size == 0 || data.inode.has_inline_data() {
            return Ok(out);
        }
        let bs = self.block_size() as usize;
        let last = ((size - 1) / bs) as u32;
        let ectx = extent_ctx(self, ino, data);
        let runs = block_map::mapping(&mut ReadIo { fs: self }, &ectx, &data.inode, 0, last)?;
        for (_, run) in &runs {
            if let Lookup::Mapped { pblk, len, .. } = run {
                self.check_data_blocks(*pblk, u64::from(*len))?;
            }
        }
        // The blocks are journaled (`ValueInodes for Txn`): read through the journal's cache,
        // which has them before they are checkpointed home.
        let io = &mut ReadIo { fs: self };
        for (first, run) in runs {
            if let Lookup::Mapped { pblk, len, unwritten: false } = run {
                for i in 0..len as usize {
                    let start = (first as usize + i) * bs;
                    if start >= size {
                        break;
                    }
                    let end = (start + bs).min(size);
                    let block = io.read_meta(pblk + i as u64)?;
                    out[start..end].copy_from_slice(&block[..end - start]);
                }
            }
        }
        Ok(out)
    }
}

/// Value inodes are made and freed in a file-system transaction, as the kernel's
/// `ext4_xattr_inode_create` and `ext4_xattr_inode_dec_ref` do in the handle that changes the
/// attribute: the value's blocks are journaled (written through the log, as xattr blocks are),
/// so the inode, its data and the entry naming it commit together.
impl ValueInodes for Txn<'_> {
    fn create_value_inode(
        &mut self,
        ctx: &XattrCtx,
        suffix: &[u8],
        value: &[u8],
    ) -> Result<ValueInode> {
        let fs = self.fs;
        let (owner, uid, gid) = ctx.owner;
        if ctx.owner_mode & ext4::MODE_TYPE_MASK == ext4::MODE_SYMLINK {
            // The charge in i_blocks would make a fast symlink look slow to the kernel
            // (ext4_inode_is_fast_symlink) and e2fsck (ext2fs_inode_has_valid_blocks2),
            // which would read its target as block numbers: no room, as without ea_inode.
            return Err(FsError::NoSpace);
        }
        let size = u32::try_from(value.len())
            .ok()
            .filter(|&size| size <= XATTR_VALUE_INODE_SIZE_MAX)
            .ok_or(FsError::Range)?;
        let group = fs.groups.geo.group_of_inode(owner);
        let ino = fs.groups.alloc_inode(&fs.journal, &mut self.handle, group, false)?;
        let (mut inode, raw) = fs.new_inode_record(ext4::MODE_REGULAR | 0o600, (uid, gid));
        let hash = ondisk::crc::crc32c_raw(fs.params.csum_seed(), value);
        inode.flags |= EA_INODE_FL;
        inode.size = u64::from(size);
        // ext4_xattr_inode_set_hash: the hash in i_atime's seconds; the reference count's high
        // half in i_ctime's (0), its low half in l_i_version.
        inode.atime = Timestamp { sec: i64::from(hash), nsec: 0 };
        inode.ctime = Timestamp::default();
        let mut data = InodeData::new(inode, raw, false);
        set_ref_count(&mut data, 1);
        // The owner's operation counts its own blocks: keep the value inode's apart.
        let owner_delta = self.take_blocks_delta();
        let written = (|| -> Result<()> {
            let bs = fs.block_size() as usize;
            let mut ectx = extent_ctx(fs, ino, &data);
            for (lblk, chunk) in value.chunks(bs).enumerate() {
                let pblk = clusters::alloc_block(self, &ectx, &data.inode, lblk as u32, ectx.goal)?;
                let mut block = vec![0u8; bs];
                block[..chunk.len()].copy_from_slice(chunk);
                self.write_meta(pblk, &block)?;
                ectx.goal = pblk + 1;
                block_map::insert(self, &ectx, &mut data.inode, lblk as u32, pblk, 1, false)?;
            }
            Ok(())
        })();
        let delta = self.take_blocks_delta();
        self.blocks_delta = owner_delta;
        if let Err(err) = written {
            // Nothing names it yet: give back what was taken (best effort; an I/O error
            // aborts the handle anyway).
            let _ = self.free_value_inode(ino, &mut data);
            return Err(err);
        }
        add_blocks(&mut data.inode, delta, fs.block_size());
        data.fc.ineligible_next("xattr value inode");
        fs.write_inode(self, ino, &mut data, true)?;
        let entry_hash = xattr_entry_hash(suffix, &hash.to_le_bytes());
        Ok(ValueInode { ino, size, entry_hash })
    }

    fn release_value_inode(&mut self, ctx: &XattrCtx, value: &ValueInode) -> Result<()> {
        let fs = self.fs;
        let _refs = fs.value_inode_refs.lock();
        let mut data = fs.load_value_inode(ctx.owner.0, value)?;
        let count = ref_count(&data);
        if count > 1 {
            set_ref_count(&mut data, count - 1);
            return fs.write_inode(self, value.ino, &mut data, false);
        }
        self.free_value_inode(value.ino, &mut data)
    }
}

impl Txn<'_> {
    /// Frees value inode `ino` (`data`): its blocks (revoked: they were journaled), its
    /// record marked deleted, its number.
    fn free_value_inode(&mut self, ino: u32, data: &mut InodeData) -> Result<()> {
        let fs = self.fs;
        let owner_delta = self.take_blocks_delta();
        let revoke = std::mem::replace(&mut self.revoke_freed_data, true);
        let freed = (|| -> Result<()> {
            let ectx = extent_ctx(fs, ino, data);
            let (runs, map_blocks) = block_map::runs_and_map_blocks(self, &ectx, &data.inode)?;
            clusters::free_runs(self, &runs, &map_blocks)
        })();
        self.revoke_freed_data = revoke;
        self.take_blocks_delta();
        self.blocks_delta = owner_delta;
        freed?;
        let inode = &mut data.inode;
        inode.links_count = 0;
        inode.mode = 0;
        inode.dtime = crate::filesystem::now().sec as u32;
        inode.size = 0;
        inode.blocks_raw = 0;
        inode.block = [0; ext4::INODE_BLOCK_SIZE];
        if fs.has_extents() {
            crate::extent_tree::init_root(&mut inode.block);
        }
        data.fc.ineligible_next("xattr value inode freed");
        fs.write_inode(self, ino, data, true)?;
        fs.groups.free_inode(&fs.journal, &mut self.handle, ino, false)
    }
}

/// `l_i_version`'s offset in an inode record: the reference count's low half.
const L_I_VERSION: usize = 0x24;

/// A value inode's reference count: i_ctime's seconds the high half, l_i_version the low.
fn ref_count(data: &InodeData) -> u64 {
    let low = u32::from_le_bytes(data.raw[L_I_VERSION..L_I_VERSION + 4].try_into().unwrap());
    ((data.inode.ctime.sec as u64 & 0xffff_ffff) << 32) | u64::from(low)
}

fn set_ref_count(data: &mut InodeData, count: u64) {
    data.raw[L_I_VERSION..L_I_VERSION + 4].copy_from_slice(&(count as u32).to_le_bytes());
    data.inode.ctime = Timestamp { sec: (count >> 32) as i64, nsec: 0 };
}
