// Thread block clusters as the kernel sees them.
//
// Block b (of a one-dimensional grid) writes its rank within its cluster to out[2 * b] and its
// cluster's x index to out[2 * b + 1]. Launched without clusters, every block is a cluster of one
// (rank 0, cluster b); builds older than sm_90 have no clusters and write the same.

// The special registers of clusters are Hopper (sm_90) ones.
__device__ __forceinline__ void write_cluster_place(unsigned int* out) {
    unsigned int rank = 0;
    unsigned int cluster = blockIdx.x;
#if __CUDA_ARCH__ >= 900
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(cluster));
#endif
    if (threadIdx.x == 0) {
        out[2 * blockIdx.x] = rank;
        out[2 * blockIdx.x + 1] = cluster;
    }
}

extern "C" __global__ void cluster_shape(unsigned int* out) {
    write_cluster_place(out);
}

// The same, compiled for clusters of two blocks (`__cluster_dims__`, sm_90 only): launched with
// other cluster dimensions it is refused.
#if __CUDA_ARCH__ >= 900
#define CLUSTER_OF_TWO __cluster_dims__(2, 1, 1)
#else
#define CLUSTER_OF_TWO
#endif
extern "C" __global__ void CLUSTER_OF_TWO cluster_shape_pair(unsigned int* out) {
    write_cluster_place(out);
}
