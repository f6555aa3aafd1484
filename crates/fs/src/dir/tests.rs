use ondisk::testing::Rng;
use std::collections::{BTreeMap, HashMap};

use ondisk::ext4::dir::{FT_DIR, FT_REG_FILE, FT_SYMLINK};

use super::*;

/// An in-memory directory: its blocks and its index flag. Appended blocks start as 0xA5
/// garbage, since their contents are unspecified until written.
#[derive(Clone)]
struct MemDir {
    block_size: usize,
    blocks: Vec<Vec<u8>>,
    indexed: bool,
}

impl MemDir {
    fn new(block_size: usize) -> MemDir {
        MemDir { block_size, blocks: Vec::new(), indexed: false }
    }
}

impl DirIo for MemDir {
    fn block_size(&self) -> usize {
        self.block_size
    }
    fn dir_blocks(&self) -> u32 {
        self.blocks.len() as u32
    }
    fn read_dir_block(&mut self, lblk: u32) -> Result<Vec<u8>> {
        self.blocks
            .get(lblk as usize)
            .cloned()
            .ok_or_else(|| FsError::Invalid(format!("read of block {lblk}")))
    }
    fn write_dir_block(&mut self, lblk: u32, data: &[u8]) -> Result<()> {
        assert_eq!(data.len(), self.block_size);
        self.blocks[lblk as usize].copy_from_slice(data);
        Ok(())
    }
    fn append_dir_block(&mut self) -> Result<u32> {
        self.blocks.push(vec![0xA5; self.block_size]);
        Ok(self.blocks.len() as u32 - 1)
    }
    fn physical_block(&mut self, lblk: u32) -> u64 {
        1000 + u64::from(lblk)
    }
    fn indexed(&self) -> bool {
        self.indexed
    }
    fn set_indexed(&mut self, on: bool) {
        self.indexed = on;
    }
}

const DIR_INO: u32 = 12;
const PARENT_INO: u32 = 2;

fn ctx(csum: bool, dir_index: bool, hash_version: u8) -> DirCtx {
    DirCtx {
        ino: DIR_INO,
        csum_seed: csum.then_some(0x5EED_C0DE),
        dir_index,
        largedir: false,
        hash_version,
        hash_seed: [0x3e0a_5f9c, 0x8e4b_d271, 0x132d_f4a6, 0x975b_8ec0],
    }
}

fn new_dir(block_size: usize, ctx: &DirCtx) -> MemDir {
    let mut io = MemDir::new(block_size);
    init_dir(&mut io, ctx, DIR_INO, PARENT_INO).unwrap();
    io
}

/// 1..=24 bytes mostly, sometimes 100..=255 or exactly 255; any byte but NUL and '/'.
fn random_name(rng: &mut Rng) -> Vec<u8> {
    let len = match rng.below(20) {
        0 => 255,
        1 => 100 + rng.below(156),
        _ => 1 + rng.below(24),
    } as usize;
    let mut name: Vec<u8> = (0..len)
        .map(|_| loop {
            let byte = rng.next() as u8;
            if byte != 0 && byte != b'/' {
                break byte;
            }
        })
        .collect();
    if name == b"." || name == b".." {
        name.push(b'x');
    }
    name
}

type Model = BTreeMap<Vec<u8>, (u32, u8)>;

