//! Page-locked host memory: `cuMemHostAlloc`, `cuMemFreeHost`, `cuMemHostRegister_v2`,
//! `cuMemHostUnregister`, `cuMemHostGetDevicePointer_v2`.

use std::ffi::c_void;

use atlas_sys::CUdeviceptr;

use crate::driver::Result;

/// `cuMemHostAlloc`: `bytes` (more than 0) of page-locked host memory, with `flags`
/// (`CU_MEMHOSTALLOC_*`), for the current context. The memory is not initialised.
///
/// # Safety
///
/// 1. The context the memory is meant for is current on the calling thread.
pub(crate) unsafe fn mem_host_alloc(bytes: usize, flags: u32) -> Result<*mut c_void> {
    let mut ptr: *mut c_void = std::ptr::null_mut();
    // SAFETY: `ptr` is a live out-pointer; duty 1.
    unsafe { call!(cuMemHostAlloc(&mut ptr, bytes, flags)) }?;
    Ok(ptr)
}

/// `cuMemFreeHost`.
///
/// # Safety
///
/// 1. `ptr` was returned by [`mem_host_alloc`] and is freed once.
/// 2. No enqueued work still reads or writes it, and nothing on the host uses it afterwards.
pub(crate) unsafe fn mem_free_host(ptr: *mut c_void) -> Result<()> {
    // SAFETY: duties 1 and 2.
    unsafe { call!(cuMemFreeHost(ptr)) }
}

/// `cuMemHostRegister_v2`: page-locks `bytes` (more than 0) of host memory at `ptr`, with `flags`
/// (`CU_MEMHOSTREGISTER_*`), for the current context.
///
/// # Safety
///
/// 1. `ptr .. ptr + bytes` is memory of this process that stays allocated until it is
///    unregistered with [`mem_host_unregister`].
/// 2. The context the registration is meant for is current on the calling thread.
pub(crate) unsafe fn mem_host_register(ptr: *mut c_void, bytes: usize, flags: u32) -> Result<()> {
    // SAFETY: duties 1 and 2.
    unsafe { call!(cuMemHostRegister_v2(ptr, bytes, flags)) }
}

/// `cuMemHostUnregister`.
///
/// # Safety
///
/// 1. `ptr` is the address a live registration of [`mem_host_register`] began at, unregistered
///    once.
/// 2. No enqueued work still reads or writes the registered memory.
pub(crate) unsafe fn mem_host_unregister(ptr: *mut c_void) -> Result<()> {
    // SAFETY: duties 1 and 2.
    unsafe { call!(cuMemHostUnregister(ptr)) }
}

/// `cuMemHostGetDevicePointer_v2`: the device address at which kernels of the current context
/// reach mapped page-locked memory at `ptr`.
///
/// # Safety
///
/// 1. `ptr` is in page-locked memory allocated or registered as mapped (`DEVICEMAP`), still live.
/// 2. The context to map into is current on the calling thread.
pub(crate) unsafe fn mem_host_device_pointer(ptr: *mut c_void) -> Result<CUdeviceptr> {
    let mut device: CUdeviceptr = 0;
    // SAFETY: `device` is a live out-pointer; duties 1 and 2; flags must be 0.
    unsafe { call!(cuMemHostGetDevicePointer_v2(&mut device, ptr, 0)) }?;
    Ok(device)
}
