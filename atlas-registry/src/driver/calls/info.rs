//! What a device, a context and a function are and allow: free and total memory, the device's UUID
//! and PCI address, context limits (`cuCtxSetLimit`, `cuCtxGetLimit`) and the block size of best
//! occupancy.

use std::ffi::{CStr, c_char};
use std::fmt;

use atlas_sys::{CUdevice, CUfunction, CUlimit, CUuuid};

use crate::driver::{Result, driver};

/// A resource limit of a context (`CUlimit`): read with
/// [`CudaContext::limit`](crate::CudaContext::limit), set with
/// [`CudaContext::set_limit`](crate::CudaContext::set_limit). The driver may round or clamp what
/// it is asked; read the limit back to know what it took.
///
/// # Examples
///
/// ```no_run
/// # fn f() -> atlas_registry::Result<()> {
/// use atlas_registry::{AtlasError, ContextLimit, ContextLimitRefusal};
/// let host = atlas_registry::host(0)?;
/// // A kernel with deep recursion needs more stack than the default 1 KiB per thread.
/// host.context().set_limit(ContextLimit::StackSize, 16 << 10)?;
/// // A read-only limit is refused before the driver is called.
/// match host.context().set_limit(ContextLimit::CigEnabled, 1) {
///     Err(AtlasError::ContextLimit { reason: ContextLimitRefusal::ReadOnly, .. }) => {}
///     other => panic!("{other:?}"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ContextLimit {
    /// Stack size of each GPU thread, in bytes (`CU_LIMIT_STACK_SIZE`). The driver raises it
    /// itself for a kernel that needs more, and does not lower it again; setting it waits for the
    /// device's work when the stack must be reallocated.
    StackSize,
    /// Size of the FIFO that device-side `printf` writes to, in bytes
    /// (`CU_LIMIT_PRINTF_FIFO_SIZE`). Set it before the first launch of a kernel that uses
    /// `printf`: afterwards the driver refuses it.
    PrintfFifoSize,
    /// Size of the heap of device-side `malloc` and `free`, in bytes
    /// (`CU_LIMIT_MALLOC_HEAP_SIZE`). Set it before the first launch of a kernel that uses them:
    /// afterwards the driver refuses it.
    MallocHeapSize,
    /// Deepest grid nesting at which device-side `cudaDeviceSynchronize` may be called
    /// (`CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH`), at most 24. Devices of compute capability 9.0 and
    /// newer have no device-side synchronization: Atlas refuses setting it there, as the driver
    /// would.
    DevRuntimeSyncDepth,
    /// Most device-runtime launches outstanding at once (`CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT`,
    /// 2048 by default); more reserves more device memory.
    DevRuntimePendingLaunchCount,
    /// Largest L2 fetch, in bytes, 0 to 128 (`CU_LIMIT_MAX_L2_FETCH_GRANULARITY`); a hint the
    /// driver may ignore or clamp.
    MaxL2FetchGranularity,
    /// L2 cache set aside for persisting accesses, in bytes (`CU_LIMIT_PERSISTING_L2_CACHE_SIZE`);
    /// a hint the driver may ignore or clamp (to `CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE`).
    PersistingL2CacheSize,
    /// Shared memory available to kernels of a CIG (CUDA in graphics) context, in bytes
    /// (`CU_LIMIT_SHMEM_SIZE`); read only.
    ShmemSize,
    /// Non-zero for a CIG context (`CU_LIMIT_CIG_ENABLED`); read only.
    CigEnabled,
    /// Whether a kernel of a CIG context that needs more shared memory than it has falls back to
    /// a slower path (non-zero) instead of failing to launch (`CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED`).
    CigShmemFallbackEnabled,
}

impl ContextLimit {
    /// The driver's `CUlimit` for this limit.
    pub fn raw(self) -> CUlimit {
        match self {
            Self::StackSize => CUlimit::CU_LIMIT_STACK_SIZE,
            Self::PrintfFifoSize => CUlimit::CU_LIMIT_PRINTF_FIFO_SIZE,
            Self::MallocHeapSize => CUlimit::CU_LIMIT_MALLOC_HEAP_SIZE,
            Self::DevRuntimeSyncDepth => CUlimit::CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH,
            Self::DevRuntimePendingLaunchCount => {
                CUlimit::CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT
            }
            Self::MaxL2FetchGranularity => CUlimit::CU_LIMIT_MAX_L2_FETCH_GRANULARITY,
            Self::PersistingL2CacheSize => CUlimit::CU_LIMIT_PERSISTING_L2_CACHE_SIZE,
            Self::ShmemSize => CUlimit::CU_LIMIT_SHMEM_SIZE,
            Self::CigEnabled => CUlimit::CU_LIMIT_CIG_ENABLED,
            Self::CigShmemFallbackEnabled => CUlimit::CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED,
        }
    }

