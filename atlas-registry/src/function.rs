//! Kernel handles: [`CudaFunction`] (owning), [`FunctionRef`] (borrowed from a registry) and
//! [`RawCudaFunc`] (a plain handle for the raw launch path), and the per-function state they share.

use std::fmt;
use std::ptr::NonNull;
use std::sync::{Arc, OnceLock};

use atlas_sys::{CUcontext, CUfunction, CUresult};

use crate::args::KernelArgs;
use crate::context::ensure_bound;
use crate::driver::{check, driver};
use crate::error::{AtlasError, Result};
use crate::host::{CudaHost, ordinal_of};
use crate::launch::{FunctionName, LaunchConfig, SharedMemOptIn, check_config, launch_kernel};
use crate::registry::RegistryInner;
use crate::stream::CudaStream;

/// A kernel's parameter sizes in bytes, or why nothing can tell them.
pub(crate) type ParamSizes = std::result::Result<Box<[usize]>, String>;

/// What Atlas knows of one function of one loaded module. Lives as long as its registry.
#[derive(Debug)]
pub(crate) struct FunctionEntry {
    pub(crate) raw: CUfunction,
    /// `module::function`.
    pub(crate) name: String,
    /// Where `name`'s module part ends (module names may contain `::` themselves).
    module_len: usize,
    pub(crate) opt_in: SharedMemOptIn,
    /// The layout the module's blob declares, for a driver without `cuFuncGetParamInfo`; `None`
    /// when the module did not read it (the driver can tell).
    from_blob: Option<ParamSizes>,
    /// The parameter sizes, read on first use: from `cuFuncGetParamInfo`, else from the blob.
    params: OnceLock<ParamSizes>,
}

// SAFETY: the CUfunction is a driver handle usable from any thread; the rest is Sync data.
unsafe impl Send for FunctionEntry {}
// SAFETY: as for Send.
unsafe impl Sync for FunctionEntry {}

impl FunctionName for FunctionEntry {
    fn function_name(&self) -> String {
        self.name.clone()
    }
}

impl FunctionEntry {
    pub(crate) fn new(
        raw: CUfunction,
        module: &str,
        function: &str,
        from_blob: Option<ParamSizes>,
    ) -> Self {
        Self {
            raw,
            name: format!("{module}::{function}"),
            module_len: module.len(),
            opt_in: SharedMemOptIn::default(),
            from_blob,
            params: OnceLock::new(),
        }
    }

    /// The module and function names.
    pub(crate) fn parts(&self) -> (&str, &str) {
        let (module, rest) = self.name.split_at(self.module_len);
        (module, &rest[2..])
    }

    /// Whether this is `module::function`.
    #[inline]
    pub(crate) fn is(&self, module: &str, function: &str) -> bool {
        self.module_len == module.len()
            && self.name.len() == module.len() + 2 + function.len()
            && self.name.as_bytes().starts_with(module.as_bytes())
            && self.name.as_bytes().ends_with(function.as_bytes())
    }

    /// The kernel's parameter sizes in bytes, read once: with `cuFuncGetParamInfo` (CUDA 12.4+),
    /// or from the module's blob when the driver lacks it; `Err(reason)` inside when neither can
    /// tell.
    #[inline]
    pub(crate) fn param_sizes(&self, host: &CudaHost) -> Result<&ParamSizes> {
        match self.params.get() {
            Some(sizes) => Ok(sizes),
            None => self.read_param_sizes(host),
        }
    }

    #[cold]
    fn read_param_sizes(&self, host: &CudaHost) -> Result<&ParamSizes> {
        let d = driver()?;
        let Ok(info) = atlas_sys::entry!(d.cuda, cuFuncGetParamInfo) else {
            let from_blob = self.from_blob.clone().unwrap_or_else(|| {
                Err(
                    "the driver lacks cuFuncGetParamInfo and the module's layouts were not read"
                        .into(),
                )
            });
            return Ok(self.params.get_or_init(|| from_blob));
        };
        ensure_bound(host.context().raw())?;
        let mut sizes = Vec::new();
        loop {
            let (mut offset, mut size) = (0usize, 0usize);
            // SAFETY: the function is live (its registry is); both out-pointers are live locals.
            let status = unsafe { info(self.raw, sizes.len(), &mut offset, &mut size) };
            if status == CUresult::CUDA_SUCCESS {
                sizes.push(size);
            } else if status == CUresult::CUDA_ERROR_INVALID_VALUE {
                break;
            } else {
                check(status, "cuFuncGetParamInfo", || format!("`{}`", self.name))?;
            }
        }
        Ok(self.params.get_or_init(|| Ok(sizes.into_boxed_slice())))
    }

