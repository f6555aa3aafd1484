//! The data path: read, write, truncate, fallocate.
//!
//! `write` puts data in the file data cache (`page_cache.rs`); writeback (`writeback.rs`)
//! writes it in bounded steps: a step maps at most [`STEP_BLOCKS_MAX`] blocks, writes their
//! data, and updates the inode (size, i_blocks), all inside a handle, so every committed
//! transaction describes a file whose mapped blocks already hold their data. One writeback
//! runs all its steps in one handle when a transaction has the credits, so a crash shows the
//! file as it was before or after that writeback, never a size in between. `read` sees
//! cached pages over what the disk holds.
//!
//! Ordering (data=ordered, the default): a step maps blocks in its handle and hands their data
//! to the handle's [`DeferredData`], which writes it in one batch right after the handle stops
//! (ext4's writeback submits its I/O outside the handle too), so no handle, and no commit
//! waiting for handles to stop, waits on a data write. The writes are registered as the
//! transaction's ordered data: its commit waits for them before its flush, so the data is
//! durable before the commit block that maps it (or moves the size over it), and a failed
//! write fails that commit (the journal aborts, the change never commits). The inode
//! stays locked until the data is written, so no read sees the mapping before the data. Under
//! errors=continue data is written inside the handle instead, so a failed write can be undone
//! in it and the file system go on (`write_data_out`). Blocks
//! freed by a transaction
//! are not reused until it is durable (`groups.rs`), so in-place data never lands in a block
//! the last durable state still gives to another file. data=writeback gives no more than that
//! here (it is accepted as an option and behaves like ordered). data=journal logs file data
//! in the journal like metadata.
//!
//! The tail of the block holding EOF is kept zero on disk (zeroed when a file shrinks and
//! before it grows), so bytes past an old EOF read back as zeros, as POSIX requires.

use std::sync::Arc;

use blockdev::Write;
use ondisk::ext4;

use crate::adapters::{extent_ctx, ReadIo};
use crate::block_map;
use crate::clean_cache::CachedDevice;
use crate::clusters;
use crate::error::{FsError, Result};
use crate::extent_tree::{ExtentCtx, Lookup};
use crate::filesystem::{now, DataMode, ErrorPolicy, Filesystem, Txn};
use crate::groups::Reservation;
use crate::inode_flags;
use crate::inodes::{InodeData, InodeGuard, InodeSlot};
use crate::meta_io::MetaIo;
use crate::ops::{add_blocks, txn_write_inode};
use ondisk::ext4::iflags;

/// Most blocks one write step maps (bounds a handle's credits and reservation).
const STEP_BLOCKS_MAX: u32 = 256;
/// Most extents one truncate step removes.
const TRUNCATE_EXTENTS_MAX: usize = 32;
/// Most journaled blocks (revoked one credit each) one truncate step frees.
const REVOKE_STEP_BLOCKS: u64 = 256;
/// The largest logical block an extent can map (ext4: 2^32 blocks).
const LBLK_LIMIT: u64 = 1 << 32;

/// fallocate modes quill implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FallocateMode {
    /// Allocate (as unwritten extents) and grow the size.
    Allocate,
    /// Allocate without changing the size (FALLOC_FL_KEEP_SIZE).
    KeepSize,
    /// Deallocate the range, which then reads as zeros (FALLOC_FL_PUNCH_HOLE | KEEP_SIZE).
    PunchHole,
    /// Zero the range (FALLOC_FL_ZERO_RANGE, with `keep_size` FALLOC_FL_KEEP_SIZE), as
    /// ext4_zero_range leaves it: every block the range touches allocated, the range reading as
    /// zeros, the size grown to its end unless `keep_size`.
    ZeroRange { keep_size: bool },
}

/// File data a handle's changes refer to, written after the handle stops (module docs).
/// Dropped unwritten (a handle given up on an error path), it is written then, so a
/// registered commit never waits for it in vain.
///
/// Every deferred write is the transaction's ordered data, overwrites of mapped blocks too:
/// the handle also moves the on-disk size over what it wrote (an append inside the last
/// block maps nothing new), and that size must not become durable before the bytes under it.
#[derive(Default)]
pub(crate) struct DeferredData {
    writes: Vec<(u64, Vec<u8>)>,
    /// The transaction's commit waits for this once a write is deferred.
    ordered: Option<Arc<journal::DataInFlight>>,
}

impl DeferredData {
    /// Queues `data` for device offset `offset`; the handle's transaction will not commit
    /// before it is written.
    pub fn push(&mut self, handle: &journal::Handle, offset: u64, data: Vec<u8>) -> Result<()> {
        if self.ordered.is_none() {
            let in_flight = journal::DataInFlight::new();
            handle.add_ordered_data(in_flight.clone())?;
            self.ordered = Some(in_flight);
        }
        self.writes.push((offset, data));
        Ok(())
    }

    /// Writes everything queued in one batch (merged and submitted together by the device)
    /// and reports the result to the commit waiting for it. `handle_stopped` is the handle's
    /// outcome: if it failed (the journal aborted), nothing is written, as nothing of it
    /// commits.
    pub fn write(&mut self, dev: &CachedDevice, handle_stopped: bool) -> Result<()> {
        let writes = std::mem::take(&mut self.writes);
        let ordered = self.ordered.take();
        if writes.is_empty() {
            if let Some(in_flight) = ordered {
                in_flight.complete(Ok(()));
            }
            return Ok(());
        }
        let result = if handle_stopped {
            let batch: Vec<Write<'_>> = writes
                .iter()
                .map(|(offset, data)| Write { offset: *offset, data, fua: false })
                .collect();
            dev.write_data_batch(&batch)
        } else {
            Err(blockdev::DeviceError::Io {
                op: blockdev::Op::Write,
                offset: writes[0].0,
                source: std::io::Error::from_raw_os_error(crate::error::errno::EIO),
            })
        };
        if let Some(in_flight) = ordered {
            let offset = writes[0].0;
            in_flight.complete(result.as_ref().map(|_| ()).map_err(|e| (offset, e.errno())));
        }
        Ok(result?)
    }
}

