//! Targets for the ext4 parsers of `ondisk::ext4`. Each documents its input layout; every
//! configuration value comes from [`Input`], so any byte string is a valid input.

use ondisk::ext4::dir::{
    dir_block_checksum_ok, dir_block_csum, dir_rec_len, dir_tail_ok, find_dir_entry,
    insert_dir_entry, pack_dir_block, parse_dir_block, parse_dir_block_records, parse_dots,
    rec_len_from_disk, rec_len_to_disk, remove_dir_entry, replace_dir_entry,
    set_dir_block_checksum, set_dotdot, DirEntry, DIR_BLOCK_SIZE_MAX, DIR_ENTRY_LEN_MIN,
    DIR_TAIL_SIZE, NAME_LEN_MAX,
};
use ondisk::ext4::htree::{
    dx_checksum_ok, dx_csum, dx_hash, dx_node_limit, dx_root_limit, encode_dx_node, encode_dx_root,
    parse_dx_node, parse_dx_root, set_dx_checksum, HTREE_EOF_32BIT,
};
use ondisk::ext4::xattr::{
    encode_inode_xattrs, encode_xattr_block, full_name, name_index_is_whole_name, name_prefix,
    parse_inode_xattrs, parse_xattr_block, set_xattr_block_checksum, split_name,
    xattr_block_checksum, xattr_block_checksum_ok, xattr_block_hash, xattr_block_hashes_ok,
    xattr_entry_hash, xattr_entry_hash_signed, XattrEntry, XATTR_BLOCK_SIZE_MAX,
};
use ondisk::ext4::{
    bitmap_checksum, extent_block_checksum_ok, feature, group_desc_checksum,
    group_desc_checksum_ok, inode_checksum_ok, inode_csum_seed, parse_extent_node,
    set_group_desc_checksum, set_inode_checksum, set_superblock_checksum, ExtentEntries,
    ExtentHeader, GroupDesc, Inode, Superblock, DESC_SIZE_MAX, INODE_BLOCK_SIZE, SUPERBLOCK_SIZE,
};

use crate::input::Input;
use crate::samples;

/// `superblock`: the input is the 1024 superblock bytes (more are ignored). Parsed as given and
/// again with `s_checksum` resealed, so that mutations reach the geometry checks; whatever
/// parses must keep its geometry arithmetic panic-free and encode back to the bytes it came
/// from.
pub fn superblock(data: &[u8]) {
    check_superblock(data);
    if let Some(raw) = data.first_chunk::<SUPERBLOCK_SIZE>() {
        let mut raw = *raw;
        set_superblock_checksum(&mut raw);
        check_superblock(&raw);
    }
}

fn check_superblock(bytes: &[u8]) {
    let Ok(sb) = Superblock::parse(bytes) else { return };
    let groups = sb.group_count();
    let _ = (sb.block_size(), sb.desc_size(), sb.csum_seed(), sb.effective_hash_version());
    let _ = (sb.superblock_block(), sb.unsupported_incompat(), sb.needs_recovery());
    let _ = feature::feature_list(sb.feature_compat, sb.feature_incompat, sb.feature_ro_compat);
    let desc_blocks = sb.group_desc_blocks();
    // Every descriptor block of a huge table would take long; the arithmetic is the same.
    for nr in (0..desc_blocks.min(64)).chain(desc_blocks.saturating_sub(64)..desc_blocks) {
        let _ = sb.group_desc_block(nr);
    }
    for group in (0..groups.min(64)).chain(groups.saturating_sub(64)..groups) {
        let _ = (sb.group_has_superblock(group), sb.group_first_block(group));
    }
    let encoded = sb.encode();
    assert_eq!(encoded, &bytes[..SUPERBLOCK_SIZE], "superblock does not encode to its bytes");
    let again = Superblock::parse(&encoded).expect("encoded superblock parses");
    assert!(again == sb, "superblock changed through encode and parse");
}

/// `group_desc`: `[superblock config u8][group u32][desc size selector u16][descriptor bytes]`.
/// The descriptor is parsed at 32 and 64 bytes, at the superblock's size and at a size from
/// the input (most of them invalid); what parses must re-encode to the same value, and a
/// resealed descriptor must pass its checksum.
pub fn group_desc(data: &[u8]) {
    let mut input = Input::new(data);
    let sb = samples::superblock(input.u8());
    let group = input.u32();
    let odd_size = usize::from(input.u16() % (DESC_SIZE_MAX + 8));
    let bytes = input.rest();
    for desc_size in [32, 64, sb.desc_size(), odd_size, 128, 1024] {
        let Ok(desc) = GroupDesc::parse(bytes, desc_size) else { continue };
        let mut raw = bytes[..desc_size].to_vec();
        desc.encode_into(&mut raw, desc_size);
        assert_eq!(raw, &bytes[..desc_size], "descriptor does not encode to its bytes");
        let mut fresh = vec![0u8; desc_size];
        desc.encode_into(&mut fresh, desc_size);
        assert_eq!(GroupDesc::parse(&fresh, desc_size).ok(), Some(desc), "descriptor round trip");
    }
    let _ = group_desc_checksum(sb, group, bytes);
    let _ = group_desc_checksum_ok(sb, group, bytes);
    let _ = bitmap_checksum(sb, bytes);
    if bytes.len() >= sb.desc_size() {
        let mut sealed = bytes.to_vec();
        set_group_desc_checksum(sb, group, &mut sealed);
        assert!(group_desc_checksum_ok(sb, group, &sealed), "resealed descriptor fails");
    }
}

