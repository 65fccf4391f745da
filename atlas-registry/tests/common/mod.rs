//! Helpers shared by the GPU tests: random data, CPU references, poisoning.

#![allow(dead_code, unreachable_pub)]

use std::time::{SystemTime, UNIX_EPOCH};

/// A small xorshift generator, seeded from the clock (fresh data on every run).
pub struct Rng(u64);

impl Default for Rng {
    fn default() -> Self {
        Self::new()
    }
}

impl Rng {
    /// A generator seeded from the clock.
    pub fn new() -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        Self(nanos | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// `n` values uniform in [-1, 1).
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
}

/// Asserts two float slices agree to a relative tolerance, naming the first mismatch.
pub fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * w.abs().max(1.0),
            "{what}: element {i}: got {g}, want {w}"
        );
    }
}

/// The cubins of `model` for device 0's own architecture (the GPU tests' device).
pub fn device_cubins(model: &str) -> atlas_kernels::Blobs {
    let (major, minor) = atlas_registry::host(0).expect("a GPU").compute_capability();
    atlas_kernels::cubin_for_model(model, major * 10 + minor)
        .unwrap_or_else(|| panic!("no cubins of {model} for sm_{major}{minor}"))
}
