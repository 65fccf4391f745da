//! Many threads and two devices: sixteen threads launching through one registry while other
//! models load and drop beside them, and two GPUs used at once, each with its own context.
//!
//! GPU: `cargo test -p atlas-registry --test concurrency -- --include-ignored`
//! (`two_gpus_are_independent` needs two GPUs and fails with fewer).

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use atlas_kernels::ptx_for_model;
use atlas_registry::{
    AtlasError, AtlasRegistry, CudaStream, DeviceBuffer, FunctionCache, LaunchConfig, device_count,
    host,
};
use support::blobs::{NEEDS_GPU, load};
use support::reference::{scale_and_check, transform_and_check};
use support::rng::Rng;

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn sixteen_threads_launch_through_one_registry_while_models_load_and_drop() {
    const THREADS: usize = 16;
    // Launches per thread: 10,000, or `ATLAS_CONCURRENCY_LAUNCHES` (fewer under a sanitizer).
    let launches: usize = std::env::var("ATLAS_CONCURRENCY_LAUNCHES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000);
    static SCALE: FunctionCache = FunctionCache::new("elementwise", "scale");
    let mut rng = Rng::new();
    let registry = load("demo");
    let finished = AtomicUsize::new(0);
    let loader_cycles = AtomicUsize::new(0);
    let started = Instant::now();

    /// Counts a worker as finished even when it panics, so the loader never waits forever.
    struct Finished<'a>(&'a AtomicUsize);
    impl Drop for Finished<'_> {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::Release);
        }
    }

    std::thread::scope(|s| {
        let mut loader_rng = rng.fork();
        let (finished, loader_cycles) = (&finished, &loader_cycles);
        s.spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(120);
            while finished.load(Ordering::Acquire) < THREADS && Instant::now() < deadline {
                for model in ["model_a", "model_b"] {
                    let other = load(model);
                    transform_and_check(&other, model, &mut loader_rng);
                    drop(other);
                }
                loader_cycles.fetch_add(1, Ordering::Relaxed);
            }
        });
        for t in 0..THREADS {
            let mut rng = rng.fork();
            let registry = &registry;
            s.spawn(move || {
                let _finished = Finished(finished);
                let stream = CudaStream::new(registry.ctx()).expect("a stream per thread");
                let n = 200 + t * 7;
                let input = rng.f32s(n, 1.0, 2.0);
                let mut poisoned = input.clone();
                poisoned.extend(std::iter::repeat_n(f32::NAN, 32));
                let mut x =
                    DeviceBuffer::from_slice(registry.ctx(), &stream, &poisoned).expect("upload");
                let cfg = LaunchConfig::for_elements(n as u32, 64);
                // Powers of two, never 1: exact in f32, and a lost or doubled launch shows.
                let mut exponent = 0i32;
                let mut factors = Vec::with_capacity(launches + 1);
                for _ in 0..launches {
                    let mut step = [-2, -1, 1, 2][rng.index(4)];
                    if (exponent + step).abs() > 20 {
                        step = -step;
                    }
                    exponent += step;
                    factors.push(2f32.powi(step));
                }
                if exponent == 0 {
                    // End away from 1, so that a run where nothing happened cannot pass.
                    exponent += 2;
                    factors.push(4.0);
                }
                for (i, &factor) in factors.iter().enumerate() {
                    // SAFETY: `x` holds `n` floats and 32 NaNs after them; `scale` touches the
                    // first `n`. It outlives the launches (synchronized after the loop).
                    unsafe {
                        SCALE
                            .get(registry)
                            .expect("cached elementwise::scale")
                            .launch(&stream, &cfg, (&mut x, factor, n as u32))
                    }
                    .unwrap_or_else(|e| panic!("thread {t}, launch {i}: {e}"));
                }
                stream.synchronize().expect("synchronize");
                let out = x.to_vec(&stream).expect("download");
                for (i, &given) in input.iter().enumerate() {
                    let want = factors.iter().fold(given, |v, &f| v * f);
                    assert_eq!(
                        out[i].to_bits(),
                        want.to_bits(),
                        "thread {t} element {i}: {given} * 2^{exponent}"
                    );
                }
                assert!(
                    out[n..].iter().all(|v| v.is_nan()),
                    "thread {t} wrote past n"
                );
            });
        }
    });
    let cycles = loader_cycles.load(Ordering::Relaxed);
    println!(
        "{THREADS} threads x {launches} launches in {:?}, {cycles} load/drop cycles of model_a and model_b beside them",
        started.elapsed()
    );
    assert!(cycles >= 1, "the loader thread never finished a cycle");
    scale_and_check(&registry, &mut rng);
}

#[test]
#[ignore = "needs two NVIDIA GPUs"]
fn two_gpus_are_independent() {
    let count = device_count().expect(NEEDS_GPU);
    assert!(
        count >= 2,
        "this test needs two NVIDIA GPUs; the driver reports {count}"
    );
    let mut rng = Rng::new();
    let (h0, h1) = (host(0).expect("host 0"), host(1).expect("host 1"));
    assert_eq!((h0.ordinal(), h1.ordinal()), (0, 1));
    assert_ne!(h0.context().raw(), h1.context().raw(), "one context each");
    assert_ne!(h0.stream().raw(), h1.stream().raw(), "one stream each");

    let load_on = |ordinal: usize, model: &str| {
        AtlasRegistry::load(ordinal, ptx_for_model(model).unwrap())
            .unwrap_or_else(|e| panic!("{model} on device {ordinal}: {e}"))
    };
    let demo = [load_on(0, "demo"), load_on(1, "demo")];
    let models = [load_on(0, "model_a"), load_on(1, "model_b")];
    for (ordinal, registry) in demo.iter().enumerate() {
        assert_eq!(registry.host().ordinal(), ordinal);
    }
    // Interleaved on one thread: each call binds its own device's context.
    for _ in 0..3 {
        scale_and_check(&demo[0], &mut rng);
        scale_and_check(&demo[1], &mut rng);
        transform_and_check(&models[0], "model_a", &mut rng);
        transform_and_check(&models[1], "model_b", &mut rng);
    }
    // At once from two threads, one per device.
    std::thread::scope(|s| {
        for registry in &demo {
            let mut rng = rng.fork();
            s.spawn(move || {
                for _ in 0..20 {
                    scale_and_check(registry, &mut rng);
                }
            });
        }
    });
    // Dropping device 1's registries leaves device 0's working.
    let [demo0, demo1] = demo;
    drop(demo1);
    drop(models);
    scale_and_check(&demo0, &mut rng);

    // An ordinal past the last device is a clear error.
    let e = AtlasRegistry::load(count, ptx_for_model("demo").unwrap()).unwrap_err();
    assert!(
        matches!(e, AtlasError::InvalidDevice { ordinal, count: c } if ordinal == count && c == count),
        "{e:?}"
    );
    assert!(
        e.to_string().contains(&format!("has {count} device(s)")),
        "{e}"
    );
}
