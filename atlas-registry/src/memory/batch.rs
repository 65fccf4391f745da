//! [`CopyBatch`]: many copies between host and device memory, and between device memory,
//! enqueued as one driver call (`cuMemcpyBatchAsync`, drivers of CUDA 12.8 or newer): the cache
//! blocks a serving engine swaps between the device and the host, thousands at a step.
//!
//! The checks and what happens after a batch is enqueued are told on [`CopyBatch`].

use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use atlas_sys::{CUcontext, CUdeviceptr, CUmemcpyFlags};

use crate::device::capture;
use crate::device::context::ordinal_of;
use crate::device::stream::CudaStream;
use crate::driver::{self, calls};
use crate::error::{AtlasError, BatchRefusal, CaptureMisuse, CopySide, HostMemoryRefusal, Result};
use crate::memory::buffer::DeviceCopy;
use crate::memory::locked::{Locked, READS, WRITES};
use crate::memory::pinned::PinnedBuffer;
use crate::memory::registered::HostRegistration;
use crate::memory::view::{DeviceSlice, DeviceSliceMut};

#[cfg(doc)]
use crate::memory::buffer::DeviceBuffer;

/// The builder numbers: each [`CopyBatch::begin`] takes the next, which its handles carry.
static NEXT_BUILDER: AtomicU64 = AtomicU64::new(1);

