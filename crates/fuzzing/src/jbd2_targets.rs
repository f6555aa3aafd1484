//! Targets for the JBD2 parsers of `ondisk::jbd2`, fast commits included.

use ondisk::crc::crc32c_raw;
use ondisk::jbd2::fast_commit::{
    fast_commit_records, scan_fast_commit_area, FcRecord, FC_INODE_RAW_MIN,
};
use ondisk::jbd2::{
    encode_commit_block, encode_revoke_blocks, escape_block, feature, parse_commit_block,
    parse_descriptor_tags, parse_header, parse_revoke_block, tag_checksum_matches, unescape_block,
    verify_block_tail, verify_commit_checksum, verify_commit_checksum_partial, BlockType,
    ChecksumVersion, DescriptorBuilder, JournalSuperblock, LogFormat, JBD2_MAGIC,
};
use ondisk::Tid;

use crate::input::Input;
use crate::samples::UUID;

const JOURNAL_SUPERBLOCK_SIZE: usize = 1024;
const JOURNAL_SUPERBLOCK_CHECKSUM: usize = 0xFC;
/// Block sizes the `jbd2` target picks from: small ones keep inputs short.
const BLOCK_SIZES: [u32; 4] = [1024, 2048, 4096, 1024];
const CHECKSUMS: [ChecksumVersion; 4] =
    [ChecksumVersion::None, ChecksumVersion::V1, ChecksumVersion::V2, ChecksumVersion::V3];
/// Tags the descriptor round trip pushes at most (a 1 KiB v3 descriptor holds 61).
const DESCRIPTOR_TAGS_MAX: usize = 64;

/// `jbd2`: `[format u8][block bytes]`. Format bits 0-1: checksum version, bit 2: 64bit, bits
/// 3-4: block size (1, 2, 4 or 1 KiB). The bytes are parsed as a journal superblock (as given
/// and resealed) and, padded or cut to the block size, as a descriptor, commit and revoke block
/// under every checksum version and 64bit setting; the verifiers run on them, and what parses
/// is re-encoded and must parse back to the same values.
pub fn jbd2(data: &[u8]) {
    let mut input = Input::new(data);
    let selector = input.u8();
    let bytes = input.rest();
    check_journal_superblock(bytes);
    if bytes.len() >= JOURNAL_SUPERBLOCK_SIZE {
        let mut raw = bytes[..JOURNAL_SUPERBLOCK_SIZE].to_vec();
        raw[JOURNAL_SUPERBLOCK_CHECKSUM..JOURNAL_SUPERBLOCK_CHECKSUM + 4].fill(0);
        let checksum = crc32c_raw(!0, &raw);
        raw[JOURNAL_SUPERBLOCK_CHECKSUM..JOURNAL_SUPERBLOCK_CHECKSUM + 4]
            .copy_from_slice(&checksum.to_be_bytes());
        check_journal_superblock(&raw);
    }
    let block_size = BLOCK_SIZES[usize::from(selector >> 3) & 3];
    let mut block = bytes.to_vec();
    block.resize(block_size as usize, 0);
    // The unpadded bytes too: every parser must refuse a block of the wrong size. The header
    // and the escape round trip do not depend on the format: once per block.
    let blocks = [&block[..], bytes].map(|block| {
        let header = parse_header(block);
        if header.is_some() {
            check_escape(block);
        }
        (block, header.map_or(Tid(0), |h| h.sequence))
    });
    let chosen = (usize::from(selector & 3), selector & 4 != 0);
    // The chosen format first, then every other tag layout at the same block size.
    let mut formats = vec![chosen];
    formats.extend((0..4).flat_map(|c| [(c, false), (c, true)]).filter(|f| *f != chosen));
    for (checksum, is_64bit) in formats {
        let format = LogFormat::new(block_size, CHECKSUMS[checksum], is_64bit, UUID);
        for (block, tid) in blocks {
            check_log_block(&format, block, tid);
        }
    }
}

fn check_journal_superblock(bytes: &[u8]) {
    let Ok(sb) = JournalSuperblock::parse(bytes) else { return };
    let format = sb.format();
    let _ = (format.tag_bytes(), format.tail_bytes(), format.tags_per_descriptor());
    let _ = format.revoke_records_per_block();
    let _ = (sb.log_end(), sb.fast_commit_blocks(), sb.has_incompat(feature::INCOMPAT_64BIT));
    let _ = feature::names(sb.feature_compat, sb.feature_incompat, sb.feature_ro_compat);
    assert!(sb.first < sb.log_end(), "log area is empty");
    let encoded = sb.encode();
    assert_eq!(encoded, &bytes[..JOURNAL_SUPERBLOCK_SIZE], "journal superblock re-encodes");
    let again = JournalSuperblock::parse(&encoded).expect("encoded journal superblock parses");
    assert!(again == sb, "journal superblock round trip");
}

