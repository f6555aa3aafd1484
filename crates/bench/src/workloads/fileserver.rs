//! fileserver, as filebench's `fileserver.f` runs it and FAST'18 (Son et al., Table 1) uses it
//! as its data-intensive workload: a file server's whole-file traffic, **no fsync**. Every
//! thread repeats 11 flowops, each counted as one operation (filebench's ops/s):
//!
//! createfile, writewholefile, closefile; openfile, appendfilerand, closefile; openfile,
//! readwholefile, closefile; deletefile; statfile.
//!
//! - Read:write is 1:2 as filebench and FAST'18 state it, by flowops: one whole-file read
//!   against two writes (the new file written whole, and an append) per loop, as varmail's
//!   "1:1" is its two reads against two appends. By bytes it is near 1:1 and cannot be 1:2
//!   with whole-file reads: over a long run what is written (creates and appends) is what
//!   deletes remove, and a read takes a whole file of the same mean size. A run from the
//!   preallocated set writes about `mean + 8 KiB` per loop and reads about `mean` (measured:
//!   1:1.0 to 1:1.08 at 1 and 4 threads). The table's MB/s counts both.
//! - Files: gamma-distributed sizes (shape 1.5, as filebench's `cvar-gamma`), 80% of them
//!   created before the run (`prealloc=80`), spread over directories of [`DIR_WIDTH`] files
//!   (filebench's `dirwidth`); whole-file writes and reads go 1 MiB at a time (`iosize=1m`);
//!   appends are uniform in 1..=16 KiB (`meanappendsize=16k` of `appendfilerand`).
//! - Size, scaled from FAST'18's 1,000,000 files (directory width 10,000) and filebench's
//!   10,000 files of mean 128 KiB to a 2-core machine and a few-hundred-MiB image:
//!   [`Shape::files`] defaults to 1,000 files (100 per directory) of mean 128 KiB
//!   (`--fileserver-files`, `--fileserver-mean-kib`), about 100 MiB preallocated; the smallest
//!   size is 40 files of mean 16 KiB.
//! - A thread holds a file while it works on it (filebench marks a file entry busy), so two
//!   threads never delete, append to or read the same file at once.
//! - data=journal is the target's choice (`lib:data=journal`, `kernel-ext4:data=journal`):
//!   under it every written byte goes through the log, FAST'18's Figure 7(d).

use std::io;

use parking_lot::{Mutex, MutexGuard};
use rand::rngs::SmallRng;
use rand::Rng;
use rand_distr::{Distribution, Gamma};

use super::{pattern, run_flowop_threads, take_entry, Counters, Measured, Size, WorkloadParams};
use crate::fsapi::{read_whole, FsApi, OpenFile};

/// Files per directory (FAST'18's width 10,000 for 1,000,000 files, scaled with the count).
pub const DIR_WIDTH: usize = 100;
const GAMMA_SHAPE: f64 = 1.5;
const APPEND_MAX: usize = 16 << 10;
/// filebench's `iosize=1m`: whole-file reads and writes go this much at a time.
const IO_CHUNK: usize = 1 << 20;
const PREALLOC_PERCENT: usize = 80;
/// The largest file the gamma draw may ask for, so one draw cannot fill a small image.
const FILE_BYTES_MAX_FACTOR: u64 = 16;

/// The file set's shape: `None` takes the size's default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Shape {
    /// Files in the set (default 1,000; smallest 40).
    pub files: Option<usize>,
    /// Mean file size in bytes (default 128 KiB; smallest 16 KiB).
    pub file_bytes_mean: Option<u64>,
}

impl Shape {
    /// The file count and mean file size this shape gives at `size`.
    pub fn resolve(self, size: Size) -> io::Result<(usize, u64)> {
        let (files, mean) = match size {
            Size::Default => (1000, 128 << 10),
            Size::Smallest => (40, 16 << 10),
        };
        let files = self.files.unwrap_or(files);
        let mean = self.file_bytes_mean.unwrap_or(mean);
        if files < 2 || mean == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("fileserver needs at least 2 files of mean size above 0 ({files}, {mean})"),
            ));
        }
        Ok((files, mean))
    }
}

struct Entry {
    exists: bool,
}

struct FileSet {
    entries: Vec<Mutex<Entry>>,
    gamma: Gamma<f64>,
    file_bytes_max: u64,
}

impl FileSet {
    fn path(i: usize) -> String {
        format!("fileserver/d{}/f{i}", i / DIR_WIDTH)
    }

    /// A gamma-distributed file size, at least 1 byte.
    fn file_bytes(&self, rng: &mut SmallRng) -> u64 {
        (self.gamma.sample(rng) as u64).clamp(1, self.file_bytes_max)
    }

