//! Mount options in ext4's style, as `mount -o` and /etc/fstab write them: a comma-separated
//! list, later options overriding earlier ones, except that `preset=` is applied before the
//! individual technique settings wherever it appears (`committing_max=3,preset=cjfs` is cjfs
//! with committing_max 3).
//!
//! | option | effect |
//! |---|---|
//! | `ro`, `rw` | read-only / read-write (default) |
//! | `norecovery` (or `noload`) | with `ro`: do not replay the journal (a `ro` mount otherwise replays it in memory) |
//! | `data=ordered\|journal\|writeback` | [`fs::DataMode`] |
//! | `commit=SECONDS` | journal commit interval (0 = the default, 5 s, as ext4) |
//! | `errors=remount-ro\|continue` | what a file-system error does ([`fs::ErrorPolicy`]) |
//! | `allow_other` | let every user use the mount (permissions are still checked) |
//! | `preset=classic\|dual\|cjfs\|fast18-io\|fast18\|all` | journal preset ([`journal::JournalConfig::preset`]) |
//! | `committing_max=N`, `flush_batch_max=N`, `versions_max=N`, `coalescing=0\|1`, `recovery_threads=N`, `lists=locked\|lockfree`, `commit_io=thread\|cooperative`, `checkpoint_io=mutex\|cooperative` | one journal technique setting ([`journal::JournalConfig::set`]) |
//! | `threads=N` | FUSE worker threads |
//! | `readdirplus=auto\|on\|off` | directory listings carry each entry's attributes (FUSE READDIRPLUS): where the kernel judges it pays, always, never (default) |
//! | `writeback_cache`, `nowriteback_cache` | the kernel's FUSE writeback cache (default off): writes are cached by the kernel and reach quill at writeback, fsync and close |
//! | `entry_timeout=S`, `attr_timeout=S`, `negative_timeout=S` | how long the kernel caches names, attributes and absent names, in seconds (defaults 1, 1 and 1: [`crate::Timeouts`]) |
//! | `read_ahead_kb=N` | the mount's readahead window in KiB (default [`crate::read_ahead::DEFAULT_READ_AHEAD_KB`]; 0: the kernel's 128), set through sysfs once mounted (root only) |
//! | `parallel_dirops` (default), `noparallel_dirops` | lookups and listings in one directory run at once (FUSE_PARALLEL_DIROPS), or one at a time |
//! | `killpriv=quill\|kernel` | who drops set-id bits and file capabilities on write, truncate and chown: quill (default, FUSE_HANDLE_KILLPRIV_V2: no GETXATTR round trip before each write) or the kernel's FUSE client |
//! | `fsync_inline=N` | the most fsyncs that wait for the journal on request threads; later ones wait on waiter threads (default: all request threads but one) |
//! | `io=buffered\|direct\|auto` | how the image file is opened ([`blockdev::file::IoMode`]): `buffered` (default, measured faster) goes through the host page cache; `direct` bypasses it with O_DIRECT; `auto` is direct where the file system allows it |
//! | `relatime` (default), `strictatime`, `noatime` (`atime`: back to relatime), `nodiratime` | when reads update access times ([`fs::AtimeMode`]) |
//! | `log=PATH` | the mount's log file (instead of syslog, or of the default file where there is no syslog) |
//! | `nosuid`, `nodev`, `noexec`, `sync`, `dirsync` (and `suid`, `dev`, `exec`, `async`) | generic mount flags, passed to the kernel |
//! | `defaults`, `auto`, `noauto`, `nofail`, `_netdev`, `norelatime`, `x-*`, `comment=*` | accepted for /etc/fstab, no effect |

use std::path::PathBuf;
use std::time::Duration;

use fuser::MountOption;

use crate::MountConfig;

/// `errors=` values quill implements (ext4 also has `panic`, which a userspace file system
/// has no business imitating).
const ERRORS_POLICIES: &[(&str, fs::ErrorPolicy)] =
    &[("remount-ro", fs::ErrorPolicy::RemountReadOnly), ("continue", fs::ErrorPolicy::Continue)];

