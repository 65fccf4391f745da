//! [`HostRegistration`]: a `Vec` page-locked in place (`cuMemHostRegister`) for as long as the
//! registration owns it, copied to and from the device asynchronously as a
//! [`PinnedBuffer`](crate::PinnedBuffer) is; [`RegisterFlags`], how it is registered; and
//! [`RegistrationFailed`], a refusal that hands the `Vec` back.

use std::fmt;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;

use atlas_sys::{
    CU_MEMHOSTREGISTER_DEVICEMAP, CU_MEMHOSTREGISTER_PORTABLE, CU_MEMHOSTREGISTER_READ_ONLY,
    CUcontext, CUdeviceptr, CUresult,
};

use crate::device::capture;
use crate::device::context::CudaContext;
use crate::device::event::CudaEvent;
use crate::device::stream::CudaStream;
use crate::driver::calls;
use crate::error::{AtlasError, CaptureMisuse, HostMemoryRefusal, Result, report_cleanup};
use crate::memory::buffer::{DeviceBuffer, DeviceCopy};
use crate::memory::locked::{Backing, Locked};

/// How a [`HostRegistration`] is registered (`CU_MEMHOSTREGISTER_*`): none of the options by
/// default.
///
/// ```
/// let flags = atlas_registry::RegisterFlags::new().mapped().read_only();
/// assert!(flags.is_mapped() && flags.is_read_only());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct RegisterFlags(u32);

impl RegisterFlags {
    /// No option: page-locked for the context it is registered in, not mapped, read and written
    /// by the device.
    pub const fn new() -> Self {
        Self(0)
    }

    /// Page-locked for every context (`CU_MEMHOSTREGISTER_PORTABLE`): raw copies of other devices
    /// run at full speed too. Atlas's safe copies stay in the registration's own context.
    pub const fn portable(self) -> Self {
        Self(self.0 | CU_MEMHOSTREGISTER_PORTABLE)
    }

    /// Mapped into the device's address space (`CU_MEMHOSTREGISTER_DEVICEMAP`): kernels reach it
    /// at [`HostRegistration::device_ptr`].
    pub const fn mapped(self) -> Self {
        Self(self.0 | CU_MEMHOSTREGISTER_DEVICEMAP)
    }

    /// Read-only for the device (`CU_MEMHOSTREGISTER_READ_ONLY`, on devices that report
    /// `CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED`): copies from the device into it
    /// are refused ([`HostMemoryRefusal::ReadOnly`]).
    pub const fn read_only(self) -> Self {
        Self(self.0 | CU_MEMHOSTREGISTER_READ_ONLY)
    }

    /// Whether the memory is to be mapped.
    pub const fn is_mapped(self) -> bool {
        self.0 & CU_MEMHOSTREGISTER_DEVICEMAP != 0
    }

    /// Whether the memory is to be read-only for the device.
    pub const fn is_read_only(self) -> bool {
        self.0 & CU_MEMHOSTREGISTER_READ_ONLY != 0
    }

    /// The `CU_MEMHOSTREGISTER_*` bits.
    pub const fn bits(self) -> u32 {
        self.0
    }
}

