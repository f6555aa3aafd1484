//! Cached writes and writeback (the design is in `page_cache.rs`).
//!
//! Writeback of an inode runs under its lock: it takes runs of consecutive dirty pages and
//! hands each, step by step, to `Filesystem::write_step` (data.rs), which allocates, writes the
//! data to the device and then maps it and grows the on-disk size. All the steps of one
//! writeback share one handle when a transaction has the credits, so the file's on-disk size
//! moves from one size the file had to another in one commit. Who writes back:
//! - `fsync`/`fdatasync` (the inode), `sync` and unmount (every dirty inode);
//! - a `write` that takes the dirty total over `MountOptions::dirty_bytes_max` (its own
//!   inode first, then the oldest dirty inodes once its lock is released);
//! - operations that change mappings or the on-disk size directly (truncate up, fallocate,
//!   punch hole, and rename over an existing file, as ext4's `auto_da_alloc` does, so
//!   replace-by-rename never leaves an empty file after a crash);
//! - the [`Flusher`] thread, for data older than `MountOptions::dirty_expire`.

use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::adapters::{extent_ctx, ReadIo};
use crate::block_map;
use crate::error::{FsError, Result};
use crate::extent_tree::Lookup;
use crate::filesystem::{now, Filesystem, Txn};
use crate::groups::{Geometry, Reservation};
use crate::inodes::{InodeData, InodeSlot};
use crate::ops::txn_write_inode;
use crate::page_cache::{hole_blocks, Page};

/// Most blocks one cached write reserves at a time.
const CACHE_CHUNK_BLOCKS: u64 = 256;
/// Most consecutive pages one writeback run hands to `write_step`.
const RUN_BLOCKS_MAX: u32 = 1024;

impl Filesystem {
    /// Copies `bytes` at `offset` into `ino`'s cached pages, reserving a block for each new
    /// page over a hole. Returns how many bytes were taken: all, or fewer when the file
    /// system filled up after some were (ENOSPC if none could be).
    pub(crate) fn cache_write(
        &self,
        slot: &Arc<InodeSlot>,
        data: &mut InodeData,
        offset: u64,
        bytes: &[u8],
    ) -> Result<usize> {
        let bs = u64::from(self.block_size());
        let end = offset + bytes.len() as u64;
        let mut pos = offset;
        let mut chunk_blocks = CACHE_CHUNK_BLOCKS;
        while pos < end {
            let first = pos / bs;
            let chunk_end = end.min((first + chunk_blocks) * bs);
            let last = (chunk_end - 1) / bs;
            let new_pages = self.pages_to_add(slot.ino, data, first as u32, last as u32)?;
            let hole_pages = new_pages.iter().filter(|(_, source)| source.is_none());
            let bits = self.groups.geo.cluster_bits;
            let holes = data.cache.new_hole_blocks(bits, hole_pages.map(|&(lblk, _)| lblk)) as u64;
            let reservation = if holes > 0 {
                match self.groups.reserve(&self.journal, holes) {
                    Ok(reservation) => Some(reservation),
                    Err(FsError::NoSpace) if chunk_blocks > 1 => {
                        // Maybe a smaller piece still fits: go block by block.
                        chunk_blocks = 1;
                        continue;
                    }
                    Err(FsError::NoSpace) if pos > offset => break,
                    Err(err) => return Err(err),
                }
            } else {
                None
            };
            // Every page of the chunk is built (old contents read) before any is inserted, so
            // an error leaves the cache, its reservation and the dirty accounting as they were.
            let mut pages = Vec::with_capacity(new_pages.len());
            for (lblk, source) in new_pages {
                let mut page = vec![0u8; bs as usize].into_boxed_slice();
                let block_start = u64::from(lblk) * bs;
                let covered = pos <= block_start && chunk_end >= block_start + bs;
                if let Some(Some(pblk)) = source {
                    if !covered {
                        self.read_data(pblk, 0, &mut page)?;
                    }
                }
                pages.push((lblk, Page { data: page, hole: source.is_none() }));
            }
            if !pages.is_empty() && data.cache.dirty_since.is_none() {
                let since = Instant::now();
                data.cache.dirty_since = Some(since);
                self.dirty.mark(slot, since);
            }
            for (lblk, page) in pages {
                data.cache.pages.insert(lblk, page);
                self.dirty.add_bytes(bs);
            }
            if let Some(reservation) = reservation {
                data.cache.hold(reservation);
            }
            let mut at = pos;
            while at < chunk_end {
                let lblk = (at / bs) as u32;
                let in_block = (at % bs) as usize;
                let n = ((bs - in_block as u64).min(chunk_end - at)) as usize;
                let page = data.cache.pages.get_mut(&lblk).expect("page added above");
                let from = (at - offset) as usize;
                page.data[in_block..in_block + n].copy_from_slice(&bytes[from..from + n]);
                at += n as u64;
            }
            if chunk_end > data.size() {
                data.cache.size = Some(chunk_end);
            }
            pos = chunk_end;
        }
        if pos > offset {
            if data.cache.dirty_since.is_none() {
                // Only existing pages were written to: they are dirty again.
                let since = Instant::now();
                data.cache.dirty_since = Some(since);
                self.dirty.mark(slot, since);
            }
            let t = now();
            data.inode.mtime = t;
            data.inode.ctime = t;
        }
        Ok((pos - offset) as usize)
    }

