//! Behaviour: `fs::dir` and the Linux kernel agree about ext4 directories.
//!
//! For 4 KiB and 1 KiB blocks with mkfs.ext4's default features (metadata_csum, dir_index) and
//! for 1 KiB blocks without dir_index, the kernel builds, on a loop mount, a directory of about
//! 3000 varied names (an htree: two index levels at 1 KiB; a linear directory of many blocks
//! without dir_index), removes a sixth of them and adds more, plus a small one-block directory.
//! Then, with the image unmounted:
//! - quill reads both directories through `fs::dir` over the image: every name is found with
//!   its inode and file type, readdir returns exactly the set of names, every block's checksum
//!   verifies;
//! - quill replays the same operations on an empty in-memory directory and gets the kernel's
//!   layout (same blocks, records, offsets and index entries), writes its blocks over the
//!   kernel's, and `e2fsck -fn` and the kernel accept the result.
//!
//! Needs root, mkfs.ext4, e2fsck, mount and umount with loop devices; otherwise it prints
//! `SKIP: <reason>` and returns. Images live in a temporary directory under /tmp that is removed
//! on drop; a mount is unmounted on drop, so a failed assertion does not leave one behind.

mod common;

use common::{Rng, Scratch};

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use blockdev::file::{FileDevice, FileOptions};
use blockdev::BlockDevice;
use fs::dir::{self, DirCtx, DirEntryInfo, DirIo, READDIR_START};
use fs::{Ext4Image, FsError};
use ondisk::ext4::dir::{self as dirent, FT_DIR, FT_REG_FILE, FT_SYMLINK};
use ondisk::ext4::htree;
use ondisk::ext4::{self, feature, Extent};

/// `i_flags`: the directory has a hashed index.
const INDEX_FL: u32 = 0x1000;

/// Why this machine cannot run the test, if it cannot.
fn skip_reason() -> Option<String> {
    match std::fs::metadata("/proc/self") {
        Ok(meta) if meta.uid() == 0 => {}
        Ok(_) => return Some("not running as root (loop mounts need it)".to_string()),
        Err(err) => return Some(format!("cannot tell who we are: {err}")),
    }
    for tool in ["mkfs.ext4", "e2fsck", "mount", "umount"] {
        if Command::new(tool).arg("-V").output().is_err() {
            return Some(format!("{tool} is not installed"));
        }
    }
    None
}

/// A loop mount, unmounted on drop (or explicitly, checking that it worked).
struct Mount {
    point: PathBuf,
    mounted: bool,
}

impl Mount {
    fn new(image: &Path, point: &Path) -> Result<Mount, String> {
        std::fs::create_dir_all(point).unwrap();
        let out = Command::new("mount")
            .args(["-t", "ext4", "-o", "loop"])
            .arg(image)
            .arg(point)
            .output()
            .map_err(|err| err.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(Mount { point: point.to_path_buf(), mounted: true })
    }

    fn unmount(mut self) {
        self.mounted = false;
        run("umount", &[self.point.as_os_str()]);
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg(&self.point).status();
        }
    }
}