/// The elements of a `Vec`, page-locked where they are (`cuMemHostRegister`) in one context for as
/// long as the registration owns the `Vec`; unregistered on drop (the `Vec` with it) or by
/// [`into_vec`](Self::into_vec), which hands the `Vec` back.
///
/// Copies to and from the device are asynchronous and safe, with the same rules and costs as a
/// [`PinnedBuffer`](crate::PinnedBuffer)'s (see there: pageable or pinned, the event that host
/// access and the release wait for, captures refused, kernels through
/// [`device_ptr`](Self::device_ptr)). Registering costs about what allocating page-locked memory
/// does (every page is locked), so it pays for memory that is copied many times, or too large to
/// copy once more into a pinned buffer.
///
/// The registration owns the `Vec` rather than borrowing memory: a borrowing guard can be
/// forgotten (`std::mem::forget` is safe), which ends the borrow while a copy still reads or
/// writes the memory; a forgotten registration leaks its `Vec` instead, and the memory with it.
///
/// # Examples
///
/// ```no_run
/// # fn f(registry: &atlas_registry::AtlasRegistry) -> atlas_registry::Result<()> {
/// use atlas_registry::{CudaStream, DeviceBuffer, HostRegistration, RegisterFlags};
/// let ctx = registry.ctx();
/// let stream = CudaStream::new(ctx)?;
/// let weights: Vec<f32> = (0..1 << 20).map(|i| i as f32).collect();
/// let mut host = HostRegistration::register(ctx, weights, RegisterFlags::new())?;
/// let mut device = DeviceBuffer::<f32>::alloc(ctx, host.len())?;
/// host.copy_to_device(&stream, &mut device)?; // returns at once
/// // ... launches on `stream` ...
/// host.copy_from_device(&stream, &device)?;
/// let weights = host.into_vec()?; // waits for the copies, unregisters
/// # Ok(()) }
/// ```
pub struct HostRegistration<T: DeviceCopy> {
    memory: ManuallyDrop<Locked<T>>,
    flags: RegisterFlags,
}

impl<T: DeviceCopy> HostRegistration<T> {
    /// Page-locks the elements of `vec` in `context` (`cuMemHostRegister`, its length in bytes;
    /// spare capacity is not registered) and keeps the `Vec` until the registration ends.
    ///
    /// Refused, the `Vec` handed back untouched in the [`RegistrationFailed`]: no bytes (an
    /// empty `Vec`, or an element type of no size: [`HostMemoryRefusal::Empty`]) and a thread
    /// that captures ([`CaptureMisuse::PageLockWhileCapturing`]), before the driver is called;
    /// memory that overlaps memory already page-locked, registered or allocated so
    /// ([`HostMemoryRefusal::AlreadyRegistered`], from the driver's
    /// `CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED`); another refusal of the driver
    /// ([`AtlasError::Driver`]).
    #[doc(alias = "cuMemHostRegister_v2")]
    #[doc(alias = "cuMemHostRegister")]
    pub fn register(
        context: &CudaContext,
        vec: Vec<T>,
        flags: RegisterFlags,
    ) -> std::result::Result<Self, RegistrationFailed<T>> {
        let element_size = size_of::<T>();
        // A `Vec` holds at most `isize::MAX` bytes: this does not overflow.
        let bytes = vec.len() * element_size;
        if bytes == 0 {
            let empty = HostMemoryRefusal::Empty {
                len: vec.len(),
                element_size,
            };
            return Err(RegistrationFailed::new(AtlasError::HostMemory(empty), vec));
        }
        if capture::thread_is_capturing() {
            let refusal = AtlasError::Capture(CaptureMisuse::PageLockWhileCapturing);
            return Err(RegistrationFailed::new(refusal, vec));
        }
        let fence = match CudaEvent::new(context).and_then(|fence| Ok((context.bind()?, fence))) {
            Ok(((), fence)) => fence,
            Err(error) => return Err(RegistrationFailed::new(error, vec)),
        };
        let mut vec = ManuallyDrop::new(vec);
        let (len, capacity) = (vec.len(), vec.capacity());
        let ptr = NonNull::from(vec.as_mut_slice()).cast::<T>();
        // SAFETY: the `Vec`'s buffer of `bytes` (its length) stays allocated until the
        // registration is unregistered: the `Vec` is rebuilt, to be dropped or handed back, only
        // after `cuMemHostUnregister` succeeded. The context is current (bound above).
        let registered = unsafe { calls::mem_host_register(ptr.as_ptr().cast(), bytes, flags.0) };
        if let Err(e) = registered {
            // SAFETY: the `Vec` taken apart above, not registered, rebuilt once.
            let vec = unsafe { Vec::from_raw_parts(ptr.as_ptr(), len, capacity) };
            let error = if e.code() == Some(CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED.0) {
                AtlasError::HostMemory(HostMemoryRefusal::AlreadyRegistered {
                    address: ptr.as_ptr().addr(),
                    bytes,
                })
            } else {
                e.about(|| {
                    format!(
                        "{bytes} bytes of host memory registered for device {}",
                        context.ordinal()
                    )
                })
                .into()
            };
            return Err(RegistrationFailed::new(error, vec));
        }
        let read_only = flags.is_read_only();
        // SAFETY: the `Vec`'s buffer: aligned, `len` initialised elements, of this capacity,
        // registered in `context` just now, owned by the registration alone (the `Vec` was taken
        // apart); not mapped yet.
        let mut memory = unsafe {
            Locked::new(
                ptr,
                len,
                context.raw(),
                Backing::Vec { capacity },
                0,
                read_only,
                fence,
            )
        };
        if flags.is_mapped() {
            // SAFETY: registered as mapped (DEVICEMAP), live; its context is current.
            match unsafe { calls::mem_host_device_pointer(ptr.as_ptr().cast()) } {
                Ok(device) => memory.set_mapped(device),
                Err(e) => {
                    let error = AtlasError::from(e);
                    return Err(match memory.give_back_now() {
                        Ok(Some(vec)) => RegistrationFailed::new(error, vec),
                        // The `Vec` could not be unregistered: it stays page-locked, leaked.
                        _ => RegistrationFailed::new(error, Vec::new()),
                    });
                }
            }
        }
        Ok(Self {
            memory: ManuallyDrop::new(memory),
            flags,
        })
    }

