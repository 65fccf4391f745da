//! Events, stream order and host functions: `cuEvent*`, `cuStreamWaitEvent`, `cuLaunchHostFunc`.

use std::ffi::c_void;

use atlas_sys::{CUevent, CUresult, CUstream};

use crate::driver::{Result, check, driver};

/// `cuEventCreate` with `flags` (`CU_EVENT_*`), in the current context.
///
/// # Safety
///
/// 1. The context the event is meant for is current on the calling thread.
pub(crate) unsafe fn event_create(flags: u32) -> Result<CUevent> {
    let mut event: CUevent = std::ptr::null_mut();
    // SAFETY: `event` is a live out-pointer; the context is current (duty 1).
    unsafe { call!(cuEventCreate(&mut event, flags)) }?;
    Ok(event)
}

/// `cuEventDestroy_v2`.
///
/// # Safety
///
/// 1. `event` is live and destroyed only here, once.
pub(crate) unsafe fn event_destroy(event: CUevent) -> Result<()> {
    // SAFETY: duty 1.
    unsafe { call!(cuEventDestroy_v2(event)) }
}

/// `cuEventRecord`: one driver call.
///
/// # Safety
///
/// 1. `event` is live; `stream` is a live stream of the event's context, or a default stream handle
///    with that context current.
#[inline]
pub(crate) unsafe fn event_record(event: CUevent, stream: CUstream) -> Result<()> {
    // SAFETY: duty 1.
    unsafe { call!(cuEventRecord(event, stream)) }
}

/// `cuStreamWaitEvent`, no flags: one driver call. The event may be of another context (device).
///
/// # Safety
///
/// 1. `stream` is a live stream (or a default stream handle with its context current) and `event`
///    a live event.
#[inline]
pub(crate) unsafe fn stream_wait_event(stream: CUstream, event: CUevent) -> Result<()> {
    // SAFETY: duty 1.
    unsafe { call!(cuStreamWaitEvent(stream, event, 0)) }
}

/// `cuEventQuery`: `true` when the work before the event's last record has finished (or it was
/// never recorded), `false` while it runs (`CUDA_ERROR_NOT_READY`).
///
/// # Safety
///
/// 1. `event` is live.
pub(crate) unsafe fn event_query(event: CUevent) -> Result<bool> {
    let f = atlas_sys::resolve(&driver()?.cuda.cuEventQuery, "cuEventQuery")
        .map_err(crate::driver::Error::Missing)?;
    // SAFETY: duty 1.
    match unsafe { f(event) } {
        CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        status => check(status, "cuEventQuery").map(|()| true),
    }
}

/// `cuEventSynchronize`.
///
/// # Safety
///
/// 1. `event` is live.
pub(crate) unsafe fn event_synchronize(event: CUevent) -> Result<()> {
    // SAFETY: duty 1.
    unsafe { call!(cuEventSynchronize(event)) }
}

/// `cuEventElapsedTime_v2` (CUDA 12.8+), else `cuEventElapsedTime`: milliseconds from `start` to
/// `end`.
///
/// # Safety
///
/// 1. `start` and `end` are live events.
pub(crate) unsafe fn event_elapsed_ms(start: CUevent, end: CUevent) -> Result<f32> {
    let cuda = &driver()?.cuda;
    let mut ms = 0f32;
    if cuda.cuEventElapsedTime_v2.is_ok() {
        // SAFETY: duty 1; `ms` is a live out-pointer.
        unsafe { call!(cuEventElapsedTime_v2(&mut ms, start, end)) }?;
    } else {
        // SAFETY: as above.
        unsafe { call!(cuEventElapsedTime(&mut ms, start, end)) }?;
    }
    Ok(ms)
}

/// `cuLaunchHostFunc`: `host(data)` runs on a driver thread once the stream reaches this point
/// (captured: at that point of every replay).
///
/// # Safety
///
/// 1. `stream` is a live stream, or a default stream handle with its context current.
/// 2. `host` may be called with `data` from another thread, once per time the stream (or a replay
///    of a graph capturing it) reaches it; it makes no CUDA call and does not unwind.
pub(crate) unsafe fn launch_host_func(
    stream: CUstream,
    host: unsafe extern "C" fn(*mut c_void),
    data: *mut c_void,
) -> Result<()> {
    // SAFETY: duties 1 and 2.
    unsafe { call!(cuLaunchHostFunc(stream, Some(host), data)) }
}
