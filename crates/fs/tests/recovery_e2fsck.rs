//! quill's journal replay leaves the bytes e2fsck's leaves: crash images of a file-system
//! workload (data=ordered and data=journal, a log that wraps, revokes, escaped blocks) are each
//! replayed by quill's offline recovery (`quill recover`: [`Ext4Image::recover_offline`]) with
//! 1, 2 and 4 threads, and by `e2fsck -fy -E journal_only` (e2fsprogs 1.47.0: "only replay the
//! journal if required, but do not perform any further checks or repairs"), each on its own
//! copy; the images must then be identical byte for byte, but for the superblock fields listed
//! in [`E2FSCK_ONLY_FIELDS`] and the group-descriptor fields in
//! [`E2FSCK_ONLY_DESCRIPTOR_FIELDS`], and `e2fsck -fn` must find quill's clean. Images whose replay
//! leaves inodes on the orphan list are left out: journal_only still releases them (its
//! `check_super_block` runs first), which quill and the kernel do at mount, not in the replay.
//!
//! QUILL_SEED replays the sampling of crash states; QUILL_CRASH_STATES sets how many per mode.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use blockdev::memory::MemDevice;
use blockdev::recording::{CrashOptions, RecordingDevice};
use blockdev::BlockDevice;
use common::{e2fsck, have, mkfs, seed, Rng, Scratch};
use fs::{DataMode, Ext4Image, Filesystem, MountOptions, ROOT_INO};

/// Threads quill replays each image with.
const THREADS: [usize; 3] = [1, 2, 4];

/// Byte offset of the primary ext4 superblock.
const SUPERBLOCK_OFFSET: usize = 1024;

/// Superblock fields (offset, length, name) e2fsck sets when it closes the file system after
/// its replay, as the check it is, and quill's offline replay (like the kernel's replay at
/// mount) leaves as the crash left them:
/// - `s_free_blocks_count` (lo and hi) and `s_free_inodes_count`: e2fsck writes the sums of
///   the group descriptors' counts; ext4 treats the superblock's as a hint and recomputes them
///   from the group descriptors at mount, and the descriptors themselves must match;
/// - `s_wtime`, `s_lastcheck`: the time of e2fsck's write and "check";
/// - `s_mnt_count`: e2fsck resets it to 0 as after a check;
/// - `s_kbytes_written`: e2fsck adds the bytes its own replay wrote;
/// - `s_checksum`, which covers them.
const E2FSCK_ONLY_FIELDS: [(usize, usize, &str); 8] = [
    (0x0C, 4, "s_free_blocks_count_lo"),
    (0x10, 4, "s_free_inodes_count"),
    (0x30, 4, "s_wtime"),
    (0x34, 2, "s_mnt_count"),
    (0x40, 4, "s_lastcheck"),
    (0x158, 4, "s_free_blocks_count_hi"),
    (0x178, 8, "s_kbytes_written"),
    (0x3FC, 4, "s_checksum"),
];

/// The group descriptor table of [`MKFS_OPTIONS`]' images: 1 KiB blocks, so block 2; 64-byte
/// descriptors (64bit); 2 groups.
const GDT_OFFSET: usize = 2048;
const DESCRIPTOR_BYTES: usize = 64;
const GROUPS: usize = 2;

/// Group-descriptor fields (offset in a descriptor, length, name) e2fsck recomputes when it
/// closes the file system (`ext2fs_set_gdt_csum`): `bg_itable_unused` from the inode bitmap
/// (inodes past the last one in use), where ext4 keeps it as a high-water mark that an unlink
/// never raises; and `bg_checksum`, which covers it. quill's value may only be the lower.
const E2FSCK_ONLY_DESCRIPTOR_FIELDS: [(usize, usize, &str); 3] =
    [(0x1C, 2, "bg_itable_unused_lo"), (0x1E, 2, "bg_checksum"), (0x32, 2, "bg_itable_unused_hi")];

/// Image size and mkfs options: 1 KiB blocks and the smallest journal (1,024 blocks), so a
/// short workload wraps the log.
const MKFS_SIZE: &str = "16M";
const MKFS_OPTIONS: [&str; 4] = ["-b", "1024", "-J", "size=1"];

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    (0..len).map(|_| rng.below(256) as u8).collect()
}

