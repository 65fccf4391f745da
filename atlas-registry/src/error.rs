//! [`AtlasError`] and the classification of CUDA status codes.

use std::ffi::{CStr, c_char};

use atlas_sys::{CUresult, LoadError, MissingSymbol};

/// `CUDA_ERROR_DEINITIALIZED`: the driver is shutting down (seen from destructors at process exit).
pub const CUDA_ERROR_DEINITIALIZED: u32 = CUresult::CUDA_ERROR_DEINITIALIZED.0;

/// True for the codes a cleanup call gets when the driver or the context is already being torn
/// down (`CUDA_ERROR_DEINITIALIZED`, `CUDA_ERROR_INVALID_CONTEXT`, `CUDA_ERROR_CONTEXT_IS_DESTROYED`):
/// the resource is gone with it, and there is nothing to report.
pub fn is_teardown_noop(code: u32) -> bool {
    matches!(
        CUresult(code),
        CUresult::CUDA_ERROR_DEINITIALIZED
            | CUresult::CUDA_ERROR_INVALID_CONTEXT
            | CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED
    )
}

/// True for the codes after which the context cannot be used again: a kernel faulted, trapped,
/// failed a device-side assertion or timed out, and every later call in this context fails.
///
/// Not `CUDA_ERROR_UNKNOWN`: the driver also answers a malformed image with it and the context is
/// fine afterwards.
pub(crate) fn is_sticky(code: u32) -> bool {
    matches!(
        CUresult(code),
        CUresult::CUDA_ERROR_ILLEGAL_ADDRESS
            | CUresult::CUDA_ERROR_LAUNCH_TIMEOUT
            | CUresult::CUDA_ERROR_ASSERT
            | CUresult::CUDA_ERROR_HARDWARE_STACK_ERROR
            | CUresult::CUDA_ERROR_ILLEGAL_INSTRUCTION
            | CUresult::CUDA_ERROR_MISALIGNED_ADDRESS
            | CUresult::CUDA_ERROR_INVALID_ADDRESS_SPACE
            | CUresult::CUDA_ERROR_INVALID_PC
            | CUresult::CUDA_ERROR_LAUNCH_FAILED
    )
}

/// The names of the codes Atlas meets most, for when the driver cannot name them itself (it is not
/// loaded, or it is being torn down and `cuGetErrorName` fails).
macro_rules! known_names {
    ($($name:ident),* $(,)?) => {
        fn known_name(code: u32) -> Option<&'static str> {
            match CUresult(code) {
                $(CUresult::$name => Some(stringify!($name)),)*
                _ => None,
            }
        }
    };
}
known_names!(
    CUDA_SUCCESS,
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_OUT_OF_MEMORY,
    CUDA_ERROR_NOT_INITIALIZED,
    CUDA_ERROR_DEINITIALIZED,
    CUDA_ERROR_NO_DEVICE,
    CUDA_ERROR_INVALID_DEVICE,
    CUDA_ERROR_INVALID_IMAGE,
    CUDA_ERROR_INVALID_CONTEXT,
    CUDA_ERROR_NO_BINARY_FOR_GPU,
    CUDA_ERROR_INVALID_PTX,
    CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
    CUDA_ERROR_JIT_COMPILER_NOT_FOUND,
    CUDA_ERROR_INVALID_HANDLE,
    CUDA_ERROR_NOT_FOUND,
    CUDA_ERROR_NOT_READY,
    CUDA_ERROR_ILLEGAL_ADDRESS,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
    CUDA_ERROR_LAUNCH_TIMEOUT,
    CUDA_ERROR_CONTEXT_IS_DESTROYED,
    CUDA_ERROR_ASSERT,
    CUDA_ERROR_HARDWARE_STACK_ERROR,
    CUDA_ERROR_ILLEGAL_INSTRUCTION,
    CUDA_ERROR_MISALIGNED_ADDRESS,
    CUDA_ERROR_INVALID_ADDRESS_SPACE,
    CUDA_ERROR_INVALID_PC,
    CUDA_ERROR_LAUNCH_FAILED,
    CUDA_ERROR_NOT_PERMITTED,
    CUDA_ERROR_NOT_SUPPORTED,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
    CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
    CUDA_ERROR_UNKNOWN,
);

