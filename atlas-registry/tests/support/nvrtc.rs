//! The NVRTC that the compile tests use, and running a body in a child process that uses it.
//!
//! A test that needs NVRTC is `#[ignore = "needs NVRTC: ..."]`, so that a plain `cargo test`
//! counts it as ignored, never as passed. Run such tests with `-- --ignored` (`.ci/run` does,
//! after fetching the pinned NVRTC) or `--include-ignored` (the GPU machine's runner): then
//! [`library`] finds an NVRTC or fails the test, saying how to get one.
//!
//! The library, the first of: the one `ATLAS_NVRTC_PATH` names; the pinned NVRTC 12.0 that
//! `python3 kernels/nvrtc.py --fetch` unpacks into `target/nvrtc-12.0.140/lib/`; the first of
//! `libnvrtc.so.13`, `libnvrtc.so.12`, `libnvrtc.so` that the platform's loader finds (Atlas's own
//! search); the CUDA toolkit's, in `$CUDA_HOME/lib64`, `$CUDA_PATH/lib64` or
//! `/usr/local/cuda/lib64` (where the GPU machine has `libnvrtc.so.13`).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use atlas_registry::sys::{NVRTC_LIBRARY_NAMES, NVRTC_PATH_VAR, Nvrtc};

use super::child::{self, Child, Ending};
use super::standin;

/// How to get an NVRTC for the compile tests.
pub const HOW_TO_GET_NVRTC: &str = "fetch the pinned NVRTC 12.0 with `python3 kernels/nvrtc.py \
     --fetch` (into target/; no GPU or toolkit needed), or set ATLAS_NVRTC_PATH to a libnvrtc.so \
     (a CUDA toolkit's lib64/, or `pip install nvidia-cuda-nvrtc-cu12`)";

/// Where `kernels/nvrtc.py` unpacks the pinned NVRTC.
fn pinned() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/nvrtc-12.0.140/lib/libnvrtc.so.12")
}

/// The NVRTC library to compile with (see the module docs). Panics, saying how to get one, when
/// there is none, and when `ATLAS_NVRTC_PATH` names a file that does not exist.
pub fn library() -> PathBuf {
    if let Some(path) = std::env::var_os(NVRTC_PATH_VAR).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        assert!(
            path.exists() || !path.is_absolute(),
            "{NVRTC_PATH_VAR}={} does not exist: {HOW_TO_GET_NVRTC}",
            path.display()
        );
        return path;
    }
    let pinned = pinned();
    if pinned.is_file() {
        return pinned;
    }
    for name in NVRTC_LIBRARY_NAMES {
        // SAFETY: a library the loader finds under NVRTC's names is NVRTC, which is sound to load
        // into a test process, and `Nvrtc` is generated from its `nvrtc.h` (`Nvrtc::load_from`'s
        // duties 1 and 2); nothing of it is called, and the table unloads it when dropped.
        if unsafe { Nvrtc::load_from(name) }.is_ok() {
            return PathBuf::from(name);
        }
    }
    let toolkits = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(|var| std::env::var_os(var).filter(|v| !v.is_empty()))
        .map(|root| Path::new(&root).join("lib64"))
        .chain([PathBuf::from("/usr/local/cuda/lib64")]);
    for dir in toolkits {
        let found = ["libnvrtc.so.13", "libnvrtc.so.12"]
            .iter()
            .map(|name| dir.join(name))
            .find(|path| path.is_file());
        if let Some(path) = found {
            return path;
        }
    }
    panic!(
        "no NVRTC for the compile tests ({NVRTC_PATH_VAR} unset, not in {}, not found by the \
         loader as {}, not in a CUDA toolkit's lib64/): {HOW_TO_GET_NVRTC}",
        pinned.display(),
        NVRTC_LIBRARY_NAMES.join(", ")
    );
}

/// The stand-in's variant switch that makes it a CUDA 13.0 driver: one that loads what any NVRTC
/// the tests use (12 or 13) makes. [`run_any`] adds it unless `variant` sets the version itself.
const DRIVER_13: &str = "-DSTANDIN_DRIVER_VERSION=13000";

/// Runs `body` in a child whose driver is the stand-in built with `variant` and whose NVRTC is
/// [`library`], with `env` added; asserts that it passed.
#[track_caller]
pub fn run<F: Fn()>(body: F, variant: &[&str], env: &[(&str, &OsStr)]) -> Child {
    let nvrtc = library();
    let name = child::name_of(&body);
    let child = run_any(body, variant, &nvrtc, env);
    assert_eq!(child.ending, Ending::Passed, "{}: {child}", name);
    child
}

/// As [`run`], with the NVRTC given and without the assertion.
pub fn run_any<F: Fn()>(
    body: F,
    variant: &[&str],
    nvrtc: &std::path::Path,
    env: &[(&str, &OsStr)],
) -> Child {
    let mut all: Vec<(&str, &OsStr)> = vec![(NVRTC_PATH_VAR, nvrtc.as_os_str())];
    all.extend_from_slice(env);
    let mut variant = variant.to_vec();
    if !variant
        .iter()
        .any(|v| v.starts_with("-DSTANDIN_DRIVER_VERSION="))
    {
        variant.push(DRIVER_13);
    }
    child::run_with_env(body, Some(&standin::build(&variant)), &all)
}
