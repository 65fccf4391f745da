//! What the recorder hands out: one launch as data ([`LaunchRecord`]), and what a lost context's
//! error carries ([`FaultReport`]), with the compact text the error's `Display` shows.

use std::fmt;
use std::sync::Arc;

use atlas_sys::{CUfunction, CUgraphExec, CUstream};

/// What a recorded launch was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LaunchKind {
    /// A kernel launched with `cuLaunchKernel` (a typed launch or `launch_on_stream`).
    Kernel,
    /// A kernel launched with launch attributes (`cuLaunchKernelEx`).
    KernelWithAttributes,
    /// A replay of an instantiated graph (`cuGraphLaunch`): one record for all its nodes.
    Graph,
}

/// One argument of a recorded launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordedArgument {
    pub(super) size: usize,
    pub(super) value: Option<u64>,
}

impl RecordedArgument {
    /// The argument's size in bytes (capped at 65,535).
    pub fn size(&self) -> usize {
        self.size
    }

    /// The argument's bytes as a little-endian integer, for one of 1, 2, 4 or 8 bytes among the
    /// first 5 arguments: for a device buffer or view, its device address; for a scalar, its
    /// value. `None` for arguments of other sizes and later ones.
    pub fn value(&self) -> Option<u64> {
        self.value
    }
}

/// One launch the flight recorder kept: what was launched, where, how, and with what arguments.
///
/// Obtained from [`AtlasError::fault_report`](crate::AtlasError::fault_report) after a context
/// was lost, or from [`FlightRecorder::launches`](crate::FlightRecorder::launches) at any time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchRecord {
    pub(super) sequence: u64,
    pub(super) device: usize,
    pub(super) kind: LaunchKind,
    /// `module::function`, and where the module part ends.
    pub(super) name: Option<(Arc<str>, usize)>,
    pub(super) registry: Option<u64>,
    pub(super) handle: usize,
    pub(super) stream: usize,
    pub(super) grid: (u32, u32, u32),
    pub(super) block: (u32, u32, u32),
    pub(super) shared_mem_bytes: u32,
    pub(super) captured: bool,
    pub(super) argument_count: usize,
    pub(super) arguments: Vec<RecordedArgument>,
    pub(super) on_failing_stream: bool,
}

impl LaunchRecord {
    /// The launch's number on its device: increasing in the order the device's launches were
    /// recorded (on all its streams), so that it orders the launches of one device. Devices
    /// number their launches apart; a report of several devices lists them device by device.
    pub fn sequence(&self) -> u64 {
        self.sequence
    }

    /// The ordinal of the device launched on.
    pub fn device(&self) -> usize {
        self.device
    }

    /// What was launched: a kernel, a kernel with attributes, a graph.
    pub fn kind(&self) -> LaunchKind {
        self.kind
    }

    /// The kernel's `module::function`; `None` for a graph and for a function Atlas has no entry
    /// for (a `RawCudaFunc::from_raw` handle), which [`handle`](Self::handle) names.
    pub fn kernel(&self) -> Option<&str> {
        self.name.as_ref().map(|(name, _)| &**name)
    }

    /// The kernel's module and function names (see [`kernel`](Self::kernel)).
    pub fn parts(&self) -> Option<(&str, &str)> {
        self.name.as_ref().map(|(name, module_len)| {
            let (module, rest) = name.split_at(*module_len);
            (module, rest.get(2..).unwrap_or(""))
        })
    }

    /// The id of the registry the kernel was launched through (as a graph's nodes are not, `None`
    /// for a graph and for a function Atlas has no entry for).
    pub fn registry(&self) -> Option<u64> {
        self.registry
    }

    /// The `CUfunction` launched, or the `CUgraphExec` replayed, as an address: a handle is
    /// only a name here (it may no longer be live).
    pub fn handle(&self) -> usize {
        self.handle
    }

    /// The raw `CUfunction` of a kernel launch (null for a graph), to compare with handles;
    /// never to be called: it may no longer be live.
    pub fn function(&self) -> CUfunction {
        match self.kind {
            LaunchKind::Graph => std::ptr::null_mut(),
            _ => self.handle as CUfunction,
        }
    }

    /// The raw `CUgraphExec` of a graph replay (null for a kernel), to compare with handles.
    pub fn graph_exec(&self) -> CUgraphExec {
        match self.kind {
            LaunchKind::Graph => self.handle as CUgraphExec,
            _ => std::ptr::null_mut(),
        }
    }

