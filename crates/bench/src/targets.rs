//! Benchmark targets: what a workload runs on, set up fresh for every run and torn down
//! after it, with `e2fsck -fn` on the image.
//!
//! | target | what it is | image made by |
//! |---|---|---|
//! | `lib` | quill in-process ([`fs::Filesystem`] called directly) on an image file, or with `dev=simssd` on the simulated SSD | quill's mkfs |
//! | `quill-fuse` | quill mounted through FUSE in this process (the kernel's VFS in the path), on an image file or the simulated SSD | quill's mkfs |
//! | `kernel-ext4` | the kernel's ext4 on a loop-mounted image | mkfs.ext4 |
//! | `fuse2fs` | e2fsprogs' FUSE driver | mkfs.ext4 |
//! | `dir:PATH` | any mounted directory (a fresh subdirectory, removed after) | — |
//!
//! Options follow a colon, comma-separated: `lib:preset=cjfs,data=journal`.
//! - quill (`lib`, `quill-fuse`): `preset=` any of [`journal::config::PRESETS`], any journal setting
//!   (`versions_max=3`, …), `data=ordered|journal|writeback`, `io=auto|direct|buffered` (how the
//!   image file is opened, [`IoMode`]; the path taken is added to each run's note),
//!   `journal_mib=` (the journal's size at mkfs; mke2fs's default otherwise),
//!   `dev=file|simssd`, and with `dev=simssd` the device's latency model: `ssd=default|970pro`
//!   ([`SimSsdConfig::profile`]) and any of its fields on top (`ssd_flush_us=900`,
//!   `ssd_channels=4`, …).
//! - quill also: `atime=relatime|strictatime|noatime` (the mount's access-time mode), and
//!   `features=` (`-O` of quill's mkfs, `+` between names: `features=quota+project`).
//! - `quill-fuse` also: `threads=N`, the FUSE request threads (default
//!   [`quill_fuse::default_threads`]), and `fsync_inline=N`, the most fsyncs waiting on
//!   request threads (default [`quill_fuse::default_fsync_inline`]), and
//!   `writeback_cache=on|off`, the kernel's FUSE writeback cache (default off), and
//!   `killpriv=quill|kernel`, who drops set-id bits and capabilities (default quill), and
//!   `readdirplus=auto|on|off` (default off), `parallel_dirops=on|off` (default
//!   [`quill_fuse::DEFAULT_PARALLEL_DIROPS`]), and `entry_timeout=S`, `attr_timeout=S`,
//!   `negative_timeout=S` ([`quill_fuse::Timeouts`]), and `read_ahead_kb=N` (default
//!   [`quill_fuse::read_ahead::DEFAULT_READ_AHEAD_KB`]).
//! - `kernel-ext4`: `fast_commit` (mkfs.ext4 -O fast_commit); every other option goes to
//!   `mount -o` (`data=journal`, `journal_async_commit`, …).
//! - `fuse2fs`: options go to `fuse2fs -o`.
//!
//! The label (the whole spec as written) names the target in tables, files and plots.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockdev::file::{FileDevice, FileOptions, IoMode};
use blockdev::simssd::{SimSsd, SimSsdConfig};
use blockdev::BlockDevice;
use fs::{DataMode, Filesystem, MountOptions};
use journal::{JournalConfig, JournalStats};

use crate::fsapi::{FsApi, LibApi, PosixApi};
use crate::queue_depth::QueueDepthDevice;
use crate::results::{EngineFigures, FuseFigures};
use crate::workloads::StartHook;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Lib,
    QuillFuse,
    KernelExt4,
    Fuse2fs,
    Dir(PathBuf),
}

/// Where a quill target (`lib`, `quill-fuse`) keeps its image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuillDevice {
    File,
    SimSsd(SimSsdConfig),
}

/// A parsed target.
#[derive(Debug, Clone)]
pub struct TargetSpec {
    pub label: String,
    pub kind: Kind,
    /// quill targets: the mount options.
    pub quill: MountOptions,
    pub quill_device: QuillDevice,
    /// quill targets on an image file: how the file is opened.
    pub io: IoMode,
    /// quill targets: the journal's size (`journal_mib=`); None: mke2fs's default for the
    /// image size (64 MiB for the default 2 GiB image).
    pub journal_mib: Option<u32>,
    /// quill targets: features quill's mkfs adds or removes (`features=`, an `-O` list with
    /// `+` between names, since commas separate the target's options).
    pub mkfs_features: Option<String>,
    /// quill-fuse: the FUSE side of the mount (`threads=`, `fsync_inline=`, `killpriv=`,
    /// `readdirplus=`, `read_ahead_kb=`, the timeouts, `writeback_cache=on|off`,
    /// `parallel_dirops=on|off`); the mount's defaults otherwise. Each run mounts with a copy
    /// that counts its own requests.
    pub fuse: quill_fuse::MountConfig,
    /// kernel-ext4: `mkfs.ext4 -O fast_commit`.
    pub fast_commit: bool,
    /// kernel-ext4 and fuse2fs: passed to the mount.
    pub mount_options: Vec<String>,
}

