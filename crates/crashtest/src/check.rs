//! The checks a crash image must pass.
//!
//! - **acknowledged**: the tree quill recovered is one the workload could have left: its
//!   names, kinds, links and symlinks are those of the model after some prefix of every thread's
//!   operations (so each metadata operation, rename included, is all or nothing), no shorter
//!   than what the acknowledged persistence points made durable; and each inode shows contents,
//!   size and xattrs of one of its versions no older than its last acknowledged fsync,
//!   fdatasync or sync, every byte inside i_size being a byte some version has there (no stale
//!   block, no zeros where data was written);
//! - **e2fsck-fn**: stock `e2fsck -fn` finds quill's recovered image clean;
//! - **e2fsck-fy** and **same-tree**: stock `e2fsck -fy` on a copy of the raw crash image
//!   (e2fsprogs' own journal replay) repairs nothing beyond replay, orphans and free counts,
//!   and reaches the same tree as quill: names, kinds, modes, sizes, contents, link counts,
//!   inode numbers and xattrs.
//!
//! What persistence points promise (ext4's behaviour, which the xfstests power-failure tests
//! expect):
//! - `sync` by any thread: every operation that returned before it started is durable;
//! - `fsync(p)`: p's data and metadata as of the fsync, and every operation of the thread up to
//!   the last one that changed p (transactions commit in order; ext4 commits a new file's
//!   directory entry with it, and a directory's fsync its entries);
//! - `fdatasync(p)`: p's data and size, and p's creation.
//!
//! With `fsync_journal` (iJournaling's file-level fsync, [`FsyncPromise::PerFile`]) an fsync
//! written as a fast commit makes p alone durable, as iJournaling promises: `fsync(p)` then
//! promises p's data and metadata and p's existence, not the thread's other operations before
//! it (an fsync that commits the transaction keeps more, which the check allows). A regular
//! file created and fsynced may so outlive the crash while operations before its creation do
//! not (iJournaling's own test: of files created in turn, only the fsynced ones are there
//! after the crash): the names are then those after some prefix `j` of the thread's
//! operations plus such files, each named as its `creat` or a rename (LINK and UNLINK
//! records) named it, in a directory that exists after op `j`, and with an fsync or
//! fdatasync of it started; a renamed one's name after op `j` is then gone.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use crate::model::{Inode, Kind, Model, StateIndex};
use crate::run::{decode_mark, Expected};
use crate::tree::{namespace_of, Node, Tree};
use crate::workload::{Op, Workload};

/// What the marks of a crash state say about thread `t`.
#[derive(Debug, Clone, Default)]
struct Bounds {
    /// Operations that had started: the newest possible state.
    hi: usize,
    /// The oldest state the namespace may be in.
    ns_lo: usize,
    /// The oldest version of every inode (from syncs).
    all_lo: usize,
    /// Per inode: the oldest version of its metadata (fsync) and of its data (fsync,
    /// fdatasync).
    meta_lo: BTreeMap<usize, usize>,
    data_lo: BTreeMap<usize, usize>,
    /// [`FsyncPromise::PerFile`]: inodes an acknowledged fsync or fdatasync made durable,
    /// which must be in the tree under some name.
    present: Vec<usize>,
    /// [`FsyncPromise::PerFile`]: regular files that may be there beyond the prefix, by the
    /// path their `creat` or a rename gave them: (inode, state that naming led to), each one
    /// a path had (a name may be created, deleted and created again).
    fast_created: BTreeMap<String, Vec<(usize, usize)>>,
}

/// What an acknowledged fsync promises beyond its file's own data and metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsyncPromise {
    /// ext4's: every operation of the thread up to the last one that changed the file (its
    /// transaction, and the ones before it, committed).
    Transaction,
    /// iJournaling's file-level transaction: the file's creation, nothing else.
    PerFile,
    /// The kernel's ext4: as [`FsyncPromise::Transaction`], but a write that leaves a file's
    /// size as it was need not join any transaction. ext4 stamps times from the coarse clock
    /// (and, with multigrain timestamps, only when nobody asked for the old ones), so such a
    /// write inside one tick changes nothing the journal logs: fsync writes its bytes in
    /// place and, the file's last transaction being committed already, commits nothing,
    /// leaving the thread's earlier operations on other files uncommitted. The file's
    /// transaction is then that of its last change other than such writes. (Seen with seed
    /// 1795864949533210718: unlink A/foo, overwrite B/foo, fsync B/foo, and the crash image
    /// kept A/foo, by the kernel's own recovery too.)
    Ext4Kernel,
}

/// The state after the last operation before op `i` that changed file `m` in something ext4
/// journals: anything but its bytes under an unchanged size ([`FsyncPromise::Ext4Kernel`]).
fn last_logged_change(states: &[Model], i: usize, m: usize) -> StateIndex {
    let overwrite_only = |before: &Inode, after: &Inode| {
        before.data != after.data
            && before.data.len() == after.data.len()
            && (before.kind, before.perm, &before.xattrs) == (after.kind, after.perm, &after.xattrs)
    };
    (0..i)
        .rev()
        .find(|&k| match (states[k].inodes.get(m), states[k + 1].inodes.get(m)) {
            (Some(before), Some(after)) => before != after && !overwrite_only(before, after),
            (None, Some(_)) => true,
            _ => false,
        })
        .map_or(0, |k| k + 1)
}

fn bounds(
    w: &Workload,
    states: &[Vec<Model>],
    marks: &[u64],
    promise: FsyncPromise,
) -> Vec<Bounds> {
    let threads = w.threads.len();
    let mut start_pos = BTreeMap::new();
    let mut end_pos = BTreeMap::new();
    for (pos, &label) in marks.iter().enumerate() {
        let (t, i, end) = decode_mark(label);
        if t < threads && i < w.threads[t].len() {
            if end { &mut end_pos } else { &mut start_pos }.insert((t, i), pos);
        }
    }
    let mut b = vec![Bounds::default(); threads];
    for &(t, i) in start_pos.keys() {
        b[t].hi = b[t].hi.max(i + 1);
    }
    if promise == FsyncPromise::PerFile {
        // A regular file named by `creat` or a rename, whose fsync or fdatasync started, may
        // be there under that name on its own (a fast commit's CREAT, or LINK and UNLINK).
        for &(t, i) in start_pos.keys() {
            let (Op::Fsync(p) | Op::Fdatasync(p)) = &w.threads[t][i] else { continue };
            let Some(&m) = states[t][i].names.get(p) else { continue };
            if states[t][i].inodes[m].kind != Kind::File {
                continue;
            }
            // The op that gave `m` the name `p` last: it is not named so in the state before.
            let named = (0..i).rev().find(|&k| states[t][k].names.get(p) != Some(&m));
            let Some(k) = named else { continue };
            let by_name = match &w.threads[t][k] {
                Op::Creat(c) => c == p,
                Op::Rename { to, whiteout: false, .. } => to == p,
                _ => false,
            };
            let entry = b[t].fast_created.entry(p.clone()).or_default();
            if by_name && !entry.contains(&(m, k + 1)) {
                entry.push((m, k + 1));
            }
        }
    }
    for &(t, i) in end_pos.keys() {
        let before = &states[t][i];
        let inode = |p: &str| before.names.get(p).copied();
        match &w.threads[t][i] {
            Op::Sync => {
                let started = start_pos[&(t, i)];
                for (u, bu) in b.iter_mut().enumerate() {
                    let done = end_pos
                        .range((u, 0)..(u + 1, 0))
                        .filter(|(_, &pos)| pos < started)
                        .map(|(&(_, k), _)| k + 1)
                        .max()
                        .unwrap_or(0);
                    bu.all_lo = bu.all_lo.max(done);
                    bu.ns_lo = bu.ns_lo.max(done);
                }
            }
            Op::Fsync(p) | Op::Fdatasync(p) => {
                let Some(m) = inode(p) else { continue };
                let node = &before.inodes[m];
                let data_only =
                    matches!(w.threads[t][i], Op::Fdatasync(_)) && node.kind == Kind::File;
                let bt = &mut b[t];
                if promise == FsyncPromise::PerFile {
                    bt.present.push(m);
                    if !data_only {
                        let lo = bt.meta_lo.entry(m).or_default();
                        *lo = (*lo).max(i + 1);
                    }
                } else if data_only {
                    bt.ns_lo = bt.ns_lo.max(node.created);
                } else {
                    let changed = if promise == FsyncPromise::Ext4Kernel && node.kind == Kind::File
                    {
                        last_logged_change(&states[t], i, m)
                    } else {
                        node.changed
                    };
                    bt.ns_lo = bt.ns_lo.max(changed);
                    let lo = bt.meta_lo.entry(m).or_default();
                    *lo = (*lo).max(i + 1);
                }
                let lo = bt.data_lo.entry(m).or_default();
                *lo = (*lo).max(i + 1);
            }
            _ => {}
        }
    }
    b
}

