//! Tensor maps (TMA descriptors): every rule the driver documents for `cuTensorMapEncodeTiled`
//! and `cuTensorMapEncodeIm2col` refused before the driver is called, a valid encode one driver
//! call, the descriptor checked as a kernel argument (size, place in the constant bank, memory of
//! the function's context) and passed by value; on a GPU, the `hopper` model's `tma_tiles`
//! against the CPU and through a graph's argument update.
//!
//! CPU (the stand-in libcuda, in child processes): `cargo test -p atlas-registry --test
//! tensor_map`. GPU (compute capability 9.0): `cargo test -p atlas-registry --test tensor_map --
//! --include-ignored`.

mod support;

use atlas_kernels::{cubin_for_model, ptx_for_model};
use atlas_registry::{
    AtlasError, AtlasRegistry, CudaStream, DeviceBuffer, DeviceMemory, Im2colTensor, LaunchConfig,
    LaunchRefusal, TensorArgument, TensorDataType, TensorInterleave, TensorMap, TensorMapRefusal,
    TensorOobFill, TensorOptions, TensorSwizzle, TiledTensor,
};
use support::blobs::{NEEDS_GPU, device_cubins};
use support::child;
use support::rng::Rng;
use support::standin::{self, probe};

child::bodies!(
    every_documented_rule_is_refused_before_the_driver,
    a_valid_encode_is_one_driver_call,
    a_tensor_map_argument_is_checked_against_the_kernel,
    a_tensor_map_follows_its_memory_only_within_its_context,
    the_cubin_places_the_map_without_param_info,
    an_older_device_has_no_tensor_maps,
);

// ---------------------------------------------------------------------------------------------
// CPU: the stand-in libcuda
// ---------------------------------------------------------------------------------------------

#[test]
fn each_documented_rule_of_the_encodes_is_refused_without_calling_the_driver() {
    standin::run(every_documented_rule_is_refused_before_the_driver, &[]);
}

#[test]
fn a_valid_tiled_or_im2col_encode_is_one_driver_call() {
    standin::run(a_valid_encode_is_one_driver_call, &[]);
}

#[test]
fn a_tensor_map_argument_is_checked_for_size_place_and_context() {
    standin::run(
        a_tensor_map_argument_is_checked_against_the_kernel,
        &["-DSTANDIN_DEVICES=2"],
    );
}

#[test]
fn set_memory_moves_the_descriptor_within_its_context_and_size() {
    standin::run(
        a_tensor_map_follows_its_memory_only_within_its_context,
        &["-DSTANDIN_DEVICES=2"],
    );
}

#[test]
fn without_cu_func_get_param_info_the_cubin_places_the_map() {
    standin::run(
        the_cubin_places_the_map_without_param_info,
        &["-DSTANDIN_NO_PARAM_INFO"],
    );
}

#[test]
fn a_device_older_than_compute_capability_9_has_no_tensor_maps() {
    standin::run(
        an_older_device_has_no_tensor_maps,
        &["-DSTANDIN_CC_MAJOR=8"],
    );
}

/// The `hopper` model's PTX on device `ordinal` (the stand-in knows its kernels by name and takes
/// their layouts from its own table, as the driver's `cuFuncGetParamInfo`).
fn hopper(ordinal: usize) -> AtlasRegistry {
    AtlasRegistry::load(ordinal, ptx_for_model("hopper").unwrap()).unwrap()
}

/// The refusal inside `e`; panics on any other error.
fn refusal(result: atlas_registry::Result<TensorMap<'_>>) -> TensorMapRefusal {
    match result {
        Err(AtlasError::TensorMap(reason)) => reason,
        Err(other) => panic!("expected a tensor map refusal, got {other}"),
        Ok(map) => panic!("expected a tensor map refusal, got {map:?}"),
    }
}

/// A view of `x` whose address leaves `rem` modulo `modulus` (in bytes, a multiple of 4).
fn view_at(x: &DeviceBuffer<f32>, modulus: u64, rem: u64) -> atlas_registry::DeviceSlice<'_, f32> {
    let skip = (rem + modulus - x.device_ptr() % modulus) % modulus;
    x.range((skip / 4) as usize..).unwrap()
}

fn options(interleave: TensorInterleave, swizzle: TensorSwizzle) -> TensorOptions {
    TensorOptions {
        interleave,
        swizzle,
        ..TensorOptions::default()
    }
}

