//! [`LaunchAttributes`]: what a launch asks of the driver beyond grid, block and shared memory
//! (programmatic dependent launch, thread block clusters, cooperative launch, priority, memory
//! synchronization domain); their checks against the device and the kernel before the driver is
//! called; the attribute array that `cuLaunchKernelEx` takes, built on the stack; and the launch
//! with them.
//!
//! A launch without attributes stays one `cuLaunchKernel`; only a launch that is given attributes
//! ([`Kernel::launch_with`](crate::Kernel::launch_with),
//! [`AtlasRegistry::launch_on_stream_with`](crate::AtlasRegistry::launch_on_stream_with)) goes
//! through `cuLaunchKernelEx` (CUDA 12.0+).

use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use atlas_sys::{
    CUevent, CUfunction, CUfunction_attribute as FuncAttr, CUlaunchAttribute,
    CUlaunchAttributeID as Id, CUlaunchAttributeValue, CUlaunchConfig, CUlaunchMemSyncDomain,
    CUstream,
};

use crate::code::dependency_wait::DependencyWait;
use crate::device::context::ensure_bound;
use crate::device::host::CudaHost;
use crate::device::stream::is_default;
use crate::driver::{About, calls};
use crate::error::{AtlasError, AttributeRefusal, Result};
use crate::launch::config::LaunchConfig;
use crate::launch::enqueue::{FunctionName, Params, launch_error, note};

/// The most attributes one launch can carry: one of each kind [`LaunchAttributes`] has.
pub(crate) const MAX_ATTRIBUTES: usize = 6;

/// Room for the driver's attribute array of one launch, on the stack: only the entries a launch
/// uses are written.
pub(crate) type DriverArray = [MaybeUninit<CUlaunchAttribute>; MAX_ATTRIBUTES];

/// The most blocks in a cluster that every device with clusters supports; more needs the kernel's
/// `CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED`.
pub const PORTABLE_CLUSTER_BLOCKS: u32 = 8;

/// Which memory synchronization domain a kernel's fences act in
/// (`CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN`): a kernel that only communicates with other GPUs (a
/// collective) in the remote domain keeps its fences from waiting on the compute kernels' memory
/// traffic, and theirs from waiting on its.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MemSyncDomain {
    /// The default domain (`CU_LAUNCH_MEM_SYNC_DOMAIN_DEFAULT`).
    Default,
    /// The remote domain (`CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE`).
    Remote,
}

/// An event the launch records when every block has triggered it or exited
/// (`CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ProgrammaticEvent {
    event: CUevent,
    trigger_at_block_start: bool,
}

/// The attributes of one launch: a small `Copy` value, built once and given by reference to
/// [`Kernel::launch_with`](crate::Kernel::launch_with) or
/// [`AtlasRegistry::launch_on_stream_with`](crate::AtlasRegistry::launch_on_stream_with), which
/// check it against the device and the kernel and turn it into the driver's attribute array on
/// the stack: nothing is allocated.
///
/// ```
/// use atlas_registry::{LaunchAttributes, MemSyncDomain};
/// let attrs = LaunchAttributes::new()
///     .programmatic_stream_serialization(true)
///     .priority(-1)
///     .mem_sync_domain(MemSyncDomain::Default);
/// assert_eq!(attrs.len(), 3);
/// assert!(LaunchAttributes::new().is_empty());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LaunchAttributes {
    programmatic_serialization: bool,
    programmatic_event: Option<ProgrammaticEvent>,
    /// The opt-out of the wait check: the kernel reads nothing its predecessor writes.
    without_wait: bool,
    cluster: Option<(u32, u32, u32)>,
    cooperative: bool,
    priority: Option<i32>,
    mem_sync_domain: Option<MemSyncDomain>,
}

// SAFETY: the only handle inside is a CUevent, a driver handle usable from any thread; whoever put
// it there vouched for it being live where it is used (`programmatic_event`'s duties).
unsafe impl Send for LaunchAttributes {}
// SAFETY: as for Send; the value is only read.
unsafe impl Sync for LaunchAttributes {}

