//! Device memory shared between processes: a prefill process handing its key-value cache to a
//! decode process, an engine handing logits to a sampler process, without a copy.
//!
//! Two ways, both Linux's (POSIX file descriptors and the driver's own handles):
//!
//! - **Pools** (CUDA 11.2+): the exporter makes an exportable [`MemoryPool`]
//!   ([`PoolProperties::exportable`](crate::PoolProperties::exportable)) and shares it once as a
//!   file descriptor ([`MemoryPool::export`] → [`SharedPool`]), sent over a Unix socket
//!   (`SCM_RIGHTS`) or inherited; the importer imports it ([`ImportedPool::import`]). Then each
//!   allocation of the pool is shared as 88 plain bytes ([`MemoryPool::export_pointer`] →
//!   [`PoolPointer`]), sent any way at all, and imported as a [`DeviceBuffer`]
//!   ([`ImportedPool::import_pointer`]).
//! - **Legacy handles**: memory of [`DeviceBuffer::alloc`] (`cuMemAlloc`) is shared as 88 plain
//!   bytes ([`IpcMemHandle::export`], `cuIpcGetMemHandle`) and opened by the importer
//!   ([`IpcMemHandle::open`], `cuIpcOpenMemHandle`).
//!
//! An imported buffer knows it is borrowed: dropping it (and every graph that uses it) releases
//! the import only, after the importing device's work (`cuCtxSynchronize`, then `cuMemFree` of
//! the imported pointer, or `cuIpcCloseMemHandle`); the exporter's memory stays. What the types
//! cannot see, across two processes, is the importer's to keep ([`ImportedPool::import_pointer`]'s
//! and [`IpcMemHandle::open`]'s duties): the exporter keeps the memory allocated (does not free
//! it, and does not exit) until every importer has released it. An importer that dies, however it
//! dies, releases its imports with its process: the exporter's memory and its contents are intact.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use atlas_sys::{CUcontext, CUdeviceptr, CUmemoryPool};

use crate::device::capture::{self, Free, How, Release};
use crate::device::context::{CudaContext, ensure_bound, ordinal_of};
use crate::device::host::host;
use crate::device::info::DeviceUuid;
use crate::driver::{About, calls};
use crate::error::{AtlasError, MemoryOrigin, Result, SharingRefusal, report_cleanup};
use crate::memory::buffer::{DeviceBuffer, DeviceCopy, require_memory_pools};
use crate::memory::pool::{MemoryPool, require_fd_sharing};

/// An exported [`MemoryPool`]: the POSIX file descriptor that lets another process import it
/// (`cuMemPoolExportToShareableHandle`), and the UUID of the device whose memory it holds. Send
/// the descriptor over a Unix socket (`SCM_RIGHTS`) or let a child inherit it, and the UUID's 16
/// bytes any way; the importer puts them back together with [`from_parts`](Self::from_parts).
///
/// # Examples
///
/// ```no_run
/// # fn f(ctx: &atlas_registry::CudaContext) -> atlas_registry::Result<()> {
/// use atlas_registry::{MemoryPool, PoolProperties};
/// let pool = MemoryPool::new(ctx, &PoolProperties::new().exportable(true))?;
/// let (fd, device) = pool.export()?.into_parts();
/// // ... send `fd` with SCM_RIGHTS and `device.bytes()` to the importer ...
/// # drop((fd, device)); Ok(()) }
/// ```
#[derive(Debug)]
pub struct SharedPool {
    fd: OwnedFd,
    device: DeviceUuid,
}

impl SharedPool {
    /// A shared pool from what the exporter sent: the descriptor and its device's UUID.
    pub fn from_parts(fd: OwnedFd, device: DeviceUuid) -> Self {
        Self { fd, device }
    }

    /// The descriptor and the device's UUID, to send to the importer.
    pub fn into_parts(self) -> (OwnedFd, DeviceUuid) {
        (self.fd, self.device)
    }

    /// The descriptor.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The UUID of the device whose memory the pool holds.
    pub fn device(&self) -> DeviceUuid {
        self.device
    }
}

