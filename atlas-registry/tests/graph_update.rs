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
    stream: &CudaStream,
    x: &mut DeviceBuffer<f32>,
    factors: &[f32],
) -> atlas_registry::CudaGraph {
    let scale = registry.function_cached("elementwise", "scale").unwrap();
    let n = x.len() as u32;
    let cfg = LaunchConfig::for_elements(n, 256);
    stream.begin_capture().unwrap();
    for &f in factors {
        // SAFETY: captured, not run: at each replay `scale` touches the `n` floats of `x`; every
        // test keeps `x` alive (declared before the executable graph) while it replays.
        unsafe { scale.launch(stream, &cfg, (&mut *x, f, n)) }.unwrap();
    }
    stream.end_capture().unwrap()
}

fn factors(rng: &mut Rng, count: usize) -> Vec<f32> {
    (0..count).map(|_| rng.f32_in(0.5, 1.5)).collect()
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn same_topology_updates_in_place_and_node_updates_still_work() {
    let registry = demo();
    let stream = CudaStream::new(registry.ctx()).unwrap();
    let mut rng = Rng::new();
    let n = 40_000;
    let (input_x, input_y) = (rng.vec(n), rng.vec(n));
    let mut x = DeviceBuffer::from_slice(registry.ctx(), &stream, &input_x).unwrap();
    let mut y = DeviceBuffer::from_slice(registry.ctx(), &stream, &input_y).unwrap();
    let first = factors(&mut rng, 3);
    let mut exec = capture_scales(&registry, &stream, &mut x, &first)
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
    let graph = capture_scales(&registry, &stream, &mut y, &second);
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
    let stream = CudaStream::new(registry.ctx()).unwrap();
    let mut rng = Rng::new();
    let n = 30_000;
    let input = rng.vec(n);
    let mut x = DeviceBuffer::from_slice(registry.ctx(), &stream, &input).unwrap();
    let first = factors(&mut rng, 2);
    let mut exec = capture_scales(&registry, &stream, &mut x, &first)
        .instantiate()
        .unwrap();
    let second = factors(&mut rng, 5);
    let graph = capture_scales(&registry, &stream, &mut x, &second);
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
    let (s0, s1) = (
        CudaStream::new(r0.ctx()).unwrap(),
        CudaStream::new(r1.ctx()).unwrap(),
    );
    let mut rng = Rng::new();
    let n = 20_000;
    let input = rng.vec(n);
    let mut x0 = DeviceBuffer::from_slice(r0.ctx(), &s0, &input).unwrap();
    let mut x1 = DeviceBuffer::from_slice(r1.ctx(), &s1, &rng.vec(n)).unwrap();
    let first = factors(&mut rng, 3);
    let mut exec = capture_scales(&r0, &s0, &mut x0, &first)
        .instantiate()
        .unwrap();
    let foreign = capture_scales(&r1, &s1, &mut x1, &factors(&mut rng, 3));

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
        let stream = CudaStream::new(registry.ctx()).unwrap();
        let n = 10_000 + rng.index(5_000);
        let input = rng.vec(n);
        let mut x = DeviceBuffer::from_slice(registry.ctx(), &stream, &input).unwrap();
        let mut counter = DeviceBuffer::from_slice(registry.ctx(), &stream, &[-7i32]).unwrap();
        let limit = 1 + rng.index(20) as i32;
        let graph = capture_counted_loop(&registry, &stream, &mut x, &mut counter, limit);
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
        let stream = CudaStream::new(registry.ctx()).unwrap();
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
        stream.begin_capture().unwrap();
        // The handle starts at 1: only the kernel's write can skip the body.
        let cond = stream.conditional_handle(true).unwrap();
        // SAFETY: captured, not run: reads the int of `flag` (outlives `exec`) and sets `cond`, a
        // handle of this graph, while running in it.
        unsafe { set.launch(&stream, &LaunchConfig::for_elements(1, 1), (cond, &flag)) }.unwrap();
        stream
            .capture_if(cond, |body| {
                // SAFETY: captured, not run: touches the `n` floats of `x` and the int of
                // `counter`, which outlive `exec`.
                unsafe { step.launch(body, &cfg, (&mut x, n as u32, &mut counter)) }
            })
            .unwrap();
        let exec = stream.end_capture().unwrap().instantiate().unwrap();
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
    let stream = CudaStream::new(registry.ctx()).unwrap();
    let not_capturing = stream.conditional_handle(true).unwrap_err();
    assert!(
        matches!(
            not_capturing,
            AtlasError::Capture(CaptureMisuse::NotCapturing)
        ),
        "{not_capturing}"
    );
    let legacy = CudaStream::legacy_default(registry.ctx());
    assert!(matches!(
        legacy.conditional_handle(true).unwrap_err(),
        AtlasError::Capture(CaptureMisuse::LegacyDefaultStream)
    ));

    let step = registry
        .function_cached("conditional", "host_step")
        .unwrap();
    let mut x = DeviceBuffer::from_slice(registry.ctx(), &stream, &[1.0f32; 32]).unwrap();
    let mut counter = DeviceBuffer::from_slice(registry.ctx(), &stream, &[0i32]).unwrap();
    let cfg = LaunchConfig::for_elements(32, 32);
    // A handle of one capture is refused by another.
    stream.begin_capture().unwrap();
    let foreign = stream.conditional_handle(true).unwrap();
    drop(stream.end_capture().unwrap());
    stream.begin_capture().unwrap();
    let err = stream.capture_while(foreign, |_| Ok(())).unwrap_err();
    assert!(
        matches!(
            err,
            AtlasError::Capture(CaptureMisuse::ForeignConditionalHandle)
        ),
        "{err}"
    );
    // Neither the body's stream nor the capturing one can end its capture inside the body.
    let cond = stream.conditional_handle(false).unwrap();
    stream
        .capture_if(cond, |body| {
            for what in [body, &stream] {
                let err = what.end_capture().unwrap_err();
                assert!(
                    matches!(err, AtlasError::Capture(CaptureMisuse::ConditionalBody)),
                    "{err}"
                );
            }
            // SAFETY: captured, not run (the condition starts at 0 and nothing sets it): it would
            // touch the 32 floats of `x` and the int of `counter`, which outlive the graph.
            unsafe { step.launch(body, &cfg, (&mut x, 32u32, &mut counter)) }
        })
        .unwrap();
    let exec = stream.end_capture().unwrap().instantiate().unwrap();
    // SAFETY: as above.
    unsafe { exec.launch(&stream) }.unwrap();
    assert_eq!(x.to_vec(&stream).unwrap(), [1.0f32; 32], "body skipped");
    assert_eq!(counter.to_vec(&stream).unwrap(), [0]);
}

// Stand-in (no GPU): a driver without the entry points of a feature refuses it by name.

child::bodies!(
    conditional_nodes_need_their_entry_points,
    conditional_calls_from_two_threads_take_turns,
    a_capture_never_ends_under_a_conditional_call,
);

#[test]
fn a_driver_without_conditional_nodes_names_what_it_lacks() {
    standin::run(
        conditional_nodes_need_their_entry_points,
        &["-DSTANDIN_NO_CONDITIONAL"],
    );
}

fn conditional_nodes_need_their_entry_points() {
    let host = atlas_registry::host(0).unwrap();
    let stream = CudaStream::new(host.context()).unwrap();
    let err = stream.conditional_handle(true).unwrap_err();
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

// Stand-in (no GPU): the driver does not synchronize calls on one graph object; the stand-in
// counts two at once ("graph_race") and a graph used after it was destroyed ("stale_handle").

#[test]
fn conditional_calls_and_end_capture_from_two_threads_never_use_one_graph_at_once() {
    standin::run(conditional_calls_from_two_threads_take_turns, &[]);
    standin::run(a_capture_never_ends_under_a_conditional_call, &[]);
}

/// Two threads adding handles and IF nodes to one capture at once (`CudaStream` is `Sync`): the
/// calls take turns, and the graph holds every node.
fn conditional_calls_from_two_threads_take_turns() {
    let p = standin::probe();
    let registry = AtlasRegistry::load(0, ptx_for_model("conditional").unwrap()).unwrap();
    let stream = CudaStream::new(registry.ctx()).unwrap();
    stream.begin_capture().unwrap();
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                for _ in 0..10 {
                    let cond = stream.conditional_handle(false).unwrap();
                    stream.capture_if(cond, |_| Ok(())).unwrap();
                }
            });
        }
    });
    let exec = stream.end_capture().unwrap().instantiate().unwrap();
    // SAFETY: the graph holds 20 IF nodes with empty bodies: nothing runs, no memory is reached.
    unsafe { exec.launch(&stream) }.unwrap();
    assert_eq!(p.count("cuGraphAddNode_v2"), 20);
    assert_eq!(p.count("graph_race"), 0, "two calls used one graph at once");
    assert_eq!(p.count("stale_handle"), 0);
}

