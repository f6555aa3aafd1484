//! The `image` target: a small image made by quill itself, damaged by a list of patches from
//! the fuzz input, then opened by quill, walked, modified and unmounted. Every error is an
//! acceptable answer; a panic, a hang or an unbounded allocation is a bug.
//!
//! The base images are built once per process ([`BaseImage::get`]), in memory, with quill's
//! mkfs (4 MiB, 1 KiB blocks, a 1024-block journal) and quill's own file operations:
//!
//! | variant | features                | state                                                  |
//! |---------|-------------------------|--------------------------------------------------------|
//! | 0       | mkfs defaults (metadata_csum) | clean                                            |
//! | 1       | `^metadata_csum`        | clean: damage gets past checksums to the structure checks |
//! | 2       | mkfs defaults           | crashed with committed transactions: every open replays the journal |
//! | 3       | `inline_data`           | clean: the small directories are inline (in their inode records) |
//!
//! Each holds small and multi-block files, a file whose extent tree has depth 1, nested
//! directories, an htree directory, fast and slow symlinks, and xattrs in the inode and in a
//! block. [`BaseImage::metadata_blocks`] lists the blocks that hold metadata (superblock,
//! descriptors, bitmaps, the used inode-table blocks, directory, extent-tree, xattr and symlink
//! blocks, the journal superblock and the journal's first log blocks).
//!
//! Input: `[variant u8]` then up to [`PATCHES_MAX`] patches `[region u8][offset u16][len u8]
//! [bytes]`. The variant is the low 7 bits (modulo the count); bit 7 asks for the checksums of
//! the patched metadata blocks to be resealed afterwards (superblock, descriptors, inodes,
//! directory leaves and index blocks, extent-tree and xattr blocks), so that damage to a
//! metadata_csum image gets past the checksums to the structure checks behind them. A patch
//! writes `(len % 32) + 1` bytes (fewer if the input ends) at byte `offset % block size` of
//! metadata block `region % count`; region 255 instead writes at byte `offset * 32` of the
//! image, anywhere. Biasing patches to metadata lets the fuzzer find the bytes that matter with
//! short inputs.
//!
//! The work per input is bounded ([`DIRS_MAX`], [`ENTRIES_MAX`], [`FILES_MAX`],
//! [`READ_BYTES_MAX`]) so that one input runs in milliseconds.

use std::collections::BTreeSet;
use std::sync::{Arc, OnceLock};

use blockdev::memory::MemDevice;
use blockdev::BlockDevice;
use fs::mkfs::{Features, MkfsOptions};
use fs::{Ext4Image, Filesystem, MountOptions, RenameFlags, SetMode, ROOT_INO};
use ondisk::ext4::dir::{dir_tail_ok, set_dir_block_checksum};
use ondisk::ext4::htree::{dx_csum, set_dx_checksum};
use ondisk::ext4::xattr::set_xattr_block_checksum;
use ondisk::ext4::{
    self, inode_csum_seed, parse_extent_node, set_group_desc_checksum, set_inode_checksum,
    set_superblock_checksum, ExtentEntries, ExtentHeader, Superblock, EXTENT_TAIL_SIZE,
    SUPERBLOCK_OFFSET,
};

use crate::input::Input;
use crate::samples::UUID;

/// Size of every base image: the smallest that mkfs gives a journal (1024 blocks) and room.
pub const IMAGE_BYTES: usize = 4 << 20;
const BLOCK_SIZE: u32 = 1024;
/// Variant names, indexed by the input's first byte (modulo their count).
pub const IMAGE_VARIANTS: [&str; 4] = ["csum", "nocsum", "needs-recovery", "inline"];
/// Most patches one input applies.
pub const PATCHES_MAX: usize = 32;
/// Most directories the walk lists (an image may be damaged into a directory loop).
pub const DIRS_MAX: usize = 16;
/// Most directory entries the walk handles in all.
pub const ENTRIES_MAX: usize = 512;
/// Most files the walk reads, and most bytes it reads of each (a damaged size may claim
/// terabytes).
pub const FILES_MAX: usize = 16;
pub const READ_BYTES_MAX: u64 = 16 << 10;
/// Entries one readdir call returns.
const READDIR_BATCH: usize = 64;
/// Extended attributes read per file.
const XATTRS_MAX: usize = 8;
/// Journal log blocks listed as metadata (where the needs-recovery variant's transactions are).
const JOURNAL_LOG_BLOCKS: u32 = 24;
/// Names in the htree directory: enough for three 1 KiB leaves.
const HTREE_NAMES: usize = 48;