fn every_documented_rule_is_refused_before_the_driver() {
    let registry = hopper(0);
    let ctx = registry.ctx();
    let x = DeviceBuffer::<f32>::zeroed(ctx, registry.stream(), 64 * 1024).unwrap();
    let at32 = view_at(&x, 32, 0);
    let at16 = view_at(&x, 32, 16);
    let f32_2d = |dims: &'static [u64], strides: &'static [u64], boxes: &'static [u32]| {
        TiledTensor::new(TensorDataType::F32, dims, strides, boxes)
    };
    let calls = probe().count("calls");
    use TensorMapRefusal as R;
    // (what, the refusal, a name its text must carry)
    let tiled: Vec<(&str, TensorMapRefusal, &str)> = vec![
        (
            "rank 0",
            refusal(TensorMap::tiled(x.as_slice(), &f32_2d(&[], &[], &[]))),
            "tensorRank 0",
        ),
        (
            "rank 6",
            refusal(TensorMap::tiled(
                x.as_slice(),
                &f32_2d(&[2; 6], &[16; 5], &[4, 1, 1, 1, 1, 1]),
            )),
            "tensorRank 6",
        ),
        (
            "interleave below rank 3",
            refusal(TensorMap::tiled(
                x.as_slice(),
                &TiledTensor {
                    options: options(TensorInterleave::B16, TensorSwizzle::None),
                    ..f32_2d(&[4, 4], &[16], &[4, 4])
                },
            )),
            "outside 3 to 5",
        ),
        (
            "strides of rank",
            refusal(TensorMap::tiled(
                x.as_slice(),
                &f32_2d(&[4, 4], &[16, 16], &[4, 4]),
            )),
            "globalStrides has 2",
        ),
        (
            "element strides of another rank",
            refusal(TensorMap::tiled(
                x.as_slice(),
                &TiledTensor {
                    element_strides: &[1],
                    ..f32_2d(&[4, 4], &[16], &[4, 4])
                },
            )),
            "elementStrides has 1",
        ),
        (
            "box of another rank",
            refusal(TensorMap::tiled(
                x.as_slice(),
                &f32_2d(&[4, 4], &[16], &[4]),
            )),
            "boxDim has 1",
        ),
        (
            "address off 16",
            refusal(TensorMap::tiled(
                x.range(1..).unwrap(),
                &f32_2d(&[4, 4], &[16], &[4, 4]),
            )),
            "globalAddress",
        ),
        (
            "address off 32 with interleave 32B",
            refusal(TensorMap::tiled(
                at16,
                &TiledTensor {
                    options: options(TensorInterleave::B32, TensorSwizzle::B32),
                    ..f32_2d(&[8, 4, 4], &[32, 128], &[8, 4, 4])
                },
            )),
            "not a multiple of 32 bytes",
        ),
        (
            "dimension 0",
            refusal(TensorMap::tiled(
                x.as_slice(),
                &f32_2d(&[4, 0], &[16], &[4, 4]),
            )),
            "globalDim[1] is 0",
        ),
        (
            "dimension above 2^32",
            refusal(TensorMap::tiled(
                x.as_slice(),
                &f32_2d(&[(1 << 32) + 1], &[], &[4]),
            )),
            "globalDim[0] is 4294967297",
        ),
        (
            "packed 16-byte type, dimension 0 not of 128",
            refusal(TensorMap::tiled(
                at32,
                &TiledTensor::new(TensorDataType::U4x16Align16, &[100, 2], &[64], &[128, 2]),
            )),
            "multiple of 128",
        ),
        (
            "packed 8-byte type, dimension 0 odd",
            refusal(TensorMap::tiled(
                x.as_slice(),
                &TiledTensor::new(TensorDataType::U4x16Align8, &[3, 2], &[16], &[32, 2]),
            )),
            "multiple of 2",
        ),
        (
            "stride off 16",
            refusal(TensorMap::tiled(
                x.as_slice(),
                &f32_2d(&[4, 4], &[20], &[4, 4]),
            )),
            "globalStrides[0] is 20 bytes",
        ),
        (
            "stride off 32 with interleave 32B",
            refusal(TensorMap::tiled(
                at32,
                &TiledTensor {
                    options: options(TensorInterleave::B32, TensorSwizzle::B32),
                    ..f32_2d(&[8, 4, 4], &[48, 192], &[8, 4, 4])
                },
            )),
            "globalStrides[0] is 48 bytes, not a multiple of 32",
        ),
        (
            "stride of 2^40",
            refusal(TensorMap::tiled(
                x.as_slice(),
                &f32_2d(&[4, 4], &[1 << 40], &[4, 4]),
            )),
            "below 2^40",
        ),
        (
            "element stride 0",
            refusal(TensorMap::tiled(
                x.as_slice(),
                &TiledTensor {
                    element_strides: &[1, 0],
                    ..f32_2d(&[4, 4], &[16], &[4, 4])
                },
            )),
            "elementStrides[1] is 0",
        ),
        (
            "element stride 9",
            refusal(TensorMap::tiled(
                x.as_slice(),
                &TiledTensor {
                    element_strides: &[9, 1],
                    ..f32_2d(&[4, 4], &[16], &[4, 4])
                },
            )),
            "elementStrides[0] is 9",
        ),
        (
            "interleave 32B without swizzle 32B",
            refusal(TensorMap::tiled(
                at32,
                &TiledTensor {
                    options: options(TensorInterleave::B32, TensorSwizzle::B128),
                    ..f32_2d(&[8, 4, 4], &[32, 128], &[8, 4, 4])
                },
            )),
            "needs swizzle 32B, not 128B",
        ),
        (
            "6-bit packed type with interleave",
            refusal(TensorMap::tiled(
                at32,
                &TiledTensor {
                    options: options(TensorInterleave::B16, TensorSwizzle::None),
                    ..TiledTensor::new(
                        TensorDataType::U6x16Align16,
                        &[128, 2, 2],
                        &[128, 256],
                        &[128, 2, 2],
                    )
                },
            )),
            "16U6_ALIGN16B takes no interleave",
        ),
        (
            "4-bit packed type with swizzle 64B",
            refusal(TensorMap::tiled(
                at32,
                &TiledTensor {
                    options: options(TensorInterleave::None, TensorSwizzle::B64),
                    ..TiledTensor::new(TensorDataType::U4x16Align16, &[128, 2], &[64], &[128, 2])
                },
            )),
            "cannot be swizzled 64B",
        ),
        (
            "NaN fill of integers",
            refusal(TensorMap::tiled(
                x.as_slice(),
                &TiledTensor {
                    options: TensorOptions {
                        oob_fill: TensorOobFill::NanRequestZeroFma,
                        ..TensorOptions::default()
                    },
                    ..TiledTensor::new(TensorDataType::U32, &[4, 4], &[16], &[4, 4])
                },
            )),
            "UINT32 is not one",
        ),
        (
            "NaN fill of a packed type",
            refusal(TensorMap::tiled(
                x.as_slice(),
                &TiledTensor {
                    options: TensorOptions {
                        oob_fill: TensorOobFill::NanRequestZeroFma,
                        ..TensorOptions::default()
                    },
                    ..TiledTensor::new(TensorDataType::U4x16Align8, &[32, 2], &[16], &[32, 2])
                },
            )),
            "16U4_ALIGN8B is not one",
        ),
        (
            "box of 0",
            refusal(TensorMap::tiled(
                x.as_slice(),
                &f32_2d(&[4, 4], &[16], &[4, 0]),
            )),
            "boxDim[1] is 0",
        ),
        (
            "box of 257",
            refusal(TensorMap::tiled(
                x.as_slice(),
                &f32_2d(&[300, 4], &[1200], &[4, 257]),
            )),
            "boxDim[1] is 257",
        ),
        (
            "packed 16-byte type, box 0 not 128",
            refusal(TensorMap::tiled(
                at32,
                &TiledTensor::new(TensorDataType::U4x16Align16, &[128, 2], &[64], &[64, 2]),
            )),
            "boxDim[0] is 64",
        ),
        (
            "inner box of 12 bytes",
            refusal(TensorMap::tiled(
                x.as_slice(),
                &f32_2d(&[4, 4], &[16], &[3, 4]),
            )),
            "12 bytes, not a multiple of 16",
        ),
        (
            "inner box wider than 128B swizzle",
            refusal(TensorMap::tiled(
                x.as_slice(),
                &TiledTensor {
                    options: options(TensorInterleave::None, TensorSwizzle::B128),
                    ..f32_2d(&[64, 4], &[256], &[64, 4])
                },
            )),
            "256 bytes, wider than the 128-byte span of swizzle 128B",
        ),
        (
            "inner box wider than 32B swizzle",
            refusal(TensorMap::tiled(
                x.as_slice(),
                &TiledTensor {
                    options: options(TensorInterleave::None, TensorSwizzle::B32),
                    ..f32_2d(&[16, 4], &[64], &[16, 4])
                },
            )),
            "64 bytes, wider than the 32-byte span of swizzle 32B",
        ),
        (
            "tensor past its memory",
            refusal(TensorMap::tiled(
                x.as_slice(),
                &f32_2d(&[1024, 65], &[4096], &[32, 4]),
            )),
            "reaches 266240 bytes from its first element; the memory it describes holds 262144",
        ),
    ];
    let pixels = |dims: &'static [u64], strides: &'static [u64]| Im2colTensor {
        data_type: TensorDataType::F32,
        dims,
        strides,
        lower_corner: &[0, 0],
        upper_corner: &[0, 0],
        channels_per_pixel: 8,
        pixels_per_column: 16,
        element_strides: &[],
        options: TensorOptions::default(),
    };
    let nhwc: &[u64] = &[8, 8, 8, 4];
    let nhwc_strides: &[u64] = &[32, 256, 2048];
    let im2col: Vec<(&str, TensorMapRefusal, &str)> = vec![
        (
            "im2col of rank 2",
            refusal(TensorMap::im2col(x.as_slice(), &pixels(&[8, 8], &[32]))),
            "tensorRank 2 is outside 3 to 5",
        ),
        (
            "corner of another length",
            refusal(TensorMap::im2col(
                x.as_slice(),
                &Im2colTensor {
                    lower_corner: &[0],
                    ..pixels(nhwc, nhwc_strides)
                },
            )),
            "pixelBoxLowerCorner has 1 value(s); a tensor of rank 4 needs 2",
        ),
        (
            "corner out of rank 4's range",
            refusal(TensorMap::im2col(
                x.as_slice(),
                &Im2colTensor {
                    upper_corner: &[0, 128],
                    ..pixels(nhwc, nhwc_strides)
                },
            )),
            "pixelBoxUpperCorner[1] is 128; a tensor of rank 4 takes -128 to 127",
        ),
        (
            "257 channels",
            refusal(TensorMap::im2col(
                x.as_slice(),
                &Im2colTensor {
                    channels_per_pixel: 257,
                    ..pixels(nhwc, nhwc_strides)
                },
            )),
            "channelsPerPixel is 257",
        ),
        (
            "1025 pixels",
            refusal(TensorMap::im2col(
                x.as_slice(),
                &Im2colTensor {
                    pixels_per_column: 1025,
                    ..pixels(nhwc, nhwc_strides)
                },
            )),
            "pixelsPerColumn is 1025",
        ),
        (
            "channels wider than 64B swizzle",
            refusal(TensorMap::im2col(
                x.as_slice(),
                &Im2colTensor {
                    channels_per_pixel: 32,
                    options: options(TensorInterleave::None, TensorSwizzle::B64),
                    ..pixels(&[32, 8, 8, 2], &[128, 1024, 8192])
                },
            )),
            "128 bytes, wider than the 64-byte span of swizzle 64B",
        ),
    ];
    for (what, reason, text) in tiled.iter().chain(&im2col) {
        let shown = AtlasError::TensorMap(reason.clone()).to_string();
        assert!(
            shown.contains(text),
            "{what}: `{shown}` does not say `{text}`"
        );
    }
    // The data of the refusals, for the rules whose text above could hide a wrong value.
    assert!(matches!(
        tiled[0].1,
        R::Rank {
            rank: 0,
            min: 1,
            max: 5
        }
    ));
    assert!(matches!(
        tiled[2].1,
        R::Rank {
            rank: 2,
            min: 3,
            max: 5
        }
    ));
    assert!(matches!(
        tiled[3].1,
        R::ArgumentLength {
            argument: TensorArgument::GlobalStrides,
            len: 2,
            rank: 2,
            expected: 1
        }
    ));
    assert!(matches!(tiled[6].1, R::GlobalAddress { align: 16, .. }));
    assert!(matches!(tiled[7].1, R::GlobalAddress { align: 32, .. }));
    assert!(matches!(
        tiled[25].1,
        R::BoxInnerBytes {
            bytes: 12,
            data_type: TensorDataType::F32
        }
    ));
    assert!(matches!(
        tiled[28].1,
        R::BeyondMemory {
            reach: 266_240,
            bytes: 262_144
        }
    ));
    // Nothing reached the driver: not even a context query.
    assert_eq!(probe().count("cuTensorMapEncodeTiled"), 0);
    assert_eq!(probe().count("cuTensorMapEncodeIm2col"), 0);
    assert_eq!(probe().count("calls"), calls, "a refusal called the driver");
}

