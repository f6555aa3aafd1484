//! POSIX ACLs in both encodings: the one the kernel hands a file system in
//! `system.posix_acl_access` / `system.posix_acl_default` (`struct posix_acl_xattr_header`,
//! version 2, every entry 8 bytes) and the one ext4 stores under name index 2 and 3
//! (`ext4_acl_header`, version 1, the entries without a qualifier 4 bytes), with the rules the
//! kernel applies to them: `posix_acl_valid`, `posix_acl_equiv_mode` (the mode an ACL implies)
//! and `posix_acl_create_masq` (a new inode's ACL from its directory's default one).

use super::bytes::{le16, le32, put_le16, put_le32};

/// Entry tags (`ACL_USER_OBJ` ...).
pub const USER_OBJ: u16 = 0x01;
pub const USER: u16 = 0x02;
pub const GROUP_OBJ: u16 = 0x04;
pub const GROUP: u16 = 0x08;
pub const MASK: u16 = 0x10;
pub const OTHER: u16 = 0x20;

/// `POSIX_ACL_XATTR_VERSION` and `EXT4_ACL_VERSION`.
const XATTR_VERSION: u32 = 2;
const DISK_VERSION: u32 = 1;
/// The qualifier of entries that have none, in the xattr encoding.
const UNDEFINED_ID: u32 = u32::MAX;

/// One entry: a tag, `rwx` bits, and the user or group id of `USER` and `GROUP` entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AclEntry {
    pub tag: u16,
    pub perm: u16,
    pub id: u32,
}

/// An ACL, its entries in the order the kernel keeps them (by tag, then id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl(pub Vec<AclEntry>);

/// Why bytes are no ACL (EINVAL to the caller, as the kernel answers them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AclError(pub &'static str);

fn has_id(tag: u16) -> bool {
    tag == USER || tag == GROUP
}

impl Acl {
    /// Decodes the xattr encoding (what setxattr and the kernel pass), then checks it as
    /// `posix_acl_valid` does. An empty ACL (no entries) is `Ok(None)`: no ACL.
    pub fn from_xattr(bytes: &[u8]) -> Result<Option<Acl>, AclError> {
        if bytes.len() < 4 || le32(bytes, 0) != XATTR_VERSION {
            return Err(AclError("not a version 2 ACL"));
        }
        let body = &bytes[4..];
        if !body.len().is_multiple_of(8) {
            return Err(AclError("entries of a size other than 8 bytes"));
        }
        let entries: Vec<AclEntry> = body
            .chunks_exact(8)
            .map(|e| AclEntry { tag: le16(e, 0), perm: le16(e, 2), id: le32(e, 4) })
            .map(|e| AclEntry { id: if has_id(e.tag) { e.id } else { 0 }, ..e })
            .collect();
        if entries.is_empty() {
            return Ok(None);
        }
        let acl = Acl(entries);
        acl.check()?;
        Ok(Some(acl))
    }

    /// The xattr encoding (what getxattr returns).
    pub fn to_xattr(&self) -> Vec<u8> {
        let mut out = vec![0u8; 4 + 8 * self.0.len()];
        put_le32(&mut out, 0, XATTR_VERSION);
        for (k, e) in self.0.iter().enumerate() {
            let at = 4 + 8 * k;
            put_le16(&mut out, at, e.tag);
            put_le16(&mut out, at + 2, e.perm);
            put_le32(&mut out, at + 4, if has_id(e.tag) { e.id } else { UNDEFINED_ID });
        }
        out
    }

    /// Decodes ext4's on-disk encoding (`ext4_acl_from_disk`), checked as the kernel checks
    /// what it reads.
    pub fn from_disk(bytes: &[u8]) -> Result<Acl, AclError> {
        if bytes.len() < 4 || le32(bytes, 0) != DISK_VERSION {
            return Err(AclError("not a version 1 ext4 ACL"));
        }
        let mut entries = Vec::new();
        let mut at = 4;
        while at < bytes.len() {
            if bytes.len() - at < 4 {
                return Err(AclError("a truncated entry"));
            }
            let (tag, perm) = (le16(bytes, at), le16(bytes, at + 2));
            let id = if has_id(tag) {
                if bytes.len() - at < 8 {
                    return Err(AclError("a truncated entry"));
                }
                le32(bytes, at + 4)
            } else {
                0
            };
            at += if has_id(tag) { 8 } else { 4 };
            entries.push(AclEntry { tag, perm, id });
        }
        let acl = Acl(entries);
        acl.check()?;
        Ok(acl)
    }

