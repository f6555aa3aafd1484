//! What a benchmark run produces: one [`RunResult`] per (workload, target, threads, round), and
//! one [`Summary`] per (workload, target, threads) over its rounds, plus the device probe.
//! These are the records written as JSON and CSV and drawn by `plot.rs`.

use serde::{Deserialize, Serialize};

use crate::percentile::{median, percentile};

/// The figures of the journal engine and the device queue over one run (quill targets only).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct EngineFigures {
    pub transactions: u64,
    pub handles_per_transaction: f64,
    /// Buffers a running transaction touched while its in-flight versions were used up
    /// (JBD2's page conflicts), per transaction.
    pub conflicts_per_transaction: f64,
    /// Device flushes issued to commit, per transaction (compound flush shares them).
    pub flushes_per_transaction: f64,
    /// Milliseconds transactions spent locked (waiting for handles and conflicts), writing
    /// their log blocks, and waiting for the flush and commit block, summed over transactions.
    pub ms_locked: f64,
    pub ms_writing: f64,
    pub ms_flushing: f64,
    /// Device operations outstanding, averaged over submissions, and the most ever seen.
    pub queue_depth_mean: f64,
    pub queue_depth_max: u64,
    /// Milliseconds in the device flushes that precede commit blocks, summed over
    /// transactions (the part of `ms_flushing` that is the device's own flush).
    #[serde(default)]
    pub ms_device_flush: f64,
    /// Milliseconds threads waited for each of the engine's locks, by JBD2's name
    /// (`j_state_lock(read)`, `j_list_lock`, ...), over the run.
    #[serde(default)]
    pub lock_wait_ms: Vec<(String, f64)>,
    /// Where transactions spend their time and what they wait on (CJFS's stages), each in
    /// milliseconds summed over transactions: open (Running), due but waiting for a committing
    /// slot, held by conflicts, Written but waiting for the flush stage, and writing commit
    /// blocks (per group).
    #[serde(default)]
    pub ms_running: f64,
    #[serde(default)]
    pub ms_slot_wait: f64,
    #[serde(default)]
    pub ms_conflict_wait: f64,
    #[serde(default)]
    pub ms_flush_queue: f64,
    #[serde(default)]
    pub ms_commit_fua: f64,
    /// The commit writing ordered file data or waiting for its writers (part of writing).
    #[serde(default)]
    pub ms_ordered_wait: f64,
    /// Handles started, and milliseconds they waited to start (a locked transaction, log
    /// space), summed over handles.
    #[serde(default)]
    pub handles: u64,
    #[serde(default)]
    pub ms_handle_start_wait: f64,
    /// The most transactions in flight at once (Locked to Written) since the mount.
    #[serde(default)]
    pub in_flight_max: u64,
    /// fsync_journal: fsyncs written as fast commits, the area blocks they took, and the
    /// fsyncs that committed the transaction instead, by reason.
    #[serde(default)]
    pub fast_commits: u64,
    #[serde(default)]
    pub fast_commit_blocks: u64,
    /// Fast commits written to the area (batches of the fsyncs in `fast_commits`).
    #[serde(default)]
    pub fast_commit_writes: u64,
    #[serde(default)]
    pub fast_commit_fallbacks: Vec<(String, u64)>,
    /// Bytes the journal wrote (log blocks, fast-commit area blocks, checkpointed blocks) and
    /// the device flushes and FUA writes it issued (commits, checkpoints, fast commits).
    #[serde(default)]
    pub journal_bytes: u64,
    #[serde(default)]
    pub device_syncs: u64,
    /// quill-fuse targets: the requests quill's FUSE handlers served.
    #[serde(default)]
    pub fuse: Option<FuseFigures>,
}

/// What a quill-fuse target's handlers served over one run (`quill_fuse::RequestStats`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct FuseFigures {
    /// FUSE request threads.
    pub threads: usize,
    /// Per opcode: its name, the requests, and milliseconds in quill's handlers, summed.
    pub ops: Vec<(String, u64, f64)>,
    /// The most fsync requests in quill's handlers at once.
    pub fsyncs_in_flight_max: u64,
}

