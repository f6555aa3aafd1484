//! Behaviour: extent trees that `fs::extent_tree` builds, punches and truncates inside a real
//! ext4 image (made by the stock `mkfs.ext4`, metadata_csum on) pass `e2fsck -fn`, and
//! `debugfs` lists exactly the extents quill wrote.
//!
//! The test plays the rest of the file system itself: `debugfs write /dev/null` creates the
//! inode, a [`MetaIo`] over the image file hands out blocks from the free ranges `dumpe2fs`
//! reports, the test patches the raw inode (root, size, block count, checksum), and `debugfs
//! setb`/`freeb`/`set_bg`/`ssv` keep the bitmaps and free counts in step. Without e2fsprogs
//! the test prints why it skips and returns. Images live in a unique directory under the
//! system temp dir, removed on drop.

mod common;

use common::Scratch;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use fs::error::Result;
use fs::extent_tree::{self, ExtentCtx};
use fs::meta_io::MetaIo;
use fs::FsError;
use ondisk::ext4::{self, Extent, Superblock, EXTENTS_FL, INODE_BLOCK_SIZE};

const TOOLS: [&str; 4] = ["mkfs.ext4", "debugfs", "dumpe2fs", "e2fsck"];

/// Raw inode fields the test patches (`struct ext4_inode`).
const I_SIZE_LO: usize = 0x04;
const I_BLOCKS_LO: usize = 0x1C;
const I_FLAGS: usize = 0x20;
const I_BLOCK: usize = 0x28;
const I_SIZE_HIGH: usize = 0x6C;
const I_BLOCKS_HIGH: usize = 0x74;
/// `i_flags`: i_blocks counts file-system blocks instead of 512-byte sectors.
const HUGE_FILE_FL: u32 = 0x0004_0000;

fn run(tool: &str, args: &[&str]) -> String {
    let out = Command::new(tool).args(args).output().unwrap();
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{tool} {args:?} failed ({}): {text}", out.status);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn debugfs(img: &Path, write: bool, request: &str) -> String {
    let img = img.to_str().unwrap();
    let args: Vec<&str> =
        if write { vec!["-w", "-R", request, img] } else { vec!["-R", request, img] };
    run("debugfs", &args)
}

fn e2fsck_clean(img: &Path, what: &str) {
    let out = Command::new("e2fsck").args(["-fn", img.to_str().unwrap()]).output().unwrap();
    assert!(
        out.status.success(),
        "e2fsck -fn after {what} exited {}:\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = String::from_utf8_lossy(&out.stdout);
    println!("e2fsck -fn after {what}: clean\n{}", summary.trim_end());
}

/// One block group as `dumpe2fs` describes it.
#[derive(Debug)]
struct Group {
    flags: u16,
    free_blocks: u64,
    free_ranges: Vec<(u64, u64)>,
}

const BG_INODE_UNINIT: u16 = 1;
const BG_BLOCK_UNINIT: u16 = 2;
const BG_ITABLE_ZEROED: u16 = 4;

/// Groups and the superblock's free block count, from `dumpe2fs`.
fn dumpe2fs(img: &Path) -> (Vec<Group>, u64) {
    let text = run("dumpe2fs", &[img.to_str().unwrap()]);
    let mut groups: Vec<Group> = Vec::new();
    let mut total = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("Free blocks:") {
            total = Some(rest.trim().parse().unwrap());
        } else if line.starts_with("Group ") && line.contains(": (Blocks ") {
            let mut flags = 0;
            if let Some(list) = line.split('[').nth(1) {
                for name in list.trim_end_matches(']').split(", ") {
                    flags |= match name {
                        "INODE_UNINIT" => BG_INODE_UNINIT,
                        "BLOCK_UNINIT" => BG_BLOCK_UNINIT,
                        "ITABLE_ZEROED" => BG_ITABLE_ZEROED,
                        other => panic!("unknown group flag {other}"),
                    };
                }
            }
            groups.push(Group { flags, free_blocks: 0, free_ranges: Vec::new() });
        } else if let Some(group) = groups.last_mut() {
            let line = line.trim();
            if line.contains(" free blocks, ") {
                group.free_blocks = line.split(' ').next().unwrap().parse().unwrap();
            } else if let Some(list) = line.strip_prefix("Free blocks: ") {
                for range in list.split(", ").filter(|r| !r.is_empty()) {
                    let (a, b) = range.split_once('-').unwrap_or((range, range));
                    let (a, b): (u64, u64) = (a.parse().unwrap(), b.parse().unwrap());
                    group.free_ranges.push((a, b + 1));
                }
            }
        }
    }
    (groups, total.expect("dumpe2fs printed the free block count"))
}

