//! Launch-overhead benches: what the Atlas layer adds to the raw CUDA driver calls it wraps.
//!
//! Every group measures a raw-driver baseline (`…/raw`: entry points from `atlas_sys::entry!`,
//! called directly) next to the Atlas paths, in the same binary and the same run, on the same
//! primary context and the same stream (the registry's), so that the only difference is the Atlas
//! layer.
//!
//! | bench                   | benchmark IDs                                                                      |
//! |-------------------------|------------------------------------------------------------------------------------|
//! | enqueue                 | `enqueue/{noop,scale,block_sum_96k}/{raw,atlas_raw,atlas_typed}` (time per launch) |
//! | enqueue, paired         | `enqueue_paired/{noop,scale,block_sum_96k}/{raw,atlas_raw,atlas_typed}` (× raw)    |
//! | round trip              | `roundtrip/noop/{raw,atlas_raw,atlas_typed}`                                       |
//! | lookup                  | `lookup/scale/{raw,function_cached,raw_function_cached,function_cache_get}`        |
//! | replaced path           | `replaced/noop/{raw_load_per_call,atlas_cached,raw_fresh_context}`                 |
//! | model load              | `model_load/{demo_ptx,demo_cubin,demo_cubin_first,demo_fatbin_zstd,large_fatbin}/{raw,atlas}` (time per load) |
//! | model load, paired      | `model_load_paired/{demo_ptx,demo_cubin,demo_cubin_first,demo_fatbin_zstd,large_fatbin}/atlas` (× raw) |
//! | graph replay            | `graph_replay/noop256/{eager,replay}` (per kernel, synchronize included)           |
//! | graph capture           | `graph_capture/{noop256,scale256}/{raw,atlas_typed}` (per captured launch: begin, 256 launches, end, drop) |
//! | graph capture, paired   | `graph_capture_paired/{noop256,scale256}/{raw,atlas_typed}` (× raw capture)        |
//! | graph replay, paired    | `graph_replay_paired/noop256/{raw,atlas}` (16 replays enqueued, × raw `cuGraphLaunch`) |
//! | graph update            | `graph_update/{chain64,chain1024,while64,layers64}/{update,reinstantiate,update_ready,reinstantiate_ready,raw_update,raw_reinstantiate}`, `graph_update/{chain64,chain1024}/{set_one_node,reinstantiate_one_node}` (per change) |
//! | conditional loop        | `while_loop/steps64/{graph,host}` (per 64-step loop, synchronize included)         |
//! | load everywhere         | `load_all_devices/{N}_gpus/{registry_per_device,one_library}`                      |
//! | load everywhere, paired | `load_all_devices_paired/{N}_gpus/one_library` (× `registry_per_device`)           |
//! | allocation, paired      | `alloc_paired/{4k,1m}/{raw,atlas_alloc,stream_ordered_raw,stream_ordered}` (× raw `cuMemAlloc`+`cuMemFree`) |
//! | synchronize, paired     | `synchronize_paired/idle/{raw,atlas}` (× raw `cuStreamSynchronize`)                |
//! | pool allocation, paired | `pool_alloc_paired/{4k,1m}/{raw,atlas}` (× raw `cuMemAllocFromPoolAsync`+`cuMemFreeAsync`; `pools.rs`) |
//! | PDL chain               | `pdl_chain/{eager,eager_pdl,graph,graph_pdl}` (per kernel of 64 dependent steps)   |
//! | launch with attributes  | `launch_ex_paired/pdl/{raw,raw_built,atlas,atlas_raw}` (× raw `cuLaunchKernelEx`)  |
//! | events, paired          | `event_paired/record_wait/{raw,atlas}` (× raw `cuEventRecord` + `cuStreamWaitEvent`) |
//! | pinned copies, paired   | `pinned_paired/{upload,download}/{raw,atlas}` (256 MiB, × raw `cuMemcpy*Async_v2` from the same pinned memory) |
//! | pageable vs pinned      | `pinned_bandwidth/{upload,download}/{pageable,pinned}` (256 MiB, bytes per second) |
//! | device-to-device copy   | `copy_dtod/1g/{raw,atlas}` (bandwidth), `copy_dtod_paired/{1g,4k}/{raw,atlas}` (× raw `cuMemcpyDtoDAsync_v2`) |
//! | batched copies          | `batch_copies_paired/{upload,download}/{raw,atlas,single}` (4,096 blocks of 16 KiB, × raw `cuMemcpyBatchAsync`), `batch_copies/…` (bandwidth) |
//! | growable buffer, paired | `growable_paired/launch/{raw,buffer,growable}` (× raw `cuLaunchKernel`), `growable_paired/grow_shrink/{raw,atlas}` (16 chunks mapped and unmapped, × raw) |
//! | 8 KiB struct, paired    | `large_params_paired/mix_8k/{raw,atlas}` (× raw `cuLaunchKernel`; `large_params.rs`) |
//! | TMA launch, paired      | `tma_paired/tile/{raw,atlas_raw,atlas}` (a launch with a tensor map, × raw `cuLaunchKernel`; `tma.rs`) |
//!
//! Each bench lives in the file named after its benchmark group (`enqueue.rs`, `roundtrip.rs`,
//! `lookup.rs`, `replaced.rs`, `model_load.rs`, `graph_replay.rs`, `load_all_devices.rs`;
//! `graph_capture.rs` holds `graph_capture`, `graph_capture_paired` and `graph_replay_paired`;
//! `stream_memory.rs` holds `alloc_paired` and `synchronize_paired`, `pdl.rs` `pdl_chain` and
//! `launch_ex_paired`, `graph_update.rs` `graph_update` and `while_loop`, `events.rs` `event_paired`,
//! `pinned.rs` `pinned_paired` and `pinned_bandwidth`, `virtual_memory.rs` `growable_paired`, `flight_recorder.rs` `recorder_paired`);
//! `launches.rs` holds the launches that enqueue and round trip share, `paired.rs` the ratio
//! measurement.
//!
//! The `*_paired` groups carry the ratios: each of their iterations runs the raw baseline and the
//! Atlas path back to back, in alternating order, and criterion reports Atlas time / raw time
//! (see [`paired`]). Separate benches tens of seconds apart drift by more than the Atlas layer
//! costs; inside a pair the drift cancels.
//!
//! `raw` launches use the registry's stream and a `CUfunction` from `cuModuleGetFunction` on the
//! registry's own module; `atlas_raw` is [`AtlasRegistry::launch_on_stream`] with a
//! `raw_function_cached` handle; `atlas_typed` is `FunctionCache::get` + `FunctionRef::launch`, as
//! a call site in user code writes it.
//!
//! Run on a GPU machine with `taskset -c 2 cargo bench --bench launch_overhead` (about 4½
//! minutes; pinning keeps the scheduler from moving the bench between cores). Without `--bench`
//! (as `cargo test --benches` runs it) criterion runs each bench once, as a smoke test. When the
//! driver cannot be used (none, no device, a missing function) the binary prints one line saying
//! what is wrong and exits 0.

