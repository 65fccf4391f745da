//! Events, stream order and host functions: recording, waiting (across streams and devices),
//! querying, synchronizing and timing events; forks of a capture into other streams; host
//! functions in a stream's order, eager and captured.
//!
//! Stand-in (CI): `cargo test -p atlas-registry --test events` (each refusal, one driver call per
//! record and wait, the stand-in's joined-stream model). GPU: `-- --include-ignored` (a consumer
//! stream that waits sees the producer's data, the elapsed time of a known spin, host functions in
//! order, forks replayed against the CPU).

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use atlas_kernels::ptx_for_model;
use atlas_registry::{
    AtlasError, AtlasRegistry, CaptureMisuse, CudaEvent, CudaStream, DeviceBuffer, EventMisuse,
    LaunchConfig,
};
use support::child::{self, Ending};
use support::reference::assert_close;
use support::rng::Rng;
use support::spin::spin_registry;
use support::standin::{self, probe};

child::bodies!(
    record_and_wait_are_one_driver_call_each,
    events_of_another_device_are_refused_where_they_cannot_be_used,
    timing_needs_timing_events_recorded_outside_captures,
    a_stream_joins_a_capture_only_through_a_fork,
    a_fork_captures_two_branches_that_the_graph_keeps,
    host_functions_run_in_order_and_panics_are_contained,
    a_captured_host_function_runs_at_every_replay_and_lives_with_the_graph,
    a_waiting_consumer_sees_the_producers_data,
    a_known_spin_is_timed,
    a_fork_replays_as_the_cpu_computes,
    a_captured_host_function_runs_at_every_replay_on_the_gpu,
);

fn demo(ordinal: usize) -> AtlasRegistry {
    AtlasRegistry::load(ordinal, ptx_for_model("demo").unwrap()).unwrap()
}

fn capture_misuse<T: std::fmt::Debug>(result: atlas_registry::Result<T>) -> CaptureMisuse {
    match result {
        Err(AtlasError::Capture(misuse)) => misuse,
        other => panic!("expected a capture misuse, got {other:?}"),
    }
}

/// Every driver call made so far (the stand-in counts every entry point).
fn all_calls() -> u64 {
    probe().count("calls")
}

fn record_and_wait_are_one_driver_call_each() {
    let p = probe();
    let registry = demo(0);
    let ctx = registry.ctx();
    let (a, b) = (CudaStream::new(ctx).unwrap(), CudaStream::new(ctx).unwrap());
    let mut event = CudaEvent::new(ctx).unwrap();
    assert!(!event.is_timing());
    assert!(event.query().unwrap(), "never recorded: complete");
    let (calls, records) = (all_calls(), p.count("cuEventRecord"));
    event.record(&a).unwrap();
    assert_eq!(
        (all_calls() - calls, p.count("cuEventRecord") - records),
        (1, 1)
    );
    let (calls, waits) = (all_calls(), p.count("cuStreamWaitEvent"));
    b.wait(&event).unwrap();
    assert_eq!(
        (all_calls() - calls, p.count("cuStreamWaitEvent") - waits),
        (1, 1)
    );
    assert!(event.query().unwrap());
    event.synchronize().unwrap();
    // The legacy default stream: its context is made current, and the record still one call.
    let legacy = CudaStream::legacy_default(ctx);
    event.record(&legacy).unwrap();
    legacy.wait(&event).unwrap();
}

#[test]
fn an_event_record_and_a_stream_wait_are_one_driver_call_each() {
    standin::run(record_and_wait_are_one_driver_call_each, &[]);
}

