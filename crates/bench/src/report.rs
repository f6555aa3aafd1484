//! A report as a terminal table and as CSV files (JSON is the [`Report`] itself, via serde).

use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};

use crate::results::{EngineFigures, Report, RunResult, Summary};

/// The summary table: one row per (workload, target, threads) with the headline's median and
/// range, the ratio against the baseline, throughput, fsync latency, the share of the device's
/// fsync limit, the engine's figures and the e2fsck verdict; then failed runs, if any.
pub fn format_table(report: &Report) -> String {
    let mut out = String::new();
    let labels = TargetLabels::new(report);
    labels.key(&mut out);
    let limit = report.probe.as_ref().map(|p| p.fdatasyncs_per_sec_limit);
    let mut workload = "";
    for s in &report.summaries {
        if s.workload != workload {
            workload = &s.workload;
            let base = report.baseline.as_deref().unwrap_or("-");
            let _ = writeln!(
                out,
                "\n{workload} (headline {}, {}; ratio vs {base}, above 1 is better)",
                s.headline.label(),
                if s.headline.higher_is_better() { "higher is better" } else { "lower is better" }
            );
            let _ = writeln!(
                out,
                "{:<28} {:>4} {:>10} {:>19} {:>6} {:>8} {:>7} {:>7} {:>7} {:>8} {:>6} {:>6} {:>6} {:>7} {:>5} {:>5}",
                "target", "thr", "median", "min..max", "ratio", "MB/s", "fs avg", "fs p50", "fs p99", "fs p99.9",
                "%lim", "hdl/tx", "cfl/tx", "flms/tx", "qd", "fsck"
            );
        }
        let _ = writeln!(out, "{}", row(s, limit, &labels));
    }
    open_loop_table(&mut out, report, &labels);
    fast_commit_table(&mut out, report, &labels);
    kernel_fc_table(&mut out, report, &labels);
    per_fsync_table(&mut out, report, &labels);
    fuse_request_table(&mut out, report, &labels);
    stage_table(&mut out, report, &labels);
    lock_wait_table(&mut out, report, &labels);
    let failed: Vec<&RunResult> = report.runs.iter().filter(|r| r.error.is_some()).collect();
    if !failed.is_empty() {
        let _ = writeln!(out, "\nFAILED RUNS");
        for r in failed {
            let _ = writeln!(
                out,
                "  {} on {}, {} threads, round {}: {}",
                r.workload,
                r.target,
                r.threads,
                r.round + 1,
                r.error.as_deref().unwrap_or("")
            );
        }
    }
    out
}

/// The open-loop runs' offered and served rates and response times (median runs).
fn open_loop_table(out: &mut String, report: &Report, labels: &TargetLabels) {
    let open: Vec<&Summary> =
        report.summaries.iter().filter(|s| s.median_run.arrival_rate > 0.0).collect();
    if open.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nopen loop, median runs (offered: iterations arriving per second; served: iterations \
         finished per second; unserved: arrivals no thread reached by the end; response: ms \
         from arrival to end, queueing included)"
    );
    let _ = writeln!(
        out,
        "{:<28} {:<28} {:>4} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "workload",
        "target",
        "thr",
        "offered",
        "served",
        "unserved",
        "rs avg",
        "rs p50",
        "rs p99",
        "rs p99.9"
    );
    for s in open {
        let r = &s.median_run;
        let ms = |us: u64| format!("{:.2}", us as f64 / 1000.0);
        let _ = writeln!(
            out,
            "{:<28} {:<28} {:>4} {:>8} {:>8.1} {:>8} {:>8} {:>8} {:>8} {:>8}",
            truncate(&s.workload, 28),
            labels.get(&s.target),
            s.threads,
            r.arrival_rate,
            r.served_per_sec(),
            r.unserved,
            ms(r.response_us_mean),
            ms(r.response_us_p50),
            ms(r.response_us_p99),
            ms(r.response_us_p999)
        );
    }
}

