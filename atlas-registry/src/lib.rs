//! Load CUDA kernels once per model and launch them from Rust with the driver's own overhead.
//! Atlas checks everything it can see before the driver is called, so that safe code cannot crash
//! the process or lose a device, and costs one `cuLaunchKernel` per launch.
//!
//! An [`AtlasRegistry`] is one model's set of modules (PTX, cubin, fatbin), loaded once on one
//! device and unloaded when the model goes. Functions come from it as owning [`CudaFunction`]s,
//! as borrowed [`FunctionRef`]s from per-call-site [`FunctionCache`]s (no lock on a hit), or as
//! plain [`RawCudaFunc`]s for [`AtlasRegistry::launch_on_stream`]; the first two are views of the
//! registry's one [`Kernel`] entry for the function and share all its code. Launches go on the stream the
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
//! // extern "C" __global__ void scale(float* x, float factor, unsigned int n) {
//! //     unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
//! //     if (i < n) x[i] = x[i] * factor;
//! // }
//! // as PTX ISA 8.0 for sm_75 and newer (`nvcc -ptx -arch=compute_75`, CUDA 12.0), which every
//! // CUDA 12 driver JIT-compiles. Cubins and fatbins are loaded the same way.
//! const PTX: &str = "
//! .version 8.0
//! .target sm_75
//! .address_size 64
//! .visible .entry scale(
//!     .param .u64 scale_param_0,
//!     .param .f32 scale_param_1,
//!     .param .u32 scale_param_2
//! )
//! {
//!     .reg .pred %p<2>;
//!     .reg .f32 %f<4>;
//!     .reg .b32 %r<6>;
//!     .reg .b64 %rd<5>;
//!     ld.param.u64 %rd1, [scale_param_0];
//!     ld.param.f32 %f1, [scale_param_1];
//!     ld.param.u32 %r2, [scale_param_2];
//!     mov.u32 %r3, %ctaid.x;
//!     mov.u32 %r4, %ntid.x;
//!     mov.u32 %r5, %tid.x;
//!     mad.lo.s32 %r1, %r3, %r4, %r5;
//!     setp.ge.u32 %p1, %r1, %r2;
//!     @%p1 bra DONE;
//!     cvta.to.global.u64 %rd2, %rd1;
//!     mul.wide.u32 %rd3, %r1, 4;
//!     add.s64 %rd4, %rd2, %rd3;
//!     ld.global.f32 %f2, [%rd4];
//!     mul.f32 %f3, %f2, %f1;
//!     st.global.f32 [%rd4], %f3;
//! DONE:
//!     ret;
//! }
//! ";
//!
//! # fn main() -> atlas_registry::Result<()> {
//! // One model of one module, named "elementwise", on device 0.
//! let registry = AtlasRegistry::load(0, &[("elementwise", PTX.as_bytes())])?;
//! let stream = registry.stream();
//! let input: Vec<f32> = (0..1000).map(|i| i as f32).collect();
//! let mut x = DeviceBuffer::from_slice(registry.ctx(), stream, &input)?;
//!
//! let scale = registry.function_cached("elementwise", "scale")?;
//! let n = x.len() as u32;
//! // SAFETY: `scale` touches the first `n` floats of `x`, which holds exactly `n`; `x` outlives
//! // the launch (`to_vec` below waits for it on the same stream).
//! unsafe { scale.launch(stream, &LaunchConfig::for_elements(n, 256), (&mut x, 2.0f32, n)) }?;
//!
//! let out = x.to_vec(stream)?;
//! assert_eq!(out[10], 20.0);
//! # Ok(()) }
//! ```
//!
//! # Safety model
//!
//! Atlas checks everything it can see before the driver is called, and refuses with a typed
//! [`AtlasError`]; nothing that safe code can do is undefined behaviour or crashes the process.
//!
//! What Atlas checks:
//! - **Arguments**: their count and sizes against the kernel's real parameter layout, read once
//!   with `cuFuncGetParamInfo` (CUDA 12.4+) as far as the module's blob declares parameters (the
//!   PTX `.entry` parameter list, the cubin's `.nv.info` parameter records), each size agreeing
//!   with the blob's, else to the driver's last; from the blob alone on drivers without it. When
//!   neither can tell, a typed launch is refused ([`AtlasError::ParamsUnknown`]); it is never
//!   launched unchecked.
//! - **Devices and contexts**: the stream and every [`DeviceBuffer`] argument (or view of one)
//!   belong to the function's context ([`AtlasError::WrongDevice`], naming both devices). Allocations, loads and
//!   copies happen in Atlas's own context whatever context other code left current (see
//!   "Threads and contexts").
//! - **Limits**: grid, block and shared memory against the device's [`DeviceLimits`]; the >48 KiB
//!   dynamic shared memory opt-in is made for the launch that needs it.
//! - **Blobs**: malformed modules are refused before the driver parses them, and so is code the
//!   device cannot run (other architectures only, PTX newer than the driver), naming both sides.
//!   Checking one allocates at most [`UNCOMPRESSED_LIMIT`] for the compressed code it reads
//!   ([`validate_blob`], "Memory"), whatever the blob declares.
//! - **Lifetimes**: a function handle keeps its module loaded ([`CudaFunction`]) or borrows the
//!   registry that does ([`FunctionRef`]); a handle of another registry is never trusted. A graph
//!   keeps the modules it launches loaded and the buffers its typed launches use allocated
//!   ([`CudaGraph`]).
//!
//! What the caller vouches for: what the kernel does with valid arguments. Rust cannot see that a
//! `u64` is meant as a pointer or that `n` is the length of the buffer before it, and a kernel can
//! write wherever its arguments lead it (with HMM, ATS, registered or managed memory, into host
//! memory too). So every launch is an `unsafe fn` with one short contract, the same everywhere:
//!
//! 1. Everything the kernel reads or writes through its arguments is valid, in-bounds memory of
//!    the function's device.
//! 2. That memory stays allocated until the kernel has run.
//!
//! [`KernelParam`] is an `unsafe trait` and [`KernelArgs`] is sealed, so no safe code can lie about
//! an argument's size. A typed launch does not compile outside `unsafe`:
//!
//! ```compile_fail
//! # fn f(scale: &atlas_registry::CudaFunction, stream: &atlas_registry::CudaStream) -> atlas_registry::Result<()> {
//! scale.launch(stream, &atlas_registry::LaunchConfig::for_elements(1, 1), ())
//! # }
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
//!     // SAFETY: `noop` takes no arguments and touches no memory.
//!     unsafe { NOOP.get(registry)?.launch(registry.stream(), &LaunchConfig::for_elements(1, 1), ()) }?;
//! }
//! # Ok(()) }
//! ```
//!
//! # Checked, typed launches
//!
//! [`Kernel::launch`] (which [`CudaFunction`] and [`FunctionRef`] reach by `Deref`) takes the arguments as a tuple of
//! [`KernelParam`]s (scalars, `&DeviceBuffer`s). A wrong count or size is an
//! [`AtlasError::InvalidLaunch`] naming the kernel and both layouts, before the driver is called.
//! The parameter array is built on the stack: no allocation, one `cuLaunchKernel`.
//!
//! # Graphs
//!
//! [`CudaStream::begin_capture`] returns a [`Capture`], which borrows the stream mutably (the
//! driver needs the stream to itself while a capture begins or ends) and through which launches,
//! from any thread, are captured; [`Capture::end`] returns them as a [`CudaGraph`];
//! [`CudaGraph::instantiate`] makes a [`GraphExec`] that replays them with one
//! driver call and whose kernel arguments [`GraphExec::set_kernel_args`] changes in place.
//!
//! A graph owns what it launches: the registry of every kernel captured into it (so its modules
//! stay loaded) and the memory of every [`DeviceBuffer`] given to a captured typed launch, copy or
//! fill, whole or through a view (freed by the last graph that uses it). So the registry, the
//! function handle and the buffers may go before the graph does; what a replay still asks of the
//! caller is only memory the graph cannot see (addresses passed as integers, the host side of
//! captured host copies).
//!
//! ```no_run
//! # fn f(registry: atlas_registry::AtlasRegistry, mut x: atlas_registry::DeviceBuffer<f32>) -> atlas_registry::Result<()> {
//! use atlas_registry::{CudaStream, LaunchConfig, release};
//! let mut stream = CudaStream::new(registry.ctx())?;
//! let scale = registry.function_cached("elementwise", "scale")?; // resolved before capture
//! let (n, cfg) = (x.len() as u32, LaunchConfig::for_elements(x.len() as u32, 256));
//! let capture = stream.begin_capture()?;
//! // SAFETY: `scale` touches the `n` floats of `x`, which the graph keeps allocated.
//! unsafe { scale.launch(&capture, &cfg, (&mut x, 2.0f32, n)) }?;
//! let mut exec = capture.end()?.instantiate()?;
//! drop((scale, x));
//! assert!(release(registry).is_err()); // `InUse`: the graph keeps the module loaded
//! // SAFETY: the graph reaches only the memory of its buffer argument, which it keeps.
//! unsafe { exec.launch(&stream) }?;
//! # Ok(()) }
//! ```
//!
//! A replay is `unsafe` for what the graph cannot keep:
//!
//! ```compile_fail
//! # fn f(exec: &atlas_registry::GraphExec, stream: &atlas_registry::CudaStream) -> atlas_registry::Result<()> {
//! exec.launch(stream)
//! # }
//! ```
//!
//! and a graph is instantiated once (a graph with memory nodes may have one executable graph at a
//! time, the driver's rule):
//!
//! ```compile_fail
//! # fn f(graph: atlas_registry::CudaGraph) -> atlas_registry::Result<()> {
//! let first = graph.instantiate()?;
//! let second = graph.instantiate()?;
//! # Ok(()) }
//! ```
//!
//! # Copies from host memory
//!
//! [`DeviceBuffer::copy_from`], [`copy_to`](DeviceBuffer::copy_to) and
//! [`to_vec`](DeviceBuffer::to_vec) take ordinary (pageable) host memory and wait for the copy:
//! the driver stages pageable memory, so such a copy overlaps nothing anyway. Page-locked memory,
//! allocated as a [`PinnedBuffer`] or a `Vec` registered in place as a [`HostRegistration`], is
//! copied by the device directly and at full bus bandwidth, while the host and other streams
//! work on: its copies only enqueue, and they are safe, because the buffer records an event after
//! each one and waits for it before the host touches the memory again (or it is freed). Locked
//! memory is taken from the rest of the system and slow to allocate: allocate it once, and reuse
//! it as a staging buffer.
//! # Device memory: views, copies and fills
//!
//! A [`DeviceBuffer`] is one allocation; [`DeviceSlice`] and [`DeviceSliceMut`] are views of part
//! of one, bounds-checked when made and borrowing the buffer, so they cannot outlive it and a
//! view that may be written is the only view of its elements. Kernels take views as they take
//! buffers. The sealed traits [`DeviceMemory`] (read) and [`DeviceMemoryMut`] (written) give
//! buffers and views the same methods, each written once:
//!
//! - views: `range`, `split_at`, `chunks` and their `_mut` forms;
//! - copies between device memory of one device ([`DeviceMemoryMut::copy_from_device`],
//!   `cuMemcpyDtoDAsync`), of rows of pitched layouts ([`copy_2d_from_device`](DeviceMemoryMut::copy_2d_from_device),
//!   `cuMemcpy2DAsync`) and fills of 1, 2 or 4 bytes or of a typed value ([`fill`](DeviceMemoryMut::fill),
//!   `cuMemsetD8/16/32Async`): enqueued, one driver call each, capturable through a [`&Capture`](Capture);
//! - copies from another device's memory ([`copy_from_peer`](DeviceMemoryMut::copy_from_peer),
//!   `cuMemcpyPeerAsync`), direct once [`CudaContext::enable_peer_access`] has let the devices
//!   reach each other, staged through the host otherwise;
//! - copies to and from the host that wait for the stream (refused during a capture), and
//!   `unsafe` ones that do not.
//!
//! Each is checked before the driver is called: the stream and the source belong to the memory's
//! context ([`AtlasError::WrongContext`]), lengths agree, ranges, rows and fill widths fit the
//! memory ([`AtlasError::Memory`], a [`MemoryRefusal`] naming the numbers). Memory that an
//! enqueued copy or fill touches stays allocated until the device has done it: its buffer is
//! freed after the device's work, and a graph that captured it keeps it.
//!
//! ```no_run
//! # fn f(registry: &atlas_registry::AtlasRegistry) -> atlas_registry::Result<()> {
//! use atlas_registry::{Copy2d, DeviceBuffer, DeviceMemory, DeviceMemoryMut, LaunchConfig};
//! let (ctx, stream) = (registry.ctx(), registry.stream());
//! let rows: Vec<f32> = (0..64 * 64).map(|i| i as f32).collect();
//! let matrix = DeviceBuffer::from_slice(ctx, stream, &rows)?; // 64×64, row-major
//! let mut out = DeviceBuffer::<f32>::zeroed(ctx, stream, 2 * 256)?;
//! let (mut block, mut tail) = out.split_at_mut(256)?;
//! // The 16×16 block at row 8, column 4, packed: one cuMemcpy2DAsync.
//! let shape = Copy2d { width: 16, height: 16, src_pitch: 64, dst_pitch: 16 };
//! block.copy_2d_from_device(stream, &matrix.range(8 * 64 + 4..)?, shape)?;
//! tail.copy_from_device(stream, &block)?; // one cuMemcpyDtoDAsync
//! tail.range_mut(..16)?.fill(stream, -1.0)?; // one cuMemsetD32Async
//! let scale = registry.function_cached("elementwise", "scale")?;
//! // SAFETY: `scale` touches the 256 floats of the view; `to_vec` waits for it.
//! unsafe { scale.launch(stream, &LaunchConfig::for_elements(256, 256), (block, 2.0f32, 256u32))? };
//! let host = out.to_vec(stream)?;
//! assert_eq!((host[0], host[16], host[256], host[256 + 16]), (1032.0, 1160.0, -1.0, 580.0));
//! # Ok(()) }
//! ```
//!
//! # One load for every GPU
//!
//! [`AtlasLibrary::load`] loads a model once with `cuLibraryLoadData`, independent of any
//! context; [`AtlasLibrary::registry`] gives each device a registry over that one load.
//!
//! # Blobs for several architectures
//!
//! A [`BlobSet`] gives a module as cubins for several architectures and PTX, as Atlas's own
//! kernels are shipped ([`Model::blob_set`]): each device loads its own SASS, else SASS of an
//! older minor version of its architecture, else PTX its driver JIT-compiles, and a device that
//! runs none is refused naming what the set holds. [`AtlasLibrary::load_model`] chooses for each
//! device.
//!
//! # Run-time compilation
//!
//! A [`Model`] takes CUDA C++ [`CudaSource`]s beside blobs: [`AtlasRegistry::load_model`] and
//! [`AtlasLibrary::load_model`] compile each with NVRTC (loaded at run time, as libcuda is) for
//! the device's architecture, through a persistent, content-addressed [`CompileCache`], and load
//! the result as an ordinary module. Kernels of a source's name expressions are found by their
//! C++ name (`function_cached("gemm", "gemm<128>")`); [`Model::preload`] resolves every kernel at
//! load. [`Compiler`] compiles without loading anything.
//!
//! # Threads and contexts
//!
//! Each device has one process-wide [`CudaHost`]: its primary context and one stream. Every call
//! that acts in "the current context" (allocations, loads, copies, lookups, launches on the legacy
//! default stream) first asks the driver which context is current (`cuCtxGetCurrent`) and makes
//! Atlas's current when it is not, so other code changing the thread's context (another library,
//! `cuCtxPushCurrent`) never makes Atlas act in the wrong one. A launch on a created stream asks
//! nothing: the stream names its context, and the launch stays one driver call.
//!
//! Atlas leaves its context current on the thread afterwards; code that needs another context
//! current makes it current again itself.

