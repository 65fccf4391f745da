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

/// Runs `module::scale` of `registry` over `n` fresh random floats followed by a NaN tail, and
/// checks the first `n` against the CPU (to `tol`, relative) and that the tail stayed NaN.
pub fn scale_with_nan_tail(
    registry: &atlas_registry::AtlasRegistry,
    module: &str,
    n: usize,
    tol: f32,
    what: &str,
) {
    const TAIL: usize = 61;
    let mut rng = Rng::new();
    let input = rng.vec(n);
    let factor = rng.f32() * 4.0;
    let mut host = input.clone();
    host.extend([f32::NAN; TAIL]);
    let stream = registry.stream();
    let mut x = atlas_registry::DeviceBuffer::from_slice(registry.ctx(), stream, &host).unwrap();
    let scale = registry.function_cached(module, "scale").unwrap();
    let cfg = atlas_registry::LaunchConfig::for_elements(n as u32, 256);
    // SAFETY: `x` holds `n + TAIL` floats and `scale` touches the first `n` (the NaN tail checks
    // its bound); `x` lives until `to_vec` below has waited for the launch on the same stream.
    unsafe { scale.launch(stream, &cfg, (&mut x, factor, n as u32)) }.unwrap();
    let got = x.to_vec(stream).unwrap();
    let want: Vec<f32> = input.iter().map(|v| v * factor).collect();
    assert_close(&got[..n], &want, tol, what);
    if let Some(i) = got[n..].iter().position(|v| !v.is_nan()) {
        panic!(
            "{what}: element {} past n was written: {}",
            n + i,
            got[n + i]
        );
    }
}
