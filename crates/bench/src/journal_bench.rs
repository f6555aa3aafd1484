//! The journal benchmark: N threads, each running handles that modify shared metadata blocks
//! (a block bitmap, a directory block, an inode-table block shared by 16 threads, as ext4's
//! inode table holds 16 inodes per 4 KiB block) and private blocks, then waiting for their
//! transaction to be durable (an fsync). This is the contention pattern of varmail's
//! create/append/fsync on one file system, reduced to the journal.
//!
//! Reports transactions/s, fsyncs/s, fsync latency percentiles, handles and flushes per
//! transaction, conflicts, and the engine's time breakdown, as a table or JSON.

use blockdev::file::{FileDevice, FileOptions, IoMode};
use blockdev::memory::MemDevice;
use blockdev::simssd::{SimSsd, SimSsdConfig};
use blockdev::BlockDevice;
use journal::{superblock, Journal, JournalConfig, JournalLocation, JournalStats};
use std::path::PathBuf;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use crate::percentile::percentile;

/// Where the journal lives during the benchmark.
#[derive(Debug, Clone)]
pub enum BenchDevice {
    /// A sparse image file (deleted afterwards), optionally opened with O_DIRECT.
    File { path: PathBuf, direct: bool },
    /// The deterministic simulated SSD.
    SimSsd(SimSsdConfig),
    /// RAM: measures the engine alone.
    Memory,
}

impl BenchDevice {
    pub fn name(&self) -> &'static str {
        match self {
            BenchDevice::File { direct: false, .. } => "file",
            BenchDevice::File { direct: true, .. } => "file-direct",
            BenchDevice::SimSsd(_) => "simssd",
            BenchDevice::Memory => "memory",
        }
    }
}

#[derive(Debug, Clone)]
pub struct JournalBenchParams {
    pub device: BenchDevice,
    pub preset: String,
    pub config: JournalConfig,
    pub threads: usize,
    /// Run for this long...
    pub duration: Duration,
    /// ...or, if set, exactly this many fsyncs per thread (repeatable sizes for tests).
    pub fsyncs_per_thread: Option<u64>,
    pub block_size: u32,
    pub journal_blocks: u32,
    /// Private blocks each handle dirties besides the shared ones.
    pub private_blocks_per_handle: u32,
}

