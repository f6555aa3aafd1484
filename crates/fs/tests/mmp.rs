//! Multiple mount protection (mkfs.ext4 -O mmp): quill takes the MMP block before it writes,
//! keeps it fresh while mounted, and releases it clean; it refuses a file system another host
//! holds or e2fsck is checking, waits out the sequence a crash left, and stops writing when
//! another host takes the block from under it. The kernel mounts what quill leaves.
//! Needs e2fsprogs (and root with loop devices for the kernel's part); skips with a printed
//! reason otherwise.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use blockdev::memory::MemDevice;
use blockdev::BlockDevice;
use common::{assert_fsck_clean, can_loop_mount, have, mkfs, open_device, Mount, Scratch};
use fs::{Ext4Image, Filesystem, FsError, MountOptions, ROOT_INO};
use ondisk::ext4::mmp::{MmpBlock, MMP_SEQ_CLEAN, MMP_SEQ_FSCK};

/// A fresh `mkfs.ext4 -O mmp` image (1 s updates, so checks come every 5 s) in memory, and
/// the file it was made in.
fn mmp_image(scratch: &Scratch) -> (std::path::PathBuf, Arc<MemDevice>) {
    let image = scratch.path("mmp.img");
    mkfs(&image, "64M", &["-O", "mmp", "-E", "mmp_update_interval=1"]);
    let dev = Arc::new(MemDevice::from_bytes(std::fs::read(&image).unwrap()));
    (image, dev)
}

/// The MMP block's place and checksum seed.
fn mmp_location(dev: &Arc<MemDevice>) -> (u64, usize, Option<u32>) {
    let dev: Arc<dyn BlockDevice> = dev.clone();
    let image = Ext4Image::open(dev).unwrap();
    let sb = image.superblock();
    let bs = sb.block_size() as usize;
    (sb.mmp_block * bs as u64, bs, sb.has_metadata_csum().then(|| sb.csum_seed()))
}

fn read_mmp(dev: &Arc<MemDevice>) -> MmpBlock {
    let (offset, bs, seed) = mmp_location(dev);
    let mut raw = vec![0u8; bs];
    dev.read_at(offset, &mut raw).unwrap();
    MmpBlock::parse(&raw, seed).unwrap()
}

/// Another host writing the MMP block (`seq` and its name), as its kmmpd would.
fn write_mmp(dev: &Arc<MemDevice>, seq: u32, host: &[u8]) {
    let (offset, bs, seed) = mmp_location(dev);
    let mut block = read_mmp(dev);
    block.seq = seq;
    block.set_nodename(host);
    let mut raw = vec![0u8; bs];
    raw[..1024].copy_from_slice(&block.encode(seed));
    dev.write_at(offset, &raw).unwrap();
}

fn open(dev: &Arc<MemDevice>) -> Result<Filesystem, FsError> {
    let dev: Arc<dyn BlockDevice> = dev.clone();
    Filesystem::open(dev, MountOptions::default())
}

#[test]
fn a_clean_mmp_file_system_is_taken_kept_fresh_and_released_and_the_kernel_mounts_it() {
    let test = "mmp_clean";
    if !have("mkfs.ext4", test) || !have("e2fsck", test) {
        return;
    }
    let scratch = Scratch::new("mmp-clean");
    let (image, dev) = mmp_image(&scratch);
    assert_eq!(read_mmp(&dev).seq, MMP_SEQ_CLEAN, "mkfs leaves it clean");
    let fs = open(&dev).unwrap();
    let file = fs.create(ROOT_INO, b"held", 0o644, 0, 0).unwrap().ino;
    fs.write(file, 0, b"written under multiple mount protection").unwrap();
    let held = read_mmp(&dev);
    assert!(held.seq != MMP_SEQ_CLEAN && held.seq != MMP_SEQ_FSCK, "{held:?}");
    assert!(!held.nodename_str().is_empty(), "the host's name is recorded");
    std::thread::sleep(Duration::from_millis(2500));
    let later = read_mmp(&dev);
    assert_ne!(later.seq, held.seq, "kept fresh: the sequence moves every second");
    fs.unmount().unwrap();
    assert_eq!(read_mmp(&dev).seq, MMP_SEQ_CLEAN, "released clean");
    std::fs::write(&image, dev.snapshot()).unwrap();
    assert_fsck_clean(&image);
    if !can_loop_mount(test) {
        return;
    }
    let Some(mount) = Mount::new(&image, scratch.path("mnt")) else { return };
    let bytes = std::fs::read(mount.dir.join("held")).unwrap();
    assert_eq!(bytes, b"written under multiple mount protection");
    drop(mount);
    assert_fsck_clean(&image);
    // And quill takes it again after the kernel released it.
    let dev: Arc<dyn BlockDevice> = open_device(&image);
    Filesystem::open(dev, MountOptions::default()).unwrap().unmount().unwrap();
    assert_fsck_clean(&image);
}

