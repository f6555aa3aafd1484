//! Writes the seed corpus of every fuzz target: `cargo run -p quill-fuzzing --example
//! seed_corpus -- DIR` fills `DIR/<target>/<seed name>` (the repository keeps them in
//! `fuzz/corpus`). Existing files of the same name are overwritten; others are left alone.

use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let dir = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "fuzz/corpus".into()));
    let seeds = quill_fuzzing::seeds::seeds();
    for seed in &seeds {
        let target_dir = dir.join(seed.target);
        std::fs::create_dir_all(&target_dir)?;
        std::fs::write(target_dir.join(&seed.name), &seed.bytes)?;
    }
    for (target, _) in quill_fuzzing::TARGETS {
        let (count, bytes) = seeds
            .iter()
            .filter(|s| s.target == target)
            .fold((0, 0), |(n, b), s| (n + 1, b + s.bytes.len()));
        println!("{target:12} {count:3} seeds, {bytes:7} bytes");
    }
    println!("written to {}", dir.display());
    Ok(())
}
