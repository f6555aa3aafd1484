//! The sizes mke2fs settles on before it allocates anything: block and inode counts, groups,
//! descriptor and reserved GDT blocks, the journal's size (`PRS` and `ext2fs_initialize`).

use super::*;

/// The sizes mke2fs settles on before it allocates anything (`PRS` and `ext2fs_initialize`).
#[derive(Debug, Clone)]
pub(super) struct Geometry {
    pub(super) block_size: u32,
    pub(super) log_block_size: u32,
    pub(super) first_data_block: u64,
    pub(super) blocks_count: u64,
    pub(super) blocks_per_group: u32,
    /// log2 of the blocks per cluster (bigalloc; 0 otherwise).
    pub(super) cluster_bits: u32,
    pub(super) inodes_per_group: u32,
    pub(super) inode_blocks_per_group: u64,
    pub(super) inode_size: u16,
    pub(super) groups: u32,
    pub(super) desc_size: u16,
    pub(super) desc_blocks: u64,
    pub(super) reserved_gdt_blocks: u32,
    pub(super) reserved_blocks: u64,
    pub(super) features: Features,
    /// Groups per flex group, 0 without flex_bg.
    pub(super) flex_size: u32,
    /// The journal inode's size in blocks: the log and, with fast_commit, its area.
    pub(super) journal_blocks: u32,
    pub(super) fast_commit_blocks: u32,
    pub(super) orphan_blocks: u32,
}

impl Geometry {
    pub(super) fn plan(opts: &MkfsOptions, device_bytes: u64) -> Result<Geometry> {
        let bs = opts.block_size;
        if !bs.is_power_of_two() || !(BLOCK_SIZE_MIN..=BLOCK_SIZE_MAX).contains(&bs) {
            return Err(invalid(format!("block size {bs} is not a power of two in 1024..=65536")));
        }
        let isz = opts.inode_size;
        if !isz.is_power_of_two() || isz < ext4::INODE_SIZE_MIN || u32::from(isz) > bs {
            return Err(invalid(format!("inode size {isz} is not a power of two in 128..={bs}")));
        }
        if !(0.0..=RESERVED_PERCENT_MAX).contains(&opts.reserved_percent) {
            return Err(invalid(format!(
                "reserved blocks percentage {} is outside 0..=50",
                opts.reserved_percent
            )));
        }
        if opts.label.len() > LABEL_BYTES_MAX {
            return Err(invalid(format!(
                "label '{}' is longer than {LABEL_BYTES_MAX} bytes",
                opts.label
            )));
        }
        let bs64 = u64::from(bs);
        let blocks_param = match opts.size_bytes {
            Some(bytes) => {
                if bytes > device_bytes {
                    return Err(FsError::DeviceTooSmall { fs_bytes: bytes, device_bytes });
                }
                bytes / bs64
            }
            None => {
                let blocks = device_bytes / bs64;
                if PAGE_SIZE_ASSUMED > bs64 {
                    blocks & !(PAGE_SIZE_ASSUMED / bs64 - 1)
                } else {
                    blocks
                }
            }
        };
        let features = Self::plan_features(opts.features, blocks_param, bs)?;
        let cluster_bits = Self::plan_cluster(opts, features)?;
        if features.ro_compat(feature::RO_COMPAT_PROJECT) && isz == ext4::INODE_SIZE_MIN {
            // As mke2fs: i_projid needs the large inode's extra fields.
            return Err(invalid(format!("{isz} byte inodes are too small for project quota")));
        }
        if features.incompat(feature::INCOMPAT_INLINE_DATA) && isz == ext4::INODE_SIZE_MIN {
            // As mke2fs: system.data lives in the large inode's xattr area.
            return Err(invalid(format!(
                "{isz} byte inodes are too small for inline data; specify larger size"
            )));
        }
        let inodes_param = Self::plan_inodes(opts, blocks_param, bs64 << cluster_bits)?;
        let reserved_param = (opts.reserved_percent * blocks_param as f64 / 100.0) as u64;
        let mut geometry =
            Self::initialize(opts, features, cluster_bits, blocks_param, inodes_param)?;
        geometry.reserved_blocks = geometry.reserve(reserved_param, blocks_param);
        (geometry.journal_blocks, geometry.fast_commit_blocks) =
            geometry.plan_journal(opts.journal_blocks, opts.fast_commit_blocks)?;
        geometry.orphan_blocks = geometry.plan_orphan_file();
        Ok(geometry)
    }

