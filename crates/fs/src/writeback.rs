//! Cached writes and writeback (the design is in `page_cache.rs`).
//!
//! Writeback of an inode runs under its lock: it takes runs of consecutive dirty pages and
//! hands each to `Filesystem::write_step` (data.rs), which allocates, writes the data to the
//! device and then maps it and grows the on-disk size in one handle. Who writes back:
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
use crate::error::{FsError, Result};
use crate::extent_tree::{self, Lookup};
use crate::filesystem::{now, Filesystem};
use crate::inodes::{InodeData, InodeSlot};
use crate::page_cache::Page;

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
            let holes = new_pages.iter().filter(|(_, source)| source.is_none()).count() as u64;
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
            let (run, source) = match extent_tree::lookup(&mut io, &ectx, &data.inode.block, lblk)?
            {
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
        let bs = u64::from(self.block_size());
        let target_size = data.size();
        let mut held =
            data.cache.reservation.take().unwrap_or_else(|| self.groups.no_reservation());
        let result = (|| {
            while let Some((&first, _)) = data.cache.pages.first_key_value() {
                let mut count = 0u32;
                let mut holes = 0i64;
                for (&lblk, page) in data.cache.pages.range(first..) {
                    if lblk != first + count || count == RUN_BLOCKS_MAX {
                        break;
                    }
                    count += 1;
                    holes += i64::from(page.hole);
                }
                let start = u64::from(first) * bs;
                let end = ((u64::from(first) + u64::from(count)) * bs).min(data.size());
                let mut bytes = Vec::with_capacity((end - start) as usize);
                for page in data.cache.pages.range(first..first + count).map(|(_, p)| p) {
                    bytes.extend_from_slice(&page.data);
                }
                bytes.truncate((end - start) as usize);
                let mut part = held.split(holes);
                let mut done = 0usize;
                let mut removed = first;
                let mut step_result = Ok(());
                while done < bytes.len() {
                    match self.write_step(ino, data, start + done as u64, &bytes[done..], &mut part)
                    {
                        Ok(n) => done += n,
                        Err(err) => {
                            step_result = Err(err);
                            break;
                        }
                    }
                    // Pages written so far leave the cache (with the blocks they reserved:
                    // the step used them), so a failure later in the run keeps only the rest.
                    let written_to = if done == bytes.len() {
                        first + count
                    } else {
                        first + (done as u64 / bs) as u32
                    };
                    for lblk in removed..written_to {
                        data.cache.pages.remove(&lblk);
                    }
                    self.dirty.sub_bytes(u64::from(written_to - removed) * bs);
                    removed = written_to;
                }
                // What the run did not use goes back to the file, on failure too: its pages
                // over holes are still cached and still need their blocks.
                held.absorb(part);
                step_result?;
            }
            // A truncate may have set a size past the last page (zeros to the end).
            if data.inode.size < target_size {
                self.grow_disk_size(ino, data, target_size)?;
            }
            Ok(())
        })();
        if data.cache.is_empty() && result.is_ok() {
            data.cache.clear();
            self.dirty.clear(ino);
        } else {
            // Failed: the pages (or a size past them) stay for the next writeback to retry.
            data.cache.hold(held);
        }
        result
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
        self.writeback_list(self.dirty.oldest_first(None))
    }

    /// Writes back the inodes whose oldest dirty data is older than
    /// `MountOptions::dirty_expire` (what the [`Flusher`] does periodically).
    pub fn writeback_expired(&self) -> Result<()> {
        let Some(cutoff) = Instant::now().checked_sub(self.options.dirty_expire) else {
            return Ok(());
        };
        self.writeback_list(self.dirty.oldest_first(Some(cutoff)))
    }

    /// After a write, while the dirty total is over the limit, writes back the oldest dirty
    /// inodes (the caller holds no inode lock).
    pub(crate) fn balance_dirty(&self) {
        let max = self.options.dirty_bytes_max;
        if self.dirty.bytes() <= max {
            return;
        }
        for slot in self.dirty.oldest_first(None) {
            if self.dirty.bytes() <= max / 2 {
                break;
            }
            // An inode that fails to write back is skipped (it stays dirty for fsync, sync
            // and unmount to report), so one bad file cannot stall every writer.
            let _ = self.writeback_inode(&slot);
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
        let dropped = data.cache.drop_from(size.div_ceil(bs) as u32) as u64;
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
