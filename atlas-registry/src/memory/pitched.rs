//! 2D copies of pitched layouts (`cuMemcpy2DAsync`): rows of a matrix, of a sub-matrix, or of any
//! layout whose rows lie a fixed number of elements apart. Between device memory of one context
//! enqueued and capturable; with the host only waiting (the host memory is released as soon as
//! the call returns, so the copy must be over by then).

use crate::device::capture;
use crate::device::stream::CudaStream;
use crate::driver::About;
use crate::driver::calls::{self, Rows, Side2d};
use crate::error::{AtlasError, CopySide, MemoryRefusal, Result};
use crate::memory::buffer::{DeviceCopy, check_stream, enqueue};
use crate::memory::copy::check_source;
use crate::memory::view::{DeviceSlice, DeviceSliceMut};

/// The shape of a 2D copy, in elements: `height` rows of `width` elements, the source's rows
/// `src_pitch` elements apart and the destination's `dst_pitch` apart (a pitch is a row's width
/// plus its padding, the leading dimension of a row-major matrix).
///
/// Each side must hold its rows: `width <= pitch`, and `(height - 1) * pitch + width` elements
/// (the last row need not be padded).
///
/// # Examples
///
/// The 3×4 block at row 2, column 5 of a row-major 16×16 matrix, packed into a 3×4 buffer:
///
/// ```no_run
/// # fn f(registry: &atlas_registry::AtlasRegistry, m: &atlas_registry::DeviceBuffer<f32>) -> atlas_registry::Result<()> {
/// use atlas_registry::{Copy2d, DeviceBuffer, DeviceMemory, DeviceMemoryMut};
/// let stream = registry.stream();
/// let mut block = DeviceBuffer::<f32>::alloc(registry.ctx(), 3 * 4)?;
/// let shape = Copy2d { width: 4, height: 3, src_pitch: 16, dst_pitch: 4 };
/// block.copy_2d_from_device(stream, &m.range(2 * 16 + 5..)?, shape)?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Copy2d {
    /// Elements per row.
    pub width: usize,
    /// Rows.
    pub height: usize,
    /// Elements from the start of one source row to the next.
    pub src_pitch: usize,
    /// Elements from the start of one destination row to the next.
    pub dst_pitch: usize,
}

impl Copy2d {
    /// `height` rows of `width` elements, packed on both sides (both pitches `width`).
    pub fn packed(width: usize, height: usize) -> Self {
        Self {
            width,
            height,
            src_pitch: width,
            dst_pitch: width,
        }
    }

    /// Whether the copy moves nothing (no rows, or rows of no elements).
    fn is_empty(&self) -> bool {
        self.width == 0 || self.height == 0
    }

    /// `Ok` when `side`, of `len` elements with rows `pitch` apart, holds the copy's rows.
    fn check(&self, side: CopySide, pitch: usize, len: usize) -> Result<()> {
        if self.width > pitch {
            return Err(AtlasError::Memory(MemoryRefusal::RowWiderThanPitch {
                side,
                width: self.width,
                pitch,
            }));
        }
        let end = self
            .height
            .saturating_sub(1)
            .checked_mul(pitch)
            .and_then(|start| start.checked_add(self.width))
            .unwrap_or(usize::MAX);
        if end > len {
            return Err(AtlasError::Memory(MemoryRefusal::RowsOutOfRange {
                side,
                width: self.width,
                height: self.height,
                pitch,
                end,
                len,
            }));
        }
        Ok(())
    }

    /// The copy in bytes, for a non-empty copy both of whose sides passed [`check`](Self::check)
    /// (so every offset fits the memory, whose bytes fit `usize`). A single row's pitch is not an
    /// offset that exists; it is given as the row's width.
    fn rows<T>(&self) -> Rows {
        let bytes = |elements: usize| elements * size_of::<T>();
        let pitch = |pitch: usize| if self.height == 1 { self.width } else { pitch };
        Rows {
            width: bytes(self.width),
            height: self.height,
            src_pitch: bytes(pitch(self.src_pitch)),
            dst_pitch: bytes(pitch(self.dst_pitch)),
        }
    }
}

/// Enqueues the 2D copy of `src` into `dst`: see
/// [`DeviceMemoryMut::copy_2d_from_device`](crate::DeviceMemoryMut::copy_2d_from_device).
pub(crate) fn device_to_device<T: DeviceCopy>(
    stream: &CudaStream,
    dst: &DeviceSliceMut<'_, T>,
    src: DeviceSlice<'_, T>,
    shape: Copy2d,
) -> Result<()> {
    let context = dst.context();
    check_stream(context, stream)?;
    check_source(context, &src)?;
    if shape.is_empty() {
        return Ok(());
    }
    shape.check(CopySide::Source, shape.src_pitch, src.len())?;
    shape.check(CopySide::Destination, shape.dst_pitch, dst.len())?;
    stream.bind_if_default()?;
    let rows = shape.rows::<T>();
    let (to, from) = (
        Side2d::Device(dst.device_ptr()),
        Side2d::Device(src.device_ptr()),
    );
    enqueue(stream, [dst.buffer(), src.buffer()], || {
        // SAFETY: every row of each side lies in its view (checked above), so in a live
        // allocation of the stream's context (views are bounds-checked, contexts checked above);
        // the sides do not overlap (`dst` is borrowed mutably). The memory stays allocated until
        // the copy has run: `enqueue` makes the buffers' frees wait for the device, and a graph
        // that captures it keeps them.
        Ok(unsafe { calls::copy_2d(to, from, rows, stream.raw()) }.about(|| about(&shape))?)
    })
}