/// What a metadata block holds, for resealing its checksum after a patch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaKind {
    Superblock,
    /// Group descriptors from group `first_group` on.
    Descriptors {
        first_group: u32,
    },
    /// Inode records from inode `first_ino` on.
    InodeTable {
        first_ino: u32,
    },
    /// A directory block (leaf or index) of the directory whose inode checksum seed is `seed`.
    Directory {
        seed: u32,
    },
    /// An extent-tree block of the inode whose checksum seed is `seed`.
    ExtentTree {
        seed: u32,
    },
    Xattr,
    /// Bitmaps, symlink targets, journal blocks: nothing to reseal here.
    Other,
}

/// One base image and where its metadata is.
pub struct BaseImage {
    pub name: &'static str,
    pub bytes: Vec<u8>,
    /// The superblock as built (the parameters resealing uses).
    pub superblock: Superblock,
    /// Blocks holding metadata and what they hold, sorted by block, without duplicates.
    pub metadata_blocks: Vec<(u64, MetaKind)>,
}

impl BaseImage {
    /// The base images, built on first use.
    pub fn get() -> &'static [BaseImage] {
        static IMAGES: OnceLock<Vec<BaseImage>> = OnceLock::new();
        IMAGES.get_or_init(|| {
            IMAGE_VARIANTS.iter().enumerate().map(|(i, name)| build(name, i)).collect()
        })
    }
}

/// `image`: see the module documentation.
pub fn image(data: &[u8]) {
    let mut input = Input::new(data);
    let images = BaseImage::get();
    let selector = input.u8();
    let base = &images[usize::from(selector & 0x7F) % images.len()];
    let mut bytes = base.bytes.clone();
    let touched = apply_patches(&mut bytes, &base.metadata_blocks, &mut input);
    if selector & 0x80 != 0 && base.superblock.has_metadata_csum() {
        reseal(&mut bytes, base, &touched);
    }
    let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::from_bytes(bytes));
    exercise(dev);
}

/// Applies the patches; returns the metadata blocks they touched (indexes into `metadata`).
fn apply_patches(
    bytes: &mut [u8],
    metadata: &[(u64, MetaKind)],
    input: &mut Input<'_>,
) -> BTreeSet<usize> {
    let block_size = BLOCK_SIZE as usize;
    let mut touched = BTreeSet::new();
    for _ in 0..PATCHES_MAX {
        if input.is_empty() {
            break;
        }
        let region = input.u8();
        let offset = usize::from(input.u16());
        let len = usize::from(input.u8() % 32) + 1;
        let patch = input.bytes(len);
        let at = if region == 255 || metadata.is_empty() {
            offset * 32
        } else {
            let index = usize::from(region) % metadata.len();
            touched.insert(index);
            metadata[index].0 as usize * block_size + offset % block_size
        };
        let end = (at + patch.len()).min(bytes.len());
        if at < end {
            bytes[at..end].copy_from_slice(&patch[..end - at]);
        }
    }
    touched
}