/// Files created, rewritten, fsynced, renamed and removed (closed first: no orphans, which
/// journal_only would leave for a full check), enough for the log to wrap; some blocks begin
/// with the JBD2 magic so they are logged escaped.
fn workload(fs: &Filesystem, rng: &mut Rng, ops: u64) {
    let dir = fs.mkdir(ROOT_INO, b"d", 0o755, 0, 0).unwrap().ino;
    let mut live: Vec<(Vec<u8>, u32)> = Vec::new();
    for n in 0..ops {
        match rng.below(6) {
            0..=2 => {
                let name = format!("f{n}").into_bytes();
                let ino = fs.create(dir, &name, 0o644, 0, 0).unwrap().ino;
                let mut bytes = pattern(n, 1 + rng.below(9000) as usize);
                // (A file shorter than the magic cannot start with it.)
                if rng.below(4) == 0 && bytes.len() >= 4 {
                    bytes[..4].copy_from_slice(&0xC03B_3998u32.to_be_bytes());
                }
                fs.write(ino, 0, &bytes).unwrap();
                live.push((name, ino));
            }
            3 if !live.is_empty() => {
                let (_, ino) = &live[rng.below(live.len() as u64) as usize];
                fs.write(*ino, rng.below(4096), &pattern(n, 3000)).unwrap();
            }
            4 if !live.is_empty() => {
                let (name, _) = live.swap_remove(rng.below(live.len() as u64) as usize);
                fs.unlink(dir, &name).unwrap();
            }
            _ => {}
        }
        if let Some((_, ino)) = live.last() {
            fs.fsync(*ino, false).unwrap();
        }
    }
}

/// Crash images whose journal needs replaying, sampled from a recorded run of [`workload`].
fn crash_images(scratch: &Scratch, data: DataMode, seed: u64, wanted: usize) -> Vec<Vec<u8>> {
    let formatted = scratch.path("mkfs.img");
    mkfs(&formatted, MKFS_SIZE, &MKFS_OPTIONS);
    let recording = Arc::new(RecordingDevice::new(std::fs::read(&formatted).unwrap()));
    let options = MountOptions { data, ..MountOptions::default() };
    let fs = Filesystem::open(recording.clone(), options).expect("open for recording");
    // data=ordered logs metadata only: more operations to wrap the log.
    let ops = if data == DataMode::Journal { 220 } else { 700 };
    workload(&fs, &mut Rng::new(seed), ops);
    let stats = fs.journal().stats();
    fs.crash();
    assert!(stats.checkpoints > 0, "{data:?}: the log must wrap: {stats:?}");
    let sample = CrashOptions {
        subsets_per_gap: 2,
        torn_per_gap: 1,
        seed,
        max_states: Some(wanted * 4),
        ..CrashOptions::default()
    };
    let mut images: Vec<Vec<u8>> = recording
        .crash_states(&sample)
        .iter()
        .map(|state| recording.materialize(state))
        .filter(|image| needs_replay(image))
        .collect();
    let step = images.len().div_ceil(wanted).max(1);
    images = images.into_iter().step_by(step).collect();
    images
}

/// needs_recovery is set and the log holds transactions (a crash right after mount leaves the
/// flag set over an empty log).
fn needs_replay(image: &[u8]) -> bool {
    let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::from_bytes(image.to_vec()));
    let Ok(image) = Ext4Image::open(dev.clone()) else { return false };
    let Ok(location) = image.journal_location() else { return false };
    image.superblock().needs_recovery()
        && journal::superblock::read_superblock(&*dev, &location).is_ok_and(|sb| sb.start != 0)
}

