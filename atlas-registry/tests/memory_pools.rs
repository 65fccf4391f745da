//! Memory pools of one's own (`MemoryPool`) and the device's default pool: properties, allocation
//! on a stream, usage, trimming, and the refusals made before the driver is called.
//!
//! The stand-in tests run in child processes (`cargo test -p atlas-registry --test memory_pools`);
//! the GPU tests compare with the CPU on fresh random data (on a GPU machine:
//! `-- --include-ignored memory_pools_gpu`). The reuse of memory across two streams ordered by an
//! event runs alone under the sanitizer:
//! `compute-sanitizer --tool racecheck <test binary> --include-ignored --exact
//! memory_pools_gpu_reuse_across_streams_after_an_event` (and `--tool memcheck`).

mod support;

use atlas_kernels::ptx_for_model;
use atlas_registry::sys::CUgraphNodeType;
use atlas_registry::{
    AtlasError, AtlasRegistry, CudaEvent, CudaStream, DeviceBuffer, DeviceMemoryMut, FunctionCache,
    LaunchConfig, MemoryPool, PoolProperties, PoolRefusal, ReusePolicy, host,
};
use support::child;
use support::graphs::{assert_wrong_context, node_types};
use support::reference::assert_close;
use support::rng::Rng;
use support::standin;

child::bodies!(
    usage_follows_allocations_and_trim_lowers_reserved,
    properties_round_trip,
    an_allocation_from_a_pool_is_one_driver_call,
    a_pool_of_another_device_is_refused,
    a_buffer_outlives_its_pool,
    a_pool_allocation_in_a_capture_is_the_graphs,
    a_maximum_size_is_kept,
    a_maximum_size_needs_cuda_12_2,
    missing_pool_entry_points_are_named,
    a_device_without_pools_is_refused,
);

static SCALE: FunctionCache = FunctionCache::new("elementwise", "scale");

/// The demo model on device 0.
fn demo() -> AtlasRegistry {
    AtlasRegistry::load(0, ptx_for_model("demo").unwrap()).unwrap()
}

// ---------------------------------------------------------------------------------------------
// On the stand-in
// ---------------------------------------------------------------------------------------------

#[test]
fn pool_usage_and_properties_on_the_standin() {
    standin::run(usage_follows_allocations_and_trim_lowers_reserved, &[]);
    standin::run(properties_round_trip, &[]);
    standin::run(a_buffer_outlives_its_pool, &[]);
    standin::run(a_pool_allocation_in_a_capture_is_the_graphs, &[]);
    standin::run(a_maximum_size_is_kept, &[]);
}

#[test]
fn pool_allocation_is_one_driver_call() {
    standin::run(an_allocation_from_a_pool_is_one_driver_call, &[]);
}

#[test]
fn pool_refusals_on_the_standin() {
    standin::run(
        a_pool_of_another_device_is_refused,
        &["-DSTANDIN_DEVICES=2"],
    );
    standin::run(
        a_maximum_size_needs_cuda_12_2,
        &["-DSTANDIN_DRIVER_VERSION=12000"],
    );
    standin::run(
        missing_pool_entry_points_are_named,
        &["-DSTANDIN_NO_MEMORY_POOL_API"],
    );
    standin::run(
        a_device_without_pools_is_refused,
        &["-DSTANDIN_NO_MEMORY_POOLS"],
    );
}