/// Everything `-o OPTIONS` says.
#[derive(Debug, Clone, Default)]
pub struct MountSpec {
    /// The file system's options (read-only, data mode, journal settings).
    pub fs: fs::MountOptions,
    /// The FUSE side (threads, allow_other, read-only, VFS flags); `fsname` is left for the
    /// caller to fill in with the image path.
    pub fuse: MountConfig,
    /// `io=`: how the image file is opened.
    pub io: blockdev::file::IoMode,
    /// `log=PATH`: where the mount process logs (its caller decides the default).
    pub log_file: Option<PathBuf>,
    /// Options accepted without effect (sloppy mode's unknown ones among them), for `-v`.
    pub ignored: Vec<String>,
}

/// Parses `-o` option lists (each may itself be comma-separated; later ones win). With
/// `sloppy` (mount(8)'s `-s`), unknown options are ignored instead of refused; a known option
/// with a bad value is an error either way. Errors are one line naming the option.
/// The most FUSE request threads a mount takes.
pub const THREADS_MAX: usize = 256;

/// The FUSE settings that take a value, as `-o` and `quill bench`'s quill-fuse targets write
/// them alike ([`set_fuse_setting`]).
pub const FUSE_SETTINGS: &[&str] = &[
    "threads",
    "fsync_inline",
    "killpriv",
    "readdirplus",
    "read_ahead_kb",
    "entry_timeout",
    "attr_timeout",
    "negative_timeout",
];

/// Sets the [`FUSE_SETTINGS`] entry `key` to `value` in `config`; an error names the option.
pub fn set_fuse_setting(config: &mut MountConfig, key: &str, value: &str) -> Result<(), String> {
    match key {
        "threads" => config.threads = parse_threads(value)?,
        "fsync_inline" => config.fsync_inline = Some(parse_fsync_inline(value)?),
        "killpriv" => config.killpriv_in_kernel = parse_killpriv(value)?,
        "readdirplus" => config.readdirplus = parse_readdirplus(value)?,
        "read_ahead_kb" => config.read_ahead_kb = parse_read_ahead_kb(value)?,
        _ => set_timeout(&mut config.timeouts, key, value)?,
    }
    Ok(())
}

/// `fsync_inline=N`: fsyncs waiting on request threads, 0 (every fsync on a waiter thread) to
/// [`THREADS_MAX`] (at or past `threads`: every fsync on its request thread).
fn parse_fsync_inline(value: &str) -> Result<usize, String> {
    number_in("fsync_inline", value, 0, THREADS_MAX)
}

/// `key=value` as a whole number from `min` to `max`; the error names the option and range.
fn number_in<N>(key: &str, value: &str, min: N, max: N) -> Result<N, String>
where
    N: std::str::FromStr + PartialOrd + std::fmt::Display + Copy,
{
    value
        .parse()
        .ok()
        .filter(|n| (min..=max).contains(n))
        .ok_or_else(|| format!("{key}={value}: expected {min} to {max}"))
}

/// `killpriv=quill|kernel`: whether the kernel's FUSE client drops privileges (`kernel`).
fn parse_killpriv(value: &str) -> Result<bool, String> {
    match value {
        "quill" => Ok(false),
        "kernel" => Ok(true),
        other => Err(format!("killpriv={other}: expected quill or kernel")),
    }
}

/// The longest `entry_timeout=`, `attr_timeout=` and `negative_timeout=`, in seconds.
pub const TIMEOUT_MAX_SECS: f64 = 86_400.0;

/// `entry_timeout=S`, `attr_timeout=S`, `negative_timeout=S`: seconds, fractions allowed, 0
/// to [`TIMEOUT_MAX_SECS`].
fn parse_timeout(key: &str, value: &str) -> Result<Duration, String> {
    value
        .parse::<f64>()
        .ok()
        .filter(|s| (0.0..=TIMEOUT_MAX_SECS).contains(s))
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("{key}={value}: expected seconds from 0 to {TIMEOUT_MAX_SECS}"))
}