impl LaunchAttributes {
    /// No attributes.
    pub const fn new() -> Self {
        Self {
            programmatic_serialization: false,
            programmatic_event: None,
            without_wait: false,
            cluster: None,
            cooperative: false,
            priority: None,
            mem_sync_domain: None,
        }
    }

    /// Programmatic dependent launch (`CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`):
    /// this kernel may start before the previous kernel on the stream has finished, once every
    /// block of that kernel has run `griddepcontrol.launch_dependents` (or exited). This kernel
    /// must run `griddepcontrol.wait` (`cudaGridDependencySynchronize`) before it reads what the
    /// previous one wrote: the wait returns when that kernel has finished and its memory is
    /// visible. Needs compute capability 9.0 or newer.
    ///
    /// # What is checked
    ///
    /// A launch of a kernel whose code Atlas reads and finds never waiting
    /// ([`Kernel::dependency_wait`](crate::Kernel::dependency_wait) is
    /// [`DependencyWait::NeverWaits`]) is refused before the driver is called, with
    /// [`AttributeRefusal::ProgrammaticWithoutWait`]: in PTX, no `griddepcontrol.wait` in the
    /// `.entry` nor in any `.func` it calls; in an sm_90+ cubin, no `ACQBULK` (the wait's
    /// instruction) in the kernel's code, nor in any function code of the cubin; in a fatbin,
    /// every entry the driver may load for the device says so. Add the wait before the kernel's
    /// first read of its predecessor's results, or, when it reads none,
    /// [`programmatic_without_wait`](Self::programmatic_without_wait).
    ///
    /// Launched as asked, because Atlas cannot tell: a kernel that calls through a function
    /// pointer or calls a function whose code is not in its blob (`.extern .func`, linked by
    /// the driver), a relocatable cubin, SASS of an architecture whose encoding of the wait
    /// Atlas does not know, a fatbin whose entries disagree (the driver picks one, Atlas does
    /// not know which), a blob Atlas cannot read, and a function launched through a raw handle
    /// of no registry ([`RawCudaFunc::from_raw`](crate::RawCudaFunc::from_raw)). Not seen at
    /// all: whether the wait comes before the reads, or is reached on every path (a wait
    /// anywhere in the reachable code counts). The check reads the kernel's code once (with its
    /// parameter layouts) and keeps one byte per kernel; plain launches never look at it.
    pub const fn programmatic_stream_serialization(self, allowed: bool) -> Self {
        Self {
            programmatic_serialization: allowed,
            ..self
        }
    }

    /// Records `event` when every block of this kernel has run
    /// `griddepcontrol.launch_dependents` (or exited), or, with `trigger_at_block_start`, as soon
    /// as every block has started (`CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT`). Work that waits on
    /// the event may then start before this kernel has finished; a kernel among it must run
    /// `griddepcontrol.wait` before it reads this kernel's results. Needs compute capability 9.0
    /// or newer. The kernel launched with the event is checked as for
    /// [`programmatic_stream_serialization`](Self::programmatic_stream_serialization): one whose
    /// code never waits is refused unless
    /// [`programmatic_without_wait`](Self::programmatic_without_wait) says it needs none.
    ///
    /// # Safety
    ///
    /// 1. `event` is an event created with `CU_EVENT_DISABLE_TIMING` in the context of every
    ///    function this value (or a copy of it) is launched with, and stays alive until those
    ///    launches have returned.
    pub const unsafe fn programmatic_event(
        self,
        event: CUevent,
        trigger_at_block_start: bool,
    ) -> Self {
        Self {
            programmatic_event: Some(ProgrammaticEvent {
                event,
                trigger_at_block_start,
            }),
            ..self
        }
    }