fn a_valid_encode_is_one_driver_call() {
    let registry = hopper(0);
    let ctx = registry.ctx();
    let x = DeviceBuffer::<f32>::zeroed(ctx, registry.stream(), 64 * 1024).unwrap();
    ctx.bind().unwrap();
    let calls = probe().count("calls");
    let tiled = TensorMap::tiled(
        x.as_slice(),
        &TiledTensor {
            options: options(TensorInterleave::None, TensorSwizzle::B128),
            ..TiledTensor::new(TensorDataType::F32, &[75, 100], &[304], &[32, 16])
        },
    )
    .unwrap();
    assert_eq!(probe().count("cuTensorMapEncodeTiled"), 1);
    // The encode, and the check that the memory's context is current.
    assert_eq!(probe().count("calls") - calls, 2);
    assert_eq!(tiled.device_ptr(), x.device_ptr());
    assert_eq!(tiled.reach(), 99 * 304 + 75 * 4);
    let words = tiled.raw().opaque;
    assert_eq!(
        words[0],
        x.device_ptr(),
        "the stand-in writes the address first"
    );
    assert_eq!(&words[1..4], &[2, 75, 100]);

    let calls = probe().count("calls");
    let map = TensorMap::im2col(
        x.as_slice(),
        &Im2colTensor {
            data_type: TensorDataType::F32,
            dims: &[8, 8, 8, 4],
            strides: &[32, 256, 2048],
            lower_corner: &[-1, -1],
            upper_corner: &[-1, -1],
            channels_per_pixel: 8,
            pixels_per_column: 64,
            element_strides: &[],
            options: options(TensorInterleave::None, TensorSwizzle::B32),
        },
    )
    .unwrap();
    assert_eq!(probe().count("cuTensorMapEncodeIm2col"), 1);
    assert_eq!(probe().count("calls") - calls, 2);
    assert_eq!(map.reach(), 8 * 4 + 7 * 32 + 7 * 256 + 3 * 2048);
}

