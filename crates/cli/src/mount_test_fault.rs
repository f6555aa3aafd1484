//! TEST ONLY: fault injection into a live `quill mount`, for the tests that check what a
//! daemon does when its device fails or a request handler panics
//! (crates/cli/tests/mount_daemon.rs). It exists because those paths cannot be reached from
//! outside otherwise, and it is harmless in production:
//! - it is armed only by the environment variable `QUILL_TEST_FAULT` (no mount option, so no
//!   /etc/fstab line can arm it), whose values are exact words; any other value refuses the
//!   mount, so a typo never passes unnoticed;
//! - armed, it does nothing until something looks up the name [`TRIGGER_NAME`] in the mount;
//! - an armed mount logs a warning saying so.
//!
//! | `QUILL_TEST_FAULT` | a lookup of `.quill-test-fault` |
//! |---|---|
//! | `panic` | panics in the request handler (as a bug would) |
//! | `device-eio` | makes every later write and flush of the image fail with EIO (a dying disk) |

use std::sync::Arc;

use blockdev::fault::{Fault, FaultDevice, FaultOn};
use blockdev::BlockDevice;

/// The environment variable that arms a fault.
pub const VARIABLE: &str = "QUILL_TEST_FAULT";
/// The name whose lookup fires the fault.
pub const TRIGGER_NAME: &str = ".quill-test-fault";

/// A fault to inject, from [`VARIABLE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestFault {
    Panic,
    DeviceEio,
}

/// The fault [`VARIABLE`] arms, if any; an unknown value is an error naming it.
pub fn from_env() -> Result<Option<TestFault>, String> {
    let Some(value) = std::env::var_os(VARIABLE) else { return Ok(None) };
    match value.to_str() {
        Some("panic") => Ok(Some(TestFault::Panic)),
        Some("device-eio") => Ok(Some(TestFault::DeviceEio)),
        _ => Err(format!("{VARIABLE}={value:?}: expected panic or device-eio (tests only)")),
    }
}

impl TestFault {
    /// Wraps `dev` as the fault needs and returns the lookup trigger that fires it.
    pub fn arm(
        self,
        dev: Arc<dyn BlockDevice>,
    ) -> (Arc<dyn BlockDevice>, quill_fuse::LookupTrigger) {
        log::warn!(
            "TEST ONLY: {VARIABLE}={} is set: a lookup of {TRIGGER_NAME} in this mount injects \
             that fault",
            self.word()
        );
        let name = TRIGGER_NAME.as_bytes().to_vec();
        match self {
            TestFault::Panic => {
                let action = Arc::new(|| panic!("{VARIABLE}=panic: injected panic (tests only)"));
                (dev, quill_fuse::LookupTrigger { name, action })
            }
            TestFault::DeviceEio => {
                let faulty = Arc::new(FaultDevice::new(dev));
                let armed = faulty.clone();
                let action = Arc::new(move || {
                    log::warn!("TEST ONLY: {VARIABLE}=device-eio: every write and flush fails now");
                    armed.inject(Fault::new(FaultOn::AnyWrite).sticky());
                    armed.inject(Fault::new(FaultOn::Flush).sticky());
                });
                (faulty, quill_fuse::LookupTrigger { name, action })
            }
        }
    }

    fn word(self) -> &'static str {
        match self {
            TestFault::Panic => "panic",
            TestFault::DeviceEio => "device-eio",
        }
    }
}
