//! Atlas's record of the stream captures it began: the calls that would break them (refused
//! beforehand), what the graphs they build must keep alive, and the frees that wait for them.
//!
//! Some calls break a capture in progress: synchronizing a stream that is being captured
//! invalidates its capture, and `cuMemAlloc` (or a copy that waits for its stream) from a thread
//! that is capturing in `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL` is refused by the driver and
//! invalidates that capture too, so the whole sequence is lost at `end_capture`. Atlas refuses
//! them beforehand, with a typed error, and the capture goes on.
//!
//! A free cannot be refused (a buffer's drop returns nothing), so a free that would break a
//! capture waits for it instead ([`free`]): `cuMemFree` from a capturing thread waits for that
//! thread's captures to end, `cuMemFreeAsync` on a stream being captured (of memory allocated
//! before the capture) waits for that capture to end, and the free of memory that graphs shared
//! waits for every capture, because it synchronizes the context first.
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
//! holds one entry per capture in progress. Captures begun outside Atlas (raw
//! `cuStreamBeginCapture`) are not in the record: the driver keeps refusing what breaks them, and
//! what their graphs launch is theirs to keep alive.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, ThreadId};

use atlas_sys::{CUcontext, CUdeviceptr, CUstream};

use crate::device::context::ensure_bound;
use crate::driver::calls;
use crate::error::{AtlasError, CaptureMisuse, Result, report_cleanup};

/// Captures in progress (low 32 bits) and captures begun so far (high 32 bits, wrapping), for the
/// whole process: the fast path of every check, and of every launch, reads only this.
static STATE: AtomicU64 = AtomicU64::new(0);

const IN_PROGRESS: u64 = u32::MAX as u64;
const ONE_BEGUN: u64 = 1 << 32;

/// The captures in progress, what their graphs will keep, and the frees that wait for them.
static RECORD: Mutex<Record> = Mutex::new(Record {
    captures: Vec::new(),
    waiting: Vec::new(),
    graphs: 0,
});

struct Record {
    captures: Vec<Capture>,
    /// Frees that would break a capture in progress, made when it has ended.
    waiting: Vec<Waiting>,
    /// Graph numbers handed out so far.
    graphs: u64,
}

/// One capture Atlas began: with `begin_capture`, or of a conditional node's body.
struct Capture {
    stream: StreamKey,
    /// The thread that began it (Atlas captures in thread-local mode, so that thread also ends
    /// it, and the driver refuses that thread's unsafe calls meanwhile).
    thread: ThreadId,
    /// The driver's id of the capture (0 until read): a stream that joins the capture (waits for
    /// an event recorded on a capturing stream) reports the same id.
    id: u64,
    /// Atlas's number of the graph being built: a body's capture has its parent's.
    graph: u64,
    /// For a conditional node's body, the stream whose capture it belongs to.
    parent: Option<StreamKey>,
    /// What the graph will keep alive (gathered on the capture begun with `begin_capture`).
    keep: Keep,
}

/// A reference that keeps something alive for a graph: a registry (its modules stay loaded), an
/// allocation (its memory stays allocated). Only its life matters.
pub(crate) type Hold = Arc<dyn Send + Sync>;

/// What a graph keeps alive: each thing once, however many of its launches use it.
#[derive(Default)]
pub(crate) struct Keep {
    /// By the address of what is held.
    held: HashMap<usize, Hold, BuildHasherDefault<AddressHasher>>,
    /// Whether a launch with cluster dimensions or a cooperative launch was captured into the
    /// graph: its kernel nodes then carry attributes that argument updates check again.
    attributed: bool,
}

impl Keep {
    /// Adds `hold`; one already kept is given back, to be dropped by the caller.
    fn add(&mut self, hold: Hold) -> Option<Hold> {
        let key = Arc::as_ptr(&hold).cast::<()>().addr();
        match self.held.entry(key) {
            std::collections::hash_map::Entry::Occupied(_) => Some(hold),
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(hold);
                None
            }
        }
    }

    /// Everything `holds` keeps, added; what was already kept is given back.
    pub(crate) fn extend(&mut self, holds: Vec<Hold>, attributed: bool) -> Vec<Hold> {
        self.attributed |= attributed;
        holds.into_iter().filter_map(|h| self.add(h)).collect()
    }

    /// Whether an attributed launch (clusters, cooperative) was captured into the graph.
    pub(crate) fn attributed(&self) -> bool {
        self.attributed
    }

    /// How many things are kept.
    pub(crate) fn len(&self) -> usize {
        self.held.len()
    }
}

