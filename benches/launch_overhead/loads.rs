//! Groups 5, 6 and 8: loading modules, per call, per model and per device.

use std::hint::black_box;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use atlas_registry::{AtlasLibrary, AtlasRegistry, LaunchConfig, device_count, release};
use atlas_sys::{CUcontext, CUfunction, CUmodule};
use criterion::{BenchmarkId, Criterion, SamplingMode};

use crate::{Env, NOOP, PairedCriterion, check, device_sm, ok, paired, sym};

/// The demo model's PTX, checked to end in a NUL as the driver takes it (`atlas-kernels` embeds
/// it so), so that the raw loads can hand it over as it is.
fn demo_ptx() -> atlas_kernels::Blobs {
    let blobs = atlas_kernels::ptx_for_model("demo").expect("the demo model has PTX blobs");
    for (name, blob) in blobs {
        assert_eq!(
            blob.last(),
            Some(&0),
            "launch_overhead: {name}'s PTX is not NUL-terminated"
        );
    }
    blobs
}

/// Group 5: what the registry replaces. Per call: load the noop PTX, look the kernel up, launch,
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

/// Group 6: loading (and unloading) the whole demo model, PTX and cubin, raw (`cuModuleLoadData`
/// of each blob) and through Atlas (`AtlasRegistry::load` + `release`): each timed on its own
/// (`model_load`), and as ratios pair by pair (`model_load_paired`, see [`paired`]).
pub(crate) fn model_load(c: &mut Criterion, pc: &mut PairedCriterion, env: &Env) {
    let load = sym!(env.cuda, cuModuleLoadData);
    let unload = sym!(env.cuda, cuModuleUnload);
    let mut cases = vec![("demo_ptx", demo_ptx())];
    // The device's own SASS: PTX against cubin is the point of this group.
    let sm = device_sm(env);
    match atlas_kernels::cubin_for_model("demo", sm) {
        Some(cubin) => cases.push(("demo_cubin", cubin)),
        None => eprintln!(
            "launch_overhead: skipping model_load/demo_cubin: atlas-kernels has no sm_{sm} cubins"
        ),
    }

    let mut group = c.benchmark_group("model_load");
    let mut paired_group = pc.benchmark_group("model_load_paired");
    paired_group.sampling_mode(paired::SAMPLING);
    for &(name, blobs) in &cases {
        let mut modules: Vec<CUmodule> = Vec::with_capacity(blobs.len());
        let mut raw = || {
            for (_, image) in blobs {
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
        };
        let atlas = || {
            let registry = ok(AtlasRegistry::load(0, blobs), "AtlasRegistry::load");
            ok(release(registry), "release");
        };
        group.bench_function(BenchmarkId::new(name, "raw"), |b| b.iter(&mut raw));
        group.bench_function(BenchmarkId::new(name, "atlas"), |b| b.iter(atlas));
        let mut atlas_first = false;
        paired_group.bench_function(BenchmarkId::new(name, "atlas"), |b| {
            b.iter_custom(|iters| {
                paired::pairs(iters, &mut atlas_first, |atlas_side| {
                    if atlas_side {
                        timed(atlas)
                    } else {
                        timed(&mut raw)
                    }
                })
            })
        });
    }
    group.finish();
    paired_group.finish();
}

/// How long one call of `run` takes.
fn timed(mut run: impl FnMut()) -> Duration {
    let start = Instant::now();
    run();
    start.elapsed()
}

/// Group 8: loading the demo model for every device (and unloading it): one `AtlasLibrary` load
/// plus a registry per device, against one `AtlasRegistry::load` per device; each timed on its own
/// and, in `load_all_devices_paired`, as the ratio one_library / registry_per_device pair by pair.
pub(crate) fn library_load(c: &mut Criterion, pc: &mut PairedCriterion) {
    let devices = ok(device_count(), "device_count");
    // One load for every device: the PTX, which each device JIT-compiles for itself (the devices
    // of one machine need not share an architecture).
    let blobs = demo_ptx();
    let ordinals: Vec<usize> = (0..devices).collect();
    for &ordinal in &ordinals {
        ok(atlas_registry::host(ordinal), "creating the device's host");
    }
    let per_device = || {
        let registries: Vec<_> = ordinals
            .iter()
            .map(|&o| ok(AtlasRegistry::load(o, blobs), "AtlasRegistry::load"))
            .collect();
        black_box(&registries);
    };
    let one_library = || {
        let library = ok(AtlasLibrary::load(blobs), "AtlasLibrary::load");
        let registries: Vec<_> = ordinals
            .iter()
            .map(|&o| ok(library.registry(o), "AtlasLibrary::registry"))
            .collect();
        black_box(&registries);
    };
    let id = format!("{devices}_gpus");
    let mut group = c.benchmark_group("load_all_devices");
    group.bench_function(BenchmarkId::new(&id, "registry_per_device"), |b| {
        b.iter(per_device)
    });
    group.bench_function(BenchmarkId::new(&id, "one_library"), |b| {
        b.iter(one_library)
    });
    group.finish();
    let mut group = pc.benchmark_group("load_all_devices_paired");
    group.sampling_mode(paired::SAMPLING);
    let mut library_first = false;
    group.bench_function(BenchmarkId::new(&id, "one_library"), |b| {
        b.iter_custom(|iters| {
            paired::pairs(iters, &mut library_first, |library_side| {
                if library_side {
                    timed(one_library)
                } else {
                    timed(per_device)
                }
            })
        })
    });
    group.finish();
}
