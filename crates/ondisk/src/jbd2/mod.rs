//! The JBD2 on-disk format: the journal superblock and the four kinds of log block (descriptor,
//! data, revoke, commit), parsed from and encoded to bytes exactly as Linux `fs/jbd2` and
//! e2fsprogs lay them out.
//!
//! Every JBD2 field is big-endian and is read and written explicitly, never through a host-order
//! cast. Parsers take untrusted disk bytes: they check lengths before every read and report
//! [`OnDiskError::Corrupted`](crate::OnDiskError) or `Unsupported` instead of panicking. Encoders
//! take our own data and `assert!` their preconditions (a block of the wrong size, a 64-bit block
//! number in a 32-bit journal), because those are bugs in the caller, not bad disks.
//!
//! Everything that depends on the journal's features (tag size, tail checksums, record size) is
//! derived from one [`LogFormat`], which comes from the superblock, so a writer and a reader
//! configured from the same superblock cannot disagree.
//!
//! | module       | kernel source                              | what                               |
//! |--------------|--------------------------------------------|------------------------------------|
//! | `superblock` | `journal.c` (`journal_check_superblock`)   | block 0 of the journal             |
//! | `format`     | `journal.c` (`journal_tag_bytes`)          | geometry and checksums of log blocks |
//! | `descriptor` | `commit.c`, `recovery.c` (`count_tags`)    | descriptor tags and escaping       |
//! | `revoke`     | `revoke.c`, `recovery.c` (`scan_revoke_records`) | revoke records               |
//! | `commit`     | `commit.c`, `recovery.c`                   | commit block and its checksums     |
//! | `fast_commit`| ext4 `fast_commit.[ch]`                    | fast-commit area records (little-endian) |

mod commit;
mod descriptor;
pub mod fast_commit;
mod format;
mod revoke;
mod superblock;

pub use commit::{
    encode_commit_block, parse_commit_block, v1_crc_update, verify_commit_checksum,
    verify_commit_checksum_partial, CommitBlock, COMMIT_HEADER_SIZE, JBD2_CRC32_CHKSUM,
    JBD2_CRC32_CHKSUM_SIZE,
};
pub use descriptor::{
    escape_block, parse_descriptor_tags, tag_checksum_matches, tag_flag, unescape_block,
    DescriptorBuilder, DescriptorTag,
};
pub use format::{verify_block_tail, ChecksumVersion, LogFormat};
pub use revoke::{encode_revoke_blocks, parse_revoke_block, REVOKE_HEADER_SIZE};
pub use superblock::{fast_commit_parts, JournalSuperblock, FC_AREAS_MAX, JBD2_CRC32C_CHKSUM};

use crate::Tid;

/// `JBD2_MAGIC_NUMBER`: the first word of every journal metadata block.
pub const JBD2_MAGIC: u32 = 0xC03B_3998;
/// Size of `journal_superblock_t`; the rest of journal block 0 is unused.
pub const JBD2_SUPERBLOCK_SIZE: usize = 1024;
/// Size of `journal_header_t`, the header every journal metadata block starts with.
pub const JBD2_HEADER_SIZE: usize = 12;
/// `JBD2_MIN_JOURNAL_BLOCKS`: the kernel refuses journals with fewer log blocks than this.
pub const JBD2_MIN_JOURNAL_BLOCKS: u32 = 1024;
/// `JBD2_DEFAULT_FAST_COMMIT_BLOCKS`: fast-commit area size when `s_num_fc_blks` is 0.
pub const JBD2_DEFAULT_FAST_COMMIT_BLOCKS: u32 = 256;
/// Smallest and largest journal block sizes the kernel supports.
pub const JBD2_BLOCK_SIZE_MIN: u32 = 1024;
pub const JBD2_BLOCK_SIZE_MAX: u32 = 65536;

/// `h_blocktype` values.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockType {
    Descriptor = 1,
    Commit = 2,
    SuperblockV1 = 3,
    SuperblockV2 = 4,
    Revoke = 5,
}

