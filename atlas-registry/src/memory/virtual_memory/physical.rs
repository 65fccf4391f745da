//! [`PhysicalAllocation`]: device memory created apart from any address (`cuMemCreate`), or
//! imported from another process through a file descriptor (`cuMemImportFromShareableHandle`),
//! and mapped where the caller chooses ([`AddressReservation::map`](crate::AddressReservation::map)).

use std::fmt;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use atlas_sys::{CUmemAllocationHandleType, CUmemGenericAllocationHandle};

use crate::device::context::CudaContext;
use crate::driver::{About, calls};
use crate::error::{Result, VirtualMemoryRefusal, report_cleanup};
use crate::memory::virtual_memory::{
    Home, check_size, refused, require_file_descriptors, require_virtual_memory,
};

/// The allocation granularity of a device's memory: sizes and offsets of physical allocations and
/// mappings are multiples of `minimum`; `recommended` (a multiple of it) performs best.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Granularity {
    /// The size every physical allocation and mapping is a multiple of.
    pub minimum: usize,
    /// The size the driver recommends allocating in, for performance.
    pub recommended: usize,
}

/// Physical memory of one device, created or imported, mapped nowhere until an
/// [`AddressReservation`](crate::AddressReservation) maps it.
///
/// Dropping it releases this handle (`cuMemRelease`); a mapping of it keeps the memory (the mapping
/// holds it, and the driver keeps mapped memory whatever handles are released). Memory another
/// process imported stays allocated while that import lives, even after the creator released it.
///
/// An [`exportable`](Self::exportable) allocation can be handed to another process as a file
/// descriptor ([`export`](Self::export)), which that process
/// [`import`](Self::import)s and maps: both then use the same memory. An imported allocation
/// knows it is borrowed ([`is_imported`](Self::is_imported)): dropping it releases only the
/// import.
///
/// # Sharing with another process
///
/// The driver counts every handle to the memory, an import in another process included, and
/// frees it when the last handle is released and the last mapping unmapped: so an import stays
/// valid whatever the exporter does. What the driver does not do is order the two processes'
/// work: Atlas synchronizes its own context before it unmaps, but cannot see the other process.
/// Keep the exporting allocation (and its mapping) alive while the importer uses the memory
/// when you rely on what the importer writes, and read it only once the importer says it has
/// finished (its stream synchronized: a message on a socket, a pipe, or its exit). A process that
/// dies while using the memory takes only its own handles with it.
///
/// # Examples
///
/// ```no_run
/// # fn f(registry: &atlas_registry::AtlasRegistry) -> atlas_registry::Result<()> {
/// use atlas_registry::{AddressReservation, DeviceMemory, MemoryAccess, PhysicalAllocation};
/// let ctx = registry.ctx();
/// let granule = PhysicalAllocation::granularity(ctx)?.minimum;
/// let memory = PhysicalAllocation::exportable(ctx, granule)?;
/// let reservation = AddressReservation::new(ctx, 4 * granule)?;
/// let mut mapping = reservation.map(0, &memory)?;
/// mapping.set_access(ctx, MemoryAccess::ReadWrite)?;
/// let fd = memory.export()?; // an OwnedFd: pass it to another process (it imports it)
/// let buffer = mapping.into_buffer::<f32>()?; // a DeviceBuffer over the mapped memory
/// assert_eq!(buffer.device_ptr(), reservation.device_ptr());
/// # drop(fd); Ok(()) }
/// ```
pub struct PhysicalAllocation {
    pub(super) inner: Arc<Physical>,
}

/// A handle to physical memory, released when the last of its allocation and mappings goes.
pub(super) struct Physical {
    pub(super) handle: CUmemGenericAllocationHandle,
    pub(super) bytes: usize,
    /// The device the memory is on, and a context of it, made current for the release.
    pub(super) home: Home,
    exportable: bool,
    imported: bool,
}

