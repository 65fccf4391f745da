//! Atlas against the stand-in libcuda (`tests/support/standin/`), without a GPU: a real load, lookup,
//! typed launch and copy, the parameter layout with and without `cuFuncGetParamInfo`, JIT and
//! lookup errors, a second device; then checks that the stand-in itself behaves as its header
//! says, since other tests rely on it; and that the runner tells a crash from a failure.
//!
//! Each test runs its body in a child process (see `support/child.rs`):
//! `cargo test -p atlas-registry --test standin_smoke`.

mod support;

use std::ffi::c_void;

use atlas_kernels::{ELEMENTWISE_FATBIN, cubin_for_model, ptx_for_model};
use atlas_registry::sys::{self, CUjit_option, CUmodule, CUresult};
use atlas_registry::{
    AtlasError, AtlasLibrary, AtlasRegistry, DeviceBuffer, LaunchConfig, NotFoundKind,
    device_count, host, release,
};
use support::child::{self, Ending};
use support::reference::assert_close;
use support::rng::Rng;
use support::standin;

child::bodies!(
    scale_matches_cpu_reference,
    param_sizes_come_from_the_driver,
    param_sizes_come_from_the_driver_where_the_blob_differs,
    param_sizes_come_from_the_blob_without_param_info,
    param_sizes_come_from_the_modules_own_copy_of_the_blob,
    jit_error_carries_the_log,
    unknown_function_is_not_found,
    second_device_has_its_own_context,
    early_fail_writes_no_jit_option,
    library_load_defers_the_jit_error,
    tagged_models_keep_their_constants,
    binary_blobs_load,
    shared_memory_opt_in_reaches_the_function,
    kernel_fault_loses_the_context,
    contexts_are_per_thread,
    unloaded_function_is_refused_and_counted,
    panics_on_purpose,
    aborts_on_purpose,
);

// ---------------------------------------------------------------------------------------------
// Atlas on the stand-in
// ---------------------------------------------------------------------------------------------

#[test]
fn typed_scale_launch_matches_the_cpu() {
    standin::run(scale_matches_cpu_reference, &[]);
}

#[test]
fn param_sizes_with_and_without_cu_func_get_param_info() {
    standin::run(param_sizes_come_from_the_driver, &[]);
    standin::run(param_sizes_come_from_the_driver_where_the_blob_differs, &[]);
    standin::run(
        param_sizes_come_from_the_blob_without_param_info,
        &["-DSTANDIN_NO_PARAM_INFO"],
    );
}

/// Layouts are read at their first need, from what the module kept of the blob: the caller's
/// buffer may be gone by then, and the driver is still asked no further than the blob's count.
#[test]
fn layouts_read_after_the_load_come_from_the_modules_own_copy() {
    for variant in [&[][..], &["-DSTANDIN_NO_PARAM_INFO"]] {
        standin::run(
            param_sizes_come_from_the_modules_own_copy_of_the_blob,
            variant,
        );
    }
}

#[test]
fn jit_failure_is_a_module_load_error_with_the_log() {
    standin::run(jit_error_carries_the_log, &[]);
}

#[test]
fn unknown_kernel_name_is_not_found() {
    standin::run(unknown_function_is_not_found, &[]);
}

#[test]
fn two_devices_have_two_contexts() {
    standin::run(second_device_has_its_own_context, &["-DSTANDIN_DEVICES=2"]);
}

/// The demo model on device 0.
fn demo() -> AtlasRegistry {
    AtlasRegistry::load(0, ptx_for_model("demo").unwrap()).unwrap()
}