    /// mke2fs's feature checks and silent adjustments.
    pub(super) fn plan_features(mut f: Features, blocks: u64, bs: u32) -> Result<Features> {
        if f.incompat(feature::INCOMPAT_CSUM_SEED) && !f.ro_compat(feature::RO_COMPAT_METADATA_CSUM)
        {
            return Err(invalid("the metadata_csum_seed feature requires metadata_csum".into()));
        }
        if f.ro_compat(feature::RO_COMPAT_METADATA_CSUM) {
            f.ro_compat &= !feature::RO_COMPAT_GDT_CSUM;
        }
        if f.compat(feature::COMPAT_RESIZE_INODE) && f.incompat(feature::INCOMPAT_META_BG) {
            return Err(invalid("the resize_inode and meta_bg features are not compatible".into()));
        }
        if f.compat(feature::COMPAT_RESIZE_INODE) && !f.ro_compat(feature::RO_COMPAT_SPARSE_SUPER) {
            return Err(invalid(
                "reserved online resize blocks (resize_inode) need sparse_super".into(),
            ));
        }
        if f.compat(feature::COMPAT_ORPHAN_FILE) && !f.compat(feature::COMPAT_HAS_JOURNAL) {
            return Err(invalid("the orphan_file feature requires has_journal".into()));
        }
        if f.incompat(feature::INCOMPAT_64BIT) && !f.incompat(feature::INCOMPAT_EXTENTS) {
            // mke2fs: "Extents MUST be enabled for a 64-bit filesystem."
            return Err(invalid("the 64bit feature requires extent".into()));
        }
        if f.compat(feature::COMPAT_ORPHAN_FILE) && !f.incompat(feature::INCOMPAT_EXTENTS) {
            return Err(FsError::Unsupported(
                "quill mkfs makes the orphan file extent-mapped only: orphan_file needs extent"
                    .into(),
            ));
        }
        if blocks > u64::from(u32::MAX) {
            if !f.incompat(feature::INCOMPAT_64BIT) {
                return Err(invalid(format!(
                    "{blocks} blocks do not fit 32-bit block numbers; enable 64bit"
                )));
            }
            f.compat &= !feature::COMPAT_RESIZE_INODE;
        }
        let log_bits = bs.trailing_zeros() + 3 + 32;
        if log_bits < 64 && blocks > (1u64 << log_bits) - 1 {
            return Err(invalid(format!("{blocks} blocks of {bs} bytes are too many groups")));
        }
        Ok(f)
    }

    /// log2 of the blocks per cluster: `-C` (16 blocks by default) with bigalloc, which needs
    /// extents; 0 without it, where `-C` is refused as mke2fs refuses it.
    pub(super) fn plan_cluster(opts: &MkfsOptions, f: Features) -> Result<u32> {
        let bs = opts.block_size;
        if !f.ro_compat(feature::RO_COMPAT_BIGALLOC) {
            return match opts.cluster_size {
                Some(_) => {
                    Err(invalid("specifying a cluster size requires the bigalloc feature".into()))
                }
                None => Ok(0),
            };
        }
        if !f.incompat(feature::INCOMPAT_EXTENTS) {
            return Err(invalid("can't support bigalloc feature without extents feature".into()));
        }
        let cluster = opts.cluster_size.unwrap_or(bs * 16);
        if !cluster.is_power_of_two() || cluster < bs {
            return Err(invalid(format!(
                "cluster size {cluster} is not a power of two at least the block size {bs}"
            )));
        }
        let bits = (cluster / bs).trailing_zeros();
        // The kernel caps a cluster at 2^16 blocks (and mke2fs's log field at 2^29 KiB).
        if bits > 16 || cluster.trailing_zeros() - 10 > 29 {
            return Err(invalid(format!("cluster size {cluster} is too large")));
        }
        Ok(bits)
    }