/// An e2fsck-pass-2-like walk written independently of the code under test: every block's
/// checksum and chain, "." and "..", and for an htree the limits, every block referenced
/// exactly once, and every leaf's hashes inside its index range. Returns the names found.
fn fsck(io: &MemDir, ctx: &DirCtx) -> Model {
    let has_csum = ctx.csum_seed.is_some();
    let mut names = Model::new();
    let add = |names: &mut Model, lblk: usize, block: &[u8], lo: u32, hi: u32, version| {
        if let Some(seed) = ctx.csum_seed {
            assert!(dirent::dir_block_checksum_ok(seed, block), "leaf {lblk} checksum");
        }
        let mut entries = dirent::parse_dir_block(block, has_csum).unwrap();
        if lblk == 0 {
            let (dot, dotdot) = dirent::parse_dots(block).unwrap();
            assert_eq!((dot.inode, dotdot.offset), (DIR_INO, 12));
            entries.drain(..2);
        }
        for entry in entries {
            if let Some(version) = version {
                let (hash, _) = name_hash(entry.name, version, &ctx.hash_seed).unwrap();
                assert!(
                    lo <= hash && hash <= hi,
                    "leaf {lblk}: hash {hash:#x} outside {lo:#x}..={hi:#x}"
                );
            }
            let old = names.insert(entry.name.to_vec(), (entry.inode, entry.file_type));
            assert!(old.is_none(), "{:?} twice", entry.name);
        }
    };
    if !io.indexed {
        for (lblk, block) in io.blocks.iter().enumerate() {
            add(&mut names, lblk, block, 0, u32::MAX, None);
        }
        return names;
    }
    assert!(ctx.dir_index);
    let root = htree::parse_dx_root(&io.blocks[0], has_csum).unwrap();
    if let Some(seed) = ctx.csum_seed {
        assert!(htree::dx_checksum_ok(seed, &io.blocks[0]));
    }
    let version = Some(effective_version(root.hash_version, ctx.hash_version));
    let mut references = vec![0u32; io.blocks.len()];
    references[0] += 1;
    let ranges = |entries: &[DxEntry], lo: u32, hi: u32| -> Vec<(u32, u32, u32)> {
        (0..entries.len())
            .map(|i| {
                let start = if i == 0 { lo } else { entries[i].hash & !1 };
                let end = entries.get(i + 1).map_or(hi, |e| e.hash & !1);
                assert!(lo <= start && start <= end && end <= hi, "index ranges out of order");
                (entries[i].block, start, end)
            })
            .collect()
    };
    // (child, its hash range, index levels still below it), depth first.
    let mut todo: Vec<(u32, u32, u32, u8)> = ranges(&root.entries, 0, u32::MAX)
        .into_iter()
        .map(|(child, lo, hi)| (child, lo, hi, root.indirect_levels))
        .collect();
    while let Some((child, lo, hi, levels_below)) = todo.pop() {
        references[child as usize] += 1;
        let block = &io.blocks[child as usize];
        if levels_below == 0 {
            add(&mut names, child as usize, block, lo, hi, version);
            continue;
        }
        let entries = htree::parse_dx_node(block, has_csum).unwrap();
        if let Some(seed) = ctx.csum_seed {
            assert!(htree::dx_checksum_ok(seed, block), "node {child} checksum");
        }
        for (below, lo, hi) in ranges(&entries, lo, hi) {
            todo.push((below, lo, hi, levels_below - 1));
        }
    }
    assert!(references.iter().all(|&n| n == 1), "block references {references:?}");
    names
}

/// The whole listing, in batches of random size; checks cookies move forward.
fn list_all(io: &mut MemDir, ctx: &DirCtx, rng: &mut Rng) -> Vec<DirEntryInfo> {
    let mut cookie = READDIR_START;
    let mut all = Vec::new();
    for _ in 0..1_000_000 {
        let batch = read_dir(io, ctx, cookie, 1 + rng.below(100) as usize).unwrap();
        let Some(last) = batch.last() else {
            return all;
        };
        assert!(last.next_cookie > cookie, "cookie {cookie} did not advance");
        cookie = last.next_cookie;
        all.extend(batch);
    }
    panic!("readdir did not end");
}

/// Everything the public operations can say about the directory matches the model.
fn check_against_model(io: &mut MemDir, ctx: &DirCtx, model: &Model, rng: &mut Rng) {
    assert_eq!(&fsck(io, ctx), model);
    let listing = list_all(io, ctx, rng);
    assert_eq!((&listing[0].name[..], listing[0].ino), (&b"."[..], DIR_INO));
    assert_eq!((&listing[1].name[..], listing[1].ino), (&b".."[..], PARENT_INO));
    let listed: Model =
        listing[2..].iter().map(|e| (e.name.clone(), (e.ino, e.file_type))).collect();
    assert_eq!(listing.len() - 2, listed.len(), "an entry was listed twice");
    assert_eq!(&listed, model);
    for (name, &found) in model {
        assert_eq!(lookup(io, ctx, name).unwrap(), Some(found));
    }
    assert_eq!(is_empty(io, ctx).unwrap(), model.is_empty());
}

