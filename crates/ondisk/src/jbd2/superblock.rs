//! The journal superblock (`journal_superblock_t`), the first 1024 bytes of journal block 0.
//!
//! It says where the log lives (`s_first`..`log_end()`), where the oldest live transaction starts
//! (`s_start`, 0 when the journal is clean) and which tid it has (`s_sequence`), and which
//! features shape the log blocks. [`JournalSuperblock::format`] turns the latter into a
//! [`LogFormat`].
//!
//! The struct keeps the raw 1024 bytes it was parsed from, and [`JournalSuperblock::encode`]
//! writes the known fields over them, so `s_users`, the unused `h_sequence` of the header and any
//! field a later kernel defines in today's padding survive a read-modify-write.
//!
//! Validation follows `journal_check_superblock` / `journal_load_superblock` (Linux 6.x):
//!
//! | condition                                                  | error         |
//! |------------------------------------------------------------|---------------|
//! | shorter than 1024 bytes, no magic                          | `Corrupted`   |
//! | block type not 3/4: descriptor, commit or revoke type      | `Corrupted`   |
//! | block type not 3/4: anything else (a future format)        | `Unsupported` |
//! | block size not a power of two in 1024..=65536              | `Corrupted`   |
//! | (v2 sb) unknown incompat bit, any ro_compat bit            | `Unsupported` |
//! | (v2 sb) CSUM_V2 and CSUM_V3, or COMPAT_CHECKSUM with either | `Corrupted`  |
//! | (v2/v3) `s_checksum_type` 1..=3 / other than 4             | `Unsupported` / `Corrupted` |
//! | (v2/v3) `s_checksum` wrong                                 | `Corrupted`   |
//! | `s_maxlen < 1024`, or fewer than 1024 blocks left beside the fast-commit area | `Corrupted` |
//! | `s_first` 0 or not below `log_end()`, or `s_first + 1024 > s_maxlen + 1` | `Corrupted` |
//! | `s_start` not 0 and outside `[s_first, log_end())`          | `Corrupted`   |
//!
//! A v1 superblock (type 3) has no fields past `s_errno`; like the kernel we read its feature
//! words as 0, and `encode` leaves those bytes as they were.

use super::format::{ChecksumVersion, LogFormat};
use super::{
    feature, read_be32, write_be32, BlockType, JBD2_BLOCK_SIZE_MAX, JBD2_BLOCK_SIZE_MIN,
    JBD2_DEFAULT_FAST_COMMIT_BLOCKS, JBD2_MAGIC, JBD2_MIN_JOURNAL_BLOCKS, JBD2_SUPERBLOCK_SIZE,
};
use crate::crc::crc32c_raw;
use crate::{OnDiskError, Tid};
use std::fmt;

const WHAT: &str = "journal superblock";

/// `JBD2_CRC32C_CHKSUM`: the only `s_checksum_type` allowed with checksum v2/v3.
pub const JBD2_CRC32C_CHKSUM: u8 = 4;

// Field offsets (include/linux/jbd2.h).
const S_BLOCKTYPE: usize = 0x04;
const S_BLOCKSIZE: usize = 0x0C;
const S_MAXLEN: usize = 0x10;
const S_FIRST: usize = 0x14;
const S_SEQUENCE: usize = 0x18;
const S_START: usize = 0x1C;
const S_ERRNO: usize = 0x20;
const S_FEATURE_COMPAT: usize = 0x24;
const S_FEATURE_INCOMPAT: usize = 0x28;
const S_FEATURE_RO_COMPAT: usize = 0x2C;
const S_UUID: usize = 0x30;
const S_NR_USERS: usize = 0x40;
const S_CHECKSUM_TYPE: usize = 0x50;
const S_NUM_FC_BLKS: usize = 0x54;
const S_HEAD: usize = 0x58;
/// The first word of `s_padding`: quill's per-core area count, with INCOMPAT_QUILL_FC_AREAS.
const S_QUILL_FC_AREAS: usize = 0x5C;
/// Per-core fast-commit areas at most.
pub const FC_AREAS_MAX: u32 = 64;
const S_CHECKSUM: usize = 0xFC;

