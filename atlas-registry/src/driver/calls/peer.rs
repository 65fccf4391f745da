//! Peer access between devices: `cuDeviceCanAccessPeer`, `cuCtxEnablePeerAccess`.

use atlas_sys::{CUcontext, CUdevice, CUresult};

use crate::driver::{Result, check, driver};

/// `cuDeviceCanAccessPeer`: whether `device` can reach `peer`'s memory directly.
pub(crate) fn can_access_peer(device: CUdevice, peer: CUdevice) -> Result<bool> {
    let mut can = 0;
    // SAFETY: `can` is a live out-pointer; bad devices are refused with a status.
    unsafe { call!(cuDeviceCanAccessPeer(&mut can, device, peer)) }?;
    Ok(can != 0)
}

/// `cuCtxEnablePeerAccess`: lets the current context reach `peer`'s memory directly. Access that is
/// already enabled (`CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED`) is success.
///
/// # Safety
///
/// 1. `peer` is a live context, and the context to enable access from is current (and is not
///    `peer`).
pub(crate) unsafe fn enable_peer_access(peer: CUcontext) -> Result<()> {
    let f = atlas_sys::resolve(
        &driver()?.cuda.cuCtxEnablePeerAccess,
        "cuCtxEnablePeerAccess",
    )
    .map_err(crate::driver::Error::Missing)?;
    // SAFETY: duty 1; the flags must be 0.
    match unsafe { f(peer, 0) } {
        CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(()),
        status => check(status, "cuCtxEnablePeerAccess"),
    }
}
