//! Multiple mount protection (the mmp feature), as `fs/ext4/mmp.c` does it for a read-write
//! mount, so that two hosts sharing a device never write the same file system at once.
//!
//! Taking it ([`Mmp::take`], before the mount writes anything, journal replay included):
//! 1. read the MMP block; `check` is the larger of `s_mmp_update_interval` (at least 5 s) and
//!    the block's own `mmp_check_interval`;
//! 2. sequence `MMP_SEQ_FSCK`: e2fsck runs, refuse; `MMP_SEQ_CLEAN`: nobody holds it, go on
//!    at once; anything else (a host holds it, or crashed holding it): wait
//!    `min(2 × check + 1, check + 60)` seconds and read again; a changed sequence means a live
//!    host, refuse;
//! 3. write a new random sequence, wait the same time again, read: another host that took it
//!    meanwhile changed it, refuse.
//!
//! While mounted, a thread (the kernel's kmmpd) writes sequence 1, 2, … every
//! `s_mmp_update_interval` seconds, with the host name, each time after reading the block
//! back: a sequence or host name it did not write means another host took the file system,
//! which then stops writing ([`Mmp::lost`]: the journal aborts, as ext4's
//! `ext4_error(sb, "abort")`). (The kernel reads it back only when its own write was late; one
//! block read per update catches a second writer whenever it writes between two updates.) A clean
//! release writes `MMP_SEQ_CLEAN`; a crash leaves the last sequence, which the next mount
//! waits out once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use blockdev::BlockDevice;
use ondisk::ext4::mmp::{
    MmpBlock, MMP_CHECK_INTERVAL_MAX, MMP_CHECK_INTERVAL_MIN, MMP_CHECK_MULT, MMP_SEQ_CLEAN,
    MMP_SEQ_FSCK, MMP_SEQ_MAX,
};
use ondisk::ext4::Superblock;
use parking_lot::{Condvar, Mutex};

use crate::error::{FsError, Result};

/// The MMP block held by this mount, and the thread that keeps it fresh.
pub(crate) struct Mmp {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    dev: Arc<dyn BlockDevice>,
    offset: u64,
    block_size: usize,
    csum_seed: Option<u32>,
    update_interval: Duration,
    /// [its lock] The block as last written; `stop` asks the thread to end.
    state: Mutex<State>,
    wake: Condvar,
    /// Another host took the file system (or the block could not be written): why.
    lost: Mutex<Option<String>>,
    lost_flag: AtomicBool,
}

struct State {
    block: MmpBlock,
    stop: bool,
}

impl Mmp {
    /// Takes the file system's MMP block for this host (see the module documentation);
    /// `sleep` waits (tests may shorten it).
    pub fn take(
        dev: Arc<dyn BlockDevice>,
        sb: &Superblock,
        sleep: &dyn Fn(Duration),
    ) -> Result<Mmp> {
        let block_size = sb.block_size() as usize;
        if sb.mmp_block < u64::from(sb.first_data_block) || sb.mmp_block >= sb.blocks_count {
            return Err(FsError::corrupted(
                sb.superblock_block(),
                format!("the MMP block {} lies outside the file system", sb.mmp_block),
            ));
        }
        let csum_seed = sb.has_metadata_csum().then(|| sb.csum_seed());
        let shared = Shared {
            offset: sb.mmp_block * block_size as u64,
            dev,
            block_size,
            csum_seed,
            update_interval: Duration::from_secs(u64::from(sb.mmp_update_interval.max(1))),
            state: Mutex::new(State { block: MmpBlock::clean(0), stop: false }),
            wake: Condvar::new(),
            lost: Mutex::new(None),
            lost_flag: AtomicBool::new(false),
        };
        let mut block = shared.read()?;
        let check = sb.mmp_update_interval.max(MMP_CHECK_INTERVAL_MIN).max(block.check_interval);
        let wait = Duration::from_secs(u64::from((2 * check + 1).min(check + 60)));
        let held_by = |b: &MmpBlock| String::from_utf8_lossy(b.nodename_str()).into_owned();
        let mut waited = Duration::ZERO;
        match block.seq {
            MMP_SEQ_CLEAN => {}
            MMP_SEQ_FSCK => {
                return Err(FsError::InUse(format!(
                    "e2fsck is running on it ({})",
                    held_by(&block)
                )))
            }
            seq => {
                sleep(wait);
                waited = wait;
                block = shared.read()?;
                if block.seq != seq {
                    return Err(FsError::InUse(format!("active on {}", held_by(&block))));
                }
            }
        }
        let seq = new_seq();
        block.seq = seq;
        shared.write(&block)?;
        sleep(waited);
        let now = shared.read()?;
        if now.seq != seq {
            return Err(FsError::InUse(format!("taken meanwhile by {}", held_by(&now))));
        }
        block.set_nodename(&hostname());
        block.set_bdevname(b"quill");
        let check = (MMP_CHECK_MULT * sb.mmp_update_interval).max(MMP_CHECK_INTERVAL_MIN);
        block.check_interval = check;
        shared.state.lock().block = block;
        let shared = Arc::new(shared);
        let for_thread = shared.clone();
        let thread = std::thread::Builder::new()
            .name("quill-mmp".into())
            .spawn(move || for_thread.refresh_until_stopped(now))
            .map_err(|e| FsError::Invalid(format!("spawning the MMP thread: {e}")))?;
        Ok(Mmp { shared, thread: Some(thread) })
    }

