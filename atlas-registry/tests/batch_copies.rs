//! Batched copies (`CopyBatch`, `cuMemcpyBatchAsync`): many blocks host↔device and device↔device
//! in one driver call, each block checked before the driver sees it.
//!
//! Stand-in (CI): `cargo test -p atlas-registry --test batch_copies` (one driver call per batch,
//! blocks copied exactly in every direction, page-locked memory and buffers kept as their other
//! copies keep them, every refusal before the driver, the driver's `failIdx` turned into a block
//! number, a driver without the entry point). GPU: `-- --include-ignored` (4,096 blocks of 16 KiB
//! scattered into a device buffer and gathered back into page-locked memory, and between device
//! buffers, against the CPU on fresh random data; unaligned blocks reaching the ends of their
//! buffers; the driver's own refusals that Atlas makes first).

mod support;

use atlas_kernels::ptx_for_model;
use atlas_registry::sys::{self, CUdeviceptr, CUresult, CUstream};
use atlas_registry::{
    AtlasError, AtlasRegistry, BatchRefusal, CaptureMisuse, CopyBatch, CopySide, CudaStream,
    DeviceBuffer, DeviceMemory, DeviceMemoryMut, HostMemoryRefusal, HostRegistration, PinnedBuffer,
    PinnedFlags, RegisterFlags,
};
use support::child::{self, Ending};
use support::graphs::assert_wrong_context;
use support::rng::Rng;
use support::standin::{self, probe};

child::bodies!(
    a_batch_is_one_driver_call_and_copies_exactly,
    memory_the_batch_used_waits_for_it,
    each_refusal_comes_before_the_driver,
    memory_of_another_device_is_refused,
    a_driver_without_batched_copies_is_a_typed_error,
    the_drivers_failures_name_the_block,
    a_failed_batch_returns_host_memory_only_once_the_stream_is_idle,
    gpu_scattered_blocks_round_trip_exactly,
    gpu_unaligned_blocks_reach_the_ends_of_their_buffers,
    gpu_the_driver_refuses_what_atlas_refuses_first,
);

fn demo(ordinal: usize) -> AtlasRegistry {
    AtlasRegistry::load(ordinal, ptx_for_model("demo").unwrap()).unwrap()
}

/// Every driver call made so far (the stand-in counts every entry point).
fn all_calls() -> u64 {
    probe().count("calls")
}

fn batch_refusal<T: std::fmt::Debug>(result: atlas_registry::Result<T>) -> BatchRefusal {
    match result {
        Err(AtlasError::Batch(refusal)) => refusal,
        other => panic!("expected a batch refusal, got {other:?}"),
    }
}

/// `0..n` shuffled (Fisher-Yates).
fn shuffled(rng: &mut Rng, n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        order.swap(i, rng.index(i + 1));
    }
    order
}

/// Counts of `names` since `before` was taken (`before` from the same names).
fn delta(names: &[&str], before: &[u64]) -> Vec<u64> {
    let p = probe();
    names
        .iter()
        .zip(before)
        .map(|(n, b)| p.count(n) - b)
        .collect()
}

fn counts(names: &[&str]) -> Vec<u64> {
    names.iter().map(|n| probe().count(n)).collect()
}

