//! [`GrowableBuffer`]: a device buffer whose address never moves, grown by mapping physical
//! memory at its end and shrunk by unmapping it, inside one reservation.

use std::fmt;
use std::sync::Arc;

use atlas_sys::{CUdeviceptr, CUmemAccess_flags};

use crate::device::capture::{self, Hold};
use crate::device::context::CudaContext;
use crate::driver::{About, calls};
use crate::error::{AtlasError, Result, VirtualMemoryRefusal};
use crate::memory::buffer::{DeviceBuffer, DeviceCopy};
use crate::memory::device_memory::{DeviceMemory, DeviceMemoryMut};
use crate::memory::view::{DeviceSlice, DeviceSliceMut};
use crate::memory::virtual_memory::mapping::Mapping;
use crate::memory::virtual_memory::physical::{Physical, granularity_of};
use crate::memory::virtual_memory::reservation::Reservation;
use crate::memory::virtual_memory::{Home, refused, require_virtual_memory};

/// A device buffer of `T`s whose device address never moves while it grows and shrinks: made
/// with a maximum capacity (reserved addresses, no memory), it grows by mapping physical memory at
/// its end ([`grow_to`](Self::grow_to)) and shrinks by unmapping it ([`shrink_to`](Self::shrink_to)),
/// in chunks of the device's recommended allocation granularity (2 MiB on current GPUs). A KV
/// cache grown as sequences arrive, shrunk when they go, keeps the address every kernel and graph
/// was given.
///
/// It is used as a [`DeviceBuffer`] is: a kernel takes it as `&buf` (reads) or `&mut buf`
/// (writes), and copies, fills and views come from [`DeviceMemory`] and [`DeviceMemoryMut`]. A
/// graph that captures work on it keeps the chunks mapped at that time, and replays after the
/// buffer is dropped; a shrink that would unmap what a graph still holds is refused
/// ([`VirtualMemoryRefusal::HeldByGraph`], naming the elements). Chunks are unmapped after the
/// device's work (`cuCtxSynchronize`, then `cuMemUnmap`, for each).
///
/// Growing costs only the driver calls it needs: per new chunk `cuMemCreate` and `cuMemMap`, and
/// one `cuMemSetAccess` for the new chunks together (and `cuCtxGetCurrent` to check the context);
/// growing within the last chunk costs none. A launch or copy with the buffer costs what one with
/// a [`DeviceBuffer`] does.
///
/// Views borrow the buffer, and growing or shrinking takes it mutably, so no view outlives a
/// change of length:
///
/// ```compile_fail
/// # fn f(buf: &mut atlas_registry::GrowableBuffer<f32>) -> atlas_registry::Result<()> {
/// use atlas_registry::DeviceMemory;
/// let view = buf.range(0..8)?;
/// buf.shrink_to(4)?; // refused: `buf` is borrowed by `view`
/// drop(view);
/// # Ok(()) }
/// ```
///
/// ```compile_fail
/// # fn f(buf: &mut atlas_registry::GrowableBuffer<f32>) -> atlas_registry::Result<()> {
/// use atlas_registry::DeviceMemoryMut;
/// let view = buf.range_mut(0..8)?;
/// buf.grow_to(1 << 20)?; // refused: `buf` is borrowed mutably by `view`
/// drop(view);
/// # Ok(()) }
/// ```
///
/// # Examples
///
/// ```no_run
/// # fn f(registry: &atlas_registry::AtlasRegistry) -> atlas_registry::Result<()> {
/// use atlas_registry::{DeviceMemory, DeviceMemoryMut, GrowableBuffer, LaunchConfig};
/// let (ctx, stream) = (registry.ctx(), registry.stream());
/// let mut cache = GrowableBuffer::<f32>::new(ctx, 1 << 28)?; // up to 1 GiB of addresses
/// let address = cache.device_ptr();
/// cache.grow_to(1 << 20)?; // maps 4 MiB
/// cache.fill(stream, 1.0)?;
/// cache.grow_to(3 << 20)?; // maps 8 MiB more, after the first
/// cache.range_mut(1 << 20..)?.fill(stream, 2.0)?;
/// let scale = registry.function_cached("elementwise", "scale")?;
/// let n = cache.len() as u32;
/// // SAFETY: `scale` touches the `n` floats of the buffer; `to_vec` waits for it.
/// unsafe { scale.launch(stream, &LaunchConfig::for_elements(n, 256), (&mut cache, 3.0f32, n))? };
/// assert_eq!(cache.device_ptr(), address);
/// cache.shrink_to(1 << 20)?; // unmaps the 8 MiB after the device's work
/// assert!(cache.to_vec(stream)?.iter().all(|&v| v == 3.0));
/// # Ok(()) }
/// ```
pub struct GrowableBuffer<T: DeviceCopy> {
    reservation: Arc<Reservation>,
    /// Bytes mapped at a time.
    chunk: usize,
    /// The chunks mapped now, in address order: the keeper of `buffer`, shared with the graphs
    /// that use it.
    mapped: Arc<Chunks>,
    /// The elements `0..len` at the reservation's start, kept by `mapped`. Replaced at every
    /// change of length; never handed out mutably, so its address and keeper stay this buffer's.
    buffer: DeviceBuffer<T>,
}

