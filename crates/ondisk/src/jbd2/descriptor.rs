//! Descriptor blocks: the tags that name the home block of each logged block, and the escaping
//! of logged blocks that happen to start with the JBD2 magic.
//!
//! A descriptor is `header | tag | uuid[16] | tag | tag | ... | [tail]`. The first tag is followed
//! by the journal UUID; every later tag sets `SAME_UUID` and omits it. The last tag sets
//! `LAST_TAG`. The logged blocks follow the descriptor in tag order.
//!
//! Flags are read and written as a `be16` at tag offset 6 for every layout, exactly as
//! `commit.c` and `recovery.c` do through `journal_block_tag_t`. For the 16-byte tag3 that is the
//! low half of its `be32 t_flags`; the high half is always zero.
//!
//! Escaping, and the order of operations on the writer's side:
//!
//! | step | writer (`push`)                               | reader (recovery)                        |
//! |------|-----------------------------------------------|------------------------------------------|
//! | 1    | first `be32` == magic → zero it, set `ESCAPE` | read the logged block                    |
//! | 2    | tag checksum over the *escaped* bytes         | verify the tag checksum over those bytes |
//! | 3    | write the escaped bytes to the log            | `ESCAPE` set → put the magic back        |
//!
//! Without escaping, recovery would take a logged copy of, say, a directory block that begins
//! with `0xC03B3998` for a journal header and end the log there.

use super::format::{write_block_tail, ChecksumVersion, LogFormat, TAG_UUID_SIZE};
use super::{
    check_log_block, encode_header, read_be16, read_be32, write_be16, write_be32, BlockType,
    JBD2_HEADER_SIZE, JBD2_MAGIC,
};
use crate::{OnDiskError, Tid};

const WHAT: &str = "journal descriptor block";

/// Tag flags (`JBD2_FLAG_*`).
pub mod tag_flag {
    /// The logged copy had its leading magic zeroed; restore it on replay.
    pub const ESCAPE: u16 = 1;
    /// No UUID follows this tag.
    pub const SAME_UUID: u16 = 2;
    /// Defined, never set by Linux.
    pub const DELETED: u16 = 4;
    /// The last tag of this descriptor.
    pub const LAST_TAG: u16 = 8;
}

/// One parsed tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DescriptorTag {
    /// File system block the logged block belongs to (`t_blocknr | t_blocknr_high << 32` when the
    /// journal is 64-bit; the high word is ignored otherwise, as the kernel ignores it).
    pub block: u64,
    pub flags: u16,
    /// As stored: 32 bits for v3, 16 bits for v2, 0 otherwise.
    pub checksum: u32,
}

impl DescriptorTag {
    pub fn is_escaped(&self) -> bool {
        self.flags & tag_flag::ESCAPE != 0
    }
    pub fn is_last(&self) -> bool {
        self.flags & tag_flag::LAST_TAG != 0
    }
    fn has_same_uuid(&self) -> bool {
        self.flags & tag_flag::SAME_UUID != 0
    }
}

/// Offsets inside one tag; see the layout table in `format.rs`.
const TAG_BLOCKNR: usize = 0;
const TAG_CHECKSUM16: usize = 4;
const TAG_FLAGS: usize = 6;
const TAG_BLOCKNR_HIGH: usize = 8;
const TAG3_CHECKSUM32: usize = 12;

/// Writes `tag` into `slot`, which is exactly `format.tag_bytes()` long and zeroed.
fn encode_tag(format: &LogFormat, slot: &mut [u8], tag: &DescriptorTag) {
    assert_eq!(slot.len(), format.tag_bytes());
    write_be32(slot, TAG_BLOCKNR, tag.block as u32);
    write_be16(slot, TAG_FLAGS, tag.flags);
    if format.is_64bit {
        write_be32(slot, TAG_BLOCKNR_HIGH, (tag.block >> 32) as u32);
    }
    match format.checksum {
        ChecksumVersion::V3 => write_be32(slot, TAG3_CHECKSUM32, tag.checksum),
        ChecksumVersion::V2 => write_be16(slot, TAG_CHECKSUM16, tag.checksum as u16),
        ChecksumVersion::None | ChecksumVersion::V1 => {}
    }
}

