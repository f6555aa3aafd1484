//! Behaviour of the engine on memory devices: commit, recovery, checkpoint, wrap-around,
//! revoke, escaping, credits, tid wrap-around, and a multi-threaded stress run per preset.

mod common;

use blockdev::memory::MemDevice;
use blockdev::BlockDevice;
use common::*;
use journal::{recover, superblock, Journal, JournalConfig, JournalError};
use ondisk::jbd2::{ChecksumVersion, JBD2_MAGIC};
use ondisk::Tid;
use std::sync::Arc;

#[test]
fn committed_transaction_is_replayed_after_a_crash_and_not_before_commit() {
    let (dev, loc) = formatted_mem(1024, ChecksumVersion::V3);
    let journal = open(dev.clone(), &loc, JournalConfig::classic());
    let a = journal.read_buffer(5).unwrap();
    let mut h = journal.start(2).unwrap();
    h.modify(&a, fill(0xAB)).unwrap();
    let tid = h.stop().unwrap();
    journal.commit_and_wait(tid).unwrap();
    // A second transaction that is never committed.
    let b = journal.read_buffer(6).unwrap();
    let mut h = journal.start(1).unwrap();
    h.modify(&b, fill(0xCD)).unwrap();
    h.stop().unwrap();
    journal.abandon();

    assert_eq!(read_block(&*dev, 5), vec![0; 1024], "home not written before checkpoint");
    let report = recover(&*dev, &loc, 1).unwrap();
    assert!(report.needed);
    assert_eq!(report.transactions, 1);
    assert_eq!(report.replayed_blocks, vec![5]);
    assert_eq!(read_block(&*dev, 5), vec![0xAB; 1024]);
    assert_eq!(read_block(&*dev, 6), vec![0; 1024], "uncommitted transaction must not appear");
    // Recovery leaves the journal clean and the next open skips the possibly half-written tid.
    let again = recover(&*dev, &loc, 1).unwrap();
    assert!(!again.needed);
    assert!(Tid(again.next_tid).is_after(Tid(report.end_tid)));
}

#[test]
fn shutdown_checkpoints_everything_and_leaves_a_clean_journal() {
    let (dev, loc) = formatted_mem(1024, ChecksumVersion::V3);
    let journal = open(dev.clone(), &loc, JournalConfig::classic());
    for block in 20..30u64 {
        let buffer = journal.read_buffer(block).unwrap();
        let mut h = journal.start(1).unwrap();
        h.modify(&buffer, fill(block as u8)).unwrap();
        h.stop().unwrap();
    }
    journal.shutdown().unwrap();
    for block in 20..30u64 {
        assert_eq!(read_block(&*dev, block), vec![block as u8; 1024]);
    }
    let sb = superblock::read_superblock(&*dev, &loc).unwrap();
    assert_eq!(sb.start, 0, "clean journal");
    assert!(!recover(&*dev, &loc, 1).unwrap().needed);
}

#[test]
fn log_wraps_around_many_times_and_recovery_follows_the_wrap() {
    let (dev, loc) = formatted_mem(1024, ChecksumVersion::V3);
    let journal = open(dev.clone(), &loc, JournalConfig::classic());
    let mut last = Tid(0);
    for round in 0..400u32 {
        let block = 40 + (round % 7) as u64;
        let mut h = journal.start(12).unwrap();
        for spread in 0..12u64 {
            let buffer = journal.read_buffer(block + spread * 10).unwrap();
            h.modify(&buffer, |b| b[..4].copy_from_slice(&round.to_le_bytes())).unwrap();
        }
        last = h.stop().unwrap();
        journal.commit_and_wait(last).unwrap();
    }
    let stats = journal.stats();
    assert!(stats.checkpoints > 10, "a 1024-block journal must checkpoint: {stats:?}");
    assert!(stats.log_blocks_written > 1024 * 3, "the log wrapped several times: {stats:?}");
    journal.abandon();
    let report = recover(&*dev, &loc, 1).unwrap();
    assert_eq!(report.end_tid, last.next().0);
    for round in 393..400u32 {
        let block = 40 + (round % 7) as u64;
        for spread in 0..12u64 {
            assert_eq!(read_block(&*dev, block + spread * 10)[..4], round.to_le_bytes());
        }
    }
}

