//! Seed inputs for every target, in each target's input layout: real structures taken from the
//! base images of the `image` target (made by quill's mkfs and file operations) and from the
//! journal of the crashed one, plus log blocks of every format made with quill's encoders and
//! fast-commit areas built record by record.
//!
//! `cargo run -p quill-fuzzing --example seed_corpus -- fuzz/corpus` writes them to
//! `fuzz/corpus/<target>/`; the CI test (`tests/targets.rs`) uses them directly. quill stamps
//! inodes with the clock and draws inode generations from it, so regenerating changes the bytes
//! (times, generations, checksums) of the inode, directory and extent seeds, not what they are.

use std::sync::Arc;

use blockdev::memory::MemDevice;
use blockdev::BlockDevice;
use fs::Ext4Image;
use journal::recovery::read_log_block;
use ondisk::ext4::htree::parse_dx_root;
use ondisk::ext4::{inode_csum_seed, Extent, Inode, Superblock};
use ondisk::jbd2::fast_commit::{append_tail, FcDentryOp, FcRecord, FC_TL_SIZE};
use ondisk::jbd2::{
    encode_commit_block, encode_revoke_blocks, parse_header, ChecksumVersion, DescriptorBuilder,
    JournalSuperblock, LogFormat,
};
use ondisk::{crc::crc32c_raw, Tid};

use crate::image_target::{htree_name, BaseImage};
use crate::samples::UUID;

/// One seed input.
#[derive(Debug, Clone)]
pub struct Seed {
    pub target: &'static str,
    /// A file name, unique within the target.
    pub name: String,
    pub bytes: Vec<u8>,
}

/// Every seed of every target.
pub fn seeds() -> Vec<Seed> {
    let mut out = Vec::new();
    for (variant, base) in BaseImage::get().iter().enumerate() {
        image_seeds(&mut out, variant, base);
        structure_seeds(&mut out, base);
    }
    journal_seeds(&mut out, &BaseImage::get()[2]);
    log_block_seeds(&mut out);
    fast_commit_seeds(&mut out);
    indirect_map_seeds(&mut out);
    inline_data_seeds(&mut out);
    quota_tree_seeds(&mut out);
    out
}

/// `quota_tree` inputs: the user file mke2fs makes (id 0), and a group file of 30 ids (three
/// data blocks, the free-entry list in use), each with a new id to insert.
fn quota_tree_seeds(out: &mut Vec<Seed>) {
    use ondisk::ext4::quota::{DiskDquot, MemQuotaFile, QuotaType};
    let usage = |id: u32| DiskDquot {
        id,
        curspace: 1024 * u64::from(id),
        curinodes: 2,
        ..Default::default()
    };
    let cases: [(&str, u8, Vec<u32>, u32); 2] = [
        ("mke2fs-user", 0, vec![0], 1000),
        ("group-30", 1, (0..30).map(|i| i * 37).collect(), 70_000),
    ];
    for (name, kind, ids, new_id) in cases {
        let entries: Vec<DiskDquot> = ids.into_iter().map(usage).collect();
        let file = MemQuotaFile::create(QuotaType::ALL[usize::from(kind)], &entries).expect("made");
        push(out, "quota_tree", name.into(), &[&[kind], &new_id.to_le_bytes(), &file.bytes()]);
    }
}

/// `inline_data` inputs: a 100-byte file (60 in i_block, 40 in the value), and directories
/// of a few names (i_block only) and of nine (the value too), with and without a tail.
fn inline_data_seeds(out: &mut Vec<Seed>) {
    use ondisk::ext4::inline::{encode_dir, split_file_bytes, InlineEntry};
    let bytes: Vec<u8> = (0..100u8).collect();
    let (i_block, value) = split_file_bytes(&bytes);
    let header = |selector: u8, tail: u8, size: u16, value: &[u8]| {
        [
            vec![selector, tail],
            size.to_le_bytes().to_vec(),
            (value.len() as u16).to_le_bytes().to_vec(),
        ]
        .concat()
    };
    push(out, "inline_data", "file-100".into(), &[&header(0, 0, 100, &value), &i_block, &value]);
    for (count, tail) in [(3u32, 0u8), (9, 1)] {
        let entries: Vec<InlineEntry> = (0..count)
            .map(|i| InlineEntry {
                name: format!("name-{i}").into_bytes(),
                inode: 20 + i,
                file_type: 1,
            })
            .collect();
        let (i_block, value) = encode_dir(2, &entries, 0, 1024).expect("fits");
        let size = (60 + value.len()) as u16;
        let name = format!("dir-{count}");
        push(out, "inline_data", name, &[&header(2, tail, size, &value), &i_block, &value]);
    }
}