/// Reusable storage for batches of copies: the arrays handed to the driver and what checks them.
/// Each [`begin`](Self::begin) starts an empty batch on a stream, keeping the capacity the
/// vectors have grown to, so a loop that swaps blocks at every step allocates nothing once its
/// batches have reached their size.
///
/// A batch is filled through a [`BatchBuilder`], which [`CopyBatch::begin`] makes for one stream.
/// The memory the blocks copy between is added to the builder once, and the builder hands back a
/// small handle ([`HostSource`], [`HostDestination`], [`DeviceSource`], [`DeviceDestination`])
/// that blocks name with an offset: any number of blocks, at any offsets, into and out of the same
/// memory, with no allocation beyond the batch's own vectors.
///
/// # What a batch checks
///
/// - The builder borrows the memory added to it until it is enqueued or dropped: destinations
///   mutably (a [`DeviceSliceMut`], `&mut [T]`), sources shared (a [`DeviceSlice`], `&[T]`), and
///   page-locked memory that Atlas owns ([`PinnedBuffer`], [`HostRegistration`]) mutably either
///   way, since its copies move the event that guards it. So nothing the batch writes is touched
///   elsewhere while it is built, nothing it reads is written, and nothing it uses is freed.
/// - Memory is checked when it is added: device memory and page-locked memory of another context
///   than the stream's are refused ([`AtlasError::WrongContext`]), page-locked memory registered
///   read-only as a destination ([`HostMemoryRefusal::ReadOnly`]).
/// - Each block is checked when it is added, before any driver call: its handles come from this
///   builder ([`BatchRefusal::ForeignMemory`]), and its range lies in both sides' memory
///   ([`BatchRefusal::OutOfRange`], with the side, the range and the length). Blocks are numbered
///   from 0 in the order they are added; a refused block names the number it would have had and
///   leaves the batch as it was.
/// - [`BatchBuilder::enqueue`] refuses destinations that overlap
///   ([`BatchRefusal::OverlappingDestinations`], naming both blocks): the copies of a batch run in
///   no set order, so what overlapping ones leave behind is undefined.
/// - Blocks of no elements are checked and numbered like the others but never reach the driver,
///   which refuses a zero size; a batch with nothing to copy makes no driver call.
///
/// # After `enqueue`
///
/// When [`BatchBuilder::enqueue`] returns, the copies run in the stream's order, and what they touch is kept as
/// each memory's own enqueued copies keep it: a device buffer a block touched is freed only after
/// the device's work ([`DeviceBuffer`]'s drop waits for it); page-locked memory is followed by its
/// event, recorded after the batch, which host access and the release wait for; memory given as
/// ordinary slices ([`BatchBuilder::read_slice`], [`BatchBuilder::write_slice`]) is waited for
/// before `enqueue` returns (a stream synchronize), as the driver may still use it after the call.
///
/// # Driver calls
///
/// One `cuMemcpyBatchAsync` per batch, and for each page-locked memory added one
/// `cuEventRecord` after it (and one `cuStreamWaitEvent` before it when that memory's last copy
/// may still run on another stream); a `cuStreamSynchronize` when slices took part. A batch
/// between device memory is the one call.
///
/// The driver refuses a batch on the legacy default stream, and cannot capture one into a graph
/// (it answers `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`, leaving the capture going without the
/// copies): both are refused before it ([`BatchRefusal::LegacyDefaultStream`],
/// [`CaptureMisuse::BatchedCopy`]). A driver older than CUDA 12.8 lacks the entry point
/// ([`BatchRefusal::Unavailable`]). When the driver refuses a batch at one block (its `failIdx`),
/// the error is [`AtlasError::BatchBlockFailed`] with the block's number.
///
/// # Examples
///
/// Swapping cache blocks in and out between the device and page-locked host memory, each
/// direction one driver call, with the storage kept from step to step:
///
/// ```no_run
/// # fn f(registry: &atlas_registry::AtlasRegistry) -> atlas_registry::Result<()> {
/// use atlas_registry::{CopyBatch, CudaStream, DeviceBuffer, DeviceMemory, DeviceMemoryMut};
/// use atlas_registry::{PinnedBuffer, PinnedFlags};
/// const BLOCK: usize = 8 << 10; // elements of one cache block
/// let ctx = registry.ctx();
/// let swap = CudaStream::new(ctx)?;
/// let mut gpu_cache = DeviceBuffer::<u16>::alloc(ctx, 1024 * BLOCK)?;
/// let mut cpu_cache = PinnedBuffer::<u16>::alloc(ctx, 4096 * BLOCK, PinnedFlags::new())?;
/// let mut batch = CopyBatch::with_capacity(256);
///
/// // Swap in: host blocks 7 and 9 into device blocks 0 and 3.
/// let mut copies = batch.begin(&swap)?;
/// let cpu = copies.read_host(&mut cpu_cache)?;
/// let gpu = copies.write_device(gpu_cache.as_slice_mut())?;
/// for (from, to) in [(7, 0), (9, 3)] {
///     copies.host_to_device(cpu, from * BLOCK, gpu, to * BLOCK, BLOCK)?;
/// }
/// copies.enqueue()?; // returns at once: the copies run on `swap`
///
/// // Swap out: device block 5 into host block 100.
/// let mut copies = batch.begin(&swap)?;
/// let gpu = copies.read_device(gpu_cache.as_slice())?;
/// let cpu = copies.write_host(&mut cpu_cache)?;
/// copies.device_to_host(gpu, 5 * BLOCK, cpu, 100 * BLOCK, BLOCK)?;
/// copies.enqueue()?;
/// let block = &cpu_cache.as_slice()?[100 * BLOCK..101 * BLOCK]; // waits for the copy
/// # drop(block);
/// # Ok(()) }
/// ```
pub struct CopyBatch {
    /// The driver's arrays: one entry per block that copies something.
    dsts: Vec<CUdeviceptr>,
    srcs: Vec<CUdeviceptr>,
    sizes: Vec<usize>,
    /// What each entry writes, and its block; sorted by address when the batch is enqueued.
    written: Vec<Written>,
    /// The page-locked memory added to the batch being built, and what its copies do to it
    /// (`READS`, `WRITES`). Each pointer comes from a `&mut` that the builder holds for its whole
    /// life; the vector is emptied when the builder ends, and by every `begin`.
    fenced: Vec<(NonNull<dyn Fence>, u8)>,
    /// `CU_MEMCPY_FLAG_*` for every copy.
    flags: u32,
}

// SAFETY: the pointers in `fenced` are dereferenced only by the builder that stored them, while
// it holds the `&mut` borrows they come from (of Send and Sync memory: `Locked` is both); outside
// a builder the batch holds plain numbers, and a builder borrows the batch mutably, so no other
// thread sees it meanwhile.
unsafe impl Send for CopyBatch {}
// SAFETY: shared references read the vectors' capacities only.
unsafe impl Sync for CopyBatch {}

/// The bytes one driver entry writes, `start..end`, and the block it comes from.
#[derive(Debug, Clone, Copy)]
struct Written {
    start: CUdeviceptr,
    end: CUdeviceptr,
    block: usize,
    entry: usize,
}

impl CopyBatch {
    /// Empty storage; the vectors grow with the first batches.
    pub fn new() -> Self {
        Self::with_capacity(0)
    }

