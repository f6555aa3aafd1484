//! dbench: the real `dbench` program (Debian's package) with its NetBench load file
//! (`/usr/share/dbench/client.txt`) and `--sync-dir` (fsync the parent directory after
//! unlink, rmdir, mkdir and rename), as CJFS runs it, on a mounted target. The load file's
//! `Flush` operations are fsyncs. Operations are the sum of dbench's per-operation counts
//! (what CJFS's script adds up); dbench's own MB/s is kept too.

use std::io;
use std::path::Path;
use std::process::Command;

use super::{Measured, WorkloadParams};

pub const LOADFILE: &str = "/usr/share/dbench/client.txt";

/// Whether dbench can run here; the reason if not.
pub fn available() -> Result<(), String> {
    if Command::new("dbench").arg("--help").output().is_err() {
        return Err("dbench is not installed (Debian package dbench)".into());
    }
    if !Path::new(LOADFILE).exists() {
        return Err(format!("{LOADFILE} is missing (Debian package dbench)"));
    }
    Ok(())
}

pub fn run(dir: &Path, params: &WorkloadParams) -> io::Result<Measured> {
    available().map_err(|e| io::Error::new(io::ErrorKind::NotFound, e))?;
    let workdir = dir.join("dbench");
    std::fs::create_dir(&workdir)?;
    let seconds = params.duration.as_secs().max(1);
    let output = Command::new("dbench")
        .arg(params.threads.to_string())
        .args(["-t", &seconds.to_string(), "--sync-dir", "-c", LOADFILE, "-D"])
        .arg(&workdir)
        .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stdout.lines().chain(stderr.lines()).rev().take(3).collect();
        return Err(io::Error::other(format!(
            "dbench failed ({}): {}",
            output.status,
            tail.join(" | ")
        )));
    }
    let parsed = parse_output(&stdout)
        .ok_or_else(|| io::Error::other("dbench's output has no operation table or throughput"))?;
    let mut measured = Measured { seconds: seconds as f64, ..Default::default() };
    measured.counters.ops = parsed.ops;
    measured.mb_per_sec = Some(parsed.mb_per_sec);
    measured.note = format!(
        "dbench {:.1} MB/s; Flush avg {:.3} ms max {:.3} ms",
        parsed.mb_per_sec, parsed.flush_avg_ms, parsed.flush_max_ms
    );
    Ok(measured)
}

#[derive(Debug, PartialEq)]
pub struct DbenchOutput {
    pub ops: u64,
    pub mb_per_sec: f64,
    pub flush_avg_ms: f64,
    pub flush_max_ms: f64,
}

/// Reads dbench 4's final operation table and throughput line.
pub fn parse_output(text: &str) -> Option<DbenchOutput> {
    let mut lines = text.lines().skip_while(|l| !l.trim_start().starts_with("Operation"));
    lines.next()?;
    let mut out = DbenchOutput { ops: 0, mb_per_sec: 0.0, flush_avg_ms: 0.0, flush_max_ms: 0.0 };
    let mut rows = 0;
    let mut throughput = None;
    for line in lines {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            ["Throughput", mb, ..] => throughput = mb.parse::<f64>().ok(),
            [name, count, avg, max] => {
                if let (Ok(count), Ok(avg), Ok(max)) =
                    (count.parse::<u64>(), avg.parse::<f64>(), max.parse::<f64>())
                {
                    out.ops += count;
                    rows += 1;
                    if *name == "Flush" {
                        (out.flush_avg_ms, out.flush_max_ms) = (avg, max);
                    }
                }
            }
            _ => {}
        }
    }
    out.mb_per_sec = throughput?;
    (rows > 0).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_dbench_4_output() {
        let text = "   2      8144   121.30 MB/sec  execute   1 sec  latency 286.920 ms\n\
            \n Operation      Count    AvgLat    MaxLat\n ----------------------------------------\n \
            NTCreateX       9130     0.020     1.125\n Close           6781     0.001     0.490\n \
            Flush            655     0.916   232.816\n\n\
            Throughput 121.303 MB/sec (sync dirs)  2 clients  2 procs  max_latency=286.920 ms\n";
        let parsed = parse_output(text).unwrap();
        assert_eq!(parsed.ops, 9130 + 6781 + 655);
        assert_eq!(parsed.mb_per_sec, 121.303);
        assert_eq!((parsed.flush_avg_ms, parsed.flush_max_ms), (0.916, 232.816));
        assert!(parse_output("dbench version 4.00\nno table").is_none());
    }
}
