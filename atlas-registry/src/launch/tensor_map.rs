//! [`TensorMap`]: a TMA descriptor (`CUtensorMap`) of device memory Atlas allocated, encoded by
//! the driver after every documented rule of its arguments was checked, and passed to kernels by
//! value as the `const __grid_constant__ CUtensorMap` parameters of Hopper and Blackwell kernels
//! (CUTLASS, FlashAttention 3, DeepGEMM).
//!
//! A tensor map borrows the memory it describes, so the memory outlives it; a launch checks that
//! the memory is of the function's context, as it checks buffers, and a graph that captures the
//! launch keeps the memory alive as it keeps buffer arguments. The descriptor is 128 bytes
//! aligned to 64, and the kernel's parameter must be too: a launch checks its size and its place
//! in the constant bank against the kernel's layout.
//!
//! A tensor map cannot outlive its memory:
//!
//! ```compile_fail
//! # fn f(context: &atlas_registry::CudaContext) -> atlas_registry::Result<()> {
//! use atlas_registry::{DeviceBuffer, DeviceMemory, TensorDataType, TensorMap, TiledTensor};
//! let map = {
//!     let x = DeviceBuffer::<f32>::alloc(context, 64 * 64)?;
//!     TensorMap::tiled(x.as_slice(), &TiledTensor::new(TensorDataType::F32, &[64, 64], &[256], &[32, 32]))?
//!     // refused: `x` is dropped while `map` borrows it
//! };
//! # drop(map); Ok(()) }
//! ```

use std::ffi::c_void;
use std::fmt;

use atlas_sys::{
    CUcontext, CUdeviceptr, CUtensorMap, CUtensorMapFloatOOBfill as OobFill,
    CUtensorMapInterleave as Interleave, CUtensorMapL2promotion as L2Promotion,
};

use crate::device::context::{ensure_bound, ordinal_of};
use crate::device::host::host;
use crate::driver::About;
use crate::driver::calls::{
    self, Im2colBox, TensorDataType, TensorInterleave, TensorL2Promotion, TensorModes,
    TensorOobFill, TensorSwizzle,
};
use crate::error::{AtlasError, Result, TensorArgument, TensorMapRefusal};
use crate::launch::args::KernelParam;
use crate::launch::held::GraphHolds;
use crate::memory::buffer::{DeviceBuffer, DeviceCopy};
use crate::memory::view::DeviceSlice;

/// The modes of a tensor map besides its shape: interleave, swizzle, L2 promotion and
/// out-of-bounds fill, each the driver's default unless set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TensorOptions {
    /// How the tensor is interleaved in global memory.
    pub interleave: TensorInterleave,
    /// How a load lays the box out in shared memory.
    pub swizzle: TensorSwizzle,
    /// L2 fill granularity.
    pub l2_promotion: TensorL2Promotion,
    /// What elements outside the tensor read as.
    pub oob_fill: TensorOobFill,
}

/// A tensor whose loads take boxes of it (`cuTensorMapEncodeTiled`). Dimensions are listed
/// innermost (contiguous) first, as the driver takes them: a row-major matrix of `rows` rows of
/// `cols` elements, `pitch` bytes apart, is `dims: &[cols, rows]`, `strides: &[pitch]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TiledTensor<'s> {
    /// The elements' type.
    pub data_type: TensorDataType,
    /// Elements in each dimension (`globalDim`), 1 to 5 of them.
    pub dims: &'s [u64],
    /// Bytes between consecutive elements of each dimension but the innermost
    /// (`globalStrides`): one fewer than `dims`.
    pub strides: &'s [u64],
    /// Elements of the box one load takes, in each dimension (`boxDim`).
    pub box_dims: &'s [u32],
    /// The step in each dimension (`elementStrides`); empty for 1 in every dimension.
    pub element_strides: &'s [u32],
    /// Interleave, swizzle, L2 promotion, out-of-bounds fill.
    pub options: TensorOptions,
}

