//! [`Mapping`]: physical memory mapped at an offset of a reservation (made by
//! [`AddressReservation::map`], here with the checks it makes), with the access each device has to
//! it ([`MemoryAccess`]), unmapped after the device's work when it goes.

use std::fmt;
use std::sync::Arc;

use atlas_sys::{CUdeviceptr, CUmemAccess_flags};

use crate::device::capture::{self, Free, Hold};
use crate::device::context::CudaContext;
use crate::driver::{About, calls};
use crate::error::{Result, VirtualMemoryRefusal, report_cleanup};
use crate::memory::buffer::{DeviceBuffer, DeviceCopy};
use crate::memory::virtual_memory::physical::{Physical, PhysicalAllocation};
use crate::memory::virtual_memory::reservation::{AddressReservation, Reservation};
use crate::memory::virtual_memory::{check_size, refused};

/// The access a device has to mapped memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryAccess {
    /// Kernels and copies of the device read and write it (`CU_MEM_ACCESS_FLAGS_PROT_READWRITE`).
    ReadWrite,
    /// Kernels and copies of the device only read it (`CU_MEM_ACCESS_FLAGS_PROT_READ`); a write
    /// faults.
    ReadOnly,
}

impl MemoryAccess {
    fn flags(self) -> CUmemAccess_flags {
        match self {
            Self::ReadWrite => CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            Self::ReadOnly => CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ,
        }
    }
}

/// A [`PhysicalAllocation`] mapped into an
/// [`AddressReservation`] (made by
/// [`AddressReservation::map`](crate::AddressReservation::map)).
///
/// It keeps both alive: the reservation's addresses are not freed, and the memory not released,
/// before it is unmapped. It starts with no access for any device; [`set_access`](Self::set_access)
/// grants it, and [`into_buffer`](Self::into_buffer) makes it a [`DeviceBuffer`] once its own
/// device may read and write it: kernels, copies, fills, views and graphs then take it as any
/// buffer, and a graph that captures work on it keeps the mapping.
///
/// Dropped (or [`unmap`](Self::unmap)ped), it is unmapped after the device's work
/// (`cuCtxSynchronize`, then `cuMemUnmap`: the unmap is not ordered with any stream), and then
/// its reservation and memory are let go. While a capture is in progress in its context, the
/// synchronize would break it, so the unmap is made when that capture ends; until then the range
/// still counts as mapped.
///
/// # Examples
///
/// ```no_run
/// # fn f(registry: &atlas_registry::AtlasRegistry) -> atlas_registry::Result<()> {
/// use atlas_registry::{AddressReservation, DeviceMemory, DeviceMemoryMut, MemoryAccess};
/// use atlas_registry::PhysicalAllocation;
/// let (ctx, stream) = (registry.ctx(), registry.stream());
/// let granule = PhysicalAllocation::granularity(ctx)?.minimum;
/// let reservation = AddressReservation::new(ctx, 8 * granule)?;
/// let memory = PhysicalAllocation::new(ctx, granule)?;
/// let mut mapping = reservation.map(3 * granule, &memory)?;
/// mapping.set_access(ctx, MemoryAccess::ReadWrite)?;
/// let mut buffer = mapping.into_buffer::<u32>()?;
/// buffer.fill(stream, 7)?;
/// assert!(buffer.to_vec(stream)?.iter().all(|&v| v == 7));
/// # Ok(()) }
/// ```
pub struct Mapping {
    /// What the mapping holds, taken by its unmap.
    range: Option<MappedRange>,
    ptr: CUdeviceptr,
    bytes: usize,
    /// Whether the reservation's own device may read and write the range.
    writable: bool,
}

/// A mapped range and what it keeps: handed to the unmap, and dropped after it, which forgets the
/// range in its reservation, releases the memory's handle and lets the reservation go.
pub(super) struct MappedRange {
    pub(super) reservation: Arc<Reservation>,
    pub(super) offset: usize,
    pub(super) bytes: usize,
    /// Held so that its handle is released after the unmap.
    pub(super) _memory: Arc<Physical>,
}

impl Drop for MappedRange {
    fn drop(&mut self) {
        // The fields go after this: the memory's handle, then (maybe) the reservation.
        self.reservation.forget(self.offset);
    }
}

impl Mapping {
    /// The mapping of `range`, with no access yet.
    pub(super) fn new(range: MappedRange) -> Self {
        Self {
            ptr: range.reservation.base + range.offset as CUdeviceptr,
            bytes: range.bytes,
            range: Some(range),
            writable: false,
        }
    }

    /// Grants `device`'s context the `access` to the mapped memory (`cuMemSetAccess`): the
    /// reservation's own device, or a peer that can reach its memory (the driver refuses one that
    /// cannot). Kernels and copies of a device fault on mapped memory it has no access to.
    #[doc(alias = "cuMemSetAccess")]
    pub fn set_access(&mut self, device: &CudaContext, access: MemoryAccess) -> Result<()> {
        let Some(range) = &self.range else {
            return Ok(());
        };
        range.reservation.home.bind()?;
        // SAFETY: the range is mapped while this mapping lives (it unmaps only when it goes), and
        // no work of Atlas uses it yet: it becomes a buffer only by `into_buffer`, which consumes
        // the mapping.
        unsafe { calls::mem_set_access(self.ptr, self.bytes, device.device(), access.flags()) }
            .about(|| {
                format!(
                    "{} bytes at {:#x}, for device {}",
                    self.bytes,
                    self.ptr,
                    device.ordinal()
                )
            })?;
        if device.device() == range.reservation.home.device {
            self.writable = access == MemoryAccess::ReadWrite;
        }
        Ok(())
    }

