use super::*;
use crate::meta_io::mem::MemMetaIo;
use ondisk::testing::Rng;
use std::collections::{BTreeMap, BTreeSet};

/// Data blocks live above this block; tree blocks are allocated below it (goal 1).
const DATA_BASE: u64 = 1 << 22;
const BLOCKS_COUNT: u64 = 1 << 28;

/// A tree in a MemMetaIo, the model it must match (logical block → (physical, unwritten)),
/// and the data blocks the test owns.
struct Harness {
    io: MemMetaIo,
    ctx: ExtentCtx,
    root: [u8; INODE_BLOCK_SIZE],
    model: BTreeMap<u32, (u64, bool)>,
    data_next: u64,
}

impl Harness {
    fn new(block_size: usize, csum: bool) -> Harness {
        let mut root = [0u8; INODE_BLOCK_SIZE];
        init_root(&mut root);
        Harness {
            io: MemMetaIo::new(block_size, BLOCKS_COUNT),
            ctx: ExtentCtx {
                ino: 12,
                inode_block: 77,
                csum_seed: csum.then_some(0x1234_5678),
                goal: 1,
            },
            root,
            model: BTreeMap::new(),
            data_next: DATA_BASE,
        }
    }

    fn mapped_in(&self, lblk: u32, len: u32) -> bool {
        self.model.range(lblk..=lblk + (len - 1)).next().is_some()
    }

    /// Allocates `len` data blocks, at `want` when those are free.
    fn alloc_data(&mut self, len: u32, want: Option<u64>) -> u64 {
        let len = u64::from(len);
        if let Some(want) = want {
            if want >= DATA_BASE
                && want + len <= BLOCKS_COUNT
                && self.io.allocated.range(want..want + len).next().is_none()
            {
                self.io.mark_allocated(want, len);
                return want;
            }
        }
        let mut start = self.data_next;
        while self.io.allocated.range(start..start + len).next().is_some() {
            start += len + 1;
        }
        self.data_next = start + len + 1; // a gap, so bump allocations are not contiguous
        self.io.mark_allocated(start, len);
        start
    }

    /// Inserts through the API and the model; `contiguous` asks for physical blocks that
    /// continue the extent before `lblk` (or precede the one after), to exercise merges.
    fn insert(&mut self, lblk: u32, len: u32, unwritten: bool, contiguous: bool) {
        if self.mapped_in(lblk, len) {
            let before = self.root;
            let err =
                insert(&mut self.io, &self.ctx, &mut self.root, lblk, DATA_BASE, len, unwritten)
                    .expect_err("inserting over mapped blocks must fail");
            assert!(matches!(err, FsError::Invalid(_)), "{err}");
            assert_eq!(before, self.root);
            return;
        }
        let want = contiguous.then(|| {
            let left = lblk.checked_sub(1).and_then(|l| self.model.get(&l)).map(|&(p, _)| p + 1);
            let right =
                self.model.get(&(lblk + len)).and_then(|&(p, _)| p.checked_sub(u64::from(len)));
            left.or(right)
        });
        let pblk = self.alloc_data(len, want.flatten());
        insert(&mut self.io, &self.ctx, &mut self.root, lblk, pblk, len, unwritten).unwrap();
        for i in 0..len {
            self.model.insert(lblk + i, (pblk + u64::from(i), unwritten));
        }
    }

    fn remove(&mut self, start: u32, end: u64) {
        let freed = remove_range(&mut self.io, &self.ctx, &mut self.root, start, end).unwrap();
        let gone: Vec<u32> = self
            .model
            .range(start..)
            .map(|(&l, _)| l)
            .take_while(|&l| u64::from(l) < end)
            .collect();
        for l in &gone {
            self.model.remove(l);
        }
        assert_eq!(freed, gone.len() as u64, "blocks freed by remove_range({start}, {end})");
    }

    fn mark_written(&mut self, lblk: u32, len: u32) {
        mark_written(&mut self.io, &self.ctx, &mut self.root, lblk, len).unwrap();
        let end = u64::from(lblk) + u64::from(len);
        for (_, (_, unwritten)) in
            self.model.range_mut(lblk..).take_while(|(&l, _)| u64::from(l) < end)
        {
            *unwritten = false;
        }
    }

