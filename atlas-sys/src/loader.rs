//! Finding and loading the libraries Atlas opens at run time (libcuda, NVRTC): one search for
//! both ([`RuntimeLibrary`]), the process-wide driver table, and their errors.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::CudaDriver;

/// The environment variable that names the driver library to load, overriding the search.
pub const LIBCUDA_PATH_VAR: &str = "ATLAS_LIBCUDA_PATH";

/// The names under which the platform's loader finds the CUDA driver, in the order tried.
#[cfg(unix)]
pub const LIBRARY_NAMES: &[&str] = &["libcuda.so.1", "libcuda.so"];
/// The names under which the platform's loader finds the CUDA driver, in the order tried.
#[cfg(windows)]
pub const LIBRARY_NAMES: &[&str] = &["nvcuda.dll"];

/// One library that was tried and why it was not taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadAttempt {
    /// The path or name given to the platform's loader.
    pub path: PathBuf,
    /// The loader's message, or why a library that loaded is not a CUDA driver.
    pub reason: String,
}

/// The CUDA driver library could not be loaded: every path tried, with the loader's message.
///
/// Displayed as one line that names each path once: `cannot load the CUDA driver library (is an
/// NVIDIA driver installed?): libcuda.so.1, libcuda.so: cannot open shared object file: No such
/// file or directory`, or, when `ATLAS_LIBCUDA_PATH` chose the file, `cannot load the CUDA driver
/// library that ATLAS_LIBCUDA_PATH names: /opt/x/libcuda.so: ...`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "cannot load the CUDA driver library{}: {}",
    .searched.hint(LIBCUDA_PATH_VAR, " (is an NVIDIA driver installed?)"),
    Attempts(.attempts)
)]
#[non_exhaustive]
pub struct LoadError {
    /// Every library tried, in order.
    pub attempts: Vec<LoadAttempt>,
    /// Where the paths tried came from.
    pub searched: Searched,
}

/// Where the libraries a [`LoadError`] tried came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Searched {
    /// The path in the library's environment variable (`ATLAS_LIBCUDA_PATH`), alone.
    Override,
    /// The platform's names ([`LIBRARY_NAMES`] for the driver).
    PlatformNames,
    /// The path given to `load_from`.
    GivenPath,
}

impl Searched {
    /// What an error says of the search, before the attempts: the variable `var` that chose the
    /// file, or `advice` after the platform's names.
    pub(crate) fn hint(self, var: &str, advice: &str) -> String {
        match self {
            Self::Override => format!(" that {var} names"),
            Self::PlatformNames => advice.to_string(),
            Self::GivenPath => String::new(),
        }
    }
}

/// The attempts, each path once; paths that failed for the same reason share it
/// (`libcuda.so.1, libcuda.so: cannot open shared object file`).
pub(crate) struct Attempts<'a>(pub(crate) &'a [LoadAttempt]);

impl fmt::Display for Attempts<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, attempt) in self.0.iter().enumerate() {
            let shares_previous = i > 0 && self.0[i - 1].reason == attempt.reason;
            let shares_next = (self.0.get(i + 1)).is_some_and(|next| next.reason == attempt.reason);
            let sep = match (i, shares_previous) {
                (0, _) => "",
                (_, true) => ", ",
                _ => "; ",
            };
            write!(f, "{sep}{}", attempt.path.display())?;
            if !shares_next {
                write!(f, ": {}", attempt.reason)?;
            }
        }
        Ok(())
    }
}

/// A function that the loaded library does not export (an older driver or NVRTC, or a profiler's
/// injection library that forwards only part of the API).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{library} does not export {name}: {message}")]
#[non_exhaustive]
pub struct MissingSymbol {
    /// The C name of the function, as in its header after its version macros (`cuMemAlloc_v2`).
    pub name: &'static str,
    /// The loader's message.
    pub message: String,
    /// The library asked, as [`RuntimeLibrary::WHAT`] names it ("the CUDA driver library").
    pub library: &'static str,
}

