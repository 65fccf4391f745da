//! Launch attributes (`Kernel::launch_with`, `AtlasRegistry::launch_on_stream_with`): what the
//! device, the kernel or the grid cannot take is refused before `cuLaunchKernelEx`, naming why;
//! what passes reaches the driver as asked; a plain launch never calls `cuLaunchKernelEx`.
//!
//! CPU (the stand-in libcuda, in child processes): `cargo test -p atlas-registry --test
//! launch_attributes`. GPU (an sm_90 device, which loads the `launch` model's sm_90 cubins):
//! `cargo test -p atlas-registry --test launch_attributes -- --include-ignored`.

mod support;

use std::ffi::c_void;

use atlas_kernels::ptx_for_model;
use atlas_registry::sys::{self, CUfunction_attribute, CUresult};
use atlas_registry::{
    AtlasError, AtlasRegistry, AttributeRefusal, CudaFunction, CudaStream, DeviceBuffer,
    LaunchAttributes, LaunchConfig, LaunchRefusal, MemSyncDomain, RawCudaFunc,
};
use support::blobs::{NEEDS_GPU, device_cubins};
use support::child;
use support::rng::Rng;
use support::standin;

child::bodies!(
    plain_launches_never_call_launch_ex,
    every_attribute_reaches_the_driver_as_asked,
    refusals_never_reach_the_driver,
    an_older_device_refuses_what_it_lacks,
    a_driver_without_launch_ex_is_named,
    argument_updates_of_captured_nodes_check_their_attributes_again,
    a_cooperative_launch_opts_in_before_it_counts_blocks,
);

// ---------------------------------------------------------------------------------------------
// CPU: the stand-in libcuda
// ---------------------------------------------------------------------------------------------

#[test]
fn a_plain_launch_is_one_cu_launch_kernel_and_attributes_one_cu_launch_kernel_ex() {
    standin::run(plain_launches_never_call_launch_ex, &[]);
}

#[test]
fn attributes_reach_the_driver_as_asked() {
    standin::run(every_attribute_reaches_the_driver_as_asked, &[]);
}

#[test]
fn every_refusal_is_typed_and_made_before_the_driver() {
    standin::run(refusals_never_reach_the_driver, &[]);
}

#[test]
fn a_device_without_clusters_pdl_or_cooperative_launch_refuses_them_by_name() {
    standin::run(
        an_older_device_refuses_what_it_lacks,
        &["-DSTANDIN_CC_MAJOR=8", "-DSTANDIN_NO_COOPERATIVE"],
    );
}

#[test]
fn a_driver_without_cu_launch_kernel_ex_is_a_missing_symbol() {
    standin::run(
        a_driver_without_launch_ex_is_named,
        &["-DSTANDIN_NO_LAUNCH_EX"],
    );
}

#[test]
fn set_kernel_args_checks_the_clusters_and_cooperative_grid_of_a_captured_node() {
    standin::run(
        argument_updates_of_captured_nodes_check_their_attributes_again,
        &[],
    );
}

#[test]
fn a_cooperative_launch_with_more_than_48_kib_of_shared_memory_fits_from_both_doors() {
    standin::run(a_cooperative_launch_opts_in_before_it_counts_blocks, &[]);
}

/// The `launch` model's PTX on the stand-in (which knows its kernels by name).
fn launch_model() -> AtlasRegistry {
    AtlasRegistry::load(0, ptx_for_model("launch").expect("the launch model")).expect("load")
}

/// The `launch` model's sm_90 cubins on the stand-in: `pdl_step` waits for its predecessor
/// there (its compute_75 PTX cannot hold the wait).
fn launch_model_sm90() -> AtlasRegistry {
    let cubins = atlas_kernels::cubin_for_model("launch", 90).expect("the launch model's sm_90");
    AtlasRegistry::load(0, cubins).expect("load")
}

/// `cluster_shape` and `cluster_shape_pair` (compiled with `__cluster_dims__(2, 1, 1)`).
fn cluster_kernels(registry: &AtlasRegistry) -> (CudaFunction, CudaFunction) {
    let kernel = |name| registry.function_cached("cluster", name).unwrap();
    (kernel("cluster_shape"), kernel("cluster_shape_pair"))
}

