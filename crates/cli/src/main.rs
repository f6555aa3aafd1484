//! The `quill` command.
//!
//! Exit codes: 0 success; 1 the operation failed (the message says why); 2 bad usage (clap, or
//! an option value a subcommand rejects before doing anything).

/// See Cargo.toml for why quill brings its own allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay` (its place in `mi_option_e` in mimalloc.h, the same in the
/// v2 and v3 sources libmimalloc-sys builds; the crate names the option after it, not this one).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Never give freed pages back to the OS (see Cargo.toml): -1 is "no purging at all".
fn keep_freed_memory() {
    // SAFETY: setting an option is thread-safe in mimalloc and takes plain integers.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
    // The neighbour the crate does name pins the numbering this relies on.
    const _: () = assert!(libmimalloc_sys::mi_option_use_numa_nodes - 1 == MI_OPTION_PURGE_DELAY);
    // SAFETY: reading an option takes a plain integer.
    debug_assert_eq!(unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) }, -1);
}

mod bench_cmd;
mod crashtest_cmd;
mod dump;
mod fsbench_cmd;
mod info;
mod mkfs_cmd;
mod mount_cmd;
mod mount_helper;
mod mount_log;
mod mount_test_fault;
mod progress;
mod recover;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "quill", version, about = "A userspace ext4 with a scalable JBD2 journal")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replay an image's journal offline (like e2fsck's journal replay) and clear needs_recovery.
    Recover(recover::RecoverArgs),
    /// Inspect or benchmark the journal.
    #[command(subcommand)]
    Journal(JournalCommand),
    /// Format an image or block device as ext4, as mkfs.ext4 does.
    Mkfs(mkfs_cmd::MkfsArgs),
    /// Describe an image (like dumpe2fs -h): geometry, features, free space, state, journal.
    Info(info::InfoArgs),
    /// Benchmark file systems: the papers' workloads on quill, the kernel's ext4, fuse2fs and
    /// any directory, side by side, with a device probe, a table, JSON, CSV and plots.
    Bench(fsbench_cmd::FsBenchArgs),
    /// Crash-test quill: ACE-style workloads on a recording device, every crash image recovered
    /// by quill and by e2fsck and checked against what was acknowledged.
    Crashtest(crashtest_cmd::CrashtestArgs),
    /// Mount an image through FUSE; goes to the background once the mount is live.
    #[command(after_help = MOUNT_HELP)]
    Mount(MountArgs),
}

const MOUNT_HELP: &str = "\
Options (-o, comma-separated, later ones win):
  ro, rw                          read-only / read-write (default)
  data=ordered|journal|writeback  how file data is written (default ordered)
  commit=SECONDS                  journal commit interval (default 5)
  errors=remount-ro|continue      on a file-system error: stop writing (default), or
                                  report it, mark the image for e2fsck and go on
  allow_other                     let every user in (permissions are still checked)
  preset=NAME                     journal preset: classic (default), dual, barrierfs,
                                  cjfs, fast18-io, fast18, ijournal, all
  committing_max=N, flush_batch_max=N, versions_max=N, coalescing=0|1, recovery_threads=N,
  lists=locked|lockfree, commit_io=thread|cooperative, checkpoint_io=mutex|cooperative,
  commit_record=fua|chained|barrier, fsync_journal=on|off
                                  one journal technique setting, on top of the preset
                                  (barrier needs a device with a cache barrier: an image
                                  file has none, and the mount is refused; fsync_journal,
                                  iJournaling's per-file fsync as ext4 fast commits, needs
                                  an image made with -O fast_commit)
  threads=N                       FUSE worker threads (default 2 per core, at least 4)
  io=buffered|direct|auto         image file through the page cache (default), O_DIRECT,
                                  or O_DIRECT where the file system takes it
  log=PATH                        the log file (default: syslog; without /dev/log,
                                  /var/log/quill/IMAGE.log, printed at mount)
  nosuid, nodev, noexec, noatime, sync, dirsync
                                  generic mount flags
Unmount with `umount MOUNTPOINT` or `fusermount3 -u MOUNTPOINT` (or SIGTERM): the process
exits once the image is clean, and holds an exclusive flock on the image until then.";

#[derive(clap::Args)]
struct MountArgs {
    /// Stay in the foreground (the log goes to stderr).
    #[arg(short = 'f', long)]
    foreground: bool,
    /// Mount options (see below); may be repeated.
    #[arg(short = 'o', value_name = "OPTIONS")]
    options: Vec<String>,
    /// The ext4 image (or block device).
    image: PathBuf,
    /// An existing directory to mount it on.
    mountpoint: PathBuf,
}

#[derive(Subcommand)]
enum JournalCommand {
    /// List the transactions in an image's journal (like debugfs logdump).
    Dump(dump::DumpArgs),
    /// Benchmark the journal engine: threads running handles plus fsync.
    Bench(bench_cmd::BenchArgs),
}

fn main() -> ExitCode {
    keep_freed_memory();
    if mount_helper::called_as_helper() {
        return mount_helper::main();
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Recover(args) => recover::run(args),
        Command::Journal(JournalCommand::Dump(args)) => dump::run(args),
        Command::Journal(JournalCommand::Bench(args)) => bench_cmd::run(args),
        Command::Mkfs(args) => mkfs_cmd::run(args),
        Command::Info(args) => info::run(args),
        Command::Bench(args) => fsbench_cmd::run(args),
        Command::Crashtest(args) => crashtest_cmd::run(args),
        Command::Mount(args) => {
            let request = mount_cmd::MountRequest {
                image: args.image,
                mountpoint: args.mountpoint,
                options: args.options,
                foreground: args.foreground,
                sloppy: false,
                verbose: false,
                fake: false,
            };
            return match mount_cmd::run(request) {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    if !err.is_logged() {
                        eprintln!("quill: {}", err.message());
                    }
                    ExitCode::from(err.exit_code())
                }
            };
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // One line: the error and those of its causes it does not already spell out.
            let mut line = String::new();
            for cause in err.chain().map(|c| c.to_string()) {
                if !line.contains(&cause) {
                    if !line.is_empty() {
                        line.push_str(": ");
                    }
                    line.push_str(&cause);
                }
            }
            eprintln!("quill: {line}");
            if err.downcast_ref::<mkfs_cmd::UsageError>().is_some() {
                return ExitCode::from(2);
            }
            ExitCode::FAILURE
        }
    }
}
