//! Kernel handles: [`CudaFunction`] (owning), [`FunctionRef`] (borrowed from a registry) and
//! [`RawCudaFunc`] (a plain handle for the raw launch path), and the per-function state they share.

use std::fmt;
use std::sync::{Arc, OnceLock};

use atlas_sys::{CUfunction, CUresult};

use crate::args::KernelArgs;
use crate::context::ensure_bound;
use crate::driver::{check, driver};
use crate::error::{AtlasError, Result};
use crate::host::CudaHost;
use crate::launch::{FunctionName, LaunchConfig, SharedMemOptIn, launch_kernel};
use crate::registry::RegistryInner;
use crate::stream::CudaStream;

/// `CUDA_ERROR_INVALID_VALUE`: what `cuFuncGetParamInfo` returns past the last parameter.
const INVALID_VALUE: u32 = 1;

/// What Atlas knows of one function of one loaded module. Lives as long as its registry.
#[derive(Debug)]
pub(crate) struct FunctionEntry {
    pub(crate) raw: CUfunction,
    /// `module::function`.
    pub(crate) name: String,
    /// Where `name`'s module part ends (module names may contain `::` themselves).
    module_len: usize,
    pub(crate) opt_in: SharedMemOptIn,
    /// The parameter sizes from `cuFuncGetParamInfo`, or `None` when the driver lacks it.
    params: OnceLock<Option<Box<[usize]>>>,
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
    pub(crate) fn new(raw: CUfunction, module: &str, function: &str) -> Self {
        Self {
            raw,
            name: format!("{module}::{function}"),
            module_len: module.len(),
            opt_in: SharedMemOptIn::default(),
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

    /// The kernel's parameter sizes in bytes, read once with `cuFuncGetParamInfo` (CUDA 12.4+);
    /// `None` when the driver does not have it.
    #[inline]
    pub(crate) fn param_sizes(&self, host: &CudaHost) -> Result<Option<&[usize]>> {
        match self.params.get() {
            Some(sizes) => Ok(sizes.as_deref()),
            None => self.read_param_sizes(host),
        }
    }

    #[cold]
    fn read_param_sizes(&self, host: &CudaHost) -> Result<Option<&[usize]>> {
        let d = driver()?;
        let Ok(info) = atlas_sys::entry!(d.cuda, cuFuncGetParamInfo) else {
            return Ok(self.params.get_or_init(|| None).as_deref());
        };
        ensure_bound(host.context().raw())?;
        let mut sizes = Vec::new();
        loop {
            let (mut offset, mut size) = (0usize, 0usize);
            // SAFETY: the function is live (its registry is); both out-pointers are live locals.
            let status = unsafe { info(self.raw, sizes.len(), &mut offset, &mut size) };
            if status == CUresult::CUDA_SUCCESS {
                sizes.push(size);
            } else if status.0 == INVALID_VALUE {
                break;
            } else {
                check(status, "cuFuncGetParamInfo", || format!("`{}`", self.name))?;
            }
        }
        Ok(self
            .params
            .get_or_init(|| Some(sizes.into_boxed_slice()))
            .as_deref())
    }

    /// `Ok` when `given` matches the kernel's parameters in count and size (or the driver cannot
    /// tell), else an error naming the kernel and both layouts.
    #[inline]
    pub(crate) fn check_args(&self, host: &CudaHost, given: &[usize]) -> Result<()> {
        match self.param_sizes(host)? {
            Some(expected) if expected != given => Err(self.args_mismatch(expected, given)),
            _ => Ok(()),
        }
    }

    #[cold]
    fn args_mismatch(&self, expected: &[usize], given: &[usize]) -> AtlasError {
        AtlasError::InvalidLaunch {
            function: self.name.clone(),
            reason: format!(
                "the kernel takes {} parameter(s) of sizes {expected:?} bytes; the launch gives {} of sizes {given:?}",
                expected.len(),
                given.len()
            ),
        }
    }

    /// The checked, typed launch.
    #[inline]
    pub(crate) fn launch<A: KernelArgs>(
        &self,
        host: &CudaHost,
        stream: &CudaStream,
        cfg: &LaunchConfig,
        args: A,
    ) -> Result<()> {
        self.check_args(host, A::SIZES)?;
        // SAFETY: the function is live (its registry is borrowed or owned by the caller), the
        // stream is live (borrowed), and the parameter array matches the kernel's parameter sizes
        // (checked above, when the driver can tell).
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
/// Valid while the registry it came from is alive; it does not keep the module loaded.
///
/// [`AtlasRegistry::launch_on_stream`]: crate::AtlasRegistry::launch_on_stream
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RawCudaFunc {
    func: CUfunction,
    /// The registry's entry for this function, or null for a handle made with `from_raw`.
    pub(crate) entry: *const FunctionEntry,
}

// SAFETY: a CUfunction is usable from any thread; the entry pointer is only dereferenced by
// `launch_on_stream`, whose caller guarantees the registry (which owns the entry) is alive.
unsafe impl Send for RawCudaFunc {}
// SAFETY: as for Send; the value is immutable.
unsafe impl Sync for RawCudaFunc {}

impl RawCudaFunc {
    pub(crate) fn from_entry(entry: &FunctionEntry) -> Self {
        Self {
            func: entry.raw,
            entry: entry as *const FunctionEntry,
        }
    }

    /// Wraps a `CUfunction` obtained elsewhere (for `launch_on_stream` of a registry of the same
    /// context). Launches of it read the function's shared memory limit from the driver each time
    /// they need more than 0 bytes of it.
    pub fn from_raw(func: CUfunction) -> Self {
        Self {
            func,
            entry: std::ptr::null(),
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
    pub(crate) registry: Arc<RegistryInner>,
    pub(crate) entry: Arc<FunctionEntry>,
}

impl CudaFunction {
    /// `module::function`.
    pub fn name(&self) -> &str {
        &self.entry.name
    }

    /// The plain handle, for the raw launch path.
    pub fn raw(&self) -> RawCudaFunc {
        RawCudaFunc::from_entry(&self.entry)
    }

    /// A borrowed handle to the same function (for [`GraphExec::set_kernel_args`]).
    ///
    /// [`GraphExec::set_kernel_args`]: crate::GraphExec::set_kernel_args
    pub fn as_function_ref(&self) -> FunctionRef<'_> {
        FunctionRef {
            host: &self.registry.host,
            entry: &self.entry,
        }
    }

    /// The kernel's parameter sizes in bytes (`cuFuncGetParamInfo`, read once), or `None` when the
    /// driver is older than CUDA 12.4.
    #[doc(alias = "cuFuncGetParamInfo")]
    pub fn param_sizes(&self) -> Result<Option<&[usize]>> {
        self.entry.param_sizes(&self.registry.host)
    }

    /// Launches the kernel on `stream` with `args` after checking them against the kernel's real
    /// parameters (count and sizes, when the driver can tell) and `cfg` against the device's limits.
    /// See [`KernelArgs`] for what an argument can be. No heap allocation, one driver call.
    ///
    /// What the kernel does with its arguments is the kernel's contract: Atlas checks sizes, not
    /// meanings (a `u64` where a pointer is expected has the same size).
    #[doc(alias = "cuLaunchKernel")]
    pub fn launch<A: KernelArgs>(
        &self,
        stream: &CudaStream,
        cfg: &LaunchConfig,
        args: A,
    ) -> Result<()> {
        self.entry.launch(&self.registry.host, stream, cfg, args)
    }
}

impl fmt::Debug for CudaFunction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CudaFunction({})", self.entry.name)
    }
}

/// A kernel borrowed from a registry: as [`CudaFunction`], without reference counting. Handed out
/// by the per-call-site caches ([`FunctionCache`](crate::FunctionCache)).
#[derive(Clone, Copy)]
pub struct FunctionRef<'r> {
    pub(crate) host: &'r CudaHost,
    pub(crate) entry: &'r FunctionEntry,
}

impl FunctionRef<'_> {
    /// `module::function`.
    pub fn name(&self) -> &str {
        &self.entry.name
    }

    /// The plain handle, for the raw launch path.
    pub fn raw(&self) -> RawCudaFunc {
        RawCudaFunc::from_entry(self.entry)
    }

    /// As [`CudaFunction::launch`].
    #[doc(alias = "cuLaunchKernel")]
    #[inline]
    pub fn launch<A: KernelArgs>(
        &self,
        stream: &CudaStream,
        cfg: &LaunchConfig,
        args: A,
    ) -> Result<()> {
        self.entry.launch(self.host, stream, cfg, args)
    }
}

impl fmt::Debug for FunctionRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FunctionRef({})", self.entry.name)
    }
}
