//! Typed kernel arguments: [`KernelParam`] for one argument, [`KernelArgs`] for a tuple of them.
//!
//! A launch builds its parameter array on the stack from the tuple, with no allocation; the
//! sizes are compile-time constants, compared with the kernel's real layout before the launch.
//!
//! Both traits are part of what a typed launch trusts, so neither can be implemented by safe code:
//! [`KernelParam`] is an `unsafe trait`, and [`KernelArgs`] is implemented by Atlas alone, for
//! tuples of parameters.
//!
//! ```compile_fail
//! // A safe implementation of KernelParam does not compile: it must be an `unsafe impl`.
//! struct Lying;
//! impl atlas_registry::KernelParam for Lying {
//!     const SIZE: usize = 64;
//!     fn param_ptr(&self) -> *mut std::ffi::c_void {
//!         std::ptr::null_mut()
//!     }
//! }
//! ```
//!
//! A buffer is passed by reference, `&buf` when the kernel reads it and `&mut buf` when it writes
//! it; by value it is not an argument (the compiler says to pass `&buf` or `&mut buf`):
//!
//! ```compile_fail
//! # fn f(scale: &atlas_registry::CudaFunction, stream: &atlas_registry::CudaStream,
//! #      x: atlas_registry::DeviceBuffer<f32>) -> atlas_registry::Result<()> {
//! let cfg = atlas_registry::LaunchConfig::for_elements(1000, 256);
//! // SAFETY: never compiled.
//! unsafe { scale.launch(stream, &cfg, (x, 2.0f32, 1000u32)) }
//! # }
//! ```
//!
//! ```compile_fail
//! // KernelArgs is sealed: no type outside Atlas can claim a parameter layout.
//! struct Lying;
//! impl atlas_registry::KernelArgs for Lying {
//!     const SIZES: &'static [usize] = &[8, 8, 8];
//!     const ALIGNS: &'static [usize] = &[1, 1, 1];
//!     const ALIGNED: bool = false;
//!     fn with_params<R>(&self, f: impl FnOnce(*mut *mut std::ffi::c_void) -> R) -> R {
//!         f(std::ptr::null_mut())
//!     }
//!     fn foreign_memory(
//!         &self,
//!         _: atlas_registry::sys::CUcontext,
//!     ) -> Option<(usize, atlas_registry::sys::CUcontext)> {
//!         None
//!     }
//!     fn hold_for_graph(&self, _: &mut atlas_registry::GraphHolds) {}
//! }
//! ```

use std::ffi::c_void;

use atlas_sys::{CUcontext, CUdeviceptr};

use crate::code::layout::PtxParam;
use crate::flight_recorder::{ArgumentWords, VALUES, read_value};
use crate::launch::held::GraphHolds;
use crate::launch::large_params::total;
use crate::memory::buffer::{DeviceBuffer, DeviceCopy};
use crate::memory::view::{DeviceSlice, DeviceSliceMut};
use crate::memory::virtual_memory::GrowableBuffer;

/// One kernel argument: where its bytes are, how many, and which context's memory it refers to.
///
/// Implemented for every [`DeviceCopy`] value (passed by value), for `&DeviceBuffer<T>` and
/// `&mut DeviceBuffer<T>` (passed as the buffer's device address), for `&GrowableBuffer<T>` and
/// `&mut GrowableBuffer<T>` (likewise), and for views of part of a buffer: [`DeviceSlice`] (by
/// value or `&view`) and [`DeviceSliceMut`] (by value, `&mut view`, or `&view` to read it), passed
/// as the view's first element's address; and for `&`[`TensorMap`](crate::TensorMap), a TMA
/// descriptor passed by value (its 128 bytes, for a `const __grid_constant__ CUtensorMap`
/// parameter).
///
/// # Safety
///
/// 1. `param_ptr` returns a pointer to `SIZE` readable bytes that stay valid and unchanged while
///    `self` is borrowed.
/// 2. When the argument is the address of device memory, `memory_context` returns the context that
///    memory was allocated in (a launch refuses memory of another context); `None` only for values
///    that are not addresses of device memory Atlas can attribute.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a kernel argument: pass a `DeviceBuffer` as `&buf` (read) or `&mut buf` (written), a view (`DeviceSlice`, `DeviceSliceMut`) by value, a scalar by value"
)]
pub unsafe trait KernelParam {
    /// The argument's size in bytes, as the kernel's parameter must have it.
    const SIZE: usize;
    /// The alignment the kernel's parameter must have where the kernel reads it (in the constant
    /// bank) for the argument to work there: 64 for a [`TensorMap`](crate::TensorMap), which the
    /// Tensor Memory Accelerator reads in place; 1 (the default) for every argument the kernel
    /// only reads as a value, whatever its type's alignment (the driver copies parameters byte for
    /// byte). A launch checks it against the kernel's layout where it is above 1.
    const ALIGN: usize = 1;
    /// A pointer to the argument's bytes.
    fn param_ptr(&self) -> *mut c_void;
    /// The context of the device memory this argument is the address of, or `None` for a plain
    /// value.
    #[inline]
    fn memory_context(&self) -> Option<CUcontext> {
        None
    }
    /// For a launch captured into a graph, adds what the graph must keep alive for this argument
    /// to `holds`: the memory of a [`DeviceBuffer`], or of the buffer a view is of
    /// ([`GraphHolds::buffer`]); nothing for a plain
    /// value (the default). Called only while a capture Atlas began takes the launch in. A type
    /// that wraps a buffer hands it over here; memory it does not hand over stays the caller's to
    /// keep allocated while the graph may be replayed.
    #[inline]
    fn hold_for_graph(&self, holds: &mut GraphHolds) {
        let _ = holds;
    }
}

