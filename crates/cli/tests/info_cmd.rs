//! `quill info`: agrees with `dumpe2fs -h` on mkfs.ext4 images, prints one JSON object with
//! `--json` that says the same, lists the transactions of a journal left by a crash and says
//! needs_recovery, never changes a byte of the image, and fails on bad input with one line
//! (exit 1) or a usage error (exit 2).

mod common;

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hasher};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use blockdev::file::{FileDevice, FileOptions};
use blockdev::BlockDevice;
use common::*;
use fs::{Filesystem, MountOptions, ROOT_INO};
use serde_json::Value;

/// `Key: value` lines (dumpe2fs -h, and quill info's text) as a map; indented lines (quill's
/// transaction list) are left out.
fn fields(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter(|line| !line.starts_with(' '))
        .filter_map(|line| line.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

fn dumpe2fs_header(image: &Path) -> BTreeMap<String, String> {
    let o = run(Command::new("dumpe2fs").arg("-h").arg(image));
    assert!(o.status.success(), "dumpe2fs: {}", text(&o));
    fields(&String::from_utf8_lossy(&o.stdout))
}

/// `quill info IMAGE`: its stdout, after checking it succeeded and left the image as it was.
fn info_text(image: &Path) -> String {
    let before = image_hash(image);
    let o = run(quill().arg("info").arg(image));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(o.stderr.is_empty(), "nothing on stderr without a terminal: {}", text(&o));
    assert_eq!(image_hash(image), before, "quill info changed the image");
    String::from_utf8(o.stdout).unwrap()
}

fn info_json(image: &Path) -> Value {
    let before = image_hash(image);
    let o = run(quill().args(["info", "--json"]).arg(image));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(image_hash(image), before, "quill info --json changed the image");
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("--json is not JSON ({e}): {}", text(&o)))
}

fn image_hash(image: &Path) -> (u64, u64) {
    let bytes = std::fs::read(image).unwrap();
    let mut hasher = DefaultHasher::new();
    hasher.write(&bytes);
    (bytes.len() as u64, hasher.finish())
}

/// The first number of a value such as "4096 blocks of 1024 bytes".
fn leading_number(value: &str) -> u64 {
    let digits: String = value.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().unwrap_or_else(|_| panic!("no number at the start of '{value}'"))
}

/// Checks quill info (text and JSON) against dumpe2fs -h on `image`.
fn assert_info_matches_dumpe2fs(image: &Path) {
    let d = dumpe2fs_header(image);
    let q = fields(&info_text(image));
    for (quill_key, dumpe2fs_key) in [
        ("Filesystem volume name", "Filesystem volume name"),
        ("Filesystem UUID", "Filesystem UUID"),
        ("Filesystem features", "Filesystem features"),
        ("Filesystem state", "Filesystem state"),
        ("Errors behavior", "Errors behavior"),
        ("Block size", "Block size"),
        ("Block count", "Block count"),
        ("Reserved block count", "Reserved block count"),
        ("First block", "First block"),
        ("Inode count", "Inode count"),
        ("Inode size", "Inode size"),
        ("Blocks per group", "Blocks per group"),
        ("Inodes per group", "Inodes per group"),
        ("Free blocks", "Free blocks"),
        ("Free inodes", "Free inodes"),
        ("Mount count", "Mount count"),
        ("Journal features", "Journal features"),
    ] {
        assert_eq!(q.get(quill_key), d.get(dumpe2fs_key), "{quill_key} (quill) vs {dumpe2fs_key}");
    }
    let block_count: u64 = d["Block count"].parse().unwrap();
    let first_block: u64 = d["First block"].parse().unwrap();
    let per_group: u64 = d["Blocks per group"].parse().unwrap();
    let groups = (block_count - first_block).div_ceil(per_group);
    assert_eq!(q["Block groups"], groups.to_string());
    let journal_blocks: u64 = d["Total journal blocks"].parse().unwrap();
    assert_eq!(leading_number(&q["Journal size"]), journal_blocks);
    let location = format!("inode {}, ", d["Journal inode"]);
    assert!(q["Journal location"].starts_with(&location), "{}", q["Journal location"]);
    assert_eq!(leading_number(&q["Journal start"]), d["Journal start"].parse::<u64>().unwrap());
    let sequence = u64::from_str_radix(d["Journal sequence"].trim_start_matches("0x"), 16).unwrap();
    assert!(q["Journal sequence"].ends_with(&format!("({sequence})")), "{}", q["Journal sequence"]);
    let needs_recovery = d["Filesystem features"].split(' ').any(|f| f == "needs_recovery");
    assert_eq!(q["Needs recovery"], if needs_recovery { "yes" } else { "no" });

    // --json says the same.
    let j = info_json(image);
    let volume =
        if d["Filesystem volume name"] == "<none>" { "" } else { &d["Filesystem volume name"] };
    assert_eq!(j["volume_name"], volume);
    assert_eq!(j["uuid"], d["Filesystem UUID"].as_str());
    let features: Vec<&str> =
        j["features"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
    assert_eq!(features.join(" "), d["Filesystem features"]);
    assert_eq!(j["state"], d["Filesystem state"].as_str());
    for (key, dumpe2fs_key) in [
        ("block_size", "Block size"),
        ("blocks_count", "Block count"),
        ("inodes_count", "Inode count"),
        ("inode_size", "Inode size"),
        ("blocks_per_group", "Blocks per group"),
        ("inodes_per_group", "Inodes per group"),
        ("mount_count", "Mount count"),
    ] {
        assert_eq!(j[key].as_u64(), Some(d[dumpe2fs_key].parse().unwrap()), "{key}");
    }
    assert_eq!(j["groups"].as_u64(), Some(groups));
    for (key, dumpe2fs_key) in [("free_blocks", "Free blocks"), ("free_inodes", "Free inodes")] {
        let expected: u64 = d[dumpe2fs_key].parse().unwrap();
        assert_eq!(j[key]["superblock"].as_u64(), Some(expected), "{key}");
        // A fresh or cleanly unmounted image: the descriptors sum to the superblock's count.
        assert_eq!(j[key]["group_descriptors"].as_u64(), Some(expected), "{key}");
        assert_eq!(j[key]["agree"], true, "{key}");
    }
    assert_eq!(j["needs_recovery"], needs_recovery);
    assert_eq!(j["journal"]["location"], "inode");
    assert_eq!(j["journal"]["size_blocks"].as_u64(), Some(journal_blocks));
    assert_eq!(j["journal"]["sequence"].as_u64(), Some(sequence));
    assert_eq!(j["journal"]["empty"], true);
    assert!(j["journal"].get("transactions").is_none(), "an empty journal lists no transactions");
}

#[test]
fn info_agrees_with_dumpe2fs_on_mkfs_ext4_images() {
    let test = "info_agrees_with_dumpe2fs_on_mkfs_ext4_images";
    if !have("mkfs.ext4", test) || !have("dumpe2fs", test) {
        return;
    }
    let scratch = Scratch::new("info-dumpe2fs");
    let image = scratch.path("fresh.img");
    // mkfs.ext4's defaults (1 KiB blocks at this size) with a label.
    mkfs(&image, "64M", &["-L", "quill-info"]);
    assert_info_matches_dumpe2fs(&image);
    let q = fields(&info_text(&image));
    assert_eq!(q["Filesystem volume name"], "quill-info");
    assert_eq!(q["Journal format"], "v2, 64bit no, checksum none, revoke no");
    assert_eq!(q["Journal start"], "0 (empty)");
    assert_eq!(q["Last mount time"], "n/a");
    assert_eq!(q["Orphan list head"], "0 (empty)");

    // 4 KiB blocks, other features, several groups.
    let other = scratch.path("other.img");
    mkfs(
        &other,
        "300M",
        &["-b", "4096", "-O", "^metadata_csum,uninit_bg,orphan_file", "-N", "5000"],
    );
    assert_info_matches_dumpe2fs(&other);
    let features = fields(&info_text(&other))["Filesystem features"].clone();
    for name in ["uninit_bg", "orphan_file"] {
        assert!(features.split(' ').any(|f| f == name), "{name} in {features}");
    }

    // After quill has used the image and unmounted it: journal features, mount count and
    // times as dumpe2fs reads them.
    let dev: Arc<dyn BlockDevice> =
        Arc::new(FileDevice::open(&image, FileOptions::default()).unwrap());
    let fs = Filesystem::open(dev, MountOptions::default()).unwrap();
    let ino = fs.create(ROOT_INO, b"file", 0o644, 0, 0).unwrap().ino;
    fs.write(ino, 0, &[7u8; 10_000]).unwrap();
    fs.unmount().unwrap();
    assert_info_matches_dumpe2fs(&image);
    let q = fields(&info_text(&image));
    assert_ne!(q["Last write time"], "n/a");
}

#[test]
fn info_lists_the_transactions_of_a_crashed_image_and_never_writes_it() {
    let scratch = Scratch::new("info-crashed");
    let image = scratch.path("crashed.img");
    crashed_image(&image);

    let out = info_text(&image);
    let q = fields(&out);
    assert_eq!(q["Needs recovery"], "yes", "{out}");
    assert!(q["Filesystem features"].split(' ').any(|f| f == "needs_recovery"), "{out}");
    assert!(q["Journal start"].contains("not empty"), "{out}");
    assert_ne!(leading_number(&q["Journal start"]), 0, "{out}");
    assert_eq!(q["Journal format"], "v2, 64bit yes, checksum v3, revoke yes", "{out}");
    let listed: Vec<&str> =
        out.lines().filter(|l| l.trim_start().starts_with("transaction ")).collect();
    let count: usize = q["Journal transactions"].parse().unwrap();
    assert!(count >= 1, "{out}");
    assert_eq!(listed.len(), count, "{out}");
    assert!(out.contains("  end of log at journal block"), "{out}");

    if have("dumpe2fs", "info_lists_the_transactions_of_a_crashed_image (dumpe2fs part)") {
        let d = dumpe2fs_header(&image);
        for key in ["Filesystem state", "Filesystem features", "Journal features", "Mount count"] {
            assert_eq!(q.get(key), d.get(key), "{key}");
        }
        assert_eq!(leading_number(&q["Journal start"]), d["Journal start"].parse::<u64>().unwrap());
    }

    // The same transactions as `quill journal dump` (one shared description).
    let dump = run(quill().args(["journal", "dump"]).arg(&image));
    assert!(dump.status.success(), "{}", text(&dump));
    let dumped: Vec<String> = String::from_utf8_lossy(&dump.stdout)
        .lines()
        .filter(|l| l.starts_with("transaction "))
        .map(str::to_string)
        .collect();
    let listed: Vec<String> = listed.iter().map(|l| l.trim_start().to_string()).collect();
    assert_eq!(listed, dumped);

    // JSON: the same transactions, with their blocks.
    let j = info_json(&image);
    assert_eq!(j["needs_recovery"], true);
    assert_eq!(j["journal"]["empty"], false);
    let transactions = j["journal"]["transactions"].as_array().expect("transactions listed");
    assert_eq!(transactions.len(), count);
    let mut tids = Vec::new();
    for (t, line) in transactions.iter().zip(&listed) {
        let tid = t["tid"].as_u64().unwrap();
        let blocks = t["blocks"].as_u64().unwrap();
        assert!(blocks > 0, "{t}");
        assert!(t["commit_sec"].as_u64().unwrap() > 0, "{t}");
        let expected_start = format!("transaction {tid} at block {}: ", t["log_start"]);
        assert!(line.starts_with(&expected_start), "{line} vs {t}");
        assert!(line.contains(&format!(": {blocks} blocks, {} revokes", t["revokes"])), "{line}");
        assert!(line.ends_with(" UTC)"), "commit time as a date: {line}");
        tids.push(tid);
    }
    assert!(tids.windows(2).all(|w| w[1] == w[0] + 1), "consecutive tids: {tids:?}");
    assert_eq!(j["journal"]["start"].as_u64(), Some(leading_number(&q["Journal start"])));
    assert_eq!(j["journal"]["end_tid"].as_u64(), Some(tids.last().unwrap() + 1));

    // After `quill recover`, info reports a clean journal and no transactions.
    let o = run(quill().arg("recover").arg(&image));
    assert!(o.status.success(), "{}", text(&o));
    let q = fields(&info_text(&image));
    assert_eq!(q["Needs recovery"], "no");
    assert_eq!(q["Journal start"], "0 (empty)");
    assert!(!q.contains_key("Journal transactions"));
}

#[test]
fn info_describes_an_image_without_a_journal() {
    let scratch = Scratch::new("info-nojournal");
    let image = scratch.path("nojournal.img");
    let dev = FileDevice::create(&image, 32 << 20).unwrap();
    let mut features = fs::mkfs::Features::default();
    features.edit("^has_journal").unwrap();
    let options = fs::mkfs::MkfsOptions { device_zeroed: true, features, ..Default::default() };
    fs::mkfs::mkfs(&dev, &options).unwrap();
    drop(dev);
    let q = fields(&info_text(&image));
    assert_eq!(q["Journal"], "none");
    assert!(!q["Filesystem features"].contains("has_journal"));
    assert_eq!(q["Block size"], "4096");
    assert_eq!(q["Block count"], "8192");
    assert!(info_json(&image)["journal"].is_null());
}

#[test]
fn info_fails_on_bad_input_with_one_line_and_never_touches_the_image() {
    let scratch = Scratch::new("info-bad");
    let missing = scratch.path("missing.img");
    let junk = scratch.path("junk.img");
    std::fs::write(
        &junk,
        (0..1 << 20).map(|i: u32| (i.wrapping_mul(7919) >> 3) as u8).collect::<Vec<u8>>(),
    )
    .unwrap();
    let empty = scratch.path("empty.img");
    std::fs::write(&empty, b"").unwrap();
    for (image, what) in [(&missing, "missing"), (&junk, "not ext4"), (&empty, "empty")] {
        for json in [false, true] {
            let before = std::fs::read(image).ok();
            let mut cmd = quill();
            cmd.arg("info");
            if json {
                cmd.arg("--json");
            }
            let o = run(cmd.arg(image));
            assert_eq!(o.status.code(), Some(1), "{what}: {}", text(&o));
            assert!(o.stdout.is_empty(), "{what}: {}", text(&o));
            let stderr = String::from_utf8_lossy(&o.stderr);
            assert_eq!(stderr.trim_end().lines().count(), 1, "{what}: one line: {stderr}");
            assert!(stderr.starts_with("quill: "), "{what}: {stderr}");
            assert_eq!(std::fs::read(image).ok(), before, "{what}: the image was modified");
        }
    }
    assert!(!missing.exists(), "info must not create the image");
    let stderr = String::from_utf8_lossy(&run(quill().arg("info").arg(&junk)).stderr).into_owned();
    assert!(stderr.contains("not a usable ext4 image"), "{stderr}");

    // Usage errors: exit status 2.
    for args in [&["info"][..], &["info", "--bogus", "x.img"][..], &["info", "a.img", "b.img"][..]]
    {
        let o = run(quill().args(args));
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
    }
}

#[test]
fn info_help_describes_the_command() {
    let o = run(quill().args(["info", "--help"]));
    assert!(o.status.success(), "{}", text(&o));
    let help = String::from_utf8_lossy(&o.stdout);
    for needle in ["--json", "IMAGE", "dumpe2fs", "needs recovery", "only read"] {
        assert!(help.contains(needle), "--help should mention '{needle}':\n{help}");
    }
    let o = run(quill().arg("--help"));
    assert!(String::from_utf8_lossy(&o.stdout).contains("info"), "{}", text(&o));
}
