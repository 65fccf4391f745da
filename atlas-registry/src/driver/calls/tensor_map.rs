//! Tensor maps (TMA descriptors): `cuTensorMapEncodeTiled`, `cuTensorMapEncodeIm2col`,
//! `cuTensorMapReplaceAddress`.

use std::ffi::c_void;

use atlas_sys::{
    CUdeviceptr, CUtensorMap, CUtensorMapDataType, CUtensorMapFloatOOBfill, CUtensorMapInterleave,
    CUtensorMapL2promotion, CUtensorMapSwizzle,
};

use crate::driver::Result;

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
