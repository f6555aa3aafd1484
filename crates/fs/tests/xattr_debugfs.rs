//! Behaviour: quill's extended attributes interoperate with e2fsprogs both ways.
//!
//! - Attributes set with `debugfs ea_set` (small values that land in the inode, large ones that
//!   land in an xattr block) read back through `fs::xattr` exactly as `debugfs ea_list` /
//!   `ea_get` report them, and the blocks debugfs writes carry the checksum and hashes quill
//!   computes.
//! - Attributes quill writes (in-inode areas encoded by the codec, and a block rewritten in place
//!   by `fs::xattr::set` / `remove`) pass `e2fsck -fn` and read back with `debugfs ea_get`.
//!
//! Images are built with `mkfs.ext4` defaults (metadata_csum on) with 256-byte inodes, at 1 KiB
//! and 4 KiB blocks, in a temporary directory removed on drop. Without e2fsprogs the tests print
//! `SKIP:` and return.

mod common;

use common::Scratch;

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use blockdev::file::{FileDevice, FileOptions};
use fs::error::Result as FsResult;
use fs::meta_io::MetaIo;
use fs::xattr::{self, SetMode, XattrCtx};
use fs::{Ext4Image, FsError};
use ondisk::ext4::inode_checksum_ok;
use ondisk::ext4::xattr::{
    encode_inode_xattrs, parse_inode_xattrs, parse_xattr_block, split_name,
    xattr_block_checksum_ok, xattr_block_hashes_ok, XattrEntry,
};

const TOOLS: [&str; 3] = ["mkfs.ext4", "debugfs", "e2fsck"];