mod batch_copies;
mod copies;
mod enqueue;
mod events;
mod flight_recorder;
mod graph_capture;
mod graph_replay;
mod graph_update;
mod large_params;
mod launches;
mod load_all_devices;
mod lookup;
mod model_load;
mod paired;
mod pdl;
mod pinned;
mod pools;
mod replaced;
mod roundtrip;
mod stream_memory;
mod tma;
mod virtual_memory;

use std::ffi::CStr;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use atlas_registry::{AtlasError, AtlasRegistry, FunctionCache, LaunchConfig, cuda_error_text};
use atlas_sys::{CUfunction, CUresult, CudaDriver};
use criterion::Criterion;

use crate::paired::PairedRatio;

/// The typed path's call sites: one static cache each, as user code declares them.
static NOOP: FunctionCache = FunctionCache::new("noop", "noop");

/// `sym!(cuda, cuName)`: the entry point as a plain function pointer, or a panic naming it (setup
/// only, never in a timed loop).
macro_rules! sym {
    ($cuda:expr, $name:ident) => {
        atlas_sys::entry!($cuda, $name).unwrap_or_else(|e| panic!("launch_overhead setup: {e}"))
    };
}
pub(crate) use sym;

/// Panics naming `call` unless `status` is success. Inlined into the timed loops: the raw
/// baseline checks every status, as the Atlas paths do.
#[inline(always)]
fn check(status: CUresult, call: &str) {
    if status != CUresult::CUDA_SUCCESS {
        driver_failed(status, call);
    }
}

#[cold]
#[inline(never)]
fn driver_failed(status: CUresult, call: &str) -> ! {
    panic!(
        "launch_overhead: {call} failed: {}",
        cuda_error_text(status.0)
    )
}

/// The value of an Atlas call, or a panic naming what was being done.
#[inline(always)]
fn ok<T>(result: Result<T, AtlasError>, what: &str) -> T {
    match result {
        Ok(value) => value,
        Err(e) => atlas_failed(what, &e),
    }
}

#[cold]
#[inline(never)]
fn atlas_failed(what: &str, e: &AtlasError) -> ! {
    panic!("launch_overhead: {what}: {e}")
}

/// What every bench shares: the demo model loaded once (the device's own cubins when
/// atlas-kernels has them, else the PTX), and the driver table.
struct Env {
    registry: AtlasRegistry,
    cuda: &'static CudaDriver,
}

impl Env {
    fn new() -> Self {
        let host = ok(atlas_registry::host(0), "creating device 0's host");
        let blobs = atlas_kernels::blobs_for_device("demo", host.compute_capability())
            .expect("demo is a model of atlas-kernels");
        let registry = ok(
            AtlasRegistry::load(0, blobs),
            "loading the demo model on device 0",
        );
        let cuda = atlas_sys::driver().unwrap_or_else(|e| panic!("launch_overhead setup: {e}"));
        // The raw calls below use the primary context that Atlas holds: make it current here.
        ok(registry.ctx().bind(), "binding the primary context");
        Self { registry, cuda }
    }