/// What a file system shows of file data it was not asked to make durable (versions older
/// than the last acknowledged fsync, fdatasync or sync are never allowed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unacknowledged {
    /// quill: each file shows the size of one of its versions, and every byte inside it is a
    /// byte some version has there.
    WholeVersions,
    /// ext4 data=ordered (the kernel): a write's i_size reaches the journal with each page it
    /// writes into a block already allocated (ext4_da_should_update_i_disksize), ahead of that
    /// block's data, which ordered mode does not write first, and behind the write's later,
    /// delayed pages. A file may then show any size between its versions' smallest and
    /// largest, and zeros past the smallest (what the block held past the old end of file);
    /// never stale data.
    Ext4Ordered,
}

/// The **acknowledged** check of `tree` at a crash point whose marks are `marks`.
pub fn check_acknowledged(
    w: &Workload,
    expected: &Expected,
    marks: &[u64],
    tree: &Tree,
    unacknowledged: Unacknowledged,
    promise: FsyncPromise,
) -> Result<(), String> {
    for (t, b) in bounds(w, &expected.states, marks, promise).iter().enumerate() {
        check_thread(expected, t, b, tree, unacknowledged).map_err(|e| {
            let who =
                if expected.roots[t].is_empty() { String::new() } else { format!("thread {t}: ") };
            format!("{who}{e}")
        })?;
    }
    Ok(())
}

/// Thread `t`'s subtree is the model's after some prefix `j` of its operations, within the
/// bounds, with every inode as some allowed version of it.
fn check_thread(
    expected: &Expected,
    t: usize,
    b: &Bounds,
    tree: &Tree,
    unacknowledged: Unacknowledged,
) -> Result<(), String> {
    let (sub, ns) = namespace_of(tree, &expected.roots[t]);
    let states = &expected.states[t];
    let mut inode_error = None;
    for j in b.ns_lo..=b.hi {
        for names in names_after(&states[j], &expected.namespaces[t][j], &ns, b, j) {
            // An fsynced file created after op `j` must be there on its own (one that existed
            // by then is in or out of the names as op `j` left it).
            let after_j = |m: &&usize| states[j].inodes.get(**m).is_none_or(|i| i.created > j);
            let gone = b.present.iter().filter(after_j).find(|m| !names.values().any(|n| n == *m));
            if let Some(m) = gone {
                inode_error.get_or_insert(format!(
                    "names as after op {j}, but fsynced inode {m} is missing"
                ));
                continue;
            }
            match check_inodes(&names, states, b, &sub, unacknowledged) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    inode_error.get_or_insert(format!("names as after op {j}, but {e}"));
                }
            }
        }
    }
    if let Some(e) = inode_error {
        return Err(e);
    }
    let newest = &expected.namespaces[t][b.hi];
    let oldest = &expected.namespaces[t][b.ns_lo];
    Err(format!(
        "the names match no state the workload could leave (after {} to {} ops): vs the newest, \
         {}; vs the oldest, {}",
        b.ns_lo,
        b.hi,
        namespace_difference(&ns, newest),
        namespace_difference(&ns, oldest)
    ))
}

fn namespace_difference(got: &crate::model::Namespace, want: &crate::model::Namespace) -> String {
    let show = |v: &(char, String, Vec<u8>)| {
        let link = if v.0 == 'f' { format!(" linked with {}", v.1) } else { String::new() };
        let target = if v.0 == 'l' {
            format!(" -> {}", String::from_utf8_lossy(&v.2))
        } else {
            String::new()
        };
        format!("{}{link}{target}", v.0)
    };
    for (p, v) in got {
        match want.get(p) {
            None => return format!("{p} ({}) should not exist", show(v)),
            Some(x) if x != v => return format!("{p} is {} instead of {}", show(v), show(x)),
            _ => {}
        }
    }
    match want.iter().find(|(p, _)| !got.contains_key(*p)) {
        Some((p, v)) => format!("{p} ({}) is missing", show(v)),
        None => "no difference".into(),
    }
}

/// Versions of inode `m` in states `lo..=hi` (where it exists), oldest first, deduplicated.
/// A shrinking truncate adds one more: the old contents with the tail of the new last block
/// zeroed, because the zeroing is written in place before the new size commits (ext4 does
/// the same), so a crash in between shows the old size with those bytes zero.
fn versions(states: &[Model], m: usize, lo: usize, hi: usize) -> Vec<Inode> {
    let mut out: Vec<Inode> = Vec::new();
    let mut push = |inode: Inode| {
        if !out.iter().any(|v| v.data == inode.data && v.xattrs == inode.xattrs) {
            out.push(inode);
        }
    };
    let lo = lo.min(hi);
    for k in lo..=hi {
        let Some(inode) = states[k].inodes.get(m) else { continue };
        if let Some(next) = states.get(k + 1).filter(|_| k < hi).and_then(|s| s.inodes.get(m)) {
            let (old, new) = (&inode.data, &next.data);
            if inode.kind == Kind::File && new.len() < old.len() && old[..new.len()] == new[..] {
                let block = crate::run::BLOCK_SIZE as usize;
                let end = old.len().min(new.len().div_ceil(block) * block);
                let mut zeroed = inode.clone();
                zeroed.data[new.len()..end].fill(0);
                push(zeroed);
            }
        }
        push(inode.clone());
    }
    out
}

