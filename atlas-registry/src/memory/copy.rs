//! Copies: host↔device, to or from any device address of the stream's context (a buffer, a
//! `__device__` variable, memory another library allocated), and between device memory of one
//! context; enqueued on a stream, so they can be captured into a graph. Empty copies reach no
//! driver call.
//!
//! The copies of Atlas's buffers and views ([`DeviceMemory`](crate::DeviceMemory),
//! [`DeviceMemoryMut`](crate::DeviceMemoryMut), and the buffer's own copy methods, defined here)
//! are checked here: the stream and the source of the memory's context, the lengths equal. The
//! enqueued ones go through `buffer::enqueue`, as the fills, 2D copies and peer copies do: the
//! memory they touch is freed only after its device's work, and a capture that takes them in keeps
//! it for its graph.

use std::ffi::c_void;

use atlas_sys::{CUcontext, CUdeviceptr, CUstream};

use crate::device::capture;
use crate::device::context::CudaContext;
use crate::device::context::ensure_bound;
use crate::device::host::ordinal_of;
use crate::device::stream::CudaStream;
use crate::driver::{About, calls};
use crate::error::{AtlasError, MemoryRefusal, Result};
use crate::memory::buffer::{DeviceBuffer, DeviceCopy, check_stream, enqueue};
use crate::memory::view::{DeviceSlice, DeviceSliceMut};

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

/// The buffer's copies to and from the host: the doors of [`DeviceMemory`](crate::DeviceMemory)
/// and [`DeviceMemoryMut`](crate::DeviceMemoryMut) that a buffer has without importing them.
impl<T: DeviceCopy> DeviceBuffer<T> {
    /// A new buffer holding a copy of `data`, in the stream's context; waits for the copy. A
    /// stream of another context than `context` is refused ([`AtlasError::WrongContext`]) before
    /// anything is allocated.
    pub fn from_slice(context: &CudaContext, stream: &CudaStream, data: &[T]) -> Result<Self> {
        check_stream(context.raw(), stream)?;
        let mut buffer = Self::alloc(context, data.len())?;
        buffer.copy_from(stream, data)?;
        Ok(buffer)
    }

    /// Copies `src` into the buffer on `stream` and waits for the copy to finish: as
    /// [`DeviceMemoryMut::copy_from`](crate::DeviceMemoryMut::copy_from), which views have too.
    ///
    /// A stream of another context than the buffer's is refused ([`AtlasError::WrongContext`]),
    /// here and in every copy of the buffer. Refused before anything is enqueued
    /// ([`CaptureMisuse::WaitingCopyWhileCapturing`](crate::CaptureMisuse::WaitingCopyWhileCapturing))
    /// while Atlas captures `stream` or the calling thread captures: a copy that waits cannot be
    /// captured. The same holds for [`copy_to`](Self::copy_to) and [`to_vec`](Self::to_vec).
    #[doc(alias = "cuMemcpyHtoDAsync_v2")]
    pub fn copy_from(&mut self, stream: &CudaStream, src: &[T]) -> Result<()> {
        from_host(stream, &DeviceSliceMut::whole(self), src)
    }

    /// Copies the buffer into `dst` on `stream` and waits for the copy to finish: as
    /// [`DeviceMemory::copy_to`](crate::DeviceMemory::copy_to).
    #[doc(alias = "cuMemcpyDtoHAsync_v2")]
    pub fn copy_to(&self, stream: &CudaStream, dst: &mut [T]) -> Result<()> {
        to_host(stream, DeviceSlice::whole(self), dst)
    }

    /// The buffer's contents in a new `Vec`, after the stream's earlier work: as
    /// [`DeviceMemory::to_vec`](crate::DeviceMemory::to_vec).
    pub fn to_vec(&self, stream: &CudaStream) -> Result<Vec<T>> {
        to_vec(stream, DeviceSlice::whole(self))
    }

    /// Enqueues a copy of `src` into the buffer on `stream` (`cuMemcpyHtoDAsync`): as
    /// [`DeviceMemoryMut::copy_from_async`](crate::DeviceMemoryMut::copy_from_async).
    ///
    /// # Safety
    ///
    /// 1. `src` must stay alive and unmodified until the copy has finished (synchronize the stream,
    ///    or an event recorded after it). From pageable memory the driver has read `src` before this
    ///    returns; from page-locked memory it reads it later.
    #[doc(alias = "cuMemcpyHtoDAsync_v2")]
    pub unsafe fn copy_from_async(&mut self, stream: &CudaStream, src: &[T]) -> Result<()> {
        // SAFETY: the caller's duty 1.
        unsafe { from_host_async(stream, &DeviceSliceMut::whole(self), src) }
    }

