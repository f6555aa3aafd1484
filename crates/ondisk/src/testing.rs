//! Support for randomized tests across the workspace: one small seedable generator and the
//! seed convention every randomized test follows (`QUILL_SEED` when set, else the clock;
//! printed so a failing run can be replayed). Not used by the file system itself.

/// xorshift64*: small, seedable, and good enough to shake parsers and drive models. The field
/// is the raw state, so `Rng(4)` is a fixed stream; [`Rng::new`] and [`Rng::from_env`] make
/// the state odd (nonzero) from any seed.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    /// Thread `thread`'s own generator of a run seeded with `seed` (threads differ, and
    /// thread streams differ from the run's own).
    pub fn for_thread(seed: u64, thread: usize) -> Rng {
        Rng::new(seed ^ (thread as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    /// A generator from [`seed`]`(what)`.
    pub fn from_env(what: &str) -> Rng {
        Rng::new(seed(what))
    }

    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A value in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// True once in `one_in` draws on average.
    pub fn chance(&mut self, one_in: u64) -> bool {
        self.below(one_in) == 0
    }

    pub fn fill(&mut self, bytes: &mut [u8]) {
        for b in bytes {
            *b = self.next() as u8;
        }
    }

    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
}

/// The seed of randomized test `what`: `QUILL_SEED` when set, else the clock. Printed with
/// the line to replay it.
pub fn seed(what: &str) -> u64 {
    let seed = std::env::var("QUILL_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    println!("{what}: seed {seed} (replay with QUILL_SEED={seed})");
    seed
}
