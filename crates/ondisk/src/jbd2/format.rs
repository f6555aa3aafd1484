//! [`LogFormat`]: everything that decides how log blocks are laid out and checksummed, derived
//! once from the journal superblock.
//!
//! The kernel re-derives these numbers from feature bits all over `commit.c` and `recovery.c`;
//! keeping them in one value means the descriptor builder and the descriptor parser, and the
//! revoke encoder and parser, are configured identically by construction.
//!
//! Tag size (`journal_tag_bytes()` in `fs/jbd2/journal.c`):
//!
//! | checksum | 64bit | tag bytes | layout                                                    |
//! |----------|-------|-----------|-----------------------------------------------------------|
//! | v3       | any   | 16        | `be32 blocknr, be32 flags, be32 blocknr_high, be32 csum`   |
//! | v2       | no    | 10        | `be32 blocknr, be16 csum, be16 flags`, 2 unused bytes      |
//! | v2       | yes   | 14        | as above plus `be32 blocknr_high`, 2 unused bytes          |
//! | none, v1 | no    | 8         | `be32 blocknr, be16 csum (unused), be16 flags`             |
//! | none, v1 | yes   | 12        | as above plus `be32 blocknr_high`                          |

use super::{JBD2_BLOCK_SIZE_MAX, JBD2_BLOCK_SIZE_MIN, JBD2_HEADER_SIZE};
use crate::crc::crc32c_raw;
use crate::Tid;

/// Which journal checksum scheme is in force. They are mutually exclusive on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChecksumVersion {
    None,
    /// Compat `CHECKSUM`: crc32_be over a transaction's descriptor and data blocks, kept in the
    /// commit block. Nothing else is checksummed.
    V1,
    /// Incompat `CSUM_V2`: crc32c on every metadata block; tags keep the low 16 bits of the data
    /// block checksum.
    V2,
    /// Incompat `CSUM_V3`: as v2, but tags are `journal_block_tag3_t` with a full 32-bit checksum.
    V3,
}

impl ChecksumVersion {
    /// v2 and v3 checksum every metadata block (`jbd2_journal_has_csum_v2or3`).
    pub fn has_block_checksums(self) -> bool {
        matches!(self, ChecksumVersion::V2 | ChecksumVersion::V3)
    }
}

/// Everything needed to encode and parse log blocks; derived from the superblock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogFormat {
    pub block_size: u32,
    pub checksum: ChecksumVersion,
    pub is_64bit: bool,
    pub uuid: [u8; 16],
    /// `j_csum_seed = crc32c(~0, s_uuid)`, the seed of every v2/v3 checksum.
    pub csum_seed: u32,
}

/// Size of the UUID that follows the first tag of each descriptor block.
pub(crate) const TAG_UUID_SIZE: usize = 16;
/// Size of `jbd2_journal_block_tail` (descriptor and revoke blocks, v2/v3 only).
pub(crate) const BLOCK_TAIL_SIZE: usize = 4;

impl LogFormat {
    pub fn new(block_size: u32, checksum: ChecksumVersion, is_64bit: bool, uuid: [u8; 16]) -> Self {
        assert!(
            block_size.is_power_of_two()
                && (JBD2_BLOCK_SIZE_MIN..=JBD2_BLOCK_SIZE_MAX).contains(&block_size),
            "journal block size {block_size} is not a power of two in 1024..=65536"
        );
        LogFormat { block_size, checksum, is_64bit, uuid, csum_seed: crc32c_raw(!0, &uuid) }
    }

    pub(crate) fn block_bytes(&self) -> usize {
        self.block_size as usize
    }

    /// Kernel `journal_tag_bytes()`; see the table in the module documentation.
    pub fn tag_bytes(&self) -> usize {
        if self.checksum == ChecksumVersion::V3 {
            return 16;
        }
        let mut size = 12; // sizeof(journal_block_tag_t)
        if self.checksum == ChecksumVersion::V2 {
            size += 2;
        }
        if self.is_64bit {
            size
        } else {
            size - 4
        }
    }

