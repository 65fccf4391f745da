//! Memory of one device reached from another: peer access ([`CudaContext::can_access_peer`],
//! [`CudaContext::enable_peer_access`]) and copies between devices (`cuMemcpyPeerAsync`).
//!
//! A copy between devices works whether or not peer access is enabled: without it the driver
//! stages the copy through host memory (two transfers over PCIe and a host buffer); with it the
//! copy engine moves the bytes directly between the devices, over NVLink where they have it, and
//! kernels of one device may read and write the other's memory. Access is one-way: enabling it
//! from device 0 to device 1 lets device 0 reach device 1's memory, not the reverse.

use atlas_sys::CUresult;

use crate::device::capture;
use crate::device::context::CudaContext;
use crate::device::stream::CudaStream;
use crate::driver::{self, About, calls};
use crate::error::{AtlasError, Result};
use crate::memory::buffer::{DeviceCopy, check_stream, enqueue};
use crate::memory::copy::{bytes_of, check_lengths};
use crate::memory::view::{DeviceSlice, DeviceSliceMut};

impl CudaContext {
    /// Whether this context's device can access `peer`'s device's memory directly
    /// (`cuDeviceCanAccessPeer`): whether [`enable_peer_access`](Self::enable_peer_access) can
    /// succeed. A device always reaches its own memory (`true`, without asking the driver).
    #[doc(alias = "cuDeviceCanAccessPeer")]
    pub fn can_access_peer(&self, peer: &CudaContext) -> Result<bool> {
        if self.device() == peer.device() {
            return Ok(true);
        }
        Ok(calls::can_access_peer(self.device(), peer.device())
            .about(|| format!("device {} to device {}", self.ordinal(), peer.ordinal()))?)
    }

    /// Lets this context's device access `peer`'s device's memory directly
    /// (`cuCtxEnablePeerAccess`, with this context made current): copies from `peer`'s memory
    /// into this device's ([`DeviceMemoryMut::copy_from_peer`](crate::DeviceMemoryMut::copy_from_peer))
    /// then go directly between the devices instead of through host memory, and this device's
    /// kernels may use `peer`'s memory. Access is one-way; enable it from `peer` too for the other
    /// direction. It lasts for the process.
    ///
    /// Idempotent: access already enabled (by Atlas or anyone else) is `Ok`, and so is a device
    /// and itself. Devices that cannot reach each other
    /// ([`can_access_peer`](Self::can_access_peer) is `false`) are refused with
    /// [`AtlasError::PeerAccessUnsupported`], naming both, before anything is changed.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn f() -> atlas_registry::Result<()> {
    /// use atlas_registry::{AtlasError, host};
    /// let (gpu0, gpu1) = (host(0)?, host(1)?);
    /// match gpu0.context().enable_peer_access(gpu1.context()) {
    ///     Ok(()) => println!("device 0 reads device 1's memory directly"),
    ///     Err(AtlasError::PeerAccessUnsupported { .. }) => println!("copies go through the host"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuCtxEnablePeerAccess")]
    pub fn enable_peer_access(&self, peer: &CudaContext) -> Result<()> {
        if self.device() == peer.device() {
            return Ok(());
        }
        let unsupported = || AtlasError::PeerAccessUnsupported {
            device: self.ordinal(),
            peer: peer.ordinal(),
        };
        if !self.can_access_peer(peer)? {
            return Err(unsupported());
        }
        self.bind()?;
        // SAFETY: `peer` is a primary context Atlas retained (live for the process), of another
        // device than this context, which is current (above).
        match unsafe { calls::enable_peer_access(peer.raw()) } {
            Ok(()) => Ok(()),
            Err(driver::Error::Failed(failure))
                if failure.code == CUresult::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED.0 =>
            {
                Err(unsupported())
            }
            Err(e) => Err(e
                .about(|| format!("device {} to device {}", self.ordinal(), peer.ordinal()))
                .into()),
        }
    }
}

/// Checks a copy of `src` into `dst` on `stream` between devices: the stream of `dst`'s context,
/// equal lengths. The bytes to copy.
fn check<T: DeviceCopy>(
    stream: &CudaStream,
    dst: &DeviceSliceMut<'_, T>,
    src: &DeviceSlice<'_, T>,
) -> Result<usize> {
    check_stream(dst.context(), stream)?;
    check_lengths(dst.len(), src.len())?;
    Ok(bytes_of::<T>(dst.len()))
}

/// `cuMemcpyPeerAsync` of `src` into `dst` on `stream`, checked (`bytes` of them).
///
/// # Safety
///
/// 1. As [`copy_async`]'s duty 1.
unsafe fn enqueue_checked<T: DeviceCopy>(
    stream: &CudaStream,
    dst: &DeviceSliceMut<'_, T>,
    src: &DeviceSlice<'_, T>,
    bytes: usize,
) -> Result<()> {
    stream.bind_if_default()?;
    enqueue(stream, [dst.buffer(), src.buffer()], || {
        // SAFETY: each view lies in a live allocation of its buffer's context (bounds-checked
        // views; primary contexts Atlas retained), both hold `bytes` (lengths checked), and they
        // do not overlap (`dst` is borrowed mutably). The stream is of `dst`'s context (checked).
        // `dst` stays allocated until the copy has run (`enqueue` makes its buffer's free wait for
        // its device, whose stream runs the copy); `src` does by the caller's duty 1, or, captured,
        // because the graph keeps it.
        Ok(unsafe {
            calls::copy_peer(
                dst.device_ptr(),
                dst.context(),
                src.device_ptr(),
                src.context(),
                bytes,
                stream.raw(),
            )
        }
        .about(|| format!("{bytes} bytes"))?)
    })
}

/// Copies `src` into `dst` on `stream` and waits: see
/// [`DeviceMemoryMut::copy_from_peer`](crate::DeviceMemoryMut::copy_from_peer).
pub(crate) fn copy_waiting<T: DeviceCopy>(
    stream: &CudaStream,
    dst: &DeviceSliceMut<'_, T>,
    src: DeviceSlice<'_, T>,
) -> Result<()> {
    let bytes = check(stream, dst, &src)?;
    capture::refuse_waiting_copy(stream.raw())?;
    if bytes == 0 {
        return Ok(());
    }
    // SAFETY: `src` is borrowed until the copy has finished: the stream is synchronized before
    // returning, and a capture begun since the check is invalidated by it, not kept.
    unsafe { enqueue_checked(stream, dst, &src, bytes) }?;
    stream.synchronize_unchecked()
}

/// Enqueues a copy of `src` into `dst` on `stream`: see
/// [`DeviceMemoryMut::copy_from_peer_async`](crate::DeviceMemoryMut::copy_from_peer_async).
///
/// # Safety
///
/// 1. Unless the copy is captured, `src`'s buffer stays allocated until the copy has finished.
pub(crate) unsafe fn copy_async<T: DeviceCopy>(
    stream: &CudaStream,
    dst: &DeviceSliceMut<'_, T>,
    src: DeviceSlice<'_, T>,
) -> Result<()> {
    let bytes = check(stream, dst, &src)?;
    if bytes == 0 {
        return Ok(());
    }
    // SAFETY: the caller's duty 1.
    unsafe { enqueue_checked(stream, dst, &src, bytes) }
}
