//! [`PinnedBuffer`]: page-locked host memory allocated by the driver (`cuMemHostAlloc`), which
//! the device copies to and from asynchronously, and [`PinnedFlags`], how it is allocated.

use std::fmt;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;

use atlas_sys::{
    CU_MEMHOSTALLOC_DEVICEMAP, CU_MEMHOSTALLOC_PORTABLE, CU_MEMHOSTALLOC_WRITECOMBINED, CUcontext,
    CUdeviceptr,
};

use crate::device::capture;
use crate::device::context::CudaContext;
use crate::device::event::CudaEvent;
use crate::device::stream::CudaStream;
use crate::driver::{About, calls};
use crate::error::{AtlasError, CaptureMisuse, HostMemoryRefusal, Result, report_cleanup};
use crate::memory::buffer::{DeviceBuffer, DeviceCopy};
use crate::memory::locked::{Backing, Locked};

/// How a [`PinnedBuffer`] is allocated (`CU_MEMHOSTALLOC_*`): none of the options by default.
///
/// ```
/// let flags = atlas_registry::PinnedFlags::new().mapped().write_combined();
/// assert!(flags.is_mapped());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct PinnedFlags(u32);

impl PinnedFlags {
    /// No option: page-locked for the context it is allocated in, not mapped, cached.
    pub const fn new() -> Self {
        Self(0)
    }

    /// Page-locked for every context, not only the one it is allocated in
    /// (`CU_MEMHOSTALLOC_PORTABLE`): raw copies of other devices run at full speed too. Atlas's
    /// safe copies stay in the buffer's own context (its event belongs to it).
    pub const fn portable(self) -> Self {
        Self(self.0 | CU_MEMHOSTALLOC_PORTABLE)
    }

    /// Mapped into the device's address space (`CU_MEMHOSTALLOC_DEVICEMAP`): kernels can read
    /// and write it over the bus at [`PinnedBuffer::device_ptr`].
    pub const fn mapped(self) -> Self {
        Self(self.0 | CU_MEMHOSTALLOC_DEVICEMAP)
    }

    /// Write-combined (`CU_MEMHOSTALLOC_WRITECOMBINED`): not cached by the CPU, so transfers to
    /// the device can be faster (up to 40% on some systems), but reads by the host are very slow.
    /// For memory the host only writes.
    pub const fn write_combined(self) -> Self {
        Self(self.0 | CU_MEMHOSTALLOC_WRITECOMBINED)
    }

    /// Whether the memory is to be mapped.
    pub const fn is_mapped(self) -> bool {
        self.0 & CU_MEMHOSTALLOC_DEVICEMAP != 0
    }

    /// The `CU_MEMHOSTALLOC_*` bits.
    pub const fn bits(self) -> u32 {
        self.0
    }
}

