//! The read-write file system against an in-memory model, on images made by mkfs.ext4:
//! every operation's result is checked as it happens, the whole tree after every thread
//! finishes and again after unmount and remount, and `e2fsck -fn` must find nothing. The
//! operations include fallocate (allocate, KEEP_SIZE, punch hole); the configurations cover
//! 1, 2, 4 and 64 KiB blocks, images without metadata_csum or 64bit, data=journal, ext3, and
//! images without a journal (ext2, ext4 `^has_journal`).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use common::{assert_fsck_clean, have, list_dir, mkfs, open_device, seed, Rng, Scratch};
use fs::{
    DataMode, FallocateMode, Filesystem, FsError, MountOptions, RenameFlags, SetMode, ROOT_INO,
};

/// One node of the model: a file's bytes, a directory, or a symlink's target.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    File(Vec<u8>),
    Dir,
    Symlink(Vec<u8>),
}

/// What a subtree should contain: relative path → node, plus xattrs per path.
#[derive(Debug, Default, Clone)]
struct Model {
    nodes: BTreeMap<String, Node>,
    xattrs: BTreeMap<String, BTreeMap<Vec<u8>, Vec<u8>>>,
}

fn open(image: &Path) -> Filesystem {
    open_with(image, DataMode::Ordered)
}

fn open_with(image: &Path, data: DataMode) -> Filesystem {
    // A small dirty-data bound: operations meet files partly cached and partly written back.
    let options = MountOptions { data, dirty_bytes_max: 256 << 10, ..MountOptions::default() };
    Filesystem::open(open_device(image), options).expect("open file system")
}

fn lookup_path(fs: &Filesystem, base: u32, path: &str) -> Result<u32, FsError> {
    let mut ino = base;
    for part in path.split('/') {
        ino = fs.lookup(ino, part.as_bytes())?.ino;
    }
    Ok(ino)
}

fn read_all(fs: &Filesystem, ino: u32) -> Vec<u8> {
    let size = fs.getattr(ino).unwrap().size as usize;
    let mut buf = vec![0u8; size];
    let n = fs.read(ino, 0, &mut buf).unwrap();
    assert_eq!(n, size);
    buf
}

/// Walks the subtree at `base` and checks it equals `model` exactly (names, types, contents,
/// link counts of directories, xattrs).
fn check_tree(fs: &Filesystem, base: u32, model: &Model) {
    let mut seen = BTreeSet::new();
    walk(fs, base, "", model, &mut seen);
    let expected: BTreeSet<String> = model.nodes.keys().cloned().collect();
    assert_eq!(seen, expected, "the tree's names differ from the model");
}

fn walk(fs: &Filesystem, dir: u32, prefix: &str, model: &Model, seen: &mut BTreeSet<String>) {
    let mut subdirs = 0;
    for entry in list_dir(fs, dir, 7) {
        if entry.name == b"." || entry.name == b".." {
            continue;
        }
        let name = String::from_utf8(entry.name.clone()).unwrap();
        let path = if prefix.is_empty() { name } else { format!("{prefix}/{name}") };
        assert!(seen.insert(path.clone()), "{path} listed twice");
        let expected = model.nodes.get(&path).unwrap_or_else(|| panic!("unexpected {path}"));
        let attr = fs.getattr(entry.ino).unwrap();
        match expected {
            Node::Dir => {
                assert_eq!(attr.mode & 0o170000, 0o040000, "{path} is not a directory");
                subdirs += 1;
                walk(fs, entry.ino, &path, model, seen);
            }
            Node::File(data) => {
                assert_eq!(attr.mode & 0o170000, 0o100000, "{path} is not a file");
                assert_eq!(attr.size, data.len() as u64, "{path} size");
                assert!(read_all(fs, entry.ino) == *data, "{path} contents differ");
            }
            Node::Symlink(target) => {
                assert_eq!(fs.readlink(entry.ino).unwrap(), *target, "{path} target");
            }
        }
        let want = model.xattrs.get(&path).cloned().unwrap_or_default();
        let mut names: Vec<Vec<u8>> = fs.listxattr(entry.ino).unwrap();
        names.sort();
        let want_names: Vec<Vec<u8>> = want.keys().cloned().collect();
        assert_eq!(names, want_names, "{path} xattr names");
        for (k, v) in &want {
            assert_eq!(&fs.getxattr(entry.ino, k).unwrap(), v, "{path} xattr value");
        }
    }
    let attr = fs.getattr(dir).unwrap();
    assert_eq!(attr.nlink, 2 + subdirs, "directory {prefix:?} link count");
}

