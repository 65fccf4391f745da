//! [`CudaEvent`]: a point in a stream's work that other streams wait for, the host waits for, or
//! time is measured between; and [`CudaStream::wait`], the order of one stream after another.
//!
//! An event recorded on a stream that is being captured marks a point of the capture, not of
//! running work: a stream that waits for it joins the capture (the driver makes it part of the
//! graph), and the driver crashes when a joined stream is enqueued into while the capture ends. So
//! a stream joins a capture only through [`Capture::fork`](crate::Capture::fork), which borrows it
//! until the capture ends; [`CudaStream::wait`] refuses an event recorded in a capture from any
//! other stream. An event records which capture (if any) its last record was in, and `record`
//! takes `&mut self`, so that what a wait reads cannot change under it.

use std::fmt;
use std::time::Duration;

use atlas_sys::{CUcontext, CUevent, CUevent_flags};

use crate::device::capture;
use crate::device::context::{CudaContext, ensure_bound, ordinal_of};
use crate::device::stream::CudaStream;
use crate::driver::{About, calls};
use crate::error::{AtlasError, CaptureMisuse, EventMisuse, Result, report_cleanup};

/// A CUDA event of one context: recorded on a stream of that context, waited for by streams of any
/// device, queried, synchronized with, and timed.
///
/// Made without timing by [`new`](Self::new) (what ordering streams needs, and the cheapest), with
/// timing by [`timing`](Self::timing). Destroyed on drop (the driver releases it once the work
/// that uses it is done).
///
/// # Examples
///
/// A copy stream and a compute stream: the kernel waits for the upload, and the host waits for
/// the kernel, timed.
///
/// ```no_run
/// # fn f(registry: &atlas_registry::AtlasRegistry) -> atlas_registry::Result<()> {
/// use atlas_registry::{CudaEvent, CudaStream, DeviceBuffer, LaunchConfig};
/// let ctx = registry.ctx();
/// let (copies, compute) = (CudaStream::new(ctx)?, CudaStream::new(ctx)?);
/// let mut x = DeviceBuffer::from_slice(ctx, &copies, &vec![1.0f32; 1 << 20])?;
/// let (mut uploaded, mut start, mut end) =
///     (CudaEvent::new(ctx)?, CudaEvent::timing(ctx)?, CudaEvent::timing(ctx)?);
/// uploaded.record(&copies)?;
/// compute.wait(&uploaded)?; // the kernel runs after everything enqueued on `copies` so far
/// let scale = registry.function_cached("elementwise", "scale")?;
/// let n = x.len() as u32;
/// start.record(&compute)?;
/// // SAFETY: `scale` touches the `n` floats of `x`, which outlives it (synchronized below).
/// unsafe { scale.launch(&compute, &LaunchConfig::for_elements(n, 256), (&mut x, 2.0f32, n))? };
/// end.record(&compute)?;
/// end.synchronize()?;
/// println!("scale took {:?}", end.elapsed_since(&start)?);
/// # Ok(()) }
/// ```
///
/// Recording takes `&mut self`, so that a wait never reads an event that another thread is
/// recording (what the wait orders after would be a race):
///
/// ```compile_fail
/// # fn f(ctx: &atlas_registry::CudaContext, a: &atlas_registry::CudaStream, b: &atlas_registry::CudaStream) -> atlas_registry::Result<()> {
/// let mut event = atlas_registry::CudaEvent::new(ctx)?;
/// std::thread::scope(|s| {
///     s.spawn(|| b.wait(&event));
///     event.record(a) // refused by the compiler: another thread reads the event
/// })
/// # }
/// ```
pub struct CudaEvent {
    raw: CUevent,
    context: CUcontext,
    timing: bool,
    /// Atlas's number of the graph whose capture took the event's last record, or 0.
    captured_in: u64,
    /// Whether the event was ever recorded.
    recorded: bool,
}

// SAFETY: a CUevent is a driver handle usable from any thread; its context is a primary context
// retained for the process.
unsafe impl Send for CudaEvent {}
// SAFETY: shared references only query, synchronize, time, or enqueue waits for the event, which
// the driver allows from any thread at once; recording takes `&mut self`.
unsafe impl Sync for CudaEvent {}

impl CudaEvent {
    /// An event without timing (`CU_EVENT_DISABLE_TIMING`): for ordering streams and for the host
    /// to wait, at the least cost.
    #[doc(alias = "cuEventCreate")]
    pub fn new(context: &CudaContext) -> Result<Self> {
        Self::with_flags(context, false, false)
    }

    /// An event with timing, for [`elapsed_since`](Self::elapsed_since).
    #[doc(alias = "cuEventCreate")]
    pub fn timing(context: &CudaContext) -> Result<Self> {
        Self::with_flags(context, true, false)
    }

    /// An event with timing or not, and whose [`synchronize`](Self::synchronize) blocks the thread
    /// (`CU_EVENT_BLOCKING_SYNC`) instead of spinning, or not.
    #[doc(alias = "cuEventCreate")]
    pub fn with_flags(context: &CudaContext, timing: bool, blocking_sync: bool) -> Result<Self> {
        let mut flags = 0;
        if !timing {
            flags |= CUevent_flags::CU_EVENT_DISABLE_TIMING.0;
        }
        if blocking_sync {
            flags |= CUevent_flags::CU_EVENT_BLOCKING_SYNC.0;
        }
        context.bind()?;
        // SAFETY: the event's context was made current above.
        let raw = unsafe { calls::event_create(flags) }
            .about(|| format!("an event on device {}", context.ordinal()))?;
        Ok(Self {
            raw,
            context: context.raw(),
            timing,
            captured_in: 0,
            recorded: false,
        })
    }

