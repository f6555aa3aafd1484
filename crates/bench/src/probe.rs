//! The device probe: the limits of the disk holding the benchmark's images, measured in the
//! same run, so a file system's figures can be read against what the hardware allows.
//!
//! Three measurements share the time budget equally, all on one scratch file
//! `quill-probe.<pid>.tmp` in the probed directory. The file is first written full of zeros and
//! fsynced (not left sparse, not fallocated), so every measurement overwrites allocated blocks
//! and no write pays for block allocation or an unwritten-extent conversion. The file is
//! removed at the end, also when a step fails.
//!
//! 1. **write + fdatasync**: a buffered 4 KiB `pwrite` at a random 4 KiB-aligned offset, then
//!    `fdatasync`; the latency of the pair. One thread can fsync at most `1e6 / p50` times a
//!    second on this disk, whatever the file system does.
//! 2. **FUA write**: a 4 KiB `O_DIRECT | O_DSYNC` `pwrite` at a random aligned offset (a write
//!    with Force Unit Access where the device honours it, otherwise a write and a flush).
//! 3. **random-write IOPS**: several threads, each with its own `O_DIRECT` descriptor, writing
//!    4 KiB at random aligned offsets without any sync.
//!
//! Where `O_DIRECT` is refused (tmpfs on old kernels, some FUSE file systems), measurements 2
//! and 3 fall back to buffered I/O and [`ProbeResult::direct_io`] is false: measurement 2 is
//! then a buffered `O_DSYNC` write, and measurement 3 measures the page cache, not the disk.

use blockdev::aligned::AlignedBuf;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use crate::percentile::percentile;
use crate::results::ProbeResult;

/// The I/O size and alignment of every measured write.
const BLOCK: usize = 4096;
/// Fewest and most latency samples a latency measurement takes, whatever the budget.
const MIN_SAMPLES: usize = 20;
const MAX_SAMPLES: usize = 100_000;
const MIB: u64 = 1 << 20;
const MAX_THREADS: usize = 256;

/// What to probe and for how long.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeParams {
    /// The directory whose disk is probed (where the benchmark's images live).
    pub dir: PathBuf,
    /// Total time budget in seconds, split equally across the three measurements (the
    /// preallocation of the scratch file comes on top).
    pub seconds: f64,
    /// Threads of the random-write IOPS measurement (1..=256).
    pub random_write_threads: usize,
    /// Size of the scratch file: at least 1 MiB and a multiple of 4096.
    pub file_bytes: u64,
}

impl Default for ProbeParams {
    fn default() -> Self {
        ProbeParams {
            dir: PathBuf::from("."),
            seconds: 6.0,
            random_write_threads: 4,
            file_bytes: 64 * MIB,
        }
    }
}

