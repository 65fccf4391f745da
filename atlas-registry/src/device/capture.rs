//! Atlas's record of the stream captures it began, and the refusals of calls that cannot be
//! captured.
//!
//! Some calls break a capture in progress: synchronizing a stream that is being captured
//! invalidates its capture, and `cuMemAlloc` (or a copy that waits for its stream) from a thread
//! that is capturing in `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL` is refused by the driver and
//! invalidates that capture too, so the whole sequence is lost at `end_capture`. Atlas refuses
//! them beforehand, with a typed error, and the capture goes on.
//!
//! `cuMemFree` from a capturing thread breaks its capture the same way, and a buffer's drop cannot
//! return an error: so a [`DeviceBuffer`](crate::DeviceBuffer) of `cuMemAlloc` dropped (or freed)
//! by a thread while it captures hands its memory to the record, which frees it when that
//! thread's last capture ends (`end_capture`, or the capturing stream dropped).
//!
//! The record, not the driver, answers: asking the driver (`cuStreamIsCapturing`) would add a
//! driver call to every synchronize. With no capture in progress, a check is one atomic load; while
//! Atlas captures somewhere in the process, it is a short lock of a list that holds one entry per
//! capture in progress. Captures begun outside Atlas (raw `cuStreamBeginCapture`) are not in the
//! record; the driver keeps refusing what breaks them, as before.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread::{self, ThreadId};

use atlas_sys::{CUcontext, CUdeviceptr, CUstream};

use crate::device::context::ensure_bound;
use crate::driver::calls;
use crate::error::{AtlasError, CaptureMisuse, Result, report_cleanup};

/// How many captures Atlas began and has not seen end, in the whole process: the fast path of
/// every check reads only this.
static IN_PROGRESS: AtomicUsize = AtomicUsize::new(0);

/// The captures in progress and the frees they hold back.
static RECORD: Mutex<Record> = Mutex::new(Record {
    captures: Vec::new(),
    held_frees: Vec::new(),
});

struct Record {
    /// The stream and the thread that began its capture (Atlas captures in thread-local mode, so
    /// that thread also ends it).
    captures: Vec<(StreamKey, ThreadId)>,
    /// Memory dropped by a thread while it captured, freed when its last capture ends.
    held_frees: Vec<HeldFree>,
}

/// A `cuMemAlloc` allocation waiting for `thread`'s captures to end.
struct HeldFree {
    thread: ThreadId,
    /// The allocation's context, as an address (a handle, never dereferenced here).
    context: usize,
    ptr: CUdeviceptr,
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

/// Notes that the calling thread began capturing `stream`.
pub(crate) fn began(stream: CUstream) {
    let mut record = record();
    record
        .captures
        .push((stream.into(), thread::current().id()));
    IN_PROGRESS.store(record.captures.len(), Ordering::Release);
}

/// Notes that the capture of `stream` ended (or that the stream is gone); nothing when Atlas did
/// not begin one. When that was the last capture of its thread, frees what the thread dropped
/// while capturing.
pub(crate) fn ended(stream: CUstream) {
    if IN_PROGRESS.load(Ordering::Acquire) == 0 {
        return;
    }
    let key = StreamKey::from(stream);
    let mut released = Vec::new();
    {
        let mut record = record();
        let Some(at) = record.captures.iter().position(|(s, _)| *s == key) else {
            return;
        };
        let (_, thread) = record.captures.swap_remove(at);
        IN_PROGRESS.store(record.captures.len(), Ordering::Release);
        if !record.captures.iter().any(|(_, t)| *t == thread) {
            record.held_frees.retain(|held| {
                let mine = held.thread == thread;
                if mine {
                    released.push((held.context, held.ptr));
                }
                !mine
            });
        }
    }
    for (context, ptr) in released {
        let context = context as CUcontext;
        // SAFETY: `ptr` was allocated by `cuMemAlloc` in `context` and handed over by its buffer,
        // which cleared its own pointer: it is freed once, here, under the buffer's contract that
        // no enqueued work still uses it; `context` is made current first.
        let freed = ensure_bound(context).and_then(|()| Ok(unsafe { calls::mem_free(ptr) }?));
        report_cleanup("freeing a device buffer dropped during a capture", freed);
    }
}

/// Takes over the free of `ptr`, a `cuMemAlloc` allocation of `context`, when the calling thread
/// has a capture in progress that Atlas began (`cuMemFree` would break it): `true` when it did,
/// and the memory is freed when the thread's last capture ends; `false` when the caller frees it
/// now.
pub(crate) fn hold_free(context: CUcontext, ptr: CUdeviceptr) -> bool {
    if IN_PROGRESS.load(Ordering::Acquire) == 0 {
        return false;
    }
    let thread = thread::current().id();
    let mut record = record();
    if !record.captures.iter().any(|(_, t)| *t == thread) {
        return false;
    }
    record.held_frees.push(HeldFree {
        thread,
        context: context as usize,
        ptr,
    });
    true
}

/// Whether Atlas is capturing `stream` (begun by any thread).
#[inline]
pub(crate) fn is_recorded(stream: CUstream) -> bool {
    if IN_PROGRESS.load(Ordering::Acquire) == 0 {
        return false;
    }
    let key = StreamKey::from(stream);
    record().captures.iter().any(|(s, _)| *s == key)
}

/// Whether the calling thread has a capture in progress that Atlas began.
#[inline]
pub(crate) fn thread_is_capturing() -> bool {
    if IN_PROGRESS.load(Ordering::Acquire) == 0 {
        return false;
    }
    let me = thread::current().id();
    record().captures.iter().any(|(_, t)| *t == me)
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
