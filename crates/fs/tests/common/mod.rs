//! Helpers for the file-system tests: scratch images made by mkfs.ext4, e2fsck, and a seed.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use blockdev::file::{FileDevice, FileOptions};
use blockdev::BlockDevice;

/// A scratch directory under the system temp dir, unique per process and call, removed on
/// drop.
pub struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("quill-fs-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch { dir }
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether `tool` is installed; prints a SKIP line for `test` when it is not.
pub fn have(tool: &str, test: &str) -> bool {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !found {
        println!("SKIP {test}: {tool} is not installed");
    }
    found
}

/// Whether every tool in `tools` is installed; prints a SKIP line naming the first missing.
pub fn have_tools(tools: &[&str]) -> bool {
    tools.iter().all(|tool| have(tool, "this test"))
}

/// Makes an ext4 image of `size` (mkfs.ext4 syntax) with extra mkfs options.
pub fn mkfs(image: &Path, size: &str, extra: &[&str]) {
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .args(extra)
        .arg(image)
        .arg(size)
        .output()
        .expect("run mkfs.ext4");
    assert!(out.status.success(), "mkfs.ext4 failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// Runs `e2fsck -fn` and returns (exit code, output).
pub fn e2fsck(image: &Path) -> (i32, String) {
    let out = Command::new("e2fsck").arg("-fn").arg(image).output().expect("run e2fsck");
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

/// Asserts `e2fsck -fn` finds nothing; on failure keeps a copy of the image for inspection.
pub fn assert_fsck_clean(image: &Path) {
    let (code, text) = e2fsck(image);
    if code != 0 {
        let kept = std::env::temp_dir().join(format!("quill-failed-{}.img", std::process::id()));
        let _ = std::fs::copy(image, &kept);
        panic!(
            "e2fsck -fn found problems in {} (kept as {}):\n{text}",
            image.display(),
            kept.display()
        );
    }
}

pub fn open_device(image: &Path) -> Arc<dyn BlockDevice> {
    Arc::new(FileDevice::open(image, FileOptions::default()).expect("open image"))
}

/// The seed of a randomized test: QUILL_SEED when set, else the clock; printed for replay.
pub fn seed(test: &str) -> u64 {
    let seed = std::env::var("QUILL_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    println!("{test}: seed {seed} (replay with QUILL_SEED={seed})");
    seed
}

/// xorshift64*: small and seedable.
pub struct Rng(pub u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
}

/// Every entry of directory `dir`, read in batches of `batch` by following the cookies
/// (small batches exercise cookie resumption).
pub fn list_dir(fs: &fs::Filesystem, dir: u32, batch: usize) -> Vec<fs::DirEntry> {
    let mut entries = Vec::new();
    let mut cookie = 0;
    loop {
        let got = fs.readdir(dir, cookie, batch).expect("readdir");
        let Some(last) = got.last() else { return entries };
        cookie = last.next_cookie;
        entries.extend(got);
    }
}