fn a_tensor_map_argument_is_checked_against_the_kernel() {
    let registry = hopper(0);
    let ctx = registry.ctx();
    let stream = &CudaStream::new(ctx).unwrap();
    let mut rng = Rng::new();
    let input: Vec<f32> = (0..64 * 64).map(|_| rng.f32()).collect();
    let x = DeviceBuffer::from_slice(ctx, stream, &input).unwrap();
    let map = TensorMap::tiled(
        x.as_slice(),
        &TiledTensor::new(TensorDataType::F32, &[64, 64], &[256], &[32, 16]),
    )
    .unwrap();
    let mut out = DeviceBuffer::from_slice(ctx, stream, &[f32::NAN; 4]).unwrap();
    let cfg = LaunchConfig {
        grid: (2, 4, 1),
        block: (128, 1, 1),
        shared_mem_bytes: 16 * 32 * 4 + 1024,
    };
    let tiles = registry.function_cached("tma", "tma_tiles").unwrap();
    // The layout the stand-in reports as the driver does: the map 128 bytes at 48.
    assert_eq!(tiles.param_sizes().unwrap(), Some(&[128, 8, 4, 4, 4][..]));
    // SAFETY: the stand-in's tma_tiles reads the map's first element and writes out[0].
    unsafe { tiles.launch(stream, &cfg, (&map, &mut out, 16u32, 32u32, 0u32)) }.unwrap();
    // The descriptor reached the kernel by value: it read the tensor through it.
    assert_eq!(out.to_vec(stream).unwrap()[0], input[0]);
    // Once the kernel's facts are read (the first launch), a launch on a created stream (which
    // names its context) is one driver call.
    let calls = probe().count("calls");
    // SAFETY: as above.
    unsafe { tiles.launch(stream, &cfg, (&map, &mut out, 16u32, 32u32, 0u32)) }.unwrap();
    assert_eq!(
        probe().count("calls") - calls,
        1,
        "one cuLaunchKernel, nothing else"
    );
    assert_eq!(probe().launches(), 2);

    // A kernel of the same sizes whose 128-byte parameter is not 64-byte aligned in the bank.
    let misplaced = registry.function_cached("tma", "tma_misplaced").unwrap();
    // SAFETY: refused before the launch.
    let e = unsafe { misplaced.launch(stream, &cfg, (&map, &mut out, 16u32, 32u32, 0u32)) }
        .unwrap_err();
    match &e {
        AtlasError::InvalidLaunch {
            reason:
                LaunchRefusal::ParamAlignment {
                    index: 0,
                    align: 64,
                    offset: 0,
                    bank_offset: 0x210,
                },
            ..
        } => {}
        other => panic!("expected the alignment refusal, got {other}"),
    }
    assert!(
        e.to_string()
            .contains("argument 0 needs a parameter aligned to 64 bytes"),
        "{e}"
    );
    // The same 128 bytes as a plain array need no alignment: launched. A launch remembers the
    // argument types that last fit, and the map's are other types: refused again after it.
    let mut plain = [0u64; 16];
    plain[0] = x.device_ptr();
    // SAFETY: the stand-in's kernel reads the tensor's first element through the address in the
    // array's first word (x's) and writes out[0].
    unsafe { misplaced.launch(stream, &cfg, (plain, &mut out, 16u32, 32u32, 0u32)) }.unwrap();
    // SAFETY: refused before the launch.
    let again = unsafe { misplaced.launch(stream, &cfg, (&map, &mut out, 16u32, 32u32, 0u32)) };
    assert!(
        matches!(
            again,
            Err(AtlasError::InvalidLaunch {
                reason: LaunchRefusal::ParamAlignment { index: 0, .. },
                ..
            })
        ),
        "{again:?}"
    );
    // A kernel whose parameters are of other sizes.
    let demo = AtlasRegistry::load(0, ptx_for_model("demo").unwrap()).unwrap();
    let scale = demo.function_cached("elementwise", "scale").unwrap();
    // SAFETY: refused before the launch.
    let e = unsafe { scale.launch(stream, &cfg, (&map, 2.0f32, 4u32)) }.unwrap_err();
    match e {
        AtlasError::InvalidLaunch {
            reason: LaunchRefusal::Arguments {
                expected, given, ..
            },
            ..
        } => {
            assert_eq!(
                (&expected[..], &given[..]),
                (&[8, 4, 4][..], &[128, 4, 4][..])
            );
        }
        other => panic!("expected the size refusal, got {other}"),
    }
    // A map of device 1's memory given to a kernel of device 0.
    let other = hopper(1);
    let y = DeviceBuffer::<f32>::zeroed(other.ctx(), other.stream(), 64 * 64).unwrap();
    let foreign = TensorMap::tiled(
        y.as_slice(),
        &TiledTensor::new(TensorDataType::F32, &[64, 64], &[256], &[32, 16]),
    )
    .unwrap();
    // SAFETY: refused before the launch.
    let e = unsafe { tiles.launch(stream, &cfg, (&foreign, &mut out, 16u32, 32u32, 0u32)) }
        .unwrap_err();
    match e {
        AtlasError::WrongDevice {
            what,
            expected: 0,
            given: Some(1),
            ..
        } => assert_eq!(what, "argument 0"),
        other => panic!("expected the device refusal, got {other}"),
    }
    // Two launches of the map and one of the plain array reached the driver, no refusal.
    assert_eq!(probe().launches(), 3, "a refusal reached the driver");
    assert_eq!(probe().count("context_mismatch"), 0);
}

