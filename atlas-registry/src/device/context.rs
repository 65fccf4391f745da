//! [`CudaContext`]: a device's primary context, and making it current before the driver calls that
//! act in "the current context".
//!
//! Atlas never trusts a record of its own about what is current: other code on the same thread
//! (another CUDA library, the runtime API, a `cuCtxPushCurrent`) may have changed it. Every call that
//! allocates, loads, copies or otherwise acts in the current context first asks the driver
//! (`cuCtxGetCurrent`, a thread-local read inside the driver) and sets Atlas's context only when it
//! is not current. A launch on a created stream asks nothing: the stream names its context.
//!
//! Atlas leaves its context current afterwards, as `cudaSetDevice` does; code that relies on
//! another context being current must make it current again (or push and pop it around its work).

use atlas_sys::{CUcontext, CUdevice};

use crate::driver::About;
use crate::driver::calls;
use crate::error::Result;

/// A device's primary context, retained once for the life of the process.
///
/// Every Atlas entry point that needs a current context makes this one current first, so callers
/// never manage the thread's current context for Atlas's sake.
#[derive(Debug)]
pub struct CudaContext {
    raw: CUcontext,
    device: CUdevice,
    ordinal: usize,
}

// SAFETY: a CUcontext is a driver handle usable from any thread (the driver API is thread-safe);
// CudaContext never releases it, so it stays valid wherever the value goes.
unsafe impl Send for CudaContext {}
// SAFETY: as for Send; shared references only read the handle.
unsafe impl Sync for CudaContext {}

impl CudaContext {
    /// Retains the primary context of `device` (ordinal `ordinal`).
    pub(crate) fn retain_primary(device: CUdevice, ordinal: usize) -> Result<Self> {
        let raw = calls::primary_context(device).about(|| format!("device {ordinal}"))?;
        Ok(Self {
            raw,
            device,
            ordinal,
        })
    }

    /// Makes this context current on the calling thread unless the driver says it already is
    /// (`cuCtxGetCurrent`, then `cuCtxSetCurrent` only when another context, or none, is current).
    #[doc(alias = "cuCtxSetCurrent")]
    #[inline]
    pub fn bind(&self) -> Result<()> {
        ensure_bound(self.raw)
    }

    /// The raw `CUcontext`, for driver calls Atlas does not wrap. It stays valid for the process.
    pub fn raw(&self) -> CUcontext {
        self.raw
    }

    /// The raw `CUdevice`.
    pub fn device(&self) -> CUdevice {
        self.device
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }
}

/// Makes `raw` current on this thread unless the driver says it already is.
#[inline]
pub(crate) fn ensure_bound(raw: CUcontext) -> Result<()> {
    if calls::current_context()? != raw {
        // SAFETY: every context Atlas binds is a primary context it retained and never releases.
        unsafe { calls::set_current_context(raw) }?;
    }
    Ok(())
}
