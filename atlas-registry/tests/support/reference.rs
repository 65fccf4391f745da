//! CPU references for what the kernels compute, and checks of a kernel's output against them on
//! fresh random data with poisoned (NaN) memory around it.

use atlas_registry::{AtlasRegistry, DeviceBuffer, FunctionCache, LaunchConfig};

use super::rng::Rng;

/// Asserts two float slices agree to a relative tolerance, naming the first mismatch.
pub fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * w.abs().max(1.0),
            "{what}: element {i}: got {g}, want {w}"
        );
    }
}

/// Runs `module::scale` of `registry` over `n` fresh random floats followed by a NaN tail, and
/// checks the first `n` against the CPU (to `tol`, relative) and that the tail stayed NaN.
pub fn scale_with_nan_tail(registry: &AtlasRegistry, module: &str, n: usize, tol: f32, what: &str) {
    const TAIL: usize = 61;
    let mut rng = Rng::new();
    let input = rng.vec(n);
    let factor = rng.f32() * 4.0;
    let mut host = input.clone();
    host.extend([f32::NAN; TAIL]);
    let stream = registry.stream();
    let mut x = DeviceBuffer::from_slice(registry.ctx(), stream, &host).unwrap();
    let scale = registry.function_cached(module, "scale").unwrap();
    let cfg = LaunchConfig::for_elements(n as u32, 256);
    // SAFETY: `x` holds `n + TAIL` floats and `scale` touches the first `n` (the NaN tail checks
    // its bound); `x` lives until `to_vec` below has waited for the launch on the same stream.
    unsafe { scale.launch(stream, &cfg, (&mut x, factor, n as u32)) }.unwrap();
    let got = x.to_vec(stream).unwrap();
    let want: Vec<f32> = input.iter().map(|v| v * factor).collect();
    assert_close(&got[..n], &want, tol, what);
    if let Some(i) = got[n..].iter().position(|v| !v.is_nan()) {
        panic!(
            "{what}: element {} past n was written: {}",
            n + i,
            got[n + i]
        );
    }
}

/// Runs `elementwise::scale` of `registry` on fresh random data and checks every element against
/// the CPU bit for bit, and that nothing past `n` (poisoned with NaN) was written.
pub fn scale_and_check(registry: &AtlasRegistry, rng: &mut Rng) {
    let stream = registry.stream();
    let n = 1000 + rng.index(4000);
    let input = rng.f32s(n, -1000.0, 1000.0);
    let factor = rng.f32_in(1.5, 4.0);
    let mut poisoned = input.clone();
    poisoned.extend(std::iter::repeat_n(f32::NAN, 61));
    let mut x = DeviceBuffer::from_slice(registry.ctx(), stream, &poisoned).expect("upload");
    let scale = registry
        .function_cached("elementwise", "scale")
        .expect("elementwise::scale");
    // SAFETY: `x` holds `n` floats and 61 NaNs after them; `scale` touches the first `n`. It
    // outlives the launch (`to_vec` below synchronizes the stream).
    unsafe {
        scale.launch(
            stream,
            &LaunchConfig::for_elements(n as u32, 256),
            (&mut x, factor, n as u32),
        )
    }
    .expect("launch elementwise::scale");
    let out = x.to_vec(stream).expect("download");
    for (i, (&got, &given)) in out.iter().zip(&input).enumerate() {
        let want = given * factor;
        assert_eq!(
            got.to_bits(),
            want.to_bits(),
            "element {i}: {given} * {factor} = {want}, the GPU says {got}"
        );
    }
    assert!(
        out[n..].iter().all(|v| v.is_nan()),
        "scale wrote past its {n} elements"
    );
}

/// `model`'s `transform` (model_a: `x * 2 + 1`, model_b: `x * -3 + 0.5`) on the CPU.
pub fn transform_reference(model: &str, x: f32) -> f32 {
    match model {
        "model_a" => x.mul_add(2.0, 1.0),
        "model_b" => x.mul_add(-3.0, 0.5),
        other => panic!("no reference for {other}"),
    }
}

/// Runs `model::transform` of `registry` (loaded from `model`) on fresh data into a NaN-poisoned
/// output and checks it against the CPU: a kernel of another model would give other numbers.
pub fn transform_and_check(registry: &AtlasRegistry, model: &str, rng: &mut Rng) {
    static TRANSFORM: FunctionCache = FunctionCache::new("model", "transform");
    let stream = registry.stream();
    let n = 64 + rng.index(512);
    let input = rng.f32s(n, -100.0, 100.0);
    let x = DeviceBuffer::from_slice(registry.ctx(), stream, &input).expect("upload");
    let mut out =
        DeviceBuffer::from_slice(registry.ctx(), stream, &vec![f32::NAN; n]).expect("poison");
    // SAFETY: `x` and `out` each hold `n` floats, all that transform reads and writes; both
    // outlive the launch (`to_vec` below synchronizes the stream).
    unsafe {
        TRANSFORM.get(registry).expect("model::transform").launch(
            stream,
            &LaunchConfig::for_elements(n as u32, 128),
            (&x, &mut out, n as u32),
        )
    }
    .expect("launch model::transform");
    let got = out.to_vec(stream).expect("download");
    for (i, (&g, &x)) in got.iter().zip(&input).enumerate() {
        let want = transform_reference(model, x);
        assert_eq!(g.to_bits(), want.to_bits(), "{model} element {i}: {x}");
    }
}
