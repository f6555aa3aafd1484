//! Behaviour: quill finds the internal journal of images made by the stock `mkfs.ext4`,
//! agrees with `debugfs` about where each journal block lives, toggles needs_recovery in a way
//! `dumpe2fs` and `e2fsck` accept, and turns corrupted metadata into errors.
//!
//! Every test builds its own images with e2fsprogs in a unique temporary directory (removed on
//! drop). Without e2fsprogs the tests print why they skip and return.

mod common;

use common::{Rng, Scratch};

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use blockdev::file::{FileDevice, FileOptions};
use blockdev::BlockDevice;
use fs::{Ext4Image, FsError};
use journal::JournalLocation;
use ondisk::ext4::{self, ExtentEntries};

/// JBD2 superblock magic, big-endian at byte 0 of journal block 0.
const JBD2_MAGIC: u32 = 0xC03B_3998;
/// Offset of `s_maxlen` (journal length in blocks, big-endian) in the JBD2 superblock.
const JBD2_MAXLEN_OFFSET: usize = 0x10;

const TOOLS: [&str; 4] = ["mkfs.ext4", "debugfs", "dumpe2fs", "e2fsck"];

fn run(tool: &str, args: &[&str]) -> std::process::Output {
    let out = Command::new(tool).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{tool} {args:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `mkfs.ext4 -q -F [options] IMG SIZE` into a fresh image in `dir`.
fn mkfs(dir: &Scratch, size: &str, options: &[&str]) -> PathBuf {
    let img = dir.path("fs.img");
    let img_str = img.to_str().unwrap();
    let mut args = vec!["-q", "-F"];
    args.extend_from_slice(options);
    args.extend_from_slice(&[img_str, size]);
    run("mkfs.ext4", &args);
    img
}

fn open(img: &Path, read_only: bool) -> Ext4Image {
    let dev = FileDevice::open(img, FileOptions { read_only, ..FileOptions::default() }).unwrap();
    Ext4Image::open(Arc::new(dev)).unwrap()
}

fn try_open(img: &Path) -> Result<Ext4Image, FsError> {
    let dev = FileDevice::open(img, FileOptions::read_only()).unwrap();
    Ext4Image::open(Arc::new(dev))
}

/// The physical block debugfs reports for journal block `n`.
fn debugfs_bmap(img: &Path, n: u32) -> u64 {
    let out = run("debugfs", &["-R", &format!("bmap <8> {n}"), img.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout.trim().parse().unwrap_or_else(|_| panic!("debugfs bmap <8> {n} printed {stdout:?}"))
}

fn dumpe2fs_features(img: &Path) -> String {
    let out = run("dumpe2fs", &["-h", img.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("Filesystem features:"))
        .unwrap_or_else(|| panic!("no features line in {stdout}"))
        .to_string()
}

fn e2fsck_clean(img: &Path) {
    run("e2fsck", &["-fn", img.to_str().unwrap()]);
}

fn read_journal_block(image: &Ext4Image, location: &JournalLocation, n: u32) -> Vec<u8> {
    let mut data = vec![0u8; location.block_size() as usize];
    let offset = location.device_offset(n).unwrap();
    image.device().read_at(offset, &mut data).unwrap();
    data
}

/// The checks every healthy image must pass; returns the location for image-specific checks.
fn check_journal_is_located(img: &Path) -> JournalLocation {
    let image = open(img, true);
    let location = image.journal_location().unwrap();
    let block_size = image.block_size();
    assert_eq!(location.block_size(), block_size);

    // The journal spans exactly the journal inode's size.
    let inode = image.read_inode(ext4::JOURNAL_INO).unwrap();
    assert_eq!(u64::from(location.len_blocks()), inode.size / u64::from(block_size));

    // Journal block 0 is the JBD2 superblock, and it agrees about the journal's length.
    let jsb = read_journal_block(&image, &location, 0);
    assert_eq!(u32::from_be_bytes(jsb[0..4].try_into().unwrap()), JBD2_MAGIC);
    let maxlen =
        u32::from_be_bytes(jsb[JBD2_MAXLEN_OFFSET..JBD2_MAXLEN_OFFSET + 4].try_into().unwrap());
    assert_eq!(maxlen, location.len_blocks());

    // debugfs maps the first, middle and last block, and both ends of every run, the same way.
    let len = location.len_blocks();
    let mut probes = vec![0, 1, len / 2, len - 1];
    for run in location.extents() {
        probes.push(run.log_start);
        probes.push(run.log_start + run.len - 1);
    }
    probes.sort_unstable();
    probes.dedup();
    for n in probes {
        assert_eq!(location.fs_block(n), Some(debugfs_bmap(img, n)), "journal block {n}");
    }
    assert_eq!(location.fs_block(len), None);
    location
}

#[test]
fn journal_of_a_default_small_image_is_found_where_debugfs_says() {
    if !common::have_tools(&TOOLS) {
        return;
    }
    // mke2fs.conf makes a 64 MiB file system "small": 1 KiB blocks.
    let dir = Scratch::new("default");
    let img = mkfs(&dir, "64M", &[]);
    check_journal_is_located(&img);
    assert_eq!(open(&img, true).block_size(), 1024);
}

#[test]
fn journal_of_a_4k_image_is_found_where_debugfs_says() {
    if !common::have_tools(&TOOLS) {
        return;
    }
    let dir = Scratch::new("4k");
    let img = mkfs(&dir, "64M", &["-b", "4096"]);
    check_journal_is_located(&img);
    assert_eq!(open(&img, true).block_size(), 4096);
}

#[test]
fn journal_of_a_1k_image_spanning_many_groups_is_found() {
    if !common::have_tools(&TOOLS) {
        return;
    }
    let dir = Scratch::new("1k");
    let img = mkfs(&dir, "512M", &["-b", "1024"]);
    check_journal_is_located(&img);
    assert!(open(&img, true).superblock().group_count() > 1);
}

#[test]
fn journal_without_any_descriptor_checksum_is_found() {
    if !common::have_tools(&TOOLS) {
        return;
    }
    let dir = Scratch::new("nocsum");
    let img = mkfs(&dir, "64M", &["-O", "^metadata_csum"]);
    check_journal_is_located(&img);
    let image = open(&img, true);
    assert!(!image.superblock().has_group_desc_csum());
}

#[test]
fn journal_with_crc16_descriptor_checksums_is_found_and_a_flipped_descriptor_is_not() {
    if !common::have_tools(&TOOLS) {
        return;
    }
    // uninit_bg (gdt_csum) without metadata_csum: descriptors carry the old crc16.
    let dir = Scratch::new("crc16");
    let img = mkfs(&dir, "64M", &["-b", "4096", "-O", "^metadata_csum,uninit_bg"]);
    check_journal_is_located(&img);
    let image = open(&img, true);
    assert!(image.superblock().has_gdt_csum() && !image.superblock().has_metadata_csum());
    drop(image);
    let mut bytes = std::fs::read(&img).unwrap();
    bytes[4096 + 0xC] ^= 0x01; // group 0's free block count, in the table at block 1
    std::fs::write(&img, &bytes).unwrap();
    assert!(matches!(try_open(&img), Err(FsError::Corrupted { block: 1, .. })));
}

#[test]
fn journal_without_64bit_is_found_with_32_byte_descriptors() {
    if !common::have_tools(&TOOLS) {
        return;
    }
    let dir = Scratch::new("no64");
    let img = mkfs(&dir, "64M", &["-b", "4096", "-O", "^64bit"]);
    check_journal_is_located(&img);
    assert_eq!(open(&img, true).superblock().desc_size(), 32);
}

#[test]
fn big_journal_of_a_4k_image_is_found() {
    if !common::have_tools(&TOOLS) {
        return;
    }
    let dir = Scratch::new("big");
    let img = mkfs(&dir, "256M", &["-b", "4096", "-J", "size=64"]);
    let location = check_journal_is_located(&img);
    assert_eq!(location.len_blocks(), 64 * 256);
}

#[test]
fn fragmented_journal_behind_an_index_node_is_found() {
    if !common::have_tools(&TOOLS) {
        return;
    }
    // 256 MiB of 1 KiB blocks needs more than the 4 extents the inode holds, and the backup
    // superblocks in groups 1, 3, 5, ... split it physically: a depth-1 tree whose leaf block
    // carries a metadata_csum tail. lazy_journal_init keeps mkfs from writing 256 MiB of zeros.
    let dir = Scratch::new("deep");
    let img = mkfs(&dir, "2G", &["-b", "1024", "-J", "size=256", "-E", "lazy_journal_init=1"]);
    let location = check_journal_is_located(&img);
    assert_eq!(location.len_blocks(), 256 * 1024);
    assert!(location.extents().len() > 1, "expected a fragmented journal: {location:?}");
    let image = open(&img, true);
    let inode = image.read_inode(ext4::JOURNAL_INO).unwrap();
    let (header, entries) = ext4::parse_extent_node(&inode.block).unwrap();
    assert!(header.depth >= 1 && matches!(entries, ExtentEntries::Index(_)), "{header:?}");
    let extents = image.extents(ext4::JOURNAL_INO, &inode).unwrap();
    assert!(extents.len() > 4, "{extents:?}");
}

#[test]
fn journal_with_a_fast_commit_area_is_found() {
    if !common::have_tools(&TOOLS) {
        return;
    }
    let dir = Scratch::new("fc");
    let img = mkfs(&dir, "64M", &["-O", "fast_commit"]);
    check_journal_is_located(&img);
    let image = open(&img, true);
    assert_ne!(image.superblock().feature_compat & ext4::feature::COMPAT_FAST_COMMIT, 0);
}

#[test]
fn meta_bg_descriptor_table_is_found_across_meta_groups() {
    if !common::have_tools(&TOOLS) {
        return;
    }
    // 1 KiB blocks and 64-byte descriptors: 16 per block, so 64 groups need 4 descriptor
    // blocks, each at the start of its own meta group.
    let dir = Scratch::new("metabg");
    let img = mkfs(&dir, "512M", &["-b", "1024", "-O", "meta_bg,^resize_inode"]);
    let image = open(&img, true);
    assert_ne!(image.superblock().feature_incompat & ext4::feature::INCOMPAT_META_BG, 0);
    assert!(image.superblock().group_desc_blocks() > 1);
    check_journal_is_located(&img);
}

#[test]
fn image_without_a_journal_reports_no_journal() {
    if !common::have_tools(&TOOLS) {
        return;
    }
    let dir = Scratch::new("nojournal");
    let img = mkfs(&dir, "64M", &["-O", "^has_journal"]);
    assert!(matches!(open(&img, true).journal_location(), Err(FsError::NoJournal)));
}

#[test]
fn needs_recovery_flag_round_trips_through_dumpe2fs_and_e2fsck() {
    if !common::have_tools(&TOOLS) {
        return;
    }
    for block_size in ["1024", "4096"] {
        let dir = Scratch::new("recover");
        let img = mkfs(&dir, "64M", &["-b", block_size]);
        assert!(!dumpe2fs_features(&img).contains("needs_recovery"));

        let mut image = open(&img, false);
        image.set_needs_recovery(true).unwrap();
        assert!(image.superblock().needs_recovery());
        drop(image);
        assert!(dumpe2fs_features(&img).contains("needs_recovery"), "{block_size}");
        // quill reads back what it wrote, checksum included.
        assert!(open(&img, true).superblock().needs_recovery());

        let mut image = open(&img, false);
        image.set_needs_recovery(false).unwrap();
        drop(image);
        assert!(!dumpe2fs_features(&img).contains("needs_recovery"), "{block_size}");
        e2fsck_clean(&img);
    }
}

#[test]
fn flipped_superblock_checksum_is_an_error_not_a_panic() {
    if !common::have_tools(&TOOLS) {
        return;
    }
    let dir = Scratch::new("sbcsum");
    let img = mkfs(&dir, "64M", &[]);
    let mut bytes = std::fs::read(&img).unwrap();
    bytes[1024 + 0x3FC] ^= 0x01;
    std::fs::write(&img, &bytes).unwrap();
    match try_open(&img) {
        Err(FsError::OnDisk(err)) => assert!(err.to_string().contains("checksum"), "{err}"),
        Err(other) => panic!("unexpected error {other}"),
        Ok(_) => panic!("a superblock with a bad checksum was accepted"),
    }
}

#[test]
fn flipped_group_descriptor_byte_is_corrupted() {
    if !common::have_tools(&TOOLS) {
        return;
    }
    let dir = Scratch::new("gdcsum");
    let img = mkfs(&dir, "64M", &["-b", "4096"]);
    let mut bytes = std::fs::read(&img).unwrap();
    // The descriptor table starts at block 1; flip group 0's free block count.
    bytes[4096 + 0xC] ^= 0x01;
    std::fs::write(&img, &bytes).unwrap();
    match try_open(&img) {
        Err(FsError::Corrupted { block, reason }) => {
            assert_eq!(block, 1);
            assert!(reason.contains("checksum"), "{reason}");
        }
        other => panic!("expected Corrupted, got {other:?}"),
    }
}

#[test]
fn journal_extent_pointing_outside_the_file_system_is_corrupted() {
    if !common::have_tools(&TOOLS) {
        return;
    }
    let dir = Scratch::new("outside");
    let img = mkfs(&dir, "64M", &["-b", "4096"]);
    // i_block words 3..5 hold the first extent (logical, len|start_hi, start_lo); debugfs
    // rewrites the inode with a fresh checksum, so only the extent is wrong.
    run("debugfs", &["-w", "-R", "sif <8> block[5] 0x7fffffff", img.to_str().unwrap()]);
    let image = open(&img, true);
    match image.journal_location() {
        Err(FsError::Corrupted { reason, .. }) => {
            assert!(reason.contains("outside the file system"), "{reason}")
        }
        other => panic!("expected Corrupted, got {other:?}"),
    }
}

#[test]
fn journal_index_block_with_a_bad_checksum_is_corrupted() {
    if !common::have_tools(&TOOLS) {
        return;
    }
    let dir = Scratch::new("leafcsum");
    let img = mkfs(&dir, "2G", &["-b", "1024", "-J", "size=256", "-E", "lazy_journal_init=1"]);
    let leaf = {
        let image = open(&img, true);
        let inode = image.read_inode(ext4::JOURNAL_INO).unwrap();
        match ext4::parse_extent_node(&inode.block).unwrap().1 {
            ExtentEntries::Index(indexes) => indexes[0].leaf,
            leaf => panic!("expected an index root, got {leaf:?}"),
        }
    };
    // Flip a byte inside the first extent of the leaf block (a valid-looking extent, wrong sum).
    let dev = FileDevice::open(&img, FileOptions::default()).unwrap();
    let mut block = vec![0u8; 1024];
    dev.read_at(leaf * 1024, &mut block).unwrap();
    block[ext4::EXTENT_HEADER_SIZE + 8] ^= 0x01;
    dev.write_at(leaf * 1024, &block).unwrap();
    dev.flush().unwrap();
    drop(dev);
    match open(&img, true).journal_location() {
        Err(FsError::Corrupted { block, reason }) => {
            assert_eq!(block, leaf);
            assert!(reason.contains("checksum"), "{reason}");
        }
        other => panic!("expected Corrupted, got {other:?}"),
    }
}

#[test]
fn reads_past_the_end_of_the_file_system_are_refused() {
    if !common::have_tools(&TOOLS) {
        return;
    }
    let dir = Scratch::new("bounds");
    let img = mkfs(&dir, "64M", &["-b", "4096"]);
    let image = open(&img, true);
    let blocks = image.superblock().blocks_count;
    assert!(image.read_block(blocks - 1).is_ok());
    assert!(matches!(image.read_block(blocks), Err(FsError::BlockOutOfRange { .. })));
    assert!(matches!(image.read_inode(0), Err(FsError::NoSuchInode { .. })));
    let past = image.superblock().inodes_count + 1;
    assert!(matches!(image.read_inode(past), Err(FsError::NoSuchInode { .. })));
}

/// Byte offset of inode `ino`'s record in the image.
fn inode_offset(image: &Ext4Image, ino: u32) -> usize {
    let sb = image.superblock();
    let index = u64::from((ino - 1) % sb.inodes_per_group);
    let table = image.group_descs()[((ino - 1) / sb.inodes_per_group) as usize].inode_table;
    (table * u64::from(sb.block_size()) + index * u64::from(sb.inode_size)) as usize
}

#[test]
fn flipped_journal_inode_byte_is_a_checksum_error() {
    if !common::have_tools(&TOOLS) {
        return;
    }
    let dir = Scratch::new("inodecsum");
    let img = mkfs(&dir, "64M", &["-b", "4096"]);
    let at = inode_offset(&open(&img, true), ext4::JOURNAL_INO);
    let mut bytes = std::fs::read(&img).unwrap();
    bytes[at + 0x28 + 20] ^= 0x01; // inside i_block: the first extent's start block
    std::fs::write(&img, &bytes).unwrap();
    match open(&img, true).journal_location() {
        Err(FsError::Corrupted { reason, .. }) => assert!(reason.contains("checksum"), "{reason}"),
        other => panic!("expected Corrupted, got {other:?}"),
    }
}

#[test]
fn randomly_corrupted_metadata_gives_errors_never_panics() {
    if !common::have_tools(&TOOLS) {
        return;
    }
    // Without metadata_csum most corruptions get past the checksums and reach the structure
    // checks, which is what this test is for.
    let dir = Scratch::new("hostile");
    let img = mkfs(&dir, "16M", &["-b", "1024", "-O", "^metadata_csum"]);
    let pristine = std::fs::read(&img).unwrap();
    let (gdt, inode8) = {
        let image = open(&img, true);
        let gdt = image.superblock().group_desc_block(0) as usize * 1024;
        (gdt, inode_offset(&image, ext4::JOURNAL_INO))
    };
    let regions = [(1024, 1024), (gdt, 64 * 2), (inode8, 256)];
    let mut rng = Rng::from_env("locate_journal");
    let (mut opened, mut located) = (0, 0);
    for _ in 0..300 {
        let mut bytes = pristine.clone();
        for _ in 0..=rng.below(4) {
            let (start, len) = regions[rng.below(regions.len() as u64) as usize];
            bytes[start + rng.below(len as u64) as usize] = match rng.below(3) {
                0 => 0,
                1 => 0xFF,
                _ => rng.next() as u8,
            };
        }
        let dev = Arc::new(blockdev::memory::MemDevice::from_bytes(bytes));
        let Ok(image) = Ext4Image::open(dev) else {
            continue;
        };
        opened += 1;
        if image.journal_location().is_ok() {
            located += 1;
        }
        for ino in [2, 8, 11] {
            if let Ok(inode) = image.read_inode(ino) {
                let _ = image.extents(ino, &inode);
            }
        }
    }
    println!("{opened} of 300 corrupted images opened, {located} journals located");
}
