//! Device memory shared between processes: memory pools exported and imported
//! (`cuMemPoolExportToShareableHandle`, `cuMemPoolImportFromShareableHandle`,
//! `cuMemPoolExportPointer`, `cuMemPoolImportPointer`), and the legacy handles of `cuMemAlloc`
//! memory (`cuIpcGetMemHandle`, `cuIpcOpenMemHandle_v2`, `cuIpcCloseMemHandle`).

use std::ffi::c_void;

use atlas_sys::{
    CUdeviceptr, CUipcMem_flags, CUipcMemHandle, CUmemAllocationHandleType, CUmemPoolPtrExportData,
    CUmemoryPool,
};

use crate::driver::{Error, Result, driver};

/// `Ok` when the driver has the entry points of sharing pools between processes (CUDA 11.2+),
/// else the first one it lacks.
pub(crate) fn require_pool_sharing_entry_points() -> Result<()> {
    let cuda = driver()?.cuda;
    let missing = |r: std::result::Result<(), atlas_sys::MissingSymbol>| r.map_err(Error::Missing);
    missing(atlas_sys::entry!(cuda, cuMemPoolExportToShareableHandle).map(drop))?;
    missing(atlas_sys::entry!(cuda, cuMemPoolImportFromShareableHandle).map(drop))?;
    missing(atlas_sys::entry!(cuda, cuMemPoolExportPointer).map(drop))?;
    missing(atlas_sys::entry!(cuda, cuMemPoolImportPointer).map(drop))?;
    missing(atlas_sys::entry!(cuda, cuMemPoolDestroy).map(drop))
}

/// `Ok` when the driver has the entry points of the legacy handles, else the first one it lacks.
pub(crate) fn require_ipc_entry_points() -> Result<()> {
    let cuda = driver()?.cuda;
    let missing = |r: std::result::Result<(), atlas_sys::MissingSymbol>| r.map_err(Error::Missing);
    missing(atlas_sys::entry!(cuda, cuIpcGetMemHandle).map(drop))?;
    missing(atlas_sys::entry!(cuda, cuIpcOpenMemHandle_v2).map(drop))?;
    missing(atlas_sys::entry!(cuda, cuIpcCloseMemHandle).map(drop))
}

/// `cuMemPoolExportToShareableHandle` as a POSIX file descriptor
/// (`CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`): a new descriptor, the caller's to close.
///
/// # Safety
///
/// 1. `pool` is live.
pub(crate) unsafe fn mem_pool_export_fd(pool: CUmemoryPool) -> Result<i32> {
    let mut fd: i32 = -1;
    let kind = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    // SAFETY: duty 1; for this handle type the driver writes an `int` to `handle_out`, which
    // `fd` is; flags must be 0.
    unsafe {
        call!(cuMemPoolExportToShareableHandle(
            (&raw mut fd).cast::<c_void>(),
            pool,
            kind,
            0
        ))
    }?;
    Ok(fd)
}

/// `cuMemPoolImportFromShareableHandle` of a POSIX file descriptor: the pool it names, to be
/// destroyed with `cuMemPoolDestroy`. The descriptor stays the caller's (it may be closed after).
pub(crate) fn mem_pool_import_fd(fd: i32) -> Result<CUmemoryPool> {
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    let kind = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    // The driver takes a descriptor as the handle's value, not as a pointer to it.
    let handle = fd as isize as *mut c_void;
    // SAFETY: `pool` is a live out-pointer; the handle is read as a number, and one that names no
    // exported pool is refused with a status; flags must be 0.
    unsafe {
        call!(cuMemPoolImportFromShareableHandle(
            &mut pool, handle, kind, 0
        ))
    }?;
    Ok(pool)
}

/// `cuMemPoolExportPointer`: the 64 bytes that let a process that imported the allocation's pool
/// import the allocation.
///
/// # Safety
///
/// 1. `ptr` is the start of a live allocation of a pool.
pub(crate) unsafe fn mem_pool_export_pointer(ptr: CUdeviceptr) -> Result<[u8; 64]> {
    let mut data = CUmemPoolPtrExportData { reserved: [0; 64] };
    // SAFETY: duty 1; `data` is a live out-pointer of the size the driver writes.
    unsafe { call!(cuMemPoolExportPointer(&mut data, ptr)) }?;
    Ok(data.reserved)
}

/// `cuMemPoolImportPointer`: the address of the allocation `data` describes, in `pool` (imported
/// from the exporting process). Released with `cuMemFree` or `cuMemFreeAsync`, which releases the
/// import only.
///
/// # Safety
///
/// 1. `pool` is live.
pub(crate) unsafe fn mem_pool_import_pointer(
    pool: CUmemoryPool,
    data: [u8; 64],
) -> Result<CUdeviceptr> {
    let mut ptr: CUdeviceptr = 0;
    let mut data = CUmemPoolPtrExportData { reserved: data };
    // SAFETY: duty 1; `ptr` and `data` are live; data that describes no allocation of the pool is
    // refused with a status.
    unsafe { call!(cuMemPoolImportPointer(&mut ptr, pool, &mut data)) }?;
    Ok(ptr)
}

/// `cuIpcGetMemHandle`: the 64-byte handle of a `cuMemAlloc` allocation, for another process.
///
/// # Safety
///
/// 1. `ptr` is the start of a live allocation of `cuMemAlloc`.
pub(crate) unsafe fn ipc_get_mem_handle(ptr: CUdeviceptr) -> Result<[u8; 64]> {
    let mut handle = CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: duty 1; `handle` is a live out-pointer of the size the driver writes.
    unsafe { call!(cuIpcGetMemHandle(&mut handle, ptr)) }?;
    // `c_char` is `i8` on x86-64 and `u8` on AArch64: the byte as it is, on both.
    Ok(handle.reserved.map(|b| b.to_ne_bytes()[0]))
}

/// `cuIpcOpenMemHandle_v2` with `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`, in the current context: the
/// address of the memory `handle` names, to be closed with [`ipc_close_mem_handle`].
///
/// # Safety
///
/// 1. A context is current (the one the memory is opened in).
pub(crate) unsafe fn ipc_open_mem_handle(handle: [u8; 64]) -> Result<CUdeviceptr> {
    let mut ptr: CUdeviceptr = 0;
    let handle = CUipcMemHandle {
        reserved: handle.map(|b| std::ffi::c_char::from_ne_bytes([b])),
    };
    let flags = CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS.0;
    // SAFETY: duty 1; `ptr` is a live out-pointer and the handle is passed by value; one that
    // names no exported memory is refused with a status.
    unsafe { call!(cuIpcOpenMemHandle_v2(&mut ptr, handle, flags)) }?;
    Ok(ptr)
}

/// `cuIpcCloseMemHandle`: unmaps memory opened by [`ipc_open_mem_handle`] (the exporter's
/// allocation stays).
///
/// # Safety
///
/// 1. `ptr` was returned by [`ipc_open_mem_handle`] and is closed once per open, with no enqueued
///    work still using it.
/// 2. A context of the device it was opened on is current.
pub(crate) unsafe fn ipc_close_mem_handle(ptr: CUdeviceptr) -> Result<()> {
    // SAFETY: duties 1 and 2.
    unsafe { call!(cuIpcCloseMemHandle(ptr)) }
}
