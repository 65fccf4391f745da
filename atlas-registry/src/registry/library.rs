//! [`AtlasLibrary`]: one load of a model for every GPU (`cuLibraryLoadData`), and a registry per
//! device made from that one load.

use std::fmt;
use std::sync::Arc;

use crate::code::fit::{self, Runs, Unfit};
use crate::code::library::LibraryBlob;
use crate::code::module::ModuleCode;
use crate::device::host::{compute_capabilities, host};
use crate::error::{AtlasError, Result};
use crate::registry::AtlasRegistry;
use crate::registry::model::{Compiled, Model};

/// A model loaded once for every device (`cuLibraryLoadData`, CUDA 12.0+): no context is needed
/// to load it, and [`registry`](Self::registry) gives each device an [`AtlasRegistry`] over that
/// one load, with the same functions, caches and launches as a registry loaded per device.
///
/// ```no_run
/// use atlas_registry::AtlasLibrary;
///
/// # fn main() -> atlas_registry::Result<()> {
/// let library = AtlasLibrary::load(atlas_kernels::ptx_for_model("demo").unwrap())?;
/// for ordinal in 0..atlas_registry::device_count()? {
///     let registry = library.registry(ordinal)?; // the one load, in this device's context
///     let scale = registry.function_cached("elementwise", "scale")?;
///     # let _ = scale;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct AtlasLibrary {
    names: Arc<[String]>,
    /// One build of the model for each compute capability among the devices present at load.
    builds: Arc<[Build]>,
    preload: bool,
}

/// One load per module of a model, in order, with what the devices of a build run of it.
type Loads = Vec<(Arc<LibraryBlob>, Runs)>;

/// A module's code of the builds that load the same bytes: `(build, its compute capability, the
/// code)`.
type Group<'a> = Vec<(usize, (u32, u32), ModuleCode<'a>)>;

/// The model's modules for the devices of one compute capability.
struct Build {
    compute_capability: (u32, u32),
    /// One load per module, in order, with what these devices run of it (a blob that several
    /// builds chose is loaded once); or the first module these devices cannot run, and why
    /// (nothing is loaded for them).
    loads: std::result::Result<Loads, (String, Unfit)>,
    compiled: Compiled,
}

impl AtlasLibrary {
    /// Loads each `(module name, blob)` once, for every device. Blobs are checked as by
    /// [`AtlasRegistry::load`], the code of a fatbin's entries for every device present: the
    /// driver may pick an entry for any of them, so each device's refusal is made here, before
    /// the driver sees the blob (devices of one compute capability are checked once). A JIT
    /// failure carries the JIT log.
    #[doc(alias = "cuLibraryLoadData")]
    pub fn load(blobs: &[(&str, &[u8])]) -> Result<Self> {
        Self::load_model(&Model::new().blobs(blobs))
    }

