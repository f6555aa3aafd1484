//! Workloads: operations, their text form (what a reproducer file holds), and the generators:
//! B3/ACE-style short sequences over a small file set, and longer seeded sequences for several
//! threads.

use std::fmt;

use ondisk::testing::Rng;

use crate::model::{join, split, Kind, Model};

/// One file-system operation, on paths relative to the thread's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Creat(String),
    Mkdir(String),
    Rmdir(String),
    Unlink(String),
    Link {
        from: String,
        to: String,
    },
    /// rename, or renameat2 with RENAME_WHITEOUT (`whiteout`: the old name is left to a
    /// whiteout, a character device 0:0).
    Rename {
        from: String,
        to: String,
        whiteout: bool,
    },
    /// Writes `len` bytes of the op's pattern at `offset` (open, pwrite, close).
    Write {
        path: String,
        offset: u64,
        len: u64,
    },
    /// fallocate; `keep_size` is FALLOC_FL_KEEP_SIZE, `zero` FALLOC_FL_ZERO_RANGE (the range
    /// then reads as zeros).
    Falloc {
        path: String,
        offset: u64,
        len: u64,
        keep_size: bool,
        zero: bool,
    },
    Truncate {
        path: String,
        size: u64,
    },
    /// A symlink whose target is `len` bytes of the op's pattern text.
    Symlink {
        path: String,
        len: u64,
    },
    SetXattr {
        path: String,
        name: String,
        len: u64,
    },
    RemoveXattr {
        path: String,
        name: String,
    },
    Fsync(String),
    Fdatasync(String),
    Sync,
}

impl Op {
    pub fn is_persistence(&self) -> bool {
        matches!(self, Op::Fsync(_) | Op::Fdatasync(_) | Op::Sync)
    }
}

fn show(path: &str) -> &str {
    if path.is_empty() {
        "."
    } else {
        path
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Creat(p) => write!(f, "creat {p}"),
            Op::Mkdir(p) => write!(f, "mkdir {p}"),
            Op::Rmdir(p) => write!(f, "rmdir {p}"),
            Op::Unlink(p) => write!(f, "unlink {p}"),
            Op::Link { from, to } => write!(f, "link {from} {to}"),
            Op::Rename { from, to, whiteout: false } => write!(f, "rename {from} {to}"),
            Op::Rename { from, to, whiteout: true } => write!(f, "rename {from} {to} whiteout"),
            Op::Write { path, offset, len } => write!(f, "write {path} {offset} {len}"),
            Op::Falloc { path, offset, len, keep_size, zero } => {
                let how = if *keep_size { "keep_size" } else { "grow" };
                let zero = if *zero { " zero" } else { "" };
                write!(f, "falloc {path} {offset} {len} {how}{zero}")
            }
            Op::Truncate { path, size } => write!(f, "truncate {path} {size}"),
            Op::Symlink { path, len } => write!(f, "symlink {path} {len}"),
            Op::SetXattr { path, name, len } => write!(f, "setxattr {} {name} {len}", show(path)),
            Op::RemoveXattr { path, name } => write!(f, "removexattr {} {name}", show(path)),
            Op::Fsync(p) => write!(f, "fsync {}", show(p)),
            Op::Fdatasync(p) => write!(f, "fdatasync {}", show(p)),
            Op::Sync => write!(f, "sync"),
        }
    }
}

impl std::str::FromStr for Op {
    type Err = String;