/// The recovered names `ns` as the names after op `j` (`at`, whose namespace is `want`) plus
/// files of `b.fast_created` named after it: each way to read them, path -> inode (none when
/// they are not). A fast-named file may also stand under a name an older file had after op
/// `j` (its fast commit deleted that one first, `fsync_journal::Unlinked`): the names alone
/// cannot tell the two apart, so each such path gives both readings. And a name a file had
/// after op `j` may be gone where the file stands under a newer name (its rename's fast
/// commit).
fn names_after(
    at: &Model,
    want: &crate::model::Namespace,
    ns: &crate::model::Namespace,
    b: &Bounds,
    j: usize,
) -> Vec<BTreeMap<String, usize>> {
    // The files that may stand alone at `path` (`value` in `ns`), named there after op `j`.
    let fast_named_after_j = |path: &str, value: &(char, String, Vec<u8>)| -> Vec<usize> {
        let (parent, _) = crate::model::split(path);
        let alone = value.0 == 'f' && value.1 == path;
        if !alone || !at.names.contains_key(parent) {
            return Vec::new();
        }
        let named = b.fast_created.get(path).map(Vec::as_slice).unwrap_or_default();
        named.iter().filter(|&&(_, at_state)| at_state > j).map(|&(m, _)| m).collect()
    };
    let names = at.names.clone();
    // Each path's choices: an inode, or (`None`) the name as op `j` left it.
    let mut choices: Vec<(&String, Vec<Option<usize>>)> = Vec::new();
    let mut moved_away: Vec<&String> = Vec::new();
    if want != ns {
        if b.fast_created.is_empty() {
            return Vec::new();
        }
        for (path, value) in want.iter().filter(|(p, v)| ns.get(*p) != Some(*v)) {
            if ns.contains_key(path) || value.0 != 'f' {
                return Vec::new();
            }
            moved_away.push(path);
        }
        for (path, value) in ns.iter().filter(|(p, _)| !want.contains_key(*p)) {
            let named = fast_named_after_j(path, value);
            if named.is_empty() {
                return Vec::new();
            }
            choices.push((path, named.into_iter().map(Some).collect()));
        }
    }
    // Names the old file had after op `j` that a fast-named file may have taken over.
    for (path, value) in want.iter().filter(|(p, v)| ns.get(*p) == Some(*v)) {
        let named: Vec<Option<usize>> = fast_named_after_j(path, value)
            .into_iter()
            .filter(|&m| names.get(path) != Some(&m))
            .map(Some)
            .collect();
        if !named.is_empty() && choices.len() < 8 {
            choices.push((path, std::iter::once(None).chain(named).collect()));
        }
    }
    let mut readings = vec![BTreeMap::new()];
    for (path, options) in &choices {
        readings = readings
            .into_iter()
            .flat_map(|reading: BTreeMap<&String, usize>| {
                options.iter().map(move |option| {
                    let mut reading = reading.clone();
                    if let Some(m) = option {
                        reading.insert(*path, *m);
                    }
                    reading
                })
            })
            .take(256)
            .collect();
    }
    readings
        .into_iter()
        .filter_map(|chosen| {
            let mut reading = names.clone();
            for (path, &m) in &chosen {
                reading.insert((*path).clone(), m);
            }
            // A name gone from the tree is the old name of a file the reading puts under a
            // newer one.
            for path in &moved_away {
                let m = names[*path];
                if !chosen.values().any(|&n| n == m) {
                    return None;
                }
                reading.remove(*path);
            }
            Some(reading)
        })
        .collect()
}

fn check_inodes(
    names: &BTreeMap<String, usize>,
    states: &[Model],
    b: &Bounds,
    sub: &BTreeMap<String, &Node>,
    unacknowledged: Unacknowledged,
) -> Result<(), String> {
    for (path, node) in sub {
        let m = names[path];
        let meta_lo = b.all_lo.max(b.meta_lo.get(&m).copied().unwrap_or(0));
        let data_lo = meta_lo.max(b.data_lo.get(&m).copied().unwrap_or(0));
        let meta = versions(states, m, meta_lo, b.hi);
        if meta.is_empty() {
            return Err(format!("{path}: inode {m} has no version after op {meta_lo}"));
        }
        if !meta.iter().any(|v| v.perm == node.perm) {
            return Err(format!("{path}: mode {:o} is no version's", node.perm));
        }
        if !meta.iter().any(|v| v.xattrs == node.xattrs) {
            let names: Vec<&String> = node.xattrs.keys().collect();
            return Err(format!(
                "{path}: xattrs {names:?} (values of {:?} bytes) match no version since op \
                 {meta_lo} ({} versions)",
                node.xattrs.values().map(Vec::len).collect::<Vec<_>>(),
                meta.len()
            ));
        }
        if node.kind == 'f' {
            let versions = versions(states, m, data_lo, b.hi);
            check_data(path, node, &versions, data_lo, unacknowledged)?;
        }
    }
    Ok(())
}

