// Kernels for conditional graph nodes (IF / WHILE, CUDA 12.3+): a loop step that ends its WHILE
// loop on the device, and a kernel that sets an IF node's condition from a flag in device memory.
//
// cudaGraphSetConditional(handle, value) is a CUDA device function (cuda_device_runtime_api.h,
// CUDA 12.3+): in PTX it is a call to the extern function `cudaGraphSetConditional(.b64, .b32)`,
// which the PTX assembler of CUDA 12.3 and newer resolves itself (no -rdc, no cudadevrt). The
// declaration below is the toolkit's own, written out so that compilers whose headers predate it
// (NVRTC 12.0) compile this file too: NVRTC 12.0 writes the PTX with the call left extern, which a
// CUDA 12.3+ driver resolves when it JIT-compiles the module; its own assembler cannot, so cubins
// come from nvcc 12.3 or newer (kernels/regen.sh). A driver older than 12.3 refuses the module.
// With nvcc 12.3+ the toolkit header declares the same function; the two declarations agree.

typedef unsigned long long graph_condition;
extern "C" __device__ __cudart_builtin__ void cudaGraphSetConditional(graph_condition handle,
                                                                      unsigned int value);

// One step of work on x (x[i] = x[i] * 0.5 + 1, for i < n) and one count: thread 0 increments
// *counter and, once it reaches limit, sets the WHILE node's condition to 0, so the loop ends
// after this iteration. Set the counter to 0 before the loop (reset_counter).
extern "C" __global__ void loop_step(float* x, unsigned int n, graph_condition handle,
                                     int* counter, int limit) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        x[i] = x[i] * 0.5f + 1.0f;
    }
    if (i == 0) {
        int done = *counter + 1;
        *counter = done;
        if (done >= limit) {
            cudaGraphSetConditional(handle, 0);
        }
    }
}

// The same step as loop_step for a loop run from the host: no condition to set.
extern "C" __global__ void host_step(float* x, unsigned int n, int* counter) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        x[i] = x[i] * 0.5f + 1.0f;
    }
    if (i == 0) {
        *counter = *counter + 1;
    }
}

// *counter = 0 (one thread).
extern "C" __global__ void reset_counter(int* counter) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        *counter = 0;
    }
}

// Sets an IF node's condition to whether *flag is non-zero (one thread).
extern "C" __global__ void set_condition(graph_condition handle, const int* flag) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        cudaGraphSetConditional(handle, *flag != 0 ? 1u : 0u);
    }
}
