//! seq-write and seq-read: buffered streaming of large files, the FUSE comparison's
//! throughput bar (fuse-iomap reports 0.8–1.1× the kernel for buffered streaming).
//!
//! - **seq-write**: each thread writes its own new file front to back in 1 MiB writes, then
//!   fsyncs it once; the run ends when every file is whole (1 GiB in all by default, split
//!   between the threads). One operation is one MiB written; the headline is MB/s, the fsync
//!   included.
//! - **seq-read**: the same files are written and fsynced before the run, the kernel's caches
//!   are dropped (`/proc/sys/vm/drop_caches`: the page cache of a kernel or FUSE mount, and the
//!   host's copy of an image file; quill's own cache is not the kernel's to drop, and holds far
//!   less than a GiB), and each thread reads its file front to back in 1 MiB reads. One
//!   operation is one MiB read.
//!
//! Both stop at the run's duration if it comes first; MB/s is over the bytes moved by then.

use std::io;

use parking_lot::Mutex;

use super::{pattern, run_threads, Measured, Size, Step, WorkloadParams};
use crate::fsapi::{FsApi, OpenFile};

/// One write or read.
const CHUNK: usize = 1 << 20;

/// The bytes all threads move together.
fn total_bytes(size: Size) -> u64 {
    match size {
        Size::Default => 1 << 30,
        Size::Smallest => 8 << 20,
    }
}

/// Each thread's file length: its share of the total, whole chunks, at least one.
fn file_bytes(params: &WorkloadParams) -> u64 {
    let chunks = total_bytes(params.size) / CHUNK as u64 / params.threads as u64;
    chunks.max(1) * CHUNK as u64
}

/// One thread's file and how far it has got.
struct Stream {
    file: Box<dyn OpenFile>,
    at: u64,
}

fn path(thread: usize) -> String {
    format!("seq/file{thread}")
}

pub fn write(api: &dyn FsApi, params: &WorkloadParams) -> io::Result<Measured> {
    api.mkdir("seq")?;
    let streams = (0..params.threads)
        .map(|t| Ok(Mutex::new(Stream { file: api.create(&path(t))?, at: 0 })))
        .collect::<io::Result<Vec<_>>>()?;
    let len = file_bytes(params);
    let data = pattern(CHUNK, params.seed);
    run_threads(params, params.threads, |thread, _, c| {
        let stream = &mut *streams[thread].lock();
        c.write(&mut *stream.file, stream.at, &data)?;
        stream.at += CHUNK as u64;
        c.ops += 1;
        if stream.at < len {
            return Ok(Step::More);
        }
        c.timed_sync(&mut *stream.file, false)?;
        Ok(Step::Done)
    })
}

pub fn read(api: &dyn FsApi, params: &WorkloadParams) -> io::Result<Measured> {
    api.mkdir("seq")?;
    let len = file_bytes(params);
    let data = pattern(CHUNK, params.seed);
    for t in 0..params.threads {
        let mut file = api.create(&path(t))?;
        for at in (0..len).step_by(CHUNK) {
            file.write_at(at, &data)?;
        }
        file.fsync()?;
    }
    api.sync()?;
    // Without root the caches stay: the figures then measure a warm read.
    let _ = crate::recovery::drop_caches();
    let streams = (0..params.threads)
        .map(|t| Ok(Mutex::new(Stream { file: api.open(&path(t))?, at: 0 })))
        .collect::<io::Result<Vec<_>>>()?;
    let buffers: Vec<Mutex<Vec<u8>>> =
        (0..params.threads).map(|_| Mutex::new(vec![0u8; CHUNK])).collect();
    run_threads(params, params.threads, |thread, _, c| {
        let stream = &mut *streams[thread].lock();
        let buf = &mut *buffers[thread].lock();
        let mut got = 0;
        while got < CHUNK {
            match stream.file.read_at(stream.at + got as u64, &mut buf[got..])? {
                0 => break,
                n => got += n,
            }
        }
        if got < CHUNK || buf[..got] != data[..got] {
            return Err(io::Error::other(format!(
                "{}: {got} bytes at {} do not read back as written",
                path(thread),
                stream.at
            )));
        }
        stream.at += CHUNK as u64;
        c.bytes_read += got as u64;
        c.ops += 1;
        Ok(if stream.at < len { Step::More } else { Step::Done })
    })
}
