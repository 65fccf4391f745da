//! Function handles. One shape behind all of them: each is a way to reach its registry's
//! [`Kernel`], which holds everything a launch needs, so every handle shares one code path.
//!
//! - [`CudaFunction`] keeps the registry (and so the module) alive while it lives.
//! - [`FunctionRef`] borrows the registry: what the per-call-site caches hand out, no reference
//!   counting.
//! - [`RawCudaFunc`] is a plain copyable handle for the raw launch path; a registry turns it back
//!   into a [`FunctionRef`] ([`AtlasRegistry::resolve`](crate::AtlasRegistry::resolve)) only when it
//!   is one of its own.
//!
//! `CudaFunction` and `FunctionRef` dereference to [`Kernel`]: `name`, `param_sizes` and `launch`
//! are `Kernel`'s, and anything that takes a function (a graph's argument update) takes a
//! `&Kernel`, which either handle gives by `&handle`.

use std::fmt;
use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::Arc;

use atlas_sys::CUfunction;

use crate::launch::kernel::Kernel;

/// A kernel that keeps its registry, and so its module, loaded while it lives.
///
/// Dereferences to [`Kernel`], where its methods are ([`Kernel::launch`], [`Kernel::name`], …).
///
/// # Examples
///
/// A layer that holds its kernel, and so its module, for as long as it lives:
///
/// ```no_run
/// use atlas_registry::{AtlasRegistry, CudaFunction, CudaStream, DeviceBuffer, LaunchConfig};
/// use atlas_registry::Result;
///
/// struct Scale {
///     kernel: CudaFunction,
/// }
///
/// impl Scale {
///     fn new(registry: &AtlasRegistry) -> Result<Self> {
///         Ok(Self { kernel: registry.function("elementwise", "scale")? })
///     }
///
///     /// `x *= factor`, waiting for the stream.
///     fn run(&self, stream: &CudaStream, x: &mut DeviceBuffer<f32>, factor: f32) -> Result<()> {
///         let n = x.len() as u32;
///         let cfg = LaunchConfig::for_elements(n, 256);
///         // SAFETY: `scale` touches the `n` floats `x` holds; `x` stays borrowed until the stream
///         // has finished (a stream of another device is refused).
///         unsafe { self.kernel.launch(stream, &cfg, (&mut *x, factor, n))? };
///         stream.synchronize()
///     }
/// }
/// ```
#[derive(Clone)]
pub struct CudaFunction {
    /// The registry that holds the kernel (its shared state, type-erased: only its life matters).
    _registry: Arc<dyn Send + Sync>,
    /// An entry of the registry's function table, which holds it until the registry drops.
    kernel: NonNull<Kernel>,
}

// SAFETY: the kernel is Send + Sync and lives as long as the registry, which the Arc keeps alive
// wherever the value goes.
unsafe impl Send for CudaFunction {}
// SAFETY: as for Send; shared references only read the kernel.
unsafe impl Sync for CudaFunction {}

impl CudaFunction {
    /// A handle to `kernel`.
    ///
    /// # Safety
    ///
    /// 1. `kernel` is an entry of the function table of the registry whose shared state
    ///    `registry` is.
    pub(crate) unsafe fn new(registry: Arc<dyn Send + Sync>, kernel: &Kernel) -> Self {
        Self {
            _registry: registry,
            kernel: NonNull::from(kernel),
        }
    }

    /// The plain handle, for the raw launch path.
    pub fn raw(&self) -> RawCudaFunc {
        RawCudaFunc::of(self)
    }

    /// A borrowed handle to the same kernel.
    pub fn as_function_ref(&self) -> FunctionRef<'_> {
        FunctionRef::new(self)
    }
}

impl Deref for CudaFunction {
    type Target = Kernel;

    #[inline]
    fn deref(&self) -> &Kernel {
        // SAFETY: `kernel` is an entry of `registry`'s function table (`new`'s duty 1); the table
        // never drops an entry before itself, and the Arc keeps the registry alive.
        unsafe { self.kernel.as_ref() }
    }
}

