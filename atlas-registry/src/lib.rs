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
