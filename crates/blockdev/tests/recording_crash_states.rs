//! Behaviour of the recording device's crash states, checked against an independent oracle.
//!
//! Every write fills each of its sectors with its own tag (`seq + 1`), so the source of every
//! sector of a crash image can be read back from the image itself, and the durability rules can
//! be checked sector by sector without trusting `materialize`.

use std::collections::HashMap;

use blockdev::recording::{CrashKind, CrashOptions, CrashState, RecordedOp, RecordingDevice};
use blockdev::{BlockDevice, SECTOR_SIZE};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const SECTOR: usize = SECTOR_SIZE as usize;
const BLOCK: usize = 4096;
const BLOCKS: usize = 32;

/// A write's data: every sector holds `seq + 1` as little-endian u64s (0 means "never written").
fn tagged(seq: usize, len: usize) -> Vec<u8> {
    let tag = (seq as u64 + 1).to_le_bytes();
    tag.iter().copied().cycle().take(len).collect()
}

/// The tag of every sector of `image`; panics on a sector mixing two writes (a torn sector).
fn sector_tags(image: &[u8]) -> Vec<u64> {
    image
        .chunks(SECTOR)
        .map(|s| {
            let tag = u64::from_le_bytes(s[..8].try_into().unwrap());
            assert!(s.chunks(8).all(|w| w == tag.to_le_bytes()), "sector mixes two writes");
            tag
        })
        .collect()
}

struct WriteInfo {
    index: usize,
    first_sector: usize,
    sectors: usize,
    fua: bool,
    seq: usize,
}

fn writes_of(ops: &[RecordedOp]) -> Vec<WriteInfo> {
    ops.iter()
        .enumerate()
        .filter_map(|(index, op)| match op {
            RecordedOp::Write { offset, data, fua, seq } => Some(WriteInfo {
                index,
                first_sector: *offset as usize / SECTOR,
                sectors: data.len() / SECTOR,
                fua: *fua,
                seq: *seq,
            }),
            _ => None,
        })
        .collect()
}

/// A seeded random workload: writes of 1–3 blocks (some FUA, some overlapping), flushes, marks.
fn random_workload(seed: u64, ops: usize) -> RecordingDevice {
    let mut rng = StdRng::seed_from_u64(seed);
    let dev = RecordingDevice::new(vec![0; BLOCKS * BLOCK]);
    let mut seq = 0;
    let mut mark = 0;
    for _ in 0..ops {
        match rng.gen_range(0..10) {
            0..=6 => {
                let blocks = rng.gen_range(1..=3);
                let start = rng.gen_range(0..=BLOCKS - blocks);
                let data = tagged(seq, blocks * BLOCK);
                if rng.gen_bool(0.2) {
                    dev.write_fua_at((start * BLOCK) as u64, &data).unwrap();
                } else {
                    dev.write_at((start * BLOCK) as u64, &data).unwrap();
                }
                seq += 1;
            }
            7 | 8 => dev.flush().unwrap(),
            _ => {
                dev.mark(mark);
                mark += 1;
            }
        }
    }
    dev
}

