// The choice of a SWITCH conditional node (CUDA 12.8+), made on the device from data the host
// changes between replays: set_branch sets the node's value to *choice, and the node runs branch
// *choice (none when it is not below the node's number of branches).
//
// Not in kernels/gen/: tests compile it at run time with the NVRTC they find. The declaration of
// cudaGraphSetConditional (a CUDA 12.3+ device function) is the toolkit's own, written out as in
// kernels/conditional.cu, for compilers whose headers predate it.

typedef unsigned long long graph_condition;
extern "C" __device__ __cudart_builtin__ void cudaGraphSetConditional(graph_condition handle,
                                                                      unsigned int value);

// Sets the SWITCH node's value to *choice (one thread).
extern "C" __global__ void set_branch(graph_condition handle, const unsigned int* choice) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        cudaGraphSetConditional(handle, *choice);
    }
}