/// `len` elements of page-locked ("pinned") host memory, allocated in one context with
/// `cuMemHostAlloc` and freed on drop (or by [`free`](Self::free), which returns what went
/// wrong): memory the device copies to and from asynchronously, while the host works on.
///
/// # Pageable or pinned
///
/// A copy from ordinary (pageable) host memory, such as a `Vec`, goes through a staging buffer of
/// the driver: the call returns only once the driver has read the memory (or, to the host, written
/// it), so it overlaps nothing, and it is slower. Page-locked memory cannot be paged out, so the
/// device reads and writes it directly: a copy is enqueued and returns at once, it overlaps
/// kernels of other streams and the host's own work, and it reaches the full bandwidth of the bus.
/// What it costs: the memory is locked RAM taken from the rest of the system (locking too much
/// slows the whole machine), and allocating it is slow (milliseconds for large buffers; the driver
/// maps every page): allocate once and reuse, as staging buffers for repeated transfers.
///
/// # Copies that are asynchronous and safe
///
/// [`copy_to_device`](Self::copy_to_device) and [`copy_from_device`](Self::copy_from_device) only
/// enqueue the copy: the device makes it when its stream gets there. The buffer keeps the host
/// away from its memory until then: each copy records the buffer's event after it (two driver
/// calls in all), and host access ([`as_slice`](Self::as_slice),
/// [`as_mut_slice`](Self::as_mut_slice)) and the drop wait for that event where the device may
/// still write what the host would read, or read or write what the host would write. The host
/// reads memory that the device only reads without waiting. A copy takes `&mut self`, so it is
/// never enqueued while the host holds a slice of the memory:
///
/// ```compile_fail
/// # fn f(stream: &atlas_registry::CudaStream, x: &atlas_registry::DeviceBuffer<f32>, host: &mut atlas_registry::PinnedBuffer<f32>) -> atlas_registry::Result<()> {
/// let before = host.as_slice()?;
/// host.copy_from_device(stream, x)?; // refused by the compiler: `before` still reads the memory
/// println!("{}", before[0]);
/// # Ok(()) }
/// ```
///
/// A copy on a stream that Atlas captures is refused
/// ([`CaptureMisuse::PageLockedCopy`]): the graph would read
/// or write the memory at every replay, where no event of the buffer follows it. Capture the raw
/// [`copy_to_device_async`](crate::copy_to_device_async) and
/// [`copy_to_host_async`](crate::copy_to_host_async) with [`as_ptr`](Self::as_ptr) instead
/// (`unsafe`: the memory must outlive the graph and be left alone while it replays).
///
/// # Kernels
///
/// Memory allocated [`mapped`](PinnedFlags::mapped) has a device address
/// ([`device_ptr`](Self::device_ptr)) that kernels read and write over the bus. Atlas hands it
/// out as a plain address, for an `unsafe` launch, and not as a typed argument: a kernel runs
/// after its launch returns, so a borrow of the buffer by the launch would end while the kernel
/// still writes the memory, and a shared slice taken then would change under the host. The
/// launch's caller keeps the host away from the memory while the kernel runs; after the launch,
/// [`mark_used_by`](Self::mark_used_by) makes host access and the drop wait for it.
///
/// # Examples
///
/// Double buffering: while one chunk is uploaded, the host fills the other.
///
/// ```no_run
/// # fn f(registry: &atlas_registry::AtlasRegistry) -> atlas_registry::Result<()> {
/// use atlas_registry::{CudaStream, DeviceBuffer, PinnedBuffer, PinnedFlags};
/// let ctx = registry.ctx();
/// let copies = CudaStream::new(ctx)?;
/// let chunk = 1 << 20;
/// let mut staging = [
///     PinnedBuffer::<f32>::alloc(ctx, chunk, PinnedFlags::new())?,
///     PinnedBuffer::<f32>::alloc(ctx, chunk, PinnedFlags::new())?,
/// ];
/// let mut device = DeviceBuffer::<f32>::alloc(ctx, chunk)?;
/// for step in 0..8 {
///     let host = &mut staging[step % 2];
///     // Waits only for this buffer's previous upload, two steps ago.
///     host.as_mut_slice()?.fill(step as f32);
///     host.copy_to_device(&copies, &mut device)?; // returns at once
/// }
/// let mut result = PinnedBuffer::<f32>::alloc(ctx, chunk, PinnedFlags::new())?;
/// result.copy_from_device(&copies, &device)?;
/// assert_eq!(result.as_slice()?[0], 7.0); // waits for the copy
/// # Ok(()) }
/// ```
pub struct PinnedBuffer<T: DeviceCopy> {
    memory: ManuallyDrop<Locked<T>>,
    flags: PinnedFlags,
}

impl<T: DeviceCopy> PinnedBuffer<T> {
    /// Allocates `len` elements of page-locked memory in `context` (`cuMemHostAlloc`), zeroed.
    ///
    /// Refused before the driver is called: no bytes (`len` 0, or an element type of no size:
    /// [`HostMemoryRefusal::Empty`]), more bytes than the address space holds
    /// ([`AtlasError::AllocationTooLarge`]), a thread that captures
    /// ([`CaptureMisuse::PageLockWhileCapturing`]: the driver would invalidate the capture). The
    /// driver's refusal (`CUDA_ERROR_OUT_OF_MEMORY` when it cannot lock that much) is an
    /// [`AtlasError::Driver`] naming the size and the device.
    #[doc(alias = "cuMemHostAlloc")]
    pub fn alloc(context: &CudaContext, len: usize, flags: PinnedFlags) -> Result<Self> {
        Self::alloc_with(context, len, flags, |ptr| {
            // SAFETY: `ptr` holds room for `len` elements (allocated for them just now).
            unsafe { std::ptr::write_bytes(ptr, 0, len) }
        })
    }