/// `indirect_map` inputs: hand-built ext2/ext3 maps with 1 KiB and 4 KiB blocks, direct
/// blocks, holes, and a chain of indirect blocks down to the single-, double- and
/// triple-indirect levels (the walker's own unit test has the same shape).
fn indirect_map_seeds(out: &mut Vec<Seed>) {
    for (selector, block_size) in [(0u8, 1024usize), (2, 4096)] {
        let per = block_size as u32 / 4;
        let block = |pointers: &[(usize, u32)]| {
            let mut b = vec![0u8; block_size];
            for &(i, p) in pointers {
                b[i * 4..i * 4 + 4].copy_from_slice(&p.to_le_bytes());
            }
            b
        };
        let mut root = [0u8; 60];
        for (slot, pointer) in [(0usize, 100u32), (1, 101), (12, 200), (13, 250), (14, 300)] {
            root[slot * 4..slot * 4 + 4].copy_from_slice(&pointer.to_le_bytes());
        }
        let blocks: [(u16, Vec<u8>); 6] = [
            (200, block(&[(0, 500), (28, 600)])),
            (250, block(&[(1, 251)])),
            (251, block(&[(3, 650)])),
            (300, block(&[(2, 301)])),
            (301, block(&[(3, 302)])),
            (302, block(&[(4, 700)])),
        ];
        let queries =
            [2u32, 12 + per + per + 3, 12 + per + per * per + 2 * per * per + 3 * per + 4];
        let mut parts: Vec<Vec<u8>> = vec![vec![selector], (2000u16 - 16).to_le_bytes().to_vec()];
        parts.push(vec![queries.len() as u8]);
        parts.extend(queries.iter().map(|q| q.to_le_bytes().to_vec()));
        parts.push(root.to_vec());
        for (number, bytes) in &blocks {
            parts.push(number.to_le_bytes().to_vec());
            parts.push(bytes.clone());
        }
        let parts: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        push(out, "indirect_map", format!("chain-{block_size}"), &parts);
    }
}

fn push(out: &mut Vec<Seed>, target: &'static str, name: String, parts: &[&[u8]]) {
    out.push(Seed { target, name, bytes: parts.concat() });
}

/// The [`crate::samples`] configuration byte of a superblock like `sb`.
fn config_for(sb: &Superblock) -> u8 {
    let mut config = u8::from(sb.has_gdt_csum()) | (u8::from(sb.has_metadata_csum()) << 1);
    config |= u8::from(sb.is_64bit()) << 2;
    config |= u8::from(sb.block_size() == 4096) << 3;
    config |= ((sb.inode_size / 128).trailing_zeros() as u8 & 3) << 4;
    config
}

fn image_seeds(out: &mut Vec<Seed>, variant: usize, base: &BaseImage) {
    let v = variant as u8;
    push(out, "image", format!("{}-intact", base.name), &[&[v]]);
    // The superblock's free-blocks count, an inode's size and a directory's first record.
    for (i, region) in [0u8, 9, 17, 30].into_iter().enumerate() {
        let patch = [region, 0x0C, 0x00, 3, 0xFF, 0xFF, 0x00, 0x7F];
        push(out, "image", format!("{}-patch-{i}", base.name), &[&[v], &patch]);
        // The same damage with the checksums resealed (bit 7 of the variant byte).
        push(out, "image", format!("{}-resealed-{i}", base.name), &[&[v | 0x80], &patch]);
    }
}

fn structure_seeds(out: &mut Vec<Seed>, base: &BaseImage) {
    let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::from_bytes(base.bytes.clone()));
    let image = Ext4Image::open(dev).expect("base image opens");
    let sb = image.superblock().clone();
    let config = [config_for(&sb)];
    let tag = base.name;
    push(out, "superblock", tag.to_string(), &[&base.bytes[1024..2048]]);
    let gdt = image.read_block(sb.group_desc_block(0)).expect("descriptor block");
    let desc_size = sb.desc_size();
    push(out, "group_desc", format!("{tag}-g0"), &[&config, &0u32.to_le_bytes(), &[0, 0], &gdt]);
    let one = &gdt[..desc_size];
    push(out, "group_desc", format!("{tag}-g0-alone"), &[&config, &[0; 4], &[64, 0], one]);
    let fs_seed = sb.csum_seed();
    for ino in 1..=sb.inodes_count.min(64) {
        let Ok(inode) = image.read_inode(ino) else { continue };
        if inode.mode == 0 {
            continue;
        }
        let raw = raw_inode(&base.bytes, &image, &sb, ino);
        push(out, "inode", format!("{tag}-ino{ino}"), &[&config, &ino.to_le_bytes(), &raw]);
        let id = [&config[..], &ino.to_le_bytes(), &inode.generation.to_le_bytes()].concat();
        if inode.uses_extents() {
            push(out, "extent_node", format!("{tag}-ino{ino}-root"), &[&id, &inode.block]);
            for (n, block) in extent_tree_blocks(&image, &inode).iter().enumerate() {
                push(out, "extent_node", format!("{tag}-ino{ino}-tree{n}"), &[&id, block]);
            }
        }
        if inode.file_acl != 0 {
            if let Ok(block) = image.read_block(inode.file_acl) {
                let parts: [&[u8]; 3] =
                    [&fs_seed.to_le_bytes(), &inode.file_acl.to_le_bytes(), &block];
                push(out, "xattr_block", format!("{tag}-ino{ino}"), &parts);
            }
        }
        let area = &raw[inode.xattr_area_range(raw.len())];
        if area.len() >= 4 && area[..4] != [0; 4] {
            push(out, "xattr_block", format!("{tag}-ino{ino}-in-inode"), &[&[0; 12], area]);
        }
        if inode.is_dir() {
            dir_seeds(out, &image, &sb, ino, &inode, tag);
        }
    }
}

