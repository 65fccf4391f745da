//! [`DeviceMemory`] and [`DeviceMemoryMut`]: device memory holding `T`s, a [`DeviceBuffer`] or a
//! view of part of one, and the one door of every view, copy and fill of it.
//!
//! Both traits are sealed (Atlas implements them for its buffer and views alone), so a copy or a
//! fill always acts on memory whose address, length and context Atlas knows. Each operation is
//! written once, here, for all three types; the work is done in `copy`, `pitched`, `fill` and
//! `peer`.

use std::ops::RangeBounds;

use atlas_sys::CUdeviceptr;

use crate::device::stream::CudaStream;
use crate::error::Result;
use crate::memory::buffer::{DeviceBuffer, DeviceCopy};
use crate::memory::copy;
use crate::memory::fill::{self, FillValue};
use crate::memory::peer;
use crate::memory::pitched::{self, Copy2d};
use crate::memory::view::{DeviceChunks, DeviceChunksMut, DeviceSlice, DeviceSliceMut};
use crate::memory::virtual_memory::GrowableBuffer;

mod sealed {
    /// Implemented by [`DeviceBuffer`](crate::DeviceBuffer), [`DeviceSlice`](crate::DeviceSlice),
    /// [`DeviceSliceMut`](crate::DeviceSliceMut) and [`GrowableBuffer`](crate::GrowableBuffer)
    /// only.
    pub trait Sealed {}
}

impl<T: DeviceCopy> sealed::Sealed for DeviceBuffer<T> {}
impl<T: DeviceCopy> sealed::Sealed for DeviceSlice<'_, T> {}
impl<T: DeviceCopy> sealed::Sealed for DeviceSliceMut<'_, T> {}
impl<T: DeviceCopy> sealed::Sealed for GrowableBuffer<T> {}

/// Device memory holding `T`s that can be read: a [`DeviceBuffer`], a [`DeviceSlice`], a
/// [`DeviceSliceMut`] or a [`GrowableBuffer`]. Sealed.
///
/// Its methods make read-only views ([`range`](Self::range), [`split_at`](Self::split_at),
/// [`chunks`](Self::chunks)) and copy the memory to the host (waiting, or `unsafe` and enqueued).
/// Copies into device memory take any `DeviceMemory` as their source (see
/// [`DeviceMemoryMut`]). Every stream given must be of the memory's context
/// ([`AtlasError::WrongContext`](crate::AtlasError::WrongContext) otherwise, before the driver
/// is called).
///
/// # Examples
///
/// ```no_run
/// # fn f(registry: &atlas_registry::AtlasRegistry) -> atlas_registry::Result<()> {
/// use atlas_registry::{DeviceBuffer, DeviceMemory};
/// let stream = registry.stream();
/// let x = DeviceBuffer::from_slice(registry.ctx(), stream, &[1u16, 2, 3, 4, 5])?;
/// let tail = x.range(2..)?;
/// let mut host = [0u16; 3];
/// tail.copy_to(stream, &mut host)?; // waits for the copy
/// assert_eq!(host, [3, 4, 5]);
/// # Ok(()) }
/// ```
pub trait DeviceMemory<T: DeviceCopy>: sealed::Sealed {
    /// The whole memory as a read-only view.
    fn as_slice(&self) -> DeviceSlice<'_, T>;

    /// Number of elements.
    fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// Whether there are no elements.
    fn is_empty(&self) -> bool {
        self.as_slice().is_empty()
    }

    /// The device address of the first element.
    fn device_ptr(&self) -> CUdeviceptr {
        self.as_slice().device_ptr()
    }