/// Recomputes the checksums of the touched metadata blocks, with the base image's parameters.
fn reseal(bytes: &mut [u8], base: &BaseImage, touched: &BTreeSet<usize>) {
    let sb = &base.superblock;
    let block_size = BLOCK_SIZE as usize;
    for &index in touched {
        let (nr, kind) = base.metadata_blocks[index];
        if kind == MetaKind::Superblock {
            // The superblock is bytes 1024..2048 whatever the block size.
            let raw = bytes[SUPERBLOCK_OFFSET as usize..].first_chunk_mut().expect("superblock");
            set_superblock_checksum(raw);
            continue;
        }
        let start = nr as usize * block_size;
        let block = &mut bytes[start..start + block_size];
        match kind {
            MetaKind::Descriptors { first_group } => {
                let size = sb.desc_size();
                let groups = sb.group_count().saturating_sub(first_group) as usize;
                for (i, desc) in block.chunks_exact_mut(size).take(groups).enumerate() {
                    set_group_desc_checksum(sb, first_group + i as u32, desc);
                }
            }
            MetaKind::InodeTable { first_ino } => {
                let size = usize::from(sb.inode_size);
                let base_block = &base.bytes[start..start + block_size];
                for (i, record) in block.chunks_exact_mut(size).enumerate() {
                    // A free, never-used record stays all zeros (and so valid).
                    if base_block[i * size..(i + 1) * size].iter().any(|&b| b != 0) {
                        set_inode_checksum(sb, first_ino + i as u32, record);
                    }
                }
            }
            MetaKind::Directory { seed } => {
                if dir_tail_ok(block) {
                    set_dir_block_checksum(seed, block);
                } else if dx_csum(seed, block).is_some() {
                    set_dx_checksum(seed, block);
                }
            }
            MetaKind::ExtentTree { seed } => {
                // Only eh_max places the tail; the header may be damaged past parsing.
                let max = u16::from_le_bytes([block[4], block[5]]);
                let header = ExtentHeader { entries: 0, max, depth: 0, generation: 0 };
                if header.tail_offset() + EXTENT_TAIL_SIZE <= block.len() {
                    header.seal_block(seed, block);
                }
            }
            MetaKind::Xattr => set_xattr_block_checksum(sb.csum_seed(), nr, block),
            MetaKind::Superblock | MetaKind::Other => {}
        }
    }
}

/// Opens, walks, modifies and unmounts; every error is ignored.
fn exercise(dev: Arc<dyn BlockDevice>) {
    let Ok(fs) = Filesystem::open(dev, MountOptions::default()) else { return };
    let (dirs, files) = walk(&fs);
    for path in ["/small", "/dir/a", "/htree/name-007-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"] {
        let _ = fs.resolve(path);
    }
    modify(&fs, &dirs, &files);
    let _ = fs.sync();
    let _ = fs.unmount();
}

/// Lists up to [`DIRS_MAX`] directories from the root; reads links, files and their xattrs.
/// Returns the directories and regular files seen.
fn walk(fs: &Filesystem) -> (Vec<u32>, Vec<u32>) {
    let mut stack = vec![ROOT_INO];
    let mut dirs_seen = BTreeSet::from([ROOT_INO]);
    let mut dirs = Vec::new();
    let mut files = Vec::new();
    let mut entries_left = ENTRIES_MAX;
    while let Some(dir) = stack.pop() {
        dirs.push(dir);
        for entry in read_dir(fs, dir, &mut entries_left) {
            if entry.name == b"." || entry.name == b".." {
                continue;
            }
            let _ = fs.lookup(dir, &entry.name);
            let Ok(attr) = fs.getattr(entry.ino) else { continue };
            match attr.mode & ext4::MODE_TYPE_MASK {
                ext4::MODE_DIR if dirs_seen.len() < DIRS_MAX && dirs_seen.insert(entry.ino) => {
                    stack.push(entry.ino);
                }
                ext4::MODE_SYMLINK => {
                    let _ = fs.readlink(entry.ino);
                }
                ext4::MODE_REGULAR if files.len() < FILES_MAX && !files.contains(&entry.ino) => {
                    files.push(entry.ino);
                }
                _ => {}
            }
        }
    }
    for &ino in &files {
        read_file(fs, ino);
        if let Ok(names) = fs.listxattr(ino) {
            for name in names.iter().take(XATTRS_MAX) {
                let _ = fs.getxattr(ino, name);
            }
        }
    }
    (dirs, files)
}

/// readdir through cookies until the directory ends, the budget runs out or a cookie repeats.
fn read_dir(fs: &Filesystem, dir: u32, entries_left: &mut usize) -> Vec<fs::DirEntry> {
    let mut out = Vec::new();
    let mut cookie = 0u64;
    let mut cookies = BTreeSet::new();
    while *entries_left > 0 {
        let Ok(batch) = fs.readdir(dir, cookie, READDIR_BATCH.min(*entries_left)) else { break };
        let Some(last) = batch.last() else { break };
        cookie = last.next_cookie;
        *entries_left = entries_left.saturating_sub(batch.len());
        out.extend(batch);
        if !cookies.insert(cookie) {
            break;
        }
    }
    out
}