/// `scale` through the typed API on `registry`'s device, against the CPU.
fn scale_on(registry: &AtlasRegistry, rng: &mut Rng) {
    let n = 1000 + (rng.next_u64() % 3000) as usize;
    let input = rng.vec(n);
    let factor = rng.f32() * 4.0;
    let stream = registry.stream();
    let mut x = DeviceBuffer::from_slice(registry.ctx(), stream, &input).unwrap();
    let scale = registry.function("elementwise", "scale").unwrap();
    let launches = standin::probe().launches();
    // SAFETY: `scale` reads and writes x[i] for i < n, and `x` holds exactly n floats.
    unsafe {
        scale.launch(
            stream,
            &LaunchConfig::for_elements(n as u32, 256),
            (&mut x, factor, n as u32),
        )
    }
    .unwrap();
    assert_eq!(standin::probe().launches(), launches + 1);
    let want: Vec<f32> = input.iter().map(|v| v * factor).collect();
    assert_close(&x.to_vec(stream).unwrap(), &want, 0.0, "scale");
}

fn scale_matches_cpu_reference() {
    let registry = demo();
    scale_on(&registry, &mut Rng::new());
    let probe = standin::probe();
    assert_eq!(probe.launches(), 1);
    let ctx = registry.ctx().raw();
    assert_eq!(probe.primary_context(0), ctx);
    assert_eq!(probe.last_module_context(), ctx);
    assert_eq!(probe.last_alloc_context(), ctx);
    assert_eq!(probe.last_launch_context(), ctx);
}

fn param_sizes_come_from_the_driver() {
    let registry = demo();
    let scale = registry.function("elementwise", "scale").unwrap();
    assert_eq!(scale.param_sizes().unwrap(), Some(&[8, 4, 4][..]));
    let noop = registry.function("noop", "noop").unwrap();
    assert_eq!(noop.param_sizes().unwrap(), Some(&[][..]));
    // Asked as far as the blob's count, which the driver confirms: never one past the last.
    assert_eq!(standin::probe().count("cuFuncGetParamInfo"), 3);
}

/// A blob whose declaration differs from the kernel the driver has (here the stand-in's `scale`,
/// 8 + 4 + 4 bytes): the driver's layout wins, read to its end.
fn param_sizes_come_from_the_driver_where_the_blob_differs() {
    let blob: &[u8] =
        b".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry scale(.param .u64 x, .param .u64 y)\n{\n    ret;\n}\n";
    let registry = AtlasRegistry::load(0, &[("elementwise", blob)]).unwrap();
    let scale = registry.function("elementwise", "scale").unwrap();
    assert_eq!(scale.param_sizes().unwrap(), Some(&[8, 4, 4][..]));
    assert_eq!(standin::probe().count("cuFuncGetParamInfo"), 4);
}

fn param_sizes_come_from_the_blob_without_param_info() {
    let registry = demo();
    let scale = registry.function("elementwise", "scale").unwrap();
    assert_eq!(scale.param_sizes().unwrap(), Some(&[8, 4, 4][..]));
    assert_eq!(standin::probe().count("cuFuncGetParamInfo"), 0);
}

fn param_sizes_come_from_the_modules_own_copy_of_the_blob() {
    let ptx = ptx_for_model("demo").unwrap()[1].1;
    let zstd = include_bytes!("fixtures/elementwise.sm_90.zstd.fatbin");
    // PTX as it is (NUL-terminated, so handed over as it is), PTX without its NUL (copied to add
    // one), a plain fatbin, and a compressed one (whose cubin is read at the load).
    let blobs: [&[u8]; 4] = [
        ptx,
        ptx.strip_suffix(b"\0").unwrap(),
        ELEMENTWISE_FATBIN,
        zstd,
    ];
    let driver_tells = sys::driver().is_ok_and(|d| d.cuFuncGetParamInfo.is_ok());
    for (i, blob) in blobs.into_iter().enumerate() {
        let mut bytes = blob.to_vec();
        let registry = AtlasRegistry::load(0, &[("elementwise", &bytes[..])]).unwrap();
        let scale = registry.function("elementwise", "scale").unwrap();
        bytes.fill(0xff);
        drop(bytes);
        let asked = standin::probe().count("cuFuncGetParamInfo");
        assert_eq!(
            scale.param_sizes().unwrap(),
            Some(&[8, 4, 4][..]),
            "blob {i}"
        );
        let expected = if driver_tells { 3 } else { 0 };
        assert_eq!(
            standin::probe().count("cuFuncGetParamInfo") - asked,
            expected,
            "blob {i}"
        );
        drop(scale);
        release(registry).unwrap();
    }
}

