//! A loaded module: one `cuModuleLoadData` per blob (a failed load is retried once with a JIT log,
//! see [`jit`](crate::code::jit)), unloaded exactly once.

use std::borrow::Cow;
use std::ffi::CString;
use std::sync::Arc;

use atlas_sys::{CUcontext, CUdeviceptr, CUfunction, CUmodule, CUresult};

use crate::closest::closest;
use crate::code::blob::BlobKind;
use crate::code::dependency_wait::DependencyWait;
use crate::code::fit::{self, Runs};
use crate::code::jit::with_jit_log;
use crate::code::layout::BlobLayouts;
use crate::code::target::Devices;
use crate::device::context::ensure_bound;
use crate::device::host::CudaHost;
use crate::driver::status::is_teardown_noop;
use crate::driver::{About, calls};
use crate::error::{AtlasError, NotFoundKind, Result, report_cleanup};
use crate::flight_recorder::ArgumentWords;

/// A kernel's parameters as the driver lays them out: each one's size and its offset from the
/// start of the parameters, in bytes, first to last.
#[derive(Debug)]
pub(crate) struct ParamLayout {
    pub(crate) sizes: Box<[usize]>,
    pub(crate) offsets: Box<[usize]>,
    /// The sizes as the flight recorder keeps them ([`ArgumentWords::pack`]), packed once here
    /// so that a raw launch's record reads them beside the count, not from `sizes`.
    pub(crate) recorded: [u64; 2],
}

impl ParamLayout {
    /// The layout of parameters of `sizes` at `offsets`.
    pub(crate) fn new(sizes: Box<[usize]>, offsets: Box<[usize]>) -> Self {
        let recorded = ArgumentWords::pack(&sizes);
        Self {
            sizes,
            offsets,
            recorded,
        }
    }
}

/// A kernel's parameter layout, or why nothing can tell it.
pub(crate) type ParamSizes = std::result::Result<ParamLayout, String>;

/// A blob checked for a device, to load there: its module name, kind, the bytes to hand over and
/// their kind (a fatbin's when it is handed over whole; a cubin's for the one entry of a fatbin
/// that the driver surely loads), of a fatbin handed over whole the layouts of its entries, taken
/// while they were checked (`None` for any other image: its layouts are the image's), and what
/// the device runs of it.
pub(crate) struct ModuleCode<'a> {
    pub(crate) name: String,
    pub(crate) kind: BlobKind,
    pub(crate) image_kind: BlobKind,
    pub(crate) image: Cow<'a, [u8]>,
    /// The layouts of a PTX text or cubin, shared with other loads of equal bytes
    /// ([`check_cache`](crate::code::check_cache)); `None`: read of `entries` or `image`.
    pub(crate) layouts: Option<Arc<BlobLayouts>>,
    pub(crate) entries: Option<BlobLayouts>,
    pub(crate) runs: Runs,
}

impl ModuleCode<'_> {
    /// The module's name, and the layouts of its kernels on a device of `compute_capability`,
    /// read at their first need ([`BlobLayouts`]): those a fatbin's check took, or else the
    /// image's, which is kept for it (moved in when owned, else copied).
    ///
    /// They bound how far the driver is asked about a kernel's parameters (to the count the blob
    /// declares, not one past the last: a call that fails, which compute-sanitizer reports), and
    /// are the layouts when the driver cannot tell them (no `cuFuncGetParamInfo`: older than CUDA
    /// 12.4, or an injection library).
    pub(crate) fn into_layouts(self, compute_capability: (u32, u32)) -> (String, Arc<BlobLayouts>) {
        if let Some(layouts) = self.layouts {
            return (self.name, layouts);
        }
        let layouts = self.entries.unwrap_or_else(|| {
            let devices = Devices::of(compute_capability).unwrap_or(Devices::Every);
            BlobLayouts::of_blob(self.image_kind, self.image, devices)
        });
        (self.name, Arc::new(layouts))
    }
}

/// Where the layout of one kernel as its module's blob declares it is read from, at first need.
#[derive(Debug, Clone)]
pub(crate) struct BlobParams {
    layouts: Arc<BlobLayouts>,
    /// The kernel's symbol.
    symbol: String,
}

