//! Runs: the writes of a batch sorted by offset, adjacent ones merged, and staged for the
//! kernel (one `iovec` per piece, or one aligned bounce buffer for O_DIRECT).
//!
//! Invariants:
//! - a run covers `offset .. offset + len` contiguously, every piece of it has the same `fua`;
//! - a run is at most [`RUN_BYTES_MAX`] bytes and [`RUN_PIECES_MAX`] pieces, so a merged
//!   O_DIRECT bounce buffer stays small and a `writev` stays far below `IOV_MAX` (1024);
//! - a staged run's `iovecs` point at memory that lives as long as the run: the caller's slices
//!   (borrowed for `'a`) or the run's own bounce buffer. The kernel only reads through them.
//!
//! Merging changes only how many system calls carry the bytes, never which byte lands where:
//! writes of one batch are allowed to complete in any order, so overlapping writes (which no
//! caller issues) end as separate runs with an unspecified winner, as before merging.

use std::fs::File;
use std::io;
use std::marker::PhantomData;
use std::os::fd::AsRawFd;

use crate::aligned::{AlignedBuf, DIRECT_ALIGN};
use crate::{Write, SECTOR_SIZE};

/// Largest run merged from adjacent writes (and largest piece a big write is cut into).
pub const RUN_BYTES_MAX: usize = 1024 * 1024;

/// Most pieces merged into one run.
pub const RUN_PIECES_MAX: usize = 256;

const _: () = assert!(RUN_BYTES_MAX.is_multiple_of(DIRECT_ALIGN));

/// Adjacent writes of one durability, not yet staged.
#[derive(Debug)]
pub(crate) struct Run<'a> {
    pub offset: u64,
    pub fua: bool,
    pub pieces: Vec<&'a [u8]>,
    pub len: usize,
}

/// Sorts `writes` by offset and merges the adjacent ones of equal `fua` into runs; cuts writes
/// larger than [`RUN_BYTES_MAX`] into several runs. Every write must already be sector-aligned.
pub(crate) fn merge<'a>(writes: &[Write<'a>]) -> Vec<Run<'a>> {
    let mut order: Vec<&Write<'a>> = writes.iter().filter(|w| !w.data.is_empty()).collect();
    order.sort_by_key(|w| w.offset);
    let mut runs: Vec<Run<'a>> = Vec::with_capacity(order.len());
    for w in order {
        for (i, piece) in w.data.chunks(RUN_BYTES_MAX).enumerate() {
            let offset = w.offset + (i * RUN_BYTES_MAX) as u64;
            assert!(
                offset.is_multiple_of(SECTOR_SIZE)
                    && (piece.len() as u64).is_multiple_of(SECTOR_SIZE)
            );
            match runs.last_mut() {
                Some(last) if joins(last, offset, piece.len(), w.fua) => {
                    last.pieces.push(piece);
                    last.len += piece.len();
                }
                _ => runs.push(Run { offset, fua: w.fua, pieces: vec![piece], len: piece.len() }),
            }
        }
    }
    runs
}

fn joins(run: &Run<'_>, offset: u64, len: usize, fua: bool) -> bool {
    run.fua == fua
        && run.offset + run.len as u64 == offset
        && run.len + len <= RUN_BYTES_MAX
        && run.pieces.len() < RUN_PIECES_MAX
}

/// A run ready for the kernel. See the module invariants.
pub(crate) struct Staged<'a> {
    pub offset: u64,
    pub fua: bool,
    pub len: usize,
    iovecs: Vec<libc::iovec>,
    /// Owns the memory `iovecs` points at when the run was copied for O_DIRECT.
    _bounce: Option<AlignedBuf>,
    _borrow: PhantomData<&'a [u8]>,
}

// SAFETY: the raw pointers in `iovecs` point at shared, read-only data that outlives the run
// (`'a` slices) or at the run's own bounce buffer; nothing writes through them.
unsafe impl Send for Staged<'_> {}
unsafe impl Sync for Staged<'_> {}