fn raw_inode(bytes: &[u8], image: &Ext4Image, sb: &Superblock, ino: u32) -> Vec<u8> {
    let size = usize::from(sb.inode_size);
    let group = ((ino - 1) / sb.inodes_per_group) as usize;
    let index = ((ino - 1) % sb.inodes_per_group) as usize;
    let at = image.group_descs()[group].inode_table as usize * sb.block_size() as usize;
    bytes[at + index * size..at + (index + 1) * size].to_vec()
}

fn extent_tree_blocks(image: &Ext4Image, inode: &Inode) -> Vec<Vec<u8>> {
    use ondisk::ext4::{parse_extent_node, ExtentEntries};
    let Ok((_, ExtentEntries::Index(indexes))) = parse_extent_node(&inode.block) else {
        return Vec::new();
    };
    indexes.iter().filter_map(|index| image.read_block(index.leaf).ok()).collect()
}

fn dir_seeds(
    out: &mut Vec<Seed>,
    image: &Ext4Image,
    sb: &Superblock,
    ino: u32,
    inode: &Inode,
    tag: &str,
) {
    let Ok(extents) = image.extents(ino, inode) else { return };
    let seed = inode_csum_seed(sb, ino, inode.generation).to_le_bytes();
    let flags = [u8::from(sb.has_metadata_csum())];
    let hash_seed: Vec<u8> = sb.hash_seed.iter().flat_map(|w| w.to_le_bytes()).collect();
    let blocks = extents.iter().flat_map(|e| e.start..e.start + u64::from(e.len));
    for (n, nr) in blocks.take(8).enumerate() {
        let Ok(block) = image.read_block(nr) else { continue };
        let name = htree_name(n);
        let name_part = [&[name.len() as u8][..], name.as_bytes()].concat();
        let new_ino = 77u32.to_le_bytes();
        let dir_parts: [&[u8]; 5] = [&flags, &seed, &new_ino, &name_part, &block];
        push(out, "dir_block", format!("{tag}-dir{ino}-{n}"), &dir_parts);
        if n == 0 && parse_dx_root(&block, sb.has_metadata_csum()).is_ok() {
            let parts: [&[u8]; 5] = [&flags, &seed, &hash_seed, &name_part, &block];
            push(out, "htree", format!("{tag}-dir{ino}-{n}"), &parts);
        }
    }
}

/// The journal superblock and log blocks of the crashed image's journal.
fn journal_seeds(out: &mut Vec<Seed>, base: &BaseImage) {
    let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::from_bytes(base.bytes.clone()));
    let image = Ext4Image::open(dev.clone()).expect("base image opens");
    let Ok(location) = image.journal_location() else { return };
    let read = |log_block: u32| {
        let mut block = vec![0u8; location.block_size() as usize];
        read_log_block(&*dev, &location, log_block, &mut block).ok()?;
        Some(block)
    };
    let Some(sb_block) = read(0) else { return };
    let Ok(jsb) = JournalSuperblock::parse(&sb_block) else { return };
    let format = jsb.format();
    let checksum = match format.checksum {
        ChecksumVersion::None => 0,
        ChecksumVersion::V1 => 1,
        ChecksumVersion::V2 => 2,
        ChecksumVersion::V3 => 3,
    };
    let size_bits = match format.block_size {
        2048 => 1,
        4096 => 2,
        _ => 0,
    };
    let selector = [checksum | (u8::from(format.is_64bit) << 2) | (size_bits << 3)];
    push(out, "jbd2", "journal-superblock".to_string(), &[&selector, &sb_block]);
    for log_block in jsb.first..jsb.first + 24 {
        let Some(block) = read(log_block) else { continue };
        if parse_header(&block).is_some() {
            push(out, "jbd2", format!("journal-log{log_block}"), &[&selector, &block]);
        }
    }
}

