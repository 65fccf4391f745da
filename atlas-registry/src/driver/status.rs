//! CUDA status codes: what they mean to Atlas (teardown, a lost context), their names, and a failed
//! call as data ([`DriverFailure`]), whose text is built only when it is displayed.

use std::ffi::{CStr, c_char};
use std::fmt;

use atlas_sys::CUresult;

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

/// A driver call that failed: which call, what it was about, and the status code. The status's
/// name and description are looked up only when the failure is displayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverFailure {
    /// The C name of the call (`cuMemAlloc_v2`).
    pub call: &'static str,
    /// What the call was about (a module, a size, a device), or empty.
    pub subject: String,
    /// The CUDA status code.
    pub code: u32,
}

impl DriverFailure {
    /// `"NAME (code): description"` of the status (see [`cuda_error_text`]).
    pub fn text(&self) -> String {
        cuda_error_text(self.code)
    }

    /// Whether the status means the context is lost for good (a kernel faulted or trapped).
    pub fn is_sticky(&self) -> bool {
        is_sticky(self.code)
    }
}

impl fmt::Display for DriverFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed", self.call)?;
        if !self.subject.is_empty() {
            write!(f, " ({})", self.subject)?;
        }
        write!(f, ": {}", self.text())
    }
}

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
    fn a_failure_names_its_call_and_subject() {
        let failure = DriverFailure {
            call: "cuMemAlloc_v2",
            subject: "4096 bytes".into(),
            code: 2,
        };
        assert!(
            failure
                .to_string()
                .starts_with("cuMemAlloc_v2 failed (4096 bytes): "),
            "{failure}"
        );
        let bare = DriverFailure {
            subject: String::new(),
            ..failure
        };
        assert!(
            bare.to_string().starts_with("cuMemAlloc_v2 failed: "),
            "{bare}"
        );
    }
}
