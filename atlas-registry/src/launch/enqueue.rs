//! The launch function that every plain path ends in (typed, raw), `cuLaunchKernel`, the
//! dynamic shared memory opt-in it (and a launch with attributes) makes first when a launch needs
//! more than a function is allowed, and the flight recorder's note of every launch the driver
//! accepted.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};

use atlas_sys::{CUfunction, CUfunction_attribute, CUstream};

use crate::code::dependency_wait::DependencyWait;
use crate::code::module::ParamLayout;
use crate::device::context::ensure_bound;
use crate::device::host::CudaHost;
use crate::device::stream::is_default;
use crate::driver::{self, About, calls};
use crate::error::{AtlasError, Result};
use crate::flight_recorder::{Arguments, KernelLaunch, Note};
use crate::launch::args::ArgumentSummary;
use crate::launch::config::LaunchConfig;

/// Per-function state the launch path keeps: the dynamic shared memory the function may use.
#[derive(Debug, Default)]
pub(crate) struct SharedMemOptIn {
    /// The function's current `MAX_DYNAMIC_SHARED_SIZE_BYTES` as Atlas last set or read it, or 0
    /// before it was first read.
    allowed: AtomicU32,
}

/// Serializes every raise of a function's dynamic shared memory limit. The driver only *sets* the
/// limit, so two unserialized raises (to 64 KiB and 96 KiB) can leave it at the smaller one after
/// the larger was recorded; under this lock each raise reads the limit again and never lowers it.
/// Raises are rare (once per function and size), so one process-wide lock costs nothing.
static RAISING: Mutex<()> = Mutex::new(());

impl SharedMemOptIn {
    /// Makes sure `func` may use `bytes` of dynamic shared memory: reads the function's limit once
    /// and raises it (monotonic maximum) only when a launch needs more than it allows.
    ///
    /// # Safety
    ///
    /// 1. `func` is a live function of `host`'s context.
    #[inline]
    pub(crate) unsafe fn ensure(
        &self,
        host: &CudaHost,
        func: CUfunction,
        bytes: u32,
    ) -> Result<()> {
        if self.allows(bytes) {
            return Ok(());
        }
        // SAFETY: duty 1.
        unsafe { self.raise(host, func, bytes) }
    }

    /// Whether the function may use `bytes` of dynamic shared memory as Atlas last set or read its
    /// limit (0 bytes always).
    #[inline(always)]
    pub(crate) fn allows(&self, bytes: u32) -> bool {
        bytes <= self.allowed.load(Ordering::Acquire)
    }

    /// # Safety
    ///
    /// 1. As [`ensure`](Self::ensure).
    #[cold]
    unsafe fn raise(&self, host: &CudaHost, func: CUfunction, bytes: u32) -> Result<()> {
        let _serial = RAISING.lock().unwrap_or_else(PoisonError::into_inner);
        if bytes <= self.allowed.load(Ordering::Acquire) {
            return Ok(()); // raised by another thread meanwhile
        }
        ensure_bound(host.raw_context())?;
        let attribute = CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
        // SAFETY: duty 1.
        let current = unsafe { calls::function_attribute(func, attribute) }
            .about(|| "dynamic shared memory limit".into())?;
        let mut allowed = u32::try_from(current).unwrap_or(0);
        if bytes > allowed {
            // SAFETY: duty 1; `bytes` was checked against the device's opt-in maximum, which fits an
            // i32, and it is more than the current limit, so this only raises it.
            unsafe { calls::set_function_attribute(func, attribute, bytes as i32) }
                .about(|| format!("opt in to {bytes} B of dynamic shared memory"))?;
            allowed = bytes;
        }
        self.allowed.store(allowed, Ordering::Release);
        Ok(())
    }
}

/// The function a launch is checked for: what a launch error names it by, what Atlas knows of
/// its code, and what the flight recorder records it as.
pub(crate) trait FunctionName {
    fn function_name(&self) -> String;

