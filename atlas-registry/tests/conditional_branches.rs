//! SWITCH and IF/ELSE conditional nodes (CUDA 12.8+): the branch a kernel picks on the device at
//! each replay runs, none when a SWITCH's value is past its branches, and the graph keeps what
//! every branch launches (the registry and the buffers are gone before the replays). Against the
//! stand-in (CI) and, ignored, on a GPU; the refusals (a driver older than 12.8, a SWITCH of no
//! branches, a foreign handle) against the stand-in.
//!
//! GPU: `cargo test -p atlas-registry --test conditional_branches -- --include-ignored` with
//! `ATLAS_NVRTC_PATH` naming an NVRTC of CUDA 12.3 or newer (`set_branch` is compiled from
//! `kernels/branches.cu` at run time).

mod support;

use atlas_kernels::ptx_for_model;
use atlas_registry::sys::CUdeviceptr;
use atlas_registry::{
    AtlasError, AtlasRegistry, CaptureMisuse, CudaSource, CudaStream, DeviceBuffer, GraphExec,
    GraphFeature, LaunchConfig, Model, copy_to_device_async, copy_to_host_async, release,
};
use support::reference::assert_close;
use support::rng::Rng;
use support::{child, standin};

/// `kernels/branches.cu`: `set_branch(handle, const unsigned* choice)`.
const BRANCHES_SOURCE: &str = include_str!("../../kernels/branches.cu");

/// The stand-in's `branches` module: `set_branch`'s declaration, as NVRTC writes it (the
/// stand-in runs its own model of the kernel, by name).
const BRANCHES_PTX: &str = "
.version 8.0
.target sm_75
.address_size 64
.extern .func cudaGraphSetConditional
(
	.param .b64 cudaGraphSetConditional_param_0,
	.param .b32 cudaGraphSetConditional_param_1
)
;
.visible .entry set_branch(
	.param .u64 set_branch_param_0,
	.param .u64 set_branch_param_1
)
{
	ret;
}
";

const BRANCHES: u32 = 4;

/// The demo model (`elementwise::scale`), the `conditional` model (`set_condition`) and a
/// `branches` module (`set_branch`) from `branches`: PTX or CUDA source.
fn registry_with(branches: Model<'_>) -> AtlasRegistry {
    let model = branches
        .blobs(ptx_for_model("demo").unwrap())
        .blobs(ptx_for_model("conditional").unwrap());
    AtlasRegistry::load_model(0, &model).unwrap()
}

/// Copies `values` to `ptr` on `stream`.
fn upload<T: Copy>(stream: &CudaStream, ptr: CUdeviceptr, values: &[T]) {
    // SAFETY: every caller's `ptr` is memory of `values.len()` elements that the graph keeps; the
    // host values live until `download` synchronizes the stream after it.
    unsafe {
        copy_to_device_async(stream, ptr, values.as_ptr().cast(), size_of_val(values)).unwrap()
    };
}

/// `n` floats read from `ptr` on `stream`, after everything enqueued before.
fn download(stream: &CudaStream, ptr: CUdeviceptr, n: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; n];
    // SAFETY: `ptr` is memory of `n` floats that the graph keeps; `out` is read after the
    // synchronization.
    unsafe { copy_to_host_async(stream, out.as_mut_ptr().cast(), ptr, n * 4).unwrap() };
    stream.synchronize().unwrap();
    out
}

