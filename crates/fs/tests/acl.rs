//! POSIX ACLs through the library (`acl.rs`): the xattr encoding in and out, ext4's encoding
//! on disk, the mode kept in step, default ACLs given to new inodes in their creating
//! transaction (a crash right after keeps both), `noacl`. The mount tests compare the same
//! with the kernel's ext4 through FUSE (crates/cli/tests/mount_posix.rs).

mod common;

use common::{assert_fsck_clean, mkfs, open_device, Scratch};
use fs::error::errno::{EACCES, EINVAL, EOPNOTSUPP};
use fs::{Filesystem, MountOptions, SetAttr, SetMode, ROOT_INO};
use journal::JournalConfig;
use ondisk::ext4::acl::{Acl, AclEntry, GROUP, GROUP_OBJ, MASK, OTHER, USER, USER_OBJ};

const ACCESS: &[u8] = b"system.posix_acl_access";
const DEFAULT: &[u8] = b"system.posix_acl_default";

fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    Acl(entries.iter().map(|&(tag, perm, id)| AclEntry { tag, perm, id }).collect()).to_xattr()
}

fn named() -> Vec<u8> {
    acl(&[
        (USER_OBJ, 6, 0),
        (USER, 6, 1000),
        (GROUP_OBJ, 4, 0),
        (GROUP, 4, 50),
        (MASK, 6, 0),
        (OTHER, 4, 0),
    ])
}

fn image(scratch: &Scratch) -> Option<std::path::PathBuf> {
    if !common::have("mkfs.ext4", "acl") || !common::have("e2fsck", "acl") {
        return None;
    }
    let path = scratch.path("acl.img");
    mkfs(&path, "16M", &["-O", "fast_commit"]);
    Some(path)
}

fn mode_of(fs: &Filesystem, ino: u32) -> u16 {
    fs.getattr(ino).unwrap().mode & 0o7777
}

#[test]
fn access_acls_keep_the_mode_in_step_and_round_trip() {
    let scratch = Scratch::new("acl-access");
    let Some(path) = image(&scratch) else { return };
    let fs = Filesystem::open(open_device(&path), MountOptions::default()).unwrap();
    let f = fs.create(ROOT_INO, b"f", 0o644, 0, 0).unwrap().ino;
    fs.setxattr(f, ACCESS, &named(), SetMode::Any).unwrap();
    assert_eq!(mode_of(&fs, f), 0o664, "the group bits are the mask's");
    assert_eq!(fs.getxattr(f, ACCESS).unwrap(), named());
    assert!(fs.listxattr(f).unwrap().contains(&ACCESS.to_vec()));
    // chmod rewrites the owner, mask and other entries.
    fs.setattr(f, &SetAttr { mode: Some(0o750), ..SetAttr::default() }).unwrap();
    let after = Acl::from_xattr(&fs.getxattr(f, ACCESS).unwrap()).unwrap().unwrap();
    assert_eq!(after.mode_bits(), (0o750, false));
    // An ACL the mode says all of is not stored: the mode holds it.
    fs.setxattr(
        f,
        ACCESS,
        &acl(&[(USER_OBJ, 7, 0), (GROUP_OBJ, 0, 0), (OTHER, 0, 0)]),
        SetMode::Any,
    )
    .unwrap();
    assert_eq!(mode_of(&fs, f), 0o700);
    assert!(fs.listxattr(f).unwrap().is_empty());
    assert_eq!(fs.getxattr(f, ACCESS).unwrap_err().errno(), fs::error::errno::ENODATA);
    // Invalid ACLs and default ACLs on files are refused; removing what is not there is fine.
    let no_mask = acl(&[(USER_OBJ, 6, 0), (USER, 6, 1000), (GROUP_OBJ, 4, 0), (OTHER, 4, 0)]);
    assert_eq!(fs.setxattr(f, ACCESS, &no_mask, SetMode::Any).unwrap_err().errno(), EINVAL);
    assert_eq!(fs.setxattr(f, DEFAULT, &named(), SetMode::Any).unwrap_err().errno(), EACCES);
    fs.removexattr(f, ACCESS).unwrap();
    fs.setxattr(f, ACCESS, &named(), SetMode::Any).unwrap();
    fs.unmount().unwrap();
    assert_fsck_clean(&path);

    // On disk in ext4's encoding (4-byte entries without a qualifier), and `noacl` hides it.
    let fs = Filesystem::open(open_device(&path), MountOptions::default()).unwrap();
    let stored_len = Acl::from_xattr(&named()).unwrap().unwrap().to_disk().len();
    assert_eq!(stored_len, 4 + 4 * 4 + 8 * 2);
    assert_eq!(fs.getxattr(f, ACCESS).unwrap(), named());
    fs.unmount().unwrap();
    let options = MountOptions { acl: false, ..MountOptions::default() };
    let fs = Filesystem::open(open_device(&path), options).unwrap();
    assert_eq!(fs.getxattr(f, ACCESS).unwrap_err().errno(), EOPNOTSUPP);
    assert!(fs.listxattr(f).unwrap().is_empty());
    fs.unmount().unwrap();
}

