//! The flight recorder: each device's ring of recent launches, and the report a lost context's
//! error carries. On the stand-in (CI): fifty good launches on two streams and one that faults
//! lead to an error that names the faulting kernel first among the launches of its stream; the
//! off switch records nothing; recording keeps a launch at one driver call and no allocation;
//! threads launching at once while another reads never yield a torn record. On a GPU (ignored
//! here): the same fault, with `faults::write_far`, in a child process.
//!
//! `cargo test -p atlas-registry --test flight_recorder`; on a GPU, add `-- --include-ignored`.

mod support;

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};

use atlas_kernels::ptx_for_model;
use atlas_registry::{
    AtlasError, AtlasRegistry, CudaStream, DeviceBuffer, FLIGHT_RECORDER_VAR, FaultReport,
    LaunchConfig, LaunchKind, RING_SLOTS,
};
use support::allocations::{Counting, allocations};
use support::blobs::NEEDS_GPU;
use support::child::{self, Ending};
use support::standin::{self, probe};

child::bodies!(
    the_environment_switches_it_off,
    captures_and_replays_are_recorded,
    a_fault_among_fifty_launches_is_named_first_on_its_stream,
    switched_off_nothing_is_recorded,
    recording_is_one_driver_call_and_no_allocation,
    threads_launching_while_one_reads_never_tear_a_record,
    the_ring_keeps_the_newest_launches,
    a_refused_launch_leaves_no_record,
    two_devices_launching_in_turn_keep_a_full_ring_each,
    gpu_fault_among_fifty_launches,
);

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn load(model: &str) -> AtlasRegistry {
    AtlasRegistry::load(0, ptx_for_model(model).expect("a model of atlas-kernels"))
        .unwrap_or_else(|e| panic!("loading `{model}`: {e}"))
}

// ---------------------------------------------------------------------------------------------
// Stand-in (CI)
// ---------------------------------------------------------------------------------------------

#[test]
fn a_fault_is_named_among_the_launches_of_its_stream_newest_first() {
    let child = standin::run(
        a_fault_among_fifty_launches_is_named_first_on_its_stream,
        &[],
    );
    println!("{}", child.stdout);
}

#[test]
fn the_off_switch_records_nothing() {
    standin::run(switched_off_nothing_is_recorded, &[]);
}

#[test]
fn a_recorded_launch_is_one_driver_call_and_allocates_nothing() {
    standin::run(recording_is_one_driver_call_and_no_allocation, &[]);
}

#[test]
fn concurrent_launches_never_tear_a_record() {
    standin::run(threads_launching_while_one_reads_never_tear_a_record, &[]);
}

#[test]
fn the_environment_variable_switches_the_recorder_off() {
    for (value, on) in [("0", false), ("off", false), ("FALSE", false), ("1", true)] {
        let library = standin::build(&[]);
        let on_text = if on { "on" } else { "off" };
        let child = child::run_with_env(
            the_environment_switches_it_off,
            Some(&library),
            &[
                (FLIGHT_RECORDER_VAR, value.as_ref()),
                ("ATLAS_TEST_RECORDER_EXPECTED", on_text.as_ref()),
            ],
        );
        assert_eq!(
            child.ending,
            Ending::Passed,
            "{FLIGHT_RECORDER_VAR}={value}: {child}"
        );
    }
}

/// With the recorder as `ATLAS_TEST_RECORDER_EXPECTED` says (`on` or `off`), a launch is recorded
/// or not.
fn the_environment_switches_it_off() {
    let on = std::env::var("ATLAS_TEST_RECORDER_EXPECTED").unwrap() == "on";
    let registry = load("demo");
    let recorder = registry.host().flight_recorder();
    assert_eq!(recorder.is_enabled(), on);
    let mut x = DeviceBuffer::from_slice(registry.ctx(), registry.stream(), &[1.0f32; 64]).unwrap();
    let scale = registry.function_cached("elementwise", "scale").unwrap();
    // SAFETY: `scale` touches the 64 floats of `x`, synchronized before it is dropped.
    unsafe {
        scale.launch(
            registry.stream(),
            &LaunchConfig::for_elements(64, 64),
            (&mut x, 2.0f32, 64u32),
        )
    }
    .unwrap();
    registry.stream().synchronize().unwrap();
    assert_eq!(recorder.launches().len(), usize::from(on));
}

#[test]
fn a_captured_launch_is_marked_and_a_replay_is_one_record_of_its_graph() {
    standin::run(captures_and_replays_are_recorded, &[]);
}