#[test]
fn a_file_system_held_elsewhere_or_being_checked_is_refused_and_a_crashed_holder_waited_out() {
    let test = "mmp_refusals";
    if !have("mkfs.ext4", test) {
        return;
    }
    let scratch = Scratch::new("mmp-refusals");
    let (_, dev) = mmp_image(&scratch);
    // e2fsck is running: refused at once, nothing written.
    write_mmp(&dev, MMP_SEQ_FSCK, b"checker");
    let before = dev.snapshot();
    let refused = open(&dev);
    assert!(matches!(&refused, Err(FsError::InUse(why)) if why.contains("e2fsck")), "{refused:?}");
    assert!(dev.snapshot() == before, "a refused mount wrote to the device");
    // A live host: its sequence moves while quill waits, so quill refuses.
    write_mmp(&dev, 100, b"other-host");
    let stop = Arc::new(AtomicBool::new(false));
    let other = {
        let (dev, stop) = (dev.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut seq = 100;
            while !stop.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(500));
                seq += 1;
                write_mmp(&dev, seq, b"other-host");
            }
        })
    };
    let refused = open(&dev);
    stop.store(true, Ordering::Release);
    other.join().unwrap();
    let named = matches!(&refused, Err(FsError::InUse(why)) if why.contains("other-host"));
    assert!(named, "{refused:?}");
    assert_eq!(refused.unwrap_err().errno(), 16, "EBUSY");
    // A holder that crashed: its sequence stays put, so quill waits it out and mounts.
    let fs = open(&dev).unwrap();
    let file = fs.create(ROOT_INO, b"survives", 0o644, 0, 0).unwrap().ino;
    fs.write(file, 0, b"fsynced before the crash").unwrap();
    fs.fsync(file, false).unwrap();
    fs.crash();
    assert_ne!(read_mmp(&dev).seq, MMP_SEQ_CLEAN, "a crash leaves the block held");
    let fs = open(&dev).unwrap();
    let ino = fs.resolve("/survives").unwrap();
    let mut buf = vec![0u8; 64];
    let n = fs.read(ino, 0, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"fsynced before the crash");
    fs.unmount().unwrap();
    assert_eq!(read_mmp(&dev).seq, MMP_SEQ_CLEAN);
}

#[test]
fn a_host_that_takes_the_block_from_under_a_mount_stops_its_writes() {
    let test = "mmp_lost";
    if !have("mkfs.ext4", test) {
        return;
    }
    let scratch = Scratch::new("mmp-lost");
    let (_, dev) = mmp_image(&scratch);
    let fs = open(&dev).unwrap();
    let file = fs.create(ROOT_INO, b"before", 0o644, 0, 0).unwrap().ino;
    fs.write(file, 0, b"mine").unwrap();
    write_mmp(&dev, 7, b"intruder");
    // The next update (every second here) reads the block back first and finds the
    // intruder's sequence.
    let mut refused = None;
    for _ in 0..40 {
        std::thread::sleep(Duration::from_millis(500));
        match fs.create(ROOT_INO, b"after", 0o644, 0, 0) {
            Err(e) => {
                refused = Some(e);
                break;
            }
            Ok(made) => fs.unlink(ROOT_INO, b"after").map(|_| made).map(drop).unwrap(),
        }
    }
    assert!(matches!(refused, Some(FsError::ReadOnly)), "{refused:?}");
    assert!(fs.is_read_only());
    let _ = fs.unmount();
    let block = read_mmp(&dev);
    assert_eq!((block.seq, block.nodename_str()), (7, &b"intruder"[..]), "the intruder's stays");
}