/// Why the probe could not measure.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("device probe: invalid parameters: {0}")]
    InvalidParams(String),
    #[error("device probe: cannot use directory {}: {source}", dir.display())]
    Dir { dir: PathBuf, source: io::Error },
    #[error("device probe: {} is not a directory", dir.display())]
    NotADirectory { dir: PathBuf },
    #[error("device probe: {step} (scratch file {}): {source}", file.display())]
    Io { step: &'static str, file: PathBuf, source: io::Error },
    #[error("device probe: {step} (scratch file {}): a writer thread panicked", file.display())]
    WorkerPanicked { step: &'static str, file: PathBuf },
}

/// Measures the disk holding `params.dir` (see the module documentation).
pub fn probe(params: &ProbeParams) -> Result<ProbeResult, ProbeError> {
    probe_with(params, true)
}

/// [`probe`], with `O_DIRECT` optionally not even tried (so tests can take the fallback path on
/// kernels whose tmpfs accepts `O_DIRECT`).
fn probe_with(params: &ProbeParams, try_direct: bool) -> Result<ProbeResult, ProbeError> {
    let phase = validate(params)?;
    let dir = match params.dir.canonicalize() {
        Ok(dir) => dir,
        Err(source) => return Err(ProbeError::Dir { dir: params.dir.clone(), source }),
    };
    match dir.metadata() {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(ProbeError::NotADirectory { dir }),
        Err(source) => return Err(ProbeError::Dir { dir, source }),
    }
    let started = Instant::now();
    let path = dir.join(format!("quill-probe.{}.tmp", std::process::id()));
    let io_err = |step: &'static str| {
        let file = path.clone();
        move |source| ProbeError::Io { step, file, source }
    };

    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(io_err("creating the scratch file"))?;
    let guard = ScratchFile { path: path.clone() };
    preallocate(&mut file, params.file_bytes).map_err(io_err("preallocating with zeros"))?;
    file.sync_all().map_err(io_err("fsync after preallocating"))?;

    let blocks = params.file_bytes / BLOCK as u64;
    let mut result = ProbeResult {
        dir: dir.to_string_lossy().into_owned(),
        random_write_threads: params.random_write_threads,
        ..Default::default()
    };

    // 1. Buffered write + fdatasync.
    let mut rng = XorShift::new(0x9e37_79b9_7f4a_7c15);
    let mut buf = vec![0u8; BLOCK];
    rng.fill(&mut buf);
    let mut samples = sample_latencies(phase, |i| {
        buf[..8].copy_from_slice(&(i as u64).to_le_bytes());
        file.write_all_at(&buf, rng.block_offset(blocks))?;
        file.sync_data()
    })
    .map_err(io_err("4 KiB pwrite + fdatasync"))?;
    let (p50, p99) = p50_p99(&mut samples);
    result.write_fdatasync_us_p50 = p50;
    result.write_fdatasync_us_p99 = p99;
    result.fdatasyncs_per_sec_limit = 1e6 / p50;
    drop(file);

    // 2. O_DIRECT | O_DSYNC writes (FUA where the device honours it).
    let mut rng = XorShift::new(0xd1b5_4a32_d192_ed03);
    let mut abuf = AlignedBuf::new(BLOCK);
    rng.fill(abuf.as_mut_slice());
    let (fua, fua_direct) = open_writer(&path, libc::O_DSYNC, try_direct, &abuf)
        .map_err(io_err("opening O_DIRECT|O_DSYNC"))?;
    let mut samples = sample_latencies(phase, |i| {
        abuf.as_mut_slice()[..8].copy_from_slice(&(i as u64).to_le_bytes());
        fua.write_all_at(abuf.as_slice(), rng.block_offset(blocks))
    })
    .map_err(io_err("4 KiB O_DIRECT|O_DSYNC pwrite"))?;
    let (p50, p99) = p50_p99(&mut samples);
    result.fua_write_us_p50 = p50;
    result.fua_write_us_p99 = p99;
    drop(fua);

    // 3. Random-write IOPS: one O_DIRECT descriptor per thread, no sync.
    let mut writers = Vec::with_capacity(params.random_write_threads);
    let mut all_direct = fua_direct;
    for _ in 0..params.random_write_threads {
        let (f, direct) = open_writer(&path, 0, try_direct, &abuf)
            .map_err(io_err("opening O_DIRECT for random writes"))?;
        all_direct &= direct;
        writers.push(f);
    }
    let (writes, elapsed) = random_writes(writers, blocks, phase).map_err(|e| match e {
        None => ProbeError::WorkerPanicked { step: "4 KiB random writes", file: path.clone() },
        Some(source) => ProbeError::Io { step: "4 KiB random writes", file: path.clone(), source },
    })?;
    result.random_write_iops = writes as f64 / elapsed.as_secs_f64().max(1e-9);
    result.direct_io = all_direct;

    guard.remove().map_err(io_err("removing the scratch file"))?;
    result.seconds = started.elapsed().as_secs_f64();
    Ok(result)
}

/// Checks `params` and returns the budget of one measurement.
fn validate(params: &ProbeParams) -> Result<Duration, ProbeError> {
    let invalid = |msg: String| Err(ProbeError::InvalidParams(msg));
    if !(params.seconds.is_finite() && params.seconds > 0.0) {
        return invalid(format!("seconds must be finite and positive, not {}", params.seconds));
    }
    let Ok(phase) = Duration::try_from_secs_f64(params.seconds / 3.0) else {
        return invalid(format!("seconds {} is too large", params.seconds));
    };
    if !(1..=MAX_THREADS).contains(&params.random_write_threads) {
        return invalid(format!(
            "random_write_threads must be 1..={MAX_THREADS}, not {}",
            params.random_write_threads
        ));
    }
    if params.file_bytes < MIB || !params.file_bytes.is_multiple_of(BLOCK as u64) {
        return invalid(format!(
            "file_bytes must be at least 1 MiB and a multiple of {BLOCK}, not {}",
            params.file_bytes
        ));
    }
    Ok(phase)
}