/// Usage follows what was allocated and freed, in a pool of one's own and in the default pool;
/// trimming lowers what is reserved, never below what is used; resetting the high-water marks
/// brings them down to the current figures.
fn usage_follows_allocations_and_trim_lowers_reserved() {
    let registry = demo();
    let ctx = registry.ctx();
    let stream = CudaStream::new(ctx).unwrap();
    let mut rng = Rng::new();
    let pool = MemoryPool::new(ctx, &PoolProperties::new().release_threshold(1 << 20)).unwrap();
    assert_eq!(
        pool.usage().unwrap(),
        Default::default(),
        "a new pool holds nothing"
    );
    let sizes: Vec<usize> = (0..6).map(|_| 1 + rng.index(5000)).collect();
    // SAFETY: used only on `stream`, which outlives them; no capture.
    let mut buffers: Vec<DeviceBuffer<f32>> = sizes
        .iter()
        .map(|&n| unsafe { pool.alloc_async(&stream, n) }.unwrap())
        .collect();
    let total: u64 = sizes.iter().map(|&n| n as u64 * 4).sum();
    let usage = pool.usage().unwrap();
    assert_eq!((usage.used, usage.used_high), (total, total), "{usage:?}");
    assert!(usage.reserved >= usage.used && usage.reserved_high >= usage.reserved);

    // Free the first half: used falls, reserved stays until a trim.
    let freed: u64 = sizes[..3].iter().map(|&n| n as u64 * 4).sum();
    for b in buffers.drain(..3) {
        b.free().unwrap();
    }
    stream.synchronize().unwrap();
    let after = pool.usage().unwrap();
    assert_eq!(after.used, total - freed);
    assert_eq!(after.used_high, total, "the high-water mark stays");
    assert!(after.reserved >= total - freed);
    pool.trim_to(0).unwrap();
    let trimmed = pool.usage().unwrap();
    assert!(
        trimmed.reserved < after.reserved,
        "{after:?} then {trimmed:?}"
    );
    assert_eq!(trimmed.reserved, trimmed.used, "never below what is used");
    pool.reset_high_water().unwrap();
    let reset = pool.usage().unwrap();
    assert_eq!(
        (reset.reserved_high, reset.used_high),
        (reset.reserved, reset.used)
    );
    // The buffers left are the pool's memory: copies reach them.
    let data = rng.vec(sizes[4]);
    buffers[1].copy_from(&stream, &data).unwrap();
    assert_eq!(buffers[1].to_vec(&stream).unwrap(), data);
    drop(buffers);
    assert_eq!(pool.usage().unwrap().used, 0);

    // The default pool counts `alloc_async`'s allocations.
    let default = MemoryPool::device_default(ctx).unwrap();
    assert!(default.is_device_default() && !default.is_exportable());
    let before = default.usage().unwrap().used;
    let n = 1 + rng.index(4096);
    // SAFETY: as above.
    let b = unsafe { DeviceBuffer::<u32>::alloc_async(ctx, &stream, n) }.unwrap();
    assert_eq!(default.usage().unwrap().used, before + n as u64 * 4);
    drop(b);
    assert_eq!(default.usage().unwrap().used, before);
    default.trim_to(0).unwrap();
    assert_eq!(default.usage().unwrap().reserved, before);
    drop(default);
    assert_eq!(
        standin::probe().count("cuMemPoolDestroy"),
        0,
        "the default pool is never destroyed"
    );
    drop(pool);
    assert_eq!(standin::probe().count("cuMemPoolDestroy"), 1);
    assert_eq!(standin::probe().count("live_pools"), 0);
}

/// What a pool is made with is what it has; the default pool's threshold goes through the same
/// door as before.
fn properties_round_trip() {
    let host = host(0).unwrap();
    let ctx = host.context();
    let p = standin::probe();
    let plain = MemoryPool::new(ctx, &PoolProperties::new()).unwrap();
    assert_eq!(
        p.count("cuMemPoolSetAttribute"),
        0,
        "the driver's defaults are not set again"
    );
    assert_eq!(plain.release_threshold().unwrap(), 0);
    assert_eq!(plain.reuse().unwrap(), ReusePolicy::ALL);
    let odd = ReusePolicy {
        follow_event_dependencies: true,
        allow_opportunistic: false,
        allow_internal_dependencies: true,
    };
    let props = PoolProperties::new()
        .release_threshold(u64::MAX)
        .reuse(odd)
        .max_size(1 << 30);
    let tuned = MemoryPool::new(ctx, &props).unwrap();
    assert_eq!(tuned.release_threshold().unwrap(), u64::MAX);
    assert_eq!(tuned.reuse().unwrap(), odd);
    tuned.set_reuse(ReusePolicy::SAME_STREAM).unwrap();
    assert_eq!(tuned.reuse().unwrap(), ReusePolicy::SAME_STREAM);
    tuned.set_release_threshold(12345).unwrap();
    assert_eq!(tuned.release_threshold().unwrap(), 12345);
    assert_eq!(plain.release_threshold().unwrap(), 0, "pools are apart");
    assert_eq!((tuned.ordinal(), tuned.is_device_default()), (0, false));
    host.set_pool_release_threshold(1 << 30).unwrap();
    assert_eq!(
        MemoryPool::device_default(ctx)
            .unwrap()
            .release_threshold()
            .unwrap(),
        1 << 30
    );
    assert_eq!(host.pool_release_threshold().unwrap(), 1 << 30);
    assert_eq!(p.count("live_pools"), 2);
}

