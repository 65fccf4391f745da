//! The safety model, tried as a careful user would: every check Atlas promises in its crate docs
//! ("Safety model") refuses before the driver is called, and no safe call acts in a context that
//! is not Atlas's.
//!
//! Most tests run against the stand-in libcuda (`tests/support/standin/`), so they run in CI without a
//! GPU; each body runs in a child process, since some of these mistakes crash the process when
//! Atlas does not catch them. The tests marked `#[ignore = "needs an NVIDIA GPU"]` repeat the
//! cases that matter on a real driver: with `cuFuncGetParamInfo` hidden by a shim
//! (`tests/support/shim.rs`), with another library's context current, with two threads opting in to
//! shared memory at once, and (on a machine with two GPUs) with a buffer of the other device.

mod support;

use std::ffi::c_void;
use std::sync::Barrier;

use atlas_kernels::{MODELS, ptx_for_model};
use atlas_registry::sys::{self, CUcontext, CUresult};
use atlas_registry::{
    AtlasError, AtlasLibrary, AtlasRegistry, CudaStream, DeviceBuffer, LaunchConfig, LaunchRefusal,
    RawCudaFunc, cuda_error_text,
};
use support::child::{self, Ending};
use support::rng::Rng;
use support::standin::{self, probe};
use support::{reference, shim};

child::bodies!(
    too_few_arguments_without_param_info_are_refused,
    blob_layouts_check_launches_without_param_info,
    unreadable_layout_refuses_naming_the_raw_path,
    other_device_is_refused,
    foreign_current_context_is_not_used,
    launch_on_a_created_stream_is_one_driver_call,
    concurrent_opt_ins_never_lower_the_limit,
    concurrent_raw_opt_ins_never_lower_the_limit,
    handle_of_a_dropped_registry_is_not_trusted,
    raw_launch_with_a_wrong_count_is_refused,
    codes_are_named_when_the_driver_cannot,
    gpu_too_few_arguments_without_param_info_are_refused,
);

// ---------------------------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------------------------

/// `module::scale` of `registry` on `n` fresh floats, checked against the CPU, the NaN tail past
/// `n` untouched.
fn scale_and_check(registry: &AtlasRegistry, module: &str, n: usize) {
    reference::scale_with_nan_tail(registry, module, n, 1e-6, module);
}

/// Launches `elementwise::scale` of `registry` with only two of its three arguments.
fn scale_with_two_arguments(registry: &AtlasRegistry) -> AtlasError {
    let stream = registry.stream();
    let mut x = DeviceBuffer::from_slice(registry.ctx(), stream, &[1.0f32; 16]).unwrap();
    let scale = registry.function_cached("elementwise", "scale").unwrap();
    // SAFETY: refused before the driver is called (two arguments for three parameters), so the
    // kernel never runs; were it launched, it would read a third parameter that is not there.
    let refused = unsafe {
        scale.launch(
            stream,
            &LaunchConfig::for_elements(16, 16),
            (&mut x, 2.0f32),
        )
    };
    refused.expect_err("two arguments for a three-parameter kernel must be refused")
}

fn demo() -> AtlasRegistry {
    AtlasRegistry::load(0, ptx_for_model("demo").unwrap()).unwrap()
}

// ---------------------------------------------------------------------------------------------
// Arguments are checked against the kernel, also when the driver cannot tell its layout
// ---------------------------------------------------------------------------------------------

#[test]
fn without_cu_func_get_param_info_a_short_argument_list_is_refused() {
    standin::run(
        too_few_arguments_without_param_info_are_refused,
        &["-DSTANDIN_NO_PARAM_INFO"],
    );
}

fn too_few_arguments_without_param_info_are_refused() {
    let registry = demo();
    let e = scale_with_two_arguments(&registry);
    assert!(
        matches!(e, AtlasError::InvalidLaunch { .. }) && e.to_string().contains("[8, 4, 4]"),
        "{e}"
    );
    assert_eq!(probe().launches(), 0, "the driver saw the launch");
}

