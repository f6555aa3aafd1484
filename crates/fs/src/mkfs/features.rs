//! The feature words mkfs sets, and `-O` lists that edit them.

use super::*;

/// The three feature words of an ext4 superblock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    pub compat: u32,
    pub incompat: u32,
    pub ro_compat: u32,
}

/// The features `-O` may add or remove, by their e2fsprogs names. Everything else is refused
/// because quill would either write it wrongly (meta_bg, inline data, bigalloc, ...) or not at
/// all.
pub(super) const EDITABLE_FEATURES: [(&str, Word, u32); 27] = [
    ("has_journal", Word::Compat, feature::COMPAT_HAS_JOURNAL),
    ("ext_attr", Word::Compat, feature::COMPAT_EXT_ATTR),
    ("resize_inode", Word::Compat, feature::COMPAT_RESIZE_INODE),
    ("dir_index", Word::Compat, feature::COMPAT_DIR_INDEX),
    ("fast_commit", Word::Compat, feature::COMPAT_FAST_COMMIT),
    ("orphan_file", Word::Compat, feature::COMPAT_ORPHAN_FILE),
    ("meta_bg", Word::Incompat, feature::INCOMPAT_META_BG),
    ("extent", Word::Incompat, feature::INCOMPAT_EXTENTS),
    ("extents", Word::Incompat, feature::INCOMPAT_EXTENTS),
    ("64bit", Word::Incompat, feature::INCOMPAT_64BIT),
    ("mmp", Word::Incompat, feature::INCOMPAT_MMP),
    ("flex_bg", Word::Incompat, feature::INCOMPAT_FLEX_BG),
    ("ea_inode", Word::Incompat, feature::INCOMPAT_EA_INODE),
    ("metadata_csum_seed", Word::Incompat, feature::INCOMPAT_CSUM_SEED),
    ("large_dir", Word::Incompat, feature::INCOMPAT_LARGEDIR),
    ("inline_data", Word::Incompat, feature::INCOMPAT_INLINE_DATA),
    ("sparse_super", Word::RoCompat, feature::RO_COMPAT_SPARSE_SUPER),
    ("large_file", Word::RoCompat, feature::RO_COMPAT_LARGE_FILE),
    ("huge_file", Word::RoCompat, feature::RO_COMPAT_HUGE_FILE),
    ("uninit_bg", Word::RoCompat, feature::RO_COMPAT_GDT_CSUM),
    ("gdt_csum", Word::RoCompat, feature::RO_COMPAT_GDT_CSUM),
    ("dir_nlink", Word::RoCompat, feature::RO_COMPAT_DIR_NLINK),
    ("extra_isize", Word::RoCompat, feature::RO_COMPAT_EXTRA_ISIZE),
    ("metadata_csum", Word::RoCompat, feature::RO_COMPAT_METADATA_CSUM),
    ("project", Word::RoCompat, feature::RO_COMPAT_PROJECT),
    ("quota", Word::RoCompat, feature::RO_COMPAT_QUOTA),
    ("bigalloc", Word::RoCompat, feature::RO_COMPAT_BIGALLOC),
];