    /// Takes a file that exists (or does not); see [`take_entry`].
    fn take(&self, rng: &mut SmallRng, exists: bool) -> (usize, MutexGuard<'_, Entry>) {
        take_entry(&self.entries, rng, |e| e.exists == exists)
    }
}

/// filebench's writewholefile: `bytes` of `data`, 1 MiB at a time.
fn write_whole(
    c: &mut Counters,
    file: &mut dyn OpenFile,
    bytes: u64,
    data: &[u8],
) -> io::Result<()> {
    let mut at = 0;
    while at < bytes {
        let n = (bytes - at).min(data.len() as u64) as usize;
        c.write(file, at, &data[..n])?;
        at += n as u64;
    }
    Ok(())
}

/// Creates the directories and the preallocated 80% of the files.
fn prepare(api: &dyn FsApi, params: &WorkloadParams) -> io::Result<FileSet> {
    let (files, mean) = params.fileserver.resolve(params.size)?;
    api.mkdir("fileserver")?;
    for d in 0..files.div_ceil(DIR_WIDTH) {
        api.mkdir(&format!("fileserver/d{d}"))?;
    }
    let gamma = Gamma::new(GAMMA_SHAPE, mean as f64 / GAMMA_SHAPE).map_err(io::Error::other)?;
    let mut set =
        FileSet { entries: Vec::new(), gamma, file_bytes_max: mean * FILE_BYTES_MAX_FACTOR };
    let mut rng = params.rng(usize::MAX);
    let data = pattern(IO_CHUNK, params.seed);
    let mut ignored = Counters::default();
    for i in 0..files {
        // The last file never exists at the start, so a create always finds a free entry.
        let exists = i + 1 < files && rng.gen_range(0..100) < PREALLOC_PERCENT;
        if exists {
            let bytes = set.file_bytes(&mut rng);
            write_whole(&mut ignored, &mut *api.create(&FileSet::path(i))?, bytes, &data)?;
        }
        set.entries.push(Mutex::new(Entry { exists }));
    }
    api.sync()?;
    Ok(set)
}

pub fn run(api: &dyn FsApi, params: &WorkloadParams) -> io::Result<Measured> {
    let set = prepare(api, params)?;
    let data = pattern(IO_CHUNK, params.seed + 1);
    run_flowop_threads(params, IO_CHUNK, |_, rng, chunk, c| {
        iteration(api, &set, (rng, &data, chunk), c)
    })
}

/// The 11 flowops.
fn iteration(
    api: &dyn FsApi,
    set: &FileSet,
    (rng, data, chunk): (&mut SmallRng, &[u8], &mut [u8]),
    c: &mut Counters,
) -> io::Result<()> {
    // createfile, writewholefile, closefile
    let (i, mut entry) = set.take(rng, false);
    let mut file = api.create(&FileSet::path(i))?;
    entry.exists = true;
    c.files_created += 1;
    write_whole(c, &mut *file, set.file_bytes(rng), data)?;
    drop(file);
    drop(entry);
    c.ops += 3;
    // openfile, appendfilerand, closefile
    let (i, entry) = set.take(rng, true);
    let mut file = api.open(&FileSet::path(i))?;
    let end = file.size()?;
    c.write(&mut *file, end, &data[..rng.gen_range(1..=APPEND_MAX)])?;
    drop(file);
    drop(entry);
    c.ops += 3;
    // openfile, readwholefile, closefile
    let (i, entry) = set.take(rng, true);
    let mut file = api.open(&FileSet::path(i))?;
    c.bytes_read += read_whole(&mut *file, chunk)?;
    drop(file);
    drop(entry);
    c.ops += 3;
    // deletefile
    let (i, mut entry) = set.take(rng, true);
    api.unlink(&FileSet::path(i))?;
    entry.exists = false;
    drop(entry);
    c.ops += 1;
    // statfile
    let (i, entry) = set.take(rng, true);
    api.stat(&FileSet::path(i))?;
    drop(entry);
    c.ops += 1;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_defaults_follow_the_size_and_refuse_an_empty_set() {
        assert_eq!(Shape::default().resolve(Size::Default).unwrap(), (1000, 128 << 10));
        assert_eq!(Shape::default().resolve(Size::Smallest).unwrap(), (40, 16 << 10));
        let shape = Shape { files: Some(300), file_bytes_mean: Some(4096) };
        assert_eq!(shape.resolve(Size::Default).unwrap(), (300, 4096));
        assert!(Shape { files: Some(1), ..Shape::default() }.resolve(Size::Default).is_err());
        let empty = Shape { file_bytes_mean: Some(0), ..Shape::default() };
        assert!(empty.resolve(Size::Smallest).is_err());
    }
}
