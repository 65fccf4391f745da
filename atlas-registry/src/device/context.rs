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

use std::sync::{Mutex, OnceLock, PoisonError};

use atlas_sys::{CUcontext, CUdevice, CUdevice_attribute};

use crate::device::limits::attribute;
use crate::driver::About;
use crate::driver::calls;
use crate::error::Result;

/// A device's primary context, retained once for the life of the process.
///
/// Every Atlas entry point that needs a current context makes this one current first, so callers
/// never manage the thread's current context for Atlas's sake.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> atlas_registry::Result<()> {
/// use atlas_registry::DeviceBuffer;
/// let host = atlas_registry::host(0)?; // device 0's context and stream, for the process
/// let ctx = host.context();
/// let (least, greatest) = ctx.stream_priorities()?;
/// println!("{} (device {}): stream priorities {least} to {greatest}", host.name(), ctx.ordinal());
/// let x = DeviceBuffer::<f32>::zeroed(ctx, host.stream(), 1024)?; // memory of this context
/// # drop(x); Ok(()) }
/// ```
#[derive(Debug)]
pub struct CudaContext {
    raw: CUcontext,
    device: CUdevice,
    ordinal: usize,
    /// `(least, greatest)` stream priority, read on first ask.
    priorities: OnceLock<(i32, i32)>,
    /// Whether the device has memory pools, read on first ask.
    memory_pools: OnceLock<bool>,
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
        let mut retained = RETAINED.lock().unwrap_or_else(PoisonError::into_inner);
        if !retained.iter().any(|&(context, _)| context == raw.addr()) {
            retained.push((raw.addr(), ordinal));
        }
        drop(retained);
        Ok(Self {
            raw,
            device,
            ordinal,
            priorities: OnceLock::new(),
            memory_pools: OnceLock::new(),
        })
    }

    /// The device's stream priorities as `(least, greatest)`: numerically `greatest <= least`, a
    /// lower number runs first (`(0, -5)` on current GPUs; `least` is the default priority).
    /// Asked of the driver once (`cuCtxGetStreamPriorityRange`, with this context made current),
    /// then remembered; a failed read is not remembered.
    #[doc(alias = "cuCtxGetStreamPriorityRange")]
    pub fn stream_priorities(&self) -> Result<(i32, i32)> {
        if let Some(&range) = self.priorities.get() {
            return Ok(range);
        }
        self.bind()?;
        let range = calls::stream_priority_range().about(|| format!("device {}", self.ordinal))?;
        Ok(*self.priorities.get_or_init(|| range))
    }

    /// Whether the device supports stream-ordered allocation from memory pools
    /// (`CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED`), asked of the driver once.
    pub fn memory_pools_supported(&self) -> Result<bool> {
        if let Some(&supported) = self.memory_pools.get() {
            return Ok(supported);
        }
        let supported = attribute(
            self.device,
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
            self.ordinal,
        )? != 0;
        Ok(*self.memory_pools.get_or_init(|| supported))
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

/// The primary contexts Atlas retained (as addresses: compared, never dereferenced), with their
/// devices' ordinals.
static RETAINED: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

/// The ordinal of the device whose primary context is `context`, if Atlas retained it.
pub(crate) fn ordinal_of(context: CUcontext) -> Option<usize> {
    let retained = RETAINED.lock().unwrap_or_else(PoisonError::into_inner);
    retained
        .iter()
        .find(|&&(raw, _)| raw == context.addr())
        .map(|&(_, ordinal)| ordinal)
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