/// Sets the timeout `key` names in `timeouts` (`entry_timeout`, `attr_timeout` or
/// `negative_timeout`).
fn set_timeout(timeouts: &mut crate::Timeouts, key: &str, value: &str) -> Result<(), String> {
    let slot = match key {
        "entry_timeout" => &mut timeouts.entry,
        "attr_timeout" => &mut timeouts.attr,
        "negative_timeout" => &mut timeouts.negative,
        _ => return Err(format!("{key}: not a timeout")),
    };
    *slot = parse_timeout(key, value)?;
    Ok(())
}

/// `read_ahead_kb=N`: the mount's readahead window, 0 (the kernel's) to
/// [`crate::read_ahead::READ_AHEAD_KB_MAX`].
fn parse_read_ahead_kb(value: &str) -> Result<u32, String> {
    number_in("read_ahead_kb", value, 0, crate::read_ahead::READ_AHEAD_KB_MAX)
}

/// `readdirplus=auto|on|off`.
fn parse_readdirplus(value: &str) -> Result<crate::Readdirplus, String> {
    match value {
        "auto" => Ok(crate::Readdirplus::Auto),
        "on" => Ok(crate::Readdirplus::On),
        "off" => Ok(crate::Readdirplus::Off),
        other => Err(format!("readdirplus={other}: expected auto, on or off")),
    }
}

/// `threads=N`: FUSE request threads, 1 to [`THREADS_MAX`].
fn parse_threads(value: &str) -> Result<usize, String> {
    number_in("threads", value, 1, THREADS_MAX)
}

