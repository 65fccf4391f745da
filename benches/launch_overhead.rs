//! Launch-overhead benches: what the Atlas layer adds to the raw CUDA driver calls it wraps.
//!
//! Every group measures a raw-driver baseline (`…/raw`: entry points from `atlas_sys::entry!`,
//! called directly) next to the Atlas paths, in the same binary and the same run, on the same
//! primary context and the same stream (the registry's), so that the only difference is the Atlas
//! layer.
//!
//! | group             | benchmark IDs                                                          |
//! |-------------------|------------------------------------------------------------------------|
//! | 1 enqueue         | `enqueue/{noop,scale}/{raw,atlas_raw,atlas_typed,raw_again}`           |
//! | 2 round trip      | `roundtrip/noop/{raw,atlas_raw,atlas_typed}`                           |
//! | 3 function lookup | `lookup/scale/{raw,function_cached,raw_function_cached,function_cache_get}` |
//! | 4 96 KiB smem     | `shared_mem_96k/block_sum/{raw,atlas_raw,atlas_typed,raw_again}`       |
//! | 5 replaced path   | `replaced/noop/{raw_load_per_call,atlas_cached,raw_fresh_context}`     |
//! | 6 model load      | `model_load/{demo_ptx,demo_cubin}/{raw,atlas}`                         |
//! | 7 graph replay    | `graph_replay/noop256/{eager,replay}` (per kernel, synchronize included) |
//! | 8 load everywhere | `load_all_devices/{N}_gpus/{registry_per_device,one_library}`          |
//!
//! `raw_again` repeats `raw` after the Atlas variants: the spread between the two is the drift of
//! the machine over the group, against which the Atlas ratios are read.
//!
//! `raw` launches use the registry's stream and a `CUfunction` from `cuModuleGetFunction` on the
//! registry's own module; `atlas_raw` is [`AtlasRegistry::launch_on_stream`] with a
//! `raw_function_cached` handle; `atlas_typed` is `FunctionCache::get` + `FunctionRef::launch`, as
//! a call site in user code writes it.
//!
//! Run on a GPU machine with `cargo bench --bench launch_overhead` (about two minutes). Without
//! `--bench` (as `cargo test --benches` runs it) criterion runs each bench once, as a smoke test.
//! Without a driver or a device the binary prints one line saying so and exits 0.

use std::ffi::{CStr, c_void};
use std::hint::black_box;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use atlas_registry::{
    AtlasError, AtlasLibrary, AtlasRegistry, CudaStream, DeviceBuffer, FunctionCache, LaunchConfig,
    cuda_error_text, device_count, release,
};
use atlas_sys::{
    CUcontext, CUfunction, CUfunction_attribute, CUmodule, CUresult, CUstream, CudaDriver,
};
use criterion::{BenchmarkId, Criterion, SamplingMode};

/// Enqueue benches time launches in batches of this many, synchronizing between batches.
const BATCH: u64 = 256;
/// Elements of the `scale` benches: small, so the kernel itself costs next to nothing.
const SCALE_N: u32 = 1 << 10;
/// Threads per block of the `scale` benches.
const SCALE_BLOCK: u32 = 256;
/// Floats per block of `block_sum`: 24576 × 4 B = 96 KiB of dynamic shared memory.
const SUM_CHUNK: u32 = 24_576;
/// Blocks of the `block_sum` benches.
const SUM_BLOCKS: u32 = 4;
/// Threads per block of `block_sum` (its static `partial` array has 1024 entries).
const SUM_BLOCK: u32 = 1024;
/// Dynamic shared memory of one `block_sum` block, in bytes.
const SUM_SHARED: u32 = SUM_CHUNK * 4;

/// The typed path's call sites: one static cache each, as user code declares them.
static NOOP: FunctionCache = FunctionCache::new("noop", "noop");
static SCALE: FunctionCache = FunctionCache::new("elementwise", "scale");
static BLOCK_SUM: FunctionCache = FunctionCache::new("block_reduce", "block_sum");

/// `sym!(cuda, cuName)`: the entry point as a plain function pointer, or a panic naming it (setup
/// only, never in a timed loop).
macro_rules! sym {
    ($cuda:expr, $name:ident) => {
        atlas_sys::entry!($cuda, $name).unwrap_or_else(|e| panic!("launch_overhead setup: {e}"))
    };
}

/// Panics naming `call` unless `status` is success. Inlined into the timed loops: the raw
/// baseline checks every status, as the Atlas paths do.
#[inline(always)]
fn check(status: CUresult, call: &str) {
    if status != CUresult::CUDA_SUCCESS {
        driver_failed(status, call);
    }
}

#[cold]
#[inline(never)]
fn driver_failed(status: CUresult, call: &str) -> ! {
    panic!(
        "launch_overhead: {call} failed: {}",
        cuda_error_text(status.0)
    )
}

/// The value of an Atlas call, or a panic naming what was being done.
#[inline(always)]
fn ok<T>(result: Result<T, AtlasError>, what: &str) -> T {
    match result {
        Ok(value) => value,
        Err(e) => atlas_failed(what, &e),
    }
}

