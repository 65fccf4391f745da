//! [`AtlasRegistry`]: one model's loaded modules on one device, the one table of its kernels, and
//! the doors onto it (`function`, `function_cached`, `raw_function_cached`, the per-call-site
//! caches, `launch_on_stream`, `launch_on_stream_with`); [`release`].
//!
//! Every way to get a kernel ends in the registry's function table ([`function_table`]): an entry
//! per `module::function`, made on first lookup and kept while the registry lives. The handles
//! ([`function`]) are views of those entries.

pub(crate) mod cache;
pub(crate) mod call_sites;
pub(crate) mod function;
pub(crate) mod function_table;
pub(crate) mod library;
pub(crate) mod model;

use std::ffi::c_void;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use atlas_sys::{CUdeviceptr, CUmodule, CUstream};

use crate::closest::closest;
use crate::code::blob::BlobKind;
use crate::code::module::{Module, load_all, unload_all};
use crate::compile::CacheOutcome;
use crate::device::context::CudaContext;
use crate::device::host::{CudaHost, host, ordinal_of};
use crate::device::stream::{CudaStream, StreamArg};
use crate::driver::{About, calls};
use crate::error::{AtlasError, NotFoundKind, Result};
use crate::launch::attributes::{LaunchAttributes, LaunchFacts, launch_kernel_ex};
use crate::launch::config::LaunchConfig;
use crate::launch::enqueue::{
    Known, Params, SharedMemOptIn, UnknownFunction, check_config, launch_kernel,
};
use crate::launch::held::{self, GraphHolds};
use crate::launch::kernel::Kernel;
use crate::memory::copy::{dtoh, htod};
use crate::memory::symbol::DeviceSymbol;
use call_sites::CallSiteTable;
use function::{CudaFunction, FunctionRef, RawCudaFunc};
use function_table::FunctionTable;
use model::{Checked, Compiled, Model};

/// The shared state behind an [`AtlasRegistry`] and the handles taken from it.
pub(crate) struct RegistryInner {
    /// Unique in the process (never 0): what a [`Kernel`] and a [`RawCudaFunc`] remember of their
    /// registry.
    id: u64,
    modules: Vec<Module>,
    /// The kernels looked up so far. Entries are never removed while the registry lives, so
    /// references to them stay valid that long.
    functions: FunctionTable,
    pub(crate) call_sites: CallSiteTable,
    host: Arc<CudaHost>,
    /// The C++ names of the compiled modules' kernels, and what the compile cache did.
    compiled: Compiled,
}

/// One model's set of loaded modules on one device, with its function handles and caches.
///
/// Cloning is cheap (an `Arc`); the modules are unloaded when the last clone and the last handle
/// that keeps them ([`CudaFunction`], [`DeviceSymbol`], a graph that launches its kernels) are
/// gone, or at once by [`release`] when nothing else keeps them. There
/// is no global registry: each model holds its own, and two registries never share functions.
///
/// # Examples
///
/// Two models whose modules have the same names, each serving its own kernels:
///
/// ```no_run
/// use atlas_registry::{AtlasRegistry, Result};
///
/// /// Each model's blobs, with modules of the same names (`[("layers", ptx)]`).
/// fn swap(model_a: &[(&str, &[u8])], model_b: &[(&str, &[u8])]) -> Result<()> {
///     let a = AtlasRegistry::load(0, model_a)?;
///     let b = AtlasRegistry::load(0, model_b)?;
///     let gelu = b.function("layers", "gelu")?; // B's kernel, never A's
///     assert_eq!(gelu.name(), "layers::gelu");
///     drop(b); // B's modules stay loaded while `gelu` lives
///     atlas_registry::release(a) // A's modules unloaded now, what failed returned as a value
/// }
/// ```
#[derive(Clone)]
pub struct AtlasRegistry {
    pub(crate) inner: Arc<RegistryInner>,
}