/// Applies one random operation inside the subtree at `base` to both the fs and the model.
/// One random operation on `base`'s subtree, checked against `model`. `indirect`: files are
/// indirect-mapped (ext3), where fallocate can only punch holes.
fn random_op(fs: &Filesystem, base: u32, model: &mut Model, rng: &mut Rng, c: &Config) {
    let (block_size, indirect) = (c.block_size, c.indirect);
    let names = ["a", "b", "c", "d", "long_name_for_a_file_that_is_not_short", "e"];
    let dirs: Vec<String> = std::iter::once(String::new())
        .chain(model.nodes.iter().filter(|(_, n)| **n == Node::Dir).map(|(p, _)| p.clone()))
        .collect();
    let dir = dirs[rng.below(dirs.len() as u64) as usize].clone();
    let name = names[rng.below(names.len() as u64) as usize];
    let path = if dir.is_empty() { name.to_string() } else { format!("{dir}/{name}") };
    let dir_ino = if dir.is_empty() { base } else { lookup_path(fs, base, &dir).unwrap() };
    let existing = model.nodes.get(&path).cloned();
    // With quota, files belong to many users, groups and projects (more ids than one quota
    // data block holds), and owners change: every charge moves in the quota files.
    let owner = if c.quota { (rng.below(40) as u32, 100 + rng.below(20) as u32) } else { (0, 0) };
    if c.quota && existing.is_some() && rng.below(6) == 0 {
        let ino = lookup_path(fs, base, &path).unwrap();
        let set = fs::SetAttr { uid: Some(owner.0), gid: Some(owner.1), ..Default::default() };
        fs.setattr(ino, &set).unwrap();
        if c.mkfs.iter().any(|arg| arg.contains("project")) {
            fs.set_project(ino, rng.below(5) as u32, 0).unwrap();
        }
        return;
    }
    match rng.below(14) {
        0 | 1 => {
            let r = fs.create(dir_ino, name.as_bytes(), 0o644, owner.0, owner.1);
            match existing {
                Some(_) => assert!(matches!(r, Err(FsError::Exists)), "create over {path}: {r:?}"),
                None => {
                    r.unwrap();
                    model.nodes.insert(path, Node::File(Vec::new()));
                }
            }
        }
        2 => {
            let r = fs.mkdir(dir_ino, name.as_bytes(), 0o755, 0, 0);
            match existing {
                Some(_) => assert!(matches!(r, Err(FsError::Exists))),
                None => {
                    r.unwrap();
                    model.nodes.insert(path, Node::Dir);
                }
            }
        }
        3..=5 => {
            if let Some(Node::File(mut data)) = existing {
                let ino = lookup_path(fs, base, &path).unwrap();
                let len = match rng.below(4) {
                    0 => rng.below(100) as usize,
                    1 => block_size as usize + rng.below(3) as usize - 1,
                    2 => rng.below(5 * block_size) as usize,
                    _ => rng.below(40_000) as usize,
                };
                let offset = match rng.below(3) {
                    0 => data.len() as u64,
                    1 => rng.below(data.len() as u64 + 1),
                    _ => rng.below(data.len() as u64 + 20 * block_size),
                };
                let bytes = rng.bytes(len);
                assert_eq!(fs.write(ino, offset, &bytes).unwrap(), len);
                let end = offset as usize + len;
                // A write of nothing changes nothing, not even the size (POSIX).
                if len > 0 {
                    if data.len() < end {
                        data.resize(end, 0);
                    }
                    data[offset as usize..end].copy_from_slice(&bytes);
                }
                let got = read_all(fs, ino);
                if got != data {
                    let first = got.iter().zip(&data).position(|(a, b)| a != b);
                    panic!(
                        "{path} after write of {len} at {offset}: size {} vs {}, first difference \
                         at {first:?}",
                        got.len(),
                        data.len()
                    );
                }
                model.nodes.insert(path, Node::File(data));
            }
        }
        6 => {
            if let Some(Node::File(mut data)) = existing {
                let ino = lookup_path(fs, base, &path).unwrap();
                let size = rng.below(data.len() as u64 * 2 + 3 * block_size);
                fs.setattr(ino, &fs::SetAttr { size: Some(size), ..Default::default() }).unwrap();
                data.resize(size as usize, 0);
                assert!(read_all(fs, ino) == data, "{path} after truncate to {size}");
                model.nodes.insert(path, Node::File(data));
            }
        }
        7 => {
            let r = if matches!(existing, Some(Node::Dir)) {
                fs.rmdir(dir_ino, name.as_bytes())
            } else {
                fs.unlink(dir_ino, name.as_bytes())
            };
            match existing {
                None => assert!(matches!(r, Err(FsError::NotFound))),
                Some(Node::Dir) => {
                    let prefix = format!("{path}/");
                    if model.nodes.keys().any(|k| k.starts_with(&prefix)) {
                        assert!(matches!(r, Err(FsError::NotEmpty)), "rmdir {path}: {r:?}");
                    } else {
                        r.unwrap();
                        model.nodes.remove(&path);
                        model.xattrs.remove(&path);
                    }
                }
                Some(_) => {
                    r.unwrap();
                    model.nodes.remove(&path);
                    model.xattrs.remove(&path);
                }
            }
        }
        8 => {
            if existing.is_none() {
                let len = if rng.below(2) == 0 { 10 } else { 100 + rng.below(200) as usize };
                let target: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
                fs.symlink(dir_ino, name.as_bytes(), &target, 0, 0).unwrap();
                model.nodes.insert(path, Node::Symlink(target));
            }
        }
        9 => {
            // Rename to another name in a random directory (files and empty-or-not dirs).
            let to_dir = dirs[rng.below(dirs.len() as u64) as usize].clone();
            let to_name = names[rng.below(names.len() as u64) as usize];
            let to_path =
                if to_dir.is_empty() { to_name.to_string() } else { format!("{to_dir}/{to_name}") };
            let Some(src) = existing else { return };
            let into_itself = to_path == path || to_path.starts_with(&format!("{path}/"));
            if into_itself {
                return;
            }
            let to_dir_ino =
                if to_dir.is_empty() { base } else { lookup_path(fs, base, &to_dir).unwrap() };
            let dst = model.nodes.get(&to_path).cloned();
            let r = fs.rename(
                dir_ino,
                name.as_bytes(),
                to_dir_ino,
                to_name.as_bytes(),
                RenameFlags::default(),
            );
            let dst_nonempty_dir = matches!(dst, Some(Node::Dir))
                && model.nodes.keys().any(|k| k.starts_with(&format!("{to_path}/")));
            let target_is_ancestor = path.starts_with(&format!("{to_path}/"));
            match (&src, &dst) {
                // As the kernel: an ancestor of the source as target is ENOTEMPTY, checked
                // before the types.
                _ if target_is_ancestor => {
                    assert!(matches!(r, Err(FsError::NotEmpty)), "{r:?}");
                    return;
                }
                (Node::Dir, Some(d)) if *d != Node::Dir => {
                    assert!(matches!(r, Err(FsError::NotDir)), "{r:?}");
                    return;
                }
                (s, Some(Node::Dir)) if *s != Node::Dir => {
                    assert!(matches!(r, Err(FsError::IsDir)), "{r:?}");
                    return;
                }
                (Node::Dir, Some(Node::Dir)) if dst_nonempty_dir => {
                    assert!(matches!(r, Err(FsError::NotEmpty)), "{r:?}");
                    return;
                }
                _ => r.unwrap(),
            }
            // Move the subtree in the model.
            model.nodes.remove(&to_path);
            model.xattrs.remove(&to_path);
            let moved: Vec<(String, Node)> = model
                .nodes
                .iter()
                .filter(|(k, _)| **k == path || k.starts_with(&format!("{path}/")))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            for (k, v) in moved {
                model.nodes.remove(&k);
                let x = model.xattrs.remove(&k);
                let nk = format!("{to_path}{}", &k[path.len()..]);
                if let Some(x) = x {
                    model.xattrs.insert(nk.clone(), x);
                }
                model.nodes.insert(nk, v);
            }
        }
        10 => {
            if existing.is_some() {
                let ino = lookup_path(fs, base, &path).unwrap();
                let key = format!("user.k{}", rng.below(4)).into_bytes();
                // With ea_inode, some values are too large for a block: inodes of their own.
                let len = match rng.below(4) {
                    0 => 300,
                    1 if c.ea_inode => 3 * block_size as usize + 7,
                    _ => 8,
                };
                let value = rng.bytes(len);
                let r = fs.setxattr(ino, &key, &value, SetMode::Any);
                if len > block_size as usize && matches!(existing, Some(Node::Symlink(_))) {
                    // A symlink gets no value inode (`ea_inode.rs`): no room, nothing changed.
                    assert!(matches!(r, Err(FsError::NoSpace)), "{path}: {r:?}");
                } else {
                    r.unwrap();
                    model.xattrs.entry(path).or_default().insert(key, value);
                }
            }
        }
        12 | 13 => {
            if let Some(Node::File(data)) = existing {
                let ino = lookup_path(fs, base, &path).unwrap();
                let data = fallocate_op(
                    fs,
                    ino,
                    &path,
                    data,
                    rng,
                    (block_size, indirect, c.cluster_size()),
                );
                model.nodes.insert(path, Node::File(data));
            }
        }
        _ => {
            if existing.is_some() {
                let ino = lookup_path(fs, base, &path).unwrap();
                let key = format!("user.k{}", rng.below(4)).into_bytes();
                let had = model.xattrs.get_mut(&path).and_then(|x| x.remove(&key));
                let r = fs.removexattr(ino, &key);
                match had {
                    Some(_) => r.unwrap(),
                    None => assert!(matches!(r, Err(FsError::NoData)), "{r:?}"),
                }
            }
        }
    }
}