/// Where the targets keep their images and mount points.
#[derive(Debug, Clone)]
pub struct Env {
    pub scratch: PathBuf,
    pub image_bytes: u64,
}

impl TargetSpec {
    pub fn parse(text: &str) -> Result<TargetSpec, String> {
        let (name, options) = match text.split_once(':') {
            Some((n, o)) => (n, o),
            None => (text, ""),
        };
        let kind = match name {
            "lib" => Kind::Lib,
            "quill-fuse" => Kind::QuillFuse,
            "kernel-ext4" => Kind::KernelExt4,
            "fuse2fs" => Kind::Fuse2fs,
            "dir" if !options.is_empty() => Kind::Dir(PathBuf::from(options)),
            "dir" => return Err("target dir needs a path: dir:/mnt/somewhere".into()),
            other => {
                return Err(format!(
                    "unknown target {other}; expected lib, quill-fuse, kernel-ext4, fuse2fs or dir:PATH"
                ))
            }
        };
        let mut spec = TargetSpec {
            label: text.to_string(),
            kind: kind.clone(),
            quill: MountOptions::default(),
            quill_device: QuillDevice::File,
            io: IoMode::default(),
            fast_commit: false,
            journal_mib: None,
            mkfs_features: None,
            fuse: quill_fuse::MountConfig::default(),
            mount_options: Vec::new(),
        };
        if matches!(kind, Kind::Dir(_)) {
            return Ok(spec);
        }
        let options: Vec<&str> = options.split(',').filter(|o| !o.is_empty()).collect();
        match kind {
            Kind::Lib | Kind::QuillFuse => {
                // preset= first wherever it is, then the settings on top (as mount -o does).
                for option in &options {
                    if let Some(preset) = option.strip_prefix("preset=") {
                        spec.quill.journal = JournalConfig::preset(preset).ok_or_else(|| {
                            format!(
                                "{text}: unknown preset {preset}; expected one of {}",
                                journal::config::PRESETS.join(", ")
                            )
                        })?;
                    }
                }
                // The simulated SSD's model: ssd= picks a profile and ssd_* fields go on top,
                // wherever they are written; dev=simssd takes the result after the loop.
                let mut ssd_profile = None;
                let mut ssd_fields = Vec::new();
                for option in options.iter().filter(|o| !o.starts_with("preset=")) {
                    let (key, value) = option
                        .split_once('=')
                        .ok_or_else(|| format!("{text}: option {option} needs a value"))?;
                    match key {
                        "data" => {
                            spec.quill.data = match value {
                                "ordered" => DataMode::Ordered,
                                "journal" => DataMode::Journal,
                                "writeback" => DataMode::Writeback,
                                _ => return Err(format!("{text}: data={value}?")),
                            }
                        }
                        "io" => spec.io = value.parse().map_err(|e| format!("{text}: {e}"))?,
                        "atime" => {
                            spec.quill.atime =
                                fs::AtimeMode::from_mount_option(value).ok_or_else(|| {
                                    format!(
                                        "{text}: atime={value}? (relatime, strictatime or noatime)"
                                    )
                                })?;
                        }
                        key if kind == Kind::QuillFuse
                            && quill_fuse::options::FUSE_SETTINGS.contains(&key) =>
                        {
                            quill_fuse::options::set_fuse_setting(&mut spec.fuse, key, value)
                                .map_err(|e| format!("{text}: {e}"))?;
                        }
                        "parallel_dirops" if kind == Kind::QuillFuse => {
                            spec.fuse.parallel_dirops = journal::config::on_off(key, value)
                                .map_err(|e| format!("{text}: {e}"))?;
                        }
                        "writeback_cache" if kind == Kind::QuillFuse => {
                            spec.fuse.writeback_cache = journal::config::on_off(key, value)
                                .map_err(|e| format!("{text}: {e}"))?;
                        }
                        "journal_mib" => {
                            let mib: u32 = value
                                .parse()
                                .ok()
                                .filter(|&m| (4..=4096).contains(&m))
                                .ok_or_else(|| {
                                    format!("{text}: journal_mib={value}? (4..=4096)")
                                })?;
                            spec.journal_mib = Some(mib);
                        }
                        "features" => {
                            let list = value.replace('+', ",");
                            fs::mkfs::Features::default()
                                .edit(&list)
                                .map_err(|e| format!("{text}: features={value}: {e}"))?;
                            spec.mkfs_features = Some(list);
                        }
                        "dev" => {
                            spec.quill_device = match value {
                                "file" => QuillDevice::File,
                                "simssd" => QuillDevice::SimSsd(SimSsdConfig::default()),
                                _ => return Err(format!("{text}: dev={value}? (file or simssd)")),
                            }
                        }
                        "ssd" => {
                            let profile = SimSsdConfig::profile(value).ok_or_else(|| {
                                format!(
                                    "{text}: ssd={value}? expected one of {}",
                                    SimSsdConfig::PROFILES.join(", ")
                                )
                            })?;
                            ssd_profile = Some(profile);
                        }
                        _ if key.starts_with("ssd_") => ssd_fields.push((&key[4..], value)),
                        _ => spec
                            .quill
                            .journal
                            .set(key, value)
                            .map_err(|e| format!("{text}: {e}"))?,
                    }
                }
                match &mut spec.quill_device {
                    QuillDevice::SimSsd(config) => {
                        *config = ssd_profile.unwrap_or_default();
                        for (key, value) in ssd_fields {
                            config.set(key, value).map_err(|e| format!("{text}: ssd_{e}"))?;
                        }
                    }
                    QuillDevice::File if ssd_profile.is_some() || !ssd_fields.is_empty() => {
                        return Err(format!("{text}: ssd options need dev=simssd"));
                    }
                    QuillDevice::File => {}
                }
            }
            Kind::KernelExt4 | Kind::Fuse2fs => {
                for option in options {
                    if option == "fast_commit" && kind == Kind::KernelExt4 {
                        spec.fast_commit = true;
                    } else {
                        spec.mount_options.push(option.to_string());
                    }
                }
            }
            Kind::Dir(_) => unreachable!("returned above"),
        }
        Ok(spec)
    }