    /// Allocates page-locked memory in `context` holding a copy of `data`, as
    /// [`alloc`](Self::alloc) does.
    #[doc(alias = "cuMemHostAlloc")]
    pub fn from_slice(context: &CudaContext, data: &[T], flags: PinnedFlags) -> Result<Self> {
        Self::alloc_with(context, data.len(), flags, |ptr| {
            // SAFETY: `ptr` holds room for `data.len()` elements (allocated for them just now),
            // and new memory does not overlap `data`.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr, data.len()) }
        })
    }

    /// Allocates `len` elements and initialises them with `init`.
    fn alloc_with(
        context: &CudaContext,
        len: usize,
        flags: PinnedFlags,
        init: impl FnOnce(*mut T),
    ) -> Result<Self> {
        let element_size = size_of::<T>();
        let bytes = len
            .checked_mul(element_size)
            .ok_or(AtlasError::AllocationTooLarge { len, element_size })?;
        if bytes == 0 {
            return Err(AtlasError::HostMemory(HostMemoryRefusal::Empty {
                len,
                element_size,
            }));
        }
        if capture::thread_is_capturing() {
            return Err(AtlasError::Capture(CaptureMisuse::PageLockWhileCapturing));
        }
        let fence = CudaEvent::new(context)?;
        context.bind()?;
        // SAFETY: the context was made current above.
        let raw = unsafe { calls::mem_host_alloc(bytes, flags.0) }.about(|| {
            format!(
                "{bytes} bytes of page-locked host memory for device {}",
                context.ordinal()
            )
        })?;
        let align = align_of::<T>();
        let Some(ptr) = NonNull::new(raw.cast::<T>()).filter(|p| p.as_ptr().is_aligned()) else {
            if !raw.is_null() {
                // SAFETY: allocated just above, freed once, used by nothing.
                let freed = unsafe { calls::mem_free_host(raw) }.map_err(AtlasError::from);
                report_cleanup("freeing misaligned page-locked memory", freed);
            }
            return Err(AtlasError::HostMemory(HostMemoryRefusal::Misaligned {
                address: raw.addr(),
                align,
            }));
        };
        init(ptr.as_ptr());
        // SAFETY: `ptr` is aligned, holds `len` elements initialised by `init`, page-locked in
        // `context` by `cuMemHostAlloc` and owned by nothing else; not mapped yet.
        let mut memory =
            unsafe { Locked::new(ptr, len, context.raw(), Backing::Allocated, 0, false, fence) };
        if flags.is_mapped() {
            // SAFETY: mapped memory (DEVICEMAP), live; its context is current (bound above).
            match unsafe { calls::mem_host_device_pointer(raw) } {
                Ok(device) => memory.set_mapped(device),
                Err(e) => {
                    report_cleanup("freeing unmapped page-locked memory", memory.release());
                    return Err(e.into());
                }
            }
        }
        Ok(Self {
            memory: ManuallyDrop::new(memory),
            flags,
        })
    }

    /// Frees the memory now, once the device is done with it, returning what went wrong
    /// (dropping the buffer does the same, but can only print a failure). Memory the device may
    /// still use (its event cannot be waited for) is leaked rather than freed. From a thread
    /// that captures, the free waits for the thread's captures to end (`cuMemFreeHost` would
    /// invalidate them), and `free` returns `Ok`.
    #[doc(alias = "cuMemFreeHost")]
    pub fn free(self) -> Result<()> {
        let mut this = ManuallyDrop::new(self);
        // SAFETY: taken once; `this` is never dropped, so neither is the memory again.
        unsafe { ManuallyDrop::take(&mut this.memory) }.release()
    }

    /// Number of elements (more than 0).
    pub fn len(&self) -> usize {
        self.memory.len()
    }

    /// Always `false`: an empty buffer is refused at allocation.
    pub fn is_empty(&self) -> bool {
        self.memory.len() == 0
    }

    /// How the buffer was allocated.
    pub fn flags(&self) -> PinnedFlags {
        self.flags
    }

    /// The raw handle of the context the buffer was allocated in.
    pub fn context(&self) -> CUcontext {
        self.memory.context()
    }

    /// The elements, once the device's copies into the buffer are done (waits for them; a copy
    /// from the buffer to the device does not stop the host reading it). From a thread that
    /// captures, a wait is refused ([`CaptureMisuse::HostWaitWhileCapturing`]).
    pub fn as_slice(&self) -> Result<&[T]> {
        self.memory.as_slice()
    }

