//! Stream capture: [`CudaStream::begin_capture`] and the [`Capture`] it returns, which borrows
//! the stream mutably until the capture ends, and the captured [`CudaGraph`], which owns what its
//! launches need.
//!
//! The driver does not support work enqueued into a stream while another thread begins or ends
//! its capture (it crashes, in every capture mode). So a capture begins through `&mut CudaStream`
//! and ends by consuming the [`Capture`]: while either happens, nobody else can hold a reference
//! to the stream to launch with. In between, the capture is `Sync`, and other threads may launch
//! into it through `&Capture`. Adding a conditional node changes the capture's graph outside the
//! stream's order, and takes `&mut Capture` for the same reason.

use std::fmt;
use std::marker::PhantomData;
use std::ops::Deref;
use std::sync::MutexGuard;

use atlas_sys::{
    CUcontext, CUevent, CUevent_flags, CUgraph, CUgraphNode, CUgraphNodeType, CUstream,
    CUstreamCaptureMode,
};

use crate::device::capture::{self, Keep};
use crate::device::context::{ensure_bound, ordinal_of};
use crate::device::host_function;
use crate::device::stream::{CudaStream, StreamArg, sealed};
use crate::driver::calls;
use crate::error::{AtlasError, CaptureMisuse, Result, report_cleanup};

/// A captured graph, not yet instantiated.
///
/// It owns what its kernels need: the registry of every kernel a typed or raw launch of Atlas
/// captured into it (so the modules stay loaded), and the memory of every
/// [`DeviceBuffer`](crate::DeviceBuffer) given to a captured typed launch (a buffer dropped
/// meanwhile leaves its free to the graph). So instantiating it, and replaying what comes of it,
/// is safe after those registries and buffers are gone.
///
/// # Examples
///
/// ```no_run
/// # use atlas_registry::{AtlasRegistry, DeviceBuffer};
/// # fn f(registry: &AtlasRegistry, x: &mut DeviceBuffer<f32>) -> atlas_registry::Result<()> {
/// use atlas_registry::{CudaStream, LaunchConfig};
/// let (scale, n) = (registry.function_cached("elementwise", "scale")?, x.len() as u32);
/// let cfg = LaunchConfig::for_elements(n, 256);
/// let mut stream = CudaStream::new(registry.ctx())?;
/// let capture = stream.begin_capture()?;
/// for _ in 0..8 {
///     // SAFETY: `scale` touches the `n` floats of `x`, which the graph keeps allocated.
///     unsafe { scale.launch(&capture, &cfg, (&mut *x, 0.5f32, n))? };
/// }
/// let graph = capture.end()?; // 8 kernel nodes
/// assert_eq!(graph.kept_count(), 2); // the registry and the memory of `x`
/// let exec = graph.instantiate()?;
/// // SAFETY: the graph reaches only `x`, a buffer argument of its typed launches, which it keeps.
/// unsafe { exec.launch(&stream)? }; // the 8 kernels, one driver call
/// stream.synchronize()
/// # }
/// ```
pub struct CudaGraph {
    raw: CUgraph,
    context: CUcontext,
    /// What the graph's launches need alive; dropped after the graph is destroyed.
    keep: Keep,
}

// SAFETY: a CUgraph is a driver handle; the driver allows using it from any thread as long as
// calls on one graph are not concurrent, which `&mut`/ownership here guarantees for mutation.
// What `keep` holds is Send + Sync.
unsafe impl Send for CudaGraph {}
// SAFETY: shared references only read the graph (node lists, instantiation).
unsafe impl Sync for CudaGraph {}

/// What a [`Capture`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Begun by `begin_capture`: ended by `end` or the drop.
    Own,
    /// A conditional node's body, ended by Atlas when the body closure returns.
    Body,
    /// A stream forked into a capture, joined back by Atlas when the fork's closure returns.
    Forked,
}

