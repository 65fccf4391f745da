//! Teardown and release: process exit with registries, buffers and streams still alive prints
//! nothing; `release` unloads now and returns what went wrong as a value: `InUse` (unloading
//! nothing) while other handles live, `Ok` for the driver's teardown codes (4, 201, 709) without a
//! word on stderr, `AtlasError::Release` for any other unload failure.
//!
//! The stand-in tests run in CI (`cargo test -p atlas-registry --test teardown`), each in a child
//! process; the GPU tests (`-- --include-ignored`) exit real processes with live registries.

mod support;

use std::cell::RefCell;
use std::sync::{OnceLock, mpsc};

use atlas_kernels::ptx_for_model;
use atlas_registry::{
    AtlasError, AtlasRegistry, CudaStream, DeviceBuffer, LaunchConfig, device_count, release,
};
use support::blobs::{NEEDS_GPU, load};
use support::child::{self, Ending};
use support::reference::{scale_and_check, transform_and_check};
use support::rng::Rng;
use support::standin::{self, probe};

child::bodies!(
    leave_everything_live_and_return,
    leave_everything_live_and_exit,
    release_in_use_unloads_nothing,
    release_takes_teardown_codes_as_done,
    drop_takes_teardown_codes_as_done,
    release_returns_other_unload_failures,
    drop_reports_other_unload_failures,
);

