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
//! quill opens ea_inode file systems read-only (it does not create, share or free such
//! inodes), so nothing here writes.

use ondisk::ext4::xattr::{split_name, xattr_entry_hash, xattr_entry_hash_signed, ValueInode};
use ondisk::ext4::EA_INODE_FL;

use crate::adapters::{extent_ctx, ReadIo};
use crate::block_map;
use crate::error::{FsError, Result};
use crate::extent_tree::Lookup;
use crate::filesystem::Filesystem;
use crate::inodes::InodeData;

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
        let ValueInode { ino, size, entry_hash } = reference;
        let bad = |why: String| {
            let block = self.inode_table_location(owner).map_or(0, |(block, _)| block);
            FsError::corrupted(block, format!("inode {owner}: xattr value in inode {ino}: {why}"))
        };
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
        if inode.size != u64::from(size) {
            return Err(bad(format!("{} bytes, the entry says {size}", inode.size)));
        }
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
        for (first, run) in runs {
            if let Lookup::Mapped { pblk, len, unwritten: false } = run {
                let start = first as usize * bs;
                let end = ((first as usize + len as usize) * bs).min(size);
                if start < end {
                    self.read_data(pblk, 0, &mut out[start..end])?;
                }
            }
        }
        Ok(out)
    }
}