/// One allocation of an exported pool, as another process that imported the pool imports it
/// (`cuMemPoolExportPointer`'s 64 bytes, with the allocation's size and its device's UUID):
/// [`SIZE`](Self::SIZE) plain bytes to send any way ([`to_bytes`](Self::to_bytes),
/// [`from_bytes`](Self::from_bytes)). The bytes are no capability: the pool's descriptor is.
///
/// # Examples
///
/// ```no_run
/// # fn f(pool: &atlas_registry::MemoryPool, stream: &atlas_registry::CudaStream) -> atlas_registry::Result<()> {
/// use atlas_registry::PoolPointer;
/// // SAFETY: `stream` outlives `cache`, which is used only on it; no capture.
/// let cache = unsafe { pool.alloc_async::<u16>(stream, 1 << 20) }?;
/// stream.synchronize()?; // the allocation exists before the importer uses it
/// let bytes: [u8; PoolPointer::SIZE] = pool.export_pointer(&cache)?.to_bytes();
/// // ... send `bytes`; the importer reads `PoolPointer::from_bytes(bytes)` ...
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolPointer {
    data: [u8; 64],
    bytes: u64,
    device: DeviceUuid,
}

impl PoolPointer {
    /// Bytes of [`to_bytes`](Self::to_bytes): the driver's 64, the size (8, little-endian) and
    /// the device's UUID (16).
    pub const SIZE: usize = 88;

    /// The bytes to send.
    pub fn to_bytes(&self) -> [u8; Self::SIZE] {
        shared_bytes(&self.data, self.bytes, self.device)
    }

    /// What [`to_bytes`](Self::to_bytes) made, back.
    pub fn from_bytes(bytes: [u8; Self::SIZE]) -> Self {
        let (data, size, device) = parse_shared(bytes);
        Self {
            data,
            bytes: size,
            device,
        }
    }

    /// The allocation's size in bytes.
    pub fn byte_len(&self) -> u64 {
        self.bytes
    }

    /// The UUID of the device whose memory it is.
    pub fn device(&self) -> DeviceUuid {
        self.device
    }
}

/// Memory of [`DeviceBuffer::alloc`] shared with another process through the driver's legacy
/// handle (`cuIpcGetMemHandle`'s 64 bytes, with the allocation's size and its device's UUID):
/// [`SIZE`](Self::SIZE) plain bytes to send any way. The importer opens it with
/// [`open`](Self::open).
///
/// # Examples
///
/// ```no_run
/// # fn f(ctx: &atlas_registry::CudaContext) -> atlas_registry::Result<()> {
/// use atlas_registry::{DeviceBuffer, IpcMemHandle};
/// let logits = DeviceBuffer::<f32>::alloc(ctx, 32_000)?;
/// let bytes = IpcMemHandle::export(&logits)?.to_bytes();
/// // ... send `bytes` to the sampler process, which opens them:
/// # let sampler_ctx = ctx;
/// let handle = IpcMemHandle::from_bytes(bytes);
/// // SAFETY: `handle` is what the exporter made, and it keeps `logits` allocated (and lives)
/// // until `view` and the graphs that use it are gone.
/// let view = unsafe { handle.open::<f32>(sampler_ctx, 32_000) }?;
/// # drop(view); Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpcMemHandle {
    handle: [u8; 64],
    bytes: u64,
    device: DeviceUuid,
}

impl IpcMemHandle {
    /// Bytes of [`to_bytes`](Self::to_bytes): the driver's 64, the size (8, little-endian) and
    /// the device's UUID (16).
    pub const SIZE: usize = 88;

