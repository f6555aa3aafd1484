//! fsync-under-load, iJournaling's experiment: one thread appends 80 KiB to a file and
//! fsyncs, in a loop, while background writers stream 1 MiB appends at a set total rate
//! (MB/s) with no fsync at all. With one shared running transaction (JBD2), the foreground
//! fsync has to commit — and under data=ordered write out — the background's dirty data too,
//! so its latency tail grows with the load; file-level fsync transactions keep it flat.
//!
//! The thread count is the number of background writers (each gets rate / count); `quill
//! bench` runs it with one. Operations are foreground fsyncs; the headline is their p99
//! latency.

use std::io;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::{pattern, run_threads, Measured, Size, Step, WorkloadParams};
use crate::fsapi::{FsApi, OpenFile};

const FOREGROUND_BYTES: usize = 80 * 1024;
/// The foreground starts a new file after this many fsyncs (the old one is deleted).
const FOREGROUND_ROTATE: u64 = 100;
const BACKGROUND_CHUNK: usize = 1 << 20;

fn background_file_max(size: Size) -> u64 {
    match size {
        Size::Default => 256 << 20,
        Size::Smallest => 4 << 20,
    }
}

struct Writer {
    file: Box<dyn OpenFile>,
    path: String,
    size: u64,
    generation: u64,
    started: Option<Instant>,
    bytes: u64,
}

fn rotate(api: &dyn FsApi, w: &mut Writer, prefix: &str) -> io::Result<()> {
    w.generation += 1;
    let path = format!("{prefix}.{}", w.generation);
    let file = api.create(&path)?;
    let old = std::mem::replace(&mut w.file, file);
    drop(old);
    api.unlink(&w.path)?;
    w.path = path;
    w.size = 0;
    Ok(())
}

pub fn run(api: &dyn FsApi, params: &WorkloadParams) -> io::Result<Measured> {
    if !(params.background_mb_per_sec.is_finite() && params.background_mb_per_sec >= 0.0) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "background rate must be ≥ 0"));
    }
    api.mkdir("fsyncload")?;
    let writers: Vec<Mutex<Writer>> = (0..=params.threads)
        .map(|t| {
            let path = format!("fsyncload/w{t}.0");
            let file = api.create(&path)?;
            Ok(Mutex::new(Writer { file, path, size: 0, generation: 0, started: None, bytes: 0 }))
        })
        .collect::<io::Result<_>>()?;
    api.sync()?;
    let foreground = pattern(FOREGROUND_BYTES, params.seed);
    let background = pattern(BACKGROUND_CHUNK, params.seed + 3);
    let per_writer = params.background_mb_per_sec * 1e6 / params.threads as f64;
    let file_max = background_file_max(params.size);
    let measured = run_threads(params, params.threads + 1, |thread, iteration, c| {
        let w = &mut *writers[thread].lock();
        let prefix = format!("fsyncload/w{thread}");
        if thread == 0 {
            if iteration > 0 && iteration % FOREGROUND_ROTATE == 0 {
                rotate(api, w, &prefix)?;
            }
            c.write(&mut *w.file, w.size, &foreground)?;
            w.size += FOREGROUND_BYTES as u64;
            c.timed_sync(&mut *w.file, false)?;
            c.ops += 1;
            return Ok(Step::More);
        }
        if per_writer == 0.0 {
            return Ok(Step::Done);
        }
        if w.size >= file_max {
            rotate(api, w, &prefix)?;
        }
        c.write(&mut *w.file, w.size, &background)?;
        w.size += BACKGROUND_CHUNK as u64;
        w.bytes += BACKGROUND_CHUNK as u64;
        // Pace to the rate: sleep until this writer's bytes are due.
        let started = *w.started.get_or_insert_with(Instant::now);
        let due = Duration::from_secs_f64(w.bytes as f64 / per_writer);
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            std::thread::sleep(wait.min(params.duration));
        }
        Ok(Step::More)
    })?;
    let mut measured = measured;
    let seconds = measured.seconds.max(1e-9);
    let background_bytes =
        measured.counters.bytes_written - measured.counters.ops * FOREGROUND_BYTES as u64;
    measured.note = format!(
        "background {:.1} MB/s achieved of {:.1} asked",
        background_bytes as f64 / seconds / 1e6,
        params.background_mb_per_sec
    );
    Ok(measured)
}