    /// Allows a programmatic dependent launch
    /// ([`programmatic_stream_serialization`](Self::programmatic_stream_serialization),
    /// [`programmatic_event`](Self::programmatic_event)) of a kernel whose code never waits for
    /// its predecessor, which is refused otherwise: say so only of a kernel that reads nothing
    /// the grids before it on the stream write (it may run while they still run). Not a driver
    /// attribute: [`len`](Self::len) does not count it, and without a programmatic launch it
    /// changes nothing.
    ///
    /// ```
    /// use atlas_registry::LaunchAttributes;
    /// // A kernel that only fills its own output may overlap the kernel before it.
    /// let attrs = LaunchAttributes::new()
    ///     .programmatic_stream_serialization(true)
    ///     .programmatic_without_wait(true);
    /// assert_eq!(attrs.len(), 1);
    /// assert!(attrs.is_programmatic_without_wait());
    /// ```
    pub const fn programmatic_without_wait(self, allowed: bool) -> Self {
        Self {
            without_wait: allowed,
            ..self
        }
    }

    /// Whether [`programmatic_without_wait`](Self::programmatic_without_wait) allows a
    /// programmatic launch of a kernel that never waits.
    pub const fn is_programmatic_without_wait(&self) -> bool {
        self.without_wait
    }

    /// Thread block clusters of `dims` blocks (`CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION`): the
    /// blocks of one cluster run at once on one GPU processing cluster and can reach each other's
    /// shared memory. Every grid dimension must be a multiple of the cluster's; at most
    /// [`PORTABLE_CLUSTER_BLOCKS`] blocks unless the kernel allows non-portable sizes (then at
    /// most what the device runs for the kernel and configuration); a kernel
    /// compiled with `__cluster_dims__` takes exactly those dimensions. Needs a device with
    /// cluster support (compute capability 9.0 or newer).
    pub const fn cluster(self, dims: (u32, u32, u32)) -> Self {
        Self {
            cluster: Some(dims),
            ..self
        }
    }

    /// A cooperative launch (`CU_LAUNCH_ATTRIBUTE_COOPERATIVE`): every block of the grid is
    /// resident at once, so blocks may wait for each other (a grid-wide barrier). The grid may
    /// have at most as many blocks as the device holds of this kernel and configuration
    /// (`cuOccupancyMaxActiveBlocksPerMultiprocessor` × multiprocessors).
    pub const fn cooperative(self, cooperative: bool) -> Self {
        Self {
            cooperative,
            ..self
        }
    }

    /// The launch's priority (`CU_LAUNCH_ATTRIBUTE_PRIORITY`), within the device's
    /// [`stream_priorities`](crate::CudaContext::stream_priorities): numerically lower runs
    /// first.
    pub const fn priority(self, priority: i32) -> Self {
        Self {
            priority: Some(priority),
            ..self
        }
    }

    /// The memory synchronization domain of the kernel's fences
    /// (`CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN`).
    pub const fn mem_sync_domain(self, domain: MemSyncDomain) -> Self {
        Self {
            mem_sync_domain: Some(domain),
            ..self
        }
    }

    /// The cluster dimensions asked for, if any.
    pub const fn cluster_dims(&self) -> Option<(u32, u32, u32)> {
        self.cluster
    }

    /// Whether the launch is cooperative.
    pub const fn is_cooperative(&self) -> bool {
        self.cooperative
    }

    /// Whether the attributes constrain the grid (clusters, a cooperative launch): what an
    /// argument update of a captured node of such a launch checks again.
    pub(crate) const fn constrains_grid(&self) -> bool {
        self.cluster.is_some() || self.cooperative
    }

    /// Whether the launch uses programmatic dependent launch (stream serialization or an event).
    pub const fn is_programmatic(&self) -> bool {
        self.programmatic_serialization || self.programmatic_event.is_some()
    }

    /// The priority asked for, if any.
    pub const fn launch_priority(&self) -> Option<i32> {
        self.priority
    }

