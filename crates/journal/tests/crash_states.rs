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
use journal::{recover, superblock, JournalConfig};
use ondisk::jbd2::ChecksumVersion;
use ondisk::Tid;
use std::collections::HashMap;
use std::sync::Arc;

fn states_wanted() -> usize {
    std::env::var("QUILL_CRASH_STATES").ok().and_then(|s| s.parse().ok()).unwrap_or(1000)
}

fn explore(preset: &str, seed: u64) {
    let (formatted, loc) = formatted_mem(JOURNAL_BLOCKS, ChecksumVersion::V3);
    let recording = Arc::new(RecordingDevice::new(formatted.snapshot()));
    let journal = open(recording.clone(), &loc, JournalConfig::preset(preset).unwrap());
    let layout = StampLayout { threads: 4, shared_blocks: 6 };
    // Enough handles that the 1024-block log checkpoints and wraps during the run.
    let history =
        run_stamp_workload(&journal, &layout, 250, 2, &|tid| recording.mark(tid.0 as u64));
    let stats = journal.stats();
    journal.abandon();
    assert!(
        stats.checkpoints > 0,
        "{preset}: the run must checkpoint to cover tail moves: {stats:?}"
    );

    let options = CrashOptions {
        subsets_per_gap: 6,
        torn_per_gap: 3,
        seed,
        max_states: Some(states_wanted()),
    };
    let states = recording.crash_states(&options);
    let mut kinds: HashMap<CrashKind, usize> = HashMap::new();
    let base = history.first_tid();
    let mut prefixes = Vec::new();
    for state in &states {
        *kinds.entry(state.kind).or_default() += 1;
        let image = Arc::new(MemDevice::from_bytes(recording.materialize(state)));
        let report = recover(&*image, &loc, 1).unwrap_or_else(|e| {
            panic!("{preset} seed {seed}: recovery failed on {}: {e}", state.describe())
        });
        assert_eq!(
            superblock::read_superblock(&*image, &loc).unwrap().start,
            0,
            "journal left clean"
        );
        let acked: Vec<Tid> = state.marks.iter().map(|&m| Tid(m as u32)).collect();
        let reader = |b: u64| read_block(&*image, b);
        let prefix = history.check_prefix(&layout, base, &reader, &acked).unwrap_or_else(|e| {
            panic!(
                "{preset} seed {seed}: {} (replayed {} transactions): {e}",
                state.describe(),
                report.transactions
            )
        });
        prefixes.push(prefix);
    }
    assert!(kinds.len() == 3, "{preset}: every kind of crash state explored: {kinds:?}");
    prefixes.sort_unstable();
    prefixes.dedup();
    assert!(
        prefixes.len() > 10,
        "{preset}: crash states cover many distinct prefixes: {prefixes:?}"
    );
    eprintln!(
        "{preset}: {} crash states ({kinds:?}), {} distinct recovered prefixes, {} transactions, {} checkpoints",
        states.len(),
        prefixes.len(),
        stats.transactions,
        stats.checkpoints
    );
}

#[test]
fn every_crash_state_of_the_classic_preset_recovers_a_committed_prefix_with_every_acknowledged_fsync(
) {
    explore("classic", seed("crash classic", 11));
}

#[test]
fn every_crash_state_with_compound_flush_and_shadow_versions_recovers_a_committed_prefix() {
    explore("cjfs", seed("crash cjfs", 12));
}
