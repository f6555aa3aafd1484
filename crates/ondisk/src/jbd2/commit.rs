//! Commit blocks: the record that makes a transaction durable, and the checksums it carries.
//!
//! Layout (`struct commit_header`): `header | u8 h_chksum_type | u8 h_chksum_size | u8[2] pad |
//! be32 h_chksum[8] | be64 h_commit_sec | be32 h_commit_nsec`, then zeros to the end of the
//! block. The C struct is 64 bytes because `h_commit_sec` forces 8-byte alignment.
//!
//! What the checksum fields hold per scheme, and how recovery judges them:
//!
//! | scheme | type, size | `h_chksum[0]`                                   | accepted when                          |
//! |--------|------------|--------------------------------------------------|----------------------------------------|
//! | none   | 0, 0       | 0                                                | always                                 |
//! | v1     | 1, 4       | crc32_be(~0, descriptor and data blocks of the tid) | crc matches with 1,4, or all three are 0 |
//! | v2, v3 | 0, 0       | crc32c(seed, whole block with `h_chksum[0]` = 0) | crc matches, or matches over the first 64 bytes with the rest zero (recent mainline, "partial") |

use super::format::{ChecksumVersion, LogFormat};
use super::{
    check_log_block, encode_header, read_be32, read_be64, write_be32, write_be64, BlockType,
};
use crate::crc::{crc32_be, crc32c_raw};
use crate::{OnDiskError, Tid};

const WHAT: &str = "journal commit block";

/// `JBD2_CRC32_CHKSUM`: `h_chksum_type` of a checksum-v1 commit block.
pub const JBD2_CRC32_CHKSUM: u8 = 1;
/// `JBD2_CRC32_CHKSUM_SIZE`: `h_chksum_size` of a checksum-v1 commit block.
pub const JBD2_CRC32_CHKSUM_SIZE: u8 = 4;
/// `sizeof(struct commit_header)`, padding included.
pub const COMMIT_HEADER_SIZE: usize = 64;

const CHKSUM_TYPE_OFFSET: usize = 0x0C;
const CHKSUM_SIZE_OFFSET: usize = 0x0D;
const CHKSUM_OFFSET: usize = 0x10;
const COMMIT_SEC_OFFSET: usize = 0x30;
const COMMIT_NSEC_OFFSET: usize = 0x38;

/// A parsed commit block. Checksums are verified separately ([`verify_commit_checksum`],
/// [`CommitBlock::v1_checksum_matches`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommitBlock {
    pub sequence: Tid,
    pub chksum_type: u8,
    pub chksum_size: u8,
    /// `h_chksum[0]`.
    pub checksum: u32,
    pub commit_sec: u64,
    pub commit_nsec: u32,
}

impl CommitBlock {
    /// The checksum-v1 test of `do_one_pass`: `crc32_sum` (accumulated with [`v1_crc_update`]
    /// over the transaction's descriptor and data blocks, from `!0`) matches a crc32 commit, or
    /// the commit carries no checksum at all.
    pub fn v1_checksum_matches(&self, crc32_sum: u32) -> bool {
        let matches = self.checksum == crc32_sum
            && self.chksum_type == JBD2_CRC32_CHKSUM
            && self.chksum_size == JBD2_CRC32_CHKSUM_SIZE;
        let unused = self.chksum_type == 0 && self.chksum_size == 0 && self.checksum == 0;
        matches || unused
    }
}

/// Builds the commit block of `tid`. `v1_crc` must be given exactly when the format uses
/// checksum v1; v2/v3 checksum the block itself.
pub fn encode_commit_block(
    format: &LogFormat,
    tid: Tid,
    commit_sec: u64,
    commit_nsec: u32,
    v1_crc: Option<u32>,
) -> Vec<u8> {
    assert_eq!(
        v1_crc.is_some(),
        format.checksum == ChecksumVersion::V1,
        "a v1 crc is needed exactly for checksum v1"
    );
    let mut block = vec![0u8; format.block_bytes()];
    encode_header(&mut block, BlockType::Commit, tid);
    write_be64(&mut block, COMMIT_SEC_OFFSET, commit_sec);
    write_be32(&mut block, COMMIT_NSEC_OFFSET, commit_nsec);
    if let Some(crc) = v1_crc {
        block[CHKSUM_TYPE_OFFSET] = JBD2_CRC32_CHKSUM;
        block[CHKSUM_SIZE_OFFSET] = JBD2_CRC32_CHKSUM_SIZE;
        write_be32(&mut block, CHKSUM_OFFSET, crc);
    }
    if format.checksum.has_block_checksums() {
        let checksum = format.block_checksum_with_zeroed_field(&block, CHKSUM_OFFSET);
        write_be32(&mut block, CHKSUM_OFFSET, checksum);
    }
    block
}

