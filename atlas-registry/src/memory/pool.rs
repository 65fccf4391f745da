//! Memory pools, which stream-ordered allocations come from: pools of one's own
//! ([`MemoryPool::new`], with their own release threshold, reuse policies, maximum size and
//! export handle types) and the device's default pool ([`MemoryPool::device_default`], where
//! [`DeviceBuffer::alloc_async`] allocates); allocating from one on a stream, trimming it, and
//! reading how much memory it holds and uses.
//!
//! A pool keeps the memory its freed allocations gave back, up to its release threshold, and
//! hands it to later allocations: an inference loop that allocates and frees the same working set
//! every step reuses memory instead of mapping it again. Serving engines keep a pool per purpose
//! (activations, a sampler's scratch, memory shared with another process), each with its own
//! policy.

use atlas_sys::{
    CUcontext, CUdevice, CUdevice_attribute as Attr, CUmemAllocationHandleType,
    CUmemPool_attribute as PoolAttr, CUmemoryPool,
};

use crate::device::context::CudaContext;
use crate::device::host::CudaHost;
use crate::device::limits::attribute;
use crate::device::stream::CudaStream;
use crate::driver::{About, calls};
use crate::error::{AtlasError, PoolRefusal, Result, SharingRefusal, report_cleanup};
use crate::memory::buffer::{DeviceBuffer, DeviceCopy, check_stream, require_memory_pools};

/// `Ok` when `context`'s device can share memory pools as POSIX file descriptors and the driver
/// has the entry points of sharing them.
pub(crate) fn require_fd_sharing(context: &CudaContext) -> Result<()> {
    calls::require_pool_sharing_entry_points()?;
    let fd = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0;
    let device = context.device();
    let ordinal = context.ordinal();
    let handles = attribute(
        device,
        Attr::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
        ordinal,
    )?;
    let pool_handles = attribute(
        device,
        Attr::CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES,
        ordinal,
    )?;
    if handles == 0 || pool_handles & fd == 0 {
        return Err(AtlasError::Sharing(SharingRefusal::PosixFdUnsupported {
            device: ordinal,
        }));
    }
    Ok(())
}

/// When a pool may hand memory freed by one allocation to a later one that is not ordered after
/// the free on the same stream (`CU_MEMPOOL_ATTR_REUSE_*`). All three are on by default, as in the
/// driver. Each way is race-free by the driver's rules: the memory changes hands only once the
/// free is known to be ordered before the new allocation (or finished), and the free itself comes
/// after every use of the old buffer (duty 3 of [`MemoryPool::alloc_async`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReusePolicy {
    /// Reuse across streams that an event orders: an allocation on a stream that waits for an
    /// event recorded after the free (`CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES`).
    pub follow_event_dependencies: bool,
    /// Reuse of memory whose free the device has finished, whatever the streams
    /// (`CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC`): which allocation gets it then depends on
    /// timing.
    pub allow_opportunistic: bool,
    /// Reuse with a dependency the driver inserts itself, making the allocating stream wait for
    /// the free (`CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES`).
    pub allow_internal_dependencies: bool,
}

impl ReusePolicy {
    /// Every way of reuse (the driver's default).
    pub const ALL: Self = Self {
        follow_event_dependencies: true,
        allow_opportunistic: true,
        allow_internal_dependencies: true,
    };
    /// Memory freed on one stream is reused only by later allocations on that stream: what to
    /// choose when no allocation may ever wait on another stream's work.
    pub const SAME_STREAM: Self = Self {
        follow_event_dependencies: false,
        allow_opportunistic: false,
        allow_internal_dependencies: false,
    };
}

impl Default for ReusePolicy {
    fn default() -> Self {
        Self::ALL
    }
}

/// How a [`MemoryPool`] is made: built from [`PoolProperties::new`] (the driver's defaults: no
/// release threshold, every way of reuse, no maximum size of its own, not exportable).
///
/// # Examples
///
/// ```
/// use atlas_registry::{PoolProperties, ReusePolicy};
/// let props = PoolProperties::new()
///     .release_threshold(1 << 30) // keep up to 1 GiB between steps
///     .reuse(ReusePolicy::SAME_STREAM)
///     .max_size(8 << 30);
/// assert_eq!(props.max_size_bytes(), Some(8 << 30));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolProperties {
    release_threshold: u64,
    reuse: ReusePolicy,
    max_size: Option<usize>,
    exportable: bool,
}

impl PoolProperties {
    /// The driver's defaults.
    pub const fn new() -> Self {
        Self {
            release_threshold: 0,
            reuse: ReusePolicy::ALL,
            max_size: None,
            exportable: false,
        }
    }