impl BlockType {
    /// The block type for a raw `h_blocktype`, or `None` for a value the kernel does not define.
    pub fn from_u32(raw: u32) -> Option<BlockType> {
        match raw {
            1 => Some(BlockType::Descriptor),
            2 => Some(BlockType::Commit),
            3 => Some(BlockType::SuperblockV1),
            4 => Some(BlockType::SuperblockV2),
            5 => Some(BlockType::Revoke),
            _ => None,
        }
    }
}

/// `journal_header_t` with the magic already checked. `block_type` stays raw because recovery
/// must tell "unknown type" (end of log) apart from a known one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockHeader {
    pub block_type: u32,
    pub sequence: Tid,
}

/// Reads the common header; `None` if the block is shorter than a header or lacks the magic.
pub fn parse_header(block: &[u8]) -> Option<BlockHeader> {
    if read_be32(block, 0)? != JBD2_MAGIC {
        return None;
    }
    Some(BlockHeader { block_type: read_be32(block, 4)?, sequence: Tid(read_be32(block, 8)?) })
}

/// Writes the common header into the first 12 bytes of `block`.
pub fn encode_header(block: &mut [u8], block_type: BlockType, tid: Tid) {
    assert!(block.len() >= JBD2_HEADER_SIZE, "block too short for a journal header");
    write_be32(block, 0, JBD2_MAGIC);
    write_be32(block, 4, block_type as u32);
    write_be32(block, 8, tid.0);
}

/// Feature bits of the journal superblock (`JBD2_FEATURE_*`).
pub mod feature {
    /// Checksum v1: crc32_be of each transaction's blocks stored in its commit block.
    pub const COMPAT_CHECKSUM: u32 = 0x1;
    pub const INCOMPAT_REVOKE: u32 = 0x1;
    pub const INCOMPAT_64BIT: u32 = 0x2;
    pub const INCOMPAT_ASYNC_COMMIT: u32 = 0x4;
    pub const INCOMPAT_CSUM_V2: u32 = 0x8;
    pub const INCOMPAT_CSUM_V3: u32 = 0x10;
    pub const INCOMPAT_FAST_COMMIT: u32 = 0x20;
    /// `JBD2_KNOWN_INCOMPAT_FEATURES` of Linux 6.x.
    pub const INCOMPAT_KNOWN: u32 = 0x3f;
    /// quill's own: the fast-commit area is split into per-core areas
    /// ([`super::JournalSuperblock::fc_areas`] of them), each laid out as a standard area. Set
    /// only while those areas hold fast commits recovery must replay (like needs_recovery), so
    /// a clean journal never has it, and stock tools refuse a dirty one instead of replaying
    /// the first area alone. The top bit, far from the bits Linux allocates from the bottom.
    pub const INCOMPAT_QUILL_FC_AREAS: u32 = 0x8000_0000;
    /// `JBD2_KNOWN_COMPAT_FEATURES`.
    pub const COMPAT_KNOWN: u32 = COMPAT_CHECKSUM;
    /// `JBD2_KNOWN_ROCOMPAT_FEATURES`: none are defined.
    pub const RO_COMPAT_KNOWN: u32 = 0;

