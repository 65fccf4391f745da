//! Atlas's record of the stream captures it began: the calls that would break them (refused
//! beforehand), what the graphs they build must keep alive, and the frees that wait for them.
//!
//! Some calls break a capture in progress: synchronizing a stream that is being captured
//! invalidates its capture, and `cuMemAlloc` (or a copy that waits for its stream) from a thread
//! that is capturing in `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL` is refused by the driver and
//! invalidates that capture too, so the whole sequence is lost at its end. Atlas refuses them
//! beforehand, with a typed error, and the capture goes on.
//!
//! A free cannot be refused (a buffer's drop returns nothing), so a free that would break a
//! capture waits for it instead ([`free`]): `cuMemFree` from a capturing thread, and the free of
//! memory that graphs used or that was imported from another process (which synchronizes the
//! context first), and the unmap of virtual memory (which synchronizes it too), wait for that
//! thread's captures to end; `cuMemFreeAsync` on a stream being captured (of memory allocated
//! before the capture) waits for that capture to end. The release of page-locked host memory
//! (`cuMemFreeHost`, `cuMemHostUnregister`) from a capturing thread waits as `cuMemFree` does. In thread-local mode a capture is not disturbed by
//! what other threads call, so a free from a thread that is not capturing is made at once, and
//! never under the record's lock.
//!
//! A launch captured into a graph leaves the graph something to keep alive: the registry of the
//! kernel (so its module stays loaded) and the allocations of its buffer arguments. The record
//! gathers them per capture ([`hold`]) and hands them to the graph when the capture ends
//! ([`ended`]). A conditional node's body is captured on a stream of its own, recorded with the
//! capture it belongs to, so what its launches leave goes to the same graph.
//!
//! The record, not the driver, answers: asking the driver (`cuStreamIsCapturing`) would add a
//! driver call to every synchronize and every launch. With no capture in progress, a check is one
//! atomic load; while Atlas captures somewhere in the process, it is a short lock of a list that
//! holds one entry per capture in progress ([`record`] holds the protocol, and no driver call is
//! ever made under its lock). Captures begun outside Atlas (raw `cuStreamBeginCapture`) are not
//! in the record: the driver keeps refusing what breaks them, and what their graphs launch is
//! theirs to keep alive.

mod record;
mod sync;

use record::{Captures, Conflict, Lookup, Record, StreamKey};
pub(crate) use record::{Hold, Keep, Watch};

use std::sync::atomic::AtomicU64;
use std::sync::{Condvar, Mutex};

use atlas_sys::{CUcontext, CUdeviceptr, CUstream};

use crate::device::context::ensure_bound;
use crate::driver::calls;
use crate::error::{AtlasError, CaptureMisuse, Result, report_cleanup};

/// The record's word: captures in progress and begun, read by every launch.
static STATE: AtomicU64 = AtomicU64::new(0);
/// The captures in progress, what their graphs will keep, and the frees that wait for them.
static RECORD: Mutex<Record<Free>> = Mutex::new(Record::new());
/// Signalled when a free's synchronization of a context is over.
static SYNCED: Condvar = Condvar::new();

/// The process-wide record.
#[inline(always)]
fn captures() -> Captures<'static, Free> {
    Captures::new(&STATE, &RECORD, &SYNCED)
}

impl From<CUstream> for StreamKey {
    fn from(stream: CUstream) -> Self {
        Self(stream.addr())
    }
}

/// A free of device memory (or of what host functions of graphs use), and how it is made.
pub(crate) struct Free {
    /// The allocation's context, as an address (a handle, never dereferenced here).
    context: usize,
    ptr: CUdeviceptr,
    how: How,
    /// Host data that work of the context may still use (a captured host function), dropped
    /// after the device's work.
    payload: Option<Box<dyn Send>>,
    /// For [`How::Host`]: the release of page-locked host memory.
    host: Option<HostRelease>,
}

/// The release of page-locked host memory (`cuMemFreeHost`, `cuMemHostUnregister`, after waiting
/// for the copies that use it), made with its context current.
pub(crate) type HostRelease = Box<dyn FnOnce() -> Result<()> + Send>;

/// How a [`Free`] is made.
#[derive(Clone, Copy)]
pub(crate) enum How {
    /// `cuMemFree` of a `cuMemAlloc` allocation, under the buffer's contract that no enqueued
    /// work still uses it.
    Plain,
    /// `cuMemFreeAsync` on the stream (as an address) the allocation was made on, in its order.
    OnStream(usize),
    /// `cuMemFreeAsync` of an allocation made while its stream (as an address) was being
    /// captured, at once: in that capture, it is the graph's free node.
    InCapture(usize),
    /// `cuCtxSynchronize`, then the release (and the payload dropped): memory that kernels,
    /// copies or graph replays of the context may still use.
    AfterDevice(Release),
    /// The release of page-locked host memory: from a capturing thread, the driver refuses it
    /// and invalidates the thread's captures, as it does `cuMemFree`.
    Host,
}