    /// Checks `lookup(lblk)` against the model and the extent list.
    fn check_lookup(&mut self, lblk: u32, extents: &[Extent]) {
        let found = lookup(&mut self.io, &self.ctx, &self.root, lblk).unwrap();
        match self.model.get(&lblk) {
            Some(&(pblk, unwritten)) => {
                let e = extents
                    .iter()
                    .find(|e| e.logical <= lblk && e.logical_end() > u64::from(lblk))
                    .unwrap();
                let len = (e.logical_end() - u64::from(lblk)) as u32;
                assert_eq!(found, Lookup::Mapped { pblk, len, unwritten }, "lookup({lblk})");
            }
            None => {
                let next = self.model.range(lblk..).next().map(|(&l, _)| l - lblk);
                assert_eq!(found, Lookup::Hole { len_to_next: next }, "lookup({lblk})");
            }
        }
    }

    /// Full check: the extent list matches the model, the tree keeps every structural
    /// invariant, and the allocated blocks are exactly the tree's plus the model's.
    fn check(&mut self, rng: &mut Rng) {
        let extents = extents(&mut self.io, &self.ctx, &self.root).unwrap();
        let mut mapped = BTreeMap::new();
        for e in &extents {
            for i in 0..e.len {
                mapped.insert(e.logical + i, (e.start + u64::from(i), e.unwritten));
            }
        }
        assert!(mapped == self.model, "extent list differs from the model");
        let structure = check_structure(&self.io, &self.ctx, &self.root);
        assert_eq!(structure.extents, extents);
        assert_eq!(tree_blocks(&mut self.io, &self.ctx, &self.root).unwrap(), structure.blocks);
        assert_eq!(depth(&self.root), structure.depth);
        let mut expected: BTreeSet<u64> = structure.blocks.iter().copied().collect();
        expected.extend(self.model.values().map(|&(p, _)| p));
        assert!(self.io.allocated == expected, "leaked or lost blocks");
        for _ in 0..16 {
            let lblk = match (rng.below(3), extents.is_empty()) {
                (0, false) => {
                    let e = extents[rng.below(extents.len() as u64) as usize];
                    e.logical.wrapping_add((rng.below(3) as u32).wrapping_sub(1))
                }
                _ => rng.below(1 << 16) as u32,
            };
            self.check_lookup(lblk, &extents);
        }
    }
}

struct Structure {
    depth: u16,
    blocks: Vec<u64>,
    extents: Vec<Extent>,
}

/// Walks the tree with the on-disk parser alone (not the module's reader) and asserts every
/// invariant e2fsck checks.
fn check_structure(io: &MemMetaIo, ctx: &ExtentCtx, root: &[u8; INODE_BLOCK_SIZE]) -> Structure {
    let (header, entries) = parse_extent_node(root).unwrap();
    assert_eq!(header.max, 4, "root eh_max");
    let mut structure = Structure { depth: header.depth, blocks: Vec::new(), extents: Vec::new() };
    check_node(io, ctx, header.depth, entries, 0, LOGICAL_END, &mut structure);
    let unique: BTreeSet<u64> = structure.blocks.iter().copied().collect();
    assert_eq!(unique.len(), structure.blocks.len(), "a tree block is referenced twice");
    structure
}