#[cold]
#[inline(never)]
fn atlas_failed(what: &str, e: &AtlasError) -> ! {
    panic!("launch_overhead: {what}: {e}")
}

/// Enqueue timing convention: one criterion iteration is ONE launch, so criterion reports the host
/// time of enqueueing one launch directly. The `iters` launches go out in batches of [`BATCH`]
/// (the last one may be shorter); only the enqueues of a batch are timed, and `sync` runs after
/// each batch outside the timed region, so the launch queue never fills and never stalls the host.
fn time_enqueues(iters: u64, sync: &impl Fn(), mut launch: impl FnMut()) -> Duration {
    sync();
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let batch = left.min(BATCH);
        let start = Instant::now();
        for _ in 0..batch {
            launch();
        }
        total += start.elapsed();
        sync();
        left -= batch;
    }
    total
}

/// The raw baseline's launch: one checked `cuLaunchKernel` of `func` with `cfg` and `params`.
///
/// # Safety
///
/// `func` is a live function of the current context, `stream` a live stream of it, and `params`
/// matches the kernel's parameters, its targets outliving the returned closure.
unsafe fn raw_launcher(
    cuda: &'static CudaDriver,
    func: CUfunction,
    cfg: LaunchConfig,
    stream: CUstream,
    params: *mut *mut c_void,
) -> impl Fn() {
    let launch = sym!(cuda, cuLaunchKernel);
    move || {
        let (g, b) = (cfg.grid, cfg.block);
        // SAFETY: raw_launcher's caller vouched for func, stream and params.
        let status = unsafe {
            launch(
                func,
                g.0,
                g.1,
                g.2,
                b.0,
                b.1,
                b.2,
                cfg.shared_mem_bytes,
                stream,
                params,
                null_mut(),
            )
        };
        check(status, "cuLaunchKernel");
    }
}

/// What every group shares: the demo model loaded once from PTX, and the driver table.
struct Env {
    registry: AtlasRegistry,
    cuda: &'static CudaDriver,
}

impl Env {
    fn new() -> Self {
        let ptx = atlas_kernels::ptx_for_model("demo").expect("the demo model has PTX blobs");
        let registry = ok(
            AtlasRegistry::load(0, ptx),
            "loading the demo PTX on device 0",
        );
        let cuda = atlas_sys::driver().unwrap_or_else(|e| panic!("launch_overhead setup: {e}"));
        // The raw calls below use the primary context that Atlas holds: make it current here.
        ok(registry.ctx().bind(), "binding the primary context");
        Self { registry, cuda }
    }

    /// `cuModuleGetFunction(module, name)`, checked: the raw baseline's own lookup, in the
    /// registry's module (the same module, not a second load).
    fn raw_function(&self, module: &str, name: &CStr) -> CUfunction {
        let get_function = sym!(self.cuda, cuModuleGetFunction);
        let module = ok(self.registry.raw_module(module), "raw_module");
        let mut func: CUfunction = null_mut();
        // SAFETY: `module` is loaded while the registry lives, `name` is NUL-terminated, `func` is a
        // live out-pointer, and the module's context is current (Env::new bound it).
        check(
            unsafe { get_function(&mut func, module, name.as_ptr()) },
            "cuModuleGetFunction",
        );
        func
    }

    /// Synchronizes the registry's stream with the raw entry point (used outside timed regions).
    fn syncer(&self) -> impl Fn() + use<> {
        let sync = sym!(self.cuda, cuStreamSynchronize);
        let stream = self.registry.raw_stream();
        move || {
            // SAFETY: the registry's stream lives for the process (its host is process-wide).
            check(unsafe { sync(stream) }, "cuStreamSynchronize");
        }
    }
}

