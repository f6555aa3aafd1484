//! Behaviour: `fs::mkfs::mkfs` makes the image `mkfs.ext4` (e2fsprogs 1.47.0) makes.
//!
//! The strongest check is byte equality: with the same UUID, hash seed and clock
//! (`E2FSPROGS_FAKE_TIME`), and a sparse file (which mke2fs discards, so it skips zeroing the
//! inode tables just as quill does with `device_zeroed`), the two images must be identical except
//! for the fields listed in [`ALLOWED_DIFFERENCES`]. On top of that every image quill writes must
//! pass `e2fsck -fn` without a message, show the expected geometry in `dumpe2fs -h`, and open
//! with `fs::Ext4Image`. A kernel test loop-mounts an image, writes to it, and checks it again.
//!
//! Without e2fsprogs the tests print `SKIP: <reason>` and return; without root or loop devices
//! the kernel test does the same.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use blockdev::file::{FileDevice, FileOptions};
use blockdev::memory::MemDevice;
use blockdev::BlockDevice;
use fs::mkfs::{mkfs, mkfs_with_progress, Features, MkfsOptions, MkfsReport};
use fs::{Ext4Image, FsError};

const UUID: &str = "11111111-2222-4333-8444-555555555555";
const HASH_SEED: &str = "66666666-7777-4888-9999-aaaaaaaaaaaa";
const FAKE_TIME: u64 = 1_700_000_000;

/// Where the images may differ, as (offset inside the structure, length, why):
/// - every superblock copy: `s_kbytes_written` counts what each tool's I/O layer wrote, and the
///   checksum covers it;
/// - the journal superblock: quill sets the features the kernel adds on first mount (64bit,
///   csum v3 with metadata_csum), its checksum type and checksum.
const SUPERBLOCK_DIFFERENCES: [(u64, u64, &str); 2] =
    [(0x178, 8, "s_kbytes_written"), (0x3FC, 4, "s_checksum")];
const JOURNAL_SB_DIFFERENCES: [(u64, u64, &str); 3] =
    [(0x24, 12, "journal features"), (0x50, 1, "journal checksum type"), (0xFC, 4, "checksum")];

/// Bytes of a 1 MiB.
const MIB: u64 = 1 << 20;

fn have(tool: &str) -> bool {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        println!("SKIP: {tool} is not installed");
    }
    found
}

fn tools_present() -> bool {
    ["mkfs.ext4", "e2fsck", "dumpe2fs", "cmp"].iter().all(|t| have(t))
}