/// The size is some version's, and every byte inside it is the byte some version has there
/// (with [`Unacknowledged::Ext4Ordered`], also a size between theirs and zeros past the
/// smallest).
fn check_data(
    path: &str,
    node: &Node,
    versions: &[Inode],
    since: usize,
    unacknowledged: Unacknowledged,
) -> Result<(), String> {
    let sizes: Vec<usize> = versions.iter().map(|v| v.data.len()).collect();
    let smallest = sizes.iter().copied().min().unwrap_or(0);
    let largest = sizes.iter().copied().max().unwrap_or(0);
    let ordered = unacknowledged == Unacknowledged::Ext4Ordered;
    let size_ok = sizes.contains(&node.data.len())
        || ordered && (smallest..=largest).contains(&node.data.len());
    if !size_ok {
        return Err(format!(
            "{path}: size {} is none of the sizes {sizes:?} it had since op {since}",
            node.data.len()
        ));
    }
    for (i, byte) in node.data.iter().enumerate() {
        let unwritten_tail = ordered && *byte == 0 && i >= smallest;
        if !unwritten_tail && !versions.iter().any(|v| v.data.get(i) == Some(byte)) {
            let what = if *byte == 0 { "a zero" } else { "stale data" };
            return Err(format!(
                "{path} (size {}): byte {i} is {byte:#04x} ({what}), which no version since op \
                 {since} has there",
                node.data.len()
            ));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// e2fsck

/// The value of a `Label:   value` line of `dumpe2fs -h` output, trimmed ("" if absent).
pub fn dumpe2fs_field<'a>(header: &'a str, label: &str) -> &'a str {
    header
        .lines()
        .find_map(|l| l.strip_prefix(label).and_then(|rest| rest.strip_prefix(':')))
        .map_or("", str::trim)
}

/// Runs `cmd`: its exit code (-1 when killed) and its output.
pub fn run_tool(cmd: &mut Command) -> Result<(i32, String), String> {
    let out = cmd.output().map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    Ok((out.status.code().unwrap_or(-1), text))
}

fn head(text: &str) -> String {
    text.lines().take(20).collect::<Vec<_>>().join("\n")
}

/// `e2fsck -fn`: exit 0 or the first lines of its complaint.
pub fn e2fsck_clean(path: &Path) -> Result<(), String> {
    let (code, text) = run_tool(Command::new("e2fsck").arg("-fn").arg(path))?;
    if code == 0 {
        Ok(())
    } else {
        Err(format!("e2fsck -fn exits {code}:\n{}", head(&text)))
    }
}

/// Lines of `e2fsck -fy` output that report no inconsistency: journal replay, orphan
/// processing (what a crash legitimately leaves for the checker), the superblock's free counts
/// (ext4 does not journal them), and the pass headers and summary.
pub fn benign_fsck_line(line: &str) -> bool {
    let line = line.trim();
    line.is_empty()
        || line.starts_with("Pass ")
        || line.contains("recovering journal")
        || line.starts_with("Clearing orphaned inode")
        || line.starts_with("Truncating orphaned inode")
        // An optimisation e2fsck offers (only when fixing) after truncating an orphan.
        || (line.contains("extent tree") && line.contains("could be "))
        || (line.starts_with("Free blocks count wrong (") && !line.contains("group"))
        || (line.starts_with("Free inodes count wrong (") && !line.contains("group"))
        || line.contains("FILE SYSTEM WAS MODIFIED")
        || (line.contains(" files (") && line.contains(" blocks"))
        || line.starts_with("e2fsck ")
}

/// What `e2fsck -fy` did beyond a plain replay, where e2fsck 1.47.0's own behaviour makes its
/// tree differ from the kernel's and quill's.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Repairs {
    /// It dropped the last transaction, whose commit block was torn.
    pub dropped_torn_commit: bool,
    /// Orphans it truncated and whose xattr block it released with the truncated blocks
    /// (release_inode_blocks frees `i_file_acl` for truncated orphans too, then finds i_blocks
    /// one block high): quill, like the kernel's orphan cleanup, keeps their xattrs.
    pub orphan_xattrs_dropped: Vec<u32>,
    /// e2fsck 1.47.0 could not recover the image for a known fast-commit bug of its own, named
    /// here as the explorer's pass category (quill's recovery of the image is checked anyway):
    /// - it refused to recover the journal because the fast-commit area starts with a HEAD of
    ///   an older tid than the one after the last full commit (its `ext4_fc_replay_scan`
    ///   returns EINVAL there, where the kernel's stops), and went on to check the file system
    ///   without replaying the log. Only with [`FastCommitState::StaleHead`];
    /// - after replaying the log and then fast commits it could not reopen the file system:
    ///   "Superblock checksum does not match superblock while trying to re-open". Seen when
    ///   the log holds the superblock (an orphan list change): it seems to write back the
    ///   superblock fields its fast-commit replay changed against the copy it read before the
    ///   log replay (inferred from the images). Only with [`FastCommitState::Replayable`]; the
    ///   kernel's and quill's replays of the same image are clean.
    pub gave_up: Option<&'static str>,
    /// After replaying fast commits it wrote back group descriptors it had read before
    /// replaying the log, undoing the log's directory counts, and pass 5 fixed them
    /// ("Directories count wrong for group"; the kernel's replay and quill's leave them
    /// right). Only with [`FastCommitState::Replayable`].
    pub miscounted_dirs: bool,
    /// Inodes its full check cleared as unattached and zero-length after its replay of
    /// UNLINK records had removed only their names ([`FastCommits::unlinked`]).
    pub unlinked_cleared: Vec<u32>,
    /// Value inodes (ea_inode) it found unattached and put in lost+found: its release of an
    /// orphan ("Clearing orphaned inode") frees the orphan's blocks and xattr block but not
    /// the value inodes its entries name (e2fsck/super.c `release_inode_blocks`), which its
    /// own pass 4 then finds (the kernel's and quill's orphan recovery release them).
    pub value_inodes_leaked: Vec<u32>,
    /// bigalloc: orphans it truncated to i_size (inode, that size) but whose blocks past it in
    /// i_size's cluster it left mapped, then grew i_size back over them in pass 1 ("Inode N,
    /// i_size is X, should be Y", Y within X's cluster): e2fsck 1.47.0's orphan truncation
    /// frees whole clusters only. The kernel's and quill's unmap those blocks.
    pub orphans_regrown: Vec<(u32, u64)>,
}

/// What the fast-commit area of a raw crash image holds for recovery (e2fsck 1.47.0 gets two
/// of these cases wrong; see [`e2fsck_repairs`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FastCommitState {
    /// No area, a clean journal, or an area without fast commits of any tid.
    Nothing,
    /// The area starts with a HEAD of another tid than recovery expects (the one after the
    /// last complete full commit): superseded fast commits.
    StaleHead,
    /// Complete fast commits of the expected tid: recovery replays them.
    Replayable,
    /// quill's per-core areas (`fc_areas` > 1) hold fast commits: the journal has
    /// INCOMPAT_QUILL_FC_AREAS, which stock e2fsck and the kernel must refuse.
    QuillAreas,
}

/// What the explorer counts for an image with quill's per-core areas: stock e2fsck refused
/// it, changing nothing ([`refuses_quill_areas`]).
pub const E2FSCK_REFUSED_QUILL_AREAS: &str = "e2fsck-refused-per-core-fc-areas";

/// Stock `e2fsck -fy` must refuse a journal with INCOMPAT_QUILL_FC_AREAS (an unknown
/// incompatible feature to it) and leave the image as it was: it cannot replay the per-core
/// areas, and replaying the log without them would lose acknowledged fsyncs.
pub fn refuses_quill_areas(path: &Path) -> Result<(), String> {
    let before = std::fs::read(path).map_err(|e| e.to_string())?;
    let (code, text) = run_tool(Command::new("e2fsck").arg("-fy").arg(path))?;
    let after = std::fs::read(path).map_err(|e| e.to_string())?;
    if code < 4 || !text.contains("unknown incompatible feature") {
        return Err(format!(
            "e2fsck -fy did not refuse per-core fast-commit areas (exit {code}):\n{}",
            head(&text)
        ));
    }
    if before != after {
        return Err("e2fsck -fy refused per-core fast-commit areas but changed the image".into());
    }
    Ok(())
}

/// What the fast-commit area of a raw crash image holds, for judging `e2fsck -fy` on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FastCommits {
    pub state: FastCommitState,
    /// The inodes UNLINK records in the area name (with [`FastCommitState::Replayable`], and
    /// with [`FastCommitState::StaleHead`] of the transaction before the end, which e2fsck
    /// replays when it drops that transaction's torn commit block).
    /// e2fsck 1.47.0 replays an UNLINK by removing the name only (its `ext2fs_unlink`),
    /// where the kernel's replay drops the link and frees the inode; quill's fast commit of
    /// a deleted file leaves it one link, no size and no blocks before its UNLINK
    /// (`fsync_journal::Unlinked`), so e2fsck's full check then clears it as an "unattached
    /// zero-length inode". That line, for these inodes, is e2fsck's replay, not damage.
    pub unlinked: BTreeSet<u32>,
}

