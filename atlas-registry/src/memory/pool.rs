//! The device's default memory pool, which stream-ordered allocations
//! ([`DeviceBuffer::alloc_async`](crate::DeviceBuffer::alloc_async)) come from, and how much
//! memory it keeps when idle ([`CudaHost::set_pool_release_threshold`]).

use atlas_sys::CUmemoryPool;

use crate::device::context::CudaContext;
use crate::device::host::CudaHost;
use crate::driver::{About, calls};
use crate::error::{AtlasError, Result};

/// `Ok` when `context`'s device can allocate in stream order: the driver has the entry points
/// (else [`AtlasError::MissingSymbol`] naming the first one missing) and the device has memory
/// pools (else [`AtlasError::MemoryPoolsUnsupported`]).
pub(crate) fn require_memory_pools(context: &CudaContext) -> Result<()> {
    calls::require_memory_pool_entry_points()?;
    if !context.memory_pools_supported()? {
        return Err(AtlasError::MemoryPoolsUnsupported {
            device: context.ordinal(),
        });
    }
    Ok(())
}

impl CudaHost {
    /// The device's default memory pool, after checking that it has one.
    fn default_pool(&self) -> Result<CUmemoryPool> {
        let context = self.context();
        require_memory_pools(context)?;
        Ok(calls::default_mem_pool(context.device())
            .about(|| format!("device {}", context.ordinal()))?)
    }

    /// Sets how many bytes of freed memory the device's default pool keeps reserved when it is
    /// idle, rather than giving them back to the driver at the next synchronization
    /// (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`; 0 by default). An inference loop that allocates and
    /// frees the same working set every step sets this at least as high as that working set, so
    /// that [`DeviceBuffer::alloc_async`](crate::DeviceBuffer::alloc_async) reuses memory instead
    /// of mapping it again; `u64::MAX` keeps everything.
    ///
    /// A device without memory pools is [`AtlasError::MemoryPoolsUnsupported`]; a driver without
    /// the entry points is [`AtlasError::MissingSymbol`] naming the one missing.
    #[doc(alias = "cuMemPoolSetAttribute")]
    #[doc(alias = "cuDeviceGetDefaultMemPool")]
    pub fn set_pool_release_threshold(&self, bytes: u64) -> Result<()> {
        let pool = self.default_pool()?;
        // SAFETY: a device's default pool lives as long as the driver.
        Ok(unsafe { calls::set_pool_release_threshold(pool, bytes) }
            .about(|| format!("device {}, {bytes} bytes", self.ordinal()))?)
    }

    /// The release threshold of the device's default pool, in bytes (see
    /// [`set_pool_release_threshold`](Self::set_pool_release_threshold)).
    #[doc(alias = "cuMemPoolGetAttribute")]
    pub fn pool_release_threshold(&self) -> Result<u64> {
        let pool = self.default_pool()?;
        // SAFETY: a device's default pool lives as long as the driver.
        Ok(unsafe { calls::pool_release_threshold(pool) }
            .about(|| format!("device {}", self.ordinal()))?)
    }
}
