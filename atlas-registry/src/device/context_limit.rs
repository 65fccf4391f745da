//! Context limits ([`ContextLimit`]): stack size, printf FIFO, malloc heap and the rest, read
//! and set in a [`CudaContext`] whatever context the calling thread has current, with what the
//! driver's documentation and the capture record say it would refuse refused beforehand.

use crate::device::capture;
use crate::device::context::CudaContext;
use crate::device::limits::{compute_capability_of, refuse_setting};
use crate::driver;
use crate::driver::calls::{self, ContextLimit};
use crate::error::{AtlasError, CaptureMisuse, ContextLimitRefusal, Result};

impl CudaContext {
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
    /// ([`CaptureMisuse::SetLimitWhileCapturing`]):
    /// the driver refuses it there and invalidates the capture (measured on an H200 for the stack
    /// size); the capture goes on.
    #[doc(alias = "cuCtxSetLimit")]
    pub fn set_limit(&self, limit: ContextLimit, value: usize) -> Result<()> {
        if capture::thread_is_capturing() {
            return Err(AtlasError::Capture(CaptureMisuse::SetLimitWhileCapturing));
        }
        let capability = || compute_capability_of(self.device(), self.ordinal());
        if let Some(reason) = refuse_setting(limit, value, capability)? {
            return Err(AtlasError::ContextLimit {
                device: self.ordinal(),
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
            match compute_capability_of(self.device(), self.ordinal()) {
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
            device: self.ordinal(),
            limit,
            value,
            reason,
        }
    }
}