/// Hashes an address (the only key of a [`Keep`]) with one multiplication: addresses are distinct
/// and need no protection against chosen collisions, and every captured launch hashes a few.
#[derive(Default)]
pub(crate) struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_usize(&mut self, address: usize) {
        self.0 = (address as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A free that waits for a capture to end.
struct Waiting {
    until: Until,
    free: Free,
}

/// What a waiting free waits for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Until {
    /// The thread's last capture to end (`cuMemFree` from it would break its captures).
    Thread(ThreadId),
    /// The capture of the stream to end (`cuMemFreeAsync` there would become a graph node).
    Stream(StreamKey),
    /// Every capture to end (the context is synchronized first, which would break any).
    Idle,
}

/// A free of device memory, and how it is made.
pub(crate) struct Free {
    /// The allocation's context, as an address (a handle, never dereferenced here).
    context: usize,
    ptr: CUdeviceptr,
    how: How,
}

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
    /// `cuCtxSynchronize`, then `cuMemFree`: memory graphs used, whose replays may still run.
    AfterDevice,
}

// SAFETY: a Free holds a device address and handle addresses, never dereferenced by Rust; the
// driver takes them from any thread.
unsafe impl Send for Free {}

impl Free {
    /// The free of `ptr`, an allocation of `context`, made `how`.
    pub(crate) fn new(context: CUcontext, ptr: CUdeviceptr, how: How) -> Self {
        Self {
            context: context as usize,
            ptr,
            how,
        }
    }

    /// Makes the free now.
    fn run(self) -> Result<()> {
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
            How::AfterDevice => {
                calls::context_synchronize()?;
                // SAFETY: an allocation of this context freed once, as above; every kernel and
                // replay that used it has finished (the context was synchronized just now).
                unsafe { calls::mem_free(self.ptr) }?
            }
        }
        Ok(())
    }
}

fn record() -> MutexGuard<'static, Record> {
    RECORD.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A stream handle as a key: compared, never dereferenced.
#[derive(Clone, Copy, PartialEq, Eq)]
struct StreamKey(usize);

impl From<CUstream> for StreamKey {
    fn from(stream: CUstream) -> Self {
        Self(stream as usize)
    }
}

impl Record {
    fn publish(&self, begun: bool) {
        let begun = if begun { ONE_BEGUN } else { 0 };
        let state = STATE.load(Ordering::Relaxed);
        let next = ((state & !IN_PROGRESS).wrapping_add(begun)) | self.captures.len() as u64;
        STATE.store(next, Ordering::Release);
    }

    fn capture(&self, stream: StreamKey) -> Option<&Capture> {
        self.captures.iter().find(|c| c.stream == stream)
    }

    fn thread_captures(&self, thread: ThreadId) -> bool {
        self.captures.iter().any(|c| c.thread == thread)
    }

    /// What `free` would break now, and so waits for; `None` when it can be made now.
    fn blocks(&self, free: &Free) -> Option<Until> {
        let me = thread::current().id();
        match free.how {
            How::InCapture(_) => None,
            How::AfterDevice => (!self.captures.is_empty()).then_some(Until::Idle),
            How::Plain => self.thread_captures(me).then_some(Until::Thread(me)),
            How::OnStream(stream) => {
                let stream = StreamKey(stream);
                self.capture(stream).map(|_| Until::Stream(stream))
            }
        }
    }

    /// Whether what `until` waits for is still in progress.
    fn still(&self, until: Until) -> bool {
        match until {
            Until::Thread(thread) => self.thread_captures(thread),
            Until::Stream(stream) => self.capture(stream).is_some(),
            Until::Idle => !self.captures.is_empty(),
        }
    }
}