fn check_node(
    io: &MemMetaIo,
    ctx: &ExtentCtx,
    depth: u16,
    entries: ExtentEntries,
    lo: u64,
    hi: u64,
    structure: &mut Structure,
) {
    match entries {
        ExtentEntries::Leaf(extents) => {
            for e in extents {
                assert!(
                    u64::from(e.logical) >= lo && e.logical_end() <= hi,
                    "{e:?} outside {lo}..{hi}"
                );
                for b in e.start..e.start + u64::from(e.len) {
                    assert!(io.allocated.contains(&b), "data block {b} not allocated");
                }
                structure.extents.push(e);
            }
        }
        ExtentEntries::Index(indexes) => {
            for (i, index) in indexes.iter().enumerate() {
                let child_hi = indexes.get(i + 1).map_or(hi, |n| u64::from(n.logical));
                assert!(u64::from(index.logical) >= lo && u64::from(index.logical) < child_hi);
                assert!(
                    io.allocated.contains(&index.leaf),
                    "tree block {} not allocated",
                    index.leaf
                );
                structure.blocks.push(index.leaf);
                let data = io.blocks.get(&index.leaf).expect("tree block written");
                let (header, child) = parse_extent_node(data).unwrap();
                assert_eq!(header.depth + 1, depth);
                assert_eq!(header.max, ExtentHeader::slots_for(io.block_size), "eh_max");
                assert!(!child.is_empty(), "empty tree block {}", index.leaf);
                assert_eq!(
                    child.first_logical(),
                    Some(index.logical),
                    "ei_block of {}",
                    index.leaf
                );
                if let Some(seed) = ctx.csum_seed {
                    let stored = header.stored_block_checksum(data);
                    assert_eq!(stored, header.block_checksum(seed, data), "csum of {}", index.leaf);
                }
                check_node(
                    io,
                    ctx,
                    header.depth,
                    child,
                    u64::from(index.logical),
                    child_hi,
                    structure,
                );
            }
        }
    }
}

/// One random step on the harness.
fn random_step(h: &mut Harness, rng: &mut Rng, span: u32) {
    match rng.below(20) {
        0..=10 => {
            let lblk = rng.below(u64::from(span)) as u32;
            let len =
                if rng.chance(50) { 1 + rng.below(32768) as u32 } else { 1 + rng.below(8) as u32 };
            let unwritten = rng.chance(3);
            let len = len.min(Extent::len_max(unwritten));
            h.insert(lblk, len, unwritten, rng.chance(2));
        }
        11..=12 => {
            let start = rng.below(u64::from(span)) as u32;
            h.remove(start, u64::from(start) + 1 + rng.below(64));
        }
        13 => {
            let start = rng.below(u64::from(span)) as u32;
            h.remove(start, LOGICAL_END);
        }
        14..=16 => {
            let lblk = rng.below(u64::from(span)) as u32;
            h.mark_written(lblk, 1 + rng.below(40) as u32);
        }
        _ => {
            let lblk = rng.below(u64::from(span) + 100) as u32;
            let extents = extents(&mut h.io, &h.ctx, &h.root).unwrap();
            h.check_lookup(lblk, &extents);
        }
    }
}

#[test]
fn random_operations_match_a_model_after_every_step() {
    let mut rng = Rng::from_env("random_operations_match_a_model_after_every_step");
    for (block_size, csum) in [(1024, true), (4096, false), (1024, false), (4096, true)] {
        let mut h = Harness::new(block_size, csum);
        let span = 4000 + rng.below(6000) as u32;
        for _ in 0..2500 {
            random_step(&mut h, &mut rng, span);
            h.check(&mut rng);
        }
        h.remove(0, LOGICAL_END);
        h.check(&mut rng);
        assert_eq!(depth(&h.root), 0);
        assert!(h.io.allocated.is_empty(), "removing everything frees every block");
    }
}

#[test]
fn sequential_appends_grow_a_1k_tree_to_depth_three_and_removal_frees_it_all() {
    let mut rng = Rng::from_env("sequential_appends_grow_a_1k_tree_to_depth_three");
    let mut h = Harness::new(1024, true);
    // Every other logical block: nothing merges, and appends fill nodes completely
    // (4 * 84 * 84 extents fit in depth 2).
    let count = 4 * 84 * 84 + 200;
    for i in 0..count {
        h.insert(2 * i, 1, i % 3 == 0, true);
        if i % 4000 == 0 {
            h.check(&mut rng);
        }
    }
    h.check(&mut rng);
    assert_eq!(depth(&h.root), 3);
    let blocks = tree_blocks(&mut h.io, &h.ctx, &h.root).unwrap();
    // Appends split at the end, so leaves are full: 28424 / 84 rounded up.
    let leaves = blocks.len()
        - blocks
            .iter()
            .filter(|&&b| parse_extent_node(&h.io.blocks[&b]).unwrap().0.depth > 0)
            .count();
    assert_eq!(leaves, (count as usize).div_ceil(84));
    // Punch holes and truncate in random places, then remove the rest from the front.
    for _ in 0..200 {
        let start = rng.below(2 * u64::from(count)) as u32;
        h.remove(start, u64::from(start) + 1 + rng.below(400));
    }
    h.check(&mut rng);
    h.remove(count, LOGICAL_END);
    h.check(&mut rng);
    let mut front = 0u32;
    while front < 2 * count {
        front += 1 + rng.below(3000) as u32;
        h.remove(0, u64::from(front));
        h.check(&mut rng);
    }
    assert!(h.io.allocated.is_empty(), "{} blocks leaked", h.io.allocated.len());
    assert_eq!(h.root, {
        let mut empty = [0u8; INODE_BLOCK_SIZE];
        init_root(&mut empty);
        empty
    });
}