pub fn parse<S: AsRef<str>>(lists: &[S], sloppy: bool) -> Result<MountSpec, String> {
    let mut spec = MountSpec::default();
    let mut preset: Option<journal::JournalConfig> = None;
    // Technique settings, applied on top of the preset once all options are read.
    let mut settings: Vec<(String, String)> = Vec::new();
    let mut commit: Option<Duration> = None;
    for option in lists.iter().flat_map(|l| l.as_ref().split(',')).filter(|o| !o.is_empty()) {
        let (key, value) = match option.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (option, None),
        };
        match key {
            "ro" | "rw" => {
                no_value(key, value)?;
                spec.fs.read_only = key == "ro";
                spec.fuse.read_only = key == "ro";
            }
            "relatime" | "strictatime" | "noatime" | "atime" => {
                no_value(key, value)?;
                spec.fs.atime = fs::AtimeMode::from_mount_option(key).expect("an atime option");
                // The kernel shows noatime among the mount's options too.
                spec.fuse.vfs_flags.retain(|f| f != &MountOption::NoAtime);
                if key == "noatime" {
                    spec.fuse.vfs_flags.push(MountOption::NoAtime);
                }
            }
            "nodiratime" | "diratime" => {
                no_value(key, value)?;
                spec.fs.no_dir_atime = key == "nodiratime";
            }
            "acl" | "noacl" => {
                no_value(key, value)?;
                spec.fs.acl = key == "acl";
            }
            "norecovery" | "noload" => {
                no_value(key, value)?;
                spec.fs.no_recovery = true;
            }
            "data" => {
                spec.fs.data = match need(key, value)? {
                    "ordered" => fs::DataMode::Ordered,
                    "journal" => fs::DataMode::Journal,
                    "writeback" => fs::DataMode::Writeback,
                    other => {
                        return Err(format!(
                            "data={other}: expected data=ordered, data=journal or data=writeback"
                        ))
                    }
                }
            }
            "commit" => {
                let secs: u64 = number(key, need(key, value)?)?;
                if secs > 86_400 {
                    return Err(format!("commit={secs}: at most 86400 seconds"));
                }
                // ext4: commit=0 means the default interval.
                commit = Some(if secs == 0 {
                    journal::JournalConfig::classic().commit_interval
                } else {
                    Duration::from_secs(secs)
                });
            }
            "errors" => {
                let v = need(key, value)?;
                spec.fs.errors = ERRORS_POLICIES
                    .iter()
                    .find(|(name, _)| *name == v)
                    .map(|(_, policy)| *policy)
                    .ok_or_else(|| {
                        let known: Vec<_> = ERRORS_POLICIES.iter().map(|(n, _)| *n).collect();
                        format!(
                            "errors={v} is not supported (quill supports errors={})",
                            known.join(", errors=")
                        )
                    })?;
            }
            "io" => spec.io = need(key, value)?.parse()?,
            "allow_other" => {
                no_value(key, value)?;
                spec.fuse.allow_other = true;
            }
            "preset" => {
                let v = need(key, value)?;
                preset = Some(journal::JournalConfig::preset(v).ok_or_else(|| {
                    format!("preset={v}: expected one of {}", journal::config::PRESETS.join(", "))
                })?);
            }
            "committing_max" | "flush_batch_max" | "versions_max" | "recovery_threads"
            | "coalescing" | "lists" | "commit_io" | "checkpoint_io" | "commit_record"
            | "fsync_journal" | "fc_areas" => {
                // Checked by JournalConfig::set once the preset is known.
                let value = need(key, value)?.to_string();
                settings.retain(|(k, _)| k != key);
                settings.push((key.to_string(), value));
            }
            key if FUSE_SETTINGS.contains(&key) => {
                set_fuse_setting(&mut spec.fuse, key, need(key, value)?)?;
            }
            "writeback_cache" | "nowriteback_cache" => {
                no_value(key, value)?;
                spec.fuse.writeback_cache = key == "writeback_cache";
            }
            "parallel_dirops" | "noparallel_dirops" => {
                no_value(key, value)?;
                spec.fuse.parallel_dirops = key == "parallel_dirops";
            }
            "log" => {
                // A comma ends the option, so a path with one cannot be given here.
                spec.log_file = Some(PathBuf::from(need(key, value.filter(|v| !v.is_empty()))?));
            }
            _ => {
                if let Some(flag) = vfs_flag(option) {
                    spec.fuse.vfs_flags.retain(|f| f != &flag);
                    spec.fuse.vfs_flags.push(flag);
                } else if is_fstab_word(option) || sloppy {
                    spec.ignored.push(option.to_string());
                } else {
                    return Err(format!("unknown mount option {option:?}"));
                }
            }
        }
    }
    let mut journal = preset.unwrap_or_else(|| spec.fs.journal.clone());
    for (key, value) in &settings {
        journal.set(key, value)?;
    }
    if let Some(interval) = commit {
        journal.commit_interval = interval;
    }
    journal.validate().map_err(|e| format!("journal settings: {e}"))?;
    spec.fs.journal = journal;
    if spec.fs.no_recovery && !spec.fs.read_only {
        // As ext4: a journal left unreplayed must not be written over.
        return Err("norecovery needs ro (a read-write mount must replay the journal)".into());
    }
    Ok(spec)
}

fn need<'a>(key: &str, value: Option<&'a str>) -> Result<&'a str, String> {
    value.ok_or_else(|| format!("option {key} needs a value ({key}=...)"))
}

fn no_value(key: &str, value: Option<&str>) -> Result<(), String> {
    match value {
        None => Ok(()),
        Some(v) => Err(format!("option {key} takes no value (got {key}={v})")),
    }
}

fn number<T: std::str::FromStr>(key: &str, value: &str) -> Result<T, String> {
    value.parse().map_err(|_| format!("{key}={value}: expected a non-negative integer"))
}

/// Generic mount flags the kernel applies to the FUSE mount itself.
fn vfs_flag(option: &str) -> Option<MountOption> {
    Some(match option {
        "nosuid" => MountOption::NoSuid,
        "suid" => MountOption::Suid,
        "nodev" => MountOption::NoDev,
        "dev" => MountOption::Dev,
        "noexec" => MountOption::NoExec,
        "exec" => MountOption::Exec,
        "sync" => MountOption::Sync,
        "async" => MountOption::Async,
        "dirsync" => MountOption::DirSync,
        _ => return None,
    })
}