    /// The blocks in `first..=last` without a cached page, each with where its current
    /// contents come from: `None` for a hole (a block to reserve), `Some(None)` for an
    /// unwritten extent (zeros), `Some(Some(pblk))` for written data on disk.
    #[allow(clippy::type_complexity)]
    fn pages_to_add(
        &self,
        ino: u32,
        data: &InodeData,
        first: u32,
        last: u32,
    ) -> Result<Vec<(u32, Option<Option<u64>>)>> {
        let ectx = extent_ctx(self, ino, data);
        let mut io = ReadIo { fs: self };
        let mut out = Vec::new();
        let mut lblk = first;
        while lblk <= last {
            let (run, source) = match block_map::lookup(&mut io, &ectx, &data.inode, lblk)? {
                Lookup::Mapped { pblk, len, unwritten } => {
                    (len.max(1), Some((!unwritten).then_some(pblk)))
                }
                Lookup::Hole { len_to_next } => (len_to_next.unwrap_or(u32::MAX).max(1), None),
            };
            let run_end = last.min(lblk.saturating_add(run - 1));
            for (i, block) in (lblk..=run_end).enumerate() {
                if !data.cache.pages.contains_key(&block) {
                    let source = source.map(|pblk| pblk.map(|p| p + i as u64));
                    out.push((block, source));
                }
            }
            match run_end.checked_add(1) {
                Some(next) => lblk = next,
                None => break,
            }
        }
        Ok(out)
    }

    /// Writes back all of `ino`'s dirty pages (its lock is held: `data` is its state).
    pub(crate) fn writeback_locked(&self, ino: u32, data: &mut InodeData) -> Result<()> {
        if data.cache.is_empty() && data.cache.size.is_none_or(|size| size <= data.inode.size) {
            return Ok(());
        }
        let mut held =
            data.cache.reservation.take().unwrap_or_else(|| self.groups.no_reservation());
        let result = match self.writeback_inline(ino, data) {
            Ok(true) => Ok(()),
            Ok(false) => self.write_back_pages(ino, data, &mut held),
            Err(err) => Err(err),
        };
        if data.cache.is_empty() && result.is_ok() {
            data.cache.clear();
            self.dirty.clear(ino);
        } else {
            // Failed: the pages (or a size past them) stay for the next writeback to retry.
            data.cache.hold(held);
        }
        result
    }