/// The summaries whose median run has engine figures `keep` accepts, with those figures.
fn engine_rows(
    report: &Report,
    keep: impl Fn(&Summary, &EngineFigures) -> bool,
) -> Vec<(&Summary, &EngineFigures)> {
    report
        .summaries
        .iter()
        .filter_map(|s| s.median_run.engine.as_ref().map(|e| (s, e)))
        .filter(|(s, e)| keep(s, e))
        .collect()
}

/// A row's first columns: workload, target and thread count.
fn row_head(s: &Summary, labels: &TargetLabels) -> String {
    format!("{:<20} {:<28} {:>4}", truncate(&s.workload, 20), labels.get(&s.target), s.threads)
}

/// fsync_journal: how many fsyncs of the median run were fast commits, and why the others
/// committed the transaction.
fn fast_commit_table(out: &mut String, report: &Report, labels: &TargetLabels) {
    let rows =
        engine_rows(report, |_, e| e.fast_commits > 0 || !e.fast_commit_fallbacks.is_empty());
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nfast commits (fsync_journal), median runs: fsyncs written as fast commits, their \
         share of all fsyncs, fsyncs per area write (group commit), area blocks per write, and \
         the fsyncs that committed instead, by reason"
    );
    let _ = writeln!(
        out,
        "{:<20} {:<28} {:>4} {:>8} {:>6} {:>8} {:>7}  fallbacks",
        "workload", "target", "thr", "fc", "share", "fc/write", "blk/wr"
    );
    for (s, e) in rows {
        let fsyncs = s.median_run.fsyncs;
        let share = if fsyncs == 0 { 0.0 } else { e.fast_commits as f64 / fsyncs as f64 };
        let writes = e.fast_commit_writes.max(1) as f64;
        let fallbacks: Vec<String> =
            e.fast_commit_fallbacks.iter().map(|(reason, n)| format!("{reason} {n}")).collect();
        let _ = writeln!(
            out,
            "{} {:>8} {:>5.0}% {:>8.2} {:>7.2}  {}",
            row_head(s, labels),
            e.fast_commits,
            share * 100.0,
            e.fast_commits as f64 / writes,
            e.fast_commit_blocks as f64 / writes,
            if fallbacks.is_empty() { "-".to_string() } else { fallbacks.join(", ") }
        );
    }
}

/// kernel-ext4:fast_commit: what the kernel's fast commit did with the median run's fsyncs
/// (`kernel_fc.rs`): written, fallen back to a full commit, skipped because a full commit
/// had their transaction, and skipped after another fast commit without asking whether it
/// carried the file (at most that many acknowledged before they were durable).
fn kernel_fc_table(out: &mut String, report: &Report, labels: &TargetLabels) {
    let rows: Vec<_> = report
        .summaries
        .iter()
        .filter_map(|s| s.median_run.kernel_fc.as_ref().map(|k| (s, k)))
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nkernel fast commits (ext4_fc_commit_stop), median runs: fsyncs that wrote a fast \
         commit, fell back to a full commit, returned as already committed, and returned after \
         another fast commit ended without asking whether it carried theirs (README: the \
         kernel's fast commit acknowledges fsyncs it has not made durable); fc/write as in \
         quill's table"
    );
    let _ = writeln!(
        out,
        "{:<20} {:<28} {:>4} {:>8} {:>8} {:>9} {:>13} {:>6} {:>8}",
        "workload",
        "target",
        "thr",
        "written",
        "full",
        "committed",
        "after-other",
        "share",
        "fc/write"
    );
    for (s, k) in rows {
        let all = k.written + k.full_commits + k.skipped_committed + k.skipped_after_other;
        let share = if all == 0 { 0.0 } else { k.skipped_after_other as f64 / all as f64 };
        let served = (k.written + k.skipped_after_other) as f64 / k.written.max(1) as f64;
        let _ = writeln!(
            out,
            "{} {:>8} {:>8} {:>9} {:>13} {:>5.0}% {:>8.2}",
            row_head(s, labels),
            k.written,
            k.full_commits,
            k.skipped_committed,
            k.skipped_after_other,
            share * 100.0,
            served
        );
    }
}

