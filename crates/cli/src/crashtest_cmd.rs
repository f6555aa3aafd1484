//! `quill crashtest`: the crash-state explorer (crates/crashtest) from the command line.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use crashtest::explore::{self, default_configs, Failure, Options};
use crashtest::kernel_fc::{self, KernelOptions};
use journal::config::PRESETS;

use crate::progress::Progress;

#[derive(clap::Args)]
pub struct CrashtestArgs {
    /// Crash images to check (workloads are started until this many are checked and every
    /// journal preset has had one).
    #[arg(long, default_value_t = 1000)]
    images: u64,
    /// Check 100,000 crash images (unless --images says otherwise).
    #[arg(long)]
    long: bool,
    /// Seed of the workload generator and the crash-state sampling (default: the clock).
    #[arg(long)]
    seed: Option<u64>,
    /// Worker threads (default: one per core).
    #[arg(long)]
    jobs: Option<usize>,
    /// Journal presets the workloads rotate through, comma-separated (default: every preset).
    /// A preset brings its variants along: `cjfs` also runs `cjfs,commit_record=barrier`.
    #[arg(long, value_delimiter = ',')]
    presets: Vec<String>,
    /// Data modes the workloads rotate through, comma-separated (ordered, journal).
    #[arg(long, value_delimiter = ',', default_value = "ordered,journal")]
    data: Vec<String>,
    /// Every N-th workload runs several threads of longer random sequences (0: never).
    #[arg(long, default_value_t = 8)]
    threaded_every: usize,
    /// Every N-th single-threaded workload is a mailbox one: varmail's deletes, creates and
    /// fsyncs in one large (indexed) directory (0: never).
    #[arg(long, default_value_t = 8)]
    mailbox_every: usize,
    /// Every N-th workload runs on an ext3 image made by mkfs.ext3 (files, directories and
    /// the journal indirect-mapped) instead of quill's ext4 (0: never). Needs mkfs.ext3
    /// (otherwise a SKIP line).
    #[arg(long, value_name = "N", default_value_t = 0)]
    ext3_every: usize,
    /// Every N-th workload runs on an ext2 image made by mkfs.ext2 (indirect-mapped, no
    /// journal: quill's commits write home) instead (0: never). Its crash images are checked
    /// as ext2 promises: `e2fsck -fy` repairs them, and every file an fsync, fdatasync or sync
    /// made durable and nothing changed since is intact. Needs mkfs.ext2 (otherwise a SKIP
    /// line).
    #[arg(long, value_name = "N", default_value_t = 0)]
    ext2_every: usize,
    /// Every N-th workload runs on an inline_data image (quill's mkfs with `-O inline_data`:
    /// small files and directories live in their inodes and move out as they grow) instead
    /// (0: never).
    #[arg(long, value_name = "N", default_value_t = 0)]
    inline_every: usize,
    /// Every N-th workload runs on a quota image (quill's mkfs with `-O quota,project`:
    /// blocks and inodes are charged in the quota files, which e2fsck checks on every crash
    /// image) instead (0: never).
    #[arg(long, value_name = "N", default_value_t = 0)]
    quota_every: usize,
    /// Every N-th workload runs on a bigalloc image made by mkfs.ext4 (`-O bigalloc`, 4-block
    /// clusters: files own whole clusters, a partly unmapped one stays theirs) instead (0:
    /// never). Needs mkfs.ext4 (otherwise a SKIP line).
    #[arg(long, value_name = "N", default_value_t = 0)]
    bigalloc_every: usize,
    /// Threads of a threaded workload.
    #[arg(long, default_value_t = 3)]
    threads: usize,
    /// Crash states checked per workload at most, flush boundaries first (0: all).
    #[arg(long, default_value_t = 120)]
    max_states: usize,
    /// Stop after this many failing workloads (0: never stop; every failure is reported).
    #[arg(long, default_value_t = 3)]
    max_failures: usize,
    /// Where reproducers of failures are written.
    #[arg(long, default_value = "crashtest-out")]
    out: PathBuf,
    /// Also run N workloads on a kernel loop mount of a `mkfs.ext4 -O fast_commit` image and
    /// check a copy of it taken after every fsync, fdatasync and sync (and at the end):
    /// quill's recovery (fast commits replayed), the acknowledged operations, e2fsck -fn, and
    /// e2fsck -fy's tree. Needs root and loop devices (otherwise a SKIP line).
    #[arg(long, value_name = "N", default_value_t = 0)]
    kernel_fast_commit: usize,
    /// Also recover every N-th crash image of an fsync_journal workload (ijournal, all) with a
    /// kernel loop mount: the kernel's tree must be quill's, keep what was acknowledged, and
    /// pass e2fsck -fn. 0: never. Needs root and loop devices (otherwise a SKIP line).
    #[arg(long, value_name = "N", default_value_t = 0)]
    kernel_mount_every: u64,
    /// Replay a reproducer file: its workload and crash state (or all its states).
    #[arg(long, value_name = "FILE")]
    replay: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    no_progress: bool,
    /// The negative control: run on a device that acknowledges flushes without honouring
    /// them (and copy kernel images before each persistence point). The checks must fail
    /// (and the command exit 1).
    #[arg(long, hide = true)]
    lying_device: bool,
}

/// The progress bar on a terminal; without one (logs, CI), a line at every tenth of the way.
struct Bar {
    bar: Progress,
    lines: bool,
    tenths: AtomicU64,
    started: Instant,
}

