//! Orphans: inodes with no links that are still open, and inodes part way through a
//! truncate, recorded on disk so a crash cannot leak them. Two on-disk forms, as ext4:
//! - the orphan file (feature orphan_file, the default of newer mkfs.ext4): an inode whose
//!   blocks hold arrays of inode numbers, each block ending in a magic and a checksum; an
//!   orphan takes a free slot and gives it back, so orphans do not contend on one list head;
//! - the classic orphan list, chained from `s_last_orphan` through each orphan's `i_dtime`
//!   (used without the orphan file, and when it is full, as the kernel does).
//!
//! Both live in memory too (`Filesystem::orphans`), guarded by its mutex, which is lock 5 of
//! the order in `filesystem.rs`. An orphan on the list has an `i_dtime` on disk that is always
//! "the next orphan" as the list says: `write_inode` takes the next pointer from the list
//! under the same mutex, and removing an inode from the middle rewrites its predecessor's
//! record in the inode table buffer directly (as `ext4_orphan_del` does), without the
//! predecessor's inode lock.

use std::collections::HashMap;

use crate::adapters::{extent_ctx, ReadIo};
use crate::error::{FsError, Result};
use crate::extent_tree;
use crate::filesystem::{Filesystem, Txn};
use crate::inodes::InodeData;
use ondisk::crc::crc32c_raw;
use ondisk::ext4::{self, feature};

/// `ob_magic` at the end of every orphan file block (EXT4_ORPHAN_BLOCK_MAGIC).
pub(crate) const ORPHAN_BLOCK_MAGIC: u32 = 0x0b10_ca04;
/// The tail of an orphan file block: `ob_magic`, `ob_checksum`.
const ORPHAN_TAIL_SIZE: usize = 8;

/// The orphans, in memory.
#[derive(Debug, Default)]
pub(crate) struct Orphans {
    /// The classic list in order, head first.
    pub list: Vec<u32>,
    /// The orphan file, when the file system has one.
    pub file: Option<OrphanFile>,
}

impl Orphans {
    pub fn contains(&self, ino: u32) -> bool {
        self.list.contains(&ino) || self.file.as_ref().is_some_and(|f| f.slots.contains_key(&ino))
    }
}

/// The orphan file: where its blocks are and which slots are taken.
#[derive(Debug)]
pub(crate) struct OrphanFile {
    ino: u32,
    generation: u32,
    /// Physical block of each of the file's blocks, in order.
    blocks: Vec<u64>,
    /// The slot (block index, entry index) of each inode recorded in the file.
    slots: HashMap<u32, (usize, usize)>,
    /// Taken slots per block.
    used: Vec<usize>,
    per_block: usize,
}

impl OrphanFile {
    /// Reads the orphan file of `fs` (which has the orphan_file feature): its blocks must be
    /// mapped without holes, carry the magic and, with metadata_csum, a valid checksum.
    /// Returns it and the inodes it records.
    fn load(fs: &Filesystem) -> Result<OrphanFile> {
        let ino = fs.params.orphan_file_inum;
        let bad = |why: String| FsError::corrupted(fs.params.superblock_block(), why);
        if ino == 0 {
            return Err(bad("orphan_file feature without an orphan file inode".into()));
        }
        let slot = fs.inodes.slot(ino);
        let guard = fs.lock_inode(&slot)?;
        let data = guard.as_ref().expect("loaded");
        let bs = u64::from(fs.block_size());
        if !data.inode.is_regular()
            || data.inode.flags & ext4::EXTENTS_FL == 0
            || data.inode.size == 0
            || !data.inode.size.is_multiple_of(bs)
        {
            return Err(bad(format!("orphan file inode {ino} is not a regular extent file")));
        }
        let count = data.inode.size / bs;
        let ectx = extent_ctx(fs, ino, data);
        let extents = extent_tree::extents(&mut ReadIo { fs }, &ectx, &data.inode.block)?;
        let mut blocks = Vec::new();
        for extent in &extents {
            if u64::from(extent.logical) != blocks.len() as u64 || extent.unwritten {
                return Err(bad(format!("orphan file inode {ino} has a hole")));
            }
            blocks.extend((0..u64::from(extent.len)).map(|i| extent.start + i));
        }
        if blocks.len() as u64 != count {
            return Err(bad(format!(
                "orphan file inode {ino} maps {} of {count} blocks",
                blocks.len()
            )));
        }
        let per_block = (bs as usize - ORPHAN_TAIL_SIZE) / 4;
        let mut file = OrphanFile {
            ino,
            generation: data.inode.generation,
            used: vec![0; blocks.len()],
            slots: HashMap::new(),
            blocks,
            per_block,
        };
        drop(guard);
        for (index, &block) in file.blocks.clone().iter().enumerate() {
            let buffer = fs.journal.read_buffer(block)?;
            let bytes = buffer.to_vec();
            let tail = bytes.len() - ORPHAN_TAIL_SIZE;
            let magic = u32::from_le_bytes(bytes[tail..tail + 4].try_into().expect("4 bytes"));
            if magic != ORPHAN_BLOCK_MAGIC {
                return Err(FsError::corrupted(block, "orphan file block without its magic"));
            }
            if fs.params.has_metadata_csum() {
                let stored = u32::from_le_bytes(bytes[tail + 4..].try_into().expect("4 bytes"));
                if stored != file.checksum(fs, block, &bytes) {
                    return Err(FsError::corrupted(block, "orphan file block checksum mismatch"));
                }
            }
            for entry in 0..per_block {
                let at = entry * 4;
                let orphan = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
                if orphan == 0 {
                    continue;
                }
                if orphan > fs.params.inodes_count || file.slots.contains_key(&orphan) {
                    return Err(FsError::corrupted(
                        block,
                        format!("orphan file records inode {orphan} wrongly"),
                    ));
                }
                file.slots.insert(orphan, (index, entry));
                file.used[index] += 1;
            }
        }
        Ok(file)
    }

