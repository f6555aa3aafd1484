//! A simulated SSD: a memory-backed device with a deterministic latency model.
//!
//! Scaling experiments (many threads calling fsync) need a device with internal parallelism and a
//! known cost per op; a 2-core test machine's real disk is neither. [`SimSsd`] models:
//! - `channels` independent transfer units: at most that many reads and writes are in service at
//!   once, the rest queue on a semaphore (a `parking_lot` mutex and condvar);
//! - a transfer time per 4 KiB page (`read_us`, `write_us`) plus `fua_us` extra per FUA write;
//! - a flush that first waits until every write submitted before it has completed, then costs
//!   `flush_us` (without occupying a channel: the cost stands for the controller draining its
//!   cache, which new transfers may overlap).
//!
//! Latency is real waiting, so threads really block and the callers' concurrency shows in wall
//! time: waits of [`SPIN_BELOW_US`] and more sleep until just short of the deadline, shorter ones
//! (and the tail of long ones) spin with `yield_now`, because `thread::sleep` overshoots by tens
//! of microseconds. Wall time is therefore approximate; the *modelled* counters of
//! [`SimSsd::stats`] (ops, bytes, busy time per op kind) are exact and depend only on the ops
//! issued, so tests and reports compare those. `queue_depth_max` and `channels_busy_max` are
//! observed, not modelled, and depend on thread timing.
//!
//! Data moves into the memory image when the transfer's modelled time has elapsed, and is durable
//! from then on: the model charges for flushes and FUA but keeps no volatile cache (use the
//! recording device for crash states).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::memory::MemDevice;
use crate::{check_range, BlockDevice, DeviceError, Op, Write};

/// Waits shorter than this spin instead of sleeping.
pub const SPIN_BELOW_US: u64 = 100;

/// A long wait sleeps until this long before its deadline and spins the rest, absorbing the usual
/// oversleep of `thread::sleep`.
const SLEEP_SLACK_US: u64 = 60;

/// The unit of transfer time.
pub const PAGE_BYTES: usize = 4096;

/// Channel counts above this are not SSDs we model (and would make the semaphore meaningless).
pub const CHANNELS_MAX: usize = 1024;

/// The latency model. All times are microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimSsdConfig {
    /// Time to read one 4 KiB page.
    pub read_us: u64,
    /// Time to write one 4 KiB page into the device.
    pub write_us: u64,
    /// Transfers in service at once (the device's internal parallelism).
    pub channels: usize,
    /// Cost of a flush once the writes before it have drained.
    pub flush_us: u64,
    /// Extra cost of a FUA write over a plain one.
    pub fua_us: u64,
}

impl Default for SimSsdConfig {
    /// A fast NVMe-class drive with power-loss-protected cache behaviour as seen by software:
    /// - `read_us: 20`: 4 KiB random reads on current NVMe drives take 10–100 us at queue depth 1;
    /// - `write_us: 15`: writes land in the controller's DRAM/SLC cache, slightly faster than reads;
    /// - `channels: 8`: enough internal parallelism that a single submitter cannot saturate the
    ///   drive, which is exactly what a scalable journal must exploit;
    /// - `flush_us: 200`: a cache flush costs an order of magnitude more than a write, so
    ///   techniques that batch or avoid flushes show their benefit;
    /// - `fua_us: 30`: a FUA write pays roughly for a write-through of its own data.
    fn default() -> SimSsdConfig {
        SimSsdConfig { read_us: 20, write_us: 15, channels: 8, flush_us: 200, fua_us: 30 }
    }
}

