//! Finding and loading NVRTC, the CUDA run-time compiler: the process-wide table and its error.
//! The search is the driver's ([`RuntimeLibrary`]); only the names and the variable differ.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::Nvrtc;
use crate::loader::{
    Attempts, LoadAttempt, RuntimeLibrary, Searched, load_path, loader_message, search,
};

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

/// The directory of a CUDA toolkit that holds its libraries, below the toolkit's root.
#[cfg(unix)]
const TOOLKIT_LIBRARIES: &str = "lib64";
/// The directory of a CUDA toolkit that holds its libraries, below the toolkit's root.
#[cfg(windows)]
const TOOLKIT_LIBRARIES: &str = "bin";

/// The roots of the CUDA toolkits to look in, in order: `$CUDA_HOME`, `$CUDA_PATH` (where set),
/// and `/usr/local/cuda`, where the toolkit installs itself on Linux.
fn toolkit_roots() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(std::env::var_os)
        .filter(|root| !root.is_empty())
        .map(PathBuf::from)
        .collect();
    if cfg!(unix) {
        roots.push(PathBuf::from("/usr/local/cuda"));
    }
    roots
}

/// NVRTC's libraries that exist in the toolkits at `roots`, each once, in the order of `roots` and
/// then of [`NVRTC_LIBRARY_NAMES`].
fn libraries_under(roots: &[PathBuf]) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = Vec::new();
    for root in roots {
        for name in NVRTC_LIBRARY_NAMES {
            let path = root.join(TOOLKIT_LIBRARIES).join(name);
            if path.is_file() && !paths.contains(&path) {
                paths.push(path);
            }
        }
    }
    paths
}

/// NVRTC could not be loaded: every path tried, with the loader's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "cannot load NVRTC, the CUDA run-time compiler{}: {}",
    .searched.hint(
        NVRTC_PATH_VAR,
        " (install the CUDA toolkit's NVRTC or the nvidia-cuda-nvrtc-cu12 wheel, and set \
         ATLAS_NVRTC_PATH to its libnvrtc if the loader does not find it)"
    ),
    Attempts(.attempts)
)]
#[non_exhaustive]
pub struct NvrtcLoadError {
    /// Every library tried, in order.
    pub attempts: Vec<LoadAttempt>,
    /// Where the paths tried came from.
    pub searched: Searched,
}

impl RuntimeLibrary for Nvrtc {
    const WHAT: &'static str = "NVRTC";
    const PATH_VAR: &'static str = NVRTC_PATH_VAR;
    const NAMES: &'static [&'static str] = NVRTC_LIBRARY_NAMES;

    fn toolkit_paths() -> Vec<PathBuf> {
        libraries_under(&toolkit_roots())
    }

    unsafe fn open(path: &Path) -> Result<Self, String> {
        // SAFETY: the caller vouches for the library (this function's contract).
        let nvrtc = unsafe { Nvrtc::new(path) }.map_err(|e| loader_message(&e, path))?;
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
            searched: Searched::GivenPath,
        })
    }
}

/// The process-wide NVRTC table, loaded on first use and kept until the process exits.
///
/// Search order: the path in `ATLAS_NVRTC_PATH` when it is set (and then nothing else), otherwise
/// [`NVRTC_LIBRARY_NAMES`] through the platform's loader, then those names in the CUDA toolkit's
/// `lib64/` (`$CUDA_HOME`, `$CUDA_PATH`, `/usr/local/cuda`) where they exist
/// ([`RuntimeLibrary::search_paths`]). The first library that loads and exports `nvrtcVersion`
/// is taken. The outcome, success or error, is decided once per process.
/// Nothing of NVRTC is loaded until this is called: a program that compiles nothing never needs it.
///
/// # Thread safety
///
/// Safe to call from any thread; concurrent first calls load the library once.
pub fn nvrtc() -> Result<&'static Nvrtc, NvrtcLoadError> {
    static NVRTC: OnceLock<Result<Nvrtc, NvrtcLoadError>> = OnceLock::new();
    NVRTC
        .get_or_init(|| {
            search::<Nvrtc>().map_err(|(attempts, searched)| NvrtcLoadError { attempts, searched })
        })
        .as_ref()
        .map_err(Clone::clone)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_search_tries_the_loader_first_then_toolkits_that_have_nvrtc() {
        let paths = Nvrtc::search_paths();
        let names: Vec<PathBuf> = NVRTC_LIBRARY_NAMES.iter().map(PathBuf::from).collect();
        assert_eq!(paths[..names.len()], names[..]);
        for path in &paths[names.len()..] {
            assert!(path.is_file(), "{}", path.display());
            assert!(
                toolkit_roots()
                    .iter()
                    .any(|root| path.starts_with(root.join(TOOLKIT_LIBRARIES))),
                "{}",
                path.display()
            );
        }
    }

    #[cfg(unix)]
    #[test]
    fn toolkit_paths_are_the_libraries_that_exist_each_once() {
        let root = std::env::temp_dir().join(format!("atlas-sys-toolkits-{}", std::process::id()));
        let (a, b) = (root.join("a"), root.join("b"));
        for dir in [&a, &b] {
            std::fs::create_dir_all(dir.join("lib64")).unwrap();
        }
        std::fs::write(a.join("lib64/libnvrtc.so.12"), b"").unwrap();
        std::fs::write(b.join("lib64/libnvrtc.so.13"), b"").unwrap();
        std::fs::write(b.join("lib64/libnvrtc.so.12"), b"").unwrap();
        let found = libraries_under(&[root.join("none"), a.clone(), b.clone(), a.clone()]);
        let _ = std::fs::remove_dir_all(&root);
        assert_eq!(
            found,
            [
                a.join("lib64/libnvrtc.so.12"),
                b.join("lib64/libnvrtc.so.13"),
                b.join("lib64/libnvrtc.so.12"),
            ]
        );
    }

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
            searched: Searched::PlatformNames,
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