impl FuseFigures {
    pub fn requests(&self) -> u64 {
        self.ops.iter().map(|(_, n, _)| n).sum()
    }

    /// Milliseconds in quill's handlers, summed over requests.
    pub fn busy_ms(&self) -> f64 {
        self.ops.iter().map(|(_, _, ms)| ms).sum()
    }
}

impl EngineFigures {
    /// Flush-stage time per transaction (flush + commit block), in milliseconds.
    pub fn flush_ms_per_transaction(&self) -> f64 {
        if self.transactions == 0 {
            0.0
        } else {
            self.ms_flushing / self.transactions as f64
        }
    }

    /// Milliseconds per transaction of a figure summed over transactions.
    pub fn per_transaction(&self, ms: f64) -> f64 {
        if self.transactions == 0 {
            0.0
        } else {
            ms / self.transactions as f64
        }
    }

    /// Transactions in flight (Locked to Durable) on average over a run of `seconds`: the
    /// time they spent there, summed, over the run's length (Little's law).
    pub fn in_flight_mean(&self, seconds: f64) -> f64 {
        if seconds <= 0.0 {
            0.0
        } else {
            (self.ms_locked + self.ms_writing + self.ms_flushing) / (seconds * 1000.0)
        }
    }

    /// Milliseconds waited for the lock named `name` (0 when not recorded).
    pub fn lock_wait(&self, name: &str) -> f64 {
        self.lock_wait_ms.iter().find(|(n, _)| n == name).map_or(0.0, |(_, ms)| *ms)
    }
}

/// One run of one workload on one target at one thread count.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RunResult {
    pub workload: String,
    /// The target's label, e.g. `lib`, `lib:preset=cjfs`, `kernel-ext4:data=journal`.
    pub target: String,
    pub threads: usize,
    /// Which round of the interleaved repetitions (0-based).
    pub round: usize,
    pub seconds: f64,
    /// Operations as the workload's reference tool counts them (filebench flowops, dbench
    /// operations, sysbench events, files created, recovered transactions).
    pub ops: u64,
    pub ops_per_sec: f64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// (bytes_read + bytes_written) / seconds, in MB (10^6 bytes) per second.
    pub mb_per_sec: f64,
    pub files_created: u64,
    pub files_per_sec: f64,
    /// fsync and fdatasync calls, and their latency percentiles in microseconds.
    pub fsyncs: u64,
    pub fsync_us_p50: u64,
    pub fsync_us_p99: u64,
    pub fsync_us_p999: u64,
    /// The mean fsync latency (the CJFS paper reports averages beside tails).
    #[serde(default)]
    pub fsync_us_mean: u64,
    /// The fsync latency distribution, at most [`CDF_POINTS`] (microseconds, fraction ≤).
    pub fsync_cdf: Vec<(u64, f64)>,
    pub engine: Option<EngineFigures>,
    /// kernel-ext4:fast_commit: what the kernel's fast commit did with the fsyncs
    /// ([`crate::kernel_fc`]).
    #[serde(default)]
    pub kernel_fc: Option<crate::kernel_fc::KernelFcFigures>,
    /// Open loop only (a workload reported as `<name>@<rate>/s`): the offered rate in
    /// iterations per second, the iterations that arrived in the measured phase and those
    /// left unserved at its end, and the response time (arrival to end, queueing included)
    /// in microseconds.
    #[serde(default)]
    pub arrival_rate: f64,
    #[serde(default)]
    pub arrivals: u64,
    #[serde(default)]
    pub unserved: u64,
    #[serde(default)]
    pub response_us_mean: u64,
    #[serde(default)]
    pub response_us_p50: u64,
    #[serde(default)]
    pub response_us_p99: u64,
    #[serde(default)]
    pub response_us_p999: u64,
    /// `e2fsck -fn` on the image after the target was torn down: `Some(true)` clean,
    /// `Some(false)` not clean, `None` not checked (a plain directory, or no e2fsck).
    pub fsck_clean: Option<bool>,
    /// Anything worth knowing about the run (the reference tool's own figure, a skipped check).
    pub note: String,
    /// Why the run failed, if it did (its figures are then not used in summaries).
    pub error: Option<String>,
}

