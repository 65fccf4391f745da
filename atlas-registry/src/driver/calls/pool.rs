//! Memory pools and stream-ordered allocation: `cuMemAllocAsync`, `cuMemFreeAsync`,
//! `cuDeviceGetDefaultMemPool`, `cuMemPoolCreate`, `cuMemPoolDestroy`, `cuMemAllocFromPoolAsync`,
//! `cuMemPoolTrimTo`, `cuMemPoolSetAttribute`, `cuMemPoolGetAttribute`.

use atlas_sys::{
    CUdevice, CUdeviceptr, CUmemAllocationHandleType, CUmemAllocationType, CUmemLocation,
    CUmemLocationType, CUmemPool_attribute, CUmemPoolProps, CUmemoryPool, CUstream,
};

use crate::driver::{Error, Result, driver};

/// `Ok` when the driver has every entry point of stream-ordered allocation and of the default
/// memory pool (CUDA 11.2+), else the first one it lacks.
pub(crate) fn require_memory_pool_entry_points() -> Result<()> {
    let cuda = driver()?.cuda;
    let missing = |r: std::result::Result<(), atlas_sys::MissingSymbol>| r.map_err(Error::Missing);
    missing(atlas_sys::entry!(cuda, cuMemAllocAsync).map(drop))?;
    missing(atlas_sys::entry!(cuda, cuMemFreeAsync).map(drop))?;
    missing(atlas_sys::entry!(cuda, cuDeviceGetDefaultMemPool).map(drop))?;
    missing(atlas_sys::entry!(cuda, cuMemPoolSetAttribute).map(drop))?;
    missing(atlas_sys::entry!(cuda, cuMemPoolGetAttribute).map(drop))
}

/// `Ok` when the driver also has every entry point of pools of one's own (CUDA 11.2+): creating,
/// destroying, allocating from and trimming them; else the first one it lacks.
pub(crate) fn require_own_pool_entry_points() -> Result<()> {
    require_memory_pool_entry_points()?;
    let cuda = driver()?.cuda;
    let missing = |r: std::result::Result<(), atlas_sys::MissingSymbol>| r.map_err(Error::Missing);
    missing(atlas_sys::entry!(cuda, cuMemPoolCreate).map(drop))?;
    missing(atlas_sys::entry!(cuda, cuMemPoolDestroy).map(drop))?;
    missing(atlas_sys::entry!(cuda, cuMemAllocFromPoolAsync).map(drop))?;
    missing(atlas_sys::entry!(cuda, cuMemPoolTrimTo).map(drop))
}

/// `cuMemAllocAsync`: `bytes` (more than 0) from the default memory pool of the stream's device,
/// usable in stream order after this point of `stream`.
///
/// # Safety
///
/// 1. `stream` is live, or null (then the context to allocate in is current).
pub(crate) unsafe fn mem_alloc_async(bytes: usize, stream: CUstream) -> Result<CUdeviceptr> {
    let mut ptr: CUdeviceptr = 0;
    // SAFETY: duty 1; `ptr` is a live out-pointer.
    unsafe { call!(cuMemAllocAsync(&mut ptr, bytes, stream)) }?;
    Ok(ptr)
}

/// `cuMemAllocFromPoolAsync`: `bytes` (more than 0) from `pool`, usable in stream order after this
/// point of `stream`. One driver call.
///
/// # Safety
///
/// 1. `pool` is live and was made by `cuMemPoolCreate` or is a device's default pool (an imported
///    pool cannot allocate).
/// 2. `stream` is live, or null (then a context of the pool's device is current).
#[inline]
pub(crate) unsafe fn mem_alloc_from_pool_async(
    bytes: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> Result<CUdeviceptr> {
    let mut ptr: CUdeviceptr = 0;
    // SAFETY: duties 1 and 2; `ptr` is a live out-pointer.
    unsafe { call!(cuMemAllocFromPoolAsync(&mut ptr, bytes, pool, stream)) }?;
    Ok(ptr)
}

/// `cuMemFreeAsync`: frees `ptr` at this point of `stream`'s order.
///
/// # Safety
///
/// 1. `ptr` was allocated by [`mem_alloc_async`] or [`mem_alloc_from_pool_async`] and is freed
///    once.
/// 2. `stream` is live, or null (then the allocation's context is current).
/// 3. Every use of the memory is ordered before this point of `stream`, or complete.
pub(crate) unsafe fn mem_free_async(ptr: CUdeviceptr, stream: CUstream) -> Result<()> {
    // SAFETY: duties 1–3.
    unsafe { call!(cuMemFreeAsync(ptr, stream)) }
}

/// `cuDeviceGetDefaultMemPool`.
pub(crate) fn default_mem_pool(device: CUdevice) -> Result<CUmemoryPool> {
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `pool` is a live out-pointer; a bad device is refused with a status.
    unsafe { call!(cuDeviceGetDefaultMemPool(&mut pool, device)) }?;
    Ok(pool)
}

/// What a pool of one's own is made with ([`mem_pool_create`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PoolSpec {
    /// The device whose memory the pool holds.
    pub(crate) device: CUdevice,
    /// Export handle types (`CU_MEM_HANDLE_TYPE_*` bits; 0 for none).
    pub(crate) handle_types: u32,
    /// The most bytes the pool may reserve; 0 for the driver's default (no limit of its own).
    pub(crate) max_size: usize,
}

