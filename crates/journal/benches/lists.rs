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

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
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

/// Times `iters` rounds of `round(list)` on fresh lists from `make`; list set-up and drop are
/// not timed.
fn rounds<L>(iters: u64, make: impl Fn() -> L, round: impl Fn(&L) -> Duration) -> Duration {
    (0..iters).map(|_| round(&make())).sum()
}

fn push(c: &mut Criterion) {
    let items = items();
    let mut group = c.benchmark_group("push");
    group.throughput(Throughput::Elements(items as u64));
    for threads in THREADS {
        let per_thread = items / threads;
        group.bench_function(BenchmarkId::new("lockfree", threads), |b| {
            b.iter_custom(|iters| {
                rounds(iters, LfList::<u64>::new, |list| {
                    timed_threads(threads, |thread| {
                        let base = (thread * per_thread) as u64;
                        (0..per_thread as u64).for_each(|i| drop(list.push(base + i)));
                    })
                })
            })
        });
        group.bench_function(BenchmarkId::new("mutex_vec", threads), |b| {
            b.iter_custom(|iters| {
                rounds(
                    iters,
                    || filled_locked(0),
                    |list| {
                        timed_threads(threads, |thread| {
                            let base = (thread * per_thread) as u64;
                            (0..per_thread as u64).for_each(|i| list.lock().items.push(base + i));
                        })
                    },
                )
            })
        });
        group.bench_function(BenchmarkId::new("mutex_linked", threads), |b| {
            b.iter_custom(|iters| {
                rounds(
                    iters,
                    || filled_linked(0),
                    |list| {
                        timed_threads(threads, |thread| {
                            let base = (thread * per_thread) as u64;
                            (0..per_thread as u64).for_each(|i| list.lock().push_back(base + i));
                        })
                    },
                )
            })
        });
    }
    group.finish();
}

/// Every thread walks the whole list (the committing thread and concurrent readers).
fn iterate(c: &mut Criterion) {
    let items = items();
    let mut group = c.benchmark_group("iterate");
    let lockfree = filled_lockfree(items);
    let locked = filled_locked(items);
    let linked = filled_linked(items);
    for threads in THREADS {
        group.throughput(Throughput::Elements((items * threads) as u64));
        group.bench_function(BenchmarkId::new("lockfree", threads), |b| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| {
                        timed_threads(threads, |_| {
                            let sum: u64 = lockfree.iter().sum();
                            assert_eq!(sum, (items as u64) * (items as u64 - 1) / 2);
                        })
                    })
                    .sum()
            })
        });
        group.bench_function(BenchmarkId::new("mutex_vec", threads), |b| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| {
                        timed_threads(threads, |_| {
                            let sum: u64 = locked.lock().items.iter().sum();
                            assert_eq!(sum, (items as u64) * (items as u64 - 1) / 2);
                        })
                    })
                    .sum()
            })
        });
        group.bench_function(BenchmarkId::new("mutex_linked", threads), |b| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| {
                        timed_threads(threads, |_| {
                            let sum: u64 = linked.lock().iter().sum();
                            assert_eq!(sum, (items as u64) * (items as u64 - 1) / 2);
                        })
                    })
                    .sum()
            })
        });
    }
    group.finish();
}

/// Threads take distinct items until none is left (cooperative commit/checkpoint I/O).
fn claim(c: &mut Criterion) {
    let items = items();
    let mut group = c.benchmark_group("claim");
    group.throughput(Throughput::Elements(items as u64));
    for threads in THREADS {
        group.bench_function(BenchmarkId::new("lockfree", threads), |b| {
            b.iter_custom(|iters| {
                rounds(
                    iters,
                    || filled_lockfree(items),
                    |list| timed_threads(threads, |_| while list.claim().is_some() {}),
                )
            })
        });
        group.bench_function(BenchmarkId::new("mutex_vec", threads), |b| {
            b.iter_custom(|iters| {
                rounds(
                    iters,
                    || filled_locked(items),
                    |list| {
                        timed_threads(threads, |_| loop {
                            let mut list = list.lock();
                            if list.claimed_next == list.items.len() {
                                break;
                            }
                            let claimed = list.items[list.claimed_next];
                            list.claimed_next += 1;
                            drop(list);
                            std::hint::black_box(claimed);
                        })
                    },
                )
            })
        });
        group.bench_function(BenchmarkId::new("mutex_linked", threads), |b| {
            b.iter_custom(|iters| {
                rounds(
                    iters,
                    || filled_linked(items),
                    |list| {
                        timed_threads(threads, |_| {
                            while let Some(claimed) = list.lock().pop_front() {
                                std::hint::black_box(claimed);
                            }
                        })
                    },
                )
            })
        });
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