    fn from_str(line: &str) -> Result<Op, String> {
        let words: Vec<&str> = line.split_whitespace().collect();
        let bad = || format!("cannot parse the operation {line:?}");
        let path = |i: usize| -> Result<String, String> {
            let p = *words.get(i).ok_or_else(bad)?;
            if p.starts_with('/') || p.split('/').any(|c| c.is_empty() || c == "..") && p != "." {
                return Err(format!("{line:?}: paths are relative, without empty or .. parts"));
            }
            Ok(if p == "." { String::new() } else { p.to_string() })
        };
        let num = |i: usize| -> Result<u64, String> {
            words.get(i).ok_or_else(bad)?.parse().map_err(|_| bad())
        };
        let arity = |n: usize| if words.len() == n { Ok(()) } else { Err(bad()) };
        let op = match *words.first().ok_or_else(bad)? {
            "creat" => arity(2).and(path(1).map(Op::Creat))?,
            "mkdir" => arity(2).and(path(1).map(Op::Mkdir))?,
            "rmdir" => arity(2).and(path(1).map(Op::Rmdir))?,
            "unlink" => arity(2).and(path(1).map(Op::Unlink))?,
            "link" => {
                arity(3)?;
                Op::Link { from: path(1)?, to: path(2)? }
            }
            "rename" => {
                let whiteout = match words.get(3) {
                    None => false,
                    Some(&"whiteout") if words.len() == 4 => true,
                    Some(_) => return Err(bad()),
                };
                Op::Rename { from: path(1)?, to: path(2)?, whiteout }
            }
            "write" => {
                arity(4)?;
                Op::Write { path: path(1)?, offset: num(2)?, len: num(3)? }
            }
            "falloc" => {
                let keep_size = match words.get(4) {
                    Some(&"keep_size") => true,
                    Some(&"grow") => false,
                    _ => return Err(bad()),
                };
                let zero = match words.get(5) {
                    None => false,
                    Some(&"zero") if words.len() == 6 => true,
                    Some(_) => return Err(bad()),
                };
                Op::Falloc { path: path(1)?, offset: num(2)?, len: num(3)?, keep_size, zero }
            }
            "truncate" => {
                arity(3)?;
                Op::Truncate { path: path(1)?, size: num(2)? }
            }
            "symlink" => {
                arity(3)?;
                Op::Symlink { path: path(1)?, len: num(2)? }
            }
            "setxattr" => {
                arity(4)?;
                Op::SetXattr { path: path(1)?, name: words[2].to_string(), len: num(3)? }
            }
            "removexattr" => {
                arity(3)?;
                Op::RemoveXattr { path: path(1)?, name: words[2].to_string() }
            }
            "fsync" => arity(2).and(path(1).map(Op::Fsync))?,
            "fdatasync" => arity(2).and(path(1).map(Op::Fdatasync))?,
            "sync" => arity(1).map(|_| Op::Sync)?,
            _ => return Err(bad()),
        };
        let too_big = |n: u64| n > 1 << 24;
        match &op {
            Op::Write { offset, len, .. } | Op::Falloc { offset, len, .. }
                if too_big(*offset) || too_big(*len) || *len == 0 =>
            {
                Err(format!("{line:?}: offsets and lengths are 1..16 MiB"))
            }
            Op::Truncate { size, .. } if too_big(*size) => Err(format!("{line:?}: size too big")),
            Op::Symlink { len, .. } if *len == 0 || *len > 1000 => {
                Err(format!("{line:?}: symlink targets are 1..=1000 bytes"))
            }
            Op::SetXattr { len, .. } if *len > 8000 => {
                Err(format!("{line:?}: xattr values are at most 8000 bytes"))
            }
            Op::SetXattr { name, .. } | Op::RemoveXattr { name, .. }
                if !name.starts_with("user.") || name.len() > 200 =>
            {
                Err(format!("{line:?}: xattr names are user.*"))
            }
            _ => Ok(op),
        }
    }
}

