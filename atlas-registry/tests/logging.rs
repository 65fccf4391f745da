//! What Atlas reports outside a return value goes through the `log` facade: an application's
//! logger receives it as records (level, the module that made it as target, the text); without a
//! logger, only what Atlas has always printed at exit or in a `Drop` (a failed cleanup) goes to
//! stderr, and nothing else.
//!
//! CPU (the stand-in libcuda, in child processes): `cargo test -p atlas-registry --test logging`.

mod support;

use atlas_kernels::ptx_for_model;
use atlas_registry::{AtlasRegistry, CudaStream};
use support::child;
use support::logger;
use support::standin::{self, probe};

child::bodies!(reports_reach_the_logger, reports_without_a_logger);

/// `CUDA_ERROR_INVALID_VALUE`: a failure that is neither a teardown no-op nor a lost context.
const INVALID_VALUE: u32 = 1;

/// What makes Atlas report: a module whose unload fails when its registry is dropped, and a host
/// function that panics.
fn make_reports() {
    let registry = AtlasRegistry::load(0, ptx_for_model("demo").unwrap()).unwrap();
    let stream = CudaStream::new(registry.ctx()).unwrap();
    stream
        .launch_host_func(|| panic!("a host function's own panic"))
        .unwrap();
    stream.synchronize().unwrap();
    probe().inject("cuModuleUnload", INVALID_VALUE, 1);
    drop(stream);
    drop(registry);
}

#[test]
fn reports_are_records_of_the_applications_logger() {
    let child = standin::run(reports_reach_the_logger, &[]);
    assert!(!child.stderr.contains("atlas: "), "{child}");
}

fn reports_reach_the_logger() {
    logger::install();
    make_reports();
    let kept = logger::records();
    let panicked = kept
        .iter()
        .find(|(_, _, text)| text.starts_with("a host function panicked"))
        .unwrap_or_else(|| panic!("no record of the panic: {kept:?}"));
    assert_eq!(panicked.0, log::Level::Error);
    assert!(panicked.1.starts_with("atlas_registry::"), "{panicked:?}");
    assert!(
        panicked.2.ends_with("a host function's own panic"),
        "{panicked:?}"
    );
    let unload = kept
        .iter()
        .find(|(_, _, text)| text.starts_with("unloading a module"))
        .unwrap_or_else(|| panic!("no record of the failed unload: {kept:?}"));
    assert_eq!(unload.0, log::Level::Error);
    assert!(unload.1.starts_with("atlas_registry::"), "{unload:?}");
    assert!(
        unload.2.contains("cuModuleUnload") && unload.2.contains("CUDA_ERROR_INVALID_VALUE"),
        "{unload:?}"
    );
    assert_eq!(kept.len(), 2, "nothing else: {kept:?}");
}

#[test]
fn without_a_logger_only_a_failed_cleanup_is_printed() {
    let child = standin::run(reports_without_a_logger, &[]);
    let atlas_lines: Vec<&str> = child
        .stderr
        .lines()
        .filter(|line| line.starts_with("atlas: "))
        .collect();
    assert_eq!(atlas_lines.len(), 1, "{child}");
    assert!(
        atlas_lines[0].starts_with("atlas: unloading a module: ")
            && atlas_lines[0].contains("cuModuleUnload"),
        "{child}"
    );
    // The panic was printed by Rust's panic hook, not a second time by Atlas.
    assert!(
        child.stderr.contains("a host function's own panic"),
        "{child}"
    );
}

fn reports_without_a_logger() {
    make_reports();
}
