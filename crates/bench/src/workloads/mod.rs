//! The seed papers' workloads, written against [`FsApi`] so each runs unchanged on every
//! target. Each module documents what it does and which reference tool it follows; this one
//! holds the multi-threaded driver they share and the per-thread counters.
//!
//! - [`varmail`]: filebench varmail (shared and per-thread directories), metadata and fsync.
//! - [`dbench`]: the dbench program on mounted targets.
//! - [`fsx`]: xfstests' fsx operation mix on mounted targets, every read checked.
//! - [`oltp`]: redo-log appends with fdatasync and table growth.
//! - [`tokubench`]: small-file creates over a wide tree, no fsync.
//! - [`randwrite`]: sysbench's random overwrites with an fsync each.
//! - [`fileserver`]: filebench fileserver, FAST'18's data-intensive workload: whole-file
//!   writes, appends, whole-file reads, deletes and stats, no fsync; file count and mean size
//!   are [`fileserver::Shape`] (1,000 files of mean 128 KiB by default).
//! - [`fsync_load`]: fsync latency against a background writer.
//!
//! Timing covers only the measured phase: each workload prepares its files first (timed
//! separately, excluded), syncs, and then runs its threads until the budget is spent.

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::SeedableRng;

use crate::fsapi::{FsApi, OpenFile};

pub mod dbench;
pub mod fileserver;
pub mod fsx;
pub mod fsync_load;
pub mod oltp;
pub mod randwrite;
pub mod sequential;
pub mod tokubench;
pub mod varmail;

/// A workload by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    VarmailShared,
    VarmailSplit,
    Dbench,
    OltpInsert,
    Tokubench,
    RandwriteFsync,
    Fileserver,
    FsyncUnderLoad,
    SeqWrite,
    SeqRead,
    Fsx,
    /// Fill the journal, crash, time the replay (see `recovery.rs`; not an [`FsApi`] workload).
    Recovery,
}

impl Workload {
    pub const ALL: [Workload; 12] = [
        Workload::VarmailShared,
        Workload::VarmailSplit,
        Workload::Dbench,
        Workload::OltpInsert,
        Workload::Tokubench,
        Workload::RandwriteFsync,
        Workload::Fileserver,
        Workload::FsyncUnderLoad,
        Workload::SeqWrite,
        Workload::SeqRead,
        Workload::Fsx,
        Workload::Recovery,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Workload::VarmailShared => "varmail-shared",
            Workload::VarmailSplit => "varmail-split",
            Workload::Dbench => "dbench",
            Workload::OltpInsert => "oltp-insert",
            Workload::Tokubench => "tokubench",
            Workload::RandwriteFsync => "randwrite-fsync",
            Workload::Fileserver => "fileserver",
            Workload::FsyncUnderLoad => "fsync-under-load",
            Workload::SeqWrite => "seq-write",
            Workload::SeqRead => "seq-read",
            Workload::Fsx => "fsx",
            Workload::Recovery => "recovery",
        }
    }

    pub fn parse(name: &str) -> Option<Workload> {
        Workload::ALL.into_iter().find(|w| w.name() == name)
    }

    /// What the thread count means for this workload (for tables and `--help`).
    pub fn threads_meaning(self) -> &'static str {
        match self {
            Workload::Dbench => "dbench clients",
            Workload::Fsx => "exercisers, each on its own file",
            Workload::FsyncUnderLoad => "ignored: one fsync thread, one background writer",
            Workload::Recovery => "ignored: replay threads come from the target's settings",
            _ => "worker threads",
        }
    }

    /// Whether the workload can run open loop ([`WorkloadParams::arrival_rate`]): dbench paces
    /// itself, fsync-under-load is one fsync thread against a writer, recovery is a replay.
    pub fn runs_open_loop(self) -> bool {
        !matches!(
            self,
            Workload::Dbench | Workload::Fsx | Workload::FsyncUnderLoad | Workload::Recovery
        )
    }

    /// The name a run is reported under: the workload's, with `@<rate>/s` for an open-loop
    /// run, so each offered rate is its own row (see [`open_loop_rate`]).
    pub fn label(self, arrival_rate: Option<f64>) -> String {
        match arrival_rate {
            None => self.name().to_string(),
            Some(rate) => format!("{}@{}/s", self.name(), rate),
        }
    }

    /// Whether the thread count is swept. fsync-under-load is one fsync thread against one
    /// background writer (its load is the writer's MB/s); recovery's replay threads are a
    /// target setting. Both run once per round, at "1 thread".
    pub fn sweeps_threads(self) -> bool {
        !matches!(self, Workload::Recovery | Workload::FsyncUnderLoad)
    }
}

