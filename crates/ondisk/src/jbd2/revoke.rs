//! Revoke blocks: lists of file system blocks whose earlier logged copies must not be replayed.
//!
//! Layout (`jbd2_journal_revoke_header_t`): `header | be32 r_count | records... | [tail]`, where
//! `r_count` counts the bytes in use *including* the 16-byte header, and each record is a `be32`
//! block number, or a `be64` with `INCOMPAT_64BIT`. A transaction may carry any number of revoke
//! blocks.
//!
//! How `r_count` is judged, following `scan_revoke_records` in Linux and e2fsck:
//!
//! | `r_count`                                 | result                                    |
//! |-------------------------------------------|-------------------------------------------|
//! | `> block_size - tail`                     | `Corrupted` (the kernel fails recovery, -EINVAL) |
//! | `< 16`                                    | no records (the kernel's loop never runs) |
//! | `16 + n * record + partial`               | the `n` whole records; the partial one is ignored |

use super::format::{write_block_tail, LogFormat};
use super::{
    check_log_block, encode_header, read_be32, read_be64, write_be32, write_be64, BlockType,
};
use crate::{OnDiskError, Tid};

const WHAT: &str = "journal revoke block";

/// Size of `jbd2_journal_revoke_header_t`: the block header plus `r_count`.
pub const REVOKE_HEADER_SIZE: usize = 16;
const R_COUNT_OFFSET: usize = 12;

/// Encodes `blocks` into as many revoke blocks as they need, each filled like
/// `jbd2_journal_write_revoke_records` fills them, with `r_count` and the v2/v3 tail set.
/// Returns no blocks for an empty list.
pub fn encode_revoke_blocks(format: &LogFormat, tid: Tid, blocks: &[u64]) -> Vec<Vec<u8>> {
    let record_bytes = format.revoke_record_bytes();
    blocks
        .chunks(format.revoke_records_per_block())
        .map(|records| {
            let mut block = vec![0u8; format.block_bytes()];
            encode_header(&mut block, BlockType::Revoke, tid);
            let mut offset = REVOKE_HEADER_SIZE;
            for &revoked in records {
                if format.is_64bit {
                    write_be64(&mut block, offset, revoked);
                } else {
                    assert!(
                        revoked <= u64::from(u32::MAX),
                        "block {revoked} does not fit a journal without INCOMPAT_64BIT"
                    );
                    write_be32(&mut block, offset, revoked as u32);
                }
                offset += record_bytes;
            }
            assert!(offset + format.tail_bytes() <= block.len());
            write_be32(&mut block, R_COUNT_OFFSET, offset as u32);
            write_block_tail(format, &mut block);
            block
        })
        .collect()
}

