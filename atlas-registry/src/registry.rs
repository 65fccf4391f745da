//! [`AtlasRegistry`]: one model's loaded modules, its function handles and caches, and
//! [`release`].

use std::borrow::Cow;
use std::ffi::c_void;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use atlas_sys::{CUdeviceptr, CUstream};

use crate::blob::{self, BlobKind};
use crate::cache::CallSiteTable;
use crate::context::CudaContext;
use crate::error::{AtlasError, NotFoundKind, Result};
use crate::function::{CudaFunction, FunctionEntry, RawCudaFunc};
use crate::function_table::FunctionTable;
use crate::host::{CudaHost, host};
use crate::launch::{
    FunctionName, LaunchConfig, SharedMemOptIn, UnknownFunction, check_config, launch_kernel,
};
use crate::memory::{DeviceBuffer, DeviceCopy, dtoh, htod};
use crate::module::Module;
use crate::stream::CudaStream;

/// The shared state behind an [`AtlasRegistry`] and the [`CudaFunction`]s handed out from it.
pub(crate) struct RegistryInner {
    /// Unique in the process (never 0): what a [`RawCudaFunc`] remembers of its registry.
    pub(crate) id: u64,
    modules: Vec<Module>,
    /// The functions looked up so far. Entries are never removed while the registry lives, so
    /// pointers to them stay valid that long.
    functions: FunctionTable,
    pub(crate) call_sites: CallSiteTable,
    pub(crate) host: Arc<CudaHost>,
}

/// One model's set of loaded modules on one device, with its function handles and caches.
///
/// Cloning is cheap (an `Arc`); the modules are unloaded when the last clone and the last
/// [`CudaFunction`] taken from it are gone, or at once by [`release`]. There is no global
/// registry: each model holds its own, and two registries never share functions.
#[derive(Clone)]
pub struct AtlasRegistry {
    pub(crate) inner: Arc<RegistryInner>,
}

/// A `__device__` variable of a loaded module: its address and size.
#[derive(Debug, Clone, Copy)]
pub struct DeviceSymbol<'r> {
    registry: &'r AtlasRegistry,
    ptr: CUdeviceptr,
    size: usize,
}