/// A capture in progress on a stream: everything enqueued on the stream (by any thread, through
/// this value) becomes a node of a graph instead of running, until [`end`](Self::end) returns
/// the graph. Made by [`CudaStream::begin_capture`], in `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`.
///
/// It borrows the stream mutably, so the stream is used only through the capture while it lasts,
/// and the capture ends only when nothing else uses it: the driver crashes when work is enqueued
/// into a stream while another thread begins or ends its capture, and the borrow makes that
/// impossible to write. Launches and copies take `&Capture` as their stream (it dereferences to
/// the [`CudaStream`]), from any thread:
///
/// ```compile_fail
/// # fn f(registry: &atlas_registry::AtlasRegistry, x: &mut atlas_registry::DeviceBuffer<f32>) -> atlas_registry::Result<()> {
/// let mut stream = atlas_registry::CudaStream::new(registry.ctx())?;
/// let scale = registry.function_cached("elementwise", "scale")?;
/// let cfg = atlas_registry::LaunchConfig::for_elements(16, 16);
/// std::thread::scope(|s| {
///     s.spawn(|| {
///         // SAFETY: `x` holds 16 floats.
///         unsafe { scale.launch(&stream, &cfg, (&mut *x, 2.0f32, 16u32)) }
///     });
///     // Refused by the compiler: `stream` is borrowed by the launching thread.
///     let capture = stream.begin_capture();
/// });
/// # Ok(()) }
/// ```
///
/// It is `!Send`: the thread that began the capture ends it, as the driver's thread-local mode
/// requires.
///
/// ```compile_fail
/// fn send<T: Send>(_: T) {}
/// fn f(stream: &mut atlas_registry::CudaStream) {
///     send(stream.begin_capture().unwrap());
/// }
/// ```
///
/// Dropped without [`end`](Self::end) (or after a failing body), the capture is ended and its
/// graph destroyed. Streams joined into the capture with raw driver calls (`cuStreamWaitEvent` on
/// an event recorded in it) are part of it: the driver crashes when such a stream is enqueued into
/// while the capture ends, so until `end` returns they are the caller's to keep from other
/// threads.
#[must_use = "dropping a capture ends it and discards its graph"]
pub struct Capture<'s> {
    stream: &'s mut CudaStream,
    /// What the capture is: a capture of its own, or part of another (a conditional node's body,
    /// a forked stream), which Atlas ends or joins when its closure returns, never by `end` or the
    /// drop.
    kind: Kind,
    /// The streams forked into the capture (joined back already), as addresses: part of it until
    /// it ends.
    forked: Vec<usize>,
    /// Whether the capture still has to be ended (by the drop, if not by `end`).
    open: bool,
    /// `!Send` (ended on the thread that began it) but `Sync`.
    _thread: PhantomData<MutexGuard<'static, ()>>,
    /// Invariant in `'s`, so that a body closure cannot swap the body it is given with a capture
    /// of its own.
    _invariant: PhantomData<fn(&'s ()) -> &'s ()>,
}

impl CudaStream {
    /// Starts capturing the work enqueued on this stream into a graph
    /// (`CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`); nothing runs until the graph is replayed. The
    /// stream is used through the returned [`Capture`] until [`Capture::end`] returns the graph.
    /// The legacy default stream cannot be captured ([`CaptureMisuse::LegacyDefaultStream`]).
    ///
    /// Every launch of Atlas captured into the graph leaves it what the kernel needs (see
    /// [`CudaGraph`]), whichever thread made it through the capture.
    ///
    /// ```no_run
    /// # fn f(registry: &atlas_registry::AtlasRegistry, x: &mut atlas_registry::DeviceBuffer<f32>) -> atlas_registry::Result<()> {
    /// use atlas_registry::{CudaStream, LaunchConfig};
    /// let mut stream = CudaStream::new(registry.ctx())?;
    /// let scale = registry.function_cached("elementwise", "scale")?; // looked up before capturing
    /// let (n, cfg) = (x.len() as u32, LaunchConfig::for_elements(x.len() as u32, 256));
    /// let capture = stream.begin_capture()?;
    /// for factor in [2.0f32, 0.5, 3.0] {
    ///     // SAFETY: captured, not run: each replay touches the `n` floats of `x`, which outlives
    ///     // the graph.
    ///     unsafe { scale.launch(&capture, &cfg, (&mut *x, factor, n))? };
    /// }
    /// let mut exec = capture.end()?.instantiate()?;
    /// assert_eq!(exec.kernel_count(), 3);
    /// for _ in 0..10 {
    ///     // SAFETY: `x` and the registry (so the module) outlive the replays.
    ///     unsafe { exec.launch(&stream)? }; // one cuGraphLaunch for three kernels
    /// }
    /// // SAFETY: as for the captured launch it replaces.
    /// unsafe { exec.set_kernel_args(1, &scale, &cfg, (&mut *x, 1.0f32, n))? };
    /// stream.synchronize()?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuStreamBeginCapture_v2")]
    pub fn begin_capture(&mut self) -> Result<Capture<'_>> {
        if self.raw().is_null() {
            return Err(AtlasError::Capture(CaptureMisuse::LegacyDefaultStream));
        }
        ensure_bound(self.context())?;
        let raw = self.raw();
        let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        capture::began(raw, self.context());
        // SAFETY: the stream is live and not the legacy default stream; its context is current;
        // nothing else enqueues into it: `&mut self`, and for a wrapped stream duty 3 of
        // `CudaStream::wrap`.
        if let Err(e) = unsafe { calls::begin_capture(raw, mode) } {
            drop(capture::ended(raw));
            return Err(e.into());
        }
        // SAFETY: the stream is live, not null, and capturing (just begun).
        if let Ok(Some(id)) = unsafe { calls::capture_id(raw) } {
            capture::set_id(raw, id);
        }
        Ok(Capture::new(self, Kind::Own))
    }
}

