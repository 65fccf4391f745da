//! A loaded module: one `cuModuleLoadData` per blob (a failed load is retried once with
//! `cuModuleLoadDataEx` and a JIT log buffer), unloaded exactly once.

use std::ffi::{CString, c_void};
use std::sync::Arc;

use atlas_sys::{CUdeviceptr, CUfunction, CUjit_option, CUmodule, CUresult};

use crate::blob::{BlobKind, code_targets, plain_code};
use crate::context::ensure_bound;
use crate::driver::{cu, driver};
use crate::error::{AtlasError, NotFoundKind, Result, cuda_error_text, is_sticky, report_cleanup};
use crate::function::ParamSizes;
use crate::host::CudaHost;
use crate::library::LibraryBlob;
use crate::param_layout::{KernelLayout, kernel_layouts};

/// Size of the JIT error log buffer handed to the driver.
const JIT_LOG_BYTES: usize = 16 * 1024;

/// One module loaded in a context. Unloaded by [`Module::unload`] or, silently, on drop.
#[derive(Debug)]
pub(crate) struct Module {
    raw: CUmodule,
    name: String,
    kind: BlobKind,
    context: atlas_sys::CUcontext,
    /// The library this module is a view of, which owns it; `None` for a module loaded alone.
    library: Option<Arc<LibraryBlob>>,
    /// The kernels' parameter layouts as the blob declares them, read at load only when the driver
    /// lacks `cuFuncGetParamInfo`.
    blob_layouts: Option<Arc<BlobLayouts>>,
}

/// Every kernel's parameter layout as a blob declares it, or why it cannot be read.
pub(crate) type BlobLayouts = std::result::Result<Vec<KernelLayout>, String>;

/// The blob's kernel layouts when the driver cannot tell them (no `cuFuncGetParamInfo`: older than
/// CUDA 12.4, or an injection library); `None` when it can, so that nothing is parsed.
///
/// A fatbin's layouts come from the first of its uncompressed entries (PTX or cubin) that can be
/// read: every entry is the same source compiled for another architecture.
pub(crate) fn layouts_if_needed(blob: &[u8]) -> Option<Arc<BlobLayouts>> {
    let d = driver().ok()?;
    if atlas_sys::entry!(d.cuda, cuFuncGetParamInfo).is_ok() {
        return None;
    }
    let mut first_error = None;
    for code in plain_code(blob) {
        match kernel_layouts(code) {
            Ok(layouts) => return Some(Arc::new(Ok(layouts))),
            Err(e) => {
                first_error.get_or_insert(e.to_string());
            }
        }
    }
    let why = first_error.unwrap_or_else(|| "it holds no uncompressed PTX or cubin".into());
    Some(Arc::new(Err(why)))
}

// SAFETY: a CUmodule is a driver handle usable from any thread; the module is unloaded only
// through `&mut self` (unload) or drop, never while shared.
unsafe impl Send for Module {}
// SAFETY: shared references only look names up in the module, which the driver allows concurrently.
unsafe impl Sync for Module {}

impl Module {
    /// Loads `blob` as module `name` in `context`. PTX failures carry the JIT error log.
    pub(crate) fn load(host: &CudaHost, name: &str, kind: BlobKind, image: &[u8]) -> Result<Self> {
        let cuda = driver()?.cuda;
        let (load, load_ex) = (
            atlas_sys::entry!(cuda, cuModuleLoadData)?,
            atlas_sys::entry!(cuda, cuModuleLoadDataEx)?,
        );
        let context = host.context();
        context.bind()?;
        let mut raw: CUmodule = std::ptr::null_mut();
        with_jit_log(
            "cuModuleLoadData",
            name,
            image,
            Some(host),
            &mut |image, count, options, values| {
                // SAFETY: `image` is a checked blob (PTX NUL-terminated); the options and their values
                // are matching arrays of `count`; the context is current.
                unsafe {
                    if count == 0 {
                        load(&mut raw, image)
                    } else {
                        load_ex(&mut raw, image, count, options, values)
                    }
                }
            },
        )?;
        Ok(Self {
            raw,
            name: name.to_string(),
            kind,
            context: context.raw(),
            library: None,
            blob_layouts: layouts_if_needed(image),
        })
    }

