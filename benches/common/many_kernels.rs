//! The source of a model of many small kernels, shared by the compile-cache and cold-start
//! benches: `k0` .. `k{n-1}`, each writing its own slot (`out[i] = i + 1`), so that a launch of
//! every kernel is checked by one copy back.

/// CUDA C++ for `n` kernels `extern "C" __global__ void k{i}(float *out)`.
pub(crate) fn source(n: usize) -> String {
    let mut text = String::with_capacity(n * 96);
    for i in 0..n {
        text.push_str(&format!(
            "extern \"C\" __global__ void k{i}(float *out) {{ if (threadIdx.x == 0) out[{i}] = {i}.0f + 1.0f; }}\n"
        ));
    }
    text
}
