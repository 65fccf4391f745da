//! [`GraphExec`]: an instantiated graph, replayed with one driver call, whose kernel nodes' function,
//! configuration and arguments can be changed in place.

use std::fmt;
use std::sync::Arc;

use atlas_sys::{CUDA_KERNEL_NODE_PARAMS, CUgraphExec, CUgraphNode};

use crate::code::dependency_wait::DependencyWait;
use crate::device::capture::Keep;
use crate::device::context::ensure_bound;
use crate::device::host::ordinal_of;
use crate::device::stream::{CudaStream, StreamArg, is_default};
use crate::driver::{About, calls};
use crate::error::{AtlasError, AttributeRefusal, LaunchRefusal, Result, report_cleanup};
use crate::flight_recorder::{FlightRecorder, recorder_of};
use crate::graph::capture::CudaGraph;
use crate::launch::args::KernelArgs;
use crate::launch::attributes::LaunchAttributes;
use crate::launch::config::LaunchConfig;
use crate::launch::held::GraphHolds;
use crate::launch::kernel::Kernel;

/// An instantiated graph, ready to replay; owns the graph it came from, and with it what the
/// graph's kernels need (see [`CudaGraph`]): replays, updates and uploads stay safe after the
/// registries and buffers its launches used are gone.
///
/// `Send` but not `Sync`: the driver does not synchronize calls on one graph object, so one
/// thread at a time uses it.
///
/// ```compile_fail
/// fn shared_across_threads<T: Sync>() {}
/// shared_across_threads::<atlas_registry::GraphExec>();
/// ```
pub struct GraphExec {
    /// The executable graph.
    pub(super) raw: CUgraphExec,
    /// The kernel nodes of `graph`, in launch order: the handles that name this executable
    /// graph's kernel nodes to the driver.
    pub(super) kernel_nodes: Vec<CUgraphNode>,
    /// The graph `raw` was instantiated from.
    pub(super) graph: CudaGraph,
    /// The graph of the last update in place, whose parameters `raw` runs since: kept for what
    /// it keeps alive, and for the attributes of its kernel nodes.
    pub(super) updated: Option<Updated>,
    /// Per kernel node, what the last [`set_kernel_args`](Self::set_kernel_args) of it keeps
    /// alive (as long as the node launches it); empty before.
    pub(super) node_keeps: Vec<Keep>,
    /// The flight recorder of the graph's context (none for a context Atlas did not retain).
    recorder: Option<Arc<FlightRecorder>>,
}

/// A graph an executable graph was updated from in place.
pub(super) struct Updated {
    pub(super) graph: CudaGraph,
    /// Its kernel nodes, listed when first needed.
    pub(super) kernel_nodes: Option<Vec<CUgraphNode>>,
}

// SAFETY: usable from any thread, one at a time, which ownership guarantees. Deliberately not
// `Sync`: the driver does not synchronize calls on one graph object, so two threads using it
// through shared references would race.
unsafe impl Send for GraphExec {}

impl CudaGraph {
    /// Instantiates the graph for replay.
    #[doc(alias = "cuGraphInstantiateWithFlags")]
    pub fn instantiate(self) -> Result<GraphExec> {
        ensure_bound(self.context())?;
        let kernel_nodes = self.kernel_nodes()?;
        // SAFETY: the graph is live; its context is current (above); the modules of its kernels
        // are loaded: the graph keeps their registries (or, for launches Atlas did not make, the
        // caller's duties of those launches keep them).
        let raw = unsafe { calls::graph_instantiate(self.raw()) }?;
        Ok(GraphExec {
            raw,
            kernel_nodes,
            updated: None,
            node_keeps: Vec::new(),
            recorder: recorder_of(self.context()),
            graph: self,
        })
    }
}

impl GraphExec {
    /// The raw handle.
    pub fn raw(&self) -> CUgraphExec {
        self.raw
    }

    /// How many kernel launches the graph holds.
    pub fn kernel_count(&self) -> usize {
        self.kernel_nodes.len()
    }

