//! Group descriptors and bitmaps derived from the plan, and the superblock's fields.

use super::*;

/// A group's block bitmap and inode bitmap blocks to write (`None` while uninitialized).
pub(super) type GroupBitmaps = (Option<Vec<u8>>, Option<Vec<u8>>);

/// Descriptor and bitmap contents, derived from the planner's used-block set.
pub(super) struct Layout {
    pub(super) descs: Vec<GroupDesc>,
    pub(super) bitmaps: Vec<GroupBitmaps>,
    pub(super) free_blocks: u64,
    pub(super) free_inodes: u32,
}

impl Layout {
    pub(super) fn compute(planner: &Planner, device_zeroed: bool) -> Layout {
        let g = &planner.g;
        let bs = g.block_size as usize;
        let csum = g.group_desc_csum();
        let mut descs = Vec::with_capacity(g.groups as usize);
        let mut bitmaps = Vec::with_capacity(g.groups as usize);
        let mut free_blocks = 0u64;
        let mut free_inodes = 0u32;
        let ipg = g.inodes_per_group;
        for (i, state) in planner.groups.iter().enumerate() {
            let group = i as u32;
            let first = g.group_first(group);
            let nblocks = g.group_blocks(group);
            let group_free = nblocks - planner.used.count_in(first, first + nblocks);
            free_blocks += group_free;
            let used_inodes: Vec<u32> = planner
                .inodes_used
                .iter()
                .filter(|&&ino| (ino - 1) / ipg == group)
                .map(|&ino| (ino - 1) % ipg)
                .collect();
            let group_free_inodes = ipg - used_inodes.len() as u32;
            free_inodes += group_free_inodes;
            let block_bitmap = (!csum || !state.block_uninit).then(|| {
                let mut bm = vec![0xFFu8; bs];
                bm[..g.bitmap_bytes_blocks()].fill(0);
                for (s, e) in planner.used.overlapping(first, first + nblocks) {
                    set_bits(&mut bm, (s - first) as usize, (e - first) as usize);
                }
                if group == g.groups - 1 {
                    let nbits = ((g.blocks_count - g.first_data_block)
                        % u64::from(g.blocks_per_group)) as usize;
                    if nbits != 0 {
                        set_bits(&mut bm, nbits, bs * 8);
                    }
                }
                bm
            });
            let inode_bitmap = (!csum || !state.inode_uninit).then(|| {
                let mut bm = vec![0xFFu8; bs];
                bm[..g.bitmap_bytes_inodes()].fill(0);
                for &index in &used_inodes {
                    set_bits(&mut bm, index as usize, index as usize + 1);
                }
                bm
            });
            let mut flags = 0;
            if csum && state.block_uninit {
                flags |= ext4::BG_BLOCK_UNINIT;
            }
            if csum && state.inode_uninit {
                flags |= ext4::BG_INODE_UNINIT;
            }
            if device_zeroed {
                flags |= ext4::BG_INODE_ZEROED;
            }
            descs.push(GroupDesc {
                block_bitmap: state.block_bitmap,
                inode_bitmap: state.inode_bitmap,
                inode_table: state.inode_table,
                free_blocks: group_free as u32,
                free_inodes: group_free_inodes,
                used_dirs: state.used_dirs,
                itable_unused: if csum { state.itable_unused } else { 0 },
                flags,
                checksum: 0,
                block_bitmap_csum: 0,
                inode_bitmap_csum: 0,
            });
            bitmaps.push((block_bitmap, inode_bitmap));
        }
        Layout { descs, bitmaps, free_blocks, free_inodes }
    }
}

pub(super) fn set_bits(bitmap: &mut [u8], from: usize, to: usize) {
    let mut bit = from;
    while bit < to && !bit.is_multiple_of(8) {
        bitmap[bit / 8] |= 1 << (bit % 8);
        bit += 1;
    }
    if bit + 8 <= to {
        let whole = (to - bit) / 8;
        bitmap[bit / 8..bit / 8 + whole].fill(0xFF);
        bit += whole * 8;
    }
    while bit < to {
        bitmap[bit / 8] |= 1 << (bit % 8);
        bit += 1;
    }
}

