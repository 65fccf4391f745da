//! A clean program makes no driver call that fails: a user who runs their tests under
//! `compute-sanitizer --error-exitcode N` (which reports every failed driver call as an error) is
//! never failed by Atlas's own calls.
//!
//! The program (typed and raw launches through every kind of handle, a shared memory opt-in,
//! copies to buffers and `__device__` symbols, stream-ordered memory, a capture) runs in a child
//! whose driver is a recorder (`support/shim.rs`) in front of the stand-in libcuda (CI) or of the
//! real driver (GPU), which keeps every call answered with anything but `CUDA_SUCCESS`; the test
//! asserts there were none. On a GPU the capture is also replayed and its arguments changed.
//! `tests/gpu/nvidia_tools.sh` runs the in-process GPU tests below under compute-sanitizer and
//! Nsight Compute.

mod support;

use std::ffi::c_void;
use std::path::Path;

use atlas_kernels::{blobs_for_device, ptx_for_model};
use atlas_registry::{
    AtlasLibrary, AtlasRegistry, CudaStream, DeviceBuffer, FunctionCache, LaunchConfig, host,
    release,
};
use support::child::{self, Ending};
use support::reference::assert_close;
use support::rng::Rng;
use support::{shim, standin};

child::bodies!(
    clean_program_captures_only_then_no_call_failed,
    clean_program_with_replays_then_no_call_failed,
    failed_calls_are_recorded_in_order,
);

/// What the other tests rely on: the recorder sees the calls that fail, and passes every call and
/// its answer through.
#[test]
fn the_recorder_keeps_each_failed_call() {
    let recorder = shim::recorder(&standin::build(&[]));
    let child = child::run_on(failed_calls_are_recorded_in_order, Some(&recorder));
    assert_eq!(child.ending, Ending::Passed, "{child}");
}

fn failed_calls_are_recorded_in_order() {
    use atlas_registry::sys::{CUresult, driver, entry};
    let driver = driver().expect("the recorder loads as a driver");
    let init = entry!(driver, cuInit).unwrap();
    let device_get = entry!(driver, cuDeviceGet).unwrap();
    let launch = entry!(driver, cuLaunchKernel).unwrap();
    use std::ptr::null_mut;
    let mut device = -1;
    // SAFETY: plain values and a live out-pointer; the launch of a null function is refused by the
    // stand-in before it looks at anything else.
    let (bad_device, good_device, bad_launch) = unsafe {
        assert_eq!(init(0), CUresult::CUDA_SUCCESS);
        (
            device_get(&mut device, 99),
            device_get(&mut device, 0),
            launch(
                null_mut(),
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                null_mut(),
                null_mut(),
                null_mut(),
            ),
        )
    };
    assert_eq!(bad_device, CUresult::CUDA_ERROR_INVALID_DEVICE);
    assert_eq!((good_device, device), (CUresult::CUDA_SUCCESS, 0));
    assert_ne!(bad_launch, CUresult::CUDA_SUCCESS);
    assert_eq!(
        shim::failed_calls(),
        [
            ("cuDeviceGet".to_string(), bad_device.0),
            ("cuLaunchKernel".to_string(), bad_launch.0),
        ]
    );
}

#[test]
fn a_clean_program_makes_no_failing_driver_call() {
    let recorder = shim::recorder(&standin::build(&[]));
    let child = child::run_on(
        clean_program_captures_only_then_no_call_failed,
        Some(&recorder),
    );
    assert_eq!(child.ending, Ending::Passed, "{child}");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_a_clean_program_makes_no_failing_driver_call() {
    let recorder = shim::recorder(Path::new("libcuda.so.1"));
    let child = child::run_on(
        clean_program_with_replays_then_no_call_failed,
        Some(&recorder),
    );
    assert_eq!(child.ending, Ending::Passed, "{child}");
}

/// The program on the real driver, in this process: what `tests/gpu/nvidia_tools.sh` runs under
/// each compute-sanitizer tool.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_clean_program() {
    clean_program(Replay::Yes);
}