/// The journal superblock. Fields mirror `journal_superblock_t`; the private raw copy preserves
/// everything else. Two superblocks are equal when they encode to the same bytes.
#[derive(Clone)]
pub struct JournalSuperblock {
    /// 3 (v1) or 4 (v2).
    pub block_type: u32,
    pub block_size: u32,
    /// `s_maxlen`: journal length in blocks, fast-commit area included.
    pub max_len: u32,
    /// `s_first`: first log block.
    pub first: u32,
    /// `s_sequence`: tid of the oldest transaction in the log (or the next one, when clean).
    pub sequence: Tid,
    /// `s_start`: log block of that transaction; 0 means the journal is clean.
    pub start: u32,
    pub errno: i32,
    pub feature_compat: u32,
    pub feature_incompat: u32,
    pub feature_ro_compat: u32,
    pub uuid: [u8; 16],
    pub nr_users: u32,
    pub checksum_type: u8,
    /// `s_num_fc_blks`; 0 means the default of 256 when `INCOMPAT_FAST_COMMIT` is set.
    pub num_fc_blocks: u32,
    /// `s_head`: head of the log, meaningful only while the journal is clean (Linux 6.4+).
    pub head: u32,
    /// With [`feature::INCOMPAT_QUILL_FC_AREAS`]: how many equal per-core areas the fast-commit
    /// area is split into (2..=[`FC_AREAS_MAX`]); 0 without it (one standard area).
    pub fc_areas: u32,
    raw: Box<[u8; JBD2_SUPERBLOCK_SIZE]>,
}

impl JournalSuperblock {
    /// Parses and validates the first 1024 bytes of `bytes` (a whole journal block is fine).
    pub fn parse(bytes: &[u8]) -> Result<Self, OnDiskError> {
        let raw: [u8; JBD2_SUPERBLOCK_SIZE] =
            bytes.get(..JBD2_SUPERBLOCK_SIZE).and_then(|head| head.try_into().ok()).ok_or_else(
                || OnDiskError::corrupted(WHAT, format!("{} bytes, need 1024", bytes.len())),
            )?;
        let field = |offset: usize| read_be32(&raw, offset).unwrap_or(0);
        if field(0) != JBD2_MAGIC {
            return Err(OnDiskError::corrupted(WHAT, "no JBD2 magic number"));
        }
        let block_type = field(S_BLOCKTYPE);
        let is_v2 = match BlockType::from_u32(block_type) {
            Some(BlockType::SuperblockV2) => true,
            Some(BlockType::SuperblockV1) => false,
            Some(other) => {
                return Err(OnDiskError::corrupted(WHAT, format!("block type is {other:?}")))
            }
            None => {
                return Err(OnDiskError::unsupported(
                    WHAT,
                    format!("unknown superblock version {block_type}"),
                ))
            }
        };
        let v2_field = |offset: usize| if is_v2 { field(offset) } else { 0 };
        let mut uuid = [0u8; 16];
        if is_v2 {
            uuid.copy_from_slice(&raw[S_UUID..S_UUID + 16]);
        }
        let superblock = JournalSuperblock {
            block_type,
            block_size: field(S_BLOCKSIZE),
            max_len: field(S_MAXLEN),
            first: field(S_FIRST),
            sequence: Tid(field(S_SEQUENCE)),
            start: field(S_START),
            errno: field(S_ERRNO) as i32,
            feature_compat: v2_field(S_FEATURE_COMPAT),
            feature_incompat: v2_field(S_FEATURE_INCOMPAT),
            feature_ro_compat: v2_field(S_FEATURE_RO_COMPAT),
            uuid,
            nr_users: v2_field(S_NR_USERS),
            checksum_type: if is_v2 { raw[S_CHECKSUM_TYPE] } else { 0 },
            num_fc_blocks: v2_field(S_NUM_FC_BLKS),
            head: v2_field(S_HEAD),
            fc_areas: if v2_field(S_FEATURE_INCOMPAT) & feature::INCOMPAT_QUILL_FC_AREAS != 0 {
                field(S_QUILL_FC_AREAS)
            } else {
                0
            },
            raw: Box::new(raw),
        };
        superblock.validate_features()?;
        if superblock.checksum_version().has_block_checksums() {
            let stored = field(S_CHECKSUM);
            let computed = superblock_checksum(&superblock.raw[..]);
            if stored != computed {
                return Err(OnDiskError::corrupted(
                    WHAT,
                    format!("checksum {stored:#010x}, computed {computed:#010x}"),
                ));
            }
        }
        superblock.validate_geometry()?;
        Ok(superblock)
    }