    /// Waits for the copies of the memory, unregisters it (`cuMemHostUnregister`) and hands the
    /// `Vec` back.
    ///
    /// From a thread that captures, refused ([`CaptureMisuse::HostWaitWhileCapturing`]): the
    /// registration then ends, and the `Vec` is dropped, when the thread's captures end. Memory
    /// whose copies cannot be waited for, or that the driver cannot unregister, is leaked (the
    /// error says why): the device may still use it.
    #[doc(alias = "cuMemHostUnregister")]
    pub fn into_vec(self) -> Result<Vec<T>> {
        let mut this = ManuallyDrop::new(self);
        // SAFETY: taken once; `this` is never dropped, so neither is the memory again.
        let memory = unsafe { ManuallyDrop::take(&mut this.memory) };
        // A registration always holds a `Vec`.
        Ok(memory.give_back_now()?.unwrap_or_default())
    }

    /// Number of elements (more than 0).
    pub fn len(&self) -> usize {
        self.memory.len()
    }

    /// Always `false`: an empty `Vec` is refused at registration.
    pub fn is_empty(&self) -> bool {
        self.memory.len() == 0
    }

    /// How the memory was registered.
    pub fn flags(&self) -> RegisterFlags {
        self.flags
    }

    /// The raw handle of the context the memory was registered in.
    pub fn context(&self) -> CUcontext {
        self.memory.context()
    }

    /// The elements, once the device's copies into them are done (waits for them), as
    /// [`PinnedBuffer::as_slice`](crate::PinnedBuffer::as_slice).
    pub fn as_slice(&self) -> Result<&[T]> {
        self.memory.as_slice()
    }