/// Runs `e2fsck -fy -E journal_only` on `path`; returns its exit code and output.
fn e2fsck_journal_only(path: &Path) -> (i32, String) {
    let out = Command::new("e2fsck")
        .args(["-fy", "-E", "journal_only"])
        .arg(path)
        .output()
        .expect("run e2fsck");
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

/// The first difference between quill's and e2fsck's images outside [`E2FSCK_ONLY_FIELDS`].
fn first_difference(quill: &[u8], e2fsck: &[u8]) -> Option<String> {
    if quill.len() != e2fsck.len() {
        return Some(format!("sizes {} and {}", quill.len(), e2fsck.len()));
    }
    let masked = |at: usize| {
        E2FSCK_ONLY_FIELDS.iter().find(|(offset, len, _)| {
            (SUPERBLOCK_OFFSET + offset..SUPERBLOCK_OFFSET + offset + len).contains(&at)
        })
    };
    let in_descriptor_field = |at: usize| {
        (GDT_OFFSET..GDT_OFFSET + GROUPS * DESCRIPTOR_BYTES).contains(&at)
            && E2FSCK_ONLY_DESCRIPTOR_FIELDS.iter().any(|(offset, len, _)| {
                ((at - GDT_OFFSET) % DESCRIPTOR_BYTES).wrapping_sub(*offset) < *len
            })
    };
    for group in 0..GROUPS {
        let field = |image: &[u8], offset: usize| {
            let at = GDT_OFFSET + group * DESCRIPTOR_BYTES + offset;
            u16::from_le_bytes([image[at], image[at + 1]]) as u32
        };
        let unused = |image: &[u8]| field(image, 0x1C) | field(image, 0x32) << 16;
        if unused(quill) > unused(e2fsck) {
            return Some(format!(
                "group {group}: bg_itable_unused {} above e2fsck's {}",
                unused(quill),
                unused(e2fsck)
            ));
        }
    }
    let at = (0..quill.len())
        .find(|&i| quill[i] != e2fsck[i] && masked(i).is_none() && !in_descriptor_field(i))?;
    Some(format!(
        "byte {at} (1 KiB block {}, offset {:#x}): quill {:#04x}, e2fsck {:#04x}",
        at / 1024,
        at % 1024,
        quill[at],
        e2fsck[at]
    ))
}

fn replays_match_e2fsck(data: DataMode, name: &str, seed: u64) {
    if !(have("mkfs.ext4", name) && have("e2fsck", name)) {
        return;
    }
    let scratch = Scratch::new(name);
    let images = crash_images(&scratch, data, seed, common::env_count("QUILL_CRASH_STATES", 16));
    assert!(images.len() >= 4, "{name}: crash images needing replay: {}", images.len());
    let e2fsck_path = scratch.path("e2fsck.img");
    let quill_path = scratch.path("quill.img");
    let (mut replayed_blocks, mut with_orphans) = (0usize, 0usize);
    for (i, image) in images.iter().enumerate() {
        let context = format!("{name} seed {seed}, image {i}");
        std::fs::write(&e2fsck_path, image).unwrap();
        let (code, text) = e2fsck_journal_only(&e2fsck_path);
        assert!(code <= 1, "{context}: e2fsck -E journal_only exits {code}:\n{text}");
        let by_e2fsck = std::fs::read(&e2fsck_path).unwrap();
        for threads in THREADS {
            let dev = Arc::new(MemDevice::from_bytes(image.clone()));
            let (report, flag_was_set) =
                Ext4Image::recover_offline(dev.clone(), threads, &|_, _| {}).unwrap_or_else(|e| {
                    panic!("{context}: quill's replay, {threads} threads: {e}")
                });
            assert!(flag_was_set && report.needed, "{context}: {report:?}");
            replayed_blocks += report.replayed_blocks.len();
            let orphans = Ext4Image::open(dev.clone()).unwrap().superblock().last_orphan;
            if orphans != 0 {
                // e2fsck -E journal_only also releases the orphan list (check_super_block runs
                // before it stops); quill, like the kernel, leaves that to the mount.
                with_orphans += 1;
                break;
            }
            let by_quill = dev.snapshot();
            if let Some(d) = first_difference(&by_quill, &by_e2fsck) {
                std::fs::write(&quill_path, &by_quill).unwrap();
                let kept =
                    std::env::temp_dir().join(format!("quill-vs-e2fsck-{}", std::process::id()));
                let _ = std::fs::create_dir_all(&kept);
                let _ = std::fs::copy(&quill_path, kept.join("quill.img"));
                let _ = std::fs::copy(&e2fsck_path, kept.join("e2fsck.img"));
                panic!("{context}, {threads} threads: quill's replay differs from e2fsck's at {d} (kept in {})", kept.display());
            }
            if threads == 1 {
                std::fs::write(&quill_path, &by_quill).unwrap();
                let (code, text) = e2fsck(&quill_path);
                assert_eq!(code, 0, "{context}: e2fsck -fn after quill's replay:\n{text}");
            }
        }
    }
    let compared = images.len() - with_orphans;
    println!(
        "{name}: {compared} crash images replayed alike by e2fsck and quill ({THREADS:?} \
         threads, {replayed_blocks} blocks); {with_orphans} left out with orphans to release"
    );
    assert!(compared >= 3, "{name}: too few images without orphans to compare");
}

#[test]
fn quill_replays_an_ordered_mode_crash_image_to_the_bytes_e2fsck_replays() {
    replays_match_e2fsck(DataMode::Ordered, "e2fsck-ordered", seed("e2fsck ordered"));
}

#[test]
fn quill_replays_a_data_journal_crash_image_to_the_bytes_e2fsck_replays() {
    replays_match_e2fsck(DataMode::Journal, "e2fsck-journal", seed("e2fsck journal"));
}
