//! [`Kernel`]: one function of a loaded module as Atlas knows it (its handle, names, device,
//! parameter sizes and shared memory opt-in), and the one preflight that every typed launch and
//! every graph argument update passes before the driver is called.
//!
//! Every handle to a function ([`CudaFunction`](crate::CudaFunction),
//! [`FunctionRef`](crate::FunctionRef)) dereferences to its registry's `Kernel`, so they share all
//! of this code, and anything that takes a function takes a `&Kernel`.

use std::fmt;
use std::sync::{Arc, OnceLock, Weak};

use atlas_sys::{CUcontext, CUfunction};

use crate::code::module::{BlobParams, ParamSizes};
use crate::device::context::ensure_bound;
use crate::device::host::{CudaHost, ordinal_of};
use crate::device::stream::StreamArg;
use crate::driver::{About, calls};
use crate::error::{AtlasError, LaunchRefusal, Result};
use crate::launch::args::KernelArgs;
use crate::launch::attributes::{LaunchAttributes, LaunchFacts, launch_kernel_ex};
use crate::launch::config::LaunchConfig;
use crate::launch::enqueue::{FunctionName, SharedMemOptIn, check_config, launch_kernel};
use crate::launch::held::{self, GraphHolds};

/// A kernel of a loaded module: what every function handle points to. It lives as long as its
/// registry; handles borrow it ([`FunctionRef`](crate::FunctionRef)) or keep the registry alive
/// ([`CudaFunction`](crate::CudaFunction)).
pub struct Kernel {
    raw: CUfunction,
    /// `module::function`.
    name: String,
    /// Where `name`'s module part ends (module names may contain `::` themselves).
    module_len: usize,
    host: Arc<CudaHost>,
    /// The id of the registry whose function table holds this kernel.
    registry: u64,
    /// That registry's shared state, for a graph that captures a launch of the kernel to keep
    /// (so the module stays loaded); upgraded only then.
    owner: Weak<dyn Send + Sync>,
    opt_in: SharedMemOptIn,
    /// Where the layout the module's blob declares is read from (at the first read of `params`):
    /// the layout for a driver without `cuFuncGetParamInfo`, and how far to ask one that has it.
    from_blob: BlobParams,
    /// The parameter sizes, read on first use: from `cuFuncGetParamInfo`, else from the blob.
    params: OnceLock<ParamSizes>,
    /// What launches with attributes read of the function and keep (cluster dimensions,
    /// cooperative occupancy).
    facts: LaunchFacts,
}

// SAFETY: the CUfunction is a driver handle usable from any thread; the rest is Sync data.
unsafe impl Send for Kernel {}
// SAFETY: as for Send.
unsafe impl Sync for Kernel {}

impl FunctionName for Kernel {
    fn function_name(&self) -> String {
        self.name.clone()
    }
}

impl Kernel {
    /// The kernel `raw` of `module::function` on `host`'s device, held by registry `registry`,
    /// whose shared state `owner` is.
    pub(crate) fn new(
        raw: CUfunction,
        (module, function): (&str, &str),
        host: Arc<CudaHost>,
        (registry, owner): (u64, Weak<dyn Send + Sync>),
        from_blob: BlobParams,
    ) -> Self {
        Self {
            raw,
            name: format!("{module}::{function}"),
            module_len: module.len(),
            host,
            registry,
            owner,
            opt_in: SharedMemOptIn::default(),
            from_blob,
            params: OnceLock::new(),
            facts: LaunchFacts::default(),
        }
    }

    /// `module::function`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The module and function names.
    pub fn parts(&self) -> (&str, &str) {
        let (module, rest) = self.name.split_at(self.module_len);
        (module, &rest[2..])
    }

    /// The raw `CUfunction`, for driver calls Atlas does not wrap; valid while the registry lives.
    pub fn raw(&self) -> CUfunction {
        self.raw
    }

    /// The host of the device the kernel is loaded on.
    pub fn host(&self) -> &Arc<CudaHost> {
        &self.host
    }

    /// The id of the registry that holds this kernel.
    pub(crate) fn registry_id(&self) -> u64 {
        self.registry
    }

