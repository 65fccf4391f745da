//! Tensor maps (TMA descriptors): `cuTensorMapEncodeTiled`, `cuTensorMapEncodeIm2col`,
//! `cuTensorMapReplaceAddress`, and the driver's enumerations of their modes as Rust enums.

use std::ffi::c_void;
use std::fmt;

use atlas_sys::{
    CUdeviceptr, CUtensorMap, CUtensorMapDataType, CUtensorMapFloatOOBfill, CUtensorMapInterleave,
    CUtensorMapL2promotion, CUtensorMapSwizzle,
};

use crate::driver::Result;

/// The type of a tensor's elements (`CUtensorMapDataType`). The last three are packed 4- and
/// 6-bit types of CUDA 12.8 drivers and compute capability 10.0 devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TensorDataType {
    /// `u8` (`CU_TENSOR_MAP_DATA_TYPE_UINT8`).
    U8,
    /// `u16`.
    U16,
    /// `u32`.
    U32,
    /// `i32`.
    I32,
    /// `u64`.
    U64,
    /// `i64`.
    I64,
    /// IEEE half precision.
    F16,
    /// `f32`.
    F32,
    /// `f64`.
    F64,
    /// bfloat16.
    Bf16,
    /// `f32`, denormals flushed to zero.
    F32Ftz,
    /// TensorFloat-32 (4 bytes).
    Tf32,
    /// TensorFloat-32, denormals flushed to zero.
    Tf32Ftz,
    /// 4-bit values, 16 of them in 8 bytes of shared memory (`16U4_ALIGN8B`).
    U4x16Align8,
    /// 4-bit values, 16 of them in 16 bytes of shared memory (`16U4_ALIGN16B`).
    U4x16Align16,
    /// 6-bit values, 16 of them in 16 bytes of shared memory (`16U6_ALIGN16B`).
    U6x16Align16,
}

impl TensorDataType {
    pub(crate) fn raw(self) -> CUtensorMapDataType {
        CUtensorMapDataType(match self {
            Self::U8 => 0,
            Self::U16 => 1,
            Self::U32 => 2,
            Self::I32 => 3,
            Self::U64 => 4,
            Self::I64 => 5,
            Self::F16 => 6,
            Self::F32 => 7,
            Self::F64 => 8,
            Self::Bf16 => 9,
            Self::F32Ftz => 10,
            Self::Tf32 => 11,
            Self::Tf32Ftz => 12,
            Self::U4x16Align8 => 13,
            Self::U4x16Align16 => 14,
            Self::U6x16Align16 => 15,
        })
    }

    /// Bits an element takes in global memory.
    pub fn bits(self) -> u64 {
        match self {
            Self::U8 => 8,
            Self::U16 | Self::F16 | Self::Bf16 => 16,
            Self::U32 | Self::I32 | Self::F32 | Self::F32Ftz | Self::Tf32 | Self::Tf32Ftz => 32,
            Self::U64 | Self::I64 | Self::F64 => 64,
            Self::U4x16Align8 | Self::U4x16Align16 => 4,
            Self::U6x16Align16 => 6,
        }
    }

    /// Bits an element takes in shared memory: the 16-byte-aligned packed types pad 16 values to
    /// 16 bytes.
    pub(crate) fn shared_bits(self) -> u64 {
        match self {
            Self::U4x16Align16 | Self::U6x16Align16 => 8,
            other => other.bits(),
        }
    }

    /// Whether this is a floating-point type (which NaN fill needs).
    pub fn is_float(self) -> bool {
        matches!(
            self,
            Self::F16
                | Self::F32
                | Self::F64
                | Self::Bf16
                | Self::F32Ftz
                | Self::Tf32
                | Self::Tf32Ftz
        )
    }

    /// Whether this is one of the packed types aligned to 16 bytes, which have rules of their own.
    pub(crate) fn packed_16(self) -> bool {
        matches!(self, Self::U4x16Align16 | Self::U6x16Align16)
    }
}