impl<'s> TiledTensor<'s> {
    /// A tensor of `data_type` elements with these dimensions, strides and box, every element
    /// stride 1 and the default options (set `options` to change them).
    pub fn new(
        data_type: TensorDataType,
        dims: &'s [u64],
        strides: &'s [u64],
        box_dims: &'s [u32],
    ) -> Self {
        Self {
            data_type,
            dims,
            strides,
            box_dims,
            element_strides: &[],
            options: TensorOptions::default(),
        }
    }
}

/// A tensor of pixels (NWC, NHWC or NDHWC, channels innermost) whose loads gather one column of
/// an im2col matrix (`cuTensorMapEncodeIm2col`): `pixels_per_column` pixels of
/// `channels_per_pixel` channels each, from the bounding box between the corners.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Im2colTensor<'s> {
    /// The elements' type.
    pub data_type: TensorDataType,
    /// Elements in each dimension (`globalDim`): channels, then W, H, D, then N; 3 to 5 of them.
    pub dims: &'s [u64],
    /// Bytes between consecutive elements of each dimension but the innermost
    /// (`globalStrides`): one fewer than `dims`.
    pub strides: &'s [u64],
    /// The bounding box's offsets from the lower corner (`pixelBoxLowerCorner`), one per spatial
    /// dimension (two fewer than `dims`).
    pub lower_corner: &'s [i32],
    /// The bounding box's offsets from the upper corner (`pixelBoxUpperCorner`), as many.
    pub upper_corner: &'s [i32],
    /// Channels a load takes of each pixel, at most 256.
    pub channels_per_pixel: u32,
    /// Pixels a load takes, at most 1024.
    pub pixels_per_column: u32,
    /// The step in each dimension (`elementStrides`); empty for 1 in every dimension.
    pub element_strides: &'s [u32],
    /// Interleave, swizzle, L2 promotion, out-of-bounds fill.
    pub options: TensorOptions,
}

/// What a graph that captures a launch with a tensor map keeps alive: the buffer of its memory.
trait GraphMemory: Sync {
    fn hold(&self, holds: &mut GraphHolds);
}

impl<T: DeviceCopy> GraphMemory for DeviceBuffer<T> {
    fn hold(&self, holds: &mut GraphHolds) {
        holds.buffer(self);
    }
}

/// The memory a tensor map describes.
#[derive(Clone, Copy)]
struct Memory<'a> {
    address: CUdeviceptr,
    bytes: u64,
    context: CUcontext,
    buffer: &'a dyn GraphMemory,
}

impl<'a> Memory<'a> {
    fn of<T: DeviceCopy>(view: DeviceSlice<'a, T>) -> Self {
        Self {
            address: view.device_ptr(),
            // A buffer's length in bytes fits the address space (it was allocated).
            bytes: (view.len() * size_of::<T>()) as u64,
            context: view.context(),
            buffer: view.buffer(),
        }
    }
}