    /// Enqueues a copy of the buffer into `dst` on `stream` (`cuMemcpyDtoHAsync`): as
    /// [`DeviceMemory::copy_to_async`](crate::DeviceMemory::copy_to_async).
    ///
    /// # Safety
    ///
    /// 1. `dst` must stay alive and must not be read or written until the copy has finished.
    ///    Into pageable memory the driver returns only when the copy is done; into page-locked memory
    ///    it returns at once.
    #[doc(alias = "cuMemcpyDtoHAsync_v2")]
    pub unsafe fn copy_to_async(&self, stream: &CudaStream, dst: &mut [T]) -> Result<()> {
        // SAFETY: the caller's duty 1.
        unsafe { to_host_async(stream, DeviceSlice::whole(self), dst) }
    }
}

/// `Ok` when `src` is memory of `context`, else the refusal naming both devices.
pub(crate) fn check_source(
    context: CUcontext,
    src: &DeviceSlice<'_, impl DeviceCopy>,
) -> Result<()> {
    if src.context() == context {
        return Ok(());
    }
    Err(AtlasError::WrongContext {
        what: "the source".into(),
        expected: ordinal_of(context),
        given: ordinal_of(src.context()),
    })
}

/// `Ok` when a copy's two sides hold as many elements.
pub(crate) fn check_lengths(dst_len: usize, src_len: usize) -> Result<()> {
    if dst_len == src_len {
        return Ok(());
    }
    Err(AtlasError::Memory(MemoryRefusal::LengthMismatch {
        dst_len,
        src_len,
    }))
}

/// `Ok` when device memory of `len` elements and a host slice of `given` agree.
fn check_host_len<T>(what: &str, len: usize, given: usize) -> Result<()> {
    if given == len {
        return Ok(());
    }
    Err(AtlasError::SizeMismatch {
        what: format!("{what}: device memory of {len} elements and a host slice of {given}"),
        expected: len * size_of::<T>(),
        given: given * size_of::<T>(),
    })
}

/// `cuMemcpyDtoDAsync` of `src` into `dst` on `stream`, checked: see
/// [`DeviceMemoryMut::copy_from_device`](crate::DeviceMemoryMut::copy_from_device).
#[inline]
pub(crate) fn device_to_device<T: DeviceCopy>(
    stream: &CudaStream,
    dst: &DeviceSliceMut<'_, T>,
    src: DeviceSlice<'_, T>,
) -> Result<()> {
    let context = dst.context();
    check_stream(context, stream)?;
    check_source(context, &src)?;
    check_lengths(dst.len(), src.len())?;
    let bytes = bytes_of::<T>(dst.len());
    if bytes == 0 {
        return Ok(());
    }
    stream.bind_if_default()?;
    enqueue(stream, [dst.buffer(), src.buffer()], || {
        // SAFETY: both ranges lie in live allocations of the stream's context (views are
        // bounds-checked and borrow their buffers; the context is checked above), hold `bytes`,
        // and do not overlap (`dst` is borrowed mutably, so no view of its elements is `src`).
        // The memory stays allocated until the copy has run: `enqueue` makes the buffers' frees
        // wait for the device, and a graph that captures the copy keeps them.
        Ok(unsafe {
            calls::copy_device_to_device(dst.device_ptr(), src.device_ptr(), bytes, stream.raw())
        }
        .about(|| format!("{bytes} bytes"))?)
    })
}

/// Bytes of `len` elements of `T` (of memory that exists, so it fits).
pub(crate) fn bytes_of<T>(len: usize) -> usize {
    len * size_of::<T>()
}

/// `cuMemcpyHtoDAsync` of `src` into `dst`, checked but not waited for.
///
/// # Safety
///
/// 1. As [`DeviceMemoryMut::copy_from_async`](crate::DeviceMemoryMut::copy_from_async).
unsafe fn host_to_device<T: DeviceCopy>(
    stream: &CudaStream,
    dst: &DeviceSliceMut<'_, T>,
    src: &[T],
) -> Result<()> {
    check_host_len::<T>("copy to the device", dst.len(), src.len())?;
    // SAFETY: the view lies in a live allocation of its context, of which the stream is (checked
    // by the callers), and lengths match; the caller keeps `src` alive until the copy is done.
    unsafe {
        htod(
            dst.context(),
            dst.device_ptr(),
            src.as_ptr().cast(),
            size_of_val(src),
            stream.raw(),
        )
    }
}

