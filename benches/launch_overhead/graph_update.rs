//! Whole-graph update against re-instantiation, and a device-decided WHILE loop against a host
//! loop of the same steps.
//!
//! - `graph_update/{update,reinstantiate}`: an executable graph of a captured chain of
//!   [`CHAINS`] (64 or 1024) `scale` launches is made to run a new capture of the same chain with new
//!   arguments: by [`GraphExec::update`] (in place), or by instantiating the new capture and
//!   dropping the old executable graph. The captures are made outside the timed region; one
//!   iteration is one update (or one instantiation).
//! - `while_loop/{graph,host}`: [`LOOP_STEPS`] steps of the `conditional` model's loop: one replay
//!   of a graph whose WHILE node runs `loop_step` until the kernel ends the loop, or a counter reset
//!   and [`LOOP_STEPS`] `host_step` launches from the host; one iteration is the whole loop,
//!   synchronize included.

use std::time::{Duration, Instant};

use atlas_registry::{
    AtlasRegistry, CudaGraph, CudaStream, DeviceBuffer, GraphExec, GraphUpdate, LaunchConfig,
};
use criterion::{BenchmarkId, Criterion};

use crate::{Env, ok};

/// Kernels in the updated chain.
/// Kernels in the captured chains: a short step and a long one.
const CHAINS: [usize; 2] = [64, 1024];
/// Iterations of the WHILE loop.
const LOOP_STEPS: i32 = 64;
/// Elements the kernels touch.
const ELEMENTS: u32 = 1024;

pub(crate) fn graph_update(c: &mut Criterion, env: &Env) {
    update_vs_reinstantiate(c, env);
    while_loop(c, env);
}

/// Captures `chain` launches of `scale` on `x`, the factors starting at `first`.
fn capture_chain(
    env: &Env,
    stream: &CudaStream,
    x: &mut DeviceBuffer<f32>,
    first: f32,
    chain: usize,
) -> CudaGraph {
    let scale = ok(
        env.registry.function_cached("elementwise", "scale"),
        "function scale",
    );
    let cfg = LaunchConfig::for_elements(ELEMENTS, 256);
    ok(stream.begin_capture(), "begin_capture");
    for i in 0..chain {
        let factor = first + i as f32 * 1e-3;
        // SAFETY: captured, not run: at a replay `scale` touches the ELEMENTS floats of `x`, which
        // outlives every executable graph of this bench (none is replayed).
        ok(
            unsafe { scale.launch(stream, &cfg, (&mut *x, factor, ELEMENTS)) },
            "capturing scale",
        );
    }
    ok(stream.end_capture(), "end_capture")
}

fn update_vs_reinstantiate(c: &mut Criterion, env: &Env) {
    for chain in CHAINS {
        update_vs_reinstantiate_chain(c, env, chain);
    }
}

fn update_vs_reinstantiate_chain(c: &mut Criterion, env: &Env, chain: usize) {
    let stream = ok(CudaStream::new(env.registry.ctx()), "creating a stream");
    let mut x = ok(
        DeviceBuffer::<f32>::alloc(env.registry.ctx(), ELEMENTS as usize),
        "allocating",
    );
    let first = capture_chain(env, &stream, &mut x, 1.0, chain);
    let exec = std::cell::RefCell::new(ok(first.instantiate(), "instantiate"));
    let mut group = c.benchmark_group("graph_update");
    group.bench_function(BenchmarkId::new(format!("chain{chain}"), "update"), |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for i in 0..iters {
                let graph = capture_chain(env, &stream, &mut x, 1.0 + (i % 7) as f32, chain);
                let mut exec = exec.borrow_mut();
                let start = Instant::now();
                // SAFETY: the new chain touches the ELEMENTS floats of `x`, which outlives `exec`;
                // nothing replays it here.
                let outcome = ok(unsafe { exec.update(graph) }, "update");
                total += start.elapsed();
                assert_eq!(
                    outcome,
                    GraphUpdate::Updated,
                    "a same-topology chain updates"
                );
            }
            total
        })
    });
    group.bench_function(
        BenchmarkId::new(format!("chain{chain}"), "reinstantiate"),
        |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for i in 0..iters {
                    let graph = capture_chain(env, &stream, &mut x, 1.0 + (i % 7) as f32, chain);
                    let mut exec = exec.borrow_mut();
                    let start = Instant::now();
                    let fresh: GraphExec = ok(graph.instantiate(), "instantiate");
                    drop(std::mem::replace(&mut *exec, fresh));
                    total += start.elapsed();
                }
                total
            })
        },
    );
    group.finish();
}

