//! Regression tests for bugs found in review: a checkpoint racing a revoke's commit, a durable
//! revoke hidden by a later one, and a panicking stage thread hanging fsync.

mod common;

use blockdev::memory::MemDevice;
use blockdev::BlockDevice;
use common::*;
use journal::{recover, superblock, JournalConfig};
use ondisk::jbd2::ChecksumVersion;
use std::sync::Arc;
use std::time::Duration;

/// A checkpoint stalled between choosing its transaction and marking its buffers must not write
/// home a block whose revoke became durable (and which the caller reused) in the meantime.
#[test]
fn a_checkpoint_racing_a_revoke_commit_does_not_overwrite_the_reused_block() {
    let (dev, loc) = formatted_mem(1024, ChecksumVersion::V3);
    let journal = Arc::new(open(dev.clone(), &loc, JournalConfig::classic()));
    let a = journal.read_buffer(40).unwrap();
    commit_fills(&journal, &[(40, 1), (41, 2)]);
    let t2 = commit_revoke(&journal, 41, false);

    // Holding buffer 40's lock stalls the checkpoint between its snapshot and its collect.
    let checkpoint = a.read(|_| {
        let j = journal.clone();
        let checkpoint = std::thread::spawn(move || j.checkpoint_all());
        std::thread::sleep(Duration::from_millis(300));
        journal.commit_and_wait(t2).unwrap(); // the revoke is durable
        dev.write_at(41 * 1024, &[0xEE; 1024]).unwrap(); // so the caller reuses the block
        checkpoint
    });
    checkpoint.join().unwrap().unwrap();
    assert_eq!(read_block(&*dev, 41)[0], 0xEE, "checkpoint wrote the revoked T1 copy home");
}

/// A second revoke that is not yet durable must not hide the first one that is: the
/// checkpoint must not write the revoked copy home.
#[test]
fn a_durable_revoke_still_counts_after_the_block_is_revoked_again() {
    let (dev, loc) = formatted_mem(1024, ChecksumVersion::V3);
    let journal = open(dev.clone(), &loc, JournalConfig::classic());
    commit_fills(&journal, &[(41, 2)]);
    commit_revoke(&journal, 41, true);
    dev.write_at(41 * 1024, &[0xEE; 1024]).unwrap(); // reused after the revoke is durable
    let mut h = journal.start(1).unwrap();
    h.revoke(41).unwrap(); // freed again; not committed yet
    h.stop().unwrap();
    journal.checkpoint_all().unwrap();
    let home = read_block(&*dev, 41)[0];
    journal.abandon(); // crash: the second revoke never commits
    recover(&*dev, &loc, 1).unwrap();
    assert_eq!(home, 0xEE, "checkpoint wrote the revoked T1 copy home");
    assert_eq!(read_block(&*dev, 41)[0], 0xEE);
}

#[test]
fn a_block_beyond_32_bits_is_refused_by_a_journal_without_64bit() {
    let dev = Arc::new(MemDevice::new(device_bytes(1024)));
    let loc = location(1024);
    let options = superblock::FormatOptions {
        checksum: ChecksumVersion::V3,
        is_64bit: false,
        ..Default::default()
    };
    superblock::format(&*dev, &loc, options).unwrap();
    let journal = open(dev.clone(), &loc, JournalConfig::classic());
    let mut h = journal.start(2).unwrap();
    assert!(matches!(h.revoke(1 << 33), Err(journal::JournalError::Invalid(_))));
    let far = journal.new_buffer(1 << 33);
    assert!(h.modify(&far, |b| b[0] = 1).is_err());
    drop(h);
    journal.shutdown().unwrap();
}

#[test]
fn a_panicking_commit_stage_aborts_the_journal_instead_of_hanging_fsync() {
    let (mem, loc) = formatted_mem(1024, ChecksumVersion::V3);
    // Batched writes panic once armed: a bug deep in the commit stage.
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let dev = Arc::new(HookedDevice {
        inner: MemDevice::from_bytes(mem.snapshot()),
        hook: {
            let armed = armed.clone();
            move |_: &[blockdev::Write<'_>]| {
                assert!(!armed.load(std::sync::atomic::Ordering::SeqCst), "injected panic")
            }
        },
    });
    let journal = Arc::new(open(dev.clone(), &loc, JournalConfig::classic()));
    let buffer = journal.read_buffer(5).unwrap();
    let mut h = journal.start(1).unwrap();
    h.modify(&buffer, fill(1)).unwrap();
    let tid = h.stop().unwrap();
    armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let (tx, rx) = std::sync::mpsc::channel();
    let j = journal.clone();
    std::thread::spawn(move || {
        let _ = tx.send(j.commit_and_wait(tid));
    });
    let outcome =
        rx.recv_timeout(Duration::from_secs(30)).expect("fsync returned instead of hanging");
    match outcome {
        Err(journal::JournalError::Aborted { cause, .. }) => {
            assert!(cause.contains("panicked"), "{cause}")
        }
        other => panic!("expected an abort, got {other:?}"),
    }
    // Sticky: every later call reports the abort.
    assert!(matches!(journal.start(1), Err(journal::JournalError::Aborted { .. })));
}

