//! ext4 on-disk structures, read side: superblock, group descriptors, inodes, extent-tree
//! nodes, and the checksums that protect them.
//!
//! Layouts follow `Documentation/filesystems/ext4/*.rst`, `fs/ext4/ext4.h`,
//! `fs/ext4/ext4_extents.h` and e2fsprogs `lib/ext2fs/ext2_fs.h`; every multi-byte field is
//! little-endian and read or written explicitly so. Nothing here performs I/O: callers hand
//! in the bytes they read, and the `fs` crate decides where to read them from.
//!
//! Invariants kept by every function in this module:
//! - Bytes are untrusted. Parsers return [`OnDiskError::Corrupted`] (or `Unsupported`) and never
//!   panic or index out of bounds, whatever the input; the randomized tests below hold them to it.
//! - Checksum predicates (`*_checksum_ok`) return `false` for input too short to hold the
//!   checksum, and `true` when the file system defines no checksum for that structure.
//! - A validated [`Superblock`] guarantees the geometry the other parsers and the `fs` layer
//!   compute with (block size, group sizes, inode size, descriptor size), so that arithmetic
//!   cannot divide by zero or overflow.
//!
//! [`OnDiskError::Corrupted`]: crate::OnDiskError::Corrupted

pub mod acl;
pub(crate) mod bytes;
pub mod dir;
mod extent;
pub mod feature;
mod group_desc;
pub mod htree;
pub mod iflags;
pub mod inline;
mod inode;
pub mod mmp;
pub mod quota;
mod superblock;
pub mod xattr;

pub(crate) use extent::decode_extent;
pub use extent::{
    extent_block_checksum_ok, parse_extent_node, Extent, ExtentEntries, ExtentHeader, ExtentIndex,
    EXTENT_DEPTH_MAX, EXTENT_ENTRY_SIZE, EXTENT_HEADER_SIZE, EXTENT_LEN_INIT_MAX, EXTENT_MAGIC,
    EXTENT_TAIL_SIZE,
};
pub use group_desc::{
    bitmap_checksum, crc16, group_desc_checksum, group_desc_checksum_ok, set_group_desc_checksum,
    GroupDesc, BG_BLOCK_UNINIT, BG_INODE_UNINIT, BG_INODE_ZEROED,
};
pub use inode::{
    inode_checksum_ok, inode_csum_seed, set_inode_checksum, Inode, Timestamp, EA_INODE_FL,
    EXTENTS_FL, HUGE_FILE_FL, INDEX_FL, INLINE_DATA_FL, INODE_BLOCK_SIZE, JOURNAL_INO, MODE_BLKDEV,
    MODE_CHRDEV, MODE_DIR, MODE_FIFO, MODE_REGULAR, MODE_SOCKET, MODE_SYMLINK, MODE_TYPE_MASK,
    ROOT_INO,
};
pub use superblock::{
    error_code, error_code_of_errno, set_superblock_checksum, ErrorRecord, Superblock,
    CHECKSUM_TYPE_CRC32C, CREATOR_OS_LINUX, DESC_SIZE_MAX, DESC_SIZE_MIN, DESC_SIZE_MIN_64BIT,
    ERROR_FUNC_LEN, ERROR_RECORD_RANGE, EXT4_MAGIC, FIRST_INO_MIN, INODE_SIZE_MIN,
    LOG_BLOCK_SIZE_MAX, STATE_ERROR_FS, STATE_FC_REPLAY, STATE_VALID_FS, SUPERBLOCK_OFFSET,
    SUPERBLOCK_SIZE,
};

#[cfg(test)]
mod hostile_input_tests {
    //! Random and mutated bytes fed to every parser: any outcome but a panic is acceptable.

    use super::*;
    use crate::testing::Rng;

    /// Flips a few random bytes of `bytes`, sometimes to the extreme values parsers trip on.
    fn mutate(rng: &mut Rng, bytes: &mut [u8]) {
        for _ in 0..=rng.below(4) {
            let at = rng.below(bytes.len() as u64) as usize;
            bytes[at] = match rng.below(3) {
                0 => 0,
                1 => 0xFF,
                _ => rng.next() as u8,
            };
        }
    }

    /// Every read-side entry point on `bytes`, with the superblock `sb` for checksums.
    fn exercise(sb: &Superblock, bytes: &[u8]) {
        let _ = Superblock::parse(bytes);
        let _ = GroupDesc::parse(bytes, sb.desc_size());
        let _ = GroupDesc::parse(bytes, 32);
        let _ = group_desc_checksum_ok(sb, 3, bytes);
        let _ = Inode::parse(bytes);
        let _ = inode_checksum_ok(sb, 8, bytes);
        let _ = parse_extent_node(bytes);
        let _ = extent_block_checksum_ok(sb, 8, 1, bytes);
    }

    #[test]
    fn random_bytes_never_panic_any_parser() {
        let mut rng = Rng::from_env("hostile input");
        let sb = superblock::tests::sample();
        for _ in 0..4000 {
            let len = rng.below(1100) as usize;
            let mut bytes = vec![0u8; len];
            rng.fill(&mut bytes);
            // Give the magic-gated parsers a chance to get past their first check.
            if len >= 2 && rng.below(2) == 0 {
                bytes[..2].copy_from_slice(&EXTENT_MAGIC.to_le_bytes());
            }
            if len >= 0x3A && rng.below(2) == 0 {
                bytes[0x38..0x3A].copy_from_slice(&EXT4_MAGIC.to_le_bytes());
            }
            exercise(&sb, &bytes);
        }
    }

    #[test]
    fn mutated_valid_structures_never_panic_any_parser() {
        let mut rng = Rng::from_env("hostile input");
        let sb = superblock::tests::sample();
        let valid_sb = superblock::tests::sample_raw();
        let valid_inode = inode::tests::sample_raw(&sb, 8);
        let mut valid_node = vec![0u8; 4096];
        extent::tests::header(&mut valid_node, 2, 340, 1);
        extent::tests::put_index(&mut valid_node, 0, 0, 100);
        extent::tests::put_index(&mut valid_node, 1, 5000, 200);
        for _ in 0..3000 {
            let mut bytes = match rng.below(3) {
                0 => valid_sb.to_vec(),
                1 => valid_inode.clone(),
                _ => valid_node.clone(),
            };
            mutate(&mut rng, &mut bytes);
            exercise(&sb, &bytes);
            // Superblocks that still parse must keep their arithmetic panic-free too.
            if let Ok(parsed) = Superblock::parse(&bytes) {
                let _ = (parsed.block_size(), parsed.group_count(), parsed.group_desc_blocks());
                for nr in 0..parsed.group_desc_blocks().min(4) {
                    let _ = parsed.group_desc_block(nr);
                }
                let _ = parsed.encode();
            }
        }
    }

    #[test]
    fn resealed_mutated_superblocks_never_panic_and_always_reencode_identically() {
        // Mutations get past the checksum here, so the geometry checks do the rejecting.
        let mut rng = Rng::from_env("hostile input");
        for _ in 0..3000 {
            let mut raw = superblock::tests::sample_raw();
            mutate(&mut rng, &mut raw[..0x3FC]);
            set_superblock_checksum(&mut raw);
            if let Ok(sb) = Superblock::parse(&raw) {
                let _ = (sb.block_size(), sb.group_count(), sb.group_desc_blocks(), sb.csum_seed());
                for nr in 0..sb.group_desc_blocks().min(4) {
                    let _ = sb.group_desc_block(nr);
                }
                assert_eq!(sb.encode(), raw.to_vec());
            }
        }
    }
}
