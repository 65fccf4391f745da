// Which multiprocessor each block runs on, for checking how work is spread over them (green
// contexts give a stream a share of the device's multiprocessors).
//
// A persistent kernel: each block takes work items item = blockIdx.x, blockIdx.x + gridDim.x, ...
// below `items` and, for each, records the multiprocessor it runs on (%smid) in sm_of_item[item],
// then holds that multiprocessor for `hold_ns` nanoseconds (%globaltimer) so that the other blocks
// of the grid have to be placed on other multiprocessors rather than queue behind it.
extern "C" __global__ void smid_items(unsigned int* sm_of_item, unsigned int items,
                                      unsigned int hold_ns) {
    for (unsigned int item = blockIdx.x; item < items; item += gridDim.x) {
        if (threadIdx.x == 0) {
            unsigned int sm;
            asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
            sm_of_item[item] = sm;
            unsigned long long start;
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
            unsigned long long now = start;
            while (now - start < hold_ns) {
                asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
            }
        }
        __syncthreads();
    }
}
