//! [`CudaHost`]: the process-wide context, stream and limits of one device, and [`host`].

use std::sync::{Arc, Mutex, PoisonError};

use atlas_sys::CUcontext;

use crate::device::context::CudaContext;
use crate::device::limits::{DeviceLimits, compute_capability_of};
use crate::device::stream::CudaStream;
use crate::driver::{About, LaunchKernelFn, calls, driver};
use crate::error::{AtlasError, Result};
use crate::flight_recorder::FlightRecorder;

/// One device as the process uses it: its primary context (retained once) and one non-blocking
/// stream, created on first use by [`host`] and kept for the life of the process.
#[derive(Debug)]
pub struct CudaHost {
    launches: LaunchLine,
    ordinal: usize,
    name: String,
    compute_capability: (u32, u32),
    // Field order is drop order: the stream before the context it belongs to.
    stream: CudaStream,
    context: CudaContext,
}

/// What every launch reads of its device, in one cache line: `cuLaunchKernel`, the context's
/// handle, the flight recorder and the limits. The driver's call evicts what Atlas touched before
/// it from the first-level cache, so each line a launch reads costs a miss on every launch; these
/// take one.
#[derive(Debug)]
#[repr(C, align(64))]
struct LaunchLine {
    launch_kernel: LaunchKernelFn,
    /// The handle of the host's context (owned by its [`CudaContext`]).
    context: CUcontext,
    recorder: Arc<FlightRecorder>,
    limits: DeviceLimits,
}

const _: () = assert!(size_of::<LaunchLine>() == 64);

// SAFETY: the fields are Send and Sync but for the context handle, a driver handle usable from
// any thread, of the primary context the host's `CudaContext` keeps retained.
unsafe impl Send for LaunchLine {}
// SAFETY: as for Send; nothing here is mutated after the host is made.
unsafe impl Sync for LaunchLine {}

impl CudaHost {
    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The device's name, as the driver reports it (`NVIDIA H200`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The device's primary context.
    pub fn context(&self) -> &CudaContext {
        &self.context
    }

    /// The device's process-wide stream.
    pub fn stream(&self) -> &CudaStream {
        &self.stream
    }

    /// The device's compute capability as `(major, minor)`: `(9, 0)` for an H100 or H200.
    pub fn compute_capability(&self) -> (u32, u32) {
        self.compute_capability
    }

    /// The launch limits of the device, read once when the host was created.
    pub fn limits(&self) -> &DeviceLimits {
        &self.launches.limits
    }

    /// The device's flight recorder: its switch and the launches it recorded (see
    /// [`FlightRecorder`]).
    pub fn flight_recorder(&self) -> &FlightRecorder {
        &self.launches.recorder
    }

    /// The handle of the device's primary context, read from the line every launch reads.
    #[inline(always)]
    pub(crate) fn raw_context(&self) -> CUcontext {
        self.launches.context
    }

    /// `cuLaunchKernel`, from the line every launch reads.
    #[inline(always)]
    pub(crate) fn launch_kernel_fn(&self) -> LaunchKernelFn {
        self.launches.launch_kernel
    }

    fn create(ordinal: usize) -> Result<Self> {
        let count = device_count()?;
        if ordinal >= count {
            return Err(AtlasError::InvalidDevice { ordinal, count });
        }
        let ordinal_c =
            i32::try_from(ordinal).map_err(|_| AtlasError::InvalidDevice { ordinal, count })?;
        let about = || format!("device {ordinal}");
        let device = calls::device_get(ordinal_c).about(about)?;
        let name = calls::device_name(device).about(about)?;
        let compute_capability = compute_capability_of(device, ordinal)?;
        let context = CudaContext::retain_primary(device, ordinal)?;
        let limits = DeviceLimits::read(device, ordinal)?;
        let stream = CudaStream::new(&context)?;
        let recorder = FlightRecorder::new(ordinal, context.raw(), calls::log_position);
        Ok(Self {
            launches: LaunchLine {
                launch_kernel: driver()?.launch_kernel,
                context: context.raw(),
                recorder,
                limits,
            },
            ordinal,
            name,
            compute_capability,
            stream,
            context,
        })
    }
}

/// The compute capability of every device, by ordinal, without creating any host (no context is
/// made).
pub(crate) fn compute_capabilities() -> Result<Vec<(u32, u32)>> {
    (0..device_count()?)
        .map(|ordinal| {
            let device = calls::device_get(ordinal as i32).about(|| format!("device {ordinal}"))?;
            compute_capability_of(device, ordinal)
        })
        .collect()
}

/// How many CUDA devices the driver sees.
#[doc(alias = "cuDeviceGetCount")]
pub fn device_count() -> Result<usize> {
    Ok(usize::try_from(calls::device_count()?).unwrap_or(0))
}

/// Every host created so far, by ordinal.
static HOSTS: Mutex<Vec<Option<Arc<CudaHost>>>> = Mutex::new(Vec::new());

pub(crate) use crate::device::context::ordinal_of;

/// The process-wide host of device `ordinal`: created on the first call (primary context retained,
/// stream created, limits read), the same `Arc` on every later call.
///
/// A bad ordinal is [`AtlasError::InvalidDevice`], naming it and the device count.
///
/// # Thread safety
///
/// Callable from any thread; concurrent first calls create one host.
pub fn host(ordinal: usize) -> Result<Arc<CudaHost>> {
    let mut hosts = HOSTS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(Some(existing)) = hosts.get(ordinal) {
        return Ok(Arc::clone(existing));
    }
    let created = Arc::new(CudaHost::create(ordinal)?);
    if hosts.len() <= ordinal {
        hosts.resize(ordinal + 1, None);
    }
    hosts[ordinal] = Some(Arc::clone(&created));
    Ok(created)
}
