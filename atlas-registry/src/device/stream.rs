//! [`CudaStream`]: a stream Atlas created, or a caller's stream it only borrows.

use std::fmt;
use std::sync::Arc;

use atlas_sys::{CUcontext, CUstream, CUstream_flags};

use crate::device::capture;
use crate::device::context::{CudaContext, ensure_bound, ordinal_of};
use crate::driver::{About, calls};
use crate::error::{AtlasError, Result, report_cleanup};
use crate::report::{WithoutLogger, report};

/// Whether `stream` is one of the handles that name "the current context's" default stream: null
/// (the legacy default stream), `CU_STREAM_LEGACY` (1) or `CU_STREAM_PER_THREAD` (2). Work on one
/// of them goes to whatever context is current, so Atlas makes the right one current first.
#[inline(always)]
pub(crate) fn is_default(stream: CUstream) -> bool {
    stream.addr() <= 2
}

/// A CUDA stream in one context: owned (created by [`CudaStream::new`], destroyed on drop) or
/// borrowed (a caller's raw stream, or the legacy default stream, never destroyed by Atlas).
///
/// # Examples
///
/// ```no_run
/// # use atlas_registry::{AtlasRegistry, DeviceBuffer};
/// # fn f(registry: &AtlasRegistry, x: &mut DeviceBuffer<f32>) -> atlas_registry::Result<()> {
/// use atlas_registry::{CudaStream, LaunchConfig};
/// let stream = CudaStream::new(registry.ctx())?; // its own stream, destroyed when dropped
/// let scale = registry.function_cached("elementwise", "scale")?;
/// let n = x.len() as u32;
/// // SAFETY: `scale` touches the `n` floats of `x`, borrowed until the synchronize below.
/// unsafe { scale.launch(&stream, &LaunchConfig::for_elements(n, 256), (&mut *x, 2.0f32, n))? };
/// stream.synchronize()?; // this stream's work only: the registry's stream runs on meanwhile
/// # Ok(()) }
/// ```
pub struct CudaStream {
    raw: CUstream,
    context: CUcontext,
    owned: bool,
    /// What must outlive the stream besides its context: the green context it runs on, for a
    /// stream of one ([`GreenContext::stream`](crate::GreenContext::stream)). Dropped after the
    /// stream is destroyed.
    keeper: Option<Arc<dyn Send + Sync>>,
}

// SAFETY: a CUstream is a driver handle usable from any thread; the context it belongs to is a
// primary context that stays retained for the process, and what else it runs on is kept by
// `keeper`, which is Send and Sync.
unsafe impl Send for CudaStream {}
// SAFETY: as for Send; enqueueing work on one stream from several threads is allowed by the driver.
unsafe impl Sync for CudaStream {}

impl CudaStream {
    /// Creates a non-blocking stream (it does not synchronize with the legacy default stream).
    #[doc(alias = "cuStreamCreate")]
    pub fn new(context: &CudaContext) -> Result<Self> {
        context.bind()?;
        let raw = calls::stream_create(CUstream_flags::CU_STREAM_NON_BLOCKING.0)
            .about(|| format!("device {}", context.ordinal()))?;
        Ok(Self {
            raw,
            context: context.raw(),
            owned: true,
            keeper: None,
        })
    }

    /// Creates a non-blocking stream with `priority`: between the two ends of
    /// [`CudaContext::stream_priorities`], where numerically lower runs first. Work of a
    /// higher-priority stream is scheduled ahead of pending work of lower-priority streams (blocks
    /// already running are not preempted), which suits latency-bound work beside bulk work.
    ///
    /// A priority outside the device's range is refused with [`AtlasError::StreamPriority`],
    /// naming the range (the driver would silently clamp it).
    #[doc(alias = "cuStreamCreateWithPriority")]
    pub fn with_priority(context: &CudaContext, priority: i32) -> Result<Self> {
        let (least, greatest) = context.stream_priorities()?;
        if !(greatest..=least).contains(&priority) {
            return Err(AtlasError::StreamPriority {
                priority,
                device: context.ordinal(),
                least,
                greatest,
            });
        }
        context.bind()?;
        let flags = CUstream_flags::CU_STREAM_NON_BLOCKING.0;
        let raw = calls::stream_create_with_priority(flags, priority)
            .about(|| format!("device {}, priority {priority}", context.ordinal()))?;
        Ok(Self {
            raw,
            context: context.raw(),
            owned: true,
            keeper: None,
        })
    }

    /// The stream's priority, as the driver reports it (`cuStreamGetPriority`); the device's least
    /// priority for a stream created without one.
    #[doc(alias = "cuStreamGetPriority")]
    pub fn priority(&self) -> Result<i32> {
        self.bind_if_default()?;
        // SAFETY: the stream is valid (an invariant of this type); for the legacy default stream
        // its context was made current above.
        Ok(unsafe { calls::stream_priority(self.raw) }?)
    }

