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

/// quill answers FLUSH with ENOSYS (it has nothing to push at close): the kernel then answers
/// every later close itself, with success, and sends no more FLUSH requests.
#[test]
fn after_the_first_close_no_flush_request_reaches_quill() {
    if !can_mount("FUSE flush requests") {
        return;
    }
    let dev = Arc::new(MemDevice::new(64 << 20));
    let mkfs = fs::mkfs::MkfsOptions { device_zeroed: true, ..Default::default() };
    fs::mkfs::mkfs(dev.as_ref(), &mkfs).unwrap();
    let fs = Arc::new(fs::Filesystem::open(dev, fs::MountOptions::default()).unwrap());
    let mountpoint = std::env::temp_dir().join(format!("quill-fuse-flush-{}", std::process::id()));
    std::fs::create_dir_all(&mountpoint).unwrap();
    let config = quill_fuse::MountConfig::default();
    let stats = config.request_stats.clone();
    let session = quill_fuse::mount(fs.clone(), &mountpoint, &config).unwrap().spawn().unwrap();

    let closes = 40;
    let result = std::panic::catch_unwind(|| {
        for i in 0..closes {
            // open, write, close: each close must succeed.
            std::fs::write(mountpoint.join(format!("f{i}")), format!("file {i}")).unwrap();
        }
        for i in 0..closes {
            let got = std::fs::read_to_string(mountpoint.join(format!("f{i}"))).unwrap();
            assert_eq!(got, format!("file {i}"));
        }
    });
    let umounted = Command::new("umount").arg(&mountpoint).status();
    session.join().unwrap();
    quill_fuse::unmount_fs(fs).unwrap();
    let _ = std::fs::remove_dir(&mountpoint);
    assert!(umounted.is_ok_and(|s| s.success()), "umount {}", mountpoint.display());
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }

    let figures = stats.snapshot();
    let count = |op: &str| figures.ops.iter().find(|o| o.0 == op).map_or(0, |o| o.1);
    assert!(count("release") >= 2 * closes, "{figures:?}");
    assert!(count("flush") <= 1, "{} FLUSH requests for {} closes", count("flush"), 2 * closes);
}