/// A [`MetaIo`] over the image file: tree blocks come from the end of the free ranges, data
/// blocks (handed out by the test) from their start.
struct ImageIo {
    file: File,
    block_size: usize,
    blocks_count: u64,
    free: Vec<(u64, u64)>,
    meta_freed: Vec<u64>,
    data_freed: Vec<(u64, u64)>,
}

impl ImageIo {
    fn take_data(&mut self, len: u64) -> u64 {
        let (start, _) = self.free.iter_mut().find(|(s, e)| *e - *s >= len).expect("free data");
        let block = *start;
        *start += len;
        block
    }
}

impl MetaIo for ImageIo {
    fn block_size(&self) -> usize {
        self.block_size
    }

    fn blocks_count(&self) -> u64 {
        self.blocks_count
    }

    fn read_meta(&mut self, block: u64) -> Result<Vec<u8>> {
        if block >= self.blocks_count {
            return Err(FsError::BlockOutOfRange { block, blocks_count: self.blocks_count });
        }
        let mut data = vec![0u8; self.block_size];
        self.file.read_exact_at(&mut data, block * self.block_size as u64).unwrap();
        Ok(data)
    }

    fn write_meta(&mut self, block: u64, data: &[u8]) -> Result<()> {
        assert!(block < self.blocks_count && data.len() == self.block_size);
        self.file.write_all_at(data, block * self.block_size as u64).unwrap();
        Ok(())
    }

    fn alloc_meta_block(&mut self, _goal: u64) -> Result<u64> {
        let (_, end) = self.free.iter_mut().rev().find(|(s, e)| s < e).ok_or(FsError::NoSpace)?;
        *end -= 1;
        Ok(*end)
    }

    fn free_meta_block(&mut self, block: u64) -> Result<()> {
        self.meta_freed.push(block);
        Ok(())
    }

    fn free_data_blocks(&mut self, start: u64, count: u64) -> Result<()> {
        self.data_freed.push((start, count));
        Ok(())
    }
}

/// The file under test: its inode and the blocks the bitmaps currently show it owning.
struct TestFile {
    img: PathBuf,
    sb: Superblock,
    ino: u32,
    inode_block: u64,
    inode_offset: u64,
    ctx: ExtentCtx,
    root: [u8; INODE_BLOCK_SIZE],
    owned: BTreeSet<u64>,
}

impl TestFile {
    /// Creates `f` with debugfs and finds its raw inode.
    fn create(img: &Path) -> TestFile {
        let out = debugfs(img, true, "write /dev/null f");
        let out = out + &debugfs(img, false, "imap f");
        let ino: u32 = out
            .split("Inode ")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no inode number in {out:?}"));
        let located = out.split("located at block ").nth(1).unwrap();
        let (block, offset) = located.split_once(", offset ").unwrap();
        let inode_block: u64 = block.trim().parse().unwrap();
        let inode_offset = u64::from_str_radix(offset.trim().trim_start_matches("0x"), 16).unwrap();
        let file = File::open(img).unwrap();
        let mut raw_sb = vec![0u8; 1024];
        file.read_exact_at(&mut raw_sb, 1024).unwrap();
        let sb = Superblock::parse(&raw_sb).unwrap();
        assert!(sb.has_metadata_csum(), "mkfs.ext4 defaults include metadata_csum");
        let mut test_file = TestFile {
            img: img.to_path_buf(),
            sb,
            ino,
            inode_block,
            inode_offset,
            ctx: ExtentCtx { ino, inode_block, csum_seed: None, goal: 0 },
            root: [0; INODE_BLOCK_SIZE],
            owned: BTreeSet::new(),
        };
        let raw = test_file.read_inode();
        assert!(ext4::inode_checksum_ok(&test_file.sb, ino, &raw));
        let generation = ext4::Inode::parse(&raw).unwrap().generation;
        test_file.ctx.csum_seed = Some(ext4::inode_csum_seed(&test_file.sb, ino, generation));
        extent_tree::init_root(&mut test_file.root);
        test_file
    }