    /// A fresh v2 superblock as mke2fs writes it for an internal journal: `first = 1`,
    /// `sequence = 1`, `start = 0` (clean), one user, crc32c checksum type with v2/v3.
    /// `num_fc_blocks` starts at 0 (the default 256 blocks when `INCOMPAT_FAST_COMMIT` is set);
    /// set it before encoding to size the fast-commit area. Panics on parameters the kernel
    /// would refuse (unknown or conflicting features, a bad block size, under 1024 blocks).
    pub fn new(
        block_size: u32,
        max_len: u32,
        uuid: [u8; 16],
        feature_compat: u32,
        feature_incompat: u32,
    ) -> Self {
        let has_block_checksums =
            feature_incompat & (feature::INCOMPAT_CSUM_V2 | feature::INCOMPAT_CSUM_V3) != 0;
        let superblock = JournalSuperblock {
            block_type: BlockType::SuperblockV2 as u32,
            block_size,
            max_len,
            first: 1,
            sequence: Tid(1),
            start: 0,
            errno: 0,
            feature_compat,
            feature_incompat,
            feature_ro_compat: 0,
            uuid,
            nr_users: 1,
            checksum_type: if has_block_checksums { JBD2_CRC32C_CHKSUM } else { 0 },
            num_fc_blocks: 0,
            head: 0,
            fc_areas: 0,
            raw: Box::new([0u8; JBD2_SUPERBLOCK_SIZE]),
        };
        // The fast-commit area is sized afterwards through `num_fc_blocks`, so only the rest of
        // the geometry can be checked here; `parse` checks all of it.
        if let Err(error) = superblock.validate_features().and(superblock.validate_geometry_with(0))
        {
            panic!("JournalSuperblock::new with invalid parameters: {error}");
        }
        superblock
    }

