//! Programmatic dependent launch (PDL): a chain of 64 dependent tiny kernels (`pdl_step`), run
//! eagerly and as a captured graph, each with and without PDL (`pdl_chain`); and the host cost of
//! Atlas's `launch_with` with the PDL attribute against a raw `cuLaunchKernelEx` with the same
//! attribute, pair by pair (`launch_ex_paired`).
//!
//! PDL needs compute capability 9.0; on an older device these benches print why they do not run.

use std::ffi::c_void;
use std::time::{Duration, Instant};

use atlas_registry::{
    AtlasRegistry, CudaFunction, CudaStream, DeviceBuffer, GraphExec, LaunchAttributes,
    LaunchConfig,
};
use atlas_sys::{CUlaunchAttribute, CUlaunchAttributeID, CUlaunchAttributeValue, CUlaunchConfig};
use criterion::{BenchmarkId, Criterion};

use crate::{BATCH, Env, PairedCriterion, check, ok, paired, sym};

/// Kernels in one chain.
const CHAIN: u64 = 64;
/// Elements each step touches: one block, so a step costs next to nothing on the device.
const N: u32 = 256;

/// `pdl_chain/{eager,eager_pdl,graph,graph_pdl}` and `launch_ex_paired/pdl/{raw,atlas}`.
pub(crate) fn pdl(c: &mut Criterion, paired: &mut PairedCriterion, env: &Env) {
    let host = env.registry.host();
    if host.compute_capability() < (9, 0) {
        let (major, minor) = host.compute_capability();
        println!(
            "pdl_chain, launch_ex_paired: not run: PDL needs compute capability 9.0, device 0 is {major}.{minor}"
        );
        return;
    }
    let blobs = atlas_kernels::blobs_for_device("launch", host.compute_capability())
        .expect("launch is a model of atlas-kernels");
    let registry = ok(AtlasRegistry::load(0, blobs), "loading the launch model");
    let mut stream = ok(CudaStream::new(registry.ctx()), "creating a stream");
    let step = ok(registry.function_cached("pdl", "pdl_step"), "pdl::pdl_step");
    // x = x * 1 + 0 keeps the data as it is, however many steps run.
    let mut x = ok(
        DeviceBuffer::from_slice(registry.ctx(), &stream, &[1.0f32; N as usize]),
        "uploading the chain's data",
    );
    chain(c, &mut stream, &step, &mut x);
    launch_ex_paired(paired, env, &registry, &stream, &step, &mut x);
    ok(stream.synchronize(), "synchronize");
}

/// The launch of one step, with or without PDL.
fn launch_step(
    step: &CudaFunction,
    stream: &CudaStream,
    x: &mut DeviceBuffer<f32>,
    attrs: Option<&LaunchAttributes>,
) {
    let cfg = LaunchConfig::for_elements(N, N);
    // SAFETY: `pdl_step` touches the `N` floats of `x`, which outlives every launch and replay
    // (the benches synchronize before it drops).
    let launched = unsafe {
        match attrs {
            Some(attrs) => step.launch_with(stream, &cfg, attrs, (&mut *x, N, 1.0f32, 0.0f32)),
            None => step.launch(stream, &cfg, (&mut *x, N, 1.0f32, 0.0f32)),
        }
    };
    ok(launched, "launching pdl_step");
}

/// One chain captured into a graph.
fn capture(
    stream: &mut CudaStream,
    step: &CudaFunction,
    x: &mut DeviceBuffer<f32>,
    attrs: Option<&LaunchAttributes>,
) -> GraphExec {
    let capture = ok(stream.begin_capture(), "begin_capture");
    for _ in 0..CHAIN {
        launch_step(step, &capture, x, attrs);
    }
    ok(
        ok(capture.end(), "end_capture").instantiate(),
        "instantiate",
    )
}

/// The time per kernel of a chain of [`CHAIN`] dependent steps, synchronize included: one
/// criterion iteration is one kernel.
fn chain(
    c: &mut Criterion,
    stream: &mut CudaStream,
    step: &CudaFunction,
    x: &mut DeviceBuffer<f32>,
) {
    let pdl = LaunchAttributes::new().programmatic_stream_serialization(true);
    let graph = capture(stream, step, x, None);
    let graph_pdl = capture(stream, step, x, Some(&pdl));
    let stream = &*stream;
    let per_kernel = |iters: u64, run_chain: &mut dyn FnMut()| {
        let chains = iters.div_ceil(CHAIN);
        let start = Instant::now();
        for _ in 0..chains {
            run_chain();
        }
        start
            .elapsed()
            .mul_f64(iters as f64 / (chains * CHAIN) as f64)
    };
    let sync = || ok(stream.synchronize(), "synchronize");
    let mut group = c.benchmark_group("pdl_chain");
    for (variant, attrs) in [("eager", None), ("eager_pdl", Some(&pdl))] {
        group.bench_function(BenchmarkId::from_parameter(variant), |b| {
            b.iter_custom(|iters| {
                per_kernel(iters, &mut || {
                    for _ in 0..CHAIN {
                        launch_step(step, stream, x, attrs);
                    }
                    sync();
                })
            })
        });
    }
    for (variant, exec) in [("graph", &graph), ("graph_pdl", &graph_pdl)] {
        group.bench_function(BenchmarkId::from_parameter(variant), |b| {
            b.iter_custom(|iters| {
                per_kernel(iters, &mut || {
                    // SAFETY: the graph's kernels touch `x` and the launch model's module, which
                    // outlive every replay.
                    ok(unsafe { exec.launch(stream) }, "graph launch");
                    sync();
                })
            })
        });
    }
    group.finish();
}

