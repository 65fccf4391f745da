//! [`AtlasLibrary`]: one load of a model for every GPU (`cuLibraryLoadData`), and a registry per
//! device made from that one load.

use std::fmt;
use std::sync::Arc;

use crate::code::library::LibraryBlob;
use crate::device::host::{compute_capabilities, host};
use crate::error::{AtlasError, Result};
use crate::registry::AtlasRegistry;
use crate::registry::model::{Compiled, Model, kernel_names_if_needed};

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
    /// One build of the model per architecture its sources were compiled for (one build, for
    /// every device, when it has no sources).
    builds: Arc<[Build]>,
    preload: bool,
}

/// The model's modules for the devices of one compute capability (`None`: every device).
struct Build {
    compute_capability: Option<(u32, u32)>,
    /// One load per module, in order; a blob's load is shared by every build.
    loads: Vec<Arc<LibraryBlob>>,
    compiled: Compiled,
    /// For preloading on a driver that cannot list a module's functions: each module's kernels.
    kernel_names: Option<Vec<Vec<String>>>,
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

    /// Loads a [`Model`] once for every device: its blobs as [`load`](Self::load) does, and its
    /// sources compiled once per architecture present among the devices (each loaded with
    /// `cuLibraryLoadData`; see [`AtlasRegistry::load_model`] for the compile, its cache and
    /// errors). [`registry`](Self::registry) gives a device the build of its architecture; with
    /// [`Model::preload`], every kernel is resolved there.
    pub fn load_model(model: &Model<'_>) -> Result<Self> {
        let checked = model.check_blobs(false)?;
        let mut capabilities = compute_capabilities()?;
        capabilities.sort_unstable();
        capabilities.dedup();
        // Each architecture present is prepared: its sources compiled, and its fatbin entries
        // checked (before anything is loaded, as `prepare` refuses a blob).
        let mut all = Vec::with_capacity(capabilities.len());
        for &cc in &capabilities {
            all.push((cc, model.prepare(checked.clone(), cc)?));
        }
        // Blobs are the same for every architecture: one build serves all devices without
        // sources.
        let archs: Vec<Option<(u32, u32)>> = if model.has_sources() {
            capabilities.iter().copied().map(Some).collect()
        } else {
            vec![None]
        };
        let mut builds: Vec<Build> = Vec::with_capacity(archs.len());
        for compute_capability in archs {
            let cc = compute_capability.or(capabilities.first().copied());
            let Some(prepared) = all
                .iter()
                .find(|(prepared_for, _)| Some(*prepared_for) == cc)
                .map(|(_, prepared)| prepared)
            else {
                break;
            };
            let loads = prepared
                .modules
                .iter()
                .enumerate()
                .map(
                    |(i, (name, kind, image))| match (&checked[i], builds.first()) {
                        // A blob is the same for every architecture: loaded once.
                        (Some(_), Some(first)) => Ok(Arc::clone(&first.loads[i])),
                        _ => Ok(Arc::new(LibraryBlob::load(
                            name,
                            *kind,
                            image,
                            &capabilities,
                        )?)),
                    },
                )
                .collect::<Result<Vec<_>>>()?;
            builds.push(Build {
                compute_capability,
                loads,
                compiled: prepared.compiled(),
                kernel_names: if model.preloads() {
                    kernel_names_if_needed(&prepared.modules, cc.unwrap_or_default())
                } else {
                    None
                },
            });
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
    /// The driver compiles PTX here, on the first registry of each device, not in
    /// [`load`](Self::load): PTX that does not compile loads "fine" and fails here, as an
    /// [`AtlasError::ModuleLoad`](crate::AtlasError::ModuleLoad) carrying the JIT log.
    #[doc(alias = "cuLibraryGetModule")]
    pub fn registry(&self, ordinal: usize) -> Result<AtlasRegistry> {
        let host = host(ordinal)?;
        let cc = host.compute_capability();
        let build = self
            .builds
            .iter()
            .find(|b| b.compute_capability.is_none_or(|built| built == cc))
            .ok_or_else(|| AtlasError::InvalidModule {
                module: self.names.first().cloned().unwrap_or_default(),
                reason: format!(
                    "the library's sources were compiled for the devices present at its load, and \
                     device {ordinal} (sm_{}{}) was not among them",
                    cc.0, cc.1
                ),
            })?;
        let modules = self
            .names
            .iter()
            .zip(&build.loads)
            .map(|(name, blob)| blob.module_in(&host, name))
            .collect::<Result<Vec<_>>>()?;
        let registry = AtlasRegistry::from_modules(host, modules, build.compiled.clone());
        if self.preload {
            registry.preload(build.kernel_names.as_deref())?;
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
