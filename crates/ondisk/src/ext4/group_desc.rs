//! Block group descriptors (`struct ext4_group_desc`) and their checksums.
//!
//! A descriptor is 32 bytes without the 64bit feature and `s_desc_size` (64..=1024) with it;
//! only then do the `_hi` halves exist. Two checksums exist, both stored in the 16-bit
//! `bg_checksum` at 0x1E and both covering le32(group number) and the descriptor with the
//! checksum field skipped:
//!
//! | feature        | algorithm                                       | seed               |
//! |----------------|--------------------------------------------------|--------------------|
//! | metadata_csum  | crc32c, low 16 bits                              | `csum_seed()`      |
//! | gdt_csum       | crc16 (Linux `crc16`, poly 0x8005 reflected), uuid first | 0xFFFF     |
//! | neither        | none                                             |                    |

use super::bytes::{le16, le32, put_le16, put_le32};
use super::superblock::{Superblock, DESC_SIZE_MAX, DESC_SIZE_MIN, DESC_SIZE_MIN_64BIT};
use crate::crc::crc32c_raw;
use crate::OnDiskError;

/// `bg_flags`: inode table and bitmap not initialized (lazy init).
pub const BG_INODE_UNINIT: u16 = 0x1;
/// `bg_flags`: block bitmap not initialized.
pub const BG_BLOCK_UNINIT: u16 = 0x2;
/// `bg_flags`: inode table has been zeroed.
pub const BG_INODE_ZEROED: u16 = 0x4;

mod off {
    pub const BLOCK_BITMAP_LO: usize = 0x0;
    pub const INODE_BITMAP_LO: usize = 0x4;
    pub const INODE_TABLE_LO: usize = 0x8;
    pub const FREE_BLOCKS_LO: usize = 0xC;
    pub const FREE_INODES_LO: usize = 0xE;
    pub const USED_DIRS_LO: usize = 0x10;
    pub const FLAGS: usize = 0x12;
    pub const BLOCK_BITMAP_CSUM_LO: usize = 0x18;
    pub const INODE_BITMAP_CSUM_LO: usize = 0x1A;
    pub const ITABLE_UNUSED_LO: usize = 0x1C;
    pub const CHECKSUM: usize = 0x1E;
    pub const BLOCK_BITMAP_HI: usize = 0x20;
    pub const INODE_BITMAP_HI: usize = 0x24;
    pub const INODE_TABLE_HI: usize = 0x28;
    pub const FREE_BLOCKS_HI: usize = 0x2C;
    pub const FREE_INODES_HI: usize = 0x2E;
    pub const USED_DIRS_HI: usize = 0x30;
    pub const ITABLE_UNUSED_HI: usize = 0x32;
    pub const BLOCK_BITMAP_CSUM_HI: usize = 0x38;
    pub const INODE_BITMAP_CSUM_HI: usize = 0x3A;
}

/// One decoded group descriptor; `_hi` halves are included when the descriptor has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupDesc {
    pub block_bitmap: u64,
    pub inode_bitmap: u64,
    pub inode_table: u64,
    pub free_blocks: u32,
    pub free_inodes: u32,
    pub used_dirs: u32,
    /// Inodes at the end of the group's table that were never used (and may never have been
    /// initialized); meaningful only when group descriptors are checksummed.
    pub itable_unused: u32,
    pub flags: u16,
    pub checksum: u16,
    /// crc32c of the block bitmap (metadata_csum); only the low 16 bits on 32-byte descriptors.
    pub block_bitmap_csum: u32,
    /// crc32c of the inode bitmap (metadata_csum); only the low 16 bits on 32-byte descriptors.
    pub inode_bitmap_csum: u32,
}

