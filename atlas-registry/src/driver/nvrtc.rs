//! NVRTC, the CUDA run-time compiler, as the driver tier holds the driver: the only code of Atlas
//! that names an NVRTC entry point. It loads NVRTC once per process (through `atlas-sys`, by the
//! driver's own search), asks its version and the architectures it compiles for, and runs one
//! compilation ([`compile_program`]): a program made, compiled and read, and destroyed on every
//! path. Like the driver tier it depends on nothing else in Atlas; its errors ([`Error`]) become
//! [`AtlasError`](crate::AtlasError)s at the `?` of the calling code.

use std::ffi::{CStr, CString, c_char};
use std::fmt;
use std::sync::OnceLock;

use atlas_sys::{MissingSymbol, Nvrtc, NvrtcLoadError, nvrtcProgram, nvrtcResult};

/// Why an NVRTC call did not succeed.
#[derive(Debug, Clone)]
pub(crate) enum Error {
    /// NVRTC cannot be loaded.
    Unavailable(NvrtcLoadError),
    /// NVRTC lacks the entry point.
    Missing(MissingSymbol),
    /// The call returned a status other than success.
    Failed(NvrtcFailure),
}

impl From<MissingSymbol> for Error {
    fn from(e: MissingSymbol) -> Self {
        Self::Missing(e)
    }
}

/// `Result` of the NVRTC tier.
pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

/// A failed NVRTC call, as data; its text is built when it is displayed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NvrtcFailure {
    /// The NVRTC function that failed (`nvrtcCreateProgram`).
    pub call: &'static str,
    /// What the call was about (`module \`gemm\``), or empty.
    pub subject: String,
    /// The `nvrtcResult` status code.
    pub code: u32,
}

impl fmt::Display for NvrtcFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed", self.call)?;
        if !self.subject.is_empty() {
            write!(f, " ({})", self.subject)?;
        }
        write!(f, ": {}", nvrtc_error_text(self.code))
    }
}

/// `NVRTC_ERROR_NAME (code)`, as NVRTC names the status when it is loaded (this never loads it).
pub fn nvrtc_error_text(code: u32) -> String {
    let named = LOADED.get().and_then(|loaded| {
        let nvrtc = loaded.as_ref().ok()?;
        let get = atlas_sys::entry!(nvrtc.table, nvrtcGetErrorString).ok()?;
        // SAFETY: nvrtcGetErrorString takes any status by value and returns a static string (or
        // null, checked below).
        let text = unsafe { get(nvrtcResult(code)) };
        if text.is_null() {
            return None;
        }
        // SAFETY: a non-null result is a NUL-terminated static string of NVRTC's.
        Some(
            unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned(),
        )
    });
    match named {
        Some(name) => format!("{name} ({code})"),
        None => format!("NVRTC status {code}"),
    }
}

/// NVRTC, loaded, with what Atlas asks of it once.
pub(crate) struct Loaded {
    table: &'static Nvrtc,
    /// `nvrtcVersion`: (major, minor).
    pub(crate) version: (u32, u32),
    /// `nvrtcGetSupportedArchs`: the architectures it makes SASS for, as `10 * major + minor`,
    /// ascending.
    pub(crate) archs: Vec<u32>,
}

/// `call!(nvrtc, nvrtcName(args...))`: resolves `nvrtcName`, calls it, and turns a status other
/// than success into an [`Error::Failed`] (its subject empty). Inside an `unsafe` block: the
/// arguments are the caller's to get right.
macro_rules! call {
    ($nvrtc:expr, $name:ident($($arg:expr),* $(,)?)) => {{
        let f = atlas_sys::entry!($nvrtc.table, $name)?;
        check(f($($arg),*), stringify!($name))
    }};
}

fn check(status: nvrtcResult, call: &'static str) -> Result<()> {
    if status == nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(failed(call, status, String::new()))
    }
}

#[cold]
fn failed(call: &'static str, status: nvrtcResult, subject: String) -> Error {
    Error::Failed(NvrtcFailure {
        call,
        subject,
        code: status.0,
    })
}

/// NVRTC, loaded on first use (see [`atlas_sys::nvrtc`] for the search), with its version and
/// architectures; the outcome is decided once per process.
pub(crate) fn loaded() -> Result<&'static Loaded> {
    LOADED.get_or_init(load).as_ref().map_err(Clone::clone)
}

/// NVRTC once [`loaded`] has been asked for it.
static LOADED: OnceLock<Result<Loaded>> = OnceLock::new();