    /// Replays the whole graph on `stream`: one driver call. A stream of another context than the
    /// graph's is refused ([`AtlasError::WrongContext`]) before the driver is called.
    ///
    /// The graph keeps the modules of its kernels loaded and the memory of the
    /// [`DeviceBuffer`](crate::DeviceBuffer) arguments of its typed launches allocated (see
    /// [`CudaGraph`]); what it reaches otherwise is the caller's.
    ///
    /// # Safety
    ///
    /// 1. Memory the graph's kernels and copies reach that the graph does not keep — device
    ///    addresses passed as integers or through the raw launch path
    ///    ([`AtlasRegistry::launch_on_stream`](crate::AtlasRegistry::launch_on_stream)), the
    ///    memory of captured copies, host memory included — is allocated (and, for host memory,
    ///    alive) until this replay has run, and each kernel's contract (as for
    ///    [`Kernel::launch`]) holds for its arguments as captured or last set.
    /// 2. A function the graph launches that came to a raw launch from elsewhere than the
    ///    registry it was launched through ([`RawCudaFunc::from_raw`](crate::RawCudaFunc::from_raw),
    ///    another registry) is still loaded.
    /// 3. A raw `CUstream` is a live stream of the context the graph was captured in, or null.
    ///    (`stream` is a `&CudaStream` or a raw `CUstream`, [`StreamArg`]; a `&CudaStream` of
    ///    another context is refused with [`AtlasError::WrongContext`].)
    #[doc(alias = "cuGraphLaunch")]
    pub unsafe fn launch(&self, stream: impl StreamArg) -> Result<()> {
        let (stream, context) = stream.stream_in(self.graph.context());
        if context != self.graph.context() {
            return Err(AtlasError::WrongContext {
                what: "the stream".into(),
                expected: ordinal_of(self.graph.context()),
                given: ordinal_of(context),
            });
        }
        if is_default(stream) {
            ensure_bound(context)?;
        }
        // The modules of the kernels are loaded and the memory of their buffer arguments
        // allocated: the graph keeps both.
        // SAFETY: live executable graph, a live stream of its context (checked above, or duty 3;
        // a default stream's context is current); what else the kernels reach: duties 1 and 2.
        match unsafe { calls::graph_launch(self.raw, stream) } {
            Ok(()) => {
                if let Some(recorder) = &self.recorder
                    && recorder.is_enabled()
                {
                    recorder.graph(self.raw as usize, stream);
                }
                Ok(())
            }
            Err(e) => Err(AtlasError::from(e).on_stream(stream)),
        }
    }

    /// The refusal of a stream (or graph) of another context than the graph's.
    #[cold]
    pub(super) fn wrong_context(&self, what: &str, stream: &CudaStream) -> AtlasError {
        AtlasError::WrongContext {
            what: what.into(),
            expected: ordinal_of(self.graph.context()),
            given: ordinal_of(stream.context()),
        }
    }

    /// Replaces the function, configuration and arguments of kernel node `index` (in launch order)
    /// in the instantiated graph, without instantiating it again. `func` is any function handle
    /// (`&cuda_function`, `&function_ref`). Everything a typed launch checks is checked first, by
    /// the same preflight: the configuration against the device, the arguments against the
    /// kernel's parameters, every buffer argument and the function against the graph's context;
    /// for a node captured from a launch with cluster dimensions or a cooperative one, those
    /// attributes against the new function and configuration, as the launch checked them; for a
    /// node behind a programmatic edge (a captured programmatic dependent launch), that a
    /// function whose code never waits for the grid it depends on is the one the node was
    /// captured launching ([`AttributeRefusal::ProgrammaticWithoutWait`] otherwise).
    ///
    /// From then on the executable graph keeps `func`'s registry and the memory of the buffer
    /// arguments, as it keeps those of its captured launches; what the node launched before is
    /// released (a buffer dropped meanwhile is freed then, after the device's work).
    ///
    /// # Safety
    ///
    /// As [`Kernel::launch`], for every later replay:
    /// 1. Everything the kernel reads or writes through these arguments is valid, in-bounds memory of
    ///    the graph's device.
    /// 2. Memory the graph does not keep (addresses passed as integers) stays allocated while the
    ///    graph may still be replayed with these arguments.
    #[doc(alias = "cuGraphExecKernelNodeSetParams_v2")]
    pub unsafe fn set_kernel_args<A: KernelArgs>(
        &mut self,
        index: usize,
        func: &Kernel,
        cfg: &LaunchConfig,
        args: A,
    ) -> Result<()> {
        let Some(&node) = self.kernel_nodes.get(index) else {
            return Err(AtlasError::NoSuchNode {
                index,
                count: self.kernel_nodes.len(),
            });
        };
        if func.host().context().raw() != self.graph.context() {
            return Err(func.wrong_device("the graph".into(), self.graph.context()));
        }
        func.preflight(cfg, &args)?;
        if let Some(attrs) = self.node_attributes(index)? {
            // SAFETY: the function is live and of the graph's context (checked above).
            unsafe { attrs.check(func.host(), func.raw(), func.facts(), func, cfg) }?;
        }
        if func.dependency_wait() == DependencyWait::NeverWaits {
            self.check_programmatic_edge(index, func)?;
        }
        let mut holds = GraphHolds::new();
        func.hold_for_graph(&mut holds);
        args.hold_for_graph(&mut holds);
        let exec = self.raw;
        args.with_params(|params| {
            let node_params = CUDA_KERNEL_NODE_PARAMS {
                func: func.raw(),
                gridDimX: cfg.grid.0,
                gridDimY: cfg.grid.1,
                gridDimZ: cfg.grid.2,
                blockDimX: cfg.block.0,
                blockDimY: cfg.block.1,
                blockDimZ: cfg.block.2,
                sharedMemBytes: cfg.shared_mem_bytes,
                kernelParams: params,
                extra: std::ptr::null_mut(),
                kern: std::ptr::null_mut(),
                ctx: std::ptr::null_mut(),
            };
            // SAFETY: a kernel node of this exec's graph and a function of its context (checked
            // above); preflight matched the array to the kernel and its buffers to the context; the
            // driver copies it during the call; the kernel's use of it is the caller's duty.
            let set = unsafe { calls::graph_set_kernel_params(exec, node, &node_params) };
            set.about(|| format!("`{}`", func.name()))
        })?;
        let mut keep = Keep::default();
        drop(keep.extend(holds.into_held(), false));
        if self.node_keeps.len() < self.kernel_nodes.len() {
            self.node_keeps
                .resize_with(self.kernel_nodes.len(), Keep::default);
        }
        // What the node launched before is released only now that it launches this.
        drop(std::mem::replace(&mut self.node_keeps[index], keep));
        Ok(())
    }

