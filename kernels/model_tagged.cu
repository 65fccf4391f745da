// One source built once per model with different constants and the same function names, so a
// caller can tell from the results whose kernel ran.
//
// kernels/nvrtc.py builds it as model_a (MODEL_SCALE 2, MODEL_OFFSET 1) and model_b
// (MODEL_SCALE -3, MODEL_OFFSET 0.5).
#ifndef MODEL_SCALE
#error "build with -DMODEL_SCALE=... -DMODEL_OFFSET=..."
#endif

// out[i] = in[i] * MODEL_SCALE + MODEL_OFFSET, for i < n.
extern "C" __global__ void transform(const float* in, float* out, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = in[i] * (float)(MODEL_SCALE) + (float)(MODEL_OFFSET);
    }
}

// The model's constants, so a test can read which build it has: scale_offset[0] = MODEL_SCALE,
// scale_offset[1] = MODEL_OFFSET.
__device__ float scale_offset[2] = {(float)(MODEL_SCALE), (float)(MODEL_OFFSET)};