impl<'s> Capture<'s> {
    /// The capture of `stream`, just begun.
    pub(crate) fn new(stream: &'s mut CudaStream, kind: Kind) -> Self {
        Self {
            stream,
            kind,
            forked: Vec::new(),
            open: true,
            _thread: PhantomData,
            _invariant: PhantomData,
        }
    }

    /// The stream being captured.
    pub fn stream(&self) -> &CudaStream {
        self.stream
    }

    /// Ends the capture and returns the graph, which owns what its launches need.
    ///
    /// While the capture lasts, calls that would break it are refused with
    /// [`AtlasError::Capture`] and leave it intact: [`synchronize`](CudaStream::synchronize) of
    /// the stream (from any thread), and from the capturing thread
    /// [`DeviceBuffer::alloc`](crate::DeviceBuffer::alloc), `from_slice` and the copies that wait
    /// for their stream. Stream-ordered allocations
    /// ([`DeviceBuffer::alloc_async`](crate::DeviceBuffer::alloc_async)) are captured as graph
    /// nodes. A free that would break the capture waits for it to end.
    ///
    /// An invalidated capture (the driver's `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`, after a call
    /// outside Atlas that broke it) ends with that error, and the stream is capturing no more.
    ///
    /// Whatever the driver answers, the stream is not capturing afterwards: a capture that a
    /// failed end left going is ended again, and its graph destroyed, as a dropped capture is.
    #[doc(alias = "cuStreamEndCapture")]
    pub fn end(mut self) -> Result<CudaGraph> {
        let raw = self.stream.raw();
        ensure_bound(self.stream.context())?;
        // SAFETY: the stream is live; its context is current; nothing else enqueues into it: the
        // capture is consumed, so no reference to the stream remains (for a wrapped stream, duty
        // 3 of `CudaStream::wrap`).
        match unsafe { calls::end_capture(raw) } {
            Ok(graph) => {
                self.open = false;
                self.forget_forks();
                Ok(CudaGraph {
                    raw: graph,
                    context: self.stream.context(),
                    keep: capture::ended(raw),
                })
            }
            Err(e) => {
                // An invalidated capture ends with the failure: ask the driver. One still going
                // is ended by the drop.
                // SAFETY: the stream is live; its context is current.
                if !unsafe { calls::stream_is_capturing(raw) }.unwrap_or(true) {
                    self.open = false;
                    self.forget_forks();
                    drop(capture::ended(raw));
                }
                Err(e.into())
            }
        }
    }

