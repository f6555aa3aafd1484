//! POSIX behaviour a quill mount must share with the kernel's ext4, checked side by side on a
//! kernel loop mount and a quill FUSE mount of the same kind of image: set-id bits dropped by
//! writes, truncates and fallocate of an unprivileged caller; access times under relatime,
//! strictatime and noatime; a file replaced by rename while open. Needs root, /dev/fuse,
//! fusermount3, util-linux's setpriv and fallocate (SKIP otherwise).

mod mount_support;

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use mount_support::*;

/// `nobody`: an unprivileged caller outside group 0.
const NOBODY: &str = "65534";

/// Runs `sh -c script` as uid `NOBODY` with gid `gid` and no supplementary groups.
fn as_nobody(gid: &str, script: &str) -> bool {
    run(Command::new("setpriv").args([
        "--reuid",
        NOBODY,
        "--regid",
        gid,
        "--clear-groups",
        "sh",
        "-c",
        script,
    ]))
    .status
    .success()
}

/// For every set-id mode, change and caller: the mode a root-owned file has after the change.
fn set_id_outcomes(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let changes = [
        ("write", "printf x >> {f}"),
        ("truncate", "truncate -s 100 {f}"),
        ("fallocate", "fallocate -l 65536 {f}"),
        ("punch", "fallocate -p -o 0 -l 4096 {f}"),
        ("keep-size", "fallocate -n -l 131072 {f}"),
    ];
    for mode in [0o2666, 0o2766, 0o2676, 0o6666, 0o4766, 0o0666] {
        for (change, script) in changes {
            // gid 0: the caller is in the file's group; 65534: it is not.
            for gid in ["0", NOBODY] {
                let f = dir.join(format!("m{mode:o}-{change}-{gid}"));
                fs::write(&f, vec![7u8; 8192]).unwrap();
                fs::set_permissions(&f, fs::Permissions::from_mode(mode)).unwrap();
                let ran = as_nobody(gid, &script.replace("{f}", &f.display().to_string()));
                let after = fs::metadata(&f).unwrap().mode() & 0o7777;
                out.insert(format!("{mode:o} {change} by gid {gid}"), format!("{ran} {after:o}"));
            }
        }
    }
    out
}

/// A change of a file's owner or group, run on the file; whether it succeeded.
type OwnerChange<'a> = dyn Fn(&Path) -> bool + 'a;

/// For every set-id mode and owner change: the mode after it. Root changes the owner, the
/// group, or neither (chown(-1, -1), which still drops the bits), and an unprivileged owner
/// hands the file to its own group from one it is not in.
fn chown_outcomes(dir: &Path) -> BTreeMap<String, String> {
    use std::os::unix::fs::chown;
    let mut out = BTreeMap::new();
    for mode in [0o4755, 0o6755, 0o2755, 0o2745, 0o6745, 0o0755] {
        let changes: [(&str, &OwnerChange<'_>); 4] = [
            ("root chown", &|f| chown(f, Some(1000), None).is_ok()),
            ("root chgrp", &|f| chown(f, None, Some(1000)).is_ok()),
            ("root chown -1 -1", &|f| chown(f, None, None).is_ok()),
            ("owner chgrp", &|f| {
                chown(f, Some(65534), None).unwrap();
                fs::set_permissions(f, fs::Permissions::from_mode(mode)).unwrap();
                as_nobody(NOBODY, &format!("chgrp {NOBODY} {}", f.display()))
            }),
        ];
        for (change, run) in changes {
            let f = dir.join(format!("c{mode:o}-{}", change.replace(' ', "-")));
            fs::write(&f, b"x").unwrap();
            fs::set_permissions(&f, fs::Permissions::from_mode(mode)).unwrap();
            let ran = run(&f);
            let after = fs::metadata(&f).unwrap().mode() & 0o7777;
            out.insert(format!("{mode:o} {change}"), format!("{ran} {after:o}"));
        }
    }
    out
}

/// A file capability (`security.capability`, CAP_NET_RAW effective and permitted, VFS
/// revision 2) and whether each change by root left it: a write, a truncate, a chown to the
/// same owner, a fallocate, a chmod, a read.
fn capability_outcomes(dir: &Path) -> Vec<String> {
    let cap = "0x0100000200200000000000000000000000000000";
    let changes = [
        ("write", "printf x >> {f}"),
        ("truncate", "truncate -s 1 {f}"),
        ("chown", "chown 0 {f}"),
        ("fallocate", "fallocate -l 65536 {f}"),
        ("chmod", "chmod 700 {f}"),
        ("read", "cat {f} > /dev/null"),
    ];
    let mut out = Vec::new();
    for (change, script) in changes {
        let f = dir.join(format!("cap-{change}"));
        fs::write(&f, b"abc").unwrap();
        let f = f.display().to_string();
        let script = format!(
            "setfattr -n security.capability -v {cap} {f} && {} && \
             (getfattr -n security.capability {f} >/dev/null 2>&1 && echo kept || echo dropped)",
            script.replace("{f}", &f)
        );
        out.extend(script_lines(&script, dir).into_iter().map(|l| format!("{change}: {l}")));
    }
    out
}

/// Every name under `dir` with its kind, size, mode and link count, as `ls -lR` shows them.
fn listing(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(at) = todo.pop() {
        let mut entries: Vec<_> = fs::read_dir(&at).unwrap().map(|e| e.unwrap()).collect();
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let meta = fs::symlink_metadata(entry.path()).unwrap();
            let rel = entry.path().strip_prefix(dir).unwrap().display().to_string();
            let size = if meta.is_dir() { 0 } else { meta.len() };
            out.push(format!("{rel} {:o} {size} {}", meta.mode(), meta.nlink()));
            if meta.is_dir() {
                todo.push(entry.path());
            }
        }
    }
    out
}

/// Listings of a tree, and listings again after each kind of change to it (files written,
/// renamed, linked, unlinked, a directory made and removed): what READDIRPLUS caches must
/// follow every change made through the mount.
fn readdirplus_outcomes(dir: &Path) -> Vec<String> {
    let root = dir.join("tree");
    fs::create_dir(&root).unwrap();
    for d in 0..3 {
        let sub = root.join(format!("d{d}"));
        fs::create_dir(&sub).unwrap();
        for f in 0..20 {
            fs::write(sub.join(format!("f{f}")), vec![b'x'; f * 100 + d]).unwrap();
        }
    }
    let mut out = listing(&root);
    let mut step = |what: &str, change: &dyn Fn()| {
        change();
        out.push(format!("after {what}:"));
        out.extend(listing(&root));
    };
    step("a write", &|| fs::write(root.join("d0/f3"), vec![b'y'; 7777]).unwrap());
    step("a rename", &|| fs::rename(root.join("d0/f4"), root.join("d1/moved")).unwrap());
    step("a link", &|| fs::hard_link(root.join("d1/f5"), root.join("d2/linked")).unwrap());
    step("an unlink", &|| fs::remove_file(root.join("d2/f6")).unwrap());
    step("a chmod", &|| {
        fs::set_permissions(root.join("d2/f7"), fs::Permissions::from_mode(0o600)).unwrap()
    });
    step("a mkdir and rmdir", &|| {
        fs::create_dir(root.join("d0/new")).unwrap();
        fs::remove_dir(root.join("d1")).unwrap_err();
        fs::create_dir(root.join("d0/new/deeper")).unwrap();
        fs::remove_dir(root.join("d0/new/deeper")).unwrap();
    });
    out
}

