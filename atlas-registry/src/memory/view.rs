//! Views of part of a [`DeviceBuffer`]: [`DeviceSlice`] (read) and [`DeviceSliceMut`] (written),
//! and the iterators over their chunks ([`DeviceChunks`], [`DeviceChunksMut`]).
//!
//! A view borrows its buffer, so it cannot outlive it, and a mutable view borrows it mutably:
//! the ranges of two views that exist at once overlap only when both are read-only. Every range is
//! checked when the view is made ([`MemoryRefusal::OutOfRange`]). A view passes to kernels, copies
//! and fills as the buffer does (see [`DeviceMemory`](crate::DeviceMemory)): its device address,
//! checked to be memory of the function's context, and, for a launch or copy captured into a
//! graph, the buffer's whole allocation kept alive by the graph.
//!
//! Mutable views of the same memory cannot exist at once, nor a read-only view beside a mutable
//! one:
//!
//! ```compile_fail
//! # fn f(x: &mut atlas_registry::DeviceBuffer<f32>) -> atlas_registry::Result<()> {
//! use atlas_registry::DeviceMemoryMut;
//! let a = x.range_mut(0..8)?;
//! let b = x.range_mut(4..12)?; // refused: `x` is borrowed mutably by `a`
//! drop((a, b));
//! # Ok(()) }
//! ```
//!
//! ```compile_fail
//! # fn f(x: &mut atlas_registry::DeviceBuffer<f32>) -> atlas_registry::Result<()> {
//! use atlas_registry::{DeviceMemory, DeviceMemoryMut};
//! let read = x.range(0..8)?;
//! let write = x.range_mut(8..16)?; // refused: `x` is borrowed by `read`
//! drop((read, write));
//! # Ok(()) }
//! ```
//!
//! and a view does not outlive its buffer:
//!
//! ```compile_fail
//! # fn f(context: &atlas_registry::CudaContext) -> atlas_registry::Result<()> {
//! use atlas_registry::{DeviceBuffer, DeviceMemory};
//! let view = {
//!     let x = DeviceBuffer::<f32>::alloc(context, 16)?;
//!     x.range(0..8)? // refused: `x` is dropped while `view` borrows it
//! };
//! # Ok(()) }
//! ```

use std::fmt;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};

use atlas_sys::{CUcontext, CUdeviceptr};

use crate::error::{AtlasError, MemoryRefusal, Result};
use crate::memory::buffer::{DeviceBuffer, DeviceCopy};

/// A read-only view of part of a [`DeviceBuffer`] (made by
/// [`DeviceMemory::range`](crate::DeviceMemory::range),
/// [`split_at`](crate::DeviceMemory::split_at), [`chunks`](crate::DeviceMemory::chunks) or
/// [`as_slice`](crate::DeviceMemory::as_slice)): the elements `start..end` of the buffer,
/// borrowed.
///
/// It is `Copy`, and its own methods take it by value, so a view of a view lives as long as the
/// buffer's borrow (`'a`). A kernel takes it by value (or `&view`), as it takes `&buf`.
///
/// # Examples
///
/// ```no_run
/// # fn f(registry: &atlas_registry::AtlasRegistry) -> atlas_registry::Result<()> {
/// use atlas_registry::{DeviceBuffer, DeviceMemory};
/// let stream = registry.stream();
/// let x = DeviceBuffer::from_slice(registry.ctx(), stream, &[0u32, 1, 2, 3, 4, 5, 6, 7])?;
/// let (low, high) = x.split_at(4)?;
/// assert_eq!(high.range(1..3)?.to_vec(stream)?, [5, 6]);
/// let sums: Vec<u32> = low
///     .chunks(3)?
///     .map(|chunk| chunk.to_vec(stream).map(|v| v.iter().sum()))
///     .collect::<Result<_, _>>()?;
/// assert_eq!(sums, [3, 3]);
/// # Ok(()) }
/// ```
pub struct DeviceSlice<'a, T: DeviceCopy> {
    ptr: CUdeviceptr,
    len: usize,
    buffer: &'a DeviceBuffer<T>,
}