/// The chunks mapped at one time, in address order: what a buffer and its graphs keep.
struct Chunks(Vec<Arc<Mapping>>);

impl<T: DeviceCopy> GrowableBuffer<T> {
    /// An empty buffer that can grow to at least `capacity` elements: the addresses of that many
    /// (rounded up to whole chunks) are reserved (`cuMemAddressReserve`), no memory is mapped.
    ///
    /// Refused: a capacity of no bytes ([`VirtualMemoryRefusal::Empty`]) or of more bytes than
    /// the address space ([`AtlasError::AllocationTooLarge`]), a driver without the virtual
    /// memory entry points ([`AtlasError::MissingSymbol`], naming the first one missing), a device
    /// without virtual memory management ([`VirtualMemoryRefusal::ManagementUnsupported`]).
    #[doc(alias = "cuMemAddressReserve")]
    pub fn new(context: &CudaContext, capacity: usize) -> Result<Self> {
        let bytes = DeviceBuffer::<T>::bytes(capacity)?;
        if bytes == 0 {
            return Err(refused(VirtualMemoryRefusal::Empty));
        }
        require_virtual_memory(context)?;
        let granularity = granularity_of(context, false)?;
        let chunk = granularity
            .recommended
            .div_ceil(granularity.minimum)
            .saturating_mul(granularity.minimum);
        let reserved =
            bytes
                .div_ceil(chunk)
                .checked_mul(chunk)
                .ok_or(AtlasError::AllocationTooLarge {
                    len: capacity,
                    element_size: size_of::<T>(),
                })?;
        let reservation = Arc::new(Reservation::reserve(
            Home::of(context),
            reserved,
            granularity,
        )?);
        let mapped = Arc::new(Chunks(Vec::new()));
        let buffer = DeviceBuffer::kept(
            context.raw(),
            reservation.base,
            0,
            Arc::clone(&mapped) as Hold,
        );
        Ok(Self {
            reservation,
            chunk,
            mapped,
            buffer,
        })
    }

