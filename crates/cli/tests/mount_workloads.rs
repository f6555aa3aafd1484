//! Real programs and many threads through a quill FUSE mount, then the image checked by
//! e2fsck and read back by the kernel. Each test needs root, /dev/fuse, fusermount3 and its
//! tools, and prints SKIP otherwise.

mod mount_support;

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use mount_support::*;

/// dbench, fio with fsync and verification, a tar extract of this repository's sources with
/// `diff -r`, `cp -a`, `find` and `rm -rf`; then a clean image that the kernel reads the same.
#[test]
fn real_programs_through_the_mount() {
    let tools = ["dbench", "fio", "tar", "diff", "cp", "find", "dumpe2fs", "mount"];
    if !ready("real_programs_through_the_mount", &tools) {
        return;
    }
    let loadfile = Path::new("/usr/share/dbench/client.txt");
    if !loadfile.exists() {
        println!(
            "SKIP real_programs_through_the_mount: no dbench loadfile at {}",
            loadfile.display()
        );
        return;
    }
    let s = Scratch::new("programs");
    let image = s.path("img");
    mkfs_ext4(&image, "512M", &[]);
    let mnt = s.dir("mnt");
    let m = QuillMount::foreground(&image, &mnt, "threads=8");
    let started = Instant::now();

    // dbench: 4 clients for 6 seconds, directory operations synced, xattrs on.
    let dir = mnt.join("dbench");
    fs::create_dir(&dir).unwrap();
    let o = ok(Command::new("dbench")
        .args(["-t", "6", "-S", "-x", "-c"])
        .arg(loadfile)
        .arg("-D")
        .arg(&dir)
        .arg("4"));
    // dbench is judged by its exit status (ok() above: an operation that fails or returns
    // what the loadfile does not expect makes it exit 1) and by its operation table, not by
    // its chatter: it prints warnings of its own such as "failed to create barrier semaphore".
    let out = String::from_utf8_lossy(&o.stdout);
    let table = bench::workloads::dbench::parse_output(&out)
        .unwrap_or_else(|| panic!("dbench printed no operation table:\n{}", text(&o)));
    assert!(table.ops > 0 && table.mb_per_sec > 0.0, "dbench did no work:\n{out}");
    println!("dbench done after {:?}", started.elapsed());

    // fio: random 4 KiB writes with an fsync after each, two jobs, then every block verified.
    let dir = mnt.join("fio");
    fs::create_dir(&dir).unwrap();
    let o = ok(Command::new("fio")
        .args([
            "--name=fsync",
            "--rw=randwrite",
            "--bs=4k",
            "--size=4M",
            "--numjobs=2",
            "--fsync=1",
            "--ioengine=psync",
            "--verify=crc32c",
            "--do_verify=1",
            "--group_reporting",
            // Otherwise fio leaves *-verify.state files in the working directory.
            "--verify_state_save=0",
        ])
        .arg(format!("--directory={}", dir.display())));
    let out = text(&o);
    assert!(out.contains("err= 0"), "fio reported errors:\n{out}");
    assert!(!out.contains("verify:"), "fio verification failed:\n{out}");
    println!("fio done after {:?}", started.elapsed());

    // tar: this repository's crates/ (sources only), extracted through the mount and on
    // local disk from the same archive, then compared.
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let tarball = s.path("src.tar");
    ok(Command::new("tar")
        .arg("-cf")
        .arg(&tarball)
        .arg("--exclude=target")
        .arg("-C")
        .arg(crates.parent().unwrap())
        .arg("crates"));
    let reference = s.dir("reference");
    ok(Command::new("tar").arg("-xpf").arg(&tarball).arg("-C").arg(&reference));
    let src = mnt.join("src");
    fs::create_dir(&src).unwrap();
    ok(Command::new("tar").arg("-xpf").arg(&tarball).arg("-C").arg(&src));
    assert_diff_clean(&reference.join("crates"), &src.join("crates"));
    // Some symlinks and hard links in the tree, which crates/ does not have.
    std::os::unix::fs::symlink("../Cargo.toml", src.join("crates/fs/link-up")).unwrap();
    std::os::unix::fs::symlink("/nonexistent/target", src.join("crates/dangling")).unwrap();
    fs::hard_link(src.join("crates/fs/Cargo.toml"), src.join("crates/fs/Cargo.hard")).unwrap();

    // cp -a keeps modes, times, links and xattrs; find sees everything; rm -rf removes it all.
    ok(Command::new("cp").arg("-a").arg(&src).arg(mnt.join("copy")));
    assert_diff_clean(&src, &mnt.join("copy"));
    assert_same_tree("cp -a copy", &manifest_no_times(&src), &manifest_no_times(&mnt.join("copy")));
    let count = |dir: &Path| -> usize {
        let o = ok(Command::new("find").arg(dir));
        String::from_utf8_lossy(&o.stdout).lines().count()
    };
    assert_eq!(count(&src), count(&mnt.join("copy")));
    assert_eq!(count(&src), count(&reference) + 3);
    ok(Command::new("rm").arg("-rf").arg(mnt.join("copy")));
    assert!(!mnt.join("copy").exists());
    ok(Command::new("rm").arg("-rf").arg(mnt.join("dbench")));
    println!("tar/cp/find/rm done after {:?}", started.elapsed());

    let through_fuse = manifest(&mnt);
    m.unmount();
    assert_clean(&image);
    let kmnt = s.dir("kernel");
    let kernel = LoopMount::new(&image, &kmnt);
    assert_same_tree("FUSE view vs kernel loop mount", &through_fuse, &manifest(&kernel.dir));
    let o = run(Command::new("diff")
        .args(["-r", "-x", "link-up", "-x", "dangling", "-x", "Cargo.hard"])
        .arg(reference.join("crates"))
        .arg(kernel.dir.join("src/crates")));
    assert!(o.status.success(), "the kernel sees a different tree:\n{}", text(&o));
}