fn read_file(fs: &Filesystem, ino: u32) {
    let mut buf = vec![0u8; 4096];
    let mut offset = 0u64;
    while offset < READ_BYTES_MAX {
        match fs.read(ino, offset, &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => offset += n as u64,
        }
    }
}

/// One of each kind of change, in the directories and files the walk found.
fn modify(fs: &Filesystem, dirs: &[u32], files: &[u32]) {
    if let Ok(new) = fs.create(ROOT_INO, b"fz-new", 0o644, 0, 0) {
        let _ = fs.write(new.ino, 0, &[0x5A; 3000]);
        let _ = fs.setxattr(new.ino, b"user.fz", b"value", SetMode::Any);
    }
    let _ = fs.mkdir(ROOT_INO, b"fz-dir", 0o755, 0, 0);
    if let Some(&dir) = dirs.get(1) {
        let _ = fs.create(dir, b"fz-in-dir", 0o644, 0, 0);
        let _ = fs.rename(dir, b"a", ROOT_INO, b"fz-moved", RenameFlags::default());
        let _ = fs.unlink(dir, b"b");
    }
    if let Some(&dir) = dirs.last() {
        let _ = fs.symlink(dir, b"fz-link", b"../small", 0, 0);
        let _ = fs.rmdir(dir, b"sub");
    }
    for (i, &ino) in files.iter().enumerate().take(4) {
        let _ = fs.write(ino, 100 * i as u64, &[i as u8; 1500]);
        let _ = fs.setxattr(ino, b"user.fz", &[i as u8; 40], SetMode::Any);
        if let Ok(attr) = fs.getattr(ino) {
            let _ = fs.truncate(ino, attr.size.min(1 << 20) / 2);
        }
    }
    let _ = fs.unlink(ROOT_INO, b"small");
    let _ = fs.removexattr(ROOT_INO, b"user.nothing");
}

// ---------------------------------------------------------------------------------------------
// Building the base images

fn build(name: &'static str, variant: usize) -> BaseImage {
    let dev = Arc::new(MemDevice::new(IMAGE_BYTES as u64));
    let mut features = Features::default();
    if variant == 1 {
        features.edit("^metadata_csum").expect("known feature");
    }
    if variant == 3 {
        features.edit("inline_data").expect("known feature");
    }
    let options = MkfsOptions {
        block_size: BLOCK_SIZE,
        inode_size: 256,
        journal_blocks: Some(1024),
        features,
        uuid: Some(UUID),
        hash_seed: Some(*b"quill-fuzz-hash!"),
        now: Some(1_700_000_000),
        device_zeroed: true,
        ..Default::default()
    };
    fs::mkfs::mkfs(dev.as_ref(), &options).expect("mkfs of the base image");
    let shared: Arc<dyn BlockDevice> = dev.clone();
    let fs = Filesystem::open(shared.clone(), MountOptions::default()).expect("open new image");
    populate(&fs).expect("populate the base image");
    fs.unmount().expect("unmount the base image");
    if variant == 2 {
        let fs = Filesystem::open(shared.clone(), MountOptions::default()).expect("reopen");
        dirty(&fs).expect("changes for the journal");
        fs.crash();
    }
    let (superblock, metadata_blocks) = metadata_blocks(&shared);
    BaseImage { name, bytes: dev.snapshot(), superblock, metadata_blocks }
}

/// The name of the `i`th entry of the htree directory.
pub fn htree_name(i: usize) -> String {
    format!("name-{i:03}-{}", "x".repeat(37))
}

