//! Recovery's fast-commit step (jbd2's `fc_do_one_pass` and `j_fc_replay_callback`): the ext4
//! fast commits that extend the last complete full commit.
//!
//! A journal with `INCOMPAT_FAST_COMMIT` keeps a fast-commit area after the log
//! (`[log_end() + 1, max_len)`). After a crash, the fast commits of the tid after the last
//! complete full commit (recovery's `end_tid`) that a good TAIL closes are part of the file
//! system's state: fsync returned once they were written. The records are ext4 operations
//! (inodes, ranges, directory entries), not block images, so only the file system can replay
//! them; it does so through a [`FastCommitReplay`].
//!
//! | journal                                     | area scan                  | recovery does              |
//! |---------------------------------------------|----------------------------|----------------------------|
//! | clean (`s_start == 0`)                      | not read                   | nothing                    |
//! | no `INCOMPAT_FAST_COMMIT`                   | not read                   | full commits only          |
//! | fast commits, none complete for `end_tid`   | no commits                 | full commits only          |
//! | complete fast commits for `end_tid`         | `commits > 0`              | `check`, replay, `replay`  |
//! | damaged before any complete fast commit     | `Corrupted`                | fails, nothing written     |
//!
//! `check` runs before anything is written, so a file system that cannot replay what the area
//! holds refuses with the image untouched. `replay` runs after the full commits are replayed and
//! flushed and before the journal is marked clean: a crash during it leaves the journal needing
//! recovery, and the next recovery replays everything again (both replays are idempotent).

use crate::error::{JournalError, Result};
use crate::location::JournalLocation;
use crate::recovery::read_log_block;
use blockdev::BlockDevice;
use ondisk::jbd2::fast_commit::{scan_fast_commit_area, tag_name, FcRecord, FcScan};
use ondisk::jbd2::{feature, JournalSuperblock};
use ondisk::Tid;

/// The blocks of a journal's fast-commit area, read for a recovery ending at `expected_tid`.
#[derive(Debug, Clone)]
pub struct FastCommitArea {
    /// Journal block of `blocks[0]`.
    pub first_log_block: u32,
    pub blocks: Vec<Vec<u8>>,
    /// The parts of `blocks`, as indices: the one standard area, or quill's per-core areas
    /// (INCOMPAT_QUILL_FC_AREAS), each laid out as a standard area.
    pub parts: Vec<std::ops::Range<usize>>,
    /// The tid whose fast commits recovery replays: the first one without a full commit.
    pub expected_tid: Tid,
}

impl FastCommitArea {
    /// Reads the area of the journal `sb` describes; `None` without `INCOMPAT_FAST_COMMIT`
    /// (the kernel reads the area only when the journal's bit is set, which it is whenever a
    /// fast-commit file system has a live log).
    pub fn read(
        dev: &dyn BlockDevice,
        location: &JournalLocation,
        sb: &JournalSuperblock,
        expected_tid: Tid,
    ) -> Result<Option<FastCommitArea>> {
        if !sb.has_incompat(feature::INCOMPAT_FAST_COMMIT) {
            return Ok(None);
        }
        // The parsed superblock leaves at least 1024 log blocks beside the area, and `log_end`
        // itself is unused (`j_fc_first = j_last + 1`).
        let first_log_block = sb.log_end() + 1;
        assert!(first_log_block > sb.first);
        let mut blocks = Vec::new();
        for log_block in first_log_block..sb.max_len {
            let mut block = vec![0u8; location.block_size() as usize];
            read_log_block(dev, location, log_block, &mut block)?;
            blocks.push(block);
        }
        let parts = sb
            .fast_commit_areas()
            .into_iter()
            .map(|r| (r.start - first_log_block) as usize..(r.end - first_log_block) as usize)
            .collect();
        Ok(Some(FastCommitArea { first_log_block, blocks, parts, expected_tid }))
    }