impl BlobParams {
    /// Whether the kernel waits for the grid it depends on, as its module's code says (read now,
    /// with the layouts, if this is their first need).
    pub(crate) fn dependency_wait(&self) -> DependencyWait {
        self.layouts.dependency_wait(&self.symbol)
    }

    /// The parameter layout of the kernel, of module `module`, as the blob declares it, or why
    /// they cannot be known (worded for a driver without `cuFuncGetParamInfo`, the only one it
    /// is shown for).
    pub(crate) fn sizes(&self, module: &str) -> ParamSizes {
        let function = &self.symbol;
        match self.layouts.get() {
            Ok(kernels) => match kernels.get(function) {
                Some(Ok(kernel)) => Ok(ParamLayout::new(
                    kernel.sizes().collect(),
                    kernel.params.iter().map(|p| p.offset).collect(),
                )),
                Some(Err(why)) => Err(format!(
                    "the driver lacks cuFuncGetParamInfo and the parameter layout of `{function}` \
                     in module `{module}` cannot be known from its blob: {why}"
                )),
                None => Err(format!(
                    "the driver lacks cuFuncGetParamInfo and module `{module}` declares no parameter layout for `{function}`"
                )),
            },
            Err(why) => Err(format!(
                "the driver lacks cuFuncGetParamInfo and the parameter layouts of module `{module}` cannot be read from its blob: {why}"
            )),
        }
    }
}

impl BlobParams {
    /// The kernel's parameters as its PTX declares them, where its code is PTX and its layout
    /// could be read; empty otherwise.
    pub(crate) fn declared(&self) -> Vec<crate::code::layout::PtxParam> {
        match self.layouts.get() {
            Ok(kernels) => match kernels.get(&self.symbol) {
                Some(Ok(kernel)) => kernel.declared.clone(),
                _ => Vec::new(),
            },
            Err(_) => Vec::new(),
        }
    }
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
    /// The kernels' parameter layouts as the blob declares them for this module's device.
    blob_layouts: Arc<BlobLayouts>,
}

// SAFETY: a CUmodule is a driver handle usable from any thread; the module is unloaded only
// through ownership (unload_all) or drop, never while shared.
unsafe impl Send for Module {}
// SAFETY: shared references only look names up in the module, which the driver allows concurrently.
unsafe impl Sync for Module {}