/// [`FastCommits`] of the raw crash image on `dev` (read before anything recovers it).
pub fn fast_commit_state(dev: std::sync::Arc<dyn blockdev::BlockDevice>) -> FastCommits {
    use ondisk::jbd2::fast_commit::{fast_commit_records, FcDentryOp, FcRecord};
    let nothing = |state| FastCommits { state, unlinked: BTreeSet::new() };
    let Ok(fs_image) = fs::Ext4Image::open(dev.clone()) else {
        return nothing(FastCommitState::Nothing);
    };
    let Ok(location) = fs_image.journal_location() else {
        return nothing(FastCommitState::Nothing);
    };
    let Ok(scan) = journal::scan_log(&*dev, &location) else {
        return nothing(FastCommitState::Nothing);
    };
    let inode_size = fs_image.superblock().inode_size;
    let sb = &scan.superblock;
    if sb.start == 0 {
        return nothing(FastCommitState::Nothing);
    }
    if sb.has_incompat(ondisk::jbd2::feature::INCOMPAT_QUILL_FC_AREAS) {
        return nothing(FastCommitState::QuillAreas);
    }
    let Ok(Some(area)) = journal::FastCommitArea::read(&*dev, &location, sb, scan.end_tid) else {
        return nothing(FastCommitState::Nothing);
    };
    // The UNLINK records recovery replays: those a good TAIL covers.
    let unlinked_in = |found: &ondisk::jbd2::fast_commit::FcScan| -> BTreeSet<u32> {
        found.records[..found.records_valid]
            .iter()
            .filter_map(|record| match record {
                FcRecord::Dentry { op: FcDentryOp::Unlink, ino, .. } => Some(*ino),
                _ => None,
            })
            .collect()
    };
    if let Some(Ok(first)) = fast_commit_records(&area.blocks[0], inode_size).next() {
        if let FcRecord::Head { tid, .. } = first.record {
            if tid != scan.end_tid {
                // The fast commits of the transaction just before the end: its full commit
                // was being written when the crash came (it zeroes the area's HEAD once
                // durable). Where that commit block is torn, quill (as Linux 6.6+) keeps the
                // transaction and these are superseded, but e2fsck 1.47.0 drops it ("Journal
                // transaction N was corrupt") and replays them, UNLINKs included: seen in
                // the kernel-mount crash test, a mailbox workload torn in op 28.
                let previous = journal::FastCommitArea::read(&*dev, &location, sb, tid);
                let unlinked = match previous {
                    Ok(Some(area)) if scan.end_tid.prev() == tid => {
                        area.scan(inode_size).map(|found| unlinked_in(&found)).unwrap_or_default()
                    }
                    _ => BTreeSet::new(),
                };
                return FastCommits { state: FastCommitState::StaleHead, unlinked };
            }
        }
    }
    let Ok(found) = area.scan(inode_size) else { return nothing(FastCommitState::Nothing) };
    if found.commits == 0 {
        return nothing(FastCommitState::Nothing);
    }
    FastCommits { state: FastCommitState::Replayable, unlinked: unlinked_in(&found) }
}

/// Stock `e2fsck -fy` repairs the raw crash image at `path`: it may only replay the journal,
/// process orphans and fix the superblock's counts, and must leave the image clean. With
/// `torn`, the crash tore a write, and e2fsck may also find the last transaction's commit
/// block torn (its checksum fails): it then replays only the transactions before it, and
/// says so.
pub fn e2fsck_repairs(path: &Path, torn: bool, area: &FastCommits) -> Result<Repairs, String> {
    let fast_commits = area.state;
    if fast_commits == FastCommitState::QuillAreas {
        return refuses_quill_areas(path)
            .map(|()| Repairs { gave_up: Some(E2FSCK_REFUSED_QUILL_AREAS), ..Repairs::default() });
    }
    let cluster_bytes = cluster_bytes_of(path);
    let (code, text) = run_tool(Command::new("e2fsck").arg("-fy").arg(path))?;
    let gave_up = match fast_commits {
        FastCommitState::Replayable
            if text.contains(
                "Superblock checksum does not match superblock while trying to re-open",
            ) =>
        {
            Some("e2fsck-1.47.0-broke-the-superblock-after-fast-commits")
        }
        FastCommitState::StaleHead
            if text.contains("Invalid argument while recovering journal") =>
        {
            Some("e2fsck-1.47.0-refused-a-stale-fast-commit-head")
        }
        _ => None,
    };
    if gave_up.is_some() {
        return Ok(Repairs { gave_up, ..Repairs::default() });
    }
    if code > 1 {
        return Err(format!("e2fsck -fy exits {code}:\n{}", head(&text)));
    }
    let mut repairs = Repairs {
        dropped_torn_commit: torn
            && text.lines().any(|l| {
                l.starts_with("Journal transaction ")
                    && l.ends_with(" was corrupt, replay was aborted.")
            }),
        ..Repairs::default()
    };
    let truncated: Vec<u32> = text
        .lines()
        .filter_map(|l| l.strip_prefix("Truncating orphaned inode "))
        .filter_map(|rest| rest.split(' ').next()?.parse().ok())
        .collect();
    // Unattached inodes that are value inodes (read after the repair: e2fsck keeps their
    // flags), when e2fsck cleared orphans.
    let cleared_orphans = text.lines().any(|l| l.starts_with("Clearing orphaned inode "));
    let value_inodes: Vec<u32> = if cleared_orphans {
        let unattached: Vec<u32> = text.lines().filter_map(unattached_inode).collect();
        value_inodes_among(path, &unattached)
    } else {
        Vec::new()
    };
    // The line before was about such an inode (its "Connect to /lost+found" follows).
    let leaked_value_inode = std::cell::Cell::new(false);
    let unexpected = unexpected_fsck_lines(&text, &|l| {
        if repairs.dropped_torn_commit && after_dropped_commit(l) {
            return true;
        }
        if fast_commits == FastCommitState::Replayable
            && l.trim().starts_with("Directories count wrong for group #")
        {
            return true;
        }
        if unlinked_zero_length(l).is_some_and(|ino| area.unlinked.contains(&ino)) {
            return true;
        }
        if let Some(ino) = unattached_inode(l).or_else(|| ref_count_one_too_many(l)) {
            leaked_value_inode.set(value_inodes.contains(&ino));
            return leaked_value_inode.get();
        }
        if leaked_value_inode.get() && l.trim() == "Connect to /lost+found? yes" {
            return true;
        }
        if orphan_regrown(l, &truncated, cluster_bytes).is_some() {
            return true;
        }
        orphan_ea_released(l, &truncated).is_some()
    });
    if !unexpected.is_empty() {
        return Err(format!(
            "e2fsck -fy had to repair more than a crash leaves ({}):\n{}",
            unexpected.join(" | "),
            head(&text)
        ));
    }
    repairs.miscounted_dirs = fast_commits == FastCommitState::Replayable
        && text.lines().any(|l| l.trim().starts_with("Directories count wrong for group #"));
    repairs.orphan_xattrs_dropped =
        text.lines().filter_map(|l| orphan_ea_released(l, &truncated)).collect();
    repairs.unlinked_cleared = text.lines().filter_map(unlinked_zero_length).collect();
    repairs.value_inodes_leaked = value_inodes;
    repairs.orphans_regrown =
        text.lines().filter_map(|l| orphan_regrown(l, &truncated, cluster_bytes)).collect();
    e2fsck_clean(path).map_err(|e| format!("after e2fsck -fy: {e}"))?;
    Ok(repairs)
}

/// The cluster size in bytes of the bigalloc image at `path` (0 without bigalloc, or if its
/// superblock cannot be read). Only the superblock is read: this runs for every crash image.
fn cluster_bytes_of(path: &Path) -> u64 {
    use std::io::{Read, Seek, SeekFrom};
    let mut raw = vec![0u8; ondisk::ext4::SUPERBLOCK_SIZE];
    let read = std::fs::File::open(path).and_then(|mut file| {
        file.seek(SeekFrom::Start(ondisk::ext4::SUPERBLOCK_OFFSET))?;
        file.read_exact(&mut raw)
    });
    let Some(sb) = read.ok().and_then(|()| ondisk::ext4::Superblock::parse(&raw).ok()) else {
        return 0;
    };
    if sb.cluster_ratio() == 1 {
        return 0;
    }
    u64::from(sb.block_size()) * sb.cluster_ratio()
}