/// A TMA descriptor (`CUtensorMap`, 128 bytes aligned to 64) of a tensor in device memory that
/// it borrows, for kernels that load or store boxes of it with `cp.async.bulk.tensor`.
///
/// Made by [`tiled`](Self::tiled) (`cuTensorMapEncodeTiled`) or [`im2col`](Self::im2col)
/// (`cuTensorMapEncodeIm2col`) after every rule the driver documents for their arguments is
/// checked ([`TensorMapRefusal`] names the argument and the rule; nothing reaches the driver
/// then), and after checking that the tensor lies in the memory and that the memory's device has
/// the Tensor Memory Accelerator (compute capability 9.0 or newer). The driver is called once.
///
/// A kernel takes it as `&map` for a `const __grid_constant__ CUtensorMap` parameter (CUTLASS's
/// `TmaDescriptor`): the launch copies its 128 bytes into the parameters, after checking, as for
/// any argument, the parameter's size and that its memory is of the function's context, and
/// also that the kernel's parameter lies 64-byte aligned in the constant bank, where the TMA unit
/// reads it. A launch captured into a graph leaves the graph the memory's buffer to keep, as for
/// a buffer argument; the graph's node keeps the descriptor's bytes as they were.
/// [`set_memory`](Self::set_memory) points the descriptor at other memory of the same size, for
/// the next launches or a graph's argument update
/// ([`GraphExec::set_kernel_args`](crate::GraphExec::set_kernel_args)).
///
/// What the kernel does with the descriptor (which boxes it loads, whether it stores through
/// it) is the launch's safety contract: the descriptor covers the whole tensor, which lies in the
/// borrowed memory.
///
/// # Examples
///
/// Tiles of 16 rows by 32 floats of a 100 × 75 matrix whose rows are 304 bytes apart (strides
/// are multiples of 16 bytes), loaded by a kernel `tma_tiles(const __grid_constant__ CUtensorMap
/// map, float* out, unsigned rows, unsigned cols, unsigned swizzle)`:
///
/// ```no_run
/// # fn f(registry: &atlas_registry::AtlasRegistry) -> atlas_registry::Result<()> {
/// use atlas_registry::{
///     DeviceBuffer, DeviceMemory, LaunchConfig, TensorDataType, TensorMap, TensorOptions,
///     TensorSwizzle, TiledTensor,
/// };
/// let (ctx, stream) = (registry.ctx(), registry.stream());
/// let (rows, cols, pitch) = (100u64, 75u64, 76u64);
/// let x = DeviceBuffer::from_slice(ctx, stream, &vec![1.0f32; (rows * pitch) as usize])?;
/// let map = TensorMap::tiled(x.as_slice(), &TiledTensor {
///     options: TensorOptions { swizzle: TensorSwizzle::B128, ..TensorOptions::default() },
///     ..TiledTensor::new(TensorDataType::F32, &[cols, rows], &[pitch * 4], &[32, 16])
/// })?;
/// let (tiles_x, tiles_y) = (cols.div_ceil(32) as u32, rows.div_ceil(16) as u32);
/// let tiles = (tiles_x * tiles_y) as usize;
/// let mut out = DeviceBuffer::<f32>::zeroed(ctx, stream, tiles * (1 + 16 * 32))?;
/// let kernel = registry.function_cached("tma", "tma_tiles")?;
/// let cfg = LaunchConfig { grid: (tiles_x, tiles_y, 1), block: (128, 1, 1),
///     shared_mem_bytes: 16 * 32 * 4 + 1024 };
/// // SAFETY: `tma_tiles` loads boxes of the tensor `map` describes and writes `tiles` sums and
/// // boxes to `out`, which holds that many; `to_vec` waits for it.
/// unsafe { kernel.launch(stream, &cfg, (&map, &mut out, 16u32, 32u32, 3u32))? };
/// let sums = out.to_vec(stream)?;
/// # drop(sums); Ok(()) }
/// ```
#[doc(alias = "CUtensorMap")]
pub struct TensorMap<'a> {
    raw: CUtensorMap,
    memory: Memory<'a>,
    /// Bytes from the tensor's first element to one past its last.
    reach: u64,
    /// The alignment the tensor's address needs.
    address_align: u64,
}

// SAFETY: the descriptor is plain bytes; the context is a driver handle usable from any thread;
// the borrowed buffer is Sync (its shared references only read its address and context, or take
// a reference to its memory for a graph).
unsafe impl Send for TensorMap<'_> {}
// SAFETY: as for Send; shared references only read.
unsafe impl Sync for TensorMap<'_> {}

