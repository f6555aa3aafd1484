//! varmail, as filebench's `varmail.f` (and CJFS's `varmail_<N>.f`) runs it: a mail server's
//! file pattern. Every thread repeats 13 flowops, each counted as one operation (filebench's
//! ops/s):
//!
//! deletefile; createfile, appendfilerand, **fsync**, closefile; openfile, readwholefile,
//! appendfilerand, **fsync**, closefile; openfile, readwholefile, closefile.
//!
//! - Files: gamma-distributed sizes (shape 1.5, mean 16 KiB), 80% of them created before the
//!   run (`prealloc=80`); appends are uniform in 1..=32 KiB (mean 16 KiB); whole-file reads
//!   go 1 MiB at a time (`iosize=1m`).
//! - [`Layout::Shared`] (varmail-shared): 1,000 files in one directory shared by every thread.
//!   [`Layout::PerThread`] (varmail-split, CJFS's `filebench-perthreaddir`): 100 files per
//!   thread in the thread's own directory.
//! - A thread holds a file while it works on it, as filebench marks a file entry busy, so two
//!   threads never delete or append to the same file at once.

use std::io;

use parking_lot::{Mutex, MutexGuard};
use rand::rngs::SmallRng;
use rand::Rng;
use rand_distr::{Distribution, Gamma};

use super::{pattern, run_flowop_threads, take_entry, Counters, Measured, Size, WorkloadParams};
use crate::fsapi::{read_whole, FsApi};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    Shared,
    PerThread,
}

const MEAN_FILE_BYTES: f64 = 16384.0;
const GAMMA_SHAPE: f64 = 1.5;
const APPEND_MAX: usize = 32768;
const READ_CHUNK: usize = 1 << 20;
const PREALLOC_PERCENT: usize = 80;

struct Entry {
    exists: bool,
    size: u64,
}

/// One directory's files.
struct FileSet {
    dir: String,
    entries: Vec<Mutex<Entry>>,
}

impl FileSet {
    fn path(&self, i: usize) -> String {
        format!("{}/f{i}", self.dir)
    }

    /// Takes a file that exists (or does not); see [`take_entry`].
    fn take(&self, rng: &mut SmallRng, exists: bool) -> (usize, MutexGuard<'_, Entry>) {
        take_entry(&self.entries, rng, |e| e.exists == exists)
    }
}

fn file_counts(layout: Layout, size: Size) -> usize {
    match (layout, size) {
        (Layout::Shared, Size::Default) => 1000,
        (Layout::Shared, Size::Smallest) => 40,
        (Layout::PerThread, Size::Default) => 100,
        (Layout::PerThread, Size::Smallest) => 10,
    }
}

/// Creates the directories and the preallocated 80% of the files.
fn prepare(api: &dyn FsApi, params: &WorkloadParams, layout: Layout) -> io::Result<Vec<FileSet>> {
    api.mkdir("varmail")?;
    let dirs: Vec<String> = match layout {
        Layout::Shared => vec!["varmail/shared".into()],
        Layout::PerThread => (0..params.threads).map(|t| format!("varmail/t{t}")).collect(),
    };
    let per_dir = file_counts(layout, params.size);
    let gamma = Gamma::new(GAMMA_SHAPE, MEAN_FILE_BYTES / GAMMA_SHAPE).expect("valid gamma");
    let mut rng = params.rng(usize::MAX);
    let data = pattern(READ_CHUNK, params.seed);
    let mut sets = Vec::new();
    for dir in dirs {
        api.mkdir(&dir)?;
        let mut set = FileSet { dir, entries: Vec::new() };
        for i in 0..per_dir {
            let mut entry = Entry { exists: false, size: 0 };
            if rng.gen_range(0..100) < PREALLOC_PERCENT {
                let size = (gamma.sample(&mut rng) as u64).max(1);
                let mut file = api.create(&set.path(i))?;
                let mut at = 0;
                while at < size {
                    let n = (size - at).min(READ_CHUNK as u64) as usize;
                    file.write_at(at, &data[..n])?;
                    at += n as u64;
                }
                entry = Entry { exists: true, size };
            }
            set.entries.push(Mutex::new(entry));
        }
        sets.push(set);
    }
    api.sync()?;
    Ok(sets)
}

pub fn run(api: &dyn FsApi, params: &WorkloadParams, layout: Layout) -> io::Result<Measured> {
    let sets = prepare(api, params, layout)?;
    let data = pattern(APPEND_MAX, params.seed);
    run_flowop_threads(params, READ_CHUNK, |thread, rng, chunk, c| {
        let set = match layout {
            Layout::Shared => &sets[0],
            Layout::PerThread => &sets[thread],
        };
        iteration(api, set, (rng, &data, chunk), c)
    })
}

/// The 13 flowops.
fn iteration(
    api: &dyn FsApi,
    set: &FileSet,
    (rng, data, chunk): (&mut SmallRng, &[u8], &mut [u8]),
    c: &mut Counters,
) -> io::Result<()> {
    // deletefile
    let (i, mut entry) = set.take(rng, true);
    api.unlink(&set.path(i))?;
    *entry = Entry { exists: false, size: 0 };
    drop(entry);
    c.ops += 1;
    // createfile, appendfilerand, fsync, closefile
    let (i, mut entry) = set.take(rng, false);
    let mut file = api.create(&set.path(i))?;
    *entry = Entry { exists: true, size: 0 };
    c.files_created += 1;
    let n = rng.gen_range(1..=APPEND_MAX);
    c.write(&mut *file, 0, &data[..n])?;
    entry.size = n as u64;
    c.timed_sync(&mut *file, false)?;
    drop(file);
    drop(entry);
    c.ops += 4;
    // openfile, readwholefile, appendfilerand, fsync, closefile
    let (i, mut entry) = set.take(rng, true);
    let mut file = api.open(&set.path(i))?;
    c.bytes_read += read_whole(&mut *file, chunk)?;
    let n = rng.gen_range(1..=APPEND_MAX);
    c.write(&mut *file, entry.size, &data[..n])?;
    entry.size += n as u64;
    c.timed_sync(&mut *file, false)?;
    drop(file);
    drop(entry);
    c.ops += 5;
    // openfile, readwholefile, closefile
    let (i, entry) = set.take(rng, true);
    let mut file = api.open(&set.path(i))?;
    c.bytes_read += read_whole(&mut *file, chunk)?;
    drop(file);
    drop(entry);
    c.ops += 3;
    Ok(())
}
