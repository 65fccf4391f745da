//! Large kernel parameters: arguments that take more than the 4,096 bytes a kernel was limited to
//! before CUDA 12.1, up to 32,764 bytes in all (a struct of weights or tile descriptors passed by
//! value, as attention and GEMM kernels take them).
//!
//! What it takes: a driver of CUDA 12.1 or newer, a device of compute capability 7.0 or newer, and
//! a kernel built for it (by a CUDA 12.1+ compiler: NVRTC and nvcc 12.0 refuse such a kernel,
//! "Formal parameter space overflowed"). Nothing else in the blob marks such a kernel: its cubin
//! describes its parameters with `EIATTR_KPARAM_INFO_V2` records where they take more than 4,352
//! bytes, and its constant bank holds them; a kernel whose parameters take 4,096 bytes or less is
//! one built for the old limit, and it takes no more. A typed launch is checked for all of it
//! before the driver is called, and refused with a [`LargeParamsRefusal`]; the arguments are then
//! checked against the kernel's layout as any others are.
//!
//! The check costs nothing for launches of 4,096 bytes or less: the size of a launch's arguments
//! is a constant of its argument types ([`KernelArgs::BYTES`](crate::KernelArgs::BYTES)).

use crate::device::host::CudaHost;
use crate::driver::calls;
use crate::error::{LargeParamsRefusal, Result};

/// The most bytes of parameters a kernel may take (CUDA 12.1+, compute capability 7.0+).
///
/// # Examples
///
/// ```no_run
/// use atlas_registry::{DeviceCopy, KernelArgs, MAX_PARAM_BYTES};
/// /// The descriptors a kernel takes by value (`const __grid_constant__ Tiles tiles`).
/// #[derive(Clone, Copy)]
/// #[repr(C)]
/// struct Tiles {
///     offsets: [u32; 4000],
///     scales: [f32; 4000],
/// }
/// // SAFETY: two arrays of plain numbers: no padding, every bit pattern valid.
/// unsafe impl DeviceCopy for Tiles {}
/// // With the output pointer and a count after it: within the limit, checked at compile time.
/// const _: () = assert!(<(Tiles, u64, u32)>::BYTES <= MAX_PARAM_BYTES);
/// ```
pub const MAX_PARAM_BYTES: usize = 32_764;

/// The most bytes of parameters a kernel took before CUDA 12.1, and takes still on an older
/// driver or device; past it, arguments are large parameters.
pub const CLASSIC_PARAM_BYTES: usize = 4_096;

/// The oldest CUDA release whose driver launches kernels with large parameters.
pub(crate) const LARGE_PARAMS_CUDA: (u32, u32) = (12, 1);

/// The oldest compute capability that runs kernels with large parameters.
pub(crate) const LARGE_PARAMS_DEVICE: (u32, u32) = (7, 0);

/// `Ok` when arguments of `bytes` (more than [`CLASSIC_PARAM_BYTES`]) can be given to a kernel on
/// `host`'s device: no more than [`MAX_PARAM_BYTES`], a driver and a device that take them. The
/// driver's version is asked once per process.
#[cold]
#[inline(never)]
pub(crate) fn check_device(host: &CudaHost, bytes: usize) -> Result<Option<LargeParamsRefusal>> {
    if bytes > MAX_PARAM_BYTES {
        return Ok(Some(LargeParamsRefusal::TooLarge {
            bytes,
            max: MAX_PARAM_BYTES,
        }));
    }
    let driver = calls::cuda_version()?;
    if driver < LARGE_PARAMS_CUDA {
        return Ok(Some(LargeParamsRefusal::DriverTooOld { bytes, driver }));
    }
    let compute_capability = host.compute_capability();
    if compute_capability < LARGE_PARAMS_DEVICE {
        return Ok(Some(LargeParamsRefusal::DeviceTooOld {
            bytes,
            compute_capability,
        }));
    }
    Ok(None)
}

/// The refusal of arguments of sizes `given` for a kernel whose parameters have sizes `expected`,
/// when the arguments are large parameters and the kernel's take no more than the old limit: it
/// was not built for them. `None` otherwise (other mismatches are the layout's to report).
pub(crate) fn kernel_limit(expected: &[usize], given: &[usize]) -> Option<LargeParamsRefusal> {
    let bytes = total(given);
    let kernel_bytes = total(expected);
    (bytes > CLASSIC_PARAM_BYTES && kernel_bytes <= CLASSIC_PARAM_BYTES).then_some(
        LargeParamsRefusal::KernelLimit {
            bytes,
            kernel_bytes,
        },
    )
}

/// The bytes `sizes` take together (saturating: no sum of real sizes comes near it).
pub(crate) const fn total(sizes: &[usize]) -> usize {
    let mut sum = 0usize;
    let mut i = 0;
    while i < sizes.len() {
        sum = sum.saturating_add(sizes[i]);
        i += 1;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_built_for_the_old_limit_refuses_large_arguments() {
        assert_eq!(
            kernel_limit(&[8, 4, 4], &[8192, 8, 4]),
            Some(LargeParamsRefusal::KernelLimit {
                bytes: 8204,
                kernel_bytes: 16
            })
        );
        // At the old limit, the arguments are not large; past it, the kernel's are.
        assert_eq!(kernel_limit(&[8], &[4096]), None);
        assert_eq!(kernel_limit(&[4097], &[8192]), None);
        assert_eq!(
            kernel_limit(&[4096], &[4097]),
            Some(LargeParamsRefusal::KernelLimit {
                bytes: 4097,
                kernel_bytes: 4096
            })
        );
    }

    #[test]
    fn totals_saturate() {
        assert_eq!(total(&[]), 0);
        assert_eq!(total(&[8192, 8, 4]), 8204);
        assert_eq!(total(&[usize::MAX, 8]), usize::MAX);
    }

    #[test]
    fn refusals_say_what_to_change() {
        let text = LargeParamsRefusal::DriverTooOld {
            bytes: 8204,
            driver: (12, 0),
        }
        .to_string();
        assert!(
            text.contains("8204") && text.contains("12.1") && text.contains("12.0"),
            "{text}"
        );
        let text = LargeParamsRefusal::DeviceTooOld {
            bytes: 8204,
            compute_capability: (6, 1),
        }
        .to_string();
        assert!(text.contains("7.0") && text.contains("6.1"), "{text}");
        let text = LargeParamsRefusal::TooLarge {
            bytes: 40_000,
            max: MAX_PARAM_BYTES,
        }
        .to_string();
        assert!(text.contains("40000") && text.contains("32764"), "{text}");
        let text = LargeParamsRefusal::KernelLimit {
            bytes: 8204,
            kernel_bytes: 16,
        }
        .to_string();
        assert!(text.contains("16") && text.contains("4096"), "{text}");
    }
}