// SAFETY: a DeviceCopy value is SIZE plain bytes at its own address (duty 1); it is not an address
// Atlas can attribute to a context (duty 2).
unsafe impl<T: DeviceCopy> KernelParam for T {
    const SIZE: usize = size_of::<T>();
    #[inline]
    fn param_ptr(&self) -> *mut c_void {
        (self as *const T).cast_mut().cast()
    }
}

// SAFETY: the parameter is the buffer's device address, stored in the buffer itself, which the
// reference keeps alive and unchanged (duty 1); the buffer knows the context it was allocated in
// (duty 2).
unsafe impl<T: DeviceCopy> KernelParam for &DeviceBuffer<T> {
    const SIZE: usize = size_of::<CUdeviceptr>();
    #[inline]
    fn param_ptr(&self) -> *mut c_void {
        (self.device_ptr_slot() as *const CUdeviceptr)
            .cast_mut()
            .cast()
    }
    #[inline]
    fn memory_context(&self) -> Option<CUcontext> {
        Some(self.context_raw())
    }
    #[inline]
    fn hold_for_graph(&self, holds: &mut GraphHolds) {
        holds.buffer(self);
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
    #[inline]
    fn memory_context(&self) -> Option<CUcontext> {
        Some(self.context_raw())
    }
    #[inline]
    fn hold_for_graph(&self, holds: &mut GraphHolds) {
        holds.buffer(self);
    }
}

/// `KernelParam` for a growable buffer, taken as its inner buffer is: the inner buffer is replaced
/// only through `&mut GrowableBuffer` (its growth and shrinking), so the address it stores stays
/// valid and unchanged while the argument borrows the growable buffer (duty 1); it is memory of
/// the buffer's context (duty 2); a captured launch keeps the chunks mapped at the time.
macro_rules! growable_param {
    ($($buffer:ty),*) => {$(
        // SAFETY: see the macro's comment.
        unsafe impl<T: DeviceCopy> KernelParam for $buffer {
            const SIZE: usize = size_of::<CUdeviceptr>();
            #[inline]
            fn param_ptr(&self) -> *mut c_void {
                (self.buffer().device_ptr_slot() as *const CUdeviceptr)
                    .cast_mut()
                    .cast()
            }
            #[inline]
            fn memory_context(&self) -> Option<CUcontext> {
                Some(self.buffer().context_raw())
            }
            #[inline]
            fn hold_for_graph(&self, holds: &mut GraphHolds) {
                holds.buffer(self.buffer());
            }
        }
    )*};
}
growable_param!(&GrowableBuffer<T>, &mut GrowableBuffer<T>);

/// `KernelParam` for views, taken as the view's first element's address: the address is stored
/// in the view itself, which the argument keeps alive and unchanged while borrowed (duty 1); the
/// view's buffer knows the context its memory was allocated in (duty 2); a captured launch keeps
/// the buffer's whole allocation.
macro_rules! view_param {
    ($($view:ty),*) => {$(
        // SAFETY: see the macro's comment.
        unsafe impl<T: DeviceCopy> KernelParam for $view {
            const SIZE: usize = size_of::<CUdeviceptr>();
            #[inline]
            fn param_ptr(&self) -> *mut c_void {
                (self.device_ptr_slot() as *const CUdeviceptr)
                    .cast_mut()
                    .cast()
            }
            #[inline]
            fn memory_context(&self) -> Option<CUcontext> {
                Some(self.context())
            }
            #[inline]
            fn hold_for_graph(&self, holds: &mut GraphHolds) {
                holds.buffer(self.buffer());
            }
        }
    )*};
}
view_param!(
    DeviceSlice<'_, T>,
    &DeviceSlice<'_, T>,
    DeviceSliceMut<'_, T>,
    &DeviceSliceMut<'_, T>,
    &mut DeviceSliceMut<'_, T>
);

mod sealed {
    use crate::flight_recorder::ArgumentWords;

