// Elementwise kernels over one float buffer: a pointer, a scalar and a length.

// x[i] = x[i] * factor, for i < n.
extern "C" __global__ void scale(float* x, float factor, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        x[i] = x[i] * factor;
    }
}

// y[i] = a * x[i] + y[i], for i < n.
extern "C" __global__ void axpy(const float* x, float* y, float a, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = a * x[i] + y[i];
    }
}