fn a_batch_is_one_driver_call_and_copies_exactly() {
    let p = probe();
    let registry = demo(0);
    let ctx = registry.ctx();
    let stream = CudaStream::new(ctx).unwrap();
    const BLOCK: usize = 8;
    const BLOCKS: usize = 8;
    let data: Vec<u32> = (0..(BLOCK * BLOCKS) as u32).map(|i| i * 7 + 1).collect();
    // Block i of the source goes to block ORDER[i] of the destination.
    const ORDER: [usize; BLOCKS] = [5, 2, 7, 0, 3, 6, 1, 4];
    let mut scattered = vec![0u32; data.len()];
    for (i, &to) in ORDER.iter().enumerate() {
        scattered[to * BLOCK..][..BLOCK].copy_from_slice(&data[i * BLOCK..][..BLOCK]);
    }
    let src = DeviceBuffer::from_slice(ctx, &stream, &data).unwrap();
    let mut dst = DeviceBuffer::from_slice(ctx, &stream, &vec![u32::MAX; data.len()]).unwrap();
    // Another library's context current: a batch on a created stream does not care.
    p.foreign_context(0);
    let mut batch = CopyBatch::with_capacity(2 * BLOCKS);
    let capacity = batch.capacity();
    assert!(capacity >= 2 * BLOCKS);

    // Device to device: begin, blocks and enqueue are one driver call, and no other.
    let names = ["calls", "cuMemcpyBatchAsync"];
    let before = counts(&names);
    let mut copies = batch.begin(&stream).unwrap();
    let from = copies.read_device(src.as_slice()).unwrap();
    let to = copies.write_device(dst.as_slice_mut()).unwrap();
    for (i, &at) in ORDER.iter().enumerate() {
        copies
            .device_to_device(from, i * BLOCK, to, at * BLOCK, BLOCK)
            .unwrap();
    }
    assert_eq!(copies.len(), BLOCKS);
    copies.enqueue().unwrap();
    assert_eq!(delta(&names, &before), [1, 1], "{names:?}");
    assert_eq!(dst.to_vec(&stream).unwrap(), scattered);

    // Host to device from page-locked memory and device to host into page-locked memory, in one
    // batch: the batch call and one event record per page-locked memory.
    let mut upload = PinnedBuffer::from_slice(ctx, &data, PinnedFlags::new()).unwrap();
    let mut download =
        PinnedBuffer::from_slice(ctx, &vec![7u32; data.len()], PinnedFlags::new()).unwrap();
    let mut uploaded = DeviceBuffer::from_slice(ctx, &stream, &vec![0u32; data.len()]).unwrap();
    let names = [
        "calls",
        "cuMemcpyBatchAsync",
        "cuEventRecord",
        "cuStreamWaitEvent",
        "cuEventSynchronize",
    ];
    let before = counts(&names);
    let mut copies = batch.begin(&stream).unwrap();
    let host_in = copies.read_host(&mut upload).unwrap();
    let device_in = copies.write_device(uploaded.as_slice_mut()).unwrap();
    let device_out = copies.read_device(dst.as_slice()).unwrap();
    let host_out = copies.write_host(&mut download).unwrap();
    for (i, &at) in ORDER.iter().enumerate() {
        copies
            .host_to_device(host_in, i * BLOCK, device_in, at * BLOCK, BLOCK)
            .unwrap();
        // Gathered back: destination block i from scattered block ORDER[i].
        copies
            .device_to_host(device_out, at * BLOCK, host_out, i * BLOCK, BLOCK)
            .unwrap();
    }
    copies.enqueue().unwrap();
    assert_eq!(delta(&names, &before), [3, 1, 2, 0, 0], "{names:?}");
    // Reading what came back waits for the batch's record: once.
    assert_eq!(download.as_slice().unwrap(), &data[..]);
    assert_eq!(
        delta(&names, &before)[4],
        1,
        "one wait before the host reads"
    );
    assert_eq!(uploaded.to_vec(&stream).unwrap(), scattered);
    assert_eq!(batch.capacity(), capacity, "the batches grew no vector");

    // Ordinary slices: the batch and a synchronize, after which the slice holds the copies.
    let mut gathered = vec![0u32; data.len()];
    let names = ["calls", "cuMemcpyBatchAsync", "cuStreamSynchronize"];
    let before = counts(&names);
    let mut copies = batch.begin(&stream).unwrap();
    let from = copies.read_device(dst.as_slice()).unwrap();
    let into = copies.write_slice(&mut gathered);
    for (i, &at) in ORDER.iter().enumerate() {
        copies
            .device_to_host(from, at * BLOCK, into, i * BLOCK, BLOCK)
            .unwrap();
    }
    copies.enqueue().unwrap();
    assert_eq!(delta(&names, &before), [2, 1, 1], "{names:?}");
    assert_eq!(gathered, data);
    let reversed: Vec<u32> = data.iter().rev().copied().collect();
    let mut copies = batch.begin(&stream).unwrap();
    let from = copies.read_slice(&reversed);
    let into = copies.write_device(dst.as_slice_mut()).unwrap();
    copies
        .host_to_device(from, 0, into, 0, reversed.len())
        .unwrap();
    copies.enqueue().unwrap();
    assert_eq!(dst.to_vec(&stream).unwrap(), reversed);

    // Nothing to copy: no block, or empty blocks only (checked and numbered all the same): no
    // driver call.
    let before = all_calls();
    batch.begin(&stream).unwrap().enqueue().unwrap();
    let mut copies = batch.begin(&stream).unwrap();
    let from = copies.read_device(src.as_slice()).unwrap();
    let to = copies.write_device(dst.as_slice_mut()).unwrap();
    copies.device_to_device(from, 3, to, 64, 0).unwrap();
    copies.device_to_device(from, 64, to, 0, 0).unwrap();
    assert_eq!(copies.len(), 2);
    copies.enqueue().unwrap();
    assert_eq!(all_calls(), before, "no driver call for nothing to copy");

    // The hint to overlap with kernels reaches the driver as its flag (the stand-in refuses any
    // other), and the per-thread default stream is taken, its context made current first.
    batch.prefer_overlap_with_compute(true);
    p.foreign_context(0);
    // SAFETY: CU_STREAM_PER_THREAD is a default stream handle, valid for the whole process.
    let per_thread = unsafe { CudaStream::wrap(ctx, std::ptr::without_provenance_mut(2)) }.unwrap();
    let mut copies = batch.begin(&per_thread).unwrap();
    let from = copies.read_device(src.as_slice()).unwrap();
    let to = copies.write_device(dst.as_slice_mut()).unwrap();
    copies.device_to_device(from, 0, to, 0, data.len()).unwrap();
    copies.enqueue().unwrap();
    assert_eq!(dst.to_vec(&stream).unwrap(), data);
    assert_eq!(p.count("context_mismatch"), 0);
    assert_eq!(p.count("copy_overlap"), 0);
}

