//! The tree a crash image holds, read through quill: what the checks compare.

use std::collections::BTreeMap;

use fs::{Filesystem, FsError, ROOT_INO};
use ondisk::ext4;

/// One path of a recovered tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub ino: u32,
    /// 'f' regular file, 'd' directory, 'l' symlink, 'o' anything else.
    pub kind: char,
    pub perm: u16,
    pub size: u64,
    pub nlink: u32,
    /// File contents or symlink target.
    pub data: Vec<u8>,
    pub xattrs: BTreeMap<String, Vec<u8>>,
}

pub type Tree = BTreeMap<String, Node>;

fn err(what: &str, e: FsError) -> String {
    format!("{what}: {e}")
}

/// Every path under the root except lost+found; an error (a crash image quill cannot read)
/// is a string, not a panic.
pub fn read_tree(fs: &Filesystem) -> Result<Tree, String> {
    let mut tree = Tree::new();
    walk(fs, ROOT_INO, "", &mut tree)?;
    Ok(tree)
}

fn walk(fs: &Filesystem, dir: u32, prefix: &str, tree: &mut Tree) -> Result<(), String> {
    let mut cookie = 0;
    let mut entries = Vec::new();
    loop {
        let got = fs.readdir(dir, cookie, 64).map_err(|e| err(&format!("readdir /{prefix}"), e))?;
        let Some(last) = got.last() else { break };
        cookie = last.next_cookie;
        entries.extend(got);
        if entries.len() > 100_000 {
            return Err(format!("readdir /{prefix}: more than 100,000 entries"));
        }
    }
    for e in entries {
        if e.name == b"." || e.name == b".." || (prefix.is_empty() && e.name == b"lost+found") {
            continue;
        }
        let name = String::from_utf8_lossy(&e.name).into_owned();
        let path = if prefix.is_empty() { name } else { format!("{prefix}/{name}") };
        let attr = fs.getattr(e.ino).map_err(|x| err(&format!("getattr {path}"), x))?;
        let kind = match attr.mode & ext4::MODE_TYPE_MASK {
            ext4::MODE_REGULAR => 'f',
            ext4::MODE_DIR => 'd',
            ext4::MODE_SYMLINK => 'l',
            ext4::MODE_CHRDEV => 'c',
            _ => 'o',
        };
        let data = match kind {
            'f' => {
                if attr.size > 64 << 20 {
                    return Err(format!("{path}: size {} is beyond any workload", attr.size));
                }
                let mut buf = vec![0u8; attr.size as usize];
                let n = fs.read(e.ino, 0, &mut buf).map_err(|x| err(&format!("read {path}"), x))?;
                if n != buf.len() {
                    return Err(format!("{path}: read {n} of {} bytes", buf.len()));
                }
                buf
            }
            'l' => fs.readlink(e.ino).map_err(|x| err(&format!("readlink {path}"), x))?,
            _ => Vec::new(),
        };
        let mut xattrs = BTreeMap::new();
        if kind != 'l' {
            for name in fs.listxattr(e.ino).map_err(|x| err(&format!("listxattr {path}"), x))? {
                let value =
                    fs.getxattr(e.ino, &name).map_err(|x| err(&format!("getxattr {path}"), x))?;
                xattrs.insert(String::from_utf8_lossy(&name).into_owned(), value);
            }
        }
        let node = Node {
            ino: e.ino,
            kind,
            perm: attr.mode & 0o7777,
            size: attr.size,
            nlink: attr.nlink,
            data,
            xattrs,
        };
        tree.insert(path.clone(), node);
        if kind == 'd' {
            walk(fs, e.ino, &path, tree)?;
        }
    }
    Ok(())
}

/// The first difference between two trees, in a line.
pub fn tree_difference(a: &Tree, b: &Tree) -> Option<String> {
    for (path, na) in a {
        match b.get(path) {
            None => return Some(format!("{path} only in the first tree")),
            Some(nb) if nb != na => {
                let first = na.data.iter().zip(&nb.data).position(|(x, y)| x != y);
                return Some(format!(
                    "{path}: (ino {}, {}, {:o}, size {}, nlink {}, xattrs {:?}) vs (ino {}, {}, \
                     {:o}, size {}, nlink {}, xattrs {:?}), first differing byte {first:?}",
                    na.ino,
                    na.kind,
                    na.perm,
                    na.size,
                    na.nlink,
                    na.xattrs.keys().collect::<Vec<_>>(),
                    nb.ino,
                    nb.kind,
                    nb.perm,
                    nb.size,
                    nb.nlink,
                    nb.xattrs.keys().collect::<Vec<_>>(),
                ));
            }
            Some(_) => {}
        }
    }
    b.keys().find(|p| !a.contains_key(*p)).map(|p| format!("{p} only in the second tree"))
}

/// The part of `tree` under `root` (relative paths, borrowing its nodes), and its shape as
/// [`crate::model::Model::namespace`] gives a model's: path -> (kind, hard-link group, symlink
/// target).
pub fn namespace_of<'t>(
    tree: &'t Tree,
    root: &str,
) -> (BTreeMap<String, &'t Node>, crate::model::Namespace) {
    let sub: BTreeMap<String, &Node> = tree
        .iter()
        .filter_map(|(p, n)| {
            let rel = if root.is_empty() {
                Some(p.as_str())
            } else {
                p.strip_prefix(root)?.strip_prefix('/')
            };
            rel.map(|r| (r.to_string(), n))
        })
        .collect();
    let ns = crate::model::namespace_from(sub.iter().map(|(p, n)| {
        let target = if n.kind == 'l' { n.data.clone() } else { Vec::new() };
        (p.as_str(), n.ino, n.kind, target)
    }));
    (sub, ns)
}