fn captures_and_replays_are_recorded() {
    let registry = load("demo");
    let recorder = registry.host().flight_recorder();
    let mut stream = CudaStream::new(registry.ctx()).unwrap();
    let mut x = DeviceBuffer::from_slice(registry.ctx(), &stream, &[1.0f32; 64]).unwrap();
    let scale = registry.function_cached("elementwise", "scale").unwrap();
    let cfg = LaunchConfig::for_elements(64, 64);
    let capture = stream.begin_capture().unwrap();
    // SAFETY: captured; `scale` touches the 64 floats of `x`, which the graph keeps.
    unsafe { scale.launch(&capture, &cfg, (&mut x, 2.0f32, 64u32)) }.unwrap();
    let exec = capture.end().unwrap().instantiate().unwrap();
    let captured = &recorder.launches()[0];
    assert_eq!(captured.kind(), LaunchKind::Kernel);
    assert!(captured.is_captured(), "{captured}");
    assert_eq!(captured.kernel(), Some("elementwise::scale"));
    // SAFETY: the graph keeps `x`, which its one node scales.
    unsafe { exec.launch(&stream) }.unwrap();
    stream.synchronize().unwrap();
    let launches = recorder.launches();
    let replay = &launches[0];
    assert_eq!(replay.kind(), LaunchKind::Graph);
    assert_eq!(replay.stream(), stream.raw());
    assert!(!replay.is_captured());
    assert!(replay.sequence() > launches[1].sequence(), "newest first");
    assert_eq!(launches.len(), 2);
}

#[test]
fn the_ring_keeps_its_capacity_of_newest_launches() {
    standin::run(the_ring_keeps_the_newest_launches, &[]);
}

/// 50 good launches of `elementwise::scale`, alternating between two streams, then
/// `faults::write_far` on the first; returns the first stream, the buffer and the error of the
/// synchronize that finds the context lost.
fn fifty_launches_then_a_fault(
    demo: &AtlasRegistry,
    faults: &AtlasRegistry,
) -> (CudaStream, CudaStream, DeviceBuffer<f32>, AtlasError) {
    let (first, second) = (
        CudaStream::new(demo.ctx()).expect("stream"),
        CudaStream::new(demo.ctx()).expect("stream"),
    );
    let mut x = DeviceBuffer::from_slice(demo.ctx(), &first, &[1.0f32; 256]).expect("upload");
    let scale = demo.function_cached("elementwise", "scale").expect("scale");
    let cfg = LaunchConfig::for_elements(256, 128);
    for i in 0..50 {
        let stream = if i % 2 == 0 { &first } else { &second };
        // SAFETY: `x` holds the 256 floats `scale` touches and lives past the synchronize below.
        unsafe { scale.launch(stream, &cfg, (&mut x, 1.0f32, 256u32)) }.expect("a good launch");
    }
    first.synchronize().expect("the good launches");
    second.synchronize().expect("the good launches");
    let far = faults
        .function_cached("faults", "write_far")
        .expect("write_far");
    // SAFETY: NOT in bounds, on purpose: write_far writes far past `x`, an illegal address that
    // loses the context. That is the case under test, in a child process.
    let launched = unsafe { far.launch(&first, &LaunchConfig::for_elements(1, 1), (&x,)) };
    println!("the faulting launch: {launched:?}");
    let error = first.synchronize().expect_err("the context is lost");
    (first, second, x, error)
}

