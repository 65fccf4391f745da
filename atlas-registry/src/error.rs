//! [`AtlasError`] and the classification of CUDA status codes.

use std::ffi::{CStr, c_char};

use atlas_sys::{CUresult, LoadError, MissingSymbol};

/// `CUDA_ERROR_DEINITIALIZED`: the driver is shutting down (seen from destructors at process exit).
pub const CUDA_ERROR_DEINITIALIZED: u32 = 4;
/// `CUDA_ERROR_INVALID_CONTEXT`: the context is gone (teardown order at process exit).
const CUDA_ERROR_INVALID_CONTEXT: u32 = 201;
/// `CUDA_ERROR_CONTEXT_IS_DESTROYED`.
const CUDA_ERROR_CONTEXT_IS_DESTROYED: u32 = 709;

/// True for the codes a cleanup call gets when the driver or the context is already being torn
/// down (4, 201, 709): the resource is gone with it, and there is nothing to report.
pub fn is_teardown_noop(code: u32) -> bool {
    matches!(
        code,
        CUDA_ERROR_DEINITIALIZED | CUDA_ERROR_INVALID_CONTEXT | CUDA_ERROR_CONTEXT_IS_DESTROYED
    )
}

/// True for the codes after which the context cannot be used again: the kernel faulted, trapped
/// or timed out, and every later call in this context fails.
pub(crate) fn is_sticky(code: u32) -> bool {
    // 700 illegal address, 702 launch timeout, 714 hardware stack error, 715 illegal instruction,
    // 716 misaligned address, 717 invalid address space, 718 invalid pc, 719 launch failed
    // (traps included). Not 999 (unknown): the driver also answers a malformed image with it and
    // the context is fine afterwards.
    matches!(code, 700 | 702 | 714..=719)
}

/// `"NAME (code): description"` for a CUDA status code, from `cuGetErrorName` and
/// `cuGetErrorString`.
///
/// Falls back to `CUDA_UNKNOWN` and `(no message)` when the driver does not know the code or cannot
/// be loaded at all, so it is always safe to call.
#[doc(alias = "cuGetErrorName")]
#[doc(alias = "cuGetErrorString")]
pub fn cuda_error_text(code: u32) -> String {
    let (name, description) = match atlas_sys::driver() {
        Ok(cuda) => (
            atlas_sys::entry!(cuda, cuGetErrorName)
                .ok()
                .and_then(|f| driver_string(f, code)),
            atlas_sys::entry!(cuda, cuGetErrorString)
                .ok()
                .and_then(|f| driver_string(f, code)),
        ),
        Err(_) => (None, None),
    };
    format!(
        "{} ({code}): {}",
        name.as_deref().unwrap_or("CUDA_UNKNOWN"),
        description.as_deref().unwrap_or("(no message)")
    )
}

type StringFn = unsafe extern "C" fn(CUresult, *mut *const c_char) -> CUresult;

fn driver_string(f: StringFn, code: u32) -> Option<String> {
    let mut text: *const c_char = std::ptr::null();
    // SAFETY: cuGetErrorName/String take any code and write a pointer to a static string, or
    // return an error and leave it alone; `text` is a live out-pointer.
    let status = unsafe { f(CUresult(code), &mut text) };
    if status != CUresult::CUDA_SUCCESS || text.is_null() {
        return None;
    }
    // SAFETY: on success the driver points `text` at a NUL-terminated string that it owns forever.
    Some(
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned(),
    )
}

/// Which kind of name was not found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NotFoundKind {
    /// A module name not in the registry.
    Module,
    /// A kernel (`__global__` function) not in its module.
    Function,
    /// A `__device__` variable not in its module.
    Symbol,
}

impl std::fmt::Display for NotFoundKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Module => "module",
            Self::Function => "function",
            Self::Symbol => "device symbol",
        })
    }
}