    /// The journal features of the three words, as `dumpe2fs` lists them under "Journal
    /// features" (e2fsprogs' names; fast commit, which e2fsprogs does not name, is
    /// `journal_fast_commit`; a bit nobody names is `journal_{word} 0x..`). COMPAT first, then
    /// INCOMPAT, then RO_COMPAT, each from its lowest bit up.
    pub fn names(compat: u32, incompat: u32, ro_compat: u32) -> Vec<String> {
        const COMPAT: [(u32, &str); 1] = [(COMPAT_CHECKSUM, "journal_checksum")];
        const INCOMPAT: [(u32, &str); 7] = [
            (INCOMPAT_REVOKE, "journal_incompat_revoke"),
            (INCOMPAT_64BIT, "journal_64bit"),
            (INCOMPAT_ASYNC_COMMIT, "journal_async_commit"),
            (INCOMPAT_CSUM_V2, "journal_checksum_v2"),
            (INCOMPAT_CSUM_V3, "journal_checksum_v3"),
            (INCOMPAT_FAST_COMMIT, "journal_fast_commit"),
            (INCOMPAT_QUILL_FC_AREAS, "journal_quill_fc_areas"),
        ];
        let mut names = Vec::new();
        for (table, word, bits) in [
            (&COMPAT[..], "compat", compat),
            (&INCOMPAT[..], "incompat", incompat),
            (&[][..], "ro_compat", ro_compat),
        ] {
            for bit in (0..32).map(|shift| 1u32 << shift).filter(|bit| bits & bit != 0) {
                names.push(match table.iter().find(|(b, _)| *b == bit) {
                    Some((_, name)) => (*name).to_string(),
                    None => format!("journal_{word} {bit:#x}"),
                });
            }
        }
        names
    }
}

// Big-endian field access. Readers return `None` past the end of the slice so parsers can turn
// a short buffer into `Corrupted`; writers index directly because they only ever touch buffers
// this module sized itself.

pub(crate) fn read_be16(bytes: &[u8], offset: usize) -> Option<u16> {
    let field = bytes.get(offset..offset.checked_add(2)?)?;
    Some(u16::from_be_bytes(field.try_into().ok()?))
}

pub(crate) fn read_be32(bytes: &[u8], offset: usize) -> Option<u32> {
    let field = bytes.get(offset..offset.checked_add(4)?)?;
    Some(u32::from_be_bytes(field.try_into().ok()?))
}

pub(crate) fn read_be64(bytes: &[u8], offset: usize) -> Option<u64> {
    let field = bytes.get(offset..offset.checked_add(8)?)?;
    Some(u64::from_be_bytes(field.try_into().ok()?))
}

pub(crate) fn write_be16(bytes: &mut [u8], offset: usize, value: u16) {
    bytes[offset..offset + 2].copy_from_slice(&value.to_be_bytes());
}

pub(crate) fn write_be32(bytes: &mut [u8], offset: usize, value: u32) {
    bytes[offset..offset + 4].copy_from_slice(&value.to_be_bytes());
}

pub(crate) fn write_be64(bytes: &mut [u8], offset: usize, value: u64) {
    bytes[offset..offset + 8].copy_from_slice(&value.to_be_bytes());
}

/// Checks that `block` is one whole journal block of `block_size` bytes starting with a header of
/// type `expected`, so the caller may then read any offset below `block_size`.
pub(crate) fn check_log_block(
    what: &'static str,
    block_size: u32,
    block: &[u8],
    expected: BlockType,
) -> Result<BlockHeader, crate::OnDiskError> {
    if block.len() != block_size as usize {
        return Err(crate::OnDiskError::corrupted(
            what,
            format!("block is {} bytes, journal block size is {block_size}", block.len()),
        ));
    }
    let header = parse_header(block)
        .ok_or_else(|| crate::OnDiskError::corrupted(what, "no JBD2 magic number"))?;
    if header.block_type != expected as u32 {
        return Err(crate::OnDiskError::corrupted(
            what,
            format!("block type {} where {:?} was expected", header.block_type, expected),
        ));
    }
    Ok(header)
}

/// Shared by the unit tests of every submodule: a deterministic PRNG (no dependency) and the
/// formats worth covering.
#[cfg(test)]
pub(crate) mod test_support {
    use super::{ChecksumVersion, LogFormat};

    /// xorshift64*: tiny, fixed-seed, good enough to generate garbage buffers.
    pub struct XorShift(u64);

