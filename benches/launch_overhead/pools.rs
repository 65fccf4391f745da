//! Allocation from a memory pool of one's own, as a ratio to the raw driver pair by pair (see
//! [`paired`]).
//!
//! `pool_alloc_paired/{4k,1m}/…`: one side of a pair is a batch of [`ALLOCS`] raw
//! `cuMemAllocFromPoolAsync` + `cuMemFreeAsync` of one buffer each on a stream, then a synchronize
//! of the stream; the other side is the same batch done another way, also followed by the
//! synchronize:
//! - `raw`: the raw batch against itself (what the method reads when there is no difference);
//! - `atlas`: `MemoryPool::alloc_async` + drop (freed with `cuMemFreeAsync` on its stream).
//!
//! The pool keeps everything it frees (release threshold `u64::MAX`), as an engine's pool of
//! per-step scratch memory does, so both sides reuse its memory.

use atlas_registry::sys::CUdeviceptr;
use atlas_registry::{CudaStream, MemoryPool, PoolProperties};
use criterion::BenchmarkId;

use crate::paired::{self, timed};
use crate::{Env, PairedCriterion, check, ok, sym};

/// Allocation + free pairs per batch.
const ALLOCS: usize = 64;

/// `pool_alloc_paired`, for 4 KiB and 1 MiB.
pub(crate) fn pools(c: &mut PairedCriterion, env: &Env) {
    let ctx = env.registry.ctx();
    if !ok(ctx.memory_pools_supported(), "memory_pools_supported") {
        println!("pool_alloc_paired: not run: device 0 has no memory pools");
        return;
    }
    let stream = ok(CudaStream::new(ctx), "creating a stream");
    let raw_stream = stream.raw();
    let props = PoolProperties::new().release_threshold(u64::MAX);
    let pool = ok(MemoryPool::new(ctx, &props), "creating a memory pool");
    let raw_pool = pool.raw();
    let alloc = sym!(env.cuda, cuMemAllocFromPoolAsync);
    let free_async = sym!(env.cuda, cuMemFreeAsync);
    let sync = || ok(stream.synchronize(), "synchronize");

    let mut group = c.benchmark_group("pool_alloc_paired");
    group.sampling_mode(paired::SAMPLING);
    for (size, bytes) in [("4k", 4usize << 10), ("1m", 1 << 20)] {
        let floats = bytes / 4;
        let raw = || {
            for _ in 0..ALLOCS {
                let mut ptr: CUdeviceptr = 0;
                // SAFETY: `ptr` is a live out-pointer; the pool and the stream are live and of
                // device 0.
                check(
                    unsafe { alloc(&mut ptr, bytes, raw_pool, raw_stream) },
                    "cuMemAllocFromPoolAsync",
                );
                // SAFETY: allocated just above on the same stream, freed once, used by nothing.
                check(unsafe { free_async(ptr, raw_stream) }, "cuMemFreeAsync");
            }
            sync();
        };
        let atlas = || {
            for _ in 0..ALLOCS {
                // SAFETY: `stream` outlives the buffer, which nothing uses, outside any capture.
                let buffer = unsafe { pool.alloc_async::<f32>(&stream, floats) };
                drop(ok(buffer, "MemoryPool::alloc_async"));
            }
            sync();
        };
        let variants: [(&str, &dyn Fn()); 2] = [("raw", &raw), ("atlas", &atlas)];
        for (variant, other) in variants {
            let mut other_first = false;
            group.bench_function(BenchmarkId::new(size, variant), |b| {
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
    }
    group.finish();
}
