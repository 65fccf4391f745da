//! Stream priorities, stream-ordered allocation from the device's default pool, and the refusals
//! of calls that would break a capture Atlas began.
//!
//! The refusals and missing-feature errors run against the stand-in libcuda, in child processes
//! (`cargo test -p atlas-registry --test stream_memory`); the GPU tests compare with the CPU on
//! fresh random data (on a GPU machine: `-- --include-ignored stream_memory_gpu`).

mod support;

use atlas_kernels::ptx_for_model;
use atlas_registry::sys::{CUgraph, CUgraphNodeType};
use atlas_registry::{
    AtlasError, AtlasRegistry, CaptureMisuse, CudaStream, DeviceBuffer, FunctionCache,
    LaunchConfig, host,
};
use support::child;
use support::graphs::node_types;
use support::reference::{assert_close, transform_reference};
use support::rng::Rng;
use support::standin;

child::bodies!(
    priorities_are_read_once_and_checked,
    synchronize_is_refused_while_capturing,
    blocking_calls_are_refused_while_this_thread_captures,
    a_failed_end_keeps_the_record_while_the_capture_goes_on,
    a_buffer_dropped_while_capturing_is_freed_when_the_capture_ends,
    stream_ordered_buffer_frees_on_its_stream,
    stream_of_another_device_is_refused,
    release_threshold_round_trips_on_the_standin,
    missing_pool_entry_points_are_named,
    device_without_memory_pools_is_refused,
    memory_allocated_in_the_capture_belongs_to_the_graph,
    a_pool_buffer_dropped_during_its_streams_capture_waits_for_it,
);

static SCALE: FunctionCache = FunctionCache::new("elementwise", "scale");
static AXPY: FunctionCache = FunctionCache::new("elementwise", "axpy");
static TRANSFORM: FunctionCache = FunctionCache::new("model", "transform");

/// The demo model on device 0.
fn demo() -> AtlasRegistry {
    AtlasRegistry::load(0, ptx_for_model("demo").unwrap()).unwrap()
}