/// Opcodes a FUSE row names, the most handler time first.
const FUSE_OPS_SHOWN: usize = 6;

/// quill-fuse targets: the FUSE requests of the median run per workload operation, how busy
/// the request threads were in quill's handlers, the most fsyncs in flight at once, and the
/// opcodes that took the most handler time, with their requests per operation and
/// microseconds each.
fn fuse_request_table(out: &mut String, report: &Report, labels: &TargetLabels) {
    let rows = engine_rows(report, |_, e| e.fuse.is_some());
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nFUSE requests (quill-fuse), median runs: requests per workload op, request threads \
         and their time in quill's handlers (% of threads x run), most fsyncs in flight, and \
         the opcodes taking most of that time: requests per op (us each in quill)"
    );
    let _ = writeln!(
        out,
        "{:<20} {:<28} {:>4} {:>7} {:>4} {:>6} {:>6}  opcodes",
        "workload", "target", "thr", "req/op", "fthr", "busy%", "fsyncs"
    );
    for (s, e) in rows {
        let fuse = e.fuse.as_ref().expect("kept rows have FUSE figures");
        let ops = s.median_run.ops.max(1) as f64;
        let capacity_ms = fuse.threads as f64 * s.median_run.seconds * 1000.0;
        let busy = if capacity_ms > 0.0 { fuse.busy_ms() / capacity_ms * 100.0 } else { 0.0 };
        let mut by_time = fuse.ops.clone();
        by_time.sort_by(|a, b| b.2.total_cmp(&a.2));
        let shown: Vec<String> = by_time
            .iter()
            .take(FUSE_OPS_SHOWN)
            .map(|(name, n, ms)| {
                format!("{name} {:.2} ({:.0})", *n as f64 / ops, ms * 1000.0 / (*n).max(1) as f64)
            })
            .collect();
        let _ = writeln!(
            out,
            "{} {:>7.2} {:>4} {:>5.0}% {:>6}  {}",
            row_head(s, labels),
            fuse.requests() as f64 / ops,
            fuse.threads,
            busy,
            fuse.fsyncs_in_flight_max,
            shown.join(", ")
        );
    }
}

/// What each fsync cost the journal in the median run of a quill target: bytes it wrote (log,
/// fast-commit area, checkpoints) and device flushes plus FUA writes it issued.
fn per_fsync_table(out: &mut String, report: &Report, labels: &TargetLabels) {
    let rows = engine_rows(report, |s, _| s.median_run.fsyncs > 0);
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\njournal I/O per fsync, median runs: KiB the journal wrote (log blocks, fast-commit \
         area, checkpoints) and its device flushes + FUA writes"
    );
    let _ = writeln!(
        out,
        "{:<20} {:<28} {:>4} {:>10} {:>12}",
        "workload", "target", "thr", "KiB/fsync", "syncs/fsync"
    );
    for (s, e) in rows {
        let fsyncs = s.median_run.fsyncs as f64;
        let _ = writeln!(
            out,
            "{} {:>10.1} {:>12.2}",
            row_head(s, labels),
            e.journal_bytes as f64 / 1024.0 / fsyncs,
            e.device_syncs as f64 / fsyncs
        );
    }
}

