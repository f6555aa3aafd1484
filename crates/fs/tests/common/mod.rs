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

/// The seed convention and generator of every randomized test.
#[allow(unused_imports)] // each test binary uses its own share of this module
pub use ondisk::testing::{seed, Rng};

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
