//! Conditional graph nodes (CUDA 12.3+): an IF or WHILE node whose body graph runs, once or over
//! and over, as long as a value on the device says so, with no host in the loop.
//!
//! A conditional node is added to the graph of a [`Capture`], where the capture stands:
//!
//! 1. [`Capture::conditional_handle`] makes the node's [`ConditionalHandle`] in that graph, with
//!    the value every replay starts with.
//! 2. [`Capture::capture_while`] / [`Capture::capture_if`] add the node and capture its body: the
//!    closure's launches, on the body capture it is given, become the body graph.
//! 3. A kernel given the handle as an argument sets the value with the CUDA device function
//!    `cudaGraphSetConditional(handle, value)` (see `kernels/conditional.cu`): 0 ends a WHILE loop
//!    after the current iteration, or skips an IF body.
//!
//! The body graph belongs to its node, and so to the captured graph: the driver destroys it with
//! that graph. Atlas never wraps it in a [`CudaGraph`](crate::CudaGraph), and the body's capture
//! ends when its closure returns (the closure gets `&mut Capture`, which cannot be ended). What the
//! body's launches need alive (their registries and buffers) goes to the captured graph, as for
//! its other launches.
//!
//! Adding a handle or a node changes the capture's graph outside the stream's order, and the
//! driver does not synchronize calls on one graph object: each takes `&mut Capture`, so no launch
//! into the capture (through `&Capture`, from any thread) and no other edit of its graph runs at
//! the same time, and the capture cannot end meanwhile.

use atlas_sys::{CUgraphConditionalHandle, CUgraphConditionalNodeType, CUstreamCaptureMode};

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
        let capture = self.capture_for_conditional()?;
        // SAFETY: the capture's graph is live while the stream captures into it, and nothing else
        // uses it now (`&mut self`); the stream's context is its context.
        let raw = unsafe {
            calls::conditional_handle_create(capture.graph, self.context(), u32::from(initial))
        }?;
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
        self.capture_conditional(handle, kind, body)
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
        self.capture_conditional(handle, kind, body)
    }

    fn capture_conditional(
        &mut self,
        handle: ConditionalHandle,
        kind: CUgraphConditionalNodeType,
        body: impl FnOnce(&mut Capture<'_>) -> Result<()>,
    ) -> Result<()> {
        let mut body_stream = self.begin_body(handle, kind)?;
        let raw = body_stream.raw();
        let captured = body(&mut Capture::new(&mut body_stream, Kind::Body));
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

    /// Adds the conditional node where this capture stands, and begins capturing its body on a
    /// new stream, which it returns.
    fn begin_body(
        &mut self,
        handle: ConditionalHandle,
        kind: CUgraphConditionalNodeType,
    ) -> Result<CudaStream> {
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
        // dependencies are the capture's own, just read.
        let (node, body_graph) = unsafe {
            calls::add_conditional_node(
                capture.graph,
                &capture.dependencies,
                &capture.edges,
                handle.raw,
                kind,
                self.context(),
            )
        }?;
        // SAFETY: the stream is live and capturing into the graph `node` was just added to;
        // nothing else enqueues into it now (`&mut self`).
        unsafe { calls::set_capture_dependency(self.raw(), node) }?;
        capture::began_body(body_stream.raw(), self.context(), self.raw());
        let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        // SAFETY: the body stream was just created (live, not null, not capturing, used by no
        // one else) in the graph's context, which is current; the body graph lives as long as
        // its node's graph.
        let begun = unsafe { calls::begin_capture_to_graph(body_stream.raw(), body_graph, mode) };
        if let Err(e) = begun {
            drop(capture::ended(body_stream.raw()));
            return Err(e.into());
        }
        Ok(body_stream)
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
