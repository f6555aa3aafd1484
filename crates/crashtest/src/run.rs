//! Running a workload on quill over the recording device.
//!
//! The image is made by quill's mkfs (12 MiB, 4 KiB blocks, the smallest journal: 4 MiB), or,
//! for `image=ext3`, by mkfs.ext3 with the same size, block size and journal (its files,
//! directories and journal indirect-mapped), or for `image=ext2` by mkfs.ext2 (indirect-mapped,
//! no journal: quill's commits write home); the setup runs and is unmounted cleanly, and that
//! image is where the recording starts. Every
//! operation of thread `t` is bracketed by two marks, [`start_mark`] and [`end_mark`], so a
//! crash state's marks say which operations had started and which had returned.
//!
//! The journal's commit interval is an hour and no flusher runs, so with one thread the I/O is
//! the same on every run and a reproducer's crash state names the same writes again.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use blockdev::memory::MemDevice;
use blockdev::recording::RecordingDevice;
use blockdev::BlockDevice;
use fs::mkfs::{mkfs, MkfsOptions};
use fs::{DataMode, FallocateMode, Filesystem, FsError, MountOptions, RenameFlags, SetMode};
use journal::JournalConfig;

use crate::model::{split, Model, Namespace};
use crate::workload::{pattern, symlink_target, tag, xattr_value, Config, Op, Workload, SETUP};

/// Small, because every crash image is copied and checked several times.
pub const IMAGE_BYTES: u64 = 12 << 20;
pub const BLOCK_SIZE: u32 = 4096;

pub fn start_mark(thread: usize, op: usize) -> u64 {
    ((thread as u64) << 32) | ((op as u64) << 1)
}

pub fn end_mark(thread: usize, op: usize) -> u64 {
    start_mark(thread, op) | 1
}

/// (thread, operation, is the end mark).
pub fn decode_mark(label: u64) -> (usize, usize, bool) {
    ((label >> 32) as usize, ((label & 0xFFFF_FFFF) >> 1) as usize, label & 1 == 1)
}

/// The negative control's device: it acknowledges flushes and FUA writes without making
/// anything durable (a disk that lies about its cache). Every write stays pending, so crash
/// states lose acknowledged data, and the checks must say so.
struct LyingDevice(Arc<RecordingDevice>);

impl BlockDevice for LyingDevice {
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), blockdev::DeviceError> {
        self.0.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), blockdev::DeviceError> {
        self.0.write_at(offset, data)
    }
    fn write_fua_at(&self, offset: u64, data: &[u8]) -> Result<(), blockdev::DeviceError> {
        self.0.write_at(offset, data)
    }
    fn flush(&self) -> Result<(), blockdev::DeviceError> {
        Ok(())
    }
}

pub fn mount_options(config: &Config) -> Result<MountOptions, String> {
    let mut journal = JournalConfig::from_spec(&config.preset)?;
    journal.commit_interval = Duration::from_secs(3600);
    let data = match config.data.as_str() {
        "ordered" => DataMode::Ordered,
        "journal" => DataMode::Journal,
        other => return Err(format!("data={other}: expected ordered or journal")),
    };
    Ok(MountOptions {
        data,
        journal,
        dirty_bytes_max: config.dirty_kib.max(4) * 1024,
        ..MountOptions::default()
    })
}

/// The freshly made image of kind `image` (`ext4`, `inline`, `quota`, `ext3`, `ext2` or
/// `bigalloc`) every workload starts from.
fn formatted_image(image: &str) -> Result<&'static [u8], String> {
    static EXT3: OnceLock<Result<Vec<u8>, String>> = OnceLock::new();
    static EXT2: OnceLock<Result<Vec<u8>, String>> = OnceLock::new();
    static EXT4: OnceLock<Vec<u8>> = OnceLock::new();
    static INLINE: OnceLock<Vec<u8>> = OnceLock::new();
    static QUOTA: OnceLock<Vec<u8>> = OnceLock::new();
    static BIGALLOC: OnceLock<Result<Vec<u8>, String>> = OnceLock::new();
    let made = match image {
        "ext4" => return Ok(EXT4.get_or_init(|| formatted(&[]))),
        "inline" => return Ok(INLINE.get_or_init(|| formatted(&["inline_data", "ea_inode"]))),
        "quota" => return Ok(QUOTA.get_or_init(|| formatted(&["quota", "project"]))),
        "ext3" => EXT3.get_or_init(|| make_with_e2fsprogs("ext3")),
        "ext2" => EXT2.get_or_init(|| make_with_e2fsprogs("ext2")),
        "bigalloc" => BIGALLOC.get_or_init(|| make_with_e2fsprogs("bigalloc")),
        other => {
            return Err(format!(
                "image={other}: expected ext4, inline, quota, ext3, ext2 or bigalloc"
            ))
        }
    };
    made.as_deref().map_err(Clone::clone)
}