    /// Storage with room for `blocks` blocks that copy something.
    pub fn with_capacity(blocks: usize) -> Self {
        Self {
            dsts: Vec::with_capacity(blocks),
            srcs: Vec::with_capacity(blocks),
            sizes: Vec::with_capacity(blocks),
            written: Vec::with_capacity(blocks),
            fenced: Vec::new(),
            flags: 0,
        }
    }

    /// How many blocks that copy something fit before the vectors grow.
    pub fn capacity(&self) -> usize {
        self.dsts
            .capacity()
            .min(self.srcs.capacity())
            .min(self.sizes.capacity())
            .min(self.written.capacity())
    }

    /// Asks the driver to run the copies of later batches alongside kernels rather than ahead of
    /// them (`CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE`): a hint, which it may ignore depending
    /// on the platform and the copies. Off by default.
    #[doc(alias = "CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE")]
    pub fn prefer_overlap_with_compute(&mut self, prefer: bool) -> &mut Self {
        let flag = CUmemcpyFlags::CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE.0;
        self.flags = if prefer {
            self.flags | flag
        } else {
            self.flags & !flag
        };
        self
    }

    /// Starts an empty batch of copies on `stream`, to be filled through the builder returned and
    /// enqueued with [`BatchBuilder::enqueue`]. No driver call.
    ///
    /// Refused: a driver without `cuMemcpyBatchAsync` ([`BatchRefusal::Unavailable`]: older than
    /// CUDA 12.8), the legacy default stream ([`BatchRefusal::LegacyDefaultStream`]: the driver
    /// refuses it; the per-thread default stream is taken), a stream Atlas captures
    /// ([`CaptureMisuse::BatchedCopy`]: the driver cannot capture a batch).
    #[doc(alias = "cuMemcpyBatchAsync")]
    pub fn begin<'b>(&'b mut self, stream: &'b CudaStream) -> Result<BatchBuilder<'b>> {
        calls::require_batch_copy_entry_point().map_err(batch_error)?;
        if stream.raw().addr() <= LEGACY_STREAM {
            return Err(AtlasError::Batch(BatchRefusal::LegacyDefaultStream));
        }
        // Checked once: a capture of the stream begins only through `&mut CudaStream`, and the
        // builder borrows it until it ends.
        if capture::graph_of(stream.raw()).is_some() {
            return Err(AtlasError::Capture(CaptureMisuse::BatchedCopy));
        }
        self.clear();
        Ok(BatchBuilder {
            batch: self,
            stream,
            id: NEXT_BUILDER.fetch_add(1, Ordering::Relaxed),
            blocks: 0,
            waits: false,
        })
    }

    /// Empties the batch, keeping the vectors' capacity.
    fn clear(&mut self) {
        self.dsts.clear();
        self.srcs.clear();
        self.sizes.clear();
        self.written.clear();
        self.fenced.clear();
    }

    /// Refuses two entries whose destinations overlap, naming their blocks.
    fn refuse_overlaps(&mut self) -> Result<()> {
        self.written.sort_unstable_by_key(|w| w.start);
        let Some((&first, rest)) = self.written.split_first() else {
            return Ok(());
        };
        // Sorted by start, ranges are disjoint when each starts at or after the furthest end
        // of those before it.
        let mut furthest = first;
        for &w in rest {
            if w.start < furthest.end {
                return Err(AtlasError::Batch(BatchRefusal::OverlappingDestinations {
                    first: furthest.block.min(w.block),
                    second: furthest.block.max(w.block),
                }));
            }
            if w.end > furthest.end {
                furthest = w;
            }
        }
        Ok(())
    }

    /// The error of a batch the driver did not take: with the block it names, when it names one.
    #[cold]
    fn failure(&self, failure: calls::BatchFailure, blocks: usize) -> AtlasError {
        let copies = self.dsts.len();
        let error = failure
            .error
            .about(|| format!("{copies} copies of a batch of {blocks} blocks"));
        match (error, failure.index) {
            (driver::Error::Failed(failure), Some(entry)) if !failure.is_sticky() => {
                AtlasError::BatchBlockFailed {
                    block: self
                        .written
                        .iter()
                        .find(|w| w.entry == entry)
                        .map_or(entry, |w| w.block),
                    failure,
                }
            }
            (error, _) => batch_error(error),
        }
    }
}

