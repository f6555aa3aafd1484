//! The dentry cache (`dcache.rs`) answers lookups without the directory's lock; these tests
//! check that its answers are always what the directory says.
//!
//! - Many threads share one directory, each changing only names of its own (create, unlink,
//!   rename, rename over, link), so each thread knows exactly what its names must resolve to
//!   while every other thread's changes split and rewrite the same directory blocks under it.
//!   After every change the thread looks its names up (through the cache) and compares. At the
//!   end the listing (read from the blocks, not the cache) must be the union of the models,
//!   the cache must have answered most lookups, and `e2fsck -fn` must find the image clean.
//! - A create refused for want of space, after a lookup cached "no such name", leaves that
//!   answer standing, and the names created before it resolve.
//!
//! `QUILL_SEED` replays the random choices (thread timing still varies); the seed is printed.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use blockdev::memory::MemDevice;
use common::{assert_fsck_clean, have, list_dir, mkfs, run_watched, seed, Rng, Scratch};
use fs::{Filesystem, FsError, MountOptions, RenameFlags, SetMode, ROOT_INO};

const THREADS: usize = 16;
const OPS_PER_THREAD: usize = 400;
/// Names each thread plays with (`t<T>-n<I>`), so renames over existing names happen often.
const NAMES_PER_THREAD: u64 = 24;

fn name(thread: usize, i: u64) -> String {
    format!("t{thread}-n{i}")
}

/// Checks that every one of `thread`'s names resolves as `model` says (name → inode).
fn check_names(
    fs: &Filesystem,
    dir: u32,
    thread: usize,
    model: &BTreeMap<String, u32>,
    after: &str,
) -> Result<(), String> {
    for i in 0..NAMES_PER_THREAD {
        let n = name(thread, i);
        let got = match fs.lookup(dir, n.as_bytes()) {
            Ok(attr) => Some(attr.ino),
            Err(FsError::NotFound) => None,
            Err(e) => return Err(format!("lookup {n} after {after}: {e}")),
        };
        let path = fs.resolve(&format!("/shared/{n}")).ok();
        let want = model.get(&n).copied();
        if got != want || path != want {
            return Err(format!(
                "after {after}: {n} resolves to {got:?} (by path {path:?}), the thread's \
                 model says {want:?}"
            ));
        }
    }
    Ok(())
}

fn thread_work(
    fs: &Filesystem,
    dir: u32,
    thread: usize,
    seed: u64,
) -> Result<BTreeMap<String, u32>, String> {
    let mut rng = Rng::for_thread(seed, thread);
    let mut model: BTreeMap<String, u32> = BTreeMap::new();
    for op in 0..OPS_PER_THREAD {
        let a = name(thread, rng.below(NAMES_PER_THREAD));
        let b = name(thread, rng.below(NAMES_PER_THREAD));
        let what = match rng.below(5) {
            0 | 1 => {
                let result = fs.create(dir, a.as_bytes(), 0o644, 0, 0);
                match (result, model.contains_key(&a)) {
                    (Ok(attr), false) => {
                        model.insert(a.clone(), attr.ino);
                    }
                    (Err(FsError::Exists), true) => {}
                    (other, exists) => {
                        return Err(format!("create {a} (exists: {exists}): {other:?}"));
                    }
                }
                format!("op {op}: create {a}")
            }
            2 => {
                let result = fs.unlink(dir, a.as_bytes());
                match (result, model.remove(&a)) {
                    (Ok(()), Some(_)) | (Err(FsError::NotFound), None) => {}
                    (other, had) => return Err(format!("unlink {a} (had {had:?}): {other:?}")),
                }
                format!("op {op}: unlink {a}")
            }
            3 => {
                let result =
                    fs.rename(dir, a.as_bytes(), dir, b.as_bytes(), RenameFlags::default());
                match (result, model.get(&a).copied()) {
                    // Two links to one inode: rename does nothing (POSIX).
                    (Ok(()), Some(ino)) if model.get(&b) == Some(&ino) => {}
                    (Ok(()), Some(ino)) => {
                        model.remove(&a);
                        model.insert(b.clone(), ino);
                    }
                    (Err(FsError::NotFound), None) => {}
                    (other, had) => {
                        return Err(format!("rename {a} to {b} (had {had:?}): {other:?}"));
                    }
                }
                format!("op {op}: rename {a} to {b}")
            }
            _ => {
                let Some(&ino) = model.get(&a) else { continue };
                let result = fs.link(ino, dir, b.as_bytes());
                match (result, model.contains_key(&b)) {
                    (Ok(_), false) => {
                        model.insert(b.clone(), ino);
                    }
                    (Err(FsError::Exists), true) => {}
                    (other, exists) => {
                        return Err(format!("link {a} as {b} (exists: {exists}): {other:?}"));
                    }
                }
                format!("op {op}: link {a} as {b}")
            }
        };
        check_names(fs, dir, thread, &model, &what)?;
    }
    Ok(model)
}