fn while_loop(c: &mut Criterion, env: &Env) {
    let host = env.registry.host();
    let blobs = atlas_kernels::blobs_for_device("conditional", host.compute_capability())
        .expect("conditional is a model of atlas-kernels");
    let registry = ok(
        AtlasRegistry::load(0, blobs),
        "loading the conditional model",
    );
    let stream = ok(CudaStream::new(registry.ctx()), "creating a stream");
    // Outside a capture a driver with conditional nodes answers "not capturing"; one without
    // them names what it lacks, and the loop is not benched.
    if let Err(e) = stream.conditional_handle(true)
        && !matches!(e, atlas_registry::AtlasError::Capture(_))
    {
        println!("while_loop: not run: {e}");
        return;
    }
    let function = |name| ok(registry.function_cached("conditional", name), name);
    let (step, host_step, reset) = (
        function("loop_step"),
        function("host_step"),
        function("reset_counter"),
    );
    let mut x = ok(
        DeviceBuffer::from_slice(registry.ctx(), &stream, &vec![1.0f32; ELEMENTS as usize]),
        "allocating x",
    );
    let mut counter = ok(
        DeviceBuffer::from_slice(registry.ctx(), &stream, &[0i32]),
        "allocating the counter",
    );
    let cfg = LaunchConfig::for_elements(ELEMENTS, 256);
    let one = LaunchConfig::for_elements(1, 1);
    ok(stream.begin_capture(), "begin_capture");
    // SAFETY: captured, not run: at a replay it writes the int of `counter`, which outlives `exec`.
    ok(
        unsafe { reset.launch(&stream, &one, (&mut counter,)) },
        "capturing reset_counter",
    );
    let cond = ok(stream.conditional_handle(true), "conditional_handle");
    ok(
        stream.capture_while(cond, |body| {
            // SAFETY: captured, not run: each iteration touches the ELEMENTS floats of `x` and the
            // int of `counter` (both outlive `exec`) and sets `cond`, a handle of this graph.
            unsafe {
                step.launch(
                    body,
                    &cfg,
                    (&mut x, ELEMENTS, cond, &mut counter, LOOP_STEPS),
                )
            }
        }),
        "capture_while",
    );
    let exec = ok(
        ok(stream.end_capture(), "end_capture").instantiate(),
        "instantiate",
    );
    ok(exec.upload(&stream), "upload");
    let mut group = c.benchmark_group("while_loop");
    group.bench_function(
        BenchmarkId::new(format!("steps{LOOP_STEPS}"), "graph"),
        |b| {
            b.iter(|| {
                // SAFETY: `x` and `counter` outlive `exec`.
                ok(unsafe { exec.launch(&stream) }, "graph launch");
                ok(stream.synchronize(), "synchronize");
            })
        },
    );
    group.bench_function(
        BenchmarkId::new(format!("steps{LOOP_STEPS}"), "host"),
        |b| {
            b.iter(|| {
                // SAFETY: writes the int of `counter`, alive until the synchronize below.
                ok(
                    unsafe { reset.launch(&stream, &one, (&mut counter,)) },
                    "reset_counter",
                );
                for _ in 0..LOOP_STEPS {
                    // SAFETY: touches the ELEMENTS floats of `x` and the int of `counter`, alive
                    // until the synchronize below.
                    ok(
                        unsafe {
                            host_step.launch(&stream, &cfg, (&mut x, ELEMENTS, &mut counter))
                        },
                        "host_step",
                    );
                }
                ok(stream.synchronize(), "synchronize");
            })
        },
    );
    group.finish();
    // One replay of the graph, checked, whatever the filter let criterion run.
    // SAFETY: `x` and `counter` outlive `exec`.
    ok(unsafe { exec.launch(&stream) }, "graph launch");
    let steps = ok(counter.to_vec(&stream), "reading the counter");
    assert_eq!(steps, [LOOP_STEPS], "the loop ran LOOP_STEPS steps");
}