    fn block_size(&self) -> u64 {
        u64::from(self.sb.block_size())
    }

    fn io(&self) -> ImageIo {
        let (groups, _) = dumpe2fs(&self.img);
        let mut free: Vec<(u64, u64)> = groups.iter().flat_map(|g| g.free_ranges.clone()).collect();
        free.sort_unstable();
        ImageIo {
            file: File::options().read(true).write(true).open(&self.img).unwrap(),
            block_size: self.block_size() as usize,
            blocks_count: self.sb.blocks_count,
            free,
            meta_freed: Vec::new(),
            data_freed: Vec::new(),
        }
    }

    fn read_inode(&self) -> Vec<u8> {
        let file = File::open(&self.img).unwrap();
        let mut raw = vec![0u8; usize::from(self.sb.inode_size)];
        file.read_exact_at(&mut raw, self.inode_block * self.block_size() + self.inode_offset)
            .unwrap();
        raw
    }

    /// Writes the root, size (up to the last mapped block), block count and a fresh checksum
    /// into the raw inode; then makes the bitmaps and free counts show exactly the blocks the
    /// tree uses (data and tree blocks).
    fn sync(&mut self, io: &mut ImageIo) -> Vec<Extent> {
        let extents = extent_tree::extents(io, &self.ctx, &self.root).unwrap();
        let tree_blocks = extent_tree::tree_blocks(io, &self.ctx, &self.root).unwrap();
        let mut used: BTreeSet<u64> = tree_blocks.iter().copied().collect();
        for e in &extents {
            used.extend(e.start..e.start + u64::from(e.len));
        }
        let size = extents.last().map_or(0, |e| e.logical_end() * self.block_size());
        let sectors = used.len() as u64 * self.block_size() / 512;
        let mut raw = self.read_inode();
        raw[I_BLOCK..I_BLOCK + INODE_BLOCK_SIZE].copy_from_slice(&self.root);
        raw[I_SIZE_LO..I_SIZE_LO + 4].copy_from_slice(&(size as u32).to_le_bytes());
        raw[I_SIZE_HIGH..I_SIZE_HIGH + 4].copy_from_slice(&((size >> 32) as u32).to_le_bytes());
        raw[I_BLOCKS_LO..I_BLOCKS_LO + 4].copy_from_slice(&(sectors as u32).to_le_bytes());
        raw[I_BLOCKS_HIGH..I_BLOCKS_HIGH + 2]
            .copy_from_slice(&((sectors >> 32) as u16).to_le_bytes());
        let flags = u32::from_le_bytes(raw[I_FLAGS..I_FLAGS + 4].try_into().unwrap());
        let flags = (flags | EXTENTS_FL) & !HUGE_FILE_FL;
        raw[I_FLAGS..I_FLAGS + 4].copy_from_slice(&flags.to_le_bytes());
        ext4::set_inode_checksum(&self.sb, self.ino, &mut raw);
        assert!(ext4::inode_checksum_ok(&self.sb, self.ino, &raw));
        let file = File::options().write(true).open(&self.img).unwrap();
        file.write_all_at(&raw, self.inode_block * self.block_size() + self.inode_offset).unwrap();
        drop(file);
        self.mark_blocks(&used);
        extents
    }

