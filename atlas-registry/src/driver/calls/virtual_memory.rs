//! Virtual memory management: address reservations (`cuMemAddressReserve`, `cuMemAddressFree`),
//! physical allocations (`cuMemCreate`, `cuMemRelease`, `cuMemGetAllocationGranularity`,
//! `cuMemGetAllocationPropertiesFromHandle`), mappings (`cuMemMap`, `cuMemUnmap`,
//! `cuMemSetAccess`), and sharing an allocation with another process through a POSIX file
//! descriptor (`cuMemExportToShareableHandle`, `cuMemImportFromShareableHandle`).
//!
//! None of these acts in "the current context": a physical allocation names its device in its
//! properties, an access descriptor names the devices it grants. Their arguments are the caller's
//! to get right (the safe layer checks granularity, ranges and overlaps before it calls them).

use std::ffi::c_void;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use atlas_sys::{
    CUdevice, CUdeviceptr, CUmemAccess_flags, CUmemAccessDesc, CUmemAllocationGranularity_flags,
    CUmemAllocationHandleType, CUmemAllocationProp, CUmemAllocationProp_st__bindgen_ty_1,
    CUmemAllocationType, CUmemGenericAllocationHandle, CUmemLocation, CUmemLocationType,
};

use crate::driver::{Error, Result, driver};

/// `Ok` when the driver has every virtual memory entry point Atlas calls (CUDA 10.2+), else the
/// first one it lacks, in the order of this module's doc.
pub(crate) fn require_virtual_memory_entry_points() -> Result<()> {
    let cuda = driver()?.cuda;
    let missing = |r: std::result::Result<(), atlas_sys::MissingSymbol>| r.map_err(Error::Missing);
    missing(atlas_sys::entry!(cuda, cuMemAddressReserve).map(drop))?;
    missing(atlas_sys::entry!(cuda, cuMemAddressFree).map(drop))?;
    missing(atlas_sys::entry!(cuda, cuMemCreate).map(drop))?;
    missing(atlas_sys::entry!(cuda, cuMemRelease).map(drop))?;
    missing(atlas_sys::entry!(cuda, cuMemGetAllocationGranularity).map(drop))?;
    missing(atlas_sys::entry!(cuda, cuMemGetAllocationPropertiesFromHandle).map(drop))?;
    missing(atlas_sys::entry!(cuda, cuMemMap).map(drop))?;
    missing(atlas_sys::entry!(cuda, cuMemUnmap).map(drop))?;
    missing(atlas_sys::entry!(cuda, cuMemSetAccess).map(drop))?;
    missing(atlas_sys::entry!(cuda, cuMemExportToShareableHandle).map(drop))?;
    missing(atlas_sys::entry!(cuda, cuMemImportFromShareableHandle).map(drop))
}

