//! Modules given as blob sets (`BlobSet`: cubins for several architectures and PTX): each device
//! loads the best blob it runs (its own SASS, else SASS of an older minor version of its
//! architecture, else PTX its driver JIT-compiles), through `AtlasRegistry::load_model` and, per
//! device, `AtlasLibrary::load_model`; a device that runs none is refused naming what the set
//! holds, and a set whose blobs are not what they are given as is refused on every machine.
//!
//! Against the stand-in libcuda (`support/standin`) of several compute capabilities
//! (`STANDIN_CC_MAJOR`, `STANDIN_CC_MINOR`, `STANDIN_CC1` for a second device of another one),
//! each body in a child process: `cargo test -p atlas-registry --test blob_sets`. Which blob a
//! module was loaded from is the stand-in's record of the image it was given. The GPU tests load
//! sets on the real device and compare what the kernels compute with the CPU.

mod support;

use atlas_kernels::{CUBIN_ARCHS, blobs_for_device, cubin_for_model, ptx_for_model};
use atlas_registry::{AtlasError, AtlasLibrary, AtlasRegistry, BlobKind, BlobSet, Model, host};
use support::child;
use support::standin::{self, probe};

child::bodies!(
    each_device_loads_the_best_blob_it_runs,
    a_device_that_runs_none_is_refused_naming_the_set,
    ptx_the_driver_cannot_jit_is_passed_over,
    a_library_chooses_for_each_device,
    the_kernels_of_atlas_load_as_blob_sets,
    gpu_sets_compute_what_the_cpu_does,
);

/// The demo's `elementwise` module (`scale`, `axpy`) as the sm_`sm` cubin.
fn elementwise(sm: u32) -> &'static [u8] {
    support::blobs::blob_of(cubin_for_model("demo", sm).unwrap(), "elementwise")
}

/// The demo's `elementwise` module as PTX (compute_75, PTX ISA 8.0).
fn elementwise_ptx() -> &'static [u8] {
    support::blobs::blob_of(ptx_for_model("demo").unwrap(), "elementwise")
}

/// `elementwise` as a cubin for each of `sms` and, with `ptx`, the PTX.
fn set(sms: &[u32], ptx: bool) -> BlobSet<'static> {
    let set = sms
        .iter()
        .fold(BlobSet::new(), |set, &sm| set.cubin(sm, elementwise(sm)));
    if ptx { set.ptx(elementwise_ptx()) } else { set }
}

