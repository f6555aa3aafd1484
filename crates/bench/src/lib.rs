//! quill's benchmarks: the journal benchmark (`quill journal bench`) and the file-system
//! benchmark (`quill bench`): the seed papers' workloads run side by side on quill, the
//! kernel's ext4, fuse2fs and any mounted directory, with a device probe, tables, JSON, CSV
//! and plots.

pub mod fsapi;
pub mod journal_bench;
pub mod kernel_fc;
pub mod percentile;
pub mod plot;
pub mod probe;
pub mod queue_depth;
pub mod recovery;
pub mod recovery_study;
pub mod report;
pub mod results;
pub mod runner;
pub mod targets;
pub mod workloads;