    /// The inode count mke2fs asks `ext2fs_initialize` for (`cluster`: the cluster size in
    /// bytes, which a default ratio is never below).
    pub(super) fn plan_inodes(opts: &MkfsOptions, blocks: u64, cluster: u64) -> Result<u32> {
        let bs = opts.block_size;
        let ratio = match opts.inode_ratio {
            Some(ratio) if !(INODE_RATIO_MIN..=INODE_RATIO_MAX).contains(&ratio) => {
                return Err(invalid(format!(
                    "bytes per inode {ratio} is outside {INODE_RATIO_MIN}..={INODE_RATIO_MAX}"
                )));
            }
            Some(ratio) => ratio,
            None => usage_type_inode_ratio(blocks, bs).max(bs).max(cluster as u32),
        };
        let bytes = blocks * u64::from(bs);
        let mut inodes = bytes / u64::from(ratio);
        if inodes > u64::from(u32::MAX) {
            if !opts.features.incompat(feature::INCOMPAT_64BIT) {
                return Err(invalid(format!("too many inodes ({inodes}); raise the inode ratio")));
            }
            inodes = u64::from(u32::MAX);
        }
        if inodes * u64::from(opts.inode_size) >= bytes {
            return Err(invalid(format!(
                "{inodes} inodes of {} bytes do not fit {blocks} blocks; raise the inode ratio",
                opts.inode_size
            )));
        }
        Ok(inodes as u32)
    }

    /// `ext2fs_initialize`: groups, inodes per group, reserved GDT blocks, and trimming a last
    /// group too small for its own metadata.
    pub(super) fn initialize(
        opts: &MkfsOptions,
        mut features: Features,
        cluster_bits: u32,
        blocks_param: u64,
        inodes_param: u32,
    ) -> Result<Geometry> {
        let bs = opts.block_size;
        let bs64 = u64::from(bs);
        let isz = u64::from(opts.inode_size);
        let bigalloc = cluster_bits > 0;
        // s_log_cluster_size is 0 only for 1 KiB blocks without bigalloc.
        let first_data_block = u64::from(bs == BLOCK_SIZE_MIN && !bigalloc);
        let desc_size: u16 = if features.incompat(feature::INCOMPAT_64BIT) { 64 } else { 32 };
        let descs_per_block = bs64 / u64::from(desc_size);
        let addr_per_block = bs / 4;
        // With bigalloc a group has a bitmap block's worth of clusters.
        let clusters_per_group = (bs * 8).min(BLOCKS_PER_GROUP_MAX);
        let bpg_wide = u64::from(clusters_per_group) << cluster_bits;
        let mut blocks_per_group = u32::try_from(bpg_wide)
            .map_err(|_| invalid(format!("{bpg_wide} blocks per group are too many")))?;
        let blocks_param = blocks_param & !((1u64 << cluster_bits) - 1);
        let mut blocks = blocks_param;
        let inodes_wanted = inodes_param.max(FIRST_INO + 1);
        let sparse = features.ro_compat(feature::RO_COMPAT_SPARSE_SUPER);
        // Each pass either settles the geometry or shrinks something; the limit only guards
        // against a bug turning this into an endless loop.
        for _ in 0..GEOMETRY_PASSES_MAX {
            if blocks <= first_data_block {
                return Err(too_small(blocks_param, bs));
            }
            let bpg = u64::from(blocks_per_group);
            let groups = (blocks - first_data_block).div_ceil(bpg);
            let groups = u32::try_from(groups)
                .map_err(|_| invalid(format!("{groups} block groups are too many")))?;
            let desc_blocks = u64::from(groups).div_ceil(descs_per_block);
            let mut ipg = u64::from(inodes_wanted).div_ceil(u64::from(groups));
            if ipg > bs64 * 8 {
                if !bigalloc && blocks_per_group >= 256 {
                    blocks_per_group -= 8;
                    blocks = blocks_param;
                    continue;
                }
                return Err(invalid("too many inodes for the block groups".into()));
            }
            let ipg_max = 65536 - bs64 / isz;
            ipg = ipg.min(ipg_max);
            let (inodes_per_group, inode_blocks_per_group) = loop {
                let mut per_group = (ipg * isz).div_ceil(bs64) * bs64 / isz;
                per_group = per_group.max(8) & !7;
                if per_group * u64::from(groups) > u64::from(u32::MAX) {
                    ipg -= 1;
                    continue;
                }
                break (per_group, (per_group * isz).div_ceil(bs64));
            };
            let mut reserved_gdt_blocks = if features.compat(feature::COMPAT_RESIZE_INODE) {
                reserved_gdt_blocks(blocks, first_data_block, bpg, descs_per_block, desc_blocks)
                    .min(u64::from(addr_per_block))
            } else {
                0
            };
            if reserved_gdt_blocks + desc_blocks > bpg * 3 / 4 {
                // As ext2fs_initialize: the table would take most of a group, so it is spread
                // over the groups (meta_bg) and no room is reserved for growing it.
                features.incompat |= feature::INCOMPAT_META_BG;
                features.compat &= !feature::COMPAT_RESIZE_INODE;
                reserved_gdt_blocks = 0;
            }
            let table_overhead =
                if features.incompat(feature::INCOMPAT_META_BG) { 1 } else { desc_blocks };
            if 3 + inode_blocks_per_group + reserved_gdt_blocks + table_overhead > bpg {
                return Err(invalid(format!(
                    "{inodes_per_group} inodes per group do not fit a group; raise the inode ratio"
                )));
            }
            let mut last_overhead = 2 + inode_blocks_per_group;
            if group_has_super(groups - 1, sparse) {
                last_overhead += 1 + desc_blocks + reserved_gdt_blocks;
            }
            let rem = (blocks - first_data_block) % bpg;
            if groups == 1 && rem != 0 && rem < last_overhead {
                return Err(too_small(blocks_param, bs));
            }
            if rem != 0 && rem < last_overhead + 50 {
                blocks -= rem;
                continue;
            }
            return Ok(Geometry {
                block_size: bs,
                log_block_size: bs.trailing_zeros() - 10,
                first_data_block,
                blocks_count: blocks,
                blocks_per_group,
                cluster_bits,
                inodes_per_group: inodes_per_group as u32,
                inode_blocks_per_group,
                inode_size: opts.inode_size,
                groups,
                desc_size,
                desc_blocks,
                reserved_gdt_blocks: reserved_gdt_blocks as u32,
                reserved_blocks: 0,
                features,
                flex_size: if features.incompat(feature::INCOMPAT_FLEX_BG) {
                    1 << GROUPS_PER_FLEX_LOG
                } else {
                    0
                },
                journal_blocks: 0,
                fast_commit_blocks: 0,
                orphan_blocks: 0,
            });
        }
        Err(invalid(format!("no usable geometry for {blocks_param} blocks of {bs} bytes")))
    }

