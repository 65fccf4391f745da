//! The one place that calls the driver: loading it, `cuInit`, and turning status codes into errors.
//!
//! Everything else calls the driver through [`cu!`], which resolves the entry point (a missing
//! one is an [`AtlasError::MissingSymbol`] naming it) and checks the status. The launch,
//! synchronize and current-context entry points are resolved once, into [`Driver`], for the hot
//! paths.

use std::ffi::c_void;
use std::sync::OnceLock;

use atlas_sys::{CUcontext, CUfunction, CUresult, CUstream, CudaDriver, entry};

use crate::error::{AtlasError, Result};

/// `cuLaunchKernel`'s signature.
pub(crate) type LaunchKernelFn = unsafe extern "C" fn(
    CUfunction,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    CUstream,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CUresult;

/// The loaded, initialised driver and the hot entry points as plain function pointers.
pub(crate) struct Driver {
    /// The whole table, for everything that is not hot.
    pub(crate) cuda: &'static CudaDriver,
    /// `cuLaunchKernel`.
    pub(crate) launch_kernel: LaunchKernelFn,
    /// `cuStreamSynchronize`.
    pub(crate) stream_synchronize: unsafe extern "C" fn(CUstream) -> CUresult,
    /// `cuCtxGetCurrent`: every call that acts in "the current context" asks the driver first.
    pub(crate) ctx_get_current: unsafe extern "C" fn(*mut CUcontext) -> CUresult,
    /// `cuCtxSetCurrent`.
    pub(crate) ctx_set_current: unsafe extern "C" fn(CUcontext) -> CUresult,
}

/// The driver, loaded and `cuInit`-ed once per process; the error (no driver, no `cuInit`
/// success) is decided once too.
pub(crate) fn driver() -> Result<&'static Driver> {
    static DRIVER: OnceLock<Result<Driver>> = OnceLock::new();
    DRIVER.get_or_init(init).as_ref().map_err(Clone::clone)
}

fn init() -> Result<Driver> {
    let cuda = atlas_sys::driver()?;
    let cu_init = entry!(cuda, cuInit)?;
    // SAFETY: cuInit takes its flags by value; 0 is the only valid value.
    check(unsafe { cu_init(0) }, "cuInit", String::new)?;
    Ok(Driver {
        cuda,
        launch_kernel: entry!(cuda, cuLaunchKernel)?,
        stream_synchronize: entry!(cuda, cuStreamSynchronize)?,
        ctx_get_current: entry!(cuda, cuCtxGetCurrent)?,
        ctx_set_current: entry!(cuda, cuCtxSetCurrent)?,
    })
}

/// `Ok` for `CUDA_SUCCESS`, else the error for `call`, naming what `subject` returns.
#[inline]
pub(crate) fn check(
    status: CUresult,
    call: &'static str,
    subject: impl FnOnce() -> String,
) -> Result<()> {
    if status == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(AtlasError::from_call(call, subject(), status.0))
    }
}

/// `cu!(cuName(args...))`: calls a driver entry point and checks its status. Use it inside an
/// `unsafe` block: the arguments are the caller's to get right.
/// `cu!(cuName(args...); "format", args...)` also names what the call was about in its error.
macro_rules! cu {
    ($name:ident($($arg:expr),* $(,)?)) => {
        $crate::driver::cu!($name($($arg),*); "")
    };
    ($name:ident($($arg:expr),* $(,)?); $($subject:tt)+) => {
        match $crate::driver::entry_point(|cuda| atlas_sys::resolve(&cuda.$name, stringify!($name))) {
            Ok(f) => $crate::driver::check(f($($arg),*), stringify!($name), || format!($($subject)+)),
            Err(e) => Err(e),
        }
    };
}
pub(crate) use cu;

/// One entry point of the loaded driver, or why it is not there.
#[inline]
pub(crate) fn entry_point<F: Copy>(
    resolve: impl FnOnce(&'static CudaDriver) -> Result<F, atlas_sys::MissingSymbol>,
) -> Result<F> {
    Ok(resolve(driver()?.cuda)?)
}