fn populate(fs: &Filesystem) -> fs::error::Result<()> {
    let small = fs.create(ROOT_INO, b"small", 0o644, 1000, 1000)?;
    fs.write(small.ino, 0, b"a small file\n")?;
    fs.setxattr(small.ino, b"user.in-inode", b"short value", SetMode::Create)?;
    let multi = fs.create(ROOT_INO, b"multi", 0o644, 0, 0)?;
    let data: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
    fs.write(multi.ino, 0, &data)?;
    fs.setxattr(multi.ino, b"user.in-block", &[0xB1; 300], SetMode::Create)?;
    fs.setxattr(multi.ino, b"trusted.second", &[0xB2; 100], SetMode::Create)?;
    // One-block extents with holes between them: more than the root's 4 slots, so depth 1.
    let deep = fs.create(ROOT_INO, b"deep", 0o644, 0, 0)?;
    for i in 0..8u64 {
        fs.write(deep.ino, 2 * i * u64::from(BLOCK_SIZE), &[i as u8 + 1; 100])?;
    }
    let dir = fs.mkdir(ROOT_INO, b"dir", 0o755, 0, 0)?;
    for name in [&b"a"[..], b"b", b"c"] {
        let file = fs.create(dir.ino, name, 0o600, 0, 0)?;
        fs.write(file.ino, 0, name)?;
    }
    let sub = fs.mkdir(dir.ino, b"sub", 0o755, 0, 0)?;
    fs.create(sub.ino, b"leaf", 0o644, 0, 0)?;
    let htree = fs.mkdir(ROOT_INO, b"htree", 0o755, 0, 0)?;
    let target = fs.create(htree.ino, b"target", 0o644, 0, 0)?;
    for i in 0..HTREE_NAMES {
        fs.link(target.ino, htree.ino, htree_name(i).as_bytes())?;
    }
    fs.symlink(ROOT_INO, b"fast_link", b"small", 0, 0)?;
    let slow_target = format!("/{}", "s".repeat(99));
    fs.symlink(ROOT_INO, b"slow_link", slow_target.as_bytes(), 0, 0)?;
    Ok(())
}

/// Committed but not checkpointed changes for the needs-recovery variant.
fn dirty(fs: &Filesystem) -> fs::error::Result<()> {
    let file = fs.create(ROOT_INO, b"after-crash", 0o644, 0, 0)?;
    fs.write(file.ino, 0, &[0xC7; 2500])?;
    let dir = fs.resolve("/dir")?;
    fs.unlink(dir, b"b")?;
    let multi = fs.resolve("/multi")?;
    fs.setxattr(multi, b"user.in-block", &[0xB3; 200], SetMode::Replace)?;
    fs.sync()?;
    let htree = fs.resolve("/htree")?;
    fs.unlink(htree, htree_name(3).as_bytes())?;
    fs.sync()
}

/// The metadata blocks of an image (see the module documentation) and its superblock.
fn metadata_blocks(dev: &Arc<dyn BlockDevice>) -> (Superblock, Vec<(u64, MetaKind)>) {
    let image = Ext4Image::open(dev.clone()).expect("open the base image");
    let sb = image.superblock().clone();
    // A block listed twice keeps its first kind: the more specific ones are inserted first.
    let mut blocks = std::collections::BTreeMap::new();
    blocks.insert(sb.superblock_block(), MetaKind::Superblock);
    let per_desc_block = sb.block_size() / sb.desc_size() as u32;
    for nr in 0..sb.group_desc_blocks() {
        let first_group = nr * per_desc_block;
        blocks.insert(sb.group_desc_block(nr), MetaKind::Descriptors { first_group });
    }
    let per_block = u64::from(sb.block_size()) / u64::from(sb.inode_size);
    for ino in 1..=sb.inodes_count {
        let Ok(inode) = image.read_inode(ino) else { continue };
        if inode.mode == 0 && inode.links_count == 0 {
            continue;
        }
        let group = (ino - 1) / sb.inodes_per_group;
        let index = u64::from((ino - 1) % sb.inodes_per_group);
        let table = image.group_descs()[group as usize].inode_table;
        let first_ino = ino - (index % per_block) as u32;
        blocks.entry(table + index / per_block).or_insert(MetaKind::InodeTable { first_ino });
        if inode.file_acl != 0 {
            blocks.entry(inode.file_acl).or_insert(MetaKind::Xattr);
        }
        if ino == sb.journal_inum || !inode.uses_extents() {
            continue;
        }
        let seed = inode_csum_seed(&sb, ino, inode.generation);
        tree_blocks(&image, &inode.block, seed, &mut blocks);
        let kind = if inode.is_dir() { MetaKind::Directory { seed } } else { MetaKind::Other };
        if let (true, Ok(extents)) =
            (inode.is_dir() || inode.is_symlink(), image.extents(ino, &inode))
        {
            for extent in extents {
                for block in extent.start..extent.start + u64::from(extent.len) {
                    blocks.entry(block).or_insert(kind);
                }
            }
        }
    }
    for desc in image.group_descs() {
        for block in [desc.block_bitmap, desc.inode_bitmap, desc.inode_table] {
            blocks.entry(block).or_insert(MetaKind::Other);
        }
    }
    if let Ok(location) = image.journal_location() {
        for block in (0..JOURNAL_LOG_BLOCKS).filter_map(|b| location.fs_block(b)) {
            blocks.entry(block).or_insert(MetaKind::Other);
        }
    }
    (sb, blocks.into_iter().collect())
}

