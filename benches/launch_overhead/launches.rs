//! The launches the enqueue and round-trip benches time: three kernels, each launched the three
//! ways the benches compare ([`Launches`]).

use std::ffi::c_void;
use std::ptr::null_mut;

use atlas_registry::{AtlasRegistry, DeviceBuffer, FunctionCache, LaunchConfig, RawCudaFunc};
use atlas_sys::{CUdeviceptr, CUfunction, CUfunction_attribute, CUstream, CudaDriver};

use crate::{Env, NOOP, check, ok, sym};

/// Elements of the `scale` launches: small, so the kernel itself costs next to nothing.
const SCALE_N: u32 = 1 << 10;
/// Threads per block of the `scale` launches.
const SCALE_BLOCK: u32 = 256;
/// Floats per block of `block_sum`: 24576 × 4 B = 96 KiB of dynamic shared memory.
const SUM_CHUNK: u32 = 24_576;
/// Blocks of the `block_sum` launches.
const SUM_BLOCKS: u32 = 4;
/// Threads per block of `block_sum` (its static `partial` array has 1024 entries).
const SUM_BLOCK: u32 = 1024;
/// Dynamic shared memory of one `block_sum` block, in bytes.
const SUM_SHARED: u32 = SUM_CHUNK * 4;

static SCALE: FunctionCache = FunctionCache::new("elementwise", "scale");
static BLOCK_SUM: FunctionCache = FunctionCache::new("block_reduce", "block_sum");

/// The device memory the launches use, and their arguments as the raw parameter arrays point at
/// them. Borrowed by every [`Launches`], so it stays put while they live.
pub(crate) struct Inputs {
    /// `scale`'s data, all ones: factor 1.0 keeps it unchanged however many launches run.
    x: DeviceBuffer<f32>,
    /// `block_sum`'s input, all ones.
    input: DeviceBuffer<f32>,
    /// `block_sum`'s output, one float per block.
    output: DeviceBuffer<f32>,
    /// `scale(float* x, float factor, unsigned n)`.
    scale_args: (CUdeviceptr, f32, u32),
    /// `block_sum(const float* in, float* out, unsigned n, unsigned chunk)`.
    sum_args: (CUdeviceptr, CUdeviceptr, u32, u32),
}

impl Inputs {
    pub(crate) fn new(env: &Env) -> Self {
        let registry = &env.registry;
        let ones = vec![1.0f32; (SUM_CHUNK * SUM_BLOCKS) as usize];
        let upload = |data: &[f32]| {
            ok(
                DeviceBuffer::from_slice(registry.ctx(), registry.stream(), data),
                "uploading a bench input",
            )
        };
        let x = upload(&ones[..SCALE_N as usize]);
        let input = upload(&ones);
        let output = ok(
            DeviceBuffer::<f32>::alloc(registry.ctx(), SUM_BLOCKS as usize),
            "allocating block_sum's output",
        );
        Self {
            scale_args: (x.device_ptr(), 1.0, SCALE_N),
            sum_args: (
                input.device_ptr(),
                output.device_ptr(),
                SUM_CHUNK * SUM_BLOCKS,
                SUM_CHUNK,
            ),
            x,
            input,
            output,
        }
    }

    /// `scale`'s raw parameter array: pointers into `self`.
    fn scale_params(&self) -> [*mut c_void; 3] {
        let a = &self.scale_args;
        [param(&a.0), param(&a.1), param(&a.2)]
    }

    /// `block_sum`'s raw parameter array: pointers into `self`.
    fn sum_params(&self) -> [*mut c_void; 4] {
        let a = &self.sum_args;
        [param(&a.0), param(&a.1), param(&a.2), param(&a.3)]
    }
}

/// A raw kernel parameter: the address of the value (the driver only reads through it).
fn param<T>(value: &T) -> *mut c_void {
    (value as *const T).cast_mut().cast()
}