impl Default for CopyBatch {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for CopyBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CopyBatch")
            .field("capacity", &self.capacity())
            .field("flags", &self.flags)
            .finish()
    }
}

/// Stream handles up to this one are the legacy default stream (null, `CU_STREAM_LEGACY`).
const LEGACY_STREAM: usize = 1;

/// A driver error of the batch path as Atlas reports it: a missing entry point says what the
/// batch needs.
#[cold]
fn batch_error(error: driver::Error) -> AtlasError {
    match error {
        driver::Error::Missing(missing) => AtlasError::Batch(BatchRefusal::Unavailable {
            missing: missing.name,
        }),
        other => other.into(),
    }
}

/// A batch of copies being filled for one stream (made by [`CopyBatch::begin`]): memory is
/// added to it, blocks are copied between that memory, and [`enqueue`](Self::enqueue) hands them
/// to the driver in one call. Dropped without `enqueue`, it copies nothing.
///
/// See [`CopyBatch`] for what it checks and what happens after `enqueue`.
///
/// The builder holds what it copies until it is enqueued. The host cannot hold a slice of
/// page-locked memory that a batch may write:
///
/// ```compile_fail
/// # fn f(stream: &atlas_registry::CudaStream, x: &atlas_registry::DeviceBuffer<f32>,
/// #      host: &mut atlas_registry::PinnedBuffer<f32>) -> atlas_registry::Result<()> {
/// use atlas_registry::{CopyBatch, DeviceMemory};
/// let mut batch = CopyBatch::new();
/// let before = host.as_slice()?;
/// let mut copies = batch.begin(stream)?;
/// let to = copies.write_host(host)?; // refused by the compiler: `before` still reads the memory
/// let from = copies.read_device(x.as_slice())?;
/// copies.device_to_host(from, 0, to, 0, 4)?;
/// copies.enqueue()?;
/// println!("{}", before[0]);
/// # Ok(()) }
/// ```
///
/// memory cannot be both read and written by one batch (nor read elsewhere while a batch writes
/// it):
///
/// ```compile_fail
/// # fn f(stream: &atlas_registry::CudaStream, x: &mut atlas_registry::DeviceBuffer<f32>)
/// #      -> atlas_registry::Result<()> {
/// use atlas_registry::{CopyBatch, DeviceMemory, DeviceMemoryMut};
/// let mut batch = CopyBatch::new();
/// let mut copies = batch.begin(stream)?;
/// let to = copies.write_device(x.as_slice_mut())?;
/// let from = copies.read_device(x.as_slice())?; // refused: `x` is borrowed mutably by the batch
/// copies.device_to_device(from, 0, to, 4, 4)?;
/// copies.enqueue()?;
/// # Ok(()) }
/// ```
///
/// and nothing it copies is freed before it is enqueued:
///
/// ```compile_fail
/// # fn f(stream: &atlas_registry::CudaStream, context: &atlas_registry::CudaContext)
/// #      -> atlas_registry::Result<()> {
/// use atlas_registry::{CopyBatch, DeviceBuffer, DeviceMemory};
/// let mut batch = CopyBatch::new();
/// let x = DeviceBuffer::<f32>::alloc(context, 8)?;
/// let mut host = vec![0.0f32; 8];
/// let mut copies = batch.begin(stream)?;
/// let from = copies.read_device(x.as_slice())?;
/// let to = copies.write_slice(&mut host);
/// copies.device_to_host(from, 0, to, 0, 8)?;
/// drop(x); // refused: the batch still reads `x`
/// copies.enqueue()?;
/// # Ok(()) }
/// ```
pub struct BatchBuilder<'b> {
    batch: &'b mut CopyBatch,
    stream: &'b CudaStream,
    /// This builder's number, which its handles carry.
    id: u64,
    /// Blocks added, empty ones included.
    blocks: usize,
    /// Ordinary slices were added: `enqueue` waits for the stream.
    waits: bool,
}

impl<'b> BatchBuilder<'b> {
    /// Adds page-locked memory that Atlas owns ([`PinnedBuffer`], [`HostRegistration`]) as a
    /// source of [`host_to_device`](Self::host_to_device) blocks. After the batch, host writes
    /// to it and its release wait for the copies (its event is recorded after the batch).
    ///
    /// Refused: memory of another context than the stream's ([`AtlasError::WrongContext`]).
    pub fn read_host<T: DeviceCopy>(
        &mut self,
        memory: &'b mut impl PageLocked<T>,
    ) -> Result<HostSource<T>> {
        let locked = memory.locked().0;
        self.check_context(locked.context(), "the page-locked memory the batch reads")?;
        Ok(HostSource::new(self.add_fenced(locked, READS)))
    }