    /// Loads a [`Model`] once for every device: its blobs as [`load`](Self::load) does, its
    /// [`BlobSet`](crate::BlobSet)s' blob for each architecture present among the devices, and
    /// its sources compiled once per architecture present (each loaded with `cuLibraryLoadData`;
    /// see [`AtlasRegistry::load_model`] for the compile, its cache and errors); a blob chosen for
    /// several architectures is loaded once. [`registry`](Self::registry) gives a device the
    /// build of its architecture; with [`Model::preload`], every kernel is resolved there.
    pub fn load_model(model: &Model<'_>) -> Result<Self> {
        let checked = model.check_blobs(false)?;
        let mut capabilities = compute_capabilities()?;
        capabilities.sort_unstable();
        capabilities.dedup();
        // Each architecture present is prepared: its sources compiled, its blob sets' blobs
        // chosen and its fatbin entries checked, before anything is loaded (as `prepare` refuses
        // a blob).
        let mut all = Vec::with_capacity(capabilities.len());
        for &cc in &capabilities {
            all.push((cc, model.prepare(checked.clone(), cc, false)?));
        }
        // Of each module, the code of every build that runs the model, that of the same bytes in
        // one group (in the order of the builds and their modules): each group is one load, with
        // the layouts of each of its architectures.
        let mut groups: Vec<(usize, Group<'_>)> = Vec::new();
        let mut builds = Vec::with_capacity(all.len());
        for (b, (cc, prepared)) in all.into_iter().enumerate() {
            let compiled = prepared.compiled();
            let loads = match prepared.unfit {
                Some(unfit) => Err(unfit),
                None => {
                    for (i, code) in prepared.modules.into_iter().enumerate() {
                        // The same bytes: for a borrowed blob, the same slice (no comparison).
                        let same = |(module, group): &&mut (usize, Group<'_>)| {
                            *module == i
                                && group.first().is_some_and(|(_, _, first)| {
                                    let (a, b): (&[u8], &[u8]) = (&first.image, &code.image);
                                    std::ptr::eq(a, b) || a == b
                                })
                        };
                        match groups.iter_mut().find(same) {
                            Some((_, group)) => group.push((b, cc, code)),
                            None => groups.push((i, vec![(b, cc, code)])),
                        }
                    }
                    Ok(Vec::new())
                }
            };
            builds.push(Build {
                compute_capability: cc,
                loads,
                compiled,
            });
        }
        let mut loads: Vec<Vec<(usize, Arc<LibraryBlob>, Runs)>> =
            builds.iter().map(|_| Vec::new()).collect();
        for (i, group) in groups {
            let users: Vec<(usize, Runs)> =
                group.iter().map(|(b, _, code)| (*b, code.runs)).collect();
            let mut codes = group.into_iter().map(|(_, cc, code)| (cc, code));
            let Some(first) = codes.next() else {
                continue;
            };
            let blob = Arc::new(LibraryBlob::load(first, codes)?);
            for (b, runs) in users {
                if let Some(build) = loads.get_mut(b) {
                    build.push((i, Arc::clone(&blob), runs));
                }
            }
        }
        for (build, mut loaded) in builds.iter_mut().zip(loads) {
            if let Ok(loads) = &mut build.loads {
                loaded.sort_by_key(|&(i, _, _)| i);
                *loads = loaded
                    .into_iter()
                    .map(|(_, blob, runs)| (blob, runs))
                    .collect();
            }
        }
        Ok(Self {
            names: model.module_names().map(str::to_string).collect(),
            builds: builds.into(),
            preload: model.preloads(),
        })
    }

    /// A registry on device `ordinal` over this load: its modules are the library's modules in
    /// that device's context (`cuLibraryGetModule`), not new loads. The library stays loaded while
    /// any such registry or this value lives.
    ///
    /// A device that runs none of a module's code is refused here, before the driver is called,
    /// as [`AtlasRegistry::load`] refuses it: [`AtlasError::NoBinaryForDevice`] or
    /// [`AtlasError::PtxTooNew`]. The driver compiles PTX here, on the first registry of each
    /// device, not in [`load`](Self::load): PTX that does not compile loads "fine" and fails
    /// here, as an [`AtlasError::ModuleLoad`] carrying the JIT log.
    #[doc(alias = "cuLibraryGetModule")]
    pub fn registry(&self, ordinal: usize) -> Result<AtlasRegistry> {
        let host = host(ordinal)?;
        let cc = host.compute_capability();
        let build = self
            .builds
            .iter()
            .find(|b| b.compute_capability == cc)
            .ok_or_else(|| AtlasError::InvalidModule {
                module: self.names.first().cloned().unwrap_or_default(),
                reason: format!(
                    "the library was built for the devices present at its load, and device \
                     {ordinal} (sm_{}{}) was not among them",
                    cc.0, cc.1
                ),
            })?;
        let loads = build
            .loads
            .as_ref()
            .map_err(|(module, unfit)| unfit.error(module, &host))?;
        let modules = self
            .names
            .iter()
            .zip(loads)
            .map(|(name, (blob, runs))| {
                blob.module_in(&host, name)
                    .map_err(|e| fit::explain(e, name, *runs, &host))
            })
            .collect::<Result<Vec<_>>>()?;
        let registry = AtlasRegistry::from_modules(host, modules, build.compiled.clone());
        if self.preload {
            registry.preload()?;
        }
        Ok(registry)
    }

    /// The names of the modules, in load order.
    pub fn module_names(&self) -> impl ExactSizeIterator<Item = &str> {
        self.names.iter().map(String::as_str)
    }
}

impl fmt::Debug for AtlasLibrary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AtlasLibrary")
            .field("modules", &self.module_names().collect::<Vec<_>>())
            .finish()
    }
}