    /// The stream launched on (null for the legacy default stream), to compare with
    /// [`CudaStream::raw`](crate::CudaStream::raw).
    pub fn stream(&self) -> CUstream {
        self.stream as CUstream
    }

    /// The grid, in blocks (zeros for a graph).
    pub fn grid(&self) -> (u32, u32, u32) {
        self.grid
    }

    /// The block, in threads (zeros for a graph).
    pub fn block(&self) -> (u32, u32, u32) {
        self.block
    }

    /// The dynamic shared memory per block, in bytes.
    pub fn shared_mem_bytes(&self) -> u32 {
        self.shared_mem_bytes
    }

    /// Whether the launch was captured into a graph by a capture Atlas began (so it ran only at
    /// replays of that graph, which are recorded as [`LaunchKind::Graph`]).
    pub fn is_captured(&self) -> bool {
        self.captured
    }

    /// How many arguments the launch passed (0 for a graph).
    pub fn argument_count(&self) -> usize {
        self.argument_count
    }

    /// The first 8 arguments, as far as their sizes are known (a raw
    /// launch of a function Atlas has no entry for records only the count).
    pub fn arguments(&self) -> &[RecordedArgument] {
        &self.arguments
    }

    /// Whether the launch was on the stream whose call found the context lost; true for every
    /// launch when that call took no stream.
    pub fn on_failing_stream(&self) -> bool {
        self.on_failing_stream
    }

    /// `faults::write_far` or `graph 0x…` or `function 0x…`.
    fn what(&self) -> String {
        match (&self.kind, self.kernel()) {
            (LaunchKind::Graph, _) => format!("graph {:#x}", self.handle),
            (_, Some(name)) => name.to_owned(),
            (_, None) => format!("function {:#x}", self.handle),
        }
    }
}

impl fmt::Display for LaunchRecord {
    /// `#51 faults::write_far grid (1, 1, 1) block (1, 1, 1) stream 0x… args [8: 0x7f…]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{} {}", self.sequence, self.what())?;
        if self.captured {
            f.write_str(" (captured)")?;
        }
        if self.kind != LaunchKind::Graph {
            write!(f, " grid {:?} block {:?}", self.grid, self.block)?;
            if self.shared_mem_bytes != 0 {
                write!(f, " shared {} B", self.shared_mem_bytes)?;
            }
        }
        write!(f, " stream {:#x}", self.stream)?;
        if self.argument_count != 0 {
            f.write_str(" args [")?;
            for (i, argument) in self.arguments.iter().enumerate() {
                if i != 0 {
                    f.write_str(", ")?;
                }
                match argument.value {
                    Some(value) if argument.size == 8 => write!(f, "{value:#x}")?,
                    Some(value) => write!(f, "{value}")?,
                    None => write!(f, "{} B", argument.size)?,
                }
            }
            if self.arguments.len() < self.argument_count {
                if !self.arguments.is_empty() {
                    f.write_str(", ")?;
                }
                write!(f, "{} more", self.argument_count - self.arguments.len())?;
            }
            f.write_str("]")?;
        }
        Ok(())
    }
}

/// What the flight recorder knew when a context was found lost: the launches it kept on that
/// context (or on every device, when the failing call's context is not known), newest first,
/// those of the failing stream marked, and the driver's own log.
///
/// Carried by [`AtlasError::ContextLost`](crate::AtlasError::ContextLost); cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct FaultReport {
    inner: Arc<Inner>,
}

#[derive(Debug, Clone, Default)]
struct Inner {
    launches: Vec<LaunchRecord>,
    stream: Option<usize>,
    driver_log: Option<String>,
    recording: bool,
}

/// How many launches of the failing stream the error's text names, and of other streams.
const SHOWN_FAILING: usize = 8;
const SHOWN_OTHERS: usize = 4;
/// How many of the driver's last log lines the error's text shows.
const SHOWN_LOG_LINES: usize = 3;

