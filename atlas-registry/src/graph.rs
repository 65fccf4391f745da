//! CUDA graphs: capture a sequence of launches on a stream, instantiate it once, replay it, and
//! change kernel arguments of the instantiated graph without instantiating it again.
//!
//! Resolve every function before capture begins (take it from the registry or a
//! [`FunctionCache`](crate::FunctionCache) once): with lazy module loading, a first lookup loads
//! code, which must not happen inside a capture.

use std::fmt;

use atlas_sys::{
    CUDA_KERNEL_NODE_PARAMS, CUcontext, CUgraph, CUgraphExec, CUgraphNode, CUgraphNodeType,
    CUstreamCaptureMode,
};

use crate::args::KernelArgs;
use crate::context::ensure_bound;
use crate::driver::cu;
use crate::error::{AtlasError, Result, report_cleanup};
use crate::function::FunctionRef;
use crate::host::ordinal_of;
use crate::launch::{FunctionName, LaunchConfig};
use crate::stream::CudaStream;

/// A captured graph, not yet instantiated.
pub struct CudaGraph {
    raw: CUgraph,
    context: CUcontext,
}

// SAFETY: a CUgraph is a driver handle; the driver allows using it from any thread as long as
// calls on one graph are not concurrent, which `&mut`/ownership here guarantees for mutation.
unsafe impl Send for CudaGraph {}
// SAFETY: shared references only read the graph (node lists, instantiation).
unsafe impl Sync for CudaGraph {}

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
    raw: CUgraphExec,
    kernel_nodes: Vec<CUgraphNode>,
    graph: CudaGraph,
}

// SAFETY: usable from any thread, one at a time, which ownership guarantees. Deliberately not
// `Sync`: the driver does not synchronize calls on one graph object, so two threads using it
// through shared references would race.
unsafe impl Send for GraphExec {}

impl CudaStream {
    /// Starts capturing the work enqueued on this stream by this thread into a graph
    /// (`CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`). Nothing runs until the graph is replayed.
    #[doc(alias = "cuStreamBeginCapture_v2")]
    pub fn begin_capture(&self) -> Result<()> {
        if self.raw().is_null() {
            return Err(AtlasError::InvalidLaunch {
                function: "stream capture".into(),
                reason: "the legacy default stream cannot be captured; use a created stream".into(),
            });
        }
        ensure_bound(self.context())?;
        let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        // SAFETY: the stream is live and not the legacy default stream; its context is current.
        unsafe { cu!(cuStreamBeginCapture_v2(self.raw(), mode)) }
    }

    /// Ends the capture begun by [`begin_capture`](Self::begin_capture) and returns the graph.
    #[doc(alias = "cuStreamEndCapture")]
    pub fn end_capture(&self) -> Result<CudaGraph> {
        ensure_bound(self.context())?;
        let mut raw: CUgraph = std::ptr::null_mut();
        // SAFETY: live stream, live out-pointer, context current.
        unsafe { cu!(cuStreamEndCapture(self.raw(), &mut raw)) }?;
        Ok(CudaGraph {
            raw,
            context: self.context(),
        })
    }
}

impl CudaGraph {
    /// The raw handle.
    pub fn raw(&self) -> CUgraph {
        self.raw
    }

    /// The graph's kernel nodes, in the order the driver lists them (for a graph captured from
    /// one stream, the order of the launches).
    fn kernel_nodes(&self) -> Result<Vec<CUgraphNode>> {
        let mut count = 0usize;
        // SAFETY: a null node array asks for the count only.
        unsafe { cu!(cuGraphGetNodes(self.raw, std::ptr::null_mut(), &mut count)) }?;
        let mut nodes: Vec<CUgraphNode> = vec![std::ptr::null_mut(); count];
        // SAFETY: the array has room for `count` nodes.
        unsafe { cu!(cuGraphGetNodes(self.raw, nodes.as_mut_ptr(), &mut count)) }?;
        nodes.truncate(count);
        let mut kernels = Vec::with_capacity(nodes.len());
        for node in nodes {
            let mut kind = CUgraphNodeType(u32::MAX);
            // SAFETY: `node` belongs to this live graph; live out-pointer.
            unsafe { cu!(cuGraphNodeGetType(node, &mut kind)) }?;
            if kind == CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL {
                kernels.push(node);
            }
        }
        Ok(kernels)
    }

