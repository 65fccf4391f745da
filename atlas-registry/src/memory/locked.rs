//! Page-locked host memory in stream order: the memory behind a
//! [`PinnedBuffer`](crate::PinnedBuffer) or a [`HostRegistration`](crate::HostRegistration), the
//! asynchronous copies that read or write it, and the event that keeps the host away from it
//! until the device is done.
//!
//! From page-locked memory a copy is a transfer the device makes when its stream reaches it, after
//! the call has returned. Rust lets the host read memory through `&[T]` only while nothing writes
//! it, and write through `&mut [T]` only while nothing else touches it; a transfer behind a live
//! slice would break that. So:
//!
//! - a copy takes `&mut self`: no host slice of the memory is alive when it is enqueued;
//! - after the copy, the memory's one event (its *fence*, created with it) is recorded on the
//!   copy's stream, and the memory notes what the device may still do to it: read it (a copy to
//!   the device) or write it (a copy from the device);
//! - host access waits for the fence (`cuEventSynchronize`) when the device may still do
//!   something that conflicts: a shared slice waits for writes, a mutable slice for reads and
//!   writes, and so does the release of the memory (its free or unregistration); a wait clears the
//!   note, so access costs no driver call until the next copy;
//! - a copy on another stream than the fence's last record first makes that stream wait for the
//!   fence (`cuStreamWaitEvent`), so that the fence, recorded again, follows both copies;
//! - a copy on a stream whose work goes into a capture Atlas began is refused: the graph copies at
//!   every replay, long after the capture, where no fence follows it.
//!
//! One copy on the stream of the previous one is two driver calls: the copy and the record.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, Ordering};

use atlas_sys::{CUcontext, CUdeviceptr, CUstream};

use crate::device::capture::{self, Free};
use crate::device::context::{ensure_bound, ordinal_of};
use crate::device::event::CudaEvent;
use crate::device::stream::CudaStream;
use crate::driver::{self, About, calls};
use crate::error::{AtlasError, CaptureMisuse, HostMemoryRefusal, Result};
use crate::memory::buffer::{DeviceBuffer, DeviceCopy};

/// The device may still read the memory: a copy to the device, or a marked use.
pub(crate) const READS: u8 = 1;
/// The device may still write the memory: a copy from the device, or a marked use.
pub(crate) const WRITES: u8 = 2;
/// A copy was enqueued that the fence does not follow (its record and a synchronize of its stream
/// both failed): the device may use the memory at any time from now on.
const UNFENCED: u8 = 4;

/// `CU_STREAM_PER_THREAD`: one handle for a different stream on every thread, so never "the
/// stream of the fence's last record".
const PER_THREAD_STREAM: usize = 2;

/// Where page-locked memory came from, and how it is given back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backing {
    /// `cuMemHostAlloc`: freed with `cuMemFreeHost`.
    Allocated,
    /// The buffer of a `Vec` of this capacity, registered with `cuMemHostRegister`: unregistered,
    /// then the `Vec` is rebuilt and dropped (or handed back).
    Vec {
        /// The `Vec`'s capacity.
        capacity: usize,
    },
}

/// `len` elements of page-locked host memory of one context, and its fence.
pub(crate) struct Locked<T: DeviceCopy> {
    ptr: NonNull<T>,
    len: usize,
    context: CUcontext,
    backing: Backing,
    /// The device address of mapped memory; 0 when not mapped.
    mapped: CUdeviceptr,
    /// Registered read-only for the device: no copy from the device may write it.
    read_only: bool,
    /// Recorded after every copy; waited for before host access and release.
    fence: CudaEvent,
    /// What the device may still do to the memory as of the fence's last record (`READS`,
    /// `WRITES`, `UNFENCED`). Set only through `&mut self`; cleared through `&self` by a wait.
    pending: AtomicU8,
    /// The stream of the fence's last record, compared and never dereferenced.
    last_stream: CUstream,
}

// SAFETY: the memory is host memory owned by this value (the element type is Send), reachable
// from any thread; the fence is Send; the context and stream are driver handles, the stream never
// dereferenced.
unsafe impl<T: DeviceCopy> Send for Locked<T> {}
// SAFETY: shared references read the memory (after waiting for the device's writes), read the
// handles, or wait for the fence (CudaEvent is Sync) and clear `pending` atomically; everything
// that enqueues work on the memory takes `&mut self`.
unsafe impl<T: DeviceCopy> Sync for Locked<T> {}