/// Random adds, removes, lookups and replaces, each checked against a map; the whole
/// directory is compared with the map every `check_every` steps and at the end.
fn run_model(
    rng: &mut Rng,
    io: &mut MemDir,
    ctx: &DirCtx,
    steps: usize,
    extra: &[Vec<u8>],
) -> Model {
    let mut model = Model::new();
    let mut names: Vec<Vec<u8>> = Vec::new();
    let mut next_ino = 100u32;
    let check_every = 1000;
    for step in 0..steps {
        match rng.below(100) {
            0..=54 => {
                let name = if !extra.is_empty() && rng.below(4) == 0 {
                    extra[rng.below(extra.len() as u64) as usize].clone()
                } else {
                    random_name(rng)
                };
                let ft = [FT_REG_FILE, FT_DIR, FT_SYMLINK][rng.below(3) as usize];
                next_ino += 1;
                let result = add_entry(io, ctx, &name, next_ino, ft);
                if model.contains_key(&name) {
                    assert!(matches!(result, Err(FsError::Exists)), "{result:?}");
                } else {
                    result.unwrap();
                    model.insert(name.clone(), (next_ino, ft));
                    names.push(name.clone());
                }
                assert_eq!(lookup(io, ctx, &name).unwrap(), model.get(&name).copied());
            }
            55..=74 if !names.is_empty() => {
                let name = names.swap_remove(rng.below(names.len() as u64) as usize);
                let (ino, _) = model.remove(&name).unwrap();
                assert_eq!(remove_entry(io, ctx, &name).unwrap(), ino);
                assert_eq!(lookup(io, ctx, &name).unwrap(), None);
                assert!(matches!(remove_entry(io, ctx, &name), Err(FsError::NotFound)));
            }
            75..=89 => {
                let name = match names.len() {
                    0 => random_name(rng),
                    n => names[rng.below(n as u64) as usize].clone(),
                };
                assert_eq!(lookup(io, ctx, &name).unwrap(), model.get(&name).copied());
            }
            _ if !names.is_empty() => {
                let name = names[rng.below(names.len() as u64) as usize].clone();
                next_ino += 1;
                let old = model.insert(name.clone(), (next_ino, FT_REG_FILE)).unwrap();
                assert_eq!(replace_entry(io, ctx, &name, next_ino, FT_REG_FILE).unwrap().0, old.0);
            }
            _ => {}
        }
        if step % check_every == check_every - 1 || step + 1 == steps {
            check_against_model(io, ctx, &model, rng);
        }
    }
    model
}

#[test]
fn random_operations_match_a_model_for_every_layout() {
    let mut rng = Rng::from_env("directory model");
    let mut config = 0u8;
    for block_size in [1024, 4096] {
        for csum in [false, true] {
            for dir_index in [false, true] {
                let version = ((rng.next() as u8) ^ config) % 6;
                config += 1;
                let ctx = ctx(csum, dir_index, version);
                println!("block {block_size}, csum {csum}, dir_index {dir_index}, hash {version}");
                let mut io = new_dir(block_size, &ctx);
                let steps = if block_size == 1024 && dir_index { 9000 } else { 5000 };
                let model = run_model(&mut rng, &mut io, &ctx, steps, &[]);
                assert!(model.len() > 1000);
                assert_eq!(io.indexed, dir_index, "dir_index directories become htrees");
                if dir_index && block_size == 1024 {
                    let root = htree::parse_dx_root(&io.blocks[0], csum).unwrap();
                    assert_eq!(root.indirect_levels, 1, "the 1 KiB htrees reach two levels");
                }
            }
        }
    }
}