#[test]
fn recovery_skips_block_revoked_by_later_transaction() {
    let (dev, loc) = formatted_mem(1024, ChecksumVersion::V3);
    let journal = open(dev.clone(), &loc, JournalConfig::classic());
    commit_fills(&journal, &[(50, 1), (51, 2)]);
    commit_revoke(&journal, 50, true);
    // Block 51 is revoked and then journaled again in a later transaction: that copy counts.
    commit_revoke(&journal, 51, true);
    commit_fills(&journal, &[(51, 3)]);
    journal.abandon();

    let report = recover(&*dev, &loc, 1).unwrap();
    assert_eq!(read_block(&*dev, 50), vec![0; 1024], "revoked block must not be replayed");
    assert_eq!(read_block(&*dev, 51), vec![3; 1024]);
    assert_eq!(report.revoke_hits, 2);
}

#[test]
fn revoke_cancelled_in_the_same_transaction_keeps_the_new_copy() {
    let (dev, loc) = formatted_mem(1024, ChecksumVersion::V3);
    let journal = open(dev.clone(), &loc, JournalConfig::classic());
    let a = journal.read_buffer(60).unwrap();
    let mut h = journal.start(3).unwrap();
    h.revoke(60).unwrap();
    h.modify(&a, fill(9)).unwrap();
    let tid = h.stop().unwrap();
    journal.commit_and_wait(tid).unwrap();
    journal.abandon();
    recover(&*dev, &loc, 1).unwrap();
    assert_eq!(read_block(&*dev, 60), vec![9; 1024]);
}

#[test]
fn checkpoint_does_not_write_home_a_durably_revoked_block() {
    let (dev, loc) = formatted_mem(1024, ChecksumVersion::V3);
    let journal = open(dev.clone(), &loc, JournalConfig::classic());
    let a = journal.read_buffer(70).unwrap();
    let mut h = journal.start(1).unwrap();
    h.modify(&a, fill(7)).unwrap();
    h.stop().unwrap();
    let mut h = journal.start(1).unwrap();
    h.revoke(70).unwrap();
    let tid = h.stop().unwrap();
    journal.commit_and_wait(tid).unwrap();
    // The block now belongs to file data written outside the journal.
    dev.write_at(70 * 1024, &[0xEE; 1024]).unwrap();
    journal.shutdown().unwrap();
    assert_eq!(read_block(&*dev, 70), vec![0xEE; 1024]);
}

#[test]
fn block_starting_with_the_journal_magic_is_escaped_and_restored() {
    for checksum in
        [ChecksumVersion::V3, ChecksumVersion::V2, ChecksumVersion::None, ChecksumVersion::V1]
    {
        let (dev, loc) = formatted_mem(1024, checksum);
        let journal = open(dev.clone(), &loc, JournalConfig::classic());
        let a = journal.read_buffer(80).unwrap();
        let mut h = journal.start(1).unwrap();
        h.modify(&a, |b| {
            b.fill(0x11);
            b[..4].copy_from_slice(&JBD2_MAGIC.to_be_bytes());
        })
        .unwrap();
        let tid = h.stop().unwrap();
        journal.commit_and_wait(tid).unwrap();
        journal.abandon();
        let report = recover(&*dev, &loc, 1).unwrap();
        assert_eq!(report.transactions, 1, "{checksum:?}");
        let block = read_block(&*dev, 80);
        assert_eq!(block[..4], JBD2_MAGIC.to_be_bytes(), "{checksum:?}");
        assert!(block[4..].iter().all(|&b| b == 0x11), "{checksum:?}");
    }
}

#[test]
fn credits_are_charged_per_new_buffer_and_revoke_and_refunded_at_stop() {
    let (dev, loc) = formatted_mem(1024, ChecksumVersion::V3);
    let journal = open(dev.clone(), &loc, JournalConfig::classic());
    let a = journal.read_buffer(1).unwrap();
    let b = journal.read_buffer(2).unwrap();
    let mut h = journal.start(2).unwrap();
    h.modify(&a, fill(1)).unwrap();
    h.modify(&a, fill(2)).unwrap(); // same buffer: free
    assert_eq!(h.credits_left(), 1);
    h.revoke(99).unwrap();
    assert_eq!(h.credits_left(), 0);
    match h.modify(&b, fill(3)) {
        Err(JournalError::CreditsExhausted { credits: 2, .. }) => {}
        other => panic!("expected CreditsExhausted, got {other:?}"),
    }
    drop(h);
    let too_many = journal.max_transaction_credits() + 1;
    assert!(matches!(journal.start(too_many), Err(JournalError::TooManyCredits { .. })));
    assert!(matches!(journal.start(0), Err(JournalError::TooManyCredits { .. })));
    // Transactions larger than the log's quarter are split, and everything still commits.
    let max = journal.max_transaction_credits();
    for round in 0..6u64 {
        let mut h = journal.start(max).unwrap();
        for i in 0..max as u64 {
            let buffer = journal.read_buffer(100 + (round * 7 + i) % 300).unwrap();
            h.modify(&buffer, fill(round as u8)).unwrap();
        }
        h.stop().unwrap();
    }
    journal.shutdown().unwrap();
}