/// Notes that the calling thread is about to begin capturing `stream` with `begin_capture`:
/// recorded before the driver begins, so that a launch the capture takes in sees it.
pub(crate) fn began(stream: CUstream) {
    let mut record = record();
    record.graphs += 1;
    let graph = record.graphs;
    record.captures.push(Capture {
        stream: stream.into(),
        thread: thread::current().id(),
        id: 0,
        graph,
        parent: None,
        keep: Keep::default(),
    });
    record.publish(true);
}

/// Notes that the calling thread is about to capture a conditional node's body on
/// `body_stream`, into the graph `parent` is capturing.
pub(crate) fn began_body(body_stream: CUstream, parent: CUstream) {
    let mut record = record();
    let parent = StreamKey::from(parent);
    let graph = record.capture(parent).map_or(0, |c| c.graph);
    record.captures.push(Capture {
        stream: body_stream.into(),
        thread: thread::current().id(),
        id: 0,
        graph,
        parent: Some(parent),
        keep: Keep::default(),
    });
    record.publish(true);
}

/// Remembers the driver's id of the capture of `stream`, for the streams that join it.
pub(crate) fn set_id(stream: CUstream, id: u64) {
    let key = StreamKey::from(stream);
    if let Some(capture) = record().captures.iter_mut().rev().find(|c| c.stream == key) {
        capture.id = id;
    }
}

/// Notes that the capture of `stream` ended (or never began, or the stream is gone), and returns
/// what its graph keeps; nothing when Atlas did not begin one. Frees that waited for it are made.
pub(crate) fn ended(stream: CUstream) -> Keep {
    if STATE.load(Ordering::Acquire) & IN_PROGRESS == 0 {
        return Keep::default();
    }
    let key = StreamKey::from(stream);
    let (keep, ready) = {
        let mut record = record();
        // The latest entry: a second `began` on a stream already captured is the one undone.
        let Some(at) = record.captures.iter().rposition(|c| c.stream == key) else {
            return Keep::default();
        };
        let capture = record.captures.remove(at);
        record.publish(false);
        let mut ready = Vec::new();
        let mut at = 0;
        while at < record.waiting.len() {
            if record.still(record.waiting[at].until) {
                at += 1;
            } else {
                ready.push(record.waiting.swap_remove(at).free);
            }
        }
        (capture.keep, ready)
    };
    for waiting in ready {
        report_cleanup(
            "freeing device memory after the capture it waited for",
            free(waiting),
        );
    }
    keep
}

/// Makes `free` now, or, when it would break a capture Atlas began, when that capture has ended
/// (then `Ok`). A free after the device's work is made under the record's lock, so that no
/// capture of Atlas's begins while the context is synchronized.
pub(crate) fn free(free: Free) -> Result<()> {
    let waits = matches!(free.how, How::AfterDevice);
    if !waits && STATE.load(Ordering::Acquire) & IN_PROGRESS == 0 {
        return free.run();
    }
    let mut record = record();
    if let Some(until) = record.blocks(&free) {
        record.waiting.push(Waiting { until, free });
        return Ok(());
    }
    if waits {
        return free.run();
    }
    drop(record);
    free.run()
}

/// What a launch reads before it is enqueued: whether a capture is in progress anywhere, and how
/// many have begun.
#[derive(Clone, Copy)]
pub(crate) struct Watch(u64);

/// The capture state now: one atomic load.
#[inline(always)]
pub(crate) fn watch() -> Watch {
    Watch(STATE.load(Ordering::Acquire))
}

impl Watch {
    /// Whether Atlas had a capture in progress somewhere.
    #[inline(always)]
    pub(crate) fn capturing(self) -> bool {
        self.0 & IN_PROGRESS != 0
    }

    /// Whether a capture began or ended since.
    #[inline(always)]
    pub(crate) fn changed(self) -> bool {
        STATE.load(Ordering::Acquire) != self.0
    }
}

