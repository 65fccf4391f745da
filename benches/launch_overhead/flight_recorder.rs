//! The flight recorder's cost on an eager launch (`recorder_paired`): a typed launch of `scale`
//! with the recorder on against a raw `cuLaunchKernel` (`…/on`), the same launch with the
//! recorder on against itself with the recorder off (`…/on_vs_off`, the recorder's own share),
//! and the raw batch against itself (`…/raw`, what the method reads when there is no
//! difference). The budget is 1 % of an eager launch.

use std::ffi::c_void;
use std::ptr::null_mut;

use atlas_registry::{DeviceBuffer, LaunchConfig};
use criterion::BenchmarkId;

use crate::{BATCH, Env, PairedCriterion, check, ok, paired, sym};

/// `scale`'s elements: one block.
const N: u32 = 256;

/// `recorder_paired/scale/{raw,on,on_vs_off}`.
pub(crate) fn flight_recorder(c: &mut PairedCriterion, env: &Env) {
    let registry = &env.registry;
    let recorder = registry.host().flight_recorder();
    let was_on = recorder.is_enabled();
    let stream = registry.stream();
    let mut x = ok(
        DeviceBuffer::from_slice(registry.ctx(), stream, &[1.0f32; N as usize]),
        "uploading the recorder bench's data",
    );
    let scale = ok(
        registry.function_cached("elementwise", "scale"),
        "elementwise::scale",
    );
    let raw_scale = env.raw_function("elementwise", c"scale");
    let launch_kernel = sym!(env.cuda, cuLaunchKernel);
    let cfg = LaunchConfig::for_elements(N, N);
    let (ptr, factor, n) = (x.device_ptr(), 1.0f32, N);
    let raw_stream = registry.raw_stream();
    let sync = env.syncer();
    let raw_batch = || {
        sync();
        paired::timed(|| {
            for _ in 0..BATCH {
                let mut params: [*mut c_void; 3] = [
                    (&raw const ptr).cast_mut().cast(),
                    (&raw const factor).cast_mut().cast(),
                    (&raw const n).cast_mut().cast(),
                ];
                // SAFETY: `scale` of the registry's module on its own stream; the array points
                // to a device pointer to `N` floats, a float and their count, all live here.
                let status = unsafe {
                    launch_kernel(
                        raw_scale,
                        cfg.grid.0,
                        cfg.grid.1,
                        cfg.grid.2,
                        cfg.block.0,
                        cfg.block.1,
                        cfg.block.2,
                        0,
                        raw_stream,
                        params.as_mut_ptr(),
                        null_mut(),
                    )
                };
                check(status, "cuLaunchKernel");
            }
        })
    };
    let atlas_batch = |on: bool, x: &mut DeviceBuffer<f32>| {
        recorder.set_enabled(on);
        sync();
        paired::timed(|| {
            for _ in 0..BATCH {
                // SAFETY: `scale` touches the `N` floats of `x`, which outlives the batch (the
                // next batch synchronizes first, and so does the end of this bench).
                let launched = unsafe { scale.launch(stream, &cfg, (&mut *x, 1.0f32, N)) };
                ok(launched, "launching scale");
            }
        })
    };
    let mut group = c.benchmark_group("recorder_paired");
    group.sampling_mode(paired::SAMPLING);
    let mut atlas_first = false;
    group.bench_function(BenchmarkId::new("scale", "raw"), |b| {
        b.iter_custom(|iters| paired::pairs(iters, &mut atlas_first, |_| raw_batch()))
    });
    group.bench_function(BenchmarkId::new("scale", "on"), |b| {
        b.iter_custom(|iters| {
            paired::pairs(iters, &mut atlas_first, |atlas_side| {
                if atlas_side {
                    atlas_batch(true, &mut x)
                } else {
                    raw_batch()
                }
            })
        })
    });
    group.bench_function(BenchmarkId::new("scale", "on_vs_off"), |b| {
        b.iter_custom(|iters| {
            paired::pairs(iters, &mut atlas_first, |atlas_side| {
                atlas_batch(atlas_side, &mut x)
            })
        })
    });
    group.finish();
    recorder.set_enabled(was_on);
    ok(registry.stream_synchronize(stream), "synchronize");
}