impl fmt::Debug for CudaFunction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CudaFunction({})", self.name())
    }
}

/// A kernel borrowed from a registry: as [`CudaFunction`], without reference counting. Handed out
/// by the per-call-site caches ([`FunctionCache`](crate::FunctionCache)).
///
/// Dereferences to [`Kernel`]; [`get`](Self::get) gives the reference for the registry's whole
/// borrow.
#[derive(Clone, Copy)]
pub struct FunctionRef<'r> {
    kernel: &'r Kernel,
}

impl<'r> FunctionRef<'r> {
    pub(crate) fn new(kernel: &'r Kernel) -> Self {
        Self { kernel }
    }

    /// The kernel, borrowed for as long as the registry is.
    pub fn get(self) -> &'r Kernel {
        self.kernel
    }

    /// The plain handle, for the raw launch path of the registry this was borrowed from.
    pub fn raw(&self) -> RawCudaFunc {
        RawCudaFunc::of(self.kernel)
    }
}

impl Deref for FunctionRef<'_> {
    type Target = Kernel;

    #[inline]
    fn deref(&self) -> &Kernel {
        self.kernel
    }
}

impl fmt::Debug for FunctionRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FunctionRef({})", self.kernel.name())
    }
}

/// A plain, copyable kernel handle for the raw launch path
/// ([`AtlasRegistry::launch_on_stream`](crate::AtlasRegistry::launch_on_stream)).
///
/// Valid while the registry it came from is alive; it does not keep the module loaded. It
/// remembers that registry: a launch through another registry treats it like a handle made with
/// [`from_raw`](Self::from_raw), never trusting state that registry does not own.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RawCudaFunc {
    func: CUfunction,
    /// The registry's kernel, or null for a handle made with `from_raw`.
    kernel: *const Kernel,
    /// The id of the registry that owns `kernel`, or 0 for a handle made with `from_raw`.
    registry: u64,
}

// SAFETY: a CUfunction is usable from any thread; the kernel pointer is only dereferenced by the
// registry whose id the handle carries, which owns the kernel and is alive for that call.
unsafe impl Send for RawCudaFunc {}
// SAFETY: as for Send; the value is immutable.
unsafe impl Sync for RawCudaFunc {}

impl RawCudaFunc {
    fn of(kernel: &Kernel) -> Self {
        Self {
            func: kernel.raw(),
            kernel: std::ptr::from_ref(kernel),
            registry: kernel.registry_id(),
        }
    }

    /// Wraps a `CUfunction` obtained elsewhere (for `launch_on_stream` of a registry of the same
    /// context). Launches of it read the function's shared memory limit from the driver each time
    /// they need more than 0 bytes of it.
    pub fn from_raw(func: CUfunction) -> Self {
        Self {
            func,
            kernel: std::ptr::null(),
            registry: 0,
        }
    }

    /// The raw `CUfunction`.
    pub fn raw(&self) -> CUfunction {
        self.func
    }

    /// The kernel this handle names, when it is one of registry `id`'s (never for `from_raw`).
    ///
    /// # Safety
    ///
    /// 1. Registry `id` is alive for `'r`.
    pub(crate) unsafe fn kernel_of<'r>(&self, id: u64) -> Option<&'r Kernel> {
        if self.registry != id || self.kernel.is_null() {
            return None;
        }
        // SAFETY: the handle carries registry `id`'s id, so `kernel` is an entry of its function
        // table, which lives as long as the registry: for `'r` (duty 1).
        Some(unsafe { &*self.kernel })
    }
}

impl From<&Kernel> for RawCudaFunc {
    fn from(kernel: &Kernel) -> Self {
        Self::of(kernel)
    }
}

impl From<&CudaFunction> for RawCudaFunc {
    fn from(function: &CudaFunction) -> Self {
        Self::of(function)
    }
}

impl From<FunctionRef<'_>> for RawCudaFunc {
    fn from(function: FunctionRef<'_>) -> Self {
        Self::of(function.kernel)
    }
}

impl fmt::Debug for RawCudaFunc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RawCudaFunc({:p})", self.func)
    }
}
