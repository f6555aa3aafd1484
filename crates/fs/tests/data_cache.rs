//! The file data cache and the bounded caches: cached writes reach the disk only through
//! writeback (fsync, sync, unmount, memory pressure, the flusher); dirty data stays under its
//! bound; the metadata cache stays under its bound; a read-only open writes nothing; and the
//! `errors=` policy decides what an I/O error does.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use blockdev::fault::{Fault, FaultDevice, FaultOn};
use blockdev::memory::MemDevice;
use blockdev::BlockDevice;
use common::{assert_fsck_clean, create_fsynced, have, Rng, Scratch};
use fs::{ErrorPolicy, Filesystem, FsError, MountOptions, ROOT_INO};

/// A fresh 64 MiB file system (quill's mkfs) on a memory device.
fn fresh(block_size: u32) -> Arc<MemDevice> {
    fresh_sized(block_size, 64 << 20)
}

fn fresh_sized(block_size: u32, bytes: u64) -> Arc<MemDevice> {
    let dev = Arc::new(MemDevice::new(bytes));
    let options = fs::mkfs::MkfsOptions { device_zeroed: true, block_size, ..Default::default() };
    fs::mkfs::mkfs(dev.as_ref(), &options).expect("mkfs");
    dev
}

fn open(dev: &Arc<MemDevice>, options: MountOptions) -> Filesystem {
    Filesystem::open(dev.clone() as Arc<dyn BlockDevice>, options).expect("open")
}

/// e2fsck -fn on the device's current bytes.
fn fsck(dev: &MemDevice, test: &str) {
    if !have("e2fsck", test) {
        return;
    }
    let scratch = Scratch::new(test);
    let image = scratch.path("fs.img");
    std::fs::write(&image, dev.snapshot()).unwrap();
    assert_fsck_clean(&image);
}

fn read_all(fs: &Filesystem, ino: u32) -> Vec<u8> {
    let size = fs.getattr(ino).unwrap().size as usize;
    let mut buf = vec![0u8; size];
    assert_eq!(fs.read(ino, 0, &mut buf).unwrap(), size);
    buf
}

#[test]
fn written_data_is_durable_after_fsync_and_only_cached_before() {
    let dev = fresh(4096);
    let fs = open(&dev, MountOptions::default());
    let synced = fs.create(ROOT_INO, b"synced", 0o644, 0, 0).unwrap().ino;
    let cached = fs.create(ROOT_INO, b"cached", 0o644, 0, 0).unwrap().ino;
    fs.sync().unwrap();
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + 1) as u8).collect();
    fs.write(synced, 0, &data).unwrap();
    fs.write(cached, 0, &data).unwrap();
    // Cached: readable, counted in st_size and st_blocks, not yet on the disk.
    let blocks_4k = data.len().div_ceil(4096) as u64;
    assert!(fs.dirty_bytes() >= 2 * blocks_4k * 4096);
    let attr = fs.getattr(cached).unwrap();
    assert_eq!(attr.size, data.len() as u64);
    assert_eq!(attr.blocks, blocks_4k * 8);
    assert_eq!(read_all(&fs, cached), data);
    fs.fsync(synced, false).unwrap();
    fs.crash();

    // After the crash: the fsynced file has everything, the cached one nothing (its creation
    // was synced, its data never was).
    let fs = open(&dev, MountOptions::default());
    assert_eq!(read_all(&fs, fs.resolve("/synced").unwrap()), data);
    let cached = fs.resolve("/cached").unwrap();
    assert_eq!(fs.getattr(cached).unwrap().size, 0);
    assert_eq!(fs.getattr(cached).unwrap().blocks, 0);
    fs.unmount().unwrap();
    fsck(&dev, "written_data_is_durable_after_fsync");
}