    /// The C name of the limit.
    fn c_name(self) -> &'static str {
        match self {
            Self::StackSize => "CU_LIMIT_STACK_SIZE",
            Self::PrintfFifoSize => "CU_LIMIT_PRINTF_FIFO_SIZE",
            Self::MallocHeapSize => "CU_LIMIT_MALLOC_HEAP_SIZE",
            Self::DevRuntimeSyncDepth => "CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH",
            Self::DevRuntimePendingLaunchCount => "CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT",
            Self::MaxL2FetchGranularity => "CU_LIMIT_MAX_L2_FETCH_GRANULARITY",
            Self::PersistingL2CacheSize => "CU_LIMIT_PERSISTING_L2_CACHE_SIZE",
            Self::ShmemSize => "CU_LIMIT_SHMEM_SIZE",
            Self::CigEnabled => "CU_LIMIT_CIG_ENABLED",
            Self::CigShmemFallbackEnabled => "CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED",
        }
    }
}

impl fmt::Display for ContextLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self {
            Self::StackSize => "the thread stack size",
            Self::PrintfFifoSize => "the printf FIFO size",
            Self::MallocHeapSize => "the device malloc heap size",
            Self::DevRuntimeSyncDepth => "the device-runtime synchronization depth",
            Self::DevRuntimePendingLaunchCount => "the device-runtime pending launch count",
            Self::MaxL2FetchGranularity => "the L2 fetch granularity",
            Self::PersistingL2CacheSize => "the persisting L2 cache size",
            Self::ShmemSize => "the CIG shared memory size",
            Self::CigEnabled => "the CIG flag",
            Self::CigShmemFallbackEnabled => "the CIG shared memory fallback",
        };
        write!(f, "{what} ({})", self.c_name())
    }
}

/// `cuMemGetInfo_v2`: `(free, total)` bytes of the device of the current context.
pub(crate) fn mem_get_info() -> Result<(usize, usize)> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: both out-pointers are live; without a current context the call fails cleanly.
    unsafe { call!(cuMemGetInfo_v2(&mut free, &mut total)) }?;
    Ok((free, total))
}

/// `cuDeviceGetUuid_v2` (CUDA 11.4+), else `cuDeviceGetUuid`: the device's 16-byte UUID.
pub(crate) fn device_uuid(device: CUdevice) -> Result<[u8; 16]> {
    let mut uuid = CUuuid { bytes: [0; 16] };
    if driver()?.cuda.cuDeviceGetUuid_v2.is_ok() {
        // SAFETY: `uuid` is a live out-pointer of the size the driver writes; a bad device is
        // refused with a status.
        unsafe { call!(cuDeviceGetUuid_v2(&mut uuid, device)) }?;
    } else {
        // SAFETY: as above.
        unsafe { call!(cuDeviceGetUuid(&mut uuid, device)) }?;
    }
    // `c_char` is `i8` on x86-64 and `u8` on AArch64: the byte as it is, on both.
    Ok(uuid.bytes.map(|b| b.to_ne_bytes()[0]))
}

/// `cuDeviceGetPCIBusId`: the device's PCI address as the driver writes it
/// (`domain:bus:device.function`, in hexadecimal).
pub(crate) fn device_pci_bus_id(device: CUdevice) -> Result<String> {
    // The driver needs 13 bytes for `0000:00:00.0` and its NUL; room for a longer domain.
    let mut text = [0 as c_char; 32];
    // SAFETY: the buffer is live and its length is passed with it; a bad device is refused with a
    // status.
    unsafe {
        call!(cuDeviceGetPCIBusId(
            text.as_mut_ptr(),
            text.len() as i32,
            device
        ))
    }?;
    // Should the driver not end the text, the last byte ends it.
    text[text.len() - 1] = 0;
    // SAFETY: the buffer holds a NUL (set above) and lives through the call.
    Ok(unsafe { CStr::from_ptr(text.as_ptr()) }
        .to_string_lossy()
        .into_owned())
}

/// `cuCtxGetLimit`: the current context's `limit`.
pub(crate) fn context_limit(limit: ContextLimit) -> Result<usize> {
    let mut value = 0usize;
    // SAFETY: `value` is a live out-pointer; a limit the driver does not know, or no current
    // context, is refused with a status.
    unsafe { call!(cuCtxGetLimit(&mut value, limit.raw())) }?;
    Ok(value)
}

/// `cuCtxSetLimit`: asks for the current context's `limit` to be `value` (the driver may round or
/// clamp it).
pub(crate) fn set_context_limit(limit: ContextLimit, value: usize) -> Result<()> {
    // SAFETY: plain values; a limit the driver does not know, or no current context, is refused
    // with a status.
    unsafe { call!(cuCtxSetLimit(limit.raw(), value)) }
}

/// `cuOccupancyMaxPotentialBlockSize` with a fixed dynamic shared memory size and no callback:
/// `(minimum grid size for full occupancy, block size of best occupancy)`, the block size at most
/// `block_limit` (0: the function's and device's own limits only).
///
/// # Safety
///
/// 1. `function` is live; its context is current.
pub(crate) unsafe fn max_potential_block_size(
    function: CUfunction,
    dynamic_shared_bytes: usize,
    block_limit: i32,
) -> Result<(i32, i32)> {
    let (mut min_grid, mut block) = (0, 0);
    // SAFETY: duty 1; both out-pointers are live; no callback, so the fixed size is used.
    unsafe {
        call!(cuOccupancyMaxPotentialBlockSize(
            &mut min_grid,
            &mut block,
            function,
            None,
            dynamic_shared_bytes,
            block_limit
        ))
    }?;
    Ok((min_grid, block))
}