/// An ext3 (4 MiB journal), ext2 (no journal) or bigalloc (ext4 with 4-block clusters, 4 MiB
/// journal) image made by mkfs.ext3, mkfs.ext2 or mkfs.ext4, the same on every run (a fixed
/// UUID, hash seed and time), so a reproducer replays the same I/O; or why there is none.
fn make_with_e2fsprogs(kind: &str) -> Result<Vec<u8>, String> {
    let path =
        std::env::temp_dir().join(format!("quill-crashtest-{kind}-{}.img", std::process::id()));
    let file = std::fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    file.set_len(IMAGE_BYTES).map_err(|e| format!("{}: {e}", path.display()))?;
    drop(file);
    let cluster = (4 * BLOCK_SIZE).to_string();
    let (tool, journal): (String, &[&str]) = match kind {
        "ext3" => ("mkfs.ext3".into(), &["-J", "size=4"]),
        "bigalloc" => ("mkfs.ext4".into(), &["-J", "size=4", "-O", "bigalloc", "-C", &cluster]),
        _ => (format!("mkfs.{kind}"), &[]),
    };
    let out = std::process::Command::new(&tool)
        .env("E2FSPROGS_FAKE_TIME", "1700000000")
        .args(["-q", "-F", "-b", &BLOCK_SIZE.to_string()])
        .args(journal)
        .args(["-U", "7175696c-6c2d-6372-6173-68746573742d"])
        .args(["-E", "hash_seed=7175696c-6c2d-6372-6173-68746573742e,root_owner=0:0"])
        .arg(&path)
        .output();
    let bytes = std::fs::read(&path);
    let _ = std::fs::remove_file(&path);
    match out {
        Ok(o) if o.status.success() => bytes.map_err(|e| format!("reading the {kind} image: {e}")),
        Ok(o) => Err(format!("{tool} failed: {}", String::from_utf8_lossy(&o.stderr).trim())),
        Err(e) => Err(format!("{tool}: {e}")),
    }
}

/// Whether ext3 images can be made here (mkfs.ext3 runs); `Err` says why not.
pub fn ext3_available() -> Result<(), String> {
    formatted_image("ext3").map(drop)
}

/// Whether ext2 images can be made here (mkfs.ext2 runs); `Err` says why not.
pub fn ext2_available() -> Result<(), String> {
    formatted_image("ext2").map(drop)
}

/// Whether bigalloc images can be made here (mkfs.ext4 runs); `Err` says why not.
pub fn bigalloc_available() -> Result<(), String> {
    formatted_image("bigalloc").map(drop)
}

/// A fresh image made by quill's mkfs with `features` on besides the defaults and
/// fast_commit (the `inline` kind: inline_data and ea_inode).
fn formatted(features: &[&str]) -> Vec<u8> {
    let dev = MemDevice::new(IMAGE_BYTES);
    let opts = MkfsOptions {
        block_size: BLOCK_SIZE,
        size_bytes: Some(IMAGE_BYTES),
        journal_blocks: Some(1024),
        // With a fast-commit area (16 blocks after the log), so fsync_journal has one;
        // the other presets leave it to the log, as its journal bit stays clear.
        features: {
            let mut f = fs::mkfs::Features::default();
            f.edit("fast_commit").expect("a feature quill's mkfs makes");
            for feature in features {
                f.edit(feature).expect("a feature quill's mkfs makes");
            }
            f
        },
        uuid: Some(*b"quill-crashtest!"),
        hash_seed: Some(*b"crashtest-hash-s"),
        now: Some(1_700_000_000),
        device_zeroed: true,
        ..MkfsOptions::default()
    };
    mkfs(&dev, &opts).expect("mkfs of the crash-test image");
    dev.snapshot()
}

