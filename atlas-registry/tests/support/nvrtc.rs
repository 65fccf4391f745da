//! The NVRTC that CI-side tests compile with, and running a body in a child process that uses it.
//!
//! The library is the one `ATLAS_NVRTC_PATH` names, else the pinned NVRTC 12.0 that
//! `python3 kernels/nvrtc.py` fetches into `target/nvrtc-12.0.140/lib/` (CI runs that script, and
//! `.ci/run` sets `ATLAS_NVRTC_PATH` to what it fetched). In CI (`CI` set) a missing NVRTC fails
//! the test; elsewhere the test says so on stderr and returns without checking anything.

use std::ffi::OsStr;
use std::path::PathBuf;

use atlas_registry::sys::NVRTC_PATH_VAR;

use super::child::{self, Child, Ending};
use super::standin;

/// Where `kernels/nvrtc.py` unpacks the pinned NVRTC.
fn pinned() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/nvrtc-12.0.140/lib/libnvrtc.so.12")
}

/// The NVRTC library to compile with, or `None` (after saying so) when there is none outside CI.
/// Panics in CI, and when `ATLAS_NVRTC_PATH` names a file that does not exist.
pub fn library() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(NVRTC_PATH_VAR).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        assert!(
            path.exists() || !path.is_absolute(),
            "{NVRTC_PATH_VAR}={} does not exist",
            path.display()
        );
        return Some(path);
    }
    let pinned = pinned();
    if pinned.is_file() {
        return Some(pinned);
    }
    let how = "fetch it with `python3 kernels/nvrtc.py --fetch` (the pinned NVRTC 12.0 wheel, into \
               target/), or set ATLAS_NVRTC_PATH to a libnvrtc.so (`pip install \
               nvidia-cuda-nvrtc-cu12`)";
    if std::env::var_os("CI").is_some() {
        panic!("no NVRTC for the compile tests: {how}");
    }
    eprintln!("NOT RUN: no NVRTC for the compile tests: {how}");
    None
}

/// The stand-in's variant switch that makes it a CUDA 13.0 driver: one that loads what any NVRTC
/// the tests use (12 or 13) makes. [`run_any`] adds it unless `variant` sets the version itself.
const DRIVER_13: &str = "-DSTANDIN_DRIVER_VERSION=13000";

/// Runs `body` in a child whose driver is the stand-in built with `variant` and whose NVRTC is
/// [`library`], with `env` added; asserts that it passed. Returns `None` (checking nothing) when
/// there is no NVRTC outside CI.
#[track_caller]
pub fn run<F: Fn()>(body: F, variant: &[&str], env: &[(&str, &OsStr)]) -> Option<Child> {
    let nvrtc = library()?;
    let name = child::name_of(&body);
    let child = run_any(body, variant, &nvrtc, env);
    assert_eq!(child.ending, Ending::Passed, "{}: {child}", name);
    Some(child)
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