/// Allocating from a pool on a created stream is one driver call, whatever context the thread
/// has current; nothing at all for no elements.
fn an_allocation_from_a_pool_is_one_driver_call() {
    let registry = demo();
    let ctx = registry.ctx();
    let stream = CudaStream::new(ctx).unwrap();
    let pool = MemoryPool::new(ctx, &PoolProperties::new()).unwrap();
    let p = standin::probe();
    p.foreign_context(0);
    let before = (p.count("calls"), p.count("cuMemAllocFromPoolAsync"));
    let mut rng = Rng::new();
    let buffers: Vec<DeviceBuffer<f32>> = (0..10)
        // SAFETY: used only on `stream`, which outlives them; no capture.
        .map(|_| unsafe { pool.alloc_async(&stream, 1 + rng.index(1000)) }.unwrap())
        .collect();
    // SAFETY: as above.
    let empty = unsafe { pool.alloc_async::<f32>(&stream, 0) }.unwrap();
    let after = (p.count("calls"), p.count("cuMemAllocFromPoolAsync"));
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
        (10, 10),
        "one cuMemAllocFromPoolAsync per allocation, and nothing else"
    );
    assert!(empty.is_empty() && empty.device_ptr() == 0);
    assert!(buffers.iter().all(DeviceBuffer::is_stream_ordered));
    let frees = p.count("cuMemFreeAsync");
    drop(buffers);
    drop(empty);
    assert_eq!(
        p.count("cuMemFreeAsync") - frees,
        10,
        "each freed on its stream"
    );
}

/// A stream of another device's context is refused before the driver is called.
fn a_pool_of_another_device_is_refused() {
    let (gpu0, gpu1) = (host(0).unwrap(), host(1).unwrap());
    let pool = MemoryPool::new(gpu1.context(), &PoolProperties::new()).unwrap();
    let stream = CudaStream::new(gpu0.context()).unwrap();
    let p = standin::probe();
    let calls = p.count("calls");
    // SAFETY: refused before anything is allocated.
    let refused = unsafe { pool.alloc_async::<f32>(&stream, 16) }.unwrap_err();
    assert_eq!(p.count("calls"), calls, "nothing reached the driver");
    let text = refused.to_string();
    assert_wrong_context(refused, "the stream", 1, 0);
    assert!(
        text.contains("device 0") && text.contains("device 1"),
        "{text}"
    );
    // Its own device's stream allocates.
    let own = CudaStream::new(gpu1.context()).unwrap();
    // SAFETY: used only on `own`, which outlives it; no capture.
    let b = unsafe { pool.alloc_async::<f32>(&own, 16) }.unwrap();
    assert_eq!(p.pointer_context(b.device_ptr()), p.primary_context(1));
}

