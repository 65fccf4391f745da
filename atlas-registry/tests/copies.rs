//! The original registry's copies and symbols, as Atlas keeps them: raw host↔device copies to any
//! device address (a `__device__` variable included) on any stream of the registry's device,
//! captured into a graph like any other stream work; synchronizing the stream the caller names;
//! a device symbol stored as a value, which keeps its module loaded.
//!
//! Stand-in (CI): `cargo test -p atlas-registry --test copies`. GPU: add `-- --include-ignored`.

mod support;

use std::ffi::c_void;

use atlas_kernels::ptx_for_model;
use atlas_registry::sys::CUdeviceptr;
use atlas_registry::sys::CUresult;
use atlas_registry::{
    AtlasError, AtlasRegistry, CudaStream, DeviceBuffer, DeviceSymbol, LaunchConfig, release,
};
use support::blobs::load;
use support::child;
use support::graphs::assert_wrong_context;
use support::rng::Rng;
use support::standin::{self, probe};

child::bodies!(
    a_stream_of_another_device_is_refused_for_copies_and_nothing_is_copied,
    buffer_copies_wraps_and_synchronizes_check_the_streams_device,
);

const N: usize = 4099;

/// What a caller keeps between calls: a symbol needs no borrow of the registry.
struct Kept {
    bias: DeviceSymbol,
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn raw_copies_reach_a_device_symbol_on_any_stream_and_are_captured_into_a_graph() {
    let registry = load("demo");
    let mut rng = Rng::new();
    let kept = Kept {
        bias: registry.device_symbol("device_global", "bias").unwrap(),
    };
    let (ptr, size): (CUdeviceptr, usize) = (&kept.bias).into();
    assert_eq!((ptr, size), (kept.bias.ptr(), 4));
    let mut stream = CudaStream::new(registry.ctx()).unwrap();

    // Eager: host → symbol → host, on a created stream.
    let value = rng.f32_in(-8.0, 8.0);
    let mut back = f32::NAN;
    // SAFETY: `ptr` is the 4-byte `bias` of the registry's device; `value` and `back` are 4 bytes
    // each and live until the stream is synchronized below.
    unsafe {
        registry
            .copy_h2d_async(ptr, (&raw const value).cast::<c_void>(), size, &stream)
            .unwrap();
        registry
            .copy_d2h_async((&raw mut back).cast::<c_void>(), ptr, size, &stream)
            .unwrap();
    }
    registry.stream_synchronize(&stream).unwrap();
    assert_eq!(back.to_bits(), value.to_bits());

    // Captured: the copy into the symbol and the kernel that reads it, replayed with a new value
    // each time (a captured copy reads its host memory when the graph runs).
    let input = rng.vec(N);
    let mut x = DeviceBuffer::from_slice(registry.ctx(), &stream, &input).unwrap();
    let add = registry
        .function_cached("device_global", "add_bias")
        .unwrap();
    let cfg = LaunchConfig::for_elements(N as u32, 256);
    let mut host_bias = Box::new(0.0f32);
    let capture = stream.begin_capture().unwrap();
    // SAFETY: the 4-byte `bias`; `host_bias` is boxed (its address is fixed) and outlives every
    // replay below.
    unsafe {
        registry.copy_h2d_async(
            ptr,
            (&raw const *host_bias).cast::<c_void>(),
            size,
            &capture,
        )
    }
    .unwrap();
    // SAFETY: `x` holds `N` floats, all add_bias touches with n = N; it outlives the replays.
    unsafe { add.launch(&capture, &cfg, (&mut x, N as u32)) }.unwrap();
    let exec = capture.end().unwrap().instantiate().unwrap();
    let mut expected = input.clone();
    for _ in 0..3 {
        *host_bias = rng.f32_in(-4.0, 4.0);
        // SAFETY: `x`, `host_bias` and the registry (so the module) outlive the replay, which is
        // synchronized before they can change.
        unsafe { exec.launch(&stream) }.unwrap();
        registry.stream_synchronize(&stream).unwrap();
        for e in &mut expected {
            *e += *host_bias;
        }
        let got = x.to_vec(&stream).unwrap();
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            assert_eq!(g.to_bits(), e.to_bits(), "element {i}: {g} != {e}");
        }
    }
    drop(exec);
    // The symbol read back through its own methods sees the last captured value.
    let mut last = [f32::NAN];
    kept.bias.read(&mut last).unwrap();
    assert_eq!(last[0].to_bits(), host_bias.to_bits());
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_stored_device_symbol_keeps_its_module_loaded() {
    let registry = load("demo");
    let kept = Kept {
        bias: registry.device_symbol("device_global", "bias").unwrap(),
    };
    let clone = registry.clone();
    let e = release(registry).unwrap_err();
    assert!(matches!(e, AtlasError::InUse { handles: 2, .. }), "{e}");
    drop(clone);
    // The registry handles are gone; the symbol alone keeps the module, and still works.
    let value = 3.25f32;
    kept.bias.write(&[value]).unwrap();
    let mut back = [0.0f32];
    kept.bias.read(&mut back).unwrap();
    assert_eq!(back[0], value);
    drop(kept);
    // A new load of the same model works after the last handle went.
    release(load("demo")).unwrap();
}

#[test]
fn a_copy_on_a_stream_of_another_device_is_refused() {
    standin::run(
        a_stream_of_another_device_is_refused_for_copies_and_nothing_is_copied,
        &["-DSTANDIN_DEVICES=2"],
    );
}

fn a_stream_of_another_device_is_refused_for_copies_and_nothing_is_copied() {
    let blobs = ptx_for_model("demo").unwrap();
    let gpu0 = AtlasRegistry::load(0, blobs).unwrap();
    let gpu1 = AtlasRegistry::load(1, blobs).unwrap();
    let bias = gpu0.device_symbol("device_global", "bias").unwrap();
    let copies = probe().count("cuMemcpyHtoDAsync_v2") + probe().count("cuMemcpyDtoHAsync_v2");
    let mut value = 1.5f32;
    // SAFETY: refused before the driver is called (the stream is device 1's).
    let e = unsafe {
        gpu0.copy_h2d_async(
            bias.ptr(),
            (&raw const value).cast::<c_void>(),
            4,
            gpu1.stream(),
        )
    }
    .unwrap_err();
    assert!(
        matches!(e, AtlasError::WrongContext { expected: Some(0), given: Some(1), ref what } if what == "the stream"),
        "{e}"
    );
    assert!(e.to_string().contains("device 1"), "{e}");
    // SAFETY: refused before the driver is called.
    let e = unsafe {
        gpu0.copy_d2h_async(
            (&raw mut value).cast::<c_void>(),
            bias.ptr(),
            4,
            gpu1.stream(),
        )
    }
    .unwrap_err();
    assert!(matches!(e, AtlasError::WrongContext { .. }), "{e}");
    assert_eq!(
        probe().count("cuMemcpyHtoDAsync_v2") + probe().count("cuMemcpyDtoHAsync_v2"),
        copies,
        "the driver saw a copy"
    );
    // On the right stream the same copies go through.
    // SAFETY: `bias` is 4 bytes of device 0; `value` lives until the synchronize below.
    unsafe {
        gpu0.copy_h2d_async(
            bias.ptr(),
            (&raw const value).cast::<c_void>(),
            4,
            gpu0.stream(),
        )
    }
    .unwrap();
    gpu0.stream_synchronize(gpu0.stream()).unwrap();
    let mut back = [0.0f32];
    bias.read(&mut back).unwrap();
    assert_eq!(back[0], value);
}

#[test]
fn buffer_copies_wrapped_streams_and_synchronize_refuse_another_devices_stream() {
    standin::run(
        buffer_copies_wraps_and_synchronizes_check_the_streams_device,
        &["-DSTANDIN_DEVICES=2"],
    );
}

/// The refusal of `what` on device 1's stream where device 0's was needed.
fn refused_for_device_1(e: AtlasError, what: &str) {
    assert_wrong_context(e, what, 0, 1);
}

/// A buffer of device 0 copied on device 1's stream, device 1's stream wrapped for device 0 or
/// synchronized through device 0's registry: each refused before the driver is called.
fn buffer_copies_wraps_and_synchronizes_check_the_streams_device() {
    let blobs = ptx_for_model("demo").unwrap();
    let gpu0 = AtlasRegistry::load(0, blobs).unwrap();
    let gpu1 = AtlasRegistry::load(1, blobs).unwrap();
    let (ctx0, other) = (gpu0.ctx(), gpu1.stream());
    let mut rng = Rng::new();
    let data = rng.vec(64);
    let mut x = DeviceBuffer::from_slice(ctx0, gpu0.stream(), &data).unwrap();
    let p = probe();
    let copies = || p.count("cuMemcpyHtoDAsync_v2") + p.count("cuMemcpyDtoHAsync_v2");
    let (before, allocations, synchronizes) = (
        copies(),
        p.count("cuMemAlloc_v2"),
        p.count("cuStreamSynchronize"),
    );
    refused_for_device_1(
        DeviceBuffer::from_slice(ctx0, other, &data).unwrap_err(),
        "the stream",
    );
    refused_for_device_1(x.copy_from(other, &data).unwrap_err(), "the stream");
    let mut back = vec![f32::NAN; 64];
    refused_for_device_1(x.copy_to(other, &mut back).unwrap_err(), "the stream");
    refused_for_device_1(x.to_vec(other).unwrap_err(), "the stream");
    // SAFETY: refused before anything is enqueued.
    refused_for_device_1(
        unsafe { x.copy_from_async(other, &data) }.unwrap_err(),
        "the stream",
    );
    // SAFETY: as above.
    refused_for_device_1(
        unsafe { x.copy_to_async(other, &mut back) }.unwrap_err(),
        "the stream",
    );
    refused_for_device_1(gpu0.stream_synchronize(other).unwrap_err(), "the stream");
    assert_eq!(copies(), before, "the driver saw a copy");
    assert_eq!(
        p.count("cuMemAlloc_v2"),
        allocations,
        "from_slice allocated"
    );
    assert_eq!(p.count("cuStreamSynchronize"), synchronizes);

    // A caller's raw stream of device 1, wrapped as device 0's: the driver says whose it is.
    let cuda = atlas_registry::sys::driver().unwrap();
    let create = atlas_registry::sys::entry!(cuda, cuStreamCreate).unwrap();
    let destroy = atlas_registry::sys::entry!(cuda, cuStreamDestroy_v2).unwrap();
    gpu1.ctx().bind().unwrap();
    let mut raw = std::ptr::null_mut();
    // SAFETY: a live out-pointer; device 1's context is current.
    assert_eq!(unsafe { create(&mut raw, 0) }, CUresult::CUDA_SUCCESS);
    // SAFETY: `raw` is a live stream (of device 1), destroyed below.
    let e = unsafe { CudaStream::wrap(ctx0, raw) }.unwrap_err();
    refused_for_device_1(e, "the wrapped stream");
    // SAFETY: as above.
    let wrapped = unsafe { CudaStream::wrap(gpu1.ctx(), raw) }.unwrap();
    assert!(!wrapped.is_owned());
    gpu1.stream_synchronize(&wrapped).unwrap();
    drop(wrapped);
    // SAFETY: nothing uses the stream any more.
    assert_eq!(unsafe { destroy(raw) }, CUresult::CUDA_SUCCESS);

    // On the right streams the same calls go through.
    assert_eq!(x.to_vec(gpu0.stream()).unwrap(), data);
    gpu0.stream_synchronize(gpu0.stream()).unwrap();
}