/// Returns one entry point of a [`CudaDriver`] as a plain function pointer, or the error naming it.
///
/// Prefer the [`entry!`](crate::entry) macro, which passes the field and its name together (and
/// works for [`Nvrtc`](crate::Nvrtc) too).
pub fn resolve<F: Copy>(
    slot: &Result<F, libloading::Error>,
    name: &'static str,
) -> Result<F, MissingSymbol> {
    resolve_named(CudaDriver::WHAT, slot, name)
}

/// What [`entry!`](crate::entry) calls: the entry point in `slot`, or the error naming it and
/// `library`.
#[doc(hidden)]
pub fn resolve_named<F: Copy>(
    library: &'static str,
    slot: &Result<F, libloading::Error>,
    name: &'static str,
) -> Result<F, MissingSymbol> {
    match slot {
        Ok(f) => Ok(*f),
        Err(e) => Err(MissingSymbol {
            name,
            message: e.to_string(),
            library,
        }),
    }
}

/// `entry!(library, name)`: the entry point `name` of a [`CudaDriver`] (or an
/// [`Nvrtc`](crate::Nvrtc)) as a function pointer, or a [`MissingSymbol`] naming `name` and the
/// library. Never panics.
///
/// ```no_run
/// let cuda = atlas_sys::driver()?;
/// let version = atlas_sys::entry!(cuda, cuDriverGetVersion)?;
/// let mut v = 0;
/// // SAFETY: the pointer is to a live, writable c_int.
/// let status = unsafe { version(&mut v) };
/// assert_eq!(status, atlas_sys::CUresult::CUDA_SUCCESS);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[macro_export]
macro_rules! entry {
    ($library:expr, $name:ident) => {{
        use $crate::RuntimeLibrary as _;
        let library = &$library;
        $crate::resolve_named(library.what(), &library.$name, ::core::stringify!($name))
    }};
}

impl CudaDriver {
    /// Loads the driver library at `path` (a path, or a bare name for the platform's search).
    ///
    /// The library must export `cuInit`; one that does not is rejected as not a CUDA driver. Other
    /// missing functions do not fail the load (see [`entry!`](crate::entry)).
    ///
    /// # Safety
    ///
    /// 1. Loading a library runs its initialisation code: `path` must name a library that is sound
    ///    to load into this process (a CUDA driver, or a library standing in for one).
    /// 2. Each entry point is typed after `cuda.h`: the library's functions of those names must have
    ///    those signatures.
    #[doc(alias = "dlopen")]
    pub unsafe fn load_from(path: impl AsRef<Path>) -> Result<CudaDriver, LoadError> {
        // SAFETY: the caller's duties 1 and 2 are this function's own.
        unsafe { load_path(path.as_ref()) }.map_err(|attempt| LoadError {
            attempts: vec![attempt],
            searched: Searched::GivenPath,
        })
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for crate::CudaDriver {}
    impl Sealed for crate::Nvrtc {}
}

/// A library Atlas opens at run time instead of linking it: [`CudaDriver`] and
/// [`Nvrtc`](crate::Nvrtc). Both are found the same way: the path in the environment
/// variable [`PATH_VAR`](Self::PATH_VAR) alone when it is set, else each of
/// [`search_paths`](Self::search_paths) (the [`NAMES`](Self::NAMES) through the platform's
/// loader, then [`toolkit_paths`](Self::toolkit_paths)); the first that loads and exports the
/// library's marker function is taken.
pub trait RuntimeLibrary: Sized + sealed::Sealed {
    /// What the library is, as errors name it ("the CUDA driver library", "NVRTC").
    const WHAT: &'static str;
    /// The environment variable that names the library to load, replacing the search.
    const PATH_VAR: &'static str;
    /// The names given to the platform's loader, in the order tried.
    const NAMES: &'static [&'static str];

    /// Loads the library at `path` and checks that it is this library. The `Err` is the reason,
    /// for a [`LoadAttempt`].
    ///
    /// # Safety
    ///
    /// 1. Loading a library runs its initialisation code: `path` must name a library that is sound
    ///    to load into this process (this library, or one standing in for it).
    /// 2. Each entry point is typed after the library's header: the library's functions of those
    ///    names must have those signatures.
    unsafe fn open(path: &Path) -> Result<Self, String>;