/// Group 1: the host cost of enqueueing one launch (see [`time_enqueues`]).
fn enqueue(c: &mut Criterion, env: &Env) {
    let registry = &env.registry;
    let stream = registry.raw_stream();
    let sync = env.syncer();
    let mut group = c.benchmark_group("enqueue");

    // noop: no parameters, one block of one thread.
    let noop_raw = env.raw_function("noop", c"noop");
    let noop_atlas = ok(registry.raw_function_cached("noop", "noop"), "noop handle");
    let one = LaunchConfig::for_elements(1, 1);
    // SAFETY: a live function of the current context taking no parameters, on the registry's
    // live stream.
    let noop_raw_launch = unsafe { raw_launcher(env.cuda, noop_raw, one, stream, null_mut()) };
    group.bench_function(BenchmarkId::new("noop", "raw"), |b| {
        b.iter_custom(|iters| time_enqueues(iters, &sync, &noop_raw_launch))
    });
    group.bench_function(BenchmarkId::new("noop", "atlas_raw"), |b| {
        b.iter_custom(|iters| {
            time_enqueues(iters, &sync, || {
                // SAFETY: the handle comes from this registry, the stream is its own, and the
                // kernel takes no parameters.
                let result =
                    unsafe { registry.launch_on_stream(noop_atlas, &one, stream, &mut []) };
                ok(result, "launch_on_stream noop");
            })
        })
    });
    group.bench_function(BenchmarkId::new("noop", "atlas_typed"), |b| {
        b.iter_custom(|iters| {
            time_enqueues(iters, &sync, || {
                let noop = ok(NOOP.get(registry), "FunctionCache::get noop");
                ok(noop.launch(registry.stream(), &one, ()), "launch noop");
            })
        })
    });
    group.bench_function(BenchmarkId::new("noop", "raw_again"), |b| {
        b.iter_custom(|iters| time_enqueues(iters, &sync, &noop_raw_launch))
    });

    // scale(float* x, float factor, unsigned n): three parameters, 4 blocks of 256 threads.
    // Factor 1.0 keeps x unchanged however many launches run.
    let host = vec![1.0f32; SCALE_N as usize];
    let x = ok(
        DeviceBuffer::from_slice(registry.ctx(), registry.stream(), &host),
        "allocating scale's buffer",
    );
    let scale_raw = env.raw_function("elementwise", c"scale");
    let scale_atlas = ok(
        registry.raw_function_cached("elementwise", "scale"),
        "scale handle",
    );
    let cfg = LaunchConfig::for_elements(SCALE_N, SCALE_BLOCK);
    let (mut ptr, mut factor, mut n) = (x.device_ptr(), 1.0f32, SCALE_N);
    // The raw baseline's best case: the parameter array is built once, outside the loop; the raw
    // Atlas path launches with the same array.
    let mut params: [*mut c_void; 3] = [
        (&raw mut ptr).cast(),
        (&raw mut factor).cast(),
        (&raw mut n).cast(),
    ];
    let params_ptr = params.as_mut_ptr();
    // SAFETY: a live function of the current context and the registry's stream; `params` holds a
    // CUdeviceptr of a live buffer of SCALE_N floats, an f32 and a u32 (scale's parameters), all
    // outliving the group.
    let scale_raw_launch = unsafe { raw_launcher(env.cuda, scale_raw, cfg, stream, params_ptr) };
    group.bench_function(BenchmarkId::new("scale", "raw"), |b| {
        b.iter_custom(|iters| time_enqueues(iters, &sync, &scale_raw_launch))
    });
    group.bench_function(BenchmarkId::new("scale", "atlas_raw"), |b| {
        b.iter_custom(|iters| {
            time_enqueues(iters, &sync, || {
                // SAFETY: the handle comes from this registry and the stream is its own; `params`
                // matches scale's parameters (see the raw bench) and its targets outlive the call.
                let result =
                    unsafe { registry.launch_on_stream(scale_atlas, &cfg, stream, &mut params) };
                ok(result, "launch_on_stream scale");
            })
        })
    });
    group.bench_function(BenchmarkId::new("scale", "atlas_typed"), |b| {
        b.iter_custom(|iters| {
            time_enqueues(iters, &sync, || {
                let scale = ok(SCALE.get(registry), "FunctionCache::get scale");
                ok(
                    scale.launch(registry.stream(), &cfg, (&x, 1.0f32, SCALE_N)),
                    "launch scale",
                );
            })
        })
    });
    group.bench_function(BenchmarkId::new("scale", "raw_again"), |b| {
        b.iter_custom(|iters| time_enqueues(iters, &sync, &scale_raw_launch))
    });
    group.finish();
    sync();
}

/// Group 2: one launch and waiting for it, the latency a synchronous caller sees.
fn roundtrip(c: &mut Criterion, env: &Env) {
    let launch = sym!(env.cuda, cuLaunchKernel);
    let sync = sym!(env.cuda, cuStreamSynchronize);
    let registry = &env.registry;
    let stream = registry.raw_stream();
    let noop_raw = env.raw_function("noop", c"noop");
    let noop_atlas = ok(registry.raw_function_cached("noop", "noop"), "noop handle");
    let one = LaunchConfig::for_elements(1, 1);
    let mut group = c.benchmark_group("roundtrip");
    group.bench_function(BenchmarkId::new("noop", "raw"), |b| {
        b.iter(|| {
            // SAFETY: a live function of the current context taking no parameters, on the
            // registry's live stream.
            let status = unsafe {
                launch(
                    noop_raw,
                    1,
                    1,
                    1,
                    1,
                    1,
                    1,
                    0,
                    stream,
                    null_mut(),
                    null_mut(),
                )
            };
            check(status, "cuLaunchKernel");
            // SAFETY: the registry's stream lives for the process.
            check(unsafe { sync(stream) }, "cuStreamSynchronize");
        })
    });
    group.bench_function(BenchmarkId::new("noop", "atlas_raw"), |b| {
        b.iter(|| {
            // SAFETY: the handle comes from this registry, the stream is its own, and the kernel
            // takes no parameters.
            let result = unsafe { registry.launch_on_stream(noop_atlas, &one, stream, &mut []) };
            ok(result, "launch_on_stream noop");
            ok(registry.stream_synchronize(), "stream_synchronize");
        })
    });
    group.bench_function(BenchmarkId::new("noop", "atlas_typed"), |b| {
        b.iter(|| {
            let noop = ok(NOOP.get(registry), "FunctionCache::get noop");
            ok(noop.launch(registry.stream(), &one, ()), "launch noop");
            ok(registry.stream().synchronize(), "CudaStream::synchronize");
        })
    });
    group.finish();
}