/// A short loop of launches, checked against the CPU: what `tests/gpu/nvidia_tools.sh` profiles.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_launch_loop() {
    const ROUNDS: usize = 200;
    let registry = AtlasRegistry::load(0, ptx_for_model("demo").unwrap())
        .unwrap_or_else(|e| panic!("this test needs an NVIDIA GPU: {e}"));
    let stream = registry.stream();
    let mut rng = Rng::new();
    let n = 1 << 16;
    // Small integers: every sum below is exact in f32.
    let x: Vec<f32> = (0..n).map(|_| rng.below(8) as f32).collect();
    let y0: Vec<f32> = (0..n).map(|_| rng.below(1000) as f32).collect();
    let dx = DeviceBuffer::from_slice(registry.ctx(), stream, &x).unwrap();
    let mut dy = DeviceBuffer::from_slice(registry.ctx(), stream, &y0).unwrap();
    static AXPY: FunctionCache = FunctionCache::new("elementwise", "axpy");
    let cfg = LaunchConfig::for_elements(n as u32, 256);
    for _ in 0..ROUNDS {
        // SAFETY: `axpy` reads `n` floats of `dx` and updates `n` of `dy`, which both hold `n`
        // and outlive the launches (`to_vec` below waits for them on the same stream).
        unsafe {
            AXPY.get(&registry)
                .unwrap()
                .launch(stream, &cfg, (&dx, &mut dy, 1.0f32, n as u32))
        }
        .unwrap();
    }
    let want: Vec<f32> = x
        .iter()
        .zip(&y0)
        .map(|(x, y)| y + ROUNDS as f32 * x)
        .collect();
    assert_close(&dy.to_vec(stream).unwrap(), &want, 0.0, "axpy loop");
}

fn clean_program_captures_only_then_no_call_failed() {
    clean_program(Replay::No);
    assert_no_call_failed();
}

fn clean_program_with_replays_then_no_call_failed() {
    clean_program(Replay::Yes);
    assert_no_call_failed();
}

fn assert_no_call_failed() {
    let failed = shim::failed_calls();
    assert!(
        failed.is_empty(),
        "driver calls of a clean program failed (entry point, status): {failed:?}"
    );
}

/// Whether the captured graph is also instantiated, replayed and changed (the stand-in models
/// capture only).
#[derive(Clone, Copy, PartialEq)]
enum Replay {
    No,
    Yes,
}

/// Every kind of work a program does with Atlas, each result checked against the CPU, every
/// registry released or dropped at the end.
fn clean_program(replay: Replay) {
    let mut rng = Rng::new();
    let device = host(0).unwrap_or_else(|e| panic!("a device (this test needs a driver): {e}"));
    let ptx = AtlasRegistry::load(0, ptx_for_model("demo").unwrap()).unwrap();
    let own_blobs = blobs_for_device("demo", device.compute_capability()).unwrap();
    let own = AtlasRegistry::load(0, own_blobs).unwrap();
    let library = AtlasLibrary::load(ptx_for_model("demo").unwrap()).unwrap();
    let shared = library.registry(0).unwrap();
    for registry in [&ptx, &own, &shared] {
        launches(registry, &mut rng);
    }
    shared_memory_opt_in(&ptx, &mut rng);
    copies_and_symbols(&ptx, &mut rng);
    stream_ordered(&ptx, &mut rng);
    capture(&ptx, &mut rng, replay);
    release(ptx).unwrap();
    release(own).unwrap();
    release(shared).unwrap();
    drop(library);
}

