//! [`DeviceBuffer`]: a typed allocation of device memory, and [`DeviceCopy`], the values that can
//! be copied to and from it byte for byte.

use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use atlas_sys::{CUcontext, CUdeviceptr, CUstream};

use crate::device::capture::{self, Free, Hold, How, Release};
use crate::device::context::CudaContext;
use crate::device::host::ordinal_of;
use crate::device::stream::CudaStream;
use crate::driver::{About, calls};
use crate::error::{AtlasError, MemoryOrigin, Result, report_cleanup};

/// Plain data that can be copied to and from the device byte for byte.
///
/// # Safety
///
/// 1. Every bit pattern of `size_of::<Self>()` bytes is a valid value (the device may write any).
/// 2. The type has no padding, pointers to host memory, or drop glue.
// A buffer passed to a launch by value lands here (the scalar arguments' impl of `KernelParam`
// asks for `DeviceCopy`), so the message says what to pass instead.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not plain device data (`DeviceCopy`); as a kernel argument, pass a `DeviceBuffer` as `&buf` (read) or `&mut buf` (written)"
)]
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

/// A typed allocation of device memory in one context, freed on drop (or by [`free`](Self::free),
/// which returns what went wrong).
///
/// Two kinds, one type (so both are kernel arguments alike):
/// - [`alloc`](Self::alloc) (`cuMemAlloc`) is not stream-ordered, and neither is its free: the
///   driver *may* synchronize in `cuMemFree`, but does not promise to. Atlas relies on nothing more
///   than this: a buffer can only be dropped when no borrow of it is alive, and a kernel that uses
///   it through a launch is the launch's [safety contract](crate#safety-model) — the caller keeps
///   the buffer alive until the work that uses it has finished (synchronize the stream first).
/// - [`alloc_async`](Self::alloc_async) (`cuMemAllocAsync`) is stream-ordered: the memory exists
///   from that point of the stream's order, and the buffer remembers the stream and frees itself
///   there with `cuMemFreeAsync`, in the same order. Both can be captured into a graph. So can
///   a [`MemoryPool`](crate::MemoryPool)'s allocations, which are stream-ordered too.
///
/// Memory imported from another process ([`ImportedPool::import_pointer`](crate::ImportedPool::import_pointer),
/// [`IpcMemHandle::open`](crate::IpcMemHandle::open)) is a buffer too, borrowed: dropping it
/// releases the import only, after the device's work, and the exporter's memory stays.
///
/// A buffer given to a typed launch that is captured into a graph shares its memory with that
/// graph (and with every executable graph made from it) from then on: the memory stays allocated
/// while any of them lives, and the last of the buffer and those graphs to go frees it, after the
/// device has finished the work enqueued until then (`cuCtxSynchronize`, then `cuMemFree`; while a
/// capture Atlas began is in progress anywhere, when the last one has ended). So a buffer dropped
/// during or after the capture never leaves a replay pointing at freed memory.
///
/// Copies and fills enqueued on a stream ([`DeviceMemoryMut`](crate::DeviceMemoryMut), for the buffer and its views)
/// finish after they return, so a buffer they touched is freed after its device's work: dropped,
/// a buffer of [`alloc`](Self::alloc) that such a copy or fill used is freed with
/// `cuCtxSynchronize`, then `cuMemFree` (waiting, as above, for a capture in progress in its
/// context), never under work still running. A stream-ordered buffer is freed in its stream's
/// order, after its own stream's work; work on other streams is its caller's to order (duty 3 of
/// [`alloc_async`](Self::alloc_async)).
///
/// A kernel takes a buffer as `&buf` (it reads it) or `&mut buf` (it writes it): the buffer's
/// device address, checked to be memory of the function's context. Parts of it are views
/// ([`DeviceSlice`](crate::DeviceSlice), [`DeviceSliceMut`](crate::DeviceSliceMut)), which
/// kernels, copies and fills take as they take the buffer.
///
/// ```no_run
/// # fn f(registry: &atlas_registry::AtlasRegistry) -> atlas_registry::Result<()> {
/// use atlas_registry::{DeviceBuffer, LaunchConfig};
/// let (ctx, stream) = (registry.ctx(), registry.stream());
/// let x = DeviceBuffer::from_slice(ctx, stream, &[1.0f32, 2.0, 3.0])?; // allocate and copy
/// let mut y = DeviceBuffer::<f32>::alloc(ctx, 3)?; // contents unspecified
/// y.copy_from(stream, &[10.0, 20.0, 30.0])?;
/// let axpy = registry.function_cached("elementwise", "axpy")?; // y = a * x + y
/// // SAFETY: `axpy` reads 3 floats of `x` and updates 3 of `y`; `to_vec` waits for it.
/// unsafe { axpy.launch(stream, &LaunchConfig::for_elements(3, 256), (&x, &mut y, 2.0f32, 3u32))? };
/// assert_eq!(y.to_vec(stream)?, [12.0, 24.0, 36.0]);
/// # Ok(()) }
/// ```
pub struct DeviceBuffer<T: DeviceCopy> {
    ptr: CUdeviceptr,
    len: usize,
    context: CUcontext,
    /// Where the memory comes from, and so how it goes back.
    origin: Origin,
    /// Set by the first captured launch that uses the buffer: the memory, shared with the graphs
    /// that use it from then on.
    shared: OnceLock<Arc<SharedMemory>>,
    /// Set by the first copy or fill enqueued on the buffer: its free then waits for the device.
    enqueued: AtomicBool,
    _elements: PhantomData<T>,
}

