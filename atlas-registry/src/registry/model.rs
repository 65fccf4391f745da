//! [`Model`]: a model's modules as blobs, blob sets and CUDA C++ sources, and how to load them
//! (the compile cache, preloading); what a registry or library makes of one per device
//! ([`Prepared`]); and the preload that fills a registry's function table at load ([`preload`](super::AtlasRegistry::preload)).

use std::borrow::Cow;
use std::sync::Arc;

use crate::code::blob::{self, BlobKind};
use crate::code::blob_set::{self, BlobSet};
use crate::code::check_cache;
use crate::code::fit::{self, FatbinPtx, Unfit};
use crate::code::layout::BlobLayouts;
use crate::code::module::ModuleCode;
use crate::code::target::Devices;
use crate::compile::{CacheOutcome, CompileCache, Compiler, CudaSource};
use crate::device::host::CudaHost;
use crate::driver::calls;
use crate::error::{AtlasError, CompileRefusal, Result};

/// A model's modules, each a blob (PTX, cubin, fatbin: as [`AtlasRegistry::load`] takes them), a
/// [`BlobSet`] of cubins for several architectures and PTX, of which each device loads the best
/// it runs, or a CUDA C++ source that NVRTC compiles for each device's architecture at load,
/// through a persistent [`CompileCache`]. Loaded by [`AtlasRegistry::load_model`] and
/// [`AtlasLibrary::load_model`]; compiled modules are ordinary modules there, with the same
/// checks, caches and launches as blobs.
///
/// ```no_run
/// use atlas_registry::{AtlasRegistry, CudaSource, Model};
///
/// # fn main() -> atlas_registry::Result<()> {
/// let n = 4096;
/// let model = Model::new()
///     .blobs(atlas_kernels::ptx_for_model("demo").unwrap())
///     .source(
///         "fill",
///         CudaSource::new("fill.cu", "template <int N> __global__ void fill(float *x) { \
///             int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < N) x[i] = 1.0f; }")
///             .option(format!("-DSIZE={n}"))
///             .name_expression(format!("fill<{n}>")),
///     )
///     .preload(true);
/// let registry = AtlasRegistry::load_model(0, &model)?;
/// let fill = registry.function_cached("fill", &format!("fill<{n}>"))?; // by its C++ name
/// # Ok(()) }
/// ```
///
/// [`AtlasRegistry::load`]: crate::AtlasRegistry::load
/// [`AtlasRegistry::load_model`]: crate::AtlasRegistry::load_model
/// [`AtlasLibrary::load_model`]: crate::AtlasLibrary::load_model
#[derive(Debug, Clone, Default)]
pub struct Model<'a> {
    modules: Vec<(String, Code<'a>)>,
    preload: bool,
    cache: Option<CompileCache>,
}

