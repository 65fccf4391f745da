//! A loaded module: one `cuModuleLoadData` per blob (a failed load is retried once with a JIT log,
//! see [`jit`](crate::code::jit)), unloaded exactly once.

use std::ffi::CString;
use std::sync::Arc;

use atlas_sys::{CUcontext, CUdeviceptr, CUfunction, CUmodule, CUresult};

use crate::code::blob::BlobKind;
use crate::code::jit::with_jit_log;
use crate::code::layout::{DeviceLayouts, device_layouts};
use crate::code::target::Devices;
use crate::device::context::ensure_bound;
use crate::device::host::CudaHost;
use crate::driver::status::is_teardown_noop;
use crate::driver::{About, calls};
use crate::error::{AtlasError, NotFoundKind, Result, report_cleanup};

/// A kernel's parameter sizes in bytes, or why nothing can tell them.
pub(crate) type ParamSizes = std::result::Result<Box<[usize]>, String>;

/// The blob's kernel layouts on a device of `compute_capability`, read at load: the layouts
/// themselves when the driver cannot tell them (no `cuFuncGetParamInfo`: older than CUDA 12.4, or
/// an injection library), and otherwise each kernel's parameter count, so that the driver is asked
/// about those parameters and not one past the last (a call that fails, which compute-sanitizer
/// reports as an error).
///
/// A fatbin's layouts are those of the entries the driver may load for the device (see
/// [`device_layouts`]): a kernel on which they disagree has none.
pub(crate) fn blob_layouts(blob: &[u8], compute_capability: (u32, u32)) -> Arc<DeviceLayouts> {
    let devices = Devices::of(compute_capability).unwrap_or(Devices::Every);
    Arc::new(device_layouts(blob, devices))
}

/// One module loaded in a context. Unloaded by [`unload_all`] or, silently, on drop.
pub(crate) struct Module {
    raw: CUmodule,
    name: String,
    kind: BlobKind,
    context: CUcontext,
    /// The library this module is a view of, which owns it (kept alive, never unloaded here);
    /// `None` for a module loaded alone.
    library: Option<Arc<dyn Send + Sync>>,
    /// The kernels' parameter layouts as the blob declares them for this module's device, read at
    /// load.
    blob_layouts: Arc<DeviceLayouts>,
}

// SAFETY: a CUmodule is a driver handle usable from any thread; the module is unloaded only
// through ownership (unload_all) or drop, never while shared.
unsafe impl Send for Module {}
// SAFETY: shared references only look names up in the module, which the driver allows concurrently.
unsafe impl Sync for Module {}

/// Loads each checked `(name, kind, image)` in `host`'s context: the context is made current once,
/// then one `cuModuleLoadData` per blob. Modules loaded before a failure are unloaded again.
pub(crate) fn load_all<'a>(
    host: &CudaHost,
    blobs: impl ExactSizeIterator<Item = (&'a str, BlobKind, &'a [u8])>,
) -> Result<Vec<Module>> {
    let context = host.context().raw();
    ensure_bound(context)?;
    let mut modules = Vec::with_capacity(blobs.len());
    for (name, kind, image) in blobs {
        // SAFETY: `image` passed validation (PTX NUL-terminated); the context is current (above,
        // and nothing between the loads changes it).
        let raw = with_jit_log(name, image, Some(host), |log| unsafe {
            calls::module_load(image, log)
        })?;
        modules.push(Module {
            raw,
            name: name.to_string(),
            kind,
            context,
            library: None,
            blob_layouts: blob_layouts(image, host.compute_capability()),
        });
    }
    Ok(modules)
}

/// Unloads `modules` now (making their context current once) and returns each failure; teardown
/// no-ops are not failures.
pub(crate) fn unload_all(modules: Vec<Module>) -> Vec<AtlasError> {
    let mut bound = None;
    let mut failures = Vec::new();
    for mut module in modules {
        if bound != Some(module.context) {
            match ensure_bound(module.context) {
                Ok(()) => bound = Some(module.context),
                Err(e) => {
                    failures.push(e);
                    continue;
                }
            }
        }
        if let Err(e) = module.unload_bound() {
            failures.push(e);
        }
    }
    failures
}

impl Module {
    /// A view of a library's module `raw` in `context`, which `library` owns: never unloaded by
    /// itself; the library goes when its last view does.
    pub(crate) fn library_view(
        raw: CUmodule,
        name: &str,
        kind: BlobKind,
        context: CUcontext,
        blob_layouts: Arc<DeviceLayouts>,
        library: Arc<dyn Send + Sync>,
    ) -> Self {
        Self {
            raw,
            name: name.to_string(),
            kind,
            context,
            blob_layouts,
            library: Some(library),
        }
    }