    /// Implemented only for the tuples of [`KernelParam`](super::KernelParam)s below.
    pub trait Sealed {
        /// What the flight recorder keeps of these arguments: their sizes packed at compile
        /// time, and the values of the first few, each read with its type's width.
        fn argument_words(&self) -> ArgumentWords;
        /// Whether every argument's device memory is `context`'s: `foreign_memory` is `None`,
        /// every comparison made at once without a branch.
        fn all_in(&self, context: atlas_sys::CUcontext) -> bool;
    }
}

/// What a launch hands the flight recorder to make its arguments' words from, when it records.
pub(crate) use sealed::Sealed as ArgumentSummary;

/// The arguments of one launch: a tuple of [`KernelParam`]s (up to 12), or `()`.
///
/// Sealed: Atlas implements it for tuples only, so the sizes a launch is checked against are always
/// those of the values actually passed.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a launch's arguments: pass a tuple of kernel arguments, `(&mut buf, 2.0f32, n)`, `(&buf,)` for one, `()` for none"
)]
pub trait KernelArgs: sealed::Sealed {
    /// The size in bytes of each argument, in order.
    const SIZES: &'static [usize];
    /// The bytes the arguments take together: past
    /// [`CLASSIC_PARAM_BYTES`](crate::CLASSIC_PARAM_BYTES) (4,096), they are large parameters,
    /// which a launch checks the driver, the device and the kernel for.
    const BYTES: usize = total(Self::SIZES);
    /// The alignment each argument needs its parameter to have ([`KernelParam::ALIGN`]), in
    /// order.
    const ALIGNS: &'static [usize];
    /// Whether any argument needs an aligned parameter (one of [`ALIGNS`](Self::ALIGNS) is above
    /// 1): only then does a launch check the parameters' places.
    const ALIGNED: bool;
    /// Calls `f` with the launch's parameter array (one pointer per argument), valid during the call.
    fn with_params<R>(&self, f: impl FnOnce(*mut *mut c_void) -> R) -> R;
    /// The first argument whose device memory belongs to another context than `context`, with
    /// that context; `None` when every buffer argument is `context`'s.
    fn foreign_memory(&self, context: CUcontext) -> Option<(usize, CUcontext)>;
    /// What a graph that captures the launch keeps alive for the arguments (see
    /// [`KernelParam::hold_for_graph`]).
    fn hold_for_graph(&self, holds: &mut GraphHolds);
    /// The Rust type of argument `index` as [`std::any::type_name`] writes it, `None` past the
    /// last: what a refused launch names.
    fn type_name(index: usize) -> Option<&'static str>;
}

impl sealed::Sealed for () {
    #[inline]
    fn argument_words(&self) -> ArgumentWords {
        ArgumentWords::default()
    }
    #[inline]
    fn all_in(&self, _: CUcontext) -> bool {
        true
    }
}

impl KernelArgs for () {
    const SIZES: &'static [usize] = &[];
    const ALIGNS: &'static [usize] = &[];
    const ALIGNED: bool = false;
    #[inline]
    fn with_params<R>(&self, f: impl FnOnce(*mut *mut c_void) -> R) -> R {
        f(std::ptr::null_mut())
    }
    #[inline]
    fn foreign_memory(&self, _: CUcontext) -> Option<(usize, CUcontext)> {
        None
    }
    #[inline]
    fn hold_for_graph(&self, _: &mut GraphHolds) {}
    fn type_name(_: usize) -> Option<&'static str> {
        None
    }
}