fn events_of_another_device_are_refused_where_they_cannot_be_used() {
    let p = probe();
    let (r0, r1) = (demo(0), demo(1));
    let (s0, s1) = (
        CudaStream::new(r0.ctx()).unwrap(),
        CudaStream::new(r1.ctx()).unwrap(),
    );
    let mut e0 = CudaEvent::new(r0.ctx()).unwrap();
    let records = p.count("cuEventRecord");
    match e0.record(&s1) {
        Err(AtlasError::WrongContext {
            expected, given, ..
        }) => assert_eq!((expected, given), (Some(0), Some(1))),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        p.count("cuEventRecord"),
        records,
        "refused before the driver"
    );
    // A stream of one device may wait for an event of another.
    e0.record(&s0).unwrap();
    s1.wait(&e0).unwrap();
    let (mut t0, mut t1) = (
        CudaEvent::timing(r0.ctx()).unwrap(),
        CudaEvent::timing(r1.ctx()).unwrap(),
    );
    t0.record(&s0).unwrap();
    t1.record(&s1).unwrap();
    assert!(matches!(
        t1.elapsed_since(&t0),
        Err(AtlasError::WrongContext { .. })
    ));
    assert_eq!(p.count("context_mismatch"), 0);
}

#[test]
fn an_event_is_recorded_on_its_own_devices_streams_and_waited_for_by_any() {
    standin::run(
        events_of_another_device_are_refused_where_they_cannot_be_used,
        &["-DSTANDIN_DEVICES=2"],
    );
}

fn timing_needs_timing_events_recorded_outside_captures() {
    let registry = demo(0);
    let ctx = registry.ctx();
    let mut stream = CudaStream::new(ctx).unwrap();
    let (mut plain, mut start, mut end) = (
        CudaEvent::new(ctx).unwrap(),
        CudaEvent::timing(ctx).unwrap(),
        CudaEvent::timing(ctx).unwrap(),
    );
    assert!(matches!(
        end.elapsed_since(&start),
        Err(AtlasError::Event(EventMisuse::NeverRecorded))
    ));
    plain.record(&stream).unwrap();
    start.record(&stream).unwrap();
    assert!(matches!(
        start.elapsed_since(&plain),
        Err(AtlasError::Event(EventMisuse::NotTiming))
    ));
    let scale = registry.function("elementwise", "scale").unwrap();
    let mut x = DeviceBuffer::from_slice(ctx, &stream, &[1.0f32; 64]).unwrap();
    for _ in 0..4 {
        // SAFETY: `scale` touches the 64 floats of `x`, which outlives it (synchronized below).
        unsafe {
            scale.launch(
                &stream,
                &LaunchConfig::for_elements(64, 64),
                (&mut x, 1.0f32, 64u32),
            )
        }
        .unwrap();
    }
    end.record(&stream).unwrap();
    end.synchronize().unwrap();
    // The stand-in counts half a millisecond per launch between the two records.
    assert_eq!(end.elapsed_since(&start).unwrap(), Duration::from_millis(2));
    // Recorded in a capture, an event is no point of running work.
    let capture = stream.begin_capture().unwrap();
    end.record(&capture).unwrap();
    let queries = probe().count("cuEventQuery");
    assert_eq!(capture_misuse(end.query()), CaptureMisuse::EventOfCapture);
    assert_eq!(
        capture_misuse(end.synchronize()),
        CaptureMisuse::EventOfCapture
    );
    assert_eq!(
        capture_misuse(end.elapsed_since(&start)),
        CaptureMisuse::EventOfCapture
    );
    assert_eq!(
        probe().count("cuEventQuery"),
        queries,
        "refused before the driver"
    );
    assert!(capture.is_capturing().unwrap(), "the capture goes on");
    drop(capture.end().unwrap());
    end.record(&stream).unwrap();
    end.synchronize().unwrap();
}

#[test]
fn elapsed_time_is_refused_for_events_without_timing_unrecorded_or_captured() {
    standin::run(timing_needs_timing_events_recorded_outside_captures, &[]);
}

