//! Behaviour of the file-backed device, buffered and O_DIRECT.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use blockdev::aligned::AlignedBuf;
use blockdev::file::{
    FileDevice, FileOptions, IoMode, SubmitMode, BOUNCE_BYTES_MAX, RUN_BYTES_MAX,
};
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
    match FileDevice::open(&path.0, FileOptions { io: IoMode::Direct, ..FileOptions::default() }) {
        Ok(dev) => Some(dev),
        Err(e) if e.errno() == libc::EINVAL => {
            eprintln!("skipping: O_DIRECT is not supported for {}: {e}", path.0.display());
            None
        }
        Err(e) => panic!("opening with O_DIRECT: {e}"),
    }
}

#[test]
fn the_default_io_path_is_buffered() {
    let path = TempPath::new("default");
    let dev = FileDevice::create(&path.0, 1 << 20).unwrap();
    assert!(!dev.is_direct(), "{}", dev.io_path());
    assert!(dev.io_path().to_string().starts_with("buffered I/O"), "{}", dev.io_path());
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
    let dev = FileDevice::open(&path.0, FileOptions::read_only()).unwrap();
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
    assert!(dev.is_direct());

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
    let buffered = FileDevice::open(&path.0, FileOptions::read_only()).unwrap();
    assert!(!buffered.is_direct());
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
    let dev = FileDevice::open(&path.0, FileOptions::read_only()).unwrap();
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
    let err = FileDevice::open(&dir, FileOptions::read_only()).unwrap_err();
    assert!(matches!(err, DeviceError::Open { .. }), "{err}");
    assert!(err.to_string().contains(&*dir.to_string_lossy()), "{err}");
}

/// Every (I/O mode, submission) pair the device can be opened with on a disk file system.
const PATHS: [(IoMode, SubmitMode); 4] = [
    (IoMode::Direct, SubmitMode::Auto),
    (IoMode::Direct, SubmitMode::Threads),
    (IoMode::Buffered, SubmitMode::Auto),
    (IoMode::Buffered, SubmitMode::Threads),
];

/// A batch with adjacent runs (to merge), gaps, mixed FUA, a write longer than one run, and
/// caller memory both aligned and not: (offset, bytes, fua).
fn mixed_batch(aligned: &AlignedBuf) -> Vec<(u64, Vec<u8>, bool)> {
    let mut batch = Vec::new();
    for i in 0..24u64 {
        // Blocks 0..24 contiguous except a gap at 10; every fifth one FUA (splitting runs).
        if i != 10 {
            batch.push((i * 4096, pattern(4096, i as u8), i % 5 == 0));
        }
    }
    batch.push((200 * 1024, pattern(512, 1), false));
    batch.push((200 * 1024 + 512, pattern(1536, 2), false));
    batch.push((1 << 20, pattern(RUN_BYTES_MAX * 2 + 8192, 3), true));
    batch.push((4 << 20, aligned.as_slice().to_vec(), false));
    batch
}

/// Writes `batch` through `write_batch`, with caller memory offset by one byte except for the
/// member at 4 MiB, which is written from `aligned` itself (O_DIRECT uses it in place).
fn write_mixed(dev: &FileDevice, batch: &[(u64, Vec<u8>, bool)], aligned: &AlignedBuf) {
    let shifted: Vec<Vec<u8>> = batch
        .iter()
        .map(|(_, data, _)| {
            let mut v = vec![0u8; data.len() + 1];
            v[1..].copy_from_slice(data);
            v
        })
        .collect();
    let writes: Vec<Write<'_>> = batch
        .iter()
        .zip(&shifted)
        .map(|((offset, expected, fua), v)| {
            let data = if *offset == 4 << 20 { aligned.as_slice() } else { &v[1..] };
            assert_eq!(data, &expected[..]);
            Write { offset: *offset, data, fua: *fua }
        })
        .collect();
    dev.write_batch(&writes).unwrap();
}

#[test]
fn merged_batch_writes_land_byte_identical_to_one_write_at_a_time_on_every_path() {
    let size = 8 << 20;
    let mut aligned = AlignedBuf::new(16384);
    aligned.as_mut_slice().copy_from_slice(&pattern(16384, 77));
    let batch = mixed_batch(&aligned);

    let reference = TempPath::new("merge-reference");
    let dev = FileDevice::create_with(
        &reference.0,
        size,
        FileOptions { io: IoMode::Buffered, ..FileOptions::default() },
    )
    .unwrap();
    for (offset, data, fua) in &batch {
        if *fua {
            dev.write_fua_at(*offset, data).unwrap();
        } else {
            dev.write_at(*offset, data).unwrap();
        }
    }
    dev.flush().unwrap();
    drop(dev);
    let expected = std::fs::read(&reference.0).unwrap();

    for (io, submit) in PATHS {
        let path = TempPath::new("merge");
        let options = FileOptions { io, submit, ..FileOptions::default() };
        let dev = match FileDevice::create_with(&path.0, size, options) {
            Err(e) if io == IoMode::Direct && e.errno() == libc::EINVAL => {
                println!("SKIP {io:?}: O_DIRECT refused here: {e}");
                continue;
            }
            result => result.unwrap(),
        };
        assert_eq!(dev.is_direct(), io == IoMode::Direct);
        assert!(!(submit == SubmitMode::Threads && dev.io_path().uring), "{}", dev.io_path());
        write_mixed(&dev, &batch, &aligned);
        dev.flush().unwrap();
        // Read back through the device, into aligned and unaligned memory, before the file.
        let mut back = AlignedBuf::new(16384);
        dev.read_at(4 << 20, back.as_mut_slice()).unwrap();
        assert_eq!(back.as_slice(), aligned.as_slice(), "{io:?}/{submit:?} aligned read");
        let mut odd = vec![0u8; 8192 + 1];
        dev.read_at(0, &mut odd[1..]).unwrap();
        assert_eq!(&odd[1..], &expected[..8192], "{io:?}/{submit:?} unaligned read");
        drop(dev);
        let got = std::fs::read(&path.0).unwrap();
        assert!(got == expected, "{io:?}/{submit:?}: image differs from unmerged writes");
    }
}