fn run(tool: &str, args: &[&OsStr]) -> String {
    let out = Command::new(tool).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{tool} {args:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Varied names: mostly 4..40 bytes, some up to 255; ASCII, UTF-8 and raw bytes >= 0x80.
fn random_name(rng: &mut Rng, taken: &mut HashSet<Vec<u8>>) -> Vec<u8> {
    const PIECES: [&str; 8] = ["é", "日本", "ß", "-", "_", ".", "~", "ü"];
    loop {
        let len = match rng.below(10) {
            0 => 120 + rng.below(136),
            1 | 2 => 40 + rng.below(80),
            _ => 4 + rng.below(36),
        } as usize;
        let mut name = Vec::with_capacity(len);
        while name.len() < len {
            match rng.below(10) {
                0 => name.extend_from_slice(PIECES[rng.below(8) as usize].as_bytes()),
                1 => name.push(0x80 + rng.below(128) as u8),
                _ => name.push(b"abcdefghijklmnopqrstuvwxyz0123456789"[rng.below(36) as usize]),
            }
        }
        name.truncate(len);
        if name != b"." && name != b".." && taken.insert(name.clone()) {
            return name;
        }
    }
}

/// One directory operation, as the kernel was asked to do it (so quill can replay it).
enum Op {
    Add(Vec<u8>, u32, u8),
    Remove(Vec<u8>),
}

fn file_type_of(meta: &std::fs::Metadata) -> u8 {
    let kind = meta.file_type();
    if kind.is_dir() {
        FT_DIR
    } else if kind.is_symlink() {
        FT_SYMLINK
    } else {
        FT_REG_FILE
    }
}

/// Creates `name` in `dir` (a file, every 40th a directory, every 60th a symlink) and returns
/// the operation with the inode the kernel gave it.
fn kernel_create(dir: &Path, name: &[u8], n: usize) -> Op {
    let path = dir.join(OsStr::from_bytes(name));
    if n % 40 == 39 {
        std::fs::create_dir(&path).unwrap();
    } else if n % 60 == 59 {
        std::os::unix::fs::symlink("target", &path).unwrap();
    } else {
        std::fs::File::create(&path).unwrap();
    }
    let meta = std::fs::symlink_metadata(&path).unwrap();
    Op::Add(name.to_vec(), meta.ino() as u32, file_type_of(&meta))
}

fn kernel_remove(dir: &Path, name: &[u8]) -> Op {
    let path = dir.join(OsStr::from_bytes(name));
    if std::fs::symlink_metadata(&path).unwrap().is_dir() {
        std::fs::remove_dir(&path).unwrap();
    } else {
        std::fs::remove_file(&path).unwrap();
    }
    Op::Remove(name.to_vec())
}

/// The names an operation sequence leaves, with inode and file type.
fn outcome(ops: &[Op]) -> BTreeMap<Vec<u8>, (u32, u8)> {
    let mut names = BTreeMap::new();
    for op in ops {
        match op {
            Op::Add(name, ino, ft) => assert!(names.insert(name.clone(), (*ino, *ft)).is_none()),
            Op::Remove(name) => assert!(names.remove(name).is_some()),
        }
    }
    names
}

/// A read-only [`DirIo`] over a directory of an unmounted image.
struct ImageDir<'a> {
    image: &'a Ext4Image,
    block_size: usize,
    blocks: u32,
    extents: Vec<Extent>,
    indexed: bool,
}

impl<'a> ImageDir<'a> {
    fn open(image: &'a Ext4Image, ino: u32) -> (ImageDir<'a>, DirCtx) {
        let inode = image.read_inode(ino).unwrap();
        let sb = image.superblock();
        let block_size = image.block_size() as usize;
        let io = ImageDir {
            image,
            block_size,
            blocks: (inode.size / block_size as u64) as u32,
            extents: image.extents(ino, &inode).unwrap(),
            indexed: inode.flags & INDEX_FL != 0,
        };
        let ctx = DirCtx {
            ino,
            csum_seed: sb
                .has_metadata_csum()
                .then(|| ext4::inode_csum_seed(sb, ino, inode.generation)),
            dir_index: sb.feature_compat & feature::COMPAT_DIR_INDEX != 0,
            largedir: sb.feature_incompat & feature::INCOMPAT_LARGEDIR != 0,
            hash_version: sb.effective_hash_version(),
            hash_seed: sb.hash_seed,
        };
        (io, ctx)
    }

    fn physical(&self, lblk: u32) -> Option<u64> {
        self.extents
            .iter()
            .find(|e| lblk >= e.logical && u64::from(lblk) < e.logical_end())
            .map(|e| e.start + u64::from(lblk - e.logical))
    }
}

impl DirIo for ImageDir<'_> {
    fn block_size(&self) -> usize {
        self.block_size
    }
    fn dir_blocks(&self) -> u32 {
        self.blocks
    }
    fn read_dir_block(&mut self, lblk: u32) -> Result<Vec<u8>, FsError> {
        match self.physical(lblk) {
            Some(block) => self.image.read_block(block),
            None => Err(FsError::Corrupted { block: 0, reason: format!("hole at {lblk}") }),
        }
    }
    fn write_dir_block(&mut self, _: u32, _: &[u8]) -> Result<(), FsError> {
        Err(FsError::ReadOnly)
    }
    fn append_dir_block(&mut self) -> Result<u32, FsError> {
        Err(FsError::ReadOnly)
    }
    fn physical_block(&mut self, lblk: u32) -> u64 {
        self.physical(lblk).unwrap_or(0)
    }
    fn indexed(&self) -> bool {
        self.indexed
    }
    fn set_indexed(&mut self, _: bool) {
        // Every path that changes the flag writes a block first, which fails here.
    }
}