/// fallocate on the file at `path` (contents `data`) with a random mode and range, checked
/// against the model: allocated ranges read as zeros, KEEP_SIZE keeps the size, a punched hole
/// reads as zeros within the size. Returns the new contents.
fn fallocate_op(
    fs: &Filesystem,
    ino: u32,
    path: &str,
    mut data: Vec<u8>,
    rng: &mut Rng,
    (block_size, indirect, cluster_size): (u64, bool, u64),
) -> Vec<u8> {
    let size = data.len() as u64;
    let offset = match rng.below(3) {
        0 => rng.below(size + 1),
        1 => rng.below(size / block_size + 2) * block_size,
        _ => rng.below(size + 8 * block_size),
    };
    let len = match rng.below(3) {
        0 => 1 + rng.below(block_size * 2),
        1 => (1 + rng.below(8)) * block_size,
        _ => 1 + rng.below(30_000),
    };
    let mode = match rng.below(5) {
        0 => FallocateMode::Allocate,
        1 => FallocateMode::KeepSize,
        2 => FallocateMode::ZeroRange { keep_size: false },
        3 => FallocateMode::ZeroRange { keep_size: true },
        _ => FallocateMode::PunchHole,
    };
    // Cached writes get their blocks at writeback, which a punch may start: count them first.
    fs.fsync(ino, true).unwrap_or_else(|e| panic!("{path}: fdatasync before fallocate: {e}"));
    let blocks_before = fs.getattr(ino).unwrap().blocks;
    if indirect && mode != FallocateMode::PunchHole {
        // As ext4_fallocate: an indirect-mapped file has no unwritten blocks to preallocate.
        let refused = fs.fallocate(ino, mode, offset, len);
        assert!(matches!(refused, Err(FsError::Unsupported(_))), "{path}: {mode:?}: {refused:?}");
        return data;
    }
    fs.fallocate(ino, mode, offset, len)
        .unwrap_or_else(|e| panic!("{path}: fallocate {mode:?} {offset}+{len}: {e}"));
    let end = (offset + len) as usize;
    match mode {
        FallocateMode::Allocate => {
            if data.len() < end {
                data.resize(end, 0);
            }
        }
        FallocateMode::KeepSize => {}
        FallocateMode::ZeroRange { keep_size } => {
            let to = end.min(data.len());
            if (offset as usize) < to {
                data[offset as usize..to].fill(0);
            }
            if !keep_size && data.len() < end {
                data.resize(end, 0);
            }
        }
        FallocateMode::PunchHole => {
            let to = end.min(data.len());
            if (offset as usize) < to {
                data[offset as usize..to].fill(0);
            }
        }
    }
    let attr = fs.getattr(ino).unwrap();
    assert_eq!(
        attr.size,
        data.len() as u64,
        "{path}: size after fallocate {mode:?} {offset}+{len}"
    );
    if mode != FallocateMode::PunchHole {
        // ZERO_RANGE frees whole blocks and allocates them again: the extent tree may shrink.
        if !matches!(mode, FallocateMode::ZeroRange { .. }) {
            assert!(attr.blocks >= blocks_before, "{path}: allocation freed blocks");
        }
        // Every block of the range is allocated now (unwritten or not).
        let in_range = (offset + len).div_ceil(block_size) - offset / block_size;
        assert!(
            attr.blocks * 512 >= in_range * block_size,
            "{path}: {} sectors after allocating {in_range} blocks",
            attr.blocks
        );
    } else {
        // Splitting an extent may grow the extent tree by a block or two, as in ext4 (a
        // cluster each with bigalloc; an inline file moving out takes one too).
        let tree_growth = 2 * cluster_size / 512;
        assert!(
            attr.blocks <= blocks_before + tree_growth,
            "{path}: punching a hole allocated blocks ({blocks_before} -> {} sectors)",
            attr.blocks
        );
    }
    let got = read_all(fs, ino);
    if got != data {
        let first = got.iter().zip(&data).position(|(a, b)| a != b);
        panic!(
            "{path} after fallocate {mode:?} {offset}+{len}: size {} vs {}, first difference at \
             {first:?}",
            got.len(),
            data.len()
        );
    }
    data
}