    /// The 1024 bytes to write at journal block 0: the raw copy with every field written over
    /// it and, with v2/v3, `s_checksum = crc32c(~0, superblock with s_checksum = 0)`.
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = self.raw.to_vec();
        write_be32(&mut bytes, 0, JBD2_MAGIC);
        write_be32(&mut bytes, S_BLOCKTYPE, self.block_type);
        write_be32(&mut bytes, S_BLOCKSIZE, self.block_size);
        write_be32(&mut bytes, S_MAXLEN, self.max_len);
        write_be32(&mut bytes, S_FIRST, self.first);
        write_be32(&mut bytes, S_SEQUENCE, self.sequence.0);
        write_be32(&mut bytes, S_START, self.start);
        write_be32(&mut bytes, S_ERRNO, self.errno as u32);
        if self.is_v2() {
            write_be32(&mut bytes, S_FEATURE_COMPAT, self.feature_compat);
            write_be32(&mut bytes, S_FEATURE_INCOMPAT, self.feature_incompat);
            write_be32(&mut bytes, S_FEATURE_RO_COMPAT, self.feature_ro_compat);
            bytes[S_UUID..S_UUID + 16].copy_from_slice(&self.uuid);
            write_be32(&mut bytes, S_NR_USERS, self.nr_users);
            bytes[S_CHECKSUM_TYPE] = self.checksum_type;
            write_be32(&mut bytes, S_NUM_FC_BLKS, self.num_fc_blocks);
            write_be32(&mut bytes, S_HEAD, self.head);
            // The padding word is quill's only with the flag; otherwise it stays as read
            // ([`JournalSuperblock::set_fc_areas`] zeroes it when the flag goes).
            if self.has_incompat(feature::INCOMPAT_QUILL_FC_AREAS) {
                write_be32(&mut bytes, S_QUILL_FC_AREAS, self.fc_areas);
            }
        }
        if self.checksum_version().has_block_checksums() {
            let checksum = superblock_checksum(&bytes);
            write_be32(&mut bytes, S_CHECKSUM, checksum);
        }
        bytes
    }

    /// v3 > v2 > compat v1 > none. A v1 superblock has no features.
    pub fn checksum_version(&self) -> ChecksumVersion {
        if self.has_incompat(feature::INCOMPAT_CSUM_V3) {
            ChecksumVersion::V3
        } else if self.has_incompat(feature::INCOMPAT_CSUM_V2) {
            ChecksumVersion::V2
        } else if self.is_v2() && self.feature_compat & feature::COMPAT_CHECKSUM != 0 {
            ChecksumVersion::V1
        } else {
            ChecksumVersion::None
        }
    }

    pub fn format(&self) -> LogFormat {
        LogFormat::new(
            self.block_size,
            self.checksum_version(),
            self.has_incompat(feature::INCOMPAT_64BIT),
            self.uuid,
        )
    }

    /// Size of the fast-commit area at the end of the journal (`jbd2_journal_get_num_fc_blks`):
    /// 0 without `INCOMPAT_FAST_COMMIT`. Linux clears that bit in the superblock it writes at a
    /// clean unmount and sets it again at mount from the ext4 feature, so a clean journal of a
    /// fast-commit file system reads 0 here until the bit is set again.
    pub fn fast_commit_blocks(&self) -> u32 {
        if self.has_incompat(feature::INCOMPAT_FAST_COMMIT) {
            self.configured_fast_commit_blocks()
        } else {
            0
        }
    }

    /// The size `s_num_fc_blks` gives the fast-commit area, [`JBD2_DEFAULT_FAST_COMMIT_BLOCKS`]
    /// when 0, whether or not `INCOMPAT_FAST_COMMIT` is set (never 0).
    pub fn configured_fast_commit_blocks(&self) -> u32 {
        if self.num_fc_blocks == 0 {
            JBD2_DEFAULT_FAST_COMMIT_BLOCKS
        } else {
            self.num_fc_blocks
        }
    }

    /// quill's per-core fast-commit areas: `Some(n)` sets INCOMPAT_QUILL_FC_AREAS and the count,
    /// `None` clears both and zeroes the padding word they use, so the journal is standard.
    pub fn set_fc_areas(&mut self, areas: Option<u32>) {
        match areas {
            Some(n) => {
                self.feature_incompat |= feature::INCOMPAT_QUILL_FC_AREAS;
                self.fc_areas = n;
            }
            None => {
                self.feature_incompat &= !feature::INCOMPAT_QUILL_FC_AREAS;
                self.fc_areas = 0;
            }
        }
        write_be32(&mut self.raw[..], S_QUILL_FC_AREAS, self.fc_areas);
    }

    /// The fast-commit area's parts, in journal blocks: one standard area, or with
    /// [`feature::INCOMPAT_QUILL_FC_AREAS`] `fc_areas` equal per-core areas (the last takes
    /// the remainder), each laid out as a standard area. Empty without fast commits.
    pub fn fast_commit_areas(&self) -> Vec<std::ops::Range<u32>> {
        let blocks = self.fast_commit_blocks();
        if blocks == 0 {
            return Vec::new();
        }
        let (first, end) = (self.log_end() + 1, self.max_len);
        fast_commit_parts(first, end, self.fc_areas.max(1))
    }

    /// `j_last`: the exclusive end of the log area, where the log wraps back to `first`. The
    /// fast-commit area (when enabled) is `[log_end() + 1, max_len)`; block `log_end()` itself is
    /// left unused, as in Linux and e2fsck.
    pub fn log_end(&self) -> u32 {
        self.max_len.saturating_sub(self.fast_commit_blocks())
    }

    /// `jbd2_has_feature_*` for an incompat bit: never true for a v1 superblock.
    pub fn has_incompat(&self, bit: u32) -> bool {
        self.is_v2() && self.feature_incompat & bit != 0
    }

    fn is_v2(&self) -> bool {
        self.block_type == BlockType::SuperblockV2 as u32
    }

    fn validate_features(&self) -> Result<(), OnDiskError> {
        if !self.block_size.is_power_of_two()
            || !(JBD2_BLOCK_SIZE_MIN..=JBD2_BLOCK_SIZE_MAX).contains(&self.block_size)
        {
            return Err(OnDiskError::corrupted(WHAT, format!("block size {}", self.block_size)));
        }
        if !self.is_v2() {
            return Ok(());
        }
        let known = feature::INCOMPAT_KNOWN | feature::INCOMPAT_QUILL_FC_AREAS;
        let unknown_incompat = self.feature_incompat & !known;
        if unknown_incompat != 0 {
            return Err(OnDiskError::unsupported(
                WHAT,
                format!("unknown incompat features {unknown_incompat:#x}"),
            ));
        }
        if self.feature_ro_compat & !feature::RO_COMPAT_KNOWN != 0 {
            return Err(OnDiskError::unsupported(
                WHAT,
                format!("unknown ro_compat features {:#x}", self.feature_ro_compat),
            ));
        }
        if self.has_incompat(feature::INCOMPAT_QUILL_FC_AREAS) {
            if !self.has_incompat(feature::INCOMPAT_FAST_COMMIT) {
                return Err(OnDiskError::corrupted(
                    WHAT,
                    "per-core fast-commit areas without fast_commit",
                ));
            }
            if !(2..=FC_AREAS_MAX).contains(&self.fc_areas) {
                return Err(OnDiskError::corrupted(
                    WHAT,
                    format!("{} per-core fast-commit areas", self.fc_areas),
                ));
            }
        }
        let v2 = self.feature_incompat & feature::INCOMPAT_CSUM_V2 != 0;
        let v3 = self.feature_incompat & feature::INCOMPAT_CSUM_V3 != 0;
        let v1 = self.feature_compat & feature::COMPAT_CHECKSUM != 0;
        if v2 && v3 {
            return Err(OnDiskError::corrupted(WHAT, "checksum v2 and v3 both set"));
        }
        if v1 && (v2 || v3) {
            return Err(OnDiskError::corrupted(WHAT, "checksum v1 and v2/v3 both set"));
        }
        if (v2 || v3) && self.checksum_type != JBD2_CRC32C_CHKSUM {
            let reason = format!("checksum type {} with checksum v2/v3", self.checksum_type);
            return Err(if (1..=3).contains(&self.checksum_type) {
                OnDiskError::unsupported(WHAT, reason)
            } else {
                OnDiskError::corrupted(WHAT, reason)
            });
        }
        Ok(())
    }

    fn validate_geometry(&self) -> Result<(), OnDiskError> {
        self.validate_geometry_with(self.fast_commit_blocks())
    }

    fn validate_geometry_with(&self, fast_commit_blocks: u32) -> Result<(), OnDiskError> {
        if self.max_len < JBD2_MIN_JOURNAL_BLOCKS
            || self.max_len - JBD2_MIN_JOURNAL_BLOCKS < fast_commit_blocks
        {
            return Err(OnDiskError::corrupted(
                WHAT,
                format!(
                    "journal of {} blocks with {fast_commit_blocks} fast-commit blocks is too short",
                    self.max_len
                ),
            ));
        }
        let log_end = self.max_len - fast_commit_blocks;
        let too_short_for_first = u64::from(self.first) + u64::from(JBD2_MIN_JOURNAL_BLOCKS)
            > u64::from(self.max_len) + 1;
        if self.first == 0 || self.first >= log_end || too_short_for_first {
            return Err(OnDiskError::corrupted(
                WHAT,
                format!("first log block {} with log end {log_end}", self.first),
            ));
        }
        if self.start != 0 && !(self.first..log_end).contains(&self.start) {
            return Err(OnDiskError::corrupted(
                WHAT,
                format!("log start {} outside [{}, {log_end})", self.start, self.first),
            ));
        }
        Ok(())
    }
}