    /// Grants the reservation's own device read and write access to the range, as
    /// [`set_access`](Self::set_access) does; for the growable buffer, which sets the access of
    /// many mappings with one call.
    pub(super) fn note_writable(&mut self) {
        self.writable = true;
    }

    /// The mapped memory as a [`DeviceBuffer`] of the reservation's context, of as many `T`s as
    /// fit: the buffer keeps the mapping (so do the graphs that capture work on it), and the last
    /// of them to go unmaps it.
    ///
    /// Refused while the reservation's device may not read and write the range
    /// ([`VirtualMemoryRefusal::NoAccess`]: kernels and copies would fault), and for `T` of no
    /// size ([`VirtualMemoryRefusal::Empty`]).
    pub fn into_buffer<T: DeviceCopy>(self) -> Result<DeviceBuffer<T>> {
        let Some(range) = &self.range else {
            return Err(refused(VirtualMemoryRefusal::Empty));
        };
        if !self.writable {
            return Err(refused(VirtualMemoryRefusal::NoAccess {
                device: range.reservation.home.ordinal,
            }));
        }
        let Some(len) = self.bytes.checked_div(size_of::<T>()) else {
            return Err(refused(VirtualMemoryRefusal::Empty));
        };
        let (context, ptr) = (range.reservation.home.context, self.ptr);
        Ok(DeviceBuffer::kept(
            context,
            ptr,
            len,
            Arc::new(self) as Hold,
        ))
    }

    /// The device address of the first mapped byte.
    pub fn device_ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// The mapped size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Unmaps the memory now, returning what went wrong (dropping the mapping does the same, but
    /// can only print a failure): after the device's work, or, while a capture is in progress in
    /// its context, when that capture ends (then `Ok`).
    #[doc(alias = "cuMemUnmap")]
    pub fn unmap(mut self) -> Result<()> {
        self.release()
    }

    /// Unmaps once: the range is taken first, so the drop after [`unmap`](Self::unmap) does
    /// nothing.
    fn release(&mut self) -> Result<()> {
        let Some(range) = self.range.take() else {
            return Ok(());
        };
        let context = range.reservation.home.context;
        capture::free(Free::unmap(context, self.ptr, self.bytes, Box::new(range)))
    }
}

impl Reservation {
    /// Maps all of `memory` at `offset` (`cuMemMap`), after checking that it is memory of this
    /// reservation's device, at a granular offset, inside the reservation and beside every other
    /// mapping. The mapping has no access yet. The context is the caller's to have made current.
    pub(super) fn map(self: &Arc<Self>, offset: usize, memory: &Arc<Physical>) -> Result<Mapping> {
        let bytes = memory.bytes;
        if memory.home.device != self.home.device {
            return Err(refused(VirtualMemoryRefusal::OtherDevice {
                allocation: memory.home.ordinal,
                context: self.home.ordinal,
            }));
        }
        if !offset.is_multiple_of(self.granularity) {
            return Err(refused(VirtualMemoryRefusal::OffsetNotGranular {
                offset,
                granularity: self.granularity,
            }));
        }
        check_size(bytes, self.granularity)?;
        if offset.checked_add(bytes).is_none_or(|end| end > self.bytes) {
            return Err(refused(VirtualMemoryRefusal::OutsideReservation {
                offset,
                bytes,
                reserved: self.bytes,
            }));
        }
        self.claim(offset, bytes)?;
        let ptr = self.base + offset as CUdeviceptr;
        // SAFETY: the range lies in this live reservation (checked above) and overlaps no other
        // mapping (claimed above); offset and size are multiples of the device's minimum
        // granularity, and so is the base, which the reservation asked the driver to align to a
        // multiple of it; `memory` is a live handle of this many bytes.
        let mapped = unsafe { calls::mem_map(ptr, bytes, memory.handle) }.about(|| {
            format!(
                "{bytes} bytes at offset {offset} on device {}",
                self.home.ordinal
            )
        });
        if let Err(e) = mapped {
            self.forget(offset);
            return Err(e.into());
        }
        Ok(Mapping::new(MappedRange {
            reservation: Arc::clone(self),
            offset,
            bytes,
            _memory: Arc::clone(memory),
        }))
    }
}

impl AddressReservation {
    /// Maps all of `memory` at `offset` bytes into the reservation (`cuMemMap`). The mapping
    /// starts with no access for any device: grant it with [`Mapping::set_access`].
    ///
    /// Refused before the driver is called: memory of another device than the reservation's
    /// ([`VirtualMemoryRefusal::OtherDevice`]), an offset that is not a multiple of the
    /// granularity ([`VirtualMemoryRefusal::OffsetNotGranular`]), a mapping past the end
    /// ([`VirtualMemoryRefusal::OutsideReservation`]) or overlapping another mapping
    /// ([`VirtualMemoryRefusal::Overlap`], naming it; an unmap that waits for a capture in
    /// progress still counts until the capture ends).
    #[doc(alias = "cuMemMap")]
    pub fn map(&self, offset: usize, memory: &PhysicalAllocation) -> Result<Mapping> {
        self.inner.home.bind()?;
        self.inner.map(offset, &memory.inner)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        let result = self.release();
        report_cleanup("unmapping device memory", result);
    }
}

impl fmt::Debug for Mapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Mapping({:#x}, {} bytes)", self.ptr, self.bytes)
    }
}
