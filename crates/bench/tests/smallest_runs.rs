//! Every workload at its smallest size, on quill in-process and on every mounted target this
//! machine has (quill through FUSE, the kernel's ext4, fuse2fs), through the same runner
//! `quill bench` uses: no errors, operations counted, e2fsck clean. Figures are not judged
//! here (benchmarks are for that); this keeps every workload and target from rotting.

use std::time::Duration;

use bench::results::RunResult;
use bench::runner::{run_plan, Event, Plan, Scratch};
use bench::targets::{Env, TargetSpec};
use bench::workloads::{Size, Workload};

fn plan(targets: &[&str], workloads: &[Workload], threads: &[usize], scratch: &Scratch) -> Plan {
    Plan {
        workloads: workloads.to_vec(),
        targets: targets.iter().map(|t| TargetSpec::parse(t).unwrap()).collect(),
        threads: threads.to_vec(),
        rounds: 1,
        duration: Duration::from_secs(2),
        size: Size::Smallest,
        iterations: Some(6),
        env: Env { scratch: scratch.path.clone(), image_bytes: 256 << 20 },
        baseline: Some(targets[0].to_string()),
        background_mb_per_sec: 20.0,
        fileserver: Default::default(),
        seed: 1,
        arrival_rates: Vec::new(),
    }
}

/// Runs the plan, printing what was skipped and why; returns the runs.
fn run(plan: &Plan) -> Vec<RunResult> {
    let report = run_plan(plan, &mut |event| match event {
        Event::Skipped(line) => println!("{line}"),
        Event::Starting { label, .. } => println!("{label}"),
        Event::Finished(r) => println!(
            "  {} ops in {:.2} s, fsyncs {}, fsck {:?}, {}{}",
            r.ops,
            r.seconds,
            r.fsyncs,
            r.fsck_clean,
            r.note,
            r.error.as_deref().map(|e| format!(" ERROR {e}")).unwrap_or_default()
        ),
    });
    report.runs
}

fn check_sane(runs: &[RunResult], expect_fsck: bool) {
    for r in runs {
        assert!(r.error.is_none(), "{} on {}: {:?}", r.workload, r.target, r.error);
        assert!(r.ops > 0 && r.seconds > 0.0, "{r:?}");
        if expect_fsck {
            assert_eq!(r.fsck_clean, Some(true), "{} on {}", r.workload, r.target);
        }
        match r.workload.as_str() {
            "varmail-shared" | "varmail-split" => {
                assert_eq!(r.ops % 13, 0, "13 flowops per iteration");
                assert_eq!(r.fsyncs * 13, r.ops * 2);
                assert!(r.bytes_read > 0 && r.bytes_written > 0 && r.files_created > 0);
            }
            "oltp-insert" => assert!(r.fsyncs >= r.ops),
            "tokubench" => assert_eq!(r.files_created, r.ops),
            "randwrite-fsync" => assert_eq!(r.fsyncs, r.ops),
            "fileserver" => {
                assert_eq!(r.ops % 11, 0, "11 flowops per iteration");
                assert_eq!((r.fsyncs, r.files_created * 11), (0, r.ops), "no fsync, one create");
                assert!(r.bytes_read > 0 && r.bytes_written > r.bytes_read / 2, "{r:?}");
            }
            "fsync-under-load" => assert_eq!(r.fsyncs, r.ops),
            "dbench" => assert!(r.mb_per_sec > 0.0 && r.note.contains("dbench")),
            // quill offers every operation the kernel's ext4 does, but the kernel's FUSE
            // client forwards no fallocate mode past KEEP_SIZE, PUNCH_HOLE and ZERO_RANGE
            // (fuse2fs may refuse more).
            "fsx" if !r.target.starts_with("fuse2fs") => {
                let dropped = r.note.split_once(bench::workloads::fsx::DROPPED).map(|(_, d)| d);
                let fuse_limit = [
                    "CollapseRange (Operation not supported",
                    "InsertRange (Operation not supported",
                ];
                let beyond: Vec<&str> = dropped
                    .into_iter()
                    .flat_map(|d| d.trim_start_matches(": ").split("), "))
                    .filter(|op| {
                        !(r.target.starts_with("quill-fuse")
                            && fuse_limit.iter().any(|l| op.starts_with(l)))
                    })
                    .collect();
                assert!(beyond.is_empty(), "{} dropped {beyond:?}", r.target)
            }
            _ => {}
        }
        let quill = r.target.starts_with("lib") || r.target.starts_with("quill-fuse");
        if quill && r.workload != "recovery" {
            let e = r.engine.as_ref().expect("quill targets report engine figures");
            if r.fsyncs > 0 {
                assert!(e.transactions > 0 && e.handles_per_transaction >= 1.0, "{e:?}");
            }
        }
    }
}

fn e2fsck_present() -> bool {
    let present = std::process::Command::new("e2fsck").arg("-V").output().is_ok();
    if !present {
        println!("SKIP the e2fsck verdicts: e2fsck is not installed");
    }
    present
}

#[test]
fn every_workload_runs_on_lib_at_its_smallest_size() {
    let scratch = Scratch::new(&std::env::temp_dir()).unwrap();
    let workloads: Vec<Workload> = Workload::ALL
        .into_iter()
        .filter(|w| !matches!(w, Workload::Dbench | Workload::Fsx))
        .collect();
    let runs = run(&plan(&["lib", "lib:preset=cjfs,data=journal"], &workloads, &[2], &scratch));
    // recovery needs cp to copy the image; everything else is in-process.
    assert_eq!(runs.len(), 2 * workloads.len());
    check_sane(&runs, e2fsck_present());
}