fn load() -> Result<Loaded> {
    let table = atlas_sys::nvrtc().map_err(Error::Unavailable)?;
    let mut nvrtc = Loaded {
        table,
        version: (0, 0),
        archs: Vec::new(),
    };
    let (mut major, mut minor) = (0, 0);
    // SAFETY: both out-pointers are live.
    unsafe { call!(nvrtc, nvrtcVersion(&mut major, &mut minor)) }?;
    nvrtc.version = (major.max(0) as u32, minor.max(0) as u32);
    let mut count = 0;
    // SAFETY: `count` is a live out-pointer.
    unsafe { call!(nvrtc, nvrtcGetNumSupportedArchs(&mut count)) }?;
    let mut archs = vec![0i32; usize::try_from(count).unwrap_or(0)];
    if !archs.is_empty() {
        // SAFETY: `archs` has room for the `count` architectures NVRTC just said it writes.
        unsafe { call!(nvrtc, nvrtcGetSupportedArchs(archs.as_mut_ptr())) }?;
    }
    nvrtc.archs = archs
        .into_iter()
        .filter_map(|a| u32::try_from(a).ok())
        .collect();
    nvrtc.archs.sort_unstable();
    Ok(nvrtc)
}

/// What one compilation is given, as C strings.
pub(crate) struct ProgramInput<'a> {
    pub(crate) name: &'a CStr,
    pub(crate) source: &'a CStr,
    pub(crate) headers: &'a [(CString, CString)],
    pub(crate) options: &'a [CString],
    pub(crate) name_expressions: &'a [CString],
    /// Whether to read the cubin (else the PTX).
    pub(crate) cubin: bool,
}

/// What one compilation made.
pub(crate) struct ProgramOutput {
    /// The cubin, or the PTX text with its terminating NUL.
    pub(crate) image: Vec<u8>,
    /// NVRTC's log: warnings (empty when it said nothing).
    pub(crate) log: String,
    /// Each name expression's lowered (mangled) name, in the order given.
    pub(crate) lowered: Vec<String>,
}

/// Why a compilation did not make code.
pub(crate) enum CompileFailure {
    /// NVRTC refused the source or its options (`NVRTC_ERROR_COMPILATION`,
    /// `NVRTC_ERROR_INVALID_OPTION`, ...): the status and NVRTC's log.
    Refused { code: u32, log: String },
    /// Anything else (NVRTC missing, a call failing).
    Other(Error),
}

impl From<Error> for CompileFailure {
    fn from(e: Error) -> Self {
        Self::Other(e)
    }
}

impl From<MissingSymbol> for CompileFailure {
    fn from(e: MissingSymbol) -> Self {
        Self::Other(Error::Missing(e))
    }
}

/// A program, destroyed when dropped.
struct Program<'n> {
    nvrtc: &'n Loaded,
    raw: nvrtcProgram,
}

impl Drop for Program<'_> {
    fn drop(&mut self) {
        if let Ok(destroy) = atlas_sys::entry!(self.nvrtc.table, nvrtcDestroyProgram) {
            // SAFETY: `raw` was made by nvrtcCreateProgram and is destroyed once, here.
            let _ = unsafe { destroy(&mut self.raw) };
        }
    }
}

impl Program<'_> {
    /// Reads one of the program's outputs through its size and copy functions.
    ///
    /// # Safety
    ///
    /// 1. `size` and `copy` are a size/copy pair of NVRTC (`nvrtcGetPTXSize`/`nvrtcGetPTX`).
    unsafe fn read(
        &self,
        (size_name, size): (
            &'static str,
            unsafe extern "C" fn(nvrtcProgram, *mut usize) -> nvrtcResult,
        ),
        (copy_name, copy): (
            &'static str,
            unsafe extern "C" fn(nvrtcProgram, *mut c_char) -> nvrtcResult,
        ),
    ) -> Result<Vec<u8>> {
        let mut len = 0usize;
        // SAFETY: the program is live; `len` is a live out-pointer.
        check(unsafe { size(self.raw, &mut len) }, size_name)?;
        let mut bytes = vec![0u8; len];
        if len > 0 {
            // SAFETY: duty 1: `copy` writes exactly the `len` bytes `size` reported.
            let status = unsafe { copy(self.raw, bytes.as_mut_ptr().cast()) };
            check(status, copy_name)?;
        }
        Ok(bytes)
    }

    fn log(&self) -> Result<String> {
        let nvrtc = self.nvrtc.table;
        let size = atlas_sys::entry!(nvrtc, nvrtcGetProgramLogSize)?;
        let copy = atlas_sys::entry!(nvrtc, nvrtcGetProgramLog)?;
        // SAFETY: a size/copy pair of NVRTC's.
        let log = unsafe {
            self.read(
                ("nvrtcGetProgramLogSize", size),
                ("nvrtcGetProgramLog", copy),
            )
        }?;
        let log = log.split(|&b| b == 0).next().unwrap_or(&log);
        Ok(String::from_utf8_lossy(log).trim_end().to_string())
    }
}

