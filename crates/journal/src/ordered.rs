//! The ordered-data hook (data=ordered, DESIGN.md §3.3).
//!
//! A caller that exposes file data through metadata in a transaction (a new extent, a grown
//! size) registers that data with the handle. The commit writes every registered item before it
//! issues the flush that precedes the commit block, so the data is durable no later than the
//! commit block that makes it reachable.

use blockdev::{BlockDevice, DeviceError};
use std::sync::Arc;

/// Data that must reach the device before a transaction's commit block becomes durable.
pub trait OrderedData: Send + Sync {
    /// Writes the data (plain writes: the commit's flush makes them durable).
    fn write_out(&self) -> Result<(), DeviceError>;
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