    /// The raw handle.
    pub fn raw(&self) -> CUevent {
        self.raw
    }

    /// The raw handle of the event's context.
    pub fn context(&self) -> CUcontext {
        self.context
    }

    /// Whether the event takes timing.
    pub fn is_timing(&self) -> bool {
        self.timing
    }

    /// Records the event at the current end of `stream`'s work: one driver call. A stream of
    /// another context is refused ([`AtlasError::WrongContext`]).
    ///
    /// On a stream being captured (a [`Capture`](crate::Capture)), the record marks a point of the
    /// capture: other streams of the same capture may wait for it ([`CudaStream::wait`] on a
    /// forked stream, or the capture itself); the host cannot, until the event is recorded again
    /// outside a capture.
    #[doc(alias = "cuEventRecord")]
    pub fn record(&mut self, stream: &CudaStream) -> Result<()> {
        if stream.context() != self.context {
            return Err(self.wrong_context("the stream", stream.context()));
        }
        stream.bind_if_default()?;
        let captured_in = if capture::watch().capturing() {
            capture::graph_of(stream.raw()).unwrap_or(0)
        } else {
            0
        };
        // SAFETY: the event is live; the stream is a live stream of its context (checked above),
        // or a default stream whose context (the event's) was made current.
        unsafe { calls::event_record(self.raw, stream.raw()) }?;
        self.captured_in = captured_in;
        self.recorded = true;
        Ok(())
    }

    /// Whether the work before the event's last record has finished (`true` for an event never
    /// recorded).
    #[doc(alias = "cuEventQuery")]
    pub fn query(&self) -> Result<bool> {
        self.refuse_captured()?;
        // SAFETY: the event is live.
        Ok(unsafe { calls::event_query(self.raw) }?)
    }

    /// Blocks until the work before the event's last record has finished.
    #[doc(alias = "cuEventSynchronize")]
    pub fn synchronize(&self) -> Result<()> {
        self.refuse_captured()?;
        // SAFETY: the event is live.
        Ok(unsafe { calls::event_synchronize(self.raw) }?)
    }

    /// The time from `start`'s last record to this event's, both timing events of one device whose
    /// work has finished (synchronize this one first). Refused, naming what is wrong, for an event
    /// without timing or never recorded, or of another device ([`AtlasError::Event`],
    /// [`AtlasError::WrongContext`]); the driver answers `CUDA_ERROR_NOT_READY` for work not
    /// finished.
    #[doc(alias = "cuEventElapsedTime")]
    pub fn elapsed_since(&self, start: &CudaEvent) -> Result<Duration> {
        for event in [start, self] {
            if !event.timing {
                return Err(AtlasError::Event(EventMisuse::NotTiming));
            }
            if !event.recorded {
                return Err(AtlasError::Event(EventMisuse::NeverRecorded));
            }
            event.refuse_captured()?;
        }
        if start.context != self.context {
            return Err(self.wrong_context("the start event", start.context));
        }
        // SAFETY: both events are live.
        let ms = unsafe { calls::event_elapsed_ms(start.raw, self.raw) }?;
        Ok(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3))
    }

    /// Refuses what the host cannot ask of an event whose last record was in a capture: the
    /// driver refuses it and invalidates a capture in progress.
    fn refuse_captured(&self) -> Result<()> {
        if self.captured_in != 0 {
            return Err(AtlasError::Capture(CaptureMisuse::EventOfCapture));
        }
        Ok(())
    }

    #[cold]
    fn wrong_context(&self, what: &str, given: CUcontext) -> AtlasError {
        AtlasError::WrongContext {
            what: what.into(),
            expected: ordinal_of(self.context),
            given: ordinal_of(given),
        }
    }

    /// The capture (Atlas's graph number) the event's last record was in, or 0.
    pub(crate) fn captured_in(&self) -> u64 {
        self.captured_in
    }
}

impl fmt::Debug for CudaEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaEvent")
            .field("raw", &self.raw)
            .field("timing", &self.timing)
            .field("recorded", &self.recorded)
            .finish()
    }
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        // SAFETY: created by Atlas and destroyed only here; the driver releases it once work that
        // waits for it is done.
        let result = ensure_bound(self.context).and_then(|()| {
            // SAFETY: as above.
            Ok(unsafe { calls::event_destroy(self.raw) }?)
        });
        report_cleanup("destroying an event", result);
    }
}

impl CudaStream {
    /// Makes the work enqueued on this stream from now on wait for the work before `event`'s last
    /// record (on any stream, of any device): one driver call, and the host does not wait.
    ///
    /// An event recorded in a capture is refused
    /// ([`CaptureMisuse::JoinOutsideFork`]) unless this
    /// stream is part of that same capture (the capture itself, or a stream forked into it): a
    /// stream that waits for a captured point joins the capture, and streams join a capture only
    /// through [`Capture::fork`](crate::Capture::fork), which keeps them from other threads until
    /// the capture ends.
    #[doc(alias = "cuStreamWaitEvent")]
    pub fn wait(&self, event: &CudaEvent) -> Result<()> {
        let captured_in = event.captured_in();
        if captured_in != 0 && capture::graph_of(self.raw()) != Some(captured_in) {
            return Err(AtlasError::Capture(CaptureMisuse::JoinOutsideFork));
        }
        self.bind_if_default()?;
        // SAFETY: the stream is live (a default stream's context was made current above); the
        // event is live (borrowed).
        Ok(unsafe { calls::stream_wait_event(self.raw(), event.raw()) }?)
    }
}