/// Loads each checked blob of `blobs` in `host`'s context: the context is made current once, then
/// one `cuModuleLoadData` per blob. Modules loaded before a failure are unloaded again; the
/// failure is explained by what the device runs of the blob ([`fit::explain`]).
pub(crate) fn load_all(host: &CudaHost, blobs: Vec<ModuleCode<'_>>) -> Result<Vec<Module>> {
    let context = host.context().raw();
    ensure_bound(context)?;
    let mut modules = Vec::with_capacity(blobs.len());
    for code in blobs {
        let image: &[u8] = &code.image;
        // SAFETY: `image` passed validation (PTX NUL-terminated); the context is current (above,
        // and nothing between the loads changes it).
        let raw = with_jit_log(&code.name, image, Some(host), |log| unsafe {
            calls::module_load(image, log)
        })
        .map_err(|e| fit::explain(e, &code.name, code.runs, host))?;
        let kind = code.kind;
        let (name, blob_layouts) = code.into_layouts(host.compute_capability());
        modules.push(Module {
            raw,
            name,
            kind,
            context,
            library: None,
            blob_layouts,
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
        blob_layouts: Arc<BlobLayouts>,
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

    /// Where the parameter layout of kernel `symbol` as the blob declares it is read from.
    pub(crate) fn blob_params(&self, symbol: &str) -> BlobParams {
        BlobParams {
            layouts: Arc::clone(&self.blob_layouts),
            symbol: symbol.to_owned(),
        }
    }

    /// The names of the kernels the blob declares for this module's device (read now, if this is
    /// the first need of its layouts), sorted; none when they cannot be read.
    pub(crate) fn blob_kernel_names(&self) -> Vec<String> {
        let mut names: Vec<String> = match self.blob_layouts.get() {
            Ok(kernels) => kernels.keys().cloned().collect(),
            Err(_) => Vec::new(),
        };
        names.sort_unstable();
        names
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
            closest: Box::default(),
        })
    }

    #[cold]
    fn not_found(&self, e: crate::driver::Error, name: &str, kind: NotFoundKind) -> AtlasError {
        if e.code() == Some(CUresult::CUDA_ERROR_NOT_FOUND.0) {
            let existing = match kind {
                // The driver's list where it has one (CUDA 12.4+), which sees into every blob;
                // else what the blob declares.
                NotFoundKind::Function => self
                    .function_names()
                    .unwrap_or_else(|_| self.blob_kernel_names()),
                NotFoundKind::Symbol => self.blob_layouts.variable_names(),
                NotFoundKind::Module => Vec::new(),
            };
            AtlasError::NotFound {
                kind,
                name: format!("{}::{name}", self.name),
                detail: String::new(),
                closest: closest(name, existing),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::code::blob::DECOMPRESSIONS;
    use crate::code::target::Arch;
    use crate::registry::model::Model;

    /// nvcc 13.0's `-arch=sm_90` fatbin of `kernels/elementwise.cu` as it writes it (the PTX
    /// zstd-compressed, the cubin plain), and with both zstd-compressed.
    const FATBIN: &[u8] = include_bytes!("blob/testdata/nvcc13.0.elementwise.fatbin");
    const ZSTD_FATBIN: &[u8] = include_bytes!("blob/testdata/nvcc13.0.elementwise.zstd.fatbin");

    /// `blob` as a load on an sm_90 device makes it ready for the driver: a library's load
    /// (`settle` false: a fatbin is handed over whole), or a registry's.
    fn prepared_with(blob: &[u8], settle: bool) -> ModuleCode<'_> {
        let model = Model::new().blob("elementwise", blob);
        let checked = model.check_blobs(false).unwrap();
        let mut prepared = model.prepare(checked, (9, 0), settle).unwrap();
        prepared.modules.pop().unwrap()
    }

    /// `blob` as a library's load makes it ready for the driver on an sm_90 device.
    fn prepared(blob: &[u8]) -> ModuleCode<'_> {
        prepared_with(blob, false)
    }

    fn scale_sizes(layouts: &BlobLayouts) -> Vec<usize> {
        let kernels = layouts.get().as_ref().unwrap();
        kernels["scale"].as_ref().unwrap().sizes().collect()
    }

    #[test]
    fn layouts_are_read_at_their_first_need_once_for_every_load_of_equal_bytes() {
        // Bytes no other test loads: the demo's PTX with a comment of its own at the end.
        let mut ptx = atlas_kernels::ptx_for_model("demo").unwrap()[1].1.to_vec();
        if ptx.last() == Some(&0) {
            ptx.pop();
        }
        ptx.extend_from_slice(b"\n// layouts_are_read_at_their_first_need\n");
        let (name, layouts) = prepared(&ptx).into_layouts((9, 0));
        assert_eq!(name, "elementwise");
        assert!(!layouts.is_read());
        assert_eq!(layouts.kept_bytes(), ptx.len());
        // A load of equal bytes elsewhere shares them.
        let copy = ptx.clone();
        let (_, again) = prepared(&copy).into_layouts((9, 0));
        assert!(Arc::ptr_eq(&layouts, &again));
        assert_eq!(scale_sizes(&layouts), [8, 4, 4]);
        assert!(layouts.is_read() && again.is_read());
        assert_eq!(layouts.kept_bytes(), 0);
    }

    #[test]
    fn a_fatbin_entry_is_decompressed_once_and_its_cubin_read_from_that() {
        DECOMPRESSIONS.with(|n| n.set(0));
        let zstd = prepared(ZSTD_FATBIN).into_layouts((9, 0)).1;
        // Its PTX and its cubin, once each, by the check; the cubin's layouts read then, the PTX
        // kept as it came out.
        assert_eq!(DECOMPRESSIONS.with(|n| n.get()), 2);
        assert!(!zstd.is_read());
        assert_eq!(zstd.kept_bytes(), 1426);
        // The plain cubin and the decompressed PTX are kept.
        let plain = prepared(FATBIN).into_layouts((9, 0)).1;
        assert_eq!(DECOMPRESSIONS.with(|n| n.get()), 3);
        assert_eq!(plain.kept_bytes(), 1426 + 5600);
        assert_eq!(zstd.get(), plain.get());
        assert_eq!(scale_sizes(&zstd), [8, 4, 4]);
        assert_eq!(DECOMPRESSIONS.with(|n| n.get()), 3);
    }

    #[test]
    fn a_registry_hands_the_driver_the_cubin_it_loads_of_a_fatbin_decompressed_once() {
        assert!(
            !crate::code::target::jit_forced(),
            "run without CUDA_FORCE_PTX_JIT and CUDA_FORCE_JIT"
        );
        DECOMPRESSIONS.with(|n| n.set(0));
        // The sm_90 SASS alone is decompressed and checked (not the PTX): it is what the driver
        // gets, and the layouts are read from it.
        let zstd = prepared_with(ZSTD_FATBIN, true);
        assert_eq!(DECOMPRESSIONS.with(|n| n.get()), 1);
        assert_eq!(
            (zstd.kind, zstd.image_kind),
            (BlobKind::Fatbin, BlobKind::Cubin)
        );
        assert_eq!(zstd.runs, Runs::Sass(Arch::baseline(90)));
        assert!(matches!(zstd.image, Cow::Owned(_)) && zstd.image.starts_with(b"\x7fELF"));
        assert!(zstd.entries.is_none());
        let zstd = zstd.into_layouts((9, 0)).1;
        assert_eq!(zstd.kept_bytes(), 5600);
        // A plain entry is handed over where it lies in the fatbin; nothing is decompressed.
        let plain = prepared_with(FATBIN, true);
        assert_eq!(DECOMPRESSIONS.with(|n| n.get()), 1);
        let Cow::Borrowed(cubin) = plain.image else {
            panic!("the plain cubin was copied");
        };
        let inside = FATBIN.as_ptr_range();
        assert!(inside.contains(&cubin.as_ptr()) && cubin.starts_with(b"\x7fELF"));
        assert_eq!(zstd.get(), plain.into_layouts((9, 0)).1.get());
        assert_eq!(scale_sizes(&zstd), [8, 4, 4]);
    }

    #[test]
    fn a_fatbins_compressed_ptx_is_read_for_its_isa_from_the_decompression_that_checked_it() {
        DECOMPRESSIONS.with(|n| n.set(0));
        // On 10.0 the sm_90 SASS does not run: what the device runs is the compute_90 PTX (ISA
        // 9.0), whose version is read from the text as the check decompressed it.
        let model = Model::new().blob("elementwise", ZSTD_FATBIN);
        let checked = model.check_blobs(false).unwrap();
        let prepared = model.prepare(checked, (10, 0), true).unwrap();
        assert_eq!(DECOMPRESSIONS.with(|n| n.get()), 1);
        match (&prepared.modules[..], &prepared.unfit) {
            ([code], None) => assert_eq!(
                code.runs,
                Runs::Ptx {
                    target: Some(Arch::baseline(90)),
                    isa: Some((9, 0))
                }
            ),
            // A driver older than CUDA 13.0 on this machine.
            ([], Some((_, unfit))) => assert!(
                matches!(
                    unfit,
                    crate::code::fit::Unfit::PtxTooNew { isa: (9, 0), .. }
                ),
                "{unfit:?}"
            ),
            _ => panic!("neither loaded nor refused"),
        }
    }

    #[test]
    fn a_kernels_blob_params_name_the_module_when_unknown() {
        let ptx = atlas_kernels::ptx_for_model("demo").unwrap()[1].1;
        let layouts = prepared(ptx).into_layouts((9, 0)).1;
        let params = |symbol: &str| {
            BlobParams {
                layouts: Arc::clone(&layouts),
                symbol: symbol.into(),
            }
            .sizes("elementwise")
        };
        let scale = params("scale").unwrap();
        assert_eq!(
            (&scale.sizes[..], &scale.offsets[..]),
            (&[8, 4, 4][..], &[0, 8, 12][..])
        );
        let e = params("absent").unwrap_err();
        assert!(
            e.contains("module `elementwise` declares no parameter layout for `absent`"),
            "{e}"
        );
    }
}