/// A model configuration: mkfs.ext4 options, image size, block size, data mode.
struct Config {
    label: &'static str,
    mkfs: Vec<&'static str>,
    size: &'static str,
    block_size: u64,
    data: DataMode,
    /// Files are indirect-mapped (ext3: no extent feature).
    indirect: bool,
    /// The ea_inode feature: xattr values larger than a block are set too.
    ea_inode: bool,
    /// The quota feature: files get many owners and projects, and change them.
    quota: bool,
}

impl Config {
    /// The allocation unit: `-C`'s cluster size with bigalloc, the block size otherwise.
    fn cluster_size(&self) -> u64 {
        let cluster = self.mkfs.iter().position(|&a| a == "-C").map(|i| self.mkfs[i + 1]);
        cluster.map_or(self.block_size, |size| size.parse().expect("-C takes bytes"))
    }
}

fn config(label: &'static str, mkfs: Vec<&'static str>, block_size: u64) -> Config {
    let ea_inode = false;
    Config {
        label,
        mkfs,
        size: "64M",
        block_size,
        data: DataMode::Ordered,
        indirect: false,
        ea_inode,
        quota: false,
    }
}

fn configs() -> Vec<Config> {
    vec![
        config("4k", vec!["-b", "4096"], 4096),
        config("1k", vec!["-b", "1024"], 1024),
        config("4k-nocsum", vec!["-b", "4096", "-O", "^metadata_csum"], 4096),
        config("4k-no64bit", vec!["-b", "4096", "-O", "^64bit"], 4096),
    ]
}

