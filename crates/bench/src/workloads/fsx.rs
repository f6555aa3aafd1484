//! fsx: a file-system exerciser after xfstests' `fsx` in its default run (`fsx -N 200000
//! FILE`), on a mounted target: one file per thread, up to 256 KiB long (fsx's maxfilelen),
//! and random operations on it of up to 64 KiB (its maxoplen), drawn with equal weights as
//! fsx draws them: read, write, mapped read, mapped write (MAP_SHARED and msync), truncate,
//! fallocate (with and without KEEP_SIZE), punch hole, zero range, collapse range, insert
//! range, copy_file_range within the file, and fsync. ext4 has no reflink, so fsx's clone,
//! dedupe and exchange operations are left out, as fsx leaves them out on ext4. An operation
//! the target answers EOPNOTSUPP is dropped for the rest of the run, as fsx's start-up probes
//! drop it; so is a fallocate mode or copy_file_range it refuses with EINVAL where the
//! kernel's ext4 takes the same arguments (fuse2fs 1.47 refuses ZERO_RANGE that way). The
//! run's note names every operation dropped, and why.
//!
//! Every read, mapped or not, is checked against an in-memory copy of what the file must
//! hold, and so is the whole file (and its size) when the run ends: a difference fails the
//! run, naming the operation, offset and byte. One operation is one fsx operation; the
//! ratio of two targets' ops/s is the inverse ratio of their times for a fixed count (the
//! issue's 200,000).
//!
//! This is not fsx's code (xfstests is not packaged here): the operation mix and limits are
//! fsx's defaults, the checks are the same in kind.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;

use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, RngCore};

use super::{run_threads, Measured, Step, WorkloadParams};

/// How a run's note begins when the target refused some operations.
pub const DROPPED: &str = "fsx left out what the target refused";

/// fsx's default maxfilelen.
const MAX_LEN: u64 = 256 * 1024;
/// fsx's default maxoplen.
const MAX_OP_LEN: u64 = 64 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Read,
    Write,
    MapRead,
    MapWrite,
    Truncate,
    Fallocate,
    PunchHole,
    ZeroRange,
    CollapseRange,
    InsertRange,
    CopyRange,
    Fsync,
}

const OPS: [Op; 12] = [
    Op::Read,
    Op::Write,
    Op::MapRead,
    Op::MapWrite,
    Op::Truncate,
    Op::Fallocate,
    Op::PunchHole,
    Op::ZeroRange,
    Op::CollapseRange,
    Op::InsertRange,
    Op::CopyRange,
    Op::Fsync,
];

/// One thread's file and what it must hold.
struct Exerciser {
    file: File,
    name: String,
    model: Vec<u8>,
    /// The file system's block size: collapse and insert take whole blocks.
    block: u64,
    page: u64,
    /// Operations the target refused (EOPNOTSUPP, or EINVAL for arguments ext4 takes),
    /// dropped from the draw, with the error.
    unsupported: Vec<(Op, i32)>,
    rng: SmallRng,
    done: u64,
}

/// Whether `err` from `op` means the target does not offer it (see the module docs): the
/// arguments are ones the kernel's ext4 takes, so EINVAL from a fallocate mode or
/// copy_file_range is a refusal, not a mistake of ours.
fn refused(op: Op, err: &io::Error) -> bool {
    let fallocate_family = matches!(
        op,
        Op::Fallocate
            | Op::PunchHole
            | Op::ZeroRange
            | Op::CollapseRange
            | Op::InsertRange
            | Op::CopyRange
    );
    match err.raw_os_error() {
        Some(libc::EOPNOTSUPP) => true,
        Some(libc::EINVAL) => fallocate_family,
        _ => false,
    }
}

