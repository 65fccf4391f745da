//! [`AddressReservation`]: a range of device addresses reserved once (`cuMemAddressReserve`),
//! into which physical memory is mapped and unmapped while the addresses stay the same.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use atlas_sys::CUdeviceptr;

use crate::device::context::CudaContext;
use crate::driver::{About, calls};
use crate::error::{Result, VirtualMemoryRefusal, report_cleanup};
use crate::memory::virtual_memory::physical::{Granularity, granularity_of};
use crate::memory::virtual_memory::{Home, check_size, refused, require_virtual_memory};

/// A range of device addresses of one context's device, reserved and mapped to nothing until
/// [`map`](Self::map) maps [`PhysicalAllocation`](crate::PhysicalAllocation)s into it. The addresses are valid for the
/// reservation's life: they never move, whatever is mapped or unmapped.
///
/// A [`Mapping`](crate::Mapping) keeps its reservation: the addresses are freed (`cuMemAddressFree`) when the
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

    /// Records `offset .. offset + bytes` as mapped, or refuses it when it overlaps a range that
    /// is.
    pub(super) fn claim(&self, offset: usize, bytes: usize) -> Result<()> {
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
    /// [`PhysicalAllocation::granularity`](crate::PhysicalAllocation::granularity)
    /// ([`VirtualMemoryRefusal::SizeNotGranular`] naming
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
