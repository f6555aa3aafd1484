//! ext4 feature flags, as `fs/ext4/ext4.h` and `Documentation/filesystems/ext4/super.rst`
//! define them.
//!
//! The three words follow the kernel's contract: an unknown COMPAT bit may be ignored, an
//! unknown RO_COMPAT bit allows only read-only access, and an unknown INCOMPAT bit forbids
//! access altogether. [`INCOMPAT_SUPPORTED`] is the subset of INCOMPAT that quill honours today;
//! a read-write user must refuse any other bit and name it with [`incompat_names`].

// s_feature_compat (superblock offset 0x5C).
pub const COMPAT_DIR_PREALLOC: u32 = 0x1;
pub const COMPAT_IMAGIC_INODES: u32 = 0x2;
pub const COMPAT_HAS_JOURNAL: u32 = 0x4;
pub const COMPAT_EXT_ATTR: u32 = 0x8;
pub const COMPAT_RESIZE_INODE: u32 = 0x10;
pub const COMPAT_DIR_INDEX: u32 = 0x20;
pub const COMPAT_LAZY_BG: u32 = 0x40;
pub const COMPAT_EXCLUDE_BITMAP: u32 = 0x100;
pub const COMPAT_SPARSE_SUPER2: u32 = 0x200;
pub const COMPAT_FAST_COMMIT: u32 = 0x400;
pub const COMPAT_STABLE_INODES: u32 = 0x800;
pub const COMPAT_ORPHAN_FILE: u32 = 0x1000;

// s_feature_incompat (superblock offset 0x60).
pub const INCOMPAT_COMPRESSION: u32 = 0x1;
pub const INCOMPAT_FILETYPE: u32 = 0x2;
pub const INCOMPAT_RECOVER: u32 = 0x4;
pub const INCOMPAT_JOURNAL_DEV: u32 = 0x8;
pub const INCOMPAT_META_BG: u32 = 0x10;
pub const INCOMPAT_EXTENTS: u32 = 0x40;
pub const INCOMPAT_64BIT: u32 = 0x80;
pub const INCOMPAT_MMP: u32 = 0x100;
pub const INCOMPAT_FLEX_BG: u32 = 0x200;
pub const INCOMPAT_EA_INODE: u32 = 0x400;
pub const INCOMPAT_DIRDATA: u32 = 0x1000;
pub const INCOMPAT_CSUM_SEED: u32 = 0x2000;
pub const INCOMPAT_LARGEDIR: u32 = 0x4000;
pub const INCOMPAT_INLINE_DATA: u32 = 0x8000;
pub const INCOMPAT_ENCRYPT: u32 = 0x10000;
pub const INCOMPAT_CASEFOLD: u32 = 0x20000;

// s_feature_ro_compat (superblock offset 0x64).
pub const RO_COMPAT_SPARSE_SUPER: u32 = 0x1;
pub const RO_COMPAT_LARGE_FILE: u32 = 0x2;
pub const RO_COMPAT_BTREE_DIR: u32 = 0x4;
pub const RO_COMPAT_HUGE_FILE: u32 = 0x8;
pub const RO_COMPAT_GDT_CSUM: u32 = 0x10;
pub const RO_COMPAT_DIR_NLINK: u32 = 0x20;
pub const RO_COMPAT_EXTRA_ISIZE: u32 = 0x40;
pub const RO_COMPAT_HAS_SNAPSHOT: u32 = 0x80;
pub const RO_COMPAT_QUOTA: u32 = 0x100;
pub const RO_COMPAT_BIGALLOC: u32 = 0x200;
pub const RO_COMPAT_METADATA_CSUM: u32 = 0x400;
pub const RO_COMPAT_REPLICA: u32 = 0x800;
pub const RO_COMPAT_READONLY: u32 = 0x1000;
pub const RO_COMPAT_PROJECT: u32 = 0x2000;
pub const RO_COMPAT_SHARED_BLOCKS: u32 = 0x4000;
pub const RO_COMPAT_VERITY: u32 = 0x8000;
pub const RO_COMPAT_ORPHAN_PRESENT: u32 = 0x10000;

/// INCOMPAT bits quill reads and writes correctly today, which a writer without a mounted
/// file system (`quill recover`: the journal replayed, the recover flag cleared) may touch.
/// Everything else (encryption, casefolding, MMP, whose block such a writer does not take,
/// and bits nobody defines) makes it refuse the file system. The file system itself
/// (`fs::Filesystem`) keeps its own list, with MMP, which it takes.
pub const INCOMPAT_SUPPORTED: u32 = INCOMPAT_FILETYPE
    | INCOMPAT_RECOVER
    | INCOMPAT_META_BG
    | INCOMPAT_EXTENTS
    | INCOMPAT_64BIT
    | INCOMPAT_FLEX_BG
    | INCOMPAT_CSUM_SEED
    | INCOMPAT_LARGEDIR
    | INCOMPAT_INLINE_DATA
    | INCOMPAT_EA_INODE;