    /// A read-only view of the elements `range`. A range past the end, or one that ends before
    /// it starts, is refused ([`MemoryRefusal::OutOfRange`](crate::MemoryRefusal::OutOfRange),
    /// naming the range and the length).
    fn range(&self, range: impl RangeBounds<usize>) -> Result<DeviceSlice<'_, T>> {
        self.as_slice().range(range)
    }

    /// Read-only views of the elements `..mid` and `mid..`; `mid` past the end is refused.
    fn split_at(&self, mid: usize) -> Result<(DeviceSlice<'_, T>, DeviceSlice<'_, T>)> {
        self.as_slice().split_at(mid)
    }

    /// Read-only views of consecutive chunks of `size` elements (the last one shorter when
    /// `size` does not divide the length); a size of 0 is refused.
    fn chunks(&self, size: usize) -> Result<DeviceChunks<'_, T>> {
        self.as_slice().chunks(size)
    }

    /// Copies the memory into `dst` on `stream` and waits for the copy to finish.
    ///
    /// `dst` must have the same length ([`AtlasError::SizeMismatch`](crate::AtlasError::SizeMismatch)).
    /// Refused before anything is enqueued
    /// ([`CaptureMisuse::WaitingCopyWhileCapturing`](crate::CaptureMisuse::WaitingCopyWhileCapturing))
    /// while Atlas captures `stream` or the calling thread captures: a copy that waits cannot be
    /// captured. The same holds for [`to_vec`](Self::to_vec) and [`copy_2d_to_host`](Self::copy_2d_to_host).
    #[doc(alias = "cuMemcpyDtoHAsync_v2")]
    fn copy_to(&self, stream: &CudaStream, dst: &mut [T]) -> Result<()> {
        copy::to_host(stream, self.as_slice(), dst)
    }

    /// The memory's contents in a new `Vec`, after the stream's earlier work.
    fn to_vec(&self, stream: &CudaStream) -> Result<Vec<T>> {
        copy::to_vec(stream, self.as_slice())
    }

    /// Enqueues a copy of the memory into `dst` on `stream` (`cuMemcpyDtoHAsync`).
    ///
    /// # Safety
    ///
    /// 1. `dst` must stay alive and must not be read or written until the copy has finished.
    ///    Into pageable memory the driver returns only when the copy is done; into page-locked
    ///    memory, or under capture, it returns at once.
    #[doc(alias = "cuMemcpyDtoHAsync_v2")]
    unsafe fn copy_to_async(&self, stream: &CudaStream, dst: &mut [T]) -> Result<()> {
        // SAFETY: the caller's duty 1.
        unsafe { copy::to_host_async(stream, self.as_slice(), dst) }
    }

    /// Copies the rows `shape` describes from this memory into `dst`, on `stream`, and waits
    /// for the copy (`cuMemcpy2DAsync`): `shape.height` rows of `shape.width` elements, this
    /// memory's rows `shape.src_pitch` elements apart and `dst`'s `shape.dst_pitch` apart.
    ///
    /// Both sides are checked as for [`DeviceMemoryMut::copy_2d_from_device`]; waiting, it is
    /// refused while a capture would take it in (as [`copy_to`](Self::copy_to)).
    #[doc(alias = "cuMemcpy2DAsync_v2")]
    fn copy_2d_to_host(&self, stream: &CudaStream, dst: &mut [T], shape: Copy2d) -> Result<()> {
        pitched::to_host(stream, self.as_slice(), dst, shape)
    }
}

