//! Multi-version shadow paging (CJFS, FAST'23): every transaction in flight logs the contents
//! it froze, however the buffer changes after it. The CJFS artifact attaches a buffer to the
//! running transaction T+1 without a copy when the buffer's version slot is free, so until
//! the commit thread reaches the buffer T's log image can carry T+1's bytes
//! (`../shared/reference/jbd2-cjfs-notes.md` §1.5). quill freezes every buffer of T before T+1
//! can start, and writers copy on write from then on; these tests hold T's log write in flight
//! while T+1 changes the buffer, and look at what T logged.

mod common;

use blockdev::memory::MemDevice;
use common::*;
use journal::recover;
use ondisk::jbd2::ChecksumVersion;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

const BLOCK: u64 = 40;

/// Holds the first log write batch once armed, and keeps a copy of every batch's blocks as
/// they are when the write finally goes out.
#[derive(Default)]
struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Default)]
struct GateState {
    armed: bool,
    holding: bool,
    released: bool,
    batches: Vec<Vec<Vec<u8>>>,
}

impl Gate {
    fn pass(&self, writes: &[blockdev::Write<'_>]) {
        let mut st = self.state.lock().unwrap();
        if st.armed {
            st.armed = false;
            st.holding = true;
            self.changed.notify_all();
            while !st.released {
                st = self.changed.wait(st).unwrap();
            }
            st.holding = false;
        }
        // Copied after the hold: a writer that changed the frozen copy in place shows here.
        st.batches.push(writes.iter().map(|w| w.data.to_vec()).collect());
    }

    fn wait_holding(&self) {
        let st = self.state.lock().unwrap();
        let (st, timeout) =
            self.changed.wait_timeout_while(st, Duration::from_secs(30), |st| !st.holding).unwrap();
        assert!(!timeout.timed_out() && st.holding, "the commit never wrote its log blocks");
    }

    fn release(&self) {
        self.state.lock().unwrap().released = true;
        self.changed.notify_all();
    }
}

/// T1 fills the block with 0x11 and its log write is held; T2 fills it with 0x22 meanwhile.
/// With several versions T2 must not wait for T1's write; with one (JBD2) it must. Either
/// way T1's log carries 0x11 only, T2's 0x22, and recovery ends with 0x22.
fn next_transaction_changes_a_buffer_whose_log_write_is_in_flight(spec: &str) {
    let config = config(spec);
    let versions = config.versions_max;
    let (mem, loc) = formatted_mem(1024, ChecksumVersion::V3);
    let gate = Arc::new(Gate::default());
    let dev = Arc::new(HookedDevice {
        inner: MemDevice::from_bytes(mem.snapshot()),
        hook: {
            let gate = gate.clone();
            move |writes: &[blockdev::Write<'_>]| gate.pass(writes)
        },
    });
    let journal = Arc::new(open(dev.clone(), &loc, config));
    let buffer = journal.read_buffer(BLOCK).unwrap();

    gate.state.lock().unwrap().armed = true;
    let mut h1 = journal.start(1).unwrap();
    h1.modify(&buffer, fill(0x11)).unwrap();
    let t1 = h1.stop().unwrap();
    let fsync1 = {
        let journal = journal.clone();
        std::thread::spawn(move || journal.commit_and_wait(t1))
    };
    gate.wait_holding();

    let (done_tx, done_rx) = mpsc::channel();
    let writer = {
        let journal = journal.clone();
        let buffer = buffer.clone();
        std::thread::spawn(move || {
            let mut h2 = journal.start(1).unwrap();
            h2.modify(&buffer, fill(0x22)).unwrap();
            let t2 = h2.stop().unwrap();
            done_tx.send(()).unwrap();
            t2
        })
    };
    if versions > 1 {
        done_rx.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|_| {
            panic!("{spec}: T2 waited for T1's log write despite {versions} versions")
        });
        assert!(buffer.read(|b| b.iter().all(|&x| x == 0x22)), "{spec}: T2 sees its own bytes");
    } else {
        // JBD2: the writer waits while the single frozen copy is being logged.
        assert!(
            done_rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "{spec}: T2 changed a buffer whose only version was being logged"
        );
    }
    gate.release();
    fsync1.join().unwrap().unwrap();
    let t2 = writer.join().unwrap();
    assert!(t2.is_after(t1), "{spec}: T2 is a later transaction");
    journal.commit_and_wait(t2).unwrap();

    let bs = BLOCK_SIZE as usize;
    let batches = gate.state.lock().unwrap().batches.clone();
    let filled = |batch: &Vec<Vec<u8>>, byte: u8| {
        batch.iter().flat_map(|w| w.chunks(bs)).any(|b| b.iter().all(|&x| x == byte))
    };
    let first = &batches[0];
    assert!(filled(first, 0x11), "{spec}: T1 logged its block");
    assert!(!filled(first, 0x22), "{spec}: T1's log image carries T2's bytes");
    assert!(batches[1..].iter().any(|b| filled(b, 0x22)), "{spec}: T2 logged its block");

    let image = dev.inner.snapshot();
    let Ok(journal) = Arc::try_unwrap(journal) else { panic!("every thread is joined") };
    journal.abandon();
    let crashed = MemDevice::from_bytes(image);
    recover(&crashed, &loc, 1).unwrap();
    assert!(read_block(&crashed, BLOCK).iter().all(|&x| x == 0x22), "{spec}: recovered T2");
}

#[test]
fn every_in_flight_version_logs_what_its_transaction_froze() {
    for spec in ["cjfs", "cjfs,versions_max=2", "all"] {
        next_transaction_changes_a_buffer_whose_log_write_is_in_flight(spec);
    }
}

#[test]
fn with_one_version_the_next_writer_waits_for_the_log_write_as_in_jbd2() {
    for spec in ["classic", "barrierfs", "fast18"] {
        next_transaction_changes_a_buffer_whose_log_write_is_in_flight(spec);
    }
}