/// Data journaling and the block sizes the first set leaves out. A 64 KiB-block file system
/// needs room for mkfs.ext4's smallest journal (1024 blocks, 64 MiB): the image is sparse.
fn more_configs() -> Vec<Config> {
    vec![
        Config { data: DataMode::Journal, ..config("4k-data-journal", vec!["-b", "4096"], 4096) },
        Config { data: DataMode::Journal, ..config("1k-data-journal", vec!["-b", "1024"], 1024) },
        config("2k", vec!["-b", "2048"], 2048),
        Config { size: "160M", ..config("64k", vec!["-b", "65536"], 65536) },
    ]
}

/// ext3: files and directories indirect-mapped, the journal too; ordered and journalled data.
fn ext3_configs() -> Vec<Config> {
    vec![
        Config { indirect: true, ..config("ext3-1k", vec!["-t", "ext3", "-b", "1024"], 1024) },
        Config { indirect: true, ..config("ext3-4k", vec!["-t", "ext3", "-b", "4096"], 4096) },
        Config {
            indirect: true,
            data: DataMode::Journal,
            ..config("ext3-1k-data-journal", vec!["-t", "ext3", "-b", "1024"], 1024)
        },
    ]
}

/// Without a journal: ext2 (indirect-mapped, 1 KiB and 4 KiB) and ext4 made with
/// `-O ^has_journal` (extent-mapped), committed by writing home.
fn no_journal_configs() -> Vec<Config> {
    vec![
        Config { indirect: true, ..config("ext2-1k", vec!["-t", "ext2", "-b", "1024"], 1024) },
        Config { indirect: true, ..config("ext2-4k", vec!["-t", "ext2", "-b", "4096"], 4096) },
        config("ext4-no-journal-4k", vec!["-O", "^has_journal", "-b", "4096"], 4096),
    ]
}

/// Features beyond the defaults that quill writes: meta_bg (1 KiB blocks over 300 MiB: three
/// meta groups, so descriptors live in groups 0/1/15, 16/17/31 and 32/33), mmp, inline_data
/// and ea_inode.
fn feature_configs() -> Vec<Config> {
    vec![
        Config {
            size: "300M",
            ..config("meta_bg-1k", vec!["-O", "meta_bg,^resize_inode", "-b", "1024"], 1024)
        },
        config("mmp-4k", vec!["-O", "mmp", "-b", "4096"], 4096),
        // New directories start inline and move out as they grow (`inline.rs`).
        config("inline_data-4k", vec!["-O", "inline_data", "-b", "4096"], 4096),
        config(
            "inline_data-1k-nocsum",
            vec!["-O", "inline_data,^metadata_csum", "-b", "1024"],
            1024,
        ),
        // Values too large for a block go to inodes of their own (`ea_inode.rs`).
        Config {
            ea_inode: true,
            ..config("ea_inode-1k", vec!["-O", "ea_inode", "-b", "1024"], 1024)
        },
        Config {
            ea_inode: true,
            ..config("ea_inode-4k-inline", vec!["-O", "ea_inode,inline_data", "-b", "4096"], 4096)
        },
    ]
}