/// A manifest without times (cp -a keeps mtime but a directory's changes as entries are
/// added after the copy).
fn manifest_no_times(root: &Path) -> std::collections::BTreeMap<String, String> {
    manifest(root)
        .into_iter()
        .map(|(k, v)| {
            let cleaned: Vec<&str> = v.split(' ').collect();
            let mut out = Vec::new();
            let mut skip = false;
            for word in cleaned {
                if skip {
                    skip = false;
                    continue;
                }
                if word == "mtime" || word == "nlink" {
                    skip = true;
                    continue;
                }
                out.push(word);
            }
            (k, out.join(" "))
        })
        .collect()
}

/// A payload that depends on who wrote it, so a misplaced block shows.
fn payload(thread: usize, round: usize) -> Vec<u8> {
    let len = 1 + (thread * 7919 + round * 104_729) % 70_000;
    (0..len)
        .map(|i| (i as u32).wrapping_mul(31).wrapping_add((thread * 131 + round) as u32) as u8)
        .collect()
}

/// What one thread does `rounds` times in `dir`: create and write a file, read it back, rename
/// it, and unlink every third one. Returns the names it expects to remain.
fn churn(dir: &Path, thread: usize, rounds: usize) -> Vec<String> {
    let mut kept = Vec::new();
    for round in 0..rounds {
        let data = payload(thread, round);
        let name = dir.join(format!("t{thread:02}-{round:04}.tmp"));
        let mut f =
            File::create(&name).unwrap_or_else(|e| panic!("create {}: {e}", name.display()));
        f.write_all(&data).unwrap();
        if round % 10 == 0 {
            f.sync_all().unwrap();
        }
        drop(f);
        let mut back = Vec::new();
        File::open(&name).unwrap().read_to_end(&mut back).unwrap();
        assert!(back == data, "thread {thread} round {round}: read back differs");
        let final_name = format!("t{thread:02}-{round:04}");
        fs::rename(&name, dir.join(&final_name)).unwrap();
        if round % 3 == 0 {
            fs::remove_file(dir.join(&final_name)).unwrap();
        } else {
            kept.push(final_name);
        }
        if round % 16 == 5 {
            // Overwrite in place, through a second open of an existing file.
            let victim = dir.join(kept.last().unwrap());
            let mut f = OpenOptions::new().write(true).open(&victim).unwrap();
            f.write_all(&payload(thread, round)[..1]).unwrap();
        }
    }
    kept
}