#[test]
fn tids_wrap_around_u32_max_without_losing_order() {
    let (dev, loc) = formatted_mem(1024, ChecksumVersion::V3);
    let mut sb = superblock::read_superblock(&*dev, &loc).unwrap();
    sb.sequence = Tid(u32::MAX - 3);
    superblock::write_superblock(&*dev, &loc, &sb).unwrap();
    let journal = open(dev.clone(), &loc, JournalConfig::classic());
    let mut tids = Vec::new();
    for i in 0..8u8 {
        let buffer = journal.read_buffer(90).unwrap();
        let mut h = journal.start(1).unwrap();
        h.modify(&buffer, fill(i)).unwrap();
        let tid = h.stop().unwrap();
        journal.commit_and_wait(tid).unwrap();
        tids.push(tid);
    }
    assert!(tids.iter().any(|t| t.0 < 10) && tids.iter().any(|t| t.0 > u32::MAX - 10));
    assert!(tids.windows(2).all(|w| w[1].is_after(w[0])));
    journal.abandon();
    let report = recover(&*dev, &loc, 1).unwrap();
    assert_eq!(report.transactions, 8);
    assert_eq!(read_block(&*dev, 90), vec![7; 1024]);
}

#[test]
fn parallel_recovery_reaches_the_same_state_as_serial_recovery() {
    let (dev, loc) = formatted_mem(1024, ChecksumVersion::V3);
    let journal = open(dev.clone(), &loc, JournalConfig::classic());
    for round in 0..40u64 {
        let mut h = journal.start(5).unwrap();
        for i in 0..5u64 {
            let buffer = journal.read_buffer((round * 3 + i) % 37 + 1).unwrap();
            h.modify(&buffer, fill((round * 5 + i) as u8)).unwrap();
        }
        if round % 5 == 4 {
            h.stop().unwrap();
            let mut r = journal.start(1).unwrap();
            r.revoke(round % 37 + 1).unwrap();
            r.stop().unwrap();
        } else {
            h.stop().unwrap();
        }
    }
    journal.commit_all().unwrap();
    journal.abandon();
    let crash = dev.snapshot();
    let serial = Arc::new(MemDevice::from_bytes(crash.clone()));
    let parallel = Arc::new(MemDevice::from_bytes(crash));
    let a = recover(&*serial, &loc, 1).unwrap();
    let b = recover(&*parallel, &loc, 4).unwrap();
    assert_eq!(a.replayed_blocks, b.replayed_blocks);
    assert_eq!(serial.snapshot(), parallel.snapshot());
}

#[test]
fn recovery_progress_counts_every_logged_block_up_to_the_total() {
    let (dev, loc) = formatted_mem(1024, ChecksumVersion::V3);
    let journal = open(dev.clone(), &loc, JournalConfig::classic());
    commit_fills(&journal, &[(70, 1), (71, 2), (72, 3)]);
    commit_revoke(&journal, 70, true);
    commit_fills(&journal, &[(71, 4), (73, 5)]);
    journal.abandon();
    let crash = dev.snapshot();
    let scan = journal::scan_log(&*dev, &loc).unwrap();
    let logged: u64 = scan.transactions.iter().map(|t| t.tags.len() as u64).sum();
    assert_eq!(logged, 5);
    for threads in [1, 3] {
        let dev = MemDevice::from_bytes(crash.clone());
        let calls = parking_lot::Mutex::new(Vec::new());
        let report = journal::recover_with_progress(&dev, &loc, threads, &|done, total| {
            calls.lock().push((done, total))
        })
        .unwrap();
        assert_eq!(report.revoke_hits, 1, "{threads} threads");
        let mut calls = calls.into_inner();
        assert!(calls.iter().all(|&(done, total)| total == logged && done <= total), "{calls:?}");
        calls.sort();
        assert_eq!(calls.first(), Some(&(0, logged)), "{threads} threads: starts at 0");
        assert_eq!(calls.last(), Some(&(logged, logged)), "{threads} threads: ends at the total");
    }
    // A clean journal replays nothing and reports no progress.
    let called = std::sync::atomic::AtomicBool::new(false);
    let dev = MemDevice::from_bytes(crash);
    recover(&dev, &loc, 1).unwrap();
    let report = journal::recover_with_progress(&dev, &loc, 1, &|_, _| {
        called.store(true, std::sync::atomic::Ordering::Relaxed)
    })
    .unwrap();
    assert!(!report.needed);
    assert!(!called.into_inner());
}

