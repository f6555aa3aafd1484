//! A pass-through block device that measures its queue depth: how many operations were
//! outstanding (submitted, not completed) each time one was submitted. A parallel commit or
//! checkpoint shows up as a mean depth above 1; JBD2's one-at-a-time writes stay at 1.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use blockdev::{BlockDevice, DeviceError, Write};

pub struct QueueDepthDevice {
    inner: Arc<dyn BlockDevice>,
    outstanding: AtomicU64,
    submissions: AtomicU64,
    depth_sum: AtomicU64,
    depth_max: AtomicU64,
}

impl QueueDepthDevice {
    pub fn new(inner: Arc<dyn BlockDevice>) -> QueueDepthDevice {
        QueueDepthDevice {
            inner,
            outstanding: AtomicU64::new(0),
            submissions: AtomicU64::new(0),
            depth_sum: AtomicU64::new(0),
            depth_max: AtomicU64::new(0),
        }
    }

    /// Forgets what was seen so far (the measured phase starts).
    pub fn reset(&self) {
        self.submissions.store(0, Ordering::Relaxed);
        self.depth_sum.store(0, Ordering::Relaxed);
        self.depth_max.store(0, Ordering::Relaxed);
    }

    /// Mean depth seen by submissions, and the most.
    pub fn depth(&self) -> (f64, u64) {
        let n = self.submissions.load(Ordering::Relaxed);
        let sum = self.depth_sum.load(Ordering::Relaxed);
        let mean = if n == 0 { 0.0 } else { sum as f64 / n as f64 };
        (mean, self.depth_max.load(Ordering::Relaxed))
    }

    fn track<T>(&self, ops: u64, io: impl FnOnce() -> T) -> T {
        let depth = self.outstanding.fetch_add(ops, Ordering::Relaxed) + ops;
        self.submissions.fetch_add(ops, Ordering::Relaxed);
        self.depth_sum.fetch_add(depth * ops, Ordering::Relaxed);
        self.depth_max.fetch_max(depth, Ordering::Relaxed);
        let result = io();
        self.outstanding.fetch_sub(ops, Ordering::Relaxed);
        result
    }
}

impl BlockDevice for QueueDepthDevice {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        self.track(1, || self.inner.read_at(offset, buf))
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        self.track(1, || self.inner.write_at(offset, data))
    }
    fn write_fua_at(&self, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        self.track(1, || self.inner.write_fua_at(offset, data))
    }
    fn flush(&self) -> Result<(), DeviceError> {
        self.track(1, || self.inner.flush())
    }
    fn has_cache_barrier(&self) -> bool {
        self.inner.has_cache_barrier()
    }
    fn write_barrier_at(&self, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        self.track(1, || self.inner.write_barrier_at(offset, data))
    }
    fn write_batch(&self, writes: &[Write<'_>]) -> Result<(), DeviceError> {
        self.track(writes.len() as u64, || self.inner.write_batch(writes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockdev::memory::MemDevice;

    #[test]
    fn a_batch_counts_as_its_writes_and_serial_ops_as_depth_one() {
        let dev = QueueDepthDevice::new(Arc::new(MemDevice::new(1 << 20)));
        let block = [7u8; 512];
        dev.write_at(0, &block).unwrap();
        dev.flush().unwrap();
        assert_eq!(dev.depth(), (1.0, 1));
        dev.reset();
        let batch: Vec<Write> =
            (0..4).map(|i| Write { offset: i * 512, data: &block, fua: false }).collect();
        dev.write_batch(&batch).unwrap();
        assert_eq!(dev.depth(), (4.0, 4));
    }
}