fn a_tensor_map_follows_its_memory_only_within_its_context() {
    let registry = hopper(0);
    let (ctx, stream) = (registry.ctx(), registry.stream());
    let x = DeviceBuffer::from_slice(ctx, stream, &vec![1.0f32; 64 * 64]).unwrap();
    let y = DeviceBuffer::from_slice(ctx, stream, &vec![2.0f32; 64 * 64]).unwrap();
    let short = DeviceBuffer::<f32>::zeroed(ctx, stream, 64 * 63).unwrap();
    let other = hopper(1);
    let foreign = DeviceBuffer::<f32>::zeroed(other.ctx(), other.stream(), 64 * 64).unwrap();
    let tensor = TiledTensor::new(TensorDataType::F32, &[64, 64], &[256], &[32, 16]);
    let mut map = TensorMap::tiled(x.as_slice(), &tensor).unwrap();
    let mut out = DeviceBuffer::from_slice(ctx, stream, &[f32::NAN]).unwrap();
    let tiles = registry.function_cached("tma", "tma_tiles").unwrap();
    let cfg = LaunchConfig {
        grid: (1, 1, 1),
        block: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut run = |map: &TensorMap<'_>| {
        // SAFETY: the stand-in's tma_tiles reads the map's first element and writes out[0].
        unsafe { tiles.launch(stream, &cfg, (map, &mut out, 16u32, 32u32, 0u32)) }.unwrap();
        out.to_vec(stream).unwrap()[0]
    };
    assert_eq!(run(&map), 1.0);
    map.set_memory(y.as_slice()).unwrap();
    assert_eq!(probe().count("cuTensorMapReplaceAddress"), 1);
    assert_eq!(map.device_ptr(), y.device_ptr());
    assert_eq!(run(&map), 2.0);
    match map.set_memory(short.as_slice()).unwrap_err() {
        AtlasError::TensorMap(TensorMapRefusal::BeyondMemory {
            reach: 16_384,
            bytes: 16_128,
        }) => {}
        other => panic!("expected the memory refusal, got {other}"),
    }
    match map.set_memory(foreign.as_slice()).unwrap_err() {
        AtlasError::WrongContext {
            expected: Some(0),
            given: Some(1),
            ..
        } => {}
        other => panic!("expected the context refusal, got {other}"),
    }
    match map.set_memory(x.range(1..).unwrap()).unwrap_err() {
        AtlasError::TensorMap(TensorMapRefusal::GlobalAddress { align: 16, .. }) => {}
        other => panic!("expected the alignment refusal, got {other}"),
    }
    assert_eq!(
        probe().count("cuTensorMapReplaceAddress"),
        1,
        "a refusal reached the driver"
    );
    // Refused moves leave the descriptor where it was.
    assert_eq!(run(&map), 2.0);
}