    /// Adds page-locked memory that Atlas owns as a destination of
    /// [`device_to_host`](Self::device_to_host) blocks. After the batch, host access to it and
    /// its release wait for the copies.
    ///
    /// Refused: memory of another context than the stream's ([`AtlasError::WrongContext`]),
    /// memory registered read-only for the device ([`HostMemoryRefusal::ReadOnly`]).
    pub fn write_host<T: DeviceCopy>(
        &mut self,
        memory: &'b mut impl PageLocked<T>,
    ) -> Result<HostDestination<T>> {
        let locked = memory.locked().0;
        if locked.is_read_only() {
            return Err(AtlasError::HostMemory(HostMemoryRefusal::ReadOnly));
        }
        self.check_context(locked.context(), "the page-locked memory the batch writes")?;
        Ok(HostDestination::new(self.add_fenced(locked, WRITES)))
    }

    /// Adds ordinary host memory as a source: [`enqueue`](Self::enqueue) then waits for the
    /// stream before it returns, since the driver may read the memory after the call (slower than
    /// page-locked memory, which the device reads directly and nothing waits for).
    pub fn read_slice<T: DeviceCopy>(&mut self, memory: &'b [T]) -> HostSource<T> {
        self.waits = true;
        HostSource::new(self.side(host_address(memory.as_ptr()), memory.len()))
    }

    /// Adds ordinary host memory as a destination: [`enqueue`](Self::enqueue) then waits for the
    /// stream before it returns, so the memory holds the copies once the borrow ends.
    pub fn write_slice<T: DeviceCopy>(&mut self, memory: &'b mut [T]) -> HostDestination<T> {
        self.waits = true;
        HostDestination::new(self.side(host_address(memory.as_ptr()), memory.len()))
    }

    /// Adds device memory (a buffer's [`as_slice`](crate::DeviceMemory::as_slice), or a range
    /// of it) as a source of [`device_to_host`](Self::device_to_host) and
    /// [`device_to_device`](Self::device_to_device) blocks.
    ///
    /// Refused: memory of another context than the stream's ([`AtlasError::WrongContext`]).
    pub fn read_device<T: DeviceCopy>(
        &mut self,
        memory: DeviceSlice<'b, T>,
    ) -> Result<DeviceSource<T>> {
        self.check_context(memory.context(), "the device memory the batch reads")?;
        // From now on the buffer's free waits for the device: the batch may run after the
        // borrow ends.
        memory.buffer().note_enqueued_use();
        Ok(DeviceSource::new(
            self.side(memory.device_ptr(), memory.len()),
        ))
    }

    /// Adds device memory (a buffer's [`as_slice_mut`](crate::DeviceMemoryMut::as_slice_mut),
    /// or a range of it) as a destination of [`host_to_device`](Self::host_to_device) and
    /// [`device_to_device`](Self::device_to_device) blocks.
    ///
    /// Refused: memory of another context than the stream's ([`AtlasError::WrongContext`]).
    pub fn write_device<T: DeviceCopy>(
        &mut self,
        memory: DeviceSliceMut<'b, T>,
    ) -> Result<DeviceDestination<T>> {
        self.check_context(memory.context(), "the device memory the batch writes")?;
        memory.buffer().note_enqueued_use();
        Ok(DeviceDestination::new(
            self.side(memory.device_ptr(), memory.len()),
        ))
    }

    /// Adds a block: `len` elements from element `src_start` of `src` to element `dst_start` of
    /// `dst`. Checked now (no driver call): handles of this builder
    /// ([`BatchRefusal::ForeignMemory`]), both ranges inside their memory
    /// ([`BatchRefusal::OutOfRange`]); overlapping destinations are refused at
    /// [`enqueue`](Self::enqueue).
    #[doc(alias = "cuMemcpyBatchAsync")]
    pub fn host_to_device<T: DeviceCopy>(
        &mut self,
        src: HostSource<T>,
        src_start: usize,
        dst: DeviceDestination<T>,
        dst_start: usize,
        len: usize,
    ) -> Result<()> {
        self.block::<T>(src.side, src_start, dst.side, dst_start, len)
    }

