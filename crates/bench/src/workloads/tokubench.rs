//! tokubench (BetrFS's `benchmark-fs-threaded`): threads create many small files — open with
//! O_CREAT, one 200-byte pwrite, close, **no fsync** — spread over a balanced directory tree of
//! fan-out 128 whose leaf directories are shuffled. It measures create throughput: how well
//! the journal batches metadata and how little the namespace serializes. files/s.
//!
//! The tree is sized for the file count (100,000 files by default, as a 2-core scale-down of
//! BetrFS's 1–3 million) and built before the run; file `n` goes to leaf `n mod leaves` of
//! the shuffled order, so concurrent creates land in different directories, and is named
//! `benchfile.<random64>` as the original does.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use rand::seq::SliceRandom;
use rand::Rng;

use super::{pattern, run_threads, Measured, Size, Step, WorkloadParams};
use crate::fsapi::FsApi;

const FANOUT: usize = 128;
const FILE_BYTES: usize = 200;

fn file_count(size: Size) -> u64 {
    match size {
        Size::Default => 100_000,
        Size::Smallest => 300,
    }
}

/// Leaf directory paths of a balanced tree of fan-out [`FANOUT`] with `leaves` leaves,
/// creating every directory on the way.
fn build_tree(api: &dyn FsApi, leaves: usize) -> io::Result<Vec<String>> {
    let mut depth = 1;
    while FANOUT.pow(depth) < leaves {
        depth += 1;
    }
    api.mkdir("toku")?;
    let mut paths = Vec::with_capacity(leaves);
    for leaf in 0..leaves {
        let mut path = String::from("toku");
        let mut digits: Vec<usize> = Vec::new();
        let mut n = leaf;
        for _ in 0..depth {
            digits.push(n % FANOUT);
            n /= FANOUT;
        }
        for (level, digit) in digits.iter().rev().enumerate() {
            path.push_str(&format!("/d{digit}"));
            // A directory is new when every lower digit of this leaf is zero.
            if digits[..digits.len() - 1 - level].iter().all(|&d| d == 0) {
                api.mkdir(&path)?;
            }
        }
        paths.push(path);
    }
    Ok(paths)
}

pub fn run(api: &dyn FsApi, params: &WorkloadParams) -> io::Result<Measured> {
    let files = file_count(params.size);
    let leaves = (files as usize).div_ceil(FANOUT);
    let mut dirs = build_tree(api, leaves)?;
    dirs.shuffle(&mut params.rng(usize::MAX));
    api.sync()?;
    let next = AtomicU64::new(0);
    let data = pattern(FILE_BYTES, params.seed);
    let rngs: Vec<Mutex<_>> = (0..params.threads).map(|t| Mutex::new(params.rng(t))).collect();
    run_threads(params, params.threads, |thread, _, c| {
        let n = next.fetch_add(1, Ordering::Relaxed);
        if n >= files {
            return Ok(Step::Done);
        }
        let name: u64 = rngs[thread].lock().gen();
        let dir = &dirs[n as usize % dirs.len()];
        let mut file = api.create(&format!("{dir}/benchfile.{name:016x}"))?;
        c.write(&mut *file, 0, &data)?;
        drop(file);
        c.files_created += 1;
        c.ops += 1;
        Ok(Step::More)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fsapi::PosixApi;

    #[test]
    fn tree_has_fanout_128_and_every_leaf_exists() {
        let dir = std::env::temp_dir().join(format!("quill-toku-tree-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let api = PosixApi::new(&dir);
        let leaves = build_tree(&api, 130).unwrap();
        assert_eq!(leaves.len(), 130);
        assert_eq!(leaves[0], "toku/d0/d0");
        assert_eq!(leaves[129], "toku/d1/d1");
        for leaf in &leaves {
            assert!(dir.join(leaf).is_dir(), "{leaf}");
        }
        assert_eq!(std::fs::read_dir(dir.join("toku")).unwrap().count(), 2);
        assert_eq!(std::fs::read_dir(dir.join("toku/d0")).unwrap().count(), 128);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