/// Points kept of a latency distribution (enough for a smooth CDF plot, small in JSON).
pub const CDF_POINTS: usize = 200;

/// The CDF of sorted latency samples, downsampled to at most [`CDF_POINTS`] points.
pub fn latency_cdf(sorted: &[u64]) -> Vec<(u64, f64)> {
    if sorted.is_empty() {
        return Vec::new();
    }
    let n = sorted.len();
    let step = n.div_ceil(CDF_POINTS);
    let mut points: Vec<(u64, f64)> =
        (step - 1..n).step_by(step).map(|i| (sorted[i], (i + 1) as f64 / n as f64)).collect();
    if points.last().map(|p| p.1) != Some(1.0) {
        points.push((sorted[n - 1], 1.0));
    }
    points
}

/// p50, p99, p99.9 and the mean of sorted latency samples (all 0 when there are none).
fn latency_figures(sorted: &[u64]) -> [u64; 4] {
    let mean = match sorted.len() as u64 {
        0 => 0,
        n => sorted.iter().sum::<u64>() / n,
    };
    [percentile(sorted, 50.0), percentile(sorted, 99.0), percentile(sorted, 99.9), mean]
}

impl RunResult {
    /// Fills the latency fields from unsorted fsync samples (microseconds).
    pub fn set_fsync_latencies(&mut self, mut samples: Vec<u64>) {
        samples.sort_unstable();
        self.fsyncs = samples.len() as u64;
        [self.fsync_us_p50, self.fsync_us_p99, self.fsync_us_p999, self.fsync_us_mean] =
            latency_figures(&samples);
        self.fsync_cdf = latency_cdf(&samples);
    }

    /// Fills the open-loop fields from the offered rate, the arrival counts and the unsorted
    /// response times (microseconds) of the served iterations.
    pub fn set_open_loop(
        &mut self,
        rate: f64,
        arrivals: u64,
        unserved: u64,
        mut response_us: Vec<u64>,
    ) {
        response_us.sort_unstable();
        self.arrival_rate = rate;
        self.arrivals = arrivals;
        self.unserved = unserved;
        [
            self.response_us_p50,
            self.response_us_p99,
            self.response_us_p999,
            self.response_us_mean,
        ] = latency_figures(&response_us);
    }

    /// Open loop: iterations served per second (arrivals less the unserved, over the run).
    pub fn served_per_sec(&self) -> f64 {
        self.arrivals.saturating_sub(self.unserved) as f64 / self.seconds.max(1e-9)
    }

    /// Derives the rates from the counts and `seconds`.
    pub fn set_rates(&mut self) {
        let seconds = self.seconds.max(1e-9);
        self.ops_per_sec = self.ops as f64 / seconds;
        self.mb_per_sec = (self.bytes_read + self.bytes_written) as f64 / seconds / 1e6;
        self.files_per_sec = self.files_created as f64 / seconds;
    }

    /// The workload's headline figure (see [`headline`]).
    pub fn headline(&self) -> f64 {
        headline(&self.workload).of(self)
    }
}

/// Which figure a workload is judged by, and whether more is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Headline {
    OpsPerSec,
    FilesPerSec,
    /// fsync latency p99 in microseconds (lower is better).
    FsyncP99,
    /// Run time in seconds (lower is better).
    Seconds,
    /// Open loop: the response time p99 in microseconds, from arrival (lower is better).
    ResponseP99,
    /// Bytes read and written per second, in MB (10^6 bytes).
    MbPerSec,
}