mod closest;
mod code;
mod compile;
mod device;
mod driver;
mod error;
mod flight_recorder;
mod graph;
mod launch;
mod memory;
mod registry;
mod report;

pub use code::blob::{
    BlobKind, UNCOMPRESSED_LIMIT, sniff, validate_blob, validate_blob_for_device,
};
pub use code::blob_set::BlobSet;
pub use code::dependency_wait::{DependencyWait, kernel_dependency_waits};
pub use code::layout::{
    CubinProblem, KernelLayout, LayoutError, ParamSlot, PtxParam, PtxProblem, RecordIssue,
    UnreadableBlob, cubin_kernel_layouts, kernel_layout, kernel_layouts, ptx_kernel_layouts,
};
pub use compile::cache::{
    CACHE_DIR_VAR, CACHE_DISABLE_VAR, CACHE_MAX_BYTES_VAR, DEFAULT_MAX_BYTES,
};
pub use compile::{
    CacheOutcome, CompileCache, CompileTarget, CompiledCode, Compiler, CudaSource, Distrust,
    FileRead,
};
pub use device::context::CudaContext;
pub use device::event::CudaEvent;
pub use device::green_context::{GreenContext, SmGranularity, SmResource, SmSplit};
pub use device::host::{CudaHost, device_count, host};
pub use device::info::{DeviceUuid, MemoryInfo, PciBusId};
pub use device::limits::DeviceLimits;
pub use device::stream::{CudaStream, StreamArg};
pub use driver::DriverFailure;
pub use driver::calls::ContextLimit;
pub use driver::calls::{
    TensorDataType, TensorInterleave, TensorL2Promotion, TensorOobFill, TensorSwizzle,
};
pub use driver::nvrtc::{NvrtcFailure, nvrtc_error_text};
pub use driver::status::{CUDA_ERROR_DEINITIALIZED, cuda_error_text, is_teardown_noop};
pub use error::BatchRefusal;
pub use error::CompileRefusal;
pub use error::ContextLimitRefusal;
pub use error::{ArgumentMismatch, AttributeRefusal};
pub use error::{
    AtlasError, CaptureMisuse, EventMisuse, HostMemoryRefusal, LaunchRefusal, LimitError,
    NotFoundKind, Result,
};
pub use error::{CopySide, MemoryRefusal, VirtualMemoryRefusal};
pub use error::{GraphFeature, LargeParamsRefusal, UpdateRefusal};
pub use error::{GreenContextRefusal, TensorArgument, TensorMapRefusal};
pub use error::{MemoryOrigin, PoolRefusal, SharingRefusal};
pub use flight_recorder::{
    FLIGHT_RECORDER_VAR, FaultReport, FlightRecorder, LaunchKind, LaunchRecord, RING_SLOTS,
    RecordedArgument,
};
pub use graph::capture::{Capture, CudaGraph};
pub use graph::conditional::ConditionalHandle;
pub use graph::exec::GraphExec;
pub use graph::update::GraphUpdate;
pub use launch::args::{KernelArgs, KernelParam};
pub use launch::attributes::{LaunchAttributes, MemSyncDomain, PORTABLE_CLUSTER_BLOCKS};
pub use launch::config::LaunchConfig;
pub use launch::held::GraphHolds;
pub use launch::kernel::{FunctionAttributes, Kernel};
pub use launch::large_params::{CLASSIC_PARAM_BYTES, MAX_PARAM_BYTES};
pub use launch::tensor_map::{Im2colTensor, TensorMap, TensorOptions, TiledTensor};
pub use memory::batch::{
    BatchBuilder, CopyBatch, DeviceDestination, DeviceSource, HostDestination, HostSource,
    PageLocked,
};
pub use memory::buffer::{DeviceBuffer, DeviceCopy};
pub use memory::copy::{copy_to_device_async, copy_to_host_async};
pub use memory::device_memory::{DeviceMemory, DeviceMemoryMut};
pub use memory::pinned::{PinnedBuffer, PinnedFlags};
pub use memory::pitched::Copy2d;
pub use memory::pool::{MemoryPool, PoolProperties, PoolUsage, ReusePolicy};
pub use memory::registered::{HostRegistration, RegisterFlags, RegistrationFailed};
#[cfg(unix)]
pub use memory::sharing::{ImportedPool, IpcMemHandle, PoolPointer, SharedPool};
pub use memory::symbol::DeviceSymbol;
pub use memory::view::{DeviceChunks, DeviceChunksMut, DeviceSlice, DeviceSliceMut};
pub use memory::virtual_memory::{
    AddressReservation, Granularity, GrowableBuffer, Mapping, MemoryAccess, PhysicalAllocation,
};
pub use registry::cache::FunctionCache;
pub use registry::function::{CudaFunction, FunctionRef, RawCudaFunc};
pub use registry::library::AtlasLibrary;
pub use registry::model::Model;
pub use registry::{AtlasRegistry, release};