impl FaultReport {
    pub(super) fn new(
        launches: Vec<LaunchRecord>,
        driver_log: Option<String>,
        recording: bool,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                launches,
                stream: None,
                driver_log,
                recording,
            }),
        }
    }

    /// The recorded launches, newest first.
    pub fn launches(&self) -> &[LaunchRecord] {
        &self.inner.launches
    }

    /// The recorded launches on the failing stream (every one when the failing call took no
    /// stream), newest first: the launch that faulted is usually among the first.
    pub fn failing_stream_launches(&self) -> impl Iterator<Item = &LaunchRecord> {
        self.inner.launches.iter().filter(|l| l.on_failing_stream)
    }

    /// The stream the failing call was made on, when it took one.
    pub fn failing_stream(&self) -> Option<CUstream> {
        self.inner.stream.map(|s| s as CUstream)
    }

    /// What the driver's own log holds since Atlas first used a device (`cuLogsDumpToMemory`,
    /// CUDA 12.9+), one message a line; `None` when the driver keeps no log.
    pub fn driver_log(&self) -> Option<&str> {
        self.inner.driver_log.as_deref()
    }

    /// Whether the recorder was on for the context when the error was made (when off, there are
    /// no launches to show).
    pub fn was_recording(&self) -> bool {
        self.inner.recording
    }

    /// The same report, with the launches on `stream` marked as the failing stream's.
    pub(crate) fn on_stream(mut self, stream: CUstream) -> Self {
        let inner = Arc::make_mut(&mut self.inner);
        inner.stream = Some(stream as usize);
        for launch in &mut inner.launches {
            launch.on_failing_stream = launch.stream == stream as usize;
        }
        self
    }
}

impl fmt::Display for FaultReport {
    /// Empty when there is nothing to say; else `. Launches recorded, newest first: …`, for
    /// the text of the lost context's error.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &*self.inner;
        let failing: Vec<_> = self.failing_stream_launches().take(SHOWN_FAILING).collect();
        let others: Vec<_> = inner
            .launches
            .iter()
            .filter(|l| !l.on_failing_stream)
            .take(SHOWN_OTHERS)
            .collect();
        if !failing.is_empty() {
            match inner.stream {
                Some(stream) => write!(
                    f,
                    ". Last launches on the failing stream {stream:#x}, newest first: "
                )?,
                None => f.write_str(". Last launches, newest first: ")?,
            }
            compact(f, &failing)?;
        } else if inner.stream.is_some() && !inner.launches.is_empty() {
            f.write_str(". No launch on the failing stream was recorded")?;
        }
        if !others.is_empty() {
            f.write_str(". On other streams: ")?;
            compact(f, &others)?;
        }
        let shown = failing.len() + others.len();
        if shown < inner.launches.len() {
            write!(
                f,
                " ({} more in `AtlasError::fault_report`)",
                inner.launches.len() - shown
            )?;
        }
        if !inner.recording && inner.launches.is_empty() {
            f.write_str(". The flight recorder was off")?;
        }
        if let Some(log) = &inner.driver_log {
            let lines: Vec<_> = log.lines().filter(|l| !l.trim().is_empty()).collect();
            if !lines.is_empty() {
                f.write_str(". Driver log: ")?;
                let start = lines.len().saturating_sub(SHOWN_LOG_LINES);
                f.write_str(&lines[start..].join(" | "))?;
            }
        }
        Ok(())
    }
}

/// `faults::write_far (1, 1, 1)x(1, 1, 1) #51; elementwise::scale (2, 1, 1)x(128, 1, 1) #49..#37
/// (7 launches)`: each launch by name and shape, runs of the same kernel and shape as one.
fn compact(f: &mut fmt::Formatter<'_>, launches: &[&LaunchRecord]) -> fmt::Result {
    let same = |a: &LaunchRecord, b: &LaunchRecord| {
        (a.kind, &a.name, a.handle, a.grid, a.block) == (b.kind, &b.name, b.handle, b.grid, b.block)
    };
    let mut rest = launches;
    let mut first = true;
    while let Some((&head, _)) = rest.split_first() {
        let run = rest.iter().take_while(|l| same(l, head)).count();
        if !first {
            f.write_str("; ")?;
        }
        first = false;
        f.write_str(&head.what())?;
        if head.kind != LaunchKind::Graph {
            let ((gx, gy, gz), (bx, by, bz)) = (head.grid, head.block);
            write!(f, " ({gx}, {gy}, {gz})x({bx}, {by}, {bz})")?;
        }
        if head.captured {
            f.write_str(" captured")?;
        }
        match run {
            1 => write!(f, " #{}", head.sequence)?,
            n => write!(
                f,
                " #{}..#{} ({n} launches)",
                head.sequence,
                rest[n - 1].sequence
            )?,
        }
        rest = &rest[run..];
    }
    Ok(())
}
