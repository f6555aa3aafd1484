//! What the kernel's fast commit did with the fsyncs of a `kernel-ext4:fast_commit` run, from
//! its own tracepoints in a tracefs instance of this run's: `ext4:ext4_fc_commit_stop` (one
//! per `ext4_fc_commit`, that is per fsync of a regular file, with its status) and
//! `jbd2:jbd2_end_commit` (full commits), both for the run's loop device.
//!
//! An `ext4_fc_commit` ends one of four ways (`EXT4_FC_STATUS_*`): it wrote a fast commit
//! (OK), fell back to a full commit (INELIGIBLE, FAILED), or returned at once (SKIPPED). A
//! SKIPPED fsync either found its transaction already committed (safe: its tid is at or
//! before the last full commit the trace saw) or found another fast commit being written and
//! returned once that one ended, without asking whether it carried the file. The second kind is
//! what README's "The kernel's fast commit acknowledges fsyncs it has not made durable" is
//! about: `scripts/kernel-fc-skip.py` shows such an fsync lost after a crash. Not every one is
//! (the other fast commit may have carried the file), and the trace cannot tell those apart,
//! so the table gives the count as an upper bound.

use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The kernel's fast-commit outcomes in one run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelFcFigures {
    /// fsyncs that wrote a fast commit.
    pub written: u64,
    /// fsyncs that fell back to a full commit (ineligible or failed).
    pub full_commits: u64,
    /// SKIPPED fsyncs whose transaction a full commit had made durable already.
    pub skipped_committed: u64,
    /// SKIPPED fsyncs that returned after another fast commit ended, their transaction not
    /// committed.
    pub skipped_after_other: u64,
}

/// Counters the reader thread keeps: by status, and the SKIPPED split.
#[derive(Default)]
struct Counts {
    written: AtomicU64,
    full_commits: AtomicU64,
    skipped_committed: AtomicU64,
    skipped_after_other: AtomicU64,
    last_committed: AtomicU64,
}

/// The tracing of one run (see the module docs). Dropping it removes the instance.
pub struct KernelFcTrace {
    instance: PathBuf,
    counts: Arc<Counts>,
    stop: Arc<AtomicBool>,
    reader: Option<JoinHandle<()>>,
}

const TRACEFS: &str = "/sys/kernel/tracing";

fn write(path: &Path, value: &str) -> Result<(), String> {
    std::fs::write(path, value).map_err(|e| format!("{}: {e}", path.display()))
}

