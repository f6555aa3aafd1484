//! The mount process's log: the one place that decides where `quill mount`'s messages go and
//! what a line looks like. quill-fuse and fuser write through the `log` facade; this module is
//! its logger, and its panic hook writes a panic's message and backtrace to the same place.
//!
//! Where lines go (a daemon's stderr is /dev/null once it detaches, so it never counts):
//!
//! | mount | `-o log=PATH` | a syslog daemon on /dev/log | lines go to |
//! |---|---|---|---|
//! | `-f` | no | any | stderr |
//! | `-f` | yes | any | PATH, and warnings and errors to stderr too |
//! | daemon | yes | any | PATH |
//! | daemon | no | yes | syslog (facility daemon, ident `quill`, with the pid) |
//! | daemon | no | no | the default file, which `quill mount` prints before it returns |
//!
//! The default file is `/var/log/quill/NAME.log` for root and `$XDG_STATE_HOME/quill/NAME.log`
//! (`~/.local/state/quill`) for other users, NAME being the image's file name. Not beside the
//! image: its directory may not be writable or not be the user's (`/dev` for a block device),
//! and a log there would travel with copies of the image. Not `$XDG_RUNTIME_DIR`: it is a tmpfs,
//! and the log of a failure before a reboot is the one wanted after it. /var/log is where an
//! operator looks for a daemon's log, and XDG_STATE_HOME is the XDG place for a user's logs.
//! A log that cannot be opened fails the mount (naming the path and `-o log=`): a daemon
//! whose errors would vanish is what this module exists to prevent.
//!
//! A file line is `2026-11-25T13:16:00.123Z ERROR quill[1234]: message` (UTC); a message of
//! several lines (a backtrace) gives several such lines, so `grep` finds each with its time.
//! The file is opened for appending: lines from the processes mounting other images with the
//! same name interleave whole, told apart by their pid. Info lines (mounted, unmounted) go to
//! files and syslog; stderr gets warnings and errors only, so a clean `-f` mount prints nothing.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use log::{Level, LevelFilter, Log, Metadata, Record};

use crate::dump::civil_from_days;

/// The syslog socket: present and listening where a syslog daemon (or journald) runs.
const SYSLOG_SOCKET: &str = "/dev/log";

/// Where the log lines of this mount go.
pub struct MountLog {
    primary: Sink,
    /// Also write warnings and errors to stderr (`-f` with `log=PATH`).
    echo_stderr: bool,
    /// The default file was chosen (no syslog, no `log=`): its path is printed for the user.
    default_path: Option<PathBuf>,
}

enum Sink {
    Stderr,
    Syslog,
    File(File),
}

impl MountLog {
    /// Chooses the destination as the module's table says and opens it. `log_option` is
    /// `-o log=PATH`; `image` names the default file.
    pub fn open(
        log_option: Option<&Path>,
        foreground: bool,
        image: &Path,
    ) -> Result<MountLog, String> {
        if let Some(path) = log_option {
            let file = open_log_file(path)?;
            return Ok(MountLog {
                primary: Sink::File(file),
                echo_stderr: foreground,
                default_path: None,
            });
        }
        if foreground {
            return Ok(MountLog { primary: Sink::Stderr, echo_stderr: false, default_path: None });
        }
        if syslog_listening() {
            return Ok(MountLog { primary: Sink::Syslog, echo_stderr: false, default_path: None });
        }
        let path = default_log_path(image)?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| {
                format!(
                    "no syslog ({SYSLOG_SOCKET}) and cannot create {} for the log: {}; \
                     choose a file with -o log=PATH",
                    dir.display(),
                    crate::mount_cmd::io_reason(&e)
                )
            })?;
        }
        let file = open_log_file(&path)?;
        Ok(MountLog { primary: Sink::File(file), echo_stderr: false, default_path: Some(path) })
    }

    /// The line `quill mount` prints before it returns when the daemon logs to the default
    /// file (the user chose nothing and there is no syslog to look in).
    pub fn note(&self) -> Option<String> {
        self.default_path.as_ref().map(|path| {
            format!(
                "no syslog here ({SYSLOG_SOCKET} is missing): the mount logs to {}",
                path.display()
            )
        })
    }

    /// Makes this the process's logger and panic hook. Called once, before the fork (which
    /// carries both into the daemon).
    pub fn install(self) {
        if let Sink::Syslog = self.primary {
            // SAFETY: a static NUL-terminated ident; syslog connects on first use.
            unsafe { libc::openlog(c"quill".as_ptr(), libc::LOG_PID, libc::LOG_DAEMON) };
        }
        // Installed once per process and kept until it exits.
        let logger: &'static Logger = Box::leak(Box::new(Logger { log: self }));
        if log::set_logger(logger).is_ok() {
            log::set_max_level(LevelFilter::Info);
        }
        std::panic::set_hook(Box::new(log_panic));
    }
}