    /// Whether the function's code waits for the grid it depends on; unknown unless Atlas has
    /// read its code.
    fn dependency_wait(&self) -> DependencyWait {
        DependencyWait::Unknown
    }

    /// The kernel's name number for the flight recorder and its registry's id; zeros for a
    /// function Atlas has no entry for.
    #[inline]
    fn recorded_as(&self) -> (u32, u64) {
        (0, 0)
    }
}

/// A launch's parameters: the array the driver takes, and what the flight recorder reads of it.
#[derive(Clone, Copy)]
pub(crate) struct Params<'a> {
    /// One pointer per kernel parameter (null for a kernel without parameters).
    pub(crate) array: *mut *mut c_void,
    /// How many pointers the array holds.
    pub(crate) count: usize,
    /// Whether a capture Atlas began takes the launch in.
    pub(crate) captured: bool,
    /// What the flight recorder makes the arguments' words from.
    pub(crate) known: Known<'a>,
}

/// What a launch knows of its arguments, for the flight recorder.
#[derive(Clone, Copy)]
pub(crate) enum Known<'a> {
    /// A typed launch's arguments, which make their own words.
    Typed(&'a dyn ArgumentSummary),
    /// The kernel's layout, which the array matches: the words are read from the array.
    Layout(&'a ParamLayout),
    /// Nothing: a function Atlas has no entry for, or whose layout was never read.
    Nothing,
}

impl<'a> Params<'a> {
    /// The parameters of a typed launch of `args`: `array` holds one pointer per size of
    /// `sizes`.
    #[inline(always)]
    pub(crate) fn typed(
        array: *mut *mut c_void,
        sizes: &[usize],
        captured: bool,
        args: &'a dyn ArgumentSummary,
    ) -> Self {
        Self {
            array,
            count: sizes.len(),
            captured,
            known: Known::Typed(args),
        }
    }
}

/// The flight recorder's note of a launch about to be made, when `host`'s recorder is on (a
/// relaxed load when off): its number (one atomic increment) taken and its words written into a
/// ring slot (one compare-and-swap) before the driver call, while what they are made of is in
/// cache; [`Note::keep`] makes it stand (one store) once the driver accepted the launch, and
/// dropped it is withdrawn. Nothing allocated, no driver call (see `flight_recorder`).
///
/// # Safety
///
/// 1. For [`Known::Layout`], `params.array` points to one pointer per parameter of the layout,
///    each to as many readable bytes as the parameter's size.
#[inline(always)]
pub(crate) unsafe fn note<'h>(
    host: &'h CudaHost,
    func: CUfunction,
    name: &dyn FunctionName,
    cfg: &LaunchConfig,
    stream: CUstream,
    params: Params<'_>,
    with_attributes: bool,
) -> Option<Note<'h>> {
    let recorder = host.flight_recorder();
    if !recorder.is_enabled() {
        return None;
    }
    let (name, registry) = name.recorded_as();
    let launch = KernelLaunch {
        name,
        registry,
        function: func as usize,
        stream,
        grid: cfg.grid,
        block: cfg.block,
        shared_mem_bytes: cfg.shared_mem_bytes,
        with_attributes,
        captured: params.captured,
        params: params.array,
        count: params.count,
        arguments: match params.known {
            Known::Typed(args) => Arguments::Made(args.argument_words()),
            Known::Layout(layout) => Arguments::Read {
                sizes: layout.recorded,
                known: layout.sizes.len(),
            },
            Known::Nothing => Arguments::Unknown,
        },
    };
    // SAFETY: duty 1 is the recorder's duty 1.
    unsafe { recorder.note(&launch) }
}

/// A function Atlas has no entry for (a `RawCudaFunc::from_raw` handle): named by its handle.
pub(crate) struct UnknownFunction(pub(crate) CUfunction);

impl FunctionName for UnknownFunction {
    fn function_name(&self) -> String {
        format!("function {:p}", self.0)
    }
}