/// Names dumpe2fs prints for the bits quill can set, in its order.
pub(super) const FEATURE_NAMES: [(Word, u32, &str); 27] = [
    (Word::Compat, feature::COMPAT_HAS_JOURNAL, "has_journal"),
    (Word::Compat, feature::COMPAT_EXT_ATTR, "ext_attr"),
    (Word::Compat, feature::COMPAT_RESIZE_INODE, "resize_inode"),
    (Word::Compat, feature::COMPAT_DIR_INDEX, "dir_index"),
    (Word::Compat, feature::COMPAT_FAST_COMMIT, "fast_commit"),
    (Word::Compat, feature::COMPAT_ORPHAN_FILE, "orphan_file"),
    (Word::Incompat, feature::INCOMPAT_FILETYPE, "filetype"),
    (Word::Incompat, feature::INCOMPAT_META_BG, "meta_bg"),
    (Word::Incompat, feature::INCOMPAT_EXTENTS, "extent"),
    (Word::Incompat, feature::INCOMPAT_64BIT, "64bit"),
    (Word::Incompat, feature::INCOMPAT_MMP, "mmp"),
    (Word::Incompat, feature::INCOMPAT_FLEX_BG, "flex_bg"),
    (Word::Incompat, feature::INCOMPAT_EA_INODE, "ea_inode"),
    (Word::Incompat, feature::INCOMPAT_CSUM_SEED, "metadata_csum_seed"),
    (Word::Incompat, feature::INCOMPAT_LARGEDIR, "large_dir"),
    (Word::Incompat, feature::INCOMPAT_INLINE_DATA, "inline_data"),
    (Word::RoCompat, feature::RO_COMPAT_SPARSE_SUPER, "sparse_super"),
    (Word::RoCompat, feature::RO_COMPAT_LARGE_FILE, "large_file"),
    (Word::RoCompat, feature::RO_COMPAT_HUGE_FILE, "huge_file"),
    (Word::RoCompat, feature::RO_COMPAT_GDT_CSUM, "uninit_bg"),
    (Word::RoCompat, feature::RO_COMPAT_DIR_NLINK, "dir_nlink"),
    (Word::RoCompat, feature::RO_COMPAT_EXTRA_ISIZE, "extra_isize"),
    (Word::RoCompat, feature::RO_COMPAT_QUOTA, "quota"),
    (Word::RoCompat, feature::RO_COMPAT_BIGALLOC, "bigalloc"),
    (Word::RoCompat, feature::RO_COMPAT_METADATA_CSUM, "metadata_csum"),
    (Word::RoCompat, feature::RO_COMPAT_PROJECT, "project"),
    (Word::RoCompat, feature::RO_COMPAT_ORPHAN_PRESENT, "orphan_present"),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Word {
    Compat,
    Incompat,
    RoCompat,
}

impl Default for Features {
    /// e2fsprogs 1.47.0's ext4 defaults as configured on Debian (`base_features` plus the ext4
    /// `features` line of mke2fs.conf): has_journal ext_attr resize_inode dir_index filetype
    /// extent 64bit flex_bg sparse_super large_file huge_file dir_nlink extra_isize
    /// metadata_csum. Upstream's mke2fs.conf.in of 1.47.0 adds orphan_file and
    /// metadata_csum_seed; Debian (and so mkfs.ext4 here) leaves them off, and so does quill.
    fn default() -> Self {
        Features {
            compat: feature::COMPAT_HAS_JOURNAL
                | feature::COMPAT_EXT_ATTR
                | feature::COMPAT_RESIZE_INODE
                | feature::COMPAT_DIR_INDEX,
            incompat: feature::INCOMPAT_FILETYPE
                | feature::INCOMPAT_EXTENTS
                | feature::INCOMPAT_64BIT
                | feature::INCOMPAT_FLEX_BG,
            ro_compat: feature::RO_COMPAT_SPARSE_SUPER
                | feature::RO_COMPAT_LARGE_FILE
                | feature::RO_COMPAT_HUGE_FILE
                | feature::RO_COMPAT_DIR_NLINK
                | feature::RO_COMPAT_EXTRA_ISIZE
                | feature::RO_COMPAT_METADATA_CSUM,
        }
    }
}

impl Features {
    /// The features mke2fs gives a file system of type `fs_type` (`-t`) under Debian's
    /// mke2fs.conf: `base_features` (sparse_super large_file filetype resize_inode dir_index
    /// ext_attr), plus has_journal for ext3, plus the ext4 line for ext4 ([`Features::default`]).
    pub fn for_fs_type(fs_type: &str) -> Result<Features> {
        let base = Features {
            compat: feature::COMPAT_EXT_ATTR
                | feature::COMPAT_RESIZE_INODE
                | feature::COMPAT_DIR_INDEX,
            incompat: feature::INCOMPAT_FILETYPE,
            ro_compat: feature::RO_COMPAT_SPARSE_SUPER | feature::RO_COMPAT_LARGE_FILE,
        };
        match fs_type {
            "ext2" => Ok(base),
            "ext3" => Ok(Features { compat: base.compat | feature::COMPAT_HAS_JOURNAL, ..base }),
            "ext4" => Ok(Features::default()),
            other => Err(FsError::Invalid(format!(
                "file system type '{other}' is not ext2, ext3 or ext4"
            ))),
        }
    }

    /// Applies a mkfs-style `-O` list: names separated by commas or spaces, `^name` to remove.
    /// Refuses (naming it) any feature quill cannot format.
    pub fn edit(&mut self, list: &str) -> Result<()> {
        for item in list.split([',', ' ', '\t']).filter(|s| !s.is_empty()) {
            let (clear, name) = match item.strip_prefix('^') {
                Some(name) => (true, name),
                None => (false, item.strip_prefix('+').unwrap_or(item)),
            };
            let Some(&(_, word, bit)) = EDITABLE_FEATURES.iter().find(|(n, _, _)| *n == name)
            else {
                return Err(FsError::Unsupported(format!(
                    "feature '{name}' cannot be set or cleared by quill mkfs (it accepts: {})",
                    EDITABLE_FEATURES.map(|(n, _, _)| n).join(", ")
                )));
            };
            let target = self.word_mut(word);
            if clear {
                *target &= !bit;
            } else {
                *target |= bit;
            }
        }
        Ok(())
    }

    /// The features' e2fsprogs names, in dumpe2fs's order.
    pub fn names(&self) -> Vec<&'static str> {
        FEATURE_NAMES
            .iter()
            .filter(|(word, bit, _)| self.word(*word) & bit != 0)
            .map(|(_, _, name)| *name)
            .collect()
    }

    fn word(&self, word: Word) -> u32 {
        match word {
            Word::Compat => self.compat,
            Word::Incompat => self.incompat,
            Word::RoCompat => self.ro_compat,
        }
    }

    fn word_mut(&mut self, word: Word) -> &mut u32 {
        match word {
            Word::Compat => &mut self.compat,
            Word::Incompat => &mut self.incompat,
            Word::RoCompat => &mut self.ro_compat,
        }
    }

    pub(super) fn compat(&self, bit: u32) -> bool {
        self.compat & bit != 0
    }
    pub(super) fn incompat(&self, bit: u32) -> bool {
        self.incompat & bit != 0
    }
    pub(super) fn ro_compat(&self, bit: u32) -> bool {
        self.ro_compat & bit != 0
    }
}