/// A SWITCH of 4 branches, branch `b` scaling its own buffer by `factors[b]`, chosen at each
/// replay by `set_branch` from a word the host changes between replays (every branch, and values
/// past the last, which run none). The functions, the buffers and the registry are gone before
/// the first replay: the graph keeps them. Results against the CPU.
fn switch_runs_the_branch_the_device_picks(registry: AtlasRegistry, rng: &mut Rng) {
    let mut stream = CudaStream::new(registry.ctx()).unwrap();
    let pick = registry.function_cached("branches", "set_branch").unwrap();
    let scale = registry.function_cached("elementwise", "scale").unwrap();
    let n = 1000 + rng.index(3000);
    let factors: Vec<f32> = (0..BRANCHES).map(|_| rng.f32_in(0.5, 2.0)).collect();
    let mut xs: Vec<DeviceBuffer<f32>> = (0..BRANCHES)
        .map(|_| DeviceBuffer::alloc(registry.ctx(), n).unwrap())
        .collect();
    let choice = DeviceBuffer::<u32>::alloc(registry.ctx(), 1).unwrap();
    let (x_ptrs, choice_ptr): (Vec<_>, _) = (
        xs.iter().map(|x| x.device_ptr()).collect(),
        choice.device_ptr(),
    );
    let cfg = LaunchConfig::for_elements(n as u32, 256);

    let mut capture = stream.begin_capture().unwrap();
    // The value starts past the branches: only the kernel's write can pick one.
    let cond = capture.branch_handle(BRANCHES + 1).unwrap();
    // SAFETY: captured, not run: reads the word of `choice` (kept by the graph) and sets `cond`, a
    // handle of this graph, while running in it.
    unsafe { pick.launch(&capture, &LaunchConfig::for_elements(1, 1), (cond, &choice)) }.unwrap();
    let mut captured = Vec::new();
    capture
        .capture_switch(cond, BRANCHES, |branch, body| {
            captured.push(branch);
            let b = branch as usize;
            // SAFETY: captured, not run: touches the `n` floats of `xs[b]`, kept by the graph.
            unsafe { scale.launch(&*body, &cfg, (&mut xs[b], factors[b], n as u32)) }
        })
        .unwrap();
    let graph = capture.end().unwrap();
    assert_eq!(
        captured,
        [0, 1, 2, 3],
        "each branch captured once, in order"
    );
    assert_eq!(
        graph.kept_count(),
        6,
        "the registry, `choice` and every branch's buffer"
    );
    let exec = graph.instantiate().unwrap();
    drop((pick, scale, xs, choice));
    let e = release(registry).unwrap_err();
    assert!(matches!(e, AtlasError::InUse { handles: 1, .. }), "{e}");

    let mut choices: Vec<u32> = vec![0, 1, 2, 3, BRANCHES, 7, u32::MAX];
    choices.extend((0..4).map(|_| rng.below(u64::from(BRANCHES) + 2) as u32));
    for (round, &chosen) in choices.iter().enumerate() {
        replay_switch(
            &stream,
            &exec,
            (&x_ptrs, choice_ptr),
            (chosen, &factors),
            n,
            rng,
            round,
        );
    }
}

/// One replay of the SWITCH graph with `chosen` as its choice: fresh data in every buffer, and
/// only the chosen one scaled.
fn replay_switch(
    stream: &CudaStream,
    exec: &GraphExec,
    (x_ptrs, choice_ptr): (&[CUdeviceptr], CUdeviceptr),
    (chosen, factors): (u32, &[f32]),
    n: usize,
    rng: &mut Rng,
    round: usize,
) {
    let inputs: Vec<Vec<f32>> = x_ptrs.iter().map(|_| rng.f32s(n, -10.0, 10.0)).collect();
    for (&ptr, input) in x_ptrs.iter().zip(&inputs) {
        upload(stream, ptr, input);
    }
    let word = [chosen];
    upload(stream, choice_ptr, &word);
    // SAFETY: the graph reaches the buffers and the word it keeps, nothing else.
    unsafe { exec.launch(stream) }.unwrap();
    for (b, (&ptr, input)) in x_ptrs.iter().zip(&inputs).enumerate() {
        let want: Vec<f32> = if b as u32 == chosen {
            input.iter().map(|v| v * factors[b]).collect()
        } else {
            input.clone()
        };
        let what = format!("round {round}: choice {chosen}, buffer {b}");
        assert_close(&download(stream, ptr, n), &want, 1e-6, &what);
    }
}

