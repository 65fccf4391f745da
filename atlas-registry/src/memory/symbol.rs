//! [`DeviceSymbol`]: a `__device__` variable of a loaded module, as its address and size.

use std::fmt;
use std::sync::Arc;

use atlas_sys::CUdeviceptr;

use crate::device::capture;
use crate::device::host::CudaHost;
use crate::error::{AtlasError, Result};
use crate::memory::buffer::DeviceCopy;
use crate::memory::copy::{dtoh, htod};

/// A `__device__` variable of a loaded module: its device address and size in bytes.
///
/// It keeps its module loaded while it lives (as a [`CudaFunction`](crate::CudaFunction) does), so
/// it can be stored anywhere and read or written safely; [`ptr`](Self::ptr) and
/// [`size`](Self::size) (or `<(CUdeviceptr, usize)>::from(&symbol)`) give the plain pair, for the
/// raw copies ([`AtlasRegistry::copy_h2d_async`](crate::AtlasRegistry::copy_h2d_async)) and for
/// kernel arguments.
///
/// ```no_run
/// # fn f(registry: &atlas_registry::AtlasRegistry) -> atlas_registry::Result<()> {
/// use atlas_registry::sys::CUdeviceptr;
/// // __device__ float bias; in module `device_global`
/// let bias = registry.device_symbol("device_global", "bias")?;
/// assert_eq!(bias.size(), 4);
/// bias.write(&[0.25f32])?;
/// let mut back = [0.0f32];
/// bias.read(&mut back)?;
/// assert_eq!(back, [0.25]);
/// let (ptr, size): (CUdeviceptr, usize) = (&bias).into(); // the original registry's pair
/// # let _ = (ptr, size); Ok(()) }
/// ```
#[derive(Clone)]
pub struct DeviceSymbol {
    ptr: CUdeviceptr,
    size: usize,
    /// `module::name`, for errors.
    name: Arc<str>,
    host: Arc<CudaHost>,
    /// Keeps the module that holds the variable loaded.
    _module: Arc<dyn Send + Sync>,
}

impl DeviceSymbol {
    /// The variable `name` (`module::symbol`) at `ptr`, `size` bytes, of a module on `host`'s device
    /// that `module` keeps loaded.
    pub(crate) fn new(
        ptr: CUdeviceptr,
        size: usize,
        name: String,
        host: Arc<CudaHost>,
        module: Arc<dyn Send + Sync>,
    ) -> Self {
        Self {
            ptr,
            size,
            name: name.into(),
            host,
            _module: module,
        }
    }

    /// The variable's device address.
    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// The variable's size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// `module::symbol`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Writes `value` into the variable on its device's stream and waits for the copy. The bytes
    /// must fill the variable exactly. Refused while the calling thread captures, as
    /// [`DeviceBuffer::copy_from`](crate::DeviceBuffer::copy_from) is.
    pub fn write<T: DeviceCopy>(&self, value: &[T]) -> Result<()> {
        self.check_size("writing", size_of_val(value))?;
        let stream = self.host.stream();
        capture::refuse_waiting_copy(stream.raw())?;
        // SAFETY: the variable is `size` bytes of device memory of the stream's context, kept
        // loaded by `_module`; `value` holds as many bytes and the stream is synchronized before
        // it is released (a capture begun since the check is invalidated, so no graph keeps it).
        unsafe {
            htod(
                stream.context(),
                self.ptr,
                value.as_ptr().cast(),
                self.size,
                stream.raw(),
            )
        }?;
        stream.synchronize_unchecked()
    }

    /// Reads the variable into `out` after its device stream's earlier work.
    pub fn read<T: DeviceCopy>(&self, out: &mut [T]) -> Result<()> {
        self.check_size("reading", size_of_val(out))?;
        let stream = self.host.stream();
        capture::refuse_waiting_copy(stream.raw())?;
        // SAFETY: as for `write`; every bit pattern is a valid T (DeviceCopy).
        unsafe {
            dtoh(
                stream.context(),
                out.as_mut_ptr().cast(),
                self.ptr,
                self.size,
                stream.raw(),
            )
        }?;
        stream.synchronize_unchecked()
    }

    fn check_size(&self, what: &str, given: usize) -> Result<()> {
        if given == self.size {
            Ok(())
        } else {
            Err(AtlasError::SizeMismatch {
                what: format!("{what} device symbol `{}`", self.name),
                expected: self.size,
                given,
            })
        }
    }
}

impl From<&DeviceSymbol> for (CUdeviceptr, usize) {
    fn from(symbol: &DeviceSymbol) -> Self {
        (symbol.ptr, symbol.size)
    }
}

impl fmt::Debug for DeviceSymbol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceSymbol")
            .field("name", &self.name)
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("size", &self.size)
            .finish()
    }
}
