//! Where a FUSE mount's time goes, as quill's side sees it: how many requests of each opcode
//! its handlers served, how long they took to answer them (the kernel's side of the round
//! trip excluded), and how many fsyncs were in flight at once (what group commit through the
//! mount can batch; fsyncs past `fsync_inline` wait on waiter threads, not request threads).
//!
//! Counting costs two relaxed atomic adds and a clock read per request; a [`RequestStats`]
//! lives as long as the mount and is read with [`RequestStats::snapshot`] (the bench takes
//! one when a run starts measuring and one at its end).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

/// The opcodes quill's handlers serve, as `QuillFuse::guarded` names them. A name not here
/// counts as `other`.
const OPS: [&str; 29] = [
    "lookup",
    "getattr",
    "setattr",
    "readlink",
    "mknod",
    "mkdir",
    "unlink",
    "rmdir",
    "symlink",
    "rename",
    "link",
    "open",
    "read",
    "write",
    "flush",
    "release",
    "fsync",
    "opendir",
    "readdir",
    "readdirplus",
    "releasedir",
    "fsyncdir",
    "statfs",
    "setxattr",
    "getxattr",
    "listxattr",
    "removexattr",
    "create",
    "fallocate",
];

#[derive(Debug, Default)]
struct OpCounters {
    requests: AtomicU64,
    ns: AtomicU64,
}

/// Request counters of one mount (see the module documentation).
#[derive(Debug)]
pub struct RequestStats {
    ops: [OpCounters; OPS.len()],
    other: OpCounters,
    fsyncs_in_flight: AtomicU64,
    fsyncs_in_flight_max: AtomicU64,
}

/// What [`RequestStats::snapshot`] reads.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestFigures {
    /// Each opcode with requests: its name, the requests, and the nanoseconds quill's
    /// handlers took for them, summed.
    pub ops: Vec<(&'static str, u64, u64)>,
    /// The most fsync and fsyncdir requests in quill's handlers at once since the last
    /// [`RequestStats::restart_peak`].
    pub fsyncs_in_flight_max: u64,
}

impl RequestFigures {
    /// The requests made since `earlier` (a snapshot of the same counters), per opcode.
    pub fn since(&self, earlier: &RequestFigures) -> Vec<(&'static str, u64, u64)> {
        self.ops
            .iter()
            .map(|&(name, requests, ns)| {
                let before = earlier.ops.iter().find(|(n, _, _)| *n == name);
                let (r0, ns0) = before.map_or((0, 0), |&(_, r, n)| (r, n));
                (name, requests - r0, ns - ns0)
            })
            .filter(|&(_, requests, _)| requests > 0)
            .collect()
    }
}

impl Default for RequestStats {
    fn default() -> Self {
        RequestStats {
            ops: std::array::from_fn(|_| OpCounters::default()),
            other: OpCounters::default(),
            fsyncs_in_flight: AtomicU64::new(0),
            fsyncs_in_flight_max: AtomicU64::new(0),
        }
    }
}

impl RequestStats {
    /// Counts a request of `op` from now until the returned guard is dropped (which may be on
    /// another thread: an fsync handed to a waiter, `fsync_waiters.rs`).
    pub(crate) fn begin(self: &Arc<Self>, op: &'static str) -> RequestTimer {
        let fsync = op == "fsync" || op == "fsyncdir";
        if fsync {
            let now = self.fsyncs_in_flight.fetch_add(1, Relaxed) + 1;
            self.fsyncs_in_flight_max.fetch_max(now, Relaxed);
        }
        let index = OPS.iter().position(|&o| o == op);
        // Counted as it begins: by the time its caller has the reply, the request is in the
        // figures (its time is added when the handler returns, after the reply).
        self.counters(index).requests.fetch_add(1, Relaxed);
        RequestTimer { stats: self.clone(), index, fsync, started: Instant::now() }
    }

    /// An opcode's counters by its place in [`OPS`] (`None`: `other`).
    fn counters(&self, index: Option<usize>) -> &OpCounters {
        index.map_or(&self.other, |i| &self.ops[i])
    }

    /// The counters now.
    pub fn snapshot(&self) -> RequestFigures {
        let named = OPS.iter().zip(&self.ops).map(|(&name, c)| (name, c));
        let ops = named
            .chain(std::iter::once(("other", &self.other)))
            .map(|(name, c)| (name, c.requests.load(Relaxed), c.ns.load(Relaxed)))
            .filter(|&(_, requests, _)| requests > 0)
            .collect();
        RequestFigures { ops, fsyncs_in_flight_max: self.fsyncs_in_flight_max.load(Relaxed) }
    }

    /// Starts the peak of fsyncs in flight over from the present count.
    pub fn restart_peak(&self) {
        self.fsyncs_in_flight_max.store(self.fsyncs_in_flight.load(Relaxed), Relaxed);
    }
}

/// One request being served ([`RequestStats::begin`]).
pub(crate) struct RequestTimer {
    stats: Arc<RequestStats>,
    index: Option<usize>,
    fsync: bool,
    started: Instant,
}

impl Drop for RequestTimer {
    fn drop(&mut self) {
        let ns = u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.stats.counters(self.index).ns.fetch_add(ns, Relaxed);
        if self.fsync {
            self.stats.fsyncs_in_flight.fetch_sub(1, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_counted_by_opcode_and_the_fsync_peak_follows_overlap() {
        let stats = Arc::new(RequestStats::default());
        let start = stats.snapshot();
        {
            let _a = stats.begin("fsync");
            let _b = stats.begin("fsyncdir");
            drop(stats.begin("lookup"));
        }
        drop(stats.begin("no such opcode"));
        let figures = stats.snapshot();
        assert_eq!(figures.fsyncs_in_flight_max, 2);
        let counts: Vec<(&str, u64)> =
            figures.since(&start).into_iter().map(|(name, n, _)| (name, n)).collect();
        assert_eq!(counts, [("lookup", 1), ("fsync", 1), ("fsyncdir", 1), ("other", 1)]);
        stats.restart_peak();
        assert_eq!(stats.snapshot().fsyncs_in_flight_max, 0);
        let _c = stats.begin("fsync");
        assert_eq!(stats.snapshot().fsyncs_in_flight_max, 1);
    }
}