#[test]
fn descending_inserts_split_in_half_and_keep_indexes_at_each_childs_first_block() {
    let mut rng = Rng::from_env("descending_inserts_split_in_half");
    for block_size in [1024, 4096] {
        let mut h = Harness::new(block_size, block_size == 1024);
        // Inserting in front of everything moves every ancestor index down each time.
        let count = if block_size == 1024 { 12_000 } else { 1500 };
        for i in (0..count).rev() {
            h.insert(3 * i + 1, 1 + i % 2, false, false);
            if i % 1000 == 0 {
                h.check(&mut rng);
            }
        }
        let expected_depth = if block_size == 1024 { 3 } else { 2 };
        assert_eq!(depth(&h.root), expected_depth, "{block_size}-byte blocks");
        // Random removals and conversions on the deep tree, fully checked each step.
        for _ in 0..300 {
            random_step(&mut h, &mut rng, 3 * count);
            h.check(&mut rng);
        }
        h.remove(0, LOGICAL_END);
        h.check(&mut rng);
        assert!(h.io.allocated.is_empty());
    }
}

#[test]
fn insert_merges_physically_contiguous_neighbours_up_to_the_length_limit() {
    let mut h = Harness::new(4096, true);
    let p = DATA_BASE;
    h.io.mark_allocated(p, 70000);
    let add = |h: &mut Harness, l: u32, off: u64, len: u32, unwritten: bool| {
        insert(&mut h.io, &h.ctx, &mut h.root, l, p + off, len, unwritten).unwrap();
    };
    add(&mut h, 10, 10, 5, false);
    add(&mut h, 15, 15, 5, false); // merges left
    add(&mut h, 5, 5, 5, false); // merges right
    add(&mut h, 25, 25, 5, false);
    add(&mut h, 20, 20, 5, false); // bridges both
    add(&mut h, 30, 31, 1, false); // physically discontiguous: no merge
    add(&mut h, 31, 32, 1, true); // different state: no merge
    let got = extents(&mut h.io, &h.ctx, &h.root).unwrap();
    assert_eq!(
        got,
        vec![
            Extent { logical: 5, len: 25, start: p + 5, unwritten: false },
            Extent { logical: 30, len: 1, start: p + 31, unwritten: false },
            Extent { logical: 31, len: 1, start: p + 32, unwritten: true },
        ]
    );
    // Length limits: 32768 written, 32767 unwritten.
    add(&mut h, 1000, 1000, 32000, false);
    add(&mut h, 33000, 33000, 768, false); // exactly 32768
    add(&mut h, 33768, 33768, 1, false); // would be 32769
    add(&mut h, 40000, 40000, 32000, true);
    add(&mut h, 72000, 72000 - 40000 + 40000, 767, true); // exactly 32767 when contiguous
    let got = extents(&mut h.io, &h.ctx, &h.root).unwrap();
    assert_eq!(got[3], Extent { logical: 1000, len: 32768, start: p + 1000, unwritten: false });
    assert_eq!(got[4], Extent { logical: 33768, len: 1, start: p + 33768, unwritten: false });
    assert_eq!(got[5].len, 32767, "{got:?}");
    let err = insert(&mut h.io, &h.ctx, &mut h.root, 90000, p, 32768, true).unwrap_err();
    assert!(matches!(err, FsError::Invalid(_)));
    let err = insert(&mut h.io, &h.ctx, &mut h.root, u32::MAX - 1, p, 2, false).unwrap_err();
    assert!(matches!(err, FsError::FileTooLarge));
    let err = insert(&mut h.io, &h.ctx, &mut h.root, 0, BLOCKS_COUNT - 1, 2, false).unwrap_err();
    assert!(matches!(err, FsError::Invalid(_)));
    let err = insert(&mut h.io, &h.ctx, &mut h.root, 29, p + 500, 2, false).unwrap_err();
    assert!(matches!(err, FsError::Invalid(_)), "overlaps the first extent's end");
}