    /// How many driver attributes the launch carries.
    pub const fn len(&self) -> usize {
        self.programmatic_serialization as usize
            + self.programmatic_event.is_some() as usize
            + self.cluster.is_some() as usize
            + self.cooperative as usize
            + self.priority.is_some() as usize
            + self.mem_sync_domain.is_some() as usize
    }

    /// Whether no attribute is set (a launch with it is a plain launch through
    /// `cuLaunchKernelEx`).
    pub const fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes the driver's attributes into the first entries of `array` (on the caller's stack)
    /// and returns how many it wrote; the entries after them are left as they were. Only the
    /// entries used are touched, so a launch with one attribute writes one.
    #[inline]
    pub(crate) fn write_driver_array(&self, array: &mut DriverArray) -> u32 {
        let mut used = 0;
        let mut push = |attribute| {
            array[used].write(attribute);
            used += 1;
        };
        if self.programmatic_serialization {
            push(entry(
                Id::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                |v| v.programmaticStreamSerializationAllowed = 1,
            ));
        }
        if let Some(e) = self.programmatic_event {
            push(entry(Id::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT, |v| {
                v.programmaticEvent.event = e.event;
                v.programmaticEvent.flags = 0;
                v.programmaticEvent.triggerAtBlockStart = i32::from(e.trigger_at_block_start);
            }));
        }
        if let Some((x, y, z)) = self.cluster {
            push(entry(Id::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, |v| {
                v.clusterDim.x = x;
                v.clusterDim.y = y;
                v.clusterDim.z = z;
            }));
        }
        if self.cooperative {
            push(entry(Id::CU_LAUNCH_ATTRIBUTE_COOPERATIVE, |v| {
                v.cooperative = 1
            }));
        }
        if let Some(priority) = self.priority {
            push(entry(Id::CU_LAUNCH_ATTRIBUTE_PRIORITY, |v| {
                v.priority = priority
            }));
        }
        if let Some(domain) = self.mem_sync_domain {
            let domain = match domain {
                MemSyncDomain::Default => CUlaunchMemSyncDomain::CU_LAUNCH_MEM_SYNC_DOMAIN_DEFAULT,
                MemSyncDomain::Remote => CUlaunchMemSyncDomain::CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE,
            };
            push(entry(Id::CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN, |v| {
                v.memSyncDomain = domain
            }));
        }
        used as u32
    }

    /// Everything Atlas can check of the attributes before the driver is called, for `func` (a
    /// live function of `host`'s context, whose launch facts `facts` keeps) launched with `cfg`
    /// (already checked against the device's limits): programmatic launch needs compute
    /// capability 9.0, and a kernel whose code waits for its predecessor (or may: unknown) or
    /// the opt-out of that; the priority is within the device's range; clusters are supported, nonzero,
    /// divide the grid, are at most the portable size (unless the kernel allows more, then at
    /// most what the device runs for this kernel and configuration) and match the kernel's
    /// `__cluster_dims__`; a cooperative grid fits on the device at once.
    ///
    /// A launch that asks only for what needs no reading (programmatic launch on a device that
    /// has it of a kernel whose wait is known, a memory synchronization domain) passes without
    /// leaving the caller's frame.
    ///
    /// # Safety
    ///
    /// 1. `func` is a live function of `host`'s context.
    #[inline]
    pub(crate) unsafe fn check(
        &self,
        host: &CudaHost,
        func: CUfunction,
        facts: &LaunchFacts,
        name: &dyn FunctionName,
        cfg: &LaunchConfig,
    ) -> Result<()> {
        let programmatic_ok = !self.is_programmatic()
            || (host.compute_capability() >= (9, 0)
                && (self.without_wait || name.dependency_wait() != DependencyWait::NeverWaits));
        if programmatic_ok && self.cluster.is_none() && !self.cooperative && self.priority.is_none()
        {
            return Ok(());
        }
        // SAFETY: duty 1.
        unsafe { self.check_all(host, func, facts, name, cfg) }
    }

    /// Every check [`check`](Self::check) names, one after the other.
    ///
    /// # Safety
    ///
    /// 1. `func` is a live function of `host`'s context.
    #[inline(never)]
    unsafe fn check_all(
        &self,
        host: &CudaHost,
        func: CUfunction,
        facts: &LaunchFacts,
        name: &dyn FunctionName,
        cfg: &LaunchConfig,
    ) -> Result<()> {
        let refuse = |reason: AttributeRefusal| {
            Err(AtlasError::InvalidLaunch {
                function: name.function_name(),
                reason: reason.into(),
            })
        };
        let limits = host.limits();
        let compute_capability = host.compute_capability();
        if self.is_programmatic() && compute_capability < (9, 0) {
            return refuse(AttributeRefusal::ProgrammaticUnsupported { compute_capability });
        }
        if self.is_programmatic()
            && !self.without_wait
            && name.dependency_wait() == DependencyWait::NeverWaits
        {
            return refuse(AttributeRefusal::ProgrammaticWithoutWait);
        }
        if let Some(priority) = self.priority {
            let (least, greatest) = host.context().stream_priorities()?;
            if priority < greatest || priority > least {
                return refuse(AttributeRefusal::PriorityOutOfRange {
                    priority,
                    greatest,
                    least,
                });
            }
        }
        if let Some(cluster) = self.cluster {
            // SAFETY: duty 1.
            if let Some(reason) = unsafe { cluster_refusal(host, func, facts, cfg, cluster) }? {
                return refuse(reason);
            }
        }
        if self.cooperative {
            if !limits.cooperative_launch {
                return refuse(AttributeRefusal::CooperativeUnsupported);
            }
            let (g, b) = (cfg.grid, cfg.block);
            let blocks = u64::from(g.0) * u64::from(g.1) * u64::from(g.2);
            let threads = b.0 * b.1 * b.2; // at most the device's threads per block (checked)
            // SAFETY: duty 1.
            let per_multiprocessor = unsafe {
                facts.blocks_per_multiprocessor(host, func, threads, cfg.shared_mem_bytes)
            }?;
            let max = u64::from(per_multiprocessor) * u64::from(limits.multiprocessors);
            if blocks > max {
                return refuse(AttributeRefusal::CooperativeGridTooLarge {
                    blocks,
                    max,
                    per_multiprocessor,
                    multiprocessors: limits.multiprocessors,
                });
            }
        }
        Ok(())
    }
}