/// Eight threads at once in one directory of 200 files: each looks up every existing name
/// and as many absent ones, lists the directory, creates 100 names of its own and removes
/// every other one. What each thread saw (wrong lookups, whether every listing held the
/// 200 files and its own newest name) and the directory at the end.
fn concurrent_directory_outcomes(dir: &Path) -> Vec<String> {
    let shared = dir.join("shared");
    fs::create_dir(&shared).unwrap();
    for i in 0..200 {
        fs::write(shared.join(format!("f{i}")), vec![b'x'; i]).unwrap();
    }
    let mut out: Vec<String> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..8)
            .map(|t| {
                let shared = &shared;
                scope.spawn(move || {
                    let (mut wrong, mut whole) = (0, true);
                    for i in 0..100 {
                        wrong += usize::from(fs::metadata(shared.join(format!("f{i}"))).is_err());
                        let absent = shared.join(format!("absent-{t}-{i}"));
                        wrong += usize::from(fs::metadata(absent).is_ok());
                        let mine = shared.join(format!("t{t}-{i}"));
                        fs::write(&mine, b"mine").unwrap();
                        if i % 10 == 0 {
                            // The 200 files and this thread's name just made, whatever the
                            // others are doing.
                            let names: Vec<_> = fs::read_dir(shared)
                                .unwrap()
                                .map(|e| e.unwrap().file_name())
                                .collect();
                            let newest = format!("t{t}-{i}");
                            whole &= names.len() > 200
                                && names.iter().any(|n| n.to_str() == Some(newest.as_str()));
                        }
                        if i % 2 == 1 {
                            fs::remove_file(&mine).unwrap();
                        }
                    }
                    format!("thread {t}: {wrong} wrong lookups, every listing whole: {whole}")
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    out.extend(listing(&shared));
    out
}

/// What each name shows through stat(2) (mode, links, size, or absent), through a
/// mode-only statx (coreutils' `stat -c %a` asks for STATX_MODE alone, which the kernel's
/// FUSE client answers from its cache unless it dropped the mode), and `user.tag`.
fn observe(dir: &Path, names: &[&str]) -> Vec<String> {
    names
        .iter()
        .map(|name| {
            let p = dir.join(name);
            // The mode alone first: a full stat would refresh it whenever the size or times
            // are stale.
            let mode_only = Command::new("stat").arg("-c").arg("%a").arg(&p).output().unwrap();
            let seen = match fs::symlink_metadata(&p) {
                Ok(m) => format!("{:o} {} {}", m.mode(), m.nlink(), m.size()),
                Err(e) => format!("absent ({:?})", e.kind()),
            };
            let tag = Command::new("getfattr")
                .args(["--only-values", "-n", "user.tag"])
                .arg(&p)
                .output()
                .unwrap();
            let line = format!(
                "{name}: {seen}; mode-only {}; tag {}",
                String::from_utf8_lossy(&mode_only.stdout).trim(),
                String::from_utf8_lossy(&tag.stdout).trim()
            );
            line.trim_end().to_string()
        })
        .collect()
}

/// Every change made through one name or descriptor, seen at once through the others: each
/// step first looks at every name (so the kernel caches them, absent names too), makes one
/// change, and looks again. Run with long entry, attribute and negative timeouts, nothing
/// may show what a cache held before the change.
fn coherence_outcomes(dir: &Path) -> Vec<String> {
    let names = ["a", "b", "x", "y", "suid", "sub", "sub/inner"];
    fs::write(dir.join("x"), b"twice named").unwrap();
    fs::hard_link(dir.join("x"), dir.join("y")).unwrap();
    fs::create_dir(dir.join("sub")).unwrap();
    fs::write(dir.join("suid"), vec![7u8; 100]).unwrap();
    fs::set_permissions(dir.join("suid"), fs::Permissions::from_mode(0o4757)).unwrap();
    let held = OpenOptions::new().read(true).write(true).open(dir.join("x")).unwrap();
    let mut out = Vec::new();
    let mut step = |what: &str, change: &dyn Fn()| {
        observe(dir, &names);
        change();
        out.push(format!("after {what}:"));
        out.extend(observe(dir, &names));
    };
    step("a create of a name looked up before", &|| fs::write(dir.join("a"), b"new").unwrap());
    step("a rename", &|| fs::rename(dir.join("a"), dir.join("b")).unwrap());
    step("an unlink of one of two names", &|| fs::remove_file(dir.join("x")).unwrap());
    step("a chmod through a descriptor", &|| {
        held.set_permissions(fs::Permissions::from_mode(0o640)).unwrap()
    });
    step("a truncate through a descriptor", &|| held.set_len(5).unwrap());
    step("an xattr set through another name", &|| {
        let set =
            run(Command::new("setfattr").args(["-n", "user.tag", "-v", "t1"]).arg(dir.join("y")));
        assert!(set.status.success());
    });
    step("an xattr removed", &|| {
        let removed = run(Command::new("setfattr").args(["-x", "user.tag"]).arg(dir.join("y")));
        assert!(removed.status.success());
    });
    step("a write by a caller who drops set-user-ID", &|| {
        assert!(as_nobody(NOBODY, &format!("printf x >> {}", dir.join("suid").display())));
    });
    step("a mkdir and a rename over its name", &|| {
        fs::create_dir(dir.join("sub/inner")).unwrap();
        fs::remove_dir(dir.join("sub/inner")).unwrap();
        fs::write(dir.join("sub/inner"), b"file now").unwrap();
    });
    step("an unlink of a name looked up before", &|| fs::remove_file(dir.join("b")).unwrap());
    out
}

/// Whether reading (or listing) changed the access time, step by step, for a file and a
/// directory whose times are set back first.
fn atime_outcomes(dir: &Path) -> BTreeMap<String, bool> {
    let mut out = BTreeMap::new();
    let file = dir.join("atime-file");
    let sub = dir.join("atime-dir");
    fs::write(&file, b"contents").unwrap();
    fs::create_dir(&sub).unwrap();
    fs::write(sub.join("entry"), b"x").unwrap();
    let atime = |p: &Path| fs::metadata(p).unwrap().atime();
    let read_file = || {
        let mut s = String::new();
        File::open(&file).unwrap().read_to_string(&mut s).unwrap();
    };
    let list_dir = || {
        fs::read_dir(&sub).unwrap().count();
    };
    // (step, touch arguments to set times first). touch also sets ctime to now, so the
    // day-old rule is covered by the unit test of AtimeMode, not here.
    let steps: [(&str, &[&str]); 3] = [
        // atime older than ctime and mtime: relatime updates it.
        ("read after a change", &["-a", "-d", "2 hours ago"]),
        // atime now newer than both: relatime leaves it, strictatime does not.
        ("read again", &[]),
        ("read a second later", &[]),
    ];
    for (what, path, access) in
        [("file", &file, &read_file as &dyn Fn()), ("dir", &sub, &list_dir as &dyn Fn())]
    {
        for (step, touch) in steps {
            if touch.is_empty() {
                std::thread::sleep(Duration::from_millis(if step.contains("second") {
                    1100
                } else {
                    20
                }));
            } else {
                ok(Command::new("touch").args(touch).arg(path));
            }
            let before = atime(path);
            let before_ns = fs::metadata(path).unwrap().atime_nsec();
            access();
            let after = fs::metadata(path).unwrap();
            out.insert(
                format!("{what}: {step}"),
                (after.atime(), after.atime_nsec()) != (before, before_ns),
            );
        }
    }
    out
}

/// A file replaced by rename while open: what fstat, read, write and fsync on the open
/// descriptor give.
fn rename_over_open_outcomes(dir: &Path) -> Vec<String> {
    let old = dir.join("replaced");
    let new = dir.join("replacement");
    fs::write(&old, b"old contents").unwrap();
    let mut open = OpenOptions::new().read(true).write(true).open(&old).unwrap();
    fs::write(&new, b"new").unwrap();
    fs::rename(&new, &old).unwrap();
    let mut out = Vec::new();
    let result = |what: &str, r: std::io::Result<String>| match r {
        Ok(v) => format!("{what}: {v}"),
        Err(e) => format!("{what}: error {}", e.raw_os_error().unwrap_or(0)),
    };
    out.push(result("fstat nlink", open.metadata().map(|m| m.nlink().to_string())));
    let mut buf = [0u8; 12];
    out.push(result("read", open.read_exact_at(&mut buf, 0).map(|()| format!("{buf:?}"))));
    out.push(result("write", open.write_all(b"OLD").map(|()| "ok".into())));
    out.push(result("fsync", open.sync_all().map(|()| "ok".into())));
    out.push(result("fstat size", open.metadata().map(|m| m.len().to_string())));
    out.push(result("read back", open.read_exact_at(&mut buf, 0).map(|()| format!("{buf:?}"))));
    drop(open);
    out.push(format!("name now: {:?}", fs::read(&old).unwrap()));
    out
}

/// Project ids (`mkfs.ext4 -O project`): `chattr -p`/`+P` (FS_IOC_FSSETXATTR) and
/// `lsattr -p`, inheritance into a PROJINHERIT directory, and EXDEV for a link or rename of
/// another project's inode into it.
fn project_outcomes(dir: &Path) -> Vec<String> {
    let tool = |args: &[&str]| {
        let o = Command::new(args[0]).args(&args[1..]).output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout).trim().to_string();
        // lsattr prints the path last: keep the project and the flags.
        let out = out.split_whitespace().take(2).collect::<Vec<_>>().join(" ");
        format!("{}: {} {out}", args[..args.len() - 1].join(" "), o.status.code().unwrap_or(-1))
    };
    let path = |name: &str| dir.join(name).to_str().unwrap().to_string();
    fs::create_dir(dir.join("proj")).unwrap();
    fs::write(dir.join("outside"), b"x").unwrap();
    let mut out = vec![
        tool(&["chattr", "-p", "42", "+P", &path("proj")]),
        tool(&["lsattr", "-pd", &path("proj")]),
    ];
    fs::write(dir.join("proj/inherits"), b"y").unwrap();
    fs::create_dir(dir.join("proj/sub")).unwrap();
    out.push(tool(&["lsattr", "-p", &path("proj/inherits")]));
    out.push(tool(&["lsattr", "-pd", &path("proj/sub")]));
    let errno = |r: std::io::Result<()>| r.err().and_then(|e| e.raw_os_error()).unwrap_or(0);
    out.push(format!("link in: {}", errno(fs::hard_link(dir.join("outside"), dir.join("proj/l")))));
    out.push(format!("rename in: {}", errno(fs::rename(dir.join("outside"), dir.join("proj/r")))));
    out.push(format!(
        "rename out: {}",
        errno(fs::rename(dir.join("proj/inherits"), dir.join("out")))
    ));
    out.push(tool(&["chattr", "-p", "42", &path("outside")]));
    out.push(format!(
        "rename in after: {}",
        errno(fs::rename(dir.join("outside"), dir.join("proj/r")))
    ));
    out.push(tool(&["lsattr", "-p", &path("proj/r")]));
    out
}

/// A new (or emptied) file at `path`, open for reading and writing.
fn create_rw(path: &Path) -> File {
    OpenOptions::new().read(true).write(true).create(true).truncate(true).open(path).unwrap()
}

/// lseek(SEEK_DATA) and lseek(SEEK_HOLE) from offsets across files with holes, fallocated
/// (unwritten) ranges, a punched hole and cached writes not yet written back, before and after
/// fsync: each answer (offset or errno) by file, offset and moment.
fn seek_outcomes(dir: &Path) -> Vec<String> {
    use std::os::fd::AsRawFd;
    let mut out = Vec::new();
    let seeks = |out: &mut Vec<String>, name: &str, moment: &str, file: &File| {
        let size = file.metadata().unwrap().len() as i64;
        let mut offsets = vec![0, 1, 1023, 1024, 4095, 4096, 8191, 8192, 20_000, 65_536, 70_000];
        offsets.extend([size - 1, size, size + 1]);
        for offset in offsets.into_iter().filter(|&o| o >= 0) {
            for (whence, what) in [(libc::SEEK_DATA, "data"), (libc::SEEK_HOLE, "hole")] {
                // SAFETY: lseek on a descriptor this function owns.
                let at = unsafe { libc::lseek(file.as_raw_fd(), offset, whence) };
                let got = if at < 0 {
                    format!("errno {}", std::io::Error::last_os_error().raw_os_error().unwrap())
                } else {
                    at.to_string()
                };
                out.push(format!("{name} {moment}: {what} from {offset} = {got}"));
            }
        }
    };
    // Its answer joins the outcomes (an indirect-mapped file on ext3 refuses preallocation).
    let fallocate = |out: &mut Vec<String>, file: &File, mode: i32, offset: i64, len: i64| {
        // SAFETY: fallocate on a descriptor the caller owns.
        let r = unsafe { libc::fallocate(file.as_raw_fd(), mode, offset, len) };
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        let errno = if r == 0 { 0 } else { errno };
        out.push(format!("fallocate {mode:#x} {offset}+{len}: {errno}"));
    };
    let open = |name: &str| create_rw(&dir.join(name));
    let block = vec![0xabu8; 4096];

    // Data, a hole, data: written, then synced.
    let sparse = open("sparse");
    sparse.write_all_at(&block, 0).unwrap();
    sparse.write_all_at(&block[..100], 65_536).unwrap();
    seeks(&mut out, "sparse", "cached", &sparse);
    sparse.sync_all().unwrap();
    seeks(&mut out, "sparse", "synced", &sparse);

    // A fallocated range past the data (unwritten, kept size), then a write into its middle.
    let falloc = open("falloc");
    falloc.write_all_at(&block[..3000], 0).unwrap();
    fallocate(&mut out, &falloc, libc::FALLOC_FL_KEEP_SIZE, 4096, 65_536);
    falloc.set_len(70_000).unwrap();
    falloc.sync_all().unwrap();
    seeks(&mut out, "falloc", "unwritten", &falloc);
    falloc.write_all_at(&block[..2000], 20_000).unwrap();
    seeks(&mut out, "falloc", "cached in unwritten", &falloc);
    falloc.sync_all().unwrap();
    seeks(&mut out, "falloc", "synced", &falloc);

    // A hole punched in the middle of written data.
    let punched = open("punched");
    for k in 0..20 {
        punched.write_all_at(&block, k * 4096).unwrap();
    }
    punched.sync_all().unwrap();
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    fallocate(&mut out, &punched, punch, 4096, 16_384);
    seeks(&mut out, "punched", "synced", &punched);

    // All hole (a size and nothing written), and empty.
    let hole = open("hole");
    hole.set_len(50_000).unwrap();
    seeks(&mut out, "hole", "truncated up", &hole);
    let empty = open("empty");
    seeks(&mut out, "empty", "new", &empty);
    out
}

/// fallocate(FALLOC_FL_ZERO_RANGE), with and without KEEP_SIZE, over written data (synced
/// and still cached), past the end and over a hole: each file's size, allocated blocks, the
/// bytes it reads (non-zero count and a checksum) and where its data starts after the range.
fn zero_range_outcomes(dir: &Path) -> Vec<String> {
    use std::os::fd::AsRawFd;
    let pattern: Vec<u8> = (0..40_000u32).map(|i| (i % 251) as u8 | 1).collect();
    let zero_range = |file: &File, keep_size: bool, offset: i64, len: i64| -> String {
        let mode =
            libc::FALLOC_FL_ZERO_RANGE | if keep_size { libc::FALLOC_FL_KEEP_SIZE } else { 0 };
        // SAFETY: fallocate on a descriptor the caller owns.
        let r = unsafe { libc::fallocate(file.as_raw_fd(), mode, offset, len) };
        if r == 0 {
            "ok".into()
        } else {
            format!("errno {}", std::io::Error::last_os_error().raw_os_error().unwrap())
        }
    };
    // SEEK_DATA before the read: the kernel counts page-cache folios a read brought in over
    // unwritten extents as data (see fs/src/seek.rs), and quill keeps no clean pages.
    let describe = |name: &str, file: &File, from: i64| -> String {
        // SAFETY: lseek on a descriptor the caller owns.
        let data = unsafe { libc::lseek(file.as_raw_fd(), from, libc::SEEK_DATA) };
        let m = file.metadata().unwrap();
        let bytes = fs::read(dir.join(name)).unwrap();
        let nonzero = bytes.iter().filter(|&&b| b != 0).count();
        let sum = bytes
            .iter()
            .enumerate()
            .fold(0u64, |s, (i, &b)| s.wrapping_add(i as u64 * u64::from(b)));
        format!(
            "{name}: size {} blocks {} nonzero {nonzero} sum {sum} data from {from} at {data}",
            m.len(),
            m.blocks()
        )
    };
    let open = |name: &str| create_rw(&dir.join(name));
    let mut out = Vec::new();
    // Unaligned, inside written data that is on disk.
    let synced = open("synced");
    synced.write_all_at(&pattern[..20_000], 0).unwrap();
    synced.sync_all().unwrap();
    out.push(format!("synced: {}", zero_range(&synced, false, 3000, 8000)));
    out.push(describe("synced", &synced, 3000));
    // Over writes still cached. The kernel keeps the zeroed pages of the range up to date in
    // its page cache (the extents are unwritten on disk, as quill's), and its SEEK_DATA counts
    // them as data until they are dropped: SEEK_DATA is compared from past the range only.
    let cached = open("cached");
    cached.write_all_at(&pattern[..20_000], 0).unwrap();
    out.push(format!("cached: {}", zero_range(&cached, true, 4096, 8192)));
    cached.sync_all().unwrap();
    out.push(describe("cached", &cached, 12_288));
    // Past the end: grows the file, or not with KEEP_SIZE.
    for (name, keep_size) in [("grow", false), ("keep", true)] {
        let file = open(name);
        file.write_all_at(&pattern[..5000], 0).unwrap();
        file.sync_all().unwrap();
        out.push(format!("{name}: {}", zero_range(&file, keep_size, 4000, 12_000)));
        file.sync_all().unwrap();
        out.push(describe(name, &file, 4000));
    }
    // Over a hole (a size and nothing written).
    let hole = open("hole");
    hole.set_len(40_000).unwrap();
    out.push(format!("hole: {}", zero_range(&hole, false, 8192, 8192)));
    hole.sync_all().unwrap();
    out.push(describe("hole", &hole, 0));
    out
}

/// A file handle of `path` (name_to_handle_at): its bytes, header included.
fn handle_of(path: &Path) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    const MAX_HANDLE: usize = 128;
    let mut buf = vec![0u8; 8 + MAX_HANDLE];
    buf[..4].copy_from_slice(&(MAX_HANDLE as u32).to_ne_bytes());
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut mount_id = 0;
    // SAFETY: a buffer with room for MAX_HANDLE bytes after the header it announces.
    let r = unsafe {
        libc::name_to_handle_at(
            libc::AT_FDCWD,
            c.as_ptr(),
            buf.as_mut_ptr().cast::<libc::file_handle>(),
            &mut mount_id,
            0,
        )
    };
    assert_eq!(r, 0, "name_to_handle_at {path:?}: {}", std::io::Error::last_os_error());
    buf
}

/// What open_by_handle_at of `handle` on the file system holding `mount` gives: the file's
/// contents, a directory's entry count, or the errno.
fn open_handle(mount: &Path, handle: &[u8]) -> String {
    use std::os::fd::{AsRawFd, FromRawFd};
    let mount_fd = File::open(mount).unwrap();
    let mut handle = handle.to_vec();
    // SAFETY: a handle name_to_handle_at filled; the descriptor it returns is owned below.
    let fd = unsafe {
        libc::open_by_handle_at(
            mount_fd.as_raw_fd(),
            handle.as_mut_ptr().cast::<libc::file_handle>(),
            libc::O_RDONLY,
        )
    };
    if fd < 0 {
        return format!("errno {}", std::io::Error::last_os_error().raw_os_error().unwrap());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    let mut file = unsafe { File::from_raw_fd(fd) };
    if file.metadata().unwrap().is_dir() {
        let entries = fs::read_dir(format!("/proc/self/fd/{fd}")).unwrap().count();
        return format!("directory of {entries} entries");
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).unwrap();
    format!("file {:?}", String::from_utf8_lossy(&bytes))
}

/// name_to_handle_at / open_by_handle_at (what NFS export and backup tools use): handles of a
/// file, a directory and a file in it opened at once, after the kernel dropped its dentry and
/// inode caches, and after the file was deleted (and its name made again) or the inner file
/// deleted.
fn file_handle_outcomes(dir: &Path) -> Vec<String> {
    fs::write(dir.join("f"), b"first").unwrap();
    fs::create_dir(dir.join("d")).unwrap();
    fs::write(dir.join("d/g"), b"inner").unwrap();
    let handles: Vec<(&str, Vec<u8>)> =
        ["f", "d", "d/g"].into_iter().map(|n| (n, handle_of(&dir.join(n)))).collect();
    let mut out = Vec::new();
    let round = |when: &str, out: &mut Vec<String>| {
        for (name, handle) in &handles {
            out.push(format!("{when}: {name}: {}", open_handle(dir, handle)));
        }
    };
    round("cached", &mut out);
    fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
    round("caches dropped", &mut out);
    fs::remove_file(dir.join("f")).unwrap();
    fs::write(dir.join("f"), b"second").unwrap();
    fs::remove_file(dir.join("d/g")).unwrap();
    fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
    round("deleted", &mut out);
    out
}

/// FS_IOC_GETFLAGS (what lsattr reads) of an empty file, a written one, a small directory
/// and one large enough to be indexed: the flags or the errno.
fn getflags_outcomes(dir: &Path) -> Vec<String> {
    use std::os::fd::AsRawFd;
    const FS_IOC_GETFLAGS: libc::c_ulong = 0x8008_6601;
    fs::write(dir.join("empty"), b"").unwrap();
    fs::write(dir.join("written"), vec![7u8; 50_000]).unwrap();
    fs::create_dir(dir.join("small")).unwrap();
    fs::create_dir(dir.join("large")).unwrap();
    for k in 0..200 {
        fs::write(dir.join(format!("large/entry-with-a-longer-name-{k:04}")), b"").unwrap();
    }
    ["empty", "written", "small", "large"]
        .into_iter()
        .map(|name| {
            let file = File::open(dir.join(name)).unwrap();
            let mut flags: libc::c_long = 0;
            // SAFETY: FS_IOC_GETFLAGS writes one long through the pointer.
            let r = unsafe { libc::ioctl(file.as_raw_fd(), FS_IOC_GETFLAGS, &mut flags) };
            if r == 0 {
                format!("{name}: flags {flags:#x}")
            } else {
                format!("{name}: errno {}", std::io::Error::last_os_error().raw_os_error().unwrap())
            }
        })
        .collect()
}

/// renameat2 with RENAME_WHITEOUT (what overlayfs does on its upper directory): the file,
/// directory and replaced target moved, and what stands under the old names (kind, device
/// number, mode, owner, links, the type readdir gives); the flag combinations refused.
fn whiteout_outcomes(dir: &Path) -> Vec<String> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).unwrap();
    let rename = |from: &str, to: &str, flags: u32| -> String {
        let (from, to) = (c(&dir.join(from)), c(&dir.join(to)));
        // SAFETY: renameat2 with NUL-terminated paths this function owns.
        let r = unsafe {
            libc::renameat2(libc::AT_FDCWD, from.as_ptr(), libc::AT_FDCWD, to.as_ptr(), flags)
        };
        if r == 0 {
            "ok".into()
        } else {
            format!("errno {}", std::io::Error::last_os_error().raw_os_error().unwrap())
        }
    };
    let describe = |name: &str| -> String {
        match fs::symlink_metadata(dir.join(name)) {
            Ok(m) => format!(
                "{name}: mode {:o} rdev {} uid {} gid {} nlink {} size {}",
                m.mode(),
                m.rdev(),
                m.uid(),
                m.gid(),
                m.nlink(),
                m.len()
            ),
            Err(e) => format!("{name}: errno {}", e.raw_os_error().unwrap()),
        }
    };
    let mut out = Vec::new();
    fs::write(dir.join("a"), b"contents of a").unwrap();
    out.push(format!("a -> b: {}", rename("a", "b", libc::RENAME_WHITEOUT)));
    fs::write(dir.join("c"), b"c").unwrap();
    fs::write(dir.join("d"), b"replaced").unwrap();
    out.push(format!("c -> d (replacing): {}", rename("c", "d", libc::RENAME_WHITEOUT)));
    fs::create_dir(dir.join("dir1")).unwrap();
    fs::write(dir.join("dir1/inner"), b"inner").unwrap();
    fs::create_dir(dir.join("other")).unwrap();
    out.push(format!(
        "dir1 -> other/dir2: {}",
        rename("dir1", "other/dir2", libc::RENAME_WHITEOUT)
    ));
    // A set-group-ID directory gives its group to what is made in it, the whiteout too.
    fs::create_dir(dir.join("sg")).unwrap();
    std::os::unix::fs::chown(dir.join("sg"), Some(0), Some(65534)).unwrap();
    fs::set_permissions(dir.join("sg"), fs::Permissions::from_mode(0o2777)).unwrap();
    fs::write(dir.join("sg/e"), b"e").unwrap();
    out.push(format!("sg/e -> sg/f: {}", rename("sg/e", "sg/f", libc::RENAME_WHITEOUT)));
    fs::write(dir.join("g"), b"g").unwrap();
    let both = libc::RENAME_WHITEOUT | libc::RENAME_EXCHANGE;
    out.push(format!("g <-> b with whiteout: {}", rename("g", "b", both)));
    let noreplace = libc::RENAME_WHITEOUT | libc::RENAME_NOREPLACE;
    out.push(format!("g -> b, noreplace: {}", rename("g", "b", noreplace)));
    out.push(format!("missing -> h: {}", rename("missing", "h", libc::RENAME_WHITEOUT)));
    for name in ["a", "b", "c", "d", "dir1", "other/dir2", "other/dir2/inner", "sg/e", "sg/f"] {
        out.push(describe(name));
    }
    out.push(format!("b reads {:?}", fs::read(dir.join("b")).unwrap()));
    out.push(format!("root nlink {}", fs::metadata(dir).unwrap().nlink()));
    let mut types: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            use std::os::unix::fs::FileTypeExt;
            let e = e.unwrap();
            let t = e.file_type().unwrap();
            let kind = match () {
                _ if t.is_char_device() => "character device",
                _ if t.is_dir() => "directory",
                _ if t.is_file() => "regular file",
                _ => "other",
            };
            format!("readdir: {:?} {kind}", e.file_name())
        })
        .collect();
    types.sort();
    out.extend(types);
    out
}

