//! Journal settings and presets (DESIGN.md §3.4).
//!
//! Every technique is a setting so it can be measured alone and together. A preset is a named
//! set of settings; `classic` reproduces Linux JBD2 and is the baseline of every comparison.
//! Settings of techniques that later issues implement (lock-free lists, fsync journals) are
//! added with them, not before.

use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct JournalConfig {
    /// Transactions allowed between Locked and Durable at once. 1 is JBD2 (one committing
    /// transaction; the commit thread also makes it durable). 2 or more runs a separate flush
    /// stage so the next transaction commits while earlier ones are being flushed (CJFS
    /// dual-thread journaling).
    pub committing_max: usize,
    /// Transactions whose commit blocks share one device flush (CJFS compound flush). 1 is JBD2:
    /// every transaction gets its own flush + FUA commit block.
    pub flush_batch_max: usize,
    /// Frozen versions of one buffer that in-flight transactions may hold at once (CJFS
    /// multi-version shadow paging). 1 is JBD2: one frozen copy, and a handle that modifies a
    /// buffer whose frozen copy is being written to the log waits for that write.
    pub versions_max: usize,
    /// CJFS opportunistic coalescing: a transaction whose buffers conflict with in-flight
    /// versions stays Running (absorbing handles) instead of locking and blocking new handles.
    pub coalescing: bool,
    /// Threads that replay the log during recovery. 1 is JBD2's single-threaded replay.
    pub recovery_threads: usize,
    /// A running transaction older than this is committed even without an fsync (JBD2's
    /// commit interval, 5 s by default).
    pub commit_interval: Duration,
    /// How a transaction's buffer, ordered-data and conflict lists are guarded: JBD2's
    /// `j_list_lock`, or lock-free lists (FAST'18 S1).
    pub lists: Lists,
    /// Who writes a committing transaction's log blocks (FAST'18 cooperative commit I/O).
    pub commit_io: CommitIo,
    /// Who writes durable transactions home when the log needs space (FAST'18 cooperative
    /// checkpoint, with KIPS'18's sorted batches).
    pub checkpoint_io: CheckpointIo,
    /// How a commit block becomes durable once its transaction's log blocks are (`flush.rs`).
    pub commit_record: CommitRecord,
    /// iJournaling (ATC'17): an fsync whose file's changes all sit in the running transaction
    /// writes them as a file-level transaction of ext4 fast-commit records instead of
    /// committing it (`fc_commit.rs`). Needs a journal with a fast-commit area (an ext4 file
    /// system with the fast_commit feature).
    pub fsync_journal: bool,
    /// iJournaling's per-core areas: the fast-commit area split into this many areas, each
    /// with its own lock, written in parallel (`fc_commit.rs`). 1 keeps the one standard area
    /// that e2fsck and the kernel replay; more is quill's own encoding, flagged
    /// INCOMPAT_QUILL_FC_AREAS while it holds fast commits (stock tools then refuse the
    /// journal, and `quill recover` replays it).
    pub fc_areas: usize,
}

/// `commit_record`: how the flush stage makes a commit block durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CommitRecord {
    /// JBD2's PREFLUSH+FUA: flush the log blocks, then write the commit block with FUA (each
    /// commit block of a compound-flush group in turn).
    Fua,
    /// The commit block is a plain write that the next flush makes durable, together with the
    /// log blocks of the transactions written meanwhile: one flush per transaction instead of
    /// a flush and a FUA write (what BarrierFS's ordered commit block gets from its barrier).
    /// Needs a flush stage (`committing_max` of 2 or more); one commit block per flush.
    Chained,
    /// BarrierFS's and CJFS's ordered commit block: each commit block of a compound-flush group
    /// is an order-preserving write issued after its log blocks, then one flush makes the whole
    /// group durable. Needs a device with a cache barrier (the simulated SSD, as the CJFS paper
    /// assumes of its SSD); a file image has none, and the journal refuses to open.
    Barrier,
}

impl CommitRecord {
    pub fn name(self) -> &'static str {
        match self {
            CommitRecord::Fua => "fua",
            CommitRecord::Chained => "chained",
            CommitRecord::Barrier => "barrier",
        }
    }
}