/// An in-memory [`DirIo`] for quill's replay.
struct MemDir {
    block_size: usize,
    blocks: Vec<Vec<u8>>,
    indexed: bool,
}

impl DirIo for MemDir {
    fn block_size(&self) -> usize {
        self.block_size
    }
    fn dir_blocks(&self) -> u32 {
        self.blocks.len() as u32
    }
    fn read_dir_block(&mut self, lblk: u32) -> Result<Vec<u8>, FsError> {
        Ok(self.blocks[lblk as usize].clone())
    }
    fn write_dir_block(&mut self, lblk: u32, data: &[u8]) -> Result<(), FsError> {
        self.blocks[lblk as usize] = data.to_vec();
        Ok(())
    }
    fn append_dir_block(&mut self) -> Result<u32, FsError> {
        self.blocks.push(vec![0; self.block_size]);
        Ok(self.blocks.len() as u32 - 1)
    }
    fn physical_block(&mut self, _: u32) -> u64 {
        0
    }
    fn indexed(&self) -> bool {
        self.indexed
    }
    fn set_indexed(&mut self, on: bool) {
        self.indexed = on;
    }
}

fn list_all(io: &mut dyn DirIo, ctx: &DirCtx, rng: &mut Rng) -> Vec<DirEntryInfo> {
    let mut cookie = READDIR_START;
    let mut all = Vec::new();
    loop {
        let batch = dir::read_dir(io, ctx, cookie, 1 + rng.below(300) as usize).unwrap();
        let Some(last) = batch.last() else { return all };
        cookie = last.next_cookie;
        all.extend(batch);
    }
}

/// quill reads a kernel-made directory: lookups, the listing and every block's checksum.
fn check_kernel_directory(
    image: &Ext4Image,
    ino: u32,
    expected: &BTreeMap<Vec<u8>, (u32, u8)>,
    absent: &[Vec<u8>],
    rng: &mut Rng,
) -> (usize, u8) {
    let (mut io, ctx) = ImageDir::open(image, ino);
    for (name, &found) in expected {
        assert_eq!(dir::lookup(&mut io, &ctx, name).unwrap(), Some(found), "{name:02x?}");
    }
    for name in absent {
        assert_eq!(dir::lookup(&mut io, &ctx, name).unwrap(), None);
    }
    let listing = list_all(&mut io, &ctx, rng);
    assert_eq!((&listing[0].name[..], listing[0].ino), (&b"."[..], ino));
    assert_eq!((&listing[1].name[..], listing[1].ino), (&b".."[..], ext4::ROOT_INO));
    let listed: BTreeMap<Vec<u8>, (u32, u8)> =
        listing[2..].iter().map(|e| (e.name.clone(), (e.ino, e.file_type))).collect();
    assert_eq!(listed.len(), listing.len() - 2, "a name was listed twice");
    assert_eq!(&listed, expected);
    assert_eq!(dir::is_empty(&mut io, &ctx).unwrap(), expected.is_empty());

    let has_csum = ctx.csum_seed.is_some();
    let mut levels = 0;
    for lblk in 0..io.blocks {
        let block = io.read_dir_block(lblk).unwrap();
        let Some(seed) = ctx.csum_seed else { continue };
        let ok = if io.indexed && lblk == 0 {
            levels = htree::parse_dx_root(&block, has_csum).unwrap().indirect_levels;
            htree::dx_checksum_ok(seed, &block)
        } else if io.indexed && htree::parse_dx_node(&block, has_csum).is_ok() {
            htree::dx_checksum_ok(seed, &block)
        } else {
            dirent::dir_block_checksum_ok(seed, &block)
        };
        assert!(ok, "directory {ino} block {lblk}: checksum");
    }
    (io.blocks as usize, levels)
}

/// What a block says, independent of stale bytes in slack: records (offset, inode, rec_len,
/// file type and name of live ones) for leaves, the parsed index for index blocks.
fn block_layout(block: &[u8], has_csum: bool, index_block: bool) -> String {
    if index_block {
        if let Ok(root) = htree::parse_dx_root(block, has_csum) {
            return format!("{root:?}");
        }
        if let Ok(entries) = htree::parse_dx_node(block, has_csum) {
            return format!("{entries:?}");
        }
    }
    let records = dirent::parse_dir_block_records(block, has_csum).unwrap();
    let live: Vec<_> = records
        .iter()
        .map(|r| {
            let name = if r.is_live() { r.name } else { &[] };
            (r.offset, r.inode, r.rec_len, if r.is_live() { r.file_type } else { 0 }, name)
        })
        .collect();
    format!("{live:?}")
}

