//! The JIT error log: a module load that fails is tried once more with a log buffer, and the
//! `AtlasError::ModuleLoad` carries what the driver wrote there (nothing, when it wrote nothing).
//!
//! Against the stand-in libcuda (`support/standin`), each body in a child process:
//! `cargo test -p atlas-registry --test jit_log`. The stand-in fails to JIT a blob containing
//! `STANDIN_JIT_ERROR` and writes a log when given a buffer; one containing `STANDIN_EARLY_FAIL`
//! fails without writing anything.

mod support;

use atlas_kernels::ptx_for_model;
use atlas_registry::{AtlasError, AtlasRegistry};
use support::child;
use support::standin::{self, probe};

child::bodies!(
    failed_load_is_retried_with_a_log_buffer,
    early_jit_failure_leaves_an_empty_log,
);

fn demo() -> AtlasRegistry {
    AtlasRegistry::load(0, ptx_for_model("demo").unwrap()).unwrap()
}

#[test]
fn a_failed_ptx_load_is_retried_once_with_a_log_buffer_and_the_error_carries_the_log() {
    standin::run(failed_load_is_retried_with_a_log_buffer, &[]);
}

fn failed_load_is_retried_with_a_log_buffer() {
    drop(demo()); // the driver is up; only the load below is counted
    let p = probe();
    p.reset();
    let broken: &[u8] = b".version 8.0\n.target sm_90\n// STANDIN_JIT_ERROR\n";
    let e = AtlasRegistry::load(0, &[("broken", broken)]).unwrap_err();
    assert!(
        matches!(e, AtlasError::ModuleLoad { .. }) && e.cuda_code() == Some(218),
        "{e:?}"
    );
    // Two loads: the first without options (the stand-in writes no log then), the second with
    // the log buffer; the stand-in's log is in the error, under the module's name.
    assert_eq!(
        p.count("cuModuleLoadData") + p.count("cuModuleLoadDataEx"),
        2,
        "one load and one retry"
    );
    assert!(
        p.count("cuModuleLoadDataEx") >= 1,
        "the retry passes options"
    );
    let text = e.to_string();
    assert!(
        text.contains("module `broken`")
            && text.contains("JIT log:\nline 3; error: standin syntax error"),
        "{text}"
    );
    assert_eq!(p.count("live_modules"), 0, "nothing stays loaded");
}

#[test]
fn a_jit_failure_that_writes_no_log_gives_an_empty_log() {
    standin::run(early_jit_failure_leaves_an_empty_log, &[]);
}

fn early_jit_failure_leaves_an_empty_log() {
    drop(demo()); // the driver is up, so only the load below allocates the log buffer
    for _ in 0..4 {
        // Leave freed heap memory full of non-zero bytes where the next buffer of this size goes:
        // a log buffer left uninitialised would read them.
        drop(vec![0xABu8; 16 * 1024]);
        let e = AtlasRegistry::load(
            0,
            &[("broken", b".version 8.0\n// STANDIN_EARLY_FAIL".as_slice())],
        )
        .unwrap_err();
        match e {
            AtlasError::ModuleLoad { ref jit_log, .. } => assert_eq!(jit_log, "", "{e}"),
            other => panic!("expected a ModuleLoad error, got {other}"),
        }
    }
}