    /// Bytes reserved at the end of descriptor and revoke blocks for their checksum.
    pub fn tail_bytes(&self) -> usize {
        if self.checksum.has_block_checksums() {
            BLOCK_TAIL_SIZE
        } else {
            0
        }
    }

    /// How many tags one descriptor holds when filled the way `jbd2_journal_commit_transaction`
    /// fills it: the first tag is followed by the 16-byte UUID, and another tag is added only
    /// while `space_left >= tag_bytes + 16 + csum_size`. (The kernel keeps room for a UUID it
    /// never writes; `jbd2_descriptor_blocks_per_trans` relies on the same count.)
    /// [`DescriptorBuilder`](super::DescriptorBuilder) applies that rule tag by tag and agrees.
    pub fn tags_per_descriptor(&self) -> usize {
        let tag = self.tag_bytes();
        let reserve = tag + TAG_UUID_SIZE + self.tail_bytes();
        let space_after_first = self.block_bytes() - JBD2_HEADER_SIZE - tag - TAG_UUID_SIZE;
        if space_after_first < reserve {
            1
        } else {
            2 + (space_after_first - reserve) / tag
        }
    }

    /// `journal_revoke_records_per_block()`.
    pub fn revoke_records_per_block(&self) -> usize {
        (self.block_bytes() - super::REVOKE_HEADER_SIZE - self.tail_bytes())
            / self.revoke_record_bytes()
    }

    pub(crate) fn revoke_record_bytes(&self) -> usize {
        if self.is_64bit {
            8
        } else {
            4
        }
    }

    /// The v2/v3 data block checksum (`jbd2_block_tag_csum_set`):
    /// `crc32c(crc32c(seed, be32(tid)), block as written to the log)`. v3 stores all 32 bits,
    /// v2 the low 16.
    pub fn tag_checksum(&self, tid: Tid, logged_block: &[u8]) -> u32 {
        crc32c_raw(crc32c_raw(self.csum_seed, &tid.0.to_be_bytes()), logged_block)
    }

    /// crc32c over a whole block whose 4-byte checksum field at `field_offset` reads as zero,
    /// computed without copying the block.
    pub(crate) fn block_checksum_with_zeroed_field(
        &self,
        block: &[u8],
        field_offset: usize,
    ) -> u32 {
        let before = crc32c_raw(self.csum_seed, &block[..field_offset]);
        let zeroed = crc32c_raw(before, &[0u8; 4]);
        crc32c_raw(zeroed, &block[field_offset + 4..])
    }
}

/// Verifies the `jbd2_journal_block_tail` of a descriptor or revoke block:
/// `crc32c(seed, block with the tail zeroed)`. Always true without v2/v3, false for a block of
/// the wrong size.
pub fn verify_block_tail(format: &LogFormat, block: &[u8]) -> bool {
    if !format.checksum.has_block_checksums() {
        return true;
    }
    if block.len() != format.block_bytes() {
        return false;
    }
    let tail_offset = block.len() - BLOCK_TAIL_SIZE;
    let stored = super::read_be32(block, tail_offset);
    stored == Some(format.block_checksum_with_zeroed_field(block, tail_offset))
}

