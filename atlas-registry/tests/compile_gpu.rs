//! Kernels compiled at run time, launched on a GPU and checked against the CPU on fresh random
//! data with poisoned (NaN) outputs: a template instantiation found by its C++ name, SASS for the
//! device and PTX the driver JIT-compiles, in a registry and a library, preloaded or not, from a
//! cold and a warm compile cache.
//!
//! Needs a GPU and NVRTC (`ATLAS_NVRTC_PATH=/usr/local/cuda/lib64/libnvrtc.so.13` on the H200);
//! fails without either.

mod support;

use atlas_registry::{
    AtlasLibrary, AtlasRegistry, BlobKind, CacheOutcome, CompileCache, CompileTarget, Compiler,
    CudaSource, DeviceBuffer, LaunchConfig, Model,
};
use support::reference::assert_close;
use support::rng::Rng;
use support::scratch::Scratch;

/// `y = a * x + y` over the first `N` elements, `N` a template parameter; and an `extern "C"`
/// kernel whose tile width comes from a header and an option.
const SOURCE: &str = r#"
#include "tile.h"
template <int N> __global__ void axpy_n(float a, const float *x, float *y) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) y[i] = a * x[i] + y[i];
}
extern "C" __global__ void tile_sum(const float *x, float *out, unsigned n) {
    unsigned t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t * TILE >= n) return;
    float s = 0.0f;
    for (unsigned j = 0; j < TILE && t * TILE + j < n; j++) s += x[t * TILE + j];
    out[t] = s * SCALE;
}
"#;

fn source(n: u32) -> CudaSource {
    CudaSource::new("axpy.cu", SOURCE)
        .header("tile.h", "#define TILE 8")
        .option("-DSCALE=0.5f")
        .option("-std=c++17")
        .name_expression(format!("axpy_n<{n}>"))
}

/// A cache in a fresh directory, and the directory, which is removed when dropped.
fn fresh_cache(test: &str) -> (CompileCache, Scratch) {
    let dir = Scratch::new(&format!("atlas-compile-gpu-{test}"));
    (CompileCache::at(&*dir), dir)
}

