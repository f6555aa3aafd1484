//! The logical model a workload is checked against: what the tree looks like after every
//! operation, as POSIX says, with no notion of durability.
//!
//! Paths are relative to the thread's root ("" is the root itself, always a directory).
//! Inodes are never forgotten: an unlinked file keeps its last contents, so a crash image that
//! still shows it (the unlink did not reach the disk) can be checked against them.

use std::collections::BTreeMap;

use crate::workload::{pattern, symlink_target, xattr_value, Op};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    /// A whiteout (RENAME_WHITEOUT): a character device 0:0 with mode 0.
    Whiteout,
}

impl Kind {
    pub fn letter(self) -> char {
        match self {
            Kind::File => 'f',
            Kind::Dir => 'd',
            Kind::Symlink => 'l',
            Kind::Whiteout => 'c',
        }
    }
}

/// Model states are numbered: state `k` is the tree after the first `k` operations.
pub type StateIndex = usize;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inode {
    pub kind: Kind,
    pub perm: u16,
    /// File contents or symlink target.
    pub data: Vec<u8>,
    pub xattrs: BTreeMap<String, Vec<u8>>,
    /// The state in which the inode first exists.
    pub created: StateIndex,
    /// The newest state whose operation changed the inode (for a directory: also its entries).
    pub changed: StateIndex,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Model {
    pub inodes: Vec<Inode>,
    /// Path -> inode, the root "" included.
    pub names: BTreeMap<String, usize>,
    /// Xattr values may live in inodes of their own (ea_inode): no ENOSPC past one block.
    pub value_inodes: bool,
}

impl Default for Model {
    fn default() -> Model {
        Model::new()
    }
}

/// "A/C/foo" -> ("A/C", "foo"); "foo" -> ("", "foo").
pub fn split(path: &str) -> (&str, &str) {
    match path.rfind('/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => ("", path),
    }
}

impl Model {
    pub fn new() -> Model {
        let root = Inode {
            kind: Kind::Dir,
            perm: 0o755,
            data: Vec::new(),
            xattrs: BTreeMap::new(),
            created: 0,
            changed: 0,
        };
        Model {
            inodes: vec![root],
            names: BTreeMap::from([(String::new(), 0)]),
            value_inodes: false,
        }
    }

    /// The empty model of a workload on an image of kind `image` (`Config::image`): the
    /// `inline` images have ea_inode, so xattrs are not limited to one block.
    pub fn for_image(image: &str) -> Model {
        Model { value_inodes: image == "inline", ..Model::new() }
    }

    pub fn get(&self, path: &str) -> Option<&Inode> {
        self.names.get(path).map(|&i| &self.inodes[i])
    }

    pub fn kind(&self, path: &str) -> Option<Kind> {
        self.get(path).map(|i| i.kind)
    }

    pub fn is_file(&self, path: &str) -> bool {
        self.kind(path) == Some(Kind::File)
    }

    pub fn is_dir(&self, path: &str) -> bool {
        self.kind(path) == Some(Kind::Dir)
    }

    /// Whether `path` is free and its parent is a directory.
    pub fn can_create(&self, path: &str) -> bool {
        !self.names.contains_key(path) && self.is_dir(split(path).0)
    }

    pub fn is_empty_dir(&self, path: &str) -> bool {
        self.is_dir(path) && !self.names.keys().any(|p| is_under(p, path))
    }

    /// Names linked to inode `ino`.
    pub fn links(&self, ino: usize) -> usize {
        self.names.values().filter(|&&i| i == ino).count()
    }

    /// Applies `op` (operation number `k`, so the result is state `k + 1`); `tag` makes its data.
    /// An operation POSIX would refuse is an error and leaves the model unchanged.
    pub fn apply(&mut self, op: &Op, k: usize, tag: u64) -> Result<(), String> {
        let now = k + 1;
        let refuse = |why: &str| Err(format!("{op}: {why}"));
        match op {
            Op::Creat(p) | Op::Mkdir(p) | Op::Symlink { path: p, .. } => {
                if !self.can_create(p) {
                    return refuse("exists or has no parent directory");
                }
                let (kind, perm, data) = match op {
                    Op::Creat(_) => (Kind::File, 0o644, Vec::new()),
                    Op::Mkdir(_) => (Kind::Dir, 0o755, Vec::new()),
                    Op::Symlink { len, .. } => (Kind::Symlink, 0o777, symlink_target(tag, *len)),
                    _ => unreachable!(),
                };
                let inode =
                    Inode { kind, perm, data, xattrs: BTreeMap::new(), created: now, changed: now };
                self.inodes.push(inode);
                self.names.insert(p.clone(), self.inodes.len() - 1);
                self.touch_parent(p, now);
            }
            Op::Rmdir(p) => {
                if p.is_empty() || !self.is_empty_dir(p) {
                    return refuse("not an empty directory");
                }
                let ino = self.names.remove(p).expect("exists");
                self.inodes[ino].changed = now;
                self.touch_parent(p, now);
            }
            Op::Unlink(p) => {
                match self.kind(p) {
                    Some(Kind::File) | Some(Kind::Symlink) => {}
                    _ => return refuse("not a file or symlink"),
                }
                let ino = self.names.remove(p).expect("exists");
                self.inodes[ino].changed = now;
                self.touch_parent(p, now);
            }
            Op::Link { from, to } => {
                if !self.is_file(from) || !self.can_create(to) {
                    return refuse("source is not a file or target exists");
                }
                let ino = self.names[from];
                self.names.insert(to.clone(), ino);
                self.inodes[ino].changed = now;
                self.touch_parent(to, now);
            }
            Op::Rename { from, to, whiteout } => {
                self.rename(from, to, now).map_err(|e| format!("{op}: {e}"))?;
                if *whiteout {
                    let inode = Inode {
                        kind: Kind::Whiteout,
                        perm: 0,
                        data: Vec::new(),
                        xattrs: BTreeMap::new(),
                        created: now,
                        changed: now,
                    };
                    self.inodes.push(inode);
                    self.names.insert(from.clone(), self.inodes.len() - 1);
                }
            }
            Op::Write { path, offset, len } => {
                let ino = self.file_ino(path).map_err(|e| format!("{op}: {e}"))?;
                let data = &mut self.inodes[ino].data;
                let end = (offset + len) as usize;
                if data.len() < end {
                    data.resize(end, 0);
                }
                data[*offset as usize..end].copy_from_slice(&pattern(tag, *offset, *len));
                self.inodes[ino].changed = now;
            }
            Op::Falloc { path, offset, len, keep_size, zero } => {
                let ino = self.file_ino(path).map_err(|e| format!("{op}: {e}"))?;
                let data = &mut self.inodes[ino].data;
                let end = (offset + len) as usize;
                if *zero {
                    let inside = data.len().min(end);
                    if (*offset as usize) < inside {
                        data[*offset as usize..inside].fill(0);
                    }
                }
                if !keep_size && data.len() < end {
                    data.resize(end, 0);
                }
                self.inodes[ino].changed = now;
            }
            Op::Truncate { path, size } => {
                let ino = self.file_ino(path).map_err(|e| format!("{op}: {e}"))?;
                self.inodes[ino].data.resize(*size as usize, 0);
                self.inodes[ino].changed = now;
            }
            Op::SetXattr { path, name, len } => {
                let Some(&ino) = self.names.get(path) else { return refuse("no such path") };
                if self.inodes[ino].kind == Kind::Symlink {
                    return refuse("user xattrs are not allowed on symlinks");
                }
                let mut xattrs = self.inodes[ino].xattrs.clone();
                xattrs.insert(name.clone(), xattr_value(tag, *len));
                if !self.value_inodes && xattr_bytes(&xattrs) > XATTR_SPACE {
                    return refuse("the xattrs would not fit in one xattr block (ENOSPC)");
                }
                self.inodes[ino].xattrs = xattrs;
                self.inodes[ino].changed = now;
            }
            Op::RemoveXattr { path, name } => {
                let Some(&ino) = self.names.get(path) else { return refuse("no such path") };
                if self.inodes[ino].xattrs.remove(name).is_none() {
                    return refuse("no such xattr");
                }
                self.inodes[ino].changed = now;
            }
            Op::Fsync(p) | Op::Fdatasync(p) => {
                if !self.names.contains_key(p) {
                    return refuse("no such path");
                }
            }
            Op::Sync => {}
        }
        Ok(())
    }

    fn file_ino(&self, path: &str) -> Result<usize, String> {
        match self.names.get(path) {
            Some(&i) if self.inodes[i].kind == Kind::File => Ok(i),
            _ => Err("not a regular file".into()),
        }
    }

    fn touch_parent(&mut self, path: &str, now: StateIndex) {
        let parent = self.names[split(path).0];
        self.inodes[parent].changed = now;
    }

    fn rename(&mut self, from: &str, to: &str, now: StateIndex) -> Result<(), String> {
        let Some(&src) = self.names.get(from) else { return Err("no source".into()) };
        if from.is_empty() || to.is_empty() || from == to {
            return Err("bad names".into());
        }
        if !self.is_dir(split(to).0) {
            return Err("target parent is not a directory".into());
        }
        let src_dir = self.inodes[src].kind == Kind::Dir;
        if src_dir && (is_under(to, from)) {
            return Err("cannot move a directory under itself".into());
        }
        if let Some(&dst) = self.names.get(to) {
            let dst_dir = self.inodes[dst].kind == Kind::Dir;
            if src_dir != dst_dir || (dst_dir && !self.is_empty_dir(to)) {
                return Err("target kind differs or is a non-empty directory".into());
            }
            if dst == src {
                return Err("source and target are links to one inode".into());
            }
            self.inodes[dst].changed = now;
        }
        let moved: Vec<(String, usize)> = self
            .names
            .iter()
            .filter(|(p, _)| *p == from || is_under(p, from))
            .map(|(p, &i)| (p.clone(), i))
            .collect();
        for (p, _) in &moved {
            self.names.remove(p);
        }
        for (p, i) in moved {
            let renamed = format!("{to}{}", &p[from.len()..]);
            self.names.insert(renamed, i);
        }
        self.inodes[src].changed = now;
        self.touch_parent(from, now);
        self.touch_parent(to, now);
        Ok(())
    }

    /// The part of the tree under `root`, with paths relative to it (inode numbers kept).
    pub fn subtree(&self, root: &str) -> Model {
        if root.is_empty() {
            return self.clone();
        }
        let names = self
            .names
            .iter()
            .filter_map(|(p, &i)| match p.strip_prefix(root) {
                Some("") => Some((String::new(), i)),
                Some(rest) if rest.starts_with('/') => Some((rest[1..].to_string(), i)),
                _ => None,
            })
            .collect();
        Model { inodes: self.inodes.clone(), names, value_inodes: self.value_inodes }
    }

    /// The tree's shape: path -> (kind, hard-link group, symlink target), root excluded. A
    /// hard-link group is named by its smallest path, so two trees compare equal exactly when
    /// they have the same names, kinds, links and symlink targets.
    pub fn namespace(&self) -> Namespace {
        namespace_from(self.names.iter().filter(|(p, _)| !p.is_empty()).map(|(p, &i)| {
            let inode = &self.inodes[i];
            let target = if inode.kind == Kind::Symlink { inode.data.clone() } else { vec![] };
            (p.as_str(), i, inode.kind.letter(), target)
        }))
    }
}

/// A [`Namespace`] from (path, inode, kind letter, symlink target) items in path order: each
/// hard-link group is named by the first (smallest) path of its inode.
pub(crate) fn namespace_from<'a, K: Ord + Copy>(
    items: impl IntoIterator<Item = (&'a str, K, char, Vec<u8>)>,
) -> Namespace {
    let items: Vec<_> = items.into_iter().collect();
    let mut first: BTreeMap<K, &str> = BTreeMap::new();
    for &(path, inode, ..) in &items {
        first.entry(inode).or_insert(path);
    }
    items
        .into_iter()
        .map(|(path, inode, kind, target)| {
            (path.to_string(), (kind, first[&inode].to_string(), target))
        })
        .collect()
}

/// Bytes a set of user xattrs takes in an xattr block: a 16-byte entry plus the name (without
/// "user.") and the value, each padded to 4 bytes.
fn xattr_bytes(xattrs: &BTreeMap<String, Vec<u8>>) -> usize {
    let pad = |n: usize| n.div_ceil(4) * 4;
    xattrs.iter().map(|(n, v)| 16 + pad(n.len().saturating_sub(5)) + pad(v.len())).sum()
}

/// What the model lets xattrs take: a 4 KiB block less its 32-byte header and end marker,
/// with a margin. Beyond it ext4 (and quill) fail with ENOSPC.
const XATTR_SPACE: usize = 3900;

/// See [`Model::namespace`].
pub type Namespace = BTreeMap<String, (char, String, Vec<u8>)>;

/// `root/path`, either part possibly empty.
pub fn join(root: &str, path: &str) -> String {
    match (root.is_empty(), path.is_empty()) {
        (true, _) => path.to_string(),
        (false, true) => root.to_string(),
        (false, false) => format!("{root}/{path}"),
    }
}

/// Whether `path` is strictly inside directory `dir` ("" is the root).
pub fn is_under(path: &str, dir: &str) -> bool {
    if dir.is_empty() {
        return !path.is_empty();
    }
    path.len() > dir.len() && path.starts_with(dir) && path.as_bytes()[dir.len()] == b'/'
}