#[test]
fn colliding_hashes_spill_across_leaves_and_stay_findable() {
    // Sixteen hash values for thousands of names: long chains of leaves that continue one
    // hash, entries sharing a readdir position, splits inside runs of equal hashes.
    TEST_HASH_MASK.with(|mask| mask.set(0xF000_0000));
    let mut rng = Rng::from_env("colliding hashes");
    for (block_size, csum) in [(1024, true), (4096, false)] {
        let ctx = ctx(csum, true, htree::DX_HASH_HALF_MD4);
        let mut io = new_dir(block_size, &ctx);
        let model = run_model(&mut rng, &mut io, &ctx, 5000, &[]);
        assert!(model.len() > 1000 && io.indexed);
        // Some index entry (in the root or, in a two-level tree, an interior node) marks
        // a leaf that continues its predecessor's hash.
        let root = htree::parse_dx_root(&io.blocks[0], csum).unwrap();
        let mut entries = root.entries.clone();
        if root.indirect_levels > 0 {
            for entry in &root.entries {
                let node = &io.blocks[entry.block as usize];
                entries.extend(htree::parse_dx_node(node, csum).unwrap());
            }
        }
        assert!(entries.iter().any(|e| e.hash & DX_HASH_CONTINUED != 0));
    }
    TEST_HASH_MASK.with(|mask| mask.set(!0));
}

/// Names with equal legacy hashes, found by search (the legacy hash ignores the seed and
/// has a minor hash of 0, so these share a whole readdir position).
fn legacy_collisions(pairs_wanted: usize) -> Vec<Vec<u8>> {
    let mut seen: HashMap<u32, Vec<u8>> = HashMap::new();
    let mut colliding = Vec::new();
    for i in 0u32..4_000_000 {
        let name = format!("c{i:x}").into_bytes();
        let (hash, _) = htree::dx_hash(&name, htree::DX_HASH_LEGACY, &[0; 4]).unwrap();
        if let Some(other) = seen.insert(hash, name.clone()) {
            colliding.push(other);
            colliding.push(name);
            if colliding.len() >= 2 * pairs_wanted {
                break;
            }
        }
    }
    assert!(colliding.len() >= 2 * pairs_wanted, "no legacy collisions found");
    colliding
}

#[test]
fn real_legacy_hash_collisions_are_found_listed_and_removed_independently() {
    let colliding = legacy_collisions(4);
    let mut rng = Rng::from_env("legacy collisions");
    let ctx = ctx(true, true, htree::DX_HASH_LEGACY);
    let mut io = new_dir(1024, &ctx);
    let model = run_model(&mut rng, &mut io, &ctx, 3000, &colliding);
    assert!(io.indexed);
    for pair in colliding.chunks(2) {
        let (a, b) = (&pair[0], &pair[1]);
        assert_eq!(htree::dx_hash(a, 0, &[0; 4]).unwrap(), htree::dx_hash(b, 0, &[0; 4]).unwrap());
        assert_eq!(lookup(&mut io, &ctx, a).unwrap(), model.get(a).copied());
        assert_eq!(lookup(&mut io, &ctx, b).unwrap(), model.get(b).copied());
    }
    // Both of the first pair present, then remove one: the other stays.
    let (a, b) = (&colliding[0], &colliding[1]);
    for name in [a, b] {
        if lookup(&mut io, &ctx, name).unwrap().is_none() {
            add_entry(&mut io, &ctx, name, 77, FT_REG_FILE).unwrap();
        }
    }
    remove_entry(&mut io, &ctx, a).unwrap();
    assert!(lookup(&mut io, &ctx, b).unwrap().is_some());
    assert!(lookup(&mut io, &ctx, a).unwrap().is_none());
}

#[test]
fn full_single_block_directory_converts_to_an_htree_with_two_leaves() {
    for csum in [false, true] {
        let ctx = ctx(csum, true, htree::DX_HASH_TEA_UNSIGNED);
        let mut io = new_dir(1024, &ctx);
        let mut n = 0;
        while !io.indexed {
            add_entry(&mut io, &ctx, format!("file-{n:04}").as_bytes(), 100 + n, FT_REG_FILE)
                .unwrap();
            n += 1;
        }
        assert_eq!(io.blocks.len(), 3, "root plus two leaves");
        let root = htree::parse_dx_root(&io.blocks[0], csum).unwrap();
        assert_eq!(root.hash_version, htree::DX_HASH_TEA, "the unsigned +3 is not stored");
        assert_eq!((root.indirect_levels, root.entries.len()), (0, 2));
        assert_eq!((root.dot_inode, root.dotdot_inode), (DIR_INO, PARENT_INO));
        let names = fsck(&io, &ctx);
        assert_eq!(names.len(), n as usize);
        // Both leaves got a share of the entries.
        for leaf in [1, 2] {
            assert!(dirent::parse_dir_block(&io.blocks[leaf], csum).unwrap().len() > 5);
        }
    }
}