    /// `ob_checksum` of orphan file block `block` (e2fsprogs'
    /// `ext2fs_do_orphan_file_block_csum`): crc32c over the file's inode number and
    /// generation, the block number, and the entries.
    fn checksum(&self, fs: &Filesystem, block: u64, bytes: &[u8]) -> u32 {
        let mut crc = crc32c_raw(fs.params.csum_seed(), &self.ino.to_le_bytes());
        crc = crc32c_raw(crc, &self.generation.to_le_bytes());
        crc = crc32c_raw(crc, &block.to_le_bytes());
        crc32c_raw(crc, &bytes[..self.per_block * 4])
    }

    /// A free slot, starting the search at a block chosen by `ino` (the kernel starts at one
    /// chosen by the CPU) so concurrent orphans spread over the blocks.
    fn free_slot(&self, fs: &Filesystem, ino: u32) -> Result<Option<(usize, usize)>> {
        let n = self.blocks.len();
        for step in 0..n {
            let index = (ino as usize * 13 + step) % n;
            if self.used[index] >= self.per_block {
                continue;
            }
            let buffer = fs.journal.read_buffer(self.blocks[index])?;
            let entry =
                buffer.read(|b| (0..self.per_block).find(|&e| b[e * 4..e * 4 + 4] == [0, 0, 0, 0]));
            if let Some(entry) = entry {
                return Ok(Some((index, entry)));
            }
        }
        Ok(None)
    }

    /// Writes `value` into slot `(index, entry)` under `txn`, with the block's checksum.
    fn write_slot(
        &self,
        fs: &Filesystem,
        txn: &mut Txn<'_>,
        (index, entry): (usize, usize),
        value: u32,
    ) -> Result<()> {
        let block = self.blocks[index];
        let buffer = fs.journal.read_buffer(block)?;
        let csum = fs.params.has_metadata_csum();
        txn.handle.modify(&buffer, |b| {
            b[entry * 4..entry * 4 + 4].copy_from_slice(&value.to_le_bytes());
            if csum {
                let sum = self.checksum(fs, block, b);
                let len = b.len();
                b[len - 4..].copy_from_slice(&sum.to_le_bytes());
            }
        })?;
        Ok(())
    }

    /// The inodes recorded in the file.
    pub fn recorded(&self) -> Vec<u32> {
        let mut inodes: Vec<u32> = self.slots.keys().copied().collect();
        inodes.sort_unstable();
        inodes
    }
}

/// Records `ino` as an orphan: in the orphan file when there is one with room, else at the
/// head of the orphan list (no-op if it is recorded). The caller holds the inode's lock and
/// writes the inode afterwards in the same handle.
pub(crate) fn add(
    fs: &Filesystem,
    txn: &mut Txn<'_>,
    ino: u32,
    data: &mut InodeData,
) -> Result<()> {
    let mut orphans = fs.orphans.lock();
    if data.orphan || orphans.contains(ino) {
        data.orphan = true;
        return Ok(());
    }
    if let Some(file) = &mut orphans.file {
        if let Some(slot) = file.free_slot(fs, ino)? {
            file.write_slot(fs, txn, slot, ino)?;
            file.slots.insert(ino, slot);
            file.used[slot.0] += 1;
            data.orphan = true;
            return Ok(());
        }
        // The orphan file is full: the classic list takes the rest, as in the kernel.
    }
    let list = &mut orphans.list;
    let mut sb = fs.sb.lock();
    data.inode.dtime = sb.last_orphan;
    sb.last_orphan = ino;
    fs.write_superblock(&mut txn.handle, &sb)?;
    list.insert(0, ino);
    data.orphan = true;
    Ok(())
}

