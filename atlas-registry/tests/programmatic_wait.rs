//! Programmatic dependent launch of kernels that never wait for their predecessor: what Atlas
//! reads of a kernel's code (`griddepcontrol.wait` in PTX, `ACQBULK` in sm_90+ SASS), and the
//! refusal of such a launch before the driver, from every launch door and in a capture; the
//! opt-out; kernels that wait, or whose wait Atlas cannot see, launch as asked.
//!
//! CPU (the blobs, and the stand-in libcuda in child processes): `cargo test -p atlas-registry
//! --test programmatic_wait`. GPU (an sm_90 device): `cargo test -p atlas-registry --test
//! programmatic_wait -- --include-ignored`.

mod support;

use std::ffi::c_void;

use atlas_kernels::{cubin_for_model, ptx_for_model};
use atlas_registry::{
    AtlasError, AtlasRegistry, AttributeRefusal, CudaEvent, CudaStream, DependencyWait,
    DeviceBuffer, LaunchAttributes, LaunchConfig, LaunchRefusal, kernel_dependency_waits,
};
use support::blobs::{NEEDS_GPU, blob_of, device_cubins};
use support::child;
use support::rng::Rng;
use support::standin;

use DependencyWait::{NeverWaits, Waits};

child::bodies!(
    a_kernel_that_never_waits_is_refused_from_every_door,
    a_kernel_that_waits_launches,
    the_fixture_kernels_on_the_standin,
    a_captured_programmatic_launch_is_checked_as_a_launch,
    argument_updates_behind_a_programmatic_edge_are_checked,
);

const FIXTURE_PTX: &[(&str, &[u8])] = &[
    (
        "pdl_waits",
        include_bytes!("fixtures/pdl/pdl_waits.ptx").as_slice(),
    ),
    (
        "pdl_nowait",
        include_bytes!("fixtures/pdl/pdl_nowait.ptx").as_slice(),
    ),
    (
        "pdl_callwait",
        include_bytes!("fixtures/pdl/pdl_callwait.ptx").as_slice(),
    ),
];

/// The fixture cubins: `(kernel, sm, bytes)`.
const FIXTURE_CUBINS: &[(&str, u32, &[u8])] = &[
    (
        "pdl_waits",
        90,
        include_bytes!("fixtures/pdl/pdl_waits.sm_90.cubin").as_slice(),
    ),
    (
        "pdl_waits",
        100,
        include_bytes!("fixtures/pdl/pdl_waits.sm_100.cubin").as_slice(),
    ),
    (
        "pdl_nowait",
        90,
        include_bytes!("fixtures/pdl/pdl_nowait.sm_90.cubin").as_slice(),
    ),
    (
        "pdl_nowait",
        100,
        include_bytes!("fixtures/pdl/pdl_nowait.sm_100.cubin").as_slice(),
    ),
    (
        "pdl_callwait",
        90,
        include_bytes!("fixtures/pdl/pdl_callwait.sm_90.cubin").as_slice(),
    ),
    (
        "pdl_callwait",
        100,
        include_bytes!("fixtures/pdl/pdl_callwait.sm_100.cubin").as_slice(),
    ),
];

/// What each fixture kernel does: waits, except `pdl_nowait`.
fn expected(kernel: &str) -> DependencyWait {
    if kernel == "pdl_nowait" {
        NeverWaits
    } else {
        Waits
    }
}

/// `ptx` with the NUL the driver reads PTX up to.
fn with_nul(ptx: &[u8]) -> Vec<u8> {
    let mut text = ptx.to_vec();
    text.push(0);
    text
}

// ---------------------------------------------------------------------------------------------
// CPU: the blobs
// ---------------------------------------------------------------------------------------------

#[test]
fn the_fixture_ptx_and_cubins_say_which_kernel_waits() {
    for &(kernel, ptx) in FIXTURE_PTX {
        assert_eq!(
            kernel_dependency_waits(ptx),
            [(kernel.to_owned(), expected(kernel))],
            "{kernel}.ptx"
        );
    }
    for &(kernel, sm, cubin) in FIXTURE_CUBINS {
        assert_eq!(
            kernel_dependency_waits(cubin),
            [(kernel.to_owned(), expected(kernel))],
            "{kernel}.sm_{sm}.cubin"
        );
    }
}

