//! Model load: loading (and unloading) the whole demo model, PTX, cubin and compressed fatbin, raw
//! and through Atlas; and a fatbin of the caller's (`ATLAS_BENCH_FATBIN`, e.g. the largest of a
//! toolkit library, cut by `benches/largest_fatbin.py`) as a one-module model.

use std::ptr::null_mut;

use atlas_registry::{AtlasRegistry, release};
use atlas_sys::CUmodule;
use criterion::{BenchmarkId, Criterion};

use crate::paired::timed;
use crate::{Env, PairedCriterion, check, demo_ptx, device_sm, ok, paired, sym};

/// The demo model as nvcc 13 writes it for sm_90 by default: a fatbin per module, its entry
/// zstd-compressed (`atlas-registry/tests/fixtures/make.sh`).
const DEMO_FATBIN_ZSTD: &[(&str, &[u8])] = &[
    (
        "noop",
        include_bytes!("../../atlas-registry/tests/fixtures/noop.sm_90.zstd.fatbin"),
    ),
    (
        "elementwise",
        include_bytes!("../../atlas-registry/tests/fixtures/elementwise.sm_90.zstd.fatbin"),
    ),
    (
        "block_reduce",
        include_bytes!("../../atlas-registry/tests/fixtures/block_reduce.sm_90.zstd.fatbin"),
    ),
    (
        "device_global",
        include_bytes!("../../atlas-registry/tests/fixtures/device_global.sm_90.zstd.fatbin"),
    ),
];

/// Loading (and unloading) the whole demo model, PTX and cubin, raw (`cuModuleLoadData`
/// of each blob) and through Atlas (`AtlasRegistry::load` + `release`): each timed on its own
/// (`model_load`), and as ratios pair by pair (`model_load_paired`, see [`paired`]).
pub(crate) fn model_load(c: &mut Criterion, pc: &mut PairedCriterion, env: &Env) {
    let load = sym!(env.cuda, cuModuleLoadData);
    let unload = sym!(env.cuda, cuModuleUnload);
    let mut cases: Vec<(&str, atlas_kernels::Blobs)> = vec![("demo_ptx", demo_ptx())];
    // The device's own SASS: PTX against cubin is the point of this bench.
    let sm = device_sm(env);
    match atlas_kernels::cubin_for_model("demo", sm) {
        Some(cubin) => cases.push(("demo_cubin", cubin)),
        None => eprintln!(
            "launch_overhead: skipping model_load/demo_cubin: atlas-kernels has no sm_{sm} cubins"
        ),
    }
    if sm == 90 {
        cases.push(("demo_fatbin_zstd", DEMO_FATBIN_ZSTD));
    }
    // A large fatbin of the caller's, leaked to live as long as the other cases' blobs.
    if let Some(path) = std::env::var_os("ATLAS_BENCH_FATBIN") {
        match std::fs::read(&path) {
            Ok(bytes) => {
                let model: Vec<(&str, &[u8])> = vec![("large", Vec::leak(bytes))];
                cases.push(("large_fatbin", Vec::leak(model)));
            }
            Err(e) => eprintln!("launch_overhead: ATLAS_BENCH_FATBIN={path:?}: {e}"),
        }
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