/// A plain stream waiting for an event recorded in a capture would join the capture: refused,
/// before the driver. A stream forked into the capture may wait for it; the capture itself too.
fn a_stream_joins_a_capture_only_through_a_fork() {
    let p = probe();
    let registry = demo(0);
    let ctx = registry.ctx();
    let (mut main, mut side, outsider, mut busy) = (
        CudaStream::new(ctx).unwrap(),
        CudaStream::new(ctx).unwrap(),
        CudaStream::new(ctx).unwrap(),
        CudaStream::new(ctx).unwrap(),
    );
    // A stream captured elsewhere (here by a capture forgotten, still going) cannot be forked into.
    std::mem::forget(busy.begin_capture().unwrap());
    let mut point = CudaEvent::new(ctx).unwrap();
    let mut capture = main.begin_capture().unwrap();
    point.record(&capture).unwrap();
    let waits = p.count("cuStreamWaitEvent");
    assert_eq!(
        capture_misuse(outsider.wait(&point)),
        CaptureMisuse::JoinOutsideFork
    );
    assert_eq!(
        p.count("cuStreamWaitEvent"),
        waits,
        "refused before the driver"
    );
    assert!(
        !outsider.is_capturing().unwrap(),
        "the outsider did not join"
    );
    let mut late = CudaEvent::new(ctx).unwrap();
    capture
        .fork(&mut side, |main, side| {
            side.wait(&point)?; // a point of its own capture
            late.record(side)?;
            main.wait(&late)
        })
        .unwrap();
    assert_eq!(
        capture_misuse(capture.fork(&mut busy, |_, _| Ok(()))),
        CaptureMisuse::ForkOfCapturingStream
    );
    drop(capture.end().unwrap());
    assert!(
        !side.is_capturing().unwrap(),
        "the fork left the capture with its end"
    );
    assert_eq!(p.count("capture_race"), 0);
}

#[test]
fn a_stream_that_waits_for_a_captured_event_is_refused_unless_forked_into_the_capture() {
    standin::run(a_stream_joins_a_capture_only_through_a_fork, &[]);
}

/// Two branches, each scaling a buffer of its own, captured through a fork; the buffers dropped
/// after the capture: the graph keeps both, and its replay computes what the CPU does.
fn a_fork_captures_two_branches_that_the_graph_keeps() {
    let p = probe();
    let registry = demo(0);
    let ctx = registry.ctx();
    let mut rng = Rng::new();
    let n = 100 + rng.index(1000);
    let (xs, ys) = (rng.vec(n), rng.vec(n));
    let (a, b) = (rng.f32_in(0.5, 1.5), rng.f32_in(0.5, 1.5));
    let (mut main, mut side) = (CudaStream::new(ctx).unwrap(), CudaStream::new(ctx).unwrap());
    let mut x = DeviceBuffer::from_slice(ctx, &main, &xs).unwrap();
    let mut y = DeviceBuffer::from_slice(ctx, &main, &ys).unwrap();
    let (x_ptr, y_ptr) = (x.device_ptr(), y.device_ptr());
    let scale = registry.function("elementwise", "scale").unwrap();
    let cfg = LaunchConfig::for_elements(n as u32, 256);
    let mut capture = main.begin_capture().unwrap();
    capture
        .fork(&mut side, |main, side| {
            // SAFETY: captured: each touches the `n` floats of its buffer, kept by the graph.
            unsafe { scale.launch(main, &cfg, (&mut x, a, n as u32)) }?;
            // SAFETY: as above.
            unsafe { scale.launch(side, &cfg, (&mut y, b, n as u32)) }
        })
        .unwrap();
    let graph = capture.end().unwrap();
    assert_eq!(graph.kept_count(), 3, "the registry and both buffers");
    drop((x, y));
    let exec = graph.instantiate().unwrap();
    assert_eq!(exec.kernel_count(), 2);
    // SAFETY: the graph reaches only the buffers it keeps.
    unsafe { exec.launch(&main) }.unwrap();
    for (ptr, data, f) in [(x_ptr, &xs, a), (y_ptr, &ys, b)] {
        let mut got = vec![f32::NAN; n];
        // SAFETY: `ptr` holds `n` floats the graph keeps; `got` is read after the synchronize.
        unsafe { atlas_registry::copy_to_host_async(&main, got.as_mut_ptr().cast(), ptr, n * 4) }
            .unwrap();
        main.synchronize().unwrap();
        let want: Vec<f32> = data.iter().map(|v| v * f).collect();
        assert_close(&got, &want, 1e-6, "a forked branch");
    }
    assert_eq!((p.count("capture_race"), p.count("fault")), (0, 0));
}