    /// Whether the target is reached through a mount point (needed by external programs).
    pub fn is_mounted(&self) -> bool {
        self.kind != Kind::Lib
    }

    /// Whether quill's engine figures are available.
    pub fn is_quill(&self) -> bool {
        matches!(self.kind, Kind::Lib | Kind::QuillFuse)
    }

    /// Whether this machine can run the target; the reason if not.
    pub fn available(&self) -> Result<(), String> {
        let root = unsafe { libc::geteuid() } == 0;
        match &self.kind {
            Kind::Lib => Ok(()),
            Kind::QuillFuse => {
                fuse_device_opens()?;
                have_tool("fusermount3", "-V")
            }
            Kind::KernelExt4 => {
                if !root {
                    return Err("loop-mounting an image needs root".into());
                }
                have_tool("mkfs.ext4", "-V")?;
                have_tool("mount", "-V")
            }
            Kind::Fuse2fs => {
                fuse_device_opens()?;
                have_tool("mkfs.ext4", "-V")?;
                have_tool("fuse2fs", "-V")
            }
            Kind::Dir(path) => {
                if path.is_dir() {
                    Ok(())
                } else {
                    Err(format!("{} is not a directory", path.display()))
                }
            }
        }
    }

    /// A quill target's device, formatted with quill's mkfs and opened: a fresh image file at
    /// `image`, or a simulated SSD (whose media `check` copies to a file for e2fsck).
    fn open_quill(
        &self,
        env: &Env,
        image: &Path,
        prepared: &mut Prepared,
    ) -> Result<QuillSide, String> {
        let dev: Arc<dyn BlockDevice> = match self.quill_device {
            QuillDevice::File => {
                let io = FileOptions { io: self.io, ..FileOptions::default() };
                let dev = FileDevice::create_with(image, env.image_bytes, io)
                    .map_err(|e| e.to_string())?;
                prepared.image = Some(image.to_path_buf());
                prepared.io_path = Some(dev.io_path().to_string());
                Arc::new(dev)
            }
            QuillDevice::SimSsd(config) => {
                let ssd = Arc::new(SimSsd::new(env.image_bytes, config));
                prepared.simssd = Some(ssd.clone());
                ssd
            }
        };
        format_and_open_quill(dev, self)
    }

