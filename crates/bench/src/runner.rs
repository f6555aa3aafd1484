//! Runs a benchmark plan: every workload × thread count × target, repeated in rounds that
//! interleave the targets (A B A B …, never A A B B) so slow drift of the machine — page
//! cache, host noise, a warming disk — hits every target alike. Every run gets a fresh file
//! system, checked by `e2fsck -fn` after it is torn down.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::recovery::{self, CrashedImage};
use crate::results::{summarize, Report, RunResult};
use crate::targets::{Env, Kind, TargetSpec};
use crate::workloads::{self, Size, Workload, WorkloadParams};

/// What to run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub workloads: Vec<Workload>,
    pub targets: Vec<TargetSpec>,
    pub threads: Vec<usize>,
    pub rounds: usize,
    pub duration: Duration,
    pub size: Size,
    /// Per-thread iteration cap (tests use it to bound a run by work, not time).
    pub iterations: Option<u64>,
    pub env: Env,
    /// The target ratios are taken against (by label).
    pub baseline: Option<String>,
    pub background_mb_per_sec: f64,
    /// fileserver's file count and mean size.
    pub fileserver: workloads::fileserver::Shape,
    pub seed: u64,
    /// Open-loop offered rates, iterations per second (see [`WorkloadParams::arrival_rate`]):
    /// every workload that sweeps threads runs once per rate, as `<workload>@<rate>/s`, with
    /// the thread count as the size of the serving pool. Empty: the closed loop.
    pub arrival_rates: Vec<f64>,
}

/// Progress, for a progress bar and log lines.
pub enum Event<'a> {
    /// A target or workload left out, and why (said once).
    Skipped(String),
    /// Run `index` of `total` begins.
    Starting {
        index: usize,
        total: usize,
        label: String,
    },
    Finished(&'a RunResult),
}

/// One run to do.
#[derive(Debug, Clone)]
struct Job {
    round: usize,
    workload: Workload,
    arrival_rate: Option<f64>,
    threads: usize,
    target: usize,
}

impl Plan {
    /// The runs, in the order they execute, and what was left out (with the reason).
    fn jobs(&self) -> (Vec<Job>, Vec<String>) {
        let mut skipped = Vec::new();
        let mut usable = Vec::new();
        for (i, t) in self.targets.iter().enumerate() {
            match t.available() {
                Ok(()) => usable.push(i),
                Err(reason) => skipped.push(format!("target {}: SKIP, {reason}", t.label)),
            }
        }
        let dbench = workloads::dbench::available();
        let rates: Vec<Option<f64>> = if self.arrival_rates.is_empty() {
            vec![None]
        } else {
            self.arrival_rates.iter().map(|&r| Some(r)).collect()
        };
        let mut jobs = Vec::new();
        for round in 0..self.rounds {
            for &workload in &self.workloads {
                let threads: &[usize] =
                    if workload.sweeps_threads() { &self.threads } else { &[1] };
                for &arrival_rate in &rates {
                    if arrival_rate.is_some() && !workload.runs_open_loop() {
                        let line = format!(
                            "{}: SKIP, it has no open-loop form (--arrival-rates)",
                            workload.name()
                        );
                        if !skipped.contains(&line) {
                            skipped.push(line);
                        }
                        continue;
                    }
                    for &threads in threads {
                        for &target in &usable {
                            if self.applies(
                                workload,
                                &self.targets[target],
                                &dbench,
                                round == 0,
                                &mut skipped,
                            ) {
                                jobs.push(Job { round, workload, arrival_rate, threads, target });
                            }
                        }
                    }
                }
            }
        }
        skipped.dedup();
        (jobs, skipped)
    }

