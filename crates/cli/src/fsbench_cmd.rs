//! `quill bench`: the seed papers' workloads on quill and on what users would pick instead,
//! side by side in one run (see `bench::runner`), with a device probe, a table, JSON, CSV and
//! plots. With no arguments it runs a short default comparison (a few minutes).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bench::probe::{format_probe, probe, ProbeParams};
use bench::recovery_study::{format_study, recovery_study, StudyParams};
use bench::report::{format_table, write_csv};
use bench::runner::{run_plan, Event, Plan, Scratch};
use bench::targets::{Env, TargetSpec};
use bench::workloads::{Size, Workload};

use crate::progress::Progress;

const WORKLOAD_HELP: &str = "\
Workloads:
  varmail-shared    filebench varmail, 1,000 files in one directory (ops/s)
  varmail-split     varmail with 100 files per thread in per-thread directories (ops/s)
  dbench            the dbench program, client.txt, --sync-dir; mounted targets only (ops/s)
  oltp-insert       4 KiB redo-log appends + fdatasync, 16 KiB table growth + fsync/8 (txn/s)
  tokubench         200-byte files created in a fan-out-128 tree, no fsync (files/s)
  randwrite-fsync   4 KiB random overwrites, fsync after each (ops/s); try data=journal targets
  fileserver        filebench fileserver: create+write whole, append, read whole, delete, stat;
                    1,000 gamma-sized files (mean 128 KiB), no fsync (ops/s); try data=journal
  fsync-under-load  80 KiB write+fsync against a background writer (fsync p99)
  seq-write         1 GiB over the threads' own files in 1 MiB writes, fsync at the end (MB/s)
  seq-read          the same files read back in 1 MiB reads after dropping the caches (MB/s)
  fsx               xfstests fsx's default mix on a 256 KiB file per thread (read, write, mapped,
                    truncate, fallocate modes, copy_file_range, fsync), every read checked;
                    mounted targets only (ops/s)
  recovery          fill the journal, crash, time the replay (seconds)

Targets (options after a colon, comma-separated):
  lib[:preset=classic|dual|cjfs|fast18-io|fast18|all,data=ordered|journal,dev=file|simssd,features=quota+project,SETTING=VALUE]
                    quill in-process
  quill-fuse[:...]  quill mounted through FUSE (same options but dev)
  kernel-ext4[:fast_commit,MOUNT-OPTION...]
                    the kernel's ext4 on a loop-mounted image (root)
  fuse2fs           e2fsprogs' FUSE driver
  dir:PATH          any mounted directory