    /// ext4's on-disk encoding (`ext4_acl_to_disk`).
    pub fn to_disk(&self) -> Vec<u8> {
        let mut out = vec![0u8; 4];
        put_le32(&mut out, 0, DISK_VERSION);
        for e in &self.0 {
            let at = out.len();
            out.resize(at + if has_id(e.tag) { 8 } else { 4 }, 0);
            put_le16(&mut out, at, e.tag);
            put_le16(&mut out, at + 2, e.perm);
            if has_id(e.tag) {
                put_le32(&mut out, at + 4, e.id);
            }
        }
        out
    }

    /// `posix_acl_valid`: one USER_OBJ, USER entries by increasing uid, one GROUP_OBJ, GROUP
    /// entries by increasing gid, a MASK (required when there are USER or GROUP entries), one
    /// OTHER, in that order; permissions within `rwx`.
    fn check(&self) -> Result<(), AclError> {
        const ORDER: [u16; 6] = [USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER];
        let mut stage = 0;
        let mut last_id: Option<u32> = None;
        let (mut named, mut mask) = (false, false);
        let mut seen = [false; 6];
        for e in &self.0 {
            if e.perm & !7 != 0 {
                return Err(AclError("permissions beyond rwx"));
            }
            let Some(k) = ORDER.iter().position(|&t| t == e.tag) else {
                return Err(AclError("an unknown tag"));
            };
            if k < stage || (k == stage && !has_id(e.tag) && seen[k]) {
                return Err(AclError("entries out of order or repeated"));
            }
            if k != stage {
                last_id = None;
            }
            if has_id(e.tag) {
                if last_id.is_some_and(|prev| e.id <= prev) {
                    return Err(AclError("qualifiers not increasing"));
                }
                last_id = Some(e.id);
                named = true;
            }
            mask |= e.tag == MASK;
            seen[k] = true;
            stage = k;
        }
        if !(seen[0] && seen[2] && seen[5]) {
            return Err(AclError("no USER_OBJ, GROUP_OBJ or OTHER entry"));
        }
        if named && !mask {
            return Err(AclError("named entries without a MASK"));
        }
        Ok(())
    }

    /// `posix_acl_equiv_mode`: the permission bits (`0o777`) the ACL gives the owner, the
    /// group class (the MASK where there is one) and others, and whether the mode says it all
    /// (only the three base entries), in which case ext4 stores no ACL.
    pub fn mode_bits(&self) -> (u16, bool) {
        let mut mode = 0u16;
        let mut equivalent = true;
        for e in &self.0 {
            match e.tag {
                USER_OBJ => mode |= (e.perm & 7) << 6,
                GROUP_OBJ => mode |= (e.perm & 7) << 3,
                OTHER => mode |= e.perm & 7,
                MASK => {
                    mode = (mode & !0o070) | ((e.perm & 7) << 3);
                    equivalent = false;
                }
                _ => equivalent = false,
            }
        }
        (mode, equivalent)
    }

    /// `posix_acl_chmod_masq`: the ACL after a chmod to `mode`: the owner, group class (the
    /// MASK where there is one) and other entries take the mode's bits; named entries stay.
    pub fn chmod_masq(&mut self, mode: u16) {
        let class = if self.0.iter().any(|e| e.tag == MASK) { MASK } else { GROUP_OBJ };
        for e in &mut self.0 {
            match e.tag {
                USER_OBJ => e.perm = (mode >> 6) & 7,
                OTHER => e.perm = mode & 7,
                t if t == class => e.perm = (mode >> 3) & 7,
                _ => {}
            }
        }
    }