    /// Bytes of freed memory the pool keeps reserved when idle, rather than giving them back to
    /// the system at the next synchronization (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`; 0 by default,
    /// `u64::MAX` keeps everything).
    pub const fn release_threshold(mut self, bytes: u64) -> Self {
        self.release_threshold = bytes;
        self
    }

    /// When freed memory may be reused across streams ([`ReusePolicy`]).
    pub const fn reuse(mut self, reuse: ReusePolicy) -> Self {
        self.reuse = reuse;
        self
    }

    /// The most bytes the pool may reserve (`CUmemPoolProps::maxSize`, drivers of CUDA 12.2 and
    /// newer): an allocation beyond it fails with `CUDA_ERROR_OUT_OF_MEMORY` although the device
    /// has memory left. 0 leaves the pool without a maximum of its own.
    pub const fn max_size(mut self, bytes: usize) -> Self {
        self.max_size = if bytes == 0 { None } else { Some(bytes) };
        self
    }

    /// Whether the pool can be shared with other processes as a POSIX file descriptor
    /// (`CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`; see [`MemoryPool::export`]).
    pub const fn exportable(mut self, exportable: bool) -> Self {
        self.exportable = exportable;
        self
    }

    /// The release threshold asked for.
    pub const fn release_threshold_bytes(&self) -> u64 {
        self.release_threshold
    }

    /// The reuse policy asked for.
    pub const fn reuse_policy(&self) -> ReusePolicy {
        self.reuse
    }

    /// The maximum size asked for, if any.
    pub const fn max_size_bytes(&self) -> Option<usize> {
        self.max_size
    }

    /// Whether the pool is to be exportable.
    pub const fn is_exportable(&self) -> bool {
        self.exportable
    }
}

/// How much memory a pool holds and hands out, in bytes, with the highest each has been since
/// the pool was made or its high-water marks were last reset ([`MemoryPool::usage`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolUsage {
    /// Memory the pool holds from the system now, in use or not
    /// (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`).
    pub reserved: u64,
    /// The most it has held (`CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH`).
    pub reserved_high: u64,
    /// Memory its live allocations use now (`CU_MEMPOOL_ATTR_USED_MEM_CURRENT`).
    pub used: u64,
    /// The most they have used at once (`CU_MEMPOOL_ATTR_USED_MEM_HIGH`).
    pub used_high: u64,
}

/// A memory pool of one device: one of one's own ([`new`](Self::new), destroyed when dropped)
/// or the device's default pool ([`device_default`](Self::device_default), which lives as long
/// as the driver). Stream-ordered allocations come from it ([`alloc_async`](Self::alloc_async),
/// one driver call each), and it is trimmed, measured and tuned here.
///
/// Dropping a pool while buffers allocated from it live is sound: `cuMemPoolDestroy` returns at
/// once and the driver releases the pool's memory when its last allocation is freed, and a buffer
/// frees itself with `cuMemFreeAsync`, which does not name the pool.
///
/// # Examples
///
/// A pool of scratch memory that keeps 256 MiB between steps, allocated from on a stream:
///
/// ```no_run
/// # fn f(registry: &atlas_registry::AtlasRegistry) -> atlas_registry::Result<()> {
/// use atlas_registry::{CudaStream, DeviceMemoryMut, LaunchConfig, MemoryPool, PoolProperties};
/// let ctx = registry.ctx();
/// let pool = MemoryPool::new(ctx, &PoolProperties::new().release_threshold(256 << 20))?;
/// let stream = CudaStream::new(ctx)?;
/// let scale = registry.function_cached("elementwise", "scale")?;
/// for step in 0..3 {
///     // SAFETY: `stream` outlives `scratch`, which is used only on it and freed on it, with
///     // no capture.
///     let mut scratch = unsafe { pool.alloc_async::<f32>(&stream, 1 << 20) }?;
///     scratch.fill(&stream, step as f32)?;
///     // SAFETY: `scale` touches the 1 << 20 floats of `scratch`, in the stream's order.
///     unsafe {
///         scale.launch(&stream, &LaunchConfig::for_elements(1 << 20, 256), (&mut scratch, 2.0f32, 1u32 << 20))?
///     };
///     scratch.free()?; // in the stream's order: the next step reuses the memory
/// }
/// stream.synchronize()?;
/// let usage = pool.usage()?;
/// assert_eq!(usage.used, 0);
/// assert!(usage.used_high >= 4 << 20);
/// pool.trim_to(0)?; // give back what the pool kept
/// # Ok(()) }
/// ```
pub struct MemoryPool {
    raw: CUmemoryPool,
    context: CUcontext,
    device: CUdevice,
    ordinal: usize,
    /// Made by [`new`](Self::new), and destroyed on drop; the default pool is never destroyed.
    owned: bool,
    exportable: bool,
}

