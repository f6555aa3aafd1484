//! Support for tests that drive real tools: e2fsprogs, the kernel (loop mounts), and the quill
//! binary. A test whose tool is missing prints why it skips and returns.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A scratch directory removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("quill-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
    pub fn path(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whether `tool` runs here; prints the skip reason when it does not.
pub fn have(tool: &str, test: &str) -> bool {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !found {
        eprintln!("SKIP {test}: {tool} is not installed");
    }
    found
}

pub fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

pub fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

pub fn mkfs(image: &Path, size: &str, extra: &[&str]) {
    let o = run(Command::new("mkfs.ext4").arg("-q").arg("-F").args(extra).arg(image).arg(size));
    assert!(o.status.success(), "mkfs.ext4 failed: {}", text(&o));
}

/// `e2fsck -f{n,y}`; returns its exit code and output. 0: clean; 1: fixed; 4+: errors left.
pub fn e2fsck(image: &Path, fix: bool) -> (i32, String) {
    let flag = if fix { "-fy" } else { "-fn" };
    let o = run(Command::new("e2fsck").arg(flag).arg(image));
    (o.status.code().unwrap_or(-1), text(&o))
}

pub fn assert_fsck_clean(image: &Path) {
    let (code, out) = e2fsck(image, false);
    assert_eq!(code, 0, "e2fsck -fn {} is not clean:\n{out}", image.display());
}

pub fn quill() -> Command {
    Command::new(env!("CARGO_BIN_EXE_quill"))
}

/// Free block ranges of a file system, from dumpe2fs.
pub fn free_block_ranges(image: &Path) -> Vec<std::ops::RangeInclusive<u64>> {
    let o = run(Command::new("dumpe2fs").arg(image));
    assert!(o.status.success(), "dumpe2fs failed: {}", text(&o));
    let mut ranges = Vec::new();
    for line in String::from_utf8_lossy(&o.stdout).lines() {
        let Some(list) = line.trim().strip_prefix("Free blocks: ") else { continue };
        for part in list.split(", ").filter(|p| !p.is_empty()) {
            let (a, b) = part.split_once('-').unwrap_or((part, part));
            ranges.push(a.trim().parse().unwrap()..=b.trim().parse().unwrap());
        }
    }
    ranges
}

pub fn read_block(image: &Path, block: u64, block_size: u64) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(image).unwrap();
    let mut buf = vec![0u8; block_size as usize];
    file.read_exact_at(&mut buf, block * block_size).unwrap();
    buf
}

/// A 64 MiB image made by quill's mkfs, used by quill, synced, then crashed: the journal holds
/// committed transactions that were never checkpointed.
pub fn crashed_image(image: &Path) {
    let dev: std::sync::Arc<dyn blockdev::BlockDevice> =
        std::sync::Arc::new(blockdev::file::FileDevice::create(image, 64 << 20).unwrap());
    let options = fs::mkfs::MkfsOptions { device_zeroed: true, ..Default::default() };
    fs::mkfs::mkfs(dev.as_ref(), &options).unwrap();
    let mounted = fs::Filesystem::open(dev, fs::MountOptions::default()).unwrap();
    for round in 0..3u8 {
        for i in 0..4u8 {
            let name = format!("file-{round}-{i}");
            let ino = mounted.create(fs::ROOT_INO, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
            mounted.write(ino, 0, &vec![round ^ i; 20_000]).unwrap();
        }
        mounted.sync().unwrap();
    }
    mounted.crash();
}