#[test]
fn lookups_through_the_dentry_cache_match_each_threads_model_in_a_shared_directory() {
    if !have("mkfs.ext4", "dentry cache test") || !have("e2fsck", "dentry cache test") {
        return;
    }
    let seed = seed("dentry_cache");
    let scratch = Scratch::new("dentry-cache");
    let path = scratch.path("fs.img");
    // 1 KiB blocks: the shared directory grows an htree and splits blocks while threads work.
    mkfs(&path, "32M", &["-b", "1024", "-N", "8192"]);
    let dev = Arc::new(MemDevice::from_bytes(std::fs::read(&path).unwrap()));
    let fs = Arc::new(Filesystem::open(dev.clone(), MountOptions::default()).unwrap());
    let dir = fs.mkdir(ROOT_INO, b"shared", 0o755, 0, 0).unwrap().ino;
    let shared = fs.clone();
    let results =
        run_watched(THREADS, Duration::from_secs(300), move |t| thread_work(&shared, dir, t, seed));
    let mut want: BTreeMap<String, u32> = BTreeMap::new();
    for (t, result) in results.into_iter().enumerate() {
        match result {
            Ok(model) => want.extend(model),
            Err(e) => panic!("seed {seed}, thread {t}: {e}"),
        }
    }
    let listed: BTreeMap<String, u32> = list_dir(&fs, dir, 100)
        .into_iter()
        .filter(|e| e.name != b"." && e.name != b"..")
        .map(|e| (String::from_utf8(e.name).unwrap(), e.ino))
        .collect();
    assert_eq!(listed, want, "seed {seed}: the directory's blocks and the threads' models differ");
    let (hits, misses) = fs.dentry_cache_hits_and_misses();
    println!(
        "seed {seed}: {} names left, {hits} lookups from the cache, {misses} searched",
        want.len()
    );
    assert!(hits > misses, "seed {seed}: the cache answered {hits} lookups of {}", hits + misses);
    let fs = Arc::try_unwrap(fs).unwrap_or_else(|_| panic!("the workers are done"));
    fs.unmount().unwrap();
    std::fs::write(&path, dev.snapshot()).unwrap();
    assert_fsck_clean(&path);
}

#[test]
fn a_create_the_directory_cannot_hold_leaves_no_cached_name() {
    if !have("mkfs.ext4", "dentry cache test") || !have("e2fsck", "dentry cache test") {
        return;
    }
    let scratch = Scratch::new("dentry-cache-full");
    let path = scratch.path("fs.img");
    mkfs(&path, "4M", &["-b", "1024", "-N", "2048", "-m", "0"]);
    let dev = Arc::new(MemDevice::from_bytes(std::fs::read(&path).unwrap()));
    let fs = Filesystem::open(dev.clone(), MountOptions::default()).unwrap();
    let dir = fs.mkdir(ROOT_INO, b"d", 0o755, 0, 0).unwrap().ino;
    // Fill the data blocks, then create names with long names until the directory needs a
    // block it cannot get.
    let filler = fs.create(ROOT_INO, b"filler", 0o644, 0, 0).unwrap().ino;
    let chunk = vec![7u8; 64 << 10];
    let mut offset = 0u64;
    while fs.write(filler, offset, &chunk).is_ok_and(|n| n > 0) {
        offset += chunk.len() as u64;
        if fs.fsync(filler, false).is_err() {
            break;
        }
    }
    let _ = fs.fsync(filler, false);
    let mut failed = None;
    for i in 0..2000 {
        let n = format!("{i:0>200}");
        // Looked up first, so a "no entry" answer is cached before the create.
        assert!(matches!(fs.lookup(dir, n.as_bytes()), Err(FsError::NotFound)));
        match fs.create(dir, n.as_bytes(), 0o644, 0, 0) {
            Ok(_) => assert!(fs.lookup(dir, n.as_bytes()).is_ok(), "{n} created, not found"),
            Err(FsError::NoSpace) => {
                failed = Some(n);
                break;
            }
            Err(e) => panic!("create {n}: {e}"),
        }
    }
    let failed = failed.expect("the directory never filled the file system");
    assert!(
        matches!(fs.lookup(dir, failed.as_bytes()), Err(FsError::NotFound)),
        "a create that failed with ENOSPC left its name visible"
    );
    assert!(fs.resolve(&format!("/d/{failed}")).is_err());
    fs.unlink(ROOT_INO, b"filler").unwrap();
    fs.unmount().unwrap();
    std::fs::write(&path, dev.snapshot()).unwrap();
    assert_fsck_clean(&path);
}