/// Writes the tail checksum of a descriptor or revoke block we built (no-op without v2/v3).
pub(crate) fn write_block_tail(format: &LogFormat, block: &mut [u8]) {
    assert_eq!(block.len(), format.block_bytes());
    if !format.checksum.has_block_checksums() {
        return;
    }
    let tail_offset = block.len() - BLOCK_TAIL_SIZE;
    let checksum = format.block_checksum_with_zeroed_field(block, tail_offset);
    super::write_be32(block, tail_offset, checksum);
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{all_formats, UUID};
    use super::*;

    #[test]
    fn tag_bytes_match_kernel_journal_tag_bytes() {
        let cases = [
            (ChecksumVersion::None, false, 8),
            (ChecksumVersion::None, true, 12),
            (ChecksumVersion::V1, false, 8),
            (ChecksumVersion::V1, true, 12),
            (ChecksumVersion::V2, false, 10),
            (ChecksumVersion::V2, true, 14),
            (ChecksumVersion::V3, false, 16),
            (ChecksumVersion::V3, true, 16),
        ];
        for (checksum, is_64bit, expected) in cases {
            let format = LogFormat::new(4096, checksum, is_64bit, UUID);
            assert_eq!(format.tag_bytes(), expected, "{checksum:?} 64bit={is_64bit}");
            assert_eq!(format.tail_bytes(), if checksum.has_block_checksums() { 4 } else { 0 });
        }
    }

    #[test]
    fn tags_per_descriptor_matches_kernel_loop_and_transaction_limit_formula() {
        for block_size in [1024u32, 2048, 4096, 8192, 65536] {
            for mut format in all_formats() {
                format = LogFormat::new(block_size, format.checksum, format.is_64bit, UUID);
                let tag = format.tag_bytes();
                let csum = format.tail_bytes();
                // The loop of jbd2_journal_commit_transaction, verbatim.
                let mut space_left = block_size as usize - JBD2_HEADER_SIZE;
                let mut tags = 0;
                loop {
                    tags += 1;
                    space_left -= tag;
                    if tags == 1 {
                        space_left -= 16;
                    }
                    if space_left < tag + 16 + csum {
                        break;
                    }
                }
                assert_eq!(format.tags_per_descriptor(), tags, "{format:?}");
                // jbd2_descriptor_blocks_per_trans: (bs - 12 - 16 - csum - 16) / tag_bytes.
                let formula = (block_size as usize - 12 - 16 - csum - 16) / tag;
                assert_eq!(tags, formula, "{format:?}");
            }
        }
    }

    #[test]
    fn revoke_records_per_block_leaves_room_for_header_and_tail() {
        let plain = LogFormat::new(1024, ChecksumVersion::None, false, UUID);
        assert_eq!(plain.revoke_records_per_block(), (1024 - 16) / 4);
        let csum64 = LogFormat::new(4096, ChecksumVersion::V3, true, UUID);
        assert_eq!(csum64.revoke_records_per_block(), (4096 - 16 - 4) / 8);
    }

    #[test]
    fn csum_seed_is_raw_crc32c_of_uuid_and_tag_checksum_chains_tid_then_block() {
        let format = LogFormat::new(1024, ChecksumVersion::V3, false, UUID);
        assert_eq!(format.csum_seed, crc32c_raw(!0, &UUID));
        let block = vec![0x5Au8; 1024];
        let mut chained = crc32c_raw(format.csum_seed, &[0, 0, 0, 7]);
        chained = crc32c_raw(chained, &block);
        assert_eq!(format.tag_checksum(Tid(7), &block), chained);
        assert_ne!(format.tag_checksum(Tid(8), &block), chained);
    }

    #[test]
    fn block_tail_detects_any_flipped_bit() {
        let format = LogFormat::new(1024, ChecksumVersion::V2, true, UUID);
        let mut block = vec![0u8; 1024];
        for (index, byte) in block.iter_mut().enumerate() {
            *byte = index as u8;
        }
        write_block_tail(&format, &mut block);
        assert!(verify_block_tail(&format, &block));
        for bit in [0usize, 7, 100 * 8 + 3, 1020 * 8, 1023 * 8 + 7] {
            let mut damaged = block.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert!(!verify_block_tail(&format, &damaged), "bit {bit}");
        }
        assert!(!verify_block_tail(&format, &block[..1000]));
        let unchecked = LogFormat::new(1024, ChecksumVersion::V1, true, UUID);
        assert!(verify_block_tail(&unchecked, &block[..10]));
    }

    #[test]
    #[should_panic(expected = "not a power of two")]
    fn log_format_refuses_block_size_the_kernel_cannot_use() {
        LogFormat::new(3000, ChecksumVersion::None, false, UUID);
    }
}