impl<'a> TensorMap<'a> {
    /// Encodes a descriptor of `tensor`, whose first element is the first of `memory` (a view of
    /// a buffer: `buffer.as_slice()`, or a range of it) (`cuTensorMapEncodeTiled`), after checking every rule the driver documents for its
    /// arguments, that the tensor lies in `memory` and that the device has the Tensor Memory
    /// Accelerator: a refusal is an [`AtlasError::TensorMap`] naming the argument and the rule.
    /// One driver call (and `cuCtxGetCurrent`, `cuCtxSetCurrent` when the memory's context is not
    /// current).
    #[doc(alias = "cuTensorMapEncodeTiled")]
    pub fn tiled<T: DeviceCopy>(
        memory: DeviceSlice<'a, T>,
        tensor: &TiledTensor<'_>,
    ) -> Result<Self> {
        let memory = Memory::of(memory);
        let shape = Shape {
            data_type: tensor.data_type,
            dims: tensor.dims,
            strides: tensor.strides,
            element_strides: tensor.element_strides,
            options: tensor.options,
        };
        let min_rank = if tensor.options.interleave == TensorInterleave::None {
            1
        } else {
            3
        };
        let element_strides = shape.check(memory.address, min_rank)?;
        check_box(&shape, tensor.box_dims)?;
        let mut map = Self::unencoded(memory, &shape)?;
        ensure_bound(memory.context)?;
        // SAFETY: the arrays are as long as the rank says (checked); the memory's context is
        // current (above).
        unsafe {
            calls::tensor_map_encode_tiled(
                &mut map.raw,
                shape.modes(),
                memory.address,
                tensor.dims,
                tensor.strides,
                tensor.box_dims,
                &element_strides,
            )
        }
        .about(|| format!("a tiled tensor map of {:#x}", memory.address))?;
        Ok(map)
    }

    /// Encodes an im2col descriptor of `tensor`, whose first element is the first of `memory`
    /// (`cuTensorMapEncodeIm2col`), after the same checks as [`tiled`](Self::tiled) with the
    /// rules of im2col: 3 to 5 dimensions, pixel box corners within the range the rank allows, at
    /// most 256 channels and 1024 pixels a load. That the bounding box has a nonzero area is left
    /// to the driver. One driver call.
    #[doc(alias = "cuTensorMapEncodeIm2col")]
    pub fn im2col<T: DeviceCopy>(
        memory: DeviceSlice<'a, T>,
        tensor: &Im2colTensor<'_>,
    ) -> Result<Self> {
        let memory = Memory::of(memory);
        let shape = Shape {
            data_type: tensor.data_type,
            dims: tensor.dims,
            strides: tensor.strides,
            element_strides: tensor.element_strides,
            options: tensor.options,
        };
        let element_strides = shape.check(memory.address, 3)?;
        check_pixels(&shape, tensor)?;
        let mut map = Self::unencoded(memory, &shape)?;
        ensure_bound(memory.context)?;
        let pixels = Im2colBox {
            lower_corner: tensor.lower_corner,
            upper_corner: tensor.upper_corner,
            channels_per_pixel: tensor.channels_per_pixel,
            pixels_per_column: tensor.pixels_per_column,
        };
        // SAFETY: the arrays are as long as the rank says (checked); the memory's context is
        // current (above).
        unsafe {
            calls::tensor_map_encode_im2col(
                &mut map.raw,
                shape.modes(),
                memory.address,
                tensor.dims,
                tensor.strides,
                pixels,
                &element_strides,
            )
        }
        .about(|| format!("an im2col tensor map of {:#x}", memory.address))?;
        Ok(map)
    }

    /// A descriptor not encoded yet of `shape` in `memory`, after checking that the tensor lies
    /// in the memory and that the memory's device has the Tensor Memory Accelerator.
    fn unencoded(memory: Memory<'a>, shape: &Shape<'_>) -> Result<Self> {
        if let Some(device) = ordinal_of(memory.context) {
            let compute_capability = host(device)?.compute_capability();
            if compute_capability.0 < 9 {
                return Err(refused(TensorMapRefusal::DeviceUnsupported {
                    device,
                    compute_capability,
                }));
            }
        }
        let map = Self {
            raw: CUtensorMap { opaque: [0; 16] },
            memory,
            reach: shape.reach(),
            address_align: shape.address_align(),
        };
        map.check_memory(&memory)?;
        Ok(map)
    }

    /// `Ok` when the tensor lies in `memory`, at an address aligned as it needs.
    fn check_memory(&self, memory: &Memory<'_>) -> Result<()> {
        if !memory.address.is_multiple_of(self.address_align) {
            return Err(refused(TensorMapRefusal::GlobalAddress {
                address: memory.address,
                align: self.address_align,
            }));
        }
        if self.reach > memory.bytes {
            return Err(refused(TensorMapRefusal::BeyondMemory {
                reach: self.reach,
                bytes: memory.bytes,
            }));
        }
        Ok(())
    }