#[test]
fn without_cu_func_get_param_info_the_blob_gives_the_layout() {
    standin::run(
        blob_layouts_check_launches_without_param_info,
        &["-DSTANDIN_NO_PARAM_INFO"],
    );
}

fn blob_layouts_check_launches_without_param_info() {
    for model in MODELS {
        let blobs = ptx_for_model(model).unwrap();
        let registry = AtlasRegistry::load(0, blobs).unwrap();
        if registry.has_module("elementwise") {
            let scale = registry.function("elementwise", "scale").unwrap();
            assert_eq!(
                scale.param_sizes().unwrap(),
                Some(&[8, 4, 4][..]),
                "{model}"
            );
            scale_and_check(&registry, "elementwise", 1000);
        }
    }
    let cubins = atlas_kernels::cubin_for_model("demo", 90).unwrap();
    let registry = AtlasRegistry::load(0, cubins).unwrap();
    let sum = registry.function("block_reduce", "block_sum").unwrap();
    assert_eq!(sum.param_sizes().unwrap(), Some(&[8, 8, 4, 4][..]));
    scale_and_check(&registry, "elementwise", 1000);
}

#[test]
fn without_any_layout_a_typed_launch_is_refused_naming_the_raw_path() {
    standin::run(
        unreadable_layout_refuses_naming_the_raw_path,
        &["-DSTANDIN_NO_PARAM_INFO"],
    );
}

fn unreadable_layout_refuses_naming_the_raw_path() {
    // The stand-in loads any bytes and knows `scale` by name; the blob declares no kernel.
    let registry = AtlasRegistry::load(
        0,
        &[(
            "elementwise",
            b".version 8.0\n// no kernels here\n".as_slice(),
        )],
    )
    .unwrap();
    let scale = registry.function("elementwise", "scale").unwrap();
    assert_eq!(scale.param_sizes().unwrap(), None);
    let stream = registry.stream();
    let mut x = DeviceBuffer::from_slice(registry.ctx(), stream, &[1.0f32; 16]).unwrap();
    // SAFETY: refused before the driver is called (no layout to check against).
    let e = unsafe {
        scale.launch(
            stream,
            &LaunchConfig::for_elements(16, 16),
            (&mut x, 2.0f32, 16u32),
        )
    }
    .unwrap_err();
    assert!(matches!(e, AtlasError::ParamsUnknown { .. }), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("elementwise::scale")
            && text.contains("cuFuncGetParamInfo")
            && text.contains("launch_on_stream"),
        "{text}"
    );
    assert_eq!(probe().launches(), 0);
}