/// FNV-1a of `bytes`: a short line for a file's contents.
fn digest(bytes: &[u8]) -> String {
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("{} bytes {hash:016x}", bytes.len())
}

/// What the kernel's writeback cache must keep as ext4 does: appends from four threads to
/// one O_APPEND file (each record whole, none lost), truncates down and up around writes,
/// writes through a shared mapping, a file written and fsynced after its unlink, and the size
/// stat shows right after a write; each file's contents as a digest.
fn writeback_outcomes(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    // Concurrent appends.
    let shared = dir.join("shared");
    std::thread::scope(|scope| {
        for t in 0..4u8 {
            let shared = &shared;
            scope.spawn(move || {
                let mut file = OpenOptions::new().create(true).append(true).open(shared).unwrap();
                for r in 0..100u8 {
                    let mut record = vec![b'a' + t; 1000];
                    record[..2].copy_from_slice(&[t, r]);
                    file.write_all(&record).unwrap();
                }
                file.sync_all().unwrap();
            });
        }
    });
    let data = fs::read(&shared).unwrap();
    let mut records: Vec<(u8, u8)> = data
        .chunks(1000)
        .filter(|c| c.len() == 1000 && c[2..].iter().all(|&b| b == b'a' + c[0]))
        .map(|c| (c[0], c[1]))
        .collect();
    records.sort_unstable();
    out.push(format!("shared: {} bytes, {} whole records", data.len(), records.len()));
    records.dedup();
    out.push(format!("shared: {} distinct records", records.len()));
    // Truncates around writes.
    let path = dir.join("truncated");
    let file = create_rw(&path);
    file.write_all_at(&[7u8; 10_000], 0).unwrap();
    file.set_len(3000).unwrap();
    out.push(format!("truncated to 3000: stat {}", fs::metadata(&path).unwrap().len()));
    file.write_all_at(&[9u8; 100], 5000).unwrap();
    file.set_len(8000).unwrap();
    file.write_all_at(&[5u8; 10], 2995).unwrap();
    file.sync_all().unwrap();
    out.push(format!("truncated: {}", digest(&fs::read(&path).unwrap())));
    // Writes through a shared mapping.
    let path = dir.join("mapped");
    let file = create_rw(&path);
    file.set_len(3 * 4096).unwrap();
    // SAFETY: a shared read-write mapping of a file this function owns, of its length, used
    // only inside this block and unmapped before the file is read.
    unsafe {
        use std::os::fd::AsRawFd;
        let len = 3 * 4096;
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        let map =
            libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, file.as_raw_fd(), 0);
        assert_ne!(map, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
        let bytes = std::slice::from_raw_parts_mut(map as *mut u8, len);
        for (i, b) in bytes.iter_mut().enumerate().skip(100).step_by(7) {
            *b = (i % 251) as u8;
        }
        assert_eq!(libc::msync(map, len, libc::MS_SYNC), 0);
        assert_eq!(libc::munmap(map, len), 0);
    }
    file.write_all_at(b"after the mapping", 4096).unwrap();
    file.sync_all().unwrap();
    out.push(format!("mapped: {}", digest(&fs::read(&path).unwrap())));
    // Unlinked while open.
    let path = dir.join("doomed");
    let mut file = create_rw(&path);
    file.write_all(&[3u8; 5000]).unwrap();
    fs::remove_file(&path).unwrap();
    file.write_all(&[4u8; 5000]).unwrap();
    file.sync_all().unwrap();
    let mut back = Vec::new();
    let mut reader = file.try_clone().unwrap();
    std::io::Seek::seek(&mut reader, std::io::SeekFrom::Start(0)).unwrap();
    reader.read_to_end(&mut back).unwrap();
    out.push(format!(
        "doomed: nlink {}, {}, listed {}",
        file.metadata().unwrap().nlink(),
        digest(&back),
        fs::read_dir(dir).unwrap().any(|e| e.unwrap().file_name() == "doomed")
    ));
    // The size right after a write, before any writeback.
    let path = dir.join("sized");
    let file = create_rw(&path);
    file.write_all_at(&[1u8; 12_345], 0).unwrap();
    out.push(format!("sized: stat {} before fsync", fs::metadata(&path).unwrap().len()));
    file.write_all_at(&[2u8; 10], 20_000).unwrap();
    out.push(format!("sized: fstat {} after a write past the end", file.metadata().unwrap().len()));
    out
}

