//! A graph owns what it launches: the registries of its kernels (captured launches, conditional
//! bodies, updates, argument updates) and the memory of the `DeviceBuffer` arguments of its typed
//! launches, so instantiating, replaying, updating and uploading it stay safe and correct after
//! the registry, the function handles and the buffers are gone; stream-ordered allocations made in
//! a capture follow the driver's rules for graph memory nodes (`stream_memory.rs`); and the eager
//! launch path is what it was: one driver call, no allocation.
//!
//! Stand-in (CI): `cargo test -p atlas-registry --test graph_ownership`. The stand-in models what
//! the driver does with a graph whose kernels' module is unloaded (it follows the function: the
//! real driver crashes, the stand-in counts a "stale_handle") and with freed memory (a kernel that
//! reads it faults). GPU: `-- --include-ignored`.

mod support;

use atlas_kernels::ptx_for_model;
use atlas_registry::sys::CUresult;
use atlas_registry::{
    AtlasError, AtlasRegistry, CudaStream, DeviceBuffer, GraphUpdate, LaunchConfig, release,
};
use support::allocations::{Counting, allocations};
use support::child;
use support::graphs::{assert_wrong_context, capture_counted_loop, replay_noop_after_release};
use support::reference::assert_close;
use support::rng::Rng;
use support::standin::{self, probe};

child::bodies!(
    release_while_a_graph_lives_unloads_nothing_until_it_goes,
    buffers_dropped_during_and_after_the_capture_stay_for_the_graph,
    updates_and_argument_updates_keep_what_they_launch,
    a_while_body_keeps_its_registry,
    a_raw_launch_keeps_the_registry_it_went_through,
    eager_launches_make_one_driver_call_and_allocate_nothing,
    a_graph_of_one_device_refuses_the_others_streams_and_functions,
    a_capture_begun_outside_atlas_is_not_ended_by_it,
);

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn demo() -> AtlasRegistry {
    AtlasRegistry::load(0, ptx_for_model("demo").unwrap()).unwrap()
}

/// `y = a * x + y` on the CPU, with `fmaf` as `axpy` computes it.
fn axpy_reference(a: f32, x: &[f32], y: &[f32]) -> Vec<f32> {
    x.iter().zip(y).map(|(x, y)| a.mul_add(*x, *y)).collect()
}

// ---------------------------------------------------------------------------------------------
// Stand-in (CI)
// ---------------------------------------------------------------------------------------------

#[test]
fn a_graph_keeps_its_module_loaded_after_release() {
    standin::run(
        release_while_a_graph_lives_unloads_nothing_until_it_goes,
        &[],
    );
}

/// Capture one launch of `noop`, end the capture, drop the function and release the registry:
/// the graph keeps the module loaded, so instantiating and replaying it run the kernel, and the
/// module is unloaded when the last graph goes.
fn release_while_a_graph_lives_unloads_nothing_until_it_goes() {
    let p = probe();
    let registry = demo();
    let modules = p.count("live_modules");
    let launches = p.count("cuGraphLaunch");
    let (_stream, exec) = replay_noop_after_release(registry);
    assert_eq!(p.count("live_modules"), modules, "nothing was unloaded");
    assert_eq!(p.count("cuGraphLaunch"), launches + 3);
    assert_eq!(
        p.count("stale_handle"),
        0,
        "the driver followed an unloaded function"
    );
    drop(exec);
    assert_eq!(
        p.count("live_modules"),
        modules - 4,
        "the last graph unloaded the demo model's four modules"
    );
    assert_eq!((p.count("live_graphs"), p.count("live_execs")), (0, 0));
}

#[test]
fn a_graph_keeps_the_memory_of_its_buffer_arguments() {
    standin::run(
        buffers_dropped_during_and_after_the_capture_stay_for_the_graph,
        &[],
    );
}

