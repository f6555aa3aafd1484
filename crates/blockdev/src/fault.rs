//! A fault-injecting wrapper: fails chosen reads, writes or flushes with EIO, ENOSPC or any errno.
//!
//! [`FaultDevice`] wraps any device and consults its list of armed [`Fault`]s before each op.
//! Invariants:
//! - a failing op never reaches the inner device, so the test knows exactly what the media holds;
//! - every armed fault counts every valid op it matches (even one another fault fails), and
//!   fires on the `after + 1`-th: once, or on every later match too if `sticky`;
//! - requests every device rejects (misaligned, out of range) are rejected first and are not
//!   counted, so they cannot shift which op a fault hits;
//! - the fault list is behind a mutex that is never held during inner I/O.
//!
//! Members of a `write_batch` are matched one by one, in batch order. The members that do not
//! fail are still submitted (as one batch) and the first injected error is returned, because in a
//! parallel batch the other writes may well have landed.

use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::{check_range, BlockDevice, DeviceError, Op, Write};

/// Which ops a fault matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultOn {
    Read,
    /// Plain (non-FUA) writes: `write_at` and the non-FUA members of a batch.
    Write,
    /// FUA writes: `write_fua_at` and the FUA members of a batch.
    WriteFua,
    /// Order-preserving writes (`write_barrier_at`).
    WriteBarrier,
    /// Every write, plain, FUA or order-preserving, alone or in a batch.
    AnyWrite,
    Flush,
}

impl FaultOn {
    fn matches(self, op: Op) -> bool {
        match self {
            FaultOn::Read => op == Op::Read,
            FaultOn::Write => op == Op::Write,
            FaultOn::WriteFua => op == Op::WriteFua,
            FaultOn::WriteBarrier => op == Op::WriteBarrier,
            FaultOn::AnyWrite => matches!(op, Op::Write | Op::WriteFua | Op::WriteBarrier),
            FaultOn::Flush => op == Op::Flush,
        }
    }
}

/// One fault to inject. Build with [`Fault::new`] and the chained setters, or fill the fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub on: FaultOn,
    /// Let this many matching ops succeed first.
    pub after: u64,
    /// The errno of the injected error: `EIO` by default, `ENOSPC` for a full device.
    pub errno: i32,
    /// Keep failing every later matching op, as a dead device does.
    pub sticky: bool,
    /// Match only I/O whose byte range overlaps this range; ignored for flushes.
    pub offset_range: Option<Range<u64>>,
    /// Match only writes whose data begins with these bytes (a block of one kind: a JBD2 commit
    /// block, say, whichever way it is written).
    pub data_prefix: Option<Vec<u8>>,
}

impl Fault {
    /// Fails the first matching op with EIO, once.
    pub fn new(on: FaultOn) -> Fault {
        Fault {
            on,
            after: 0,
            errno: libc::EIO,
            sticky: false,
            offset_range: None,
            data_prefix: None,
        }
    }

    pub fn after(mut self, ops_ok: u64) -> Fault {
        self.after = ops_ok;
        self
    }

    pub fn errno(mut self, errno: i32) -> Fault {
        assert!(errno > 0, "errno must be positive, got {errno}");
        self.errno = errno;
        self
    }

    pub fn sticky(mut self) -> Fault {
        self.sticky = true;
        self
    }

    pub fn in_range(mut self, range: Range<u64>) -> Fault {
        self.offset_range = Some(range);
        self
    }

    pub fn data_prefix(mut self, prefix: &[u8]) -> Fault {
        self.data_prefix = Some(prefix.to_vec());
        self
    }

    fn matches(&self, op: Op, offset: u64, len: usize, data: Option<&[u8]>) -> bool {
        if !self.on.matches(op) {
            return false;
        }
        if let Some(prefix) = &self.data_prefix {
            if !data.is_some_and(|d| d.starts_with(prefix)) {
                return false;
            }
        }
        match (&self.offset_range, op) {
            (None, _) | (Some(_), Op::Flush) => true,
            (Some(r), _) => {
                let end = offset + len as u64;
                if len == 0 {
                    r.contains(&offset)
                } else {
                    offset < r.end && r.start < end
                }
            }
        }
    }
}

struct Armed {
    fault: Fault,
    /// Matching ops seen so far.
    matched: u64,
    fired: bool,
}

/// A device that fails chosen ops. See the module documentation.
pub struct FaultDevice {
    inner: Arc<dyn BlockDevice>,
    armed: Mutex<Vec<Armed>>,
    failures: AtomicU64,
}

impl FaultDevice {
    pub fn new(inner: Arc<dyn BlockDevice>) -> FaultDevice {
        FaultDevice { inner, armed: Mutex::new(Vec::new()), failures: AtomicU64::new(0) }
    }

    /// Arms `fault`; it starts counting matching ops from now.
    pub fn inject(&self, fault: Fault) {
        assert!(fault.errno > 0, "errno must be positive, got {}", fault.errno);
        self.armed.lock().push(Armed { fault, matched: 0, fired: false });
    }

    /// Disarms every fault; later ops all reach the inner device.
    pub fn clear(&self) {
        self.armed.lock().clear();
    }

    /// How many ops (batch members counted one by one) failed because of an injected fault.
    pub fn injected_failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// The wrapped device, e.g. to inspect what reached it.
    pub fn inner(&self) -> &Arc<dyn BlockDevice> {
        &self.inner
    }

