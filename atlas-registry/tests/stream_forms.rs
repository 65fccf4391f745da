//! Every door that takes a stream takes either form: a `&CudaStream` (checked against the door's
//! context) or the raw `CUstream` of the original registry (the caller's promise). Against the
//! stand-in (each launch and copy reaching the driver on the stream given), and on a GPU for graph
//! replays.

mod support;

use std::ffi::c_void;

use atlas_kernels::ptx_for_model;
use atlas_registry::{
    AtlasError, AtlasRegistry, CudaStream, DeviceBuffer, LaunchAttributes, LaunchConfig,
};
use support::child;
use support::reference::assert_close;
use support::rng::Rng;
use support::standin::{self, probe};

child::bodies!(
    each_door_takes_both_forms,
    a_stream_of_another_device_is_refused_at_the_raw_door
);

#[test]
fn launches_and_copies_take_a_cuda_stream_or_a_raw_one() {
    standin::run(each_door_takes_both_forms, &[]);
}

#[test]
fn the_raw_door_refuses_a_cuda_stream_of_another_device() {
    standin::run(
        a_stream_of_another_device_is_refused_at_the_raw_door,
        &["-DSTANDIN_DEVICES=2"],
    );
}

fn demo(ordinal: usize) -> AtlasRegistry {
    AtlasRegistry::load(ordinal, ptx_for_model("demo").unwrap()).unwrap()
}

/// `scale` by `factor` through each launch door, on `stream`, then the copies: every result
/// against the CPU.
fn doors(registry: &AtlasRegistry, stream: impl atlas_registry::StreamArg, rng: &mut Rng) {
    let n = 1 + rng.index(2000);
    let input = rng.vec(n);
    let factors = [rng.f32(), rng.f32(), rng.f32(), rng.f32()];
    let mut x = DeviceBuffer::from_slice(registry.ctx(), registry.stream(), &input).unwrap();
    let scale = registry.function_cached("elementwise", "scale").unwrap();
    let cfg = LaunchConfig::for_elements(n as u32, 256);
    // `scale` never waits for its predecessor, so a programmatic launch of it says that it may
    // overlap (the stand-in runs launches in order); what is tested here is the stream doors.
    let pdl = LaunchAttributes::new()
        .programmatic_stream_serialization(true)
        .programmatic_without_wait(true);
    let (mut ptr, mut count) = (x.device_ptr(), n as u32);
    let (mut third, mut fourth) = (factors[2], factors[3]);
    let launches = probe().launches();
    // SAFETY: `scale` touches the `n` floats of `x`, which outlives every launch (the stream is
    // synchronized below before `x` is read); the raw arrays point to a device pointer, a float
    // and a u32, `scale`'s parameters, live during the calls; a raw stream given is the registry's.
    unsafe {
        scale
            .launch(stream, &cfg, (&mut x, factors[0], n as u32))
            .unwrap();
        scale
            .launch_with(stream, &cfg, &pdl, (&mut x, factors[1], n as u32))
            .unwrap();
        let mut params: [*mut c_void; 3] = [
            (&raw mut ptr).cast(),
            (&raw mut third).cast(),
            (&raw mut count).cast(),
        ];
        registry
            .launch_on_stream(&scale, &cfg, stream, &mut params)
            .unwrap();
        params[1] = (&raw mut fourth).cast();
        registry
            .launch_on_stream_with(&scale, &cfg, &pdl, stream, &mut params)
            .unwrap();
    }
    assert_eq!(probe().launches(), launches + 2, "two cuLaunchKernel");
    assert_eq!(probe().count("cuLaunchKernelEx"), 2, "two cuLaunchKernelEx");
    assert_eq!(probe().last_launch_context(), registry.ctx().raw());
    let product: f32 = factors.iter().product();
    let want: Vec<f32> = input.iter().map(|v| v * product).collect();
    let mut got = vec![f32::NAN; n];
    // SAFETY: `x` holds `n` floats of this device; `got` has room for them and is read only after
    // the stream is synchronized.
    unsafe { registry.copy_d2h_async(got.as_mut_ptr().cast(), x.device_ptr(), n * 4, stream) }
        .unwrap();
    registry.stream_synchronize(registry.stream()).unwrap();
    assert_close(&got, &want, 1e-5, "four launches through four doors");
    let fresh = rng.vec(n);
    // SAFETY: as above, the other way; `fresh` lives until the stream is synchronized.
    unsafe { registry.copy_h2d_async(x.device_ptr(), fresh.as_ptr().cast(), n * 4, stream) }
        .unwrap();
    assert_eq!(x.to_vec(registry.stream()).unwrap(), fresh);
}