impl fmt::Display for TensorDataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::U8 => "UINT8",
            Self::U16 => "UINT16",
            Self::U32 => "UINT32",
            Self::I32 => "INT32",
            Self::U64 => "UINT64",
            Self::I64 => "INT64",
            Self::F16 => "FLOAT16",
            Self::F32 => "FLOAT32",
            Self::F64 => "FLOAT64",
            Self::Bf16 => "BFLOAT16",
            Self::F32Ftz => "FLOAT32_FTZ",
            Self::Tf32 => "TFLOAT32",
            Self::Tf32Ftz => "TFLOAT32_FTZ",
            Self::U4x16Align8 => "16U4_ALIGN8B",
            Self::U4x16Align16 => "16U4_ALIGN16B",
            Self::U6x16Align16 => "16U6_ALIGN16B",
        })
    }
}

/// How the tensor is interleaved in global memory (`CUtensorMapInterleave`): NC/8HWC8 layouts
/// (16 bytes) or NC/16HWC16 (32 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum TensorInterleave {
    /// Not interleaved.
    #[default]
    None,
    /// 16-byte groups.
    B16,
    /// 32-byte groups.
    B32,
}

impl fmt::Display for TensorInterleave {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::None => "none",
            Self::B16 => "16B",
            Self::B32 => "32B",
        })
    }
}

/// How a load shuffles the box's 16-byte chunks across shared memory banks
/// (`CUtensorMapSwizzle`): within a span of 32, 64 or 128 bytes. The `B128Atom*` modes (CUDA
/// 12.8 drivers, compute capability 10.0 devices) move 32- or 64-byte chunks instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum TensorSwizzle {
    /// The box lands row after row.
    #[default]
    None,
    /// 16-byte chunks within 32 bytes.
    B32,
    /// 16-byte chunks within 64 bytes.
    B64,
    /// 16-byte chunks within 128 bytes.
    B128,
    /// 32-byte chunks within 128 bytes.
    B128Atom32,
    /// 32-byte chunks within 128 bytes, the 8-byte halves of each 16 bytes swapped on every other
    /// row.
    B128Atom32Flip8,
    /// 64-byte chunks within 128 bytes.
    B128Atom64,
}

impl TensorSwizzle {
    pub(crate) fn raw(self) -> CUtensorMapSwizzle {
        CUtensorMapSwizzle(match self {
            Self::None => 0,
            Self::B32 => 1,
            Self::B64 => 2,
            Self::B128 => 3,
            Self::B128Atom32 => 4,
            Self::B128Atom32Flip8 => 5,
            Self::B128Atom64 => 6,
        })
    }

    /// The span in bytes the chunks are shuffled within; `None` without swizzle.
    pub fn span(self) -> Option<u64> {
        match self {
            Self::None => None,
            Self::B32 => Some(32),
            Self::B64 => Some(64),
            _ => Some(128),
        }
    }
}

impl fmt::Display for TensorSwizzle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::None => "none",
            Self::B32 => "32B",
            Self::B64 => "64B",
            Self::B128 => "128B",
            Self::B128Atom32 => "128B_ATOM_32B",
            Self::B128Atom32Flip8 => "128B_ATOM_32B_FLIP_8B",
            Self::B128Atom64 => "128B_ATOM_64B",
        })
    }
}

/// The granularity at which L2 fills from DRAM for the loads (`CUtensorMapL2promotion`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum TensorL2Promotion {
    /// The default.
    #[default]
    None,
    /// 64 bytes.
    B64,
    /// 128 bytes.
    B128,
    /// 256 bytes.
    B256,
}

/// What a load writes for elements outside the tensor (`CUtensorMapFloatOOBfill`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum TensorOobFill {
    /// Zeros.
    #[default]
    Zero,
    /// A NaN that fused multiply-adds treat as zero (floating-point data types only).
    NanRequestZeroFma,
}