/// The `lists` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Lists {
    /// One `j_list_lock` per journal guards every transaction's lists (JBD2).
    Locked,
    /// Insert with a CAS, removal marked and unlinked once the transaction is gone (FAST'18).
    LockFree,
}

/// `commit_io`: who writes a committing transaction's log blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CommitIo {
    /// JBD2: the commit thread alone writes them; everybody else sleeps until it is done.
    Thread,
    /// FAST'18: the log blocks are published as chunks that the commit thread, handles waiting
    /// to start and fsync callers waiting for the transaction claim and write together
    /// (`commit_io.rs`).
    Cooperative,
}

/// `checkpoint_io`: who writes durable transactions home.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckpointIo {
    /// JBD2: one thread at a time under the checkpoint mutex; the others queue on it.
    Mutex,
    /// FAST'18 + KIPS'18: every thread that needs log space joins the running checkpoint and
    /// writes batches of its block-sorted home writes; one flush per checkpoint round.
    Cooperative,
}

impl CommitIo {
    pub fn name(self) -> &'static str {
        match self {
            CommitIo::Thread => "thread",
            CommitIo::Cooperative => "cooperative",
        }
    }
}

impl CheckpointIo {
    pub fn name(self) -> &'static str {
        match self {
            CheckpointIo::Mutex => "mutex",
            CheckpointIo::Cooperative => "cooperative",
        }
    }
}

/// Names accepted by [`JournalConfig::preset`].
pub const PRESETS: &[&str] =
    &["classic", "dual", "barrierfs", "cjfs", "fast18-io", "fast18", "ijournal", "all"];

/// Replay threads of the FAST'18 presets (S4 parallel recovery).
const FAST18_RECOVERY_THREADS: usize = 4;

impl JournalConfig {
    /// Linux JBD2: one running and at most one committing transaction, one frozen copy per
    /// buffer, one flush + FUA commit per transaction, single-threaded recovery.
    pub fn classic() -> Self {
        JournalConfig {
            committing_max: 1,
            flush_batch_max: 1,
            versions_max: 1,
            coalescing: false,
            recovery_threads: 1,
            commit_interval: Duration::from_secs(5),
            lists: Lists::Locked,
            commit_io: CommitIo::Thread,
            checkpoint_io: CheckpointIo::Mutex,
            commit_record: CommitRecord::Fua,
            fsync_journal: false,
            fc_areas: 1,
        }
    }

    /// Whether transactions keep lock-free lists.
    pub fn lock_free_lists(&self) -> bool {
        self.lists == Lists::LockFree
    }

    /// Dual-thread journaling alone (BarrierFS-style commit/flush split, one version).
    pub fn dual() -> Self {
        JournalConfig { committing_max: 2, ..Self::classic() }
    }

    /// BarrierFS as the CJFS paper measures it: dual-thread journaling with as many
    /// transactions in flight as `cjfs` and its commit record ordered behind the next flush
    /// (chained, BarrierFS's barrier write), but one frozen version per buffer (a conflict
    /// waits for the older transaction's flush) and no coalescing. The first step of the
    /// ablation classic → barrierfs → +versions → +coalescing (= `cjfs`).
    pub fn barrierfs() -> Self {
        JournalConfig {
            committing_max: Self::cjfs().committing_max,
            versions_max: 1,
            flush_batch_max: 1,
            coalescing: false,
            ..Self::cjfs()
        }
    }

    /// All CJFS techniques, tuned on this project's measurements (varmail-shared, 4-32 threads,
    /// README "Journal presets"): three transactions in flight and three versions per buffer
    /// (the commit and flush stages need two in flight to overlap, a third absorbed bursts;
    /// five measured no better and left transactions queued for the flush stage), coalescing,
    /// and chained commit blocks (BarrierFS's ordered commit record without a barrier: one
    /// flush per transaction, which beat a compound flush of up to five transactions followed
    /// by their FUA commit blocks at every thread count), plus parallel recovery.
    /// `flush_batch_max` matters only with `commit_record = fua` or `barrier` (the paper's
    /// compound flush).
    pub fn cjfs() -> Self {
        JournalConfig {
            committing_max: 3,
            flush_batch_max: 3,
            versions_max: 3,
            coalescing: true,
            recovery_threads: 2,
            commit_interval: Duration::from_secs(5),
            lists: Lists::Locked,
            commit_io: CommitIo::Thread,
            checkpoint_io: CheckpointIo::Mutex,
            commit_record: CommitRecord::Chained,
            fsync_journal: false,
            fc_areas: 1,
        }
    }