/// A view of part of a [`DeviceBuffer`] that copies and fills may write (made by
/// [`DeviceMemoryMut::range_mut`](crate::DeviceMemoryMut::range_mut),
/// [`split_at_mut`](crate::DeviceMemoryMut::split_at_mut),
/// [`chunks_mut`](crate::DeviceMemoryMut::chunks_mut) or
/// [`as_slice_mut`](crate::DeviceMemoryMut::as_slice_mut)).
///
/// It borrows the buffer mutably: no other view of the same elements exists while it does. Its
/// own methods consume it and return views that live as long as the buffer's borrow; to keep it,
/// reborrow first (`view.as_slice_mut().split_at_mut(4)`). A kernel takes it by value or as
/// `&mut view`, as it takes `&mut buf`.
///
/// # Examples
///
/// Two halves of one buffer, one copied into the other and the first filled:
///
/// ```no_run
/// # fn f(registry: &atlas_registry::AtlasRegistry) -> atlas_registry::Result<()> {
/// use atlas_registry::{DeviceBuffer, DeviceMemory, DeviceMemoryMut};
/// let stream = registry.stream();
/// let mut x = DeviceBuffer::from_slice(registry.ctx(), stream, &[1.0f32, 2.0, 3.0, 4.0])?;
/// let (mut low, mut high) = x.split_at_mut(2)?;
/// high.copy_from_device(stream, &low)?;
/// low.fill(stream, -1.0)?;
/// assert_eq!(x.to_vec(stream)?, [-1.0, -1.0, 1.0, 2.0]);
/// # Ok(()) }
/// ```
pub struct DeviceSliceMut<'a, T: DeviceCopy> {
    ptr: CUdeviceptr,
    len: usize,
    /// The buffer, read only for its address, context and allocation; the view's exclusive use
    /// of its elements is `_exclusive`'s borrow.
    buffer: &'a DeviceBuffer<T>,
    _exclusive: PhantomData<&'a mut DeviceBuffer<T>>,
}

impl<T: DeviceCopy> Clone for DeviceSlice<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T: DeviceCopy> Copy for DeviceSlice<'_, T> {}

/// The start and end of `range` in memory of `len` elements, or the refusal naming them.
fn bounds(range: impl RangeBounds<usize>, len: usize) -> Result<(usize, usize)> {
    let start = match range.start_bound() {
        Bound::Included(&s) => Some(s),
        Bound::Excluded(&s) => s.checked_add(1),
        Bound::Unbounded => Some(0),
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.checked_add(1),
        Bound::Excluded(&e) => Some(e),
        Bound::Unbounded => Some(len),
    };
    match (start, end) {
        (Some(start), Some(end)) if start <= end && end <= len => Ok((start, end)),
        (start, end) => Err(out_of_range(
            start.unwrap_or(usize::MAX),
            end.unwrap_or(usize::MAX),
            len,
        )),
    }
}

#[cold]
fn out_of_range(start: usize, end: usize, len: usize) -> AtlasError {
    AtlasError::Memory(MemoryRefusal::OutOfRange { start, end, len })
}

/// The address of element `index` after `ptr` (`index` is at most the memory's length, whose
/// bytes fit the allocation).
fn offset<T>(ptr: CUdeviceptr, index: usize) -> CUdeviceptr {
    ptr + (index * size_of::<T>()) as CUdeviceptr
}

impl<'a, T: DeviceCopy> DeviceSlice<'a, T> {
    /// The whole of `buffer`.
    pub(crate) fn whole(buffer: &'a DeviceBuffer<T>) -> Self {
        Self {
            ptr: buffer.device_ptr(),
            len: buffer.len(),
            buffer,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the view has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address of the view's first element, for driver calls Atlas does not wrap.
    /// Valid while the buffer lives.
    pub fn device_ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// The elements `range` of this view (indexes relative to it).
    ///
    /// A range past the view, or one that ends before it starts, is refused
    /// ([`MemoryRefusal::OutOfRange`], naming the range and the length).
    pub fn range(self, range: impl RangeBounds<usize>) -> Result<Self> {
        let (start, end) = bounds(range, self.len)?;
        Ok(Self {
            ptr: offset::<T>(self.ptr, start),
            len: end - start,
            buffer: self.buffer,
        })
    }

    /// The view cut in two at `mid`: elements `..mid` and `mid..`. `mid` past the end is refused
    /// ([`MemoryRefusal::OutOfRange`]).
    pub fn split_at(self, mid: usize) -> Result<(Self, Self)> {
        Ok((self.range(..mid)?, self.range(mid..)?))
    }

    /// The view in chunks of `size` elements (the last one shorter when `size` does not divide
    /// the length). A size of 0 is refused ([`MemoryRefusal::ZeroChunkSize`]).
    pub fn chunks(self, size: usize) -> Result<DeviceChunks<'a, T>> {
        if size == 0 {
            return Err(AtlasError::Memory(MemoryRefusal::ZeroChunkSize));
        }
        Ok(DeviceChunks { rest: self, size })
    }

    /// The buffer the view is of.
    pub(crate) fn buffer(&self) -> &'a DeviceBuffer<T> {
        self.buffer
    }

