//! One blob loaded with `cuLibraryLoadData`, independent of any context: [`LibraryBlob`], whose
//! module in each context is a view of that one load.

use std::sync::Arc;

use atlas_sys::{CUlibrary, CUresult};

use crate::code::blob::{BlobKind, code_targets};
use crate::code::fit::no_binary_for;
use crate::code::jit::{retry_with_log, with_jit_log};
use crate::code::layout::BlobLayouts;
use crate::code::module::{Module, ModuleCode};
use crate::device::host::CudaHost;
use crate::driver::{self, calls};
use crate::error::{AtlasError, Result, report_cleanup};

/// One blob loaded as a context-independent library; unloaded when its last user goes.
#[derive(Debug)]
pub(crate) struct LibraryBlob {
    raw: CUlibrary,
    kind: BlobKind,
    /// As a module's: the blob's kernel layouts for each compute capability of the devices
    /// present.
    blob_layouts: Vec<((u32, u32), Arc<BlobLayouts>)>,
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
    /// Loads `code`, a module's checked blob for devices of compute capability `cc`, for every
    /// context; `others` is the same blob checked for devices of other compute capabilities that
    /// load it too. Each comes with its kernel layouts.
    pub(crate) fn load<'a>(
        (cc, code): ((u32, u32), ModuleCode<'a>),
        others: impl IntoIterator<Item = ((u32, u32), ModuleCode<'a>)>,
    ) -> Result<Self> {
        let (name, kind, image) = (code.name.as_str(), code.kind, &*code.image);
        // SAFETY: `image` passed validation (PTX NUL-terminated).
        let raw = with_jit_log(name, image, None, |log| unsafe {
            calls::library_load(image, log)
        })?;
        let kept = match kind {
            BlobKind::Ptx => Kept::Ptx(image.into()),
            _ => Kept::Targets(code_targets(image)),
        };
        Ok(Self {
            raw,
            kind,
            blob_layouts: std::iter::once((cc, code))
                .chain(others)
                .map(|(cc, code)| (cc, code.into_layouts(cc).1))
                .collect(),
            kept,
        })
    }

    /// The library's module `name` in `host`'s context (`cuLibraryGetModule`): a view of the one
    /// library load, which keeps the library alive.
    pub(crate) fn module_in(self: &Arc<Self>, host: &CudaHost, name: &str) -> Result<Module> {
        let context = host.context();
        context.bind()?;
        // SAFETY: the library is loaded (`self` keeps it); the context is current (above).
        let raw = match unsafe { calls::library_module(self.raw) } {
            Ok(raw) => raw,
            Err(e) => return Err(self.explain(host, name, e)),
        };
        Ok(Module::library_view(
            raw,
            name,
            self.kind,
            context.raw(),
            self.layouts_for(host.compute_capability()),
            Arc::clone(self) as Arc<dyn Send + Sync>,
        ))
    }

    /// The blob's kernel layouts on a device of `compute_capability`.
    fn layouts_for(&self, compute_capability: (u32, u32)) -> Arc<BlobLayouts> {
        let found = self
            .blob_layouts
            .iter()
            .find(|(cc, _)| *cc == compute_capability)
            .map(|(_, layouts)| Arc::clone(layouts));
        found.unwrap_or_else(|| {
            Arc::new(BlobLayouts::unknown(format!(
                "no device of compute capability {}.{} was present when the library was loaded",
                compute_capability.0, compute_capability.1
            )))
        })
    }

    /// The error for `cuLibraryGetModule` failing with `error` for module `name` on `host`'s
    /// device (its context current): for code of other architectures, which; for PTX, the JIT is
    /// run again with a log buffer (`cuModuleLoadDataEx`, unloaded again at once should it
    /// succeed) so that the error is an [`AtlasError::ModuleLoad`] with the JIT log; otherwise the
    /// driver's error.
    #[cold]
    fn explain(&self, host: &CudaHost, name: &str, error: driver::Error) -> AtlasError {
        let code = error.code();
        let plain = |error: driver::Error| -> AtlasError {
            error
                .about(|| format!("module `{name}` on device {}", host.ordinal()))
                .into()
        };
        let image = match &self.kept {
            Kept::Ptx(ptx) => ptx,
            Kept::Targets(holds) if code == Some(CUresult::CUDA_ERROR_NO_BINARY_FOR_GPU.0) => {
                return no_binary_for(host, name, holds.clone());
            }
            Kept::Targets(_) => return plain(error),
        };
        let retried = retry_with_log(name, error.clone(), image, Some(host), |log| {
            // SAFETY: `image` is the checked, NUL-terminated PTX; the caller made the context
            // current.
            unsafe { calls::module_load(image, log) }
        });
        match retried {
            Err(with_log) => with_log,
            Ok(module) => {
                // SAFETY: `module` was loaded just above, in the current context, and is unloaded
                // once, here.
                let _ = unsafe { calls::module_unload(module) };
                plain(error)
            }
        }
    }
}

impl Drop for LibraryBlob {
    fn drop(&mut self) {
        // SAFETY: the library was loaded by this value and is unloaded only here, after its last
        // module view (each holds an Arc of this value).
        let result = unsafe { calls::library_unload(self.raw) };
        report_cleanup("unloading a library", result.map_err(Into::into));
    }
}