/// Where a buffer's memory comes from, and so how it is released.
enum Origin {
    /// `cuMemAlloc`: freed with `cuMemFree`.
    Alloc,
    /// A stream-ordered allocation (`cuMemAllocAsync`, or from a pool): freed with
    /// `cuMemFreeAsync` on `stream`, the one it was allocated on.
    Stream {
        stream: CUstream,
        /// Allocated while `stream` was being captured: the graph's own allocation, made and
        /// freed by graph nodes at each replay.
        in_graph: bool,
    },
    /// Memory a keeper owns (mapped virtual memory, memory imported from another process): the
    /// buffer and every graph that uses it share the keeper, and the last of them to go drops it,
    /// which releases the memory after the device's work.
    Kept(Hold),
}

/// The memory of a buffer that graphs use: freed when the last of the buffer and those graphs
/// goes, after the device's work (a replay may still be running when the last graph goes).
struct SharedMemory {
    context: CUcontext,
    ptr: CUdeviceptr,
}

// SAFETY: a device address and a context handle, never dereferenced by Rust; freed once, by
// whichever holder goes last.
unsafe impl Send for SharedMemory {}
// SAFETY: as for Send; shared references only read the two values.
unsafe impl Sync for SharedMemory {}

impl SharedMemory {
    /// Frees the memory once (the address is cleared first), after the device's work.
    fn free(&mut self) -> Result<()> {
        let ptr = std::mem::replace(&mut self.ptr, 0);
        if ptr == 0 {
            return Ok(());
        }
        capture::free(Free::new(
            self.context,
            ptr,
            How::AfterDevice(Release::Free),
        ))
    }
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        let result = self.free();
        report_cleanup("freeing device memory that graphs used", result);
    }
}

// SAFETY: the buffer owns device memory, reachable from any thread through the driver; T is Send.
// The stream of a stream-ordered buffer is a driver handle usable from any thread, which the
// caller of `alloc_async` keeps alive while the buffer lives (its duty 1).
unsafe impl<T: DeviceCopy> Send for DeviceBuffer<T> {}
// SAFETY: shared references only read the pointer and length, or enqueue reads of the memory.
unsafe impl<T: DeviceCopy> Sync for DeviceBuffer<T> {}

impl<T: DeviceCopy> DeviceBuffer<T> {
    /// Allocates room for `len` elements, contents unspecified. `len == 0` allocates nothing.
    ///
    /// Refused ([`CaptureMisuse::AllocateWhileCapturing`](crate::CaptureMisuse::AllocateWhileCapturing))
    /// while the calling thread captures a stream through Atlas: the driver would refuse
    /// `cuMemAlloc` and invalidate the capture. Allocate before the capture, or use
    /// [`alloc_async`](Self::alloc_async) on the capturing stream.
    #[doc(alias = "cuMemAlloc_v2")]
    pub fn alloc(context: &CudaContext, len: usize) -> Result<Self> {
        capture::refuse_allocation()?;
        let bytes = Self::bytes(len)?;
        let mut ptr: CUdeviceptr = 0;
        if bytes > 0 {
            context.bind()?;
            ptr = calls::mem_alloc(bytes)
                .about(|| format!("{bytes} bytes on device {}", context.ordinal()))?;
        }
        Ok(Self::with_origin(context.raw(), ptr, len, Origin::Alloc))
    }