#[test]
fn dirty_data_stays_under_its_bound_while_a_large_file_streams_through() {
    let dev = fresh(4096);
    let limit = 1 << 20;
    let options = MountOptions { dirty_bytes_max: limit, ..MountOptions::default() };
    let fs = open(&dev, options);
    let files: Vec<u32> = (0..3)
        .map(|i| fs.create(ROOT_INO, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap().ino)
        .collect();
    let chunk = 48 * 1024 + 123; // unaligned, so pages straddle writes
    let seed = common::seed("dirty bound");
    let mut rng = Rng::new(seed);
    let mut expected = vec![Vec::new(); files.len()];
    let mut peak = 0;
    for step in 0..400 {
        let which = step % files.len();
        let bytes = rng.bytes(chunk);
        let offset = expected[which].len() as u64;
        assert_eq!(fs.write(files[which], offset, &bytes).unwrap(), chunk);
        expected[which].extend_from_slice(&bytes);
        peak = peak.max(fs.dirty_bytes());
        // One write may take the total past the limit by its own size before it writes back.
        assert!(fs.dirty_bytes() <= limit, "dirty {} after a write", fs.dirty_bytes());
    }
    println!("peak dirty bytes {peak} (limit {limit}) for {} MiB written", (400 * chunk) >> 20);
    assert!(peak > limit / 2, "the cache was used");
    for (ino, want) in files.iter().zip(&expected) {
        assert!(read_all(&fs, *ino) == *want, "contents of inode {ino}");
    }
    fs.unmount().unwrap();
    let fs = open(&dev, MountOptions::default());
    for (i, want) in expected.iter().enumerate() {
        let ino = fs.resolve(&format!("/f{i}")).unwrap();
        assert!(read_all(&fs, ino) == *want, "contents of f{i} after remount");
    }
    fs.unmount().unwrap();
    fsck(&dev, "dirty_data_stays_under_its_bound");
}

/// Writeback borrows blocks from the metadata pool for extent-tree nodes, step by step: a file
/// of hundreds of one-block runs written back on a nearly full disk must give them back as it
/// goes (it once kept them until the whole file was written, and ran out).
#[test]
fn writeback_of_many_runs_on_a_nearly_full_disk_succeeds() {
    let dev = fresh_sized(4096, 12 << 20);
    let fs = open(&dev, MountOptions::default());
    let ino = fs.create(ROOT_INO, b"sparse", 0o644, 0, 0).unwrap().ino;
    let mut written = 0u64;
    loop {
        match fs.write(ino, written * 2 * 4096, &[7u8; 100]) {
            Ok(_) => written += 1,
            Err(FsError::NoSpace) => break,
            Err(err) => panic!("write {written}: {err}"),
        }
    }
    println!("{written} one-block runs cached before ENOSPC; {:?}", fs.statfs());
    assert!(written > 100);
    fs.sync().expect("writeback of a full disk");
    assert_eq!(fs.dirty_bytes(), 0);
    let attr = fs.getattr(ino).unwrap();
    fs.unmount().unwrap();
    let fs = open(&dev, MountOptions::default());
    let mut buf = vec![0u8; 100];
    fs.read(fs.resolve("/sparse").unwrap(), (written - 1) * 2 * 4096, &mut buf).unwrap();
    assert_eq!(buf, vec![7u8; 100]);
    assert_eq!(fs.getattr(attr.ino).unwrap().size, attr.size);
    fs.unmount().unwrap();
    fsck(&dev, "writeback_of_many_runs");
}

#[test]
fn truncating_cached_data_keeps_zeros_past_the_new_end() {
    for block_size in [1024, 4096] {
        let dev = fresh(block_size);
        let fs = open(&dev, MountOptions::default());
        let ino = fs.create(ROOT_INO, b"t", 0o644, 0, 0).unwrap().ino;
        // Part on disk, part cached past the on-disk end.
        fs.write(ino, 0, &[1u8; 5000]).unwrap();
        fs.fsync(ino, false).unwrap();
        fs.write(ino, 5000, &[2u8; 20000]).unwrap();
        // Shrink inside the cached part, then inside the on-disk part, then grow again.
        fs.truncate(ino, 12_345).unwrap();
        let mut want = vec![1u8; 5000];
        want.extend_from_slice(&[2u8; 7345]);
        assert_eq!(read_all(&fs, ino), want);
        fs.truncate(ino, 3000).unwrap();
        fs.truncate(ino, 9000).unwrap();
        let mut want = vec![1u8; 3000];
        want.resize(9000, 0);
        assert_eq!(read_all(&fs, ino), want);
        // A write past the end leaves zeros in the gap.
        fs.write(ino, 15_000, b"end").unwrap();
        want.resize(15_000, 0);
        want.extend_from_slice(b"end");
        assert_eq!(read_all(&fs, ino), want);
        fs.unmount().unwrap();
        let fs = open(&dev, MountOptions::default());
        assert_eq!(read_all(&fs, fs.resolve("/t").unwrap()), want, "{block_size}-byte blocks");
        fs.unmount().unwrap();
        fsck(&dev, "truncating_cached_data");
    }
}

#[test]
fn the_flusher_writes_back_expired_data() {
    let dev = fresh(4096);
    let options =
        MountOptions { dirty_expire: Duration::from_millis(100), ..MountOptions::default() };
    let fs = Arc::new(open(&dev, options));
    let flusher = fs.start_flusher(Duration::from_millis(50)).unwrap();
    let ino = fs.create(ROOT_INO, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write(ino, 0, &[9u8; 100_000]).unwrap();
    assert!(fs.dirty_bytes() > 0);
    let started = Instant::now();
    while fs.dirty_bytes() > 0 && started.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(fs.dirty_bytes(), 0, "the flusher wrote the data back");
    flusher.stop();
    let fs = Arc::try_unwrap(fs).expect("only owner");
    fs.unmount().unwrap();
    let fs = open(&dev, MountOptions::default());
    assert_eq!(read_all(&fs, fs.resolve("/f").unwrap()), vec![9u8; 100_000]);
    fs.unmount().unwrap();
}

#[test]
fn replacing_a_file_by_rename_writes_its_data_first() {
    let dev = fresh(4096);
    let fs = open(&dev, MountOptions::default());
    let old = fs.create(ROOT_INO, b"config", 0o644, 0, 0).unwrap().ino;
    fs.write(old, 0, b"old contents").unwrap();
    fs.fsync(old, false).unwrap();
    // The usual atomic replace, without fsync of the new file (ext4's auto_da_alloc case).
    let new = fs.create(ROOT_INO, b"config.tmp", 0o644, 0, 0).unwrap().ino;
    fs.write(new, 0, b"new contents!").unwrap();
    fs.rename(ROOT_INO, b"config.tmp", ROOT_INO, b"config", Default::default()).unwrap();
    fs.sync().unwrap();
    fs.crash();
    let fs = open(&dev, MountOptions::default());
    assert_eq!(read_all(&fs, fs.resolve("/config").unwrap()), b"new contents!");
    fs.unmount().unwrap();
}

/// Truncate-and-rewrite without fsync (ext4's auto_da_alloc on close): the data is written back
/// when the file closes, so the next periodic commit holds it together with the truncate.
#[test]
fn a_file_truncated_to_zero_is_written_back_at_close() {
    let dev = fresh(4096);
    let fs = open(&dev, MountOptions::default());
    let file = fs.create_file(ROOT_INO, b"state", 0o644).unwrap();
    file.write_at(0, b"version one").unwrap();
    file.sync_all().unwrap();
    drop(file);
    let file = fs.open_path("/state").unwrap();
    file.set_len(0).unwrap();
    file.write_at(0, b"version two, longer").unwrap();
    assert!(fs.dirty_bytes() > 0);
    drop(file);
    assert_eq!(fs.dirty_bytes(), 0, "written back at close");
    // The journal's periodic commit, not an fsync; then a crash.
    fs.journal().commit_all().unwrap();
    fs.crash();
    let fs = open(&dev, MountOptions::default());
    assert_eq!(read_all(&fs, fs.resolve("/state").unwrap()), b"version two, longer");
    fs.unmount().unwrap();
}

#[test]
fn the_metadata_cache_stays_near_its_bound() {
    let dev = fresh(4096);
    let fs = open(&dev, MountOptions::default());
    for d in 0..16 {
        let dir = fs.mkdir(ROOT_INO, format!("d{d}").as_bytes(), 0o755, 0, 0).unwrap().ino;
        for f in 0..150 {
            fs.create(dir, format!("f{f}").as_bytes(), 0o644, 0, 0).unwrap();
        }
    }
    fs.unmount().unwrap();

    // Walking 2400 inodes reads about 150 inode-table blocks plus directories and bitmaps;
    // a 64-block cache must not keep them all.
    let limit_blocks = 64u64;
    let options =
        MountOptions { metadata_cache_bytes: limit_blocks * 4096, ..MountOptions::default() };
    let fs = open(&dev, options);
    let mut peak = 0;
    let mut seen = 0;
    for d in 0..16 {
        let dir = fs.resolve(&format!("/d{d}")).unwrap();
        for entry in common::list_dir(&fs, dir, 50) {
            fs.getattr(entry.ino).unwrap();
            seen += 1;
            peak = peak.max(fs.journal().cached_buffers());
        }
    }
    println!("walked {seen} entries; peak cached metadata blocks {peak} (limit {limit_blocks})");
    assert!(seen > 2400);
    // A sweep runs when the cache passes the limit; between sweeps it may grow by a quarter.
    assert!(peak as u64 <= limit_blocks + limit_blocks / 4 + 2, "peak {peak}");
    fs.unmount().unwrap();
}

#[test]
fn a_read_only_open_writes_nothing() {
    let dev = fresh(4096);
    let fs = open(&dev, MountOptions::default());
    let ino = fs.create(ROOT_INO, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write(ino, 0, b"data").unwrap();
    fs.unmount().unwrap();
    let before = dev.snapshot();
    let fs = open(&dev, MountOptions { read_only: true, ..MountOptions::default() });
    assert_eq!(read_all(&fs, fs.resolve("/f").unwrap()), b"data");
    assert!(matches!(fs.create(ROOT_INO, b"g", 0o644, 0, 0), Err(FsError::ReadOnly)));
    assert!(matches!(fs.write(ino, 0, b"x"), Err(FsError::ReadOnly)));
    fs.sync().unwrap();
    fs.unmount().unwrap();
    assert!(dev.snapshot() == before, "a read-only open and unmount changed the device");
}

/// An I/O error while writing file data back, under each `errors=` policy.
#[test]
fn errors_policy_decides_what_an_io_error_does() {
    for policy in [ErrorPolicy::RemountReadOnly, ErrorPolicy::Continue] {
        let mem = fresh(4096);
        let faulty = Arc::new(FaultDevice::new(mem.clone() as Arc<dyn BlockDevice>));
        let options = MountOptions { errors: policy, ..MountOptions::default() };
        let fs = Filesystem::open(faulty.clone() as Arc<dyn BlockDevice>, options).unwrap();
        let ino = fs.create(ROOT_INO, b"f", 0o644, 0, 0).unwrap().ino;
        fs.sync().unwrap();
        fs.write(ino, 0, &[5u8; 8192]).unwrap();
        // Writeback's first plain write is the file's data.
        faulty.inject(Fault::new(FaultOn::Write));
        let err = fs.fsync(ino, false).unwrap_err();
        assert_eq!(err.errno(), fs::error::errno::EIO, "{policy:?}: {err}");
        match policy {
            ErrorPolicy::RemountReadOnly => {
                assert!(fs.is_read_only());
                let err = fs.create(ROOT_INO, b"g", 0o644, 0, 0).unwrap_err();
                assert_eq!(err.errno(), fs::error::errno::EROFS);
                let _ = fs.unmount();
                // The aborted journal never committed the half-done step: a clean image
                // once recovered.
                let fs = open(&mem, MountOptions::default());
                fs.unmount().unwrap();
                fsck(&mem, "errors_remount_ro");
            }
            ErrorPolicy::Continue => {
                assert!(!fs.is_read_only());
                // The data is still cached and a retry succeeds.
                fs.fsync(ino, false).unwrap();
                fs.create(ROOT_INO, b"g", 0o644, 0, 0).unwrap();
                assert_eq!(read_all(&fs, ino), vec![5u8; 8192]);
                fs.unmount().unwrap();
                let state = common::superblock_state(mem.clone());
                assert!(state & ondisk::ext4::STATE_ERROR_FS != 0, "state {state:#x}");
            }
        }
    }
}

#[test]
fn rereads_of_written_back_data_come_from_the_clean_cache_and_never_stale() {
    let test = "rereads_of_written_back_data_come_from_the_clean_cache_and_never_stale";
    for (cache_bytes, served) in [(8u64 << 20, true), (0, false)] {
        let mem = fresh(4096);
        let faulty = Arc::new(FaultDevice::new(mem.clone() as Arc<dyn BlockDevice>));
        let options = MountOptions { clean_cache_bytes: cache_bytes, ..MountOptions::default() };
        let fs = Filesystem::open(faulty.clone(), options).expect("open");
        let data: Vec<u8> = (0..256 * 1024).map(|i| (i % 251) as u8).collect();
        // Written back by the fsync, so the dirty cache no longer holds it.
        let ino = create_fsynced(&fs, b"reread", &data);
        assert!(read_all(&fs, ino) == data, "first read differs");
        // An overwrite, written back, is what the next read returns: the write dropped the
        // cached copy of its block.
        fs.write(ino, 8192, &[0xAB; 4096]).unwrap();
        fs.fsync(ino, false).unwrap();
        let mut expected = data.clone();
        expected[8192..12288].fill(0xAB);
        assert!(read_all(&fs, ino) == expected, "a read after the overwrite differs");
        assert!(fs.clean_cache_bytes() <= cache_bytes);
        // From here every device read fails: only the clean cache can answer.
        faulty.inject(Fault::new(FaultOn::Read).sticky());
        let again = common::read_all(&fs, ino);
        faulty.clear();
        if served {
            assert!(again.unwrap() == expected, "the cached re-read differs");
            assert!(fs.clean_cache_bytes() >= data.len() as u64, "{}", fs.clean_cache_bytes());
            fs.unmount().expect("unmount");
            fsck(&mem, test);
        } else {
            assert!(again.is_err(), "with no clean cache the re-read must reach the device");
            assert_eq!(fs.clean_cache_bytes(), 0);
        }
    }
}
