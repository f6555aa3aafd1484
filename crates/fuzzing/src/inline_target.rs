//! The `inline_data` target: the inline-data codec (`ondisk::ext4::inline`) over an `i_block`
//! and a `system.data` value the input gives, read as a file and as a directory.

use ondisk::ext4::dir::{parse_dir_block, parse_dots};
use ondisk::ext4::inline::{self, InlineEntry};
use ondisk::ext4::INODE_BLOCK_SIZE;

use crate::input::Input;

/// The longest value an input gives (a 1 KiB inode's in-inode area is less).
const VALUE_MAX: usize = 1024;

/// `inline_data`: `[block size: 1 KiB << (u8 % 3)][tail: u8 & 1][i_size u16][value length
/// u16 % 1024][i_block, 60 bytes][value]`. As a file, the bytes are exactly `i_size` long when
/// read, and split back into the same `i_block` prefix and value prefix. As a directory, what
/// parses encodes back into the same parent and entries; the first block it converts to is
/// a valid leaf with "." and ".." and the same entries in order.
pub fn inline_data(data: &[u8]) {
    let mut input = Input::new(data);
    let block_size = 1024usize << (input.u8() % 3);
    let has_tail = input.u8() & 1 == 1;
    let size = input.u16();
    let value_len = usize::from(input.u16()) % VALUE_MAX;
    let mut i_block = [0u8; INODE_BLOCK_SIZE];
    let head = input.bytes(INODE_BLOCK_SIZE);
    i_block[..head.len()].copy_from_slice(head);
    let value = input.bytes(value_len).to_vec();

    if let Ok(bytes) = inline::file_bytes(&i_block, &value, u64::from(size)) {
        assert_eq!(bytes.len(), usize::from(size), "inline file of the wrong length");
        let (head, tail) = inline::split_file_bytes(&bytes);
        let kept = bytes.len().min(INODE_BLOCK_SIZE);
        assert_eq!(head[..kept], i_block[..kept], "i_block bytes moved");
        assert_eq!(tail, value[..tail.len()], "value bytes moved");
    }

    let Ok(dir) = inline::parse_dir(&i_block, &value) else {
        return;
    };
    let (again_block, again_value) =
        inline::encode_dir(dir.parent, &dir.entries, 0, VALUE_MAX).expect("what parsed fits");
    let again = inline::parse_dir(&again_block, &again_value).expect("what was encoded parses");
    assert_eq!(again, dir, "inline directory round trip");
    if let Ok(block) = inline::dir_block_image(&i_block, &value, 12, block_size, has_tail) {
        assert_eq!(block.len(), block_size);
        let (dot, dotdot) = parse_dots(&block).expect("the converted block has dots");
        assert_eq!((dot.inode, dotdot.inode), (12, dir.parent));
        let live = parse_dir_block(&block, has_tail).expect("the converted block parses");
        let entries: Vec<InlineEntry> = live
            .iter()
            .skip(2)
            .map(|e| InlineEntry { name: e.name.to_vec(), inode: e.inode, file_type: e.file_type })
            .collect();
        assert_eq!(entries, dir.entries, "the converted block holds the same entries");
    }
}
