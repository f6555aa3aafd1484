//! Cooperative commit I/O (FAST'18 §3.2.2, `commit_io=cooperative`).
//!
//! JBD2's commit thread writes a transaction's log blocks alone while handles that cannot join
//! a locked transaction, and fsync callers waiting for it, sleep. Here the commit stage
//! publishes the log blocks as a [`WorkSet`] of chunks (runs of blocks contiguous on the
//! device, cut so several threads can share one transaction) and writes chunks itself; a
//! thread about to sleep (on the journal's `changed` queue, or an fsync on its `done` queue)
//! calls [`help_write_log`] first
//! and writes chunks too. The commit thread then waits for the last chunk, and only then
//! is the transaction Written (`commit.rs`), so its commit block still follows every one of
//! its log blocks (the paper's Property 2).
//!
//! | who | when | then |
//! |---|---|---|
//! | commit thread | after the log blocks are built | writes chunks, waits for every chunk, marks Written or aborts on the first error |
//! | handle start | the running transaction is Locked or full, or the log is short of space | writes chunks, re-checks instead of sleeping |
//! | fsync (`commit_and_wait`) | its transaction is not durable yet | writes chunks, re-checks instead of sleeping |
//!
//! Shadow flags (JBD2's BJ_Shadow, waited on with `versions_max == 1`) are set before the set
//! is published and cleared by the commit thread once every chunk completed, exactly as with
//! one writer. The publication wakes `changed` and every `done` queue, so a thread that found
//! nothing to help and is about to sleep (its wait ticket taken before it looked) looks again.

use crate::abort::EIO;
use crate::buffer::{BlockData, Buffer, IoFlagGuard};
use crate::coop_io::{self, Failure, WorkSet};
use crate::error::{JournalError, Result};
use crate::journal::Shared;
use crate::stats;
use blockdev::{DeviceError, Write};
use std::ops::Range;
use std::sync::Arc;

/// A committing transaction's log blocks and the chunks threads claim.
pub(crate) struct LogWrites {
    offsets: Vec<u64>,
    blocks: Vec<BlockData>,
    chunks: WorkSet<Range<usize>, DeviceError>,
}

/// Writes `blocks` at `offsets` (the transaction's log blocks, commit block excepted) with
/// every thread that comes to help; returns once all are written or one failed.
pub(crate) fn write_log_blocks_cooperatively(
    shared: &Shared,
    buffers: &[(Arc<Buffer>, BlockData)],
    offsets: Vec<u64>,
    blocks: Vec<BlockData>,
) -> Result<()> {
    assert_eq!(offsets.len(), blocks.len());
    let _shadow = IoFlagGuard::new(
        buffers.iter().map(|(buffer, _)| &**buffer),
        |inner| inner.shadow = true,
        |inner| inner.shadow = false,
    );
    let chunks = WorkSet::new(log_chunks(&offsets, shared.block_size() as u64));
    let writes = Arc::new(LogWrites { offsets, blocks, chunks });
    shared.cooperative.log_writes.publish(writes.clone());
    // Threads that looked for work before the publication and found none took their wait
    // ticket before looking: this wake makes them look again instead of sleeping.
    shared.changed.wake_all();
    shared.done.wake_all();
    let mine = writes.chunks.help(|chunk| write_chunk(shared, &writes, chunk));
    let written = writes.chunks.wait();
    shared.cooperative.log_writes.withdraw(&writes);
    stats::add(&shared.counters.commit_chunks, writes.chunks.units().len() as u64);
    stats::add(&shared.counters.commit_chunks_owner, mine as u64);
    match written {
        Ok(()) => Ok(()),
        Err(Failure::Error(e)) => Err(JournalError::from(e)),
        Err(Failure::Panic) => {
            Err(shared.abort("a thread helping with a commit's log writes panicked".into(), EIO))
        }
    }
}

/// Called with no lock held by a thread about to sleep (after taking its wait ticket):
/// if a commit's log writes have unclaimed chunks, writes some and returns `true`, and the
/// caller re-checks what it waits for instead of sleeping. Returns `false` when there is
/// nothing to help with.
pub(crate) fn help_write_log(shared: &Shared) -> bool {
    if shared.config.commit_io != crate::config::CommitIo::Cooperative {
        return false;
    }
    let Some(writes) = shared.cooperative.log_writes.current() else { return false };
    if !writes.chunks.has_unclaimed() {
        return false;
    }
    let performed = writes.chunks.help(|chunk| write_chunk(shared, &writes, chunk));
    stats::add(&shared.counters.commit_chunks_helped, performed as u64);
    true
}

fn write_chunk(
    shared: &Shared,
    writes: &LogWrites,
    chunk: &Range<usize>,
) -> std::result::Result<(), DeviceError> {
    let batch: Vec<Write<'_>> = chunk
        .clone()
        .map(|i| Write { offset: writes.offsets[i], data: writes.blocks[i].as_slice(), fua: false })
        .collect();
    shared.dev.write_batch(&batch)
}

/// The chunks of a transaction's log blocks: runs contiguous on the device (the log wraps, and
/// a journal may be split into extents), each cut into units of [`coop_io::cut`]'s sizes.
fn log_chunks(offsets: &[u64], block_size: u64) -> Vec<Range<usize>> {
    let mut chunks = Vec::new();
    let mut run_start = 0;
    for i in 1..=offsets.len() {
        let run_ends = i == offsets.len() || offsets[i] != offsets[i - 1] + block_size;
        if run_ends {
            let run = coop_io::cut(
                i - run_start,
                coop_io::UNITS_PER_SET_TARGET,
                coop_io::UNIT_BLOCKS_MIN,
                coop_io::UNIT_BLOCKS_MAX,
            );
            chunks.extend(run.into_iter().map(|r| r.start + run_start..r.end + run_start));
            run_start = i;
        }
    }
    debug_assert_eq!(chunks.iter().map(|c| c.len()).sum::<usize>(), offsets.len());
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_chunks_never_span_the_wrap_of_the_log() {
        let bs = 1024;
        // Blocks 1000..1003 at the end of the log, then 10..13 after the wrap.
        let offsets: Vec<u64> = (1000..1003).chain(10..13).map(|b| b * bs).collect();
        assert_eq!(log_chunks(&offsets, bs), vec![0..3, 3..6]);
        let long: Vec<u64> = (0..100).map(|b| b * bs).collect();
        let chunks = log_chunks(&long, bs);
        assert_eq!(chunks.len(), 8, "{chunks:?}");
        assert!(chunks.windows(2).all(|w| w[0].end == w[1].start));
        assert!(log_chunks(&[], bs).is_empty());
    }
}
