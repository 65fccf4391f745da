//! Conditional graph nodes (CUDA 12.3+): an IF or WHILE node whose body graph runs, once or over
//! and over, as long as a value on the device says so, with no host in the loop.
//!
//! A conditional node is added to the graph a stream is capturing into, where the capture stands:
//!
//! 1. [`CudaStream::conditional_handle`] makes the node's [`ConditionalHandle`] in that graph,
//!    with the value every replay starts with.
//! 2. [`CudaStream::capture_while`] / [`CudaStream::capture_if`] add the node and capture its body:
//!    the closure's launches, on the body stream it is given, become the body graph.
//! 3. A kernel given the handle as an argument sets the value with the CUDA device function
//!    `cudaGraphSetConditional(handle, value)` (see `kernels/conditional.cu`): 0 ends a WHILE loop
//!    after the current iteration, or skips an IF body.
//!
//! The body graph belongs to its node, and so to the captured graph: the driver destroys it with
//! that graph. Atlas never wraps it in a [`CudaGraph`](crate::CudaGraph), and refuses
//! [`end_capture`](CudaStream::end_capture) on the body stream and on the capturing stream while
//! the body is being captured (either would hand out a graph that is not the caller's to own).
//! What the body's launches need alive (their registries and buffers) goes to the captured graph,
//! as for its other launches.
//!
//! Adding a handle or a node, and beginning and ending the capture of a body, change the capture's
//! graph outside the stream's order; they hold the graph-edit lock that `end_capture` holds too,
//! so that no other thread ends the capture (and drops the graph) in between, nor edits the same
//! graph at once (the driver does not synchronize calls on one graph object).

use atlas_sys::{CUgraphConditionalHandle, CUgraphConditionalNodeType, CUstreamCaptureMode};

use crate::device::capture;
use crate::device::context::ensure_bound;
use crate::device::host::{host, ordinal_of};
use crate::device::stream::CudaStream;
use crate::driver::calls;
use crate::error::{AtlasError, CaptureMisuse, GraphFeature, Result};
use crate::graph::capture::edits;
use crate::graph::features::require;
use crate::launch::args::KernelParam;

/// The value of a conditional node, set on the device by `cudaGraphSetConditional`. Passed to a
/// kernel as an argument (8 bytes, the CUDA type `cudaGraphConditionalHandle`).
///
/// Made by [`CudaStream::conditional_handle`] for the graph that stream is capturing into, and
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

impl CudaStream {
    /// Makes a conditional handle in the graph this stream is capturing into; every replay of that
    /// graph starts with the handle's value set to `initial` (1 for `true`, 0 for `false`).
    ///
    /// # Errors
    ///
    /// [`AtlasError::GraphFeatureUnavailable`] on a driver without conditional nodes (older than
    /// CUDA 12.3), naming the entry points it lacks; [`CaptureMisuse::NotCapturing`] when the
    /// stream is not capturing.
    #[doc(alias = "cuGraphConditionalHandleCreate")]
    pub fn conditional_handle(&self, initial: bool) -> Result<ConditionalHandle> {
        let _edits = edits();
        let capture = self.capture_for_conditional()?;
        // SAFETY: the capture's graph is live while the stream captures into it; the stream's
        // context is its context.
        let raw = unsafe {
            calls::conditional_handle_create(capture.graph, self.context(), u32::from(initial))
        }?;
        Ok(ConditionalHandle {
            raw,
            capture: capture.id,
        })
    }