/// The bytes operation `tag` writes at `offset..offset + len`: never zero, and different for
/// every operation and offset, so a stale or misplaced block never passes for written data.
pub fn pattern(tag: u64, offset: u64, len: u64) -> Vec<u8> {
    (offset..offset + len)
        .map(|o| {
            let word = mix(tag.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (o / 8));
            1 + ((word >> (8 * (o % 8))) & 0xff) as u8 % 255
        })
        .collect()
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The target of a symlink made by operation `tag`: printable, `len` bytes.
pub fn symlink_target(tag: u64, len: u64) -> Vec<u8> {
    pattern(tag, 0, len).into_iter().map(|b| b'a' + b % 26).collect()
}

pub fn xattr_value(tag: u64, len: u64) -> Vec<u8> {
    pattern(tag ^ 0x5A5A, 0, len)
}

/// The tag of operation `index` of thread `thread` (setup operations are thread `SETUP`).
pub fn tag(thread: usize, index: usize) -> u64 {
    ((thread as u64 + 1) << 32) | index as u64
}

pub const SETUP: usize = 0xFFFF;

/// How the file system is made and mounted for a workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// A journal preset (`journal::JournalConfig::PRESETS`), optionally with settings on top:
    /// `cjfs,commit_record=barrier`.
    pub preset: String,
    /// `ordered` or `journal`.
    pub data: String,
    /// The page cache's dirty bound in KiB: small bounds write data back during the writes.
    pub dirty_kib: u64,
    /// The negative control: a device that acknowledges flushes and FUA without honouring
    /// them, so the checks must find acknowledged data lost.
    pub lying_device: bool,
    /// The image the workload runs on: `ext4` (quill's mkfs), `inline` (quill's mkfs with
    /// inline_data and ea_inode: small files and directories in their inodes, xattrs past
    /// one block in inodes of their own), `ext3` (mkfs.ext3: files,
    /// directories and the journal indirect-mapped) or `ext2` (mkfs.ext2: indirect-mapped, no
    /// journal; checked by e2fsck's repair, `check::check_fsynced_intact`).
    pub image: String,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            preset: "classic".into(),
            data: "ordered".into(),
            dirty_kib: 64 * 1024,
            lying_device: false,
            image: "ext4".into(),
        }
    }
}

/// A workload: setup operations (run and synced before recording starts), then one operation
/// list per thread. With one thread, paths are relative to the root; with several, thread `t`
/// works under `t<t>/` and its paths are relative to that directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    pub name: String,
    pub seed: u64,
    pub config: Config,
    /// Paths relative to the file system's root.
    pub setup: Vec<Op>,
    pub threads: Vec<Vec<Op>>,
}

impl Workload {
    /// The root directory of thread `t`, relative to the file system's root.
    pub fn root(&self, t: usize) -> String {
        if self.threads.len() == 1 {
            String::new()
        } else {
            format!("t{t}")
        }
    }

    pub fn ops(&self) -> usize {
        self.threads.iter().map(Vec::len).sum()
    }

    /// The text form: one line per setting and operation; [`Workload::parse`] reads it back.
    pub fn to_text(&self) -> String {
        let mut out = format!("workload {}\nseed {}\n", self.name, self.seed);
        out += &format!(
            "config preset={} data={} dirty_kib={}\n",
            self.config.preset, self.config.data, self.config.dirty_kib
        );
        if self.config.lying_device {
            out += "config lying_device=1\n";
        }
        if self.config.image != "ext4" {
            out += &format!("config image={}\n", self.config.image);
        }
        for op in &self.setup {
            out += &format!("setup {op}\n");
        }
        for (t, ops) in self.threads.iter().enumerate() {
            for op in ops {
                out += &format!("t{t} {op}\n");
            }
        }
        out
    }