impl Headline {
    pub fn of(self, r: &RunResult) -> f64 {
        match self {
            Headline::OpsPerSec => r.ops_per_sec,
            Headline::FilesPerSec => r.files_per_sec,
            Headline::FsyncP99 => r.fsync_us_p99 as f64,
            Headline::Seconds => r.seconds,
            Headline::ResponseP99 => r.response_us_p99 as f64,
            Headline::MbPerSec => r.mb_per_sec,
        }
    }

    pub fn higher_is_better(self) -> bool {
        matches!(self, Headline::OpsPerSec | Headline::FilesPerSec | Headline::MbPerSec)
    }

    /// A column or axis label.
    pub fn label(self) -> &'static str {
        match self {
            Headline::OpsPerSec => "ops/s",
            Headline::FilesPerSec => "files/s",
            Headline::FsyncP99 => "fsync p99 (us)",
            Headline::Seconds => "seconds",
            Headline::ResponseP99 => "response p99 (us)",
            Headline::MbPerSec => "MB/s",
        }
    }
}

/// The headline figure of a workload by name.
pub fn headline(workload: &str) -> Headline {
    if crate::workloads::open_loop_rate(workload).is_some() {
        // At a rate both sides sustain their throughput is the same; the response differs.
        return Headline::ResponseP99;
    }
    match workload {
        "tokubench" => Headline::FilesPerSec,
        "fsync-under-load" => Headline::FsyncP99,
        "recovery" => Headline::Seconds,
        "seq-write" | "seq-read" => Headline::MbPerSec,
        _ => Headline::OpsPerSec,
    }
}

/// The rounds of one (workload, target, threads), reduced to medians.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    pub workload: String,
    pub target: String,
    pub threads: usize,
    pub rounds: usize,
    pub headline: Headline,
    /// Median, min and max of the headline figure over the rounds.
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// The median headline divided by the baseline target's (same workload and threads);
    /// above 1 means better than the baseline whichever way the headline points.
    pub vs_baseline: Option<f64>,
    /// The round whose headline is nearest the median, so every figure of a row comes from
    /// one real run.
    pub median_run: RunResult,
}

/// Groups `runs` by (workload, target, threads) in first-seen order and summarizes each;
/// `baseline` names the target the ratios are taken against.
pub fn summarize(runs: &[RunResult], baseline: Option<&str>) -> Vec<Summary> {
    let mut keys: Vec<(&str, &str, usize)> = Vec::new();
    let runs: Vec<&RunResult> = runs.iter().filter(|r| r.error.is_none()).collect();
    for r in &runs {
        let key = (r.workload.as_str(), r.target.as_str(), r.threads);
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    let mut summaries: Vec<Summary> = keys
        .iter()
        .map(|&(workload, target, threads)| {
            let group: Vec<&RunResult> = runs
                .iter()
                .copied()
                .filter(|r| r.workload == workload && r.target == target && r.threads == threads)
                .collect();
            let kind = headline(workload);
            let values: Vec<f64> = group.iter().map(|r| kind.of(r)).collect();
            let m = median(&values);
            let median_run = group
                .iter()
                .min_by(|a, b| (kind.of(a) - m).abs().total_cmp(&(kind.of(b) - m).abs()))
                .map(|r| (*r).clone())
                .expect("a group has at least one run");
            Summary {
                workload: workload.to_string(),
                target: target.to_string(),
                threads,
                rounds: group.len(),
                headline: kind,
                median: m,
                min: values.iter().copied().fold(f64::INFINITY, f64::min),
                max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                vs_baseline: None,
                median_run,
            }
        })
        .collect();
    if let Some(baseline) = baseline {
        let bases: Vec<(String, usize, f64)> = summaries
            .iter()
            .filter(|s| s.target == baseline)
            .map(|s| (s.workload.clone(), s.threads, s.median))
            .collect();
        for s in &mut summaries {
            let base = bases.iter().find(|b| b.0 == s.workload && b.1 == s.threads);
            s.vs_baseline = base.and_then(|&(_, _, base)| {
                let ratio =
                    if s.headline.higher_is_better() { s.median / base } else { base / s.median };
                ratio.is_finite().then_some(ratio)
            });
        }
    }
    summaries
}

/// The device's own limits, measured in the same run on the disk holding the images.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ProbeResult {
    /// The directory probed (where the images live).
    pub dir: String,
    /// 4 KiB pwrite then fdatasync, buffered: median and p99 latency in microseconds.
    pub write_fdatasync_us_p50: f64,
    pub write_fdatasync_us_p99: f64,
    /// The fsyncs per second one thread can get at that median latency: 1e6 / p50.
    pub fdatasyncs_per_sec_limit: f64,
    /// 4 KiB O_DIRECT|O_DSYNC pwrite (a FUA write where the device honours FUA):
    /// median and p99 latency in microseconds.
    pub fua_write_us_p50: f64,
    pub fua_write_us_p99: f64,
    /// 4 KiB O_DIRECT random writes, no sync, from `random_write_threads` threads.
    pub random_write_iops: f64,
    pub random_write_threads: usize,
    /// Whether O_DIRECT was available (tmpfs refuses it; the figures are then buffered).
    pub direct_io: bool,
    pub seconds: f64,
}

