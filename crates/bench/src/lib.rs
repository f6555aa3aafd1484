//! quill's benchmarks. Timings live here, never in pass/fail tests; the test suite runs each
//! benchmark at its smallest size so it never rots.

pub mod journal_bench;
pub mod percentile;