/// The extent-tree blocks below the root `node` of the inode whose checksum seed is `seed`.
fn tree_blocks(
    image: &Ext4Image,
    node: &[u8],
    seed: u32,
    blocks: &mut std::collections::BTreeMap<u64, MetaKind>,
) {
    let Ok((_, ExtentEntries::Index(indexes))) = parse_extent_node(node) else { return };
    for index in indexes {
        if blocks.insert(index.leaf, MetaKind::ExtentTree { seed }).is_none() {
            if let Ok(child) = image.read_block(index.leaf) {
                tree_blocks(image, &child, seed, blocks);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_images_open_and_hold_what_the_walk_needs() {
        let images = BaseImage::get();
        for base in images {
            let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::from_bytes(base.bytes.clone()));
            let image = Ext4Image::open(dev.clone()).unwrap();
            let needs_recovery = image.superblock().needs_recovery();
            assert_eq!(needs_recovery, base.name == "needs-recovery", "{}", base.name);
            assert!(base.metadata_blocks.len() > 40, "{}: {:?}", base.name, base.metadata_blocks);
            let fs = Filesystem::open(dev, MountOptions::default()).unwrap();
            let (dirs, files) = walk(&fs);
            assert!(dirs.len() >= 4 && files.len() >= 6, "{}: {dirs:?} {files:?}", base.name);
            let htree = fs.resolve("/htree").unwrap();
            assert!(fs.lookup(htree, htree_name(7).as_bytes()).is_ok());
            fs.unmount().unwrap();
        }
        // The htree directory is indexed: its first block is a dx root.
        let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::from_bytes(images[0].bytes.clone()));
        let fs = Filesystem::open(dev.clone(), MountOptions::default()).unwrap();
        let ino = fs.resolve("/htree").unwrap();
        let deep = fs.resolve("/deep").unwrap();
        fs.unmount().unwrap();
        let image = Ext4Image::open(dev).unwrap();
        let inode = image.read_inode(ino).unwrap();
        assert!(inode.flags & ext4::INDEX_FL != 0, "htree directory not indexed");
        let (header, _) = parse_extent_node(&image.read_inode(deep).unwrap().block).unwrap();
        assert_eq!(header.depth, 1, "/deep has no extent tree block");
    }

    #[test]
    fn resealing_intact_metadata_changes_nothing() {
        // Every kind and seed recorded for a block is the one its checksum was made with.
        for base in BaseImage::get().iter().filter(|b| b.superblock.has_metadata_csum()) {
            let mut bytes = base.bytes.clone();
            let all: BTreeSet<usize> = (0..base.metadata_blocks.len()).collect();
            reseal(&mut bytes, base, &all);
            for (i, (block, kind)) in base.metadata_blocks.iter().enumerate() {
                let range = *block as usize * 1024..(*block as usize + 1) * 1024;
                assert!(bytes[range.clone()] == base.bytes[range], "{}: {i} {kind:?}", base.name);
            }
            assert!(bytes == base.bytes, "{}", base.name);
        }
        let kinds: BTreeSet<String> = BaseImage::get()[0]
            .metadata_blocks
            .iter()
            .map(|(_, kind)| format!("{kind:?}").split([' ', '{']).next().unwrap().to_string())
            .collect();
        assert_eq!(kinds.len(), 7, "{kinds:?}");
    }

    #[test]
    fn an_intact_image_input_runs_quickly() {
        let started = std::time::Instant::now();
        for variant in 0..IMAGE_VARIANTS.len() as u8 {
            image(&[variant]);
        }
        println!("three intact inputs in {:?}", started.elapsed());
    }
}