impl GroupDesc {
    /// Decodes the first `desc_size` bytes of `bytes` (use [`Superblock::desc_size`]).
    pub fn parse(bytes: &[u8], desc_size: usize) -> Result<Self, OnDiskError> {
        let size_ok = desc_size == usize::from(DESC_SIZE_MIN)
            || (desc_size >= usize::from(DESC_SIZE_MIN_64BIT)
                && desc_size <= usize::from(DESC_SIZE_MAX)
                && desc_size.is_power_of_two());
        if !size_ok {
            return Err(OnDiskError::corrupted(
                "group descriptor",
                format!("descriptor size {desc_size}"),
            ));
        }
        let Some(b) = bytes.get(..desc_size) else {
            return Err(OnDiskError::corrupted(
                "group descriptor",
                format!("{} bytes, need {desc_size}", bytes.len()),
            ));
        };
        let wide = desc_size >= usize::from(DESC_SIZE_MIN_64BIT);
        let hi16 = |off: usize| if wide { le16(b, off) } else { 0 };
        let hi32 = |off: usize| if wide { le32(b, off) } else { 0 };
        let join16 = |lo: usize, hi: usize| u32::from(le16(b, lo)) | (u32::from(hi16(hi)) << 16);
        Ok(GroupDesc {
            block_bitmap: u64::from(le32(b, off::BLOCK_BITMAP_LO))
                | (u64::from(hi32(off::BLOCK_BITMAP_HI)) << 32),
            inode_bitmap: u64::from(le32(b, off::INODE_BITMAP_LO))
                | (u64::from(hi32(off::INODE_BITMAP_HI)) << 32),
            inode_table: u64::from(le32(b, off::INODE_TABLE_LO))
                | (u64::from(hi32(off::INODE_TABLE_HI)) << 32),
            free_blocks: join16(off::FREE_BLOCKS_LO, off::FREE_BLOCKS_HI),
            free_inodes: join16(off::FREE_INODES_LO, off::FREE_INODES_HI),
            used_dirs: join16(off::USED_DIRS_LO, off::USED_DIRS_HI),
            itable_unused: join16(off::ITABLE_UNUSED_LO, off::ITABLE_UNUSED_HI),
            flags: le16(b, off::FLAGS),
            checksum: le16(b, off::CHECKSUM),
            block_bitmap_csum: join16(off::BLOCK_BITMAP_CSUM_LO, off::BLOCK_BITMAP_CSUM_HI),
            inode_bitmap_csum: join16(off::INODE_BITMAP_CSUM_LO, off::INODE_BITMAP_CSUM_HI),
        })
    }

    /// Writes every field over the first `desc_size` bytes of `raw` (the high halves only when
    /// the descriptor is 64 bytes or more). The checksum field is written as stored in `self`;
    /// call [`set_group_desc_checksum`] afterwards.
    pub fn encode_into(&self, raw: &mut [u8], desc_size: usize) {
        assert!(raw.len() >= desc_size && desc_size >= usize::from(DESC_SIZE_MIN));
        let wide = desc_size >= usize::from(DESC_SIZE_MIN_64BIT);
        let mut put64 = |lo: usize, hi: usize, v: u64| {
            put_le32(raw, lo, v as u32);
            if wide {
                put_le32(raw, hi, (v >> 32) as u32);
            }
        };
        put64(off::BLOCK_BITMAP_LO, off::BLOCK_BITMAP_HI, self.block_bitmap);
        put64(off::INODE_BITMAP_LO, off::INODE_BITMAP_HI, self.inode_bitmap);
        put64(off::INODE_TABLE_LO, off::INODE_TABLE_HI, self.inode_table);
        let mut put32 = |lo: usize, hi: usize, v: u32| {
            put_le16(raw, lo, v as u16);
            if wide {
                put_le16(raw, hi, (v >> 16) as u16);
            }
        };
        put32(off::FREE_BLOCKS_LO, off::FREE_BLOCKS_HI, self.free_blocks);
        put32(off::FREE_INODES_LO, off::FREE_INODES_HI, self.free_inodes);
        put32(off::USED_DIRS_LO, off::USED_DIRS_HI, self.used_dirs);
        put32(off::ITABLE_UNUSED_LO, off::ITABLE_UNUSED_HI, self.itable_unused);
        put32(off::BLOCK_BITMAP_CSUM_LO, off::BLOCK_BITMAP_CSUM_HI, self.block_bitmap_csum);
        put32(off::INODE_BITMAP_CSUM_LO, off::INODE_BITMAP_CSUM_HI, self.inode_bitmap_csum);
        put_le16(raw, off::FLAGS, self.flags);
        put_le16(raw, off::CHECKSUM, self.checksum);
    }
}

/// The checksum a bitmap carries in its group descriptor (`ext4_block_bitmap_csum_set`,
/// `ext4_inode_bitmap_csum_set`): crc32c seeded with the file system's seed over the bitmap's
/// meaningful bytes (`blocks_per_group / 8` or `inodes_per_group / 8`). Only the low 16 bits
/// are stored on 32-byte descriptors.
pub fn bitmap_checksum(sb: &Superblock, bitmap: &[u8]) -> u32 {
    crc32c_raw(sb.csum_seed(), bitmap)
}

/// The descriptor checksum of `desc` for group `group`, or `None` when the file system
/// defines none (`ext4_group_desc_csum`).
pub fn group_desc_checksum(sb: &Superblock, group: u32, desc: &[u8]) -> Option<u16> {
    let desc = desc.get(..sb.desc_size())?;
    let le_group = group.to_le_bytes();
    let after_checksum = off::CHECKSUM + 2;
    if sb.has_metadata_csum() {
        let mut crc = crc32c_raw(sb.csum_seed(), &le_group);
        crc = crc32c_raw(crc, &desc[..off::CHECKSUM]);
        crc = crc32c_raw(crc, &[0, 0]);
        crc = crc32c_raw(crc, &desc[after_checksum..]);
        return Some(crc as u16);
    }
    if sb.has_gdt_csum() {
        let mut crc = crc16(!0, &sb.uuid);
        crc = crc16(crc, &le_group);
        crc = crc16(crc, &desc[..off::CHECKSUM]);
        if sb.is_64bit() {
            crc = crc16(crc, &desc[after_checksum..]);
        }
        return Some(crc);
    }
    None
}