/// `y = a * x + y` captured with `x` and `y` dropped, one during the capture and one after it,
/// with their registry released: every replay still computes what the CPU does (a replay reading
/// freed memory faults on the stand-in), and the memory is freed, after a context synchronize,
/// only when the last graph goes.
fn buffers_dropped_during_and_after_the_capture_stay_for_the_graph() {
    let p = probe();
    let mut rng = Rng::new();
    let registry = demo();
    let mut stream = CudaStream::new(registry.ctx()).unwrap();
    let live = p.count("live_allocations");
    let n = 100 + rng.index(2000);
    let (x_host, y0) = (rng.vec(n), rng.vec(n));
    let a = rng.f32_in(0.5, 1.5);
    let x = DeviceBuffer::from_slice(registry.ctx(), &stream, &x_host).unwrap();
    let mut y = DeviceBuffer::from_slice(registry.ctx(), &stream, &y0).unwrap();
    let y_ptr = y.device_ptr();
    let axpy = registry.function_cached("elementwise", "axpy").unwrap();
    let cfg = LaunchConfig::for_elements(n as u32, 256);
    let capture = stream.begin_capture().unwrap();
    // SAFETY: captured, not run: at each replay axpy touches the `n` floats of `x` and `y`, which
    // the graph keeps allocated (they are its typed launch's buffer arguments).
    unsafe { axpy.launch(&capture, &cfg, (&x, &mut y, a, n as u32)) }.unwrap();
    drop(x);
    assert!(
        capture.is_capturing().unwrap(),
        "the capture is still valid"
    );
    let graph = capture.end().unwrap();
    drop((axpy, registry));
    let frees = p.count("cuMemFree_v2");
    let exec = graph.instantiate().unwrap();
    // Watch `y` through a raw copy of its address: the buffer itself goes now.
    drop(y);
    assert_eq!(
        p.count("cuMemFree_v2"),
        frees,
        "freed while the graph lives"
    );
    assert_eq!(p.count("live_allocations"), live + 2);
    let mut want = y0.clone();
    for replay in 0..3 {
        // SAFETY: the graph keeps both buffers and the module; nothing else is reached.
        unsafe { exec.launch(&stream) }.unwrap();
        want = axpy_reference(a, &x_host, &want);
        let mut got = vec![f32::NAN; n];
        // SAFETY: `y_ptr` is the `n` floats the graph keeps allocated, `got` has room for them, and
        // the stream is synchronized before `got` is read.
        unsafe {
            atlas_registry::copy_to_host_async(&stream, got.as_mut_ptr().cast(), y_ptr, n * 4)
        }
        .unwrap();
        stream.synchronize().unwrap();
        assert_close(&got, &want, 1e-5, &format!("replay {replay}"));
    }
    assert_eq!(p.count("fault"), 0);
    let syncs = p.count("cuCtxSynchronize");
    drop(exec);
    assert_eq!(
        p.count("cuCtxSynchronize"),
        syncs + 2,
        "each free waited for the device"
    );
    assert_eq!(p.count("cuMemFree_v2"), frees + 2);
    assert_eq!(
        p.count("live_allocations"),
        live,
        "the last graph freed both"
    );
}

#[test]
fn updated_graphs_keep_what_they_launch() {
    standin::run(updates_and_argument_updates_keep_what_they_launch, &[]);
}