    /// Counts the op against every armed fault and returns the error to inject, if any.
    fn decide(
        &self,
        op: Op,
        offset: u64,
        len: usize,
        data: Option<&[u8]>,
    ) -> Result<(), DeviceError> {
        let mut errno = None;
        for armed in self.armed.lock().iter_mut() {
            if !armed.fault.matches(op, offset, len, data) {
                continue;
            }
            armed.matched += 1;
            let due = armed.matched > armed.fault.after;
            if due && (!armed.fired || armed.fault.sticky) {
                armed.fired = true;
                errno = errno.or(Some(armed.fault.errno));
            }
        }
        match errno {
            None => Ok(()),
            Some(errno) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                Err(DeviceError::Io { op, offset, source: io::Error::from_raw_os_error(errno) })
            }
        }
    }

    fn checked(
        &self,
        op: Op,
        offset: u64,
        len: usize,
        data: Option<&[u8]>,
    ) -> Result<(), DeviceError> {
        check_range(op, offset, len, self.inner.size_bytes())?;
        self.decide(op, offset, len, data)
    }
}

impl BlockDevice for FaultDevice {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        self.checked(Op::Read, offset, buf.len(), None)?;
        self.inner.read_at(offset, buf)
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        self.checked(Op::Write, offset, data.len(), Some(data))?;
        self.inner.write_at(offset, data)
    }

    fn write_fua_at(&self, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        self.checked(Op::WriteFua, offset, data.len(), Some(data))?;
        self.inner.write_fua_at(offset, data)
    }

    fn flush(&self) -> Result<(), DeviceError> {
        self.decide(Op::Flush, 0, 0, None)?;
        self.inner.flush()
    }

    fn has_cache_barrier(&self) -> bool {
        self.inner.has_cache_barrier()
    }

    fn write_barrier_at(&self, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        self.checked(Op::WriteBarrier, offset, data.len(), Some(data))?;
        self.inner.write_barrier_at(offset, data)
    }

    fn write_batch(&self, writes: &[Write<'_>]) -> Result<(), DeviceError> {
        let size = self.inner.size_bytes();
        for w in writes {
            let op = if w.fua { Op::WriteFua } else { Op::Write };
            check_range(op, w.offset, w.data.len(), size)?;
        }
        let mut first_error = None;
        let mut passing = Vec::with_capacity(writes.len());
        for w in writes {
            let op = if w.fua { Op::WriteFua } else { Op::Write };
            match self.decide(op, w.offset, w.data.len(), Some(w.data)) {
                Ok(()) => passing.push(*w),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        let submitted = self.inner.write_batch(&passing);
        match first_error {
            Some(e) => Err(e),
            None => submitted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemDevice;

    fn device() -> FaultDevice {
        FaultDevice::new(Arc::new(MemDevice::new(64 * 1024)))
    }

    #[test]
    fn non_sticky_fault_fires_exactly_once() {
        let dev = device();
        dev.inject(Fault::new(FaultOn::Read).after(1));
        let mut buf = [0; 512];
        dev.read_at(0, &mut buf).unwrap();
        assert_eq!(dev.read_at(0, &mut buf).unwrap_err().errno(), libc::EIO);
        dev.read_at(0, &mut buf).unwrap();
        assert_eq!(dev.injected_failures(), 1);
    }

    #[test]
    fn offset_range_limits_which_writes_match() {
        let dev = device();
        dev.inject(Fault::new(FaultOn::AnyWrite).in_range(8192..12288).errno(libc::ENOSPC));
        dev.write_at(0, &[1; 4096]).unwrap();
        dev.write_fua_at(12288, &[1; 4096]).unwrap();
        let err = dev.write_fua_at(4096, &[1; 8192]).unwrap_err();
        assert_eq!(err.errno(), libc::ENOSPC);
        let mut buf = [0; 8192];
        dev.inner().read_at(4096, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0), "the failed write reached the inner device");
    }

    #[test]
    fn invalid_requests_are_not_counted() {
        let dev = device();
        dev.inject(Fault::new(FaultOn::Write).after(1));
        assert!(matches!(dev.write_at(3, &[0; 512]), Err(DeviceError::Misaligned { .. })));
        dev.write_at(0, &[0; 512]).unwrap();
        assert!(dev.write_at(0, &[0; 512]).is_err());
    }

    #[test]
    fn a_data_prefix_matches_only_writes_that_begin_with_it() {
        let dev = device();
        dev.inject(Fault::new(FaultOn::AnyWrite).data_prefix(&[7, 7]));
        let mut other = [0u8; 512];
        other[0] = 7;
        dev.write_at(0, &other).unwrap();
        let batch = [Write { offset: 512, data: &[7; 512], fua: true }];
        assert_eq!(dev.write_batch(&batch).unwrap_err().errno(), libc::EIO);
        assert_eq!(dev.injected_failures(), 1);
    }

    #[test]
    fn clear_disarms_sticky_faults() {
        let dev = device();
        dev.inject(Fault::new(FaultOn::Flush).sticky());
        assert!(dev.flush().is_err());
        assert!(dev.flush().is_err());
        dev.clear();
        dev.flush().unwrap();
        assert_eq!(dev.injected_failures(), 2);
    }
}
