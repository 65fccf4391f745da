//! Graph replay against eager launches.

use std::time::Instant;

use atlas_registry::{CudaStream, LaunchConfig};
use criterion::{BenchmarkId, Criterion};

use crate::{Env, NOOP, ok};

/// Kernels in the replayed graph.
const GRAPH_KERNELS: u64 = 256;

/// The cost per kernel of running 256 noop kernels, eagerly (256 typed launches) or as
/// one replay of a captured graph, each batch including its synchronize. One criterion iteration
/// is one kernel.
pub(crate) fn graph_replay(c: &mut Criterion, env: &Env) {
    let registry = &env.registry;
    let mut stream = ok(CudaStream::new(registry.ctx()), "creating a stream");
    let one = LaunchConfig::for_elements(1, 1);
    let noop = ok(NOOP.get(registry), "FunctionCache::get noop");
    let capture = ok(stream.begin_capture(), "begin_capture");
    for _ in 0..GRAPH_KERNELS {
        // SAFETY: noop takes no arguments and touches no memory.
        ok(unsafe { noop.launch(&capture, &one, ()) }, "capturing noop");
    }
    let exec = ok(
        ok(capture.end(), "end_capture").instantiate(),
        "instantiate",
    );
    let per_kernel = |iters: u64, run_batch: &dyn Fn()| {
        let batches = iters.div_ceil(GRAPH_KERNELS);
        let start = Instant::now();
        for _ in 0..batches {
            run_batch();
        }
        start
            .elapsed()
            .mul_f64(iters as f64 / (batches * GRAPH_KERNELS) as f64)
    };
    let mut group = c.benchmark_group("graph_replay");
    group.bench_function(BenchmarkId::new("noop256", "eager"), |b| {
        b.iter_custom(|iters| {
            per_kernel(iters, &|| {
                for _ in 0..GRAPH_KERNELS {
                    // SAFETY: noop takes no arguments and touches no memory.
                    ok(unsafe { noop.launch(&stream, &one, ()) }, "launch noop");
                }
                ok(stream.synchronize(), "synchronize");
            })
        })
    });
    group.bench_function(BenchmarkId::new("noop256", "replay"), |b| {
        b.iter_custom(|iters| {
            per_kernel(iters, &|| {
                // SAFETY: the noop kernels use no memory.
                ok(unsafe { exec.launch(&stream) }, "graph launch");
                ok(stream.synchronize(), "synchronize");
            })
        })
    });
    group.finish();
}