    /// The context of the buffer's memory.
    pub(crate) fn context(&self) -> CUcontext {
        self.buffer.context_raw()
    }

    /// Where the view keeps its device address: a kernel parameter points here.
    pub(crate) fn device_ptr_slot(&self) -> &CUdeviceptr {
        &self.ptr
    }
}

impl<'a, T: DeviceCopy> DeviceSliceMut<'a, T> {
    /// The whole of `buffer`, borrowed mutably.
    pub(crate) fn whole(buffer: &'a mut DeviceBuffer<T>) -> Self {
        let buffer: &'a DeviceBuffer<T> = buffer;
        Self {
            ptr: buffer.device_ptr(),
            len: buffer.len(),
            buffer,
            _exclusive: PhantomData,
        }
    }

    /// Elements `start..end` of `buffer`, which no other view of these elements uses while `'a`
    /// lasts (the caller holds the buffer's mutable borrow, or a mutable view of them).
    fn part(buffer: &'a DeviceBuffer<T>, ptr: CUdeviceptr, len: usize) -> Self {
        Self {
            ptr,
            len,
            buffer,
            _exclusive: PhantomData,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the view has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address of the view's first element, for driver calls Atlas does not wrap.
    /// Valid while the buffer lives.
    pub fn device_ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// The elements `range` of this view (indexes relative to it), consuming it. A range past
    /// the view, or one that ends before it starts, is refused ([`MemoryRefusal::OutOfRange`]).
    pub fn range_mut(self, range: impl RangeBounds<usize>) -> Result<Self> {
        let (start, end) = bounds(range, self.len)?;
        Ok(Self::part(
            self.buffer,
            offset::<T>(self.ptr, start),
            end - start,
        ))
    }

    /// The view cut in two at `mid`, consuming it: elements `..mid` and `mid..`, which may be
    /// written at once (copied into each other, given to one kernel). `mid` past the end is
    /// refused ([`MemoryRefusal::OutOfRange`]).
    pub fn split_at_mut(self, mid: usize) -> Result<(Self, Self)> {
        let (_, end) = bounds(..mid, self.len)?;
        let high = offset::<T>(self.ptr, end);
        Ok((
            Self::part(self.buffer, self.ptr, end),
            Self::part(self.buffer, high, self.len - end),
        ))
    }

    /// The view in chunks of `size` elements, consuming it (the last chunk shorter when `size`
    /// does not divide the length). A size of 0 is refused ([`MemoryRefusal::ZeroChunkSize`]).
    pub fn chunks_mut(self, size: usize) -> Result<DeviceChunksMut<'a, T>> {
        if size == 0 {
            return Err(AtlasError::Memory(MemoryRefusal::ZeroChunkSize));
        }
        Ok(DeviceChunksMut { rest: self, size })
    }

    /// The same elements, read-only, for as long as the buffer's borrow.
    pub fn into_slice(self) -> DeviceSlice<'a, T> {
        DeviceSlice {
            ptr: self.ptr,
            len: self.len,
            buffer: self.buffer,
        }
    }

    /// The same elements, read-only, while `self` is borrowed.
    pub(crate) fn reading(&self) -> DeviceSlice<'_, T> {
        DeviceSlice {
            ptr: self.ptr,
            len: self.len,
            buffer: self.buffer,
        }
    }

    /// The same elements, while `self` is borrowed mutably.
    pub(crate) fn reborrow(&mut self) -> DeviceSliceMut<'_, T> {
        DeviceSliceMut::part(self.buffer, self.ptr, self.len)
    }

    /// The buffer the view is of.
    pub(crate) fn buffer(&self) -> &DeviceBuffer<T> {
        self.buffer
    }

    /// The context of the buffer's memory.
    pub(crate) fn context(&self) -> CUcontext {
        self.buffer.context_raw()
    }

    /// Where the view keeps its device address: a kernel parameter points here.
    pub(crate) fn device_ptr_slot(&self) -> &CUdeviceptr {
        &self.ptr
    }
}

impl<'a, T: DeviceCopy> From<DeviceSliceMut<'a, T>> for DeviceSlice<'a, T> {
    fn from(view: DeviceSliceMut<'a, T>) -> Self {
        view.into_slice()
    }
}