/// `inode`: `[superblock config u8][ino u32][record bytes]`. The record is parsed as given and
/// cut or zero-padded to the superblock's inode size (as the file system reads it); a parsed
/// record must re-encode to the same inode, a resealed record must pass its checksum, and the
/// in-inode xattr area and extent root are parsed (xattrs round-tripped too).
pub fn inode(data: &[u8]) {
    let mut input = Input::new(data);
    let sb = samples::superblock(input.u8());
    let ino = input.u32();
    let bytes = input.rest();
    let _ = Inode::parse(bytes);
    let inode_size = usize::from(sb.inode_size);
    let mut record = bytes[..bytes.len().min(inode_size)].to_vec();
    record.resize(inode_size, 0);
    let _ = inode_checksum_ok(sb, ino, &record);
    let _ = inode_checksum_ok(sb, ino, bytes);
    let mut sealed = record.clone();
    set_inode_checksum(sb, ino, &mut sealed);
    assert!(inode_checksum_ok(sb, ino, &sealed), "resealed inode fails its checksum");
    let Ok(inode) = Inode::parse(&record) else { return };
    let mut encoded = record.clone();
    inode.encode_into(&mut encoded);
    assert_eq!(Inode::parse(&encoded).ok(), Some(inode.clone()), "inode round trip");
    let _ = (inode.blocks_512(sb.block_size()), inode.uses_extents(), inode.file_type());
    let _ = (inode.is_dir(), inode.is_regular(), inode.is_symlink());
    let _ = inode_csum_seed(sb, ino, inode.generation);
    let _ = parse_extent_node(&inode.block);
    let area = &record[inode.xattr_area_range(inode_size)];
    check_inode_xattrs(area);
}

/// The in-inode xattr area: parse, and re-encode what parsed when the area has the length a
/// real record gives it (a multiple of 4).
fn check_inode_xattrs(area: &[u8]) {
    let Ok(entries) = parse_inode_xattrs(area) else { return };
    for entry in &entries {
        check_xattr_names(entry);
    }
    if !area.len().is_multiple_of(4) {
        return;
    }
    let encoded = encode_inode_xattrs(&entries, area.len())
        .expect("xattrs that fit an area fit it again when encoded");
    assert_eq!(parse_inode_xattrs(&encoded).ok(), Some(entries), "in-inode xattr round trip");
}

fn check_xattr_names(entry: &XattrEntry) {
    let full = full_name(entry.name_index, &entry.name);
    let _ = (split_name(&full), name_prefix(entry.name_index));
    let _ = name_index_is_whole_name(entry.name_index);
    let _ = xattr_entry_hash(&entry.name, &entry.value);
    let _ = xattr_entry_hash_signed(&entry.name, &entry.value);
}

/// `extent_node`: `[superblock config u8][ino u32][generation u32][node bytes]`. The node is
/// parsed whole (a tree block) and as its first 60 bytes (an `i_block` root); a parsed node must
/// re-encode to the same header and entries, and a resealed tree block must pass its checksum.
pub fn extent_node(data: &[u8]) {
    let mut input = Input::new(data);
    let sb = samples::superblock(input.u8());
    let ino = input.u32();
    let generation = input.u32();
    let bytes = input.rest();
    let _ = extent_block_checksum_ok(sb, ino, generation, bytes);
    let _ = ExtentHeader::slots_for(bytes.len());
    let root = &bytes[..bytes.len().min(INODE_BLOCK_SIZE)];
    for node in [bytes, root] {
        let Ok((header, entries)) = parse_extent_node(node) else { continue };
        let _ = (entries.first_logical(), entries.is_empty(), header.tail_offset());
        if let ExtentEntries::Leaf(extents) = &entries {
            for extent in extents {
                let _ = extent.logical_end();
            }
        }
        let mut encoded = node.to_vec();
        header.encode_node(&entries, &mut encoded);
        assert_eq!(
            parse_extent_node(&encoded).ok(),
            Some((header, entries.clone())),
            "extent node round trip"
        );
        let seed = inode_csum_seed(sb, ino, generation);
        let _ = (header.block_checksum(seed, node), header.stored_block_checksum(node));
        if header.tail_offset() + 4 <= encoded.len() {
            header.seal_block(seed, &mut encoded);
            assert!(
                extent_block_checksum_ok(sb, ino, generation, &encoded),
                "sealed extent block fails its checksum"
            );
        }
    }
}