impl PartialEq for JournalSuperblock {
    fn eq(&self, other: &Self) -> bool {
        self.encode() == other.encode()
    }
}

impl Eq for JournalSuperblock {}

impl fmt::Debug for JournalSuperblock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JournalSuperblock")
            .field("block_type", &self.block_type)
            .field("block_size", &self.block_size)
            .field("max_len", &self.max_len)
            .field("first", &self.first)
            .field("sequence", &self.sequence)
            .field("start", &self.start)
            .field("errno", &self.errno)
            .field("feature_compat", &format_args!("{:#x}", self.feature_compat))
            .field("feature_incompat", &format_args!("{:#x}", self.feature_incompat))
            .field("feature_ro_compat", &format_args!("{:#x}", self.feature_ro_compat))
            .field("uuid", &self.uuid)
            .field("nr_users", &self.nr_users)
            .field("checksum_type", &self.checksum_type)
            .field("num_fc_blocks", &self.num_fc_blocks)
            .field("head", &self.head)
            .finish_non_exhaustive()
    }
}

/// `jbd2_superblock_csum`: crc32c seeded with ~0 (not the UUID seed) over the 1024-byte
/// superblock with `s_checksum` read as zero.
fn superblock_checksum(bytes: &[u8]) -> u32 {
    let before = crc32c_raw(!0, &bytes[..S_CHECKSUM]);
    let zeroed = crc32c_raw(before, &[0u8; 4]);
    crc32c_raw(zeroed, &bytes[S_CHECKSUM + 4..JBD2_SUPERBLOCK_SIZE])
}