#[test]
fn a_default_acl_is_given_to_new_inodes_in_their_creating_transaction() {
    let scratch = Scratch::new("acl-default");
    let Some(path) = image(&scratch) else { return };
    let options = MountOptions {
        journal: JournalConfig { fsync_journal: true, ..JournalConfig::classic() },
        ..MountOptions::default()
    };
    let fs = Filesystem::open(open_device(&path), options).unwrap();
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, 0, 0).unwrap().ino;
    let default =
        acl(&[(USER_OBJ, 7, 0), (USER, 7, 1000), (GROUP_OBJ, 5, 0), (MASK, 7, 0), (OTHER, 0, 0)]);
    fs.setxattr(d, DEFAULT, &default, SetMode::Any).unwrap();
    fs.sync().unwrap();
    // The umask (077) does not apply under a default ACL; the requested mode limits the ACL.
    let file = fs.mknod_umask(d, b"file", 0o100_666, 0, (0, 0), 0o077).unwrap().ino;
    let sub = fs.mkdir_umask(d, b"sub", 0o777, (0, 0), 0o077).unwrap().ino;
    let plain = fs.mknod_umask(ROOT_INO, b"plain", 0o100_666, 0, (0, 0), 0o077).unwrap().ino;
    assert_eq!(mode_of(&fs, file), 0o660);
    assert_eq!(mode_of(&fs, sub), 0o770);
    assert_eq!(mode_of(&fs, plain), 0o600, "without a default ACL the umask applies");
    let got = Acl::from_xattr(&fs.getxattr(file, ACCESS).unwrap()).unwrap().unwrap();
    assert_eq!(got.mode_bits(), (0o660, false));
    assert_eq!(fs.getxattr(sub, DEFAULT).unwrap(), default);
    // fsync of the new file commits (no fast commit carries an xattr), and a crash keeps
    // the file with its ACL.
    fs.write(file, 0, b"acl").unwrap();
    fs.fsync(file, false).unwrap();
    assert!(
        fs.journal().stats().fast_commit_fallbacks.iter().any(|(r, _)| r == "xattr"),
        "{:?}",
        fs.journal().stats().fast_commit_fallbacks
    );
    fs.crash();
    let fs = Filesystem::open(open_device(&path), MountOptions::default()).unwrap();
    let file = fs.lookup(d, b"file").unwrap().ino;
    assert_eq!(mode_of(&fs, file), 0o660);
    let got = Acl::from_xattr(&fs.getxattr(file, ACCESS).unwrap()).unwrap().unwrap();
    assert_eq!(got.mode_bits(), (0o660, false));
    fs.unmount().unwrap();
    assert_fsck_clean(&path);
}
