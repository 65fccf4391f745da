//! The one random generator of the tests: SplitMix64.
//!
//! Two ways to seed it. [`Rng::from_seed`] gives the same numbers for the same seed, always: the
//! blob fuzzer's mutants are made from a seed alone, and seeds it printed (or that
//! `blob_fuzz.rs` lists) must keep making the same mutant, so this algorithm and the
//! [`below`](Rng::below) / [`index`](Rng::index) / [`chance`](Rng::chance) / [`bytes`](Rng::bytes)
//! reductions must not change. [`Rng::new`] gives fresh data on every run (GPU tests compare with
//! a CPU reference on data nobody chose): seeded from the clock, or from `ATLAS_TEST_SEED` (or its
//! older name `RELIABILITY_SEED`) to repeat a run; it prints the seed it took.

use std::time::{SystemTime, UNIX_EPOCH};

/// The variables that fix [`Rng::new`]'s seed, first found first.
const SEED_VARS: [&str; 2] = ["ATLAS_TEST_SEED", "RELIABILITY_SEED"];

/// SplitMix64: one 64-bit state, every seed (0 included) a good start.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Default for Rng {
    fn default() -> Self {
        Self::new()
    }
}

impl Rng {
    /// The generator for `seed`: the same numbers for the same seed.
    pub fn from_seed(seed: u64) -> Self {
        Self(seed)
    }

    /// A generator with a fresh seed (the clock's), or the one `ATLAS_TEST_SEED` gives. Prints
    /// the seed with the name of the calling thread (the test harness names it after the test),
    /// so that a failing run can be repeated.
    pub fn new() -> Self {
        let fixed = SEED_VARS
            .iter()
            .find_map(|var| std::env::var(var).ok()?.trim().parse().ok());
        let seed = fixed.unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0x9E37_79B9_7F4A_7C15, |d| d.as_nanos() as u64)
        });
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("a thread");
        println!("{name}: seed {seed} (ATLAS_TEST_SEED={seed} repeats this run)");
        Self::from_seed(seed)
    }

    /// A generator for another thread, seeded from this one.
    pub fn fork(&mut self) -> Self {
        Self::from_seed(self.next_u64())
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }

    /// Uniform in `[lo, hi)`, from 24 random bits.
    pub fn f32_in(&mut self, lo: f32, hi: f32) -> f32 {
        let unit = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * unit
    }

    /// Uniform in `[-1, 1)`.
    pub fn f32(&mut self) -> f32 {
        self.f32_in(-1.0, 1.0)
    }

    /// `n` values uniform in `[lo, hi)`.
    pub fn f32s(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.f32_in(lo, hi)).collect()
    }

    /// `n` values uniform in `[-1, 1)`.
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        self.f32s(n, -1.0, 1.0)
    }
}