    impl XorShift {
        pub fn new(seed: u64) -> Self {
            XorShift(seed | 1)
        }
        pub fn next_u64(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        pub fn below(&mut self, bound: usize) -> usize {
            assert!(bound > 0);
            (self.next_u64() % bound as u64) as usize
        }
        pub fn fill(&mut self, bytes: &mut [u8]) {
            for byte in bytes {
                *byte = self.next_u64() as u8;
            }
        }
    }

    pub const UUID: [u8; 16] = *b"quill-jbd2-uuid!";

    /// A random format and random bytes, usually a whole block, one time in four of any length
    /// up to a block and a bit (parsers must reject short and long buffers alike).
    pub fn garbage_block(rng: &mut XorShift, formats: &[LogFormat]) -> (LogFormat, Vec<u8>) {
        let format = formats[rng.below(formats.len())];
        let length = if rng.below(4) == 0 {
            rng.below(format.block_bytes() + 8)
        } else {
            format.block_bytes()
        };
        let mut block = vec![0u8; length];
        rng.fill(&mut block);
        (format, block)
    }

    /// Every tag layout the kernel can produce, at two block sizes.
    pub fn all_formats() -> Vec<LogFormat> {
        let mut formats = Vec::new();
        for block_size in [1024, 4096] {
            for checksum in [
                ChecksumVersion::None,
                ChecksumVersion::V1,
                ChecksumVersion::V2,
                ChecksumVersion::V3,
            ] {
                for is_64bit in [false, true] {
                    formats.push(LogFormat::new(block_size, checksum, is_64bit, UUID));
                }
            }
        }
        formats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_feature_names_follow_dumpe2fs() {
        assert!(feature::names(0, 0, 0).is_empty());
        assert_eq!(
            feature::names(
                0,
                feature::INCOMPAT_REVOKE | feature::INCOMPAT_64BIT | feature::INCOMPAT_CSUM_V3,
                0
            )
            .join(" "),
            "journal_incompat_revoke journal_64bit journal_checksum_v3"
        );
        assert_eq!(
            feature::names(feature::COMPAT_CHECKSUM | 0x4, feature::INCOMPAT_FAST_COMMIT, 0x1),
            [
                "journal_checksum",
                "journal_compat 0x4",
                "journal_fast_commit",
                "journal_ro_compat 0x1"
            ]
        );
    }

    #[test]
    fn header_round_trips_and_rejects_short_or_foreign_blocks() {
        let mut block = vec![0u8; 64];
        encode_header(&mut block, BlockType::Revoke, Tid(0xDEAD_BEEF));
        assert_eq!(&block[..4], &[0xC0, 0x3B, 0x39, 0x98]);
        assert_eq!(
            parse_header(&block),
            Some(BlockHeader { block_type: 5, sequence: Tid(0xDEAD_BEEF) })
        );
        assert_eq!(parse_header(&block[..11]), None);
        block[3] ^= 1;
        assert_eq!(parse_header(&block), None);
    }

    #[test]
    fn block_type_from_u32_knows_exactly_the_kernel_types() {
        for raw in 0..10u32 {
            let parsed = BlockType::from_u32(raw);
            assert_eq!(parsed.is_some(), (1..=5).contains(&raw));
            if let Some(block_type) = parsed {
                assert_eq!(block_type as u32, raw);
            }
        }
    }

    #[test]
    fn big_endian_readers_refuse_out_of_range_offsets() {
        let bytes = [1u8, 2, 3, 4, 5, 6, 7, 8];
        assert_eq!(read_be16(&bytes, 6), Some(0x0708));
        assert_eq!(read_be32(&bytes, 4), Some(0x0506_0708));
        assert_eq!(read_be64(&bytes, 0), Some(0x0102_0304_0506_0708));
        assert_eq!(read_be16(&bytes, 7), None);
        assert_eq!(read_be32(&bytes, 5), None);
        assert_eq!(read_be64(&bytes, 1), None);
        assert_eq!(read_be32(&bytes, usize::MAX - 1), None);
    }
}