    /// The module of `library` in `context` (`cuLibraryGetModule`): a view of the one library
    /// load, never unloaded by itself; the library goes when its last view does.
    pub(crate) fn from_library(
        host: &CudaHost,
        name: &str,
        library: Arc<LibraryBlob>,
    ) -> Result<Self> {
        let context = host.context();
        context.bind()?;
        let get_module = atlas_sys::entry!(driver()?.cuda, cuLibraryGetModule)?;
        let mut raw: CUmodule = std::ptr::null_mut();
        // SAFETY: the library is loaded (the Arc keeps it), `raw` a live out-pointer, context current.
        let status = unsafe { get_module(&mut raw, library.raw()) };
        if status != CUresult::CUDA_SUCCESS {
            return Err(library.explain(host, name, status));
        }
        Ok(Self {
            raw,
            name: name.to_string(),
            kind: library.kind(),
            context: context.raw(),
            blob_layouts: library.blob_layouts(),
            library: Some(library),
        })
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
        let mut func: CUfunction = std::ptr::null_mut();
        // SAFETY: the module is loaded (not yet unloaded: &self), `func` a live out-pointer.
        let result = unsafe {
            cu!(cuModuleGetFunction(&mut func, self.raw, c_name.as_ptr()); "`{}::{name}`", self.name)
        };
        result.map_err(|e| self.not_found(e, name, NotFoundKind::Function))?;
        Ok(func)
    }

    /// The parameter sizes of kernel `function` as the blob declares them, or why they cannot be
    /// known; `None` when the module did not read them because the driver can tell.
    pub(crate) fn blob_param_sizes(&self, function: &str) -> Option<ParamSizes> {
        let layouts = self.blob_layouts.as_deref()?;
        Some(match layouts {
            Ok(kernels) => kernels
                .iter()
                .find(|kernel| kernel.name == function)
                .map(|kernel| kernel.params.iter().map(|slot| slot.size).collect())
                .ok_or_else(|| {
                    format!(
                        "the driver lacks cuFuncGetParamInfo and module `{}` declares no parameter layout for `{function}`",
                        self.name
                    )
                }),
            Err(why) => Err(format!(
                "the driver lacks cuFuncGetParamInfo and the parameter layouts of module `{}` cannot be read from its blob: {why}",
                self.name
            )),
        })
    }

    /// `cuModuleGetGlobal`: the address and size of a `__device__` variable.
    pub(crate) fn global(&self, name: &str) -> Result<(CUdeviceptr, usize)> {
        let c_name = self.c_name(name, NotFoundKind::Symbol)?;
        ensure_bound(self.context)?;
        let (mut ptr, mut size): (CUdeviceptr, usize) = (0, 0);
        // SAFETY: as for `function`.
        let result = unsafe {
            cu!(cuModuleGetGlobal_v2(&mut ptr, &mut size, self.raw, c_name.as_ptr()); "`{}::{name}`", self.name)
        };
        result.map_err(|e| self.not_found(e, name, NotFoundKind::Symbol))?;
        Ok((ptr, size))
    }

    fn c_name(&self, name: &str, kind: NotFoundKind) -> Result<CString> {
        CString::new(name).map_err(|_| AtlasError::NotFound {
            kind,
            name: format!("{}::{}", self.name, name.escape_debug()),
            detail: "the name contains a NUL byte".into(),
        })
    }

    fn not_found(&self, e: AtlasError, name: &str, kind: NotFoundKind) -> AtlasError {
        if e.cuda_code() == Some(CUresult::CUDA_ERROR_NOT_FOUND.0) {
            AtlasError::NotFound {
                kind,
                name: format!("{}::{name}", self.name),
                detail: String::new(),
            }
        } else {
            e
        }
    }

    /// Unloads the module now and says whether the driver agreed; teardown no-ops are `Ok`.
    pub(crate) fn unload(mut self) -> Result<()> {
        self.unload_now()
    }