impl AtlasRegistry {
    /// Loads a model: each `(module name, blob)` once, on device `ordinal` (its process-wide
    /// [`CudaHost`] is created if needed).
    ///
    /// Every blob is checked before the driver is loaded (see [`validate_blob`](crate::validate_blob)),
    /// so a malformed one is refused the same on a machine without a GPU; of a fatbin, the code of
    /// the entries the driver may pick for the device is checked once the device is known, exactly
    /// as [`validate_blob_for_device`](crate::validate_blob_for_device) checks it. PTX is passed
    /// NUL-terminated and JIT-compiled by the driver; ELF cubins, fatbins and clang offload
    /// bundles are passed as binaries. Bytes of any other format are refused
    /// ([`load_with_unknown_formats`](Self::load_with_unknown_formats) takes them, unsafely). An
    /// empty, malformed or unknown blob, or a duplicate module name, is an
    /// [`AtlasError::InvalidModule`] naming the module; a JIT failure is an
    /// [`AtlasError::ModuleLoad`] carrying the JIT log. Modules loaded before a failure are
    /// unloaded again.
    ///
    /// Code the device cannot run is refused before the driver sees any of the model: a cubin,
    /// fatbin or PTX for other architectures only is an [`AtlasError::NoBinaryForDevice`] naming
    /// what it holds and the device; PTX of a newer ISA version than the driver JIT-compiles (PTX
    /// from a newer toolkit, the device loading nothing else of the module: a fatbin's SASS for
    /// the device wins over its PTX) is an [`AtlasError::PtxTooNew`] naming both versions and
    /// what to ship instead.
    ///
    /// # Examples
    ///
    /// Your own kernels, as PTX (`nvcc -ptx`, NVRTC) embedded in the binary; cubins and fatbins are
    /// loaded the same way (`include_bytes!("my_kernels.sm_90.cubin")`). The README's "Your own
    /// kernels" goes from a `.cu` file to a launch.
    ///
    /// ```no_run
    /// use atlas_registry::{AtlasRegistry, DeviceBuffer, LaunchConfig};
    ///
    /// // extern "C" __global__ void touch(float* out) {}
    /// const PTX: &str = "
    /// .version 8.0
    /// .target sm_75
    /// .address_size 64
    /// .visible .entry touch(.param .u64 out)
    /// {
    ///     ret;
    /// }
    /// ";
    ///
    /// # fn main() -> atlas_registry::Result<()> {
    /// let registry = AtlasRegistry::load(0, &[("my_kernels", PTX.as_bytes())])?;
    /// let touch = registry.function("my_kernels", "touch")?;
    /// assert_eq!(touch.param_sizes()?, Some(&[8][..]));
    /// let mut out = DeviceBuffer::<f32>::alloc(registry.ctx(), 1)?;
    /// // SAFETY: `touch` reads and writes nothing.
    /// unsafe { touch.launch(registry.stream(), &LaunchConfig::for_elements(1, 1), (&mut out,))? };
    /// registry.stream().synchronize()?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuModuleLoadData")]
    #[doc(alias = "cuModuleLoadDataEx")]
    pub fn load(ordinal: usize, blobs: &[(&str, &[u8])]) -> Result<Self> {
        Self::load_model(ordinal, &Model::new().blobs(blobs))
    }

    /// As [`load`](Self::load), except that a blob of no format Atlas knows ([`BlobKind::Binary`]:
    /// not PTX, an ELF cubin or AMD GPU code object, a fatbin or a clang offload bundle) is handed
    /// to the driver as it is (with a NUL after it), unchecked. Blobs of the formats Atlas knows
    /// are checked as by `load`.
    ///
    /// # Safety
    ///
    /// For each blob of a format Atlas does not know:
    ///
    /// 1. It is code in a format the driver of this process loads (a driver other than NVIDIA's
    ///    may take formats NVIDIA's does not).
    /// 2. It is well formed: no offset, size, index or string in it leads the driver's reader
    ///    outside the blob or to the wrong structure. The driver does not check this; a malformed
    ///    image can crash the process inside `cuModuleLoadData`, which is why `load` refuses what
    ///    Atlas cannot check.
    ///
    /// Safe code cannot hand the driver unknown bytes: this does not compile outside `unsafe`.
    ///
    /// ```compile_fail
    /// let blobs: &[(&str, &[u8])] = &[("mystery", b"\xff\xfe")];
    /// let registry = atlas_registry::AtlasRegistry::load_with_unknown_formats(0, blobs);
    /// ```
    #[doc(alias = "cuModuleLoadData")]
    pub unsafe fn load_with_unknown_formats(
        ordinal: usize,
        blobs: &[(&str, &[u8])],
    ) -> Result<Self> {
        let model = Model::new().blobs(blobs);
        Self::load_checked(ordinal, &model, model.check_blobs(true)?)
    }

