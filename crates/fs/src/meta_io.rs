//! The seam between the file system's structure modules (extent trees, directories, extended
//! attributes) and the machinery under them (journal handles, allocation).
//!
//! A structure module works on whole metadata blocks through [`MetaIo`] for the duration of one
//! operation: it reads a block, changes a copy, and writes the whole block back; the
//! implementation journals the write in the operation's handle. Keeping the modules behind this
//! trait lets each be tested against an in-memory implementation (see [`mem::MemMetaIo`]), and
//! keeps journal credits and allocation policy in one place.

use crate::error::Result;

/// Block access and allocation for one file-system operation.
pub trait MetaIo {
    /// The file system's block size in bytes.
    fn block_size(&self) -> usize;

    /// The number of blocks in the file system: valid block numbers are below it.
    fn blocks_count(&self) -> u64;

    /// The current contents of metadata block `block` (a copy). Errors with
    /// `FsError::BlockOutOfRange` for a block outside the file system.
    fn read_meta(&mut self, block: u64) -> Result<Vec<u8>>;

    /// Replaces the contents of metadata block `block` (journaled). `data` is one whole block.
    fn write_meta(&mut self, block: u64, data: &[u8]) -> Result<()>;

    /// Allocates one block for metadata near `goal` (0 means no preference). The block's
    /// contents are unspecified: the caller writes all of it with `write_meta` before relying on
    /// it. Errors with `FsError::NoSpace` when the file system is full.
    fn alloc_meta_block(&mut self, goal: u64) -> Result<u64>;

    /// Frees a metadata block (an extent-tree node, an xattr block, a directory block): the
    /// block is revoked so that neither recovery nor checkpointing writes old metadata over it
    /// once it is reused.
    fn free_meta_block(&mut self, block: u64) -> Result<()>;

    /// Frees `count` file-data blocks starting at `start` (with bigalloc, whole clusters:
    /// `block_map` decides when a cluster's last block goes, `clusters.rs`).
    fn free_data_blocks(&mut self, start: u64, count: u64) -> Result<()>;

    /// Blocks per allocation cluster (bigalloc), 1 otherwise. With clusters, a metadata block
    /// takes a whole cluster (`alloc_meta_block` returns its first block and `free_meta_block`
    /// frees the cluster holding the block), and a file's blocks go through `clusters.rs`.
    fn cluster_blocks(&self) -> u32 {
        1
    }

    /// Allocates up to `want` contiguous blocks for file data near `goal` (0: no preference);
    /// returns (first, count), count >= 1. With clusters: whole clusters, `first` a cluster's
    /// first block.
    fn alloc_data_blocks(&mut self, goal: u64, want: u32) -> Result<(u64, u32)> {
        let _ = want;
        Ok((self.alloc_meta_block(goal)?, 1))
    }

    /// File-data blocks `start .. start + count` are leaving their file: where the operation
    /// journals such blocks (directories, data=journal) they are revoked. Without clusters
    /// `free_data_blocks` does this itself; with them `clusters.rs` revokes the blocks the file
    /// mapped, not the whole clusters it frees.
    fn revoke_data(&mut self, _start: u64, _count: u64) -> Result<()> {
        Ok(())
    }

    /// Block `block` of a cluster its file owns already becomes a metadata block (a directory
    /// block) written whole in this operation: like a block `alloc_meta_block` hands out,
    /// nothing on the device points to it yet.
    fn claim_fresh(&mut self, _block: u64) {}

    /// The first block of `start .. start + len` that holds the file system's own metadata
    /// (superblock and descriptor copies, bitmaps, inode tables: the kernel's system zone),
    /// if any: a block map naming one is damaged, and writing through it would spread the
    /// damage. `None` where the caller has no such map (replay, tests).
    fn system_zone_overlap(&self, _start: u64, _len: u64) -> Option<u64> {
        None
    }

    /// Block `block`, written in this operation, loses something another block of the
    /// operation gains (a directory entry moved out of it): on a file system without a journal,
    /// where a crash can leave any of a commit's blocks unwritten, it is written after the
    /// others (`journal::HomeOrder::Late`). Blocks allocated in the operation are written
    /// before the others already. Nothing to do where the commit is atomic or absent.
    fn order_late(&mut self, _block: u64) {}