/// As [`launch_kernel`](crate::launch::enqueue::launch_kernel), with attributes: writes the
/// driver's attribute array from `attrs` on the stack and calls `cuLaunchKernelEx` once (CUDA
/// 12.0+; an older driver is an [`AtlasError::MissingSymbol`] naming it). No allocation unless it
/// fails.
///
/// # Safety
///
/// 1–4. As [`launch_kernel`](crate::launch::enqueue::launch_kernel).
/// 5. `attrs` passed [`LaunchAttributes::check`] for `func` and `cfg`; an event it names is live
///    and of `host`'s context.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn launch_kernel_ex(
    host: &CudaHost,
    func: CUfunction,
    name: &dyn FunctionName,
    cfg: &LaunchConfig,
    attrs: &LaunchAttributes,
    stream: CUstream,
    params: Params<'_>,
) -> Result<()> {
    if is_default(stream) {
        ensure_bound(host.raw_context())?;
    }
    let mut array: DriverArray = [const { MaybeUninit::uninit() }; MAX_ATTRIBUTES];
    let count = attrs.write_driver_array(&mut array);
    let config = driver_config(cfg, stream, array.as_mut_ptr().cast(), count);
    // SAFETY: duty 2: each pointer leads to a value of its parameter's size.
    let note = unsafe { note(host, func, name, cfg, stream, params, true) };
    // SAFETY: the caller's duties 1–5; `config` names the first `count` entries of `array`, which
    // `write_driver_array` initialised and which live through the call; for the legacy default
    // stream the function's context is current (above).
    let launched = unsafe { calls::launch_kernel_ex(&config, func, params.array) };
    match launched {
        Ok(()) => {
            if let Some(note) = note {
                note.keep();
            }
            Ok(())
        }
        Err(e) => Err(launch_error(name, cfg, stream, e)),
    }
}

