//! The registry on a real GPU: every result checked against a CPU reference on fresh random data,
//! outputs poisoned (NaN) before each launch.

mod support;

use std::ffi::c_void;

use atlas_kernels::{ELEMENTWISE_FATBIN, ptx_for_model};
use atlas_registry::{
    AtlasError, AtlasRegistry, BlobKind, CudaStream, DeviceBuffer, FunctionCache, LaunchConfig,
    NotFoundKind, cached_function, release,
};
use support::reference::assert_close;
use support::rng::Rng;

const N: usize = 100_003;

fn demo() -> AtlasRegistry {
    AtlasRegistry::load(0, ptx_for_model("demo").unwrap()).expect("the demo model loads")
}

/// Runs elementwise::scale over fresh data on `stream` through `registry` and checks it.
fn check_scale(registry: &AtlasRegistry, module: &str, stream: &CudaStream) {
    let mut rng = Rng::new();
    let input = rng.vec(N);
    let factor = rng.f32() * 4.0;
    let mut x = DeviceBuffer::from_slice(registry.ctx(), stream, &input).unwrap();
    let scale = registry.function_cached(module, "scale").unwrap();
    // SAFETY: `x` holds `N` floats of this registry's device, all that `scale` touches with
    // `n = N`; it outlives the launch (`to_vec` below synchronizes the stream).
    unsafe {
        scale.launch(
            stream,
            &LaunchConfig::for_elements(N as u32, 256),
            (&mut x, factor, N as u32),
        )
    }
    .unwrap();
    let want: Vec<f32> = input.iter().map(|v| v * factor).collect();
    assert_close(&x.to_vec(stream).unwrap(), &want, 1e-6, module);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn loads_ptx_cubin_and_fatbin() {
    let ptx = demo();
    assert_eq!(ptx.module_kind("elementwise"), Some(BlobKind::Ptx));
    check_scale(&ptx, "elementwise", ptx.stream());

    let cubin = AtlasRegistry::load(0, support::blobs::device_cubins("demo")).unwrap();
    assert_eq!(cubin.module_kind("elementwise"), Some(BlobKind::Cubin));
    check_scale(&cubin, "elementwise", cubin.stream());

    let fatbin = AtlasRegistry::load(0, &[("elementwise", ELEMENTWISE_FATBIN)]).unwrap();
    assert_eq!(fatbin.module_kind("elementwise"), Some(BlobKind::Fatbin));
    check_scale(&fatbin, "elementwise", fatbin.stream());
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn one_load_per_blob_and_handles_are_views_of_it() {
    let registry = demo();
    assert_eq!(
        registry.module_names().collect::<Vec<_>>(),
        ["noop", "elementwise", "block_reduce", "device_global"]
    );
    let a = registry.function("elementwise", "scale").unwrap();
    let b = registry.function_cached("elementwise", "scale").unwrap();
    let c = registry
        .raw_function_cached("elementwise", "scale")
        .unwrap();
    assert_eq!(a.raw().raw(), b.raw().raw());
    assert_eq!(b.raw().raw(), c.raw());
    // The raw module is the one loaded: looking the function up in it gives the same handle.
    let module = registry.raw_module("elementwise").unwrap();
    let cuda = atlas_sys::driver().unwrap();
    let get = atlas_sys::entry!(cuda, cuModuleGetFunction).unwrap();
    let mut f = std::ptr::null_mut();
    // SAFETY: live module, NUL-terminated name, live out-pointer; the registry bound its context.
    let status = unsafe { get(&mut f, module, c"scale".as_ptr()) };
    assert_eq!(status, atlas_sys::CUresult::CUDA_SUCCESS);
    assert_eq!(f, c.raw());
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn elementwise_on_own_stream_wrapped_stream_and_stream_zero() {
    let registry = demo();
    let own = CudaStream::new(registry.ctx()).unwrap();
    check_scale(&registry, "elementwise", &own);

    let cuda = atlas_sys::driver().unwrap();
    let create = atlas_sys::entry!(cuda, cuStreamCreate).unwrap();
    let destroy = atlas_sys::entry!(cuda, cuStreamDestroy_v2).unwrap();
    let mut raw = std::ptr::null_mut();
    registry.ctx().bind().unwrap();
    // SAFETY: live out-pointer; the context is current.
    let status = unsafe { create(&mut raw, 0) };
    assert_eq!(status, atlas_sys::CUresult::CUDA_SUCCESS);
    {
        // SAFETY: `raw` is a live stream of this context, destroyed only after `wrapped` is gone.
        let wrapped = unsafe { CudaStream::wrap(registry.ctx(), raw) }.unwrap();
        assert!(!wrapped.is_owned());
        check_scale(&registry, "elementwise", &wrapped);
    }
    // SAFETY: the stream is ours and nothing uses it any more.
    assert_eq!(unsafe { destroy(raw) }, atlas_sys::CUresult::CUDA_SUCCESS);

    check_scale(
        &registry,
        "elementwise",
        &CudaStream::legacy_default(registry.ctx()),
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn raw_launch_on_stream_matches_reference() {
    let registry = demo();
    let mut rng = Rng::new();
    let input = rng.vec(N);
    let factor = rng.f32();
    let x = DeviceBuffer::from_slice(registry.ctx(), registry.stream(), &input).unwrap();
    let func = registry
        .raw_function_cached("elementwise", "scale")
        .unwrap();
    let (mut ptr, mut f, mut n) = (x.device_ptr(), factor, N as u32);
    let mut params = [
        (&mut ptr as *mut u64).cast::<c_void>(),
        (&mut f as *mut f32).cast::<c_void>(),
        (&mut n as *mut u32).cast::<c_void>(),
    ];
    let cfg = LaunchConfig::for_elements(N as u32, 128);
    // SAFETY: scale(float*, float, unsigned) gets a pointer to a live buffer of N floats, a float
    // and N; the registry's stream is live.
    unsafe { registry.launch_on_stream(func, &cfg, registry.raw_stream(), &mut params) }.unwrap();
    let want: Vec<f32> = input.iter().map(|v| v * factor).collect();
    assert_close(
        &x.to_vec(registry.stream()).unwrap(),
        &want,
        1e-6,
        "raw launch",
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn shared_memory_96k_opt_in_once_and_correct_twice() {
    let registry = demo();
    const CHUNK: u32 = 24_576; // 96 KiB of floats per block
    let blocks = 7usize;
    let n = CHUNK as usize * blocks - 1000;
    let func = registry
        .function_cached("block_reduce", "block_sum")
        .unwrap();
    let cfg = LaunchConfig {
        grid: (blocks as u32, 1, 1),
        block: (1024, 1, 1),
        shared_mem_bytes: CHUNK * 4,
    };
    let stream = registry.stream();
    for round in 0..2 {
        let mut rng = Rng::new();
        let input = rng.vec(n);
        let x = DeviceBuffer::from_slice(registry.ctx(), stream, &input).unwrap();
        let mut out =
            DeviceBuffer::from_slice(registry.ctx(), stream, &vec![f32::NAN; blocks]).unwrap();
        // SAFETY: block_sum reads `x` (`n` floats) only below `n`, writes one float per block to
        // `out` (`blocks` floats, the grid), and stages `CHUNK` floats in the `CHUNK * 4` bytes of
        // dynamic shared memory; both buffers outlive the launch (`to_vec` below synchronizes).
        unsafe { func.launch(stream, &cfg, (&x, &mut out, n as u32, CHUNK)) }.unwrap();
        let want: Vec<f32> = input
            .chunks(CHUNK as usize)
            .map(|c| c.iter().map(|&v| f64::from(v)).sum::<f64>() as f32)
            .collect();
        let got = out.to_vec(stream).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() < 1e-2,
                "round {round}, block {i}: got {g}, want {w}"
            );
        }
    }
    // The opt-in was made: the function's limit is now at least 96 KiB.
    let cuda = atlas_sys::driver().unwrap();
    let get = atlas_sys::entry!(cuda, cuFuncGetAttribute).unwrap();
    let mut limit = 0;
    let attr = atlas_sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
    // SAFETY: live function of the bound context, live out-pointer.
    let status = unsafe { get(&mut limit, attr, func.raw().raw()) };
    assert_eq!(status, atlas_sys::CUresult::CUDA_SUCCESS);
    assert_eq!(limit, (CHUNK * 4) as i32);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn device_symbol_write_then_launch_sees_it() {
    let registry = demo();
    let mut rng = Rng::new();
    let bias = registry.device_symbol("device_global", "bias").unwrap();
    assert_eq!(bias.size(), 4);
    let value = rng.f32() * 10.0;
    bias.write(&[value]).unwrap();
    let mut back = [f32::NAN];
    bias.read(&mut back).unwrap();
    assert_eq!(back[0], value);
    assert!(matches!(
        bias.write(&[1.0f64]),
        Err(AtlasError::SizeMismatch {
            expected: 4,
            given: 8,
            ..
        })
    ));

    let input = rng.vec(N);
    let stream = registry.stream();
    let mut x = DeviceBuffer::from_slice(registry.ctx(), stream, &input).unwrap();
    let add = registry
        .function_cached("device_global", "add_bias")
        .unwrap();
    // SAFETY: `x` holds `N` floats, all that add_bias touches with `n = N`; it outlives the
    // launch (`to_vec` below synchronizes the stream).
    unsafe {
        add.launch(
            stream,
            &LaunchConfig::for_elements(N as u32, 256),
            (&mut x, N as u32),
        )
    }
    .unwrap();
    let want: Vec<f32> = input.iter().map(|v| v + value).collect();
    assert_close(&x.to_vec(stream).unwrap(), &want, 1e-6, "add_bias");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn launch_from_a_thread_that_never_touched_cuda() {
    let registry = demo();
    std::thread::spawn(move || check_scale(&registry, "elementwise", registry.stream()))
        .join()
        .unwrap();
}

fn transform(registry: &AtlasRegistry, input: &[f32]) -> Vec<f32> {
    let stream = registry.stream();
    let x = DeviceBuffer::from_slice(registry.ctx(), stream, input).unwrap();
    let mut out =
        DeviceBuffer::from_slice(registry.ctx(), stream, &vec![f32::NAN; input.len()]).unwrap();
    let n = input.len() as u32;
    // SAFETY: `x` and `out` each hold `n` floats, all that transform reads and writes; both
    // outlive the launch (`to_vec` below synchronizes the stream).
    unsafe {
        cached_function!(registry, "model", "transform")
            .unwrap()
            .launch(
                stream,
                &LaunchConfig::for_elements(n, 256),
                (&x, &mut out, n),
            )
    }
    .unwrap();
    out.to_vec(stream).unwrap()
}

fn model_a_ref(v: &[f32]) -> Vec<f32> {
    v.iter().map(|x| x * 2.0 + 1.0).collect()
}

fn model_b_ref(v: &[f32]) -> Vec<f32> {
    v.iter().map(|x| x * -3.0 + 0.5).collect()
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn model_a_then_model_b_gives_b_results() {
    let input = Rng::new().vec(N);
    let a = AtlasRegistry::load(0, ptx_for_model("model_a").unwrap()).unwrap();
    assert_close(
        &transform(&a, &input),
        &model_a_ref(&input),
        1e-6,
        "model A",
    );
    release(a).unwrap();
    let b = AtlasRegistry::load(0, ptx_for_model("model_b").unwrap()).unwrap();
    assert_close(
        &transform(&b, &input),
        &model_b_ref(&input),
        1e-6,
        "model B after A",
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn two_models_alive_at_once_each_give_their_own() {
    let input = Rng::new().vec(N);
    let a = AtlasRegistry::load(0, ptx_for_model("model_a").unwrap()).unwrap();
    let b = AtlasRegistry::load(0, support::blobs::device_cubins("model_b")).unwrap();
    for _ in 0..3 {
        assert_close(
            &transform(&a, &input),
            &model_a_ref(&input),
            1e-6,
            "model A",
        );
        assert_close(
            &transform(&b, &input),
            &model_b_ref(&input),
            1e-6,
            "model B",
        );
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn one_call_site_alternates_models_while_they_are_dropped_and_reloaded() {
    static TRANSFORM: FunctionCache = FunctionCache::new("model", "transform");
    let mut rng = Rng::new();
    let n = 256usize;
    let mut a = AtlasRegistry::load(0, ptx_for_model("model_a").unwrap()).unwrap();
    let mut b = AtlasRegistry::load(0, ptx_for_model("model_b").unwrap()).unwrap();
    let host = atlas_registry::host(0).unwrap();
    let stream = host.stream();
    let input = rng.vec(n);
    let (want_a, want_b) = (model_a_ref(&input), model_b_ref(&input));
    let x = DeviceBuffer::from_slice(a.ctx(), stream, &input).unwrap();
    let mut out = DeviceBuffer::<f32>::alloc(a.ctx(), n).unwrap();
    let poison = vec![f32::NAN; n];
    let mut got = vec![0f32; n];
    let cfg = LaunchConfig::for_elements(n as u32, 256);
    for i in 0..10_000 {
        if i % 1000 == 999 {
            // Drop and reload both models: the call site must follow the new registries.
            a = AtlasRegistry::load(0, ptx_for_model("model_a").unwrap()).unwrap();
            b = AtlasRegistry::load(0, support::blobs::device_cubins("model_b")).unwrap();
        }
        let (registry, want, name) = if i % 2 == 0 {
            (&a, &want_a, "A")
        } else {
            (&b, &want_b, "B")
        };
        out.copy_from(stream, &poison).unwrap();
        // SAFETY: `x` and `out` each hold `n` floats, all that transform touches; both outlive the
        // launch (`copy_to` below synchronizes the stream).
        unsafe {
            TRANSFORM
                .get(registry)
                .unwrap()
                .launch(stream, &cfg, (&x, &mut out, n as u32))
        }
        .unwrap();
        out.copy_to(stream, &mut got).unwrap();
        assert_close(&got, want, 1e-6, &format!("iteration {i}, model {name}"));
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn typed_launch_checks_arguments_against_the_kernel() {
    let registry = demo();
    let scale = registry.function_cached("elementwise", "scale").unwrap();
    assert_eq!(scale.param_sizes().unwrap(), Some(&[8usize, 4, 4][..]));
    let x = DeviceBuffer::<f32>::alloc(registry.ctx(), 16).unwrap();
    let cfg = LaunchConfig::for_elements(16, 16);
    // SAFETY: refused before the driver is called (two arguments for three parameters), so the
    // kernel never runs.
    let few = unsafe { scale.launch(registry.stream(), &cfg, (&x, 2.0f32)) }
        .unwrap_err()
        .to_string();
    assert!(
        few.contains("elementwise::scale") && few.contains("[8, 4, 4]") && few.contains("[8, 4]"),
        "{few}"
    );
    // SAFETY: refused before the driver is called (an 8-byte factor for a 4-byte parameter), so
    // the kernel never runs.
    let wrong = unsafe { scale.launch(registry.stream(), &cfg, (&x, 2.0f64, 16u32)) }
        .unwrap_err()
        .to_string();
    assert!(wrong.contains("[8, 8, 4]"), "{wrong}");
    let big = LaunchConfig {
        block: (2048, 1, 1),
        ..cfg
    };
    // SAFETY: refused before the driver is called (a 2048-thread block, past the device's
    // limit), so the kernel never runs; `x` holds the 16 floats it would touch anyway.
    let limit = unsafe { scale.launch(registry.stream(), &big, (&x, 2.0f32, 16u32)) }
        .unwrap_err()
        .to_string();
    assert!(
        limit.contains("elementwise::scale") && limit.contains("largest block"),
        "{limit}"
    );
    // The registry still works after refusing those.
    check_scale(&registry, "elementwise", registry.stream());
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn ptx_syntax_error_reports_the_jit_log() {
    let bad = b".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry broken()\n{\n  this is not ptx;\n}\n";
    let err = AtlasRegistry::load(0, &[("broken", bad.as_slice())]).unwrap_err();
    let AtlasError::ModuleLoad {
        module, jit_log, ..
    } = &err
    else {
        panic!("expected ModuleLoad, got {err}")
    };
    assert_eq!(module, "broken");
    assert!(jit_log.contains("line"), "JIT log: {jit_log}");
    assert!(err.to_string().contains("JIT log"), "{err}");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn unknown_names_give_errors_naming_them() {
    let registry = demo();
    let e = registry.function("nope", "scale").unwrap_err();
    assert!(
        matches!(&e, AtlasError::NotFound { kind: NotFoundKind::Module, name, .. } if name == "nope"),
        "{e}"
    );
    let e = registry.function_cached("elementwise", "nope").unwrap_err();
    assert!(
        matches!(&e, AtlasError::NotFound { kind: NotFoundKind::Function, name, .. } if name == "elementwise::nope"),
        "{e}"
    );
    let e = registry.device_symbol("device_global", "nope").unwrap_err();
    assert!(
        matches!(&e, AtlasError::NotFound { kind: NotFoundKind::Symbol, name, .. } if name == "device_global::nope"),
        "{e}"
    );
    assert!(e.to_string().contains("device_global::nope"), "{e}");
    check_scale(&registry, "elementwise", registry.stream());
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn release_is_refused_while_handles_live_and_unloads_after() {
    let registry = demo();
    let f = registry.function("elementwise", "scale").unwrap();
    let clone = registry.clone();
    let e = release(registry).unwrap_err();
    assert!(matches!(e, AtlasError::InUse { handles: 2, .. }), "{e}");
    // Nothing was unloaded: the function still works.
    check_scale(&clone, "elementwise", clone.stream());
    drop(f);
    release(clone).unwrap();
}