    /// Points the descriptor at `memory`, which holds a tensor of the same shape, modes and type
    /// (`cuTensorMapReplaceAddress`): for the next launches, or for a graph's argument update
    /// ([`GraphExec::set_kernel_args`](crate::GraphExec::set_kernel_args)) of a node that
    /// captured a launch with it. Launches already enqueued, and graph nodes already captured, keep
    /// the descriptor they were given.
    ///
    /// Refused before the driver is called: memory of another context than the descriptor's
    /// ([`AtlasError::WrongContext`]), an address not aligned as the tensor needs, or memory the
    /// tensor does not fit in ([`AtlasError::TensorMap`]). One driver call.
    #[doc(alias = "cuTensorMapReplaceAddress")]
    pub fn set_memory<T: DeviceCopy>(&mut self, memory: DeviceSlice<'a, T>) -> Result<()> {
        let memory = Memory::of(memory);
        if memory.context != self.memory.context {
            return Err(AtlasError::WrongContext {
                what: "the memory for the tensor map".into(),
                expected: ordinal_of(self.memory.context),
                given: ordinal_of(memory.context),
            });
        }
        self.check_memory(&memory)?;
        ensure_bound(memory.context)?;
        // SAFETY: the descriptor was encoded by the driver (a `TensorMap` exists only once it
        // was); the memory's context is current (above).
        unsafe { calls::tensor_map_replace_address(&mut self.raw, memory.address) }
            .about(|| format!("a tensor map moved to {:#x}", memory.address))?;
        self.memory = memory;
        Ok(())
    }

    /// The descriptor's 128 bytes, for launches and driver calls Atlas does not wrap.
    pub fn raw(&self) -> &CUtensorMap {
        &self.raw
    }

    /// The device address of the tensor's first element.
    pub fn device_ptr(&self) -> CUdeviceptr {
        self.memory.address
    }

    /// Bytes from the tensor's first element to one past its last, as its dimensions and strides
    /// reach.
    pub fn reach(&self) -> u64 {
        self.reach
    }
}

impl fmt::Debug for TensorMap<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensorMap")
            .field("address", &format_args!("{:#x}", self.memory.address))
            .field("reach", &self.reach)
            .finish()
    }
}

// SAFETY: the parameter is the descriptor, stored in the map itself, 128 bytes that the reference
// keeps alive and unchanged (duty 1); its memory is the borrowed memory, whose context the map
// records (duty 2). A captured launch keeps that memory's buffer.
unsafe impl KernelParam for &TensorMap<'_> {
    const SIZE: usize = size_of::<CUtensorMap>();
    const ALIGN: usize = align_of::<CUtensorMap>();
    #[inline]
    fn param_ptr(&self) -> *mut c_void {
        (&self.raw as *const CUtensorMap).cast_mut().cast()
    }
    #[inline]
    fn memory_context(&self) -> Option<CUcontext> {
        Some(self.memory.context)
    }
    #[inline]
    fn hold_for_graph(&self, holds: &mut GraphHolds) {
        self.memory.buffer.hold(holds);
    }
}

/// The refusal `reason` as an error.
#[cold]
fn refused(reason: TensorMapRefusal) -> AtlasError {
    AtlasError::TensorMap(reason)
}

/// What tiled and im2col tensors have in common.
struct Shape<'s> {
    data_type: TensorDataType,
    dims: &'s [u64],
    strides: &'s [u64],
    element_strides: &'s [u32],
    options: TensorOptions,
}

/// The most dimensions a tensor map has.
const MAX_RANK: usize = 5;