/// Reads a tag from `slot`; `None` if the slot is shorter than a tag.
fn decode_tag(format: &LogFormat, slot: &[u8]) -> Option<DescriptorTag> {
    let low = read_be32(slot, TAG_BLOCKNR)?;
    let high = if format.is_64bit { read_be32(slot, TAG_BLOCKNR_HIGH)? } else { 0 };
    let checksum = match format.checksum {
        ChecksumVersion::V3 => read_be32(slot, TAG3_CHECKSUM32)?,
        ChecksumVersion::V2 => u32::from(read_be16(slot, TAG_CHECKSUM16)?),
        ChecksumVersion::None | ChecksumVersion::V1 => 0,
    };
    Some(DescriptorTag {
        block: u64::from(low) | (u64::from(high) << 32),
        flags: read_be16(slot, TAG_FLAGS)?,
        checksum,
    })
}

/// Fills one descriptor block tag by tag, following `jbd2_journal_commit_transaction`.
pub struct DescriptorBuilder {
    format: LogFormat,
    tid: Tid,
    block: Vec<u8>,
    /// Where the next tag goes. Invariant: `offset_next <= block.len()`.
    offset_next: usize,
    /// Where the most recent tag starts, to set `LAST_TAG` on it in `finish`.
    offset_last: usize,
    tags_count: usize,
}

impl DescriptorBuilder {
    pub fn new(format: LogFormat, tid: Tid) -> Self {
        let mut block = vec![0u8; format.block_bytes()];
        encode_header(&mut block, BlockType::Descriptor, tid);
        DescriptorBuilder {
            format,
            tid,
            block,
            offset_next: JBD2_HEADER_SIZE,
            offset_last: JBD2_HEADER_SIZE,
            tags_count: 0,
        }
    }

    /// The kernel's rule: after a tag, close the descriptor once
    /// `space_left < tag_bytes + 16 + csum_size`.
    pub fn is_full(&self) -> bool {
        let space_left = self.block.len() - self.offset_next;
        let reserve = self.format.tag_bytes() + TAG_UUID_SIZE + self.format.tail_bytes();
        self.tags_count > 0 && space_left < reserve
    }

    pub fn is_empty(&self) -> bool {
        self.tags_count == 0
    }

    pub fn len(&self) -> usize {
        self.tags_count
    }

    /// Adds the tag for home block `home_block`; escapes `logged` in place if it begins with
    /// `JBD2_MAGIC` (returns true then); computes the tag checksum over the escaped bytes.
    pub fn push(&mut self, home_block: u64, logged: &mut [u8]) -> bool {
        let escaped = escape_block(logged);
        self.push_logged(home_block, logged, escaped);
        escaped
    }

    /// Adds the tag for a block that does not begin with `JBD2_MAGIC`, so it is logged as it
    /// is: the caller can write its own (shared, read-only) copy without making another.
    pub fn push_unescaped(&mut self, home_block: u64, logged: &[u8]) {
        assert!(
            logged.get(..4) != Some(&JBD2_MAGIC.to_be_bytes()[..]),
            "block {home_block} begins with the journal magic and must be escaped"
        );
        self.push_logged(home_block, logged, false);
    }

    fn push_logged(&mut self, home_block: u64, logged: &[u8], escaped: bool) {
        assert!(!self.is_full(), "descriptor block is full");
        assert_eq!(logged.len(), self.format.block_bytes(), "logged block has the wrong size");
        assert!(
            self.format.is_64bit || home_block <= u64::from(u32::MAX),
            "block {home_block} does not fit a journal without INCOMPAT_64BIT"
        );
        let mut flags = 0;
        if escaped {
            flags |= tag_flag::ESCAPE;
        }
        if self.tags_count > 0 {
            flags |= tag_flag::SAME_UUID;
        }
        let checksum = match self.format.checksum {
            ChecksumVersion::V2 | ChecksumVersion::V3 => self.format.tag_checksum(self.tid, logged),
            ChecksumVersion::None | ChecksumVersion::V1 => 0,
        };
        let tag = DescriptorTag { block: home_block, flags, checksum };
        let tag_bytes = self.format.tag_bytes();
        let slot = &mut self.block[self.offset_next..self.offset_next + tag_bytes];
        encode_tag(&self.format, slot, &tag);
        self.offset_last = self.offset_next;
        self.offset_next += tag_bytes;
        if self.tags_count == 0 {
            self.block[self.offset_next..self.offset_next + TAG_UUID_SIZE]
                .copy_from_slice(&self.format.uuid);
            self.offset_next += TAG_UUID_SIZE;
        }
        self.tags_count += 1;
        assert!(self.offset_next + self.format.tail_bytes() <= self.block.len());
    }