fn jit_error_carries_the_log() {
    let broken: &[u8] = b".version 8.0\n.target sm_90\n// STANDIN_JIT_ERROR\n";
    let noop = ptx_for_model("demo").unwrap()[0];
    match AtlasRegistry::load(0, &[noop, ("broken", broken)]) {
        Err(AtlasError::ModuleLoad {
            module,
            code,
            jit_log,
            ..
        }) => {
            assert_eq!((module.as_str(), code), ("broken", 218));
            assert!(jit_log.contains("standin syntax error"), "{jit_log:?}");
        }
        other => panic!("expected a ModuleLoad error, got {other:?}"),
    }
    assert_eq!(
        standin::probe().count("live_modules"),
        0,
        "the module loaded before the failure is unloaded again"
    );
}

fn unknown_function_is_not_found() {
    let registry = demo();
    match registry.function("elementwise", "no_such_kernel") {
        Err(AtlasError::NotFound { kind, name, .. }) => {
            assert_eq!(kind, NotFoundKind::Function);
            assert_eq!(name, "elementwise::no_such_kernel");
        }
        other => panic!("expected NotFound, got {other:?}"),
    }
}

fn second_device_has_its_own_context() {
    let probe = standin::probe();
    assert_eq!(device_count().unwrap(), 2);
    let (zero, one) = (host(0).unwrap(), host(1).unwrap());
    assert_eq!(one.ordinal(), 1);
    assert_eq!(one.name(), "Atlas stand-in");
    assert_eq!(one.compute_capability(), (9, 0));
    assert_ne!(one.context().raw(), zero.context().raw());
    assert_eq!(one.context().raw(), probe.primary_context(1));
    assert!(matches!(
        host(2),
        Err(AtlasError::InvalidDevice {
            ordinal: 2,
            count: 2
        })
    ));

    let registry = AtlasRegistry::load(1, ptx_for_model("demo").unwrap()).unwrap();
    assert_eq!(probe.last_module_context(), one.context().raw());
    scale_on(&registry, &mut Rng::new());
    assert_eq!(probe.last_launch_context(), one.context().raw());
}

// ---------------------------------------------------------------------------------------------
// The stand-in does what its header says
// ---------------------------------------------------------------------------------------------

#[test]
fn standin_models_the_driver_behaviour_tests_rely_on() {
    standin::run(early_fail_writes_no_jit_option, &[]);
    standin::run(library_load_defers_the_jit_error, &[]);
    standin::run(tagged_models_keep_their_constants, &[]);
    standin::run(binary_blobs_load, &[]);
    standin::run(shared_memory_opt_in_reaches_the_function, &[]);
    standin::run(kernel_fault_loses_the_context, &[]);
    standin::run(contexts_are_per_thread, &[]);
    standin::run(unloaded_function_is_refused_and_counted, &[]);
}

/// The raw driver table, with `cuInit` done and device 0's primary context current.
fn raw_driver() -> &'static sys::CudaDriver {
    host(0).unwrap().context().bind().unwrap();
    sys::driver().unwrap()
}

/// `cuModuleLoadDataEx` of `blob` with an error log of 64 bytes filled with 0xAA: the status, the
/// log buffer and the size value afterwards.
fn load_with_log(blob: &[u8]) -> (CUresult, [u8; 64], usize) {
    let load_ex = sys::entry!(raw_driver(), cuModuleLoadDataEx).unwrap();
    let mut log = [0xAAu8; 64];
    let mut options = [
        CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
        CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
    ];
    let mut values: [*mut c_void; 2] = [log.as_mut_ptr().cast(), 64 as *mut c_void];
    let mut module: CUmodule = std::ptr::null_mut();
    // SAFETY: the blob is NUL-terminated text; two options with two values, the buffer 64 bytes
    // long as the size value says; a context is current.
    let status = unsafe {
        load_ex(
            &mut module,
            blob.as_ptr().cast(),
            2,
            options.as_mut_ptr(),
            values.as_mut_ptr(),
        )
    };
    (status, log, values[1] as usize)
}

