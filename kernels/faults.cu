// Kernels that fail on purpose, for the tests of how a lost context is reported.

// Stops the whole grid with a trap: the context is lost afterwards.
extern "C" __global__ void trap() { __trap(); }

// Writes through `p` at a far offset: an illegal address, and the context is lost afterwards.
extern "C" __global__ void write_far(float* p) { p[(size_t)1 << 40] = 1.0f; }