/// `dir_block`: `[flags u8][inode seed u32][new inode u32][name len u8][name][block bytes]`.
/// Flags bit 0: the block has a checksum tail. The block is parsed with and without a tail;
/// then, on copies, a new entry is inserted, an existing one removed and replaced, ".." set and
/// the block packed and resealed, each leaving a block that parses as expected.
pub fn dir_block(data: &[u8]) {
    let mut input = Input::new(data);
    let flags = input.u8();
    let seed = input.u32();
    let ino = input.u32().max(1);
    let name_len = usize::from(input.u8());
    let name = input.bytes(name_len);
    let block = input.rest();
    let has_tail = flags & 1 != 0;
    let records = parse_dir_block_records(block, has_tail);
    let _ = parse_dir_block_records(block, !has_tail);
    for tail in [false, true] {
        let _ = parse_dir_block(block, tail);
        let _ = find_dir_entry(block, tail, name);
        let _ = find_dir_entry(block, tail, b"..");
    }
    let _ = (parse_dots(block), dir_tail_ok(block), dir_block_checksum_ok(seed, block));
    let _ = dir_block_csum(seed, block);
    if let Ok((_, dotdot)) = parse_dots(block) {
        let mut copy = block.to_vec();
        assert_eq!(set_dotdot(&mut copy, ino).ok(), Some(dotdot.inode), "set_dotdot");
        assert_eq!(parse_dots(&copy).map(|(_, dd)| dd.inode).ok(), Some(ino));
    }
    let Ok(records) = records else { return };
    for record in &records {
        let raw = rec_len_to_disk(record.rec_len, block.len());
        assert_eq!(rec_len_from_disk(raw, block.len()), record.rec_len, "rec_len round trip");
    }
    let live = live_entries(&records);
    if (1..=NAME_LEN_MAX).contains(&name.len()) {
        check_insert(block, has_tail, name, ino, live.len());
    }
    if let Some(victim) = live.first() {
        let mut copy = block.to_vec();
        let removed = remove_dir_entry(&mut copy, has_tail, victim.name).expect("parsed before");
        assert_eq!(removed, Some(victim.inode), "remove_dir_entry returns the inode");
        let after = parse_dir_block(&copy, has_tail).expect("a removal leaves a valid block");
        assert_eq!(after.len(), live.len() - 1, "a removal removes one entry");
        let mut copy = block.to_vec();
        let old = replace_dir_entry(&mut copy, has_tail, victim.name, ino, 1).expect("parsed");
        assert_eq!(old, Some(victim.inode), "replace_dir_entry returns the old inode");
        assert!(parse_dir_block(&copy, has_tail).is_ok(), "a replacement leaves a valid block");
    }
    check_pack(block, has_tail, &live);
    if has_tail {
        let mut copy = block.to_vec();
        set_dir_block_checksum(seed, &mut copy);
        assert!(dir_block_checksum_ok(seed, &copy), "resealed directory block fails");
    }
}

fn live_entries<'a>(records: &[DirEntry<'a>]) -> Vec<DirEntry<'a>> {
    records.iter().filter(|r| r.is_live()).copied().collect()
}

fn check_insert(block: &[u8], has_tail: bool, name: &[u8], ino: u32, live_before: usize) {
    let mut copy = block.to_vec();
    match insert_dir_entry(&mut copy, has_tail, name, ino, 1).expect("parsed before") {
        true => {
            let after = parse_dir_block(&copy, has_tail).expect("an insert leaves a valid block");
            assert_eq!(after.len(), live_before + 1, "an insert adds one entry");
            assert!(after.iter().any(|e| e.name == name && e.inode == ino), "inserted entry");
        }
        false => assert_eq!(copy, block, "a failed insert changed the block"),
    }
}