/// What Rust argument fits a parameter of `size` bytes, in words: "a `u32`", "an `f32`", "a
/// `u64`, or a buffer (`&buf`, `&mut buf`) or a view", "a `#[repr(C)]` value of 24 bytes"; the
/// PTX type decides where the kernel's code `declared` it, the size alone otherwise.
pub(crate) fn fits(size: usize, declared: Option<&PtxParam>) -> String {
    let declared = declared.map(|d| (d.ty(), d.elements(), d.is_pointer()));
    let scalar = match declared {
        Some((ty, 1, pointer)) => match ty {
            ".u8" => "a `u8`",
            ".s8" => "an `i8`",
            ".u16" => "a `u16`",
            ".s16" => "an `i16`",
            ".f16" | ".bf16" => "a half-precision float (its bits as a `u16`)",
            ".u32" => "a `u32`",
            ".s32" => "an `i32`",
            ".f32" => "an `f32`",
            ".f16x2" | ".bf16x2" => "two half-precision floats (their bits as a `u32`)",
            ".u64" | ".b64" if pointer => "a buffer (`&buf`, `&mut buf`) or a view",
            ".u64" => "a `u64`, or a buffer (`&buf`, `&mut buf`) or a view",
            ".s64" => "an `i64`",
            ".f64" => "an `f64`",
            _ => "",
        },
        _ => "",
    };
    if !scalar.is_empty() {
        return scalar.to_owned();
    }
    match (declared, size) {
        (Some((".b8", n, _)), _) if n > 1 => {
            format!("a `#[repr(C)]` value of {n} bytes (a struct, or `[u8; {n}]`)")
        }
        (Some((ty, n, _)), _) if n > 1 => {
            format!("`[T; {n}]` of `{ty}` elements ({size} bytes)")
        }
        (_, 1) => "a `u8` or `i8`".to_owned(),
        (_, 2) => "a `u16` or `i16`".to_owned(),
        (_, 4) => "a `u32`, `i32` or `f32`".to_owned(),
        (_, 8) => "a `u64`, `i64` or `f64`, or a buffer (`&buf`, `&mut buf`) or a view".to_owned(),
        (_, n) => format!("a `#[repr(C)]` value of {n} bytes"),
    }
}

