//! Aborting the journal (JBD2's `jbd2_journal_abort`): the first fatal error is recorded and
//! sticks; everybody waiting wakes and sees it; the errno goes to the on-disk superblock so the
//! next mount or e2fsck checks the file system in full. From then on nothing is committed: the
//! running transaction and everything after it never reach the log.

use crate::error::JournalError;
use crate::journal::Shared;
use std::sync::atomic::Ordering;

/// errno recorded when an error carries none (a stage thread panicked, say).
pub(crate) const EIO: i32 = 5;

impl Shared {
    /// Records the first fatal error, wakes everybody, records the errno in the on-disk
    /// superblock, and returns the sticky error. The caller must not hold the superblock lock.
    pub fn abort(&self, cause: String, errno: i32) -> JournalError {
        let errno = if errno > 0 { errno } else { EIO };
        let (first, err) = {
            let mut st = self.state.write(&self.locks);
            let first = st.set_aborted(cause, errno);
            (first, st.aborted().expect_err("just aborted"))
        };
        if first {
            self.aborted.store(true, Ordering::Release);
        }
        self.wake_everybody();
        if first && !self.read_only {
            self.superblock.record_errno(&*self.dev, &self.location, &self.locks, errno);
        }
        err
    }

    /// Aborts on a device error and returns the sticky journal error.
    pub fn abort_on(&self, what: &str, err: blockdev::DeviceError) -> JournalError {
        let errno = err.errno();
        self.abort(format!("{what}: {err}"), errno)
    }

    /// The sticky error if the journal aborted; cheap (an atomic) when it did not.
    pub fn check_aborted(&self) -> crate::Result<()> {
        if !self.aborted.load(Ordering::Acquire) {
            return Ok(());
        }
        self.state.read(&self.locks).aborted()
    }
}