/// Where the median run's transactions spent their time, per transaction (CJFS's stages:
/// what each waits on), with handle start waits and transactions in flight.
fn stage_table(out: &mut String, report: &Report, labels: &TargetLabels) {
    let with_engine: Vec<&Summary> =
        report.summaries.iter().filter(|s| s.median_run.engine.is_some()).collect();
    if with_engine.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nstages, ms per transaction over the median run (run: open; slot: due, waiting for a \
         committing slot; cfl: held by conflicts; lock: locked until frozen; write: ordered data \
         and log blocks, of which ord the ordered data; fq: written, waiting for the flush stage; flush: written to durable, of which dflush \
         the device flush and fua the commit blocks); hs-wait: µs per handle waiting to start; \
         in-flight: mean (Little's law) and max"
    );
    let _ = writeln!(
        out,
        "{:<20} {:<28} {:>4} {:>7} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>7} {:>9}",
        "workload",
        "target",
        "thr",
        "run",
        "slot",
        "cfl",
        "lock",
        "write",
        "ord",
        "fq",
        "flush",
        "dflush",
        "fua",
        "hs-wait",
        "in-flight"
    );
    for s in with_engine {
        let r = &s.median_run;
        let e = r.engine.as_ref().expect("filtered");
        let per = |ms: f64| format!("{:.3}", e.per_transaction(ms));
        let handle_wait_us =
            if e.handles == 0 { 0.0 } else { e.ms_handle_start_wait * 1000.0 / e.handles as f64 };
        let _ = writeln!(
            out,
            "{:<20} {:<28} {:>4} {:>7} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>7.1} {:>9}",
            truncate(&s.workload, 20),
            labels.get(&s.target),
            s.threads,
            per(e.ms_running),
            per(e.ms_slot_wait),
            per(e.ms_conflict_wait),
            per(e.ms_locked),
            per(e.ms_writing),
            per(e.ms_ordered_wait),
            per(e.ms_flush_queue),
            per(e.ms_flushing),
            per(e.ms_device_flush),
            per(e.ms_commit_fua),
            handle_wait_us,
            format!("{:.2}/{}", e.in_flight_mean(r.seconds), e.in_flight_max)
        );
    }
}

/// Milliseconds waited for each engine lock in the median run of every quill target (the
/// FAST'18 paper's lock-contention breakdown).
fn lock_wait_table(out: &mut String, report: &Report, labels: &TargetLabels) {
    let with_locks: Vec<&Summary> = report
        .summaries
        .iter()
        .filter(|s| s.median_run.engine.as_ref().is_some_and(|e| !e.lock_wait_ms.is_empty()))
        .collect();
    let Some(first) = with_locks.first() else { return };
    let names: Vec<&str> = first
        .median_run
        .engine
        .as_ref()
        .map_or(Vec::new(), |e| e.lock_wait_ms.iter().map(|(n, _)| n.as_str()).collect());
    let _ = writeln!(out, "\nlock waits, ms over the median run (per lock, JBD2's names)");
    let mut header = format!("{:<20} {:<28} {:>4}", "workload", "target", "thr");
    for name in &names {
        let _ = write!(header, " {:>10}", truncate(name, 10));
    }
    let _ = writeln!(out, "{header}");
    for s in with_locks {
        let e = s.median_run.engine.as_ref().expect("filtered");
        let mut line = format!(
            "{:<20} {:<28} {:>4}",
            truncate(&s.workload, 20),
            labels.get(&s.target),
            s.threads
        );
        for name in &names {
            let _ = write!(line, " {:>10.1}", e.lock_wait(name));
        }
        let _ = writeln!(out, "{line}");
    }
}