    /// Loads a [`Model`] on device `ordinal`: its blobs as [`load`](Self::load) does (each checked
    /// before the driver is loaded), and each of its sources compiled for the device (its own SASS
    /// when NVRTC knows its architecture, else PTX the driver JIT-compiles; from the compile cache
    /// when it holds them, see [`CompileCache`](crate::CompileCache)), checked as every blob is, and
    /// loaded as one. Kernels of a source's name expressions are found by their C++ name
    /// (`function("gemm", "gemm<128>")`) as well as by their symbol. With
    /// [`Model::preload`], every kernel is resolved before this returns.
    ///
    /// A compile error is [`AtlasError::Compile`] with NVRTC's log; without NVRTC (only needed
    /// when the model has sources), [`AtlasError::NvrtcUnavailable`].
    pub fn load_model(ordinal: usize, model: &Model<'_>) -> Result<Self> {
        Self::load_checked(ordinal, model, model.check_blobs(false)?)
    }

    /// The device half of a load: `model`, whose blobs are `checked`, made ready for device
    /// `ordinal` (sources compiled, fatbins checked for it) and loaded there.
    fn load_checked<'a>(
        ordinal: usize,
        model: &Model<'a>,
        checked: Vec<Checked<'a>>,
    ) -> Result<Self> {
        let host = host(ordinal)?;
        let cc = host.compute_capability();
        let prepared = model.prepare(checked, cc, true)?;
        prepared.refuse_unfit(&host)?;
        let compiled = prepared.compiled();
        let modules = load_all(&host, prepared.modules)?;
        let registry = Self::from_modules(host, modules, compiled);
        if model.preloads() {
            registry.preload()?;
        }
        Ok(registry)
    }

    /// What the compile cache did for module `module` when it was compiled from source at load;
    /// `None` for a module loaded from a blob (or no such module).
    pub fn cache_outcome(&self, module: &str) -> Option<&CacheOutcome> {
        self.inner
            .compiled
            .outcomes
            .iter()
            .find(|(name, _)| name == module)
            .map(|(_, outcome)| outcome)
    }

    /// Resolves every kernel of every module into the function table (and reads its parameter
    /// layout), so that no first lookup or launch pays for it; the number of kernels. The kernels
    /// are listed by the driver (`cuModuleEnumerateFunctions`, CUDA 12.4+) or, when it cannot,
    /// are those the module's blob declares.
    #[doc(alias = "cuModuleEnumerateFunctions")]
    #[doc(alias = "cuFuncLoad")]
    pub(crate) fn preload(&self) -> Result<usize> {
        let mut count = 0;
        let listed_by_driver = calls::can_enumerate_functions();
        for module in &self.inner.modules {
            let listed = if listed_by_driver {
                module.function_names()?
            } else {
                module.blob_kernel_names()
            };
            for symbol in &listed {
                let name = self.inner.compiled.names.cpp_name(module.name(), symbol);
                let kernel = self.cached_kernel(module.name(), name)?;
                // SAFETY: the kernel is this registry's, so live; `cached_kernel` made its
                // context current.
                unsafe { calls::function_load(kernel.raw()) }
                    .about(|| format!("`{}`", kernel.name()))?;
                kernel.param_sizes()?;
                count += 1;
            }
        }
        Ok(count)
    }

    pub(crate) fn from_modules(
        host: Arc<CudaHost>,
        modules: Vec<Module>,
        compiled: Compiled,
    ) -> Self {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        Self {
            inner: Arc::new(RegistryInner {
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                modules,
                functions: FunctionTable::default(),
                call_sites: CallSiteTable::default(),
                host,
                compiled,
            }),
        }
    }

    /// The device's process-wide host.
    pub fn host(&self) -> &Arc<CudaHost> {
        &self.inner.host
    }

    /// The device's primary context.
    pub fn ctx(&self) -> &CudaContext {
        self.inner.host.context()
    }

    /// The device's process-wide stream.
    pub fn stream(&self) -> &CudaStream {
        self.inner.host.stream()
    }

    /// The raw handle of [`stream`](Self::stream).
    pub fn raw_stream(&self) -> CUstream {
        self.inner.host.stream().raw()
    }

    /// The names of the loaded modules, in load order.
    pub fn module_names(&self) -> impl ExactSizeIterator<Item = &str> {
        self.inner.modules.iter().map(Module::name)
    }

    /// Whether a module of that name is loaded.
    pub fn has_module(&self, name: &str) -> bool {
        self.inner.modules.iter().any(|m| m.name() == name)
    }

    /// What module `name` was loaded from, or `None` when there is no such module.
    pub fn module_kind(&self, name: &str) -> Option<BlobKind> {
        self.module(name).ok().map(Module::kind)
    }

    /// The raw `CUmodule` of module `name`, for driver calls Atlas does not wrap; valid while the
    /// registry lives. It is the module loaded by [`load`](Self::load), not a second load.
    pub fn raw_module(&self, name: &str) -> Result<CUmodule> {
        Ok(self.module(name)?.raw())
    }

    fn module(&self, name: &str) -> Result<&Module> {
        self.inner
            .modules
            .iter()
            .find(|m| m.name() == name)
            .ok_or_else(|| AtlasError::NotFound {
                kind: NotFoundKind::Module,
                name: name.escape_debug().to_string(),
                detail: String::new(),
                closest: closest(name, self.module_names().map(str::to_owned)),
            })
    }

    /// A handle that keeps this registry alive, to `kernel`, one of its table's entries.
    fn owning(&self, kernel: &Kernel) -> CudaFunction {
        let registry: Arc<dyn Send + Sync> = self.inner.clone();
        // SAFETY: `kernel` is an entry of this registry's function table (every caller takes it
        // from there), and `registry` is this registry's shared state.
        unsafe { CudaFunction::new(registry, kernel) }
    }

    /// Looks `function` up in `module` with `cuModuleGetFunction`, every call.
    /// The returned handle keeps the registry's modules loaded while it lives. An unknown name is
    /// [`AtlasError::NotFound`] naming `module::function`.
    ///
    /// ```no_run
    /// # fn f(registry: &atlas_registry::AtlasRegistry) -> atlas_registry::Result<()> {
    /// let scale = registry.function("elementwise", "scale")?;
    /// assert_eq!(scale.name(), "elementwise::scale");
    /// assert_eq!(scale.param_sizes()?, Some(&[8, 4, 4][..])); // float*, float, unsigned int
    /// assert!(registry.function("elementwise", "no_such_kernel").is_err());
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuModuleGetFunction")]
    pub fn function(&self, module: &str, function: &str) -> Result<CudaFunction> {
        let kernel = self.look_up_kernel(module, function)?;
        Ok(self.owning(kernel))
    }

    /// As [`function`](Self::function), looked up once per registry and then served from its
    /// function table (a hash lookup, no lock). For the hot path, see
    /// [`FunctionCache`](crate::FunctionCache).
    ///
    /// ```no_run
    /// # fn f(registry: &atlas_registry::AtlasRegistry) -> atlas_registry::Result<()> {
    /// let first = registry.function_cached("elementwise", "axpy")?; // cuModuleGetFunction
    /// let again = registry.function_cached("elementwise", "axpy")?; // no driver call
    /// assert_eq!(first.raw(), again.raw());
    /// # Ok(()) }
    /// ```
    pub fn function_cached(&self, module: &str, function: &str) -> Result<CudaFunction> {
        let kernel = self.cached_kernel(module, function)?;
        Ok(self.owning(kernel))
    }

    /// The plain handle of a cached function, for [`launch_on_stream`](Self::launch_on_stream).
    /// Valid while this registry lives.
    pub fn raw_function_cached(&self, module: &str, function: &str) -> Result<RawCudaFunc> {
        Ok(FunctionRef::new(self.cached_kernel(module, function)?).raw())
    }

    /// The kernel a plain handle names, when it is one of this registry's (`None` for a handle of
    /// another registry or made with [`RawCudaFunc::from_raw`]): so a raw handle can go wherever a
    /// function is taken.
    pub fn resolve(&self, func: RawCudaFunc) -> Option<FunctionRef<'_>> {
        // SAFETY: `&self` keeps this registry alive for the borrow.
        unsafe { func.kernel_of(self.inner.id) }.map(FunctionRef::new)
    }

    /// The registry's kernel `module::function`, looking it up in the module on first use.
    #[inline]
    pub(crate) fn cached_kernel(&self, module: &str, function: &str) -> Result<&Kernel> {
        match self.inner.functions.get(module, function) {
            Some(kernel) => Ok(kernel),
            None => self.look_up_kernel(module, function),
        }
    }

    /// `cuModuleGetFunction`, then the table's entry for it (made if it is the first lookup).
    #[cold]
    fn look_up_kernel(&self, module: &str, function: &str) -> Result<&Kernel> {
        let found = self.module(module)?;
        let symbol = self.inner.compiled.names.symbol(module, function);
        let raw = found.function(symbol)?;
        Ok(self.inner.functions.get_or_insert(module, function, || {
            let owner: Weak<RegistryInner> = Arc::downgrade(&self.inner);
            Kernel::new(
                raw,
                (module, function),
                Arc::clone(&self.inner.host),
                (self.inner.id, owner),
                found.blob_params(symbol),
            )
        }))
    }

    /// The `__device__` variable `symbol` of `module` (`cuModuleGetGlobal`): its address and size,
    /// in a value that keeps the module loaded. Errors name `module::symbol`. See
    /// [`DeviceSymbol`] for an example.
    #[doc(alias = "cuModuleGetGlobal_v2")]
    pub fn device_symbol(&self, module: &str, symbol: &str) -> Result<DeviceSymbol> {
        let (ptr, size) = self.module(module)?.global(symbol)?;
        Ok(DeviceSymbol::new(
            ptr,
            size,
            format!("{module}::{symbol}"),
            Arc::clone(&self.inner.host),
            self.inner.clone(),
        ))
    }

    /// `stream`'s raw handle, when it is of this registry's context (a raw `CUstream` is taken to
    /// be, as the caller vouches).
    #[inline]
    fn check_stream(&self, stream: impl StreamArg) -> Result<CUstream> {
        let own = self.inner.host.raw_context();
        let (raw, context) = stream.stream_in(own);
        if context == own {
            return Ok(raw);
        }
        Err(AtlasError::WrongContext {
            what: "the stream".into(),
            expected: Some(self.inner.host.ordinal()),
            given: ordinal_of(context),
        })
    }

    /// Enqueues a copy of `bytes` from host memory `src` to device address `dst` (a buffer, a
    /// [`DeviceSymbol`], any device memory of this registry's device) on `stream` (a
    /// `&CudaStream` or a raw `CUstream`: [`StreamArg`]), which may be capturing. The stream must
    /// be of this registry's context.
    ///
    /// # Safety
    ///
    /// 1. `dst .. dst + bytes` is allocated device memory of this registry's device.
    /// 2. `src` holds `bytes` readable bytes that stay alive and unmodified until the copy has
    ///    finished (synchronize the stream; for a captured copy, until the last replay has).
    /// 3. A raw `CUstream` is a live stream of this registry's context, or null (a `&CudaStream`
    ///    is checked instead).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn f(registry: &atlas_registry::AtlasRegistry) -> atlas_registry::Result<()> {
    /// let bias = registry.device_symbol("device_global", "bias")?;
    /// let value = 0.5f32;
    /// // SAFETY: `bias` is 4 bytes of this device; `value` outlives the copy (synchronized below).
    /// unsafe { registry.copy_h2d_async(bias.ptr(), (&raw const value).cast(), 4, registry.raw_stream())? };
    /// registry.stream_synchronize(registry.stream())?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuMemcpyHtoDAsync_v2")]
    pub unsafe fn copy_h2d_async(
        &self,
        dst: CUdeviceptr,
        src: *const c_void,
        bytes: usize,
        stream: impl StreamArg,
    ) -> Result<()> {
        let stream = self.check_stream(stream)?;
        // SAFETY: the caller's duties 1 and 2; the stream is of the memory's context (checked
        // above, or duty 3).
        unsafe { htod(self.ctx().raw(), dst, src, bytes, stream) }
    }

    /// Enqueues a copy of `bytes` from device address `src` to host memory `dst` on `stream` (a
    /// `&CudaStream` or a raw `CUstream`), which may be capturing. The stream must be of this
    /// registry's context.
    ///
    /// # Safety
    ///
    /// 1. `src .. src + bytes` is allocated device memory of this registry's device.
    /// 2. `dst` has room for `bytes` and stays alive, neither read nor written, until the copy has
    ///    finished.
    /// 3. A raw `CUstream` is a live stream of this registry's context, or null (a `&CudaStream`
    ///    is checked instead).
    #[doc(alias = "cuMemcpyDtoHAsync_v2")]
    pub unsafe fn copy_d2h_async(
        &self,
        dst: *mut c_void,
        src: CUdeviceptr,
        bytes: usize,
        stream: impl StreamArg,
    ) -> Result<()> {
        let stream = self.check_stream(stream)?;
        // SAFETY: the caller's duties 1 and 2; the stream is of the memory's context (checked
        // above, or duty 3).
        unsafe { dtoh(self.ctx().raw(), dst, src, bytes, stream) }
    }

    /// Waits for all work on `stream` (this registry's [`stream`](Self::stream), or any other of
    /// its context, a wrapped caller's stream included). A stream of another context is refused
    /// ([`AtlasError::WrongContext`]), as for the copies; so is synchronizing, leaving the capture
    /// intact, while Atlas captures `stream` (see [`CudaStream::synchronize`]).
    #[doc(alias = "cuStreamSynchronize")]
    pub fn stream_synchronize(&self, stream: &CudaStream) -> Result<()> {
        self.check_stream(stream)?;
        stream.synchronize()
    }

    /// Launches `func` on the caller's `stream` (a raw `CUstream`, null for the legacy default
    /// stream, or a `&CudaStream` such as [`stream`](Self::stream): [`StreamArg`]) with a raw
    /// parameter array: the lowest-overhead path. `cfg` is checked against the device's limits and,
    /// when Atlas knows the kernel's parameter layout (a handle of this registry), the number of
    /// parameters against it; the >48 KiB shared memory opt-in is made once per function and size,
    /// and then `cuLaunchKernel` is called once; nothing is allocated. Parameter sizes and types are
    /// not checked: that is what the typed launches are for.
    ///
    /// `func` is a [`RawCudaFunc`], or any other function handle (`&CudaFunction`, `FunctionRef`,
    /// `&Kernel`). A handle of another registry, or made with [`RawCudaFunc::from_raw`], is
    /// launched without any of this registry's knowledge of it: no parameter count check, and its
    /// shared memory limit read from the driver when a launch needs more than 0 bytes.
    ///
    /// Captured into a graph (a capture Atlas began), the launch leaves the graph this registry to
    /// keep (so its modules stay loaded); the arguments are raw, so the graph keeps no memory.
    ///
    /// # Safety
    ///
    /// 1. `func` is a function of a module that is still loaded in this registry's context (this
    ///    registry's own, or another live one of the same context), and a raw `stream` a live
    ///    stream created in that context, or null (a `&CudaStream` is checked instead). Captured,
    ///    a function that is not this registry's own stays loaded while any graph made from the
    ///    capture lives.
    /// 2. `params` holds one pointer per kernel parameter, in order, each to a value of exactly that
    ///    parameter's type, valid until this call returns.
    /// 3. What the kernel reads and writes through its arguments is valid, in-bounds memory of this
    ///    registry's device that stays allocated until the kernel has run (captured: at each
    ///    replay, as [`GraphExec::launch`](crate::GraphExec::launch) asks).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn f(registry: &atlas_registry::AtlasRegistry, x: &mut atlas_registry::DeviceBuffer<f32>) -> atlas_registry::Result<()> {
    /// use std::ffi::c_void;
    /// use atlas_registry::LaunchConfig;
    /// let scale = registry.raw_function_cached("elementwise", "scale")?; // scale(float*, float, unsigned)
    /// let (mut ptr, mut factor, mut n) = (x.device_ptr(), 2.0f32, x.len() as u32);
    /// let mut params: [*mut c_void; 3] =
    ///     [(&raw mut ptr).cast(), (&raw mut factor).cast(), (&raw mut n).cast()];
    /// let cfg = LaunchConfig::for_elements(n, 256);
    /// // SAFETY: a function of this registry; the array points to a device pointer, a float and a
    /// // u32, `scale`'s parameters; `x` holds `n` floats and outlives the launch (synchronized).
    /// unsafe { registry.launch_on_stream(scale, &cfg, registry.raw_stream(), &mut params)? };
    /// // SAFETY: as above, on the same stream as a `&CudaStream`.
    /// unsafe { registry.launch_on_stream(scale, &cfg, registry.stream(), &mut params)? };
    /// registry.stream().synchronize()?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuLaunchKernel")]
    #[inline]
    pub unsafe fn launch_on_stream(
        &self,
        func: impl Into<RawCudaFunc>,
        cfg: &LaunchConfig,
        stream: impl StreamArg,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let stream = self.check_stream(stream)?;
        let func: RawCudaFunc = func.into();
        let host = &*self.inner.host;
        let count = params.len();
        let params = if params.is_empty() {
            std::ptr::null_mut()
        } else {
            params.as_mut_ptr()
        };
        // SAFETY: `&self` keeps this registry alive for the call.
        let Some(kernel) = (unsafe { func.kernel_of(self.inner.id) }) else {
            // No kernel of ours to remember the opt-in in: a fresh one on the stack, nothing
            // allocated.
            let opt_in = SharedMemOptIn::default();
            let name = UnknownFunction(func.raw());
            check_config(host, &name, cfg)?;
            // SAFETY: the caller's duty 1: a live function of this registry's context.
            unsafe { opt_in.ensure(host, func.raw(), cfg.shared_mem_bytes) }?;
            return held::enqueue(stream, false, self.gather(), |captured| {
                let params = Params {
                    array: params,
                    count,
                    captured,
                    known: Known::Nothing,
                };
                // SAFETY: the caller's duties 1–3; the configuration fits the device and the
                // opt-in is made (above); no sizes are claimed.
                unsafe { launch_kernel(host, func.raw(), &name, cfg, stream, params) }
            });
        };
        check_config(host, kernel, cfg)?;
        kernel.check_param_count(count)?;
        // SAFETY: the kernel is this registry's, so a live function of its context.
        unsafe {
            kernel
                .opt_in()
                .ensure(host, kernel.raw(), cfg.shared_mem_bytes)
        }?;
        held::enqueue(stream, false, self.gather(), |captured| {
            let params = Params {
                array: params,
                count,
                captured,
                known: kernel.known_layout(),
            };
            // SAFETY: the caller's duties 1–3 (duty 2: each pointer leads to a value of its
            // parameter's type, so of the size the kernel's layout gives, whose count the check
            // above matched); the configuration fits the device, the parameter count matches the
            // kernel's where Atlas knows it, and the opt-in is made (above).
            unsafe { launch_kernel(host, kernel.raw(), kernel, cfg, stream, params) }
        })
    }

    /// What a graph that captures a raw launch through this registry keeps: the registry.
    #[inline(always)]
    fn gather(&self) -> impl Fn(&mut GraphHolds) + '_ {
        |holds| holds.registry_of(&self.inner)
    }
}

