//! Access times, as ext4 keeps them under the `relatime`, `strictatime` and `noatime` mount
//! options: reading a file or listing a directory may update its `i_atime` (journaled like any
//! inode change, but never touching `i_ctime`).

use ondisk::ext4::{Inode, Timestamp};

use crate::error::Result;
use crate::filesystem::{now, Filesystem};
use crate::ops::txn_write_inode;

/// When a read updates the access time (ext4's mount options of the same names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AtimeMode {
    /// Only when the access time is not newer than the last change (`i_mtime` or `i_ctime`) or
    /// is a day old: "was it read since it was written?" stays answerable at a fraction of the
    /// writes (the kernel's default, `relatime_need_update`).
    #[default]
    Relative,
    /// On every read (POSIX; a journaled inode write per read).
    Strict,
    /// Never.
    Never,
}

/// The kernel's relatime window: an access time older than this is refreshed regardless.
const RELATIME_REFRESH_SECS: i64 = 24 * 60 * 60;

impl AtimeMode {
    /// The mode a mount option names: `relatime`, `strictatime`, `noatime`, or `atime`, which
    /// undoes noatime (the default, relatime, as the kernel's).
    pub fn from_mount_option(name: &str) -> Option<AtimeMode> {
        match name {
            "relatime" | "atime" => Some(AtimeMode::Relative),
            "strictatime" => Some(AtimeMode::Strict),
            "noatime" => Some(AtimeMode::Never),
            _ => None,
        }
    }

    /// Whether a read at `now` updates `inode`'s access time (`touch_atime` and
    /// `relatime_need_update` in fs/inode.c).
    pub fn needs_update(self, inode: &Inode, now: Timestamp) -> bool {
        match self {
            AtimeMode::Never => false,
            AtimeMode::Strict => inode.atime != now,
            AtimeMode::Relative => {
                inode.mtime >= inode.atime
                    || inode.ctime >= inode.atime
                    || now.sec - inode.atime.sec >= RELATIME_REFRESH_SECS
            }
        }
    }
}

impl Filesystem {
    /// Whether an access of `inode` now updates its access time under this mount: never on a
    /// read-only file system, for an inode with `A` (chattr +A) or, under `nodiratime`, for a
    /// directory. Called by readers with
    /// the inode locked, so the common case (no update due) costs no second lock.
    pub(crate) fn atime_due(&self, inode: &Inode, is_dir: bool) -> bool {
        let exempt = self.is_read_only()
            || (is_dir && self.options.no_dir_atime)
            || inode.flags & ondisk::ext4::iflags::NOATIME_FL != 0;
        !exempt && self.options.atime.needs_update(inode, now())
    }

    /// Updates the access time of `ino` after a read of its data (`is_dir`: a directory
    /// listing) that found it [`Filesystem::atime_due`]; checked again under the lock, since
    /// another reader may have updated it meanwhile. Called with no inode locked.
    pub(crate) fn touch_atime(&self, ino: u32, is_dir: bool) -> Result<()> {
        let slot = self.inodes.slot(ino);
        let mut guard = self.lock_live(&slot)?;
        let data = guard.as_mut().expect("loaded");
        if !self.atime_due(&data.inode, is_dir) {
            return Ok(());
        }
        let mut txn = self.begin(1, 0)?;
        data.inode.atime = now();
        // A fast commit carries the new access time in its INODE record.
        data.fc.expressible_next();
        self.finish(txn_write_inode(self, &mut txn, ino, data, false), txn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(sec: i64) -> Timestamp {
        Timestamp { sec, nsec: 0 }
    }

    fn inode(atime: i64, mtime: i64, ctime: i64) -> Inode {
        Inode { atime: at(atime), mtime: at(mtime), ctime: at(ctime), ..Inode::default() }
    }

    #[test]
    fn relatime_updates_after_a_change_or_once_a_day() {
        let now = at(1_000_000);
        let rel = AtimeMode::Relative;
        assert!(rel.needs_update(&inode(500, 600, 500), now), "written since last read");
        assert!(rel.needs_update(&inode(600, 600, 600), now), "not newer than mtime");
        assert!(rel.needs_update(&inode(500, 400, 700), now), "changed since last read");
        assert!(!rel.needs_update(&inode(950_000, 400, 400), now), "read since, within a day");
        assert!(rel.needs_update(&inode(1_000_000 - 86_400, 400, 400), now), "a day old");
        assert!(AtimeMode::Strict.needs_update(&inode(999_999, 400, 400), now));
        assert!(!AtimeMode::Strict.needs_update(&inode(1_000_000, 400, 400), now));
        assert!(!AtimeMode::Never.needs_update(&inode(0, 400, 400), now));
    }
}
