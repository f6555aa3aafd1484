//! Progress bars: `quill mkfs`, `quill recover` and `quill journal bench` draw one on stderr
//! when stderr is a terminal (a pseudo-terminal made by `script`), and print nothing extra when
//! it is not (what scripts and the other tests see).

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

/// Runs `quill ARGS` with its stdout and stderr on a pseudo-terminal; returns what it printed.
fn on_a_terminal(args: &[&str]) -> String {
    let mut line = shell_quote(Path::new(env!("CARGO_BIN_EXE_quill")).to_str().unwrap());
    for arg in args {
        line.push(' ');
        line.push_str(&shell_quote(arg));
    }
    // -e: script exits with the command's status; -q: no "Script started" lines.
    let o = run(Command::new("script").args(["-qec", &line, "/dev/null"]).env("TERM", "xterm"));
    assert!(o.status.success(), "{line}: {}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

#[test]
fn mkfs_draws_a_bar_on_a_terminal_and_nothing_otherwise() {
    if !have("script", "mkfs_draws_a_bar_on_a_terminal_and_nothing_otherwise") {
        return;
    }
    let scratch = Scratch::new("progress-mkfs");
    let image = scratch.path("fs.img");
    let image = image.to_str().unwrap();
    // A file system smaller than the file: the file is not discarded, so mkfs writes the inode
    // tables and the journal, which is what the bar counts.
    std::fs::File::create(image).unwrap().set_len(1 << 30).unwrap();
    let out = on_a_terminal(&["mkfs", "-F", image, "512M"]);
    assert!(out.contains("Writing metadata ["), "no bar drawn:\n{out}");
    assert!(out.contains("MiB"), "the bar counts bytes:\n{out}");
    assert!(out.contains("Creating filesystem with 131072 4k blocks"), "{out}");

    let out = on_a_terminal(&["mkfs", "-q", "-F", image, "512M"]);
    assert!(!out.contains("Writing metadata"), "-q draws no bar:\n{out}");

    let o = run(quill().args(["mkfs", "-F", image, "512M"]));
    assert!(o.status.success(), "{}", text(&o));
    assert!(o.stderr.is_empty(), "stderr is not a terminal: nothing drawn: {}", text(&o));
}

#[test]
fn recover_draws_a_bar_on_a_terminal_and_nothing_otherwise() {
    if !have("script", "recover_draws_a_bar_on_a_terminal_and_nothing_otherwise") {
        return;
    }
    let scratch = Scratch::new("progress-recover");
    let image = scratch.path("crashed.img");
    crashed_image(&image);
    let copy = scratch.path("copy.img");
    std::fs::copy(&image, &copy).unwrap();

    let out = on_a_terminal(&["recover", image.to_str().unwrap()]);
    assert!(out.contains("Replaying the journal ["), "no bar drawn:\n{out}");
    assert!(out.contains("replayed 3 transactions"), "{out}");

    let o = run(quill().arg("recover").arg(&copy));
    assert!(o.status.success(), "{}", text(&o));
    assert!(o.stderr.is_empty(), "stderr is not a terminal: nothing drawn: {}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("replayed 3 transactions"), "{}", text(&o));
    // The bar changes nothing about the replay.
    assert_eq!(std::fs::read(&image).unwrap(), std::fs::read(&copy).unwrap());
}

#[test]
fn journal_bench_ticks_once_per_run_on_a_terminal_and_keeps_its_lines_otherwise() {
    let test = "journal_bench_ticks_once_per_run_on_a_terminal_and_keeps_its_lines_otherwise";
    if !have("script", test) {
        return;
    }
    let args = ["journal", "bench", "--devices", "memory", "--threads", "1,2", "--seconds", "0.5"];
    let out = on_a_terminal(&args);
    assert!(out.contains("Benchmark runs ["), "no bar drawn:\n{out}");
    // Two runs: the bar counts them (the last tick is cleared with the bar before a redraw).
    assert!(out.contains("] 0/2") && out.contains("] 1/2"), "one tick per run:\n{out}");
    assert!(out.contains("run 1/1: memory classic 2 threads"), "{out}");

    let o = run(quill().args(args));
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        "run 1/1: memory classic 1 threads\nrun 1/1: memory classic 2 threads\n",
        "stderr is not a terminal: the run lines only"
    );
}
