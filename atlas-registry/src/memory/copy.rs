//! Host↔device copies: enqueued on a stream (so they can be captured into a graph), to or from any
//! device address of the stream's context (a buffer, a `__device__` variable, memory another
//! library allocated). Empty copies reach no driver call.

use std::ffi::c_void;

use atlas_sys::{CUcontext, CUdeviceptr, CUstream};

use crate::device::context::ensure_bound;
use crate::device::stream::CudaStream;
use crate::driver::{About, calls};
use crate::error::Result;

/// Enqueues a copy of `bytes` from host memory `src` to device address `dst` on `stream`
/// (`cuMemcpyHtoDAsync`). Capturable.
///
/// # Safety
///
/// 1. `dst .. dst + bytes` is allocated device memory of the stream's context.
/// 2. `src` holds `bytes` readable bytes that stay alive and unmodified until the copy has finished
///    (synchronize the stream, or an event recorded after it). From pageable memory the driver has
///    read `src` before this returns; from page-locked memory, or under capture, it reads it later.
#[doc(alias = "cuMemcpyHtoDAsync_v2")]
pub unsafe fn copy_to_device_async(
    stream: &CudaStream,
    dst: CUdeviceptr,
    src: *const c_void,
    bytes: usize,
) -> Result<()> {
    // SAFETY: duties 1 and 2; the stream is live and of its context (an invariant of CudaStream).
    unsafe { htod(stream.context(), dst, src, bytes, stream.raw()) }
}

/// Enqueues a copy of `bytes` from device address `src` to host memory `dst` on `stream`
/// (`cuMemcpyDtoHAsync`). Capturable.
///
/// # Safety
///
/// 1. `src .. src + bytes` is allocated device memory of the stream's context.
/// 2. `dst` has room for `bytes` and stays alive, neither read nor written, until the copy has
///    finished. Into pageable memory the driver returns only when the copy is done; into
///    page-locked memory, or under capture, it returns at once.
#[doc(alias = "cuMemcpyDtoHAsync_v2")]
pub unsafe fn copy_to_host_async(
    stream: &CudaStream,
    dst: *mut c_void,
    src: CUdeviceptr,
    bytes: usize,
) -> Result<()> {
    // SAFETY: duties 1 and 2; the stream is live and of its context.
    unsafe { dtoh(stream.context(), dst, src, bytes, stream.raw()) }
}

/// `cuMemcpyHtoDAsync`, skipping empty copies; for the legacy default stream `context` is made
/// current first.
///
/// # Safety
///
/// 1. `dst` is device memory of `context` with room for `bytes`; `stream` is a live stream of
///    `context`, or null.
/// 2. `src` holds `bytes` and stays valid until the copy is done.
pub(crate) unsafe fn htod(
    context: CUcontext,
    dst: CUdeviceptr,
    src: *const c_void,
    bytes: usize,
    stream: CUstream,
) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    ensure_bound(context)?;
    // SAFETY: duties 1 and 2; the context is current (above).
    Ok(unsafe { calls::copy_to_device(dst, src, bytes, stream) }
        .about(|| format!("{bytes} bytes"))?)
}

/// `cuMemcpyDtoHAsync`, skipping empty copies; for the legacy default stream `context` is made
/// current first.
///
/// # Safety
///
/// 1. `src` is device memory of `context` holding `bytes`; `stream` is a live stream of `context`,
///    or null.
/// 2. `dst` has room for `bytes` and stays valid until the copy is done.
pub(crate) unsafe fn dtoh(
    context: CUcontext,
    dst: *mut c_void,
    src: CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    ensure_bound(context)?;
    // SAFETY: duties 1 and 2; the context is current (above).
    Ok(unsafe { calls::copy_to_host(dst, src, bytes, stream) }
        .about(|| format!("{bytes} bytes"))?)
}