    /// Whether a capture is in progress on the stream, begun by Atlas or by anyone else, active
    /// or already invalidated (`cuStreamIsCapturing`).
    #[doc(alias = "cuStreamIsCapturing")]
    pub fn is_capturing(&self) -> Result<bool> {
        self.bind_if_default()?;
        // SAFETY: as for `priority`.
        Ok(unsafe { calls::stream_is_capturing(self.raw) }?)
    }

    /// Uses a stream the caller created, without taking ownership: Atlas never destroys it.
    ///
    /// The driver is asked which context the stream belongs to (`cuStreamGetCtx`), and a stream
    /// of another context than `context` is refused ([`AtlasError::WrongContext`]). A default
    /// stream handle (null for the legacy default stream, `CU_STREAM_LEGACY`,
    /// `CU_STREAM_PER_THREAD`) names `context`'s own: Atlas makes `context` current before using
    /// it.
    ///
    /// # Safety
    ///
    /// 1. `raw` is a live stream, or a default stream handle.
    /// 2. It stays valid for as long as the returned value (and anything enqueued through it) is used.
    /// 3. While a capture of it begins or ends through the returned value
    ///    ([`begin_capture`](Self::begin_capture), [`Capture::end`](crate::Capture::end)), nothing else enqueues work
    ///    into `raw` (another `CudaStream` wrapping it, or a raw call): the driver crashes when it
    ///    does. Atlas keeps this for its own references, not for other handles of the stream.
    ///
    /// # Examples
    ///
    /// A stream another library made (here with a raw driver call), used for Atlas's safe calls:
    ///
    /// ```no_run
    /// # fn f(registry: &atlas_registry::AtlasRegistry) -> Result<(), Box<dyn std::error::Error>> {
    /// use atlas_registry::{CudaStream, DeviceBuffer};
    /// let cuda = atlas_registry::sys::driver()?;
    /// let (create, destroy) = (
    ///     atlas_registry::sys::entry!(cuda, cuStreamCreate)?,
    ///     atlas_registry::sys::entry!(cuda, cuStreamDestroy_v2)?,
    /// );
    /// registry.ctx().bind()?; // cuStreamCreate acts in the current context
    /// let mut raw = std::ptr::null_mut();
    /// // SAFETY: `raw` is a live out-pointer; the registry's context is current.
    /// assert_eq!(unsafe { create(&mut raw, 0) }, atlas_registry::sys::CUresult::CUDA_SUCCESS);
    /// {
    ///     // SAFETY: `raw` was created in the registry's context and outlives `theirs`.
    ///     let theirs = unsafe { CudaStream::wrap(registry.ctx(), raw) }?;
    ///     let x = DeviceBuffer::from_slice(registry.ctx(), &theirs, &[1.0f32; 16])?;
    ///     assert_eq!(x.to_vec(&theirs)?, [1.0; 16]);
    /// }
    /// // SAFETY: nothing uses the stream any more.
    /// unsafe { destroy(raw) };
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuStreamGetCtx")]
    pub unsafe fn wrap(context: &CudaContext, raw: CUstream) -> Result<Self> {
        if !is_default(raw) {
            // SAFETY: a live stream (duty 1), not a default handle, so it names its own context.
            let belongs = unsafe { calls::stream_context(raw) }
                .about(|| format!("a stream wrapped for device {}", context.ordinal()))?;
            if belongs != context.raw() {
                return Err(AtlasError::WrongContext {
                    what: "the wrapped stream".into(),
                    expected: Some(context.ordinal()),
                    given: ordinal_of(belongs),
                });
            }
        }
        Ok(Self {
            raw,
            context: context.raw(),
            owned: false,
            keeper: None,
        })
    }

    /// The legacy default stream (stream 0) of `context`: ordered with all blocking streams.
    pub fn legacy_default(context: &CudaContext) -> Self {
        Self {
            raw: std::ptr::null_mut(),
            context: context.raw(),
            owned: false,
            keeper: None,
        }
    }

    /// Takes ownership of `raw`, a stream created in `context`'s device on what `keeper` keeps
    /// (a green context of that device's primary context), which the stream keeps until it is
    /// destroyed.
    pub(crate) fn owned_on(
        raw: CUstream,
        context: CUcontext,
        keeper: Arc<dyn Send + Sync>,
    ) -> Self {
        Self {
            raw,
            context,
            owned: true,
            keeper: Some(keeper),
        }
    }

    /// The raw handle (null for the legacy default stream).
    pub fn raw(&self) -> CUstream {
        self.raw
    }

    /// The raw handle of the context the stream belongs to.
    pub fn context(&self) -> CUcontext {
        self.context
    }

    /// For a default stream, which means "the current context's", makes the stream's context
    /// current; a created stream names its own context, and nothing is needed.
    #[inline]
    pub(crate) fn bind_if_default(&self) -> Result<()> {
        if is_default(self.raw) {
            ensure_bound(self.context)
        } else {
            Ok(())
        }
    }

    /// Whether Atlas created this stream and destroys it on drop.
    pub fn is_owned(&self) -> bool {
        self.owned
    }