/// INCOMPAT bits that change how the superblock, group descriptors or inodes must be read, or
/// that mean the device is not a file system at all. Even a read-only reader refuses these:
/// compression and dirdata were never implemented in Linux, a journal device holds no file
/// system, and a bit the kernel does not define could mean anything.
pub const INCOMPAT_UNREADABLE: u32 = !(INCOMPAT_FILETYPE
    | INCOMPAT_RECOVER
    | INCOMPAT_META_BG
    | INCOMPAT_EXTENTS
    | INCOMPAT_64BIT
    | INCOMPAT_MMP
    | INCOMPAT_FLEX_BG
    | INCOMPAT_EA_INODE
    | INCOMPAT_CSUM_SEED
    | INCOMPAT_LARGEDIR
    | INCOMPAT_INLINE_DATA
    | INCOMPAT_ENCRYPT
    | INCOMPAT_CASEFOLD);

/// The names e2fsprogs uses for COMPAT bits (`lib/e2p/feature.c`, what `dumpe2fs` prints).
const COMPAT_NAMES: [(u32, &str); 12] = [
    (COMPAT_DIR_PREALLOC, "dir_prealloc"),
    (COMPAT_IMAGIC_INODES, "imagic_inodes"),
    (COMPAT_HAS_JOURNAL, "has_journal"),
    (COMPAT_EXT_ATTR, "ext_attr"),
    (COMPAT_RESIZE_INODE, "resize_inode"),
    (COMPAT_DIR_INDEX, "dir_index"),
    (COMPAT_LAZY_BG, "lazy_bg"),
    (COMPAT_EXCLUDE_BITMAP, "snapshot_bitmap"),
    (COMPAT_SPARSE_SUPER2, "sparse_super2"),
    (COMPAT_FAST_COMMIT, "fast_commit"),
    (COMPAT_STABLE_INODES, "stable_inodes"),
    (COMPAT_ORPHAN_FILE, "orphan_file"),
];

/// The names e2fsprogs uses for INCOMPAT bits (what `dumpe2fs` and `tune2fs -O` print).
const INCOMPAT_NAMES: [(u32, &str); 16] = [
    (INCOMPAT_COMPRESSION, "compression"),
    (INCOMPAT_FILETYPE, "filetype"),
    (INCOMPAT_RECOVER, "needs_recovery"),
    (INCOMPAT_JOURNAL_DEV, "journal_dev"),
    (INCOMPAT_META_BG, "meta_bg"),
    (INCOMPAT_EXTENTS, "extent"),
    (INCOMPAT_64BIT, "64bit"),
    (INCOMPAT_MMP, "mmp"),
    (INCOMPAT_FLEX_BG, "flex_bg"),
    (INCOMPAT_EA_INODE, "ea_inode"),
    (INCOMPAT_DIRDATA, "dirdata"),
    (INCOMPAT_CSUM_SEED, "metadata_csum_seed"),
    (INCOMPAT_LARGEDIR, "large_dir"),
    (INCOMPAT_INLINE_DATA, "inline_data"),
    (INCOMPAT_ENCRYPT, "encrypt"),
    (INCOMPAT_CASEFOLD, "casefold"),
];

/// The names e2fsprogs uses for RO_COMPAT bits; e2fsprogs names neither BTREE_DIR nor
/// HAS_SNAPSHOT, so those two carry the kernel's names.
const RO_COMPAT_NAMES: [(u32, &str); 17] = [
    (RO_COMPAT_SPARSE_SUPER, "sparse_super"),
    (RO_COMPAT_LARGE_FILE, "large_file"),
    (RO_COMPAT_BTREE_DIR, "btree_dir"),
    (RO_COMPAT_HUGE_FILE, "huge_file"),
    (RO_COMPAT_GDT_CSUM, "uninit_bg"),
    (RO_COMPAT_DIR_NLINK, "dir_nlink"),
    (RO_COMPAT_EXTRA_ISIZE, "extra_isize"),
    (RO_COMPAT_HAS_SNAPSHOT, "has_snapshot"),
    (RO_COMPAT_QUOTA, "quota"),
    (RO_COMPAT_BIGALLOC, "bigalloc"),
    (RO_COMPAT_METADATA_CSUM, "metadata_csum"),
    (RO_COMPAT_REPLICA, "replica"),
    (RO_COMPAT_READONLY, "read-only"),
    (RO_COMPAT_PROJECT, "project"),
    (RO_COMPAT_SHARED_BLOCKS, "shared_blocks"),
    (RO_COMPAT_VERITY, "verity"),
    (RO_COMPAT_ORPHAN_PRESENT, "orphan_present"),
];