    /// Sets `LAST_TAG` on the last tag, writes the v2/v3 tail checksum, returns the block.
    pub fn finish(mut self) -> Vec<u8> {
        assert!(!self.is_empty(), "a descriptor block needs at least one tag");
        let flags_offset = self.offset_last + TAG_FLAGS;
        let flags = read_be16(&self.block, flags_offset).expect("tag lies inside the block");
        write_be16(&mut self.block, flags_offset, flags | tag_flag::LAST_TAG);
        write_block_tail(&self.format, &mut self.block);
        self.block
    }
}

/// Reads the tags of a descriptor block the way `count_tags` and `jbd2_do_replay` walk them:
/// skip the UUID after every tag without `SAME_UUID`, stop after `LAST_TAG` or when the next tag
/// would run into the tail. Does not verify the tail checksum (see [`super::verify_block_tail`]):
/// recovery treats a bad descriptor checksum differently in its scan pass.
pub fn parse_descriptor_tags(
    format: &LogFormat,
    block: &[u8],
) -> Result<Vec<DescriptorTag>, OnDiskError> {
    check_log_block(WHAT, format.block_size, block, BlockType::Descriptor)?;
    let tag_bytes = format.tag_bytes();
    let limit = block.len() - format.tail_bytes();
    let mut tags = Vec::with_capacity(format.tags_per_descriptor());
    let mut offset = JBD2_HEADER_SIZE;
    while offset + tag_bytes <= limit {
        let tag = block
            .get(offset..offset + tag_bytes)
            .and_then(|slot| decode_tag(format, slot))
            .ok_or_else(|| {
            OnDiskError::corrupted(WHAT, format!("tag at {offset} is cut off"))
        })?;
        tags.push(tag);
        offset += tag_bytes;
        if !tag.has_same_uuid() {
            offset += TAG_UUID_SIZE;
        }
        if tag.is_last() {
            break;
        }
    }
    Ok(tags)
}

/// Zeroes the leading magic of a block about to be logged; true if it did.
pub fn escape_block(logged: &mut [u8]) -> bool {
    if read_be32(logged, 0) == Some(JBD2_MAGIC) {
        logged[..4].fill(0);
        true
    } else {
        false
    }
}

/// Puts the magic back at the start of a logged block whose tag has `ESCAPE`.
pub fn unescape_block(logged: &mut [u8]) {
    assert!(logged.len() >= 4, "block too short to unescape");
    write_be32(logged, 0, JBD2_MAGIC);
}