/// Name `n`: 255 bytes, so three fit a 1 KiB leaf.
fn long_name(n: u32) -> Vec<u8> {
    let mut name = format!("{n:08}-").into_bytes();
    name.resize(255, b'q');
    name
}

#[test]
fn index_grows_to_two_levels_and_reports_no_space_when_both_are_full() {
    // 1 KiB blocks and 255-byte names: three names per leaf, 123 x 126 leaves at most.
    let ctx = ctx(true, true, htree::DX_HASH_HALF_MD4);
    let mut io = new_dir(1024, &ctx);
    let mut n = 0;
    let err = loop {
        // check_room (what the file system asks before it changes anything) answers as the
        // add then does: a full index is never found half way through an add.
        let room = check_room(&mut io, &ctx, &long_name(n));
        match add_entry(&mut io, &ctx, &long_name(n), 100 + n, FT_REG_FILE) {
            Ok(()) => {
                assert!(room.is_ok(), "name {n}: check_room said {room:?}, the add worked");
                n += 1;
            }
            Err(err) => {
                assert!(matches!(room, Err(FsError::NoSpace)), "name {n}: {room:?}, add: {err}");
                break err;
            }
        }
        assert!(n < 100_000, "the index never filled up");
    };
    assert!(matches!(err, FsError::NoSpace), "{err}");
    let root = htree::parse_dx_root(&io.blocks[0], true).unwrap();
    assert_eq!((root.indirect_levels, root.entries.len()), (1, 123));
    assert_eq!(fsck(&io, &ctx).len(), n as usize);
    for i in (0..n).step_by(97) {
        assert_eq!(lookup(&mut io, &ctx, &long_name(i)).unwrap(), Some((100 + i, FT_REG_FILE)));
    }
    // Removing a name makes room in its leaf again.
    assert_eq!(remove_entry(&mut io, &ctx, &long_name(5)).unwrap(), 105);
    add_entry(&mut io, &ctx, &long_name(5), 5, FT_REG_FILE).unwrap();
    assert!(!is_empty(&mut io, &ctx).unwrap());
}

/// With largedir the full two-level index grows a third level (root, two levels of nodes)
/// instead of reporting no space; every name stays findable, listed once and in its leaf's
/// hash range, and removal and re-insertion work at that depth.
#[test]
fn with_largedir_the_index_grows_to_three_levels() {
    let ctx = DirCtx { largedir: true, ..ctx(true, true, htree::DX_HASH_HALF_MD4) };
    let mut io = new_dir(1024, &ctx);
    let mut n = 0;
    let levels = |io: &MemDir| {
        io.indexed.then(|| htree::parse_dx_root(&io.blocks[0], true).unwrap().indirect_levels)
    };
    while levels(&io) < Some(2) {
        add_entry(&mut io, &ctx, &long_name(n), 100 + n, FT_REG_FILE).unwrap();
        n += 1;
        assert!(n < 200_000, "the index never grew a third level");
    }
    // Well past the growth, so nodes of the new level split too.
    for _ in 0..20_000 {
        add_entry(&mut io, &ctx, &long_name(n), 100 + n, FT_REG_FILE).unwrap();
        n += 1;
    }
    assert_eq!(levels(&io), Some(2));
    assert_eq!(fsck(&io, &ctx).len(), n as usize);
    for i in (0..n).step_by(101) {
        assert_eq!(lookup(&mut io, &ctx, &long_name(i)).unwrap(), Some((100 + i, FT_REG_FILE)));
    }
    let mut rng = Rng::new(7);
    assert_eq!(list_all(&mut io, &ctx, &mut rng).len(), n as usize + 2, "readdir, dots included");
    assert_eq!(remove_entry(&mut io, &ctx, &long_name(5)).unwrap(), 105);
    assert_eq!(lookup(&mut io, &ctx, &long_name(5)).unwrap(), None);
    add_entry(&mut io, &ctx, &long_name(5), 5, FT_REG_FILE).unwrap();
    assert_eq!(fsck(&io, &ctx).len(), n as usize);
    // Without largedir a third level is damage, not a directory to use.
    let plain = DirCtx { largedir: false, ..ctx };
    let err = lookup(&mut io, &plain, &long_name(7)).unwrap_err();
    assert!(matches!(err, FsError::Corrupted { .. }), "{err}");
}