impl AtlasRegistry {
    /// As [`launch_on_stream`](Self::launch_on_stream), with launch attributes: the same checks,
    /// then the attributes' own against the device and the kernel (see [`LaunchAttributes`];
    /// refused with [`AtlasError::InvalidLaunch`] before the driver), then one `cuLaunchKernelEx`
    /// with the attribute array on the stack; nothing is allocated.
    ///
    /// A handle of another registry, or made with [`RawCudaFunc::from_raw`], has its cluster
    /// dimensions and occupancy read from the driver at each launch that needs them. Captured, as
    /// [`launch_on_stream`](Self::launch_on_stream).
    ///
    /// # Safety
    ///
    /// 1. `func` is a function of a module that is still loaded in this registry's context (this
    ///    registry's own, or another live one of the same context), and a raw `stream` a live
    ///    stream created in that context, or null (a `&CudaStream` is checked instead). Captured,
    ///    a function that is not this registry's own stays loaded while any graph made from the
    ///    capture lives.
    /// 2. `params` holds one pointer per kernel parameter, in order, each to a value of exactly that
    ///    parameter's type, valid until this call returns.
    /// 3. What the kernel reads and writes through its arguments is valid, in-bounds memory of this
    ///    registry's device that stays allocated until the kernel has run (captured: at each
    ///    replay, as [`GraphExec::launch`](crate::GraphExec::launch) asks).
    #[doc(alias = "cuLaunchKernelEx")]
    #[inline]
    pub unsafe fn launch_on_stream_with(
        &self,
        func: impl Into<RawCudaFunc>,
        cfg: &LaunchConfig,
        attrs: &LaunchAttributes,
        stream: impl StreamArg,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let stream = self.check_stream(stream)?;
        let func: RawCudaFunc = func.into();
        let host = &*self.inner.host;
        let count = params.len();
        let params = if params.is_empty() {
            std::ptr::null_mut()
        } else {
            params.as_mut_ptr()
        };
        // SAFETY: `&self` keeps this registry alive for the call.
        let Some(kernel) = (unsafe { func.kernel_of(self.inner.id) }) else {
            // No kernel of ours to remember anything in: fresh state on the stack, nothing
            // allocated.
            let (opt_in, facts) = (SharedMemOptIn::default(), LaunchFacts::default());
            let name = UnknownFunction(func.raw());
            check_config(host, &name, cfg)?;
            // The opt-in first: the co-residency of a cooperative grid is read after it, since
            // the driver counts no block of more than the function may use.
            // SAFETY: the caller's duty 1: a live function of this registry's context.
            unsafe { opt_in.ensure(host, func.raw(), cfg.shared_mem_bytes) }?;
            // SAFETY: the function is live and of this context (the caller's duty 1).
            unsafe { attrs.check(host, func.raw(), &facts, &name, cfg) }?;
            return held::enqueue(stream, attrs.constrains_grid(), self.gather(), |captured| {
                let params = Params {
                    array: params,
                    count,
                    captured,
                    known: Known::Nothing,
                };
                // SAFETY: the caller's duties 1–3; the configuration fits the device, the
                // attributes passed their check and the opt-in is made (above); an event among
                // them is live in this context (`LaunchAttributes::programmatic_event`'s duty);
                // no sizes are claimed.
                unsafe { launch_kernel_ex(host, func.raw(), &name, cfg, attrs, stream, params) }
            });
        };
        check_config(host, kernel, cfg)?;
        kernel.check_param_count(count)?;
        // The opt-in before the attributes' check, as above.
        // SAFETY: the kernel is this registry's, so a live function of its context.
        unsafe {
            kernel
                .opt_in()
                .ensure(host, kernel.raw(), cfg.shared_mem_bytes)
        }?;
        // SAFETY: the function is this registry's, live and of its context.
        unsafe { attrs.check(host, kernel.raw(), kernel.facts(), kernel, cfg) }?;
        held::enqueue(stream, attrs.constrains_grid(), self.gather(), |captured| {
            let params = Params {
                array: params,
                count,
                captured,
                known: kernel.known_layout(),
            };
            // The configuration fits the device, the parameter count matches the kernel's where
            // Atlas knows it (and the sizes are that layout's), the attributes passed their check
            // and the opt-in is made (above).
            // SAFETY: as just said, with the caller's duties 1–3 (an event among the attributes
            // is live in this context: `programmatic_event`'s duty).
            unsafe { launch_kernel_ex(host, kernel.raw(), kernel, cfg, attrs, stream, params) }
        })
    }
}

