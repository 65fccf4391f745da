//! What capturing and replaying a graph costs the host, against the raw driver calls.
//!
//! - `graph_capture/{noop256,scale256}/{raw,atlas_typed}`: one capture of 256 launches on a
//!   created stream (begin, the launches, end, the graph dropped), per launch. `noop256` launches
//!   `noop` (the graph keeps only the registry); `scale256` launches `scale` on a
//!   [`DeviceBuffer`] (the graph keeps the registry and the buffer's memory). `raw` is
//!   `cuStreamBeginCapture_v2`, 256 `cuLaunchKernel`, `cuStreamEndCapture` and `cuGraphDestroy`.
//! - `graph_capture_paired/{noop256,scale256}/{raw,atlas_typed}`: the same as ratios to `raw`, pair
//!   by pair (`…/raw` is the raw capture against itself).
//! - `graph_replay_paired/noop256/{raw,atlas}`: 16 replays of a captured 256-kernel graph
//!   enqueued (the stream drained before, untimed): `GraphExec::launch` against `cuGraphLaunch` of
//!   the same executable graph.
//!
//! Only calls that every version of Atlas has are used, so the file can be dropped into an older
//! checkout to compare.

use std::ffi::c_void;
use std::time::{Duration, Instant};

use atlas_registry::{CudaStream, DeviceBuffer, FunctionCache, LaunchConfig};
use atlas_sys::{CUfunction, CUgraph, CUstreamCaptureMode};
use criterion::{BenchmarkId, Criterion};

use crate::{Env, NOOP, PairedCriterion, check, ok, paired, sym};

/// Launches per capture.
const LAUNCHES: u32 = 256;
/// Replays per timed batch of `graph_replay_paired`.
const REPLAYS: u32 = 16;
/// Elements of the `scale` launches.
const SCALE_N: u32 = 1 << 10;

static SCALE: FunctionCache = FunctionCache::new("elementwise", "scale");

/// The capture benches' two sides for one kernel: a whole capture, timed.
struct Capture<'a> {
    kernel: &'static str,
    raw: Box<dyn FnMut() -> Duration + 'a>,
    atlas: Box<dyn FnMut() -> Duration + 'a>,
}

