//! `quill journal bench`: the journal benchmark over devices, presets and thread counts, run
//! side by side (interleaved) in one invocation, with medians over repetitions.

use anyhow::{bail, Context, Result};
use bench::journal_bench::{
    format_table, run as run_one, BenchDevice, JournalBenchParams, JournalBenchResult,
};
use bench::percentile::median;
use blockdev::simssd::SimSsdConfig;
use journal::config::PRESETS;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::progress::Progress;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Devices: file, file-direct, simssd, memory (comma-separated).
    #[arg(long, default_value = "file,simssd", value_delimiter = ',')]
    devices: Vec<String>,
    /// Presets to compare (comma-separated): classic, dual, cjfs, fast18-io, fast18, all.
    #[arg(long, default_value = "classic", value_delimiter = ',')]
    presets: Vec<String>,
    /// Thread counts (comma-separated).
    #[arg(long, default_value = "1,4,16", value_delimiter = ',')]
    threads: Vec<usize>,
    /// Seconds per run.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Runs per configuration; figures are medians.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Extra journal settings, NAME=VALUE (e.g. versions_max=3), applied to every preset.
    #[arg(long = "set", value_name = "NAME=VALUE")]
    settings: Vec<String>,
    /// Where the file device's scratch image goes (deleted afterwards).
    #[arg(long, default_value = "quill-journal-bench.img")]
    file: PathBuf,
    /// Journal size in blocks.
    #[arg(long, default_value_t = 16384)]
    journal_blocks: u32,
    /// Write all results as JSON to this file ("-" for standard output).
    #[arg(long)]
    json: Option<PathBuf>,
}

fn device(name: &str, file: &Path) -> Result<BenchDevice> {
    Ok(match name {
        "file" => BenchDevice::File { path: file.to_path_buf(), direct: false },
        "file-direct" => BenchDevice::File { path: file.to_path_buf(), direct: true },
        "simssd" => BenchDevice::SimSsd(SimSsdConfig::default()),
        "memory" => BenchDevice::Memory,
        other => bail!("unknown device {other}; expected file, file-direct, simssd or memory"),
    })
}

pub fn run(args: BenchArgs) -> Result<()> {
    if args.repeat == 0 || args.seconds.is_nan() || args.seconds <= 0.0 {
        bail!("--repeat and --seconds must be positive");
    }
    let mut configs = Vec::new();
    for device_name in &args.devices {
        for preset in &args.presets {
            if !PRESETS.contains(&preset.as_str()) {
                bail!("unknown preset {preset}; expected one of {}", PRESETS.join(", "));
            }
            for &threads in &args.threads {
                let mut params =
                    JournalBenchParams::new(device(device_name, &args.file)?, preset, threads)
                        .expect("preset checked above");
                params.duration = Duration::from_secs_f64(args.seconds);
                params.journal_blocks = args.journal_blocks;
                for setting in &args.settings {
                    let (name, value) = setting
                        .split_once('=')
                        .with_context(|| format!("--set {setting}: expected NAME=VALUE"))?;
                    params.config.set(name, value).map_err(anyhow::Error::msg)?;
                }
                configs.push(params);
            }
        }
    }
    // Interleave repetitions so slow drift of the machine affects every configuration alike.
    let mut runs: Vec<Vec<JournalBenchResult>> = vec![Vec::new(); configs.len()];
    // One tick per run; on a terminal the run lines scroll above the bar.
    let bar = Progress::new("Benchmark runs", (configs.len() * args.repeat) as u64, true, false);
    for round in 0..args.repeat {
        for (i, params) in configs.iter().enumerate() {
            bar.println(&format!(
                "run {}/{}: {} {} {} threads",
                round + 1,
                args.repeat,
                params.device.name(),
                params.preset,
                params.threads
            ));
            runs[i].push(
                run_one(params)
                    .with_context(|| format!("{} {}", params.device.name(), params.preset))?,
            );
            bar.inc();
        }
    }
    bar.finish();
    let medians: Vec<JournalBenchResult> = runs.iter().map(|r| median_result(r)).collect();
    print!("{}", format_table(&medians));
    print_ratios(&medians);
    if let Some(path) = &args.json {
        let json = serde_json::json!({ "medians": medians, "runs": runs });
        let text = serde_json::to_string_pretty(&json)?;
        if path.as_os_str() == "-" {
            println!("{text}");
        } else {
            std::fs::write(path, text)
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
    }
    Ok(())
}

/// The run whose throughput is the median (so every figure of the row comes from one run).
fn median_result(runs: &[JournalBenchResult]) -> JournalBenchResult {
    let throughputs: Vec<f64> = runs.iter().map(|r| r.fsyncs_per_sec).collect();
    let m = median(&throughputs);
    runs.iter()
        .min_by(|a, b| (a.fsyncs_per_sec - m).abs().total_cmp(&(b.fsyncs_per_sec - m).abs()))
        .expect("at least one run")
        .clone()
}

/// Throughput of every preset relative to classic on the same device and thread count.
fn print_ratios(results: &[JournalBenchResult]) {
    let mut lines = Vec::new();
    for r in results.iter().filter(|r| r.preset != "classic") {
        if let Some(base) = results
            .iter()
            .find(|b| b.preset == "classic" && b.device == r.device && b.threads == r.threads)
        {
            lines.push(format!(
                "{} {} threads: {} / classic = {:.2}x fsyncs/s",
                r.device,
                r.threads,
                r.preset,
                r.fsyncs_per_sec / base.fsyncs_per_sec.max(1e-9)
            ));
        }
    }
    if !lines.is_empty() {
        println!("\n{}", lines.join("\n"));
    }
}