    /// Blocks reserved for root: the requested share of the requested size, scaled to the
    /// trimmed size as `ext2fs_initialize` does.
    pub(super) fn reserve(&self, reserved_param: u64, blocks_param: u64) -> u64 {
        if self.blocks_count == blocks_param {
            return reserved_param;
        }
        let ratio = 100.0 * reserved_param as f64 / blocks_param as f64;
        (ratio * self.blocks_count as f64 / 100.0) as u64
    }

    /// `figure_journal_size`: the log's default size for the file system or the requested one,
    /// and with fast_commit the area's (a 64th of the log by default). Returns (journal inode
    /// blocks, of which fast-commit blocks). As in mke2fs, the total is checked only when a
    /// size was requested, and a requested area rounds down to whole blocks (possibly 0: the
    /// journal then carves JBD2's default 256 blocks out of the log).
    pub(super) fn plan_journal(
        &mut self,
        requested: Option<u32>,
        requested_fc: Option<u32>,
    ) -> Result<(u32, u32)> {
        if !self.features.compat(feature::COMPAT_HAS_JOURNAL) {
            return Ok((0, 0));
        }
        let fast_commit = self.features.compat(feature::COMPAT_FAST_COMMIT);
        let log = match requested {
            Some(blocks) => blocks,
            None => {
                let blocks = default_journal_blocks(self.blocks_count);
                if blocks == 0 {
                    // mke2fs: "Filesystem too small for a journal", and carries on without one.
                    self.features.compat &= !feature::COMPAT_HAS_JOURNAL;
                    self.features.compat &= !feature::COMPAT_ORPHAN_FILE;
                    return Ok((0, 0));
                }
                blocks
            }
        };
        let fc = match (fast_commit, requested_fc) {
            (false, _) => 0,
            (true, Some(blocks)) => blocks,
            (true, None) => log / FAST_COMMIT_RATIO,
        };
        if requested.is_none() && !(fast_commit && requested_fc.is_some()) {
            return Ok((log + fc, fc));
        }
        let blocks = u64::from(log) + u64::from(fc);
        if !(u64::from(JOURNAL_BLOCKS_MIN)..=u64::from(JOURNAL_BLOCKS_MAX)).contains(&blocks) {
            return Err(invalid(format!(
                "a journal of {blocks} blocks is outside {JOURNAL_BLOCKS_MIN}..={JOURNAL_BLOCKS_MAX}"
            )));
        }
        if blocks > self.initial_free_blocks() / 2 {
            return Err(invalid(format!(
                "a journal of {blocks} blocks is too big for {} blocks",
                self.blocks_count
            )));
        }
        Ok((blocks as u32, fc))
    }