/// The open loop: iterations arrive at the offered rate for the whole second, each rate is its
/// own row, every arrival is served or counted unserved, and a response (from arrival) holds
/// its iteration's fsyncs. Workloads with no open-loop form are skipped, not run closed.
#[test]
fn open_loop_runs_serve_arrivals_at_the_offered_rate() {
    let scratch = Scratch::new(&std::env::temp_dir()).unwrap();
    let mut plan = plan(
        &["lib", "lib:preset=cjfs"],
        &[Workload::VarmailShared, Workload::OltpInsert, Workload::FsyncUnderLoad],
        &[3],
        &scratch,
    );
    plan.iterations = None;
    plan.duration = Duration::from_secs(1);
    plan.arrival_rates = vec![20.0, 60.0];
    let runs = run(&plan);
    assert_eq!(runs.len(), 2 * 2 * 2, "two workloads, two rates, two targets");
    assert!(runs.iter().all(|r| r.workload != "fsync-under-load"), "no open-loop form");
    for r in &runs {
        assert!(r.error.is_none(), "{} on {}: {:?}", r.workload, r.target, r.error);
        let rate = bench::workloads::open_loop_rate(&r.workload).expect("labelled with its rate");
        assert_eq!(r.arrival_rate, rate);
        // A Poisson count over one second: within 5 standard deviations of the rate.
        let spread = 5.0 * rate.sqrt();
        assert!((r.arrivals as f64 - rate).abs() <= spread, "{} arrivals at {rate}/s", r.arrivals);
        let served = r.arrivals - r.unserved;
        let per_iteration = if r.workload.starts_with("varmail") { 13 } else { 1 };
        assert_eq!(r.ops, served * per_iteration, "{r:?}");
        // The pool waited for arrivals: light work at these rates still takes the second.
        assert!(r.seconds >= 0.8, "{} s: arrivals were not paced", r.seconds);
        assert!(r.response_us_mean >= r.fsync_us_mean && r.response_us_p99 >= r.response_us_p50);
        assert_ne!(r.fsck_clean, Some(false), "{} on {}", r.workload, r.target);
    }
}

#[test]
fn fileserver_runs_on_lib_under_every_preset_with_data_journal_and_leaves_a_clean_image() {
    let scratch = Scratch::new(&std::env::temp_dir()).unwrap();
    let mut targets = vec!["lib".to_string()];
    targets.extend(journal::config::PRESETS.iter().map(|p| format!("lib:preset={p},data=journal")));
    let targets: Vec<&str> = targets.iter().map(String::as_str).collect();
    let runs = run(&plan(&targets, &[Workload::Fileserver], &[1, 4], &scratch));
    assert_eq!(runs.len(), 2 * targets.len());
    check_sane(&runs, e2fsck_present());
}

#[test]
fn every_workload_runs_on_the_mounted_targets_this_machine_has() {
    let scratch = Scratch::new(&std::env::temp_dir()).unwrap();
    let targets = ["quill-fuse", "kernel-ext4", "fuse2fs"];
    let usable: Vec<&str> = targets
        .iter()
        .copied()
        .filter(|t| match TargetSpec::parse(t).unwrap().available() {
            Ok(()) => true,
            Err(reason) => {
                println!("SKIP target {t}: {reason}");
                false
            }
        })
        .collect();
    if usable.is_empty() {
        println!("SKIP: no mounted target is available on this machine");
        return;
    }
    let runs = run(&plan(&usable, &Workload::ALL, &[2], &scratch));
    check_sane(&runs, e2fsck_present());
    if bench::workloads::dbench::available().is_ok() {
        assert!(runs.iter().any(|r| r.workload == "dbench"), "dbench ran");
    } else {
        println!("SKIP dbench: {}", bench::workloads::dbench::available().unwrap_err());
    }
}

/// The recovery study at its smallest: a 4 MiB journal filled by randwrite-fsync under
/// data=journal, replayed by quill with 1 and 2 threads (both clean under e2fsck -fn), and by
/// e2fsck and the kernel where this machine can run them.
#[test]
fn the_recovery_study_runs_at_its_smallest_size() {
    use bench::recovery_study::{format_study, recovery_study, StudyParams};
    let parent = std::env::temp_dir().join("quill-bench-study-test");
    let scratch = Scratch::new(&parent).unwrap();
    let params = StudyParams {
        workload: Workload::RandwriteFsync,
        data: fs::DataMode::Journal,
        journal_mib: 4,
        fill_percent: 70,
        threads: vec![1, 2],
        rounds: 1,
        scratch: scratch.path.clone(),
        fill_seconds_max: 60.0,
    };
    let (image, rows) = recovery_study(&params, &mut |line| println!("{line}")).unwrap();
    print!("{}", format_study(&rows));
    assert!(image.log_used * 2 >= image.log_capacity, "the log is at least half full: {image:?}");
    for row in &rows {
        if row.label.starts_with("quill") || e2fsck_present() && row.label.starts_with("e2fsck") {
            assert!(row.error.is_none() && row.seconds.len() == 1, "{row:?}");
        }
        match &row.error {
            Some(e) => println!("SKIP {}: {e}", row.label),
            None => {
                assert!(row.all_clean, "{}: e2fsck -fn finds the replayed copy unclean", row.label)
            }
        }
    }
    let _ = std::fs::remove_dir(&parent);
}