/// The raw driver API, for calls Atlas does not wrap.
pub use atlas_sys as sys;

#[cfg(test)]
mod send_sync {
    use super::*;

    const fn send_sync<T: Send + Sync>() {}
    const fn send_only<T: Send>() {}
    const _: () = {
        send_sync::<AtlasRegistry>();
        send_sync::<CudaFunction>();
        send_sync::<FunctionRef<'static>>();
        send_sync::<RawCudaFunc>();
        send_sync::<CudaHost>();
        send_sync::<CudaContext>();
        send_sync::<CudaStream>();
        send_sync::<DeviceBuffer<f32>>();
        send_sync::<PinnedBuffer<f32>>();
        send_sync::<HostRegistration<f32>>();
        send_sync::<DeviceSlice<'static, f32>>();
        send_sync::<DeviceSliceMut<'static, f32>>();
        send_sync::<DeviceChunks<'static, f32>>();
        send_sync::<DeviceChunksMut<'static, f32>>();
        send_sync::<AddressReservation>();
        send_sync::<PhysicalAllocation>();
        send_sync::<Mapping>();
        send_sync::<GrowableBuffer<f32>>();
        send_sync::<FunctionCache>();
        send_sync::<AtlasError>();
        send_sync::<AtlasLibrary>();
        send_sync::<Kernel>();
        send_sync::<DeviceSymbol>();
        send_sync::<LaunchAttributes>();
        send_only::<GraphExec>();
        send_sync::<CudaGraph>();
        send_sync::<GraphHolds>();
        send_sync::<ConditionalHandle>();
        send_sync::<GraphUpdate>();
        send_sync::<Model<'static>>();
        send_sync::<BlobSet<'static>>();
        send_sync::<CudaSource>();
        send_sync::<Compiler>();
        send_sync::<CompileCache>();
        send_sync::<CompiledCode>();
        send_sync::<MemoryPool>();
        send_sync::<ImportedPool>();
        send_sync::<SharedPool>();
        send_sync::<TensorMap<'static>>();
        send_sync::<GreenContext>();
        send_sync::<SmResource>();
        send_sync::<FlightRecorder>();
        send_sync::<FaultReport>();
        send_sync::<LaunchRecord>();
    };
}

// The Rust code of the README and of docs/ compiled as doctests, so what a reader copies builds.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
#[cfg(doctest)]
#[doc = include_str!("../../docs/kernels.md")]
pub struct KernelsDoctests;
#[cfg(doctest)]
#[doc = include_str!("../../docs/launches.md")]
pub struct LaunchesDoctests;
#[cfg(doctest)]
#[doc = include_str!("../../docs/graphs.md")]
pub struct GraphsDoctests;
#[cfg(doctest)]
#[doc = include_str!("../../docs/streams_and_memory.md")]
pub struct StreamsAndMemoryDoctests;
#[cfg(doctest)]
#[doc = include_str!("../../docs/compile.md")]
pub struct CompileDoctests;
#[cfg(doctest)]
#[doc = include_str!("../../docs/green_contexts.md")]
pub struct GreenContextsDoctests;