/// Copies rows of host memory `src` into `dst` on `stream`, and waits: see
/// [`DeviceMemoryMut::copy_2d_from_host`](crate::DeviceMemoryMut::copy_2d_from_host).
pub(crate) fn from_host<T: DeviceCopy>(
    stream: &CudaStream,
    dst: &DeviceSliceMut<'_, T>,
    src: &[T],
    shape: Copy2d,
) -> Result<()> {
    check_stream(dst.context(), stream)?;
    capture::refuse_waiting_copy(stream.raw())?;
    if shape.is_empty() {
        return Ok(());
    }
    shape.check(CopySide::Source, shape.src_pitch, src.len())?;
    shape.check(CopySide::Destination, shape.dst_pitch, dst.len())?;
    stream.bind_if_default()?;
    let (to, from) = (
        Side2d::Device(dst.device_ptr()),
        Side2d::Host(src.as_ptr().cast_mut().cast()),
    );
    // SAFETY: the rows lie in `src` (read only) and in the view's live allocation of the
    // stream's context (checked above). `src` outlives the copy: the stream is synchronized
    // before returning, and a capture begun since the check is invalidated by it, not kept.
    unsafe { calls::copy_2d(to, from, shape.rows::<T>(), stream.raw()) }.about(|| about(&shape))?;
    stream.synchronize_unchecked()
}

/// Copies rows of `src` into host memory `dst` on `stream`, and waits: see
/// [`DeviceMemory::copy_2d_to_host`](crate::DeviceMemory::copy_2d_to_host).
pub(crate) fn to_host<T: DeviceCopy>(
    stream: &CudaStream,
    src: DeviceSlice<'_, T>,
    dst: &mut [T],
    shape: Copy2d,
) -> Result<()> {
    check_stream(src.context(), stream)?;
    capture::refuse_waiting_copy(stream.raw())?;
    if shape.is_empty() {
        return Ok(());
    }
    shape.check(CopySide::Source, shape.src_pitch, src.len())?;
    shape.check(CopySide::Destination, shape.dst_pitch, dst.len())?;
    stream.bind_if_default()?;
    let (to, from) = (
        Side2d::Host(dst.as_mut_ptr().cast()),
        Side2d::Device(src.device_ptr()),
    );
    // SAFETY: as for `from_host`, with `dst` borrowed mutably (nothing else reads or writes it)
    // until the stream is synchronized; every bit pattern the device writes is a valid T
    // (DeviceCopy).
    unsafe { calls::copy_2d(to, from, shape.rows::<T>(), stream.raw()) }.about(|| about(&shape))?;
    stream.synchronize_unchecked()
}

/// What a failed 2D copy was about.
fn about(shape: &Copy2d) -> String {
    format!(
        "{} rows of {} elements, pitches {} (source) and {} (destination)",
        shape.height, shape.width, shape.src_pitch, shape.dst_pitch
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(shape: Copy2d, pitch: usize, len: usize) -> MemoryRefusal {
        match shape.check(CopySide::Source, pitch, len) {
            Err(AtlasError::Memory(refusal)) => refusal,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn rows_are_checked_against_each_pitch_and_length() {
        let shape = Copy2d {
            width: 4,
            height: 3,
            src_pitch: 10,
            dst_pitch: 4,
        };
        // The last row ends at 2 * 10 + 4 = 24: exactly 24 elements are enough.
        shape.check(CopySide::Source, 10, 24).unwrap();
        assert_eq!(
            refusal(shape, 10, 23),
            MemoryRefusal::RowsOutOfRange {
                side: CopySide::Source,
                width: 4,
                height: 3,
                pitch: 10,
                end: 24,
                len: 23
            }
        );
        assert_eq!(
            refusal(shape, 3, 100),
            MemoryRefusal::RowWiderThanPitch {
                side: CopySide::Source,
                width: 4,
                pitch: 3
            }
        );
        let huge = Copy2d {
            height: usize::MAX,
            ..shape
        };
        assert!(matches!(
            refusal(huge, 10, 100),
            MemoryRefusal::RowsOutOfRange {
                end: usize::MAX,
                ..
            }
        ));
        let text = AtlasError::Memory(refusal(shape, 10, 23)).to_string();
        assert_eq!(
            text,
            "3 row(s) of 4 element(s) at a pitch of 10 end at element 24, past the source's 23"
        );
    }

    #[test]
    fn rows_in_bytes_scale_by_the_element_and_a_single_row_needs_no_pitch() {
        let shape = Copy2d {
            width: 3,
            height: 2,
            src_pitch: 5,
            dst_pitch: 7,
        };
        let rows = shape.rows::<f32>();
        assert_eq!(
            (rows.width, rows.height, rows.src_pitch, rows.dst_pitch),
            (12, 2, 20, 28)
        );
        let one = Copy2d {
            height: 1,
            src_pitch: usize::MAX,
            ..shape
        };
        let rows = one.rows::<u64>();
        assert_eq!((rows.width, rows.src_pitch, rows.dst_pitch), (24, 24, 24));
    }
}