    /// Everything a typed launch or a graph argument update checks before the driver is called:
    /// the configuration against the device's limits, the arguments against the kernel's
    /// parameters (count and sizes; refused when nothing can tell them), and that every buffer
    /// argument is memory of the function's context.
    #[inline]
    pub(crate) fn preflight<A: KernelArgs>(
        &self,
        host: &CudaHost,
        cfg: &LaunchConfig,
        args: &A,
    ) -> Result<()> {
        check_config(host, self, cfg)?;
        match self.param_sizes(host)? {
            Ok(expected) if **expected == *A::SIZES => {}
            other => return Err(self.args_refused(other, A::SIZES)),
        }
        match args.foreign_memory(host.context().raw()) {
            None => Ok(()),
            Some((index, context)) => {
                Err(self.wrong_device(host, format!("argument {index}"), context))
            }
        }
    }

    #[cold]
    fn args_refused(&self, layout: &ParamSizes, given: &[usize]) -> AtlasError {
        match layout {
            Ok(expected) => AtlasError::InvalidLaunch {
                function: self.name.clone(),
                reason: format!(
                    "the kernel takes {} parameter(s) of sizes {expected:?} bytes; the launch gives {} of sizes {given:?}",
                    expected.len(),
                    given.len()
                ),
            },
            Err(reason) => AtlasError::ParamsUnknown {
                function: self.name.clone(),
                reason: reason.clone(),
            },
        }
    }

    /// The refusal of a launch whose `what` is in `context` instead of the function's.
    #[cold]
    pub(crate) fn wrong_device(
        &self,
        host: &CudaHost,
        what: String,
        context: CUcontext,
    ) -> AtlasError {
        AtlasError::WrongDevice {
            function: self.name.clone(),
            what,
            expected: host.ordinal(),
            given: ordinal_of(context),
        }
    }

    /// The checked, typed launch.
    ///
    /// # Safety
    ///
    /// As [`CudaFunction::launch`]; `host` is the host of this entry's registry.
    #[inline]
    pub(crate) unsafe fn launch<A: KernelArgs>(
        &self,
        host: &CudaHost,
        stream: &CudaStream,
        cfg: &LaunchConfig,
        args: A,
    ) -> Result<()> {
        if stream.context() != host.context().raw() {
            return Err(self.wrong_device(host, "the stream".into(), stream.context()));
        }
        self.preflight(host, cfg, &args)?;
        // SAFETY: function and stream are live and of `host`'s context (checked above); preflight
        // matched the array to the kernel's parameters, its buffers to that context and `cfg` to
        // the device; what the kernel does with its arguments is the caller's duties 1 and 2.
        args.with_params(|params| unsafe {
            launch_kernel(
                host,
                self.raw,
                &self.opt_in,
                self,
                cfg,
                stream.raw(),
                params,
            )
        })
    }
}

/// A plain, copyable kernel handle for the raw launch path ([`AtlasRegistry::launch_on_stream`]).
///
/// Valid while the registry it came from is alive; it does not keep the module loaded. It
/// remembers that registry: a launch through another registry treats it like a handle made with
/// [`from_raw`](Self::from_raw), never trusting state that registry does not own.
///
/// [`AtlasRegistry::launch_on_stream`]: crate::AtlasRegistry::launch_on_stream
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RawCudaFunc {
    func: CUfunction,
    /// The registry's entry for this function, or null for a handle made with `from_raw`.
    pub(crate) entry: *const FunctionEntry,
    /// The id of the registry that owns `entry`, or 0 for a handle made with `from_raw`.
    pub(crate) registry: u64,
}

// SAFETY: a CUfunction is usable from any thread; the entry pointer is only dereferenced by
// `launch_on_stream` of the registry whose id the handle carries, which owns the entry and is alive
// for that call.
unsafe impl Send for RawCudaFunc {}
// SAFETY: as for Send; the value is immutable.
unsafe impl Sync for RawCudaFunc {}

impl RawCudaFunc {
    pub(crate) fn from_entry(entry: &FunctionEntry, registry: u64) -> Self {
        Self {
            func: entry.raw,
            entry: entry as *const FunctionEntry,
            registry,
        }
    }

    /// Wraps a `CUfunction` obtained elsewhere (for `launch_on_stream` of a registry of the same
    /// context). Launches of it read the function's shared memory limit from the driver each time
    /// they need more than 0 bytes of it.
    pub fn from_raw(func: CUfunction) -> Self {
        Self {
            func,
            entry: std::ptr::null(),
            registry: 0,
        }
    }

    /// The raw `CUfunction`.
    pub fn raw(&self) -> CUfunction {
        self.func
    }
}

impl fmt::Debug for RawCudaFunc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RawCudaFunc({:p})", self.func)
    }
}

/// A kernel that keeps its registry, and so its module, loaded while it lives.
#[derive(Clone)]
pub struct CudaFunction {
    registry: Arc<RegistryInner>,
    /// An entry of `registry`'s function table, which holds it until the registry drops.
    entry: NonNull<FunctionEntry>,
}

// SAFETY: the entry is Send + Sync and lives as long as the registry, which the Arc keeps alive
// wherever the value goes.
unsafe impl Send for CudaFunction {}
// SAFETY: as for Send; shared references only read the entry.
unsafe impl Sync for CudaFunction {}

