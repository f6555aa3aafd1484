//! The `quill` command.
//!
//! Exit codes: 0 success; 1 the operation failed (the message says why); 2 bad usage (clap, or
//! an option value a subcommand rejects before doing anything).

mod bench_cmd;
mod dump;
mod mkfs_cmd;
mod recover;

use clap::{Parser, Subcommand};
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
}

#[derive(Subcommand)]
enum JournalCommand {
    /// List the transactions in an image's journal (like debugfs logdump).
    Dump(dump::DumpArgs),
    /// Benchmark the journal engine: threads running handles plus fsync.
    Bench(bench_cmd::BenchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Recover(args) => recover::run(args),
        Command::Journal(JournalCommand::Dump(args)) => dump::run(args),
        Command::Journal(JournalCommand::Bench(args)) => bench_cmd::run(args),
        Command::Mkfs(args) => mkfs_cmd::run(args),
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
