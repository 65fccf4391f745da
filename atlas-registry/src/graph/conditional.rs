//! Conditional graph nodes: an IF or WHILE node (CUDA 12.3+) whose body graph runs, once or over
//! and over, as long as a value on the device says so; an IF node with an ELSE branch, and a SWITCH
//! node that runs one of its n branches (CUDA 12.8+): no host in the loop.
//!
//! A conditional node is added to the graph of a [`Capture`], where the capture stands:
//!
//! 1. [`Capture::conditional_handle`] (or [`Capture::branch_handle`], for a SWITCH) makes the
//!    node's [`ConditionalHandle`] in that graph, with the value every replay starts with.
//! 2. [`Capture::capture_while`], [`Capture::capture_if`], [`Capture::capture_if_else`] and
//!    [`Capture::capture_switch`] add the node and capture its body graphs, one after the other:
//!    each closure's launches, on the body capture it is given, become one body graph.
//! 3. A kernel given the handle as an argument sets the value with the CUDA device function
//!    `cudaGraphSetConditional(handle, value)` (see `kernels/conditional.cu`): 0 ends a WHILE loop
//!    after the current iteration, or skips an IF body (and runs its ELSE branch); a SWITCH runs
//!    branch `value`, and none when `value` is not below its number of branches.
//!
//! The body graphs belong to their node, and so to the captured graph: the driver destroys them
//! with that graph. Atlas never wraps one in a [`CudaGraph`](crate::CudaGraph), and a body's
//! capture ends when its closure returns (the closure gets `&mut Capture`, which cannot be ended).
//! What the bodies' launches need alive (their registries and buffers), in every branch, goes to
//! the captured graph, as for its other launches.
//!
//! Adding a handle or a node changes the capture's graph outside the stream's order, and the
//! driver does not synchronize calls on one graph object: each takes `&mut Capture`, so no launch
//! into the capture (through `&Capture`, from any thread) and no other edit of its graph runs at
//! the same time, and the capture cannot end meanwhile.

use atlas_sys::{
    CUgraph, CUgraphConditionalHandle, CUgraphConditionalNodeType, CUstreamCaptureMode,
};

use crate::device::capture;
use crate::device::context::ensure_bound;
use crate::device::host::{host, ordinal_of};
use crate::device::stream::CudaStream;
use crate::driver::calls;
use crate::error::{AtlasError, CaptureMisuse, GraphFeature, Result};
use crate::graph::capture::{Capture, Kind};
use crate::graph::features::require;
use crate::launch::args::KernelParam;

/// The value of a conditional node, set on the device by `cudaGraphSetConditional`. Passed to a
/// kernel as an argument (8 bytes, the CUDA type `cudaGraphConditionalHandle`).
///
/// Made by [`Capture::conditional_handle`] for the graph being captured, and
/// valid for one conditional node of that graph. A kernel may set it only while it runs inside a
/// replay of that graph (that is part of the launch contract of the kernel it is given to).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConditionalHandle {
    raw: CUgraphConditionalHandle,
    /// The driver's id of the capture the handle was made in: unique for the process, so a handle
    /// is matched with its graph without keeping a graph pointer that could be reused.
    capture: u64,
}

impl ConditionalHandle {
    /// The raw handle, as a kernel receives it.
    pub fn raw(&self) -> u64 {
        self.raw
    }
}

// SAFETY: the parameter is the handle's 8 bytes, stored in the value itself, which the borrow
// keeps unchanged (duty 1); it is not an address of device memory (duty 2).
unsafe impl KernelParam for ConditionalHandle {
    const SIZE: usize = size_of::<CUgraphConditionalHandle>();
    #[inline]
    fn param_ptr(&self) -> *mut std::ffi::c_void {
        (&self.raw as *const CUgraphConditionalHandle)
            .cast_mut()
            .cast()
    }
}