impl CudaFunction {
    /// A handle to `entry`, which must be an entry of `registry`'s function table.
    pub(crate) fn new(registry: Arc<RegistryInner>, entry: &FunctionEntry) -> Self {
        Self {
            registry,
            entry: NonNull::from(entry),
        }
    }

    #[inline]
    fn entry(&self) -> &FunctionEntry {
        // SAFETY: `entry` is an entry of `self.registry`'s function table (`new`'s contract); the
        // table never drops an entry before itself, and the Arc keeps the registry alive.
        unsafe { self.entry.as_ref() }
    }

    /// `module::function`.
    pub fn name(&self) -> &str {
        &self.entry().name
    }

    /// The plain handle, for the raw launch path.
    pub fn raw(&self) -> RawCudaFunc {
        RawCudaFunc::from_entry(self.entry(), self.registry.id)
    }

    /// A borrowed handle to the same function (for [`GraphExec::set_kernel_args`]).
    ///
    /// [`GraphExec::set_kernel_args`]: crate::GraphExec::set_kernel_args
    pub fn as_function_ref(&self) -> FunctionRef<'_> {
        FunctionRef {
            registry: &self.registry,
            entry: self.entry(),
        }
    }

    /// The kernel's parameter sizes in bytes, read once with `cuFuncGetParamInfo` (CUDA 12.4+) or,
    /// on older drivers, from the module's blob; `None` when neither can tell.
    #[doc(alias = "cuFuncGetParamInfo")]
    pub fn param_sizes(&self) -> Result<Option<&[usize]>> {
        self.as_function_ref().param_sizes()
    }

    /// Launches the kernel on `stream` with `args`, after checking everything Atlas can see (see
    /// the crate's [safety model](crate#safety-model)): the stream and every buffer argument belong
    /// to this function's device, the arguments match the kernel's real parameters in count and
    /// size, and `cfg` fits the device's limits. A refusal is an error and nothing reaches the
    /// driver. No heap allocation, one `cuLaunchKernel`. See [`KernelArgs`] for what an argument
    /// can be.
    ///
    /// # Safety
    ///
    /// 1. Everything the kernel reads or writes through its arguments (the memory their pointers,
    ///    sizes and indexes designate) is valid, in-bounds memory of this function's device.
    /// 2. That memory stays allocated, and is not freed or reused by the host, until the kernel has
    ///    run (synchronize the stream, or an event recorded after the launch).
    #[doc(alias = "cuLaunchKernel")]
    #[inline]
    pub unsafe fn launch<A: KernelArgs>(
        &self,
        stream: &CudaStream,
        cfg: &LaunchConfig,
        args: A,
    ) -> Result<()> {
        // SAFETY: the caller's duties 1 and 2; the host is the registry's own.
        unsafe { self.entry().launch(&self.registry.host, stream, cfg, args) }
    }
}

impl fmt::Debug for CudaFunction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CudaFunction({})", self.entry().name)
    }
}

/// A kernel borrowed from a registry: as [`CudaFunction`], without reference counting. Handed out
/// by the per-call-site caches ([`FunctionCache`](crate::FunctionCache)).
#[derive(Clone, Copy)]
pub struct FunctionRef<'r> {
    pub(crate) registry: &'r RegistryInner,
    pub(crate) entry: &'r FunctionEntry,
}

impl<'r> FunctionRef<'r> {
    /// `module::function`.
    pub fn name(&self) -> &'r str {
        &self.entry.name
    }

    /// The plain handle, for the raw launch path of the registry this was borrowed from.
    pub fn raw(&self) -> RawCudaFunc {
        RawCudaFunc::from_entry(self.entry, self.registry.id)
    }

    /// As [`CudaFunction::param_sizes`].
    #[doc(alias = "cuFuncGetParamInfo")]
    pub fn param_sizes(&self) -> Result<Option<&'r [usize]>> {
        Ok(self.entry.param_sizes(&self.registry.host)?.as_deref().ok())
    }

    /// As [`CudaFunction::launch`].
    ///
    /// # Safety
    ///
    /// As [`CudaFunction::launch`]:
    /// 1. Everything the kernel reads or writes through its arguments is valid, in-bounds memory of
    ///    this function's device.
    /// 2. That memory stays allocated until the kernel has run.
    #[doc(alias = "cuLaunchKernel")]
    #[inline]
    pub unsafe fn launch<A: KernelArgs>(
        &self,
        stream: &CudaStream,
        cfg: &LaunchConfig,
        args: A,
    ) -> Result<()> {
        // SAFETY: the caller's duties 1 and 2; the host is the one of the borrowed registry.
        unsafe { self.entry.launch(&self.registry.host, stream, cfg, args) }
    }
}

impl fmt::Debug for FunctionRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FunctionRef({})", self.entry.name)
    }
}