/// What every fault test checks of the report: the faulting kernel is the newest launch on its
/// stream, the good ones follow newest first, the other stream's are unmarked.
fn check_report(
    error: &AtlasError,
    first: &CudaStream,
    second: &CudaStream,
    x: &DeviceBuffer<f32>,
    log_expected: bool,
) -> FaultReport {
    assert!(error.is_context_lost(), "{error:?}");
    let report = error
        .fault_report()
        .expect("a lost context carries a report")
        .clone();
    assert!(report.was_recording());
    assert_eq!(report.failing_stream(), Some(first.raw()));
    let launches = report.launches();
    assert_eq!(
        launches.len(),
        51,
        "50 good launches and the faulting one: {report:?}"
    );
    assert!(
        launches
            .windows(2)
            .all(|w| w[0].sequence() > w[1].sequence()),
        "newest first"
    );
    let on_first: Vec<_> = report.failing_stream_launches().collect();
    assert_eq!(
        on_first.len(),
        26,
        "25 good launches and the fault on the failing stream"
    );
    let newest = on_first[0];
    assert_eq!(newest.kernel(), Some("faults::write_far"), "{newest}");
    assert_eq!(newest.parts(), Some(("faults", "write_far")));
    assert_eq!(newest.kind(), LaunchKind::Kernel);
    assert_eq!((newest.grid(), newest.block()), ((1, 1, 1), (1, 1, 1)));
    assert_eq!(newest.argument_count(), 1);
    assert_eq!(newest.arguments()[0].size(), 8);
    assert_eq!(
        newest.arguments()[0].value(),
        Some(x.device_ptr()),
        "the buffer's address"
    );
    assert!(!newest.is_captured());
    for good in &on_first[1..] {
        assert_eq!(good.kernel(), Some("elementwise::scale"), "{good}");
        assert_eq!(good.stream(), first.raw());
        let sizes: Vec<_> = good.arguments().iter().map(|a| a.size()).collect();
        assert_eq!(sizes, [8, 4, 4]);
        assert_eq!(good.arguments()[0].value(), Some(x.device_ptr()));
        assert_eq!(
            good.arguments()[1].value(),
            Some(u64::from(1.0f32.to_bits()))
        );
        assert_eq!(good.arguments()[2].value(), Some(256));
        assert_eq!((good.grid(), good.block()), ((2, 1, 1), (128, 1, 1)));
    }
    let others: Vec<_> = launches.iter().filter(|l| !l.on_failing_stream()).collect();
    assert_eq!(others.len(), 25);
    assert!(others.iter().all(|l| l.stream() == second.raw()));
    let text = error.to_string();
    let named = text
        .find("faults::write_far")
        .expect("the text names the faulting kernel");
    let good = text
        .find("elementwise::scale")
        .expect("and the launches before it");
    assert!(named < good, "newest first: {text}");
    assert!(text.contains("restart"), "{text}");
    assert_eq!(report.driver_log().is_some(), log_expected, "{text}");
    println!("{text}");
    report
}

fn a_fault_among_fifty_launches_is_named_first_on_its_stream() {
    let (demo, faults) = (load("demo"), load("faults"));
    let (first, second, x, error) = fifty_launches_then_a_fault(&demo, &faults);
    check_report(&error, &first, &second, &x, false);
    // A later call that takes no stream reports every launch as possibly the failing stream's.
    let later = DeviceBuffer::<f32>::alloc(demo.ctx(), 16).expect_err("the context is lost");
    let report = later.fault_report().expect("a report");
    assert_eq!(report.failing_stream(), None);
    assert_eq!(report.failing_stream_launches().count(), 51);
    assert_eq!(report.launches()[0].kernel(), Some("faults::write_far"));
}

fn switched_off_nothing_is_recorded() {
    let (demo, faults) = (load("demo"), load("faults"));
    let recorder = demo.host().flight_recorder();
    assert!(recorder.is_enabled(), "on by default");
    recorder.set_enabled(false);
    let (_first, _second, _x, error) = fifty_launches_then_a_fault(&demo, &faults);
    assert!(recorder.launches().is_empty());
    let report = error.fault_report().expect("a report");
    assert!(report.launches().is_empty() && !report.was_recording());
    let text = error.to_string();
    assert!(text.contains("flight recorder was off"), "{text}");
    assert!(!text.contains("elementwise::scale"), "{text}");
}

