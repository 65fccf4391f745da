//! Stream capture: [`CudaStream::begin_capture`] and [`CudaStream::end_capture`], and the captured
//! [`CudaGraph`], which owns what its launches need.

use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};

use atlas_sys::{CUcontext, CUgraph, CUgraphNode, CUgraphNodeType, CUstreamCaptureMode};

use crate::device::capture::{self, Keep};
use crate::device::context::ensure_bound;
use crate::device::stream::CudaStream;
use crate::driver::calls;
use crate::error::{AtlasError, CaptureMisuse, Result, report_cleanup};

/// Serializes the calls that change a capture's graph outside the stream's own order (conditional
/// handles and nodes, and the capture of a node's body) with each other and with the end of the
/// capture, after which the graph may be dropped: the driver does not synchronize calls on one
/// graph object, and [`CudaStream`] is shared between threads.
static EDITS: Mutex<()> = Mutex::new(());

/// Holds the graph-edit lock for the guard's life.
pub(crate) fn edits() -> MutexGuard<'static, ()> {
    EDITS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A captured graph, not yet instantiated.
///
/// It owns what its kernels need: the registry of every kernel a typed or raw launch of Atlas
/// captured into it (so the modules stay loaded), and the memory of every
/// [`DeviceBuffer`](crate::DeviceBuffer) given to a captured typed launch (a buffer dropped
/// meanwhile leaves its free to the graph). So instantiating it, and replaying what comes of it,
/// is safe after those registries and buffers are gone.
pub struct CudaGraph {
    raw: CUgraph,
    context: CUcontext,
    /// What the graph's launches need alive; dropped after the graph is destroyed.
    keep: Keep,
}

// SAFETY: a CUgraph is a driver handle; the driver allows using it from any thread as long as
// calls on one graph are not concurrent, which `&mut`/ownership here guarantees for mutation.
// What `keep` holds is Send + Sync.
unsafe impl Send for CudaGraph {}
// SAFETY: shared references only read the graph (node lists, instantiation).
unsafe impl Sync for CudaGraph {}

impl CudaStream {
    /// Starts capturing the work enqueued on this stream by this thread into a graph
    /// (`CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`). Nothing runs until the graph is replayed.
    /// The legacy default stream cannot be captured ([`AtlasError::Capture`]).
    ///
    /// Every launch of Atlas captured into the graph leaves it what the kernel needs (see
    /// [`CudaGraph`]): also a launch on another stream that joins the capture (by waiting for an
    /// event recorded on this one), and a launch made by another thread on this stream while the
    /// capture begins or ends, unless the capture both begins and ends while that one launch is
    /// being enqueued.
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
        capture::began(self.raw());
        // SAFETY: the stream is live and not the legacy default stream; its context is current.
        if let Err(e) = unsafe { calls::begin_capture(self.raw(), mode) } {
            drop(capture::ended(self.raw()));
            return Err(e.into());
        }
        // SAFETY: the stream is live, not null, and capturing (just begun).
        if let Ok(Some(id)) = unsafe { calls::capture_id(self.raw()) } {
            capture::set_id(self.raw(), id);
        }
        Ok(())
    }

    /// Ends the capture begun by [`begin_capture`](Self::begin_capture) and returns the graph,
    /// which owns what its launches need.
    ///
    /// Until then, calls that would break the capture are refused with [`AtlasError::Capture`]
    /// and leave it intact: [`synchronize`](CudaStream::synchronize) of this stream (from any
    /// thread), and from this thread [`DeviceBuffer::alloc`](crate::DeviceBuffer::alloc),
    /// `from_slice` and the copies that wait for their stream. Stream-ordered allocations
    /// ([`DeviceBuffer::alloc_async`](crate::DeviceBuffer::alloc_async)) are captured as graph
    /// nodes. A free that would break the capture waits for it to end.
    ///
    /// Refused ([`CaptureMisuse::NotBegun`]) for a stream whose capture `begin_capture` did not
    /// begin, and ([`CaptureMisuse::ConditionalBody`]) while a conditional node's body is being
    /// captured into it.
    #[doc(alias = "cuStreamEndCapture")]
    pub fn end_capture(&self) -> Result<CudaGraph> {
        let _edits = edits();
        if capture::has_open_body(self.raw()) {
            return Err(AtlasError::Capture(CaptureMisuse::ConditionalBody));
        }
        if !capture::is_begun(self.raw()) {
            return Err(AtlasError::Capture(CaptureMisuse::NotBegun));
        }
        ensure_bound(self.context())?;
        // SAFETY: the stream is live; its context is current.
        match unsafe { calls::end_capture(self.raw()) } {
            Ok(raw) => Ok(CudaGraph {
                raw,
                context: self.context(),
                keep: capture::ended(self.raw()),
            }),
            Err(e) => {
                // A failed end (an invalidated capture) usually ends the capture too: ask the
                // driver.
                // SAFETY: the stream is live; its context is current.
                if !unsafe { calls::stream_is_capturing(self.raw()) }.unwrap_or(false) {
                    drop(capture::ended(self.raw()));
                }
                Err(e.into())
            }
        }
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

    /// What the graph keeps alive.
    pub(crate) fn keep(&self) -> &Keep {
        &self.keep
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
        write!(f, "CudaGraph({:p}, keeps {})", self.raw, self.keep.len())
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        let raw = self.raw;
        // What its kernels need is still kept while it is destroyed: `keep` is dropped after this.
        let result = ensure_bound(self.context).and_then(|()| {
            // SAFETY: destroyed only here, after any GraphExec made from it (which owns it), its
            // context current (above).
            Ok(unsafe { calls::graph_destroy(raw) }?)
        });
        report_cleanup("destroying a graph", result);
    }
}
