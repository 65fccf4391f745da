//! Copies between device addresses and fills of device memory: `cuMemcpyDtoDAsync`,
//! `cuMemcpyPeerAsync`, `cuMemcpy2DAsync`, `cuMemsetD8/16/32Async`. Each is one driver call,
//! enqueued on a stream (capturable).

use std::ffi::c_void;

use atlas_sys::{CUDA_MEMCPY2D, CUcontext, CUdeviceptr, CUmemorytype, CUstream};

use crate::driver::Result;

/// `cuMemcpyDtoDAsync_v2`: `bytes` from `src` to `dst`.
///
/// # Safety
///
/// 1. `dst` and `src` each lie in allocated device memory with room for `bytes`, and do not
///    overlap.
/// 2. `stream` is a live stream (or a default stream handle with its context current) of the
///    context whose work may touch both: the copy runs there.
/// 3. Both stay allocated until the copy has run.
#[inline]
pub(crate) unsafe fn copy_device_to_device(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> Result<()> {
    // SAFETY: duties 1–3.
    unsafe { call!(cuMemcpyDtoDAsync_v2(dst, src, bytes, stream)) }
}

/// `cuMemcpyPeerAsync`: `bytes` from `src` (memory of `src_context`) to `dst` (memory of
/// `dst_context`). Without peer access between the two devices the driver stages the copy through
/// host memory.
///
/// # Safety
///
/// 1. `dst` lies in allocated memory of `dst_context` with room for `bytes`, `src` in allocated
///    memory of `src_context` holding `bytes`; both contexts are live.
/// 2. `stream` is a live stream (or a default stream handle with its context current).
/// 3. Both stay allocated until the copy has run.
#[inline]
pub(crate) unsafe fn copy_peer(
    dst: CUdeviceptr,
    dst_context: CUcontext,
    src: CUdeviceptr,
    src_context: CUcontext,
    bytes: usize,
    stream: CUstream,
) -> Result<()> {
    // SAFETY: duties 1–3.
    unsafe {
        call!(cuMemcpyPeerAsync(
            dst,
            dst_context,
            src,
            src_context,
            bytes,
            stream
        ))
    }
}

/// One side of a 2D copy: device memory, or host memory.
#[derive(Clone, Copy)]
pub(crate) enum Side2d {
    /// A device address.
    Device(CUdeviceptr),
    /// A host address: read for a source, written for a destination.
    Host(*mut c_void),
}

/// The rows of a 2D copy in bytes: `height` rows of `width` bytes, each side's rows `pitch`
/// bytes apart.
#[derive(Clone, Copy)]
pub(crate) struct Rows {
    pub(crate) width: usize,
    pub(crate) height: usize,
    pub(crate) src_pitch: usize,
    pub(crate) dst_pitch: usize,
}

/// `cuMemcpy2DAsync_v2`: `rows.height` rows of `rows.width` bytes from `src` to `dst`, each
/// side's rows `rows.*_pitch` bytes apart.
///
/// # Safety
///
/// 1. For each side, the bytes `row * pitch .. row * pitch + width` of every row lie in memory of
///    that kind (device memory allocated in the stream's context, or host memory readable for the
///    source and writable for the destination); the two sides do not overlap.
/// 2. `stream` is a live stream (or a default stream handle with its context current).
/// 3. Both stay allocated (and host memory unused by anything else) until the copy has run.
#[inline]
pub(crate) unsafe fn copy_2d(dst: Side2d, src: Side2d, rows: Rows, stream: CUstream) -> Result<()> {
    // SAFETY: every field is plain data; the pointers are zero, and the memory types set, below.
    let mut params: CUDA_MEMCPY2D = unsafe { std::mem::zeroed() };
    match src {
        Side2d::Device(ptr) => {
            params.srcMemoryType = CUmemorytype::CU_MEMORYTYPE_DEVICE;
            params.srcDevice = ptr;
        }
        Side2d::Host(ptr) => {
            params.srcMemoryType = CUmemorytype::CU_MEMORYTYPE_HOST;
            params.srcHost = ptr;
        }
    }
    match dst {
        Side2d::Device(ptr) => {
            params.dstMemoryType = CUmemorytype::CU_MEMORYTYPE_DEVICE;
            params.dstDevice = ptr;
        }
        Side2d::Host(ptr) => {
            params.dstMemoryType = CUmemorytype::CU_MEMORYTYPE_HOST;
            params.dstHost = ptr;
        }
    }
    params.srcPitch = rows.src_pitch;
    params.dstPitch = rows.dst_pitch;
    params.WidthInBytes = rows.width;
    params.Height = rows.height;
    // SAFETY: duties 1–3; `params` lives through the call, which copies it.
    unsafe { call!(cuMemcpy2DAsync_v2(&params, stream)) }
}

/// The value of a fill, by width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FillValue {
    /// `cuMemsetD8Async`.
    U8(u8),
    /// `cuMemsetD16Async`: the address is 2-byte aligned.
    U16(u16),
    /// `cuMemsetD32Async`: the address is 4-byte aligned.
    U32(u32),
}

impl FillValue {
    /// The width of one value in bytes.
    pub(crate) fn width(self) -> usize {
        match self {
            Self::U8(_) => 1,
            Self::U16(_) => 2,
            Self::U32(_) => 4,
        }
    }
}

/// `cuMemsetD8Async`, `cuMemsetD16Async` or `cuMemsetD32Async`: `count` values at `dst`.
///
/// # Safety
///
/// 1. `dst` lies in allocated device memory with room for `count` values, aligned to their width.
/// 2. `stream` is a live stream of that memory's context (or a default stream handle with it
///    current).
/// 3. The memory stays allocated until the fill has run.
#[inline]
pub(crate) unsafe fn fill(
    dst: CUdeviceptr,
    value: FillValue,
    count: usize,
    stream: CUstream,
) -> Result<()> {
    // SAFETY: duties 1–3.
    unsafe {
        match value {
            FillValue::U8(v) => call!(cuMemsetD8Async(dst, v, count, stream)),
            FillValue::U16(v) => call!(cuMemsetD16Async(dst, v, count, stream)),
            FillValue::U32(v) => call!(cuMemsetD32Async(dst, v, count, stream)),
        }
    }
}
