// A grid-wide sum that needs every block of the grid resident at once.
//
// Each block sums its part of `in` (wrapping unsigned addition: the result does not depend on the
// order) into partials[blockIdx.x]; then all blocks meet at a barrier made of an atomic counter
// (`arrived`, zero before the launch); after it, block 0 adds every partial into *out. A block
// that spins at the barrier waits for blocks that may not have started: unless all are resident
// together, which a cooperative launch guarantees, the kernel can hang.
extern "C" __global__ void coop_sum(const unsigned int* in, unsigned int* partials,
                                    unsigned int* out, unsigned int n, unsigned int* arrived) {
    __shared__ unsigned int block_total;
    if (threadIdx.x == 0) {
        block_total = 0;
    }
    __syncthreads();
    unsigned int sum = 0;
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        sum += in[i];
    }
    atomicAdd(&block_total, sum);
    __syncthreads();
    if (threadIdx.x == 0) {
        partials[blockIdx.x] = block_total;
        __threadfence();
        atomicAdd(arrived, 1u);
        while (atomicAdd(arrived, 0u) < gridDim.x) {
        }
        __threadfence();
    }
    __syncthreads();
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        unsigned int total = 0;
        for (unsigned int b = 0; b < gridDim.x; b++) {
            total += ((volatile unsigned int*)partials)[b];
        }
        *out = total;
    }
}
