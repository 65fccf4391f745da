//! A typed launch whose arguments do not fit the kernel is refused naming the first parameter they
//! disagree on: its position, what the kernel's PTX calls it and its type, the bytes on both
//! sides, the argument's Rust type and the one that would fit.
//!
//! CPU (the stand-in libcuda, in child processes): `cargo test -p atlas-registry --test
//! wrong_arguments`.

mod support;

use atlas_kernels::ptx_for_model;
use atlas_registry::{AtlasError, AtlasRegistry, DeviceBuffer, LaunchConfig, LaunchRefusal};
use support::child;
use support::standin::{self, probe};

child::bodies!(
    wrong_types_after_right_ones_are_refused,
    named_parameters_are_named,
    nvcc_parameters_are_named_by_type,
    cubin_parameters_are_named_by_size
);

/// `scale(float* x, float factor, unsigned n)` with names of its own, as a hand-written PTX text
/// declares them; the stand-in knows `scale` by name and reports its layout, [8, 4, 4].
const NAMED_SCALE: &[u8] = b"\
.version 8.0
.target sm_80
.address_size 64

.visible .entry scale(
    .param .u64 .ptr .global .align 4 x,
    .param .f32 factor,
    .param .u32 n
)
{
    ret;
}
";

/// The refusal of `launch`, as its reason and its whole text; the driver never saw the launch.
fn refusal(launch: atlas_registry::Result<()>) -> (LaunchRefusal, String) {
    let e = launch.unwrap_err();
    assert_eq!(probe().launches(), 0, "refused before the driver: {e}");
    let text = e.to_string();
    match e {
        AtlasError::InvalidLaunch { reason, .. } => (reason, text),
        other => panic!("expected a refused launch, got {other:?}"),
    }
}

#[test]
fn arguments_of_other_types_after_a_launch_that_fit_are_checked_again() {
    standin::run(wrong_types_after_right_ones_are_refused, &[]);
}

/// A kernel remembers the argument types of its last launch that fit, so that a launch with the
/// same types skips comparing them; other types are compared again, each time.
fn wrong_types_after_right_ones_are_refused() {
    let registry = AtlasRegistry::load(0, &[("handmade", NAMED_SCALE)]).unwrap();
    let scale = registry.function("handmade", "scale").unwrap();
    let stream = registry.stream();
    let cfg = LaunchConfig::for_elements(256, 256);
    let mut x = DeviceBuffer::<f32>::alloc(registry.ctx(), 256).unwrap();
    for round in 1..=3 {
        // SAFETY: the stand-in's `scale` scales the 256 floats of `x`.
        unsafe { scale.launch(stream, &cfg, (&mut x, 2.0f32, 256u32)) }.unwrap();
        assert_eq!(probe().launches(), round);
        // SAFETY: refused before the driver is called (an 8-byte `usize` for a 4-byte parameter).
        let wrong = unsafe { scale.launch(stream, &cfg, (&mut x, 2.0f32, 256usize)) };
        assert!(
            matches!(
                wrong,
                Err(AtlasError::InvalidLaunch {
                    reason: LaunchRefusal::Arguments { .. },
                    ..
                })
            ),
            "round {round}: {wrong:?}"
        );
        // SAFETY: as the first refusal (an `f64` for a 4-byte `float`).
        let wrong = unsafe { scale.launch(stream, &cfg, (&mut x, 2.0f64, 256u32)) };
        assert!(wrong.is_err(), "round {round}: {wrong:?}");
        assert_eq!(probe().launches(), round, "refused before the driver");
    }
}

#[test]
fn a_wrong_argument_of_a_named_ptx_parameter_is_named_with_the_type_that_fits() {
    standin::run(named_parameters_are_named, &[]);
}

