//! Corrupt journals: flipped bits in descriptor, revoke, commit and superblock blocks give a
//! clean stop or a clear error from recovery, never a panic, and never replay a block whose
//! copy in the log was damaged.

mod common;

use blockdev::BlockDevice;
use common::*;
use journal::JournalConfig;
use ondisk::jbd2::{parse_header, BlockType, ChecksumVersion};

/// A crashed journal holding committed transactions with revokes; returns the image and the
/// journal-relative blocks of each kind.
fn crashed_journal(checksum: ChecksumVersion) -> (Vec<u8>, Vec<(u32, u32)>) {
    let (dev, loc) = formatted_mem(JOURNAL_BLOCKS, checksum);
    let journal = open(dev.clone(), &loc, JournalConfig::classic());
    for round in 0..12u64 {
        let mut h = journal.start(4).unwrap();
        for i in 0..3u64 {
            let buffer = journal.read_buffer(20 + (round + i) % 9).unwrap();
            h.modify(&buffer, |b| b.fill(round as u8 + 1)).unwrap();
        }
        h.revoke(200 + round).unwrap();
        let tid = h.stop().unwrap();
        journal.commit_and_wait(tid).unwrap();
    }
    journal.abandon();
    let image = dev.snapshot();
    let mut kinds = Vec::new();
    for block in 0..40u32 {
        let offset = loc.device_offset(block).unwrap() as usize;
        if let Some(header) = parse_header(&image[offset..offset + BLOCK_SIZE as usize]) {
            kinds.push((block, header.block_type));
        }
    }
    (image, kinds)
}

fn flip_and_recover(
    image: &[u8],
    byte: usize,
    bit: u8,
) -> Result<journal::RecoveryReport, journal::JournalError> {
    let mut damaged = image.to_vec();
    damaged[byte] ^= 1 << bit;
    let loc = location(JOURNAL_BLOCKS);
    // The one-thread recovery is the reference; parallel scan and replay must match it.
    recover_checking_parallel(damaged, &loc, &format!("bit {bit} of byte {byte} flipped")).0
}

#[test]
fn flipped_bits_in_every_control_block_never_panic_recovery() {
    let seed = seed("corrupt", 3);
    let mut rng = Rng::new(seed);
    for checksum in [ChecksumVersion::V3, ChecksumVersion::V2, ChecksumVersion::None] {
        let (image, kinds) = crashed_journal(checksum);
        let loc = location(JOURNAL_BLOCKS);
        let wanted =
            [BlockType::SuperblockV2, BlockType::Descriptor, BlockType::Revoke, BlockType::Commit];
        for kind in wanted {
            let blocks: Vec<u32> =
                kinds.iter().filter(|(_, t)| *t == kind as u32).map(|(b, _)| *b).collect();
            assert!(!blocks.is_empty(), "{checksum:?}: the journal has {kind:?} blocks");
            let (mut errors, mut clean) = (0, 0);
            for _ in 0..150 {
                let block = blocks[rng.below(blocks.len() as u64) as usize];
                let within = rng.below(if kind == BlockType::SuperblockV2 {
                    1024
                } else {
                    BLOCK_SIZE as u64
                });
                let byte = loc.device_offset(block).unwrap() as usize + within as usize;
                match flip_and_recover(&image, byte, rng.below(8) as u8) {
                    Ok(_) => clean += 1,
                    Err(e) => {
                        assert!(!e.to_string().is_empty());
                        errors += 1;
                    }
                }
            }
            eprintln!("{checksum:?} {kind:?}: {clean} clean stops or harmless flips, {errors} clear errors");
        }
    }
}

#[test]
fn a_damaged_commit_block_ends_the_log_before_its_transaction() {
    let (image, kinds) = crashed_journal(ChecksumVersion::V3);
    let loc = location(JOURNAL_BLOCKS);
    let commits: Vec<u32> =
        kinds.iter().filter(|(_, t)| *t == BlockType::Commit as u32).map(|(b, _)| *b).collect();
    // Damage the fifth commit block's timestamp (covered by its checksum).
    let byte = loc.device_offset(commits[4]).unwrap() as usize + 0x30 + 7;
    let report = flip_and_recover(&image, byte, 0).unwrap();
    assert_eq!(report.transactions, 4, "{report:?}");
}

#[test]
fn a_damaged_logged_block_is_never_replayed() {
    let (mut image, kinds) = crashed_journal(ChecksumVersion::V3);
    let loc = location(JOURNAL_BLOCKS);
    // The first data block follows the first descriptor.
    let descriptor = kinds.iter().find(|(_, t)| *t == BlockType::Descriptor as u32).unwrap().0;
    let byte = loc.device_offset(descriptor + 1).unwrap() as usize + 100;
    image[byte] ^= 0x40;
    let (result, dev) = recover_checking_parallel(image, &loc, "first data block damaged");
    let err = result.expect_err("a bad tag checksum fails recovery, as in JBD2");
    assert!(err.to_string().contains("invalid checksum"), "{err}");
    // The damaged copy (block 20, from the first transaction) was not written home.
    let home = read_block(&*dev as &dyn BlockDevice, 20);
    // Every valid copy of block 20 is uniform; the damaged one differs in one byte.
    assert!(home.windows(2).all(|w| w[0] == w[1]), "the damaged copy never reaches home");
}