/// Words /etc/fstab and mount(8) may hand a mount helper that change nothing here
/// (`norelatime` leaves the default, relatime, as the kernel does without strictatime).
fn is_fstab_word(option: &str) -> bool {
    matches!(
        option,
        "defaults"
            | "auto"
            | "noauto"
            | "nofail"
            | "_netdev"
            | "norelatime"
            | "lazytime"
            | "nolazytime"
    ) || option.starts_with("x-")
        || option.starts_with("comment=")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_ext4s() {
        let spec = parse::<&str>(&[], false).unwrap();
        assert!(!spec.fs.read_only && !spec.fuse.read_only);
        assert_eq!(spec.fs.data, fs::DataMode::Ordered);
        assert_eq!(spec.fs.journal, journal::JournalConfig::classic());
        assert_eq!(spec.fs.errors, fs::ErrorPolicy::RemountReadOnly);
        let spec = parse(&["errors=continue"], false).unwrap();
        assert_eq!(spec.fs.errors, fs::ErrorPolicy::Continue);
        assert!(!spec.fuse.allow_other);
    }

    #[test]
    fn every_option_reaches_its_setting() {
        let spec = parse(
            &[
                "ro,data=journal,commit=7",
                "errors=remount-ro,allow_other,threads=3,fsync_inline=0,nosuid,x-systemd.automount",
                "log=/var/log/q.log",
            ],
            false,
        )
        .unwrap();
        assert!(spec.fs.read_only && spec.fuse.read_only);
        assert_eq!(spec.fs.data, fs::DataMode::Journal);
        assert_eq!(spec.fs.journal.commit_interval, Duration::from_secs(7));
        assert!(spec.fuse.allow_other);
        assert_eq!(spec.fuse.threads, 3);
        assert_eq!(spec.fuse.fsync_inline, Some(0));
        assert_eq!(spec.fuse.vfs_flags, vec![MountOption::NoSuid]);
        assert_eq!(spec.ignored, vec!["x-systemd.automount".to_string()]);
        assert_eq!(spec.log_file, Some(PathBuf::from("/var/log/q.log")));
        // Later wins.
        assert!(!parse(&["ro,rw"], false).unwrap().fs.read_only);
        assert_eq!(parse(&["data=writeback"], false).unwrap().fs.data, fs::DataMode::Writeback);
    }

    #[test]
    fn timeouts_and_parallel_dirops_reach_the_fuse_config() {
        let spec = parse::<&str>(&[], false).unwrap();
        assert_eq!(spec.fuse.timeouts, crate::Timeouts::default());
        assert_eq!(spec.fuse.parallel_dirops, crate::DEFAULT_PARALLEL_DIROPS);
        let spec = parse(
            &["entry_timeout=60,attr_timeout=0.5,negative_timeout=2", "parallel_dirops"],
            false,
        )
        .unwrap();
        assert_eq!(spec.fuse.timeouts.entry, Duration::from_secs(60));
        assert_eq!(spec.fuse.timeouts.attr, Duration::from_millis(500));
        assert_eq!(spec.fuse.timeouts.negative, Duration::from_secs(2));
        assert!(spec.fuse.parallel_dirops);
        assert!(
            !parse(&["parallel_dirops,noparallel_dirops"], false).unwrap().fuse.parallel_dirops
        );
        for bad in ["attr_timeout=-1", "entry_timeout=1e9", "negative_timeout=soon"] {
            let err = parse(&[bad], false).unwrap_err();
            assert!(err.contains(bad), "{bad}: {err}");
        }
        assert!(parse(&["parallel_dirops=1"], false).is_err());
        assert_eq!(spec.fuse.read_ahead_kb, crate::read_ahead::DEFAULT_READ_AHEAD_KB);
        assert_eq!(parse(&["read_ahead_kb=0"], false).unwrap().fuse.read_ahead_kb, 0);
        let err = parse(&["read_ahead_kb=2000000"], false).unwrap_err();
        assert!(err.contains("read_ahead_kb=2000000"), "{err}");
    }

    #[test]
    fn atime_options_choose_the_access_time_mode() {
        assert_eq!(parse::<&str>(&[], false).unwrap().fs.atime, fs::AtimeMode::Relative);
        assert_eq!(parse(&["strictatime"], false).unwrap().fs.atime, fs::AtimeMode::Strict);
        let spec = parse(&["noatime,nodiratime"], false).unwrap();
        assert_eq!(spec.fs.atime, fs::AtimeMode::Never);
        assert!(spec.fs.no_dir_atime);
        assert_eq!(spec.fuse.vfs_flags, vec![MountOption::NoAtime]);
        let spec = parse(&["noatime,atime"], false).unwrap();
        assert_eq!(spec.fs.atime, fs::AtimeMode::Relative);
        assert!(spec.fuse.vfs_flags.is_empty());
    }

    #[test]
    fn norecovery_is_for_read_only_mounts() {
        assert!(parse(&["ro,norecovery"], false).unwrap().fs.no_recovery);
        assert!(parse(&["noload,ro"], false).unwrap().fs.no_recovery);
        let err = parse(&["norecovery"], false).unwrap_err();
        assert!(err.contains("norecovery needs ro"), "{err}");
        assert!(parse(&["norecovery=1,ro"], false).is_err());
    }

    #[test]
    fn io_option_chooses_how_the_image_is_opened() {
        use blockdev::file::IoMode;
        assert_eq!(parse(&["rw"], false).unwrap().io, IoMode::Buffered);
        assert_eq!(parse(&["io=buffered"], false).unwrap().io, IoMode::Buffered);
        assert_eq!(parse(&["io=buffered,io=direct"], false).unwrap().io, IoMode::Direct);
        let err = parse(&["io=cached"], false).unwrap_err();
        assert!(err.contains("io=cached"), "{err}");
        assert!(parse(&["io"], false).is_err());
    }

    #[test]
    fn settings_apply_on_top_of_the_preset_in_any_order() {
        let spec = parse(&["committing_max=3,coalescing=0,preset=cjfs,commit=0"], false).unwrap();
        let cjfs = journal::JournalConfig::cjfs();
        assert_eq!(spec.fs.journal.committing_max, 3);
        assert!(!spec.fs.journal.coalescing);
        assert_eq!(spec.fs.journal.versions_max, cjfs.versions_max);
        assert_eq!(spec.fs.journal.commit_interval, cjfs.commit_interval);
        let spec = parse(&["flush_batch_max=4,versions_max=2,recovery_threads=3"], false).unwrap();
        assert_eq!((spec.fs.journal.flush_batch_max, spec.fs.journal.versions_max), (4, 2));
        assert_eq!(spec.fs.journal.recovery_threads, 3);
        let spec = parse(&["preset=dual,commit_record=chained"], false).unwrap();
        assert_eq!(spec.fs.journal.commit_record, journal::config::CommitRecord::Chained);
    }

    #[test]
    fn bad_options_are_one_line_errors_naming_them() {
        for (opts, needle) in [
            ("data=fast", "data=fast"),
            ("errors=panic", "errors=panic"),
            ("preset=turbo", "preset=turbo"),
            ("commit=soon", "commit=soon"),
            ("threads=0", "threads=0"),
            ("fsync_inline=x", "fsync_inline=x"),
            ("committing_max=0", "committing_max"),
            ("coalescing=2", "coalescing=2"),
            ("commit_record=fast", "commit_record=fast"),
            ("commit_record=chained", "committing_max"),
            ("ro=1", "takes no value"),
            ("data", "needs a value"),
            ("log=", "needs a value"),
            ("bogus", "unknown mount option \"bogus\""),
        ] {
            let err = parse(&[opts], false).unwrap_err();
            assert!(err.contains(needle), "{opts}: {err}");
            assert!(!err.contains('\n'), "{opts}: {err}");
        }
    }

    #[test]
    fn sloppy_ignores_unknown_options_but_not_bad_values() {
        let spec = parse(&["bogus,rw"], true).unwrap();
        assert_eq!(spec.ignored, vec!["bogus".to_string()]);
        assert!(parse(&["data=fast"], true).is_err());
    }
}