    /// Forks the capture into `side`, a stream of the same device: `body` is given this capture
    /// and a capture of `side`, and the work it enqueues on `side` becomes a branch of the graph
    /// that depends on what this capture held when `fork` was called and runs beside what `body`
    /// enqueues here meanwhile. When `body` returns, the branch is joined back: work captured here
    /// afterwards runs after it. Events recorded on either may be waited for by the other.
    ///
    /// `side` is borrowed until the capture ends: the driver keeps it part of the capture until
    /// then, and crashes when a stream of a capture is enqueued into while the capture ends.
    ///
    /// Refused: the legacy default stream ([`CaptureMisuse::LegacyDefaultStream`]), a stream of
    /// another device ([`AtlasError::WrongContext`]), a stream being captured already
    /// ([`CaptureMisuse::ForkOfCapturingStream`]). Any error `body` returns is returned after the
    /// branch is joined back.
    ///
    /// ```no_run
    /// # fn f(registry: &atlas_registry::AtlasRegistry, x: &mut atlas_registry::DeviceBuffer<f32>, y: &mut atlas_registry::DeviceBuffer<f32>) -> atlas_registry::Result<()> {
    /// use atlas_registry::{CudaStream, LaunchConfig};
    /// let (mut main, mut side) = (CudaStream::new(registry.ctx())?, CudaStream::new(registry.ctx())?);
    /// let scale = registry.function_cached("elementwise", "scale")?;
    /// let (n, cfg) = (x.len() as u32, LaunchConfig::for_elements(x.len() as u32, 256));
    /// let mut capture = main.begin_capture()?;
    /// capture.fork(&mut side, |main, side| {
    ///     // SAFETY: each kernel touches the `n` floats of its own buffer, which the graph keeps.
    ///     unsafe { scale.launch(main, &cfg, (&mut *x, 2.0f32, n))? };
    ///     // SAFETY: as above; `y` holds `n` floats too.
    ///     unsafe { scale.launch(side, &cfg, (&mut *y, 3.0f32, n)) } // beside the first
    /// })?;
    /// let graph = capture.end()?; // two kernels with no edge between them
    /// # drop(graph); Ok(()) }
    /// ```
    ///
    /// The forked stream is the capture's until it ends:
    ///
    /// ```compile_fail
    /// # fn f(registry: &atlas_registry::AtlasRegistry) -> atlas_registry::Result<()> {
    /// use atlas_registry::CudaStream;
    /// let (mut main, mut side) = (CudaStream::new(registry.ctx())?, CudaStream::new(registry.ctx())?);
    /// let mut capture = main.begin_capture()?;
    /// capture.fork(&mut side, |_, _| Ok(()))?;
    /// side.synchronize()?; // refused by the compiler: `side` is borrowed by the capture
    /// drop(capture.end()?);
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuStreamWaitEvent")]
    pub fn fork<R>(
        &mut self,
        side: &'s mut CudaStream,
        body: impl FnOnce(&Capture<'_>, &Capture<'_>) -> Result<R>,
    ) -> Result<R> {
        if side.raw().is_null() {
            return Err(AtlasError::Capture(CaptureMisuse::LegacyDefaultStream));
        }
        if side.context() != self.context() {
            return Err(AtlasError::WrongContext {
                what: "the stream to fork into".into(),
                expected: ordinal_of(self.context()),
                given: ordinal_of(side.context()),
            });
        }
        ensure_bound(self.context())?;
        // SAFETY: a live stream, not a default one (checked above), its context current.
        if capture::is_recorded(side.raw()) || unsafe { calls::stream_is_capturing(side.raw()) }? {
            return Err(AtlasError::Capture(CaptureMisuse::ForkOfCapturingStream));
        }
        let point = ForkPoint::new()?;
        let (origin, branch) = (self.raw(), side.raw());
        // SAFETY: the event is live and of the capture's context, which is current; the origin is
        // live and capturing; nothing but this capture's references enqueues into it.
        unsafe { calls::event_record(point.0, origin) }?;
        capture::began_fork(branch, self.context(), origin);
        // SAFETY: `side` is live, of the capture's context, and used by nothing else for as long
        // as the capture lasts (borrowed for `'s`); waiting for a point of the capture makes it
        // join the capture.
        if let Err(e) = unsafe { calls::stream_wait_event(branch, point.0) } {
            drop(capture::ended(branch));
            return Err(e.into());
        }
        self.forked.push(branch.addr());
        let join = Join {
            point,
            origin,
            branch,
            armed: true,
        };
        let result = body(&*self, &Capture::new(side, Kind::Forked));
        join.join()?;
        result
    }

    /// Removes the streams forked into the capture from Atlas's record, once it has ended.
    fn forget_forks(&mut self) {
        for branch in self.forked.drain(..) {
            drop(capture::ended(std::ptr::without_provenance_mut(branch)));
        }
    }

    /// Captures a host function: `f` runs on a driver thread at this point of every replay of the
    /// graph, as [`CudaStream::launch_host_func`] runs once. The graph keeps `f` until its last
    /// replay has finished. `f` must not call CUDA; a panic in it is caught and reported.
    #[doc(alias = "cuLaunchHostFunc")]
    pub fn launch_host_func(&self, f: impl Fn() + Send + Sync + 'static) -> Result<()> {
        host_function::capture_shared(self.stream, f)
    }

    /// The context of the stream being captured.
    pub(crate) fn context(&self) -> CUcontext {
        self.stream.context()
    }
}

impl Deref for Capture<'_> {
    type Target = CudaStream;

    fn deref(&self) -> &CudaStream {
        self.stream
    }
}

impl fmt::Debug for Capture<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Capture")
            .field("stream", &self.stream.raw())
            .field("kind", &self.kind)
            .finish()
    }
}

