//! Fsyncs that wait for the journal without holding a request thread.
//!
//! An fsync request spends nearly all its time waiting for a commit or a fast commit, and
//! while it waits on a request thread that thread serves nothing else: with the default four
//! threads, four fsyncs in flight leave the mount's other requests (the writes and creates
//! that would join the next commit) queued in the kernel, and cap group commit at four.
//! So at most `inline_max` fsyncs run on request threads; the next ones are handed to
//! waiter threads, which run them and reply, and the request thread goes back to reading
//! `/dev/fuse`. Waiters are spawned as fsyncs need them (up to [`WAITERS_MAX`]) and stay for
//! the mount's lifetime, idle between fsyncs; the handoff costs one wake-up, which is why the
//! first `inline_max` fsyncs skip it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

/// The most waiter threads a mount spawns; fsyncs beyond them queue for the next free one.
pub const WAITERS_MAX: usize = 256;

type Job = Box<dyn FnOnce() + Send>;

/// See the module documentation.
pub(crate) struct FsyncWaiters {
    inline_max: usize,
    /// Fsyncs running on request threads now.
    inline: AtomicUsize,
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// A job was queued, or the pool is stopping.
    work: Condvar,
    /// A handed-off job finished (for [`FsyncWaiters::wait_idle`]).
    done: Condvar,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Job>,
    /// Waiter threads spawned, and how many of them wait for a job now.
    waiters: usize,
    idle: usize,
    /// Handed-off jobs not yet finished.
    running: usize,
    stopping: bool,
}

impl FsyncWaiters {
    /// At most `inline_max` fsyncs at a time run on the request thread that received them.
    pub fn new(inline_max: usize) -> FsyncWaiters {
        FsyncWaiters { inline_max, inline: AtomicUsize::new(0), shared: Arc::default() }
    }

    /// Runs `job` (an fsync and its reply) on this request thread while fewer than
    /// `inline_max` do, else hands it to a waiter thread and returns at once.
    pub fn run(&self, job: impl FnOnce() + Send + 'static) {
        let claimed = self.inline.fetch_add(1, Ordering::AcqRel) < self.inline_max;
        if claimed {
            job();
            self.inline.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        self.inline.fetch_sub(1, Ordering::AcqRel);
        let spawn = {
            let mut state = self.shared.state.lock();
            state.queue.push_back(Box::new(job));
            state.running += 1;
            let spawn = state.idle < state.queue.len() && state.waiters < WAITERS_MAX;
            if spawn {
                state.waiters += 1;
            }
            spawn
        };
        if spawn {
            let shared = self.shared.clone();
            let spawned = std::thread::Builder::new()
                .name("quill-fsync".into())
                .spawn(move || shared.serve());
            if spawned.is_err() {
                // No thread: the queued job runs here after all (the request thread waits).
                self.shared.state.lock().waiters -= 1;
                self.shared.run_queued_here();
                return;
            }
        }
        self.shared.work.notify_one();
    }

    /// Waits until every handed-off fsync has replied (the mount is being torn down).
    pub fn wait_idle(&self) {
        let mut state = self.shared.state.lock();
        while state.running > 0 {
            self.shared.done.wait(&mut state);
        }
    }
}

impl Drop for FsyncWaiters {
    fn drop(&mut self) {
        self.shared.state.lock().stopping = true;
        self.shared.work.notify_all();
    }
}

impl Shared {
    /// A waiter thread: runs queued jobs until the pool stops.
    fn serve(&self) {
        let mut state = self.state.lock();
        loop {
            if let Some(job) = state.queue.pop_front() {
                drop(state);
                self.run_job(job);
                state = self.state.lock();
                continue;
            }
            if state.stopping {
                state.waiters -= 1;
                return;
            }
            state.idle += 1;
            self.work.wait(&mut state);
            state.idle -= 1;
        }
    }

    /// Runs whatever is queued on the calling thread.
    fn run_queued_here(&self) {
        loop {
            // The lock is let go before the job runs (`run_job` takes it again).
            let Some(job) = self.state.lock().queue.pop_front() else { return };
            self.run_job(job);
        }
    }

    /// Runs a handed-off job and counts it done (for [`FsyncWaiters::wait_idle`]).
    fn run_job(&self, job: Job) {
        job();
        self.state.lock().running -= 1;
        self.done.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;

    /// Past `inline_max`, fsyncs return to their request thread at once and finish on waiter
    /// threads, all of them at the same time: none waits for another's reply.
    #[test]
    fn fsyncs_past_the_inline_ones_wait_on_waiter_threads_together() {
        let waiters = Arc::new(FsyncWaiters::new(1));
        let all = 12;
        // Every handed-off job waits at the barrier: they can only pass it together.
        let barrier = Arc::new(Barrier::new(all - 1 + 1));
        let finished = Arc::new(AtomicUsize::new(0));
        let first = {
            let (waiters, barrier, finished) = (waiters.clone(), barrier.clone(), finished.clone());
            // The first fsync runs inline on its own "request thread" and holds its slot
            // until the others are handed off.
            std::thread::spawn(move || {
                waiters.run(move || {
                    barrier.wait();
                    finished.fetch_add(1, Ordering::SeqCst);
                })
            })
        };
        while waiters.inline.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        for _ in 1..all - 1 {
            let (barrier, finished) = (barrier.clone(), finished.clone());
            // Returns at once: handed off.
            waiters.run(move || {
                barrier.wait();
                finished.fetch_add(1, Ordering::SeqCst);
            });
        }
        assert_eq!(finished.load(Ordering::SeqCst), 0, "nothing passed the barrier yet");
        let last = finished.clone();
        waiters.run(move || {
            last.fetch_add(1, Ordering::SeqCst);
        });
        barrier.wait();
        first.join().unwrap();
        waiters.wait_idle();
        assert_eq!(finished.load(Ordering::SeqCst), all);
        let state = waiters.shared.state.lock();
        assert!(state.waiters >= all - 2 && state.waiters <= WAITERS_MAX, "{}", state.waiters);
    }

    /// With `inline_max` 0 every fsync is handed off, and `wait_idle` returns only once each
    /// has replied.
    #[test]
    fn wait_idle_waits_for_every_handed_off_fsync() {
        let waiters = FsyncWaiters::new(0);
        let finished = Arc::new(AtomicUsize::new(0));
        for _ in 0..50 {
            let finished = finished.clone();
            waiters.run(move || {
                std::thread::sleep(std::time::Duration::from_millis(2));
                finished.fetch_add(1, Ordering::SeqCst);
            });
        }
        waiters.wait_idle();
        assert_eq!(finished.load(Ordering::SeqCst), 50);
    }
}