/// A quill mount of a fresh mkfs.ext4 image in its own scratch directory: the directory
/// (kept alive by the caller), the image, the mount point and the mount.
fn fresh_quill_mount(name: &str) -> (Scratch, std::path::PathBuf, std::path::PathBuf, QuillMount) {
    let s = Scratch::new(name);
    let image = s.path("quill.img");
    mkfs_ext4(&image, "64M", &[]);
    let dir = s.dir("mnt");
    let m = QuillMount::foreground(&image, &dir, "");
    (s, image, dir, m)
}

/// Runs `check` on a kernel mount and on a quill mount (each of a fresh mkfs.ext4 image, with
/// `kernel_opts` / `quill_opts`) and asserts both give the same; quill's image ends clean.
/// Returns what both gave.
fn same_on_kernel_and_quill<T: PartialEq + std::fmt::Debug>(
    name: &str,
    kernel_opts: &str,
    quill_opts: &str,
    check: impl Fn(&Path) -> T,
) -> T {
    same_on_kernel_and_quill_made_with(name, &[], kernel_opts, quill_opts, check)
}

/// [`same_on_kernel_and_quill`] on images made with `mkfs_args` (`-t ext3`, ...).
fn same_on_kernel_and_quill_made_with<T: PartialEq + std::fmt::Debug>(
    name: &str,
    mkfs_args: &[&str],
    kernel_opts: &str,
    quill_opts: &str,
    check: impl Fn(&Path) -> T,
) -> T {
    let s = Scratch::new(name);
    let (kimage, qimage) = (s.path("kernel.img"), s.path("quill.img"));
    mkfs_ext4(&kimage, "64M", mkfs_args);
    mkfs_ext4(&qimage, "64M", mkfs_args);
    let (kdir, qdir) = (s.dir("kernel"), s.dir("quill"));
    let kernel = {
        let m = LoopMount::read_write(&kimage, &kdir, kernel_opts);
        fs::set_permissions(&m.dir, fs::Permissions::from_mode(0o777)).unwrap();
        check(&m.dir)
    };
    let quill_opts = if quill_opts.is_empty() {
        "allow_other".to_string()
    } else {
        format!("allow_other,{quill_opts}")
    };
    let m = QuillMount::foreground(&qimage, &qdir, &quill_opts);
    fs::set_permissions(&qdir, fs::Permissions::from_mode(0o777)).unwrap();
    let quill = check(&qdir);
    m.unmount();
    assert_clean(&qimage);
    assert_eq!(quill, kernel, "{name}: quill (left) and the kernel's ext4 (right) differ");
    quill
}