impl AtlasRegistry {
    /// Loads a model: each `(module name, blob)` once, on device `ordinal` (its process-wide
    /// [`CudaHost`] is created if needed).
    ///
    /// PTX (UTF-8 text) is passed NUL-terminated and JIT-compiled by the driver; ELF cubins,
    /// fatbins and clang offload bundles, and anything else that is not UTF-8, are passed as
    /// binaries. An empty blob, PTX with a NUL inside, a malformed ELF or fatbin header, or a
    /// duplicate module name is an [`AtlasError::InvalidModule`] naming the module; a JIT failure
    /// is an [`AtlasError::ModuleLoad`] carrying the JIT log. Modules loaded before a failure are
    /// unloaded again.
    #[doc(alias = "cuModuleLoadData")]
    #[doc(alias = "cuModuleLoadDataEx")]
    pub fn load(ordinal: usize, blobs: &[(&str, &[u8])]) -> Result<Self> {
        let prepared = Self::prepare_all(blobs)?;
        let host = host(ordinal)?;
        let modules = blobs
            .iter()
            .zip(&prepared)
            .map(|((name, _), (kind, image))| Module::load(&host, name, *kind, image))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self::from_modules(host, modules))
    }

    /// Checks a model's names and blobs before the driver is loaded (so a bad blob is reported the
    /// same on a machine without a GPU) and returns each blob's kind and the bytes to hand over.
    pub(crate) fn prepare_all<'b>(
        blobs: &[(&str, &'b [u8])],
    ) -> Result<Vec<(BlobKind, Cow<'b, [u8]>)>> {
        Self::check_unique(blobs)?;
        blobs
            .iter()
            .map(|(name, blob)| blob::prepare(name, blob))
            .collect()
    }

    /// An error naming the first module name that appears twice.
    fn check_unique(blobs: &[(&str, &[u8])]) -> Result<()> {
        for (i, (name, _)) in blobs.iter().enumerate() {
            if blobs[..i].iter().any(|(earlier, _)| earlier == name) {
                return Err(AtlasError::InvalidModule {
                    module: name.escape_debug().to_string(),
                    reason: "the model names this module twice".into(),
                });
            }
        }
        Ok(())
    }

    pub(crate) fn from_modules(host: Arc<CudaHost>, modules: Vec<Module>) -> Self {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        Self {
            inner: Arc::new(RegistryInner {
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                modules,
                functions: FunctionTable::default(),
                call_sites: CallSiteTable::default(),
                host,
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
        self.inner
            .modules
            .iter()
            .find(|m| m.name() == name)
            .map(Module::kind)
    }

    /// The raw `CUmodule` of module `name`, for driver calls Atlas does not wrap; valid while the
    /// registry lives. It is the module loaded by [`load`](Self::load), not a second load.
    pub fn raw_module(&self, name: &str) -> Result<atlas_sys::CUmodule> {
        Ok(self.module(name)?.1.raw())
    }

    fn module(&self, name: &str) -> Result<(usize, &Module)> {
        self.inner
            .modules
            .iter()
            .enumerate()
            .find(|(_, m)| m.name() == name)
            .ok_or_else(|| {
                let loaded: Vec<_> = self.module_names().collect();
                AtlasError::NotFound {
                    kind: NotFoundKind::Module,
                    name: name.escape_debug().to_string(),
                    detail: format!("the registry has {loaded:?}"),
                }
            })
    }

    /// Looks `function` up in `module` with `cuModuleGetFunction`, every call.
    /// The returned handle keeps the registry's modules loaded while it lives.
    #[doc(alias = "cuModuleGetFunction")]
    pub fn function(&self, module: &str, function: &str) -> Result<CudaFunction> {
        let found = self.module(module)?.1;
        let raw = found.function(function)?;
        let entry = self.inner.functions.get_or_insert(module, function, || {
            FunctionEntry::new(raw, module, function, found.blob_param_sizes(function))
        });
        Ok(CudaFunction::new(Arc::clone(&self.inner), entry))
    }

    /// As [`function`](Self::function), looked up once per registry and then served from its cache
    /// (a hash lookup, no lock). For the hot path, see [`FunctionCache`](crate::FunctionCache).
    pub fn function_cached(&self, module: &str, function: &str) -> Result<CudaFunction> {
        let entry = self.cached_entry(module, function)?;
        Ok(CudaFunction::new(Arc::clone(&self.inner), entry))
    }

    /// The plain handle of a cached function, for [`launch_on_stream`](Self::launch_on_stream).
    /// Valid while this registry lives.
    pub fn raw_function_cached(&self, module: &str, function: &str) -> Result<RawCudaFunc> {
        let entry = self.cached_entry(module, function)?;
        Ok(RawCudaFunc::from_entry(entry, self.inner.id))
    }

    /// The registry's entry for `module::function`, looking it up in the module on first use.
    #[inline]
    pub(crate) fn cached_entry(&self, module: &str, function: &str) -> Result<&FunctionEntry> {
        match self.inner.functions.get(module, function) {
            Some(entry) => Ok(entry),
            None => self.look_up_entry(module, function),
        }
    }

    #[cold]
    fn look_up_entry(&self, module: &str, function: &str) -> Result<&FunctionEntry> {
        let found = self.module(module)?.1;
        let raw = found.function(function)?;
        Ok(self.inner.functions.get_or_insert(module, function, || {
            FunctionEntry::new(raw, module, function, found.blob_param_sizes(function))
        }))
    }

    /// The address and size of the `__device__` variable `symbol` of `module`
    /// (`cuModuleGetGlobal`). Errors name `module::symbol`.
    #[doc(alias = "cuModuleGetGlobal_v2")]
    pub fn device_symbol(&self, module: &str, symbol: &str) -> Result<DeviceSymbol<'_>> {
        let (ptr, size) = self.module(module)?.1.global(symbol)?;
        Ok(DeviceSymbol {
            registry: self,
            ptr,
            size,
        })
    }

    /// Enqueues a copy of `src` into `dst` on the registry's stream.
    ///
    /// # Safety
    ///
    /// As [`DeviceBuffer::copy_from_async`]: `src` stays alive and unmodified until the copy is done.
    pub unsafe fn copy_h2d_async<T: DeviceCopy>(
        &self,
        dst: &mut DeviceBuffer<T>,
        src: &[T],
    ) -> Result<()> {
        // SAFETY: the caller's contract is copy_from_async's.
        unsafe { dst.copy_from_async(self.stream(), src) }
    }

    /// Enqueues a copy of `src` into `dst` on the registry's stream.
    ///
    /// # Safety
    ///
    /// As [`DeviceBuffer::copy_to_async`]: `dst` stays alive and untouched until the copy is done.
    pub unsafe fn copy_d2h_async<T: DeviceCopy>(
        &self,
        src: &DeviceBuffer<T>,
        dst: &mut [T],
    ) -> Result<()> {
        // SAFETY: the caller's contract is copy_to_async's.
        unsafe { src.copy_to_async(self.stream(), dst) }
    }

    /// Waits for all work on the registry's stream.
    #[doc(alias = "cuStreamSynchronize")]
    pub fn stream_synchronize(&self) -> Result<()> {
        self.stream().synchronize()
    }

    /// Launches `func` on the caller's raw `stream` (null: the legacy default stream) with a raw
    /// parameter array: the lowest-overhead path. `cfg` is checked against the device's limits and,
    /// when Atlas knows the kernel's parameter layout (a handle of this registry), the number of
    /// parameters against it; the >48 KiB shared memory opt-in is made once per function and size,
    /// and then `cuLaunchKernel` is called once; nothing is allocated. Parameter sizes and types are
    /// not checked: that is what the typed launches are for.
    ///
    /// A handle of another registry, or made with [`RawCudaFunc::from_raw`], is launched without
    /// any of this registry's knowledge of it: no parameter count check, and its shared memory limit
    /// read from the driver when a launch needs more than 0 bytes.
    ///
    /// # Safety
    ///
    /// 1. `func` is a function of a module that is still loaded in this registry's context (this
    ///    registry's own, or another live one of the same context), and `stream` a live stream
    ///    created in that context, or null.
    /// 2. `params` holds one pointer per kernel parameter, in order, each to a value of exactly that
    ///    parameter's type, valid until this call returns.
    /// 3. What the kernel reads and writes through its arguments is valid, in-bounds memory of this
    ///    registry's device that stays allocated until the kernel has run.
    #[doc(alias = "cuLaunchKernel")]
    #[inline]
    pub unsafe fn launch_on_stream(
        &self,
        func: RawCudaFunc,
        cfg: &LaunchConfig,
        stream: CUstream,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let host = &*self.inner.host;
        let count = params.len();
        let params = if params.is_empty() {
            std::ptr::null_mut()
        } else {
            params.as_mut_ptr()
        };
        if func.registry != self.inner.id || func.entry.is_null() {
            // No entry of ours to remember the opt-in in: a fresh one on the stack, nothing
            // allocated.
            let opt_in = SharedMemOptIn::default();
            let name = UnknownFunction(func.raw());
            check_config(host, &name, cfg)?;
            // SAFETY: the caller's duties 1–3; the configuration fits the device (above).
            return unsafe { launch_kernel(host, func.raw(), &opt_in, &name, cfg, stream, params) };
        }
        // SAFETY: the handle carries this registry's id, so its entry is one of this registry's
        // function table, whose entries live as long as the registry, which `&self` keeps alive.
        let entry = unsafe { &*func.entry };
        check_config(host, entry, cfg)?;
        if let Ok(sizes) = entry.param_sizes(host)?
            && sizes.len() != count
        {
            return Err(param_count_refused(entry, sizes.len(), count));
        }
        // SAFETY: the caller's duties 1–3; the configuration fits the device and the parameter
        // count matches the kernel's, where Atlas knows it (above).
        unsafe {
            launch_kernel(
                host,
                func.raw(),
                &entry.opt_in,
                entry as &dyn FunctionName,
                cfg,
                stream,
                params,
            )
        }
    }
}

#[cold]
fn param_count_refused(entry: &FunctionEntry, expected: usize, given: usize) -> AtlasError {
    AtlasError::InvalidLaunch {
        function: entry.name.clone(),
        reason: format!(
            "the kernel takes {expected} parameter(s); the raw launch gives {given} pointer(s)"
        ),
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

impl DeviceSymbol<'_> {
    /// The variable's device address.
    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// The variable's size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Writes `value` into the variable on the registry's stream and waits for the copy. The
    /// bytes must fill the variable exactly.
    pub fn write<T: DeviceCopy>(&self, value: &[T]) -> Result<()> {
        self.check_size("writing a device symbol", size_of_val(value))?;
        let stream = self.registry.stream();
        // SAFETY: the sizes match; the stream is synchronized before `value` is released.
        unsafe {
            htod(
                stream.context(),
                self.ptr,
                value.as_ptr().cast(),
                self.size,
                stream.raw(),
            )
        }?;
        stream.synchronize()
    }

    /// Reads the variable into `out` after the registry's stream's earlier work.
    pub fn read<T: DeviceCopy>(&self, out: &mut [T]) -> Result<()> {
        self.check_size("reading a device symbol", size_of_val(out))?;
        let stream = self.registry.stream();
        // SAFETY: the sizes match; the stream is synchronized before `out` is released.
        unsafe {
            dtoh(
                stream.context(),
                out.as_mut_ptr().cast(),
                self.ptr,
                self.size,
                stream.raw(),
            )
        }?;
        stream.synchronize()
    }

    fn check_size(&self, what: &str, given: usize) -> Result<()> {
        if given == self.size {
            Ok(())
        } else {
            Err(AtlasError::SizeMismatch {
                what: what.into(),
                expected: self.size,
                given,
            })
        }
    }
}

/// Unloads the registry's modules now and returns what went wrong, as a value.
///
/// While other handles exist (clones of the registry, [`CudaFunction`]s taken from it), nothing is
/// unloaded and the result is [`AtlasError::InUse`] with their count. Teardown no-ops are not
/// errors; other unload failures come back together in [`AtlasError::Release`].
#[doc(alias = "cuModuleUnload")]
pub fn release(registry: AtlasRegistry) -> Result<()> {
    let inner = Arc::try_unwrap(registry.inner).map_err(|shared| AtlasError::InUse {
        what: format!(
            "the registry of modules {:?}",
            shared.modules.iter().map(Module::name).collect::<Vec<_>>()
        ),
        handles: Arc::strong_count(&shared) - 1,
    })?;
    let RegistryInner { modules, .. } = inner;
    let failures: Vec<_> = modules
        .into_iter()
        .filter_map(|m| m.unload().err())
        .collect();
    if failures.is_empty() {
        Ok(())
    } else {
        Err(AtlasError::Release(failures))
    }
}