/// Typed launches through a per-call-site cache, a cached and an owning handle; a raw launch with
/// a parameter array; on the registry's stream, a stream of Atlas's own and the legacy stream.
fn launches(registry: &AtlasRegistry, rng: &mut Rng) {
    static SCALE: FunctionCache = FunctionCache::new("elementwise", "scale");
    let n = 1000 + rng.index(4000);
    let (input, y0) = (rng.vec(n), rng.vec(n));
    let (f, g, a) = (rng.f32() * 4.0, rng.f32() * 4.0, rng.f32());
    let stream = registry.stream();
    let mut x = DeviceBuffer::from_slice(registry.ctx(), stream, &input).unwrap();
    let mut y = DeviceBuffer::from_slice(registry.ctx(), stream, &y0).unwrap();
    let cfg = LaunchConfig::for_elements(n as u32, 256);
    let axpy = registry.function_cached("elementwise", "axpy").unwrap();
    let noop = registry.function("noop", "noop").unwrap();
    let own = CudaStream::new(registry.ctx()).unwrap();
    let mut raw_params = (g, n as u32);
    // The raw launch's array points to `x`'s address, a float and a u32 (`scale`'s parameters),
    // live during the call; `to_vec` below synchronizes each stream the launches ran on.
    // SAFETY: `scale` and `axpy` touch the `n` floats `x` and `y` hold, `noop` nothing; the
    // array is as said; both buffers outlive the launches.
    unsafe {
        SCALE
            .get(registry)
            .unwrap()
            .launch(stream, &cfg, (&mut x, f, n as u32))
            .unwrap();
        let mut ptr = x.device_ptr();
        let mut params: [*mut c_void; 3] = [
            (&raw mut ptr).cast(),
            (&raw mut raw_params.0).cast(),
            (&raw mut raw_params.1).cast(),
        ];
        let scale = registry
            .raw_function_cached("elementwise", "scale")
            .unwrap();
        registry
            .launch_on_stream(scale, &cfg, registry.raw_stream(), &mut params)
            .unwrap();
        stream.synchronize().unwrap();
        axpy.launch(&own, &cfg, (&x, &mut y, a, n as u32)).unwrap();
        noop.launch(
            &CudaStream::legacy_default(registry.ctx()),
            &LaunchConfig::for_elements(1, 1),
            (),
        )
        .unwrap();
    }
    let scaled: Vec<f32> = input.iter().map(|v| v * f * g).collect();
    assert_close(&x.to_vec(stream).unwrap(), &scaled, 1e-6, "scale");
    let want: Vec<f32> = scaled.iter().zip(&y0).map(|(x, y)| a * x + y).collect();
    assert_close(&y.to_vec(&own).unwrap(), &want, 1e-5, "axpy");
}

/// A launch with 96 KiB of dynamic shared memory: the per-function opt-in.
fn shared_memory_opt_in(registry: &AtlasRegistry, rng: &mut Rng) {
    const CHUNK: u32 = 24_576;
    let blocks = 3usize;
    let n = CHUNK as usize * blocks - rng.index(1000);
    let input = rng.vec(n);
    let stream = registry.stream();
    let x = DeviceBuffer::from_slice(registry.ctx(), stream, &input).unwrap();
    let mut out =
        DeviceBuffer::from_slice(registry.ctx(), stream, &vec![f32::NAN; blocks]).unwrap();
    let cfg = LaunchConfig {
        grid: (blocks as u32, 1, 1),
        block: (256, 1, 1),
        shared_mem_bytes: CHUNK * 4,
    };
    let sum = registry
        .function_cached("block_reduce", "block_sum")
        .unwrap();
    // SAFETY: `block_sum` reads `x` below `n`, writes one float per block of `out` (which holds
    // `blocks`, the grid) and stages `CHUNK` floats in the `CHUNK * 4` bytes of shared memory; both
    // buffers outlive the launch (`to_vec` below synchronizes).
    unsafe { sum.launch(stream, &cfg, (&x, &mut out, n as u32, CHUNK)) }.unwrap();
    let want: Vec<f32> = input
        .chunks(CHUNK as usize)
        .map(|c| c.iter().map(|&v| f64::from(v)).sum::<f64>() as f32)
        .collect();
    assert_close(&out.to_vec(stream).unwrap(), &want, 1e-2, "block_sum");
}

/// A `__device__` symbol written and read through its own calls and through raw async copies on a
/// wrapped stream, then seen by a kernel.
fn copies_and_symbols(registry: &AtlasRegistry, rng: &mut Rng) {
    let stream = registry.stream();
    let bias = registry.device_symbol("device_global", "bias").unwrap();
    let (first, second) = (rng.f32(), rng.f32());
    bias.write(&[first]).unwrap();
    let mut back = [f32::NAN];
    bias.read(&mut back).unwrap();
    assert_eq!(back, [first]);
    // SAFETY: the registry's stream, wrapped for these calls only: it lives as long as the process.
    let wrapped = unsafe { CudaStream::wrap(registry.ctx(), registry.raw_stream()) }.unwrap();
    let mut read_back = f32::NAN;
    // SAFETY: `bias` is 4 bytes of this device; `second` and `read_back` live until the stream is
    // synchronized below.
    unsafe {
        registry
            .copy_h2d_async(bias.ptr(), (&raw const second).cast(), 4, &wrapped)
            .unwrap();
        registry
            .copy_d2h_async((&raw mut read_back).cast(), bias.ptr(), 4, &wrapped)
            .unwrap();
    }
    registry.stream_synchronize(&wrapped).unwrap();
    assert_eq!(read_back, second);
    let n = 1 + rng.index(3000);
    let input = rng.vec(n);
    let mut x = DeviceBuffer::from_slice(registry.ctx(), stream, &input).unwrap();
    let add_bias = registry
        .function_cached("device_global", "add_bias")
        .unwrap();
    // SAFETY: `add_bias` touches the `n` floats of `x`, which outlives the launch.
    unsafe {
        add_bias.launch(
            stream,
            &LaunchConfig::for_elements(n as u32, 128),
            (&mut x, n as u32),
        )
    }
    .unwrap();
    let want: Vec<f32> = input.iter().map(|v| v + second).collect();
    assert_close(&x.to_vec(stream).unwrap(), &want, 1e-6, "add_bias");
}

