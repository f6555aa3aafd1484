//! Crash states: a multi-threaded handle workload on the recording device; for every crash
//! image at every flush boundary, plus sampled subsets and reorderings of unflushed writes and
//! torn sectors, recovery must yield exactly a committed prefix of transactions that includes
//! every transaction whose commit was acknowledged, and never a partial transaction.
//!
//! CI explores up to 1000 states per preset; `QUILL_CRASH_STATES=5000` (with QUILL_SEED) explores
//! more.

mod common;

use blockdev::memory::MemDevice;
use blockdev::recording::{CrashKind, CrashOptions, RecordingDevice};
use common::*;
use journal::{recover, superblock};
use ondisk::jbd2::ChecksumVersion;
use ondisk::Tid;
use std::collections::HashMap;
use std::sync::Arc;

fn states_wanted() -> usize {
    std::env::var("QUILL_CRASH_STATES").ok().and_then(|s| s.parse().ok()).unwrap_or(1000)
}

fn explore(spec: &str, spread_blocks: u64, seed: u64) {
    let (formatted, loc) = formatted_mem(JOURNAL_BLOCKS, ChecksumVersion::V3);
    let recording = Arc::new(RecordingDevice::new(formatted.snapshot()));
    let journal = open(recording.clone(), &loc, config(spec));
    let layout = StampLayout { threads: 4, shared_blocks: 6, spread_blocks };
    // Enough handles that the 1024-block log checkpoints and wraps during the run.
    let history =
        run_stamp_workload(&journal, &layout, 250, 2, &|tid| recording.mark(tid.0 as u64));
    let stats = journal.stats();
    journal.abandon();
    assert!(
        stats.checkpoints > 0,
        "{spec}: the run must checkpoint to cover tail moves: {stats:?}"
    );

    let options = CrashOptions {
        subsets_per_gap: 6,
        torn_per_gap: 3,
        seed,
        max_states: Some(states_wanted()),
        ..CrashOptions::default()
    };
    let states = recording.crash_states(&options);
    let mut kinds: HashMap<CrashKind, usize> = HashMap::new();
    let base = history.first_tid();
    let mut prefixes = Vec::new();
    for state in &states {
        *kinds.entry(state.kind).or_default() += 1;
        let raw = recording.materialize(state);
        let commit_tids = commit_block_tids(&raw, &loc);
        let (report, image) = recover_checking_parallel(raw, &loc, &state.describe());
        let report = report.unwrap_or_else(|e| {
            panic!("{spec} seed {seed}: recovery failed on {}: {e}", state.describe())
        });
        // Commit blocks reach the disk in tid order (compound flush shares the flush, not
        // the order): no commit block lies past the end recovery found, where a later life
        // reusing those tids could meet it.
        let end = Tid(report.end_tid);
        if let Some(beyond) = commit_tids.iter().find(|t| t.is_after(end)) {
            panic!(
                "{spec} seed {seed}: {}: a commit block of {beyond:?} is on disk beyond the end \
                 of the log recovery found ({end:?})",
                state.describe()
            );
        }
        assert_eq!(
            superblock::read_superblock(&*image, &loc).unwrap().start,
            0,
            "journal left clean"
        );
        let acked: Vec<Tid> = state.marks.iter().map(|&m| Tid(m as u32)).collect();
        let reader = |b: u64| read_block(&*image, b);
        let prefix = history.check_prefix(&layout, base, &reader, &acked).unwrap_or_else(|e| {
            panic!(
                "{spec} seed {seed}: {} (replayed {} transactions): {e}",
                state.describe(),
                report.transactions
            )
        });
        prefixes.push(prefix);
    }
    assert!(kinds.len() == 3, "{spec}: every kind of crash state explored: {kinds:?}");
    prefixes.sort_unstable();
    prefixes.dedup();
    assert!(prefixes.len() > 10, "{spec}: crash states cover many distinct prefixes: {prefixes:?}");
    eprintln!(
        "{spec}: {} crash states ({kinds:?}), {} distinct recovered prefixes, {} transactions, {} checkpoints",
        states.len(),
        prefixes.len(),
        stats.transactions,
        stats.checkpoints
    );
}