fn row(s: &Summary, fsync_limit: Option<f64>, labels: &TargetLabels) -> String {
    let r = &s.median_run;
    let ratio = s.vs_baseline.map_or("-".to_string(), |v| format!("{v:.2}x"));
    let (hdl, cfl, flush, qd) = match &r.engine {
        Some(e) => (
            format!("{:.1}", e.handles_per_transaction),
            format!("{:.2}", e.conflicts_per_transaction),
            format!("{:.3}", e.flush_ms_per_transaction()),
            format!("{:.1}", e.queue_depth_mean),
        ),
        None => ("-".into(), "-".into(), "-".into(), "-".into()),
    };
    // fsyncs per second as a share of what one thread's write+fdatasync gets from the disk.
    let share = match fsync_limit {
        Some(limit) if r.fsyncs > 0 && limit > 0.0 && r.seconds > 0.0 => {
            format!("{:.0}%", r.fsyncs as f64 / r.seconds / limit * 100.0)
        }
        _ => "-".into(),
    };
    let fsck = match r.fsck_clean {
        Some(true) => "clean",
        Some(false) => "BAD",
        None => "-",
    };
    let latency = |v: u64| if r.fsyncs == 0 { "-".to_string() } else { v.to_string() };
    format!(
        "{:<28} {:>4} {:>10} {:>19} {:>6} {:>8.1} {:>7} {:>7} {:>7} {:>8} {:>6} {:>6} {:>6} {:>7} {:>5} {:>5}",
        labels.get(&s.target),
        s.threads,
        number(s.median),
        format!("{}..{}", number(s.min), number(s.max)),
        ratio,
        r.mb_per_sec,
        latency(r.fsync_us_mean),
        latency(r.fsync_us_p50),
        latency(r.fsync_us_p99),
        latency(r.fsync_us_p999),
        share,
        hdl,
        cfl,
        flush,
        qd,
        fsck
    )
}

/// Width of the target column.
const TARGET_WIDTH: usize = 28;

/// The target column's text for each target. When every label fits, the label itself; else
/// each target is numbered in order of appearance and shown as `#k` and what follows the
/// prefix all labels share (cut at a `:` or `,`), so rows that differ only late in a long label
/// stay apart; a key above the tables gives every label in full.
struct TargetLabels {
    /// (full label, column text), in order of appearance.
    labels: Vec<(String, String)>,
}

impl TargetLabels {
    fn new(report: &Report) -> TargetLabels {
        let mut full: Vec<String> = Vec::new();
        for s in &report.summaries {
            if !full.contains(&s.target) {
                full.push(s.target.clone());
            }
        }
        if full.iter().all(|l| l.chars().count() <= TARGET_WIDTH) {
            let labels = full.into_iter().map(|l| (l.clone(), l)).collect();
            return TargetLabels { labels };
        }
        let common = shared_label_prefix(&full);
        let labels = full
            .into_iter()
            .enumerate()
            .map(|(k, label)| {
                let tag = format!("#{} ", k + 1);
                let room = TARGET_WIDTH - tag.len();
                let text = if label.len() > common {
                    format!("{tag}{}", truncate(&label[common..], room))
                } else {
                    // The label is the shared prefix itself (a baseline the others extend).
                    format!("{tag}{}", truncate_front(&label, room))
                };
                (label, text)
            })
            .collect();
        TargetLabels { labels }
    }

    fn get(&self, target: &str) -> String {
        self.labels
            .iter()
            .find(|(full, _)| full == target)
            .map_or_else(|| truncate(target, TARGET_WIDTH), |(_, text)| text.clone())
    }

    /// The key to shortened labels, if any were shortened.
    fn key(&self, out: &mut String) {
        if self.labels.iter().all(|(full, text)| full == text) {
            return;
        }
        let _ = writeln!(
            out,
            "\ntargets (the tables show #k and the label after the prefix they share):"
        );
        for (k, (full, _)) in self.labels.iter().enumerate() {
            let _ = writeln!(out, "  #{} {full}", k + 1);
        }
    }
}

/// Bytes of the longest prefix every label shares that ends just after a `:` or `,`, or 0
/// with fewer than two labels (the tables and the plots' legends drop it from long labels).
pub(crate) fn shared_label_prefix(labels: &[String]) -> usize {
    let [first, rest @ ..] = labels else { return 0 };
    if rest.is_empty() {
        return 0;
    }
    // Each label ends with a comma here, so a label that the others extend with `,...` is
    // shared whole.
    let first = format!("{first},");
    let mut shared = first.len();
    for label in rest {
        let label = format!("{label},");
        shared = first.bytes().zip(label.bytes()).take(shared).take_while(|(a, b)| a == b).count();
    }
    first[..shared].rfind([':', ',']).map_or(0, |i| i + 1)
}

