//! Push, iterate and claim throughput of the S1 lock-free list (`LfList`) against lists behind a
//! `parking_lot::Mutex` (JBD2's `j_list_lock`): a `Vec` (the fastest locked list) and a
//! `LinkedList` (a node per item, as JBD2's lists and `LfList` have), at 1, 2, 4 and 16
//! threads: `cargo bench -p journal --bench lists`.
//!
//! Each measurement starts once every thread is spawned and waiting (a barrier), so thread
//! creation is not timed, and ends when the last thread is done. Sizes are small so a run
//! stays short on a two-core machine; `LISTS_BENCH_ITEMS` changes them.

// The list is crate-private to the journal; the benchmark compiles the same source file.
// `cargo clippy --benches` builds this with cfg(test) but no harness: the module's unit tests
// are dropped and their imports go unused.
#[allow(unused_imports)]
#[path = "../src/lockfree_list.rs"]
mod lockfree_list;
#[allow(unused_imports)]
#[path = "../src/sync.rs"]
mod sync;

use criterion::measurement::WallTime;
use criterion::{
    criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion, Throughput,
};
use lockfree_list::LfList;
use parking_lot::Mutex;
use std::collections::LinkedList;
use std::sync::Barrier;
use std::time::{Duration, Instant};

const THREADS: [usize; 4] = [1, 2, 4, 16];
const ITEMS_DEFAULT: usize = 1 << 16;

fn items() -> usize {
    std::env::var("LISTS_BENCH_ITEMS").ok().and_then(|s| s.parse().ok()).unwrap_or(ITEMS_DEFAULT)
}

/// The mutex-protected list: a `Vec` and the index of the next unclaimed item.
struct LockedList {
    items: Vec<u64>,
    claimed_next: usize,
}

/// Runs `work(thread)` on `threads` threads at once and returns the time from the moment all
/// are ready until the last finishes.
fn timed_threads(threads: usize, work: impl Fn(usize) + Sync) -> Duration {
    let barrier = Barrier::new(threads + 1);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|thread| {
                let (barrier, work) = (&barrier, &work);
                scope.spawn(move || {
                    barrier.wait();
                    work(thread);
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        workers.into_iter().for_each(|worker| worker.join().unwrap());
        start.elapsed()
    })
}

fn filled_lockfree(items: usize) -> LfList<u64> {
    let list = LfList::new();
    (0..items as u64).for_each(|value| drop(list.push(value)));
    list
}

fn filled_locked(items: usize) -> Mutex<LockedList> {
    Mutex::new(LockedList { items: (0..items as u64).collect(), claimed_next: 0 })
}

fn filled_linked(items: usize) -> Mutex<LinkedList<u64>> {
    Mutex::new((0..items as u64).collect())
}

/// Benchmarks `work(list, thread)` on `threads` threads at once, each round on a list from
/// `make()`; making and dropping the list are not timed.
fn bench_threads<L: Sync>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    threads: usize,
    make: impl Fn() -> L,
    work: impl Fn(&L, usize) + Sync,
) {
    group.bench_function(BenchmarkId::new(name, threads), |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| {
                    let list = make();
                    timed_threads(threads, |thread| work(&list, thread))
                })
                .sum()
        })
    });
}

fn push(c: &mut Criterion) {
    let items = items();
    let mut group = c.benchmark_group("push");
    group.throughput(Throughput::Elements(items as u64));
    for threads in THREADS {
        let per_thread = items / threads;
        let values = move |thread: usize| {
            let base = (thread * per_thread) as u64;
            base..base + per_thread as u64
        };
        bench_threads(&mut group, "lockfree", threads, LfList::new, |list, thread| {
            values(thread).for_each(|value| drop(list.push(value)))
        });
        bench_threads(
            &mut group,
            "mutex_vec",
            threads,
            || filled_locked(0),
            |list, thread| values(thread).for_each(|value| list.lock().items.push(value)),
        );
        bench_threads(
            &mut group,
            "mutex_linked",
            threads,
            || filled_linked(0),
            |list, thread| values(thread).for_each(|value| list.lock().push_back(value)),
        );
    }
    group.finish();
}

/// Every thread walks the whole list (the committing thread and concurrent readers).
fn iterate(c: &mut Criterion) {
    let items = items();
    let sum_expected = (items as u64) * (items as u64 - 1) / 2;
    let mut group = c.benchmark_group("iterate");
    let lockfree = filled_lockfree(items);
    let locked = filled_locked(items);
    let linked = filled_linked(items);
    for threads in THREADS {
        group.throughput(Throughput::Elements((items * threads) as u64));
        bench_threads(
            &mut group,
            "lockfree",
            threads,
            || &lockfree,
            |list, _| assert_eq!(list.iter().sum::<u64>(), sum_expected),
        );
        bench_threads(
            &mut group,
            "mutex_vec",
            threads,
            || &locked,
            |list, _| assert_eq!(list.lock().items.iter().sum::<u64>(), sum_expected),
        );
        bench_threads(
            &mut group,
            "mutex_linked",
            threads,
            || &linked,
            |list, _| assert_eq!(list.lock().iter().sum::<u64>(), sum_expected),
        );
    }
    group.finish();
}

/// Threads take distinct items until none is left (cooperative commit/checkpoint I/O).
fn claim(c: &mut Criterion) {
    let items = items();
    let mut group = c.benchmark_group("claim");
    group.throughput(Throughput::Elements(items as u64));
    for threads in THREADS {
        bench_threads(
            &mut group,
            "lockfree",
            threads,
            || filled_lockfree(items),
            |list, _| {
                while let Some(claimed) = list.claim() {
                    std::hint::black_box(*claimed);
                }
            },
        );
        bench_threads(
            &mut group,
            "mutex_vec",
            threads,
            || filled_locked(items),
            |list, _| loop {
                let mut list = list.lock();
                let Some(&claimed) = list.items.get(list.claimed_next) else { break };
                list.claimed_next += 1;
                drop(list);
                std::hint::black_box(claimed);
            },
        );
        bench_threads(
            &mut group,
            "mutex_linked",
            threads,
            || filled_linked(items),
            |list, _| {
                while let Some(claimed) = list.lock().pop_front() {
                    std::hint::black_box(claimed);
                }
            },
        );
    }
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! { name = lists; config = config(); targets = push, iterate, claim }
criterion_main!(lists);