/// The facade's logger.
struct Logger {
    log: MountLog,
}

/// A line's start: time, level, and the pid read at each line (the daemon is a fork of the
/// process that installed the logger).
fn line_prefix(level: Level) -> String {
    let pid = std::process::id();
    format!("{} {:<5} quill[{pid}]: ", utc_timestamp(SystemTime::now()), level)
}

impl Log for Logger {
    fn enabled(&self, metadata: &Metadata) -> bool {
        // quill's own info lines; only warnings and errors from libraries (fuser's info and
        // debug lines are about its protocol, not about the mount).
        let ours = metadata.target().starts_with("quill");
        metadata.level() <= if ours { Level::Info } else { Level::Warn }
    }

    fn log(&self, record: &Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let level = record.level();
        let message = record.args().to_string();
        if is_fuser_noise(record.target(), &message) {
            return;
        }
        let to_stderr = match &self.log.primary {
            Sink::Stderr => true,
            Sink::Syslog => {
                syslog_lines(level, &message);
                self.log.echo_stderr
            }
            Sink::File(file) => {
                let prefix = line_prefix(level);
                // One write per message: O_APPEND keeps it whole among other writers.
                let _ = (&*file).write_all(prefixed(&prefix, &message).as_bytes());
                self.log.echo_stderr
            }
        };
        if to_stderr && level <= Level::Warn {
            let _ = std::io::stderr().write_all(prefixed(&line_prefix(level), &message).as_bytes());
        }
    }

    fn flush(&self) {}
}

/// fuser's warnings that are no news, kept out of the log so that a warning stays worth
/// reading (and a clean `-f` mount prints nothing):
/// - `[Not Implemented] OP(...)`: a request quill leaves to fuser's default (copy_file_range,
///   lseek, ioctl, …), answered ENOSYS, after which the kernel falls back on its own;
/// - `Failed to umount filesystem: Invalid argument`: fuser's session, when it ends, unmounts
///   the mount point again (it cannot tell that `umount`, or quill's signal thread, already
///   did, which is what ended the session), and nothing is mounted there any more;
/// - `Failed to send FUSE reply: No such file or directory`: the kernel no longer waits for
///   that request. An unmount aborts the connection without waiting for the background
///   requests still being served (a RELEASE freeing an unlinked file, say): the work is done,
///   only its answer has no one to go to, and the session ends (and `destroy` syncs) after
///   every worker returns. The kernel also ends a request whose caller was killed; nobody is
///   left to read that answer either. Any other reply error (EINVAL: a malformed reply) stays.
fn is_fuser_noise(target: &str, message: &str) -> bool {
    target.starts_with("fuser")
        && (message.starts_with("[Not Implemented]")
            || (message.starts_with("Failed to umount filesystem")
                && message.contains("Invalid argument"))
            || (message.starts_with("Failed to send FUSE reply")
                && message.contains("No such file or directory")))
}