fn each_door_takes_both_forms() {
    let registry = demo(0);
    let mut rng = Rng::new();
    standin::probe().reset();
    doors(&registry, registry.stream(), &mut rng);
    standin::probe().reset();
    doors(&registry, registry.raw_stream(), &mut rng);
    standin::probe().reset();
    let own = CudaStream::new(registry.ctx()).unwrap();
    doors(&registry, &own, &mut rng);
}

fn a_stream_of_another_device_is_refused_at_the_raw_door() {
    let (gpu0, gpu1) = (demo(0), demo(1));
    let scale = gpu1.raw_function_cached("elementwise", "scale").unwrap();
    let x = DeviceBuffer::from_slice(gpu1.ctx(), gpu1.stream(), &[1.0f32; 64]).unwrap();
    let (mut ptr, mut factor, mut n) = (x.device_ptr(), 2.0f32, 64u32);
    let mut params: [*mut c_void; 3] = [
        (&raw mut ptr).cast(),
        (&raw mut factor).cast(),
        (&raw mut n).cast(),
    ];
    let cfg = LaunchConfig::for_elements(64, 64);
    // SAFETY: refused before the driver is called (the stream is device 0's).
    let e = unsafe { gpu1.launch_on_stream(scale, &cfg, gpu0.stream(), &mut params) }.unwrap_err();
    assert!(
        matches!(e, AtlasError::WrongContext { expected: Some(1), given: Some(0), ref what } if what == "the stream"),
        "{e}"
    );
    assert_eq!(probe().launches(), 0, "the driver saw a launch");
    assert_eq!(x.to_vec(gpu1.stream()).unwrap(), [1.0f32; 64]);
}

/// A graph replayed on the raw handle of a stream and on the stream itself.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_a_graph_replays_on_either_stream_form() {
    let registry = AtlasRegistry::load(0, ptx_for_model("demo").unwrap())
        .unwrap_or_else(|e| panic!("this test needs an NVIDIA GPU: {e}"));
    let mut rng = Rng::new();
    let mut stream = CudaStream::new(registry.ctx()).unwrap();
    let n = 1 + rng.index(5000);
    let input = rng.vec(n);
    let factor = 0.5 + rng.f32();
    let mut x = DeviceBuffer::from_slice(registry.ctx(), &stream, &input).unwrap();
    let scale = registry.function_cached("elementwise", "scale").unwrap();
    let capture = stream.begin_capture().unwrap();
    // SAFETY: captured; each replay touches the `n` floats of `x`, which outlives the graph.
    unsafe {
        scale.launch(
            &capture,
            &LaunchConfig::for_elements(n as u32, 256),
            (&mut x, factor, n as u32),
        )
    }
    .unwrap();
    let exec = capture.end().unwrap().instantiate().unwrap();
    // SAFETY: as above; the raw handle is a live stream of the graph's context.
    unsafe {
        exec.launch(stream.raw()).unwrap();
        exec.launch(&stream).unwrap();
    }
    let want: Vec<f32> = input.iter().map(|v| v * factor * factor).collect();
    assert_close(&x.to_vec(&stream).unwrap(), &want, 1e-5, "two replays");
}