// SAFETY: a memory pool is a driver handle usable from any thread; the context is a primary
// context retained for the process.
unsafe impl Send for MemoryPool {}
// SAFETY: shared references allocate from the pool, trim it and read or set its attributes, which
// the driver allows from any thread at once.
unsafe impl Sync for MemoryPool {}

impl MemoryPool {
    /// Makes a pool of `context`'s device's memory with `props` (`cuMemPoolCreate`, then one
    /// `cuMemPoolSetAttribute` per property that differs from the driver's default).
    ///
    /// Refused before the driver is called: a driver without the entry points
    /// ([`AtlasError::MissingSymbol`], naming the first one missing), a device without memory
    /// pools ([`AtlasError::MemoryPoolsUnsupported`]), a maximum size on a driver older than
    /// CUDA 12.2 ([`PoolRefusal::MaxSizeUnsupported`]), an exportable pool on a device that cannot
    /// share pools as POSIX file descriptors ([`SharingRefusal::PosixFdUnsupported`]).
    #[doc(alias = "cuMemPoolCreate")]
    pub fn new(context: &CudaContext, props: &PoolProperties) -> Result<Self> {
        calls::require_own_pool_entry_points()?;
        require_memory_pools(context)?;
        if props.max_size.is_some() {
            let driver = calls::cuda_version()?;
            if driver < (12, 2) {
                return Err(AtlasError::Pool(PoolRefusal::MaxSizeUnsupported { driver }));
            }
        }
        let mut handle_types = 0;
        if props.exportable {
            require_fd_sharing(context)?;
            handle_types = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0;
        }
        context.bind()?;
        let spec = calls::PoolSpec {
            device: context.device(),
            handle_types,
            max_size: props.max_size.unwrap_or(0),
        };
        let raw = calls::mem_pool_create(spec)
            .about(|| format!("a memory pool on device {}", context.ordinal()))?;
        // Dropped (and destroyed) should a property not take.
        let pool = Self {
            raw,
            context: context.raw(),
            device: context.device(),
            ordinal: context.ordinal(),
            owned: true,
            exportable: props.exportable,
        };
        if props.release_threshold != 0 {
            pool.set_release_threshold(props.release_threshold)?;
        }
        if props.reuse != ReusePolicy::ALL {
            pool.set_reuse(props.reuse)?;
        }
        Ok(pool)
    }

    /// The default memory pool of `context`'s device (`cuDeviceGetDefaultMemPool`): where
    /// [`DeviceBuffer::alloc_async`] allocates. It lives as long as the driver; dropping this
    /// value leaves it be. It is not exportable.
    ///
    /// A device without memory pools is [`AtlasError::MemoryPoolsUnsupported`]; a driver without
    /// the entry points is [`AtlasError::MissingSymbol`] naming the one missing.
    #[doc(alias = "cuDeviceGetDefaultMemPool")]
    pub fn device_default(context: &CudaContext) -> Result<Self> {
        require_memory_pools(context)?;
        let raw = calls::default_mem_pool(context.device())
            .about(|| format!("device {}", context.ordinal()))?;
        Ok(Self {
            raw,
            context: context.raw(),
            device: context.device(),
            ordinal: context.ordinal(),
            owned: false,
            exportable: false,
        })
    }