fn run(tool: &str, args: &[&OsStr]) -> std::process::Output {
    let out = Command::new(tool).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{tool} {args:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn mkfs(dir: &Scratch, block_size: u32) -> PathBuf {
    let img = dir.path("fs.img");
    let bs = block_size.to_string();
    let args = ["-q", "-F", "-t", "ext4", "-b", &bs, "-I", "256"];
    let mut args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    args.extend([img.as_os_str(), OsStr::new("16M")]);
    run("mkfs.ext4", &args);
    img
}

/// Runs the debugfs commands in `script` (one a line) against `img`, read-write.
fn debugfs_script(dir: &Scratch, img: &Path, script: &[Vec<u8>]) {
    let path = dir.path("debugfs.cmds");
    std::fs::write(&path, script.join(&b'\n')).unwrap();
    run("debugfs", &[OsStr::new("-w"), OsStr::new("-f"), path.as_os_str(), img.as_os_str()]);
}

/// `debugfs -R <request>` (read-only); stdout.
fn debugfs(img: &Path, request: &[u8]) -> Vec<u8> {
    run("debugfs", &[OsStr::new("-R"), OsStr::from_bytes(request), img.as_os_str()]).stdout
}

fn command(parts: &[&[u8]]) -> Vec<u8> {
    parts.join(&b' ')
}

fn e2fsck_clean(img: &Path) {
    run("e2fsck", &[OsStr::new("-fn"), img.as_os_str()]);
}

fn inode_number(img: &Path, file: &str) -> u32 {
    let out = String::from_utf8(debugfs(img, format!("stat {file}").as_bytes())).unwrap();
    out.split_whitespace()
        .skip_while(|w| *w != "Inode:")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no inode number in {out}"))
}

/// `debugfs ea_list`: full name → value length. debugfs prints names with unprintable bytes as
/// space-separated hex.
fn debugfs_ea_list(img: &Path, file: &str) -> BTreeMap<Vec<u8>, usize> {
    let out = debugfs(img, format!("ea_list {file}").as_bytes());
    let mut names = BTreeMap::new();
    for line in out.split(|&b| b == b'\n').filter(|l| l.starts_with(b"  ")) {
        let open = line.iter().position(|&b| b == b'(').expect("ea_list line without a length");
        let close = open + line[open..].iter().position(|&b| b == b')').unwrap();
        let len: usize = std::str::from_utf8(&line[open + 1..close]).unwrap().parse().unwrap();
        let name = std::str::from_utf8(&line[2..open]).unwrap().trim_end();
        let name = if name.contains(' ') {
            name.split(' ').map(|hex| u8::from_str_radix(hex, 16).unwrap()).collect()
        } else {
            name.as_bytes().to_vec()
        };
        names.insert(name, len);
    }
    names
}

/// `debugfs ea_get -f`: the raw value of `name`.
fn debugfs_ea_get(dir: &Scratch, img: &Path, file: &str, name: &[u8]) -> Vec<u8> {
    let out = dir.path("ea_get.out");
    let _ = std::fs::remove_file(&out);
    let out_path = out.as_os_str().as_bytes();
    debugfs(img, &command(&[b"ea_get -f", out_path, file.as_bytes(), name]));
    std::fs::read(&out).unwrap_or_else(|_| {
        panic!("debugfs ea_get found no {:?} on {file}", String::from_utf8_lossy(name))
    })
}

fn open(img: &Path) -> Ext4Image {
    let dev = FileDevice::open(img, FileOptions::read_only()).unwrap();
    Ext4Image::open(Arc::new(dev)).unwrap()
}

/// Where inode `ino`'s record lives: (block, byte offset in the block).
fn inode_location(image: &Ext4Image, ino: u32) -> (u64, usize) {
    let sb = image.superblock();
    let group = (ino - 1) / sb.inodes_per_group;
    let index = u64::from((ino - 1) % sb.inodes_per_group);
    let byte = index * u64::from(sb.inode_size);
    let block_size = u64::from(sb.block_size());
    let table = image.group_descs()[group as usize].inode_table;
    (table + byte / block_size, (byte % block_size) as usize)
}

fn read_raw_inode(image: &Ext4Image, ino: u32) -> Vec<u8> {
    let (block, offset) = inode_location(image, ino);
    let data = image.read_block(block).unwrap();
    let raw = data[offset..offset + usize::from(image.superblock().inode_size)].to_vec();
    assert!(inode_checksum_ok(image.superblock(), ino, &raw), "inode {ino} checksum");
    raw
}

/// The inode's xattr block number and in-inode xattr area, as the inode parser decodes them.
fn file_acl(raw: &[u8]) -> u64 {
    ondisk::ext4::Inode::parse(raw).unwrap().file_acl
}

fn area_range(raw: &[u8]) -> std::ops::Range<usize> {
    ondisk::ext4::Inode::parse(raw).unwrap().xattr_area_range(raw.len())
}

/// Writes inode `ino`'s record back with a fresh checksum (`ext4_inode_csum_set`: crc32c of
/// the record with both checksum fields as zero, seeded per inode).
fn write_raw_inode(image: &Ext4Image, img: &Path, ino: u32, raw: &mut [u8]) {
    let sb = image.superblock();
    ondisk::ext4::set_inode_checksum(sb, ino, raw);
    assert!(inode_checksum_ok(sb, ino, raw));
    let (block, offset) = inode_location(image, ino);
    let at = block * u64::from(sb.block_size()) + offset as u64;
    std::fs::OpenOptions::new().write(true).open(img).unwrap().write_all_at(raw, at).unwrap();
}

/// A [`MetaIo`] over an opened image: reads come from the image (or earlier writes), writes are
/// kept until [`ImageIo::flush`]. Allocation and freeing are not available: the tests arrange
/// for the xattr block to exist already.
struct ImageIo {
    image: Ext4Image,
    written: BTreeMap<u64, Vec<u8>>,
}

impl MetaIo for ImageIo {
    fn block_size(&self) -> usize {
        self.image.block_size() as usize
    }
    fn blocks_count(&self) -> u64 {
        self.image.superblock().blocks_count
    }
    fn read_meta(&mut self, block: u64) -> FsResult<Vec<u8>> {
        match self.written.get(&block) {
            Some(data) => Ok(data.clone()),
            None => self.image.read_block(block),
        }
    }
    fn write_meta(&mut self, block: u64, data: &[u8]) -> FsResult<()> {
        self.written.insert(block, data.to_vec());
        Ok(())
    }
    fn alloc_meta_block(&mut self, _goal: u64) -> FsResult<u64> {
        Err(FsError::NotSupported("the test image allocates through debugfs".into()))
    }
    fn free_meta_block(&mut self, block: u64) -> FsResult<()> {
        Err(FsError::NotSupported(format!("the test image does not free block {block}")))
    }
    fn free_data_blocks(&mut self, start: u64, _count: u64) -> FsResult<()> {
        Err(FsError::NotSupported(format!("the test image does not free block {start}")))
    }
}

impl ImageIo {
    fn new(img: &Path) -> ImageIo {
        ImageIo { image: open(img), written: BTreeMap::new() }
    }

    fn ctx(&self) -> XattrCtx {
        let sb = self.image.superblock();
        XattrCtx {
            fs_csum_seed: sb.has_metadata_csum().then(|| sb.csum_seed()),
            goal: 0,
            ea_inode: false,
            owner: (0, 0, 0),
            owner_mode: 0,
        }
    }

    fn flush(&self, img: &Path) {
        let file = std::fs::OpenOptions::new().write(true).open(img).unwrap();
        for (block, data) in &self.written {
            file.write_all_at(data, block * u64::from(self.image.block_size())).unwrap();
        }
    }
}

/// Full names and values of attributes, in the order they are set.
type Attrs = Vec<(Vec<u8>, Vec<u8>)>;

/// Value files for `ea_set -f`, and the script lines that set them on `file`.
fn ea_set_lines(
    dir: &Scratch,
    file: &str,
    attrs: &[(Vec<u8>, Vec<u8>)],
    tag: &str,
) -> Vec<Vec<u8>> {
    attrs
        .iter()
        .enumerate()
        .map(|(i, (name, value))| {
            let path = dir.path(&format!("value-{tag}-{i}"));
            std::fs::write(&path, value).unwrap();
            command(&[b"ea_set -f", path.as_os_str().as_bytes(), file.as_bytes(), name])
        })
        .collect()
}

fn patterned(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn debugfs_sets_attributes_and_quill_reads_them(block_size: u32) {
    let dir = Scratch::new(&format!("read-{block_size}"));
    let img = mkfs(&dir, block_size);
    let files: [(&str, Attrs); 3] = [
        // Fits the 96-byte in-inode area.
        (
            "small",
            vec![(b"user.a".to_vec(), b"hello".to_vec()), (b"trusted.t".to_vec(), b"xyz".to_vec())],
        ),
        // One value too big for the inode: an xattr block.
        (
            "big",
            vec![
                (b"user.small".to_vec(), b"tiny".to_vec()),
                (b"user.big".to_vec(), patterned(block_size as usize / 2, 1)),
                (b"security.selinux".to_vec(), b"system_u:object_r:tmp_t:s0\0".to_vec()),
            ],
        ),
        // Many medium values spilling from the inode into the block, one with a non-ASCII name.
        (
            "many",
            (0..8u8)
                .map(|i| {
                    (format!("user.attr{i}").into_bytes(), patterned(40 + usize::from(i) * 7, i))
                })
                .chain([("user.\u{e9}t\u{e9}".as_bytes().to_vec(), patterned(60, 9))])
                .collect(),
        ),
    ];
    let mut script = Vec::new();
    for (file, attrs) in &files {
        script.push(format!("write /dev/null {file}").into_bytes());
        script.extend(ea_set_lines(&dir, file, attrs, file));
    }
    debugfs_script(&dir, &img, &script);
    e2fsck_clean(&img);

    let mut io = ImageIo::new(&img);
    let ctx = io.ctx();
    let mut blocks_seen = 0;
    for (file, attrs) in &files {
        let ino = inode_number(&img, file);
        let raw = read_raw_inode(&io.image, ino);
        let area = &raw[area_range(&raw)];
        let acl = file_acl(&raw);
        // The codec sees what debugfs wrote, and debugfs's block carries quill's sums.
        let mut found = BTreeMap::new();
        let in_inode = parse_inode_xattrs(area).unwrap();
        match *file {
            "small" => assert_eq!((in_inode.len(), acl), (2, 0), "small values stay in the inode"),
            _ => assert!(!in_inode.is_empty() && acl != 0, "{file} uses inode and block"),
        }
        for e in in_inode {
            found.insert(ondisk::ext4::xattr::full_name(e.name_index, &e.name), e.value);
        }
        if acl != 0 {
            blocks_seen += 1;
            let block = io.image.read_block(acl).unwrap();
            assert!(xattr_block_checksum_ok(ctx.fs_csum_seed.unwrap(), acl, &block));
            assert!(xattr_block_hashes_ok(&block), "{file}: entry or block hash differs");
            let (header, entries) = parse_xattr_block(&block).unwrap();
            assert_eq!(header.refcount, 1);
            for e in entries {
                found.insert(ondisk::ext4::xattr::full_name(e.name_index, &e.name), e.value);
            }
        }
        let expected: BTreeMap<Vec<u8>, Vec<u8>> = attrs.iter().cloned().collect();
        assert_eq!(found, expected, "{file}: codec");
        // fs::xattr agrees, and so does debugfs.
        let mut listed = xattr::list(&mut io, &ctx, area, acl).unwrap();
        listed.sort();
        assert_eq!(listed, expected.keys().cloned().collect::<Vec<_>>(), "{file}: list");
        let lengths = debugfs_ea_list(&img, file);
        assert_eq!(lengths.keys().collect::<Vec<_>>(), expected.keys().collect::<Vec<_>>());
        for (name, value) in &expected {
            assert_eq!(
                xattr::get(&mut io, &ctx, area, acl, name).unwrap(),
                xattr::Stored::Here(value.clone())
            );
            assert_eq!(lengths[name], value.len());
            assert_eq!(&debugfs_ea_get(&dir, &img, file, name), value);
        }
        assert!(matches!(xattr::get(&mut io, &ctx, area, acl, b"user.nope"), Err(FsError::NoData)));
    }
    assert_eq!(blocks_seen, 2, "\"big\" and \"many\" need xattr blocks");
}

#[test]
fn xattrs_set_by_debugfs_read_back_through_quill_with_1k_blocks() {
    if common::have_tools(&TOOLS) {
        debugfs_sets_attributes_and_quill_reads_them(1024);
    }
}

#[test]
fn xattrs_set_by_debugfs_read_back_through_quill_with_4k_blocks() {
    if common::have_tools(&TOOLS) {
        debugfs_sets_attributes_and_quill_reads_them(4096);
    }
}

fn quill_sets_attributes_and_e2fsprogs_reads_them(block_size: u32) {
    let dir = Scratch::new(&format!("write-{block_size}"));
    let img = mkfs(&dir, block_size);
    // debugfs allocates (and accounts in i_blocks) the xattr block that quill then rewrites.
    let placeholder = (b"user.placeholder".to_vec(), patterned(block_size as usize / 4, 3));
    let mut script = vec![b"write /dev/null blocky".to_vec(), b"write /dev/null inline".to_vec()];
    script.extend(ea_set_lines(&dir, "blocky", &[placeholder], "placeholder"));
    debugfs_script(&dir, &img, &script);

    // "blocky": fs::xattr rewrites the block in place (allocation is not available here).
    let mut io = ImageIo::new(&img);
    let ctx = io.ctx();
    let ino = inode_number(&img, "blocky");
    let mut raw = read_raw_inode(&io.image, ino);
    let range = area_range(&raw);
    let mut acl = file_acl(&raw);
    assert_ne!(acl, 0);
    let mut area = raw[range.clone()].to_vec();
    let mut expected: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let attrs: Attrs = vec![
        (b"user.in-inode".to_vec(), b"short".to_vec()),
        ("user.\u{e9}t\u{e9}".as_bytes().to_vec(), patterned(200, 5)),
        (b"trusted.big".to_vec(), patterned(block_size as usize / 4, 7)),
        (b"security.empty".to_vec(), Vec::new()),
        (b"user.odd".to_vec(), patterned(13, 8)),
    ];
    for (name, value) in &attrs {
        xattr::set(&mut io, &ctx, &mut area, &mut acl, name, value, SetMode::Create).unwrap();
        expected.insert(name.clone(), value.clone());
    }
    xattr::set(&mut io, &ctx, &mut area, &mut acl, b"user.odd", b"replaced", SetMode::Replace)
        .unwrap();
    expected.insert(b"user.odd".to_vec(), b"replaced".to_vec());
    xattr::remove(&mut io, &ctx, &mut area, &mut acl, b"user.placeholder").unwrap();
    assert_eq!(acl, file_acl(&raw), "the block is rewritten in place");
    assert!(!parse_inode_xattrs(&area).unwrap().is_empty(), "some values stay in the inode");
    assert!(parse_xattr_block(&io.written[&acl]).unwrap().1.len() >= 2);
    io.flush(&img);
    raw[range].copy_from_slice(&area);
    write_raw_inode(&io.image, &img, ino, &mut raw);

    // "inline": an in-inode area encoded by the codec directly, filled to the last byte.
    let ino = inode_number(&img, "inline");
    let mut raw = read_raw_inode(&io.image, ino);
    let range = area_range(&raw);
    let used = 4 + 20 + 20 + 4 + 8; // magic, two 1-4 byte names, terminator, first value
    let entries = vec![
        XattrEntry::new(1, b"one", b"1st-val"),
        XattrEntry::new(4, b"two", &patterned(range.len() - used, 2)),
    ];
    let encoded = encode_inode_xattrs(&entries, range.len()).expect("fills the area exactly");
    raw[range].copy_from_slice(&encoded);
    write_raw_inode(&io.image, &img, ino, &mut raw);
    let inline_expected: BTreeMap<Vec<u8>, Vec<u8>> = entries
        .iter()
        .map(|e| (ondisk::ext4::xattr::full_name(e.name_index, &e.name), e.value.clone()))
        .collect();
    drop(io);

    e2fsck_clean(&img);
    for (file, expected) in [("blocky", &expected), ("inline", &inline_expected)] {
        let lengths = debugfs_ea_list(&img, file);
        assert_eq!(lengths.keys().collect::<Vec<_>>(), expected.keys().collect::<Vec<_>>());
        for (name, value) in expected {
            assert_eq!(lengths[name], value.len(), "{file}");
            assert_eq!(&debugfs_ea_get(&dir, &img, file, name), value, "{file}");
            assert!(split_name(name).is_some());
        }
    }
}

#[test]
fn xattrs_written_by_quill_pass_e2fsck_and_debugfs_with_1k_blocks() {
    if common::have_tools(&TOOLS) {
        quill_sets_attributes_and_e2fsprogs_reads_them(1024);
    }
}

#[test]
fn xattrs_written_by_quill_pass_e2fsck_and_debugfs_with_4k_blocks() {
    if common::have_tools(&TOOLS) {
        quill_sets_attributes_and_e2fsprogs_reads_them(4096);
    }
}