/// Offsets of the superblock fields mke2fs sets (`struct ext4_super_block`).
pub(super) mod sb_off {
    pub const INODES_COUNT: usize = 0x0;
    pub const BLOCKS_COUNT_LO: usize = 0x4;
    pub const R_BLOCKS_COUNT_LO: usize = 0x8;
    pub const FREE_BLOCKS_COUNT_LO: usize = 0xC;
    pub const FREE_INODES_COUNT: usize = 0x10;
    pub const FIRST_DATA_BLOCK: usize = 0x14;
    pub const LOG_BLOCK_SIZE: usize = 0x18;
    pub const LOG_CLUSTER_SIZE: usize = 0x1C;
    pub const BLOCKS_PER_GROUP: usize = 0x20;
    pub const CLUSTERS_PER_GROUP: usize = 0x24;
    pub const INODES_PER_GROUP: usize = 0x28;
    pub const WTIME: usize = 0x30;
    pub const MAX_MNT_COUNT: usize = 0x36;
    pub const MAGIC: usize = 0x38;
    pub const STATE: usize = 0x3A;
    pub const ERRORS: usize = 0x3C;
    pub const LASTCHECK: usize = 0x40;
    pub const CREATOR_OS: usize = 0x48;
    pub const REV_LEVEL: usize = 0x4C;
    pub const FIRST_INO: usize = 0x54;
    pub const INODE_SIZE: usize = 0x58;
    pub const BLOCK_GROUP_NR: usize = 0x5A;
    pub const FEATURE_COMPAT: usize = 0x5C;
    pub const FEATURE_INCOMPAT: usize = 0x60;
    pub const FEATURE_RO_COMPAT: usize = 0x64;
    pub const UUID: usize = 0x68;
    pub const VOLUME_NAME: usize = 0x78;
    pub const RESERVED_GDT_BLOCKS: usize = 0xCE;
    pub const JOURNAL_INUM: usize = 0xE0;
    pub const HASH_SEED: usize = 0xEC;
    pub const DEF_HASH_VERSION: usize = 0xFC;
    pub const JNL_BACKUP_TYPE: usize = 0xFD;
    pub const DESC_SIZE: usize = 0xFE;
    pub const DEFAULT_MOUNT_OPTS: usize = 0x100;
    pub const MKFS_TIME: usize = 0x108;
    pub const JNL_BLOCKS: usize = 0x10C;
    pub const BLOCKS_COUNT_HI: usize = 0x150;
    pub const R_BLOCKS_COUNT_HI: usize = 0x154;
    pub const FREE_BLOCKS_COUNT_HI: usize = 0x158;
    pub const MIN_EXTRA_ISIZE: usize = 0x15C;
    pub const WANT_EXTRA_ISIZE: usize = 0x15E;
    pub const FLAGS: usize = 0x160;
    pub const LOG_GROUPS_PER_FLEX: usize = 0x174;
    pub const CHECKSUM_TYPE: usize = 0x175;
    pub const KBYTES_WRITTEN: usize = 0x178;
    pub const OVERHEAD_CLUSTERS: usize = 0x248;
    pub const CHECKSUM_SEED: usize = 0x270;
    pub const ORPHAN_FILE_INUM: usize = 0x280;
    pub const CHECKSUM: usize = 0x3FC;
}

/// Everything the primary superblock records.
pub(super) struct SuperblockFields<'a> {
    pub(super) g: &'a Geometry,
    pub(super) features: Features,
    pub(super) layout: &'a Layout,
    pub(super) uuid: [u8; 16],
    pub(super) hash_seed: [u8; 16],
    pub(super) label: &'a str,
    pub(super) now: u64,
    pub(super) overhead: u64,
    /// The journal inode's `i_block` and size, copied into `s_jnl_blocks`.
    pub(super) journal_root: Option<([u8; ext4::INODE_BLOCK_SIZE], u64)>,
    pub(super) orphan_ino: u32,
}

