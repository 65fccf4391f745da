//! Launch configurations: the check against the device's limits refuses exactly the
//! configurations that break one, naming it, before `cuLaunchKernel`; on a GPU, refused launches
//! leave the data untouched and the largest legal ones work.
//!
//! GPU: `cargo test -p atlas-registry --test launch_limits -- --include-ignored`. The check itself
//! is tested without a GPU next to it, in `src/launch/config.rs`.

mod support;

use atlas_kernels::ptx_for_model;
use atlas_registry::{
    AtlasError, AtlasRegistry, DeviceBuffer, LaunchConfig, LaunchRefusal, device_count,
};
use support::blobs::load;
use support::reference::scale_and_check;
use support::rng::Rng;

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
            matches!(&e, AtlasError::InvalidLaunch { reason: LaunchRefusal::Arguments { expected, given, .. }, .. } if expected.len() == 3 && given.len() == 2),
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
