//! Whole-graph update of an executable graph from a newly captured graph
//! ([`GraphExec::update`]), falling back to a new instantiation when the driver cannot pair the
//! two, and upload of an executable graph ahead of its first replay ([`GraphExec::upload`]).
//!
//! An inference engine captures its step again when shapes or buffers change; updating the
//! executable graph in place costs a fraction of instantiating it again, and keeps the same
//! [`GraphExec`] (and everything that holds it) valid.

use crate::device::context::ensure_bound;
use crate::device::host::ordinal_of;
use crate::device::stream::CudaStream;
use crate::driver::calls;
use crate::error::{AtlasError, GraphFeature, Result, UpdateRefusal, report_cleanup};
use crate::graph::capture::CudaGraph;
use crate::graph::exec::{GraphExec, Updated};
use crate::graph::features::require;

/// What [`GraphExec::update`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum GraphUpdate {
    /// The executable graph was updated in place (`cuGraphExecUpdate`): same topology, the new
    /// graph's parameters.
    Updated,
    /// The driver could not update it, for `reason`; the new graph was instantiated and replaced
    /// the executable graph.
    Reinstantiated {
        /// Why the driver refused the update.
        reason: UpdateRefusal,
    },
}

impl GraphExec {
    /// Makes later replays run `graph`, a graph captured anew (new kernel arguments, functions or
    /// launch configurations): updated in place when the driver can pair the two graphs node for
    /// node ([`GraphUpdate::Updated`]), else by instantiating `graph`
    /// ([`GraphUpdate::Reinstantiated`], with the driver's reason). Either way `self` stays the
    /// handle to replay; a replay already enqueued runs what it was enqueued with.
    ///
    /// After an in-place update the executable graph keeps naming its kernel nodes by the graph it
    /// was instantiated from (the driver's node handles for
    /// [`set_kernel_args`](Self::set_kernel_args) are those of that graph), so that graph is kept;
    /// the kernel node indices stay the launch order of that graph, which a same-topology capture
    /// repeats. `self` keeps `graph` too, in place of the graph of an earlier update, for what it
    /// keeps alive (the registries and buffers of its launches): what only earlier captures and
    /// argument updates used is released. After a new instantiation `self` owns `graph` and its
    /// kernel nodes. On an error nothing changed: the executable graph replays what it did.
    ///
    /// # Safety
    ///
    /// As [`launch`](Self::launch), for the kernels of `graph`, at every later replay:
    /// 1. Memory `graph`'s kernels reach that the graph does not keep (addresses passed as
    ///    integers, captured copies) is allocated, and each kernel's contract (as for
    ///    [`Kernel::launch`](crate::Kernel)) holds for its arguments as captured.
    /// 2. A function `graph` launches that came to a raw launch from elsewhere than the registry it
    ///    was launched through is still loaded.
    ///
    /// # Errors
    ///
    /// [`AtlasError::WrongContext`] when `graph` was captured in another context;
    /// [`AtlasError::GraphFeatureUnavailable`] when the driver lacks `cuGraphExecUpdate_v2`; a
    /// driver error from the update or the instantiation.
    #[doc(alias = "cuGraphExecUpdate_v2")]
    pub unsafe fn update(&mut self, graph: CudaGraph) -> Result<GraphUpdate> {
        let context = self.graph.context();
        if graph.context() != context {
            return Err(AtlasError::WrongContext {
                what: "the new graph".into(),
                expected: ordinal_of(context),
                given: ordinal_of(graph.context()),
            });
        }
        require(GraphFeature::Update)?;
        ensure_bound(context)?;
        // SAFETY: both graphs are live (owned by `self` and by `graph`), of one context (checked
        // above), which is current; the modules of their kernels are loaded (each graph keeps its
        // registries); what the new parameters do at replays is the caller's duty.
        let result = unsafe { calls::graph_exec_update(self.raw, graph.raw()) }?;
        let Some(reason) = UpdateRefusal::from_result(result.0) else {
            // The executable graph runs `graph`'s parameters now: it keeps what they need, and
            // releases what only the replaced ones did.
            self.updated = Some(Updated {
                graph,
                kernel_nodes: None,
            });
            self.node_keeps.clear();
            return Ok(GraphUpdate::Updated);
        };
        let kernel_nodes = graph.kernel_nodes()?;
        // SAFETY: `graph` is live; its context is current (above); the modules of its kernels are
        // loaded (it keeps their registries).
        let raw = unsafe { calls::graph_instantiate(graph.raw()) }?;
        let old = std::mem::replace(&mut self.raw, raw);
        // SAFETY: `old` was this executable graph, replaced above and destroyed once, here; the
        // context is current. A replay still in flight finishes first: the driver frees an
        // executable graph in use when its work is done.
        let destroyed = unsafe { calls::graph_exec_destroy(old) }.map_err(AtlasError::from);
        report_cleanup("destroying the replaced executable graph", destroyed);
        // What the old executable graph needed is released after it is destroyed.
        self.kernel_nodes = kernel_nodes;
        drop(std::mem::replace(&mut self.graph, graph));
        self.updated = None;
        self.node_keeps.clear();
        Ok(GraphUpdate::Reinstantiated { reason })
    }

    /// Uploads the executable graph's work to the device on `stream` (`cuGraphUpload`), so that
    /// the first replay does not pay for it; replays on `stream` are ordered after it. Nothing
    /// runs.
    ///
    /// # Errors
    ///
    /// [`AtlasError::WrongContext`] when `stream` is of another context than the graph;
    /// [`AtlasError::GraphFeatureUnavailable`] when the driver lacks `cuGraphUpload`.
    #[doc(alias = "cuGraphUpload")]
    pub fn upload(&self, stream: &CudaStream) -> Result<()> {
        if stream.context() != self.graph.context() {
            return Err(self.wrong_context("the stream", stream));
        }
        require(GraphFeature::Update)?;
        stream.bind_if_default()?;
        // SAFETY: the executable graph is live (owned), the stream live and of its context
        // (checked above; the legacy default stream with that context made current); the modules
        // of its kernels are loaded (its graphs keep their registries).
        Ok(unsafe { calls::graph_upload(self.raw, stream.raw()) }?)
    }
}