#[test]
fn a_batch_is_one_driver_call_and_copies_exactly_in_every_direction() {
    standin::run(a_batch_is_one_driver_call_and_copies_exactly, &[]);
}

fn memory_the_batch_used_waits_for_it() {
    let p = probe();
    let registry = demo(0);
    let ctx = registry.ctx();
    let (a, b) = (CudaStream::new(ctx).unwrap(), CudaStream::new(ctx).unwrap());
    let mut batch = CopyBatch::new();
    let mut host = PinnedBuffer::from_slice(ctx, &[1.0f32; 16], PinnedFlags::new()).unwrap();
    let mut used = DeviceBuffer::<f32>::alloc(ctx, 16).unwrap();
    let unused = DeviceBuffer::<f32>::alloc(ctx, 16).unwrap();
    let mut copies = batch.begin(&a).unwrap();
    let from = copies.read_host(&mut host).unwrap();
    let to = copies.write_device(used.as_slice_mut()).unwrap();
    copies.host_to_device(from, 0, to, 0, 16).unwrap();
    copies.enqueue().unwrap();
    // The host reads memory that the device only reads without waiting; a write waits.
    let syncs = || p.count("cuEventSynchronize");
    let before = syncs();
    assert_eq!(host.as_slice().unwrap(), &[1.0f32; 16][..]);
    assert_eq!(
        syncs(),
        before,
        "a read of memory the batch reads does not wait"
    );
    // A batch on another stream while the last one may still run there waits for it first.
    let names = [
        "calls",
        "cuMemcpyBatchAsync",
        "cuEventRecord",
        "cuStreamWaitEvent",
    ];
    let before = counts(&names);
    let mut copies = batch.begin(&b).unwrap();
    let from = copies.read_device(used.as_slice()).unwrap();
    let to = copies.write_host(&mut host).unwrap();
    copies.device_to_host(from, 0, to, 0, 16).unwrap();
    copies.enqueue().unwrap();
    assert_eq!(delta(&names, &before), [3, 1, 1, 1], "{names:?}");
    let before = syncs();
    host.as_mut_slice().unwrap()[0] = 2.0;
    assert_eq!(
        syncs(),
        before + 1,
        "a write waits for the batch that writes the memory"
    );
    // A buffer a batch touched is freed after the device's work; one never used is freed at once.
    let ctx_syncs = || p.count("cuCtxSynchronize");
    let before = ctx_syncs();
    drop(unused);
    assert_eq!(
        ctx_syncs(),
        before,
        "an unused buffer is freed without a wait"
    );
    drop(used);
    assert_eq!(
        ctx_syncs(),
        before + 1,
        "the batch's buffer waits for the device"
    );
}

#[test]
fn memory_a_batch_used_waits_for_it_as_for_its_other_copies() {
    standin::run(memory_the_batch_used_waits_for_it, &[]);
}