/// An IF/ELSE node: `set_condition` sets it from a flag the host changes between replays; the
/// THEN branch scales `x`, the ELSE branch `y`. The functions, the buffers and the registry are
/// gone before the first replay. Results against the CPU.
fn if_else_runs_one_branch_or_the_other(registry: AtlasRegistry, rng: &mut Rng) {
    let mut stream = CudaStream::new(registry.ctx()).unwrap();
    let set = registry
        .function_cached("conditional", "set_condition")
        .unwrap();
    let scale = registry.function_cached("elementwise", "scale").unwrap();
    let n = 1000 + rng.index(3000);
    let (a, b) = (rng.f32_in(1.5, 3.0), rng.f32_in(0.2, 0.8));
    let mut x = DeviceBuffer::<f32>::alloc(registry.ctx(), n).unwrap();
    let mut y = DeviceBuffer::<f32>::alloc(registry.ctx(), n).unwrap();
    let flag = DeviceBuffer::<i32>::alloc(registry.ctx(), 1).unwrap();
    let (x_ptr, y_ptr, flag_ptr) = (x.device_ptr(), y.device_ptr(), flag.device_ptr());
    let cfg = LaunchConfig::for_elements(n as u32, 256);

    let mut capture = stream.begin_capture().unwrap();
    // The value starts at 1: only the kernel's write can pick the ELSE branch.
    let cond = capture.conditional_handle(true).unwrap();
    // SAFETY: captured, not run: reads the int of `flag` (kept by the graph) and sets `cond`, a
    // handle of this graph, while running in it.
    unsafe { set.launch(&capture, &LaunchConfig::for_elements(1, 1), (cond, &flag)) }.unwrap();
    capture
        .capture_if_else(
            cond,
            // SAFETY: captured, not run: touches the `n` floats of `x`, kept by the graph.
            |then| unsafe { scale.launch(&*then, &cfg, (&mut x, a, n as u32)) },
            // SAFETY: as above, for `y`.
            |otherwise| unsafe { scale.launch(&*otherwise, &cfg, (&mut y, b, n as u32)) },
        )
        .unwrap();
    let graph = capture.end().unwrap();
    assert_eq!(graph.kept_count(), 4, "the registry, `flag`, `x` and `y`");
    let exec = graph.instantiate().unwrap();
    drop((set, scale, x, y, flag));
    let e = release(registry).unwrap_err();
    assert!(matches!(e, AtlasError::InUse { handles: 1, .. }), "{e}");

    let mut flags = vec![1, 0, i32::MIN, 0, -1];
    flags.extend((0..4).map(|_| {
        if rng.chance(50) {
            0
        } else {
            1 + rng.below(99) as i32
        }
    }));
    for (round, &value) in flags.iter().enumerate() {
        let (xs, ys) = (rng.f32s(n, -10.0, 10.0), rng.f32s(n, -10.0, 10.0));
        upload(&stream, x_ptr, &xs);
        upload(&stream, y_ptr, &ys);
        let word = [value];
        upload(&stream, flag_ptr, &word);
        // SAFETY: the graph reaches the buffers it keeps, nothing else.
        unsafe { exec.launch(&stream) }.unwrap();
        let (want_x, want_y): (Vec<f32>, Vec<f32>) = if value != 0 {
            (xs.iter().map(|v| v * a).collect(), ys.clone())
        } else {
            (xs.clone(), ys.iter().map(|v| v * b).collect())
        };
        let what = format!("round {round}: flag {value}");
        assert_close(&download(&stream, x_ptr, n), &want_x, 1e-6, &what);
        assert_close(&download(&stream, y_ptr, n), &want_y, 1e-6, &what);
    }
}

// Stand-in (no GPU).

child::bodies!(
    standin_switch_default,
    standin_switch,
    standin_if_else,
    refusals_of_an_older_driver,
    misuse_adds_no_node
);