    /// The running transaction this operation's writes join, when fast commits may have to
    /// say what they change (`fsync_journal.rs`); `None` elsewhere (replay, tests).
    fn fast_commit_tid(&self) -> Option<ondisk::Tid> {
        None
    }

    /// Where values of extended attributes kept in inodes of their own (ea_inode) are made
    /// and freed: a file-system transaction; `None` elsewhere (lookups, replay, tests).
    fn value_inodes(&mut self) -> Option<&mut dyn crate::xattr::ValueInodes> {
        None
    }
}

/// An in-memory [`MetaIo`] for the structure modules' unit tests.
pub mod mem {
    use super::MetaIo;
    use crate::error::{FsError, Result};
    use std::collections::{BTreeSet, HashMap};

    /// Blocks in a map; allocation hands out the lowest free block at or above the goal.
    /// Freed and allocated blocks are tracked so tests can check for leaks and double frees.
    #[derive(Debug, Clone)]
    pub struct MemMetaIo {
        pub block_size: usize,
        pub blocks_count: u64,
        pub blocks: HashMap<u64, Vec<u8>>,
        /// Blocks currently allocated (metadata or data) by this instance.
        pub allocated: BTreeSet<u64>,
        /// The first block allocation may hand out.
        pub first_free: u64,
        /// Calls to `free_meta_block`, for tests that check revokes.
        pub meta_freed: Vec<u64>,
        /// Calls to `free_data_blocks` as (start, count).
        pub data_freed: Vec<(u64, u64)>,
    }

    impl MemMetaIo {
        pub fn new(block_size: usize, blocks_count: u64) -> Self {
            MemMetaIo {
                block_size,
                blocks_count,
                blocks: HashMap::new(),
                allocated: BTreeSet::new(),
                first_free: 1,
                meta_freed: Vec::new(),
                data_freed: Vec::new(),
            }
        }

        /// Marks `count` blocks from `start` allocated (as a caller allocating file data would).
        pub fn mark_allocated(&mut self, start: u64, count: u64) {
            for block in start..start + count {
                assert!(self.allocated.insert(block), "block {block} allocated twice");
            }
        }

        fn check(&self, block: u64) -> Result<()> {
            if block >= self.blocks_count {
                return Err(FsError::BlockOutOfRange { block, blocks_count: self.blocks_count });
            }
            Ok(())
        }
    }

    impl MetaIo for MemMetaIo {
        fn block_size(&self) -> usize {
            self.block_size
        }

        fn blocks_count(&self) -> u64 {
            self.blocks_count
        }

        fn read_meta(&mut self, block: u64) -> Result<Vec<u8>> {
            self.check(block)?;
            Ok(self.blocks.get(&block).cloned().unwrap_or_else(|| vec![0; self.block_size]))
        }

        fn write_meta(&mut self, block: u64, data: &[u8]) -> Result<()> {
            self.check(block)?;
            assert_eq!(data.len(), self.block_size, "write_meta takes whole blocks");
            self.blocks.insert(block, data.to_vec());
            Ok(())
        }

        fn alloc_meta_block(&mut self, goal: u64) -> Result<u64> {
            let start = goal.max(self.first_free);
            let free = (start..self.blocks_count)
                .chain(self.first_free..start)
                .find(|b| !self.allocated.contains(b))
                .ok_or(FsError::NoSpace)?;
            self.allocated.insert(free);
            Ok(free)
        }

        fn free_meta_block(&mut self, block: u64) -> Result<()> {
            assert!(self.allocated.remove(&block), "metadata block {block} freed twice");
            self.blocks.remove(&block);
            self.meta_freed.push(block);
            Ok(())
        }

        fn free_data_blocks(&mut self, start: u64, count: u64) -> Result<()> {
            for block in start..start + count {
                assert!(self.allocated.remove(&block), "data block {block} freed twice");
            }
            self.data_freed.push((start, count));
            Ok(())
        }
    }
}