    /// The handle of `buffer`'s memory (`cuIpcGetMemHandle`), for another process.
    ///
    /// Refused before the driver is called: memory that is not of [`DeviceBuffer::alloc`]
    /// ([`SharingRefusal::WrongOrigin`]: the driver shares only `cuMemAlloc` memory this way;
    /// share a pool's allocations with [`MemoryPool::export_pointer`]), an empty buffer
    /// ([`SharingRefusal::Empty`]), a driver without the entry points
    /// ([`AtlasError::MissingSymbol`]).
    #[doc(alias = "cuIpcGetMemHandle")]
    pub fn export<T: DeviceCopy>(buffer: &DeviceBuffer<T>) -> Result<Self> {
        calls::require_ipc_entry_points()?;
        let origin = buffer.origin();
        if origin != MemoryOrigin::Allocated {
            return Err(AtlasError::Sharing(SharingRefusal::WrongOrigin {
                needs: MemoryOrigin::Allocated,
                origin,
            }));
        }
        let ptr = buffer.device_ptr();
        if ptr == 0 {
            return Err(AtlasError::Sharing(SharingRefusal::Empty));
        }
        // Every buffer is memory of a context Atlas retained.
        let ordinal = ordinal_of(buffer.context_raw()).ok_or_else(|| AtlasError::WrongContext {
            what: "the buffer".into(),
            expected: None,
            given: None,
        })?;
        let device = host(ordinal)?.uuid()?;
        ensure_bound(buffer.context_raw())?;
        // SAFETY: `ptr` starts the buffer's `cuMemAlloc` allocation (checked above), live while
        // the buffer is borrowed here; its context is current.
        let handle = unsafe { calls::ipc_get_mem_handle(ptr) }
            .about(|| format!("a buffer of device {ordinal}"))?;
        Ok(Self {
            handle,
            bytes: byte_len(buffer),
            device,
        })
    }

    /// Opens the memory in `context` (`cuIpcOpenMemHandle` with
    /// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`) as a buffer of `len` elements of `context`, borrowed:
    /// dropping it, and every graph that uses it, closes it (`cuIpcCloseMemHandle`, after
    /// `context`'s work), and the exporter's memory stays.
    ///
    /// What the driver does, and Atlas leaves to it:
    /// - The handle opens only in another process than the one that made it: in the exporting
    ///   process the driver refuses it (`CUDA_ERROR_INVALID_CONTEXT`), returned as
    ///   [`AtlasError::Driver`].
    /// - A context of another device than the exporter's opens the memory through peer access,
    ///   which the driver enables when the two devices can reach each other, and refuses
    ///   otherwise (its error returned); the buffer is then memory of `context` that lives on the
    ///   exporter's device. [`device`](Self::device) names that device.
    /// - Opened twice in one context, the handle gives the same address twice; each buffer closes
    ///   its own opening.
    ///
    /// Refused before the driver is called: `len` elements that do not fit the exported memory
    /// ([`SharingRefusal::TooLong`]), a driver without the entry points
    /// ([`AtlasError::MissingSymbol`]).
    ///
    /// # Safety
    ///
    /// 1. `self` is what [`export`](Self::export) made in another process (its bytes unaltered),
    ///    so its size is the memory's.
    /// 2. The exporter keeps the memory allocated (does not drop or free the buffer) and does not
    ///    exit until the buffer returned here and every graph that uses it are gone: the driver
    ///    leaves freeing exported memory before the importer closes it undefined.
    #[doc(alias = "cuIpcOpenMemHandle")]
    #[doc(alias = "cuIpcOpenMemHandle_v2")]
    pub unsafe fn open<T: DeviceCopy>(
        &self,
        context: &CudaContext,
        len: usize,
    ) -> Result<DeviceBuffer<T>> {
        calls::require_ipc_entry_points()?;
        check_fits::<T>(len, self.bytes)?;
        context.bind()?;
        // SAFETY: `context` was made current above.
        let ptr = unsafe { calls::ipc_open_mem_handle(self.handle) }
            .about(|| format!("device {}", context.ordinal()))?;
        let keeper = Import {
            context: context.raw(),
            ptr,
            how: How::AfterDevice(Release::IpcClose),
            pool: None,
        };
        // Duty 1: the memory holds `self.bytes`, which `len` elements fit in (checked above);
        // duty 2: it stays allocated while the keeper lives.
        Ok(DeviceBuffer::kept(
            context.raw(),
            ptr,
            len,
            Arc::new(keeper),
        ))
    }

    /// The bytes to send.
    pub fn to_bytes(&self) -> [u8; Self::SIZE] {
        shared_bytes(&self.handle, self.bytes, self.device)
    }

