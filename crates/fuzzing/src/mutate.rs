//! A small seeded mutator for the stable CI test: the kinds of change libFuzzer makes (bit
//! flips, interesting values, inserted, removed, copied and spliced bytes), driven by
//! [`ondisk::testing::Rng`] so a failing run replays from its printed seed.

use ondisk::testing::Rng;

/// Values parsers trip on: zero, ones, signed and unsigned extremes.
const INTERESTING: [u32; 12] =
    [0, 1, 2, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0x8000, 0xFFFF, 0x7FFF_FFFF, 0xFFFF_FFFF];

/// Longest input a mutation produces.
pub const MUTATED_LEN_MAX: usize = 70_000;

/// A mutant of `seed`, spliced with `other` now and then: 1 to 8 changes.
pub fn mutate(rng: &mut Rng, seed: &[u8], other: &[u8]) -> Vec<u8> {
    let mut data = seed.to_vec();
    for _ in 0..=rng.below(8) {
        mutate_once(rng, &mut data, other);
    }
    data.truncate(MUTATED_LEN_MAX);
    data
}

fn mutate_once(rng: &mut Rng, data: &mut Vec<u8>, other: &[u8]) {
    if data.is_empty() {
        let count = 1 + rng.below(16) as usize;
        data.extend(rng.bytes(count));
        return;
    }
    let len = data.len() as u64;
    let at = rng.below(len) as usize;
    match rng.below(9) {
        0 => data[at] ^= 1 << rng.below(8),
        1 => data[at] = rng.next() as u8,
        2 => {
            let value = INTERESTING[rng.below(INTERESTING.len() as u64) as usize];
            let width = [1, 2, 4][rng.below(3) as usize].min(data.len() - at);
            let bytes = if rng.chance(2) { value.to_le_bytes() } else { value.to_be_bytes() };
            data[at..at + width].copy_from_slice(&bytes[..width]);
        }
        3 => {
            let value = rng.next() as u8;
            data[at] = data[at].wrapping_add(value % 16).wrapping_sub(8);
        }
        4 => {
            let count = 1 + rng.below(16) as usize;
            let inserted = rng.bytes(count);
            data.splice(at..at, inserted);
        }
        5 => {
            let end = (at + 1 + rng.below(32) as usize).min(data.len());
            data.drain(at..end);
        }
        6 => {
            let from = rng.below(len) as usize;
            let count = (1 + rng.below(64) as usize).min(data.len() - from).min(data.len() - at);
            let chunk = data[from..from + count].to_vec();
            data[at..at + count].copy_from_slice(&chunk);
        }
        7 if !other.is_empty() => {
            let from = rng.below(other.len() as u64) as usize;
            let count = (1 + rng.below(256) as usize).min(other.len() - from);
            data.splice(at..at, other[from..from + count].iter().copied());
        }
        _ => data.truncate(at.max(1)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutants_are_bounded_and_replayable() {
        let seed = vec![7u8; 100];
        let (mut a, mut b) = (Rng::new(5), Rng::new(5));
        for _ in 0..500 {
            let m = mutate(&mut a, &seed, b"other bytes");
            assert_eq!(m, mutate(&mut b, &seed, b"other bytes"));
            assert!(m.len() <= MUTATED_LEN_MAX);
        }
        assert!(!mutate(&mut a, &[], &[]).is_empty());
    }
}