/// The name of every bit set in `bits`, lowest bit first; a bit without a name becomes
/// `"{word} 0x..."` (e.g. `incompat 0x80000000`).
fn bit_names(table: &[(u32, &'static str)], word: &str, bits: u32) -> Vec<String> {
    (0..32)
        .map(|shift| 1u32 << shift)
        .filter(|bit| bits & bit != 0)
        .map(|bit| match table.iter().find(|(b, _)| *b == bit) {
            Some((_, name)) => (*name).to_string(),
            None => format!("{word} {bit:#x}"),
        })
        .collect()
}

/// Human-readable names of the COMPAT `bits`, comma-separated (see [`incompat_names`]).
pub fn compat_names(bits: u32) -> String {
    bit_names(&COMPAT_NAMES, "compat", bits).join(", ")
}

/// Human-readable names of the INCOMPAT `bits`, e.g. `"64bit, inline_data, incompat
/// 0x80000000"`, for error messages that must name what quill refuses.
pub fn incompat_names(bits: u32) -> String {
    bit_names(&INCOMPAT_NAMES, "incompat", bits).join(", ")
}

/// Human-readable names of the RO_COMPAT `bits`, comma-separated (see [`incompat_names`]).
pub fn ro_compat_names(bits: u32) -> String {
    bit_names(&RO_COMPAT_NAMES, "ro_compat", bits).join(", ")
}

/// Every feature of the three words, in the order `dumpe2fs` lists them under "Filesystem
/// features": COMPAT, then INCOMPAT, then RO_COMPAT, each from its lowest bit up.
pub fn feature_list(compat: u32, incompat: u32, ro_compat: u32) -> Vec<String> {
    let mut names = bit_names(&COMPAT_NAMES, "compat", compat);
    names.extend(bit_names(&INCOMPAT_NAMES, "incompat", incompat));
    names.extend(bit_names(&RO_COMPAT_NAMES, "ro_compat", ro_compat));
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incompat_names_lists_known_and_unknown_bits() {
        assert_eq!(incompat_names(0), "");
        assert_eq!(
            incompat_names(INCOMPAT_INLINE_DATA | INCOMPAT_64BIT | 0x8000_0000),
            "64bit, inline_data, incompat 0x80000000"
        );
    }

    #[test]
    fn compat_and_ro_compat_names_follow_e2fsprogs() {
        assert_eq!(compat_names(0), "");
        assert_eq!(
            compat_names(COMPAT_HAS_JOURNAL | COMPAT_ORPHAN_FILE | COMPAT_EXCLUDE_BITMAP | 0x2000),
            "has_journal, snapshot_bitmap, orphan_file, compat 0x2000"
        );
        assert_eq!(
            ro_compat_names(RO_COMPAT_GDT_CSUM | RO_COMPAT_METADATA_CSUM | RO_COMPAT_READONLY),
            "uninit_bg, metadata_csum, read-only"
        );
        assert_eq!(
            ro_compat_names(RO_COMPAT_ORPHAN_PRESENT | 0x20000),
            "orphan_present, ro_compat 0x20000"
        );
        // Every named bit is one bit, named once.
        for table in [&COMPAT_NAMES[..], &INCOMPAT_NAMES[..], &RO_COMPAT_NAMES[..]] {
            for (i, (bit, name)) in table.iter().enumerate() {
                assert!(bit.is_power_of_two(), "{name}");
                assert!(table[..i].iter().all(|(b, n)| b != bit && n != name), "{name}");
            }
        }
    }

    #[test]
    fn feature_list_is_in_dumpe2fs_order() {
        // mkfs.ext4 1.47's default set, as `dumpe2fs -h` prints it.
        let list = feature_list(
            COMPAT_HAS_JOURNAL | COMPAT_EXT_ATTR | COMPAT_RESIZE_INODE | COMPAT_DIR_INDEX,
            INCOMPAT_FILETYPE
                | INCOMPAT_RECOVER
                | INCOMPAT_EXTENTS
                | INCOMPAT_64BIT
                | INCOMPAT_FLEX_BG,
            RO_COMPAT_SPARSE_SUPER
                | RO_COMPAT_LARGE_FILE
                | RO_COMPAT_HUGE_FILE
                | RO_COMPAT_DIR_NLINK
                | RO_COMPAT_EXTRA_ISIZE
                | RO_COMPAT_METADATA_CSUM,
        );
        assert_eq!(
            list.join(" "),
            "has_journal ext_attr resize_inode dir_index filetype needs_recovery extent 64bit \
             flex_bg sparse_super large_file huge_file dir_nlink extra_isize metadata_csum"
        );
    }

    #[test]
    fn supported_incompat_bits_are_all_readable() {
        assert_eq!(INCOMPAT_SUPPORTED & INCOMPAT_UNREADABLE, 0);
        assert_ne!(INCOMPAT_UNREADABLE & INCOMPAT_JOURNAL_DEV, 0);
        assert_ne!(INCOMPAT_UNREADABLE & INCOMPAT_COMPRESSION, 0);
    }
}