/// Every line of `message` after `prefix`, each ended by a newline.
fn prefixed(prefix: &str, message: &str) -> String {
    let mut out = String::with_capacity(message.len() + prefix.len() + 1);
    for line in message.lines() {
        out.push_str(prefix);
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Sends each line of `message` to syslog (a newline inside one syslog message shows as
/// `#012` in most daemons).
fn syslog_lines(level: Level, message: &str) {
    let priority = match level {
        Level::Error => libc::LOG_ERR,
        Level::Warn => libc::LOG_WARNING,
        Level::Info => libc::LOG_INFO,
        Level::Debug | Level::Trace => libc::LOG_DEBUG,
    };
    for line in message.lines() {
        if let Ok(line) = CString::new(line) {
            // SAFETY: a constant format and a NUL-terminated argument.
            unsafe { libc::syslog(priority, c"%s".as_ptr(), line.as_ptr()) };
        }
    }
}

/// The panic hook: the panic's thread, place, message and backtrace, as one error. It runs in
/// the panicking thread before it unwinds, the only place the backtrace can be taken.
fn log_panic(info: &std::panic::PanicHookInfo<'_>) {
    let thread = std::thread::current();
    let name = thread.name().unwrap_or("unnamed");
    let message = journal::panic_message(info.payload()).unwrap_or("a panic without a message");
    let place = info.location().map(|l| l.to_string()).unwrap_or_else(|| "unknown place".into());
    let backtrace = std::backtrace::Backtrace::force_capture();
    log::error!("panic in thread '{name}' at {place}: {message}\nbacktrace:\n{backtrace}");
}

/// Whether a syslog daemon listens on /dev/log (a stale socket file with nobody behind it
/// counts as none: glibc's syslog would drop every line).
fn syslog_listening() -> bool {
    let datagram = UnixDatagram::unbound().and_then(|s| s.connect(SYSLOG_SOCKET)).is_ok();
    datagram || UnixStream::connect(SYSLOG_SOCKET).is_ok()
}

/// The default log file for `image` (see the module docs).
fn default_log_path(image: &Path) -> Result<PathBuf, String> {
    let name = image
        .file_name()
        .ok_or_else(|| format!("{} has no file name to name its log after", image.display()))?;
    let mut file = name.to_os_string();
    file.push(".log");
    // SAFETY: geteuid has no preconditions.
    let dir = if unsafe { libc::geteuid() } == 0 {
        PathBuf::from("/var/log/quill")
    } else if let Some(state) = std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        PathBuf::from(state).join("quill")
    } else if let Some(home) = std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        PathBuf::from(home).join(".local/state/quill")
    } else {
        return Err(format!(
            "no syslog ({SYSLOG_SOCKET}) and no HOME for a log file; choose one with -o log=PATH"
        ));
    };
    Ok(dir.join(file))
}

fn open_log_file(path: &Path) -> Result<File, String> {
    OpenOptions::new().create(true).append(true).mode(0o640).open(path).map_err(|e| {
        format!("cannot open the log file {}: {}", path.display(), crate::mount_cmd::io_reason(&e))
    })
}

/// `t` as RFC 3339 UTC with milliseconds (`2026-11-25T13:16:00.123Z`).
fn utc_timestamp(t: SystemTime) -> String {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, day_secs) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        day_secs / 3600,
        day_secs / 60 % 60,
        day_secs % 60,
        since.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(utc_timestamp(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        // date -u -d @951825600.5: the leap day of a year divisible by 400.
        let t = UNIX_EPOCH + Duration::from_millis(951_825_600_500);
        assert_eq!(utc_timestamp(t), "2000-02-29T12:00:00.500Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_795_612_560);
        assert_eq!(utc_timestamp(t), "2026-11-25T13:16:00.000Z");
        let t = UNIX_EPOCH + Duration::from_secs(4_107_542_399);
        assert_eq!(utc_timestamp(t), "2100-02-28T23:59:59.000Z");
    }

    #[test]
    fn every_line_of_a_message_gets_the_prefix() {
        assert_eq!(prefixed("P: ", "one\ntwo"), "P: one\nP: two\n");
        assert_eq!(prefixed("P: ", "single"), "P: single\n");
    }

    #[test]
    fn fusers_expected_warnings_are_left_out_and_the_others_kept() {
        let not_implemented = "[Not Implemented] copy_file_range(ino_in: INodeNo(0x1c), ...)";
        assert!(is_fuser_noise("fuser::lib", not_implemented));
        let second_unmount = "Failed to umount filesystem: Invalid argument (os error 22)";
        assert!(is_fuser_noise("fuser::session", second_unmount));
        let busy = "Failed to umount filesystem: Device or resource busy (os error 16)";
        assert!(!is_fuser_noise("fuser::session", busy));
        let after_unmount = "Failed to send FUSE reply: No such file or directory (os error 2)";
        assert!(is_fuser_noise("fuser::reply", after_unmount));
        let malformed = "Failed to send FUSE reply: Invalid argument (os error 22)";
        assert!(!is_fuser_noise("fuser::reply", malformed));
        let unanswered = "Reply not sent for operation 30, replying with I/O error";
        assert!(!is_fuser_noise("fuser::reply", unanswered));
        assert!(!is_fuser_noise("quill_fuse", not_implemented));
    }

    #[test]
    fn default_file_is_named_after_the_image() {
        let path = default_log_path(Path::new("/images/disk.img")).unwrap();
        assert_eq!(path.file_name().unwrap(), "disk.img.log");
        assert!(default_log_path(Path::new("/")).is_err());
    }
}