    fn unload_now(&mut self) -> Result<()> {
        let raw = std::mem::replace(&mut self.raw, std::ptr::null_mut());
        if raw.is_null() || self.library.is_some() {
            return Ok(());
        }
        let name = &self.name;
        // SAFETY: `raw` was loaded by this value and, replaced by null above, is unloaded only once.
        let result = ensure_bound(self.context)
            .and_then(|()| unsafe { cu!(cuModuleUnload(raw); "module `{name}`") });
        match result {
            Err(e) if e.cuda_code().is_some_and(crate::error::is_teardown_noop) => Ok(()),
            other => other,
        }
    }
}

/// The refusal of module `name`, which `holds` only code that `host`'s device cannot run.
#[cold]
pub(crate) fn no_binary_for(host: &CudaHost, name: &str, holds: String) -> AtlasError {
    let (major, minor) = host.compute_capability();
    AtlasError::NoBinaryForDevice {
        module: name.escape_debug().to_string(),
        holds,
        device: host.ordinal(),
        arch: format!("sm_{major}{minor}"),
    }
}

/// A raw JIT loader call: image, option count, options, option values -> status.
pub(crate) type JitLoad<'a> =
    dyn FnMut(*const c_void, u32, *mut CUjit_option, *mut *mut c_void) -> CUresult + 'a;

/// Hands the checked `image` to `load`, with no options: the load is exactly what a raw call
/// costs. Only when it fails is the image handed over once more, with a JIT error log buffer (see
/// [`retry_with_log`]). `device` is the device the load is for, when it is known.
pub(crate) fn with_jit_log(
    call: &'static str,
    name: &str,
    image: &[u8],
    device: Option<&CudaHost>,
    load: &mut JitLoad<'_>,
) -> Result<()> {
    let status = load(
        image.as_ptr().cast(),
        0,
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    );
    if status == CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    retry_with_log(call, name, status, image, device, load)
}

/// After a load of `image` failed with `status`: unless the context is lost (then every call
/// fails the same way, and the blob is not at fault) or the image holds no code for the device,
/// loads it once more through `load` with a JIT error log buffer, so that the error is an
/// [`AtlasError::ModuleLoad`] carrying the log. `Ok` when that second load succeeded (the caller
/// then owns what it loaded).
#[cold]
pub(crate) fn retry_with_log(
    call: &'static str,
    name: &str,
    status: CUresult,
    image: &[u8],
    device: Option<&CudaHost>,
    load: &mut JitLoad<'_>,
) -> Result<()> {
    if is_sticky(status.0) {
        return Err(AtlasError::from_call(
            call,
            format!("loading module `{name}`"),
            status.0,
        ));
    }
    if let (CUresult::CUDA_ERROR_NO_BINARY_FOR_GPU, Some(host)) = (status, device) {
        return Err(no_binary_for(host, name, code_targets(image)));
    }
    // Zeroed, and read only up to the length the driver reports, bounded by the buffer and cut at
    // the first NUL: on early failures the driver may write neither the log nor its length.
    let mut log = vec![0u8; JIT_LOG_BYTES];
    let mut options = [
        CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
        CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
    ];
    let mut values: [*mut c_void; 2] = [log.as_mut_ptr().cast(), JIT_LOG_BYTES as *mut c_void];
    let retry = load(
        image.as_ptr().cast(),
        options.len() as u32,
        options.as_mut_ptr(),
        values.as_mut_ptr(),
    );
    if retry == CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let written = (values[1] as usize).min(JIT_LOG_BYTES);
    let log = &log[..written];
    let log = log.split(|&b| b == 0).next().unwrap_or(log);
    Err(AtlasError::ModuleLoad {
        module: name.to_string(),
        code: status.0,
        text: cuda_error_text(status.0),
        jit_log: String::from_utf8_lossy(log).into_owned(),
    })
}

impl Drop for Module {
    fn drop(&mut self) {
        let result = self.unload_now();
        report_cleanup("unloading a module", result);
    }
}