    /// Makes a fresh file system (image, mount) for one run; `id` makes its names unique.
    pub fn setup(&self, env: &Env, id: &str) -> Result<Prepared, String> {
        let image = env.scratch.join(format!("{id}.img"));
        let mountpoint = env.scratch.join(format!("{id}.mnt"));
        let mut prepared = Prepared {
            label: self.label.clone(),
            api: None,
            quill: None,
            mountpoint: None,
            image: None,
            simssd: None,
            cleanup_dir: None,
            mount: MountState::None,
            io_path: None,
            kernel_fc: None,
        };
        match &self.kind {
            Kind::Lib => {
                let quill = self.open_quill(env, &image, &mut prepared)?;
                prepared.api = Some(Box::new(LibApi::new(quill.fs.clone())));
                prepared.quill = Some(quill);
            }
            Kind::QuillFuse => {
                let mut quill = self.open_quill(env, &image, &mut prepared)?;
                make_dir(&mountpoint)?;
                prepared.mountpoint = Some(mountpoint.clone());
                let config = quill_fuse::MountConfig {
                    fsname: image.display().to_string(),
                    request_stats: Arc::default(),
                    ..self.fuse.clone()
                };
                let stats = config.request_stats.clone();
                let at_start = Arc::new(parking_lot::Mutex::new(stats.snapshot()));
                quill.fuse = Some(FuseCounters { stats, at_start, threads: config.threads });
                let session = quill_fuse::mount(quill.fs.clone(), &mountpoint, &config)
                    .map_err(|e| format!("FUSE mount on {}: {e}", mountpoint.display()))?;
                let session = session.spawn().map_err(|e| format!("FUSE session: {e}"))?;
                prepared.mount = MountState::Fuse(session);
                prepared.quill = Some(quill);
                prepared.api = Some(Box::new(PosixApi::new(&mountpoint)));
            }
            Kind::KernelExt4 | Kind::Fuse2fs => {
                make_ext4(&image, env.image_bytes, self.fast_commit)?;
                prepared.image = Some(image.clone());
                make_dir(&mountpoint)?;
                prepared.mountpoint = Some(mountpoint.clone());
                prepared.mount =
                    mount_external(&self.kind, &image, &mountpoint, &self.mount_options)?;
                prepared.api = Some(Box::new(PosixApi::new(&mountpoint)));
                if self.kind == Kind::KernelExt4 && self.fast_commit {
                    match crate::kernel_fc::KernelFcTrace::start(&mountpoint, id) {
                        Ok(trace) => prepared.kernel_fc = Some(trace),
                        Err(e) => eprintln!("note: {}: fast commits not traced: {e}", self.label),
                    }
                }
            }
            Kind::Dir(path) => {
                let dir = path.join(format!("quill-bench-{id}"));
                make_dir(&dir)?;
                prepared.cleanup_dir = Some(dir.clone());
                prepared.api = Some(Box::new(PosixApi::new(&dir)));
            }
        }
        Ok(prepared)
    }
}

fn fuse_device_opens() -> Result<(), String> {
    let opened = std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse");
    opened.map(drop).map_err(|e| format!("/dev/fuse cannot be opened ({e})"))
}

fn have_tool(tool: &str, arg: &str) -> Result<(), String> {
    match Command::new(tool).arg(arg).stdout(Stdio::null()).stderr(Stdio::null()).status() {
        Ok(_) => Ok(()),
        Err(_) => Err(format!("{tool} is not installed")),
    }
}

fn make_dir(path: &Path) -> Result<(), String> {
    std::fs::create_dir_all(path).map_err(|e| format!("cannot create {}: {e}", path.display()))
}

/// quill on `dev`, formatted by quill's mkfs, with a queue-depth probe under it.
pub struct QuillSide {
    pub fs: Arc<Filesystem>,
    pub queue: Arc<QueueDepthDevice>,
    flusher: Option<fs::Flusher>,
    stats_at_start: Arc<parking_lot::Mutex<JournalStats>>,
    /// quill-fuse: the mount's request counters, their snapshot when measuring started, and
    /// the request threads.
    fuse: Option<FuseCounters>,
}

#[derive(Clone)]
struct FuseCounters {
    stats: Arc<quill_fuse::RequestStats>,
    at_start: Arc<parking_lot::Mutex<quill_fuse::RequestFigures>>,
    threads: usize,
}

/// Formats `dev` with quill's mkfs and opens it. An image file is freshly created and sparse,
/// so mkfs writes out its journal and inode tables, as `mkfs.ext4 -E
/// lazy_itable_init=0,lazy_journal_init=0` does for the kernel targets: otherwise the first pass
/// of the log would pay the host file system's block allocation (a host journal commit) in
/// every flush, which neither a block device nor the kernel target pays.
fn format_and_open_quill(
    dev: Arc<dyn BlockDevice>,
    spec: &TargetSpec,
) -> Result<QuillSide, String> {
    let options = &spec.quill;
    let sparse_file = spec.quill_device == QuillDevice::File;
    let mut mkfs = fs::mkfs::MkfsOptions { device_zeroed: !sparse_file, ..Default::default() };
    if let Some(mib) = spec.journal_mib {
        mkfs.journal_blocks =
            Some((u64::from(mib) * (1 << 20) / u64::from(mkfs.block_size)) as u32);
    }
    if let Some(list) = &spec.mkfs_features {
        mkfs.features.edit(list).map_err(|e| format!("quill mkfs -O {list}: {e}"))?;
    }
    if options.journal.fsync_journal {
        // iJournaling writes ext4 fast commits: the image needs their area (mke2fs's default
        // size, a 64th of the journal).
        mkfs.features.compat |= ondisk::ext4::feature::COMPAT_FAST_COMMIT;
    }
    fs::mkfs::mkfs(dev.as_ref(), &mkfs).map_err(|e| format!("quill mkfs: {e}"))?;
    let queue = Arc::new(QueueDepthDevice::new(dev));
    let fs = Filesystem::open(queue.clone(), options.clone()).map_err(|e| format!("open: {e}"))?;
    let fs = Arc::new(fs);
    // Expired data is written back in the background, as the kernel's flusher threads do
    // (the FUSE adapter starts its own).
    let flusher = fs.start_flusher(Duration::from_secs(1)).ok();
    let stats_at_start = Arc::new(parking_lot::Mutex::new(fs.journal().stats()));
    Ok(QuillSide { fs, queue, flusher, stats_at_start, fuse: None })
}

