//! [`DeviceBuffer`]: a typed allocation of device memory, and [`DeviceCopy`], the values that can
//! be copied to and from it byte for byte.

use std::fmt;
use std::marker::PhantomData;

use atlas_sys::{CUcontext, CUdeviceptr};

use crate::device::context::{CudaContext, ensure_bound};
use crate::device::stream::CudaStream;
use crate::driver::{About, calls};
use crate::error::{AtlasError, Result, report_cleanup};
use crate::memory::copy::{dtoh, htod};

/// Plain data that can be copied to and from the device byte for byte.
///
/// # Safety
///
/// 1. Every bit pattern of `size_of::<Self>()` bytes is a valid value (the device may write any).
/// 2. The type has no padding, pointers to host memory, or drop glue.
pub unsafe trait DeviceCopy: Copy + Send + Sync + 'static {}

macro_rules! device_copy {
    ($($t:ty),*) => {
        // SAFETY: primitive integers and floats: no padding, every bit pattern valid.
        $(unsafe impl DeviceCopy for $t {})*
    };
}
device_copy!(
    u8, i8, u16, i16, u32, i32, u64, i64, u128, i128, usize, isize, f32, f64
);

// SAFETY: an array of DeviceCopy values has no padding between elements and no other bytes.
unsafe impl<T: DeviceCopy, const N: usize> DeviceCopy for [T; N] {}

/// A typed allocation of device memory in one context, freed on drop.
///
/// Allocation is not stream-ordered (`cuMemAlloc`), and neither is freeing: the driver *may*
/// synchronize in `cuMemFree`, but does not promise to. Atlas relies on nothing more than this: a
/// buffer can only be dropped when no borrow of it is alive, and a kernel that uses it through a
/// launch is the launch's [safety contract](crate#safety-model) — the caller keeps the buffer alive
/// until the work that uses it has finished (synchronize the stream first).
pub struct DeviceBuffer<T: DeviceCopy> {
    ptr: CUdeviceptr,
    len: usize,
    context: CUcontext,
    _elements: PhantomData<T>,
}

// SAFETY: the buffer owns device memory, reachable from any thread through the driver; T is Send.
unsafe impl<T: DeviceCopy> Send for DeviceBuffer<T> {}
// SAFETY: shared references only read the pointer and length, or enqueue reads of the memory.
unsafe impl<T: DeviceCopy> Sync for DeviceBuffer<T> {}

impl<T: DeviceCopy> DeviceBuffer<T> {
    /// Allocates room for `len` elements, contents unspecified. `len == 0` allocates nothing.
    #[doc(alias = "cuMemAlloc_v2")]
    pub fn alloc(context: &CudaContext, len: usize) -> Result<Self> {
        let bytes = len
            .checked_mul(size_of::<T>())
            .ok_or(AtlasError::AllocationTooLarge {
                len,
                element_size: size_of::<T>(),
            })?;
        let mut ptr: CUdeviceptr = 0;
        if bytes > 0 {
            context.bind()?;
            ptr = calls::mem_alloc(bytes)
                .about(|| format!("{bytes} bytes on device {}", context.ordinal()))?;
        }
        Ok(Self {
            ptr,
            len,
            context: context.raw(),
            _elements: PhantomData,
        })
    }

