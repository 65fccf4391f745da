/*
 * A stand-in for libcuda, built by the tests (tests/support/standin/mod.rs) so that machines without a GPU
 * run Atlas's real code paths and error paths against something that behaves like the driver.
 *
 * "Device" memory is host memory: a CUdeviceptr is the address of a calloc'd block. Kernels are a
 * fixed set known by name, run on the host when launched, reading their arguments through
 * kernelParams[i] with the kernel's real parameter layout. Handles point into one static arena
 * whose slots are never reused, so a handle used after its destroy/unload is recognised (answered
 * with CUDA_ERROR_INVALID_HANDLE and counted as "stale_handle") instead of reading freed memory.
 *
 * Switches (-D):
 *   STANDIN_DEVICES=N        how many devices (default 1).
 *   STANDIN_NO_PARAM_INFO    no cuFuncGetParamInfo export (a driver older than CUDA 12.4).
 *   STANDIN_NO_LIBRARY       no cuLibrary* exports (a driver older than CUDA 12.0).
 *   STANDIN_NO_MEMORY_POOLS  the device reports CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 0.
 *   STANDIN_NO_MEMORY_POOL_API  no cuMemAllocAsync, cuMemFreeAsync, cuDeviceGetDefaultMemPool,
 *                           cuMemPoolSetAttribute, cuMemPoolGetAttribute exports (older than 11.2),
 *                           nor those of pools of one's own and of sharing them (cuMemPoolCreate...).
 *   STANDIN_NO_POSIX_FD      the devices cannot share memory as POSIX file descriptors
 *                           (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED and
 *                           CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES answer 0).
 *   STANDIN_NO_IPC           no cuIpcGetMemHandle, cuIpcOpenMemHandle_v2, cuIpcCloseMemHandle exports
 *                           (an injection library that does not forward them).
 *
 * Stream capture builds graphs: a launch on a capturing stream becomes a kernel node (its function,
 * configuration, parameter values and cluster/cooperative attributes copied), cuMemAllocAsync and
 * cuMemFreeAsync become memory nodes, conditional nodes have body graphs (IF with an optional ELSE,
 * WHILE, SWITCH of up to BODIES branches; ELSE and SWITCH refused below CUDA 12.8, as the driver
 * takes them from 12.8 on), kernels whose parameters end past PARAM_BYTES are launched but not
 * captured (CUDA_ERROR_NOT_SUPPORTED); an executable graph runs
 * its nodes in order on the host when launched. Calls the driver refuses while capturing invalidate
 * the capture: cuStreamSynchronize of the capturing stream, cuCtxSynchronize of its context,
 * cuMemAlloc_v2 and cuMemFree_v2 from the capturing thread, cuMemFreeAsync in a capture of memory
 * that is not one of its graph's allocations. Copies between host and device memory during a
 * capture still run at once; copies between device memory and fills become memcpy and memset nodes,
 * whose replay faults (losing the context) when the memory is freed by then. What the
 * driver does not synchronize is watched: two calls on one graph at once (a node captured into a
 * graph another call is using included) count "graph_race", and each such call sleeps 300 us (lock
 * released) so that racing callers overlap; a launch into a stream whose capture is beginning or
 * ending counts "capture_race" (the driver crashes), the transition sleeping 300 us likewise.
 * cuGraphGetNodes asked for zero nodes is refused, as the driver refuses it. Graph memory nodes
 * follow the driver's rules: only the graph frees what it frees itself, a graph with memory nodes
 * has one executable graph at a time, and a replay is refused while an allocation the last one
 * left unfreed is still live.
 *   STANDIN_NO_LAUNCH_EX     no cuLaunchKernelEx export (a driver older than CUDA 12.0).
 *   STANDIN_CC_MAJOR=N       the devices' compute capability major (default 9, minor 0); below 9
 *                            they cannot launch clusters (CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH 0).
 *   STANDIN_CC_MINOR=N       the devices' compute capability minor (default 0).
 *   STANDIN_CC1=N            device 1's compute capability as 10 * major + minor (default: that
 *                            of the others), for a machine with GPUs of two architectures.
 *   STANDIN_NO_COOPERATIVE   the devices cannot make cooperative launches.
 *   STANDIN_SLOW_SYNC        cuCtxSynchronize waits (lock released) for a launch from another
 *                            thread, or 2 s ("sync_waited_out"): device work that waits for a
 *                            host thread. A capture begun in a context being synchronized counts
 *                            "capture_during_sync" (the driver would invalidate it).
 *   STANDIN_NO_CONDITIONAL   no conditional-node exports (cuGraphConditionalHandleCreate,
 *                            cuGraphAddNode_v2, cuStreamGetCaptureInfo_v3,
 *                            cuStreamUpdateCaptureDependencies_v2, cuStreamBeginCaptureToGraph:
 *                            a driver older than CUDA 12.3).
 *   STANDIN_DRIVER_VERSION=N what cuDriverGetVersion answers (default 12090, CUDA 12.9).
 *   STANDIN_NO_ENUMERATE     no cuModuleGetFunctionCount, cuModuleEnumerateFunctions, cuFuncGetName,
 *                            cuFuncLoad exports (a driver older than CUDA 12.4). Otherwise a module
 *                            lists the kernels whose names its blob holds as whole words.
 *   STANDIN_NO_UUID_V2       no cuDeviceGetUuid_v2 export (a driver older than CUDA 11.4).
 *   STANDIN_NO_PEER_ACCESS   the devices cannot reach each other's memory (cuDeviceCanAccessPeer
 *                            answers 0, cuCtxEnablePeerAccess CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
 *                            copies between them still work, as the driver stages them.
 *   STANDIN_NO_BATCH_COPY    no cuMemcpyBatchAsync export (a driver older than CUDA 12.8).
 *   STANDIN_NO_GREEN_CONTEXTS  no green-context exports (cuDeviceGetDevResource,
 *                            cuDevSmResourceSplitByCount, cuDevResourceGenerateDesc, cuGreenCtx*,
 *                            cuCtxFromGreenCtx: a driver older than CUDA 12.4).
 *
 * Blob markers: a blob containing STANDIN_JIT_ERROR fails to JIT (CUDA_ERROR_INVALID_PTX) with a
 * log; one containing STANDIN_EARLY_FAIL fails the same way before touching any JIT option; one
 * containing STANDIN_PTX_TOO_NEW fails as PTX of an ISA version newer than the driver's does
 * (CUDA_ERROR_UNSUPPORTED_PTX_VERSION, with a log). Through cuLibraryLoadData they fail later, at
 * cuLibraryGetModule, as the real driver's deferred JIT does.
 *
 * Inspection for tests: the standin_* functions at the end of this file.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef STANDIN_DEVICES
#define STANDIN_DEVICES 1
#endif
#ifndef STANDIN_CC_MAJOR
#define STANDIN_CC_MAJOR 9
#endif
#ifndef STANDIN_CC_MINOR
#define STANDIN_CC_MINOR 0
#endif
#ifndef STANDIN_DRIVER_VERSION
#define STANDIN_DRIVER_VERSION 12090
#endif
#ifdef STANDIN_NO_COOPERATIVE
#define STANDIN_COOPERATIVE 0
#else
#define STANDIN_COOPERATIVE 1
#endif
/* Multiprocessors of a device, and the blocks of up to 64 threads one of them holds. */
#define STANDIN_SMS 132
#define STANDIN_BLOCKS_PER_SM 32

typedef unsigned int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

enum {
    SUCCESS = 0,
    INVALID_VALUE = 1,
    OUT_OF_MEMORY = 2,
    NOT_INITIALIZED = 3,
    INVALID_DEVICE = 101,
    INVALID_CONTEXT = 201,
    INVALID_PTX = 218,
    UNSUPPORTED_PTX_VERSION = 222,
    INVALID_HANDLE = 400,
    ILLEGAL_STATE = 401,
    NOT_FOUND = 500,
    ILLEGAL_ADDRESS = 700,
    CONTEXT_IS_DESTROYED = 709,
    LAUNCH_FAILED = 719,
    NOT_SUPPORTED = 801,
    STREAM_CAPTURE_UNSUPPORTED = 900,
    STREAM_CAPTURE_INVALIDATED = 901,
    STREAM_CAPTURE_WRONG_THREAD = 908,
    GRAPH_EXEC_UPDATE_FAILURE = 910,
    INVALID_CLUSTER_SIZE = 912,
};

/* ------------------------------------------------------------------------------------------ */
/* Status names and descriptions                                                              */
/* ------------------------------------------------------------------------------------------ */