/// Every line of `want` is one of `got`'s: what a comparison's files are built to show, so it
/// cannot pass with both sides giving the same wrong answer.
fn assert_has_lines(got: &[String], want: &[&str]) {
    for line in want {
        assert!(got.iter().any(|l| l == line), "{line} not in {got:#?}");
    }
}

fn ready_here(test: &str) -> bool {
    ready(test, &["setpriv", "fallocate", "truncate", "mount"])
}

#[test]
fn set_id_bits_are_dropped_as_the_kernels_ext4_drops_them() {
    let test = "set_id_bits_are_dropped_as_the_kernels_ext4_drops_them";
    if ready_here(test) {
        let got = same_on_kernel_and_quill(test, "", "", set_id_outcomes);
        assert_eq!(got["2666 write by gid 65534"], "true 666", "the case quill once got wrong");
    }
}

/// With quill dropping privileges itself (`killpriv=quill`, the default), chown drops set-id
/// bits and every change to a file's data or owner its capabilities, as on the kernel's ext4.
/// (With `killpriv=kernel` the kernel's FUSE client keeps S_ISGID of a file without group
/// execute that an owner outside its group hands to another group; ext4 drops it.)
#[test]
fn chown_and_file_capabilities_drop_as_on_the_kernels_ext4() {
    let test = "chown_and_file_capabilities_drop_as_on_the_kernels_ext4";
    if !ready(test, &["setpriv", "fallocate", "truncate", "mount", "setfattr", "getfattr"]) {
        return;
    }
    let got = same_on_kernel_and_quill(test, "", "", chown_outcomes);
    assert_eq!(got["4755 root chown"], "true 755", "{got:#?}");
    assert_eq!(got["2745 root chgrp"], "true 2745", "{got:#?}");
    assert_eq!(got["6755 root chown -1 -1"], "true 755", "{got:#?}");
    assert_eq!(got["2745 owner chgrp"], "true 745", "{got:#?}");
    let got = same_on_kernel_and_quill(test, "", "", capability_outcomes);
    assert_has_lines(
        &got,
        &["write: dropped", "truncate: dropped", "chown: dropped", "chmod: kept", "read: kept"],
    );
}

/// Long entry, attribute and negative timeouts (60 s each) show every change at once, as the
/// kernel's ext4 does: creates over absent names, renames, unlinks, chmod and truncate through
/// a descriptor, xattrs through another name, set-user-ID dropped by a write (looked at
/// through a mode-only statx, which the kernel answers from its cache when it can), a
/// directory replaced by a file.
#[test]
fn with_long_timeouts_every_change_is_seen_at_once_as_on_the_kernels_ext4() {
    let test = "with_long_timeouts_every_change_is_seen_at_once_as_on_the_kernels_ext4";
    if !ready(test, &["setpriv", "mount", "setfattr", "getfattr", "stat"]) {
        return;
    }
    let long = "entry_timeout=60,attr_timeout=60,negative_timeout=60";
    let got = same_on_kernel_and_quill(test, "", long, coherence_outcomes);
    assert_has_lines(
        &got,
        &[
            "a: 100644 1 3; mode-only 644; tag",
            "x: absent (NotFound); mode-only ; tag",
            "y: 100640 1 5; mode-only 640; tag t1",
            "suid: 100757 1 101; mode-only 757; tag",
            "sub/inner: 100644 1 8; mode-only 644; tag",
        ],
    );
}