    /// A new buffer holding a copy of `data`, in the stream's context; waits for the copy.
    pub fn from_slice(context: &CudaContext, stream: &CudaStream, data: &[T]) -> Result<Self> {
        let mut buffer = Self::alloc(context, data.len())?;
        buffer.copy_from(stream, data)?;
        Ok(buffer)
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address of the first element (0 for an empty buffer), for kernel arguments and
    /// driver calls Atlas does not wrap. Valid while the buffer lives.
    pub fn device_ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// The context the memory was allocated in.
    pub(crate) fn context_raw(&self) -> CUcontext {
        self.context
    }

    /// Where the buffer keeps its device address: a kernel parameter points here.
    pub(crate) fn device_ptr_slot(&self) -> &CUdeviceptr {
        &self.ptr
    }

    /// Copies `src` into the buffer on `stream` and waits for the copy to finish.
    pub fn copy_from(&mut self, stream: &CudaStream, src: &[T]) -> Result<()> {
        // SAFETY: the stream is synchronized before `src` is released.
        unsafe { self.copy_from_async(stream, src) }?;
        stream.synchronize()
    }

    /// Copies the buffer into `dst` on `stream` and waits for the copy to finish.
    pub fn copy_to(&self, stream: &CudaStream, dst: &mut [T]) -> Result<()> {
        // SAFETY: the stream is synchronized before `dst` is released.
        unsafe { self.copy_to_async(stream, dst) }?;
        stream.synchronize()
    }

    /// The buffer's contents in a new `Vec`, after the stream's earlier work.
    pub fn to_vec(&self, stream: &CudaStream) -> Result<Vec<T>> {
        let mut out: Vec<T> = Vec::with_capacity(self.len);
        let bytes = self.len * size_of::<T>();
        // SAFETY: `out` has room for `len` elements; the copy is complete (synchronized) before
        // set_len, and every bit pattern is a valid T (DeviceCopy).
        unsafe {
            dtoh(
                self.context,
                out.as_mut_ptr().cast(),
                self.ptr,
                bytes,
                stream.raw(),
            )?;
            stream.synchronize()?;
            out.set_len(self.len);
        }
        Ok(out)
    }

    /// Enqueues a copy of `src` into the buffer on `stream` (`cuMemcpyHtoDAsync`).
    ///
    /// # Safety
    ///
    /// 1. `src` must stay alive and unmodified until the copy has finished (synchronize the stream,
    ///    or an event recorded after it). From pageable memory the driver has read `src` before this
    ///    returns; from page-locked memory it reads it later.
    #[doc(alias = "cuMemcpyHtoDAsync_v2")]
    pub unsafe fn copy_from_async(&mut self, stream: &CudaStream, src: &[T]) -> Result<()> {
        self.check_len("copy to the device", src.len())?;
        // SAFETY: lengths match; the caller keeps `src` alive until the copy is done.
        unsafe {
            htod(
                self.context,
                self.ptr,
                src.as_ptr().cast(),
                size_of_val(src),
                stream.raw(),
            )
        }
    }

    /// Enqueues a copy of the buffer into `dst` on `stream` (`cuMemcpyDtoHAsync`).
    ///
    /// # Safety
    ///
    /// 1. `dst` must stay alive and must not be read or written until the copy has finished.
    ///    Into pageable memory the driver returns only when the copy is done; into page-locked memory
    ///    it returns at once.
    #[doc(alias = "cuMemcpyDtoHAsync_v2")]
    pub unsafe fn copy_to_async(&self, stream: &CudaStream, dst: &mut [T]) -> Result<()> {
        self.check_len("copy to the host", dst.len())?;
        // SAFETY: lengths match; the caller keeps `dst` alive and untouched until the copy is done.
        unsafe {
            dtoh(
                self.context,
                dst.as_mut_ptr().cast(),
                self.ptr,
                size_of_val(dst),
                stream.raw(),
            )
        }
    }

    fn check_len(&self, what: &str, given: usize) -> Result<()> {
        if given == self.len {
            return Ok(());
        }
        Err(AtlasError::SizeMismatch {
            what: format!(
                "{what}: a device buffer of {} elements and a host slice of {given}",
                self.len
            ),
            expected: self.len * size_of::<T>(),
            given: given * size_of::<T>(),
        })
    }
}

impl<T: DeviceCopy> fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DeviceBuffer<{}>({:#x}, len {})",
            std::any::type_name::<T>(),
            self.ptr,
            self.len
        )
    }
}

impl<T: DeviceCopy> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        if self.ptr == 0 {
            return;
        }
        let ptr = self.ptr;
        // SAFETY: the memory was allocated by this buffer in this context and is freed only here.
        let result = ensure_bound(self.context).and_then(|()| Ok(unsafe { calls::mem_free(ptr) }?));
        report_cleanup("freeing a device buffer", result);
    }
}