/// The chunks of a [`DeviceSlice`] (or of memory read through
/// [`DeviceMemory::chunks`](crate::DeviceMemory::chunks)), in order.
pub struct DeviceChunks<'a, T: DeviceCopy> {
    rest: DeviceSlice<'a, T>,
    size: usize,
}

impl<'a, T: DeviceCopy> Iterator for DeviceChunks<'a, T> {
    type Item = DeviceSlice<'a, T>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let n = self.size.min(self.rest.len);
        let chunk = DeviceSlice {
            len: n,
            ..self.rest
        };
        self.rest = DeviceSlice {
            ptr: offset::<T>(self.rest.ptr, n),
            len: self.rest.len - n,
            ..self.rest
        };
        Some(chunk)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.rest.len.div_ceil(self.size);
        (n, Some(n))
    }
}

impl<T: DeviceCopy> ExactSizeIterator for DeviceChunks<'_, T> {}

/// The chunks of a [`DeviceSliceMut`] (or of memory written through
/// [`DeviceMemoryMut::chunks_mut`](crate::DeviceMemoryMut::chunks_mut)), in order: views of
/// disjoint elements, which may be used at once.
pub struct DeviceChunksMut<'a, T: DeviceCopy> {
    rest: DeviceSliceMut<'a, T>,
    size: usize,
}

impl<'a, T: DeviceCopy> Iterator for DeviceChunksMut<'a, T> {
    type Item = DeviceSliceMut<'a, T>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let n = self.size.min(self.rest.len);
        let buffer = self.rest.buffer;
        let (ptr, len) = (self.rest.ptr, self.rest.len);
        // The chunk and the rest are disjoint parts of the elements the iterator was given.
        self.rest = DeviceSliceMut::part(buffer, offset::<T>(ptr, n), len - n);
        Some(DeviceSliceMut::part(buffer, ptr, n))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.rest.len.div_ceil(self.size);
        (n, Some(n))
    }
}

impl<T: DeviceCopy> ExactSizeIterator for DeviceChunksMut<'_, T> {}

impl<T: DeviceCopy> fmt::Debug for DeviceSlice<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DeviceSlice<{}>({:#x}, len {})",
            std::any::type_name::<T>(),
            self.ptr,
            self.len
        )
    }
}

impl<T: DeviceCopy> fmt::Debug for DeviceSliceMut<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DeviceSliceMut<{}>({:#x}, len {})",
            std::any::type_name::<T>(),
            self.ptr,
            self.len
        )
    }
}

impl<T: DeviceCopy> fmt::Debug for DeviceChunks<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceChunks")
            .field("rest", &self.rest)
            .field("size", &self.size)
            .finish()
    }
}

impl<T: DeviceCopy> fmt::Debug for DeviceChunksMut<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceChunksMut")
            .field("rest", &self.rest)
            .field("size", &self.size)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_accept_every_range_form_inside_and_refuse_the_rest() {
        assert_eq!(bounds(.., 10).unwrap(), (0, 10));
        assert_eq!(bounds(3..7, 10).unwrap(), (3, 7));
        assert_eq!(bounds(3..=7, 10).unwrap(), (3, 8));
        assert_eq!(bounds(..=9, 10).unwrap(), (0, 10));
        assert_eq!(bounds(10.., 10).unwrap(), (10, 10));
        assert_eq!(
            bounds((Bound::Excluded(2), Bound::Unbounded), 10).unwrap(),
            (3, 10)
        );
        let refused = |range: (Bound<usize>, Bound<usize>), len| match bounds(range, len) {
            Err(AtlasError::Memory(MemoryRefusal::OutOfRange { start, end, len })) => {
                (start, end, len)
            }
            other => panic!("expected OutOfRange, got {other:?}"),
        };
        use Bound::{Excluded, Included, Unbounded};
        assert_eq!(refused((Included(3), Excluded(11)), 10), (3, 11, 10));
        assert_eq!(refused((Included(11), Unbounded), 10), (11, 10, 10));
        assert_eq!(refused((Included(7), Excluded(3)), 10), (7, 3, 10));
        assert_eq!(
            refused((Included(0), Included(usize::MAX)), 10),
            (0, usize::MAX, 10)
        );
        assert_eq!(
            refused((Excluded(usize::MAX), Unbounded), 10),
            (usize::MAX, 10, 10)
        );
        let text = AtlasError::Memory(MemoryRefusal::OutOfRange {
            start: 7,
            end: 3,
            len: 10,
        })
        .to_string();
        assert_eq!(
            text,
            "elements 7..3 are not a range of device memory of 10 element(s) (it ends before it \
             starts)"
        );
    }
}
