//! The loading errors users meet most, said before the driver: PTX of a newer ISA version than the
//! driver JIT-compiles (`AtlasError::PtxTooNew`, naming both versions and what to do) and code for
//! other architectures only (`AtlasError::NoBinaryForDevice`, naming what the module holds and the
//! device), through `AtlasRegistry::load`, `load_model` and `AtlasLibrary::registry`; and the
//! driver's own `CUDA_ERROR_UNSUPPORTED_PTX_VERSION`, for an ISA version Atlas cannot judge, turned
//! into the same error after the fact.
//!
//! Against the stand-in libcuda (`support/standin`), each body in a child process:
//! `cargo test -p atlas-registry --test ptx_isa`. `STANDIN_DRIVER_VERSION` sets the driver's CUDA
//! release, `STANDIN_CC_MAJOR` the device's architecture; the stand-in JIT refuses PTX holding
//! `STANDIN_PTX_TOO_NEW` as a real driver refuses PTX newer than itself. The GPU test compares
//! Atlas's refusals with the real driver's own.

mod support;

use atlas_kernels::{ELEMENTWISE_FATBIN, cubin_for_model, ptx_for_model};
use atlas_registry::{AtlasError, AtlasLibrary, AtlasRegistry, BlobKind, Model};
use support::child;
use support::fixtures::FIXTURES;
use support::standin::{self, probe};

child::bodies!(
    newer_ptx_is_refused_before_the_jit,
    a_fatbin_runs_its_sass_though_its_ptx_is_too_new,
    a_fatbin_whose_ptx_is_all_the_device_runs_is_refused_when_too_new,
    compressed_ptx_is_read_for_its_version,
    compressed_ptx_the_driver_takes_loads,
    code_for_other_architectures_is_refused_naming_what_it_holds,
    a_fatbin_without_code_for_the_device_is_refused_naming_it,
    the_drivers_own_refusal_becomes_the_same_error,
    refusals_agree_with_the_real_driver,
);

/// A PTX module of ISA version `version` for sm_75 with one kernel (`noop`, a kernel the stand-in
/// knows), and `extra` in a comment.
fn ptx(version: &str, extra: &str) -> Vec<u8> {
    format!(
        ".version {version}\n.target sm_75\n.address_size 64\n// {extra}\n\n\
         .visible .entry noop()\n{{\n    ret;\n}}\n"
    )
    .into_bytes()
}

/// How many module loads reached the driver (`cuModuleLoadData` and `cuModuleLoadDataEx`).
fn module_loads() -> u64 {
    probe().count("cuModuleLoadData") + probe().count("cuModuleLoadDataEx")
}

/// The fixture `name` (an nvcc 13.0 fatbin).
fn fixture(name: &str) -> &'static [u8] {
    FIXTURES.iter().find(|f| f.name == name).unwrap().bytes
}

/// Asserts that `e` is a [`AtlasError::PtxTooNew`] refused before the JIT for module `module` of
/// ISA `isa`, needing `needs`, on device 0 of architecture `arch` under a driver of `driver`.
fn assert_too_new(
    e: &AtlasError,
    module: &str,
    isa: (u32, u32),
    needs: (u32, u32),
    driver: (u32, u32),
    arch: &str,
) {
    match e {
        AtlasError::PtxTooNew {
            module: m,
            isa: i,
            needs: n,
            driver: d,
            device,
            arch: a,
            jit_log,
            ..
        } => {
            assert_eq!(
                (
                    m.as_str(),
                    *i,
                    *n,
                    *d,
                    *device,
                    a.as_str(),
                    jit_log.as_str()
                ),
                (module, isa, Some(needs), driver, 0, arch, ""),
                "{e}"
            );
        }
        other => panic!("expected PtxTooNew, got {other:?}"),
    }
    assert_eq!(e.cuda_code(), None, "refused before the driver: {e}");
}

#[test]
fn ptx_newer_than_the_driver_is_refused_before_the_jit_naming_both_versions() {
    standin::run(
        newer_ptx_is_refused_before_the_jit,
        &["-DSTANDIN_DRIVER_VERSION=12040"],
    );
}

