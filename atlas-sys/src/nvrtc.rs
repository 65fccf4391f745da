//! Finding and loading NVRTC, the CUDA run-time compiler: the process-wide table and its error.
//! The search is the driver's ([`RuntimeLibrary`]); only the names and the variable differ.

use std::path::Path;
use std::sync::OnceLock;

use crate::Nvrtc;
use crate::loader::{Attempts, LoadAttempt, RuntimeLibrary, load_path, search};

/// The environment variable that names the NVRTC library to load, overriding the search.
pub const NVRTC_PATH_VAR: &str = "ATLAS_NVRTC_PATH";

/// The names under which the platform's loader finds NVRTC, in the order tried: the newest major
/// version first (13, then 12).
#[cfg(unix)]
pub const NVRTC_LIBRARY_NAMES: &[&str] = &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];
/// The names under which the platform's loader finds NVRTC, in the order tried: the newest major
/// version first (13, then 12).
#[cfg(windows)]
pub const NVRTC_LIBRARY_NAMES: &[&str] = &["nvrtc64_130_0.dll", "nvrtc64_120_0.dll"];

/// NVRTC could not be loaded: every path tried, with the loader's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "cannot load NVRTC, the CUDA run-time compiler (install the CUDA toolkit's NVRTC or the \
     nvidia-cuda-nvrtc-cu12 wheel, and set {NVRTC_PATH_VAR} to its libnvrtc if the loader does \
     not find it); tried {}",
    Attempts(.attempts)
)]
#[non_exhaustive]
pub struct NvrtcLoadError {
    /// Every library tried, in order.
    pub attempts: Vec<LoadAttempt>,
}

impl RuntimeLibrary for Nvrtc {
    const WHAT: &'static str = "NVRTC";
    const PATH_VAR: &'static str = NVRTC_PATH_VAR;
    const NAMES: &'static [&'static str] = NVRTC_LIBRARY_NAMES;

    unsafe fn open(path: &Path) -> Result<Self, String> {
        // SAFETY: the caller vouches for the library (this function's contract).
        let nvrtc = unsafe { Nvrtc::new(path) }.map_err(|e| e.to_string())?;
        if let Err(e) = &nvrtc.nvrtcVersion {
            return Err(format!(
                "loaded, but it is not an NVRTC library (no nvrtcVersion: {e})"
            ));
        }
        Ok(nvrtc)
    }
}

impl Nvrtc {
    /// Loads the NVRTC library at `path` (a path, or a bare name for the platform's search).
    ///
    /// The library must export `nvrtcVersion`; one that does not is rejected as not NVRTC. Other
    /// missing functions do not fail the load (see [`entry!`](crate::entry)).
    ///
    /// # Safety
    ///
    /// 1. Loading a library runs its initialisation code: `path` must name a library that is sound
    ///    to load into this process (NVRTC, or a library standing in for it).
    /// 2. Each entry point is typed after `nvrtc.h`: the library's functions of those names must
    ///    have those signatures.
    #[doc(alias = "dlopen")]
    pub unsafe fn load_from(path: impl AsRef<Path>) -> Result<Nvrtc, NvrtcLoadError> {
        // SAFETY: the caller's duties 1 and 2 are this function's own.
        unsafe { load_path(path.as_ref()) }.map_err(|attempt| NvrtcLoadError {
            attempts: vec![attempt],
        })
    }
}

/// The process-wide NVRTC table, loaded on first use and kept until the process exits.
///
/// Search order: the path in `ATLAS_NVRTC_PATH` when it is set (and then nothing else), otherwise
/// [`NVRTC_LIBRARY_NAMES`] through the platform's loader. The first library that loads and
/// exports `nvrtcVersion` is taken. The outcome, success or error, is decided once per process.
/// Nothing of NVRTC is loaded until this is called: a program that compiles nothing never needs it.
///
/// # Thread safety
///
/// Safe to call from any thread; concurrent first calls load the library once.
pub fn nvrtc() -> Result<&'static Nvrtc, NvrtcLoadError> {
    static NVRTC: OnceLock<Result<Nvrtc, NvrtcLoadError>> = OnceLock::new();
    NVRTC
        .get_or_init(|| search::<Nvrtc>().map_err(|attempts| NvrtcLoadError { attempts }))
        .as_ref()
        .map_err(Clone::clone)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_names_the_variable_and_every_attempt() {
        let err = NvrtcLoadError {
            attempts: vec![
                LoadAttempt {
                    path: "libnvrtc.so.13".into(),
                    reason: "not found".into(),
                },
                LoadAttempt {
                    path: "libnvrtc.so.12".into(),
                    reason: "also not found".into(),
                },
            ],
        };
        let text = err.to_string();
        assert!(text.starts_with("cannot load NVRTC"), "{text}");
        assert!(text.contains(NVRTC_PATH_VAR), "{text}");
        assert!(
            text.contains("libnvrtc.so.13: not found; libnvrtc.so.12: also not found"),
            "{text}"
        );
    }
}
