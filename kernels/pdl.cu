// One step of a dependent chain, written for programmatic dependent launch (PDL).
//
// x[i] = fmaf(x[i], a, b) for i < n. Launched with programmatic stream serialization, a step may
// start while the step before it is still running; `griddepcontrol.wait` holds it until that step
// has finished and its writes are visible, so a chain gives the same bits with PDL as without.
// `griddepcontrol.launch_dependents` lets the next step start early (its own wait still covers
// this step's writes). Both are Hopper (sm_90) instructions; older builds run the plain step.
extern "C" __global__ void pdl_step(float* x, unsigned int n, float a, float b) {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        x[i] = fmaf(x[i], a, b);
    }
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