/// What the model says a workload's tree may be: what a crash image is checked against,
/// whichever file system ran the workload.
pub struct Expected {
    /// `states[t][k]`: thread `t`'s subtree after its first `k` operations.
    pub states: Vec<Vec<Model>>,
    pub namespaces: Vec<Vec<Namespace>>,
    pub roots: Vec<String>,
}

impl Expected {
    /// The model's states for every thread of `w`, or why the workload is invalid.
    pub fn of(w: &Workload) -> Result<Expected, String> {
        let states = model_states(w)?;
        let namespaces = states.iter().map(|s| s.iter().map(Model::namespace).collect()).collect();
        let roots = (0..w.threads.len()).map(|t| w.root(t)).collect();
        Ok(Expected { states, namespaces, roots })
    }
}

/// A workload run on the recording device, with the model's states for every thread.
pub struct Recording {
    pub device: Arc<RecordingDevice>,
    pub mount: MountOptions,
    pub expected: Expected,
    /// Operations that failed although the model says they are valid (each a bug).
    pub failures: Vec<String>,
}

fn full_path(root: &str, path: &str) -> String {
    format!("/{}", crate::model::join(root, path))
}

fn fs_err(op: &Op, e: FsError) -> String {
    format!("{op}: {e}")
}

/// Who owns what a workload makes: root, or (`Owners::ByName`, on quota images, where every
/// charge moves between ids) a user and group picked by the new name.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Owners {
    Root,
    ByName,
}

impl Owners {
    fn of_image(image: &str) -> Owners {
        if image == "quota" {
            Owners::ByName
        } else {
            Owners::Root
        }
    }

