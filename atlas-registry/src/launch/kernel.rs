//! [`Kernel`]: one function of a loaded module as Atlas knows it (its handle, names, device,
//! parameter sizes and shared memory opt-in), and the one preflight that every typed launch and
//! every graph argument update passes before the driver is called; what the driver says of the
//! compiled function ([`FunctionAttributes`]) and its occupancy.
//!
//! Every handle to a function ([`CudaFunction`](crate::CudaFunction),
//! [`FunctionRef`](crate::FunctionRef)) dereferences to its registry's `Kernel`, so they share all
//! of this code, and anything that takes a function takes a `&Kernel`.

use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use atlas_sys::{CUcontext, CUfunction, CUfunction_attribute as FuncAttr, CUstream};

use crate::code::dependency_wait::DependencyWait;
use crate::code::layout::param_bank_offset;
use crate::code::module::{BlobParams, ParamLayout, ParamSizes};
use crate::device::capture;
use crate::device::context::ensure_bound;
use crate::device::host::{CudaHost, ordinal_of};
use crate::device::stream::{StreamArg, is_default};
use crate::driver::{About, calls};
use crate::error::{ArgumentMismatch, AtlasError, LaunchRefusal, LimitError, Result};
use crate::flight_recorder::name_number;
use crate::launch::args::{KernelArgs, fits};
use crate::launch::attributes::{
    LaunchAttributes, LaunchFacts, blocks_per_multiprocessor, launch_kernel_ex,
};
use crate::launch::config::LaunchConfig;
use crate::launch::enqueue::{
    FunctionName, Known, Params, SharedMemOptIn, check_config, launch_bound, launch_kernel,
};
use crate::launch::held::{self, GraphHolds};
use crate::launch::large_params::{self, CLASSIC_PARAM_BYTES};

/// A kernel of a loaded module: what every function handle points to. It lives as long as its
/// registry; handles borrow it ([`FunctionRef`](crate::FunctionRef)) or keep the registry alive
/// ([`CudaFunction`](crate::CudaFunction)).
///
/// # Examples
///
/// ```no_run
/// # fn f(registry: &atlas_registry::AtlasRegistry) -> atlas_registry::Result<()> {
/// use atlas_registry::Kernel;
/// let scale = registry.function_cached("elementwise", "scale")?;
/// let kernel: &Kernel = &scale; // what every handle dereferences to
/// assert_eq!(kernel.parts(), ("elementwise", "scale"));
/// assert_eq!(kernel.param_sizes()?, Some(&[8, 4, 4][..])); // float*, float, unsigned int
/// let attributes = kernel.attributes()?;
/// println!("{} registers a thread, at most {} threads a block", attributes.registers,
///     attributes.max_threads_per_block);
/// # Ok(()) }
/// ```
#[repr(C, align(64))]
pub struct Kernel {
    // What every launch reads comes first, in the struct's first cache line (the driver's call
    // evicts what a launch read before it, so each line costs a miss on every launch).
    raw: CUfunction,
    host: Arc<CudaHost>,
    /// The argument types whose sizes and alignments last matched the layout, as the address of
    /// their [`Checked::KEY`] (0 for none yet): a launch with the same types skips
    /// comparing them again. The layout never changes once read, so the match holds for good.
    checked: AtomicUsize,
    /// The id of the registry whose function table holds this kernel.
    registry: u64,
    opt_in: SharedMemOptIn,
    /// The number the flight recorder knows `name` by.
    recorded_name: u32,
    /// `module::function`.
    name: String,
    /// Where `name`'s module part ends (module names may contain `::` themselves).
    module_len: usize,
    /// That registry's shared state, for a graph that captures a launch of the kernel to keep
    /// (so the module stays loaded); upgraded only then.
    owner: Weak<dyn Send + Sync>,
    /// Where the layout the module's blob declares is read from (at the first read of `params`):
    /// the layout for a driver without `cuFuncGetParamInfo`, and how far to ask one that has it.
    from_blob: BlobParams,
    /// The parameter layout, read on first use: from `cuFuncGetParamInfo`, else from the blob.
    params: OnceLock<ParamSizes>,
    /// What launches with attributes read of the function and keep (cluster dimensions,
    /// cooperative occupancy).
    facts: LaunchFacts,
}

