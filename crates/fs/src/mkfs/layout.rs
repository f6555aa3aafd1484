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
        // With bigalloc the bitmaps and the descriptors' counts are in clusters
        // (`fix_cluster_bg_counts`), the superblock's free count in blocks.
        let bits = g.cluster_bits;
        for (i, state) in planner.groups.iter().enumerate() {
            let group = i as u32;
            let first = g.group_first(group);
            let nblocks = g.group_blocks(group);
            let group_free_blocks = nblocks - planner.used.count_in(first, first + nblocks);
            free_blocks += group_free_blocks;
            let group_free = group_free_blocks >> bits;
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
                    let (s, e) = ((s - first) >> bits, (e - first).div_ceil(1 << bits));
                    set_bits(&mut bm, s as usize, e as usize);
                }
                if group == g.groups - 1 {
                    let nbits = ((g.blocks_count - g.first_data_block)
                        % u64::from(g.blocks_per_group))
                        >> bits;
                    if nbits != 0 {
                        set_bits(&mut bm, nbits as usize, bs * 8);
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
    pub(super) mmp_block: Option<u64>,
    /// The user, group and project quota inodes (0 for none).
    pub(super) quota_inums: [u32; 3],
}

impl SuperblockFields<'_> {
    /// The primary superblock as mke2fs fills it in (`ext2fs_initialize` and mke2fs's
    /// `PRS`), encoded by ondisk's [`Superblock`].
    pub(super) fn encode(&self) -> Vec<u8> {
        let g = self.g;
        let mut sb = Superblock::blank();
        let now = self.now as u32;
        sb.inodes_count = g.inodes_per_group * g.groups;
        sb.blocks_count = g.blocks_count;
        sb.r_blocks_count = g.reserved_blocks;
        sb.free_blocks_count = self.layout.free_blocks;
        sb.free_inodes_count = self.layout.free_inodes;
        sb.first_data_block = g.first_data_block as u32;
        sb.log_block_size = g.log_block_size;
        sb.log_cluster_size = g.log_block_size + g.cluster_bits;
        sb.blocks_per_group = g.blocks_per_group;
        sb.clusters_per_group = g.blocks_per_group >> g.cluster_bits;
        sb.inodes_per_group = g.inodes_per_group;
        sb.wtime = now;
        sb.max_mnt_count = 0xFFFF;
        sb.state = ext4::STATE_VALID_FS;
        sb.errors = 1;
        sb.lastcheck = now;
        sb.creator_os = ext4::CREATOR_OS_LINUX;
        sb.rev_level = 1;
        sb.first_ino = FIRST_INO;
        sb.inode_size = g.inode_size;
        sb.feature_compat = self.features.compat;
        if self.journal_root.is_none() {
            sb.feature_compat &= !feature::COMPAT_HAS_JOURNAL;
        }
        sb.feature_incompat = self.features.incompat;
        sb.feature_ro_compat = self.features.ro_compat;
        sb.uuid = self.uuid;
        sb.volume_name[..self.label.len()].copy_from_slice(self.label.as_bytes());
        sb.reserved_gdt_blocks = g.reserved_gdt_blocks as u16;
        for (word, bytes) in sb.hash_seed.iter_mut().zip(self.hash_seed.chunks_exact(4)) {
            *word = u32::from_le_bytes(bytes.try_into().expect("four bytes"));
        }
        sb.def_hash_version = HASH_HALF_MD4;
        if let Some((root, size)) = &self.journal_root {
            sb.journal_inum = JOURNAL_INO;
            for (word, bytes) in sb.jnl_blocks.iter_mut().zip(root.chunks_exact(4)) {
                *word = u32::from_le_bytes(bytes.try_into().expect("four bytes"));
            }
            sb.jnl_blocks[15] = (size >> 32) as u32;
            sb.jnl_blocks[16] = *size as u32;
            sb.jnl_backup_type = JNL_BACKUP_BLOCKS;
        }
        let is_64bit = self.features.incompat(feature::INCOMPAT_64BIT);
        sb.desc_size = if is_64bit { g.desc_size } else { 0 };
        sb.default_mount_opts = DEFAULT_MOUNT_OPTS;
        sb.mkfs_time = now;
        if g.inode_size > ext4::INODE_SIZE_MIN {
            sb.min_extra_isize = EXTRA_ISIZE;
            sb.want_extra_isize = EXTRA_ISIZE;
        }
        let signed_char = std::ffi::c_char::MIN != 0;
        sb.flags = if signed_char { FLAGS_SIGNED_HASH } else { FLAGS_UNSIGNED_HASH };
        if g.flex_size > 0 {
            sb.log_groups_per_flex = GROUPS_PER_FLEX_LOG as u8;
        }
        if self.features.ro_compat(feature::RO_COMPAT_METADATA_CSUM) {
            sb.checksum_type = ext4::CHECKSUM_TYPE_CRC32C;
        }
        sb.kbytes_written = 1;
        sb.overhead_clusters = self.overhead as u32;
        if self.features.incompat(feature::INCOMPAT_CSUM_SEED) {
            sb.checksum_seed = crc32c_raw(!0, &self.uuid);
        }
        sb.orphan_file_inum = self.orphan_ino;
        sb.quota_inums = self.quota_inums;
        if let Some(block) = self.mmp_block {
            sb.mmp_block = block;
            sb.mmp_update_interval = MMP_UPDATE_INTERVAL;
        }
        sb.encode()
    }
}
