//! Recovery and the fast-commit area: the decision table of `journal/src/fast_commit.rs`, case
//! by case, on a crashed journal with `INCOMPAT_FAST_COMMIT`. Recovery without a file system
//! that replays fast commits must refuse exactly the journals whose area holds complete fast
//! commits of the tid after the last full commit, naming the record kinds and writing nothing;
//! every other area is ignored as the kernel ignores it.

mod common;

use blockdev::memory::MemDevice;
use blockdev::BlockDevice;
use common::*;
use journal::{recover, scan_log, superblock, JournalConfig, JournalError, JournalLocation};
use ondisk::jbd2::fast_commit::{append_tail, FcDentryOp, FcRecord};
use ondisk::Tid;
use std::sync::Arc;

/// Blocks of the fast-commit area; the log keeps the 1024 JBD2 requires beside it.
const FC_BLOCKS: u32 = 16;
const JOURNAL_WITH_FC: u32 = JOURNAL_BLOCKS + FC_BLOCKS + 1;

/// A crashed journal with a fast-commit area holding `area` (blocks from its first), after
/// three committed transactions; returns the device bytes, the location and the tid fast
/// commits must carry to be replayed (the one after the last full commit).
fn crashed_with_area(area: impl FnOnce(Tid) -> Vec<Vec<u8>>) -> (Vec<u8>, JournalLocation, Tid) {
    let dev = Arc::new(MemDevice::new(device_bytes(JOURNAL_WITH_FC)));
    let loc = location(JOURNAL_WITH_FC);
    let options = superblock::FormatOptions {
        fast_commit_blocks: FC_BLOCKS,
        fast_commit_feature: true,
        checksum: ondisk::jbd2::ChecksumVersion::V3,
        ..Default::default()
    };
    superblock::format(&*dev, &loc, options).unwrap();
    let journal = open(dev.clone(), &loc, JournalConfig::classic());
    for round in 0..3u8 {
        commit_fills(&journal, &[(20 + u64::from(round), round + 1)]);
    }
    journal.abandon();
    let scan = scan_log(&*dev, &loc).unwrap();
    assert_eq!(scan.transactions.len(), 3);
    let sb = scan.superblock;
    let first = sb.log_end() + 1;
    for (i, block) in area(scan.end_tid).into_iter().enumerate() {
        assert_eq!(block.len(), BLOCK_SIZE as usize);
        dev.write_at(loc.device_offset(first + i as u32).unwrap(), &block).unwrap();
    }
    (dev.snapshot(), loc, scan.end_tid)
}

/// One block: HEAD of `head_tid`, INODE 12, CREAT 2/"new" -> 12, and a TAIL of `tail_tid`
/// (crc flipped when `bad_crc`).
fn one_fast_commit(head_tid: Tid, tail_tid: Tid, bad_crc: bool) -> Vec<u8> {
    let raw_inode = [0u8; 128];
    let mut block = Vec::new();
    for record in [
        FcRecord::Head { features: 0, tid: head_tid },
        FcRecord::Inode { ino: 12, raw: &raw_inode },
        FcRecord::Dentry { op: FcDentryOp::Create, parent_ino: 2, ino: 12, name: b"new" },
    ] {
        record.encode(&mut block);
    }
    append_tail(&mut block, BLOCK_SIZE as usize, 0, tail_tid);
    if bad_crc {
        // HEAD (4 + 8), INODE (4 + 4 + 128) and CREAT (4 + 8 + 3) come first; the TAIL's crc
        // follows its header and tid.
        let tail_at = 12 + 136 + 15;
        block[tail_at + 8] ^= 1;
    }
    block
}

fn recover_copy(
    image: &[u8],
    loc: &JournalLocation,
) -> (Result<journal::RecoveryReport, JournalError>, Vec<u8>) {
    let dev = MemDevice::from_bytes(image.to_vec());
    let result = recover(&dev, loc, 1);
    (result, dev.snapshot())
}

#[test]
fn complete_fast_commits_of_the_next_tid_are_refused_by_name_and_nothing_is_written() {
    let (image, loc, tid) = crashed_with_area(|tid| vec![one_fast_commit(tid, tid, false)]);
    let (result, after) = recover_copy(&image, &loc);
    let error = result.expect_err("fast commits to replay must refuse recovery");
    assert!(matches!(error, JournalError::Unsupported(_)), "{error:?}");
    let message = error.to_string();
    assert!(message.contains("fast-commit records INODE, CREAT are not replayed yet"), "{message}");
    assert!(message.contains(&format!("1 fast commits (4 records) of tid {tid}")), "{message}");
    assert!(after == image, "a refused recovery wrote the device");
}

#[test]
fn a_stale_or_empty_fast_commit_area_is_ignored_and_the_full_commits_replay() {
    let stale = |tid: Tid| vec![one_fast_commit(tid.prev(), tid.prev(), false)];
    let empty = |_: Tid| vec![vec![0u8; BLOCK_SIZE as usize]];
    for (name, area) in [("stale", &stale as &dyn Fn(Tid) -> Vec<Vec<u8>>), ("empty", &empty)] {
        let (image, loc, tid) = crashed_with_area(area);
        let (result, after) = recover_copy(&image, &loc);
        let report = result.unwrap_or_else(|e| panic!("{name} area: {e}"));
        assert_eq!((report.transactions, report.end_tid), (3, tid.0), "{name}");
        assert_eq!(report.fast_commits, journal::FastCommitReport::default(), "{name}");
        for round in 0..3u8 {
            let block = 20 + usize::from(round);
            let bytes = &after[block * BLOCK_SIZE as usize..(block + 1) * BLOCK_SIZE as usize];
            assert!(bytes.iter().all(|b| *b == round + 1), "{name}: block {block} not replayed");
        }
    }
}

#[test]
fn a_fast_commit_area_damaged_before_its_first_tail_fails_recovery_and_nothing_is_written() {
    for (name, head_tid_offset, bad_crc) in [("bad crc", 0, true), ("other tail tid", 1, false)] {
        let (image, loc, _) = crashed_with_area(|tid| {
            let tail_tid = Tid(tid.0.wrapping_add(head_tid_offset));
            vec![one_fast_commit(tid, tail_tid, bad_crc)]
        });
        let (result, after) = recover_copy(&image, &loc);
        let error = result.expect_err(name);
        assert!(matches!(error, JournalError::Corrupted { .. }), "{name}: {error:?}");
        assert!(error.to_string().contains("fast-commit area"), "{name}: {error}");
        assert!(after == image, "{name}: a failed recovery wrote the device");
    }
}

#[test]
fn fast_commits_of_markers_alone_replay_as_nothing() {
    let (image, loc, tid) = crashed_with_area(|tid| {
        let mut block = Vec::new();
        FcRecord::Head { features: 0, tid }.encode(&mut block);
        append_tail(&mut block, BLOCK_SIZE as usize, 0, tid);
        vec![block]
    });
    let (result, _) = recover_copy(&image, &loc);
    let report = result.unwrap();
    assert_eq!(report.end_tid, tid.0);
    assert_eq!(report.fast_commits, journal::FastCommitReport { commits: 1, records: 2 });
}