/// The sizes and alignments of argument types `A` in one constant, whose address stands for both
/// in [`Kernel`]'s `checked`: equal constants may share one address, different ones never do
/// (a constant's memory lives as long as the program), so a key that matches is a match of the
/// same sizes and alignments.
struct Checked<A>(PhantomData<A>);

impl<A: KernelArgs> Checked<A> {
    const KEY: &'static [&'static [usize]; 2] = &[A::SIZES, A::ALIGNS];

    /// The key as `checked` holds it. A constant used in two functions may be two copies at two
    /// addresses, so a launch takes its key once and hands it down: the key it compares and the
    /// one it stores are the same.
    #[inline(always)]
    fn key() -> usize {
        Self::KEY as *const _ as usize
    }
}

// SAFETY: the CUfunction is a driver handle usable from any thread; the rest is Sync data.
unsafe impl Send for Kernel {}
// SAFETY: as for Send.
unsafe impl Sync for Kernel {}

impl FunctionName for Kernel {
    fn function_name(&self) -> String {
        self.name.clone()
    }

    fn dependency_wait(&self) -> DependencyWait {
        Kernel::dependency_wait(self)
    }

    #[inline]
    fn recorded_as(&self) -> (u32, u64) {
        (self.recorded_name, self.registry)
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
            checked: AtomicUsize::new(0),
            name: format!("{module}::{function}"),
            module_len: module.len(),
            host,
            registry,
            owner,
            opt_in: SharedMemOptIn::default(),
            from_blob,
            params: OnceLock::new(),
            facts: LaunchFacts::default(),
            recorded_name: name_number(module, function),
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
        Ok(self.layout()?.as_ref().ok().map(|layout| &*layout.sizes))
    }

    /// Whether the kernel's code waits for the grid it depends on before it reads that grid's
    /// results (PTX `griddepcontrol.wait`, CUDA C++ `cudaGridDependencySynchronize()`), as its
    /// module's blob shows: what a programmatic dependent launch of it is checked against (see
    /// [`LaunchAttributes::programmatic_stream_serialization`]). Read from the blob with its
    /// parameter layouts (at their first need), then kept; what can and cannot be seen is
    /// listed at [`kernel_dependency_waits`](crate::kernel_dependency_waits).
    pub fn dependency_wait(&self) -> DependencyWait {
        self.facts
            .dependency_wait(|| self.from_blob.dependency_wait())
    }