/// One kernel's launch, enqueued the three ways the benches compare.
pub(crate) struct Launches<'a> {
    /// The bench ID's kernel part.
    pub(crate) kernel: &'static str,
    /// `cuLaunchKernel` through `atlas-sys`, with a parameter array built once.
    raw: Box<dyn FnMut() + 'a>,
    /// `AtlasRegistry::launch_on_stream` with a `raw_function_cached` handle and the same array.
    atlas_raw: Box<dyn FnMut() + 'a>,
    /// `FunctionCache::get` + `FunctionRef::launch` with a tuple of arguments.
    atlas_typed: Box<dyn FnMut() + 'a>,
}

impl<'a> Launches<'a> {
    /// Each way, with the bench ID's variant part: `raw`, `atlas_raw`, `atlas_typed`.
    pub(crate) fn variants(&mut self) -> [(&'static str, &mut (dyn FnMut() + 'a)); 3] {
        [
            ("raw", &mut *self.raw),
            ("atlas_raw", &mut *self.atlas_raw),
            ("atlas_typed", &mut *self.atlas_typed),
        ]
    }
}

/// The raw baseline's launch: one checked `cuLaunchKernel` of `func` with `cfg` and `params`.
///
/// # Safety
///
/// `func` is a live function of the current context, `stream` a live stream of it, and `params`
/// matches the kernel's parameters, their targets outliving the returned closure.
unsafe fn raw_launcher<const N: usize>(
    cuda: &'static CudaDriver,
    func: CUfunction,
    cfg: LaunchConfig,
    stream: CUstream,
    mut params: [*mut c_void; N],
) -> impl FnMut() {
    let launch = sym!(cuda, cuLaunchKernel);
    move || {
        let (g, b) = (cfg.grid, cfg.block);
        let params = if N == 0 {
            null_mut()
        } else {
            params.as_mut_ptr()
        };
        // SAFETY: raw_launcher's caller vouched for func, stream and params.
        let status = unsafe {
            launch(
                func,
                g.0,
                g.1,
                g.2,
                b.0,
                b.1,
                b.2,
                cfg.shared_mem_bytes,
                stream,
                params,
                null_mut(),
            )
        };
        check(status, "cuLaunchKernel");
    }
}

/// The raw Atlas path's launch: `launch_on_stream` of `func` on the registry's stream.
///
/// # Safety
///
/// `func` is a function of `registry`, and `params` matches its parameters, their targets
/// outliving the returned closure.
unsafe fn atlas_launcher<const N: usize>(
    registry: &AtlasRegistry,
    func: RawCudaFunc,
    cfg: LaunchConfig,
    mut params: [*mut c_void; N],
) -> impl FnMut() {
    let stream = registry.raw_stream();
    move || {
        // SAFETY: atlas_launcher's caller vouched for func and params; the stream is the
        // registry's own.
        let result = unsafe { registry.launch_on_stream(func, &cfg, stream, &mut params) };
        ok(result, "launch_on_stream");
    }
}