#[test]
fn mark_written_splits_unwritten_extents_and_merges_converted_neighbours() {
    let mut h = Harness::new(1024, true);
    let p = DATA_BASE;
    h.io.mark_allocated(p, 100);
    insert(&mut h.io, &h.ctx, &mut h.root, 0, p, 10, false).unwrap();
    insert(&mut h.io, &h.ctx, &mut h.root, 10, p + 10, 20, true).unwrap();
    // The middle: head and tail stay unwritten.
    mark_written(&mut h.io, &h.ctx, &mut h.root, 15, 5).unwrap();
    let got = extents(&mut h.io, &h.ctx, &h.root).unwrap();
    let e =
        |logical, len, unwritten| Extent { logical, len, start: p + u64::from(logical), unwritten };
    assert_eq!(got, vec![e(0, 10, false), e(10, 5, true), e(15, 5, false), e(20, 10, true)]);
    // The head joins the written extents on both sides: one extent 0..20.
    mark_written(&mut h.io, &h.ctx, &mut h.root, 10, 5).unwrap();
    assert_eq!(
        extents(&mut h.io, &h.ctx, &h.root).unwrap(),
        vec![e(0, 20, false), e(20, 10, true)]
    );
    // A range over written blocks, the rest, and a hole past the end.
    mark_written(&mut h.io, &h.ctx, &mut h.root, 5, 100).unwrap();
    assert_eq!(extents(&mut h.io, &h.ctx, &h.root).unwrap(), vec![e(0, 30, false)]);
    assert_eq!(
        lookup(&mut h.io, &h.ctx, &h.root, 7).unwrap(),
        Lookup::Mapped { pblk: p + 7, len: 23, unwritten: false }
    );
    assert_eq!(lookup(&mut h.io, &h.ctx, &h.root, 30).unwrap(), Lookup::Hole { len_to_next: None });
}

#[test]
fn mark_written_in_the_middle_of_a_full_leaf_splits_it_once() {
    let mut h = Harness::new(1024, true);
    let mut rng = Rng(4);
    // Appends leave the first leaf full (84 extents).
    for i in 0..100 {
        h.insert(10 * i, 4, true, false);
    }
    let first_leaf = tree_blocks(&mut h.io, &h.ctx, &h.root).unwrap()[0];
    assert_eq!(parse_extent_node(&h.io.blocks[&first_leaf]).unwrap().0.entries, 84);
    // Converting the middle of extent 40 needs two more slots in that leaf.
    h.mark_written(401, 2);
    h.check(&mut rng);
    assert_eq!(tree_blocks(&mut h.io, &h.ctx, &h.root).unwrap().len(), 3);
    assert_eq!(extents(&mut h.io, &h.ctx, &h.root).unwrap().len(), 102);
    // And punching inside an extent of a full leaf splits it the same way.
    h.remove(10 * 83 + 1, 10 * 83 + 3);
    h.check(&mut rng);
}

#[test]
fn punching_inside_an_extent_of_a_full_root_grows_the_tree() {
    let mut h = Harness::new(1024, true);
    for i in 0..4 {
        h.insert(100 * i, 50, false, false);
    }
    assert_eq!(depth(&h.root), 0);
    let mut rng = Rng(1);
    h.remove(110, 120);
    assert_eq!(depth(&h.root), 1);
    h.check(&mut rng);
    assert_eq!(extents(&mut h.io, &h.ctx, &h.root).unwrap().len(), 5);
    // Removing all of the only leaf's entries frees it and returns to an empty root.
    h.remove(0, 1000);
    h.check(&mut rng);
    assert_eq!(depth(&h.root), 0);
    assert!(h.io.allocated.is_empty());
    assert_eq!(h.io.meta_freed.len(), 1);
}

