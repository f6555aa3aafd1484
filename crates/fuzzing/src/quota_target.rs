//! The `quota_tree` target: the quota-file tree code (`ondisk::ext4::quota`) over a file the
//! input gives: the header check, the scan every read-write mount makes, lookups of what it
//! found, and an insert of a new id into what it accepted.

use ondisk::ext4::quota::{
    find, insert, scan, DiskDquot, MemQuotaFile, QuotaFileIo, QuotaInfo, QuotaType,
    QUOTA_BLOCK_SIZE,
};

use crate::input::Input;

/// Most quota blocks an input gives, and most a file may claim before an insert is tried
/// (an insert writes at `dqi_blocks`, which a hostile header may put anywhere).
const BLOCKS_MAX: usize = 24;

/// `quota_tree`: `[type: u8 % 3][new id: u32][blocks: 1 KiB each]`. Whatever scans finds
/// each of its ids where `find` finds them; an insert of an id the file lacks leaves every
/// old id where it was and the new one found, and the file still scans.
pub fn quota_tree(data: &[u8]) {
    let mut input = Input::new(data);
    let kind = QuotaType::ALL[usize::from(input.u8() % 3)];
    let new_id = input.u32();
    let mut file = MemQuotaFile::default();
    while file.blocks.len() < BLOCKS_MAX {
        let bytes = input.bytes(QUOTA_BLOCK_SIZE);
        if bytes.is_empty() {
            break;
        }
        let mut block = [0u8; QUOTA_BLOCK_SIZE];
        block[..bytes.len()].copy_from_slice(bytes);
        file.blocks.push(block);
    }
    let Some(block0) = file.blocks.first().copied() else { return };
    let Ok(info) = QuotaInfo::parse(kind, &block0) else { return };
    let Ok(found) = scan(&mut file, &info) else { return };
    for &(id, offset) in &found {
        assert_eq!(find(&mut file, &info, id).ok().flatten(), Some(offset), "id {id} moved");
    }
    if info.blocks as usize > BLOCKS_MAX || found.iter().any(|&(id, _)| id == new_id) {
        return;
    }
    let mut grown = file.clone();
    let mut grown_info = info;
    let dquot = DiskDquot { id: new_id, curspace: 4096, curinodes: 1, ..DiskDquot::default() };
    let Ok(offset) = insert(&mut grown, &mut grown_info, &dquot) else { return };
    let mut block0 = grown.read_block(0).expect("in memory");
    grown_info.encode_into(kind, &mut block0);
    grown.write_block(0, &block0).expect("in memory");
    // The tree may have reused damaged blocks (a free list the scan did not check): only an
    // insert into a file whose scan still succeeds is held to the rest.
    let Ok(after) = scan(&mut grown, &grown_info) else { return };
    assert_eq!(find(&mut grown, &grown_info, new_id).ok().flatten(), Some(offset), "new id");
    for &(id, old) in &found {
        if after.iter().any(|&(i, off)| i == id && off == old) {
            continue;
        }
        panic!("id {id} lost or moved by the insert of {new_id}");
    }
}