/// An in-place update from a capture whose buffer and registry are then dropped, and an argument
/// update with a buffer that is then dropped: later replays compute what the CPU does, and what
/// only a replaced capture or argument used is freed when it is replaced.
fn updates_and_argument_updates_keep_what_they_launch() {
    let p = probe();
    let mut rng = Rng::new();
    let first = demo();
    let stream = CudaStream::new(first.ctx()).unwrap();
    let mut capture_stream = CudaStream::new(first.ctx()).unwrap();
    let ctx = first.ctx();
    let live = p.count("live_allocations");
    let n = 64 + rng.index(500);
    let cfg = LaunchConfig::for_elements(n as u32, 256);
    let mut capture = |registry: &AtlasRegistry, x: &mut DeviceBuffer<f32>, factor: f32| {
        let scale = registry.function("elementwise", "scale").unwrap();
        let capture = capture_stream.begin_capture().unwrap();
        // SAFETY: captured, not run: at each replay scale touches the `n` floats of `x`, which
        // the graph keeps allocated.
        unsafe { scale.launch(&capture, &cfg, (&mut *x, factor, n as u32)) }.unwrap();
        capture.end().unwrap()
    };
    let read = |ptr| {
        let mut got = vec![f32::NAN; n];
        // SAFETY: `ptr` holds `n` floats a graph keeps allocated; synchronized before the read.
        unsafe { atlas_registry::copy_to_host_async(&stream, got.as_mut_ptr().cast(), ptr, n * 4) }
            .unwrap();
        stream.synchronize().unwrap();
        got
    };

    let mut a = DeviceBuffer::from_slice(ctx, &stream, &rng.vec(n)).unwrap();
    let mut exec = capture(&first, &mut a, 2.0).instantiate().unwrap();

    // A second registry and buffer, captured, and gone before the update is replayed.
    let second = demo();
    let b_host = rng.vec(n);
    let mut b = DeviceBuffer::from_slice(ctx, &stream, &b_host).unwrap();
    let b_ptr = b.device_ptr();
    let factor = rng.f32_in(0.5, 1.5);
    let graph = capture(&second, &mut b, factor);
    drop(b);
    assert!(matches!(
        release(second).unwrap_err(),
        AtlasError::InUse { .. }
    ));
    // SAFETY: the new graph's kernel touches the `n` floats of `b`, which it keeps.
    assert_eq!(unsafe { exec.update(graph) }.unwrap(), GraphUpdate::Updated);
    let mut want = b_host.clone();
    for _ in 0..2 {
        // SAFETY: the graph keeps what it reaches.
        unsafe { exec.launch(&stream) }.unwrap();
        want.iter_mut().for_each(|v| *v *= factor);
        assert_close(&read(b_ptr), &want, 1e-5, "after the update");
    }

    // An argument update with a buffer dropped before the replays.
    let c_host = rng.vec(n);
    let mut c = DeviceBuffer::from_slice(ctx, &stream, &c_host).unwrap();
    let c_ptr = c.device_ptr();
    let scale = first.function_cached("elementwise", "scale").unwrap();
    let by = rng.f32_in(0.5, 1.5);
    // SAFETY: the node touches the `n` floats of `c`, which the executable graph keeps.
    unsafe { exec.set_kernel_args(0, &scale, &cfg, (&mut c, by, n as u32)) }.unwrap();
    drop(c);
    let mut want_c = c_host.clone();
    // SAFETY: as above.
    unsafe { exec.launch(&stream) }.unwrap();
    want_c.iter_mut().for_each(|v| *v *= by);
    assert_close(&read(c_ptr), &want_c, 1e-5, "after the argument update");
    assert_eq!(p.count("fault"), 0);

    // Replacing the node's arguments releases `c`; replacing the update releases `b`.
    let in_use = p.count("live_allocations");
    // SAFETY: the node touches the `n` floats of `a`, alive and kept.
    unsafe { exec.set_kernel_args(0, &scale, &cfg, (&mut a, 1.0f32, n as u32)) }.unwrap();
    assert_eq!(p.count("live_allocations"), in_use - 1, "`c` freed");
    let graph = capture(&first, &mut a, 1.0);
    // SAFETY: as above.
    assert_eq!(unsafe { exec.update(graph) }.unwrap(), GraphUpdate::Updated);
    assert_eq!(p.count("live_allocations"), in_use - 2, "`b` freed");
    drop((exec, a));
    assert_eq!(p.count("live_allocations"), live);
    assert_eq!(p.count("stale_handle"), 0);
}

#[test]
fn a_conditional_body_keeps_its_module_loaded() {
    standin::run(a_while_body_keeps_its_registry, &[]);
}

/// A WHILE node whose body launches `loop_step` of a registry that is released, with its buffers
/// dropped: the loop runs as many iterations as the kernel decides, at every replay.
fn a_while_body_keeps_its_registry() {
    let p = probe();
    let mut rng = Rng::new();
    let registry = AtlasRegistry::load(0, ptx_for_model("conditional").unwrap()).unwrap();
    let modules = p.count("live_modules");
    let mut stream = CudaStream::new(registry.ctx()).unwrap();
    let n = 50 + rng.index(200);
    let input = rng.vec(n);
    let mut x = DeviceBuffer::from_slice(registry.ctx(), &stream, &input).unwrap();
    let mut counter = DeviceBuffer::from_slice(registry.ctx(), &stream, &[-3i32]).unwrap();
    let (x_ptr, counter_ptr) = (x.device_ptr(), counter.device_ptr());
    let limit = 1 + rng.index(9) as i32;
    let graph = capture_counted_loop(&registry, &mut stream, &mut x, &mut counter, limit);
    let exec = graph.instantiate().unwrap();
    drop((x, counter));
    assert!(matches!(
        release(registry).unwrap_err(),
        AtlasError::InUse { handles: 1, .. }
    ));
    let mut want = input;
    for replay in 0..2 {
        // SAFETY: the graph keeps what its body reaches.
        unsafe { exec.launch(&stream) }.unwrap();
        want.iter_mut()
            .for_each(|v| (0..limit).for_each(|_| *v = *v * 0.5 + 1.0));
        let mut got = vec![f32::NAN; n];
        let mut count = [i32::MIN];
        // SAFETY: both addresses are memory the graph keeps, of the sizes read; synchronized
        // before the reads.
        unsafe {
            atlas_registry::copy_to_host_async(&stream, got.as_mut_ptr().cast(), x_ptr, n * 4)
                .unwrap();
            atlas_registry::copy_to_host_async(&stream, count.as_mut_ptr().cast(), counter_ptr, 4)
                .unwrap();
        }
        stream.synchronize().unwrap();
        assert_close(&got, &want, 1e-5, &format!("replay {replay}"));
        assert_eq!(count, [limit], "replay {replay}: iterations");
    }
    assert_eq!(p.count("stale_handle") + p.count("fault"), 0);
    drop(exec);
    assert_eq!(
        p.count("live_modules"),
        modules - 1,
        "unloaded with the graph"
    );
}

