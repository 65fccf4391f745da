//! Device-to-device copies through Atlas against the raw `cuMemcpyDtoDAsync_v2`, on the same
//! buffers and stream.
//!
//! `copy_dtod/1g/{raw,atlas}`: one copy of 1 GiB and a synchronize per iteration, reported as
//! bandwidth (bytes copied per second; the device reads and writes that many each).
//!
//! `copy_dtod_paired/{1g,4k}/{raw,atlas}`, as ratios pair by pair (see [`paired`]): one side of
//! a pair is the raw batch, the other the same batch through Atlas (`raw`: the raw batch against
//! itself, the method's control). A `1g` batch is one copy of 1 GiB then a synchronize (the
//! target: Atlas at 0.99× the raw bandwidth or better, i.e. a ratio ≤ 1.01); a `4k` batch is
//! [`SMALL_COPIES`] copies of 4 KiB then a synchronize, where what Atlas adds per call shows.

use std::time::Instant;

use atlas_registry::sys::CUdeviceptr;
use atlas_registry::{CudaStream, DeviceBuffer, DeviceMemory, DeviceMemoryMut};
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, Throughput};

use crate::paired::{self, PairedRatio, timed};
use crate::{Env, PairedCriterion, check, ok, sym};

/// Bytes of the large copy.
const LARGE: usize = 1 << 30;

/// Bytes of each small copy.
const SMALL: usize = 4 << 10;

/// Small copies per batch.
const SMALL_COPIES: usize = 256;

/// Both groups of this file.
pub(crate) fn copies(c: &mut Criterion, paired: &mut PairedCriterion, env: &Env) {
    let ctx = env.registry.ctx();
    let stream = ok(CudaStream::new(ctx), "creating a stream");
    let src = ok(
        DeviceBuffer::<u8>::zeroed(ctx, &stream, LARGE),
        "allocating 1 GiB",
    );
    let mut dst = ok(DeviceBuffer::<u8>::alloc(ctx, LARGE), "allocating 1 GiB");
    ok(stream.synchronize(), "synchronize");
    let copy = sym!(env.cuda, cuMemcpyDtoDAsync_v2);
    let raw_stream = stream.raw();
    let (src_ptr, dst_ptr) = (src.device_ptr(), dst.device_ptr());
    let raw_copy = |to: CUdeviceptr, from: CUdeviceptr, bytes: usize| {
        // SAFETY: both ranges lie in the two live 1 GiB buffers, which do not overlap; the stream
        // is live; the buffers outlive every copy (each batch synchronizes).
        check(
            unsafe { copy(to, from, bytes, raw_stream) },
            "cuMemcpyDtoDAsync_v2",
        );
    };
    let sync = || ok(stream.synchronize(), "synchronize");

    let mut group = c.benchmark_group("copy_dtod");
    group.throughput(Throughput::Bytes(LARGE as u64));
    group.sample_size(20);
    group.bench_function(BenchmarkId::new("1g", "raw"), |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                raw_copy(dst_ptr, src_ptr, LARGE);
                sync();
            }
            start.elapsed()
        })
    });
    group.bench_function(BenchmarkId::new("1g", "atlas"), |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                ok(dst.copy_from_device(&stream, &src), "copy_from_device");
                sync();
            }
            start.elapsed()
        })
    });
    group.finish();

    let mut group = paired.benchmark_group("copy_dtod_paired");
    group.sampling_mode(paired::SAMPLING);
    let raw_small = || {
        for i in 0..SMALL_COPIES {
            let at = (i * SMALL) as CUdeviceptr;
            raw_copy(dst_ptr + at, src_ptr + at, SMALL);
        }
        sync();
    };
    {
        // Views made outside the timed region, as an engine keeps them: the batch is the copies.
        let sources: Vec<_> = ok(src.chunks(SMALL), "chunks").take(SMALL_COPIES).collect();
        let mut targets: Vec<_> = ok(dst.chunks_mut(SMALL), "chunks_mut")
            .take(SMALL_COPIES)
            .collect();
        let mut atlas_small = || {
            for (to, from) in targets.iter_mut().zip(&sources) {
                ok(to.copy_from_device(&stream, from), "copy_from_device");
            }
            sync();
        };
        pair(&mut group, "4k", "raw", &raw_small, &mut || raw_small());
        pair(&mut group, "4k", "atlas", &raw_small, &mut atlas_small);
    }
    let raw_large = || {
        raw_copy(dst_ptr, src_ptr, LARGE);
        sync();
    };
    let mut atlas_large = || {
        ok(dst.copy_from_device(&stream, &src), "copy_from_device");
        sync();
    };
    pair(&mut group, "1g", "raw", &raw_large, &mut || raw_large());
    pair(&mut group, "1g", "atlas", &raw_large, &mut atlas_large);
    group.finish();
}

/// One paired bench `size/variant`: `raw` against `other`, pair by pair.
fn pair(
    group: &mut BenchmarkGroup<'_, PairedRatio>,
    size: &str,
    variant: &str,
    raw: &dyn Fn(),
    other: &mut dyn FnMut(),
) {
    let mut other_first = false;
    group.bench_function(BenchmarkId::new(size, variant), |b| {
        b.iter_custom(|iters| {
            paired::pairs(iters, &mut other_first, |other_side| {
                if other_side {
                    timed(&mut *other)
                } else {
                    timed(raw)
                }
            })
        })
    });
}