/// What a [`How::AfterDevice`] free releases once the context is synchronized.
#[derive(Clone, Copy)]
pub(crate) enum Release {
    /// `cuMemFree` (nothing for address 0, a payload alone): memory graphs used; memory imported
    /// from another process's pool (the free releases the import only).
    Free,
    /// `cuIpcCloseMemHandle`: memory another process shared through a legacy IPC handle.
    IpcClose,
    /// `cuMemUnmap` of this many bytes: a mapping of virtual memory, which the unmap does not
    /// order with any stream.
    Unmap(usize),
}

// SAFETY: a Free holds a device address and handle addresses, never dereferenced by Rust (the
// driver takes them from any thread), and a payload and a host release that are `Send`.
unsafe impl Send for Free {}

impl Free {
    /// The free of `ptr`, an allocation of `context`, made `how`.
    pub(crate) fn new(context: CUcontext, ptr: CUdeviceptr, how: How) -> Self {
        Self {
            context: context as usize,
            ptr,
            how,
            payload: None,
            host: None,
        }
    }

    /// The release of page-locked host memory of `context`.
    pub(crate) fn host(context: CUcontext, release: HostRelease) -> Self {
        Self {
            context: context as usize,
            ptr: 0,
            how: How::Host,
            payload: None,
            host: Some(release),
        }
    }

    /// The release of `payload`, host data that replays of graphs of `context` may still use,
    /// after the device's work.
    pub(crate) fn after_device(context: CUcontext, payload: Box<dyn Send>) -> Self {
        Self {
            context: context as usize,
            ptr: 0,
            how: How::AfterDevice(Release::Free),
            payload: Some(payload),
            host: None,
        }
    }

    /// The same free, dropping `payload` after the memory is released (what the release needs
    /// alive until then, such as the imported pool the memory came from).
    pub(crate) fn keeping(mut self, payload: Box<dyn Send>) -> Self {
        self.payload = Some(payload);
        self
    }

    /// The unmap of the `bytes` mapped at `ptr` in `context`'s device's address space, after the
    /// device's work; `payload` (what the mapping kept: its reservation, its physical memory) is
    /// dropped after the unmap.
    pub(crate) fn unmap(
        context: CUcontext,
        ptr: CUdeviceptr,
        bytes: usize,
        payload: Box<dyn Send>,
    ) -> Self {
        Self {
            context: context as usize,
            ptr,
            how: How::AfterDevice(Release::Unmap(bytes)),
            payload: Some(payload),
            host: None,
        }
    }

    /// What the free would break while a capture is in progress.
    fn conflict(&self) -> Conflict {
        match self.how {
            How::Plain | How::Host => Conflict::ThisThread,
            How::AfterDevice(_) => Conflict::Context(self.context),
            How::OnStream(stream) => Conflict::Stream(StreamKey(stream)),
            How::InCapture(_) => Conflict::Nothing,
        }
    }

    /// Makes the free now (once: the allocation is gone after it), and drops the payload.
    fn run(&mut self) -> Result<()> {
        ensure_bound(self.context as CUcontext)?;
        match self.how {
            // SAFETY: a `cuMemAlloc` allocation of this context (now current), freed once: its
            // buffer cleared its pointer before handing it over; no enqueued work uses it (the
            // buffer's contract).
            How::Plain => unsafe { calls::mem_free(self.ptr) }?,
            How::OnStream(stream) | How::InCapture(stream) => {
                // SAFETY: a `cuMemAllocAsync` allocation made on `stream`, which its buffer's
                // caller keeps alive until it is freed, with every other use ordered before this
                // point (`alloc_async`'s duties); freed once, as above.
                unsafe { calls::mem_free_async(self.ptr, stream as CUstream) }?
            }
            How::AfterDevice(release) => {
                calls::context_synchronize()?;
                // Every kernel, copy and replay of this context that used the memory has
                // finished: the context, current, was synchronized now.
                match release {
                    Release::Free if self.ptr == 0 => {}
                    // SAFETY: an allocation of this context, freed once, as above.
                    Release::Free => unsafe { calls::mem_free(self.ptr) }?,
                    // SAFETY: memory this context opened from an IPC handle, closed once (its
                    // keeper hands it over once, when it goes).
                    Release::IpcClose => unsafe { calls::ipc_close_mem_handle(self.ptr) }?,
                    // SAFETY: the range of one live mapping, unmapped once (its mapping handed it
                    // over when it went).
                    Release::Unmap(bytes) => unsafe { calls::mem_unmap(self.ptr, bytes) }?,
                }
                // What the memory needed until now (a mapping's reservation and physical memory,
                // an imported pool, host data of graph replays), released after it.
                drop(self.payload.take());
            }
            How::Host => {
                if let Some(release) = self.host.take() {
                    release()?
                }
            }
        }
        Ok(())
    }
}

/// Notes that the calling thread is about to begin capturing `stream` with `begin_capture`:
/// recorded before the driver begins. Waits while a free synchronizes the stream's context,
/// which would invalidate the capture.
pub(crate) fn began(stream: CUstream, context: CUcontext) {
    captures().began(stream.into(), context.addr(), None);
}