// ---------------------------------------------------------------------------------------------
// Process exit with live registries (GPU, child processes)
// ---------------------------------------------------------------------------------------------

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn exit_with_registries_in_statics_and_thread_locals_prints_nothing() {
    assert!(device_count().expect(NEEDS_GPU) >= 1, "{NEEDS_GPU}");
    assert_quiet_exit(leave_everything_live_and_return, "teardown");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn process_exit_from_a_test_with_live_registries_prints_nothing() {
    assert!(device_count().expect(NEEDS_GPU) >= 1, "{NEEDS_GPU}");
    assert_quiet_exit(leave_everything_live_and_exit, "teardown_exit");
}

static STATIC_REGISTRY: OnceLock<AtlasRegistry> = OnceLock::new();
static STATIC_BUFFER: OnceLock<DeviceBuffer<f32>> = OnceLock::new();

/// What a thread keeps in its thread-local slot: a registry, a buffer and a stream it created.
type Held = (AtlasRegistry, DeviceBuffer<f32>, CudaStream);

thread_local! {
    static THREAD_HELD: RefCell<Option<Held>> = const { RefCell::new(None) };
}

/// Fills `THREAD_HELD` of the calling thread with `model` and checks that it launches.
fn hold_in_thread_local(model: &str, rng: &mut Rng) {
    let registry = load(model);
    transform_and_check(&registry, model, rng);
    let buffer =
        DeviceBuffer::from_slice(registry.ctx(), registry.stream(), &rng.f32s(100, 0.0, 1.0))
            .expect("upload");
    let stream = CudaStream::new(registry.ctx()).expect("a stream");
    THREAD_HELD.with(|slot| *slot.borrow_mut() = Some((registry, buffer, stream)));
}

/// In a child: leaves everything live (see [`child_teardown`]) and returns to the harness.
fn leave_everything_live_and_return() {
    child_teardown(false);
}

/// In a child: leaves everything live (see [`child_teardown`]) and calls `std::process::exit`.
fn leave_everything_live_and_exit() {
    child_teardown(true);
}

/// Leaves registries, buffers and streams in statics (never dropped), in this thread's
/// thread-locals, in the thread-locals of a thread that ended, and of one still running at exit;
/// then exits, by returning to the harness or by `std::process::exit`.
fn child_teardown(exit_now: bool) {
    let mut rng = Rng::new();
    let registry = STATIC_REGISTRY.get_or_init(|| load("demo"));
    scale_and_check(registry, &mut rng);
    STATIC_BUFFER.get_or_init(|| {
        DeviceBuffer::from_slice(registry.ctx(), registry.stream(), &[3.0f32; 1000])
            .expect("upload")
    });
    hold_in_thread_local("model_a", &mut rng);

    let mut ended = rng.fork();
    std::thread::spawn(move || hold_in_thread_local("model_b", &mut ended))
        .join()
        .expect("a thread that ends");

    let (ready, wait) = mpsc::channel();
    let mut running = rng.fork();
    std::thread::spawn(move || {
        hold_in_thread_local("model_a", &mut running);
        ready.send(()).expect("tell the main thread");
        loop {
            std::thread::park();
        }
    });
    wait.recv().expect("the running thread is ready");
    registry
        .stream_synchronize(registry.stream())
        .expect("synchronize");
    println!("CHILD teardown ready, exit_now={exit_now}");
    if exit_now {
        std::process::exit(0);
    }
}

/// Asserts that a child ran to its end, did not panic, and that Atlas printed nothing.
fn assert_quiet_exit<F: Fn()>(body: F, task: &str) {
    let child = child::run_on(body, None);
    child.print_tail(task);
    let (stdout, stderr) = (&child.stdout, &child.stderr);
    assert_eq!(
        child.ending,
        Ending::Passed,
        "child `{task}` failed:\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("CHILD teardown ready"),
        "child `{task}` did not get to its end:\n{stdout}\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    let atlas_lines = child.atlas_lines();
    assert!(
        atlas_lines.is_empty(),
        "Atlas printed at exit:\n{}",
        atlas_lines.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// release
// ---------------------------------------------------------------------------------------------

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn release_returns_errors_as_values_and_unloads_nothing_while_in_use() {
    let mut rng = Rng::new();
    let registry = load("demo");
    let clone = registry.clone();
    let function = registry.function("elementwise", "scale").expect("scale");
    match release(registry) {
        Err(AtlasError::InUse { handles, what }) => {
            assert_eq!(handles, 2, "the clone and the function");
            assert!(what.contains("elementwise"), "{what}");
        }
        other => panic!("expected InUse, got {other:?}"),
    }
    // Nothing was unloaded: the function and the clone still launch.
    let stream = clone.stream();
    let input = rng.f32s(777, -5.0, 5.0);
    let mut x = DeviceBuffer::from_slice(clone.ctx(), stream, &input).expect("upload");
    // SAFETY: `x` holds 777 floats, all that `scale` touches; it outlives the launch (`to_vec`
    // below synchronizes the stream).
    unsafe {
        function.launch(
            stream,
            &LaunchConfig::for_elements(777, 128),
            (&mut x, -2.0f32, 777u32),
        )
    }
    .expect("launch through the function");
    let out = x.to_vec(stream).expect("download");
    for (i, (&got, &was)) in out.iter().zip(&input).enumerate() {
        assert_eq!(got.to_bits(), (was * -2.0).to_bits(), "element {i}");
    }
    scale_and_check(&clone, &mut rng);

    // The function still holds it.
    let second = clone.clone();
    match release(second) {
        Err(AtlasError::InUse { handles: 2, .. }) => {}
        other => panic!("expected InUse with 2 handles, got {other:?}"),
    }
    drop(function);
    assert!(
        matches!(release(clone), Ok(())),
        "a clean release is Ok(())"
    );

    // Released and reloaded, over and over: each one Ok.
    for _ in 0..5 {
        let r = load("demo");
        scale_and_check(&r, &mut rng);
        release(r).expect("a clean release");
    }
}

// ---------------------------------------------------------------------------------------------
// release and drop against the stand-in (CI)
// ---------------------------------------------------------------------------------------------

/// The demo model on device 0, and how many modules it loaded.
fn demo() -> (AtlasRegistry, u64) {
    let registry = AtlasRegistry::load(0, ptx_for_model("demo").unwrap()).unwrap();
    let modules = registry.module_names().count() as u64;
    assert!(modules >= 2, "the demo model has several modules");
    (registry, modules)
}

/// The unload failures a driver gives while it or the context is being torn down.
const TEARDOWN_CODES: [u32; 3] = [4, 201, 709];

/// Runs `body` on the stand-in; it must pass, and nothing may appear on stderr (no `atlas:` line,
/// no complaint of the stand-in about a handle used after its unload).
fn run_quietly<F: Fn()>(body: F) {
    let child = standin::run(body, &[]);
    assert!(child.stderr.trim().is_empty(), "stderr: {child}");
}

#[test]
fn release_while_a_function_or_a_clone_lives_is_in_use_and_unloads_nothing() {
    run_quietly(release_in_use_unloads_nothing);
}

fn release_in_use_unloads_nothing() {
    let p = probe();
    let (registry, modules) = demo();
    let live = p.count("live_modules");
    let in_use = |e: AtlasError, handles: usize| {
        assert!(
            matches!(e, AtlasError::InUse { handles: h, .. } if h == handles),
            "expected InUse with {handles} handle(s), got {e:?}"
        );
        let text = e.to_string();
        assert!(
            text.contains(&format!("{handles} other handle(s)"))
                && text.contains("nothing was unloaded")
                && text.contains("elementwise"),
            "{text}"
        );
        assert_eq!(p.count("cuModuleUnload"), 0, "a module was unloaded");
        assert_eq!(p.count("live_modules"), live);
    };

    // A clone and a function: two other handles.
    let clone = registry.clone();
    let function = registry.function("elementwise", "scale").unwrap();
    in_use(release(registry).unwrap_err(), 2);
    // Nothing was unloaded: the function still launches, through the clone's stream.
    let stream = clone.stream();
    let mut x = DeviceBuffer::from_slice(clone.ctx(), stream, &[1.5f32; 100]).unwrap();
    // SAFETY: `x` holds 100 floats, all that `scale` touches; `to_vec` below waits for the launch.
    unsafe {
        function.launch(
            stream,
            &LaunchConfig::for_elements(100, 64),
            (&mut x, -2.0f32, 100u32),
        )
    }
    .unwrap();
    assert_eq!(x.to_vec(stream).unwrap(), vec![-3.0f32; 100]);

    // A clone alone.
    drop(function);
    in_use(release(clone.clone()).unwrap_err(), 1);
    // A function alone.
    let function = clone.function("noop", "noop").unwrap();
    in_use(release(clone).unwrap_err(), 1);
    // The last handle going unloads every module, once.
    drop(function);
    assert_eq!(p.count("cuModuleUnload"), modules);
    assert_eq!(p.count("live_modules"), live - modules);
    assert_eq!(p.count("stale_handle"), 0);
}

#[test]
fn release_takes_unload_failures_of_teardown_as_done_and_prints_nothing() {
    run_quietly(release_takes_teardown_codes_as_done);
}

fn release_takes_teardown_codes_as_done() {
    let p = probe();
    for code in TEARDOWN_CODES {
        let (registry, modules) = demo();
        p.reset();
        p.inject("cuModuleUnload", code, modules as u32);
        release(registry).unwrap_or_else(|e| panic!("unloads answered {code}: {e:?}"));
        assert_eq!(
            p.count("cuModuleUnload"),
            modules,
            "every module's unload was tried once (code {code})"
        );
    }
}

#[test]
fn dropping_a_registry_takes_unload_failures_of_teardown_as_done_and_prints_nothing() {
    run_quietly(drop_takes_teardown_codes_as_done);
}

fn drop_takes_teardown_codes_as_done() {
    let p = probe();
    for code in TEARDOWN_CODES {
        let (registry, modules) = demo();
        p.reset();
        p.inject("cuModuleUnload", code, modules as u32);
        drop(registry);
        assert_eq!(p.count("cuModuleUnload"), modules, "code {code}");
    }
}

#[test]
fn release_returns_other_unload_failures_in_a_release_error() {
    run_quietly(release_returns_other_unload_failures);
}

fn release_returns_other_unload_failures() {
    let p = probe();
    for (code, failing) in [(999u32, 1u64), (1, 2)] {
        let (registry, modules) = demo();
        let live = p.count("live_modules");
        p.reset();
        p.inject("cuModuleUnload", code, failing as u32);
        let e = release(registry).unwrap_err();
        assert!(
            matches!(&e, AtlasError::Release(failures) if failures.len() as u64 == failing),
            "{failing} unload(s) failing with {code}: {e:?}"
        );
        let text = e.to_string();
        assert!(
            text.contains("cuModuleUnload") && text.contains(&format!("({code})")),
            "{text}"
        );
        // The others were unloaded all the same; the failed ones are still loaded.
        assert_eq!(p.count("cuModuleUnload"), modules);
        assert_eq!(p.count("live_modules"), live - (modules - failing));
    }
}

#[test]
fn dropping_a_registry_reports_other_unload_failures_on_stderr() {
    let child = standin::run(drop_reports_other_unload_failures, &[]);
    let lines = child.atlas_lines();
    assert_eq!(lines.len(), 1, "one failed unload, one line: {child}");
    assert!(
        lines[0].contains("unloading a module")
            && lines[0].contains("cuModuleUnload")
            && lines[0].contains("(999)"),
        "{child}"
    );
}

/// The counterpart of [`drop_takes_teardown_codes_as_done`]: with nobody to return it to, an
/// unload failure that is not teardown goes to stderr (so "prints nothing" there means something).
fn drop_reports_other_unload_failures() {
    let (registry, _) = demo();
    probe().inject("cuModuleUnload", 999, 1);
    drop(registry);
}