/// Quota files kept by quill (e2fsck compares every id's usage after each unmount): user,
/// group and project quotas with 4 KiB blocks; 1 KiB blocks with inline data and values in
/// inodes of their own (both charged); ext3's indirect-mapped quota files.
fn quota_configs() -> Vec<Config> {
    let quota = |c: Config| Config { quota: true, ..c };
    vec![
        quota(config(
            "quota-4k-prj",
            vec!["-O", "quota,project", "-E", "quotatype=usrquota:grpquota:prjquota", "-b", "4096"],
            4096,
        )),
        Config {
            ea_inode: true,
            ..quota(config(
                "quota-1k-inline-ea_inode",
                vec!["-O", "quota,project,inline_data,ea_inode", "-b", "1024"],
                1024,
            ))
        },
        Config {
            indirect: true,
            ..quota(config("quota-ext3-1k", vec!["-t", "ext3", "-O", "quota", "-b", "1024"], 1024))
        },
    ]
}

/// bigalloc (`clusters.rs`): 16-block clusters with 4 KiB and 1 KiB blocks, 64 KiB blocks
/// under data journaling with 4-block clusters, without a journal, and with quota, project,
/// inline data and values in inodes of their own (xattr blocks and value inodes take clusters,
/// and e2fsck checks every id's usage in clusters).
fn bigalloc_configs() -> Vec<Config> {
    vec![
        Config {
            size: "256M",
            ..config("bigalloc-4k-c64k", vec!["-O", "bigalloc", "-b", "4096", "-C", "65536"], 4096)
        },
        config("bigalloc-1k-c16k", vec!["-O", "bigalloc", "-b", "1024", "-C", "16384"], 1024),
        Config {
            data: DataMode::Journal,
            ..config(
                "bigalloc-1k-c4k-data-journal",
                vec!["-O", "bigalloc", "-b", "1024", "-C", "4096"],
                1024,
            )
        },
        config(
            "bigalloc-4k-c32k-no-journal",
            vec!["-O", "bigalloc,^has_journal", "-b", "4096", "-C", "32768"],
            4096,
        ),
        Config {
            ea_inode: true,
            quota: true,
            ..config(
                "bigalloc-1k-c16k-quota-inline-ea_inode",
                vec![
                    "-O",
                    "bigalloc,quota,project,inline_data,ea_inode",
                    "-b",
                    "1024",
                    "-C",
                    "16384",
                ],
                1024,
            )
        },
    ]
}