/// Notes that the calling thread is about to capture a conditional node's body on
/// `body_stream`, into the graph `parent` is capturing.
pub(crate) fn began_body(body_stream: CUstream, context: CUcontext, parent: CUstream) {
    captures().began(body_stream.into(), context.addr(), Some(parent.into()));
}

/// Notes that `branch` joins the capture of `origin` (a fork): its work goes to that graph.
pub(crate) fn began_fork(branch: CUstream, context: CUcontext, origin: CUstream) {
    captures().began(branch.into(), context.addr(), Some(origin.into()));
}

/// Whether streams were forked into the capture of `stream` (or bodies are being captured for
/// it): they are part of it until it ends.
pub(crate) fn has_branches(stream: CUstream) -> bool {
    captures().has_branches(stream.into())
}

/// Whether Atlas is capturing `stream`, or it joined a capture of Atlas's.
pub(crate) fn is_recorded(stream: CUstream) -> bool {
    captures().is_recorded(stream.into())
}

/// Remembers the driver's id of the capture of `stream`, for the streams that join it.
pub(crate) fn set_id(stream: CUstream, id: u64) {
    captures().set_id(stream.into(), id);
}

/// Notes that the capture of `stream` ended (or never began, or the stream is gone), and returns
/// what its graph keeps; nothing when Atlas did not begin one. Frees that waited for it are made,
/// after the record's lock.
pub(crate) fn ended(stream: CUstream) -> Keep {
    let (keep, ready) = captures().ended(stream.into());
    for mut waiting in ready {
        // `waiting` is dropped after the free: no capture of a context being synchronized
        // begins until then.
        report_cleanup(
            "freeing device memory after the capture it waited for",
            waiting.free.run(),
        );
    }
    keep
}

/// Makes `free` now, or, when it would break a capture Atlas began, when that capture has ended
/// (then `Ok`).
pub(crate) fn free(free: Free) -> Result<()> {
    let conflict = free.conflict();
    match captures().free(free, conflict) {
        // The `Ready` goes after the free: no capture of a context being synchronized begins
        // until then.
        Some(mut now) => now.free.run(),
        None => Ok(()),
    }
}

/// The capture state now: one atomic load.
#[inline(always)]
pub(crate) fn watch() -> Watch {
    captures().watch()
}

/// The number of the graph that work enqueued on `stream` is captured into by a capture Atlas
/// began, if any: the stream's own capture, a conditional body's, or one the stream joined (asked
/// of the driver, only for a stream not in the record; a driver that cannot tell, lacking
/// `cuStreamGetCaptureInfo_v2`, gave no capture an id either).
pub(crate) fn graph_of(stream: CUstream) -> Option<u64> {
    match captures().recorded_graph(stream.into()) {
        Lookup::NoCapture => None,
        Lookup::Graph(graph) => Some(graph),
        Lookup::NotRecorded if stream.addr() <= 2 => None, // a default stream joins no capture
        Lookup::NotRecorded => {
            // SAFETY: a live stream, not a default one (above): the caller's launch uses it.
            let id = unsafe { calls::capture_id(stream) }.ok().flatten()?;
            captures().graph_with_id(id)
        }
    }
}

/// Adds `holds` to what graph `graph` keeps (`attributed`: they come from a launch with cluster
/// dimensions or a cooperative one). Nothing when the capture is over: its graph has what it had.
pub(crate) fn hold(graph: u64, holds: Vec<Hold>, attributed: bool) {
    // Dropped after the lock: a hold dropped last frees what it holds, which takes the lock.
    drop(captures().hold(graph, holds, attributed));
}

/// Whether Atlas began the capture of `stream` with `begin_capture` (not a body's).
pub(crate) fn is_begun(stream: CUstream) -> bool {
    captures().is_begun(stream.into())
}

/// Refuses synchronizing `stream` while Atlas captures it.
#[inline]
pub(crate) fn refuse_synchronize(stream: CUstream) -> Result<()> {
    if captures().is_recorded(stream.into()) {
        return Err(AtlasError::Capture(
            CaptureMisuse::SynchronizeWhileCapturing,
        ));
    }
    Ok(())
}

/// Refuses a `cuMemAlloc` while the calling thread captures.
#[inline]
pub(crate) fn refuse_allocation() -> Result<()> {
    if captures().thread_is_capturing() {
        return Err(AtlasError::Capture(CaptureMisuse::AllocateWhileCapturing));
    }
    Ok(())
}

/// Whether the calling thread has a capture in progress that Atlas began: one atomic load when
/// none is in progress anywhere.
#[inline]
pub(crate) fn thread_is_capturing() -> bool {
    captures().thread_is_capturing()
}

/// Refuses a copy that waits for `stream` while Atlas captures `stream` or the calling thread
/// captures: checked before the copy is enqueued, so that no copy from host memory that is about
/// to be released ends up in a graph.
#[inline]
pub(crate) fn refuse_waiting_copy(stream: CUstream) -> Result<()> {
    let captures = captures();
    if captures.is_recorded(stream.into()) || captures.thread_is_capturing() {
        return Err(AtlasError::Capture(
            CaptureMisuse::WaitingCopyWhileCapturing,
        ));
    }
    Ok(())
}