/// `jbd2_block_tag_csum_verify`: compares the tag's checksum with the checksum of the logged
/// block as read from the log (still escaped). v3 compares 32 bits, v2 the low 16 bits
/// (`t_checksum == cpu_to_be16(csum32)`); without v2/v3 there is nothing to check.
pub fn tag_checksum_matches(
    format: &LogFormat,
    tid: Tid,
    tag: &DescriptorTag,
    logged: &[u8],
) -> bool {
    match format.checksum {
        ChecksumVersion::None | ChecksumVersion::V1 => true,
        _ if logged.len() != format.block_bytes() => false,
        ChecksumVersion::V3 => tag.checksum == format.tag_checksum(tid, logged),
        ChecksumVersion::V2 => tag.checksum == format.tag_checksum(tid, logged) & 0xFFFF,
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{all_formats, XorShift, UUID};
    use super::super::verify_block_tail;
    use super::*;

    fn data_block(format: &LogFormat, fill: u8) -> Vec<u8> {
        vec![fill; format.block_bytes()]
    }

    fn home_block(format: &LogFormat, index: usize) -> u64 {
        let base = if format.is_64bit { 0x0000_0007_0000_0000 } else { 0x8000_0000 };
        base + index as u64 * 3
    }

    #[test]
    fn descriptor_round_trips_for_every_tag_format() {
        for format in all_formats() {
            let tid = Tid(0xFFFF_FFF0);
            let mut builder = DescriptorBuilder::new(format, tid);
            let mut logged_blocks = Vec::new();
            for index in 0..5 {
                let mut logged = data_block(&format, index as u8 + 1);
                assert!(!builder.push(home_block(&format, index), &mut logged));
                logged_blocks.push(logged);
            }
            let block = builder.finish();
            assert!(verify_block_tail(&format, &block), "{format:?}");
            let tags = parse_descriptor_tags(&format, &block).unwrap();
            assert_eq!(tags.len(), 5, "{format:?}");
            for (index, tag) in tags.iter().enumerate() {
                assert_eq!(tag.block, home_block(&format, index));
                assert_eq!(tag.is_last(), index == 4);
                assert_eq!(tag.flags & tag_flag::SAME_UUID != 0, index > 0);
                assert!(!tag.is_escaped());
                assert!(tag_checksum_matches(&format, tid, tag, &logged_blocks[index]));
                match format.checksum {
                    ChecksumVersion::V2 => assert!(tag.checksum <= 0xFFFF),
                    ChecksumVersion::V3 => assert_ne!(tag.checksum, 0),
                    _ => assert_eq!(tag.checksum, 0),
                }
            }
            // The first tag is followed by the UUID.
            let uuid_at = JBD2_HEADER_SIZE + format.tag_bytes();
            assert_eq!(&block[uuid_at..uuid_at + 16], &UUID);
        }
    }

    #[test]
    fn descriptor_round_trips_with_escaped_block() {
        for format in all_formats() {
            let tid = Tid(42);
            let original = {
                let mut block = data_block(&format, 0xAB);
                block[..4].copy_from_slice(&JBD2_MAGIC.to_be_bytes());
                block
            };
            let mut logged = original.clone();
            let mut builder = DescriptorBuilder::new(format, tid);
            assert!(builder.push(17, &mut logged));
            assert_eq!(&logged[..4], &[0, 0, 0, 0]);
            assert_eq!(&logged[4..], &original[4..]);
            let tags = parse_descriptor_tags(&format, &builder.finish()).unwrap();
            assert_eq!(tags.len(), 1);
            assert!(tags[0].is_escaped() && tags[0].is_last());
            // The checksum covers the escaped copy, as it sits in the log.
            assert!(tag_checksum_matches(&format, tid, &tags[0], &logged));
            if format.checksum.has_block_checksums() {
                assert!(!tag_checksum_matches(&format, tid, &tags[0], &original));
            }
            unescape_block(&mut logged);
            assert_eq!(logged, original);
        }
    }

    #[test]
    fn escape_leaves_blocks_without_magic_alone() {
        let mut block = vec![0xC0, 0x3B, 0x39, 0x99, 1, 2];
        assert!(!escape_block(&mut block));
        assert_eq!(block, vec![0xC0, 0x3B, 0x39, 0x99, 1, 2]);
        let mut short = vec![0xC0, 0x3B, 0x39];
        assert!(!escape_block(&mut short));
    }

    #[test]
    fn tags_per_descriptor_agrees_with_builder() {
        for block_size in [1024u32, 2048, 4096, 65536] {
            for base in all_formats() {
                let format = LogFormat::new(block_size, base.checksum, base.is_64bit, UUID);
                let mut builder = DescriptorBuilder::new(format, Tid(1));
                let mut logged = data_block(&format, 0);
                let mut pushed = 0;
                while !builder.is_full() {
                    builder.push(pushed as u64, &mut logged);
                    pushed += 1;
                }
                assert_eq!(pushed, format.tags_per_descriptor(), "{format:?}");
                assert_eq!(builder.len(), pushed);
                let tags = parse_descriptor_tags(&format, &builder.finish()).unwrap();
                assert_eq!(tags.len(), pushed);
                assert!(tags.last().unwrap().is_last());
            }
        }
    }

    #[test]
    fn tag_checksum_corruption_is_detected() {
        for format in all_formats().into_iter().filter(|f| f.checksum.has_block_checksums()) {
            let tid = Tid(9);
            let mut logged = data_block(&format, 0x11);
            let mut builder = DescriptorBuilder::new(format, tid);
            builder.push(5, &mut logged);
            let block = builder.finish();
            let tag = parse_descriptor_tags(&format, &block).unwrap()[0];
            let mut damaged = logged.clone();
            damaged[format.block_bytes() / 2] ^= 0x10;
            assert!(!tag_checksum_matches(&format, tid, &tag, &damaged));
            assert!(!tag_checksum_matches(&format, Tid(10), &tag, &logged));
            assert!(!tag_checksum_matches(&format, tid, &tag, &logged[1..]));
            // A flipped bit in the descriptor itself breaks its tail.
            let mut damaged_descriptor = block.clone();
            damaged_descriptor[JBD2_HEADER_SIZE] ^= 0x01;
            assert!(!verify_block_tail(&format, &damaged_descriptor));
        }
    }

    #[test]
    fn v2_tag_stores_low_16_bits_of_the_checksum() {
        let format = LogFormat::new(1024, ChecksumVersion::V2, false, UUID);
        let mut logged = data_block(&format, 0x42);
        let full = format.tag_checksum(Tid(3), &logged);
        let mut builder = DescriptorBuilder::new(format, Tid(3));
        builder.push(1, &mut logged);
        let block = builder.finish();
        assert_eq!(read_be16(&block, JBD2_HEADER_SIZE + 4), Some(full as u16));
        assert_eq!(parse_descriptor_tags(&format, &block).unwrap()[0].checksum, full & 0xFFFF);
    }

    #[test]
    fn tag3_without_64bit_ignores_high_word_like_the_kernel() {
        let format = LogFormat::new(1024, ChecksumVersion::V3, false, UUID);
        let mut logged = data_block(&format, 0);
        let mut builder = DescriptorBuilder::new(format, Tid(1));
        builder.push(0xFFFF_FFFF, &mut logged);
        let mut block = builder.finish();
        write_be32(&mut block, JBD2_HEADER_SIZE + TAG_BLOCKNR_HIGH, 5);
        assert_eq!(parse_descriptor_tags(&format, &block).unwrap()[0].block, 0xFFFF_FFFF);
    }

    #[test]
    #[should_panic(expected = "does not fit a journal without INCOMPAT_64BIT")]
    fn builder_refuses_64bit_block_in_32bit_journal() {
        let format = LogFormat::new(1024, ChecksumVersion::None, false, UUID);
        let mut logged = data_block(&format, 0);
        DescriptorBuilder::new(format, Tid(1)).push(1 << 32, &mut logged);
    }

    #[test]
    fn parse_stops_when_space_runs_out_without_last_tag() {
        let format = LogFormat::new(1024, ChecksumVersion::None, false, UUID);
        let mut block = vec![0u8; 1024];
        encode_header(&mut block, BlockType::Descriptor, Tid(1));
        // All-zero tags: no SAME_UUID, so each is followed by 16 bytes; no LAST_TAG.
        let tags = parse_descriptor_tags(&format, &block).unwrap();
        assert_eq!(tags.len(), (1024 - 12) / (8 + 16) + usize::from((1024 - 12) % 24 >= 8));
    }

    #[test]
    fn parse_rejects_truncated_or_mistyped_blocks() {
        let format = LogFormat::new(1024, ChecksumVersion::V3, true, UUID);
        let mut logged = data_block(&format, 0);
        let mut builder = DescriptorBuilder::new(format, Tid(1));
        builder.push(1, &mut logged);
        let block = builder.finish();
        assert!(matches!(
            parse_descriptor_tags(&format, &block[..512]),
            Err(OnDiskError::Corrupted { .. })
        ));
        let mut commit_typed = block.clone();
        write_be32(&mut commit_typed, 4, BlockType::Commit as u32);
        assert!(parse_descriptor_tags(&format, &commit_typed).is_err());
        let mut no_magic = block;
        no_magic[0] = 0;
        assert!(parse_descriptor_tags(&format, &no_magic).is_err());
    }

    #[test]
    fn garbage_descriptor_blocks_never_panic() {
        let seed = 0x5EED_DE5C_u64;
        println!("garbage_descriptor_blocks_never_panic seed={seed:#x}");
        let mut rng = XorShift::new(seed);
        let formats = all_formats();
        for round in 0..3000 {
            let format = formats[rng.below(formats.len())];
            let length = match rng.below(4) {
                0 => rng.below(format.block_bytes() + 8),
                _ => format.block_bytes(),
            };
            let mut block = vec![0u8; length];
            rng.fill(&mut block);
            if length >= JBD2_HEADER_SIZE && rng.below(2) == 0 {
                encode_header(&mut block, BlockType::Descriptor, Tid(round));
            }
            if let Ok(tags) = parse_descriptor_tags(&format, &block) {
                assert!(tags.len() <= format.block_bytes() / format.tag_bytes());
                for tag in &tags {
                    let _ = tag_checksum_matches(&format, Tid(round), tag, &block);
                }
            }
            let _ = verify_block_tail(&format, &block);
            let _ = escape_block(&mut block);
        }
    }
}