    /// Allocates room for `len` elements from the pool in stream order on `stream`
    /// (`cuMemAllocFromPoolAsync`: one driver call, and none for `len == 0`, which allocates
    /// nothing); contents unspecified. The buffer frees itself on `stream` (`cuMemFreeAsync`)
    /// when dropped or [`free`](DeviceBuffer::free)d, in that stream's order, exactly as one of
    /// [`DeviceBuffer::alloc_async`] does, and is captured as that one is (an allocation on a
    /// capturing stream is the graph's own, made from the graph's memory with this pool's
    /// properties).
    ///
    /// Memory freed on one stream goes to an allocation on another only when the driver knows
    /// the free comes first ([`ReusePolicy`]): with an event recorded on the freeing stream after
    /// the free, and the allocating stream waiting for it
    /// ([`CudaStream::wait`](crate::CudaStream::wait)), the new buffer may get the same memory,
    /// and no work of either can race, because every use of the old buffer came before its free
    /// (duty 3).
    ///
    /// Refused before the driver is called: a stream of another device's context than the
    /// pool's ([`AtlasError::WrongContext`]).
    ///
    /// # Safety
    ///
    /// 1. `stream` stays valid (is not destroyed) until the buffer has been freed: dropped, or
    ///    [`free`](DeviceBuffer::free)d.
    /// 2. The memory is used only after the allocation in stream order: on `stream`, or on
    ///    another stream only once that stream waits for `stream` (an event recorded on `stream`
    ///    after this call) or `stream` has been synchronized since. Atlas's safe copies and fills
    ///    on another stream are such uses.
    /// 3. When the buffer is freed, every use of it on other streams has finished or is ordered
    ///    before that point of `stream` (the free takes effect in `stream`'s order, not at once).
    /// 4. An allocation made while `stream` is being captured is freed in the same capture (the
    ///    buffer dropped or freed before the capture ends).
    #[doc(alias = "cuMemAllocFromPoolAsync")]
    #[inline]
    pub unsafe fn alloc_async<T: DeviceCopy>(
        &self,
        stream: &CudaStream,
        len: usize,
    ) -> Result<DeviceBuffer<T>> {
        check_stream(self.context, stream)?;
        let bytes = DeviceBuffer::<T>::bytes(len)?;
        let mut ptr = 0;
        if bytes > 0 {
            stream.bind_if_default()?;
            // SAFETY: the pool is live (owned by `self`, or a default pool) and not imported; the
            // stream is live (an invariant of CudaStream) and of the pool's device's context
            // (checked above), made current above for a default stream.
            ptr = unsafe { calls::mem_alloc_from_pool_async(bytes, self.raw, stream.raw()) }
                .about(|| {
                    format!(
                        "{bytes} bytes from a memory pool of device {}",
                        self.ordinal
                    )
                })?;
        }
        Ok(DeviceBuffer::stream_ordered(self.context, stream, ptr, len))
    }

    /// Gives memory the pool holds but does not use back to the system until it reserves no more
    /// than `keep` bytes, or has nothing more it can release (`cuMemPoolTrimTo`). Memory of
    /// allocations still live, and of frees the device has not reached yet, stays: synchronize
    /// the streams that freed first.
    #[doc(alias = "cuMemPoolTrimTo")]
    pub fn trim_to(&self, keep: usize) -> Result<()> {
        // SAFETY: the pool is live (owned by `self`, or a default pool).
        Ok(unsafe { calls::mem_pool_trim_to(self.raw, keep) }.about(|| self.subject())?)
    }

