//! The driver tier: the only code of Atlas that names a driver (or NVRTC) entry point.
//!
//! - This file loads the driver and calls `cuInit` once per process, and resolves the entry points
//!   of the hot paths (launch, synchronize, current context) into plain function pointers.
//! - [`status`]: what status codes mean (teardown, a lost context), their names and text, and a
//!   failed call as data ([`DriverFailure`]).
//! - [`nvrtc`]: NVRTC, the run-time compiler, loaded and called the same way.
//! - [`calls`]: one thin typed wrapper per driver call Atlas makes. Out-pointers live inside the
//!   wrappers; each `unsafe` wrapper lists the duties its caller keeps (live handles, the right
//!   context current).
//!
//! The tier depends on nothing else in Atlas. Its errors ([`Error`]) become
//! [`AtlasError`](crate::AtlasError)s at the `?` of the calling code.

pub(crate) mod calls;
pub(crate) mod nvrtc;
pub(crate) mod status;

use std::ffi::c_void;
use std::sync::OnceLock;

use atlas_sys::{CUcontext, CUfunction, CUresult, CUstream, CudaDriver, LoadError, MissingSymbol};

pub use status::DriverFailure;

/// Why a driver call did not succeed.
#[derive(Debug, Clone)]
pub(crate) enum Error {
    /// The driver library cannot be loaded.
    Unavailable(LoadError),
    /// The driver lacks the entry point.
    Missing(MissingSymbol),
    /// The call returned a status other than success.
    Failed(DriverFailure),
}

/// `Result` of the driver tier.
pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

/// Names what a failed call was about; the subject is built only on failure.
pub(crate) trait About<T> {
    /// Sets the failure's subject (`"device 1"`, `` "`module::kernel`" ``).
    fn about(self, subject: impl FnOnce() -> String) -> Result<T>;
}

impl<T> About<T> for Result<T> {
    #[inline]
    fn about(self, subject: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| e.about(subject))
    }
}

impl Error {
    /// The same error, naming what the failed call was about.
    #[cold]
    pub(crate) fn about(self, subject: impl FnOnce() -> String) -> Self {
        match self {
            Self::Failed(failure) => Self::Failed(DriverFailure {
                subject: subject(),
                ..failure
            }),
            other => other,
        }
    }

    /// The status code, when the driver answered one.
    pub(crate) fn code(&self) -> Option<u32> {
        match self {
            Self::Failed(failure) => Some(failure.code),
            _ => None,
        }
    }
}

/// `Ok` for `CUDA_SUCCESS`, else the failure of `call`.
#[inline]
pub(crate) fn check(status: CUresult, call: &'static str) -> Result<()> {
    if status == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(failed(call, status))
    }
}

#[cold]
fn failed(call: &'static str, status: CUresult) -> Error {
    Error::Failed(DriverFailure {
        call,
        subject: String::new(),
        code: status.0,
    })
}

/// An entry point, or the error naming it.
fn entry<F>(resolved: std::result::Result<F, MissingSymbol>) -> Result<F> {
    resolved.map_err(Error::Missing)
}

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

/// `cuLaunchKernelEx`'s signature.
pub(crate) type LaunchKernelExFn = unsafe extern "C" fn(
    *const atlas_sys::CUlaunchConfig,
    CUfunction,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CUresult;

/// The loaded, initialised driver and the hot entry points as plain function pointers.
pub(crate) struct Driver {
    /// The whole table, for everything that is not hot.
    cuda: &'static CudaDriver,
    /// `cuLaunchKernel`, which each host keeps beside what else a launch reads.
    pub(crate) launch_kernel: LaunchKernelFn,
    stream_synchronize: unsafe extern "C" fn(CUstream) -> CUresult,
    ctx_get_current: unsafe extern "C" fn(*mut CUcontext) -> CUresult,
    ctx_set_current: unsafe extern "C" fn(CUcontext) -> CUresult,
    /// `cuLaunchKernelEx`, which drivers before CUDA 12.0 lack.
    launch_kernel_ex: Option<LaunchKernelExFn>,
}

/// The driver, loaded and `cuInit`-ed once per process; the error (no driver, no `cuInit`
/// success) is decided once too.
#[inline]
pub(crate) fn driver() -> Result<&'static Driver> {
    static DRIVER: OnceLock<Result<Driver>> = OnceLock::new();
    DRIVER.get_or_init(init).as_ref().map_err(Clone::clone)
}

fn init() -> Result<Driver> {
    let cuda = atlas_sys::driver().map_err(Error::Unavailable)?;
    let cu_init = entry(atlas_sys::entry!(cuda, cuInit))?;
    // SAFETY: cuInit takes its flags by value; 0 is the only valid value.
    check(unsafe { cu_init(0) }, "cuInit")?;
    Ok(Driver {
        cuda,
        launch_kernel: entry(atlas_sys::entry!(cuda, cuLaunchKernel))?,
        stream_synchronize: entry(atlas_sys::entry!(cuda, cuStreamSynchronize))?,
        ctx_get_current: entry(atlas_sys::entry!(cuda, cuCtxGetCurrent))?,
        ctx_set_current: entry(atlas_sys::entry!(cuda, cuCtxSetCurrent))?,
        launch_kernel_ex: atlas_sys::entry!(cuda, cuLaunchKernelEx).ok(),
    })
}
