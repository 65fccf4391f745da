//! The JIT error log: a load is made with no options, exactly as a raw call would be; only when it
//! fails is the image loaded once more with a log buffer, so that the error carries what the JIT
//! compiler said.

use atlas_sys::CUresult;

use crate::code::blob::code_targets;
use crate::code::fit::no_binary_for;
use crate::device::host::CudaHost;
use crate::driver;
use crate::driver::calls::JitLog;
use crate::error::{AtlasError, Result};

/// Loads `image` through `load`, with no options: the load is exactly what a raw call costs. Only
/// when it fails is the image handed over once more, with a JIT error log buffer (see
/// [`retry_with_log`]). `device` is the device the load is for, when it is known.
#[inline]
pub(crate) fn with_jit_log<T>(
    name: &str,
    image: &[u8],
    device: Option<&CudaHost>,
    mut load: impl FnMut(Option<&mut JitLog>) -> driver::Result<T>,
) -> Result<T> {
    match load(None) {
        Ok(loaded) => Ok(loaded),
        Err(e) => retry_with_log(name, e, image, device, load),
    }
}

/// After a load of `image` failed with `error`: unless the context is lost (then every call fails
/// the same way, and the blob is not at fault), the driver is missing, or the image holds no code
/// for the device, loads it once more through `load` with a JIT error log buffer, so that the
/// error is an [`AtlasError::ModuleLoad`] carrying the log. `Ok` when that second load succeeded
/// (the caller then owns what it loaded).
#[cold]
pub(crate) fn retry_with_log<T>(
    name: &str,
    error: driver::Error,
    image: &[u8],
    device: Option<&CudaHost>,
    mut load: impl FnMut(Option<&mut JitLog>) -> driver::Result<T>,
) -> Result<T> {
    let code = match &error {
        driver::Error::Failed(failure) if !failure.is_sticky() => failure.code,
        _ => return Err(error.about(|| format!("loading module `{name}`")).into()),
    };
    if let (CUresult::CUDA_ERROR_NO_BINARY_FOR_GPU, Some(host)) = (CUresult(code), device) {
        return Err(no_binary_for(host, name, code_targets(image)));
    }
    let mut log = JitLog::new();
    match load(Some(&mut log)) {
        Ok(loaded) => Ok(loaded),
        Err(_) => Err(AtlasError::ModuleLoad {
            module: name.to_string(),
            code,
            jit_log: log.text(),
        }),
    }
}
