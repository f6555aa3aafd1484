//! data=ordered: data registered with a handle is on the media no later than the commit block
//! that exposes it, in every crash state.

mod common;

use blockdev::recording::{CrashOptions, RecordingDevice};
use blockdev::BlockDevice;
use common::*;
use journal::{JournalConfig, OrderedWrite};
use ondisk::jbd2::ChecksumVersion;
use std::sync::Arc;

#[test]
fn ordered_data_is_durable_whenever_its_transaction_is_acknowledged() {
    for preset in ["classic", "cjfs"] {
        let (formatted, loc) = formatted_mem(JOURNAL_BLOCKS, ChecksumVersion::V3);
        let recording = Arc::new(RecordingDevice::new(formatted.snapshot()));
        let journal = open(recording.clone(), &loc, JournalConfig::preset(preset).unwrap());
        let inode_block = journal.read_buffer(7).unwrap();
        for round in 1..=20u8 {
            // The "file data" lives outside the journal; the metadata block points at it.
            let data_block = 300 + round as u64;
            let data = vec![round; BLOCK_SIZE as usize];
            let mut h = journal.start(1).unwrap();
            h.add_ordered_data(Arc::new(OrderedWrite {
                device: recording.clone() as Arc<dyn BlockDevice>,
                offset: data_block * BLOCK_SIZE as u64,
                data,
            }))
            .unwrap();
            h.modify(&inode_block, |b| b[0] = round).unwrap();
            let tid = h.stop().unwrap();
            journal.commit_and_wait(tid).unwrap();
            recording.mark(round as u64);
        }
        journal.abandon();
        let states = recording.crash_states(&CrashOptions { seed: 5, ..Default::default() });
        assert!(states.len() > 40, "{preset}: {} states", states.len());
        for state in &states {
            let image = recording.materialize(state);
            let block = |b: u64| {
                &image[(b * BLOCK_SIZE as u64) as usize..((b + 1) * BLOCK_SIZE as u64) as usize]
            };
            for &round in &state.marks {
                let data_block = 300 + round;
                assert!(
                    block(data_block).iter().all(|&x| x == round as u8),
                    "{preset}: ordered data of acknowledged round {round} missing in {}",
                    state.describe()
                );
            }
        }
    }
}

/// A writer that writes its data after its handle stopped (`DataInFlight`): the commit of
/// that handle's transaction waits for it, and a failed write fails the commit.
#[test]
fn a_commit_waits_for_data_its_writer_writes_after_the_handle_stopped() {
    use journal::DataInFlight;
    use std::time::Duration;
    for preset in ["classic", "cjfs"] {
        let (formatted, loc) = formatted_mem(JOURNAL_BLOCKS, ChecksumVersion::V3);
        let journal =
            Arc::new(open(Arc::new(formatted), &loc, JournalConfig::preset(preset).unwrap()));
        let inode_block = journal.read_buffer(7).unwrap();
        for fail in [false, true] {
            let in_flight = DataInFlight::new();
            let mut h = journal.start(1).unwrap();
            h.add_ordered_data(in_flight.clone()).unwrap();
            h.modify(&inode_block, |b| b[0] = 1).unwrap();
            let tid = h.stop().unwrap();
            let waiter = {
                let journal = journal.clone();
                std::thread::spawn(move || journal.commit_and_wait(tid))
            };
            std::thread::sleep(Duration::from_millis(100));
            assert!(
                !journal.last_durable().is_at_or_after(tid),
                "{preset}: {tid:?} became durable before its data was written"
            );
            in_flight.complete(if fail { Err((300 * 4096, 5)) } else { Ok(()) });
            let result = waiter.join().unwrap();
            assert_eq!(result.is_err(), fail, "{preset}, failed write {fail}: {result:?}");
            assert_eq!(journal.is_aborted(), fail, "{preset}: a failed data write aborts");
        }
    }
}
