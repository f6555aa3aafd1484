//! Test support: small journals on memory devices, and the stamp workload whose recovered
//! state can be checked against "some committed prefix that includes every acknowledged
//! transaction".
//!
//! Stamp workload: thread `t` runs handles numbered 1, 2, 3, ...; handle `c` writes `c` into
//! slot `t` of its private block and of a few shared blocks. A recovered image therefore tells,
//! block by block and thread by thread, the newest handle that reached it. The image is a
//! committed prefix ending at tid X exactly when every slot holds the newest counter of its
//! thread among handles whose tid is not after X.
#![allow(dead_code)]

use blockdev::memory::MemDevice;
use blockdev::BlockDevice;
use journal::{superblock, Journal, JournalConfig, JournalError, JournalLocation, RecoveryReport};
use ondisk::jbd2::ChecksumVersion;
use ondisk::Tid;
use std::collections::BTreeMap;
use std::sync::Arc;

pub const BLOCK_SIZE: u32 = 1024;
/// File-system blocks before the journal; the journal follows them.
pub const FS_BLOCKS: u64 = 512;
/// The smallest journal JBD2 accepts (JBD2_MIN_JOURNAL_BLOCKS).
pub const JOURNAL_BLOCKS: u32 = 1024;

pub fn location(journal_blocks: u32) -> JournalLocation {
    JournalLocation::contiguous(BLOCK_SIZE, FS_BLOCKS, journal_blocks).unwrap()
}

pub fn device_bytes(journal_blocks: u32) -> u64 {
    (FS_BLOCKS + journal_blocks as u64) * BLOCK_SIZE as u64
}

/// A formatted memory device with a journal of `journal_blocks` blocks.
pub fn formatted_mem(
    journal_blocks: u32,
    checksum: ChecksumVersion,
) -> (Arc<MemDevice>, JournalLocation) {
    let dev = Arc::new(MemDevice::new(device_bytes(journal_blocks)));
    let loc = location(journal_blocks);
    let options = superblock::FormatOptions { checksum, ..Default::default() };
    superblock::format(&*dev, &loc, options).unwrap();
    (dev, loc)
}

/// A device that passes every call to `inner`, first showing each write batch to `hook` (tests
/// inject panics there, or record or hold batches).
pub struct HookedDevice<D, F> {
    pub inner: D,
    pub hook: F,
}

impl<D: BlockDevice, F: Fn(&[blockdev::Write<'_>]) + Send + Sync> BlockDevice
    for HookedDevice<D, F>
{
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), blockdev::DeviceError> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), blockdev::DeviceError> {
        self.inner.write_at(offset, data)
    }
    fn write_fua_at(&self, offset: u64, data: &[u8]) -> Result<(), blockdev::DeviceError> {
        self.inner.write_fua_at(offset, data)
    }
    fn flush(&self) -> Result<(), blockdev::DeviceError> {
        self.inner.flush()
    }
    fn write_batch(&self, writes: &[blockdev::Write<'_>]) -> Result<(), blockdev::DeviceError> {
        (self.hook)(writes);
        self.inner.write_batch(writes)
    }
}

/// A configuration from a spec: a preset name, then `,name=value` settings
/// (`"classic,commit_io=cooperative"`).
pub fn config(spec: &str) -> JournalConfig {
    JournalConfig::from_spec(spec).unwrap_or_else(|e| panic!("{spec}: {e}"))
}

/// The cooperative I/O settings alone and together, on the JBD2 preset and on CJFS.
pub const COOPERATIVE_SPECS: &[&str] = &[
    "classic,commit_io=cooperative",
    "classic,checkpoint_io=cooperative",
    "classic,commit_io=cooperative,checkpoint_io=cooperative",
    "cjfs,commit_io=cooperative,checkpoint_io=cooperative",
];

pub fn open(dev: Arc<dyn BlockDevice>, loc: &JournalLocation, config: JournalConfig) -> Journal {
    Journal::open(dev, loc.clone(), config).unwrap()
}

pub fn read_block(dev: &dyn BlockDevice, block: u64) -> Vec<u8> {
    let mut buf = vec![0u8; BLOCK_SIZE as usize];
    dev.read_at(block * BLOCK_SIZE as u64, &mut buf).unwrap();
    buf
}

/// First block of the stamp workload's spread pool (after the private blocks).
const SPREAD_FIRST: u64 = 200;

/// Layout of the stamp workload.
#[derive(Clone, Copy, Debug)]
pub struct StampLayout {
    pub threads: usize,
    pub shared_blocks: u64,
    /// A pool of blocks each handle also touches one of, in turn (0: none): a block is logged
    /// again only every `spread_blocks` handles, so checkpoints must write blocks home rather
    /// than find every version superseded.
    pub spread_blocks: u64,
}

impl StampLayout {
    pub fn shared_block(&self, i: u64) -> u64 {
        10 + i
    }
    pub fn private_block(&self, thread: usize) -> u64 {
        100 + thread as u64
    }
    /// Shared blocks handle `counter` of `thread` touches (varies, so transactions overlap
    /// partially).
    pub fn shared_for(&self, thread: usize, counter: u32) -> Vec<u64> {
        let first = (thread as u64 + counter as u64) % self.shared_blocks;
        let second = (first + 1 + counter as u64 % 3) % self.shared_blocks;
        let mut v = vec![self.shared_block(first), self.shared_block(second)];
        v.dedup();
        if self.spread_blocks > 0 {
            let turn = counter as u64 * self.threads as u64 + thread as u64;
            v.push(SPREAD_FIRST + turn % self.spread_blocks);
        }
        v
    }
    /// Every block more than one thread writes (shared and spread blocks).
    pub fn checked_blocks(&self) -> impl Iterator<Item = u64> + '_ {
        let shared = (0..self.shared_blocks).map(|i| self.shared_block(i));
        shared.chain((0..self.spread_blocks).map(|i| SPREAD_FIRST + i))
    }
    pub fn blocks_of(&self, thread: usize, counter: u32) -> Vec<u64> {
        let mut v = self.shared_for(thread, counter);
        v.push(self.private_block(thread));
        v
    }
}