/// Group 3: finding `elementwise::scale` in the loaded module, each way there is.
fn lookup(c: &mut Criterion, env: &Env) {
    let get_function = sym!(env.cuda, cuModuleGetFunction);
    let registry = &env.registry;
    let module = ok(registry.raw_module("elementwise"), "raw_module elementwise");
    let mut group = c.benchmark_group("lookup");
    group.bench_function(BenchmarkId::new("scale", "raw"), |b| {
        b.iter(|| {
            let mut func: CUfunction = null_mut();
            // SAFETY: the module is loaded while the registry lives, the name is NUL-terminated,
            // `func` is a live out-pointer, and the module's context is current.
            let status =
                unsafe { get_function(&mut func, black_box(module), black_box(c"scale").as_ptr()) };
            check(status, "cuModuleGetFunction");
            func
        })
    });
    group.bench_function(BenchmarkId::new("scale", "function_cached"), |b| {
        b.iter(|| {
            ok(
                registry.function_cached(black_box("elementwise"), black_box("scale")),
                "function_cached",
            )
        })
    });
    group.bench_function(BenchmarkId::new("scale", "raw_function_cached"), |b| {
        b.iter(|| {
            ok(
                registry.raw_function_cached(black_box("elementwise"), black_box("scale")),
                "raw_function_cached",
            )
        })
    });
    group.bench_function(BenchmarkId::new("scale", "function_cache_get"), |b| {
        b.iter(|| ok(SCALE.get(black_box(registry)), "FunctionCache::get").raw())
    });
    group.finish();
}

/// Group 4: enqueueing a launch that needs the >48 KiB dynamic shared memory opt-in (96 KiB).
/// The raw baseline opts in once before timing; Atlas does it on its first launch (in warm-up).
fn shared_mem(c: &mut Criterion, env: &Env) {
    let registry = &env.registry;
    let limit = registry.host().limits().max_shared_mem_optin;
    if limit < SUM_SHARED {
        eprintln!(
            "launch_overhead: skipping shared_mem_96k: the device allows {limit} B of dynamic shared memory per block, the bench needs {SUM_SHARED} B"
        );
        return;
    }
    let set_attribute = sym!(env.cuda, cuFuncSetAttribute);
    let stream = registry.raw_stream();
    let sync = env.syncer();

    let len = (SUM_CHUNK * SUM_BLOCKS) as usize;
    let input = ok(
        DeviceBuffer::from_slice(registry.ctx(), registry.stream(), &vec![1.0f32; len]),
        "allocating block_sum's input",
    );
    let mut output = ok(
        DeviceBuffer::<f32>::alloc(registry.ctx(), SUM_BLOCKS as usize),
        "allocating block_sum's output",
    );
    let sum_raw = env.raw_function("block_reduce", c"block_sum");
    let attribute = CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
    // SAFETY: a live function of the current context; the size is within the device's opt-in
    // maximum (checked above).
    check(
        unsafe { set_attribute(sum_raw, attribute, SUM_SHARED as i32) },
        "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)",
    );
    let sum_atlas = ok(
        registry.raw_function_cached("block_reduce", "block_sum"),
        "block_sum handle",
    );
    let cfg = LaunchConfig {
        grid: (SUM_BLOCKS, 1, 1),
        block: (SUM_BLOCK, 1, 1),
        shared_mem_bytes: SUM_SHARED,
    };
    let n = len as u32;
    let (mut in_ptr, mut out_ptr, mut n_param, mut chunk) =
        (input.device_ptr(), output.device_ptr(), n, SUM_CHUNK);
    let mut params: [*mut c_void; 4] = [
        (&raw mut in_ptr).cast(),
        (&raw mut out_ptr).cast(),
        (&raw mut n_param).cast(),
        (&raw mut chunk).cast(),
    ];
    let mut group = c.benchmark_group("shared_mem_96k");
    let params_ptr = params.as_mut_ptr();
    // SAFETY: a live function of the current context, opted in to SUM_SHARED bytes; `params` holds
    // two CUdeviceptrs of live buffers and two u32s (block_sum's parameters), outliving the group.
    let sum_raw_launch = unsafe { raw_launcher(env.cuda, sum_raw, cfg, stream, params_ptr) };
    group.bench_function(BenchmarkId::new("block_sum", "raw"), |b| {
        b.iter_custom(|iters| time_enqueues(iters, &sync, &sum_raw_launch))
    });
    group.bench_function(BenchmarkId::new("block_sum", "atlas_raw"), |b| {
        b.iter_custom(|iters| {
            time_enqueues(iters, &sync, || {
                // SAFETY: the handle comes from this registry and the stream is its own; `params`
                // matches block_sum's parameters (see the raw bench) and its targets outlive the call.
                let result =
                    unsafe { registry.launch_on_stream(sum_atlas, &cfg, stream, &mut params) };
                ok(result, "launch_on_stream block_sum");
            })
        })
    });
    group.bench_function(BenchmarkId::new("block_sum", "atlas_typed"), |b| {
        b.iter_custom(|iters| {
            time_enqueues(iters, &sync, || {
                let sum = ok(BLOCK_SUM.get(registry), "FunctionCache::get block_sum");
                ok(
                    sum.launch(registry.stream(), &cfg, (&input, &mut output, n, SUM_CHUNK)),
                    "launch block_sum",
                );
            })
        })
    });
    group.bench_function(BenchmarkId::new("block_sum", "raw_again"), |b| {
        b.iter_custom(|iters| time_enqueues(iters, &sync, &sum_raw_launch))
    });
    group.finish();
    sync();
}