/// The number after ` key ` in a trace line (`reason 2`, `transaction 17`, `tid 5`): the
/// last such, after the task name and the event's name.
fn field(line: &str, key: &str) -> Option<u64> {
    let key = format!(" {key} ");
    let at = line.rfind(&key)? + key.len();
    let digits: String = line[at..].trim_start().chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// A trace line's `dev M,N`.
fn device_of(line: &str) -> Option<(u32, u32)> {
    let at = line.find("dev ")? + 4;
    let rest = &line[at..];
    let (major, rest) = rest.split_once(',')?;
    let minor: String = rest.chars().take_while(char::is_ascii_digit).collect();
    Some((major.trim().parse().ok()?, minor.parse().ok()?))
}

impl Counts {
    fn take(&self, line: &str, dev: (u32, u32)) {
        if device_of(line) != Some(dev) {
            return;
        }
        if line.contains("jbd2_end_commit:") {
            if let Some(tid) = field(line, "transaction") {
                self.last_committed.fetch_max(tid, Ordering::Relaxed);
            }
            return;
        }
        if !line.contains("ext4_fc_commit_stop:") {
            return;
        }
        let counter = match field(line, "reason") {
            Some(0) => &self.written,
            Some(1 | 3) => &self.full_commits,
            Some(2) => {
                let tid = field(line, "tid").unwrap_or(u64::MAX);
                if tid <= self.last_committed.load(Ordering::Relaxed) {
                    &self.skipped_committed
                } else {
                    &self.skipped_after_other
                }
            }
            _ => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn reset(&self) {
        for c in
            [&self.written, &self.full_commits, &self.skipped_committed, &self.skipped_after_other]
        {
            c.store(0, Ordering::Relaxed);
        }
    }
}

impl KernelFcTrace {
    /// Starts tracing the file system mounted at `mountpoint` (root and tracefs needed; the
    /// error says what is missing).
    pub fn start(mountpoint: &Path, id: &str) -> Result<KernelFcTrace, String> {
        let meta = std::fs::metadata(mountpoint).map_err(|e| format!("{e}"))?;
        let dev = (libc::major(meta.dev()), libc::minor(meta.dev()));
        if !Path::new(TRACEFS).join("events/ext4/ext4_fc_commit_stop").exists() {
            return Err(format!("{TRACEFS} has no ext4_fc_commit_stop tracepoint"));
        }
        let instance = Path::new(TRACEFS).join(format!("instances/quill-bench-{id}"));
        std::fs::create_dir(&instance).map_err(|e| format!("{}: {e}", instance.display()))?;
        let mut trace = KernelFcTrace {
            instance: instance.clone(),
            counts: Arc::new(Counts::default()),
            stop: Arc::new(AtomicBool::new(false)),
            reader: None,
        };
        // Room for a burst while the reader sleeps (events are about 100 bytes of text).
        write(&instance.join("buffer_size_kb"), "8192")?;
        write(&instance.join("events/ext4/ext4_fc_commit_stop/enable"), "1")?;
        write(&instance.join("events/jbd2/jbd2_end_commit/enable"), "1")?;
        let mut pipe = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(instance.join("trace_pipe"))
            .map_err(|e| format!("trace_pipe: {e}"))?;
        let (counts, stop) = (trace.counts.clone(), trace.stop.clone());
        let reader = std::thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 16];
            let mut partial = String::new();
            loop {
                match pipe.read(&mut buf) {
                    Ok(n) if n > 0 => {
                        partial.push_str(&String::from_utf8_lossy(&buf[..n]));
                        while let Some(end) = partial.find('\n') {
                            counts.take(&partial[..end], dev);
                            partial.drain(..=end);
                        }
                    }
                    _ => {
                        if stop.load(Ordering::Acquire) {
                            return;
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
            }
        });
        trace.reader = Some(reader);
        Ok(trace)
    }

    /// A closure that restarts the counting, for the workload's start hook.
    pub fn restarter(&self) -> impl Fn() + Send + Sync + 'static {
        let counts = self.counts.clone();
        move || counts.reset()
    }

    /// Stops tracing (after the run, before the unmount) and returns the counts.
    pub fn finish(mut self) -> KernelFcFigures {
        let _ = write(&self.instance.join("events/ext4/ext4_fc_commit_stop/enable"), "0");
        let _ = write(&self.instance.join("events/jbd2/jbd2_end_commit/enable"), "0");
        // What is in the buffer is read before the reader stops.
        std::thread::sleep(Duration::from_millis(100));
        self.stop.store(true, Ordering::Release);
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        let c = &self.counts;
        KernelFcFigures {
            written: c.written.load(Ordering::Relaxed),
            full_commits: c.full_commits.load(Ordering::Relaxed),
            skipped_committed: c.skipped_committed.load(Ordering::Relaxed),
            skipped_after_other: c.skipped_after_other.load(Ordering::Relaxed),
        }
    }
}

impl Drop for KernelFcTrace {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        let _ = std::fs::remove_dir(&self.instance);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_lines_are_counted_for_their_device_only() {
        let c = Counts::default();
        let dev = (7, 3);
        let stop = |reason: u32, tid: u32| {
            format!(
                "  t-1 [000] ..... 1.0: ext4_fc_commit_stop: dev 7,3 nblks 1, reason {reason}, \
                 fc = 1, ineligible = 0, agg_nblks 1, tid {tid}"
            )
        };
        c.take(&stop(0, 5), dev);
        c.take(&stop(2, 5), dev);
        c.take("  t-2 [001] ..... 1.1: jbd2_end_commit: dev 7,3 transaction 5 sync 0 head 2", dev);
        c.take(&stop(2, 5), dev);
        c.take(&stop(3, 6), dev);
        c.take(&stop(0, 6).replace("dev 7,3", "dev 7,4"), dev);
        assert_eq!(c.written.load(Ordering::Relaxed), 1);
        assert_eq!(c.skipped_after_other.load(Ordering::Relaxed), 1);
        assert_eq!(c.skipped_committed.load(Ordering::Relaxed), 1);
        assert_eq!(c.full_commits.load(Ordering::Relaxed), 1);
    }
}