fn early_fail_writes_no_jit_option() {
    let (status, log, size) = load_with_log(b"STANDIN_EARLY_FAIL\0");
    assert_eq!(status.0, 218);
    assert_eq!((log, size), ([0xAA; 64], 64), "nothing written");

    let (status, log, size) = load_with_log(b"STANDIN_JIT_ERROR\0");
    assert_eq!(status.0, 218);
    let text = b"line 3; error: standin syntax error\0";
    assert_eq!(size, text.len());
    assert_eq!(&log[..size], text);
    assert_eq!(log[size], 0xAA, "nothing past the log");
}

fn library_load_defers_the_jit_error() {
    let broken: &[u8] = b".version 8.0\n// STANDIN_JIT_ERROR\n";
    let library = AtlasLibrary::load(&[("broken", broken)]).expect("the JIT is deferred");
    // The failure surfaces where the driver compiles, with the JIT log.
    match library.registry(0) {
        Err(AtlasError::ModuleLoad {
            module,
            code,
            jit_log,
            ..
        }) => {
            assert_eq!((module.as_str(), code), ("broken", 218));
            assert!(jit_log.contains("standin syntax error"), "{jit_log}");
        }
        other => panic!("expected cuLibraryGetModule to fail with the log, got {other:?}"),
    }
    let library = AtlasLibrary::load(ptx_for_model("demo").unwrap()).unwrap();
    let registry = library.registry(0).unwrap();
    assert_eq!(standin::probe().last_module_context(), registry.ctx().raw());
    scale_on(&registry, &mut Rng::new());
}

fn tagged_models_keep_their_constants() {
    let mut rng = Rng::new();
    let input = rng.vec(500);
    for (model, scale, offset) in [("model_a", 2.0f32, 1.0f32), ("model_b", -3.0, 0.5)] {
        let registry = AtlasRegistry::load(0, ptx_for_model(model).unwrap()).unwrap();
        let stream = registry.stream();
        let x = DeviceBuffer::from_slice(registry.ctx(), stream, &input).unwrap();
        let mut y = DeviceBuffer::from_slice(registry.ctx(), stream, &[f32::NAN; 500]).unwrap();
        let transform = registry.function("model", "transform").unwrap();
        // SAFETY: `transform` reads x[i] and writes y[i] for i < 500; both hold 500 floats.
        unsafe {
            transform.launch(
                stream,
                &LaunchConfig::for_elements(500, 128),
                (&x, &mut y, 500u32),
            )
        }
        .unwrap();
        let want: Vec<f32> = input.iter().map(|v| v * scale + offset).collect();
        assert_close(&y.to_vec(stream).unwrap(), &want, 0.0, model);
        let mut constants = [0f32; 2];
        registry
            .device_symbol("model", "scale_offset")
            .unwrap()
            .read(&mut constants)
            .unwrap();
        assert_eq!(constants, [scale, offset], "{model}");
    }
}

/// Cubins and fatbins load too: the stand-in reads only as far as their headers say.
fn binary_blobs_load() {
    let cubins = AtlasRegistry::load(0, cubin_for_model("demo", 90).unwrap()).unwrap();
    scale_on(&cubins, &mut Rng::new());
    let fatbin = AtlasRegistry::load(0, &[("elementwise", ELEMENTWISE_FATBIN)]).unwrap();
    scale_on(&fatbin, &mut Rng::new());
    assert_eq!(standin::probe().count("live_modules"), 5);
}

