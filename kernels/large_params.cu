// Kernels that take a large struct by value (CUDA 12.1+: up to 32,764 bytes of parameters in all,
// on compute capability 7.0 and newer, where a kernel built for a 4,096-byte limit takes at most
// that). Each copies its struct's words out, mixed with their index and a salt, and one thread
// writes their wrapping sum after them, so that the host can check every byte that arrived.
//
// NVRTC 12.0, which builds kernels/gen/, refuses parameters past 4,096 bytes: this file is not in
// kernels/gen/. Tests and benches compile it at run time with the NVRTC they find (12.1 or newer).
// __grid_constant__ lets the kernel read the parameter where it lies, without a copy per thread.

#define WORDS_8K 2048   // 8,192 bytes
#define WORDS_32K 8000  // 32,000 bytes

struct Words8k {
    unsigned int words[WORDS_8K];
};

struct Words32k {
    unsigned int words[WORDS_32K];
};

// out[i] = words[i] ^ (i * 2654435761 + salt) for i < count; out[count] = the wrapping sum of
// words[i] * (i + 1). out holds count + 1 words.
__device__ void mix(const unsigned int* words, unsigned int count, unsigned int* out,
                    unsigned int salt) {
    unsigned int stride = gridDim.x * blockDim.x;
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
        out[i] = words[i] ^ (i * 2654435761u + salt);
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        unsigned int sum = 0;
        for (unsigned int i = 0; i < count; i++) {
            sum += words[i] * (i + 1);
        }
        out[count] = sum;
    }
}

extern "C" __global__ void mix_8k(const __grid_constant__ Words8k p, unsigned int* out,
                                  unsigned int salt) {
    mix(p.words, WORDS_8K, out, salt);
}

extern "C" __global__ void mix_32k(unsigned int salt, const __grid_constant__ Words32k p,
                                   unsigned int* out) {
    mix(p.words, WORDS_32K, out, salt);
}
