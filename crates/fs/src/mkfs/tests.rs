use super::*;
use blockdev::memory::MemDevice;

fn options(size: u64, bs: u32) -> MkfsOptions {
    MkfsOptions {
        block_size: bs,
        size_bytes: Some(size),
        uuid: Some([7; 16]),
        hash_seed: Some([9; 16]),
        now: Some(1_700_000_000),
        device_zeroed: true,
        ..MkfsOptions::default()
    }
}

#[test]
fn used_blocks_coalesce_and_answer_free_queries() {
    let mut used = UsedBlocks::default();
    used.insert(10, 5);
    used.insert(15, 5);
    used.insert(30, 1);
    assert_eq!(used.runs.len(), 2);
    assert_eq!(used.first_used_in(0, 10), None);
    assert_eq!(used.first_used_in(0, 11), Some(10));
    assert_eq!(used.first_used_in(12, 13), Some(12));
    assert_eq!(used.next_free(12), 20);
    assert_eq!(used.first_free_in(30, 30), None);
    assert_eq!(used.count_in(0, 100), 11);
    assert_eq!(used.overlapping(12, 31).collect::<Vec<_>>(), vec![(12, 20), (30, 31)]);
    assert_eq!(used.first_used_in(20, 30), None);
}

#[test]
fn set_bits_fills_partial_and_whole_bytes() {
    let mut bm = vec![0u8; 4];
    set_bits(&mut bm, 3, 21);
    assert_eq!(bm, vec![0xF8, 0xFF, 0x1F, 0]);
}

#[test]
fn sparse_super_backup_groups_are_powers_of_three_five_seven() {
    let with: Vec<u32> = (0..130).filter(|&g| group_has_super(g, true)).collect();
    assert_eq!(with, vec![0, 1, 3, 5, 7, 9, 25, 27, 49, 81, 125]);
    assert!(group_has_super(4, false));
}

#[test]
fn default_geometry_matches_mke2fs_for_64_mib_with_4k_blocks() {
    let g = Geometry::plan(&options(64 << 20, 4096), 64 << 20).unwrap();
    assert_eq!((g.blocks_count, g.groups, g.inodes_per_group), (16384, 1, 16384));
    assert_eq!((g.reserved_gdt_blocks, g.journal_blocks, g.reserved_blocks), (7, 1024, 819));
}

#[test]
fn feature_edit_refuses_unknown_features_by_name() {
    let mut f = Features::default();
    f.edit("^metadata_csum,orphan_file").unwrap();
    assert!(!f.ro_compat(feature::RO_COMPAT_METADATA_CSUM));
    assert!(f.compat(feature::COMPAT_ORPHAN_FILE));
    let err = f.edit("casefold").unwrap_err().to_string();
    assert!(err.contains("casefold"), "{err}");
}

#[test]
fn mkfs_on_a_memory_device_opens_as_an_ext4_image() {
    let dev = std::sync::Arc::new(MemDevice::new(32 << 20));
    let report = mkfs(dev.as_ref(), &options(32 << 20, 1024)).unwrap();
    assert_eq!(report.block_size, 1024);
    let image = crate::Ext4Image::open(dev).unwrap();
    assert_eq!(image.superblock().blocks_count, report.blocks_count);
    assert_eq!(image.journal_location().unwrap().len_blocks(), report.journal_blocks);
}

#[test]
fn uuid_text_round_trips() {
    let uuid = parse_uuid("11111111-2222-3333-4444-555555555555").unwrap();
    assert_eq!(format_uuid(&uuid), "11111111-2222-3333-4444-555555555555");
    assert!(parse_uuid("xyz").is_none());
}