    /// How much memory the pool holds and uses now, and the most it has
    /// (`cuMemPoolGetAttribute`, four calls).
    #[doc(alias = "cuMemPoolGetAttribute")]
    pub fn usage(&self) -> Result<PoolUsage> {
        let read = |attribute| {
            // SAFETY: the pool is live; the four attributes read here are `cuuint64_t`s.
            unsafe { calls::pool_u64(self.raw, attribute) }.about(|| self.subject())
        };
        Ok(PoolUsage {
            reserved: read(PoolAttr::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?,
            reserved_high: read(PoolAttr::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)?,
            used: read(PoolAttr::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
            used_high: read(PoolAttr::CU_MEMPOOL_ATTR_USED_MEM_HIGH)?,
        })
    }

    /// Resets the high-water marks of [`usage`](Self::usage) to what the pool holds and uses now
    /// (0 into `CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH` and `CU_MEMPOOL_ATTR_USED_MEM_HIGH`).
    #[doc(alias = "cuMemPoolSetAttribute")]
    pub fn reset_high_water(&self) -> Result<()> {
        for attribute in [
            PoolAttr::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
            PoolAttr::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
        ] {
            // SAFETY: the pool is live; both attributes take a `cuuint64_t`, and 0 resets them.
            unsafe { calls::set_pool_u64(self.raw, attribute, 0) }.about(|| self.subject())?;
        }
        Ok(())
    }

    /// Sets how many bytes of freed memory the pool keeps reserved when idle
    /// (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`; see [`PoolProperties::release_threshold`]).
    #[doc(alias = "cuMemPoolSetAttribute")]
    pub fn set_release_threshold(&self, bytes: u64) -> Result<()> {
        let attribute = PoolAttr::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD;
        // SAFETY: the pool is live; the release threshold is a `cuuint64_t`.
        Ok(unsafe { calls::set_pool_u64(self.raw, attribute, bytes) }
            .about(|| format!("{}, {bytes} bytes", self.subject()))?)
    }

    /// The pool's release threshold, in bytes.
    #[doc(alias = "cuMemPoolGetAttribute")]
    pub fn release_threshold(&self) -> Result<u64> {
        let attribute = PoolAttr::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD;
        // SAFETY: the pool is live; the release threshold is a `cuuint64_t`.
        Ok(unsafe { calls::pool_u64(self.raw, attribute) }.about(|| self.subject())?)
    }

    /// Sets when freed memory may be reused across streams (three `cuMemPoolSetAttribute`).
    #[doc(alias = "cuMemPoolSetAttribute")]
    pub fn set_reuse(&self, reuse: ReusePolicy) -> Result<()> {
        for (attribute, on) in [
            (
                PoolAttr::CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES,
                reuse.follow_event_dependencies,
            ),
            (
                PoolAttr::CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
                reuse.allow_opportunistic,
            ),
            (
                PoolAttr::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
                reuse.allow_internal_dependencies,
            ),
        ] {
            // SAFETY: the pool is live; the three reuse attributes take an `int`.
            unsafe { calls::set_pool_flag(self.raw, attribute, on) }.about(|| self.subject())?;
        }
        Ok(())
    }

    /// When freed memory may be reused across streams (three `cuMemPoolGetAttribute`).
    #[doc(alias = "cuMemPoolGetAttribute")]
    pub fn reuse(&self) -> Result<ReusePolicy> {
        let read = |attribute| {
            // SAFETY: the pool is live; the three reuse attributes are `int`s.
            unsafe { calls::pool_flag(self.raw, attribute) }.about(|| self.subject())
        };
        Ok(ReusePolicy {
            follow_event_dependencies: read(
                PoolAttr::CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES,
            )?,
            allow_opportunistic: read(PoolAttr::CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC)?,
            allow_internal_dependencies: read(
                PoolAttr::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
            )?,
        })
    }

    /// The ordinal of the device whose memory the pool holds.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Whether the pool was made exportable ([`PoolProperties::exportable`]).
    pub fn is_exportable(&self) -> bool {
        self.exportable
    }

    /// Whether this is the device's default pool.
    pub fn is_device_default(&self) -> bool {
        !self.owned
    }

    /// The raw handle, for driver calls Atlas does not wrap. Valid while the pool lives.
    pub fn raw(&self) -> CUmemoryPool {
        self.raw
    }

    /// The raw handle of the primary context of the pool's device.
    pub(crate) fn context_raw(&self) -> CUcontext {
        self.context
    }

    /// The raw handle of the pool's device.
    pub(crate) fn device(&self) -> CUdevice {
        self.device
    }

    /// What a failed call was about.
    fn subject(&self) -> String {
        let kind = if self.owned {
            "a memory pool"
        } else {
            "the default memory pool"
        };
        format!("{kind} of device {}", self.ordinal)
    }
}

impl std::fmt::Debug for MemoryPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryPool")
            .field("raw", &self.raw)
            .field("device", &self.ordinal)
            .field("default", &!self.owned)
            .field("exportable", &self.exportable)
            .finish()
    }
}

impl Drop for MemoryPool {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // SAFETY: the pool was made by `cuMemPoolCreate` for this value, which destroys it only
        // here; buffers still allocated from it keep their memory until they are freed (the
        // driver defers the release).
        let result = unsafe { calls::mem_pool_destroy(self.raw) }.about(|| self.subject());
        report_cleanup("destroying a memory pool", result.map_err(AtlasError::from));
    }
}

impl CudaHost {
    /// Sets how many bytes of freed memory the device's default pool keeps reserved when it is
    /// idle, rather than giving them back to the driver at the next synchronization
    /// (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`; 0 by default). An inference loop that allocates and
    /// frees the same working set every step sets this at least as high as that working set, so
    /// that [`DeviceBuffer::alloc_async`] reuses memory instead of mapping it again; `u64::MAX`
    /// keeps everything. The same as [`MemoryPool::set_release_threshold`] on
    /// [`MemoryPool::device_default`].
    ///
    /// A device without memory pools is [`AtlasError::MemoryPoolsUnsupported`]; a driver without
    /// the entry points is [`AtlasError::MissingSymbol`] naming the one missing.
    #[doc(alias = "cuMemPoolSetAttribute")]
    #[doc(alias = "cuDeviceGetDefaultMemPool")]
    pub fn set_pool_release_threshold(&self, bytes: u64) -> Result<()> {
        MemoryPool::device_default(self.context())?.set_release_threshold(bytes)
    }

    /// The release threshold of the device's default pool, in bytes (see
    /// [`set_pool_release_threshold`](Self::set_pool_release_threshold)).
    #[doc(alias = "cuMemPoolGetAttribute")]
    pub fn pool_release_threshold(&self) -> Result<u64> {
        MemoryPool::device_default(self.context())?.release_threshold()
    }
}
