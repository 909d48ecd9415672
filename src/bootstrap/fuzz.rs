//! Seeded, time-bounded fuzzing for the bootstrap's wire formats (tests only): a small
//! deterministic generator (splitmix64) and a driver that runs cases until a count or a time
//! budget is reached. A failing case is named with its seed and index; set
//! `OXCCL_FUZZ_SEED` (decimal or 0x-hex) to that seed to run the same cases again.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

/// A splitmix64 generator: fast, tiny, and good enough to pick test cases.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in 0..n (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// True with probability 1/n.
    pub fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }

    pub fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.below(from.len() as u64) as usize]
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }

    /// An i32 at an edge (0, ±1, the extremes, around `near`) or anywhere.
    pub fn edgy_i32(&mut self, near: i32) -> i32 {
        match self.below(8) {
            0 => self.pick(&[0, -1, 1, i32::MAX, i32::MIN]),
            1 => near.wrapping_add(self.below(3) as i32 - 1),
            2 => self.next_u64() as i32,
            _ => self.below(5) as i32,
        }
    }
}

/// The run's seed: `OXCCL_FUZZ_SEED` if set, else `default` (fixed, so runs repeat).
fn seed(default: u64) -> u64 {
    let Ok(text) = std::env::var("OXCCL_FUZZ_SEED") else {
        return default;
    };
    let text = text.trim();
    let parsed = match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    parsed.unwrap_or_else(|_| panic!("OXCCL_FUZZ_SEED={text} is not a number"))
}

/// Run `case` with a generator per case until `max_cases` or `budget` is reached; the number
/// of cases run. A case that panics is reported with the seed and its index.
pub fn run(
    name: &str,
    default_seed: u64,
    max_cases: usize,
    budget: Duration,
    mut case: impl FnMut(&mut Rng),
) -> usize {
    let seed = seed(default_seed);
    let start = Instant::now();
    let mut n = 0;
    while n < max_cases && start.elapsed() < budget {
        let mut rng = Rng::new(seed ^ (n as u64).wrapping_mul(0xd1b5_4a32_d192_ed03));
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| case(&mut rng))) {
            eprintln!("fuzz {name}: case {n} failed (OXCCL_FUZZ_SEED={seed:#x})");
            resume_unwind(panic);
        }
        n += 1;
    }
    eprintln!(
        "fuzz {name}: {n} cases in {:.1} s (OXCCL_FUZZ_SEED={seed:#x})",
        start.elapsed().as_secs_f64()
    );
    n
}