fn slot_offset(thread: usize) -> usize {
    8 + thread * 4
}

pub fn read_slot(block: &[u8], thread: usize) -> u32 {
    let o = slot_offset(thread);
    u32::from_le_bytes(block[o..o + 4].try_into().unwrap())
}

/// Runs one stamp handle: returns its tid.
pub fn stamp_handle(journal: &Journal, layout: &StampLayout, thread: usize, counter: u32) -> Tid {
    let blocks = layout.blocks_of(thread, counter);
    let buffers: Vec<_> = blocks.iter().map(|&b| journal.read_buffer(b).unwrap()).collect();
    let mut handle = journal.start(blocks.len() as u32).unwrap();
    for buffer in &buffers {
        handle
            .modify(buffer, |bytes| {
                let o = slot_offset(thread);
                bytes[o..o + 4].copy_from_slice(&counter.to_le_bytes());
            })
            .unwrap();
    }
    handle.stop().unwrap()
}

/// What each thread did: `tids[t][c-1]` is the tid of handle `c` of thread `t`.
#[derive(Debug, Clone, Default)]
pub struct StampHistory {
    pub tids: Vec<Vec<Tid>>,
}

impl StampHistory {
    /// The workload's first tid.
    pub fn first_tid(&self) -> Tid {
        let all = self.tids.iter().flatten().copied();
        all.reduce(|a, b| if a.is_after(b) { b } else { a }).expect("the workload ran handles")
    }
}

impl StampHistory {
    /// Checks `image` is a committed prefix that includes every tid in `acknowledged`. `base`
    /// is the first tid of the workload. Returns how many tids the prefix holds, or a
    /// description of the violation.
    pub fn check_prefix(
        &self,
        layout: &StampLayout,
        base: Tid,
        image: &dyn Fn(u64) -> Vec<u8>,
        acknowledged: &[Tid],
    ) -> Result<u32, String> {
        // Distance 0 means "no transaction", so the first tid is at distance 1.
        let d = |t: Tid| t.distance_from(base) + 1;
        // Each thread's private block bounds the prefix end X: handle c reached it, c+1 not.
        let (mut low, mut high) = (0u32, u32::MAX);
        for (thread, tids) in self.tids.iter().enumerate() {
            let c = read_slot(&image(layout.private_block(thread)), thread) as usize;
            if c > tids.len() {
                return Err(format!(
                    "thread {thread}: private block has counter {c} > {}",
                    tids.len()
                ));
            }
            if c > 0 {
                low = low.max(d(tids[c - 1]));
            }
            if c < tids.len() {
                high = high.min(d(tids[c]));
            }
        }
        if low >= high {
            return Err(format!(
                "private blocks disagree: prefix end must be >= {low} and < {high}"
            ));
        }
        let x = low;
        for ack in acknowledged {
            if d(*ack) > x {
                return Err(format!(
                    "acknowledged {ack:?} lost: recovered prefix ends at {:?}",
                    Tid(base.0.wrapping_add(x).wrapping_sub(1))
                ));
            }
        }
        // Every slot of every shared block must show the newest handle not after X.
        let mut expected: BTreeMap<(u64, usize), u32> = BTreeMap::new();
        for (thread, tids) in self.tids.iter().enumerate() {
            for (i, tid) in tids.iter().enumerate() {
                if d(*tid) <= x {
                    for b in layout.shared_for(thread, i as u32 + 1) {
                        expected.insert((b, thread), i as u32 + 1);
                    }
                }
            }
        }
        for block in layout.checked_blocks() {
            let data = image(block);
            for thread in 0..layout.threads {
                let want = expected.get(&(block, thread)).copied().unwrap_or(0);
                let got = read_slot(&data, thread);
                if got != want {
                    return Err(format!(
                        "block {block} slot {thread}: {got}, expected {want} for prefix ending at distance {x} (partial transaction)"
                    ));
                }
            }
        }
        Ok(x)
    }
}