/// `cuMemcpyDtoHAsync` of `src` into `dst`, checked but not waited for.
///
/// # Safety
///
/// 1. As [`DeviceMemory::copy_to_async`](crate::DeviceMemory::copy_to_async).
unsafe fn device_to_host<T: DeviceCopy>(
    stream: &CudaStream,
    src: DeviceSlice<'_, T>,
    dst: &mut [T],
) -> Result<()> {
    check_host_len::<T>("copy to the host", src.len(), dst.len())?;
    // SAFETY: as for `host_to_device`, with `dst` kept alive and untouched by the caller.
    unsafe {
        dtoh(
            src.context(),
            dst.as_mut_ptr().cast(),
            src.device_ptr(),
            size_of_val(dst),
            stream.raw(),
        )
    }
}

/// Copies `src` into `dst` on `stream` and waits: see
/// [`DeviceMemoryMut::copy_from`](crate::DeviceMemoryMut::copy_from)(crate::DeviceMemoryMut::copy_from).
pub(crate) fn from_host<T: DeviceCopy>(
    stream: &CudaStream,
    dst: &DeviceSliceMut<'_, T>,
    src: &[T],
) -> Result<()> {
    check_stream(dst.context(), stream)?;
    capture::refuse_waiting_copy(stream.raw())?;
    // SAFETY: the stream is synchronized before `src` is released; should a capture of it have
    // begun since the check, the synchronize invalidates it, so no graph keeps this copy.
    unsafe { host_to_device(stream, dst, src) }?;
    stream.synchronize_unchecked()
}

/// Enqueues a copy of `src` into `dst`: see
/// [`DeviceMemoryMut::copy_from_async`](crate::DeviceMemoryMut::copy_from_async).
///
/// # Safety
///
/// 1. As that method.
pub(crate) unsafe fn from_host_async<T: DeviceCopy>(
    stream: &CudaStream,
    dst: &DeviceSliceMut<'_, T>,
    src: &[T],
) -> Result<()> {
    check_stream(dst.context(), stream)?;
    // SAFETY: the caller's duty 1.
    enqueue(stream, [dst.buffer()], || unsafe {
        host_to_device(stream, dst, src)
    })
}

/// Copies `src` into `dst` on `stream` and waits: see
/// [`DeviceMemory::copy_to`](crate::DeviceMemory::copy_to).
pub(crate) fn to_host<T: DeviceCopy>(
    stream: &CudaStream,
    src: DeviceSlice<'_, T>,
    dst: &mut [T],
) -> Result<()> {
    check_stream(src.context(), stream)?;
    capture::refuse_waiting_copy(stream.raw())?;
    // SAFETY: as for `from_host`, with `dst`.
    unsafe { device_to_host(stream, src, dst) }?;
    stream.synchronize_unchecked()
}

/// Enqueues a copy of `src` into `dst`: see
/// [`DeviceMemory::copy_to_async`](crate::DeviceMemory::copy_to_async).
///
/// # Safety
///
/// 1. As that method.
pub(crate) unsafe fn to_host_async<T: DeviceCopy>(
    stream: &CudaStream,
    src: DeviceSlice<'_, T>,
    dst: &mut [T],
) -> Result<()> {
    check_stream(src.context(), stream)?;
    // SAFETY: the caller's duty 1.
    enqueue(stream, [src.buffer()], || unsafe {
        device_to_host(stream, src, dst)
    })
}

/// `src` in a new `Vec`, after the stream's earlier work.
pub(crate) fn to_vec<T: DeviceCopy>(
    stream: &CudaStream,
    src: DeviceSlice<'_, T>,
) -> Result<Vec<T>> {
    check_stream(src.context(), stream)?;
    capture::refuse_waiting_copy(stream.raw())?;
    let len = src.len();
    let mut out: Vec<T> = Vec::with_capacity(len);
    // SAFETY: `out` has room for `len` elements; the copy is complete (synchronized, and a
    // capture begun since the check is invalidated, not kept) before set_len, and every bit
    // pattern is a valid T (DeviceCopy).
    unsafe {
        dtoh(
            src.context(),
            out.as_mut_ptr().cast(),
            src.device_ptr(),
            bytes_of::<T>(len),
            stream.raw(),
        )?;
        stream.synchronize_unchecked()?;
        out.set_len(len);
    }
    Ok(out)
}