/// What one writeback step may use (see [`Filesystem::write_step_credits`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct StepCredits {
    /// Credits one extent change may use.
    pub per_extent: u32,
    /// Most blocks the step maps.
    pub step_blocks: u32,
    /// Credits the step needs.
    pub credits: u32,
    /// Extent-tree blocks to borrow from the metadata pool.
    pub pool_blocks: u64,
}

impl Filesystem {
    /// Locks a live inode whose data is about to be read or changed; directories are refused
    /// (their blocks change only through the directory code).
    pub(crate) fn lock_file<'a>(&self, slot: &'a InodeSlot) -> Result<InodeGuard<'a>> {
        let guard = self.lock_live(slot)?;
        if guard.as_ref().expect("loaded").inode.is_dir() {
            return Err(FsError::IsDir);
        }
        Ok(guard)
    }

    /// Reads up to `buf.len()` bytes at `offset`; returns how many (0 at or past EOF).
    pub fn read(&self, ino: u32, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let (read, atime_due) = self.read_file(ino, offset, buf)?;
        if atime_due {
            // As the kernel's file_accessed: a failed access-time update fails no read.
            let _ = self.touch_atime(ino, false);
        }
        Ok(read)
    }

    /// The read itself; also whether it is due to update the access time, decided under the
    /// same lock.
    fn read_file(&self, ino: u32, offset: u64, buf: &mut [u8]) -> Result<(usize, bool)> {
        let slot = self.inodes.slot(ino);
        let guard = self.lock_file(&slot)?;
        let data = guard.as_ref().expect("loaded");
        let atime_due = !buf.is_empty() && self.atime_due(&data.inode, false);
        let size = data.size();
        if offset >= size || buf.is_empty() {
            return Ok((0, atime_due));
        }
        let len = buf.len().min((size - offset) as usize);
        if data.inode.has_inline_data() && data.cache.pages.is_empty() {
            // Cached writes to an inline file start with its bytes in page 0, read below.
            let bytes =
                self.inline_file_bytes(ino, data).map_err(|e| self.check_fs_error(ino, e))?;
            let end = (offset as usize + len).min(bytes.len());
            let got = end.saturating_sub(offset as usize);
            buf[..got].copy_from_slice(&bytes[offset as usize..end]);
            return Ok((got, atime_due));
        }
        let bs = u64::from(self.block_size());
        let ectx = extent_ctx(self, ino, data);
        let mut io = ReadIo { fs: self };
        let mut done = 0usize;
        while done < len {
            let pos = offset + done as u64;
            let lblk = (pos / bs) as u32;
            let in_block = (pos % bs) as usize;
            if let Some(page) = data.cache.pages.get(&lblk) {
                let n = (bs as usize - in_block).min(len - done);
                buf[done..done + n].copy_from_slice(&page.data[in_block..in_block + n]);
                done += n;
                continue;
            }
            // Read from disk up to the next cached page.
            let cached_next = data.cache.pages.range(lblk..).next().map(|(&next, _)| next);
            let lookup = block_map::lookup(&mut io, &ectx, &data.inode, lblk)
                .map_err(|e| self.check_fs_error(ino, e))?;
            let (run_blocks, pblk) = match lookup {
                Lookup::Mapped { pblk, len: run, unwritten: false } => (u64::from(run), Some(pblk)),
                Lookup::Mapped { len: run, unwritten: true, .. } => (u64::from(run), None),
                Lookup::Hole { len_to_next } => {
                    (u64::from(len_to_next.unwrap_or(u32::MAX)).max(1), None)
                }
            };
            let run_blocks =
                cached_next.map_or(run_blocks, |next| run_blocks.min(u64::from(next - lblk)));
            let run_bytes = (run_blocks * bs - in_block as u64).min((len - done) as u64) as usize;
            let out = &mut buf[done..done + run_bytes];
            match pblk {
                Some(pblk) => {
                    self.read_data(pblk, in_block, out).map_err(|e| self.check_fs_error(ino, e))?
                }
                None => out.fill(0),
            }
            done += run_bytes;
        }
        Ok((len, atime_due))
    }

    /// File data must lie inside the file system and outside its own metadata (superblock and
    /// descriptor copies, bitmaps, inode tables), as `ext4_map_blocks`' check_block_validity
    /// says: a damaged extent pointing there is corruption, and writing through it would
    /// spread the damage.
    pub(crate) fn check_data_blocks(&self, pblk: u64, blocks: u64) -> Result<()> {
        if pblk == 0 || pblk.checked_add(blocks).is_none_or(|end| end > self.params.blocks_count) {
            return Err(FsError::corrupted(pblk, "file data mapped outside the file system"));
        }
        if let Some(meta) = self.groups.system_zone_overlap(pblk, blocks) {
            return Err(FsError::corrupted(
                pblk,
                format!("file data mapped onto metadata block {meta}"),
            ));
        }
        Ok(())
    }

    /// Reads data starting `in_block` bytes into block `pblk`, across contiguous blocks.
    pub(crate) fn read_data(&self, pblk: u64, in_block: usize, out: &mut [u8]) -> Result<()> {
        let bs = self.block_size() as usize;
        let blocks = (in_block + out.len()).div_ceil(bs) as u64;
        self.check_data_blocks(pblk, blocks)?;
        if self.options.data == DataMode::Journal {
            let mut done = 0;
            let mut block = pblk;
            let mut skip = in_block;
            while done < out.len() {
                let n = (bs - skip).min(out.len() - done);
                let buffer = self.journal.read_buffer(block)?;
                buffer.read(|b| out[done..done + n].copy_from_slice(&b[skip..skip + n]));
                done += n;
                skip = 0;
                block += 1;
            }
            return Ok(());
        }
        // Through the clean data cache, in whole blocks: whole blocks go straight into `out`;
        // a partial block goes through a bounce buffer.
        if in_block == 0 && out.len().is_multiple_of(bs) {
            self.clean_cache.read_data(pblk, out)?;
            return Ok(());
        }
        let mut tmp = vec![0u8; blocks as usize * bs];
        self.clean_cache.read_data(pblk, &mut tmp)?;
        out.copy_from_slice(&tmp[in_block..in_block + out.len()]);
        Ok(())
    }

    /// Writes `bytes` at `offset` into the file data cache; returns how many were taken (all,
    /// or fewer when the file system filled up after some were; ENOSPC if none could be).
    /// The data reaches the disk at writeback: fsync, sync, unmount, memory pressure, or the
    /// flusher.
    pub fn write(&self, ino: u32, offset: u64, bytes: &[u8]) -> Result<usize> {
        self.check_writable()?;
        let bs = u64::from(self.block_size());
        let end = offset.checked_add(bytes.len() as u64).ok_or(FsError::FileTooLarge)?;
        if end.div_ceil(bs) > LBLK_LIMIT {
            return Err(FsError::FileTooLarge);
        }
        let slot = self.inodes.slot(ino);
        let mut guard = self.lock_file(&slot)?;
        let data = guard.as_mut().expect("loaded");
        inode_flags::check_mutable(&data.inode)?;
        // An indirect-mapped file's limit (`s_bitmap_maxbytes`) cuts the write short there,
        // as the kernel's ext4_write_checks does.
        let max = self.max_file_bytes(&data.inode);
        let bytes = if end > max {
            if offset >= max {
                return Err(FsError::FileTooLarge);
            }
            &bytes[..(max - offset) as usize]
        } else {
            bytes
        };
        if data.inode.flags & iflags::APPEND_FL != 0 && offset != data.size() {
            // The kernel moves an append-only file's writes to its end (IS_APPEND in
            // generic_write_checks); a caller of the library names the offset itself.
            return Err(FsError::NotPermitted("the inode is append only (chattr +a)"));
        }
        if bytes.is_empty() {
            return Ok(0);
        }
        // A write that leaves an inline file fitting its inode is made there at once, as
        // ext4_write_inline_data_end does (no block, no cache); otherwise the inline bytes go
        // into the cache's first page before the write lands there or elsewhere, and
        // writeback keeps the file inline or moves it out (`inline.rs`).
        // `S`: the write is durable before it returns, as an O_SYNC write.
        let sync = data.inode.flags & iflags::SYNC_FL != 0;
        if self.write_inline(ino, data, offset, bytes)? {
            drop(guard);
            if sync {
                self.fsync(ino, false)?;
            }
            return Ok(bytes.len());
        }
        self.cache_inline_bytes(&slot, data)?;
        // Corruption met while preparing cached pages (a damaged extent tree) is handled as
        // it would be had the write gone to disk at once: errors= decides (ext4_error).
        let done = self.cache_write(&slot, data, offset, bytes).map_err(|err| {
            if err.is_corruption() {
                let err = self.fail(err);
                self.save_error_state();
                err
            } else {
                err
            }
        })?;
        if self.dirty.bytes() > self.options.dirty_bytes_max {
            // Over the limit: this file's data goes first, then (without its lock) the
            // oldest other dirty files'. The bytes are accepted whatever happens here, as the
            // kernel's buffered write: a failed writeback leaves the pages cached for fsync,
            // sync or unmount to retry and report (and a fatal one has turned the file
            // system read-only already).
            let _ = self.writeback_locked(ino, data);
            drop(guard);
            self.balance_dirty();
        } else {
            drop(guard);
        }
        if sync {
            self.fsync(ino, false)?;
        }
        Ok(done)
    }

    /// Credits one writeback step of `blocks` blocks needs in a handle: the extent-tree and
    /// inode blocks it may touch, and under data=journal the data blocks it logs (of which it
    /// takes no more than a transaction has credits for beside the metadata).
    pub(crate) fn write_step_credits(&self, data: &InodeData, blocks: u64) -> StepCredits {
        let per_extent = block_map::worst_case_blocks_touched(&data.inode) + 6;
        let pool_blocks = block_map::new_blocks_per_insert(&data.inode) * 4;
        let meta = per_extent * 8 + 8;
        let step_max = if self.options.data == DataMode::Journal {
            let room = self.max_op_credits().saturating_sub(meta);
            STEP_BLOCKS_MAX.min(room).max(1)
        } else {
            STEP_BLOCKS_MAX
        };
        let step_blocks = blocks.clamp(1, u64::from(step_max)) as u32;
        let data = if self.options.data == DataMode::Journal { step_blocks } else { 0 };
        StepCredits { per_extent, step_blocks, credits: meta + data, pool_blocks }
    }

    /// One step of writing back, inside the caller's handle `txn`: maps and writes at most
    /// STEP_BLOCKS_MAX blocks of `bytes` at `offset` and grows the inode's size over them. New
    /// blocks come out of `held` (reserved when the data was cached); extent-tree blocks from
    /// the metadata pool. Returns how many bytes it wrote (fewer than a step when the handle's
    /// credits ran short). On error, `*mapped` says whether it changed the file before failing
    /// (the handle must then not commit as if nothing happened).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn write_step(
        &self,
        txn: &mut Txn<'_>,
        ino: u32,
        data: &mut InodeData,
        offset: u64,
        bytes: &[u8],
        held: &mut Reservation,
        mapped: &mut bool,
    ) -> Result<usize> {
        let bs = u64::from(self.block_size());
        let first_lblk = offset / bs;
        let last_lblk = (offset + bytes.len() as u64 - 1) / bs;
        let step = self.write_step_credits(data, last_lblk - first_lblk + 1);
        let per_extent = step.per_extent;
        let step_end =
            ((first_lblk + u64::from(step.step_blocks)) * bs).min(offset + bytes.len() as u64);
        // Extent-tree blocks come from the metadata pool, as many as it can spare (an
        // overwrite or an append to the last extent needs none); the data blocks were
        // reserved when the data was cached.
        let geo = &self.groups.geo;
        txn.reservation.absorb(self.groups.reserve_up_to(geo.meta_blocks(step.pool_blocks)));
        let data_part = held.split(geo.data_blocks(u64::from(step.step_blocks)) as i64);
        let data_given = data_part.blocks;
        txn.reservation.absorb(data_part);
        let mut data_allocated = 0i64;
        *mapped = false;
        let result = (|| {
            let mut ectx = extent_ctx(self, ino, data);
            let mut pos = offset;
            while pos < step_end {
                if txn.handle.credits_left() < per_extent + 2 {
                    break;
                }
                let lblk = (pos / bs) as u32;
                let run_end_lblk = ((step_end - 1) / bs) as u32;
                let lookup = block_map::lookup(txn, &ectx, &data.inode, lblk)?;
                let mut taken = None;
                let (pblk, run, fresh) = match lookup {
                    Lookup::Mapped { pblk, len, unwritten } => {
                        let run = len.min(run_end_lblk - lblk + 1);
                        (pblk, run, unwritten)
                    }
                    Lookup::Hole { len_to_next } => {
                        let want = (run_end_lblk - lblk + 1)
                            .min(len_to_next.unwrap_or(u32::MAX))
                            .min(block_map::run_room(&data.inode, bs as u32, lblk));
                        let goal = self.data_goal(txn, &ectx, data, lblk)?;
                        let new = match clusters::alloc_run(
                            txn,
                            &ectx,
                            &data.inode,
                            lblk,
                            goal,
                            want,
                            false,
                        ) {
                            Ok(new) => new,
                            // The step ends with what it wrote and mapped so far, so that the
                            // size below covers every block it mapped (with bigalloc a hole
                            // in a cluster the file owns maps without allocating); the next
                            // step meets the error before changing anything.
                            Err(_) if pos > offset => break,
                            Err(err) => return Err(err),
                        };
                        taken = new.taken;
                        data_allocated += taken.map_or(0, |(_, count)| count as i64);
                        *mapped = true;
                        ectx.goal = new.pblk + u64::from(new.len);
                        (new.pblk, new.len, true)
                    }
                };
                let run_bytes_end = ((u64::from(lblk) + u64::from(run)) * bs).min(step_end);
                let chunk = &bytes[(pos - offset) as usize..(run_bytes_end - offset) as usize];
                // The data goes out before the blocks are mapped (or an unwritten extent is
                // marked written), so a failed write never maps blocks holding stale data.
                if let Err(err) = self.write_data(txn, pblk, (pos % bs) as usize, chunk, fresh) {
                    if matches!(lookup, Lookup::Hole { .. }) {
                        // The new blocks are not mapped: free them in this handle, which
                        // still commits under errors=continue, so they do not leak (e2fsck:
                        // block bitmap differences). Under errors=remount-ro the journal is
                        // aborted and this fails harmlessly.
                        // With bigalloc the free is of whole clusters and does not revoke: the
                        // blocks data=journal may have journaled are revoked here.
                        let _ = txn.revoke_data(pblk, u64::from(run));
                        if let Some((start, count)) = taken {
                            let _ = txn.free_data_blocks(start, count);
                        }
                    }
                    return Err(err);
                }
                if let Lookup::Mapped { unwritten: true, .. } = lookup {
                    *mapped = true;
                    block_map::mark_written(txn, &ectx, &mut data.inode, lblk, run)?;
                }
                if matches!(lookup, Lookup::Hole { .. }) {
                    block_map::insert(txn, &ectx, &mut data.inode, lblk, pblk, run, false)?;
                }
                pos = run_bytes_end;
            }
            let delta = txn.take_blocks_delta();
            add_blocks(&mut data.inode, delta, self.block_size());
            if pos > data.inode.size {
                data.inode.size = pos;
            }
            // The times were set when the data was written (cached); they go out with it. A
            // fast commit expresses the step: the range it wrote (mapped, or converted from
            // unwritten) and the inode.
            if *mapped && pos > offset {
                let last = ((pos - 1) / bs) as u32;
                data.fc.note_range(txn.handle.tid(), first_lblk as u32, last);
            }
            data.fc.expressible_next();
            txn_write_inode(self, txn, ino, data, true)?;
            Ok((pos - offset) as usize)
        })();
        // What the step did not use of the data blocks it took goes back to the caller; the
        // pool blocks it borrowed for the extent tree return to the pool when the handle stops.
        held.absorb(txn.reservation.split(data_given - data_allocated));
        result
    }

    /// Where to allocate block `lblk` of a file: right after the block before it when that is
    /// mapped (keeps files contiguous), else the inode's group.
    fn data_goal(
        &self,
        io: &mut dyn MetaIo,
        ectx: &ExtentCtx,
        data: &InodeData,
        lblk: u32,
    ) -> Result<u64> {
        if let Some(prev) = lblk.checked_sub(1) {
            if let Lookup::Mapped { pblk, .. } = block_map::lookup(io, ectx, &data.inode, prev)? {
                return Ok(pblk + 1);
            }
        }
        Ok(ectx.goal)
    }

    /// Writes `chunk` starting `in_block` bytes into block `pblk` (contiguous blocks). `fresh`
    /// blocks (new or unwritten) have no old contents to keep: the rest of a partial block is
    /// zeros. Blocks holding data already are read, patched and written back.
    fn write_data(
        &self,
        txn: &mut crate::filesystem::Txn<'_>,
        pblk: u64,
        in_block: usize,
        chunk: &[u8],
        fresh: bool,
    ) -> Result<()> {
        let bs = self.block_size() as usize;
        let blocks = (in_block + chunk.len()).div_ceil(bs);
        self.check_data_blocks(pblk, blocks as u64)?;
        let head_partial = in_block != 0;
        let tail_partial = !(in_block + chunk.len()).is_multiple_of(bs);
        if !head_partial && !tail_partial && self.options.data != DataMode::Journal {
            // Whole blocks (writeback's usual run of pages).
            return self.write_data_out(txn, pblk, chunk);
        }
        let mut image = vec![0u8; blocks * bs];
        if !fresh && (head_partial || tail_partial) {
            if head_partial {
                self.read_data(pblk, 0, &mut image[..bs])?;
            }
            if tail_partial && (blocks > 1 || !head_partial) {
                let last = blocks - 1;
                self.read_data(pblk + last as u64, 0, &mut image[last * bs..])?;
            }
        }
        image[in_block..in_block + chunk.len()].copy_from_slice(chunk);
        if self.options.data == DataMode::Journal {
            for (i, block_bytes) in image.chunks(bs).enumerate() {
                let block = pblk + i as u64;
                let buffer = if fresh {
                    self.journal.new_buffer(block)
                } else {
                    self.journal.read_buffer(block)?
                };
                txn.handle.modify(&buffer, |b| b.copy_from_slice(block_bytes))?;
            }
            return Ok(());
        }
        self.write_data_out(txn, pblk, &image)
    }

    /// Writes whole blocks of file data at `pblk`: once the handle stops (module docs), or,
    /// under errors=continue, right now, inside the handle, so that a failed write can still
    /// be undone in that handle (its new blocks freed: `write_step`) and the file system goes
    /// on. Deferred, a failed write cannot be undone: the transaction that maps the blocks
    /// fails its commit, which is what errors=remount-ro does anyway.
    fn write_data_out(&self, txn: &mut Txn<'_>, pblk: u64, blocks: &[u8]) -> Result<()> {
        let offset = pblk * u64::from(self.block_size());
        if self.options.errors == ErrorPolicy::Continue {
            let write = Write { offset, data: blocks, fua: false };
            return Ok(self.clean_cache.write_data_batch(&[write])?);
        }
        txn.deferred.push(&txn.handle, offset, blocks.to_vec())
    }

    /// Before a write or truncate moves EOF from inside a block, zero the rest of that block on
    /// disk so the gap reads as zeros.
    pub(crate) fn zero_tail_before_growth(
        &self,
        ino: u32,
        data: &InodeData,
        new_pos: u64,
    ) -> Result<()> {
        let bs = u64::from(self.block_size());
        let size = data.inode.size;
        if new_pos <= size || size.is_multiple_of(bs) {
            return Ok(());
        }
        self.zero_in_place(ino, data, size, (size / bs + 1) * bs)
    }

    /// Sets the size of `ino` (truncate or extend).
    pub fn truncate(&self, ino: u32, size: u64) -> Result<()> {
        self.check_writable()?;
        let bs = u64::from(self.block_size());
        if size.div_ceil(bs) > LBLK_LIMIT {
            return Err(FsError::FileTooLarge);
        }
        let slot = self.inodes.slot(ino);
        let mut guard = self.lock_file(&slot)?;
        let data = guard.as_mut().expect("loaded");
        inode_flags::check_unpinned(&data.inode)?;
        if size > self.max_file_bytes(&data.inode) {
            return Err(FsError::FileTooLarge);
        }
        if size == 0 {
            data.flush_on_close = true;
        }
        if self.truncate_inline(ino, data, size)? {
            return Ok(());
        }
        if size == 0 {
            data.flush_on_close = true;
        }
        if size >= data.size() {
            // Growing: cached data goes out first, so the on-disk size never passes data
            // that is still only in memory.
            self.writeback_locked(ino, data)?;
            touch_mtime_ctime(&mut data.inode);
            return self.grow_disk_size(ino, data, size);
        }
        // Shrinking. Cached pages are dropped only once the handle that changes the on-disk
        // size has stopped (the kernel's ext4_setattr sets i_disksize before
        // truncate_pagecache): until then a concurrent sync, which skips inodes with no dirty
        // pages, could commit the old on-disk size without the writes this truncate cuts,
        // showing a version older than what it acknowledged.
        let kept = data.cache.pages.range(..size.div_ceil(bs) as u32).next().is_some();
        if size >= data.inode.size {
            if kept {
                // Cached data stays below the new size: the inode stays dirty, and the cache
                // keeps the new size for writeback.
                self.shrink_cached(ino, data, size);
                touch_mtime_ctime(&mut data.inode);
                return Ok(());
            }
            // Only cached data past the new size existed: the on-disk size grows to it.
            touch_mtime_ctime(&mut data.inode);
            self.grow_disk_size(ino, data, size)?;
            self.shrink_cached(ino, data, size);
            return Ok(());
        }
        // Shrinking on disk: set the size with the inode on the orphan list, so a crash part
        // way finishes the job at mount; then zero the new last block's tail and free blocks
        // from the end in steps. Damage in the tree is found first, before anything changes.
        self.check_extent_tree(ino, data)?;
        let mut txn = self.begin(8, 0)?;
        let result = (|| {
            crate::orphan::add(self, &mut txn, ino, data)?;
            data.inode.size = size;
            touch_mtime_ctime(&mut data.inode);
            data.fc.ineligible_next("truncate");
            txn_write_inode(self, &mut txn, ino, data, true)
        })();
        self.finish(result, txn)?;
        self.shrink_cached(ino, data, size);
        // Past the new end of file, so invisible whenever it reaches the disk.
        self.zero_partial_block(ino, data, size)?;
        self.truncate_blocks(ino, data, size)?;
        if data.inode.links_count == 0 {
            // Unlinked and still open: it stays an orphan until its last close frees it.
            return Ok(());
        }
        let mut txn = self.begin(8, 0)?;
        let result = crate::orphan::remove(self, &mut txn, ino, data)
            .and_then(|()| txn_write_inode(self, &mut txn, ino, data, true));
        self.finish(result, txn)
    }

    /// Sets the on-disk size to `size`, past the current one (the gap reads as zeros).
    pub(crate) fn grow_disk_size(&self, ino: u32, data: &mut InodeData, size: u64) -> Result<()> {
        self.zero_tail_before_growth(ino, data, size)?;
        let mut txn = self.begin(4, 0)?;
        data.inode.size = size;
        data.fc.ineligible_next("size change");
        let result = txn_write_inode(self, &mut txn, ino, data, true);
        self.finish(result, txn)
    }

    /// Zeroes the bytes of the block holding `size` from `size` on (in place).
    fn zero_partial_block(&self, ino: u32, data: &InodeData, size: u64) -> Result<()> {
        let bs = u64::from(self.block_size());
        if size.is_multiple_of(bs) {
            return Ok(());
        }
        self.zero_in_place(ino, data, size, (size / bs + 1) * bs)
    }

    /// Frees every block of `ino` at or past the block holding byte `size` (rounded up).
    pub(crate) fn truncate_blocks(&self, ino: u32, data: &mut InodeData, size: u64) -> Result<()> {
        let first_gone = size.div_ceil(u64::from(self.block_size()));
        self.remove_blocks_in_steps(ino, data, first_gone, LBLK_LIMIT, "truncate", false)?;
        Ok(())
    }

    /// Unmaps and frees logical blocks `[first, end)` of `ino`, from the end, in steps of at
    /// most TRUNCATE_EXTENTS_MAX mapped runs per handle (each step leaves the file whole: a
    /// crash between steps leaves fewer blocks freed). `why` is the change's name for fast
    /// commits; `touch`: each step sets mtime and ctime (a punch). Fast symlinks and device
    /// inodes map nothing. Returns the number of steps (handles).
    fn remove_blocks_in_steps(
        &self,
        ino: u32,
        data: &mut InodeData,
        first: u64,
        end: u64,
        why: &'static str,
        touch: bool,
    ) -> Result<u32> {
        if !self.maps_blocks(data) {
            return Ok(0);
        }
        let mut steps = 0;
        loop {
            let ectx = extent_ctx(self, ino, data);
            let io = &mut ReadIo { fs: self };
            let tail = block_map::runs_in(io, &ectx, &data.inode, first, end)
                .map_err(|e| self.check_fs_error(ino, e))?;
            if tail.is_empty() {
                return Ok(steps);
            }
            steps += 1;
            let mut from = tail
                .iter()
                .rev()
                .nth(TRUNCATE_EXTENTS_MAX - 1)
                .map_or(first, |e| u64::from(e.logical).max(first));
            // Journaled blocks (a directory's, a slow symlink's, or data=journal) are revoked
            // one credit each: free at most REVOKE_STEP_BLOCKS of them per step.
            let revoke = data.inode.is_dir()
                || data.inode.is_symlink()
                || self.options.data == DataMode::Journal;
            let meta_credits = TRUNCATE_EXTENTS_MAX as u32
                * block_map::removal_credits(&data.inode)
                + block_map::worst_case_blocks_touched(&data.inode) * 4;
            // A small journal's transactions hold fewer credits than a full revoke step.
            let revoke_step = u64::from(self.max_op_credits().saturating_sub(meta_credits).max(1))
                .min(REVOKE_STEP_BLOCKS);
            if revoke {
                let last_end = tail.last().map_or(first, |e| e.logical_end().min(end));
                from = from.max(last_end.saturating_sub(revoke_step)).max(first);
            }
            let credits = meta_credits + if revoke { revoke_step as u32 } else { 0 };
            // A truncate takes no reservation: removing extents from the end never splits a
            // node, so a full file system (even one whose free counts are wrong) can always
            // be emptied. A punch inside an extent may split it, and reserves for that.
            let mut txn = if touch {
                self.begin(credits, 4)?
            } else {
                self.begin_with(credits, self.groups.no_reservation())?
            };
            txn.revoke_freed_data = revoke;
            let result = (|| {
                self.remove_blocks(&mut txn, &ectx, data, from as u32, end)?;
                if touch {
                    touch_mtime_ctime(&mut data.inode);
                }
                data.fc.ineligible_next(why);
                txn_write_inode(self, &mut txn, ino, data, true)
            })();
            self.finish(result, txn)?;
            if from == first {
                return Ok(steps);
            }
        }
    }

    /// Reads and checks every node of `ino`'s extent tree, that no extent or tree block claims
    /// file-system metadata (the kernel's `ext4_ext_check` with its system-zone check), and
    /// that the block bitmaps mark them in use, so that an operation that will free blocks
    /// finds damage before its first change.
    pub(crate) fn check_extent_tree(&self, ino: u32, data: &InodeData) -> Result<()> {
        if !self.maps_blocks(data) {
            return Ok(());
        }
        let ectx = extent_ctx(self, ino, data);
        let inode = &data.inode;
        let check = || -> Result<()> {
            let mut ranges = Vec::new();
            let (runs, map_blocks) =
                block_map::runs_and_map_blocks(&mut ReadIo { fs: self }, &ectx, inode)?;
            for e in runs {
                self.check_data_blocks(e.start, u64::from(e.len))?;
                ranges.push((e.start, u64::from(e.len)));
            }
            for block in map_blocks {
                self.check_data_blocks(block, 1)?;
                ranges.push((block, 1));
            }
            // Freeing them needs their bitmaps readable and agreeing.
            self.groups.check_in_use(&self.journal, None, &ranges)
        };
        check().map_err(|e| self.check_fs_error(ino, e))
    }

    /// Whether `ino` maps blocks (an extent tree, or block pointers) that
    /// [`Filesystem::truncate_blocks`] walks; false for inodes that map nothing (fast
    /// symlinks, inline data, and device, fifo and socket inodes; i_blocks may still count an
    /// xattr block).
    pub(crate) fn maps_blocks(&self, data: &InodeData) -> bool {
        (data.inode.flags & ext4::EXTENTS_FL != 0 && !data.inode.has_inline_data())
            || maps_indirectly(&data.inode)
    }

    /// Unmaps and frees logical blocks `[from, to)` under `txn` and counts them out of
    /// i_blocks (truncate and punch).
    fn remove_blocks(
        &self,
        txn: &mut crate::filesystem::Txn<'_>,
        ectx: &ExtentCtx,
        data: &mut InodeData,
        from: u32,
        to: u64,
    ) -> Result<()> {
        txn.take_blocks_delta();
        block_map::remove_range(txn, ectx, &mut data.inode, from, to)?;
        let delta = txn.take_blocks_delta();
        add_blocks(&mut data.inode, delta, self.block_size());
        Ok(())
    }

    /// fallocate: allocate (as unwritten extents) or punch a hole in `[offset, offset + len)`.
    pub fn fallocate(&self, ino: u32, mode: FallocateMode, offset: u64, len: u64) -> Result<()> {
        self.check_writable()?;
        let bs = u64::from(self.block_size());
        let end = offset.checked_add(len).ok_or(FsError::FileTooLarge)?;
        if len == 0 {
            return Err(FsError::Invalid("fallocate of length 0".into()));
        }
        if end.div_ceil(bs) > LBLK_LIMIT {
            return Err(FsError::FileTooLarge);
        }
        let slot = self.inodes.slot(ino);
        let mut guard = self.lock_file(&slot)?;
        let data = guard.as_mut().expect("loaded");
        inode_flags::check_mutable(&data.inode)?;
        // As ext4_fallocate: inline data moves into a block first.
        self.move_inline_out(ino, data)?;
        if !data.inode.uses_extents() && mode != FallocateMode::PunchHole {
            // ext4_fallocate: preallocation needs unwritten extents; only a punch works on
            // an indirect-mapped file.
            return Err(FsError::Unsupported(format!(
                "inode {ino} maps its blocks indirectly (no extents flag): fallocate can only \
                 punch holes in it"
            )));
        }
        if end > self.max_file_bytes(&data.inode) {
            return Err(FsError::FileTooLarge);
        }
        if !matches!(mode, FallocateMode::Allocate | FallocateMode::KeepSize) {
            // vfs_fallocate: an append-only file may only grow.
            inode_flags::check_unpinned(&data.inode)?;
        }
        match mode {
            FallocateMode::PunchHole => self.punch_hole(ino, data, offset, end),
            FallocateMode::Allocate | FallocateMode::KeepSize => {
                self.allocate_range(ino, data, offset, end, mode == FallocateMode::KeepSize)
            }
            FallocateMode::ZeroRange { keep_size } => {
                // A punch (partial edge blocks zeroed in place, whole blocks freed), then
                // unwritten extents over the range, under one hold of the inode's lock. Like
                // ext4's, it takes several transactions: a crash between them leaves the range
                // a hole, which reads as zeros too.
                self.punch_hole(ino, data, offset, end)?;
                self.allocate_range(ino, data, offset, end, keep_size)
            }
        }
    }

    fn allocate_range(
        &self,
        ino: u32,
        data: &mut InodeData,
        offset: u64,
        end: u64,
        keep_size: bool,
    ) -> Result<()> {
        let bs = u64::from(self.block_size());
        self.writeback_locked(ino, data)?;
        let mut lblk = offset / bs;
        let last = end.div_ceil(bs);
        while lblk < last {
            let step = (last - lblk).min(u64::from(STEP_BLOCKS_MAX)) as u32;
            let per_extent = block_map::worst_case_blocks_touched(&data.inode) + 6;
            let pool = block_map::new_blocks_per_insert(&data.inode) * 4;
            let geo = &self.groups.geo;
            let blocks = geo.data_blocks(u64::from(step)) + geo.meta_blocks(pool);
            let reservation = self.groups.reserve(&self.journal, blocks)?;
            let mut txn = self.begin_with(per_extent * 8 + 8, reservation)?;
            let result = (|| {
                let mut ectx = extent_ctx(self, ino, data);
                let step_end = lblk + u64::from(step);
                while lblk < step_end && txn.handle.credits_left() >= per_extent + 2 {
                    let l = lblk as u32;
                    match block_map::lookup(&mut txn, &ectx, &data.inode, l)? {
                        Lookup::Mapped { len, .. } => lblk += u64::from(len),
                        Lookup::Hole { len_to_next } => {
                            let want = ((step_end - lblk) as u32)
                                .min(len_to_next.unwrap_or(u32::MAX))
                                .min(ext4::EXTENT_LEN_INIT_MAX - 1);
                            let goal = self.data_goal(&mut txn, &ectx, data, l)?;
                            let new = clusters::alloc_run(
                                &mut txn,
                                &ectx,
                                &data.inode,
                                l,
                                goal,
                                want,
                                false,
                            )?;
                            ectx.goal = new.pblk + u64::from(new.len);
                            block_map::insert(
                                &mut txn,
                                &ectx,
                                &mut data.inode,
                                l,
                                new.pblk,
                                new.len,
                                true,
                            )?;
                            lblk += u64::from(new.len);
                        }
                    }
                }
                let delta = txn.take_blocks_delta();
                add_blocks(&mut data.inode, delta, self.block_size());
                let covered = (lblk * bs).min(end);
                if !keep_size && covered > data.inode.size {
                    data.inode.size = covered;
                }
                data.inode.ctime = now();
                data.fc.ineligible_next("fallocate");
                txn_write_inode(self, &mut txn, ino, data, true)
            })();
            match result {
                Err(FsError::NoSpace) => {
                    txn.stop()?;
                    return Err(FsError::NoSpace);
                }
                other => self.finish(other, txn)?,
            }
        }
        Ok(())
    }

    fn punch_hole(&self, ino: u32, data: &mut InodeData, offset: u64, end: u64) -> Result<()> {
        let bs = u64::from(self.block_size());
        self.writeback_locked(ino, data)?;
        let end = end.min(data.inode.size.max(offset));
        // Partial blocks at either edge are zeroed in place; whole blocks are deallocated.
        let first_whole = offset.div_ceil(bs);
        let last_whole = end / bs;
        for (from, to) in
            [(offset, end.min(first_whole * bs)), ((last_whole * bs).max(offset), end)]
        {
            if from < to {
                self.zero_in_place(ino, data, from, to)?;
            }
        }
        if first_whole < last_whole {
            let steps = self.remove_blocks_in_steps(
                ino,
                data,
                first_whole,
                last_whole,
                "punch hole",
                true,
            )?;
            if steps == 0 {
                // Nothing mapped there: the punch still changes the file's times.
                let mut txn = self.begin(4, 0)?;
                touch_mtime_ctime(&mut data.inode);
                data.fc.ineligible_next("punch hole");
                let result = txn_write_inode(self, &mut txn, ino, data, true);
                self.finish(result, txn)?;
            }
        }
        Ok(())
    }

    /// The largest size `inode` may have ([`block_map::max_file_bytes`]).
    fn max_file_bytes(&self, inode: &ext4::Inode) -> u64 {
        let huge_file = self.params.feature_ro_compat & ext4::feature::RO_COMPAT_HUGE_FILE != 0;
        block_map::max_file_bytes(inode, self.block_size(), huge_file)
    }

    /// Zeroes `[from, to)` (inside one block) where it is mapped and written: read, clear,
    /// write back (through the journal under data=journal). Holes and unwritten extents read as
    /// zeros already.
    fn zero_in_place(&self, ino: u32, data: &InodeData, from: u64, to: u64) -> Result<()> {
        let bs = u64::from(self.block_size());
        let lblk = from / bs;
        debug_assert!(from < to && to <= (lblk + 1) * bs, "zeroing across blocks");
        let ectx = extent_ctx(self, ino, data);
        let mut io = ReadIo { fs: self };
        let Lookup::Mapped { pblk, unwritten: false, .. } =
            block_map::lookup(&mut io, &ectx, &data.inode, lblk as u32)?
        else {
            return Ok(());
        };
        let mut block = vec![0u8; bs as usize];
        self.read_data(pblk, 0, &mut block)?;
        let range = (from - lblk * bs) as usize..(to - lblk * bs) as usize;
        if block[range.clone()].iter().all(|&b| b == 0) {
            return Ok(());
        }
        block[range].fill(0);
        if self.options.data == DataMode::Journal {
            let mut txn = self.begin(2, 0)?;
            let buffer = self.journal.read_buffer(pblk)?;
            let result = txn.handle.modify(&buffer, |b| b.copy_from_slice(&block));
            return self.finish(result.map_err(FsError::from), txn);
        }
        self.dev.write_at(pblk * bs, &block)?;
        Ok(())
    }
}

/// A change to the file's data: mtime and ctime are now.
fn touch_mtime_ctime(inode: &mut ext4::Inode) {
    let t = now();
    inode.mtime = t;
    inode.ctime = t;
}

/// Whether `inode` (without the extents flag) maps blocks by pointers, direct or indirect
/// (ext2/3 style): a file, directory or slow symlink whose `i_block` holds any. Fast symlinks,
/// device, fifo and socket inodes map nothing, nor does a file whose pointers are all zero
/// (i_blocks may still count an xattr block). The pointers are checked, not `i_size`: a
/// truncate to 0 cut short by a crash leaves `i_size` 0 with every block still mapped, and
/// freeing nothing would expose those stale blocks (e2fsck would make them the file's contents
/// again).
pub(crate) fn maps_indirectly(inode: &ext4::Inode) -> bool {
    if inode.flags & ext4::EXTENTS_FL != 0 || inode.has_inline_data() {
        return false;
    }
    let fast_symlink = inode.is_symlink() && inode.size < ext4::INODE_BLOCK_SIZE as u64;
    let maps_blocks = inode.is_regular() || inode.is_dir() || (inode.is_symlink() && !fast_symlink);
    maps_blocks && inode.block.iter().any(|&b| b != 0)
}