macro_rules! tuple_args {
    ($($name:ident $idx:tt),+) => {
        impl<$($name: KernelParam),+> sealed::Sealed for ($($name,)+) {
            #[inline]
            fn argument_words(&self) -> ArgumentWords {
                let mut values = [0u64; VALUES];
                $(
                    if let Some(value) = values.get_mut($idx) {
                        // SAFETY: KernelParam's duty 1: the pointer leads to the argument's
                        // SIZE bytes, which `self` keeps alive during the call.
                        *value = unsafe { read_value(self.$idx.param_ptr(), $name::SIZE) };
                    }
                )+
                ArgumentWords {
                    sizes: const { ArgumentWords::pack(&[$($name::SIZE),+]) },
                    values,
                }
            }
            #[inline]
            fn all_in(&self, context: CUcontext) -> bool {
                true $(& self.$idx.memory_context().is_none_or(|other| other == context))+
            }
        }

        impl<$($name: KernelParam),+> KernelArgs for ($($name,)+) {
            const SIZES: &'static [usize] = &[$($name::SIZE),+];
            const ALIGNS: &'static [usize] = &[$($name::ALIGN),+];
            const ALIGNED: bool = $($name::ALIGN > 1)||+;
            fn type_name(index: usize) -> Option<&'static str> {
                [$(std::any::type_name::<$name>()),+].get(index).copied()
            }
            #[inline]
            fn with_params<R>(&self, f: impl FnOnce(*mut *mut c_void) -> R) -> R {
                let mut params = [$(self.$idx.param_ptr()),+];
                f(params.as_mut_ptr())
            }
            #[inline]
            fn foreign_memory(&self, context: CUcontext) -> Option<(usize, CUcontext)> {
                $(
                    if let Some(other) = self.$idx.memory_context()
                        && other != context
                    {
                        return Some(($idx, other));
                    }
                )+
                None
            }
            #[inline]
            fn hold_for_graph(&self, holds: &mut GraphHolds) {
                $(self.$idx.hold_for_graph(holds);)+
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
    fn typed_arguments_make_the_words_a_record_keeps() {
        let args = (
            0xabu8,
            0x1234u16,
            [7u8; 16],
            0x0102_0304_0506_0708u64,
            2.5f32,
            9u32,
            1u8,
            2u16,
            3u32,
        );
        let words = sealed::Sealed::argument_words(&args);
        // The first 8 sizes, 16 bits each; the ninth is left out.
        assert_eq!(words.sizes, ArgumentWords::pack(&[1, 2, 16, 8, 4, 4, 1, 2]));
        assert_eq!(
            words.sizes,
            [
                1 | 2 << 16 | 16 << 32 | 8 << 48,
                4 | 4 << 16 | 1 << 32 | 2 << 48
            ]
        );
        // The first 5 values, each as wide as its type; 0 for the 16-byte array.
        assert_eq!(
            words.values,
            [
                0xab,
                0x1234,
                0,
                0x0102_0304_0506_0708,
                u64::from(2.5f32.to_bits())
            ]
        );
        assert_eq!(
            ArgumentWords::pack(&[70_000]),
            [0xffff, 0],
            "sizes are capped"
        );
        let none = sealed::Sealed::argument_words(&());
        assert_eq!((none.sizes, none.values), ([0; 2], [0; 5]));
    }

    /// `scal(float* x, float a, unsigned n, Extra extra)` as a PTX text declares it, with names
    /// of its own for the last three.
    fn scal_declared() -> Vec<PtxParam> {
        let ptx = b".version 8.0\n.target sm_80\n.address_size 64\n\
            .visible .entry _Z4scalPffj(.param .u64 _Z4scalPffj_param_0, .param .f32 a, \
            .param .u32 n, .param .align 8 .b8 extra[24], .param .u64 .ptr .global y)\n\
            { ret; }\n";
        let mut kernels = crate::ptx_kernel_layouts(ptx).unwrap();
        kernels.pop().unwrap().declared
    }

    #[test]
    fn what_fits_a_parameter_follows_its_ptx_type_or_else_its_size() {
        let declared = scal_declared();
        assert_eq!(declared[0].name(), None, "nvcc's own names say nothing");
        assert_eq!(declared[2].name(), Some("n"));
        assert_eq!(declared[3].to_string(), ".b8[24]");
        assert_eq!(declared[4].to_string(), ".u64 .ptr");
        let fit = |size, index: usize| fits(size, Some(&declared[index]));
        assert_eq!(
            fit(8, 0),
            "a `u64`, or a buffer (`&buf`, `&mut buf`) or a view"
        );
        assert_eq!(fit(4, 1), "an `f32`");
        assert_eq!(fit(4, 2), "a `u32`");
        assert_eq!(
            fit(24, 3),
            "a `#[repr(C)]` value of 24 bytes (a struct, or `[u8; 24]`)"
        );
        assert_eq!(fit(8, 4), "a buffer (`&buf`, `&mut buf`) or a view");
        assert_eq!(fits(4, None), "a `u32`, `i32` or `f32`");
        assert_eq!(fits(128, None), "a `#[repr(C)]` value of 128 bytes");
    }

    #[test]
    fn sizes_and_pointers_follow_the_tuple() {
        let args = (1.5f32, 7u32, 9u64, 3u8);
        assert_eq!(<(f32, u32, u64, u8)>::SIZES, &[4, 4, 8, 1]);
        assert_eq!(<(f32, u32, u64, u8)>::BYTES, 17);
        assert_eq!(<([u32; 2048], u64, u32)>::BYTES, 8204);
        assert_eq!(<()>::BYTES, 0);
        // Values need no aligned parameter, whatever their type's alignment.
        assert_eq!(<(f32, u32, u64, u8)>::ALIGNS, &[1, 1, 1, 1]);
        const { assert!(!<(f32, u32, u64, u8)>::ALIGNED && !<()>::ALIGNED) };
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

    /// A parameter standing for device memory of a given context, without a driver.
    struct InContext(u64, usize);

    // SAFETY: the parameter is the struct's own first field, 8 bytes (duty 1); the context it
    // reports is the one the test says it is in (duty 2).
    unsafe impl KernelParam for InContext {
        const SIZE: usize = 8;
        fn param_ptr(&self) -> *mut c_void {
            (&self.0 as *const u64).cast_mut().cast()
        }
        fn memory_context(&self) -> Option<CUcontext> {
            Some(std::ptr::without_provenance_mut(self.1))
        }
    }

    #[test]
    fn foreign_memory_names_the_first_argument_of_another_context() {
        let ours: CUcontext = std::ptr::without_provenance_mut(0x10);
        let args = (
            InContext(1, 0x10),
            2.0f32,
            InContext(3, 0x20),
            InContext(4, 0x30),
        );
        let (index, other) = args.foreign_memory(ours).expect("argument 2 is foreign");
        assert_eq!((index, other.addr()), (2, 0x20));
        assert!((InContext(1, 0x10), 5u32).foreign_memory(ours).is_none());
        assert!((1u64, 2u32).foreign_memory(ours).is_none());
        assert!(().foreign_memory(ours).is_none());
    }
}