    /// Reads [`Workload::to_text`]'s form; `#` comments, blank lines and lines of other
    /// kinds (`crash ...`) are skipped here.
    pub fn parse(text: &str) -> Result<Workload, String> {
        let mut w = Workload {
            name: "replay".into(),
            seed: 0,
            config: Config::default(),
            setup: Vec::new(),
            threads: Vec::new(),
        };
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            let at = |e: String| format!("line {}: {e}", n + 1);
            let Some((head, rest)) = line.split_once(' ') else {
                if line == "sync" || line.is_empty() || line.starts_with('#') {
                    continue;
                }
                return Err(at(format!("cannot parse {line:?}")));
            };
            match head {
                "workload" => w.name = rest.to_string(),
                "seed" => w.seed = rest.parse().map_err(|_| at("bad seed".into()))?,
                "config" => {
                    for setting in rest.split_whitespace() {
                        match setting.split_once('=') {
                            Some(("preset", v)) => w.config.preset = v.into(),
                            Some(("data", v)) => w.config.data = v.into(),
                            Some(("dirty_kib", v)) => {
                                w.config.dirty_kib =
                                    v.parse().map_err(|_| at("bad dirty_kib".into()))?
                            }
                            Some(("lying_device", v)) => w.config.lying_device = v == "1",
                            Some(("image", v)) => w.config.image = v.into(),
                            _ => return Err(at(format!("unknown setting {setting:?}"))),
                        }
                    }
                }
                "setup" => w.setup.push(rest.parse().map_err(at)?),
                _ if head.starts_with('#') || head == "crash" => {}
                _ => {
                    let t: usize = head
                        .strip_prefix('t')
                        .and_then(|t| t.parse().ok())
                        .filter(|&t| t < 64)
                        .ok_or_else(|| at(format!("unknown line kind {head:?}")))?;
                    if w.threads.len() <= t {
                        w.threads.resize(t + 1, Vec::new());
                    }
                    w.threads[t].push(rest.parse().map_err(at)?);
                }
            }
        }
        if w.threads.is_empty() {
            w.threads.push(Vec::new());
        }
        // The configuration must be one the recorded run can mount.
        crate::run::mount_options(&w.config)?;
        Ok(w)
    }
}

// ---------------------------------------------------------------------------------------------
// Generators

/// ACE's file set.
pub const FILES: [&str; 8] =
    ["foo", "bar", "A/foo", "A/bar", "A/C/foo", "A/C/bar", "B/foo", "B/bar"];
/// ACE's directories, plus the names directories can be renamed to.
pub const DIRS: [&str; 3] = ["A", "A/C", "B"];
const DIR_NAMES: [&str; 5] = ["A", "A/C", "B", "B/C", "A/D"];
const XATTRS: [&str; 3] = ["user.q0", "user.q1", "user.q2"];

fn pick<'a>(rng: &mut Rng, from: &[&'a str], mut ok: impl FnMut(&str) -> bool) -> Option<&'a str> {
    let fits: Vec<&str> = from.iter().copied().filter(|p| ok(p)).collect();
    (!fits.is_empty()).then(|| fits[rng.below(fits.len() as u64) as usize])
}

/// Setup for one root: some of ACE's directories and files, with data and xattrs, so that
/// The length of an xattr value a generator sets: small, or up to `mid` + 200 bytes, or, where
/// values may live in inodes of their own (`Model::value_inodes`), a third of the time past
/// a block (drawn only there, so other workloads keep their seeds).
fn xattr_value_len(rng: &mut Rng, model: &Model, mid: u64) -> u64 {
    if model.value_inodes && rng.chance(3) {
        4100 + rng.below(3000)
    } else if rng.chance(2) {
        1 + rng.below(40)
    } else {
        200 + rng.below(mid)
    }
}

/// operations find things to overwrite, rename over and unlink.
fn setup_ops(rng: &mut Rng, root: &str, model: &mut Model, setup: &mut Vec<Op>) {
    let add = |op: Op, model: &mut Model, setup: &mut Vec<Op>| {
        if model.apply(&op, setup.len(), tag(SETUP, setup.len())).is_ok() {
            setup.push(op);
        }
    };
    if !root.is_empty() {
        add(Op::Mkdir(root.to_string()), model, setup);
    }
    for d in DIRS {
        if !rng.chance(4) {
            add(Op::Mkdir(join(root, d)), model, setup);
        }
    }
    for f in FILES {
        let path = join(root, f);
        if rng.chance(2) || !model.can_create(&path) {
            continue;
        }
        add(Op::Creat(path.clone()), model, setup);
        let len = rng.below(14_000);
        if len > 0 {
            add(Op::Write { path: path.clone(), offset: 0, len }, model, setup);
        }
        if rng.chance(4) {
            let len = xattr_value_len(rng, model, 2000);
            add(Op::SetXattr { path, name: XATTRS[0].into(), len }, model, setup);
        }
    }
}