    /// What [`to_bytes`](Self::to_bytes) made, back.
    pub fn from_bytes(bytes: [u8; Self::SIZE]) -> Self {
        let (handle, size, device) = parse_shared(bytes);
        Self {
            handle,
            bytes: size,
            device,
        }
    }

    /// The memory's size in bytes.
    pub fn byte_len(&self) -> u64 {
        self.bytes
    }

    /// The UUID of the device the memory lives on.
    pub fn device(&self) -> DeviceUuid {
        self.device
    }
}

impl MemoryPool {
    /// Shares the pool with other processes as a POSIX file descriptor
    /// (`cuMemPoolExportToShareableHandle`; a new descriptor at each call). A process that imports
    /// it ([`ImportedPool::import`]) can then import the pool's allocations
    /// ([`export_pointer`](Self::export_pointer)); it cannot allocate from it.
    ///
    /// Refused before the driver is called: a pool made without
    /// [`PoolProperties::exportable`](crate::PoolProperties::exportable)
    /// ([`SharingRefusal::NotExportable`]).
    #[doc(alias = "cuMemPoolExportToShareableHandle")]
    pub fn export(&self) -> Result<SharedPool> {
        self.require_exportable()?;
        // SAFETY: the pool is live (owned by `self`).
        let fd = unsafe { calls::mem_pool_export_fd(self.raw()) }
            .about(|| format!("a memory pool of device {}", self.ordinal()))?;
        if fd < 0 {
            return Err(AtlasError::DriverAnswer {
                call: "cuMemPoolExportToShareableHandle",
                device: self.ordinal(),
                answer: fd.to_string(),
                expected: "a file descriptor",
            });
        }
        // SAFETY: a descriptor the driver opened for this call and handed over (checked valid
        // above): no one else owns or closes it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let device = DeviceUuid::from_bytes(
            calls::device_uuid(self.device()).about(|| format!("device {}", self.ordinal()))?,
        );
        Ok(SharedPool { fd, device })
    }

    /// Shares one allocation of the pool with the processes that imported it
    /// (`cuMemPoolExportPointer`). The importer may use it only after the allocation in this
    /// process's stream order: synchronize the allocating stream (or record an event the
    /// importer waits for) before it does.
    ///
    /// Refused before the driver is called: a pool that is not exportable
    /// ([`SharingRefusal::NotExportable`]), a buffer of another device
    /// ([`AtlasError::WrongContext`]), one that is not a stream-ordered allocation
    /// ([`SharingRefusal::WrongOrigin`]), an empty one ([`SharingRefusal::Empty`]). A buffer
    /// allocated from another pool of the device is the driver's to refuse (another exportable
    /// pool's allocation is exported, and only an import of that pool takes it).
    #[doc(alias = "cuMemPoolExportPointer")]
    pub fn export_pointer<T: DeviceCopy>(&self, buffer: &DeviceBuffer<T>) -> Result<PoolPointer> {
        self.require_exportable()?;
        if buffer.context_raw() != self.context_raw() {
            return Err(AtlasError::WrongContext {
                what: "the buffer".into(),
                expected: Some(self.ordinal()),
                given: ordinal_of(buffer.context_raw()),
            });
        }
        let origin = buffer.origin();
        if origin != MemoryOrigin::StreamOrdered {
            return Err(AtlasError::Sharing(SharingRefusal::WrongOrigin {
                needs: MemoryOrigin::StreamOrdered,
                origin,
            }));
        }
        let ptr = buffer.device_ptr();
        if ptr == 0 {
            return Err(AtlasError::Sharing(SharingRefusal::Empty));
        }
        // SAFETY: `ptr` starts the buffer's stream-ordered allocation (checked above), live while
        // the buffer is borrowed here.
        let data = unsafe { calls::mem_pool_export_pointer(ptr) }
            .about(|| format!("a buffer of device {}", self.ordinal()))?;
        let device = DeviceUuid::from_bytes(
            calls::device_uuid(self.device()).about(|| format!("device {}", self.ordinal()))?,
        );
        Ok(PoolPointer {
            data,
            bytes: byte_len(buffer),
            device,
        })
    }

    /// `Ok` for an exportable pool.
    fn require_exportable(&self) -> Result<()> {
        if self.is_exportable() {
            return Ok(());
        }
        Err(AtlasError::Sharing(SharingRefusal::NotExportable {
            device: self.ordinal(),
        }))
    }
}