fn newer_ptx_is_refused_before_the_jit() {
    // PTX ISA 8.0 (the kernels of atlas-kernels) JIT-compiles on every CUDA 12 driver.
    drop(AtlasRegistry::load(0, ptx_for_model("demo").unwrap()).unwrap());
    let p = probe();
    p.reset();
    let nvcc13 = ptx("9.0", "");
    let e = AtlasRegistry::load(0, &[("mine", &nvcc13)]).unwrap_err();
    assert_too_new(&e, "mine", (9, 0), (13, 0), (12, 4), "sm_90");
    assert_eq!(
        e.to_string(),
        "module `mine` cannot be JIT-compiled on device 0 (sm_90): PTX ISA 9.0 needs a CUDA 13.0 \
         driver or newer; this driver is CUDA 12.4: build the PTX with the toolkit of CUDA 12.4 \
         or an older one (PTX ISA 8.4 or older), or ship a cubin for sm_90"
    );
    assert_eq!(module_loads(), 0, "refused before the driver saw it");

    // The newest version the driver takes loads; the next one is refused.
    AtlasRegistry::load(0, &[("mine", &ptx("8.4", ""))]).unwrap();
    assert_eq!(module_loads(), 1);
    let e = AtlasRegistry::load(0, &[("mine", &ptx("8.5", ""))]).unwrap_err();
    assert_too_new(&e, "mine", (8, 5), (12, 5), (12, 4), "sm_90");
    // Newer than the table: at least what its newest version needs.
    let e = AtlasRegistry::load(0, &[("mine", &ptx("9.9", ""))]).unwrap_err();
    assert_too_new(&e, "mine", (9, 9), (13, 1), (12, 4), "sm_90");
    assert_eq!(module_loads(), 1);

    // The same through a model, beside a module that loads, and through a library.
    let model = Model::new()
        .blobs(ptx_for_model("demo").unwrap())
        .blob("mine", &nvcc13);
    let e = AtlasRegistry::load_model(0, &model).unwrap_err();
    assert_too_new(&e, "mine", (9, 0), (13, 0), (12, 4), "sm_90");
    assert_eq!(module_loads(), 1, "nothing of the model was loaded");
    let library = AtlasLibrary::load_model(&model).expect("refused per device, at `registry`");
    let e = library.registry(0).unwrap_err();
    assert_too_new(&e, "mine", (9, 0), (13, 0), (12, 4), "sm_90");
    assert_eq!(
        (p.count("cuLibraryLoadData"), p.count("cuLibraryGetModule")),
        (0, 0),
        "nothing is loaded for a device that cannot run the model"
    );
    assert_eq!(p.count("live_modules"), 0);
}

#[test]
fn a_fatbin_with_sass_for_the_device_loads_though_its_ptx_is_too_new() {
    standin::run(
        a_fatbin_runs_its_sass_though_its_ptx_is_too_new,
        &["-DSTANDIN_DRIVER_VERSION=11080"],
    );
}

/// The driver takes the device's SASS and never JIT-compiles the PTX beside it: a CUDA 11.8 driver
/// loads the fatbin whose PTX (ISA 8.0) it could not compile, and nvcc 13's fatbins, whose PTX is
/// ISA 9.0.
fn a_fatbin_runs_its_sass_though_its_ptx_is_too_new() {
    let registry = AtlasRegistry::load(0, &[("elementwise", ELEMENTWISE_FATBIN)]).unwrap();
    assert_eq!(registry.module_kind("elementwise"), Some(BlobKind::Fatbin));
    let nvcc13 = fixture("elementwise.sm_90.zstd.fatbin");
    AtlasRegistry::load(0, &[("elementwise", nvcc13)]).unwrap();
    AtlasLibrary::load(&[("elementwise", nvcc13)])
        .unwrap()
        .registry(0)
        .unwrap();
    // Its PTX alone is refused.
    let e = AtlasRegistry::load(0, ptx_for_model("demo").unwrap()).unwrap_err();
    assert_too_new(&e, "noop", (8, 0), (12, 0), (11, 8), "sm_90");
}

#[test]
fn a_fatbin_is_refused_when_too_new_ptx_is_all_the_device_may_load() {
    standin::run(
        a_fatbin_whose_ptx_is_all_the_device_runs_is_refused_when_too_new,
        &["-DSTANDIN_DRIVER_VERSION=11080", "-DSTANDIN_CC_MAJOR=10"],
    );
}

/// On an sm_100 device none of the fatbin's cubins (sm_75 to sm_90) runs: its compute_75 PTX is
/// what the driver would JIT-compile, and a CUDA 11.8 driver cannot.
fn a_fatbin_whose_ptx_is_all_the_device_runs_is_refused_when_too_new() {
    let p = probe();
    p.reset();
    let e = AtlasRegistry::load(0, &[("elementwise", ELEMENTWISE_FATBIN)]).unwrap_err();
    assert_too_new(&e, "elementwise", (8, 0), (12, 0), (11, 8), "sm_100");
    assert!(e.to_string().contains("or ship a cubin for sm_100"), "{e}");
    let library = AtlasLibrary::load(&[("elementwise", ELEMENTWISE_FATBIN)]).unwrap();
    let e = library.registry(0).unwrap_err();
    assert_too_new(&e, "elementwise", (8, 0), (12, 0), (11, 8), "sm_100");
    assert_eq!(module_loads() + p.count("cuLibraryLoadData"), 0);
}

