//! Green contexts: a device's multiprocessors as resources (`cuDeviceGetDevResource`,
//! `cuGreenCtxGetDevResource`), split into groups (`cuDevSmResourceSplitByCount`), and contexts
//! and streams that run on one group (`cuDevResourceGenerateDesc`, `cuGreenCtxCreate`,
//! `cuCtxFromGreenCtx`, `cuGreenCtxStreamCreate`, `cuGreenCtxDestroy`).

use atlas_sys::{
    CUcontext, CUdevResource, CUdevResourceDesc, CUdevResourceType, CUdevice, CUgreenCtx,
    CUgreenCtxCreate_flags, CUstream, CUstream_flags,
};

use super::missing;
use crate::driver::{Result, driver};

/// The green-context entry points this driver lacks (none in drivers of CUDA 12.5 or newer).
pub(crate) fn missing_green_contexts() -> Result<Vec<&'static str>> {
    let cuda = driver()?.cuda;
    Ok(missing(&[
        (
            "cuDeviceGetDevResource",
            cuda.cuDeviceGetDevResource.is_ok(),
        ),
        (
            "cuDevSmResourceSplitByCount",
            cuda.cuDevSmResourceSplitByCount.is_ok(),
        ),
        (
            "cuDevResourceGenerateDesc",
            cuda.cuDevResourceGenerateDesc.is_ok(),
        ),
        ("cuGreenCtxCreate", cuda.cuGreenCtxCreate.is_ok()),
        ("cuGreenCtxDestroy", cuda.cuGreenCtxDestroy.is_ok()),
        ("cuCtxFromGreenCtx", cuda.cuCtxFromGreenCtx.is_ok()),
        (
            "cuGreenCtxGetDevResource",
            cuda.cuGreenCtxGetDevResource.is_ok(),
        ),
        (
            "cuGreenCtxStreamCreate",
            cuda.cuGreenCtxStreamCreate.is_ok(),
        ),
    ]))
}

/// A resource for the driver to fill in.
fn empty_resource() -> CUdevResource {
    // SAFETY: CUdevResource is plain C data (an enum number, bytes, a union of plain data), for
    // which all zeroes is a valid value (type CU_DEV_RESOURCE_TYPE_INVALID).
    unsafe { std::mem::zeroed() }
}

/// `cuDeviceGetDevResource`: every multiprocessor of `device`, as an SM resource.
pub(crate) fn device_sm_resource(device: CUdevice) -> Result<CUdevResource> {
    let mut resource = empty_resource();
    // SAFETY: `resource` is a live out-pointer of the size the driver writes; a bad device is
    // refused with a status.
    unsafe {
        call!(cuDeviceGetDevResource(
            device,
            &mut resource,
            CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM
        ))
    }?;
    Ok(resource)
}

/// `cuGreenCtxGetDevResource`: the multiprocessors `green` runs on, as an SM resource.
///
/// # Safety
///
/// 1. `green` is live.
pub(crate) unsafe fn green_sm_resource(green: CUgreenCtx) -> Result<CUdevResource> {
    let mut resource = empty_resource();
    // SAFETY: duty 1; `resource` is a live out-pointer.
    unsafe {
        call!(cuGreenCtxGetDevResource(
            green,
            &mut resource,
            CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM
        ))
    }?;
    Ok(resource)
}

/// `cuDevSmResourceSplitByCount`, no flags: up to `groups` groups of at least `min_count`
/// multiprocessors each (as the driver rounds it) taken from `input`, and what is left.
///
/// # Safety
///
/// 1. `input` is an SM resource the driver wrote (of a device, a context or a green context), not
///    one of the groups of a split.
pub(crate) unsafe fn sm_resource_split(
    input: &CUdevResource,
    groups: u32,
    min_count: u32,
) -> Result<(Vec<CUdevResource>, CUdevResource)> {
    let mut result = vec![empty_resource(); groups as usize];
    let mut made = groups;
    let mut remainder = empty_resource();
    // SAFETY: duty 1; `result` has room for `made` resources, which the driver writes at most;
    // `remainder` is a live out-pointer.
    unsafe {
        call!(cuDevSmResourceSplitByCount(
            result.as_mut_ptr(),
            &mut made,
            input,
            &mut remainder,
            0,
            min_count
        ))
    }?;
    result.truncate(made as usize);
    Ok((result, remainder))
}

/// `cuDevResourceGenerateDesc` of one resource.
///
/// # Safety
///
/// 1. `resource` was written by the driver.
pub(crate) unsafe fn resource_desc(resource: &CUdevResource) -> Result<CUdevResourceDesc> {
    let mut copy = *resource;
    let mut desc: CUdevResourceDesc = std::ptr::null_mut();
    // SAFETY: duty 1; one resource at a live address, `desc` a live out-pointer.
    unsafe { call!(cuDevResourceGenerateDesc(&mut desc, &mut copy, 1)) }?;
    Ok(desc)
}

/// `cuGreenCtxCreate` on `device` with the resources of `desc`, with a default stream (which the
/// driver requires).
///
/// # Safety
///
/// 1. `desc` was made by [`resource_desc`] from resources of `device`.
pub(crate) unsafe fn green_create(desc: CUdevResourceDesc, device: CUdevice) -> Result<CUgreenCtx> {
    let mut green: CUgreenCtx = std::ptr::null_mut();
    let flags = CUgreenCtxCreate_flags::CU_GREEN_CTX_DEFAULT_STREAM.0;
    // SAFETY: duty 1; `green` is a live out-pointer.
    unsafe { call!(cuGreenCtxCreate(&mut green, desc, device, flags)) }?;
    Ok(green)
}

/// `cuGreenCtxDestroy`.
///
/// # Safety
///
/// 1. `green` is live, destroyed once, here, and nothing uses it (or a stream of it) afterwards.
pub(crate) unsafe fn green_destroy(green: CUgreenCtx) -> Result<()> {
    // SAFETY: duty 1.
    unsafe { call!(cuGreenCtxDestroy(green)) }
}

/// `cuCtxFromGreenCtx`: the context handle of `green`.
///
/// # Safety
///
/// 1. `green` is live.
pub(crate) unsafe fn context_of_green(green: CUgreenCtx) -> Result<CUcontext> {
    let mut context: CUcontext = std::ptr::null_mut();
    // SAFETY: duty 1; `context` is a live out-pointer.
    unsafe { call!(cuCtxFromGreenCtx(&mut context, green)) }?;
    Ok(context)
}

/// `cuGreenCtxStreamCreate`: a non-blocking stream (the only kind the driver makes there) of
/// `green`, with `priority`.
///
/// # Safety
///
/// 1. `green` is live.
pub(crate) unsafe fn green_stream_create(green: CUgreenCtx, priority: i32) -> Result<CUstream> {
    let mut stream: CUstream = std::ptr::null_mut();
    let flags = CUstream_flags::CU_STREAM_NON_BLOCKING.0;
    // SAFETY: duty 1; `stream` is a live out-pointer.
    unsafe { call!(cuGreenCtxStreamCreate(&mut stream, green, flags, priority)) }?;
    Ok(stream)
}