/// What every encode takes besides its shape: the element type and the four modes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TensorModes {
    pub(crate) data_type: CUtensorMapDataType,
    pub(crate) interleave: CUtensorMapInterleave,
    pub(crate) swizzle: CUtensorMapSwizzle,
    pub(crate) l2_promotion: CUtensorMapL2promotion,
    pub(crate) oob_fill: CUtensorMapFloatOOBfill,
}

/// `cuTensorMapEncodeTiled` into `map`: a tensor of `dims.len()` dimensions at `address`.
///
/// # Safety
///
/// 1. `strides` holds `dims.len() - 1` values and `box_dims` and `element_strides` `dims.len()`
///    each (the driver reads that many).
/// 2. The context the memory at `address` belongs to is current.
pub(crate) unsafe fn tensor_map_encode_tiled(
    map: &mut CUtensorMap,
    modes: TensorModes,
    address: CUdeviceptr,
    dims: &[u64],
    strides: &[u64],
    box_dims: &[u32],
    element_strides: &[u32],
) -> Result<()> {
    // SAFETY: `map` is a live, 64-byte-aligned tensor map (its type's alignment); the arrays are
    // live and as long as the rank says (duty 1); the context is current (duty 2). The driver
    // only reads the address into the descriptor.
    unsafe {
        call!(cuTensorMapEncodeTiled(
            map,
            modes.data_type,
            dims.len() as u32,
            address as *mut c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            box_dims.as_ptr(),
            element_strides.as_ptr(),
            modes.interleave,
            modes.swizzle,
            modes.l2_promotion,
            modes.oob_fill,
        ))
    }
}

/// The im2col shape of [`tensor_map_encode_im2col`]: the pixel box's corners and how many
/// channels and pixels one load takes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Im2colBox<'a> {
    pub(crate) lower_corner: &'a [i32],
    pub(crate) upper_corner: &'a [i32],
    pub(crate) channels_per_pixel: u32,
    pub(crate) pixels_per_column: u32,
}

/// `cuTensorMapEncodeIm2col` into `map`: a tensor of `dims.len()` dimensions at `address`.
///
/// # Safety
///
/// 1. `strides` holds `dims.len() - 1` values, `element_strides` `dims.len()`, and both corners
///    `dims.len() - 2` (the driver reads that many).
/// 2. The context the memory at `address` belongs to is current.
pub(crate) unsafe fn tensor_map_encode_im2col(
    map: &mut CUtensorMap,
    modes: TensorModes,
    address: CUdeviceptr,
    dims: &[u64],
    strides: &[u64],
    pixels: Im2colBox<'_>,
    element_strides: &[u32],
) -> Result<()> {
    // SAFETY: as for `tensor_map_encode_tiled` (duties 1 and 2).
    unsafe {
        call!(cuTensorMapEncodeIm2col(
            map,
            modes.data_type,
            dims.len() as u32,
            address as *mut c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            pixels.lower_corner.as_ptr(),
            pixels.upper_corner.as_ptr(),
            pixels.channels_per_pixel,
            pixels.pixels_per_column,
            element_strides.as_ptr(),
            modes.interleave,
            modes.swizzle,
            modes.l2_promotion,
            modes.oob_fill,
        ))
    }
}

/// `cuTensorMapReplaceAddress`: `map` describes the same tensor at `address`.
///
/// # Safety
///
/// 1. `map` was encoded by the driver.
/// 2. The context the memory at `address` belongs to is current.
pub(crate) unsafe fn tensor_map_replace_address(
    map: &mut CUtensorMap,
    address: CUdeviceptr,
) -> Result<()> {
    // SAFETY: duties 1 and 2; `map` is live and aligned (its type).
    unsafe { call!(cuTensorMapReplaceAddress(map, address as *mut c_void)) }
}
