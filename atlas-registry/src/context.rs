//! [`CudaContext`]: a device's primary context and the cheap per-thread binding of it.

use std::cell::Cell;

use atlas_sys::{CUcontext, CUdevice};

use crate::driver::cu;
use crate::error::Result;

thread_local! {
    /// The context this thread last made current through Atlas.
    static BOUND: Cell<CUcontext> = const { Cell::new(std::ptr::null_mut()) };
}

/// A device's primary context, retained once for the life of the process.
///
/// Every Atlas entry point that needs a current context calls [`bind`](Self::bind) first, so
/// callers never manage the thread's current context themselves.
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
        let mut raw: CUcontext = std::ptr::null_mut();
        // SAFETY: `raw` is a live out-pointer; `device` came from cuDeviceGet.
        unsafe { cu!(cuDevicePrimaryCtxRetain(&mut raw, device); "device {ordinal}") }?;
        Ok(Self {
            raw,
            device,
            ordinal,
        })
    }

    /// Makes this context current on the calling thread, unless Atlas already did: a thread-local
    /// comparison, and a `cuCtxSetCurrent` only on a thread's first use or after another context.
    ///
    /// If your own code changes the thread's current context behind Atlas's back, call
    /// [`rebind`](Self::rebind) before the next Atlas call on that thread.
    #[inline]
    pub fn bind(&self) -> Result<()> {
        if BOUND.get() == self.raw {
            Ok(())
        } else {
            self.rebind()
        }
    }

    /// Makes this context current on the calling thread with `cuCtxSetCurrent`, unconditionally.
    #[doc(alias = "cuCtxSetCurrent")]
    pub fn rebind(&self) -> Result<()> {
        bind_raw(self.raw)
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

/// Makes `raw` current on this thread and records it.
pub(crate) fn bind_raw(raw: CUcontext) -> Result<()> {
    // SAFETY: `raw` is a primary context Atlas retained and never releases.
    unsafe { cu!(cuCtxSetCurrent(raw)) }?;
    BOUND.set(raw);
    Ok(())
}

/// Binds `raw` if it is not this thread's current Atlas context.
#[inline]
pub(crate) fn ensure_bound(raw: CUcontext) -> Result<()> {
    if BOUND.get() == raw {
        Ok(())
    } else {
        bind_raw(raw)
    }
}