#[test]
fn a_captured_raw_launch_keeps_its_registry() {
    standin::run(a_raw_launch_keeps_the_registry_it_went_through, &[]);
}

fn a_raw_launch_keeps_the_registry_it_went_through() {
    let p = probe();
    let registry = demo();
    let mut stream = CudaStream::new(registry.ctx()).unwrap();
    let noop = registry.raw_function_cached("noop", "noop").unwrap();
    let capture = stream.begin_capture().unwrap();
    // SAFETY: captured, not run: noop takes no arguments; the stream is of the registry's
    // context.
    unsafe {
        registry.launch_on_stream(
            noop,
            &LaunchConfig::for_elements(1, 1),
            capture.raw(),
            &mut [],
        )
    }
    .unwrap();
    let exec = capture.end().unwrap().instantiate().unwrap();
    assert!(matches!(
        release(registry).unwrap_err(),
        AtlasError::InUse { handles: 1, .. }
    ));
    // SAFETY: noop touches no memory; the graph keeps its module.
    unsafe { exec.launch(&stream) }.unwrap();
    assert_eq!(p.count("stale_handle"), 0);
}

#[test]
fn an_eager_launch_is_one_driver_call_and_no_allocation() {
    standin::run(
        eager_launches_make_one_driver_call_and_allocate_nothing,
        &[],
    );
}

/// Outside a capture, a typed or raw launch on a created stream makes one driver call, of any
/// entry point, and allocates nothing; the same holds while another thread captures another
/// stream with nothing shared, for the allocations.
fn eager_launches_make_one_driver_call_and_allocate_nothing() {
    let p = probe();
    let registry = demo();
    let stream = CudaStream::new(registry.ctx()).unwrap();
    let mut x = DeviceBuffer::from_slice(registry.ctx(), &stream, &[1.0f32; 64]).unwrap();
    let scale = registry.function_cached("elementwise", "scale").unwrap();
    let raw = registry
        .raw_function_cached("elementwise", "scale")
        .unwrap();
    let cfg = LaunchConfig::for_elements(64, 64);
    let (mut factor, mut count, mut ptr) = (1.0f32, 64u32, x.device_ptr());
    let mut launch_both = |x: &mut DeviceBuffer<f32>| {
        // SAFETY: `scale` touches the 64 floats of `x`, which outlives the launches (synchronized
        // below); the raw launch's parameters are `x`'s address, a float and a count, as scale's.
        unsafe {
            scale
                .launch(&stream, &cfg, (&mut *x, 1.0f32, 64u32))
                .unwrap();
            let mut params = [
                (&raw mut ptr).cast(),
                (&raw mut factor).cast(),
                (&raw mut count).cast(),
            ];
            registry
                .launch_on_stream(raw, &cfg, stream.raw(), &mut params)
                .unwrap();
        }
    };
    launch_both(&mut x); // reads the layout once
    let (calls, launches, allocated) = (p.count("calls"), p.launches(), allocations());
    for _ in 0..50 {
        launch_both(&mut x);
    }
    assert_eq!(allocations(), allocated, "a launch allocated");
    assert_eq!(p.launches() - launches, 100);
    assert_eq!(
        p.count("calls") - calls,
        100,
        "only cuLaunchKernel reached the driver"
    );
    stream.synchronize().unwrap();
    assert_eq!(x.to_vec(&stream).unwrap(), vec![1.0f32; 64]);
}

#[test]
fn two_devices_graphs_refuse_the_other_devices_streams_and_functions() {
    standin::run(
        a_graph_of_one_device_refuses_the_others_streams_and_functions,
        &["-DSTANDIN_DEVICES=2"],
    );
}