/// Takes `ino` out of the orphan file or off the orphan list (no-op if it is in neither).
pub(crate) fn remove(
    fs: &Filesystem,
    txn: &mut Txn<'_>,
    ino: u32,
    data: &mut InodeData,
) -> Result<()> {
    let mut orphans = fs.orphans.lock();
    if let Some(file) = &mut orphans.file {
        if let Some(&slot) = file.slots.get(&ino) {
            file.write_slot(fs, txn, slot, 0)?;
            file.slots.remove(&ino);
            file.used[slot.0] -= 1;
            data.orphan = false;
            return Ok(());
        }
    }
    let list = &mut orphans.list;
    let Some(at) = list.iter().position(|&i| i == ino) else {
        data.orphan = false;
        return Ok(());
    };
    let next = list.get(at + 1).copied().unwrap_or(0);
    if at == 0 {
        let mut sb = fs.sb.lock();
        sb.last_orphan = next;
        fs.write_superblock(&mut txn.handle, &sb)?;
    } else {
        let prev = list[at - 1];
        fs.patch_dtime(&mut txn.handle, prev, next)?;
    }
    list.remove(at);
    data.orphan = false;
    data.inode.dtime = 0;
    Ok(())
}

/// The `i_dtime` an orphan must carry: the next inode on the list (0 at the end). `None`
/// when `ino` is not on the list. Called with the list locked.
pub(crate) fn next_of(list: &[u32], ino: u32) -> Option<u32> {
    let at = list.iter().position(|&i| i == ino)?;
    Some(list.get(at + 1).copied().unwrap_or(0))
}

/// Reads the orphan chain from the superblock at open (bounded: a loop or a bad inode number
/// is corruption).
pub(crate) fn load_list(fs: &Filesystem) -> Result<Vec<u32>> {
    let mut list = Vec::new();
    let mut ino = fs.sb.lock().last_orphan;
    let inodes_count = fs.params.inodes_count;
    while ino != 0 {
        if ino > inodes_count || list.contains(&ino) || list.len() as u32 >= inodes_count {
            return Err(FsError::corrupted(
                fs.params.superblock_block(),
                format!("orphan list is broken at inode {ino}"),
            ));
        }
        list.push(ino);
        let slot = fs.inodes.slot(ino);
        let guard = fs.lock_inode(&slot)?;
        ino = guard.as_ref().expect("loaded").inode.dtime;
    }
    Ok(list)
}

/// What the kernel does at mount (`ext4_orphan_cleanup`), for the orphan file and the list:
/// every orphan with no links is deleted; every orphan with links had a truncate interrupted,
/// which is finished.
pub(crate) fn process_orphans(fs: &Filesystem) -> Result<()> {
    let list = load_list(fs)?;
    let file = if fs.params.feature_compat & feature::COMPAT_ORPHAN_FILE != 0 {
        Some(OrphanFile::load(fs)?)
    } else {
        None
    };
    let mut pending = file.as_ref().map(OrphanFile::recorded).unwrap_or_default();
    for &ino in &list {
        if !pending.contains(&ino) {
            pending.push(ino);
        }
    }
    *fs.orphans.lock() = Orphans { list, file };
    for ino in pending {
        let slot = fs.inodes.slot(ino);
        let mut guard = fs.lock_inode(&slot)?;
        let data = guard.as_mut().expect("loaded");
        data.orphan = true;
        // Loaded by `load_list` before the list was known: as an orphan it is charged.
        fs.recharge(ino, data)?;
        if data.inode.links_count == 0 {
            fs.release_inode(&slot, data)?;
        } else {
            let size = data.inode.size;
            fs.truncate_blocks(ino, data, size)?;
            let mut txn = fs.begin(8, 0)?;
            let result = remove(fs, &mut txn, ino, data)
                .and_then(|()| fs.write_inode(&mut txn, ino, data, true));
            fs.finish(result, txn)?;
        }
    }
    Ok(())
}

/// Byte offset of `i_dtime` in an inode record.
pub(crate) const DTIME_OFFSET: usize = 0x14;

impl Filesystem {
    /// Rewrites orphan `ino`'s `i_dtime` in the inode table buffer (with the checksum).
    /// Called with the orphan list locked.
    fn patch_dtime(&self, handle: &mut journal::Handle, ino: u32, dtime: u32) -> Result<()> {
        let (block, offset) = self.inode_table_location(ino)?;
        let size = usize::from(self.params.inode_size);
        let buffer = self.journal.read_buffer(block)?;
        let params = &self.params;
        handle.modify(&buffer, |b| {
            let record = &mut b[offset..offset + size];
            record[DTIME_OFFSET..DTIME_OFFSET + 4].copy_from_slice(&dtime.to_le_bytes());
            ext4::set_inode_checksum(params, ino, record);
        })?;
        Ok(())
    }
}
