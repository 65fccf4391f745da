//! Model load: loading (and unloading) the whole demo model, PTX, cubin and compressed fatbin, raw
//! and through Atlas; the cubins again as first loads of their bytes (`demo_cubin_first`: Atlas
//! checks every blob, where a load of bytes it checked before does not check them again); and a
//! fatbin of the caller's (`ATLAS_BENCH_FATBIN`, e.g. the largest of a toolkit library, cut by
//! `benches/largest_fatbin.py`) as a one-module model.

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

    // Each case is a list of models, one loaded per iteration in turn: one model, but for the
    // cubins as a first load, whose bytes Atlas has not checked before (see `first_loads`).
    let mut cases: Vec<(&str, Vec<atlas_kernels::Blobs>)> = cases
        .into_iter()
        .map(|(name, blobs)| (name, vec![blobs]))
        .collect();
    if let Some(cubin) = atlas_kernels::cubin_for_model("demo", sm) {
        cases.insert(2, ("demo_cubin_first", first_loads(cubin)));
    }

    let mut group = c.benchmark_group("model_load");
    let mut paired_group = pc.benchmark_group("model_load_paired");
    paired_group.sampling_mode(paired::SAMPLING);
    for (name, models) in &cases {
        let name = *name;
        let mut modules: Vec<CUmodule> = Vec::with_capacity(models[0].len());
        let (mut raw_turn, mut atlas_turn) = (0usize, 0usize);
        let mut raw = || {
            let blobs = models[raw_turn % models.len()];
            raw_turn += 1;
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
        let mut atlas = || {
            let blobs = models[atlas_turn % models.len()];
            atlas_turn += 1;
            let registry = ok(AtlasRegistry::load(0, blobs), "AtlasRegistry::load");
            ok(release(registry), "release");
        };
        group.bench_function(BenchmarkId::new(name, "raw"), |b| b.iter(&mut raw));
        group.bench_function(BenchmarkId::new(name, "atlas"), |b| b.iter(&mut atlas));
        let mut atlas_first = false;
        paired_group.bench_function(BenchmarkId::new(name, "atlas"), |b| {
            b.iter_custom(|iters| {
                paired::pairs(iters, &mut atlas_first, |atlas_side| {
                    if atlas_side {
                        timed(&mut atlas)
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

/// The demo's cubins as 80 models whose bytes differ from each other's (each cubin followed by 8
/// to 640 zero bytes, which no reader of an ELF file looks at), so that each load in turn is a
/// first load of its bytes: more models than Atlas keeps checked blobs of (the 256 it checked
/// last), cycled in order, so none is found checked. Leaked, to live as long as the other cases'
/// blobs.
fn first_loads(cubins: atlas_kernels::Blobs) -> Vec<atlas_kernels::Blobs> {
    (1..=80usize)
        .map(|n| {
            let model: Vec<(&str, &[u8])> = cubins
                .iter()
                .map(|&(name, cubin)| {
                    let mut padded = cubin.to_vec();
                    padded.resize(cubin.len() + 8 * n, 0);
                    (name, &*Vec::leak(padded))
                })
                .collect();
            &*Vec::leak(model)
        })
        .collect()
}