/// A sparse image formatted by mkfs.ext4 as CJFS's scripts do (no lazy init, so background
/// initialization does not run during the measurement).
pub fn make_ext4(image: &Path, bytes: u64, fast_commit: bool) -> Result<(), String> {
    let file = std::fs::File::create(image)
        .map_err(|e| format!("cannot create {}: {e}", image.display()))?;
    file.set_len(bytes).map_err(|e| format!("cannot size {}: {e}", image.display()))?;
    drop(file);
    let mut mkfs = Command::new("mkfs.ext4");
    mkfs.args(["-F", "-q", "-E", "lazy_itable_init=0,lazy_journal_init=0"]);
    if fast_commit {
        mkfs.args(["-O", "fast_commit"]);
    }
    run_tool(mkfs.arg(image))
}

/// Runs a command; its stderr (last lines) on failure.
pub fn run_tool(cmd: &mut Command) -> Result<(), String> {
    let output = cmd.output().map_err(|e| format!("{:?}: {e}", cmd.get_program()))?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let tail: Vec<&str> = stderr.lines().chain(stdout.lines()).rev().take(3).collect();
    Err(format!("{:?} failed ({}): {}", cmd.get_program(), output.status, tail.join(" | ")))
}

enum MountState {
    None,
    Fuse(quill_fuse::fuser::BackgroundSession),
    Kernel,
    Fuse2fs(Child),
}