impl SimSsdConfig {
    /// The names [`SimSsdConfig::profile`] knows.
    pub const PROFILES: &'static [&'static str] = &["default", "970pro"];

    /// The CJFS paper's device (FAST'23 §6.1: a Samsung 970 Pro, MLC flash, NVMe, a volatile
    /// write cache without power-loss protection, so a flush and a FUA write reach the flash):
    /// - `read_us: 70`, `write_us: 20`: the drive's 4 KiB queue-depth-1 figures (about 14k random
    ///   reads and 50k random writes per second);
    /// - `channels: 8`: its controller's eight flash channels;
    /// - `flush_us: 1550`, `fua_us: 2150`: calibrated from the paper's own one-thread varmail-shared
    ///   figures (13 flowops with 2 fsyncs per loop). EXT4 does 1,685 ops/s, 3.86 ms per fsync,
    ///   whose commit is a flush and a FUA commit block; CJFS, whose commit block rides a cache
    ///   barrier, does 3,806 ops/s, 1.71 ms per fsync with one flush. Taking about 0.15 ms per
    ///   fsync for data and log writes and CPU leaves a flush of 1.55 ms and a FUA write of 2.15 ms.
    pub fn samsung_970_pro() -> SimSsdConfig {
        SimSsdConfig { read_us: 70, write_us: 20, channels: 8, flush_us: 1550, fua_us: 2150 }
    }

    /// A named latency model: `default` or `970pro`.
    pub fn profile(name: &str) -> Option<SimSsdConfig> {
        match name {
            "default" => Some(SimSsdConfig::default()),
            "970pro" => Some(SimSsdConfig::samsung_970_pro()),
            _ => None,
        }
    }

    /// Sets one field by name (`read_us`, `write_us`, `channels`, `flush_us`, `fua_us`).
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        let number: u64 = value.parse().map_err(|_| format!("{key}={value}: not a number"))?;
        match key {
            "read_us" => self.read_us = number,
            "write_us" => self.write_us = number,
            "flush_us" => self.flush_us = number,
            "fua_us" => self.fua_us = number,
            "channels" => {
                if number == 0 || number > CHANNELS_MAX as u64 {
                    return Err(format!("channels={value}: expected 1..={CHANNELS_MAX}"));
                }
                self.channels = number as usize;
            }
            _ => {
                return Err(format!(
                    "{key}? expected read_us, write_us, channels, flush_us or fua_us"
                ))
            }
        }
        Ok(())
    }
}

/// Modelled counters (exact) and the observed queue depth.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimSsdStats {
    pub reads: u64,
    /// All writes, FUA ones included, batch members counted one by one.
    pub writes: u64,
    pub fua_writes: u64,
    pub flushes: u64,
    pub batches: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Modelled transfer time of reads.
    pub read_busy_us: u64,
    /// Modelled transfer time of writes, without the FUA extra.
    pub write_busy_us: u64,
    /// Modelled FUA extra time.
    pub fua_busy_us: u64,
    pub flush_busy_us: u64,
    /// Most ops ever submitted and not yet completed (waiting or in service), flushes included.
    pub queue_depth_max: u64,
    /// Most channels ever busy at once (never more than `channels`).
    pub channels_busy_max: u64,
}

struct Queue {
    channels_busy: usize,
    /// Ops submitted and not completed.
    outstanding: u64,
    /// Tickets of the writes submitted and not completed, so a flush can wait for earlier ones.
    writes_in_flight: BTreeSet<u64>,
    write_ticket_next: u64,
    stats: SimSsdStats,
}

/// The simulated SSD. See the module documentation.
pub struct SimSsd {
    media: MemDevice,
    config: SimSsdConfig,
    queue: Mutex<Queue>,
    /// Signalled whenever a channel is released or a write completes.
    changed: Condvar,
}

impl SimSsd {
    /// A zero-filled simulated SSD of `size_bytes`.
    pub fn new(size_bytes: u64, config: SimSsdConfig) -> SimSsd {
        SimSsd::with_media(MemDevice::new(size_bytes), config)
    }

    /// A simulated SSD over existing contents.
    pub fn with_media(media: MemDevice, config: SimSsdConfig) -> SimSsd {
        assert!(
            (1..=CHANNELS_MAX).contains(&config.channels),
            "channels {} outside 1..={CHANNELS_MAX}",
            config.channels
        );
        let queue = Queue {
            channels_busy: 0,
            outstanding: 0,
            writes_in_flight: BTreeSet::new(),
            write_ticket_next: 0,
            stats: SimSsdStats::default(),
        };
        SimSsd { media, config, queue: Mutex::new(queue), changed: Condvar::new() }
    }

    pub fn config(&self) -> SimSsdConfig {
        self.config
    }

    pub fn stats(&self) -> SimSsdStats {
        self.queue.lock().stats
    }

    /// Zeroes the counters, e.g. between the set-up and the measured part of a benchmark.
    pub fn reset_stats(&self) {
        self.queue.lock().stats = SimSsdStats::default();
    }

    /// The current contents.
    pub fn snapshot(&self) -> Vec<u8> {
        self.media.snapshot()
    }

    fn pages(len: usize) -> u64 {
        len.div_ceil(PAGE_BYTES) as u64
    }

