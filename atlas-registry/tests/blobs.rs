//! The blobs of atlas-kernels on a real GPU: the PTX, every cubin this device can run and the
//! fatbin compute what the CPU does; a cubin for an architecture the device cannot run is refused
//! with an error naming the module and both architectures.

mod support;

use atlas_kernels::{
    CUBIN_ARCHS, ELEMENTWISE_FATBIN, blobs_for_device, cubin_for_model, ptx_for_model,
};
use atlas_registry::{AtlasRegistry, BlobKind};

/// Elements the kernel scales; odd, so that the last block is partial.
const N: usize = 100_003;

/// The device's compute capability and its name as the blobs spell it (`sm_90`).
fn device() -> ((u32, u32), String) {
    let host = atlas_registry::host(0).expect("a CUDA device");
    let (major, minor) = host.compute_capability();
    ((major, minor), format!("sm_{major}{minor}"))
}

/// SASS runs only on a device of the same major compute capability with an equal or higher minor.
fn runs_on(sm: u32, (major, minor): (u32, u32)) -> bool {
    sm / 10 == major && sm % 10 <= minor
}

/// `elementwise::scale` of `registry` over `N` fresh floats and a NaN tail, checked against the CPU
/// to the bit (one IEEE multiplication on either side).
fn check_scale(registry: &AtlasRegistry, what: &str) {
    support::reference::scale_with_nan_tail(registry, "elementwise", N, 0.0, what);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn ptx_fatbin_and_every_runnable_cubin_match_the_cpu() {
    let (cc, sm_name) = device();
    let ptx = ptx_for_model("demo").unwrap();
    let registry = AtlasRegistry::load(0, ptx).unwrap();
    assert_eq!(registry.module_kind("elementwise"), Some(BlobKind::Ptx));
    check_scale(&registry, &format!("PTX on {sm_name}"));

    let fatbin = AtlasRegistry::load(0, &[("elementwise", ELEMENTWISE_FATBIN)]).unwrap();
    assert_eq!(fatbin.module_kind("elementwise"), Some(BlobKind::Fatbin));
    check_scale(&fatbin, &format!("fatbin on {sm_name}"));

    let runnable: Vec<u32> = CUBIN_ARCHS
        .iter()
        .copied()
        .filter(|&sm| runs_on(sm, cc))
        .collect();
    for &sm in &runnable {
        let registry = AtlasRegistry::load(0, cubin_for_model("demo", sm).unwrap())
            .unwrap_or_else(|e| panic!("sm_{sm} cubins on {sm_name}: {e}"));
        assert_eq!(registry.module_kind("elementwise"), Some(BlobKind::Cubin));
        check_scale(&registry, &format!("sm_{sm} cubin on {sm_name}"));
    }

    // What a program loads for this device: its own SASS when there is a cubin for exactly its
    // architecture, else the PTX.
    let best = blobs_for_device("demo", cc).unwrap();
    let exact = CUBIN_ARCHS.iter().any(|&sm| (sm / 10, sm % 10) == cc);
    let registry = AtlasRegistry::load(0, best).unwrap();
    let kind = if exact {
        BlobKind::Cubin
    } else {
        BlobKind::Ptx
    };
    assert_eq!(registry.module_kind("elementwise"), Some(kind), "{sm_name}");
    check_scale(&registry, &format!("blobs_for_device on {sm_name}"));
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_cubin_for_another_architecture_is_refused_naming_both() {
    let (cc, sm_name) = device();
    let foreign: Vec<u32> = CUBIN_ARCHS
        .iter()
        .copied()
        .filter(|&sm| !runs_on(sm, cc))
        .collect();
    // sm_75 and sm_90 differ in major: no device runs both.
    assert!(!foreign.is_empty(), "{sm_name} runs every cubin?");
    for sm in foreign {
        for &(module, blob) in cubin_for_model("demo", sm).unwrap() {
            let e = AtlasRegistry::load(0, &[(module, blob)])
                .err()
                .unwrap_or_else(|| panic!("the sm_{sm} {module} cubin loaded on {sm_name}"));
            let text = e.to_string();
            for part in [module, &format!("sm_{sm}"), &sm_name] {
                assert!(
                    text.contains(part),
                    "loading the sm_{sm} {module} cubin on {sm_name}: `{text}` does not name {part}"
                );
            }
        }
    }
}