impl JournalBenchParams {
    pub fn new(device: BenchDevice, preset: &str, threads: usize) -> Option<Self> {
        Some(JournalBenchParams {
            device,
            preset: preset.to_string(),
            config: JournalConfig::preset(preset)?,
            threads,
            duration: Duration::from_secs(3),
            fsyncs_per_thread: None,
            block_size: 4096,
            journal_blocks: 16384,
            private_blocks_per_handle: 2,
        })
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct JournalBenchResult {
    pub device: String,
    pub preset: String,
    pub config: JournalConfig,
    pub threads: usize,
    pub seconds: f64,
    pub fsyncs: u64,
    pub fsyncs_per_sec: f64,
    pub transactions: u64,
    pub transactions_per_sec: f64,
    pub latency_us_p50: u64,
    pub latency_us_p99: u64,
    pub latency_us_p999: u64,
    pub handles_per_transaction: f64,
    pub flushes_per_transaction: f64,
    pub conflicts: u64,
    pub engine: JournalStats,
    /// Device flushes and writes per fsync, as the device saw them.
    pub device_flushes: Option<u64>,
    pub device_writes: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Journal(#[from] journal::JournalError),
    #[error(transparent)]
    Device(#[from] blockdev::DeviceError),
    #[error("benchmark setup: {0}")]
    Setup(String),
}

/// Blocks before the journal: shared blocks, then 64 private blocks per thread.
const SHARED_BITMAP: u64 = 1;
const SHARED_DIRECTORY: u64 = 2;
const SHARED_INODE_TABLE: u64 = 3;
const INODES_PER_TABLE_BLOCK: usize = 16;
const PRIVATE_FIRST: u64 = 1024;
const PRIVATE_PER_THREAD: u64 = 64;
const THREADS_MAX: usize = 1024;

fn fs_blocks(threads: usize) -> u64 {
    PRIVATE_FIRST + threads as u64 * PRIVATE_PER_THREAD
}

/// The blocks handle number `op` of `thread` dirties.
fn blocks_for(thread: usize, op: u64, private_per_handle: u32) -> Vec<u64> {
    let mut blocks = vec![
        SHARED_BITMAP,
        SHARED_DIRECTORY,
        SHARED_INODE_TABLE + (thread / INODES_PER_TABLE_BLOCK) as u64 % 64,
    ];
    for i in 0..private_per_handle as u64 {
        let slot = (op * private_per_handle as u64 + i) % PRIVATE_PER_THREAD;
        blocks.push(PRIVATE_FIRST + thread as u64 * PRIVATE_PER_THREAD + slot);
    }
    blocks
}

struct Setup {
    device: Arc<dyn BlockDevice>,
    simssd: Option<Arc<SimSsd>>,
    location: JournalLocation,
    cleanup: Option<PathBuf>,
}

fn setup(params: &JournalBenchParams) -> Result<Setup, BenchError> {
    let journal_start = fs_blocks(params.threads).next_multiple_of(1024);
    let size = (journal_start + params.journal_blocks as u64) * params.block_size as u64;
    let location =
        JournalLocation::contiguous(params.block_size, journal_start, params.journal_blocks)
            .map_err(|e| BenchError::Setup(e.to_string()))?;
    let (device, simssd, cleanup): (Arc<dyn BlockDevice>, _, _) = match &params.device {
        BenchDevice::File { path, direct } => {
            let io = if *direct { IoMode::Direct } else { IoMode::Buffered };
            let dev =
                FileDevice::create_with(path, size, FileOptions { io, ..Default::default() })?;
            (Arc::new(dev), None, Some(path.clone()))
        }
        BenchDevice::SimSsd(config) => {
            let ssd = Arc::new(SimSsd::new(size, *config));
            (ssd.clone(), Some(ssd), None)
        }
        BenchDevice::Memory => (Arc::new(MemDevice::new(size)), None, None),
    };
    superblock::format(&*device, &location, Default::default())?;
    Ok(Setup { device, simssd, location, cleanup })
}

/// Runs one configuration and returns its figures.
pub fn run(params: &JournalBenchParams) -> Result<JournalBenchResult, BenchError> {
    if params.threads == 0 || params.threads > THREADS_MAX {
        return Err(BenchError::Setup(format!(
            "threads = {}, expected 1..={THREADS_MAX}",
            params.threads
        )));
    }
    let setup = setup(params)?;
    let journal =
        Journal::open(setup.device.clone(), setup.location.clone(), params.config.clone())?;
    if let Some(ssd) = &setup.simssd {
        ssd.reset_stats();
    }
    let barrier = Barrier::new(params.threads + 1);
    let credits = 3 + params.private_blocks_per_handle;
    let (latencies, elapsed) =
        std::thread::scope(|scope| -> Result<(Vec<u64>, Duration), BenchError> {
            let workers: Vec<_> = (0..params.threads)
                .map(|thread| {
                    let (journal, barrier) = (&journal, &barrier);
                    scope.spawn(move || -> Result<Vec<u64>, BenchError> {
                        let mut latencies = Vec::new();
                        barrier.wait();
                        let started = Instant::now();
                        for op in 0u64.. {
                            let done = match params.fsyncs_per_thread {
                                Some(n) => op >= n,
                                None => started.elapsed() >= params.duration,
                            };
                            if done {
                                break;
                            }
                            let began = Instant::now();
                            let mut handle = journal.start(credits)?;
                            for block in blocks_for(thread, op, params.private_blocks_per_handle) {
                                let buffer = journal.read_buffer(block)?;
                                handle.modify(&buffer, |bytes| {
                                    let at = (thread * 8) % (bytes.len() - 8);
                                    bytes[at..at + 8].copy_from_slice(&op.to_le_bytes());
                                })?;
                            }
                            let tid = handle.stop()?;
                            journal.commit_and_wait(tid)?;
                            latencies.push(began.elapsed().as_micros() as u64);
                        }
                        Ok(latencies)
                    })
                })
                .collect();
            barrier.wait();
            let started = Instant::now();
            let mut all = Vec::new();
            for w in workers {
                all.extend(w.join().map_err(|_| BenchError::Setup("a worker panicked".into()))??);
            }
            Ok((all, started.elapsed()))
        })?;
    let engine = journal.stats();
    let device_stats = setup.simssd.as_ref().map(|s| s.stats());
    journal.shutdown()?;
    if let Some(path) = &setup.cleanup {
        // The image is scratch space; failing to delete it loses nothing.
        let _ = std::fs::remove_file(path);
    }
    let mut sorted = latencies;
    sorted.sort_unstable();
    let seconds = elapsed.as_secs_f64().max(1e-9);
    let fsyncs = sorted.len() as u64;
    Ok(JournalBenchResult {
        device: params.device.name().to_string(),
        preset: params.preset.clone(),
        config: params.config.clone(),
        threads: params.threads,
        seconds,
        fsyncs,
        fsyncs_per_sec: fsyncs as f64 / seconds,
        transactions: engine.transactions,
        transactions_per_sec: engine.transactions as f64 / seconds,
        latency_us_p50: percentile(&sorted, 50.0),
        latency_us_p99: percentile(&sorted, 99.0),
        latency_us_p999: percentile(&sorted, 99.9),
        handles_per_transaction: engine.handles_per_transaction(),
        flushes_per_transaction: engine.flushes_per_transaction(),
        conflicts: engine.conflicts,
        engine,
        device_flushes: device_stats.map(|s| s.flushes),
        device_writes: device_stats.map(|s| s.writes),
    })
}

/// One line per result, aligned, for terminals and issue notes.
pub fn format_table(results: &[JournalBenchResult]) -> String {
    let mut out = format!(
        "{:<8} {:<8} {:>4} {:>9} {:>9} {:>8} {:>8} {:>9} {:>8} {:>8} {:>9} {:>8} {:>8} {:>8}\n",
        "device",
        "preset",
        "thr",
        "fsync/s",
        "txn/s",
        "p50us",
        "p99us",
        "p99.9us",
        "hdl/txn",
        "fl/txn",
        "conflicts",
        "lockms",
        "writems",
        "flushms"
    );
    for r in results {
        out += &format!(
            "{:<8} {:<8} {:>4} {:>9.0} {:>9.0} {:>8} {:>8} {:>9} {:>8.2} {:>8.2} {:>9} {:>8.0} {:>8.0} {:>8.0}\n",
            r.device,
            r.preset,
            r.threads,
            r.fsyncs_per_sec,
            r.transactions_per_sec,
            r.latency_us_p50,
            r.latency_us_p99,
            r.latency_us_p999,
            r.handles_per_transaction,
            r.flushes_per_transaction,
            r.conflicts,
            r.engine.ms_locked,
            r.engine.ms_writing,
            r.engine.ms_flushing,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smallest_journal_bench_runs_every_preset_on_memory_and_simssd() {
        for device in [BenchDevice::Memory, BenchDevice::SimSsd(SimSsdConfig::default())] {
            for preset in journal::config::PRESETS {
                let mut params = JournalBenchParams::new(device.clone(), preset, 4).unwrap();
                params.fsyncs_per_thread = Some(20);
                params.journal_blocks = 1024;
                let result = run(&params).unwrap();
                assert_eq!(result.fsyncs, 80);
                assert!(result.transactions >= 1 && result.transactions <= 80, "{result:?}");
                assert!(result.latency_us_p50 <= result.latency_us_p99);
                assert!(result.latency_us_p99 <= result.latency_us_p999);
                let json = serde_json::to_value(&result).unwrap();
                assert_eq!(json["preset"], *preset);
                assert!(format_table(&[result]).lines().count() == 2);
            }
        }
    }

    #[test]
    fn handles_touch_shared_and_private_blocks_only_inside_the_file_system_area() {
        for thread in [0, 15, 16, 255] {
            for op in [0, 1, 63, 64, 1000] {
                let blocks = blocks_for(thread, op, 2);
                assert_eq!(blocks.len(), 5);
                assert!(blocks.iter().all(|&b| b < fs_blocks(256)));
            }
        }
        assert_eq!(
            blocks_for(0, 0, 2)[2],
            blocks_for(15, 0, 2)[2],
            "16 threads share an inode-table block"
        );
        assert_ne!(blocks_for(0, 0, 2)[2], blocks_for(16, 0, 2)[2]);
    }
}