impl<T: DeviceCopy> Locked<T> {
    /// The memory at `ptr`, `len` elements of initialised values (more than 0 bytes), page-locked
    /// in `context` and given back as `backing` says, with its fence (an event of `context`).
    ///
    /// # Safety
    ///
    /// 1. `ptr` is aligned for `T` and holds `len` initialised elements, page-locked for
    ///    `context` (allocated by `cuMemHostAlloc`, or a `Vec`'s buffer of that capacity
    ///    registered with `cuMemHostRegister`, as `backing` says), owned by the new value alone.
    /// 2. `mapped` is 0, or the memory's device address in `context`.
    pub(crate) unsafe fn new(
        ptr: NonNull<T>,
        len: usize,
        context: CUcontext,
        backing: Backing,
        mapped: CUdeviceptr,
        read_only: bool,
        fence: CudaEvent,
    ) -> Self {
        Self {
            ptr,
            len,
            context,
            backing,
            mapped,
            read_only,
            fence,
            pending: AtomicU8::new(0),
            last_stream: std::ptr::null_mut(),
        }
    }

    /// Number of elements.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The context the memory is page-locked in.
    pub(crate) fn context(&self) -> CUcontext {
        self.context
    }

    /// The device address of mapped memory.
    pub(crate) fn mapped(&self) -> Option<CUdeviceptr> {
        (self.mapped != 0).then_some(self.mapped)
    }

    /// Sets the device address, once the memory is known to be mapped.
    pub(crate) fn set_mapped(&mut self, mapped: CUdeviceptr) {
        self.mapped = mapped;
    }

    /// Whether the memory is registered read-only for the device.
    pub(crate) fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// The first element's address.
    pub(crate) fn as_ptr(&self) -> *mut T {
        self.ptr.as_ptr()
    }

