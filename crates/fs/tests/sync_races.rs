//! sync racing other operations: once `sync` returns, every write that completed before it
//! started is durable, or whatever replaced it is. These tests stop an operation part way
//! (its thread's device writes wait at a gate), run `sync` beside it, and recover the image
//! as it was when `sync` returned.

mod common;

use std::sync::{Arc, Condvar, Mutex};
use std::thread::ThreadId;
use std::time::Duration;

use blockdev::memory::MemDevice;
use blockdev::{BlockDevice, DeviceError, Write};
use common::{create_fsynced, have, mkfs, read_all, Scratch};
use fs::{DataMode, Filesystem, MountOptions};

/// Passes every call to a memory device; once armed with a thread, that thread's next write
/// waits until released.
struct GatedDevice {
    inner: MemDevice,
    gate: Mutex<Gate>,
    changed: Condvar,
}

#[derive(Default)]
struct Gate {
    armed: Option<ThreadId>,
    holding: bool,
    released: bool,
}

impl GatedDevice {
    fn pass(&self) {
        let mut gate = self.gate.lock().unwrap();
        if gate.armed != Some(std::thread::current().id()) || gate.released {
            return;
        }
        gate.holding = true;
        self.changed.notify_all();
        while !gate.released {
            gate = self.changed.wait(gate).unwrap();
        }
    }

    fn arm(&self) {
        self.gate.lock().unwrap().armed = Some(std::thread::current().id());
    }

    fn wait_holding(&self) -> bool {
        let gate = self.gate.lock().unwrap();
        let (gate, _) =
            self.changed.wait_timeout_while(gate, Duration::from_secs(10), |g| !g.holding).unwrap();
        gate.holding
    }

    fn release(&self) {
        self.gate.lock().unwrap().released = true;
        self.changed.notify_all();
    }
}

impl BlockDevice for GatedDevice {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        self.pass();
        self.inner.write_at(offset, data)
    }
    fn write_fua_at(&self, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        self.pass();
        self.inner.write_fua_at(offset, data)
    }
    fn flush(&self) -> Result<(), DeviceError> {
        self.inner.flush()
    }
    fn write_batch(&self, writes: &[Write<'_>]) -> Result<(), DeviceError> {
        self.pass();
        self.inner.write_batch(writes)
    }
}

fn pattern(tag: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| 1 + ((i * 31 + usize::from(tag) * 101) % 251) as u8).collect()
}

/// A file of 13,955 bytes on disk gets 3,052 cached bytes at 14,144, then a truncate to 4,039
/// stops at its first device write while another thread syncs. The sync started after the
/// write returned, so the image it leaves holds the written version (17,196 bytes) or the
/// truncated one (4,039), never the 13,955 bytes from before the write. The truncate used to
/// drop the cached pages before journaling its size, so the sync found the file clean and
/// committed the old size (found by a 100,000-image `quill crashtest --long`).
fn sync_during_a_truncate_that_cuts_cached_writes(data: DataMode) {
    let test = "sync_during_a_truncate_that_cuts_cached_writes";
    if !have("mkfs.ext4", test) {
        return;
    }
    let scratch = Scratch::new(test);
    let image = scratch.path("fs.img");
    mkfs(&image, "16M", &["-b", "1024"]);
    let dev = Arc::new(GatedDevice {
        inner: MemDevice::from_bytes(std::fs::read(&image).unwrap()),
        gate: Mutex::new(Gate::default()),
        changed: Condvar::new(),
    });
    let options = MountOptions { data, ..MountOptions::default() };
    let fs = Arc::new(Filesystem::open(dev.clone(), options.clone()).unwrap());
    let old = pattern(1, 13_955);
    let ino = create_fsynced(&fs, b"f", &old);
    let written = {
        let mut v = old.clone();
        v.resize(14_144, 0);
        v.extend(pattern(2, 3052));
        v
    };
    assert_eq!(fs.write(ino, 14_144, &written[14_144..]).unwrap(), 3052);
    let truncated = old[..4039].to_vec();

    let truncate = {
        let (fs, dev) = (fs.clone(), dev.clone());
        std::thread::spawn(move || {
            dev.arm();
            fs.truncate(ino, 4039)
        })
    };
    if !dev.wait_holding() {
        panic!("{data:?}: the truncate never wrote to the device: {:?}", truncate.join());
    }
    fs.sync().unwrap();
    let at_sync = dev.inner.snapshot();
    dev.release();
    truncate.join().unwrap().unwrap();
    assert_eq!(read_all(&fs, ino).unwrap(), truncated);
    let Ok(fs) = Arc::try_unwrap(fs) else { panic!("the truncate thread is joined") };
    fs.unmount().unwrap();

    let crashed = Arc::new(MemDevice::from_bytes(at_sync));
    let recovered = Filesystem::open(crashed, options).unwrap();
    let f = recovered.resolve("/f").unwrap();
    let got = read_all(&recovered, f).unwrap();
    assert!(
        got == written || got == truncated,
        "{data:?}: after the sync the file has {} bytes; expected the written {} or the \
         truncated {} (the write before the sync was lost)",
        got.len(),
        written.len(),
        truncated.len()
    );
}

/// data=ordered, where the truncate's first device write (zeroing the new last block's tail
/// in place) holds it. Under data=journal the same code path runs, but the truncate's thread
/// writes nothing to the device, so there is nothing to hold it at.
#[test]
fn a_sync_during_a_truncate_keeps_the_writes_the_truncate_cuts_or_the_truncate() {
    sync_during_a_truncate_that_cuts_cached_writes(DataMode::Ordered);
}
