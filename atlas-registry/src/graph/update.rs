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
use crate::graph::exec::GraphExec;
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
    /// [`set_kernel_args`](Self::set_kernel_args) are those of that graph), so that graph is kept
    /// and `graph` is dropped; the kernel node indices stay the launch order of that graph, which
    /// a same-topology capture repeats. After a new instantiation `self` owns `graph` and its
    /// kernel nodes. On an error nothing changed: the executable graph replays what it did.
    ///
    /// # Safety
    ///
    /// As [`launch`](Self::launch), for the kernels of `graph`, at every later replay:
    /// 1. Every device allocation `graph`'s kernels use (their pointer arguments as captured) is
    ///    still allocated, and each kernel's contract (as for [`Kernel::launch`](crate::Kernel))
    ///    holds for those arguments.
    /// 2. Every module whose kernels `graph` launches is still loaded.
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
        // above), which is current; what the new parameters do at replays is the caller's duty.
        let result = unsafe { calls::graph_exec_update(self.raw, graph.raw()) }?;
        let Some(reason) = UpdateRefusal::from_result(result.0) else {
            return Ok(GraphUpdate::Updated);
        };
        let kernel_nodes = graph.kernel_nodes()?;
        // SAFETY: `graph` is live; its context is current (above).
        let raw = unsafe { calls::graph_instantiate(graph.raw()) }?;
        let old = std::mem::replace(&mut self.raw, raw);
        self.kernel_nodes = kernel_nodes;
        drop(std::mem::replace(&mut self.graph, graph));
        // SAFETY: `old` was this executable graph, replaced above and destroyed once, here; the
        // context is current. A replay still in flight finishes first: the driver frees an
        // executable graph in use when its work is done.
        let destroyed = unsafe { calls::graph_exec_destroy(old) }.map_err(AtlasError::from);
        report_cleanup("destroying the replaced executable graph", destroyed);
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
        let context = self.graph.context();
        if stream.context() != context {
            return Err(AtlasError::WrongContext {
                what: "the stream".into(),
                expected: ordinal_of(context),
                given: ordinal_of(stream.context()),
            });
        }
        require(GraphFeature::Update)?;
        stream.bind_if_default()?;
        // SAFETY: the executable graph is live (owned), the stream live and of its context
        // (checked above; the legacy default stream with that context made current).
        Ok(unsafe { calls::graph_upload(self.raw, stream.raw()) }?)
    }
}