/// Stream-ordered memory on a high-priority stream: allocate, copy, launch, read, free.
fn stream_ordered(registry: &AtlasRegistry, rng: &mut Rng) {
    let (_, greatest) = registry.ctx().stream_priorities().unwrap();
    let urgent = CudaStream::with_priority(registry.ctx(), greatest).unwrap();
    registry.host().set_pool_release_threshold(1 << 20).unwrap();
    let n = 1 + rng.index(3000);
    let (input, factor) = (rng.vec(n), rng.f32());
    let mut out = vec![f32::NAN; n];
    // SAFETY: `urgent` outlives `temp`, which is used only on it and freed on it, outside any
    // capture; `input` and `out` outlive the copies (the stream is synchronized before they go).
    unsafe {
        let mut temp = DeviceBuffer::<f32>::alloc_async(registry.ctx(), &urgent, n).unwrap();
        temp.copy_from_async(&urgent, &input).unwrap();
        let scale = registry.function_cached("elementwise", "scale").unwrap();
        scale
            .launch(
                &urgent,
                &LaunchConfig::for_elements(n as u32, 256),
                (&mut temp, factor, n as u32),
            )
            .unwrap();
        temp.copy_to_async(&urgent, &mut out).unwrap();
        temp.free().unwrap();
    }
    urgent.synchronize().unwrap();
    let want: Vec<f32> = input.iter().map(|v| v * factor).collect();
    assert_close(&out, &want, 1e-6, "stream-ordered scale");
}

/// Two launches captured into a graph; with `Replay::Yes` it is replayed, one node's arguments
/// changed, and replayed again.
fn capture(registry: &AtlasRegistry, rng: &mut Rng, replay: Replay) {
    let mut stream = CudaStream::new(registry.ctx()).unwrap();
    let n = 1 + rng.index(3000);
    let input = rng.vec(n);
    let (f, g, h) = (rng.f32() * 2.0, rng.f32() * 2.0, rng.f32() * 2.0);
    let mut x = DeviceBuffer::from_slice(registry.ctx(), &stream, &input).unwrap();
    let scale = registry.function_cached("elementwise", "scale").unwrap();
    let cfg = LaunchConfig::for_elements(n as u32, 256);
    let capture = stream.begin_capture().unwrap();
    // SAFETY: captured, run only by the replays below: `scale` touches the `n` floats of `x`,
    // which outlives the graph (declared before it).
    unsafe {
        scale.launch(&capture, &cfg, (&mut x, f, n as u32)).unwrap();
        scale.launch(&capture, &cfg, (&mut x, g, n as u32)).unwrap();
    }
    let graph = capture.end().unwrap();
    if replay == Replay::No {
        return;
    }
    let mut exec = graph.instantiate().unwrap();
    // SAFETY: as for the captured launches; `to_vec` synchronizes the stream before `x` is read.
    unsafe { exec.launch(&stream) }.unwrap();
    let once: Vec<f32> = input.iter().map(|v| v * f * g).collect();
    assert_close(&x.to_vec(&stream).unwrap(), &once, 1e-5, "replay");
    // SAFETY: as above, with another factor for the second node.
    unsafe {
        exec.set_kernel_args(1, &scale, &cfg, (&mut x, h, n as u32))
            .unwrap();
        exec.launch(&stream).unwrap();
    }
    let twice: Vec<f32> = once.iter().map(|v| v * f * h).collect();
    assert_close(
        &x.to_vec(&stream).unwrap(),
        &twice,
        1e-5,
        "replay after set_kernel_args",
    );
}