/// Lookups and listings in one directory at once (`parallel_dirops`, FUSE_PARALLEL_DIROPS),
/// racing creates and unlinks from eight threads: every lookup right, every listing whole,
/// the same directory at the end as on the kernel's ext4, the image clean.
#[test]
fn parallel_directory_operations_race_as_on_the_kernels_ext4() {
    let test = "parallel_directory_operations_race_as_on_the_kernels_ext4";
    if !ready(test, &["mount"]) {
        return;
    }
    let got = same_on_kernel_and_quill(test, "", "parallel_dirops", concurrent_directory_outcomes);
    assert_has_lines(
        &got,
        &[
            "thread 0: 0 wrong lookups, every listing whole: true",
            "thread 7: 0 wrong lookups, every listing whole: true",
            "t7-98 100644 4 1",
            "f199 100644 199 1",
        ],
    );
    assert_eq!(got.iter().filter(|l| l.starts_with('t')).count(), 8 + 8 * 50, "{got:#?}");
}

/// READDIRPLUS (`readdirplus=on`): listings, and listings after every kind of change, as on
/// the kernel's ext4; the image clean after.
#[test]
fn listings_with_readdirplus_follow_every_change_as_on_the_kernels_ext4() {
    let test = "listings_with_readdirplus_follow_every_change_as_on_the_kernels_ext4";
    if !ready(test, &["mount"]) {
        return;
    }
    let got = same_on_kernel_and_quill(test, "", "readdirplus=on", readdirplus_outcomes);
    assert_has_lines(
        &got,
        &["d0/f3 100644 7777 1", "d1/moved 100644 400 1", "d2/linked 100644 501 2"],
    );
    assert!(!got.iter().skip_while(|l| *l != "after an unlink:").any(|l| l.starts_with("d2/f6 ")));
}

#[test]
fn access_times_follow_relatime_strictatime_and_noatime_as_the_kernel() {
    let test = "access_times_follow_relatime_strictatime_and_noatime_as_the_kernel";
    if !ready_here(test) {
        return;
    }
    for opts in ["", "strictatime", "noatime", "nodiratime"] {
        let got = same_on_kernel_and_quill(&format!("atime-{opts}"), opts, opts, atime_outcomes);
        let updated: Vec<&str> = got.iter().filter(|(_, &u)| u).map(|(k, _)| k.as_str()).collect();
        // What the steps are built to show, so the comparison cannot pass with nothing
        // updated on both sides.
        let want: &[&str] = match opts {
            "" => &["dir: read after a change", "file: read after a change"],
            "strictatime" => &[
                "dir: read a second later",
                "dir: read after a change",
                "dir: read again",
                "file: read a second later",
                "file: read after a change",
                "file: read again",
            ],
            "noatime" => &[],
            _ => &["file: read after a change"],
        };
        assert_eq!(updated, want, "-o {opts}");
    }
}

/// The kernel's writeback cache (`writeback_cache`): what ext4 keeps, quill keeps, and the
/// image is clean after the unmount.
#[test]
fn the_writeback_cache_keeps_what_the_kernels_ext4_keeps() {
    let test = "the_writeback_cache_keeps_what_the_kernels_ext4_keeps";
    if !ready(test, &["mount"]) {
        return;
    }
    let got = same_on_kernel_and_quill(test, "", "writeback_cache", writeback_outcomes);
    assert_has_lines(
        &got,
        &[
            "shared: 400000 bytes, 400 whole records",
            "shared: 400 distinct records",
            "truncated to 3000: stat 3000",
            "doomed: nlink 0, 10000 bytes 20d201cac726224d, listed false",
            "sized: stat 12345 before fsync",
            "sized: fstat 20010 after a write past the end",
        ],
    );
}

#[test]
fn a_file_replaced_by_rename_stays_usable_through_its_open_descriptor() {
    let test = "a_file_replaced_by_rename_stays_usable_through_its_open_descriptor";
    if ready_here(test) {
        let got = same_on_kernel_and_quill(test, "", "", rename_over_open_outcomes);
        assert_eq!(got[0], "fstat nlink: 0", "{got:?}");
    }
}

#[test]
fn seek_data_and_seek_hole_answer_as_the_kernels_ext4() {
    let test = "seek_data_and_seek_hole_answer_as_the_kernels_ext4";
    if ready_here(test) {
        let got = same_on_kernel_and_quill(test, "", "", seek_outcomes);
        // What the files are built to show, so the comparison cannot pass on a generic
        // lseek (data everywhere) on both sides.
        assert_has_lines(
            &got,
            &[
                "sparse synced: hole from 0 = 4096",
                "sparse cached: data from 4096 = 65536",
                "fallocate 0x1 4096+65536: 0",
                "falloc unwritten: data from 4096 = errno 6",
                "falloc cached in unwritten: data from 4096 = 19456",
                "punched synced: data from 4096 = 20480",
                "hole truncated up: data from 0 = errno 6",
                "empty new: hole from 0 = errno 6",
            ],
        );
    }
}

/// On ext3 (files and directories indirect-mapped): holes and data as SEEK_DATA/SEEK_HOLE
/// find them once written back, fallocate answered as ext4 answers it for such files
/// (EOPNOTSUPP, a punch works), sizes around writeback, a file replaced under an open
/// descriptor: as on the kernel's own mount of the same kind of image. Seeks over data still
/// only in the page cache are left out: the kernel's ext4 reports delayed-allocation blocks
/// of an indirect-mapped file as holes (`ext4_iomap_begin_report` looks for them in extent
/// files only), so SEEK_DATA skips data a read returns; quill finds it, as ext4 does for
/// extent files.
#[test]
fn on_ext3_files_behave_as_on_the_kernel() {
    let test = "on_ext3_files_behave_as_on_the_kernel";
    if !ready_here(test) {
        return;
    }
    let ext3 = ["-t", "ext3"];
    let same = |check: &dyn Fn(&Path) -> Vec<String>| {
        same_on_kernel_and_quill_made_with(test, &ext3, "", "", check)
    };
    let seek = same(&|dir| {
        seek_outcomes(dir).into_iter().filter(|line| !line.contains(" cached")).collect()
    });
    // Preallocation refused, the punch done, and holes found: not a generic lseek.
    let refused_and_punched = ["fallocate 0x1 4096+65536: 95", "fallocate 0x3 4096+16384: 0"];
    assert_has_lines(&seek, &refused_and_punched);
    assert_has_lines(&seek, &["sparse synced: hole from 0 = 4096"]);
    same(&writeback_outcomes);
    same(&rename_over_open_outcomes);
}

/// The same on ext2 (no journal: quill's commits write home, the kernel's ext4 runs in its
/// no-journal mode).
#[test]
fn on_ext2_files_behave_as_on_the_kernel() {
    let test = "on_ext2_files_behave_as_on_the_kernel";
    if !ready_here(test) {
        return;
    }
    let ext2 = ["-t", "ext2"];
    let same = |check: &dyn Fn(&Path) -> Vec<String>| {
        same_on_kernel_and_quill_made_with(test, &ext2, "", "", check)
    };
    let seek = same(&|dir| {
        seek_outcomes(dir).into_iter().filter(|line| !line.contains(" cached")).collect()
    });
    let refused_and_punched = ["fallocate 0x1 4096+65536: 95", "fallocate 0x3 4096+16384: 0"];
    assert_has_lines(&seek, &refused_and_punched);
    same(&writeback_outcomes);
    same(&rename_over_open_outcomes);
}

/// Project ids on `mkfs.ext4 -O project`, with ext4's rules (`project_outcomes`): the kernel
/// here cannot mount such an image (built without CONFIG_QUOTA, "The kernel was not built
/// with CONFIG_QUOTA and CONFIG_QFMT_V2"), so the outcomes are checked against what
/// fs/ext4 does (ext4_new_inode's inheritance, ext4_link's and ext4_rename's EXDEV), and
/// e2fsck against the image.
#[test]
fn project_ids_are_kept_inherited_and_enforced_as_ext4_does() {
    let test = "project_ids_are_kept_inherited_and_enforced_as_ext4_does";
    if !ready(test, &["chattr", "lsattr"]) {
        return;
    }
    let s = Scratch::new("project");
    let image = s.path("quill.img");
    mkfs_ext4(&image, "64M", &["-O", "project"]);
    let mnt = s.dir("mnt");
    let m = QuillMount::foreground(&image, &mnt, "");
    let got = project_outcomes(&mnt);
    m.unmount();
    assert_clean(&image);
    let want = [
        "chattr -p 42 +P: 0 ",
        "link in: 18",
        "rename in: 18",
        "rename out: 0",
        "chattr -p 42: 0 ",
        "rename in after: 0",
    ];
    assert_has_lines(&got, &want);
    // The directory, what is made in it, and what joined later all say project 42; a
    // subdirectory inherits PROJINHERIT, a file does not.
    let lsattr: Vec<&String> = got.iter().filter(|l| l.starts_with("lsattr")).collect();
    assert_eq!(lsattr.len(), 4, "{got:#?}");
    for line in &lsattr {
        assert!(line.contains(": 0 42 "), "{line} ({got:#?})");
    }
    assert!(lsattr[0].ends_with('P') || lsattr[0].contains("P"), "{got:#?}");
    assert!(!lsattr[1].split_whitespace().last().unwrap().contains('P'), "{got:#?}");
    assert!(lsattr[2].split_whitespace().last().unwrap().contains('P'), "{got:#?}");
}