/// Mounts an ext4 image with the kernel (loop) or fuse2fs.
fn mount_external(
    kind: &Kind,
    image: &Path,
    mountpoint: &Path,
    options: &[String],
) -> Result<MountState, String> {
    match kind {
        Kind::KernelExt4 => {
            let mut opts = vec!["loop".to_string()];
            opts.extend(options.iter().cloned());
            run_tool(
                Command::new("mount")
                    .args(["-t", "ext4", "-o", &opts.join(",")])
                    .arg(image)
                    .arg(mountpoint),
            )?;
            Ok(MountState::Kernel)
        }
        Kind::Fuse2fs => {
            let mut cmd = Command::new("fuse2fs");
            cmd.arg(image).arg(mountpoint).arg("-f");
            if !options.is_empty() {
                cmd.args(["-o", &options.join(",")]);
            }
            let mut child = cmd
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| format!("fuse2fs: {e}"))?;
            let began = Instant::now();
            while !is_mountpoint(mountpoint) {
                if let Ok(Some(status)) = child.try_wait() {
                    let mut err = String::new();
                    if let Some(mut stderr) = child.stderr.take() {
                        let _ = io::Read::read_to_string(&mut stderr, &mut err);
                    }
                    return Err(format!("fuse2fs exited ({status}): {}", err.trim()));
                }
                if began.elapsed() > Duration::from_secs(20) {
                    let _ = child.kill();
                    return Err("fuse2fs did not mount within 20 s".into());
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Ok(MountState::Fuse2fs(child))
        }
        _ => Ok(MountState::None),
    }
}

/// Whether `path` is a mount point (listed in /proc/self/mountinfo).
pub fn is_mountpoint(path: &Path) -> bool {
    let Ok(path) = path.canonicalize() else { return false };
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else { return false };
    let wanted = path.to_string_lossy().replace(' ', "\\040");
    info.lines().any(|l| l.split(' ').nth(4) == Some(wanted.as_str()))
}

/// Unmounts `mountpoint`, retrying while it is busy (a file closed a moment ago).
pub fn umount(mountpoint: &Path) -> Result<(), String> {
    let mut last = String::new();
    for _ in 0..50 {
        match run_tool(Command::new("umount").arg(mountpoint)) {
            Ok(()) => return Ok(()),
            Err(e) => last = e,
        }
        if !is_mountpoint(mountpoint) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(last)
}

/// `e2fsck -fn IMAGE`: `Ok(Some(true))` clean, an error with e2fsck's complaints if not,
/// `Ok(None)` when e2fsck is missing.
pub fn fsck(image: &Path) -> Result<Option<bool>, String> {
    for attempt in 0..2 {
        let output = match Command::new("e2fsck").arg("-fn").arg(image).output() {
            Ok(o) => o,
            Err(_) => return Ok(None),
        };
        if output.status.code() == Some(0) {
            return Ok(Some(true));
        }
        let stdout = String::from_utf8_lossy(&output.stdout);
        // e2fsck reads the coarse clock (time(2)), which can lag the precise one quill stamps
        // s_wtime with by a tick, so a check right after unmount may see the write time a
        // second "in the future". Checking again a second later tells that from damage.
        let only_the_clock = stdout.matches("Fix? no").count() == 1
            && stdout.contains("last write time is in the future");
        if attempt == 0 && only_the_clock {
            std::thread::sleep(Duration::from_millis(1100));
            continue;
        }
        let problems: Vec<&str> =
            stdout.lines().filter(|l| !l.starts_with("Pass ") && !l.trim().is_empty()).collect();
        return Err(format!("e2fsck -fn {}: {}", image.display(), problems.join(" | ")));
    }
    unreachable!("the second attempt returns")
}

/// A target set up for one run.
pub struct Prepared {
    label: String,
    api: Option<Box<dyn FsApi>>,
    quill: Option<QuillSide>,
    mountpoint: Option<PathBuf>,
    image: Option<PathBuf>,
    simssd: Option<Arc<SimSsd>>,
    cleanup_dir: Option<PathBuf>,
    mount: MountState,
    /// quill on an image file: the I/O path the file device took ([`blockdev::file::IoPath`]).
    pub io_path: Option<String>,
    /// kernel-ext4:fast_commit: its fast commits, traced ([`crate::kernel_fc`]).
    kernel_fc: Option<crate::kernel_fc::KernelFcTrace>,
}

impl Prepared {
    pub fn api(&self) -> &dyn FsApi {
        self.api.as_deref().expect("set up")
    }

    /// The directory the target is mounted on (or the directory it runs in).
    pub fn mounted_dir(&self) -> Option<&Path> {
        self.mountpoint.as_deref().or(self.cleanup_dir.as_deref())
    }

    /// A hook for [`crate::workloads::WorkloadParams::on_start`]: engine and queue figures
    /// count from the moment it is called. It holds the file system weakly, so a hook that
    /// outlives the run does not keep it open.
    pub fn measure_hook(&self) -> StartHook {
        if let Some(trace) = &self.kernel_fc {
            return StartHook(Some(Arc::new(trace.restarter())));
        }
        let Some(q) = &self.quill else { return StartHook::default() };
        let (fs, queue, at_start) =
            (Arc::downgrade(&q.fs), q.queue.clone(), q.stats_at_start.clone());
        let fuse = q.fuse.clone();
        StartHook(Some(Arc::new(move || {
            if let Some(fs) = fs.upgrade() {
                *at_start.lock() = fs.journal().stats();
                queue.reset();
            }
            if let Some(fuse) = &fuse {
                fuse.stats.restart_peak();
                *fuse.at_start.lock() = fuse.stats.snapshot();
            }
        })))
    }

    /// kernel-ext4:fast_commit: what its fast commits did since the measured phase began
    /// (tracing stops here).
    pub fn kernel_fc_figures(&mut self) -> Option<crate::kernel_fc::KernelFcFigures> {
        self.kernel_fc.take().map(crate::kernel_fc::KernelFcTrace::finish)
    }

    /// The engine's figures since [`Prepared::start_measuring`] (quill targets).
    pub fn engine_figures(&self) -> Option<EngineFigures> {
        let q = self.quill.as_ref()?;
        let (a, b) = (q.fs.journal().stats(), q.stats_at_start.lock().clone());
        let transactions = a.transactions - b.transactions;
        let per = |n: u64| if transactions == 0 { 0.0 } else { n as f64 / transactions as f64 };
        let (queue_depth_mean, queue_depth_max) = q.queue.depth();
        Some(EngineFigures {
            transactions,
            handles_per_transaction: per(a.handles - b.handles),
            conflicts_per_transaction: per(a.conflicts - b.conflicts),
            flushes_per_transaction: per(a.flushes - b.flushes),
            ms_locked: a.ms_locked - b.ms_locked,
            ms_writing: a.ms_writing - b.ms_writing,
            ms_flushing: a.ms_flushing - b.ms_flushing,
            queue_depth_mean,
            queue_depth_max,
            ms_device_flush: a.ms_device_flush - b.ms_device_flush,
            ms_running: a.ms_running - b.ms_running,
            ms_slot_wait: a.ms_slot_wait - b.ms_slot_wait,
            ms_conflict_wait: a.ms_conflict_wait - b.ms_conflict_wait,
            ms_flush_queue: a.ms_flush_queue - b.ms_flush_queue,
            ms_commit_fua: a.ms_commit_fua - b.ms_commit_fua,
            ms_ordered_wait: a.ms_ordered_wait - b.ms_ordered_wait,
            handles: a.handles - b.handles,
            ms_handle_start_wait: a.ms_handle_start_wait - b.ms_handle_start_wait,
            in_flight_max: a.in_flight_max,
            fast_commits: a.fast_commits - b.fast_commits,
            fast_commit_blocks: a.fast_commit_blocks - b.fast_commit_blocks,
            fast_commit_writes: a.fast_commit_writes - b.fast_commit_writes,
            journal_bytes: (a.log_blocks_written + a.fast_commit_blocks + a.checkpoint_blocks
                - b.log_blocks_written
                - b.fast_commit_blocks
                - b.checkpoint_blocks)
                * u64::from(q.fs.block_size()),
            device_syncs: a.flushes + a.checkpoint_flushes + a.fua_writes + a.fast_commit_syncs
                - b.flushes
                - b.checkpoint_flushes
                - b.fua_writes
                - b.fast_commit_syncs,
            fast_commit_fallbacks: a
                .fast_commit_fallbacks
                .iter()
                .map(|(reason, n)| {
                    let before = b.fast_commit_fallbacks.iter().find(|(r, _)| r == reason);
                    (reason.clone(), n - before.map_or(0, |(_, m)| *m))
                })
                .filter(|(_, n)| *n > 0)
                .collect(),
            lock_wait_ms: a
                .locks
                .named()
                .iter()
                .zip(b.locks.named())
                .map(|((name, now), (_, then))| (name.to_string(), now.ms - then.ms))
                .collect(),
            fuse: q.fuse.as_ref().map(|fuse| {
                let now = fuse.stats.snapshot();
                FuseFigures {
                    threads: fuse.threads,
                    ops: now
                        .since(&fuse.at_start.lock())
                        .into_iter()
                        .map(|(name, n, ns)| (name.to_string(), n, ns as f64 / 1e6))
                        .collect(),
                    fsyncs_in_flight_max: now.fsyncs_in_flight_max,
                }
            }),
        })
    }

    /// Unmounts, checks the image with `e2fsck -fn` and deletes it. Returns the check's
    /// verdict (`None`: nothing to check, or no e2fsck); an unclean image is an error.
    pub fn finish(mut self) -> Result<Option<bool>, String> {
        let result = self.teardown();
        let verdict = result.and_then(|()| self.check());
        self.remove_files();
        verdict
    }

    fn teardown(&mut self) -> Result<(), String> {
        self.api = None;
        let mut first_error: Option<String> = None;
        let mut note = |e: String| {
            first_error.get_or_insert(e);
        };
        match std::mem::replace(&mut self.mount, MountState::None) {
            MountState::None => {}
            MountState::Fuse(session) => {
                let mountpoint = self.mountpoint.clone().expect("mounted");
                if let Err(e) = umount(&mountpoint) {
                    note(format!("umount {}: {e}", self.label));
                }
                if let Err(e) = session.join() {
                    note(format!("FUSE session of {}: {e}", self.label));
                }
            }
            MountState::Kernel => {
                if let Err(e) = umount(self.mountpoint.as_deref().expect("mounted")) {
                    note(e);
                }
            }
            MountState::Fuse2fs(mut child) => {
                if let Err(e) = umount(self.mountpoint.as_deref().expect("mounted")) {
                    note(e);
                    let _ = child.kill();
                }
                // fuse2fs writes its last changes and marks the image clean as it exits.
                match child.wait() {
                    Ok(s) if s.success() => {}
                    Ok(s) => note(format!("fuse2fs exited with {s}")),
                    Err(e) => note(format!("fuse2fs: {e}")),
                }
            }
        }
        if let Some(q) = self.quill.take() {
            drop(q.flusher);
            if let Err(e) = quill_fuse::unmount_fs(q.fs) {
                note(format!("unmounting {}: {e}", self.label));
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn check(&mut self) -> Result<Option<bool>, String> {
        if let Some(ssd) = self.simssd.take() {
            // e2fsck needs a file: check a copy of the simulated SSD's media.
            let dir = std::env::temp_dir();
            let copy = dir.join(format!("quill-bench-simssd-{}.img", std::process::id()));
            std::fs::write(&copy, ssd.snapshot())
                .map_err(|e| format!("{}: {e}", copy.display()))?;
            let verdict = fsck(&copy);
            let _ = std::fs::remove_file(&copy);
            return verdict;
        }
        match &self.image {
            Some(image) => fsck(image),
            None => Ok(None),
        }
    }

    fn remove_files(&mut self) {
        // Scratch space: failing to delete it loses nothing, and the next run uses new names.
        if let Some(image) = self.image.take() {
            let _ = std::fs::remove_file(image);
        }
        if let Some(mountpoint) = self.mountpoint.take() {
            if !is_mountpoint(&mountpoint) {
                let _ = std::fs::remove_dir(mountpoint);
            }
        }
        if let Some(dir) = self.cleanup_dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl Drop for Prepared {
    fn drop(&mut self) {
        // An error path dropped the target without finish(): never leave a mount behind.
        let _ = self.teardown();
        self.remove_files();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_bad_ones_are_refused_by_name() {
        let lib = TargetSpec::parse("lib:preset=cjfs,versions_max=3,data=journal").unwrap();
        assert_eq!(lib.kind, Kind::Lib);
        assert_eq!(lib.quill.journal.versions_max, 3);
        assert_eq!(lib.quill.data, DataMode::Journal);
        assert_eq!(lib.label, "lib:preset=cjfs,versions_max=3,data=journal");
        let k = TargetSpec::parse("kernel-ext4:fast_commit,data=journal").unwrap();
        assert!(k.fast_commit);
        assert_eq!(k.mount_options, vec!["data=journal"]);
        assert_eq!(TargetSpec::parse("dir:/tmp").unwrap().kind, Kind::Dir("/tmp".into()));
        assert_eq!(TargetSpec::parse("lib").unwrap().io, IoMode::Buffered);
        assert_eq!(TargetSpec::parse("lib:io=buffered").unwrap().io, IoMode::Buffered);
        assert_eq!(TargetSpec::parse("quill-fuse:io=direct").unwrap().io, IoMode::Direct);
        assert_eq!(TargetSpec::parse("quill-fuse:threads=32").unwrap().fuse.threads, 32);
        let inline = TargetSpec::parse("quill-fuse:fsync_inline=0").unwrap();
        assert_eq!(inline.fuse.fsync_inline, Some(0));
        assert!(TargetSpec::parse("lib:fsync_inline=0").is_err());
        assert!(TargetSpec::parse("quill-fuse:writeback_cache=on").unwrap().fuse.writeback_cache);
        assert!(TargetSpec::parse("quill-fuse:writeback_cache=maybe").is_err());
        let noatime = TargetSpec::parse("quill-fuse:atime=noatime").unwrap();
        assert_eq!(noatime.quill.atime, fs::AtimeMode::Never);
        assert!(TargetSpec::parse("lib:atime=sometimes").is_err());
        assert!(TargetSpec::parse("quill-fuse:threads=0").is_err());
        // A FUSE setting, not a journal one: the library target has no request threads.
        assert!(TargetSpec::parse("lib:threads=8").is_err());
        let ssd = TargetSpec::parse("lib:ssd_flush_us=900,dev=simssd,ssd=970pro").unwrap();
        let want = SimSsdConfig { flush_us: 900, ..SimSsdConfig::samsung_970_pro() };
        assert_eq!(ssd.quill_device, QuillDevice::SimSsd(want));
        assert_eq!(
            TargetSpec::parse("quill-fuse:journal_mib=1024").unwrap().journal_mib,
            Some(1024)
        );
        assert_eq!(
            TargetSpec::parse("lib:features=quota+project").unwrap().mkfs_features.as_deref(),
            Some("quota,project")
        );
        assert!(TargetSpec::parse("lib:features=casefold").is_err());
        assert_eq!(
            TargetSpec::parse("quill-fuse:journal_mib=1024").unwrap().journal_mib,
            Some(1024)
        );
        let fuse = TargetSpec::parse("quill-fuse:dev=simssd,ssd=970pro").unwrap();
        assert_eq!(fuse.quill_device, QuillDevice::SimSsd(SimSsdConfig::samsung_970_pro()));
        let plain = TargetSpec::parse("lib:dev=simssd").unwrap();
        assert_eq!(plain.quill_device, QuillDevice::SimSsd(SimSsdConfig::default()));
        for bad in [
            "lib:io=cached",
            "nfs",
            "dir",
            "lib:preset=zfs",
            "lib:data=bogus",
            "lib:frobnicate=1",
            "lib:ssd=970pro",
            "lib:dev=simssd,ssd=optane",
            "lib:dev=simssd,ssd_flush_us=soon",
            "quill-fuse:ssd_flush_us=9",
            "lib:journal_mib=2",
            "lib:journal_mib=big",
        ] {
            let err = TargetSpec::parse(bad).unwrap_err();
            assert!(!err.is_empty(), "{bad}");
        }
    }
}
