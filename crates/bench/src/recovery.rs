//! The recovery workload: fill the journal with committed transactions, crash, and time how
//! long each target takes to replay it and come up — quill's `Filesystem::open` (with the
//! target's `recovery_threads`) and the kernel's ext4 mount (fuse2fs does not replay). Every target
//! replays its own copy of the same crashed image, read from disk (the page cache is dropped
//! first when running as root), and `e2fsck -fn` must find the result clean.
//!
//! The image is made by quill under data=journal: files of 16 KiB, each fsynced, so the log
//! holds many small transactions of data and metadata, until 70% of the log is in use (or a
//! checkpoint starts freeing it). Operations are log blocks replayed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use blockdev::file::{FileDevice, FileOptions};
use fs::{DataMode, Filesystem, MountOptions};

use crate::fsapi::{FsApi, LibApi};
use crate::targets::{fsck, run_tool, umount, Env, Kind, TargetSpec};
use crate::workloads::{pattern, Size};

/// A crashed image with a full journal.
#[derive(Debug, Clone)]
pub struct CrashedImage {
    pub path: PathBuf,
    /// Journal blocks in use at the crash: what recovery has to read and replay.
    pub log_blocks: u32,
    pub log_capacity: u32,
    pub block_size: u32,
    pub transactions: u64,
    pub fill_seconds: f64,
}

fn image_bytes(size: Size) -> u64 {
    match size {
        // 1 GiB: a 32 MiB (8,192-block) journal, mke2fs's size for it.
        Size::Default => 1 << 30,
        // 64 MiB: a 4 MiB (1,024-block) journal.
        Size::Smallest => 64 << 20,
    }
}

const FILL_PERCENT: u64 = 70;
const FILE_BYTES: usize = 16384;
const FILES_PER_DIR: u64 = 1000;

/// Makes `path` and crashes it with the journal about 70% full.
pub fn make_crashed_image(path: &Path, size: Size) -> Result<CrashedImage, String> {
    let began = Instant::now();
    let shown = path.display();
    let dev = Arc::new(FileDevice::create(path, image_bytes(size)).map_err(|e| e.to_string())?);
    let mkfs = fs::mkfs::MkfsOptions { device_zeroed: true, ..Default::default() };
    fs::mkfs::mkfs(dev.as_ref(), &mkfs).map_err(|e| format!("mkfs {shown}: {e}"))?;
    let options = MountOptions { data: DataMode::Journal, ..Default::default() };
    let filesystem = Arc::new(Filesystem::open(dev, options).map_err(|e| format!("{shown}: {e}"))?);
    let api = LibApi::new(filesystem.clone());
    let data = pattern(FILE_BYTES, 11);
    let mut used_before = 0;
    let (mut capacity, mut used) = (0, 0);
    for n in 0u64..1_000_000 {
        if n % FILES_PER_DIR == 0 {
            api.mkdir(&format!("d{}", n / FILES_PER_DIR)).map_err(|e| e.to_string())?;
        }
        let mut file = api
            .create(&format!("d{}/f{n}", n / FILES_PER_DIR))
            .map_err(|e| format!("filling {shown}: {e}"))?;
        file.write_at(0, &data).map_err(|e| e.to_string())?;
        file.fsync().map_err(|e| e.to_string())?;
        (capacity, used) = filesystem.journal().log_usage();
        if used as u64 * 100 >= capacity as u64 * FILL_PERCENT || used < used_before {
            break;
        }
        used_before = used;
    }
    let transactions = filesystem.journal().stats().transactions;
    let block_size = filesystem.block_size();
    drop(api);
    let filesystem = Arc::try_unwrap(filesystem).map_err(|_| "file system still in use")?;
    filesystem.crash();
    Ok(CrashedImage {
        path: path.to_path_buf(),
        log_blocks: used,
        log_capacity: capacity,
        block_size,
        transactions,
        fill_seconds: began.elapsed().as_secs_f64(),
    })
}

/// What one target's replay took.
#[derive(Debug, Clone)]
pub struct Replay {
    pub seconds: f64,
    pub fsck_clean: Option<bool>,
    pub note: String,
}

/// Writes dirty pages and drops the page cache (root only), so replay reads from the disk.
pub fn drop_caches() -> bool {
    // SAFETY: sync(2) takes no arguments.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

/// Replays a copy of `crashed` with `spec`'s file system and times it until the file system is
/// usable (mounted, or open in-process).
pub fn replay(
    spec: &TargetSpec,
    crashed: &CrashedImage,
    env: &Env,
    id: &str,
) -> Result<Replay, String> {
    let copy = env.scratch.join(format!("{id}.img"));
    let mountpoint = env.scratch.join(format!("{id}.mnt"));
    run_tool(Command::new("cp").arg("--sparse=always").arg(&crashed.path).arg(&copy))?;
    let cold = drop_caches();
    let result = replay_copy(spec, &copy, &mountpoint);
    let verdict = result.and_then(|(seconds, note)| {
        let fsck_clean = fsck(&copy)?;
        let cache = if cold { "cold cache" } else { "warm cache (not root)" };
        Ok(Replay { seconds, fsck_clean, note: format!("{note}; {cache}") })
    });
    let _ = std::fs::remove_file(&copy);
    let _ = std::fs::remove_dir(&mountpoint);
    verdict
}

fn replay_copy(spec: &TargetSpec, copy: &Path, mountpoint: &Path) -> Result<(f64, String), String> {
    match &spec.kind {
        Kind::Lib | Kind::QuillFuse => {
            let began = Instant::now();
            let dev = FileDevice::open(copy, FileOptions::default()).map_err(|e| e.to_string())?;
            let filesystem = Filesystem::open(Arc::new(dev), spec.quill.clone())
                .map_err(|e| format!("quill replay: {e}"))?;
            let seconds = began.elapsed().as_secs_f64();
            filesystem.unmount().map_err(|e| format!("unmount after replay: {e}"))?;
            Ok((seconds, format!("{} replay threads", spec.quill.journal.recovery_threads)))
        }
        Kind::KernelExt4 => {
            std::fs::create_dir_all(mountpoint).map_err(|e| e.to_string())?;
            let began = Instant::now();
            run_tool(
                Command::new("mount").args(["-t", "ext4", "-o", "loop"]).arg(copy).arg(mountpoint),
            )?;
            let seconds = began.elapsed().as_secs_f64();
            umount(mountpoint)?;
            Ok((seconds, "kernel mount".into()))
        }
        Kind::Fuse2fs => Err("fuse2fs does not replay the journal (see runner.rs)".into()),
        Kind::Dir(_) => Err("recovery needs an image; dir targets have none".into()),
    }
}