    /// uid and gid of a file named `name`: one of five users and three groups.
    fn of(self, name: &[u8]) -> (u32, u32) {
        match self {
            Owners::Root => (0, 0),
            Owners::ByName => {
                let h =
                    name.iter().fold(0u32, |h, &b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
                (1000 + h % 5, 100 + (h / 5) % 3)
            }
        }
    }
}

/// Runs one operation through quill as a program would (files are opened around data
/// operations and closed after, as `open; pwrite; close` does).
pub fn exec(fs: &Filesystem, root: &str, op: &Op, tag: u64, owners: Owners) -> Result<(), String> {
    let e = |x| fs_err(op, x);
    let ino = |p: &str| fs.resolve(&full_path(root, p)).map_err(e);
    let parent = |p: &str| -> Result<(u32, Vec<u8>), String> {
        let (dir, name) = split(p);
        Ok((ino(dir)?, name.as_bytes().to_vec()))
    };
    let with_open = |p: &str, f: &dyn Fn(u32) -> Result<(), FsError>| -> Result<(), String> {
        let i = ino(p)?;
        let slot = fs.open_inode(i).map_err(e)?;
        let result = f(i);
        let closed = fs.close_inode(&slot);
        result.and(closed).map_err(e)
    };
    match op {
        Op::Creat(p) => {
            let (dir, name) = parent(p)?;
            let (uid, gid) = owners.of(&name);
            fs.create(dir, &name, 0o644, uid, gid).map(drop).map_err(e)
        }
        Op::Mkdir(p) => {
            let (dir, name) = parent(p)?;
            let (uid, gid) = owners.of(&name);
            fs.mkdir(dir, &name, 0o755, uid, gid).map(drop).map_err(e)
        }
        Op::Rmdir(p) => {
            let (dir, name) = parent(p)?;
            fs.rmdir(dir, &name).map_err(e)
        }
        Op::Unlink(p) => {
            let (dir, name) = parent(p)?;
            fs.unlink(dir, &name).map_err(e)
        }
        Op::Link { from, to } => {
            let (dir, name) = parent(to)?;
            fs.link(ino(from)?, dir, &name).map(drop).map_err(e)
        }
        Op::Rename { from, to, whiteout } => {
            let (d1, n1) = parent(from)?;
            let (d2, n2) = parent(to)?;
            let flags =
                RenameFlags { whiteout: whiteout.then_some((0, 0)), ..RenameFlags::default() };
            fs.rename(d1, &n1, d2, &n2, flags).map_err(e)
        }
        Op::Write { path, offset, len } => with_open(path, &|i| {
            let n = fs.write(i, *offset, &pattern(tag, *offset, *len))?;
            if n as u64 != *len {
                return Err(FsError::Invalid(format!("short write: {n} of {len} bytes")));
            }
            Ok(())
        }),
        Op::Falloc { path, offset, len, keep_size, zero } => with_open(path, &|i| {
            let mode = match (*zero, *keep_size) {
                (true, keep_size) => FallocateMode::ZeroRange { keep_size },
                (false, true) => FallocateMode::KeepSize,
                (false, false) => FallocateMode::Allocate,
            };
            fs.fallocate(i, mode, *offset, *len)
        }),
        Op::Truncate { path, size } => fs.truncate(ino(path)?, *size).map_err(e),
        Op::Symlink { path, len } => {
            let (dir, name) = parent(path)?;
            let (uid, gid) = owners.of(&name);
            fs.symlink(dir, &name, &symlink_target(tag, *len), uid, gid).map(drop).map_err(e)
        }
        Op::SetXattr { path, name, len } => fs
            .setxattr(ino(path)?, name.as_bytes(), &xattr_value(tag, *len), SetMode::Any)
            .map_err(e),
        Op::RemoveXattr { path, name } => fs.removexattr(ino(path)?, name.as_bytes()).map_err(e),
        Op::Fsync(p) => with_open(p, &|i| fs.fsync(i, false)),
        Op::Fdatasync(p) => with_open(p, &|i| fs.fsync(i, true)),
        Op::Sync => fs.sync().map_err(e),
    }
}

/// The model's states for every thread of `w`, or why the workload is invalid.
pub fn model_states(w: &Workload) -> Result<Vec<Vec<Model>>, String> {
    let mut global = Model::for_image(&w.config.image);
    for (k, op) in w.setup.iter().enumerate() {
        global.apply(op, k, tag(SETUP, k)).map_err(|e| format!("setup: {e}"))?;
    }
    let mut all = Vec::new();
    for (t, ops) in w.threads.iter().enumerate() {
        let root = w.root(t);
        if !global.is_dir(&root) {
            return Err(format!("thread {t}: its directory {root:?} is not made by the setup"));
        }
        let mut model = global.subtree(&root);
        for inode in &mut model.inodes {
            inode.created = 0;
            inode.changed = 0;
        }
        let mut states = vec![model.clone()];
        for (i, op) in ops.iter().enumerate() {
            model.apply(op, i, tag(t, i)).map_err(|e| format!("thread {t}, op {i}: {e}"))?;
            states.push(model.clone());
        }
        all.push(states);
    }
    Ok(all)
}

/// Runs `w`: setup on a fresh image, then the threads on the recording device, then a crash.
pub fn record(w: &Workload) -> Result<Recording, String> {
    let expected = Expected::of(w)?;
    let mount = mount_options(&w.config)?;
    let roots = &expected.roots;
    let owners = Owners::of_image(&w.config.image);
    let initial = {
        let dev = Arc::new(MemDevice::from_bytes(formatted_image(&w.config.image)?.to_vec()));
        let fs = Filesystem::open(dev.clone(), mount.clone()).map_err(|e| format!("open: {e}"))?;
        for (k, op) in w.setup.iter().enumerate() {
            exec(&fs, "", op, tag(SETUP, k), owners).map_err(|e| format!("setup: {e}"))?;
        }
        fs.unmount().map_err(|e| format!("unmount after setup: {e}"))?;
        dev.snapshot()
    };
    let device = Arc::new(RecordingDevice::new(initial));
    let as_block_device: Arc<dyn BlockDevice> =
        if w.config.lying_device { Arc::new(LyingDevice(device.clone())) } else { device.clone() };
    let fs = Filesystem::open(as_block_device, mount.clone())
        .map_err(|e| format!("open for recording: {e}"))?;
    let run_thread = |t: usize| -> Option<String> {
        for (i, op) in w.threads[t].iter().enumerate() {
            device.mark(start_mark(t, i));
            if let Err(e) = exec(&fs, &roots[t], op, tag(t, i), owners) {
                return Some(format!("thread {t}, op {i} failed: {e}"));
            }
            device.mark(end_mark(t, i));
        }
        None
    };
    let failures: Vec<String> = if w.threads.len() == 1 {
        run_thread(0).into_iter().collect()
    } else {
        std::thread::scope(|s| {
            let handles: Vec<_> =
                (0..w.threads.len()).map(|t| s.spawn(move || run_thread(t))).collect();
            handles.into_iter().filter_map(|h| h.join().expect("workload thread")).collect()
        })
    };
    fs.crash();
    Ok(Recording { device, mount, expected, failures })
}