fn the_cubin_places_the_map_without_param_info() {
    let registry = AtlasRegistry::load(0, cubin_for_model("hopper", 90).unwrap()).unwrap();
    let tiles = registry.function_cached("tma", "tma_tiles").unwrap();
    // Read from the cubin's records: the map lies at 48, 64-byte aligned in sm_90's bank.
    assert_eq!(tiles.param_sizes().unwrap(), Some(&[128, 8, 4, 4, 4][..]));
    let (ctx, stream) = (registry.ctx(), registry.stream());
    let x = DeviceBuffer::from_slice(ctx, stream, &vec![3.0f32; 64 * 64]).unwrap();
    let map = TensorMap::tiled(
        x.as_slice(),
        &TiledTensor::new(TensorDataType::F32, &[64, 64], &[256], &[32, 16]),
    )
    .unwrap();
    let mut out = DeviceBuffer::from_slice(ctx, stream, &[f32::NAN]).unwrap();
    let cfg = LaunchConfig::for_elements(1, 128);
    // SAFETY: the stand-in's tma_tiles reads the map's first element and writes out[0].
    unsafe { tiles.launch(stream, &cfg, (&map, &mut out, 16u32, 32u32, 0u32)) }.unwrap();
    assert_eq!(out.to_vec(stream).unwrap()[0], 3.0);
    // The PTX cannot say where the map lies (its offset depends on the architecture): without the
    // driver's word a typed launch from it is refused, naming why.
    let from_ptx = hopper(0);
    let tiles = from_ptx.function_cached("tma", "tma_tiles").unwrap();
    // SAFETY: refused before the launch.
    let e =
        unsafe { tiles.launch(stream, &cfg, (&map, &mut out, 16u32, 32u32, 0u32)) }.unwrap_err();
    assert!(matches!(e, AtlasError::ParamsUnknown { .. }), "{e}");
    assert!(e.to_string().contains("aligned to 64 bytes"), "{e}");
    assert_eq!(probe().launches(), 1);
}

fn an_older_device_has_no_tensor_maps() {
    let registry = hopper(0);
    let x = DeviceBuffer::<f32>::zeroed(registry.ctx(), registry.stream(), 64 * 64).unwrap();
    let e = refusal(TensorMap::tiled(
        x.as_slice(),
        &TiledTensor::new(TensorDataType::F32, &[64, 64], &[256], &[32, 16]),
    ));
    assert_eq!(
        e,
        TensorMapRefusal::DeviceUnsupported {
            device: 0,
            compute_capability: (8, 0)
        }
    );
    assert_eq!(probe().count("cuTensorMapEncodeTiled"), 0);
}

// ---------------------------------------------------------------------------------------------
// GPU
// ---------------------------------------------------------------------------------------------

/// The `hopper` model's cubins for device 0 (which must be sm_90: TMA is in that cubin).
fn hopper_on_gpu() -> AtlasRegistry {
    let host = atlas_registry::host(0).unwrap_or_else(|e| panic!("{NEEDS_GPU}: {e}"));
    assert_eq!(
        host.compute_capability().0,
        9,
        "these tests load the sm_90 cubin of tma_tiles"
    );
    AtlasRegistry::load(0, device_cubins("hopper")).unwrap()
}

/// A matrix of `rows` × `cols` floats whose rows are `pitch` floats apart (the padding NaN), of
/// eighths in [-64, 64): sums of up to 2^16 of them are exact in `f32` in any order.
fn matrix(rng: &mut Rng, rows: usize, cols: usize, pitch: usize) -> Vec<f32> {
    let mut m = vec![f32::NAN; rows * pitch];
    for r in 0..rows {
        for c in 0..cols {
            m[r * pitch + c] = (rng.below(1024) as f32 - 512.0) / 8.0;
        }
    }
    m
}

