//! Quota files (the quota feature): the kernel's "vfsv1" format, quota format v2 revision 1
//! with its radix tree of ids (`fs/quota/quotaio_v2.h`, `fs/quota/quota_tree.c`; e2fsprogs
//! `lib/support/quotaio_v2.c`, `quotaio_tree.c`). With the feature, the user, group and
//! project quota files are inodes the superblock names (`s_usr_quota_inum` = 3,
//! `s_grp_quota_inum` = 4, `s_prj_quota_inum`), and every change to an inode's blocks or owner
//! is charged there in the same transaction; e2fsck recomputes every id's usage and compares.
//!
//! A quota file is read and written in 1 KiB quota blocks, whatever the file system's block
//! size:
//!
//! | block | contents                                                                  |
//! |-------|---------------------------------------------------------------------------|
//! | 0     | header (`dqh_magic`, `dqh_version`) at 0, info ([`QuotaInfo`]) at 8        |
//! | 1     | the tree's root: 256 little-endian block numbers                           |
//! | tree  | depth 0–3 blocks of 256 refs; byte `3 - depth` of the id picks the ref     |
//! | data  | a 16-byte header (free-list links, entry count), then 14 entries of 72 bytes |
//!
//! An entry ([`DiskDquot`]) whose 72 bytes are all zero is free; a used entry that would be
//! all zero (id 0, nothing charged, no limits) keeps `dqb_itime` = 1 to stay used.
//!
//! The tree code follows e2fsprogs' (the kernel's is the same algorithm) call for call, block
//! write for block write: mkfs reproduces mke2fs's quota files byte for byte, including which
//! file system block each quota block lands in, from the order of those writes.

use super::bytes::{le16, le32, put_le16, put_le32};
use crate::OnDiskError;

/// Quota blocks are 1 KiB (`QT_BLKSIZE_BITS` = 10).
pub const QUOTA_BLOCK_SIZE: usize = 1024;
/// The tree's root block (`QT_TREEOFF`).
pub const TREE_ROOT: u32 = 1;
/// Levels of tree blocks above the data blocks (`QT_TREEDEPTH`).
pub const TREE_DEPTH: u32 = 4;
/// `sizeof(struct v2r1_disk_dqblk)`.
pub const ENTRY_SIZE: usize = 72;
/// `sizeof(struct qt_disk_dqdbheader)`.
pub const DATA_HEADER_SIZE: usize = 16;
/// Entries in one data block (`qtree_dqstr_in_blk`).
pub const ENTRIES_PER_BLOCK: usize = (QUOTA_BLOCK_SIZE - DATA_HEADER_SIZE) / ENTRY_SIZE;
/// `V2_VERSION_R1`: 64-bit limits and usage.
pub const VERSION_R1: u32 = 1;
/// `MAX_DQ_TIME` / `MAX_IQ_TIME`: the default grace periods, a week, in seconds.
pub const GRACE_DEFAULT: u32 = 7 * 24 * 60 * 60;
/// The info structure follows the 8-byte header (`V2_DQINFOOFF`).
const INFO_OFFSET: usize = 8;
const INFO_SIZE: usize = 24;
/// Offsets inside an entry.
const E_ID: usize = 0;
const E_CURINODES: usize = 24;
const E_CURSPACE: usize = 48;
const E_ITIME: usize = 64;

/// The three quota types, in the order the superblock and e2fsprogs number them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum QuotaType {
    User = 0,
    Group = 1,
    Project = 2,
}

impl QuotaType {
    pub const ALL: [QuotaType; 3] = [QuotaType::User, QuotaType::Group, QuotaType::Project];

    /// `dqh_magic` of this type's file (`INITQMAGICS`).
    pub fn magic(self) -> u32 {
        match self {
            QuotaType::User => 0xD9C0_1F11,
            QuotaType::Group => 0xD9C0_1927,
            QuotaType::Project => 0xD9C0_3F14,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            QuotaType::User => "user",
            QuotaType::Group => "group",
            QuotaType::Project => "project",
        }
    }
}

