//! e2fsck replays what quill writes: quill commits transactions into a mkfs.ext4 image's
//! journal and stops without checkpointing (a crash); stock `e2fsck -fy` replays one copy and
//! `quill recover` another. Both must end byte-identical in every block the transactions
//! touched, equal to what was committed (revoked blocks untouched), and `e2fsck -fn` clean.

mod common;

use blockdev::file::{FileDevice, FileOptions};
use blockdev::BlockDevice;
use common::*;
use fs::Ext4Image;
use journal::{Journal, JournalConfig};
use ondisk::jbd2::JBD2_MAGIC;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

struct Case {
    name: &'static str,
    mkfs: &'static [&'static str],
    size: &'static str,
    wrap: bool,
}

/// Contents quill writes to `block` in round `round`: recognisable, and for one block per
/// transaction the journal magic, so it must be escaped.
fn pattern(block: u64, round: u32, block_size: usize, escaped: bool) -> Vec<u8> {
    let mut data: Vec<u8> =
        (0..block_size).map(|i| (block as usize * 31 + round as usize * 7 + i) as u8).collect();
    if escaped {
        data[..4].copy_from_slice(&JBD2_MAGIC.to_be_bytes());
    }
    data
}

fn write_crashed_journal(image: &Path, case: &Case) -> (BTreeMap<u64, Vec<u8>>, Vec<u64>, u64) {
    let free: Vec<u64> = free_block_ranges(image).into_iter().flatten().collect();
    let file = FileDevice::open(image, FileOptions::default()).unwrap();
    let dev: Arc<dyn BlockDevice> = Arc::new(file);
    let mut fs = Ext4Image::open(dev.clone()).unwrap();
    let block_size = fs.block_size() as usize;
    let location = fs.journal_location().unwrap();
    fs.set_needs_recovery(true).unwrap();
    let journal = Journal::open(dev.clone(), location, JournalConfig::classic()).unwrap();
    // Blocks from the middle of the free space, away from anything mkfs wrote.
    let pool: Vec<u64> = free[free.len() / 2..].iter().copied().take(400).collect();
    let mut expected: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let mut round = 0u32;
    let commit_round = |journal: &Journal, expected: &mut BTreeMap<u64, Vec<u8>>, round: u32| {
        let mut handle = journal.start(8).unwrap();
        for i in 0..6u64 {
            let block = pool[((round as u64 * 5 + i * 13) % pool.len() as u64) as usize];
            let data = pattern(block, round, block_size, i == 0);
            let buffer = journal.read_buffer(block).unwrap();
            handle.modify(&buffer, |b| b.copy_from_slice(&data)).unwrap();
            expected.insert(block, data);
        }
        // Revoke a block written earlier (so a copy of it sits in the log); every third
        // revoked block is journaled again later and that copy must win.
        if round % 4 == 3 {
            let block = pool[((round as u64 * 5 + 13) % pool.len() as u64) as usize];
            handle.revoke(block).unwrap();
            expected.remove(&block);
        }
        let tid = handle.stop().unwrap();
        journal.commit_and_wait(tid).unwrap();
    };
    if case.wrap {
        // Fill the log to near its end with checkpointed transactions, so the crashed ones wrap.
        loop {
            let (head, area) = journal.log_head();
            if head + 30 >= area.end {
                break;
            }
            commit_round(&journal, &mut expected, round);
            round += 1;
            if round.is_multiple_of(50) {
                journal.checkpoint_all().unwrap();
            }
        }
        journal.checkpoint_all().unwrap();
        // What was checkpointed is home already; the crash must still replay the rest.
    }
    let (head_before, _) = journal.log_head();
    for _ in 0..12 {
        commit_round(&journal, &mut expected, round);
        round += 1;
    }
    if case.wrap {
        let (head_after, _) = journal.log_head();
        assert!(head_after < head_before, "{}: the crashed transactions wrap the log", case.name);
    }
    journal.abandon();
    (expected, pool, block_size as u64)
}

fn check_case(case: &Case) {
    let test = format!("e2fsck_replays_quill/{}", case.name);
    if !have("mkfs.ext4", &test) || !have("e2fsck", &test) || !have("dumpe2fs", &test) {
        return;
    }
    let scratch = Scratch::new(&format!("e2fsck-{}", case.name));
    let image = scratch.path("fs.img");
    mkfs(&image, case.size, case.mkfs);
    let (expected, touched, block_size) = write_crashed_journal(&image, case);
    let by_e2fsck = scratch.path("e2fsck.img");
    let by_quill = scratch.path("quill.img");
    std::fs::copy(&image, &by_e2fsck).unwrap();
    std::fs::copy(&image, &by_quill).unwrap();

    let (code, out) = e2fsck(&by_e2fsck, true);
    assert!(code <= 1, "{}: e2fsck -fy failed ({code}):\n{out}", case.name);
    assert!(
        out.contains("recovering journal"),
        "{}: e2fsck replayed the journal:\n{out}",
        case.name
    );
    let o = run(quill().arg("recover").arg(&by_quill));
    assert!(o.status.success(), "{}: quill recover failed: {}", case.name, text(&o));

    // Every block the transactions touched, revoked ones included, ends identical.
    for block in &touched {
        let a = read_block(&by_e2fsck, *block, block_size);
        let b = read_block(&by_quill, *block, block_size);
        assert!(a == b, "{}: block {block} differs between e2fsck and quill", case.name);
        if let Some(data) = expected.get(block) {
            assert!(&a == data, "{}: block {block} is not what was committed", case.name);
        }
    }
    assert_fsck_clean(&by_e2fsck);
    assert_fsck_clean(&by_quill);
    eprintln!("{}: {} blocks identical after e2fsck and quill recovery", case.name, expected.len());
}

#[test]
fn e2fsck_and_quill_replay_a_4k_checksum_v3_64bit_journal_identically() {
    check_case(&Case { name: "4k-csum-v3", mkfs: &["-b", "4096"], size: "64M", wrap: false });
}

#[test]
fn e2fsck_and_quill_replay_a_1k_journal_identically() {
    check_case(&Case { name: "1k-csum-v3", mkfs: &["-b", "1024"], size: "64M", wrap: false });
}

#[test]
fn e2fsck_and_quill_replay_a_wrapped_log_identically() {
    check_case(&Case { name: "4k-wrapped", mkfs: &["-b", "4096"], size: "64M", wrap: true });
    check_case(&Case { name: "1k-wrapped", mkfs: &["-b", "1024"], size: "32M", wrap: true });
}

#[test]
fn e2fsck_and_quill_replay_a_journal_without_checksums_identically() {
    check_case(&Case {
        name: "4k-no-csum",
        mkfs: &["-b", "4096", "-O", "^metadata_csum,^64bit"],
        size: "64M",
        wrap: false,
    });
}