/// "Inode N, i_size is X, should be Y.  Fix? yes" about an orphan e2fsck truncated, with
/// X < Y <= X rounded up to a cluster of more than one block: (N, X), see
/// [`Repairs::orphans_regrown`].
fn orphan_regrown(line: &str, truncated: &[u32], cluster_bytes: u64) -> Option<(u32, u64)> {
    let (ino, is, should) = inode_field_fix(line, "i_size")?;
    let in_cluster = cluster_bytes > 0 && should <= is.div_ceil(cluster_bytes) * cluster_bytes;
    (truncated.contains(&ino) && is < should && in_cluster).then_some((ino, is))
}

/// "Inode N, FIELD is A, should be B." (pass 1's fix of an inode field): (N, A, B).
fn inode_field_fix(line: &str, field: &str) -> Option<(u32, u64, u64)> {
    let rest = line.trim().strip_prefix("Inode ")?;
    let (ino, rest) = rest.split_once(&format!(", {field} is "))?;
    let (is, rest) = rest.split_once(", should be ")?;
    let should = rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()?;
    Some((ino.parse().ok()?, is.parse().ok()?, should))
}

/// "Unattached inode N": inode N.
fn unattached_inode(line: &str) -> Option<u32> {
    line.trim().strip_prefix("Unattached inode ")?.trim().parse().ok()
}

/// "Inode N ref count is 2, should be 1.  Fix? yes": a value inode e2fsck linked into
/// lost+found holds its reference count (2 links counted).
fn ref_count_one_too_many(line: &str) -> Option<u32> {
    let rest = line.trim().strip_prefix("Inode ")?;
    let (ino, rest) = rest.split_once(" ref count is ")?;
    rest.starts_with("2, should be 1.").then_some(())?;
    ino.parse().ok()
}

/// Which of `inodes` of the image at `path` are value inodes (EA_INODE_FL).
fn value_inodes_among(path: &Path, inodes: &[u32]) -> Vec<u32> {
    let Ok(bytes) = std::fs::read(path) else { return Vec::new() };
    let dev: std::sync::Arc<dyn blockdev::BlockDevice> =
        std::sync::Arc::new(blockdev::memory::MemDevice::from_bytes(bytes));
    let Ok(image) = fs::Ext4Image::open(dev) else { return Vec::new() };
    inodes
        .iter()
        .copied()
        .filter(|&ino| {
            image.read_inode(ino).is_ok_and(|inode| inode.flags & ondisk::ext4::EA_INODE_FL != 0)
        })
        .collect()
}

/// "Unattached zero-length inode N.  Clear? yes": inode N (see [`FastCommits::unlinked`]).
fn unlinked_zero_length(line: &str) -> Option<u32> {
    let rest = line.trim().strip_prefix("Unattached zero-length inode ")?;
    let (ino, answer) = rest.split_once('.')?;
    (answer.trim() == "Clear? yes").then_some(())?;
    ino.parse().ok()
}

/// "Inode N, i_blocks is A, should be B." about an orphan e2fsck truncated, A > B: the xattr
/// block its orphan truncation released (see [`Repairs::orphan_xattrs_dropped`]).
fn orphan_ea_released(line: &str, truncated: &[u32]) -> Option<u32> {
    let (ino, is, should) = inode_field_fix(line, "i_blocks")?;
    (truncated.contains(&ino) && is > should).then_some(ino)
}

/// The lines of `e2fsck -fy` output `text` that are neither [`benign_fsck_line`]s nor
/// `also_benign` (a "Fix? yes" answer belongs to the message before it).
pub fn unexpected_fsck_lines<'a>(
    text: &'a str,
    also_benign: &dyn Fn(&str) -> bool,
) -> Vec<&'a str> {
    let mut previous_benign = true;
    text.lines()
        .filter(|l| {
            let benign = if l.trim().starts_with("Fix? yes") {
                previous_benign
            } else {
                benign_fsck_line(l) || also_benign(l)
            };
            previous_benign = benign;
            !benign
        })
        .collect()
}

/// What e2fsck says after it dropped a transaction with a torn commit block: it records an
/// error (s_errno), and on a file system with errors it does not trust the orphan list
/// (release_orphan_inodes), so the orphans it would have released quietly are found by the
/// full check instead: an unlinked inode with no dtime, a truncated one whose i_size it grows
/// back over the blocks still mapped, and the bitmaps and counts. quill's tree is checked as
/// always; e2fsck's is only compared (it may hold such an orphan's old blocks).
fn after_dropped_commit(line: &str) -> bool {
    let line = line.trim();
    line.starts_with("Journal transaction ") && line.ends_with(" was corrupt, replay was aborted.")
        || (line.starts_with("Deleted inode ") && line.contains(" has zero dtime."))
        // The orphan list it did not process, found by the full check.
        || line.starts_with("Inodes that were part of a corrupted orphan linked list found.")
        || (line.starts_with("Inode ") && line.contains(" was part of the orphaned inode list."))
        // An orphan left mid-truncate: blocks still mapped past its new i_size.
        || (line.starts_with("Inode ") && line.contains(", i_size is ") && line.contains(", should be "))
        || line.starts_with("Block bitmap differences: ")
        || line.starts_with("Inode bitmap differences: ")
        || line.starts_with("Free blocks count wrong for group #")
        || line.starts_with("Free inodes count wrong for group #")
        || (line.starts_with("Directories count wrong for group #"))
        // Quota images: the orphans it then deletes as "deleted inodes" are still charged in
        // the quota files (an orphan is charged until it is released, as the kernel charges
        // it), so its recount differs by them.
        || (line.starts_with("Update quota info for quota type ") && line.ends_with("? yes"))
        || line.starts_with("[QUOTA WARNING] Usage inconsistent for ID ")
}

/// Whether e2fsck is installed.
pub fn have_e2fsck() -> bool {
    Command::new("e2fsck").arg("-V").output().is_ok_and(|o| o.status.success())
}

/// Without a journal (`image=ext2`) nothing makes a crash image consistent again but e2fsck:
/// `e2fsck -fy` must repair it (exit 0 or 1: nothing left uncorrected) to an image `e2fsck -fn`
/// then finds clean. The image at `path` is repaired in place.
pub fn e2fsck_repairs_without_journal(path: &Path) -> Result<(), String> {
    let (code, text) = run_tool(Command::new("e2fsck").arg("-fy").arg(path))?;
    if code > 1 {
        return Err(format!("e2fsck -fy exits {code}:\n{}", head(&text)));
    }
    e2fsck_clean(path).map_err(|e| format!("after e2fsck -fy repaired the crash image: {e}"))
}