/// The driver's launch configuration for `cfg` on `stream`, with the `count` attributes at
/// `attrs`.
#[inline(always)]
fn driver_config(
    cfg: &LaunchConfig,
    stream: CUstream,
    attrs: *mut CUlaunchAttribute,
    count: u32,
) -> CUlaunchConfig {
    CUlaunchConfig {
        gridDimX: cfg.grid.0,
        gridDimY: cfg.grid.1,
        gridDimZ: cfg.grid.2,
        blockDimX: cfg.block.0,
        blockDimY: cfg.block.1,
        blockDimZ: cfg.block.2,
        sharedMemBytes: cfg.shared_mem_bytes,
        hStream: stream,
        attrs,
        numAttrs: count,
    }
}

/// One attribute: `id`, its value zeroed and then set by `set`.
#[inline(always)]
fn entry(id: Id, set: impl FnOnce(&mut CUlaunchAttributeValue)) -> CUlaunchAttribute {
    let mut value = CUlaunchAttributeValue { pad: [0; 64] };
    set(&mut value);
    CUlaunchAttribute {
        id,
        pad: [0; 4],
        value,
    }
}

/// Why a launch of `func` with `cfg` in clusters of `cluster` cannot work, or `None`.
///
/// # Safety
///
/// 1. `func` is a live function of `host`'s context.
unsafe fn cluster_refusal(
    host: &CudaHost,
    func: CUfunction,
    facts: &LaunchFacts,
    cfg: &LaunchConfig,
    cluster: (u32, u32, u32),
) -> Result<Option<AttributeRefusal>> {
    if !host.limits().cluster_launch {
        return Ok(Some(AttributeRefusal::ClustersUnsupported {
            compute_capability: host.compute_capability(),
        }));
    }
    let (c, g) = (cluster, cfg.grid);
    if c.0 == 0 || c.1 == 0 || c.2 == 0 {
        return Ok(Some(AttributeRefusal::ZeroCluster(cluster)));
    }
    if g.0 % c.0 != 0 || g.1 % c.1 != 0 || g.2 % c.2 != 0 {
        return Ok(Some(AttributeRefusal::GridNotDivisible {
            grid: g,
            cluster,
        }));
    }
    // SAFETY: duty 1.
    let required = unsafe { facts.required_cluster(host, func) }?;
    if required != (0, 0, 0) && required != cluster {
        return Ok(Some(AttributeRefusal::ClusterMismatch {
            required,
            given: cluster,
        }));
    }
    let blocks = u64::from(c.0) * u64::from(c.1) * u64::from(c.2);
    if blocks > u64::from(PORTABLE_CLUSTER_BLOCKS) {
        // Read at each such launch, not kept: the caller may set it on the function at any time.
        ensure_bound(host.raw_context())?;
        // SAFETY: duty 1.
        let non_portable = unsafe {
            calls::function_attribute(
                func,
                FuncAttr::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
            )
        }
        .about(|| "non-portable cluster size allowed".into())?;
        if non_portable == 0 {
            return Ok(Some(AttributeRefusal::ClusterTooLarge {
                cluster,
                blocks,
                max: PORTABLE_CLUSTER_BLOCKS,
            }));
        }
        // How far beyond the portable size the device goes depends on the kernel and the
        // configuration: asked at each such launch, as the attribute above.
        let config = driver_config(cfg, std::ptr::null_mut(), std::ptr::null_mut(), 0);
        // SAFETY: duty 1; no stream and no attributes, and the function's context is current
        // (bound above).
        let max = unsafe { calls::max_potential_cluster_size(func, &config) }
            .about(|| "largest cluster".into())?;
        let max = u32::try_from(max).unwrap_or(0);
        if blocks > u64::from(max) {
            return Ok(Some(AttributeRefusal::ClusterBeyondDevice {
                cluster,
                blocks,
                max,
            }));
        }
    }
    Ok(None)
}