/// `blob` as the driver takes PTX: NUL-terminated.
fn nul_terminated(blob: &[u8]) -> Vec<u8> {
    let mut text = blob.to_vec();
    if text.last() != Some(&0) {
        text.push(0);
    }
    text
}

/// Group 5: what the registry replaces. Per call: load the noop PTX, look the kernel up, launch,
/// wait, unload (`raw_load_per_call`), against Atlas's cached path (`atlas_cached`); and the
/// worst case, a fresh context per call (`raw_fresh_context`, ~100 ms each: 10 samples).
fn replaced(c: &mut Criterion, env: &Env) {
    let cuda = env.cuda;
    let load = sym!(cuda, cuModuleLoadData);
    let get_function = sym!(cuda, cuModuleGetFunction);
    let launch = sym!(cuda, cuLaunchKernel);
    let sync = sym!(cuda, cuStreamSynchronize);
    let unload = sym!(cuda, cuModuleUnload);
    let registry = &env.registry;
    let stream = registry.raw_stream();
    let blobs = atlas_kernels::ptx_for_model("demo").expect("the demo model has PTX blobs");
    let (_, noop_blob) = blobs
        .iter()
        .find(|(name, _)| *name == "noop")
        .expect("the demo model has a noop module");
    let noop_ptx = nul_terminated(noop_blob);
    let one = LaunchConfig::for_elements(1, 1);

    // Load, look up, launch and wait in the current context on `stream`, then unload.
    let load_launch_unload = |stream| {
        let mut module: CUmodule = null_mut();
        let mut func: CUfunction = null_mut();
        // SAFETY: the image is NUL-terminated PTX and outlives the call; every out-pointer is a
        // live local; the function launched takes no parameters and comes from the module loaded
        // here, unloaded only after the stream has finished with it; a context is current.
        unsafe {
            check(
                load(&mut module, noop_ptx.as_ptr().cast()),
                "cuModuleLoadData",
            );
            check(
                get_function(&mut func, module, c"noop".as_ptr()),
                "cuModuleGetFunction",
            );
            check(
                launch(func, 1, 1, 1, 1, 1, 1, 0, stream, null_mut(), null_mut()),
                "cuLaunchKernel",
            );
            check(sync(stream), "cuStreamSynchronize");
            check(unload(module), "cuModuleUnload");
        }
    };

    let mut group = c.benchmark_group("replaced");
    group.bench_function(BenchmarkId::new("noop", "raw_load_per_call"), |b| {
        b.iter(|| load_launch_unload(stream))
    });
    group.bench_function(BenchmarkId::new("noop", "atlas_cached"), |b| {
        b.iter(|| {
            let noop = ok(NOOP.get(registry), "FunctionCache::get noop");
            ok(noop.launch(registry.stream(), &one, ()), "launch noop");
            ok(registry.stream_synchronize(), "stream_synchronize");
        })
    });

    match (
        atlas_sys::entry!(cuda, cuCtxCreate_v2),
        atlas_sys::entry!(cuda, cuCtxDestroy_v2),
    ) {
        (Ok(create), Ok(destroy)) => {
            let device = registry.ctx().device();
            group
                .sample_size(10)
                .sampling_mode(SamplingMode::Flat)
                .measurement_time(Duration::from_secs(3));
            group.bench_function(BenchmarkId::new("noop", "raw_fresh_context"), |b| {
                b.iter(|| {
                    let mut ctx: CUcontext = null_mut();
                    // SAFETY: `ctx` is a live out-pointer and `device` a device of this driver;
                    // the new context is pushed, current to this thread.
                    check(unsafe { create(&mut ctx, 0, device) }, "cuCtxCreate_v2");
                    // The new context's legacy default stream (null).
                    load_launch_unload(null_mut());
                    // SAFETY: `ctx` was created above and is destroyed once; being current, it is
                    // popped, which makes the primary context current again.
                    check(unsafe { destroy(ctx) }, "cuCtxDestroy_v2");
                })
            });
            // Atlas's thread-local binding cannot see the pushes and pops above: make the primary
            // context current again, explicitly, and check that it is.
            ok(registry.ctx().rebind(), "rebinding the primary context");
            let get_current = sym!(cuda, cuCtxGetCurrent);
            let mut current: CUcontext = null_mut();
            // SAFETY: `current` is a live out-pointer.
            check(unsafe { get_current(&mut current) }, "cuCtxGetCurrent");
            assert_eq!(
                current,
                registry.ctx().raw(),
                "launch_overhead: the primary context is not current after raw_fresh_context"
            );
        }
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("launch_overhead: skipping replaced/noop/raw_fresh_context: {e}");
        }
    }
    group.finish();
}