/// Descriptor, commit and revoke blocks of every tag layout, made by quill's encoders.
fn log_block_seeds(out: &mut Vec<Seed>) {
    let checksums =
        [ChecksumVersion::None, ChecksumVersion::V1, ChecksumVersion::V2, ChecksumVersion::V3];
    for (c, checksum) in checksums.into_iter().enumerate() {
        for is_64bit in [false, true] {
            let selector = [c as u8 | (u8::from(is_64bit) << 2)];
            let format = LogFormat::new(1024, checksum, is_64bit, UUID);
            let name =
                |kind: &str| format!("{kind}-{checksum:?}-{}", if is_64bit { 64 } else { 32 });
            let tid = Tid(0x1234);
            let mut builder = DescriptorBuilder::new(format, tid);
            for i in 0..3u64 {
                let mut logged = vec![i as u8; 1024];
                builder.push(1000 + i, &mut logged);
            }
            push(out, "jbd2", name("descriptor"), &[&selector, &builder.finish()]);
            let v1 = (checksum == ChecksumVersion::V1).then_some(0xABCD_0123);
            let commit = encode_commit_block(&format, tid, 1_700_000_000, 5, v1);
            push(out, "jbd2", name("commit"), &[&selector, &commit]);
            let far = if is_64bit { 0x1_0000_0009 } else { 0xFFFF_FFF0 };
            for block in encode_revoke_blocks(&format, tid, &[7, 8, far]) {
                push(out, "jbd2", name("revoke"), &[&selector, &block]);
            }
        }
    }
}

/// Fast-commit areas: two fast commits in 1 KiB blocks, and one in 256-byte blocks.
fn fast_commit_seeds(out: &mut Vec<Seed>) {
    let raw_inode = [0x11u8; 160];
    let records = [
        FcRecord::Head { features: 0, tid: Tid(9) },
        FcRecord::Inode { ino: 12, raw: &raw_inode },
        FcRecord::AddRange {
            ino: 12,
            extent: Extent { logical: 0, len: 4, start: 3000, unwritten: false },
        },
        FcRecord::AddRange {
            ino: 12,
            extent: Extent { logical: 9, len: 2, start: 3100, unwritten: true },
        },
        FcRecord::Dentry { op: FcDentryOp::Create, parent_ino: 2, ino: 12, name: b"created" },
        FcRecord::Dentry { op: FcDentryOp::Link, parent_ino: 2, ino: 12, name: b"linked" },
        FcRecord::Dentry { op: FcDentryOp::Unlink, parent_ino: 2, ino: 11, name: b"gone" },
        FcRecord::DelRange { ino: 13, logical: 5, len: 7 },
    ];
    for (config, block_size) in [(2u8 | (1 << 2), 1024usize), (1 | (1 << 2), 256)] {
        let mut area = Vec::new();
        let mut crc = 0;
        let mut block = Vec::new();
        for (i, record) in records.iter().enumerate() {
            let mut encoded = Vec::new();
            record.encode(&mut encoded);
            if block.len() + encoded.len() + FC_TL_SIZE > block_size {
                crc = pad_into_area(&mut area, &mut block, block_size, crc);
            }
            block.extend_from_slice(&encoded);
            if i == 4 || i + 1 == records.len() {
                if block.len() + FC_TL_SIZE + 8 > block_size {
                    crc = pad_into_area(&mut area, &mut block, block_size, crc);
                }
                append_tail(&mut block, block_size, crc, Tid(9));
                crc = 0;
                area.append(&mut block);
            }
        }
        let tid = 9u32.to_le_bytes();
        push(out, "fast_commit", format!("two-commits-{block_size}"), &[&[config], &tid, &area]);
    }
    // A block Linux wrote (1 KiB blocks, 256-byte inodes, tid 4).
    let linux = include_bytes!("../../ondisk/src/jbd2/testdata/linux-fast-commit-block.bin");
    push(
        out,
        "fast_commit",
        "linux-6.18".to_string(),
        &[&[2 | (1 << 2)], &4u32.to_le_bytes(), linux],
    );
}

/// Pads `block` to `block_size`, continues the fast-commit crc `crc` over it, moves it to the
/// end of `area` and returns the crc.
fn pad_into_area(area: &mut Vec<u8>, block: &mut Vec<u8>, block_size: usize, crc: u32) -> u32 {
    FcRecord::Pad { len: (block_size - block.len() - FC_TL_SIZE) as u16 }.encode(block);
    let crc = crc32c_raw(crc, block);
    area.append(block);
    crc
}