/// `struct v2_disk_dqinfo`: grace times and the tree's allocation state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaInfo {
    pub bgrace: u32,
    pub igrace: u32,
    pub flags: u32,
    /// Quota blocks in the file (`dqi_blocks`): the next block a growing tree takes.
    pub blocks: u32,
    /// Head of the list of free blocks (`dqi_free_blk`), 0 for none.
    pub free_blk: u32,
    /// Head of the list of data blocks with a free entry (`dqi_free_entry`), 0 for none.
    pub free_entry: u32,
}

impl QuotaInfo {
    /// A new file's (`v2_new_io`): the header block and an empty root.
    pub fn new_file() -> QuotaInfo {
        QuotaInfo {
            bgrace: GRACE_DEFAULT,
            igrace: GRACE_DEFAULT,
            flags: 0,
            blocks: TREE_ROOT + 1,
            free_blk: 0,
            free_entry: 0,
        }
    }

    /// The info in block 0 of a `kind` quota file, after checking its header.
    pub fn parse(kind: QuotaType, block0: &[u8]) -> Result<QuotaInfo, OnDiskError> {
        const WHAT: &str = "quota file header";
        if block0.len() < INFO_OFFSET + INFO_SIZE {
            return Err(OnDiskError::corrupted(WHAT, "shorter than its header"));
        }
        let (magic, version) = (le32(block0, 0), le32(block0, 4));
        if magic != kind.magic() {
            return Err(OnDiskError::corrupted(
                WHAT,
                format!("magic {magic:#x} is not a {} quota file's", kind.name()),
            ));
        }
        if version != VERSION_R1 {
            return Err(OnDiskError::unsupported(WHAT, format!("quota format version {version}")));
        }
        let b = &block0[INFO_OFFSET..];
        let info = QuotaInfo {
            bgrace: le32(b, 0),
            igrace: le32(b, 4),
            flags: le32(b, 8),
            blocks: le32(b, 12),
            free_blk: le32(b, 16),
            free_entry: le32(b, 20),
        };
        if info.blocks <= TREE_ROOT
            || info.free_blk >= info.blocks
            || info.free_entry >= info.blocks
        {
            return Err(OnDiskError::corrupted(
                WHAT,
                format!(
                    "{} blocks, free block {}, free entry block {}",
                    info.blocks, info.free_blk, info.free_entry
                ),
            ));
        }
        Ok(info)
    }

    /// Writes the header and this info into block 0.
    pub fn encode_into(&self, kind: QuotaType, block0: &mut [u8]) {
        put_le32(block0, 0, kind.magic());
        put_le32(block0, 4, VERSION_R1);
        let b = &mut block0[INFO_OFFSET..INFO_OFFSET + INFO_SIZE];
        for (i, v) in
            [self.bgrace, self.igrace, self.flags, self.blocks, self.free_blk, self.free_entry]
                .into_iter()
                .enumerate()
        {
            put_le32(b, 4 * i, v);
        }
    }
}

/// `struct v2r1_disk_dqblk`: one id's limits and usage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskDquot {
    pub id: u32,
    pub ihardlimit: u64,
    pub isoftlimit: u64,
    pub curinodes: u64,
    pub bhardlimit: u64,
    pub bsoftlimit: u64,
    /// Bytes charged.
    pub curspace: u64,
    pub btime: u64,
    pub itime: u64,
}

impl DiskDquot {
    /// Decodes an entry (`v2r1_disk2memdqblk`: the used-marker `itime` of an otherwise empty
    /// entry reads as 0).
    pub fn parse(entry: &[u8; ENTRY_SIZE]) -> DiskDquot {
        let q = |off: usize| u64::from_le_bytes(entry[off..off + 8].try_into().expect("8 bytes"));
        let mut d = DiskDquot {
            id: le32(entry, E_ID),
            ihardlimit: q(8),
            isoftlimit: q(16),
            curinodes: q(E_CURINODES),
            bhardlimit: q(32),
            bsoftlimit: q(40),
            curspace: q(E_CURSPACE),
            btime: q(56),
            itime: q(E_ITIME),
        };
        if d == (DiskDquot { itime: 1, ..DiskDquot::default() }) {
            d.itime = 0;
        }
        d
    }