    /// The elements, writable, once every copy of them is done (waits for them).
    pub fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        self.memory.as_mut_slice()
    }

    /// Blocks until every copy of the memory (and the work
    /// [`mark_used_by`](Self::mark_used_by) noted) is done.
    #[doc(alias = "cuEventSynchronize")]
    pub fn synchronize(&self) -> Result<()> {
        self.memory.synchronize()
    }

    /// Enqueues a copy of the whole memory into `dst` on `stream` and returns, as
    /// [`PinnedBuffer::copy_to_device`](crate::PinnedBuffer::copy_to_device).
    #[doc(alias = "cuMemcpyHtoDAsync_v2")]
    pub fn copy_to_device(&mut self, stream: &CudaStream, dst: &mut DeviceBuffer<T>) -> Result<()> {
        self.memory.copy_to_device(stream, dst)
    }

    /// Enqueues a copy of `src` into the whole memory on `stream` and returns, as
    /// [`PinnedBuffer::copy_from_device`](crate::PinnedBuffer::copy_from_device); refused for
    /// memory registered [`read_only`](RegisterFlags::read_only)
    /// ([`HostMemoryRefusal::ReadOnly`]).
    #[doc(alias = "cuMemcpyDtoHAsync_v2")]
    pub fn copy_from_device(&mut self, stream: &CudaStream, src: &DeviceBuffer<T>) -> Result<()> {
        self.memory.copy_from_device(stream, src)
    }

    /// Makes host access and the release wait for the work enqueued on `stream` so far, as
    /// [`PinnedBuffer::mark_used_by`](crate::PinnedBuffer::mark_used_by).
    #[doc(alias = "cuEventRecord")]
    pub fn mark_used_by(&mut self, stream: &CudaStream) -> Result<()> {
        self.memory.mark_used_by(stream)
    }

    /// The device address of memory registered [`mapped`](RegisterFlags::mapped)
    /// (`cuMemHostGetDevicePointer`), for kernel arguments, with the duties of
    /// [`PinnedBuffer::device_ptr`](crate::PinnedBuffer::device_ptr); `None` when not mapped.
    #[doc(alias = "cuMemHostGetDevicePointer_v2")]
    pub fn device_ptr(&self) -> Option<CUdeviceptr> {
        self.memory.mapped()
    }

    /// The memory and its fence, for the copies of a batch
    /// ([`CopyBatch`](crate::CopyBatch)), which follow them as this type's own copies do.
    pub(crate) fn locked_mut(&mut self) -> &mut Locked<T> {
        &mut self.memory
    }

    /// The first element's address, for the raw copies Atlas cannot follow, as
    /// [`PinnedBuffer::as_ptr`](crate::PinnedBuffer::as_ptr).
    pub fn as_ptr(&self) -> *mut T {
        self.memory.as_ptr()
    }
}

impl<T: DeviceCopy> fmt::Debug for HostRegistration<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "HostRegistration<{}>({:p}, len {}, {:?}{})",
            std::any::type_name::<T>(),
            self.memory.as_ptr(),
            self.memory.len(),
            self.flags,
            if self.memory.is_read_only() {
                ", read-only"
            } else {
                ""
            }
        )
    }
}

impl<T: DeviceCopy> Drop for HostRegistration<T> {
    fn drop(&mut self) {
        // SAFETY: taken once, here; the field is not used again.
        let memory = unsafe { ManuallyDrop::take(&mut self.memory) };
        report_cleanup("unregistering host memory", memory.release());
    }
}

/// A registration refused by Atlas or the driver, with the `Vec` it was given, untouched.
/// Converts into its [`AtlasError`] for `?`.
pub struct RegistrationFailed<T> {
    /// Boxed: the refusal stays small on the success path's `Result`.
    error: Box<AtlasError>,
    vec: Vec<T>,
}

impl<T> RegistrationFailed<T> {
    fn new(error: AtlasError, vec: Vec<T>) -> Self {
        Self {
            error: Box::new(error),
            vec,
        }
    }

    /// Why the registration was refused.
    pub fn error(&self) -> &AtlasError {
        &self.error
    }

    /// The error and the `Vec`.
    pub fn into_parts(self) -> (AtlasError, Vec<T>) {
        (*self.error, self.vec)
    }

    /// The `Vec`, as it was given.
    pub fn into_vec(self) -> Vec<T> {
        self.vec
    }
}

impl<T> fmt::Debug for RegistrationFailed<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistrationFailed")
            .field("error", &self.error)
            .field("len", &self.vec.len())
            .finish()
    }
}

impl<T> fmt::Display for RegistrationFailed<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "registering host memory: {}", self.error)
    }
}

impl<T> std::error::Error for RegistrationFailed<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        // The error's own text is this one's: its source comes next.
        std::error::Error::source(&*self.error)
    }
}

impl<T> From<RegistrationFailed<T>> for AtlasError {
    fn from(failed: RegistrationFailed<T>) -> Self {
        *failed.error
    }
}