    /// Allocates room for `len` elements in stream order on `stream` (`cuMemAllocAsync`), from the
    /// default memory pool of `context`'s device; contents unspecified. `len == 0` allocates
    /// nothing. The buffer frees itself on `stream` (`cuMemFreeAsync`) when dropped or
    /// [`free`](Self::free)d, so a temporary that lives for a few kernels costs no
    /// synchronization, and reuses the pool's memory (see
    /// [`CudaHost::set_pool_release_threshold`](crate::CudaHost::set_pool_release_threshold)).
    ///
    /// Capturable, following the driver's rules for graph memory nodes: on a stream that is being
    /// captured, the allocation becomes a graph node (`CU_GRAPH_NODE_TYPE_MEM_ALLOC`) with an
    /// address fixed for the graph's life, and the free becomes one too
    /// (`CU_GRAPH_NODE_TYPE_MEM_FREE`) when the buffer is freed in the same capture; each replay
    /// of the graph then allocates and frees it, and work may use it only between the two nodes.
    /// Such an allocation belongs to the graph: a typed launch captured with it does not make
    /// the graph hold it again, and only one executable graph of a graph with memory nodes may
    /// exist at a time (instantiating consumes the [`CudaGraph`](crate::CudaGraph)). A buffer
    /// allocated before the capture and dropped while its stream is being captured is freed when
    /// that capture has ended (`cuMemFreeAsync` in the capture would have to be of a graph
    /// allocation).
    ///
    /// Refused before the driver is called: a stream of another context
    /// ([`AtlasError::WrongContext`]), a device without memory pools
    /// ([`AtlasError::MemoryPoolsUnsupported`]), a driver without the entry points
    /// ([`AtlasError::MissingSymbol`], naming the first one missing).
    ///
    /// # Safety
    ///
    /// 1. `stream` stays valid (is not destroyed) until the buffer has been freed: dropped, or
    ///    [`free`](Self::free)d.
    /// 2. The memory is used only after the allocation in stream order: on `stream`, or on
    ///    another stream only once that stream waits for `stream` (an event recorded on `stream`
    ///    after this call) or `stream` has been synchronized since. Atlas's safe copies and fills
    ///    ([`copy_from`](Self::copy_from), [`to_vec`](Self::to_vec), those of
    ///    [`DeviceMemoryMut`](crate::DeviceMemoryMut) and [`DeviceMemory`](crate::DeviceMemory), of the buffer or a view
    ///    of it) on another stream are such uses.
    /// 3. When the buffer is freed, every use of it on other streams has finished or is ordered
    ///    before that point of `stream` (the free takes effect in `stream`'s order, not at once).
    /// 4. An allocation made while `stream` is being captured is freed in the same capture (the
    ///    buffer dropped or freed before the capture ends): the driver lets a graph be replayed again
    ///    only once what it allocated is freed, and lets only the graph free what it frees itself.
    #[doc(alias = "cuMemAllocAsync")]
    pub unsafe fn alloc_async(
        context: &CudaContext,
        stream: &CudaStream,
        len: usize,
    ) -> Result<Self> {
        check_stream(context.raw(), stream)?;
        require_memory_pools(context)?;
        let bytes = Self::bytes(len)?;
        let mut ptr: CUdeviceptr = 0;
        if bytes > 0 {
            stream.bind_if_default()?;
            // SAFETY: the stream is live (an invariant of CudaStream) and of `context` (checked
            // above); for the legacy default stream, `context` was made current above.
            ptr = unsafe { calls::mem_alloc_async(bytes, stream.raw()) }
                .about(|| format!("{bytes} bytes on device {}", context.ordinal()))?;
        }
        Ok(Self::stream_ordered(context.raw(), stream, ptr, len))
    }