fn recording_is_one_driver_call_and_no_allocation() {
    let p = probe();
    let registry = load("demo");
    assert!(registry.host().flight_recorder().is_enabled());
    let stream = CudaStream::new(registry.ctx()).unwrap();
    let mut x = DeviceBuffer::from_slice(registry.ctx(), &stream, &[1.0f32; 64]).unwrap();
    let scale = registry.function_cached("elementwise", "scale").unwrap();
    let raw = registry
        .raw_function_cached("elementwise", "scale")
        .unwrap();
    let cfg = LaunchConfig::for_elements(64, 64);
    let (mut ptr, mut factor, mut count) = (x.device_ptr(), 1.0f32, 64u32);
    let mut launch_both = |x: &mut DeviceBuffer<f32>| {
        // SAFETY: `x` holds the 64 floats `scale` touches; synchronized before it is dropped.
        unsafe {
            scale
                .launch(&stream, &cfg, (&mut *x, 1.0f32, 64u32))
                .unwrap();
            let mut params: [*mut c_void; 3] = [
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
    let (calls, allocated) = (p.count("calls"), allocations());
    for _ in 0..50 {
        launch_both(&mut x);
    }
    assert_eq!(allocations(), allocated, "a recorded launch allocated");
    assert_eq!(
        p.count("calls") - calls,
        100,
        "only cuLaunchKernel reached the driver"
    );
    stream.synchronize().unwrap();
    let launches = registry.host().flight_recorder().launches();
    assert_eq!(launches.len(), RING_SLOTS.min(102));
    // The raw launch of a registry's kernel is named and its arguments read by the layout.
    let raw_launch = &launches[0];
    assert_eq!(raw_launch.kernel(), Some("elementwise::scale"));
    assert_eq!(raw_launch.arguments().len(), 3);
    assert_eq!(raw_launch.arguments()[2].value(), Some(64));
}

fn threads_launching_while_one_reads_never_tear_a_record() {
    let registry = load("demo");
    let scale = registry.function_cached("elementwise", "scale").unwrap();
    let recorder = registry.host().flight_recorder();
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let launchers: Vec<_> = (1..=6u32)
            .map(|thread| {
                let (registry, scale) = (&registry, &scale);
                scope.spawn(move || {
                    let stream = CudaStream::new(registry.ctx()).unwrap();
                    let mut x = DeviceBuffer::<f32>::zeroed(registry.ctx(), &stream, 64).unwrap();
                    for _ in 0..400 {
                        // Each thread's launches differ in every field the record keeps: grid,
                        // block, stream, arguments.
                        let cfg = LaunchConfig {
                            grid: (thread, thread, 1),
                            block: (thread, 1, 1),
                            shared_mem_bytes: 0,
                        };
                        // SAFETY: `scale` touches `thread` floats of `x`'s 64; synchronized
                        // below.
                        unsafe { scale.launch(&stream, &cfg, (&mut x, thread as f32, thread)) }
                            .unwrap();
                    }
                    stream.synchronize().unwrap();
                })
            })
            .collect();
        let reader = scope.spawn(|| {
            let mut reads = 0;
            while !done.load(Ordering::Relaxed) || reads < 50 {
                for record in recorder.launches() {
                    let thread = record.grid().0;
                    assert_eq!(record.grid(), (thread, thread, 1), "torn: {record}");
                    assert_eq!(record.block(), (thread, 1, 1), "torn: {record}");
                    let values: Vec<_> = record.arguments().iter().map(|a| a.value()).collect();
                    assert_eq!(
                        values[1..],
                        [
                            Some(u64::from((thread as f32).to_bits())),
                            Some(u64::from(thread))
                        ],
                        "torn: {record}"
                    );
                }
                reads += 1;
            }
            reads
        });
        for launcher in launchers {
            launcher.join().expect("a launching thread");
        }
        done.store(true, Ordering::Relaxed);
        println!("reads: {}", reader.join().expect("the reader"));
    });
    assert_eq!(recorder.launches().len(), RING_SLOTS);
    println!("records given up: {}", recorder.given_up());
}

fn the_ring_keeps_the_newest_launches() {
    let registry = load("demo");
    let noop = registry.function_cached("noop", "noop").unwrap();
    let stream = registry.stream();
    for i in 1..=200u32 {
        let cfg = LaunchConfig::for_elements(i, 1);
        // SAFETY: `noop` takes no arguments and touches no memory.
        unsafe { noop.launch(stream, &cfg, ()) }.unwrap();
    }
    let launches = registry.host().flight_recorder().launches();
    assert_eq!(launches.len(), RING_SLOTS);
    let grids: Vec<_> = launches.iter().map(|l| l.grid().0).collect();
    let expected: Vec<_> = (200 - RING_SLOTS as u32 + 1..=200).rev().collect();
    assert_eq!(grids, expected, "the newest, newest first");
    assert!(launches.iter().all(|l| l.argument_count() == 0));
}

#[test]
fn a_launch_the_driver_refuses_is_not_recorded_and_its_slot_serves_the_next() {
    standin::run(a_refused_launch_leaves_no_record, &[]);
}

/// A launch's record is written before the driver call and withdrawn when the driver refuses
/// the launch: never read, and its slot free for a later launch.
fn a_refused_launch_leaves_no_record() {
    let registry = load("demo");
    let noop = registry.function_cached("noop", "noop").unwrap();
    let (stream, recorder) = (registry.stream(), registry.host().flight_recorder());
    let launch = |blocks: u32| {
        let cfg = LaunchConfig::for_elements(blocks, 1);
        // SAFETY: `noop` takes no arguments and touches no memory.
        unsafe { noop.launch(stream, &cfg, ()) }
    };
    launch(1).unwrap();
    launch(2).unwrap();
    probe().inject("cuLaunchKernel", 1, 1); // CUDA_ERROR_INVALID_VALUE
    let refused = launch(3).expect_err("the driver refuses it");
    assert!(matches!(refused, AtlasError::Launch { .. }), "{refused}");
    let grids = |recorder: &atlas_registry::FlightRecorder| -> Vec<u32> {
        recorder.launches().iter().map(|l| l.grid().0).collect()
    };
    assert_eq!(grids(recorder), [2, 1], "the refused launch left no record");
    // Around the ring and past the refused launch's slot: every slot holds a launch again.
    for blocks in 4..4 + RING_SLOTS as u32 {
        launch(blocks).unwrap();
    }
    let expected: Vec<u32> = (4..4 + RING_SLOTS as u32).rev().collect();
    assert_eq!(grids(recorder), expected);
    assert_eq!(recorder.given_up(), 0);
}

#[test]
fn each_device_numbers_its_own_launches_and_keeps_a_full_ring() {
    standin::run(
        two_devices_launching_in_turn_keep_a_full_ring_each,
        &["-DSTANDIN_DEVICES=2"],
    );
}

fn two_devices_launching_in_turn_keep_a_full_ring_each() {
    let registries = [0, 1].map(|ordinal| {
        AtlasRegistry::load(ordinal, ptx_for_model("demo").expect("demo")).expect("loading demo")
    });
    let noops = registries
        .each_ref()
        .map(|r| r.function_cached("noop", "noop").expect("noop"));
    for i in 1..=100u32 {
        for (registry, noop) in registries.iter().zip(&noops) {
            let cfg = LaunchConfig::for_elements(i, 1);
            // SAFETY: `noop` takes no arguments and touches no memory.
            unsafe { noop.launch(registry.stream(), &cfg, ()) }.expect("a launch");
        }
    }
    for (ordinal, registry) in registries.iter().enumerate() {
        let launches = registry.host().flight_recorder().launches();
        let numbers: Vec<_> = launches.iter().map(|l| l.sequence()).collect();
        let expected: Vec<_> = (100 - RING_SLOTS as u64 + 1..=100).rev().collect();
        assert_eq!(
            numbers, expected,
            "device {ordinal}: its last {RING_SLOTS} launches, numbered on the device"
        );
        assert!(launches.iter().all(|l| l.device() == ordinal));
    }
}

// ---------------------------------------------------------------------------------------------
// GPU
// ---------------------------------------------------------------------------------------------

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_a_fault_is_named_among_the_launches_of_its_stream() {
    atlas_registry::device_count().expect(NEEDS_GPU);
    let child = child::run_on(gpu_fault_among_fifty_launches, None);
    child.print_tail("flight recorder");
    assert_eq!(
        child.ending,
        Ending::Passed,
        "{}\n{}",
        child.stdout,
        child.stderr
    );
    assert!(child.stdout.contains("CHILD done"), "{}", child.stdout);
}

/// In a child on the GPU: the real `faults::write_far` among 50 launches of `elementwise::scale`
/// on two streams; the report names it first on its stream, and holds the driver's log where the
/// driver keeps one (CUDA 12.9+: the H200's 580 driver does).
fn gpu_fault_among_fifty_launches() {
    let (demo, faults) = (load("demo"), load("faults"));
    let (first, second, x, error) = fifty_launches_then_a_fault(&demo, &faults);
    let keeps_log = driver_version() >= 12090;
    let report = check_report(&error, &first, &second, &x, keeps_log);
    if let Some(log) = report.driver_log() {
        println!("CHILD driver log:\n{log}");
    }
    println!("CHILD done");
}

/// The driver's CUDA version (`cuDriverGetVersion`), as `1000 * major + 10 * minor`.
fn driver_version() -> i32 {
    let cuda = atlas_registry::sys::driver().expect(NEEDS_GPU);
    let f = atlas_registry::sys::resolve(&cuda.cuDriverGetVersion, "cuDriverGetVersion")
        .expect("cuDriverGetVersion");
    let mut version = 0;
    // SAFETY: a live out-pointer; the call only writes the version.
    unsafe { f(&mut version) };
    version
}
