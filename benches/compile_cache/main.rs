//! Compile-cache benches: what a run-time compile costs with NVRTC, and what the same compile
//! costs when Atlas's compile cache holds it, for one kernel and for a source of 100 kernels.
//!
//! | bench         | benchmark IDs                                                              |
//! |---------------|----------------------------------------------------------------------------|
//! | compile       | `compile/{one_kernel,kernels_100}/{nvrtc,cache_hit}` (time per compile)     |
//! | hit and load  | `compile_load/{one_kernel,kernels_100}/{cache_hit_and_load,raw_load}` (GPU) |
//!
//! `nvrtc` compiles through a disabled cache (NVRTC every time); `cache_hit` asks a cache that
//! holds the entry (the key's hash over the source, one file read, the entry's checksum and the
//! blob validator; no NVRTC call). With a GPU, `cache_hit_and_load` is the whole model load from
//! a warm cache (`AtlasRegistry::load_model` + `release`), beside `raw_load`: `cuModuleLoadData`
//! + `cuModuleUnload` of the same cubin, so the difference is what the cache adds to a load.
//!
//! Needs NVRTC, found as the compile tests find it (`ATLAS_NVRTC_PATH`, the pinned NVRTC 12.0
//! under `target/`, or Atlas's own search: the loader, then `/usr/local/cuda/lib64`); without it
//! the binary prints one line and exits 0. The GPU group runs only when device 0 can be used. The target: a hit of at
//! most 20 µs plus the load. Run with `cargo bench --bench compile_cache` (about a minute).

#[path = "../common/many_kernels.rs"]
mod many_kernels;
#[path = "../common/nvrtc.rs"]
mod nvrtc;

use std::path::PathBuf;
use std::ptr::null_mut;
use std::time::Duration;

use atlas_registry::{
    AtlasRegistry, CacheOutcome, CompileCache, CompileTarget, Compiler, CudaSource, Model, release,
};
use atlas_sys::{CUmodule, CUresult};
use criterion::{BenchmarkId, Criterion};

fn cases() -> [(&'static str, CudaSource); 2] {
    [
        (
            "one_kernel",
            CudaSource::new("one.cu", many_kernels::source(1)),
        ),
        (
            "kernels_100",
            CudaSource::new("hundred.cu", many_kernels::source(100)),
        ),
    ]
}

fn cache_dir() -> PathBuf {
    std::env::temp_dir().join(format!("atlas-bench-compile-cache-{}", std::process::id()))
}

fn main() {
    // SAFETY: the first thing the process does: no other thread runs yet (criterion's included).
    if let Err(why) = unsafe { nvrtc::choose() } {
        println!("compile_cache: not run: {why}");
        return;
    }
    let compiler = match Compiler::with_cache(CompileCache::disabled()) {
        Ok(compiler) => compiler,
        Err(e) => {
            println!(
                "compile_cache: not run: {}",
                e.to_string().replace('\n', " ")
            );
            return;
        }
    };
    // Compile for device 0 when there is one, else for sm_90 (no GPU is needed to compile).
    let host = atlas_registry::host(0).ok();
    let cc = host.as_ref().map_or((9, 0), |h| h.compute_capability());
    let target = compiler
        .target_for("bench", cc)
        .unwrap_or(CompileTarget::Cubin { arch: 90 });
    let dir = cache_dir();
    let _ = std::fs::remove_dir_all(&dir);
    let cached = Compiler::with_cache(CompileCache::at(&dir)).expect("NVRTC loaded above");
    println!(
        "compile_cache: NVRTC {:?}, target {target}, cache in {}",
        compiler.version(),
        dir.display()
    );
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();

    let mut group = c.benchmark_group("compile");
    group.sample_size(10);
    for (name, source) in cases() {
        let compile = |compiler: &Compiler| match compiler.compile(&source, target) {
            Ok(code) => code,
            Err(e) => panic!("compile_cache: compiling {name}: {e}"),
        };
        group.bench_function(BenchmarkId::new(name, "nvrtc"), |b| {
            b.iter(|| compile(&compiler))
        });
        assert_ne!(
            compile(&cached).cache_outcome(),
            &CacheOutcome::Hit,
            "a fresh cache"
        );
        assert_eq!(compile(&cached).cache_outcome(), &CacheOutcome::Hit);
        group.bench_function(BenchmarkId::new(name, "cache_hit"), |b| {
            b.iter(|| compile(&cached))
        });
    }
    group.finish();

    if host.is_some() {
        hit_and_load(&mut c, &cached, target);
    } else {
        println!("compile_cache: compile_load not run: no usable device 0");
    }
    c.final_summary();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A model load from a warm cache, beside the raw load of the same cubin.
fn hit_and_load(c: &mut Criterion, cached: &Compiler, target: CompileTarget) {
    let cuda = atlas_sys::driver().expect("device 0 is usable, so the driver loaded");
    let load = atlas_sys::entry!(cuda, cuModuleLoadData).expect("cuModuleLoadData");
    let unload = atlas_sys::entry!(cuda, cuModuleUnload).expect("cuModuleUnload");
    let mut group = c.benchmark_group("compile_load");
    for (name, source) in cases() {
        let code = cached.compile(&source, target).expect("compiled above");
        let model = Model::new()
            .source(name, source)
            .cache(cached.cache().clone());
        // The first load makes the primary context current on this thread for the raw side.
        let registry = AtlasRegistry::load_model(0, &model).expect("load_model");
        assert_eq!(registry.cache_outcome(name), Some(&CacheOutcome::Hit));
        release(registry).expect("release");
        group.bench_function(BenchmarkId::new(name, "cache_hit_and_load"), |b| {
            b.iter(|| {
                let registry = AtlasRegistry::load_model(0, &model).expect("load_model");
                release(registry).expect("release");
            })
        });
        let image = code.image();
        group.bench_function(BenchmarkId::new(name, "raw_load"), |b| {
            b.iter(|| {
                let mut module: CUmodule = null_mut();
                // SAFETY: a whole cubin (or NUL-terminated PTX) alive during the call; `module` is
                // a live out-pointer; the primary context is current (the loads above bound it).
                let status = unsafe { load(&mut module, image.as_ptr().cast()) };
                assert_eq!(status, CUresult::CUDA_SUCCESS, "cuModuleLoadData");
                // SAFETY: loaded above, unloaded once.
                let status = unsafe { unload(module) };
                assert_eq!(status, CUresult::CUDA_SUCCESS, "cuModuleUnload");
            })
        });
    }
    group.finish();
}