    /// Kernel node `index` of the graph whose parameters the executable graph runs: the one it
    /// was instantiated from, or the one a whole-graph update brought in.
    fn graph_node(&mut self, index: usize) -> Result<Option<CUgraphNode>> {
        Ok(match &mut self.updated {
            None => self.kernel_nodes.get(index).copied(),
            Some(updated) => {
                let nodes = match &mut updated.kernel_nodes {
                    Some(nodes) => nodes,
                    nodes => nodes.insert(updated.graph.kernel_nodes()?),
                };
                nodes.get(index).copied()
            }
        })
    }

    /// The attributes of kernel node `index` that an argument update checks again (cluster
    /// dimensions, cooperative), read from the graph whose parameters the executable graph runs,
    /// when a launch with them was captured into it; `None` otherwise.
    fn node_attributes(&mut self, index: usize) -> Result<Option<LaunchAttributes>> {
        let graph = self
            .updated
            .as_ref()
            .map_or(&self.graph, |updated| &updated.graph);
        if !graph.keep().attributed() {
            return Ok(None);
        }
        let Some(node) = self.graph_node(index)? else {
            return Ok(None);
        };
        // SAFETY: a kernel node of a graph this executable graph owns.
        let (cluster, cooperative) = unsafe { calls::kernel_node_attributes(node) }?;
        let attrs = LaunchAttributes::new().cooperative(cooperative);
        Ok(Some(match cluster {
            // No cluster attribute (the driver reports either for a node launched without).
            (0, 0, 0) | (1, 1, 1) => attrs,
            dims => attrs.cluster(dims),
        }))
    }
}

impl GraphExec {
    /// `Ok` unless kernel node `index` depends on another through a programmatic edge (a
    /// captured programmatic dependent launch) and `func`, whose code never waits for the grid it
    /// depends on, is not the function the node was captured launching (that launch was checked
    /// as a launch, or opted out with
    /// [`programmatic_without_wait`](LaunchAttributes::programmatic_without_wait)). A driver
    /// that cannot list a node's edges (before CUDA 12.3) is not asked.
    #[cold]
    fn check_programmatic_edge(&mut self, index: usize, func: &Kernel) -> Result<()> {
        let Some(node) = self.graph_node(index)? else {
            return Ok(());
        };
        // SAFETY: a kernel node of a graph this executable graph owns.
        if unsafe { calls::has_programmatic_dependency(node) }? != Some(true) {
            return Ok(());
        }
        // SAFETY: as above.
        if unsafe { calls::kernel_node_function(node) }? == func.raw() {
            return Ok(());
        }
        Err(func.refused(LaunchRefusal::Attribute(
            AttributeRefusal::ProgrammaticWithoutWait,
        )))
    }
}

impl fmt::Debug for GraphExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "GraphExec({:p}, {} kernels)",
            self.raw,
            self.kernel_nodes.len()
        )
    }
}

impl Drop for GraphExec {
    fn drop(&mut self) {
        let raw = self.raw;
        // What its kernels need is released after: the graphs and keeps are fields, dropped later.
        let result = ensure_bound(self.graph.context()).and_then(|()| {
            // SAFETY: the executable graph is destroyed only here, its context current (above).
            Ok(unsafe { calls::graph_exec_destroy(raw) }?)
        });
        report_cleanup("destroying an executable graph", result);
    }
}
