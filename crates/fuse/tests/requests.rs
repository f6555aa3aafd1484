//! Requests through a real FUSE mount, counted by the adapter's `RequestStats`. Needs root
//! and /dev/fuse (CI has both); without them it prints SKIP and returns.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use blockdev::memory::MemDevice;

/// Whether this process can mount FUSE itself; prints a SKIP line for `test` if not.
fn can_mount(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let fuse = Path::new("/dev/fuse").exists();
    if !root || !fuse {
        println!("SKIP {test}: needs root and /dev/fuse (root {root}, /dev/fuse {fuse})");
    }
    root && fuse
}

/// Mounts a fresh 64 MiB quill file system (in memory, with `options`) and runs `body` on the
/// mount point
/// with the mount's request counters; unmounts, and fails if `body` did or the unmount did.
fn with_mount(
    options: fs::MountOptions,
    body: impl FnOnce(&Path, &quill_fuse::RequestStats) + std::panic::UnwindSafe,
) {
    let dev = Arc::new(MemDevice::new(64 << 20));
    with_mount_on(dev, options, quill_fuse::MountConfig::default(), body);
}

/// [`with_mount`] on `dev` (zeroed), mounted with `config`.
fn with_mount_on(
    dev: Arc<dyn blockdev::BlockDevice>,
    options: fs::MountOptions,
    config: quill_fuse::MountConfig,
    body: impl FnOnce(&Path, &quill_fuse::RequestStats) + std::panic::UnwindSafe,
) {
    let mkfs = fs::mkfs::MkfsOptions { device_zeroed: true, ..Default::default() };
    fs::mkfs::mkfs(dev.as_ref(), &mkfs).unwrap();
    let fs = Arc::new(fs::Filesystem::open(dev, options).unwrap());
    static MOUNTS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = MOUNTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mountpoint =
        std::env::temp_dir().join(format!("quill-fuse-requests-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&mountpoint).unwrap();
    let stats = config.request_stats.clone();
    let session = quill_fuse::mount(fs.clone(), &mountpoint, &config).unwrap().spawn().unwrap();
    let result = std::panic::catch_unwind(|| body(&mountpoint, &stats));
    let umounted = Command::new("umount").arg(&mountpoint).status();
    session.join().unwrap();
    quill_fuse::unmount_fs(fs).unwrap();
    let _ = std::fs::remove_dir(&mountpoint);
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
    assert!(umounted.is_ok_and(|s| s.success()), "umount {}", mountpoint.display());
}

/// Requests of opcode `op` so far.
fn requests(stats: &quill_fuse::RequestStats, op: &str) -> u64 {
    stats.snapshot().ops.iter().find(|o| o.0 == op).map_or(0, |o| o.1)
}

/// quill answers FLUSH with ENOSYS (it has nothing to push at close): the kernel then answers
/// every later close itself, with success, and sends no more FLUSH requests.
#[test]
fn after_the_first_close_no_flush_request_reaches_quill() {
    if !can_mount("FUSE flush requests") {
        return;
    }
    let closes = 40;
    with_mount(fs::MountOptions::default(), |mnt, stats| {
        for i in 0..closes {
            // open, write, close: each close must succeed.
            std::fs::write(mnt.join(format!("f{i}")), format!("file {i}")).unwrap();
        }
        for i in 0..closes {
            let got = std::fs::read_to_string(mnt.join(format!("f{i}"))).unwrap();
            assert_eq!(got, format!("file {i}"));
        }
        // FLUSH is sent by close itself (RELEASE follows in the background, so it is not
        // counted here).
        let flushes = requests(stats, "flush");
        assert!(flushes <= 1, "{flushes} FLUSH requests for {} closes", 2 * closes);
    });
}

/// With noatime, opens keep the page cache (FOPEN_KEEP_CACHE): reading a file again after
/// reopening it sends no READ, and every change made through the mount (a write through
/// another descriptor, a truncate, a punched hole, a rename over it, an unlink while open) is
/// what the next read sees. With relatime (the default) every read reaches quill, which keeps
/// the access time as ext4 does.
#[test]
fn with_noatime_the_page_cache_kept_across_opens_follows_every_change_made_through_the_mount() {
    if !can_mount("FUSE page cache across opens") {
        return;
    }
    use std::io::{Read, Seek, SeekFrom, Write};
    use std::os::fd::AsRawFd;
    with_mount(fs::MountOptions::default(), |mnt, stats| {
        let path = mnt.join("relatime");
        std::fs::write(&path, b"read twice").unwrap();
        let reads = requests(stats, "read");
        for _ in 0..2 {
            assert_eq!(std::fs::read(&path).unwrap(), b"read twice");
        }
        assert_eq!(requests(stats, "read"), reads + 2, "relatime: each read reaches quill");
    });
    let noatime = fs::MountOptions { atime: fs::AtimeMode::Never, ..Default::default() };
    with_mount(noatime, |mnt, stats| {
        let path = mnt.join("f");
        let mut want = vec![b'a'; 3 * 4096];
        std::fs::write(&path, &want).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), want);
        let reads = requests(stats, "read");
        assert_eq!(std::fs::read(&path).unwrap(), want);
        assert_eq!(requests(stats, "read"), reads, "a reopened file is read from the cache");

        // A write through another descriptor, while one holds the file open.
        let mut held = std::fs::File::open(&path).unwrap();
        let mut other = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        other.seek(SeekFrom::Start(5000)).unwrap();
        other.write_all(b"written").unwrap();
        drop(other);
        want[5000..5007].copy_from_slice(b"written");
        let mut got = Vec::new();
        held.read_to_end(&mut got).unwrap();
        assert_eq!(got, want, "the held descriptor sees the other's write");
        assert_eq!(std::fs::read(&path).unwrap(), want);

        // Truncate, then grow back: the dropped tail reads as zeros.
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(4000).unwrap();
        file.set_len(3 * 4096).unwrap();
        drop(file);
        want[4000..].fill(0);
        assert_eq!(std::fs::read(&path).unwrap(), want);

        // A punched hole in the middle block.
        std::fs::write(&path, vec![b'b'; 3 * 4096]).unwrap();
        want = vec![b'b'; 3 * 4096];
        assert_eq!(std::fs::read(&path).unwrap(), want);
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        // SAFETY: a valid descriptor and a range inside the file.
        let punched = unsafe { libc::fallocate(file.as_raw_fd(), mode, 4096, 4096) };
        assert_eq!(punched, 0, "fallocate: {}", std::io::Error::last_os_error());
        drop(file);
        want[4096..8192].fill(0);
        assert_eq!(std::fs::read(&path).unwrap(), want);

        // A rename over it: the name now reads the other file.
        let other = mnt.join("g");
        std::fs::write(&other, b"the other file").unwrap();
        std::fs::rename(&other, &path).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"the other file");

        // Unlinked while open: the open descriptor still reads it; the name is gone.
        let mut held = std::fs::File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let mut got = Vec::new();
        held.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"the other file");
        assert!(std::fs::read(&path).is_err());
    });
}