    fn applies(
        &self,
        workload: Workload,
        target: &TargetSpec,
        dbench: &Result<(), String>,
        say: bool,
        skipped: &mut Vec<String>,
    ) -> bool {
        let reason = match workload {
            Workload::Dbench if !target.is_mounted() => {
                Some("dbench is a program: it runs on mounted targets only".to_string())
            }
            Workload::Dbench => dbench.clone().err(),
            Workload::Fsx if !target.is_mounted() => {
                Some("fsx maps files and calls fallocate: it runs on mounted targets only".into())
            }
            Workload::Recovery if matches!(target.kind, Kind::Dir(_)) => {
                Some("a directory has no image to crash".to_string())
            }
            // Seen with e2fsprogs 1.47.0: fuse2fs mounts an image that needs recovery without
            // replaying it, and segfaults when unmounted — also for a journal written by
            // e2fsprogs' own debugfs (jo/jw/jc), so it is fuse2fs, not the image.
            Workload::Recovery if target.kind == Kind::QuillFuse => {
                Some("quill's replay is the same code with or without FUSE: see lib".to_string())
            }
            Workload::Recovery if target.kind == Kind::Fuse2fs => Some(
                "fuse2fs (1.47) does not replay the journal and crashes unmounting such an image"
                    .to_string(),
            ),
            _ => None,
        };
        match reason {
            None => true,
            Some(reason) => {
                let line = format!("{} on {}: SKIP, {reason}", workload.name(), target.label);
                if say && !skipped.contains(&line) {
                    skipped.push(line);
                }
                false
            }
        }
    }
}

/// Runs `plan`, reporting progress to `on`. A failed run is recorded with its error and the
/// plan goes on; the caller decides what a failure means.
pub fn run_plan(plan: &Plan, on: &mut dyn FnMut(Event)) -> Report {
    let (jobs, skipped) = plan.jobs();
    for line in skipped {
        on(Event::Skipped(line));
    }
    let mut runs = Vec::new();
    // The crashed image of each round, made once and replayed by every target.
    let mut crashed: Option<(usize, Result<CrashedImage, String>)> = None;
    for (index, job) in jobs.iter().enumerate() {
        let target = &plan.targets[job.target];
        let label = format!(
            "round {}/{}: {} on {}, {} threads",
            job.round + 1,
            plan.rounds,
            job.workload.label(job.arrival_rate),
            target.label,
            job.threads
        );
        on(Event::Starting { index, total: jobs.len(), label });
        let id = format!("quill-bench-{}-{index}", std::process::id());
        let mut result = RunResult {
            workload: job.workload.label(job.arrival_rate),
            target: target.label.clone(),
            threads: job.threads,
            round: job.round,
            ..Default::default()
        };
        let outcome = if job.workload == Workload::Recovery {
            if crashed.as_ref().map(|c| c.0) != Some(job.round) {
                if let Some((_, Ok(old))) = crashed.take() {
                    let _ = std::fs::remove_file(&old.path);
                }
                let path = plan.env.scratch.join(format!(
                    "quill-bench-{}-crashed-{}.img",
                    std::process::id(),
                    job.round
                ));
                crashed = Some((job.round, recovery::make_crashed_image(&path, plan.size)));
            }
            match &crashed.as_ref().expect("made above").1 {
                Ok(image) => run_recovery(target, image, &plan.env, &id, &mut result),
                Err(e) => Err(format!("making the crashed image: {e}")),
            }
        } else {
            run_workload(plan, job, target, &id, &mut result)
        };
        if let Err(e) = outcome {
            result.error = Some(e);
        }
        on(Event::Finished(&result));
        runs.push(result);
    }
    if let Some((_, Ok(image))) = crashed {
        let _ = std::fs::remove_file(image.path);
    }
    let baseline = plan.baseline.clone();
    let summaries = summarize(&runs, baseline.as_deref());
    Report { command: String::new(), probe: None, baseline, runs, summaries }
}

