//! Launch configurations: the check against the device's limits refuses exactly the
//! configurations that break one, naming it, before `cuLaunchKernel`; on a GPU, refused launches
//! leave the data untouched and the largest legal ones work.
//!
//! CPU: `cargo test -p atlas-registry --test launch_limits`. GPU:
//! `cargo test -p atlas-registry --test launch_limits -- --include-ignored`.

mod support;

use atlas_kernels::ptx_for_model;
use atlas_registry::{
    AtlasError, AtlasRegistry, DeviceBuffer, DeviceLimits, LaunchConfig, LaunchRefusal,
    device_count,
};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use support::blobs::load;
use support::reference::scale_and_check;
use support::rng::Rng;

proptest! {
    // Cases: 256 by default, `PROPTEST_CASES` for more. A failure is saved beside this file, in
    // `launch_limits.proptest-regressions`, and tried first on later runs.
    #![proptest_config(ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    /// Any launch configuration: the check never panics, and refuses exactly the ones that break
    /// a limit, naming it.
    #[test]
    fn launch_check_refuses_exactly_what_breaks_a_limit(
        grid in (dim(), dim(), dim()),
        block in (dim(), dim(), dim()),
        shared_mem_bytes in prop_oneof![Just(0u32), Just(48 * 1024), Just(232_448), Just(232_449), any::<u32>()],
    ) {
        let limits = h200_limits();
        let cfg = LaunchConfig { grid, block, shared_mem_bytes };
        match limits.check(&cfg) {
            Ok(()) => prop_assert!(fits(&limits, &cfg), "{cfg:?} passed the check"),
            Err(reason) => {
                prop_assert!(!fits(&limits, &cfg), "{cfg:?} refused: {reason}");
                prop_assert!(
                    ["grid", "block", "shared memory"].iter().any(|w| reason.to_string().contains(w)),
                    "the reason names no limit: {reason}"
                );
            }
        }
    }
}

/// Launch dimensions, edges included.
fn dim() -> impl Strategy<Value = u32> {
    prop_oneof![
        Just(0u32),
        Just(1),
        Just(64),
        Just(1024),
        Just(1025),
        Just(65535),
        Just(65536),
        1..=4096u32,
        any::<u32>(),
    ]
}

/// An H200's launch limits.
fn h200_limits() -> DeviceLimits {
    DeviceLimits {
        max_threads_per_block: 1024,
        max_block: (1024, 1024, 64),
        max_grid: (i32::MAX as u32, 65535, 65535),
        max_shared_mem_optin: 232_448,
        multiprocessors: 132,
        cluster_launch: true,
        cooperative_launch: true,
        stream_priorities: (0, -5),
    }
}

/// Whether `cfg` fits `l`, written from the CUDA limits.
fn fits(l: &DeviceLimits, cfg: &LaunchConfig) -> bool {
    let (g, b) = (cfg.grid, cfg.block);
    let dims = [g.0, g.1, g.2, b.0, b.1, b.2];
    dims.iter().all(|&d| d > 0)
        && b.0 <= l.max_block.0
        && b.1 <= l.max_block.1
        && b.2 <= l.max_block.2
        && u64::from(b.0) * u64::from(b.1) * u64::from(b.2) <= u64::from(l.max_threads_per_block)
        && g.0 <= l.max_grid.0
        && g.1 <= l.max_grid.1
        && g.2 <= l.max_grid.2
        && cfg.shared_mem_bytes <= l.max_shared_mem_optin
}

