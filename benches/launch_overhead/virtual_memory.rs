//! A growable buffer against a plain one and the raw driver, as ratios pair by pair (see
//! [`paired`]).
//!
//! `growable_paired/launch/{raw,buffer,growable}`: one side of a pair is a batch of [`LAUNCHES`]
//! raw `cuLaunchKernel`s of `scale` over 1024 floats, then a synchronize; the other side is the
//! same batch through Atlas's typed launch with a `DeviceBuffer` (`buffer`) or a `GrowableBuffer`
//! (`growable`) as the argument (`raw`: the raw batch against itself, the method's control). The
//! target: `growable` at the ratio of `buffer`, since a growable buffer passes its inner buffer.
//!
//! `growable_paired/grow_shrink/{raw,atlas}`: a batch maps [`CHUNKS`] chunks of the recommended
//! granularity at the end of a reservation and unmaps them again: raw, `cuMemCreate` and
//! `cuMemMap` per chunk and one `cuMemSetAccess`, then per chunk `cuCtxSynchronize`, `cuMemUnmap`
//! and `cuMemRelease` (what Atlas does to unmap safely); Atlas, `GrowableBuffer::grow_to` and
//! `shrink_to` of the same sizes.

use atlas_registry::sys::{CUdeviceptr, CUmemGenericAllocationHandle};
use atlas_registry::{CudaStream, DeviceBuffer, FunctionCache, GrowableBuffer, LaunchConfig};
use atlas_sys::{
    CUmemAccess_flags, CUmemAccessDesc, CUmemAllocationHandleType, CUmemAllocationProp,
    CUmemAllocationProp_st__bindgen_ty_1, CUmemAllocationType, CUmemLocation, CUmemLocationType,
};
use criterion::BenchmarkId;

use crate::paired::{self, timed};
use crate::{Env, PairedCriterion, check, ok, sym};

/// Launches per batch.
const LAUNCHES: usize = 256;
/// Floats the launches scale.
const N: usize = 1 << 10;
/// Chunks mapped and unmapped per batch.
const CHUNKS: usize = 16;

static SCALE: FunctionCache = FunctionCache::new("elementwise", "scale");