/// A module checked before any driver is loaded.
#[derive(Debug, Clone)]
pub(crate) enum Checked<'a> {
    /// A blob: its kind, the bytes to hand over, and for a PTX text or cubin its layouts, shared
    /// with the loads of equal bytes ([`check_cache`]).
    Blob(BlobKind, Cow<'a, [u8]>, Option<Arc<BlobLayouts>>),
    /// A blob set: each of its blobs so.
    Set(Vec<(BlobKind, Cow<'a, [u8]>)>),
    /// A source, compiled for each device.
    Source,
}

#[derive(Debug, Clone)]
enum Code<'a> {
    Blob(&'a [u8]),
    Set(BlobSet<'a>),
    Source(CudaSource),
}

impl<'a> Model<'a> {
    /// A model without modules.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a module loaded from `blob`, as [`AtlasRegistry::load`](crate::AtlasRegistry::load)
    /// takes it.
    pub fn blob(mut self, name: impl Into<String>, blob: &'a [u8]) -> Self {
        self.modules.push((name.into(), Code::Blob(blob)));
        self
    }

    /// Adds every `(module name, blob)` of `blobs`.
    pub fn blobs(mut self, blobs: &[(&str, &'a [u8])]) -> Self {
        for (name, blob) in blobs {
            self = self.blob(*name, blob);
        }
        self
    }

    /// Adds a module given as `set`, blobs for several architectures, of which each device loads
    /// the best it runs (see [`BlobSet`]).
    ///
    /// ```no_run
    /// use atlas_registry::{AtlasRegistry, BlobSet, Model};
    ///
    /// # fn main() -> atlas_registry::Result<()> {
    /// // nvcc -cubin -arch=sm_80 / -arch=sm_90, nvcc -ptx -arch=compute_75 (CUDA 12.x: PTX ISA 8.x)
    /// let set = BlobSet::new()
    ///     .cubin(80, include_bytes!("../../../kernels/gen/elementwise.sm_80.cubin"))
    ///     .cubin(90, include_bytes!("../../../kernels/gen/elementwise.sm_90.cubin"))
    ///     .ptx(include_bytes!("../../../kernels/gen/elementwise.ptx"));
    /// // sm_90 SASS on an H100, sm_80 SASS on an A10 (8.6), the PTX elsewhere from 7.5 on.
    /// let registry = AtlasRegistry::load_model(0, &Model::new().blob_set("elementwise", set))?;
    /// # Ok(()) }
    /// ```
    pub fn blob_set(mut self, name: impl Into<String>, set: BlobSet<'a>) -> Self {
        self.modules.push((name.into(), Code::Set(set)));
        self
    }

    /// Adds a module compiled from `source` for each device it is loaded on (see
    /// [`CompileTarget::choose`](crate::CompileTarget::choose)). Its name expressions are looked up
    /// by their C++ name.
    pub fn source(mut self, name: impl Into<String>, source: CudaSource) -> Self {
        self.modules.push((name.into(), Code::Source(source)));
        self
    }

    /// Whether every kernel of every module is resolved at load, filling the registry's function
    /// table up front so that no first launch or lookup pays for loading its kernel (with lazy
    /// loading, a first `cuModuleGetFunction` costs microseconds; a warm one, tens of
    /// nanoseconds). Off by default.
    pub fn preload(mut self, preload: bool) -> Self {
        self.preload = preload;
        self
    }

    /// The compile cache for the sources (by default, [`CompileCache::from_env`]).
    pub fn cache(mut self, cache: CompileCache) -> Self {
        self.cache = Some(cache);
        self
    }

    /// The names of the modules, in the order added.
    pub fn module_names(&self) -> impl ExactSizeIterator<Item = &str> {
        self.modules.iter().map(|(name, _)| name.as_str())
    }

    /// Whether the model asks for preloading.
    pub(crate) fn preloads(&self) -> bool {
        self.preload
    }

    /// Checks the module names and every blob, those of blob sets included (before any driver or
    /// NVRTC is loaded, so that a bad blob is refused the same on a machine without a GPU): for
    /// each module, what was checked.
    ///
    /// With `unknown_formats`, a blob of no format Atlas knows passes unchecked (the caller's
    /// promise: [`AtlasRegistry::load_with_unknown_formats`](crate::AtlasRegistry::load_with_unknown_formats)).
    pub(crate) fn check_blobs(&self, unknown_formats: bool) -> Result<Vec<Checked<'a>>> {
        for (i, (name, _)) in self.modules.iter().enumerate() {
            if self.modules[..i].iter().any(|(earlier, _)| earlier == name) {
                return Err(AtlasError::InvalidModule {
                    module: name.escape_debug().to_string(),
                    reason: "the model names this module twice".into(),
                });
            }
        }
        self.modules
            .iter()
            .map(|(name, code)| match code {
                // Bytes that passed before pass again, with the layouts read of them then.
                Code::Blob(bytes) => match check_cache::find(bytes) {
                    Some((kind, layouts)) => {
                        Ok(Checked::Blob(kind, blob::image(kind, bytes), Some(layouts)))
                    }
                    None => blob::prepare(name, bytes, unknown_formats).map(|(kind, image)| {
                        Checked::Blob(kind, image, check_cache::remember(kind, bytes))
                    }),
                },
                Code::Set(set) => set.check(name).map(Checked::Set),
                Code::Source(_) => Ok(Checked::Source),
            })
            .collect()
    }

    /// Whether any module is a source (so NVRTC is needed).
    pub(crate) fn has_sources(&self) -> bool {
        self.modules
            .iter()
            .any(|(_, code)| matches!(code, Code::Source(_)))
    }

    /// The model's modules made ready for a device of compute capability `cc`: `checked` (from
    /// [`check_blobs`](Self::check_blobs)) with each source compiled (or taken from the cache),
    /// each blob set's blob for the device chosen, of every fatbin the code of the entries such a
    /// device may pick checked ([`validate_blob_for_device`](crate::validate_blob_for_device)),
    /// what its layouts need taken from that check ([`BlobLayouts::add_entry`]), and what the
    /// device runs of each told ([`fit`]), up to the first module it cannot run.
    ///
    /// With `settle` (a load for one device), a fatbin of which the driver surely loads one
    /// cubin is made that cubin, the only code of it checked ([`blob::check_for_device`]).
    pub(crate) fn prepare(
        &self,
        checked: Vec<Checked<'a>>,
        cc: (u32, u32),
        settle: bool,
    ) -> Result<Prepared<'a>> {
        let compiler = if self.has_sources() {
            let compiler =
                Compiler::with_cache(self.cache.clone().unwrap_or_else(CompileCache::from_env))?;
            check_driver(&compiler, self)?;
            Some(compiler)
        } else {
            None
        };
        // A driver that cannot tell its version is left to judge PTX itself.
        let driver = calls::cuda_version().ok();
        let mut prepared = Prepared::default();
        for ((name, code), checked) in self.modules.iter().zip(checked) {
            let (kind, image, layouts) = match (code, checked, &compiler) {
                (_, Checked::Blob(kind, image, layouts), _) => (kind, image, layouts),
                (_, Checked::Set(blobs), _) => match blob_set::choose(blobs, cc, driver) {
                    Ok((kind, image, _)) => (kind, image, None),
                    Err(unfit) => {
                        prepared.unfit = Some((name.clone(), unfit));
                        break;
                    }
                },
                (Code::Source(source), Checked::Source, Some(compiler)) => {
                    let target = compiler.target_for(name, cc)?;
                    let code = compiler.compile(source, target)?;
                    prepared
                        .lowered
                        .push((name.clone(), code.lowered_names().to_vec()));
                    prepared
                        .outcomes
                        .push((name.clone(), code.cache_outcome().clone()));
                    // Checked by the blob validator as it was made or taken from the cache
                    // (an entry it refuses is compiled again), as `check_blobs` checks a blob.
                    let (kind, image) = code.into_checked();
                    (kind, Cow::Owned(image), None)
                }
                // `checked` says what each module is: a source only for a source.
                _ => continue,
            };
            let devices = Devices::of(cc).unwrap_or(Devices::Every);
            let mut entries = BlobLayouts::of_fatbin(devices);
            let mut ptx = FatbinPtx::default();
            let add = |code, bytes: &[u8], decompressed| {
                ptx.add(code, bytes);
                entries.add_entry(code, bytes, decompressed);
            };
            let sass = match &image {
                Cow::Borrowed(bytes) => blob::check_for_device(name, kind, bytes, cc, settle, add)?,
                Cow::Owned(bytes) => blob::check_for_device(name, kind, bytes, cc, settle, add)?
                    .map(|sass| Cow::Owned(sass.into_owned())),
            };
            // The cubin the driver surely loads of a fatbin is a cubin, with its layouts.
            let (image_kind, image, entries) = match sass {
                Some(sass) => (BlobKind::Cubin, sass, None),
                None => (kind, image, (kind == BlobKind::Fatbin).then_some(entries)),
            };
            let runs = match fit::fit_checked(image_kind, &image, cc, driver, Some(&ptx)) {
                Ok(runs) => runs,
                Err(unfit) => {
                    prepared.unfit = Some((name.clone(), unfit));
                    break;
                }
            };
            prepared.modules.push(ModuleCode {
                name: name.clone(),
                kind,
                image_kind,
                image,
                layouts,
                entries,
                runs,
            });
        }
        Ok(prepared)
    }
}

/// Refuses to compile with an NVRTC of a newer major CUDA version than the driver: what it makes
/// (PTX of a newer ISA, cubins of a newer ELF ABI) does not load there.
fn check_driver(compiler: &Compiler, model: &Model<'_>) -> Result<()> {
    let driver = calls::cuda_version()?;
    let nvrtc = compiler.version();
    if nvrtc.0 <= driver.0 {
        return Ok(());
    }
    let module = model
        .modules
        .iter()
        .find(|(_, code)| matches!(code, Code::Source(_)))
        .map_or("", |(name, _)| name.as_str());
    Err(AtlasError::CannotCompile {
        module: module.escape_debug().to_string(),
        reason: CompileRefusal::NewerThanDriver { nvrtc, driver },
    })
}

/// A model made ready for one device: every module's checked blob, in order, what the device
/// runs of each, and what compiling its sources told; or the first module the device cannot run.
#[derive(Default)]
pub(crate) struct Prepared<'a> {
    /// Each module's checked code, with what the device runs of it.
    pub(crate) modules: Vec<ModuleCode<'a>>,
    /// The first module the device cannot run, and why; `modules` then holds those before it.
    pub(crate) unfit: Option<(String, Unfit)>,
    /// For each compiled module, its `(name expression, lowered name)` pairs.
    pub(crate) lowered: Vec<(String, Vec<(String, String)>)>,
    /// For each compiled module, what the compile cache did.
    pub(crate) outcomes: Vec<(String, CacheOutcome)>,
}

impl Prepared<'_> {
    /// The refusal of the first module that `host`'s device cannot run, if there is one.
    pub(crate) fn refuse_unfit(&self, host: &CudaHost) -> Result<()> {
        match &self.unfit {
            Some((module, unfit)) => Err(unfit.error(module, host)),
            None => Ok(()),
        }
    }

    /// What a registry keeps of the compiles.
    pub(crate) fn compiled(&self) -> Compiled {
        Compiled {
            names: CppNames::of(&self.lowered),
            outcomes: self.outcomes.clone(),
        }
    }
}

/// What a registry keeps of its compiled modules: their C++ names, and what the compile cache did
/// for each.
#[derive(Debug, Default, Clone)]
pub(crate) struct Compiled {
    pub(crate) names: CppNames,
    pub(crate) outcomes: Vec<(String, CacheOutcome)>,
}

/// For each module of a model, the C++ names of its kernels and their symbols: what the registry
/// translates a lookup by C++ name with.
#[derive(Debug, Default, Clone)]
pub(crate) struct CppNames {
    /// `(module, name expression, lowered name)`.
    names: Vec<(String, String, String)>,
}

impl CppNames {
    /// The names of `prepared`'s compiled modules.
    pub(crate) fn of(lowered: &[(String, Vec<(String, String)>)]) -> Self {
        Self {
            names: lowered
                .iter()
                .flat_map(|(module, pairs)| {
                    pairs
                        .iter()
                        .map(move |(e, l)| (module.clone(), e.clone(), l.clone()))
                })
                .collect(),
        }
    }

    /// The symbol of `function` in `module`: its lowered name when it is a name expression of
    /// the module's source, else `function` itself.
    pub(crate) fn symbol<'n>(&'n self, module: &str, function: &'n str) -> &'n str {
        self.names
            .iter()
            .find(|(m, e, _)| m == module && e == function)
            .map_or(function, |(_, _, lowered)| lowered.as_str())
    }

    /// The C++ name a registry files `symbol` of `module` under: the name expression whose
    /// lowered name it is, else the symbol itself.
    pub(crate) fn cpp_name<'n>(&'n self, module: &str, symbol: &'n str) -> &'n str {
        self.names
            .iter()
            .find(|(m, _, l)| m == module && l == symbol)
            .map_or(symbol, |(_, expression, _)| expression.as_str())
    }
}
