//! What a registry hands the driver of a fatbin. When the device's own SASS settles what the
//! driver loads (one entry of exactly its SM, an executable cubin, no other SASS the device may
//! load, no `CUDA_FORCE_PTX_JIT` or `CUDA_FORCE_JIT`), a load hands it that cubin alone, checked
//! and decompressed once; otherwise the whole fatbin, every entry the device may pick checked.
//!
//! Against the stand-in libcuda (`support/standin`), which records the image each module was
//! loaded from, each body in a child process: `cargo test -p atlas-registry --test
//! settled_fatbins`. On the GPU, a fatbin whose SASS and PTX compute different things
//! (`fixtures/two_faced.cu`: `y = 2x` from its sm_90 SASS, `y = 3x` from its compute_90 PTX, with
//! 128 and 192 bytes of static shared memory): a registry runs what the plain driver loads of it,
//! with and without `CUDA_FORCE_PTX_JIT`.

mod support;

use std::ffi::OsStr;

use atlas_registry::{
    AtlasLibrary, AtlasRegistry, BlobKind, DeviceBuffer, LaunchConfig, validate_blob_for_device,
};
use support::child::{self, Ending};
use support::fatbin::{Fatbin, KIND_ELF};
use support::rng::Rng;
use support::standin::{self, probe};

/// `two_faced.cu` as one fatbin: its sm_90 SASS (`FACE=2`) and compute_90 PTX (`FACE=3`), both
/// zstd-compressed (`fixtures/make.sh`).
const TWO_FACED: &[u8] = include_bytes!("fixtures/two_faced.sm_90.zstd.fatbin");

child::bodies!(
    the_driver_is_handed_the_devices_own_cubin,
    the_driver_is_handed_the_fatbin_when_the_jit_is_forced,
    handed_the_fatbin_on_8_6,
    gpu_runs_what_the_driver_loads,
);

/// Where, in `fatbin`, the payload of its entry of sm_`sm` SASS starts.
fn sass_payload_at(fatbin: &[u8], sm: u32) -> usize {
    let parsed = Fatbin::parse(fatbin).unwrap();
    let mut at = parsed.header.len();
    for entry in &parsed.entries {
        if entry.kind() == KIND_ELF && entry.arch() == sm {
            return at + entry.header.len();
        }
        at += entry.header.len() + entry.payload.len();
    }
    panic!("no sm_{sm} SASS in the fatbin")
}

/// The image the stand-in loaded `registry`'s module `name` from (compared, never read: a
/// decompressed cubin is Atlas's to free).
fn loaded_from(registry: &AtlasRegistry, name: &str) -> *const u8 {
    probe().module_image(registry.raw_module(name).unwrap())
}

#[test]
fn a_registry_hands_the_driver_the_cubin_it_loads_of_a_fatbin() {
    standin::run(the_driver_is_handed_the_devices_own_cubin, &[]);
}

fn the_driver_is_handed_the_devices_own_cubin() {
    // A compressed entry: the driver gets the cubin as Atlas decompressed it, not the fatbin.
    let registry = AtlasRegistry::load(0, &[("face", TWO_FACED)]).unwrap();
    let image = loaded_from(&registry, "face");
    assert!(!TWO_FACED.as_ptr_range().contains(&image));
    assert_eq!(registry.module_kind("face"), Some(BlobKind::Fatbin));
    // A plain entry: the cubin where it lies in the fatbin (sm_90 of atlas-kernels' fatbin).
    let fatbin = atlas_kernels::ELEMENTWISE_FATBIN;
    let registry = AtlasRegistry::load(0, &[("elementwise", fatbin)]).unwrap();
    let at = sass_payload_at(fatbin, 90);
    assert_eq!(loaded_from(&registry, "elementwise"), fatbin[at..].as_ptr());
    registry.function("elementwise", "scale").unwrap();
    // A device with no SASS of its own in it (8.6 may load the sm_80 SASS as well): the fatbin.
    // And a library, which loads one image for every device: the fatbin.
    let library = AtlasLibrary::load(&[("face", TWO_FACED)]).unwrap();
    let registry = library.registry(0).unwrap();
    assert_eq!(loaded_from(&registry, "face"), TWO_FACED.as_ptr());
}

#[test]
fn a_device_without_its_own_single_sass_is_handed_the_fatbin() {
    standin::run(
        handed_the_fatbin_on_8_6,
        &["-DSTANDIN_CC_MAJOR=8", "-DSTANDIN_CC_MINOR=6"],
    );
}

fn handed_the_fatbin_on_8_6() {
    let fatbin = atlas_kernels::ELEMENTWISE_FATBIN;
    let registry = AtlasRegistry::load(0, &[("elementwise", fatbin)]).unwrap();
    assert_eq!(loaded_from(&registry, "elementwise"), fatbin.as_ptr());
}