/// Everything that can go wrong in Atlas. Each variant says what was being done and names the
/// module, function, symbol or call involved; driver failures carry `"NAME (code): description"`.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum AtlasError {
    /// The CUDA driver library cannot be loaded (no NVIDIA driver, or a wrong `ATLAS_LIBCUDA_PATH`).
    #[error(transparent)]
    DriverUnavailable(#[from] LoadError),
    /// The driver library lacks an entry point that this operation needs (an older driver).
    #[error(transparent)]
    MissingSymbol(#[from] MissingSymbol),
    /// A driver call failed.
    #[error("{call} failed{}: {text}", on(.subject))]
    Driver {
        /// The C name of the call (`cuMemAlloc_v2`).
        call: &'static str,
        /// What the call was about (a module, a size, a device), or empty.
        subject: String,
        /// The CUDA status code.
        code: u32,
        /// `"NAME (code): description"`.
        text: String,
    },
    /// A kernel faulted, trapped or timed out earlier, and the device's context is lost for good:
    /// every later call on it fails. The process must exit and start again to use the device.
    #[error(
        "{call} failed{}: {text}. The CUDA context of this device is lost (a kernel faulted, \
         trapped or timed out); no further work can run on it in this process: exit and restart \
         the process",
        on(.subject)
    )]
    ContextLost {
        /// The C name of the call that reported it (often not the call that caused it).
        call: &'static str,
        /// What the call was about, or empty.
        subject: String,
        /// The CUDA status code (700, 702 or 714–719).
        code: u32,
        /// `"NAME (code): description"`.
        text: String,
    },
    /// A module could not be loaded; for PTX, `jit_log` is the JIT compiler's error log.
    #[error("loading module `{module}` failed: {text}{}", log(.jit_log))]
    ModuleLoad {
        /// The module's name in its model.
        module: String,
        /// The CUDA status code.
        code: u32,
        /// `"NAME (code): description"`.
        text: String,
        /// What the JIT compiler wrote to its error log (empty for binaries, or when it said nothing).
        jit_log: String,
    },
    /// A blob or module name was rejected before reaching the driver.
    #[error("module `{module}`: {reason}")]
    InvalidModule {
        /// The module's name (escaped if it is not printable).
        module: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A kernel launch failed in the driver.
    #[error(
        "launching `{function}` (grid {grid:?}, block {block:?}, {shared_mem} B dynamic shared memory) failed: {text}"
    )]
    Launch {
        /// `module::function`, or the raw handle when Atlas does not know its name.
        function: String,
        /// Grid dimensions.
        grid: (u32, u32, u32),
        /// Block dimensions.
        block: (u32, u32, u32),
        /// Dynamic shared memory in bytes.
        shared_mem: u32,
        /// The CUDA status code.
        code: u32,
        /// `"NAME (code): description"`.
        text: String,
    },
    /// A launch was refused before reaching the driver: its configuration breaks a device limit, or
    /// its arguments do not match the kernel's parameters.
    #[error("cannot launch `{function}`: {reason}")]
    InvalidLaunch {
        /// `module::function`, or the raw handle when Atlas does not know its name.
        function: String,
        /// Which limit or parameter, with the expected and given values.
        reason: String,
    },
    /// A module, function or symbol name that does not exist.
    #[error("{kind} `{name}` not found{}", on(.detail))]
    NotFound {
        /// What kind of name.
        kind: NotFoundKind,
        /// The name, as `module` or `module::name`.
        name: String,
        /// What was searched (the registry's modules), or empty.
        detail: String,
    },
    /// A device ordinal out of range.
    #[error("CUDA device {ordinal} does not exist: this machine has {count} device(s)")]
    InvalidDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// How many devices the driver reports.
        count: usize,
    },
    /// An explicit release while other handles still use the resource; nothing was released.
    #[error("cannot release {what}: {handles} other handle(s) still use it; nothing was unloaded")]
    InUse {
        /// What was to be released.
        what: String,
        /// How many other handles hold it.
        handles: usize,
    },
    /// Sizes that must agree do not (a host slice and a device buffer, a value and a symbol).
    #[error("{what}: expected {expected} bytes, got {given}")]
    SizeMismatch {
        /// What was being done.
        what: String,
        /// Bytes expected.
        expected: usize,
        /// Bytes given.
        given: usize,
    },
    /// Unloads that failed during an explicit release (each one listed).
    #[error("releasing the registry: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Release(Vec<AtlasError>),
}