    /// Adds a block from device memory to host memory, checked as
    /// [`host_to_device`](Self::host_to_device) is.
    #[doc(alias = "cuMemcpyBatchAsync")]
    pub fn device_to_host<T: DeviceCopy>(
        &mut self,
        src: DeviceSource<T>,
        src_start: usize,
        dst: HostDestination<T>,
        dst_start: usize,
        len: usize,
    ) -> Result<()> {
        self.block::<T>(src.side, src_start, dst.side, dst_start, len)
    }

    /// Adds a block between device memory of the stream's context, checked as
    /// [`host_to_device`](Self::host_to_device) is. A source and a destination never overlap:
    /// memory added as a destination is borrowed mutably.
    #[doc(alias = "cuMemcpyBatchAsync")]
    pub fn device_to_device<T: DeviceCopy>(
        &mut self,
        src: DeviceSource<T>,
        src_start: usize,
        dst: DeviceDestination<T>,
        dst_start: usize,
        len: usize,
    ) -> Result<()> {
        self.block::<T>(src.side, src_start, dst.side, dst_start, len)
    }

    /// Blocks added so far, empty ones included.
    pub fn len(&self) -> usize {
        self.blocks
    }

    /// Whether no block was added.
    pub fn is_empty(&self) -> bool {
        self.blocks == 0
    }

    /// Hands the blocks to the driver in one `cuMemcpyBatchAsync` call on the builder's stream,
    /// and returns once they are enqueued (once they are done when slices were added). Nothing
    /// to copy (no block, or empty ones only): no driver call.
    ///
    /// Refused before the driver is called: destinations that overlap
    /// ([`BatchRefusal::OverlappingDestinations`]); with slices added, a stream Atlas captures
    /// or a thread that captures
    /// ([`CaptureMisuse::WaitingCopyWhileCapturing`]);
    /// page-locked memory whose earlier copy could not be followed
    /// ([`HostMemoryRefusal::Unfenced`]). A failure the driver pins on one block is
    /// [`AtlasError::BatchBlockFailed`] naming it; any other is [`AtlasError::Driver`] (or
    /// [`AtlasError::ContextLost`]).
    #[doc(alias = "cuMemcpyBatchAsync")]
    pub fn enqueue(mut self) -> Result<()> {
        // The drop that follows empties the batch.
        self.run()
    }

    fn run(&mut self) -> Result<()> {
        let (stream, blocks, waits) = (self.stream, self.blocks, self.waits);
        let batch = &mut *self.batch;
        if batch.dsts.is_empty() {
            return Ok(());
        }
        batch.refuse_overlaps()?;
        if waits {
            capture::refuse_waiting_copy(stream.raw())?;
        }
        for &(memory, _) in &batch.fenced {
            // SAFETY: the memory behind the pointer is borrowed mutably by this builder for its
            // whole life (`read_host`/`write_host` take `&'b mut`), and no two entries are the
            // same memory (two `&mut` of it cannot be held at once); nothing else touches it.
            unsafe { &mut *memory.as_ptr() }.prepare(stream)?;
        }
        stream.bind_if_default()?;
        // SAFETY: the arrays have one entry per block that copies something, at least one (above),
        // each of more than 0 bytes (`block`). Every range lies in memory added to this builder
        // (checked by `block`): device memory of the stream's context (checked when added) or host
        // memory, all of it borrowed until the builder ends, so allocated now. After this call,
        // device memory stays allocated until the device is done with it (its buffer noted the
        // use when it was added), page-locked memory until its fence, recorded below (or a
        // synchronize) has passed, and slices until the synchronize below. No destination
        // overlaps another (`refuse_overlaps`), nor a source: memory added as a destination is
        // borrowed mutably, so no source is of it. The stream is not the legacy default stream
        // (`begin`) and is bound when it is the per-thread one (above).
        let enqueued = unsafe {
            calls::copy_batch(
                &mut batch.dsts,
                &mut batch.srcs,
                &mut batch.sizes,
                batch.flags,
                stream.raw(),
            )
        };
        if let Err(failure) = enqueued {
            // The driver does not say whether the copies before a failed one were enqueued:
            // host memory this builder borrows (slices, and page-locked memory, whose fence is
            // not recorded for a failed batch) goes back to its owner only once none can run.
            // The batch's own failure is the error to report, whatever the wait says.
            if waits || !batch.fenced.is_empty() {
                let _ = stream.synchronize_unchecked();
            }
            return Err(batch.failure(failure, blocks));
        }
        // Every page-locked memory is followed, whatever fails: one not followed would let the
        // host at memory the device may still use.
        let mut result = Ok(());
        for &(memory, uses) in &batch.fenced {
            // SAFETY: as for `prepare` above.
            let followed = unsafe { &mut *memory.as_ptr() }.follow(stream, uses);
            result = result.and(followed);
        }
        if waits {
            // The slices' borrows end when this returns: the copies must be done by then.
            result = result.and(stream.synchronize_unchecked());
        }
        result
    }