    /// Whether this is `module::function`.
    #[inline]
    pub(crate) fn is(&self, module: &str, function: &str) -> bool {
        self.module_len == module.len()
            && self.name.len() == module.len() + 2 + function.len()
            && self.name.as_bytes().starts_with(module.as_bytes())
            && self.name.as_bytes().ends_with(function.as_bytes())
    }

    /// The kernel's parameter sizes in bytes, read once with `cuFuncGetParamInfo` (CUDA 12.4+), as
    /// many as the module's blob declares when the driver agrees with each (else to the driver's
    /// last) or, on older drivers, from the blob; `None` when neither can tell.
    #[doc(alias = "cuFuncGetParamInfo")]
    pub fn param_sizes(&self) -> Result<Option<&[usize]>> {
        Ok(self.layout()?.as_deref().ok())
    }

    /// The parameter sizes, or why nothing can tell them, read once.
    #[inline]
    pub(crate) fn layout(&self) -> Result<&ParamSizes> {
        match self.params.get() {
            Some(sizes) => Ok(sizes),
            None => self.read_layout(),
        }
    }

    #[cold]
    fn read_layout(&self) -> Result<&ParamSizes> {
        let from_blob = self.from_blob.sizes(self.parts().0);
        if !calls::has_param_info() {
            return Ok(self.params.get_or_init(|| from_blob));
        }
        ensure_bound(self.host.context().raw())?;
        // The driver's sizes, read up to the blob's count when each agrees with the blob: asking
        // one index past the last is answered with an error, which compute-sanitizer reports
        // (CUDA 13.0 has no entry point for the count). When the blob cannot tell, or differs,
        // the walk goes on to the driver's end.
        let bound = from_blob.as_deref().ok();
        let mut sizes = Vec::new();
        while bound != Some(&sizes[..]) {
            // SAFETY: the function is live (its registry is, as `&self` is).
            match unsafe { calls::param_info(self.raw, sizes.len()) }
                .about(|| format!("`{}`", self.name))?
            {
                Some((_, size)) => sizes.push(size),
                None => break,
            }
        }
        Ok(self.params.get_or_init(|| Ok(sizes.into_boxed_slice())))
    }

    /// Everything a typed launch or a graph argument update checks before the driver is called:
    /// the configuration against the device's limits, the arguments against the kernel's
    /// parameters (count and sizes; refused when nothing can tell them), that every buffer
    /// argument is memory of the function's context; then the shared memory opt-in `cfg` needs.
    #[inline]
    pub(crate) fn preflight<A: KernelArgs>(&self, cfg: &LaunchConfig, args: &A) -> Result<()> {
        check_config(&self.host, self, cfg)?;
        match self.layout()? {
            Ok(expected) if **expected == *A::SIZES => {}
            other => return Err(self.args_refused(other, A::SIZES)),
        }
        if let Some((index, context)) = args.foreign_memory(self.host.context().raw()) {
            return Err(self.wrong_device(format!("argument {index}"), context));
        }
        // SAFETY: the function is live and of the host's context (it is this registry's).
        unsafe {
            self.opt_in
                .ensure(&self.host, self.raw, cfg.shared_mem_bytes)
        }
    }

    #[cold]
    fn args_refused(&self, layout: &ParamSizes, given: &[usize]) -> AtlasError {
        match layout {
            Ok(expected) => AtlasError::InvalidLaunch {
                function: self.name.clone(),
                reason: LaunchRefusal::Arguments {
                    expected: expected.clone(),
                    given: given.into(),
                },
            },
            Err(reason) => AtlasError::ParamsUnknown {
                function: self.name.clone(),
                reason: reason.clone(),
            },
        }
    }

    /// The refusal of a launch whose `what` is in `context` instead of the function's.
    #[cold]
    pub(crate) fn wrong_device(&self, what: String, context: CUcontext) -> AtlasError {
        AtlasError::WrongDevice {
            function: self.name.clone(),
            what,
            expected: self.host.ordinal(),
            given: ordinal_of(context),
        }
    }