#[test]
fn readdir_returns_every_stable_entry_exactly_once_while_entries_come_and_go() {
    let mut rng = Rng::from_env("readdir stability");
    // (block size, csum, dir_index, names before the listing starts)
    let cases = [
        (1024, true, true, 10),  // converts from one block to an htree mid-listing
        (4096, false, true, 30), // the same with 4 KiB blocks
        (1024, false, true, 2500),
        (4096, true, true, 3000),
        (1024, true, false, 800), // linear, several blocks, growing
        (4096, false, false, 400),
    ];
    for (block_size, csum, dir_index, initial) in cases {
        let ctx = ctx(csum, dir_index, rng.below(6) as u8);
        let mut io = new_dir(block_size, &ctx);
        let was_indexed = io.indexed;
        let mut stable = Vec::new();
        let mut volatile = Vec::new();
        for i in 0..initial {
            let name = format!("s{i}-{}", rng.below(1 << 20)).into_bytes();
            add_entry(&mut io, &ctx, &name, 1000 + i, FT_REG_FILE).unwrap();
            if i % 3 == 0 {
                volatile.push(name);
            } else {
                stable.push(name);
            }
        }
        let mut seen: HashMap<Vec<u8>, u32> = HashMap::new();
        let mut cookie = READDIR_START;
        let mut fresh = 0u32;
        loop {
            let batch = read_dir(&mut io, &ctx, cookie, 1 + rng.below(40) as usize).unwrap();
            let Some(last) = batch.last() else { break };
            cookie = last.next_cookie;
            for entry in batch {
                *seen.entry(entry.name).or_default() += 1;
            }
            // In the small cases, fill the one block right after the first batch, so that
            // it converts to an htree between two calls.
            while dir_index && initial <= 30 && !io.indexed {
                fresh += 1;
                let name = format!("v{fresh}-{}", rng.below(1 << 20)).into_bytes();
                add_entry(&mut io, &ctx, &name, 50_000 + fresh, FT_REG_FILE).unwrap();
                volatile.push(name);
            }
            for _ in 0..rng.below(6) {
                fresh += 1;
                let name = format!("v{fresh}-{}", rng.below(1 << 20)).into_bytes();
                add_entry(&mut io, &ctx, &name, 50_000 + fresh, FT_REG_FILE).unwrap();
                volatile.push(name);
            }
            for _ in 0..rng.below(3) {
                if !volatile.is_empty() {
                    let name = volatile.swap_remove(rng.below(volatile.len() as u64) as usize);
                    remove_entry(&mut io, &ctx, &name).unwrap();
                }
            }
            if !stable.is_empty() {
                let name = &stable[rng.below(stable.len() as u64) as usize];
                replace_entry(&mut io, &ctx, name, 77, FT_REG_FILE).unwrap();
            }
        }
        for name in stable.iter().chain([&b"."[..].to_vec(), &b"..".to_vec()]) {
            assert_eq!(seen.get(name), Some(&1), "{:?}", String::from_utf8_lossy(name));
        }
        assert!(seen.values().all(|&n| n == 1), "an entry was listed twice");
        if dir_index && initial <= 30 {
            assert!(!was_indexed && io.indexed, "the directory converted while listed");
        }
    }
}

#[test]
fn entries_naming_reserved_inodes_are_corruption() {
    for (csum, dir_index, names) in [(true, true, 1), (false, false, 1), (true, true, 400)] {
        let ctx = ctx(csum, dir_index, 1);
        let mut io = new_dir(1024, &ctx);
        for i in 0..names {
            add_entry(&mut io, &ctx, format!("f{i}").as_bytes(), 100 + i, FT_REG_FILE).unwrap();
        }
        // The root is no reserved inode: ".." of a top-level directory names it.
        replace_entry(&mut io, &ctx, b"f0", 2, FT_DIR).unwrap();
        assert_eq!(lookup(&mut io, &ctx, b"f0").unwrap(), Some((2, FT_DIR)));
        // The journal's inode (8) behind a name, as a damaged block may say.
        replace_entry(&mut io, &ctx, b"f0", 8, FT_REG_FILE).unwrap();
        let err = lookup(&mut io, &ctx, b"f0").unwrap_err();
        assert!(
            matches!(&err, FsError::Corrupted { reason, .. } if reason.contains("reserved inode 8")),
            "{err}"
        );
        assert!(read_dir(&mut io, &ctx, READDIR_START, 10_000).is_err());
        assert!(remove_entry(&mut io, &ctx, b"f0").is_err());
    }
}

