//! Eight threads write, read and flush one recording device; the log must stay consistent.

use std::sync::Arc;

use blockdev::recording::{CrashOptions, RecordedOp, RecordingDevice};
use blockdev::BlockDevice;

const THREADS: u64 = 8;
const BLOCKS_PER_THREAD: u64 = 8;
const WRITES_PER_THREAD: u64 = 150;
const BLOCK: usize = 4096;

/// Block contents naming the writer and its write number.
fn tagged(thread: u64, i: u64) -> Vec<u8> {
    let tag = (thread << 32 | i).to_le_bytes();
    tag.iter().copied().cycle().take(BLOCK).collect()
}

fn tag_of(data: &[u8]) -> (u64, u64) {
    let tag = u64::from_le_bytes(data[..8].try_into().unwrap());
    (tag >> 32, tag & 0xffff_ffff)
}

#[test]
fn eight_threads_writing_reading_and_flushing_leave_a_consistent_log() {
    let dev =
        Arc::new(RecordingDevice::new(vec![0; (THREADS * BLOCKS_PER_THREAD) as usize * BLOCK]));
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let dev = &dev;
            scope.spawn(move || {
                for i in 0..WRITES_PER_THREAD {
                    let offset =
                        ((t * BLOCKS_PER_THREAD + i % BLOCKS_PER_THREAD) as usize * BLOCK) as u64;
                    let data = tagged(t, i);
                    if i % 7 == 3 {
                        dev.write_fua_at(offset, &data).unwrap();
                    } else {
                        dev.write_at(offset, &data).unwrap();
                    }
                    let mut back = vec![0; BLOCK];
                    dev.read_at(offset, &mut back).unwrap();
                    assert_eq!(back, data, "thread {t} did not read back its write {i}");
                    if i % 10 == 9 {
                        dev.flush().unwrap();
                        // "Everything thread t wrote up to i is acknowledged as durable."
                        dev.mark(t << 32 | i);
                    }
                }
            });
        }
    });

    let ops = dev.ops();
    let mut writes = 0;
    let mut covers_max = 0;
    let mut last_seq_of: Vec<Vec<usize>> = vec![Vec::new(); THREADS as usize];
    let mut fua_of: Vec<Vec<bool>> = vec![Vec::new(); THREADS as usize];
    for op in &ops {
        match op {
            RecordedOp::Write { data, seq, fua, .. } => {
                assert_eq!(*seq, writes, "write seqs must count up in log order");
                writes += 1;
                let (t, i) = tag_of(data);
                assert_eq!(
                    i as usize,
                    last_seq_of[t as usize].len(),
                    "thread {t}'s writes reordered"
                );
                last_seq_of[t as usize].push(*seq);
                fua_of[t as usize].push(*fua);
            }
            RecordedOp::Flush { covers } => {
                assert!(*covers <= writes, "a flush covers writes logged after it");
                covers_max = covers_max.max(*covers);
            }
            RecordedOp::Barrier => panic!("this test writes no barriers"),
            RecordedOp::Mark(label) => {
                // The flush that returned before this mark covered all of the thread's earlier
                // writes (a flush covers what completed before it was issued).
                let (t, upto) = (label >> 32, label & 0xffff_ffff);
                for i in 0..=upto as usize {
                    let seq = last_seq_of[t as usize][i];
                    assert!(
                        fua_of[t as usize][i] || seq < covers_max,
                        "thread {t}'s write {i} (seq {seq}) not durable at its mark"
                    );
                }
            }
        }
    }
    assert_eq!(writes as u64, THREADS * WRITES_PER_THREAD);

    // Replaying every write in log order gives the live image.
    let end = ops.len();
    let states = dev.crash_states(&CrashOptions {
        subsets_per_gap: 0,
        torn_per_gap: 0,
        seed: 1,
        max_states: None,
        ..CrashOptions::default()
    });
    let all = states
        .iter()
        .filter(|s| s.crash_at == end && s.torn.is_none())
        .max_by_key(|s| s.applied.len())
        .expect("a state with every pending write at the end of the log");
    assert_eq!(dev.materialize(all), dev.live_image());
}