fn standin_registry() -> AtlasRegistry {
    registry_with(Model::new().blobs(&[("branches", BRANCHES_PTX.as_bytes())]))
}

#[test]
fn a_switch_runs_the_branch_its_kernel_picks_and_keeps_every_branchs_buffers() {
    standin::run(standin_switch, &[]);
}

fn standin_switch() {
    switch_runs_the_branch_the_device_picks(standin_registry(), &mut Rng::new());
    assert_eq!(standin::probe().count("stale_handle"), 0);
}

#[test]
fn without_a_kernel_setting_it_a_switch_runs_the_branch_its_handle_starts_at() {
    standin::run(standin_switch_default, &[]);
}

fn standin_switch_default() {
    let registry = standin_registry();
    let mut stream = CudaStream::new(registry.ctx()).unwrap();
    let scale = registry.function_cached("elementwise", "scale").unwrap();
    let mut xs: Vec<DeviceBuffer<f32>> = (0..3)
        .map(|_| DeviceBuffer::from_slice(registry.ctx(), &stream, &[1.0f32; 8]).unwrap())
        .collect();
    let cfg = LaunchConfig::for_elements(8, 8);
    for (initial, want) in [
        (2u32, [1.0, 1.0, 5.0]),
        (0, [3.0, 1.0, 5.0]),
        (3, [3.0, 1.0, 5.0]),
    ] {
        let mut capture = stream.begin_capture().unwrap();
        let cond = capture.branch_handle(initial).unwrap();
        capture
            .capture_switch(cond, 3, |branch, body| {
                let factor = [3.0f32, 4.0, 5.0][branch as usize];
                // SAFETY: captured, not run: touches the 8 floats of its buffer, which the graph
                // keeps.
                unsafe { scale.launch(&*body, &cfg, (&mut xs[branch as usize], factor, 8u32)) }
            })
            .unwrap();
        let exec = capture.end().unwrap().instantiate().unwrap();
        // SAFETY: the graph reaches the buffers it keeps.
        unsafe { exec.launch(&stream) }.unwrap();
        let got: Vec<f32> = xs.iter().map(|x| x.to_vec(&stream).unwrap()[7]).collect();
        assert_eq!(got, want, "a handle starting at {initial}");
    }
}

#[test]
fn an_if_else_runs_then_or_else_as_its_kernel_says_and_keeps_both_branches_buffers() {
    standin::run(standin_if_else, &[]);
}

fn standin_if_else() {
    if_else_runs_one_branch_or_the_other(standin_registry(), &mut Rng::new());
    assert_eq!(standin::probe().count("stale_handle"), 0);
}

#[test]
fn a_driver_older_than_12_8_refuses_switch_and_else_naming_both_releases() {
    standin::run(
        refusals_of_an_older_driver,
        &["-DSTANDIN_DRIVER_VERSION=12070"],
    );
}

fn refusals_of_an_older_driver() {
    let registry = standin_registry();
    let mut stream = CudaStream::new(registry.ctx()).unwrap();
    let mut capture = stream.begin_capture().unwrap();
    // Handles and IF nodes are CUDA 12.3's: they work.
    let cond = capture.conditional_handle(true).unwrap();
    capture.capture_if(cond, |_| Ok(())).unwrap();
    let added = standin::probe().count("cuGraphAddNode_v2");
    let mut called = false;
    let switch = capture
        .capture_switch(cond, 3, |_, _| {
            called = true;
            Ok(())
        })
        .unwrap_err();
    let if_else = capture
        .capture_if_else(cond, |_| Ok(()), |_| Ok(()))
        .unwrap_err();
    for (err, feature) in [
        (&switch, GraphFeature::Switch),
        (&if_else, GraphFeature::IfElse),
    ] {
        match err {
            AtlasError::GraphFeatureTooOld {
                feature: f,
                needs,
                driver,
            } => assert_eq!((*f, *needs, *driver), (feature, (12, 8), (12, 7))),
            other => panic!("{feature}: {other}"),
        }
        let text = err.to_string();
        assert!(text.contains("12.8") && text.contains("12.7"), "{text}");
    }
    assert!(!called, "no branch is captured");
    assert_eq!(
        standin::probe().count("cuGraphAddNode_v2"),
        added,
        "nothing reached the driver"
    );
    // The capture goes on.
    let exec = capture.end().unwrap().instantiate().unwrap();
    // SAFETY: the graph launches nothing.
    unsafe { exec.launch(&stream) }.unwrap();
}

