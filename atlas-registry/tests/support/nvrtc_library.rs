//! Which NVRTC the tests and the benches compile with (the benches include this file by path), so
//! that both find the same one.
//!
//! The first of: the library `ATLAS_NVRTC_PATH` names; the pinned NVRTC 12.0 that
//! `python3 kernels/nvrtc.py --fetch` unpacks into `target/nvrtc-12.0.140/lib/` of the
//! workspace; the first library of Atlas's own search that loads (`Nvrtc::search_paths`:
//! `libnvrtc.so.13`, `libnvrtc.so.12`, `libnvrtc.so` through the platform's loader, then the CUDA
//! toolkit's copy in `$CUDA_HOME/lib64`, `$CUDA_PATH/lib64` or `/usr/local/cuda/lib64`).

use std::path::{Path, PathBuf};

use atlas_sys::{NVRTC_PATH_VAR, Nvrtc, RuntimeLibrary};

/// How to get an NVRTC for the compile tests and benches.
pub(crate) const HOW_TO_GET_NVRTC: &str = "fetch the pinned NVRTC 12.0 with `python3 \
     kernels/nvrtc.py --fetch` (into target/; no GPU or toolkit needed), or set ATLAS_NVRTC_PATH \
     to a libnvrtc.so (a CUDA toolkit's lib64/, or `pip install nvidia-cuda-nvrtc-cu12`)";

/// Where `kernels/nvrtc.py` unpacks the pinned NVRTC, below the workspace's root.
const PINNED: &str = "target/nvrtc-12.0.140/lib/libnvrtc.so.12";

/// The pinned NVRTC, when it has been fetched: in the `target/` of this package's directory or of
/// a directory above it (the workspace's).
fn pinned() -> Option<PathBuf> {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|dir| dir.join(PINNED))
        .find(|path| path.is_file())
}

/// The NVRTC library to compile with (see the module docs), or why there is none (saying how to
/// get one): none found, or an `ATLAS_NVRTC_PATH` that names a file that does not exist.
pub(crate) fn find() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os(NVRTC_PATH_VAR).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        if path.is_absolute() && !path.exists() {
            return Err(format!(
                "{NVRTC_PATH_VAR}={} does not exist: {HOW_TO_GET_NVRTC}",
                path.display()
            ));
        }
        return Ok(path);
    }
    if let Some(pinned) = pinned() {
        return Ok(pinned);
    }
    let searched = Nvrtc::search_paths();
    for path in &searched {
        // SAFETY: a library that Atlas's search finds under NVRTC's names is NVRTC, which is sound
        // to load into this process, and `Nvrtc` is generated from its `nvrtc.h`
        // (`Nvrtc::load_from`'s duties 1 and 2); nothing of it is called, and the table unloads it
        // when dropped.
        if unsafe { Nvrtc::load_from(path) }.is_ok() {
            return Ok(path.clone());
        }
    }
    let searched: Vec<String> = searched.iter().map(|p| p.display().to_string()).collect();
    Err(format!(
        "no NVRTC ({NVRTC_PATH_VAR} unset, no {PINNED} in the workspace, none of {} loads): \
         {HOW_TO_GET_NVRTC}",
        searched.join(", ")
    ))
}