fn errno(ret: libc::c_int) -> io::Result<()> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl Exerciser {
    fn open(dir: &Path, name: String, rng: SmallRng) -> io::Result<Exerciser> {
        let path = dir.join(&name);
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(&path)?;
        let block = file.metadata().map(|m| std::os::unix::fs::MetadataExt::blksize(&m))?;
        // SAFETY: sysconf has no memory-safety preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
        Ok(Exerciser {
            file,
            name,
            model: Vec::new(),
            block: block.max(512),
            page,
            unsupported: Vec::new(),
            rng,
            done: 0,
        })
    }

    fn size(&self) -> u64 {
        self.model.len() as u64
    }

    /// An offset below `limit` and a length of 1 to `MAX_OP_LEN`, as fsx draws them.
    fn range(&mut self, limit: u64) -> (u64, u64) {
        let offset = if limit == 0 { 0 } else { self.rng.gen_range(0..limit) };
        (offset, self.rng.gen_range(1..=MAX_OP_LEN))
    }

    /// Runs one operation; returns false if it was skipped (an empty file to read, a range
    /// collapse or insert cannot take, an operation the target does not offer).
    fn step(&mut self) -> io::Result<bool> {
        let op = loop {
            let op = OPS[self.rng.gen_range(0..OPS.len())];
            if !self.unsupported.iter().any(|(dropped, _)| *dropped == op) {
                break op;
            }
        };
        match self.run(op) {
            Ok(ran) => {
                self.done += u64::from(ran);
                Ok(ran)
            }
            Err(err) if refused(op, &err) => {
                self.unsupported.push((op, err.raw_os_error().unwrap_or(0)));
                Ok(false)
            }
            Err(err) => Err(io::Error::new(
                err.kind(),
                format!("fsx {}: operation {} ({op:?}): {err}", self.name, self.done + 1),
            )),
        }
    }

    fn run(&mut self, op: Op) -> io::Result<bool> {
        let size = self.size();
        match op {
            Op::Read | Op::MapRead => {
                if size == 0 {
                    return Ok(false);
                }
                let (offset, len) = self.range(size);
                let len = len.min(size - offset);
                let got = if op == Op::Read {
                    self.read(offset, len)?
                } else {
                    self.map_read(offset, len)?
                };
                self.check(op, offset, &got)?;
            }
            Op::Write | Op::MapWrite => {
                let (offset, len) = self.range(MAX_LEN);
                let len = len.min(MAX_LEN - offset);
                let mut data = vec![0u8; len as usize];
                self.rng.fill_bytes(&mut data);
                if op == Op::Write {
                    self.file.write_all_at(&data, offset)?;
                } else {
                    self.map_write(offset, &data)?;
                }
                self.store(offset, &data);
            }
            Op::Truncate => {
                let new_size = self.rng.gen_range(0..=MAX_LEN);
                self.file.set_len(new_size)?;
                self.model.resize(new_size as usize, 0);
            }
            Op::Fallocate | Op::ZeroRange => {
                let (offset, len) = self.range(MAX_LEN);
                let len = len.min(MAX_LEN - offset);
                let keep_size = self.rng.gen_bool(0.5);
                let mut mode = if keep_size { libc::FALLOC_FL_KEEP_SIZE } else { 0 };
                if op == Op::ZeroRange {
                    mode |= libc::FALLOC_FL_ZERO_RANGE;
                }
                self.fallocate(mode, offset, len)?;
                let end = (offset + len) as usize;
                if op == Op::ZeroRange {
                    let zero_to = end.min(self.model.len());
                    if (offset as usize) < zero_to {
                        self.model[offset as usize..zero_to].fill(0);
                    }
                }
                if !keep_size && end > self.model.len() {
                    self.model.resize(end, 0);
                }
            }
            Op::PunchHole => {
                if size == 0 {
                    return Ok(false);
                }
                let (offset, len) = self.range(size);
                let len = len.min(size - offset);
                self.fallocate(
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    offset,
                    len,
                )?;
                self.model[offset as usize..(offset + len) as usize].fill(0);
            }
            Op::CollapseRange | Op::InsertRange => {
                let (offset, len) = self.range(size);
                let (offset, len) =
                    (offset / self.block * self.block, len / self.block * self.block);
                // Collapse must leave something past the range; insert must start inside the
                // file and keep it under the maximum.
                let fits = len > 0
                    && match op {
                        Op::CollapseRange => offset + len < size,
                        _ => offset < size && size + len <= MAX_LEN,
                    };
                if !fits {
                    return Ok(false);
                }
                let (offset, len) = (offset as usize, len as usize);
                if op == Op::CollapseRange {
                    self.fallocate(libc::FALLOC_FL_COLLAPSE_RANGE, offset as u64, len as u64)?;
                    self.model.drain(offset..offset + len);
                } else {
                    self.fallocate(libc::FALLOC_FL_INSERT_RANGE, offset as u64, len as u64)?;
                    self.model.splice(offset..offset, std::iter::repeat_n(0, len));
                }
            }
            Op::CopyRange => {
                if size == 0 {
                    return Ok(false);
                }
                let (from, len) = self.range(size);
                let len = len.min(size - from);
                let to = self.rng.gen_range(0..MAX_LEN - len);
                // Within one file the ranges must not overlap (EINVAL).
                if to < from + len && from < to + len {
                    return Ok(false);
                }
                self.copy_range(from, to, len)?;
                let data = self.model[from as usize..(from + len) as usize].to_vec();
                self.store(to, &data);
            }
            Op::Fsync => self.file.sync_all()?,
        }
        Ok(true)
    }

    fn store(&mut self, offset: u64, data: &[u8]) {
        let end = offset as usize + data.len();
        if end > self.model.len() {
            self.model.resize(end, 0);
        }
        self.model[offset as usize..end].copy_from_slice(data);
    }

    fn check(&self, op: Op, offset: u64, got: &[u8]) -> io::Result<()> {
        let want = &self.model[offset as usize..offset as usize + got.len()];
        match got.iter().zip(want).position(|(g, w)| g != w) {
            None => Ok(()),
            Some(i) => Err(io::Error::other(format!(
                "{op:?} of {} bytes at {offset}: byte {} is {:#04x}, expected {:#04x}",
                got.len(),
                offset + i as u64,
                got[i],
                want[i]
            ))),
        }
    }

    fn read(&self, offset: u64, len: u64) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; len as usize];
        self.file.read_exact_at(&mut buf, offset)?;
        Ok(buf)
    }

    /// Maps the pages covering `offset..offset + len` (MAP_SHARED), runs `f` on them and the
    /// range's start within the mapping, and unmaps them.
    fn mapped<T>(
        &self,
        offset: u64,
        len: u64,
        prot: libc::c_int,
        f: impl FnOnce(*mut u8, usize) -> io::Result<T>,
    ) -> io::Result<T> {
        let start = offset / self.page * self.page;
        let map_len = (offset + len - start) as usize;
        // SAFETY: a fresh shared mapping of our own open file, unmapped below; `f` touches
        // only `map_len` bytes from its start, which lie inside the file (callers extend it
        // first), so no access faults past EOF.
        unsafe {
            let at = libc::mmap(
                std::ptr::null_mut(),
                map_len,
                prot,
                libc::MAP_SHARED,
                self.file.as_raw_fd(),
                start as libc::off_t,
            );
            if at == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            let result = f(at.cast(), (offset - start) as usize);
            let unmapped = errno(libc::munmap(at, map_len));
            let value = result?;
            unmapped?;
            Ok(value)
        }
    }

    fn map_read(&self, offset: u64, len: u64) -> io::Result<Vec<u8>> {
        self.mapped(offset, len, libc::PROT_READ, |at, skip| {
            // SAFETY: `at + skip .. + len` lies inside the mapping (see `mapped`).
            Ok(unsafe { std::slice::from_raw_parts(at.add(skip), len as usize) }.to_vec())
        })
    }

    /// fsx's mapped write: the file is first extended to cover the range (a mapping cannot),
    /// then the bytes are copied in and msync'd.
    fn map_write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let end = offset + data.len() as u64;
        if end > self.size() {
            self.file.set_len(end)?;
        }
        let len = data.len() as u64;
        self.mapped(offset, len, libc::PROT_READ | libc::PROT_WRITE, |at, skip| {
            // SAFETY: as in `map_read`, and the mapping is writable.
            unsafe {
                std::ptr::copy_nonoverlapping(data.as_ptr(), at.add(skip), data.len());
                let page_start = at.cast::<libc::c_void>();
                errno(libc::msync(page_start, skip + data.len(), libc::MS_SYNC))
            }
        })
    }

    fn fallocate(&self, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
        // SAFETY: fallocate on our own descriptor.
        errno(unsafe {
            libc::fallocate(self.file.as_raw_fd(), mode, offset as libc::off_t, len as libc::off_t)
        })
    }

    fn copy_range(&self, from: u64, to: u64, len: u64) -> io::Result<()> {
        let (mut from, mut to) = (from as libc::loff_t, to as libc::loff_t);
        let mut left = len as usize;
        while left > 0 {
            let fd = self.file.as_raw_fd();
            // SAFETY: copy_file_range within our own descriptor, offsets by pointer to locals.
            let n = unsafe { libc::copy_file_range(fd, &mut from, fd, &mut to, left, 0) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            if n == 0 {
                return Err(io::Error::other("copy_file_range copied nothing"));
            }
            left -= n as usize;
        }
        Ok(())
    }

    /// The whole file against the model, and its size.
    fn verify(&self) -> io::Result<()> {
        let size = self.file.metadata()?.len();
        if size != self.size() {
            return Err(io::Error::other(format!(
                "fsx {}: the file is {size} bytes long, expected {}",
                self.name,
                self.size()
            )));
        }
        let got = self.read(0, size)?;
        self.check(Op::Read, 0, &got)
            .map_err(|e| io::Error::other(format!("fsx {}: at the end: {e}", self.name)))
    }
}