#[test]
fn an_empty_switch_a_foreign_handle_and_a_failing_branch_are_refused() {
    standin::run(misuse_adds_no_node, &[]);
}

fn misuse_adds_no_node() {
    let registry = standin_registry();
    let mut stream = CudaStream::new(registry.ctx()).unwrap();
    let mut capture = stream.begin_capture().unwrap();
    let foreign = capture.conditional_handle(false).unwrap();
    drop(capture.end().unwrap());

    let mut capture = stream.begin_capture().unwrap();
    let cond = capture.conditional_handle(false).unwrap();
    let added = standin::probe().count("cuGraphAddNode_v2");
    let empty = capture.capture_switch(cond, 0, |_, _| Ok(())).unwrap_err();
    assert!(
        matches!(empty, AtlasError::Capture(CaptureMisuse::EmptySwitch)),
        "{empty}"
    );
    let err = capture
        .capture_switch(foreign, 2, |_, _| Ok(()))
        .unwrap_err();
    assert!(
        matches!(
            err,
            AtlasError::Capture(CaptureMisuse::ForeignConditionalHandle)
        ),
        "{err}"
    );
    let err = capture
        .capture_if_else(foreign, |_| Ok(()), |_| Ok(()))
        .unwrap_err();
    assert!(
        matches!(
            err,
            AtlasError::Capture(CaptureMisuse::ForeignConditionalHandle)
        ),
        "{err}"
    );
    assert_eq!(standin::probe().count("cuGraphAddNode_v2"), added);

    // A branch's error ends the capture of the branches: the later ones are not called.
    let mut called = Vec::new();
    let err = capture
        .capture_switch(cond, 3, |branch, _| {
            called.push(branch);
            if branch == 1 {
                Err(AtlasError::Capture(CaptureMisuse::EmptySwitch))
            } else {
                Ok(())
            }
        })
        .unwrap_err();
    assert!(
        matches!(err, AtlasError::Capture(CaptureMisuse::EmptySwitch)),
        "{err}"
    );
    assert_eq!(called, [0, 1]);
    let mut otherwise_called = false;
    let err = capture
        .capture_if_else(
            cond,
            |_| Err(AtlasError::Capture(CaptureMisuse::NotCapturing)),
            |_| {
                otherwise_called = true;
                Ok(())
            },
        )
        .unwrap_err();
    assert!(
        matches!(err, AtlasError::Capture(CaptureMisuse::NotCapturing)),
        "{err}"
    );
    assert!(!otherwise_called);
    // The bodies' captures ended: the capture itself ends.
    drop(capture.end().unwrap());
}

// GPU.

/// The registry of the GPU tests: `branches.cu` compiled with the NVRTC found (CUDA 12.3+).
fn gpu_registry() -> AtlasRegistry {
    registry_with(Model::new().source(
        "branches",
        CudaSource::new("branches.cu", BRANCHES_SOURCE).option("-std=c++17"),
    ))
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_a_switch_runs_the_branch_its_kernel_picks_after_its_buffers_and_registry_are_gone() {
    let mut rng = Rng::new();
    switch_runs_the_branch_the_device_picks(gpu_registry(), &mut rng);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_an_if_else_runs_then_or_else_after_its_buffers_and_registry_are_gone() {
    let mut rng = Rng::new();
    if_else_runs_one_branch_or_the_other(gpu_registry(), &mut rng);
}
