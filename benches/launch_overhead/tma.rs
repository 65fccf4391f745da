//! A launch with a TMA descriptor through Atlas against the same raw `cuLaunchKernel`, pair by
//! pair (`tma_paired/tile/{raw,atlas}`): one side is a batch of [`BATCH`] raw launches of the
//! `hopper` model's `tma_tiles` (one block loading one 16 × 32 box) with the descriptor's 128
//! bytes as the first parameter, the other the same batch through `Kernel::launch` with `&map`
//! (the size, the parameter's place in the constant bank and the memory's context checked at each
//! launch); `atlas_raw` is `launch_on_stream` with the raw side's parameter array (no argument
//! checks: what the typed launch's checks cost is the difference); `atlas_bytes` is the typed
//! launch with the descriptor's bytes passed as a plain `[u64; 16]` value (the tensor map's own
//! checks, its place and its memory's context, are the difference). `raw` against itself is what
//! the method reads when there is no difference.
//!
//! Tensor maps need compute capability 9.0; on an older device this bench prints why it does not
//! run.

use std::ffi::c_void;
use std::time::Duration;

use atlas_registry::{
    AtlasRegistry, CudaStream, DeviceBuffer, DeviceMemory, LaunchConfig, TensorDataType, TensorMap,
    TiledTensor,
};
use criterion::BenchmarkId;

use crate::{BATCH, Env, PairedCriterion, check, ok, paired, sym};

/// The box one launch loads: rows, then floats of a row.
const BOX: (u32, u32) = (16, 32);

/// `tma_paired/tile/{raw,atlas_raw,atlas_bytes,atlas}`.
pub(crate) fn tma(c: &mut PairedCriterion, env: &Env) {
    let host = env.registry.host();
    if host.compute_capability().0 != 9 {
        let (major, minor) = host.compute_capability();
        println!(
            "tma_paired: not run: tma_tiles loads through TMA in its sm_90 cubin, device 0 is {major}.{minor}"
        );
        return;
    }
    let blobs = atlas_kernels::cubin_for_model("hopper", 90).expect("hopper has sm_90 cubins");
    let registry = ok(AtlasRegistry::load(0, blobs), "loading the hopper model");
    let ctx = registry.ctx();
    let stream = ok(CudaStream::new(ctx), "creating a stream");
    let x = ok(
        DeviceBuffer::from_slice(ctx, &stream, &[1.0f32; 64 * 64]),
        "uploading the tensor",
    );
    let map = ok(
        TensorMap::tiled(
            x.as_slice(),
            &TiledTensor::new(TensorDataType::F32, &[64, 64], &[256], &[BOX.1, BOX.0]),
        ),
        "encoding the tensor map",
    );
    let mut out = ok(
        DeviceBuffer::<f32>::zeroed(ctx, &stream, (1 + BOX.0 * BOX.1) as usize),
        "allocating the tile",
    );
    let mut out_bytes = ok(
        DeviceBuffer::<f32>::zeroed(ctx, &stream, (1 + BOX.0 * BOX.1) as usize),
        "allocating the tile",
    );
    let kernel = ok(
        registry.function_cached("tma", "tma_tiles"),
        "tma::tma_tiles",
    );
    let cfg = LaunchConfig {
        grid: (1, 1, 1),
        block: (128, 1, 1),
        shared_mem_bytes: BOX.0 * BOX.1 * 4 + 1024,
    };
    let launch = sym!(env.cuda, cuLaunchKernel);
    let synchronize = sym!(env.cuda, cuStreamSynchronize);
    let raw_stream = stream.raw();
    let sync = || {
        // SAFETY: the stream is live for this whole function.
        check(unsafe { synchronize(raw_stream) }, "cuStreamSynchronize")
    };
    let args = (out.device_ptr(), BOX.0, BOX.1, 0u32);
    let mut params: [*mut c_void; 5] = [
        (map.raw() as *const atlas_sys::CUtensorMap)
            .cast_mut()
            .cast(),
        (&raw const args.0).cast_mut().cast(),
        (&raw const args.1).cast_mut().cast(),
        (&raw const args.2).cast_mut().cast(),
        (&raw const args.3).cast_mut().cast(),
    ];
    let mut atlas_params = params;
    let func = kernel.raw().raw();
    let mut raw = || {
        // SAFETY: the function is live (its registry is), the stream is its context's, the
        // parameters point at the descriptor and `args`, whose memory stays allocated (the bench
        // synchronizes before `x` and `out` drop).
        let status = unsafe {
            launch(
                func,
                1,
                1,
                1,
                128,
                1,
                1,
                cfg.shared_mem_bytes,
                raw_stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        check(status, "cuLaunchKernel");
    };
    let raw_kernel = ok(
        registry.raw_function_cached("tma", "tma_tiles"),
        "tma::tma_tiles (raw)",
    );
    let mut atlas_raw = || {
        // SAFETY: as for the raw side: a function of `registry`, the stream of its context, the
        // same parameter array.
        let launched =
            unsafe { registry.launch_on_stream(raw_kernel, &cfg, raw_stream, &mut atlas_params) };
        ok(launched, "launch_on_stream of tma_tiles");
    };
    let mut atlas = || {
        // SAFETY: as for the raw side: tma_tiles loads one box of the tensor `map` describes and
        // writes one sum and one box to `out`, which holds that.
        let launched =
            unsafe { kernel.launch(&stream, &cfg, (&map, &mut out, BOX.0, BOX.1, 0u32)) };
        ok(launched, "launching tma_tiles");
    };
    let bytes = map.raw().opaque;
    let mut atlas_bytes = || {
        // SAFETY: as for `atlas`: the same descriptor's bytes, copied into the parameters as
        // the tensor map's are.
        let launched =
            unsafe { kernel.launch(&stream, &cfg, (bytes, &mut out_bytes, BOX.0, BOX.1, 0u32)) };
        ok(launched, "launching tma_tiles with the descriptor's bytes");
    };
    // The Atlas sides' first launches read the kernel's facts: not in a timed batch.
    atlas();
    atlas_bytes();
    let batch = |launch: &mut dyn FnMut()| -> Duration {
        sync();
        paired::timed(|| {
            for _ in 0..BATCH {
                launch();
            }
        })
    };
    let mut group = c.benchmark_group("tma_paired");
    group.sampling_mode(paired::SAMPLING);
    let mut atlas_first = false;
    let variants = [
        ("raw", None),
        ("atlas_raw", Some(&mut atlas_raw as &mut dyn FnMut())),
        ("atlas_bytes", Some(&mut atlas_bytes as &mut dyn FnMut())),
        ("atlas", Some(&mut atlas as &mut dyn FnMut())),
    ];
    for (variant, mut other) in variants {
        group.bench_function(BenchmarkId::new("tile", variant), |b| {
            b.iter_custom(|iters| {
                paired::pairs(iters, &mut atlas_first, |other_side| match &mut other {
                    Some(other) if other_side => batch(&mut **other),
                    _ => batch(&mut raw),
                })
            })
        });
    }
    group.finish();
    sync();
}