/// A directory under /tmp, unique per process and test, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("quill-mkfs-{}-{n}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
    fn path(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::env::var_os("QUILL_MKFS_KEEP").is_some() {
            println!("kept {}", self.0.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// One configuration of the matrix.
#[derive(Debug, Clone)]
struct Case {
    /// `-t`: ext2, ext3 or ext4 (mke2fs.conf's feature sets).
    fs_type: &'static str,
    size: u64,
    block_size: u32,
    /// A `-O` list applied to both tools ("" for the defaults).
    features: &'static str,
    /// `-J size=MIB,fast_commit_size=KIB`, either left out when `None`.
    journal: (Option<u64>, Option<u64>),
    /// `-C` (bigalloc's cluster size in bytes), left out when `None`.
    cluster: Option<u32>,
}

impl Case {
    fn name(&self) -> String {
        let mut name = format!(
            "{}-{}MiB-{}-{}",
            self.fs_type,
            self.size / MIB,
            self.block_size,
            self.features
        );
        if let Some(arg) = self.journal_arg() {
            name += &format!("-J{arg}");
        }
        if let Some(cluster) = self.cluster {
            name += &format!("-C{cluster}");
        }
        name
    }

    /// mkfs.ext4's `-J` argument, if the case has one.
    fn journal_arg(&self) -> Option<String> {
        let mut parts = Vec::new();
        if let Some(mib) = self.journal.0 {
            parts.push(format!("size={mib}"));
        }
        if let Some(kib) = self.journal.1 {
            parts.push(format!("fast_commit_size={kib}"));
        }
        (!parts.is_empty()).then(|| parts.join(","))
    }

    fn options(&self) -> MkfsOptions {
        let mut features = Features::for_fs_type(self.fs_type).unwrap();
        features.edit(self.features).unwrap();
        MkfsOptions {
            block_size: self.block_size,
            size_bytes: Some(self.size),
            features,
            uuid: fs::mkfs::parse_uuid(UUID),
            hash_seed: fs::mkfs::parse_uuid(HASH_SEED),
            now: Some(FAKE_TIME),
            device_zeroed: true,
            cluster_size: self.cluster,
            journal_blocks: self
                .journal
                .0
                .map(|mib| (mib * MIB / u64::from(self.block_size)) as u32),
            // mke2fs: 0 KiB asks for nothing; less than a block asks for an empty area.
            fast_commit_blocks: self
                .journal
                .1
                .filter(|&kib| kib > 0)
                .map(|kib| (kib * 1024 / u64::from(self.block_size)) as u32),
            ..MkfsOptions::default()
        }
    }
}

/// Formats `path` (a new sparse file of the case's size) with quill.
fn quill_mkfs(path: &Path, case: &Case) -> Result<MkfsReport, FsError> {
    let dev = FileDevice::create(path, case.size).unwrap();
    mkfs(&dev, &case.options())
}

/// Formats `path` (a new sparse file) with mkfs.ext4 under the same UUID, seed and clock.
fn stock_mkfs(path: &Path, case: &Case) -> Output {
    std::fs::File::create(path).unwrap().set_len(case.size).unwrap();
    let mut cmd = Command::new("mkfs.ext4");
    cmd.env("E2FSPROGS_FAKE_TIME", FAKE_TIME.to_string())
        .args(["-q", "-F", "-t", case.fs_type, "-b", &case.block_size.to_string(), "-U", UUID])
        .args(["-E", &format!("hash_seed={HASH_SEED},lazy_itable_init=1")]);
    if !case.features.is_empty() {
        cmd.args(["-O", case.features]);
    }
    if let Some(arg) = case.journal_arg() {
        cmd.args(["-J", &arg]);
    }
    if let Some(cluster) = case.cluster {
        cmd.args(["-C", &cluster.to_string()]);
    }
    run(cmd.arg(path).arg(format!("{}k", case.size / 1024)))
}

/// `e2fsck -fn` must exit 0 and report nothing beyond its pass banners and summary.
fn assert_e2fsck_clean(path: &Path, what: &str) {
    if std::env::var_os("QUILL_MKFS_NO_FSCK").is_some() {
        return;
    }
    let o = run(Command::new("e2fsck").arg("-fn").arg(path));
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{what}: e2fsck -fn is not clean:\n{out}");
    for line in out.lines() {
        let expected = line.starts_with("Pass ")
            || line.starts_with("e2fsck ")
            || line.contains(" files (")
            || line.trim().is_empty();
        assert!(expected, "{what}: unexpected e2fsck output line {line:?}:\n{out}");
    }
}

/// `dumpe2fs -h` fields as key → value.
fn dumpe2fs_header(path: &Path) -> BTreeMap<String, String> {
    let o = run(Command::new("dumpe2fs").arg("-h").arg(path));
    assert!(o.status.success(), "dumpe2fs failed: {}", text(&o));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|line| line.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// The `dumpe2fs -h` fields that must match mkfs.ext4's for the same options.
const GEOMETRY_FIELDS: [&str; 13] = [
    "Filesystem features",
    "Block count",
    "Inode count",
    "Block size",
    "Blocks per group",
    "Inodes per group",
    "Inode blocks per group",
    "Reserved GDT blocks",
    "Reserved block count",
    "Free blocks",
    "Free inodes",
    "Overhead clusters",
    "Total journal blocks",
];

/// Byte offsets where `a` and `b` differ, from `cmp -l` (at most `limit`).
fn differing_bytes(a: &Path, b: &Path, limit: usize) -> Vec<u64> {
    let o = run(Command::new("sh").arg("-c").arg(format!(
        "cmp -l '{}' '{}' | head -n {limit}",
        a.display(),
        b.display()
    )));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next()?.parse::<u64>().ok())
        .map(|one_based| one_based - 1)
        .collect()
}

/// Where each superblock copy and the journal superblock live in `image`.
fn allowed_regions(image: &Path, report: &MkfsReport) -> Vec<(u64, u64, &'static str)> {
    let bs = u64::from(report.block_size);
    let mut regions = Vec::new();
    let mut superblocks = vec![1024u64];
    superblocks.extend(report.backup_superblocks.iter().map(|b| b * bs));
    for at in superblocks {
        regions.extend(SUPERBLOCK_DIFFERENCES.iter().map(|&(o, l, w)| (at + o, l, w)));
    }
    let dev: Arc<dyn BlockDevice> =
        Arc::new(FileDevice::open(image, FileOptions::read_only()).unwrap());
    let mmp_block = Ext4Image::open(dev.clone()).unwrap().superblock().mmp_block;
    if mmp_block != 0 {
        // ext2fs_mmp_reset records the host's and the device's names, ext2fs_mmp_stop the
        // real time (and so its checksum differs).
        let at = mmp_block * bs;
        regions.extend([
            (at + 0x8, 8, "mmp_time"),
            (at + 0x10, 64, "mmp_nodename"),
            (at + 0x50, 32, "mmp_bdevname"),
            (at + 0x3FC, 4, "mmp_checksum"),
        ]);
    }
    if report.journal_blocks > 0 {
        let location = Ext4Image::open(dev).unwrap().journal_location().unwrap();
        let at = location.device_offset(0).unwrap();
        regions.extend(JOURNAL_SB_DIFFERENCES.iter().map(|&(o, l, w)| (at + o, l, w)));
    }
    regions
}

/// Formats the case with both tools and returns a list of problems (empty when all is well).
fn check_case(scratch: &Scratch, case: &Case) -> Vec<String> {
    let name = case.name();
    let ours = scratch.path(&format!("{name}.quill"));
    let theirs = scratch.path(&format!("{name}.stock"));
    let stock = stock_mkfs(&theirs, case);
    let report = match quill_mkfs(&ours, case) {
        Ok(report) => report,
        Err(err) => {
            let _ = std::fs::remove_file(&theirs);
            return if stock.status.success() {
                vec![format!("{name}: quill refused ({err}) but mkfs.ext4 formatted it")]
            } else {
                // Both refuse (a size too small for these options): agreement.
                Vec::new()
            };
        }
    };
    let mut problems = Vec::new();
    if !stock.status.success() {
        problems.push(format!("{name}: mkfs.ext4 refused but quill formatted: {}", text(&stock)));
        return problems;
    }
    assert_e2fsck_clean(&ours, &name);
    let dev: Arc<dyn BlockDevice> =
        Arc::new(FileDevice::open(&ours, FileOptions::default()).unwrap());
    let image = Ext4Image::open(dev).unwrap_or_else(|e| panic!("{name}: Ext4Image::open: {e}"));
    assert_eq!(image.superblock().blocks_count, report.blocks_count, "{name}");
    let (q, s) = (dumpe2fs_header(&ours), dumpe2fs_header(&theirs));
    for field in GEOMETRY_FIELDS {
        if q.get(field) != s.get(field) {
            problems.push(format!(
                "{name}: dumpe2fs '{field}': quill {:?}, mkfs.ext4 {:?}",
                q.get(field),
                s.get(field)
            ));
        }
    }
    let allowed = allowed_regions(&ours, &report);
    let unexplained: Vec<u64> = differing_bytes(&ours, &theirs, 100_000)
        .into_iter()
        .filter(|&at| !allowed.iter().any(|&(start, len, _)| (start..start + len).contains(&at)))
        .collect();
    if let Some(&first) = unexplained.first() {
        let bs = u64::from(case.block_size);
        let blocks: Vec<u64> = unexplained
            .iter()
            .map(|b| b / bs)
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .take(12)
            .collect();
        problems.push(format!(
            "{name}: {} unexplained differing bytes, first at byte {first} (block {}, offset {:#x}); blocks {blocks:?}",
            unexplained.len(),
            first / bs,
            first % bs
        ));
    }
    if std::env::var_os("QUILL_MKFS_KEEP").is_none() {
        let _ = std::fs::remove_file(&ours);
        let _ = std::fs::remove_file(&theirs);
    }
    problems
}

fn check_matrix(name: &str, cases: &[Case]) {
    if !tools_present() {
        return;
    }
    let scratch = Scratch::new(name);
    let problems: Vec<String> = cases.iter().flat_map(|case| check_case(&scratch, case)).collect();
    assert!(problems.is_empty(), "{} problems:\n{}", problems.len(), problems.join("\n"));
}

fn cases(sizes: &[u64], block_sizes: &[u32], features: &[&'static str]) -> Vec<Case> {
    let mut out = Vec::new();
    for &size in sizes {
        for &block_size in block_sizes {
            for &features in features {
                out.push(Case {
                    fs_type: "ext4",
                    size: size * MIB,
                    block_size,
                    features,
                    journal: (None, None),
                    cluster: None,
                });
            }
        }
    }
    out
}

/// `-t ext3` and `-t ext2` (mke2fs.conf's base features, with has_journal for ext3): root,
/// lost+found and the journal mapped by indirect blocks, placed as mke2fs places them; with
/// feature variants on top (`extent` turned on or off by `-O` too).
#[test]
fn ext2_and_ext3_images_are_byte_identical_to_mke2fs() {
    let mut all = Vec::new();
    for fs_type in ["ext2", "ext3"] {
        for mut case in cases(&[8, 64, 300], &[1024, 2048, 4096, 65536], &["", "^resize_inode"]) {
            case.fs_type = fs_type;
            all.push(case);
        }
    }
    // (mke2fs refuses the first: 64bit needs extent; so must quill.)
    let variants = [
        "^extent",
        "^extent,^64bit",
        "^extent,^flex_bg,^metadata_csum,^64bit",
        "^extent,^has_journal,^64bit",
    ];
    all.extend(cases(&[64, 300], &[1024, 4096], &variants));
    for mut case in cases(&[64], &[1024], &["extent,flex_bg"]) {
        case.fs_type = "ext3";
        all.push(case);
    }
    // Quota files mapped by direct blocks.
    for mut case in cases(&[64], &[1024, 4096], &["quota"]) {
        case.fs_type = "ext3";
        all.push(case);
    }
    // A 100 MiB journal with 1 KiB blocks reaches its triple-indirect block (past 65,804).
    for mut case in cases(&[300], &[1024], &[""]) {
        (case.fs_type, case.journal) = ("ext3", (Some(100), None));
        all.push(case);
    }
    check_matrix("ext2-ext3", &all);
}

#[test]
fn default_images_are_byte_identical_to_mkfs_ext4_for_every_block_size() {
    check_matrix("defaults", &cases(&[8, 64, 300], &[1024, 2048, 4096, 65536], &[""]));
}

#[test]
fn two_gib_images_are_byte_identical_to_mkfs_ext4() {
    check_matrix("2gib", &cases(&[2048], &[1024, 4096], &[""]));
}

#[test]
fn feature_variants_are_byte_identical_to_mkfs_ext4() {
    let features = [
        "^metadata_csum",
        "^64bit",
        "^resize_inode",
        "^flex_bg",
        "^metadata_csum,uninit_bg",
        "^sparse_super,^resize_inode",
        "orphan_file",
        "metadata_csum_seed,orphan_file",
        "^has_journal",
        "^metadata_csum,^64bit,^flex_bg",
        "fast_commit",
        "fast_commit,^metadata_csum",
        "fast_commit,^has_journal",
        "large_dir",
        "mmp",
        "mmp,^metadata_csum,orphan_file",
        "meta_bg,^resize_inode",
        "meta_bg,^resize_inode,^64bit,^flex_bg",
        "meta_bg",
        "project",
        "inline_data",
        "inline_data,^metadata_csum,^has_journal",
        "ea_inode",
        "ea_inode,inline_data,^metadata_csum",
        "quota",
        "quota,project",
        "quota,project,orphan_file,^metadata_csum",
        "quota,^has_journal,inline_data",
    ];
    check_matrix("features", &cases(&[64, 300], &[1024, 4096], &features));
}

/// `-J size=` and `-J fast_commit_size=` as mke2fs counts them: KiB rounded down to blocks
/// (less than a block is an empty area, 0 the default), added to the log, and ignored without
/// fast_commit.
#[test]
fn fast_commit_areas_sized_by_j_options_are_byte_identical_to_mkfs_ext4() {
    let mut cases = Vec::new();
    for (features, journal) in [
        ("fast_commit", (None, Some(401))),
        ("fast_commit", (None, Some(0))),
        ("fast_commit", (None, Some(1))),
        ("fast_commit", (Some(16), Some(8))),
        ("fast_commit", (Some(4), Some(4096))),
        ("", (None, Some(400))),
    ] {
        for block_size in [1024, 4096] {
            cases.push(Case {
                fs_type: "ext4",
                size: 300 * MIB,
                block_size,
                features,
                journal,
                cluster: None,
            });
        }
    }
    check_matrix("fast-commit", &cases);
}

#[test]
fn large_sparse_image_formats_in_seconds_and_checks_clean() {
    if !tools_present() {
        return;
    }
    let scratch = Scratch::new("large");
    let path = scratch.path("large.img");
    let case = Case {
        fs_type: "ext4",
        size: 64 << 30,
        block_size: 4096,
        features: "",
        journal: (None, None),
        cluster: None,
    };
    let started = std::time::Instant::now();
    let dev = FileDevice::create(&path, case.size).unwrap();
    let mut calls = 0;
    let report = mkfs_with_progress(&dev, &case.options(), &mut |p| {
        calls += 1;
        assert!(p.bytes_done <= p.bytes_total);
    })
    .unwrap();
    println!(
        "64 GiB formatted in {:?} ({} bytes written)",
        started.elapsed(),
        report.bytes_written
    );
    assert!(calls > 0, "progress was never reported");
    assert_eq!(report.journal_blocks, 131072);
    assert_e2fsck_clean(&path, "64 GiB");
    let stock = scratch.path("stock.img");
    let out = stock_mkfs(&stock, &case);
    assert!(out.status.success(), "{}", text(&out));
    let (q, s) = (dumpe2fs_header(&path), dumpe2fs_header(&stock));
    for field in GEOMETRY_FIELDS {
        assert_eq!(q.get(field), s.get(field), "dumpe2fs '{field}'");
    }
}

/// Full `dumpe2fs` and `debugfs stat` of the journal, without the lines that differ by design
/// (superblock checksum, lifetime writes, journal features and checksum).
fn metadata_listing(path: &Path) -> Vec<String> {
    let dump = run(Command::new("dumpe2fs").arg(path));
    let journal = run(Command::new("debugfs").args(["-R", "stat <8>"]).arg(path));
    let skip = ["Checksum:", "Lifetime writes:", "Journal features:", "Journal checksum"];
    String::from_utf8_lossy(&dump.stdout)
        .lines()
        .chain(String::from_utf8_lossy(&journal.stdout).lines())
        .filter(|line| !skip.iter().any(|s| line.starts_with(s)))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_journal_with_more_than_four_extents_gets_the_same_extent_leaf_as_mkfs_ext4() {
    // 160 GiB: a 1 GiB journal in eight 32768-block extents, so its tree needs a leaf block.
    // The images are too large to compare byte by byte; every group and the journal's extent
    // tree are compared through dumpe2fs and debugfs instead.
    if !tools_present() || !have("debugfs") {
        return;
    }
    let scratch = Scratch::new("leaf");
    let case = Case {
        fs_type: "ext4",
        size: 160 << 30,
        block_size: 4096,
        features: "",
        journal: (None, None),
        cluster: None,
    };
    let (ours, theirs) = (scratch.path("leaf.quill"), scratch.path("leaf.stock"));
    let report = quill_mkfs(&ours, &case).unwrap();
    assert_eq!(report.journal_blocks, 262_144);
    assert_e2fsck_clean(&ours, "160 GiB");
    let out = stock_mkfs(&theirs, &case);
    assert!(out.status.success(), "{}", text(&out));
    let (q, s) = (metadata_listing(&ours), metadata_listing(&theirs));
    assert!(q.iter().any(|l| l.contains("(ETB0)")), "no extent leaf in {q:?}");
    for (a, b) in q.iter().zip(&s) {
        assert_eq!(a, b);
    }
    assert_eq!(q.len(), s.len());
}

#[test]
fn a_device_that_is_not_zeroed_gets_lazy_inode_tables_and_checks_clean() {
    if !tools_present() {
        return;
    }
    let scratch = Scratch::new("dirty");
    let path = scratch.path("dirty.img");
    let size = 64 * MIB;
    // Fill the first 8 MiB with garbage, as an old file system would leave it.
    let garbage: Vec<u8> =
        (0..8 * MIB as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(&path, &garbage).unwrap();
    std::fs::File::options().write(true).open(&path).unwrap().set_len(size).unwrap();
    let dev = FileDevice::open(&path, FileOptions::default()).unwrap();
    let mut opts = Case {
        fs_type: "ext4",
        size,
        block_size: 1024,
        features: "",
        journal: (None, None),
        cluster: None,
    }
    .options();
    opts.device_zeroed = false;
    mkfs(&dev, &opts).unwrap();
    assert_e2fsck_clean(&path, "not zeroed");
    let dump = run(Command::new("dumpe2fs").arg(&path));
    let out = String::from_utf8_lossy(&dump.stdout);
    assert!(!out.contains("ITABLE_ZEROED"), "groups must not claim zeroed inode tables");
}

#[test]
fn every_feature_outside_the_supported_list_is_refused_by_name() {
    let mut features = Features::default();
    for name in ["casefold", "encrypt", "verity"] {
        let err = features.edit(name).unwrap_err().to_string();
        assert!(err.contains(name.trim_start_matches('^')), "{name}: {err}");
    }
    // Editable, but only without 64bit (mke2fs's rule), and named where refused.
    features.edit("^extent").unwrap();
    let dev = MemDevice::new(64 * MIB);
    let opts = MkfsOptions { features, device_zeroed: true, ..MkfsOptions::default() };
    let err = mkfs(&dev, &opts).unwrap_err().to_string();
    assert!(err.contains("64bit") && err.contains("extent"), "{err}");
    assert_eq!(
        Features::default().names().join(" "),
        "has_journal ext_attr resize_inode dir_index filetype extent 64bit flex_bg \
         sparse_super large_file huge_file dir_nlink extra_isize metadata_csum"
    );
}

#[test]
fn bad_options_are_refused_before_anything_is_written() {
    let dev = MemDevice::new(64 * MIB);
    let base = Case {
        fs_type: "ext4",
        size: 64 * MIB,
        block_size: 4096,
        features: "",
        journal: (None, None),
        cluster: None,
    }
    .options();
    let mut project = base.features;
    project.edit("project").unwrap();
    let mut inline_data = base.features;
    inline_data.edit("inline_data").unwrap();
    let bad: [(&str, MkfsOptions); 9] = [
        ("block size 3000", MkfsOptions { block_size: 3000, ..base.clone() }),
        ("inode size 100", MkfsOptions { inode_size: 100, ..base.clone() }),
        ("reserved 60%", MkfsOptions { reserved_percent: 60.0, ..base.clone() }),
        ("inode ratio 512", MkfsOptions { inode_ratio: Some(512), ..base.clone() }),
        ("journal of 10 blocks", MkfsOptions { journal_blocks: Some(10), ..base.clone() }),
        ("label too long", MkfsOptions { label: "x".repeat(17), ..base.clone() }),
        ("bigger than the device", MkfsOptions { size_bytes: Some(128 * MIB), ..base.clone() }),
        (
            "project with 128-byte inodes",
            MkfsOptions { features: project, inode_size: 128, ..base.clone() },
        ),
        (
            "inline_data with 128-byte inodes",
            MkfsOptions { features: inline_data, inode_size: 128, ..base.clone() },
        ),
    ];
    for (what, opts) in bad {
        assert!(mkfs(&dev, &opts).is_err(), "{what} was accepted");
    }
    assert!(dev.snapshot().iter().all(|&b| b == 0), "a refused mkfs wrote to the device");
}

/// Whether the kernel can loop-mount images here (root, mount, losetup, a loop device).
fn kernel_mount_available() -> Option<String> {
    if !have("mount") || !have("losetup") {
        return Some("mount or losetup is missing".into());
    }
    let id = run(Command::new("id").arg("-u"));
    if String::from_utf8_lossy(&id.stdout).trim() != "0" {
        return Some("not running as root".into());
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("no /dev/loop-control".into());
    }
    None
}

#[test]
fn the_kernel_mounts_a_quill_image_writes_to_it_and_leaves_it_clean() {
    if !tools_present() {
        return;
    }
    if let Some(reason) = kernel_mount_available() {
        println!("SKIP: {reason}");
        return;
    }
    let scratch = Scratch::new("kernel");
    for block_size in [1024u32, 4096] {
        let path = scratch.path(&format!("kernel-{block_size}.img"));
        let case = Case {
            fs_type: "ext4",
            size: 64 * MIB,
            block_size,
            features: "",
            journal: (None, None),
            cluster: None,
        };
        quill_mkfs(&path, &case).unwrap();
        let mnt = scratch.path(&format!("mnt-{block_size}"));
        std::fs::create_dir_all(&mnt).unwrap();
        let o = run(Command::new("mount").args(["-o", "loop"]).arg(&path).arg(&mnt));
        if !o.status.success() {
            println!("SKIP: mount -o loop failed: {}", text(&o).trim());
            return;
        }
        let written = (|| -> std::io::Result<()> {
            std::fs::create_dir_all(mnt.join("dir/sub"))?;
            for i in 0..200 {
                std::fs::write(mnt.join(format!("dir/file-{i}")), vec![i as u8; 3000 + i * 97])?;
            }
            std::fs::write(mnt.join("dir/sub/big"), vec![7u8; 5 << 20])?;
            std::fs::remove_file(mnt.join("dir/file-3"))?;
            Ok(())
        })();
        let sync = run(&mut Command::new("sync"));
        let umount = run(Command::new("umount").arg(&mnt));
        written.unwrap();
        assert!(sync.status.success() && umount.status.success(), "umount: {}", text(&umount));
        assert_e2fsck_clean(&path, &format!("after a kernel mount ({block_size})"));
        println!("kernel mounted, wrote to and unmounted a {block_size}-byte-block quill image");
    }
}

/// bigalloc (`-O bigalloc [-C SIZE]`): the tables placed block by block, then everything in
/// clusters (bitmaps, free counts, root, lost+found filling its cluster, the resize inode's
/// and journal's i_blocks in clusters, `s_overhead_clusters`): byte for byte as mke2fs, with
/// 1, 4 and 64 KiB blocks, the default 16-block clusters and others, one group and many.
#[test]
fn bigalloc_images_are_byte_identical_to_mke2fs() {
    let mut all = Vec::new();
    for (size, block_size, cluster) in [
        (64, 4096, None),
        (64, 4096, Some(16384)),
        (300, 4096, Some(65536)),
        (64, 1024, None),
        (300, 1024, Some(4096)),
        (8, 1024, Some(2048)),
        (160, 65536, None),
        (64, 2048, Some(8192)),
    ] {
        for features in [
            "bigalloc",
            "bigalloc,^metadata_csum",
            "bigalloc,^has_journal",
            "bigalloc,quota,project,orphan_file",
            "bigalloc,inline_data,mmp",
            "bigalloc,meta_bg,^resize_inode",
        ] {
            all.push(Case {
                fs_type: "ext4",
                size: size * MIB,
                block_size,
                features,
                journal: (None, None),
                cluster,
            });
        }
    }
    check_matrix("mkfs-bigalloc", &all);
}