fn each_refusal_comes_before_the_driver() {
    let registry = demo(0);
    let ctx = registry.ctx();
    let mut stream = CudaStream::new(ctx).unwrap();
    let src = DeviceBuffer::from_slice(ctx, &stream, &[3u16; 64]).unwrap();
    let mut dst = DeviceBuffer::<u16>::alloc(ctx, 64).unwrap();
    let mut host = PinnedBuffer::<u16>::alloc(ctx, 32, PinnedFlags::new()).unwrap();
    let mut read_only =
        HostRegistration::register(ctx, vec![0u16; 32], RegisterFlags::new().read_only()).unwrap();
    let mut batch = CopyBatch::new();
    let calls = all_calls();

    // Ranges: past the source, past the destination, a length that overflows. A refused block
    // names the number it would have had and leaves the batch as it was.
    let mut copies = batch.begin(&stream).unwrap();
    let from = copies.read_device(src.as_slice()).unwrap();
    let to = copies.write_device(dst.as_slice_mut()).unwrap();
    copies.device_to_device(from, 0, to, 0, 8).unwrap();
    let refused = batch_refusal(copies.device_to_device(from, 60, to, 0, 5));
    assert_eq!(
        refused,
        BatchRefusal::OutOfRange {
            block: 1,
            side: CopySide::Source,
            start: 60,
            end: 65,
            len: 64
        }
    );
    assert_eq!(
        AtlasError::Batch(refused).to_string(),
        "cannot enqueue the batch of copies: block 1: elements 60..65 are not a range of the \
         source's 64 element(s)"
    );
    assert_eq!(
        batch_refusal(copies.device_to_device(from, 0, to, 64, 1)),
        BatchRefusal::OutOfRange {
            block: 1,
            side: CopySide::Destination,
            start: 64,
            end: 65,
            len: 64
        }
    );
    assert_eq!(
        batch_refusal(copies.device_to_device(from, 1, to, 0, usize::MAX)),
        BatchRefusal::OutOfRange {
            block: 1,
            side: CopySide::Source,
            start: 1,
            end: usize::MAX,
            len: 64
        }
    );
    assert_eq!(copies.len(), 1, "refused blocks are not added");
    // Overlapping destinations: blocks 1 and 3 share element 20 (block 2 lies elsewhere).
    copies.device_to_device(from, 0, to, 16, 5).unwrap();
    copies.device_to_device(from, 0, to, 40, 8).unwrap();
    copies.device_to_device(from, 8, to, 20, 4).unwrap();
    let refused = batch_refusal(copies.enqueue());
    assert_eq!(
        refused,
        BatchRefusal::OverlappingDestinations {
            first: 1,
            second: 3
        }
    );
    assert!(
        AtlasError::Batch(refused)
            .to_string()
            .contains("blocks 1 and 3 write overlapping memory"),
    );
    // In host memory too; and a block that ends where the next begins is no overlap.
    let mut copies = batch.begin(&stream).unwrap();
    let from = copies.read_device(src.as_slice()).unwrap();
    let to = copies.write_host(&mut host).unwrap();
    copies.device_to_host(from, 0, to, 0, 8).unwrap();
    copies.device_to_host(from, 0, to, 8, 8).unwrap();
    copies.device_to_host(from, 0, to, 4, 1).unwrap();
    assert_eq!(
        batch_refusal(copies.enqueue()),
        BatchRefusal::OverlappingDestinations {
            first: 0,
            second: 2
        }
    );

    // A handle of an earlier builder, whose borrows have ended.
    let earlier = {
        let mut copies = batch.begin(&stream).unwrap();
        copies.write_device(dst.as_slice_mut()).unwrap()
    };
    let mut copies = batch.begin(&stream).unwrap();
    let from = copies.read_device(src.as_slice()).unwrap();
    assert_eq!(
        batch_refusal(copies.device_to_device(from, 0, earlier, 0, 4)),
        BatchRefusal::ForeignMemory { block: 0 }
    );
    drop(copies);

    // Memory registered read-only for the device, as a destination.
    let mut copies = batch.begin(&stream).unwrap();
    match copies.write_host(&mut read_only) {
        Err(AtlasError::HostMemory(HostMemoryRefusal::ReadOnly)) => {}
        other => panic!("expected ReadOnly, got {other:?}"),
    }
    drop(copies);
    let mut copies = batch.begin(&stream).unwrap();
    copies.read_host(&mut read_only).unwrap();
    drop(copies);

    // The legacy default stream, which the driver refuses for batches.
    let legacy = CudaStream::legacy_default(ctx);
    assert_eq!(
        batch_refusal(batch.begin(&legacy)),
        BatchRefusal::LegacyDefaultStream
    );
    assert_eq!(all_calls(), calls, "no refusal reached the driver");
    // A stream being captured: the driver cannot capture a batch.
    let capture = stream.begin_capture().unwrap();
    let calls = all_calls();
    match batch.begin(&capture) {
        Err(AtlasError::Capture(CaptureMisuse::BatchedCopy)) => {}
        other => panic!("expected BatchedCopy, got {other:?}"),
    }
    assert_eq!(all_calls(), calls, "the refusal reached no driver call");
    drop(capture.end().unwrap());
    assert_eq!(probe().count("cuMemcpyBatchAsync"), 0);
}

#[test]
fn each_refusal_of_a_batch_comes_before_the_driver() {
    standin::run(each_refusal_comes_before_the_driver, &[]);
}