fn a_graph_of_one_device_refuses_the_others_streams_and_functions() {
    let p = probe();
    let blobs = ptx_for_model("demo").unwrap();
    let (r0, r1) = (
        AtlasRegistry::load(0, blobs).unwrap(),
        AtlasRegistry::load(1, blobs).unwrap(),
    );
    let (mut s0, mut s1) = (
        CudaStream::new(r0.ctx()).unwrap(),
        CudaStream::new(r1.ctx()).unwrap(),
    );
    let n = 256usize;
    let mut x0 = DeviceBuffer::from_slice(r0.ctx(), &s0, &[1.0f32; 256]).unwrap();
    let mut x1 = DeviceBuffer::from_slice(r1.ctx(), &s1, &[1.0f32; 256]).unwrap();
    let cfg = LaunchConfig::for_elements(n as u32, 256);
    let capture = |registry: &AtlasRegistry, stream: &mut CudaStream, x: &mut DeviceBuffer<f32>| {
        let scale = registry.function_cached("elementwise", "scale").unwrap();
        let capture = stream.begin_capture().unwrap();
        // SAFETY: captured, not run: scale touches the `n` floats of `x`, kept by the graph.
        unsafe { scale.launch(&capture, &cfg, (&mut *x, 2.0f32, n as u32)) }.unwrap();
        capture.end().unwrap()
    };
    let mut exec = capture(&r0, &mut s0, &mut x0).instantiate().unwrap();
    let foreign = capture(&r1, &mut s1, &mut x1);
    let wrong = |e, what| assert_wrong_context(e, what, 0, 1);
    let launches = p.count("cuGraphLaunch");
    // SAFETY: refused before the driver is called.
    wrong(unsafe { exec.launch(&s1) }.unwrap_err(), "the stream");
    wrong(exec.upload(&s1).unwrap_err(), "the stream");
    // SAFETY: refused before the driver is called.
    wrong(
        unsafe { exec.update(foreign) }.unwrap_err(),
        "the new graph",
    );
    let scale1 = r1.function_cached("elementwise", "scale").unwrap();
    // SAFETY: refused before the driver is called (the function is device 1's).
    let e =
        unsafe { exec.set_kernel_args(0, &scale1, &cfg, (&mut x0, 1.0f32, n as u32)) }.unwrap_err();
    assert!(
        matches!(
            e,
            AtlasError::WrongDevice {
                expected: 1,
                given: Some(0),
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(
        p.count("cuGraphLaunch"),
        launches,
        "the driver saw a replay"
    );
    assert_eq!(p.count("context_mismatch"), 0);
    // The executable graph still replays on its own device.
    // SAFETY: the graph keeps the memory it reaches.
    unsafe { exec.launch(&s0) }.unwrap();
    assert_eq!(x0.to_vec(&s0).unwrap(), vec![2.0f32; 256]);
    assert_eq!(
        x1.to_vec(&s1).unwrap(),
        vec![1.0f32; 256],
        "device 1 untouched"
    );
}

#[test]
fn a_capture_begun_outside_atlas_is_left_to_its_owner() {
    standin::run(a_capture_begun_outside_atlas_is_not_ended_by_it, &[]);
}

/// `begin_capture` on a stream the caller is capturing with the driver's own call fails with the
/// driver's error, and neither the failure nor Atlas's record touches that capture.
fn a_capture_begun_outside_atlas_is_not_ended_by_it() {
    let registry = demo();
    let mut stream = CudaStream::new(registry.ctx()).unwrap();
    let cuda = atlas_registry::sys::driver().unwrap();
    let begin = atlas_registry::sys::entry!(cuda, cuStreamBeginCapture_v2).unwrap();
    let end = atlas_registry::sys::entry!(cuda, cuStreamEndCapture).unwrap();
    let destroy = atlas_registry::sys::entry!(cuda, cuGraphDestroy).unwrap();
    let mode = atlas_registry::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    // SAFETY: a live stream of the current context (Atlas left it current).
    assert_eq!(unsafe { begin(stream.raw(), mode) }, CUresult::CUDA_SUCCESS);
    let e = stream.begin_capture().unwrap_err();
    assert!(e.to_string().contains("cuStreamBeginCapture"), "{e}");
    assert!(
        stream.is_capturing().unwrap(),
        "the caller's capture goes on"
    );
    let mut graph = std::ptr::null_mut();
    // SAFETY: the capture begun above, on this thread; the graph is destroyed once.
    unsafe {
        assert_eq!(end(stream.raw(), &mut graph), CUresult::CUDA_SUCCESS);
        assert_eq!(destroy(graph), CUresult::CUDA_SUCCESS);
    }
    // And the stream captures through Atlas again.
    drop(stream.begin_capture().unwrap().end().unwrap());
}