/// The offered rate of a run reported as `<workload>@<rate>/s` (see [`Workload::label`]).
pub fn open_loop_rate(label: &str) -> Option<f64> {
    let (_, rate) = label.split_once('@')?;
    rate.strip_suffix("/s")?.parse().ok()
}

/// How big a workload's file set is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Size {
    /// The smallest size that still exercises every operation (the test suite's).
    Smallest,
    /// The papers' parameters scaled to a 2-core machine.
    Default,
}

/// What one run of a workload is given.
#[derive(Debug, Clone)]
pub struct WorkloadParams {
    pub threads: usize,
    /// Measured phase length.
    pub duration: Duration,
    /// If set, each thread stops after this many iterations even before `duration` (tests).
    pub iterations: Option<u64>,
    pub size: Size,
    pub seed: u64,
    /// fsync-under-load: the background writers' total rate in MB/s (10^6 bytes).
    pub background_mb_per_sec: f64,
    /// fileserver: the file count and mean size (`None`: the size's default).
    pub fileserver: fileserver::Shape,
    /// Called once the workload's files are prepared, just before its threads start: the
    /// target's engine figures count from here.
    pub on_start: StartHook,
    /// Open loop: iterations arrive at this many per second (Poisson, from the seed) whether
    /// or not earlier ones finished, and the threads are a pool serving them in arrival order
    /// (see [`run_threads`]). `None`: the closed loop, each thread starting its next iteration
    /// when its last one ends.
    pub arrival_rate: Option<f64>,
}

/// See [`WorkloadParams::on_start`].
#[derive(Clone, Default)]
pub struct StartHook(pub Option<std::sync::Arc<dyn Fn() + Send + Sync>>);

impl std::fmt::Debug for StartHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "StartHook(set)" } else { "StartHook(none)" })
    }
}

impl WorkloadParams {
    pub fn new(threads: usize, duration: Duration, size: Size) -> WorkloadParams {
        WorkloadParams {
            threads,
            duration,
            iterations: None,
            size,
            seed: 0x5157_494c_4c42_454e, // "QUILLBEN"
            background_mb_per_sec: 50.0,
            fileserver: fileserver::Shape::default(),
            on_start: StartHook::default(),
            arrival_rate: None,
        }
    }

