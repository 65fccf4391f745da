//! Atlas's record of the stream captures it began, and the refusals of calls that cannot be
//! captured.
//!
//! Some calls break a capture in progress: synchronizing a stream that is being captured
//! invalidates its capture, and `cuMemAlloc` (or a copy that waits for its stream) from a thread
//! that is capturing in `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL` is refused by the driver and
//! invalidates that capture too, so the whole sequence is lost at `end_capture`. Atlas refuses
//! them beforehand, with a typed error, and the capture goes on.
//!
//! The record, not the driver, answers: asking the driver (`cuStreamIsCapturing`) would add a
//! driver call to every synchronize. With no capture in progress, a check is one atomic load; while
//! Atlas captures somewhere in the process, it is a short lock of a list that holds one entry per
//! capture in progress. Captures begun outside Atlas (raw `cuStreamBeginCapture`) are not in the
//! record; the driver keeps refusing what breaks them, as before.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::thread::{self, ThreadId};

use atlas_sys::CUstream;

use crate::error::{AtlasError, CaptureMisuse, Result};

/// How many captures Atlas began and has not seen end, in the whole process: the fast path of
/// every check reads only this.
static IN_PROGRESS: AtomicUsize = AtomicUsize::new(0);

/// The captures in progress: the stream and the thread that began it (Atlas captures in
/// thread-local mode, so that thread also ends it).
static CAPTURES: Mutex<Vec<(StreamKey, ThreadId)>> = Mutex::new(Vec::new());

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
    let mut captures = CAPTURES.lock().unwrap_or_else(PoisonError::into_inner);
    captures.push((stream.into(), thread::current().id()));
    IN_PROGRESS.store(captures.len(), Ordering::Release);
}

/// Notes that the capture of `stream` ended (or that the stream is gone); nothing when Atlas did
/// not begin one.
pub(crate) fn ended(stream: CUstream) {
    if IN_PROGRESS.load(Ordering::Acquire) == 0 {
        return;
    }
    let key = StreamKey::from(stream);
    let mut captures = CAPTURES.lock().unwrap_or_else(PoisonError::into_inner);
    captures.retain(|(s, _)| *s != key);
    IN_PROGRESS.store(captures.len(), Ordering::Release);
}

/// Whether Atlas is capturing `stream` (begun by any thread).
#[inline]
pub(crate) fn is_recorded(stream: CUstream) -> bool {
    if IN_PROGRESS.load(Ordering::Acquire) == 0 {
        return false;
    }
    let key = StreamKey::from(stream);
    let captures = CAPTURES.lock().unwrap_or_else(PoisonError::into_inner);
    captures.iter().any(|(s, _)| *s == key)
}

/// Whether the calling thread has a capture in progress that Atlas began.
#[inline]
pub(crate) fn thread_is_capturing() -> bool {
    if IN_PROGRESS.load(Ordering::Acquire) == 0 {
        return false;
    }
    let me = thread::current().id();
    let captures = CAPTURES.lock().unwrap_or_else(PoisonError::into_inner);
    captures.iter().any(|(_, t)| *t == me)
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
