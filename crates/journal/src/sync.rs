//! Atomics for the journal's lock-free and cooperative code, switched to loom's models when
//! built with `--cfg loom` (`scripts/loom.sh` runs those models).

#[cfg(loom)]
#[allow(unused_imports)] // each build uses the subset its lock-free and cooperative code needs
pub(crate) use loom::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
#[cfg(not(loom))]
#[allow(unused_imports)]
pub(crate) use std::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
