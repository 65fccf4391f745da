//! One library load (`cuLibraryLoadData`) serving every device.

mod support;

use atlas_kernels::ptx_for_model;
use atlas_registry::{
    AtlasError, AtlasLibrary, AtlasRegistry, DeviceBuffer, LaunchConfig, device_count,
};
use support::reference::assert_close;
use support::rng::Rng;

fn check_scale(registry: &AtlasRegistry) {
    let mut rng = Rng::new();
    let n = 70_001usize;
    let input = rng.vec(n);
    let factor = rng.f32() * 3.0;
    let stream = registry.stream();
    let mut x = DeviceBuffer::from_slice(registry.ctx(), stream, &input).unwrap();
    // SAFETY: `x` holds `n` floats of this registry's device, all that `scale` touches; it
    // outlives the launch (`to_vec` below synchronizes the stream).
    unsafe {
        atlas_registry::cached_function!(registry, "elementwise", "scale")
            .unwrap()
            .launch(
                stream,
                &LaunchConfig::for_elements(n as u32, 256),
                (&mut x, factor, n as u32),
            )
    }
    .unwrap();
    let want: Vec<f32> = input.iter().map(|v| v * factor).collect();
    assert_close(
        &x.to_vec(stream).unwrap(),
        &want,
        1e-6,
        &format!("device {}", registry.host().ordinal()),
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn library_serves_device_zero_and_outlives_its_registries() {
    let library = AtlasLibrary::load(ptx_for_model("demo").unwrap()).unwrap();
    let registry = library.registry(0).unwrap();
    check_scale(&registry);
    drop(library);
    // The registry keeps the library loaded.
    check_scale(&registry);
    let again = registry.clone();
    drop(registry);
    check_scale(&again);
}

#[test]
#[ignore = "needs two NVIDIA GPUs"]
fn two_gpus_one_library_load_serves_both() {
    assert!(device_count().unwrap() >= 2, "this test needs two GPUs");
    let library = AtlasLibrary::load(ptx_for_model("demo").unwrap()).unwrap();
    let (r0, r1) = (library.registry(0).unwrap(), library.registry(1).unwrap());
    assert_ne!(r0.ctx().raw(), r1.ctx().raw());
    for _ in 0..3 {
        check_scale(&r0);
        check_scale(&r1);
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn ptx_that_does_not_compile_fails_at_registry_with_the_jit_log() {
    // `cuLibraryLoadData` defers the JIT: the load succeeds, the first registry compiles.
    let broken: &[u8] = b".version 8.0\n.target sm_75\n.address_size 64\n\n.visible .entry broken()\n{\n    not_an_instruction;\n}\n";
    let library = AtlasLibrary::load(&[("broken", broken)]).expect("the JIT is deferred");
    match library.registry(0) {
        Err(AtlasError::ModuleLoad {
            module,
            jit_log,
            code,
            ..
        }) => {
            assert_eq!((module.as_str(), code), ("broken", 218), "{jit_log}");
            assert!(
                jit_log.contains("line "),
                "the log names the line: {jit_log}"
            );
        }
        other => panic!("expected a ModuleLoad error with the JIT log, got {other:?}"),
    }
}