fn named_parameters_are_named() {
    let registry = AtlasRegistry::load(0, &[("handmade", NAMED_SCALE)]).unwrap();
    let scale = registry.function("handmade", "scale").unwrap();
    let stream = registry.stream();
    let cfg = LaunchConfig::for_elements(256, 256);
    let mut x = DeviceBuffer::<f32>::alloc(registry.ctx(), 256).unwrap();
    let n: usize = 256;

    // SAFETY: refused before the driver is called (an 8-byte `usize` for a 4-byte parameter).
    let (reason, text) = refusal(unsafe { scale.launch(stream, &cfg, (&mut x, 2.0f32, n)) });
    let LaunchRefusal::Arguments { first, .. } = reason else {
        panic!("expected an argument refusal: {text}");
    };
    assert_eq!(
        (first.index, first.expected, first.given),
        (2, Some(4), Some(8))
    );
    assert_eq!(first.given_type, Some("usize"));
    assert_eq!(first.ptx_name.as_deref(), Some("n"));
    assert_eq!(first.ptx_type.as_deref(), Some(".u32"));
    assert_eq!(first.fits, "a `u32`");
    assert!(
        text.contains(
            "argument 2 is 8 byte(s) (`usize`), but parameter 2 (`n`, `.u32` in the PTX) takes 4: \
             pass a `u32`"
        ) && text.contains("sizes [8, 4, 4] bytes, the launch gives 3 of sizes [8, 4, 8]"),
        "{text}"
    );

    // A missing argument names the parameter it leaves out.
    // SAFETY: refused before the driver is called (two arguments for three parameters).
    let (_, text) = refusal(unsafe { scale.launch(stream, &cfg, (&mut x, 2.0f32)) });
    assert!(
        text.contains(
            "parameter 2 (`n`, `.u32` in the PTX, 4 byte(s)) has no argument: pass a `u32`"
        ),
        "{text}"
    );

    // A double for a float, and a buffer's place taken by a number.
    // SAFETY: refused before the driver is called.
    let (_, text) = refusal(unsafe { scale.launch(stream, &cfg, (&mut x, 2.0f64, 256u32)) });
    assert!(
        text.contains("parameter 1 (`factor`, `.f32` in the PTX) takes 4: pass an `f32`"),
        "{text}"
    );
    // SAFETY: refused before the driver is called.
    let (_, text) = refusal(unsafe { scale.launch(stream, &cfg, (7u32, 2.0f32, 256u32)) });
    assert!(
        text.contains(
            "argument 0 is 4 byte(s) (`u32`), but parameter 0 (`x`, `.u64 .ptr` in the PTX) \
             takes 8: pass a buffer (`&buf`, `&mut buf`) or a view"
        ),
        "{text}"
    );

    // One argument too many names its Rust type without its path.
    let y = DeviceBuffer::<f32>::alloc(registry.ctx(), 256).unwrap();
    // SAFETY: refused before the driver is called.
    let (_, text) = refusal(unsafe { scale.launch(stream, &cfg, (&mut x, 2.0f32, 256u32, &y)) });
    assert!(
        text.contains("argument 3 (`&DeviceBuffer<f32>`, 8 byte(s)) has no parameter"),
        "{text}"
    );
}

#[test]
fn a_wrong_argument_of_an_nvcc_kernel_is_named_by_its_ptx_type() {
    standin::run(nvcc_parameters_are_named_by_type, &[]);
}

fn nvcc_parameters_are_named_by_type() {
    // nvcc calls every parameter `KERNEL_param_N`: the type is what the PTX adds.
    let text = usize_for_scales_count(ptx_for_model("demo").unwrap());
    assert!(
        text.contains(
            "argument 2 is 8 byte(s) (`usize`), but parameter 2 (`.u32` in the PTX) takes 4: \
             pass a `u32`"
        ),
        "{text}"
    );
}

#[test]
fn a_wrong_argument_of_a_cubin_kernel_is_named_by_size() {
    standin::run(cubin_parameters_are_named_by_size, &[]);
}

fn cubin_parameters_are_named_by_size() {
    // A cubin says where parameters lie, not what they are: the sizes say what may fit.
    let text = usize_for_scales_count(support::blobs::device_cubins("demo"));
    assert!(
        text.contains(
            "argument 2 is 8 byte(s) (`usize`), but parameter 2 takes 4: pass a `u32`, `i32` or \
             `f32`"
        ),
        "{text}"
    );
}

/// The refusal's text of `elementwise::scale` of `blobs` launched with a `usize` for its
/// `unsigned` count.
fn usize_for_scales_count(blobs: &[(&str, &[u8])]) -> String {
    let registry = AtlasRegistry::load(0, blobs).unwrap();
    let scale = registry.function("elementwise", "scale").unwrap();
    let mut x = DeviceBuffer::<f32>::alloc(registry.ctx(), 256).unwrap();
    let cfg = LaunchConfig::for_elements(256, 256);
    // SAFETY: refused before the driver is called.
    let (_, text) =
        refusal(unsafe { scale.launch(registry.stream(), &cfg, (&mut x, 2.0f32, 256usize)) });
    text
}