fn on(subject: &str) -> String {
    if subject.is_empty() {
        String::new()
    } else {
        format!(" ({subject})")
    }
}

fn log(jit_log: &str) -> String {
    if jit_log.is_empty() {
        String::new()
    } else {
        format!("\nJIT log:\n{}", jit_log.trim_end())
    }
}

impl AtlasError {
    /// The CUDA status code when the error came from the driver.
    pub fn cuda_code(&self) -> Option<u32> {
        match self {
            Self::Driver { code, .. }
            | Self::ContextLost { code, .. }
            | Self::ModuleLoad { code, .. }
            | Self::Launch { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// True when the device's context is lost and the process must restart to use it again.
    pub fn is_context_lost(&self) -> bool {
        matches!(self, Self::ContextLost { .. })
    }

    /// The error for a failed driver call: [`AtlasError::ContextLost`] for sticky codes, else
    /// [`AtlasError::Driver`].
    pub(crate) fn from_call(call: &'static str, subject: String, code: u32) -> Self {
        let text = cuda_error_text(code);
        if is_sticky(code) {
            Self::ContextLost {
                call,
                subject,
                code,
                text,
            }
        } else {
            Self::Driver {
                call,
                subject,
                code,
                text,
            }
        }
    }
}

/// Reports a failed cleanup from a `Drop`, where there is no caller to return it to: teardown
/// no-ops (the driver or context is already gone) and cleanups in a lost context (already reported
/// to the calls that found it) are silent; anything else goes to stderr once.
pub(crate) fn report_cleanup(what: &str, result: Result<()>) {
    if let Err(e) = result
        && !e.cuda_code().is_some_and(is_teardown_noop)
        && !e.is_context_lost()
    {
        eprintln!("atlas: {what}: {e}");
    }
}

/// `Result` with [`AtlasError`].
pub type Result<T, E = AtlasError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn teardown_codes_are_exactly_4_201_709() {
        for code in 0..1000 {
            assert_eq!(
                is_teardown_noop(code),
                matches!(code, 4 | 201 | 709),
                "{code}"
            );
        }
        assert_eq!(CUDA_ERROR_DEINITIALIZED, 4);
    }

    #[test]
    fn error_text_has_name_code_and_description_shape() {
        // Without a driver (CI) the fallbacks appear; with one, real names do. Both have the shape.
        let text = cuda_error_text(2);
        let (name, rest) = text.split_once(" (2): ").expect("NAME (code): description");
        assert!(!name.is_empty() && !rest.is_empty(), "{text}");
        if atlas_sys::driver().is_err() {
            assert_eq!(text, "CUDA_UNKNOWN (2): (no message)");
        }
    }

    #[test]
    fn sticky_codes_make_context_lost_errors() {
        let lost = AtlasError::from_call("cuStreamSynchronize", String::new(), 700);
        assert!(matches!(lost, AtlasError::ContextLost { code: 700, .. }));
        assert!(lost.is_context_lost());
        let text = lost.to_string();
        assert!(
            text.contains("cuStreamSynchronize failed") && text.contains("restart"),
            "{text}"
        );
        let plain = AtlasError::from_call("cuMemAlloc_v2", "4096 bytes".into(), 2);
        assert!(matches!(plain, AtlasError::Driver { code: 2, .. }));
        assert!(
            plain
                .to_string()
                .starts_with("cuMemAlloc_v2 failed (4096 bytes): "),
            "{plain}"
        );
        assert!(!plain.is_context_lost());
    }

    #[test]
    fn module_load_error_shows_the_jit_log() {
        let e = AtlasError::ModuleLoad {
            module: "bad".into(),
            code: 218,
            text: "CUDA_ERROR_INVALID_PTX (218): a PTX JIT compilation failed".into(),
            jit_log: "ptxas application ptx input, line 7; error   : syntax error\n".into(),
        };
        let text = e.to_string();
        assert!(
            text.contains("module `bad`") && text.contains("line 7; error"),
            "{text}"
        );
    }
}