/// The properties of pinned device memory on `device`, shareable through a POSIX file descriptor
/// when `exportable`.
pub(crate) fn device_memory_properties(device: CUdevice, exportable: bool) -> CUmemAllocationProp {
    CUmemAllocationProp {
        type_: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: if exportable {
            CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        } else {
            CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE
        },
        location: CUmemLocation {
            type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

/// `cuMemGetAllocationGranularity`: the `(minimum, recommended)` granularity of allocations with
/// `properties`. Sizes, offsets and addresses of mappings must be multiples of the minimum; the
/// recommended one performs best.
pub(crate) fn allocation_granularity(properties: &CUmemAllocationProp) -> Result<(usize, usize)> {
    let (mut minimum, mut recommended) = (0usize, 0usize);
    let flags = CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
    // SAFETY: `minimum` is a live out-pointer and `properties` a live, initialised struct; a bad
    // device in it is refused with a status.
    unsafe {
        call!(cuMemGetAllocationGranularity(
            &mut minimum,
            properties,
            flags
        ))
    }?;
    let flags = CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED;
    // SAFETY: as above.
    unsafe {
        call!(cuMemGetAllocationGranularity(
            &mut recommended,
            properties,
            flags
        ))
    }?;
    Ok((minimum, recommended))
}

/// `cuMemAddressReserve`: `bytes` of virtual address space aligned to `alignment` (a power of two,
/// or 0 for the driver's default), mapped to nothing. Takes no memory: it only reserves
/// addresses.
pub(crate) fn address_reserve(bytes: usize, alignment: usize) -> Result<CUdeviceptr> {
    let mut ptr: CUdeviceptr = 0;
    // SAFETY: `ptr` is a live out-pointer; no address hint, no flags; a bad size or alignment is
    // refused with a status.
    unsafe { call!(cuMemAddressReserve(&mut ptr, bytes, alignment, 0, 0)) }?;
    Ok(ptr)
}

/// `cuMemAddressFree`.
///
/// # Safety
///
/// 1. `ptr` and `bytes` are those of a live reservation of [`address_reserve`], freed once.
/// 2. Nothing is mapped in it any more (every mapping was unmapped with [`mem_unmap`]).
pub(crate) unsafe fn address_free(ptr: CUdeviceptr, bytes: usize) -> Result<()> {
    // SAFETY: duties 1 and 2.
    unsafe { call!(cuMemAddressFree(ptr, bytes)) }
}

/// `cuMemCreate`: `bytes` of physical memory with `properties`, mapped nowhere yet. `bytes` must
/// be a multiple of the minimum granularity of `properties` (else the driver refuses it).
pub(crate) fn mem_create(
    bytes: usize,
    properties: &CUmemAllocationProp,
) -> Result<CUmemGenericAllocationHandle> {
    let mut handle: CUmemGenericAllocationHandle = 0;
    // SAFETY: `handle` is a live out-pointer and `properties` a live, initialised struct; flags
    // must be 0. A bad size or device is refused with a status.
    unsafe { call!(cuMemCreate(&mut handle, bytes, properties, 0)) }?;
    Ok(handle)
}

/// `cuMemRelease`: gives up this handle to a physical allocation. The memory itself goes when no
/// mapping and no other handle (an import in another process included) refers to it any more.
///
/// # Safety
///
/// 1. `handle` was returned by [`mem_create`] or [`import_fd`] and is released once.
pub(crate) unsafe fn mem_release(handle: CUmemGenericAllocationHandle) -> Result<()> {
    // SAFETY: duty 1 (the driver's behaviour on an invalid handle is undefined).
    unsafe { call!(cuMemRelease(handle)) }
}

/// `cuMemGetAllocationPropertiesFromHandle`: the properties the allocation was created with (its
/// device in `location.id`).
///
/// # Safety
///
/// 1. `handle` is a live handle of [`mem_create`] or [`import_fd`].
pub(crate) unsafe fn allocation_properties(
    handle: CUmemGenericAllocationHandle,
) -> Result<CUmemAllocationProp> {
    let mut properties = device_memory_properties(0, false);
    // SAFETY: duty 1; `properties` is a live struct the driver overwrites.
    unsafe {
        call!(cuMemGetAllocationPropertiesFromHandle(
            &mut properties,
            handle
        ))
    }?;
    Ok(properties)
}

/// `cuMemMap`: maps all `bytes` of the physical allocation `handle` at `ptr` (offset 0 into the
/// allocation). The range starts with no access for any device: grant it with
/// [`mem_set_access`].
///
/// # Safety
///
/// 1. `ptr .. ptr + bytes` lies in a live reservation of [`address_reserve`] and overlaps no
///    mapping; `ptr` and `bytes` are multiples of the allocation's minimum granularity.
/// 2. `handle` is live and its allocation holds `bytes` bytes.
pub(crate) unsafe fn mem_map(
    ptr: CUdeviceptr,
    bytes: usize,
    handle: CUmemGenericAllocationHandle,
) -> Result<()> {
    // SAFETY: duties 1 and 2; offset and flags must be 0.
    unsafe { call!(cuMemMap(ptr, bytes, 0, handle, 0)) }
}

/// `cuMemUnmap`: unmaps what one [`mem_map`] mapped; the range becomes reserved address space
/// again. Not ordered with any stream: work still running on the range faults.
///
/// # Safety
///
/// 1. `ptr` and `bytes` are exactly those of one live mapping of [`mem_map`], unmapped once.
/// 2. No work of any device that may touch the range is still enqueued or running.
pub(crate) unsafe fn mem_unmap(ptr: CUdeviceptr, bytes: usize) -> Result<()> {
    // SAFETY: duties 1 and 2.
    unsafe { call!(cuMemUnmap(ptr, bytes)) }
}

/// `cuMemSetAccess`: grants `device` the access `flags` (`CU_MEM_ACCESS_FLAGS_PROT_*`) to the
/// mapped range `ptr .. ptr + bytes`. A bad device, or a range not fully mapped, is refused with
/// a status.
///
/// # Safety
///
/// 1. `ptr .. ptr + bytes` is mapped (by one or more live mappings of [`mem_map`]) while the call
///    runs, and no work that relies on the access this call takes away is enqueued or running.
pub(crate) unsafe fn mem_set_access(
    ptr: CUdeviceptr,
    bytes: usize,
    device: CUdevice,
    flags: CUmemAccess_flags,
) -> Result<()> {
    let desc = CUmemAccessDesc {
        location: CUmemLocation {
            type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        },
        flags,
    };
    // SAFETY: duty 1; `desc` is one live descriptor.
    unsafe { call!(cuMemSetAccess(ptr, bytes, &desc, 1)) }
}

/// `cuMemExportToShareableHandle` as a POSIX file descriptor, owned by the caller: another process
/// that receives it imports the allocation with [`import_fd`].
///
/// # Safety
///
/// 1. `handle` is live and was created with `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR` among its
///    requested handle types (else the driver refuses it).
pub(crate) unsafe fn export_fd(handle: CUmemGenericAllocationHandle) -> Result<OwnedFd> {
    let mut fd: RawFd = -1;
    let kind = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    let out: *mut c_void = (&mut fd as *mut RawFd).cast();
    // SAFETY: duty 1; for this handle type the driver writes one `int` at `out`.
    unsafe { call!(cuMemExportToShareableHandle(out, handle, kind, 0)) }?;
    // SAFETY: on success the driver opened `fd` for the caller, who now owns it alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `cuMemImportFromShareableHandle` of a POSIX file descriptor: a new handle to the allocation it
/// names, to be released with [`mem_release`]. The descriptor stays the caller's (the driver does
/// not take it over).
pub(crate) fn import_fd(fd: RawFd) -> Result<CUmemGenericAllocationHandle> {
    let mut handle: CUmemGenericAllocationHandle = 0;
    let kind = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    // The driver takes the descriptor's number in the pointer argument itself.
    let os_handle = std::ptr::without_provenance_mut::<c_void>(fd as usize);
    // SAFETY: `handle` is a live out-pointer; the driver only reads the descriptor, and refuses
    // one that does not name an exported allocation with a status.
    unsafe { call!(cuMemImportFromShareableHandle(&mut handle, os_handle, kind)) }?;
    Ok(handle)
}