    /// Blocks until all work enqueued on the stream has finished.
    ///
    /// While Atlas captures the stream ([`begin_capture`](Self::begin_capture), on any thread),
    /// synchronizing it would invalidate the capture; it is refused instead
    /// ([`CaptureMisuse::SynchronizeWhileCapturing`](crate::CaptureMisuse::SynchronizeWhileCapturing)),
    /// and the capture goes on. The check reads Atlas's own record of its captures: one atomic load
    /// when none is in progress, no driver call.
    #[doc(alias = "cuStreamSynchronize")]
    pub fn synchronize(&self) -> Result<()> {
        capture::refuse_synchronize(self.raw)?;
        self.synchronize_unchecked()
    }

    /// `cuStreamSynchronize` without the capture check: for the copies that checked before they
    /// enqueued. No capture of the stream begins in between: that takes `&mut` of the stream,
    /// which the copy borrows.
    pub(crate) fn synchronize_unchecked(&self) -> Result<()> {
        self.bind_if_default()?;
        // SAFETY: the stream is valid (an invariant of this type); a created stream names its
        // context, and for the legacy default stream its context was made current above.
        unsafe { calls::stream_synchronize(self.raw) }
            .map_err(|e| AtlasError::from(e).on_stream(self.raw))
    }
}

impl fmt::Debug for CudaStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaStream")
            .field("raw", &self.raw)
            .field("owned", &self.owned)
            .field("green", &self.keeper.is_some())
            .finish()
    }
}

impl Drop for CudaStream {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        let raw = self.raw;
        let bound = ensure_bound(self.context);
        if capture::has_branches(raw) {
            // A forgotten capture that streams were forked into: ending it now could race work
            // enqueued into them (their borrow ended with the forgotten capture), which the driver
            // does not survive. The stream and its capture are left to the process.
            report(
                log::Level::Warn,
                module_path!(),
                format_args!(
                    "a stream whose capture was forgotten with streams forked into it is kept"
                ),
                WithoutLogger::Stderr,
            );
            return;
        }
        if bound.is_ok() && capture::is_begun(raw) {
            // A capture Atlas began on it whose `Capture` was forgotten ends with it, in the
            // driver first: until then the thread counts as capturing, and the frees that waited
            // for the capture would be refused again. Its graph, which nothing can use, is
            // destroyed.
            // SAFETY: the stream is live and its context current (above).
            if let Ok(graph) = unsafe { calls::end_capture(raw) } {
                // SAFETY: the graph was just handed over by the driver, and is destroyed once.
                let destroyed = unsafe { calls::graph_destroy(graph) }.map_err(AtlasError::from);
                report_cleanup(
                    "destroying the graph of a dropped capturing stream",
                    destroyed,
                );
            }
        }
        drop(capture::ended(raw));
        // SAFETY: the stream was created by Atlas in this context and is destroyed only here.
        let result = bound.and_then(|()| Ok(unsafe { calls::stream_destroy(raw) }?));
        report_cleanup("destroying a stream", result);
    }
}

/// A stream as the launches and the registry's copies take it: a [`&CudaStream`](CudaStream), a
/// [`&Capture`](crate::Capture) (the stream it captures), or the raw `CUstream` the original registry
/// took (null: the legacy default stream). Sealed: Atlas implements it for those three alone.
///
/// A `&CudaStream` or `&Capture` names its context, and the call checks it against its own (the
/// function's, the graph's, the registry's); no capture of it begins or ends while the reference
/// lives, since that takes `&mut CudaStream`. A raw `CUstream` names none: it is taken to be of
/// the call's context, and to begin or end no capture during the call, which the caller vouches
/// for, so only `unsafe` calls take one. Safe calls
/// ([`synchronize`](CudaStream::synchronize), [`DeviceBuffer::to_vec`](crate::DeviceBuffer::to_vec),
/// ...) take a `&CudaStream`; [`CudaStream::wrap`] makes one of a raw stream, once.
pub trait StreamArg: sealed::Sealed + Copy {
    /// The raw handle, and the context the stream belongs to: a `&CudaStream`'s own; for a raw
    /// `CUstream`, `call`, the context of the call it is given to.
    fn stream_in(self, call: CUcontext) -> (CUstream, CUcontext);
}

/// The seal of [`StreamArg`]: public only to the crate, so that no other crate implements it.
pub(crate) mod sealed {
    /// Implemented by Atlas for the stream forms only (`&Capture` in `graph::capture`).
    pub trait Sealed {}
    impl Sealed for &super::CudaStream {}
    impl Sealed for atlas_sys::CUstream {}
}

impl StreamArg for &CudaStream {
    #[inline]
    fn stream_in(self, _call: CUcontext) -> (CUstream, CUcontext) {
        (self.raw, self.context)
    }
}

impl StreamArg for CUstream {
    #[inline]
    fn stream_in(self, call: CUcontext) -> (CUstream, CUcontext) {
        (self, call)
    }
}
