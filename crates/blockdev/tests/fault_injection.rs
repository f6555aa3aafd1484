//! Behaviour of the fault-injecting device.

use std::sync::Arc;

use blockdev::fault::{Fault, FaultDevice, FaultOn};
use blockdev::memory::MemDevice;
use blockdev::recording::{RecordedOp, RecordingDevice};
use blockdev::{BlockDevice, DeviceError, Op, Write};

fn over_recording() -> (Arc<RecordingDevice>, FaultDevice) {
    let inner = Arc::new(RecordingDevice::new(vec![0; 64 * 1024]));
    let dev = FaultDevice::new(inner.clone());
    (inner, dev)
}

fn flushes(ops: &[RecordedOp]) -> usize {
    ops.iter().filter(|op| matches!(op, RecordedOp::Flush { .. })).count()
}

#[test]
fn fault_device_fails_the_chosen_flush_and_later_ones_when_sticky() {
    let (inner, dev) = over_recording();
    dev.inject(Fault::new(FaultOn::Flush).after(2).sticky());
    dev.flush().unwrap();
    dev.flush().unwrap();
    for _ in 0..3 {
        let err = dev.flush().unwrap_err();
        assert!(matches!(err, DeviceError::Io { op: Op::Flush, .. }), "{err}");
        assert_eq!(err.errno(), libc::EIO);
    }
    // Writes are unaffected by a flush fault.
    dev.write_at(0, &[1; 512]).unwrap();
    assert_eq!(dev.injected_failures(), 3);
    assert_eq!(flushes(&inner.ops()), 2, "a failed flush reached the inner device");
}

#[test]
fn fault_device_fails_the_chosen_flush_only_once_when_not_sticky() {
    let (inner, dev) = over_recording();
    dev.inject(Fault::new(FaultOn::Flush).after(1));
    dev.flush().unwrap();
    assert!(dev.flush().is_err());
    dev.flush().unwrap();
    assert_eq!(flushes(&inner.ops()), 2);
}

#[test]
fn failing_write_never_reaches_the_inner_device_and_carries_its_offset() {
    let (inner, dev) = over_recording();
    dev.inject(Fault::new(FaultOn::WriteFua).errno(libc::ENOSPC));
    dev.write_at(4096, &[1; 4096]).unwrap();
    let err = dev.write_fua_at(8192, &[2; 4096]).unwrap_err();
    assert!(matches!(err, DeviceError::Io { op: Op::WriteFua, offset: 8192, .. }), "{err}");
    assert_eq!(err.errno(), libc::ENOSPC);
    assert_eq!(inner.ops().len(), 1);
    assert!(inner.live_image()[8192..12288].iter().all(|&b| b == 0));
}

#[test]
fn any_write_fault_matches_plain_fua_and_batch_writes() {
    let (_inner, dev) = over_recording();
    dev.inject(Fault::new(FaultOn::AnyWrite).sticky());
    assert!(dev.write_at(0, &[1; 512]).is_err());
    assert!(dev.write_fua_at(0, &[1; 512]).is_err());
    let batch = [Write { offset: 0, data: &[1; 512], fua: false }];
    assert!(dev.write_batch(&batch).is_err());
    assert_eq!(dev.injected_failures(), 3);
}

#[test]
fn fault_device_fails_one_batch_member_and_submits_the_rest() {
    let (inner, dev) = over_recording();
    // The second plain member of the batch fails; the FUA member is not counted by this fault.
    dev.inject(Fault::new(FaultOn::Write).after(1));
    let a = [1u8; 4096];
    let b = [2u8; 4096];
    let c = [3u8; 4096];
    let batch = [
        Write { offset: 0, data: &a, fua: false },
        Write { offset: 4096, data: &b, fua: true },
        Write { offset: 8192, data: &c, fua: false },
    ];
    let err = dev.write_batch(&batch).unwrap_err();
    assert!(matches!(err, DeviceError::Io { op: Op::Write, offset: 8192, .. }), "{err}");
    let image = inner.live_image();
    assert_eq!(&image[..4096], &a[..]);
    assert_eq!(&image[4096..8192], &b[..]);
    assert!(image[8192..12288].iter().all(|&x| x == 0));
    assert_eq!(dev.injected_failures(), 1);
}

#[test]
fn read_faults_respect_the_offset_range() {
    let inner: Arc<dyn BlockDevice> = Arc::new(MemDevice::from_bytes(vec![5; 16 * 1024]));
    let dev = FaultDevice::new(inner);
    dev.inject(Fault::new(FaultOn::Read).in_range(4096..8192).sticky());
    let mut buf = vec![0; 4096];
    dev.read_at(0, &mut buf).unwrap();
    dev.read_at(8192, &mut buf).unwrap();
    assert!(dev.read_at(4096, &mut buf).is_err());
    // Overlapping the range by one sector is enough to match.
    let mut two = vec![0; 1024];
    assert!(dev.read_at(3584, &mut two).is_err());
    dev.clear();
    dev.read_at(4096, &mut buf).unwrap();
    assert_eq!(buf, vec![5; 4096]);
}

#[test]
fn concurrent_ops_each_count_once_against_a_fault() {
    let inner: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(64 * 1024));
    let dev = FaultDevice::new(inner);
    dev.inject(Fault::new(FaultOn::Write).after(100));
    let failures = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            let (dev, failures) = (&dev, &failures);
            scope.spawn(move || {
                for i in 0..50u64 {
                    if dev.write_at((t * 8 + i % 8) * 512, &[t as u8; 512]).is_err() {
                        failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
    });
    // 200 writes, the 101st fails, once.
    assert_eq!(failures.into_inner(), 1);
    assert_eq!(dev.injected_failures(), 1);
}