/// One random core operation valid in `model` (ACE's operation kinds), or None if the kind
/// drawn has nothing to work on.
fn core_op(rng: &mut Rng, m: &Model) -> Option<Op> {
    let file = |rng: &mut Rng| pick(rng, &FILES, |p| m.is_file(p)).map(String::from);
    let size = |p: &str| m.get(p).map_or(0, |i| i.data.len() as u64);
    let op = match rng.below(15) {
        0 => Op::Creat(pick(rng, &FILES, |p| m.can_create(p))?.into()),
        1 => Op::Mkdir(pick(rng, &DIR_NAMES, |p| m.can_create(p))?.into()),
        2 => Op::Rmdir(pick(rng, &DIR_NAMES, |p| m.is_empty_dir(p))?.into()),
        3 => {
            let path = file(rng)?;
            Op::Write { offset: size(&path), len: 1 + rng.below(9000), path }
        }
        4 => {
            // An overwrite at an unaligned offset, possibly running past the end.
            let path = file(rng)?;
            let s = size(&path);
            if s == 0 {
                return None;
            }
            Op::Write { offset: rng.below(s), len: 1 + rng.below(6000), path }
        }
        5 => {
            // An extending write past the end, leaving a hole.
            let path = file(rng)?;
            Op::Write {
                offset: size(&path) + 1 + rng.below(12_000),
                len: 1 + rng.below(5000),
                path,
            }
        }
        6 => {
            let path = file(rng)?;
            let offset = rng.below(size(&path) + 8192);
            let (len, keep_size) = (1 + rng.below(12_000), rng.chance(2));
            // One in three zeroes the range (FALLOC_FL_ZERO_RANGE).
            Op::Falloc { offset, len, keep_size, zero: rng.chance(3), path }
        }
        7 => {
            let from = file(rng)?;
            Op::Link { to: pick(rng, &FILES, |p| m.can_create(p))?.into(), from }
        }
        8 => Op::Unlink(
            pick(rng, &FILES, |p| matches!(m.kind(p), Some(Kind::File | Kind::Symlink)))?.into(),
        ),
        9 | 10 => {
            let from = pick(rng, &FILES, |p| m.names.contains_key(p))
                .filter(|_| rng.below(4) != 0)
                .or_else(|| pick(rng, &DIR_NAMES, |p| m.is_dir(p)))?;
            let names: &[&str] = if m.is_dir(from) { &DIR_NAMES } else { &FILES };
            let mut trial = m.clone();
            let to = pick(rng, names, |to| {
                trial.clone_from(m);
                let rename = Op::Rename { from: from.into(), to: to.into(), whiteout: false };
                trial.apply(&rename, 0, 0).is_ok()
            })?;
            // One in four leaves a whiteout (overlayfs's rename on its upper directory).
            Op::Rename { from: from.into(), to: to.into(), whiteout: rng.chance(4) }
        }
        11 => {
            let path = file(rng)?;
            let s = size(&path);
            let size = if s > 0 && rng.chance(2) { rng.below(s) } else { s + rng.below(10_000) };
            Op::Truncate { path, size }
        }
        12 => {
            let len = if rng.chance(2) { 1 + rng.below(40) } else { 60 + rng.below(300) };
            Op::Symlink { path: pick(rng, &FILES, |p| m.can_create(p))?.into(), len }
        }
        13 => {
            let path = pick(rng, &FILES, |p| matches!(m.kind(p), Some(Kind::File | Kind::Dir)))
                .or_else(|| pick(rng, &DIRS, |p| m.is_dir(p)))?;
            let len = xattr_value_len(rng, m, 2500);
            let name = XATTRS[rng.below(3) as usize].into();
            Op::SetXattr { path: path.into(), name, len }
        }
        _ => {
            let has = |p: &str| m.get(p).is_some_and(|i| !i.xattrs.is_empty());
            let path = pick(rng, &FILES, has).or_else(|| pick(rng, &DIRS, has))?;
            let name = m.get(path)?.xattrs.keys().next()?.clone();
            Op::RemoveXattr { path: path.into(), name }
        }
    };
    Some(op)
}