/// Reads the revoked block numbers of one revoke block. Does not verify the tail checksum (see
/// [`super::verify_block_tail`]); recovery checks it only in its scan pass.
pub fn parse_revoke_block(format: &LogFormat, block: &[u8]) -> Result<Vec<u64>, OnDiskError> {
    check_log_block(WHAT, format.block_size, block, BlockType::Revoke)?;
    let cut_off = || OnDiskError::corrupted(WHAT, "record runs past the block");
    let r_count = read_be32(block, R_COUNT_OFFSET).ok_or_else(cut_off)? as usize;
    let used_max = block.len() - format.tail_bytes();
    if r_count > used_max {
        return Err(OnDiskError::corrupted(
            WHAT,
            format!("r_count {r_count} exceeds the {used_max} usable bytes"),
        ));
    }
    let record_bytes = format.revoke_record_bytes();
    let records_count = r_count.saturating_sub(REVOKE_HEADER_SIZE) / record_bytes;
    (0..records_count)
        .map(|index| {
            let offset = REVOKE_HEADER_SIZE + index * record_bytes;
            let record = if format.is_64bit {
                read_be64(block, offset)
            } else {
                read_be32(block, offset).map(u64::from)
            };
            record.ok_or_else(cut_off)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{all_formats, garbage_block, XorShift, UUID};
    use super::super::{verify_block_tail, ChecksumVersion};
    use super::*;

    fn revoked_list(format: &LogFormat, count: usize) -> Vec<u64> {
        (0..count as u64)
            .map(|i| if format.is_64bit { (i << 33) | i } else { u64::from(u32::MAX) - i })
            .collect()
    }

    #[test]
    fn revoke_blocks_round_trip_across_block_boundaries() {
        for format in all_formats() {
            let per_block = format.revoke_records_per_block();
            for count in [1, per_block - 1, per_block, per_block + 1, 2 * per_block + 3] {
                let revoked = revoked_list(&format, count);
                let blocks = encode_revoke_blocks(&format, Tid(77), &revoked);
                assert_eq!(blocks.len(), count.div_ceil(per_block), "{format:?}");
                let mut parsed = Vec::new();
                for block in &blocks {
                    assert!(verify_block_tail(&format, block));
                    let header = super::super::parse_header(block).unwrap();
                    assert_eq!(header.sequence, Tid(77));
                    let r_count = read_be32(block, R_COUNT_OFFSET).unwrap() as usize;
                    let in_block = parse_revoke_block(&format, block).unwrap();
                    assert_eq!(r_count, 16 + in_block.len() * format.revoke_record_bytes());
                    parsed.extend(in_block);
                }
                assert_eq!(parsed, revoked, "{format:?}");
            }
        }
    }

    #[test]
    fn no_revoke_blocks_for_an_empty_list() {
        let format = LogFormat::new(1024, ChecksumVersion::V3, true, UUID);
        assert!(encode_revoke_blocks(&format, Tid(1), &[]).is_empty());
    }

    #[test]
    fn r_count_beyond_the_tail_is_corrupted() {
        for format in all_formats() {
            let mut block = encode_revoke_blocks(&format, Tid(1), &[1, 2]).remove(0);
            let limit = format.block_bytes() - format.tail_bytes();
            write_be32(&mut block, R_COUNT_OFFSET, limit as u32 + 1);
            assert!(matches!(
                parse_revoke_block(&format, &block),
                Err(OnDiskError::Corrupted { .. })
            ));
            write_be32(&mut block, R_COUNT_OFFSET, limit as u32);
            let records = parse_revoke_block(&format, &block).unwrap();
            assert_eq!(records.len(), (limit - 16) / format.revoke_record_bytes());
        }
    }

    #[test]
    fn short_or_ragged_r_count_reads_whole_records_only_like_the_kernel() {
        let format = LogFormat::new(1024, ChecksumVersion::None, false, UUID);
        let mut block = encode_revoke_blocks(&format, Tid(1), &[10, 20, 30]).remove(0);
        write_be32(&mut block, R_COUNT_OFFSET, 16 + 4 * 2 + 3);
        assert_eq!(parse_revoke_block(&format, &block).unwrap(), vec![10, 20]);
        write_be32(&mut block, R_COUNT_OFFSET, 7);
        assert_eq!(parse_revoke_block(&format, &block).unwrap(), Vec::<u64>::new());
    }

    #[test]
    fn revoke_checksum_corruption_is_detected() {
        let format = LogFormat::new(4096, ChecksumVersion::V3, true, UUID);
        let mut block = encode_revoke_blocks(&format, Tid(5), &[100, 200]).remove(0);
        assert!(verify_block_tail(&format, &block));
        block[REVOKE_HEADER_SIZE + 3] ^= 0x80;
        assert!(!verify_block_tail(&format, &block));
    }

    #[test]
    fn parse_rejects_wrong_size_and_wrong_type() {
        let format = LogFormat::new(1024, ChecksumVersion::V2, false, UUID);
        let block = encode_revoke_blocks(&format, Tid(5), &[1]).remove(0);
        assert!(parse_revoke_block(&format, &block[..1023]).is_err());
        let mut descriptor_typed = block;
        write_be32(&mut descriptor_typed, 4, BlockType::Descriptor as u32);
        assert!(parse_revoke_block(&format, &descriptor_typed).is_err());
    }

    #[test]
    #[should_panic(expected = "does not fit a journal without INCOMPAT_64BIT")]
    fn encoder_refuses_64bit_block_in_32bit_journal() {
        let format = LogFormat::new(1024, ChecksumVersion::None, false, UUID);
        encode_revoke_blocks(&format, Tid(1), &[1 << 32]);
    }

    #[test]
    fn garbage_revoke_blocks_never_panic() {
        let seed = 0x0BAD_5EED_u64;
        println!("garbage_revoke_blocks_never_panic seed={seed:#x}");
        let mut rng = XorShift::new(seed);
        let formats = all_formats();
        for round in 0..3000u32 {
            let (format, mut block) = garbage_block(&mut rng, &formats);
            let length = block.len();
            if length >= 16 && rng.below(2) == 0 {
                encode_header(&mut block, BlockType::Revoke, Tid(round));
                let r_count = rng.below(format.block_bytes() + 64) as u32;
                write_be32(&mut block, R_COUNT_OFFSET, r_count);
            }
            if let Ok(records) = parse_revoke_block(&format, &block) {
                assert!(records.len() <= format.revoke_records_per_block());
            }
        }
    }
}