/// Stores the descriptor checksum of group `group` into `desc` (no-op without one).
pub fn set_group_desc_checksum(sb: &Superblock, group: u32, desc: &mut [u8]) {
    if let Some(crc) = group_desc_checksum(sb, group, desc) {
        put_le16(desc, off::CHECKSUM, crc);
    }
}

/// Whether `raw_desc` (the on-disk bytes of group `group`'s descriptor) carries a valid
/// checksum: `ext4_group_desc_csum_verify`. True when the file system defines no descriptor
/// checksum; false when `raw_desc` is shorter than a descriptor.
pub fn group_desc_checksum_ok(sb: &Superblock, group: u32, raw_desc: &[u8]) -> bool {
    let Some(desc) = raw_desc.get(..sb.desc_size()) else {
        return false;
    };
    group_desc_checksum(sb, group, desc).is_none_or(|crc| crc == le16(desc, off::CHECKSUM))
}

const fn crc16_table() -> [u16; 256] {
    // Linux lib/crc16.c: CRC-16 with polynomial x^16 + x^15 + x^2 + 1 (0x8005), bit-reflected
    // (0xA001), no final inversion.
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u16;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xA001 } else { crc >> 1 };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
}

static CRC16_TABLE: [u16; 256] = crc16_table();

/// Linux `crc16(crc, data)`, as gdt_csum uses it.
pub fn crc16(seed: u16, data: &[u8]) -> u16 {
    data.iter().fold(seed, |crc, &byte| {
        (crc >> 8) ^ CRC16_TABLE[usize::from((crc ^ u16::from(byte)) as u8)]
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ext4::bytes::put_le16;
    use crate::ext4::superblock::tests::sample;

    #[test]
    fn crc16_matches_the_modbus_check_value() {
        // CRC-16/MODBUS (poly 0x8005 reflected, init 0xFFFF, no xorout) of "123456789".
        assert_eq!(crc16(0xFFFF, b"123456789"), 0x4B37);
        // CRC-16/ARC is the same with init 0.
        assert_eq!(crc16(0, b"123456789"), 0xBB3D);
    }

    fn sample_desc() -> Vec<u8> {
        let mut d = vec![0u8; 64];
        d[0..4].copy_from_slice(&1234u32.to_le_bytes());
        d[0x20..0x24].copy_from_slice(&1u32.to_le_bytes());
        d[8..12].copy_from_slice(&77u32.to_le_bytes());
        put_le16(&mut d, 0x0C, 100);
        put_le16(&mut d, 0x2C, 2);
        put_le16(&mut d, 0x12, BG_INODE_ZEROED);
        d
    }

    #[test]
    fn wide_descriptor_joins_high_halves_and_narrow_one_ignores_them() {
        let d = sample_desc();
        let wide = GroupDesc::parse(&d, 64).unwrap();
        assert_eq!(wide.block_bitmap, (1 << 32) | 1234);
        assert_eq!(wide.inode_table, 77);
        assert_eq!(wide.free_blocks, (2 << 16) | 100);
        assert_eq!(wide.flags, BG_INODE_ZEROED);
        let narrow = GroupDesc::parse(&d, 32).unwrap();
        assert_eq!(narrow.block_bitmap, 1234);
        assert_eq!(narrow.free_blocks, 100);
        assert!(GroupDesc::parse(&d, 48).is_err());
        assert!(GroupDesc::parse(&d[..40], 64).is_err());
    }

    #[test]
    fn encoded_descriptor_round_trips_and_seals() {
        let sb = sample();
        let desc = GroupDesc::parse(&sample_desc(), 64).unwrap();
        let mut raw = vec![0u8; 64];
        desc.encode_into(&mut raw, 64);
        assert_eq!(GroupDesc::parse(&raw, 64).unwrap(), desc);
        set_group_desc_checksum(&sb, 3, &mut raw);
        assert!(group_desc_checksum_ok(&sb, 3, &raw));
    }

    #[test]
    fn metadata_csum_descriptor_checksum_is_verified_per_group() {
        let sb = sample();
        let mut d = sample_desc();
        let mut crc = crc32c_raw(sb.csum_seed(), &5u32.to_le_bytes());
        crc = crc32c_raw(crc, &d[..0x1E]);
        crc = crc32c_raw(crc, &[0, 0]);
        crc = crc32c_raw(crc, &d[0x20..64]);
        put_le16(&mut d, 0x1E, crc as u16);
        assert!(group_desc_checksum_ok(&sb, 5, &d));
        // The group number is part of the checksum: the same bytes fail for another group.
        assert!(!group_desc_checksum_ok(&sb, 6, &d));
        d[0x21] ^= 1;
        assert!(!group_desc_checksum_ok(&sb, 5, &d));
        assert!(!group_desc_checksum_ok(&sb, 5, &d[..63]));
    }
}