fn memory_of_another_device_is_refused() {
    let (r0, r1) = (demo(0), demo(1));
    let (c0, c1) = (r0.ctx(), r1.ctx());
    let s0 = CudaStream::new(c0).unwrap();
    let d1 = DeviceBuffer::<f32>::alloc(c1, 8).unwrap();
    let mut w1 = DeviceBuffer::<f32>::alloc(c1, 8).unwrap();
    let mut h1 = PinnedBuffer::<f32>::alloc(c1, 8, PinnedFlags::new()).unwrap();
    let mut r1 = HostRegistration::register(c1, vec![0.0f32; 8], RegisterFlags::new()).unwrap();
    let mut batch = CopyBatch::new();
    let calls = all_calls();
    let mut copies = batch.begin(&s0).unwrap();
    assert_wrong_context(
        copies.read_device(d1.as_slice()).unwrap_err(),
        "the device memory the batch reads",
        0,
        1,
    );
    assert_wrong_context(
        copies.write_device(w1.as_slice_mut()).unwrap_err(),
        "the device memory the batch writes",
        0,
        1,
    );
    assert_wrong_context(
        copies.read_host(&mut h1).unwrap_err(),
        "the page-locked memory the batch reads",
        0,
        1,
    );
    assert_wrong_context(
        copies.write_host(&mut r1).unwrap_err(),
        "the page-locked memory the batch writes",
        0,
        1,
    );
    assert!(copies.is_empty());
    copies.enqueue().unwrap();
    assert_eq!(all_calls(), calls, "nothing reached the driver");
}

#[test]
fn memory_of_another_device_is_refused_by_a_batch() {
    standin::run(
        memory_of_another_device_is_refused,
        &["-DSTANDIN_DEVICES=2"],
    );
}

fn a_driver_without_batched_copies_is_a_typed_error() {
    let registry = demo(0);
    let stream = CudaStream::new(registry.ctx()).unwrap();
    let mut batch = CopyBatch::new();
    let refused = batch_refusal(batch.begin(&stream));
    assert_eq!(
        refused,
        BatchRefusal::Unavailable {
            missing: "cuMemcpyBatchAsync"
        }
    );
    let text = AtlasError::Batch(refused).to_string();
    assert!(
        text.contains("cuMemcpyBatchAsync") && text.contains("CUDA 12.8 or newer"),
        "{text}"
    );
}

#[test]
fn a_driver_without_batched_copies_is_a_typed_error_naming_the_symbol() {
    standin::run(
        a_driver_without_batched_copies_is_a_typed_error,
        &["-DSTANDIN_NO_BATCH_COPY"],
    );
}

fn the_drivers_failures_name_the_block() {
    let p = probe();
    let registry = demo(0);
    let ctx = registry.ctx();
    let stream = CudaStream::new(ctx).unwrap();
    let src = DeviceBuffer::from_slice(ctx, &stream, &[5u8; 32]).unwrap();
    let mut host = PinnedBuffer::<u8>::alloc(ctx, 32, PinnedFlags::new()).unwrap();
    let mut batch = CopyBatch::new();
    // Block 0 is empty (not handed to the driver): the driver's copy 1 is block 2.
    p.fail_batch_at(1, 1);
    let records = p.count("cuEventRecord");
    let mut copies = batch.begin(&stream).unwrap();
    let from = copies.read_device(src.as_slice()).unwrap();
    let to = copies.write_host(&mut host).unwrap();
    copies.device_to_host(from, 0, to, 0, 0).unwrap();
    copies.device_to_host(from, 0, to, 0, 8).unwrap();
    copies.device_to_host(from, 8, to, 8, 8).unwrap();
    let e = copies.enqueue().unwrap_err();
    match &e {
        AtlasError::BatchBlockFailed { block, failure } => {
            assert_eq!(
                (*block, failure.call, failure.code),
                (2, "cuMemcpyBatchAsync", 1)
            );
        }
        other => panic!("expected BatchBlockFailed, got {other:?}"),
    }
    assert_eq!(e.cuda_code(), Some(1));
    let text = e.to_string();
    assert!(
        text.starts_with("block 2 of the batch of copies: cuMemcpyBatchAsync failed")
            && text.contains("CUDA_ERROR_INVALID_VALUE"),
        "{text}"
    );
    // A batch the driver did not take is not followed: the host waits for nothing.
    assert_eq!(p.count("cuEventRecord"), records);
    let waits = p.count("cuEventSynchronize");
    assert_eq!(host.as_slice().unwrap(), &[0u8; 32][..]);
    assert_eq!(p.count("cuEventSynchronize"), waits);
    // A failure that names no block is the driver's error as it is.
    p.inject("cuMemcpyBatchAsync", 999, 1);
    let mut copies = batch.begin(&stream).unwrap();
    let from = copies.read_device(src.as_slice()).unwrap();
    let to = copies.write_host(&mut host).unwrap();
    copies.device_to_host(from, 0, to, 0, 32).unwrap();
    match copies.enqueue() {
        Err(AtlasError::Driver(failure)) => {
            assert_eq!((failure.call, failure.code), ("cuMemcpyBatchAsync", 999));
            assert!(
                failure.subject.contains("1 copies of a batch of 1 blocks"),
                "{failure}"
            );
        }
        other => panic!("expected a driver failure, got {other:?}"),
    }
    // And the batch works again.
    let mut copies = batch.begin(&stream).unwrap();
    let from = copies.read_device(src.as_slice()).unwrap();
    let to = copies.write_host(&mut host).unwrap();
    copies.device_to_host(from, 0, to, 0, 32).unwrap();
    copies.enqueue().unwrap();
    assert_eq!(host.as_slice().unwrap(), &[5u8; 32][..]);
}