#[test]
fn every_preset_survives_a_many_threaded_stress_run_and_recovers_a_committed_prefix() {
    let seed = seed("stress", 7);
    for name in journal::config::PRESETS {
        let config = JournalConfig::preset(name).unwrap();
        let (dev, loc) = formatted_mem(1024, ChecksumVersion::V3);
        let journal = open(dev.clone(), &loc, config);
        let layout = StampLayout { threads: 12, shared_blocks: 5, spread_blocks: 0 };
        let acked = parking_lot::Mutex::new(Vec::new());
        let history = run_stamp_workload(&journal, &layout, 60 + (seed % 5) as u32, 3, &|tid| {
            acked.lock().push(tid)
        });
        let stats = journal.stats();
        assert!(stats.transactions > 0);
        journal.abandon();
        let base = history.first_tid();
        recover(&*dev, &loc, 1).unwrap();
        let image = |b: u64| read_block(&*dev, b);
        let acked = acked.lock().clone();
        history
            .check_prefix(&layout, base, &image, &acked)
            .unwrap_or_else(|e| panic!("preset {name}: {e}"));
        eprintln!(
            "preset {name}: {} transactions, {:.1} handles/txn, {:.2} flushes/txn, {} conflicts",
            stats.transactions,
            stats.handles_per_transaction(),
            stats.flushes_per_transaction(),
            stats.conflicts
        );
    }
}

#[test]
fn clean_journal_from_disk_is_reopened_with_a_fresh_tid() {
    let (dev, loc) = formatted_mem(1024, ChecksumVersion::V3);
    let journal = open(dev.clone(), &loc, JournalConfig::classic());
    let buffer = journal.read_buffer(3).unwrap();
    let mut h = journal.start(1).unwrap();
    h.modify(&buffer, fill(1)).unwrap();
    let first = h.stop().unwrap();
    journal.shutdown().unwrap();
    let journal = open(dev.clone(), &loc, JournalConfig::classic());
    let buffer = journal.read_buffer(3).unwrap();
    let mut h = journal.start(1).unwrap();
    h.modify(&buffer, fill(2)).unwrap();
    let second = h.stop().unwrap();
    assert!(second.is_after(first));
    journal.shutdown().unwrap();
    assert_eq!(read_block(&*dev, 3), vec![2; 1024]);
}

#[test]
fn a_journal_that_needs_recovery_is_refused_by_open() {
    let (dev, loc) = formatted_mem(1024, ChecksumVersion::V3);
    let journal = open(dev.clone(), &loc, JournalConfig::classic());
    // As JBD2, attaching writes nothing: the log start is written with the first commit.
    let buffer = journal.read_buffer(3).unwrap();
    let mut h = journal.start(1).unwrap();
    h.modify(&buffer, fill(1)).unwrap();
    let tid = h.stop().unwrap();
    journal.commit_and_wait(tid).unwrap();
    journal.abandon();
    match Journal::open(dev.clone(), loc.clone(), JournalConfig::classic()) {
        Err(JournalError::NeedsRecovery { .. }) => {}
        other => panic!("expected NeedsRecovery, got {:?}", other.err()),
    }
    let (journal, report) = Journal::recover_and_open(dev, loc, JournalConfig::classic()).unwrap();
    assert!(report.needed);
    journal.shutdown().unwrap();
}