    /// Why the file system may no longer be written, if another host took it.
    pub fn lost(&self) -> Option<String> {
        if !self.shared.lost_flag.load(Ordering::Acquire) {
            return None;
        }
        self.shared.lost.lock().clone()
    }

    /// A clean release (unmount, or a mount that failed after taking it): the thread stops and
    /// the block says `MMP_SEQ_CLEAN`.
    pub fn release(mut self) -> Result<()> {
        self.stop_thread();
        if self.lost().is_some() {
            // Another host has it now: its sequence stays.
            return Ok(());
        }
        self.shared.write_clean()
    }

    /// What a crash leaves: the thread stops, the last sequence stays on the device.
    pub fn abandon(mut self) {
        self.stop_thread();
    }

    fn stop_thread(&mut self) {
        self.shared.state.lock().stop = true;
        self.shared.wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Mmp {
    /// Dropped without [`Mmp::release`] or [`Mmp::abandon`] (an error path): released cleanly,
    /// as the kernel's kmmpd writes `MMP_SEQ_CLEAN` whenever it is stopped.
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.stop_thread();
            if self.lost().is_none() {
                let _ = self.shared.write_clean();
            }
        }
    }
}

impl Shared {
    fn read(&self) -> Result<MmpBlock> {
        let mut raw = vec![0u8; self.block_size];
        self.dev.read_at(self.offset, &mut raw)?;
        MmpBlock::parse(&raw, self.csum_seed)
            .map_err(|e| FsError::corrupted(self.offset / self.block_size as u64, e.to_string()))
    }

    /// Writes the structure (the start of its block; the rest of the block is never ours)
    /// through to the media: another host reads the device, not our cache.
    fn write(&self, block: &MmpBlock) -> Result<()> {
        self.dev.write_fua_at(self.offset, &block.encode(self.csum_seed))?;
        Ok(())
    }

    /// The block as last written, released: `MMP_SEQ_CLEAN` and the time.
    fn write_clean(&self) -> Result<()> {
        let mut block = self.state.lock().block.clone();
        block.seq = MMP_SEQ_CLEAN;
        block.time = unix_now();
        self.write(&block)
    }

    fn lose(&self, why: String) {
        *self.lost.lock() = Some(why);
        self.lost_flag.store(true, Ordering::Release);
    }

    /// kmmpd: a new sequence every update interval, each time after reading the block back
    /// to see that it still holds the last one written. Ends when stopped, or when another
    /// host took the block.
    /// `taken`: the block as [`Mmp::take`] last wrote it.
    fn refresh_until_stopped(&self, taken: MmpBlock) {
        let mut seq = 0u32;
        let mut state = self.state.lock();
        let mut written = taken;
        while !state.stop {
            drop(state);
            match self.read() {
                Ok(on_disk)
                    if on_disk.seq == written.seq && on_disk.nodename == written.nodename => {}
                Ok(on_disk) => {
                    let host = String::from_utf8_lossy(on_disk.nodename_str()).into_owned();
                    return self.lose(format!(
                        "the MMP block was changed by another host ({host}): the file system \
                         seems to be mounted twice"
                    ));
                }
                Err(e) => return self.lose(format!("reading the MMP block: {e}")),
            }
            state = self.state.lock();
            if state.stop {
                break;
            }
            seq = if seq >= MMP_SEQ_MAX { 1 } else { seq + 1 };
            state.block.seq = seq;
            state.block.time = unix_now();
            let ours = state.block.clone();
            drop(state);
            let updated = Instant::now();
            if let Err(e) = self.write(&ours) {
                return self.lose(format!("writing the MMP block: {e}"));
            }
            written = ours;
            state = self.state.lock();
            if !state.stop {
                self.wake.wait_for(&mut state, self.update_interval);
            }
            // As kmmpd: the check interval other hosts wait follows how long a round took.
            let round = u16::try_from(updated.elapsed().as_secs()).unwrap_or(u16::MAX);
            state.block.check_interval = MMP_CHECK_MULT
                .saturating_mul(round)
                .clamp(MMP_CHECK_INTERVAL_MIN, MMP_CHECK_INTERVAL_MAX);
        }
    }
}

/// A random sequence number for a mount, 1..=MMP_SEQ_MAX (`mmp_new_seq`).
fn new_seq() -> u32 {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos();
    let mixed = (nanos as u64 ^ u64::from(std::process::id()).rotate_left(32))
        .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    ((mixed >> 32) as u32 % MMP_SEQ_MAX).max(1)
}

fn unix_now() -> u64 {
    crate::filesystem::now().sec.max(0) as u64
}

/// This host's name, as the kernel's `init_utsname()->nodename`.
pub(crate) fn hostname() -> Vec<u8> {
    std::fs::read("/proc/sys/kernel/hostname")
        .map(|mut name| {
            while name.last().is_some_and(|b| b.is_ascii_whitespace()) {
                name.pop();
            }
            name
        })
        .unwrap_or_else(|_| b"quill".to_vec())
}
