//! Graph capture and replay of Atlas launches, and argument updates of an instantiated graph.

mod support;

use atlas_kernels::ptx_for_model;
use atlas_registry::sys::CUdeviceptr;
use atlas_registry::{
    AtlasError, AtlasRegistry, CudaStream, DeviceBuffer, FunctionCache, LaunchConfig,
    copy_to_device_async, copy_to_host_async, release,
};
use support::blobs::NEEDS_GPU;
use support::child::{self, Ending};
use support::graphs::replay_noop_after_release;
use support::reference::{assert_close, transform_reference};
use support::rng::Rng;

child::bodies!(instantiate_and_replay_after_the_registry_is_released);

static SCALE: FunctionCache = FunctionCache::new("elementwise", "scale");

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn capture_replay_and_update_arguments() {
    let registry = AtlasRegistry::load(0, ptx_for_model("demo").unwrap()).unwrap();
    let mut stream = CudaStream::new(registry.ctx()).unwrap();
    let mut rng = Rng::new();
    let n = 50_000usize;
    let input = rng.vec(n);
    let factors: Vec<f32> = (0..3).map(|_| 0.5 + rng.f32().abs()).collect();
    let mut x = DeviceBuffer::from_slice(registry.ctx(), &stream, &input).unwrap();
    let cfg = LaunchConfig::for_elements(n as u32, 256);
    // Resolve the function before capture begins.
    let scale = SCALE.get(&registry).unwrap();
    // SAFETY: `x` holds `n` floats, all that `scale` touches; it outlives the launch (synchronized
    // below).
    unsafe { scale.launch(&stream, &cfg, (&mut x, 1.0f32, n as u32)) }.unwrap();
    stream.synchronize().unwrap();

    let capture = stream.begin_capture().unwrap();
    for &f in &factors {
        // SAFETY: captured, not run: the kernel runs at each replay of `exec`, where it touches the
        // `n` floats `x` holds; `x` is declared before `exec`, so it outlives every replay.
        unsafe { scale.launch(&capture, &cfg, (&mut x, f, n as u32)) }.unwrap();
    }
    let graph = capture.end().unwrap();
    // Captured, not run.
    assert_close(&x.to_vec(&stream).unwrap(), &input, 0.0, "after capture");

    let mut exec = graph.instantiate().unwrap();
    assert_eq!(exec.kernel_count(), 3);
    let product: f32 = factors.iter().product();
    let mut want = input.clone();
    for replay in 0..2 {
        // SAFETY: `x`, the only memory the graph uses, is alive.
        unsafe { exec.launch(&stream) }.unwrap();
        want.iter_mut().for_each(|v| *v *= product);
        assert_close(
            &x.to_vec(&stream).unwrap(),
            &want,
            1e-5,
            &format!("replay {replay}"),
        );
    }

    // Change the second launch's factor without instantiating again.
    let replacement = 0.5 + rng.f32().abs();
    // SAFETY: the replays touch the `n` floats `x` holds; `x` is declared before `exec`, so it
    // stays allocated while the graph can be replayed with these arguments.
    unsafe { exec.set_kernel_args(1, &scale, &cfg, (&mut x, replacement, n as u32)) }.unwrap();
    // SAFETY: as above.
    unsafe { exec.launch(&stream) }.unwrap();
    let updated = factors[0] * replacement * factors[2];
    want.iter_mut().for_each(|v| *v *= updated);
    assert_close(&x.to_vec(&stream).unwrap(), &want, 1e-5, "after update");

    // Updates are checked like launches.
    // SAFETY: refused before the driver is called (an 8-byte factor for a 4-byte parameter), so
    // the node keeps its arguments and the kernel never runs with these.
    let err = unsafe { exec.set_kernel_args(1, &scale, &cfg, (&mut x, 1.0f64, n as u32)) }
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("elementwise::scale") && err.contains("[8, 8, 4]"),
        "{err}"
    );
    // SAFETY: refused before the driver is called (node 3 of a graph of three), so no kernel
    // ever runs with these arguments.
    let err = unsafe { exec.set_kernel_args(3, &scale, &cfg, (&mut x, 1.0f32, n as u32)) }
        .unwrap_err()
        .to_string();
    assert!(err.contains("3 kernel node(s)"), "{err}");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn the_legacy_stream_is_not_captured() {
    let registry = AtlasRegistry::load(0, ptx_for_model("demo").unwrap()).unwrap();
    let mut legacy = CudaStream::legacy_default(registry.ctx());
    let err = legacy.begin_capture().unwrap_err().to_string();
    assert!(err.contains("legacy default stream"), "{err}");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn first_launch_inside_a_capture_reads_parameters_and_opts_in() {
    // A function resolved but never launched: its parameter layout and its 96 KiB shared memory
    // opt-in are first needed while the stream is capturing.
    let registry = AtlasRegistry::load(0, ptx_for_model("demo").unwrap()).unwrap();
    let mut stream = CudaStream::new(registry.ctx()).unwrap();
    let sum = registry
        .function_cached("block_reduce", "block_sum")
        .unwrap();
    const CHUNK: u32 = 24_576;
    let blocks = 3usize;
    let n = CHUNK as usize * blocks;
    let input = Rng::new().vec(n);
    let x = DeviceBuffer::from_slice(registry.ctx(), &stream, &input).unwrap();
    let mut out =
        DeviceBuffer::from_slice(registry.ctx(), &stream, &vec![f32::NAN; blocks]).unwrap();
    let cfg = LaunchConfig {
        grid: (blocks as u32, 1, 1),
        block: (1024, 1, 1),
        shared_mem_bytes: CHUNK * 4,
    };
    let capture = stream.begin_capture().unwrap();
    // SAFETY: captured, not run: at the replay block_sum reads the `n` floats of `x`, writes one
    // float per block to `out` (`blocks` floats, the grid) and stages `CHUNK` floats in `CHUNK * 4`
    // bytes of shared memory; `x` and `out` are declared before `exec`, so they outlive it.
    unsafe { sum.launch(&capture, &cfg, (&x, &mut out, n as u32, CHUNK)) }.unwrap();
    let exec = capture.end().unwrap().instantiate().unwrap();
    // SAFETY: `x` and `out` outlive the replay.
    unsafe { exec.launch(&stream) }.unwrap();
    let want: Vec<f32> = input
        .chunks(CHUNK as usize)
        .map(|c| c.iter().map(|&v| f64::from(v)).sum::<f64>() as f32)
        .collect();
    assert_close(
        &out.to_vec(&stream).unwrap(),
        &want,
        1e-4,
        "block sums from the graph",
    );
}

/// Capture one launch of `noop`, end the capture, drop the function and release the registry,
/// then instantiate and replay: the graph keeps the module loaded (the driver follows the
/// function at instantiation, and crashed on an unloaded one), and `release` says so.
fn instantiate_and_replay_after_the_registry_is_released() {
    let registry = AtlasRegistry::load(0, ptx_for_model("demo").unwrap()).expect(NEEDS_GPU);
    let (_stream, exec) = replay_noop_after_release(registry);
    drop(exec);
    println!("replayed after release");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_graph_instantiates_and_replays_after_its_registry_is_released() {
    let child = child::run_on(instantiate_and_replay_after_the_registry_is_released, None);
    assert_eq!(child.ending, Ending::Passed, "{child}");
    assert!(child.stdout.contains("replayed after release"), "{child}");
    assert!(child.atlas_lines().is_empty(), "{child}");
}

/// Copies `data` to the device address `ptr` on `stream` and waits.
fn write(stream: &CudaStream, ptr: CUdeviceptr, data: &[f32]) {
    // SAFETY: `ptr` holds `data.len()` floats that a graph keeps allocated; `data` lives until the
    // stream is synchronized.
    unsafe { copy_to_device_async(stream, ptr, data.as_ptr().cast(), size_of_val(data)) }.unwrap();
    stream.synchronize().unwrap();
}

/// The `n` floats at the device address `ptr`.
fn read(stream: &CudaStream, ptr: CUdeviceptr, n: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; n];
    // SAFETY: as for `write`, into `out`, which is read only after the synchronize.
    unsafe { copy_to_host_async(stream, out.as_mut_ptr().cast(), ptr, n * 4) }.unwrap();
    stream.synchronize().unwrap();
    out
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_graph_replays_correctly_after_its_registries_are_released_and_its_buffers_dropped() {
    let demo = AtlasRegistry::load(0, ptx_for_model("demo").unwrap()).expect(NEEDS_GPU);
    let model_a = AtlasRegistry::load(0, ptx_for_model("model_a").unwrap()).unwrap();
    let mut stream = CudaStream::new(demo.ctx()).unwrap();
    let mut rng = Rng::new();
    let n = 50_000 + rng.index(50_000);
    let a = rng.f32_in(0.25, 2.0);
    let x = DeviceBuffer::<f32>::alloc(demo.ctx(), n).unwrap();
    let mut y = DeviceBuffer::<f32>::alloc(demo.ctx(), n).unwrap();
    let (x_ptr, y_ptr) = (x.device_ptr(), y.device_ptr());
    let transform = model_a.function_cached("model", "transform").unwrap();
    let axpy = demo.function_cached("elementwise", "axpy").unwrap();
    let cfg = LaunchConfig::for_elements(n as u32, 256);
    let capture = stream.begin_capture().unwrap();
    // SAFETY: captured, not run: at each replay transform writes the `n` floats of `y` from those
    // of `x`, then axpy adds `a * x` to them; the graph keeps both buffers allocated.
    unsafe {
        transform
            .launch(&capture, &cfg, (&x, &mut y, n as u32))
            .unwrap();
        axpy.launch(&capture, &cfg, (&x, &mut y, a, n as u32))
            .unwrap();
    }
    drop(x);
    let exec = capture.end().unwrap().instantiate().unwrap();
    drop((y, transform, axpy));
    for registry in [demo, model_a] {
        let e = release(registry).unwrap_err();
        assert!(matches!(e, AtlasError::InUse { handles: 1, .. }), "{e}");
    }
    for replay in 0..4 {
        let input = rng.vec(n);
        write(&stream, x_ptr, &input);
        write(&stream, y_ptr, &vec![f32::NAN; n]);
        // SAFETY: the graph keeps its modules and both buffers; nothing else is reached.
        unsafe { exec.launch(&stream) }.unwrap();
        let want: Vec<f32> = input
            .iter()
            .map(|&v| a.mul_add(v, transform_reference("model_a", v)))
            .collect();
        assert_close(
            &read(&stream, y_ptr, n),
            &want,
            1e-5,
            &format!("replay {replay}"),
        );
    }
}
