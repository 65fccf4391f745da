//! Kernels that fault: a trap or an out-of-bounds write loses the device's context, and every
//! later call (synchronize, launch, copy, allocation, new stream, module load) is
//! `AtlasError::ContextLost`, saying to restart. Each fault runs in a child process (see
//! `support/child.rs`), since it loses the context for the rest of the process.
//!
//! GPU: `cargo test -p atlas-registry --test sticky_faults -- --include-ignored`.

mod support;

use std::time::Instant;

use atlas_kernels::ptx_for_model;
use atlas_registry::{
    AtlasError, AtlasRegistry, CudaStream, DeviceBuffer, DriverFailure, FaultReport, LaunchConfig,
    device_count,
};
use support::blobs::{NEEDS_GPU, load};
use support::child::{self, Ending};

child::bodies!(trap_then_call_everything, write_far_then_call_everything);

#[test]
fn a_lost_context_error_says_to_restart() {
    let e = AtlasError::ContextLost(
        DriverFailure {
            call: "cuStreamSynchronize",
            subject: String::new(),
            code: 719,
        },
        FaultReport::default(),
    );
    assert!(e.is_context_lost());
    let text = e.to_string();
    assert!(
        text.contains("cuStreamSynchronize failed")
            && text.contains("context")
            && text.contains("restart"),
        "{text}"
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_trapping_kernel_loses_the_context_and_every_next_call_says_restart() {
    assert_sticky_fault_reported(trap_then_call_everything, "trap");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn an_out_of_bounds_write_loses_the_context_and_every_next_call_says_restart() {
    assert_sticky_fault_reported(write_far_then_call_everything, "write_far");
}

/// In a child: `faults::trap`, then one call of each kind.
fn trap_then_call_everything() {
    child_sticky_fault("trap");
}

/// In a child: `faults::write_far`, then one call of each kind.
fn write_far_then_call_everything() {
    child_sticky_fault("write_far");
}

/// Runs a child that launches the faulting kernel `kind` and checks what it printed.
fn assert_sticky_fault_reported<F: Fn()>(body: F, kind: &str) {
    let count = device_count().expect(NEEDS_GPU);
    assert!(count >= 1, "{NEEDS_GPU}: the driver reports no device");
    let started = Instant::now();
    let child = child::run_on(body, None);
    child.print_tail(kind);
    let (stdout, stderr) = (&child.stdout, &child.stderr);
    let report: Vec<_> = stdout.lines().filter(|l| l.starts_with("CHILD ")).collect();
    let report = report.join("\n");
    assert!(
        !stderr.contains("panicked") && !stdout.contains("panicked"),
        "the child panicked:\n{stdout}\n{stderr}"
    );
    assert_eq!(
        child.ending,
        Ending::Passed,
        "child `{kind}` failed:\n{stdout}\n{stderr}"
    );
    assert!(report.contains("CHILD done"), "{report}");
    let sync = stdout
        .lines()
        .find(|l| l.starts_with("CHILD synchronize: "))
        .unwrap_or_else(|| panic!("no synchronize line:\n{stdout}"));
    assert!(
        sync.contains("context") && sync.contains("restart"),
        "the error must say the context is lost and the process must restart: {sync}"
    );
    println!("child `{kind}` finished in {:?}", started.elapsed());
}

/// Launches a kernel that traps or writes out of bounds, then makes one call of each kind and
/// prints what each returned. Every one must be an error saying the context is lost.
fn child_sticky_fault(kind: &str) {
    let demo = load("demo");
    let faults = load("faults");
    let stream = demo.stream();
    let mut x = DeviceBuffer::from_slice(demo.ctx(), stream, &[1.0f32; 256]).expect("upload");
    // A good launch first: it works, and the launch path has read the kernel's parameters, so
    // the launch after the fault reaches cuLaunchKernel.
    let scale = demo
        .function_cached("elementwise", "scale")
        .expect("elementwise::scale");
    // SAFETY: `x` holds 256 floats, all that `scale` touches; it outlives the launch (`to_vec`
    // below synchronizes the stream).
    unsafe {
        scale.launch(
            stream,
            &LaunchConfig::for_elements(256, 256),
            (&mut x, 2.0f32, 256u32),
        )
    }
    .expect("a good launch before the fault");
    assert_eq!(x.to_vec(stream).expect("download"), vec![2.0f32; 256]);
    let one = LaunchConfig::for_elements(1, 1);
    let bad = faults
        .function_cached("faults", kind)
        .expect("faults kernel");
    let launched = if kind == "trap" {
        // SAFETY: trap takes no arguments and touches no memory; it stops the grid on purpose, and
        // this runs in a child process so that only the child's context is lost.
        unsafe { bad.launch(stream, &one, ()) }
    } else {
        // SAFETY: NOT in bounds, on purpose: write_far writes 2^40 floats past `x`, an illegal
        // address that loses the context. That is the case under test, and it runs in a child
        // process so that only the child's context is lost.
        unsafe { bad.launch(stream, &one, (&x,)) }
    };
    // The launch is usually accepted: the fault happens on the device, after it returned.
    println!("CHILD faulting launch: {launched:?}");

    let mut errors: Vec<(&str, AtlasError)> = Vec::new();
    let mut record = |what: &'static str, result: atlas_registry::Result<()>| match result {
        Ok(()) => println!("CHILD {what}: Ok (expected an error)"),
        Err(e) => {
            println!("CHILD {what}: {e}");
            errors.push((what, e));
        }
    };
    record("synchronize", demo.stream_synchronize(demo.stream()));
    record(
        "launch",
        // SAFETY: `x` holds 256 floats, all that `scale` touches, and lives to the end of this
        // function; besides, the context is lost, so the launch is refused and never runs.
        unsafe {
            scale.launch(
                stream,
                &LaunchConfig::for_elements(256, 256),
                (&mut x, 2.0f32, 256u32),
            )
        },
    );
    record("download", x.to_vec(stream).map(drop));
    record(
        "allocate",
        DeviceBuffer::<f32>::alloc(demo.ctx(), 1024).map(drop),
    );
    record("new stream", CudaStream::new(demo.ctx()).map(drop));
    record(
        "load",
        AtlasRegistry::load(0, ptx_for_model("model_a").unwrap()).map(drop),
    );
    assert_eq!(errors.len(), 6, "every call after the fault must fail");
    let mut wrong = Vec::new();
    for (what, e) in &errors {
        if !matches!(e, AtlasError::ContextLost { .. }) || !e.is_context_lost() {
            wrong.push(format!("{what}: {e:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "calls after the fault must be AtlasError::ContextLost:\n{}",
        wrong.join("\n")
    );
    println!("CHILD done");
}