/// A memory pool another process exported ([`MemoryPool::export`]), imported into this one
/// (`cuMemPoolImportFromShareableHandle`): the allocations the exporter shares
/// ([`MemoryPool::export_pointer`]) are imported from it as [`DeviceBuffer`]s
/// ([`import_pointer`](Self::import_pointer)). An imported pool cannot allocate. It is released
/// (`cuMemPoolDestroy`) when it and every buffer imported from it are gone.
///
/// # Examples
///
/// ```no_run
/// # fn f(ctx: &atlas_registry::CudaContext, shared: atlas_registry::SharedPool,
/// #      bytes: [u8; atlas_registry::PoolPointer::SIZE]) -> atlas_registry::Result<()> {
/// use atlas_registry::{ImportedPool, PoolPointer};
/// let pool = ImportedPool::import(ctx, &shared)?; // `shared` from the exporter's fd and UUID
/// drop(shared); // the descriptor is no longer needed
/// let pointer = PoolPointer::from_bytes(bytes);
/// let n = pointer.byte_len() as usize / 2;
/// // SAFETY: `bytes` are what the exporter's `export_pointer` made; the exporter synchronized
/// // the allocating stream before sending them, and keeps the allocation (and lives) until
/// // `cache` and the graphs that use it are gone.
/// let cache = unsafe { pool.import_pointer::<u16>(&pointer, n) }?;
/// # drop(cache); Ok(()) }
/// ```
#[derive(Clone)]
pub struct ImportedPool {
    inner: Arc<PoolImport>,
}

/// The imported pool itself, shared by the [`ImportedPool`]s and the imports made from it.
struct PoolImport {
    raw: CUmemoryPool,
    context: CUcontext,
    ordinal: usize,
    device: DeviceUuid,
}

// SAFETY: a memory pool is a driver handle usable from any thread; the context is a primary
// context retained for the process. Destroyed once, by the last holder.
unsafe impl Send for PoolImport {}
// SAFETY: shared references only import pointers from the pool, which the driver allows from any
// thread at once.
unsafe impl Sync for PoolImport {}

impl Drop for PoolImport {
    fn drop(&mut self) {
        // SAFETY: the pool was imported for this value and is destroyed only here; every pointer
        // imported from it was released first (each import holds this value until its release).
        let result = unsafe { calls::mem_pool_destroy(self.raw) }
            .about(|| format!("an imported memory pool of device {}", self.ordinal));
        report_cleanup(
            "releasing an imported memory pool",
            result.map_err(AtlasError::from),
        );
    }
}

impl ImportedPool {
    /// Imports the pool `shared` names into this process, for `context`'s device: the device
    /// whose memory the pool holds (`shared`'s UUID). The descriptor stays the caller's, and may
    /// be closed once this returns.
    ///
    /// Refused before the driver is called: a context of another device
    /// ([`SharingRefusal::OtherDevice`], naming both UUIDs), a device without memory pools or
    /// POSIX file descriptors ([`AtlasError::MemoryPoolsUnsupported`],
    /// [`SharingRefusal::PosixFdUnsupported`]), a driver without the entry points
    /// ([`AtlasError::MissingSymbol`]).
    #[doc(alias = "cuMemPoolImportFromShareableHandle")]
    pub fn import(context: &CudaContext, shared: &SharedPool) -> Result<Self> {
        require_memory_pools(context)?;
        require_fd_sharing(context)?;
        let subject = || format!("device {}", context.ordinal());
        let device = DeviceUuid::from_bytes(calls::device_uuid(context.device()).about(subject)?);
        check_device(shared.device, device, context.ordinal())?;
        context.bind()?;
        let raw = calls::mem_pool_import_fd(shared.fd.as_raw_fd())
            .about(|| format!("a memory pool shared with device {}", context.ordinal()))?;
        Ok(Self {
            inner: Arc::new(PoolImport {
                raw,
                context: context.raw(),
                ordinal: context.ordinal(),
                device,
            }),
        })
    }

