//! Batched copies: 4,096 blocks of 16 KiB between page-locked host memory and scattered blocks of
//! one device buffer (a fixed shuffle, as a serving engine's cache blocks lie), as one
//! `cuMemcpyBatchAsync` through Atlas's `CopyBatch`, as the same batch through the raw driver, and
//! as 4,096 single copies through Atlas. Every iteration synchronizes the stream.
//!
//! `batch_copies_paired/{upload,download}/{raw,atlas,single}`, as ratios pair by pair (see
//! [`paired`]): one side of a pair is the raw batch (its arrays filled from the block list, the
//! `cuMemcpyBatchAsync` call, `cuStreamSynchronize`), the other:
//! - `raw`: the raw batch again (the method's control);
//! - `atlas`: `CopyBatch::begin`, the pinned and the device buffer added, the 4,096 blocks added
//!   (each checked), `enqueue` (the batch and the pinned buffer's event record), then
//!   `CudaStream::synchronize`;
//! - `single`: 4,096 `copy_to_device_async` (`copy_to_host_async`) through Atlas, one
//!   `cuMemcpyHtoDAsync_v2` (`cuMemcpyDtoHAsync_v2`) each, then `CudaStream::synchronize`.
//!
//! `batch_copies/{upload,download}/{raw,atlas,single}`: one iteration of each side alone,
//! reported as bytes per second (64 MiB per iteration).
//!
//! A driver older than CUDA 12.8 has no batched copies: the benches say so in one line and are
//! skipped.

use std::ffi::c_void;
use std::time::Duration;

use atlas_registry::sys::{
    CUdeviceptr, CUmemLocation, CUmemLocationType, CUmemcpyAttributes, CUmemcpySrcAccessOrder,
    CUresult, CUstream,
};
use atlas_registry::{
    CopyBatch, CudaStream, DeviceBuffer, DeviceMemory, DeviceMemoryMut, PinnedBuffer, PinnedFlags,
    copy_to_device_async, copy_to_host_async,
};
use criterion::{BenchmarkId, Criterion, Throughput};

use crate::paired::{self, timed};
use crate::{Env, PairedCriterion, check, ok, sym};

/// Bytes of one block.
const BLOCK: usize = 16 << 10;
/// Blocks per batch.
const BLOCKS: usize = 4096;
/// Bytes of a batch.
const BYTES: usize = BLOCK * BLOCKS;

/// `cuMemcpyBatchAsync`'s signature (CUDA 12.8 and 12.9 headers).
type BatchFn = unsafe extern "C" fn(
    *mut CUdeviceptr,
    *mut CUdeviceptr,
    *mut usize,
    usize,
    *mut CUmemcpyAttributes,
    *mut usize,
    usize,
    *mut usize,
    CUstream,
) -> CUresult;

/// Both groups of this file.
pub(crate) fn batch_copies(c: &mut Criterion, paired: &mut PairedCriterion, env: &Env) {
    let Ok(raw_batch) = atlas_sys::entry!(env.cuda, cuMemcpyBatchAsync) else {
        println!(
            "batch_copies: not run: the driver lacks cuMemcpyBatchAsync (older than CUDA 12.8)"
        );
        return;
    };
    let ctx = env.registry.ctx();
    let stream = ok(CudaStream::new(ctx), "creating a stream");
    let data: Vec<u8> = (0..BYTES).map(|i| (i * 31 % 251) as u8).collect();
    let mut host = ok(
        PinnedBuffer::from_slice(ctx, &data, PinnedFlags::new()),
        "allocating 64 MiB of pinned memory",
    );
    let mut device = ok(DeviceBuffer::<u8>::alloc(ctx, BYTES), "allocating 64 MiB");
    let mut blocks = Blocks {
        stream: &stream,
        host: &mut host,
        device: &mut device,
        order: scattered(BLOCKS),
        batch: CopyBatch::with_capacity(BLOCKS),
        raw: RawBatch {
            batch: raw_batch,
            sync: sym!(env.cuda, cuStreamSynchronize),
            dsts: Vec::with_capacity(BLOCKS),
            srcs: Vec::with_capacity(BLOCKS),
            sizes: Vec::with_capacity(BLOCKS),
        },
    };

    let mut group = paired.benchmark_group("batch_copies_paired");
    group.sampling_mode(paired::SAMPLING);
    group.measurement_time(Duration::from_secs(8));
    for direction in ["upload", "download"] {
        let upload = direction == "upload";
        for variant in ["raw", "atlas", "single"] {
            let mut atlas_first = false;
            group.bench_function(BenchmarkId::new(direction, variant), |b| {
                b.iter_custom(|iters| {
                    paired::pairs(iters, &mut atlas_first, |other_side| {
                        if !other_side {
                            return timed(|| blocks.raw(upload));
                        }
                        timed(|| blocks.run(variant, upload))
                    })
                })
            });
        }
    }
    group.finish();

    let mut group = c.benchmark_group("batch_copies");
    group.throughput(Throughput::Bytes(BYTES as u64));
    group.sample_size(20);
    for direction in ["upload", "download"] {
        let upload = direction == "upload";
        for variant in ["raw", "atlas", "single"] {
            group.bench_function(BenchmarkId::new(direction, variant), |b| {
                b.iter(|| blocks.run(variant, upload))
            });
        }
    }
    group.finish();
    ok(host.synchronize(), "synchronize");
}