/// Runs the stamp workload: `threads` threads, `handles` handles each, fsync every
/// `fsync_every` handles (calling `on_ack` with the acknowledged tid). Returns the history.
pub fn run_stamp_workload(
    journal: &Journal,
    layout: &StampLayout,
    handles: u32,
    fsync_every: u32,
    on_ack: &(dyn Fn(Tid) + Sync),
) -> StampHistory {
    let tids: Vec<Vec<Tid>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..layout.threads)
            .map(|thread| {
                scope.spawn(move || {
                    let mut mine = Vec::new();
                    for counter in 1..=handles {
                        let tid = stamp_handle(journal, layout, thread, counter);
                        mine.push(tid);
                        if counter % fsync_every == 0 {
                            journal.commit_and_wait(tid).unwrap();
                            on_ack(tid);
                        }
                    }
                    mine
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    StampHistory { tids }
}

/// A closure filling a whole block with `byte`.
pub fn fill(byte: u8) -> impl FnOnce(&mut [u8]) {
    move |bytes: &mut [u8]| bytes.fill(byte)
}

/// One transaction filling each `(block, byte)`, committed and waited for; returns its tid.
pub fn commit_fills(journal: &Journal, fills: &[(u64, u8)]) -> Tid {
    let mut handle = journal.start(fills.len() as u32).unwrap();
    for &(block, byte) in fills {
        let buffer = journal.read_buffer(block).unwrap();
        handle.modify(&buffer, fill(byte)).unwrap();
    }
    let tid = handle.stop().unwrap();
    journal.commit_and_wait(tid).unwrap();
    tid
}

/// One transaction revoking `block`; committed and waited for when `wait`. Returns its tid.
pub fn commit_revoke(journal: &Journal, block: u64, wait: bool) -> Tid {
    let mut handle = journal.start(1).unwrap();
    handle.revoke(block).unwrap();
    let tid = handle.stop().unwrap();
    if wait {
        journal.commit_and_wait(tid).unwrap();
    }
    tid
}

/// A small deterministic PRNG for tests (xorshift64*), so no seed is ever lost.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The seed for a randomized test: `QUILL_SEED` if set, else a fixed default; printed so a
/// failure can be reproduced.
pub fn seed(test: &str, default: u64) -> u64 {
    let seed = std::env::var("QUILL_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(default);
    eprintln!("{test}: seed {seed} (set QUILL_SEED to change)");
    seed
}

/// Thread counts the parallel recovery is held to the one-thread reference with.
pub const PARALLEL_THREADS: [usize; 2] = [2, 4];

/// Recovers a copy of `image` with one thread (JBD2's recovery, the reference) and copies with
/// [`PARALLEL_THREADS`], and asserts that the parallel scan and recovery reach the reference's
/// result: the same scan (or error), the same report (or error), and the same device bytes.
/// Returns the reference's outcome and device.
pub fn recover_checking_parallel(
    image: Vec<u8>,
    loc: &JournalLocation,
    context: &str,
) -> (Result<RecoveryReport, JournalError>, Arc<MemDevice>) {
    let original = MemDevice::from_bytes(image.clone());
    let reference_scan = journal::scan_log(&original, loc);
    for threads in PARALLEL_THREADS {
        let scan = journal::recovery::scan_log_parallel(&original, loc, threads);
        match (&reference_scan, &scan) {
            (Ok(a), Ok(b)) => assert!(a == b, "{context}: {threads}-thread scan differs"),
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{context}: {threads}"),
            (a, b) => panic!("{context}: one thread scanned {a:?}, {threads} threads {b:?}"),
        }
    }
    let reference_dev = Arc::new(MemDevice::from_bytes(image.clone()));
    let reference = journal::recover(&*reference_dev, loc, 1);
    let reference_bytes = reference_dev.snapshot();
    for threads in PARALLEL_THREADS {
        let dev = MemDevice::from_bytes(image.clone());
        let outcome = journal::recover(&dev, loc, threads);
        let described = |r: &Result<RecoveryReport, JournalError>| match r {
            Ok(report) => format!(
                "{:?}",
                RecoveryReport { scan_us: 0, replay_us: 0, flush_us: 0, ..report.clone() }
            ),
            Err(e) => format!("error: {e}"),
        };
        assert_eq!(described(&reference), described(&outcome), "{context}: {threads} threads");
        // The in-order replay stops at the first block outside the device; the parallel one
        // finds that error only after its segments ran. Neither marks the journal clean.
        let stopped_early =
            matches!(&reference, Err(e) if e.to_string().contains("outside the device"));
        if !stopped_early && dev.snapshot() != reference_bytes {
            let differs = dev
                .snapshot()
                .chunks(BLOCK_SIZE as usize)
                .zip(reference_bytes.chunks(BLOCK_SIZE as usize))
                .position(|(a, b)| a != b);
            panic!("{context}: {threads}-thread recovery left other bytes (block {differs:?})");
        }
    }
    (reference, reference_dev)
}