    /// Modelled cost of one write: (transfer, FUA extra).
    fn write_cost(&self, len: usize, fua: bool) -> (u64, u64) {
        (Self::pages(len) * self.config.write_us, if fua { self.config.fua_us } else { 0 })
    }

    /// Registers `ops` submitted ops (and `writes` of them as in-flight writes), returning the
    /// first write ticket.
    fn submit(q: &mut Queue, ops: u64, writes: u64) -> u64 {
        q.outstanding += ops;
        q.stats.queue_depth_max = q.stats.queue_depth_max.max(q.outstanding);
        let first = q.write_ticket_next;
        for t in first..first + writes {
            q.writes_in_flight.insert(t);
        }
        q.write_ticket_next += writes;
        first
    }

    /// Waits for a free channel and takes up to `want` of them; returns how many it took.
    fn take_channels(&self, q: &mut parking_lot::MutexGuard<'_, Queue>, want: usize) -> usize {
        assert!(want >= 1);
        while q.channels_busy == self.config.channels {
            self.changed.wait(q);
        }
        let took = want.min(self.config.channels - q.channels_busy);
        q.channels_busy += took;
        assert!(q.channels_busy <= self.config.channels);
        q.stats.channels_busy_max = q.stats.channels_busy_max.max(q.channels_busy as u64);
        took
    }

    fn complete(&self, channels: usize, ops: u64, write_tickets: std::ops::Range<u64>) {
        let mut q = self.queue.lock();
        assert!(q.channels_busy >= channels && q.outstanding >= ops);
        q.channels_busy -= channels;
        q.outstanding -= ops;
        for t in write_tickets {
            assert!(q.writes_in_flight.remove(&t), "write ticket {t} completed twice");
        }
        drop(q);
        self.changed.notify_all();
    }

    fn write_one(&self, op: Op, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        check_range(op, offset, data.len(), self.media.size_bytes())?;
        let fua = op == Op::WriteFua;
        let (transfer_us, fua_us) = self.write_cost(data.len(), fua);
        let ticket = {
            let mut q = self.queue.lock();
            let ticket = Self::submit(&mut q, 1, 1);
            self.take_channels(&mut q, 1);
            count_write(&mut q.stats, data.len(), transfer_us, fua_us);
            ticket
        };
        wait_us(transfer_us + fua_us);
        let result = self.media.write_at(offset, data);
        self.complete(1, 1, ticket..ticket + 1);
        result
    }
}

fn count_write(stats: &mut SimSsdStats, len: usize, transfer_us: u64, fua_us: u64) {
    stats.writes += 1;
    stats.bytes_written += len as u64;
    stats.write_busy_us += transfer_us;
    if fua_us > 0 {
        stats.fua_writes += 1;
        stats.fua_busy_us += fua_us;
    }
}

/// Greedy schedule of `costs` (in submission order) on `channels` units: each job goes to the
/// least-loaded unit. Returns the makespan. With equal costs this is ceil(n / channels) × cost.
fn makespan_us(costs: &[u64], channels: usize) -> u64 {
    assert!(channels >= 1);
    let mut loads = vec![0u64; channels.min(costs.len().max(1))];
    for &c in costs {
        let least = loads.iter_mut().min().expect("at least one channel");
        *least += c;
    }
    loads.into_iter().max().unwrap_or(0)
}

/// Blocks the calling thread for `us` microseconds of wall time. See the module docs.
fn wait_us(us: u64) {
    if us == 0 {
        return;
    }
    let deadline = Instant::now() + Duration::from_micros(us);
    if us >= SPIN_BELOW_US {
        std::thread::sleep(Duration::from_micros(us - SLEEP_SLACK_US));
    }
    while Instant::now() < deadline {
        std::thread::yield_now();
    }
}

impl BlockDevice for SimSsd {
    fn size_bytes(&self) -> u64 {
        self.media.size_bytes()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        check_range(Op::Read, offset, buf.len(), self.media.size_bytes())?;
        let cost_us = Self::pages(buf.len()) * self.config.read_us;
        {
            let mut q = self.queue.lock();
            Self::submit(&mut q, 1, 0);
            self.take_channels(&mut q, 1);
            q.stats.reads += 1;
            q.stats.bytes_read += buf.len() as u64;
            q.stats.read_busy_us += cost_us;
        }
        wait_us(cost_us);
        let result = self.media.read_at(offset, buf);
        self.complete(1, 1, 0..0);
        result
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        self.write_one(Op::Write, offset, data)
    }

