//! Bad input to `quill recover`, `quill journal dump` and `quill info`: one line on stderr, exit
//! code 1, and the image is never touched.

mod common;

use common::*;

fn assert_one_line_failure(args: &[&str], image: &std::path::Path, what: &str) -> String {
    let before = std::fs::read(image).ok();
    let o = run(quill().args(args).arg(image));
    assert_eq!(o.status.code(), Some(1), "{what}: {}", text(&o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(stderr.trim_end().lines().count(), 1, "{what}: one line: {stderr}");
    assert!(stderr.starts_with("quill: "), "{what}: {stderr}");
    assert_eq!(std::fs::read(image).ok(), before, "{what}: the image was modified");
    stderr.into_owned()
}

#[test]
fn recover_and_dump_refuse_missing_and_foreign_images_without_touching_them() {
    let scratch = Scratch::new("cli-errors");
    let missing = scratch.path("missing.img");
    let junk = scratch.path("junk.img");
    std::fs::write(
        &junk,
        (0..1 << 20).map(|i: u32| (i.wrapping_mul(7919) >> 3) as u8).collect::<Vec<u8>>(),
    )
    .unwrap();
    for command in [&["recover"][..], &["journal", "dump"][..]] {
        assert_one_line_failure(command, &missing, "missing image");
        assert_one_line_failure(command, &junk, "not an ext4 image");
    }
}

#[test]
fn recover_refuses_an_image_without_a_journal() {
    let test = "recover_refuses_an_image_without_a_journal";
    if !have("mkfs.ext4", test) {
        return;
    }
    let scratch = Scratch::new("cli-nojournal");
    let image = scratch.path("nojournal.img");
    mkfs(&image, "16M", &["-O", "^has_journal"]);
    assert_one_line_failure(&["recover"], &image, "no journal");
}

/// A valid bigalloc image (its groups have more blocks than a bitmap block has bits, because
/// bitmaps count clusters) is described by `quill info`, never called corrupted, and its
/// journal dumped (read-write mounts: `fs/tests/indirect_kernel_image.rs`).
#[test]
fn a_bigalloc_image_is_described_and_its_journal_dumped() {
    let test = "a_bigalloc_image_is_described_and_its_journal_dumped";
    if !have("mkfs.ext4", test) {
        return;
    }
    let scratch = Scratch::new("cli-bigalloc");
    let image = scratch.path("bigalloc.img");
    mkfs(&image, "256M", &["-O", "bigalloc"]);
    let before = std::fs::read(&image).unwrap();
    for command in [&["info"][..], &["journal", "dump"][..]] {
        let o = run(quill().args(command).arg(&image));
        assert!(o.status.success(), "{command:?}: {}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(!out.contains("corrupt"), "{command:?}: {out}");
        if command == ["info"] {
            assert!(out.contains("bigalloc"), "{out}");
        }
    }
    assert!(std::fs::read(&image).unwrap() == before, "the image was modified");
}
