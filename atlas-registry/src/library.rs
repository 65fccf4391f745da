//! One load for every GPU: a model's blobs loaded once with `cuLibraryLoadData`, independent of any
//! context, and a registry per device made from that one load.

use std::fmt;
use std::sync::Arc;

use atlas_sys::{CUlibrary, CUmodule, CUresult};

use crate::blob::{self, BlobKind};
use crate::context::CudaContext;
use crate::driver::{cu, driver};
use crate::error::{AtlasError, Result, report_cleanup};
use crate::host::host;
use crate::module::{BlobLayouts, Module, layouts_if_needed, retry_with_log, with_jit_log};
use crate::registry::AtlasRegistry;

/// One blob loaded as a context-independent library; unloaded when its last user goes.
#[derive(Debug)]
pub(crate) struct LibraryBlob {
    raw: CUlibrary,
    kind: BlobKind,
    /// As [`Module`]'s: the blob's kernel layouts, read only when the driver cannot tell them.
    blob_layouts: Option<Arc<BlobLayouts>>,
    /// The PTX image, NUL-terminated, kept for a PTX blob only: `cuLibraryLoadData` defers the JIT
    /// to the first `cuLibraryGetModule`, and when that fails the image is compiled once more with
    /// a log buffer, so that the error carries the JIT log.
    ptx: Option<Box<[u8]>>,
}

// SAFETY: a CUlibrary is context-independent and usable from any thread; it is unloaded only in
// drop, when no other reference exists.
unsafe impl Send for LibraryBlob {}
// SAFETY: shared references only ask for the library's module in a context.
unsafe impl Sync for LibraryBlob {}

impl LibraryBlob {
    pub(crate) fn raw(&self) -> CUlibrary {
        self.raw
    }

    pub(crate) fn kind(&self) -> BlobKind {
        self.kind
    }

    pub(crate) fn blob_layouts(&self) -> Option<Arc<BlobLayouts>> {
        self.blob_layouts.clone()
    }

    /// The error for `cuLibraryGetModule` failing with `status` for module `name` in `context`
    /// (current): for PTX, the JIT is run again with a log buffer (`cuModuleLoadDataEx`, unloaded
    /// again at once should it succeed) so that the error is an [`AtlasError::ModuleLoad`] with the
    /// JIT log; otherwise the driver's error.
    #[cold]
    pub(crate) fn explain(
        &self,
        context: &CudaContext,
        name: &str,
        status: CUresult,
    ) -> AtlasError {
        let plain = || {
            AtlasError::from_call(
                "cuLibraryGetModule",
                format!("module `{name}` on device {}", context.ordinal()),
                status.0,
            )
        };
        let (Some(ptx), Ok(cuda)) = (&self.ptx, driver()) else {
            return plain();
        };
        let (Ok(load_ex), Ok(unload)) = (
            atlas_sys::entry!(cuda.cuda, cuModuleLoadDataEx),
            atlas_sys::entry!(cuda.cuda, cuModuleUnload),
        ) else {
            return plain();
        };
        let mut raw: CUmodule = std::ptr::null_mut();
        let retried = retry_with_log(
            "cuLibraryGetModule",
            name,
            status,
            ptx,
            &mut |image, count, options, values| {
                // SAFETY: `image` is the checked, NUL-terminated PTX; the options and values are
                // matching arrays of `count`; the caller made the context current.
                unsafe { load_ex(&mut raw, image, count, options, values) }
            },
        );
        match retried {
            Err(with_log) => with_log,
            Ok(()) => {
                // SAFETY: `raw` was loaded just above and is unloaded once, here.
                let _ = unsafe { unload(raw) };
                plain()
            }
        }
    }
}

impl Drop for LibraryBlob {
    fn drop(&mut self) {
        let raw = self.raw;
        // SAFETY: the library was loaded by this value and is unloaded only here.
        let result = unsafe { cu!(cuLibraryUnload(raw)) };
        report_cleanup("unloading a library", result);
    }
}

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
    /// [`AtlasRegistry::load`]; a JIT failure carries the JIT log.
    #[doc(alias = "cuLibraryLoadData")]
    pub fn load(blobs: &[(&str, &[u8])]) -> Result<Self> {
        AtlasRegistry::check_unique(blobs)?;
        let load = atlas_sys::entry!(driver()?.cuda, cuLibraryLoadData)?;
        let mut loaded = Vec::with_capacity(blobs.len());
        for (name, blob) in blobs {
            let mut raw: CUlibrary = std::ptr::null_mut();
            let kind = with_jit_log(
                "cuLibraryLoadData",
                name,
                blob,
                &mut |image, count, options, values| {
                    // SAFETY: `image` is a checked blob (PTX NUL-terminated); the JIT options and values
                    // are matching arrays of `count`; no library options.
                    unsafe {
                        load(
                            &mut raw,
                            image,
                            options,
                            values,
                            count,
                            std::ptr::null_mut(),
                            std::ptr::null_mut(),
                            0,
                        )
                    }
                },
            )?;
            loaded.push((
                name.to_string(),
                Arc::new(LibraryBlob {
                    raw,
                    kind,
                    blob_layouts: layouts_if_needed(blob),
                    ptx: (kind == BlobKind::Ptx)
                        .then(|| blob::prepare(name, blob).ok())
                        .flatten()
                        .map(|(_, image)| image.into_owned().into_boxed_slice()),
                }),
            ));
        }
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
            .map(|(name, blob)| Module::from_library(host.context(), name, Arc::clone(blob)))
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