    /// The buffer of `len` elements at `ptr`, a stream-ordered allocation of `context` made on
    /// `stream` (0 when nothing was allocated), freed there.
    pub(crate) fn stream_ordered(
        context: CUcontext,
        stream: &CudaStream,
        ptr: CUdeviceptr,
        len: usize,
    ) -> Self {
        // Asked of the driver only while Atlas captures somewhere: a stream that joined a capture
        // allocates in its graph too.
        let in_graph = capture::watch().capturing() && {
            // SAFETY: the stream is live (an invariant of CudaStream).
            unsafe { calls::stream_is_capturing(stream.raw()) }.unwrap_or(false)
        };
        Self::with_origin(
            context,
            ptr,
            len,
            Origin::Stream {
                stream: stream.raw(),
                in_graph,
            },
        )
    }

    /// The buffer of `len` elements at `ptr`, memory of `context` that `keeper` owns: the buffer
    /// and the graphs that use it share `keeper`, and the last of them to go drops it. Dropping
    /// it must release the memory only once no work of the device can use it any more.
    pub(crate) fn kept(context: CUcontext, ptr: CUdeviceptr, len: usize, keeper: Hold) -> Self {
        Self::with_origin(context, ptr, len, Origin::Kept(keeper))
    }

    fn with_origin(context: CUcontext, ptr: CUdeviceptr, len: usize, origin: Origin) -> Self {
        Self {
            ptr,
            len,
            context,
            origin,
            shared: OnceLock::new(),
            enqueued: AtomicBool::new(false),
            _elements: PhantomData,
        }
    }

    /// Frees the memory now, returning what went wrong (dropping the buffer frees it too, but can
    /// only print a failure): `cuMemFree` for a buffer of [`alloc`](Self::alloc), `cuMemFreeAsync`
    /// on its stream for one of [`alloc_async`](Self::alloc_async) (released in that stream's
    /// order; captured as a graph node while the stream is being captured).
    ///
    /// A free that would break a capture Atlas began waits for it, and `free` then returns `Ok`:
    /// a buffer of [`alloc`](Self::alloc) freed by a thread while it captures is freed when that
    /// thread's last capture ends (`cuMemFree` from a capturing thread would invalidate its
    /// capture), one of [`alloc_async`](Self::alloc_async) made before a capture of its stream
    /// when that capture ends. Memory that graphs use is freed by the last of them to go (see the
    /// type's docs), and `free` returns `Ok` while one lives.
    #[doc(alias = "cuMemFree_v2")]
    #[doc(alias = "cuMemFreeAsync")]
    pub fn free(mut self) -> Result<()> {
        self.release()
    }

    /// Whether the buffer was allocated in stream order ([`alloc_async`](Self::alloc_async)) and
    /// is freed on its stream.
    pub fn is_stream_ordered(&self) -> bool {
        matches!(self.origin, Origin::Stream { .. })
    }

    /// Where the memory comes from, for the ways of sharing that take one kind only.
    pub(crate) fn origin(&self) -> MemoryOrigin {
        match self.origin {
            Origin::Alloc => MemoryOrigin::Allocated,
            Origin::Stream { .. } => MemoryOrigin::StreamOrdered,
            Origin::Kept(_) => MemoryOrigin::Kept,
        }
    }

    /// Bytes of `len` elements, or the error saying they do not fit.
    pub(crate) fn bytes(len: usize) -> Result<usize> {
        len.checked_mul(size_of::<T>())
            .ok_or(AtlasError::AllocationTooLarge {
                len,
                element_size: size_of::<T>(),
            })
    }

    /// Frees the memory once: the pointer is cleared first, so a second call (the drop after
    /// [`free`](Self::free)) does nothing. Memory that graphs share is left to the last of them.
    fn release(&mut self) -> Result<()> {
        let ptr = std::mem::replace(&mut self.ptr, 0);
        if let Some(shared) = self.shared.take() {
            return Arc::into_inner(shared).map_or(Ok(()), |mut memory| memory.free());
        }
        if ptr == 0 {
            return Ok(());
        }
        let how = match &self.origin {
            Origin::Alloc if *self.enqueued.get_mut() => How::AfterDevice(Release::Free),
            Origin::Alloc => How::Plain,
            Origin::Stream {
                stream,
                in_graph: true,
            } => How::InCapture(*stream as usize),
            Origin::Stream { stream, .. } => How::OnStream(*stream as usize),
            // The keeper releases the memory when the last of its holders goes.
            Origin::Kept(_) => {
                self.origin = Origin::Alloc;
                return Ok(());
            }
        };
        capture::free(Free::new(self.context, ptr, how))
    }