    /// `ext4_fc_replay_scan` over the area: which records are complete fast commits of
    /// `expected_tid`. `inode_size` is the file system's `s_inode_size` (the longest raw inode
    /// an INODE record may carry). Per-core areas are scanned each as a standard area, and
    /// their complete fast commits follow one another in the result (one file's fast commits
    /// are all in one area, and those of different files commute: `fc_commit.rs`).
    pub fn scan(&self, inode_size: u16) -> Result<FcScan<'_>> {
        let mut merged = FcScan::default();
        for (k, part) in self.parts.iter().enumerate() {
            let blocks = self.blocks[part.clone()].iter().map(Vec::as_slice);
            let scan =
                scan_fast_commit_area(blocks, inode_size, self.expected_tid).map_err(|error| {
                    JournalError::Corrupted {
                        log_block: self.first_log_block + part.start as u32,
                        reason: format!("fast-commit area: {error}"),
                    }
                })?;
            if self.parts.len() == 1 {
                return Ok(scan);
            }
            merged.records.extend_from_slice(&scan.records[..scan.records_valid]);
            merged.records_valid += scan.records_valid;
            merged.commits += scan.commits;
            if merged.stop.is_none() {
                merged.stop = scan.stop.map(|reason| format!("area {k}: {reason}"));
            }
        }
        Ok(merged)
    }
}

/// What a fast-commit replay did, for recovery's report.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct FastCommitReport {
    /// Complete fast commits replayed.
    pub commits: usize,
    /// Records replayed (HEAD, PAD and TAIL included, as `fc_replay_num_tags` counts them).
    pub records: usize,
}

/// The file system's side of fast-commit recovery (jbd2's `j_fc_replay_callback`).
pub trait FastCommitReplay {
    /// `s_inode_size` of the file system, for the scan.
    fn inode_size(&self) -> u16;

    /// Called before recovery writes anything, when the area holds complete fast commits
    /// (`scan.commits > 0`): an error refuses the recovery and leaves the device as it was.
    fn check(&mut self, area: &FastCommitArea, scan: &FcScan<'_>) -> Result<()>;

    /// Replays the valid records (`scan.records[..scan.records_valid]`) after the full commits
    /// are replayed and flushed, before the journal is marked clean.
    fn replay(&mut self, area: &FastCommitArea, scan: &FcScan<'_>) -> Result<FastCommitReport>;
}

/// The replay of a caller that cannot replay fast commits: recovery refuses any journal whose
/// area holds complete fast commits for the tid it would replay with at least one record that
/// changes the file system (anything but HEAD, PAD and TAIL), naming the record kinds, and
/// writes nothing. Fast commits of markers alone are "replayed" by doing nothing.
#[derive(Debug, Clone, Copy)]
pub struct RefuseFastCommits {
    /// `s_inode_size`, for an exact scan; `u16::MAX` when unknown, which accepts INODE records
    /// of any length and so refuses at least every journal the exact scan would replay from.
    pub inode_size: u16,
}

impl Default for RefuseFastCommits {
    fn default() -> Self {
        RefuseFastCommits { inode_size: u16::MAX }
    }
}

impl FastCommitReplay for RefuseFastCommits {
    fn inode_size(&self) -> u16 {
        self.inode_size
    }

    fn check(&mut self, area: &FastCommitArea, scan: &FcScan<'_>) -> Result<()> {
        assert!(scan.commits > 0 && scan.records_valid <= scan.records.len());
        let mut kinds: Vec<&str> = Vec::new();
        for record in &scan.records[..scan.records_valid] {
            let name = tag_name(record.tag());
            if !matches!(
                record,
                FcRecord::Head { .. } | FcRecord::Tail { .. } | FcRecord::Pad { .. }
            ) && !kinds.contains(&name)
            {
                kinds.push(name);
            }
        }
        if kinds.is_empty() {
            // Only HEAD, PAD and TAIL: complete fast commits that change nothing.
            return Ok(());
        }
        let named = match kinds.len() {
            1 => format!("record {} is", kinds[0]),
            _ => format!("records {} are", kinds.join(", ")),
        };
        Err(JournalError::Unsupported(format!(
            "fast-commit {named} not replayed yet: the journal's fast-commit area holds {} fast \
             commits ({} records) of tid {} that recovery must replay; nothing was changed \
             (e2fsck -fy replays them)",
            scan.commits, scan.records_valid, area.expected_tid
        )))
    }

    fn replay(&mut self, _area: &FastCommitArea, scan: &FcScan<'_>) -> Result<FastCommitReport> {
        let valid = &scan.records[..scan.records_valid];
        let markers_only = valid.iter().all(|r| {
            matches!(r, FcRecord::Head { .. } | FcRecord::Tail { .. } | FcRecord::Pad { .. })
        });
        assert!(markers_only, "check refuses every fast commit that changes something");
        Ok(FastCommitReport { commits: scan.commits, records: scan.records_valid })
    }
}