    /// The parameter layout, or why nothing can tell it, read once.
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
        ensure_bound(self.host.raw_context())?;
        // The driver's sizes, read up to the blob's count when each agrees with the blob: asking
        // one index past the last is answered with an error, which compute-sanitizer reports
        // (CUDA 13.0 has no entry point for the count). When the blob cannot tell, or differs,
        // the walk goes on to the driver's end.
        let bound = from_blob.as_ref().ok().map(|layout| &*layout.sizes);
        let (mut sizes, mut offsets) = (Vec::new(), Vec::new());
        while bound != Some(&sizes[..]) {
            // SAFETY: the function is live (its registry is, as `&self` is).
            match unsafe { calls::param_info(self.raw, sizes.len()) }
                .about(|| format!("`{}`", self.name))?
            {
                Some((offset, size)) => {
                    sizes.push(size);
                    offsets.push(offset);
                }
                None => break,
            }
        }
        let layout = ParamLayout::new(sizes.into_boxed_slice(), offsets.into_boxed_slice());
        Ok(self.params.get_or_init(|| Ok(layout)))
    }

    /// Everything a typed launch or a graph argument update checks before the driver is called:
    /// the configuration against the device's limits, arguments past 4,096 bytes against what
    /// large parameters need (a constant of the argument types: no cost for smaller ones), the
    /// arguments against the kernel's parameters (count and sizes, refused when nothing can tell
    /// them; and where an argument needs it, a tensor map, the parameter's alignment), that every
    /// buffer argument is memory of the function's context; then the shared memory opt-in `cfg`
    /// needs.
    #[inline]
    pub(crate) fn preflight<A: KernelArgs>(&self, cfg: &LaunchConfig, args: &A) -> Result<()> {
        self.preflight_keyed(cfg, args, Checked::<A>::key())
    }

    /// [`preflight`](Self::preflight) with the key of `A` ([`Checked::key`]) its caller took.
    #[inline]
    fn preflight_keyed<A: KernelArgs>(
        &self,
        cfg: &LaunchConfig,
        args: &A,
        key: usize,
    ) -> Result<()> {
        check_config(&self.host, self, cfg)?;
        if A::BYTES > CLASSIC_PARAM_BYTES
            && let Some(refusal) = large_params::check_device(&self.host, A::BYTES)?
        {
            return Err(self.refused(refusal.into()));
        }
        if self.checked.load(Ordering::Relaxed) != key {
            self.check_args::<A>()?;
            self.checked.store(key, Ordering::Relaxed);
        }
        if let Some((index, context)) = args.foreign_memory(self.host.raw_context()) {
            return Err(self.wrong_device(format!("argument {index}"), context));
        }
        // SAFETY: the function is live and of the host's context (it is this registry's).
        unsafe {
            self.opt_in
                .ensure(&self.host, self.raw, cfg.shared_mem_bytes)
        }
    }

    /// `Ok` when arguments of types `A` fit the kernel's parameters: their count and sizes, and
    /// where one needs it (a tensor map), the parameter's alignment.
    #[inline(never)]
    fn check_args<A: KernelArgs>(&self) -> Result<()> {
        match self.layout()? {
            Ok(expected) if *expected.sizes == *A::SIZES => {
                if A::ALIGNED {
                    self.check_alignment(expected, A::ALIGNS)?;
                }
                Ok(())
            }
            other => Err(self.args_refused(other, A::SIZES, A::type_name)),
        }
    }

    /// `Ok` when every argument that needs an aligned parameter (`aligns[i] > 1`: a tensor map)
    /// has one: the parameter's place in the constant bank (where the device's architecture
    /// starts the parameters, plus its offset) is a multiple of the alignment. On an architecture
    /// newer than Atlas knows, where the parameters start is unknown and nothing is checked.
    fn check_alignment(&self, layout: &ParamLayout, aligns: &[usize]) -> Result<()> {
        let Some(bank_offset) = param_bank_offset(self.host.compute_capability()) else {
            return Ok(());
        };
        let misplaced =
            aligns
                .iter()
                .zip(&layout.offsets)
                .enumerate()
                .find(|&(_, (&align, &offset))| {
                    align > 1 && !(bank_offset + offset).is_multiple_of(align)
                });
        match misplaced {
            Some((index, (&align, &offset))) => Err(AtlasError::InvalidLaunch {
                function: self.name.clone(),
                reason: LaunchRefusal::ParamAlignment {
                    index,
                    align,
                    offset,
                    bank_offset,
                },
            }),
            None => Ok(()),
        }
    }

    /// The refusal of arguments of `given` sizes and types (`type_name`, as
    /// [`KernelArgs::type_name`]) that do not fit `layout`: the first place they disagree, with
    /// what the kernel's PTX declares there.
    #[cold]
    fn args_refused(
        &self,
        layout: &ParamSizes,
        given: &[usize],
        type_name: fn(usize) -> Option<&'static str>,
    ) -> AtlasError {
        match layout {
            Ok(expected) => {
                self.refused(match large_params::kernel_limit(&expected.sizes, given) {
                    Some(refusal) => refusal.into(),
                    None => {
                        let index = (0..expected.sizes.len().max(given.len()))
                            .find(|&i| expected.sizes.get(i) != given.get(i))
                            .unwrap_or(0);
                        let in_ptx = self.from_blob.declared();
                        // Only where the PTX agrees with the layout in count: another
                        // declaration's names would mislead.
                        let declared = (in_ptx.len() == expected.sizes.len())
                            .then(|| in_ptx.get(index))
                            .flatten();
                        let size = expected.sizes.get(index).copied();
                        LaunchRefusal::Arguments {
                            expected: expected.sizes.clone(),
                            given: given.into(),
                            first: Box::new(ArgumentMismatch {
                                index,
                                expected: size,
                                given: given.get(index).copied(),
                                given_type: type_name(index),
                                ptx_name: declared.and_then(|d| d.name()).map(str::to_owned),
                                ptx_type: declared.map(ToString::to_string),
                                fits: size.map(|size| fits(size, declared)).unwrap_or_default(),
                            }),
                        }
                    }
                })
            }
            Err(reason) => AtlasError::ParamsUnknown {
                function: self.name.clone(),
                reason: reason.clone(),
            },
        }
    }

    /// The refusal of a launch of this kernel, for `reason`.
    #[cold]
    pub(crate) fn refused(&self, reason: LaunchRefusal) -> AtlasError {
        AtlasError::InvalidLaunch {
            function: self.name.clone(),
            reason,
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
            Ok(layout) if layout.sizes.len() != given => Err(AtlasError::InvalidLaunch {
                function: self.name.clone(),
                reason: LaunchRefusal::ParamCount {
                    expected: layout.sizes.len(),
                    given,
                },
            }),
            _ => Ok(()),
        }
    }

    /// The parameter layout when it was read and known, for the flight recorder of the raw
    /// launch path: never reads it.
    #[inline]
    pub(crate) fn known_layout(&self) -> Known<'_> {
        match self.params.get() {
            Some(Ok(layout)) => Known::Layout(layout),
            _ => Known::Nothing,
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
    /// Arguments may take up to [`MAX_PARAM_BYTES`](crate::MAX_PARAM_BYTES) (32,764) together,
    /// a large [`DeviceCopy`](crate::DeviceCopy) struct passed by value included; past 4,096
    /// bytes the launch is refused, with a [`LargeParamsRefusal`](crate::LargeParamsRefusal),
    /// on a driver older than CUDA 12.1, a device older than compute capability 7.0, or for a
    /// kernel whose own parameters take no more than 4,096 bytes.
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
        let (stream, context) = stream.stream_in(self.host.raw_context());
        let key = Checked::<A>::key();
        if self.ready(stream, context, cfg, &args, key) {
            // `ready` holds: the stream is of the host's context and not a default one (nothing
            // to make current), every check of `launch_checked` passed (for `A` once and for
            // good, for `cfg` and the arguments now), the function may use the shared memory and
            // no capture Atlas began is in progress (the launch is not captured).
            // SAFETY: as just said, the function and stream are live (the registry's, or duty 3);
            // what the kernel does with its arguments is duties 1 and 2.
            return args.with_params(|array| unsafe {
                let params = Params::typed(array, A::SIZES, false, &args);
                launch_bound(&self.host, self.raw, self, cfg, stream, params)
            });
        }
        // SAFETY: the caller's duties.
        unsafe { self.launch_checked(stream, context, cfg, args, key) }
    }

    /// Whether a launch of `args` (of key `key`) with `cfg` on `stream` (of `context`) passes every check of
    /// [`launch_checked`](Self::launch_checked) with nothing else to do first: the stream is of
    /// this function's context and not a default one, the arguments are not large parameters and
    /// their types matched the layout before, their memory is of this context, `cfg` fits the
    /// device and the function's shared memory limit, and no capture Atlas began is in progress.
    /// Every condition is computed and combined without a branch between them: a launch that
    /// passes takes one branch and the lines these read, and the rest stays out of its way.
    #[inline(always)]
    fn ready<A: KernelArgs>(
        &self,
        stream: CUstream,
        context: CUcontext,
        cfg: &LaunchConfig,
        args: &A,
        key: usize,
    ) -> bool {
        let own = self.host.raw_context();
        (A::BYTES <= CLASSIC_PARAM_BYTES)
            & (context == own)
            & !is_default(stream)
            & self.host.limits().fits(cfg)
            & (self.checked.load(Ordering::Relaxed) == key)
            & args.all_in(own)
            & self.opt_in.allows(cfg.shared_mem_bytes)
            & !capture::watch().capturing()
    }

    /// The launch with every check made in turn, each refusal named, and what a first launch does
    /// once (read the layout, raise the shared memory limit), a default stream (make the context
    /// current) and a captured one (leave the graph what it must keep) need.
    ///
    /// # Safety
    ///
    /// 1. As [`launch`](Self::launch); `stream` and `context` are what its stream argument gave,
    ///    `key` is `A`'s ([`Checked::key`]).
    #[cold]
    #[inline(never)]
    unsafe fn launch_checked<A: KernelArgs>(
        &self,
        stream: CUstream,
        context: CUcontext,
        cfg: &LaunchConfig,
        args: A,
        key: usize,
    ) -> Result<()> {
        if context != self.host.raw_context() {
            return Err(self.wrong_device("the stream".into(), context));
        }
        self.preflight_keyed(cfg, &args, key)?;
        let gather = |holds: &mut GraphHolds| {
            self.hold_for_graph(holds);
            args.hold_for_graph(holds);
        };
        held::enqueue(stream, false, gather, |captured| {
            // Function and stream are live and of the host's context (checked above, or duty 3); preflight
            // matched the array to the kernel's parameters, its buffers to that context and `cfg`
            // to the device, and made the shared memory opt-in.
            // SAFETY: as just said; what the kernel does with its arguments is duties 1 and 2.
            args.with_params(|array| unsafe {
                let params = Params::typed(array, A::SIZES, captured, &args);
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
        let (stream, context) = stream.stream_in(self.host.raw_context());
        if context != self.host.raw_context() {
            return Err(self.wrong_device("the stream".into(), context));
        }
        self.preflight(cfg, &args)?;
        // SAFETY: the function is live and of the host's context (it is this registry's).
        unsafe { attrs.check(&self.host, self.raw, &self.facts, self, cfg) }?;
        let gather = |holds: &mut GraphHolds| {
            self.hold_for_graph(holds);
            args.hold_for_graph(holds);
        };
        held::enqueue(stream, attrs.constrains_grid(), gather, |captured| {
            // Function and stream are live and of the host's context (checked above, or duty 3); preflight
            // matched the array to the kernel's parameters, its buffers to that context and `cfg`
            // to the device, and made the shared memory opt-in; the attributes passed their check.
            // SAFETY: as just said; an event among the attributes is live in this context
            // (`LaunchAttributes::programmatic_event`'s duty); the kernel's use of its arguments
            // is duties 1 and 2.
            args.with_params(|array| unsafe {
                let params = Params::typed(array, A::SIZES, captured, &args);
                launch_kernel_ex(&self.host, self.raw, self, cfg, attrs, stream, params)
            })
        })
    }
}

/// What the driver says of a compiled kernel (`cuFuncGetAttribute`), read by
/// [`Kernel::attributes`].
///
/// # Examples
///
/// ```no_run
/// # fn f(registry: &atlas_registry::AtlasRegistry) -> atlas_registry::Result<()> {
/// let kernel = registry.function_cached("block_reduce", "block_sum")?;
/// let attributes = kernel.attributes()?;
/// println!(
///     "{} registers/thread, {} B static shared, {} B local/thread, blocks up to {} threads",
///     attributes.registers,
///     attributes.static_shared_bytes,
///     attributes.local_bytes,
///     attributes.max_threads_per_block
/// );
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct FunctionAttributes {
    /// Most threads a block of this kernel may have (`CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK`):
    /// the device's limit, or fewer for a kernel of many registers or with `__launch_bounds__`.
    pub max_threads_per_block: u32,
    /// Registers per thread (`CU_FUNC_ATTRIBUTE_NUM_REGS`).
    pub registers: u32,
    /// Static shared memory per block, in bytes (`CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES`).
    pub static_shared_bytes: u32,
    /// Constant memory the kernel uses, in bytes (`CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES`).
    pub const_bytes: u32,
    /// Local memory per thread, in bytes (`CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES`): register spills
    /// and arrays the compiler could not keep in registers.
    pub local_bytes: u32,
    /// Most dynamic shared memory a launch may use now, in bytes
    /// (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`): 48 KiB less the static shared memory
    /// until the opt-in raises it, which Atlas does for the first launch (or occupancy question)
    /// that needs more.
    pub max_dynamic_shared_bytes: u32,
    /// The PTX version the kernel was compiled for, as `(major, minor)` from the driver's
    /// `10 * major + minor` (`CU_FUNC_ATTRIBUTE_PTX_VERSION`; the virtual architecture in
    /// practice: `(7, 5)` for `compute_75` PTX).
    pub ptx_version: (u32, u32),
    /// The architecture of the binary code that runs, as `(major, minor)`
    /// (`CU_FUNC_ATTRIBUTE_BINARY_VERSION`): `(9, 0)` for `sm_90` SASS, the device's for PTX the
    /// driver compiled.
    pub binary_version: (u32, u32),
}

impl Kernel {
    /// What the driver says of the compiled kernel: registers, static, constant and local memory,
    /// block and dynamic shared memory limits, PTX and binary versions. One `cuFuncGetAttribute`
    /// per field (eight driver calls, no other), read at each call and never kept: the dynamic
    /// shared memory limit changes with the opt-in, which launches make.
    #[doc(alias = "cuFuncGetAttribute")]
    pub fn attributes(&self) -> Result<FunctionAttributes> {
        let read = |attribute: FuncAttr| {
            // SAFETY: the function is live (its registry is, as `&self` is).
            let value = unsafe { calls::function_attribute(self.raw, attribute) }
                .about(|| format!("`{}`, function attribute {}", self.name, attribute.0))?;
            Ok::<_, AtlasError>(u32::try_from(value).unwrap_or(0))
        };
        let version = |value: u32| (value / 10, value % 10);
        Ok(FunctionAttributes {
            max_threads_per_block: read(FuncAttr::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
            registers: read(FuncAttr::CU_FUNC_ATTRIBUTE_NUM_REGS)?,
            static_shared_bytes: read(FuncAttr::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
            const_bytes: read(FuncAttr::CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES)?,
            local_bytes: read(FuncAttr::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
            max_dynamic_shared_bytes: read(
                FuncAttr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            )?,
            ptx_version: version(read(FuncAttr::CU_FUNC_ATTRIBUTE_PTX_VERSION)?),
            binary_version: version(read(FuncAttr::CU_FUNC_ATTRIBUTE_BINARY_VERSION)?),
        })
    }

    /// How many blocks of `block_threads` threads, each with `dynamic_shared_bytes` of dynamic
    /// shared memory, one multiprocessor runs at once
    /// (`cuOccupancyMaxActiveBlocksPerMultiprocessor`); 0 when such a block does not fit (more
    /// threads than the kernel's [`max_threads_per_block`](FunctionAttributes::max_threads_per_block),
    /// more shared memory than a multiprocessor has).
    ///
    /// Refused before the driver is called, as an [`AtlasError::Occupancy`], for a block no
    /// launch could have: 0 threads, more threads than the device's
    /// [`max_threads_per_block`](crate::DeviceLimits::max_threads_per_block), more dynamic shared
    /// memory than its [`max_shared_mem_optin`](crate::DeviceLimits::max_shared_mem_optin). For
    /// more than the kernel may use without the opt-in, the opt-in is made first, as a launch of
    /// that size makes it, so that the answer is that launch's occupancy. Then one driver call
    /// (`cuCtxGetCurrent` before it, and `cuCtxSetCurrent` only when another context is current).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn f(registry: &atlas_registry::AtlasRegistry) -> atlas_registry::Result<()> {
    /// let kernel = registry.function_cached("elementwise", "scale")?;
    /// let blocks = kernel.active_blocks_per_multiprocessor(256, 0)?;
    /// let sms = kernel.host().limits().multiprocessors;
    /// println!("{} blocks of 256 threads fill the device", blocks * sms);
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuOccupancyMaxActiveBlocksPerMultiprocessor")]
    pub fn active_blocks_per_multiprocessor(
        &self,
        block_threads: u32,
        dynamic_shared_bytes: u32,
    ) -> Result<u32> {
        self.check_occupancy_question(Some(block_threads), dynamic_shared_bytes)?;
        // SAFETY: the function is live and of the host's context (it is this registry's).
        unsafe {
            self.opt_in
                .ensure(&self.host, self.raw, dynamic_shared_bytes)?;
            blocks_per_multiprocessor(&self.host, self.raw, block_threads, dynamic_shared_bytes)
        }
    }

    /// The block size that runs the most threads of this kernel on each multiprocessor at once,
    /// each block with `dynamic_shared_bytes` of dynamic shared memory, and at most
    /// `block_size_limit` threads when given (`cuOccupancyMaxPotentialBlockSize`, no per-size
    /// shared memory callback). Returns `(min_grid_size, block_size)`: `min_grid_size` blocks of
    /// `block_size` threads fill every multiprocessor of the device at that occupancy (blocks per
    /// multiprocessor × multiprocessors); a grid of fewer leaves some idle.
    ///
    /// Refused before the driver is called, as an [`AtlasError::Occupancy`], for more dynamic
    /// shared memory than the device's
    /// [`max_shared_mem_optin`](crate::DeviceLimits::max_shared_mem_optin) and for a limit of 0
    /// threads or of more than the device's
    /// [`max_threads_per_block`](crate::DeviceLimits::max_threads_per_block). The opt-in for
    /// `dynamic_shared_bytes` is made first, as in
    /// [`active_blocks_per_multiprocessor`](Self::active_blocks_per_multiprocessor); then one
    /// driver call.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn f(registry: &atlas_registry::AtlasRegistry) -> atlas_registry::Result<()> {
    /// use atlas_registry::LaunchConfig;
    /// let scale = registry.function_cached("elementwise", "scale")?;
    /// let (min_grid, block) = scale.max_potential_block_size(0, None)?;
    /// let n = 1u32 << 24;
    /// // One element per thread: the grid covers `n`, and never leaves a multiprocessor idle.
    /// let grid = n.div_ceil(block).max(min_grid);
    /// let cfg = LaunchConfig { grid: (grid, 1, 1), block: (block, 1, 1), shared_mem_bytes: 0 };
    /// # let _ = cfg; Ok(()) }
    /// ```
    #[doc(alias = "cuOccupancyMaxPotentialBlockSize")]
    pub fn max_potential_block_size(
        &self,
        dynamic_shared_bytes: u32,
        block_size_limit: Option<u32>,
    ) -> Result<(u32, u32)> {
        self.check_occupancy_question(block_size_limit, dynamic_shared_bytes)?;
        // SAFETY: the function is live and of the host's context (it is this registry's).
        unsafe {
            self.opt_in
                .ensure(&self.host, self.raw, dynamic_shared_bytes)
        }?;
        ensure_bound(self.host.raw_context())?;
        // The limit was checked against the device's threads per block, which fits an i32.
        let limit = block_size_limit.unwrap_or(0) as i32;
        // SAFETY: the function is live and its context current (above).
        let (min_grid, block) = unsafe {
            calls::max_potential_block_size(self.raw, dynamic_shared_bytes as usize, limit)
        }
        .about(|| {
            format!(
                "`{}`, best block size with {dynamic_shared_bytes} B dynamic shared memory",
                self.name
            )
        })?;
        Ok((
            u32::try_from(min_grid).unwrap_or(0),
            u32::try_from(block).unwrap_or(0),
        ))
    }

    /// `Ok` when a block of `block_threads` threads (when given) and `dynamic_shared_bytes` of
    /// dynamic shared memory is one the device can launch, else the [`AtlasError::Occupancy`]
    /// naming the limit.
    fn check_occupancy_question(
        &self,
        block_threads: Option<u32>,
        dynamic_shared_bytes: u32,
    ) -> Result<()> {
        let limits = self.host.limits();
        let refusal = match block_threads {
            Some(0) => Some(LimitError::ZeroBlock((0, 1, 1))),
            Some(threads) if threads > limits.max_threads_per_block => {
                Some(LimitError::BlockThreads {
                    block: (threads, 1, 1),
                    threads: u64::from(threads),
                    max: limits.max_threads_per_block,
                })
            }
            _ if dynamic_shared_bytes > limits.max_shared_mem_optin => {
                Some(LimitError::SharedMemory {
                    bytes: dynamic_shared_bytes,
                    max: limits.max_shared_mem_optin,
                })
            }
            _ => None,
        };
        match refusal {
            Some(reason) => Err(AtlasError::Occupancy {
                function: self.name.clone(),
                reason,
            }),
            None => Ok(()),
        }
    }
}

impl fmt::Debug for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Kernel({})", self.name)
    }
}