/// Group 6: loading (and unloading) the whole demo model, PTX and cubin, raw and through Atlas.
fn model_load(c: &mut Criterion, env: &Env) {
    let load = sym!(env.cuda, cuModuleLoadData);
    let unload = sym!(env.cuda, cuModuleUnload);
    let ptx = atlas_kernels::ptx_for_model("demo").expect("the demo model has PTX blobs");
    let cubin = atlas_kernels::cubin_for_model("demo").expect("the demo model has cubins");
    // The sm_90 cubins load only on sm_90 devices: try once, skip them elsewhere.
    let cubin_loads = match AtlasRegistry::load(0, cubin) {
        Ok(probe) => {
            ok(release(probe), "releasing the demo cubins");
            true
        }
        Err(e) => {
            eprintln!("launch_overhead: skipping model_load/demo_cubin: {e}");
            false
        }
    };
    let ptx_images: Vec<Vec<u8>> = ptx.iter().map(|(_, blob)| nul_terminated(blob)).collect();
    let cubin_images: Vec<Vec<u8>> = cubin.iter().map(|(_, blob)| blob.to_vec()).collect();

    let mut group = c.benchmark_group("model_load");
    let mut cases = vec![("demo_ptx", ptx, &ptx_images)];
    if cubin_loads {
        cases.push(("demo_cubin", cubin, &cubin_images));
    }
    for (name, blobs, images) in cases {
        let mut modules: Vec<CUmodule> = Vec::with_capacity(images.len());
        group.bench_function(BenchmarkId::new(name, "raw"), |b| {
            b.iter(|| {
                for image in images {
                    let mut module: CUmodule = null_mut();
                    // SAFETY: a NUL-terminated PTX text or a whole cubin, alive during the call;
                    // `module` is a live out-pointer; the primary context is current.
                    check(
                        unsafe { load(&mut module, image.as_ptr().cast()) },
                        "cuModuleLoadData",
                    );
                    modules.push(module);
                }
                for module in modules.drain(..) {
                    // SAFETY: loaded above, unloaded once.
                    check(unsafe { unload(module) }, "cuModuleUnload");
                }
            })
        });
        group.bench_function(BenchmarkId::new(name, "atlas"), |b| {
            b.iter(|| {
                let registry = ok(AtlasRegistry::load(0, blobs), "AtlasRegistry::load");
                ok(release(registry), "release");
            })
        });
    }
    group.finish();
}

/// Kernels in the graph of group 7.
const GRAPH_KERNELS: u64 = 256;

/// Group 7: the cost per kernel of running 256 noop kernels, eagerly (256 typed launches) or as
/// one replay of a captured graph, each batch including its synchronize. One criterion iteration
/// is one kernel.
fn graph_replay(c: &mut Criterion, env: &Env) {
    let registry = &env.registry;
    let stream = ok(CudaStream::new(registry.ctx()), "creating a stream");
    let one = LaunchConfig::for_elements(1, 1);
    let noop = ok(NOOP.get(registry), "FunctionCache::get noop");
    ok(stream.begin_capture(), "begin_capture");
    for _ in 0..GRAPH_KERNELS {
        ok(noop.launch(&stream, &one, ()), "capturing noop");
    }
    let exec = ok(
        ok(stream.end_capture(), "end_capture").instantiate(),
        "instantiate",
    );
    let per_kernel = |iters: u64, run_batch: &dyn Fn()| {
        let batches = iters.div_ceil(GRAPH_KERNELS);
        let start = Instant::now();
        for _ in 0..batches {
            run_batch();
        }
        start
            .elapsed()
            .mul_f64(iters as f64 / (batches * GRAPH_KERNELS) as f64)
    };
    let mut group = c.benchmark_group("graph_replay");
    group.bench_function(BenchmarkId::new("noop256", "eager"), |b| {
        b.iter_custom(|iters| {
            per_kernel(iters, &|| {
                for _ in 0..GRAPH_KERNELS {
                    ok(noop.launch(&stream, &one, ()), "launch noop");
                }
                ok(stream.synchronize(), "synchronize");
            })
        })
    });
    group.bench_function(BenchmarkId::new("noop256", "replay"), |b| {
        b.iter_custom(|iters| {
            per_kernel(iters, &|| {
                // SAFETY: the noop kernels use no memory.
                ok(unsafe { exec.launch(&stream) }, "graph launch");
                ok(stream.synchronize(), "synchronize");
            })
        })
    });
    group.finish();
}