#[test]
fn names_are_checked_before_anything_is_read() {
    let ctx = ctx(true, true, 1);
    let mut io = new_dir(4096, &ctx);
    add_entry(&mut io, &ctx, b"a", 20, FT_REG_FILE).unwrap();
    assert!(matches!(add_entry(&mut io, &ctx, b"a", 21, FT_REG_FILE), Err(FsError::Exists)));
    let long = [b'l'; 256];
    assert!(matches!(add_entry(&mut io, &ctx, &long, 21, 1), Err(FsError::NameTooLong)));
    assert!(matches!(lookup(&mut io, &ctx, &long), Err(FsError::NameTooLong)));
    add_entry(&mut io, &ctx, &long[..255], 22, 1).unwrap();
    for bad in [&b""[..], b".", b"..", b"a/b", b"nul\0"] {
        assert!(matches!(add_entry(&mut io, &ctx, bad, 21, 1), Err(FsError::Invalid(_))));
    }
    assert!(matches!(remove_entry(&mut io, &ctx, b"zz"), Err(FsError::NotFound)));
    assert!(matches!(replace_entry(&mut io, &ctx, b"zz", 3, 1), Err(FsError::NotFound)));
    assert_eq!(lookup(&mut io, &ctx, b".").unwrap(), Some((DIR_INO, FT_DIR)));
    assert_eq!(lookup(&mut io, &ctx, b"..").unwrap(), Some((PARENT_INO, FT_DIR)));
}

#[test]
fn set_parent_and_is_empty_work_on_linear_and_indexed_directories() {
    for dir_index in [false, true] {
        let ctx = ctx(true, dir_index, 1);
        let mut io = new_dir(1024, &ctx);
        assert!(is_empty(&mut io, &ctx).unwrap());
        for i in 0..200 {
            add_entry(&mut io, &ctx, format!("entry-{i}").as_bytes(), 100 + i, 1).unwrap();
        }
        assert_eq!(io.indexed, dir_index);
        set_parent(&mut io, &ctx, 77).unwrap();
        assert_eq!(lookup(&mut io, &ctx, b"..").unwrap(), Some((77, FT_DIR)));
        let listing = read_dir(&mut io, &ctx, READDIR_START, 2).unwrap();
        assert_eq!((listing[1].ino, listing[1].next_cookie), (77, COOKIE_AFTER_DOTDOT));
        assert!(!is_empty(&mut io, &ctx).unwrap());
        for i in 0..200 {
            remove_entry(&mut io, &ctx, format!("entry-{i}").as_bytes()).unwrap();
        }
        // Blocks stay (ext4 never shrinks directories), the directory is empty.
        assert!(io.blocks.len() > 1);
        assert!(is_empty(&mut io, &ctx).unwrap());
        assert_eq!(read_dir(&mut io, &ctx, READDIR_START, 10).unwrap().len(), 2);
        assert!(fsck(&io, &ctx).is_empty());
    }
}

#[test]
fn checksum_mismatches_and_bad_index_pointers_are_corruption() {
    let ctx = ctx(true, true, 1);
    let mut io = new_dir(1024, &ctx);
    for i in 0..300 {
        add_entry(&mut io, &ctx, format!("n{i}").as_bytes(), 100 + i, 1).unwrap();
    }
    let good = io.clone();
    let corrupted = |io: &mut MemDir| {
        let err = lookup(io, &ctx, b"n17").unwrap_err();
        assert!(matches!(err, FsError::Corrupted { .. }), "{err}");
    };
    io.blocks[0][40] ^= 1; // a root hash
    corrupted(&mut io);
    let mut io = good.clone();
    let leaf = good.blocks.len() - 1;
    io.blocks[leaf][io.block_size - 20] ^= 1; // slack before the tail is covered too
    let err = read_dir(&mut io, &ctx, READDIR_START, 1000).unwrap_err();
    assert!(matches!(err, FsError::Corrupted { block, .. } if block == 1000 + leaf as u64));
    // An index entry past the directory's end, checksum resealed.
    let mut io = good.clone();
    ondisk_put_le32(&mut io.blocks[0], 36, 5000);
    htree::set_dx_checksum(0x5EED_C0DE, &mut io.blocks[0]);
    corrupted(&mut io);
    // Indexed directories need dir_index.
    let mut io = good;
    let no_index = DirCtx { dir_index: false, ..ctx };
    assert!(matches!(lookup(&mut io, &no_index, b"n1"), Err(FsError::Corrupted { .. })));
}