#[test]
fn cooperative_io_survives_many_threads_on_a_small_journal_and_recovers_a_committed_prefix() {
    let seed = seed("cooperative stress", 8);
    for spec in COOPERATIVE_SPECS {
        let (dev, loc) = formatted_mem(JOURNAL_BLOCKS, ChecksumVersion::V3);
        let journal = open(dev.clone(), &loc, config(spec));
        // 32 threads, an fsync after every handle, a 1024-block log: checkpoints all the time.
        let layout = StampLayout { threads: 32, shared_blocks: 8, spread_blocks: 300 };
        let acked = parking_lot::Mutex::new(Vec::new());
        let handles = 50 + (seed % 5) as u32;
        let history =
            run_stamp_workload(&journal, &layout, handles, 1, &|tid| acked.lock().push(tid));
        assert!(
            journal.stats().checkpoints > 10,
            "{spec}: checkpoints must be constant: {:?}",
            journal.stats()
        );
        // Under load most versions are superseded by the time their transaction is
        // checkpointed (a spread block comes back every 300 handles, about as often as the log
        // wraps once transactions gather a handle from every thread), so the load alone may
        // write nothing home (0 to 79 blocks measured). Checkpointing what is left writes the
        // newest versions home through the same path, so every run does home writes.
        journal.checkpoint_all().unwrap();
        let stats = journal.stats();
        assert!(stats.checkpoint_blocks > 0, "{spec}: checkpoints write home: {stats:?}");
        let units = [
            (
                "commit_io",
                stats.commit_chunks,
                stats.commit_chunks_by_owner,
                stats.commit_chunks_by_helpers,
            ),
            (
                "checkpoint_io",
                stats.checkpoint_batches,
                stats.checkpoint_batches_by_owner,
                stats.checkpoint_batches_by_helpers,
            ),
        ];
        for (setting, total, by_owner, by_helpers) in units {
            if spec.contains(&format!("{setting}=cooperative")) {
                assert!(total > 0, "{spec}: {stats:?}");
                assert_eq!(
                    total,
                    by_owner + by_helpers,
                    "{spec}: every {setting} unit written once"
                );
            } else {
                assert_eq!(total, 0, "{spec}: {setting} units without the setting");
            }
        }
        journal.abandon();
        recover(&*dev, &loc, 1).unwrap();
        let image = |b: u64| read_block(&*dev, b);
        let acked = acked.lock().clone();
        history
            .check_prefix(&layout, history.first_tid(), &image, &acked)
            .unwrap_or_else(|e| panic!("{spec}: {e}"));
        eprintln!(
            "{spec}: {} transactions, {} checkpoints, {} checkpoint flushes; commit chunks {} (helpers {}), checkpoint batches {} (helpers {})",
            stats.transactions,
            stats.checkpoints,
            stats.checkpoint_flushes,
            stats.commit_chunks,
            stats.commit_chunks_by_helpers,
            stats.checkpoint_batches,
            stats.checkpoint_batches_by_helpers
        );
    }
}

/// A memory copy of everything `dev` holds.
fn snapshot(dev: &dyn BlockDevice) -> MemDevice {
    let mut bytes = vec![0u8; dev.size_bytes() as usize];
    dev.read_at(0, &mut bytes).unwrap();
    MemDevice::from_bytes(bytes)
}

/// Holds the first write batch inside `range` (up to ten seconds) until a second one inside
/// `range` starts, which only another thread can submit: the test sees cooperation on any
/// machine load, and without it fails after the wait. Records the blocks of every batch
/// inside `range`, in submission order.
struct Rendezvous {
    range: std::ops::Range<u64>,
    arrived: parking_lot::Mutex<usize>,
    second_arrived: parking_lot::Condvar,
    batches: parking_lot::Mutex<Vec<Vec<u64>>>,
}