    /// Adds a block, checked; empty blocks are numbered and not passed to the driver.
    fn block<T: DeviceCopy>(
        &mut self,
        src: Side,
        src_start: usize,
        dst: Side,
        dst_start: usize,
        len: usize,
    ) -> Result<()> {
        let block = self.blocks;
        if src.builder != self.id || dst.builder != self.id {
            return Err(AtlasError::Batch(BatchRefusal::ForeignMemory { block }));
        }
        let element = size_of::<T>();
        let from = src.at(block, CopySide::Source, src_start, len, element)?;
        let to = dst.at(block, CopySide::Destination, dst_start, len, element)?;
        self.blocks += 1;
        // Fits: `len` elements lie in memory that exists.
        let bytes = len * element;
        if bytes == 0 {
            return Ok(());
        }
        let batch = &mut *self.batch;
        batch.written.push(Written {
            start: to,
            end: to + bytes as CUdeviceptr,
            block,
            entry: batch.dsts.len(),
        });
        batch.dsts.push(to);
        batch.srcs.push(from);
        batch.sizes.push(bytes);
        Ok(())
    }

    /// Memory of this builder at `address`, `len` elements.
    fn side(&self, address: CUdeviceptr, len: usize) -> Side {
        Side {
            builder: self.id,
            address,
            len,
        }
    }

    /// Page-locked memory added, to be prepared and followed by its fence around the batch.
    fn add_fenced<T: DeviceCopy>(&mut self, locked: &'b mut Locked<T>, uses: u8) -> Side {
        let side = self.side(host_address(locked.as_ptr()), locked.len());
        let memory: NonNull<dyn Fence> = NonNull::from(locked);
        self.batch.fenced.push((memory, uses));
        side
    }

    /// `Ok` when memory of `context` may be copied on the builder's stream.
    fn check_context(&self, context: CUcontext, what: &str) -> Result<()> {
        let expected = self.stream.context();
        if context == expected {
            return Ok(());
        }
        Err(AtlasError::WrongContext {
            what: what.into(),
            expected: ordinal_of(expected),
            given: ordinal_of(context),
        })
    }
}

impl Drop for BatchBuilder<'_> {
    fn drop(&mut self) {
        // The pointers to the builder's page-locked memory must not outlive its borrows.
        self.batch.clear();
    }
}

impl fmt::Debug for BatchBuilder<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchBuilder")
            .field("stream", &self.stream)
            .field("blocks", &self.blocks)
            .field("copies", &self.batch.dsts.len())
            .finish()
    }
}

/// The address the driver reaches host memory at: the host address itself (unified
/// addressing), exposed since the driver uses it as a pointer.
fn host_address<T>(ptr: *const T) -> CUdeviceptr {
    ptr.expose_provenance() as CUdeviceptr
}

/// Where the blocks of one side lie: memory added to a builder.
#[derive(Debug, Clone, Copy)]
struct Side {
    /// The builder it was added to.
    builder: u64,
    /// Its first element's address (a host address for host memory).
    address: CUdeviceptr,
    /// Its elements.
    len: usize,
}

impl Side {
    /// The address of element `start`, when `start..start + len` lies in the memory.
    fn at(
        self,
        block: usize,
        side: CopySide,
        start: usize,
        len: usize,
        element: usize,
    ) -> Result<CUdeviceptr> {
        match start.checked_add(len) {
            // Fits: the offset lies in memory that exists.
            Some(end) if end <= self.len => Ok(self.address + (start * element) as CUdeviceptr),
            end => Err(AtlasError::Batch(BatchRefusal::OutOfRange {
                block,
                side,
                start,
                end: end.unwrap_or(usize::MAX),
                len: self.len,
            })),
        }
    }
}