fn run_workload(
    plan: &Plan,
    job: &Job,
    target: &TargetSpec,
    id: &str,
    result: &mut RunResult,
) -> Result<(), String> {
    let mut prepared = target.setup(&plan.env, id)?;
    let mut params = WorkloadParams::new(job.threads, plan.duration, plan.size);
    params.iterations = plan.iterations;
    params.seed = plan.seed;
    params.background_mb_per_sec = plan.background_mb_per_sec;
    params.fileserver = plan.fileserver;
    params.arrival_rate = job.arrival_rate;
    params.on_start = prepared.measure_hook();
    let measured = workloads::run(job.workload, prepared.api(), prepared.mounted_dir(), &params);
    drop(params);
    result.engine = prepared.engine_figures();
    result.kernel_fc = prepared.kernel_fc_figures();
    let io_path = prepared.io_path.clone();
    // Tear down even after a failed run, and report the run's own error first.
    let finished = prepared.finish();
    let measured = measured.map_err(|e| e.to_string())?;
    result.fsck_clean = finished?;
    result.seconds = measured.seconds;
    let c = measured.counters;
    result.ops = c.ops;
    result.bytes_read = c.bytes_read;
    result.bytes_written = c.bytes_written;
    result.files_created = c.files_created;
    result.set_fsync_latencies(c.fsync_us);
    if let Some(rate) = job.arrival_rate {
        result.set_open_loop(rate, measured.arrivals, measured.unserved, c.response_us);
    }
    result.set_rates();
    if let Some(mb) = measured.mb_per_sec {
        result.mb_per_sec = mb;
    }
    result.note = match &io_path {
        Some(io) if measured.note.is_empty() => format!("image: {io}"),
        Some(io) => format!("{}; image: {io}", measured.note),
        None => measured.note,
    };
    if result.ops == 0 {
        return Err("the workload did no operations".into());
    }
    Ok(())
}

fn run_recovery(
    target: &TargetSpec,
    image: &CrashedImage,
    env: &Env,
    id: &str,
    result: &mut RunResult,
) -> Result<(), String> {
    let replay = recovery::replay(target, image, env, id)?;
    result.seconds = replay.seconds;
    result.ops = image.log_blocks as u64;
    // The log read back, so MB/s is the replay's read rate.
    result.bytes_read = image.log_blocks as u64 * image.block_size as u64;
    result.set_rates();
    result.fsck_clean = replay.fsck_clean;
    result.note = format!(
        "{} of {} log blocks, {} transactions; {}",
        image.log_blocks, image.log_capacity, image.transactions, replay.note
    );
    Ok(())
}

/// A scratch directory for images and mount points, removed when dropped.
pub struct Scratch {
    pub path: PathBuf,
}

impl Scratch {
    /// A new directory in `parent`, unique in this process (plans running side by side in
    /// one process, as tests do, must not share image names) and across processes. `parent`
    /// is created (with its parents) when it does not exist yet, as `mkdir -p`; it is kept.
    pub fn new(parent: &std::path::Path) -> std::io::Result<Scratch> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        std::fs::create_dir_all(parent)?;
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = parent.join(format!("quill-bench-scratch-{}-{n}", std::process::id()));
        std::fs::create_dir(&path)?;
        Ok(Scratch { path })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Every run removed its own files; what is left is empty directories, or the files of
        // a run that failed to unmount (kept out of the way of a live mount).
        let _ = std::fs::remove_dir(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::Scratch;

    #[test]
    fn a_scratch_parent_that_does_not_exist_yet_is_created() {
        let parent = std::env::temp_dir()
            .join(format!("quill-bench-new-parent-{}", std::process::id()))
            .join("nested");
        let _ = std::fs::remove_dir_all(parent.parent().unwrap());
        let scratch = Scratch::new(&parent).unwrap();
        assert!(scratch.path.is_dir() && scratch.path.starts_with(&parent));
        drop(scratch);
        assert!(parent.is_dir(), "the named directory is kept, as mkdir -p leaves it");
        std::fs::remove_dir_all(parent.parent().unwrap()).unwrap();
    }
}