    /// Writes every cached page of `ino` and its cached size, run by run of consecutive
    /// pages, step by step (`Filesystem::write_step`), all in one handle while a transaction
    /// has the credits for them: a commit then never falls between two steps, so a crash
    /// shows the file with the on-disk size it had before this writeback or after it, both
    /// sizes the file really had (a step ends its size at its last page). Only a writeback
    /// larger than a transaction takes more handles, and may then show a size in between,
    /// as the kernel's ext4 may for any writeback.
    fn write_back_pages(
        &self,
        ino: u32,
        data: &mut InodeData,
        held: &mut Reservation,
    ) -> Result<()> {
        let bs = u64::from(self.block_size());
        if data.inode.has_inline_data() && !data.cache.pages.contains_key(&0) {
            // Inline bytes not in the cache (written before them, a file made by the kernel):
            // they move out first, in a handle of their own.
            self.uninline_file(ino, data)?;
        }
        // An inline file as it was, until a step has written it moved out: a step that fails
        // before changing anything leaves the inode as the disk has it.
        let mut inline_before =
            data.inode.has_inline_data().then(|| (data.inode.clone(), data.raw.clone()));
        let target_size = data.size();
        let runs = dirty_runs(data, &self.groups.geo);
        let mut credits_left_to_plan: u64 = runs
            .iter()
            .map(|run| {
                let step = self.write_step_credits(data, u64::from(run.count));
                u64::from(run.count.div_ceil(step.step_blocks)) * u64::from(step.credits)
            })
            .sum::<u64>()
            + GROW_CREDITS;
        let mut txn: Option<Txn<'_>> = None;
        for run in runs {
            let start = u64::from(run.first) * bs;
            let end = ((u64::from(run.first) + u64::from(run.count)) * bs).min(target_size);
            let mut bytes = Vec::with_capacity((end - start) as usize);
            for page in data.cache.pages.range(run.first..run.first + run.count).map(|(_, p)| p) {
                bytes.extend_from_slice(&page.data);
            }
            bytes.truncate((end - start) as usize);
            let mut part = held.split(run.holes);
            let mut done = 0usize;
            let mut removed = run.first;
            let mut failure = None;
            while done < bytes.len() {
                let blocks_left = (bytes.len() - done) as u64;
                let step = self.write_step_credits(data, blocks_left.div_ceil(bs));
                if txn.as_ref().is_some_and(|t| t.handle.credits_left() < step.credits) {
                    // The writeback outgrew one transaction: what is done so far commits.
                    if let Err(err) = txn.take().expect("checked").stop() {
                        failure = Some((err, false));
                        break;
                    }
                }
                if txn.is_none() {
                    match self.begin_writeback_handle(ino, data, target_size, credits_left_to_plan)
                    {
                        Ok(started) if data.inode.has_inline_data() => {
                            // The inline bytes are in page 0, the first run: the first handle
                            // moves the file out with it (`inline.rs`).
                            let tid = Some(started.handle.tid());
                            txn = Some(started);
                            let moved = crate::inline::leave_inode(data, self.has_extents(), tid);
                            if let Err(err) = moved {
                                failure = Some((err, false));
                                break;
                            }
                        }
                        Ok(started) => txn = Some(started),
                        Err(err) => {
                            failure = Some((err, false));
                            break;
                        }
                    }
                }
                let txn = txn.as_mut().expect("started above");
                let credits_before = txn.handle.credits_left();
                let mut mapped = false;
                let offset = start + done as u64;
                match self.write_step(
                    txn,
                    ino,
                    data,
                    offset,
                    &bytes[done..],
                    &mut part,
                    &mut mapped,
                ) {
                    Ok(n) => {
                        done += n;
                        inline_before = None;
                    }
                    Err(err) => {
                        failure = Some((err, mapped));
                        break;
                    }
                }
                credits_left_to_plan = credits_left_to_plan
                    .saturating_sub(u64::from(credits_before - txn.handle.credits_left()));
                // Pages written so far leave the cache (with the blocks they reserved: the
                // step used them), so a failure later in the run keeps only the rest.
                let written_to = if done == bytes.len() {
                    run.first + run.count
                } else {
                    run.first + (done as u64 / bs) as u32
                };
                for lblk in removed..written_to {
                    data.cache.pages.remove(&lblk);
                }
                self.dirty.sub_bytes(u64::from(written_to - removed) * bs);
                removed = written_to;
            }
            // What the run did not use goes back to the file, on failure too: its pages over
            // holes are still cached and still need their blocks.
            held.absorb(part);
            if let Some((err, mapped)) = failure {
                return match txn {
                    // Allocation failed before the step changed anything: the steps before it
                    // are whole and commit; the rest stays cached.
                    Some(txn) if matches!(err, FsError::NoSpace) && !mapped => {
                        if let Some((inode, raw)) = inline_before {
                            (data.inode, data.raw) = (inode, raw);
                        }
                        txn.stop()?;
                        Err(err)
                    }
                    // The step changed the file and did not finish: the handle records the
                    // error as errors= says.
                    Some(txn) => self.finish(Err(err), txn),
                    None => Err(err),
                };
            }
        }
        // A truncate may have set a size past the last page (zeros to the end).
        if data.inode.size < target_size {
            let mut txn = match txn {
                Some(txn) => txn,
                None => self.begin_writeback_handle(ino, data, target_size, GROW_CREDITS)?,
            };
            data.inode.size = target_size;
            data.fc.ineligible_next("size change");
            let result = txn_write_inode(self, &mut txn, ino, data, true);
            return self.finish(result, txn);
        }
        match txn {
            Some(txn) => txn.stop().map(|_| ()),
            None => Ok(()),
        }
    }

