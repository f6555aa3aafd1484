//! The orphan list: inodes with no links that are still open, and inodes part way through a
//! truncate, chained from `s_last_orphan` through their `i_dtime` (ext4's classic orphan list,
//! which the kernel and e2fsck process on images with or without the orphan_file feature).
//!
//! The list's order lives in memory too (`Filesystem::orphans`, head first), guarded by its
//! mutex, which is lock 5 of the order in `filesystem.rs`. An orphan's `i_dtime` on disk is
//! always "the next orphan" as that list says: `write_inode` takes the next pointer from the
//! list under the same mutex, and removing an inode from the middle rewrites its predecessor's
//! record in the inode table buffer directly (as `ext4_orphan_del` does), without the
//! predecessor's inode lock.

use crate::error::{FsError, Result};
use crate::filesystem::{Filesystem, Txn};
use crate::inodes::InodeData;
use ondisk::ext4;

/// Puts `ino` at the head of the orphan list (no-op if it is on it). The caller holds the
/// inode's lock and writes the inode afterwards in the same handle.
pub(crate) fn add(
    fs: &Filesystem,
    txn: &mut Txn<'_>,
    ino: u32,
    data: &mut InodeData,
) -> Result<()> {
    let mut list = fs.orphans.lock();
    if data.orphan || list.contains(&ino) {
        data.orphan = true;
        return Ok(());
    }
    let mut sb = fs.sb.lock();
    data.inode.dtime = sb.last_orphan;
    sb.last_orphan = ino;
    fs.write_superblock(&mut txn.handle, &sb)?;
    list.insert(0, ino);
    data.orphan = true;
    Ok(())
}

/// Takes `ino` off the orphan list (no-op if it is not on it).
pub(crate) fn remove(
    fs: &Filesystem,
    txn: &mut Txn<'_>,
    ino: u32,
    data: &mut InodeData,
) -> Result<()> {
    let mut list = fs.orphans.lock();
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

/// What the kernel does at mount (`ext4_orphan_cleanup`): every orphan with no links is
/// deleted; every orphan with links had a truncate interrupted, which is finished.
pub(crate) fn process_orphan_list(fs: &Filesystem) -> Result<()> {
    let list = load_list(fs)?;
    *fs.orphans.lock() = list.clone();
    for ino in list {
        let slot = fs.inodes.slot(ino);
        let mut guard = fs.lock_inode(&slot)?;
        let data = guard.as_mut().expect("loaded");
        data.orphan = true;
        if data.inode.links_count == 0 {
            fs.release_inode(&slot, data)?;
        } else {
            let size = data.inode.size;
            fs.truncate_blocks(ino, data, size)?;
            let mut txn = fs.begin(8, 0)?;
            let result = remove(fs, &mut txn, ino, data)
                .and_then(|()| fs.write_inode(&mut txn.handle, ino, data, true));
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
