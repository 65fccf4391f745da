//! The NVRTC that the compile tests use, and running a body in a child process that uses it.
//!
//! A test that needs NVRTC is `#[ignore = "needs NVRTC: ..."]`, so that a plain `cargo test`
//! counts it as ignored, never as passed. Run such tests with `-- --ignored` (`.ci/run` does,
//! after fetching the pinned NVRTC) or `--include-ignored` (the GPU machine's runner): then
//! [`library`] finds an NVRTC or fails the test, saying how to get one.
//!
//! The library is [`nvrtc_library::find`](super::nvrtc_library::find)'s, which the benches use too:
//! `ATLAS_NVRTC_PATH`, the pinned NVRTC 12.0 under `target/`, or the first that Atlas's own
//! search loads.

use std::ffi::OsStr;
use std::path::PathBuf;

use atlas_registry::sys::NVRTC_PATH_VAR;

use super::child::{self, Child, Ending};
use super::nvrtc_library;
use super::standin;

/// The NVRTC library to compile with. Panics, saying how to get one, when there is none, and when
/// `ATLAS_NVRTC_PATH` names a file that does not exist.
pub fn library() -> PathBuf {
    nvrtc_library::find().unwrap_or_else(|why| panic!("{why}"))
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