/// Device memory holding `T`s that can be written: a [`DeviceBuffer`], a [`DeviceSliceMut`] or a
/// [`GrowableBuffer`]. Sealed.
///
/// Its methods make views that may be written ([`range_mut`](Self::range_mut),
/// [`split_at_mut`](Self::split_at_mut), [`chunks_mut`](Self::chunks_mut)), copy into the memory
/// (from device memory of the same device or of another, from the host, in rows of a pitched
/// layout) and fill it. Each is checked before the driver is called: the stream belongs to the
/// memory's context, the source to the same context (but for peer copies), lengths agree, ranges
/// and rows lie in the memory, a fill's width fits the memory.
///
/// The copies from device memory and the fills are enqueued on the stream, each one driver
/// call, and can be captured into a graph through a [`&Capture`](crate::Capture): the graph then
/// keeps the allocations of the buffers they touch, as it does for a typed launch. Memory that
/// enqueued work touches stays allocated until that work has run, whatever the caller drops (see
/// [`DeviceBuffer`]). Source and destination never overlap: the destination is borrowed mutably,
/// so no view of the same elements can be the source:
///
/// ```compile_fail
/// # fn f(x: &mut atlas_registry::DeviceBuffer<f32>, stream: &atlas_registry::CudaStream) -> atlas_registry::Result<()> {
/// use atlas_registry::DeviceMemoryMut;
/// x.copy_from_device(stream, &*x)?; // refused: `x` is borrowed mutably and immutably at once
/// # Ok(()) }
/// ```
///
/// ```compile_fail
/// # fn f(x: &mut atlas_registry::DeviceBuffer<f32>, stream: &atlas_registry::CudaStream) -> atlas_registry::Result<()> {
/// use atlas_registry::{DeviceMemory, DeviceMemoryMut};
/// let mut high = x.range_mut(8..)?;
/// let overlapping = x.range(..16)?; // refused: `x` is borrowed mutably by `high`
/// high.copy_from_device(stream, &overlapping.range(..8)?)?;
/// # Ok(()) }
/// ```
///
/// Two halves of one buffer ([`split_at_mut`](Self::split_at_mut)) are disjoint, and may be
/// copied into each other.
///
/// # Examples
///
/// ```no_run
/// # fn f(registry: &atlas_registry::AtlasRegistry) -> atlas_registry::Result<()> {
/// use atlas_registry::{DeviceBuffer, DeviceMemory, DeviceMemoryMut};
/// let (ctx, stream) = (registry.ctx(), registry.stream());
/// let x = DeviceBuffer::from_slice(ctx, stream, &[1.5f32; 1024])?;
/// let mut y = DeviceBuffer::<f32>::zeroed(ctx, stream, 4096)?; // zero in stream order
/// y.range_mut(1024..2048)?.copy_from_device(stream, &x)?; // one cuMemcpyDtoDAsync
/// y.range_mut(3072..)?.fill(stream, 7.0)?; // one cuMemsetD32Async
/// let back = y.to_vec(stream)?;
/// assert!(back[..1024].iter().all(|&v| v == 0.0));
/// assert!(back[1024..2048].iter().all(|&v| v == 1.5));
/// assert!(back[3072..].iter().all(|&v| v == 7.0));
/// # Ok(()) }
/// ```
pub trait DeviceMemoryMut<T: DeviceCopy>: DeviceMemory<T> {
    /// The whole memory as a view that may be written.
    fn as_slice_mut(&mut self) -> DeviceSliceMut<'_, T>;

