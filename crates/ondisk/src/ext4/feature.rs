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

/// INCOMPAT bits quill reads and writes correctly today. Everything else (inline data,
/// encryption, casefolding, large directories, EA inodes, MMP, and bits nobody defines) makes
/// a read-write user refuse the file system.
pub const INCOMPAT_SUPPORTED: u32 = INCOMPAT_FILETYPE
    | INCOMPAT_RECOVER
    | INCOMPAT_META_BG
    | INCOMPAT_EXTENTS
    | INCOMPAT_64BIT
    | INCOMPAT_FLEX_BG
    | INCOMPAT_CSUM_SEED;

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

/// Human-readable names of the INCOMPAT `bits`, e.g. `"inline_data, incompat 0x80000000"`,
/// for error messages that must name what quill refuses.
pub fn incompat_names(bits: u32) -> String {
    let mut names: Vec<String> = Vec::new();
    let mut rest = bits;
    for (bit, name) in INCOMPAT_NAMES {
        if bits & bit != 0 {
            names.push(name.to_string());
            rest &= !bit;
        }
    }
    for shift in 0..32 {
        let bit = 1u32 << shift;
        if rest & bit != 0 {
            names.push(format!("incompat {bit:#x}"));
        }
    }
    names.join(", ")
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
    fn supported_incompat_bits_are_all_readable() {
        assert_eq!(INCOMPAT_SUPPORTED & INCOMPAT_UNREADABLE, 0);
        assert_ne!(INCOMPAT_UNREADABLE & INCOMPAT_JOURNAL_DEV, 0);
        assert_ne!(INCOMPAT_UNREADABLE & INCOMPAT_COMPRESSION, 0);
    }
}