    /// FAST'18's P-EXT4: JBD2's lists, with cooperative commit and checkpoint I/O and
    /// parallel recovery.
    pub fn fast18_io() -> Self {
        JournalConfig {
            commit_io: CommitIo::Cooperative,
            checkpoint_io: CheckpointIo::Cooperative,
            recovery_threads: FAST18_RECOVERY_THREADS,
            ..Self::classic()
        }
    }

    /// FAST'18's O-EXT4: P-EXT4 plus lock-free lists.
    pub fn fast18() -> Self {
        JournalConfig { lists: Lists::LockFree, ..Self::fast18_io() }
    }

    /// iJournaling (ATC'17): JBD2 with file-level fsync transactions written as ext4 fast
    /// commits where a file's changes allow (on a file system with the fast_commit feature).
    pub fn ijournal() -> Self {
        JournalConfig { fsync_journal: true, ..Self::classic() }
    }

    /// Every technique of every paper built so far: CJFS's four, FAST'18's four and
    /// iJournaling's file-level fsync.
    pub fn all() -> Self {
        JournalConfig {
            fsync_journal: true,
            lists: Lists::LockFree,
            commit_io: CommitIo::Cooperative,
            checkpoint_io: CheckpointIo::Cooperative,
            recovery_threads: FAST18_RECOVERY_THREADS,
            ..Self::cjfs()
        }
    }

    /// A preset with settings on top, comma-separated: `cjfs,commit_record=barrier`.
    pub fn from_spec(spec: &str) -> Result<Self, String> {
        let mut parts = spec.split(',');
        let preset = parts.next().unwrap_or_default();
        let mut config =
            Self::preset(preset).ok_or_else(|| format!("unknown journal preset {preset}"))?;
        for setting in parts {
            let (name, value) = setting
                .split_once('=')
                .ok_or_else(|| format!("{spec}: {setting} is not NAME=VALUE"))?;
            config.set(name, value).map_err(|e| format!("{spec}: {e}"))?;
        }
        Ok(config)
    }

    pub fn preset(name: &str) -> Option<Self> {
        match name {
            "classic" => Some(Self::classic()),
            "dual" => Some(Self::dual()),
            "barrierfs" => Some(Self::barrierfs()),
            "cjfs" => Some(Self::cjfs()),
            "fast18-io" => Some(Self::fast18_io()),
            "fast18" => Some(Self::fast18()),
            "ijournal" => Some(Self::ijournal()),
            "all" => Some(Self::all()),
            _ => None,
        }
    }

    /// Checks the settings are usable; every `*_max` must be at least 1.
    pub fn validate(&self) -> Result<(), String> {
        for (name, value) in [
            ("committing_max", self.committing_max),
            ("flush_batch_max", self.flush_batch_max),
            ("versions_max", self.versions_max),
            ("recovery_threads", self.recovery_threads),
            ("fc_areas", self.fc_areas),
        ] {
            if value == 0 || value > 64 {
                return Err(format!("{name} = {value}, expected 1..=64"));
            }
        }
        if self.commit_record == CommitRecord::Chained && self.committing_max < 2 {
            return Err("commit_record = chained needs committing_max of 2 or more (a flush \
                        stage to chain commit blocks through)"
                .into());
        }
        Ok(())
    }