Every run gets a fresh image (quill's mkfs for quill targets, mkfs.ext4 for the others) in
the scratch directory, and e2fsck -fn checks it after the run. Runs are interleaved across
targets, round by round; figures are medians over rounds, with min..max.";

#[derive(clap::Args)]
#[command(after_help = WORKLOAD_HELP)]
pub struct FsBenchArgs {
    /// Workloads, comma-separated (see below).
    #[arg(long, value_delimiter = ',', default_value = "varmail-shared,fsync-under-load,recovery")]
    workloads: Vec<String>,
    /// Targets, TARGET[:OPTIONS] separated by ';' (commas also work: a comma followed by a
    /// target name starts the next target; see below).
    #[arg(long, default_value = "lib;lib:preset=cjfs;quill-fuse;kernel-ext4;fuse2fs")]
    targets: String,
    /// Thread counts to sweep, comma-separated (fsync-under-load and recovery run once).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32")]
    threads: Vec<usize>,
    /// Open loop: offered rates in workload iterations per second (a varmail loop of 13
    /// flowops, an oltp transaction, ...), comma-separated. Iterations then arrive as a Poisson
    /// process whether or not earlier ones finished, the thread count is the pool serving them,
    /// and each rate is reported as <workload>@<rate>/s with the response time from arrival
    /// (queueing included) as its headline. Default: the closed loop.
    #[arg(long, value_delimiter = ',')]
    arrival_rates: Vec<f64>,
    /// Seconds of measurement per run.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Rounds: every run is repeated this many times, interleaved across targets.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Workload size: default (the papers' parameters scaled to a small machine) or smallest.
    #[arg(long, default_value = "default")]
    size: String,
    /// Target that ratios are taken against (default: kernel-ext4 if present, else the first).
    #[arg(long)]
    baseline: Option<String>,
    /// Where to write report.json, runs.csv, summary.csv and the plots.
    #[arg(long, default_value = "quill-bench-out")]
    out: PathBuf,
    /// Where images and mount points go (the disk being measured): created if missing; the
    /// run's own directory inside it is removed at the end.
    #[arg(long, default_value = ".")]
    scratch: PathBuf,
    /// Size of each image, in MiB.
    #[arg(long, default_value_t = 2048)]
    image_mib: u64,
    /// fsync-under-load: background writers' total rate, MB/s.
    #[arg(long, default_value_t = 50.0)]
    background_mbps: f64,
    /// fileserver: files in the set (default 1,000; 40 at --size smallest).
    #[arg(long)]
    fileserver_files: Option<usize>,
    /// fileserver: mean file size in KiB (default 128; 16 at --size smallest).
    #[arg(long)]
    fileserver_mean_kib: Option<u64>,
    /// Seconds for the device probe (0 skips it).
    #[arg(long, default_value_t = 4.0)]
    probe_seconds: f64,
    /// Seed of the workloads' random choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Do not draw plots.
    #[arg(long)]
    no_plots: bool,
    /// Run the recovery study instead (FAST'18 Table 3): crash an image whose journal this
    /// workload fills (tokubench, randwrite-fsync, ...), then time quill's recovery with each
    /// of --recovery-threads, e2fsck -E journal_only and the kernel's mount, each on a fresh
    /// cold copy, --rounds times.
    #[arg(long, value_name = "WORKLOAD")]
    recovery_study: Option<String>,
    /// Recovery study: the data mode of the filling workload (ordered or journal).
    #[arg(long, default_value = "ordered")]
    study_data: String,
    /// Recovery study: journal size in MiB.
    #[arg(long, default_value_t = 1024)]
    study_journal_mib: u64,
    /// Recovery study: how full the log is at the crash, in percent.
    #[arg(long, default_value_t = 70)]
    study_fill_percent: u64,
    /// Recovery study: give up filling after this many seconds.
    #[arg(long, default_value_t = 600.0)]
    study_fill_seconds: f64,
    /// Recovery study: quill's recovery thread counts (1 is JBD2's one-thread recovery).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    recovery_threads: Vec<usize>,
}

/// `quill bench --recovery-study WORKLOAD`: see `bench::recovery_study`.
fn run_recovery_study(args: &FsBenchArgs, workload: &str) -> Result<()> {
    let workload = Workload::parse(workload)
        .filter(|w| {
            !matches!(
                w,
                Workload::Recovery | Workload::Dbench | Workload::Fsx | Workload::FsyncUnderLoad
            )
        })
        .with_context(|| format!("--recovery-study {workload}: expected a workload that runs in-process, e.g. tokubench or randwrite-fsync"))?;
    let data = match args.study_data.as_str() {
        "ordered" => fs::DataMode::Ordered,
        "journal" => fs::DataMode::Journal,
        other => bail!("--study-data {other}: expected ordered or journal"),
    };
    if args.recovery_threads.iter().any(|&t| !(1..=64).contains(&t)) {
        bail!("--recovery-threads: each count must be in 1..=64");
    }
    if !(1..=95).contains(&args.study_fill_percent) {
        bail!("--study-fill-percent must be in 1..=95");
    }
    let scratch = Scratch::new(&args.scratch).with_context(|| {
        format!("cannot create a scratch directory in {}", args.scratch.display())
    })?;
    let params = StudyParams {
        workload,
        data,
        journal_mib: args.study_journal_mib,
        fill_percent: args.study_fill_percent,
        threads: args.recovery_threads.clone(),
        rounds: args.rounds,
        scratch: scratch.path.clone(),
        fill_seconds_max: args.study_fill_seconds,
    };
    let (_, rows) =
        recovery_study(&params, &mut |line| println!("{line}")).map_err(anyhow::Error::msg)?;
    print!("{}", format_study(&rows));
    let failed = rows.iter().filter(|r| r.error.is_some() || !r.all_clean).count();
    if failed > 0 {
        bail!("{failed} replayers failed or left an image e2fsck -fn does not find clean");
    }
    Ok(())
}

/// Splits the target list: on ';' if there is one, else on commas that start a new target.
fn split_targets(text: &str) -> Vec<String> {
    if text.contains(';') {
        return text
            .split(';')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(String::from)
            .collect();
    }
    // "lib:preset=cjfs,data=journal,kernel-ext4": a comma followed by a target name starts a
    // new target; anything else is an option of the current one.
    let names = ["lib", "quill-fuse", "kernel-ext4", "fuse2fs", "dir"];
    let mut targets: Vec<String> = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let name = part.split(':').next().unwrap_or(part);
        let starts = names.contains(&name);
        match targets.last_mut() {
            Some(last) if !starts => {
                last.push(if last.contains(':') { ',' } else { ':' });
                last.push_str(part);
            }
            _ => targets.push(part.to_string()),
        }
    }
    targets
}