#[test]
fn bad_launch_configurations_name_the_limit() {
    let l = h200_limits();
    let ok = LaunchConfig::for_elements(1 << 20, 256);
    assert_eq!(l.check(&ok), Ok(()));
    let cases = [
        (
            LaunchConfig {
                block: (2048, 1, 1),
                ..ok
            },
            "largest block dimensions (1024, 1024, 64)",
        ),
        (
            LaunchConfig {
                block: (64, 32, 1),
                ..ok
            },
            "2048 threads, more than the device's 1024",
        ),
        (
            LaunchConfig {
                grid: (0, 1, 1),
                ..ok
            },
            "zero dimension",
        ),
        (
            LaunchConfig {
                grid: (1, 65536, 1),
                ..ok
            },
            "largest grid dimensions",
        ),
        (
            ok.with_shared_mem(232_449),
            "232449 B of dynamic shared memory exceeds the device's maximum of 232448 B",
        ),
    ];
    for (cfg, says) in cases {
        let reason = l.check(&cfg).unwrap_err();
        assert!(reason.to_string().contains(says), "{cfg:?}: {reason}");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn bad_launches_are_refused_before_the_driver_naming_the_limit() {
    let mut rng = Rng::new();
    let registry = load("demo");
    let limits = registry.host().limits().clone();
    println!("device 0 limits: {limits:?}");
    let stream = registry.stream();
    let n = 4096u32;
    let input = rng.f32s(n as usize, -10.0, 10.0);
    let mut x = DeviceBuffer::from_slice(registry.ctx(), stream, &input).expect("upload");
    let scale = registry
        .function_cached("elementwise", "scale")
        .expect("elementwise::scale");
    let raw = registry
        .raw_function_cached("elementwise", "scale")
        .expect("raw elementwise::scale");
    let ok = LaunchConfig::for_elements(n, 256);
    let max_shared = limits.max_shared_mem_optin;
    let cases = [
        (
            LaunchConfig {
                block: (2048, 1, 1),
                ..ok
            },
            "block (2048, 1, 1)".to_string(),
        ),
        (
            LaunchConfig {
                block: (32, 32, 2),
                ..ok
            },
            format!(
                "2048 threads, more than the device's {}",
                limits.max_threads_per_block
            ),
        ),
        (
            LaunchConfig {
                grid: (0, 1, 1),
                ..ok
            },
            "grid (0, 1, 1) has a zero dimension".to_string(),
        ),
        (
            LaunchConfig {
                block: (256, 0, 1),
                ..ok
            },
            "zero dimension".to_string(),
        ),
        (
            LaunchConfig {
                grid: (1, limits.max_grid.1 + 1, 1),
                ..ok
            },
            "largest grid dimensions".to_string(),
        ),
        (
            ok.with_shared_mem(max_shared + 1),
            format!(
                "{} B of dynamic shared memory exceeds the device's maximum of {max_shared} B",
                max_shared + 1
            ),
        ),
        (
            ok.with_shared_mem(u32::MAX),
            format!("maximum of {max_shared} B"),
        ),
    ];
    for (cfg, says) in &cases {
        for e in [
            // SAFETY: refused before the driver is called (each case breaks a device limit), so
            // the kernel never runs; `x` holds the `n` floats it would touch anyway.
            unsafe { scale.launch(stream, cfg, (&mut x, 2.0f32, n)) }.unwrap_err(),
            {
                let (mut ptr, mut factor, mut len) = (x.device_ptr(), 2.0f32, n);
                let mut params: [*mut std::ffi::c_void; 3] = [
                    (&raw mut ptr).cast(),
                    (&raw mut factor).cast(),
                    (&raw mut len).cast(),
                ];
                // SAFETY: `raw` is this registry's elementwise::scale, the stream is the
                // registry's, and the three parameters are a device pointer, an f32 and a u32, as
                // the kernel takes them (the launch is refused before the driver anyway).
                unsafe { registry.launch_on_stream(raw, cfg, stream.raw(), &mut params) }
                    .unwrap_err()
            },
        ] {
            match &e {
                AtlasError::InvalidLaunch { function, reason } => {
                    assert_eq!(function, "elementwise::scale");
                    assert!(
                        matches!(reason, LaunchRefusal::Limit(_))
                            && reason.to_string().contains(says.as_str()),
                        "{cfg:?}: {reason}"
                    );
                }
                other => panic!("{cfg:?}: expected InvalidLaunch, got {other:?}"),
            }
        }
    }
    // Wrong arguments for the kernel (when the driver can tell its parameters).
    if scale.param_sizes().expect("param sizes").is_some() {
        // SAFETY: refused before the driver is called (two arguments for three parameters), so
        // the kernel never runs.
        let e = unsafe { scale.launch(stream, &ok, (&mut x, 2.0f32)) }.unwrap_err();
        assert!(
            matches!(&e, AtlasError::InvalidLaunch { reason: LaunchRefusal::Arguments { expected, given }, .. } if expected.len() == 3 && given.len() == 2),
            "{e:?}"
        );
        // SAFETY: refused before the driver is called (an 8-byte factor for a 4-byte
        // parameter), so the kernel never runs.
        let e = unsafe { scale.launch(stream, &ok, (&mut x, 2.0f64, n)) }.unwrap_err();
        assert!(matches!(e, AtlasError::InvalidLaunch { .. }), "{e:?}");
    }
    // None of them ran: the data is as it was.
    let untouched = x.to_vec(stream).expect("download");
    assert_eq!(untouched, input, "a refused launch must not run");

    // Ordinals out of range.
    let count = device_count().expect("device count");
    for ordinal in [count, 99] {
        let e = AtlasRegistry::load(ordinal, ptx_for_model("demo").unwrap()).unwrap_err();
        assert!(
            matches!(e, AtlasError::InvalidDevice { ordinal: o, count: c } if o == ordinal && c == count),
            "{e:?}"
        );
        assert!(
            e.to_string()
                .contains(&format!("device {ordinal} does not exist")),
            "{e}"
        );
    }

    // The largest legal launch of each kind still works afterwards.
    let max_block = LaunchConfig::for_elements(n, limits.max_threads_per_block);
    // SAFETY: `x` holds `n` floats, all that `scale` touches; it outlives the launch (`to_vec`
    // below synchronizes the stream).
    unsafe { scale.launch(stream, &max_block, (&mut x, 2.0f32, n)) }.expect("a full block");
    let doubled = x.to_vec(stream).expect("download");
    for (i, (&got, &was)) in doubled.iter().zip(&input).enumerate() {
        assert_eq!(got.to_bits(), (was * 2.0).to_bits(), "element {i}");
    }
    scale_and_check(&registry, &mut rng);
}
