//! Where the journal lives on the device: a map from journal-relative block numbers (block 0 is
//! the journal superblock) to device byte offsets. For an internal ext4 journal the map comes
//! from inode 8's extent tree; tests use one contiguous run.

/// One contiguous run of journal blocks: journal blocks `log_start .. log_start + len` live at
/// file-system blocks `fs_block .. fs_block + len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocationExtent {
    pub log_start: u32,
    pub fs_block: u64,
    pub len: u32,
}

/// The journal's blocks on the device. Invariant (checked by [`JournalLocation::new`]): extents are
/// sorted, contiguous in journal block numbers from 0, and non-empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalLocation {
    block_size: u32,
    extents: Vec<LocationExtent>,
    len_blocks: u32,
}

/// Why a set of extents does not describe a journal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid journal location: {0}")]
pub struct LocationError(pub String);

impl JournalLocation {
    pub fn new(block_size: u32, mut extents: Vec<LocationExtent>) -> Result<Self, LocationError> {
        if !block_size.is_power_of_two() || !(1024..=65536).contains(&block_size) {
            return Err(LocationError(format!("block size {block_size}")));
        }
        extents.sort_by_key(|e| e.log_start);
        let mut next = 0u32;
        for e in &extents {
            if e.len == 0 || e.log_start != next {
                return Err(LocationError(format!(
                    "extent {e:?} leaves a hole or overlaps (expected journal block {next})"
                )));
            }
            next = e
                .log_start
                .checked_add(e.len)
                .ok_or_else(|| LocationError(format!("extent {e:?} overflows")))?;
        }
        if next == 0 {
            return Err(LocationError("no blocks".into()));
        }
        Ok(JournalLocation { block_size, extents, len_blocks: next })
    }

    /// A journal of `len_blocks` blocks starting at file-system block `fs_block`.
    pub fn contiguous(
        block_size: u32,
        fs_block: u64,
        len_blocks: u32,
    ) -> Result<Self, LocationError> {
        Self::new(block_size, vec![LocationExtent { log_start: 0, fs_block, len: len_blocks }])
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }
    pub fn len_blocks(&self) -> u32 {
        self.len_blocks
    }
    pub fn extents(&self) -> &[LocationExtent] {
        &self.extents
    }

    /// The file-system block holding journal block `log_block`, or `None` past the end.
    pub fn fs_block(&self, log_block: u32) -> Option<u64> {
        let i = self.extents.partition_point(|e| e.log_start <= log_block).checked_sub(1)?;
        let e = &self.extents[i];
        (log_block < e.log_start + e.len).then(|| e.fs_block + u64::from(log_block - e.log_start))
    }

    /// The device byte offset of journal block `log_block`, or `None` past the end.
    pub fn device_offset(&self, log_block: u32) -> Option<u64> {
        self.fs_block(log_block).map(|b| b * u64::from(self.block_size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fragmented_location_maps_each_run() {
        let loc = JournalLocation::new(
            4096,
            vec![
                LocationExtent { log_start: 3, fs_block: 900, len: 2 },
                LocationExtent { log_start: 0, fs_block: 100, len: 3 },
            ],
        )
        .unwrap();
        assert_eq!(loc.len_blocks(), 5);
        assert_eq!(loc.fs_block(0), Some(100));
        assert_eq!(loc.fs_block(2), Some(102));
        assert_eq!(loc.fs_block(3), Some(900));
        assert_eq!(loc.fs_block(4), Some(901));
        assert_eq!(loc.fs_block(5), None);
        assert_eq!(loc.device_offset(1), Some(101 * 4096));
    }

    #[test]
    fn location_with_a_hole_is_rejected() {
        let holey = vec![
            LocationExtent { log_start: 0, fs_block: 100, len: 3 },
            LocationExtent { log_start: 4, fs_block: 900, len: 2 },
        ];
        assert!(JournalLocation::new(4096, holey).is_err());
        assert!(JournalLocation::new(4096, vec![]).is_err());
        assert!(JournalLocation::new(1000, vec![]).is_err());
    }
}