/// Atlas `launch_with` (PDL) / raw `cuLaunchKernelEx` (the same attribute, configuration built
/// once), for a batch of [`BATCH`] launches each, pair by pair; `…/raw` pairs the raw batch with
/// itself, `…/raw_built` a raw batch that builds attribute and configuration at each launch.
fn launch_ex_paired(
    c: &mut PairedCriterion,
    env: &Env,
    registry: &AtlasRegistry,
    stream: &CudaStream,
    step: &CudaFunction,
    x: &mut DeviceBuffer<f32>,
) {
    let launch_ex = sym!(env.cuda, cuLaunchKernelEx);
    let synchronize = sym!(env.cuda, cuStreamSynchronize);
    let raw_stream = stream.raw();
    let sync = || {
        // SAFETY: the stream is live (`stream` is borrowed for this whole function).
        check(unsafe { synchronize(raw_stream) }, "cuStreamSynchronize")
    };
    let mut value = CUlaunchAttributeValue { pad: [0; 64] };
    value.programmaticStreamSerializationAllowed = 1;
    let mut attribute = [CUlaunchAttribute {
        id: CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
        pad: [0; 4],
        value,
    }];
    let config = CUlaunchConfig {
        gridDimX: 1,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: N,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        hStream: raw_stream,
        attrs: attribute.as_mut_ptr(),
        numAttrs: 1,
    };
    let args = (x.device_ptr(), N, 1.0f32, 0.0f32);
    let mut params: [*mut c_void; 4] = [
        (&raw const args.0).cast_mut().cast(),
        (&raw const args.1).cast_mut().cast(),
        (&raw const args.2).cast_mut().cast(),
        (&raw const args.3).cast_mut().cast(),
    ];
    let func = step.raw().raw();
    let mut atlas_params = params;
    let mut built_params = params;
    let mut raw = || {
        // SAFETY: the function is live (its registry is), the stream is its context's, the
        // config's one attribute lives on this frame, and the parameters point at `args`, whose
        // device address stays allocated (the bench synchronizes before `x` drops).
        let status = unsafe { launch_ex(&config, func, params.as_mut_ptr(), std::ptr::null_mut()) };
        check(status, "cuLaunchKernelEx");
    };
    // The raw call as code that launches different shapes writes it: the attribute and the
    // configuration built for each launch (the grid read through `black_box`, so the build stays
    // in the loop).
    let mut raw_built = || {
        let mut value = CUlaunchAttributeValue { pad: [0; 64] };
        value.programmaticStreamSerializationAllowed = 1;
        let mut attribute = [CUlaunchAttribute {
            id: CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value,
        }];
        let config = CUlaunchConfig {
            gridDimX: std::hint::black_box(1),
            attrs: attribute.as_mut_ptr(),
            ..config
        };
        // SAFETY: as for the raw side; the attribute lives on this frame through the call.
        let status = unsafe {
            launch_ex(
                &config,
                func,
                built_params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        check(status, "cuLaunchKernelEx");
    };
    let pdl = LaunchAttributes::new().programmatic_stream_serialization(true);
    let mut atlas = || launch_step(step, stream, x, Some(&pdl));
    // The raw door with the same attribute and the same parameter array as the raw side.
    let cfg = LaunchConfig::for_elements(N, N);
    let mut atlas_raw = || {
        // SAFETY: as for the raw side: the function is this model's `pdl_step`, live while its
        // registry is; the stream is its context's; the parameters point at `args`.
        let launched = unsafe {
            registry.launch_on_stream_with(step, &cfg, &pdl, raw_stream, &mut atlas_params)
        };
        ok(launched, "launch_on_stream_with");
    };
    let batch = |launch: &mut dyn FnMut()| -> Duration {
        sync();
        paired::timed(|| {
            for _ in 0..BATCH {
                launch();
            }
        })
    };
    let mut group = c.benchmark_group("launch_ex_paired");
    group.sampling_mode(paired::SAMPLING);
    let mut atlas_first = false;
    // Each side paired with the raw batch; `raw` (no other side) with itself.
    let variants = [
        ("raw", None),
        ("atlas", Some(&mut atlas as &mut dyn FnMut())),
        ("raw_built", Some(&mut raw_built)),
        ("atlas_raw", Some(&mut atlas_raw)),
    ];
    for (variant, mut other) in variants {
        group.bench_function(BenchmarkId::new("pdl", variant), |b| {
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