/// A pool dropped while a buffer of it lives: the buffer keeps its memory (the driver defers the
/// release), and frees it on its stream when it goes.
fn a_buffer_outlives_its_pool() {
    let registry = demo();
    let ctx = registry.ctx();
    let stream = CudaStream::new(ctx).unwrap();
    let p = standin::probe();
    let live = p.count("live_allocations");
    let pool = MemoryPool::new(ctx, &PoolProperties::new()).unwrap();
    // SAFETY: used only on `stream`, which outlives it; no capture.
    let mut b = unsafe { pool.alloc_async::<f32>(&stream, 64) }.unwrap();
    drop(pool);
    assert_eq!(p.count("live_pools"), 0);
    let data = Rng::new().vec(64);
    b.copy_from(&stream, &data).unwrap();
    let scale = SCALE.get(&registry).unwrap();
    // SAFETY: `scale` touches the 64 floats of `b`; `to_vec` waits for it.
    unsafe {
        scale.launch(
            &stream,
            &LaunchConfig::for_elements(64, 64),
            (&mut b, 3.0f32, 64u32),
        )
    }
    .unwrap();
    let want: Vec<f32> = data.iter().map(|v| v * 3.0).collect();
    assert_eq!(b.to_vec(&stream).unwrap(), want);
    assert_eq!(p.count("stale_handle"), 0);
    b.free().unwrap();
    assert_eq!(p.count("live_allocations"), live);
}

/// On a capturing stream, an allocation from a pool is the graph's own (an allocation node),
/// freed by a free node when the buffer goes in the same capture.
fn a_pool_allocation_in_a_capture_is_the_graphs() {
    let registry = demo();
    let ctx = registry.ctx();
    let mut stream = CudaStream::new(ctx).unwrap();
    let pool = MemoryPool::new(ctx, &PoolProperties::new()).unwrap();
    let scale = SCALE.get(&registry).unwrap();
    let capture = stream.begin_capture().unwrap();
    // SAFETY: allocated and freed in this capture, on `stream`, which outlives the graph.
    let mut temp = unsafe { pool.alloc_async::<f32>(&capture, 32) }.unwrap();
    // SAFETY: captured, not run: the graph allocates `temp` itself.
    unsafe {
        scale.launch(
            &capture,
            &LaunchConfig::for_elements(32, 32),
            (&mut temp, 2.0f32, 32u32),
        )
    }
    .unwrap();
    drop(temp);
    let graph = capture.end().unwrap();
    let kinds = node_types(graph.raw());
    assert_eq!(
        kinds,
        [
            CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC,
            CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL,
            CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_FREE
        ]
    );
    assert_eq!(
        pool.usage().unwrap().used,
        0,
        "graph memory is not the pool's"
    );
    let exec = graph.instantiate().unwrap();
    // SAFETY: the graph allocates what it touches.
    unsafe { exec.launch(&stream) }.unwrap();
    stream.synchronize().unwrap();
    assert_eq!(standin::probe().count("fault"), 0);
}

/// A pool with a maximum size refuses an allocation beyond it (the driver's out-of-memory),
/// though the device has memory left, and allocates again once memory is freed.
fn a_maximum_size_is_kept() {
    let host = host(0).unwrap();
    let ctx = host.context();
    let stream = host.stream();
    let pool = MemoryPool::new(ctx, &PoolProperties::new().max_size(64 << 10)).unwrap();
    // SAFETY: used only on the host's stream, which lives for the process; no capture.
    let first = unsafe { pool.alloc_async::<u8>(stream, 48 << 10) }.unwrap();
    // SAFETY: as above.
    let over = unsafe { pool.alloc_async::<u8>(stream, 32 << 10) }.unwrap_err();
    assert_eq!(
        over.cuda_code(),
        Some(2),
        "CUDA_ERROR_OUT_OF_MEMORY: {over}"
    );
    assert!(
        over.to_string().contains("cuMemAllocFromPoolAsync"),
        "{over}"
    );
    drop(first);
    // SAFETY: as above.
    let again = unsafe { pool.alloc_async::<u8>(stream, 32 << 10) }.unwrap();
    assert_eq!(again.len(), 32 << 10);
}

/// A maximum size asked of a driver older than CUDA 12.2 is refused before the pool is made;
/// without one, the pool is made.
fn a_maximum_size_needs_cuda_12_2() {
    let host = host(0).unwrap();
    let ctx = host.context();
    let refused = MemoryPool::new(ctx, &PoolProperties::new().max_size(1 << 20)).unwrap_err();
    assert!(
        matches!(
            refused,
            AtlasError::Pool(PoolRefusal::MaxSizeUnsupported { driver: (12, 0) })
        ),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("CUDA 12.2"), "{refused}");
    assert_eq!(standin::probe().count("cuMemPoolCreate"), 0);
    MemoryPool::new(ctx, &PoolProperties::new().release_threshold(1 << 20)).unwrap();
}