    /// Instantiates the graph for replay.
    #[doc(alias = "cuGraphInstantiateWithFlags")]
    pub fn instantiate(self) -> Result<GraphExec> {
        ensure_bound(self.context)?;
        let kernel_nodes = self.kernel_nodes()?;
        let mut raw: CUgraphExec = std::ptr::null_mut();
        // SAFETY: live graph, live out-pointer, no flags.
        unsafe { cu!(cuGraphInstantiateWithFlags(&mut raw, self.raw, 0)) }?;
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
    ///    [`CudaFunction::launch`](crate::CudaFunction::launch)) holds for those arguments: the
    ///    graph holds addresses, not buffers.
    /// 2. Every module whose kernels the graph launches is still loaded: the graph holds function
    ///    handles, not registries (keep the registries, or the [`CudaFunction`](crate::CudaFunction)s,
    ///    alive while the graph is replayed).
    /// 3. `stream` is a stream of the context the graph was captured in.
    #[doc(alias = "cuGraphLaunch")]
    pub unsafe fn launch(&self, stream: &CudaStream) -> Result<()> {
        stream.bind_if_default()?;
        // SAFETY: live executable graph and stream; the caller vouches for the memory it uses.
        unsafe { cu!(cuGraphLaunch(self.raw, stream.raw())) }
    }

    /// Replaces the function, configuration and arguments of kernel node `index` (in launch order)
    /// in the instantiated graph, without instantiating it again. Everything a typed launch checks is
    /// checked first, with the same code: the configuration against the device, the arguments
    /// against the kernel's parameters, every buffer argument and the function against the graph's
    /// context.
    ///
    /// # Safety
    ///
    /// As [`CudaFunction::launch`](crate::CudaFunction::launch), for every later replay:
    /// 1. Everything the kernel reads or writes through these arguments is valid, in-bounds memory of
    ///    the graph's device.
    /// 2. That memory stays allocated while the graph may still be replayed with these arguments.
    #[doc(alias = "cuGraphExecKernelNodeSetParams_v2")]
    pub unsafe fn set_kernel_args<A: KernelArgs>(
        &mut self,
        index: usize,
        func: FunctionRef<'_>,
        cfg: &LaunchConfig,
        args: A,
    ) -> Result<()> {
        let (host, entry) = (&*func.registry.host, func.entry);
        let Some(&node) = self.kernel_nodes.get(index) else {
            return Err(AtlasError::InvalidLaunch {
                function: entry.function_name(),
                reason: format!(
                    "the graph has {} kernel node(s), not {}",
                    self.kernel_nodes.len(),
                    index + 1
                ),
            });
        };
        if host.context().raw() != self.graph.context {
            return Err(AtlasError::WrongDevice {
                function: entry.function_name(),
                what: "the graph".into(),
                expected: host.ordinal(),
                given: ordinal_of(self.graph.context),
            });
        }
        entry.preflight(host, cfg, &args)?;
        entry.opt_in.ensure(host, entry.raw, cfg.shared_mem_bytes)?;
        let exec = self.raw;
        args.with_params(|params| {
            let node_params = CUDA_KERNEL_NODE_PARAMS {
                func: entry.raw,
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
            unsafe {
                cu!(cuGraphExecKernelNodeSetParams_v2(exec, node, &node_params); "`{}`", entry.name)
            }
        })
    }
}

impl fmt::Debug for CudaGraph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CudaGraph({:p})", self.raw)
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
        // SAFETY: the executable graph is destroyed only here.
        let result =
            ensure_bound(self.graph.context).and_then(|()| unsafe { cu!(cuGraphExecDestroy(raw)) });
        report_cleanup("destroying an executable graph", result);
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        let raw = self.raw;
        // SAFETY: the graph is destroyed only here, after any GraphExec made from it.
        let result = ensure_bound(self.context).and_then(|()| unsafe { cu!(cuGraphDestroy(raw)) });
        report_cleanup("destroying a graph", result);
    }
}