impl explore::Progress for Bar {
    fn images(&self, checked: u64, target: u64) {
        self.bar.set(checked, target);
        let tenth = (checked * 10 / target.max(1)).min(10);
        if self.lines && self.tenths.fetch_max(tenth, Ordering::Relaxed) < tenth {
            println!(
                "{checked} of {target} crash images checked ({:.0} s)",
                self.started.elapsed().as_secs_f64()
            );
        }
    }

    fn failure(&self, f: &Failure) {
        self.bar.println(&format!(
            "FAIL {} in workload {} (seed {}): {}",
            f.check,
            f.workload.name,
            f.workload.seed,
            f.message.lines().last().unwrap_or("")
        ));
    }
}

pub fn run(args: CrashtestArgs) -> Result<()> {
    if !crashtest::check::have_e2fsck() {
        bail!("e2fsck is not installed (the e2fsprogs package): crashtest needs it as a judge");
    }
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let mut opts = Options::standard(seed);
    opts.images = if args.long && args.images == 1000 { 100_000 } else { args.images };
    if let Some(jobs) = args.jobs {
        if jobs == 0 || jobs > 256 {
            bail!("--jobs must be in 1..=256");
        }
        opts.jobs = jobs;
    }
    if args.threads < 2 || args.threads > 16 {
        bail!("--threads must be in 2..=16");
    }
    opts.threads = args.threads;
    opts.threaded_every = args.threaded_every;
    opts.mailbox_every = args.mailbox_every;
    opts.max_states = (args.max_states > 0).then_some(args.max_states);
    opts.max_failures = if args.max_failures == 0 { usize::MAX } else { args.max_failures };
    for p in &args.presets {
        if !PRESETS.contains(&p.as_str()) {
            bail!("--presets: unknown preset {p} (expected one of {})", PRESETS.join(", "));
        }
    }
    let presets: Vec<String> = if args.presets.is_empty() {
        PRESETS.iter().map(|p| p.to_string()).collect()
    } else {
        args.presets.clone()
    };
    // A configuration's preset is the first word of its spec (`cjfs,commit_record=barrier`).
    let preset_of = |spec: &str| spec.split(',').next().unwrap_or_default().to_string();
    for d in &args.data {
        if d != "ordered" && d != "journal" {
            bail!("--data: {d} is not ordered or journal");
        }
    }
    opts.configs = default_configs()
        .into_iter()
        .filter(|c| presets.contains(&preset_of(&c.preset)) && args.data.contains(&c.data))
        .collect();
    opts.out = args.out.clone();
    if args.ext3_every > 0 {
        match crashtest::run::ext3_available() {
            Err(reason) => println!("SKIP: ext3 images: {reason}"),
            Ok(()) => opts.ext3_every = args.ext3_every,
        }
    }
    if args.ext2_every > 0 {
        match crashtest::run::ext2_available() {
            Err(reason) => println!("SKIP: ext2 images: {reason}"),
            Ok(()) => opts.ext2_every = args.ext2_every,
        }
    }
    opts.inline_every = args.inline_every;
    opts.quota_every = args.quota_every;
    if args.bigalloc_every > 0 {
        match crashtest::run::bigalloc_available() {
            Err(reason) => println!("SKIP: bigalloc images: {reason}"),
            Ok(()) => opts.bigalloc_every = args.bigalloc_every,
        }
    }
    if args.kernel_mount_every > 0 {
        match kernel_fc::unavailable() {
            Some(reason) => println!("SKIP: kernel recovery of crash images: {reason}"),
            None => opts.kernel_mount_every = args.kernel_mount_every,
        }
    }
    for config in &mut opts.configs {
        config.lying_device = args.lying_device;
    }

    if let Some(file) = &args.replay {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        let (report, ok) = explore::replay(&text, &opts).map_err(anyhow::Error::msg)?;
        print!("{report}");
        if !ok {
            bail!("the reproducer still fails");
        }
        println!("the reproducer passes");
        return Ok(());
    }

    println!(
        "quill crashtest: seed {seed}, {} crash images, {} jobs, {} configurations (rerun with \
         --seed {seed})",
        opts.images,
        opts.jobs,
        opts.configs.len()
    );
    let progress = Progress::new("crash images", opts.images, !args.no_progress, false);
    let bar = Bar {
        lines: !progress.is_drawn(),
        bar: progress,
        tenths: AtomicU64::new(0),
        started: Instant::now(),
    };
    let mut totals = explore::explore(&opts, &bar);
    bar.bar.finish();
    if args.kernel_fast_commit > 0 {
        match kernel_fc::unavailable() {
            Some(reason) => println!("SKIP: kernel fast-commit images: {reason}"),
            None => {
                let kernel = kernel_fc::explore_kernel(&KernelOptions {
                    workloads: args.kernel_fast_commit,
                    seed,
                    max_failures: opts.max_failures,
                    lying: args.lying_device,
                });
                for note in &kernel.notes {
                    println!("NOTE {note}");
                }
                totals.seconds += kernel.seconds;
                totals.add(kernel);
            }
        }
    }
    println!("{}", totals.summary());
    if totals.failures.is_empty() {
        return Ok(());
    }
    let paths = explore::write_reproducers(&totals.failures, &opts.out)
        .with_context(|| format!("cannot write reproducers to {}", opts.out.display()))?;
    for (f, path) in totals.failures.iter().zip(&paths) {
        println!("\nFAIL {}: {}", f.check, path.display());
        print!("{}", f.reproducer(false));
    }
    bail!("{} workloads failed; rerun one with quill crashtest --replay FILE", paths.len())
}