#[test]
fn the_drivers_failures_name_the_block_of_the_batch() {
    standin::run(the_drivers_failures_name_the_block, &[]);
}

/// The driver does not say whether the copies before the one it names in `failIdx` were
/// enqueued: a failed batch that borrowed ordinary host memory or page-locked memory waits for
/// its stream before it returns, so the memory is never handed back while a copy may still use it.
fn a_failed_batch_returns_host_memory_only_once_the_stream_is_idle() {
    let p = probe();
    let registry = demo(0);
    let ctx = registry.ctx();
    let stream = CudaStream::new(ctx).unwrap();
    let src = DeviceBuffer::from_slice(ctx, &stream, &[5u8; 32]).unwrap();
    let mut batch = CopyBatch::new();
    let mut slice = vec![0u8; 32];
    let mut pinned = PinnedBuffer::<u8>::alloc(ctx, 32, PinnedFlags::new()).unwrap();
    for pinned_side in [false, true] {
        p.fail_batch_at(1, 1);
        let syncs = p.count("cuStreamSynchronize");
        let mut copies = batch.begin(&stream).unwrap();
        let from = copies.read_device(src.as_slice()).unwrap();
        let to = if pinned_side {
            copies.write_host(&mut pinned).unwrap()
        } else {
            copies.write_slice(&mut slice)
        };
        copies.device_to_host(from, 0, to, 0, 16).unwrap();
        copies.device_to_host(from, 16, to, 16, 16).unwrap();
        let e = copies.enqueue().unwrap_err();
        assert!(
            matches!(e, AtlasError::BatchBlockFailed { block: 1, .. }),
            "{e:?}"
        );
        assert_eq!(
            p.count("cuStreamSynchronize"),
            syncs + 1,
            "pinned destination: {pinned_side}"
        );
    }
}

#[test]
fn a_failed_batch_waits_for_its_stream_before_it_returns() {
    standin::run(
        a_failed_batch_returns_host_memory_only_once_the_stream_is_idle,
        &[],
    );
}