    /// The copies of the library in the CUDA toolkit that exist on this machine, tried after
    /// [`NAMES`](Self::NAMES): a toolkit's `lib64/` is often not where the platform's loader
    /// looks. None for the driver, which the toolkit does not ship (only a stub of it); for NVRTC,
    /// its names in `$CUDA_HOME/lib64`, `$CUDA_PATH/lib64` and `/usr/local/cuda/lib64`
    /// (`%CUDA_PATH%\bin` on Windows).
    fn toolkit_paths() -> Vec<PathBuf> {
        Vec::new()
    }

    /// The libraries the search tries when [`PATH_VAR`](Self::PATH_VAR) is not set, in order:
    /// [`NAMES`](Self::NAMES), then [`toolkit_paths`](Self::toolkit_paths).
    fn search_paths() -> Vec<PathBuf> {
        Self::NAMES
            .iter()
            .map(PathBuf::from)
            .chain(Self::toolkit_paths())
            .collect()
    }

    /// [`WHAT`](Self::WHAT), through a value (what [`entry!`](crate::entry) asks).
    fn what(&self) -> &'static str {
        Self::WHAT
    }
}

impl RuntimeLibrary for CudaDriver {
    const WHAT: &'static str = "the CUDA driver library";
    const PATH_VAR: &'static str = LIBCUDA_PATH_VAR;
    const NAMES: &'static [&'static str] = LIBRARY_NAMES;

    unsafe fn open(path: &Path) -> Result<Self, String> {
        // SAFETY: the caller vouches for the library (this function's contract).
        let driver = unsafe { CudaDriver::new(path) }.map_err(|e| loader_message(&e, path))?;
        if let Err(e) = &driver.cuInit {
            return Err(format!(
                "loaded, but it is not a CUDA driver library (no cuInit: {e})"
            ));
        }
        Ok(driver)
    }
}

/// The platform loader's message for `path`, without the path it starts with (the attempt names
/// it).
pub(crate) fn loader_message(e: &libloading::Error, path: &Path) -> String {
    let message = e.to_string();
    let named = format!("{}: ", path.display());
    message
        .strip_prefix(&named)
        .map_or_else(|| message.clone(), str::to_string)
}

/// Loads `path` as an `L` (see [`RuntimeLibrary::open`]); its failure as a [`LoadAttempt`].
///
/// # Safety
///
/// As [`RuntimeLibrary::open`].
pub(crate) unsafe fn load_path<L: RuntimeLibrary>(path: &Path) -> Result<L, LoadAttempt> {
    // SAFETY: the caller's duties are `open`'s.
    unsafe { L::open(path) }.map_err(|reason| LoadAttempt {
        path: path.to_path_buf(),
        reason,
    })
}

/// The libraries to try, in order: the environment's override alone when it is set and not empty,
/// else `search_paths`.
fn candidates(env: Option<OsString>, search_paths: Vec<PathBuf>) -> (Vec<PathBuf>, Searched) {
    match env {
        Some(path) if !path.is_empty() => (vec![PathBuf::from(path)], Searched::Override),
        _ => (search_paths, Searched::PlatformNames),
    }
}

/// Finds and loads `L`: the path in [`L::PATH_VAR`](RuntimeLibrary::PATH_VAR) when it is set (and
/// then nothing else: an explicit choice is never silently replaced by another library), otherwise
/// each of [`L::search_paths`](RuntimeLibrary::search_paths). The first library that loads and is
/// an `L` is taken; the error lists every attempt, in order.
pub(crate) fn search<L: RuntimeLibrary>() -> Result<L, (Vec<LoadAttempt>, Searched)> {
    search_in(std::env::var_os(L::PATH_VAR))
}

