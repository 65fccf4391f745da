//! Virtual memory: address space reserved once ([`AddressReservation`]), physical memory created
//! (or imported from another process) apart from it ([`PhysicalAllocation`]), and mapped into it
//! ([`Mapping`]); on top, a buffer whose device address never moves while it grows and shrinks
//! ([`GrowableBuffer`]), as serving engines grow a KV cache.
//!
//! The driver's rules, kept by these types rather than by their callers:
//! - sizes and offsets are multiples of the device's minimum allocation granularity
//!   (`cuMemGetAllocationGranularity`), checked before the driver is called; the recommended
//!   granularity (a multiple of it) is what a growable buffer maps at a time;
//! - a mapping lies in its reservation and overlaps no other; it starts with no access, and a
//!   buffer is made of it only once its device may read and write it;
//! - a mapping keeps its reservation and its physical memory alive (both are shared with it), so
//!   the reservation is freed only after every mapping in it is unmapped; the physical handle may
//!   be released while mapped (the driver keeps the memory for the mapping);
//! - an unmap is not ordered with any stream: Atlas synchronizes the context first, and a mapping
//!   that a graph (or an enqueued copy's buffer) uses is unmapped when the last of its holders
//!   goes, as a [`DeviceBuffer`](crate::DeviceBuffer)'s memory is freed; an unmap that would
//!   break a capture in progress waits for it (see `device::capture`).

mod growable;
mod mapping;
mod physical;
mod reservation;

pub use growable::GrowableBuffer;
pub use mapping::{Mapping, MemoryAccess};
pub use physical::{Granularity, PhysicalAllocation};
pub use reservation::AddressReservation;

use atlas_sys::{CUcontext, CUdevice, CUdevice_attribute};

use crate::device::context::{CudaContext, ensure_bound};
use crate::device::limits::attribute;
use crate::driver::calls;
use crate::error::{AtlasError, Result, VirtualMemoryRefusal};

/// The context a reservation or a physical allocation belongs to: its device's memory is the one
/// mapped, and it is made current for their driver calls.
#[derive(Clone, Copy)]
struct Home {
    context: CUcontext,
    device: CUdevice,
    ordinal: usize,
}

impl Home {
    fn of(context: &CudaContext) -> Self {
        Self {
            context: context.raw(),
            device: context.device(),
            ordinal: context.ordinal(),
        }
    }

    /// Makes the context current unless it is (`cuCtxGetCurrent`, and `cuCtxSetCurrent` when not).
    fn bind(&self) -> Result<()> {
        ensure_bound(self.context)
    }
}

/// The refusal as an [`AtlasError`].
#[cold]
fn refused(refusal: VirtualMemoryRefusal) -> AtlasError {
    AtlasError::VirtualMemory(refusal)
}

/// `Ok` when `context`'s device can manage virtual memory: the driver has the entry points (else
/// [`AtlasError::MissingSymbol`] naming the first one missing) and the device supports it (else
/// [`VirtualMemoryRefusal::ManagementUnsupported`]).
fn require_virtual_memory(context: &CudaContext) -> Result<()> {
    calls::require_virtual_memory_entry_points()?;
    let supported = attribute(
        context.device(),
        CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
        context.ordinal(),
    )?;
    if supported == 0 {
        return Err(refused(VirtualMemoryRefusal::ManagementUnsupported {
            device: context.ordinal(),
        }));
    }
    Ok(())
}

/// As [`require_virtual_memory`], and the device shares memory through POSIX file descriptors
/// (else [`VirtualMemoryRefusal::FileDescriptorsUnsupported`]).
fn require_file_descriptors(context: &CudaContext) -> Result<()> {
    require_virtual_memory(context)?;
    let supported = attribute(
        context.device(),
        CUdevice_attribute::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
        context.ordinal(),
    )?;
    if supported == 0 {
        return Err(refused(VirtualMemoryRefusal::FileDescriptorsUnsupported {
            device: context.ordinal(),
        }));
    }
    Ok(())
}

/// `Ok` when `bytes` is a non-zero multiple of `granularity`, else the refusal naming both.
fn check_size(bytes: usize, granularity: usize) -> Result<()> {
    if bytes == 0 {
        return Err(refused(VirtualMemoryRefusal::Empty));
    }
    if !bytes.is_multiple_of(granularity) {
        return Err(refused(VirtualMemoryRefusal::SizeNotGranular {
            bytes,
            granularity,
        }));
    }
    Ok(())
}
