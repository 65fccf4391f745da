//! Fills of device memory with 1-, 2- or 4-byte values (`cuMemsetD8/16/32Async`), enqueued on a
//! stream and capturable, and the typed fill that picks the widest of them a value allows.

use crate::device::context::CudaContext;
use crate::device::stream::CudaStream;
use crate::driver::{About, calls};
use crate::error::{AtlasError, MemoryRefusal, Result};
use crate::memory::buffer::{DeviceBuffer, DeviceCopy, check_stream, enqueue};
use crate::memory::copy::bytes_of;
use crate::memory::view::DeviceSliceMut;

pub(crate) use crate::driver::calls::FillValue;

impl<T: DeviceCopy> DeviceBuffer<T> {
    /// A buffer of `len` elements set to zero: allocated ([`alloc`](Self::alloc)), then filled
    /// with zero bytes on `stream` (`cuMemsetD8Async`), in `stream`'s order: work enqueued on
    /// `stream` afterwards sees zeros, work on other streams once they wait for `stream`.
    ///
    /// A stream of another context than `context` is refused ([`AtlasError::WrongContext`])
    /// before anything is allocated; refused as [`alloc`](Self::alloc) is while the calling
    /// thread captures.
    #[doc(alias = "cuMemsetD8Async")]
    pub fn zeroed(context: &CudaContext, stream: &CudaStream, len: usize) -> Result<Self> {
        check_stream(context.raw(), stream)?;
        let mut buffer = Self::alloc(context, len)?;
        fill(
            stream,
            &DeviceSliceMut::whole(&mut buffer),
            FillValue::U8(0),
        )?;
        Ok(buffer)
    }
}

/// Enqueues a fill of `dst` with `value` on `stream`: one driver call, after checking the stream's
/// context and that `dst`'s size and address are multiples of the value's width.
#[inline]
pub(crate) fn fill<T: DeviceCopy>(
    stream: &CudaStream,
    dst: &DeviceSliceMut<'_, T>,
    value: FillValue,
) -> Result<()> {
    check_stream(dst.context(), stream)?;
    let (bytes, width) = (bytes_of::<T>(dst.len()), value.width());
    if !bytes.is_multiple_of(width) {
        return Err(AtlasError::Memory(MemoryRefusal::FillSize { width, bytes }));
    }
    let address = dst.device_ptr();
    if !address.is_multiple_of(width as u64) {
        return Err(AtlasError::Memory(MemoryRefusal::FillAlignment {
            width,
            address,
        }));
    }
    if bytes == 0 {
        return Ok(());
    }
    stream.bind_if_default()?;
    let count = bytes / width;
    enqueue(stream, [dst.buffer()], || {
        // SAFETY: the view lies in a live allocation of the stream's context (bounds-checked
        // view, context checked above) holding `count` values of `width` bytes at an address
        // aligned to `width` (checked above). It stays allocated until the fill has run: `enqueue`
        // makes the buffer's free wait for the device, and a graph that captures it keeps it.
        Ok(unsafe { calls::fill(address, value, count, stream.raw()) }
            .about(|| format!("{count} values of {width} bytes"))?)
    })
}

/// The memset that fills elements with `value`: the widest of 4, 2 and 1 bytes that divides the
/// element's size and with which the value's bytes repeat; refused when none does.
pub(crate) fn pattern<T: DeviceCopy>(value: T) -> Result<FillValue> {
    // SAFETY: `value` is a live `T` of `size_of::<T>()` bytes, all initialized: a DeviceCopy type
    // has no padding (its duty 2).
    let bytes =
        unsafe { std::slice::from_raw_parts((&raw const value).cast::<u8>(), size_of::<T>()) };
    let repeats = |width: usize| {
        bytes.len() % width == 0 && bytes.chunks_exact(width).all(|c| c == &bytes[..width])
    };
    if bytes.is_empty() {
        return Ok(FillValue::U8(0)); // no bytes to fill
    }
    if repeats(4) {
        let word = [bytes[0], bytes[1], bytes[2], bytes[3]];
        return Ok(FillValue::U32(u32::from_ne_bytes(word)));
    }
    if repeats(2) {
        return Ok(FillValue::U16(u16::from_ne_bytes([bytes[0], bytes[1]])));
    }
    if repeats(1) {
        return Ok(FillValue::U8(bytes[0]));
    }
    Err(AtlasError::Memory(MemoryRefusal::FillPattern {
        element_size: size_of::<T>(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typed_fill_takes_the_widest_memset_the_value_repeats_with() {
        assert_eq!(pattern(7u8).unwrap(), FillValue::U8(7));
        assert_eq!(pattern(0x1234u16).unwrap(), FillValue::U16(0x1234));
        assert_eq!(pattern(-2i16).unwrap(), FillValue::U16(0xfffe));
        assert_eq!(pattern(1.0f32).unwrap(), FillValue::U32(1.0f32.to_bits()));
        assert_eq!(pattern(0.0f64).unwrap(), FillValue::U32(0));
        assert_eq!(pattern(-1i64).unwrap(), FillValue::U32(u32::MAX));
        assert_eq!(
            pattern([2.5f32; 3]).unwrap(),
            FillValue::U32(2.5f32.to_bits())
        );
        assert_eq!(pattern([9u8; 3]).unwrap(), FillValue::U8(9));
        assert_eq!(pattern([1u16, 1, 1]).unwrap(), FillValue::U16(1));
        assert_eq!(pattern([0u8; 0]).unwrap(), FillValue::U8(0));
        for refused in [
            pattern(1.0f64).unwrap_err(),
            pattern(0x0000_0001_0000_0002u64).unwrap_err(),
        ] {
            assert!(
                matches!(
                    refused,
                    AtlasError::Memory(MemoryRefusal::FillPattern { element_size: 8 })
                ),
                "{refused}"
            );
        }
        assert!(matches!(
            pattern([1u8, 2, 3]).unwrap_err(),
            AtlasError::Memory(MemoryRefusal::FillPattern { element_size: 3 })
        ));
    }
}