    /// A view of the elements `range` that may be written. A range past the end, or one that
    /// ends before it starts, is refused
    /// ([`MemoryRefusal::OutOfRange`](crate::MemoryRefusal::OutOfRange)).
    fn range_mut(&mut self, range: impl RangeBounds<usize>) -> Result<DeviceSliceMut<'_, T>> {
        self.as_slice_mut().range_mut(range)
    }

    /// Views of the elements `..mid` and `mid..` that may be written at once (copied into each
    /// other, given to one kernel); `mid` past the end is refused.
    fn split_at_mut(
        &mut self,
        mid: usize,
    ) -> Result<(DeviceSliceMut<'_, T>, DeviceSliceMut<'_, T>)> {
        self.as_slice_mut().split_at_mut(mid)
    }

    /// Views of consecutive chunks of `size` elements that may be written at once (the last one
    /// shorter when `size` does not divide the length); a size of 0 is refused.
    fn chunks_mut(&mut self, size: usize) -> Result<DeviceChunksMut<'_, T>> {
        self.as_slice_mut().chunks_mut(size)
    }

    /// Enqueues a copy of `src`, device memory of the same context, into this memory on
    /// `stream` (`cuMemcpyDtoDAsync`): one driver call, capturable.
    ///
    /// Refused before the driver is called: a stream of another context
    /// ([`AtlasError::WrongContext`](crate::AtlasError::WrongContext), "the stream"), a source of
    /// another context (the same, "the source": copy between devices with
    /// [`copy_from_peer`](Self::copy_from_peer)), another length
    /// ([`MemoryRefusal::LengthMismatch`](crate::MemoryRefusal::LengthMismatch)). Empty copies
    /// reach no driver call.
    #[doc(alias = "cuMemcpyDtoDAsync_v2")]
    fn copy_from_device(&mut self, stream: &CudaStream, src: &impl DeviceMemory<T>) -> Result<()> {
        copy::device_to_device(stream, &self.as_slice_mut(), src.as_slice())
    }

    /// Copies `src`, memory of another device (or of this one), into this memory on `stream`, a
    /// stream of this memory's device, and waits for the copy (`cuMemcpyPeerAsync`).
    ///
    /// Without peer access from this memory's device to `src`'s, the driver stages the copy
    /// through host memory; with it ([`CudaContext::enable_peer_access`](crate::CudaContext::enable_peer_access)
    /// on this memory's context), the copy goes directly between the devices (NVLink or PCIe).
    /// The result is the same either way.
    ///
    /// Refused before the driver is called: a stream of another context than this memory's
    /// ([`AtlasError::WrongContext`](crate::AtlasError::WrongContext)), another length; and,
    /// waiting, while a capture would take it in (as [`copy_from`](Self::copy_from)).
    #[doc(alias = "cuMemcpyPeerAsync")]
    fn copy_from_peer(&mut self, stream: &CudaStream, src: &impl DeviceMemory<T>) -> Result<()> {
        peer::copy_waiting(stream, &self.as_slice_mut(), src.as_slice())
    }

    /// Enqueues a copy of `src`, memory of another device (or of this one), into this memory on
    /// `stream`, a stream of this memory's device (`cuMemcpyPeerAsync`): one driver call,
    /// capturable; checked as [`copy_from_peer`](Self::copy_from_peer).
    ///
    /// Atlas keeps this memory allocated until the copy has run, and a graph that captures the
    /// copy keeps both sides; what it cannot keep outside a capture is the other device's memory,
    /// whose own device's work does not include a copy enqueued here.
    ///
    /// # Safety
    ///
    /// 1. Unless the copy is captured into a graph, the buffer `src` is of stays allocated (is not
    ///    dropped or freed) until the copy has finished: synchronize `stream`, or wait for an
    ///    event recorded on it after the copy, first.
    #[doc(alias = "cuMemcpyPeerAsync")]
    unsafe fn copy_from_peer_async(
        &mut self,
        stream: &CudaStream,
        src: &impl DeviceMemory<T>,
    ) -> Result<()> {
        // SAFETY: the caller's duty 1.
        unsafe { peer::copy_async(stream, &self.as_slice_mut(), src.as_slice()) }
    }

    /// Enqueues a copy of rows of `src`, device memory of the same context, into rows of this
    /// memory on `stream` (`cuMemcpy2DAsync`): `shape.height` rows of `shape.width` elements,
    /// `src`'s rows `shape.src_pitch` elements apart and this memory's `shape.dst_pitch` apart.
    /// One driver call, capturable.
    ///
    /// Refused before the driver is called, beside the stream's and the source's context: rows
    /// wider than a side's pitch ([`MemoryRefusal::RowWiderThanPitch`](crate::MemoryRefusal::RowWiderThanPitch)),
    /// rows that end past a side's memory (`(height - 1) * pitch + width` elements,
    /// [`MemoryRefusal::RowsOutOfRange`](crate::MemoryRefusal::RowsOutOfRange)). A copy of no
    /// rows or rows of no elements reaches no driver call.
    #[doc(alias = "cuMemcpy2DAsync_v2")]
    fn copy_2d_from_device(
        &mut self,
        stream: &CudaStream,
        src: &impl DeviceMemory<T>,
        shape: Copy2d,
    ) -> Result<()> {
        pitched::device_to_device(stream, &self.as_slice_mut(), src.as_slice(), shape)
    }

    /// Copies rows of `src`, host memory, into rows of this memory on `stream` and waits for the
    /// copy (`cuMemcpy2DAsync`); checked as [`copy_2d_from_device`](Self::copy_2d_from_device),
    /// and, waiting, refused while a capture would take it in.
    #[doc(alias = "cuMemcpy2DAsync_v2")]
    fn copy_2d_from_host(&mut self, stream: &CudaStream, src: &[T], shape: Copy2d) -> Result<()> {
        pitched::from_host(stream, &self.as_slice_mut(), src, shape)
    }

    /// Copies `src` into this memory on `stream` and waits for the copy to finish.
    ///
    /// `src` must have the same length ([`AtlasError::SizeMismatch`](crate::AtlasError::SizeMismatch)).
    /// Refused before anything is enqueued
    /// ([`CaptureMisuse::WaitingCopyWhileCapturing`](crate::CaptureMisuse::WaitingCopyWhileCapturing))
    /// while Atlas captures `stream` or the calling thread captures: a copy that waits cannot be
    /// captured.
    #[doc(alias = "cuMemcpyHtoDAsync_v2")]
    fn copy_from(&mut self, stream: &CudaStream, src: &[T]) -> Result<()> {
        copy::from_host(stream, &self.as_slice_mut(), src)
    }

    /// Enqueues a copy of `src` into this memory on `stream` (`cuMemcpyHtoDAsync`).
    ///
    /// # Safety
    ///
    /// 1. `src` must stay alive and unmodified until the copy has finished (synchronize the
    ///    stream, or an event recorded after it). From pageable memory the driver has read `src`
    ///    before this returns; from page-locked memory, or under capture, it reads it later.
    #[doc(alias = "cuMemcpyHtoDAsync_v2")]
    unsafe fn copy_from_async(&mut self, stream: &CudaStream, src: &[T]) -> Result<()> {
        // SAFETY: the caller's duty 1.
        unsafe { copy::from_host_async(stream, &self.as_slice_mut(), src) }
    }

    /// Enqueues a fill of every byte with `value` on `stream` (`cuMemsetD8Async`): one driver
    /// call, capturable. Refused for a stream of another context.
    #[doc(alias = "cuMemsetD8Async")]
    fn fill_bytes(&mut self, stream: &CudaStream, value: u8) -> Result<()> {
        fill::fill(stream, &self.as_slice_mut(), FillValue::U8(value))
    }

    /// Enqueues a fill of every 2 bytes with the bit pattern `value` on `stream`
    /// (`cuMemsetD16Async`): one driver call, capturable. The memory's size and address must be
    /// multiples of 2 bytes ([`MemoryRefusal::FillSize`](crate::MemoryRefusal::FillSize),
    /// [`FillAlignment`](crate::MemoryRefusal::FillAlignment)). For memory of `f16` or `bf16`
    /// values, `value` is their bits.
    #[doc(alias = "cuMemsetD16Async")]
    fn fill_u16(&mut self, stream: &CudaStream, value: u16) -> Result<()> {
        fill::fill(stream, &self.as_slice_mut(), FillValue::U16(value))
    }

    /// Enqueues a fill of every 4 bytes with the bit pattern `value` on `stream`
    /// (`cuMemsetD32Async`): one driver call, capturable. The memory's size and address must be
    /// multiples of 4 bytes. For memory of `f32`, `value` is their bits (`1.0f32.to_bits()`);
    /// [`fill`](Self::fill) takes the value itself.
    #[doc(alias = "cuMemsetD32Async")]
    fn fill_u32(&mut self, stream: &CudaStream, value: u32) -> Result<()> {
        fill::fill(stream, &self.as_slice_mut(), FillValue::U32(value))
    }

    /// Enqueues a fill of every element with `value` on `stream`: one driver call, capturable,
    /// through the widest memset (`cuMemsetD32Async`, `D16`, `D8`) whose width divides the
    /// element's size and with which the value's bytes repeat: any value of a 1-, 2- or 4-byte
    /// type, and of larger types a value such as zero or `[x; N]` of such an `x`. Other values
    /// are refused ([`MemoryRefusal::FillPattern`](crate::MemoryRefusal::FillPattern)): a kernel
    /// writes those.
    #[doc(alias = "cuMemsetD32Async")]
    fn fill(&mut self, stream: &CudaStream, value: T) -> Result<()> {
        fill::fill(stream, &self.as_slice_mut(), fill::pattern(value)?)
    }
}

impl<T: DeviceCopy> DeviceMemory<T> for DeviceBuffer<T> {
    fn as_slice(&self) -> DeviceSlice<'_, T> {
        DeviceSlice::whole(self)
    }
}

impl<T: DeviceCopy> DeviceMemoryMut<T> for DeviceBuffer<T> {
    fn as_slice_mut(&mut self) -> DeviceSliceMut<'_, T> {
        DeviceSliceMut::whole(self)
    }
}

impl<T: DeviceCopy> DeviceMemory<T> for DeviceSlice<'_, T> {
    fn as_slice(&self) -> DeviceSlice<'_, T> {
        *self
    }
}

impl<T: DeviceCopy> DeviceMemory<T> for DeviceSliceMut<'_, T> {
    fn as_slice(&self) -> DeviceSlice<'_, T> {
        self.reading()
    }
}

impl<T: DeviceCopy> DeviceMemoryMut<T> for DeviceSliceMut<'_, T> {
    fn as_slice_mut(&mut self) -> DeviceSliceMut<'_, T> {
        self.reborrow()
    }
}