/// What `tma_tiles` must write for boxes of `box_rows` × `box_cols` over the matrix: the sums
/// of the tiles, then the tiles (elements outside the matrix `fill`).
fn expected_tiles(
    m: &[f32],
    (rows, cols, pitch): (usize, usize, usize),
    (box_rows, box_cols): (usize, usize),
    (tiles_x, tiles_y): (usize, usize),
    fill: f32,
) -> (Vec<f32>, Vec<f32>) {
    let mut sums = Vec::new();
    let mut tiles = Vec::new();
    for ty in 0..tiles_y {
        for tx in 0..tiles_x {
            let mut sum = 0.0f32;
            for r in 0..box_rows {
                for c in 0..box_cols {
                    let (y, x) = (ty * box_rows + r, tx * box_cols + c);
                    let v = if y < rows && x < cols {
                        m[y * pitch + x]
                    } else {
                        fill
                    };
                    tiles.push(v);
                    sum += v;
                }
            }
            sums.push(sum);
        }
    }
    (sums, tiles)
}

/// Same bits, NaN equal to NaN.
fn same(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g == w || (g.is_nan() && w.is_nan()),
            "{what}: element {i}: got {g}, want {w}"
        );
    }
}

/// Runs `tma_tiles` over a fresh 100 × 75 matrix (rows 76 floats apart) with boxes of
/// `box_rows` × `box_cols`, `swizzle` and `fill`, and checks every tile and sum against the CPU.
fn tiles_against_the_cpu(
    registry: &AtlasRegistry,
    stream: &CudaStream,
    rng: &mut Rng,
    (box_rows, box_cols): (u32, u32),
    swizzle: TensorSwizzle,
    oob_fill: TensorOobFill,
) {
    let (rows, cols, pitch) = (100usize, 75usize, 76usize);
    let m = matrix(rng, rows, cols, pitch);
    let x = DeviceBuffer::from_slice(registry.ctx(), stream, &m).unwrap();
    let dims = [cols as u64, rows as u64];
    let strides = [(pitch * 4) as u64];
    let boxes = [box_cols, box_rows];
    let map = TensorMap::tiled(
        x.as_slice(),
        &TiledTensor {
            options: TensorOptions {
                swizzle,
                oob_fill,
                ..TensorOptions::default()
            },
            ..TiledTensor::new(TensorDataType::F32, &dims, &strides, &boxes)
        },
    )
    .unwrap();
    let (bx, by) = (box_cols as usize, box_rows as usize);
    let (tiles_x, tiles_y) = (cols.div_ceil(bx), rows.div_ceil(by));
    let count = tiles_x * tiles_y;
    let mut out = DeviceBuffer::from_slice(
        registry.ctx(),
        stream,
        &vec![f32::NAN; count * (1 + bx * by)],
    )
    .unwrap();
    let kernel = registry.function_cached("tma", "tma_tiles").unwrap();
    let cfg = LaunchConfig {
        grid: (tiles_x as u32, tiles_y as u32, 1),
        block: (128, 1, 1),
        shared_mem_bytes: box_rows * box_cols * 4 + 1024,
    };
    let mode = match swizzle {
        TensorSwizzle::None => 0u32,
        TensorSwizzle::B128 => 3,
        other => panic!("the test reads back swizzles none and 128B, not {other}"),
    };
    // SAFETY: tma_tiles loads boxes of the tensor `map` describes (in `x`) and writes `count`
    // sums and boxes to `out`, which holds exactly that; `to_vec` waits for it.
    unsafe { kernel.launch(stream, &cfg, (&map, &mut out, box_rows, box_cols, mode)) }.unwrap();
    let got = out.to_vec(stream).unwrap();
    let fill = match oob_fill {
        TensorOobFill::Zero => 0.0,
        _ => f32::NAN,
    };
    let (sums, tiles) = expected_tiles(&m, (rows, cols, pitch), (by, bx), (tiles_x, tiles_y), fill);
    let what = format!("boxes {box_rows}x{box_cols}, swizzle {swizzle}, fill {oob_fill:?}");
    same(&got[count..], &tiles, &format!("{what}: tiles"));
    same(&got[..count], &sums, &format!("{what}: sums"));
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn tma_tiles_of_every_box_swizzle_and_fill_match_the_cpu() {
    let registry = hopper_on_gpu();
    let stream = CudaStream::new(registry.ctx()).unwrap();
    let mut rng = Rng::new();
    // Neither box divides the 100 × 75 matrix: every edge tile is partly outside it.
    for boxes in [(16, 32), (7, 32)] {
        for swizzle in [TensorSwizzle::None, TensorSwizzle::B128] {
            tiles_against_the_cpu(
                &registry,
                &stream,
                &mut rng,
                boxes,
                swizzle,
                TensorOobFill::Zero,
            );
        }
    }
    // A box of 12 floats (48 bytes) unswizzled, and the NaN fill.
    tiles_against_the_cpu(
        &registry,
        &stream,
        &mut rng,
        (5, 12),
        TensorSwizzle::None,
        TensorOobFill::Zero,
    );
    tiles_against_the_cpu(
        &registry,
        &stream,
        &mut rng,
        (16, 32),
        TensorSwizzle::B128,
        TensorOobFill::NanRequestZeroFma,
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_captured_tma_launch_moved_to_another_buffer_replays_it() {
    let registry = hopper_on_gpu();
    let mut stream = CudaStream::new(registry.ctx()).unwrap();
    let mut rng = Rng::new();
    let (rows, cols, pitch) = (100usize, 75usize, 76usize);
    let (a, b) = (
        matrix(&mut rng, rows, cols, pitch),
        matrix(&mut rng, rows, cols, pitch),
    );
    let x = DeviceBuffer::from_slice(registry.ctx(), &stream, &a).unwrap();
    let y = DeviceBuffer::from_slice(registry.ctx(), &stream, &b).unwrap();
    let (dims, strides, boxes) = (
        [cols as u64, rows as u64],
        [(pitch * 4) as u64],
        [32u32, 16],
    );
    let mut map = TensorMap::tiled(
        x.as_slice(),
        &TiledTensor {
            options: options(TensorInterleave::None, TensorSwizzle::B128),
            ..TiledTensor::new(TensorDataType::F32, &dims, &strides, &boxes)
        },
    )
    .unwrap();
    let (tiles_x, tiles_y) = (cols.div_ceil(32), rows.div_ceil(16));
    let count = tiles_x * tiles_y;
    let len = count * (1 + 16 * 32);
    let mut out = DeviceBuffer::from_slice(registry.ctx(), &stream, &vec![f32::NAN; len]).unwrap();
    let kernel = registry.function_cached("tma", "tma_tiles").unwrap();
    let cfg = LaunchConfig {
        grid: (tiles_x as u32, tiles_y as u32, 1),
        block: (128, 1, 1),
        shared_mem_bytes: 16 * 32 * 4 + 1024,
    };
    let graph = {
        let capture = stream.begin_capture().unwrap();
        // SAFETY: captured, not run: at each replay tma_tiles reads `map`'s tensor and writes
        // `count` sums and tiles to `out`; both outlive `exec`.
        unsafe { kernel.launch(&capture, &cfg, (&map, &mut out, 16u32, 32u32, 3u32)) }.unwrap();
        capture.end().unwrap()
    };
    let mut exec = graph.instantiate().unwrap();
    let check = |out: &DeviceBuffer<f32>, m: &[f32], what: &str| {
        let got = out.to_vec(&stream).unwrap();
        let (sums, tiles) =
            expected_tiles(m, (rows, cols, pitch), (16, 32), (tiles_x, tiles_y), 0.0);
        same(&got[count..], &tiles, &format!("{what}: tiles"));
        same(&got[..count], &sums, &format!("{what}: sums"));
    };
    // SAFETY: `x` and `out`, all the graph touches, outlive `exec`.
    unsafe { exec.launch(&stream) }.unwrap();
    check(&out, &a, "the captured descriptor");

    // The descriptor moved to `y`, the node updated with it: replays read `y`.
    map.set_memory(y.as_slice()).unwrap();
    out.copy_from(&stream, &vec![f32::NAN; len]).unwrap();
    // SAFETY: node 0 reads `y` through `map` and writes `out`; both outlive `exec`.
    unsafe { exec.set_kernel_args(0, &kernel, &cfg, (&map, &mut out, 16u32, 32u32, 3u32)) }
        .unwrap();
    // SAFETY: as above.
    unsafe { exec.launch(&stream) }.unwrap();
    check(&out, &b, "the moved descriptor");
    // And `x` is left alone by the update: a second replay reads `y` again.
    out.copy_from(&stream, &vec![f32::NAN; len]).unwrap();
    // SAFETY: as above.
    unsafe { exec.launch(&stream) }.unwrap();
    check(&out, &b, "a second replay");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_graph_keeps_the_memory_its_tensor_maps_describe() {
    let registry = hopper_on_gpu();
    let mut stream = CudaStream::new(registry.ctx()).unwrap();
    let mut rng = Rng::new();
    let (rows, cols, pitch) = (100usize, 75usize, 76usize);
    let a = matrix(&mut rng, rows, cols, pitch);
    let (tiles_x, tiles_y) = (cols.div_ceil(32), rows.div_ceil(16));
    let count = tiles_x * tiles_y;
    let len = count * (1 + 16 * 32);
    let mut out = DeviceBuffer::from_slice(registry.ctx(), &stream, &vec![f32::NAN; len]).unwrap();
    let kernel = registry.function_cached("tma", "tma_tiles").unwrap();
    let cfg = LaunchConfig {
        grid: (tiles_x as u32, tiles_y as u32, 1),
        block: (128, 1, 1),
        shared_mem_bytes: 16 * 32 * 4 + 1024,
    };
    let exec = {
        let x = DeviceBuffer::from_slice(registry.ctx(), &stream, &a).unwrap();
        let map = TensorMap::tiled(
            x.as_slice(),
            &TiledTensor::new(
                TensorDataType::F32,
                &[cols as u64, rows as u64],
                &[(pitch * 4) as u64],
                &[32, 16],
            ),
        )
        .unwrap();
        let capture = stream.begin_capture().unwrap();
        // SAFETY: captured, not run: at each replay tma_tiles reads the tensor of `map` (its
        // memory the graph keeps) and writes `count` sums and tiles to `out`, which outlives `exec`.
        unsafe { kernel.launch(&capture, &cfg, (&map, &mut out, 16u32, 32u32, 0u32)) }.unwrap();
        capture.end().unwrap().instantiate().unwrap()
        // `map` and `x` are dropped here: the graph keeps x's memory.
    };
    // SAFETY: `out` outlives `exec`; the tensor's memory is the graph's to keep.
    unsafe { exec.launch(&stream) }.unwrap();
    let got = out.to_vec(&stream).unwrap();
    let (sums, tiles) = expected_tiles(&a, (rows, cols, pitch), (16, 32), (tiles_x, tiles_y), 0.0);
    same(&got[count..], &tiles, "tiles of the dropped buffer");
    same(&got[..count], &sums, "sums of the dropped buffer");
}