#[test]
fn a_fork_is_two_branches_of_one_graph() {
    standin::run(a_fork_captures_two_branches_that_the_graph_keeps, &[]);
}

fn host_functions_run_in_order_and_panics_are_contained() {
    let registry = demo(0);
    let mut stream = CudaStream::new(registry.ctx()).unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    for i in 0..5 {
        let order = Arc::clone(&order);
        stream
            .launch_host_func(move || order.lock().unwrap().push(i))
            .unwrap();
    }
    stream
        .launch_host_func(|| panic!("a host function's own panic"))
        .unwrap();
    stream.synchronize().unwrap();
    assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3, 4]);
    // On a capturing stream, a run-once function is refused; the capture's own door takes one
    // that may run many times.
    let capture = stream.begin_capture().unwrap();
    assert_eq!(
        capture_misuse(capture.stream().launch_host_func(|| ())),
        CaptureMisuse::HostFunctionOnce
    );
    drop(capture.end().unwrap());
}

#[test]
fn host_functions_run_in_stream_order_and_a_panic_in_one_is_reported() {
    // Reported by Rust's panic hook, and contained: the child went on and passed. (A logger
    // receives a record of it too: tests/logging.rs.)
    let child = standin::run(host_functions_run_in_order_and_panics_are_contained, &[]);
    assert!(
        child.stderr.contains("a host function's own panic"),
        "{child}"
    );
}