    /// Encodes the entry (`v2r1_mem2diskdqblk`): one that would read as free is marked used.
    pub fn encode(&self) -> [u8; ENTRY_SIZE] {
        let mut e = [0u8; ENTRY_SIZE];
        put_le32(&mut e, E_ID, self.id);
        let fields = [
            self.ihardlimit,
            self.isoftlimit,
            self.curinodes,
            self.bhardlimit,
            self.bsoftlimit,
            self.curspace,
            self.btime,
            self.itime,
        ];
        for (i, v) in fields.into_iter().enumerate() {
            e[8 + 8 * i..16 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        if entry_unused(&e) {
            e[E_ITIME..E_ITIME + 8].copy_from_slice(&1u64.to_le_bytes());
        }
        e
    }
}

/// `qtree_entry_unused`: a free entry is all zero.
pub fn entry_unused(entry: &[u8]) -> bool {
    entry.iter().all(|&b| b == 0)
}

/// Adds `space` bytes and `inodes` inodes to the entry at the start of `entry` (negative
/// deltas below zero stop at zero, as the kernel's `dquot_decr_*` do), keeping it used.
pub fn add_usage(entry: &mut [u8], space: i64, inodes: i64) {
    let bytes: &mut [u8; ENTRY_SIZE] = (&mut entry[..ENTRY_SIZE]).try_into().expect("entry");
    let mut d = DiskDquot::parse(bytes);
    d.curspace = d.curspace.saturating_add_signed(space);
    d.curinodes = d.curinodes.saturating_add_signed(inodes);
    *bytes = d.encode();
}

/// Byte `3 - depth` of `id`: the ref a tree block at `depth` follows (`get_index`).
pub fn tree_index(id: u32, depth: u32) -> usize {
    ((id >> ((TREE_DEPTH - depth - 1) * 8)) & 0xFF) as usize
}

/// Where a quota file's tree code reads and writes its 1 KiB blocks. A block past the end of
/// the file reads as zeros (e2fsprogs' `read_blk`); writing one extends the file.
pub trait QuotaFileIo {
    type Error: From<OnDiskError>;
    fn read_block(&mut self, blk: u32) -> Result<[u8; QUOTA_BLOCK_SIZE], Self::Error>;
    fn write_block(&mut self, blk: u32, data: &[u8; QUOTA_BLOCK_SIZE]) -> Result<(), Self::Error>;
}

fn corrupted(reason: String) -> OnDiskError {
    OnDiskError::corrupted("quota tree", reason)
}

fn get_ref(block: &[u8], index: usize) -> u32 {
    le32(block, 4 * index)
}

/// The byte offset of `id`'s entry, following the tree from the root, or `None` if the tree
/// has no entry for it.
pub fn find<Io: QuotaFileIo>(
    io: &mut Io,
    info: &QuotaInfo,
    id: u32,
) -> Result<Option<u64>, Io::Error> {
    let mut blk = TREE_ROOT;
    for depth in 0..TREE_DEPTH {
        let block = io.read_block(blk)?;
        let next = get_ref(&block, tree_index(id, depth));
        if next == 0 {
            return Ok(None);
        }
        if next >= info.blocks || next <= TREE_ROOT {
            return Err(corrupted(format!(
                "block {blk} refers to block {next} of {}",
                info.blocks
            ))
            .into());
        }
        blk = next;
    }
    let block = io.read_block(blk)?;
    for i in 0..ENTRIES_PER_BLOCK {
        let off = DATA_HEADER_SIZE + i * ENTRY_SIZE;
        let entry = &block[off..off + ENTRY_SIZE];
        if !entry_unused(entry) && le32(entry, E_ID) == id {
            return Ok(Some(u64::from(blk) * QUOTA_BLOCK_SIZE as u64 + off as u64));
        }
    }
    Err(corrupted(format!("id {id} leads to data block {blk}, which has no entry for it")).into())
}

/// Every used entry the tree reaches, as (id, byte offset), in id order. Each block is read
/// once; a tree block reached twice, a ref past the file, an entry under the wrong path or an
/// id twice is damage.
pub fn scan<Io: QuotaFileIo>(io: &mut Io, info: &QuotaInfo) -> Result<Vec<(u32, u64)>, Io::Error> {
    let mut seen = std::collections::HashSet::from([0, TREE_ROOT]);
    let mut data_blocks = std::collections::HashSet::new();
    let mut found = Vec::new();
    let mut stack = vec![(TREE_ROOT, 0u32)];
    while let Some((blk, depth)) = stack.pop() {
        let block = io.read_block(blk)?;
        if depth == TREE_DEPTH {
            for i in 0..ENTRIES_PER_BLOCK {
                let off = DATA_HEADER_SIZE + i * ENTRY_SIZE;
                let entry = &block[off..off + ENTRY_SIZE];
                if entry_unused(entry) {
                    continue;
                }
                found.push((
                    le32(entry, E_ID),
                    u64::from(blk) * QUOTA_BLOCK_SIZE as u64 + off as u64,
                ));
            }
            continue;
        }
        for index in (0..256).rev() {
            let next = get_ref(&block, index);
            if next == 0 {
                continue;
            }
            // Refs of the last tree level share data blocks (14 ids to a block); a tree
            // block is reached once.
            let data = depth + 1 == TREE_DEPTH;
            let shared_data_block = data && data_blocks.contains(&next);
            if next >= info.blocks || !(seen.insert(next) || shared_data_block) {
                return Err(corrupted(format!(
                    "block {blk} refers to block {next} (of {}), out of the file or reached twice",
                    info.blocks
                ))
                .into());
            }
            if data && !data_blocks.insert(next) {
                continue;
            }
            stack.push((next, depth + 1));
        }
    }
    // The free lists: what a later insert takes or rewrites must be neither the header nor a
    // block the tree uses (e2fsprogs and the kernel trust them; a damaged list would have an
    // insert overwrite live blocks). Free blocks are outside the tree; blocks with free
    // entries are its data blocks, not full.
    let mut free = std::collections::HashSet::new();
    let mut blk = info.free_blk;
    while blk != 0 {
        if blk >= info.blocks || seen.contains(&blk) || !free.insert(blk) {
            return Err(corrupted(format!("the free-block list reaches block {blk}")).into());
        }
        blk = le32(&io.read_block(blk)?, 0);
    }
    let mut listed = std::collections::HashSet::new();
    let mut blk = info.free_entry;
    while blk != 0 {
        if !data_blocks.contains(&blk) || !listed.insert(blk) {
            return Err(corrupted(format!("the free-entry list reaches block {blk}")).into());
        }
        let block = io.read_block(blk)?;
        if usize::from(le16(&block, 8)) >= ENTRIES_PER_BLOCK {
            return Err(corrupted(format!("full data block {blk} on the free-entry list")).into());
        }
        blk = le32(&block, 0);
    }
    found.sort_unstable();
    for pair in found.windows(2) {
        if pair[0].0 == pair[1].0 {
            return Err(corrupted(format!("two entries for id {}", pair[0].0)).into());
        }
    }
    // An entry is found only through its own path (`find`); one elsewhere would be lost.
    for &(id, off) in &found {
        if find(io, info, id)? != Some(off) {
            return Err(
                corrupted(format!("the entry for id {id} is not where its id leads")).into()
            );
        }
    }
    Ok(found)
}

/// Adds an entry for `dquot.id` (which the tree must not have) and writes it; returns its
/// byte offset. `info` changes as blocks are taken; the caller writes it back into block 0
/// (e2fsprogs at close, the kernel at once).
pub fn insert<Io: QuotaFileIo>(
    io: &mut Io,
    info: &mut QuotaInfo,
    dquot: &DiskDquot,
) -> Result<u64, Io::Error> {
    let mut root = TREE_ROOT;
    let offset = insert_tree(io, info, dquot.id, &mut root, 0)?;
    let blk = (offset / QUOTA_BLOCK_SIZE as u64) as u32;
    let at = (offset % QUOTA_BLOCK_SIZE as u64) as usize;
    let mut block = io.read_block(blk)?;
    block[at..at + ENTRY_SIZE].copy_from_slice(&dquot.encode());
    io.write_block(blk, &block)?;
    Ok(offset)
}

/// `do_insert_tree`: returns the entry's byte offset. A block taken for a level that then
/// fails is not given back (e2fsprogs' `put_free_dqblk`); the caller's transaction is lost
/// anyway when an insert fails.
fn insert_tree<Io: QuotaFileIo>(
    io: &mut Io,
    info: &mut QuotaInfo,
    id: u32,
    treeblk: &mut u32,
    depth: u32,
) -> Result<u64, Io::Error> {
    let mut block = if *treeblk == 0 {
        *treeblk = get_free_block(io, info)?;
        [0u8; QUOTA_BLOCK_SIZE]
    } else {
        io.read_block(*treeblk)?
    };
    let index = tree_index(id, depth);
    let mut child = get_ref(&block, index);
    let new_child = child == 0;
    if child != 0 && (child >= info.blocks || child <= TREE_ROOT) {
        return Err(corrupted(format!("block {treeblk} refers to block {child}")).into());
    }
    let offset = if depth == TREE_DEPTH - 1 {
        if child != 0 {
            return Err(corrupted(format!("id {id} already has data block {child}")).into());
        }
        let (blk, offset) = find_free_entry(io, info)?;
        child = blk;
        offset
    } else {
        insert_tree(io, info, id, &mut child, depth + 1)?
    };
    if new_child {
        put_le32(&mut block, 4 * index, child);
        io.write_block(*treeblk, &block)?;
    }
    Ok(offset)
}

/// `get_free_dqblk`: a block off the free list, or a new zeroed one at the end of the file.
fn get_free_block<Io: QuotaFileIo>(io: &mut Io, info: &mut QuotaInfo) -> Result<u32, Io::Error> {
    if info.free_blk != 0 {
        let blk = info.free_blk;
        let block = io.read_block(blk)?;
        let next = le32(&block, 0);
        if next >= info.blocks {
            return Err(corrupted(format!("free block {blk} links to block {next}")).into());
        }
        info.free_blk = next;
        return Ok(blk);
    }
    let blk = info.blocks;
    if blk == u32::MAX {
        return Err(corrupted("the file has no block number left".into()).into());
    }
    io.write_block(blk, &[0u8; QUOTA_BLOCK_SIZE])?;
    info.blocks += 1;
    Ok(blk)
}

/// `find_free_dqentry`: a data block with a free entry (the free-entry list's head, or a new
/// block that becomes it), with its count raised; returns the block and the entry's offset.
fn find_free_entry<Io: QuotaFileIo>(
    io: &mut Io,
    info: &mut QuotaInfo,
) -> Result<(u32, u64), Io::Error> {
    let (blk, mut block) = if info.free_entry != 0 {
        (info.free_entry, io.read_block(info.free_entry)?)
    } else {
        let blk = get_free_block(io, info)?;
        info.free_entry = blk;
        (blk, [0u8; QUOTA_BLOCK_SIZE])
    };
    let entries = usize::from(le16(&block, 8));
    if entries >= ENTRIES_PER_BLOCK {
        return Err(corrupted(format!(
            "data block {blk} on the free list holds {entries} entries"
        ))
        .into());
    }
    if entries + 1 >= ENTRIES_PER_BLOCK {
        remove_free_entry_block(io, info, &mut block, blk)?;
    }
    put_le16(&mut block, 8, (entries + 1) as u16);
    let slot = (0..ENTRIES_PER_BLOCK)
        .find(|i| {
            let off = DATA_HEADER_SIZE + i * ENTRY_SIZE;
            entry_unused(&block[off..off + ENTRY_SIZE])
        })
        .ok_or_else(|| {
            corrupted(format!("data block {blk} counts {entries} entries but is full"))
        })?;
    io.write_block(blk, &block)?;
    let offset =
        u64::from(blk) * QUOTA_BLOCK_SIZE as u64 + (DATA_HEADER_SIZE + slot * ENTRY_SIZE) as u64;
    Ok((blk, offset))
}

/// `remove_free_dqentry`: takes data block `blk` (its bytes in `block`) off the free-entry list.
fn remove_free_entry_block<Io: QuotaFileIo>(
    io: &mut Io,
    info: &mut QuotaInfo,
    block: &mut [u8; QUOTA_BLOCK_SIZE],
    blk: u32,
) -> Result<(), Io::Error> {
    let (next, prev) = (le32(block, 0), le32(block, 4));
    if next >= info.blocks || prev >= info.blocks {
        return Err(corrupted(format!("data block {blk} links to blocks {next} and {prev}")).into());
    }
    if next != 0 {
        let mut other = io.read_block(next)?;
        put_le32(&mut other, 4, prev);
        io.write_block(next, &other)?;
    }
    if prev != 0 {
        let mut other = io.read_block(prev)?;
        put_le32(&mut other, 0, next);
        io.write_block(prev, &other)?;
    } else {
        info.free_entry = next;
    }
    put_le32(block, 0, 0);
    put_le32(block, 4, 0);
    io.write_block(blk, block)
}

/// A quota file in memory, recording the order of its block writes (mkfs places file system
/// blocks in the order e2fsprogs first writes to them; tests and fuzzing use it as a file).
#[derive(Clone, Debug, Default)]
pub struct MemQuotaFile {
    pub blocks: Vec<[u8; QUOTA_BLOCK_SIZE]>,
    /// Every block written, in order.
    pub writes: Vec<u32>,
}

impl MemQuotaFile {
    /// The file e2fsprogs' `quota_write_inode` makes for `kind` with these entries (written in
    /// id order, as its dictionary hands them out).
    pub fn create(kind: QuotaType, entries: &[DiskDquot]) -> Result<MemQuotaFile, OnDiskError> {
        let mut file = MemQuotaFile::default();
        let mut info = QuotaInfo::new_file();
        // v2_new_io writes the header and the info first.
        let mut block0 = [0u8; QUOTA_BLOCK_SIZE];
        info.encode_into(kind, &mut block0);
        file.write_block(0, &block0)?;
        let mut sorted = entries.to_vec();
        sorted.sort_by_key(|d| d.id);
        for dquot in &sorted {
            insert(&mut file, &mut info, dquot)?;
        }
        // quota_file_close writes the info last.
        let mut block0 = file.read_block(0)?;
        info.encode_into(kind, &mut block0);
        file.write_block(0, &block0)?;
        Ok(file)
    }

    /// The file's bytes.
    pub fn bytes(&self) -> Vec<u8> {
        self.blocks.concat()
    }
}

impl QuotaFileIo for MemQuotaFile {
    type Error = OnDiskError;

    fn read_block(&mut self, blk: u32) -> Result<[u8; QUOTA_BLOCK_SIZE], OnDiskError> {
        Ok(self.blocks.get(blk as usize).copied().unwrap_or([0; QUOTA_BLOCK_SIZE]))
    }

    fn write_block(&mut self, blk: u32, data: &[u8; QUOTA_BLOCK_SIZE]) -> Result<(), OnDiskError> {
        let blk_usize = blk as usize;
        if blk_usize >= self.blocks.len() {
            if blk_usize > (1 << 20) {
                return Err(corrupted(format!("block {blk} is past what a test file holds")));
            }
            self.blocks.resize(blk_usize + 1, [0; QUOTA_BLOCK_SIZE]);
        }
        self.blocks[blk_usize] = *data;
        self.writes.push(blk);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(id: u32, curspace: u64, curinodes: u64) -> DiskDquot {
        DiskDquot { id, curspace, curinodes, ..DiskDquot::default() }
    }

    /// The user quota file mke2fs 1.47.0 writes for a fresh file system (root and
    /// lost+found, 13 KiB with 1 KiB blocks): six blocks, written 0, 2, 3, 4, 5, then 1.
    #[test]
    fn a_new_file_is_what_mke2fs_writes() {
        let file = MemQuotaFile::create(QuotaType::User, &[usage(0, 13312, 2)]).unwrap();
        let bytes = file.bytes();
        assert_eq!(bytes.len(), 6 * 1024);
        assert_eq!(
            &bytes[..32],
            &[
                0x11, 0x1f, 0xc0, 0xd9, 1, 0, 0, 0, 0x80, 0x3a, 9, 0, 0x80, 0x3a, 9, 0, //
                0, 0, 0, 0, 6, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0,
            ]
        );
        for (blk, next) in [(1, 2u8), (2, 3), (3, 4), (4, 5)] {
            assert_eq!(bytes[blk * 1024], next, "tree block {blk}");
            assert!(bytes[blk * 1024 + 1..(blk + 1) * 1024].iter().all(|&b| b == 0));
        }
        let data = &bytes[5 * 1024..];
        assert_eq!(le16(data, 8), 1);
        assert_eq!(le32(data, 16 + E_CURINODES), 2);
        assert_eq!(le32(data, 16 + E_CURSPACE), 13312);
        let mut first = Vec::new();
        for blk in &file.writes {
            if !first.contains(blk) {
                first.push(*blk);
            }
        }
        assert_eq!(first, [0, 2, 3, 4, 5, 1]);
    }

    #[test]
    fn entries_are_found_where_inserted_and_scanned_in_id_order() {
        // Ids sharing tree paths and ids far apart, more than one data block's worth.
        let ids: Vec<u32> = (0..40).chain([1000, 65_536, 70_000, u32::MAX - 1]).collect();
        let entries: Vec<_> = ids.iter().map(|&id| usage(id, u64::from(id) * 3, 1)).collect();
        let mut file = MemQuotaFile::create(QuotaType::Group, &entries).unwrap();
        let info = QuotaInfo::parse(QuotaType::Group, &file.blocks[0]).unwrap();
        let scanned = scan(&mut file, &info).unwrap();
        assert_eq!(scanned.iter().map(|e| e.0).collect::<Vec<_>>(), ids);
        for (id, off) in scanned {
            assert_eq!(find(&mut file, &info, id).unwrap(), Some(off));
            let at = off as usize;
            let bytes = file.bytes();
            let d = DiskDquot::parse(bytes[at..at + ENTRY_SIZE].try_into().unwrap());
            assert_eq!((d.id, d.curspace, d.curinodes), (id, u64::from(id) * 3, 1));
        }
        assert_eq!(find(&mut file, &info, 41).unwrap(), None);
        // The free-entry list now heads the one data block with room.
        let head = info.free_entry as usize;
        assert!(usize::from(le16(&file.blocks[head], 8)) < ENTRIES_PER_BLOCK);
    }

    #[test]
    fn usage_changes_stay_at_zero_and_keep_the_entry_used() {
        let mut e = usage(0, 4096, 1).encode();
        add_usage(&mut e, -4096, -1);
        assert!(!entry_unused(&e), "an id-0 entry with nothing charged stays used");
        assert_eq!(DiskDquot::parse(&e), DiskDquot::default());
        add_usage(&mut e, -1, -1);
        assert_eq!(DiskDquot::parse(&e), DiskDquot::default());
        add_usage(&mut e, 1024, 2);
        let d = DiskDquot::parse(&e);
        assert_eq!((d.curspace, d.curinodes, d.itime), (1024, 2, 0));
    }

    #[test]
    fn damaged_trees_are_errors() {
        let mut file =
            MemQuotaFile::create(QuotaType::User, &[usage(0, 1, 1), usage(5, 1, 1)]).unwrap();
        let info = QuotaInfo::parse(QuotaType::User, &file.blocks[0]).unwrap();
        // A ref past the file.
        let mut bad = file.clone();
        put_le32(&mut bad.blocks[1], 0, 99);
        assert!(scan(&mut bad, &info).is_err());
        assert!(find(&mut bad, &info, 0).is_err());
        // A loop back to the root.
        let mut bad = file.clone();
        put_le32(&mut bad.blocks[2], 4, 1);
        assert!(scan(&mut bad, &info).is_err());
        // Free lists naming live blocks: the root as a free block, a tree block as one with
        // free entries.
        for (field, value) in [(16, TREE_ROOT), (20, 3)] {
            let mut bad = file.clone();
            put_le32(&mut bad.blocks[0], INFO_OFFSET + field, value);
            let bad_info = QuotaInfo::parse(QuotaType::User, &bad.blocks[0]).unwrap();
            assert!(scan(&mut bad, &bad_info).is_err(), "info field {field} = {value}");
        }
        // Inserting an id the tree has.
        let mut info2 = info;
        assert!(insert(&mut file, &mut info2, &usage(5, 0, 0)).is_err());
        // A wrong magic.
        assert!(QuotaInfo::parse(QuotaType::Group, &file.blocks[0]).is_err());
    }
}
