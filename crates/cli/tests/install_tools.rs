//! scripts/install-tools.sh, the install step of the README's first command (scripts/demo.sh)
//! and of .ci/run: on a machine without a tool it runs apt-get for the package that provides
//! it, and fails with a clear message when that does not bring the tool. Run against a fake
//! apt-get (and a fake `id`) on a PATH of its own, so no package is really installed.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::Scratch;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/install-tools.sh")
}

fn write_executable(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A bin directory holding the shell tools the script uses (linked from the host), a fake
/// `id` answering `uid`, and a fake apt-get that logs its arguments and, on install, creates
/// the tools listed in `provides` ("package:tool").
fn fake_bin(scratch: &Scratch, uid: u32, provides: &[&str]) -> PathBuf {
    let bin = scratch.path("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for tool in ["bash", "sort", "printf", "cat", "mkdir", "chmod", "env"] {
        let found =
            Command::new("sh").arg("-c").arg(format!("command -v {tool}")).output().unwrap();
        let path = String::from_utf8_lossy(&found.stdout).trim().to_string();
        if !path.is_empty() && path.starts_with('/') {
            let _ = std::os::unix::fs::symlink(path, bin.join(tool));
        }
    }
    write_executable(&bin.join("id"), &format!("#!/bin/sh\necho {uid}\n"));
    let mut apt = format!("#!/bin/sh\necho \"$*\" >> {}\n", scratch.path("apt.log").display());
    apt += "[ \"$1\" = install ] || exit 0\nfor p in \"$@\"; do case \"$p\" in\n";
    for pair in provides {
        let (package, tool) = pair.split_once(':').unwrap();
        apt += &format!(
            "  {package}) printf '#!/bin/sh\\n' > {bin}/{tool}; chmod +x {bin}/{tool};;\n",
            bin = bin.display()
        );
    }
    apt += "esac; done\n";
    write_executable(&bin.join("apt-get"), &apt);
    bin
}

fn run(bin: &Path, args: &[&str]) -> Output {
    Command::new(bin.join("bash"))
        .arg(script())
        .args(args)
        .env_clear()
        .env("PATH", bin)
        .output()
        .unwrap()
}

fn apt_log(scratch: &Scratch) -> String {
    std::fs::read_to_string(scratch.path("apt.log")).unwrap_or_default()
}

#[test]
fn missing_tools_are_installed_with_apt_get_as_root() {
    let scratch = Scratch::new("install-tools-root");
    let bin = fake_bin(&scratch, 0, &["fuse3:fusermount3", "e2fsprogs:e2fsck"]);
    let out = run(&bin, &["fusermount3:fuse3", "e2fsck:e2fsprogs", "bash:bash"]);
    assert!(out.status.success(), "{out:?}");
    let log = apt_log(&scratch);
    assert!(log.starts_with("update -qq\n"), "apt-get update first: {log}");
    assert!(log.contains("install -y -qq e2fsprogs fuse3\n"), "one install of both: {log}");
    assert!(bin.join("fusermount3").exists() && bin.join("e2fsck").exists());

    // Everything there now: apt-get is not run again.
    std::fs::remove_file(scratch.path("apt.log")).unwrap();
    let out = run(&bin, &["fusermount3:fuse3", "e2fsck:e2fsprogs"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(apt_log(&scratch), "", "nothing to install");
}

#[test]
fn a_package_that_does_not_bring_its_tool_fails_naming_the_tool() {
    let scratch = Scratch::new("install-tools-absent");
    let bin = fake_bin(&scratch, 0, &[]);
    let out = run(&bin, &["fusermount3:fuse3"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("still missing after apt-get install: fusermount3"), "{stderr}");
}

#[test]
fn without_root_nothing_is_installed_and_the_packages_are_named() {
    let scratch = Scratch::new("install-tools-user");
    let bin = fake_bin(&scratch, 1000, &["fuse3:fusermount3"]);
    let out = run(&bin, &["fusermount3:fuse3"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("apt-get install fuse3"), "{stderr}");
    assert_eq!(apt_log(&scratch), "", "apt-get must not run without root");
}

#[test]
fn the_demo_and_ci_install_their_tools_with_this_script_before_using_them() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let demo = std::fs::read_to_string(root.join("scripts/demo.sh")).unwrap();
    let install = demo.find("scripts/install-tools.sh\" fusermount3:fuse3").expect("demo installs");
    assert!(install < demo.find("cargo build").unwrap(), "before building");
    let ci = std::fs::read_to_string(root.join(".ci/run")).unwrap();
    assert!(ci.find("scripts/install-tools.sh").unwrap() < ci.find("cargo test").unwrap());
}
