//! [`AtlasLibrary`]: one load of a model for every GPU (`cuLibraryLoadData`), and a registry per
//! device made from that one load.

use std::fmt;
use std::sync::Arc;

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
        let mut compiled = Vec::with_capacity(capabilities.len());
        let mut codes: Vec<Vec<((u32, u32), ModuleCode<'_>)>> =
            checked.iter().map(|_| Vec::new()).collect();
        for &cc in &capabilities {
            let prepared = model.prepare(checked.clone(), cc)?;
            compiled.push(prepared.compiled());
            for (module, code) in codes.iter_mut().zip(prepared.modules) {
                module.push((cc, code));
            }
        }
        // Blobs are the same for every architecture: one build serves all devices without
        // sources, and a blob is loaded once, with its layouts for every architecture.
        let sources = model.has_sources();
        let count = if sources {
            capabilities.len()
        } else {
            capabilities.len().min(1)
        };
        let mut loads: Vec<Vec<Arc<LibraryBlob>>> = vec![Vec::with_capacity(codes.len()); count];
        for (blob, codes) in checked.iter().zip(codes) {
            if blob.is_some() {
                let mut codes = codes.into_iter();
                let Some(first) = codes.next() else {
                    continue;
                };
                let load = Arc::new(LibraryBlob::load(first, codes)?);
                for build in &mut loads {
                    build.push(Arc::clone(&load));
                }
            } else {
                for (build, code) in loads.iter_mut().zip(codes) {
                    build.push(Arc::new(LibraryBlob::load(code, [])?));
                }
            }
        }
        let builds: Vec<Build> = loads
            .into_iter()
            .zip(compiled)
            .zip(capabilities)
            .map(|((loads, compiled), cc)| Build {
                compute_capability: sources.then_some(cc),
                loads,
                compiled,
            })
            .collect();
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