    /// Imports one allocation the exporter shared (`cuMemPoolImportPointer`) as a buffer of `len`
    /// elements of the pool's context, borrowed: dropping it, and every graph that uses it,
    /// releases the import (`cuMemFree` of the imported pointer, which the driver makes release
    /// the import only, after the context's work), and the exporter's memory stays. The buffer
    /// keeps the imported pool alive.
    ///
    /// Refused before the driver is called: an allocation of another device's pool
    /// ([`SharingRefusal::OtherDevice`]), `len` elements that do not fit it
    /// ([`SharingRefusal::TooLong`]). An allocation of another pool of the device is the
    /// driver's to refuse.
    ///
    /// # Safety
    ///
    /// 1. `pointer` is what [`MemoryPool::export_pointer`] made in the exporting process (its
    ///    bytes unaltered), so its size is the allocation's.
    /// 2. The memory is used only after the allocation in the exporter's stream order: the
    ///    exporter synchronized the allocating stream before sharing `pointer`, or this process's
    ///    work waits for an event that orders it.
    /// 3. The exporter keeps the allocation (does not free it, nor destroy its pool) and does not
    ///    exit until the buffer returned here and every graph that uses it are gone: the driver
    ///    asks that every importer release it before the exporter frees it.
    #[doc(alias = "cuMemPoolImportPointer")]
    pub unsafe fn import_pointer<T: DeviceCopy>(
        &self,
        pointer: &PoolPointer,
        len: usize,
    ) -> Result<DeviceBuffer<T>> {
        let pool = &self.inner;
        check_device(pointer.device, pool.device, pool.ordinal)?;
        check_fits::<T>(len, pointer.bytes)?;
        // SAFETY: the pool is live (held by `self`).
        let ptr = unsafe { calls::mem_pool_import_pointer(pool.raw, pointer.data) }
            .about(|| format!("an imported memory pool of device {}", pool.ordinal))?;
        let keeper = Import {
            context: pool.context,
            ptr,
            how: How::AfterDevice(Release::Free),
            pool: Some(Arc::clone(pool)),
        };
        // Duty 1: the allocation holds `pointer.bytes`, which `len` elements fit in (checked
        // above); duties 2 and 3: it exists, and stays allocated while the keeper lives.
        Ok(DeviceBuffer::kept(pool.context, ptr, len, Arc::new(keeper)))
    }

    /// The ordinal of the device whose memory the pool holds.
    pub fn ordinal(&self) -> usize {
        self.inner.ordinal
    }

    /// The UUID of that device.
    pub fn device(&self) -> DeviceUuid {
        self.inner.device
    }

    /// The raw handle, for driver calls Atlas does not wrap. Valid while the pool lives.
    pub fn raw(&self) -> CUmemoryPool {
        self.inner.raw
    }
}

impl std::fmt::Debug for ImportedPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImportedPool")
            .field("raw", &self.inner.raw)
            .field("device", &self.inner.ordinal)
            .finish()
    }
}

/// Memory imported from another process: the keeper its buffer and the graphs that use it share.
/// The last of them to go drops it, which releases the import after the device's work (and then
/// the imported pool it holds, if it was the last holder).
struct Import {
    context: CUcontext,
    ptr: CUdeviceptr,
    /// [`How::AfterDevice`]: `cuMemFree` of a pool's import ([`Release::Free`]) or
    /// `cuIpcCloseMemHandle` ([`Release::IpcClose`]).
    how: How,
    pool: Option<Arc<PoolImport>>,
}

// SAFETY: a device address and a context handle, never dereferenced by Rust, released once by
// the drop; the pool is Send.
unsafe impl Send for Import {}
// SAFETY: shared references read nothing (the keeper is only held).
unsafe impl Sync for Import {}

impl Drop for Import {
    fn drop(&mut self) {
        let mut free = Free::new(self.context, self.ptr, self.how);
        if let Some(pool) = self.pool.take() {
            // The pool goes after the pointer imported from it.
            free = free.keeping(Box::new(pool));
        }
        report_cleanup(
            "releasing device memory imported from another process",
            capture::free(free),
        );
    }
}

