//! Dropping the set-user-ID and set-group-ID bits when a file is changed, as the kernel's
//! `file_remove_privs` does for ext4 (`setattr_should_drop_suidgid`): on write, truncate and
//! fallocate by a caller without CAP_FSETID, a regular file loses S_ISUID, and S_ISGID when it
//! is group-executable or the caller is not in the file's group.
//!
//! The kernel's FUSE client applies only an older rule (S_ISGID only with group-execute) when
//! the file system does not handle this itself, so without this module a 2666 file written by
//! someone outside its group kept its set-group-ID bit on quill but not on ext4.
//!
//! quill handles all of it (FUSE_HANDLE_KILLPRIV_V2, see `QuillFuse::init`): the kernel then
//! no longer asks for `security.capability` before every write (one GETXATTR round trip per
//! write otherwise), and leaves to quill what `file_remove_privs` and `chown_common` do: the
//! set-id rule above on write, truncate and fallocate, [`Caller::mode_after_chown`] on chown,
//! and the removal of `security.capability` ([`CAPABILITY`]) on all four.

use fuser::Request;

/// S_ISUID, S_ISGID and S_IXGRP as u16 mode bits.
const SET_UID: u16 = libc::S_ISUID as u16;
const SET_GID: u16 = libc::S_ISGID as u16;
const GROUP_EXEC: u16 = libc::S_IXGRP as u16;

/// The xattr file capabilities live in; a change to the file's data or owner removes it
/// (`cap_inode_killpriv`), whoever makes it.
pub(crate) const CAPABILITY: &[u8] = b"security.capability";

/// CAP_FSETID's bit in /proc's capability masks.
const CAP_FSETID: u32 = 4;

/// The credentials the rule needs, of the process that made a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Caller {
    /// The file-system group id and the supplementary groups.
    pub groups: Vec<u32>,
    pub cap_fsetid: bool,
}

impl Caller {
    /// Reads the caller of `req` from /proc/PID/status; when that is gone (the process
    /// exited), falls back to the request's gid, and to uid 0 for the capability.
    pub fn of(req: &Request) -> Caller {
        std::fs::read_to_string(format!("/proc/{}/status", req.pid()))
            .ok()
            .and_then(|status| Caller::parse_status(&status))
            .unwrap_or(Caller { groups: vec![req.gid()], cap_fsetid: req.uid() == 0 })
    }

    fn parse_status(status: &str) -> Option<Caller> {
        let field = |name: &str| {
            status.lines().find_map(|l| l.strip_prefix(name)).map(|rest| rest.trim().to_string())
        };
        // "Gid:\treal\teffective\tsaved\tfs"
        let fsgid: u32 = field("Gid:")?.split_whitespace().nth(3)?.parse().ok()?;
        let mut groups = vec![fsgid];
        groups.extend(field("Groups:")?.split_whitespace().filter_map(|g| g.parse::<u32>().ok()));
        let cap_eff = u64::from_str_radix(&field("CapEff:")?, 16).ok()?;
        Some(Caller { groups, cap_fsetid: cap_eff & (1 << CAP_FSETID) != 0 })
    }

    /// The mode a change by this caller leaves on a file of `mode` with group `gid`, or `None`
    /// when nothing is dropped.
    pub fn mode_after_change(&self, mode: u16, gid: u32) -> Option<u16> {
        // A caller with CAP_FSETID keeps both bits; for any other the rule is chown's.
        if self.cap_fsetid {
            return None;
        }
        self.mode_after_chown(mode, gid)
    }

    /// The mode a chown by this caller leaves on a file of `mode` with group `gid` (the group
    /// before the chown), or `None` when nothing is dropped: `chown_common` drops S_ISUID
    /// from a regular file whoever changes its owner, and S_ISGID as `setattr_should_drop_sgid`
    /// says (group-executable, or the caller neither in the group nor holding CAP_FSETID).
    pub fn mode_after_chown(&self, mode: u16, gid: u32) -> Option<u16> {
        let regular = u32::from(mode) & libc::S_IFMT == libc::S_IFREG;
        if !regular || mode & (SET_UID | SET_GID) == 0 {
            return None;
        }
        let mut kept = mode & !SET_UID;
        let outsider = !self.cap_fsetid && !self.groups.contains(&gid);
        if mode & SET_GID != 0 && (mode & GROUP_EXEC != 0 || outsider) {
            kept &= !SET_GID;
        }
        (kept != mode).then_some(kept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REG: u16 = libc::S_IFREG as u16;

    #[test]
    fn the_kernels_rule_for_dropping_set_id_bits() {
        let outsider = Caller { groups: vec![100, 101], cap_fsetid: false };
        let member = Caller { groups: vec![100, 5], cap_fsetid: false };
        let root = Caller { groups: vec![0], cap_fsetid: true };
        // (mode, caller, expected) for a file of group 5.
        let cases = [
            (0o2666, &outsider, Some(0o666)),
            (0o2766, &outsider, Some(0o766)),
            (0o2666, &member, None),
            (0o2676, &member, Some(0o676)),
            (0o6666, &member, Some(0o2666)),
            (0o4755, &member, Some(0o755)),
            (0o6777, &root, None),
            (0o0666, &outsider, None),
        ];
        for (mode, caller, want) in cases {
            assert_eq!(caller.mode_after_change(REG | mode, 5), want.map(|m| REG | m), "{mode:o}");
        }
        let dir = libc::S_IFDIR as u16;
        assert_eq!(outsider.mode_after_change(dir | 0o2775, 5), None, "directories keep it");
    }

    #[test]
    fn the_kernels_rule_for_set_id_bits_on_chown() {
        let outsider = Caller { groups: vec![100], cap_fsetid: false };
        let member = Caller { groups: vec![5], cap_fsetid: false };
        let root = Caller { groups: vec![0], cap_fsetid: true };
        let cases = [
            (0o4755, &root, Some(0o755)),
            (0o6755, &root, Some(0o755)),
            (0o2745, &root, None),
            (0o2745, &member, None),
            (0o2745, &outsider, Some(0o745)),
            (0o6745, &member, Some(0o2745)),
            (0o0755, &outsider, None),
        ];
        for (mode, caller, want) in cases {
            assert_eq!(caller.mode_after_chown(REG | mode, 5), want.map(|m| REG | m), "{mode:o}");
        }
        let dir = libc::S_IFDIR as u16;
        assert_eq!(root.mode_after_chown(dir | 0o6755, 5), None, "directories keep them");
    }

    #[test]
    fn credentials_come_from_proc_status() {
        let status = "Name:\tsh\nUid:\t1000\t1000\t1000\t1000\nGid:\t100\t100\t100\t7\n\
                      Groups:\t24 25 \nCapEff:\t0000000000000010\n";
        let caller = Caller::parse_status(status).unwrap();
        assert_eq!(caller, Caller { groups: vec![7, 24, 25], cap_fsetid: true });
        let status = status.replace("0000000000000010", "0000000000000000");
        assert!(!Caller::parse_status(&status).unwrap().cap_fsetid);
        assert_eq!(Caller::parse_status("Name:\tx\n"), None);
    }
}