macro_rules! handle {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        pub struct $name<T: DeviceCopy> {
            side: Side,
            _elements: PhantomData<fn() -> T>,
        }

        impl<T: DeviceCopy> $name<T> {
            fn new(side: Side) -> Self {
                Self {
                    side,
                    _elements: PhantomData,
                }
            }

            /// Elements of the memory.
            pub fn len(&self) -> usize {
                self.side.len
            }

            /// Whether the memory has no elements.
            pub fn is_empty(&self) -> bool {
                self.side.len == 0
            }
        }

        impl<T: DeviceCopy> Clone for $name<T> {
            fn clone(&self) -> Self {
                *self
            }
        }

        impl<T: DeviceCopy> Copy for $name<T> {}

        impl<T: DeviceCopy> fmt::Debug for $name<T> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(
                    f,
                    concat!(stringify!($name), "<{}>({:#x}, len {})"),
                    std::any::type_name::<T>(),
                    self.side.address,
                    self.side.len
                )
            }
        }
    };
}

handle!(
    /// Host memory added to a [`BatchBuilder`] as a source
    /// ([`read_host`](BatchBuilder::read_host), [`read_slice`](BatchBuilder::read_slice)): a
    /// handle that blocks of that builder name, with an element offset. Used with another
    /// builder, it is refused ([`BatchRefusal::ForeignMemory`]).
    HostSource
);
handle!(
    /// Host memory added to a [`BatchBuilder`] as a destination
    /// ([`write_host`](BatchBuilder::write_host), [`write_slice`](BatchBuilder::write_slice)),
    /// as [`HostSource`] is.
    HostDestination
);
handle!(
    /// Device memory added to a [`BatchBuilder`] as a source
    /// ([`read_device`](BatchBuilder::read_device)), as [`HostSource`] is.
    DeviceSource
);
handle!(
    /// Device memory added to a [`BatchBuilder`] as a destination
    /// ([`write_device`](BatchBuilder::write_device)), as [`HostSource`] is.
    DeviceDestination
);

/// Page-locked host memory that Atlas owns with the event that guards it, which a batch copies
/// to and from asynchronously: [`PinnedBuffer`] and [`HostRegistration`]. Sealed.
pub trait PageLocked<T: DeviceCopy>: sealed::Sealed<T> {}

mod sealed {
    use crate::memory::buffer::DeviceCopy;
    use crate::memory::locked::Locked;

    /// The memory behind a [`PageLocked`](super::PageLocked) value, for Atlas alone.
    pub struct Access<'a, T: DeviceCopy>(pub(super) &'a mut Locked<T>);

    /// Implemented by [`PinnedBuffer`](crate::PinnedBuffer) and
    /// [`HostRegistration`](crate::HostRegistration) only.
    pub trait Sealed<T: DeviceCopy> {
        /// The memory and its fence.
        fn locked(&mut self) -> Access<'_, T>;
    }
}

impl<T: DeviceCopy> sealed::Sealed<T> for PinnedBuffer<T> {
    fn locked(&mut self) -> sealed::Access<'_, T> {
        sealed::Access(self.locked_mut())
    }
}

impl<T: DeviceCopy> PageLocked<T> for PinnedBuffer<T> {}

impl<T: DeviceCopy> sealed::Sealed<T> for HostRegistration<T> {
    fn locked(&mut self) -> sealed::Access<'_, T> {
        sealed::Access(self.locked_mut())
    }
}

impl<T: DeviceCopy> PageLocked<T> for HostRegistration<T> {}

/// Page-locked memory as a batch moves its fence, whatever its element type.
trait Fence {
    /// [`Locked::prepare_use`].
    fn prepare(&mut self, stream: &CudaStream) -> Result<()>;
    /// [`Locked::follow_use`].
    fn follow(&mut self, stream: &CudaStream, uses: u8) -> Result<()>;
}

impl<T: DeviceCopy> Fence for Locked<T> {
    fn prepare(&mut self, stream: &CudaStream) -> Result<()> {
        self.prepare_use(stream)
    }

    fn follow(&mut self, stream: &CudaStream, uses: u8) -> Result<()> {
        self.follow_use(stream, uses)
    }
}