#[test]
fn removal_at_the_front_of_a_leaf_moves_its_index() {
    let mut h = Harness::new(1024, true);
    let mut rng = Rng(2);
    for i in 0..300 {
        h.insert(10 * i, 4, false, false);
    }
    assert_eq!(depth(&h.root), 1);
    let (_, ExtentEntries::Index(before)) = parse_extent_node(&h.root).unwrap() else { panic!() };
    let second = before[1].logical;
    // Cut the first extent of the second leaf in half, then remove it entirely.
    h.remove(second, u64::from(second) + 2);
    h.check(&mut rng);
    let (_, ExtentEntries::Index(after)) = parse_extent_node(&h.root).unwrap() else { panic!() };
    assert_eq!(after[1].logical, second + 2);
    h.remove(second, u64::from(second) + 10);
    h.check(&mut rng);
    let (_, ExtentEntries::Index(after)) = parse_extent_node(&h.root).unwrap() else { panic!() };
    assert_eq!(after[1].logical, second + 10);
    // Data frees come as contiguous runs: a truncate of physically contiguous extents
    // frees them in one call.
    let mut h = Harness::new(4096, false);
    h.io.mark_allocated(DATA_BASE, 64);
    for i in 0..4 {
        let state = i % 2 == 1; // alternate states so the extents do not merge
        insert(&mut h.io, &h.ctx, &mut h.root, 16 * i, DATA_BASE + 16 * u64::from(i), 16, state)
            .unwrap();
    }
    assert_eq!(remove_range(&mut h.io, &h.ctx, &mut h.root, 8, LOGICAL_END).unwrap(), 56);
    assert_eq!(h.io.data_freed, vec![(DATA_BASE + 8, 56)]);
}

#[test]
fn lookup_reports_holes_up_to_the_next_extent_across_leaves() {
    let mut h = Harness::new(1024, false);
    let mut rng = Rng(3);
    for i in 0..500 {
        h.insert(1000 + 7 * i, 3, i % 5 == 0, false);
    }
    assert!(depth(&h.root) >= 1);
    let extents = extents(&mut h.io, &h.ctx, &h.root).unwrap();
    for lblk in (0..5000).chain([u32::MAX - 1, u32::MAX]) {
        h.check_lookup(lblk, &extents);
    }
    h.check(&mut rng);
}

/// `mapping` over a range says, block for block, what `lookup` says: for random trees of
/// every depth and random ranges, including past the last extent and to `u32::MAX`.
#[test]
fn mapping_of_a_range_agrees_with_lookup_block_by_block() {
    let mut rng = Rng::from_env("mapping_of_a_range_agrees_with_lookup_block_by_block");
    for block_size in [1024, 4096] {
        let mut h = Harness::new(block_size, block_size == 1024);
        for round in 0..40 {
            for _ in 0..60 {
                let lblk = rng.below(6000) as u32;
                let len = 1 + rng.below(if round % 4 == 0 { 300 } else { 4 }) as u32;
                h.insert(lblk, len, rng.chance(4), rng.chance(2));
            }
            let ranges = [(0, 7000), (rng.below(6000) as u32, 6100), (5990, u32::MAX)];
            for (first, last) in ranges {
                let first = first.min(last);
                let runs = mapping(&mut h.io, &h.ctx, &h.root, first, last).unwrap();
                let mut lblk = u64::from(first);
                for (start, run) in runs {
                    assert_eq!(u64::from(start), lblk, "runs follow one another");
                    let len = match run {
                        Lookup::Mapped { len, .. } => len,
                        Lookup::Hole { len_to_next } => len_to_next.unwrap(),
                    };
                    assert!(len > 0);
                    // Spot-check the run's first and last block against lookup.
                    for at in [start, start + (len - 1)] {
                        let want = lookup(&mut h.io, &h.ctx, &h.root, at).unwrap();
                        match (run, want) {
                            (
                                Lookup::Mapped { pblk, unwritten, .. },
                                Lookup::Mapped { pblk: p, unwritten: u, .. },
                            ) => {
                                assert_eq!(
                                    (pblk + u64::from(at - start), unwritten),
                                    (p, u),
                                    "block {at}"
                                );
                            }
                            (Lookup::Hole { .. }, Lookup::Hole { .. }) => {}
                            (got, want) => panic!("block {at}: {got:?} vs {want:?}"),
                        }
                    }
                    lblk += u64::from(len);
                }
                assert_eq!(lblk, u64::from(last) + 1, "the runs cover the range");
            }
        }
        assert!(depth(&h.root) >= 1, "the tree grew past the root");
    }
}

