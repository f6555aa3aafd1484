//! Behaviour of the file-backed device, buffered and O_DIRECT.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use blockdev::file::{FileDevice, FileOptions, BOUNCE_BYTES_MAX};
use blockdev::{BlockDevice, DeviceError, Op, Write};

/// A file path unique to this test run, removed when dropped.
struct TempPath(PathBuf);

impl TempPath {
    fn new(name: &str) -> TempPath {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        TempPath(dir.join(format!("blockdev-{}-{n}-{name}.img", std::process::id())))
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt)).collect()
}

/// Opens with O_DIRECT, or returns None (after saying why) where the file system refuses it.
fn open_direct(path: &TempPath) -> Option<FileDevice> {
    match FileDevice::open(&path.0, FileOptions { read_only: false, direct: true }) {
        Ok(dev) => Some(dev),
        Err(e) if e.errno() == libc::EINVAL => {
            eprintln!("skipping: O_DIRECT is not supported for {}: {e}", path.0.display());
            None
        }
        Err(e) => panic!("opening with O_DIRECT: {e}"),
    }
}

#[test]
fn file_device_round_trips_reads_and_writes() {
    let path = TempPath::new("round-trip");
    let dev = FileDevice::create(&path.0, 1 << 20).unwrap();
    assert_eq!(dev.size_bytes(), 1 << 20);
    let data = pattern(3 * 512, 7);
    dev.write_at(512, &data).unwrap();
    dev.flush().unwrap();
    let mut back = vec![0; data.len()];
    dev.read_at(512, &mut back).unwrap();
    assert_eq!(back, data);
    let mut zeros = vec![1; 512];
    dev.read_at(0, &mut zeros).unwrap();
    assert_eq!(zeros, vec![0; 512]);
}

#[test]
fn created_file_is_sparse() {
    let path = TempPath::new("sparse");
    let dev = FileDevice::create(&path.0, 64 << 20).unwrap();
    dev.write_at(0, &[1; 4096]).unwrap();
    let meta = std::fs::metadata(&path.0).unwrap();
    assert_eq!(meta.len(), 64 << 20);
    assert!(meta.blocks() * 512 < 1 << 20, "{} bytes allocated", meta.blocks() * 512);
}

#[test]
fn file_device_fua_write_survives_reopen() {
    let path = TempPath::new("fua");
    let data = pattern(8192, 3);
    {
        let dev = FileDevice::create(&path.0, 1 << 20).unwrap();
        dev.write_fua_at(4096, &data).unwrap();
    }
    let dev = FileDevice::open(&path.0, FileOptions { read_only: true, direct: false }).unwrap();
    let mut back = vec![0; data.len()];
    dev.read_at(4096, &mut back).unwrap();
    assert_eq!(back, data);
}

#[test]
fn o_direct_device_round_trips_unaligned_caller_buffers() {
    let path = TempPath::new("direct");
    let size = 4 << 20;
    drop(FileDevice::create(&path.0, size).unwrap());
    let Some(dev) = open_direct(&path) else {
        return;
    };
    assert!(dev.options().direct);

    // Offset by one byte so the caller's slices are certainly not sector-aligned in memory.
    let big_len = BOUNCE_BYTES_MAX * 2 + 4096;
    let mut storage = vec![0u8; big_len + 1];
    storage[1..].copy_from_slice(&pattern(big_len, 9));
    let big = &storage[1..];
    let small = &storage[1..1 + 1536];
    dev.write_at(512, big).unwrap();
    dev.write_fua_at(3 << 20, small).unwrap();
    dev.flush().unwrap();

    let mut read_storage = vec![0u8; big_len + 3];
    let back = &mut read_storage[3..];
    dev.read_at(512, back).unwrap();
    assert!(back == big, "large O_DIRECT read differs from what was written");
    let mut small_storage = vec![0u8; 1536 + 1];
    dev.read_at(3 << 20, &mut small_storage[1..]).unwrap();
    assert_eq!(&small_storage[1..], small);

    // The same bytes are visible through the page cache after reopening buffered.
    drop(dev);
    let buffered = FileDevice::open(&path.0, FileOptions::default()).unwrap();
    let mut check = vec![0u8; 4096];
    buffered.read_at(512, &mut check).unwrap();
    assert_eq!(&check[..], &big[..4096]);
}

#[test]
fn file_device_parallel_batch_writes_every_member() {
    let path = TempPath::new("batch");
    let dev = FileDevice::create(&path.0, 1 << 20).unwrap().with_parallelism(4);
    let blocks: Vec<Vec<u8>> = (0..64).map(|i| pattern(4096, i as u8)).collect();
    let batch: Vec<Write<'_>> = blocks
        .iter()
        .enumerate()
        .map(|(i, data)| Write { offset: (i * 4096) as u64, data, fua: i % 16 == 0 })
        .collect();
    dev.write_batch(&batch).unwrap();
    dev.flush().unwrap();
    for (i, data) in blocks.iter().enumerate() {
        let mut back = vec![0; 4096];
        dev.read_at((i * 4096) as u64, &mut back).unwrap();
        assert_eq!(&back, data, "batch member {i}");
    }
}

#[test]
fn batch_with_an_invalid_member_writes_nothing() {
    let path = TempPath::new("bad-batch");
    let dev = FileDevice::create(&path.0, 64 * 1024).unwrap();
    let data = [7u8; 4096];
    let mut batch: Vec<Write<'_>> =
        (0..8).map(|i| Write { offset: i * 4096, data: &data, fua: false }).collect();
    batch.push(Write { offset: 64 * 1024, data: &data, fua: false });
    let err = dev.write_batch(&batch).unwrap_err();
    assert!(matches!(err, DeviceError::OutOfRange { .. }), "{err}");
    let mut back = vec![1; 4096];
    dev.read_at(0, &mut back).unwrap();
    assert_eq!(back, vec![0; 4096]);
}

#[test]
fn read_only_file_device_rejects_writes_with_erofs() {
    let path = TempPath::new("ro");
    drop(FileDevice::create(&path.0, 8192).unwrap());
    let dev = FileDevice::open(&path.0, FileOptions { read_only: true, direct: false }).unwrap();
    let err = dev.write_at(0, &[0; 512]).unwrap_err();
    assert!(matches!(err, DeviceError::Io { op: Op::Write, offset: 0, .. }), "{err}");
    assert_eq!(err.errno(), libc::EROFS);
    assert_eq!(dev.write_fua_at(512, &[0; 512]).unwrap_err().errno(), libc::EROFS);
    dev.flush().unwrap();
}

#[test]
fn file_size_ignores_a_trailing_partial_sector() {
    let path = TempPath::new("odd");
    std::fs::write(&path.0, vec![0u8; 4096 + 100]).unwrap();
    let dev = FileDevice::open(&path.0, FileOptions::default()).unwrap();
    assert_eq!(dev.size_bytes(), 4096);
    let mut buf = vec![0; 512];
    let err = dev.read_at(4096, &mut buf).unwrap_err();
    assert!(matches!(err, DeviceError::OutOfRange { op: Op::Read, .. }), "{err}");
}

#[test]
fn opening_a_directory_is_an_error_naming_it() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let err = FileDevice::open(&dir, FileOptions { read_only: true, direct: false }).unwrap_err();
    assert!(matches!(err, DeviceError::Open { .. }), "{err}");
    assert!(err.to_string().contains(&*dir.to_string_lossy()), "{err}");
}