/// A journal with no log (a file system without one, opened read-only) reads metadata
/// through its buffer cache, starts no handle, and writes nothing, its shutdown included.
#[test]
fn a_journal_without_a_log_reads_and_never_writes() {
    let dev = Arc::new(MemDevice::new(4096 * 1024));
    dev.write_at(7 * 1024, &[0x5A; 1024]).unwrap();
    let before = dev.snapshot();
    let journal =
        journal::Journal::without_log_read_only(dev.clone(), 1024, JournalConfig::classic())
            .unwrap();
    assert_eq!(journal.read_buffer(7).unwrap().to_vec(), vec![0x5A; 1024]);
    assert!(journal.start(1).is_err(), "a handle started on a journal without a log");
    journal.shutdown().unwrap();
    assert!(dev.snapshot() == before, "the device was written");
}

/// A journal without a log that writes (ext2): a commit writes each block home once, Early
/// blocks (Early winning over Late), then a flush, then the unmarked ones, a flush, then Late
/// ones and the flush that makes it durable; the stand-in log at block 0 is never written, nor is any superblock.
#[test]
fn a_journal_without_a_log_writes_home_in_the_order_asked() {
    use blockdev::recording::{RecordedOp, RecordingDevice};
    use journal::HomeOrder;
    const BS: u64 = 1024;
    let dev = Arc::new(RecordingDevice::new(vec![0u8; 4096 * 1024]));
    let journal =
        journal::Journal::without_log(dev.clone(), BS as u32, JournalConfig::cjfs()).unwrap();
    let mut handle = journal.start(8).unwrap();
    for (block, byte) in [(100u64, 1u8), (200, 2), (300, 3), (400, 4)] {
        let buffer = journal.read_buffer(block).unwrap();
        handle.modify(&buffer, |b| b.fill(byte)).unwrap();
    }
    handle.order_home_write(300, HomeOrder::Late);
    handle.order_home_write(200, HomeOrder::Early);
    handle.order_home_write(400, HomeOrder::Late);
    handle.order_home_write(400, HomeOrder::Early); // Early wins
    let tid = handle.stop().unwrap();
    journal.commit_and_wait(tid).unwrap();
    // What the device saw: (block, or None for a flush).
    let seen: Vec<Option<u64>> = dev
        .ops()
        .into_iter()
        .filter_map(|op| match op {
            RecordedOp::Write { offset, .. } => Some(Some(offset / BS)),
            RecordedOp::Flush { .. } => Some(None),
            _ => None,
        })
        .collect();
    let early = &seen[..2];
    assert!(early.contains(&Some(200)) && early.contains(&Some(400)), "{seen:?}");
    assert_eq!(seen[2..], [None, Some(100), None, Some(300), None], "{seen:?}");
    assert_eq!(journal.last_durable(), tid);
    let image = dev.live_image();
    assert!(image[300 * 1024..301 * 1024].iter().all(|&b| b == 3));
    // A second transaction over one block: written home again at its commit; the shutdown
    // writes nothing but a flush (no checkpoint copy, no journal superblock).
    let mut handle = journal.start(1).unwrap();
    handle.modify(&journal.read_buffer(100).unwrap(), |b| b.fill(9)).unwrap();
    let tid = handle.stop().unwrap();
    journal.commit_and_wait(tid).unwrap();
    let before_shutdown = dev.ops_len();
    journal.shutdown().unwrap();
    let after: Vec<RecordedOp> = dev.ops().into_iter().skip(before_shutdown).collect();
    assert!(after.iter().all(|op| matches!(op, RecordedOp::Flush { .. })), "{after:?}");
    let image = dev.live_image();
    assert!(image[100 * 1024..101 * 1024].iter().all(|&b| b == 9));
    assert!(image[..64 * 1024].iter().all(|&b| b == 0), "the stand-in log was written");
}