/// The number of the graph that work enqueued on `stream` is captured into by a capture Atlas
/// began, if any: the stream's own capture, a conditional body's, or one the stream joined (asked
/// of the driver, only for a stream not in the record; a driver that cannot tell, lacking
/// `cuStreamGetCaptureInfo_v2`, gave no capture an id either).
pub(crate) fn graph_of(stream: CUstream) -> Option<u64> {
    let key = StreamKey::from(stream);
    {
        let record = record();
        if record.captures.is_empty() {
            return None;
        }
        if let Some(capture) = record.capture(key) {
            return Some(capture.graph);
        }
    }
    if stream.addr() <= 2 {
        return None; // a default stream: never captured by Atlas, joins no capture
    }
    // SAFETY: a live stream, not a default one (above): the caller's launch uses it.
    let id = unsafe { calls::capture_id(stream) }.ok().flatten()?;
    let record = record();
    record
        .captures
        .iter()
        .find(|c| c.id == id && id != 0)
        .map(|c| c.graph)
}

/// Adds `holds` to what graph `graph` keeps (`attributed`: they come from a launch with cluster
/// dimensions or a cooperative one). Nothing when the capture is over: its graph has what it had.
pub(crate) fn hold(graph: u64, holds: Vec<Hold>, attributed: bool) {
    let leftover = {
        let mut record = record();
        match record
            .captures
            .iter_mut()
            .find(|c| c.graph == graph && c.parent.is_none())
        {
            Some(capture) => capture.keep.extend(holds, attributed),
            None => holds,
        }
    };
    // Dropped after the lock: a hold dropped last frees what it holds, which takes the lock.
    drop(leftover);
}

/// Whether `stream` captures a conditional node's body, or is the stream whose capture a body
/// being captured belongs to: either way its capture cannot end now.
pub(crate) fn has_open_body(stream: CUstream) -> bool {
    if STATE.load(Ordering::Acquire) & IN_PROGRESS == 0 {
        return false;
    }
    let key = StreamKey::from(stream);
    record()
        .captures
        .iter()
        .any(|c| c.parent.is_some() && (c.stream == key || c.parent == Some(key)))
}

/// Whether Atlas began the capture of `stream` with `begin_capture` (not a body's).
pub(crate) fn is_begun(stream: CUstream) -> bool {
    if STATE.load(Ordering::Acquire) & IN_PROGRESS == 0 {
        return false;
    }
    record()
        .capture(stream.into())
        .is_some_and(|c| c.parent.is_none())
}

/// Whether Atlas is capturing `stream` (begun by any thread).
#[inline]
pub(crate) fn is_recorded(stream: CUstream) -> bool {
    if STATE.load(Ordering::Acquire) & IN_PROGRESS == 0 {
        return false;
    }
    record().capture(stream.into()).is_some()
}

/// Whether the calling thread has a capture in progress that Atlas began.
#[inline]
pub(crate) fn thread_is_capturing() -> bool {
    if STATE.load(Ordering::Acquire) & IN_PROGRESS == 0 {
        return false;
    }
    record().thread_captures(thread::current().id())
}

/// Refuses synchronizing `stream` while Atlas captures it.
#[inline]
pub(crate) fn refuse_synchronize(stream: CUstream) -> Result<()> {
    if is_recorded(stream) {
        return Err(AtlasError::Capture(
            CaptureMisuse::SynchronizeWhileCapturing,
        ));
    }
    Ok(())
}

/// Refuses a `cuMemAlloc` while the calling thread captures.
#[inline]
pub(crate) fn refuse_allocation() -> Result<()> {
    if thread_is_capturing() {
        return Err(AtlasError::Capture(CaptureMisuse::AllocateWhileCapturing));
    }
    Ok(())
}

/// Refuses a copy that waits for `stream` while Atlas captures `stream` or the calling thread
/// captures: checked before the copy is enqueued, so that no copy from host memory that is about
/// to be released ends up in a graph.
#[inline]
pub(crate) fn refuse_waiting_copy(stream: CUstream) -> Result<()> {
    if is_recorded(stream) || thread_is_capturing() {
        return Err(AtlasError::Capture(
            CaptureMisuse::WaitingCopyWhileCapturing,
        ));
    }
    Ok(())
}