    /// `ext2fs_default_orphan_file_blocks`; with bigalloc the file fills its last cluster
    /// (mke2fs makes 76 blocks of 75 with 4-block clusters).
    pub(super) fn plan_orphan_file(&self) -> u32 {
        if !self.features.compat(feature::COMPAT_ORPHAN_FILE) {
            return 0;
        }
        let blocks = match self.blocks_count {
            b if b < 128 * 1024 => 32,
            b if b < 2 * 1024 * 1024 => (b / 4096) as u32,
            _ => 512,
        };
        blocks.next_multiple_of(self.cluster_blocks() as u32)
    }

    /// The superblock's free count right after `ext2fs_initialize`.
    pub(super) fn initial_free_blocks(&self) -> u64 {
        (0..self.groups).map(|g| self.initial_group_free(g)).sum()
    }

    pub(super) fn initial_group_free(&self, group: u32) -> u64 {
        let mut used = self.super_and_gdt_blocks(group);
        if self.flex_size == 0 {
            used += 2 + self.inode_blocks_per_group;
        }
        self.group_blocks(group).saturating_sub(used)
    }

    pub(super) fn csum(&self) -> bool {
        self.features.ro_compat(feature::RO_COMPAT_METADATA_CSUM)
    }

    pub(super) fn group_desc_csum(&self) -> bool {
        self.csum() || self.features.ro_compat(feature::RO_COMPAT_GDT_CSUM)
    }

    pub(super) fn has_super(&self, group: u32) -> bool {
        group_has_super(group, self.features.ro_compat(feature::RO_COMPAT_SPARSE_SUPER))
    }

    pub(super) fn group_first(&self, group: u32) -> u64 {
        self.first_data_block + u64::from(group) * u64::from(self.blocks_per_group)
    }

    pub(super) fn group_blocks(&self, group: u32) -> u64 {
        let end =
            (self.group_first(group) + u64::from(self.blocks_per_group)).min(self.blocks_count);
        end - self.group_first(group)
    }

    pub(super) fn group_last(&self, group: u32) -> u64 {
        self.group_first(group) + self.group_blocks(group) - 1
    }

    pub(super) fn group_of(&self, block: u64) -> u32 {
        ((block - self.first_data_block) / u64::from(self.blocks_per_group)) as u32
    }

    /// Blocks a group's superblock backup and descriptor copies (with the reserved GDT
    /// blocks) occupy: `used_blks` of `ext2fs_super_and_bgd_loc2`.
    /// Blocks at the start of `group` holding a superblock copy and descriptor blocks (and
    /// the reserved ones): the whole table after every superblock copy, or with meta_bg one
    /// descriptor block in the first, second and last group of each meta group
    /// (`ext2fs_super_and_bgd_loc2`; quill's meta_bg starts at group 0).
    pub(super) fn super_and_gdt_blocks(&self, group: u32) -> u64 {
        let has_super = u64::from(self.has_super(group));
        if self.features.incompat(feature::INCOMPAT_META_BG) {
            return has_super + u64::from(self.holds_meta_bg_descriptors(group));
        }
        if has_super == 1 {
            1 + self.desc_blocks + u64::from(self.reserved_gdt_blocks)
        } else {
            0
        }
    }

    /// Descriptors per table block.
    pub(super) fn descs_per_block(&self) -> u32 {
        self.block_size / u32::from(self.desc_size)
    }