struct Config {
    label: &'static str,
    block_size: u32,
    extra_mkfs: &'static [&'static str],
    names: usize,
}

const CONFIGS: [Config; 3] = [
    Config { label: "4k", block_size: 4096, extra_mkfs: &[], names: 3000 },
    Config { label: "1k", block_size: 1024, extra_mkfs: &[], names: 3000 },
    Config {
        label: "1k-no-dir-index",
        block_size: 1024,
        extra_mkfs: &["-O", "^dir_index"],
        names: 600,
    },
];

#[test]
fn kernel_directories_read_back_and_quill_replays_them_into_layouts_e2fsck_and_the_kernel_accept() {
    if let Some(reason) = skip_reason() {
        println!("SKIP: {reason}");
        return;
    }
    let mut rng = Rng::new(common::seed("dir kernel image"));
    for config in &CONFIGS {
        println!("== {}", config.label);
        let tmp = Scratch::new(config.label);
        let image_path = tmp.path("fs.img");
        let mut mkfs_args: Vec<&OsStr> = vec!["-q".as_ref(), "-F".as_ref(), "-b".as_ref()];
        let block_size = config.block_size.to_string();
        mkfs_args.push(block_size.as_ref());
        mkfs_args.extend(config.extra_mkfs.iter().map(OsStr::new));
        mkfs_args.extend([image_path.as_os_str(), "64M".as_ref()]);
        run("mkfs.ext4", &mkfs_args);

        // The kernel builds the directories.
        let point = tmp.path("mnt");
        let mount = match Mount::new(&image_path, &point) {
            Ok(mount) => mount,
            Err(err) => {
                println!("SKIP: cannot loop-mount an ext4 image: {err}");
                return;
            }
        };
        let (big_dir, small_dir) = (point.join("big"), point.join("small"));
        std::fs::create_dir(&big_dir).unwrap();
        std::fs::create_dir(&small_dir).unwrap();
        let mut taken = HashSet::new();
        let mut big_ops = Vec::new();
        let mut live: Vec<Vec<u8>> = Vec::new();
        for n in 0..config.names {
            let name = random_name(&mut rng, &mut taken);
            big_ops.push(kernel_create(&big_dir, &name, n));
            live.push(name);
        }
        let mut absent = Vec::new();
        for _ in 0..config.names / 6 {
            let name = live.swap_remove(rng.below(live.len() as u64) as usize);
            big_ops.push(kernel_remove(&big_dir, &name));
            absent.push(name);
        }
        for n in 0..config.names / 10 {
            let name = random_name(&mut rng, &mut taken);
            big_ops.push(kernel_create(&big_dir, &name, n));
        }
        let small_ops: Vec<Op> = (0..12)
            .map(|n| kernel_create(&small_dir, format!("small-{n}").as_bytes(), n))
            .collect();
        let big_ino = std::fs::metadata(&big_dir).unwrap().ino() as u32;
        let small_ino = std::fs::metadata(&small_dir).unwrap().ino() as u32;
        mount.unmount();
        run("e2fsck", &["-fn".as_ref(), image_path.as_os_str()]);

        // quill reads them.
        let expected_big = outcome(&big_ops);
        let (big_blocks, levels, big_ctx, replayed) = {
            let dev = FileDevice::open(&image_path, FileOptions::read_only()).unwrap();
            let image = Ext4Image::open(Arc::new(dev)).unwrap();
            check_superblock_fields(&image);
            let (blocks, levels) =
                check_kernel_directory(&image, big_ino, &expected_big, &absent, &mut rng);
            let (small_blocks, _) =
                check_kernel_directory(&image, small_ino, &outcome(&small_ops), &[], &mut rng);
            assert_eq!(small_blocks, 1);
            println!("big directory: {blocks} blocks, {levels} indirect levels");

            // quill replays the kernel's operations and must arrive at the kernel's layout.
            let (mut kernel_io, ctx) = ImageDir::open(&image, big_ino);
            let mut quill =
                MemDir { block_size: kernel_io.block_size, blocks: Vec::new(), indexed: false };
            dir::init_dir(&mut quill, &ctx, big_ino, ext4::ROOT_INO).unwrap();
            for op in &big_ops {
                match op {
                    Op::Add(name, ino, ft) => {
                        dir::add_entry(&mut quill, &ctx, name, *ino, *ft).unwrap()
                    }
                    Op::Remove(name) => {
                        dir::remove_entry(&mut quill, &ctx, name).unwrap();
                    }
                }
            }
            assert_eq!(quill.indexed, kernel_io.indexed);
            assert_eq!(quill.blocks.len(), blocks, "quill's directory has the kernel's size");
            let has_csum = ctx.csum_seed.is_some();
            let index_blocks: HashSet<u32> = if quill.indexed {
                let root = htree::parse_dx_root(&quill.blocks[0], has_csum).unwrap();
                let mut set: HashSet<u32> = HashSet::from([0]);
                if root.indirect_levels > 0 {
                    set.extend(root.entries.iter().map(|e| e.block));
                }
                set
            } else {
                HashSet::new()
            };
            for lblk in 0..blocks as u32 {
                let kernel_block = kernel_io.read_dir_block(lblk).unwrap();
                let is_index = index_blocks.contains(&lblk);
                assert_eq!(
                    block_layout(&quill.blocks[lblk as usize], has_csum, is_index),
                    block_layout(&kernel_block, has_csum, is_index),
                    "block {lblk} differs from the kernel's"
                );
            }
            let physical: Vec<u64> =
                (0..blocks as u32).map(|lblk| kernel_io.physical(lblk).unwrap()).collect();
            (blocks, levels, ctx, (quill.blocks, physical))
        };
        if config.block_size == 1024 && big_ctx.dir_index {
            assert_eq!(levels, 1, "3000 names make a two-level htree in 1 KiB blocks");
        }
        assert!(big_blocks > 10);

        // quill's blocks replace the kernel's; e2fsck and the kernel must accept them.
        let (blocks, physical) = replayed;
        let file = std::fs::OpenOptions::new().write(true).open(&image_path).unwrap();
        for (data, block) in blocks.iter().zip(&physical) {
            file.write_all_at(data, block * u64::from(config.block_size)).unwrap();
        }
        file.sync_all().unwrap();
        drop(file);
        run("e2fsck", &["-fn".as_ref(), image_path.as_os_str()]);
        let mount = Mount::new(&image_path, &point).unwrap();
        let mut listed = BTreeMap::new();
        for entry in std::fs::read_dir(&big_dir).unwrap() {
            let entry = entry.unwrap();
            let meta = std::fs::symlink_metadata(entry.path()).unwrap();
            let name = entry.file_name().as_bytes().to_vec();
            listed.insert(name, (meta.ino() as u32, file_type_of(&meta)));
        }
        assert_eq!(listed, expected_big, "the kernel lists quill's directory");
        for name in expected_big.keys() {
            assert!(std::fs::symlink_metadata(big_dir.join(OsStr::from_bytes(name))).is_ok());
        }
        for name in &absent {
            assert!(std::fs::symlink_metadata(big_dir.join(OsStr::from_bytes(name))).is_err());
        }
        mount.unmount();
        run("e2fsck", &["-fn".as_ref(), image_path.as_os_str()]);
    }
}

/// The superblock fields `DirCtx` is made from agree with the raw bytes at device offset 1024:
/// `s_hash_seed` at 0xEC, `s_def_hash_version` at 0xFC, `s_flags` at 0x160.
fn check_superblock_fields(image: &Ext4Image) {
    let mut raw = vec![0u8; ext4::SUPERBLOCK_SIZE];
    image.device().read_at(ext4::SUPERBLOCK_OFFSET, &mut raw).unwrap();
    let le32 = |at: usize| u32::from_le_bytes(raw[at..at + 4].try_into().unwrap());
    let sb = image.superblock();
    let seed = [le32(0xEC), le32(0xF0), le32(0xF4), le32(0xF8)];
    assert_eq!(sb.hash_seed, seed);
    let unsigned = le32(0x160) & 0x2 != 0;
    let version = raw[0xFC] + if unsigned { 3 } else { 0 };
    assert_eq!(sb.effective_hash_version(), version);
    assert!(seed.iter().any(|&w| w != 0), "mkfs.ext4 sets a random hash seed");
}