/// `Ok` when memory of the device `exporter` names may be imported by `device` (UUID `importer`).
fn check_device(exporter: DeviceUuid, importer: DeviceUuid, device: usize) -> Result<()> {
    if exporter == importer {
        return Ok(());
    }
    Err(AtlasError::Sharing(SharingRefusal::OtherDevice {
        exporter: exporter.bytes(),
        device,
        importer: importer.bytes(),
    }))
}

/// `Ok` when `len` elements of `T` fit in `bytes`.
fn check_fits<T: DeviceCopy>(len: usize, bytes: u64) -> Result<()> {
    let asked = DeviceBuffer::<T>::bytes(len)?;
    if asked as u64 <= bytes {
        return Ok(());
    }
    Err(AtlasError::Sharing(SharingRefusal::TooLong {
        len,
        element_size: size_of::<T>(),
        bytes,
    }))
}

/// A buffer's size in bytes (it fits: it was allocated).
fn byte_len<T: DeviceCopy>(buffer: &DeviceBuffer<T>) -> u64 {
    (buffer.len() * size_of::<T>()) as u64
}

/// The driver's 64 bytes, the size and the UUID, as sent.
fn shared_bytes(data: &[u8; 64], bytes: u64, device: DeviceUuid) -> [u8; 88] {
    let mut out = [0; 88];
    out[..64].copy_from_slice(data);
    out[64..72].copy_from_slice(&bytes.to_le_bytes());
    out[72..].copy_from_slice(&device.bytes());
    out
}

/// [`shared_bytes`] read back.
fn parse_shared(bytes: [u8; 88]) -> ([u8; 64], u64, DeviceUuid) {
    let mut data = [0; 64];
    data.copy_from_slice(&bytes[..64]);
    let mut size = [0; 8];
    size.copy_from_slice(&bytes[64..72]);
    let mut device = [0; 16];
    device.copy_from_slice(&bytes[72..]);
    (
        data,
        u64::from_le_bytes(size),
        DeviceUuid::from_bytes(device),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_bytes_round_trip() {
        let data: [u8; 64] = std::array::from_fn(|i| i as u8 * 3);
        let device = DeviceUuid::from_bytes(std::array::from_fn(|i| 0xF0 ^ i as u8));
        let pointer = PoolPointer {
            data,
            bytes: 0x0102_0304_0506_0708,
            device,
        };
        let bytes = pointer.to_bytes();
        assert_eq!(&bytes[64..72], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(PoolPointer::from_bytes(bytes), pointer);
        let handle = IpcMemHandle {
            handle: data,
            bytes: 4096,
            device,
        };
        assert_eq!(IpcMemHandle::from_bytes(handle.to_bytes()), handle);
        assert_eq!(handle.byte_len(), 4096);
        assert_eq!(handle.device(), device);
    }

    #[test]
    fn refusals_say_what_to_do() {
        let wrong = AtlasError::Sharing(SharingRefusal::WrongOrigin {
            needs: MemoryOrigin::Allocated,
            origin: MemoryOrigin::StreamOrdered,
        });
        let text = wrong.to_string();
        assert!(
            text.contains("`DeviceBuffer::alloc` (cuMemAlloc)") && text.contains("stream order"),
            "{text}"
        );
        let long = AtlasError::Sharing(SharingRefusal::TooLong {
            len: 10,
            element_size: 4,
            bytes: 36,
        });
        assert_eq!(
            long.to_string(),
            "10 element(s) of 4 bytes do not fit in the 36 bytes exported; import at most 9 \
             element(s)"
        );
        let mut exporter = [0u8; 16];
        exporter[15] = 1;
        let other = AtlasError::Sharing(SharingRefusal::OtherDevice {
            exporter,
            device: 0,
            importer: [0; 16],
        });
        let text = other.to_string();
        assert!(
            text.contains("GPU-00000000-0000-0000-0000-000000000001")
                && text.contains("device 0 is GPU-00000000-0000-0000-0000-000000000000"),
            "{text}"
        );
    }
}
