//! quill's journal engine: a JBD2-compatible log with a commit pipeline, checkpointing and
//! recovery (DESIGN.md §3).
//!
//! One module per phase, as in Linux fs/jbd2: [`handle`] (transaction.c's handle API),
//! [`transaction`] (life cycle), `commit` and `flush` (commit.c, split into the CJFS commit and
//! flush stages), `checkpoint` (checkpoint.c), [`revoke`], [`recovery`], [`log_space`],
//! [`superblock`]. The on-disk format is plain JBD2 ([`ondisk::jbd2`]), so e2fsck and the kernel
//! replay what quill writes.
//!
//! ```
//! use blockdev::memory::MemDevice;
//! use journal::{Journal, JournalConfig, JournalLocation, superblock};
//! use std::sync::Arc;
//!
//! // An 8 MiB device: file-system blocks 0..=255, a 1024-block journal at block 256.
//! let dev: Arc<dyn blockdev::BlockDevice> = Arc::new(MemDevice::new(8 << 20));
//! let location = JournalLocation::contiguous(4096, 256, 1024).unwrap();
//! superblock::format(&*dev, &location, Default::default()).unwrap();
//!
//! let journal = Journal::open(dev, location, JournalConfig::classic()).unwrap();
//! let buffer = journal.read_buffer(10).unwrap();
//! let mut handle = journal.start(1).unwrap();
//! handle.modify(&buffer, |bytes| bytes[0] = 42).unwrap();
//! let tid = handle.stop().unwrap();
//! journal.commit_and_wait(tid).unwrap(); // durable: an fsync
//! journal.shutdown().unwrap(); // checkpointed, journal clean
//! ```

mod abort;
pub mod buffer;
mod checkpoint;
mod commit;
mod commit_io;
pub mod config;
mod coop_io;
pub mod error;
pub mod fast_commit;
mod fc_commit;
mod flush;
pub mod handle;
mod journal;
pub mod location;
pub(crate) mod lockfree_list;
mod locks;
pub mod log_space;
pub mod ordered;
pub mod recovery;
pub mod revoke;
mod state;
pub mod stats;
pub mod superblock;
mod sync;
pub mod transaction;

pub use buffer::Buffer;
pub use config::JournalConfig;
pub use error::{JournalError, Result};
pub use fast_commit::{FastCommitArea, FastCommitReplay, FastCommitReport, RefuseFastCommits};
pub use fc_commit::{FastCommitOutcome, FcFallback, FcTicket};
pub use handle::Handle;
pub use journal::{panic_message, Journal};
pub use location::{JournalLocation, LocationError, LocationExtent};
pub use ordered::{DataInFlight, OrderedData, OrderedWrite};
pub use recovery::{
    recover, recover_with_fast_commits, recover_with_progress, scan_log, LogScan, RecoveryReport,
};
pub use stats::{JournalStats, LockWait, LockWaits};
pub use transaction::HomeOrder;