fn capture_misuse(result: Result<impl std::fmt::Debug, AtlasError>) -> CaptureMisuse {
    match result {
        Err(AtlasError::Capture(misuse)) => misuse,
        other => panic!("expected a capture refusal, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// On the stand-in
// ---------------------------------------------------------------------------------------------

#[test]
fn stream_priorities_on_the_standin() {
    standin::run(priorities_are_read_once_and_checked, &[]);
}

#[test]
fn capture_refusals_on_the_standin() {
    standin::run(synchronize_is_refused_while_capturing, &[]);
    standin::run(blocking_calls_are_refused_while_this_thread_captures, &[]);
    standin::run(a_failed_end_keeps_the_record_while_the_capture_goes_on, &[]);
    standin::run(
        a_buffer_dropped_while_capturing_is_freed_when_the_capture_ends,
        &[],
    );
}

#[test]
fn stream_ordered_memory_on_the_standin() {
    standin::run(stream_ordered_buffer_frees_on_its_stream, &[]);
    standin::run(
        stream_of_another_device_is_refused,
        &["-DSTANDIN_DEVICES=2"],
    );
    standin::run(release_threshold_round_trips_on_the_standin, &[]);
}

#[test]
fn stream_ordered_allocations_in_a_capture_follow_the_graph_memory_rules() {
    standin::run(memory_allocated_in_the_capture_belongs_to_the_graph, &[]);
    standin::run(
        a_pool_buffer_dropped_during_its_streams_capture_waits_for_it,
        &[],
    );
}

/// The graph's own allocation is not held again by the typed launches captured with it: only the
/// buffers allocated before (`x`, `y`) are freed after the device's work, and everything is
/// freed in the end.
fn memory_allocated_in_the_capture_belongs_to_the_graph() {
    let p = standin::probe();
    let (live, syncs) = (p.count("live_allocations"), p.count("cuCtxSynchronize"));
    replay_a_graph_that_allocates_its_temporary(64 + Rng::new().index(500));
    assert_eq!(
        p.count("cuCtxSynchronize") - syncs,
        2,
        "x and y waited for the device; the graph's own allocation is not held"
    );
    assert_eq!(p.count("live_allocations"), live);
    assert_eq!(p.count("fault"), 0);
}

/// A pool buffer allocated before the capture and dropped while its stream is captured would be a
/// free node of memory that is not the graph's, which the driver refuses (invalidating the
/// capture): its free waits for the capture to end, used by the capture or not.
fn a_pool_buffer_dropped_during_its_streams_capture_waits_for_it() {
    let p = standin::probe();
    let registry = demo();
    let ctx = registry.ctx();
    let mut stream = CudaStream::new(ctx).unwrap();
    let live = p.count("live_allocations");
    let scale = SCALE.get(&registry).unwrap();
    let cfg = LaunchConfig::for_elements(32, 32);
    // SAFETY: used only on `stream`, which outlives both; freed outside the capture (by Atlas).
    let (unused, mut used) = unsafe {
        (
            DeviceBuffer::<f32>::alloc_async(ctx, &stream, 32).unwrap(),
            DeviceBuffer::<f32>::alloc_async(ctx, &stream, 32).unwrap(),
        )
    };
    let frees = p.count("cuMemFreeAsync");
    let capture = stream.begin_capture().unwrap();
    // SAFETY: captured, not run: scale touches the 32 floats of `used`, which the graph keeps.
    unsafe { scale.launch(&capture, &cfg, (&mut used, 1.0f32, 32u32)) }.unwrap();
    drop(unused);
    drop(used);
    assert_eq!(
        p.count("cuMemFreeAsync"),
        frees,
        "no free reached the capture"
    );
    assert!(capture.is_capturing().unwrap());
    let graph = capture.end().unwrap();
    assert_eq!(
        p.count("cuMemFreeAsync"),
        frees + 1,
        "`unused` freed as the capture ended"
    );
    assert_eq!(p.count("live_allocations"), live + 1);
    drop(graph);
    assert_eq!(
        p.count("live_allocations"),
        live,
        "`used` freed with the graph"
    );
}

#[test]
fn missing_stream_ordered_support_is_named() {
    standin::run(
        missing_pool_entry_points_are_named,
        &["-DSTANDIN_NO_MEMORY_POOL_API"],
    );
    standin::run(
        device_without_memory_pools_is_refused,
        &["-DSTANDIN_NO_MEMORY_POOLS"],
    );
}

fn priorities_are_read_once_and_checked() {
    let host = host(0).unwrap();
    let ctx = host.context();
    let probe = standin::probe();
    assert_eq!(ctx.stream_priorities().unwrap(), (0, -5));
    assert_eq!(ctx.stream_priorities().unwrap(), (0, -5));
    assert_eq!(probe.count("cuCtxGetStreamPriorityRange"), 1, "read once");

    let high = CudaStream::with_priority(ctx, -5).unwrap();
    assert!(high.is_owned());
    assert_eq!(high.priority().unwrap(), -5);
    assert_eq!(CudaStream::new(ctx).unwrap().priority().unwrap(), 0);
    assert_eq!(CudaStream::legacy_default(ctx).priority().unwrap(), 0);

    for priority in [1, -6, i32::MIN, i32::MAX] {
        match CudaStream::with_priority(ctx, priority) {
            Err(e @ AtlasError::StreamPriority { .. }) => {
                assert!(
                    matches!(e, AtlasError::StreamPriority { priority: p, device: 0, least: 0, greatest: -5 } if p == priority),
                    "{e:?}"
                );
                let text = e.to_string();
                assert!(
                    text.contains(&priority.to_string()) && text.contains("-5 (highest) to 0"),
                    "{text}"
                );
            }
            other => panic!("priority {priority}: {other:?}"),
        }
    }
    assert_eq!(
        probe.count("cuStreamCreateWithPriority"),
        1,
        "refused priorities never reach the driver"
    );
}

fn synchronize_is_refused_while_capturing() {
    let registry = demo();
    let ctx = registry.ctx();
    let mut stream = CudaStream::new(ctx).unwrap();
    let other = CudaStream::new(ctx).unwrap();
    let probe = standin::probe();
    assert!(!stream.is_capturing().unwrap());

    let capture = stream.begin_capture().unwrap();
    assert!(capture.is_capturing().unwrap());
    let syncs = probe.count("cuStreamSynchronize");
    assert_eq!(
        capture_misuse(capture.synchronize()),
        CaptureMisuse::SynchronizeWhileCapturing
    );
    assert_eq!(
        capture_misuse(registry.stream_synchronize(&capture)),
        CaptureMisuse::SynchronizeWhileCapturing
    );
    // The same stream seen through another wrapper, and from another thread.
    // SAFETY: `stream` is a live stream of `ctx` and outlives `view`.
    let view = unsafe { CudaStream::wrap(ctx, capture.raw()) }.unwrap();
    assert_eq!(
        capture_misuse(view.synchronize()),
        CaptureMisuse::SynchronizeWhileCapturing
    );
    std::thread::scope(|s| {
        s.spawn(|| {
            assert_eq!(
                capture_misuse(capture.synchronize()),
                CaptureMisuse::SynchronizeWhileCapturing
            );
        });
    });
    assert_eq!(
        probe.count("cuStreamSynchronize"),
        syncs,
        "nothing reached the driver"
    );
    let text = AtlasError::Capture(CaptureMisuse::SynchronizeWhileCapturing).to_string();
    assert!(text.contains("end the capture first"), "{text}");
    // Other streams synchronize as usual.
    other.synchronize().unwrap();
    registry.stream_synchronize(registry.stream()).unwrap();

    // The capture was never invalidated: it ends with a graph.
    let graph = capture.end().unwrap();
    assert!(!graph.raw().is_null());
    assert!(!stream.is_capturing().unwrap());
    stream.synchronize().unwrap();
}

fn blocking_calls_are_refused_while_this_thread_captures() {
    let registry = demo();
    let ctx = registry.ctx();
    let mut stream = CudaStream::new(ctx).unwrap();
    let other = CudaStream::new(ctx).unwrap();
    let probe = standin::probe();
    let mut before = DeviceBuffer::from_slice(ctx, &other, &[1.0f32; 8]).unwrap();

    let capture = stream.begin_capture().unwrap();
    let allocs = probe.count("cuMemAlloc_v2");
    let copies = probe.count("cuMemcpyHtoDAsync_v2") + probe.count("cuMemcpyDtoHAsync_v2");
    assert_eq!(
        capture_misuse(DeviceBuffer::<f32>::alloc(ctx, 16)),
        CaptureMisuse::AllocateWhileCapturing
    );
    assert_eq!(
        capture_misuse(DeviceBuffer::from_slice(ctx, &other, &[0.0f32; 4])),
        CaptureMisuse::AllocateWhileCapturing
    );
    // Copies that wait, on the capturing stream or (from this thread) on another one.
    for s in [&capture, &other] {
        assert_eq!(
            capture_misuse(before.copy_from(s, &[2.0; 8])),
            CaptureMisuse::WaitingCopyWhileCapturing
        );
        assert_eq!(
            capture_misuse(before.copy_to(s, &mut [0.0; 8])),
            CaptureMisuse::WaitingCopyWhileCapturing
        );
        assert_eq!(
            capture_misuse(before.to_vec(s)),
            CaptureMisuse::WaitingCopyWhileCapturing
        );
    }
    assert_eq!(probe.count("cuMemAlloc_v2"), allocs);
    assert_eq!(
        probe.count("cuMemcpyHtoDAsync_v2") + probe.count("cuMemcpyDtoHAsync_v2"),
        copies,
        "refused before anything was enqueued"
    );
    // Capture is thread-local: another thread allocates and copies as usual.
    std::thread::scope(|s| {
        s.spawn(|| {
            let b = DeviceBuffer::from_slice(ctx, &other, &[3.0f32; 5]).unwrap();
            assert_eq!(b.to_vec(&other).unwrap(), [3.0; 5]);
        });
    });
    // A stream-ordered allocation on the capturing stream is what to use instead.
    // SAFETY: `stream` outlives the buffer, nothing else uses it, and it is freed in this capture.
    let temp = unsafe { DeviceBuffer::<f32>::alloc_async(ctx, &capture, 32) }.unwrap();
    temp.free().unwrap();
    assert_eq!(probe.count("cuMemAllocAsync"), 1);
    assert_eq!(probe.count("cuMemFreeAsync"), 1);

    let _graph = capture.end().unwrap();
    // After the capture, everything works again.
    before.copy_from(&stream, &[4.0; 8]).unwrap();
    assert_eq!(before.to_vec(&stream).unwrap(), [4.0; 8]);
    let _after = DeviceBuffer::<f32>::alloc(ctx, 16).unwrap();
}

fn a_failed_end_keeps_the_record_while_the_capture_goes_on() {
    let registry = demo();
    let ctx = registry.ctx();
    let mut stream = CudaStream::new(ctx).unwrap();
    let probe = standin::probe();
    let capture = stream.begin_capture().unwrap();
    // The driver refuses the end and the capture goes on: the capture, consumed, ends it again
    // as it goes, and the stream is not capturing afterwards.
    probe.inject("cuStreamEndCapture", 999, 1);
    let ends = probe.count("cuStreamEndCapture");
    assert!(capture.end().is_err());
    assert_eq!(probe.count("cuStreamEndCapture") - ends, 2);
    assert!(!stream.is_capturing().unwrap());
    stream.synchronize().unwrap();
    let _ = DeviceBuffer::<f32>::alloc(ctx, 4).unwrap();

    // A stream dropped while a forgotten capture goes on takes its record with it.
    let mut doomed = CudaStream::new(ctx).unwrap();
    std::mem::forget(doomed.begin_capture().unwrap());
    assert_eq!(
        capture_misuse(DeviceBuffer::<f32>::alloc(ctx, 4)),
        CaptureMisuse::AllocateWhileCapturing
    );
    drop(doomed);
    let _ = DeviceBuffer::<f32>::alloc(ctx, 4).unwrap();
}

/// `cuMemFree` from a capturing thread would invalidate its capture (the stand-in, like the driver,
/// refuses it and marks the capture invalid): a buffer dropped or freed then is freed when the
/// thread's capture ends, or when the capturing stream is dropped (its capture ended in the driver
/// first, so that the frees are not refused). What is freed is counted, not only the calls.
fn a_buffer_dropped_while_capturing_is_freed_when_the_capture_ends() {
    let registry = demo();
    let ctx = registry.ctx();
    let mut stream = CudaStream::new(ctx).unwrap();
    let probe = standin::probe();
    let live = probe.count("live_allocations");
    let alloc = || DeviceBuffer::<f32>::alloc(ctx, 16).unwrap();
    let (dropped, freed, elsewhere) = (alloc(), alloc(), alloc());
    let frees = probe.count("cuMemFree_v2");

    let capture = stream.begin_capture().unwrap();
    drop(dropped);
    freed.free().unwrap();
    assert_eq!(
        probe.count("cuMemFree_v2"),
        frees,
        "no cuMemFree while capturing"
    );
    // Capture is thread-local: another thread's buffer is freed at once.
    std::thread::scope(|s| {
        s.spawn(move || drop(elsewhere));
    });
    assert_eq!(probe.count("cuMemFree_v2"), frees + 1);
    assert!(
        capture.is_capturing().unwrap(),
        "the capture is still valid"
    );
    let _graph = capture.end().unwrap();
    assert_eq!(
        probe.count("cuMemFree_v2"),
        frees + 3,
        "freed as the capture ended"
    );
    assert_eq!(
        probe.count("live_allocations"),
        live,
        "every free was accepted"
    );

    // A capture dropped unended: what its thread held is freed with it.
    let mut doomed = CudaStream::new(ctx).unwrap();
    let (held, also) = (alloc(), alloc());
    let capture = doomed.begin_capture().unwrap();
    drop(held);
    also.free().unwrap();
    assert_eq!(probe.count("cuMemFree_v2"), frees + 3);
    assert_eq!(probe.count("live_allocations"), live + 2);
    drop(capture);
    assert_eq!(probe.count("cuMemFree_v2"), frees + 5);
    assert_eq!(
        probe.count("live_allocations"),
        live,
        "the frees held for the dropped capture were refused"
    );
    assert_eq!(probe.count("live_graphs"), 1, "only `_graph` is left");
    // Nothing captures any more: a new allocation is not refused.
    let again = alloc();
    again.free().unwrap();
}

fn stream_ordered_buffer_frees_on_its_stream() {
    let registry = demo();
    let ctx = registry.ctx();
    let stream = CudaStream::new(ctx).unwrap();
    let probe = standin::probe();
    let mut rng = Rng::new();
    let live = probe.count("live_allocations");
    let n = 100 + rng.index(900);
    let input = rng.vec(n);
    let factor = rng.f32_in(0.5, 2.0);
    let scale = SCALE.get(&registry).unwrap();
    {
        // SAFETY: used only on `stream`, which outlives it; no capture.
        let mut x = unsafe { DeviceBuffer::<f32>::alloc_async(ctx, &stream, n) }.unwrap();
        assert!(x.is_stream_ordered());
        assert_eq!(probe.pointer_context(x.device_ptr()), ctx.raw());
        x.copy_from(&stream, &input).unwrap();
        // SAFETY: `x` holds the `n` floats `scale` touches and outlives the launch (`to_vec`
        // waits for it).
        unsafe {
            scale.launch(
                &stream,
                &LaunchConfig::for_elements(n as u32, 128),
                (&mut x, factor, n as u32),
            )
        }
        .unwrap();
        let want: Vec<f32> = input.iter().map(|v| v * factor).collect();
        assert_close(&x.to_vec(&stream).unwrap(), &want, 0.0, "scale");
        assert_eq!(probe.count("live_allocations"), live + 1);
    }
    assert_eq!(
        probe.count("cuMemFreeAsync"),
        1,
        "dropped: freed on its stream"
    );
    assert_eq!(probe.count("cuMemFree_v2"), 0);
    assert_eq!(probe.count("live_allocations"), live);

    // free() returns the outcome; an empty buffer reaches no driver call.
    // SAFETY: as above.
    let y = unsafe { DeviceBuffer::<u32>::alloc_async(ctx, &stream, 7) }.unwrap();
    y.free().unwrap();
    // SAFETY: as above.
    let empty = unsafe { DeviceBuffer::<u32>::alloc_async(ctx, &stream, 0) }.unwrap();
    assert!(empty.is_stream_ordered() && empty.is_empty());
    drop(empty);
    assert_eq!(probe.count("cuMemAllocAsync"), 2);
    assert_eq!(probe.count("cuMemFreeAsync"), 2);

    // A failed free is returned, not printed.
    // SAFETY: as above.
    let z = unsafe { DeviceBuffer::<u8>::alloc_async(ctx, &stream, 3) }.unwrap();
    probe.inject("cuMemFreeAsync", 2, 1);
    let err = z.free().unwrap_err();
    assert_eq!(err.cuda_code(), Some(2), "{err}");
    assert!(err.to_string().contains("cuMemFreeAsync"), "{err}");

    // Overflowing sizes are refused before the driver.
    // SAFETY: nothing is allocated.
    let huge = unsafe { DeviceBuffer::<u64>::alloc_async(ctx, &stream, usize::MAX / 4) };
    assert!(matches!(huge, Err(AtlasError::AllocationTooLarge { .. })));
}

fn stream_of_another_device_is_refused() {
    let h0 = host(0).unwrap();
    let h1 = host(1).unwrap();
    // SAFETY: refused before anything is allocated.
    let refused = unsafe { DeviceBuffer::<f32>::alloc_async(h0.context(), h1.stream(), 8) };
    match refused {
        Err(e @ AtlasError::WrongContext { .. }) => {
            assert!(
                matches!(
                    e,
                    AtlasError::WrongContext {
                        expected: Some(0),
                        given: Some(1),
                        ..
                    }
                ),
                "{e:?}"
            );
            assert!(e.to_string().contains("device 1"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(standin::probe().count("cuMemAllocAsync"), 0);
}

fn release_threshold_round_trips_on_the_standin() {
    let host = host(0).unwrap();
    assert_eq!(host.pool_release_threshold().unwrap(), 0);
    for bytes in [1u64 << 30, u64::MAX, 0] {
        host.set_pool_release_threshold(bytes).unwrap();
        assert_eq!(host.pool_release_threshold().unwrap(), bytes);
    }
}

fn missing_pool_entry_points_are_named() {
    let host = host(0).unwrap();
    let ctx = host.context();
    // SAFETY: refused before anything is allocated.
    let refused = unsafe { DeviceBuffer::<f32>::alloc_async(ctx, host.stream(), 8) };
    for err in [
        refused.unwrap_err(),
        host.set_pool_release_threshold(1).unwrap_err(),
        host.pool_release_threshold().unwrap_err(),
    ] {
        match &err {
            AtlasError::MissingSymbol(missing) => assert_eq!(missing.name, "cuMemAllocAsync"),
            other => panic!("{other:?}"),
        }
        assert!(err.to_string().contains("cuMemAllocAsync"), "{err}");
    }
    // Everything else still works.
    let b = DeviceBuffer::from_slice(ctx, host.stream(), &[1u32, 2, 3]).unwrap();
    assert_eq!(b.to_vec(host.stream()).unwrap(), [1, 2, 3]);
}

fn device_without_memory_pools_is_refused() {
    let host = host(0).unwrap();
    let ctx = host.context();
    assert!(!ctx.memory_pools_supported().unwrap());
    // SAFETY: refused before anything is allocated.
    let refused = unsafe { DeviceBuffer::<f32>::alloc_async(ctx, host.stream(), 8) };
    for err in [
        refused.unwrap_err(),
        host.set_pool_release_threshold(1).unwrap_err(),
    ] {
        assert!(
            matches!(err, AtlasError::MemoryPoolsUnsupported { device: 0 }),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .contains("CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED"),
            "{err}"
        );
    }
    assert_eq!(standin::probe().count("cuMemAllocAsync"), 0);
}

// ---------------------------------------------------------------------------------------------
// On a GPU
// ---------------------------------------------------------------------------------------------

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn stream_memory_gpu_high_priority_stream_computes_correctly() {
    let registry = demo();
    let ctx = registry.ctx();
    let (least, greatest) = ctx.stream_priorities().unwrap();
    assert!(greatest < least, "range ({least}, {greatest})");
    let high = CudaStream::with_priority(ctx, greatest).unwrap();
    assert_eq!(high.priority().unwrap(), greatest);
    let low = CudaStream::with_priority(ctx, least).unwrap();
    assert_eq!(low.priority().unwrap(), least);
    assert!(matches!(
        CudaStream::with_priority(ctx, greatest - 1),
        Err(AtlasError::StreamPriority { .. })
    ));

    let mut rng = Rng::new();
    let n = 100_000 + rng.index(100_000);
    let input = rng.vec(n);
    let factor = rng.f32_in(0.5, 2.0);
    let mut x = DeviceBuffer::from_slice(ctx, &high, &input).unwrap();
    let scale = SCALE.get(&registry).unwrap();
    // SAFETY: `x` holds the `n` floats `scale` touches and outlives the launch (`to_vec` waits).
    unsafe {
        scale.launch(
            &high,
            &LaunchConfig::for_elements(n as u32, 256),
            (&mut x, factor, n as u32),
        )
    }
    .unwrap();
    let want: Vec<f32> = input.iter().map(|v| v * factor).collect();
    assert_close(
        &x.to_vec(&high).unwrap(),
        &want,
        0.0,
        "scale on a high-priority stream",
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn stream_memory_gpu_alloc_kernel_free_matches_cpu() {
    let registry = demo();
    let ctx = registry.ctx();
    assert!(ctx.memory_pools_supported().unwrap());
    let stream = CudaStream::new(ctx).unwrap();
    let (scale, axpy) = (SCALE.get(&registry).unwrap(), AXPY.get(&registry).unwrap());
    let mut rng = Rng::new();
    for round in 0..4 {
        let n = 10_000 + rng.index(200_000);
        let (x, y0) = (rng.vec(n), rng.vec(n));
        let (factor, a) = (rng.f32_in(0.5, 2.0), rng.f32_in(-2.0, 2.0));
        let mut y = DeviceBuffer::from_slice(ctx, &stream, &y0).unwrap();
        let cfg = LaunchConfig::for_elements(n as u32, 256);
        // SAFETY: used only on `stream`, which outlives it; no capture.
        let mut temp = unsafe { DeviceBuffer::<f32>::alloc_async(ctx, &stream, n) }.unwrap();
        // SAFETY: `x` lives until `y.to_vec` below has synchronized the stream.
        unsafe { temp.copy_from_async(&stream, &x) }.unwrap();
        // SAFETY: `temp` and `y` hold the `n` floats the kernels touch; `temp` is freed on the
        // same stream after them, `y` outlives them (`to_vec` waits).
        unsafe {
            scale
                .launch(&stream, &cfg, (&mut temp, factor, n as u32))
                .unwrap();
            axpy.launch(&stream, &cfg, (&temp, &mut y, a, n as u32))
                .unwrap();
        }
        temp.free().unwrap();
        let want: Vec<f32> = x
            .iter()
            .zip(&y0)
            .map(|(x, y)| a.mul_add(x * factor, *y))
            .collect();
        assert_close(
            &y.to_vec(&stream).unwrap(),
            &want,
            1e-5,
            &format!("round {round}"),
        );
    }
}

/// `(memory allocation nodes, memory free nodes)` of a graph, asked of the driver directly.
fn memory_nodes(graph: CUgraph) -> (usize, usize) {
    let kinds = node_types(graph);
    let count = |kind| kinds.iter().filter(|&&k| k == kind).count();
    (
        count(CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC),
        count(CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_FREE),
    )
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn stream_memory_gpu_alloc_inside_a_replayed_graph() {
    replay_a_graph_that_allocates_its_temporary(50_000 + Rng::new().index(100_000));
}

/// A graph that allocates and frees its own temporary (`alloc_async` and the drop in the capture:
/// an allocation node and a free node) between `transform` and `axpy`, replayed against the CPU.
/// The buffers it keeps (`x`, `y`) are dropped at the end, after the graph.
fn replay_a_graph_that_allocates_its_temporary(n: usize) {
    let demo = demo();
    let model_a = AtlasRegistry::load(0, ptx_for_model("model_a").unwrap()).unwrap();
    let ctx = demo.ctx();
    let mut stream = CudaStream::new(ctx).unwrap();
    let (transform, axpy) = (TRANSFORM.get(&model_a).unwrap(), AXPY.get(&demo).unwrap());
    let mut rng = Rng::new();
    let (x_host, y0) = (rng.vec(n), rng.vec(n));
    let a = rng.f32_in(0.25, 1.0);
    let x = DeviceBuffer::from_slice(ctx, &stream, &x_host).unwrap();
    let mut y = DeviceBuffer::from_slice(ctx, &stream, &y0).unwrap();
    let cfg = LaunchConfig::for_elements(n as u32, 256);

    let capture = stream.begin_capture().unwrap();
    // SAFETY: allocated and freed in this capture, on `stream`, which outlives the graph; used
    // only by the two kernels captured on `stream` between.
    let mut temp = unsafe { DeviceBuffer::<f32>::alloc_async(ctx, &capture, n) }.unwrap();
    // SAFETY: captured, not run: at each replay `x`, `temp` and `y` hold the `n` floats the
    // kernels touch (`temp` allocated by the graph itself, not held again; `x` and `y` kept by
    // the graph).
    unsafe {
        transform
            .launch(&capture, &cfg, (&x, &mut temp, n as u32))
            .unwrap();
        axpy.launch(&capture, &cfg, (&temp, &mut y, a, n as u32))
            .unwrap();
    }
    drop(temp);
    assert!(
        capture.is_capturing().unwrap(),
        "the free is the graph's free node"
    );
    let graph = capture.end().unwrap();
    assert_eq!(
        memory_nodes(graph.raw()),
        (1, 1),
        "allocation and free are graph nodes"
    );
    let exec = graph.instantiate().unwrap();
    assert_eq!(exec.kernel_count(), 2);
    assert_close(&y.to_vec(&stream).unwrap(), &y0, 0.0, "captured, not run");

    let mut want = y0.clone();
    for replay in 0..5 {
        // SAFETY: the graph keeps `x`, `y` and both modules, and allocates `temp` itself.
        unsafe { exec.launch(&stream) }.unwrap();
        for (w, x) in want.iter_mut().zip(&x_host) {
            *w = a.mul_add(transform_reference("model_a", *x), *w);
        }
        assert_close(
            &y.to_vec(&stream).unwrap(),
            &want,
            1e-5,
            &format!("replay {replay}"),
        );
    }
    drop(exec);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn stream_memory_gpu_release_threshold_round_trips() {
    let host = host(0).unwrap();
    let original = host.pool_release_threshold().unwrap();
    for bytes in [64u64 << 20, u64::MAX, 0] {
        host.set_pool_release_threshold(bytes).unwrap();
        assert_eq!(host.pool_release_threshold().unwrap(), bytes);
    }
    host.set_pool_release_threshold(original).unwrap();
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn stream_memory_gpu_a_buffer_dropped_during_capture_keeps_the_capture() {
    let registry = demo();
    let ctx = registry.ctx();
    let mut stream = CudaStream::new(ctx).unwrap();
    let scale = SCALE.get(&registry).unwrap();
    let mut rng = Rng::new();
    let n = 10_000 + rng.index(50_000);
    let input = rng.vec(n);
    let factor = rng.f32_in(0.5, 1.5);
    let mut x = DeviceBuffer::from_slice(ctx, &stream, &input).unwrap();
    let temporary = DeviceBuffer::<f32>::alloc(ctx, n).unwrap();
    let freed = DeviceBuffer::<f32>::alloc(ctx, n).unwrap();
    let cfg = LaunchConfig::for_elements(n as u32, 256);

    let capture = stream.begin_capture().unwrap();
    // SAFETY: captured, not run: at each replay `x` holds the `n` floats; it outlives `exec`.
    unsafe { scale.launch(&capture, &cfg, (&mut x, factor, n as u32)) }.unwrap();
    drop(temporary);
    freed.free().unwrap();
    assert!(
        capture.is_capturing().unwrap(),
        "the capture is still valid"
    );
    let exec = capture.end().unwrap().instantiate().unwrap();
    // SAFETY: `x`, the only memory the graph uses, is alive.
    unsafe { exec.launch(&stream) }.unwrap();
    let want: Vec<f32> = input.iter().map(|v| v * factor).collect();
    assert_close(&x.to_vec(&stream).unwrap(), &want, 1e-6, "replay");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn stream_memory_gpu_synchronize_refused_during_capture_graph_replays() {
    let registry = demo();
    let ctx = registry.ctx();
    let mut stream = CudaStream::new(ctx).unwrap();
    let scale = SCALE.get(&registry).unwrap();
    let mut rng = Rng::new();
    let n = 20_000 + rng.index(50_000);
    let input = rng.vec(n);
    let factor = rng.f32_in(0.5, 1.5);
    let mut x = DeviceBuffer::from_slice(ctx, &stream, &input).unwrap();
    let cfg = LaunchConfig::for_elements(n as u32, 256);

    let capture = stream.begin_capture().unwrap();
    // SAFETY: captured, not run: at each replay `x` holds the `n` floats; it outlives `exec`.
    unsafe { scale.launch(&capture, &cfg, (&mut x, factor, n as u32)) }.unwrap();
    assert_eq!(
        capture_misuse(capture.synchronize()),
        CaptureMisuse::SynchronizeWhileCapturing
    );
    assert_eq!(
        capture_misuse(registry.stream_synchronize(&capture)),
        CaptureMisuse::SynchronizeWhileCapturing
    );
    assert_eq!(
        capture_misuse(DeviceBuffer::<f32>::alloc(ctx, 16)),
        CaptureMisuse::AllocateWhileCapturing
    );
    assert_eq!(
        capture_misuse(x.to_vec(&capture)),
        CaptureMisuse::WaitingCopyWhileCapturing
    );
    assert!(
        capture.is_capturing().unwrap(),
        "the capture is still active"
    );
    // SAFETY: as above.
    unsafe { scale.launch(&capture, &cfg, (&mut x, factor, n as u32)) }.unwrap();
    let exec = capture.end().unwrap().instantiate().unwrap();
    assert_eq!(exec.kernel_count(), 2);
    stream.synchronize().unwrap();

    let mut want = input.clone();
    for replay in 0..3 {
        // SAFETY: `x`, the only memory the graph uses, is alive.
        unsafe { exec.launch(&stream) }.unwrap();
        want.iter_mut().for_each(|v| *v = *v * factor * factor);
        assert_close(
            &x.to_vec(&stream).unwrap(),
            &want,
            1e-5,
            &format!("replay {replay}"),
        );
    }
}