/// Group 8: loading the demo model for every device: one `AtlasLibrary` load plus a registry per
/// device, against one `AtlasRegistry::load` per device.
fn library_load(c: &mut Criterion) {
    let devices = ok(device_count(), "device_count");
    let blobs = atlas_kernels::ptx_for_model("demo").expect("the demo model has PTX blobs");
    let ordinals: Vec<usize> = (0..devices).collect();
    for &ordinal in &ordinals {
        ok(atlas_registry::host(ordinal), "creating the device's host");
    }
    let mut group = c.benchmark_group(format!("load_all_devices/{devices}_gpus"));
    group.bench_function("registry_per_device", |b| {
        b.iter(|| {
            let registries: Vec<_> = ordinals
                .iter()
                .map(|&o| ok(AtlasRegistry::load(o, blobs), "AtlasRegistry::load"))
                .collect();
            black_box(&registries);
        })
    });
    group.bench_function("one_library", |b| {
        b.iter(|| {
            let library = ok(AtlasLibrary::load(blobs), "AtlasLibrary::load");
            let registries: Vec<_> = ordinals
                .iter()
                .map(|&o| ok(library.registry(o), "AtlasLibrary::registry"))
                .collect();
            black_box(&registries);
        })
    });
    group.finish();
}

/// Keeps the GPU busy with launches for two seconds, so that its clocks have ramped up before the
/// first measurement (raw baselines run first in each group, and would otherwise pay for it).
fn warm_up_device(env: &Env) {
    let registry = &env.registry;
    let noop = ok(NOOP.get(registry), "FunctionCache::get noop");
    let one = LaunchConfig::for_elements(1, 1);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        for _ in 0..BATCH {
            ok(noop.launch(registry.stream(), &one, ()), "warm-up launch");
        }
        ok(registry.stream_synchronize(), "warm-up synchronize");
    }
}

/// One case of the paired check: its name, the raw launch and the Atlas launch.
type PairedCase<'a> = (&'static str, &'a dyn Fn(), Box<dyn Fn() + 'a>);

/// Pairs of batches for the paired check.
const PAIRS: usize = 400;

