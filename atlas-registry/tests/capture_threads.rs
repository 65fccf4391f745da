//! Captures beside other threads' work. The driver crashes when work is enqueued into a stream
//! while another thread begins or ends its capture; a capture borrows its stream mutably, so that
//! cannot be written (`Capture`'s docs hold the `compile_fail` examples), and other threads launch
//! into a capture only through `&Capture`, between its begin and its end. What those launches use
//! is kept by the graph. A free that synchronizes a device (memory graphs used) waits for that
//! device's captures, holds off new ones while it runs, and no lock meanwhile.
//!
//! Stand-in (CI): `cargo test -p atlas-registry --test capture_threads`. The stand-in counts a
//! launch into a stream whose capture is beginning or ending ("capture_race"), two calls on one
//! graph at once ("graph_race"), and a capture begun in a context being synchronized
//! ("capture_during_sync"). GPU: `-- --include-ignored` (the stress runs 60 s, or
//! `ATLAS_CAPTURE_STRESS_SECS`).

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use atlas_kernels::ptx_for_model;
use atlas_registry::sys::CUdeviceptr;
use atlas_registry::{AtlasRegistry, CudaFunction, CudaStream, DeviceBuffer, LaunchConfig};
use support::child::{self, Ending};
use support::reference::assert_close;
use support::rng::Rng;
use support::spin::spin_registry;
use support::standin::{self, probe};

child::bodies!(
    launches_through_a_capture_from_other_threads_are_held,
    no_race_was_counted_after_the_threads,
    an_empty_capture_instantiates_and_replays,
    graph_memory_freed_during_captures_waits_for_its_device_only,
    a_synchronizing_free_holds_off_captures_of_its_device_only,
    a_capture_begun_while_graph_memory_is_freed_is_not_invalidated,
);

/// Threads launching into each capture.
const THREADS: usize = 4;
/// Launches each of them makes into one capture.
const LAUNCHES: usize = 3;
/// Captures made in a stand-in run; on a GPU the stress runs for a time instead.
const ROUNDS: usize = 12;
/// How long the GPU stress runs unless `ATLAS_CAPTURE_STRESS_SECS` says otherwise.
const STRESS_SECS: u64 = 60;

fn demo(ordinal: usize) -> AtlasRegistry {
    AtlasRegistry::load(ordinal, ptx_for_model("demo").unwrap()).unwrap()
}

fn scale_of(registry: &AtlasRegistry) -> CudaFunction {
    registry.function("elementwise", "scale").unwrap()
}

/// `n` floats read back from `ptr` (memory a graph keeps), through `stream`.
fn read(stream: &CudaStream, ptr: CUdeviceptr, n: usize) -> Vec<f32> {
    let mut got = vec![f32::NAN; n];
    // SAFETY: `ptr` holds `n` floats that a live graph keeps allocated; `got` has room for them
    // and is read only after the stream is synchronized.
    unsafe { atlas_registry::copy_to_host_async(stream, got.as_mut_ptr().cast(), ptr, n * 4) }
        .unwrap();
    stream.synchronize().unwrap();
    got
}