/// What launches with attributes learn of one function and keep, without locks: the cluster
/// dimensions it was compiled with (read once), its occupancy for the last cooperative
/// configuration (read again when the configuration changes), and whether its code waits for the
/// grid it depends on (read once, from its blob).
#[derive(Debug, Default)]
pub(crate) struct LaunchFacts {
    /// `1 << 63 | z << 32 | y << 16 | x` once read, 0 before.
    required_cluster: AtomicU64,
    /// `(blocks per multiprocessor + 1) << 48 | block threads << 32 | dynamic shared memory`
    /// for the last cooperative configuration, 0 before.
    cooperative: AtomicU64,
    /// [`DependencyWait::to_byte`] once read, 0 before.
    dependency_wait: AtomicU8,
}

impl LaunchFacts {
    /// Whether the function's code waits for the grid it depends on: `read` the first time,
    /// kept after.
    #[inline]
    pub(crate) fn dependency_wait(&self, read: impl FnOnce() -> DependencyWait) -> DependencyWait {
        if let Some(known) = DependencyWait::from_byte(self.dependency_wait.load(Ordering::Relaxed))
        {
            return known;
        }
        let wait = read();
        self.dependency_wait
            .store(wait.to_byte(), Ordering::Relaxed);
        wait
    }

    /// The function's `__cluster_dims__` (`CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_*`), `(0, 0, 0)`
    /// when it was compiled without; read once.
    ///
    /// # Safety
    ///
    /// 1. `func` is a live function of `host`'s context, always the same one for `self`.
    unsafe fn required_cluster(
        &self,
        host: &CudaHost,
        func: CUfunction,
    ) -> Result<(u32, u32, u32)> {
        let known = self.required_cluster.load(Ordering::Relaxed);
        if known != 0 {
            let dim = |shift: u32| ((known >> shift) & 0xFFFF) as u32;
            return Ok((dim(0), dim(16), dim(32)));
        }
        ensure_bound(host.raw_context())?;
        let read = |attribute| {
            // SAFETY: duty 1.
            let value = unsafe { calls::function_attribute(func, attribute) }
                .about(|| "required cluster dimensions".into())?;
            Ok::<_, AtlasError>(u16::try_from(value).unwrap_or(u16::MAX))
        };
        let dims = (
            read(FuncAttr::CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH)?,
            read(FuncAttr::CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT)?,
            read(FuncAttr::CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH)?,
        );
        let packed =
            1 << 63 | u64::from(dims.2) << 32 | u64::from(dims.1) << 16 | u64::from(dims.0);
        self.required_cluster.store(packed, Ordering::Relaxed);
        Ok((dims.0.into(), dims.1.into(), dims.2.into()))
    }

    /// How many blocks of `threads` threads and `shared_mem_bytes` of dynamic shared memory one
    /// multiprocessor holds at once; remembered for the last configuration asked.
    ///
    /// # Safety
    ///
    /// 1. `func` is a live function of `host`'s context, always the same one for `self`.
    unsafe fn blocks_per_multiprocessor(
        &self,
        host: &CudaHost,
        func: CUfunction,
        threads: u32,
        shared_mem_bytes: u32,
    ) -> Result<u32> {
        let key = u64::from(threads & 0xFFFF) << 32 | u64::from(shared_mem_bytes);
        let known = self.cooperative.load(Ordering::Relaxed);
        if known != 0 && known & ((1 << 48) - 1) == key {
            return Ok((known >> 48) as u32 - 1);
        }
        // SAFETY: duty 1.
        let blocks = unsafe { blocks_per_multiprocessor(host, func, threads, shared_mem_bytes) }?;
        if threads <= 0xFFFF && blocks < 0xFFFF {
            self.cooperative
                .store(u64::from(blocks + 1) << 48 | key, Ordering::Relaxed);
        }
        Ok(blocks)
    }
}