    /// A per-thread random generator, reproducible from the seed.
    pub fn rng(&self, thread: usize) -> SmallRng {
        SmallRng::seed_from_u64(self.seed ^ (thread as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }
}

/// Counts kept by one thread and merged at the end (no shared counters on the hot path).
#[derive(Debug, Default, Clone)]
pub struct Counters {
    /// Operations as the reference tool counts them.
    pub ops: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub files_created: u64,
    /// fsync/fdatasync latencies in microseconds.
    pub fsync_us: Vec<u64>,
    /// Open loop: each served iteration's response time in microseconds, from its arrival
    /// (not from when a thread got to it) to its end, so queueing counts.
    pub response_us: Vec<u64>,
}

impl Counters {
    pub fn merge(&mut self, other: Counters) {
        self.ops += other.ops;
        self.bytes_read += other.bytes_read;
        self.bytes_written += other.bytes_written;
        self.files_created += other.files_created;
        self.fsync_us.extend(other.fsync_us);
        self.response_us.extend(other.response_us);
    }

    /// fsync (or fdatasync with `data_only`) `file`, recording the latency.
    pub fn timed_sync(&mut self, file: &mut dyn OpenFile, data_only: bool) -> io::Result<()> {
        let began = Instant::now();
        if data_only {
            file.fdatasync()?;
        } else {
            file.fsync()?;
        }
        self.fsync_us.push(began.elapsed().as_micros() as u64);
        Ok(())
    }

    pub fn write(&mut self, file: &mut dyn OpenFile, offset: u64, data: &[u8]) -> io::Result<()> {
        file.write_at(offset, data)?;
        self.bytes_written += data.len() as u64;
        Ok(())
    }
}

/// What the measured phase produced.
#[derive(Debug, Default)]
pub struct Measured {
    pub seconds: f64,
    pub counters: Counters,
    /// The reference tool's own MB/s, where it reports one and the byte counts are unknown.
    pub mb_per_sec: Option<f64>,
    /// Anything the table should say about the run (the reference tool's own figure).
    pub note: String,
    /// Open loop: iterations that arrived within the measured phase, and how many of them no
    /// thread had started when it ended (the backlog of an overloaded target).
    pub arrivals: u64,
    pub unserved: u64,
}

/// Whether a thread has more to do.
pub enum Step {
    More,
    Done,
}

/// Runs `body(thread, iteration, counters)` on `threads` threads, released together, until the
/// budget is spent or every thread says [`Step::Done`]; `iteration` counts the thread's own
/// calls. The first error stops every thread and is returned, with the thread that met it.
///
/// Closed loop (the default): each thread runs its next iteration as soon as its last one
/// ends, so at most `threads` iterations (and fsyncs) are ever in flight and a slower fsync
/// also slows the arrival of the next. Open loop ([`WorkloadParams::arrival_rate`]): the
/// iterations' arrival times are drawn up front (a Poisson process, from the seed) and the
/// threads are a pool taking them in order, each waiting for its arrival's time when early;
/// a response is timed from the arrival, so time spent queued behind busy threads counts.
pub fn run_threads<F>(params: &WorkloadParams, threads: usize, body: F) -> io::Result<Measured>
where
    F: Fn(usize, u64, &mut Counters) -> io::Result<Step> + Sync,
{
    let arrivals =
        params.arrival_rate.map(|rate| arrival_offsets(rate, params.duration, params.seed));
    let next_arrival = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let barrier = Barrier::new(threads + 1);
    let (results, seconds) = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|thread| {
                let (stop, barrier, body) = (&stop, &barrier, &body);
                let (arrivals, next_arrival) = (arrivals.as_deref(), &next_arrival);
                scope.spawn(move || -> io::Result<Counters> {
                    let mut counters = Counters::default();
                    barrier.wait();
                    let started = Instant::now();
                    for iteration in 0u64.. {
                        let over = stop.load(Ordering::Relaxed)
                            || started.elapsed() >= params.duration
                            || params.iterations.is_some_and(|n| iteration >= n);
                        if over {
                            break;
                        }
                        // Open loop: take the next arrival and wait for its time.
                        let arrived = match arrivals {
                            None => None,
                            Some(offsets) => {
                                let Some(&at) =
                                    offsets.get(next_arrival.fetch_add(1, Ordering::Relaxed))
                                else {
                                    break;
                                };
                                let at = started + at;
                                let now = Instant::now();
                                if at > now {
                                    std::thread::sleep(at - now);
                                }
                                Some(at)
                            }
                        };
                        match body(thread, iteration, &mut counters) {
                            Ok(Step::More) => {}
                            Ok(Step::Done) => break,
                            Err(err) => {
                                stop.store(true, Ordering::Relaxed);
                                return Err(io::Error::new(
                                    err.kind(),
                                    format!("thread {thread}, iteration {iteration}: {err}"),
                                ));
                            }
                        }
                        if let Some(at) = arrived {
                            counters.response_us.push(at.elapsed().as_micros() as u64);
                        }
                    }
                    Ok(counters)
                })
            })
            .collect();
        if let Some(hook) = &params.on_start.0 {
            hook();
        }
        barrier.wait();
        let started = Instant::now();
        let results: Vec<io::Result<Counters>> = workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|_| Err(io::Error::other("a worker panicked"))))
            .collect();
        (results, started.elapsed().as_secs_f64())
    });
    let mut counters = Counters::default();
    for result in results {
        counters.merge(result?);
    }
    // Every arrival a thread took was served before it joined (or the run failed).
    let (arrivals, unserved) = match &arrivals {
        None => (0, 0),
        Some(offsets) => {
            let served = counters.response_us.len() as u64;
            (offsets.len() as u64, (offsets.len() as u64).saturating_sub(served))
        }
    };
    Ok(Measured { seconds, counters, arrivals, unserved, ..Default::default() })
}

/// The arrival times of a Poisson process of `rate` per second over `duration`, as offsets
/// from the start (exponential gaps drawn from `seed`).
pub fn arrival_offsets(rate: f64, duration: Duration, seed: u64) -> Vec<Duration> {
    let gap = rand_distr::Exp::new(rate).expect("arrival rate is positive and finite");
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x6172_7269_7661_6c73); // "arrivals"
    let mut at = 0.0f64;
    let mut offsets = Vec::new();
    loop {
        at += rand_distr::Distribution::sample(&gap, &mut rng);
        if at >= duration.as_secs_f64() {
            return offsets;
        }
        offsets.push(Duration::from_secs_f64(at));
    }
}

