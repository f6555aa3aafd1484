//! The two ways a batch of runs reaches the kernel in parallel: io_uring rings, and, where
//! io_uring cannot be set up (seccomp, `kernel.io_uring_disabled`, old kernels), a persistent
//! pool of threads each issuing `pwritev2`.
//!
//! | engine  | submission                                  | completion                        |
//! |---------|---------------------------------------------|-----------------------------------|
//! | ring    | one `IORING_OP_WRITEV` per run, up to [`RING_ENTRIES`] in flight, `RWF_DSYNC` in `rw_flags` for FUA | `io_uring_enter` waits; a short write is finished with `pwritev2` |
//! | threads | the caller and up to `parallelism - 1` pool threads claim runs in turn | the caller waits on a latch        |
//!
//! Invariants:
//! - neither engine returns while the kernel or a pool thread may still touch a run's memory:
//!   the ring is drained of every submitted entry, and the latch counts every dispatched task;
//! - a ring goes back to the idle list only empty (nothing queued, nothing in flight).

use std::fmt;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};

use io_uring::{opcode, types, IoUring};
use parking_lot::{Condvar, Mutex};

use super::runs::Staged;

/// Entries of each ring, and so the most runs one batch keeps in flight through it.
pub const RING_ENTRIES: u32 = 32;

/// Idle rings kept for later batches; concurrent batches beyond this make rings they drop.
const RINGS_IDLE_MAX: usize = 4;

/// What a run's submission came back with: `None` if it was never submitted (a write before it
/// failed), else the kernel's result (bytes written, or a negative errno).
pub(crate) type Outcome = Option<i32>;

/// io_uring rings shared by the device's callers, one per concurrent batch.
pub(crate) struct RingPool {
    idle: Mutex<Vec<IoUring>>,
}

impl fmt::Debug for RingPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RingPool").field("idle", &self.idle.lock().len()).finish()
    }
}

impl RingPool {
    /// Sets up the first ring; the error says why io_uring is unusable here.
    pub fn new() -> io::Result<RingPool> {
        let ring = IoUring::new(RING_ENTRIES)?;
        Ok(RingPool { idle: Mutex::new(vec![ring]) })
    }

    /// Writes `runs` through a ring. `flags(run)` gives the run's `rw_flags`. After the first
    /// failed run (in `runs` order of completion) no further run is submitted.
    pub fn write(
        &self,
        fd: RawFd,
        runs: &[Staged<'_>],
        flags: impl Fn(&Staged<'_>) -> libc::c_int,
    ) -> io::Result<Vec<Outcome>> {
        let popped = self.idle.lock().pop();
        let mut ring = match popped {
            Some(ring) => ring,
            None => IoUring::new(RING_ENTRIES)?,
        };
        let outcomes = ring_write(&mut ring, fd, runs, flags);
        let mut idle = self.idle.lock();
        if idle.len() < RINGS_IDLE_MAX {
            idle.push(ring);
        }
        Ok(outcomes)
    }
}

fn ring_write(
    ring: &mut IoUring,
    fd: RawFd,
    runs: &[Staged<'_>],
    flags: impl Fn(&Staged<'_>) -> libc::c_int,
) -> Vec<Outcome> {
    let mut outcomes: Vec<Outcome> = vec![None; runs.len()];
    let mut next = 0usize;
    let mut in_flight = 0usize;
    let mut failed = false;
    while in_flight > 0 || (next < runs.len() && !failed) {
        while next < runs.len() && !failed && in_flight < RING_ENTRIES as usize {
            let run = &runs[next];
            let iovecs = run.iovecs();
            let entry = opcode::Writev::new(types::Fd(fd), iovecs.as_ptr(), iovecs.len() as u32)
                .offset(run.offset)
                .rw_flags(flags(run))
                .build()
                .user_data(next as u64);
            // SAFETY: the entry points at `run`'s iovecs and their memory, which outlive this
            // function; the function returns only after every submitted entry has completed.
            let pushed = unsafe { ring.submission().push(&entry) };
            if pushed.is_err() {
                break; // the submission queue is full: submit what is queued first
            }
            next += 1;
            in_flight += 1;
        }
        let more_to_push = next < runs.len() && !failed;
        let want = if more_to_push { 1 } else { in_flight };
        if let Err(e) = ring.submit_and_wait(want) {
            match e.raw_os_error() {
                Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY) => {}
                _ => {
                    // The kernel holds pointers into memory this function must not release
                    // while it may still read it; there is no safe way out.
                    eprintln!(
                        "quill: io_uring_enter failed with {in_flight} writes in flight: {e}"
                    );
                    std::process::abort();
                }
            }
        }
        for cqe in ring.completion() {
            let i = cqe.user_data() as usize;
            assert!(i < runs.len() && outcomes[i].is_none(), "unexpected completion {i}");
            outcomes[i] = Some(cqe.result());
            in_flight -= 1;
            if cqe.result() < 0 {
                failed = true;
            }
        }
    }
    outcomes
}

type Job = Box<dyn FnOnce() + Send + 'static>;

/// Persistent submitting threads for when io_uring is unavailable (or not wanted).
pub(crate) struct ThreadPool {
    sender: Mutex<mpsc::Sender<Job>>,
    threads: usize,
}

impl fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThreadPool").field("threads", &self.threads).finish()
    }
}

impl ThreadPool {
    /// Starts `threads` threads; they exit when the pool is dropped.
    pub fn new(threads: usize) -> ThreadPool {
        let (sender, receiver) = mpsc::channel::<Job>();
        let receiver = Arc::new(Mutex::new(receiver));
        let mut started = 0;
        for _ in 0..threads {
            let receiver = receiver.clone();
            let spawned =
                std::thread::Builder::new().name("quill-blockdev-io".into()).spawn(move || loop {
                    let job = receiver.lock().recv();
                    match job {
                        Ok(job) => job(),
                        Err(_) => return,
                    }
                });
            // A thread that cannot start only lowers the parallelism: the caller of `run`
            // takes part in every batch, so the work is done whatever the pool's size.
            started += usize::from(spawned.is_ok());
        }
        ThreadPool { sender: Mutex::new(sender), threads: started }
    }