/// A driver without the entry points of memory pools: every door names the first one missing.
fn missing_pool_entry_points_are_named() {
    let host = host(0).unwrap();
    let ctx = host.context();
    for err in [
        MemoryPool::new(ctx, &PoolProperties::new()).unwrap_err(),
        MemoryPool::device_default(ctx).unwrap_err(),
    ] {
        match &err {
            AtlasError::MissingSymbol(missing) => assert_eq!(missing.name, "cuMemAllocAsync"),
            other => panic!("{other:?}"),
        }
    }
}

/// A device without memory pools: refused, naming the attribute, before any pool is made.
fn a_device_without_pools_is_refused() {
    let host = host(0).unwrap();
    let ctx = host.context();
    for err in [
        MemoryPool::new(ctx, &PoolProperties::new()).unwrap_err(),
        MemoryPool::device_default(ctx).unwrap_err(),
    ] {
        assert!(
            matches!(err, AtlasError::MemoryPoolsUnsupported { device: 0 }),
            "{err:?}"
        );
    }
    assert_eq!(standin::probe().count("cuMemPoolCreate"), 0);
}

// ---------------------------------------------------------------------------------------------
// On a GPU
// ---------------------------------------------------------------------------------------------

/// A pool with a release threshold: usage follows what was allocated; after the frees and a
/// synchronize, the pool keeps memory up to the threshold, and trimming gives it back to the
/// device (free memory rises, reserved falls to nothing).
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn memory_pools_gpu_usage_and_trim() {
    let registry = demo();
    let ctx = registry.ctx();
    let stream = CudaStream::new(ctx).unwrap();
    let threshold = 512u64 << 20;
    let pool = MemoryPool::new(ctx, &PoolProperties::new().release_threshold(threshold)).unwrap();
    let mut rng = Rng::new();
    // Sizes of whole 2 MiB pages and odd ones, 100 to 300 MiB in all.
    let sizes: Vec<usize> = (0..8)
        .map(|i| {
            let mib = 12 + rng.index(26);
            (mib << 20) + if i % 2 == 0 { 0 } else { 1 + rng.index(4096) }
        })
        .collect();
    let total: u64 = sizes.iter().map(|&n| n as u64).sum();
    // SAFETY: used only on `stream`, which outlives them; no capture.
    let buffers: Vec<DeviceBuffer<u8>> = sizes
        .iter()
        .map(|&n| unsafe { pool.alloc_async(&stream, n) }.unwrap())
        .collect();
    let usage = pool.usage().unwrap();
    println!("{} allocations of {total} bytes: {usage:?}", sizes.len());
    let slack = sizes.len() as u64 * (2 << 20);
    assert!(
        usage.used >= total && usage.used <= total + slack,
        "used {} for {total} allocated",
        usage.used
    );
    assert!(usage.reserved >= usage.used && usage.used_high >= usage.used);
    assert!(usage.reserved_high >= usage.reserved);
    for b in buffers {
        b.free().unwrap();
    }
    stream.synchronize().unwrap();
    let idle = pool.usage().unwrap();
    println!("after the frees and a synchronize: {idle:?}");
    assert_eq!(idle.used, 0);
    assert!(idle.reserved > 0 && idle.reserved <= threshold.max(usage.reserved));
    let free_before = ctx.memory_info().unwrap().free;
    pool.trim_to(0).unwrap();
    let trimmed = pool.usage().unwrap();
    let free_after = ctx.memory_info().unwrap().free;
    println!(
        "trimmed: {trimmed:?}; free memory {free_before} -> {free_after} (+{} bytes)",
        free_after as i128 - free_before as i128
    );
    assert_eq!(trimmed.reserved, 0);
    assert!(free_after > free_before, "free memory rose after the trim");
    pool.reset_high_water().unwrap();
    let reset = pool.usage().unwrap();
    assert_eq!((reset.reserved_high, reset.used_high), (0, 0));
}

