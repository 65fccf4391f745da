//! [`AtlasLibrary`]: one load of a model for every GPU (`cuLibraryLoadData`), and a registry per
//! device made from that one load.

use std::fmt;
use std::sync::Arc;

use crate::code::blob;
use crate::code::library::LibraryBlob;
use crate::device::host::{compute_capabilities, host};
use crate::error::Result;
use crate::registry::AtlasRegistry;

/// A model loaded once for every device (`cuLibraryLoadData`, CUDA 12.0+): no context is needed
/// to load it, and [`registry`](Self::registry) gives each device an [`AtlasRegistry`] over that
/// one load, with the same functions, caches and launches as a registry loaded per device.
///
/// ```no_run
/// use atlas_registry::AtlasLibrary;
///
/// # fn main() -> atlas_registry::Result<()> {
/// let library = AtlasLibrary::load(atlas_kernels::ptx_for_model("demo").unwrap())?;
/// let on_gpu0 = library.registry(0)?;
/// let on_gpu1 = library.registry(1)?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct AtlasLibrary {
    blobs: Arc<[(String, Arc<LibraryBlob>)]>,
}

impl AtlasLibrary {
    /// Loads each `(module name, blob)` once, for every device. Blobs are checked as by
    /// [`AtlasRegistry::load`], the code of a fatbin's entries for every device present: the
    /// driver may pick an entry for any of them, so each device's refusal is made here, before
    /// the driver sees the blob (devices of the same compute capability are checked once). A JIT
    /// failure carries the JIT log.
    #[doc(alias = "cuLibraryLoadData")]
    pub fn load(blobs: &[(&str, &[u8])]) -> Result<Self> {
        let prepared = AtlasRegistry::prepare_all(blobs, false)?;
        let capabilities = compute_capabilities()?;
        for ((name, _), blob) in blobs.iter().zip(&prepared) {
            for &capability in &capabilities {
                blob::check_for_device(name, blob, capability)?;
            }
        }
        let loaded = blobs
            .iter()
            .zip(prepared)
            .map(|((name, _), blob)| {
                let library = LibraryBlob::load(name, blob.kind, &blob.image, &capabilities)?;
                Ok((name.to_string(), Arc::new(library)))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            blobs: loaded.into(),
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
        let modules = self
            .blobs
            .iter()
            .map(|(name, blob)| blob.module_in(&host, name))
            .collect::<Result<Vec<_>>>()?;
        Ok(AtlasRegistry::from_modules(host, modules))
    }

    /// The names of the modules, in load order.
    pub fn module_names(&self) -> impl ExactSizeIterator<Item = &str> {
        self.blobs.iter().map(|(name, _)| name.as_str())
    }
}

impl fmt::Debug for AtlasLibrary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AtlasLibrary")
            .field("modules", &self.module_names().collect::<Vec<_>>())
            .finish()
    }
}