impl fmt::Debug for AtlasRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AtlasRegistry")
            .field("device", &self.inner.host.ordinal())
            .field("modules", &self.module_names().collect::<Vec<_>>())
            .finish()
    }
}

/// Unloads the registry's modules now and returns what went wrong, as a value.
///
/// While other handles exist (clones of the registry, [`CudaFunction`]s or [`DeviceSymbol`]s taken
/// from it, graphs that launch its kernels: [`CudaGraph`](crate::CudaGraph)s and
/// [`GraphExec`](crate::GraphExec)s), nothing is unloaded and the result is
/// [`AtlasError::InUse`] with their count; the modules are unloaded when the last of them goes.
/// Teardown no-ops are not errors; other unload failures come back together in
/// [`AtlasError::Release`].
pub fn release(registry: AtlasRegistry) -> Result<()> {
    let inner = Arc::try_unwrap(registry.inner).map_err(|shared| AtlasError::InUse {
        what: format!(
            "the registry of modules {:?}",
            shared.modules.iter().map(Module::name).collect::<Vec<_>>()
        ),
        handles: Arc::strong_count(&shared) - 1,
    })?;
    let failures = unload_all(inner.modules);
    if failures.is_empty() {
        Ok(())
    } else {
        Err(AtlasError::Release(failures))
    }
}
