//! [`AddressReservation`]: a range of device addresses reserved once (`cuMemAddressReserve`),
//! into which physical memory is mapped and unmapped while the addresses stay the same.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use atlas_sys::CUdeviceptr;

use crate::device::context::CudaContext;
use crate::driver::{About, calls};
use crate::error::{Result, VirtualMemoryRefusal, report_cleanup};
use crate::memory::virtual_memory::mapping::{MappedRange, Mapping};
use crate::memory::virtual_memory::physical::{
    Granularity, Physical, PhysicalAllocation, granularity_of,
};
use crate::memory::virtual_memory::{Home, check_size, refused, require_virtual_memory};

/// A range of device addresses of one context's device, reserved and mapped to nothing until
/// [`map`](Self::map) maps [`PhysicalAllocation`]s into it. The addresses are valid for the
/// reservation's life: they never move, whatever is mapped or unmapped.
///
/// A [`Mapping`] keeps its reservation: the addresses are freed (`cuMemAddressFree`) when the
/// reservation and every mapping in it have gone, never while something is mapped.
///
/// # Examples
///
/// Two allocations mapped side by side, one buffer over both:
///
/// ```no_run
/// # fn f(registry: &atlas_registry::AtlasRegistry) -> atlas_registry::Result<()> {
/// use atlas_registry::{AddressReservation, MemoryAccess, PhysicalAllocation};
/// let ctx = registry.ctx();
/// let granule = PhysicalAllocation::granularity(ctx)?.minimum;
/// let reservation = AddressReservation::new(ctx, 2 * granule)?;
/// let (a, b) = (PhysicalAllocation::new(ctx, granule)?, PhysicalAllocation::new(ctx, granule)?);
/// let mut low = reservation.map(0, &a)?;
/// let mut high = reservation.map(granule, &b)?;
/// assert!(reservation.map(granule, &a).is_err()); // overlaps `high`
/// low.set_access(ctx, MemoryAccess::ReadWrite)?;
/// high.set_access(ctx, MemoryAccess::ReadWrite)?;
/// let low = low.into_buffer::<u8>()?;
/// assert_eq!(low.device_ptr() + granule as u64, high.device_ptr());
/// # Ok(()) }
/// ```
pub struct AddressReservation {
    pub(super) inner: Arc<Reservation>,
}

/// A reserved range, freed when the last of its reservation and mappings goes.
pub(super) struct Reservation {
    /// The context it was reserved for: its device's memory is mapped here, and its buffers are
    /// this context's memory.
    pub(super) home: Home,
    pub(super) base: CUdeviceptr,
    pub(super) bytes: usize,
    /// The device's minimum granularity: offsets and sizes of mappings are multiples of it.
    pub(super) granularity: usize,
    /// The ranges `(offset, bytes)` mapped, from just before `cuMemMap` until just after
    /// `cuMemUnmap`; a short lock, never held through a driver call.
    mapped: Mutex<Vec<(usize, usize)>>,
}

// SAFETY: a context handle (in `home`) and a device address, never dereferenced by Rust (the driver takes
// them from any thread); the list of mapped ranges is behind a mutex. Freed once, by the drop of
// the last holder.
unsafe impl Send for Reservation {}
// SAFETY: as for Send.
unsafe impl Sync for Reservation {}

impl Reservation {
    /// Reserves `bytes` (a non-zero multiple of the minimum granularity, checked by the caller)
    /// of addresses for `home`, aligned to the recommended granularity (or else the minimum) when
    /// it is a power of two, as the driver takes alignments.
    pub(super) fn reserve(home: Home, bytes: usize, granularity: Granularity) -> Result<Self> {
        home.bind()?;
        let alignment = [granularity.recommended, granularity.minimum]
            .into_iter()
            .find(|a| a.is_power_of_two())
            .unwrap_or(0);
        let base = calls::address_reserve(bytes, alignment)
            .about(|| format!("{bytes} bytes of addresses on device {}", home.ordinal))?;
        Ok(Self {
            home,
            base,
            bytes,
            granularity: granularity.minimum,
            mapped: Mutex::new(Vec::new()),
        })
    }

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

    /// Records `offset .. offset + bytes` as mapped, or refuses it when it overlaps a range that
    /// is.
    fn claim(&self, offset: usize, bytes: usize) -> Result<()> {
        let mut mapped = self.mapped.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(&(mapped_offset, mapped_bytes)) = mapped
            .iter()
            .find(|&&(at, len)| at < offset + bytes && offset < at + len)
        {
            return Err(refused(VirtualMemoryRefusal::Overlap {
                offset,
                bytes,
                mapped_offset,
                mapped_bytes,
            }));
        }
        mapped.push((offset, bytes));
        Ok(())
    }

    /// Forgets the range mapped at `offset`: it was unmapped (or never mapped).
    pub(super) fn forget(&self, offset: usize) {
        let mut mapped = self.mapped.lock().unwrap_or_else(PoisonError::into_inner);
        mapped.retain(|&(at, _)| at != offset);
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let result = self.home.bind().and_then(|()| {
            // SAFETY: the range this reservation reserved, freed once (here, by its last
            // holder). Every mapping holds the reservation and hands it over only with its unmap,
            // so nothing is mapped in it any more.
            Ok(unsafe { calls::address_free(self.base, self.bytes) }?)
        });
        report_cleanup("freeing reserved device addresses", result);
    }
}

impl AddressReservation {
    /// Reserves `bytes` of device addresses for `context` (`cuMemAddressReserve`), aligned to the
    /// device's recommended granularity. Reserving takes no memory: only addresses, which may well exceed
    /// the device's memory.
    ///
    /// `bytes` must be a non-zero multiple of the minimum
    /// [`PhysicalAllocation::granularity`] ([`VirtualMemoryRefusal::SizeNotGranular`] naming
    /// both, [`VirtualMemoryRefusal::Empty`]). Refused as that is on a driver or device without
    /// virtual memory.
    #[doc(alias = "cuMemAddressReserve")]
    #[doc(alias = "cuMemAddressFree")]
    pub fn new(context: &CudaContext, bytes: usize) -> Result<Self> {
        require_virtual_memory(context)?;
        let granularity = granularity_of(context, false)?;
        check_size(bytes, granularity.minimum)?;
        Ok(Self {
            inner: Arc::new(Reservation::reserve(Home::of(context), bytes, granularity)?),
        })
    }

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

    /// The device address of the first reserved byte.
    pub fn device_ptr(&self) -> CUdeviceptr {
        self.inner.base
    }

    /// The reserved size in bytes.
    pub fn bytes(&self) -> usize {
        self.inner.bytes
    }

    /// The device's minimum granularity, which mapping offsets and sizes are multiples of.
    pub fn granularity(&self) -> usize {
        self.inner.granularity
    }
}

impl fmt::Debug for AddressReservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "AddressReservation({:#x}, {} bytes, device {})",
            self.inner.base, self.inner.bytes, self.inner.home.ordinal
        )
    }
}
