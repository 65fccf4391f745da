// Tiles of a 2-D float tensor loaded by the Tensor Memory Accelerator (TMA, sm_90).
//
// Block (bx, by) loads the box at element (bx * box_cols, by * box_rows) of the tensor `map`
// describes, with one `cp.async.bulk.tensor` into shared memory whose completion an mbarrier
// counts in bytes. With tiles = gridDim.x * gridDim.y and tile = by * gridDim.x + bx, it writes
// the sum of the box to out[tile] and the whole box, row by row, to
// out[tiles + tile * box_rows * box_cols ..], elements past the tensor's edges as the TMA filled
// them.
//
// The tensor map is a kernel parameter passed by value (`__grid_constant__`, 128 bytes aligned to
// 64), as CUTLASS and FlashAttention 3 pass theirs. `swizzle` is the map's swizzle mode as
// CUtensorMapSwizzle numbers it (0 none, 1 32B, 2 64B, 3 128B): the box lands in shared memory
// with the 16-byte chunks of each 128-byte row XOR-ed with the row's index (modulo the span), and
// the kernel reads it back through the same pattern. Shared memory: the box's bytes plus 1024
// (the box is placed on a 1024-byte boundary, where the swizzle pattern starts).
//
// cp.async.bulk.tensor and mbarrier expect_tx are Hopper instructions: builds for older
// architectures write NaN sums and leave the tiles alone.

struct alignas(64) TensorMap {
    unsigned long long opaque[16];
};

// The byte offset in shared memory of the element at `offset` bytes of the unswizzled box.
__device__ __forceinline__ unsigned int swizzled(unsigned int offset, unsigned int swizzle) {
    // 32B, 64B and 128B swizzles XOR bits 4.. (the 16-byte chunk) with bits 7.. (the 128-byte
    // row), one, two or three bits of them.
    unsigned int bits = (1u << swizzle) - 1u;
    return offset ^ (((offset >> 7) & bits) << 4);
}

extern "C" __global__ void tma_tiles(const __grid_constant__ TensorMap map, float* out,
                                     unsigned int box_rows, unsigned int box_cols,
                                     unsigned int swizzle) {
    unsigned int tile = blockIdx.y * gridDim.x + blockIdx.x;
    float* sums = out;
#if __CUDA_ARCH__ >= 900
    unsigned int elements = box_rows * box_cols;
    float* tiles = out + gridDim.x * gridDim.y;
    extern __shared__ unsigned char shared[];
    __shared__ __align__(8) unsigned long long barrier;
    __shared__ float partial[32];
    unsigned int base = static_cast<unsigned int>(__cvta_generic_to_shared(shared));
    unsigned int box = (base + 1023u) & ~1023u;
    const unsigned char* box_bytes = shared + (box - base);
    unsigned int bar = static_cast<unsigned int>(__cvta_generic_to_shared(&barrier));

    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared.b64 [%0], 1;" ::"r"(bar) : "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int x = static_cast<int>(blockIdx.x * box_cols);
        int y = static_cast<int>(blockIdx.y * box_rows);
        asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(bar),
                     "r"(elements * 4u)
                     : "memory");
        asm volatile(
            "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
            " [%0], [%1, {%2, %3}], [%4];" ::"r"(box),
            "l"(reinterpret_cast<unsigned long long>(&map)), "r"(x), "r"(y), "r"(bar)
            : "memory");
    }
    unsigned int done = 0;
    while (!done) {
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
            : "=r"(done)
            : "r"(bar)
            : "memory");
    }

    float sum = 0.0f;
    for (unsigned int i = threadIdx.x; i < elements; i += blockDim.x) {
        unsigned int offset = swizzle == 0 ? i * 4u : swizzled(i * 4u, swizzle);
        float v = *reinterpret_cast<const float*>(box_bytes + offset);
        tiles[static_cast<size_t>(tile) * elements + i] = v;
        sum += v;
    }
    for (int step = 16; step > 0; step /= 2) {
        sum += __shfl_down_sync(0xffffffffu, sum, step);
    }
    if (threadIdx.x % 32 == 0) {
        partial[threadIdx.x / 32] = sum;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (unsigned int w = 0; w < (blockDim.x + 31) / 32; w++) {
            total += partial[w];
        }
        sums[tile] = total;
    }
#else
    (void)map;
    (void)box_rows;
    (void)box_cols;
    (void)swizzle;
    if (threadIdx.x == 0) {
        sums[tile] = __int_as_float(0x7fc00000);
    }
#endif
}
