//! Every fuzz target, on stable Rust under `cargo test`: over its seeds
//! (`quill_fuzzing::seeds`), over the regression inputs in `tests/regressions/<target>/`
//! (inputs that once made a target fail), and over seeded random mutations of both. A target
//! that panics fails the test, naming the input; a panic on another thread (the journal's
//! commit thread in the `image` target) is caught by a panic hook and fails it too.
//!
//! Seeds follow the workspace convention (`QUILL_SEED`, printed). `QUILL_FUZZ_ROUNDS` scales
//! the number of mutations (default 1).

use std::collections::BTreeMap;
use std::panic::{self, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use ondisk::testing::Rng;
use quill_fuzzing::mutate::mutate;
use quill_fuzzing::seeds::seeds;
use quill_fuzzing::TARGETS;

/// Mutations per target at `QUILL_FUZZ_ROUNDS=1`: the parsers are cheap; an `image` input
/// opens and unmounts a file system.
const MUTATIONS_PARSER: usize = 3000;
const MUTATIONS_IMAGE: usize = 400;

/// Panics seen by the hook, on any thread.
static PANICS: AtomicUsize = AtomicUsize::new(0);

fn install_panic_counter() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let default = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            default(info);
        }));
    });
}

/// One test at a time counts panics (the counter is global).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

type Corpus = BTreeMap<&'static str, Vec<(String, Vec<u8>)>>;

/// Every target's seeds and regression inputs, by target; built once for all the tests.
fn corpus() -> &'static Corpus {
    static CORPUS: OnceLock<Corpus> = OnceLock::new();
    CORPUS.get_or_init(build_corpus)
}

fn build_corpus() -> Corpus {
    let mut corpus = Corpus::new();
    for seed in seeds() {
        corpus.entry(seed.target).or_default().push((format!("seed {}", seed.name), seed.bytes));
    }
    let regressions = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/regressions");
    for (target, _) in TARGETS {
        let Ok(dir) = std::fs::read_dir(regressions.join(target)) else { continue };
        let mut files: Vec<_> = dir.filter_map(Result::ok).map(|e| e.path()).collect();
        files.sort();
        for path in files {
            let bytes = std::fs::read(&path).expect("read regression input");
            let name = format!("regression {}", path.display());
            corpus.entry(target).or_default().push((name, bytes));
        }
    }
    corpus
}

/// Runs `target` on `data`; on a panic, fails naming the input (and writing it to a file).
fn run_one(name: &str, target: fn(&[u8]), what: &str, data: &[u8]) {
    let before = PANICS.load(Ordering::SeqCst);
    let result = panic::catch_unwind(AssertUnwindSafe(|| target(data)));
    if result.is_err() || PANICS.load(Ordering::SeqCst) != before {
        let path = std::env::temp_dir().join(format!("quill-fuzz-{name}-{}", std::process::id()));
        let _ = std::fs::write(&path, data);
        panic!(
            "target {name} panicked on {what} ({} bytes, written to {}; replay with \
             `cargo +nightly fuzz run {name} {}` or add it to tests/regressions/{name}/)",
            data.len(),
            path.display(),
            path.display()
        );
    }
}

fn run_target(name: &str) {
    let _serial = serial();
    install_panic_counter();
    let (_, target) = *TARGETS.iter().find(|(n, _)| *n == name).expect("known target");
    let inputs = corpus().get(name).map(Vec::as_slice).unwrap_or_default();
    assert!(!inputs.is_empty(), "target {name} has no seeds");
    let started = Instant::now();
    for (what, data) in inputs {
        run_one(name, target, what, data);
    }
    let rounds: usize =
        std::env::var("QUILL_FUZZ_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(1);
    let per_round = if name == "image" { MUTATIONS_IMAGE } else { MUTATIONS_PARSER };
    let mut rng = Rng::from_env(&format!("fuzz target {name}"));
    for i in 0..per_round * rounds {
        let (_, seed) = &inputs[rng.below(inputs.len() as u64) as usize];
        let (_, other) = &inputs[rng.below(inputs.len() as u64) as usize];
        let data = mutate(&mut rng, seed, other);
        run_one(name, target, &format!("mutation {i}"), &data);
    }
    println!(
        "{name}: {} seeds and regressions, {} mutations in {:.1?}",
        inputs.len(),
        per_round * rounds,
        started.elapsed()
    );
}

#[test]
fn superblock_survives_seeds_and_mutations() {
    run_target("superblock");
}

#[test]
fn group_desc_survives_seeds_and_mutations() {
    run_target("group_desc");
}

#[test]
fn inode_survives_seeds_and_mutations() {
    run_target("inode");
}

#[test]
fn indirect_map_survives_seeds_and_mutations() {
    run_target("indirect_map");
}

#[test]
fn inline_data_survives_seeds_and_mutations() {
    run_target("inline_data");
}

#[test]
fn quota_tree_survives_seeds_and_mutations() {
    run_target("quota_tree");
}

#[test]
fn extent_node_survives_seeds_and_mutations() {
    run_target("extent_node");
}

#[test]
fn dir_block_survives_seeds_and_mutations() {
    run_target("dir_block");
}

#[test]
fn htree_survives_seeds_and_mutations() {
    run_target("htree");
}

#[test]
fn xattr_block_survives_seeds_and_mutations() {
    run_target("xattr_block");
}

#[test]
fn jbd2_survives_seeds_and_mutations() {
    run_target("jbd2");
}

#[test]
fn fast_commit_survives_seeds_and_mutations() {
    run_target("fast_commit");
}

#[test]
fn image_survives_seeds_and_mutations() {
    run_target("image");
}

#[test]
fn every_target_has_a_test_here() {
    let source = include_str!("targets.rs");
    for (name, _) in TARGETS {
        assert!(source.contains(&format!("run_target(\"{name}\")")), "no test runs {name}");
    }
}

#[test]
#[should_panic(expected = "target demo panicked on a demo input")]
fn a_panicking_target_fails_the_test() {
    let _serial = serial();
    install_panic_counter();
    run_one("demo", |_| panic!("demo target fails"), "a demo input", b"x");
}

#[test]
#[should_panic(expected = "target demo-thread panicked on a demo input")]
fn a_panic_on_another_thread_fails_the_test_too() {
    let _serial = serial();
    install_panic_counter();
    let target: fn(&[u8]) = |_| {
        let _ = std::thread::spawn(|| panic!("demo thread fails")).join();
    };
    run_one("demo-thread", target, "a demo input", b"x");
}