#[test]
fn the_cubin_marks_the_wait_by_one_instruction_only() {
    // The wait in `pdl_waits` is its only difference from `pdl_nowait` (names aside): with the
    // one ACQBULK turned into a NOP, the same cubin never waits.
    let cubin = FIXTURE_CUBINS[0].2;
    let at = (0..cubin.len() - 16)
        .step_by(16)
        .find(|&at| u64::from_le_bytes(cubin[at..at + 8].try_into().unwrap()) == 0x782e)
        .expect("one ACQBULK in pdl_waits.sm_90.cubin");
    let mut nop = cubin.to_vec();
    // NOP on sm_90: 0x0000000000007918, control bits kept.
    nop[at..at + 8].copy_from_slice(&0x7918u64.to_le_bytes());
    assert_eq!(
        kernel_dependency_waits(&nop),
        [("pdl_waits".to_owned(), NeverWaits)]
    );
}

#[test]
fn what_atlas_cannot_see_is_not_listed() {
    // A cubin of an architecture whose encoding of the wait Atlas does not know (sm_80 has no
    // wait at all, but Atlas reads only the architectures it has seen the wait in).
    assert!(
        kernel_dependency_waits(blob_of(cubin_for_model("launch", 80).unwrap(), "pdl")).is_empty()
    );
    // A relocatable cubin: its calls are resolved when it is linked.
    let mut relocatable = FIXTURE_CUBINS[2].2.to_vec();
    relocatable[16..18].copy_from_slice(&1u16.to_le_bytes()); // ET_REL
    assert!(kernel_dependency_waits(&relocatable).is_empty());
    // Fatbins are read entry by entry where Atlas loads them.
    assert!(kernel_dependency_waits(atlas_kernels::ELEMENTWISE_FATBIN).is_empty());
}