impl Shape<'_> {
    fn modes(&self) -> TensorModes {
        let options = &self.options;
        TensorModes {
            data_type: self.data_type.raw(),
            interleave: Interleave(options.interleave as u32),
            swizzle: options.swizzle.raw(),
            l2_promotion: L2Promotion(options.l2_promotion as u32),
            oob_fill: OobFill(options.oob_fill as u32),
        }
    }

    /// The alignment the tensor's address and strides need: 32 bytes with interleave 32B or a
    /// 16-byte-aligned packed type, else 16.
    fn address_align(&self) -> u64 {
        if self.options.interleave == TensorInterleave::B32 || self.data_type.packed_16() {
            32
        } else {
            16
        }
    }

    /// Bytes from the first element to one past the last (saturated).
    fn reach(&self) -> u64 {
        let row = self.dims[0]
            .saturating_mul(self.data_type.bits())
            .div_ceil(8);
        self.dims[1..]
            .iter()
            .zip(self.strides)
            .fold(row, |reach, (&dim, &stride)| {
                reach.saturating_add((dim - 1).saturating_mul(stride))
            })
    }

    /// Checks what tiled and im2col tensors share against the driver's rules, for at least
    /// `min_rank` dimensions; returns the element strides to pass (all ones when none are given).
    fn check(&self, address: CUdeviceptr, min_rank: usize) -> Result<[u32; MAX_RANK]> {
        let (data_type, options) = (self.data_type, self.options);
        let rank = self.dims.len();
        if !(min_rank..=MAX_RANK).contains(&rank) {
            return Err(refused(TensorMapRefusal::Rank {
                rank,
                min: min_rank,
                max: MAX_RANK,
            }));
        }
        check_length(
            TensorArgument::GlobalStrides,
            self.strides.len(),
            rank,
            rank - 1,
        )?;
        if !self.element_strides.is_empty() {
            check_length(
                TensorArgument::ElementStrides,
                self.element_strides.len(),
                rank,
                rank,
            )?;
        }
        let align = self.address_align();
        if !address.is_multiple_of(align) {
            return Err(refused(TensorMapRefusal::GlobalAddress { address, align }));
        }
        for (dim, &value) in self.dims.iter().enumerate() {
            if value == 0 || value > 1 << 32 {
                return Err(refused(TensorMapRefusal::GlobalDim { dim, value }));
            }
        }
        let packed_multiple = match data_type {
            TensorDataType::U4x16Align16 | TensorDataType::U6x16Align16 => 128,
            TensorDataType::U4x16Align8 => 2,
            _ => 1,
        };
        if !self.dims[0].is_multiple_of(packed_multiple) {
            return Err(refused(TensorMapRefusal::PackedGlobalDim {
                value: self.dims[0],
                data_type,
                multiple: packed_multiple,
            }));
        }
        for (dim, &stride) in self.strides.iter().enumerate() {
            if !stride.is_multiple_of(align) {
                return Err(refused(TensorMapRefusal::GlobalStride {
                    dim,
                    stride,
                    multiple: align,
                }));
            }
            if stride >= 1 << 40 {
                return Err(refused(TensorMapRefusal::GlobalStrideTooLarge {
                    dim,
                    stride,
                }));
            }
        }
        let mut element_strides = [1; MAX_RANK];
        for (dim, &value) in self.element_strides.iter().enumerate() {
            if !(1..=8).contains(&value) {
                return Err(refused(TensorMapRefusal::ElementStride { dim, value }));
            }
            element_strides[dim] = value;
        }
        if options.interleave == TensorInterleave::B32 && options.swizzle != TensorSwizzle::B32 {
            return Err(refused(TensorMapRefusal::InterleaveSwizzle {
                swizzle: options.swizzle,
            }));
        }
        if data_type == TensorDataType::U6x16Align16 && options.interleave != TensorInterleave::None
        {
            return Err(refused(TensorMapRefusal::PackedInterleave {
                data_type,
                interleave: options.interleave,
            }));
        }
        let swizzle_allowed = match data_type {
            TensorDataType::U6x16Align16 => matches!(
                options.swizzle,
                TensorSwizzle::None
                    | TensorSwizzle::B128
                    | TensorSwizzle::B128Atom32
                    | TensorSwizzle::B128Atom64
            ),
            TensorDataType::U4x16Align16 => matches!(
                options.swizzle,
                TensorSwizzle::None | TensorSwizzle::B128 | TensorSwizzle::B128Atom32
            ),
            _ => true,
        };
        if !swizzle_allowed {
            return Err(refused(TensorMapRefusal::PackedSwizzle {
                data_type,
                swizzle: options.swizzle,
            }));
        }
        if options.oob_fill == TensorOobFill::NanRequestZeroFma && !data_type.is_float() {
            return Err(refused(TensorMapRefusal::NanFillNotFloat { data_type }));
        }
        Ok(element_strides)
    }

    /// Checks the box's inner dimension, `elements` of the data type in shared memory, against
    /// the swizzle's span (a tensor without interleave, with a swizzle).
    fn check_span(&self, elements: u64) -> Result<()> {
        let bytes = (elements * self.data_type.shared_bits()).div_ceil(8);
        match self.options.swizzle.span() {
            Some(span) if self.options.interleave == TensorInterleave::None && bytes > span => {
                Err(refused(TensorMapRefusal::SwizzleSpan {
                    bytes,
                    swizzle: self.options.swizzle,
                    span,
                }))
            }
            _ => Ok(()),
        }
    }
}