#[test]
fn compressed_ptx_entries_are_decompressed_for_their_version() {
    standin::run(
        compressed_ptx_is_read_for_its_version,
        &["-DSTANDIN_CC_MAJOR=10"],
    );
}

/// nvcc 13.0's fatbins hold sm_90 SASS and compute_90 PTX of ISA 9.0, compressed (zstd, LZ4): on
/// an sm_100 device the PTX is all that runs, and a CUDA 12.9 driver cannot JIT-compile it.
fn compressed_ptx_is_read_for_its_version() {
    let p = probe();
    p.reset();
    for name in [
        "elementwise.sm_90.zstd.fatbin",
        "elementwise.sm_90.lz4.fatbin",
    ] {
        let e = AtlasRegistry::load(0, &[("elementwise", fixture(name))]).unwrap_err();
        assert_too_new(&e, "elementwise", (9, 0), (13, 0), (12, 9), "sm_100");
    }
    assert_eq!(module_loads(), 0);
}

#[test]
fn compressed_ptx_of_a_version_the_driver_takes_loads() {
    standin::run(
        compressed_ptx_the_driver_takes_loads,
        &["-DSTANDIN_CC_MAJOR=10", "-DSTANDIN_DRIVER_VERSION=13000"],
    );
}

fn compressed_ptx_the_driver_takes_loads() {
    for name in [
        "elementwise.sm_90.zstd.fatbin",
        "elementwise.sm_90.lz4.fatbin",
    ] {
        let registry = AtlasRegistry::load(0, &[("elementwise", fixture(name))]).unwrap();
        assert!(registry.function("elementwise", "scale").is_ok(), "{name}");
    }
}

#[test]
fn code_for_other_architectures_is_refused_before_the_driver_naming_both() {
    standin::run(
        code_for_other_architectures_is_refused_naming_what_it_holds,
        &[],
    );
}

fn code_for_other_architectures_is_refused_naming_what_it_holds() {
    drop(AtlasRegistry::load(0, ptx_for_model("demo").unwrap()).unwrap());
    let p = probe();
    p.reset();
    let sm80 = cubin_for_model("demo", 80).unwrap();
    let e = AtlasRegistry::load(0, sm80).unwrap_err();
    assert!(
        matches!(&e, AtlasError::NoBinaryForDevice { module, holds, device: 0, arch }
            if module == "noop" && holds == "sm_80 SASS" && arch == "sm_90"),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "module `noop` has no code that device 0 (sm_90) can run: it holds sm_80 SASS; load a \
         cubin built for sm_90, or PTX"
    );
    // PTX for a newer architecture than the device's.
    let sm100 = b".version 8.7\n.target sm_100a\n.address_size 64\n";
    let e = AtlasRegistry::load(0, &[("future", sm100)]).unwrap_err();
    assert!(
        matches!(&e, AtlasError::NoBinaryForDevice { holds, .. } if holds == "compute_100a PTX (ISA 8.7)"),
        "{e:?}"
    );
    let library = AtlasLibrary::load(sm80).unwrap();
    let e = library.registry(0).unwrap_err();
    assert!(
        matches!(&e, AtlasError::NoBinaryForDevice { holds, .. } if holds == "sm_80 SASS"),
        "{e:?}"
    );
    assert_eq!(module_loads() + p.count("cuLibraryLoadData"), 0);
}

#[test]
fn a_fatbin_without_an_entry_for_the_device_is_refused_naming_its_entries() {
    standin::run(
        a_fatbin_without_code_for_the_device_is_refused_naming_it,
        &["-DSTANDIN_CC_MAJOR=7"],
    );
}

/// A 7.0 device (Volta) runs none of the fatbin's cubins (sm_75 and newer) nor its compute_75 PTX.
fn a_fatbin_without_code_for_the_device_is_refused_naming_it() {
    let e = AtlasRegistry::load(0, &[("elementwise", ELEMENTWISE_FATBIN)]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "module `elementwise` has no code that device 0 (sm_70) can run: it holds compute_75 PTX, \
         sm_75 SASS, sm_80 SASS, sm_86 SASS, sm_89 SASS, sm_90 SASS; load a cubin built for \
         sm_70, or PTX"
    );
    let e = AtlasLibrary::load(&[("elementwise", ELEMENTWISE_FATBIN)])
        .unwrap()
        .registry(0)
        .unwrap_err();
    assert!(
        matches!(&e, AtlasError::NoBinaryForDevice { arch, .. } if arch == "sm_70"),
        "{e:?}"
    );
    assert_eq!(module_loads() + probe().count("cuLibraryLoadData"), 0);
}