/// The shim that hides an entry point, in front of the stand-in: what the GPU test below needs of
/// it (the entry point gone, every other call passed through) holds on every architecture the
/// tests run on.
#[test]
fn a_shim_hides_cu_func_get_param_info_and_passes_the_rest_through() {
    let shim = shim::hiding(&standin::build(&[]), &["cuFuncGetParamInfo"]);
    let child = child::run_on(
        gpu_too_few_arguments_without_param_info_are_refused,
        Some(&shim),
    );
    assert_eq!(child.ending, Ending::Passed, "{child}");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_without_cu_func_get_param_info_launches_are_still_checked() {
    let shim = shim::build(&["cuFuncGetParamInfo"]);
    let child = child::run_on(
        gpu_too_few_arguments_without_param_info_are_refused,
        Some(&shim),
    );
    assert_eq!(child.ending, Ending::Passed, "{child}");
}

/// On a driver behind a shim without `cuFuncGetParamInfo`: the layouts come from the PTX and the
/// cubins, a short argument list is refused (it crashed the process before), and correct
/// launches compute what the CPU does.
fn gpu_too_few_arguments_without_param_info_are_refused() {
    assert!(
        atlas_sys::entry!(atlas_sys::driver().unwrap(), cuFuncGetParamInfo).is_err(),
        "the shim must hide cuFuncGetParamInfo"
    );
    let ptx = demo();
    let e = scale_with_two_arguments(&ptx);
    assert!(matches!(e, AtlasError::InvalidLaunch { .. }), "{e}");
    scale_and_check(&ptx, "elementwise", 100_003);
    let cc = ptx.host().compute_capability();
    let sm = cc.0 * 10 + cc.1;
    let cubin =
        AtlasRegistry::load(0, atlas_kernels::cubin_for_model("demo", sm).unwrap()).unwrap();
    let e = scale_with_two_arguments(&cubin);
    assert!(matches!(e, AtlasError::InvalidLaunch { .. }), "{e}");
    scale_and_check(&cubin, "elementwise", 100_003);
}

// ---------------------------------------------------------------------------------------------
// Streams and buffers of another device
// ---------------------------------------------------------------------------------------------

#[test]
fn a_buffer_or_stream_of_another_device_is_refused_naming_both() {
    standin::run(other_device_is_refused, &["-DSTANDIN_DEVICES=2"]);
}

fn other_device_is_refused() {
    let blobs = ptx_for_model("demo").unwrap();
    let gpu0 = AtlasRegistry::load(0, blobs).unwrap();
    let gpu1 = AtlasRegistry::load(1, blobs).unwrap();
    refuse_the_other_devices_buffer_and_stream(&gpu0, &gpu1);
    assert_eq!(probe().launches(), 0, "the driver saw a launch");
    // Device 1 is untouched and works.
    scale_and_check(&gpu1, "elementwise", 1000);
    assert_eq!(probe().count("fault"), 0);
}

/// Device 1's `scale` given device 0's buffer, then device 0's stream: each refused before the
/// driver is called, naming both devices.
fn refuse_the_other_devices_buffer_and_stream(gpu0: &AtlasRegistry, gpu1: &AtlasRegistry) {
    let cfg = LaunchConfig::for_elements(64, 64);
    let mut on0 = DeviceBuffer::from_slice(gpu0.ctx(), gpu0.stream(), &[1.0f32; 64]).unwrap();
    let mut on1 = DeviceBuffer::from_slice(gpu1.ctx(), gpu1.stream(), &[1.0f32; 64]).unwrap();
    let scale1 = gpu1.function_cached("elementwise", "scale").unwrap();
    // SAFETY: refused before the driver is called (argument 0 is memory of device 0); run, it
    // would fault and lose device 1's context.
    let e = unsafe { scale1.launch(gpu1.stream(), &cfg, (&mut on0, 2.0f32, 64u32)) }.unwrap_err();
    assert!(
        matches!(e, AtlasError::WrongDevice { expected: 1, given: Some(0), ref what, .. } if what == "argument 0"),
        "{e}"
    );
    let text = e.to_string();
    assert!(
        text.contains("device 0") && text.contains("device 1"),
        "{text}"
    );
    // SAFETY: refused before the driver is called (the stream is device 0's).
    let e = unsafe { scale1.launch(gpu0.stream(), &cfg, (&mut on1, 2.0f32, 64u32)) }.unwrap_err();
    assert!(
        matches!(e, AtlasError::WrongDevice { expected: 1, given: Some(0), ref what, .. } if what == "the stream"),
        "{e}"
    );
}

// ---------------------------------------------------------------------------------------------
// Another library's context current on the thread
// ---------------------------------------------------------------------------------------------

#[test]
fn allocations_loads_and_copies_stay_in_atlas_context_whatever_is_current() {
    standin::run(foreign_current_context_is_not_used, &[]);
}

fn foreign_current_context_is_not_used() {
    let registry = demo();
    let ours = registry.ctx().raw();
    let p = probe();
    // Another library makes its own context current behind Atlas's back, after Atlas has used
    // the thread (so that a record of "already bound" would be stale).
    let foreign = p.foreign_context(0);
    assert_ne!(foreign, ours);
    let x = DeviceBuffer::<f32>::alloc(registry.ctx(), 256).unwrap();
    assert_eq!(
        p.pointer_context(x.device_ptr()),
        ours,
        "allocated in the foreign context"
    );

    p.foreign_context(0);
    let again = demo();
    assert_eq!(
        p.last_module_context(),
        ours,
        "loaded in the foreign context"
    );

    p.foreign_context(0);
    let data: Vec<f32> = Rng::new().vec(256);
    let mut y = DeviceBuffer::<f32>::alloc(registry.ctx(), 256).unwrap();
    p.foreign_context(0);
    y.copy_from(registry.stream(), &data).unwrap();
    assert_eq!(p.last_copy_context(), ours, "copied in the foreign context");
    p.foreign_context(0);
    assert_eq!(y.to_vec(registry.stream()).unwrap(), data);

    p.foreign_context(0);
    scale_and_check(&again, "elementwise", 1000);
    assert_eq!(p.last_launch_context(), ours);
    // What Atlas leaves current, as its docs say: its own context.
    assert_eq!(p.current_context(), ours);
}

#[test]
fn a_launch_on_a_created_stream_is_exactly_one_driver_call() {
    standin::run(launch_on_a_created_stream_is_one_driver_call, &[]);
}

fn launch_on_a_created_stream_is_one_driver_call() {
    let registry = demo();
    let stream = CudaStream::new(registry.ctx()).unwrap();
    let mut x = DeviceBuffer::from_slice(registry.ctx(), &stream, &[1.0f32; 64]).unwrap();
    let scale = registry.function_cached("elementwise", "scale").unwrap();
    let cfg = LaunchConfig::for_elements(64, 64);
    // SAFETY: `scale` touches the 64 floats of `x`, which outlives the launches (synchronized below).
    unsafe { scale.launch(&stream, &cfg, (&mut x, 2.0f32, 64u32)) }.unwrap(); // reads the layout
    let p = probe();
    p.foreign_context(0); // whatever is current does not matter to a launch on a created stream
    let calls = |name| p.count(name);
    let before = (
        calls("cuLaunchKernel"),
        calls("cuCtxGetCurrent"),
        calls("cuCtxSetCurrent"),
    );
    for _ in 0..10 {
        // SAFETY: as above.
        unsafe { scale.launch(&stream, &cfg, (&mut x, 2.0f32, 64u32)) }.unwrap();
    }
    let after = (
        calls("cuLaunchKernel"),
        calls("cuCtxGetCurrent"),
        calls("cuCtxSetCurrent"),
    );
    assert_eq!(
        (after.0 - before.0, after.1 - before.1, after.2 - before.2),
        (10, 0, 0)
    );
    stream.synchronize().unwrap();
    assert_eq!(x.to_vec(&stream).unwrap(), vec![2048.0f32; 64]);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_allocations_loads_and_copies_stay_in_atlas_context_whatever_is_current() {
    let registry = demo();
    let ours = registry.ctx().raw();
    let cuda = atlas_sys::driver().unwrap();
    let create = atlas_sys::entry!(cuda, cuCtxCreate_v2).unwrap();
    let destroy = atlas_sys::entry!(cuda, cuCtxDestroy_v2).unwrap();
    let pointer_attribute = atlas_sys::entry!(cuda, cuPointerGetAttribute).unwrap();
    let context_of = |ptr: sys::CUdeviceptr| {
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: `ctx` is a live out-pointer of the size the CONTEXT attribute writes.
        let status = unsafe {
            pointer_attribute(
                (&mut ctx as *mut CUcontext).cast::<c_void>(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_CONTEXT,
                ptr,
            )
        };
        assert_eq!(status, CUresult::CUDA_SUCCESS);
        ctx
    };
    let mut foreign: CUcontext = std::ptr::null_mut();
    // SAFETY: `foreign` is a live out-pointer; device 0 exists (the registry is on it). The new
    // context is pushed, current to this thread: another library's, behind Atlas's back.
    let status = unsafe { create(&mut foreign, 0, registry.ctx().device()) };
    assert_eq!(status, CUresult::CUDA_SUCCESS);

    let x = DeviceBuffer::<f32>::alloc(registry.ctx(), 1 << 20).unwrap();
    assert_eq!(
        context_of(x.device_ptr()),
        ours,
        "allocated in the foreign context"
    );
    let again = demo();
    // A module loaded in the foreign context would not launch on the primary context's stream.
    scale_and_check(&again, "elementwise", 100_003);

    // SAFETY: `foreign` was created above and is destroyed once; it is no longer current
    // (Atlas made its own current), so this only destroys it.
    assert_eq!(unsafe { destroy(foreign) }, CUresult::CUDA_SUCCESS);
    scale_and_check(&registry, "elementwise", 1000);
}

// ---------------------------------------------------------------------------------------------
// The shared memory opt-in from two threads at once
// ---------------------------------------------------------------------------------------------

const CHUNK_64K: u32 = 16 * 1024;
const CHUNK_96K: u32 = 24 * 1024;

/// How [`block_sum`] launches: typed, or through `launch_on_stream` with a raw handle.
#[derive(Clone, Copy)]
enum Path {
    Typed,
    Raw(RawCudaFunc),
}

/// `block_reduce::block_sum` over one chunk of `chunk` floats (4 × `chunk` bytes of dynamic shared
/// memory) on fresh data, checked against the CPU; the error of a refused launch otherwise.
/// `ready`, when given, is waited on just before the launch (to start two threads' launches at
/// once).
fn block_sum(
    registry: &AtlasRegistry,
    stream: &CudaStream,
    chunk: u32,
    path: Path,
    ready: Option<&Barrier>,
) -> Result<(), AtlasError> {
    let input = Rng::new().vec(chunk as usize);
    let x = DeviceBuffer::from_slice(registry.ctx(), stream, &input)?;
    let mut out = DeviceBuffer::from_slice(registry.ctx(), stream, &[f32::NAN])?;
    let cfg = LaunchConfig {
        grid: (1, 1, 1),
        block: (1024, 1, 1),
        shared_mem_bytes: chunk * 4,
    };
    if let Some(ready) = ready {
        ready.wait();
    }
    match path {
        Path::Typed => {
            let sum = registry.function_cached("block_reduce", "block_sum")?;
            // SAFETY: one block reads `chunk` floats of `x` (all of it) and writes `out[0]`; both
            // outlive the launch (`to_vec` below waits on the same stream).
            unsafe { sum.launch(stream, &cfg, (&x, &mut out, chunk, chunk)) }?;
        }
        Path::Raw(raw) => {
            let (mut x_ptr, mut out_ptr, mut n, mut c) =
                (x.device_ptr(), out.device_ptr(), chunk, chunk);
            let mut params: [*mut c_void; 4] = [
                (&mut x_ptr as *mut u64).cast(),
                (&mut out_ptr as *mut u64).cast(),
                (&mut n as *mut u32).cast(),
                (&mut c as *mut u32).cast(),
            ];
            // SAFETY: a function of a module loaded in this registry's context, a stream of it; four
            // pointers to block_sum's parameter types; it reads `chunk` floats of `x` and writes
            // `out[0]`, both alive until `to_vec` below has waited for the stream.
            unsafe { registry.launch_on_stream(raw, &cfg, stream.raw(), &mut params) }?;
        }
    }
    let got = out.to_vec(stream)?[0];
    let want: f64 = input.iter().map(|&v| f64::from(v)).sum();
    assert!(
        (f64::from(got) - want).abs() < 1e-2,
        "got {got}, want {want}"
    );
    Ok(())
}

/// Two threads launch `path` with 64 KiB and 96 KiB of dynamic shared memory at once, on a fresh
/// registry each round; afterwards a 96 KiB launch must still work.
fn race_opt_ins(rounds: usize, path: impl Fn(&AtlasRegistry) -> Path + Sync) {
    for round in 0..rounds {
        let registry = demo();
        let path = path(&registry);
        let ready = Barrier::new(2);
        std::thread::scope(|scope| {
            for chunk in [CHUNK_64K, CHUNK_96K] {
                let (registry, ready) = (&registry, &ready);
                scope.spawn(move || {
                    let stream = CudaStream::new(registry.ctx()).unwrap();
                    block_sum(registry, &stream, chunk, path, Some(ready))
                        .unwrap_or_else(|e| panic!("round {round}, {chunk} floats: {e}"));
                });
            }
        });
        // Whichever thread finished last, 96 KiB launches keep working.
        block_sum(&registry, registry.stream(), CHUNK_96K, path, None)
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
    }
}

/// `block_reduce::block_sum` of `registry`.
fn block_sum_of(registry: &AtlasRegistry) -> sys::CUfunction {
    registry
        .function("block_reduce", "block_sum")
        .unwrap()
        .raw()
        .raw()
}

#[test]
fn two_threads_opting_in_at_once_leave_the_larger_limit() {
    standin::run(concurrent_opt_ins_never_lower_the_limit, &[]);
}

fn concurrent_opt_ins_never_lower_the_limit() {
    race_opt_ins(12, |_| Path::Typed);
}

#[test]
fn two_threads_opting_in_raw_handles_at_once_leave_the_larger_limit() {
    standin::run(concurrent_raw_opt_ins_never_lower_the_limit, &[]);
}

/// A `from_raw` handle has no entry to remember its limit in: every launch needing shared memory
/// asks the driver. Two of them at once must not lower each other's limit either.
fn concurrent_raw_opt_ins_never_lower_the_limit() {
    race_opt_ins(12, |registry| {
        Path::Raw(RawCudaFunc::from_raw(block_sum_of(registry)))
    });
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_two_threads_opting_in_at_once_leave_the_larger_limit() {
    race_opt_ins(50, |_| Path::Typed);
    race_opt_ins(50, |registry| {
        Path::Raw(RawCudaFunc::from_raw(block_sum_of(registry)))
    });
}

// ---------------------------------------------------------------------------------------------
// Raw handles and the raw launch path
// ---------------------------------------------------------------------------------------------

#[test]
fn a_raw_handle_launched_through_another_registry_is_not_trusted() {
    standin::run(handle_of_a_dropped_registry_is_not_trusted, &[]);
}

/// Two registries over one library share its modules; a raw handle of the first stays a valid
/// function while the second lives, but the first's bookkeeping for it is gone with the first.
fn handle_of_a_dropped_registry_is_not_trusted() {
    let library = AtlasLibrary::load(ptx_for_model("demo").unwrap()).unwrap();
    let keeper = library.registry(0).unwrap();
    for _ in 0..8 {
        let first = library.registry(0).unwrap();
        let raw = first
            .raw_function_cached("block_reduce", "block_sum")
            .unwrap();
        // Through another registry the handle is a plain CUfunction: nothing of `first`'s is read,
        // not even the name (a launch error names the handle).
        let too_big = LaunchConfig {
            block: (2048, 1, 1),
            ..LaunchConfig::for_elements(1, 1)
        };
        // SAFETY: refused before the driver is called (2048 threads per block).
        let e = unsafe { keeper.launch_on_stream(raw, &too_big, keeper.raw_stream(), &mut []) }
            .unwrap_err();
        assert!(
            e.to_string().contains(&format!("function {:p}", raw.raw())),
            "{e}"
        );
        drop(first);
        // Reuse the freed memory with bytes that would read as "limit already raised".
        let spray: Vec<Vec<u8>> = (8..64)
            .flat_map(|words| (0..32).map(move |_| vec![0xFF; words * 8]))
            .collect();
        // The function's module is still loaded: the library and `keeper` keep it.
        block_sum(&keeper, keeper.stream(), CHUNK_96K, Path::Raw(raw), None).unwrap();
        drop(spray);
    }
}

#[test]
fn a_raw_launch_with_the_wrong_parameter_count_is_refused() {
    standin::run(raw_launch_with_a_wrong_count_is_refused, &[]);
}

fn raw_launch_with_a_wrong_count_is_refused() {
    let registry = demo();
    let raw = registry
        .raw_function_cached("elementwise", "scale")
        .unwrap();
    let x = DeviceBuffer::from_slice(registry.ctx(), registry.stream(), &[1.0f32; 16]).unwrap();
    let (mut ptr, mut factor) = (x.device_ptr(), 2.0f32);
    let mut params: [*mut c_void; 2] = [
        (&mut ptr as *mut u64).cast(),
        (&mut factor as *mut f32).cast(),
    ];
    let cfg = LaunchConfig::for_elements(16, 16);
    // SAFETY: refused before the driver is called (two pointers for three parameters).
    let e = unsafe { registry.launch_on_stream(raw, &cfg, registry.raw_stream(), &mut params) }
        .unwrap_err();
    assert!(
        matches!(
            e,
            AtlasError::InvalidLaunch {
                reason: LaunchRefusal::ParamCount {
                    expected: 3,
                    given: 2
                },
                ..
            }
        ) && e.to_string().contains("takes 3 parameter(s)"),
        "{e}"
    );
    // Every other handle to the same kernel goes through the same door, with the same knowledge
    // of the kernel.
    let owning = registry.function_cached("elementwise", "scale").unwrap();
    let borrowed = owning.as_function_ref();
    for e in [
        // SAFETY: refused before the driver is called, as above.
        unsafe { registry.launch_on_stream(&owning, &cfg, registry.raw_stream(), &mut params) },
        // SAFETY: as above.
        unsafe { registry.launch_on_stream(borrowed, &cfg, registry.raw_stream(), &mut params) },
        // SAFETY: as above.
        unsafe { registry.launch_on_stream(&*owning, &cfg, registry.raw_stream(), &mut params) },
    ] {
        let e = e.unwrap_err();
        assert!(
            matches!(
                e,
                AtlasError::InvalidLaunch {
                    reason: LaunchRefusal::ParamCount { .. },
                    ..
                }
            ),
            "{e}"
        );
    }
    assert_eq!(probe().launches(), 0);
    assert_eq!(
        registry
            .resolve(raw)
            .map(|f| f.name().to_owned())
            .as_deref(),
        Some("elementwise::scale")
    );
    assert!(registry.resolve(RawCudaFunc::from_raw(raw.raw())).is_none());
}

// ---------------------------------------------------------------------------------------------
// Status codes
// ---------------------------------------------------------------------------------------------

#[test]
fn common_codes_are_named_when_the_driver_cannot_name_them() {
    standin::run(codes_are_named_when_the_driver_cannot, &[]);
}

fn codes_are_named_when_the_driver_cannot() {
    let registry = demo();
    // During teardown the driver's cuGetErrorName fails; Atlas still names common codes.
    probe().inject("cuGetErrorName", 4, 1);
    assert!(
        cuda_error_text(2).starts_with("CUDA_ERROR_OUT_OF_MEMORY (2)"),
        "{}",
        cuda_error_text(2)
    );
    probe().inject("cuGetErrorName", 4, 1);
    probe().inject("cuMemAlloc_v2", 710, 1);
    let e = DeviceBuffer::<f32>::alloc(registry.ctx(), 16).unwrap_err();
    assert!(
        e.is_context_lost(),
        "a device-side assert loses the context: {e}"
    );
    assert!(e.to_string().contains("CUDA_ERROR_ASSERT (710)"), "{e}");
}

#[test]
#[ignore = "needs two NVIDIA GPUs"]
fn two_gpus_a_buffer_or_stream_of_the_other_device_is_refused() {
    let blobs = ptx_for_model("demo").unwrap();
    let gpu0 = AtlasRegistry::load(0, blobs).unwrap();
    let gpu1 = AtlasRegistry::load(1, blobs).expect("a second GPU");
    refuse_the_other_devices_buffer_and_stream(&gpu0, &gpu1);
    // Both devices still work, checked against the CPU.
    scale_and_check(&gpu1, "elementwise", 100_003);
    scale_and_check(&gpu0, "elementwise", 100_003);
}