// SAFETY: a driver handle and a context handle (in `home`), never dereferenced by Rust; the driver takes them
// from any thread. Released once, by the drop of the last holder.
unsafe impl Send for Physical {}
// SAFETY: as for Send; shared references only read the values.
unsafe impl Sync for Physical {}

impl Physical {
    /// `bytes` of memory of `home`'s device (`cuMemCreate`), shareable by file descriptor when
    /// `exportable`. The size's granularity is the caller's to have checked, and the context the
    /// caller's to have made current.
    pub(super) fn create(home: Home, bytes: usize, exportable: bool) -> Result<Self> {
        let properties = calls::device_memory_properties(home.device, exportable);
        let handle = calls::mem_create(bytes, &properties)
            .about(|| format!("{bytes} bytes on device {}", home.ordinal))?;
        Ok(Self {
            handle,
            bytes,
            home,
            exportable,
            imported: false,
        })
    }
}

impl Drop for Physical {
    fn drop(&mut self) {
        let result = self.home.bind().and_then(|()| {
            // SAFETY: a handle of `cuMemCreate` or of an import, released once: here, by the last
            // holder (the allocation and every mapping of it share this value).
            Ok(unsafe { calls::mem_release(self.handle) }?)
        });
        report_cleanup("releasing physical device memory", result);
    }
}

impl PhysicalAllocation {
    /// The allocation granularity of `context`'s device memory (`cuMemGetAllocationGranularity`,
    /// minimum and recommended). Exportable memory is checked against its own when created.
    ///
    /// Refused: a driver without the virtual memory entry points
    /// ([`AtlasError::MissingSymbol`](crate::AtlasError::MissingSymbol), naming the first one
    /// missing), a device without virtual memory management
    /// ([`VirtualMemoryRefusal::ManagementUnsupported`]).
    #[doc(alias = "cuMemGetAllocationGranularity")]
    pub fn granularity(context: &CudaContext) -> Result<Granularity> {
        require_virtual_memory(context)?;
        granularity_of(context, false)
    }

    /// Creates `bytes` of physical memory on `context`'s device (`cuMemCreate`), contents
    /// unspecified, mapped nowhere.
    ///
    /// `bytes` must be a non-zero multiple of the minimum [`granularity`](Self::granularity)
    /// ([`VirtualMemoryRefusal::SizeNotGranular`] naming both, [`VirtualMemoryRefusal::Empty`]),
    /// checked before the memory is created; refused as [`granularity`](Self::granularity) is
    /// on a driver or device without virtual memory.
    #[doc(alias = "cuMemCreate")]
    pub fn new(context: &CudaContext, bytes: usize) -> Result<Self> {
        require_virtual_memory(context)?;
        check_size(bytes, granularity_of(context, false)?.minimum)?;
        context.bind()?;
        Ok(Self {
            inner: Arc::new(Physical::create(Home::of(context), bytes, false)?),
        })
    }

    /// As [`new`](Self::new), shareable with other processes through a POSIX file descriptor
    /// ([`export`](Self::export); `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`). A device that
    /// cannot share memory so is refused
    /// ([`VirtualMemoryRefusal::FileDescriptorsUnsupported`]).
    #[doc(alias = "cuMemCreate")]
    pub fn exportable(context: &CudaContext, bytes: usize) -> Result<Self> {
        require_file_descriptors(context)?;
        check_size(bytes, granularity_of(context, true)?.minimum)?;
        context.bind()?;
        Ok(Self {
            inner: Arc::new(Physical::create(Home::of(context), bytes, true)?),
        })
    }

