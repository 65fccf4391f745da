//! Load CUDA kernels once per model and launch them with the driver's own overhead.
//!
//! An [`AtlasRegistry`] is one model's set of modules (PTX, cubin, fatbin), loaded once on one
//! device and unloaded when the model goes. Functions come from it as owning [`CudaFunction`]s,
//! as borrowed [`FunctionRef`]s from per-call-site [`FunctionCache`]s (no lock on a hit), or as
//! plain [`RawCudaFunc`]s for [`AtlasRegistry::launch_on_stream`]. Launches go on the stream the
//! caller names, make one `cuLaunchKernel` call, and allocate nothing.
//!
//! The driver is loaded at run time (see `atlas-sys`): without one, every call returns
//! [`AtlasError::DriverUnavailable`] saying why.
//!
//! # Example
//!
//! ```no_run
//! use atlas_registry::{AtlasRegistry, DeviceBuffer, LaunchConfig};
//!
//! # fn main() -> atlas_registry::Result<()> {
//! let registry = AtlasRegistry::load(0, atlas_kernels::ptx_for_model("demo").unwrap())?;
//! let stream = registry.stream();
//! let input: Vec<f32> = (0..1000).map(|i| i as f32).collect();
//! let mut x = DeviceBuffer::from_slice(registry.ctx(), stream, &input)?;
//!
//! let scale = registry.function_cached("elementwise", "scale")?;
//! let n = x.len() as u32;
//! scale.launch(stream, &LaunchConfig::for_elements(n, 256), (&mut x, 2.0f32, n))?;
//!
//! let out = x.to_vec(stream)?;
//! assert_eq!(out[10], 20.0);
//! # Ok(()) }
//! ```
//!
//! # Per-call-site caches
//!
//! A [`FunctionCache`] is declared once where the call is made and asked with whichever registry
//! the call is for. It holds only a slot number; the cached handle lives in the registry, so a
//! cache asked with registry B answers with B's function, and the [`FunctionRef`] it returns
//! borrows B: it cannot outlive B's modules. A hit takes no lock and no driver call.
//!
//! ```no_run
//! # fn f(a: &atlas_registry::AtlasRegistry, b: &atlas_registry::AtlasRegistry) -> atlas_registry::Result<()> {
//! use atlas_registry::{FunctionCache, LaunchConfig};
//! static NOOP: FunctionCache = FunctionCache::new("noop", "noop");
//! for registry in [a, b] {
//!     NOOP.get(registry)?.launch(registry.stream(), &LaunchConfig::for_elements(1, 1), ())?;
//! }
//! # Ok(()) }
//! ```
//!
//! # Checked, typed launches
//!
//! [`CudaFunction::launch`] and [`FunctionRef::launch`] take the arguments as a tuple of
//! [`KernelParam`]s (scalars, `&DeviceBuffer`s). The kernel's parameter layout is read once with
//! `cuFuncGetParamInfo` (CUDA 12.4+; on older drivers the check is skipped), and a wrong count or
//! size is an [`AtlasError::InvalidLaunch`] naming the kernel and both layouts, before the driver is
//! called. The configuration is checked against the device's [`DeviceLimits`]. The parameter array
//! is built on the stack: no allocation, one `cuLaunchKernel`.
//!
//! # Graphs
//!
//! [`CudaStream::begin_capture`] and [`CudaStream::end_capture`] capture launches into a
//! [`CudaGraph`]; [`CudaGraph::instantiate`] makes a [`GraphExec`] that replays them with one
//! driver call and whose kernel arguments [`GraphExec::set_kernel_args`] changes in place.
//!
//! ```no_run
//! # fn f(registry: &atlas_registry::AtlasRegistry, x: &mut atlas_registry::DeviceBuffer<f32>) -> atlas_registry::Result<()> {
//! use atlas_registry::{CudaStream, LaunchConfig};
//! let stream = CudaStream::new(registry.ctx())?;
//! let scale = registry.function_cached("elementwise", "scale")?; // resolved before capture
//! let (n, cfg) = (x.len() as u32, LaunchConfig::for_elements(x.len() as u32, 256));
//! stream.begin_capture()?;
//! scale.launch(&stream, &cfg, (&mut *x, 2.0f32, n))?;
//! let mut exec = stream.end_capture()?.instantiate()?;
//! // SAFETY: `x` outlives every replay.
//! unsafe { exec.launch(&stream) }?;
//! exec.set_kernel_args(0, scale.as_function_ref(), &cfg, (&mut *x, 0.5f32, n))?;
//! # Ok(()) }
//! ```
//!
//! # One load for every GPU
//!
//! [`AtlasLibrary::load`] loads a model once with `cuLibraryLoadData`, independent of any
//! context; [`AtlasLibrary::registry`] gives each device a registry over that one load.
//!
//! # Threads and contexts
//!
//! Each device has one process-wide [`CudaHost`]: its primary context and one stream. Every call
//! that needs the context makes it current on the calling thread first, at the cost of a
//! thread-local comparison once it is.

mod args;
mod blob;
mod cache;
mod context;
mod driver;
mod error;
mod function;
mod function_table;
mod graph;
mod host;
mod launch;
mod library;
mod memory;
mod module;
mod registry;
mod stream;

pub use args::{KernelArgs, KernelParam};
pub use blob::{BlobKind, sniff};
pub use cache::FunctionCache;
pub use context::CudaContext;
pub use error::{
    AtlasError, CUDA_ERROR_DEINITIALIZED, NotFoundKind, Result, cuda_error_text, is_teardown_noop,
};
pub use function::{CudaFunction, FunctionRef, RawCudaFunc};
pub use graph::{CudaGraph, GraphExec};
pub use host::{CudaHost, device_count, host};
pub use launch::{DeviceLimits, LaunchConfig};
pub use library::AtlasLibrary;
pub use memory::{DeviceBuffer, DeviceCopy};
pub use registry::{AtlasRegistry, DeviceSymbol, release};
pub use stream::CudaStream;

/// The raw driver API, for calls Atlas does not wrap.
pub use atlas_sys as sys;

#[cfg(test)]
mod send_sync {
    use super::*;

    const fn send_sync<T: Send + Sync>() {}
    const _: () = {
        send_sync::<AtlasRegistry>();
        send_sync::<CudaFunction>();
        send_sync::<FunctionRef<'static>>();
        send_sync::<RawCudaFunc>();
        send_sync::<CudaHost>();
        send_sync::<CudaContext>();
        send_sync::<CudaStream>();
        send_sync::<DeviceBuffer<f32>>();
        send_sync::<FunctionCache>();
        send_sync::<AtlasError>();
        send_sync::<AtlasLibrary>();
        send_sync::<GraphExec>();
    };
}

#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