/// The path an operation is about, for the persistence point after it (ACE persists the files
/// an operation used, or their parent).
fn subject(op: &Op) -> &str {
    match op {
        Op::Creat(p) | Op::Mkdir(p) | Op::Rmdir(p) | Op::Unlink(p) => p,
        Op::Link { to, .. } | Op::Rename { to, .. } => to,
        Op::Write { path, .. }
        | Op::Falloc { path, .. }
        | Op::Truncate { path, .. }
        | Op::Symlink { path, .. }
        | Op::SetXattr { path, .. }
        | Op::RemoveXattr { path, .. } => path,
        Op::Fsync(p) | Op::Fdatasync(p) => p,
        Op::Sync => "",
    }
}

/// A persistence point after `op` (ACE's fsync, fdatasync, sync or none), drawn with
/// `none_one_in` as the chance of none.
fn persistence(rng: &mut Rng, m: &Model, op: &Op, none_one_in: u64) -> Option<Op> {
    if rng.chance(none_one_in) {
        return None;
    }
    let path = subject(op);
    let parent = split(path).0;
    let target = if m.names.contains_key(path) && !rng.chance(4) { path } else { parent };
    Some(match rng.below(10) {
        0..=4 => Op::Fsync(target.into()),
        5..=7 if m.is_file(target) => Op::Fdatasync(target.into()),
        _ => Op::Sync,
    })
}

/// `ops` core operations, each followed by an optional persistence point, valid from `model`.
fn sequence(rng: &mut Rng, model: &mut Model, ops: usize, none_one_in: u64) -> Vec<Op> {
    let mut out = Vec::new();
    let mut core = 0;
    let mut attempts = 0;
    while core < ops && attempts < 1000 {
        attempts += 1;
        let Some(op) = core_op(rng, model) else { continue };
        // The kinds are drawn valid, but a value may still not fit (xattr space).
        if model.apply(&op, out.len(), 0).is_err() {
            continue;
        }
        let persist = persistence(rng, model, &op, none_one_in);
        out.push(op);
        core += 1;
        if let Some(p) = persist {
            model.apply(&p, out.len(), 0).expect("valid persistence point");
            out.push(p);
        }
    }
    out
}

/// A B3/ACE-style workload: setup, then 1 to 3 core operations, each followed by fsync,
/// fdatasync, sync or nothing.
pub fn ace(seed: u64, config: Config) -> Workload {
    let mut rng = Rng::new(seed);
    let mut model = Model::for_image(&config.image);
    let mut setup = Vec::new();
    setup_ops(&mut rng, "", &mut model, &mut setup);
    let length = 1 + rng.below(3) as usize;
    let ops = sequence(&mut rng, &mut model, length, 4);
    Workload { name: format!("ace-{length}"), seed, config, setup, threads: vec![ops] }
}