    /// Grows the buffer to `len` elements, mapping as many chunks as its end needs after those
    /// mapped now (`cuMemCreate` and `cuMemMap` each, then one `cuMemSetAccess` for them all).
    /// The elements up to the old length keep their contents; the new ones are unspecified. The
    /// device address stays the same.
    ///
    /// Refused before the driver is called: a length below the current one
    /// ([`VirtualMemoryRefusal::WrongDirection`]), past the capacity
    /// ([`VirtualMemoryRefusal::BeyondCapacity`]), and growth that maps memory while the calling
    /// thread captures ([`CaptureMisuse::AllocateWhileCapturing`](crate::CaptureMisuse::AllocateWhileCapturing),
    /// as for [`DeviceBuffer::alloc`]); a chunk whose unmap waits for a capture in progress
    /// ([`VirtualMemoryRefusal::Overlap`]). When the driver refuses a chunk (out of memory), the
    /// buffer keeps its length and the chunks mapped for this call are unmapped.
    #[doc(alias = "cuMemCreate")]
    #[doc(alias = "cuMemMap")]
    #[doc(alias = "cuMemSetAccess")]
    pub fn grow_to(&mut self, len: usize) -> Result<()> {
        let current = self.len();
        if len < current {
            return Err(refused(VirtualMemoryRefusal::WrongDirection {
                len,
                current,
            }));
        }
        let capacity = self.capacity();
        if len > capacity {
            return Err(refused(VirtualMemoryRefusal::BeyondCapacity {
                len,
                capacity,
            }));
        }
        // At most the reserved bytes (checked above), so no overflow.
        let needed = (len * size_of::<T>()).div_ceil(self.chunk);
        let mapped = self.mapped.0.len();
        if needed > mapped {
            capture::refuse_allocation()?;
            let added = self.map_chunks(mapped, needed)?;
            let mut chunks = self.mapped.0.clone();
            chunks.extend(added.into_iter().map(Arc::new));
            self.mapped = Arc::new(Chunks(chunks));
        }
        self.rebuild(len);
        Ok(())
    }

    /// Maps the chunks `from..to` and grants the device read and write access to them: the
    /// mappings, or what went wrong (the chunks mapped so far are then unmapped).
    fn map_chunks(&self, from: usize, to: usize) -> Result<Vec<Mapping>> {
        let reservation = &self.reservation;
        let home = reservation.home;
        home.bind()?;
        let mut added = Vec::with_capacity(to - from);
        for index in from..to {
            let memory = Arc::new(Physical::create(home, self.chunk, false)?);
            added.push(reservation.map(index * self.chunk, &memory)?);
        }
        let (ptr, bytes) = (self.chunk_ptr(from), (to - from) * self.chunk);
        let flags = CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        // SAFETY: the range is the chunks just mapped, which live in `added`; no work uses them
        // yet (they are past every buffer made so far).
        unsafe { calls::mem_set_access(ptr, bytes, home.device, flags) }
            .about(|| format!("{bytes} bytes at {ptr:#x} on device {}", home.ordinal))?;
        for mapping in &mut added {
            mapping.note_writable();
        }
        Ok(added)
    }

    /// Shrinks the buffer to `len` elements, unmapping the chunks past the one its end needs
    /// (after the device's work: `cuCtxSynchronize`, `cuMemUnmap` and `cuMemRelease` each). The
    /// elements `0..len` keep their contents; the device address stays the same.
    ///
    /// Refused before anything is unmapped: a length above the current one
    /// ([`VirtualMemoryRefusal::WrongDirection`]), and a shrink that would unmap a chunk a graph
    /// (or an executable graph) still holds, because it captured work on the buffer when that
    /// chunk was mapped ([`VirtualMemoryRefusal::HeldByGraph`], naming those elements). Drop the
    /// graph first. An unmap that would break a capture in progress in the buffer's context is
    /// made when it ends.
    #[doc(alias = "cuMemUnmap")]
    pub fn shrink_to(&mut self, len: usize) -> Result<()> {
        let current = self.len();
        if len > current {
            return Err(refused(VirtualMemoryRefusal::WrongDirection {
                len,
                current,
            }));
        }
        let keep = (len * size_of::<T>()).div_ceil(self.chunk);
        self.refuse_held(len, keep)?;
        let kept = Arc::new(Chunks(self.mapped.0[..keep].to_vec()));
        let old = std::mem::replace(&mut self.mapped, kept);
        self.rebuild(len);
        // The old buffer held the only other reference to `old` (checked above): both are gone.
        let Ok(Chunks(old)) = Arc::try_unwrap(old) else {
            return Ok(());
        };
        let mut result = Ok(());
        for chunk in old.into_iter().skip(keep) {
            // Ours alone (checked above): unmapped now, the first failure returned.
            if let Ok(mapping) = Arc::try_unwrap(chunk) {
                let unmapped = mapping.unmap();
                result = result.and(unmapped);
            }
        }
        result
    }