    /// Applies one `name=value` setting (for the CLI and benchmarks).
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), String> {
        let number = || value.parse::<usize>().map_err(|e| format!("{name}={value}: {e}"));
        match name {
            "committing_max" => self.committing_max = number()?,
            "flush_batch_max" => self.flush_batch_max = number()?,
            "versions_max" => self.versions_max = number()?,
            "recovery_threads" => self.recovery_threads = number()?,
            "fc_areas" => self.fc_areas = number()?,
            "coalescing" => self.coalescing = on_off(name, value)?,
            "fsync_journal" => self.fsync_journal = on_off(name, value)?,
            "lists" => {
                self.lists = match value {
                    "locked" => Lists::Locked,
                    "lockfree" => Lists::LockFree,
                    _ => return Err(format!("lists={value}: expected locked or lockfree")),
                }
            }
            "commit_io" => {
                self.commit_io = match value {
                    "thread" => CommitIo::Thread,
                    "cooperative" => CommitIo::Cooperative,
                    _ => return Err(format!("commit_io={value}: expected thread or cooperative")),
                }
            }
            "checkpoint_io" => {
                self.checkpoint_io = match value {
                    "mutex" => CheckpointIo::Mutex,
                    "cooperative" => CheckpointIo::Cooperative,
                    _ => {
                        return Err(format!("checkpoint_io={value}: expected mutex or cooperative"))
                    }
                }
            }
            "commit_record" => {
                self.commit_record = match value {
                    "fua" => CommitRecord::Fua,
                    "chained" => CommitRecord::Chained,
                    "barrier" => CommitRecord::Barrier,
                    _ => {
                        return Err(format!(
                            "commit_record={value}: expected fua, chained or barrier"
                        ))
                    }
                }
            }
            "commit_interval_ms" => {
                self.commit_interval = Duration::from_millis(number()? as u64);
            }
            _ => return Err(format!("unknown journal setting {name}")),
        }
        self.validate()
    }
}

/// A switch's value: on/true/1 or off/false/0.
pub fn on_off(name: &str, value: &str) -> Result<bool, String> {
    match value {
        "on" | "true" | "1" => Ok(true),
        "off" | "false" | "0" => Ok(false),
        _ => Err(format!("{name}={value}: expected on or off")),
    }
}

impl Default for JournalConfig {
    fn default() -> Self {
        Self::classic()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_is_valid_and_classic_is_jbd2() {
        for name in PRESETS {
            JournalConfig::preset(name).unwrap().validate().unwrap();
        }
        let classic = JournalConfig::classic();
        assert_eq!(
            (classic.committing_max, classic.flush_batch_max, classic.versions_max),
            (1, 1, 1)
        );
        assert!(!classic.coalescing);
        assert_eq!(
            (classic.commit_io, classic.checkpoint_io),
            (CommitIo::Thread, CheckpointIo::Mutex)
        );
    }

    #[test]
    fn settings_parse_and_reject_zero() {
        let mut config = JournalConfig::classic();
        config.set("committing_max", "3").unwrap();
        config.set("coalescing", "on").unwrap();
        assert_eq!(config.committing_max, 3);
        assert!(config.coalescing);
        assert!(config.set("versions_max", "0").is_err());
        assert!(config.set("nonsense", "1").is_err());
    }

    #[test]
    fn cooperative_io_settings_parse_and_reject_unknown_values() {
        let mut config = JournalConfig::classic();
        config.set("commit_io", "cooperative").unwrap();
        config.set("checkpoint_io", "cooperative").unwrap();
        assert_eq!(config.commit_io, CommitIo::Cooperative);
        assert_eq!(config.checkpoint_io, CheckpointIo::Cooperative);
        config.set("commit_io", "thread").unwrap();
        config.set("checkpoint_io", "mutex").unwrap();
        assert_eq!(config, JournalConfig::classic());
        assert!(config.set("commit_io", "helpers").is_err());
        assert!(config.set("checkpoint_io", "on").is_err());
    }

    #[test]
    fn a_chained_commit_record_needs_a_flush_stage() {
        let mut config = JournalConfig::classic();
        assert!(config.set("commit_record", "chained").is_err(), "one committing transaction");
        let mut config = JournalConfig::dual();
        config.set("commit_record", "chained").unwrap();
        assert_eq!(config.commit_record, CommitRecord::Chained);
        assert!(config.set("commit_record", "ordered").is_err());
        // A barrier needs no flush stage: the commit block is ordered by the device.
        let mut config = JournalConfig::classic();
        config.set("commit_record", "barrier").unwrap();
        assert_eq!(config.commit_record, CommitRecord::Barrier);
    }
}