impl Drop for Capture<'_> {
    fn drop(&mut self) {
        if !self.open || self.kind != Kind::Own {
            return;
        }
        let raw = self.stream.raw();
        let bound = ensure_bound(self.stream.context());
        if bound.is_ok() {
            // SAFETY: the stream is live and capturing (begun by this value), its context current;
            // nothing else enqueues into it (the capture is being dropped).
            if let Ok(graph) = unsafe { calls::end_capture(raw) } {
                // SAFETY: the graph was just handed over by the driver, and is destroyed once.
                let destroyed = unsafe { calls::graph_destroy(graph) }.map_err(AtlasError::from);
                report_cleanup(
                    "destroying the graph of a capture dropped unended",
                    destroyed,
                );
            }
        }
        drop(capture::ended(raw));
    }
}

/// The event that marks where a fork leaves a capture and joins it again; destroyed when the
/// fork is done (the driver keeps what the capture needs of it).
struct ForkPoint(CUevent);

impl ForkPoint {
    /// An event without timing, in the current context (the capture's).
    fn new() -> Result<Self> {
        let flags = CUevent_flags::CU_EVENT_DISABLE_TIMING.0;
        // SAFETY: the caller made the capture's context current.
        Ok(Self(unsafe { calls::event_create(flags) }?))
    }
}

impl Drop for ForkPoint {
    fn drop(&mut self) {
        // SAFETY: created by `new`, destroyed only here.
        let result = unsafe { calls::event_destroy(self.0) }.map_err(AtlasError::from);
        report_cleanup("destroying a fork's event", result);
    }
}

/// Joins a forked stream back into its capture: the origin waits for the branch's end. Made when
/// the fork's body returns, or by the drop should it unwind.
struct Join {
    point: ForkPoint,
    origin: CUstream,
    branch: CUstream,
    /// Whether the drop still has to join (the body unwound).
    armed: bool,
}

impl Join {
    /// Joins now, returning what went wrong.
    fn join(mut self) -> Result<()> {
        self.armed = false;
        self.enqueue()
    }

    /// Records the point at the branch's end and makes the origin wait for it.
    fn enqueue(&self) -> Result<()> {
        // SAFETY: the event is live; the branch and the origin are live streams of its context,
        // part of one capture, into which nothing but the capture's references enqueues.
        unsafe { calls::event_record(self.point.0, self.branch) }?;
        // SAFETY: as above.
        unsafe { calls::stream_wait_event(self.origin, self.point.0) }?;
        Ok(())
    }
}

impl Drop for Join {
    fn drop(&mut self) {
        if self.armed {
            report_cleanup(
                "joining a forked stream back into its capture",
                self.enqueue(),
            );
        }
    }
}

impl sealed::Sealed for &Capture<'_> {}

impl StreamArg for &Capture<'_> {
    #[inline]
    fn stream_in(self, _call: CUcontext) -> (CUstream, CUcontext) {
        (self.stream.raw(), self.stream.context())
    }
}

impl CudaGraph {
    /// The raw handle.
    pub fn raw(&self) -> CUgraph {
        self.raw
    }

    /// How many things the graph keeps alive for its launches: the registries of its kernels
    /// and the allocations of its typed launches' buffer arguments, each counted once however many
    /// launches use it.
    pub fn kept_count(&self) -> usize {
        self.keep.len()
    }

    /// The context the graph was captured in.
    pub(crate) fn context(&self) -> CUcontext {
        self.context
    }

    /// What the graph keeps alive.
    pub(crate) fn keep(&self) -> &Keep {
        &self.keep
    }

    /// The graph's kernel nodes, in the order the driver lists them (for a graph captured from
    /// one stream, the order of the launches).
    pub(crate) fn kernel_nodes(&self) -> Result<Vec<CUgraphNode>> {
        // SAFETY: the graph is live (owned by `self`).
        let nodes = unsafe { calls::graph_nodes(self.raw) }?;
        let mut kernels = Vec::with_capacity(nodes.len());
        for node in nodes {
            // SAFETY: `node` belongs to this live graph.
            let kind = unsafe { calls::graph_node_type(node) }?;
            if kind == CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL {
                kernels.push(node);
            }
        }
        Ok(kernels)
    }
}

impl fmt::Debug for CudaGraph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CudaGraph({:p}, keeps {})", self.raw, self.keep.len())
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        let raw = self.raw;
        // What its kernels need is still kept while it is destroyed: `keep` is dropped after this.
        let result = ensure_bound(self.context).and_then(|()| {
            // SAFETY: destroyed only here, after any GraphExec made from it (which owns it), its
            // context current (above).
            Ok(unsafe { calls::graph_destroy(raw) }?)
        });
        report_cleanup("destroying a graph", result);
    }
}