/// The tids of every block of the log area of `image` that carries a commit block header.
fn commit_block_tids(image: &[u8], loc: &journal::JournalLocation) -> Vec<Tid> {
    let bs = loc.block_size() as usize;
    (1..loc.len_blocks())
        .filter_map(|i| {
            let offset = loc.device_offset(i).expect("inside the journal") as usize;
            let header = ondisk::jbd2::parse_header(&image[offset..offset + bs])?;
            (header.block_type == ondisk::jbd2::BlockType::Commit as u32).then_some(header.sequence)
        })
        .collect()
}

#[test]
fn every_crash_state_of_the_classic_preset_recovers_a_committed_prefix_with_every_acknowledged_fsync(
) {
    explore("classic", 0, seed("crash classic", 11));
}

/// The paper's compound flush: up to five transactions share a flush, then their commit blocks
/// go out with FUA in turn.
const COMPOUND_FLUSH: &str =
    "cjfs,commit_record=fua,committing_max=5,flush_batch_max=5,versions_max=5";

#[test]
fn every_crash_state_with_compound_flush_and_shadow_versions_recovers_a_committed_prefix() {
    explore(COMPOUND_FLUSH, 0, seed("crash cjfs compound flush", 12));
}

#[test]
fn every_crash_state_with_chained_commit_blocks_recovers_a_committed_prefix() {
    explore("cjfs", 0, seed("crash cjfs chained", 16));
    explore("dual,commit_record=chained", 0, seed("crash dual chained", 17));
}

/// The CJFS paper's device: each commit block is an order-preserving write after its log
/// blocks, and one flush makes a compound-flush group durable. A commit block written plainly
/// instead (no order) fails this test: the recording device lets it reach the media before its
/// log blocks.
#[test]
fn every_crash_state_with_barrier_commit_blocks_recovers_a_committed_prefix() {
    explore("cjfs,commit_record=barrier,flush_batch_max=5", 0, seed("crash cjfs barrier", 19));
    explore("classic,commit_record=barrier", 0, seed("crash classic barrier", 20));
}

/// A device without a cache barrier (here an overlay, like a file image) cannot order a commit
/// block: the journal refuses to open rather than write commit blocks it cannot order.
#[test]
fn barrier_commit_blocks_are_refused_on_a_device_without_a_cache_barrier() {
    let (formatted, loc) = formatted_mem(JOURNAL_BLOCKS, ChecksumVersion::V3);
    let plain = Arc::new(blockdev::overlay::OverlayDevice::new(formatted));
    let err = journal::Journal::open(plain, loc, config("cjfs,commit_record=barrier"))
        .err()
        .expect("barrier commit blocks on a device without a barrier");
    assert!(err.to_string().contains("cache barrier"), "{err}");
}

#[test]
fn every_crash_state_with_cooperative_commit_and_checkpoint_io_recovers_a_committed_prefix() {
    explore(
        "classic,commit_io=cooperative,checkpoint_io=cooperative",
        120,
        seed("crash classic cooperative", 14),
    );
    explore(
        "cjfs,commit_io=cooperative,checkpoint_io=cooperative",
        120,
        seed("crash cjfs cooperative", 15),
    );
}

/// Two lives: crash during a cjfs run (several transactions in flight, compound flush),
/// recover, run again on the recovered image, crash again, recover again. The second life must
/// recover to a committed prefix of its own transactions, and nothing it did not write may
/// change: a transaction of the first life left half-committed in the log must never be
/// replayed once its tid is reused.
#[test]
fn a_second_crash_after_recovery_never_replays_stale_transactions_of_the_first_life() {
    two_lives(COMPOUND_FLUSH, seed("two lives, compound flush", 13));
    two_lives("cjfs", seed("two lives, chained", 18));
    two_lives("cjfs,commit_record=barrier", seed("two lives, barrier", 21));
}