    /// The refusal of a raw launch with `given` parameter pointers, when the kernel's count is
    /// known and differs; `Ok` otherwise.
    #[inline]
    pub(crate) fn check_param_count(&self, given: usize) -> Result<()> {
        match self.layout()? {
            Ok(sizes) if sizes.len() != given => Err(AtlasError::InvalidLaunch {
                function: self.name.clone(),
                reason: LaunchRefusal::ParamCount {
                    expected: sizes.len(),
                    given,
                },
            }),
            _ => Ok(()),
        }
    }

    /// The per-function shared memory opt-in state, for the raw launch path.
    pub(crate) fn opt_in(&self) -> &SharedMemOptIn {
        &self.opt_in
    }

    /// What launches with attributes keep of the function, for the raw launch path.
    pub(crate) fn facts(&self) -> &LaunchFacts {
        &self.facts
    }

    /// Adds what a graph needs to launch this kernel, its registry, to `holds`.
    pub(crate) fn hold_for_graph(&self, holds: &mut GraphHolds) {
        holds.registry(&self.owner);
    }

    /// Launches the kernel on `stream` with `args`, after checking everything Atlas can see (see
    /// the crate's [safety model](crate#safety-model)): the stream and every buffer argument belong
    /// to this function's device, the arguments match the kernel's real parameters in count and
    /// size, and `cfg` fits the device's limits. A refusal is an error and nothing reaches the
    /// driver. No heap allocation, one `cuLaunchKernel`. See [`KernelArgs`] for what an argument
    /// can be. `stream` is a `&CudaStream` or a raw `CUstream` ([`StreamArg`]).
    ///
    /// On a stream being captured (a capture Atlas began), the launch is recorded into the graph
    /// and the kernel runs at each replay instead. The graph then keeps this kernel's registry
    /// (so its module stays loaded) and the memory of every [`DeviceBuffer`](crate::DeviceBuffer)
    /// argument for as long as it lives (see [`CudaGraph`](crate::CudaGraph)). That costs a lock
    /// and a reference per captured launch; outside a capture a launch takes neither.
    ///
    /// # Safety
    ///
    /// 1. Everything the kernel reads or writes through its arguments (the memory their pointers,
    ///    sizes and indexes designate) is valid, in-bounds memory of this function's device.
    /// 2. That memory stays allocated, and is not freed or reused by the host, until the kernel has
    ///    run (synchronize the stream, or an event recorded after the launch). For a captured
    ///    launch, the kernel runs at each replay: memory the graph does not keep (addresses passed
    ///    as integers) is the caller's to keep, as [`GraphExec::launch`](crate::GraphExec::launch)
    ///    asks.
    /// 3. A raw `CUstream` is a live stream of this function's context, or null (a `&CudaStream`
    ///    is checked instead).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn f(registry: &atlas_registry::AtlasRegistry) -> atlas_registry::Result<()> {
    /// use atlas_registry::{DeviceBuffer, LaunchConfig};
    /// let (stream, n) = (registry.stream(), 1000u32);
    /// let mut x = DeviceBuffer::from_slice(registry.ctx(), stream, &vec![1.0f32; n as usize])?;
    /// let scale = registry.function_cached("elementwise", "scale")?; // scale(float*, float, unsigned)
    /// let cfg = LaunchConfig::for_elements(n, 256);
    /// // SAFETY: `scale` touches the `n` floats `x` holds; `to_vec` waits for it on the same stream.
    /// unsafe { scale.launch(stream, &cfg, (&mut x, 2.0f32, n))? };
    /// // The same launch on the raw handle of the registry's stream:
    /// // SAFETY: as above; the raw stream is a live stream of the function's context.
    /// unsafe { scale.launch(registry.raw_stream(), &cfg, (&mut x, 2.0f32, n))? };
    /// assert_eq!(x.to_vec(stream)?[0], 4.0);
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuLaunchKernel")]
    #[inline]
    pub unsafe fn launch<A: KernelArgs>(
        &self,
        stream: impl StreamArg,
        cfg: &LaunchConfig,
        args: A,
    ) -> Result<()> {
        let (stream, context) = stream.stream_in(self.host.context().raw());
        if context != self.host.context().raw() {
            return Err(self.wrong_device("the stream".into(), context));
        }
        self.preflight(cfg, &args)?;
        let gather = |holds: &mut GraphHolds| {
            self.hold_for_graph(holds);
            args.hold_for_graph(holds);
        };
        held::enqueue(stream, false, gather, || {
            // Function and stream are live and of the host's context (checked above, or duty 3); preflight
            // matched the array to the kernel's parameters, its buffers to that context and `cfg`
            // to the device, and made the shared memory opt-in.
            // SAFETY: as just said; what the kernel does with its arguments is duties 1 and 2.
            args.with_params(|params| unsafe {
                launch_kernel(&self.host, self.raw, self, cfg, stream, params)
            })
        })
    }
}