/// Writes `bytes` zeros through `file` from its start (real data blocks, not holes).
fn preallocate(file: &mut File, bytes: u64) -> io::Result<()> {
    let chunk = vec![0u8; MIB as usize];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(MIB) as usize;
        file.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    Ok(())
}

/// Runs `op` (given its sample index) until `budget` has passed, at least [`MIN_SAMPLES`] and at
/// most [`MAX_SAMPLES`] times, and returns each run's latency in microseconds, rounded up
/// (so never 0).
fn sample_latencies(
    budget: Duration,
    mut op: impl FnMut(usize) -> io::Result<()>,
) -> io::Result<Vec<u64>> {
    let mut samples = Vec::new();
    let start = Instant::now();
    while samples.len() < MAX_SAMPLES && (samples.len() < MIN_SAMPLES || start.elapsed() < budget) {
        let t = Instant::now();
        op(samples.len())?;
        samples.push(micros_ceil(t.elapsed()));
    }
    Ok(samples)
}

fn micros_ceil(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1000)).unwrap_or(u64::MAX).max(1)
}

/// Nearest-rank p50 and p99 of `samples` (sorted in place).
fn p50_p99(samples: &mut [u64]) -> (f64, f64) {
    samples.sort_unstable();
    (percentile(samples, 50.0) as f64, percentile(samples, 99.0) as f64)
}

/// Opens `path` for writing with `O_DIRECT | extra_flags`, and checks with one write of `probe`
/// (4 KiB-aligned) at offset 0 that the file system takes direct writes. If the open or that
/// write fails with `EINVAL` (no `O_DIRECT` support), or `try_direct` is false, opens it with
/// `extra_flags` alone. Returns the file and whether it is direct.
fn open_writer(
    path: &Path,
    extra_flags: libc::c_int,
    try_direct: bool,
    probe: &AlignedBuf,
) -> io::Result<(File, bool)> {
    let open = |flags| OpenOptions::new().write(true).custom_flags(flags).open(path);
    if try_direct {
        match open(libc::O_DIRECT | extra_flags) {
            Ok(f) => match f.write_all_at(probe.as_slice(), 0) {
                Ok(()) => return Ok((f, true)),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                Err(e) => return Err(e),
            },
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(e) => return Err(e),
        }
    }
    Ok((open(extra_flags)?, false))
}