/// 16 threads in one directory and 16 in directories of their own, through FUSE: no errors,
/// every surviving file as its thread left it, a clean image the kernel reads the same.
#[test]
fn sixteen_threads_in_one_directory_and_in_separate_ones() {
    if !ready("sixteen_threads_in_one_directory_and_in_separate_ones", &["dumpe2fs", "mount"]) {
        return;
    }
    const THREADS: usize = 16;
    const ROUNDS: usize = 60;
    let s = Scratch::new("threads");
    let image = s.path("img");
    quill_mkfs(&image, "256M");
    let mnt = s.dir("mnt");
    let m = QuillMount::foreground(&image, &mnt, "threads=16");
    let started = Instant::now();
    for shared in [true, false] {
        let base = mnt.join(if shared { "shared" } else { "private" });
        fs::create_dir(&base).unwrap();
        let dirs: Vec<PathBuf> = (0..THREADS)
            .map(|t| {
                if shared {
                    base.clone()
                } else {
                    let d = base.join(format!("d{t:02}"));
                    fs::create_dir(&d).unwrap();
                    d
                }
            })
            .collect();
        let dirs = Arc::new(dirs);
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let dirs = dirs.clone();
                std::thread::spawn(move || churn(&dirs[t], t, ROUNDS))
            })
            .collect();
        let mut expected: Vec<(PathBuf, String, usize, usize)> = Vec::new();
        for (t, w) in workers.into_iter().enumerate() {
            let kept = w.join().unwrap_or_else(|_| panic!("thread {t} failed (shared: {shared})"));
            for name in kept {
                let round: usize = name[4..].parse().unwrap();
                expected.push((dirs[t].clone(), name, t, round));
            }
        }
        // Exactly the expected names, with the expected contents.
        let mut listed: Vec<String> = Vec::new();
        for d in dirs.iter().collect::<std::collections::BTreeSet<_>>() {
            for e in fs::read_dir(d).unwrap() {
                listed.push(format!(
                    "{}/{}",
                    d.display(),
                    e.unwrap().file_name().to_string_lossy()
                ));
            }
        }
        listed.sort();
        let mut want: Vec<String> =
            expected.iter().map(|(d, n, _, _)| format!("{}/{n}", d.display())).collect();
        want.sort();
        assert_eq!(listed, want, "directory contents after the threads (shared: {shared})");
        for (d, name, t, round) in &expected {
            let got = fs::read(d.join(name)).unwrap();
            let mut data = payload(*t, *round);
            // Rounds that overwrote the first byte of the newest kept file.
            for later in *round + 1..ROUNDS {
                if later % 16 == 5 && last_kept_before(later) == *round {
                    data[0] = payload(*t, later)[0];
                }
            }
            assert!(got == data, "{}/{name}: contents differ", d.display());
        }
        println!("shared={shared}: {} files checked after {:?}", expected.len(), started.elapsed());
    }
    // Speed is measured by `quill bench`, not judged here: a busy CI machine must not fail it.
    println!("threads done after {:?}", started.elapsed());
    let through_fuse = manifest(&mnt);
    m.unmount();
    assert_clean(&image);
    let kmnt = s.dir("kernel");
    let kernel = LoopMount::new(&image, &kmnt);
    assert_same_tree("FUSE view vs kernel loop mount", &through_fuse, &manifest(&kernel.dir));
}

/// The newest round before `round` whose file `churn` kept (not a multiple of 3).
fn last_kept_before(round: usize) -> usize {
    (0..=round).rev().find(|r| r % 3 != 0).unwrap()
}
