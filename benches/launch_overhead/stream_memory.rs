//! Stream-ordered allocation against `cuMemAlloc`/`cuMemFree`, and what Atlas's capture check
//! adds to a synchronize, as ratios pair by pair (see [`paired`]).
//!
//! `alloc_paired/{4k,1m}/…`: one side of a pair is a batch of [`ALLOCS`] raw `cuMemAlloc` +
//! `cuMemFree` of one buffer each, then a synchronize of the stream; the other side is the same
//! batch done another way, also followed by the synchronize (so a stream-ordered free has taken
//! effect before the next batch):
//! - `raw`: the raw batch against itself (what the method reads when there is no difference);
//! - `atlas_alloc`: `DeviceBuffer::alloc` + drop (Atlas over `cuMemAlloc`/`cuMemFree`);
//! - `stream_ordered_raw`: raw `cuMemAllocAsync` + `cuMemFreeAsync` on the stream;
//! - `stream_ordered`: `DeviceBuffer::alloc_async` + drop (freed with `cuMemFreeAsync`).
//!
//! The default pool's release threshold is raised to `u64::MAX` for the group (and restored after),
//! as an engine that allocates the same working set every step sets it: freed memory stays in the
//! pool instead of going back to the driver at each synchronize.
//!
//! `synchronize_paired/idle/{raw,atlas}`: `cuStreamSynchronize` of an idle stream against
//! `CudaStream::synchronize` (its capture check included), [`SYNCS`] per batch.

use std::time::Duration;

use atlas_registry::sys::CUdeviceptr;
use atlas_registry::{CudaStream, DeviceBuffer};
use criterion::BenchmarkId;

use crate::paired::{self, timed};
use crate::{Env, PairedCriterion, check, ok, sym};

/// Allocation + free pairs per batch.
const ALLOCS: usize = 64;

/// Synchronizes per batch.
const SYNCS: usize = 256;

/// Both groups of this file.
pub(crate) fn stream_memory(c: &mut PairedCriterion, env: &Env) {
    alloc_paired(c, env);
    synchronize_paired(c, env);
}

/// Stream-ordered allocation and free against `cuMemAlloc`/`cuMemFree`, for 4 KiB and 1 MiB.
fn alloc_paired(c: &mut PairedCriterion, env: &Env) {
    let registry = &env.registry;
    let host = registry.host();
    let ctx = registry.ctx();
    if !ok(ctx.memory_pools_supported(), "memory_pools_supported") {
        println!("alloc_paired: not run: device 0 has no memory pools");
        return;
    }
    let stream = ok(CudaStream::new(ctx), "creating a stream");
    let raw_stream = stream.raw();
    let threshold = ok(host.pool_release_threshold(), "pool_release_threshold");
    ok(
        host.set_pool_release_threshold(u64::MAX),
        "set_pool_release_threshold",
    );
    let mem_alloc = sym!(env.cuda, cuMemAlloc_v2);
    let mem_free = sym!(env.cuda, cuMemFree_v2);
    let alloc_async = sym!(env.cuda, cuMemAllocAsync);
    let free_async = sym!(env.cuda, cuMemFreeAsync);
    let sync = || ok(stream.synchronize(), "synchronize");

    let mut group = c.benchmark_group("alloc_paired");
    group.sampling_mode(paired::SAMPLING);
    for (size, bytes) in [("4k", 4usize << 10), ("1m", 1 << 20)] {
        let floats = bytes / 4;
        let raw = || {
            for _ in 0..ALLOCS {
                let mut ptr: CUdeviceptr = 0;
                // SAFETY: `ptr` is a live out-pointer; Env::new made the primary context current.
                check(unsafe { mem_alloc(&mut ptr, bytes) }, "cuMemAlloc_v2");
                // SAFETY: allocated just above, freed once, used by nothing.
                check(unsafe { mem_free(ptr) }, "cuMemFree_v2");
            }
            sync();
        };
        let atlas_alloc = || {
            for _ in 0..ALLOCS {
                drop(ok(DeviceBuffer::<f32>::alloc(ctx, floats), "alloc"));
            }
            sync();
        };
        let stream_ordered_raw = || {
            for _ in 0..ALLOCS {
                let mut ptr: CUdeviceptr = 0;
                // SAFETY: `ptr` is a live out-pointer; the stream is live.
                check(
                    unsafe { alloc_async(&mut ptr, bytes, raw_stream) },
                    "cuMemAllocAsync",
                );
                // SAFETY: allocated just above on the same stream, freed once, used by nothing.
                check(unsafe { free_async(ptr, raw_stream) }, "cuMemFreeAsync");
            }
            sync();
        };
        let stream_ordered = || {
            for _ in 0..ALLOCS {
                // SAFETY: `stream` outlives the buffer, which nothing uses, outside any capture.
                let buffer = unsafe { DeviceBuffer::<f32>::alloc_async(ctx, &stream, floats) };
                drop(ok(buffer, "alloc_async"));
            }
            sync();
        };
        let variants: [(&str, &dyn Fn()); 4] = [
            ("raw", &raw),
            ("atlas_alloc", &atlas_alloc),
            ("stream_ordered_raw", &stream_ordered_raw),
            ("stream_ordered", &stream_ordered),
        ];
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
    ok(
        host.set_pool_release_threshold(threshold),
        "restoring the release threshold",
    );
}

/// `CudaStream::synchronize` (with its capture check) against raw `cuStreamSynchronize`, on an
/// idle stream.
fn synchronize_paired(c: &mut PairedCriterion, env: &Env) {
    let stream = ok(CudaStream::new(env.registry.ctx()), "creating a stream");
    let raw_stream = stream.raw();
    let stream_sync = sym!(env.cuda, cuStreamSynchronize);
    let raw = || {
        for _ in 0..SYNCS {
            // SAFETY: the stream is live.
            check(unsafe { stream_sync(raw_stream) }, "cuStreamSynchronize");
        }
    };
    let atlas = || {
        for _ in 0..SYNCS {
            ok(stream.synchronize(), "synchronize");
        }
    };
    let mut group = c.benchmark_group("synchronize_paired");
    group.sampling_mode(paired::SAMPLING);
    group.measurement_time(Duration::from_secs(3));
    for (variant, other) in [("raw", &raw as &dyn Fn()), ("atlas", &atlas)] {
        let mut other_first = false;
        group.bench_function(BenchmarkId::new("idle", variant), |b| {
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