pub(crate) fn graph_capture(c: &mut Criterion, pairs: &mut PairedCriterion, env: &Env) {
    let registry = &env.registry;
    let stream = ok(CudaStream::new(registry.ctx()), "creating a stream");
    // Atlas captures on streams of its own, each used by one case: a capture borrows its stream
    // mutably. The raw side captures on `stream`.
    let new_stream = || ok(CudaStream::new(registry.ctx()), "creating a stream");
    let (mut noop_stream, mut scale_stream) = (new_stream(), new_stream());
    let mut x = ok(
        DeviceBuffer::from_slice(registry.ctx(), &stream, &vec![1.0f32; SCALE_N as usize]),
        "uploading scale's data",
    );
    let begin = sym!(env.cuda, cuStreamBeginCapture_v2);
    let end = sym!(env.cuda, cuStreamEndCapture);
    let destroy = sym!(env.cuda, cuGraphDestroy);
    let launch = sym!(env.cuda, cuLaunchKernel);
    let graph_launch = sym!(env.cuda, cuGraphLaunch);
    let (noop_raw, scale_raw) = (
        env.raw_function("noop", c"noop"),
        env.raw_function("elementwise", c"scale"),
    );
    let raw_stream = stream.raw();
    let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    // `scale(float* x, float factor, unsigned n)` with factor 1: the data stays as it is.
    let scale_args = (x.device_ptr(), 1.0f32, SCALE_N);
    let raw_capture = |func: CUfunction, params: *mut *mut c_void, grid: u32, block: u32| {
        let start = Instant::now();
        let mut graph: CUgraph = std::ptr::null_mut();
        // SAFETY: a live created stream of the registry's context (current: Env::new bound it),
        // a live function of its module, and a parameter array matching it (or null for noop);
        // the graph is destroyed once, at once, never instantiated.
        unsafe {
            check(begin(raw_stream, mode), "cuStreamBeginCapture_v2");
            for _ in 0..LAUNCHES {
                check(
                    launch(
                        func,
                        grid,
                        1,
                        1,
                        block,
                        1,
                        1,
                        0,
                        raw_stream,
                        params,
                        std::ptr::null_mut(),
                    ),
                    "cuLaunchKernel",
                );
            }
            check(end(raw_stream, &mut graph), "cuStreamEndCapture");
            check(destroy(graph), "cuGraphDestroy");
        }
        start.elapsed()
    };
    let noop = ok(NOOP.get(registry), "FunctionCache::get noop");
    let scale = ok(SCALE.get(registry), "FunctionCache::get scale");
    let one = LaunchConfig::for_elements(1, 1);
    let scale_cfg = LaunchConfig::for_elements(SCALE_N, 256);
    let stream = &stream;
    let mut scale_params = [
        (&raw const scale_args.0).cast_mut().cast::<c_void>(),
        (&raw const scale_args.1).cast_mut().cast(),
        (&raw const scale_args.2).cast_mut().cast(),
    ];
    let scale_params = scale_params.as_mut_ptr();
    let mut cases = [
        Capture {
            kernel: "noop256",
            raw: Box::new(move || raw_capture(noop_raw, std::ptr::null_mut(), 1, 1)),
            atlas: Box::new(move || {
                let start = Instant::now();
                let capture = ok(noop_stream.begin_capture(), "begin_capture");
                for _ in 0..LAUNCHES {
                    // SAFETY: captured, never run: noop takes no arguments.
                    ok(unsafe { noop.launch(&capture, &one, ()) }, "capturing noop");
                }
                drop(ok(capture.end(), "end_capture"));
                start.elapsed()
            }),
        },
        Capture {
            kernel: "scale256",
            raw: Box::new(move || raw_capture(scale_raw, scale_params, SCALE_N / 256, 256)),
            atlas: Box::new(|| {
                let start = Instant::now();
                let capture = ok(scale_stream.begin_capture(), "begin_capture");
                for _ in 0..LAUNCHES {
                    // SAFETY: captured, never run (the graph is dropped): `x` holds the `n` floats.
                    ok(
                        unsafe { scale.launch(&capture, &scale_cfg, (&mut x, 1.0f32, SCALE_N)) },
                        "capturing scale",
                    );
                }
                drop(ok(capture.end(), "end_capture"));
                start.elapsed()
            }),
        },
    ];
    let per_launch = |time: Duration| time / LAUNCHES;

    let mut group = c.benchmark_group("graph_capture");
    for case in &mut cases {
        for (variant, capture) in [("raw", &mut case.raw), ("atlas_typed", &mut case.atlas)] {
            group.bench_function(BenchmarkId::new(case.kernel, variant), |b| {
                b.iter_custom(|iters| (0..iters).map(|_| per_launch((capture)())).sum())
            });
        }
    }
    group.finish();

    let mut group = pairs.benchmark_group("graph_capture_paired");
    group.sampling_mode(paired::SAMPLING);
    for case in &mut cases {
        for variant in ["raw", "atlas_typed"] {
            let mut atlas_first = false;
            group.bench_function(BenchmarkId::new(case.kernel, variant), |b| {
                b.iter_custom(|iters| {
                    paired::pairs(iters, &mut atlas_first, |atlas_side| {
                        if atlas_side && variant == "atlas_typed" {
                            (case.atlas)()
                        } else {
                            (case.raw)()
                        }
                    })
                })
            });
        }
    }
    group.finish();
    drop(cases);

    // Replays of one executable graph, enqueued: Atlas's door against the driver's.
    let mut capture_stream = ok(CudaStream::new(registry.ctx()), "creating a stream");
    let capture = ok(capture_stream.begin_capture(), "begin_capture");
    for _ in 0..LAUNCHES {
        // SAFETY: noop takes no arguments and touches no memory.
        ok(unsafe { noop.launch(&capture, &one, ()) }, "capturing noop");
    }
    let exec = ok(
        ok(capture.end(), "end_capture").instantiate(),
        "instantiate",
    );
    let sync = || ok(stream.synchronize(), "synchronize");
    let mut group = pairs.benchmark_group("graph_replay_paired");
    group.sampling_mode(paired::SAMPLING);
    for variant in ["raw", "atlas"] {
        let mut atlas_first = false;
        group.bench_function(BenchmarkId::new("noop256", variant), |b| {
            b.iter_custom(|iters| {
                paired::pairs(iters, &mut atlas_first, |atlas_side| {
                    sync();
                    let start = Instant::now();
                    for _ in 0..REPLAYS {
                        if atlas_side && variant == "atlas" {
                            // SAFETY: the noop kernels use no memory.
                            ok(unsafe { exec.launch(stream) }, "graph launch");
                        } else {
                            // SAFETY: a live executable graph and a live stream of its context.
                            check(
                                unsafe { graph_launch(exec.raw(), raw_stream) },
                                "cuGraphLaunch",
                            );
                        }
                    }
                    start.elapsed()
                })
            })
        });
    }
    group.finish();
    sync();
}