/// Files each creator makes in the race test below.
const RACE_FILES: usize = 2000;
/// Creator threads in the race test; each has a chaser.
const RACE_PAIRS: usize = 4;

/// A creator thread makes files `c<T>-<I>` and sets `user.creator` on each right after; its
/// chaser looks each name up (through the dentry cache, which knows it as soon as the entry is
/// added, before the create returns) and sets `user.chaser` the moment it resolves. Both
/// changes must survive: a create that filled the new inode's slot after the chaser could
/// reach it overwrote the chaser's change, and its xattr block leaked (e2fsck: "block bitmap
/// differences").
#[test]
fn a_change_made_through_a_new_name_before_its_create_returns_is_kept() {
    if !have("mkfs.ext4", "new-name race test") || !have("e2fsck", "new-name race test") {
        return;
    }
    let scratch = Scratch::new("dentry-cache-race");
    let path = scratch.path("fs.img");
    mkfs(&path, "32M", &["-b", "1024", "-N", "16384"]);
    let dev = Arc::new(MemDevice::from_bytes(std::fs::read(&path).unwrap()));
    let fs = Arc::new(Filesystem::open(dev.clone(), MountOptions::default()).unwrap());
    let dir = fs.mkdir(ROOT_INO, b"race", 0o755, 0, 0).unwrap().ino;
    // Values too big for the inode's xattr space, so each lives in the xattr block.
    let value = |who: &str, name: &str| format!("{who}:{name}:{}", "v".repeat(300)).into_bytes();
    let shared = fs.clone();
    let results = run_watched(2 * RACE_PAIRS, Duration::from_secs(300), move |t| {
        let (pair, chaser) = (t / 2, t % 2 == 1);
        let mut chased = 0;
        for i in 0..RACE_FILES {
            let name = format!("c{pair}-{i}");
            if chaser {
                let ino = loop {
                    match shared.lookup(dir, name.as_bytes()) {
                        Ok(attr) => break attr.ino,
                        Err(FsError::NotFound) => std::thread::yield_now(),
                        Err(e) => return Err(format!("lookup {name}: {e}")),
                    }
                };
                shared
                    .setxattr(ino, b"user.chaser", &value("chaser", &name), SetMode::Any)
                    .map_err(|e| format!("chaser's setxattr on {name}: {e}"))?;
                chased += 1;
            } else {
                let ino = shared
                    .create(dir, name.as_bytes(), 0o644, 0, 0)
                    .map_err(|e| format!("create {name}: {e}"))?
                    .ino;
                shared
                    .setxattr(ino, b"user.creator", &value("creator", &name), SetMode::Any)
                    .map_err(|e| format!("creator's setxattr on {name}: {e}"))?;
            }
        }
        Ok(chased)
    });
    for (t, result) in results.into_iter().enumerate() {
        if let Err(e) = result {
            panic!("thread {t}: {e}");
        }
    }
    let mut lost = Vec::new();
    for pair in 0..RACE_PAIRS {
        for i in 0..RACE_FILES {
            let name = format!("c{pair}-{i}");
            let ino = fs.lookup(dir, name.as_bytes()).unwrap().ino;
            for who in ["creator", "chaser"] {
                let key = format!("user.{who}");
                match fs.getxattr(ino, key.as_bytes()) {
                    Ok(got) if got == value(who, &name) => {}
                    other => lost.push(format!("{name} {key}: {other:?}")),
                }
            }
        }
    }
    assert!(lost.is_empty(), "{} acknowledged setxattrs lost, first: {:?}", lost.len(), &lost[..1]);
    let fs = Arc::try_unwrap(fs).unwrap_or_else(|_| panic!("the workers are done"));
    fs.unmount().unwrap();
    std::fs::write(&path, dev.snapshot()).unwrap();
    assert_fsck_clean(&path);
}