    /// Runs `task` on the calling thread and on up to `helpers` pool threads at once, and
    /// returns when every copy has returned. A panic in a pool copy is re-raised here.
    pub fn run(&self, helpers: usize, task: &(dyn Fn() + Sync)) {
        let latch = Arc::new(Latch::default());
        {
            // Waits in its drop, so even a panic in the caller's own copy leaves no pool
            // thread running `task` after this frame is gone.
            let _wait = LatchWait(&latch);
            for _ in 0..helpers.min(self.threads) {
                latch.count_up();
                let done = latch.clone();
                let job: Box<dyn FnOnce() + Send + '_> = Box::new(move || {
                    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(task));
                    done.count_down(result.is_err());
                });
                // SAFETY: `job` borrows `task`, which outlives this block, and `_wait` blocks
                // until every dispatched job has finished running, so erasing the lifetime never
                // lets a job run after its borrow ended.
                let job: Job = unsafe { std::mem::transmute(job) };
                if let Err(mpsc::SendError(job)) = self.sender.lock().send(job) {
                    drop(job);
                    latch.count_down(false);
                }
            }
            task();
        }
        if latch.panics() > 0 {
            panic!("a blockdev I/O thread panicked");
        }
    }
}

/// Counts dispatched jobs that have not finished.
#[derive(Default)]
struct Latch {
    pending: Mutex<usize>,
    finished: Condvar,
    panicked: AtomicUsize,
}

impl Latch {
    fn count_up(&self) {
        *self.pending.lock() += 1;
    }

    fn count_down(&self, panicked: bool) {
        if panicked {
            self.panicked.fetch_add(1, Ordering::Relaxed);
        }
        let mut pending = self.pending.lock();
        assert!(*pending > 0, "latch counted down below zero");
        *pending -= 1;
        if *pending == 0 {
            self.finished.notify_all();
        }
    }

    fn panics(&self) -> usize {
        self.panicked.load(Ordering::Relaxed)
    }
}

struct LatchWait<'a>(&'a Latch);

impl Drop for LatchWait<'_> {
    fn drop(&mut self) {
        let mut pending = self.0.pending.lock();
        while *pending > 0 {
            self.0.finished.wait(&mut pending);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_pool_runs_every_copy_before_returning() {
        let pool = ThreadPool::new(3);
        for _ in 0..50 {
            let ran = AtomicUsize::new(0);
            pool.run(3, &|| {
                ran.fetch_add(1, Ordering::Relaxed);
            });
            assert_eq!(ran.load(Ordering::Relaxed), 4);
        }
    }

    #[test]
    #[should_panic(expected = "I/O thread panicked")]
    fn a_panic_in_a_pool_thread_reaches_the_caller() {
        let pool = ThreadPool::new(1);
        let caller = std::thread::current().id();
        pool.run(1, &|| {
            if std::thread::current().id() != caller {
                panic!("boom");
            }
        });
    }
}