#[test]
fn rename_whiteout_leaves_the_whiteout_the_kernels_ext4_leaves() {
    let test = "rename_whiteout_leaves_the_whiteout_the_kernels_ext4_leaves";
    if ready_here(test) {
        let got = same_on_kernel_and_quill(test, "", "", whiteout_outcomes);
        assert_has_lines(
            &got,
            &[
                "a -> b: ok",
                "a: mode 20000 rdev 0 uid 0 gid 0 nlink 1 size 0",
                "dir1: mode 20000 rdev 0 uid 0 gid 0 nlink 1 size 0",
                "sg/e: mode 20000 rdev 0 uid 0 gid 65534 nlink 1 size 0",
                "g <-> b with whiteout: errno 22",
                "readdir: \"dir1\" character device",
            ],
        );
    }
}

#[test]
fn fallocate_zero_range_leaves_what_the_kernels_ext4_leaves() {
    let test = "fallocate_zero_range_leaves_what_the_kernels_ext4_leaves";
    if ready_here(test) {
        let got = same_on_kernel_and_quill(test, "", "", zero_range_outcomes);
        // ZERO_RANGE answered (not EOPNOTSUPP), and the range reading as zeros.
        for (k, line) in got.iter().enumerate().filter(|(k, _)| k % 2 == 0) {
            assert!(line.ends_with(": ok"), "{line} ({k})");
        }
        assert!(got[1].contains(" nonzero 12000 "), "{}", got[1]);
    }
}

#[test]
fn file_handles_open_as_on_the_kernels_ext4_and_survive_a_remount() {
    let test = "file_handles_open_as_on_the_kernels_ext4_and_survive_a_remount";
    if !ready_here(test) {
        return;
    }
    let got = same_on_kernel_and_quill(test, "", "", file_handle_outcomes);
    assert_has_lines(
        &got,
        &[
            "caches dropped: f: file \"first\"",
            "caches dropped: d: directory of 1 entries",
            "deleted: f: errno 116",
            "deleted: d/g: errno 116",
        ],
    );
    // A handle taken before an unmount opens the file after the next mount.
    let (_s, image, dir, m) = fresh_quill_mount("file-handles-remount");
    fs::write(dir.join("kept"), b"across mounts").unwrap();
    let handle = handle_of(&dir.join("kept"));
    m.unmount();
    let m = QuillMount::foreground(&image, &dir, "");
    assert_eq!(open_handle(&dir, &handle), "file \"across mounts\"");
    m.unmount();
    assert_clean(&image);
}

/// POSIX ACLs step by step: named entries, the mask, chmod against an ACL, removal, a default
/// ACL and what files, directories and fifos created under it get (with the umask ignored
/// there), the kernel's access checks through them for `nobody`, and the xattr's bytes.
const ACL_SCRIPT: &str = r#"
try() { if out=$(eval "$1" 2>&1); then echo "$2: ok"; else echo "$2: ${out##*: }"; fi; }
show() { echo "$1: mode $(stat -c %a "$2") acl $(getfacl -c -n -p "$2" 2>&1 | tr '\n' ' ')"; }
umask 022
echo x > f; show "plain" f
try "setfacl -m u:1000:rw,g:50:r f" "set named entries"; show "named" f
try "setfacl -m m::r f" "set the mask"; show "mask r" f
try "chmod 750 f" "chmod"; show "after chmod" f
try "setfacl -m u::rw,g::r,o::- f" "set base entries only"; show "base only" f
try "setfacl -b f" "remove all"; show "removed" f
mkdir d; try "setfacl -d -m u:1000:rwx,g::rx,o::- d" "set a default"; show "dir" d
echo "default: $(getfacl -c -n -p -d d | tr '\n' ' ')"
touch d/new; mkdir d/sub; mkfifo d/fifo; ln -s new d/link
show "new file" d/new; show "new dir" d/sub; show "new fifo" d/fifo
echo "sub default: $(getfacl -c -n -p -d d/sub | tr '\n' ' ')"
umask 077; touch d/new2; show "umask 077 under a default" d/new2
touch plain077; show "umask 077 without" plain077; umask 022
echo y > f2; try "setfacl -d -m u:1000:r f2" "default on a file"
echo secret > g; chmod 600 g
try "setpriv --reuid 65534 --regid 65534 --clear-groups cat g" "nobody reads 600"
setfacl -m u:65534:r g
try "setpriv --reuid 65534 --regid 65534 --clear-groups cat g" "nobody reads with u:65534:r"
setfacl -m m::- g
try "setpriv --reuid 65534 --regid 65534 --clear-groups cat g" "nobody with the mask empty"
echo open > h; chmod 644 h; setfacl -m u:65534:- h
try "setpriv --reuid 65534 --regid 65534 --clear-groups cat h" "nobody denied by a named entry"
try "setpriv --reuid 65534 --regid 65534 --clear-groups setfacl -m u:65534:rw h" "nobody sets root's ACL"
echo "xattr: $(getfattr -e hex -n system.posix_acl_access h 2>&1 | tr '\n' ' ')"
echo "listed: $(getfattr -d -m - h 2>&1 | grep -c posix_acl)"
"#;

/// Runs [`ACL_SCRIPT`] in `dir`: its lines.
fn acl_outcomes(dir: &Path) -> Vec<String> {
    script_lines(ACL_SCRIPT, dir)
}

/// Runs the bash `script` in `dir`, which must succeed: the lines it prints.
fn script_lines(script: &str, dir: &Path) -> Vec<String> {
    let out = run(Command::new("bash").arg("-c").arg(script).current_dir(dir));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
}

