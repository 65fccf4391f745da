//! What a launch captured into a graph leaves the graph to keep alive ([`GraphHolds`]), and the
//! check around every launch that finds out whether it is captured.
//!
//! Outside a capture this costs one atomic load per launch and nothing else: no lock, no
//! reference count, no allocation, no driver call. Only while Atlas captures somewhere in the
//! process does a launch look for the capture its stream belongs to, and only a captured launch
//! takes references for the graph.

use std::sync::{Arc, Weak};

use atlas_sys::CUstream;

use crate::device::capture::{self, Hold};
use crate::error::Result;
use crate::memory::buffer::{DeviceBuffer, DeviceCopy};

/// What a graph keeps alive for one captured launch, gathered from its arguments by
/// [`KernelParam::hold_for_graph`](crate::KernelParam::hold_for_graph): the memory of its
/// [`DeviceBuffer`] arguments, which the graph then frees when it is the last to use it.
///
/// Only Atlas makes one; an argument type adds to it only buffers of Atlas's own.
pub struct GraphHolds {
    held: Vec<Hold>,
}

impl GraphHolds {
    /// Nothing gathered yet, with room for a registry and a few buffers.
    pub(crate) fn new() -> Self {
        Self {
            held: Vec::with_capacity(4),
        }
    }

    /// Keeps `buffer`'s memory allocated while the graph lives: dropped before the graph, the
    /// buffer leaves the free to it. A stream-ordered buffer allocated in the capture itself is
    /// the graph's own allocation (its allocation and free are graph nodes) and is not held.
    pub fn buffer<T: DeviceCopy>(&mut self, buffer: &DeviceBuffer<T>) {
        if let Some(hold) = buffer.hold_for_graph() {
            self.held.push(hold);
        }
    }

    /// Keeps the registry behind `owner` (so its modules stay loaded).
    pub(crate) fn registry(&mut self, owner: &Weak<dyn Send + Sync>) {
        if let Some(registry) = owner.upgrade() {
            self.held.push(registry);
        }
    }

    /// Keeps `registry` (so its modules stay loaded).
    pub(crate) fn registry_of(&mut self, registry: &Arc<impl Send + Sync + 'static>) {
        self.held.push(Arc::clone(registry) as Hold);
    }

    /// What was gathered.
    pub(crate) fn into_held(self) -> Vec<Hold> {
        self.held
    }
}

/// Enqueues a launch (`launch`, told whether it is captured) on `stream` and, when a capture
/// Atlas began takes it in, leaves the graph what `gather` finds (`attributed`: a launch with
/// cluster dimensions or a cooperative one). Looked for once, before the launch: a capture of
/// `stream` begins and ends only through `&mut CudaStream` (a raw stream's caller vouches for as
/// much), so none begins or ends while this launch is enqueued.
#[inline(always)]
pub(crate) fn enqueue(
    stream: CUstream,
    attributed: bool,
    gather: impl Fn(&mut GraphHolds),
    launch: impl FnOnce(bool) -> Result<()>,
) -> Result<()> {
    let captured = capture::watch().capturing() && hold_for_capture(stream, attributed, &gather);
    launch(captured)
}

/// When `stream` is captured by a capture Atlas began, leaves its graph what `gather` finds and
/// says so.
#[cold]
#[inline(never)]
fn hold_for_capture(stream: CUstream, attributed: bool, gather: &dyn Fn(&mut GraphHolds)) -> bool {
    let Some(graph) = capture::graph_of(stream) else {
        return false;
    };
    let mut holds = GraphHolds::new();
    gather(&mut holds);
    capture::hold(graph, holds.held, attributed);
    true
}