/// varmail's pattern in one large directory (an indexed one of several leaves, as varmail's
/// and the kernel's large mail spools are): setup fills `mail/` with a few hundred files, then
/// 2 to 4 rounds each delete a file, create one (a third of the time under the name just
/// removed), write it and fsync it, and sometimes append to another file and fsync or
/// fdatasync that. A third of the deliveries go Maildir's way: written under a temporary name
/// (fsynced there half of the time), renamed into place (over an older message one time in
/// four) and fsynced. With fsync_journal these are fast commits whose CREAT, LINK and UNLINK
/// records replay must fit into leaves that lost names in the same transaction.
pub fn mailbox(seed: u64, config: Config) -> Workload {
    let mut rng = Rng::new(seed);
    let mut model = Model::for_image(&config.image);
    let mut setup = Vec::new();
    let mut add = |op: Op, model: &mut Model| {
        model.apply(&op, setup.len(), tag(SETUP, setup.len())).expect("valid setup");
        setup.push(op);
    };
    add(Op::Mkdir(MAILBOX.into()), &mut model);
    // ~30-byte names, 40-byte entries: about 100 to a 4 KiB block.
    let mut live: Vec<String> = Vec::new();
    for k in 0..(220 + rng.below(120)) {
        let path = format!("{MAILBOX}/message-{k:04}-{:016x}", rng.next());
        add(Op::Creat(path.clone()), &mut model);
        if rng.chance(2) {
            add(Op::Write { path: path.clone(), offset: 0, len: 1 + rng.below(3000) }, &mut model);
        }
        live.push(path);
    }
    let mut ops = Vec::new();
    let mut push = |op: Op, model: &mut Model| {
        model.apply(&op, ops.len(), 0).expect("valid mailbox operation");
        ops.push(op);
    };
    let rounds = 2 + rng.below(3);
    for round in 0..rounds {
        let victim = live.swap_remove(rng.below(live.len() as u64) as usize);
        push(Op::Unlink(victim.clone()), &mut model);
        let mut path = if rng.chance(3) {
            victim
        } else {
            format!("{MAILBOX}/new-{round}-{:016x}", rng.next())
        };
        if rng.chance(3) {
            let tmp = format!("{MAILBOX}/tmp-{round}-{:016x}", rng.next());
            push(Op::Creat(tmp.clone()), &mut model);
            push(Op::Write { path: tmp.clone(), offset: 0, len: 1 + rng.below(9000) }, &mut model);
            if rng.chance(2) {
                push(Op::Fsync(tmp.clone()), &mut model);
            }
            if rng.chance(4) {
                path = live.swap_remove(rng.below(live.len() as u64) as usize);
            }
            push(Op::Rename { from: tmp, to: path.clone(), whiteout: false }, &mut model);
        } else {
            push(Op::Creat(path.clone()), &mut model);
            let write = Op::Write { path: path.clone(), offset: 0, len: 1 + rng.below(9000) };
            push(write, &mut model);
        }
        push(Op::Fsync(path.clone()), &mut model);
        if rng.chance(3) {
            let other = live[rng.below(live.len() as u64) as usize].clone();
            let offset = model.get(&other).map_or(0, |i| i.data.len() as u64);
            push(Op::Write { path: other.clone(), offset, len: 1 + rng.below(4000) }, &mut model);
            push(if rng.chance(2) { Op::Fsync(other) } else { Op::Fdatasync(other) }, &mut model);
        }
        live.push(path);
    }
    Workload { name: format!("mailbox-{rounds}"), seed, config, setup, threads: vec![ops] }
}

/// The directory of [`mailbox`] workloads.
pub const MAILBOX: &str = "mail";

/// `threads` (at least 2) threads, each running `length` core operations (with persistence
/// points half of the time) in its own directory.
pub fn threaded(seed: u64, threads: usize, length: usize, config: Config) -> Workload {
    let threads = threads.max(2);
    let mut rng = Rng::new(seed);
    let mut model = Model::for_image(&config.image);
    let mut setup = Vec::new();
    let mut w = Workload {
        name: format!("threads-{threads}x{length}"),
        seed,
        config,
        setup: Vec::new(),
        threads: Vec::new(),
    };
    for t in 0..threads {
        let root = format!("t{t}");
        setup_ops(&mut rng, &root, &mut model, &mut setup);
        let mut own = model.subtree(&root);
        w.threads.push(sequence(&mut rng, &mut own, length, 2));
    }
    w.setup = setup;
    w
}