/// Stream A writes a pool buffer with a kernel and frees it; an event recorded after the free
/// orders stream B, which allocates from the pool (the driver may hand it the same memory:
/// reported), writes and reads it. Both results match the CPU exactly: no race between A's last
/// use and B's first. Run alone under `compute-sanitizer --tool racecheck` and `--tool memcheck`.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn memory_pools_gpu_reuse_across_streams_after_an_event() {
    let registry = demo();
    let ctx = registry.ctx();
    let (a, b) = (CudaStream::new(ctx).unwrap(), CudaStream::new(ctx).unwrap());
    let reuse = ReusePolicy {
        follow_event_dependencies: true,
        ..ReusePolicy::SAME_STREAM
    };
    let pool = MemoryPool::new(
        ctx,
        &PoolProperties::new()
            .release_threshold(u64::MAX)
            .reuse(reuse),
    )
    .unwrap();
    let scale = SCALE.get(&registry).unwrap();
    let mut freed = CudaEvent::new(ctx).unwrap();
    let mut rng = Rng::new();
    let mut reused = 0;
    let rounds = 6;
    for round in 0..rounds {
        let n = 1 + rng.index(1 << 20);
        let (in_a, in_b) = (rng.vec(n), rng.vec(n));
        let (fa, fb) = (rng.f32_in(0.5, 2.0), rng.f32_in(-2.0, -0.5));
        let src_a = DeviceBuffer::from_slice(ctx, &a, &in_a).unwrap();
        let src_b = DeviceBuffer::from_slice(ctx, &b, &in_b).unwrap();
        let mut out_a = DeviceBuffer::<f32>::alloc(ctx, n).unwrap();
        let mut out_b = DeviceBuffer::<f32>::alloc(ctx, n).unwrap();
        out_a.fill(&a, f32::NAN).unwrap();
        out_b.fill(&b, f32::NAN).unwrap();
        let cfg = LaunchConfig::for_elements(n as u32, 256);

        // SAFETY: `x` is used only on `a` and freed there; `a` outlives it; no capture.
        let mut x = unsafe { pool.alloc_async::<f32>(&a, n) }.unwrap();
        let x_ptr = x.device_ptr();
        x.copy_from_device(&a, &src_a).unwrap();
        // SAFETY: `scale` touches the `n` floats of `x`, in `a`'s order before its free.
        unsafe { scale.launch(&a, &cfg, (&mut x, fa, n as u32)) }.unwrap();
        out_a.copy_from_device(&a, &x).unwrap();
        x.free().unwrap(); // in `a`'s order, after every use of `x` (all on `a`): duty 3
        freed.record(&a).unwrap();
        b.wait(&freed).unwrap();
        // SAFETY: `y` is used only on `b` and freed there; `b` outlives it; no capture.
        let mut y = unsafe { pool.alloc_async::<f32>(&b, n) }.unwrap();
        if y.device_ptr() == x_ptr {
            reused += 1;
        }
        y.copy_from_device(&b, &src_b).unwrap();
        // SAFETY: `scale` touches the `n` floats of `y`, in `b`'s order after its allocation.
        unsafe { scale.launch(&b, &cfg, (&mut y, fb, n as u32)) }.unwrap();
        out_b.copy_from_device(&b, &y).unwrap();
        y.free().unwrap();

        let want_a: Vec<f32> = in_a.iter().map(|v| v * fa).collect();
        let want_b: Vec<f32> = in_b.iter().map(|v| v * fb).collect();
        assert_close(
            &out_a.to_vec(&a).unwrap(),
            &want_a,
            0.0,
            &format!("round {round}, A"),
        );
        assert_close(
            &out_b.to_vec(&b).unwrap(),
            &want_b,
            0.0,
            &format!("round {round}, B"),
        );
    }
    println!(
        "the driver handed B the memory A freed in {reused} of {rounds} rounds (same address)"
    );
}