/// The paired check: raw and Atlas batches of [`BATCH`] launches alternate (in alternating
/// order), so both sides of each pair see the same machine state; prints, per kernel and Atlas
/// path, the median over pairs of Atlas time / raw time. Drift of the machine over seconds, which
/// moves whole criterion benches by more than the Atlas layer costs, cancels out within a pair.
fn paired_check(env: &Env) {
    let set_attribute = sym!(env.cuda, cuFuncSetAttribute);
    let registry = &env.registry;
    let stream = registry.raw_stream();
    let sync = env.syncer();
    let host_ones = vec![1.0f32; (SUM_CHUNK * SUM_BLOCKS) as usize];
    let x = ok(
        DeviceBuffer::from_slice(
            registry.ctx(),
            registry.stream(),
            &host_ones[..SCALE_N as usize],
        ),
        "allocating scale's buffer",
    );
    let input = ok(
        DeviceBuffer::from_slice(registry.ctx(), registry.stream(), &host_ones),
        "allocating block_sum's input",
    );
    let output = ok(
        DeviceBuffer::<f32>::alloc(registry.ctx(), SUM_BLOCKS as usize),
        "allocating block_sum's output",
    );
    let one = LaunchConfig::for_elements(1, 1);
    let scale_cfg = LaunchConfig::for_elements(SCALE_N, SCALE_BLOCK);
    let sum_cfg = LaunchConfig {
        grid: (SUM_BLOCKS, 1, 1),
        block: (SUM_BLOCK, 1, 1),
        shared_mem_bytes: SUM_SHARED,
    };
    let (noop_raw, scale_raw, sum_raw) = (
        env.raw_function("noop", c"noop"),
        env.raw_function("elementwise", c"scale"),
        env.raw_function("block_reduce", c"block_sum"),
    );
    let attribute = CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
    // SAFETY: a live function of the current context; 96 KiB is within the H100/H200 opt-in limit.
    let status = unsafe { set_attribute(sum_raw, attribute, SUM_SHARED as i32) };
    check(status, "cuFuncSetAttribute");
    let handle = |module, name| {
        ok(
            registry.raw_function_cached(module, name),
            "raw_function_cached",
        )
    };
    let (noop_h, scale_h, sum_h) = (
        handle("noop", "noop"),
        handle("elementwise", "scale"),
        handle("block_reduce", "block_sum"),
    );
    let (mut ptr, mut factor, mut n) = (x.device_ptr(), 1.0f32, SCALE_N);
    let mut scale_params: [*mut c_void; 3] = [
        (&raw mut ptr).cast(),
        (&raw mut factor).cast(),
        (&raw mut n).cast(),
    ];
    let (mut in_ptr, mut out_ptr, mut len, mut chunk) = (
        input.device_ptr(),
        output.device_ptr(),
        SUM_CHUNK * SUM_BLOCKS,
        SUM_CHUNK,
    );
    let mut sum_params: [*mut c_void; 4] = [
        (&raw mut in_ptr).cast(),
        (&raw mut out_ptr).cast(),
        (&raw mut len).cast(),
        (&raw mut chunk).cast(),
    ];
    let (scale_p, sum_p) = (scale_params.as_mut_ptr(), sum_params.as_mut_ptr());
    // SAFETY: live functions of the current context on the registry's stream, with parameter
    // arrays matching each kernel whose targets outlive the launchers (also for the two below).
    let raw_noop = unsafe { raw_launcher(env.cuda, noop_raw, one, stream, null_mut()) };
    // SAFETY: as above.
    let raw_scale = unsafe { raw_launcher(env.cuda, scale_raw, scale_cfg, stream, scale_p) };
    // SAFETY: as above; block_sum was opted in to SUM_SHARED bytes above.
    let raw_sum = unsafe { raw_launcher(env.cuda, sum_raw, sum_cfg, stream, sum_p) };
    let atlas_raw = |func, cfg: LaunchConfig, params: *mut *mut c_void, count: usize| {
        move || {
            // SAFETY: `params` is null (count 0) or one of the arrays above, which match the kernel
            // and outlive this closure; the handle and stream are the registry's.
            let result = unsafe {
                let params = if count == 0 {
                    &mut [][..]
                } else {
                    std::slice::from_raw_parts_mut(params, count)
                };
                registry.launch_on_stream(func, &cfg, stream, params)
            };
            ok(result, "launch_on_stream");
        }
    };
    let typed_noop = || {
        ok(
            ok(NOOP.get(registry), "get").launch(registry.stream(), &one, ()),
            "launch",
        )
    };
    let typed_scale = || {
        let f = ok(SCALE.get(registry), "get");
        ok(
            f.launch(registry.stream(), &scale_cfg, (&x, 1.0f32, SCALE_N)),
            "launch",
        );
    };
    let typed_sum = || {
        let f = ok(BLOCK_SUM.get(registry), "get");
        let n = SUM_CHUNK * SUM_BLOCKS;
        ok(
            f.launch(registry.stream(), &sum_cfg, (&input, &output, n, SUM_CHUNK)),
            "launch",
        );
    };
    let cases: [PairedCase<'_>; 6] = [
        (
            "noop/atlas_raw",
            &raw_noop,
            Box::new(atlas_raw(noop_h, one, null_mut(), 0)),
        ),
        ("noop/atlas_typed", &raw_noop, Box::new(typed_noop)),
        (
            "scale/atlas_raw",
            &raw_scale,
            Box::new(atlas_raw(scale_h, scale_cfg, scale_p, 3)),
        ),
        ("scale/atlas_typed", &raw_scale, Box::new(typed_scale)),
        (
            "block_sum_96k/atlas_raw",
            &raw_sum,
            Box::new(atlas_raw(sum_h, sum_cfg, sum_p, 4)),
        ),
        ("block_sum_96k/atlas_typed", &raw_sum, Box::new(typed_sum)),
    ];
    let batch = |launch: &dyn Fn()| {
        sync();
        let start = Instant::now();
        for _ in 0..BATCH {
            launch();
        }
        start.elapsed()
    };
    for (name, raw, atlas) in &cases {
        let mut ratios = Vec::with_capacity(PAIRS);
        let mut raw_times = Vec::with_capacity(PAIRS);
        for i in 0..PAIRS {
            let (r, a) = if i % 2 == 0 {
                let r = batch(*raw);
                (r, batch(atlas.as_ref()))
            } else {
                let a = batch(atlas.as_ref());
                (batch(*raw), a)
            };
            ratios.push(a.as_secs_f64() / r.as_secs_f64());
            raw_times.push(r.as_secs_f64() / BATCH as f64);
        }
        sync();
        ratios.sort_by(f64::total_cmp);
        raw_times.sort_by(f64::total_cmp);
        println!(
            "paired/{name}: median Atlas/raw {:.4} over {PAIRS} pairs of {BATCH}-launch batches (raw median {:.3} µs per launch; ratio quartiles {:.4}..{:.4})",
            ratios[PAIRS / 2],
            raw_times[PAIRS / 2] * 1e6,
            ratios[PAIRS / 4],
            ratios[3 * PAIRS / 4],
        );
    }
}

fn main() {
    // Creating the host loads the driver, runs cuInit and retains device 0's primary context:
    // without a driver or a device, say so in one line and stop, successfully.
    if let Err(e) = atlas_registry::host(0) {
        let reason = e.to_string().replace('\n', " ");
        println!("launch_overhead: no CUDA device: {reason}");
        return;
    }
    let env = Env::new();
    warm_up_device(&env);
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(4))
        .configure_from_args();

    enqueue(&mut c, &env);
    roundtrip(&mut c, &env);
    lookup(&mut c, &env);
    shared_mem(&mut c, &env);
    replaced(&mut c, &env);
    model_load(&mut c, &env);
    graph_replay(&mut c, &env);
    library_load(&mut c);

    c.final_summary();
    if std::env::args().any(|a| a == "--bench") {
        paired_check(&env);
    }
}
