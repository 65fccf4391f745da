//! Replaced path: what a caller without the registry does per call (load, look up, launch,
//! wait, unload), against the registry's cached path.

use std::ptr::null_mut;
use std::time::Duration;

use atlas_registry::LaunchConfig;
use atlas_sys::{CUcontext, CUfunction, CUmodule};
use criterion::{BenchmarkId, Criterion, SamplingMode};

use crate::{Env, NOOP, check, demo_ptx, ok, sym};

/// What the registry replaces. Per call: load the noop PTX, look the kernel up, launch,
/// wait, unload (`raw_load_per_call`), against Atlas's cached path (`atlas_cached`); and the
/// worst case, a fresh context per call (`raw_fresh_context`, ~100 ms each: 10 samples).
pub(crate) fn replaced(c: &mut Criterion, env: &Env) {
    let cuda = env.cuda;
    let load = sym!(cuda, cuModuleLoadData);
    let get_function = sym!(cuda, cuModuleGetFunction);
    let launch = sym!(cuda, cuLaunchKernel);
    let sync = sym!(cuda, cuStreamSynchronize);
    let unload = sym!(cuda, cuModuleUnload);
    let registry = &env.registry;
    let stream = registry.raw_stream();
    let (_, noop_ptx) = demo_ptx()
        .iter()
        .find(|(name, _)| *name == "noop")
        .expect("the demo model has a noop module");
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
            // SAFETY: noop takes no arguments and touches no memory.
            ok(
                unsafe { noop.launch(registry.stream(), &one, ()) },
                "launch noop",
            );
            ok(
                registry.stream_synchronize(registry.stream()),
                "stream_synchronize",
            );
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
            // Make the primary context current again and check that it is.
            ok(registry.ctx().bind(), "binding the primary context");
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