static const struct {
    CUresult code;
    const char *name;
    const char *text;
} statuses[] = {
    {SUCCESS, "CUDA_SUCCESS", "no error"},
    {INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "an argument is out of range"},
    {OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "the allocation does not fit"},
    {NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "cuInit has not been called"},
    {4, "CUDA_ERROR_DEINITIALIZED", "the driver is shutting down"},
    {INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "no device has this ordinal"},
    {200, "CUDA_ERROR_INVALID_IMAGE", "the module image is not valid"},
    {INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "no usable context is current"},
    {215, "CUDA_ERROR_UNSUPPORTED_LIMIT", "the limit is not supported by the device"},
    {INVALID_PTX, "CUDA_ERROR_INVALID_PTX", "the PTX failed to JIT-compile"},
    {UNSUPPORTED_PTX_VERSION, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
     "the PTX is of a newer ISA version than the JIT compiler takes"},
    {INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "the handle is not valid"},
    {ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the call is not valid in this state"},
    {NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "no such name"},
    {ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "a kernel accessed memory it may not"},
    {CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "the context was destroyed"},
    {LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "a kernel failed (trap or fault)"},
    {712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
     "part of the range is page-locked already"},
    {713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", "the pointer does not begin a registration"},
    {NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "the stand-in does not model this"},
    {STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
     "the operation is not permitted when the stream is capturing"},
    {STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
     "the capture was invalidated by an earlier error"},
    {STREAM_CAPTURE_WRONG_THREAD, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
     "the capture was begun by another thread, in thread-local mode"},
    {GRAPH_EXEC_UPDATE_FAILURE, "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE",
     "the executable graph cannot be updated from this graph"},
    {INVALID_CLUSTER_SIZE, "CUDA_ERROR_INVALID_CLUSTER_SIZE", "the cluster size is not valid"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static CUresult status_string(CUresult error, const char **out, int want_name) {
    for (size_t i = 0; i < sizeof statuses / sizeof statuses[0]; i++) {
        if (statuses[i].code == error) {
            *out = want_name ? statuses[i].name : statuses[i].text;
            return SUCCESS;
        }
    }
    *out = NULL;
    return INVALID_VALUE;
}

/* ------------------------------------------------------------------------------------------ */
/* Call counters, events and injected failures                                                */
/* ------------------------------------------------------------------------------------------ */

#define ENTRY_POINTS(X)                                                                         \
    X(cuInit) X(cuDriverGetVersion) X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetName)      \
    X(cuDeviceGetAttribute) X(cuGetErrorName) X(cuGetErrorString) X(cuMemGetInfo_v2)            \
    X(cuDevicePrimaryCtxRetain) X(cuCtxSetCurrent) X(cuCtxGetCurrent) X(cuCtxPushCurrent_v2)    \
    X(cuCtxPopCurrent_v2) X(cuCtxCreate_v2) X(cuCtxDestroy_v2) X(cuStreamCreate)                \
    X(cuStreamDestroy_v2) X(cuStreamSynchronize) X(cuMemAlloc_v2) X(cuMemFree_v2)               \
    X(cuMemcpyHtoDAsync_v2) X(cuMemcpyDtoHAsync_v2) X(cuModuleLoadData) X(cuModuleLoadDataEx)   \
    X(cuModuleUnload) X(cuModuleGetFunction) X(cuModuleGetGlobal_v2) X(cuLaunchKernel)          \
    X(cuFuncGetParamInfo) X(cuFuncGetAttribute) X(cuFuncSetAttribute) X(cuLibraryLoadData)      \
    X(cuLibraryGetModule) X(cuLibraryUnload) X(cuCtxGetStreamPriorityRange)                    \
    X(cuStreamCreateWithPriority) X(cuStreamGetPriority) X(cuStreamBeginCapture_v2)             \
    X(cuStreamEndCapture) X(cuStreamIsCapturing) X(cuGraphDestroy) X(cuMemAllocAsync)          \
    X(cuMemFreeAsync) X(cuDeviceGetDefaultMemPool) X(cuMemPoolSetAttribute)                     \
    X(cuMemPoolGetAttribute) X(cuLaunchKernelEx)                  \
    X(cuOccupancyMaxActiveBlocksPerMultiprocessor) X(cuOccupancyMaxPotentialClusterSize)        \
    X(cuStreamGetCtx) X(cuCtxSynchronize) X(cuStreamGetCaptureInfo_v2)                          \
    X(cuStreamGetCaptureInfo_v3) X(cuStreamUpdateCaptureDependencies_v2)                        \
    X(cuStreamBeginCaptureToGraph) X(cuGraphGetNodes) X(cuGraphNodeGetType)                    \
    X(cuGraphInstantiateWithFlags) X(cuGraphLaunch) X(cuGraphExecDestroy)                      \
    X(cuGraphExecKernelNodeSetParams_v2) X(cuGraphExecUpdate_v2) X(cuGraphUpload)               \
    X(cuGraphKernelNodeGetAttribute) X(cuGraphConditionalHandleCreate) X(cuGraphAddNode_v2)     \
    X(cuGraphNodeGetDependencies_v2) X(cuGraphKernelNodeGetParams_v2)                          \
    X(cuModuleGetFunctionCount) X(cuModuleEnumerateFunctions) X(cuFuncGetName) X(cuFuncLoad)     \
    /* Events, stream order, host functions. */                                                 \
    X(cuEventCreate) X(cuEventDestroy_v2) X(cuEventRecord) X(cuStreamWaitEvent)                \
    X(cuEventQuery) X(cuEventSynchronize) X(cuEventElapsedTime) X(cuEventElapsedTime_v2)       \
    X(cuLaunchHostFunc)                                                                         \
    /* Device information: identity, context limits, block size of best occupancy */            \
    X(cuDeviceGetUuid) X(cuDeviceGetUuid_v2) X(cuDeviceGetPCIBusId) X(cuCtxSetLimit)            \
    X(cuCtxGetLimit) X(cuOccupancyMaxPotentialBlockSize)                                        \
    /* Page-locked host memory. */                                                              \
    X(cuMemHostAlloc) X(cuMemFreeHost) X(cuMemHostRegister_v2) X(cuMemHostUnregister)          \
    X(cuMemHostGetDevicePointer_v2)                                                             \
    /* Copies between device memory, 2D copies, fills, peer access */                          \
    X(cuMemcpyDtoDAsync_v2) X(cuMemcpyPeerAsync) X(cuMemcpy2DAsync_v2) X(cuMemsetD8Async)       \
    X(cuMemsetD16Async) X(cuMemsetD32Async) X(cuDeviceCanAccessPeer) X(cuCtxEnablePeerAccess)  \
    /* Memory pools of one's own, and device memory shared between processes */                 \
    X(cuMemPoolCreate) X(cuMemPoolDestroy) X(cuMemAllocFromPoolAsync) X(cuMemPoolTrimTo)         \
    X(cuMemPoolExportToShareableHandle) X(cuMemPoolImportFromShareableHandle)                    \
    X(cuMemPoolExportPointer) X(cuMemPoolImportPointer) X(cuIpcGetMemHandle)                     \
    X(cuIpcOpenMemHandle_v2) X(cuIpcCloseMemHandle)                                             \
    /* Batched copies */                                                                        \
    X(cuMemcpyBatchAsync)                                                                       \
    /* Virtual memory: reservations, physical allocations, mappings, sharing by descriptor */   \
    X(cuMemGetAllocationGranularity) X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemCreate) \
    X(cuMemRelease) X(cuMemGetAllocationPropertiesFromHandle) X(cuMemMap) X(cuMemUnmap)         \
    X(cuMemSetAccess) X(cuMemExportToShareableHandle) X(cuMemImportFromShareableHandle)         \
    /* Tensor maps (TMA descriptors) and green contexts */                                     \
    X(cuTensorMapEncodeTiled) X(cuTensorMapEncodeIm2col) X(cuTensorMapReplaceAddress)          \
    X(cuDeviceGetDevResource) X(cuDevSmResourceSplitByCount) X(cuDevResourceGenerateDesc)      \
    X(cuGreenCtxCreate) X(cuGreenCtxDestroy) X(cuCtxFromGreenCtx) X(cuGreenCtxGetDevResource)  \
    X(cuGreenCtxStreamCreate)

/* Things that happen inside calls, counted for tests. */
#define EVENTS(X)                                                                               \
    X(stale_handle) X(context_mismatch) X(fault) X(graph_race) X(capture_race)                 \
    X(capture_during_sync) X(sync_waited_out)                                                  \
    X(copy_overlap)

#define AS_ENUM(n) E_##n,
enum entry { ENTRY_POINTS(AS_ENUM) ENTRY_COUNT };
enum event { EVENTS(AS_ENUM) EVENT_COUNT };
#undef AS_ENUM
#define AS_NAME(n) #n,
static const char *const entry_names[ENTRY_COUNT] = {ENTRY_POINTS(AS_NAME)};
static const char *const event_names[EVENT_COUNT] = {EVENTS(AS_NAME)};
#undef AS_NAME

static unsigned long long entry_calls[ENTRY_COUNT];
static unsigned long long event_counts[EVENT_COUNT];
static struct {
    CUresult code;
    unsigned times;
} injected[ENTRY_COUNT];

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialized;

static long long vmm_count(const char *what);
static void note(enum event e) { __atomic_fetch_add(&event_counts[e], 1, __ATOMIC_RELAXED); }

/* Counts the call; returns the status to fail it with (an injected failure, or not initialised),
 * or SUCCESS to go on. */
static CUresult enter(enum entry e, int needs_init) {
    __atomic_fetch_add(&entry_calls[e], 1, __ATOMIC_RELAXED);
    if (__atomic_load_n(&injected[e].times, __ATOMIC_ACQUIRE) != 0) {
        CUresult code = SUCCESS;
        pthread_mutex_lock(&lock);
        if (injected[e].times != 0) {
            injected[e].times--;
            code = injected[e].code;
        }
        pthread_mutex_unlock(&lock);
        if (code != SUCCESS) {
            return code;
        }
    }
    if (needs_init && !__atomic_load_n(&initialized, __ATOMIC_ACQUIRE)) {
        return NOT_INITIALIZED;
    }
    return SUCCESS;
}

#define ENTER(name)                                                                             \
    do {                                                                                        \
        CUresult entered_ = enter(E_##name, 1);                                                 \
        if (entered_ != SUCCESS) return entered_;                                               \
    } while (0)
#define ENTER_ANY_TIME(name)                                                                    \
    do {                                                                                        \
        CUresult entered_ = enter(E_##name, 0);                                                 \
        if (entered_ != SUCCESS) return entered_;                                               \
    } while (0)

/* ------------------------------------------------------------------------------------------ */
/* Kernels                                                                                    */
/* ------------------------------------------------------------------------------------------ */

struct object;

/* What a kernel body sees of its launch. */
struct launch {
    void **params;
    unsigned grid_x;
    unsigned cluster_x; /* blocks per cluster in x (1 without clusters) */
    unsigned shared_bytes;
    struct object *ctx;
    struct object *module;
};

/* A kernel body returns SUCCESS, or the fault that loses the context (700, 719). */
typedef CUresult (*kernel_body)(const struct launch *);

#define MAX_PARAMS 5

struct kernel {
    const char *name;
    unsigned param_count;
    size_t offsets[MAX_PARAMS];
    size_t sizes[MAX_PARAMS];
    int static_shared; /* bytes of static shared memory */
    kernel_body run;
    unsigned cluster[3]; /* __cluster_dims__, or zeros */
};

/* `__device__` variables: every module has them, created on first cuModuleGetGlobal. */
enum { GLOBAL_BIAS, GLOBAL_SCALE_OFFSET, GLOBAL_COUNT };
static const struct {
    const char *name;
    size_t size;
} globals[GLOBAL_COUNT] = {{"bias", 4}, {"scale_offset", 8}};

static int device_range_ok(struct object *ctx, const void *p, size_t bytes);
static void read_global(struct object *module, int which, void *out);
static void set_conditional(unsigned long long handle, unsigned value);

static void param(const struct launch *l, int i, void *out, size_t size) {
    /* As the driver does: trust that the array has this entry. */
    memcpy(out, l->params[i], size);
}

static CUresult run_noop(const struct launch *l) {
    (void)l;
    return SUCCESS;
}

static CUresult run_scale(const struct launch *l) {
    float *x;
    float factor;
    unsigned n;
    param(l, 0, &x, 8);
    param(l, 1, &factor, 4);
    param(l, 2, &n, 4);
    if (n != 0 && !device_range_ok(l->ctx, x, (size_t)n * 4)) return ILLEGAL_ADDRESS;
    for (unsigned i = 0; i < n; i++) x[i] = x[i] * factor;
    return SUCCESS;
}

static CUresult run_axpy(const struct launch *l) {
    const float *x;
    float *y;
    float a;
    unsigned n;
    param(l, 0, &x, 8);
    param(l, 1, &y, 8);
    param(l, 2, &a, 4);
    param(l, 3, &n, 4);
    if (n != 0 && (!device_range_ok(l->ctx, x, (size_t)n * 4) ||
                   !device_range_ok(l->ctx, y, (size_t)n * 4)))
        return ILLEGAL_ADDRESS;
    for (unsigned i = 0; i < n; i++) y[i] = a * x[i] + y[i];
    return SUCCESS;
}

/* out = in * scale_offset[0] + scale_offset[1]: the module's constants, as in model_tagged.cu. */
static CUresult run_transform(const struct launch *l) {
    const float *in;
    float *out;
    unsigned n;
    float so[2];
    param(l, 0, &in, 8);
    param(l, 1, &out, 8);
    param(l, 2, &n, 4);
    if (n != 0 && (!device_range_ok(l->ctx, in, (size_t)n * 4) ||
                   !device_range_ok(l->ctx, out, (size_t)n * 4)))
        return ILLEGAL_ADDRESS;
    read_global(l->module, GLOBAL_SCALE_OFFSET, so);
    for (unsigned i = 0; i < n; i++) out[i] = in[i] * so[0] + so[1];
    return SUCCESS;
}

static CUresult run_add_bias(const struct launch *l) {
    float *x;
    unsigned n;
    float bias;
    param(l, 0, &x, 8);
    param(l, 1, &n, 4);
    if (n != 0 && !device_range_ok(l->ctx, x, (size_t)n * 4)) return ILLEGAL_ADDRESS;
    read_global(l->module, GLOBAL_BIAS, &bias);
    for (unsigned i = 0; i < n; i++) x[i] = x[i] + bias;
    return SUCCESS;
}

/* out[b] = sum of in[b*chunk .. b*chunk+chunk) (zero past n), one block per b; the chunk is
 * staged in dynamic shared memory, so a launch with less than chunk*4 bytes of it faults. */
static CUresult run_block_sum(const struct launch *l) {
    const float *in;
    float *out;
    unsigned n, chunk;
    param(l, 0, &in, 8);
    param(l, 1, &out, 8);
    param(l, 2, &n, 4);
    param(l, 3, &chunk, 4);
    if ((size_t)chunk * 4 > l->shared_bytes) return ILLEGAL_ADDRESS;
    if ((n != 0 && !device_range_ok(l->ctx, in, (size_t)n * 4)) ||
        !device_range_ok(l->ctx, out, (size_t)l->grid_x * 4))
        return ILLEGAL_ADDRESS;
    for (unsigned b = 0; b < l->grid_x; b++) {
        float sum = 0.0f;
        for (unsigned j = 0; j < chunk; j++) {
            size_t i = (size_t)b * chunk + j;
            if (i < n) sum += in[i];
        }
        out[b] = sum;
    }
    return SUCCESS;
}

/* x[i] *= 2 for i < n: what NVRTC makes of `template <int F> __global__ void scale_by(float *x,
 * unsigned n)` instantiated as scale_by<2>, under its lowered name. */
static CUresult run_scale_by_2(const struct launch *l) {
    float *x;
    unsigned n;
    param(l, 0, &x, 8);
    param(l, 1, &n, 4);
    if (n != 0 && !device_range_ok(l->ctx, x, (size_t)n * 4)) return ILLEGAL_ADDRESS;
    for (unsigned i = 0; i < n; i++) x[i] *= 2.0f;
    return SUCCESS;
}

static CUresult run_trap(const struct launch *l) {
    (void)l;
    return LAUNCH_FAILED;
}

static CUresult run_write_far(const struct launch *l) {
    (void)l;
    return ILLEGAL_ADDRESS;
}

/* x[i] = x[i] * a + b for i < n: one step of a dependent chain. */
static CUresult run_pdl_step(const struct launch *l) {
    float *x;
    unsigned n;
    float a, b;
    param(l, 0, &x, 8);
    param(l, 1, &n, 4);
    param(l, 2, &a, 4);
    param(l, 3, &b, 4);
    if (n != 0 && !device_range_ok(l->ctx, x, (size_t)n * 4)) return ILLEGAL_ADDRESS;
    for (unsigned i = 0; i < n; i++) x[i] = x[i] * a + b;
    return SUCCESS;
}

/* x[0] += 1: the kernels of tests/fixtures/pdl/ (pdl_waits, pdl_nowait, pdl_callwait). */
static CUresult run_add_one(const struct launch *l) {
    float *x;
    param(l, 0, &x, 8);
    if (!device_range_ok(l->ctx, x, 4)) return ILLEGAL_ADDRESS;
    x[0] += 1.0f;
    return SUCCESS;
}

/* out[2b] = block b's rank in its cluster, out[2b+1] = its cluster's x index (1-D grids). */
static CUresult run_cluster_shape(const struct launch *l) {
    unsigned *out;
    param(l, 0, &out, 8);
    if (!device_range_ok(l->ctx, out, (size_t)l->grid_x * 8)) return ILLEGAL_ADDRESS;
    for (unsigned b = 0; b < l->grid_x; b++) {
        out[2 * b] = b % l->cluster_x;
        out[2 * b + 1] = b / l->cluster_x;
    }
    return SUCCESS;
}

/* The conditional model (kernels/conditional.cu): one step of a loop that ends its WHILE node once
 * *counter reaches limit; the same step without a condition; a counter reset; an IF condition
 * from a flag. */
static CUresult run_loop_step(const struct launch *l) {
    float *x;
    unsigned n;
    unsigned long long handle;
    int *counter, limit;
    param(l, 0, &x, 8);
    param(l, 1, &n, 4);
    param(l, 2, &handle, 8);
    param(l, 3, &counter, 8);
    param(l, 4, &limit, 4);
    if ((n != 0 && !device_range_ok(l->ctx, x, (size_t)n * 4)) ||
        !device_range_ok(l->ctx, counter, 4))
        return ILLEGAL_ADDRESS;
    for (unsigned i = 0; i < n; i++) x[i] = x[i] * 0.5f + 1.0f;
    *counter += 1;
    if (*counter >= limit) set_conditional(handle, 0);
    return SUCCESS;
}

static CUresult run_host_step(const struct launch *l) {
    float *x;
    unsigned n;
    int *counter;
    param(l, 0, &x, 8);
    param(l, 1, &n, 4);
    param(l, 2, &counter, 8);
    if ((n != 0 && !device_range_ok(l->ctx, x, (size_t)n * 4)) ||
        !device_range_ok(l->ctx, counter, 4))
        return ILLEGAL_ADDRESS;
    for (unsigned i = 0; i < n; i++) x[i] = x[i] * 0.5f + 1.0f;
    *counter += 1;
    return SUCCESS;
}

static CUresult run_reset_counter(const struct launch *l) {
    int *counter;
    param(l, 0, &counter, 8);
    if (!device_range_ok(l->ctx, counter, 4)) return ILLEGAL_ADDRESS;
    *counter = 0;
    return SUCCESS;
}

static CUresult run_set_condition(const struct launch *l) {
    unsigned long long handle;
    const int *flag;
    param(l, 0, &handle, 8);
    param(l, 1, &flag, 8);
    if (!device_range_ok(l->ctx, flag, 4)) return ILLEGAL_ADDRESS;
    set_conditional(handle, *flag != 0);
    return SUCCESS;
}

/* The cooperative sum (kernels/cooperative.cu): partials per block, their wrapping sum in *out,
 * and every block counted in *arrived. */
static CUresult run_coop_sum(const struct launch *l) {
    const unsigned *in;
    unsigned *partials, *out, n, *arrived;
    param(l, 0, &in, 8);
    param(l, 1, &partials, 8);
    param(l, 2, &out, 8);
    param(l, 3, &n, 4);
    param(l, 4, &arrived, 8);
    if ((n != 0 && !device_range_ok(l->ctx, in, (size_t)n * 4)) ||
        !device_range_ok(l->ctx, partials, (size_t)l->grid_x * 4) ||
        !device_range_ok(l->ctx, out, 4) || !device_range_ok(l->ctx, arrived, 4))
        return ILLEGAL_ADDRESS;
    unsigned total = 0;
    for (unsigned b = 0; b < l->grid_x; b++) {
        unsigned sum = 0;
        for (unsigned i = b; i < n; i += l->grid_x) sum += in[i];
        partials[b] = sum;
        total += sum;
    }
    *out = total;
    *arrived += l->grid_x;
    return SUCCESS;
}

/* Conditional branches and large parameters: defined with their topic, near the end. */
static CUresult run_set_branch(const struct launch *l);
static CUresult run_block_then_pointer(const struct launch *l);
static CUresult run_largest(const struct launch *l);
static CUresult run_tma_tiles(const struct launch *l);

static const struct kernel kernels[] = {
    {"noop", 0, {0}, {0}, 0, run_noop, {0, 0, 0}},
    {"scale", 3, {0, 8, 12}, {8, 4, 4}, 0, run_scale, {0, 0, 0}},
    {"axpy", 4, {0, 8, 16, 20}, {8, 8, 4, 4}, 0, run_axpy, {0, 0, 0}},
    {"transform", 3, {0, 8, 16}, {8, 8, 4}, 0, run_transform, {0, 0, 0}},
    {"add_bias", 2, {0, 8}, {8, 4}, 0, run_add_bias, {0, 0, 0}},
    {"block_sum", 4, {0, 8, 16, 20}, {8, 8, 4, 4}, 4096, run_block_sum, {0, 0, 0}},
    {"trap", 0, {0}, {0}, 0, run_trap, {0, 0, 0}},
    {"write_far", 1, {0}, {8}, 0, run_write_far, {0, 0, 0}},
    {"pdl_step", 4, {0, 8, 12, 16}, {8, 4, 4, 4}, 0, run_pdl_step, {0, 0, 0}},
    {"cluster_shape", 1, {0}, {8}, 0, run_cluster_shape, {0, 0, 0}},
    {"cluster_shape_pair", 1, {0}, {8}, 0, run_cluster_shape, {2, 1, 1}},
    {"loop_step", 5, {0, 8, 16, 24, 32}, {8, 4, 8, 8, 4}, 0, run_loop_step, {0, 0, 0}},
    {"host_step", 3, {0, 8, 16}, {8, 4, 8}, 0, run_host_step, {0, 0, 0}},
    {"reset_counter", 1, {0}, {8}, 0, run_reset_counter, {0, 0, 0}},
    {"set_condition", 2, {0, 8}, {8, 8}, 0, run_set_condition, {0, 0, 0}},
    {"coop_sum", 5, {0, 8, 16, 24, 32}, {8, 8, 8, 4, 8}, 4, run_coop_sum, {0, 0, 0}},
    {"_Z8scale_byILi2EEvPfj", 2, {0, 8}, {8, 4}, 0, run_scale_by_2, {0, 0, 0}},
    /* A SWITCH node's choice; kernels of tests/fixtures/large_params.cu (4,408 and 32,764 bytes
     * of parameters), which the stand-in launches but does not capture (PARAM_BYTES). */
    {"set_branch", 2, {0, 8}, {8, 8}, 0, run_set_branch, {0, 0, 0}},
    {"block_then_pointer", 2, {0, 4400}, {4400, 8}, 0, run_block_then_pointer, {0, 0, 0}},
    {"largest", 2, {0, 32760}, {32760, 4}, 0, run_largest, {0, 0, 0}},
    /* Tensor maps: tma_tiles as the sm_90 cubin lays it out (its 64-byte-aligned CUtensorMap at
     * 48, where the parameters start at 0x210 of the constant bank), and a kernel of the same
     * sizes whose 128-byte parameter is a plain struct (at 0: not 64-byte aligned there). Their
     * 128-byte parameter does not fit a captured node's PARAM_BYTES: not for captures. */
    {"tma_tiles", 5, {48, 176, 184, 188, 192}, {128, 8, 4, 4, 4}, 0, run_tma_tiles, {0, 0, 0}},
    {"tma_misplaced", 5, {0, 128, 136, 140, 144}, {128, 8, 4, 4, 4}, 0, run_tma_tiles, {0, 0, 0}},
    /* Programmatic dependent launch: kernels with and without griddepcontrol.wait. */
    {"pdl_waits", 1, {0}, {8}, 0, run_add_one, {0, 0, 0}},
    {"pdl_nowait", 1, {0}, {8}, 0, run_add_one, {0, 0, 0}},
    {"pdl_callwait", 1, {0}, {8}, 0, run_add_one, {0, 0, 0}},
};
#define KERNEL_COUNT (sizeof kernels / sizeof kernels[0])

/* ------------------------------------------------------------------------------------------ */
/* Handles                                                                                    */
/* ------------------------------------------------------------------------------------------ */

enum kind {
    K_NONE, K_CONTEXT, K_STREAM, K_MODULE, K_FUNCTION, K_LIBRARY, K_GRAPH, K_POOL, K_NODE, K_EXEC,
    K_EVENT
};

/* Graph node types (CUgraphNodeType) the stand-in builds. */
enum {
    NODE_KERNEL = 0, NODE_MEMCPY = 1, NODE_MEMSET = 2, NODE_HOST = 3, NODE_MEM_ALLOC = 10,
    NODE_MEM_FREE = 11, NODE_CONDITIONAL = 13
};

#define PARAM_BYTES 64
/* The most body graphs a conditional node has here (the driver takes any number for a SWITCH). */
#define BODIES 8

/* What one graph node does, as plain data: kept in a node of a graph, copied into an executable
 * graph (a conditional node's body with it). */
struct node_data {
    int type;
    struct object *function; /* kernel */
    unsigned grid[3], block[3], shared;
    unsigned char params[PARAM_BYTES]; /* the parameter values, at the kernel's offsets */
    unsigned cluster[3];               /* cluster dimensions, or zeros */
    int cooperative;
    int programmatic;                  /* captured from a programmatic dependent launch */
    unsigned long long ptr;            /* memory nodes */
    unsigned long long handle;         /* conditional */
    int cond_type;                     /* 0 IF, 1 WHILE, 2 SWITCH */
    unsigned size;                     /* conditional: how many body graphs */
    struct object *body[BODIES];       /* conditional, in a graph: its body graphs */
    struct node_data *body_nodes[BODIES]; /* conditional, in an executable graph: their copies */
    size_t body_count[BODIES];
    void (*host_fn)(void *);           /* host */
    void *host_data;
};

#define LIBRARY_CONTEXTS 8
#define DEFAULT_DYNAMIC_SHARED 49152
#define SHARED_OPTIN 232448
/* The largest cluster a kernel that allows non-portable sizes can run (16 blocks, as on an H100). */
#define MAX_CLUSTER_BLOCKS 16

struct object {
    enum kind kind;
    int dead; /* destroyed or unloaded; the slot is never reused */
    union {
        struct {
            int device;
            int primary;
            CUresult lost; /* the sticky fault, once a kernel faulted */
            int syncing;   /* cuCtxSynchronize calls in progress */
        } ctx;
        struct {
            struct object *ctx;
            int priority;
            int capture; /* 0 none, 1 active, 2 invalidated */
            struct object *graph;         /* the graph being captured into */
            int into_existing;            /* begun with cuStreamBeginCaptureToGraph */
            unsigned long long capture_id;
            const void *capture_thread;   /* the thread that began it (thread-local mode) */
            int transition;               /* a capture of it is beginning or ending now */
            int joined;                   /* part of another stream's capture (waited for it) */
            struct object *dependency;    /* the node the next captured work depends on */
        } stream;
        struct {
            struct object **nodes;
            size_t count, capacity;
            struct object *owner; /* the conditional node owning this body graph, or NULL */
            int execs;            /* executable graphs instantiated from it and alive */
            int busy;             /* graph calls using it now */
        } graph;
        struct {
            struct object *graph;
            size_t index;
            struct object *bodies[BODIES]; /* a conditional node's body graphs, as handed out */
            struct node_data d;
        } node;
        struct {
            struct object *ctx;
            struct object *graph; /* instantiated from (its nodes name this graph's nodes) */
            struct node_data *nodes;
            size_t count;
            unsigned long long handles[8]; /* conditional handles reset at each launch */
            int handle_count;
            int launched;
        } exec;
        struct {
            unsigned long long release_threshold;
            int device;
            int created;           /* by cuMemPoolCreate (a default pool is not) */
            int imported;          /* by cuMemPoolImportFromShareableHandle */
            int handle_types;      /* CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR (1), or 0 */
            size_t max_size;       /* 0: no limit of its own */
            int no_reuse[3];       /* attributes 1-3 turned off (all on by default) */
            unsigned long long reserved, reserved_high, used, used_high;
            int fd;                /* shared memory behind an exportable or imported pool */
            size_t fd_bytes;       /* the shared memory's size: where the next allocation goes */
            long long exporter;    /* the pid and pool that an exported pool's memory names */
            size_t exporter_pool;
        } pool;
        struct {
            struct object *ctx;
            unsigned flags;
            int recorded;                  /* recorded at least once */
            struct object *captured;       /* the graph whose capture took the last record */
            unsigned long long capture_id;
            unsigned long long time;       /* launches made when last recorded, outside captures */
        } event;
        struct {
            struct object *ctx;
            struct object *library; /* set for a module of a library */
            const void *image;      /* what it was loaded from (the library's image) */
            struct object *functions[KERNEL_COUNT];
            CUdeviceptr globals[GLOBAL_COUNT];
            float scale_offset[2]; /* initial value of the scale_offset global */
            unsigned char listed[KERNEL_COUNT]; /* kernels named in the blob, for enumeration */
        } module;
        struct {
            struct object *module;
            const struct kernel *kernel;
            int max_dynamic_shared;
            int non_portable_cluster; /* NON_PORTABLE_CLUSTER_SIZE_ALLOWED */
        } function;
        struct {
            CUresult deferred; /* what cuLibraryGetModule answers, for a broken blob */
            const void *image;
            float scale_offset[2];
            struct object *modules[LIBRARY_CONTEXTS];
            unsigned char listed[KERNEL_COUNT];
        } library;
    } u;
};

#define ARENA_SLOTS (1 << 18)
static struct object arena[ARENA_SLOTS];
static size_t arena_used;

/* A fresh handle of `kind`, or NULL when the arena is full. Call with the lock held. */
static struct object *new_object(enum kind kind) {
    if (arena_used == ARENA_SLOTS) {
        fprintf(stderr, "standin: all %d handles are used\n", ARENA_SLOTS);
        return NULL;
    }
    struct object *o = &arena[arena_used++];
    o->kind = kind;
    return o;
}

/* The object `handle` names if it is a handle of `kind` ever created, else NULL. Never reads
 * memory outside the arena. Call with the lock held. */
static struct object *as(const void *handle, enum kind kind) {
    uintptr_t p = (uintptr_t)handle, base = (uintptr_t)arena;
    if (p < base || p >= base + arena_used * sizeof(struct object) ||
        (p - base) % sizeof(struct object) != 0)
        return NULL;
    struct object *o = (struct object *)handle;
    return o->kind == kind ? o : NULL;
}

/* INVALID_HANDLE for a handle that is not one, or is used after its destroy/unload. */
static CUresult live(struct object *o, const char *call) {
    if (o == NULL) return INVALID_HANDLE;
    int dead = o->dead || (o->kind == K_FUNCTION && o->u.function.module->dead);
    if (dead) {
        note(E_stale_handle);
        fprintf(stderr, "standin: %s was given a handle that was destroyed or unloaded\n", call);
        return INVALID_HANDLE;
    }
    return SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* Contexts: a per-thread stack whose top is the current context                              */
/* ------------------------------------------------------------------------------------------ */

#define STACK_DEPTH 32
static __thread struct object *stack[STACK_DEPTH];
static __thread int depth;
static struct object *primary[STANDIN_DEVICES];

static struct object *current(void) { return depth ? stack[depth - 1] : NULL; }

/* Whether work can run in `ctx`: a context, not destroyed, not lost to a fault. */
static CUresult usable(struct object *ctx) {
    if (ctx == NULL) return INVALID_CONTEXT;
    if (ctx->dead) return CONTEXT_IS_DESTROYED;
    return ctx->u.ctx.lost;
}

/* The context a stream argument names: the stream's own, or the current one for the legacy
 * (0 or CU_STREAM_LEGACY) and per-thread (CU_STREAM_PER_THREAD) default streams. */
static CUresult stream_context(void *stream, const char *call, struct object **ctx) {
    if ((uintptr_t)stream <= 2) {
        *ctx = current();
        return SUCCESS;
    }
    struct object *s = as(stream, K_STREAM);
    CUresult status = live(s, call);
    if (status != SUCCESS) return status;
    *ctx = s->u.stream.ctx;
    return SUCCESS;
}

static struct object *last_alloc_ctx, *last_module_ctx, *last_copy_ctx, *last_launch_ctx;

/* ------------------------------------------------------------------------------------------ */
/* Allocations                                                                                */
/* ------------------------------------------------------------------------------------------ */

struct allocation {
    char *base;
    size_t size;
    struct object *ctx;
    int user; /* cuMemAlloc'd, as opposed to a module's __device__ variable */
    struct object *graph; /* a graph allocation: the graph whose capture made it */
    int freed_in_graph;   /* its graph frees it (a free node): nobody else may */
    struct object *pool;  /* the memory pool it came from (or was imported from), or NULL */
    int mapped;           /* a mapping of a pool's shared memory (munmap'd), not calloc'd */
    size_t offset;        /* where a mapping lies in the pool's shared memory */
};
static struct allocation *allocations;
static size_t allocation_count, allocation_capacity;

static struct allocation *vmm_allocation(const void *p, size_t bytes);

/* The live allocation that holds all of [p, p + bytes), or NULL. */
static struct allocation *find_allocation(const void *p, size_t bytes) {
    uintptr_t at = (uintptr_t)p;
    for (size_t i = 0; i < allocation_count; i++) {
        struct allocation *a = &allocations[i];
        uintptr_t base = (uintptr_t)a->base;
        if (at >= base && bytes <= a->size && at - base <= a->size - bytes) return a;
    }
    return vmm_allocation(p, bytes); /* mapped virtual memory (near the end of this file) */
}

static int mapped_host_ok(struct object *ctx, const void *p, size_t bytes);

static int device_range_ok(struct object *ctx, const void *p, size_t bytes) {
    struct allocation *a = find_allocation(p, bytes);
    return (a != NULL && a->ctx == ctx) || mapped_host_ok(ctx, p, bytes);
}

/* Records `base` as an allocation; the new entry is allocations[allocation_count - 1]. */
static CUresult add_allocation_at(char *base, size_t size, struct object *ctx, int user) {
    if (allocation_count == allocation_capacity) {
        size_t capacity = allocation_capacity ? allocation_capacity * 2 : 64;
        struct allocation *grown = realloc(allocations, capacity * sizeof *grown);
        if (grown == NULL) return OUT_OF_MEMORY;
        allocations = grown;
        allocation_capacity = capacity;
    }
    allocations[allocation_count++] = (struct allocation){base, size, ctx, user, NULL, 0, NULL, 0, 0};
    return SUCCESS;
}

static CUresult add_allocation(size_t size, struct object *ctx, int user, char **out) {
    char *base = calloc(1, size);
    if (base == NULL) return OUT_OF_MEMORY;
    CUresult status = add_allocation_at(base, size, ctx, user);
    if (status != SUCCESS) {
        free(base);
        return status;
    }
    *out = base;
    return SUCCESS;
}

static void release_pool_memory(struct allocation *a);

static void remove_allocation(struct allocation *a) {
    if (a->pool != NULL || a->mapped) release_pool_memory(a);
    else free(a->base);
    *a = allocations[--allocation_count];
}

static void free_context_allocations(struct object *ctx) {
    for (size_t i = allocation_count; i-- > 0;) {
        if (allocations[i].ctx == ctx) remove_allocation(&allocations[i]);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Blobs                                                                                      */
/* ------------------------------------------------------------------------------------------ */

static uint64_t read_le(const unsigned char *p, int bytes) {
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* How many bytes of `image` belong to it: the extent its ELF or fatbin header declares, else the
 * text up to its NUL. */
static size_t blob_extent(const unsigned char *image) {
    if (memcmp(image, "\x7f" "ELF", 4) == 0) {
        int wide = image[4] == 2;
        uint64_t phoff = wide ? read_le(image + 0x20, 8) : read_le(image + 0x1C, 4);
        uint64_t shoff = wide ? read_le(image + 0x28, 8) : read_le(image + 0x20, 4);
        const unsigned char *sizes = image + (wide ? 0x36 : 0x2A);
        uint64_t ph_end = phoff + read_le(sizes, 2) * read_le(sizes + 2, 2);
        uint64_t sh_end = shoff + read_le(sizes + 4, 2) * read_le(sizes + 6, 2);
        uint64_t end = ph_end > sh_end ? ph_end : sh_end;
        return end > 64 ? (size_t)end : 64;
    }
    if (read_le(image, 4) == 0xBA55ED50u) return (size_t)(read_le(image + 6, 2) + read_le(image + 8, 8));
    return strlen((const char *)image);
}

static int blob_has(const void *image, size_t extent, const char *marker) {
    return memmem(image, extent, marker, strlen(marker)) != NULL;
}

static int word_char(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* Marks in `listed` the kernels whose names the blob holds as whole words (a cubin's string
 * table, a PTX .entry). */
static void blob_kernels(const void *image, size_t extent, unsigned char *listed) {
    const unsigned char *base = image;
    for (size_t k = 0; k < KERNEL_COUNT; k++) {
        size_t n = strlen(kernels[k].name);
        listed[k] = 0;
        for (const unsigned char *at = memmem(base, extent, kernels[k].name, n); at != NULL;) {
            size_t off = (size_t)(at - base);
            int before = off > 0 && word_char(at[-1]);
            int after = off + n < extent && word_char(at[n]);
            if (!before && !after) {
                listed[k] = 1;
                break;
            }
            at = off + 1 < extent ? memmem(at + 1, extent - off - 1, kernels[k].name, n) : NULL;
        }
    }
}

/* The initial scale_offset of a model_tagged.cu build, from its PTX (`.b8 scale_offset[8] = {...}`);
 * model_a's (2, 1) when the blob does not say. */
static void blob_scale_offset(const void *image, size_t extent, float out[2]) {
    out[0] = 2.0f;
    out[1] = 1.0f;
    const char *key = "scale_offset[8] = {";
    const char *at = memmem(image, extent, key, strlen(key));
    if (at == NULL) return;
    const char *p = at + strlen(key), *end = (const char *)image + extent;
    unsigned char bytes[8];
    for (int i = 0; i < 8; i++) {
        char *next;
        unsigned long v = strtoul(p, &next, 10);
        if (next == p || next >= end || v > 255) return;
        bytes[i] = (unsigned char)v;
        p = next;
        while (p < end && (*p == ',' || *p == ' ')) p++;
    }
    memcpy(out, bytes, 8);
}

static const char jit_log[] = "line 3; error: standin syntax error";
static const char too_new_log[] = "line 1; fatal: Unsupported .version; the standin JIT is older";

/* Writes the JIT error log into the options that ask for it; the size value becomes the bytes
 * written, terminating NUL included. */
static void write_jit_log(unsigned count, const int *options, void **values, const char *log) {
    int buffer = -1, size = -1;
    for (unsigned i = 0; i < count; i++) {
        if (options[i] == 5) buffer = (int)i; /* CU_JIT_ERROR_LOG_BUFFER */
        if (options[i] == 6) size = (int)i;   /* CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES */
    }
    if (buffer < 0 || size < 0 || values[buffer] == NULL) return;
    size_t room = (size_t)(uintptr_t)values[size], n = strlen(log) + 1;
    if (n > room) n = room;
    if (n > 0) {
        memcpy(values[buffer], log, n);
        ((char *)values[buffer])[n - 1] = '\0';
    }
    values[size] = (void *)(uintptr_t)n;
}

/* JIT-checks a blob: SUCCESS, or the failure of its marker. */
static CUresult jit(const void *image, size_t extent, unsigned count, const int *options,
                    void **values) {
    if (blob_has(image, extent, "STANDIN_EARLY_FAIL")) return INVALID_PTX;
    if (blob_has(image, extent, "STANDIN_PTX_TOO_NEW")) {
        if (options != NULL && values != NULL) write_jit_log(count, options, values, too_new_log);
        return UNSUPPORTED_PTX_VERSION;
    }
    if (blob_has(image, extent, "STANDIN_JIT_ERROR")) {
        if (options != NULL && values != NULL) write_jit_log(count, options, values, jit_log);
        return INVALID_PTX;
    }
    if (options != NULL && values != NULL) write_jit_log(count, options, values, "");
    return SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* Initialisation and devices                                                                 */
/* ------------------------------------------------------------------------------------------ */

CUresult cuInit(unsigned int flags) {
    ENTER_ANY_TIME(cuInit);
    if (flags != 0) return INVALID_VALUE;
    __atomic_store_n(&initialized, 1, __ATOMIC_RELEASE);
    return SUCCESS;
}

CUresult cuDriverGetVersion(int *version) {
    ENTER_ANY_TIME(cuDriverGetVersion);
    if (version == NULL) return INVALID_VALUE;
    *version = STANDIN_DRIVER_VERSION;
    return SUCCESS;
}

CUresult cuGetErrorName(CUresult error, const char **name) {
    ENTER_ANY_TIME(cuGetErrorName);
    if (name == NULL) return INVALID_VALUE;
    return status_string(error, name, 1);
}

CUresult cuGetErrorString(CUresult error, const char **text) {
    ENTER_ANY_TIME(cuGetErrorString);
    if (text == NULL) return INVALID_VALUE;
    return status_string(error, text, 0);
}

CUresult cuDeviceGetCount(int *count) {
    ENTER(cuDeviceGetCount);
    if (count == NULL) return INVALID_VALUE;
    *count = STANDIN_DEVICES;
    return SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    ENTER(cuDeviceGet);
    if (device == NULL) return INVALID_VALUE;
    if (ordinal < 0 || ordinal >= STANDIN_DEVICES) return INVALID_DEVICE;
    *device = ordinal;
    return SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice device) {
    ENTER(cuDeviceGetName);
    if (device < 0 || device >= STANDIN_DEVICES) return INVALID_DEVICE;
    if (name == NULL || len <= 0) return INVALID_VALUE;
    snprintf(name, (size_t)len, "Atlas stand-in");
    return SUCCESS;
}

/* The PCI bus of `device`: 0x1B, 0x2B, ... */
static int standin_pci_bus(CUdevice device) { return 0x1B + 0x10 * device; }
/* The most L2 cache a context may set aside for persisting accesses. */
#define STANDIN_MAX_PERSISTING_L2 (30 << 20)

/* The compute capability of `device` as 10 * major + minor. */
static int cc_of(CUdevice device) {
#ifdef STANDIN_CC1
    if (device == 1) return STANDIN_CC1;
#endif
    (void)device;
    return STANDIN_CC_MAJOR * 10 + STANDIN_CC_MINOR;
}

CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice device) {
    ENTER(cuDeviceGetAttribute);
    if (device < 0 || device >= STANDIN_DEVICES) return INVALID_DEVICE;
    if (value == NULL) return INVALID_VALUE;
    switch (attribute) {
    case 1: *value = 1024; break;           /* MAX_THREADS_PER_BLOCK */
    case 2: *value = 1024; break;           /* MAX_BLOCK_DIM_X */
    case 3: *value = 1024; break;           /* MAX_BLOCK_DIM_Y */
    case 4: *value = 64; break;             /* MAX_BLOCK_DIM_Z */
    case 5: *value = 2147483647; break;     /* MAX_GRID_DIM_X */
    case 6: *value = 65535; break;          /* MAX_GRID_DIM_Y */
    case 7: *value = 65535; break;          /* MAX_GRID_DIM_Z */
    case 8: *value = DEFAULT_DYNAMIC_SHARED; break; /* MAX_SHARED_MEMORY_PER_BLOCK */
    case 10: *value = 32; break;            /* WARP_SIZE */
    case 16: *value = STANDIN_SMS; break;   /* MULTIPROCESSOR_COUNT */
    case 33: *value = standin_pci_bus(device); break; /* PCI_BUS_ID */
    case 36: *value = 3201000; break;       /* MEMORY_CLOCK_RATE, kHz */
    case 37: *value = 6144; break;          /* GLOBAL_MEMORY_BUS_WIDTH, bits */
    case 38: *value = 50 << 20; break;      /* L2_CACHE_SIZE */
    case 39: *value = 2048; break;          /* MAX_THREADS_PER_MULTIPROCESSOR */
    case 108: *value = STANDIN_MAX_PERSISTING_L2; break; /* MAX_PERSISTING_L2_CACHE_SIZE */
    case 41: *value = 1; break;             /* UNIFIED_ADDRESSING */
    case 75: *value = cc_of(device) / 10; break; /* COMPUTE_CAPABILITY_MAJOR */
    case 95: *value = STANDIN_COOPERATIVE; break; /* COOPERATIVE_LAUNCH */
    case 120: *value = cc_of(device) >= 90; break; /* CLUSTER_LAUNCH */
    case 76: *value = cc_of(device) % 10; break; /* COMPUTE_CAPABILITY_MINOR */
    case 97: *value = SHARED_OPTIN; break;  /* MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */
#ifdef STANDIN_NO_VIRTUAL_MEMORY
    case 102: *value = 0; break;            /* VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED */
#else
    case 102: *value = 1; break;            /* VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED */
#endif
#if defined(STANDIN_NO_POSIX_FD) || defined(STANDIN_NO_VIRTUAL_MEMORY)
    case 103: *value = 0; break;            /* HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED */
#else
    case 103: *value = 1; break;            /* HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED */
#endif
#ifdef STANDIN_NO_POSIX_FD
    case 119: *value = 0; break;            /* MEMPOOL_SUPPORTED_HANDLE_TYPES */
#else
    case 119: *value = 1; break;            /* MEMPOOL_SUPPORTED_HANDLE_TYPES: POSIX fd */
#endif
#ifdef STANDIN_NO_MEMORY_POOLS
    case 115: *value = 0; break;            /* MEMORY_POOLS_SUPPORTED */
#else
    case 115: *value = 1; break;            /* MEMORY_POOLS_SUPPORTED */
#endif
    default:
        if (attribute <= 0 || attribute > 200) return INVALID_VALUE;
        *value = 0;
    }
    return SUCCESS;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    ENTER(cuMemGetInfo_v2);
    const size_t total = 150000000000ull;
    pthread_mutex_lock(&lock);
    struct object *ctx = current();
    CUresult status = usable(ctx);
    size_t used = 0;
    for (size_t i = 0; status == SUCCESS && i < allocation_count; i++) {
        if (allocations[i].ctx->u.ctx.device == ctx->u.ctx.device) used += allocations[i].size;
    }
    pthread_mutex_unlock(&lock);
    if (status != SUCCESS) return status;
    if (free_bytes) *free_bytes = used < total ? total - used : 0;
    if (total_bytes) *total_bytes = total;
    return SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* Contexts                                                                                   */
/* ------------------------------------------------------------------------------------------ */

CUresult cuDevicePrimaryCtxRetain(void **ctx, CUdevice device) {
    ENTER(cuDevicePrimaryCtxRetain);
    if (ctx == NULL) return INVALID_VALUE;
    if (device < 0 || device >= STANDIN_DEVICES) return INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    if (primary[device] == NULL) {
        primary[device] = new_object(K_CONTEXT);
        if (primary[device] != NULL) {
            primary[device]->u.ctx.device = device;
            primary[device]->u.ctx.primary = 1;
        }
    }
    struct object *p = primary[device];
    pthread_mutex_unlock(&lock);
    if (p == NULL) return OUT_OF_MEMORY;
    *ctx = p;
    return SUCCESS;
}

/* Replaces the top of this thread's stack (pushes onto an empty one); NULL pops. */
CUresult cuCtxSetCurrent(void *ctx) {
    ENTER(cuCtxSetCurrent);
    if (ctx == NULL) {
        if (depth > 0) depth--;
        return SUCCESS;
    }
    pthread_mutex_lock(&lock);
    struct object *c = as(ctx, K_CONTEXT);
    CUresult status = c == NULL || c->dead ? INVALID_CONTEXT : SUCCESS;
    pthread_mutex_unlock(&lock);
    if (status != SUCCESS) return status;
    if (depth == 0) depth = 1;
    stack[depth - 1] = c;
    return SUCCESS;
}

CUresult cuCtxGetCurrent(void **ctx) {
    ENTER(cuCtxGetCurrent);
    if (ctx == NULL) return INVALID_VALUE;
    *ctx = current();
    return SUCCESS;
}

CUresult cuCtxPushCurrent_v2(void *ctx) {
    ENTER(cuCtxPushCurrent_v2);
    pthread_mutex_lock(&lock);
    struct object *c = as(ctx, K_CONTEXT);
    CUresult status = c == NULL || c->dead ? INVALID_CONTEXT : SUCCESS;
    pthread_mutex_unlock(&lock);
    if (status != SUCCESS) return status;
    if (depth == STACK_DEPTH) return OUT_OF_MEMORY;
    stack[depth++] = c;
    return SUCCESS;
}

CUresult cuCtxPopCurrent_v2(void **ctx) {
    ENTER(cuCtxPopCurrent_v2);
    if (depth == 0) return INVALID_CONTEXT;
    struct object *top = stack[--depth];
    if (ctx != NULL) *ctx = top;
    return SUCCESS;
}

/* A new (non-primary) context, pushed onto this thread's stack: what another library does. */
CUresult cuCtxCreate_v2(void **ctx, unsigned int flags, CUdevice device) {
    ENTER(cuCtxCreate_v2);
    (void)flags;
    if (ctx == NULL) return INVALID_VALUE;
    if (device < 0 || device >= STANDIN_DEVICES) return INVALID_DEVICE;
    if (depth == STACK_DEPTH) return OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    struct object *c = new_object(K_CONTEXT);
    if (c != NULL) c->u.ctx.device = device;
    pthread_mutex_unlock(&lock);
    if (c == NULL) return OUT_OF_MEMORY;
    stack[depth++] = c;
    *ctx = c;
    return SUCCESS;
}

/* Destroys a created context with everything in it; pops it if it is this thread's current one.
 * Other threads that have it current get CUDA_ERROR_CONTEXT_IS_DESTROYED from then on. */
CUresult cuCtxDestroy_v2(void *ctx) {
    ENTER(cuCtxDestroy_v2);
    pthread_mutex_lock(&lock);
    struct object *c = as(ctx, K_CONTEXT);
    CUresult status = c == NULL || c->dead || c->u.ctx.primary ? INVALID_CONTEXT : SUCCESS;
    if (status == SUCCESS) {
        c->dead = 1;
        free_context_allocations(c);
        for (size_t i = 0; i < arena_used; i++) {
            struct object *o = &arena[i];
            if ((o->kind == K_MODULE && o->u.module.ctx == c) ||
                (o->kind == K_STREAM && o->u.stream.ctx == c))
                o->dead = 1;
        }
    }
    pthread_mutex_unlock(&lock);
    if (status == SUCCESS && current() == c) depth--;
    return status;
}

/* ------------------------------------------------------------------------------------------ */
/* Streams                                                                                    */
/* ------------------------------------------------------------------------------------------ */

static void thread_captures_remove(struct object *s);

CUresult cuStreamCreate(void **stream, unsigned int flags) {
    ENTER(cuStreamCreate);
    if (stream == NULL || (flags & ~1u) != 0) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct object *ctx = current();
    CUresult status = usable(ctx);
    struct object *s = NULL;
    if (status == SUCCESS) {
        s = new_object(K_STREAM);
        if (s == NULL) status = OUT_OF_MEMORY;
        else s->u.stream.ctx = ctx;
    }
    pthread_mutex_unlock(&lock);
    if (status == SUCCESS) *stream = s;
    return status;
}

CUresult cuStreamDestroy_v2(void *stream) {
    ENTER(cuStreamDestroy_v2);
    pthread_mutex_lock(&lock);
    struct object *s = as(stream, K_STREAM);
    CUresult status = live(s, "cuStreamDestroy_v2");
    if (status == SUCCESS) {
        s->dead = 1;
        thread_captures_remove(s);
        status = usable(s->u.stream.ctx);
    }
    pthread_mutex_unlock(&lock);
    return status;
}

CUresult cuStreamSynchronize(void *stream) {
    ENTER(cuStreamSynchronize);
    pthread_mutex_lock(&lock);
    struct object *ctx = NULL;
    CUresult status = stream_context(stream, "cuStreamSynchronize", &ctx);
    struct object *s = as(stream, K_STREAM);
    if (status == SUCCESS && s != NULL && s->u.stream.capture != 0) {
        s->u.stream.capture = 2;
        status = STREAM_CAPTURE_UNSUPPORTED;
    }
    if (status == SUCCESS) status = usable(ctx);
    pthread_mutex_unlock(&lock);
    return status;
}

/* ------------------------------------------------------------------------------------------ */
/* Memory                                                                                     */
/* ------------------------------------------------------------------------------------------ */

static CUresult refuse_while_thread_captures(void);

CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t bytes) {
    ENTER(cuMemAlloc_v2);
    CUresult refused = refuse_while_thread_captures();
    if (refused != SUCCESS) return refused;
    if (ptr == NULL || bytes == 0) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct object *ctx = current();
    CUresult status = usable(ctx);
    char *base = NULL;
    if (status == SUCCESS) status = add_allocation(bytes, ctx, 1, &base);
    if (status == SUCCESS) last_alloc_ctx = ctx;
    pthread_mutex_unlock(&lock);
    if (status == SUCCESS) *ptr = (CUdeviceptr)(uintptr_t)base;
    return status;
}

CUresult cuMemFree_v2(CUdeviceptr ptr) {
    ENTER(cuMemFree_v2);
    CUresult refused = refuse_while_thread_captures();
    if (refused != SUCCESS) return refused;
    pthread_mutex_lock(&lock);
    struct allocation *a = find_allocation((void *)(uintptr_t)ptr, 1);
    CUresult status = SUCCESS;
    if (a == NULL || a->base != (char *)(uintptr_t)ptr || !a->user || a->freed_in_graph)
        status = INVALID_VALUE;
    else if ((status = usable(a->ctx)) == SUCCESS) remove_allocation(a);
    pthread_mutex_unlock(&lock);
    return status;
}

/* A copy between host memory and a live allocation (of any context: addressing is unified). */
static CUresult copy(enum entry e, void *dst, const void *src, const void *device, size_t bytes,
                     void *stream) {
    const char *call = entry_names[e];
    pthread_mutex_lock(&lock);
    struct object *ctx = NULL;
    CUresult status = stream_context(stream, call, &ctx);
    if (status == SUCCESS) status = usable(ctx);
    if (status == SUCCESS && bytes != 0 && find_allocation(device, bytes) == NULL)
        status = INVALID_VALUE;
    if (status == SUCCESS) {
        if (bytes != 0) memcpy(dst, src, bytes);
        last_copy_ctx = current();
    }
    pthread_mutex_unlock(&lock);
    return status;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t bytes, void *stream) {
    ENTER(cuMemcpyHtoDAsync_v2);
    void *device = (void *)(uintptr_t)dst;
    return copy(E_cuMemcpyHtoDAsync_v2, device, src, device, bytes, stream);
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t bytes, void *stream) {
    ENTER(cuMemcpyDtoHAsync_v2);
    const void *device = (const void *)(uintptr_t)src;
    return copy(E_cuMemcpyDtoHAsync_v2, dst, device, device, bytes, stream);
}

/* ------------------------------------------------------------------------------------------ */
/* Modules and functions                                                                      */
/* ------------------------------------------------------------------------------------------ */

/* A module in `ctx`. Call with the lock held. */
static struct object *new_module(struct object *ctx, const float scale_offset[2]) {
    struct object *m = new_object(K_MODULE);
    if (m != NULL) {
        m->u.module.ctx = ctx;
        memcpy(m->u.module.scale_offset, scale_offset, sizeof m->u.module.scale_offset);
    }
    return m;
}

static void unload_module(struct object *m) {
    m->dead = 1;
    for (int g = 0; g < GLOBAL_COUNT; g++) {
        if (m->u.module.globals[g] == 0) continue;
        struct allocation *a = find_allocation((void *)(uintptr_t)m->u.module.globals[g], 1);
        if (a != NULL) remove_allocation(a);
        m->u.module.globals[g] = 0;
    }
}

static void read_global(struct object *m, int which, void *out) {
    if (m->u.module.globals[which] != 0) {
        memcpy(out, (void *)(uintptr_t)m->u.module.globals[which], globals[which].size);
    } else if (which == GLOBAL_SCALE_OFFSET) {
        memcpy(out, m->u.module.scale_offset, 8);
    } else {
        memset(out, 0, globals[which].size);
    }
}

static CUresult load_module(void **module, const void *image, unsigned count, const int *options,
                            void **values) {
    if (module == NULL || image == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct object *ctx = current(), *m = NULL;
    CUresult status = usable(ctx);
    size_t extent = status == SUCCESS ? blob_extent(image) : 0;
    if (status == SUCCESS) status = jit(image, extent, count, options, values);
    if (status == SUCCESS) {
        float scale_offset[2];
        blob_scale_offset(image, extent, scale_offset);
        m = new_module(ctx, scale_offset);
        if (m == NULL) status = OUT_OF_MEMORY;
        else {
            last_module_ctx = ctx;
            m->u.module.image = image;
            blob_kernels(image, extent, m->u.module.listed);
        }
    }
    pthread_mutex_unlock(&lock);
    if (status == SUCCESS) *module = m;
    return status;
}

CUresult cuModuleLoadData(void **module, const void *image) {
    ENTER(cuModuleLoadData);
    return load_module(module, image, 0, NULL, NULL);
}

CUresult cuModuleLoadDataEx(void **module, const void *image, unsigned int count, int *options,
                            void **values) {
    ENTER(cuModuleLoadDataEx);
    if (count != 0 && (options == NULL || values == NULL)) return INVALID_VALUE;
    return load_module(module, image, count, options, values);
}

CUresult cuModuleUnload(void *module) {
    ENTER(cuModuleUnload);
    pthread_mutex_lock(&lock);
    struct object *m = as(module, K_MODULE);
    CUresult status = live(m, "cuModuleUnload");
    if (status == SUCCESS && m->u.module.library != NULL) status = INVALID_HANDLE;
    if (status == SUCCESS) {
        status = usable(m->u.module.ctx);
        unload_module(m);
    }
    pthread_mutex_unlock(&lock);
    return status;
}

/* The function object of kernel `k` in module `m`, made on first use. Call with the lock held. */
static struct object *module_function(struct object *m, size_t k) {
    struct object *f = m->u.module.functions[k];
    if (f == NULL && (f = new_object(K_FUNCTION)) != NULL) {
        f->u.function.module = m;
        f->u.function.kernel = &kernels[k];
        f->u.function.max_dynamic_shared = DEFAULT_DYNAMIC_SHARED - kernels[k].static_shared;
        m->u.module.functions[k] = f;
    }
    return f;
}

CUresult cuModuleGetFunction(void **function, void *module, const char *name) {
    ENTER(cuModuleGetFunction);
    if (function == NULL || name == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct object *m = as(module, K_MODULE), *f = NULL;
    CUresult status = live(m, "cuModuleGetFunction");
    if (status == SUCCESS) status = usable(m->u.module.ctx);
    size_t k = 0;
    while (status == SUCCESS && k < KERNEL_COUNT && strcmp(kernels[k].name, name) != 0) k++;
    if (status == SUCCESS && k == KERNEL_COUNT) status = NOT_FOUND;
    if (status == SUCCESS) {
        /* One handle per function of a module, as the driver gives. */
        f = module_function(m, k);
        if (f == NULL) status = OUT_OF_MEMORY;
    }
    pthread_mutex_unlock(&lock);
    if (status == SUCCESS) *function = f;
    return status;
}

#ifndef STANDIN_NO_ENUMERATE
CUresult cuModuleGetFunctionCount(unsigned int *count, void *module) {
    ENTER(cuModuleGetFunctionCount);
    if (count == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct object *m = as(module, K_MODULE);
    CUresult status = live(m, "cuModuleGetFunctionCount");
    if (status == SUCCESS) {
        *count = 0;
        for (size_t k = 0; k < KERNEL_COUNT; k++) *count += m->u.module.listed[k];
    }
    pthread_mutex_unlock(&lock);
    return status;
}

CUresult cuModuleEnumerateFunctions(void **functions, unsigned int count, void *module) {
    ENTER(cuModuleEnumerateFunctions);
    if (functions == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct object *m = as(module, K_MODULE);
    CUresult status = live(m, "cuModuleEnumerateFunctions");
    unsigned written = 0;
    for (size_t k = 0; status == SUCCESS && k < KERNEL_COUNT; k++) {
        if (!m->u.module.listed[k]) continue;
        if (written == count) {
            status = INVALID_VALUE;
            break;
        }
        struct object *f = module_function(m, k);
        if (f == NULL) status = OUT_OF_MEMORY;
        else functions[written++] = f;
    }
    pthread_mutex_unlock(&lock);
    return status;
}

CUresult cuFuncGetName(const char **name, void *function) {
    ENTER(cuFuncGetName);
    if (name == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct object *f = as(function, K_FUNCTION);
    CUresult status = live(f, "cuFuncGetName");
    if (status == SUCCESS) *name = f->u.function.kernel->name;
    pthread_mutex_unlock(&lock);
    return status;
}

CUresult cuFuncLoad(void *function) {
    ENTER(cuFuncLoad);
    pthread_mutex_lock(&lock);
    CUresult status = live(as(function, K_FUNCTION), "cuFuncLoad");
    pthread_mutex_unlock(&lock);
    return status;
}
#endif

CUresult cuModuleGetGlobal_v2(CUdeviceptr *ptr, size_t *bytes, void *module, const char *name) {
    ENTER(cuModuleGetGlobal_v2);
    if (name == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct object *m = as(module, K_MODULE);
    CUresult status = live(m, "cuModuleGetGlobal_v2");
    if (status == SUCCESS) status = usable(m->u.module.ctx);
    int g = 0;
    while (status == SUCCESS && g < GLOBAL_COUNT && strcmp(globals[g].name, name) != 0) g++;
    if (status == SUCCESS && g == GLOBAL_COUNT) status = NOT_FOUND;
    if (status == SUCCESS && m->u.module.globals[g] == 0) {
        char *base;
        status = add_allocation(globals[g].size, m->u.module.ctx, 0, &base);
        if (status == SUCCESS) {
            read_global(m, g, base);
            m->u.module.globals[g] = (CUdeviceptr)(uintptr_t)base;
        }
    }
    if (status == SUCCESS) {
        if (ptr) *ptr = m->u.module.globals[g];
        if (bytes) *bytes = globals[g].size;
    }
    pthread_mutex_unlock(&lock);
    return status;
}

#ifndef STANDIN_NO_PARAM_INFO
CUresult cuFuncGetParamInfo(void *function, size_t index, size_t *offset, size_t *size) {
    ENTER(cuFuncGetParamInfo);
    pthread_mutex_lock(&lock);
    struct object *f = as(function, K_FUNCTION);
    CUresult status = live(f, "cuFuncGetParamInfo");
    if (status == SUCCESS) {
        const struct kernel *k = f->u.function.kernel;
        if (index >= k->param_count) {
            status = INVALID_VALUE;
        } else {
            if (offset) *offset = k->offsets[index];
            if (size) *size = k->sizes[index];
        }
    }
    pthread_mutex_unlock(&lock);
    return status;
}
#endif

CUresult cuFuncGetAttribute(int *value, int attribute, void *function) {
    ENTER(cuFuncGetAttribute);
    if (value == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct object *f = as(function, K_FUNCTION);
    CUresult status = live(f, "cuFuncGetAttribute");
    if (status == SUCCESS) {
        switch (attribute) {
        case 0: *value = 1024; break;                                  /* MAX_THREADS_PER_BLOCK */
        case 1: *value = f->u.function.kernel->static_shared; break;   /* SHARED_SIZE_BYTES */
        case 2: *value = 12; break;                                    /* CONST_SIZE_BYTES */
        case 3: *value = 24; break;                                    /* LOCAL_SIZE_BYTES */
        case 4: *value = 16; break;                                    /* NUM_REGS */
        case 5: *value = 80; break;                                    /* PTX_VERSION */
        case 6: *value = 90; break;                                    /* BINARY_VERSION */
        case 8: *value = f->u.function.max_dynamic_shared; break;      /* MAX_DYNAMIC_SHARED_SIZE_BYTES */
        case 11: case 12: case 13:                                     /* REQUIRED_CLUSTER_* */
            *value = (int)f->u.function.kernel->cluster[attribute - 11];
            break;
        case 14: *value = f->u.function.non_portable_cluster; break;   /* NON_PORTABLE_CLUSTER_SIZE_ALLOWED */
        default:
            if (attribute < 0 || attribute >= 16) status = INVALID_VALUE;
            else *value = 0;
        }
    }
    pthread_mutex_unlock(&lock);
    return status;
}

/* Sets the attribute to the value given, lower or higher than before, as the driver does; for
 * MAX_DYNAMIC_SHARED_SIZE_BYTES it first sleeps 2 ms, so that racing callers interleave. */
CUresult cuFuncSetAttribute(void *function, int attribute, int value) {
    ENTER(cuFuncSetAttribute);
    pthread_mutex_lock(&lock);
    struct object *f = as(function, K_FUNCTION);
    CUresult status = live(f, "cuFuncSetAttribute");
    if (status == SUCCESS && (attribute < 0 || attribute >= 16)) status = INVALID_VALUE;
    if (status == SUCCESS && attribute == 8 &&
        (value < 0 || value > SHARED_OPTIN - f->u.function.kernel->static_shared))
        status = INVALID_VALUE;
    if (status == SUCCESS && attribute == 14) f->u.function.non_portable_cluster = value != 0;
    pthread_mutex_unlock(&lock);
    if (status != SUCCESS || attribute != 8) return status;
    usleep(2000);
    pthread_mutex_lock(&lock);
    f->u.function.max_dynamic_shared = value;
    pthread_mutex_unlock(&lock);
    return SUCCESS;
}

static CUresult capture_node(struct object *s, const struct node_data *d);

/* Runs kernel `f` on the host, in `ctx`, in clusters of `cluster_x` blocks. A kernel that faults
 * leaves the launch successful and the context lost: every later call in it returns the fault.
 * Called with the lock held. */
static void run_kernel(struct object *f, struct object *ctx, unsigned grid_x, unsigned shared_bytes,
                       void **params, unsigned cluster_x) {
    last_launch_ctx = ctx;
    struct launch l = {params, grid_x, cluster_x, shared_bytes, ctx, f->u.function.module};
    CUresult fault = f->u.function.kernel->run(&l);
    if (fault != SUCCESS) {
        note(E_fault);
        ctx->u.ctx.lost = fault;
    }
}

static size_t param_end(const struct kernel *k);

/* The parameter values of a launch of `k`, copied out of `params` to the kernel's offsets. */
static void pack_params(const struct kernel *k, void **params, unsigned char out[PARAM_BYTES]) {
    memset(out, 0, PARAM_BYTES);
    for (unsigned i = 0; i < k->param_count; i++) memcpy(out + k->offsets[i], params[i], k->sizes[i]);
}

/* Launches made so far (every stream, every thread): what a slow synchronize waits for. */
static unsigned long long launch_total;

/* Checks a launch of `function` on `stream` and runs it there, or, on a capturing stream, records
 * it into the capture's graph (with its attributes: cluster dimensions, cooperative). Called with
 * the lock held. */
static CUresult launch(const char *call, void *function, const unsigned grid[3],
                       const unsigned block[3], unsigned shared_bytes, void *stream, void **params,
                       void **extra, const unsigned cluster[3], int cooperative,
                       int programmatic) {
    struct object *f = as(function, K_FUNCTION), *ctx = NULL;
    CUresult status = live(f, call);
    if (status == SUCCESS) status = stream_context(stream, call, &ctx);
    if (status == SUCCESS) status = usable(ctx);
    if (status == SUCCESS && ctx != f->u.function.module->u.module.ctx) {
        /* What the real driver does here is not pinned down; Atlas must not get here. */
        note(E_context_mismatch);
        status = INVALID_HANDLE;
    }
    if (status == SUCCESS) {
        const unsigned *g = grid, *b = block;
        unsigned long long threads = (unsigned long long)b[0] * b[1] * b[2];
        if (g[0] == 0 || g[1] == 0 || g[2] == 0 || b[0] == 0 || b[1] == 0 || b[2] == 0 ||
            g[1] > 65535 || g[2] > 65535 || g[0] > 2147483647u || b[0] > 1024 || b[1] > 1024 ||
            b[2] > 64 || threads > 1024)
            status = INVALID_VALUE;
    }
    const struct kernel *k = status == SUCCESS ? f->u.function.kernel : NULL;
    if (status == SUCCESS && shared_bytes > (unsigned)f->u.function.max_dynamic_shared)
        status = INVALID_VALUE;
    if (status == SUCCESS && extra != NULL) status = NOT_SUPPORTED;
    if (status == SUCCESS && k->param_count > 0 && params == NULL) status = INVALID_VALUE;
    if (status != SUCCESS) return status;
    launch_total++;
    struct object *s = as(stream, K_STREAM);
    if (s != NULL && s->u.stream.transition != 0) {
        note(E_capture_race);
        fprintf(stderr, "standin: %s enqueued into a stream whose capture began or ended\n", call);
    }
    if (s != NULL && s->u.stream.capture != 0) {
        if (param_end(k) > PARAM_BYTES) return NOT_SUPPORTED; /* not modelled */
        struct node_data d;
        memset(&d, 0, sizeof d);
        d.type = NODE_KERNEL;
        d.function = f;
        memcpy(d.grid, grid, sizeof d.grid);
        memcpy(d.block, block, sizeof d.block);
        d.shared = shared_bytes;
        pack_params(k, params, d.params);
        memcpy(d.cluster, cluster, sizeof d.cluster);
        d.cooperative = cooperative;
        d.programmatic = programmatic;
        return capture_node(s, &d);
    }
    run_kernel(f, ctx, grid[0], shared_bytes, params, cluster[0] ? cluster[0] : 1);
    return SUCCESS;
}

CUresult cuLaunchKernel(void *function, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shared_bytes, void *stream,
                        void **params, void **extra) {
    ENTER(cuLaunchKernel);
    const unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz}, no_cluster[3] = {0, 0, 0};
    pthread_mutex_lock(&lock);
    CUresult status = launch("cuLaunchKernel", function, grid, block, shared_bytes, stream, params,
                             extra, no_cluster, 0, 0);
    pthread_mutex_unlock(&lock);
    return status;
}

/* CUlaunchAttribute and CUlaunchConfig as cuda.h lays them out. */
struct launch_attribute {
    unsigned id;
    char pad[4];
    union {
        char bytes[64];
        int scalar;
        unsigned dims[3];
        struct {
            void *event;
            int flags;
            int trigger_at_block_start;
        } event;
    } value;
};
struct launch_config {
    unsigned grid[3], block[3], shared_bytes;
    void *stream;
    struct launch_attribute *attrs;
    unsigned count;
};

/* The attributes of the last cuLaunchKernelEx that reached a kernel: values[id] for each id in
 * present (a bit per id). */
#define ATTRIBUTE_IDS 16
static unsigned last_attribute_mask;
static long long last_attribute_values[ATTRIBUTE_IDS][3];

#ifndef STANDIN_NO_LAUNCH_EX
/* As cuLaunchKernel, with attributes. Checks what the driver checks of clusters (support,
 * nonzero, divides the grid, at most 8 blocks unless allowed, the kernel's __cluster_dims__),
 * cooperative grids (at most what fits at once) and priorities (0 to -5); refuses with
 * CUDA_ERROR_INVALID_VALUE, or CUDA_ERROR_NOT_SUPPORTED for what the device lacks. */
CUresult cuLaunchKernelEx(const struct launch_config *config, void *function, void **params,
                          void **extra) {
    ENTER(cuLaunchKernelEx);
    if (config == NULL || (config->count > 0 && config->attrs == NULL)) return INVALID_VALUE;
    unsigned mask = 0, cluster[3] = {1, 1, 1}, none[3] = {0, 0, 0};
    long long values[ATTRIBUTE_IDS][3] = {{0}};
    int clustered = 0, cooperative = 0;
    for (unsigned i = 0; i < config->count; i++) {
        const struct launch_attribute *a = &config->attrs[i];
        if (a->id >= ATTRIBUTE_IDS) return INVALID_VALUE;
        mask |= 1u << a->id;
        switch (a->id) {
        case 4: /* CLUSTER_DIMENSION */
            for (int d = 0; d < 3; d++) values[4][d] = cluster[d] = a->value.dims[d];
            clustered = 1;
            break;
        case 7: /* PROGRAMMATIC_EVENT */
            values[7][0] = a->value.event.event != NULL;
            values[7][1] = a->value.event.flags;
            values[7][2] = a->value.event.trigger_at_block_start;
            break;
        default:
            values[a->id][0] = a->value.scalar;
        }
        if (a->id == 2) cooperative = a->value.scalar != 0;
    }
    const unsigned *g = config->grid, *b = config->block;
    pthread_mutex_lock(&lock);
    struct object *f = as(function, K_FUNCTION);
    CUresult status = live(f, "cuLaunchKernelEx");
    if (status == SUCCESS && (mask & (1u << 6 | 1u << 7)) && STANDIN_CC_MAJOR < 9)
        status = NOT_SUPPORTED;
    if (status == SUCCESS && (mask & 1u << 8) && (values[8][0] > 0 || values[8][0] < -5))
        status = INVALID_VALUE;
    if (status == SUCCESS && clustered) {
        const unsigned *required = f->u.function.kernel->cluster;
        unsigned long long blocks = (unsigned long long)cluster[0] * cluster[1] * cluster[2];
        if (STANDIN_CC_MAJOR < 9) status = NOT_SUPPORTED;
        else if (blocks == 0 || g[0] % cluster[0] || g[1] % cluster[1] || g[2] % cluster[2])
            status = INVALID_VALUE;
        else if (blocks > 8 && !f->u.function.non_portable_cluster) status = INVALID_VALUE;
        else if (blocks > MAX_CLUSTER_BLOCKS) status = INVALID_CLUSTER_SIZE;
        else if (required[0] != 0 && (required[0] != cluster[0] || required[1] != cluster[1] ||
                                      required[2] != cluster[2]))
            status = INVALID_VALUE;
    }
    if (status == SUCCESS && cooperative) {
        unsigned long long threads = (unsigned long long)b[0] * b[1] * b[2];
        unsigned long long per_sm = threads <= 64 ? STANDIN_BLOCKS_PER_SM : 2048 / threads;
        if (!STANDIN_COOPERATIVE) status = NOT_SUPPORTED;
        else if ((unsigned long long)g[0] * g[1] * g[2] > per_sm * STANDIN_SMS) status = INVALID_VALUE;
    }
    if (status == SUCCESS) {
        /* PROGRAMMATIC_STREAM_SERIALIZATION (6) or a PROGRAMMATIC_EVENT (7): captured, the
         * node's edge from the node before it is programmatic. */
        int programmatic = ((mask & 1u << 6) && values[6][0] != 0) || ((mask & 1u << 7) && values[7][0]);
        status = launch("cuLaunchKernelEx", function, g, b, config->shared_bytes, config->stream,
                        params, extra, clustered ? cluster : none, cooperative, programmatic);
    }
    if (status == SUCCESS) {
        last_attribute_mask = mask;
        memcpy(last_attribute_values, values, sizeof values);
    }
    pthread_mutex_unlock(&lock);
    return status;
}
#endif

/* Launch priorities run from 0 (least, the default) to -5 (greatest), as on an H100. */
/* STANDIN_BLOCKS_PER_SM blocks of up to 64 threads, fewer of larger ones (2048 threads an SM), and
 * as many as the dynamic shared memory allows (SHARED_OPTIN an SM); none when a block asks for more
 * dynamic shared memory than the function's MAX_DYNAMIC_SHARED_SIZE_BYTES (before the opt-in). */
static int resident_blocks(int block_size, size_t shared_bytes, int allowed);
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, void *function, int block_size,
                                                     size_t shared_bytes) {
    ENTER(cuOccupancyMaxActiveBlocksPerMultiprocessor);
    if (blocks == NULL || block_size <= 0) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct object *f = as(function, K_FUNCTION);
    CUresult status = live(f, "cuOccupancyMaxActiveBlocksPerMultiprocessor");
    int allowed = status == SUCCESS ? f->u.function.max_dynamic_shared : 0;
    pthread_mutex_unlock(&lock);
    if (status != SUCCESS) return status;
    *blocks = resident_blocks(block_size, shared_bytes, allowed);
    return SUCCESS;
}

/* Blocks of `block_size` threads and `shared_bytes` of dynamic shared memory one SM holds, for a
 * function that may use `allowed` bytes of it (the model above). */
static int resident_blocks(int block_size, size_t shared_bytes, int allowed) {
    if (block_size > 1024) return 0; /* every stand-in kernel's MAX_THREADS_PER_BLOCK */
    int n = block_size <= 64 ? STANDIN_BLOCKS_PER_SM : 2048 / block_size;
    if (shared_bytes > 0 && (size_t)n * shared_bytes > SHARED_OPTIN) n = (int)(SHARED_OPTIN / shared_bytes);
    /* As the driver: no block of more dynamic shared memory than the function may use fits. */
    if (shared_bytes > (size_t)allowed) n = 0;
    return n;
}

/* The largest cluster of `function` the device runs: its __cluster_dims__ when it has them, else
 * 8 blocks, or MAX_CLUSTER_BLOCKS when the function allows non-portable sizes. The configuration
 * only has to be there (the cluster dimensions in it are ignored, as by the driver). */
CUresult cuOccupancyMaxPotentialClusterSize(int *size, void *function, const void *config) {
    ENTER(cuOccupancyMaxPotentialClusterSize);
    if (size == NULL || config == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct object *f = as(function, K_FUNCTION);
    CUresult status = live(f, "cuOccupancyMaxPotentialClusterSize");
    int n = 0;
    if (status == SUCCESS) {
        const unsigned *required = f->u.function.kernel->cluster;
        if (required[0] != 0) n = (int)(required[0] * required[1] * required[2]);
        else n = f->u.function.non_portable_cluster ? MAX_CLUSTER_BLOCKS : 8;
    }
    pthread_mutex_unlock(&lock);
    if (status == SUCCESS) *size = n;
    return status;
}

/* ------------------------------------------------------------------------------------------ */
/* Libraries: loaded without a context; the JIT (and its failure) happens per context, later   */
/* ------------------------------------------------------------------------------------------ */

#ifndef STANDIN_NO_LIBRARY
CUresult cuLibraryLoadData(void **library, const void *code, int *jit_options, void **jit_values,
                           unsigned int jit_count, void *library_options, void **library_values,
                           unsigned int library_count) {
    ENTER(cuLibraryLoadData);
    /* The JIT runs later, per context: the JIT options are not read here. */
    (void)jit_options;
    (void)jit_values;
    (void)jit_count;
    (void)library_options;
    (void)library_values;
    (void)library_count;
    if (library == NULL || code == NULL) return INVALID_VALUE;
    size_t extent = blob_extent(code);
    pthread_mutex_lock(&lock);
    struct object *lib = new_object(K_LIBRARY);
    if (lib != NULL) {
        lib->u.library.deferred = jit(code, extent, 0, NULL, NULL);
        lib->u.library.image = code;
        blob_scale_offset(code, extent, lib->u.library.scale_offset);
        blob_kernels(code, extent, lib->u.library.listed);
    }
    pthread_mutex_unlock(&lock);
    if (lib == NULL) return OUT_OF_MEMORY;
    *library = lib;
    return SUCCESS;
}

/* The library's module in the current context: made on the first call per context. */
CUresult cuLibraryGetModule(void **module, void *library) {
    ENTER(cuLibraryGetModule);
    if (module == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct object *lib = as(library, K_LIBRARY), *ctx = current(), *m = NULL;
    CUresult status = live(lib, "cuLibraryGetModule");
    if (status == SUCCESS) status = usable(ctx);
    if (status == SUCCESS) status = lib->u.library.deferred;
    int slot = 0;
    while (status == SUCCESS && slot < LIBRARY_CONTEXTS && lib->u.library.modules[slot] != NULL &&
           lib->u.library.modules[slot]->u.module.ctx != ctx)
        slot++;
    if (status == SUCCESS && slot == LIBRARY_CONTEXTS) status = OUT_OF_MEMORY;
    if (status == SUCCESS && (m = lib->u.library.modules[slot]) == NULL) {
        m = new_module(ctx, lib->u.library.scale_offset);
        if (m == NULL) {
            status = OUT_OF_MEMORY;
        } else {
            m->u.module.library = lib;
            m->u.module.image = lib->u.library.image;
            memcpy(m->u.module.listed, lib->u.library.listed, sizeof m->u.module.listed);
            lib->u.library.modules[slot] = m;
            last_module_ctx = ctx;
        }
    }
    pthread_mutex_unlock(&lock);
    if (status == SUCCESS) *module = m;
    return status;
}

CUresult cuLibraryUnload(void *library) {
    ENTER(cuLibraryUnload);
    pthread_mutex_lock(&lock);
    struct object *lib = as(library, K_LIBRARY);
    CUresult status = live(lib, "cuLibraryUnload");
    if (status == SUCCESS) {
        lib->dead = 1;
        for (int i = 0; i < LIBRARY_CONTEXTS; i++) {
            if (lib->u.library.modules[i] != NULL) unload_module(lib->u.library.modules[i]);
        }
    }
    pthread_mutex_unlock(&lock);
    return status;
}
#endif

/* ------------------------------------------------------------------------------------------ */
/* Stream priorities, stream capture and stream-ordered memory                                */
/* ------------------------------------------------------------------------------------------ */

#define LEAST_PRIORITY 0
#define GREATEST_PRIORITY (-5)

/* The streams this thread began capturing (thread-local mode), most recent last. */
#define THREAD_CAPTURES 16
static __thread struct object *thread_captures[THREAD_CAPTURES];
static __thread int thread_capture_count;

/* This thread, as a token (the address of one of its thread-locals). */
static const void *thread_token(void) { return &thread_capture_count; }

static void thread_captures_remove(struct object *s) {
    for (int i = 0; i < thread_capture_count; i++) {
        if (thread_captures[i] == s) {
            thread_captures[i] = thread_captures[--thread_capture_count];
            return;
        }
    }
}

/* What a call the driver forbids during a thread-local capture answers: the thread's captures are
 * invalidated and the call refused. */
static CUresult refuse_while_thread_captures(void) {
    pthread_mutex_lock(&lock);
    int capturing = 0;
    for (int i = 0; i < thread_capture_count; i++) {
        struct object *s = thread_captures[i];
        if (!s->dead && s->u.stream.capture != 0 && s->u.stream.capture_thread == thread_token()) {
            s->u.stream.capture = 2;
            capturing = 1;
        }
    }
    pthread_mutex_unlock(&lock);
    return capturing ? STREAM_CAPTURE_UNSUPPORTED : SUCCESS;
}

CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest) {
    ENTER(cuCtxGetStreamPriorityRange);
    pthread_mutex_lock(&lock);
    CUresult status = usable(current());
    pthread_mutex_unlock(&lock);
    if (status != SUCCESS) return status;
    if (least) *least = LEAST_PRIORITY;
    if (greatest) *greatest = GREATEST_PRIORITY;
    return SUCCESS;
}

/* As the driver does, a priority outside the range is clamped into it. */
CUresult cuStreamCreateWithPriority(void **stream, unsigned int flags, int priority) {
    ENTER(cuStreamCreateWithPriority);
    if (stream == NULL || (flags & ~1u) != 0) return INVALID_VALUE;
    if (priority > LEAST_PRIORITY) priority = LEAST_PRIORITY;
    if (priority < GREATEST_PRIORITY) priority = GREATEST_PRIORITY;
    pthread_mutex_lock(&lock);
    struct object *ctx = current();
    CUresult status = usable(ctx);
    struct object *s = NULL;
    if (status == SUCCESS) {
        s = new_object(K_STREAM);
        if (s == NULL) status = OUT_OF_MEMORY;
        else {
            s->u.stream.ctx = ctx;
            s->u.stream.priority = priority;
        }
    }
    pthread_mutex_unlock(&lock);
    if (status == SUCCESS) *stream = s;
    return status;
}

CUresult cuStreamGetPriority(void *stream, int *priority) {
    ENTER(cuStreamGetPriority);
    if (priority == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct object *ctx = NULL;
    CUresult status = stream_context(stream, "cuStreamGetPriority", &ctx);
    if (status == SUCCESS) status = usable(ctx);
    struct object *s = as(stream, K_STREAM);
    if (status == SUCCESS) *priority = s != NULL ? s->u.stream.priority : LEAST_PRIORITY;
    pthread_mutex_unlock(&lock);
    return status;
}

/* ------------------------------------------------------------------------------------------ */
/* Graphs                                                                                     */
/* ------------------------------------------------------------------------------------------ */

static unsigned long long capture_ids;

/* Conditional handles: a value per handle, set to its default at each launch of a graph made
 * from the graph it was created in, and by kernels (cudaGraphSetConditional). */
#define HANDLES 1024
static struct {
    struct object *graph;
    unsigned default_value, value;
} handles[HANDLES];
static size_t handle_count;

static void set_conditional(unsigned long long handle, unsigned value) {
    if (handle >= 1 && handle <= handle_count) handles[handle - 1].value = value;
}

static struct object *new_graph(struct object *owner) {
    struct object *g = new_object(K_GRAPH);
    if (g != NULL) g->u.graph.owner = owner;
    return g;
}

/* Marks `g` in use by a graph call. Another call on the same graph meanwhile is a race the driver
 * does not guard against (counted as "graph_race"); the call sleeps with the lock released so that
 * racing callers overlap, then checks that the graph still lives. Called with the lock held;
 * returns with it held. Pair with graph_done. */
static CUresult graph_busy(struct object *g, const char *call) {
    if (g->u.graph.busy++ != 0) {
        note(E_graph_race);
        fprintf(stderr, "standin: %s used a graph that another call was using\n", call);
    }
    pthread_mutex_unlock(&lock);
    usleep(300);
    pthread_mutex_lock(&lock);
    return live(g, call);
}

static void graph_done(struct object *g) { g->u.graph.busy--; }

/* A capture of stream `s` begins or ends: the driver crashes when work is enqueued into the stream
 * meanwhile (counted as "capture_race" by the launch). The call sleeps with the lock released so
 * that racing launches overlap. Called with the lock held; returns with it held. */
static void capture_transition(struct object *s) {
    s->u.stream.transition++;
    pthread_mutex_unlock(&lock);
    usleep(300);
    pthread_mutex_lock(&lock);
    s->u.stream.transition--;
}

/* Appends a node doing `d` to `g`. Called with the lock held. */
static struct object *graph_add(struct object *g, const struct node_data *d) {
    if (g->u.graph.count == g->u.graph.capacity) {
        size_t capacity = g->u.graph.capacity ? g->u.graph.capacity * 2 : 16;
        struct object **grown = realloc(g->u.graph.nodes, capacity * sizeof *grown);
        if (grown == NULL) return NULL;
        g->u.graph.nodes = grown;
        g->u.graph.capacity = capacity;
    }
    struct object *n = new_object(K_NODE);
    if (n == NULL) return NULL;
    n->u.node.graph = g;
    n->u.node.index = g->u.graph.count;
    n->u.node.d = *d;
    g->u.graph.nodes[g->u.graph.count++] = n;
    return n;
}

/* Records `d` where the capture of `s` stands. Called with the lock held. */
static CUresult capture_node(struct object *s, const struct node_data *d) {
    if (s->u.stream.capture == 2) return STREAM_CAPTURE_INVALIDATED;
    if (s->u.stream.graph->u.graph.busy != 0) {
        note(E_graph_race);
        fprintf(stderr, "standin: a node was captured into a graph that another call was using\n");
    }
    struct object *n = graph_add(s->u.stream.graph, d);
    if (n == NULL) return OUT_OF_MEMORY;
    s->u.stream.dependency = n;
    return SUCCESS;
}

/* Whether `g` (or a body graph in it) has memory nodes. */
static int has_memory_nodes(struct object *g) {
    for (size_t i = 0; i < g->u.graph.count; i++) {
        const struct node_data *d = &g->u.graph.nodes[i]->u.node.d;
        if (d->type == NODE_MEM_ALLOC || d->type == NODE_MEM_FREE) return 1;
        for (unsigned b = 0; d->type == NODE_CONDITIONAL && b < d->size; b++)
            if (has_memory_nodes(d->body[b])) return 1;
    }
    return 0;
}

/* Frees the memory of `g`'s allocations that it frees itself, and its node array, once the graph is
 * destroyed and no executable graph made from it lives (its bodies with it). */
static void graph_gone(struct object *g) {
    if (!g->dead || g->u.graph.execs != 0 || g->u.graph.nodes == NULL) return;
    for (size_t i = 0; i < g->u.graph.count; i++) {
        struct node_data *d = &g->u.graph.nodes[i]->u.node.d;
        for (unsigned b = 0; d->type == NODE_CONDITIONAL && b < d->size; b++) graph_gone(d->body[b]);
    }
    for (size_t i = allocation_count; i-- > 0;) {
        if (allocations[i].graph == g && allocations[i].freed_in_graph)
            remove_allocation(&allocations[i]);
    }
    free(g->u.graph.nodes);
    g->u.graph.nodes = NULL;
}

/* Destroys `g` and its nodes' body graphs. Called with the lock held. */
static void destroy_graph(struct object *g) {
    g->dead = 1;
    for (size_t i = 0; i < g->u.graph.count; i++) {
        struct object *n = g->u.graph.nodes[i];
        n->dead = 1;
        for (unsigned b = 0; n->u.node.d.type == NODE_CONDITIONAL && b < n->u.node.d.size; b++)
            destroy_graph(n->u.node.d.body[b]);
    }
    graph_gone(g);
}

static void free_copies(struct node_data *nodes, size_t count) {
    for (size_t i = 0; i < count; i++)
        for (unsigned b = 0; nodes[i].type == NODE_CONDITIONAL && b < nodes[i].size; b++)
            free_copies(nodes[i].body_nodes[b], nodes[i].body_count[b]);
    free(nodes);
}

/* A copy of `g`'s nodes for an executable graph, bodies included; NULL with *status set when a
 * kernel's function is gone (the driver would follow it: the real one crashes). */
static struct node_data *copy_nodes(struct object *g, size_t *count, const char *call,
                                    CUresult *status) {
    struct node_data *out = calloc(g->u.graph.count ? g->u.graph.count : 1, sizeof *out);
    if (out == NULL) {
        *status = OUT_OF_MEMORY;
        return NULL;
    }
    for (size_t i = 0; i < g->u.graph.count; i++) {
        out[i] = g->u.graph.nodes[i]->u.node.d;
        memset(out[i].body_nodes, 0, sizeof out[i].body_nodes);
        if (out[i].type == NODE_KERNEL && (*status = live(out[i].function, call)) != SUCCESS) {
            free_copies(out, i);
            return NULL;
        }
        for (unsigned b = 0; out[i].type == NODE_CONDITIONAL && b < out[i].size; b++) {
            out[i].body_nodes[b] = copy_nodes(out[i].body[b], &out[i].body_count[b], call, status);
            out[i].body[b] = NULL;
            if (out[i].body_nodes[b] == NULL) {
                free_copies(out, i + 1);
                return NULL;
            }
        }
    }
    *count = g->u.graph.count;
    return out;
}

/* Whether `a` and `b` (copies, or a copy and a graph's nodes) have the same topology: the same
 * node types in the same order, bodies included, and kernels of the same cooperativeness. */
static int same_topology(const struct node_data *a, size_t na, struct object *g) {
    if (na != g->u.graph.count) return 0;
    for (size_t i = 0; i < na; i++) {
        const struct node_data *b = &g->u.graph.nodes[i]->u.node.d;
        if (a[i].type != b->type) return 0;
        if (a[i].type == NODE_KERNEL && a[i].cooperative != b->cooperative) return 0;
        if (a[i].type == NODE_CONDITIONAL && (a[i].cond_type != b->cond_type || a[i].size != b->size))
            return 0;
        for (unsigned c = 0; a[i].type == NODE_CONDITIONAL && c < a[i].size; c++)
            if (!same_topology(a[i].body_nodes[c], a[i].body_count[c], b->body[c])) return 0;
    }
    return 1;
}

/* The conditional handles created for `g`, into the executable graph `e`. */
static void collect_handles(struct object *e, struct object *g) {
    e->u.exec.handle_count = 0;
    for (size_t i = 0; i < handle_count && e->u.exec.handle_count < 8; i++)
        if (handles[i].graph == g) e->u.exec.handles[e->u.exec.handle_count++] = i + 1;
}

static void run_memory_node(const struct node_data *d, struct object *ctx);

/* Runs `count` nodes on the host, in `ctx`. Called with the lock held. */
static CUresult run_nodes(const struct node_data *nodes, size_t count, struct object *ctx) {
    for (size_t i = 0; i < count; i++) {
        const struct node_data *d = &nodes[i];
        if (ctx->u.ctx.lost != SUCCESS) return SUCCESS; /* the launch succeeded; the context is lost */
        if (d->type == NODE_KERNEL) {
            CUresult status = live(d->function, "cuGraphLaunch");
            if (status != SUCCESS) return status;
            if (d->function->u.function.module->u.module.ctx != ctx) {
                note(E_context_mismatch);
                return INVALID_HANDLE;
            }
            const struct kernel *k = d->function->u.function.kernel;
            void *params[MAX_PARAMS];
            for (unsigned p = 0; p < k->param_count; p++)
                params[p] = (void *)(d->params + k->offsets[p]);
            run_kernel(d->function, ctx, d->grid[0], d->shared, params,
                       d->cluster[0] ? d->cluster[0] : 1);
        } else if (d->type == NODE_HOST) {
            d->host_fn(d->host_data); /* the lock held: a host function makes no CUDA call */
        } else if (d->type == NODE_MEMCPY || d->type == NODE_MEMSET) {
            run_memory_node(d, ctx);
        } else if (d->type == NODE_CONDITIONAL && d->handle >= 1 && d->handle <= handle_count) {
            unsigned value = handles[d->handle - 1].value;
            /* IF: body 0 when the value is not 0, else body 1 when there is one (ELSE); SWITCH:
             * body `value`, none past the last; WHILE: body 0 while the value is not 0. */
            unsigned body = d->cond_type == 2 ? value : d->cond_type == 0 && value == 0 ? 1 : 0;
            int runs = d->cond_type == 1 ? value != 0 : body < d->size;
            unsigned long rounds = 0;
            while (runs && rounds++ < 1000000) {
                CUresult status = run_nodes(d->body_nodes[body], d->body_count[body], ctx);
                if (status != SUCCESS) return status;
                runs = d->cond_type == 1 && handles[d->handle - 1].value != 0;
            }
        }
    }
    return SUCCESS;
}

CUresult cuStreamBeginCapture_v2(void *stream, int mode) {
    ENTER(cuStreamBeginCapture_v2);
    (void)mode;
    pthread_mutex_lock(&lock);
    struct object *s = as(stream, K_STREAM), *g = NULL;
    CUresult status = (uintptr_t)stream <= 2 ? NOT_SUPPORTED : live(s, "cuStreamBeginCapture_v2");
    if (status == SUCCESS) status = usable(s->u.stream.ctx);
    if (status == SUCCESS) capture_transition(s);
    if (status == SUCCESS && s->u.stream.ctx->u.ctx.syncing != 0) {
        /* The real driver's synchronize invalidates it, or fails: either way it is lost. */
        note(E_capture_during_sync);
        fprintf(stderr, "standin: a capture began while its context was being synchronized\n");
    }
    if (status == SUCCESS && s->u.stream.capture != 0) status = ILLEGAL_STATE;
    if (status == SUCCESS && thread_capture_count == THREAD_CAPTURES) status = OUT_OF_MEMORY;
    if (status == SUCCESS && (g = new_graph(NULL)) == NULL) status = OUT_OF_MEMORY;
    if (status == SUCCESS) {
        s->u.stream.capture = 1;
        s->u.stream.graph = g;
        s->u.stream.into_existing = 0;
        s->u.stream.capture_id = ++capture_ids;
        s->u.stream.capture_thread = thread_token();
        s->u.stream.dependency = NULL;
        thread_captures[thread_capture_count++] = s;
    }
    pthread_mutex_unlock(&lock);
    return status;
}

#ifndef STANDIN_NO_CONDITIONAL
/* Captures `stream` into the existing graph `graph` (a conditional node's body), as a capture of
 * its own. */
CUresult cuStreamBeginCaptureToGraph(void *stream, void *graph, const void *dependencies,
                                     const void *edges, size_t count, int mode) {
    ENTER(cuStreamBeginCaptureToGraph);
    (void)dependencies;
    (void)edges;
    (void)count;
    (void)mode;
    pthread_mutex_lock(&lock);
    struct object *s = as(stream, K_STREAM), *g = as(graph, K_GRAPH);
    CUresult status = (uintptr_t)stream <= 2 ? NOT_SUPPORTED : live(s, "cuStreamBeginCaptureToGraph");
    if (status == SUCCESS) status = live(g, "cuStreamBeginCaptureToGraph");
    if (status == SUCCESS && s->u.stream.capture != 0) status = ILLEGAL_STATE;
    if (status == SUCCESS && thread_capture_count == THREAD_CAPTURES) status = OUT_OF_MEMORY;
    if (status == SUCCESS) {
        status = graph_busy(g, "cuStreamBeginCaptureToGraph");
        if (status == SUCCESS && !s->dead) {
            s->u.stream.capture = 1;
            s->u.stream.graph = g;
            s->u.stream.into_existing = 1;
            s->u.stream.capture_id = ++capture_ids;
            s->u.stream.capture_thread = thread_token();
            s->u.stream.dependency = NULL;
            thread_captures[thread_capture_count++] = s;
        }
        graph_done(g);
    }
    pthread_mutex_unlock(&lock);
    return status;
}
#endif

/* Ends the capture: its graph (a new one, or the one it was begun into), or NULL and
 * CUDA_ERROR_STREAM_CAPTURE_INVALIDATED for a capture that was invalidated; either way the stream
 * is no longer capturing. A thread-local capture ends only on the thread that began it. */
CUresult cuStreamEndCapture(void *stream, void **graph) {
    ENTER(cuStreamEndCapture);
    if (graph == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct object *s = as(stream, K_STREAM);
    CUresult status = live(s, "cuStreamEndCapture");
    if (status == SUCCESS && s->u.stream.capture == 0) status = ILLEGAL_STATE;
    if (status == SUCCESS && s->u.stream.capture_thread != thread_token())
        status = STREAM_CAPTURE_WRONG_THREAD;
    struct object *g = status == SUCCESS ? s->u.stream.graph : NULL;
    if (status == SUCCESS) s->u.stream.transition++;
    if (status == SUCCESS) status = graph_busy(g, "cuStreamEndCapture");
    if (g != NULL) s->u.stream.transition--;
    if (status == SUCCESS && (s->dead || s->u.stream.capture == 0)) status = ILLEGAL_STATE;
    if (status == SUCCESS) {
        int invalidated = s->u.stream.capture == 2;
        /* The streams that joined the capture leave it with its end: a launch into one of them now
         * counts "capture_race" (the driver crashes). */
        for (size_t i = 0; i < arena_used; i++) {
            struct object *o = &arena[i];
            if (o->kind == K_STREAM && !o->dead && o != s && o->u.stream.joined &&
                o->u.stream.graph == g)
                o->u.stream.transition++;
        }
        pthread_mutex_unlock(&lock);
        usleep(300);
        pthread_mutex_lock(&lock);
        for (size_t i = 0; i < arena_used; i++) {
            struct object *o = &arena[i];
            if (o->kind == K_STREAM && !o->dead && o != s && o->u.stream.joined &&
                o->u.stream.graph == g) {
                o->u.stream.transition--;
                o->u.stream.capture = 0;
                o->u.stream.graph = NULL;
                o->u.stream.joined = 0;
            }
        }
        s->u.stream.capture = 0;
        s->u.stream.graph = NULL;
        thread_captures_remove(s);
        *graph = NULL;
        if (invalidated) {
            if (!s->u.stream.into_existing) destroy_graph(g);
            status = STREAM_CAPTURE_INVALIDATED;
        } else {
            *graph = g;
        }
    }
    if (g != NULL) graph_done(g);
    pthread_mutex_unlock(&lock);
    return status;
}

/* Writes CU_STREAM_CAPTURE_STATUS_NONE (0), _ACTIVE (1) or _INVALIDATED (2). */
CUresult cuStreamIsCapturing(void *stream, int *capture_status) {
    ENTER(cuStreamIsCapturing);
    if (capture_status == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct object *ctx = NULL;
    CUresult status = stream_context(stream, "cuStreamIsCapturing", &ctx);
    struct object *s = as(stream, K_STREAM);
    if (status == SUCCESS) *capture_status = s != NULL ? s->u.stream.capture : 0;
    pthread_mutex_unlock(&lock);
    return status;
}

/* What cuStreamGetCaptureInfo_v2 and _v3 answer: status, id, graph, and the one node the next
 * captured work depends on (none at the start); no edge data. */
static CUresult capture_info(void *stream, int *status_out, unsigned long long *id_out,
                             void **graph_out, void *const **deps_out, const void **edges_out,
                             size_t *count_out, const char *call) {
    if (status_out == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct object *ctx = NULL;
    CUresult status = stream_context(stream, call, &ctx);
    struct object *s = as(stream, K_STREAM);
    if (status == SUCCESS) {
        int capture = s != NULL ? s->u.stream.capture : 0;
        *status_out = capture;
        if (capture != 0) {
            if (id_out) *id_out = s->u.stream.capture_id;
            if (graph_out) *graph_out = s->u.stream.graph;
            int has = s->u.stream.dependency != NULL;
            if (deps_out) *deps_out = has ? (void *const *)&s->u.stream.dependency : NULL;
            if (edges_out) *edges_out = NULL;
            if (count_out) *count_out = has;
        }
    }
    pthread_mutex_unlock(&lock);
    return status;
}

CUresult cuStreamGetCaptureInfo_v2(void *stream, int *status, unsigned long long *id, void **graph,
                                   void *const **deps, size_t *count) {
    ENTER(cuStreamGetCaptureInfo_v2);
    return capture_info(stream, status, id, graph, deps, NULL, count, "cuStreamGetCaptureInfo_v2");
}

#ifndef STANDIN_NO_CONDITIONAL
CUresult cuStreamGetCaptureInfo_v3(void *stream, int *status, unsigned long long *id, void **graph,
                                   void *const **deps, const void **edges, size_t *count) {
    ENTER(cuStreamGetCaptureInfo_v3);
    return capture_info(stream, status, id, graph, deps, edges, count, "cuStreamGetCaptureInfo_v3");
}

/* Only CU_STREAM_SET_CAPTURE_DEPENDENCIES: the next captured work depends on the last node given. */
CUresult cuStreamUpdateCaptureDependencies_v2(void *stream, void **nodes, const void *edges,
                                              size_t count, unsigned flags) {
    ENTER(cuStreamUpdateCaptureDependencies_v2);
    (void)edges;
    if (flags != 1 || (count > 0 && nodes == NULL)) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct object *s = as(stream, K_STREAM);
    CUresult status = live(s, "cuStreamUpdateCaptureDependencies_v2");
    if (status == SUCCESS && s->u.stream.capture == 0) status = ILLEGAL_STATE;
    struct object *g = status == SUCCESS ? s->u.stream.graph : NULL;
    if (status == SUCCESS) status = graph_busy(g, "cuStreamUpdateCaptureDependencies_v2");
    if (status == SUCCESS && s->u.stream.graph == g)
        s->u.stream.dependency = count > 0 ? as(nodes[count - 1], K_NODE) : NULL;
    if (g != NULL) graph_done(g);
    pthread_mutex_unlock(&lock);
    return status;
}
#endif

CUresult cuStreamGetCtx(void *stream, void **ctx) {
    ENTER(cuStreamGetCtx);
    if (ctx == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct object *c = NULL;
    CUresult status = stream_context(stream, "cuStreamGetCtx", &c);
    if (status == SUCCESS && c == NULL) status = INVALID_CONTEXT;
    pthread_mutex_unlock(&lock);
    if (status == SUCCESS) *ctx = c;
    return status;
}

/* Waits for the current context's work (which the stand-in ran at once). Refused, invalidating
 * them, while a stream of the context is being captured: the driver does the same. */
CUresult cuCtxSynchronize(void) {
    ENTER(cuCtxSynchronize);
    pthread_mutex_lock(&lock);
    struct object *ctx = current();
    CUresult status = usable(ctx);
    for (size_t i = 0; status == SUCCESS && i < arena_used; i++) {
        struct object *o = &arena[i];
        if (o->kind == K_STREAM && !o->dead && o->u.stream.ctx == ctx && o->u.stream.capture != 0) {
            o->u.stream.capture = 2;
            status = STREAM_CAPTURE_UNSUPPORTED;
        }
    }
#ifdef STANDIN_SLOW_SYNC
    /* The device is busy with work that another thread's launch lets finish (as device work that
     * waits for a host thread would): the synchronize waits, the lock released, for a launch made
     * after it began, or 2 s ("sync_waited_out"). */
    if (status == SUCCESS) {
        ctx->u.ctx.syncing++;
        unsigned long long seen = launch_total;
        int waited = 0;
        while (launch_total == seen && waited < 2000) {
            pthread_mutex_unlock(&lock);
            usleep(1000);
            waited++;
            pthread_mutex_lock(&lock);
        }
        if (launch_total == seen) note(E_sync_waited_out);
        ctx->u.ctx.syncing--;
    }
#endif
    pthread_mutex_unlock(&lock);
    return status;
}

CUresult cuGraphDestroy(void *graph) {
    ENTER(cuGraphDestroy);
    pthread_mutex_lock(&lock);
    struct object *g = as(graph, K_GRAPH);
    CUresult status = live(g, "cuGraphDestroy");
    if (status == SUCCESS && g->u.graph.owner != NULL) status = INVALID_VALUE; /* a node's body */
    if (status == SUCCESS) {
        status = graph_busy(g, "cuGraphDestroy");
        if (status == SUCCESS) destroy_graph(g);
        graph_done(g);
    }
    pthread_mutex_unlock(&lock);
    return status;
}

CUresult cuGraphGetNodes(void *graph, void **nodes, size_t *count) {
    ENTER(cuGraphGetNodes);
    if (count == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct object *g = as(graph, K_GRAPH);
    CUresult status = live(g, "cuGraphGetNodes");
    /* The driver: "Requesting zero nodes is not supported". */
    if (status == SUCCESS && nodes != NULL && *count == 0) status = INVALID_VALUE;
    if (status == SUCCESS) {
        if (nodes != NULL) {
            size_t n = *count < g->u.graph.count ? *count : g->u.graph.count;
            for (size_t i = 0; i < n; i++) nodes[i] = g->u.graph.nodes[i];
            *count = n;
        } else {
            *count = g->u.graph.count;
        }
    }
    pthread_mutex_unlock(&lock);
    return status;
}

CUresult cuGraphNodeGetType(void *node, int *type) {
    ENTER(cuGraphNodeGetType);
    if (type == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct object *n = as(node, K_NODE);
    CUresult status = live(n, "cuGraphNodeGetType");
    if (status == SUCCESS) *type = n->u.node.d.type;
    pthread_mutex_unlock(&lock);
    return status;
}

/* CUgraphEdgeData as cuda.h lays it out. */
struct edge_data {
    unsigned char from_port, to_port, type, reserved[5];
};

/* A graph's nodes stand in a chain, each after the one before it: one dependency, of type
 * CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC (1) from port CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC (1)
 * for a node captured from a programmatic dependent launch, as the driver makes it. */
CUresult cuGraphNodeGetDependencies_v2(void *node, void **from, struct edge_data *edges,
                                       size_t *count) {
    ENTER(cuGraphNodeGetDependencies_v2);
    if (count == NULL || (edges != NULL && from == NULL)) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct object *n = as(node, K_NODE);
    CUresult status = live(n, "cuGraphNodeGetDependencies_v2");
    if (status == SUCCESS) {
        size_t index = n->u.node.index;
        size_t deps = index > 0 ? 1 : 0;
        if (from == NULL) {
            *count = deps;
        } else {
            if (deps > 0 && *count > 0) {
                from[0] = n->u.node.graph->u.graph.nodes[index - 1];
                if (edges != NULL) {
                    memset(&edges[0], 0, sizeof edges[0]);
                    if (n->u.node.d.programmatic) edges[0].from_port = edges[0].type = 1;
                }
            }
            *count = deps < *count ? deps : *count;
        }
    }
    pthread_mutex_unlock(&lock);
    return status;
}

/* CUDA_KERNEL_NODE_PARAMS_v2 as cuda.h lays it out. */
struct kernel_node_params {
    void *function;
    unsigned grid[3], block[3], shared;
    void **params;
    void **extra;
    void *kernel;
    void *ctx;
};


CUresult cuGraphKernelNodeGetParams_v2(void *node, struct kernel_node_params *out) {
    ENTER(cuGraphKernelNodeGetParams_v2);
    if (out == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct object *n = as(node, K_NODE);
    CUresult status = live(n, "cuGraphKernelNodeGetParams_v2");
    if (status == SUCCESS && n->u.node.d.type != NODE_KERNEL) status = INVALID_VALUE;
    if (status == SUCCESS) {
        /* The parameters are not handed back. */
        memset(out, 0, sizeof *out);
        out->function = n->u.node.d.function;
        memcpy(out->grid, n->u.node.d.grid, sizeof out->grid);
        memcpy(out->block, n->u.node.d.block, sizeof out->block);
        out->shared = n->u.node.d.shared;
    }
    pthread_mutex_unlock(&lock);
    return status;
}

/* CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION (4): the node's cluster (zeros without);
 * CU_LAUNCH_ATTRIBUTE_COOPERATIVE (2): whether it is cooperative. */
CUresult cuGraphKernelNodeGetAttribute(void *node, int attribute, void *value) {
    ENTER(cuGraphKernelNodeGetAttribute);
    if (value == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct object *n = as(node, K_NODE);
    CUresult status = live(n, "cuGraphKernelNodeGetAttribute");
    if (status == SUCCESS && n->u.node.d.type != NODE_KERNEL) status = INVALID_VALUE;
    if (status == SUCCESS) {
        memset(value, 0, 64);
        if (attribute == 4) memcpy(value, n->u.node.d.cluster, sizeof n->u.node.d.cluster);
        else if (attribute == 2) memcpy(value, &n->u.node.d.cooperative, sizeof(int));
        else status = NOT_SUPPORTED;
    }
    pthread_mutex_unlock(&lock);
    return status;
}

/* An executable graph: a copy of the graph's nodes, every kernel's function checked to be live. A
 * graph with memory nodes has one at a time. */
CUresult cuGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags) {
    ENTER(cuGraphInstantiateWithFlags);
    if (exec == NULL || flags != 0) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct object *g = as(graph, K_GRAPH), *e = NULL, *ctx = current();
    CUresult status = live(g, "cuGraphInstantiateWithFlags");
    if (status == SUCCESS) status = usable(ctx);
    if (status == SUCCESS && g->u.graph.execs > 0 && has_memory_nodes(g)) status = INVALID_VALUE;
    size_t count = 0;
    struct node_data *nodes = NULL;
    if (status == SUCCESS) nodes = copy_nodes(g, &count, "cuGraphInstantiateWithFlags", &status);
    if (status == SUCCESS && (e = new_object(K_EXEC)) == NULL) {
        free_copies(nodes, count);
        status = OUT_OF_MEMORY;
    }
    if (status == SUCCESS) {
        e->u.exec.ctx = ctx;
        e->u.exec.graph = g;
        e->u.exec.nodes = nodes;
        e->u.exec.count = count;
        collect_handles(e, g);
        g->u.graph.execs++;
    }
    pthread_mutex_unlock(&lock);
    if (status == SUCCESS) *exec = e;
    return status;
}

/* Stream and executable graph of one context, or the failure. Called with the lock held. */
static CUresult exec_on(void *exec, void *stream, const char *call, struct object **e_out) {
    struct object *e = as(exec, K_EXEC), *ctx = NULL;
    CUresult status = live(e, call);
    if (status == SUCCESS) status = stream_context(stream, call, &ctx);
    if (status == SUCCESS) status = usable(ctx);
    if (status == SUCCESS && ctx != e->u.exec.ctx) {
        note(E_context_mismatch);
        status = INVALID_HANDLE;
    }
    *e_out = e;
    return status;
}

/* Runs the executable graph's nodes in order, now. Refused while an allocation its last launch
 * left unfreed is still live, as the driver refuses it. */
CUresult cuGraphLaunch(void *exec, void *stream) {
    ENTER(cuGraphLaunch);
    pthread_mutex_lock(&lock);
    struct object *e = NULL;
    CUresult status = exec_on(exec, stream, "cuGraphLaunch", &e);
    struct object *s = as(stream, K_STREAM);
    if (status == SUCCESS && s != NULL && s->u.stream.capture != 0) status = NOT_SUPPORTED;
    for (size_t i = 0; status == SUCCESS && e->u.exec.launched && i < e->u.exec.count; i++) {
        const struct node_data *a = &e->u.exec.nodes[i];
        if (a->type != NODE_MEM_ALLOC) continue;
        int freed = 0;
        for (size_t j = 0; j < e->u.exec.count; j++)
            freed |= e->u.exec.nodes[j].type == NODE_MEM_FREE && e->u.exec.nodes[j].ptr == a->ptr;
        if (!freed && find_allocation((void *)(uintptr_t)a->ptr, 1) != NULL) status = INVALID_VALUE;
    }
    if (status == SUCCESS) {
        for (int h = 0; h < e->u.exec.handle_count; h++)
            handles[e->u.exec.handles[h] - 1].value = handles[e->u.exec.handles[h] - 1].default_value;
        e->u.exec.launched = 1;
        status = run_nodes(e->u.exec.nodes, e->u.exec.count, e->u.exec.ctx);
    }
    pthread_mutex_unlock(&lock);
    return status;
}

CUresult cuGraphUpload(void *exec, void *stream) {
    ENTER(cuGraphUpload);
    pthread_mutex_lock(&lock);
    struct object *e = NULL;
    CUresult status = exec_on(exec, stream, "cuGraphUpload", &e);
    for (size_t i = 0; status == SUCCESS && i < e->u.exec.count; i++)
        if (e->u.exec.nodes[i].type == NODE_KERNEL)
            status = live(e->u.exec.nodes[i].function, "cuGraphUpload");
    pthread_mutex_unlock(&lock);
    return status;
}

CUresult cuGraphExecDestroy(void *exec) {
    ENTER(cuGraphExecDestroy);
    pthread_mutex_lock(&lock);
    struct object *e = as(exec, K_EXEC);
    CUresult status = live(e, "cuGraphExecDestroy");
    if (status == SUCCESS) {
        e->dead = 1;
        free_copies(e->u.exec.nodes, e->u.exec.count);
        e->u.exec.nodes = NULL;
        struct object *g = e->u.exec.graph;
        g->u.graph.execs--;
        graph_gone(g);
    }
    pthread_mutex_unlock(&lock);
    return status;
}

/* Replaces a kernel node's function, configuration and parameters in the executable graph; its
 * attributes stay. The function must be live and of the graph's context. */
CUresult cuGraphExecKernelNodeSetParams_v2(void *exec, void *node,
                                           const struct kernel_node_params *p) {
    ENTER(cuGraphExecKernelNodeSetParams_v2);
    if (p == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct object *e = as(exec, K_EXEC), *n = as(node, K_NODE), *f = as(p->function, K_FUNCTION);
    CUresult status = live(e, "cuGraphExecKernelNodeSetParams_v2");
    if (status == SUCCESS) status = live(n, "cuGraphExecKernelNodeSetParams_v2");
    if (status == SUCCESS) status = live(f, "cuGraphExecKernelNodeSetParams_v2");
    if (status == SUCCESS && (n->u.node.graph != e->u.exec.graph || n->u.node.index >= e->u.exec.count ||
                              e->u.exec.nodes[n->u.node.index].type != NODE_KERNEL))
        status = INVALID_VALUE;
    if (status == SUCCESS && f->u.function.module->u.module.ctx != e->u.exec.ctx) {
        note(E_context_mismatch);
        status = INVALID_VALUE;
    }
    const struct kernel *k = status == SUCCESS ? f->u.function.kernel : NULL;
    if (status == SUCCESS && k->param_count > 0 && p->params == NULL) status = INVALID_VALUE;
    if (status == SUCCESS && p->shared > (unsigned)f->u.function.max_dynamic_shared) status = INVALID_VALUE;
    if (status == SUCCESS && param_end(k) > PARAM_BYTES) status = NOT_SUPPORTED; /* not modelled */
    if (status == SUCCESS) {
        struct node_data *d = &e->u.exec.nodes[n->u.node.index];
        d->function = f;
        memcpy(d->grid, p->grid, sizeof d->grid);
        memcpy(d->block, p->block, sizeof d->block);
        d->shared = p->shared;
        pack_params(k, p->params, d->params);
    }
    pthread_mutex_unlock(&lock);
    return status;
}

/* CUgraphExecUpdateResultInfo as cuda.h lays it out. */
struct update_result {
    int result;
    void *error_node;
    void *error_from_node;
};

/* Takes the new graph's node parameters when its topology is the executable graph's; otherwise
 * CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE with CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED (2), and
 * nothing changes. The executable graph's nodes keep being named by the graph it came from. */
CUresult cuGraphExecUpdate_v2(void *exec, void *graph, struct update_result *info) {
    ENTER(cuGraphExecUpdate_v2);
    if (info == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct object *e = as(exec, K_EXEC), *g = as(graph, K_GRAPH);
    CUresult status = live(e, "cuGraphExecUpdate_v2");
    if (status == SUCCESS) status = live(g, "cuGraphExecUpdate_v2");
    info->result = 0;
    info->error_node = info->error_from_node = NULL;
    if (status == SUCCESS && !same_topology(e->u.exec.nodes, e->u.exec.count, g)) {
        info->result = 2;
        status = GRAPH_EXEC_UPDATE_FAILURE;
    }
    size_t count = 0;
    struct node_data *nodes = NULL;
    if (status == SUCCESS) nodes = copy_nodes(g, &count, "cuGraphExecUpdate_v2", &status);
    if (status == SUCCESS) {
        free_copies(e->u.exec.nodes, e->u.exec.count);
        e->u.exec.nodes = nodes;
        e->u.exec.count = count;
        collect_handles(e, g);
    }
    pthread_mutex_unlock(&lock);
    return status;
}

#ifndef STANDIN_NO_CONDITIONAL
CUresult cuGraphConditionalHandleCreate(unsigned long long *handle, void *graph, void *ctx,
                                        unsigned default_value, unsigned flags) {
    ENTER(cuGraphConditionalHandleCreate);
    (void)flags;
    if (handle == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct object *g = as(graph, K_GRAPH), *c = as(ctx, K_CONTEXT);
    CUresult status = live(g, "cuGraphConditionalHandleCreate");
    if (status == SUCCESS) status = usable(c);
    if (status == SUCCESS) {
        status = graph_busy(g, "cuGraphConditionalHandleCreate");
        if (status == SUCCESS && handle_count == HANDLES) status = OUT_OF_MEMORY;
        if (status == SUCCESS) {
            handles[handle_count].graph = g;
            handles[handle_count].default_value = default_value;
            handles[handle_count].value = default_value;
            *handle = ++handle_count;
        }
        graph_done(g);
    }
    pthread_mutex_unlock(&lock);
    return status;
}

/* Adds a conditional node (CUgraphNodeParams of type 13) to `graph`: its body graphs are made for
 * it and handed out through the parameters' phGraph_out, as the driver does. Sizes as the driver
 * takes them: 1 for WHILE, 1 or 2 for IF, 1 or more for SWITCH (up to BODIES here); a driver older
 * than CUDA 12.8 takes neither an ELSE body nor a SWITCH. Other node types are not modelled. */
CUresult cuGraphAddNode_v2(void **node, void *graph, void *const *dependencies, const void *edges,
                           size_t count, void *params) {
    ENTER(cuGraphAddNode_v2);
    (void)dependencies;
    (void)edges;
    (void)count;
    if (node == NULL || params == NULL) return INVALID_VALUE;
    unsigned char *p = params;
    int type;
    unsigned long long handle;
    int cond_type;
    unsigned size;
    memcpy(&type, p, 4);
    memcpy(&handle, p + 16, 8);
    memcpy(&cond_type, p + 24, 4);
    memcpy(&size, p + 28, 4);
    if (type != NODE_CONDITIONAL) return NOT_SUPPORTED;
    if (cond_type < 0 || cond_type > 2 || size == 0 || (cond_type == 1 && size != 1) ||
        (cond_type == 0 && size > 2))
        return INVALID_VALUE;
    if (STANDIN_DRIVER_VERSION < 12080 && (cond_type == 2 || size > 1)) return INVALID_VALUE;
    if (size > BODIES) return NOT_SUPPORTED;
    pthread_mutex_lock(&lock);
    struct object *g = as(graph, K_GRAPH), *n = NULL;
    CUresult status = live(g, "cuGraphAddNode_v2");
    if (status == SUCCESS) {
        status = graph_busy(g, "cuGraphAddNode_v2");
        if (status == SUCCESS && (handle == 0 || handle > handle_count)) status = INVALID_VALUE;
        struct node_data d;
        memset(&d, 0, sizeof d);
        d.type = NODE_CONDITIONAL;
        d.handle = handle;
        d.cond_type = cond_type;
        if (status == SUCCESS && (n = graph_add(g, &d)) == NULL) status = OUT_OF_MEMORY;
        for (unsigned b = 0; status == SUCCESS && b < size; b++) {
            if ((n->u.node.d.body[b] = new_graph(n)) == NULL) status = OUT_OF_MEMORY;
            else n->u.node.d.size = b + 1;
        }
        if (status == SUCCESS) {
            memcpy(n->u.node.bodies, n->u.node.d.body, sizeof n->u.node.bodies);
            struct object **bodies = n->u.node.bodies;
            memcpy(p + 32, &bodies, sizeof bodies);
        }
        graph_done(g);
    }
    pthread_mutex_unlock(&lock);
    if (status == SUCCESS) *node = n;
    return status;
}
#endif

#ifndef STANDIN_NO_MEMORY_POOL_API
static struct object *pools[STANDIN_DEVICES];

static struct object *default_pool(int device);
static CUresult pool_allocate(struct object *pool, size_t bytes, struct object *ctx, char **out);

/* Allocates at once, from `pool` (the default pool of the stream's device when NULL), in the
 * stream's context. On a capturing stream it is a graph allocation (an allocation node of the
 * capture's graph), whose memory the stand-in keeps between replays and counts in no pool. */
static CUresult stream_alloc(CUdeviceptr *ptr, size_t bytes, void *stream, struct object *pool,
                             const char *call) {
    if (ptr == NULL || bytes == 0) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct object *ctx = NULL, *s = as(stream, K_STREAM);
    CUresult status = stream_context(stream, call, &ctx);
    if (status == SUCCESS) status = usable(ctx);
    if (status == SUCCESS && s != NULL && s->u.stream.capture == 2) status = STREAM_CAPTURE_INVALIDATED;
    char *base = NULL;
    if (status == SUCCESS && s != NULL && s->u.stream.capture != 0)
        status = add_allocation(bytes, ctx, 1, &base);
    else if (status == SUCCESS)
        status = pool_allocate(pool ? pool : default_pool(ctx->u.ctx.device), bytes, ctx, &base);
    if (status == SUCCESS) last_alloc_ctx = ctx;
    if (status == SUCCESS && s != NULL && s->u.stream.capture != 0) {
        struct node_data d;
        memset(&d, 0, sizeof d);
        d.type = NODE_MEM_ALLOC;
        d.ptr = (CUdeviceptr)(uintptr_t)base;
        allocations[allocation_count - 1].graph = s->u.stream.graph;
        status = capture_node(s, &d);
    }
    pthread_mutex_unlock(&lock);
    if (status == SUCCESS) *ptr = (CUdeviceptr)(uintptr_t)base;
    return status;
}

CUresult cuMemAllocAsync(CUdeviceptr *ptr, size_t bytes, void *stream) {
    ENTER(cuMemAllocAsync);
    return stream_alloc(ptr, bytes, stream, NULL, "cuMemAllocAsync");
}

/* Frees in stream order (at once). In a capture it is a free node, and must be of an allocation of
 * the capture's graph: anything else is refused and invalidates the capture, as the driver does.
 * Outside, an allocation its graph frees itself cannot be freed. */
CUresult cuMemFreeAsync(CUdeviceptr ptr, void *stream) {
    ENTER(cuMemFreeAsync);
    pthread_mutex_lock(&lock);
    struct object *ctx = NULL, *s = as(stream, K_STREAM);
    CUresult status = stream_context(stream, "cuMemFreeAsync", &ctx);
    struct allocation *a = find_allocation((void *)(uintptr_t)ptr, 1);
    if (status == SUCCESS && (a == NULL || a->base != (char *)(uintptr_t)ptr || !a->user))
        status = INVALID_VALUE;
    if (status == SUCCESS) status = usable(a->ctx);
    if (status == SUCCESS && s != NULL && s->u.stream.capture != 0) {
        if (a->graph != s->u.stream.graph || a->freed_in_graph) {
            s->u.stream.capture = 2;
            status = INVALID_VALUE;
        } else {
            struct node_data d;
            memset(&d, 0, sizeof d);
            d.type = NODE_MEM_FREE;
            d.ptr = ptr;
            a->freed_in_graph = 1;
            status = capture_node(s, &d);
        }
    } else if (status == SUCCESS && a->freed_in_graph) {
        status = INVALID_VALUE;
    } else if (status == SUCCESS) {
        remove_allocation(a);
    }
    pthread_mutex_unlock(&lock);
    return status;
}

CUresult cuDeviceGetDefaultMemPool(void **pool, CUdevice device) {
    ENTER(cuDeviceGetDefaultMemPool);
    if (pool == NULL) return INVALID_VALUE;
    if (device < 0 || device >= STANDIN_DEVICES) return INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    struct object *p = default_pool(device);
    pthread_mutex_unlock(&lock);
    if (p == NULL) return OUT_OF_MEMORY;
    *pool = p;
    return SUCCESS;
}

static CUresult pool_attribute_of(struct object *p, int attribute, void *value, int set);

/* The attributes of a pool: see pool_attribute_of. */
static CUresult pool_attribute(void *pool, int attribute, void *value, int set, const char *call) {
    if (value == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct object *p = as(pool, K_POOL);
    CUresult status = live(p, call);
    if (status == SUCCESS) status = pool_attribute_of(p, attribute, value, set);
    pthread_mutex_unlock(&lock);
    return status;
}

CUresult cuMemPoolSetAttribute(void *pool, int attribute, void *value) {
    ENTER(cuMemPoolSetAttribute);
    return pool_attribute(pool, attribute, value, 1, "cuMemPoolSetAttribute");
}

CUresult cuMemPoolGetAttribute(void *pool, int attribute, void *value) {
    ENTER(cuMemPoolGetAttribute);
    return pool_attribute(pool, attribute, value, 0, "cuMemPoolGetAttribute");
}
#endif

/* ------------------------------------------------------------------------------------------ */
/* Device information: identity, context limits, block size of best occupancy                 */
/* ------------------------------------------------------------------------------------------ */

/* Device d's UUID: fixed bytes, the last one d. */
static void standin_uuid(CUdevice device, char out[16]) {
    static const unsigned char bytes[16] = {0x5c, 0x1e, 0x32, 0x9a, 0x07, 0x44, 0x8f, 0x2b,
                                            0x91, 0x0d, 0xe6, 0x73, 0x4a, 0xb8, 0x00, 0x00};
    memcpy(out, bytes, 16);
    out[15] = (char)device;
}

CUresult cuDeviceGetUuid(char *uuid, CUdevice device) {
    ENTER(cuDeviceGetUuid);
    if (uuid == NULL) return INVALID_VALUE;
    if (device < 0 || device >= STANDIN_DEVICES) return INVALID_DEVICE;
    standin_uuid(device, uuid);
    return SUCCESS;
}

#ifndef STANDIN_NO_UUID_V2
CUresult cuDeviceGetUuid_v2(char *uuid, CUdevice device) {
    ENTER(cuDeviceGetUuid_v2);
    if (uuid == NULL) return INVALID_VALUE;
    if (device < 0 || device >= STANDIN_DEVICES) return INVALID_DEVICE;
    standin_uuid(device, uuid);
    return SUCCESS;
}
#endif

/* "0000:1B:00.0" for device 0, the bus as CU_DEVICE_ATTRIBUTE_PCI_BUS_ID says; refuses a buffer
 * of fewer than 13 bytes, as the driver documents. */
CUresult cuDeviceGetPCIBusId(char *text, int len, CUdevice device) {
    ENTER(cuDeviceGetPCIBusId);
    if (device < 0 || device >= STANDIN_DEVICES) return INVALID_DEVICE;
    if (text == NULL || len < 13) return INVALID_VALUE;
    snprintf(text, (size_t)len, "%04X:%02X:%02X.%X", 0, standin_pci_bus(device), 0, 0);
    return SUCCESS;
}

/* Context limits (CUlimit 0..9), kept per context; a limit never set reads its default. */
enum { LIMIT_COUNT = 10, LIMIT_CONTEXTS = 64 };
static const size_t limit_defaults[LIMIT_COUNT] = {
    1024, 1 << 20, 8 << 20, 2, 2048, 64, 0, 0, 0, 1,
};
static struct {
    struct object *ctx;
    size_t value[LIMIT_COUNT];
} limit_table[LIMIT_CONTEXTS];

/* The limits of `ctx`, made on first use; NULL when the table is full. Call with the lock held. */
static size_t *limits_of(struct object *ctx) {
    for (int i = 0; i < LIMIT_CONTEXTS; i++) {
        if (limit_table[i].ctx == ctx) return limit_table[i].value;
        if (limit_table[i].ctx == NULL) {
            limit_table[i].ctx = ctx;
            memcpy(limit_table[i].value, limit_defaults, sizeof limit_defaults);
            return limit_table[i].value;
        }
    }
    return NULL;
}

/* What the driver documents: CU_LIMIT_SHMEM_SIZE (7) and CU_LIMIT_CIG_ENABLED (8) cannot be set;
 * the device-runtime sync depth (3) is refused from compute capability 9.0 on and goes up to 24;
 * the L2 fetch granularity (5) is clamped to 128 and the persisting L2 size (6) to the device's
 * most; the stack size (0) is rounded up to 16 bytes. */
CUresult cuCtxSetLimit(unsigned limit, size_t value) {
    ENTER(cuCtxSetLimit);
    pthread_mutex_lock(&lock);
    struct object *ctx = current();
    CUresult status = usable(ctx);
    size_t *limits = status == SUCCESS ? limits_of(ctx) : NULL;
    if (status == SUCCESS && limits == NULL) status = OUT_OF_MEMORY;
    if (status == SUCCESS && (limit >= LIMIT_COUNT || limit == 7 || limit == 8)) status = INVALID_VALUE;
    if (status == SUCCESS && limit == 3 && cc_of(ctx->u.ctx.device) >= 90) status = 215;
    if (status == SUCCESS && limit == 3 && value > 24) status = INVALID_VALUE;
    if (status == SUCCESS) {
        if (limit == 0) value = (value + 15) / 16 * 16;
        if (limit == 5 && value > 128) value = 128;
        if (limit == 6 && value > STANDIN_MAX_PERSISTING_L2) value = STANDIN_MAX_PERSISTING_L2;
        limits[limit] = value;
    }
    pthread_mutex_unlock(&lock);
    return status;
}

CUresult cuCtxGetLimit(size_t *value, unsigned limit) {
    ENTER(cuCtxGetLimit);
    if (value == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct object *ctx = current();
    CUresult status = usable(ctx);
    size_t *limits = status == SUCCESS ? limits_of(ctx) : NULL;
    if (status == SUCCESS && limits == NULL) status = OUT_OF_MEMORY;
    if (status == SUCCESS && limit >= LIMIT_COUNT) status = INVALID_VALUE;
    if (status == SUCCESS && limit == 3 && cc_of(ctx->u.ctx.device) >= 90) status = 215;
    if (status == SUCCESS) *value = limits[limit];
    pthread_mutex_unlock(&lock);
    return status;
}

/* As CUDA's occupancy calculator: block sizes from the limit (1024 when 0) down in steps of a warp,
 * the one of most resident threads per SM (the larger on a tie), and the grid that fills every SM
 * with it. A per-size shared memory callback is not modelled. */
CUresult cuOccupancyMaxPotentialBlockSize(int *min_grid, int *block, void *function,
                                          size_t (*shared_of)(int), size_t shared_bytes,
                                          int limit) {
    ENTER(cuOccupancyMaxPotentialBlockSize);
    if (min_grid == NULL || block == NULL || limit < 0) return INVALID_VALUE;
    if (shared_of != NULL) return NOT_SUPPORTED;
    pthread_mutex_lock(&lock);
    struct object *f = as(function, K_FUNCTION);
    CUresult status = live(f, "cuOccupancyMaxPotentialBlockSize");
    int allowed = status == SUCCESS ? f->u.function.max_dynamic_shared : 0;
    pthread_mutex_unlock(&lock);
    if (status != SUCCESS) return status;
    if (limit == 0 || limit > 1024) limit = 1024;
    int best_threads = 0, best_block = 0, best_blocks = 0;
    for (int aligned = (limit + 31) / 32 * 32; aligned > 0; aligned -= 32) {
        int size = aligned < limit ? aligned : limit;
        int blocks = resident_blocks(size, shared_bytes, allowed);
        if (blocks * size > best_threads) {
            best_threads = blocks * size;
            best_block = size;
            best_blocks = blocks;
        }
    }
    *min_grid = best_blocks * STANDIN_SMS;
    *block = best_block;
    return SUCCESS;
}

/* Copies between device memory, 2D copies, fills, peer access                                */
/* ------------------------------------------------------------------------------------------ */

#define PEER_ACCESS_UNSUPPORTED 217
#define PEER_ACCESS_ALREADY_ENABLED 704

/* Memory types of CUDA_MEMCPY2D. */
enum { MEMORY_HOST = 1, MEMORY_DEVICE = 2 };

/* CUDA_MEMCPY2D as cuda.h lays it out. */
struct memcpy_2d {
    size_t src_x, src_y;
    int src_type;
    const void *src_host;
    CUdeviceptr src_device;
    void *src_array;
    size_t src_pitch;
    size_t dst_x, dst_y;
    int dst_type;
    void *dst_host;
    CUdeviceptr dst_device;
    void *dst_array;
    size_t dst_pitch;
    size_t width, height;
};

/* What a copy or fill does, as data: rows of `width` bytes, `height` of them, each side's rows a
 * pitch apart (a 1D copy is one row). A copy or fill node keeps it in its params bytes. */
struct memory_op {
    unsigned long long dst, src; /* addresses; src unused by fills */
    unsigned long long width, height, dst_pitch, src_pitch;
    unsigned value, value_width; /* fills: the value and its width in bytes (1, 2, 4) */
};
_Static_assert(sizeof(struct memory_op) <= PARAM_BYTES, "a memory op fits a node's params");

/* The live allocation holding the rows of one side, or NULL. */
static struct allocation *rows_allocation(unsigned long long at, const struct memory_op *op,
                                          unsigned long long pitch) {
    if (op->height == 0 || op->width == 0) return NULL;
    size_t extent = (size_t)((op->height - 1) * pitch + op->width);
    return find_allocation((const void *)(uintptr_t)at, extent);
}

/* Whether the byte ranges the rows of the two sides span overlap. */
static int op_overlaps(const struct memory_op *op) {
    unsigned long long dst_end = op->dst + (op->height - 1) * op->dst_pitch + op->width;
    unsigned long long src_end = op->src + (op->height - 1) * op->src_pitch + op->width;
    return op->dst < src_end && op->src < dst_end;
}

/* Does `op` on device memory now (every side device memory of live allocations). */
static void apply_memory_op(const struct memory_op *op, int fill) {
    for (unsigned long long r = 0; r < op->height; r++) {
        unsigned char *dst = (unsigned char *)(uintptr_t)(op->dst + r * op->dst_pitch);
        if (!fill) {
            memmove(dst, (const void *)(uintptr_t)(op->src + r * op->src_pitch), op->width);
            continue;
        }
        for (unsigned long long b = 0; b < op->width; b += op->value_width)
            memcpy(dst + b, &op->value, op->value_width); /* little-endian, as the device */
    }
}

/* A replay of a copy or fill node: the memory it touches must still be allocated; if it is not,
 * the device faults and its context is lost, as the real one's is. Called with the lock held. */
static void run_memory_node(const struct node_data *d, struct object *ctx) {
    struct memory_op op;
    memcpy(&op, d->params, sizeof op);
    int fill = d->type == NODE_MEMSET;
    if (rows_allocation(op.dst, &op, op.dst_pitch) == NULL ||
        (!fill && rows_allocation(op.src, &op, op.src_pitch) == NULL)) {
        fprintf(stderr, "standin: a replayed copy or fill touched freed memory\n");
        note(E_fault);
        ctx->u.ctx.lost = ILLEGAL_ADDRESS;
        return;
    }
    apply_memory_op(&op, fill);
}

/* Checks a copy or fill of device memory on `stream` and does it now, or, on a capturing stream,
 * records it as a node. `dst_ctx`/`src_ctx`: the contexts the memory must be of (a peer copy's
 * arguments), or NULL for the stream's, whose violation Atlas must never cause (counted as
 * "context_mismatch"). Called with the lock held. */
static CUresult memory_op(const char *call, const struct memory_op *op, int fill, void *stream,
                          struct object *dst_ctx, struct object *src_ctx, int peer) {
    struct object *ctx = NULL;
    CUresult status = stream_context(stream, call, &ctx);
    if (status == SUCCESS) status = usable(ctx);
    if (status != SUCCESS) return status;
    if (op->width == 0 || op->height == 0) return SUCCESS;
    struct allocation *d = rows_allocation(op->dst, op, op->dst_pitch);
    struct allocation *s = fill ? NULL : rows_allocation(op->src, op, op->src_pitch);
    if (d == NULL || (!fill && s == NULL)) return INVALID_VALUE;
    if (peer) {
        if (d->ctx != dst_ctx || s->ctx != src_ctx) return INVALID_VALUE;
    } else if (d->ctx != ctx || (s != NULL && s->ctx != ctx)) {
        note(E_context_mismatch);
        fprintf(stderr, "standin: %s was given memory of another context than its stream's\n", call);
    }
    if (!fill && op_overlaps(op)) {
        note(E_copy_overlap);
        fprintf(stderr, "standin: %s was given overlapping source and destination\n", call);
    }
    struct object *st = as(stream, K_STREAM);
    if (st != NULL && st->u.stream.capture != 0) {
        struct node_data n;
        memset(&n, 0, sizeof n);
        n.type = fill ? NODE_MEMSET : NODE_MEMCPY;
        memcpy(n.params, op, sizeof *op);
        return capture_node(st, &n);
    }
    apply_memory_op(op, fill);
    return SUCCESS;
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, void *stream) {
    ENTER(cuMemcpyDtoDAsync_v2);
    struct memory_op op = {dst, src, bytes, 1, bytes, bytes, 0, 0};
    pthread_mutex_lock(&lock);
    CUresult status = memory_op("cuMemcpyDtoDAsync_v2", &op, 0, stream, NULL, NULL, 0);
    pthread_mutex_unlock(&lock);
    return status;
}

CUresult cuMemcpyPeerAsync(CUdeviceptr dst, void *dst_context, CUdeviceptr src, void *src_context,
                           size_t bytes, void *stream) {
    ENTER(cuMemcpyPeerAsync);
    struct memory_op op = {dst, src, bytes, 1, bytes, bytes, 0, 0};
    pthread_mutex_lock(&lock);
    struct object *dc = as(dst_context, K_CONTEXT), *sc = as(src_context, K_CONTEXT);
    CUresult status = usable(dc);
    if (status == SUCCESS) status = usable(sc);
    if (status == SUCCESS)
        status = memory_op("cuMemcpyPeerAsync", &op, 0, stream, dc, sc, 1);
    pthread_mutex_unlock(&lock);
    return status;
}

/* Device-to-device rows are a copy like any other; a side in host memory is copied at once, even
 * under capture (as the host/device copies above are). */
CUresult cuMemcpy2DAsync_v2(const struct memcpy_2d *p, void *stream) {
    ENTER(cuMemcpy2DAsync_v2);
    if (p == NULL || p->src_x != 0 || p->src_y != 0 || p->dst_x != 0 || p->dst_y != 0 ||
        (p->height > 1 && (p->width > p->src_pitch || p->width > p->dst_pitch)))
        return INVALID_VALUE;
    int src_device = p->src_type == MEMORY_DEVICE, dst_device = p->dst_type == MEMORY_DEVICE;
    if ((!src_device && p->src_type != MEMORY_HOST) || (!dst_device && p->dst_type != MEMORY_HOST))
        return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    CUresult status = SUCCESS;
    if (src_device && dst_device) {
        struct memory_op op = {p->dst_device, p->src_device, p->width, p->height, p->dst_pitch,
                               p->src_pitch, 0, 0};
        status = memory_op("cuMemcpy2DAsync_v2", &op, 0, stream, NULL, NULL, 0);
    } else {
        struct object *ctx = NULL;
        status = stream_context(stream, "cuMemcpy2DAsync_v2", &ctx);
        if (status == SUCCESS) status = usable(ctx);
        struct memory_op op = {p->dst_device, p->src_device, p->width, p->height, p->dst_pitch,
                               p->src_pitch, 0, 0};
        if (status == SUCCESS && p->width != 0 && p->height != 0) {
            if (dst_device && rows_allocation(op.dst, &op, op.dst_pitch) == NULL) status = INVALID_VALUE;
            if (src_device && rows_allocation(op.src, &op, op.src_pitch) == NULL) status = INVALID_VALUE;
        }
        for (size_t r = 0; status == SUCCESS && r < p->height; r++) {
            unsigned char *to = dst_device ? (unsigned char *)(uintptr_t)p->dst_device
                                           : (unsigned char *)p->dst_host;
            const unsigned char *from = src_device ? (const unsigned char *)(uintptr_t)p->src_device
                                                   : (const unsigned char *)p->src_host;
            memcpy(to + r * p->dst_pitch, from + r * p->src_pitch, p->width);
        }
    }
    pthread_mutex_unlock(&lock);
    return status;
}

/* A fill of `count` values of `width` bytes; the address must be aligned to the width. */
static CUresult memset_async(const char *call, CUdeviceptr dst, unsigned value, unsigned width,
                             size_t count, void *stream) {
    if (dst % width != 0) return INVALID_VALUE;
    struct memory_op op = {dst, 0, (unsigned long long)count * width, 1, 0, 0, value, width};
    op.dst_pitch = op.width;
    pthread_mutex_lock(&lock);
    CUresult status = memory_op(call, &op, 1, stream, NULL, NULL, 0);
    pthread_mutex_unlock(&lock);
    return status;
}

CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t count, void *stream) {
    ENTER(cuMemsetD8Async);
    return memset_async("cuMemsetD8Async", dst, value, 1, count, stream);
}

CUresult cuMemsetD16Async(CUdeviceptr dst, unsigned short value, size_t count, void *stream) {
    ENTER(cuMemsetD16Async);
    return memset_async("cuMemsetD16Async", dst, value, 2, count, stream);
}

CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned value, size_t count, void *stream) {
    ENTER(cuMemsetD32Async);
    return memset_async("cuMemsetD32Async", dst, value, 4, count, stream);
}

/* Which device's context enabled access to which device's memory. */
static unsigned char peer_enabled[STANDIN_DEVICES][STANDIN_DEVICES];

CUresult cuDeviceCanAccessPeer(int *can, CUdevice device, CUdevice peer) {
    ENTER(cuDeviceCanAccessPeer);
    if (can == NULL) return INVALID_VALUE;
    if (device < 0 || device >= STANDIN_DEVICES || peer < 0 || peer >= STANDIN_DEVICES)
        return INVALID_DEVICE;
#ifdef STANDIN_NO_PEER_ACCESS
    *can = 0;
#else
    *can = device != peer;
#endif
    return SUCCESS;
}

CUresult cuCtxEnablePeerAccess(void *peer_context, unsigned int flags) {
    ENTER(cuCtxEnablePeerAccess);
    if (flags != 0) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct object *ctx = current(), *peer = as(peer_context, K_CONTEXT);
    CUresult status = usable(ctx);
    if (status == SUCCESS) status = usable(peer);
    if (status == SUCCESS && ctx == peer) status = INVALID_CONTEXT;
#ifdef STANDIN_NO_PEER_ACCESS
    if (status == SUCCESS) status = PEER_ACCESS_UNSUPPORTED;
#endif
    if (status == SUCCESS) {
        unsigned char *enabled = &peer_enabled[ctx->u.ctx.device][peer->u.ctx.device];
        if (*enabled) status = PEER_ACCESS_ALREADY_ENABLED;
        *enabled = 1;
    }
    pthread_mutex_unlock(&lock);
    return status;
}

/* Whether the context of `device` enabled access to the memory of device `peer` (0 or 1). */
int standin_peer_enabled(int device, int peer) {
    if (device < 0 || device >= STANDIN_DEVICES || peer < 0 || peer >= STANDIN_DEVICES) return 0;
    pthread_mutex_lock(&lock);
    int enabled = peer_enabled[device][peer];
    pthread_mutex_unlock(&lock);
    return enabled;
}

/* ------------------------------------------------------------------------------------------ */
/* Inspection for tests                                                                       */
/* ------------------------------------------------------------------------------------------ */

/* How many times: an entry point was called ("cuLaunchKernel"; injected failures included; "calls":
 * all of them), an event happened ("stale_handle", "context_mismatch", "fault", "graph_race"); or how many things
 * are alive now ("live_allocations": cuMemAlloc'd blocks, "live_modules": modules not unloaded,
 * "live_graphs": graphs not destroyed (not counting bodies), "live_execs": executable graphs,
 * "live_pools": pools made by cuMemPoolCreate and not destroyed, "live_imports": pointers imported
 * from pools and not released). -1 for a name it does not know. */
long long standin_count(const char *what) {
    for (int i = 0; i < ENTRY_COUNT; i++)
        if (strcmp(what, entry_names[i]) == 0)
            return (long long)__atomic_load_n(&entry_calls[i], __ATOMIC_RELAXED);
    for (int i = 0; i < EVENT_COUNT; i++)
        if (strcmp(what, event_names[i]) == 0)
            return (long long)__atomic_load_n(&event_counts[i], __ATOMIC_RELAXED);
    long long n = -1;
    if (strcmp(what, "calls") == 0) {
        n = 0;
        for (int i = 0; i < ENTRY_COUNT; i++) n += (long long)__atomic_load_n(&entry_calls[i], __ATOMIC_RELAXED);
        return n;
    }
    pthread_mutex_lock(&lock);
    if (strcmp(what, "live_allocations") == 0) {
        n = 0;
        for (size_t i = 0; i < allocation_count; i++) n += allocations[i].user;
    } else if (strcmp(what, "live_modules") == 0) {
        n = 0;
        for (size_t i = 0; i < arena_used; i++) n += arena[i].kind == K_MODULE && !arena[i].dead;
    } else if (strcmp(what, "live_graphs") == 0) {
        n = 0;
        for (size_t i = 0; i < arena_used; i++)
            n += arena[i].kind == K_GRAPH && !arena[i].dead && arena[i].u.graph.owner == NULL;
    } else if (strcmp(what, "live_execs") == 0) {
        n = 0;
        for (size_t i = 0; i < arena_used; i++) n += arena[i].kind == K_EXEC && !arena[i].dead;
    } else if (strcmp(what, "live_pools") == 0) {
        n = 0;
        for (size_t i = 0; i < arena_used; i++)
            n += arena[i].kind == K_POOL && !arena[i].dead && arena[i].u.pool.created;
    } else if (strcmp(what, "live_imports") == 0) {
        n = 0;
        for (size_t i = 0; i < allocation_count; i++)
            n += allocations[i].pool != NULL && allocations[i].pool->u.pool.imported;
    }
    pthread_mutex_unlock(&lock);
    return n >= 0 ? n : vmm_count(what); /* virtual memory (near the end of this file) */
}

/* Makes the next `times` calls of `entry` fail with `code` before doing anything. 0 on success,
 * -1 for an unknown entry point. */
int standin_inject(const char *entry, unsigned code, unsigned times) {
    for (int i = 0; i < ENTRY_COUNT; i++) {
        if (strcmp(entry, entry_names[i]) == 0) {
            pthread_mutex_lock(&lock);
            injected[i].code = code;
            __atomic_store_n(&injected[i].times, times, __ATOMIC_RELEASE);
            pthread_mutex_unlock(&lock);
            return 0;
        }
    }
    return -1;
}

/* Zeroes the call and event counters, the last-context records and pending injections. Handles,
 * allocations and contexts stay as they are. */
void standin_reset(void) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < ENTRY_COUNT; i++) {
        __atomic_store_n(&entry_calls[i], 0, __ATOMIC_RELAXED);
        __atomic_store_n(&injected[i].times, 0, __ATOMIC_RELEASE);
    }
    for (int i = 0; i < EVENT_COUNT; i++) __atomic_store_n(&event_counts[i], 0, __ATOMIC_RELAXED);
    last_alloc_ctx = last_module_ctx = last_copy_ctx = last_launch_ctx = NULL;
    last_attribute_mask = 0;
    pthread_mutex_unlock(&lock);
}

/* The primary context of `device`, or NULL before its first cuDevicePrimaryCtxRetain. */
void *standin_primary_context(int device) {
    if (device < 0 || device >= STANDIN_DEVICES) return NULL;
    pthread_mutex_lock(&lock);
    void *p = primary[device];
    pthread_mutex_unlock(&lock);
    return p;
}

/* The context of the last successful call of a kind, or NULL: an allocation (the current context
 * then), a module load (cuModuleLoadData/Ex, or the first cuLibraryGetModule in a context), a copy
 * (the context current on the calling thread, NULL if none), a launch (the stream's context). */
static void *locked_read(struct object **p) {
    pthread_mutex_lock(&lock);
    void *v = *p;
    pthread_mutex_unlock(&lock);
    return v;
}
void *standin_last_alloc_context(void) { return locked_read(&last_alloc_ctx); }
void *standin_last_module_context(void) { return locked_read(&last_module_ctx); }
void *standin_last_copy_context(void) { return locked_read(&last_copy_ctx); }
void *standin_last_launch_context(void) { return locked_read(&last_launch_ctx); }

/* The context of the live allocation (or __device__ variable) holding `ptr`, or NULL. */
void *standin_pointer_context(CUdeviceptr ptr) {
    pthread_mutex_lock(&lock);
    struct allocation *a = find_allocation((void *)(uintptr_t)ptr, 1);
    void *ctx = a ? a->ctx : NULL;
    pthread_mutex_unlock(&lock);
    return ctx;
}

/* With id -1: how many attributes the last cuLaunchKernelEx that reached a kernel had. Else
 * whether it had attribute `id` (0 or 1), with its value in out[0] (a cluster's x, y, z in
 * out[0..3]; an event's "is set", flags and trigger-at-block-start likewise). */
int standin_last_attribute(int id, long long *out) {
    pthread_mutex_lock(&lock);
    int n = 0;
    if (id < 0) {
        for (int i = 0; i < ATTRIBUTE_IDS; i++) n += (last_attribute_mask >> i) & 1;
    } else if (id < ATTRIBUTE_IDS && ((last_attribute_mask >> id) & 1)) {
        n = 1;
        if (out) memcpy(out, last_attribute_values[id], sizeof last_attribute_values[id]);
    }
    pthread_mutex_unlock(&lock);
    return n;
}

/* ------------------------------------------------------------------------------------------ */
/* Events, stream order, host functions                                                       */
/* ------------------------------------------------------------------------------------------ */

/* CU_EVENT_DISABLE_TIMING */
#define EVENT_DISABLE_TIMING 0x2

CUresult cuEventCreate(void **event, unsigned flags) {
    ENTER(cuEventCreate);
    if (event == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct object *ctx = current();
    CUresult status = usable(ctx);
    struct object *e = status == SUCCESS ? new_object(K_EVENT) : NULL;
    if (status == SUCCESS && e == NULL) status = OUT_OF_MEMORY;
    if (status == SUCCESS) {
        e->u.event.ctx = ctx;
        e->u.event.flags = flags;
        *event = e;
    }
    pthread_mutex_unlock(&lock);
    return status;
}

CUresult cuEventDestroy_v2(void *event) {
    ENTER_ANY_TIME(cuEventDestroy_v2);
    pthread_mutex_lock(&lock);
    struct object *e = as(event, K_EVENT);
    CUresult status = live(e, "cuEventDestroy_v2");
    if (status == SUCCESS) e->dead = 1;
    pthread_mutex_unlock(&lock);
    return status;
}

/* Outside a capture the stand-in's work is done when enqueued: the event is complete at once.
 * In a capture it marks a point of the graph. */
CUresult cuEventRecord(void *event, void *stream) {
    ENTER(cuEventRecord);
    pthread_mutex_lock(&lock);
    struct object *e = as(event, K_EVENT), *ctx = NULL;
    CUresult status = live(e, "cuEventRecord");
    if (status == SUCCESS) status = stream_context(stream, "cuEventRecord", &ctx);
    if (status == SUCCESS && ctx != e->u.event.ctx) {
        note(E_context_mismatch);
        status = INVALID_HANDLE;
    }
    struct object *s = as(stream, K_STREAM);
    if (status == SUCCESS && s != NULL && s->u.stream.transition != 0) note(E_capture_race);
    if (status == SUCCESS) {
        e->u.event.recorded = 1;
        if (s != NULL && s->u.stream.capture != 0) {
            e->u.event.captured = s->u.stream.graph;
            e->u.event.capture_id = s->u.stream.capture_id;
        } else {
            e->u.event.captured = NULL;
            e->u.event.time = launch_total;
        }
    }
    pthread_mutex_unlock(&lock);
    return status;
}

/* A stream that waits for a point of a capture joins the capture (its work goes to that graph)
 * until the capture ends; waiting for a completed event orders nothing here. */
CUresult cuStreamWaitEvent(void *stream, void *event, unsigned flags) {
    ENTER(cuStreamWaitEvent);
    (void)flags;
    pthread_mutex_lock(&lock);
    struct object *e = as(event, K_EVENT), *ctx = NULL;
    CUresult status = live(e, "cuStreamWaitEvent");
    if (status == SUCCESS) status = stream_context(stream, "cuStreamWaitEvent", &ctx);
    struct object *s = as(stream, K_STREAM);
    if (status == SUCCESS && s != NULL && s->u.stream.transition != 0) note(E_capture_race);
    if (status == SUCCESS && e->u.event.captured != NULL) {
        if (s == NULL) {
            status = STREAM_CAPTURE_UNSUPPORTED;
        } else if (s->u.stream.capture == 0) {
            s->u.stream.capture = 1;
            s->u.stream.graph = e->u.event.captured;
            s->u.stream.capture_id = e->u.event.capture_id;
            s->u.stream.joined = 1;
            s->u.stream.into_existing = 0;
        } else if (s->u.stream.graph != e->u.event.captured) {
            status = ILLEGAL_STATE;
        }
    }
    pthread_mutex_unlock(&lock);
    return status;
}

CUresult cuEventQuery(void *event) {
    ENTER(cuEventQuery);
    pthread_mutex_lock(&lock);
    struct object *e = as(event, K_EVENT);
    CUresult status = live(e, "cuEventQuery");
    if (status == SUCCESS && e->u.event.captured != NULL) status = STREAM_CAPTURE_UNSUPPORTED;
    pthread_mutex_unlock(&lock);
    return status;
}

CUresult cuEventSynchronize(void *event) {
    ENTER(cuEventSynchronize);
    pthread_mutex_lock(&lock);
    struct object *e = as(event, K_EVENT);
    CUresult status = live(e, "cuEventSynchronize");
    if (status == SUCCESS && e->u.event.captured != NULL) status = STREAM_CAPTURE_UNSUPPORTED;
    pthread_mutex_unlock(&lock);
    return status;
}

/* Half a millisecond per launch made between the two records. */
static CUresult elapsed(float *ms, void *start, void *end, const char *call) {
    if (ms == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct object *a = as(start, K_EVENT), *b = as(end, K_EVENT);
    CUresult status = live(a, call);
    if (status == SUCCESS) status = live(b, call);
    if (status == SUCCESS && ((a->u.event.flags | b->u.event.flags) & EVENT_DISABLE_TIMING))
        status = INVALID_HANDLE;
    if (status == SUCCESS && (!a->u.event.recorded || !b->u.event.recorded)) status = INVALID_HANDLE;
    if (status == SUCCESS && (a->u.event.captured || b->u.event.captured))
        status = STREAM_CAPTURE_UNSUPPORTED;
    if (status == SUCCESS) *ms = 0.5f * (float)(b->u.event.time - a->u.event.time);
    pthread_mutex_unlock(&lock);
    return status;
}

CUresult cuEventElapsedTime(float *ms, void *start, void *end) {
    ENTER(cuEventElapsedTime);
    return elapsed(ms, start, end, "cuEventElapsedTime");
}

CUresult cuEventElapsedTime_v2(float *ms, void *start, void *end) {
    ENTER(cuEventElapsedTime_v2);
    return elapsed(ms, start, end, "cuEventElapsedTime_v2");
}

/* Outside a capture the function runs at once (the stand-in's stream has finished everything
 * before it), the lock released; in a capture it becomes a host node, run at each replay. */
CUresult cuLaunchHostFunc(void *stream, void (*fn)(void *), void *data) {
    ENTER(cuLaunchHostFunc);
    if (fn == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct object *ctx = NULL;
    CUresult status = stream_context(stream, "cuLaunchHostFunc", &ctx);
    if (status == SUCCESS) status = usable(ctx);
    struct object *s = as(stream, K_STREAM);
    if (status == SUCCESS && s != NULL && s->u.stream.transition != 0) note(E_capture_race);
    if (status == SUCCESS && s != NULL && s->u.stream.capture != 0) {
        struct node_data d;
        memset(&d, 0, sizeof d);
        d.type = NODE_HOST;
        d.host_fn = fn;
        d.host_data = data;
        status = capture_node(s, &d);
        pthread_mutex_unlock(&lock);
        return status;
    }
    pthread_mutex_unlock(&lock);
    if (status == SUCCESS) fn(data);
    return status;
}

/* The image `module` was loaded from (its library's, for a module of a library), or NULL when
 * it is not a module. */
const void *standin_module_image(void *module) {
    pthread_mutex_lock(&lock);
    struct object *m = as(module, K_MODULE);
    const void *image = m ? m->u.module.image : NULL;
    pthread_mutex_unlock(&lock);
    return image;
}

/* The function's current MAX_DYNAMIC_SHARED_SIZE_BYTES, or -1 when `function` is not one. */
int standin_max_dynamic_shared(void *function) {
    pthread_mutex_lock(&lock);
    struct object *f = as(function, K_FUNCTION);
    int v = f ? f->u.function.max_dynamic_shared : -1;
    pthread_mutex_unlock(&lock);
    return v;
}

/* ------------------------------------------------------------------------------------------ */
/* Page-locked host memory                                                                    */
/* ------------------------------------------------------------------------------------------ */

/* Ranges of host memory page-locked through the stand-in: allocated by cuMemHostAlloc (filled
 * with 0xA5, so that a reader of memory nobody wrote sees garbage, as it may from the driver) or
 * registered by cuMemHostRegister_v2. A registration that overlaps a live range (by any byte) is
 * refused with CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, as the driver refuses it; a zero size
 * is CUDA_ERROR_INVALID_VALUE. All four calls are refused from a capturing thread, invalidating
 * its capture (the driver answers cuMemHostRegister with 900 there). Copies reach the memory as
 * any host memory; kernels reach mapped (DEVICEMAP) ranges of their context, or portable ones, at
 * the address cuMemHostGetDevicePointer_v2 gives: the host address, as under unified addressing. */

#define HOST_MEMORY_ALREADY_REGISTERED 712
#define HOST_MEMORY_NOT_REGISTERED 713
#define HOST_PORTABLE 0x1
#define HOST_DEVICEMAP 0x2
#define HOST_MAX_RANGES 256

struct host_range {
    char *base;
    size_t size;
    struct object *ctx;
    unsigned flags;
    int allocated; /* cuMemHostAlloc'd, as opposed to registered */
};
static struct host_range host_ranges[HOST_MAX_RANGES];
static int host_range_count;

/* The live range that holds `p`, or NULL. Call with the lock held. */
static struct host_range *host_range_at(const void *p) {
    uintptr_t at = (uintptr_t)p;
    for (int i = 0; i < host_range_count; i++) {
        uintptr_t base = (uintptr_t)host_ranges[i].base;
        if (at >= base && at - base < host_ranges[i].size) return &host_ranges[i];
    }
    return NULL;
}

/* Whether [p, p + bytes) lies in one mapped range that kernels of `ctx` reach. Lock held. */
static int mapped_host_ok(struct object *ctx, const void *p, size_t bytes) {
    struct host_range *r = host_range_at(p);
    if (r == NULL || !(r->flags & HOST_DEVICEMAP)) return 0;
    if (r->ctx != ctx && !(r->flags & HOST_PORTABLE)) return 0;
    return bytes <= r->size - (size_t)((const char *)p - r->base);
}

static CUresult add_host_range(char *base, size_t size, unsigned flags, int allocated) {
    if (host_range_count == HOST_MAX_RANGES) return OUT_OF_MEMORY;
    struct object *ctx = current();
    CUresult status = usable(ctx);
    if (status != SUCCESS) return status;
    host_ranges[host_range_count++] = (struct host_range){base, size, ctx, flags, allocated};
    return SUCCESS;
}

static void remove_host_range(struct host_range *r) { *r = host_ranges[--host_range_count]; }

CUresult cuMemHostAlloc(void **pp, size_t bytes, unsigned flags) {
    ENTER(cuMemHostAlloc);
    CUresult refused = refuse_while_thread_captures();
    if (refused != SUCCESS) return refused;
    if (pp == NULL || bytes == 0 || (flags & ~7u) != 0) return INVALID_VALUE;
    char *base = aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (base == NULL) return OUT_OF_MEMORY;
    memset(base, 0xA5, bytes);
    pthread_mutex_lock(&lock);
    CUresult status = add_host_range(base, bytes, flags, 1);
    pthread_mutex_unlock(&lock);
    if (status != SUCCESS) {
        free(base);
        return status;
    }
    *pp = base;
    return SUCCESS;
}

CUresult cuMemFreeHost(void *p) {
    ENTER(cuMemFreeHost);
    CUresult refused = refuse_while_thread_captures();
    if (refused != SUCCESS) return refused;
    pthread_mutex_lock(&lock);
    struct host_range *r = host_range_at(p);
    CUresult status = r != NULL && r->allocated && r->base == (char *)p ? SUCCESS : INVALID_VALUE;
    if (status == SUCCESS) remove_host_range(r);
    pthread_mutex_unlock(&lock);
    if (status == SUCCESS) free(p);
    return status;
}

CUresult cuMemHostRegister_v2(void *p, size_t bytes, unsigned flags) {
    ENTER(cuMemHostRegister_v2);
    CUresult refused = refuse_while_thread_captures();
    if (refused != SUCCESS) return refused;
    if (p == NULL || bytes == 0 || (flags & ~15u) != 0) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    CUresult status = SUCCESS;
    uintptr_t at = (uintptr_t)p;
    for (int i = 0; i < host_range_count; i++) {
        uintptr_t base = (uintptr_t)host_ranges[i].base;
        if (at < base + host_ranges[i].size && base < at + bytes)
            status = HOST_MEMORY_ALREADY_REGISTERED;
    }
    if (status == SUCCESS) status = add_host_range(p, bytes, flags, 0);
    pthread_mutex_unlock(&lock);
    return status;
}

CUresult cuMemHostUnregister(void *p) {
    ENTER(cuMemHostUnregister);
    CUresult refused = refuse_while_thread_captures();
    if (refused != SUCCESS) return refused;
    pthread_mutex_lock(&lock);
    struct host_range *r = host_range_at(p);
    CUresult status = HOST_MEMORY_NOT_REGISTERED;
    if (r != NULL && r->allocated) status = INVALID_VALUE;
    else if (r != NULL && r->base == (char *)p) status = SUCCESS;
    if (status == SUCCESS) remove_host_range(r);
    pthread_mutex_unlock(&lock);
    return status;
}

CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned flags) {
    ENTER(cuMemHostGetDevicePointer_v2);
    if (pdptr == NULL || flags != 0) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct host_range *r = host_range_at(p);
    CUresult status = usable(current());
    if (status == SUCCESS && (r == NULL || !(r->flags & HOST_DEVICEMAP))) status = INVALID_VALUE;
    pthread_mutex_unlock(&lock);
    if (status == SUCCESS) *pdptr = (CUdeviceptr)(uintptr_t)p;
    return status;
}

/* ------------------------------------------------------------------------------------------ */
/* Memory pools of one's own, and device memory shared between processes                      */
/* ------------------------------------------------------------------------------------------ */

/* A pool's accounting: `used` is what its live allocations take; `reserved` grows to cover them
 * (by exactly what is missing, where the driver maps larger chunks) and shrinks only at
 * cuMemPoolTrimTo (the driver also hands memory above the release threshold back at
 * synchronizations, which the stand-in does not model), never below `used`. A maximum size caps
 * `reserved`. Allocations made in a capture are the graph's, counted in no pool.
 *
 * An exportable pool's memory is a memfd: each allocation is a page-aligned range of it, mapped
 * (MAP_SHARED) where the pool's user sees it, so that a process that imports the pool (the memfd,
 * as the exported descriptor) maps the same range and sees the same bytes; in one process, an
 * import is a second mapping of the range. The memfd's first page names the exporting process and
 * pool, and export data names the range. Imported pools cannot allocate; a pointer imported from
 * one is released by cuMemFree_v2 or cuMemFreeAsync (its mapping only). A destroyed pool's
 * allocations stay until freed (the driver defers the release).
 *
 * Legacy IPC handles name a cuMemAlloc allocation and the exporting process. The stand-in's
 * cuMemAlloc memory is private to its process, so opening a handle in another process is not
 * modelled (CUDA_ERROR_NOT_SUPPORTED); opening one in the exporting process is refused as the
 * driver refuses it (CUDA_ERROR_INVALID_CONTEXT). */

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/types.h>

#define POOL_PAGE 4096
#define HANDLE_TYPE_POSIX_FD 1
#define POOL_MAGIC 0x4c4f4f504e415453ull /* "STANPOOL" */
#define IPC_MAGIC 0x4350494e4e415453ull  /* "STANNIPC" */

/* The first page of an exportable pool's memfd. */
struct pool_header {
    unsigned long long magic;
    long long pid;
    unsigned long long pool; /* the pool's arena slot in the exporting process */
    int device;
};

/* CUmemPoolPtrExportData, as the stand-in fills it. */
struct pool_export {
    unsigned long long magic;
    long long pid;
    unsigned long long pool;
    unsigned long long offset;
    unsigned long long size;
};

/* CUipcMemHandle, and what the stand-in writes in it. */
struct ipc_handle {
    char reserved[64];
};
struct ipc_data {
    unsigned long long magic;
    long long pid;
    unsigned long long ptr;
    unsigned long long size;
};

static size_t page_round(size_t n) { return (n + POOL_PAGE - 1) / POOL_PAGE * POOL_PAGE; }

/* Gives back what a pool's allocation took: its share of the pool, and its memory. Lock held. */
static void release_pool_memory(struct allocation *a) {
    struct object *p = a->pool;
    if (p != NULL && !p->u.pool.imported) p->u.pool.used -= a->size;
    if (a->mapped) munmap(a->base, page_round(a->size));
    else free(a->base);
}

#ifndef STANDIN_NO_MEMORY_POOL_API

/* CUmemPoolProps. */
struct pool_props {
    int alloc_type;   /* CU_MEM_ALLOCATION_TYPE_PINNED (1) */
    int handle_types; /* CUmemAllocationHandleType bits */
    struct {
        int type; /* CU_MEM_LOCATION_TYPE_DEVICE (1) */
        int id;
    } location;
    void *win32_security_attributes;
    size_t max_size; /* CUDA 12.2+; reserved bytes before */
    unsigned short usage;
    unsigned char reserved[54];
};

/* The default pool of `device`, made on first use. Lock held. */
static struct object *default_pool(int device) {
    if (pools[device] == NULL && (pools[device] = new_object(K_POOL)) != NULL) {
        pools[device]->u.pool.device = device;
        pools[device]->u.pool.fd = -1;
    }
    return pools[device];
}

/* Allocates `bytes` of pool `p` for `ctx` (the allocation's entry gets the pool). Lock held. */
static CUresult pool_allocate(struct object *p, size_t bytes, struct object *ctx, char **out) {
    if (p == NULL) return OUT_OF_MEMORY;
    if (p->u.pool.imported) return INVALID_VALUE;
    unsigned long long used = p->u.pool.used + bytes;
    unsigned long long reserved = used > p->u.pool.reserved ? used : p->u.pool.reserved;
    if (p->u.pool.max_size != 0 && reserved > p->u.pool.max_size) return OUT_OF_MEMORY;
    char *base = NULL;
    if (p->u.pool.handle_types & HANDLE_TYPE_POSIX_FD) {
        size_t at = p->u.pool.fd_bytes, span = page_round(bytes);
        if (ftruncate(p->u.pool.fd, (off_t)(at + span)) != 0) return OUT_OF_MEMORY;
        base = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_SHARED, p->u.pool.fd, (off_t)at);
        if (base == MAP_FAILED) return OUT_OF_MEMORY;
        CUresult status = add_allocation_at(base, bytes, ctx, 1);
        if (status != SUCCESS) {
            munmap(base, span);
            return status;
        }
        p->u.pool.fd_bytes = at + span;
        allocations[allocation_count - 1].mapped = 1;
        allocations[allocation_count - 1].offset = at;
    } else {
        CUresult status = add_allocation(bytes, ctx, 1, &base);
        if (status != SUCCESS) return status;
    }
    allocations[allocation_count - 1].pool = p;
    p->u.pool.used = used;
    p->u.pool.reserved = reserved;
    if (used > p->u.pool.used_high) p->u.pool.used_high = used;
    if (reserved > p->u.pool.reserved_high) p->u.pool.reserved_high = reserved;
    *out = base;
    return SUCCESS;
}

/* CUmemPool_attribute 1-3 (reuse policies, int), 4 (release threshold), 5-8 (reserved and used
 * memory, current and high, cuuint64_t; the high ones take only 0, which resets them to the
 * current value). Lock held. */
static CUresult pool_attribute_of(struct object *p, int attribute, void *value, int set) {
    unsigned long long v = 0;
    if (set && attribute >= 4) memcpy(&v, value, 8);
    switch (attribute) {
    case 1: case 2: case 3:
        if (set) p->u.pool.no_reuse[attribute - 1] = *(const int *)value == 0;
        else *(int *)value = !p->u.pool.no_reuse[attribute - 1];
        return SUCCESS;
    case 4:
        if (set) p->u.pool.release_threshold = v;
        else memcpy(value, &p->u.pool.release_threshold, 8);
        return SUCCESS;
    case 5:
        if (set) return INVALID_VALUE;
        memcpy(value, &p->u.pool.reserved, 8);
        return SUCCESS;
    case 6:
        if (set && v != 0) return INVALID_VALUE;
        if (set) p->u.pool.reserved_high = p->u.pool.reserved;
        else memcpy(value, &p->u.pool.reserved_high, 8);
        return SUCCESS;
    case 7:
        if (set) return INVALID_VALUE;
        memcpy(value, &p->u.pool.used, 8);
        return SUCCESS;
    case 8:
        if (set && v != 0) return INVALID_VALUE;
        if (set) p->u.pool.used_high = p->u.pool.used;
        else memcpy(value, &p->u.pool.used_high, 8);
        return SUCCESS;
    default:
        return INVALID_VALUE;
    }
}

CUresult cuMemPoolCreate(void **pool, const struct pool_props *props) {
    ENTER(cuMemPoolCreate);
    if (pool == NULL || props == NULL) return INVALID_VALUE;
    if (props->alloc_type != 1 || props->location.type != 1) return INVALID_VALUE;
    if (props->location.id < 0 || props->location.id >= STANDIN_DEVICES) return INVALID_DEVICE;
    for (size_t i = 0; i < sizeof props->reserved; i++)
        if (props->reserved[i] != 0) return INVALID_VALUE;
    if (STANDIN_DRIVER_VERSION < 12020 && props->max_size != 0) return INVALID_VALUE;
    if ((props->handle_types & ~HANDLE_TYPE_POSIX_FD) != 0) return NOT_SUPPORTED;
#ifdef STANDIN_NO_POSIX_FD
    if (props->handle_types != 0) return NOT_SUPPORTED;
#endif
    int fd = -1;
    if (props->handle_types & HANDLE_TYPE_POSIX_FD) {
        fd = memfd_create("standin-pool", MFD_CLOEXEC);
        if (fd < 0 || ftruncate(fd, POOL_PAGE) != 0) {
            if (fd >= 0) close(fd);
            return OUT_OF_MEMORY;
        }
    }
    pthread_mutex_lock(&lock);
    struct object *p = new_object(K_POOL);
    if (p != NULL) {
        p->u.pool.device = props->location.id;
        p->u.pool.created = 1;
        p->u.pool.handle_types = props->handle_types;
        p->u.pool.max_size = props->max_size;
        p->u.pool.fd = fd;
        p->u.pool.fd_bytes = POOL_PAGE;
        p->u.pool.exporter = (long long)getpid();
        p->u.pool.exporter_pool = (size_t)(p - arena);
    }
    pthread_mutex_unlock(&lock);
    if (p == NULL) {
        if (fd >= 0) close(fd);
        return OUT_OF_MEMORY;
    }
    if (fd >= 0) {
        struct pool_header h = {POOL_MAGIC, (long long)getpid(), (unsigned long long)(p - arena),
                                props->location.id};
        if (pwrite(fd, &h, sizeof h, 0) != (ssize_t)sizeof h) return OUT_OF_MEMORY;
    }
    *pool = p;
    return SUCCESS;
}

CUresult cuMemPoolDestroy(void *pool) {
    ENTER(cuMemPoolDestroy);
    pthread_mutex_lock(&lock);
    struct object *p = as(pool, K_POOL);
    CUresult status = live(p, "cuMemPoolDestroy");
    if (status == SUCCESS && !p->u.pool.created && !p->u.pool.imported) status = INVALID_VALUE;
    if (status == SUCCESS) {
        p->dead = 1;
        /* The mappings of its allocations outlive the descriptor. */
        if (p->u.pool.fd >= 0) close(p->u.pool.fd);
        p->u.pool.fd = -1;
    }
    pthread_mutex_unlock(&lock);
    return status;
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *ptr, size_t bytes, void *pool, void *stream) {
    ENTER(cuMemAllocFromPoolAsync);
    pthread_mutex_lock(&lock);
    struct object *p = as(pool, K_POOL);
    CUresult status = live(p, "cuMemAllocFromPoolAsync");
    /* The driver lets a stream allocate from another device's pool: so does the stand-in. */
    if (status == SUCCESS && p->u.pool.imported) status = INVALID_VALUE;
    pthread_mutex_unlock(&lock);
    if (status != SUCCESS) return status;
    return stream_alloc(ptr, bytes, stream, p, "cuMemAllocFromPoolAsync");
}

CUresult cuMemPoolTrimTo(void *pool, size_t keep) {
    ENTER(cuMemPoolTrimTo);
    pthread_mutex_lock(&lock);
    struct object *p = as(pool, K_POOL);
    CUresult status = live(p, "cuMemPoolTrimTo");
    if (status == SUCCESS && p->u.pool.reserved > keep)
        p->u.pool.reserved = keep > p->u.pool.used ? keep : p->u.pool.used;
    pthread_mutex_unlock(&lock);
    return status;
}

CUresult cuMemPoolExportToShareableHandle(void *handle, void *pool, int type,
                                          unsigned long long flags) {
    ENTER(cuMemPoolExportToShareableHandle);
    if (handle == NULL || type != HANDLE_TYPE_POSIX_FD || flags != 0) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct object *p = as(pool, K_POOL);
    CUresult status = live(p, "cuMemPoolExportToShareableHandle");
    if (status == SUCCESS && (!p->u.pool.created || !(p->u.pool.handle_types & type)))
        status = INVALID_VALUE;
    int fd = -1;
    if (status == SUCCESS && (fd = fcntl(p->u.pool.fd, F_DUPFD_CLOEXEC, 0)) < 0)
        status = OUT_OF_MEMORY;
    pthread_mutex_unlock(&lock);
    if (status == SUCCESS) *(int *)handle = fd;
    return status;
}

CUresult cuMemPoolImportFromShareableHandle(void **pool, void *handle, int type,
                                            unsigned long long flags) {
    ENTER(cuMemPoolImportFromShareableHandle);
    if (pool == NULL || type != HANDLE_TYPE_POSIX_FD || flags != 0) return INVALID_VALUE;
    int given = (int)(intptr_t)handle;
    struct pool_header h;
    if (pread(given, &h, sizeof h, 0) != (ssize_t)sizeof h || h.magic != POOL_MAGIC)
        return INVALID_VALUE;
    if (h.device < 0 || h.device >= STANDIN_DEVICES) return INVALID_DEVICE;
    int fd = fcntl(given, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    struct object *p = new_object(K_POOL);
    if (p != NULL) {
        p->u.pool.device = h.device;
        p->u.pool.imported = 1;
        p->u.pool.handle_types = HANDLE_TYPE_POSIX_FD;
        p->u.pool.fd = fd;
        p->u.pool.exporter = h.pid;
        p->u.pool.exporter_pool = (size_t)h.pool;
    }
    pthread_mutex_unlock(&lock);
    if (p == NULL) {
        close(fd);
        return OUT_OF_MEMORY;
    }
    *pool = p;
    return SUCCESS;
}

CUresult cuMemPoolExportPointer(void *data, CUdeviceptr ptr) {
    ENTER(cuMemPoolExportPointer);
    if (data == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct allocation *a = find_allocation((void *)(uintptr_t)ptr, 1);
    CUresult status = SUCCESS;
    if (a == NULL || a->base != (char *)(uintptr_t)ptr || a->pool == NULL || !a->mapped ||
        a->pool->u.pool.imported)
        status = INVALID_VALUE;
    struct pool_export e = {0, 0, 0, 0, 0};
    if (status == SUCCESS) {
        e = (struct pool_export){POOL_MAGIC, a->pool->u.pool.exporter,
                                 a->pool->u.pool.exporter_pool, a->offset, a->size};
    }
    pthread_mutex_unlock(&lock);
    if (status == SUCCESS) {
        memset(data, 0, 64);
        memcpy(data, &e, sizeof e);
    }
    return status;
}

CUresult cuMemPoolImportPointer(CUdeviceptr *ptr, void *pool, const void *data) {
    ENTER(cuMemPoolImportPointer);
    if (ptr == NULL || data == NULL) return INVALID_VALUE;
    struct pool_export e;
    memcpy(&e, data, sizeof e);
    pthread_mutex_lock(&lock);
    struct object *p = as(pool, K_POOL);
    CUresult status = live(p, "cuMemPoolImportPointer");
    if (status == SUCCESS && (!p->u.pool.imported || e.magic != POOL_MAGIC ||
                              e.pid != p->u.pool.exporter || e.pool != p->u.pool.exporter_pool))
        status = INVALID_VALUE;
    struct object *ctx = status == SUCCESS ? primary[p->u.pool.device] : NULL;
    if (status == SUCCESS && ctx == NULL) status = INVALID_CONTEXT;
    char *base = MAP_FAILED;
    if (status == SUCCESS) {
        base = mmap(NULL, page_round(e.size), PROT_READ | PROT_WRITE, MAP_SHARED, p->u.pool.fd,
                    (off_t)e.offset);
        if (base == MAP_FAILED) status = INVALID_VALUE;
    }
    if (status == SUCCESS && (status = add_allocation_at(base, e.size, ctx, 1)) != SUCCESS)
        munmap(base, page_round(e.size));
    if (status == SUCCESS) {
        allocations[allocation_count - 1].pool = p;
        allocations[allocation_count - 1].mapped = 1;
        allocations[allocation_count - 1].offset = e.offset;
    }
    pthread_mutex_unlock(&lock);
    if (status == SUCCESS) *ptr = (CUdeviceptr)(uintptr_t)base;
    return status;
}

#endif /* STANDIN_NO_MEMORY_POOL_API */

#ifndef STANDIN_NO_IPC
CUresult cuIpcGetMemHandle(struct ipc_handle *handle, CUdeviceptr ptr) {
    ENTER(cuIpcGetMemHandle);
    if (handle == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct allocation *a = find_allocation((void *)(uintptr_t)ptr, 1);
    CUresult status = SUCCESS;
    /* Only whole cuMemAlloc allocations: the driver refuses stream-ordered ones. */
    if (a == NULL || a->base != (char *)(uintptr_t)ptr || !a->user || a->pool != NULL ||
        a->graph != NULL || a->mapped)
        status = INVALID_VALUE;
    struct ipc_data d = {IPC_MAGIC, (long long)getpid(), ptr, a ? a->size : 0};
    pthread_mutex_unlock(&lock);
    if (status == SUCCESS) {
        memset(handle, 0, sizeof *handle);
        memcpy(handle->reserved, &d, sizeof d);
    }
    return status;
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *ptr, struct ipc_handle handle, unsigned flags) {
    ENTER(cuIpcOpenMemHandle_v2);
    if (ptr == NULL || flags != 1) return INVALID_VALUE;
    struct ipc_data d;
    memcpy(&d, handle.reserved, sizeof d);
    pthread_mutex_lock(&lock);
    CUresult status = usable(current());
    pthread_mutex_unlock(&lock);
    if (status != SUCCESS) return status;
    if (d.magic != IPC_MAGIC) return INVALID_VALUE;
    if (d.pid == (long long)getpid()) return INVALID_CONTEXT;
    return NOT_SUPPORTED;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr ptr) {
    ENTER(cuIpcCloseMemHandle);
    (void)ptr;
    return INVALID_VALUE; /* nothing is ever opened (see above) */
}
#endif

/* ------------------------------------------------------------------------------------------ */
/* Batched copies                                                                             */
/* ------------------------------------------------------------------------------------------ */

/* cuMemcpyBatchAsync with the CUDA 12.8/12.9 signature (failIdx before the stream). Refused as the
 * driver refuses them: the legacy default stream (0 or CU_STREAM_LEGACY) and malformed attributes
 * (CUDA_ERROR_INVALID_VALUE), a capturing stream (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, the
 * capture going on, as the real driver leaves it). Every copy is checked before any runs, failIdx
 * naming the first refused: a zero size, a side that begins in a live allocation or page-locked
 * range and ends past it (CUDA_ERROR_INVALID_VALUE). Other addresses are pageable host memory, which
 * the driver copies too. A device side of another context than the stream's counts
 * "context_mismatch", overlapping destinations or a copy onto its own source "copy_overlap"
 * (Atlas must never cause either). Then the copies are done at once, in order.
 * standin_fail_batch_at(i, code) makes the next batch of more than i copies fail at copy i. */

#ifndef STANDIN_NO_BATCH_COPY
struct memcpy_location {
    unsigned type;
    int id;
};

struct memcpy_attributes {
    unsigned src_access_order; /* 1 stream, 2 during the call, 3 any */
    struct memcpy_location src_hint, dst_hint;
    unsigned flags; /* CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE (1) or 0 */
};

static size_t batch_fail_index = SIZE_MAX;
static CUresult batch_fail_code;

void standin_fail_batch_at(size_t index, unsigned code) {
    pthread_mutex_lock(&lock);
    batch_fail_index = index;
    batch_fail_code = code;
    pthread_mutex_unlock(&lock);
}

/* Whether a copy may read or write [p, p + bytes): inside the live allocation or page-locked range
 * it begins in, or pageable host memory. Lock held. */
static int batch_side_ok(struct object *ctx, CUdeviceptr at, size_t bytes, const char *what) {
    const void *p = (const void *)(uintptr_t)at;
    struct allocation *a = find_allocation(p, 1);
    if (a != NULL) {
        if (find_allocation(p, bytes) != a) return 0;
        if (a->ctx != ctx) {
            note(E_context_mismatch);
            fprintf(stderr, "standin: cuMemcpyBatchAsync %s memory of another context\n", what);
        }
        return 1;
    }
    struct host_range *r = host_range_at(p);
    return r == NULL || bytes <= r->size - (size_t)((const char *)p - r->base);
}

static int ranges_overlap(CUdeviceptr a, size_t a_bytes, CUdeviceptr b, size_t b_bytes) {
    return a < b + b_bytes && b < a + a_bytes;
}

CUresult cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                            struct memcpy_attributes *attrs, size_t *attrs_idxs, size_t num_attrs,
                            size_t *fail_idx, void *stream) {
    ENTER(cuMemcpyBatchAsync);
    if (fail_idx == NULL) return INVALID_VALUE;
    *fail_idx = SIZE_MAX;
    if (count == 0 || dsts == NULL || srcs == NULL || sizes == NULL || attrs == NULL ||
        attrs_idxs == NULL || num_attrs == 0 || num_attrs > count || (uintptr_t)stream <= 1)
        return INVALID_VALUE;
    for (size_t k = 0; k < num_attrs; k++) {
        if ((k == 0 && attrs_idxs[0] != 0) || (k > 0 && attrs_idxs[k] <= attrs_idxs[k - 1]) ||
            attrs_idxs[k] >= count)
            return INVALID_VALUE;
        if (attrs[k].src_access_order < 1 || attrs[k].src_access_order > 3 ||
            (attrs[k].flags & ~1u) != 0) {
            *fail_idx = attrs_idxs[k];
            return INVALID_VALUE;
        }
    }
    pthread_mutex_lock(&lock);
    struct object *ctx = NULL;
    CUresult status = stream_context(stream, "cuMemcpyBatchAsync", &ctx);
    if (status == SUCCESS) status = usable(ctx);
    struct object *st = as(stream, K_STREAM);
    if (status == SUCCESS && st != NULL && st->u.stream.capture != 0)
        status = STREAM_CAPTURE_UNSUPPORTED;
    for (size_t i = 0; status == SUCCESS && i < count; i++) {
        if (i == batch_fail_index) {
            status = batch_fail_code;
            batch_fail_index = SIZE_MAX;
        } else if (sizes[i] == 0 || !batch_side_ok(ctx, dsts[i], sizes[i], "writes") ||
                   !batch_side_ok(ctx, srcs[i], sizes[i], "reads")) {
            status = INVALID_VALUE;
        }
        if (status != SUCCESS) *fail_idx = i;
    }
    if (status == SUCCESS) {
        for (size_t i = 0; i < count; i++) {
            int overlaps = ranges_overlap(dsts[i], sizes[i], srcs[i], sizes[i]);
            for (size_t j = i + 1; j < count && !overlaps; j++)
                overlaps = ranges_overlap(dsts[i], sizes[i], dsts[j], sizes[j]);
            if (overlaps) {
                note(E_copy_overlap);
                fprintf(stderr, "standin: cuMemcpyBatchAsync copy %zu overlaps a destination\n", i);
            }
        }
        for (size_t i = 0; i < count; i++)
            memmove((void *)(uintptr_t)dsts[i], (const void *)(uintptr_t)srcs[i], sizes[i]);
        last_copy_ctx = current();
    }
    pthread_mutex_unlock(&lock);
    return status;
}
#endif

/* ------------------------------------------------------------------------------------------ */
/* Virtual memory: reservations, physical allocations, mappings, sharing by file descriptor    */
/* ------------------------------------------------------------------------------------------ */

/* A reservation is a range of this process's address space, reserved with mmap(PROT_NONE). A
 * physical allocation is a memfd of its size, named "standin-vmm-dev<N>" after its device, so that
 * a process that imports its descriptor learns the device from /proc/self/fd. cuMemMap maps the
 * memfd over part of a reservation with no access, and cuMemSetAccess opens it (read-write, or
 * read-only: a write then crashes the process, as a fault would lose the context). Mapped memory
 * that its own device may access is that device's memory (of its primary context) for copies,
 * fills and kernels, through find_allocation; adjacent mappings are one range, as on the device.
 * Mapped memory without access is not: copies are refused and kernels fault. The memfd being
 * shared memory, a child process that imports the descriptor reaches the parent's memory, and a
 * physical allocation released while mapped lives on in its mapping, as the driver's does.
 * Granularity: minimum 64 KiB, recommended 2 MiB. The calls are those of CUDA 10.2.
 *   STANDIN_NO_VIRTUAL_MEMORY_API  none of the cuMem* calls of this section are exported.
 *   STANDIN_NO_VIRTUAL_MEMORY      the devices report VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 0
 *                                  (and no POSIX file descriptor handles); cuMemCreate refuses.
 *   STANDIN_NO_POSIX_FD            the devices report HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
 *                                  = 0; cuMemCreate refuses memory requested exportable.
 * Counts for tests: "live_reservations", "live_physical" (handles not released), "live_mappings". */

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#define VMM_MINIMUM ((size_t)64 << 10)
#define VMM_RECOMMENDED ((size_t)2 << 20)
#define VMM_MAX 16384
#define VMM_READ 1
#define VMM_READWRITE 3

/* CUmemAllocationProp and CUmemAccessDesc as cuda.h lays them out. */
struct vmm_location {
    int type; /* 1: a device */
    int id;
};
struct vmm_prop {
    int type;                  /* 1: pinned */
    int requested_handle_types; /* 1: POSIX file descriptor */
    struct vmm_location location;
    void *win32_metadata;
    unsigned char alloc_flags[8];
};
struct vmm_access_desc {
    struct vmm_location location;
    int flags;
};

static struct {
    char *base;
    size_t size;
    int live;
} vmm_reservations[VMM_MAX];
static size_t vmm_reservation_count;

/* Physical allocations; a handle is the index + 1, never reused. */
static struct {
    int fd;
    size_t size;
    int device;
    int handle_types;
    int imported;
    int live;
} vmm_handles[VMM_MAX];
static size_t vmm_handle_count;

static struct {
    char *base;
    size_t size;
    int device;
    unsigned char access[STANDIN_DEVICES];
    int live;
} vmm_mappings[VMM_MAX];
static size_t vmm_mapping_count;

/* The live mapping holding the byte at `p`, or -1. Lock held. */
static long vmm_mapping_at(uintptr_t p) {
    for (size_t i = 0; i < vmm_mapping_count; i++) {
        uintptr_t base = (uintptr_t)vmm_mappings[i].base;
        if (vmm_mappings[i].live && p >= base && p - base < vmm_mappings[i].size) return (long)i;
    }
    return -1;
}

/* The live mapping beginning exactly at `p`, or -1. Lock held. */
static long vmm_mapping_from(uintptr_t p) {
    long i = vmm_mapping_at(p);
    return i >= 0 && (uintptr_t)vmm_mappings[i].base == p ? i : -1;
}

/* [p, p + bytes) as an allocation of its device's primary context, when it lies in adjacent
 * mappings of one device that device may access; else NULL. The allocation describes the range
 * itself, in one of a few per-thread slots (a copy asks for two at once). Lock held. */
static struct allocation *vmm_allocation(const void *p, size_t bytes) {
    static __thread struct allocation slots[4];
    static __thread unsigned next;
    uintptr_t at = (uintptr_t)p, end = at + bytes;
    long i = vmm_mapping_at(at);
    if (i < 0 || bytes == 0 || end < at) return NULL;
    int device = vmm_mappings[i].device;
    for (;;) {
        if (vmm_mappings[i].device != device || vmm_mappings[i].access[device] == 0) return NULL;
        uintptr_t mapped_end = (uintptr_t)vmm_mappings[i].base + vmm_mappings[i].size;
        if (end <= mapped_end) break;
        if ((i = vmm_mapping_from(mapped_end)) < 0) return NULL;
    }
    struct allocation *a = &slots[next++ % 4];
    *a = (struct allocation){(char *)p, bytes, primary[device], 0, NULL, 0};
    return a;
}

static long long vmm_count(const char *what) {
    long long n = 0;
    pthread_mutex_lock(&lock);
    if (strcmp(what, "live_reservations") == 0) {
        for (size_t i = 0; i < vmm_reservation_count; i++) n += vmm_reservations[i].live;
    } else if (strcmp(what, "live_physical") == 0) {
        for (size_t i = 0; i < vmm_handle_count; i++) n += vmm_handles[i].live;
    } else if (strcmp(what, "live_mappings") == 0) {
        for (size_t i = 0; i < vmm_mapping_count; i++) n += vmm_mappings[i].live;
    } else {
        n = -1;
    }
    pthread_mutex_unlock(&lock);
    return n;
}

#ifndef STANDIN_NO_VIRTUAL_MEMORY_API

static int vmm_prop_ok(const struct vmm_prop *prop) {
    return prop != NULL && prop->type == 1 && prop->location.type == 1 &&
           prop->location.id >= 0 && prop->location.id < STANDIN_DEVICES &&
           (prop->requested_handle_types & ~1) == 0;
}

/* The live physical allocation `handle` names, or -1 (counted as a stale handle when it was one
 * and is released). Lock held. */
static long vmm_handle(unsigned long long handle, const char *call) {
    if (handle == 0 || handle > vmm_handle_count) return -1;
    if (!vmm_handles[handle - 1].live) {
        note(E_stale_handle);
        fprintf(stderr, "standin: %s was given a released memory handle\n", call);
        return -1;
    }
    return (long)(handle - 1);
}

/* A new physical allocation record for `fd`; the handle, or 0 when the table is full. Lock held. */
static unsigned long long vmm_add_handle(int fd, size_t size, int device, int types, int imported) {
    if (vmm_handle_count == VMM_MAX) return 0;
    vmm_handles[vmm_handle_count] = (typeof(vmm_handles[0])){fd, size, device, types, imported, 1};
    return ++vmm_handle_count;
}


CUresult cuMemGetAllocationGranularity(size_t *granularity, const struct vmm_prop *prop,
                                       int option) {
    ENTER(cuMemGetAllocationGranularity);
    if (granularity == NULL || !vmm_prop_ok(prop) || (option != 0 && option != 1))
        return INVALID_VALUE;
    *granularity = option == 0 ? VMM_MINIMUM : VMM_RECOMMENDED;
    return SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
    ENTER(cuMemAddressReserve);
    (void)addr; /* a hint */
    if (ptr == NULL || size == 0 || size % 4096 != 0 || flags != 0 ||
        (alignment & (alignment - 1)) != 0)
        return INVALID_VALUE;
    size_t align = alignment > VMM_MINIMUM ? alignment : VMM_MINIMUM;
    char *raw = mmap(NULL, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                     -1, 0);
    if (raw == MAP_FAILED) return OUT_OF_MEMORY;
    char *base = (char *)(((uintptr_t)raw + align - 1) & ~(uintptr_t)(align - 1));
    if (base > raw) munmap(raw, (size_t)(base - raw));
    if (raw + align > base) munmap(base + size, (size_t)(raw + align - base));
    pthread_mutex_lock(&lock);
    CUresult status = OUT_OF_MEMORY;
    if (vmm_reservation_count < VMM_MAX) {
        vmm_reservations[vmm_reservation_count++] = (typeof(vmm_reservations[0])){base, size, 1};
        status = SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    if (status != SUCCESS) munmap(base, size);
    else *ptr = (CUdeviceptr)(uintptr_t)base;
    return status;
}

/* Refused while anything is mapped in the range (the driver's rule is that it must not be). */
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    ENTER(cuMemAddressFree);
    char *base = (char *)(uintptr_t)ptr;
    pthread_mutex_lock(&lock);
    CUresult status = INVALID_VALUE;
    for (size_t i = 0; i < vmm_reservation_count; i++) {
        if (!vmm_reservations[i].live || vmm_reservations[i].base != base) continue;
        if (vmm_reservations[i].size != size) break;
        status = SUCCESS;
        for (size_t m = 0; m < vmm_mapping_count; m++) {
            char *at = vmm_mappings[m].base;
            if (vmm_mappings[m].live && at >= base && at < base + size) status = INVALID_VALUE;
        }
        if (status != SUCCESS) {
            fprintf(stderr, "standin: cuMemAddressFree of a reservation that is still mapped\n");
            break;
        }
        vmm_reservations[i].live = 0;
        munmap(base, size);
    }
    pthread_mutex_unlock(&lock);
    return status;
}

CUresult cuMemCreate(unsigned long long *handle, size_t size, const struct vmm_prop *prop,
                     unsigned long long flags) {
    ENTER(cuMemCreate);
    if (handle == NULL || !vmm_prop_ok(prop) || flags != 0 || size == 0 ||
        size % VMM_MINIMUM != 0)
        return INVALID_VALUE;
#ifdef STANDIN_NO_VIRTUAL_MEMORY
    return NOT_SUPPORTED;
#endif
#ifdef STANDIN_NO_POSIX_FD
    if (prop->requested_handle_types != 0) return NOT_SUPPORTED;
#endif
    char name[32];
    snprintf(name, sizeof name, "standin-vmm-dev%d", prop->location.id);
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0) return OUT_OF_MEMORY;
    if (ftruncate(fd, (off_t)size) != 0) {
        close(fd);
        return OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&lock);
    unsigned long long h =
        vmm_add_handle(fd, size, prop->location.id, prop->requested_handle_types, 0);
    pthread_mutex_unlock(&lock);
    if (h == 0) {
        close(fd);
        return OUT_OF_MEMORY;
    }
    *handle = h;
    return SUCCESS;
}

/* The memory lives on in its mappings (their mmap holds the memfd). */
CUresult cuMemRelease(unsigned long long handle) {
    ENTER(cuMemRelease);
    pthread_mutex_lock(&lock);
    long h = vmm_handle(handle, "cuMemRelease");
    if (h >= 0) {
        close(vmm_handles[h].fd);
        vmm_handles[h].live = 0;
    }
    pthread_mutex_unlock(&lock);
    return h >= 0 ? SUCCESS : INVALID_VALUE;
}

CUresult cuMemGetAllocationPropertiesFromHandle(struct vmm_prop *prop, unsigned long long handle) {
    ENTER(cuMemGetAllocationPropertiesFromHandle);
    if (prop == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    long h = vmm_handle(handle, "cuMemGetAllocationPropertiesFromHandle");
    if (h >= 0) {
        memset(prop, 0, sizeof *prop);
        prop->type = 1;
        prop->requested_handle_types = vmm_handles[h].handle_types;
        prop->location = (struct vmm_location){1, vmm_handles[h].device};
    }
    pthread_mutex_unlock(&lock);
    return h >= 0 ? SUCCESS : INVALID_VALUE;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, unsigned long long handle,
                  unsigned long long flags) {
    ENTER(cuMemMap);
    if (offset != 0 || flags != 0 || size == 0 || size % VMM_MINIMUM != 0 ||
        ptr % VMM_MINIMUM != 0)
        return INVALID_VALUE;
    char *base = (char *)(uintptr_t)ptr;
    pthread_mutex_lock(&lock);
    long h = vmm_handle(handle, "cuMemMap");
    CUresult status = h >= 0 && size <= vmm_handles[h].size ? SUCCESS : INVALID_VALUE;
    int reserved = 0;
    for (size_t i = 0; status == SUCCESS && i < vmm_reservation_count; i++) {
        char *r = vmm_reservations[i].base;
        reserved |= vmm_reservations[i].live && base >= r &&
                    size <= vmm_reservations[i].size - (size_t)(base - r) &&
                    (size_t)(base - r) <= vmm_reservations[i].size;
    }
    if (!reserved) status = INVALID_VALUE;
    for (size_t m = 0; status == SUCCESS && m < vmm_mapping_count; m++) {
        char *at = vmm_mappings[m].base;
        if (vmm_mappings[m].live && at < base + size && base < at + vmm_mappings[m].size) {
            fprintf(stderr, "standin: cuMemMap over a range that is mapped already\n");
            status = INVALID_VALUE;
        }
    }
    if (status == SUCCESS && vmm_mapping_count == VMM_MAX) status = OUT_OF_MEMORY;
    if (status == SUCCESS &&
        mmap(base, size, PROT_NONE, MAP_SHARED | MAP_FIXED, vmm_handles[h].fd, 0) == MAP_FAILED)
        status = OUT_OF_MEMORY;
    if (status == SUCCESS) {
        vmm_mappings[vmm_mapping_count] = (typeof(vmm_mappings[0])){0};
        vmm_mappings[vmm_mapping_count].base = base;
        vmm_mappings[vmm_mapping_count].size = size;
        vmm_mappings[vmm_mapping_count].device = vmm_handles[h].device;
        vmm_mappings[vmm_mapping_count].live = 1;
        vmm_mapping_count++;
    }
    pthread_mutex_unlock(&lock);
    return status;
}

/* Unmaps exactly one mapping; the range is reserved address space again. */
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    ENTER(cuMemUnmap);
    pthread_mutex_lock(&lock);
    long m = vmm_mapping_from((uintptr_t)ptr);
    CUresult status = m >= 0 && vmm_mappings[m].size == size ? SUCCESS : INVALID_VALUE;
    if (status == SUCCESS) {
        mmap(vmm_mappings[m].base, size, PROT_NONE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
        vmm_mappings[m].live = 0;
    }
    pthread_mutex_unlock(&lock);
    return status;
}

/* The range must be whole adjacent mappings. Each device's access is kept per mapping; the host
 * protection is the widest any device has. */
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const struct vmm_access_desc *desc,
                        size_t count) {
    ENTER(cuMemSetAccess);
    if (desc == NULL || count == 0 || size == 0) return INVALID_VALUE;
    for (size_t d = 0; d < count; d++) {
        int id = desc[d].location.id, flags = desc[d].flags;
        if (desc[d].location.type != 1 || id < 0 || id >= STANDIN_DEVICES ||
            (flags != 0 && flags != VMM_READ && flags != VMM_READWRITE))
            return INVALID_VALUE;
    }
    uintptr_t at = (uintptr_t)ptr, end = at + size;
    pthread_mutex_lock(&lock);
    CUresult status = SUCCESS;
    for (uintptr_t p = at; status == SUCCESS && p < end;) {
        long m = vmm_mapping_from(p);
        if (m < 0 || (uintptr_t)vmm_mappings[m].base + vmm_mappings[m].size > end) {
            status = INVALID_VALUE;
            break;
        }
        for (size_t d = 0; d < count; d++) {
#ifdef STANDIN_NO_PEER_ACCESS
            if (desc[d].location.id != vmm_mappings[m].device) status = NOT_SUPPORTED;
#endif
        }
        p += vmm_mappings[m].size;
    }
    for (uintptr_t p = at; status == SUCCESS && p < end;) {
        long m = vmm_mapping_from(p);
        int widest = 0;
        for (size_t d = 0; d < count; d++)
            vmm_mappings[m].access[desc[d].location.id] = (unsigned char)desc[d].flags;
        for (int d = 0; d < STANDIN_DEVICES; d++)
            widest = vmm_mappings[m].access[d] > widest ? vmm_mappings[m].access[d] : widest;
        int prot = widest == VMM_READWRITE ? PROT_READ | PROT_WRITE
                   : widest == VMM_READ    ? PROT_READ
                                           : PROT_NONE;
        mprotect(vmm_mappings[m].base, vmm_mappings[m].size, prot);
        p += vmm_mappings[m].size;
    }
    pthread_mutex_unlock(&lock);
    return status;
}

/* A new descriptor of the allocation's memfd, close-on-exec (a caller passing it to a child
 * clears that). */
CUresult cuMemExportToShareableHandle(void *shareable, unsigned long long handle, int type,
                                      unsigned long long flags) {
    ENTER(cuMemExportToShareableHandle);
    if (shareable == NULL || type != 1 || flags != 0) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    long h = vmm_handle(handle, "cuMemExportToShareableHandle");
    CUresult status = h >= 0 && (vmm_handles[h].handle_types & 1) ? SUCCESS : INVALID_VALUE;
    int fd = status == SUCCESS ? fcntl(vmm_handles[h].fd, F_DUPFD_CLOEXEC, 0) : -1;
    pthread_mutex_unlock(&lock);
    if (status != SUCCESS) return status;
    if (fd < 0) return OUT_OF_MEMORY;
    *(int *)shareable = fd;
    return SUCCESS;
}

/* The descriptor must be one of a stand-in allocation (of this or another process): its memfd's
 * name gives the device, its size the allocation's. The descriptor stays the caller's. */
CUresult cuMemImportFromShareableHandle(unsigned long long *handle, void *os_handle, int type) {
    ENTER(cuMemImportFromShareableHandle);
    if (handle == NULL || type != 1) return INVALID_VALUE;
    int fd = (int)(intptr_t)os_handle;
    char link[64], target[256];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    int device = -1;
    struct stat st;
    if (n <= 0 || fstat(fd, &st) != 0) return INVALID_VALUE;
    target[n] = '\0';
    if (sscanf(target, "/memfd:standin-vmm-dev%d", &device) != 1 || device < 0 ||
        device >= STANDIN_DEVICES)
        return INVALID_VALUE;
    int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (own < 0) return OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    unsigned long long h = vmm_add_handle(own, (size_t)st.st_size, device, 1, 1);
    pthread_mutex_unlock(&lock);
    if (h == 0) {
        close(own);
        return OUT_OF_MEMORY;
    }
    *handle = h;
    return SUCCESS;
}

#endif /* STANDIN_NO_VIRTUAL_MEMORY_API */

/* ------------------------------------------------------------------------------------------ */
/* SWITCH and IF/ELSE conditional nodes, large kernel parameters                              */
/* ------------------------------------------------------------------------------------------ */

/* Where the last parameter of `k` ends: a node keeps PARAM_BYTES of them. */
static size_t param_end(const struct kernel *k) {
    return k->param_count ? k->offsets[k->param_count - 1] + k->sizes[k->param_count - 1] : 0;
}

/* set_branch(handle, const unsigned *choice): a SWITCH node's branch is *choice. */
static CUresult run_set_branch(const struct launch *l) {
    unsigned long long handle;
    const unsigned *choice;
    param(l, 0, &handle, 8);
    param(l, 1, &choice, 8);
    if (!device_range_ok(l->ctx, choice, 4)) return ILLEGAL_ADDRESS;
    set_conditional(handle, *choice);
    return SUCCESS;
}

/* block_then_pointer(Block b, int *out): out[0] = b.v[0] + b.v[1099], b 1,100 ints by value. */
static CUresult run_block_then_pointer(const struct launch *l) {
    int v[1100], *out;
    param(l, 0, v, sizeof v);
    param(l, 1, &out, 8);
    if (!device_range_ok(l->ctx, out, 4)) return ILLEGAL_ADDRESS;
    out[0] = v[0] + v[1099];
    return SUCCESS;
}

/* largest(Largest p, int i): traps unless byte i % 32760 of p is 0. */
static CUresult run_largest(const struct launch *l) {
    static char bytes[32760]; /* the lock is held: one launch at a time */
    int i;
    param(l, 0, bytes, sizeof bytes);
    param(l, 1, &i, 4);
    return bytes[(unsigned)i % sizeof bytes] != 0 ? LAUNCH_FAILED : SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* Tensor maps (TMA descriptors) and green contexts                                           */
/* ------------------------------------------------------------------------------------------ */

/* A tensor map as the stand-in encodes it: the global address first, then the rank and the
 * dimensions (the real descriptor is opaque). */
static CUresult encode_tensor_map(void *map, unsigned rank, void *address,
                                  const unsigned long long *dims, unsigned min_rank) {
    if (map == NULL || (uintptr_t)map % 64 != 0 || rank < min_rank || rank > 5 || dims == NULL)
        return INVALID_VALUE;
    unsigned long long *words = map;
    memset(words, 0, 128);
    words[0] = (unsigned long long)(uintptr_t)address;
    words[1] = rank;
    for (unsigned i = 0; i < rank; i++) words[2 + i] = dims[i];
    return SUCCESS;
}

CUresult cuTensorMapEncodeTiled(void *map, unsigned type, unsigned rank, void *address,
                                const unsigned long long *dims, const unsigned long long *strides,
                                const unsigned *box, const unsigned *element_strides,
                                unsigned interleave, unsigned swizzle, unsigned l2, unsigned oob) {
    ENTER(cuTensorMapEncodeTiled);
    (void)type, (void)interleave, (void)swizzle, (void)l2, (void)oob;
    if (box == NULL || element_strides == NULL || (rank > 1 && strides == NULL)) return INVALID_VALUE;
    return encode_tensor_map(map, rank, address, dims, 1);
}

CUresult cuTensorMapEncodeIm2col(void *map, unsigned type, unsigned rank, void *address,
                                 const unsigned long long *dims,
                                 const unsigned long long *strides, const int *lower,
                                 const int *upper, unsigned channels, unsigned pixels,
                                 const unsigned *element_strides, unsigned interleave,
                                 unsigned swizzle, unsigned l2, unsigned oob) {
    ENTER(cuTensorMapEncodeIm2col);
    (void)type, (void)channels, (void)pixels, (void)interleave, (void)swizzle, (void)l2, (void)oob;
    if (strides == NULL || lower == NULL || upper == NULL || element_strides == NULL)
        return INVALID_VALUE;
    return encode_tensor_map(map, rank, address, dims, 3);
}

CUresult cuTensorMapReplaceAddress(void *map, void *address) {
    ENTER(cuTensorMapReplaceAddress);
    if (map == NULL || (uintptr_t)map % 64 != 0) return INVALID_VALUE;
    ((unsigned long long *)map)[0] = (unsigned long long)(uintptr_t)address;
    return SUCCESS;
}

/* tma_tiles(map, out, ...): out[0] = the first element of the tensor its map describes, read
 * through the address in the 128 bytes the launch passed by value. */
static CUresult run_tma_tiles(const struct launch *l) {
    unsigned long long map[16];
    float *out;
    param(l, 0, map, sizeof map);
    param(l, 1, &out, 8);
    const float *first = (const float *)(uintptr_t)map[0];
    if (!device_range_ok(l->ctx, first, 4) || !device_range_ok(l->ctx, out, 4))
        return ILLEGAL_ADDRESS;
    out[0] = *first;
    return SUCCESS;
}

#ifndef STANDIN_NO_GREEN_CONTEXTS
/* CUdevResource as cuda.h lays it out. The stand-in keeps its own tag, the device and whether
 * the resource is a group of a split in the driver's internal padding. */
struct dev_resource {
    unsigned type; /* 1: SM */
    unsigned tag;
    int device;
    int of_split;
    unsigned char padding[92 - 12];
    unsigned sm_count;
    unsigned char oversize[44];
};
_Static_assert(sizeof(struct dev_resource) == 144, "CUdevResource is 144 bytes");
#define RESOURCE_TAG 0x5EC0DE5u
#define GREEN_CONTEXTS 64

struct green {
    int device;
    unsigned sms;
    int live;
    struct object *ctx; /* what cuCtxFromGreenCtx hands out */
};
static struct green greens[GREEN_CONTEXTS];
static int green_count;

static struct green *as_green(void *handle) {
    struct green *g = handle;
    if (g < greens || g >= greens + green_count || !g->live) return NULL;
    return g;
}

static void fill_resource(struct dev_resource *r, int device, unsigned sms, int of_split) {
    memset(r, 0, sizeof *r);
    r->type = 1;
    r->tag = RESOURCE_TAG;
    r->device = device;
    r->of_split = of_split;
    r->sm_count = sms;
}

CUresult cuDeviceGetDevResource(int device, struct dev_resource *resource, unsigned type) {
    ENTER(cuDeviceGetDevResource);
    if (resource == NULL || type != 1) return INVALID_VALUE;
    if (device < 0 || device >= STANDIN_DEVICES) return INVALID_DEVICE;
    fill_resource(resource, device, STANDIN_SMS, 0);
    return SUCCESS;
}

/* Groups of minCount rounded up to a multiple of 8 (compute capability 9.0's granularity), as
 * many as asked and fit; a group of a split is refused, as the driver refuses it. */
CUresult cuDevSmResourceSplitByCount(struct dev_resource *result, unsigned *groups,
                                     const struct dev_resource *input,
                                     struct dev_resource *remaining, unsigned flags,
                                     unsigned min_count) {
    ENTER(cuDevSmResourceSplitByCount);
    if (groups == NULL || input == NULL || input->tag != RESOURCE_TAG || input->type != 1 ||
        flags != 0 || min_count > input->sm_count)
        return INVALID_VALUE;
    if (input->of_split) return 915; /* CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION */
    unsigned size = min_count < 8 ? 8 : (min_count + 7) / 8 * 8;
    unsigned fit = input->sm_count / size;
    if (result == NULL) {
        *groups = fit;
        return SUCCESS;
    }
    unsigned made = *groups < fit ? *groups : fit;
    for (unsigned i = 0; i < made; i++) fill_resource(&result[i], input->device, size, 1);
    if (remaining != NULL)
        fill_resource(remaining, input->device, input->sm_count - made * size, 1);
    *groups = made;
    return SUCCESS;
}

struct resource_desc {
    int device;
    unsigned sms;
};

CUresult cuDevResourceGenerateDesc(struct resource_desc **desc, struct dev_resource *resources,
                                   unsigned count) {
    ENTER(cuDevResourceGenerateDesc);
    if (desc == NULL || resources == NULL || count == 0) return INVALID_VALUE;
    unsigned sms = 0;
    for (unsigned i = 0; i < count; i++) {
        if (resources[i].tag != RESOURCE_TAG || resources[i].device != resources[0].device)
            return INVALID_VALUE;
        sms += resources[i].sm_count;
    }
    /* Never freed: the driver has no call to destroy a descriptor either. */
    struct resource_desc *d = malloc(sizeof *d);
    if (d == NULL) return OUT_OF_MEMORY;
    *d = (struct resource_desc){resources[0].device, sms};
    *desc = d;
    return SUCCESS;
}

CUresult cuGreenCtxCreate(struct green **out, struct resource_desc *desc, int device,
                          unsigned flags) {
    ENTER(cuGreenCtxCreate);
    if (out == NULL || desc == NULL || flags != 1 || desc->device != device) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    CUresult status = green_count == GREEN_CONTEXTS ? OUT_OF_MEMORY : SUCCESS;
    struct object *ctx = status == SUCCESS ? new_object(K_CONTEXT) : NULL;
    if (status == SUCCESS && ctx == NULL) status = OUT_OF_MEMORY;
    if (status == SUCCESS) {
        ctx->u.ctx.device = device;
        struct green *g = &greens[green_count++];
        *g = (struct green){device, desc->sms, 1, ctx};
        *out = g;
    }
    pthread_mutex_unlock(&lock);
    return status;
}

CUresult cuGreenCtxDestroy(void *handle) {
    ENTER(cuGreenCtxDestroy);
    pthread_mutex_lock(&lock);
    struct green *g = as_green(handle);
    if (g != NULL) {
        g->live = 0;
        g->ctx->dead = 1;
    } else {
        note(E_stale_handle);
    }
    pthread_mutex_unlock(&lock);
    return g != NULL ? SUCCESS : INVALID_HANDLE;
}

CUresult cuCtxFromGreenCtx(void **context, void *handle) {
    ENTER(cuCtxFromGreenCtx);
    if (context == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct green *g = as_green(handle);
    if (g != NULL) *context = g->ctx;
    pthread_mutex_unlock(&lock);
    return g != NULL ? SUCCESS : INVALID_HANDLE;
}

CUresult cuGreenCtxGetDevResource(void *handle, struct dev_resource *resource, unsigned type) {
    ENTER(cuGreenCtxGetDevResource);
    if (resource == NULL || type != 1) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct green *g = as_green(handle);
    if (g != NULL) fill_resource(resource, g->device, g->sms, 0);
    pthread_mutex_unlock(&lock);
    return g != NULL ? SUCCESS : INVALID_HANDLE;
}

/* A stream of the green context is a stream of its device's primary context, as the driver's
 * cuStreamGetCtx_v2 answers for one: functions of that context launch there. */
CUresult cuGreenCtxStreamCreate(void **stream, void *handle, unsigned flags, int priority) {
    ENTER(cuGreenCtxStreamCreate);
    if (stream == NULL || flags != 1) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct green *g = as_green(handle);
    CUresult status = g != NULL ? SUCCESS : INVALID_HANDLE;
    struct object *ctx = g != NULL ? primary[g->device] : NULL;
    if (status == SUCCESS) status = usable(ctx);
    struct object *s = status == SUCCESS ? new_object(K_STREAM) : NULL;
    if (status == SUCCESS && s == NULL) status = OUT_OF_MEMORY;
    if (status == SUCCESS) {
        s->u.stream.ctx = ctx;
        s->u.stream.priority = priority;
        *stream = s;
    }
    pthread_mutex_unlock(&lock);
    return status;
}
#endif