pub fn parse_commit_block(format: &LogFormat, block: &[u8]) -> Result<CommitBlock, OnDiskError> {
    let header = check_log_block(WHAT, format.block_size, block, BlockType::Commit)?;
    let cut_off = || OnDiskError::corrupted(WHAT, "commit header is cut off");
    Ok(CommitBlock {
        sequence: header.sequence,
        chksum_type: *block.get(CHKSUM_TYPE_OFFSET).ok_or_else(cut_off)?,
        chksum_size: *block.get(CHKSUM_SIZE_OFFSET).ok_or_else(cut_off)?,
        checksum: read_be32(block, CHKSUM_OFFSET).ok_or_else(cut_off)?,
        commit_sec: read_be64(block, COMMIT_SEC_OFFSET).ok_or_else(cut_off)?,
        commit_nsec: read_be32(block, COMMIT_NSEC_OFFSET).ok_or_else(cut_off)?,
    })
}

/// `jbd2_commit_block_csum_verify`: the v2/v3 checksum over the whole block. True without
/// v2/v3, false for a block of the wrong size.
pub fn verify_commit_checksum(format: &LogFormat, block: &[u8]) -> bool {
    if !format.checksum.has_block_checksums() {
        return true;
    }
    if block.len() != format.block_bytes() {
        return false;
    }
    read_be32(block, CHKSUM_OFFSET)
        == Some(format.block_checksum_with_zeroed_field(block, CHKSUM_OFFSET))
}

/// `jbd2_commit_block_csum_verify_partial` (recent mainline recovery.c): the v2/v3 checksum computed over the
/// first [`COMMIT_HEADER_SIZE`] bytes followed by zeros, which recovery also accepts so that a
/// commit block whose tail beyond the header was not persisted still counts. True without v2/v3.
pub fn verify_commit_checksum_partial(format: &LogFormat, block: &[u8]) -> bool {
    if !format.checksum.has_block_checksums() {
        return true;
    }
    if block.len() != format.block_bytes() {
        return false;
    }
    let mut header = [0u8; COMMIT_HEADER_SIZE];
    header.copy_from_slice(&block[..COMMIT_HEADER_SIZE]);
    let stored = read_be32(&header, CHKSUM_OFFSET);
    write_be32(&mut header, CHKSUM_OFFSET, 0);
    let mut checksum = crc32c_raw(format.csum_seed, &header);
    let zeros = [0u8; 1024];
    let mut remaining = block.len() - COMMIT_HEADER_SIZE;
    while remaining > 0 {
        let chunk = remaining.min(zeros.len());
        checksum = crc32c_raw(checksum, &zeros[..chunk]);
        remaining -= chunk;
    }
    stored == Some(checksum)
}