    /// The elements, writable, once every copy of the buffer is done (waits for them).
    pub fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        self.memory.as_mut_slice()
    }

    /// Blocks until every copy of the buffer (and the work [`mark_used_by`](Self::mark_used_by)
    /// noted) is done.
    #[doc(alias = "cuEventSynchronize")]
    pub fn synchronize(&self) -> Result<()> {
        self.memory.synchronize()
    }

    /// Enqueues a copy of the whole buffer into `dst` on `stream` (`cuMemcpyHtoDAsync`) and
    /// returns; host writes to the buffer and its drop wait for the copy. Two driver calls: the
    /// copy and the record of the buffer's event (three when the buffer's last copy was on
    /// another stream and may still run: `stream` first waits for it).
    ///
    /// Refused before the driver is called: a stream or device buffer of another context
    /// ([`AtlasError::WrongContext`], naming both devices), a device buffer of another length
    /// ([`AtlasError::SizeMismatch`], naming both lengths), a stream Atlas captures
    /// ([`CaptureMisuse::PageLockedCopy`]).
    #[doc(alias = "cuMemcpyHtoDAsync_v2")]
    pub fn copy_to_device(&mut self, stream: &CudaStream, dst: &mut DeviceBuffer<T>) -> Result<()> {
        self.memory.copy_to_device(stream, dst)
    }

    /// Enqueues a copy of `src` into the whole buffer on `stream` (`cuMemcpyDtoHAsync`) and
    /// returns; every host access to the buffer and its drop wait for the copy. Driver calls and
    /// refusals as for [`copy_to_device`](Self::copy_to_device).
    #[doc(alias = "cuMemcpyDtoHAsync_v2")]
    pub fn copy_from_device(&mut self, stream: &CudaStream, src: &DeviceBuffer<T>) -> Result<()> {
        self.memory.copy_from_device(stream, src)
    }

    /// Makes host access and the drop wait for the work enqueued on `stream` so far, as if it
    /// read and wrote the buffer: for kernels given its mapped address. One driver call (the
    /// record of the buffer's event); refused as the copies are.
    #[doc(alias = "cuEventRecord")]
    pub fn mark_used_by(&mut self, stream: &CudaStream) -> Result<()> {
        self.memory.mark_used_by(stream)
    }

    /// The device address of a buffer allocated [`mapped`](PinnedFlags::mapped)
    /// (`cuMemHostGetDevicePointer`), for kernel arguments; `None` when it is not mapped.
    ///
    /// A kernel given it (an `unsafe` launch) reads and writes the memory while the host may hold
    /// slices of it: the launch's caller keeps the kernel from writing while the host holds any
    /// slice and from reading while the host holds a mutable one, and makes the buffer outlive
    /// the kernel; [`mark_used_by`](Self::mark_used_by) after the launch makes host access and the
    /// drop wait for it.
    #[doc(alias = "cuMemHostGetDevicePointer_v2")]
    pub fn device_ptr(&self) -> Option<CUdeviceptr> {
        self.memory.mapped()
    }

    /// The memory and its fence, for the copies of a batch
    /// ([`CopyBatch`](crate::CopyBatch)), which follow them as this type's own copies do.
    pub(crate) fn locked_mut(&mut self) -> &mut Locked<T> {
        &mut self.memory
    }

    /// The first element's address, for the raw copies
    /// ([`copy_to_device_async`](crate::copy_to_device_async),
    /// [`copy_to_host_async`](crate::copy_to_host_async)) that Atlas cannot follow (captured
    /// into graphs): their `unsafe` contracts are the caller's, and the buffer does not wait for
    /// them.
    pub fn as_ptr(&self) -> *mut T {
        self.memory.as_ptr()
    }
}

impl<T: DeviceCopy> fmt::Debug for PinnedBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "PinnedBuffer<{}>({:p}, len {}, {:?})",
            std::any::type_name::<T>(),
            self.memory.as_ptr(),
            self.memory.len(),
            self.flags
        )
    }
}

impl<T: DeviceCopy> Drop for PinnedBuffer<T> {
    fn drop(&mut self) {
        // SAFETY: taken once, here; the field is not used again.
        let memory = unsafe { ManuallyDrop::take(&mut self.memory) };
        report_cleanup("freeing page-locked host memory", memory.release());
    }
}
