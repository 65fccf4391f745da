// What work right after cuLaunchKernel costs on a GPU host: the launch of an empty one-block
// kernel, alone and followed by what the flight recorder does (an atomic increment, a
// compare-and-swap of a ring slot's stamp, 16 stores), by reads of fixed cache lines and by a
// chain of arithmetic, each batch of 256 launches timed against a batch of plain launches, pair
// by pair, the order alternating. BENCHMARKS.md, Runs 17 and 18.
//
//   gcc -O2 -o /tmp/after_launch benches/after_launch.c -l:libcuda.so.1
//   taskset -c 2 /tmp/after_launch
//
// Prints, for each way, the median time of one launch and the median ratio to the plain batch.
// Needs only the driver (libcuda); the few entry points it calls are declared here.
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
CUresult cuInit(unsigned flags);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDevicePrimaryCtxRetain(CUcontext *context, CUdevice device);
CUresult cuCtxSetCurrent(CUcontext context);
CUresult cuModuleLoadData(CUmodule *module, const void *image);
CUresult cuModuleGetFunction(CUfunction *function, CUmodule module, const char *name);
CUresult cuStreamCreate(CUstream *stream, unsigned flags);
CUresult cuStreamSynchronize(CUstream stream);
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shared, CUstream stream,
                        void **params, void **extra);

