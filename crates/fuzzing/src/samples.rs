//! Valid ext4 superblocks for the checksum functions the targets call: every combination of the
//! features those functions look at, chosen by one configuration byte.
//!
//! | bits of the byte | meaning                                                        |
//! |------------------|----------------------------------------------------------------|
//! | 0-1              | descriptor checksums: 0 none, 1 gdt_csum, 2 metadata_csum, 3 both |
//! | 2                | 64bit (64-byte descriptors)                                      |
//! | 3                | 4 KiB blocks (else 1 KiB)                                        |
//! | 4-5              | inode size 128 << n (128, 256, 512 or 1024)                      |
//! | 6                | metadata_csum_seed (`s_checksum_seed` instead of the UUID's crc)  |
//! | 7                | creator OS FreeBSD (inode checksums are then skipped)            |

use std::sync::OnceLock;

use ondisk::ext4::{feature, set_superblock_checksum, Superblock};

/// The UUID of every sample (and of the images and journals the seeds come from).
pub const UUID: [u8; 16] = *b"quill-fuzz-uuid!";

/// The superblock of configuration `config` (see the module documentation).
pub fn superblock(config: u8) -> &'static Superblock {
    static ALL: OnceLock<Vec<Superblock>> = OnceLock::new();
    &ALL.get_or_init(|| (0..=255).map(build).collect())[usize::from(config)]
}

fn put16(raw: &mut [u8], at: usize, value: u16) {
    raw[at..at + 2].copy_from_slice(&value.to_le_bytes());
}

fn put32(raw: &mut [u8], at: usize, value: u32) {
    raw[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

fn build(config: u8) -> Superblock {
    let mut raw = [0u8; 1024];
    let big_blocks = config & 0x08 != 0;
    let (log_block_size, blocks, per_group, first_data_block): (u32, u32, u32, u32) =
        if big_blocks { (2, 65536, 32768, 0) } else { (0, 16384, 8192, 1) };
    let inodes_per_group = 2048u32;
    let groups = (blocks - first_data_block).div_ceil(per_group);
    put32(&mut raw, 0x0, groups * inodes_per_group);
    put32(&mut raw, 0x4, blocks);
    put32(&mut raw, 0x14, first_data_block);
    put32(&mut raw, 0x18, log_block_size);
    put32(&mut raw, 0x1C, log_block_size);
    put32(&mut raw, 0x20, per_group);
    put32(&mut raw, 0x24, per_group);
    put32(&mut raw, 0x28, inodes_per_group);
    put16(&mut raw, 0x38, 0xEF53);
    put16(&mut raw, 0x3A, 1);
    put32(&mut raw, 0x48, if config & 0x80 != 0 { 3 } else { 0 });
    put32(&mut raw, 0x4C, 1);
    put32(&mut raw, 0x54, 11);
    let inode_size = 128u16 << ((config >> 4) & 3);
    put16(&mut raw, 0x58, inode_size);
    let mut incompat = feature::INCOMPAT_FILETYPE | feature::INCOMPAT_EXTENTS;
    let mut ro_compat = feature::RO_COMPAT_SPARSE_SUPER | feature::RO_COMPAT_EXTRA_ISIZE;
    if config & 0x01 != 0 {
        ro_compat |= feature::RO_COMPAT_GDT_CSUM;
    }
    if config & 0x02 != 0 {
        ro_compat |= feature::RO_COMPAT_METADATA_CSUM;
        raw[0x175] = 1;
    }
    if config & 0x04 != 0 {
        incompat |= feature::INCOMPAT_64BIT;
        put16(&mut raw, 0xFE, 64);
    }
    if config & 0x40 != 0 {
        incompat |= feature::INCOMPAT_CSUM_SEED;
        put32(&mut raw, 0x270, 0x5EED_0001);
    }
    put32(&mut raw, 0x5C, feature::COMPAT_DIR_INDEX | feature::COMPAT_EXT_ATTR);
    put32(&mut raw, 0x60, incompat);
    put32(&mut raw, 0x64, ro_compat);
    raw[0x68..0x78].copy_from_slice(&UUID);
    put32(&mut raw, 0xEC, 0x0123_4567);
    raw[0xFC] = 1;
    put16(&mut raw, 0x15C, 32);
    set_superblock_checksum(&mut raw);
    Superblock::parse(&raw)
        .unwrap_or_else(|e| panic!("sample superblock {config:#04x} does not parse: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_configuration_parses_with_the_features_it_names() {
        for config in 0..=255u8 {
            let sb = superblock(config);
            assert_eq!(sb.has_gdt_csum(), config & 1 != 0);
            assert_eq!(sb.has_metadata_csum(), config & 2 != 0);
            assert_eq!(sb.desc_size(), if config & 4 != 0 { 64 } else { 32 });
            assert_eq!(sb.block_size(), if config & 8 != 0 { 4096 } else { 1024 });
            assert_eq!(sb.group_count(), 2);
        }
    }
}