    /// Starts a handle for (the rest of) a writeback of `ino` that will grow its on-disk size
    /// to `target_size`, asking for `credits` (capped at what one transaction has). The tail
    /// of the block holding the current end of file is zeroed first when no cached page will
    /// overwrite it (under data=journal zeroing takes a handle of its own).
    fn begin_writeback_handle(
        &self,
        ino: u32,
        data: &InodeData,
        target_size: u64,
        credits: u64,
    ) -> Result<Txn<'_>> {
        let bs = u64::from(self.block_size());
        let eof_block = (data.inode.size / bs) as u32;
        if !data.cache.pages.contains_key(&eof_block) {
            self.zero_tail_before_growth(ino, data, target_size)?;
        }
        let credits = u32::try_from(credits).unwrap_or(u32::MAX);
        self.begin_with(credits, self.groups.no_reservation())
    }

    /// Writes back inode `ino`'s dirty pages (taking its lock).
    pub(crate) fn writeback_inode(&self, slot: &InodeSlot) -> Result<()> {
        let mut guard = self.lock_inode(slot)?;
        let data = guard.as_mut().expect("loaded");
        self.writeback_locked(slot.ino, data)
    }

    /// Writes back the given inodes one at a time (holding nothing else); returns the first
    /// error after trying them all.
    fn writeback_list(&self, slots: Vec<Arc<InodeSlot>>) -> Result<()> {
        let mut first_error = None;
        for slot in slots {
            if let Err(err) = self.writeback_inode(&slot) {
                first_error.get_or_insert(err);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Writes back every dirty inode (sync, unmount).
    pub(crate) fn writeback_all(&self) -> Result<()> {
        self.writeback_list(self.dirty.oldest_first(None, usize::MAX))
    }

    /// Writes back the inodes whose oldest dirty data is older than
    /// `MountOptions::dirty_expire` (what the [`Flusher`] does periodically).
    pub fn writeback_expired(&self) -> Result<()> {
        let Some(cutoff) = Instant::now().checked_sub(self.options.dirty_expire) else {
            return Ok(());
        };
        self.writeback_list(self.dirty.oldest_first(Some(cutoff), usize::MAX))
    }

    /// After a write, while the dirty total is over the limit, writes back the oldest dirty
    /// inodes until it is half that (the caller holds no inode lock). One writer does it at a
    /// time; the others over the limit wait for it and then find the total below the limit,
    /// instead of all writing back the same oldest inodes.
    pub(crate) fn balance_dirty(&self) {
        let max = self.options.dirty_bytes_max;
        if self.dirty.bytes() <= max {
            return;
        }
        let _balancing = self.dirty.balancing.lock();
        // An inode that fails to write back is skipped (it stays dirty for fsync, sync and
        // unmount to report), so one bad file cannot stall every writer; a batch that makes no
        // progress ends the round.
        while self.dirty.bytes() > max / 2 {
            let before = self.dirty.bytes();
            for slot in self.dirty.oldest_first(None, BALANCE_BATCH) {
                let _ = self.writeback_inode(&slot);
                if self.dirty.bytes() <= max / 2 {
                    break;
                }
            }
            if self.dirty.bytes() >= before {
                break;
            }
        }
    }

    /// Forgets `ino`'s dirty pages (the inode is being freed); their reserved blocks return.
    pub(crate) fn drop_cached(&self, ino: u32, data: &mut InodeData) {
        let pages = data.cache.clear() as u64;
        if pages > 0 {
            self.dirty.sub_bytes(pages * u64::from(self.block_size()));
            self.dirty.clear(ino);
        }
    }

    /// Drops cached pages past a new, smaller size `size` and zeroes the rest of the page
    /// holding it (truncate). The on-disk size is the caller's business.
    pub(crate) fn shrink_cached(&self, ino: u32, data: &mut InodeData, size: u64) {
        if data.cache.is_empty() {
            data.cache.size = None;
            return;
        }
        let bs = u64::from(self.block_size());
        let bits = self.groups.geo.cluster_bits;
        let dropped = data.cache.drop_from(size.div_ceil(bs) as u32, bits) as u64;
        self.dirty.sub_bytes(dropped * bs);
        if !size.is_multiple_of(bs) {
            if let Some(page) = data.cache.pages.get_mut(&((size / bs) as u32)) {
                page.data[(size % bs) as usize..].fill(0);
            }
        }
        if data.cache.is_empty() {
            data.cache.clear();
            self.dirty.clear(ino);
        } else {
            data.cache.size = (size > data.inode.size).then_some(size);
        }
    }

    /// Starts a [`Flusher`] that writes back expired dirty data every `interval`.
    pub fn start_flusher(self: &Arc<Self>, interval: Duration) -> std::io::Result<Flusher> {
        Flusher::start(Arc::downgrade(self), interval)
    }

    /// Bytes of file data cached and not yet written back.
    pub fn dirty_bytes(&self) -> u64 {
        self.dirty.bytes()
    }
}

/// Credits for growing the on-disk size past the last page (the inode block).
const GROW_CREDITS: u64 = 4;
/// Dirty inodes `balance_dirty` takes from the oldest end at a time (bounds the list it
/// copies while others keep writing).
const BALANCE_BATCH: usize = 256;

/// A run of consecutive cached pages, as one writeback hands it to its steps.
struct DirtyRun {
    first: u32,
    count: u32,
    /// Pages over holes: blocks the run's reservation must carry.
    holes: i64,
}

/// `data`'s cached pages as runs of consecutive blocks, each at most [`RUN_BLOCKS_MAX`].
fn dirty_runs(data: &InodeData, geo: &Geometry) -> Vec<DirtyRun> {
    let mut runs: Vec<DirtyRun> = Vec::new();
    for &lblk in data.cache.pages.keys() {
        match runs.last_mut() {
            Some(run) if lblk == run.first + run.count && run.count < RUN_BLOCKS_MAX => {
                run.count += 1;
            }
            _ => runs.push(DirtyRun { first: lblk, count: 1, holes: 0 }),
        }
    }
    for run in &mut runs {
        let pages = data.cache.pages.range(run.first..run.first + run.count);
        run.holes = hole_blocks(
            geo.cluster_bits,
            pages.filter(|(_, page)| page.hole).map(|(&lblk, _)| lblk),
        );
    }
    runs
}

/// A background thread that writes back dirty data older than `MountOptions::dirty_expire`
/// (the kernel's flusher threads). It holds the file system weakly and stops when dropped or
/// when the file system is gone.
pub struct Flusher {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Flusher {
    fn start(fs: Weak<Filesystem>, interval: Duration) -> std::io::Result<Flusher> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let signal = stop.clone();
        let thread =
            std::thread::Builder::new().name("quill-flusher".into()).spawn(move || loop {
                {
                    let mut stopped = signal.0.lock();
                    if !*stopped {
                        signal.1.wait_for(&mut stopped, interval);
                    }
                    if *stopped {
                        return;
                    }
                }
                let Some(fs) = fs.upgrade() else { return };
                if fs.is_read_only() {
                    continue;
                }
                // A failure either turned the file system read-only (and fsync reports it)
                // or left the pages dirty for fsync, sync or the next round to retry.
                let _ = fs.writeback_expired();
            })?;
        Ok(Flusher { stop, thread: Some(thread) })
    }

    /// Stops the thread and waits for it.
    pub fn stop(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        *self.stop.0.lock() = true;
        self.stop.1.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}