impl Rendezvous {
    /// A copy of `mem` whose write batches meet at the returned rendezvous.
    fn device(mem: &MemDevice, range: std::ops::Range<u64>) -> (Arc<dyn BlockDevice>, Arc<Self>) {
        let rendezvous = Arc::new(Rendezvous {
            range,
            arrived: parking_lot::Mutex::new(0),
            second_arrived: parking_lot::Condvar::new(),
            batches: Default::default(),
        });
        let hook = {
            let rendezvous = rendezvous.clone();
            move |writes: &[blockdev::Write<'_>]| rendezvous.meet(writes)
        };
        let dev = Arc::new(HookedDevice { inner: MemDevice::from_bytes(mem.snapshot()), hook });
        (dev, rendezvous)
    }

    fn meet(&self, writes: &[blockdev::Write<'_>]) {
        if !writes.iter().all(|w| self.range.contains(&w.offset)) {
            return;
        }
        let blocks = writes.iter().map(|w| w.offset / BLOCK_SIZE as u64).collect();
        self.batches.lock().push(blocks);
        let mut arrived = self.arrived.lock();
        *arrived += 1;
        if *arrived == 1 {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while *arrived == 1 {
                if self.second_arrived.wait_until(&mut arrived, deadline).timed_out() {
                    break;
                }
            }
        } else if *arrived == 2 {
            self.second_arrived.notify_all();
        }
    }
}

#[test]
fn fsync_callers_waiting_for_a_commit_help_write_its_log_blocks() {
    let (mem, loc) = formatted_mem(JOURNAL_BLOCKS, ChecksumVersion::V3);
    let log = FS_BLOCKS * BLOCK_SIZE as u64..device_bytes(JOURNAL_BLOCKS);
    let (dev, rendezvous) = Rendezvous::device(&mem, log);
    let journal = open(dev.clone(), &loc, config("classic,commit_io=cooperative"));
    let blocks = 20..80u64;
    let mut h = journal.start(blocks.clone().count() as u32).unwrap();
    for block in blocks.clone() {
        h.modify(&journal.read_buffer(block).unwrap(), fill(block as u8)).unwrap();
    }
    let tid = h.stop().unwrap();
    let start = std::sync::Barrier::new(4);
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                start.wait();
                journal.commit_and_wait(tid).unwrap();
            });
        }
    });
    let stats = journal.stats();
    // 60 images, a descriptor and no revoke block: 61 log blocks in chunks of 8.
    assert_eq!(stats.commit_chunks, 8, "{stats:?}");
    assert_eq!(stats.commit_chunks_by_owner + stats.commit_chunks_by_helpers, 8, "{stats:?}");
    assert!(stats.commit_chunks_by_helpers > 0, "waiting fsyncs helped: {stats:?}");
    assert_eq!(rendezvous.batches.lock().len(), 8, "one write batch per chunk");
    journal.abandon();
    let image = snapshot(&*dev);
    let report = recover(&image, &loc, 1).unwrap();
    assert_eq!(report.transactions, 1);
    for block in blocks {
        assert_eq!(read_block(&image, block), vec![block as u8; 1024], "block {block}");
    }
}

#[test]
fn threads_short_of_log_space_join_one_checkpoint_round_with_one_flush() {
    let (mem, loc) = formatted_mem(JOURNAL_BLOCKS, ChecksumVersion::V3);
    let (dev, rendezvous) = Rendezvous::device(&mem, 0..FS_BLOCKS * BLOCK_SIZE as u64);
    let journal = open(dev.clone(), &loc, config("classic,checkpoint_io=cooperative"));
    // Ten durable transactions of 40 distinct blocks: each round must write all 40 home.
    for txn in 0..10u64 {
        let mut h = journal.start(40).unwrap();
        // Dirtied in descending order: the round sorts them.
        for block in (20 + txn * 40..60 + txn * 40).rev() {
            h.modify(&journal.read_buffer(block).unwrap(), fill(block as u8)).unwrap();
        }
        journal.commit_and_wait(h.stop().unwrap()).unwrap();
    }
    let start = std::sync::Barrier::new(4);
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                start.wait();
                journal.checkpoint_all().unwrap();
            });
        }
    });
    let stats = journal.stats();
    assert_eq!(stats.checkpoints, 10, "{stats:?}");
    assert_eq!(stats.checkpoint_flushes, 10, "one flush per round, not per batch: {stats:?}");
    assert_eq!(stats.checkpoint_batches, 10 * 8, "40 writes in batches of 5: {stats:?}");
    assert!(stats.checkpoint_batches_by_helpers > 0, "joined threads wrote batches: {stats:?}");
    let batches = rendezvous.batches.lock().clone();
    assert_eq!(batches.len(), 10 * 8, "every home write went out in a batch: {batches:?}");
    for batch in &batches {
        assert!(batch.windows(2).all(|w| w[0] < w[1]), "a batch sorted by block: {batch:?}");
    }
    journal.shutdown().unwrap();
    let image = snapshot(&*dev);
    assert!(!recover(&image, &loc, 1).unwrap().needed, "clean after shutdown");
    for block in 20..420u64 {
        assert_eq!(read_block(&image, block), vec![block as u8; 1024], "block {block}");
    }
}