fn ondisk_put_le32(block: &mut [u8], at: usize, value: u32) {
    block[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

/// Runs every operation on a possibly damaged directory; any outcome but a panic or a hang
/// is acceptable.
fn exercise(io: &mut MemDir, ctx: &DirCtx, rng: &mut Rng, names: &[Vec<u8>]) {
    let pick = |rng: &mut Rng| names[rng.below(names.len() as u64) as usize].clone();
    let _ = lookup(io, ctx, &pick(rng));
    let _ = lookup(io, ctx, b"..");
    let _ = add_entry(io, ctx, &random_name(rng), 9, 1);
    let _ = remove_entry(io, ctx, &pick(rng));
    let _ = replace_entry(io, ctx, &pick(rng), 10, 1);
    let _ = set_parent(io, ctx, 3);
    let _ = is_empty(io, ctx);
    let mut cookie = rng.below(3);
    for _ in 0..50 {
        match read_dir(io, ctx, cookie, 1 + rng.below(200) as usize) {
            Ok(batch) if !batch.is_empty() => cookie = batch[batch.len() - 1].next_cookie,
            _ => break,
        }
    }
    let _ = read_dir(io, ctx, rng.next(), 5);
}

#[test]
fn random_and_mutated_directories_never_panic_any_operation() {
    let mut rng = Rng::from_env("hostile directory");
    let mut bases = Vec::new();
    for (block_size, csum, dir_index, names) in [
        (1024, false, true, 20),
        (1024, false, true, 600),
        (1024, true, true, 3000),
        (1024, false, false, 200),
    ] {
        let ctx = ctx(csum, dir_index, 1);
        let mut io = new_dir(block_size, &ctx);
        let mut all = Vec::new();
        for i in 0..names {
            let name = format!("{i}-{}", "x".repeat(rng.below(60) as usize)).into_bytes();
            add_entry(&mut io, &ctx, &name, 100 + i, 1).unwrap();
            all.push(name);
        }
        bases.push((io, ctx, all));
    }
    for round in 0..1500 {
        let (base, ctx, names) = &bases[round % bases.len()];
        let mut io = base.clone();
        let mut ctx = *ctx;
        match rng.below(8) {
            0 => {
                let at = rng.below(io.blocks.len() as u64) as usize;
                io.blocks[at] = (0..io.block_size).map(|_| rng.next() as u8).collect();
            }
            1 => io.indexed = !io.indexed,
            2 => io.blocks.truncate(1 + rng.below(io.blocks.len() as u64) as usize),
            3 => ctx.hash_version = rng.below(8) as u8,
            _ => {
                for _ in 0..=rng.below(8) {
                    let block = rng.below(io.blocks.len() as u64) as usize;
                    let at = rng.below(io.block_size as u64) as usize;
                    io.blocks[block][at] = match rng.below(3) {
                        0 => 0,
                        1 => 0xFF,
                        _ => rng.next() as u8,
                    };
                }
            }
        }
        if ctx.csum_seed.is_some() && rng.below(2) == 0 {
            // Reseal, so that the damage gets past the checksums to the parsers.
            let seed = ctx.csum_seed.unwrap_or_default();
            for block in &mut io.blocks {
                if dirent::dir_tail_ok(block) {
                    dirent::set_dir_block_checksum(seed, block);
                } else if htree::dx_csum(seed, block).is_some() {
                    htree::set_dx_checksum(seed, block);
                }
            }
        }
        exercise(&mut io, &ctx, &mut rng, names);
        exercise(&mut io, &ctx, &mut rng, names);
    }
}