/// `[first, end)` split into `parts` equal ranges, the last taking the remainder.
pub fn fast_commit_parts(first: u32, end: u32, parts: u32) -> Vec<std::ops::Range<u32>> {
    let each = (end - first) / parts;
    (0..parts)
        .map(|k| {
            let start = first + k * each;
            start..if k + 1 == parts { end } else { start + each }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{XorShift, UUID};
    use super::*;

    const V3_64: u32 = feature::INCOMPAT_CSUM_V3 | feature::INCOMPAT_64BIT;

    fn assert_corrupted(result: Result<JournalSuperblock, OnDiskError>) {
        assert!(matches!(result, Err(OnDiskError::Corrupted { .. })), "{result:?}");
    }

    fn assert_unsupported(result: Result<JournalSuperblock, OnDiskError>) {
        assert!(matches!(result, Err(OnDiskError::Unsupported { .. })), "{result:?}");
    }

    #[test]
    fn superblock_round_trips_for_every_checksum_scheme() {
        let cases = [
            (0, 0, ChecksumVersion::None),
            (feature::COMPAT_CHECKSUM, feature::INCOMPAT_64BIT, ChecksumVersion::V1),
            (0, feature::INCOMPAT_CSUM_V2 | feature::INCOMPAT_REVOKE, ChecksumVersion::V2),
            (0, V3_64 | feature::INCOMPAT_FAST_COMMIT, ChecksumVersion::V3),
        ];
        for (compat, incompat, checksum) in cases {
            let mut superblock = JournalSuperblock::new(4096, 8192, UUID, compat, incompat);
            superblock.sequence = Tid(0xFFFF_FFFE);
            superblock.start = 17;
            superblock.errno = -5;
            let bytes = superblock.encode();
            assert_eq!(bytes.len(), JBD2_SUPERBLOCK_SIZE);
            let parsed = JournalSuperblock::parse(&bytes).unwrap();
            assert_eq!(parsed, superblock);
            assert_eq!(parsed.checksum_version(), checksum);
            assert_eq!(parsed.encode(), bytes);
            let format = parsed.format();
            assert_eq!(format, LogFormat::new(4096, checksum, incompat & 2 != 0, UUID));
        }
    }

    #[test]
    fn new_superblock_matches_mke2fs_defaults() {
        let superblock = JournalSuperblock::new(1024, 4096, UUID, 0, V3_64);
        assert_eq!(superblock.block_type, 4);
        assert_eq!((superblock.first, superblock.sequence, superblock.start), (1, Tid(1), 0));
        assert_eq!((superblock.nr_users, superblock.checksum_type), (1, 4));
        let bytes = superblock.encode();
        assert_eq!(read_be32(&bytes, S_NR_USERS), Some(1));
        assert_eq!(read_be32(&bytes, 8), Some(0), "header h_sequence stays 0");
        assert_eq!(read_be32(&bytes, S_CHECKSUM), Some(superblock_checksum(&bytes)));
        let plain = JournalSuperblock::new(1024, 4096, UUID, 0, 0);
        assert_eq!(plain.checksum_type, 0);
        assert_eq!(read_be32(&plain.encode(), S_CHECKSUM), Some(0));
    }

    #[test]
    fn encode_preserves_users_and_unknown_fields() {
        let mut bytes = JournalSuperblock::new(4096, 2048, UUID, 0, V3_64).encode();
        bytes[8] = 0x77; // header h_sequence, unused in a superblock
        bytes[0x60] = 0x99; // padding a later kernel might define
        for (index, byte) in bytes[0x100..].iter_mut().enumerate() {
            *byte = index as u8;
        }
        let checksum = superblock_checksum(&bytes);
        write_be32(&mut bytes, S_CHECKSUM, checksum);
        let mut superblock = JournalSuperblock::parse(&bytes).unwrap();
        assert_eq!(superblock.encode(), bytes);
        superblock.start = 1;
        let changed = superblock.encode();
        assert_eq!(&changed[0x100..], &bytes[0x100..]);
        assert_eq!((changed[8], changed[0x60]), (0x77, 0x99));
        assert_eq!(JournalSuperblock::parse(&changed).unwrap().start, 1);
    }

    #[test]
    fn superblock_checksum_corruption_is_detected() {
        let bytes = JournalSuperblock::new(4096, 2048, UUID, 0, V3_64).encode();
        for offset in [S_BLOCKSIZE + 3, S_SEQUENCE, S_UUID + 15, S_CHECKSUM, 0x3FF] {
            let mut damaged = bytes.clone();
            damaged[offset] ^= 0x20;
            assert_corrupted(JournalSuperblock::parse(&damaged));
        }
        // Without v2/v3 there is no checksum to catch it: the flip in s_users goes unnoticed.
        let mut plain = JournalSuperblock::new(4096, 2048, UUID, 0, 0).encode();
        plain[0x3FF] ^= 0x20;
        assert!(JournalSuperblock::parse(&plain).is_ok());
    }

    #[test]
    fn superblock_geometry_with_fast_commit() {
        let fc = feature::INCOMPAT_FAST_COMMIT;
        let mut superblock = JournalSuperblock::new(4096, 4096 + 256, UUID, 0, fc);
        assert_eq!(superblock.num_fc_blocks, 0);
        assert_eq!(superblock.fast_commit_blocks(), 256);
        assert_eq!(superblock.log_end(), 4096);
        superblock.num_fc_blocks = 64;
        assert_eq!(superblock.fast_commit_blocks(), 64);
        assert_eq!(superblock.log_end(), 4096 + 256 - 64);
        let parsed = JournalSuperblock::parse(&superblock.encode()).unwrap();
        assert_eq!(parsed.log_end(), 4096 + 192);
        superblock.feature_incompat &= !fc;
        assert_eq!(superblock.fast_commit_blocks(), 0);
        assert_eq!(superblock.log_end(), 4096 + 256);
        // The kernel wants 1024 log blocks beside the fast-commit area.
        superblock.feature_incompat |= fc;
        superblock.num_fc_blocks = 4096 + 256 - 1023;
        assert_corrupted(JournalSuperblock::parse(&superblock.encode()));
        superblock.num_fc_blocks = 4096 + 256 - 1024;
        assert_eq!(JournalSuperblock::parse(&superblock.encode()).unwrap().log_end(), 1024);
        // A small fast-commit area is sized after `new`, which must not insist on the default.
        let mut small = JournalSuperblock::new(1024, 1024 + 64, UUID, 0, fc);
        small.num_fc_blocks = 64;
        let parsed = JournalSuperblock::parse(&small.encode()).unwrap();
        assert_eq!((parsed.fast_commit_blocks(), parsed.log_end()), (64, 1024));
    }

    #[test]
    fn inconsistent_features_are_rejected() {
        let base = JournalSuperblock::new(1024, 2048, UUID, 0, V3_64);
        let with = |edit: &dyn Fn(&mut JournalSuperblock)| {
            let mut superblock = base.clone();
            edit(&mut superblock);
            JournalSuperblock::parse(&superblock.encode())
        };
        assert_corrupted(with(&|s| s.feature_incompat |= feature::INCOMPAT_CSUM_V2));
        assert_corrupted(with(&|s| s.feature_compat |= feature::COMPAT_CHECKSUM));
        assert_unsupported(with(&|s| s.feature_incompat |= 0x40));
        assert_unsupported(with(&|s| s.feature_ro_compat = 1));
        assert_unsupported(with(&|s| s.checksum_type = 1));
        assert_corrupted(with(&|s| s.checksum_type = 9));
        // Unknown compat bits are fine.
        assert!(with(&|s| s.feature_compat |= 0x80).is_ok());
    }

    #[test]
    fn bad_geometry_is_rejected() {
        let base = JournalSuperblock::new(1024, 2048, UUID, 0, 0);
        let with = |edit: &dyn Fn(&mut JournalSuperblock)| {
            let mut superblock = base.clone();
            edit(&mut superblock);
            JournalSuperblock::parse(&superblock.encode())
        };
        assert_corrupted(with(&|s| s.block_size = 512));
        assert_corrupted(with(&|s| s.block_size = 3072));
        assert_corrupted(with(&|s| s.block_size = 131072));
        assert_corrupted(with(&|s| s.max_len = 1023));
        assert_corrupted(with(&|s| s.first = 0));
        assert_corrupted(with(&|s| s.first = 1026));
        assert_corrupted(with(&|s| s.start = 2048));
        assert!(with(&|s| s.start = 2047).is_ok());
        assert!(with(&|s| s.first = 1025).is_ok());
    }

    #[test]
    fn non_superblock_types_are_rejected() {
        let mut bytes = JournalSuperblock::new(1024, 2048, UUID, 0, 0).encode();
        write_be32(&mut bytes, S_BLOCKTYPE, BlockType::Commit as u32);
        assert_corrupted(JournalSuperblock::parse(&bytes));
        write_be32(&mut bytes, S_BLOCKTYPE, 9);
        assert_unsupported(JournalSuperblock::parse(&bytes));
        assert_corrupted(JournalSuperblock::parse(&bytes[..1000]));
        bytes[1] = 0;
        assert_corrupted(JournalSuperblock::parse(&bytes));
    }

    #[test]
    fn v1_superblock_has_no_features() {
        let mut bytes = JournalSuperblock::new(1024, 2048, UUID, 0, 0).encode();
        write_be32(&mut bytes, S_BLOCKTYPE, BlockType::SuperblockV1 as u32);
        write_be32(&mut bytes, S_FEATURE_INCOMPAT, 0xFFFF_FFFF);
        let superblock = JournalSuperblock::parse(&bytes).unwrap();
        assert_eq!(superblock.feature_incompat, 0);
        assert_eq!(superblock.checksum_version(), ChecksumVersion::None);
        assert!(!superblock.has_incompat(feature::INCOMPAT_64BIT));
        assert_eq!(superblock.encode(), bytes, "v2-only bytes are left alone");
    }

    /// quill's per-core fast-commit areas: the count lives in the first padding word only
    /// while INCOMPAT_QUILL_FC_AREAS is set; the areas split the fast-commit area evenly.
    #[test]
    fn per_core_fast_commit_areas_round_trip_and_are_checked() {
        let fc = feature::INCOMPAT_FAST_COMMIT;
        let quill = feature::INCOMPAT_QUILL_FC_AREAS;
        let mut sb = JournalSuperblock::new(4096, 4096, UUID, 0, V3_64 | fc);
        sb.num_fc_blocks = 64;
        sb.feature_incompat |= quill;
        sb.fc_areas = 3;
        let parsed = JournalSuperblock::parse(&sb.encode()).unwrap();
        assert_eq!(parsed.fc_areas, 3);
        let areas = parsed.fast_commit_areas();
        assert_eq!(areas, vec![4033..4054, 4054..4075, 4075..4096]);
        // Cleared: the padding word is written back as zero and reads as no areas.
        let mut clear = parsed.clone();
        clear.set_fc_areas(None);
        let bytes = clear.encode();
        assert_eq!(read_be32(&bytes, S_QUILL_FC_AREAS), Some(0));
        let clear = JournalSuperblock::parse(&bytes).unwrap();
        assert_eq!(clear.fc_areas, 0);
        let areas = clear.fast_commit_areas();
        assert_eq!((areas.len(), areas[0].start, areas[0].end), (1, 4033, 4096));
        for (areas, incompat) in
            [(1, V3_64 | fc | quill), (65, V3_64 | fc | quill), (2, V3_64 | quill)]
        {
            let mut bad = sb.clone();
            bad.fc_areas = areas;
            bad.feature_incompat = incompat;
            assert_corrupted(JournalSuperblock::parse(&bad.encode()));
        }
    }

    #[test]
    #[should_panic(expected = "invalid parameters")]
    fn new_refuses_a_journal_the_kernel_would_reject() {
        JournalSuperblock::new(4096, 512, UUID, 0, 0);
    }

    #[test]
    fn garbage_superblocks_never_panic() {
        let seed = 0x5B5B_0001_u64;
        println!("garbage_superblocks_never_panic seed={seed:#x}");
        let mut rng = XorShift::new(seed);
        let valid =
            JournalSuperblock::new(4096, 4096, UUID, 0, V3_64 | feature::INCOMPAT_FAST_COMMIT)
                .encode();
        let mut accepted = 0;
        for _ in 0..4000 {
            let mut bytes = if rng.below(3) == 0 {
                let mut random = vec![0u8; rng.below(1100)];
                rng.fill(&mut random);
                random
            } else {
                valid.clone()
            };
            for _ in 0..rng.below(4) {
                if bytes.len() > 0x60 {
                    let offset = rng.below(0x60);
                    bytes[offset] = rng.next_u64() as u8;
                }
            }
            if bytes.len() >= JBD2_SUPERBLOCK_SIZE && rng.below(2) == 0 {
                let checksum = superblock_checksum(&bytes);
                write_be32(&mut bytes, S_CHECKSUM, checksum);
            }
            if let Ok(superblock) = JournalSuperblock::parse(&bytes) {
                accepted += 1;
                assert!(superblock.first < superblock.log_end());
                let _ = superblock.format().tags_per_descriptor();
                let again = JournalSuperblock::parse(&superblock.encode()).unwrap();
                assert_eq!(again, superblock);
            }
        }
        assert!(accepted > 0, "mutations should leave some superblocks valid");
    }
}