pub fn run(dir: &Path, params: &WorkloadParams) -> io::Result<Measured> {
    let workdir = dir.join("fsx");
    std::fs::create_dir(&workdir)?;
    let files: Vec<Mutex<Exerciser>> = (0..params.threads)
        .map(|t| Exerciser::open(&workdir, format!("fsx.{t}"), params.rng(t)).map(Mutex::new))
        .collect::<io::Result<_>>()?;
    let mut measured = run_threads(params, params.threads, |thread, _, counters| {
        let mut file = files[thread].lock();
        if file.step()? {
            counters.ops += 1;
        }
        Ok(Step::More)
    })?;
    let mut dropped: Vec<String> = Vec::new();
    for file in &files {
        let file = file.lock();
        file.verify()?;
        for (op, errno) in &file.unsupported {
            let what = format!("{op:?} ({})", io::Error::from_raw_os_error(*errno));
            if !dropped.contains(&what) {
                dropped.push(what);
            }
        }
    }
    if !dropped.is_empty() {
        measured.note = format!("{DROPPED}: {}", dropped.join(", "));
    }
    Ok(measured)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// The exerciser keeps its copy in step with the file through every operation the
    /// directory's file system offers (the others are dropped), and a byte changed behind its
    /// back is found.
    #[test]
    fn the_exerciser_checks_every_byte_and_finds_a_changed_one() {
        let dir = std::env::temp_dir().join(format!("quill-fsx-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let seed = 0x0f5c;
        println!("seed {seed:#x}");
        let mut fsx = Exerciser::open(&dir, "f".into(), SmallRng::seed_from_u64(seed)).unwrap();
        for _ in 0..3000 {
            fsx.step().unwrap();
        }
        assert!(fsx.done > 2000, "{} operations ran", fsx.done);
        fsx.verify().unwrap();
        if fsx.size() == 0 {
            fsx.file.write_all_at(&[1], 0).unwrap();
            fsx.model.push(1);
        }
        let at = fsx.size() / 2;
        let flipped = [fsx.model[at as usize] ^ 0xff];
        File::options()
            .write(true)
            .open(dir.join("f"))
            .unwrap()
            .write_all_at(&flipped, at)
            .unwrap();
        let err = fsx.verify().unwrap_err().to_string();
        assert!(err.contains(&format!("byte {at} is")), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