    /// What a graph that captured a launch with this buffer holds: its memory, shared from now
    /// on; nothing for an empty buffer or the graph's own allocation.
    pub(crate) fn hold_for_graph(&self) -> Option<Hold> {
        match &self.origin {
            _ if self.ptr == 0 => return None,
            Origin::Stream { in_graph: true, .. } => return None,
            Origin::Kept(keeper) => return Some(Arc::clone(keeper)),
            Origin::Alloc | Origin::Stream { .. } => {}
        }
        let shared = self.shared.get_or_init(|| {
            Arc::new(SharedMemory {
                context: self.context,
                ptr: self.ptr,
            })
        });
        Some(Arc::clone(shared) as Hold)
    }

    /// Notes that a copy or fill touching the buffer was enqueued: from now on its free waits for
    /// the device's work. One relaxed load, and a store the first time.
    #[inline]
    pub(crate) fn note_enqueued_use(&self) {
        if !self.enqueued.load(Ordering::Relaxed) {
            self.enqueued.store(true, Ordering::Relaxed);
        }
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
}

/// `Ok` when `context`'s device can allocate in stream order: the driver has the entry points
/// (else [`AtlasError::MissingSymbol`] naming the first one missing) and the device has memory
/// pools (else [`AtlasError::MemoryPoolsUnsupported`]).
pub(crate) fn require_memory_pools(context: &CudaContext) -> Result<()> {
    calls::require_memory_pool_entry_points()?;
    if !context.memory_pools_supported()? {
        return Err(AtlasError::MemoryPoolsUnsupported {
            device: context.ordinal(),
        });
    }
    Ok(())
}

/// `Ok` when `stream` is of `context`, else the refusal naming both devices.
#[inline]
pub(crate) fn check_stream(context: CUcontext, stream: &CudaStream) -> Result<()> {
    if stream.context() == context {
        return Ok(());
    }
    Err(AtlasError::WrongContext {
        what: "the stream".into(),
        expected: ordinal_of(context),
        given: ordinal_of(stream.context()),
    })
}

/// Enqueues `op` on `stream`, an operation (a copy, a fill) that touches the memory of `touched`:
/// each buffer is freed only after its device's work from now on, and a capture of `stream` that
/// Atlas began keeps each one for its graph, as it does for a typed launch's buffer arguments.
/// Outside a capture this adds one atomic load (and a store the first time a buffer is touched)
/// to the driver call `op` makes. The capture is looked for once, before `op`: one of `stream`
/// begins and ends only through `&mut CudaStream`, so none does while `stream` is borrowed here.
#[inline]
pub(crate) fn enqueue<T: DeviceCopy, const N: usize>(
    stream: &CudaStream,
    touched: [&DeviceBuffer<T>; N],
    op: impl FnOnce() -> Result<()>,
) -> Result<()> {
    for buffer in touched {
        buffer.note_enqueued_use();
    }
    if capture::watch().capturing() {
        hold_for_capture(stream.raw(), &touched);
    }
    op()
}

/// When `stream` is captured by a capture Atlas began, leaves its graph the memory of `touched`:
/// what `launch::held` does for a launch's arguments, asked of the same record (memory sits below
/// launch, so it asks the record itself).
#[cold]
#[inline(never)]
fn hold_for_capture<T: DeviceCopy>(stream: CUstream, touched: &[&DeviceBuffer<T>]) {
    let Some(graph) = capture::graph_of(stream) else {
        return;
    };
    let holds = touched.iter().filter_map(|b| b.hold_for_graph()).collect();
    capture::hold(graph, holds, false);
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
        let result = self.release();
        report_cleanup("freeing a device buffer", result);
    }
}
