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

use crate::device::limits::{attribute, compute_capability_of, refuse_setting};
use crate::driver::calls::{self, ContextLimit};
use crate::driver::{self, About};
use crate::error::{AtlasError, ContextLimitRefusal, Result};

/// A device's primary context, retained once for the life of the process.
///
/// Every Atlas entry point that needs a current context makes this one current first, so callers
/// never manage the thread's current context for Atlas's sake.
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

    /// The context's `limit` (`cuCtxGetLimit`, with this context made current whatever context
    /// the thread had: `cuCtxGetCurrent`, then one `cuCtxGetLimit`).
    ///
    /// A limit the device or driver does not have is an [`AtlasError::ContextLimit`] with reason
    /// [`ContextLimitRefusal::Unsupported`], any other refusal of the driver one with
    /// [`ContextLimitRefusal::Driver`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn f() -> atlas_registry::Result<()> {
    /// use atlas_registry::ContextLimit;
    /// let host = atlas_registry::host(0)?;
    /// let context = host.context();
    /// // Room for device-side printf output, before the first kernel that prints.
    /// context.set_limit(ContextLimit::PrintfFifoSize, 64 << 20)?;
    /// assert!(context.limit(ContextLimit::PrintfFifoSize)? >= 64 << 20);
    /// println!("stack: {} B per thread", context.limit(ContextLimit::StackSize)?);
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuCtxGetLimit")]
    pub fn limit(&self, limit: ContextLimit) -> Result<usize> {
        self.bind()?;
        calls::context_limit(limit).map_err(|e| self.limit_error(limit, None, e))
    }

    /// Asks for the context's `limit` to be `value` (`cuCtxSetLimit`, with this context made
    /// current whatever context the thread had). The driver may round or clamp the value; read
    /// it back with [`limit`](Self::limit). See [`ContextLimit`] for what each limit is and when
    /// it can be set.
    ///
    /// Refused before the driver is called, as an [`AtlasError::ContextLimit`], where the
    /// driver's documentation says it would refuse: a read-only limit
    /// ([`ContextLimitRefusal::ReadOnly`]), a value above a limit's maximum
    /// ([`ContextLimitRefusal::TooLarge`]: 24 for the device-runtime synchronization depth, 128
    /// for the L2 fetch granularity), the device-runtime synchronization depth on a device of
    /// compute capability 9.0 or newer ([`ContextLimitRefusal::Unsupported`]). Otherwise the
    /// driver's refusal comes back the same way, typed: `CUDA_ERROR_UNSUPPORTED_LIMIT` as
    /// [`ContextLimitRefusal::Unsupported`], anything else (a printf FIFO size after a kernel
    /// that prints was launched: `CUDA_ERROR_INVALID_VALUE`; a reservation that does not fit:
    /// `CUDA_ERROR_OUT_OF_MEMORY`) as [`ContextLimitRefusal::Driver`] with its code.
    ///
    /// Setting the stack size waits for the device's work when the driver must reallocate the
    /// stack. From a thread that is capturing a stream through Atlas it is refused
    /// ([`CaptureMisuse::SetLimitWhileCapturing`](crate::CaptureMisuse::SetLimitWhileCapturing)):
    /// the driver refuses it there and invalidates the capture (measured on an H200 for the stack
    /// size); the capture goes on.
    #[doc(alias = "cuCtxSetLimit")]
    pub fn set_limit(&self, limit: ContextLimit, value: usize) -> Result<()> {
        if crate::device::capture::thread_is_capturing() {
            return Err(AtlasError::Capture(
                crate::CaptureMisuse::SetLimitWhileCapturing,
            ));
        }
        let capability = || compute_capability_of(self.device, self.ordinal);
        if let Some(reason) = refuse_setting(limit, value, capability)? {
            return Err(AtlasError::ContextLimit {
                device: self.ordinal,
                limit,
                value: Some(value),
                reason,
            });
        }
        self.bind()?;
        calls::set_context_limit(limit, value).map_err(|e| self.limit_error(limit, Some(value), e))
    }

    /// The error of a failed `cuCtxGetLimit` (`value` `None`) or `cuCtxSetLimit`: the driver's
    /// refusal as a [`ContextLimitRefusal`]; a lost context, a missing entry point or no driver
    /// as such.
    #[cold]
    fn limit_error(
        &self,
        limit: ContextLimit,
        value: Option<usize>,
        e: driver::Error,
    ) -> AtlasError {
        let code = match &e {
            driver::Error::Failed(failure) if !failure.is_sticky() => failure.code,
            _ => return e.into(),
        };
        let reason = if code == atlas_sys::CUresult::CUDA_ERROR_UNSUPPORTED_LIMIT.0 {
            match compute_capability_of(self.device, self.ordinal) {
                Ok(compute_capability) => ContextLimitRefusal::Unsupported { compute_capability },
                Err(e) => return e,
            }
        } else {
            ContextLimitRefusal::Driver {
                setting: value.is_some(),
                code,
            }
        };
        AtlasError::ContextLimit {
            device: self.ordinal,
            limit,
            value,
            reason,
        }
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