fn two_lives(spec: &str, seed: u64) {
    let (formatted, loc) = formatted_mem(JOURNAL_BLOCKS, ChecksumVersion::V3);
    let first = Arc::new(RecordingDevice::new(formatted.snapshot()));
    let journal = open(first.clone(), &loc, config(spec));
    let layout = StampLayout { threads: 4, shared_blocks: 6, spread_blocks: 0 };
    run_stamp_workload(&journal, &layout, 250, 2, &|tid| first.mark(tid.0 as u64));
    journal.abandon();
    let sample = CrashOptions {
        subsets_per_gap: 2,
        torn_per_gap: 2,
        seed,
        max_states: Some(40),
        ..CrashOptions::default()
    };
    let (counter_block, first_data_block, rounds) = (399u64, 400u64, 30u32);
    let mut second_states = 0;
    for state in first.crash_states(&sample) {
        let image = Arc::new(MemDevice::from_bytes(first.materialize(&state)));
        recover(&*image, &loc, 1).unwrap();
        let after_first = image.snapshot();
        let second = Arc::new(RecordingDevice::new(after_first.clone()));
        let journal = open(second.clone(), &loc, config(spec));
        for round in 1..=rounds {
            let counter = journal.read_buffer(counter_block).unwrap();
            let data = journal.read_buffer(first_data_block + round as u64).unwrap();
            let mut h = journal.start(2).unwrap();
            h.modify(&counter, |b| b[..4].copy_from_slice(&round.to_le_bytes())).unwrap();
            h.modify(&data, |b| b.fill(round as u8)).unwrap();
            let tid = h.stop().unwrap();
            journal.commit_and_wait(tid).unwrap();
            second.mark(round as u64);
        }
        journal.abandon();
        let options = CrashOptions {
            subsets_per_gap: 2,
            torn_per_gap: 1,
            seed: seed + 1,
            max_states: Some(15),
            ..CrashOptions::default()
        };
        for crash in second.crash_states(&options) {
            let image = Arc::new(MemDevice::from_bytes(second.materialize(&crash)));
            recover(&*image, &loc, 1)
                .unwrap_or_else(|e| panic!("{spec}, second life, {}: {e}", crash.describe()));
            let block = |b: u64| read_block(&*image, b);
            let reached = u32::from_le_bytes(block(counter_block)[..4].try_into().unwrap());
            let acked = crash.marks.iter().copied().max().unwrap_or(0) as u32;
            let context = format!(
                "{spec}: first life {}, second life {}",
                state.describe(),
                crash.describe()
            );
            assert!(
                reached >= acked,
                "{context}: acknowledged round {acked} lost (reached {reached})"
            );
            for round in 1..=rounds {
                let want = if round <= reached {
                    vec![round as u8; BLOCK_SIZE as usize]
                } else {
                    vec![0; BLOCK_SIZE as usize]
                };
                assert_eq!(
                    block(first_data_block + round as u64),
                    want,
                    "{context}: round {round}"
                );
            }
            // Nothing outside the second life's blocks and the journal changed.
            let journal_start = (FS_BLOCKS * BLOCK_SIZE as u64) as usize;
            let second_life = (counter_block * BLOCK_SIZE as u64) as usize
                ..((first_data_block + rounds as u64 + 1) * BLOCK_SIZE as u64) as usize;
            let now = image.snapshot();
            for (i, (a, b)) in
                after_first[..journal_start].iter().zip(&now[..journal_start]).enumerate()
            {
                if !second_life.contains(&i) && a != b {
                    panic!(
                        "{context}: byte {i} (block {}) changed: a stale transaction was replayed",
                        i / BLOCK_SIZE as usize
                    );
                }
            }
            second_states += 1;
        }
    }
    eprintln!("two lives: {second_states} second-life crash states checked");
    assert!(second_states > 200);
}