/// Runs 4 threads × `steps` random operations on a fresh image of `c`, checks every model
/// after the threads finish and after remount, and `e2fsck -fn` after each unmount.
fn run_model(c: &Config, seed: u64, steps: usize) {
    let scratch = Scratch::new(&format!("model-{}", c.label));
    let image = scratch.path("fs.img");
    mkfs(&image, c.size, &c.mkfs);
    let block_size = c.block_size;
    let threads = 4;
    let fs = Arc::new(open_with(&image, c.data));
    assert_eq!(u64::from(fs.block_size()), block_size, "{}: block size", c.label);
    let mut bases = Vec::new();
    for t in 0..threads {
        bases.push(fs.mkdir(ROOT_INO, format!("t{t}").as_bytes(), 0o755, 0, 0).unwrap().ino);
    }
    let models: Vec<Model> = std::thread::scope(|s| {
        let handles: Vec<_> = bases
            .iter()
            .enumerate()
            .map(|(t, &base)| {
                let fs = fs.clone();
                s.spawn(move || {
                    let mut rng = Rng::for_thread(seed, t);
                    let mut model = Model::default();
                    for _ in 0..steps {
                        random_op(&fs, base, &mut model, &mut rng, c);
                    }
                    check_tree(&fs, base, &model);
                    model
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("worker")).collect()
    });
    Arc::into_inner(fs).unwrap().unmount().unwrap();
    assert_fsck_clean(&image);
    let fs = open_with(&image, c.data);
    for (t, model) in models.iter().enumerate() {
        let base = fs.lookup(ROOT_INO, format!("t{t}").as_bytes()).unwrap().ino;
        check_tree(&fs, base, model);
    }
    fs.unmount().unwrap();
    assert_fsck_clean(&image);
    println!("{}: {threads} threads x {steps} operations matched the model", c.label);
}

/// Runs every configuration of `configs` as [`run_model`] does, 150 operations per thread, with
/// the seed of `test` (skipped with a printed reason without mkfs.ext4 and e2fsck).
fn run_configs(test: &str, configs: Vec<Config>) {
    if !have("mkfs.ext4", test) || !have("e2fsck", test) {
        return;
    }
    let seed = seed(test);
    for c in configs {
        run_model(&c, seed, 150);
    }
}

#[test]
fn random_operations_from_several_threads_match_the_model_before_and_after_remount() {
    run_configs("random_operations", configs());
}

#[test]
fn random_operations_under_data_journal_and_with_2k_and_64k_blocks_match_the_model() {
    run_configs("random_operations_more_configs", more_configs());
}

#[test]
fn random_operations_on_ext3_match_the_model() {
    run_configs("random_operations_ext3", ext3_configs());
}

#[test]
fn random_operations_without_a_journal_match_the_model() {
    run_configs("random_operations_no_journal", no_journal_configs());
}

#[test]
fn random_operations_with_meta_bg_mmp_inline_data_and_ea_inode_match_the_model() {
    run_configs("random_operations_features", feature_configs());
}

#[test]
fn random_operations_with_quota_match_the_model_and_e2fscks_usage() {
    run_configs("random_operations_quota", quota_configs());
}

#[test]
fn random_operations_on_bigalloc_match_the_model() {
    run_configs("random_operations_bigalloc", bigalloc_configs());
}

#[test]
fn a_directory_of_thousands_of_names_becomes_an_htree_that_e2fsck_accepts() {
    if !have("mkfs.ext4", "htree") || !have("e2fsck", "htree") {
        return;
    }
    for (label, opts) in [("4k", vec!["-b", "4096"]), ("1k", vec!["-b", "1024"])] {
        let scratch = Scratch::new(&format!("htree-{label}"));
        let image = scratch.path("fs.img");
        mkfs(&image, "64M", &opts);
        let fs = open(&image);
        let dir = fs.mkdir(ROOT_INO, b"big", 0o755, 0, 0).unwrap().ino;
        let count: usize = 3000;
        for i in 0..count {
            fs.create(dir, format!("file-{i:05}-with-a-longer-name").as_bytes(), 0o644, 0, 0)
                .unwrap();
        }
        for i in (0..count).step_by(3) {
            fs.unlink(dir, format!("file-{i:05}-with-a-longer-name").as_bytes()).unwrap();
        }
        fs.unmount().unwrap();
        assert_fsck_clean(&image);
        let fs = open(&image);
        let dir = fs.lookup(ROOT_INO, b"big").unwrap().ino;
        for i in 0..count {
            let r = fs.lookup(dir, format!("file-{i:05}-with-a-longer-name").as_bytes());
            assert_eq!(r.is_ok(), i % 3 != 0, "file {i}");
        }
        let mut names = BTreeSet::new();
        for e in list_dir(&fs, dir, 100) {
            assert!(names.insert(e.name), "listed twice");
        }
        assert_eq!(names.len(), 2 + (count - count.div_ceil(3)));
        fs.unmount().unwrap();
    }
}

#[test]
fn filling_the_disk_from_several_threads_gives_enospc_and_deleting_frees_the_space() {
    if !have("mkfs.ext4", "enospc") || !have("e2fsck", "enospc") {
        return;
    }
    fill_then_free("enospc", "16M", &["-b", "4096"]);
}

/// The same on meta_bg (three meta groups of descriptors): every group's blocks, those of
/// groups whose bitmap was never built included, are allocated and freed.
#[test]
fn filling_a_meta_bg_file_system_gives_enospc_and_deleting_frees_the_space() {
    if !have("mkfs.ext4", "enospc_meta_bg") || !have("e2fsck", "enospc_meta_bg") {
        return;
    }
    fill_then_free("enospc-meta-bg", "300M", &["-O", "meta_bg,^resize_inode", "-b", "1024"]);
}

/// The same on bigalloc (16-block clusters): reservations in clusters hold, so writeback of
/// a full file system finds every cluster it needs, and the tree blocks it adds take theirs
/// from the metadata pool.
#[test]
fn filling_a_bigalloc_file_system_gives_enospc_and_deleting_frees_the_space() {
    if !have("mkfs.ext4", "enospc_bigalloc") || !have("e2fsck", "enospc_bigalloc") {
        return;
    }
    fill_then_free("enospc-bigalloc", "32M", &["-O", "bigalloc", "-b", "1024", "-C", "16384"]);
}

/// Four threads write until ENOSPC on a fresh image of `size` made with `mkfs_options`; the
/// disk is then full, writes back, frees everything on unlink, and checks clean.
fn fill_then_free(name: &str, size: &str, mkfs_options: &[&str]) {
    let scratch = Scratch::new(name);
    let image = scratch.path("fs.img");
    mkfs(&image, size, mkfs_options);
    let fs = Arc::new(open(&image));
    let fs_bytes = fs.statfs().blocks * u64::from(fs.block_size());
    let chunk = vec![0xA5u8; 256 * 1024];
    // The files exist first: a cached writer can fill the disk before another thread's
    // create, which would then (rightly) get ENOSPC itself.
    let files: Vec<u32> = (0..4)
        .map(|t| fs.create(ROOT_INO, format!("fill{t}").as_bytes(), 0o644, 0, 0).unwrap().ino)
        .collect();
    let written: u64 = std::thread::scope(|s| {
        let workers: Vec<_> = (0..4)
            .map(|t| {
                let fs = fs.clone();
                let chunk = &chunk;
                let ino = files[t];
                s.spawn(move || {
                    let mut offset = 0u64;
                    loop {
                        match fs.write(ino, offset, chunk) {
                            Ok(n) => offset += n as u64,
                            Err(FsError::NoSpace) => break,
                            Err(e) => panic!("thread {t}: {e}"),
                        }
                    }
                    // A thread may find the disk already full: ENOSPC is its answer then.
                    offset
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("worker")).sum()
    });
    assert!(written > fs_bytes / 2, "only {written} bytes fit on {fs_bytes}");
    // Full: nothing available to users; what is free is at most the 2% metadata pool kept
    // for writeback (as ext4's s_resv_clusters) plus a little.
    let statfs = fs.statfs();
    assert!(statfs.blocks_available == 0, "disk not full: {statfs:?}");
    assert!(statfs.blocks_free < statfs.blocks / 50 + 64, "disk not full: {statfs:?}");
    // Everything accepted was reserved: writing it all back on a full disk succeeds.
    fs.sync().expect("writeback of a full file system");
    for t in 0..4 {
        fs.unlink(ROOT_INO, format!("fill{t}").as_bytes()).unwrap();
    }
    let ino = fs.create(ROOT_INO, b"after", 0o644, 0, 0).unwrap().ino;
    assert_eq!(fs.write(ino, 0, &vec![1u8; 4 << 20]).unwrap(), 4 << 20);
    Arc::into_inner(fs).unwrap().unmount().unwrap();
    assert_fsck_clean(&image);
}

#[test]
fn many_threads_creating_writing_and_unlinking_in_one_directory_stay_correct() {
    if !have("mkfs.ext4", "one_directory") || !have("e2fsck", "one_directory") {
        return;
    }
    let scratch = Scratch::new("one-dir");
    let image = scratch.path("fs.img");
    mkfs(&image, "64M", &["-b", "1024"]);
    let fs = Arc::new(open(&image));
    let dir = fs.mkdir(ROOT_INO, b"shared", 0o755, 0, 0).unwrap().ino;
    let (threads, files) = (8, 300);
    std::thread::scope(|s| {
        for t in 0..threads {
            let fs = fs.clone();
            s.spawn(move || {
                for i in 0..files {
                    let name = format!("t{t}-file-{i}");
                    let ino = fs.create(dir, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
                    fs.write(ino, 0, name.as_bytes()).unwrap();
                    if i % 3 == 0 {
                        fs.unlink(dir, name.as_bytes()).unwrap();
                    }
                }
            });
        }
    });
    let check = |fs: &Filesystem| {
        let dir = fs.lookup(ROOT_INO, b"shared").unwrap().ino;
        let mut names = BTreeSet::new();
        for e in list_dir(fs, dir, 50) {
            if e.name != b"." && e.name != b".." {
                assert!(names.insert(e.name.clone()), "listed twice");
                assert_eq!(read_all(fs, e.ino), e.name, "contents of {:?}", e.name);
            }
        }
        let expected: BTreeSet<Vec<u8>> = (0..threads)
            .flat_map(|t| (0..files).filter(|i| i % 3 != 0).map(move |i| format!("t{t}-file-{i}")))
            .map(String::into_bytes)
            .collect();
        assert_eq!(names, expected);
    };
    check(&fs);
    Arc::into_inner(fs).unwrap().unmount().unwrap();
    assert_fsck_clean(&image);
    let fs = open(&image);
    check(&fs);
    fs.unmount().unwrap();
    assert_fsck_clean(&image);
}