#[test]
fn allocation_failure_leaves_the_tree_unchanged() {
    let mut h = Harness::new(1024, true);
    for i in 0..4 {
        h.insert(10 * i, 1, false, false);
    }
    // No block left for the root to grow into.
    h.io.blocks_count = DATA_BASE + (1 << 20);
    h.io.first_free = h.io.blocks_count;
    let before = h.root;
    let err = insert(&mut h.io, &h.ctx, &mut h.root, 100, DATA_BASE + 500, 1, false).unwrap_err();
    assert!(matches!(err, FsError::NoSpace), "{err}");
    assert_eq!(h.root, before);
}

#[test]
fn worst_case_blocks_touched_covers_splits_at_every_level_and_growth() {
    assert_eq!(worst_case_blocks_touched(0), 2);
    assert_eq!(worst_case_blocks_touched(3), 8);
    assert_eq!(worst_case_blocks_touched(9), 12, "depth is capped at 5");
    // Measure: appends that overflow every level at once.
    let mut h = Harness::new(1024, false);
    let mut most = 0;
    for i in 0..(4 * 84 * 84 + 1) {
        let depth_before = depth(&h.root);
        let root_before = h.root;
        let allocated_before = h.io.allocated.len();
        h.insert(2 * i, 1, false, false);
        // Touched: the new tree blocks, the old ones on the path (one per level, each
        // rewritten at most once), and the inode when the root changed.
        let new_blocks = h.io.allocated.len() - allocated_before - 1;
        let touched = new_blocks + usize::from(depth_before) + usize::from(root_before != h.root);
        most = most.max(touched);
        assert!(touched as u32 <= worst_case_blocks_touched(depth_before), "insert {i}");
    }
    assert_eq!(depth(&h.root), 3);
    assert_eq!(most as u32, worst_case_blocks_touched(2), "growing from depth 2 to 3");
}

/// A MemMetaIo that tolerates frees of blocks it never handed out (a hostile tree points
/// anywhere).
struct LenientIo(MemMetaIo);

impl MetaIo for LenientIo {
    fn block_size(&self) -> usize {
        self.0.block_size
    }
    fn blocks_count(&self) -> u64 {
        self.0.blocks_count
    }
    fn read_meta(&mut self, block: u64) -> Result<Vec<u8>> {
        self.0.read_meta(block)
    }
    fn write_meta(&mut self, block: u64, data: &[u8]) -> Result<()> {
        self.0.write_meta(block, data)
    }
    fn alloc_meta_block(&mut self, goal: u64) -> Result<u64> {
        self.0.alloc_meta_block(goal)
    }
    fn free_meta_block(&mut self, block: u64) -> Result<()> {
        self.0.allocated.remove(&block);
        Ok(())
    }
    fn free_data_blocks(&mut self, start: u64, count: u64) -> Result<()> {
        assert!(start.checked_add(count).is_some_and(|end| end <= self.0.blocks_count));
        Ok(())
    }
}