fn shared_memory_opt_in_reaches_the_function() {
    let registry = demo();
    let probe = standin::probe();
    let (chunk, blocks) = (24_576u32, 3u32);
    let n = chunk * blocks - 100;
    let input = Rng::new().vec(n as usize);
    let stream = registry.stream();
    let x = DeviceBuffer::from_slice(registry.ctx(), stream, &input).unwrap();
    let mut sums = DeviceBuffer::from_slice(registry.ctx(), stream, &[f32::NAN; 3]).unwrap();
    let block_sum = registry.function("block_reduce", "block_sum").unwrap();
    let func = block_sum.raw().raw();
    assert_eq!(probe.max_dynamic_shared(func), Some(49152 - 4096));
    let cfg = LaunchConfig {
        grid: (blocks, 1, 1),
        block: (256, 1, 1),
        shared_mem_bytes: chunk * 4,
    };
    // SAFETY: block_sum reads in[i] for i < n and writes out[b] for b < 3; `x` holds n floats
    // and `sums` 3; the dynamic shared memory holds a chunk.
    unsafe { block_sum.launch(stream, &cfg, (&x, &mut sums, n, chunk)) }.unwrap();
    assert_eq!(probe.max_dynamic_shared(func), Some(chunk * 4));
    assert_eq!(probe.count("cuFuncSetAttribute"), 1);
    let want: Vec<f32> = input
        .chunks(chunk as usize)
        .map(|c| c.iter().sum())
        .collect();
    assert_close(&sums.to_vec(stream).unwrap(), &want, 0.0, "block sums");
}

fn kernel_fault_loses_the_context() {
    let registry = AtlasRegistry::load(0, ptx_for_model("faults").unwrap()).unwrap();
    let trap = registry.function("faults", "trap").unwrap();
    // SAFETY: `trap` takes no arguments; it faults, which is what this checks.
    unsafe { trap.launch(registry.stream(), &LaunchConfig::for_elements(1, 1), ()) }
        .expect("the launch itself succeeds; the fault shows later");
    let err = registry.stream_synchronize(registry.stream()).unwrap_err();
    assert!(
        err.is_context_lost() && err.cuda_code() == Some(719),
        "{err}"
    );
    assert_eq!(standin::probe().count("fault"), 1);
    assert!(
        DeviceBuffer::<f32>::alloc(registry.ctx(), 4)
            .unwrap_err()
            .is_context_lost()
    );
}

fn contexts_are_per_thread() {
    let probe = standin::probe();
    let registry = demo();
    let primary = registry.ctx().raw();
    registry.ctx().bind().unwrap();
    assert_eq!(probe.current_context(), primary);
    let foreign = probe.foreign_context(0);
    assert_ne!(foreign, primary);
    assert_eq!(probe.current_context(), foreign);
    std::thread::scope(|s| {
        s.spawn(|| assert!(probe.current_context().is_null(), "a new thread has none"));
    });
    registry.ctx().bind().unwrap();
    assert_eq!(probe.current_context(), primary);
}

fn unloaded_function_is_refused_and_counted() {
    let registry = demo();
    let func = registry.raw_function_cached("noop", "noop").unwrap().raw();
    let stream = registry.raw_stream();
    release(registry).unwrap();
    assert_eq!(standin::probe().count("live_modules"), 0);
    let launch = sys::entry!(raw_driver(), cuLaunchKernel).unwrap();
    // SAFETY: the stand-in recognises handles of unloaded modules without reading freed memory;
    // `noop` takes no parameters.
    let status = unsafe {
        launch(
            func,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            stream,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    assert_eq!(status.0, 400);
    assert_eq!(standin::probe().count("stale_handle"), 1);
}

// ---------------------------------------------------------------------------------------------
// The runner
// ---------------------------------------------------------------------------------------------

#[test]
fn runner_tells_a_crash_from_a_failure() {
    let failed = standin::run_any(panics_on_purpose, &[]);
    assert_eq!(failed.ending, Ending::Failed(101), "{failed}");
    assert!(failed.stdout.contains("before the panic"), "{failed}");
    assert!(failed.stderr.contains("on purpose"), "{failed}");
    let crashed = standin::run_any(aborts_on_purpose, &[]);
    assert_eq!(crashed.ending, Ending::Crashed(6), "SIGABRT: {crashed}");
}

fn panics_on_purpose() {
    println!("before the panic");
    panic!("failing on purpose");
}

fn aborts_on_purpose() {
    std::process::abort();
}
