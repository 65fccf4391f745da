//! A launch with an 8 KiB struct by value against the raw driver, as ratios pair by pair (see
//! [`paired`]).
//!
//! `large_params_paired/mix_8k/{raw,atlas}`: one side of a pair is a batch of [`LAUNCHES`] raw
//! `cuLaunchKernel` of `mix_8k` (`kernels/large_params.cu`: an 8,192-byte struct, a pointer and
//! a word: 8,204 bytes of parameters) on the registry's stream, then a synchronize; the other is
//! the same batch through `Kernel::launch` with the struct as a typed argument (the layout, the
//! buffer's context and the large-parameter checks included), also followed by the synchronize.
//! `raw` against itself is what the method reads when there is no difference.
//!
//! The kernel is compiled at the start of the group with the NVRTC Atlas finds
//! (`ATLAS_NVRTC_PATH`, which must name one of CUDA 12.1 or newer: 12.0 cannot compile it);
//! without one the group says why in one line and is skipped.

use std::ffi::c_void;
use std::time::Duration;

use atlas_registry::{AtlasRegistry, CudaSource, DeviceBuffer, LaunchConfig, Model};
use criterion::BenchmarkId;

use crate::paired::{self, timed};
use crate::{Env, PairedCriterion, check, ok, sym};

/// Launches per batch.
const LAUNCHES: usize = 256;
/// The words of `mix_8k`'s struct.
const WORDS: usize = 2048;

/// `Kernel::launch` of `mix_8k` with an 8 KiB struct against raw `cuLaunchKernel`.
pub(crate) fn large_params(c: &mut PairedCriterion, env: &Env) {
    let source = CudaSource::new(
        "large_params.cu",
        include_str!("../../kernels/large_params.cu"),
    )
    .option("-std=c++17");
    let model = Model::new().source("large_params", source);
    let registry = match AtlasRegistry::load_model(0, &model) {
        Ok(registry) => registry,
        Err(e) => {
            let reason = e.to_string().replace('\n', " ");
            println!("large_params_paired: not run: {reason}");
            return;
        }
    };
    let mix = ok(
        registry.function_cached("large_params", "mix_8k"),
        "looking up mix_8k",
    );
    let raw_mix = ok(
        registry.raw_function_cached("large_params", "mix_8k"),
        "looking up mix_8k",
    )
    .raw();
    let stream = env.registry.stream();
    let raw_stream = env.registry.raw_stream();
    let launch = sym!(env.cuda, cuLaunchKernel);
    let stream_sync = sym!(env.cuda, cuStreamSynchronize);
    let mut out = ok(
        DeviceBuffer::<u32>::alloc(registry.ctx(), WORDS + 1),
        "allocating the output",
    );
    let out_ptr = out.device_ptr();
    let words: [u32; WORDS] = std::array::from_fn(|i| i as u32 * 7 + 1);
    let salt = 0x5eed_u32;
    let cfg = LaunchConfig::for_elements(WORDS as u32, 256);
    let sync = || {
        // SAFETY: the registry's stream lives for the process.
        check(unsafe { stream_sync(raw_stream) }, "cuStreamSynchronize");
    };
    let raw = || {
        let mut params = [
            (&words as *const [u32; WORDS]).cast_mut().cast::<c_void>(),
            (&out_ptr as *const u64).cast_mut().cast(),
            (&salt as *const u32).cast_mut().cast(),
        ];
        for _ in 0..LAUNCHES {
            // SAFETY: `mix_8k` takes an 8,192-byte struct, a pointer and a word, which `params`
            // points to; it writes the 2,049 words of `out`; function and stream are of the
            // primary context, which Env::new made current.
            let status = unsafe {
                launch(
                    raw_mix,
                    cfg.grid.0,
                    1,
                    1,
                    cfg.block.0,
                    1,
                    1,
                    0,
                    raw_stream,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            };
            check(status, "cuLaunchKernel");
        }
        sync();
    };
    let atlas = std::cell::RefCell::new(|| {
        for _ in 0..LAUNCHES {
            // SAFETY: as above; `out` outlives the synchronize that follows.
            ok(
                unsafe { mix.launch(stream, &cfg, (words, &mut out, salt)) },
                "launching mix_8k",
            );
        }
        sync();
    });
    let atlas = || (atlas.borrow_mut())();
    let mut group = c.benchmark_group("large_params_paired");
    group.sampling_mode(paired::SAMPLING);
    group.measurement_time(Duration::from_secs(3));
    for (variant, other) in [("raw", &raw as &dyn Fn()), ("atlas", &atlas)] {
        let mut other_first = false;
        group.bench_function(BenchmarkId::new("mix_8k", variant), |b| {
            b.iter_custom(|iters| {
                paired::pairs(iters, &mut other_first, |other_side| {
                    if other_side {
                        timed(other)
                    } else {
                        timed(&raw)
                    }
                })
            })
        });
    }
    group.finish();
}
