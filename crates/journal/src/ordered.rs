//! The ordered-data hook (data=ordered, DESIGN.md §3.3).
//!
//! A caller that exposes file data through metadata in a transaction (a new extent, a grown
//! size) registers that data with the handle. The commit writes every registered item (or
//! waits for the writer that is writing it: [`DataInFlight`]) before it issues the flush that
//! precedes the commit block, so the data is durable no later than the commit block that makes
//! it reachable: JBD2's `t_inode_list`, whose data the commit submits or waits for.

use blockdev::{BlockDevice, DeviceError, Op};
use parking_lot::{Condvar, Mutex};
use std::sync::Arc;

/// Data that must reach the device before a transaction's commit block becomes durable.
pub trait OrderedData: Send + Sync {
    /// Writes the data, or waits until it is written (plain writes: the commit's flush makes
    /// them durable).
    fn write_out(&self) -> Result<(), DeviceError>;
}

/// Data its writer writes itself, after its handle stopped: ext4's writeback maps blocks in a
/// handle and submits their I/O outside it, so no handle (and no commit's lock-up, which waits
/// for handles) waits on a data write. The commit waits for [`DataInFlight::complete`] instead.
///
/// The writer must complete it without waiting for any commit in between (it holds nothing
/// the commit needs, and the commit of the transaction that maps the blocks waits here).
/// A failed write fails the commit, which aborts the journal: the mapping never becomes
/// durable without its data.
#[derive(Default)]
pub struct DataInFlight {
    /// `None` while the writer is writing; then `Ok`, or the failed write's offset and errno.
    result: Mutex<Option<Result<(), (u64, i32)>>>,
    done: Condvar,
}

impl DataInFlight {
    pub fn new() -> Arc<DataInFlight> {
        Arc::new(DataInFlight::default())
    }

    /// The writer's result: the data is on the device (before the commit's flush), or the
    /// write at `offset` failed with `errno`. Only the first completion counts.
    pub fn complete(&self, result: Result<(), (u64, i32)>) {
        let mut slot = self.result.lock();
        if slot.is_none() {
            *slot = Some(result);
            self.done.notify_all();
        }
    }
}

impl OrderedData for DataInFlight {
    fn write_out(&self) -> Result<(), DeviceError> {
        let mut slot = self.result.lock();
        while slot.is_none() {
            self.done.wait(&mut slot);
        }
        match slot.expect("completed") {
            Ok(()) => Ok(()),
            Err((offset, errno)) => Err(DeviceError::Io {
                op: Op::Write,
                offset,
                source: std::io::Error::from_raw_os_error(errno),
            }),
        }
    }
}

/// The simplest ordered item: bytes destined for a device offset.
pub struct OrderedWrite {
    pub device: Arc<dyn BlockDevice>,
    pub offset: u64,
    pub data: Vec<u8>,
}

impl OrderedData for OrderedWrite {
    fn write_out(&self) -> Result<(), DeviceError> {
        self.device.write_at(self.offset, &self.data)
    }
}