#[test]
fn the_jit_forced_by_the_environment_gets_the_whole_fatbin() {
    for name in ["CUDA_FORCE_PTX_JIT", "CUDA_FORCE_JIT"] {
        let child = child::run_with_env(
            the_driver_is_handed_the_fatbin_when_the_jit_is_forced,
            Some(&standin::build(&[])),
            &[(name, OsStr::new("1"))],
        );
        assert_eq!(child.ending, Ending::Passed, "{name}=1: {child}");
    }
    // Set to 0, it forces nothing.
    let child = child::run_with_env(
        the_driver_is_handed_the_devices_own_cubin,
        Some(&standin::build(&[])),
        &[("CUDA_FORCE_PTX_JIT", OsStr::new("0"))],
    );
    assert_eq!(
        child.ending,
        Ending::Passed,
        "CUDA_FORCE_PTX_JIT=0: {child}"
    );
}

fn the_driver_is_handed_the_fatbin_when_the_jit_is_forced() {
    let registry = AtlasRegistry::load(0, &[("face", TWO_FACED)]).unwrap();
    assert_eq!(loaded_from(&registry, "face"), TWO_FACED.as_ptr());
}

/// Which entries are checked follows what is handed over: a broken PTX entry beside the device's
/// own SASS is never parsed by the driver, so a load on that device passes it; on a device that
/// may JIT the PTX, and for any device, it is refused.
#[test]
fn only_what_the_driver_is_handed_is_checked() {
    let mut parsed = Fatbin::parse(atlas_kernels::ELEMENTWISE_FATBIN).unwrap();
    let ptx = &mut parsed.entries[0];
    assert_eq!(ptx.kind(), support::fatbin::KIND_PTX);
    ptx.payload[..8].copy_from_slice(b"nonsense");
    let broken = parsed.bytes();
    assert_eq!(
        validate_blob_for_device("m", &broken, (9, 0)).unwrap(),
        BlobKind::Fatbin
    );
    for cc in [(8, 6), (10, 0), (12, 0)] {
        let e = validate_blob_for_device("m", &broken, cc).unwrap_err();
        assert!(
            e.to_string().contains("fatbin entry 0 (PTX sm_75"),
            "{cc:?}: {e}"
        );
    }
    assert!(atlas_registry::validate_blob("m", &broken).is_err());
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_a_registry_runs_what_the_driver_loads_of_a_fatbin() {
    for forced in ["", "1"] {
        let env: &[(&str, &OsStr)] = if forced.is_empty() {
            &[]
        } else {
            &[("CUDA_FORCE_PTX_JIT", OsStr::new(forced))]
        };
        let child = child::run_with_env(gpu_runs_what_the_driver_loads, None, env);
        assert_eq!(
            child.ending,
            Ending::Passed,
            "CUDA_FORCE_PTX_JIT={forced}: {child}"
        );
    }
}

/// On the real device (an sm_90 one: the fixture's SASS is sm_90): the plain driver's load of
/// the fatbin and a registry's run the same face of the kernel, the SASS unless the JIT is
/// forced; the registry's computes `FACE * x` exactly, on fresh data into a poisoned output.
fn gpu_runs_what_the_driver_loads() {
    let forced = std::env::var_os("CUDA_FORCE_PTX_JIT").is_some_and(|v| v != "0");
    let (face, shared) = if forced { (3.0f32, 192) } else { (2.0, 128) };
    let raw = support::raw::Raw::new().unwrap();
    let module = raw
        .load(TWO_FACED)
        .expect("the plain driver loads the fatbin");
    let function = module.function("face").unwrap();
    // SAFETY: a function of `module`, which is loaded.
    let raw_shared = unsafe { support::raw::shared_bytes(function) }.unwrap();
    assert_eq!(raw_shared, shared, "the plain driver, forced: {forced}");
    drop(module);

    let registry = AtlasRegistry::load(0, &[("face", TWO_FACED)]).unwrap();
    let kernel = registry.function("face", "face").unwrap();
    // SAFETY: a function of `registry`, which is alive.
    let atlas_shared =
        unsafe { support::raw::shared_bytes(atlas_registry::Kernel::raw(&kernel)) }.unwrap();
    assert_eq!(atlas_shared, raw_shared, "Atlas, forced: {forced}");

    let mut rng = Rng::new();
    let n = 1000 + rng.index(100_000);
    let x = rng.f32s(n, -1000.0, 1000.0);
    let stream = registry.stream();
    let input = DeviceBuffer::from_slice(registry.ctx(), stream, &x).unwrap();
    let mut y = DeviceBuffer::from_slice(registry.ctx(), stream, &vec![f32::NAN; n]).unwrap();
    // SAFETY: `face` reads `n` floats of `input` and writes `n` of `y`, both that long and alive
    // until `to_vec` synchronizes the stream.
    unsafe {
        kernel.launch(
            stream,
            &LaunchConfig::for_elements(n as u32, 256),
            (&mut y, &input, n as u32),
        )
    }
    .unwrap();
    let got = y.to_vec(stream).unwrap();
    for (i, (&g, &x)) in got.iter().zip(&x).enumerate() {
        assert_eq!(
            g.to_bits(),
            (x * face).to_bits(),
            "element {i} of {n}: x = {x}"
        );
    }
}