    /// Adds a WHILE node where this stream's capture stands and captures its body: `body` is given
    /// a stream capturing into the body graph, and the launches it makes there run, at every
    /// replay, for as long as `handle`'s value is not 0 when an iteration ends (and not at all
    /// when it is 0 as the node is reached). A kernel of the body sets the value to 0 to stop.
    /// Work captured on this stream afterwards runs after the loop.
    ///
    /// # Errors
    ///
    /// As [`conditional_handle`](Self::conditional_handle);
    /// [`CaptureMisuse::ForeignConditionalHandle`] when `handle` was made for another capture; any
    /// error `body` returns (the body's capture is ended first).
    #[doc(alias = "CU_GRAPH_COND_TYPE_WHILE")]
    pub fn capture_while(
        &self,
        handle: ConditionalHandle,
        body: impl FnOnce(&CudaStream) -> Result<()>,
    ) -> Result<()> {
        let kind = CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_WHILE;
        self.capture_conditional(handle, kind, body)
    }

    /// Adds an IF node where this stream's capture stands and captures its body: `body` is given a
    /// stream capturing into the body graph, whose launches run at a replay when `handle`'s value
    /// is not 0 as the node is reached, and are skipped otherwise. Work captured on this stream
    /// afterwards runs after the node.
    ///
    /// # Errors
    ///
    /// As [`capture_while`](Self::capture_while).
    #[doc(alias = "CU_GRAPH_COND_TYPE_IF")]
    pub fn capture_if(
        &self,
        handle: ConditionalHandle,
        body: impl FnOnce(&CudaStream) -> Result<()>,
    ) -> Result<()> {
        let kind = CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_IF;
        self.capture_conditional(handle, kind, body)
    }

    fn capture_conditional(
        &self,
        handle: ConditionalHandle,
        kind: CUgraphConditionalNodeType,
        body: impl FnOnce(&CudaStream) -> Result<()>,
    ) -> Result<()> {
        let body_stream = self.begin_body(handle, kind)?;
        let captured = body(&body_stream);
        let ended = {
            let _edits = edits();
            // The graph the end returns is the body graph, owned by the node: it is dropped here
            // as a raw handle, never destroyed. `ensure_bound` undoes any context change `body`
            // made.
            // SAFETY: the body stream is live and capturing (begun above); its context is current.
            let ended = ensure_bound(self.context())
                .and_then(|()| Ok(unsafe { calls::end_capture(body_stream.raw()) }?));
            drop(capture::ended(body_stream.raw()));
            ended
        };
        captured?;
        ended.map(|_body_graph| ())
    }

    /// Adds the conditional node where this stream's capture stands, and begins capturing its
    /// body on a new stream, which it returns.
    fn begin_body(
        &self,
        handle: ConditionalHandle,
        kind: CUgraphConditionalNodeType,
    ) -> Result<CudaStream> {
        let _edits = edits();
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
        // No other thread ends the capture while this holds the graph-edit lock; the stream's
        // context is current (`capture_for_conditional`); the handle is this capture's (above).
        // SAFETY: as just said, the capture's graph is live and of the stream's context, and the
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
        // SAFETY: the stream is live and capturing into the graph `node` was just added to.
        unsafe { calls::set_capture_dependency(self.raw(), node) }?;
        capture::began_body(body_stream.raw(), self.raw());
        let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        // SAFETY: the body stream was just created (live, not null, not capturing) in the graph's
        // context, which is current; the body graph lives as long as its node's graph.
        let begun = unsafe { calls::begin_capture_to_graph(body_stream.raw(), body_graph, mode) };
        if let Err(e) = begun {
            drop(capture::ended(body_stream.raw()));
            return Err(e.into());
        }
        Ok(body_stream)
    }

    /// The capture this stream is in, checked to be one a conditional node can be added to.
    fn capture_for_conditional(&self) -> Result<calls::CaptureState> {
        require(GraphFeature::Conditional)?;
        if self.raw().is_null() {
            return Err(AtlasError::Capture(CaptureMisuse::LegacyDefaultStream));
        }
        ensure_bound(self.context())?;
        // SAFETY: the stream is live and not null; its context is current.
        let state = unsafe { calls::capture_state(self.raw()) }?;
        state.ok_or(AtlasError::Capture(CaptureMisuse::NotCapturing))
    }
}