/// Checks one crash image against the durability rules, independently of `materialize`.
fn check_state(dev: &RecordingDevice, ops: &[RecordedOp], state: &CrashState) {
    let image = dev.materialize(state);
    let tags = sector_tags(&image);
    let writes = writes_of(ops);
    let by_seq: HashMap<u64, &WriteInfo> = writes.iter().map(|w| (w.seq as u64 + 1, w)).collect();
    let happened = &ops[..state.crash_at];
    let covers = happened
        .iter()
        .filter_map(|op| match op {
            RecordedOp::Flush { covers } => Some(*covers),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let durable = |w: &WriteInfo| w.index < state.crash_at && (w.fua || w.seq < covers);
    let why = state.describe();

    for (sector, &tag) in tags.iter().enumerate() {
        if tag == 0 {
            continue;
        }
        let source = by_seq.get(&tag).unwrap_or_else(|| panic!("unknown tag {tag}: {why}"));
        let in_flight = state.torn.as_ref().is_some_and(|t| t.op_index == source.index);
        assert!(
            source.index < state.crash_at || in_flight,
            "sector {sector} holds op {} from after the crash: {why}",
            source.index
        );
        assert!((source.first_sector..source.first_sector + source.sectors).contains(&sector));
    }
    // A durable write's sector holds that write or a later one, never older data.
    for w in writes.iter().filter(|w| durable(w)) {
        let range = w.first_sector..w.first_sector + w.sectors;
        for (sector, &holder) in range.clone().zip(&tags[range]) {
            let newer = holder != 0 && by_seq[&holder].index >= w.index;
            assert!(newer, "durable op {} lost at sector {sector}: {why}", w.index);
        }
    }
    // No sector holds a write older than another one that reached it (applied, or the torn
    // write's sectors): once a write to a sector has completed, a later one replaces it in
    // the cache, and the older data cannot reach the media after the newer.
    let mut reached: Vec<usize> = state.applied.clone();
    if let Some(torn) = &state.torn {
        reached.push(torn.op_index);
    }
    for &index in &reached {
        let Some(w) = writes.iter().find(|w| w.index == index) else { continue };
        let range = w.first_sector..w.first_sector + w.sectors;
        for (sector, &holder) in range.clone().zip(&tags[range]) {
            let torn_elsewhere = state.torn.as_ref().is_some_and(|t| {
                t.op_index == index && !t.sectors.contains(&((sector - w.first_sector) as u32))
            });
            if torn_elsewhere {
                continue;
            }
            let newer = holder != 0 && by_seq[&holder].index >= w.index;
            assert!(newer, "op {index} reached sector {sector} but older data shows: {why}");
        }
    }
    // At a flush boundary exactly the durable writes are on media.
    if state.kind == CrashKind::FlushBoundary {
        let mut expected = vec![0u64; tags.len()];
        for w in writes.iter().filter(|w| durable(w)) {
            expected[w.first_sector..w.first_sector + w.sectors].fill(w.seq as u64 + 1);
        }
        assert_eq!(tags, expected, "flush boundary image differs from the durable writes: {why}");
    }
    let expected_marks: Vec<u64> = happened
        .iter()
        .filter_map(|op| match op {
            RecordedOp::Mark(label) => Some(*label),
            _ => None,
        })
        .collect();
    assert_eq!(state.marks, expected_marks, "{why}");
}

fn seeds() -> Vec<u64> {
    match std::env::var("QUILL_SEED") {
        Ok(s) => vec![s.parse().expect("QUILL_SEED must be a u64")],
        Err(_) => (1..=12).collect(),
    }
}

#[test]
fn crash_state_never_loses_a_fua_write_or_a_flushed_write() {
    for seed in seeds() {
        eprintln!("seed {seed} (rerun with QUILL_SEED={seed})");
        let dev = random_workload(seed, 60);
        let ops = dev.ops();
        let opts = CrashOptions {
            subsets_per_gap: 6,
            torn_per_gap: 3,
            seed,
            max_states: None,
            ..CrashOptions::default()
        };
        let states = dev.crash_states(&opts);
        assert!(!states.is_empty());
        for state in &states {
            check_state(&dev, &ops, state);
        }
    }
}

#[test]
fn flush_covers_only_writes_completed_before_it_was_issued() {
    let dev = RecordingDevice::new(vec![0; 4 * BLOCK]);
    dev.write_at(0, &tagged(0, BLOCK)).unwrap();
    let flush = dev.flush_begin();
    // Completes while the flush is in flight: logged before the flush, not covered by it.
    dev.write_at(BLOCK as u64, &tagged(1, BLOCK)).unwrap();
    dev.flush_end(flush);
    let ops = dev.ops();
    assert!(matches!(ops[2], RecordedOp::Flush { covers: 1 }));

    let states = dev.crash_states(&CrashOptions::default());
    let boundary = states.iter().find(|s| s.kind == CrashKind::FlushBoundary).unwrap();
    assert_eq!(boundary.crash_at, 3);
    let tags = sector_tags(&dev.materialize(boundary));
    assert!(tags[..8].iter().all(|&t| t == 1), "the write before the flush was lost");
    assert!(tags[8..16].iter().all(|&t| t == 0), "the write during the flush became durable");
    // The uncovered write is still pending after the flush: some state has it, some does not.
    let with_second: Vec<bool> = states
        .iter()
        .map(|s| sector_tags(&dev.materialize(s))[8..16].iter().all(|&t| t == 2))
        .collect();
    assert!(with_second.contains(&true) && with_second.contains(&false));
}

#[test]
fn torn_write_applies_a_proper_subset_of_sectors() {
    // Writes to distinct blocks, so a torn write's sectors are told apart from everything else.
    let dev = RecordingDevice::new(vec![0; BLOCKS * BLOCK]);
    for seq in 0..6 {
        dev.write_at((seq * BLOCK) as u64, &tagged(seq, BLOCK)).unwrap();
    }
    dev.flush().unwrap();
    for seq in 6..10 {
        dev.write_at((seq * BLOCK) as u64, &tagged(seq, BLOCK)).unwrap();
    }
    dev.write_fua_at((10 * BLOCK) as u64, &tagged(10, BLOCK)).unwrap();
    let ops = dev.ops();
    let opts = CrashOptions {
        subsets_per_gap: 0,
        torn_per_gap: 20,
        seed: 5,
        max_states: None,
        ..CrashOptions::default()
    };
    let torn: Vec<CrashState> =
        dev.crash_states(&opts).into_iter().filter(|s| s.kind == CrashKind::Torn).collect();
    assert!(!torn.is_empty());
    for state in &torn {
        let t = state.torn.as_ref().unwrap();
        let RecordedOp::Write { offset, seq, .. } = &ops[t.op_index] else {
            panic!("torn op is not a write: {}", state.describe())
        };
        let tags = sector_tags(&dev.materialize(state));
        let first = *offset as usize / SECTOR;
        let landed: Vec<u32> =
            (0..8u32).filter(|&i| tags[first + i as usize] == *seq as u64 + 1).collect();
        assert!(!landed.is_empty() && landed.len() < 8, "{}", state.describe());
        assert_eq!(landed, t.sectors, "{}", state.describe());
        check_state(&dev, &ops, state);
    }
    // The in-flight FUA write (op 11, just after the last barrier) is among the torn ones.
    assert!(torn.iter().any(|s| s.torn.as_ref().unwrap().op_index == 11));
}

#[test]
fn all_pending_writes_in_log_order_reproduce_the_live_image() {
    let dev = random_workload(99, 80);
    let end = dev.ops_len();
    let states = dev.crash_states(&CrashOptions::default());
    let all = states
        .iter()
        .filter(|s| s.crash_at == end && s.torn.is_none())
        .max_by_key(|s| s.applied.len())
        .unwrap();
    assert!(all.applied.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(dev.materialize(all), dev.live_image());
}

#[test]
fn every_flush_and_the_log_end_get_a_flush_boundary_state() {
    let dev = random_workload(3, 50);
    let ops = dev.ops();
    let states = dev.crash_states(&CrashOptions::default());
    for (i, op) in ops.iter().enumerate() {
        if matches!(op, RecordedOp::Flush { .. }) {
            // Consecutive flushes with nothing between them produce one state, not two.
            let covered = states.iter().any(|s| {
                s.kind == CrashKind::FlushBoundary
                    && s.crash_at <= i + 1
                    && ops[s.crash_at..=i].iter().all(|o| matches!(o, RecordedOp::Flush { .. }))
            });
            assert!(covered, "no flush boundary state for the flush at op {i}");
        }
    }
    assert!(states.iter().any(|s| s.kind == CrashKind::FlushBoundary && s.crash_at == ops.len()));
}

#[test]
fn crash_states_are_deterministic_given_the_seed_and_sampled_to_the_maximum() {
    let dev = random_workload(11, 80);
    let opts = CrashOptions {
        subsets_per_gap: 5,
        torn_per_gap: 2,
        seed: 42,
        max_states: None,
        ..CrashOptions::default()
    };
    let a = dev.crash_states(&opts);
    assert_eq!(a, dev.crash_states(&opts));
    let other = dev.crash_states(&CrashOptions { seed: 43, ..opts.clone() });
    assert_ne!(a, other, "a different seed chose exactly the same subsets");

    let sampled = dev.crash_states(&CrashOptions { max_states: Some(10), ..opts });
    assert_eq!(sampled.len(), 10);
    assert_eq!(sampled[0], a[0]);
    assert!(sampled.windows(2).all(|w| w[0].crash_at <= w[1].crash_at));
    assert!(sampled.iter().all(|s| a.contains(s)));
}

#[test]
fn marks_note_acknowledgements_in_log_order() {
    let dev = RecordingDevice::new(vec![0; 2 * BLOCK]);
    dev.write_fua_at(0, &tagged(0, BLOCK)).unwrap();
    dev.mark(7);
    dev.write_at(BLOCK as u64, &tagged(1, BLOCK)).unwrap();
    dev.flush().unwrap();
    dev.mark(8);
    let states = dev.crash_states(&CrashOptions::default());
    let end = states.iter().find(|s| s.crash_at == dev.ops_len()).unwrap();
    assert_eq!(end.marks, vec![7, 8]);
    let before_flush = states.iter().find(|s| s.crash_at == 3).unwrap();
    assert_eq!(before_flush.marks, vec![7]);
    assert!(before_flush.describe().contains("marks [7]"));
}

#[test]
fn crash_states_of_an_empty_log_is_the_initial_image() {
    let dev = RecordingDevice::new(vec![9; 1024]);
    let states = dev.crash_states(&CrashOptions::default());
    assert_eq!(states.len(), 1);
    assert_eq!(dev.materialize(&states[0]), vec![9; 1024]);
    assert_eq!(dev.initial_image(), &[9; 1024][..]);
}