/// The launches of `noop` (no parameters, one thread), `scale` (three parameters, 4 blocks of 256
/// threads) and, where the device allows 96 KiB of dynamic shared memory per block,
/// `block_sum_96k` (four parameters, 4 blocks of 1024 threads, 96 KiB each). The raw baseline
/// opts `block_sum` in to 96 KiB here, once; Atlas does it on its first launch.
pub(crate) fn cases<'a>(env: &'a Env, inputs: &'a Inputs) -> Vec<Launches<'a>> {
    let registry = &env.registry;
    let stream = registry.raw_stream();
    let handle = |module, name| {
        ok(
            registry.raw_function_cached(module, name),
            "raw_function_cached",
        )
    };
    let one = LaunchConfig::for_elements(1, 1);
    let scale_cfg = LaunchConfig::for_elements(SCALE_N, SCALE_BLOCK);
    let (noop_raw, scale_raw) = (
        env.raw_function("noop", c"noop"),
        env.raw_function("elementwise", c"scale"),
    );
    let (noop_h, scale_h) = (handle("noop", "noop"), handle("elementwise", "scale"));
    // The typed launches stay out of the `unsafe` block below: each argues its own contract.
    let noop_typed = move || {
        let noop = ok(NOOP.get(registry), "FunctionCache::get noop");
        // SAFETY: noop takes no arguments and touches no memory.
        ok(
            unsafe { noop.launch(registry.stream(), &one, ()) },
            "launch noop",
        );
    };
    let scale_typed = move || {
        let scale = ok(SCALE.get(registry), "FunctionCache::get scale");
        let args = (&inputs.x, 1.0f32, SCALE_N);
        // SAFETY: `inputs.x` holds `SCALE_N` floats, all that `scale` touches; `inputs` outlives
        // every launch (main drops it last, after the later benches synchronize the stream).
        ok(
            unsafe { scale.launch(registry.stream(), &scale_cfg, args) },
            "launch scale",
        );
    };
    // SAFETY: live functions of the current context and of the
    // registry, on its live stream, with parameter arrays matching each kernel whose targets live
    // in `inputs`, which the closures borrow.
    let mut cases = unsafe {
        vec![
            Launches {
                kernel: "noop",
                raw: Box::new(raw_launcher(env.cuda, noop_raw, one, stream, [])),
                atlas_raw: Box::new(atlas_launcher(registry, noop_h, one, [])),
                atlas_typed: Box::new(noop_typed),
            },
            Launches {
                kernel: "scale",
                raw: Box::new(raw_launcher(
                    env.cuda,
                    scale_raw,
                    scale_cfg,
                    stream,
                    inputs.scale_params(),
                )),
                atlas_raw: Box::new(atlas_launcher(
                    registry,
                    scale_h,
                    scale_cfg,
                    inputs.scale_params(),
                )),
                atlas_typed: Box::new(scale_typed),
            },
        ]
    };

    let limit = registry.host().limits().max_shared_mem_optin;
    if limit < SUM_SHARED {
        eprintln!(
            "launch_overhead: skipping block_sum_96k: the device allows {limit} B of dynamic shared memory per block, the bench needs {SUM_SHARED} B"
        );
        return cases;
    }
    let sum_raw = env.raw_function("block_reduce", c"block_sum");
    let set_attribute = sym!(env.cuda, cuFuncSetAttribute);
    let attribute = CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
    // SAFETY: a live function of the current context; the size is within the device's opt-in
    // maximum (checked above).
    check(
        unsafe { set_attribute(sum_raw, attribute, SUM_SHARED as i32) },
        "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)",
    );
    let sum_cfg = LaunchConfig {
        grid: (SUM_BLOCKS, 1, 1),
        block: (SUM_BLOCK, 1, 1),
        shared_mem_bytes: SUM_SHARED,
    };
    let sum_h = handle("block_reduce", "block_sum");
    // SAFETY: as above; block_sum was opted in to SUM_SHARED bytes just now.
    let (raw, atlas_raw) = unsafe {
        (
            raw_launcher(env.cuda, sum_raw, sum_cfg, stream, inputs.sum_params()),
            atlas_launcher(registry, sum_h, sum_cfg, inputs.sum_params()),
        )
    };
    cases.push(Launches {
        kernel: "block_sum_96k",
        raw: Box::new(raw),
        atlas_raw: Box::new(atlas_raw),
        atlas_typed: Box::new(move || {
            let sum = ok(BLOCK_SUM.get(registry), "FunctionCache::get block_sum");
            let (_, _, n, chunk) = inputs.sum_args;
            let args = (&inputs.input, &inputs.output, n, chunk);
            ok(
                // SAFETY: block_sum reads the `n` floats of `inputs.input`, writes one float per
                // block to `inputs.output` (`SUM_BLOCKS` floats, the grid) and stages `chunk`
                // floats in the `SUM_SHARED` bytes of `sum_cfg`; `inputs` outlives every launch.
                unsafe { sum.launch(registry.stream(), &sum_cfg, args) },
                "launch block_sum",
            );
        }),
    });
    cases
}