/// Fsyncs past `fsync_inline` wait for the journal on waiter threads, not request threads:
/// with two request threads and one fsync allowed on them, twelve threads fsyncing at once
/// on a device whose cache flush takes 2 ms have more fsyncs in flight than there are request
/// threads (at most two before), and every fsynced byte reads back.
#[test]
fn fsyncs_past_the_inline_ones_do_not_hold_request_threads() {
    if !can_mount("FUSE fsync waiters") {
        return;
    }
    let ssd = blockdev::simssd::SimSsdConfig { flush_us: 2000, ..Default::default() };
    let dev = Arc::new(blockdev::simssd::SimSsd::new(64 << 20, ssd));
    let config =
        quill_fuse::MountConfig { threads: 2, fsync_inline: Some(1), ..Default::default() };
    with_mount_on(dev, fs::MountOptions::default(), config, |mountpoint, stats| {
        let threads = 12;
        let mut peak = 0;
        for round in 0..5u8 {
            stats.restart_peak();
            let barrier = std::sync::Barrier::new(threads);
            std::thread::scope(|scope| {
                for t in 0..threads {
                    let (barrier, mnt) = (&barrier, &mountpoint);
                    scope.spawn(move || {
                        use std::io::Write;
                        let path = mnt.join(format!("t{t}"));
                        let mut file = std::fs::OpenOptions::new()
                            .create(true)
                            .append(true)
                            .open(path)
                            .unwrap();
                        file.write_all(&[round; 100]).unwrap();
                        barrier.wait();
                        file.sync_all().unwrap();
                    });
                }
            });
            peak = peak.max(stats.snapshot().fsyncs_in_flight_max);
        }
        assert!(peak > 2, "at most {peak} fsyncs in flight with 2 request threads");
        for t in 0..threads {
            let bytes = std::fs::read(mountpoint.join(format!("t{t}"))).unwrap();
            let want: Vec<u8> = (0..5u8).flat_map(|r| [r; 100]).collect();
            assert_eq!(bytes, want, "t{t}");
        }
    });
}