    /// `posix_acl_create_masq`: this ACL (a directory's default) limited by the new inode's
    /// requested `mode`, which is limited by it in turn; returns whether the ACL says more
    /// than the mode (and must be stored).
    pub fn create_masq(&mut self, mode: &mut u16) -> bool {
        let mut m = *mode & 0o777;
        let mut not_equiv = false;
        let (mut group_obj, mut mask_obj) = (None, None);
        for (k, e) in self.0.iter_mut().enumerate() {
            match e.tag {
                USER_OBJ => {
                    e.perm &= (m >> 6) & 7;
                    m &= (e.perm << 6) | !0o700;
                }
                USER | GROUP => not_equiv = true,
                GROUP_OBJ => group_obj = Some(k),
                OTHER => {
                    e.perm &= m & 7;
                    m &= e.perm | !0o007;
                }
                MASK => {
                    mask_obj = Some(k);
                    not_equiv = true;
                }
                _ => {}
            }
        }
        if let Some(k) = mask_obj.or(group_obj) {
            let e = &mut self.0[k];
            e.perm &= (m >> 3) & 7;
            m &= (e.perm << 3) | !0o070;
        }
        *mode = (*mode & !0o777) | (m & 0o777);
        not_equiv
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(tag: u16, perm: u16, id: u32) -> AclEntry {
        AclEntry { tag, perm, id }
    }

    fn sample() -> Acl {
        Acl(vec![
            entry(USER_OBJ, 7, 0),
            entry(USER, 5, 1000),
            entry(USER, 4, 1001),
            entry(GROUP_OBJ, 5, 0),
            entry(GROUP, 6, 50),
            entry(MASK, 7, 0),
            entry(OTHER, 4, 0),
        ])
    }

    #[test]
    fn both_encodings_round_trip() {
        let acl = sample();
        assert_eq!(Acl::from_xattr(&acl.to_xattr()).unwrap(), Some(acl.clone()));
        assert_eq!(Acl::from_disk(&acl.to_disk()).unwrap(), acl);
        // ext4's: 4-byte header, 4-byte short entries, 8-byte named ones.
        assert_eq!(acl.to_disk().len(), 4 + 4 * 4 + 8 * 3);
        assert_eq!(acl.to_xattr().len(), 4 + 8 * 7);
        assert_eq!(Acl::from_xattr(&[2, 0, 0, 0]).unwrap(), None);
    }

    #[test]
    fn invalid_acls_are_refused() {
        let mut no_mask = sample();
        no_mask.0.retain(|e| e.tag != MASK);
        assert!(Acl::from_xattr(&no_mask.to_xattr()).is_err());
        let mut unordered = sample();
        unordered.0.swap(1, 2);
        assert!(Acl::from_xattr(&unordered.to_xattr()).is_err());
        let mut bad_perm = sample();
        bad_perm.0[0].perm = 8;
        assert!(Acl::from_xattr(&bad_perm.to_xattr()).is_err());
        assert!(Acl::from_xattr(&[1, 0, 0, 0]).is_err());
        assert!(Acl::from_disk(&[1, 0, 0, 0, 1, 0]).is_err());
    }

    #[test]
    fn mode_and_create_masq_follow_the_kernel() {
        let (mode, equivalent) = sample().mode_bits();
        assert_eq!((mode, equivalent), (0o774, false));
        let base = Acl(vec![entry(USER_OBJ, 6, 0), entry(GROUP_OBJ, 4, 0), entry(OTHER, 0, 0)]);
        assert_eq!(base.mode_bits(), (0o640, true));
        // A default ACL applied to a file created with mode 0666.
        let mut acl = sample();
        let mut mode = 0o100_666;
        assert!(acl.create_masq(&mut mode));
        assert_eq!(mode, 0o100_664);
        assert_eq!(acl.0[0].perm, 6, "USER_OBJ limited by the mode");
        assert_eq!(acl.0[5].perm, 6, "MASK limited by the mode's group bits");
        assert_eq!(acl.0[6].perm, 4);
        // chmod 750: owner rwx, the mask r-x, other none; named entries kept.
        let mut acl = sample();
        acl.chmod_masq(0o750);
        assert_eq!(acl.mode_bits(), (0o750, false));
        assert_eq!((acl.0[1].perm, acl.0[3].perm), (5, 5));
    }
}
