//! Stream capture: [`CudaStream::begin_capture`] and [`CudaStream::end_capture`], and the captured
//! [`CudaGraph`].

use std::fmt;

use atlas_sys::{CUcontext, CUgraph, CUgraphNode, CUgraphNodeType, CUstreamCaptureMode};

use crate::device::capture;
use crate::device::context::ensure_bound;
use crate::device::stream::CudaStream;
use crate::driver::calls;
use crate::error::{AtlasError, CaptureMisuse, Result, report_cleanup};
use crate::graph::conditional::in_conditional_body;

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

impl CudaStream {
    /// Starts capturing the work enqueued on this stream by this thread into a graph
    /// (`CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`). Nothing runs until the graph is replayed.
    /// The legacy default stream cannot be captured ([`AtlasError::Capture`]).
    ///
    /// ```no_run
    /// # fn f(registry: &atlas_registry::AtlasRegistry, x: &mut atlas_registry::DeviceBuffer<f32>) -> atlas_registry::Result<()> {
    /// use atlas_registry::{CudaStream, LaunchConfig};
    /// let stream = CudaStream::new(registry.ctx())?;
    /// let scale = registry.function_cached("elementwise", "scale")?; // looked up before capturing
    /// let (n, cfg) = (x.len() as u32, LaunchConfig::for_elements(x.len() as u32, 256));
    /// stream.begin_capture()?;
    /// for factor in [2.0f32, 0.5, 3.0] {
    ///     // SAFETY: captured, not run: each replay touches the `n` floats of `x`, which outlives
    ///     // the graph.
    ///     unsafe { scale.launch(&stream, &cfg, (&mut *x, factor, n))? };
    /// }
    /// let mut exec = stream.end_capture()?.instantiate()?;
    /// assert_eq!(exec.kernel_count(), 3);
    /// for _ in 0..10 {
    ///     // SAFETY: `x` and the registry (so the module) outlive the replays.
    ///     unsafe { exec.launch(&stream)? }; // one cuGraphLaunch for three kernels
    /// }
    /// // SAFETY: as for the captured launch it replaces.
    /// unsafe { exec.set_kernel_args(1, &scale, &cfg, (&mut *x, 1.0f32, n))? };
    /// stream.synchronize()?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuStreamBeginCapture_v2")]
    pub fn begin_capture(&self) -> Result<()> {
        if self.raw().is_null() {
            return Err(AtlasError::Capture(CaptureMisuse::LegacyDefaultStream));
        }
        ensure_bound(self.context())?;
        let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        // SAFETY: the stream is live and not the legacy default stream; its context is current.
        unsafe { calls::begin_capture(self.raw(), mode) }?;
        capture::began(self.raw());
        Ok(())
    }

    /// Ends the capture begun by [`begin_capture`](Self::begin_capture) and returns the graph.
    ///
    /// Until then, calls that would break the capture are refused with [`AtlasError::Capture`]
    /// and leave it intact: [`synchronize`](CudaStream::synchronize) of this stream (from any
    /// thread), and from this thread [`DeviceBuffer::alloc`](crate::DeviceBuffer::alloc),
    /// `from_slice` and the copies that wait for their stream. Stream-ordered allocations
    /// ([`DeviceBuffer::alloc_async`](crate::DeviceBuffer::alloc_async)) are captured as graph
    /// nodes.
    #[doc(alias = "cuStreamEndCapture")]
    pub fn end_capture(&self) -> Result<CudaGraph> {
        if in_conditional_body(self.raw()) {
            return Err(AtlasError::Capture(CaptureMisuse::ConditionalBody));
        }
        ensure_bound(self.context())?;
        // SAFETY: the stream is live; its context is current.
        let ended = unsafe { calls::end_capture(self.raw()) };
        // A failed end (an invalidated capture) usually ends the capture too: ask the driver.
        // SAFETY: the stream is live; its context is current.
        if ended.is_ok() || !unsafe { calls::stream_is_capturing(self.raw()) }.unwrap_or(false) {
            capture::ended(self.raw());
        }
        let raw = ended?;
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

    /// The context the graph was captured in.
    pub(crate) fn context(&self) -> CUcontext {
        self.context
    }

    /// The graph's kernel nodes, in the order the driver lists them (for a graph captured from
    /// one stream, the order of the launches).
    pub(crate) fn kernel_nodes(&self) -> Result<Vec<CUgraphNode>> {
        // SAFETY: the graph is live (owned by `self`).
        let nodes = unsafe { calls::graph_nodes(self.raw) }?;
        let mut kernels = Vec::with_capacity(nodes.len());
        for node in nodes {
            // SAFETY: `node` belongs to this live graph.
            let kind = unsafe { calls::graph_node_type(node) }?;
            if kind == CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL {
                kernels.push(node);
            }
        }
        Ok(kernels)
    }
}

impl fmt::Debug for CudaGraph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CudaGraph({:p})", self.raw)
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        let raw = self.raw;
        // SAFETY: the graph is destroyed only here, after any GraphExec made from it (which owns
        // it); its context is made current first.
        let result =
            ensure_bound(self.context).and_then(|()| Ok(unsafe { calls::graph_destroy(raw) }?));
        report_cleanup("destroying a graph", result);
    }
}