pub fn run(args: FsBenchArgs) -> Result<()> {
    if let Some(workload) = &args.recovery_study {
        return run_recovery_study(&args, workload);
    }
    let started = Instant::now();
    if !(args.seconds.is_finite() && args.seconds > 0.0) || args.rounds == 0 {
        bail!("--seconds and --rounds must be positive");
    }
    if args.threads.is_empty() || args.threads.iter().any(|&t| t == 0 || t > 1024) {
        bail!("--threads: each count must be in 1..=1024");
    }
    if args.arrival_rates.iter().any(|r| !(r.is_finite() && *r > 0.0 && *r <= 1e6)) {
        bail!("--arrival-rates: each rate must be in (0, 1000000] iterations per second");
    }
    let size = match args.size.as_str() {
        "default" => Size::Default,
        "smallest" => Size::Smallest,
        other => bail!("--size {other}: expected default or smallest"),
    };
    let mut workloads = Vec::new();
    for name in &args.workloads {
        let names: Vec<&str> = Workload::ALL.iter().map(|w| w.name()).collect();
        workloads.push(Workload::parse(name).with_context(|| {
            format!("unknown workload {name}; expected one of {}", names.join(", "))
        })?);
    }
    let targets: Vec<TargetSpec> = split_targets(&args.targets)
        .iter()
        .map(|t| TargetSpec::parse(t).map_err(anyhow::Error::msg))
        .collect::<Result<_>>()?;
    if targets.is_empty() {
        bail!("--targets is empty");
    }
    let baseline = match args.baseline {
        Some(b) if targets.iter().any(|t| t.label == b) => Some(b),
        Some(b) => bail!("--baseline {b} is not one of the targets"),
        None => targets
            .iter()
            .find(|t| t.label == "kernel-ext4")
            .or(targets.first())
            .map(|t| t.label.clone()),
    };
    let scratch = Scratch::new(&args.scratch).with_context(|| {
        format!("cannot create a scratch directory in {}", args.scratch.display())
    })?;
    let probe_result = if args.probe_seconds > 0.0 {
        let params = ProbeParams {
            dir: scratch.path.clone(),
            seconds: args.probe_seconds,
            ..Default::default()
        };
        let result = probe(&params).context("device probe")?;
        println!("{}", format_probe(&result));
        Some(result)
    } else {
        None
    };
    let plan = Plan {
        workloads,
        targets,
        threads: args.threads,
        rounds: args.rounds,
        duration: Duration::from_secs_f64(args.seconds),
        size,
        iterations: None,
        env: Env { scratch: scratch.path.clone(), image_bytes: args.image_mib << 20 },
        baseline,
        background_mb_per_sec: args.background_mbps,
        fileserver: bench::workloads::fileserver::Shape {
            files: args.fileserver_files,
            file_bytes_mean: args.fileserver_mean_kib.map(|kib| kib << 10),
        },
        seed: args.seed,
        arrival_rates: args.arrival_rates,
    };
    let mut bar: Option<Progress> = None;
    let mut report = run_plan(&plan, &mut |event| match event {
        Event::Skipped(line) => eprintln!("{line}"),
        Event::Starting { index, total, label } => {
            let bar =
                bar.get_or_insert_with(|| Progress::new("quill bench", total as u64, true, false));
            bar.set(index as u64, total as u64);
            bar.println(&format!("[{}/{}] {label}", index + 1, total));
        }
        Event::Finished(r) => match (&bar, &r.error) {
            (Some(bar), Some(e)) => bar.println(&format!("  FAILED: {e}")),
            // The run's note (for quill on a file: the I/O path its device took).
            (Some(bar), None) if !r.note.is_empty() => bar.println(&format!("  {}", r.note)),
            _ => {}
        },
    });
    if let Some(bar) = bar {
        bar.finish();
    }
    report.probe = probe_result;
    report.command = std::env::args().collect::<Vec<_>>().join(" ");
    print!("{}", format_table(&report));

    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let json = args.out.join("report.json");
    std::fs::write(&json, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("cannot write {}", json.display()))?;
    let mut files = vec![json];
    files.extend(write_csv(&report, &args.out).context("writing CSV")?);
    if !args.no_plots {
        let plots = bench::plot::write_plots(&report, &args.out.join("plots")).context("plots")?;
        for reason in &plots.skipped {
            eprintln!("plots: {reason}");
        }
        files.extend(plots.files);
    }
    println!("\nwrote {} files in {}:", files.len(), args.out.display());
    for f in &files {
        println!("  {}", f.display());
    }
    println!("total time {:.0} s", started.elapsed().as_secs_f64());
    let failed = report.runs.iter().filter(|r| r.error.is_some()).count();
    let unclean = report.runs.iter().filter(|r| r.fsck_clean == Some(false)).count();
    if failed > 0 || unclean > 0 {
        bail!("{failed} runs failed and {unclean} images were not clean (see above)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::split_targets;

    #[test]
    fn target_lists_split_on_target_names_or_semicolons() {
        assert_eq!(
            split_targets("lib:preset=cjfs,data=journal,kernel-ext4,fuse2fs"),
            vec!["lib:preset=cjfs,data=journal", "kernel-ext4", "fuse2fs"]
        );
        assert_eq!(split_targets("lib;quill-fuse"), vec!["lib", "quill-fuse"]);
        assert_eq!(split_targets("dir:/mnt/x,lib"), vec!["dir:/mnt/x", "lib"]);
        assert_eq!(split_targets("kernel-ext4:data=journal"), vec!["kernel-ext4:data=journal"]);
    }
}