/// Runs `workload` (any but recovery) on `api`; `mounted` is the directory the target is
/// mounted on, for workloads that run an external program (dbench).
pub fn run(
    workload: Workload,
    api: &dyn FsApi,
    mounted: Option<&Path>,
    params: &WorkloadParams,
) -> io::Result<Measured> {
    if params.threads == 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "threads must be at least 1"));
    }
    if params.arrival_rate.is_some() && !workload.runs_open_loop() {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("{} has no open-loop form", workload.name()),
        ));
    }
    match workload {
        Workload::VarmailShared => varmail::run(api, params, varmail::Layout::Shared),
        Workload::VarmailSplit => varmail::run(api, params, varmail::Layout::PerThread),
        Workload::Dbench => match mounted {
            Some(dir) => dbench::run(dir, params),
            None => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "dbench runs on mounted targets only",
            )),
        },
        Workload::Fsx => match mounted {
            Some(dir) => fsx::run(dir, params),
            None => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "fsx maps files: it runs on mounted targets only",
            )),
        },
        Workload::OltpInsert => oltp::run(api, params),
        Workload::Tokubench => tokubench::run(api, params),
        Workload::RandwriteFsync => randwrite::run(api, params),
        Workload::Fileserver => fileserver::run(api, params),
        Workload::FsyncUnderLoad => fsync_load::run(api, params),
        Workload::SeqWrite => sequential::write(api, params),
        Workload::SeqRead => sequential::read(api, params),
        Workload::Recovery => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "recovery is run by the runner, per target (recovery.rs)",
        )),
    }
}

/// [`run_threads`] for filebench personalities: `body(thread, rng, chunk, counters)` runs one
/// loop of flowops with the thread's own generator and a read buffer of `chunk_bytes`, until
/// the budget is spent.
pub fn run_flowop_threads<F>(
    params: &WorkloadParams,
    chunk_bytes: usize,
    body: F,
) -> io::Result<Measured>
where
    F: Fn(usize, &mut SmallRng, &mut [u8], &mut Counters) -> io::Result<()> + Sync,
{
    // Each thread's generator and read buffer (locked only by their own thread).
    let locals: Vec<parking_lot::Mutex<(SmallRng, Vec<u8>)>> = (0..params.threads)
        .map(|t| parking_lot::Mutex::new((params.rng(t), vec![0u8; chunk_bytes])))
        .collect();
    run_threads(params, params.threads, |thread, _, c| {
        let (rng, chunk) = &mut *locals[thread].lock();
        body(thread, rng, chunk, c)?;
        Ok(Step::More)
    })
}

/// Takes an entry of a filebench-style file set that `wanted` accepts, as filebench marks a
/// file entry busy: starts at a random entry, skips busy ones (locked by another thread), and
/// waits while every candidate is busy. Returns its index, locked.
pub fn take_entry<'a, E>(
    entries: &'a [parking_lot::Mutex<E>],
    rng: &mut SmallRng,
    wanted: impl Fn(&E) -> bool,
) -> (usize, parking_lot::MutexGuard<'a, E>) {
    assert!(!entries.is_empty(), "a file set has entries");
    loop {
        let start = rand::Rng::gen_range(rng, 0..entries.len());
        for k in 0..entries.len() {
            let i = (start + k) % entries.len();
            if let Some(entry) = entries[i].try_lock() {
                if wanted(&entry) {
                    return (i, entry);
                }
            }
        }
        std::thread::yield_now();
    }
}

/// A buffer of `len` bytes of a recognizable, non-zero pattern.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len).map(|i| (seed as usize).wrapping_add(i.wrapping_mul(31)) as u8 | 1).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrivals_are_a_seeded_poisson_process_inside_the_duration() {
        let second = Duration::from_secs(1);
        let a = arrival_offsets(10_000.0, second, 7);
        assert_eq!(a, arrival_offsets(10_000.0, second, 7), "reproducible from the seed");
        assert_ne!(a, arrival_offsets(10_000.0, second, 8));
        // 10,000 expected; 5 standard deviations is 500.
        assert!((a.len() as i64 - 10_000).abs() < 500, "{} arrivals", a.len());
        assert!(a.windows(2).all(|w| w[0] <= w[1]) && *a.last().unwrap() < second);
        // Exponential gaps: about 1/e of them longer than the mean gap of 100 µs.
        let long = a.windows(2).filter(|w| w[1] - w[0] > Duration::from_micros(100)).count();
        let share = long as f64 / a.len() as f64;
        assert!((share - (-1.0f64).exp()).abs() < 0.03, "{share}");
    }

    #[test]
    fn open_loop_labels_carry_the_rate() {
        assert_eq!(Workload::OltpInsert.label(None), "oltp-insert");
        assert_eq!(Workload::OltpInsert.label(Some(2500.0)), "oltp-insert@2500/s");
        assert_eq!(open_loop_rate("oltp-insert@2500/s"), Some(2500.0));
        assert_eq!(open_loop_rate("varmail-shared@0.5/s"), Some(0.5));
        assert_eq!(open_loop_rate("varmail-shared"), None);
    }
}
