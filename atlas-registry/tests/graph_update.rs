//! Whole-graph update of an instantiated graph (in place, or instantiated again when the topology
//! changed), upload, and conditional WHILE / IF nodes decided on the device; on a GPU, against CPU
//! references on fresh random data. The error paths that need no GPU run against the stand-in.

mod support;

use atlas_kernels::{blobs_for_device, cubin_for_model, ptx_for_model};
use atlas_registry::{
    AtlasError, AtlasRegistry, CaptureMisuse, CudaStream, DeviceBuffer, GraphFeature, GraphUpdate,
    LaunchConfig, UpdateRefusal,
};
use support::graphs::{assert_wrong_context, capture_counted_loop};
use support::reference::assert_close;
use support::rng::Rng;
use support::{child, standin};

fn demo() -> AtlasRegistry {
    AtlasRegistry::load(0, ptx_for_model("demo").unwrap()).unwrap()
}

/// The blobs of the conditional model to test: its PTX (JIT-compiled by the driver, which resolves
/// `cudaGraphSetConditional`) and, when this build has it, its sm_90 cubin on an sm_90 device.
fn conditional_registries() -> Vec<(&'static str, AtlasRegistry)> {
    let mut out = vec![(
        "PTX",
        AtlasRegistry::load(0, ptx_for_model("conditional").unwrap()).unwrap(),
    )];
    let cc = atlas_registry::host(0).unwrap().compute_capability();
    if let Some(cubin) = cubin_for_model("conditional", 90).filter(|_| cc == (9, 0)) {
        out.push(("sm_90 cubin", AtlasRegistry::load(0, cubin).unwrap()));
    }
    assert!(blobs_for_device("conditional", cc).is_some());
    out
}

/// Captures one `scale` launch per factor on `x`, in order.
fn capture_scales(
    registry: &AtlasRegistry,
    stream: &mut CudaStream,
    x: &mut DeviceBuffer<f32>,
    factors: &[f32],
) -> atlas_registry::CudaGraph {
    let scale = registry.function_cached("elementwise", "scale").unwrap();
    let n = x.len() as u32;
    let cfg = LaunchConfig::for_elements(n, 256);
    let capture = stream.begin_capture().unwrap();
    for &f in factors {
        // SAFETY: captured, not run: at each replay `scale` touches the `n` floats of `x`; every
        // test keeps `x` alive (declared before the executable graph) while it replays.
        unsafe { scale.launch(&capture, &cfg, (&mut *x, f, n)) }.unwrap();
    }
    capture.end().unwrap()
}