#[test]
fn the_drivers_unsupported_ptx_version_becomes_ptx_too_new_with_its_log() {
    standin::run(
        the_drivers_own_refusal_becomes_the_same_error,
        &["-DSTANDIN_DRIVER_VERSION=13010"],
    );
}

/// PTX ISA 9.5 is newer than Atlas's table, whose newest version (9.1) a CUDA 13.1 driver takes:
/// only the driver can tell, so it is handed over; its `CUDA_ERROR_UNSUPPORTED_PTX_VERSION` is the
/// same error as Atlas's own, with the JIT log.
fn the_drivers_own_refusal_becomes_the_same_error() {
    AtlasRegistry::load(0, &[("mine", &ptx("9.5", "takes it"))]).unwrap();
    let refused = ptx("9.5", "STANDIN_PTX_TOO_NEW");
    let check = |e: &AtlasError| {
        match e {
            AtlasError::PtxTooNew {
                module,
                isa: (9, 5),
                needs: None,
                driver: (13, 1),
                driver_takes: Some((9, 1)),
                device: 0,
                arch,
                jit_log,
            } => {
                assert_eq!((module.as_str(), arch.as_str()), ("mine", "sm_90"));
                assert!(jit_log.contains("Unsupported .version"), "{jit_log}");
            }
            other => panic!("expected PtxTooNew from the driver, got {other:?}"),
        }
        assert_eq!(e.cuda_code(), Some(222), "{e}");
        let text = e.to_string();
        assert!(
            text.contains(
                "PTX ISA 9.5 is newer than this driver JIT-compiles \
                 (CUDA_ERROR_UNSUPPORTED_PTX_VERSION); this driver is CUDA 13.1"
            ) && text.contains("JIT log:\n"),
            "{text}"
        );
    };
    check(&AtlasRegistry::load(0, &[("mine", &refused)]).unwrap_err());
    let library = AtlasLibrary::load(&[("mine", &refused)]).expect("the JIT is deferred");
    check(&library.registry(0).unwrap_err());
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_atlas_refuses_newer_ptx_exactly_when_the_driver_does() {
    let child = child::run_on(refusals_agree_with_the_real_driver, None);
    assert_eq!(child.ending, child::Ending::Passed, "{child}");
}

/// For PTX of each ISA version around the driver's own, Atlas loads what the real driver loads
/// and refuses, before the JIT or after it, what the driver refuses as too new; PTX ISA 9.9 is
/// newer than any driver of CUDA 13.0 takes.
fn refusals_agree_with_the_real_driver() {
    let raw = support::raw::Raw::new().expect("an NVIDIA GPU");
    let registry = AtlasRegistry::load(0, ptx_for_model("demo").unwrap()).expect("a GPU");
    let (major, minor) = registry.host().compute_capability();
    let sm = format!("sm_{major}{minor}");
    let mut refused = 0;
    for version in ["8.0", "8.8", "9.0", "9.1", "9.2", "9.9"] {
        let text = ptx(version, "");
        let mut terminated = text.clone();
        terminated.push(0);
        let driver = raw.load_and_unload(&terminated);
        let atlas = AtlasRegistry::load(0, &[("mine", &text)]);
        let library = AtlasLibrary::load(&[("mine", &text)]).and_then(|l| l.registry(0));
        for (path, result) in [("load", &atlas.map(drop)), ("library", &library.map(drop))] {
            match (driver, result) {
                (0, Ok(())) => {}
                (222, Err(e @ AtlasError::PtxTooNew { .. })) => {
                    assert!(e.to_string().contains(&format!("PTX ISA {version}")), "{e}");
                    assert!(e.to_string().contains(&sm), "{e}");
                    refused += 1;
                }
                (code, result) => panic!(
                    "PTX ISA {version}: the driver answers {}, Atlas's {path} {result:?}",
                    atlas_registry::cuda_error_text(code)
                ),
            }
        }
    }
    assert!(refused >= 2, "PTX ISA 9.9 is refused by a CUDA 13.0 driver");
    println!("PTX ISA versions refused as the driver refuses them: {refused} loads");
}