/// `"NAME (code): description"` for a CUDA status code, from `cuGetErrorName` and
/// `cuGetErrorString`.
///
/// When the driver cannot name the code (it is not loaded, or it is being torn down), the common
/// codes are still named from Atlas's own table; others read `CUDA_UNKNOWN`, and the description
/// `(no message)`. Always safe to call.
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
        name.as_deref()
            .or(known_name(code))
            .unwrap_or("CUDA_UNKNOWN"),
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
    /// A module holds no code the device can run (`CUDA_ERROR_NO_BINARY_FOR_GPU`): a cubin or
    /// fatbin built for other architectures only.
    #[error(
        "module `{module}` has no code that device {device} ({arch}) can run: it holds {holds}; \
         load a cubin built for {arch}, or PTX"
    )]
    NoBinaryForDevice {
        /// The module's name in its model.
        module: String,
        /// What the blob holds (`sm_80 SASS`, `compute_75 PTX, sm_80 SASS`).
        holds: String,
        /// The device's ordinal.
        device: usize,
        /// The device's architecture (`sm_90`).
        arch: String,
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
    /// A launch was refused before reaching the driver because its stream or one of its buffers
    /// belongs to another device's context than the function: run there, the kernel would fault and
    /// take that device's context with it.
    #[error("cannot launch `{function}` on device {expected}: {what} belongs to {}", device(*.given))]
    WrongDevice {
        /// `module::function`.
        function: String,
        /// What is foreign: `the stream` or `argument N`.
        what: String,
        /// The device the function is loaded on.
        expected: usize,
        /// The device `what` belongs to, or `None` for a context Atlas does not manage.
        given: Option<usize>,
    },
    /// A typed launch was refused because nothing can tell the kernel's parameter layout: the driver
    /// lacks `cuFuncGetParamInfo` (older than CUDA 12.4, or a profiler's injection library) and the
    /// module's blob does not declare it in a form Atlas reads.
    #[error(
        "cannot check the arguments of `{function}`: {reason}; launch it through \
         `AtlasRegistry::launch_on_stream` (unchecked, `unsafe`) if you know its parameters"
    )]
    ParamsUnknown {
        /// `module::function`.
        function: String,
        /// Why neither the driver nor the blob can tell.
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

fn device(ordinal: Option<usize>) -> String {
    match ordinal {
        Some(ordinal) => format!("device {ordinal}"),
        None => "a context Atlas does not manage".into(),
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
    fn sticky_codes_are_the_kernel_faults_and_asserts() {
        // From cuda.h: 700 illegal address, 702 launch timeout, 710 device-side assert,
        // 714 hardware stack error, 715 illegal instruction, 716 misaligned address,
        // 717 invalid address space, 718 invalid pc, 719 launch failed.
        for code in 0..1000 {
            assert_eq!(
                is_sticky(code),
                matches!(code, 700 | 702 | 710 | 714..=719),
                "{code}"
            );
        }
        assert!(AtlasError::from_call("cuStreamSynchronize", String::new(), 710).is_context_lost());
    }

    #[test]
    fn common_codes_are_named_without_the_driver() {
        if atlas_sys::driver().is_ok() {
            return; // the driver names them itself; covered by the shape test
        }
        assert!(cuda_error_text(4).starts_with("CUDA_ERROR_DEINITIALIZED (4): "));
        assert!(cuda_error_text(710).starts_with("CUDA_ERROR_ASSERT (710): "));
        assert!(cuda_error_text(218).starts_with("CUDA_ERROR_INVALID_PTX (218): "));
        assert!(cuda_error_text(123_456).starts_with("CUDA_UNKNOWN (123456): "));
    }

    #[test]
    fn error_text_has_name_code_and_description_shape() {
        // Without a driver (CI) the fallbacks appear; with one, real names do. Both have the shape.
        let text = cuda_error_text(2);
        let (name, rest) = text.split_once(" (2): ").expect("NAME (code): description");
        assert!(!name.is_empty() && !rest.is_empty(), "{text}");
        if atlas_sys::driver().is_err() {
            assert_eq!(text, "CUDA_ERROR_OUT_OF_MEMORY (2): (no message)");
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