/// The **fsynced-intact** check of an image without a journal, after e2fsck repaired it: every
/// regular file some persistence point of its thread made durable (an acknowledged fsync of
/// it, or fdatasync where its names are still those it was created with, an acknowledged
/// sync, or the setup, which ended with an unmount) and that
/// no operation started since changed (neither its bytes nor its names, the directories above
/// them included) is in `tree` under each of its names with its bytes. What a crash costs
/// there is everything else: operations not made durable may be half done, and e2fsck's
/// repair may keep or drop them.
pub fn check_fsynced_intact(
    w: &Workload,
    expected: &Expected,
    marks: &[u64],
    tree: &Tree,
) -> Result<(), String> {
    let threads = w.threads.len();
    let mut started = vec![0usize; threads];
    let mut returned = BTreeSet::new();
    for &label in marks {
        let (t, i, end) = decode_mark(label);
        if t < threads && i < w.threads[t].len() {
            if end {
                returned.insert((t, i));
            } else {
                started[t] = started[t].max(i + 1);
            }
        }
    }
    for (t, states) in expected.states.iter().enumerate() {
        let hi = started[t];
        let names_of = |state: &Model, m: usize| -> Vec<String> {
            state.names.iter().filter(|(_, &n)| n == m).map(|(p, _)| p.clone()).collect()
        };
        // (inode, the state its persistence point made durable, what made it durable)
        let mut durable: Vec<(usize, usize, String)> =
            (0..states[0].inodes.len()).map(|m| (m, 0, "the setup".to_string())).collect();
        for &(_, i) in returned.range((t, 0)..(t + 1, 0)) {
            match &w.threads[t][i] {
                Op::Fsync(p) => {
                    if let Some(&m) = states[i].names.get(p) {
                        durable.push((m, i + 1, format!("op {i} ({})", w.threads[t][i])));
                    }
                }
                Op::Fdatasync(p) => {
                    // The data, and the names only as the file was created with them (as
                    // ext4, fdatasync need not commit a rename or link since).
                    let Some(&m) = states[i].names.get(p) else { continue };
                    let created = states[i].inodes[m].created;
                    if names_of(&states[i], m) == names_of(&states[created], m) {
                        durable.push((m, i + 1, format!("op {i} ({})", w.threads[t][i])));
                    }
                }
                Op::Sync => {
                    let all = (0..states[i + 1].inodes.len())
                        .map(|m| (m, i + 1, format!("op {i} (sync)")));
                    durable.extend(all);
                }
                _ => {}
            }
        }
        for (m, k, by) in durable {
            let Some(inode) = states[k].inodes.get(m).filter(|n| n.kind == Kind::File) else {
                continue;
            };
            let names = names_of(&states[k], m);
            let unchanged = (k..=hi).all(|j| {
                states[j].inodes.get(m).is_some_and(|n| n.data == inode.data)
                    && names_of(&states[j], m) == names
            });
            if !unchanged || names.is_empty() {
                continue;
            }
            for name in names {
                let path = crate::model::join(&expected.roots[t], &name);
                let what = match tree.get(&path) {
                    None => "it is missing".to_string(),
                    Some(node) if node.kind != 'f' => format!("it is a '{}'", node.kind),
                    Some(node) if node.data != inode.data => format!(
                        "its {} bytes differ from the {} made durable",
                        node.data.len(),
                        inode.data.len()
                    ),
                    Some(_) => continue,
                };
                return Err(format!(
                    "/{path} was made durable by {by} and left unchanged by every operation \
                     started since, but after e2fsck's repair {what}"
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {

    #[test]
    fn e2fsck_lines_about_a_leaked_value_inode_are_read() {
        // What e2fsck 1.47.0 printed for a value inode of an orphan it cleared.
        assert_eq!(unattached_inode("Unattached inode 29"), Some(29));
        assert_eq!(unattached_inode("Unattached zero-length inode 29.  Clear? yes"), None);
        assert_eq!(
            ref_count_one_too_many("Inode 29 ref count is 2, should be 1.  Fix? yes"),
            Some(29)
        );
        assert_eq!(ref_count_one_too_many("Inode 29 ref count is 3, should be 1.  Fix? yes"), None);
    }

    #[test]
    fn a_bigalloc_orphan_regrown_within_its_cluster_is_told_apart() {
        // What e2fsck 1.47.0 printed for an orphan truncated to 2955 bytes with 16 KiB
        // clusters of 4 KiB blocks, its blocks 1 and 2 left mapped.
        let line = "Inode 12, i_size is 2955, should be 12288.  Fix? yes";
        assert_eq!(orphan_regrown(line, &[12], 16384), Some((12, 2955)));
        // Not an orphan it truncated, no bigalloc, or past the cluster: a real repair.
        assert_eq!(orphan_regrown(line, &[13], 16384), None);
        assert_eq!(orphan_regrown(line, &[12], 0), None);
        assert_eq!(orphan_regrown(line, &[12], 4096), None);
        let shrunk = "Inode 12, i_size is 12288, should be 2955.  Fix? yes";
        assert_eq!(orphan_regrown(shrunk, &[12], 16384), None);
    }

    use super::*;
    use crate::workload::pattern;

    fn file(data: Vec<u8>) -> Node {
        let size = data.len() as u64;
        Node { ino: 12, kind: 'f', perm: 0o644, size, nlink: 1, data, xattrs: BTreeMap::new() }
    }

    fn version(data: Vec<u8>) -> Inode {
        Inode {
            kind: Kind::File,
            perm: 0o644,
            data,
            xattrs: BTreeMap::new(),
            created: 0,
            changed: 0,
        }
    }

    /// iJournaling's promise: a file created and fsynced may be there without the thread's
    /// operations before its creation, and must be there; nothing else may jump the prefix.
    #[test]
    fn per_file_fsync_lets_a_created_file_outlive_earlier_operations_and_nothing_else() {
        let text = "setup creat a\nsetup write a 0 100\nt0 link a b\nt0 creat c\n\
                    t0 write c 0 50\nt0 fsync c\nt0 creat d\nt0 fsync d\n";
        let w = Workload::parse(text).unwrap();
        let expected = crate::run::Expected::of(&w).unwrap();
        // Ops 0..=3 done; op 4 (creat d) started, its fsync not.
        let mut marks: Vec<u64> = (0..4)
            .flat_map(|i| [crate::run::start_mark(0, i), crate::run::end_mark(0, i)])
            .collect();
        marks.push(crate::run::start_mark(0, 4));
        let last = expected.states[0].last().unwrap();
        let node = |path: &str| {
            let m = last.names[path];
            let inode = &last.inodes[m];
            let ino = 20 + m as u32;
            let data = inode.data.clone();
            let size = data.len() as u64;
            Node { ino, kind: 'f', perm: inode.perm, size, nlink: 1, data, xattrs: BTreeMap::new() }
        };
        let tree =
            |paths: &[&str]| -> Tree { paths.iter().map(|p| (p.to_string(), node(p))).collect() };
        let mut linked = tree(&["a", "b", "c"]);
        for n in linked.values_mut().filter(|n| n.ino == node("a").ino) {
            n.nlink = 2;
        }
        let check = |t: &Tree, promise| {
            check_acknowledged(&w, &expected, &marks, t, Unacknowledged::WholeVersions, promise)
        };
        use FsyncPromise::{PerFile, Transaction};
        // Everything up to the fsync: both promises.
        assert!(check(&linked, Transaction).is_ok());
        assert!(check(&linked, PerFile).is_ok());
        // c without the link made before it: iJournaling's, not ext4's.
        let alone = tree(&["a", "c"]);
        assert!(check(&alone, PerFile).is_ok());
        assert!(check(&alone, Transaction).is_err());
        // c lost: neither. d (never fsynced) beyond the prefix: neither.
        assert!(check(&tree(&["a"]), PerFile).is_err());
        let mut with_d = tree(&["a", "c"]);
        with_d.insert("d".into(), node("d"));
        assert!(check(&with_d, PerFile).is_err());
        // c with other contents than its fsync's: no.
        let mut wrong = tree(&["a", "c"]);
        wrong.get_mut("c").unwrap().data[0] ^= 1;
        assert!(check(&wrong, PerFile).is_err());
    }

    /// Marks of a crash state: thread 0's ops `0..done` returned, op `done` started.
    fn marks_until(done: usize) -> Vec<u64> {
        let mut marks: Vec<u64> = (0..done)
            .flat_map(|i| [crate::run::start_mark(0, i), crate::run::end_mark(0, i)])
            .collect();
        marks.push(crate::run::start_mark(0, done));
        marks
    }

    /// A recovered tree of regular files: each path with its inode as thread 0's model state
    /// numbered with it has it.
    fn tree_of(expected: &crate::run::Expected, paths: &[(usize, &str)]) -> Tree {
        let states = &expected.states[0];
        let node = |state: usize, path: &str| {
            let m = states[state].names[path];
            let data = states[state].inodes[m].data.clone();
            let size = data.len() as u64;
            let (ino, perm, xattrs) = (20 + m as u32, 0o644, BTreeMap::new());
            Node { ino, kind: 'f', perm, size, nlink: 1, data, xattrs }
        };
        paths.iter().map(|&(state, p)| (p.to_string(), node(state, p))).collect()
    }

    /// The kernel's ext4 (the seed 1795864949533210718 case): fsync after an overwrite that
    /// keeps the size may commit nothing, losing the thread's earlier unlink of another file,
    /// while the overwrite's bytes are there; a write that grows the file joins a transaction,
    /// and then the unlink before it is kept.
    #[test]
    fn a_kernel_fsync_after_an_overwrite_may_leave_earlier_operations_uncommitted() {
        use FsyncPromise::{Ext4Kernel, Transaction};
        for (write, grows) in [("t0 write f 0 10", false), ("t0 write f 100 10", true)] {
            let text = format!(
                "setup creat f\nsetup write f 0 100\nsetup creat g\nt0 unlink g\n{write}\nt0 fsync f\n"
            );
            let w = Workload::parse(&text).unwrap();
            let expected = crate::run::Expected::of(&w).unwrap();
            let marks = marks_until(3);
            let check = |t: &Tree, promise| {
                check_acknowledged(&w, &expected, &marks, t, Unacknowledged::Ext4Ordered, promise)
            };
            let unlink_lost = tree_of(&expected, &[(3, "f"), (0, "g")]);
            assert!(check(&unlink_lost, Transaction).is_err(), "{write}");
            assert_eq!(check(&unlink_lost, Ext4Kernel).is_ok(), !grows, "{write}");
            assert!(check(&tree_of(&expected, &[(3, "f")]), Ext4Kernel).is_ok(), "{write}");
            let old_bytes = tree_of(&expected, &[(0, "f"), (0, "g")]);
            assert!(check(&old_bytes, Ext4Kernel).is_err(), "{write}: the fsync's bytes lost");
        }
    }

    /// A rename written as a fast commit (LINK and UNLINK): the file may stand under its new
    /// name without the thread's operations before the rename, its old name gone; a name
    /// created twice keeps each of its files' readings.
    #[test]
    fn per_file_fsync_lets_a_renamed_file_outlive_earlier_operations_under_its_new_name() {
        let text = "setup creat a\nsetup write a 0 100\nsetup creat x\nt0 creat c\n\
                    t0 rename a b\nt0 fsync b\nt0 write b 0 10\n";
        let w = Workload::parse(text).unwrap();
        let expected = crate::run::Expected::of(&w).unwrap();
        let tree = |paths: &[(usize, &str)]| tree_of(&expected, paths);
        use FsyncPromise::{PerFile, Transaction};
        // The rename's fsync (op 2) returned; op 3 started.
        let marks = marks_until(3);
        let check = |t: &Tree, promise| {
            check_acknowledged(&w, &expected, &marks, t, Unacknowledged::WholeVersions, promise)
        };
        let renamed_alone = tree(&[(3, "b"), (3, "x")]);
        assert!(check(&renamed_alone, PerFile).is_ok());
        assert!(check(&renamed_alone, Transaction).is_err(), "c was created before it");
        assert!(check(&tree(&[(3, "b"), (3, "c"), (3, "x")]), Transaction).is_ok());
        // Both names, or the new one without the fsync's bytes: never.
        let both = tree(&[(0, "a"), (3, "b"), (3, "x")]);
        assert!(check(&both, PerFile).is_err());
        let mut wrong = renamed_alone.clone();
        wrong.get_mut("b").unwrap().data[0] ^= 1;
        assert!(check(&wrong, PerFile).is_err());
    }

    /// varmail's pattern twice under one name: the first file's fsync acknowledged, the second
    /// one's started. Either may stand alone under the name, ahead of the unlink before them.
    #[test]
    fn per_file_fsync_keeps_each_file_a_name_was_created_for() {
        let text = "setup creat x\nt0 unlink x\nt0 creat n\nt0 fsync n\nt0 unlink n\n\
                    t0 creat n\nt0 fsync n\n";
        let w = Workload::parse(text).unwrap();
        let expected = crate::run::Expected::of(&w).unwrap();
        let marks = marks_until(5);
        let tree = |paths: &[(usize, &str)]| tree_of(&expected, paths);
        let check = |t: &Tree| {
            let promise = FsyncPromise::PerFile;
            check_acknowledged(&w, &expected, &marks, t, Unacknowledged::WholeVersions, promise)
        };
        assert!(check(&tree(&[(0, "x"), (3, "n")])).is_ok(), "the first n, acknowledged");
        assert!(check(&tree(&[(0, "x"), (5, "n")])).is_ok(), "the second n, being fsynced");
        assert!(check(&tree(&[(0, "x")])).is_err(), "the first n lost");
    }

    /// An extending write not yet acknowledged, as ext4 data=ordered leaves it on a crash: the
    /// size journalled with the page written into the old last block (4096), ahead of that
    /// block's data (zeros past the old end of file).
    #[test]
    fn ext4_ordered_allows_a_size_between_versions_and_zeros_past_the_old_end() {
        let old = pattern(1, 0, 2670);
        let mut new = old.clone();
        new[2294..].copy_from_slice(&pattern(2, 2294, 2670 - 2294));
        new.extend(pattern(2, 2670, 5508 - 2670));
        let versions = [version(old.clone()), version(new.clone())];
        let mut shown = old.clone();
        shown.resize(4096, 0);
        for unacknowledged in [Unacknowledged::WholeVersions, Unacknowledged::Ext4Ordered] {
            let got = check_data("bar", &file(shown.clone()), &versions, 0, unacknowledged);
            assert_eq!(got.is_ok(), unacknowledged == Unacknowledged::Ext4Ordered, "{got:?}");
        }
        // Neither allows stale data, nor a size past the largest version's, nor zeros where
        // every version has data.
        let mut stale = shown.clone();
        stale[3000] = 0x5a;
        let mut long = new.clone();
        long.push(0);
        let mut hole = new.clone();
        hole[100] = 0;
        for bad in [stale, long, hole] {
            assert!(
                check_data("bar", &file(bad), &versions, 0, Unacknowledged::Ext4Ordered).is_err()
            );
        }
        // One version (the write acknowledged): only it.
        let one = [version(new.clone())];
        assert!(check_data("bar", &file(shown), &one, 1, Unacknowledged::Ext4Ordered).is_err());
        assert!(check_data("bar", &file(new), &one, 1, Unacknowledged::Ext4Ordered).is_ok());
    }
}