/// Each of `writers` writes 4 KiB at random aligned offsets from its own thread and aligned
/// buffer until `budget` has passed (at least once). Returns the total writes and the time from
/// the common start until the last thread finished; `Err(None)` if a thread panicked.
fn random_writes(
    writers: Vec<File>,
    blocks: u64,
    budget: Duration,
) -> Result<(u64, Duration), Option<io::Error>> {
    let barrier = Barrier::new(writers.len() + 1);
    std::thread::scope(|s| {
        let handles: Vec<_> = writers
            .into_iter()
            .enumerate()
            .map(|(i, f)| {
                let barrier = &barrier;
                s.spawn(move || -> io::Result<u64> {
                    let mut rng = XorShift::new(0x2545_f491_4f6c_dd1d ^ ((i as u64 + 1) << 32));
                    let mut buf = AlignedBuf::new(BLOCK);
                    rng.fill(buf.as_mut_slice());
                    barrier.wait();
                    let deadline = Instant::now() + budget;
                    let mut writes = 0u64;
                    loop {
                        f.write_all_at(buf.as_slice(), rng.block_offset(blocks))?;
                        writes += 1;
                        if Instant::now() >= deadline {
                            return Ok(writes);
                        }
                    }
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        let mut total = 0u64;
        let mut failure = None;
        for h in handles {
            match h.join() {
                Ok(Ok(n)) => total += n,
                Ok(Err(e)) => failure = failure.or(Some(Some(e))),
                Err(_) => failure = Some(failure.flatten()),
            }
        }
        let elapsed = start.elapsed();
        match failure {
            Some(f) => Err(f),
            None => Ok((total, elapsed)),
        }
    })
}

/// Removes the scratch file when dropped, so it goes on every error path too.
struct ScratchFile {
    path: PathBuf,
}

impl ScratchFile {
    /// Removes the file now, reporting failure.
    fn remove(self) -> io::Result<()> {
        let r = std::fs::remove_file(&self.path);
        std::mem::forget(self);
        r
    }
}

impl Drop for ScratchFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// xorshift64: offsets and buffer contents, reproducible from the seed.
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> XorShift {
        XorShift(seed.max(1))
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A random 4 KiB-aligned offset of a file of `blocks` blocks.
    fn block_offset(&mut self, blocks: u64) -> u64 {
        (self.next() % blocks) * BLOCK as u64
    }

    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let bytes = self.next().to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
    }
}

/// The probe as a few lines for a terminal (no trailing newline), e.g.
///
/// ```text
/// device probe (/work/tmp), 6.4 s:
///   4 KiB write+fdatasync  p50 812 us, p99 1,500 us (1,232 fdatasyncs/s limit)
///   4 KiB FUA write        p50 640 us, p99 1,210 us (O_DIRECT|O_DSYNC)
///   random 4 KiB writes    18,200 IOPS (4 threads, O_DIRECT)
/// ```
pub fn format_probe(p: &ProbeResult) -> String {
    let (fua_mode, random_mode) = if p.direct_io {
        ("O_DIRECT|O_DSYNC", "O_DIRECT")
    } else {
        ("buffered O_DSYNC: no O_DIRECT", "buffered: page cache, not the disk")
    };
    let threads = if p.random_write_threads == 1 { "thread" } else { "threads" };
    format!(
        "device probe ({}), {:.1} s:\n\
         \x20 4 KiB write+fdatasync  p50 {} us, p99 {} us ({} fdatasyncs/s limit)\n\
         \x20 4 KiB FUA write        p50 {} us, p99 {} us ({fua_mode})\n\
         \x20 random 4 KiB writes    {} IOPS ({} {threads}, {random_mode})",
        p.dir,
        p.seconds,
        grouped(p.write_fdatasync_us_p50),
        grouped(p.write_fdatasync_us_p99),
        grouped(p.fdatasyncs_per_sec_limit),
        grouped(p.fua_write_us_p50),
        grouped(p.fua_write_us_p99),
        grouped(p.random_write_iops),
        p.random_write_threads,
    )
}

/// `x` rounded to a whole number with thousands separators (`18,200`).
fn grouped(x: f64) -> String {
    if !x.is_finite() {
        return format!("{x}");
    }
    let digits = format!("{:.0}", x.abs());
    let mut out = String::with_capacity(digits.len() + digits.len() / 3 + 1);
    if x < 0.0 && digits != "0" {
        out.push('-');
    }
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh, empty directory under `parent`, removed when dropped.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(parent: &Path, tag: &str) -> TempDir {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            let dir = parent.join(format!("quill-probe-test-{tag}-{}-{nanos}", std::process::id()));
            std::fs::create_dir(&dir).unwrap();
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn short(dir: &Path) -> ProbeParams {
        ProbeParams {
            dir: dir.to_path_buf(),
            seconds: 0.3,
            random_write_threads: 2,
            file_bytes: 4 * MIB,
        }
    }

    fn assert_sane(r: &ProbeResult, dir: &Path) {
        assert_eq!(Path::new(&r.dir), dir.canonicalize().unwrap());
        assert!(r.write_fdatasync_us_p50 > 0.0 && r.fua_write_us_p50 > 0.0, "{r:?}");
        assert!(r.write_fdatasync_us_p50 <= r.write_fdatasync_us_p99, "{r:?}");
        assert!(r.fua_write_us_p50 <= r.fua_write_us_p99, "{r:?}");
        assert!(r.fdatasyncs_per_sec_limit > 0.0 && r.fdatasyncs_per_sec_limit.is_finite());
        assert!((r.fdatasyncs_per_sec_limit - 1e6 / r.write_fdatasync_us_p50).abs() < 1e-6);
        assert!(r.random_write_iops > 0.0 && r.random_write_iops.is_finite(), "{r:?}");
        assert_eq!(r.random_write_threads, 2);
        // Not necessarily 0.3 s: on tmpfs a latency measurement can reach its sample cap first.
        assert!(r.seconds > 0.0 && r.seconds.is_finite(), "{r:?}");
        let left: Vec<_> = std::fs::read_dir(dir).unwrap().collect();
        assert!(left.is_empty(), "scratch file left behind: {left:?}");
        let text = format_probe(r);
        assert!((3..=4).contains(&text.lines().count()), "{text}");
        assert!(text.contains("IOPS") && text.contains(&r.dir), "{text}");
    }

    #[test]
    fn short_probe_of_a_temp_dir_is_sane_and_cleans_up() {
        let dir = TempDir::new(&std::env::temp_dir(), "tmp");
        let r = probe(&short(&dir.0)).unwrap();
        assert_sane(&r, &dir.0);
    }

    #[test]
    fn short_probe_of_dev_shm_is_sane() {
        let shm = Path::new("/dev/shm");
        if !shm.is_dir() {
            return;
        }
        let dir = TempDir::new(shm, "shm");
        let r = probe(&short(&dir.0)).unwrap();
        assert_sane(&r, &dir.0);
    }

    #[test]
    fn buffered_fallback_is_sane_and_reported() {
        let dir = TempDir::new(&std::env::temp_dir(), "buffered");
        let r = probe_with(&short(&dir.0), false).unwrap();
        assert_sane(&r, &dir.0);
        assert!(!r.direct_io);
        assert!(format_probe(&r).contains("page cache"));
    }

    #[test]
    fn invalid_params_are_errors() {
        let dir = TempDir::new(&std::env::temp_dir(), "invalid");
        let ok = short(&dir.0);
        let bad = [
            ProbeParams { seconds: 0.0, ..ok.clone() },
            ProbeParams { seconds: -1.0, ..ok.clone() },
            ProbeParams { seconds: f64::NAN, ..ok.clone() },
            ProbeParams { seconds: f64::INFINITY, ..ok.clone() },
            ProbeParams { seconds: 1e300, ..ok.clone() },
            ProbeParams { random_write_threads: 0, ..ok.clone() },
            ProbeParams { random_write_threads: 257, ..ok.clone() },
            ProbeParams { file_bytes: MIB - 4096, ..ok.clone() },
            ProbeParams { file_bytes: MIB + 512, ..ok.clone() },
        ];
        for p in &bad {
            let e = probe(p).unwrap_err();
            assert!(matches!(e, ProbeError::InvalidParams(_)), "{p:?}: {e}");
        }
        assert!(std::fs::read_dir(&dir.0).unwrap().next().is_none());
    }

    #[test]
    fn missing_dir_or_a_file_is_an_error() {
        let dir = TempDir::new(&std::env::temp_dir(), "missing");
        let missing = dir.0.join("nope");
        let e = probe(&short(&missing)).unwrap_err();
        assert!(matches!(e, ProbeError::Dir { .. }), "{e}");
        assert!(e.to_string().contains("nope"), "{e}");
        let file = dir.0.join("a-file");
        std::fs::write(&file, b"x").unwrap();
        let e = probe(&short(&file)).unwrap_err();
        assert!(matches!(e, ProbeError::NotADirectory { .. }), "{e}");
    }

    #[test]
    fn scratch_guard_removes_the_file() {
        let dir = TempDir::new(&std::env::temp_dir(), "guard");
        let path = dir.0.join("scratch");
        std::fs::write(&path, b"x").unwrap();
        drop(ScratchFile { path: path.clone() });
        assert!(!path.exists());
    }

    #[test]
    fn numbers_are_grouped_in_thousands() {
        assert_eq!(grouped(0.0), "0");
        assert_eq!(grouped(812.4), "812");
        assert_eq!(grouped(1231.5), "1,232");
        assert_eq!(grouped(18_200.0), "18,200");
        assert_eq!(grouped(1_234_567.0), "1,234,567");
        assert_eq!(grouped(-1500.0), "-1,500");
    }

    #[test]
    fn format_names_the_mode() {
        let r = ProbeResult {
            dir: "/work/tmp".into(),
            write_fdatasync_us_p50: 812.0,
            write_fdatasync_us_p99: 1500.0,
            fdatasyncs_per_sec_limit: 1e6 / 812.0,
            fua_write_us_p50: 640.0,
            fua_write_us_p99: 1210.0,
            random_write_iops: 18_200.0,
            random_write_threads: 4,
            direct_io: true,
            seconds: 6.4,
        };
        let text = format_probe(&r);
        assert_eq!(
            text,
            "device probe (/work/tmp), 6.4 s:\n  \
             4 KiB write+fdatasync  p50 812 us, p99 1,500 us (1,232 fdatasyncs/s limit)\n  \
             4 KiB FUA write        p50 640 us, p99 1,210 us (O_DIRECT|O_DSYNC)\n  \
             random 4 KiB writes    18,200 IOPS (4 threads, O_DIRECT)"
        );
    }
}