fn check_pack(block: &[u8], has_tail: bool, live: &[DirEntry<'_>]) {
    let tail = if has_tail { DIR_TAIL_SIZE } else { 0 };
    let len = block.len();
    if !len.is_multiple_of(4) || !(2 * DIR_ENTRY_LEN_MIN + tail..=DIR_BLOCK_SIZE_MAX).contains(&len)
    {
        return;
    }
    let entries: Vec<(&[u8], u32, u8)> =
        live.iter().map(|e| (e.name, e.inode, e.file_type)).collect();
    let mut copy = block.to_vec();
    let needed: usize = live.iter().map(|e| dir_rec_len(e.name.len())).sum();
    let packed = pack_dir_block(&mut copy, has_tail, &entries);
    assert_eq!(packed, needed <= len - tail, "pack_dir_block fits what fits");
    let after = parse_dir_block(&copy, has_tail).expect("a packed block parses");
    if packed {
        let got: Vec<(&[u8], u32, u8)> =
            after.iter().map(|e| (e.name, e.inode, e.file_type)).collect();
        assert_eq!(got, entries, "packed entries differ");
    } else {
        assert!(after.is_empty(), "an overfull pack leaves an empty block");
    }
}

/// `htree`: `[flags u8][inode seed u32][hash seed 4 x u32][name len u8][name][block bytes]`.
/// Flags bit 0: metadata_csum (the dx_tail). The block is parsed as a root and as a node (with
/// and without the tail); what parses is re-encoded and must parse back the same, and resealed
/// must pass its checksum. The name is hashed with every hash version.
pub fn htree(data: &[u8]) {
    let mut input = Input::new(data);
    let has_csum = input.u8() & 1 != 0;
    let seed = input.u32();
    let hash_seed = [input.u32(), input.u32(), input.u32(), input.u32()];
    let name_len = usize::from(input.u8());
    let name = input.bytes(name_len);
    let block = input.rest();
    for version in 0..=8u8 {
        let Ok((major, minor)) = dx_hash(name, version, &hash_seed) else { continue };
        assert_eq!(major & 1, 0, "hash {major:#x} has the collision bit");
        assert_ne!(major, HTREE_EOF_32BIT << 1, "hash is the EOF value");
        if version == 0 || version == 3 {
            assert_eq!(minor, 0, "legacy hashes have no minor hash");
        }
    }
    let _ = (dx_root_limit(block.len(), has_csum), dx_node_limit(block.len(), has_csum));
    let _ = (dx_csum(seed, block), dx_checksum_ok(seed, block));
    for csum in [has_csum, !has_csum] {
        if let Ok(root) = parse_dx_root(block, csum) {
            let mut copy = vec![0u8; block.len()];
            encode_dx_root(&mut copy, &root, csum);
            assert_eq!(parse_dx_root(&copy, csum).ok(), Some(root), "dx root round trip");
            if csum {
                set_dx_checksum(seed, &mut copy);
                assert!(dx_checksum_ok(seed, &copy), "resealed dx root fails");
            }
        }
        if let Ok(entries) = parse_dx_node(block, csum) {
            let mut copy = vec![0u8; block.len()];
            encode_dx_node(&mut copy, &entries, csum);
            assert_eq!(parse_dx_node(&copy, csum).ok(), Some(entries), "dx node round trip");
            if csum {
                set_dx_checksum(seed, &mut copy);
                assert!(dx_checksum_ok(seed, &copy), "resealed dx node fails");
            }
        }
    }
}

/// `xattr_block`: `[fs checksum seed u32][block number u64][block bytes]`. The block is parsed
/// as an xattr block and as an in-inode area; a parsed block (of a length a block can have) is
/// re-encoded, must hold the same attributes in the kernel's order with correct hashes, and
/// must pass its checksum once resealed.
pub fn xattr_block(data: &[u8]) {
    let mut input = Input::new(data);
    let seed = input.u32();
    let block_nr = input.u64();
    let block = input.rest();
    let _ = (xattr_block_hashes_ok(block), xattr_block_checksum(seed, block_nr, block));
    let _ = xattr_block_checksum_ok(seed, block_nr, block);
    check_inode_xattrs(block);
    let Ok((header, entries)) = parse_xattr_block(block) else { return };
    for entry in &entries {
        check_xattr_names(entry);
    }
    let _ = xattr_block_hash(entries.iter().map(|e| xattr_entry_hash(&e.name, &e.value)));
    if !block.len().is_multiple_of(4) || block.len() > XATTR_BLOCK_SIZE_MAX {
        return;
    }
    let mut encoded = encode_xattr_block(&entries, header.refcount, block.len())
        .expect("attributes that fit a block fit it again when encoded");
    let (again_header, again) = parse_xattr_block(&encoded).expect("encoded xattr block parses");
    assert_eq!(again_header.refcount, header.refcount, "refcount changed");
    let mut sorted = entries.clone();
    sorted.sort_by(|a, b| {
        (a.name_index, a.name.len(), &a.name).cmp(&(b.name_index, b.name.len(), &b.name))
    });
    assert_eq!(again, sorted, "xattr block round trip");
    assert!(xattr_block_hashes_ok(&encoded), "encoded xattr block has wrong hashes");
    set_xattr_block_checksum(seed, block_nr, &mut encoded);
    assert!(xattr_block_checksum_ok(seed, block_nr, &encoded), "resealed xattr block fails");
}