    fn write_fua_at(&self, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        self.write_one(Op::WriteFua, offset, data)
    }

    /// The model keeps no volatile cache, so ordering costs nothing beyond the write: the CJFS
    /// paper's assumption (a cache barrier costs under 2% in the FTL, its §6.1).
    fn has_cache_barrier(&self) -> bool {
        true
    }

    fn write_barrier_at(&self, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        self.write_one(Op::WriteBarrier, offset, data)
    }

    fn flush(&self) -> Result<(), DeviceError> {
        {
            let mut q = self.queue.lock();
            let covers = Self::submit(&mut q, 1, 0);
            // Wait only for writes submitted before the flush, so a steady stream of later
            // writes cannot starve it.
            while q.writes_in_flight.first().is_some_and(|&t| t < covers) {
                self.changed.wait(&mut q);
            }
            q.stats.flushes += 1;
            q.stats.flush_busy_us += self.config.flush_us;
        }
        wait_us(self.config.flush_us);
        self.complete(0, 1, 0..0);
        Ok(())
    }

    /// Spreads the batch over the channels free at submission (at least one, at most all):
    /// the batch holds them for the makespan of a greedy schedule, ≈ ceil(n / channels) ×
    /// `write_us` for 4 KiB writes. Modelling the schedule and waiting once, rather than running
    /// a thread per channel, keeps wall time faithful on a machine with fewer cores than channels.
    fn write_batch(&self, writes: &[Write<'_>]) -> Result<(), DeviceError> {
        let size = self.media.size_bytes();
        for w in writes {
            let op = if w.fua { Op::WriteFua } else { Op::Write };
            check_range(op, w.offset, w.data.len(), size)?;
        }
        if writes.is_empty() {
            return Ok(());
        }
        let n = writes.len() as u64;
        let costs: Vec<(u64, u64)> =
            writes.iter().map(|w| self.write_cost(w.data.len(), w.fua)).collect();
        let (first_ticket, channels) = {
            let mut q = self.queue.lock();
            let first = Self::submit(&mut q, n, n);
            let channels = self.take_channels(&mut q, writes.len().min(self.config.channels));
            q.stats.batches += 1;
            for (w, &(transfer_us, fua_us)) in writes.iter().zip(&costs) {
                count_write(&mut q.stats, w.data.len(), transfer_us, fua_us);
            }
            (first, channels)
        };
        let totals: Vec<u64> = costs.iter().map(|&(t, f)| t + f).collect();
        wait_us(makespan_us(&totals, channels));
        let result = writes.iter().try_for_each(|w| self.media.write_at(w.offset, w.data));
        self.complete(channels, n, first_ticket..first_ticket + n);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn makespan_of_equal_jobs_is_rounds_times_cost() {
        assert_eq!(makespan_us(&[15; 16], 8), 30);
        assert_eq!(makespan_us(&[15; 17], 8), 45);
        assert_eq!(makespan_us(&[15; 3], 8), 15);
        assert_eq!(makespan_us(&[], 8), 0);
    }

    #[test]
    fn makespan_puts_each_job_on_the_least_loaded_channel() {
        assert_eq!(makespan_us(&[100, 10, 10, 10], 2), 100);
        assert_eq!(makespan_us(&[10, 10, 100], 2), 110);
    }

    #[test]
    fn profiles_and_settings_parse() {
        let mut c = SimSsdConfig::profile("970pro").unwrap();
        assert_eq!(c, SimSsdConfig::samsung_970_pro());
        assert_eq!(SimSsdConfig::profile("default"), Some(SimSsdConfig::default()));
        assert!(SimSsdConfig::profile("optane").is_none());
        c.set("flush_us", "900").unwrap();
        c.set("channels", "4").unwrap();
        assert_eq!((c.flush_us, c.channels), (900, 4));
        assert!(c.set("channels", "0").is_err());
        assert!(c.set("flush_us", "soon").is_err());
        assert!(c.set("erase_us", "1").is_err());
    }

    #[test]
    fn zero_cost_configuration_counts_but_does_not_wait() {
        let config = SimSsdConfig { read_us: 0, write_us: 0, channels: 1, flush_us: 0, fua_us: 0 };
        let ssd = SimSsd::new(8192, config);
        ssd.write_at(0, &[1; 4096]).unwrap();
        ssd.flush().unwrap();
        let s = ssd.stats();
        assert_eq!((s.writes, s.flushes, s.write_busy_us), (1, 1, 0));
    }
}
