//! randwrite-fsync: sysbench fileio `rndwr` with `--file-fsync-all=on` (one fsync per write,
//! the form the reference notes verified 1:1): each thread overwrites 4 KiB blocks at random
//! aligned offsets of its own preallocated file and fsyncs after every write. No allocation,
//! no size change: under data=ordered the journal carries only timestamps, under data=journal
//! every write goes through the log — run the target both ways (`data=journal`).
//!
//! One operation is one write + fsync.

use std::io;

use parking_lot::Mutex;
use rand::Rng;

use super::{pattern, run_threads, Measured, Size, Step, WorkloadParams};
use crate::fsapi::FsApi;

const BLOCK: usize = 4096;

fn file_bytes(size: Size) -> u64 {
    match size {
        Size::Default => 16 << 20,
        Size::Smallest => 256 << 10,
    }
}

pub fn run(api: &dyn FsApi, params: &WorkloadParams) -> io::Result<Measured> {
    api.mkdir("randwrite")?;
    let bytes = file_bytes(params.size);
    let fill = pattern(1 << 20, params.seed);
    let mut files = Vec::new();
    for t in 0..params.threads {
        let mut file = api.create(&format!("randwrite/file{t}"))?;
        let mut at = 0;
        while at < bytes {
            let n = (bytes - at).min(fill.len() as u64) as usize;
            file.write_at(at, &fill[..n])?;
            at += n as u64;
        }
        files.push(Mutex::new((file, params.rng(t))));
    }
    api.sync()?;
    let block = pattern(BLOCK, params.seed + 7);
    let blocks = bytes / BLOCK as u64;
    run_threads(params, params.threads, |thread, _, c| {
        let (file, rng) = &mut *files[thread].lock();
        let at = rng.gen_range(0..blocks) * BLOCK as u64;
        c.write(&mut **file, at, &block)?;
        c.timed_sync(&mut **file, false)?;
        c.ops += 1;
        Ok(Step::More)
    })
}
