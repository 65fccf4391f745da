//! [`GraphExec`]: an instantiated graph, replayed with one driver call, whose kernel nodes' function,
//! configuration and arguments can be changed in place.

use std::fmt;

use atlas_sys::{CUDA_KERNEL_NODE_PARAMS, CUgraphExec, CUgraphNode};

use crate::device::context::ensure_bound;
use crate::device::host::ordinal_of;
use crate::device::stream::StreamArg;
use crate::driver::{About, calls};
use crate::error::{AtlasError, Result, report_cleanup};
use crate::graph::capture::CudaGraph;
use crate::launch::args::KernelArgs;
use crate::launch::config::LaunchConfig;
use crate::launch::kernel::Kernel;

/// An instantiated graph, ready to replay; owns the graph it came from.
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
        // SAFETY: the graph is live; its context is current (above).
        let raw = unsafe { calls::graph_instantiate(self.raw()) }?;
        Ok(GraphExec {
            raw,
            kernel_nodes,
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

    /// Replays the whole graph on `stream`: one driver call.
    ///
    /// # Safety
    ///
    /// 1. Every device allocation the captured kernels use (their pointer arguments, as captured or
    ///    last set) is still allocated, and each kernel's contract (as for
    ///    [`Kernel::launch`]) holds for those arguments: the graph holds addresses, not buffers.
    /// 2. Every module whose kernels the graph launches is still loaded: the graph holds function
    ///    handles, not registries (keep the registries, or the [`CudaFunction`](crate::CudaFunction)s,
    ///    alive while the graph is replayed).
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
        if stream.is_null() {
            ensure_bound(context)?;
        }
        // SAFETY: live executable graph; the caller's duties 1–3; for the legacy default stream
        // its context is current (above).
        Ok(unsafe { calls::graph_launch(self.raw, stream) }?)
    }

    /// Replaces the function, configuration and arguments of kernel node `index` (in launch order)
    /// in the instantiated graph, without instantiating it again. `func` is any function handle
    /// (`&cuda_function`, `&function_ref`). Everything a typed launch checks is checked first, by
    /// the same preflight: the configuration against the device, the arguments against the
    /// kernel's parameters, every buffer argument and the function against the graph's context.
    ///
    /// # Safety
    ///
    /// As [`Kernel::launch`], for every later replay:
    /// 1. Everything the kernel reads or writes through these arguments is valid, in-bounds memory of
    ///    the graph's device.
    /// 2. That memory stays allocated while the graph may still be replayed with these arguments.
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
            Ok(set.about(|| format!("`{}`", func.name()))?)
        })
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
        // SAFETY: the executable graph is destroyed only here; its context is made current first.
        let result = ensure_bound(self.graph.context())
            .and_then(|()| Ok(unsafe { calls::graph_exec_destroy(raw) }?));
        report_cleanup("destroying an executable graph", result);
    }
}