/// Every log-block parser and verifier on `block` under `format`; `tid` is the sequence of the
/// block's header (0 without one).
fn check_log_block(format: &LogFormat, block: &[u8], tid: Tid) {
    let _ = verify_block_tail(format, block);
    let _ = (verify_commit_checksum(format, block), verify_commit_checksum_partial(format, block));
    if let Ok(tags) = parse_descriptor_tags(format, block) {
        assert!(tags.len() <= format.tags_per_descriptor(), "more tags than fit a descriptor");
        for tag in &tags {
            let _ = (tag.is_escaped(), tag.is_last());
            let _ = tag_checksum_matches(format, tid, tag, block);
        }
        check_descriptor_round_trip(format, tid, &tags);
    }
    if let Ok(commit) = parse_commit_block(format, block) {
        let _ = commit.v1_checksum_matches(commit.checksum);
        let v1 = (format.checksum == ChecksumVersion::V1).then_some(commit.checksum);
        let encoded =
            encode_commit_block(format, commit.sequence, commit.commit_sec, commit.commit_nsec, v1);
        let again = parse_commit_block(format, &encoded).expect("encoded commit block parses");
        assert_eq!(
            (again.sequence, again.commit_sec, again.commit_nsec),
            (commit.sequence, commit.commit_sec, commit.commit_nsec),
            "commit block round trip"
        );
        if v1.is_some() {
            assert!(again.v1_checksum_matches(commit.checksum), "v1 commit checksum lost");
        }
        assert!(verify_commit_checksum(format, &encoded), "encoded commit block fails");
        assert!(verify_commit_checksum_partial(format, &encoded), "encoded commit (partial)");
    }
    if let Ok(revoked) = parse_revoke_block(format, block) {
        assert!(revoked.len() <= format.revoke_records_per_block(), "too many revoke records");
        let encoded = encode_revoke_blocks(format, tid, &revoked);
        assert_eq!(encoded.len(), usize::from(!revoked.is_empty()), "one revoke block");
        for again in &encoded {
            assert!(verify_block_tail(format, again), "encoded revoke block fails its tail");
            assert_eq!(parse_revoke_block(format, again).ok(), Some(revoked.clone()), "revoke");
        }
    }
}

/// Escapes and unescapes a copy of `block`, which starts with a journal header (so with the
/// magic): it must be escaped and come back unchanged.
fn check_escape(block: &[u8]) {
    let mut copy = block.to_vec();
    assert!(escape_block(&mut copy), "a block with the magic is escaped");
    unescape_block(&mut copy);
    assert_eq!(copy, block, "escape and unescape");
}

/// Builds a descriptor for the tags' home blocks (logged blocks derived from the block number,
/// one of them starting with the magic so it is escaped) and parses it back.
fn check_descriptor_round_trip(format: &LogFormat, tid: Tid, tags: &[ondisk::jbd2::DescriptorTag]) {
    let mut builder = DescriptorBuilder::new(*format, tid);
    let mut pushed = Vec::new();
    for (i, tag) in tags.iter().take(DESCRIPTOR_TAGS_MAX).enumerate() {
        if builder.is_full() {
            break;
        }
        let mut logged = vec![(tag.block as u8) ^ (i as u8); format.block_size as usize];
        if i == 1 {
            logged[..4].copy_from_slice(&JBD2_MAGIC.to_be_bytes());
        }
        let escaped = builder.push(tag.block, &mut logged);
        assert_eq!(escaped, i == 1, "only the block with the magic is escaped");
        pushed.push((tag.block, logged));
    }
    if builder.is_empty() {
        return;
    }
    let block = builder.finish();
    assert_eq!(parse_header(&block).map(|h| h.block_type), Some(BlockType::Descriptor as u32));
    assert!(verify_block_tail(format, &block), "built descriptor fails its tail");
    let parsed = parse_descriptor_tags(format, &block).expect("built descriptor parses");
    assert_eq!(parsed.len(), pushed.len(), "descriptor round trip: tag count");
    for (i, (tag, (home, logged))) in parsed.iter().zip(&pushed).enumerate() {
        assert_eq!(tag.block, *home, "descriptor round trip: home block");
        assert_eq!(tag.is_last(), i + 1 == pushed.len(), "LAST_TAG on the last tag only");
        assert_eq!(tag.is_escaped(), i == 1, "ESCAPE flag");
        assert!(tag_checksum_matches(format, tid, tag, logged), "tag checksum");
    }
}

/// Block sizes the `fast_commit` target splits its area into.
const FC_BLOCK_SIZES: [usize; 4] = [64, 256, 1024, 4096];

/// `fast_commit`: `[config u8][expected tid u32][area bytes]`. Config bits 0-1: block size (64,
/// 256, 1024 or 4096 bytes), bits 2-3: inode size (128 << n). Each block's records are read;
/// every record re-encodes to one that parses back the same (to the same bytes, padding and
/// tail filler aside); the area is scanned as recovery scans it.
pub fn fast_commit(data: &[u8]) {
    let mut input = Input::new(data);
    let config = input.u8();
    let tid = Tid(input.u32());
    let area = input.rest();
    let block_size = FC_BLOCK_SIZES[usize::from(config & 3)];
    let inode_size = (FC_INODE_RAW_MIN as u16) << ((config >> 2) & 3);
    let mut records_read = 0;
    let mut tails = 0;
    let mut encoded = Vec::new();
    for block in area.chunks(block_size) {
        for tlv in fast_commit_records(block, inode_size) {
            let Ok(tlv) = tlv else { break };
            records_read += 1;
            tails += usize::from(matches!(tlv.record, FcRecord::Tail { .. }));
            encoded.clear();
            tlv.record.encode(&mut encoded);
            assert_eq!(encoded.len(), tlv.bytes.len(), "fast-commit record length");
            let again = fast_commit_records(&encoded, inode_size).next();
            assert_eq!(again.and_then(Result::ok).map(|t| t.record), Some(tlv.record));
            if !matches!(tlv.record, FcRecord::Pad { .. } | FcRecord::Tail { .. }) {
                assert_eq!(encoded, tlv.bytes, "fast-commit record bytes");
            }
        }
    }
    if let Ok(scan) = scan_fast_commit_area(area.chunks(block_size), inode_size, tid) {
        assert!(scan.records_valid <= scan.records.len(), "more valid records than records");
        assert!(scan.records.len() <= records_read, "the scan read records the walk did not");
        assert!(scan.commits <= tails, "more commits than tails");
        assert_eq!(scan.commits == 0, scan.records_valid == 0, "valid records without a commit");
    }
}
