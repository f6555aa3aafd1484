//! The mount's readahead window. The kernel's FUSE client reads ahead through the page cache
//! by its backing device's `read_ahead_kb` (128 KiB by default), in READ requests of up to
//! that much; quill serves each with one read of the image, so a sequential reader waits on
//! one 128 KiB round trip after another. A larger window means fewer, larger READs, several
//! in flight (FUSE_ASYNC_READ). The init handshake cannot raise it (the reply may only lower
//! the kernel's offer), so once the mount is live quill writes the mount's
//! `/sys/class/bdi/MAJ:MIN/read_ahead_kb`, as `blockdev --setra` would for a disk.
//!
//! The mount's device number comes from /proc/self/mountinfo, not from a stat of the mount
//! point: that would be a GETATTR to this very session, which serves nothing until
//! `Session::run`.

use std::io;
use std::path::Path;

/// Default for [`crate::MountConfig::read_ahead_kb`]: 1 MiB, the largest READ the kernel
/// sends (FUSE_MAX_PAGES, 256 pages). Measured with dd of a 1 GiB file in 1 MiB reads, caches
/// dropped before each pass, three passes each on one mount: 1.5, 1.4 and 1.0 GB/s with the
/// kernel's 128 KiB against 2.3, 1.8 and 1.9 GB/s with 1024 (the kernel's ext4 on the same
/// image: 2.3 and 3.2 GB/s); 4096 read no faster than 1024.
pub const DEFAULT_READ_AHEAD_KB: u32 = 1024;

/// The largest `read_ahead_kb=` taken.
pub const READ_AHEAD_KB_MAX: u32 = 1 << 20;

/// Sets `read_ahead_kb` of the FUSE mount at `mountpoint`, the newest mount there;
/// `mountpoint` is as /proc/self/mountinfo shows it (absolute, symlinks resolved: canonicalize
/// it before mounting, since afterwards that would ask the session).
pub fn set(mountpoint: &Path, kib: u32) -> io::Result<()> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    let device = fuse_device_at(&mountinfo, mountpoint).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("no FUSE mount at {} in /proc/self/mountinfo", mountpoint.display()),
        )
    })?;
    std::fs::write(format!("/sys/class/bdi/{device}/read_ahead_kb"), kib.to_string())
}

/// The `MAJ:MIN` of the last FUSE mount on `mountpoint` in a mountinfo text (proc(5): field
/// 3 is MAJ:MIN, field 5 the mount point with spaces, tabs, newlines and backslashes as octal
/// escapes; the file system type follows the ` - ` separator).
fn fuse_device_at(mountinfo: &str, mountpoint: &Path) -> Option<String> {
    let wanted = mountpoint.as_os_str().as_encoded_bytes();
    mountinfo
        .lines()
        .filter_map(|line| {
            let (fields, rest) = line.split_once(" - ")?;
            let fields: Vec<&str> = fields.split(' ').collect();
            let fstype = rest.split(' ').next()?;
            let is_fuse = fstype == "fuse" || fstype.starts_with("fuse.");
            (is_fuse && unescape(fields.get(4)?) == wanted)
                .then(|| fields.get(2).map(|d| d.to_string()))?
        })
        .next_back()
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 253:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
98 22 0:39 / /tmp/a\\040b rw,nosuid,nodev,relatime shared:50 - fuse /tmp/x.img rw,user_id=0
99 22 0:40 / /mnt/q rw,relatime shared:51 - fuse.quill /q.img rw
100 22 7:0 / /mnt/q rw,relatime shared:52 - ext4 /dev/loop0 rw
101 22 0:41 / /mnt/q rw,relatime shared:53 - fuse /q2.img rw
";

    #[test]
    fn the_newest_fuse_mount_at_the_path_is_found() {
        assert_eq!(fuse_device_at(MOUNTINFO, Path::new("/tmp/a b")).as_deref(), Some("0:39"));
        assert_eq!(fuse_device_at(MOUNTINFO, Path::new("/mnt/q")).as_deref(), Some("0:41"));
        assert_eq!(fuse_device_at(MOUNTINFO, Path::new("/")), None, "not FUSE");
        assert_eq!(fuse_device_at(MOUNTINFO, Path::new("/tmp/a")), None);
    }

    #[test]
    fn octal_escapes_are_undone() {
        assert_eq!(unescape("a\\040b\\134c\\011"), b"a b\\c\t".to_vec());
        assert_eq!(unescape("plain\\9"), b"plain\\9".to_vec());
    }
}