    /// A POSIX file descriptor naming this memory (`cuMemExportToShareableHandle`), owned by the
    /// caller, for another process to [`import`](Self::import) (pass it over a Unix socket, or
    /// let a child inherit it). Each call opens a new descriptor.
    ///
    /// Refused before the driver is called when the memory was not created
    /// [`exportable`](Self::exportable) ([`VirtualMemoryRefusal::NotExportable`]).
    #[doc(alias = "cuMemExportToShareableHandle")]
    pub fn export(&self) -> Result<OwnedFd> {
        if !self.inner.exportable {
            return Err(refused(VirtualMemoryRefusal::NotExportable));
        }
        self.inner.home.bind()?;
        // SAFETY: a live handle (this allocation holds it), created or imported with the POSIX
        // file descriptor handle type (checked above).
        Ok(unsafe { calls::export_fd(self.inner.handle) }.about(|| {
            format!(
                "{} bytes of exportable memory on device {}",
                self.inner.bytes, self.inner.home.ordinal
            )
        })?)
    }

    /// Imports the memory another process [`export`](Self::export)ed as `fd`
    /// (`cuMemImportFromShareableHandle`), for `context`'s device; `bytes` is the size the
    /// exporter created (send it with the descriptor: the driver does not tell), checked against
    /// the granularity. The descriptor stays the caller's: close it when convenient (the import
    /// does not need it).
    ///
    /// The allocation's device is asked of the driver (`cuMemGetAllocationPropertiesFromHandle`):
    /// memory of another device than `context`'s is refused
    /// ([`VirtualMemoryRefusal::OtherDevice`], naming both), and the import released again.
    /// Refused as [`exportable`](Self::exportable) is on a driver or device that cannot share
    /// memory so. A `bytes` larger than the exporter's allocation is refused by the driver when
    /// it is mapped. See the type's docs for what each process must keep while the other uses the
    /// memory.
    #[doc(alias = "cuMemImportFromShareableHandle")]
    #[doc(alias = "cuMemGetAllocationPropertiesFromHandle")]
    pub fn import(context: &CudaContext, fd: BorrowedFd<'_>, bytes: usize) -> Result<Self> {
        require_file_descriptors(context)?;
        check_size(bytes, granularity_of(context, true)?.minimum)?;
        context.bind()?;
        let handle = calls::import_fd(fd.as_raw_fd())
            .about(|| format!("file descriptor {}", fd.as_raw_fd()))?;
        // Released on every path from here: by the drop of this value.
        let mut physical = Physical {
            handle,
            bytes,
            home: Home::of(context),
            exportable: false,
            imported: true,
        };
        // SAFETY: a live handle of the import just made.
        let properties = unsafe { calls::allocation_properties(handle) }
            .about(|| format!("memory imported on device {}", context.ordinal()))?;
        if properties.location.id != context.device() {
            return Err(refused(VirtualMemoryRefusal::OtherDevice {
                allocation: usize::try_from(properties.location.id).unwrap_or(usize::MAX),
                context: context.ordinal(),
            }));
        }
        physical.exportable = properties.requestedHandleTypes.0
            & CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0
            != 0;
        Ok(Self {
            inner: Arc::new(physical),
        })
    }

    /// The size in bytes.
    pub fn bytes(&self) -> usize {
        self.inner.bytes
    }

    /// Whether this memory was imported from another process: it is borrowed, and dropping it
    /// releases only the import (the exporter's allocation is its own).
    pub fn is_imported(&self) -> bool {
        self.inner.imported
    }

    /// Whether the memory can be [`export`](Self::export)ed.
    pub fn is_exportable(&self) -> bool {
        self.inner.exportable
    }
}

/// The granularity of `context`'s device memory, exportable or not.
pub(super) fn granularity_of(context: &CudaContext, exportable: bool) -> Result<Granularity> {
    let properties = calls::device_memory_properties(context.device(), exportable);
    let (minimum, recommended) = calls::allocation_granularity(&properties)
        .about(|| format!("device {}", context.ordinal()))?;
    Ok(Granularity {
        minimum: minimum.max(1),
        recommended: recommended.max(minimum).max(1),
    })
}

impl fmt::Debug for PhysicalAllocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PhysicalAllocation")
            .field("bytes", &self.inner.bytes)
            .field("device", &self.inner.home.ordinal)
            .field("exportable", &self.inner.exportable)
            .field("imported", &self.inner.imported)
            .finish()
    }
}