    /// Refuses a shrink to `len` elements (`keep` chunks) when a graph holds a chunk past them:
    /// the chunks mapped now (held by this buffer and its current inner buffer, and by graphs
    /// beside them), or a chunk of an earlier length (held by what a graph keeps of it).
    fn refuse_held(&self, len: usize, keep: usize) -> Result<()> {
        // This buffer and the inner buffer's keeper; more are graphs'. No count rises meanwhile:
        // only a capture with the inner buffer adds one, and that needs `&self.buffer`.
        let now_held = Arc::strong_count(&self.mapped) > 2;
        let held = |&index: &usize| now_held || Arc::strong_count(&self.mapped.0[index]) > 1;
        let chunks = keep..self.mapped.0.len();
        let (Some(first), Some(last)) = (chunks.clone().find(held), chunks.rev().find(held)) else {
            return Ok(());
        };
        let size = size_of::<T>().max(1);
        Err(refused(VirtualMemoryRefusal::HeldByGraph {
            start: (first * self.chunk / size).max(len),
            end: ((last + 1) * self.chunk).div_ceil(size).min(self.len()),
        }))
    }

    /// Makes the inner buffer `len` elements long, kept by the chunks mapped now.
    fn rebuild(&mut self, len: usize) {
        let keeper = Arc::clone(&self.mapped) as Hold;
        let reservation = &self.reservation;
        self.buffer = DeviceBuffer::kept(reservation.home.context, reservation.base, len, keeper);
    }

    /// The address of chunk `index`.
    fn chunk_ptr(&self, index: usize) -> CUdeviceptr {
        self.reservation.base + (index * self.chunk) as CUdeviceptr
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.buffer.len()
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.buffer.is_empty()
    }

    /// How many elements the buffer can grow to: its reserved bytes (whole chunks) in `T`s.
    pub fn capacity(&self) -> usize {
        self.reservation.bytes / size_of::<T>().max(1)
    }

    /// The bytes mapped now: whole chunks, from the start.
    pub fn mapped_bytes(&self) -> usize {
        self.mapped.0.len() * self.chunk
    }

    /// The bytes mapped at a time: the device's recommended granularity.
    pub fn chunk_bytes(&self) -> usize {
        self.chunk
    }

    /// The device address of the first element: the same for the buffer's whole life.
    pub fn device_ptr(&self) -> CUdeviceptr {
        self.reservation.base
    }

    /// The inner buffer, for launches and copies.
    pub(crate) fn buffer(&self) -> &DeviceBuffer<T> {
        &self.buffer
    }
}

impl<T: DeviceCopy> DeviceMemory<T> for GrowableBuffer<T> {
    fn as_slice(&self) -> DeviceSlice<'_, T> {
        DeviceSlice::whole(&self.buffer)
    }
}

impl<T: DeviceCopy> DeviceMemoryMut<T> for GrowableBuffer<T> {
    fn as_slice_mut(&mut self) -> DeviceSliceMut<'_, T> {
        DeviceSliceMut::whole(&mut self.buffer)
    }
}

impl<T: DeviceCopy> fmt::Debug for GrowableBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "GrowableBuffer<{}>({:#x}, len {}, capacity {}, {} bytes mapped)",
            std::any::type_name::<T>(),
            self.reservation.base,
            self.len(),
            self.capacity(),
            self.mapped_bytes()
        )
    }
}