impl Kernel {
    /// As [`launch`](Self::launch), with launch attributes (programmatic dependent launch,
    /// clusters, cooperative, priority, memory synchronization domain): every check of a typed
    /// launch, then the attributes' own against the device and the kernel (see
    /// [`LaunchAttributes`]: compute capability, cluster shape and size, co-resident blocks,
    /// priority range); a refusal is an [`AtlasError::InvalidLaunch`] with a
    /// [`LaunchRefusal::Attribute`] reason and nothing reaches the driver. Then one
    /// `cuLaunchKernelEx` (CUDA 12.0+; an older driver is an [`AtlasError::MissingSymbol`]
    /// naming it), its attribute array on the stack: no heap allocation.
    ///
    /// A cooperative launch reads the kernel's occupancy for its block size and shared memory
    /// once (`cuOccupancyMaxActiveBlocksPerMultiprocessor`) and again only when they change; a
    /// cluster launch reads the kernel's `__cluster_dims__` once.
    ///
    /// Captured, it is recorded into the graph as [`launch`](Self::launch) is, attributes
    /// included: an argument update of that node ([`GraphExec::set_kernel_args`](crate::GraphExec::set_kernel_args))
    /// checks its cluster dimensions and cooperative grid again.
    ///
    /// # Safety
    ///
    /// 1. Everything the kernel reads or writes through its arguments (the memory their pointers,
    ///    sizes and indexes designate) is valid, in-bounds memory of this function's device.
    /// 2. That memory stays allocated, and is not freed or reused by the host, until the kernel has
    ///    run (synchronize the stream, or an event recorded after the launch); captured, as for
    ///    [`launch`](Self::launch).
    /// 3. A raw `CUstream` is a live stream of this function's context, or null (a `&CudaStream`
    ///    is checked instead).
    #[doc(alias = "cuLaunchKernelEx")]
    #[inline]
    pub unsafe fn launch_with<A: KernelArgs>(
        &self,
        stream: impl StreamArg,
        cfg: &LaunchConfig,
        attrs: &LaunchAttributes,
        args: A,
    ) -> Result<()> {
        let (stream, context) = stream.stream_in(self.host.context().raw());
        if context != self.host.context().raw() {
            return Err(self.wrong_device("the stream".into(), context));
        }
        self.preflight(cfg, &args)?;
        // SAFETY: the function is live and of the host's context (it is this registry's).
        unsafe { attrs.check(&self.host, self.raw, &self.facts, self, cfg) }?;
        let gather = |holds: &mut GraphHolds| {
            self.hold_for_graph(holds);
            args.hold_for_graph(holds);
        };
        held::enqueue(stream, attrs.constrains_grid(), gather, || {
            // Function and stream are live and of the host's context (checked above, or duty 3); preflight
            // matched the array to the kernel's parameters, its buffers to that context and `cfg`
            // to the device, and made the shared memory opt-in; the attributes passed their check.
            // SAFETY: as just said; an event among the attributes is live in this context
            // (`LaunchAttributes::programmatic_event`'s duty); the kernel's use of its arguments
            // is duties 1 and 2.
            args.with_params(|params| unsafe {
                launch_kernel_ex(&self.host, self.raw, self, cfg, attrs, stream, params)
            })
        })
    }
}

impl fmt::Debug for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Kernel({})", self.name)
    }
}