    /// The module's name in its model.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// What the module was loaded from.
    pub(crate) fn kind(&self) -> BlobKind {
        self.kind
    }

    /// The raw handle.
    pub(crate) fn raw(&self) -> CUmodule {
        self.raw
    }

    /// `cuModuleGetFunction`; an unknown name is [`AtlasError::NotFound`] naming `module::name`.
    pub(crate) fn function(&self, name: &str) -> Result<CUfunction> {
        let c_name = self.c_name(name, NotFoundKind::Function)?;
        ensure_bound(self.context)?;
        // SAFETY: the module is loaded (not yet unloaded: &self); its context is current (above).
        unsafe { calls::module_function(self.raw, &c_name) }
            .map_err(|e| self.not_found(e, name, NotFoundKind::Function))
    }

    /// The symbol names of every function of the module, as the driver lists them
    /// (`cuModuleEnumerateFunctions`, `cuFuncGetName`: CUDA 12.4+).
    pub(crate) fn function_names(&self) -> Result<Vec<String>> {
        ensure_bound(self.context)?;
        let about = || format!("module `{}`", self.name);
        // SAFETY: the module is loaded (&self); its context is current (above).
        let functions = unsafe { calls::module_functions(self.raw) }.about(about)?;
        functions
            .into_iter()
            // SAFETY: each function is one the driver just listed of this live module.
            .map(|f| Ok(unsafe { calls::function_name(f) }.about(about)?))
            .collect()
    }

    /// The parameter sizes of kernel `function` as the blob declares them, or why they cannot be
    /// known (worded for a driver without `cuFuncGetParamInfo`, the only one it is shown for).
    pub(crate) fn blob_param_sizes(&self, function: &str) -> ParamSizes {
        match &*self.blob_layouts {
            Ok(kernels) => match kernels.get(function) {
                Some(Ok(kernel)) => Ok(kernel.sizes().collect()),
                Some(Err(why)) => Err(format!(
                    "the driver lacks cuFuncGetParamInfo and the parameter layout of `{function}` \
                     in module `{}` cannot be known from its blob: {why}",
                    self.name
                )),
                None => Err(format!(
                    "the driver lacks cuFuncGetParamInfo and module `{}` declares no parameter layout for `{function}`",
                    self.name
                )),
            },
            Err(why) => Err(format!(
                "the driver lacks cuFuncGetParamInfo and the parameter layouts of module `{}` cannot be read from its blob: {why}",
                self.name
            )),
        }
    }

    /// `cuModuleGetGlobal`: the address and size of a `__device__` variable.
    pub(crate) fn global(&self, name: &str) -> Result<(CUdeviceptr, usize)> {
        let c_name = self.c_name(name, NotFoundKind::Symbol)?;
        ensure_bound(self.context)?;
        // SAFETY: as for `function`.
        unsafe { calls::module_global(self.raw, &c_name) }
            .map_err(|e| self.not_found(e, name, NotFoundKind::Symbol))
    }

    fn c_name(&self, name: &str, kind: NotFoundKind) -> Result<CString> {
        CString::new(name).map_err(|_| AtlasError::NotFound {
            kind,
            name: format!("{}::{}", self.name, name.escape_debug()),
            detail: "the name contains a NUL byte".into(),
        })
    }

    #[cold]
    fn not_found(&self, e: crate::driver::Error, name: &str, kind: NotFoundKind) -> AtlasError {
        if e.code() == Some(CUresult::CUDA_ERROR_NOT_FOUND.0) {
            AtlasError::NotFound {
                kind,
                name: format!("{}::{name}", self.name),
                detail: String::new(),
            }
        } else {
            e.about(|| format!("`{}::{name}`", self.name)).into()
        }
    }

    /// Unloads the module now, its context being current; teardown no-ops are `Ok`.
    fn unload_bound(&mut self) -> Result<()> {
        let raw = std::mem::replace(&mut self.raw, std::ptr::null_mut());
        if raw.is_null() || self.library.is_some() {
            return Ok(());
        }
        // SAFETY: `raw` was loaded by this value and, replaced by null above, is unloaded only
        // once; the caller made its context current.
        match unsafe { calls::module_unload(raw) }.about(|| format!("module `{}`", self.name)) {
            Err(e) if e.code().is_some_and(is_teardown_noop) => Ok(()),
            other => Ok(other?),
        }
    }
}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Module")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("from_library", &self.library.is_some())
            .finish()
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        if self.raw.is_null() || self.library.is_some() {
            return;
        }
        let result = ensure_bound(self.context).and_then(|()| self.unload_bound());
        report_cleanup("unloading a module", result);
    }
}