#define CHECK(call)                                                                    \
    do {                                                                               \
        CUresult status = (call);                                                      \
        if (status) {                                                                  \
            fprintf(stderr, "%s failed: %d\n", #call, status);                        \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

static const char *ptx = ".version 8.0\n.target sm_70\n.address_size 64\n"
                         ".visible .entry noop(.param .u64 p, .param .f32 f, .param .u32 n)"
                         " { ret; }\n";

/// One ring slot as the flight recorder lays it out: a stamp and 15 words, 128 bytes.
struct slot {
    _Atomic uint64_t stamp;
    _Atomic uint64_t words[15];
} __attribute__((aligned(128)));

static struct slot ring[64];
static _Atomic uint64_t next_number = 1;
static uint64_t plain_number = 1;
static CUfunction function;
static CUstream stream;
static void *params[3];

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static inline void launch(void) {
    CHECK(cuLaunchKernel(function, 1, 1, 1, 256, 1, 1, 0, stream, params, 0));
}

/// Takes the next number and its slot, as the recorder does: an atomic increment, then a
/// compare-and-swap of the slot's stamp to "being written".
static inline uint64_t take_slot(void) {
    uint64_t number = atomic_fetch_add_explicit(&next_number, 1, memory_order_relaxed);
    struct slot *s = &ring[number & 63];
    uint64_t seen = atomic_load_explicit(&s->stamp, memory_order_relaxed);
    atomic_compare_exchange_weak_explicit(&s->stamp, &seen, (number << 1) | 1,
                                          memory_order_acquire, memory_order_relaxed);
    return number;
}

/// Writes the slot's words and marks it complete.
static inline void fill_slot(uint64_t number) {
    struct slot *s = &ring[number & 63];
    for (int i = 0; i < 15; i++)
        atomic_store_explicit(&s->words[i], number + (uint64_t)i, memory_order_relaxed);
    atomic_store_explicit(&s->stamp, number << 1, memory_order_release);
}

static void plain(void) { launch(); }
static void then_increment(void) {
    launch();
    atomic_fetch_add_explicit(&next_number, 1, memory_order_relaxed);
}
static void then_record(void) {
    launch();
    fill_slot(take_slot());
}
static void slot_taken_before(void) {
    uint64_t number = take_slot();
    launch();
    fill_slot(number);
}
static void then_plain_stores(void) {
    launch();
    uint64_t number = plain_number++;
    atomic_store_explicit(&ring[number & 63].stamp, (number << 1) | 1, memory_order_relaxed);
    fill_slot(number);
}


/// 64 cache lines of their own: a launch path that reads N fixed lines after the driver's call
/// pays for the ones the call pushed out of the first-level cache.
static volatile uint64_t lines[64][8] __attribute__((aligned(64)));
static uint64_t sink;
static inline void read_lines(int n) {
    uint64_t sum = 0;
    for (int i = 0; i < n; i++)
        sum += lines[i][0];
    sink += sum;
}
/// A chain of n dependent multiply-adds (about 4 cycles each), instructions without memory.
static inline void work(int n) {
    uint64_t x = sink;
    for (int i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        __asm__ volatile("" : "+r"(x));
    }
    sink = x;
}
static void then_8_lines(void) { launch(); read_lines(8); }
static void then_16_lines(void) { launch(); read_lines(16); }
static void then_32_lines(void) { launch(); read_lines(32); }
static void lines_16_before(void) { read_lines(16); launch(); }
static void then_work_50(void) { launch(); work(50); }
static void then_work_100(void) { launch(); work(100); }

static void (*const ways[])(void) = {plain, then_increment, then_record, slot_taken_before,
                                     then_plain_stores, then_8_lines,
                                     then_16_lines, then_32_lines, lines_16_before,
                                     then_work_50, then_work_100};
static const char *const names[] = {
    "plain (against itself)",
    "then an atomic increment",
    "then a record (increment, compare-and-swap, 16 stores)",
    "slot taken before, filled after",
    "then a record of plain stores",
    "then 8 fixed cache lines read",
    "then 16 fixed cache lines read",
    "then 32 fixed cache lines read",
    "16 fixed cache lines read before",
    "then 50 dependent multiply-adds",
    "then 100 dependent multiply-adds",
};

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(void) {
    enum { WAYS = sizeof ways / sizeof ways[0], PAIRS = 400, BATCH = 256 };
    static double ratio[WAYS][PAIRS], per_launch[WAYS][PAIRS];
    static uint64_t pointer = 0;
    static float factor = 1;
    static unsigned count = 256;
    CUdevice device;
    CUcontext context;
    CUmodule module;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&device, 0));
    CHECK(cuDevicePrimaryCtxRetain(&context, device));
    CHECK(cuCtxSetCurrent(context));
    CHECK(cuModuleLoadData(&module, ptx));
    CHECK(cuModuleGetFunction(&function, module, "noop"));
    CHECK(cuStreamCreate(&stream, 1 /* CU_STREAM_NON_BLOCKING */));
    params[0] = &pointer;
    params[1] = &factor;
    params[2] = &count;
    // Two seconds of launches first, so that the clocks have ramped up.
    for (uint64_t start = now_ns(), i = 0; now_ns() - start < 2000000000u; i++) {
        launch();
        if (i % BATCH == 0)
            CHECK(cuStreamSynchronize(stream));
    }
    for (int pair = 0; pair < PAIRS; pair++) {
        for (int way = 0; way < WAYS; way++) {
            double plain_ns = 0, way_ns = 0;
            for (int k = 0; k < 2; k++) {
                int this_way = (pair + k) & 1; // the order alternates from pair to pair
                CHECK(cuStreamSynchronize(stream));
                uint64_t start = now_ns();
                for (int i = 0; i < BATCH; i++)
                    ways[this_way ? way : 0]();
                double took = (double)(now_ns() - start);
                if (this_way)
                    way_ns = took;
                else
                    plain_ns = took;
            }
            ratio[way][pair] = way_ns / plain_ns;
            per_launch[way][pair] = way_ns / BATCH;
        }
    }
    for (int way = 0; way < WAYS; way++) {
        qsort(ratio[way], PAIRS, sizeof(double), by_value);
        qsort(per_launch[way], PAIRS, sizeof(double), by_value);
        printf("%-56s %7.1f ns a launch, %.4f x plain\n", names[way], per_launch[way][PAIRS / 2],
               ratio[way][PAIRS / 2]);
    }
    return 0;
}
