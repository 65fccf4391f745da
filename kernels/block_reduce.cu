// A block reduction that stages its whole chunk in dynamic shared memory.
//
// Each block copies `chunk` floats of `in` (zero past `n`) into dynamic shared memory, sums them
// and writes the sum to out[blockIdx.x]. With chunk = 24576 the block needs 96 KiB of dynamic shared
// memory, past the 48 KiB that a launch gets without the per-function opt-in.
extern "C" __global__ void block_sum(const float* in, float* out, unsigned int n, unsigned int chunk) {
    extern __shared__ float staged[];
    __shared__ float partial[1024];
    unsigned int base = blockIdx.x * chunk;
    for (unsigned int j = threadIdx.x; j < chunk; j += blockDim.x) {
        unsigned int i = base + j;
        staged[j] = i < n ? in[i] : 0.0f;
    }
    __syncthreads();
    float sum = 0.0f;
    for (unsigned int j = threadIdx.x; j < chunk; j += blockDim.x) {
        sum += staged[j];
    }
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (unsigned int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) {
            partial[threadIdx.x] += partial[threadIdx.x + stride];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        out[blockIdx.x] = partial[0];
    }
}