fn a_captured_host_function_runs_at_every_replay_and_lives_with_the_graph() {
    let p = probe();
    let registry = demo(0);
    let mut stream = CudaStream::new(registry.ctx()).unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let capture = stream.begin_capture().unwrap();
    let counted = Arc::clone(&runs);
    capture
        .launch_host_func(move || {
            counted.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    let graph = capture.end().unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 0, "captured, not run");
    assert_eq!(graph.kept_count(), 1, "the graph keeps the function");
    let exec = graph.instantiate().unwrap();
    for _ in 0..3 {
        // SAFETY: the graph holds a host function only, which it keeps.
        unsafe { exec.launch(&stream) }.unwrap();
    }
    stream.synchronize().unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    let syncs = p.count("cuCtxSynchronize");
    drop(exec);
    assert_eq!(
        p.count("cuCtxSynchronize"),
        syncs + 1,
        "released after the device's work"
    );
    assert_eq!(Arc::strong_count(&runs), 1, "the graph's copy is gone");
}

#[test]
fn a_captured_host_function_runs_at_every_replay() {
    standin::run(
        a_captured_host_function_runs_at_every_replay_and_lives_with_the_graph,
        &[],
    );
}

// GPU.

/// The producer spins for 0.2 s, then scales `x`; the consumer waits for the producer's event and
/// copies `x` back: it sees the scaled values, never the ones before.
fn a_waiting_consumer_sees_the_producers_data() {
    let registry = demo(0);
    let spin = spin_registry(0);
    let ctx = registry.ctx();
    let mut rng = Rng::new();
    let (producer, consumer) = (CudaStream::new(ctx).unwrap(), CudaStream::new(ctx).unwrap());
    let n = 1 << 20;
    let data = rng.vec(n);
    let factor = rng.f32_in(0.5, 1.5);
    let mut x = DeviceBuffer::from_slice(ctx, &producer, &data).unwrap();
    let spin_fn = spin.function("spin", "spin").unwrap();
    let scale = registry.function("elementwise", "scale").unwrap();
    let mut done = CudaEvent::new(ctx).unwrap();
    // SAFETY: spin touches no memory; `scale` the `n` floats of `x`, which outlives both.
    unsafe {
        spin_fn
            .launch(
                &producer,
                &LaunchConfig::for_elements(1, 1),
                (400_000_000u64,),
            )
            .unwrap();
        scale
            .launch(
                &producer,
                &LaunchConfig::for_elements(n as u32, 256),
                (&mut x, factor, n as u32),
            )
            .unwrap();
    }
    done.record(&producer).unwrap();
    consumer.wait(&done).unwrap();
    let mut got = vec![f32::NAN; n];
    // SAFETY: `x` holds `n` floats and outlives the copy; `got` is read after the synchronize.
    unsafe {
        atlas_registry::copy_to_host_async(
            &consumer,
            got.as_mut_ptr().cast(),
            x.device_ptr(),
            n * 4,
        )
    }
    .unwrap();
    consumer.synchronize().unwrap();
    let want: Vec<f32> = data.iter().map(|v| v * factor).collect();
    assert_close(&got, &want, 0.0, "what the consumer copied after its wait");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_a_consumer_stream_that_waits_sees_the_producers_data() {
    let child = child::run_on(a_waiting_consumer_sees_the_producers_data, None);
    assert_eq!(child.ending, Ending::Passed, "{child}");
}

/// A kernel that spins 200 million clock cycles takes at least that many cycles at the device's
/// highest clock: timed with two events, the time is no less (and not absurdly more: the unit).
fn a_known_spin_is_timed() {
    let spin = spin_registry(0);
    let ctx = spin.ctx();
    let stream = CudaStream::new(ctx).unwrap();
    let (mut start, mut end) = (
        CudaEvent::timing(ctx).unwrap(),
        CudaEvent::timing(ctx).unwrap(),
    );
    let spin_fn = spin.function("spin", "spin").unwrap();
    let cycles = 200_000_000u64;
    start.record(&stream).unwrap();
    // SAFETY: spin touches no memory.
    unsafe { spin_fn.launch(&stream, &LaunchConfig::for_elements(1, 1), (cycles,)) }.unwrap();
    end.record(&stream).unwrap();
    end.synchronize().unwrap();
    let took = end.elapsed_since(&start).unwrap();
    let khz = clock_rate_khz();
    let least = Duration::from_secs_f64(cycles as f64 / (f64::from(khz) * 1e3));
    println!("{cycles} cycles at up to {khz} kHz: at least {least:?}, timed {took:?}");
    assert!(took >= least.mul_f64(0.98), "{took:?} < {least:?}");
    assert!(took < least * 50, "{took:?} is far more than {least:?}");
}

/// The device's highest SM clock, in kHz, as the driver reports it.
fn clock_rate_khz() -> i32 {
    use atlas_registry::sys::{CUdevice_attribute, CUresult};
    let cuda = atlas_registry::sys::driver().unwrap();
    let (get, attribute) = (
        atlas_registry::sys::entry!(cuda, cuDeviceGet).unwrap(),
        atlas_registry::sys::entry!(cuda, cuDeviceGetAttribute).unwrap(),
    );
    let (mut device, mut khz) = (0, 0);
    // SAFETY: live out-pointers; ordinal 0 exists (the test's registry is on it).
    unsafe {
        assert_eq!(get(&mut device, 0), CUresult::CUDA_SUCCESS);
        let clock = CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CLOCK_RATE;
        assert_eq!(attribute(&mut khz, clock, device), CUresult::CUDA_SUCCESS);
    }
    khz
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_elapsed_time_of_a_known_spin() {
    let child = child::run_on(a_known_spin_is_timed, None);
    assert_eq!(child.ending, Ending::Passed, "{child}");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_host_functions_run_in_stream_order() {
    let child = child::run_on(host_functions_run_in_order_and_panics_are_contained, None);
    assert_eq!(child.ending, Ending::Passed, "{child}");
    let child = child::run_on(
        a_captured_host_function_runs_at_every_replay_on_the_gpu,
        None,
    );
    assert_eq!(child.ending, Ending::Passed, "{child}");
}

fn a_captured_host_function_runs_at_every_replay_on_the_gpu() {
    let registry = demo(0);
    let mut stream = CudaStream::new(registry.ctx()).unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let capture = stream.begin_capture().unwrap();
    let counted = Arc::clone(&runs);
    capture
        .launch_host_func(move || {
            counted.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    let exec = capture.end().unwrap().instantiate().unwrap();
    for _ in 0..5 {
        // SAFETY: the graph holds a host function only, which it keeps.
        unsafe { exec.launch(&stream) }.unwrap();
    }
    stream.synchronize().unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 5);
    drop(exec);
    assert_eq!(Arc::strong_count(&runs), 1, "the graph's copy is gone");
}

/// A capture forked into two streams, each branch scaling a buffer of its own after the trunk
/// scaled both, joined back for a last step: replayed, it computes what the CPU does.
fn a_fork_replays_as_the_cpu_computes() {
    let registry = demo(0);
    let ctx = registry.ctx();
    let mut rng = Rng::new();
    let n = 1000 + rng.index(100_000);
    let (xs, ys) = (rng.vec(n), rng.vec(n));
    let (a, b, c) = (
        rng.f32_in(0.5, 1.5),
        rng.f32_in(0.5, 1.5),
        rng.f32_in(0.5, 1.5),
    );
    let (mut main, mut side) = (CudaStream::new(ctx).unwrap(), CudaStream::new(ctx).unwrap());
    let mut x = DeviceBuffer::from_slice(ctx, &main, &xs).unwrap();
    let mut y = DeviceBuffer::from_slice(ctx, &main, &ys).unwrap();
    let scale = registry.function("elementwise", "scale").unwrap();
    let cfg = LaunchConfig::for_elements(n as u32, 256);
    let mut capture = main.begin_capture().unwrap();
    // SAFETY: captured; each launch here touches the `n` floats of `x` or `y`, which the graph
    // keeps.
    unsafe { scale.launch(&capture, &cfg, (&mut y, c, n as u32)) }.unwrap();
    capture
        .fork(&mut side, |main, side| {
            // SAFETY: as above.
            unsafe { scale.launch(main, &cfg, (&mut x, a, n as u32)) }?;
            // SAFETY: as above.
            unsafe { scale.launch(side, &cfg, (&mut y, b, n as u32)) }
        })
        .unwrap();
    // SAFETY: as above; after the join, so after both branches.
    unsafe { scale.launch(&capture, &cfg, (&mut x, c, n as u32)) }.unwrap();
    let exec = capture.end().unwrap().instantiate().unwrap();
    assert_eq!(exec.kernel_count(), 4);
    x.copy_from(&main, &vec![f32::NAN; n]).unwrap();
    x.copy_from(&main, &xs).unwrap();
    // SAFETY: the graph reaches only `x` and `y`, which it keeps.
    unsafe { exec.launch(&main) }.unwrap();
    let want_x: Vec<f32> = xs.iter().map(|v| v * a * c).collect();
    let want_y: Vec<f32> = ys.iter().map(|v| v * c * b).collect();
    assert_close(
        &x.to_vec(&main).unwrap(),
        &want_x,
        1e-6,
        "the trunk after the join",
    );
    assert_close(
        &y.to_vec(&main).unwrap(),
        &want_y,
        1e-6,
        "the forked branch",
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_a_fork_replays_as_the_cpu_computes() {
    let child = child::run_on(a_fork_replays_as_the_cpu_computes, None);
    assert_eq!(child.ending, Ending::Passed, "{child}");
}
