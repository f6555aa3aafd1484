//! The error type of the `ondisk` crate.

/// What went wrong while parsing or validating on-disk bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OnDiskError {
    /// The bytes do not form a valid structure: bad magic, bad checksum, out-of-range field.
    /// `what` names the structure ("journal superblock", "descriptor block", ...).
    #[error("corrupted {what}: {reason}")]
    Corrupted { what: &'static str, reason: String },
    /// A well-formed structure uses a feature this code does not implement.
    #[error("unsupported {what}: {reason}")]
    Unsupported { what: &'static str, reason: String },
}

impl OnDiskError {
    pub fn corrupted(what: &'static str, reason: impl Into<String>) -> Self {
        OnDiskError::Corrupted { what, reason: reason.into() }
    }
    pub fn unsupported(what: &'static str, reason: impl Into<String>) -> Self {
        OnDiskError::Unsupported { what, reason: reason.into() }
    }
}
