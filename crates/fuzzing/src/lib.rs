//! Fuzz targets for quill: one function per target, `fn(&[u8])`, that feeds the bytes to quill's
//! parsers (or to a damaged image opened by quill) and must not panic, loop forever or allocate
//! without bound on any input. Where an encoder exists the target also checks the round trip
//! (parse → encode → parse gives the same value) with `assert!`, because a mismatch is a bug.
//!
//! The same functions run in two harnesses:
//! - `fuzz/` at the repository root (cargo-fuzz, nightly): `cargo +nightly fuzz run <target>`;
//! - `tests/targets.rs` (stable, part of `cargo test --workspace`): every target over its seeds
//!   ([`seeds`]), the regression inputs in `tests/regressions/<target>/`, and seeded random
//!   mutations of them.
//!
//! Most inputs start with a few configuration bytes read through [`Input`] (which superblock
//! variant, descriptor size, checksum seed, ...) followed by the structure's bytes; missing
//! bytes read as zero, so every input is valid. [`seeds`] writes real structures in that form.
//!
//! | target        | what it exercises                                                          |
//! |---------------|----------------------------------------------------------------------------|
//! | `superblock`  | ext4 `Superblock::parse` (as given and with its checksum resealed), geometry, encode |
//! | `group_desc`  | `GroupDesc::parse` (32- and 64-byte and other sizes), encode, checksums     |
//! | `inode`       | `Inode::parse`, encode, inode checksums, the in-inode xattr area              |
//! | `extent_node` | `parse_extent_node` (i_block and tree block), encode, block checksum         |
//! | `dir_block`   | linear directory blocks: parse, lookup, dots, insert/remove/replace/pack, tail checksum |
//! | `htree`       | `parse_dx_root`, `parse_dx_node`, encoders, dx checksum, `dx_hash` (every version) |
//! | `xattr_block` | `parse_xattr_block`, `parse_inode_xattrs`, encoders, hashes, checksum       |
//! | `jbd2`        | journal superblock, header, descriptor/commit/revoke blocks for every `LogFormat`, verifiers, encoders |
//! | `fast_commit` | fast-commit records and the area scan                                       |
//! | `indirect_map`| `fs::indirect`: lookups and run lists over an ext2/ext3 indirect block map the input describes |
//! | `inline_data` | `ext4::inline`: inline file bytes, inline directories (parse, encode, the block they convert to) |
//! | `quota_tree`  | `ext4::quota`: a quota file's header, tree scan, lookups, and an insert into it |
//! | `image`       | a small quill-made image damaged by a list of patches, opened, walked, modified and unmounted |

mod ext4_targets;
mod image_target;
mod indirect_target;
mod inline_target;
mod input;
mod jbd2_targets;
pub mod mutate;
mod quota_target;
pub mod samples;
pub mod seeds;

pub use ext4_targets::{dir_block, extent_node, group_desc, htree, inode, superblock, xattr_block};
pub use image_target::{image, BaseImage, IMAGE_VARIANTS};
pub use indirect_target::indirect_map;
pub use inline_target::inline_data;
pub use input::Input;
pub use jbd2_targets::{fast_commit, jbd2};
pub use quota_target::quota_tree;

/// A fuzz target: takes any bytes, must not panic.
pub type Target = fn(&[u8]);

/// Every target by name, in the order the table above lists them.
pub const TARGETS: [(&str, Target); 13] = [
    ("superblock", superblock),
    ("group_desc", group_desc),
    ("inode", inode),
    ("extent_node", extent_node),
    ("dir_block", dir_block),
    ("htree", htree),
    ("xattr_block", xattr_block),
    ("jbd2", jbd2),
    ("fast_commit", fast_commit),
    ("indirect_map", indirect_map),
    ("inline_data", inline_data),
    ("quota_tree", quota_tree),
    ("image", image),
];