/// `s` cut to its last `n` characters, marked with a leading `~`.
fn truncate_front(s: &str, n: usize) -> String {
    let count = s.chars().count();
    if count <= n {
        return s.to_string();
    }
    let tail: String = s.chars().skip(count - (n - 1)).collect();
    format!("~{tail}")
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n - 1).collect();
        t.push('~');
        t
    }
}

/// A figure with sensible precision: 3 decimals below 10, none from 1000.
fn number(v: f64) -> String {
    if !v.is_finite() {
        "-".into()
    } else if v.abs() < 10.0 {
        format!("{v:.3}")
    } else if v.abs() < 1000.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

/// Quotes a CSV field when it needs it (RFC 4180).
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

const RUN_COLUMNS: &str = "workload,target,threads,round,seconds,ops,ops_per_sec,bytes_read,\
bytes_written,mb_per_sec,files_created,files_per_sec,fsyncs,fsync_us_p50,fsync_us_p99,\
fsync_us_p999,transactions,handles_per_transaction,conflicts_per_transaction,\
flushes_per_transaction,ms_locked,ms_writing,ms_flushing,queue_depth_mean,queue_depth_max,\
ms_device_flush,lock_wait_ms_total,ms_running,ms_slot_wait,ms_conflict_wait,ms_flush_queue,\
ms_commit_fua,handles,ms_handle_start_wait,in_flight_mean,in_flight_max,ms_ordered_wait,\
arrival_rate,arrivals,unserved,response_us_mean,response_us_p50,response_us_p99,response_us_p999,\
fsck_clean,error,note";

fn run_csv_row(r: &RunResult) -> String {
    let e = r.engine.clone().unwrap_or_default();
    let engine = if r.engine.is_some() {
        format!(
            "{},{:.3},{:.3},{:.3},{:.1},{:.1},{:.1},{:.3},{},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{},{:.1},{:.3},{},{:.1}",
            e.transactions,
            e.handles_per_transaction,
            e.conflicts_per_transaction,
            e.flushes_per_transaction,
            e.ms_locked,
            e.ms_writing,
            e.ms_flushing,
            e.queue_depth_mean,
            e.queue_depth_max,
            e.ms_device_flush,
            e.lock_wait_ms.iter().map(|(_, ms)| ms).sum::<f64>(),
            e.ms_running,
            e.ms_slot_wait,
            e.ms_conflict_wait,
            e.ms_flush_queue,
            e.ms_commit_fua,
            e.handles,
            e.ms_handle_start_wait,
            e.in_flight_mean(r.seconds),
            e.in_flight_max,
            e.ms_ordered_wait
        )
    } else {
        ",".repeat(20)
    };
    format!(
        "{},{},{},{},{:.3},{},{:.1},{},{},{:.3},{},{:.1},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
        csv_field(&r.workload),
        csv_field(&r.target),
        r.threads,
        r.round,
        r.seconds,
        r.ops,
        r.ops_per_sec,
        r.bytes_read,
        r.bytes_written,
        r.mb_per_sec,
        r.files_created,
        r.files_per_sec,
        r.fsyncs,
        r.fsync_us_p50,
        r.fsync_us_p99,
        r.fsync_us_p999,
        engine,
        r.arrival_rate,
        r.arrivals,
        r.unserved,
        r.response_us_mean,
        r.response_us_p50,
        r.response_us_p99,
        r.response_us_p999,
        r.fsck_clean.map_or(String::new(), |c| c.to_string()),
        csv_field(r.error.as_deref().unwrap_or("")),
        csv_field(&r.note)
    )
}

/// `runs.csv` (every run) and `summary.csv` (medians) in `dir`; returns the files written.
pub fn write_csv(report: &Report, dir: &Path) -> io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut runs = format!("{RUN_COLUMNS}\n");
    for r in &report.runs {
        runs += &run_csv_row(r);
        runs.push('\n');
    }
    let mut summary = String::from(
        "workload,target,threads,rounds,headline,median,min,max,vs_baseline,fsync_us_p50,fsync_us_p99,fsync_us_p999,fsync_us_mean\n",
    );
    for s in &report.summaries {
        let r = &s.median_run;
        let _ = writeln!(
            summary,
            "{},{},{},{},{},{},{},{},{},{},{},{},{}",
            csv_field(&s.workload),
            csv_field(&s.target),
            s.threads,
            s.rounds,
            csv_field(s.headline.label()),
            s.median,
            s.min,
            s.max,
            s.vs_baseline.map_or(String::new(), |v| format!("{v:.4}")),
            r.fsync_us_p50,
            r.fsync_us_p99,
            r.fsync_us_p999,
            r.fsync_us_mean
        );
    }
    let files = vec![dir.join("runs.csv"), dir.join("summary.csv")];
    std::fs::write(&files[0], runs)?;
    std::fs::write(&files[1], summary)?;
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::summarize;

    #[test]
    fn table_and_csv_have_a_row_per_summary_and_run() {
        let mut a = RunResult {
            workload: "varmail-shared".into(),
            target: "lib".into(),
            threads: 2,
            seconds: 1.0,
            ops: 1300,
            fsyncs: 200,
            note: "a, \"quoted\" note".into(),
            fsck_clean: Some(true),
            ..Default::default()
        };
        a.set_rates();
        let mut b = a.clone();
        b.target = "kernel-ext4".into();
        let mut failed = a.clone();
        failed.error = Some("boom".into());
        let runs = vec![a, b, failed];
        let report = Report {
            summaries: summarize(&runs, Some("kernel-ext4")),
            runs,
            baseline: Some("kernel-ext4".into()),
            ..Default::default()
        };
        let table = format_table(&report);
        assert!(table.contains("varmail-shared"));
        assert!(table.contains("1.00x"));
        assert!(table.contains("FAILED RUNS") && table.contains("boom"));
        let dir = std::env::temp_dir().join(format!("quill-report-{}", std::process::id()));
        let files = write_csv(&report, &dir).unwrap();
        let runs_csv = std::fs::read_to_string(&files[0]).unwrap();
        assert_eq!(runs_csv.lines().count(), 4);
        let columns = RUN_COLUMNS.split(',').count();
        // The quoted note holds a comma; every other row has exactly the header's columns.
        assert!(runs_csv.contains("\"a, \"\"quoted\"\" note\""));
        assert_eq!(runs_csv.lines().next().unwrap().split(',').count(), columns);
        let summary_csv = std::fs::read_to_string(&files[1]).unwrap();
        assert_eq!(summary_csv.lines().count(), 3);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn quill_fuse_runs_get_a_request_table_with_the_costliest_opcodes_first() {
        let mut run = RunResult {
            workload: "varmail-shared".into(),
            target: "quill-fuse".into(),
            threads: 16,
            seconds: 2.0,
            ops: 1000,
            engine: Some(EngineFigures {
                fuse: Some(crate::results::FuseFigures {
                    threads: 4,
                    // 4 threads for 2 s: 8,000 ms; 2,000 ms in handlers is 25%.
                    ops: vec![
                        ("getattr".into(), 400, 100.0),
                        ("fsync".into(), 150, 1800.0),
                        ("flush".into(), 200, 100.0),
                    ],
                    fsyncs_in_flight_max: 4,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        run.set_rates();
        let mut lib = run.clone();
        lib.target = "lib".into();
        lib.engine = Some(EngineFigures::default());
        let runs = vec![run, lib];
        let report = Report {
            summaries: summarize(&runs, None),
            runs,
            baseline: None,
            ..Default::default()
        };
        let table = format_table(&report);
        let rows: Vec<&str> = table
            .lines()
            .skip_while(|l| !l.starts_with("FUSE requests"))
            .skip(2)
            .take_while(|l| !l.is_empty())
            .collect();
        assert_eq!(rows.len(), 1, "{table}");
        let row = rows[0];
        assert!(row.contains("quill-fuse") && row.contains("0.75") && row.contains("25%"), "{row}");
        // fsync took the most handler time: first, at 12,000 us each.
        let fsync = row.find("fsync 0.15 (12000)").expect(row);
        assert!(fsync < row.find("getattr 0.40 (250)").expect(row), "{row}");
    }

    #[test]
    fn open_loop_runs_are_judged_by_their_response_time_and_get_their_own_table() {
        let workload = crate::workloads::Workload::VarmailShared.label(Some(400.0));
        assert_eq!(workload, "varmail-shared@400/s");
        let run = |target: &str, response_ms: u64| {
            let mut r = RunResult {
                workload: workload.clone(),
                target: target.into(),
                threads: 8,
                seconds: 2.0,
                ops: 13 * 790,
                ..Default::default()
            };
            r.set_open_loop(400.0, 800, 10, vec![response_ms * 1000; 790]);
            r.set_rates();
            r
        };
        let runs = vec![run("lib", 8), run("lib:preset=cjfs", 2)];
        let report = Report {
            summaries: summarize(&runs, Some("lib")),
            runs,
            baseline: Some("lib".into()),
            ..Default::default()
        };
        let cjfs = &report.summaries[1];
        assert_eq!((cjfs.median, cjfs.vs_baseline), (2000.0, Some(4.0)), "a quarter the p99");
        let table = format_table(&report);
        assert!(table.contains("headline response p99 (us), lower is better"), "{table}");
        let row = table.lines().find(|l| l.starts_with(&workload) && l.contains("cjfs")).unwrap();
        let cells: Vec<&str> = row.split_whitespace().collect();
        // offered, served per second, unserved, then the response in ms.
        assert_eq!(&cells[3..8], ["400", "395.0", "10", "2.00", "2.00"], "{row}");
    }

    #[test]
    fn long_target_labels_are_numbered_shown_without_their_shared_prefix_and_keyed() {
        let base = "lib:dev=simssd,ssd=970pro,journal_mib=512";
        let targets = [
            base.to_string(),
            format!("{base},preset=cjfs,commit_record=barrier"),
            format!("{base},preset=cjfs,commit_record=barrier,committing_max=5"),
        ];
        let runs: Vec<RunResult> = targets
            .iter()
            .map(|t| {
                let mut r = RunResult {
                    workload: "varmail-shared".into(),
                    target: t.clone(),
                    threads: 1,
                    seconds: 1.0,
                    ops: 100,
                    ..Default::default()
                };
                r.set_rates();
                r
            })
            .collect();
        let report = Report { summaries: summarize(&runs, None), runs, ..Default::default() };
        let labels = TargetLabels::new(&report);
        let texts: Vec<String> = targets.iter().map(|t| labels.get(t)).collect();
        assert_eq!(texts[0], "#1 ~d=970pro,journal_mib=512");
        assert_eq!(texts[1], "#2 preset=cjfs,commit_recor~");
        assert!(texts.iter().all(|t| t.chars().count() <= TARGET_WIDTH), "{texts:?}");
        let table = format_table(&report);
        for (k, t) in targets.iter().enumerate() {
            assert!(table.contains(&format!("  #{} {t}\n", k + 1)), "key for {t}:\n{table}");
        }
        // Short labels stay as they are, with no key.
        assert_eq!(shared_label_prefix(&["lib".into(), "kernel-ext4".into()]), 0);
    }
}
