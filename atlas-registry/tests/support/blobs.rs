//! The committed blobs as tests load them, and blobs made to be refused.

use atlas_kernels::{Blobs, cubin_for_model, ptx_for_model};
use atlas_registry::{AtlasError, AtlasRegistry};

/// What a GPU test says when it cannot get what it needs.
pub const NEEDS_GPU: &str = "this test needs an NVIDIA GPU and its driver";

/// Loads `model`'s PTX modules on device 0; panics (failing the test) without a GPU.
pub fn load(model: &str) -> AtlasRegistry {
    AtlasRegistry::load(0, ptx_for_model(model).expect("a model of atlas-kernels"))
        .unwrap_or_else(|e| panic!("loading model `{model}` on device 0 ({NEEDS_GPU}): {e}"))
}

/// Loading `blobs` on device 0 must fail; returns the error.
pub fn load_err(blobs: &[(&str, &[u8])]) -> AtlasError {
    match AtlasRegistry::load(0, blobs) {
        Ok(r) => panic!(
            "loading {:?} succeeded",
            r.module_names().collect::<Vec<_>>()
        ),
        Err(e) => e,
    }
}

/// The cubins of `model` for device 0's own architecture (the GPU tests' device).
pub fn device_cubins(model: &str) -> Blobs {
    let (major, minor) = atlas_registry::host(0).expect("a GPU").compute_capability();
    cubin_for_model(model, major * 10 + minor)
        .unwrap_or_else(|| panic!("no cubins of {model} for sm_{major}{minor}"))
}

/// The blob of module `module` in `blobs`.
pub fn blob_of(blobs: Blobs, module: &str) -> &'static [u8] {
    blobs
        .iter()
        .find(|(name, _)| *name == module)
        .map(|(_, blob)| *blob)
        .unwrap_or_else(|| panic!("no module `{module}`"))
}

/// A 64-byte ELF header that passes Atlas's header checks (64-bit, little-endian, CUDA, no
/// header tables), followed by `body`.
pub fn plausible_elf(body: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; 64];
    b[..4].copy_from_slice(b"\x7fELF");
    b[4] = 2;
    b[5] = 1;
    b[6] = 1;
    b[18..20].copy_from_slice(&190u16.to_le_bytes());
    b.extend_from_slice(body);
    b
}

/// A 16-byte fatbin header whose declared size is exactly `body`, followed by `body`.
pub fn plausible_fatbin(body: &[u8]) -> Vec<u8> {
    let mut b = 0xBA55_ED50u32.to_le_bytes().to_vec();
    b.extend_from_slice(&1u16.to_le_bytes());
    b.extend_from_slice(&16u16.to_le_bytes());
    b.extend_from_slice(&(body.len() as u64).to_le_bytes());
    b.extend_from_slice(body);
    b
}