fn factors(rng: &mut Rng, count: usize) -> Vec<f32> {
    (0..count).map(|_| rng.f32_in(0.5, 1.5)).collect()
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn same_topology_updates_in_place_and_node_updates_still_work() {
    let registry = demo();
    let mut stream = CudaStream::new(registry.ctx()).unwrap();
    let mut rng = Rng::new();
    let n = 40_000;
    let (input_x, input_y) = (rng.vec(n), rng.vec(n));
    let mut x = DeviceBuffer::from_slice(registry.ctx(), &stream, &input_x).unwrap();
    let mut y = DeviceBuffer::from_slice(registry.ctx(), &stream, &input_y).unwrap();
    let first = factors(&mut rng, 3);
    let mut exec = capture_scales(&registry, &mut stream, &mut x, &first)
        .instantiate()
        .unwrap();
    exec.upload(&stream).unwrap();
    // SAFETY: `x`, all the graph touches, outlives `exec`.
    unsafe { exec.launch(&stream) }.unwrap();
    let mut want_x = input_x.clone();
    want_x
        .iter_mut()
        .for_each(|v| *v *= first.iter().product::<f32>());
    let after_first = x.to_vec(&stream).unwrap();
    assert_close(&after_first, &want_x, 1e-5, "first graph");

    // Same three launches, on another buffer, with other factors.
    let second = factors(&mut rng, 3);
    let graph = capture_scales(&registry, &mut stream, &mut y, &second);
    // SAFETY: the new graph touches the `n` floats of `y`, which outlives `exec`.
    let outcome = unsafe { exec.update(graph) }.unwrap();
    assert_eq!(outcome, GraphUpdate::Updated);
    assert_eq!(exec.kernel_count(), 3);
    // SAFETY: as above.
    unsafe { exec.launch(&stream) }.unwrap();
    let mut want_y = input_y.clone();
    want_y
        .iter_mut()
        .for_each(|v| *v *= second.iter().product::<f32>());
    assert_close(
        &y.to_vec(&stream).unwrap(),
        &want_y,
        1e-5,
        "after the update",
    );
    // The updated graph no longer touches `x`: it is exactly as the first graph left it.
    let x_now = x.to_vec(&stream).unwrap();
    assert!(
        x_now
            .iter()
            .zip(&after_first)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "x changed after the update"
    );

    // Kernel nodes are still addressable after an in-place update.
    let scale = registry.function_cached("elementwise", "scale").unwrap();
    let cfg = LaunchConfig::for_elements(n as u32, 256);
    let replacement = rng.f32_in(0.5, 1.5);
    // SAFETY: node 1 touches the `n` floats of `y`, which outlives `exec`.
    unsafe { exec.set_kernel_args(1, &scale, &cfg, (&mut y, replacement, n as u32)) }.unwrap();
    // SAFETY: as above.
    unsafe { exec.launch(&stream) }.unwrap();
    let product = second[0] * replacement * second[2];
    want_y.iter_mut().for_each(|v| *v *= product);
    assert_close(
        &y.to_vec(&stream).unwrap(),
        &want_y,
        1e-5,
        "node update after update",
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn another_topology_is_instantiated_again() {
    let registry = demo();
    let mut stream = CudaStream::new(registry.ctx()).unwrap();
    let mut rng = Rng::new();
    let n = 30_000;
    let input = rng.vec(n);
    let mut x = DeviceBuffer::from_slice(registry.ctx(), &stream, &input).unwrap();
    let first = factors(&mut rng, 2);
    let mut exec = capture_scales(&registry, &mut stream, &mut x, &first)
        .instantiate()
        .unwrap();
    let second = factors(&mut rng, 5);
    let graph = capture_scales(&registry, &mut stream, &mut x, &second);
    // SAFETY: the new graph touches the `n` floats of `x`, which outlives `exec`.
    let outcome = unsafe { exec.update(graph) }.unwrap();
    assert!(
        matches!(outcome, GraphUpdate::Reinstantiated { .. }),
        "{outcome:?}"
    );
    if let GraphUpdate::Reinstantiated { reason } = outcome {
        assert_eq!(reason, UpdateRefusal::TopologyChanged, "{reason}");
    }
    assert_eq!(exec.kernel_count(), 5);
    exec.upload(&stream).unwrap();
    // SAFETY: as above.
    unsafe { exec.launch(&stream) }.unwrap();
    let mut want = input.clone();
    want.iter_mut()
        .for_each(|v| *v *= second.iter().product::<f32>());
    assert_close(
        &x.to_vec(&stream).unwrap(),
        &want,
        1e-5,
        "re-instantiated graph",
    );

    // Its kernel nodes are the new graph's.
    let scale = registry.function_cached("elementwise", "scale").unwrap();
    let cfg = LaunchConfig::for_elements(n as u32, 256);
    // SAFETY: node 4 touches the `n` floats of `x`, which outlives `exec`.
    unsafe { exec.set_kernel_args(4, &scale, &cfg, (&mut x, 1.0f32, n as u32)) }.unwrap();
    // SAFETY: as above.
    unsafe { exec.launch(&stream) }.unwrap();
    let product: f32 = second[..4].iter().product();
    want.iter_mut().for_each(|v| *v *= product);
    assert_close(
        &x.to_vec(&stream).unwrap(),
        &want,
        1e-5,
        "after a node update",
    );
}

#[test]
#[ignore = "needs two NVIDIA GPUs"]
fn a_graph_or_stream_of_another_device_is_refused_and_the_graph_replays_as_before() {
    let count = atlas_registry::device_count().unwrap();
    assert!(
        count >= 2,
        "this test needs two NVIDIA GPUs; the driver reports {count}"
    );
    let (r0, r1) = (
        demo(),
        AtlasRegistry::load(1, ptx_for_model("demo").unwrap()).unwrap(),
    );
    let (mut s0, mut s1) = (
        CudaStream::new(r0.ctx()).unwrap(),
        CudaStream::new(r1.ctx()).unwrap(),
    );
    let mut rng = Rng::new();
    let n = 20_000;
    let input = rng.vec(n);
    let mut x0 = DeviceBuffer::from_slice(r0.ctx(), &s0, &input).unwrap();
    let mut x1 = DeviceBuffer::from_slice(r1.ctx(), &s1, &rng.vec(n)).unwrap();
    let first = factors(&mut rng, 3);
    let mut exec = capture_scales(&r0, &mut s0, &mut x0, &first)
        .instantiate()
        .unwrap();
    let foreign = capture_scales(&r1, &mut s1, &mut x1, &factors(&mut rng, 3));

    let refused = |e, what| assert_wrong_context(e, what, 0, 1);
    // SAFETY: refused before the driver is called; nothing of device 1 is ever replayed here.
    refused(
        unsafe { exec.update(foreign) }.unwrap_err(),
        "the new graph",
    );
    refused(exec.upload(&s1).unwrap_err(), "the stream");

    // The executable graph is the one instantiated on device 0, untouched by the refusals.
    assert_eq!(exec.kernel_count(), 3);
    exec.upload(&s0).unwrap();
    // SAFETY: `x0`, all the graph touches, outlives `exec`.
    unsafe { exec.launch(&s0) }.unwrap();
    let mut want = input.clone();
    want.iter_mut()
        .for_each(|v| *v *= first.iter().product::<f32>());
    assert_close(&x0.to_vec(&s0).unwrap(), &want, 1e-5, "after the refusals");
}

/// `loop_step` on the CPU: `steps` times x = x * 0.5 + 1.
fn loop_reference(input: &[f32], steps: usize) -> Vec<f32> {
    input
        .iter()
        .map(|&v| (0..steps).fold(v, |v, _| v * 0.5 + 1.0))
        .collect()
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn while_loop_runs_as_many_iterations_as_the_device_decides() {
    let mut rng = Rng::new();
    for (blob, registry) in conditional_registries() {
        let mut stream = CudaStream::new(registry.ctx()).unwrap();
        let n = 10_000 + rng.index(5_000);
        let input = rng.vec(n);
        let mut x = DeviceBuffer::from_slice(registry.ctx(), &stream, &input).unwrap();
        let mut counter = DeviceBuffer::from_slice(registry.ctx(), &stream, &[-7i32]).unwrap();
        let limit = 1 + rng.index(20) as i32;
        let graph = capture_counted_loop(&registry, &mut stream, &mut x, &mut counter, limit);
        let exec = graph.instantiate().unwrap();
        let mut want = input.clone();
        for replay in 0..2 {
            // SAFETY: `x` and `counter` outlive `exec`.
            unsafe { exec.launch(&stream) }.unwrap();
            want = loop_reference(&want, limit as usize);
            assert_close(
                &x.to_vec(&stream).unwrap(),
                &want,
                1e-5,
                &format!("{blob}: replay {replay} of a {limit}-iteration loop"),
            );
            assert_eq!(counter.to_vec(&stream).unwrap(), [limit], "{blob}");
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn if_node_runs_its_body_when_the_device_flag_says_so() {
    let mut rng = Rng::new();
    for (blob, registry) in conditional_registries() {
        let mut stream = CudaStream::new(registry.ctx()).unwrap();
        let set = registry
            .function_cached("conditional", "set_condition")
            .unwrap();
        let step = registry
            .function_cached("conditional", "host_step")
            .unwrap();
        let n = 5_000 + rng.index(5_000);
        let input = rng.vec(n);
        let mut x = DeviceBuffer::from_slice(registry.ctx(), &stream, &input).unwrap();
        let mut counter = DeviceBuffer::from_slice(registry.ctx(), &stream, &[0i32]).unwrap();
        let mut flag = DeviceBuffer::from_slice(registry.ctx(), &stream, &[0i32]).unwrap();
        let cfg = LaunchConfig::for_elements(n as u32, 256);
        let mut capture = stream.begin_capture().unwrap();
        // The handle starts at 1: only the kernel's write can skip the body.
        let cond = capture.conditional_handle(true).unwrap();
        // SAFETY: captured, not run: reads the int of `flag` (outlives `exec`) and sets `cond`, a
        // handle of this graph, while running in it.
        unsafe { set.launch(&capture, &LaunchConfig::for_elements(1, 1), (cond, &flag)) }.unwrap();
        capture
            .capture_if(cond, |body| {
                // SAFETY: captured, not run: touches the `n` floats of `x` and the int of
                // `counter`, which outlive `exec`.
                unsafe { step.launch(&*body, &cfg, (&mut x, n as u32, &mut counter)) }
            })
            .unwrap();
        let exec = capture.end().unwrap().instantiate().unwrap();
        let mut want = input.clone();
        let mut runs = 0;
        for _ in 0..6 {
            let run = rng.chance(50);
            flag.copy_from(&stream, &[if run { rng.below(1000) as i32 + 1 } else { 0 }])
                .unwrap();
            // SAFETY: `x`, `counter` and `flag` outlive `exec`.
            unsafe { exec.launch(&stream) }.unwrap();
            if run {
                want = loop_reference(&want, 1);
                runs += 1;
            }
            assert_close(&x.to_vec(&stream).unwrap(), &want, 1e-5, blob);
            assert_eq!(counter.to_vec(&stream).unwrap(), [runs], "{blob}");
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn conditional_misuse_is_refused() {
    let (_, registry) = conditional_registries().remove(0);
    let mut stream = CudaStream::new(registry.ctx()).unwrap();
    let step = registry
        .function_cached("conditional", "host_step")
        .unwrap();
    let mut x = DeviceBuffer::from_slice(registry.ctx(), &stream, &[1.0f32; 32]).unwrap();
    let mut counter = DeviceBuffer::from_slice(registry.ctx(), &stream, &[0i32]).unwrap();
    let cfg = LaunchConfig::for_elements(32, 32);
    // A handle of one capture is refused by another.
    let mut capture = stream.begin_capture().unwrap();
    let foreign = capture.conditional_handle(true).unwrap();
    drop(capture.end().unwrap());
    let mut capture = stream.begin_capture().unwrap();
    let err = capture.capture_while(foreign, |_| Ok(())).unwrap_err();
    assert!(
        matches!(
            err,
            AtlasError::Capture(CaptureMisuse::ForeignConditionalHandle)
        ),
        "{err}"
    );
    let cond = capture.conditional_handle(false).unwrap();
    capture
        .capture_if(cond, |body| {
            // SAFETY: captured, not run (the condition starts at 0 and nothing sets it): it would
            // touch the 32 floats of `x` and the int of `counter`, which outlive the graph.
            unsafe { step.launch(&*body, &cfg, (&mut x, 32u32, &mut counter)) }
        })
        .unwrap();
    let exec = capture.end().unwrap().instantiate().unwrap();
    // SAFETY: as above.
    unsafe { exec.launch(&stream) }.unwrap();
    assert_eq!(x.to_vec(&stream).unwrap(), [1.0f32; 32], "body skipped");
    assert_eq!(counter.to_vec(&stream).unwrap(), [0]);

    // A capture the caller ended with the driver's own call takes no conditional node.
    let mut capture = stream.begin_capture().unwrap();
    let cuda = atlas_registry::sys::driver().unwrap();
    let end = atlas_registry::sys::entry!(cuda, cuStreamEndCapture).unwrap();
    let destroy = atlas_registry::sys::entry!(cuda, cuGraphDestroy).unwrap();
    let mut graph = std::ptr::null_mut();
    // SAFETY: the capture begun above on this thread, whose context Atlas left current; the graph
    // is destroyed once.
    unsafe {
        assert_eq!(
            end(capture.raw(), &mut graph),
            atlas_registry::sys::CUresult::CUDA_SUCCESS
        );
        assert_eq!(destroy(graph), atlas_registry::sys::CUresult::CUDA_SUCCESS);
    }
    let not_capturing = capture.conditional_handle(true).unwrap_err();
    assert!(
        matches!(
            not_capturing,
            AtlasError::Capture(CaptureMisuse::NotCapturing)
        ),
        "{not_capturing}"
    );
}

// Stand-in (no GPU): a driver without the entry points of a feature refuses it by name.

child::bodies!(conditional_nodes_need_their_entry_points);

#[test]
fn a_driver_without_conditional_nodes_names_what_it_lacks() {
    standin::run(
        conditional_nodes_need_their_entry_points,
        &["-DSTANDIN_NO_CONDITIONAL"],
    );
}

fn conditional_nodes_need_their_entry_points() {
    let host = atlas_registry::host(0).unwrap();
    let mut stream = CudaStream::new(host.context()).unwrap();
    let mut capture = stream.begin_capture().unwrap();
    let err = capture.conditional_handle(true).unwrap_err();
    let AtlasError::GraphFeatureUnavailable { feature, missing } = &err else {
        panic!("{err}");
    };
    assert_eq!(*feature, GraphFeature::Conditional);
    assert_eq!(
        missing,
        &[
            "cuGraphConditionalHandleCreate",
            "cuGraphAddNode_v2",
            "cuStreamGetCaptureInfo_v3",
            "cuStreamUpdateCaptureDependencies_v2",
            "cuStreamBeginCaptureToGraph",
        ]
    );
    let text = err.to_string();
    assert!(
        text.contains("CUDA 12.3") && text.contains("cuStreamBeginCaptureToGraph"),
        "{text}"
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_while_body_runs_after_its_registry_is_released_and_its_buffers_dropped() {
    let mut rng = Rng::new();
    for (blob, registry) in conditional_registries() {
        let mut stream = CudaStream::new(registry.ctx()).unwrap();
        let n = 10_000 + rng.index(5_000);
        let mut x = DeviceBuffer::<f32>::alloc(registry.ctx(), n).unwrap();
        let mut counter = DeviceBuffer::<i32>::alloc(registry.ctx(), 1).unwrap();
        let (x_ptr, counter_ptr) = (x.device_ptr(), counter.device_ptr());
        let limit = 1 + rng.index(20) as i32;
        let graph = capture_counted_loop(&registry, &mut stream, &mut x, &mut counter, limit);
        let exec = graph.instantiate().unwrap();
        drop((x, counter));
        let e = atlas_registry::release(registry).unwrap_err();
        assert!(
            matches!(e, AtlasError::InUse { handles: 1, .. }),
            "{blob}: {e}"
        );
        for replay in 0..3 {
            let input = rng.vec(n);
            // SAFETY: `x_ptr` and `counter_ptr` are memory the graph keeps, of the sizes copied;
            // the host values live until the stream is synchronized, and `got`/`count` are read
            // only after it.
            let (got, count) = unsafe {
                atlas_registry::copy_to_device_async(&stream, x_ptr, input.as_ptr().cast(), n * 4)
                    .unwrap();
                let poison = [i32::MIN];
                atlas_registry::copy_to_device_async(
                    &stream,
                    counter_ptr,
                    poison.as_ptr().cast(),
                    4,
                )
                .unwrap();
                exec.launch(&stream).unwrap();
                let mut got = vec![f32::NAN; n];
                let mut count = [i32::MIN];
                atlas_registry::copy_to_host_async(&stream, got.as_mut_ptr().cast(), x_ptr, n * 4)
                    .unwrap();
                atlas_registry::copy_to_host_async(
                    &stream,
                    count.as_mut_ptr().cast(),
                    counter_ptr,
                    4,
                )
                .unwrap();
                stream.synchronize().unwrap();
                (got, count)
            };
            assert_close(
                &got,
                &loop_reference(&input, limit as usize),
                1e-5,
                &format!("{blob}: replay {replay} of a {limit}-iteration loop"),
            );
            assert_eq!(count, [limit], "{blob}: replay {replay}");
        }
    }
}
