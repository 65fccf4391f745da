//! NVRTC for the benches that compile, found as the compile tests find it: `ATLAS_NVRTC_PATH`,
//! the pinned NVRTC 12.0 under `target/`, or the first that Atlas's own search loads (see
//! `atlas-registry/tests/support/nvrtc_library.rs`, which both use).

#[path = "../../atlas-registry/tests/support/nvrtc_library.rs"]
mod nvrtc_library;

use std::path::PathBuf;

/// Makes the NVRTC the tests would use the one of this process and of the children it starts,
/// by naming it in `ATLAS_NVRTC_PATH`, which Atlas's search takes alone; returns it, or why there
/// is none (saying how to get one).
///
/// # Safety
///
/// 1. No other thread of the process runs: nothing reads or writes the environment meanwhile.
pub(crate) unsafe fn choose() -> Result<PathBuf, String> {
    let path = nvrtc_library::find()?;
    // SAFETY: duty 1: this is the only thread, so nothing reads the environment meanwhile.
    unsafe { std::env::set_var(atlas_sys::NVRTC_PATH_VAR, &path) };
    Ok(path)
}
