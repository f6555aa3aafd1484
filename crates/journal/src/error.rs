//! The error type of the journal engine.
//!
//! After a write or flush error the journal aborts: the error is recorded once and every later
//! call fails with [`JournalError::Aborted`] carrying the original cause (sticky failure, as in
//! redb and JBD2). A failed fsync is never retried as if it had succeeded.

use blockdev::DeviceError;
use ondisk::{OnDiskError, Tid};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JournalError {
    /// The journal hit an I/O error earlier and is read-only from now on.
    #[error("journal aborted: {cause}")]
    Aborted { cause: String, errno: i32 },
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error(transparent)]
    OnDisk(#[from] OnDiskError),
    /// Bytes in the log contradict each other in a way JBD2 treats as corruption.
    #[error("corrupted journal at journal block {log_block}: {reason}")]
    Corrupted { log_block: u32, reason: String },
    /// A handle asked for more credits than one transaction may hold.
    #[error("handle asks for {requested} credits, a transaction holds at most {max}")]
    TooManyCredits { requested: u32, max: u32 },
    /// A handle dirtied or revoked more blocks than it reserved credits for (a caller bug).
    #[error("handle of {tid:?} used more than its {credits} credits")]
    CreditsExhausted { tid: Tid, credits: u32 },
    /// The journal superblock says the log must be replayed before it can be written.
    #[error("journal needs recovery (s_start = {start}); run recovery first")]
    NeedsRecovery { start: u32 },
    /// `commit_and_wait` was asked for a transaction that was never started.
    #[error("{tid:?} has not been started (next tid is {next:?})")]
    UnknownTid { tid: Tid, next: Tid },
    /// The journal was shut down; no new handles.
    #[error("journal is shut down")]
    ShutDown,
    /// The journal holds something this code does not handle (named in the message); nothing
    /// was written.
    #[error("{0}")]
    Unsupported(String),
    /// A parameter (journal size, block size, configuration) is out of range.
    #[error("invalid journal parameter: {0}")]
    Invalid(String),
}

impl JournalError {
    /// The errno this error stands for, for the layers that report errno values.
    pub fn errno(&self) -> i32 {
        match self {
            JournalError::Aborted { errno, .. } => *errno,
            JournalError::Device(e) => e.errno(),
            JournalError::OnDisk(_) | JournalError::Corrupted { .. } => EUCLEAN,
            JournalError::TooManyCredits { .. } | JournalError::CreditsExhausted { .. } => EINVAL,
            JournalError::NeedsRecovery { .. } => EUCLEAN,
            JournalError::UnknownTid { .. } | JournalError::Invalid(_) => EINVAL,
            JournalError::ShutDown => EROFS,
            JournalError::Unsupported(_) => EOPNOTSUPP,
        }
    }
}

const EINVAL: i32 = 22;
const EROFS: i32 = 30;
const EOPNOTSUPP: i32 = 95;
const EUCLEAN: i32 = 117;

pub type Result<T, E = JournalError> = std::result::Result<T, E>;