/// `cuMemPoolCreate`: a pool of pinned memory of `spec.device`.
pub(crate) fn mem_pool_create(spec: PoolSpec) -> Result<CUmemoryPool> {
    let props = CUmemPoolProps {
        allocType: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        handleTypes: CUmemAllocationHandleType(spec.handle_types),
        location: CUmemLocation {
            type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: spec.device,
        },
        win32SecurityAttributes: std::ptr::null_mut(),
        maxSize: spec.max_size,
        usage: 0,
        reserved: [0; 54],
    };
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `pool` is a live out-pointer and `props` a complete, initialised description read
    // during the call (reserved bytes zero, as the driver asks); bad values are refused with a
    // status.
    unsafe { call!(cuMemPoolCreate(&mut pool, &props)) }?;
    Ok(pool)
}

/// `cuMemPoolDestroy`. The driver releases a pool whose allocations are still outstanding once
/// the last of them is freed.
///
/// # Safety
///
/// 1. `pool` is live, made by `cuMemPoolCreate` or imported, and destroyed only here, once.
pub(crate) unsafe fn mem_pool_destroy(pool: CUmemoryPool) -> Result<()> {
    // SAFETY: duty 1.
    unsafe { call!(cuMemPoolDestroy(pool)) }
}

/// `cuMemPoolTrimTo`: gives memory the pool holds unused back to the system, until it reserves
/// fewer than `keep` bytes (or has nothing more it can release).
///
/// # Safety
///
/// 1. `pool` is live.
pub(crate) unsafe fn mem_pool_trim_to(pool: CUmemoryPool, keep: usize) -> Result<()> {
    // SAFETY: duty 1.
    unsafe { call!(cuMemPoolTrimTo(pool, keep)) }
}

/// `cuMemPoolSetAttribute` of an attribute whose value is a `cuuint64_t`
/// (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`, and 0 into `CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH` or
/// `CU_MEMPOOL_ATTR_USED_MEM_HIGH`, which resets them).
///
/// # Safety
///
/// 1. `pool` is live.
/// 2. `attribute` is one of the three above.
pub(crate) unsafe fn set_pool_u64(
    pool: CUmemoryPool,
    attribute: CUmemPool_attribute,
    value: u64,
) -> Result<()> {
    let mut value = value;
    // SAFETY: duties 1 and 2: the driver reads a cuuint64_t, which `value` is, during the call.
    unsafe {
        call!(cuMemPoolSetAttribute(
            pool,
            attribute,
            (&raw mut value).cast()
        ))
    }
}

/// `cuMemPoolGetAttribute` of an attribute whose value is a `cuuint64_t`
/// (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`, `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`, `..._HIGH`,
/// `CU_MEMPOOL_ATTR_USED_MEM_CURRENT`, `..._HIGH`).
///
/// # Safety
///
/// 1. `pool` is live.
/// 2. `attribute` is one of those above.
pub(crate) unsafe fn pool_u64(pool: CUmemoryPool, attribute: CUmemPool_attribute) -> Result<u64> {
    let mut value: u64 = 0;
    // SAFETY: duties 1 and 2: the driver writes a cuuint64_t, which `value` has room for.
    unsafe {
        call!(cuMemPoolGetAttribute(
            pool,
            attribute,
            (&raw mut value).cast()
        ))
    }?;
    Ok(value)
}

/// `cuMemPoolSetAttribute` of a reuse policy (`CU_MEMPOOL_ATTR_REUSE_*`), whose value is an `int`
/// (0 or 1).
///
/// # Safety
///
/// 1. `pool` is live.
/// 2. `attribute` is `CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES`,
///    `CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC` or `CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES`.
pub(crate) unsafe fn set_pool_flag(
    pool: CUmemoryPool,
    attribute: CUmemPool_attribute,
    on: bool,
) -> Result<()> {
    let mut value = i32::from(on);
    // SAFETY: duties 1 and 2: the driver reads an int, which `value` is, during the call.
    unsafe {
        call!(cuMemPoolSetAttribute(
            pool,
            attribute,
            (&raw mut value).cast()
        ))
    }
}

/// `cuMemPoolGetAttribute` of a reuse policy (`CU_MEMPOOL_ATTR_REUSE_*`).
///
/// # Safety
///
/// 1. `pool` is live.
/// 2. `attribute` is one of the three reuse policies (see [`set_pool_flag`]).
pub(crate) unsafe fn pool_flag(pool: CUmemoryPool, attribute: CUmemPool_attribute) -> Result<bool> {
    let mut value: i32 = 0;
    // SAFETY: duties 1 and 2: the driver writes an int, which `value` has room for.
    unsafe {
        call!(cuMemPoolGetAttribute(
            pool,
            attribute,
            (&raw mut value).cast()
        ))
    }?;
    Ok(value != 0)
}