#[test]
fn posix_acls_act_as_on_the_kernels_ext4() {
    let test = "posix_acls_act_as_on_the_kernels_ext4";
    if !ready(test, &["setpriv", "mount", "setfacl", "getfacl", "getfattr"]) {
        return;
    }
    let got = same_on_kernel_and_quill(test, "", "", acl_outcomes);
    assert_has_lines(
        &got,
        &[
            "named: mode 664 acl user::rw- user:1000:rw- group::r-- group:50:r-- mask::rw- \
             other::r--  ",
            "nobody reads with u:65534:r: ok",
            "nobody denied by a named entry: Permission denied",
            "umask 077 without: mode 600 acl user::rw- group::--- other::---  ",
        ],
    );
    // What quill stores, the kernel reads from the image: the same ACLs by getfacl, and
    // e2fsck finds the image clean.
    let s = Scratch::new("acl-on-disk");
    let image = s.path("quill.img");
    mkfs_ext4(&image, "64M", &[]);
    let dir = s.dir("mnt");
    let m = QuillMount::foreground(&image, &dir, "allow_other");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
    acl_outcomes(&dir);
    let listing = |root: &Path| {
        let out = ok(Command::new("getfacl").args(["-R", "-n", "-p", "."]).current_dir(root));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let by_quill = listing(&dir);
    m.unmount();
    assert_clean(&image);
    let k = LoopMount::new(&image, &s.dir("kernel"));
    assert_eq!(listing(&k.dir), by_quill, "getfacl through quill, then through the kernel");
    assert!(by_quill.contains("default:user:1000:rwx"), "{by_quill}");
}

#[test]
fn lsattr_reads_the_flags_the_kernels_ext4_shows() {
    let test = "lsattr_reads_the_flags_the_kernels_ext4_shows";
    if !ready_here(test) {
        return;
    }
    let got = same_on_kernel_and_quill(test, "", "", getflags_outcomes);
    // Extents on every inode; the large directory indexed.
    assert_has_lines(
        &got,
        &["written: flags 0x80000", "small: flags 0x80000", "large: flags 0x81000"],
    );
}

/// What chattr's flags do, step by step, as root and as `nobody`: immutable and append-only
/// files and directories against every change (the errno the shell reports, or "ok"), what
/// lsattr then shows, the flags new inodes take from their directory, `A` against access
/// times, `S` and `D` accepted, and FS_IOC_FSGETXATTR / FS_IOC_FSSETXATTR (xfs_io's lsattr and
/// chattr) on the same flags. Not `j`: the kernel answers it by the caller's CAP_SYS_RESOURCE
/// (which root in a container may lack, EPERM) and then switches the file's journaling, which
/// quill refuses (EOPNOTSUPP; checked on quill alone below).
const CHATTR_SCRIPT: &str = r#"
try() { if out=$(eval "$1" 2>&1); then echo "$2: ok"; else echo "$2: ${out##*: }"; fi; }
for fl in i a; do
  mkdir d$fl; echo data > f$fl; echo x > d$fl/inside; chattr +$fl f$fl d$fl
  try "echo more >> f$fl" "$fl append"
  try "echo more > f$fl" "$fl overwrite with O_TRUNC"
  try "dd if=/dev/zero of=f$fl bs=1 count=1 seek=1 conv=notrunc status=none" "$fl write in place"
  try "truncate -s 100 f$fl" "$fl truncate"
  try "chmod 600 f$fl" "$fl chmod"
  try "chown 1 f$fl" "$fl chown"
  try "touch f$fl" "$fl touch to now"
  try "touch -d 2020-01-01 f$fl" "$fl touch to a date"
  try "ln f$fl link$fl" "$fl link"
  try "mv f$fl moved$fl" "$fl rename"
  try "mv other$fl f$fl" "$fl rename over it"
  try "rm -f f$fl" "$fl unlink"
  try "setfattr -n user.x -v 1 f$fl" "$fl setxattr"
  try "fallocate -l 8192 f$fl" "$fl fallocate"
  try "touch d$fl/new" "$fl create in the directory"
  try "mkdir d$fl/sub" "$fl mkdir in the directory"
  try "ln f0 d$fl/linked" "$fl link into the directory"
  try "rm d$fl/inside" "$fl remove from the directory"
  try "mv d$fl/inside d$fl/renamed" "$fl rename in the directory"
  try "echo y >> d$fl/inside" "$fl write to a file in the directory"
  try "rmdir d$fl" "$fl rmdir"
  try "chattr +d f$fl" "$fl another flag while set"
  try "setpriv --reuid 65534 --regid 65534 --clear-groups chattr -$fl f$fl" "$fl cleared by nobody"
  echo "$fl lsattr: $(lsattr -d f$fl d$fl | tr '
' ' ')"
  chattr -$fl f$fl d$fl
  try "echo after >> f$fl && rm f$fl" "$fl cleared, then write and unlink"
done
echo x > f0
mkdir inherit; chattr +SAdsuct +D inherit
touch inherit/file; mkdir inherit/dir; ln -s file inherit/link; mkfifo inherit/fifo
echo "inherited: $(lsattr -d inherit inherit/file inherit/dir inherit/fifo 2>&1 | tr '
' ' ')"
try "chattr +D f0" "D on a file"
try "chattr +T inherit/dir" "T on a directory"
mkdir open; chmod 777 open
setpriv --reuid 65534 --regid 65534 --clear-groups sh -c 'echo x > open/mine'
try "setpriv --reuid 65534 --regid 65534 --clear-groups chattr +d open/mine" "owner sets d"
try "setpriv --reuid 65534 --regid 65534 --clear-groups chattr +i open/mine" "owner sets i"
try "setpriv --reuid 65534 --regid 65534 --clear-groups chattr +d f0" "nobody sets d on root's"
echo "owner lsattr: $(lsattr open/mine)"
echo old > noatime; chattr +A noatime; touch -a -d '2 hours ago' noatime
before=$(stat -c %X noatime); cat noatime > /dev/null; after=$(stat -c %X noatime)
echo "A: read changed atime: $([ "$before" = "$after" ] && echo no || echo yes)"
echo old > atime; touch -a -d '2 hours ago' atime
before=$(stat -c %X atime); cat atime > /dev/null; after=$(stat -c %X atime)
echo "no A: read changed atime: $([ "$before" = "$after" ] && echo no || echo yes)"
echo s > syncfile; chattr +S syncfile; try "echo more >> syncfile" "S append"
"#;

/// Runs [`CHATTR_SCRIPT`] in `dir`, then FS_IOC_FSGETXATTR / FSSETXATTR by hand: its lines.
fn chattr_outcomes(dir: &Path) -> Vec<String> {
    let mut lines = script_lines(CHATTR_SCRIPT, dir);
    lines.extend(fsxattr_outcomes(dir));
    lines
}

/// `struct fsxattr` through FS_IOC_FSGETXATTR and FS_IOC_FSSETXATTR: the xflags of a file
/// with `i` and `d`, then set to append-only and noatime, then a project id refused.
fn fsxattr_outcomes(dir: &Path) -> Vec<String> {
    use std::os::fd::AsRawFd;
    const FSGETXATTR: libc::c_ulong = 0x801C_581F;
    const FSSETXATTR: libc::c_ulong = 0x401C_5820;
    let path = dir.join("xattrs-of-flags");
    fs::write(&path, b"x").unwrap();
    ok(Command::new("chattr").arg("+id").arg(&path));
    let file = File::open(&path).unwrap();
    let mut fsx = [0u32; 7];
    let get = |fsx: &mut [u32; 7]| -> String {
        // SAFETY: FS_IOC_FSGETXATTR writes one 28-byte struct fsxattr.
        let r = unsafe { libc::ioctl(file.as_raw_fd(), FSGETXATTR, fsx.as_mut_ptr()) };
        if r == 0 {
            format!("xflags {:#x} extsize {} nextents {} projid {}", fsx[0], fsx[1], fsx[2], fsx[3])
        } else {
            format!("errno {}", std::io::Error::last_os_error().raw_os_error().unwrap())
        }
    };
    let set = |fsx: &[u32; 7]| -> String {
        // SAFETY: FS_IOC_FSSETXATTR reads one 28-byte struct fsxattr.
        let r = unsafe { libc::ioctl(file.as_raw_fd(), FSSETXATTR, fsx.as_ptr()) };
        if r == 0 {
            "ok".into()
        } else {
            format!("errno {}", std::io::Error::last_os_error().raw_os_error().unwrap())
        }
    };
    let mut out = vec![format!("fsxattr of i and d: {}", get(&mut fsx))];
    // FS_XFLAG_APPEND | FS_XFLAG_NOATIME.
    fsx[0] = 0x10 | 0x40;
    out.push(format!("fsxattr set a and A: {}", set(&fsx)));
    out.push(format!("fsxattr after: {}", get(&mut fsx)));
    fsx[3] = 7;
    out.push(format!("fsxattr set project 7: {}", set(&fsx)));
    fsx[3] = 0;
    fsx[0] = 0;
    out.push(format!("fsxattr cleared: {} {}", set(&fsx), get(&mut fsx)));
    out
}

#[test]
fn chattr_flags_act_as_on_the_kernels_ext4() {
    let test = "chattr_flags_act_as_on_the_kernels_ext4";
    if !ready(test, &["setpriv", "fallocate", "truncate", "mount", "chattr", "lsattr", "setfattr"])
    {
        return;
    }
    let got = same_on_kernel_and_quill(test, "", "", chattr_outcomes);
    assert_has_lines(
        &got,
        &[
            "i append: Operation not permitted",
            "i unlink: Operation not permitted",
            "i create in the directory: Operation not permitted",
            "a append: ok",
            "a overwrite with O_TRUNC: Operation not permitted",
            "a touch to now: ok",
            "a create in the directory: ok",
            "a remove from the directory: Operation not permitted",
            "i cleared by nobody: Operation not permitted while setting flags on fi",
            "A: read changed atime: no",
            "no A: read changed atime: yes",
            "owner sets d: ok",
            "fsxattr of i and d: xflags 0x88 extsize 0 nextents 0 projid 0",
        ],
    );
    // On quill's image the flags are i_flags as ext4 keeps them: e2fsck passed it (above), and
    // debugfs reads them.
    let (_s, image, dir, m) = fresh_quill_mount("chattr-on-disk");
    fs::write(dir.join("f"), b"kept").unwrap();
    // lsattr -v: the inode's generation (FS_IOC_GETVERSION), checked against debugfs below.
    let out = ok(Command::new("lsattr").arg("-v").arg(dir.join("f")));
    let listed = String::from_utf8_lossy(&out.stdout).into_owned();
    let generation = listed.split_whitespace().next().unwrap_or_default().to_string();
    ok(Command::new("chattr").arg("+ia").arg(dir.join("f")));
    fs::write(dir.join("g"), b"journaled?").unwrap();
    let out = run(Command::new("chattr").arg("+j").arg(dir.join("g")));
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success() && said.contains("Operation not supported"), "{said}");
    m.unmount();
    assert_clean(&image);
    let out = run(Command::new("debugfs").arg("-R").arg("stat /f").arg(&image));
    let stat = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(stat.contains("Flags: 0x80030"), "{stat}");
    assert!(stat.contains(&format!("Generation: {generation} ")), "lsattr -v {listed}: {stat}");
}