#[test]
fn auto_io_on_a_disk_file_system_is_direct_with_io_uring() {
    let path = TempPath::new("auto");
    let options = FileOptions { io: IoMode::Auto, ..FileOptions::default() };
    let dev = FileDevice::create_with(&path.0, 1 << 20, options).unwrap();
    let shown = dev.io_path().to_string();
    if !dev.is_direct() {
        println!("SKIP: {} does not take O_DIRECT: {shown}", path.0.display());
        return;
    }
    assert!(shown.starts_with("direct I/O"), "{shown}");
    if !dev.io_path().uring {
        println!("SKIP io_uring part: {shown}");
        return;
    }
    assert_eq!(shown, "direct I/O, io_uring submission");
}

#[test]
fn auto_io_on_tmpfs_falls_back_to_buffered_and_says_why() {
    let shm = PathBuf::from("/dev/shm");
    if !shm.is_dir() {
        println!("SKIP: no /dev/shm");
        return;
    }
    let path = TempPath(shm.join(format!("quill-blockdev-{}-auto.img", std::process::id())));
    let options = FileOptions { io: IoMode::Auto, ..FileOptions::default() };
    let dev = FileDevice::create_with(&path.0, 1 << 20, options).unwrap();
    assert!(!dev.is_direct(), "{}", dev.io_path());
    assert!(dev.io_path().to_string().contains("tmpfs"), "{}", dev.io_path());
    let data = pattern(8192, 5);
    dev.write_batch(&[
        Write { offset: 0, data: &data[..4096], fua: true },
        Write { offset: 4096, data: &data[4096..], fua: false },
    ])
    .unwrap();
    dev.flush().unwrap();
    let mut back = vec![0; 8192];
    dev.read_at(0, &mut back).unwrap();
    assert_eq!(back, data);
}

/// A tmpfs of `bytes` mounted at a fresh directory, unmounted (and removed) on drop.
struct TinyFs(PathBuf);

impl TinyFs {
    fn mount(bytes: u64) -> Option<TinyFs> {
        if unsafe { libc::geteuid() } != 0 {
            println!("SKIP: mounting a tiny tmpfs needs root");
            return None;
        }
        let dir = TempPath::new("tinyfs").0.with_extension("mnt");
        std::fs::create_dir_all(&dir).unwrap();
        let size = format!("size={bytes}");
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &size, "quill-tiny"])
            .arg(&dir)
            .output();
        match out {
            Ok(out) if out.status.success() => Some(TinyFs(dir)),
            Ok(out) => {
                println!("SKIP: mount tmpfs failed: {}", String::from_utf8_lossy(&out.stderr));
                let _ = std::fs::remove_dir(&dir);
                None
            }
            Err(e) => {
                println!("SKIP: mount not runnable: {e}");
                let _ = std::fs::remove_dir(&dir);
                None
            }
        }
    }
}

impl Drop for TinyFs {
    fn drop(&mut self) {
        let out = std::process::Command::new("umount").arg(&self.0).output();
        let unmounted = out.is_ok_and(|o| o.status.success());
        let _ = std::fs::remove_dir(&self.0);
        if !unmounted && !std::thread::panicking() {
            panic!("umount {} failed", self.0.display());
        }
    }
}

#[test]
fn a_batch_whose_write_the_file_system_refuses_reports_the_error_on_every_path() {
    // A 256 KiB file system holding a sparse 4 MiB device: writes past the free space fail
    // with ENOSPC in the kernel, after check_range let them through.
    let Some(tiny) = TinyFs::mount(256 * 1024) else {
        return;
    };
    let blocks: Vec<Vec<u8>> = (0..128).map(|i| pattern(4096, i as u8)).collect();
    // Every other block, so no two merge and the batch has 128 runs in flight.
    let batch: Vec<Write<'_>> = blocks
        .iter()
        .enumerate()
        .map(|(i, data)| Write { offset: (i * 8192) as u64, data, fua: i % 3 == 0 })
        .collect();
    for (io, submit) in PATHS {
        let image = tiny.0.join("device.img");
        let options = FileOptions { io, submit, ..FileOptions::default() };
        let dev = FileDevice::create_with(&image, 4 << 20, options).unwrap();
        let err = dev.write_batch(&batch).unwrap_err();
        assert_eq!(err.errno(), libc::ENOSPC, "{io:?}/{submit:?}: {err}");
        assert!(matches!(err, DeviceError::Io { op: Op::Write | Op::WriteFua, .. }), "{err}");
        drop(dev);
        std::fs::remove_file(&image).unwrap();
    }
}