/// One round: `THREADS` threads each upload fresh data to a buffer of their own, launch `scale`
/// into the capture `LAUNCHES` times with it, and drop it. The graph must keep the registry and
/// every buffer (`kept_count`), hold one kernel node per launch, and replay what the CPU computes.
fn capture_round(registry: &AtlasRegistry, stream: &mut CudaStream, rng: &mut Rng) {
    let ctx = registry.ctx();
    let scale = scale_of(registry);
    let n = 64 + rng.index(4000);
    let cfg = LaunchConfig::for_elements(n as u32, 256);
    let inputs: Vec<(Vec<f32>, f32)> = (0..THREADS)
        .map(|_| (rng.vec(n), rng.f32_in(0.5, 1.5)))
        .collect();
    let capture = stream.begin_capture().unwrap();
    let made: Vec<CUdeviceptr> = std::thread::scope(|s| {
        let workers: Vec<_> = inputs
            .iter()
            .map(|(data, factor)| {
                let (capture, scale, cfg) = (&capture, &scale, &cfg);
                s.spawn(move || {
                    let upload = CudaStream::new(ctx).unwrap();
                    let mut x = DeviceBuffer::from_slice(ctx, &upload, data).unwrap();
                    for _ in 0..LAUNCHES {
                        // SAFETY: captured, not run: at each replay `scale` touches the `n` floats
                        // of `x`, which the graph keeps allocated after `x` is dropped below.
                        unsafe { scale.launch(capture, cfg, (&mut x, *factor, n as u32)) }.unwrap();
                    }
                    x.device_ptr()
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let graph = capture.end().unwrap();
    assert_eq!(
        graph.kept_count(),
        1 + THREADS,
        "the registry and every buffer launched from another thread"
    );
    let exec = graph.instantiate().unwrap();
    assert_eq!(exec.kernel_count(), THREADS * LAUNCHES);
    // SAFETY: the graph reaches only the buffers it keeps.
    unsafe { exec.launch(&*stream) }.unwrap();
    for (ptr, (data, factor)) in made.iter().zip(&inputs) {
        let want: Vec<f32> = data
            .iter()
            .map(|v| v * factor.powi(LAUNCHES as i32))
            .collect();
        assert_close(&read(stream, *ptr, n), &want, 1e-5, "a replayed capture");
    }
}

/// Another thread's work all the while: captures of a stream of its own (begun, launched into,
/// ended, instantiated, replayed) and eager launches on another, until `stop`.
fn other_work(registry: &AtlasRegistry, stop: &AtomicBool, rounds: &AtomicUsize) {
    let ctx = registry.ctx();
    let scale = scale_of(registry);
    let (mut captured, eager) = (CudaStream::new(ctx).unwrap(), CudaStream::new(ctx).unwrap());
    let mut rng = Rng::new();
    let n = 256;
    let cfg = LaunchConfig::for_elements(n as u32, 256);
    let data = rng.vec(n);
    let mut x = DeviceBuffer::from_slice(ctx, &eager, &data).unwrap();
    let mut y = DeviceBuffer::from_slice(ctx, &eager, &data).unwrap();
    let mut times = 0;
    while !stop.load(Ordering::Relaxed) || times < 3 {
        let capture = captured.begin_capture().unwrap();
        // SAFETY: captured: at its replay `scale` touches the `n` floats of `y`, kept by the graph.
        unsafe { scale.launch(&capture, &cfg, (&mut y, 1.0f32, n as u32)) }.unwrap();
        let exec = capture.end().unwrap().instantiate().unwrap();
        // SAFETY: the graph reaches only `y`, which it keeps.
        unsafe { exec.launch(&captured) }.unwrap();
        for _ in 0..8 {
            // SAFETY: `x` holds the `n` floats `scale` touches and outlives the launch (`to_vec`
            // below waits for it on the same stream).
            unsafe { scale.launch(&eager, &cfg, (&mut x, 1.0f32, n as u32)) }.unwrap();
        }
        times += 1;
    }
    assert_eq!(x.to_vec(&eager).unwrap(), data, "scaled by 1");
    captured.synchronize().unwrap();
    assert_eq!(y.to_vec(&captured).unwrap(), data, "scaled by 1");
    rounds.store(times, Ordering::Relaxed);
}

/// Rounds of [`capture_round`] beside [`other_work`]: `ROUNDS` of them, or, where
/// `ATLAS_CAPTURE_STRESS_SECS` is set, as many as fit in that many seconds.
fn launches_through_a_capture_from_other_threads_are_held() {
    let registry = demo(0);
    let mut stream = CudaStream::new(registry.ctx()).unwrap();
    let mut rng = Rng::new();
    let seconds = std::env::var("ATLAS_CAPTURE_STRESS_SECS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok());
    let (stop, other_rounds) = (AtomicBool::new(false), AtomicUsize::new(0));
    let start = Instant::now();
    let mut rounds = 0;
    std::thread::scope(|s| {
        s.spawn(|| other_work(&registry, &stop, &other_rounds));
        let more = |rounds: usize| match seconds {
            Some(seconds) => start.elapsed() < Duration::from_secs(seconds),
            None => rounds < ROUNDS,
        };
        while more(rounds) {
            capture_round(&registry, &mut stream, &mut rng);
            rounds += 1;
        }
        stop.store(true, Ordering::Relaxed);
    });
    println!(
        "{rounds} captures of {} launches from {THREADS} threads each, beside {} captures and \
         eager launches of another thread, in {:.1} s",
        THREADS * LAUNCHES,
        other_rounds.load(Ordering::Relaxed),
        start.elapsed().as_secs_f64()
    );
}

#[test]
fn launches_from_other_threads_into_a_capture_are_held_and_race_no_transition() {
    standin::run(no_race_was_counted_after_the_threads, &[]);
}

/// The same rounds, then the stand-in's counts of what the driver does not survive.
fn no_race_was_counted_after_the_threads() {
    launches_through_a_capture_from_other_threads_are_held();
    let p = probe();
    assert_eq!(
        p.count("capture_race"),
        0,
        "a launch met a capture's begin or end"
    );
    assert_eq!(p.count("graph_race"), 0, "two calls used one graph at once");
    assert_eq!(p.count("stale_handle"), 0);
    assert_eq!(p.count("fault"), 0, "a replay read freed memory");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_launches_through_captures_beside_other_captures_never_crash() {
    let seconds =
        std::env::var("ATLAS_CAPTURE_STRESS_SECS").unwrap_or_else(|_| STRESS_SECS.to_string());
    let seconds_os = std::ffi::OsString::from(&seconds);
    let child = child::run_with_env(
        launches_through_a_capture_from_other_threads_are_held,
        None,
        &[("ATLAS_CAPTURE_STRESS_SECS", seconds_os.as_os_str())],
    );
    child.print_tail("the capture stress");
    assert_eq!(child.ending, Ending::Passed, "{child}");
}

/// A capture with nothing in it: ended, instantiated and replayed, with no driver call that fails
/// (the driver refuses to be asked for zero graph nodes).
fn an_empty_capture_instantiates_and_replays() {
    let registry = demo(0);
    let mut stream = CudaStream::new(registry.ctx()).unwrap();
    let graph = stream.begin_capture().unwrap().end().unwrap();
    assert_eq!(graph.kept_count(), 0);
    let exec = graph.instantiate().unwrap();
    assert_eq!(exec.kernel_count(), 0);
    // SAFETY: the graph launches nothing.
    unsafe { exec.launch(&stream) }.unwrap();
    stream.synchronize().unwrap();
}

#[test]
fn an_empty_capture_is_a_graph_of_no_kernels() {
    standin::run(an_empty_capture_instantiates_and_replays, &[]);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_an_empty_capture_is_a_graph_of_no_kernels() {
    let child = child::run_on(an_empty_capture_instantiates_and_replays, None);
    assert_eq!(child.ending, Ending::Passed, "{child}");
}

/// A graph of `registry` keeping one buffer of fresh data, scaled by `factor` at its replay;
/// the buffer itself is dropped. Returns the executable graph and the buffer's address.
fn graph_keeping_a_buffer(
    registry: &AtlasRegistry,
    stream: &mut CudaStream,
    factor: f32,
) -> (atlas_registry::GraphExec, CUdeviceptr) {
    let ctx = registry.ctx();
    let n = 512;
    let mut x = DeviceBuffer::from_slice(ctx, &*stream, &Rng::new().vec(n)).unwrap();
    let capture = stream.begin_capture().unwrap();
    // SAFETY: captured: at a replay `scale` touches the `n` floats of `x`, kept by the graph.
    unsafe {
        scale_of(registry).launch(
            &capture,
            &LaunchConfig::for_elements(n as u32, 256),
            (&mut x, factor, n as u32),
        )
    }
    .unwrap();
    let exec = capture.end().unwrap().instantiate().unwrap();
    (exec, x.device_ptr())
}

/// Two devices. While device 0 is being captured, a graph of device 1 that is the last to use a
/// buffer goes: its free (a synchronize of device 1, then `cuMemFree`) is made at once. A graph
/// of device 0 going meanwhile leaves its free until device 0's capture ends (the synchronize
/// would invalidate it), and the capture ends valid.
fn graph_memory_freed_during_captures_waits_for_its_device_only() {
    let p = probe();
    let (r0, r1) = (demo(0), demo(1));
    let (mut s0, mut s1) = (
        CudaStream::new(r0.ctx()).unwrap(),
        CudaStream::new(r1.ctx()).unwrap(),
    );
    let (exec0, _) = graph_keeping_a_buffer(&r0, &mut s0, 2.0);
    let (exec1, _) = graph_keeping_a_buffer(&r1, &mut s1, 2.0);
    let live = p.count("live_allocations");
    let frees = p.count("cuMemFree_v2");
    let mut capturing = CudaStream::new(r0.ctx()).unwrap();
    let capture = capturing.begin_capture().unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            drop(exec1);
            assert_eq!(
                p.count("cuMemFree_v2"),
                frees + 1,
                "device 1's memory is freed while device 0 is being captured"
            );
            drop(exec0);
            assert_eq!(
                p.count("cuMemFree_v2"),
                frees + 1,
                "device 0's memory waits for device 0's capture"
            );
        });
    });
    assert!(capture.is_capturing().unwrap());
    let graph = capture.end().unwrap();
    assert_eq!(
        p.count("cuMemFree_v2"),
        frees + 2,
        "freed as the capture ended"
    );
    assert_eq!(p.count("live_allocations"), live - 2);
    drop(graph);
}

#[test]
fn a_free_of_graph_memory_waits_for_the_captures_of_its_device_only() {
    standin::run(
        graph_memory_freed_during_captures_waits_for_its_device_only,
        &["-DSTANDIN_DEVICES=2"],
    );
}

/// Two devices; the stand-in's synchronize waits for a launch made after it began (device work
/// that waits for a host thread). One thread frees graph memory of device 0 (a synchronize of
/// device 0); meanwhile another begins a capture of device 1 and launches into it, which lets the
/// synchronize finish: no lock of Atlas's is held through the synchronize. A third thread begins a
/// capture of device 0 meanwhile: it begins only once the synchronize is over.
fn a_synchronizing_free_holds_off_captures_of_its_device_only() {
    let p = probe();
    let (r0, r1) = (demo(0), demo(1));
    let mut s0 = CudaStream::new(r0.ctx()).unwrap();
    let (exec0, _) = graph_keeping_a_buffer(&r0, &mut s0, 2.0);
    let syncs = p.count("cuCtxSynchronize");
    let freed = AtomicBool::new(false);
    let scale1 = scale_of(&r1);
    let mut x1 = DeviceBuffer::from_slice(r1.ctx(), r1.stream(), &[1.0f32; 32]).unwrap();
    let (mut c1, mut c0) = (
        CudaStream::new(r1.ctx()).unwrap(),
        CudaStream::new(r0.ctx()).unwrap(),
    );
    std::thread::scope(|s| {
        s.spawn(|| {
            drop(exec0);
            freed.store(true, Ordering::Release);
        });
        while p.count("cuCtxSynchronize") == syncs {
            std::thread::yield_now();
        }
        s.spawn(|| {
            // Waits for the synchronize of its device, then captures as usual. The stand-in counts
            // a capture begun while the synchronize runs (`capture_during_sync`, below); the free's
            // own end (its `cuMemFree` after the synchronize, then `freed`) may come after this
            // begin, so `freed` says nothing here.
            let capture = c0.begin_capture().unwrap();
            drop(capture.end().unwrap());
        });
        let capture = c1.begin_capture().unwrap();
        let cfg = LaunchConfig::for_elements(32, 32);
        let mut launched = 0;
        while !freed.load(Ordering::Acquire) && launched < 5000 {
            // SAFETY: captured, not run: `scale` would touch the 32 floats of `x1`, kept by the
            // graph.
            unsafe { scale1.launch(&capture, &cfg, (&mut x1, 1.0f32, 32u32)) }.unwrap();
            launched += 1;
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(capture.end().unwrap());
    });
    assert_eq!(
        p.count("sync_waited_out"),
        0,
        "the synchronize was waited out"
    );
    assert_eq!(
        p.count("capture_during_sync"),
        0,
        "a capture began during the synchronize"
    );
}

#[test]
fn a_synchronizing_free_holds_no_lock_and_only_its_devices_captures() {
    standin::run(
        a_synchronizing_free_holds_off_captures_of_its_device_only,
        &["-DSTANDIN_DEVICES=2", "-DSTANDIN_SLOW_SYNC"],
    );
}

/// On the GPU: a graph that is the last to use a buffer goes while a 0.5 s kernel runs on another
/// stream, so its free synchronizes the device for that long; a capture begun meanwhile on the
/// same device waits for the synchronize (which would invalidate it) and ends valid, with its
/// launch.
fn a_capture_begun_while_graph_memory_is_freed_is_not_invalidated() {
    let registry = demo(0);
    let spin = spin_registry(0);
    let ctx = registry.ctx();
    let mut stream = CudaStream::new(ctx).unwrap();
    let (exec, _) = graph_keeping_a_buffer(&registry, &mut stream, 2.0);
    let busy = CudaStream::new(ctx).unwrap();
    let cycles = 1_000_000_000u64; // about 0.5 s at 2 GHz
    let spin_fn = spin.function("spin", "spin").unwrap();
    let mut capturing = CudaStream::new(ctx).unwrap();
    let scale = scale_of(&registry);
    let mut x = DeviceBuffer::from_slice(ctx, &stream, &[1.0f32; 32]).unwrap();
    // SAFETY: spin touches no memory.
    unsafe { spin_fn.launch(&busy, &LaunchConfig::for_elements(1, 1), (cycles,)) }.unwrap();
    let dropping = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            dropping.store(true, Ordering::Release);
            drop(exec); // synchronizes the device: waits for the spin
        });
        while !dropping.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        std::thread::sleep(Duration::from_millis(50));
        let capture = capturing.begin_capture().unwrap();
        // SAFETY: captured: at its replay `scale` touches the 32 floats of `x`, kept by the graph.
        unsafe {
            scale.launch(
                &capture,
                &LaunchConfig::for_elements(32, 32),
                (&mut x, 3.0f32, 32u32),
            )
        }
        .unwrap();
        let exec = capture.end().unwrap().instantiate().unwrap();
        assert_eq!(exec.kernel_count(), 1);
        // SAFETY: the graph reaches only `x`, which it keeps.
        unsafe { exec.launch(&capturing) }.unwrap();
        capturing.synchronize().unwrap();
    });
    assert_eq!(x.to_vec(&stream).unwrap(), [3.0f32; 32]);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_a_capture_begun_while_graph_memory_is_freed_is_not_invalidated() {
    let child = child::run_on(
        a_capture_begun_while_graph_memory_is_freed_is_not_invalidated,
        None,
    );
    assert_eq!(child.ending, Ending::Passed, "{child}");
}

/// Other threads launch into a capture through `&Capture`: it is `Sync` (and `!Send`, which a
/// `compile_fail` example of its docs checks).
#[test]
fn a_capture_is_shared_between_threads() {
    fn sync<T: Sync>() {}
    sync::<atlas_registry::Capture<'static>>();
}