/// One step of the checksum-v1 accumulation (`crc32_be`), started from `!0` per transaction and
/// fed the descriptor blocks and the logged data blocks as written (escaped), in log order.
pub fn v1_crc_update(crc: u32, block: &[u8]) -> u32 {
    crc32_be(crc, block)
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{all_formats, garbage_block, XorShift, UUID};
    use super::*;

    fn v1_crc_for(format: &LogFormat) -> Option<u32> {
        (format.checksum == ChecksumVersion::V1).then_some(0x1234_5678)
    }

    #[test]
    fn commit_block_round_trips_for_every_format() {
        for format in all_formats() {
            let block = encode_commit_block(
                &format,
                Tid(3),
                1_700_000_000,
                999_999_999,
                v1_crc_for(&format),
            );
            assert_eq!(block.len(), format.block_bytes());
            assert!(block[COMMIT_HEADER_SIZE..].iter().all(|&b| b == 0));
            let commit = parse_commit_block(&format, &block).unwrap();
            assert_eq!(commit.sequence, Tid(3));
            assert_eq!(commit.commit_sec, 1_700_000_000);
            assert_eq!(commit.commit_nsec, 999_999_999);
            assert!(verify_commit_checksum(&format, &block));
            assert!(verify_commit_checksum_partial(&format, &block));
            match format.checksum {
                ChecksumVersion::V1 => {
                    assert_eq!((commit.chksum_type, commit.chksum_size), (1, 4));
                    assert_eq!(commit.checksum, 0x1234_5678);
                    assert!(commit.v1_checksum_matches(0x1234_5678));
                    assert!(!commit.v1_checksum_matches(0x1234_5679));
                }
                ChecksumVersion::None => {
                    assert_eq!(
                        (commit.chksum_type, commit.chksum_size, commit.checksum),
                        (0, 0, 0)
                    );
                    assert!(commit.v1_checksum_matches(0xFFFF));
                }
                ChecksumVersion::V2 | ChecksumVersion::V3 => {
                    assert_eq!((commit.chksum_type, commit.chksum_size), (0, 0));
                    assert_ne!(commit.checksum, 0);
                }
            }
        }
    }

    #[test]
    fn commit_checksum_corruption_is_detected() {
        for format in all_formats().into_iter().filter(|f| f.checksum.has_block_checksums()) {
            let block = encode_commit_block(&format, Tid(3), 5, 6, None);
            for offset in [4, CHKSUM_OFFSET, COMMIT_SEC_OFFSET + 7, format.block_bytes() - 1] {
                let mut damaged = block.clone();
                damaged[offset] ^= 0x04;
                assert!(!verify_commit_checksum(&format, &damaged), "offset {offset}");
            }
            assert!(!verify_commit_checksum(&format, &block[..100]));
        }
    }

    #[test]
    fn partial_commit_checksum_ignores_garbage_after_the_header() {
        let format = LogFormat::new(4096, ChecksumVersion::V3, true, UUID);
        let mut block = encode_commit_block(&format, Tid(8), 5, 6, None);
        block[2000] = 0xEE;
        assert!(!verify_commit_checksum(&format, &block));
        assert!(verify_commit_checksum_partial(&format, &block));
        block[COMMIT_NSEC_OFFSET] ^= 1;
        assert!(!verify_commit_checksum_partial(&format, &block));
    }

    #[test]
    fn v1_crc_update_chains_like_crc32_be() {
        let a = [1u8, 2, 3];
        let b = [4u8, 5];
        assert_eq!(v1_crc_update(v1_crc_update(!0, &a), &b), crc32_be(!0, &[1, 2, 3, 4, 5]));
    }

    #[test]
    #[should_panic(expected = "a v1 crc is needed exactly for checksum v1")]
    fn encode_refuses_v1_crc_for_a_v3_journal() {
        let format = LogFormat::new(1024, ChecksumVersion::V3, false, UUID);
        encode_commit_block(&format, Tid(1), 0, 0, Some(1));
    }

    #[test]
    fn parse_rejects_wrong_size_and_wrong_type() {
        let format = LogFormat::new(1024, ChecksumVersion::None, false, UUID);
        let block = encode_commit_block(&format, Tid(1), 0, 0, None);
        assert!(parse_commit_block(&format, &block[..60]).is_err());
        let mut revoke_typed = block;
        write_be32(&mut revoke_typed, 4, BlockType::Revoke as u32);
        assert!(matches!(
            parse_commit_block(&format, &revoke_typed),
            Err(OnDiskError::Corrupted { .. })
        ));
    }

    #[test]
    fn garbage_commit_blocks_never_panic() {
        let seed = 0xC0FF_EE00_u64;
        println!("garbage_commit_blocks_never_panic seed={seed:#x}");
        let mut rng = XorShift::new(seed);
        let formats = all_formats();
        for round in 0..3000u32 {
            let (format, mut block) = garbage_block(&mut rng, &formats);
            let length = block.len();
            if length >= 12 && rng.below(2) == 0 {
                encode_header(&mut block, BlockType::Commit, Tid(round));
            }
            if let Ok(commit) = parse_commit_block(&format, &block) {
                let _ = commit.v1_checksum_matches(round);
            }
            let _ = verify_commit_checksum(&format, &block);
            let _ = verify_commit_checksum_partial(&format, &block);
        }
    }
}
