//! Parallel recovery (FAST'18 §3.2.4) against the one-thread reference: for logs of every
//! checksum version, with and without async_commit, damaged at random (flipped bits, zeroed
//! blocks, blocks copied over others, in control and data blocks alike), the parallel scan and
//! replay reach the one-thread scan's and replay's result: the same scan, the same report or
//! error, the same device bytes.
//!
//! `QUILL_PARALLEL_CASES` (default 400) sets the damaged logs per run; QUILL_SEED the seed.

mod common;

use common::*;
use journal::superblock::{read_superblock, write_superblock};
use journal::JournalConfig;
use ondisk::jbd2::{feature, parse_header, BlockType, ChecksumVersion, JBD2_MAGIC};
use std::sync::Arc;

fn cases_wanted() -> u64 {
    std::env::var("QUILL_PARALLEL_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(400)
}

/// Home blocks the workload writes: few enough that most are logged several times.
const HOME_BLOCKS: u64 = 40;

/// A crashed journal that wrapped: transactions of 1–6 blocks (some beginning with the JBD2
/// magic, so they are logged escaped), revokes of blocks written before and after, and a log
/// that starts mid-way after checkpoints.
fn crashed_log(checksum: ChecksumVersion, rng: &mut Rng) -> Vec<u8> {
    let (dev, loc) = formatted_mem(JOURNAL_BLOCKS, checksum);
    let journal = open(dev.clone(), &loc, JournalConfig::classic());
    for round in 0..400u64 {
        let blocks = 1 + rng.below(6);
        let mut handle = journal.start(blocks as u32 + 1).unwrap();
        for _ in 0..blocks {
            let block = 10 + rng.below(HOME_BLOCKS);
            let escaped = rng.below(5) == 0;
            let buffer = journal.read_buffer(block).unwrap();
            handle
                .modify(&buffer, |b| {
                    b.fill(round as u8 ^ block as u8);
                    if escaped {
                        b[..4].copy_from_slice(&JBD2_MAGIC.to_be_bytes());
                    }
                })
                .unwrap();
        }
        if rng.below(4) == 0 {
            handle.revoke(10 + rng.below(HOME_BLOCKS)).unwrap();
        }
        let tid = handle.stop().unwrap();
        journal.commit_and_wait(tid).unwrap();
    }
    let stats = journal.stats();
    journal.abandon();
    assert!(stats.checkpoints > 0, "{checksum:?}: the log wrapped: {stats:?}");
    dev.snapshot()
}

/// Damages one journal block of `image`: a flipped bit (in the header half the time), a zeroed
/// block, or another journal block copied over it (a stale block).
fn damage(image: &mut [u8], rng: &mut Rng) -> String {
    let size = BLOCK_SIZE as usize;
    let journal_start = FS_BLOCKS as usize * size;
    let block = 1 + rng.below(JOURNAL_BLOCKS as u64 - 1) as usize;
    let at = journal_start + block * size;
    match rng.below(4) {
        0 | 1 => {
            let within = if rng.below(2) == 0 { rng.below(64) } else { rng.below(size as u64) };
            image[at + within as usize] ^= 1 << rng.below(8);
            format!("bit flipped in log block {block} at byte {within}")
        }
        2 => {
            image[at..at + size].fill(0);
            format!("log block {block} zeroed")
        }
        _ => {
            let from = 1 + rng.below(JOURNAL_BLOCKS as u64 - 1) as usize;
            let source = journal_start + from * size;
            image.copy_within(source..source + size, at);
            format!("log block {from} copied over {block}")
        }
    }
}

fn set_async_commit(image: Vec<u8>) -> Vec<u8> {
    let dev = blockdev::memory::MemDevice::from_bytes(image);
    let loc = location(JOURNAL_BLOCKS);
    let mut sb = read_superblock(&dev, &loc).unwrap();
    sb.feature_incompat |= feature::INCOMPAT_ASYNC_COMMIT;
    write_superblock(&dev, &loc, &sb).unwrap();
    dev.snapshot()
}

#[test]
fn parallel_recovery_matches_the_one_thread_reference_on_randomly_damaged_logs() {
    let seed = seed("parallel recovery", 21);
    let mut rng = Rng::new(seed);
    let loc = location(JOURNAL_BLOCKS);
    let versions =
        [ChecksumVersion::V3, ChecksumVersion::V2, ChecksumVersion::V1, ChecksumVersion::None];
    let per_version = cases_wanted().div_ceil(versions.len() as u64);
    for checksum in versions {
        let mut outcomes = [0usize; 2];
        let (mut logs, mut clean_log) = (Vec::new(), crashed_log(checksum, &mut rng));
        logs.push(clean_log.clone());
        clean_log = set_async_commit(clean_log);
        logs.push(clean_log);
        // Undamaged logs first: both recover, to the same bytes.
        for (i, log) in logs.iter().enumerate() {
            let context = format!("seed {seed}, {checksum:?}, undamaged log {i}");
            let (report, _) = recover_checking_parallel(log.clone(), &loc, &context);
            assert!(report.unwrap().transactions > 10, "{context}");
        }
        for case in 0..per_version {
            let mut image = logs[rng.below(2) as usize].clone();
            let damages: Vec<String> =
                (0..1 + rng.below(3)).map(|_| damage(&mut image, &mut rng)).collect();
            let context = format!("seed {seed}, {checksum:?}, case {case}: {}", damages.join(", "));
            let (outcome, _) = recover_checking_parallel(image, &loc, &context);
            outcomes[outcome.is_err() as usize] += 1;
        }
        eprintln!("{checksum:?}: {} recovered, {} failed alike", outcomes[0], outcomes[1]);
        assert!(outcomes[0] > 0, "{checksum:?}: some damaged logs still recover");
    }
}

/// JBD2 writes every copy of a block in log order, so a damaged newest copy leaves the newest
/// older copy that passes its checksum (and fails recovery); the parallel replay, which writes
/// only each block's newest copy, must fall back to the same one.
#[test]
fn a_damaged_newest_copy_leaves_the_previous_copy_home_with_any_thread_count() {
    let (dev, loc) = formatted_mem(JOURNAL_BLOCKS, ChecksumVersion::V3);
    let journal = open(dev.clone(), &loc, JournalConfig::classic());
    for byte in 1..=3u8 {
        commit_fills(&journal, &[(30, byte), (31, byte)]);
    }
    journal.abandon();
    let mut image = dev.snapshot();
    // The third transaction's descriptor is followed by its copies of blocks 30 and 31.
    let descriptors: Vec<usize> = (0..JOURNAL_BLOCKS as usize)
        .filter(|b| {
            let at = (FS_BLOCKS as usize + b) * BLOCK_SIZE as usize;
            parse_header(&image[at..at + BLOCK_SIZE as usize])
                .is_some_and(|h| h.block_type == BlockType::Descriptor as u32)
        })
        .collect();
    assert_eq!(descriptors.len(), 3);
    let newest_copy = (FS_BLOCKS as usize + descriptors[2] + 1) * BLOCK_SIZE as usize;
    image[newest_copy + 7] ^= 0x10;
    let (outcome, dev) = recover_checking_parallel(image, &loc, "newest copy of block 30 damaged");
    let err = outcome.expect_err("a bad tag checksum fails recovery");
    assert!(err.to_string().contains("invalid checksum recovering data block 30"), "{err}");
    let dev: Arc<dyn blockdev::BlockDevice> = dev;
    assert_eq!(read_block(&*dev, 30), vec![2; BLOCK_SIZE as usize], "the second copy is home");
    assert_eq!(read_block(&*dev, 31), vec![3; BLOCK_SIZE as usize], "block 31's newest copy");
}