    /// `debugfs setb`/`freeb` for the difference between what the bitmaps show and `used`,
    /// then the group and superblock free counts (debugfs leaves those alone).
    fn mark_blocks(&mut self, used: &BTreeSet<u64>) {
        let (groups, total_free) = dumpe2fs(&self.img);
        let first = u64::from(self.sb.first_data_block);
        let per_group = u64::from(self.sb.blocks_per_group);
        let mut delta: BTreeMap<u64, i64> = BTreeMap::new();
        let mut script = String::new();
        let added: Vec<u64> = used.difference(&self.owned).copied().collect();
        let removed: Vec<u64> = self.owned.difference(used).copied().collect();
        for &b in &added {
            *delta.entry((b - first) / per_group).or_default() -= 1;
        }
        for &b in &removed {
            *delta.entry((b - first) / per_group).or_default() += 1;
        }
        // A BLOCK_UNINIT group's bitmap is computed, not read: clear the flag so that debugfs
        // writes the bitmap it changes.
        for &g in delta.keys() {
            let flags = groups[g as usize].flags;
            if flags & BG_BLOCK_UNINIT != 0 {
                script += &format!("set_bg {g} flags {}\n", flags & !BG_BLOCK_UNINIT);
            }
        }
        for (command, blocks) in [("setb", &added), ("freeb", &removed)] {
            for (start, count) in runs(blocks) {
                script += &format!("{command} {start} {count}\n");
            }
        }
        let mut total = total_free as i64;
        for (&g, &d) in &delta {
            let free = groups[g as usize].free_blocks as i64 + d;
            script += &format!("set_bg {g} free_blocks_count {free}\nset_bg {g} checksum calc\n");
            total += d;
        }
        script += &format!("ssv free_blocks_count {total}\n");
        let path = self.img.with_extension("debugfs");
        std::fs::write(&path, script).unwrap();
        run("debugfs", &["-w", "-f", path.to_str().unwrap(), self.img.to_str().unwrap()]);
        self.owned = used.clone();
    }

    /// The leaf extents `debugfs ex` lists, as (logical, physical, len, unwritten).
    fn debugfs_extents(&self) -> Vec<(u64, u64, u64, bool)> {
        let out = debugfs(&self.img, false, "ex f");
        let mut leaves = Vec::new();
        for line in out.lines().skip(1) {
            let spaced = line.replace('/', " / ").replace('-', " - ");
            let tokens: Vec<&str> =
                spaced.split_whitespace().filter(|t| *t != "/" && *t != "-").collect();
            let numbers: Vec<u64> = tokens.iter().map_while(|t| t.parse().ok()).collect();
            let (level, max_level) = (numbers[0], numbers[1]);
            if level != max_level {
                continue;
            }
            let unwritten = tokens.last() == Some(&"Uninit");
            // Single-block extents print one logical and one physical number, others a range.
            let (logical, physical, len) = match numbers.len() {
                9 => (numbers[4], numbers[6], numbers[8]),
                7 => (numbers[4], numbers[5], numbers[6]),
                _ => panic!("unexpected debugfs ex line {line:?}"),
            };
            leaves.push((logical, physical, len, unwritten));
        }
        leaves
    }

    fn check(&mut self, io: &mut ImageIo, what: &str) {
        let extents = self.sync(io);
        e2fsck_clean(&self.img, what);
        let ours: Vec<(u64, u64, u64, bool)> = extents
            .iter()
            .map(|e| (u64::from(e.logical), e.start, u64::from(e.len), e.unwritten))
            .collect();
        assert!(ours == self.debugfs_extents(), "debugfs ex lists other extents after {what}");
        let stat = debugfs(&self.img, false, "stat f");
        assert!(stat.contains("EXTENTS:"), "debugfs stat f: {stat}");
    }
}

/// `blocks` (sorted) as (start, count) runs.
fn runs(blocks: &[u64]) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &b in blocks {
        match runs.last_mut() {
            Some((start, count)) if *start + *count == b => *count += 1,
            _ => runs.push((b, 1)),
        }
    }
    runs
}

