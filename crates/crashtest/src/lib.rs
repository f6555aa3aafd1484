//! quill's crash-state explorer (`quill crashtest`), after CrashMonkey/B3, dm-log-writes and
//! ALICE (reference/workloads-and-crash-testing.md §7).
//!
//! - [`workload`]: operations, their text form, and the generators (B3/ACE-style sequences of
//!   1–3 operations over a small file set, each followed by fsync, fdatasync, sync or nothing;
//!   longer seeded sequences from several threads);
//! - [`model`]: what POSIX says the tree is after every operation;
//! - [`run`]: a workload run on quill over the recording block device, with marks around every
//!   operation;
//! - [`check`]: what every crash image must pass (quill recovers it; what was acknowledged is
//!   there; no stale data; each metadata operation all or nothing; `e2fsck -fn` clean; stock
//!   `e2fsck -fy` reaches the same tree);
//! - [`explore`]: the driver: crash states (every flush prefix; subsets of the writes in flight,
//!   all of them for small epochs, plus in-order prefixes and one-dropped orderings; torn
//!   sectors), counts, minimal reproducers and `--replay`;
//! - [`kernel_fc`]: workloads run on a kernel loop mount with fast commits, the backing file
//!   copied at every acknowledgement, each copy recovered by quill and checked the same way.

pub mod check;
pub mod explore;
pub mod kernel_fc;
pub mod model;
pub mod run;
pub mod tree;
pub mod workload;