    /// `cuModuleGetFunction(module, name)`, checked: the raw baseline's own lookup, in the
    /// registry's module (the same module, not a second load).
    fn raw_function(&self, module: &str, name: &CStr) -> CUfunction {
        let get_function = sym!(self.cuda, cuModuleGetFunction);
        let module = ok(self.registry.raw_module(module), "raw_module");
        let mut func: CUfunction = null_mut();
        // SAFETY: `module` is loaded while the registry lives, `name` is NUL-terminated, `func` is a
        // live out-pointer, and the module's context is current (Env::new bound it).
        check(
            unsafe { get_function(&mut func, module, name.as_ptr()) },
            "cuModuleGetFunction",
        );
        func
    }

    /// Synchronizes the registry's stream with the raw entry point (used outside timed regions).
    fn syncer(&self) -> impl Fn() + use<> {
        let sync = sym!(self.cuda, cuStreamSynchronize);
        let stream = self.registry.raw_stream();
        move || {
            // SAFETY: the registry's stream lives for the process (its host is process-wide).
            check(unsafe { sync(stream) }, "cuStreamSynchronize");
        }
    }
}

/// Launches per batch in the enqueue benches and the warm-up.
const BATCH: u64 = 256;

/// Keeps the GPU busy with launches for two seconds, so that its clocks have ramped up before the
/// first measurement (raw baselines run first in each group, and would otherwise pay for it).
fn warm_up_device(env: &Env) {
    let registry = &env.registry;
    let noop = ok(NOOP.get(registry), "FunctionCache::get noop");
    let one = LaunchConfig::for_elements(1, 1);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        for _ in 0..BATCH {
            // SAFETY: noop takes no arguments and touches no memory.
            ok(
                unsafe { noop.launch(registry.stream(), &one, ()) },
                "warm-up launch",
            );
        }
        ok(
            registry.stream_synchronize(registry.stream()),
            "warm-up synchronize",
        );
    }
}

fn main() {
    // Creating the host loads the driver, runs cuInit and retains device 0's primary context.
    // When any of that fails (no driver, no device, a driver without a function Atlas needs), say
    // what failed in one line, as the error reports it, and stop, successfully.
    if let Err(e) = atlas_registry::host(0) {
        let reason = e.to_string().replace('\n', " ");
        println!("launch_overhead: not run: {reason}");
        return;
    }
    let env = Env::new();
    warm_up_device(&env);
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(4))
        .configure_from_args();
    let mut paired = paired::criterion().configure_from_args();

    let inputs = launches::Inputs::new(&env);
    let mut cases = launches::cases(&env, &inputs);
    enqueue::enqueue(&mut c, &env, &mut cases);
    enqueue::enqueue_paired(&mut paired, &env, &mut cases);
    roundtrip::roundtrip(&mut c, &env, &mut cases);
    lookup::lookup(&mut c, &env);
    replaced::replaced(&mut c, &env);
    model_load::model_load(&mut c, &mut paired, &env);
    graph_replay::graph_replay(&mut c, &env);
    graph_capture::graph_capture(&mut c, &mut paired, &env);
    graph_update::graph_update(&mut c, &env);
    load_all_devices::load_all_devices(&mut c, &mut paired);
    stream_memory::stream_memory(&mut paired, &env);
    pdl::pdl(&mut c, &mut paired, &env);
    events::events(&mut paired, &env);
    pinned::pinned(&mut c, &mut paired, &env);
    copies::copies(&mut c, &mut paired, &env);
    pools::pools(&mut paired, &env);
    batch_copies::batch_copies(&mut c, &mut paired, &env);
    virtual_memory::virtual_memory(&mut paired, &env);
    large_params::large_params(&mut paired, &env);
    tma::tma(&mut paired, &env);
    flight_recorder::flight_recorder(&mut paired, &env);

    c.final_summary();
    paired.final_summary();
}

/// Device 0's architecture as atlas-kernels names its cubins: `10 * major + minor`.
fn device_sm(env: &Env) -> u32 {
    let (major, minor) = env.registry.host().compute_capability();
    major.saturating_mul(10).saturating_add(minor)
}

/// A [`Criterion`] whose benches report ratios (see [`paired`]).
type PairedCriterion = Criterion<PairedRatio>;

/// The demo model's PTX, checked to end in a NUL as the driver takes it (`atlas-kernels` embeds
/// it so), so that the raw loads can hand it over as it is.
fn demo_ptx() -> atlas_kernels::Blobs {
    let blobs = atlas_kernels::ptx_for_model("demo").expect("the demo model has PTX blobs");
    for (name, blob) in blobs {
        assert_eq!(
            blob.last(),
            Some(&0),
            "launch_overhead: {name}'s PTX is not NUL-terminated"
        );
    }
    blobs
}
