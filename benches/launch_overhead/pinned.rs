//! Copies of 256 MiB between page-locked host memory and the device: what Atlas's safe
//! asynchronous copies add to the raw driver call (`pinned_paired`, × raw), and pageable against
//! pinned memory side by side (`pinned_bandwidth`, bytes per second).
//!
//! `pinned_paired/{upload,download}/{raw,atlas}`: one side of a pair is the raw
//! `cuMemcpyHtoDAsync_v2` (`cuMemcpyDtoHAsync_v2`) from (into) the memory of a [`PinnedBuffer`],
//! then `cuStreamSynchronize`; the other is the same copy done another way, followed by the
//! wait an Atlas user writes:
//! - `raw`: the raw copy against itself (what the method reads when there is no difference);
//! - `atlas`: `PinnedBuffer::copy_to_device` (`copy_from_device`), which records the buffer's
//!   event after the copy, then `PinnedBuffer::synchronize` (`as_slice` for the download: the
//!   host reading what came back), which waits for that event.
//!
//! `pinned_bandwidth/{upload,download}/{pageable,pinned}`: one copy and its wait per iteration:
//! `pageable` is `DeviceBuffer::copy_from` from a `Vec` (`copy_to` into one), which waits;
//! `pinned` is the `atlas` side above. Criterion reports both as bytes per second.

use std::ffi::c_void;
use std::time::Duration;

use atlas_registry::{CudaStream, DeviceBuffer, PinnedBuffer, PinnedFlags};
use criterion::{BenchmarkId, Criterion, Throughput};

use crate::paired::{self, timed};
use crate::{Env, PairedCriterion, check, ok, sym};

/// Bytes of one copy.
const BYTES: usize = 256 << 20;
/// Floats of one copy.
const FLOATS: usize = BYTES / 4;

/// Both groups of this file.
pub(crate) fn pinned(c: &mut Criterion, paired: &mut PairedCriterion, env: &Env) {
    let ctx = env.registry.ctx();
    let stream = ok(CudaStream::new(ctx), "creating a stream");
    let data: Vec<f32> = (0..FLOATS).map(|i| i as f32).collect();
    let mut host = ok(
        PinnedBuffer::from_slice(ctx, &data, PinnedFlags::new()),
        "allocating 256 MiB of pinned memory",
    );
    let mut device = ok(
        DeviceBuffer::<f32>::alloc(ctx, FLOATS),
        "allocating 256 MiB",
    );
    pinned_paired(paired, env, &stream, &mut host, &mut device);
    pinned_bandwidth(c, &stream, &data, &mut host, &mut device);
    ok(host.synchronize(), "synchronize");
}

/// Atlas's pinned copies against the raw driver calls from the same memory, pair by pair.
fn pinned_paired(
    c: &mut PairedCriterion,
    env: &Env,
    stream: &CudaStream,
    host: &mut PinnedBuffer<f32>,
    device: &mut DeviceBuffer<f32>,
) {
    let htod = sym!(env.cuda, cuMemcpyHtoDAsync_v2);
    let dtoh = sym!(env.cuda, cuMemcpyDtoHAsync_v2);
    let sync = sym!(env.cuda, cuStreamSynchronize);
    let (raw_stream, device_ptr) = (stream.raw(), device.device_ptr());
    let mut group = c.benchmark_group("pinned_paired");
    group.sampling_mode(paired::SAMPLING);
    group.measurement_time(Duration::from_secs(10));
    for direction in ["upload", "download"] {
        ok(host.synchronize(), "synchronize");
        let memory = host.as_ptr().cast::<c_void>();
        let raw = || {
            // SAFETY: `memory` is the pinned buffer's BYTES, `device_ptr` the device buffer's
            // BYTES, both of the stream's context; the buffers outlive the copy (synchronized
            // right after) and the host touches neither meanwhile.
            let status = unsafe {
                if direction == "upload" {
                    htod(device_ptr, memory, BYTES, raw_stream)
                } else {
                    dtoh(memory, device_ptr, BYTES, raw_stream)
                }
            };
            check(status, "cuMemcpy*Async_v2");
            // SAFETY: the stream is live.
            check(unsafe { sync(raw_stream) }, "cuStreamSynchronize");
        };
        for variant in ["raw", "atlas"] {
            let mut other_first = false;
            group.bench_function(BenchmarkId::new(direction, variant), |b| {
                b.iter_custom(|iters| {
                    paired::pairs(iters, &mut other_first, |other_side| {
                        if !other_side || variant == "raw" {
                            return timed(raw);
                        }
                        timed(|| atlas_copy(direction, stream, host, device))
                    })
                })
            });
        }
    }
    group.finish();
}

/// One copy through Atlas's pinned path and the wait its user writes.
fn atlas_copy(
    direction: &str,
    stream: &CudaStream,
    host: &mut PinnedBuffer<f32>,
    device: &mut DeviceBuffer<f32>,
) {
    if direction == "upload" {
        ok(host.copy_to_device(stream, device), "copy_to_device");
        ok(host.synchronize(), "synchronize");
    } else {
        ok(host.copy_from_device(stream, device), "copy_from_device");
        ok(host.as_slice(), "as_slice");
    }
}

/// Pageable (`Vec`, waiting copies) against pinned, as bytes per second.
fn pinned_bandwidth(
    c: &mut Criterion,
    stream: &CudaStream,
    data: &[f32],
    host: &mut PinnedBuffer<f32>,
    device: &mut DeviceBuffer<f32>,
) {
    let mut pageable = data.to_vec();
    let mut group = c.benchmark_group("pinned_bandwidth");
    group.throughput(Throughput::Bytes(BYTES as u64));
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(6));
    for direction in ["upload", "download"] {
        group.bench_function(BenchmarkId::new(direction, "pageable"), |b| {
            b.iter(|| {
                if direction == "upload" {
                    ok(device.copy_from(stream, &pageable), "copy_from");
                } else {
                    ok(device.copy_to(stream, &mut pageable), "copy_to");
                }
            })
        });
        group.bench_function(BenchmarkId::new(direction, "pinned"), |b| {
            b.iter(|| atlas_copy(direction, stream, host, device))
        });
    }
    group.finish();
}
