//! Host functions in a stream's order (`cuLaunchHostFunc`): a closure that runs on a driver thread
//! once the stream reaches it. Eagerly, it runs once ([`CudaStream::launch_host_func`]); captured,
//! at every replay of the graph ([`Capture::launch_host_func`](crate::Capture::launch_host_func)),
//! which keeps it until the device's work is done.
//!
//! A closure must not call CUDA (the driver forbids it in host functions and may deadlock), and
//! must not take long: the stream waits for it. A panic in it is caught and reported, never
//! unwound into the driver.

use std::any::Any;
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use atlas_sys::CUcontext;

use crate::device::capture::{self, Free, Hold};
use crate::device::stream::CudaStream;
use crate::driver::calls;
use crate::error::{AtlasError, CaptureMisuse, Result, report_cleanup};
use crate::report::{WithoutLogger, report};

/// A closure run once.
type Once = Box<dyn FnOnce() + Send>;

impl CudaStream {
    /// Runs `f` on a driver thread once the stream reaches this point of its work (after
    /// everything enqueued before, and before anything enqueued after): one driver call.
    ///
    /// `f` must not call CUDA, Atlas included (the driver forbids it there). A panic in `f` is
    /// caught and reported on stderr. On a stream being captured, where it would run at every
    /// replay, it is refused ([`CaptureMisuse::HostFunctionOnce`]): use
    /// [`Capture::launch_host_func`](crate::Capture::launch_host_func).
    ///
    /// ```no_run
    /// # fn f(stream: &atlas_registry::CudaStream) -> atlas_registry::Result<()> {
    /// let (done, seen) = std::sync::mpsc::channel();
    /// stream.launch_host_func(move || done.send(()).unwrap())?;
    /// seen.recv().unwrap(); // the work enqueued before it has finished
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuLaunchHostFunc")]
    pub fn launch_host_func(&self, f: impl FnOnce() + Send + 'static) -> Result<()> {
        if capture::watch().capturing() && capture::graph_of(self.raw()).is_some() {
            return Err(AtlasError::Capture(CaptureMisuse::HostFunctionOnce));
        }
        self.bind_if_default()?;
        let data = Box::into_raw(Box::new(Box::new(f) as Once));
        // SAFETY: the stream is live (a default stream's context was made current above); the
        // driver calls `run_once` with `data` once, and `run_once` takes the box back, runs it
        // without unwinding and makes no CUDA call.
        if let Err(e) = unsafe { calls::launch_host_func(self.raw(), run_once, data.cast()) } {
            // SAFETY: the driver did not take `data`: taken back once, here.
            drop(unsafe { Box::from_raw(data) });
            return Err(e.into());
        }
        Ok(())
    }
}

/// The driver's call of an eager host function: takes the closure back and runs it.
///
/// # Safety
///
/// 1. `data` is a `Box<Once>` leaked by `launch_host_func` and not taken back yet.
unsafe extern "C" fn run_once(data: *mut c_void) {
    // SAFETY: duty 1; the driver calls this once per enqueue.
    let f = unsafe { Box::from_raw(data.cast::<Once>()) };
    contain(f);
}

/// A captured host function, which the graph keeps and replays call; released after the device's
/// work, since a replay may still run it when the last graph goes.
struct Shared {
    run: Option<Box<dyn Fn() + Send + Sync>>,
    context: CUcontext,
}

// SAFETY: the closure is Send + Sync; the context is a handle, never dereferenced by Rust.
unsafe impl Send for Shared {}
// SAFETY: as above; shared references only call the closure, which is Sync.
unsafe impl Sync for Shared {}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(run) = self.run.take() {
            let result = capture::free(Free::after_device(self.context, Box::new(run)));
            report_cleanup("releasing a host function after the device's work", result);
        }
    }
}

/// Captures `f` on `stream`, which is being captured (`Capture::launch_host_func`): it runs at
/// every replay of the graph, which keeps it until its last replay has finished.
pub(crate) fn capture_shared(
    stream: &CudaStream,
    f: impl Fn() + Send + Sync + 'static,
) -> Result<()> {
    let Some(graph) = capture::graph_of(stream.raw()) else {
        return Err(AtlasError::Capture(CaptureMisuse::NotCapturing));
    };
    let shared = Arc::new(Shared {
        run: Some(Box::new(f)),
        context: stream.context(),
    });
    let data = Arc::as_ptr(&shared).cast_mut().cast::<c_void>();
    // Held before the driver records it, so that no replay can outlive it.
    capture::hold(graph, vec![shared as Hold], false);
    // SAFETY: the stream is live and capturing; `data` points to a `Shared` that the graph keeps
    // until its replays are done (its release waits for the device), and `run_shared` calls the
    // closure without unwinding and makes no CUDA call.
    unsafe { calls::launch_host_func(stream.raw(), run_shared, data) }?;
    Ok(())
}

/// The driver's call of a captured host function.
///
/// # Safety
///
/// 1. `data` points to a live `Shared` (its graph keeps it).
unsafe extern "C" fn run_shared(data: *mut c_void) {
    // SAFETY: duty 1.
    let shared = unsafe { &*data.cast::<Shared>() };
    if let Some(run) = &shared.run {
        contain(run);
    }
}

/// Runs `f`, catching a panic (it must not unwind into the driver) and reporting it to the
/// logger (the panic hook has already printed it).
fn contain(f: impl FnOnce()) {
    if let Err(panic) = catch_unwind(AssertUnwindSafe(f)) {
        report(
            log::Level::Error,
            module_path!(),
            format_args!("a host function panicked: {}", panic_text(&*panic)),
            WithoutLogger::Silent,
        );
    }
}

/// What a panic says, when it says it in text.
fn panic_text(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}