/// `Ok` when `argument` has the `expected` length for a tensor of `rank` dimensions.
fn check_length(argument: TensorArgument, len: usize, rank: usize, expected: usize) -> Result<()> {
    if len == expected {
        Ok(())
    } else {
        Err(refused(TensorMapRefusal::ArgumentLength {
            argument,
            len,
            rank,
            expected,
        }))
    }
}

/// Checks a tiled tensor's box against the driver's rules.
fn check_box(shape: &Shape<'_>, box_dims: &[u32]) -> Result<()> {
    let rank = shape.dims.len();
    check_length(TensorArgument::BoxDim, box_dims.len(), rank, rank)?;
    for (dim, &value) in box_dims.iter().enumerate() {
        if !(1..=256).contains(&value) {
            return Err(refused(TensorMapRefusal::BoxDim { dim, value }));
        }
    }
    let data_type = shape.data_type;
    if data_type.packed_16() && box_dims[0] != 128 {
        return Err(refused(TensorMapRefusal::PackedBoxDim {
            value: box_dims[0],
            data_type,
        }));
    }
    if shape.options.interleave == TensorInterleave::None {
        let bits = u64::from(box_dims[0]) * data_type.bits();
        if !bits.is_multiple_of(16 * 8) {
            return Err(refused(TensorMapRefusal::BoxInnerBytes {
                bytes: bits.div_ceil(8),
                data_type,
            }));
        }
    }
    shape.check_span(u64::from(box_dims[0]))
}

/// Checks an im2col tensor's pixel box against the driver's rules.
fn check_pixels(shape: &Shape<'_>, tensor: &Im2colTensor<'_>) -> Result<()> {
    let rank = shape.dims.len();
    let (min, max) = match rank {
        3 => (-32768, 32767),
        4 => (-128, 127),
        _ => (-16, 15),
    };
    for (argument, corner) in [
        (TensorArgument::PixelBoxLowerCorner, tensor.lower_corner),
        (TensorArgument::PixelBoxUpperCorner, tensor.upper_corner),
    ] {
        check_length(argument, corner.len(), rank, rank - 2)?;
        for (index, &value) in corner.iter().enumerate() {
            if !(min..=max).contains(&value) {
                return Err(refused(TensorMapRefusal::PixelBoxCorner {
                    argument,
                    index,
                    value,
                    rank,
                    min,
                    max,
                }));
            }
        }
    }
    let channels = tensor.channels_per_pixel;
    let (fits, allowed) = if shape.data_type.packed_16() {
        (channels == 128, "128 for a 16-byte-aligned packed type")
    } else {
        (channels <= 256, "at most 256")
    };
    if !fits {
        return Err(refused(TensorMapRefusal::ChannelsPerPixel {
            value: channels,
            allowed,
        }));
    }
    if tensor.pixels_per_column > 1024 {
        return Err(refused(TensorMapRefusal::PixelsPerColumn {
            value: tensor.pixels_per_column,
        }));
    }
    shape.check_span(u64::from(channels))
}