#[test]
fn hostile_tree_blocks_never_panic_or_hang_any_operation() {
    let mut rng = Rng::from_env("hostile_tree_blocks_never_panic_or_hang_any_operation");
    for (block_size, csum) in [(1024, false), (1024, true), (4096, false)] {
        let mut h = Harness::new(block_size, csum);
        h.io.blocks_count = DATA_BASE * 2;
        for _ in 0..700 {
            let lblk = rng.below(20_000) as u32;
            h.insert(lblk, 1 + rng.below(4) as u32, rng.chance(3), rng.chance(2));
        }
        let blocks = tree_blocks(&mut h.io, &h.ctx, &h.root).unwrap();
        assert!(depth(&h.root) >= 2 || block_size == 4096);
        let mut corrupted = 0;
        for round in 0..1500 {
            let mut io = LenientIo(h.io.clone());
            let mut root = h.root;
            for _ in 0..=rng.below(3) {
                let target = rng.below(blocks.len() as u64 + 1) as usize;
                let bytes: &mut [u8] = if target == blocks.len() {
                    &mut root
                } else {
                    io.0.blocks.get_mut(&blocks[target]).unwrap()
                };
                match rng.below(8) {
                    0 => bytes.iter_mut().for_each(|b| *b = rng.next() as u8),
                    _ => {
                        for _ in 0..=rng.below(4) {
                            let at = rng.below(bytes.len() as u64) as usize;
                            bytes[at] = match rng.below(4) {
                                0 => 0,
                                1 => 0xFF,
                                2 => bytes[at] ^ (1 << rng.below(8)),
                                _ => rng.next() as u8,
                            };
                        }
                    }
                }
                // Reseal so that mutations get past the checksum to the structure checks.
                if let (Some(seed), true) =
                    (h.ctx.csum_seed, target < blocks.len() && rng.chance(2))
                {
                    if let Ok((header, _)) = parse_extent_node(bytes) {
                        if header.block_checksum(seed, bytes).is_some() {
                            header.seal_block(seed, bytes);
                        }
                    }
                }
            }
            let ctx = h.ctx;
            let mut failed = false;
            let lblk = rng.below(20_000) as u32;
            failed |= lookup(&mut io, &ctx, &root, lblk).is_err();
            failed |= extents(&mut io, &ctx, &root).is_err();
            failed |= tree_blocks(&mut io, &ctx, &root).is_err();
            let len = 1 + rng.below(5) as u32;
            let pblk = DATA_BASE + 500_000 + round * 8;
            failed |= insert(&mut io, &ctx, &mut root, lblk, pblk, len, false).is_err();
            failed |= mark_written(&mut io, &ctx, &mut root, lblk.saturating_sub(50), 100).is_err();
            let start = rng.below(20_000) as u32;
            failed |=
                remove_range(&mut io, &ctx, &mut root, start, u64::from(start) + rng.below(3000))
                    .is_err();
            failed |= remove_range(&mut io, &ctx, &mut root, start, LOGICAL_END).is_err();
            corrupted += usize::from(failed);
        }
        println!("{block_size}-byte blocks, csum {csum}: {corrupted} of 1500 rounds saw errors");
        assert!(corrupted > 0, "mutations must be detected sometimes");
    }
}

#[test]
fn corrupted_nodes_are_reported_with_their_block() {
    let mut h = Harness::new(1024, true);
    for i in 0..200 {
        h.insert(5 * i, 2, false, false);
    }
    let blocks = tree_blocks(&mut h.io, &h.ctx, &h.root).unwrap();
    type Edit = fn(&mut Vec<u8>);
    let cases: [(&str, Edit); 4] = [
        ("checksum", |b| b[20] ^= 1),
        ("magic", |b| b[0] = 0),
        ("depth", |b| {
            b[6] = 1;
        }),
        ("eh_max", |b| {
            b[4] = 80;
        }),
    ];
    for (name, edit) in cases {
        let mut io = h.io.clone();
        let block = blocks[1];
        edit(io.blocks.get_mut(&block).unwrap());
        if name != "checksum" {
            let (header, _) = match parse_extent_node(&io.blocks[&block]) {
                Ok(parsed) => parsed,
                Err(_) => (
                    ExtentHeader { entries: 0, max: 84, depth: 0, generation: 0 },
                    ExtentEntries::Leaf(vec![]),
                ),
            };
            header.seal_block(0x1234_5678, io.blocks.get_mut(&block).unwrap());
        }
        let err = extents(&mut io, &h.ctx, &h.root).unwrap_err();
        assert!(matches!(err, FsError::Corrupted { block: b, .. } if b == block), "{name}: {err}");
    }
    // A root that is not an extent header is reported at the inode's block.
    let mut root = h.root;
    root[0] = 0;
    let err = lookup(&mut h.io, &h.ctx, &root, 0).unwrap_err();
    assert!(matches!(err, FsError::Corrupted { block: 77, .. }), "{err}");
    // An index pointing at a child that starts elsewhere.
    let mut io = h.io.clone();
    let data = io.blocks.get_mut(&blocks[1]).unwrap();
    data[12] = data[12].wrapping_add(1);
    let (header, _) = parse_extent_node(data).unwrap();
    header.seal_block(0x1234_5678, data);
    let err = extents(&mut io, &h.ctx, &h.root).unwrap_err();
    assert!(matches!(err, FsError::Corrupted { .. }), "{err}");
}