#[test]
fn the_committed_kernels_wait_in_their_sm_90_cubin_only() {
    // pdl.cu waits under `__CUDA_ARCH__ >= 900`: its compute_75 PTX cannot hold the wait, so a
    // programmatic launch of the PTX (JIT-compiled for an H200 as it is) would race.
    let ptx = blob_of(ptx_for_model("launch").unwrap(), "pdl");
    assert_eq!(
        kernel_dependency_waits(ptx),
        [("pdl_step".to_owned(), NeverWaits)]
    );
    let sm90 = cubin_for_model("launch", 90).unwrap();
    assert_eq!(
        kernel_dependency_waits(blob_of(sm90, "pdl")),
        [("pdl_step".to_owned(), Waits)]
    );
    assert_eq!(
        kernel_dependency_waits(blob_of(sm90, "cluster")),
        [
            ("cluster_shape".to_owned(), NeverWaits),
            ("cluster_shape_pair".to_owned(), NeverWaits)
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// CPU: the stand-in libcuda
// ---------------------------------------------------------------------------------------------

#[test]
fn a_programmatic_launch_of_a_kernel_that_never_waits_is_refused_before_the_driver() {
    standin::run(a_kernel_that_never_waits_is_refused_from_every_door, &[]);
}

#[test]
fn a_programmatic_launch_of_a_kernel_that_waits_reaches_the_driver() {
    standin::run(a_kernel_that_waits_launches, &[]);
}

#[test]
fn the_fixture_kernels_are_refused_or_launched_from_ptx_and_cubins() {
    standin::run(the_fixture_kernels_on_the_standin, &[]);
}

#[test]
fn a_captured_programmatic_launch_of_a_kernel_that_never_waits_is_refused() {
    standin::run(a_captured_programmatic_launch_is_checked_as_a_launch, &[]);
}

#[test]
fn an_argument_update_behind_a_programmatic_edge_refuses_a_kernel_that_never_waits() {
    standin::run(argument_updates_behind_a_programmatic_edge_are_checked, &[]);
}

/// The refusal inside `e`; panics on any other error.
fn refusal(e: AtlasError) -> AttributeRefusal {
    match e {
        AtlasError::InvalidLaunch {
            reason: LaunchRefusal::Attribute(reason),
            ..
        } => reason,
        other => panic!("expected an attribute refusal, got {other}"),
    }
}

fn a_kernel_that_never_waits_is_refused_from_every_door() {
    let probe = standin::probe();
    // The PTX: `pdl_step` without its wait.
    let registry = AtlasRegistry::load(0, ptx_for_model("launch").unwrap()).unwrap();
    let stream = registry.stream();
    let step = registry.function_cached("pdl", "pdl_step").unwrap();
    assert_eq!(step.dependency_wait(), NeverWaits);
    let mut rng = Rng::new();
    let n = 1 + rng.index(500) as u32;
    let input = rng.f32s(n as usize, -10.0, 10.0);
    let mut x = DeviceBuffer::from_slice(registry.ctx(), stream, &input).unwrap();
    let cfg = LaunchConfig::for_elements(n, 128);
    let pdl = LaunchAttributes::new().programmatic_stream_serialization(true);
    probe.reset();

    // SAFETY: `pdl_step` touches the `n` floats of `x`, which outlives every launch (`to_vec`
    // synchronizes the stream).
    let e =
        unsafe { step.launch_with(stream, &cfg, &pdl, (&mut x, n, 0.5f32, 1.0f32)) }.unwrap_err();
    let text = e.to_string();
    for part in [
        "pdl::pdl_step",
        "never waits",
        "griddepcontrol.wait",
        "cudaGridDependencySynchronize",
        "programmatic_without_wait",
    ] {
        assert!(text.contains(part), "{part:?} not in: {text}");
    }
    assert_eq!(refusal(e), AttributeRefusal::ProgrammaticWithoutWait);

    // The raw door.
    let (mut ptr, mut count, mut a, mut b) = (x.device_ptr(), n, 0.5f32, 1.0f32);
    let mut params: [*mut c_void; 4] = [
        (&raw mut ptr).cast(),
        (&raw mut count).cast(),
        (&raw mut a).cast(),
        (&raw mut b).cast(),
    ];
    // SAFETY: the function is this registry's; the parameters are `pdl_step`'s, live through the
    // call; `x` outlives the launch.
    let e = unsafe { registry.launch_on_stream_with(&step, &cfg, &pdl, stream, &mut params) }
        .unwrap_err();
    assert_eq!(refusal(e), AttributeRefusal::ProgrammaticWithoutWait);

    // A programmatic event.
    let event = CudaEvent::new(registry.ctx()).unwrap();
    // SAFETY: the event is made without timing in the function's context and outlives the launch.
    let with_event = unsafe { LaunchAttributes::new().programmatic_event(event.raw(), false) };
    // SAFETY: as the first launch.
    let e = unsafe { step.launch_with(stream, &cfg, &with_event, (&mut x, n, 0.5f32, 1.0f32)) }
        .unwrap_err();
    assert_eq!(refusal(e), AttributeRefusal::ProgrammaticWithoutWait);
    assert_eq!(
        (probe.count("cuLaunchKernelEx"), probe.launches()),
        (0, 0),
        "refused before the driver"
    );

    // Not programmatic: launched as always.
    // SAFETY: as the first launch.
    unsafe { step.launch(stream, &cfg, (&mut x, n, 0.5f32, 1.0f32)) }.unwrap();
    // SAFETY: as the first launch.
    unsafe {
        step.launch_with(
            stream,
            &cfg,
            &LaunchAttributes::new().priority(-1),
            (&mut x, n, 0.5f32, 1.0f32),
        )
    }
    .unwrap();
    // The opt-out, from both doors.
    let opted = pdl.programmatic_without_wait(true);
    // SAFETY: as the first launch.
    unsafe { step.launch_with(stream, &cfg, &opted, (&mut x, n, 0.5f32, 1.0f32)) }.unwrap();
    // SAFETY: as the raw launch above.
    unsafe { registry.launch_on_stream_with(&step, &cfg, &opted, stream, &mut params) }.unwrap();
    assert_eq!((probe.launches(), probe.count("cuLaunchKernelEx")), (1, 3));
    assert_eq!(
        probe.launch_attribute(6),
        Some([1, 0, 0]),
        "the opt-out is no attribute"
    );
    assert_eq!(probe.launch_attribute_count(), 1);
    let want: Vec<f32> = input
        .iter()
        .map(|&v| (0..4).fold(v, |v, _| v * 0.5 + 1.0))
        .collect();
    assert_eq!(x.to_vec(stream).unwrap(), want);
}

fn a_kernel_that_waits_launches() {
    let probe = standin::probe();
    // The sm_90 cubins: `pdl_step` waits there.
    let registry = AtlasRegistry::load(0, cubin_for_model("launch", 90).unwrap()).unwrap();
    let stream = registry.stream();
    let step = registry.function_cached("pdl", "pdl_step").unwrap();
    assert_eq!(step.dependency_wait(), Waits);
    let shape = registry
        .function_cached("cluster", "cluster_shape")
        .unwrap();
    assert_eq!(shape.dependency_wait(), NeverWaits);
    let mut x = DeviceBuffer::from_slice(registry.ctx(), stream, &[2.0f32; 64]).unwrap();
    let cfg = LaunchConfig::for_elements(64, 64);
    let pdl = LaunchAttributes::new().programmatic_stream_serialization(true);
    probe.reset();
    for _ in 0..3 {
        // SAFETY: `pdl_step` touches the 64 floats of `x`, which outlives the launches.
        unsafe { step.launch_with(stream, &cfg, &pdl, (&mut x, 64u32, 2.0f32, -1.0f32)) }.unwrap();
    }
    assert_eq!(probe.count("cuLaunchKernelEx"), 3);
    assert_eq!(x.to_vec(stream).unwrap(), vec![9.0f32; 64]);
}

fn the_fixture_kernels_on_the_standin() {
    let probe = standin::probe();
    let pdl = LaunchAttributes::new().programmatic_stream_serialization(true);
    let ptx: Vec<(&str, Vec<u8>)> = FIXTURE_PTX
        .iter()
        .map(|&(kernel, ptx)| (kernel, with_nul(ptx)))
        .collect();
    let cubins = FIXTURE_CUBINS.iter().filter(|c| c.1 == 90);
    let blobs = ptx
        .iter()
        .map(|(kernel, ptx)| (*kernel, "ptx", &ptx[..]))
        .chain(cubins.map(|&(kernel, _, cubin)| (kernel, "sm_90", cubin)));
    for (kernel, what, blob) in blobs {
        let registry = AtlasRegistry::load(0, &[(kernel, blob)]).unwrap();
        let stream = registry.stream();
        let f = registry.function_cached(kernel, kernel).unwrap();
        assert_eq!(f.dependency_wait(), expected(kernel), "{kernel} {what}");
        let mut x = DeviceBuffer::from_slice(registry.ctx(), stream, &[0.0f32]).unwrap();
        let cfg = LaunchConfig::for_elements(1, 32);
        probe.reset();
        // SAFETY: the kernel adds 1 to the float `x` holds, which outlives the launch.
        let launched = unsafe { f.launch_with(stream, &cfg, &pdl, (&mut x,)) };
        match expected(kernel) {
            NeverWaits => {
                let e = launched.unwrap_err();
                assert_eq!(refusal(e), AttributeRefusal::ProgrammaticWithoutWait);
                assert_eq!(probe.count("cuLaunchKernelEx"), 0, "{kernel} {what}");
            }
            _ => {
                launched.unwrap_or_else(|e| panic!("{kernel} {what}: {e}"));
                assert_eq!(x.to_vec(stream).unwrap(), [1.0], "{kernel} {what}");
            }
        }
    }
}

fn a_captured_programmatic_launch_is_checked_as_a_launch() {
    let probe = standin::probe();
    let registry = AtlasRegistry::load(0, ptx_for_model("launch").unwrap()).unwrap();
    let step = registry.function_cached("pdl", "pdl_step").unwrap();
    let mut x = DeviceBuffer::<f32>::alloc(registry.ctx(), 64).unwrap();
    let mut stream = CudaStream::new(registry.ctx()).unwrap();
    let cfg = LaunchConfig::for_elements(64, 64);
    let pdl = LaunchAttributes::new().programmatic_stream_serialization(true);
    probe.reset();
    let capture = stream.begin_capture().unwrap();
    // SAFETY: captured, not run: `pdl_step` touches the 64 floats of `x`, which the graph keeps.
    unsafe { step.launch(&capture, &cfg, (&mut x, 64u32, 1.0f32, 0.0f32)) }.unwrap();
    // SAFETY: as above.
    let e = unsafe { step.launch_with(&capture, &cfg, &pdl, (&mut x, 64u32, 1.0f32, 0.0f32)) }
        .unwrap_err();
    assert_eq!(refusal(e), AttributeRefusal::ProgrammaticWithoutWait);
    let exec = capture.end().unwrap().instantiate().unwrap();
    assert_eq!(exec.kernel_count(), 1, "the refused launch is no node");
    assert_eq!(probe.count("cuLaunchKernelEx"), 0);
}

/// A graph of two launches of `pdl_waits`, the second programmatic (an edge of that type to it),
/// then argument updates: `pdl_nowait` is refused behind the programmatic edge and taken on the
/// first node; `pdl_waits` is taken on both. A node captured launching `pdl_nowait` with the
/// opt-out takes it again.
fn argument_updates_behind_a_programmatic_edge_are_checked() {
    let probe = standin::probe();
    let blobs: Vec<(&str, Vec<u8>)> = FIXTURE_PTX
        .iter()
        .map(|&(kernel, ptx)| (kernel, with_nul(ptx)))
        .collect();
    let blobs: Vec<(&str, &[u8])> = blobs.iter().map(|(k, b)| (*k, &b[..])).collect();
    let registry = AtlasRegistry::load(0, &blobs).unwrap();
    let waits = registry.function_cached("pdl_waits", "pdl_waits").unwrap();
    let nowait = registry
        .function_cached("pdl_nowait", "pdl_nowait")
        .unwrap();
    assert_eq!(
        (waits.dependency_wait(), nowait.dependency_wait()),
        (Waits, NeverWaits)
    );
    let mut x = DeviceBuffer::from_slice(registry.ctx(), registry.stream(), &[0.0f32]).unwrap();
    let cfg = LaunchConfig::for_elements(1, 32);
    let pdl = LaunchAttributes::new().programmatic_stream_serialization(true);
    let capture_pair = |second: &atlas_registry::CudaFunction, attrs: &LaunchAttributes| {
        let mut stream = CudaStream::new(registry.ctx()).unwrap();
        let mut y = DeviceBuffer::from_slice(registry.ctx(), &stream, &[0.0f32]).unwrap();
        let capture = stream.begin_capture().unwrap();
        // SAFETY: captured, not run here: each kernel adds 1 to the float of `y`, which the graph
        // keeps.
        unsafe { waits.launch(&capture, &cfg, (&mut y,)) }.unwrap();
        // SAFETY: as above.
        unsafe { second.launch_with(&capture, &cfg, attrs, (&mut y,)) }.unwrap();
        capture.end().unwrap().instantiate().unwrap()
    };
    let mut exec = capture_pair(&waits, &pdl);
    probe.reset();
    // SAFETY: refused before the driver.
    let e = unsafe { exec.set_kernel_args(1, &nowait, &cfg, (&mut x,)) }.unwrap_err();
    assert_eq!(refusal(e), AttributeRefusal::ProgrammaticWithoutWait);
    assert_eq!(probe.count("cuGraphExecKernelNodeSetParams_v2"), 0);
    // SAFETY: each kernel adds 1 to the float of `x`, which the executable graph keeps from now.
    unsafe { exec.set_kernel_args(0, &nowait, &cfg, (&mut x,)) }.unwrap();
    // SAFETY: as above.
    unsafe { exec.set_kernel_args(1, &waits, &cfg, (&mut x,)) }.unwrap();
    assert_eq!(probe.count("cuGraphExecKernelNodeSetParams_v2"), 2);
    // SAFETY: both nodes add 1 to the float of `x`, which the executable graph keeps.
    unsafe { exec.launch(registry.stream()) }.unwrap();
    registry.stream().synchronize().unwrap();
    assert_eq!(x.to_vec(registry.stream()).unwrap(), [2.0]);

    // Captured with the opt-out, the node takes its own kernel's new arguments.
    let opted_out = pdl.programmatic_without_wait(true);
    let mut exec = capture_pair(&nowait, &opted_out);
    // SAFETY: as above.
    unsafe { exec.set_kernel_args(1, &nowait, &cfg, (&mut x,)) }.unwrap();
}

// ---------------------------------------------------------------------------------------------
// GPU
// ---------------------------------------------------------------------------------------------

/// A fixture cubin of `kernel` for sm_90 on device 0.
fn gpu_fixture(kernel: &str) -> AtlasRegistry {
    let (_, _, cubin) = FIXTURE_CUBINS
        .iter()
        .find(|c| c.0 == kernel && c.1 == 90)
        .expect("a fixture");
    AtlasRegistry::load(0, &[(kernel, cubin)])
        .unwrap_or_else(|e| panic!("loading {kernel}.sm_90.cubin ({NEEDS_GPU}, sm_90): {e}"))
}

/// A PDL chain of the waiting fixture kernels, `pdl_waits` and `pdl_callwait` in turn, each
/// adding 1 to every element it is given (one element per launch, on fresh random data): the
/// result is the CPU's; the kernel without the wait is refused from its cubin and from its
/// PTX, and launches with the opt-out.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_a_chain_of_kernels_that_wait_matches_the_cpu_and_one_that_never_waits_is_refused() {
    let waits = gpu_fixture("pdl_waits");
    let callwait = gpu_fixture("pdl_callwait");
    let nowait = gpu_fixture("pdl_nowait");
    assert_eq!(waits.ctx().raw(), nowait.ctx().raw());
    let stream = CudaStream::new(waits.ctx()).unwrap();
    let f_waits = waits.function_cached("pdl_waits", "pdl_waits").unwrap();
    let f_call = callwait
        .function_cached("pdl_callwait", "pdl_callwait")
        .unwrap();
    let f_never = nowait.function_cached("pdl_nowait", "pdl_nowait").unwrap();
    assert_eq!(
        (
            f_waits.dependency_wait(),
            f_call.dependency_wait(),
            f_never.dependency_wait()
        ),
        (Waits, Waits, NeverWaits)
    );
    let mut rng = Rng::new();
    let start = rng.f32_in(-1000.0, 1000.0).round();
    let steps = 64 + rng.index(64);
    let mut x = DeviceBuffer::from_slice(waits.ctx(), &stream, &[start, f32::NAN]).unwrap();
    let cfg = LaunchConfig::for_elements(1, 32);
    let pdl = LaunchAttributes::new().programmatic_stream_serialization(true);
    for i in 0..steps {
        let f = if i % 2 == 0 { &f_waits } else { &f_call };
        // SAFETY: the kernel adds 1 to the first float of `x`, which outlives the chain.
        unsafe { f.launch_with(&stream, &cfg, &pdl, (&mut x,)) }.unwrap();
    }
    let got = x.to_vec(&stream).unwrap();
    assert_eq!(got[0], start + steps as f32, "the chain of {steps} steps");
    assert!(got[1].is_nan(), "wrote past the first float");

    // SAFETY: as above.
    let e = unsafe { f_never.launch_with(&stream, &cfg, &pdl, (&mut x,)) }.unwrap_err();
    assert_eq!(refusal(e), AttributeRefusal::ProgrammaticWithoutWait);
    let ptx = with_nul(FIXTURE_PTX[1].1);
    let from_ptx = AtlasRegistry::load(0, &[("pdl_nowait", &ptx[..])]).unwrap();
    let f_ptx = from_ptx
        .function_cached("pdl_nowait", "pdl_nowait")
        .unwrap();
    // SAFETY: as above.
    let e = unsafe { f_ptx.launch_with(&stream, &cfg, &pdl, (&mut x,)) }.unwrap_err();
    assert_eq!(refusal(e), AttributeRefusal::ProgrammaticWithoutWait);
    // With the opt-out it launches (after a synchronize, so it has nothing to race with here).
    stream.synchronize().unwrap();
    let opted = pdl.programmatic_without_wait(true);
    // SAFETY: as above.
    unsafe { f_never.launch_with(&stream, &cfg, &opted, (&mut x,)) }.unwrap();
    assert_eq!(x.to_vec(&stream).unwrap()[0], start + steps as f32 + 1.0);
}

/// The `launch` model: `pdl_step`'s PTX (no wait) is refused on the GPU, its sm_90 cubin
/// launches; `cluster_shape`, which reads nothing of its predecessor, overlaps a `pdl_step` with
/// the opt-out and writes what the CPU expects.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_the_launch_model_is_refused_from_ptx_and_the_opt_out_overlaps_a_kernel_that_needs_nothing() {
    let pdl = LaunchAttributes::new().programmatic_stream_serialization(true);
    let ptx = AtlasRegistry::load(0, ptx_for_model("launch").unwrap())
        .unwrap_or_else(|e| panic!("loading the launch model's PTX ({NEEDS_GPU}): {e}"));
    let stream = CudaStream::new(ptx.ctx()).unwrap();
    let step = ptx.function_cached("pdl", "pdl_step").unwrap();
    let mut x = DeviceBuffer::from_slice(ptx.ctx(), &stream, &[1.0f32; 256]).unwrap();
    let cfg = LaunchConfig::for_elements(256, 256);
    // SAFETY: `pdl_step` touches the 256 floats of `x`, which outlives the launches.
    let e = unsafe { step.launch_with(&stream, &cfg, &pdl, (&mut x, 256u32, 2.0f32, 0.0f32)) }
        .unwrap_err();
    assert_eq!(refusal(e), AttributeRefusal::ProgrammaticWithoutWait);

    let sass = AtlasRegistry::load(0, device_cubins("launch")).unwrap();
    let step = sass.function_cached("pdl", "pdl_step").unwrap();
    let shape = sass.function_cached("cluster", "cluster_shape").unwrap();
    assert_eq!(
        (step.dependency_wait(), shape.dependency_wait()),
        (Waits, NeverWaits)
    );
    let blocks = 32u32;
    let mut out = DeviceBuffer::from_slice(
        sass.ctx(),
        &stream,
        &vec![u32::MAX; 2 * blocks as usize + 3],
    )
    .unwrap();
    let grid = LaunchConfig {
        grid: (blocks, 1, 1),
        block: (64, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: `pdl_step` touches the 256 floats of `x`; `cluster_shape` two words per block of
    // `out`, which holds them; both outlive the launches.
    unsafe {
        step.launch_with(&stream, &cfg, &pdl, (&mut x, 256u32, 2.0f32, 0.0f32))
            .unwrap();
        let e = shape
            .launch_with(&stream, &grid, &pdl, (&mut out,))
            .unwrap_err();
        assert_eq!(refusal(e), AttributeRefusal::ProgrammaticWithoutWait);
        shape
            .launch_with(
                &stream,
                &grid,
                &pdl.programmatic_without_wait(true),
                (&mut out,),
            )
            .unwrap();
    }
    let got = out.to_vec(&stream).unwrap();
    for b in 0..blocks as usize {
        // No clusters: every block is rank 0 of its own cluster, cluster index b.
        assert_eq!((got[2 * b], got[2 * b + 1]), (0, b as u32), "block {b}");
    }
    assert!(got[2 * blocks as usize..].iter().all(|&v| v == u32::MAX));
    assert_eq!(x.to_vec(&stream).unwrap(), vec![2.0f32; 256]);
}

/// A graph captured from a plain and a programmatic launch of `pdl_waits` (sm_90 cubins): the
/// driver's edge into the second node is programmatic, so an argument update that puts
/// `pdl_nowait` there is refused, and one on the first node is taken; replays add what the CPU
/// expects to fresh random data.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_an_argument_update_behind_a_programmatic_edge_is_checked() {
    let waits = gpu_fixture("pdl_waits");
    let nowait = gpu_fixture("pdl_nowait");
    let f_waits = waits.function_cached("pdl_waits", "pdl_waits").unwrap();
    let f_never = nowait.function_cached("pdl_nowait", "pdl_nowait").unwrap();
    let mut stream = CudaStream::new(waits.ctx()).unwrap();
    let start = Rng::new().f32_in(-1000.0, 1000.0).round();
    let mut x = DeviceBuffer::from_slice(waits.ctx(), &stream, &[start, f32::NAN]).unwrap();
    let cfg = LaunchConfig::for_elements(1, 32);
    let pdl = LaunchAttributes::new().programmatic_stream_serialization(true);
    let capture = stream.begin_capture().unwrap();
    // SAFETY: captured; each launch adds 1 to the first float of `x`, which the graph keeps.
    unsafe { f_waits.launch(&capture, &cfg, (&mut x,)) }.unwrap();
    // SAFETY: as above.
    unsafe { f_waits.launch_with(&capture, &cfg, &pdl, (&mut x,)) }.unwrap();
    let mut exec = capture.end().unwrap().instantiate().unwrap();
    // SAFETY: refused before the driver.
    let e = unsafe { exec.set_kernel_args(1, &f_never, &cfg, (&mut x,)) }.unwrap_err();
    assert_eq!(refusal(e), AttributeRefusal::ProgrammaticWithoutWait);
    // SAFETY: the node adds 1 to the first float of `x`, which the graph keeps.
    unsafe { exec.set_kernel_args(0, &f_never, &cfg, (&mut x,)) }.unwrap();
    for _ in 0..3 {
        // SAFETY: both nodes add 1 to the first float of `x`, which the graph keeps.
        unsafe { exec.launch(&stream) }.unwrap();
    }
    let got = x.to_vec(&stream).unwrap();
    assert_eq!(got[0], start + 6.0);
    assert!(got[1].is_nan(), "wrote past the first float");
}