impl SuperblockFields<'_> {
    pub(super) fn encode(&self) -> Vec<u8> {
        use sb_off::*;
        let g = self.g;
        let mut b = vec![0u8; ext4::SUPERBLOCK_SIZE];
        let put16 =
            |b: &mut [u8], off: usize, v: u16| b[off..off + 2].copy_from_slice(&v.to_le_bytes());
        let put32 =
            |b: &mut [u8], off: usize, v: u32| b[off..off + 4].copy_from_slice(&v.to_le_bytes());
        let is_64bit = self.features.incompat(feature::INCOMPAT_64BIT);
        let put64 = |b: &mut [u8], lo: usize, hi: usize, v: u64| {
            b[lo..lo + 4].copy_from_slice(&(v as u32).to_le_bytes());
            if is_64bit {
                b[hi..hi + 4].copy_from_slice(&((v >> 32) as u32).to_le_bytes());
            }
        };
        put32(&mut b, INODES_COUNT, g.inodes_per_group * g.groups);
        put64(&mut b, BLOCKS_COUNT_LO, BLOCKS_COUNT_HI, g.blocks_count);
        put64(&mut b, R_BLOCKS_COUNT_LO, R_BLOCKS_COUNT_HI, g.reserved_blocks);
        put64(&mut b, FREE_BLOCKS_COUNT_LO, FREE_BLOCKS_COUNT_HI, self.layout.free_blocks);
        put32(&mut b, FREE_INODES_COUNT, self.layout.free_inodes);
        put32(&mut b, FIRST_DATA_BLOCK, g.first_data_block as u32);
        put32(&mut b, LOG_BLOCK_SIZE, g.log_block_size);
        put32(&mut b, LOG_CLUSTER_SIZE, g.log_block_size);
        put32(&mut b, BLOCKS_PER_GROUP, g.blocks_per_group);
        put32(&mut b, CLUSTERS_PER_GROUP, g.blocks_per_group);
        put32(&mut b, INODES_PER_GROUP, g.inodes_per_group);
        let now = self.now as u32;
        put32(&mut b, WTIME, now);
        put16(&mut b, MAX_MNT_COUNT, 0xFFFF);
        put16(&mut b, MAGIC, ext4::EXT4_MAGIC);
        put16(&mut b, STATE, ext4::STATE_VALID_FS);
        put16(&mut b, ERRORS, 1);
        put32(&mut b, LASTCHECK, now);
        put32(&mut b, CREATOR_OS, ext4::CREATOR_OS_LINUX);
        put32(&mut b, REV_LEVEL, 1);
        put32(&mut b, sb_off::FIRST_INO, self::FIRST_INO);
        put16(&mut b, INODE_SIZE, g.inode_size);
        let mut compat = self.features.compat;
        if self.journal_root.is_none() {
            compat &= !feature::COMPAT_HAS_JOURNAL;
        }
        put32(&mut b, FEATURE_COMPAT, compat);
        put32(&mut b, FEATURE_INCOMPAT, self.features.incompat);
        put32(&mut b, FEATURE_RO_COMPAT, self.features.ro_compat);
        b[UUID..UUID + 16].copy_from_slice(&self.uuid);
        b[VOLUME_NAME..VOLUME_NAME + self.label.len()].copy_from_slice(self.label.as_bytes());
        put16(&mut b, RESERVED_GDT_BLOCKS, g.reserved_gdt_blocks as u16);
        b[HASH_SEED..HASH_SEED + 16].copy_from_slice(&self.hash_seed);
        b[DEF_HASH_VERSION] = HASH_HALF_MD4;
        if let Some((root, size)) = &self.journal_root {
            put32(&mut b, JOURNAL_INUM, JOURNAL_INO);
            b[JNL_BLOCKS..JNL_BLOCKS + ext4::INODE_BLOCK_SIZE].copy_from_slice(root);
            put32(&mut b, JNL_BLOCKS + 15 * 4, (size >> 32) as u32);
            put32(&mut b, JNL_BLOCKS + 16 * 4, *size as u32);
            b[JNL_BACKUP_TYPE] = JNL_BACKUP_BLOCKS;
        }
        put16(&mut b, DESC_SIZE, if is_64bit { g.desc_size } else { 0 });
        put32(&mut b, sb_off::DEFAULT_MOUNT_OPTS, self::DEFAULT_MOUNT_OPTS);
        put32(&mut b, MKFS_TIME, now);
        if g.inode_size > ext4::INODE_SIZE_MIN {
            put16(&mut b, MIN_EXTRA_ISIZE, EXTRA_ISIZE);
            put16(&mut b, WANT_EXTRA_ISIZE, EXTRA_ISIZE);
        }
        let signed_char = std::ffi::c_char::MIN != 0;
        put32(&mut b, FLAGS, if signed_char { FLAGS_SIGNED_HASH } else { FLAGS_UNSIGNED_HASH });
        if g.flex_size > 0 {
            b[LOG_GROUPS_PER_FLEX] = GROUPS_PER_FLEX_LOG as u8;
        }
        if self.features.ro_compat(feature::RO_COMPAT_METADATA_CSUM) {
            b[CHECKSUM_TYPE] = ext4::CHECKSUM_TYPE_CRC32C;
        }
        put32(&mut b, KBYTES_WRITTEN, 1);
        put32(&mut b, OVERHEAD_CLUSTERS, self.overhead as u32);
        if self.features.incompat(feature::INCOMPAT_CSUM_SEED) {
            put32(&mut b, CHECKSUM_SEED, crc32c_raw(!0, &self.uuid));
        }
        put32(&mut b, ORPHAN_FILE_INUM, self.orphan_ino);
        let crc = crc32c_raw(!0, &b[..CHECKSUM]);
        put32(&mut b, CHECKSUM, crc);
        b
    }
}

/// Recomputes `s_checksum` of raw superblock bytes edited after encoding.
pub(super) fn reseal_superblock(sb: &Superblock, raw: &mut [u8]) {
    if sb.has_metadata_csum() {
        let crc = crc32c_raw(!0, &raw[..sb_off::CHECKSUM]);
        raw[sb_off::CHECKSUM..sb_off::CHECKSUM + 4].copy_from_slice(&crc.to_le_bytes());
    }
}