/// [`search`], with the environment variable's value given.
fn search_in<L: RuntimeLibrary>(env: Option<OsString>) -> Result<L, (Vec<LoadAttempt>, Searched)> {
    let (paths, searched) = candidates(env, L::search_paths());
    let mut attempts = Vec::new();
    for path in paths {
        // SAFETY: these are the library's own names, or the path the user named for it in its
        // environment variable; the library is kept loaded for the life of the value.
        match unsafe { load_path::<L>(&path) } {
            Ok(library) => return Ok(library),
            Err(attempt) => attempts.push(attempt),
        }
    }
    Err((attempts, searched))
}

/// The process-wide driver table, loaded on first use and kept until the process exits.
///
/// Search order: the path in `ATLAS_LIBCUDA_PATH` when it is set (and then nothing else: an
/// explicit choice is never silently replaced by another driver), otherwise [`LIBRARY_NAMES`]
/// through the platform's loader (`libcuda.so.1`, then `libcuda.so`; `nvcuda.dll` on Windows).
/// The first library that loads and exports `cuInit` is taken. The outcome, success or error, is
/// decided once per process.
///
/// # Thread safety
///
/// Safe to call from any thread; concurrent first calls load the library once.
pub fn driver() -> Result<&'static CudaDriver, LoadError> {
    static DRIVER: OnceLock<Result<CudaDriver, LoadError>> = OnceLock::new();
    DRIVER
        .get_or_init(|| {
            search::<CudaDriver>().map_err(|(attempts, searched)| LoadError { attempts, searched })
        })
        .as_ref()
        .map_err(Clone::clone)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn override_replaces_the_search() {
        let defaults: Vec<PathBuf> = LIBRARY_NAMES.iter().map(PathBuf::from).collect();
        assert_eq!(
            CudaDriver::search_paths(),
            defaults,
            "the toolkit has no driver"
        );
        assert_eq!(
            candidates(Some("/opt/x/libcuda.so".into()), defaults.clone()),
            (vec![PathBuf::from("/opt/x/libcuda.so")], Searched::Override)
        );
        assert_eq!(
            candidates(None, defaults.clone()),
            (defaults.clone(), Searched::PlatformNames)
        );
        assert_eq!(
            candidates(Some(OsString::new()), defaults.clone()),
            (defaults, Searched::PlatformNames)
        );
    }

    fn attempt(path: &str, reason: &str) -> LoadAttempt {
        LoadAttempt {
            path: path.into(),
            reason: reason.into(),
        }
    }

    #[test]
    fn error_lists_every_attempt_naming_each_path_once() {
        let err = LoadError {
            attempts: vec![
                attempt("libcuda.so.1", "not found"),
                attempt("libcuda.so", "also not found"),
            ],
            searched: Searched::PlatformNames,
        };
        assert_eq!(
            err.to_string(),
            "cannot load the CUDA driver library (is an NVIDIA driver installed?): \
             libcuda.so.1: not found; libcuda.so: also not found"
        );
        let same = LoadError {
            attempts: vec![
                attempt("libcuda.so.1", "cannot open shared object file"),
                attempt("libcuda.so", "cannot open shared object file"),
            ],
            searched: Searched::PlatformNames,
        };
        assert_eq!(
            same.to_string(),
            "cannot load the CUDA driver library (is an NVIDIA driver installed?): \
             libcuda.so.1, libcuda.so: cannot open shared object file"
        );
    }

    #[test]
    fn a_missing_override_is_one_short_line_naming_the_variable_and_the_path_once() {
        let path = "/nonexistent/atlas/libcuda.so";
        let (attempts, searched) = search_in::<CudaDriver>(Some(path.into()))
            .err()
            .expect("no such file");
        assert_eq!(searched, Searched::Override);
        let err = LoadError { attempts, searched };
        let text = err.to_string();
        assert_eq!(text.matches(path).count(), 1, "{text}");
        assert!(
            text.starts_with(
                "cannot load the CUDA driver library that ATLAS_LIBCUDA_PATH names: \
                 /nonexistent/atlas/libcuda.so: "
            ),
            "{text}"
        );
        assert!(!text.contains("NVIDIA driver installed"), "{text}");
        assert!(!text.contains('\n') && text.len() < 160, "{text}");
    }
}