impl Capture<'_> {
    /// Makes a conditional handle in the graph being captured; every replay of that graph starts
    /// with the handle's value set to `initial` (1 for `true`, 0 for `false`).
    ///
    /// # Errors
    ///
    /// [`AtlasError::GraphFeatureUnavailable`] on a driver without conditional nodes (older than
    /// CUDA 12.3), naming the entry points it lacks; [`CaptureMisuse::NotCapturing`] when the
    /// stream's capture was ended outside Atlas.
    #[doc(alias = "cuGraphConditionalHandleCreate")]
    pub fn conditional_handle(&mut self, initial: bool) -> Result<ConditionalHandle> {
        self.branch_handle(u32::from(initial))
    }

    /// As [`conditional_handle`](Self::conditional_handle), for a SWITCH node: every replay
    /// starts with the value set to `initial` (`CU_GRAPH_COND_ASSIGN_DEFAULT`), the branch that
    /// runs unless a kernel sets another with `cudaGraphSetConditional` before the node is
    /// reached (none when it is past the node's branches).
    ///
    /// # Errors
    ///
    /// As [`conditional_handle`](Self::conditional_handle).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn f(registry: &atlas_registry::AtlasRegistry, x: &mut atlas_registry::DeviceBuffer<f32>) -> atlas_registry::Result<()> {
    /// use atlas_registry::{CudaStream, LaunchConfig};
    /// let scale = registry.function_cached("elementwise", "scale")?;
    /// let (n, cfg) = (x.len() as u32, LaunchConfig::for_elements(x.len() as u32, 256));
    /// let mut stream = CudaStream::new(registry.ctx())?;
    /// let mut capture = stream.begin_capture()?;
    /// let cond = capture.branch_handle(2)?; // branch 2 unless a kernel picks another
    /// capture.capture_switch(cond, 3, |branch, body| {
    ///     // SAFETY: touches the `n` floats of `x`, which the graph keeps.
    ///     unsafe { scale.launch(&*body, &cfg, (&mut *x, branch as f32, n)) }
    /// })?;
    /// # drop(capture.end()?); Ok(()) }
    /// ```
    #[doc(alias = "cuGraphConditionalHandleCreate")]
    pub fn branch_handle(&mut self, initial: u32) -> Result<ConditionalHandle> {
        let capture = self.capture_for_conditional()?;
        // SAFETY: the capture's graph is live while the stream captures into it, and nothing else
        // uses it now (`&mut self`); the stream's context is its context.
        let raw =
            unsafe { calls::conditional_handle_create(capture.graph, self.context(), initial) }?;
        Ok(ConditionalHandle {
            raw,
            capture: capture.id,
        })
    }

    /// Adds a WHILE node where this capture stands and captures its body: `body` is given a
    /// capture of the body graph, and the launches it makes there run, at every replay, for as
    /// long as `handle`'s value is not 0 when an iteration ends (and not at all when it is 0 as
    /// the node is reached). A kernel of the body sets the value to 0 to stop. Work captured here
    /// afterwards runs after the loop.
    ///
    /// # Errors
    ///
    /// As [`conditional_handle`](Self::conditional_handle);
    /// [`CaptureMisuse::ForeignConditionalHandle`] when `handle` was made for another capture; any
    /// error `body` returns (the body's capture is ended first).
    #[doc(alias = "CU_GRAPH_COND_TYPE_WHILE")]
    pub fn capture_while(
        &mut self,
        handle: ConditionalHandle,
        body: impl FnOnce(&mut Capture<'_>) -> Result<()>,
    ) -> Result<()> {
        let kind = CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_WHILE;
        self.capture_conditional(handle, (kind, 1), once(body))
    }

    /// Adds an IF node where this capture stands and captures its body: `body` is given a
    /// capture of the body graph, whose launches run at a replay when `handle`'s value is not 0
    /// as the node is reached, and are skipped otherwise. Work captured here afterwards runs
    /// after the node.
    ///
    /// # Errors
    ///
    /// As [`capture_while`](Self::capture_while).
    #[doc(alias = "CU_GRAPH_COND_TYPE_IF")]
    pub fn capture_if(
        &mut self,
        handle: ConditionalHandle,
        body: impl FnOnce(&mut Capture<'_>) -> Result<()>,
    ) -> Result<()> {
        let kind = CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_IF;
        self.capture_conditional(handle, (kind, 1), once(body))
    }

    /// Adds an IF node with an ELSE branch where this capture stands and captures its two
    /// bodies: `then` is given a capture of the first, whose launches run at a replay when
    /// `handle`'s value is not 0 as the node is reached, and `otherwise` a capture of the second,
    /// which runs when it is 0. Work captured here afterwards runs after the node. CUDA 12.8+.
    ///
    /// # Errors
    ///
    /// As [`capture_while`](Self::capture_while); [`AtlasError::GraphFeatureTooOld`] on a driver
    /// older than CUDA 12.8 (naming the release needed and the driver's), before anything is
    /// added. `otherwise` is not called when `then` fails.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn f(registry: &atlas_registry::AtlasRegistry, x: &mut atlas_registry::DeviceBuffer<f32>, y: &mut atlas_registry::DeviceBuffer<f32>, flag: &atlas_registry::DeviceBuffer<i32>) -> atlas_registry::Result<()> {
    /// use atlas_registry::{CudaStream, LaunchConfig};
    /// let set = registry.function_cached("conditional", "set_condition")?; // handle = *flag != 0
    /// let scale = registry.function_cached("elementwise", "scale")?;
    /// let (n, one) = (x.len() as u32, LaunchConfig::for_elements(1, 1));
    /// let cfg = LaunchConfig::for_elements(n, 256);
    /// let mut stream = CudaStream::new(registry.ctx())?;
    /// let mut capture = stream.begin_capture()?;
    /// let cond = capture.conditional_handle(false)?;
    /// // SAFETY: captured, not run: reads the int of `flag`, which outlives the graph, and sets
    /// // `cond`, a handle of this graph, while running in it.
    /// unsafe { set.launch(&capture, &one, (cond, flag))? };
    /// capture.capture_if_else(
    ///     cond,
    ///     // SAFETY: touches the `n` floats of `x`, which the graph keeps.
    ///     |then| unsafe { scale.launch(&*then, &cfg, (&mut *x, 2.0f32, n)) },
    ///     // SAFETY: `y` holds `n` floats too, and the graph keeps it.
    ///     |otherwise| unsafe { scale.launch(&*otherwise, &cfg, (&mut *y, 0.5f32, n)) },
    /// )?;
    /// let exec = capture.end()?.instantiate()?;
    /// // SAFETY: the graph reaches `x` and `y`, which it keeps, and `flag`, which outlives it.
    /// unsafe { exec.launch(&stream)? }; // doubles `x` or halves `y`, as `*flag` says then
    /// # Ok(()) }
    /// ```
    #[doc(alias = "CU_GRAPH_COND_TYPE_IF")]
    pub fn capture_if_else(
        &mut self,
        handle: ConditionalHandle,
        then: impl FnOnce(&mut Capture<'_>) -> Result<()>,
        otherwise: impl FnOnce(&mut Capture<'_>) -> Result<()>,
    ) -> Result<()> {
        require(GraphFeature::IfElse)?;
        let kind = CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_IF;
        let (mut then, mut otherwise) = (once(then), once(otherwise));
        self.capture_conditional(handle, (kind, 2), |branch, body| match branch {
            0 => then(branch, body),
            _ => otherwise(branch, body),
        })
    }

    /// Adds a SWITCH node of `branches` branches where this capture stands and captures each
    /// branch's body: `body` is called once per branch, `0..branches` in order, with the branch's
    /// number and a capture of its body graph. At a replay, branch `v` runs when `handle`'s value
    /// is `v` as the node is reached, and no branch when it is `branches` or more. Work captured
    /// here afterwards runs after the node. CUDA 12.8+.
    ///
    /// # Errors
    ///
    /// As [`capture_if_else`](Self::capture_if_else); [`CaptureMisuse::EmptySwitch`] for
    /// `branches == 0`. After an error of `body`, no later branch is captured.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn f(registry: &atlas_registry::AtlasRegistry, x: &mut atlas_registry::DeviceBuffer<f32>, choice: &atlas_registry::DeviceBuffer<u32>, pick: &atlas_registry::Kernel) -> atlas_registry::Result<()> {
    /// use atlas_registry::{CudaStream, LaunchConfig};
    /// // `pick(handle, const unsigned* choice)` calls cudaGraphSetConditional(handle, *choice).
    /// let scale = registry.function_cached("elementwise", "scale")?;
    /// let (n, factors) = (x.len() as u32, [1.0f32, 2.0, 3.0, 4.0]);
    /// let cfg = LaunchConfig::for_elements(n, 256);
    /// let mut stream = CudaStream::new(registry.ctx())?;
    /// let mut capture = stream.begin_capture()?;
    /// let cond = capture.conditional_handle(false)?;
    /// // SAFETY: captured, not run: reads the word of `choice`, which outlives the graph, and
    /// // sets `cond`, a handle of this graph, while running in it.
    /// unsafe { pick.launch(&capture, &LaunchConfig::for_elements(1, 1), (cond, choice))? };
    /// capture.capture_switch(cond, 4, |branch, body| {
    ///     // SAFETY: each branch touches the `n` floats of `x`, which the graph keeps.
    ///     unsafe { scale.launch(&*body, &cfg, (&mut *x, factors[branch as usize], n)) }
    /// })?;
    /// let exec = capture.end()?.instantiate()?;
    /// // SAFETY: the graph reaches `x`, which it keeps, and `choice`, which outlives it.
    /// unsafe { exec.launch(&stream)? }; // scales `x` by factors[*choice], or not at all past 3
    /// # Ok(()) }
    /// ```
    #[doc(alias = "CU_GRAPH_COND_TYPE_SWITCH")]
    pub fn capture_switch(
        &mut self,
        handle: ConditionalHandle,
        branches: u32,
        body: impl FnMut(u32, &mut Capture<'_>) -> Result<()>,
    ) -> Result<()> {
        require(GraphFeature::Switch)?;
        if branches == 0 {
            return Err(AtlasError::Capture(CaptureMisuse::EmptySwitch));
        }
        let kind = CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_SWITCH;
        self.capture_conditional(handle, (kind, branches), body)
    }

    /// Adds the conditional node of `shape` (its kind and number of bodies) and captures each
    /// body with `body`, given the branch's number.
    fn capture_conditional(
        &mut self,
        handle: ConditionalHandle,
        shape: (CUgraphConditionalNodeType, u32),
        mut body: impl FnMut(u32, &mut Capture<'_>) -> Result<()>,
    ) -> Result<()> {
        let (mut body_stream, graphs) = self.add_conditional(handle, shape)?;
        for (branch, graph) in (0..).zip(graphs) {
            self.capture_body(&mut body_stream, graph, |capture| body(branch, capture))?;
        }
        Ok(())
    }

    /// Adds the conditional node of `shape` where this capture stands: work captured here
    /// afterwards depends on it. Returns a new stream to capture its bodies on, and the bodies.
    fn add_conditional(
        &mut self,
        handle: ConditionalHandle,
        shape: (CUgraphConditionalNodeType, u32),
    ) -> Result<(CudaStream, Vec<CUgraph>)> {
        let capture = self.capture_for_conditional()?;
        if capture.id != handle.capture {
            return Err(AtlasError::Capture(CaptureMisuse::ForeignConditionalHandle));
        }
        let Some(ordinal) = ordinal_of(self.context()) else {
            // Every CudaStream is made with a CudaContext, which is some host's primary context.
            return Err(AtlasError::WrongContext {
                what: "the capturing stream".into(),
                expected: None,
                given: None,
            });
        };
        let body_stream = CudaStream::new(host(ordinal)?.context())?;
        // SAFETY: the capture's graph is live and of the stream's context, which is current
        // (`capture_for_conditional`), and nothing else uses it now (`&mut self`); the
        // dependencies are the capture's own, just read; the handle is of this graph (checked
        // above); the shape is one of the public callers', whose feature was required.
        let (node, bodies) = unsafe {
            calls::add_conditional_node(
                capture.graph,
                &capture.dependencies,
                &capture.edges,
                handle.raw,
                shape,
                self.context(),
            )
        }?;
        // SAFETY: the stream is live and capturing into the graph `node` was just added to;
        // nothing else enqueues into it now (`&mut self`).
        unsafe { calls::set_capture_dependency(self.raw(), node) }?;
        Ok((body_stream, bodies))
    }

    /// Captures `body`'s work on `body_stream` into `graph`, a body of a conditional node of this
    /// capture's graph; what its launches need goes to this capture's graph.
    fn capture_body(
        &self,
        body_stream: &mut CudaStream,
        graph: CUgraph,
        body: impl FnOnce(&mut Capture<'_>) -> Result<()>,
    ) -> Result<()> {
        // A body before this one may have left another context current.
        ensure_bound(self.context())?;
        let raw = body_stream.raw();
        capture::began_body(raw, self.context(), self.raw());
        let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        // SAFETY: the body stream is live, not null and not capturing (made by `add_conditional`,
        // and each body's capture is ended before the next begins), used by no one else, in the
        // graph's context, which is current; the body graph lives as long as its node's graph.
        if let Err(e) = unsafe { calls::begin_capture_to_graph(raw, graph, mode) } {
            drop(capture::ended(raw));
            return Err(e.into());
        }
        let captured = body(&mut Capture::new(body_stream, Kind::Body));
        // The graph the end returns is the body graph, owned by the node: it is dropped here as a
        // raw handle, never destroyed. `ensure_bound` undoes any context change `body` made.
        // SAFETY: the body stream is live and capturing (begun above); its context is current;
        // nothing else enqueues into it (the body's capture, the only reference, is gone).
        let ended =
            ensure_bound(self.context()).and_then(|()| Ok(unsafe { calls::end_capture(raw) }?));
        drop(capture::ended(raw));
        captured?;
        ended.map(|_body_graph| ())
    }

    /// The capture's state, checked to be one a conditional node can be added to.
    fn capture_for_conditional(&self) -> Result<calls::CaptureState> {
        require(GraphFeature::Conditional)?;
        ensure_bound(self.context())?;
        // SAFETY: the stream is live and not null (a capture); its context is current.
        let state = unsafe { calls::capture_state(self.raw()) }?;
        state.ok_or(AtlasError::Capture(CaptureMisuse::NotCapturing))
    }
}

/// `body` as the body of a node's one branch: called for the first branch it is given, a no-op
/// after (the node has that one branch).
fn once(
    body: impl FnOnce(&mut Capture<'_>) -> Result<()>,
) -> impl FnMut(u32, &mut Capture<'_>) -> Result<()> {
    let mut body = Some(body);
    move |_, capture| body.take().map_or(Ok(()), |body| body(capture))
}