/// How many blocks of `threads` threads and `shared_mem_bytes` of dynamic shared memory of `func`
/// one multiprocessor holds at once (`cuOccupancyMaxActiveBlocksPerMultiprocessor`, with `host`'s
/// context made current first).
///
/// # Safety
///
/// 1. `func` is a live function of `host`'s context.
pub(crate) unsafe fn blocks_per_multiprocessor(
    host: &CudaHost,
    func: CUfunction,
    threads: u32,
    shared_mem_bytes: u32,
) -> Result<u32> {
    ensure_bound(host.raw_context())?;
    // SAFETY: duty 1; the function's context is current (above). Both values fit an i32 and a
    // usize: the callers checked them against the device's limits.
    let blocks = unsafe {
        calls::max_active_blocks_per_multiprocessor(func, threads as i32, shared_mem_bytes as usize)
    }
    .about(|| format!("occupancy of {threads} threads, {shared_mem_bytes} B shared memory"))?;
    Ok(u32::try_from(blocks).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The entries `attrs` writes, copied out of the array.
    fn written(attrs: &LaunchAttributes) -> Vec<CUlaunchAttribute> {
        let mut array: DriverArray = [const { MaybeUninit::uninit() }; MAX_ATTRIBUTES];
        let used = attrs.write_driver_array(&mut array) as usize;
        // SAFETY: `write_driver_array` initialised the first `used` entries.
        array[..used]
            .iter()
            .map(|a| unsafe { a.assume_init() })
            .collect()
    }

    #[test]
    fn the_array_holds_what_was_asked_in_order() {
        let attrs = LaunchAttributes::new()
            .programmatic_stream_serialization(true)
            .cluster((2, 1, 1))
            .cooperative(true)
            .priority(-3)
            .mem_sync_domain(MemSyncDomain::Remote);
        assert_eq!(attrs.len(), 5);
        let array = written(&attrs);
        let ids: Vec<u32> = array.iter().map(|a| a.id.0).collect();
        assert_eq!(ids, [6, 4, 2, 8, 10]);
        // SAFETY: each entry's union is read through the field its id says was written; unused
        // bytes are zero.
        unsafe {
            assert_eq!(array[0].value.programmaticStreamSerializationAllowed, 1);
            let c = array[1].value.clusterDim;
            assert_eq!((c.x, c.y, c.z), (2, 1, 1));
            assert_eq!(array[2].value.cooperative, 1);
            assert_eq!(array[3].value.priority, -3);
            assert_eq!(array[4].value.memSyncDomain.0, 1);
            assert!(array[0].value.pad[4..].iter().all(|&b| b == 0));
        }
        assert!(written(&LaunchAttributes::new()).is_empty());
    }

    #[test]
    fn every_attribute_fits_the_array() {
        let event: CUevent = std::ptr::null_mut();
        // SAFETY: the value is never launched.
        let all = unsafe {
            LaunchAttributes::new()
                .programmatic_stream_serialization(true)
                .programmatic_event(event, true)
                .cluster((1, 1, 1))
                .cooperative(true)
                .priority(0)
                .mem_sync_domain(MemSyncDomain::Default)
        };
        assert_eq!(all.len(), MAX_ATTRIBUTES);
        let array = written(&all);
        assert_eq!(array.len(), MAX_ATTRIBUTES);
        // SAFETY: entry 1 is the programmatic event (its id says so).
        let e = unsafe { array[1].value.programmaticEvent };
        assert_eq!((array[1].id.0, e.triggerAtBlockStart, e.flags), (7, 1, 0));
        assert!(all.is_programmatic() && all.is_cooperative());
        assert_eq!(all.cluster_dims(), Some((1, 1, 1)));
        assert_eq!(all.launch_priority(), Some(0));
    }
}
