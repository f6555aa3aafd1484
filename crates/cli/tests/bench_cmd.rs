//! `quill bench` end to end at the smallest size: a plan over quill in-process and the
//! kernel's ext4 (where this machine can loop-mount), with the probe, writes a report that
//! parses, CSV with a row per run, and every plot in SVG and PNG; bad arguments fail with one
//! line before anything runs. (Each workload on each target is exercised by
//! crates/bench/tests/smallest_runs.rs; figures are for benchmarks, not judged here.)

mod common;

use common::*;
use serde_json::Value;

/// Runs `quill bench --size smallest --image-mib 128` with `run_args` and `plan_args`, its
/// report in `out` and its images under `scratch`; asserts it succeeded, returns its output
/// and stdout.
fn bench(
    scratch: &Scratch,
    out: &std::path::Path,
    run_args: &[&str],
    plan_args: &[&str],
) -> (std::process::Output, String) {
    let o = run(quill()
        .args(["bench", "--size", "smallest", "--image-mib", "128"])
        .args(run_args)
        .args(plan_args)
        .arg("--out")
        .arg(out)
        .arg("--scratch")
        .arg(scratch.path("")));
    assert!(o.status.success(), "{}", text(&o));
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    (o, stdout)
}

#[test]
fn a_small_bench_writes_its_table_json_csv_and_plots() {
    let scratch = Scratch::new("bench-small");
    let out = scratch.path("out");
    let mut targets = vec!["lib", "lib:preset=cjfs"];
    let kernel = unsafe { libc::geteuid() } == 0 && have("mkfs.ext4", "kernel-ext4 target");
    if kernel {
        targets.push("kernel-ext4");
    } else {
        println!("SKIP the kernel-ext4 target: needs root and mkfs.ext4");
    }
    let targets_arg = targets.join(";");
    let (o, stdout) = bench(
        &scratch,
        &out,
        &["--seconds", "0.5", "--rounds", "2", "--threads", "1,2", "--probe-seconds", "0.3"],
        &["--workloads", "varmail-shared,tokubench,recovery", "--targets", &targets_arg],
    );
    assert!(stdout.contains("device probe"), "{stdout}");
    for t in &targets {
        assert!(stdout.contains(t), "{t} in the table:\n{stdout}");
    }
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    let runs = report["runs"].as_array().unwrap();
    // 2 rounds × (2 sweeping workloads × 2 thread counts + recovery once) × targets.
    assert_eq!(runs.len(), 2 * (2 * 2 + 1) * targets.len());
    for r in runs {
        assert!(r["error"].is_null(), "{r}");
        assert!(r["ops"].as_u64().unwrap() > 0, "{r}");
        if have("e2fsck", "the e2fsck verdicts") {
            assert_eq!(r["fsck_clean"], Value::Bool(true), "{r}");
        }
    }
    let expected_baseline = if kernel { "kernel-ext4" } else { "lib" };
    assert_eq!(report["baseline"], expected_baseline);
    assert!(report["probe"]["fdatasyncs_per_sec_limit"].as_f64().unwrap() > 0.0);
    let summaries = report["summaries"].as_array().unwrap();
    assert_eq!(summaries.len(), (2 * 2 + 1) * targets.len());
    assert!(summaries.iter().all(|s| s["rounds"] == 2));
    let csv = std::fs::read_to_string(out.join("runs.csv")).unwrap();
    assert_eq!(csv.lines().count(), runs.len() + 1);
    for name in [
        "throughput-varmail-shared",
        "throughput-tokubench",
        "fsync-cdf-varmail-shared",
        "engine-varmail-shared",
        "recovery",
    ] {
        let svg = std::fs::read_to_string(out.join("plots").join(format!("{name}.svg"))).unwrap();
        assert!(svg.contains("<svg"), "{name}.svg");
        let png = out.join("plots").join(format!("{name}.png"));
        match std::fs::read(&png) {
            Ok(bytes) => assert!(bytes.starts_with(b"\x89PNG") && bytes.len() > 1024, "{name}.png"),
            Err(_) => {
                // PNG text needs a font; without one the command says so and skips PNGs.
                assert!(text(&o).contains("plots:"), "{name}.png missing without a reason");
                println!("SKIP {name}.png: {}", text(&o));
            }
        }
    }
    // The scratch directory the bench made for images and mounts is gone.
    let leftovers: Vec<_> = std::fs::read_dir(scratch.path(""))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("quill-bench-scratch"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// kernel-ext4:fast_commit runs are traced (ext4:ext4_fc_commit_stop, `kernel_fc.rs`): every
/// fsync of the measured phase is counted once by what the kernel did with it, and the table
/// shows them. Needs root, mkfs.ext4 and tracefs.
#[test]
fn the_kernels_fast_commits_are_counted_by_outcome() {
    let test = "the_kernels_fast_commits_are_counted_by_outcome";
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !have("mkfs.ext4", test) {
        println!("SKIP {test}: needs root and mkfs.ext4");
        return;
    }
    if !std::path::Path::new("/sys/kernel/tracing/events/ext4/ext4_fc_commit_stop").exists() {
        println!("SKIP {test}: no tracefs with ext4's fast-commit tracepoint");
        return;
    }
    let scratch = Scratch::new("bench-kernel-fc");
    let out = scratch.path("out");
    let (_, stdout) = bench(
        &scratch,
        &out,
        &["--seconds", "1", "--rounds", "1", "--threads", "1,4", "--probe-seconds", "0"],
        &["--workloads", "varmail-shared", "--targets", "kernel-ext4:fast_commit"],
    );
    assert!(stdout.contains("kernel fast commits (ext4_fc_commit_stop)"), "{stdout}");
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    for r in report["runs"].as_array().unwrap() {
        let k = &r["kernel_fc"];
        let counted: u64 = ["written", "full_commits", "skipped_committed", "skipped_after_other"]
            .iter()
            .map(|f| k[f].as_u64().unwrap_or_else(|| panic!("{f} in {r}")))
            .sum();
        let (fsyncs, threads) = (r["fsyncs"].as_u64().unwrap(), r["threads"].as_u64().unwrap());
        // Fsyncs in flight when the measured phase begins or ends may fall on either side.
        assert!(counted.abs_diff(fsyncs) <= threads, "{counted} counted, {fsyncs} fsyncs: {r}");
        assert!(k["written"].as_u64().unwrap() > 0, "{r}");
    }
}

#[test]
fn bad_arguments_fail_with_one_line_before_running_anything() {
    let scratch = Scratch::new("bench-bad");
    for (args, says) in [
        (vec!["--workloads", "mailstorm"], "unknown workload mailstorm"),
        (vec!["--targets", "zfs"], "unknown target zfs"),
        (vec!["--targets", "lib:preset=fast"], "unknown preset fast"),
        (vec!["--threads", "0"], "--threads"),
        (vec!["--seconds", "0"], "--seconds"),
        (vec!["--size", "huge"], "--size huge"),
        (vec!["--baseline", "fuse2fs", "--targets", "lib"], "not one of the targets"),
    ] {
        let o = run(quill().arg("bench").args(&args).arg("--out").arg(scratch.path("out")));
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", text(&o));
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(!scratch.path("out").exists(), "{args:?} wrote output");
    }
}