/// With the kernel's writeback cache (`writeback_cache`) a write stays in the kernel's page
/// cache: no WRITE reaches quill until fsync (which sends the pages, then FSYNC) or close.
/// syncfs(2) sends the cached pages too, but makes nothing durable in quill on a FUSE mount
/// ([`syncfs_makes_quill_commit_nothing`]).
#[test]
fn the_writeback_cache_holds_writes_until_fsync_or_close() {
    if !can_mount("FUSE writeback cache") {
        return;
    }
    let dev = Arc::new(MemDevice::new(64 << 20));
    let config = quill_fuse::MountConfig { writeback_cache: true, ..Default::default() };
    with_mount_on(dev, fs::MountOptions::default(), config, |mnt, stats| {
        use std::io::Write;
        let mut file = std::fs::File::create(mnt.join("cached")).unwrap();
        let before = requests(stats, "write");
        file.write_all(&[7u8; 64 << 10]).unwrap();
        assert_eq!(requests(stats, "write"), before, "a write went through the cache");
        assert_eq!(std::fs::metadata(mnt.join("cached")).unwrap().len(), 64 << 10);
        file.sync_all().unwrap();
        let after_fsync = requests(stats, "write");
        assert!(after_fsync > before, "fsync sent the pages");
        assert_eq!(std::fs::read(mnt.join("cached")).unwrap(), vec![7u8; 64 << 10]);
        // syncfs: what it sends, for the record.
        file.write_all(&[8u8; 4096]).unwrap();
        let dir = std::fs::File::open(mnt).unwrap();
        // SAFETY: syncfs on a descriptor we own.
        assert_eq!(unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&dir)) }, 0);
        println!(
            "syncfs returned with {} WRITE requests sent since the fsync",
            requests(stats, "write") - after_fsync
        );
        drop(file);
        assert!(requests(stats, "write") > after_fsync, "close sent the last page");
    });
}

/// sync(2) and syncfs(2) do not reach a FUSE file system: the kernel sends FUSE_SYNCFS to
/// virtiofs only (`fc->sync_fs`), and nothing else it sends for them makes quill commit (no
/// FSYNC, no FSYNCDIR). What was written becomes durable at the file's fsync or the next
/// commit of the interval (`commit=`); the README says so.
#[test]
fn syncfs_makes_quill_commit_nothing() {
    if !can_mount("FUSE syncfs") {
        return;
    }
    let dev = Arc::new(MemDevice::new(64 << 20));
    with_mount_on(
        dev,
        fs::MountOptions::default(),
        quill_fuse::MountConfig::default(),
        |mnt, stats| {
            std::fs::write(mnt.join("written"), b"not yet durable").unwrap();
            let dir = std::fs::File::open(mnt).unwrap();
            // SAFETY: syncfs on a descriptor we own; sync takes no arguments.
            assert_eq!(unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&dir)) }, 0);
            unsafe { libc::sync() };
            let fsyncs = requests(stats, "fsync") + requests(stats, "fsyncdir");
            assert_eq!(fsyncs, 0, "{:?}", stats.snapshot().ops);
        },
    );
}

/// quill drops set-id bits and capabilities itself (FUSE_HANDLE_KILLPRIV_V2, which gives the
/// mount SB_NOSEC): the kernel asks for security.capability before the first write only, and
/// marks the inode S_NOSEC. With `killpriv=kernel` it asks before every write.
#[test]
fn with_quill_killing_privileges_writes_send_no_getxattr() {
    if !can_mount("FUSE killpriv") {
        return;
    }
    for (in_kernel, most) in [(false, 1), (true, 20)] {
        let dev = Arc::new(MemDevice::new(64 << 20));
        let config =
            quill_fuse::MountConfig { killpriv_in_kernel: in_kernel, ..Default::default() };
        with_mount_on(dev, fs::MountOptions::default(), config, |mnt, stats| {
            use std::io::Write;
            let mut file = std::fs::File::create(mnt.join("f")).unwrap();
            let before = requests(stats, "getxattr");
            for _ in 0..20 {
                file.write_all(&[1u8; 100]).unwrap();
            }
            let asked = requests(stats, "getxattr") - before;
            assert!(asked <= most, "killpriv in the kernel {in_kernel}: {asked} for 20 writes");
            if in_kernel {
                assert_eq!(asked, 20, "one per write");
            }
        });
    }
}