    /// With meta_bg: whether `group` is the first, second or last group of its meta group,
    /// which hold copies of the meta group's descriptor block.
    pub(super) fn holds_meta_bg_descriptors(&self, group: u32) -> bool {
        let per_block = self.descs_per_block();
        let index = group % per_block;
        index == 0 || index == 1 || index == per_block - 1
    }

    pub(super) fn bitmap_bytes_blocks(&self) -> usize {
        (self.blocks_per_group >> self.cluster_bits) as usize / 8
    }

    /// Blocks per cluster (1 without bigalloc).
    pub(super) fn cluster_blocks(&self) -> u64 {
        1 << self.cluster_bits
    }

    /// The block holding `group`'s superblock copy: its first, but with 1 KiB blocks and
    /// bigalloc (first data block 0) group 0's is block 1, after the boot block.
    pub(super) fn superblock_block(&self, group: u32) -> u64 {
        let boot_block = group == 0 && self.first_data_block == 0 && self.block_size == 1024;
        self.group_first(group) + u64::from(boot_block)
    }

    pub(super) fn bitmap_bytes_inodes(&self) -> usize {
        self.inodes_per_group as usize / 8
    }
}

/// Bound on the retries of [`Geometry::initialize`]: each either lowers blocks per group by 8
/// (at most 8192 times) or trims the last group (once per blocks-per-group value).
pub(super) const GEOMETRY_PASSES_MAX: usize = 20_000;

/// mke2fs.conf's inode_ratio for the usage type its size selects (`parse_fs_type`).
pub(super) fn usage_type_inode_ratio(blocks: u64, bs: u32) -> u32 {
    let meg = (1024 * 1024) / u64::from(bs);
    match blocks {
        b if b < 3 * meg => 8192,
        b if b < 512 * meg => 4096,
        b if b < 4 * 1024 * 1024 * meg => 16384,
        b if b < 16 * 1024 * 1024 * meg => 32768,
        _ => 65536,
    }
}

/// `EXT2_JOURNAL_TO_FC_BLKS_RATIO`: the default fast-commit area is this fraction of the log.
pub(super) const FAST_COMMIT_RATIO: u32 = 64;

/// `ext2fs_default_journal_size`; 0 means too small for a journal.
pub fn default_journal_blocks(blocks: u64) -> u32 {
    match blocks {
        b if b < 2048 => 0,
        b if b < 32768 => 1024,
        b if b < 256 * 1024 => 4096,
        b if b < 512 * 1024 => 8192,
        b if b < 4096 * 1024 => 16384,
        b if b < 8192 * 1024 => 32768,
        b if b < 16384 * 1024 => 65536,
        b if b < 32768 * 1024 => 131072,
        _ => 262144,
    }
}

/// `calc_reserved_gdt_blocks`: room to grow the descriptor table to 1024 times the size (or
/// 2^32 blocks), before the cap of one indirect block's worth.
pub(super) fn reserved_gdt_blocks(
    blocks: u64,
    fdb: u64,
    bpg: u64,
    per_block: u64,
    desc_blocks: u64,
) -> u64 {
    let mut max_blocks: u64 = 0xFFFF_FFFF;
    if blocks < max_blocks / 1024 {
        max_blocks = blocks * 1024;
    }
    let rsv_groups = (max_blocks - fdb).div_ceil(bpg);
    rsv_groups.div_ceil(per_block).checked_sub(desc_blocks).unwrap_or(u64::MAX)
}

/// `ext2fs_bg_has_super`: groups 0 and 1 and the powers of 3, 5 and 7 with sparse_super.
pub(super) fn group_has_super(group: u32, sparse: bool) -> bool {
    if group <= 1 || !sparse {
        return true;
    }
    if group.is_multiple_of(2) {
        return false;
    }
    [3u32, 5, 7].iter().any(|&base| {
        let mut n = group;
        while n.is_multiple_of(base) {
            n /= base;
        }
        n == 1
    })
}

/// The groups holding backups, in the order `list_backups` (res_gdt.c) yields them.
pub(super) fn backup_groups(geometry: &Geometry) -> Vec<u32> {
    (1..geometry.groups).filter(|&g| geometry.has_super(g)).collect()
}
