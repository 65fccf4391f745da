//! The soak: a thousand load/launch/unload cycles beside launches on a long-lived registry keep
//! device and host memory flat, and every result exact.
//!
//! GPU: `cargo test -p atlas-registry --test soak -- --include-ignored`.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use atlas_kernels::ptx_for_model;
use atlas_registry::{
    AtlasRegistry, CudaStream, DeviceBuffer, FunctionCache, LaunchConfig, release,
};
use support::blobs::load;
use support::rng::Rng;

/// The resident set size of this process, from `/proc/self/status`.
fn rss_bytes() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kib: usize = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("a VmRSS line");
    kib * 1024
}

/// Free device memory of `registry`'s device (`cuMemGetInfo_v2`, its context bound first).
fn device_free_bytes(registry: &AtlasRegistry) -> usize {
    registry.ctx().bind().expect("bind the context");
    let cuda = atlas_registry::sys::driver().expect("the driver");
    let get_info =
        atlas_registry::sys::entry!(cuda, cuMemGetInfo_v2).expect("cuMemGetInfo_v2 exported");
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: both out-pointers are live locals; the registry's context is current on this thread
    // (bound just above).
    let status = unsafe { get_info(&mut free, &mut total) };
    assert_eq!(
        status,
        atlas_registry::sys::CUresult::CUDA_SUCCESS,
        "cuMemGetInfo_v2"
    );
    free
}

/// Sets its flag when dropped, so that a helper thread stops even when the test panics.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_thousand_load_drop_cycles_keep_device_and_host_memory_flat() {
    const CYCLES: usize = 1000;
    const DEVICE_WARMUP: usize = 1;
    const HOST_WARMUP: usize = 50;
    const DEVICE_SLACK: usize = 1 << 20;
    const HOST_SLACK: usize = 8 << 20;
    static SOAK_SCALE: FunctionCache = FunctionCache::new("elementwise", "scale");
    let mut rng = Rng::new();
    let blobs = ptx_for_model("demo").unwrap();
    let long_lived = load("demo");
    let stop = AtomicBool::new(false);
    let started = Instant::now();

    std::thread::scope(|s| {
        // Launches on the long-lived registry, on its own stream, for as long as the cycles run.
        let (long_lived, stop) = (&long_lived, &stop);
        let mut launcher_rng = rng.fork();
        let launcher = s.spawn(move || {
            let stream = CudaStream::new(long_lived.ctx()).expect("a stream");
            let n = 300;
            let input = launcher_rng.f32s(n, 1.0, 2.0);
            let mut x =
                DeviceBuffer::from_slice(long_lived.ctx(), &stream, &input).expect("upload");
            let cfg = LaunchConfig::for_elements(n as u32, 128);
            let mut launches = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for factor in [2.0f32, 0.5, 4.0, 0.25] {
                    // SAFETY: `x` holds `n` floats, all that `scale` touches; it outlives the
                    // launch (the stream is synchronized after each group of four).
                    unsafe {
                        SOAK_SCALE
                            .get(long_lived)
                            .expect("elementwise::scale")
                            .launch(&stream, &cfg, (&mut x, factor, n as u32))
                    }
                    .expect("launch");
                }
                launches += 4;
                stream.synchronize().expect("synchronize");
            }
            // Each group of four multiplies by 1: the data must be back where it started, exactly.
            let out = x.to_vec(&stream).expect("download");
            assert_eq!(
                out, input,
                "after {launches} launches beside the load/drop cycles"
            );
            launches
        });

        // Stops the launcher however this thread leaves the scope, a failed assertion included.
        let stop_launcher = SetOnDrop(stop);
        let mut device_start = 0;
        let mut host_start = 0;
        for cycle in 0..CYCLES {
            let registry = AtlasRegistry::load(0, blobs)
                .unwrap_or_else(|e| panic!("cycle {cycle}: load: {e}"));
            let n = 64 + rng.index(64);
            let input = rng.f32s(n, -8.0, 8.0);
            let factor = rng.f32_in(1.5, 3.0);
            let mut y = DeviceBuffer::from_slice(registry.ctx(), registry.stream(), &input)
                .expect("upload");
            // SAFETY: `y` holds `n` floats, all that `scale` touches; it outlives the launch
            // (`to_vec` below synchronizes the stream before `y` is dropped).
            unsafe {
                SOAK_SCALE
                    .get(&registry)
                    .expect("elementwise::scale")
                    .launch(
                        registry.stream(),
                        &LaunchConfig::for_elements(n as u32, 64),
                        (&mut y, factor, n as u32),
                    )
            }
            .expect("launch");
            let out = y.to_vec(registry.stream()).expect("download");
            for (i, (&got, &was)) in out.iter().zip(&input).enumerate() {
                assert_eq!(
                    got.to_bits(),
                    (was * factor).to_bits(),
                    "cycle {cycle}, element {i}"
                );
            }
            drop(y);
            if cycle % 2 == 0 {
                drop(registry);
            } else {
                release(registry).unwrap_or_else(|e| panic!("cycle {cycle}: release: {e}"));
            }
            if cycle + 1 == DEVICE_WARMUP {
                device_start = device_free_bytes(long_lived);
            }
            if cycle + 1 == HOST_WARMUP {
                host_start = rss_bytes();
            }
        }
        let device_end = device_free_bytes(long_lived);
        let host_end = rss_bytes();
        drop(stop_launcher);
        let launches = launcher.join().expect("the launcher thread");
        println!(
            "{CYCLES} cycles in {:?} beside {launches} launches; device free {device_start} -> {device_end} B, host RSS {host_start} -> {host_end} B",
            started.elapsed()
        );
        assert!(launches > 0, "the launcher thread never launched");
        assert!(
            device_end.abs_diff(device_start) <= DEVICE_SLACK,
            "device memory moved by {} B over {CYCLES} cycles (free {device_start} -> {device_end})",
            device_end as i64 - device_start as i64
        );
        assert!(
            host_end <= host_start + HOST_SLACK,
            "host memory grew by {} B over {CYCLES} cycles (RSS {host_start} -> {host_end})",
            host_end as i64 - host_start as i64
        );
    });
}