/// Launches `module::axpy_n<n>` and `module::tile_sum` and checks both against the CPU.
fn check(registry: &AtlasRegistry, module: &str, n: u32, rng: &mut Rng) {
    const TAIL: usize = 37;
    let stream = registry.stream();
    let x = rng.f32s(n as usize, -10.0, 10.0);
    let y = rng.f32s(n as usize, -10.0, 10.0);
    let a = rng.f32_in(0.5, 3.0);
    let mut y_poisoned = y.clone();
    y_poisoned.extend([f32::NAN; TAIL]);
    let dx = DeviceBuffer::from_slice(registry.ctx(), stream, &x).unwrap();
    let mut dy = DeviceBuffer::from_slice(registry.ctx(), stream, &y_poisoned).unwrap();
    let axpy = registry
        .function_cached(module, &format!("axpy_n<{n}>"))
        .unwrap();
    let cfg = LaunchConfig::for_elements(n + TAIL as u32, 128);
    // SAFETY: the kernel reads `n` floats of `dx` and writes the first `n` of `dy` (which holds
    // `n + TAIL`); both live until `to_vec` waits for the launch.
    unsafe { axpy.launch(stream, &cfg, (a, &dx, &mut dy)) }.unwrap();
    let got = dy.to_vec(stream).unwrap();
    let want: Vec<f32> = x.iter().zip(&y).map(|(x, y)| a * x + y).collect();
    assert_close(&got[..n as usize], &want, 1e-6, "axpy_n");
    assert!(
        got[n as usize..].iter().all(|v| v.is_nan()),
        "axpy_n wrote past N"
    );

    let tiles = n.div_ceil(8);
    let mut out = DeviceBuffer::from_slice(
        registry.ctx(),
        stream,
        &vec![f32::NAN; tiles as usize + TAIL],
    )
    .unwrap();
    let tile_sum = registry.function_cached(module, "tile_sum").unwrap();
    // SAFETY: `tile_sum` reads the `n` floats of `dx` and writes `tiles` floats of `out`.
    unsafe {
        tile_sum.launch(
            stream,
            &LaunchConfig::for_elements(tiles, 64),
            (&dx, &mut out, n),
        )
    }
    .unwrap();
    let got = out.to_vec(stream).unwrap();
    let want: Vec<f32> = x.chunks(8).map(|c| c.iter().sum::<f32>() * 0.5).collect();
    assert_close(&got[..tiles as usize], &want, 1e-5, "tile_sum");
    assert!(
        got[tiles as usize..].iter().all(|v| v.is_nan()),
        "tile_sum wrote past its tiles"
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_compiled_template_launches_by_its_cpp_name_cold_and_warm() {
    let mut rng = Rng::new();
    let n = 1000 + rng.index(50_000) as u32;
    let (cache, _dir) = fresh_cache("registry");
    for (round, preload) in [(0, false), (1, true)] {
        let model = Model::new()
            .blobs(atlas_kernels::ptx_for_model("demo").unwrap())
            .source("axpy", source(n))
            .preload(preload)
            .cache(cache.clone());
        let registry = AtlasRegistry::load_model(0, &model).unwrap();
        let want = if round == 0 {
            CacheOutcome::Stored
        } else {
            CacheOutcome::Hit
        };
        assert_eq!(registry.cache_outcome("axpy"), Some(&want), "round {round}");
        let (major, minor) = registry.host().compute_capability();
        let compiler = Compiler::new().unwrap();
        let expected = if compiler.supported_archs().contains(&(10 * major + minor)) {
            BlobKind::Cubin
        } else {
            BlobKind::Ptx
        };
        assert_eq!(registry.module_kind("axpy"), Some(expected));
        check(&registry, "axpy", n, &mut rng);
        // The blobs beside it are as usual.
        support::reference::scale_and_check(&registry, &mut rng);
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn compiled_ptx_is_jit_compiled_by_the_driver_and_runs() {
    let mut rng = Rng::new();
    let n = 1 + rng.index(20_000) as u32;
    let (cache, _dir) = fresh_cache("ptx");
    let compiler = Compiler::with_cache(cache).unwrap();
    let host = atlas_registry::host(0).unwrap();
    let (major, minor) = host.compute_capability();
    // PTX for the device's own virtual architecture (or the newest below it).
    let arch = compiler
        .supported_archs()
        .iter()
        .copied()
        .filter(|&a| a <= 10 * major + minor)
        .max()
        .unwrap();
    let code = compiler
        .compile(&source(n), CompileTarget::Ptx { arch })
        .unwrap();
    assert_eq!(code.kind(), BlobKind::Ptx);
    // Compiled code is an ordinary blob: the seed API loads it. Its template kernel goes by its
    // lowered name there.
    let registry = AtlasRegistry::load(0, &[("axpy", code.image())]).unwrap();
    let lowered = code.lowered_name(&format!("axpy_n<{n}>")).unwrap();
    registry.function("axpy", lowered).unwrap();
    // Through a model, by its C++ name.
    let model = Model::new()
        .source("axpy", source(n))
        .cache(compiler.cache().clone());
    let by_model = AtlasRegistry::load_model(0, &model).unwrap();
    check(&by_model, "axpy", n, &mut rng);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_library_compiles_for_the_devices_present_and_preloads() {
    let mut rng = Rng::new();
    let n = 4096 + rng.index(4096) as u32;
    let (cache, _dir) = fresh_cache("library");
    let model = Model::new()
        .source("axpy", source(n))
        .preload(true)
        .cache(cache);
    let library = AtlasLibrary::load_model(&model).unwrap();
    for ordinal in 0..atlas_registry::device_count().unwrap() {
        let registry = library.registry(ordinal).unwrap();
        check(&registry, "axpy", n, &mut rng);
    }
}