/// Both benches of the group.
pub(crate) fn virtual_memory(c: &mut PairedCriterion, env: &Env) {
    let registry = &env.registry;
    let ctx = registry.ctx();
    let stream = ok(CudaStream::new(ctx), "creating a stream");
    let sync = || ok(stream.synchronize(), "synchronize");
    let mut growable = match GrowableBuffer::<f32>::new(ctx, (CHUNKS + 1) << 20) {
        Ok(buffer) => buffer,
        Err(e) => {
            println!("growable_paired: not run: {e}");
            return;
        }
    };
    ok(growable.grow_to(N), "grow_to");
    let mut buffer = ok(DeviceBuffer::<f32>::zeroed(ctx, &stream, N), "zeroed");
    let scale = ok(SCALE.get(registry), "FunctionCache::get scale");
    let cfg = LaunchConfig::for_elements(N as u32, 256);
    let raw_launch = sym!(env.cuda, cuLaunchKernel);
    let function = env.raw_function("elementwise", c"scale");
    let args = (buffer.device_ptr(), 1.0f32, N as u32);
    let raw_stream = stream.raw();
    let raw = || {
        let mut params = [
            (&args.0 as *const CUdeviceptr).cast_mut().cast(),
            (&args.1 as *const f32).cast_mut().cast(),
            (&args.2 as *const u32).cast_mut().cast(),
        ];
        for _ in 0..LAUNCHES {
            let (g, b) = (cfg.grid, cfg.block);
            // SAFETY: `function` is the registry's `scale`, `params` its three arguments (the
            // buffer outlives the batch, which synchronizes), the stream live.
            let status = unsafe {
                raw_launch(
                    function,
                    g.0,
                    g.1,
                    g.2,
                    b.0,
                    b.1,
                    b.2,
                    0,
                    raw_stream,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            };
            check(status, "cuLaunchKernel");
        }
        sync();
    };

    let mut group = c.benchmark_group("growable_paired");
    group.sampling_mode(paired::SAMPLING);
    let mut launch_buffer = || {
        for _ in 0..LAUNCHES {
            // SAFETY: `scale` touches the N floats of the buffer; the batch synchronizes.
            ok(
                unsafe { scale.launch(&stream, &cfg, (&mut buffer, 1.0f32, N as u32)) },
                "launch",
            );
        }
        sync();
    };
    pair(&mut group, "launch", "raw", &raw, &mut || raw());
    pair(&mut group, "launch", "buffer", &raw, &mut launch_buffer);
    let mut launch_growable = || {
        for _ in 0..LAUNCHES {
            // SAFETY: as above.
            ok(
                unsafe { scale.launch(&stream, &cfg, (&mut growable, 1.0f32, N as u32)) },
                "launch",
            );
        }
        sync();
    };
    pair(&mut group, "launch", "growable", &raw, &mut launch_growable);

    let raw_grow_shrink = raw_mapper(env, growable.chunk_bytes());
    let chunk = growable.chunk_bytes() / 4;
    let mut atlas_grow_shrink = || {
        let len = growable.len();
        ok(growable.grow_to(len + CHUNKS * chunk), "grow_to");
        ok(growable.shrink_to(len), "shrink_to");
    };
    pair(
        &mut group,
        "grow_shrink",
        "raw",
        &raw_grow_shrink,
        &mut || raw_grow_shrink(),
    );
    pair(
        &mut group,
        "grow_shrink",
        "atlas",
        &raw_grow_shrink,
        &mut atlas_grow_shrink,
    );
    group.finish();
}

/// The raw batch of `grow_shrink`: [`CHUNKS`] chunks of `chunk` bytes mapped into a reservation of
/// its own (made once, freed when the closure goes) and unmapped again.
fn raw_mapper(env: &Env, chunk: usize) -> impl Fn() + use<> {
    let reserve = sym!(env.cuda, cuMemAddressReserve);
    let create = sym!(env.cuda, cuMemCreate);
    let map = sym!(env.cuda, cuMemMap);
    let set_access = sym!(env.cuda, cuMemSetAccess);
    let synchronize = sym!(env.cuda, cuCtxSynchronize);
    let unmap = sym!(env.cuda, cuMemUnmap);
    let release = sym!(env.cuda, cuMemRelease);
    let device = env.registry.ctx().device();
    let bytes = CHUNKS * chunk;
    let mut base: CUdeviceptr = 0;
    // SAFETY: `base` is a live out-pointer; the primary context is current (Env::new). The
    // reservation is never freed: the bench process ends after the benches.
    check(
        unsafe { reserve(&mut base, bytes, chunk, 0, 0) },
        "cuMemAddressReserve",
    );
    let properties = CUmemAllocationProp {
        type_: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
        location: CUmemLocation {
            type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    };
    let access = CUmemAccessDesc {
        location: properties.location,
        flags: CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    move || {
        let mut handles: [CUmemGenericAllocationHandle; CHUNKS] = [0; CHUNKS];
        for (i, handle) in handles.iter_mut().enumerate() {
            let at = base + (i * chunk) as CUdeviceptr;
            // SAFETY: `handle` is a live out-pointer and `properties` initialised; the chunk lies
            // in the reservation, unmapped, at a granular offset.
            unsafe {
                check(create(handle, chunk, &properties, 0), "cuMemCreate");
                check(map(at, chunk, 0, *handle, 0), "cuMemMap");
            }
        }
        // SAFETY: the range is the chunks mapped just above; `access` is one live descriptor.
        check(
            unsafe { set_access(base, bytes, &access, 1) },
            "cuMemSetAccess",
        );
        for (i, handle) in handles.into_iter().enumerate() {
            let at = base + (i * chunk) as CUdeviceptr;
            // SAFETY: the mapping made above, unmapped once, used by no work; its handle
            // released once.
            unsafe {
                check(synchronize(), "cuCtxSynchronize");
                check(unmap(at, chunk), "cuMemUnmap");
                check(release(handle), "cuMemRelease");
            }
        }
    }
}

/// One paired bench `case/variant`: `raw` against `other`, pair by pair.
fn pair(
    group: &mut criterion::BenchmarkGroup<'_, paired::PairedRatio>,
    case: &str,
    variant: &str,
    raw: &dyn Fn(),
    other: &mut dyn FnMut(),
) {
    let mut other_first = false;
    group.bench_function(BenchmarkId::new(case, variant), |b| {
        b.iter_custom(|iters| {
            paired::pairs(iters, &mut other_first, |other_side| {
                if other_side {
                    timed(&mut *other)
                } else {
                    timed(raw)
                }
            })
        })
    });
}
