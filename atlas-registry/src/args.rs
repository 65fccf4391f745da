//! Typed kernel arguments: [`KernelParam`] for one argument, [`KernelArgs`] for a tuple of them.
//!
//! A launch builds its parameter array on the stack from the tuple, with no allocation; the
//! sizes are compile-time constants, compared with the kernel's real layout before the launch.

use std::ffi::c_void;

use atlas_sys::CUdeviceptr;

use crate::memory::{DeviceBuffer, DeviceCopy};

/// One kernel argument: where its bytes are, and how many.
///
/// # Safety
///
/// `param_ptr` must point to `SIZE` readable bytes that stay valid while `self` is borrowed.
pub unsafe trait KernelParam {
    /// The argument's size in bytes, as the kernel's parameter must have it.
    const SIZE: usize;
    /// A pointer to the argument's bytes.
    fn param_ptr(&self) -> *mut c_void;
}

// SAFETY: a DeviceCopy value is SIZE plain bytes at its own address.
unsafe impl<T: DeviceCopy> KernelParam for T {
    const SIZE: usize = size_of::<T>();
    #[inline]
    fn param_ptr(&self) -> *mut c_void {
        (self as *const T).cast_mut().cast()
    }
}

// SAFETY: the parameter is the buffer's device address, stored in the buffer itself, which the
// reference keeps alive.
unsafe impl<T: DeviceCopy> KernelParam for &DeviceBuffer<T> {
    const SIZE: usize = size_of::<CUdeviceptr>();
    #[inline]
    fn param_ptr(&self) -> *mut c_void {
        (self.device_ptr_slot() as *const CUdeviceptr)
            .cast_mut()
            .cast()
    }
}

// SAFETY: as for &DeviceBuffer.
unsafe impl<T: DeviceCopy> KernelParam for &mut DeviceBuffer<T> {
    const SIZE: usize = size_of::<CUdeviceptr>();
    #[inline]
    fn param_ptr(&self) -> *mut c_void {
        (self.device_ptr_slot() as *const CUdeviceptr)
            .cast_mut()
            .cast()
    }
}

/// The arguments of one launch: a tuple of [`KernelParam`]s (up to 12), or `()`.
pub trait KernelArgs {
    /// The size in bytes of each argument, in order.
    const SIZES: &'static [usize];
    /// Calls `f` with the launch's parameter array (one pointer per argument), valid during the call.
    fn with_params<R>(&self, f: impl FnOnce(*mut *mut c_void) -> R) -> R;
}

impl KernelArgs for () {
    const SIZES: &'static [usize] = &[];
    #[inline]
    fn with_params<R>(&self, f: impl FnOnce(*mut *mut c_void) -> R) -> R {
        f(std::ptr::null_mut())
    }
}

macro_rules! tuple_args {
    ($($name:ident $idx:tt),+) => {
        impl<$($name: KernelParam),+> KernelArgs for ($($name,)+) {
            const SIZES: &'static [usize] = &[$($name::SIZE),+];
            #[inline]
            fn with_params<R>(&self, f: impl FnOnce(*mut *mut c_void) -> R) -> R {
                let mut params = [$(self.$idx.param_ptr()),+];
                f(params.as_mut_ptr())
            }
        }
    };
}
tuple_args!(A 0);
tuple_args!(A 0, B 1);
tuple_args!(A 0, B 1, C 2);
tuple_args!(A 0, B 1, C 2, D 3);
tuple_args!(A 0, B 1, C 2, D 3, E 4);
tuple_args!(A 0, B 1, C 2, D 3, E 4, F 5);
tuple_args!(A 0, B 1, C 2, D 3, E 4, F 5, G 6);
tuple_args!(A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7);
tuple_args!(A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8);
tuple_args!(A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9);
tuple_args!(A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9, K 10);
tuple_args!(A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9, K 10, L 11);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_pointers_follow_the_tuple() {
        let args = (1.5f32, 7u32, 9u64, 3u8);
        assert_eq!(<(f32, u32, u64, u8)>::SIZES, &[4, 4, 8, 1]);
        args.with_params(|params| {
            // SAFETY: four parameters, each pointing at the tuple's own field.
            unsafe {
                assert_eq!(*(*params.add(0)).cast::<f32>(), 1.5);
                assert_eq!(*(*params.add(1)).cast::<u32>(), 7);
                assert_eq!(*(*params.add(2)).cast::<u64>(), 9);
                assert_eq!(*(*params.add(3)).cast::<u8>(), 3);
            }
        });
        assert!(<()>::SIZES.is_empty());
    }
}