/// Builds a deep tree, checks it, punches and truncates, checks again, and removes the rest.
fn build_punch_truncate(block_size: u32, extent_count: u32, depth_min: u16) {
    if !common::have_tools(&TOOLS) {
        return;
    }
    let dir = Scratch::new(&format!("{block_size}"));
    let img = dir.path("fs.img");
    run("mkfs.ext4", &["-q", "-F", "-b", &block_size.to_string(), img.to_str().unwrap(), "64M"]);
    let mut file = TestFile::create(&img);
    let mut io = file.io();
    let ctx = file.ctx;

    // Descending single- and two-block extents, every third block: each lands in front of
    // everything, so nodes split in half and every ancestor index moves down each time.
    for i in (0..extent_count).rev() {
        let len = 1 + i % 2;
        let pblk = io.take_data(u64::from(len));
        let unwritten = i % 7 == 0;
        extent_tree::insert(&mut io, &ctx, &mut file.root, 3 * i + 100, pblk, len, unwritten)
            .unwrap();
    }
    // Appends past the end that merge with their predecessor (physically contiguous).
    let tail = 3 * extent_count + 200;
    let pblk = io.take_data(300);
    for k in 0..30u32 {
        let unwritten = k >= 20;
        extent_tree::insert(
            &mut io,
            &ctx,
            &mut file.root,
            tail + 10 * k,
            pblk + u64::from(10 * k),
            10,
            unwritten,
        )
        .unwrap();
    }
    // Convert part of the unwritten tail (splits it) and a few scattered unwritten extents.
    extent_tree::mark_written(&mut io, &ctx, &mut file.root, tail + 205, 50).unwrap();
    extent_tree::mark_written(&mut io, &ctx, &mut file.root, 100, 3 * 700).unwrap();
    let depth = extent_tree::depth(&file.root);
    assert!(depth >= depth_min, "depth {depth} with {block_size}-byte blocks");
    let tree_blocks = extent_tree::tree_blocks(&mut io, &ctx, &file.root).unwrap().len();
    println!("{block_size}-byte blocks: depth {depth}, {tree_blocks} tree blocks");
    file.check(&mut io, "building the tree");

    // Punch holes: inside one extent (splits it), then a tenth and an eighth of the span,
    // across many extents and whole leaves.
    let span = 3 * extent_count;
    let remove = |io: &mut ImageIo, root: &mut [u8; INODE_BLOCK_SIZE], start: u32, end: u64| {
        let freed = extent_tree::remove_range(io, &ctx, root, start, end).unwrap();
        assert!(freed > 0, "remove_range({start}, {end}) freed nothing");
    };
    remove(&mut io, &mut file.root, tail + 3, u64::from(tail) + 7);
    remove(&mut io, &mut file.root, 100, u64::from(100 + span / 10));
    let middle = 100 + span / 2;
    remove(&mut io, &mut file.root, middle + 1, u64::from(middle + span / 8));
    file.check(&mut io, "punching holes");

    // Truncate to three quarters of the span (dropping the merged tail), then in the middle
    // of the last extent.
    remove(&mut io, &mut file.root, 100 + span * 3 / 4, 1 << 32);
    let last = *extent_tree::extents(&mut io, &ctx, &file.root).unwrap().last().unwrap();
    if last.len > 1 {
        remove(&mut io, &mut file.root, last.logical + 1, 1 << 32);
    }
    file.check(&mut io, "truncating");
    assert!(!io.meta_freed.is_empty(), "removals freed tree blocks");

    // Everything: back to an empty depth-0 root.
    extent_tree::remove_range(&mut io, &ctx, &mut file.root, 0, 1 << 32).unwrap();
    assert_eq!(extent_tree::depth(&file.root), 0);
    file.check(&mut io, "removing everything");
    assert!(file.owned.is_empty());
}

#[test]
fn deep_1k_extent_tree_built_punched_and_truncated_passes_e2fsck() {
    // Half-full nodes of 84 slots: 12000 extents need depth 3.
    build_punch_truncate(1024, 12_000, 3);
}

#[test]
fn deep_4k_extent_tree_built_punched_and_truncated_passes_e2fsck() {
    // 340 slots per node: 2500 extents need depth 2.
    build_punch_truncate(4096, 2500, 2);
}
