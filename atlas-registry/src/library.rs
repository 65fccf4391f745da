//! One load for every GPU: a model's blobs loaded once with `cuLibraryLoadData`, independent of any
//! context, and a registry per device made from that one load.

use std::fmt;
use std::sync::Arc;

use atlas_sys::{CUlibrary, CUmodule, CUresult};

use crate::blob::{BlobKind, code_targets};
use crate::driver::{cu, driver};
use crate::error::{AtlasError, Result, report_cleanup};
use crate::host::{CudaHost, host};
use crate::module::{
    BlobLayouts, Module, layouts_if_needed, no_binary_for, retry_with_log, with_jit_log,
};
use crate::registry::AtlasRegistry;

/// One blob loaded as a context-independent library; unloaded when its last user goes.
#[derive(Debug)]
pub(crate) struct LibraryBlob {
    raw: CUlibrary,
    kind: BlobKind,
    /// As [`Module`]'s: the blob's kernel layouts, read only when the driver cannot tell them.
    blob_layouts: Option<Arc<BlobLayouts>>,
    /// What is kept of the blob to explain a failure of `cuLibraryGetModule`, where the driver
    /// first compiles or picks code for a device.
    kept: Kept,
}

/// What a [`LibraryBlob`] keeps of its blob.
#[derive(Debug)]
enum Kept {
    /// The PTX image, NUL-terminated: when the deferred JIT fails, it is compiled once more with a
    /// log buffer, so that the error carries the JIT log.
    Ptx(Box<[u8]>),
    /// For binaries, what code they hold (`sm_80 SASS`), for a device that can run none of it.
    Targets(String),
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

    /// The error for `cuLibraryGetModule` failing with `status` for module `name` on `host`'s
    /// device (its context current): for code of other architectures, which; for PTX, the JIT is
    /// run again with a log buffer (`cuModuleLoadDataEx`, unloaded again at once should it
    /// succeed) so that the error is an [`AtlasError::ModuleLoad`] with the JIT log; otherwise the
    /// driver's error.
    #[cold]
    pub(crate) fn explain(&self, host: &CudaHost, name: &str, status: CUresult) -> AtlasError {
        let plain = || {
            AtlasError::from_call(
                "cuLibraryGetModule",
                format!("module `{name}` on device {}", host.ordinal()),
                status.0,
            )
        };
        let image = match &self.kept {
            Kept::Ptx(ptx) => ptx,
            Kept::Targets(holds) if status == CUresult::CUDA_ERROR_NO_BINARY_FOR_GPU => {
                return no_binary_for(host, name, holds.clone());
            }
            Kept::Targets(_) => return plain(),
        };
        let Ok(cuda) = driver() else {
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
            image,
            Some(host),
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
        let prepared = AtlasRegistry::prepare_all(blobs)?;
        let load = atlas_sys::entry!(driver()?.cuda, cuLibraryLoadData)?;
        let mut loaded = Vec::with_capacity(blobs.len());
        for ((name, _), (kind, image)) in blobs.iter().zip(prepared) {
            let mut raw: CUlibrary = std::ptr::null_mut();
            with_jit_log(
                "cuLibraryLoadData",
                name,
                &image,
                None,
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
            let blob_layouts = layouts_if_needed(&image);
            let kept = match kind {
                BlobKind::Ptx => Kept::Ptx(image.into_owned().into_boxed_slice()),
                _ => Kept::Targets(code_targets(&image)),
            };
            loaded.push((
                name.to_string(),
                Arc::new(LibraryBlob {
                    raw,
                    kind,
                    blob_layouts,
                    kept,
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
            .map(|(name, blob)| Module::from_library(&host, name, Arc::clone(blob)))
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