/// One thread makes handles while another ends and begins the capture over and over: a handle is
/// made in a live capture or refused (`NotCapturing`), never in a graph being ended or destroyed.
fn a_capture_never_ends_under_a_conditional_call() {
    let p = standin::probe();
    let registry = AtlasRegistry::load(0, ptx_for_model("conditional").unwrap()).unwrap();
    let stream = CudaStream::new(registry.ctx()).unwrap();
    stream.begin_capture().unwrap();
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            // At most 512 handles: the stand-in, like the driver, has room for a fixed number,
            // and a fast machine makes more than that while the other thread captures 30 times.
            let mut made = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) && made < 512 {
                match stream.conditional_handle(true) {
                    Ok(_) => made += 1,
                    Err(AtlasError::Capture(CaptureMisuse::NotCapturing)) => {}
                    Err(e) => panic!("{e}"),
                }
            }
        });
        for _ in 0..30 {
            drop(stream.end_capture().unwrap());
            stream.begin_capture().unwrap();
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    drop(stream.end_capture().unwrap());
    assert!(p.count("cuGraphConditionalHandleCreate") > 0);
    assert_eq!(p.count("graph_race"), 0, "two calls used one graph at once");
    assert_eq!(
        p.count("stale_handle"),
        0,
        "a handle was made in a destroyed graph"
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_while_body_runs_after_its_registry_is_released_and_its_buffers_dropped() {
    let mut rng = Rng::new();
    for (blob, registry) in conditional_registries() {
        let stream = CudaStream::new(registry.ctx()).unwrap();
        let n = 10_000 + rng.index(5_000);
        let mut x = DeviceBuffer::<f32>::alloc(registry.ctx(), n).unwrap();
        let mut counter = DeviceBuffer::<i32>::alloc(registry.ctx(), 1).unwrap();
        let (x_ptr, counter_ptr) = (x.device_ptr(), counter.device_ptr());
        let limit = 1 + rng.index(20) as i32;
        let graph = capture_counted_loop(&registry, &stream, &mut x, &mut counter, limit);
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