/// `Ok` when `cfg` fits `host`'s device, else an [`AtlasError::InvalidLaunch`] naming the limit.
#[inline]
pub(crate) fn check_config(
    host: &CudaHost,
    name: &dyn FunctionName,
    cfg: &LaunchConfig,
) -> Result<()> {
    match host.limits().check(cfg) {
        Ok(()) => Ok(()),
        Err(limit) => Err(AtlasError::InvalidLaunch {
            function: name.function_name(),
            reason: limit.into(),
        }),
    }
}

/// The launch: calls `cuLaunchKernel` once. A created stream names its context, so nothing else
/// reaches the driver; only for a default stream (null, `CU_STREAM_LEGACY`,
/// `CU_STREAM_PER_THREAD`), which means "the current context's", is `host`'s context made current
/// first. No allocation unless it fails.
///
/// # Safety
///
/// 1. `func` is a live function of `host`'s context, and `stream` a live stream of that context or
///    a default stream handle.
/// 2. `params.array` points to one pointer per kernel parameter, each to a value of that
///    parameter's type (or is null for a kernel without parameters); a [`Known::Layout`] is
///    the kernel's layout.
/// 3. `cfg` fits the device (checked by [`check_config`]), and the function may use its dynamic
///    shared memory ([`SharedMemOptIn::ensure`] made the opt-in).
/// 4. What the kernel reads and writes through its arguments is valid memory of `host`'s device that
///    stays allocated until the kernel has run.
#[inline(always)]
pub(crate) unsafe fn launch_kernel(
    host: &CudaHost,
    func: CUfunction,
    name: &dyn FunctionName,
    cfg: &LaunchConfig,
    stream: CUstream,
    params: Params<'_>,
) -> Result<()> {
    if is_default(stream) {
        ensure_bound(host.raw_context())?;
    }
    // SAFETY: duties 1–4; for a default stream the function's context is current (above).
    unsafe { launch_bound(host, func, name, cfg, stream, params) }
}

/// [`launch_kernel`] once the stream's context is known to be current where it must be: the
/// flight recorder's note, `cuLaunchKernel`, and the note kept or withdrawn.
///
/// # Safety
///
/// 1. The duties of [`launch_kernel`].
/// 2. `stream` is a created stream, or `host`'s context is current on the calling thread.
#[inline(always)]
pub(crate) unsafe fn launch_bound(
    host: &CudaHost,
    func: CUfunction,
    name: &dyn FunctionName,
    cfg: &LaunchConfig,
    stream: CUstream,
    params: Params<'_>,
) -> Result<()> {
    // SAFETY: duty 1 (`launch_kernel`'s 2): each pointer leads to a value of its parameter's size.
    let note = unsafe { note(host, func, name, cfg, stream, params, false) };
    // SAFETY: the host's entry point is the driver's `cuLaunchKernel`; duty 1 (`launch_kernel`'s
    // 1–4); a default stream's context is current (duty 2).
    let launched = unsafe {
        calls::launch_kernel(
            host.launch_kernel_fn(),
            func,
            cfg.grid,
            cfg.block,
            cfg.shared_mem_bytes,
            stream,
            params.array,
        )
    };
    match launched {
        Ok(()) => {
            if let Some(note) = note {
                note.keep();
            }
            Ok(())
        }
        Err(e) => Err(launch_error(name, cfg, stream, e)),
    }
}

/// The error of a launch the driver refused: an [`AtlasError::Launch`] naming the function and
/// configuration, or the context lost.
#[cold]
pub(crate) fn launch_error(
    name: &dyn FunctionName,
    cfg: &LaunchConfig,
    stream: CUstream,
    error: driver::Error,
) -> AtlasError {
    match error {
        driver::Error::Failed(failure) if !failure.is_sticky() => AtlasError::Launch {
            function: name.function_name(),
            grid: cfg.grid,
            block: cfg.block,
            shared_mem: cfg.shared_mem_bytes,
            code: failure.code,
        },
        other => AtlasError::from(other.about(|| format!("launching `{}`", name.function_name())))
            .on_stream(stream),
    }
}