/// 4,096 blocks of 16 KiB of fresh random data: scattered from page-locked memory into shuffled
/// blocks of a poisoned device buffer, gathered back in another shuffled order into poisoned
/// page-locked memory, and shuffled again between two device buffers; every byte compared with
/// the CPU's permutation of the data.
fn gpu_scattered_blocks_round_trip_exactly() {
    const BLOCK: usize = (16 << 10) / 4; // u32 elements of 16 KiB
    const BLOCKS: usize = 4096;
    const POISON: u32 = 0xDEAD_BEEF;
    let mut rng = Rng::new();
    let registry = demo(0);
    let ctx = registry.ctx();
    let stream = CudaStream::new(ctx).unwrap();
    let data: Vec<u32> = (0..BLOCK * BLOCKS).map(|_| rng.next_u64() as u32).collect();
    let mut upload = PinnedBuffer::from_slice(ctx, &data, PinnedFlags::new()).unwrap();
    let mut download =
        PinnedBuffer::from_slice(ctx, &vec![POISON; data.len()], PinnedFlags::new()).unwrap();
    let mut device = DeviceBuffer::<u32>::alloc(ctx, data.len()).unwrap();
    let mut shuffled_device = DeviceBuffer::<u32>::alloc(ctx, data.len()).unwrap();
    device.fill(&stream, POISON).unwrap();
    shuffled_device.fill(&stream, POISON).unwrap();
    let mut batch = CopyBatch::with_capacity(BLOCKS);
    let block = |v: &[u32], i: usize| v[i * BLOCK..][..BLOCK].to_vec();

    // Up: host block i to device block up[i].
    let up = shuffled(&mut rng, BLOCKS);
    let start = std::time::Instant::now();
    let mut copies = batch.begin(&stream).unwrap();
    let from = copies.read_host(&mut upload).unwrap();
    let to = copies.write_device(device.as_slice_mut()).unwrap();
    for (i, &at) in up.iter().enumerate() {
        copies
            .host_to_device(from, i * BLOCK, to, at * BLOCK, BLOCK)
            .unwrap();
    }
    copies.enqueue().unwrap();
    stream.synchronize().unwrap();
    let up_time = start.elapsed();
    let on_device = device.to_vec(&stream).unwrap();
    for (i, &at) in up.iter().enumerate() {
        assert!(
            block(&on_device, at) == block(&data, i),
            "upload: block {i} at {at}"
        );
    }

    // Down: device block down[j] to host block j.
    let down = shuffled(&mut rng, BLOCKS);
    let start = std::time::Instant::now();
    let mut copies = batch.begin(&stream).unwrap();
    let from = copies.read_device(device.as_slice()).unwrap();
    let to = copies.write_host(&mut download).unwrap();
    for (j, &at) in down.iter().enumerate() {
        copies
            .device_to_host(from, at * BLOCK, to, j * BLOCK, BLOCK)
            .unwrap();
    }
    copies.enqueue().unwrap();
    let back = download.as_slice().unwrap(); // waits for the batch
    let down_time = start.elapsed();
    let mut expected = vec![0u32; data.len()];
    for (j, &at) in down.iter().enumerate() {
        expected[j * BLOCK..][..BLOCK].copy_from_slice(&block(&on_device, at));
    }
    assert!(
        back == &expected[..],
        "download differs from the CPU's permutation"
    );

    // Between device buffers: device block i to block across[i] of the other.
    let across = shuffled(&mut rng, BLOCKS);
    let mut copies = batch.begin(&stream).unwrap();
    let from = copies.read_device(device.as_slice()).unwrap();
    let to = copies.write_device(shuffled_device.as_slice_mut()).unwrap();
    for (i, &at) in across.iter().enumerate() {
        copies
            .device_to_device(from, i * BLOCK, to, at * BLOCK, BLOCK)
            .unwrap();
    }
    copies.enqueue().unwrap();
    let moved = shuffled_device.to_vec(&stream).unwrap();
    let mut expected = vec![0u32; data.len()];
    for (i, &at) in across.iter().enumerate() {
        expected[at * BLOCK..][..BLOCK].copy_from_slice(&block(&on_device, i));
    }
    assert!(
        moved == expected,
        "device-to-device differs from the CPU's permutation"
    );
    let gib = (BLOCK * BLOCKS * 4) as f64 / f64::from(1 << 30);
    println!(
        "4096 blocks of 16 KiB: up {up_time:?} ({:.1} GiB/s), down {down_time:?} ({:.1} GiB/s), \
         each one batch, synchronize included",
        gib / up_time.as_secs_f64(),
        gib / down_time.as_secs_f64()
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_4096_scattered_blocks_of_16k_round_trip_exactly() {
    let child = child::run_on(gpu_scattered_blocks_round_trip_exactly, None);
    child.print_tail("gpu_scattered_blocks_round_trip_exactly");
    assert_eq!(child.ending, Ending::Passed, "{child}");
}

/// Blocks of bytes at odd offsets and odd lengths, one starting each buffer and one ending it,
/// up from page-locked memory, down into an ordinary `Vec` and between device buffers: what the
/// blocks cover holds the data, everything else keeps its poison.
fn gpu_unaligned_blocks_reach_the_ends_of_their_buffers() {
    const LEN: usize = 1 << 20;
    const SLOT: usize = 301; // every block lies in a slot of its own
    let mut rng = Rng::new();
    let registry = demo(0);
    let ctx = registry.ctx();
    let stream = CudaStream::new(ctx).unwrap();
    let data = rng.bytes(LEN);
    let mut upload = PinnedBuffer::from_slice(ctx, &data, PinnedFlags::new()).unwrap();
    let mut device = DeviceBuffer::from_slice(ctx, &stream, &vec![0xA5u8; LEN]).unwrap();
    let mut other = DeviceBuffer::from_slice(ctx, &stream, &vec![0x5Au8; LEN]).unwrap();
    // (source start, destination start, length): the first block starts both buffers, the last
    // ends both; the others are random within their slots.
    let slots = LEN / SLOT;
    let mut blocks = vec![(0, 0, 1 + rng.index(SLOT - 1))];
    let dst_slots = shuffled(&mut rng, slots - 2);
    for (k, &d) in dst_slots.iter().enumerate() {
        let len = 1 + rng.index(SLOT - 1);
        let (s_off, d_off) = (rng.index(SLOT - len + 1), rng.index(SLOT - len + 1));
        blocks.push(((k + 1) * SLOT + s_off, (d + 1) * SLOT + d_off, len));
    }
    let tail = 1 + rng.index(LEN - slots * SLOT + SLOT - 1);
    blocks.push((LEN - tail, LEN - tail, tail));
    let mut expected = vec![0xA5u8; LEN];
    for &(s, d, n) in &blocks {
        expected[d..d + n].copy_from_slice(&data[s..s + n]);
    }
    let mut batch = CopyBatch::new();
    let mut copies = batch.begin(&stream).unwrap();
    let from = copies.read_host(&mut upload).unwrap();
    let to = copies.write_device(device.as_slice_mut()).unwrap();
    for &(s, d, n) in &blocks {
        copies.host_to_device(from, s, to, d, n).unwrap();
    }
    copies.enqueue().unwrap();
    assert!(device.to_vec(&stream).unwrap() == expected, "upload");
    // Back into a Vec (the batch waits), same blocks the other way round.
    let mut back = vec![0x3Cu8; LEN];
    let mut want = vec![0x3Cu8; LEN];
    let mut copies = batch.begin(&stream).unwrap();
    let from = copies.read_device(device.as_slice()).unwrap();
    let to = copies.write_slice(&mut back);
    for &(s, d, n) in &blocks {
        copies.device_to_host(from, d, to, s, n).unwrap();
        want[s..s + n].copy_from_slice(&data[s..s + n]);
    }
    copies.enqueue().unwrap();
    assert!(back == want, "download into a Vec");
    // Between device buffers, the same blocks.
    let mut copies = batch.begin(&stream).unwrap();
    let from = copies.read_device(device.as_slice()).unwrap();
    let to = copies.write_device(other.as_slice_mut()).unwrap();
    let mut want = vec![0x5Au8; LEN];
    for &(_, d, n) in &blocks {
        copies.device_to_device(from, d, to, d, n).unwrap();
        want[d..d + n].copy_from_slice(&expected[d..d + n]);
    }
    copies.enqueue().unwrap();
    assert!(other.to_vec(&stream).unwrap() == want, "device to device");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_unaligned_blocks_reach_the_ends_of_their_buffers_exactly() {
    let child = child::run_on(gpu_unaligned_blocks_reach_the_ends_of_their_buffers, None);
    assert_eq!(child.ending, Ending::Passed, "{child}");
}

/// The driver's own answers to what Atlas refuses first, through the raw entry point: a batch on
/// the legacy default stream, and one on a stream being captured (which must not be taken into
/// the graph). Printed, and asserted to be refusals.
fn gpu_the_driver_refuses_what_atlas_refuses_first() {
    let registry = demo(0);
    let ctx = registry.ctx();
    let mut stream = CudaStream::new(ctx).unwrap();
    let src = DeviceBuffer::from_slice(ctx, &stream, &[1u8; 64]).unwrap();
    let dst = DeviceBuffer::<u8>::alloc(ctx, 64).unwrap();
    let cuda = sys::driver().unwrap();
    let batch = sys::entry!(cuda, cuMemcpyBatchAsync).unwrap();
    let raw_batch = |on: CUstream| {
        let (mut dsts, mut srcs, mut sizes): ([CUdeviceptr; 1], [CUdeviceptr; 1], [usize; 1]) =
            ([dst.device_ptr()], [src.device_ptr()], [64]);
        let mut attributes = sys::CUmemcpyAttributes {
            srcAccessOrder: sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
            srcLocHint: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_INVALID,
                id: 0,
            },
            dstLocHint: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_INVALID,
                id: 0,
            },
            flags: 0,
        };
        let (mut first, mut fail) = (0usize, 0usize);
        // SAFETY: one copy of 64 bytes between two live 64-byte buffers of the current context
        // (bound below); the arrays and out-pointers are live for the call; the buffers outlive
        // it (the stream is synchronized, or the copy refused).
        let status = unsafe {
            batch(
                dsts.as_mut_ptr(),
                srcs.as_mut_ptr(),
                sizes.as_mut_ptr(),
                1,
                &mut attributes,
                &mut first,
                1,
                &mut fail,
                on,
            )
        };
        (status, fail)
    };
    ctx.bind().unwrap();
    let (status, fail) = raw_batch(std::ptr::null_mut());
    println!("legacy default stream: {status:?}, failIdx {fail:#x}");
    assert_ne!(
        status,
        CUresult::CUDA_SUCCESS,
        "the driver takes a batch on the legacy stream"
    );
    let (status, _) = raw_batch(stream.raw());
    assert_eq!(
        status,
        CUresult::CUDA_SUCCESS,
        "a batch on a created stream"
    );
    stream.synchronize().unwrap();
    let capture = stream.begin_capture().unwrap();
    let (status, fail) = raw_batch(capture.raw());
    println!("stream being captured: {status:?}, failIdx {fail:#x}");
    let ended = capture.end();
    println!("the capture then ends with {:?}", ended.as_ref().map(drop));
    assert_ne!(
        status,
        CUresult::CUDA_SUCCESS,
        "the driver captures a batch"
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_the_driver_refuses_batches_on_the_legacy_stream_and_in_captures() {
    let child = child::run_on(gpu_the_driver_refuses_what_atlas_refuses_first, None);
    child.print_tail("gpu_the_driver_refuses_what_atlas_refuses_first");
    assert_eq!(child.ending, Ending::Passed, "{child}");
}