    /// The elements, once the device's writes to them are done.
    pub(crate) fn as_slice(&self) -> Result<&[T]> {
        self.wait(WRITES)?;
        // SAFETY: `len` initialised elements owned by self (duty 1 of `new`); no write of the
        // device is pending (waited for above), and none is enqueued while the slice lives
        // (copies take `&mut self`).
        Ok(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) })
    }

    /// The elements, writable, once the device's reads and writes of them are done.
    pub(crate) fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        self.wait(READS | WRITES)?;
        // SAFETY: as for `as_slice`, and no read of the device is pending either; the slice
        // borrows self mutably, so nothing else touches the memory while it lives.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) })
    }

    /// Blocks until the device is done with the memory.
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.wait(READS | WRITES)
    }

    /// Waits for the fence when the device may still do one of `conflicts` to the memory.
    #[inline]
    fn wait(&self, conflicts: u8) -> Result<()> {
        let pending = self.pending.load(Ordering::Acquire);
        if pending & (conflicts | UNFENCED) == 0 {
            return Ok(());
        }
        self.wait_for_fence(pending)
    }

    #[cold]
    fn wait_for_fence(&self, pending: u8) -> Result<()> {
        if pending & UNFENCED != 0 {
            return Err(AtlasError::HostMemory(HostMemoryRefusal::Unfenced));
        }
        if capture::thread_is_capturing() {
            return Err(AtlasError::Capture(CaptureMisuse::HostWaitWhileCapturing));
        }
        self.fence.synchronize()?;
        // Only `&mut self` sets bits, so none was set since the load: everything noted is done.
        // Release: a thread that reads 0 sees the memory as the device left it.
        self.pending.store(0, Ordering::Release);
        Ok(())
    }

    /// Enqueues a copy of the memory into `dst` on `stream`, followed by the fence.
    pub(crate) fn copy_to_device(
        &mut self,
        stream: &CudaStream,
        dst: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        self.check(stream, dst, "copy to the device")?;
        let (src, bytes, device) = (self.ptr.as_ptr(), self.bytes(), dst.device_ptr());
        self.fenced(stream, READS, || {
            // SAFETY: `device` is `dst`'s memory of `bytes` (the lengths agree: `check`), of the
            // stream's context (`check`), which is current for a default stream (`fenced`).
            // `src` holds `bytes` and stays allocated and unwritten until the copy is done: the
            // fence recorded after it is waited for before any host write and before the release.
            unsafe { calls::copy_to_device(device, src.cast::<c_void>(), bytes, stream.raw()) }
        })
    }

    /// Enqueues a copy of `src` into the memory on `stream`, followed by the fence.
    pub(crate) fn copy_from_device(
        &mut self,
        stream: &CudaStream,
        src: &DeviceBuffer<T>,
    ) -> Result<()> {
        if self.read_only {
            return Err(AtlasError::HostMemory(HostMemoryRefusal::ReadOnly));
        }
        self.check(stream, src, "copy to the host")?;
        let (dst, bytes, device) = (self.ptr.as_ptr(), self.bytes(), src.device_ptr());
        self.fenced(stream, WRITES, || {
            // SAFETY: as for `copy_to_device`; `dst` has room for `bytes` and stays allocated,
            // unread and unwritten by the host until the copy is done: the fence recorded after
            // it is waited for before any host access and before the release, and no host slice
            // is alive now (`&mut self`).
            unsafe { calls::copy_to_host(dst.cast::<c_void>(), device, bytes, stream.raw()) }
        })
    }

    /// Records the fence after the work enqueued on `stream` so far, which may read and write
    /// the memory (kernels given its mapped address).
    pub(crate) fn mark_used_by(&mut self, stream: &CudaStream) -> Result<()> {
        self.check_stream(stream)?;
        self.refuse_captured(stream)?;
        self.fenced(stream, READS | WRITES, || Ok(()))
    }

    /// The copy's refusals, before the driver: a stream or buffer of another context, a stream
    /// Atlas captures, lengths that differ.
    fn check(&self, stream: &CudaStream, buffer: &DeviceBuffer<T>, what: &str) -> Result<()> {
        self.check_stream(stream)?;
        if buffer.context_raw() != self.context {
            return Err(self.wrong_context("the device buffer", buffer.context_raw()));
        }
        self.refuse_captured(stream)?;
        if buffer.len() != self.len {
            return Err(AtlasError::SizeMismatch {
                what: format!(
                    "{what}: page-locked host memory of {} elements and a device buffer of {}",
                    self.len,
                    buffer.len()
                ),
                expected: self.bytes(),
                given: buffer.len() * size_of::<T>(),
            });
        }
        Ok(())
    }

    fn check_stream(&self, stream: &CudaStream) -> Result<()> {
        if stream.context() != self.context {
            return Err(self.wrong_context("the stream", stream.context()));
        }
        Ok(())
    }

    /// Refuses work on a stream whose work goes into a capture Atlas began: its own, a fork's, or
    /// one it joined (one atomic load when nothing is captured anywhere).
    fn refuse_captured(&self, stream: &CudaStream) -> Result<()> {
        if capture::graph_of(stream.raw()).is_some() {
            return Err(AtlasError::Capture(CaptureMisuse::PageLockedCopy));
        }
        Ok(())
    }

    #[cold]
    fn wrong_context(&self, what: &str, given: CUcontext) -> AtlasError {
        AtlasError::WrongContext {
            what: what.into(),
            expected: ordinal_of(self.context),
            given: ordinal_of(given),
        }
    }

    /// Enqueues `enqueue` on `stream` (of the memory's context, not captured by Atlas: checked by
    /// the caller), then records the fence after it, noting `uses`.
    fn fenced(
        &mut self,
        stream: &CudaStream,
        uses: u8,
        enqueue: impl FnOnce() -> driver::Result<()>,
    ) -> Result<()> {
        self.prepare_use(stream)?;
        stream.bind_if_default()?;
        enqueue().about(|| format!("{} bytes of page-locked host memory", self.bytes()))?;
        self.follow_use(stream, uses)
    }

    /// The first half of [`fenced`](Self::fenced), for work that touches several memories at once
    /// (a batch of copies): refuses memory the device may use unfenced, and makes `stream` (of the
    /// memory's context, not captured by Atlas: checked by the caller) wait for the fence when
    /// earlier work of the memory may still run on another stream. Work enqueued on `stream`
    /// after this, and before [`follow_use`](Self::follow_use), may touch the memory.
    pub(crate) fn prepare_use(&mut self, stream: &CudaStream) -> Result<()> {
        let pending = *self.pending.get_mut();
        if pending & UNFENCED != 0 {
            return Err(AtlasError::HostMemory(HostMemoryRefusal::Unfenced));
        }
        let raw = stream.raw();
        // The fence follows earlier work of the memory only on its own stream: another stream
        // waits for it first. A handle equal to the last one names the same stream: a destroyed
        // stream's handle is released only once its work (and the fence's record) is done, so a
        // new stream that reuses it has nothing of the memory's before it to wait for.
        if pending != 0 && (raw != self.last_stream || raw.addr() == PER_THREAD_STREAM) {
            stream.wait(&self.fence)?;
        }
        Ok(())
    }

    /// The second half of [`fenced`](Self::fenced): records the fence on `stream` after the work
    /// enqueued since [`prepare_use`](Self::prepare_use), noting `uses` (`READS`, `WRITES`). When
    /// the record fails, the stream is synchronized instead (or the memory marked unfenced).
    pub(crate) fn follow_use(&mut self, stream: &CudaStream, uses: u8) -> Result<()> {
        let pending = *self.pending.get_mut();
        if let Err(e) = self.fence.record(stream) {
            // The work is enqueued but not followed by the fence: wait for it here instead.
            // The stream waited for the fence's last record (`prepare_use`) or is its stream, so
            // once it is synchronized, everything noted so far is done too.
            let settled = if stream.synchronize_unchecked().is_ok() {
                0
            } else {
                UNFENCED
            };
            *self.pending.get_mut() = settled;
            return Err(e);
        }
        *self.pending.get_mut() = pending | uses;
        self.last_stream = stream.raw();
        Ok(())
    }

    /// Bytes of the memory (they fit: the memory exists).
    fn bytes(&self) -> usize {
        self.len * size_of::<T>()
    }

    /// Gives the memory back (`cuMemFreeHost`, or `cuMemHostUnregister` and the `Vec` dropped)
    /// once the device is done with it. From a thread that captures, the release waits for the
    /// thread's captures to end (then `Ok`): the driver would refuse it and invalidate them.
    /// Memory the device may still use is leaked, and so is memory the driver could not give back.
    pub(crate) fn release(self) -> Result<()> {
        let context = self.context;
        capture::free(Free::host(
            context,
            Box::new(move || self.give_back().map(drop)),
        ))
    }

    /// Gives the memory back now, as [`release`](Self::release) does, and hands a registered
    /// `Vec` back instead of dropping it. Refused from a thread that captures
    /// ([`CaptureMisuse::HostWaitWhileCapturing`]); the memory is then released when the
    /// thread's captures end.
    pub(crate) fn give_back_now(self) -> Result<Option<Vec<T>>> {
        if capture::thread_is_capturing() {
            drop(self.release());
            return Err(AtlasError::Capture(CaptureMisuse::HostWaitWhileCapturing));
        }
        self.give_back()
    }

    /// Waits for the device, then frees or unregisters the memory; a registered `Vec` is rebuilt
    /// and returned. What cannot be given back safely is leaked.
    fn give_back(mut self) -> Result<Option<Vec<T>>> {
        let pending = *self.pending.get_mut();
        if pending & UNFENCED != 0 {
            return Err(AtlasError::HostMemory(HostMemoryRefusal::Unfenced));
        }
        if pending != 0 {
            // On failure the memory is leaked: the device may still use it.
            self.fence.synchronize()?;
        }
        ensure_bound(self.context)?;
        let ptr = self.ptr.as_ptr().cast::<c_void>();
        match self.backing {
            Backing::Allocated => {
                // SAFETY: allocated by `cuMemHostAlloc` (duty 1 of `new`) and freed once (`self`
                // is consumed); the device is done with it (waited for above) and the host holds
                // no slice of it (`self` is owned here).
                unsafe { calls::mem_free_host(ptr) }?;
                Ok(None)
            }
            Backing::Vec { capacity } => {
                // SAFETY: as above, for the registration made at `ptr`. On failure the `Vec` is
                // not rebuilt: its buffer, still page-locked, stays out of the allocator's hands.
                unsafe { calls::mem_host_unregister(ptr) }?;
                // SAFETY: the `Vec`'s own buffer, length and capacity (duty 1 of `new`), taken
                // apart once and rebuilt once (`self` is consumed).
                Ok(Some(unsafe {
                    Vec::from_raw_parts(self.ptr.as_ptr(), self.len, capacity)
                }))
            }
        }
    }
}