/// READDIRPLUS (`readdirplus=on`): a listing carries each entry's attributes, so `ls -l`'s
/// stats of the listed names cost no LOOKUP or GETATTR; without it, one LOOKUP per name.
#[test]
fn a_readdirplus_listing_answers_the_stats_that_follow_it() {
    if !can_mount("FUSE readdirplus") {
        return;
    }
    for (plus, lookups_at_most) in
        [(quill_fuse::Readdirplus::On, 1), (quill_fuse::Readdirplus::Off, u64::MAX)]
    {
        let dev = Arc::new(MemDevice::new(64 << 20));
        let config = quill_fuse::MountConfig { readdirplus: plus, ..Default::default() };
        with_mount_on(dev, fs::MountOptions::default(), config, |mnt, stats| {
            let dir = mnt.join("d");
            std::fs::create_dir(&dir).unwrap();
            for k in 0..30 {
                std::fs::write(dir.join(format!("f{k}")), vec![b'x'; k]).unwrap();
            }
            // Forget the names the creates left in the kernel's caches.
            std::fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
            let before = (requests(stats, "lookup"), requests(stats, "getattr"));
            let mut sizes = Vec::new();
            for entry in std::fs::read_dir(&dir).unwrap() {
                let entry = entry.unwrap();
                sizes.push((entry.file_name(), std::fs::metadata(entry.path()).unwrap().len()));
            }
            let lookups = requests(stats, "lookup") - before.0;
            let getattrs = requests(stats, "getattr") - before.1;
            sizes.sort();
            assert_eq!(sizes.len(), 30);
            for (name, size) in &sizes {
                let k: u64 = name.to_str().unwrap()[1..].parse().unwrap();
                assert_eq!(*size, k, "{name:?}");
            }
            // One LOOKUP is the directory's own (its name went with the caches too).
            if lookups_at_most == 1 {
                assert!(lookups <= 1 && getattrs <= 1, "{plus:?}: {:?}", stats.snapshot().ops);
                assert!(requests(stats, "readdirplus") > 0);
            } else {
                assert!(lookups >= 30, "{plus:?}: {lookups} lookups for 30 names");
            }
        });
    }
}

/// `read_ahead_kb`: with a 1 MiB readahead window (the default) a sequential read of a file
/// reaches quill in at most a quarter of the READs the kernel's 128 KiB window takes.
#[test]
fn a_larger_readahead_window_reads_a_file_in_fewer_requests() {
    if !can_mount("FUSE readahead window") {
        return;
    }
    let bytes = 8usize << 20;
    let reads_with = |read_ahead_kb: u32| {
        let reads = std::sync::Mutex::new(0);
        let config = quill_fuse::MountConfig { read_ahead_kb, ..Default::default() };
        let dev = Arc::new(MemDevice::new(64 << 20));
        with_mount_on(dev, fs::MountOptions::default(), config, |mnt, stats| {
            let data: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
            std::fs::write(mnt.join("f"), &data).unwrap();
            // A fresh open drops the file's cached pages (no FOPEN_KEEP_CACHE under
            // relatime), so every byte comes through READ requests.
            let before = requests(stats, "read");
            let mut got = Vec::new();
            let mut file = std::fs::File::open(mnt.join("f")).unwrap();
            let mut chunk = vec![0u8; 1 << 20];
            loop {
                let n = std::io::Read::read(&mut file, &mut chunk).unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&chunk[..n]);
            }
            assert!(got == data, "the file reads back as written");
            *reads.lock().unwrap() = requests(stats, "read") - before;
        });
        reads.into_inner().unwrap()
    };
    let (large, kernels) = (reads_with(1024), reads_with(0));
    println!("READ requests for 8 MiB: {large} with a 1 MiB window, {kernels} with 128 KiB");
    assert!(kernels >= 64, "the kernel's window is 128 KiB: {kernels} READs");
    assert!(large * 4 <= kernels, "{large} READs with 1 MiB against {kernels} with 128 KiB");
}
