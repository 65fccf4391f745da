// A kernel that reads a __device__ global, which the host sets through its symbol.

// Added to every element by add_bias; looked up by name as "bias".
__device__ float bias = 0.0f;

// x[i] = x[i] + bias, for i < n.
extern "C" __global__ void add_bias(float* x, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        x[i] = x[i] + bias;
    }
}
