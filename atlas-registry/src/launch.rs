//! [`LaunchConfig`], the device limits it is checked against, the dynamic shared memory opt-in, and
//! the one launch function that every path ends in.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};

use atlas_sys::{
    CUdevice, CUdevice_attribute as Attr, CUfunction, CUfunction_attribute, CUresult, CUstream,
};

use crate::context::ensure_bound;
use crate::driver::{cu, driver};
use crate::error::{AtlasError, Result, cuda_error_text};
use crate::host::{CudaHost, device_attribute};

/// Grid, block and dynamic shared memory of a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LaunchConfig {
    /// Blocks in x, y, z.
    pub grid: (u32, u32, u32),
    /// Threads per block in x, y, z.
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block, in bytes. Above 48 KiB, Atlas makes the per-function opt-in
    /// (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`) once per function and size.
    pub shared_mem_bytes: u32,
}

impl LaunchConfig {
    /// A one-dimensional launch covering `n` elements with `block` threads per block
    /// (`ceil(n / block)` blocks, at least one), no dynamic shared memory.
    pub fn for_elements(n: u32, block: u32) -> Self {
        let block = block.max(1);
        Self {
            grid: (n.div_ceil(block).max(1), 1, 1),
            block: (block, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// The same configuration with `bytes` of dynamic shared memory per block.
    pub fn with_shared_mem(self, bytes: u32) -> Self {
        Self {
            shared_mem_bytes: bytes,
            ..self
        }
    }
}

/// The launch limits of one device, read once per [`CudaHost`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceLimits {
    /// Most threads in one block.
    pub max_threads_per_block: u32,
    /// Largest block dimension in x, y, z.
    pub max_block: (u32, u32, u32),
    /// Largest grid dimension in x, y, z.
    pub max_grid: (u32, u32, u32),
    /// Most dynamic shared memory one block can get with the opt-in, in bytes.
    pub max_shared_mem_optin: u32,
}

impl DeviceLimits {
    pub(crate) fn read(device: CUdevice, ordinal: usize) -> Result<Self> {
        let get = |a| device_attribute(device, a, ordinal).map(|v| u32::try_from(v).unwrap_or(0));
        Ok(Self {
            max_threads_per_block: get(Attr::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
            max_block: (
                get(Attr::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X)?,
                get(Attr::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y)?,
                get(Attr::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z)?,
            ),
            max_grid: (
                get(Attr::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X)?,
                get(Attr::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y)?,
                get(Attr::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z)?,
            ),
            max_shared_mem_optin: get(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
        })
    }

    /// `Ok` when `cfg` fits the device, else which limit it breaks.
    #[inline]
    pub fn check(&self, cfg: &LaunchConfig) -> Result<(), String> {
        let (g, b) = (cfg.grid, cfg.block);
        if g.0 == 0 || g.1 == 0 || g.2 == 0 {
            return Err(format!("grid {g:?} has a zero dimension"));
        }
        if b.0 == 0 || b.1 == 0 || b.2 == 0 {
            return Err(format!("block {b:?} has a zero dimension"));
        }
        let (mb, mg) = (self.max_block, self.max_grid);
        if b.0 > mb.0 || b.1 > mb.1 || b.2 > mb.2 {
            return Err(format!(
                "block {b:?} exceeds the device's largest block dimensions {mb:?}"
            ));
        }
        let threads = u64::from(b.0) * u64::from(b.1) * u64::from(b.2);
        if threads > u64::from(self.max_threads_per_block) {
            return Err(format!(
                "block {b:?} has {threads} threads, more than the device's {} threads per block",
                self.max_threads_per_block
            ));
        }
        if g.0 > mg.0 || g.1 > mg.1 || g.2 > mg.2 {
            return Err(format!(
                "grid {g:?} exceeds the device's largest grid dimensions {mg:?}"
            ));
        }
        if cfg.shared_mem_bytes > self.max_shared_mem_optin {
            return Err(format!(
                "{} B of dynamic shared memory exceeds the device's maximum of {} B per block (with opt-in)",
                cfg.shared_mem_bytes, self.max_shared_mem_optin
            ));
        }
        Ok(())
    }
}

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
    #[inline]
    pub(crate) fn ensure(&self, host: &CudaHost, func: CUfunction, bytes: u32) -> Result<()> {
        if bytes == 0 || bytes <= self.allowed.load(Ordering::Acquire) {
            return Ok(());
        }
        self.raise(host, func, bytes)
    }

    #[cold]
    fn raise(&self, host: &CudaHost, func: CUfunction, bytes: u32) -> Result<()> {
        let _serial = RAISING.lock().unwrap_or_else(PoisonError::into_inner);
        if bytes <= self.allowed.load(Ordering::Acquire) {
            return Ok(()); // raised by another thread meanwhile
        }
        ensure_bound(host.context().raw())?;
        let attribute = CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
        let mut current = 0;
        // SAFETY: `func` is a live function of the current context; `current` is a live out-pointer.
        unsafe {
            cu!(cuFuncGetAttribute(&mut current, attribute, func); "dynamic shared memory limit")
        }?;
        let mut allowed = u32::try_from(current).unwrap_or(0);
        if bytes > allowed {
            // SAFETY: as above; `bytes` was checked against the device's opt-in maximum, which fits
            // an i32, and it is more than the current limit, so this only raises it.
            unsafe {
                cu!(cuFuncSetAttribute(func, attribute, bytes as i32); "opt in to {bytes} B of dynamic shared memory")
            }?;
            allowed = bytes;
        }
        self.allowed.store(allowed, Ordering::Release);
        Ok(())
    }
}

/// What a launch error names the function by.
pub(crate) trait FunctionName {
    fn function_name(&self) -> String;
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
        Err(reason) => Err(AtlasError::InvalidLaunch {
            function: name.function_name(),
            reason,
        }),
    }
}

/// The launch: makes the shared memory opt-in when needed and calls `cuLaunchKernel` once. A
/// created stream names its context, so nothing else reaches the driver; only for the legacy
/// default stream (null), which means "the current context's", is `host`'s context made current
/// first. No allocation unless it fails.
///
/// # Safety
///
/// 1. `func` is a live function of `host`'s context, and `stream` a live stream of that context or
///    null.
/// 2. `params` points to one pointer per kernel parameter, each to a value of that parameter's
///    type (or is null for a kernel without parameters).
/// 3. `cfg` fits the device (checked by [`check_config`]).
/// 4. What the kernel reads and writes through its arguments is valid memory of `host`'s device that
///    stays allocated until the kernel has run.
#[inline]
pub(crate) unsafe fn launch_kernel(
    host: &CudaHost,
    func: CUfunction,
    opt_in: &SharedMemOptIn,
    name: &dyn FunctionName,
    cfg: &LaunchConfig,
    stream: CUstream,
    params: *mut *mut c_void,
) -> Result<()> {
    let d = driver()?;
    if stream.is_null() {
        ensure_bound(host.context().raw())?;
    }
    opt_in.ensure(host, func, cfg.shared_mem_bytes)?;
    let (g, b) = (cfg.grid, cfg.block);
    // SAFETY: the caller's duties 1–4; for the legacy default stream the function's context is
    // current (above).
    let status = unsafe {
        (d.launch_kernel)(
            func,
            g.0,
            g.1,
            g.2,
            b.0,
            b.1,
            b.2,
            cfg.shared_mem_bytes,
            stream,
            params,
            std::ptr::null_mut(),
        )
    };
    if status == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(launch_error(name, cfg, status))
    }
}

#[cold]
fn launch_error(name: &dyn FunctionName, cfg: &LaunchConfig, status: CUresult) -> AtlasError {
    let code = status.0;
    if crate::error::is_sticky(code) {
        return AtlasError::from_call(
            "cuLaunchKernel",
            format!("launching `{}`", name.function_name()),
            code,
        );
    }
    AtlasError::Launch {
        function: name.function_name(),
        grid: cfg.grid,
        block: cfg.block,
        shared_mem: cfg.shared_mem_bytes,
        code,
        text: cuda_error_text(code),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h200() -> DeviceLimits {
        DeviceLimits {
            max_threads_per_block: 1024,
            max_block: (1024, 1024, 64),
            max_grid: (i32::MAX as u32, 65535, 65535),
            max_shared_mem_optin: 232_448,
        }
    }

    #[test]
    fn for_elements_covers_n() {
        assert_eq!(LaunchConfig::for_elements(1000, 256).grid, (4, 1, 1));
        assert_eq!(LaunchConfig::for_elements(1024, 256).grid, (4, 1, 1));
        assert_eq!(LaunchConfig::for_elements(0, 256).grid, (1, 1, 1));
        assert_eq!(LaunchConfig::for_elements(5, 0).block, (1, 1, 1));
    }

    #[test]
    fn limits_name_the_limit_broken() {
        let l = h200();
        let ok = LaunchConfig::for_elements(1 << 20, 256);
        assert!(l.check(&ok).is_ok());
        assert!(
            l.check(&LaunchConfig {
                block: (2048, 1, 1),
                ..ok
            })
            .unwrap_err()
            .contains("largest block")
        );
        assert!(
            l.check(&LaunchConfig {
                block: (32, 32, 2),
                ..ok
            })
            .unwrap_err()
            .contains("2048 threads")
        );
        assert!(
            l.check(&LaunchConfig {
                grid: (0, 1, 1),
                ..ok
            })
            .unwrap_err()
            .contains("zero")
        );
        assert!(
            l.check(&LaunchConfig {
                block: (1, 0, 1),
                ..ok
            })
            .unwrap_err()
            .contains("zero")
        );
        assert!(
            l.check(&LaunchConfig {
                grid: (1, 70000, 1),
                ..ok
            })
            .unwrap_err()
            .contains("grid")
        );
        let big = ok.with_shared_mem(232_449);
        assert!(l.check(&big).unwrap_err().contains("232449 B"));
        assert!(l.check(&ok.with_shared_mem(96 * 1024)).is_ok());
    }
}