/// Where block `i` of the host memory goes on the device: a fixed shuffle of `0..n`.
fn scattered(n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    for i in (1..n).rev() {
        // xorshift64: the same shuffle on every run.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        order.swap(i, (state % (i as u64 + 1)) as usize);
    }
    order
}

/// The raw baseline: `cuMemcpyBatchAsync` with arrays kept from one iteration to the next.
struct RawBatch {
    batch: BatchFn,
    sync: unsafe extern "C" fn(CUstream) -> CUresult,
    dsts: Vec<CUdeviceptr>,
    srcs: Vec<CUdeviceptr>,
    sizes: Vec<usize>,
}

/// The memory the blocks move between, and the three ways of moving them.
struct Blocks<'a> {
    stream: &'a CudaStream,
    host: &'a mut PinnedBuffer<u8>,
    device: &'a mut DeviceBuffer<u8>,
    order: Vec<usize>,
    batch: CopyBatch,
    raw: RawBatch,
}

impl Blocks<'_> {
    fn run(&mut self, variant: &str, upload: bool) {
        match variant {
            "raw" => self.raw(upload),
            "atlas" => self.atlas(upload),
            _ => self.single(upload),
        }
    }

    fn raw(&mut self, upload: bool) {
        let host = self.host.as_ptr().expose_provenance() as CUdeviceptr;
        let device = self.device.device_ptr();
        let raw = &mut self.raw;
        raw.dsts.clear();
        raw.srcs.clear();
        raw.sizes.clear();
        for (i, &at) in self.order.iter().enumerate() {
            let (h, d) = (
                host + (i * BLOCK) as CUdeviceptr,
                device + (at * BLOCK) as CUdeviceptr,
            );
            let (dst, src) = if upload { (d, h) } else { (h, d) };
            raw.dsts.push(dst);
            raw.srcs.push(src);
            raw.sizes.push(BLOCK);
        }
        let nowhere = CUmemLocation {
            type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_INVALID,
            id: 0,
        };
        let mut attributes = CUmemcpyAttributes {
            srcAccessOrder: CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
            srcLocHint: nowhere,
            dstLocHint: nowhere,
            flags: 0,
        };
        let (mut first, mut fail) = (0usize, usize::MAX);
        let stream = self.stream.raw();
        // SAFETY: BLOCKS copies of BLOCK bytes between the live pinned buffer and the live device
        // buffer of the stream's context, destinations disjoint (a permutation of blocks); the
        // arrays and out-pointers live through the call; the buffers outlive the copies
        // (synchronized right after) and the host touches neither meanwhile.
        let status = unsafe {
            (raw.batch)(
                raw.dsts.as_mut_ptr(),
                raw.srcs.as_mut_ptr(),
                raw.sizes.as_mut_ptr(),
                BLOCKS,
                &mut attributes,
                &mut first,
                1,
                &mut fail,
                stream,
            )
        };
        check(status, "cuMemcpyBatchAsync");
        // SAFETY: the stream is live.
        check(unsafe { (raw.sync)(stream) }, "cuStreamSynchronize");
    }

    fn atlas(&mut self, upload: bool) {
        let mut copies = ok(self.batch.begin(self.stream), "CopyBatch::begin");
        if upload {
            let from = ok(copies.read_host(&mut *self.host), "read_host");
            let to = ok(
                copies.write_device(self.device.as_slice_mut()),
                "write_device",
            );
            for (i, &at) in self.order.iter().enumerate() {
                ok(
                    copies.host_to_device(from, i * BLOCK, to, at * BLOCK, BLOCK),
                    "host_to_device",
                );
            }
        } else {
            let from = ok(copies.read_device(self.device.as_slice()), "read_device");
            let to = ok(copies.write_host(&mut *self.host), "write_host");
            for (i, &at) in self.order.iter().enumerate() {
                ok(
                    copies.device_to_host(from, at * BLOCK, to, i * BLOCK, BLOCK),
                    "device_to_host",
                );
            }
        }
        ok(copies.enqueue(), "enqueue");
        ok(self.stream.synchronize(), "synchronize");
    }

    fn single(&mut self, upload: bool) {
        let (stream, host, device) = (self.stream, self.host.as_ptr(), self.device.device_ptr());
        for (i, &at) in self.order.iter().enumerate() {
            let (h, d) = (
                host.wrapping_add(i * BLOCK).cast::<c_void>(),
                device + (at * BLOCK) as CUdeviceptr,
            );
            // SAFETY: BLOCK bytes of the live pinned buffer and of the live device buffer of the
            // stream's context; both outlive the copy (synchronized below) and the host touches
            // neither meanwhile.
            let copied = unsafe {
                if upload {
                    copy_to_device_async(stream, d, h, BLOCK)
                } else {
                    copy_to_host_async(stream, h, d, BLOCK)
                }
            };
            ok(copied, "single copy");
        }
        ok(stream.synchronize(), "synchronize");
    }
}
