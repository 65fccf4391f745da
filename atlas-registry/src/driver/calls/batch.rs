//! Batched copies: `cuMemcpyBatchAsync` (drivers of CUDA 12.8 or newer), many copies between
//! addresses of the unified address space (device memory, page-locked or pageable host memory)
//! enqueued on a stream in one call.
//!
//! The entry point is the one the bindings declare (CUDA 12.9's `cuda.h`), looked up by the
//! symbol `cuMemcpyBatchAsync`, whose last arguments are `failIdx` and the stream. CUDA 13.0's
//! header maps the name to `cuMemcpyBatchAsync_v2`, another signature (no `failIdx`); drivers
//! keep exporting the older symbol for programs built against the 12.8 and 12.9 headers.

use atlas_sys::{
    CUdeviceptr, CUmemLocation, CUmemLocationType, CUmemcpyAttributes, CUmemcpySrcAccessOrder,
    CUstream,
};

use crate::driver::{Error, Result, check, driver};

/// `Ok` when the driver has `cuMemcpyBatchAsync`, else [`Error::Missing`] naming it.
pub(crate) fn require_batch_copy_entry_point() -> Result<()> {
    let cuda = driver()?.cuda;
    atlas_sys::entry!(cuda, cuMemcpyBatchAsync)
        .map(drop)
        .map_err(Error::Missing)
}

/// A batch the driver did not take: the failure, and the index of the copy it concerns when the
/// driver names one (`failIdx`).
pub(crate) struct BatchFailure {
    /// The failed call.
    pub(crate) error: Error,
    /// The copy the failure concerns, in the order of the arrays; `None` when the failure does
    /// not pertain to one copy (the driver's `SIZE_MAX`).
    pub(crate) index: Option<usize>,
}

/// No location: the hint of a copy side that is not managed memory, where the driver ignores it.
const NO_HINT: CUmemLocation = CUmemLocation {
    type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_INVALID,
    id: 0,
};

/// `cuMemcpyBatchAsync`: copy `i` moves `sizes[i]` bytes from `srcs[i]` to `dsts[i]`. One set of
/// attributes for all: sources read in stream order (`CU_MEMCPY_SRC_ACCESS_ORDER_STREAM`), no
/// location hints (they concern managed memory only), `flags` (`CU_MEMCPY_FLAG_*`). One driver
/// call. The copies of a batch run in no set order among themselves; the batch as a whole runs
/// in the stream's order.
///
/// # Safety
///
/// 1. The three slices have the same length, at least 1, and every size is more than 0 (the
///    driver refuses a zero size).
/// 2. Every `srcs[i]` holds `sizes[i]` readable bytes and every `dsts[i]` room for `sizes[i]`
///    writable ones: device memory of the stream's context, or host memory; each stays allocated
///    (and host memory untouched by the host where a copy writes it, unwritten where it reads it)
///    until the copies have run.
/// 3. No copy's destination overlaps another copy's destination or any copy's source.
/// 4. `stream` is a live stream, or `CU_STREAM_PER_THREAD` with its context current; never the
///    legacy default stream (null or `CU_STREAM_LEGACY`), which the driver refuses.
#[inline]
pub(crate) unsafe fn copy_batch(
    dsts: &mut [CUdeviceptr],
    srcs: &mut [CUdeviceptr],
    sizes: &mut [usize],
    flags: u32,
    stream: CUstream,
) -> std::result::Result<(), BatchFailure> {
    let failed = |error| BatchFailure { error, index: None };
    let cuda = driver().map_err(failed)?.cuda;
    let batch = atlas_sys::resolve(&cuda.cuMemcpyBatchAsync, "cuMemcpyBatchAsync")
        .map_err(|e| failed(Error::Missing(e)))?;
    let mut attributes = CUmemcpyAttributes {
        srcAccessOrder: CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
        srcLocHint: NO_HINT,
        dstLocHint: NO_HINT,
        flags,
    };
    // The attributes apply from copy 0 on, to every copy.
    let mut first_copy = 0usize;
    let mut fail_index = usize::MAX;
    let count = dsts.len();
    // SAFETY: duties 1–4; the arrays hold `count` entries each (duty 1) and are only read by the
    // driver, which takes them as mutable pointers; one attribute set and its start index, and
    // `fail_index`, are live for the call.
    let status = unsafe {
        batch(
            dsts.as_mut_ptr(),
            srcs.as_mut_ptr(),
            sizes.as_mut_ptr(),
            count,
            &mut attributes,
            &mut first_copy,
            1,
            &mut fail_index,
            stream,
        )
    };
    check(status, "cuMemcpyBatchAsync").map_err(|error| BatchFailure {
        error,
        index: (fail_index < count).then_some(fail_index),
    })
}