/// Compiles one program: `nvrtcCreateProgram`, `nvrtcAddNameExpression` for each name expression,
/// `nvrtcCompileProgram`, then the log, the code (`nvrtcGetCUBIN` or `nvrtcGetPTX`) and each
/// lowered name (`nvrtcGetLoweredName`); the program is destroyed on every path.
pub(crate) fn compile_program(
    nvrtc: &Loaded,
    input: &ProgramInput<'_>,
) -> std::result::Result<ProgramOutput, CompileFailure> {
    let header_count = i32::try_from(input.headers.len()).map_err(|_| {
        failed(
            "nvrtcCreateProgram",
            nvrtcResult::NVRTC_ERROR_INVALID_INPUT,
            "too many headers".into(),
        )
    })?;
    let contents: Vec<*const c_char> = input.headers.iter().map(|(_, c)| c.as_ptr()).collect();
    let names: Vec<*const c_char> = input.headers.iter().map(|(n, _)| n.as_ptr()).collect();
    let mut raw: nvrtcProgram = std::ptr::null_mut();
    // SAFETY: `raw` is a live out-pointer; the strings are NUL-terminated and live through the
    // call, the two header arrays hold `header_count` pointers each.
    unsafe {
        call!(
            nvrtc,
            nvrtcCreateProgram(
                &mut raw,
                input.source.as_ptr(),
                input.name.as_ptr(),
                header_count,
                contents.as_ptr(),
                names.as_ptr(),
            )
        )
    }?;
    let program = Program { nvrtc, raw };
    for expression in input.name_expressions {
        // SAFETY: the program is live; the expression is NUL-terminated (NVRTC copies it).
        unsafe {
            call!(
                nvrtc,
                nvrtcAddNameExpression(program.raw, expression.as_ptr())
            )
        }?;
    }
    let options: Vec<*const c_char> = input.options.iter().map(|o| o.as_ptr()).collect();
    let option_count = i32::try_from(options.len()).map_err(|_| {
        failed(
            "nvrtcCompileProgram",
            nvrtcResult::NVRTC_ERROR_INVALID_OPTION,
            "too many options".into(),
        )
    })?;
    let compile = atlas_sys::entry!(nvrtc.table, nvrtcCompileProgram)?;
    // SAFETY: the program is live; `options` holds `option_count` NUL-terminated strings that
    // live through the call.
    let status = unsafe { compile(program.raw, option_count, options.as_ptr()) };
    let log = program.log()?;
    if status != nvrtcResult::NVRTC_SUCCESS {
        return Err(CompileFailure::Refused {
            code: status.0,
            log,
        });
    }
    let table = nvrtc.table;
    // SAFETY: each pair is NVRTC's own size/copy pair.
    let image = unsafe {
        if input.cubin {
            program.read(
                (
                    "nvrtcGetCUBINSize",
                    atlas_sys::entry!(table, nvrtcGetCUBINSize)?,
                ),
                ("nvrtcGetCUBIN", atlas_sys::entry!(table, nvrtcGetCUBIN)?),
            )
        } else {
            program.read(
                (
                    "nvrtcGetPTXSize",
                    atlas_sys::entry!(table, nvrtcGetPTXSize)?,
                ),
                ("nvrtcGetPTX", atlas_sys::entry!(table, nvrtcGetPTX)?),
            )
        }
    }?;
    let mut lowered = Vec::with_capacity(input.name_expressions.len());
    for expression in input.name_expressions {
        let mut name: *const c_char = std::ptr::null();
        // SAFETY: the program is live and compiled; `name` is a live out-pointer.
        unsafe {
            call!(
                nvrtc,
                nvrtcGetLoweredName(program.raw, expression.as_ptr(), &mut name)
            )
        }
        .map_err(|e| match e {
            Error::Failed(failure) => Error::Failed(NvrtcFailure {
                subject: format!("name expression `{}`", expression.to_string_lossy()),
                ..failure
            }),
            other => other,
        })?;
        if name.is_null() {
            return Err(failed(
                "nvrtcGetLoweredName",
                nvrtcResult::NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID,
                format!("name expression `{}`", expression.to_string_lossy()),
            )
            .into());
        }
        // SAFETY: NVRTC returns a NUL-terminated string owned by the program, which is alive; it
        // is copied out before the program is destroyed.
        lowered.push(
            unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned(),
        );
    }
    Ok(ProgramOutput {
        image,
        log,
        lowered,
    })
}