/// Everything one `quill bench` invocation measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Report {
    /// The command line, so the figures can be reproduced.
    pub command: String,
    pub probe: Option<ProbeResult>,
    pub baseline: Option<String>,
    pub runs: Vec<RunResult>,
    pub summaries: Vec<Summary>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(target: &str, round: usize, ops_per_sec: f64) -> RunResult {
        RunResult {
            workload: "varmail-shared".into(),
            target: target.into(),
            threads: 4,
            round,
            ops_per_sec,
            ..Default::default()
        }
    }

    #[test]
    fn summaries_take_the_median_round_and_ratios_against_the_baseline() {
        let runs = vec![
            run("kernel-ext4", 0, 100.0),
            run("lib", 0, 300.0),
            run("kernel-ext4", 1, 120.0),
            run("lib", 1, 100.0),
            run("kernel-ext4", 2, 110.0),
            run("lib", 2, 220.0),
        ];
        let s = summarize(&runs, Some("kernel-ext4"));
        assert_eq!(s.len(), 2);
        assert_eq!(
            (s[0].target.as_str(), s[0].median, s[0].min, s[0].max),
            ("kernel-ext4", 110.0, 100.0, 120.0)
        );
        assert_eq!(s[0].median_run.round, 2);
        assert_eq!(s[1].median, 220.0);
        assert_eq!(s[1].vs_baseline, Some(2.0));
        assert_eq!(s[0].vs_baseline, Some(1.0));
    }

    #[test]
    fn lower_is_better_headlines_invert_the_ratio() {
        let mut a = run("a", 0, 0.0);
        a.workload = "recovery".into();
        a.seconds = 2.0;
        let mut b = a.clone();
        b.target = "b".into();
        b.seconds = 1.0;
        let s = summarize(&[a, b], Some("a"));
        assert_eq!(s[1].vs_baseline, Some(2.0), "twice as fast as the baseline");
    }

    #[test]
    fn fsync_latencies_give_percentiles_and_the_mean() {
        let mut r = RunResult::default();
        r.set_fsync_latencies(vec![10, 1, 3, 2]);
        assert_eq!((r.fsyncs, r.fsync_us_mean), (4, 4));
        assert_eq!((r.fsync_us_p50, r.fsync_us_p999), (2, 10));
        let mut none = RunResult::default();
        none.set_fsync_latencies(Vec::new());
        assert_eq!(none.fsync_us_mean, 0);
    }

    #[test]
    fn cdf_is_downsampled_and_ends_at_one() {
        let samples: Vec<u64> = (1..=1000).collect();
        let cdf = latency_cdf(&samples);
        assert!(cdf.len() <= CDF_POINTS + 1);
        assert_eq!(*cdf.last().unwrap(), (1000, 1.0));
        assert!(cdf.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 < w[1].1));
        assert_eq!(latency_cdf(&[7]), vec![(7, 1.0)]);
        assert!(latency_cdf(&[]).is_empty());
    }
}