/// A 1-D grid of `blocks` blocks of 64 threads, no dynamic shared memory.
fn blocks_of_64(blocks: u32) -> LaunchConfig {
    LaunchConfig {
        grid: (blocks, 1, 1),
        block: (64, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The attribute refusal inside `e`; panics on any other error.
fn refusal(e: AtlasError) -> AttributeRefusal {
    match e {
        AtlasError::InvalidLaunch {
            reason: LaunchRefusal::Attribute(reason),
            ..
        } => reason,
        other => panic!("expected an attribute refusal, got {other}"),
    }
}

/// Runs `steps` (a, b) of `pdl_step` over `x` on `stream`, each with `attrs`.
fn chain(
    step: &CudaFunction,
    stream: &CudaStream,
    x: &mut DeviceBuffer<f32>,
    n: u32,
    steps: &[(f32, f32)],
    attrs: Option<&LaunchAttributes>,
) {
    let cfg = LaunchConfig::for_elements(n, 256);
    for &(a, b) in steps {
        // SAFETY: `pdl_step` touches the first `n` floats of `x`, which holds at least `n` and
        // outlives the launches (the callers synchronize before dropping it).
        let launched = unsafe {
            match attrs {
                Some(attrs) => step.launch_with(stream, &cfg, attrs, (&mut *x, n, a, b)),
                None => step.launch(stream, &cfg, (&mut *x, n, a, b)),
            }
        };
        launched.expect("pdl_step");
    }
}

/// The chain on the CPU: `x = x * a + b` fused, step after step, as `pdl_step`'s `fmaf`.
fn chain_reference(x: &[f32], steps: &[(f32, f32)]) -> Vec<f32> {
    x.iter()
        .map(|&v| steps.iter().fold(v, |v, &(a, b)| v.mul_add(a, b)))
        .collect()
}

fn plain_launches_never_call_launch_ex() {
    let probe = standin::probe();
    let registry = launch_model_sm90();
    let limits = registry.host().limits();
    assert_eq!(limits.multiprocessors, 132);
    assert!(limits.cluster_launch && limits.cooperative_launch);
    assert_eq!(registry.ctx().stream_priorities().unwrap(), (0, -5));
    let step = registry.function_cached("pdl", "pdl_step").unwrap();
    let stream = registry.stream();
    let mut rng = Rng::new();
    let n = 1000 + rng.index(1000) as u32;
    let input = rng.f32s(n as usize, -100.0, 100.0);
    // a = 0.5 makes x * a exact, so the stand-in's unfused step gives the fused bits too.
    let steps: Vec<(f32, f32)> = (0..64).map(|_| (0.5, rng.f32_in(-4.0, 4.0))).collect();
    let mut x = DeviceBuffer::from_slice(registry.ctx(), stream, &input).unwrap();
    probe.reset();
    chain(&step, stream, &mut x, n, &steps, None);
    assert_eq!(probe.launches(), 64);
    assert_eq!(
        probe.count("cuLaunchKernelEx"),
        0,
        "a plain launch used cuLaunchKernelEx"
    );
    let plain = x.to_vec(stream).unwrap();

    x.copy_from(stream, &input).unwrap();
    probe.reset();
    let pdl = LaunchAttributes::new().programmatic_stream_serialization(true);
    chain(&step, stream, &mut x, n, &steps, Some(&pdl));
    assert_eq!(probe.count("cuLaunchKernelEx"), 64);
    assert_eq!(
        probe.launches(),
        0,
        "a launch with attributes used cuLaunchKernel"
    );
    assert_eq!(probe.launch_attribute_count(), 1);
    assert_eq!(probe.launch_attribute(6), Some([1, 0, 0]));
    let with_pdl = x.to_vec(stream).unwrap();
    let want = chain_reference(&input, &steps);
    for (i, ((p, q), w)) in plain.iter().zip(&with_pdl).zip(&want).enumerate() {
        assert_eq!(
            (p.to_bits(), q.to_bits()),
            (w.to_bits(), w.to_bits()),
            "element {i}"
        );
    }

    // No attributes at all: still cuLaunchKernelEx, with none.
    probe.reset();
    let cfg = LaunchConfig::for_elements(n, 256);
    // SAFETY: as in `chain`.
    unsafe {
        step.launch_with(
            stream,
            &cfg,
            &LaunchAttributes::new(),
            (&mut x, n, 1.0f32, 0.0f32),
        )
    }
    .unwrap();
    assert_eq!((probe.count("cuLaunchKernelEx"), probe.launches()), (1, 0));
    assert_eq!(probe.launch_attribute_count(), 0);
}

fn every_attribute_reaches_the_driver_as_asked() {
    let probe = standin::probe();
    let registry = launch_model();
    let stream = registry.stream();
    let shape = registry
        .function_cached("cluster", "cluster_shape")
        .unwrap();
    let blocks = 16u32;
    let mut out =
        DeviceBuffer::from_slice(registry.ctx(), stream, &vec![u32::MAX; 2 * blocks as usize])
            .unwrap();
    let cfg = LaunchConfig {
        grid: (blocks, 1, 1),
        block: (64, 1, 1),
        shared_mem_bytes: 0,
    };
    // `cluster_shape` never waits for its predecessor: the opt-out lets it overlap.
    let attrs = LaunchAttributes::new()
        .programmatic_stream_serialization(true)
        .programmatic_without_wait(true)
        .cluster((4, 1, 1))
        .cooperative(true)
        .priority(-2)
        .mem_sync_domain(MemSyncDomain::Remote);
    probe.reset();
    // SAFETY: `cluster_shape` writes two words per block of `out`, which holds them and outlives
    // the launch (`to_vec` synchronizes).
    unsafe { shape.launch_with(stream, &cfg, &attrs, (&mut out,)) }.unwrap();
    assert_eq!(probe.count("cuLaunchKernelEx"), 1);
    assert_eq!(probe.launch_attribute_count(), 5);
    assert_eq!(
        probe.launch_attribute(6),
        Some([1, 0, 0]),
        "programmatic serialization"
    );
    assert_eq!(probe.launch_attribute(4), Some([4, 1, 1]), "cluster");
    assert_eq!(probe.launch_attribute(2), Some([1, 0, 0]), "cooperative");
    assert_eq!(probe.launch_attribute(8), Some([-2, 0, 0]), "priority");
    assert_eq!(probe.launch_attribute(10), Some([1, 0, 0]), "remote domain");
    let got = out.to_vec(stream).unwrap();
    for b in 0..blocks as usize {
        assert_eq!(
            (got[2 * b], got[2 * b + 1]),
            (b as u32 % 4, b as u32 / 4),
            "block {b}"
        );
    }

    // The raw door: the same attributes, a raw parameter array.
    let mut ptr = out.device_ptr();
    let mut params = [(&raw mut ptr).cast::<c_void>()];
    let attrs = LaunchAttributes::new().cluster((2, 1, 1)).priority(-5);
    // SAFETY: the function is this registry's; one parameter, the address of `out`, which holds
    // two words per block and outlives the launch.
    unsafe { registry.launch_on_stream_with(shape.raw(), &cfg, &attrs, stream.raw(), &mut params) }
        .unwrap();
    assert_eq!(probe.count("cuLaunchKernelEx"), 2);
    assert_eq!(probe.launch_attribute(4), Some([2, 1, 1]));
    assert_eq!(probe.launch_attribute(8), Some([-5, 0, 0]));
    assert_eq!(probe.launch_attribute_count(), 2);
    let got = out.to_vec(stream).unwrap();
    assert_eq!(&got[..8], &[0, 0, 1, 0, 0, 1, 1, 1]);
}

fn refusals_never_reach_the_driver() {
    let probe = standin::probe();
    let registry = launch_model();
    let stream = registry.stream();
    let (shape, pair) = cluster_kernels(&registry);
    let step = registry.function_cached("pdl", "pdl_step").unwrap();
    let mut out = DeviceBuffer::<u32>::alloc(registry.ctx(), 2 * 8192).unwrap();
    let mut x = DeviceBuffer::<f32>::alloc(registry.ctx(), 256).unwrap();
    let mut ptr = out.device_ptr();
    probe.reset();
    let mut shape_with = |f: &CudaFunction, blocks: u32, attrs: LaunchAttributes| {
        // SAFETY: the cluster kernels write two words per block; `out` has room for 8192 blocks
        // and outlives every launch.
        unsafe { f.launch_with(stream, &blocks_of_64(blocks), &attrs, (&mut out,)) }
    };
    let cluster = |dims| LaunchAttributes::new().cluster(dims);

    let zero = refusal(shape_with(&shape, 8, cluster((0, 1, 1))).unwrap_err());
    assert_eq!(zero, AttributeRefusal::ZeroCluster((0, 1, 1)));
    let uneven = refusal(shape_with(&shape, 6, cluster((4, 1, 1))).unwrap_err());
    assert_eq!(
        uneven,
        AttributeRefusal::GridNotDivisible {
            grid: (6, 1, 1),
            cluster: (4, 1, 1)
        }
    );
    let e = shape_with(&shape, 16, cluster((16, 1, 1))).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("cluster_shape") && text.contains("NON_PORTABLE_CLUSTER_SIZE_ALLOWED"),
        "{text}"
    );
    assert_eq!(
        refusal(e),
        AttributeRefusal::ClusterTooLarge {
            cluster: (16, 1, 1),
            blocks: 16,
            max: 8
        }
    );
    let e = shape_with(&pair, 8, cluster((4, 1, 1))).unwrap_err();
    assert!(e.to_string().contains("__cluster_dims__"), "{e}");
    assert_eq!(
        refusal(e),
        AttributeRefusal::ClusterMismatch {
            required: (2, 1, 1),
            given: (4, 1, 1)
        }
    );
    for priority in [-6, 1, i32::MIN, i32::MAX] {
        let e = shape_with(&shape, 1, LaunchAttributes::new().priority(priority)).unwrap_err();
        assert_eq!(
            refusal(e),
            AttributeRefusal::PriorityOutOfRange {
                priority,
                greatest: -5,
                least: 0
            }
        );
    }
    // 64-thread blocks: 32 a multiprocessor on the stand-in, 132 multiprocessors.
    let e = shape_with(
        &shape,
        32 * 132 + 1,
        LaunchAttributes::new().cooperative(true),
    )
    .unwrap_err();
    assert!(e.to_string().contains("4225 blocks"), "{e}");
    assert_eq!(
        refusal(e),
        AttributeRefusal::CooperativeGridTooLarge {
            blocks: 4225,
            max: 4224,
            per_multiprocessor: 32,
            multiprocessors: 132
        }
    );
    // The typed launch's own checks still come first.
    // SAFETY: refused before the driver (wrong argument types).
    let e = unsafe {
        step.launch_with(
            stream,
            &blocks_of_64(1),
            &LaunchAttributes::new(),
            (&mut x, 1.0f32),
        )
    }
    .unwrap_err();
    assert!(
        matches!(
            &e,
            AtlasError::InvalidLaunch {
                reason: LaunchRefusal::Arguments { .. },
                ..
            }
        ),
        "{e}"
    );
    // SAFETY: refused before the driver (a zero grid).
    let e = unsafe {
        step.launch_with(
            stream,
            &blocks_of_64(0),
            &cluster((1, 1, 1)),
            (&mut x, 1u32, 1.0f32, 0.0f32),
        )
    }
    .unwrap_err();
    assert!(
        matches!(
            &e,
            AtlasError::InvalidLaunch {
                reason: LaunchRefusal::Limit(_),
                ..
            }
        ),
        "{e}"
    );
    // The raw door refuses the same, for its own handles and for foreign ones.
    let mut params = [(&raw mut ptr).cast::<c_void>()];
    for func in [shape.raw(), RawCudaFunc::from_raw(shape.raw().raw())] {
        // SAFETY: refused before the driver (a grid of 6 in clusters of 4).
        let e = unsafe {
            registry.launch_on_stream_with(
                func,
                &blocks_of_64(6),
                &cluster((4, 1, 1)),
                stream.raw(),
                &mut params,
            )
        }
        .unwrap_err();
        assert!(matches!(
            refusal(e),
            AttributeRefusal::GridNotDivisible { .. }
        ));
    }
    // SAFETY: refused before the driver (two parameter pointers for a kernel of one).
    let e = unsafe {
        registry.launch_on_stream_with(
            shape.raw(),
            &blocks_of_64(1),
            &LaunchAttributes::new(),
            stream.raw(),
            &mut [params[0], params[0]],
        )
    }
    .unwrap_err();
    assert!(
        matches!(
            &e,
            AtlasError::InvalidLaunch {
                reason: LaunchRefusal::ParamCount { .. },
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(
        probe.count("cuLaunchKernelEx") + probe.launches(),
        0,
        "a refused launch reached the driver"
    );

    // What passes: the largest cooperative grid; occupancy read once per configuration.
    shape_with(&shape, 32 * 132, LaunchAttributes::new().cooperative(true)).unwrap();
    shape_with(&shape, 32 * 132, LaunchAttributes::new().cooperative(true)).unwrap();
    assert_eq!(
        probe.count("cuOccupancyMaxActiveBlocksPerMultiprocessor"),
        1
    );
    // The kernel's own cluster dimensions, and none.
    shape_with(&pair, 8, cluster((2, 1, 1))).unwrap();
    shape_with(&pair, 8, LaunchAttributes::new()).unwrap();
    // A kernel that allows non-portable sizes takes 16 blocks (read at each such launch).
    let cuda = sys::driver().unwrap();
    let set = *cuda.cuFuncSetAttribute.as_ref().unwrap();
    let allowed = CUfunction_attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED;
    // SAFETY: the function is live (its registry is); the attribute takes 0 or 1.
    let status = unsafe { set(shape.raw().raw(), allowed, 1) };
    assert_eq!(status, CUresult::CUDA_SUCCESS);
    shape_with(&shape, 16, cluster((16, 1, 1))).unwrap();
    assert_eq!(probe.count("cuLaunchKernelEx"), 5);
    // Beyond what the device runs for this kernel (the stand-in's bound: 16 blocks), refused with
    // that bound, read from the driver.
    let beyond = refusal(shape_with(&shape, 32, cluster((32, 1, 1))).unwrap_err());
    assert_eq!(
        beyond,
        AttributeRefusal::ClusterBeyondDevice {
            cluster: (32, 1, 1),
            blocks: 32,
            max: 16
        }
    );
    assert!(probe.count("cuOccupancyMaxPotentialClusterSize") >= 1);
    assert_eq!(
        probe.count("cuLaunchKernelEx"),
        5,
        "refused before the driver"
    );
}

fn an_older_device_refuses_what_it_lacks() {
    let registry = launch_model();
    assert_eq!(registry.host().compute_capability(), (8, 0));
    let stream = registry.stream();
    let step = registry.function_cached("pdl", "pdl_step").unwrap();
    let mut x = DeviceBuffer::from_slice(registry.ctx(), stream, &[1.0f32; 64]).unwrap();
    let cfg = LaunchConfig::for_elements(64, 64);
    let mut with = |attrs: LaunchAttributes| {
        // SAFETY: `pdl_step` touches the 64 floats of `x`, which outlives the launch.
        unsafe { step.launch_with(stream, &cfg, &attrs, (&mut x, 64u32, 2.0f32, 1.0f32)) }
    };
    let e = with(LaunchAttributes::new().programmatic_stream_serialization(true)).unwrap_err();
    assert!(
        e.to_string().contains("9.0") && e.to_string().contains("8.0"),
        "{e}"
    );
    assert_eq!(
        refusal(e),
        AttributeRefusal::ProgrammaticUnsupported {
            compute_capability: (8, 0)
        }
    );
    let e = with(LaunchAttributes::new().cluster((1, 1, 1))).unwrap_err();
    assert!(
        e.to_string()
            .contains("does not support thread block clusters"),
        "{e}"
    );
    assert_eq!(
        refusal(e),
        AttributeRefusal::ClustersUnsupported {
            compute_capability: (8, 0)
        }
    );
    let e = with(LaunchAttributes::new().cooperative(true)).unwrap_err();
    assert_eq!(refusal(e), AttributeRefusal::CooperativeUnsupported);
    assert_eq!(standin::probe().count("cuLaunchKernelEx"), 0);
    // What the device has still works.
    with(LaunchAttributes::new().priority(-1)).unwrap();
    assert_eq!(x.to_vec(stream).unwrap(), vec![3.0f32; 64]);
}

fn a_driver_without_launch_ex_is_named() {
    let registry = launch_model();
    let stream = registry.stream();
    let step = registry.function_cached("pdl", "pdl_step").unwrap();
    let mut x = DeviceBuffer::from_slice(registry.ctx(), stream, &[1.0f32; 64]).unwrap();
    let cfg = LaunchConfig::for_elements(64, 64);
    // SAFETY: `pdl_step` touches the 64 floats of `x`, which outlives the launches.
    let e = unsafe {
        step.launch_with(
            stream,
            &cfg,
            &LaunchAttributes::new().priority(0),
            (&mut x, 64u32, 2.0f32, 1.0f32),
        )
    }
    .unwrap_err();
    match &e {
        AtlasError::MissingSymbol(missing) => assert_eq!(missing.name, "cuLaunchKernelEx"),
        other => panic!("expected a missing cuLaunchKernelEx, got {other}"),
    }
    assert!(e.to_string().contains("cuLaunchKernelEx"), "{e}");
    // The plain launch does not need it.
    // SAFETY: as above.
    unsafe { step.launch(stream, &cfg, (&mut x, 64u32, 2.0f32, 1.0f32)) }.unwrap();
    assert_eq!(x.to_vec(stream).unwrap(), vec![3.0f32; 64]);
}

/// Nodes captured from a launch in clusters and from a cooperative launch: an argument update
/// that their attributes cannot take (a grid the cluster does not divide, a cooperative grid that
/// does not fit) is refused before the driver, as the launch would have been; a plain node takes
/// any grid.
fn argument_updates_of_captured_nodes_check_their_attributes_again() {
    let probe = standin::probe();
    let registry = launch_model();
    let mut stream = CudaStream::new(registry.ctx()).unwrap();
    let (shape, pair) = cluster_kernels(&registry);
    let mut out = DeviceBuffer::<u32>::alloc(registry.ctx(), 2 * 8192).unwrap();
    let cooperative = LaunchAttributes::new().cooperative(true);
    let capture = stream.begin_capture().unwrap();
    // SAFETY: captured, not run: the cluster kernels write two words per block of `out` (room
    // for 8192 blocks), which the graph keeps.
    unsafe {
        shape
            .launch_with(
                &capture,
                &blocks_of_64(8),
                &LaunchAttributes::new().cluster((2, 1, 1)),
                (&mut out,),
            )
            .unwrap();
        shape
            .launch_with(&capture, &blocks_of_64(64), &cooperative, (&mut out,))
            .unwrap();
        shape
            .launch(&capture, &blocks_of_64(4), (&mut out,))
            .unwrap();
    }
    let mut exec = capture.end().unwrap().instantiate().unwrap();
    let mut set = |node: usize, f: &CudaFunction, blocks: u32| {
        // SAFETY: the cluster kernels write two words per block of `out`, which has room for the
        // largest grid here and which the executable graph keeps.
        unsafe { exec.set_kernel_args(node, f, &blocks_of_64(blocks), (&mut out,)) }
    };
    assert_eq!(
        refusal(set(0, &shape, 7).unwrap_err()),
        AttributeRefusal::GridNotDivisible {
            grid: (7, 1, 1),
            cluster: (2, 1, 1)
        }
    );
    assert_eq!(
        refusal(set(1, &shape, 32 * 132 + 1).unwrap_err()),
        AttributeRefusal::CooperativeGridTooLarge {
            blocks: 4225,
            max: 4224,
            per_multiprocessor: 32,
            multiprocessors: 132
        }
    );
    assert_eq!(
        probe.count("cuGraphExecKernelNodeSetParams_v2"),
        0,
        "a refused update reached the driver"
    );
    set(0, &pair, 8).unwrap();
    set(1, &shape, 32 * 132).unwrap();
    set(2, &shape, 6).unwrap();
    assert_eq!(probe.count("cuGraphExecKernelNodeSetParams_v2"), 3);
    // SAFETY: as above.
    unsafe { exec.launch(&stream) }.unwrap();
    let got = out.to_vec(&stream).unwrap();
    // The last nodes overwrite the first: every block of the cooperative grid, unclustered.
    for b in 0..32 * 132usize {
        assert_eq!((got[2 * b], got[2 * b + 1]), (0, b as u32), "block {b}");
    }
}

/// `coop_sum` with 64 KiB of dynamic shared memory (more than the 48 KiB a function may use before
/// its opt-in): co-residency is counted after the opt-in, so the largest co-resident grid passes
/// from the raw door and then from the typed door, and the sums match the CPU's.
fn a_cooperative_launch_opts_in_before_it_counts_blocks() {
    let registry = launch_model();
    let sum = registry.function_cached("cooperative", "coop_sum").unwrap();
    let mut rng = Rng::new();
    let threads = 256u32;
    // The stand-in holds 2048 threads an SM and 227 KiB of dynamic shared memory: 3 such blocks.
    let blocks = 3 * 132;
    let cfg = LaunchConfig {
        grid: (blocks, 1, 1),
        block: (threads, 1, 1),
        shared_mem_bytes: 64 << 10,
    };
    for door in [Door::Raw, Door::Typed, Door::Foreign] {
        let n = blocks * threads + rng.index(5000) as u32;
        let input: Vec<u32> = (0..n).map(|_| rng.next_u64() as u32).collect();
        let want = input.iter().fold(0u32, |s, &v| s.wrapping_add(v));
        assert_eq!(
            coop_sum_through(&registry, &sum, door, &cfg, &input),
            (want, blocks),
            "{door:?} door: the sum, and the blocks that arrived"
        );
    }
}

/// How a launch reaches the driver: [`Kernel::launch_with`](atlas_registry::Kernel::launch_with),
/// [`AtlasRegistry::launch_on_stream_with`] with the registry's handle, or with a handle made by
/// [`RawCudaFunc::from_raw`].
#[derive(Debug, Clone, Copy)]
enum Door {
    Typed,
    Raw,
    Foreign,
}

/// `coop_sum` over `input`, launched cooperatively with `cfg` through `door` on the registry's
/// stream, its outputs poisoned first: the sum and the count of blocks that arrived.
fn coop_sum_through(
    registry: &AtlasRegistry,
    sum: &CudaFunction,
    door: Door,
    cfg: &LaunchConfig,
    input: &[u32],
) -> (u32, u32) {
    let (stream, ctx) = (registry.stream(), registry.ctx());
    let coop = LaunchAttributes::new().cooperative(true);
    let blocks = cfg.grid.0 as usize;
    let data = DeviceBuffer::from_slice(ctx, stream, input).unwrap();
    let mut partials = DeviceBuffer::from_slice(ctx, stream, &vec![u32::MAX; blocks]).unwrap();
    let mut out = DeviceBuffer::from_slice(ctx, stream, &[u32::MAX]).unwrap();
    let mut arrived = DeviceBuffer::from_slice(ctx, stream, &[0u32]).unwrap();
    let mut n = input.len() as u32;
    let launched = match door {
        // SAFETY: coop_sum reads the `n` words of `data`, writes one partial per block, one word
        // of `out` and counts in `arrived`; all outlive the launch (`to_vec` below waits); every
        // block is resident at once (cooperative, and the grid fits, or it is refused).
        Door::Typed => unsafe {
            sum.launch_with(
                stream,
                cfg,
                &coop,
                (&data, &mut partials, &mut out, n, &mut arrived),
            )
        },
        Door::Raw | Door::Foreign => {
            let func = match door {
                Door::Raw => sum.raw(),
                _ => RawCudaFunc::from_raw(sum.raw().raw()),
            };
            let mut ptrs = [
                data.device_ptr(),
                partials.device_ptr(),
                out.device_ptr(),
                arrived.device_ptr(),
            ];
            let [a, b, c, d] = &mut ptrs;
            let mut params = [
                (a as *mut u64).cast::<c_void>(),
                (b as *mut u64).cast(),
                (c as *mut u64).cast(),
                (&raw mut n).cast(),
                (d as *mut u64).cast(),
            ];
            // SAFETY: as for the typed door; the parameters are coop_sum's, in order.
            unsafe { registry.launch_on_stream_with(func, cfg, &coop, stream.raw(), &mut params) }
        }
    };
    launched.unwrap_or_else(|e| panic!("{door:?} door: {e}"));
    (
        out.to_vec(stream).unwrap()[0],
        arrived.to_vec(stream).unwrap()[0],
    )
}

// ---------------------------------------------------------------------------------------------
// GPU
// ---------------------------------------------------------------------------------------------

/// The `launch` model's cubins for device 0 (sm_90: its Hopper instructions are there only).
fn gpu_launch_model() -> AtlasRegistry {
    AtlasRegistry::load(0, device_cubins("launch"))
        .unwrap_or_else(|e| panic!("loading the launch model ({NEEDS_GPU}): {e}"))
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_a_pdl_chain_gives_the_cpu_reference_bit_for_bit() {
    let registry = gpu_launch_model();
    let stream = CudaStream::new(registry.ctx()).unwrap();
    let step = registry.function_cached("pdl", "pdl_step").unwrap();
    let mut rng = Rng::new();
    let n = (1 << 20) + rng.index(1 << 12) as u32;
    let input = rng.f32s(n as usize, -2.0, 2.0);
    let steps: Vec<(f32, f32)> = (0..64)
        .map(|_| (rng.f32_in(-1.0, 1.0), rng.f32_in(-1.0, 1.0)))
        .collect();
    let want = chain_reference(&input, &steps);
    let mut poisoned = input.clone();
    poisoned.extend(std::iter::repeat_n(f32::NAN, 61));
    let mut x = DeviceBuffer::from_slice(registry.ctx(), &stream, &poisoned).unwrap();
    let pdl = LaunchAttributes::new().programmatic_stream_serialization(true);
    for (what, attrs) in [("without PDL", None), ("with PDL", Some(&pdl))] {
        x.copy_from(&stream, &poisoned).unwrap();
        chain(&step, &stream, &mut x, n, &steps, attrs);
        let got = x.to_vec(&stream).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{what}: element {i}: {g} != {w}");
        }
        assert!(
            got[n as usize..].iter().all(|v| v.is_nan()),
            "{what}: wrote past n"
        );
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_the_cluster_kernel_sees_the_cluster_shape_asked_for() {
    let registry = gpu_launch_model();
    let stream = registry.stream();
    let (shape, pair) = cluster_kernels(&registry);
    let blocks = 64u32;
    let mut out = DeviceBuffer::<u32>::alloc(registry.ctx(), 2 * blocks as usize).unwrap();
    let cfg = LaunchConfig {
        grid: (blocks, 1, 1),
        block: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut run = |f: &CudaFunction, cluster: Option<u32>| -> atlas_registry::Result<Vec<u32>> {
        out.copy_from(stream, &vec![u32::MAX; 2 * blocks as usize])?;
        let attrs = match cluster {
            Some(c) => LaunchAttributes::new().cluster((c, 1, 1)),
            None => LaunchAttributes::new(),
        };
        // SAFETY: the cluster kernels write two words per block of `out`, which holds them and
        // outlives the launch (`to_vec` synchronizes).
        unsafe { f.launch_with(stream, &cfg, &attrs, (&mut out,)) }?;
        out.to_vec(stream)
    };
    let expect = |got: &[u32], c: u32, what: &str| {
        for b in 0..blocks {
            let (rank, cluster) = (got[2 * b as usize], got[2 * b as usize + 1]);
            assert_eq!((rank, cluster), (b % c, b / c), "{what}: block {b}");
        }
    };
    expect(&run(&shape, None).unwrap(), 1, "no cluster");
    for c in [1, 2, 4, 8] {
        expect(
            &run(&shape, Some(c)).unwrap(),
            c,
            &format!("clusters of {c}"),
        );
    }
    expect(
        &run(&pair, None).unwrap(),
        2,
        "__cluster_dims__(2,1,1), no attribute",
    );
    expect(
        &run(&pair, Some(2)).unwrap(),
        2,
        "__cluster_dims__(2,1,1), asked for 2",
    );
    let refused = |e: atlas_registry::Result<Vec<u32>>| refusal(e.unwrap_err());
    assert!(matches!(
        refused(run(&pair, Some(4))),
        AttributeRefusal::ClusterMismatch { .. }
    ));
    assert!(matches!(
        refused(run(&shape, Some(16))),
        AttributeRefusal::ClusterTooLarge { .. }
    ));
    // With non-portable sizes allowed: up to what the device runs for this kernel, and no more.
    let cuda = sys::driver().unwrap();
    let set = *cuda.cuFuncSetAttribute.as_ref().unwrap();
    let allowed = CUfunction_attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED;
    // SAFETY: the function is live (its registry is); the attribute takes 0 or 1.
    let status = unsafe { set(shape.raw().raw(), allowed, 1) };
    assert_eq!(status, CUresult::CUDA_SUCCESS);
    expect(
        &run(&shape, Some(16)).unwrap(),
        16,
        "clusters of 16 (non-portable)",
    );
    match refused(run(&shape, Some(32))) {
        AttributeRefusal::ClusterBeyondDevice {
            cluster: (32, 1, 1),
            blocks: 32,
            max,
        } => assert!((16..32).contains(&max), "the device's bound: {max}"),
        other => panic!("clusters of 32: {other:?}"),
    }
    // SAFETY: as above.
    let status = unsafe { set(shape.raw().raw(), allowed, 0) };
    assert_eq!(status, CUresult::CUDA_SUCCESS);
    assert!(matches!(
        refused(run(&shape, Some(3))),
        AttributeRefusal::GridNotDivisible { .. }
    ));
    assert!(matches!(
        refused(run(&shape, Some(0))),
        AttributeRefusal::ZeroCluster(_)
    ));
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_a_cooperative_sum_is_right_at_the_largest_co_resident_grid_and_refused_above() {
    let registry = gpu_launch_model();
    let stream = registry.stream();
    let sum = registry.function_cached("cooperative", "coop_sum").unwrap();
    let limits = registry.host().limits().clone();
    let threads = 256u32;
    let mut rng = Rng::new();
    let cfg = |blocks: u32| LaunchConfig {
        grid: (blocks, 1, 1),
        block: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    let coop = LaunchAttributes::new().cooperative(true);
    // Ask for far too many blocks: the refusal says how many fit.
    let probe_launch = |blocks: u32| {
        // SAFETY: only grids larger than what fits are asked for here, and those are refused
        // before the driver (null addresses of the right sizes never reach a kernel).
        unsafe { sum.launch_with(stream, &cfg(blocks), &coop, (0u64, 0u64, 0u64, 0u32, 0u64)) }
    };
    let AttributeRefusal::CooperativeGridTooLarge {
        max,
        per_multiprocessor,
        multiprocessors,
        ..
    } = refusal(probe_launch(1 << 20).unwrap_err())
    else {
        panic!("expected CooperativeGridTooLarge")
    };
    println!(
        "coop_sum: {per_multiprocessor} blocks of {threads} threads per SM × {multiprocessors} SMs = {max}"
    );
    assert_eq!(multiprocessors, limits.multiprocessors);
    assert!(
        per_multiprocessor >= 1
            && max == u64::from(per_multiprocessor) * u64::from(multiprocessors)
    );
    let blocks = u32::try_from(max).unwrap();
    let above = refusal(probe_launch(blocks + 1).unwrap_err());
    assert!(
        matches!(above, AttributeRefusal::CooperativeGridTooLarge { blocks: b, .. } if b == max + 1)
    );

    let n = blocks * threads * 3 + rng.index(1000) as u32;
    let input: Vec<u32> = (0..n).map(|_| rng.next_u64() as u32).collect();
    let want = input.iter().fold(0u32, |s, &v| s.wrapping_add(v));
    let data = DeviceBuffer::from_slice(registry.ctx(), stream, &input).unwrap();
    let mut partials =
        DeviceBuffer::from_slice(registry.ctx(), stream, &vec![u32::MAX; blocks as usize]).unwrap();
    let mut out = DeviceBuffer::from_slice(registry.ctx(), stream, &[u32::MAX]).unwrap();
    let mut arrived = DeviceBuffer::from_slice(registry.ctx(), stream, &[0u32]).unwrap();
    // SAFETY: `coop_sum` reads the `n` words of `data`, writes one partial per block (`partials`
    // has `blocks`), one word of `out` and counts in `arrived`; all outlive the launch (`to_vec`
    // synchronizes). Every block is resident at once: the launch is cooperative and fits.
    unsafe {
        sum.launch_with(
            stream,
            &cfg(blocks),
            &coop,
            (&data, &mut partials, &mut out, n, &mut arrived),
        )
    }
    .unwrap();
    assert_eq!(
        out.to_vec(stream).unwrap(),
        vec![want],
        "the sum of {n} words over {blocks} blocks"
    );
    assert_eq!(arrived.to_vec(stream).unwrap(), vec![blocks]);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_priority_domain_and_programmatic_event_launches_run() {
    let registry = gpu_launch_model();
    let stream = CudaStream::new(registry.ctx()).unwrap();
    let step = registry.function_cached("pdl", "pdl_step").unwrap();
    let (least, greatest) = registry.ctx().stream_priorities().unwrap();
    println!("stream priorities: least {least}, greatest {greatest}");
    let mut rng = Rng::new();
    let n = 100_000 + rng.index(1000) as u32;
    let input = rng.f32s(n as usize, -10.0, 10.0);
    let mut x = DeviceBuffer::from_slice(registry.ctx(), &stream, &input).unwrap();
    let cuda = sys::driver().unwrap();
    let create = *cuda.cuEventCreate.as_ref().unwrap();
    let synchronize = *cuda.cuEventSynchronize.as_ref().unwrap();
    let destroy = *cuda.cuEventDestroy_v2.as_ref().unwrap();
    let mut event = std::ptr::null_mut();
    registry.ctx().bind().unwrap();
    // SAFETY: `event` is a live out-pointer; the registry's context is current (above).
    let created = unsafe { create(&mut event, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING.0) };
    assert_eq!(created, CUresult::CUDA_SUCCESS);
    // SAFETY: the event was created above without timing in the registry's context and is
    // destroyed only after every launch below has returned.
    let with_event = unsafe { LaunchAttributes::new().programmatic_event(event, false) };
    let cases = [
        LaunchAttributes::new().priority(greatest),
        LaunchAttributes::new().priority(least),
        LaunchAttributes::new().mem_sync_domain(MemSyncDomain::Remote),
        LaunchAttributes::new().mem_sync_domain(MemSyncDomain::Default),
        with_event,
    ];
    let steps: Vec<(f32, f32)> = (0..cases.len())
        .map(|_| (rng.f32_in(-1.0, 1.0), rng.f32_in(-1.0, 1.0)))
        .collect();
    let cfg = LaunchConfig::for_elements(n, 256);
    for (attrs, &(a, b)) in cases.iter().zip(&steps) {
        // SAFETY: `pdl_step` touches the `n` floats of `x`, which outlives the launches.
        unsafe { step.launch_with(&stream, &cfg, attrs, (&mut x, n, a, b)) }.unwrap();
    }
    // SAFETY: the event is live; the last launch records it.
    assert_eq!(unsafe { synchronize(event) }, CUresult::CUDA_SUCCESS);
    let got = x.to_vec(&stream).unwrap();
    let want = chain_reference(&input, &steps);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "element {i}");
    }
    // SAFETY: nothing uses the event any more (the stream was synchronized by `to_vec`).
    assert_eq!(unsafe { destroy(event) }, CUresult::CUDA_SUCCESS);
    let beyond = if greatest < least {
        greatest - 1
    } else {
        least + 1
    };
    // SAFETY: refused before the driver.
    let e = unsafe {
        step.launch_with(
            &stream,
            &cfg,
            &LaunchAttributes::new().priority(beyond),
            (&mut x, n, 1.0f32, 0.0f32),
        )
    }
    .unwrap_err();
    assert!(matches!(
        refusal(e),
        AttributeRefusal::PriorityOutOfRange { .. }
    ));
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_a_cooperative_sum_with_64_kib_of_shared_memory_runs_from_both_doors() {
    let registry = gpu_launch_model();
    let stream = registry.stream();
    let sum = registry.function_cached("cooperative", "coop_sum").unwrap();
    let threads = 256u32;
    let shared = 64u32 << 10;
    let cfg = |blocks: u32| LaunchConfig {
        grid: (blocks, 1, 1),
        block: (threads, 1, 1),
        shared_mem_bytes: shared,
    };
    let coop = LaunchAttributes::new().cooperative(true);
    let mut rng = Rng::new();
    let mut check = |door: Door, blocks: u32| {
        let n = blocks * threads * 2 + rng.index(1000) as u32;
        let input: Vec<u32> = (0..n).map(|_| rng.next_u64() as u32).collect();
        let want = input.iter().fold(0u32, |s, &v| s.wrapping_add(v));
        assert_eq!(
            coop_sum_through(&registry, &sum, door, &cfg(blocks), &input),
            (want, blocks),
            "{door:?} door: the sum of {n} words over {blocks} blocks, and the blocks that arrived"
        );
    };
    // The raw door first, with one block per multiprocessor (which fits wherever 64 KiB does): it
    // read the occupancy before the opt-in (0 blocks), kept it, and the typed door then refused
    // the same configuration too.
    let one_per_multiprocessor = registry.host().limits().multiprocessors;
    check(Door::Raw, one_per_multiprocessor);
    check(Door::Typed, one_per_multiprocessor);
    // Then the largest co-resident grid: far too many blocks are refused, saying how many fit.
    // SAFETY: refused before the driver (the grid does not fit); null addresses of the right
    // sizes never reach a kernel.
    let probe_launch =
        unsafe { sum.launch_with(stream, &cfg(1 << 20), &coop, (0u64, 0u64, 0u64, 0u32, 0u64)) };
    let AttributeRefusal::CooperativeGridTooLarge {
        max,
        per_multiprocessor,
        ..
    } = refusal(probe_launch.unwrap_err())
    else {
        panic!("expected CooperativeGridTooLarge")
    };
    println!("coop_sum with {shared} B of shared memory: {per_multiprocessor} blocks per SM");
    assert!(per_multiprocessor >= 1, "nothing fits");
    for door in [Door::Raw, Door::Typed] {
        check(door, u32::try_from(max).unwrap());
    }
}