impl<'a> Staged<'a> {
    /// Stages `run`: buffered I/O and O_DIRECT with aligned caller memory use the caller's
    /// slices as they are; O_DIRECT with unaligned memory copies the run into one bounce buffer.
    pub fn new(run: Run<'a>, direct: bool) -> Staged<'a> {
        assert!(run.len > 0 && run.len <= RUN_BYTES_MAX, "run of {} bytes", run.len);
        let aligned = run.pieces.iter().all(|p| is_direct_aligned(p));
        if !direct || aligned {
            let iovecs = run.pieces.iter().map(|p| iovec(p)).collect();
            return Staged {
                offset: run.offset,
                fua: run.fua,
                len: run.len,
                iovecs,
                _bounce: None,
                _borrow: PhantomData,
            };
        }
        let mut bounce = AlignedBuf::new(run.len);
        let mut at = 0;
        for piece in &run.pieces {
            bounce.as_mut_slice()[at..at + piece.len()].copy_from_slice(piece);
            at += piece.len();
        }
        assert_eq!(at, run.len);
        let iovecs = vec![iovec(bounce.as_slice())];
        Staged {
            offset: run.offset,
            fua: run.fua,
            len: run.len,
            iovecs,
            _bounce: Some(bounce),
            _borrow: PhantomData,
        }
    }

    /// The iovecs of the run; valid as long as `self`.
    pub fn iovecs(&self) -> &[libc::iovec] {
        &self.iovecs
    }

    /// The iovecs of the bytes from `done` on.
    fn iovecs_after(&self, done: usize) -> Vec<libc::iovec> {
        let mut skip = done;
        let mut rest = Vec::with_capacity(self.iovecs.len());
        for v in &self.iovecs {
            if skip >= v.iov_len {
                skip -= v.iov_len;
                continue;
            }
            // SAFETY: `skip < iov_len`, so the advanced pointer stays inside the same piece.
            let base = unsafe { (v.iov_base as *const u8).add(skip) };
            rest.push(libc::iovec {
                iov_base: base as *mut libc::c_void,
                iov_len: v.iov_len - skip,
            });
            skip = 0;
        }
        rest
    }

    /// `pwritev2(flags)` of the bytes from `done` on, continued over short writes.
    pub fn write_from(&self, file: &File, done: usize, flags: libc::c_int) -> io::Result<()> {
        let mut done = done;
        while done < self.len {
            let rest = self.iovecs_after(done);
            let at = libc::off_t::try_from(self.offset + done as u64)
                .map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
            // SAFETY: every iovec points at live memory of the run (module invariants) and the
            // kernel only reads through them.
            let n = unsafe {
                libc::pwritev2(
                    file.as_raw_fd(),
                    rest.as_ptr(),
                    rest.len() as libc::c_int,
                    at,
                    flags,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                return Err(io::Error::new(io::ErrorKind::WriteZero, "pwritev2 wrote nothing"));
            }
            done += n as usize;
        }
        Ok(())
    }
}

/// Whether O_DIRECT can use `data` in place: its address on a [`DIRECT_ALIGN`] boundary (its
/// length is a whole number of sectors for every request that passed `check_range`).
pub(crate) fn is_direct_aligned(data: &[u8]) -> bool {
    (data.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN)
        && (data.len() as u64).is_multiple_of(SECTOR_SIZE)
}

fn iovec(data: &[u8]) -> libc::iovec {
    libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(offset: u64, data: &[u8], fua: bool) -> Write<'_> {
        Write { offset, data, fua }
    }

    #[test]
    fn adjacent_writes_of_equal_fua_merge_in_offset_order() {
        let a = [1u8; 4096];
        let b = [2u8; 512];
        let c = [3u8; 4096];
        let runs = merge(&[w(4608, &c, false), w(0, &a, false), w(4096, &b, false)]);
        assert_eq!(runs.len(), 1);
        assert_eq!((runs[0].offset, runs[0].len, runs[0].pieces.len()), (0, 8704, 3));
        assert_eq!(runs[0].pieces[2][0], 3);
    }

    #[test]
    fn a_gap_or_a_different_fua_starts_a_new_run() {
        let a = [0u8; 4096];
        let runs = merge(&[w(0, &a, false), w(8192, &a, false), w(12288, &a, true)]);
        let shape: Vec<_> = runs.iter().map(|r| (r.offset, r.len, r.fua)).collect();
        assert_eq!(shape, vec![(0, 4096, false), (8192, 4096, false), (12288, 4096, true)]);
    }

    #[test]
    fn runs_stop_at_their_size_and_piece_limits() {
        let big = vec![0u8; RUN_BYTES_MAX * 2 + 4096];
        let runs = merge(&[w(0, &big, false)]);
        let lens: Vec<_> = runs.iter().map(|r| r.len).collect();
        assert_eq!(lens, vec![RUN_BYTES_MAX, RUN_BYTES_MAX, 4096]);
        let small = [0u8; 512];
        let many: Vec<_> =
            (0..RUN_PIECES_MAX as u64 + 1).map(|i| w(i * 512, &small, false)).collect();
        let runs = merge(&many);
        assert_eq!(
            runs.iter().map(|r| r.pieces.len()).collect::<Vec<_>>(),
            vec![RUN_PIECES_MAX, 1]
        );
    }

    #[test]
    fn staging_for_o_direct_copies_only_unaligned_memory() {
        let mut aligned = AlignedBuf::new(8192);
        aligned.as_mut_slice()[4096] = 9;
        let storage = vec![5u8; 4097];
        let unaligned = &storage[1..];
        let in_place = Staged::new(merge(&[w(0, aligned.as_slice(), false)]).remove(0), true);
        assert!(in_place._bounce.is_none());
        assert_eq!(in_place.iovecs()[0].iov_base as usize, aligned.as_slice().as_ptr() as usize);
        let copied = Staged::new(merge(&[w(0, unaligned, false)]).remove(0), true);
        assert!(copied._bounce.is_some());
        let buffered = Staged::new(merge(&[w(0, unaligned, false)]).remove(0), false);
        assert!(buffered._bounce.is_none());
    }

    #[test]
    fn iovecs_after_a_short_write_resume_mid_piece() {
        let a = [1u8; 1024];
        let b = [2u8; 1024];
        let staged = Staged::new(merge(&[w(0, &a, false), w(1024, &b, false)]).remove(0), false);
        let rest = staged.iovecs_after(1536);
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0].iov_len, 512);
        assert_eq!(rest[0].iov_base as usize, b.as_ptr() as usize + 512);
        assert!(staged.iovecs_after(2048).is_empty());
    }
}