fn model(set: BlobSet<'static>) -> Model<'static> {
    Model::new().blob_set("elementwise", set)
}

/// The image the stand-in loaded `registry`'s `elementwise` module from.
fn loaded_from(registry: &AtlasRegistry) -> *const u8 {
    probe().module_image(registry.raw_module("elementwise").unwrap())
}

/// The architectures of a set without cubins for sm_86 and sm_89.
const PARTIAL: &[u32] = &[75, 80, 90];

/// The blob each device loads of `elementwise` given as a cubin for each architecture of
/// atlas-kernels and the PTX (`full`), and as cubins for [`PARTIAL`] and the PTX: written out per
/// device.
fn best_for((major, minor): (u32, u32)) -> (&'static [u8], &'static [u8]) {
    let ptx = elementwise_ptx();
    match (major, minor) {
        (9, 0) => (elementwise(90), elementwise(90)),
        (8, 0) => (elementwise(80), elementwise(80)),
        // Desktop Ampere and Ada run sm_80 SASS.
        (8, 6) => (elementwise(86), elementwise(80)),
        (8, 9) => (elementwise(89), elementwise(80)),
        // Orin (Tegra) runs SASS of its own compute capability only.
        (8, 7) => (ptx, ptx),
        (7, 5) => (elementwise(75), elementwise(75)),
        (10, 0) | (12, 0) => (ptx, ptx),
        other => panic!("no expectation written for compute capability {other:?}"),
    }
}

#[test]
fn each_device_loads_its_own_sass_else_an_older_minors_else_the_ptx() {
    for variant in [
        &[][..],
        &["-DSTANDIN_CC_MAJOR=8"],
        &["-DSTANDIN_CC_MAJOR=8", "-DSTANDIN_CC_MINOR=6"],
        &["-DSTANDIN_CC_MAJOR=8", "-DSTANDIN_CC_MINOR=7"],
        &["-DSTANDIN_CC_MAJOR=8", "-DSTANDIN_CC_MINOR=9"],
        &["-DSTANDIN_CC_MAJOR=7", "-DSTANDIN_CC_MINOR=5"],
        &["-DSTANDIN_CC_MAJOR=10"],
        &["-DSTANDIN_CC_MAJOR=12"],
    ] {
        standin::run(each_device_loads_the_best_blob_it_runs, variant);
    }
}

fn each_device_loads_the_best_blob_it_runs() {
    let cc = host(0).unwrap().compute_capability();
    let (full, partial) = best_for(cc);
    for (sms, want) in [(CUBIN_ARCHS, full), (PARTIAL, partial)] {
        let registry = AtlasRegistry::load_model(0, &model(set(sms, true))).unwrap();
        assert_eq!(loaded_from(&registry), want.as_ptr(), "{sms:?} on {cc:?}");
        let kind = if std::ptr::eq(want, elementwise_ptx()) {
            BlobKind::Ptx
        } else {
            BlobKind::Cubin
        };
        assert_eq!(registry.module_kind("elementwise"), Some(kind));
        assert!(registry.function("elementwise", "scale").is_ok());
        // The order the set is given in does not matter.
        let reversed = sms
            .iter()
            .rev()
            .fold(BlobSet::new().ptx(elementwise_ptx()), |set, &sm| {
                set.cubin(sm, elementwise(sm))
            });
        let registry = AtlasRegistry::load_model(0, &model(reversed)).unwrap();
        assert_eq!(
            loaded_from(&registry),
            want.as_ptr(),
            "{sms:?} on {cc:?}, reversed"
        );
        // The library chooses the same; the pure choice says so without a driver.
        let library = AtlasLibrary::load_model(&model(set(sms, true))).unwrap();
        assert_eq!(loaded_from(&library.registry(0).unwrap()), want.as_ptr());
        assert_eq!(set(sms, true).choose(cc, Some((12, 9))), Some(want));
    }
    let blobs = blobs_for_device("demo", cc).unwrap();
    assert_eq!(support::blobs::blob_of(blobs, "elementwise"), full);
}

#[test]
fn a_device_that_runs_no_blob_of_a_set_is_refused_naming_what_it_holds() {
    standin::run(
        a_device_that_runs_none_is_refused_naming_the_set,
        &["-DSTANDIN_CC_MAJOR=7"],
    );
}

/// A 7.0 device runs none of sm_75 to sm_90 SASS nor compute_75 PTX.
fn a_device_that_runs_none_is_refused_naming_the_set() {
    let p = probe();
    p.reset();
    let check = |e: AtlasError| {
        assert_eq!(
            e.to_string(),
            "module `elementwise` has no code that device 0 (sm_70) can run: it holds sm_80 SASS, \
             sm_90 SASS, compute_75 PTX (ISA 8.0); load a cubin built for sm_70, or PTX"
        );
    };
    let model = model(set(&[80, 90], true));
    check(AtlasRegistry::load_model(0, &model).unwrap_err());
    check(
        AtlasLibrary::load_model(&model)
            .unwrap()
            .registry(0)
            .unwrap_err(),
    );
    assert_eq!(
        p.count("cuModuleLoadData") + p.count("cuModuleLoadDataEx") + p.count("cuLibraryLoadData"),
        0
    );
}

#[test]
fn ptx_of_a_set_that_the_driver_cannot_jit_is_passed_over_or_refused() {
    standin::run(
        ptx_the_driver_cannot_jit_is_passed_over,
        &["-DSTANDIN_CC_MAJOR=10", "-DSTANDIN_DRIVER_VERSION=12040"],
    );
}

/// On an sm_100 device under a CUDA 12.4 driver, of PTX for compute_90 (ISA 9.0, nvcc 13) and
/// compute_75 (ISA 8.0), only the older JIT-compiles: it is chosen though it is for an older
/// architecture; without it the set is refused as too new.
fn ptx_the_driver_cannot_jit_is_passed_over() {
    let nvcc13 = String::from_utf8(elementwise_ptx().to_vec())
        .unwrap()
        .replace(".version 8.0", ".version 9.0")
        .replace(".target sm_75", ".target sm_90");
    let newer = BlobSet::new()
        .cubin(90, elementwise(90))
        .ptx(nvcc13.as_bytes());
    let registry = AtlasRegistry::load_model(
        0,
        &Model::new().blob_set("elementwise", newer.clone().ptx(elementwise_ptx())),
    )
    .unwrap();
    assert_eq!(loaded_from(&registry), elementwise_ptx().as_ptr());
    let e = AtlasRegistry::load_model(0, &Model::new().blob_set("elementwise", newer)).unwrap_err();
    assert!(
        matches!(e, AtlasError::PtxTooNew { isa: (9, 0), needs: Some((13, 0)), driver: (12, 4), ref arch, .. } if arch == "sm_100"),
        "{e:?}"
    );
}

#[test]
fn a_library_loads_for_each_device_the_blob_it_runs_once() {
    standin::run(
        a_library_chooses_for_each_device,
        &["-DSTANDIN_DEVICES=2", "-DSTANDIN_CC1=80"],
    );
}

/// Device 0 is 9.0, device 1 is 8.0.
fn a_library_chooses_for_each_device() {
    assert_eq!(host(1).unwrap().compute_capability(), (8, 0));
    let p = probe();
    p.reset();
    let library = AtlasLibrary::load_model(&model(set(CUBIN_ARCHS, true))).unwrap();
    assert_eq!(p.count("cuLibraryLoadData"), 2, "one load per blob chosen");
    let (r0, r1) = (library.registry(0).unwrap(), library.registry(1).unwrap());
    assert_eq!(loaded_from(&r0), elementwise(90).as_ptr());
    assert_eq!(loaded_from(&r1), elementwise(80).as_ptr());

    // A blob both devices choose is loaded once.
    p.reset();
    let library = AtlasLibrary::load_model(&model(set(&[], true))).unwrap();
    assert_eq!(p.count("cuLibraryLoadData"), 1);
    for ordinal in 0..2 {
        let registry = library.registry(ordinal).unwrap();
        assert_eq!(loaded_from(&registry), elementwise_ptx().as_ptr());
    }

    // A device that runs none of the set is refused; the other is served.
    p.reset();
    let library = AtlasLibrary::load_model(&model(set(&[90], false))).unwrap();
    assert_eq!(p.count("cuLibraryLoadData"), 1);
    assert_eq!(
        loaded_from(&library.registry(0).unwrap()),
        elementwise(90).as_ptr()
    );
    let e = library.registry(1).unwrap_err();
    assert!(
        matches!(&e, AtlasError::NoBinaryForDevice { device: 1, holds, arch, .. }
            if holds == "sm_90 SASS" && arch == "sm_80"),
        "{e:?}"
    );
}

#[test]
fn the_kernels_of_atlas_load_as_blob_sets_on_every_device() {
    standin::run(
        the_kernels_of_atlas_load_as_blob_sets,
        &["-DSTANDIN_DEVICES=2", "-DSTANDIN_CC1=86"],
    );
}

fn the_kernels_of_atlas_load_as_blob_sets() {
    let demo = atlas_kernels::model("demo").unwrap();
    let library = AtlasLibrary::load_model(&demo).unwrap();
    for (ordinal, sm) in [(0, 90), (1, 86)] {
        let registry = library.registry(ordinal).unwrap();
        for (module, cubin) in cubin_for_model("demo", sm).unwrap() {
            let raw = registry.raw_module(module).unwrap();
            assert_eq!(
                probe().module_image(raw),
                cubin.as_ptr(),
                "{module} on {ordinal}"
            );
        }
    }
    let registry = AtlasRegistry::load_model(1, &demo).unwrap();
    assert_eq!(registry.module_kind("block_reduce"), Some(BlobKind::Cubin));
}

#[test]
fn a_set_whose_blobs_are_not_what_they_are_given_as_is_refused_without_a_driver() {
    // Refused while the model is checked, before any driver is loaded: this process has none.
    let refusal = |set: BlobSet<'static>| {
        let e = AtlasRegistry::load_model(0, &model(set)).unwrap_err();
        assert!(matches!(e, AtlasError::InvalidModule { .. }), "{e:?}");
        e.to_string()
    };
    assert_eq!(
        refusal(
            BlobSet::new()
                .cubin(90, elementwise(90))
                .cubin(80, elementwise(86))
        ),
        "module `elementwise`: blob 1 of the blob set, given as its cubin for sm_80, holds sm_86 \
         SASS: give each cubin the SM it is built for, and PTX as PTX"
    );
    assert!(
        refusal(BlobSet::new().ptx(elementwise(90))).contains("given as its PTX, holds sm_90 SASS")
    );
    assert!(
        refusal(BlobSet::new().cubin(75, elementwise_ptx()))
            .contains("given as its cubin for sm_75, holds compute_75 PTX (ISA 8.0)")
    );
    assert!(refusal(BlobSet::new()).contains("the blob set holds no blob"));
    let truncated = &elementwise(90)[..100];
    let text = refusal(BlobSet::new().ptx(elementwise_ptx()).cubin(90, truncated));
    assert!(
        text.starts_with("module `elementwise`: blob 1 of the blob set: "),
        "{text}"
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_blob_sets_compute_what_the_cpu_does() {
    let child = child::run_on(gpu_sets_compute_what_the_cpu_does, None);
    assert_eq!(child.ending, child::Ending::Passed, "{child}");
}

/// On the real device: a set with its own cubin loads it, one without loads the PTX (no SASS of
/// another major version runs), and both compute `scale` as the CPU does.
fn gpu_sets_compute_what_the_cpu_does() {
    let (major, minor) = host(0).expect("an NVIDIA GPU").compute_capability();
    let own = major * 10 + minor;
    let others: Vec<u32> = CUBIN_ARCHS
        .iter()
        .copied()
        .filter(|sm| sm / 10 != major)
        .collect();
    for (what, set, kind) in [
        (
            "every cubin and the PTX",
            set(CUBIN_ARCHS, true),
            BlobKind::Cubin,
        ),
        (
            "other architectures' cubins and the PTX",
            set(&others, true),
            BlobKind::Ptx,
        ),
    ] {
        assert!(
            CUBIN_ARCHS.contains(&own),
            "sm_{own}: a device atlas-kernels has cubins for"
        );
        let model = Model::new().blob_set("elementwise", set);
        let registry = AtlasRegistry::load_model(0, &model).unwrap();
        assert_eq!(registry.module_kind("elementwise"), Some(kind), "{what}");
        support::reference::scale_with_nan_tail(&registry, "elementwise", 100_003, 0.0, what);
        let library = AtlasLibrary::load_model(&model).unwrap();
        let registry = library.registry(0).unwrap();
        assert_eq!(
            registry.module_kind("elementwise"),
            Some(kind),
            "{what}, library"
        );
        support::reference::scale_with_nan_tail(&registry, "elementwise", 100_003, 0.0, what);
    }
    let e = AtlasRegistry::load_model(
        0,
        &Model::new().blob_set("elementwise", set(&others, false)),
    )
    .unwrap_err();
    assert!(matches!(e, AtlasError::NoBinaryForDevice { .. }), "{e:?}");
}
