//! Reliability: what Atlas does with bad blobs and names, bad launches, kernels that fault, process
//! exit with live registries, explicit release, many threads at once, long load/unload soaks, and
//! two devices. `RELIABILITY.md` at the repository root lists every case and its test.
//!
//! The tests without `#[ignore]` need no GPU and run everywhere:
//! `cargo test -p atlas-registry --test reliability`. Those marked
//! `#[ignore = "needs an NVIDIA GPU"]` fail without one; run them on a GPU machine with
//! `cargo test -p atlas-registry --test reliability -- --include-ignored --test-threads=1`.
//!
//! GPU tests work on fresh random data (the seed is printed; `RELIABILITY_SEED=N` repeats a run),
//! poison outputs before launching, and compare bit for bit with a CPU reference. Cases that would
//! kill or taint the test process (a trapping kernel, process exit) run in a child process: this
//! same binary, re-executed on the helper test `child_process` with `ATLAS_RELIABILITY_CHILD` set.

use std::cell::RefCell;
use std::io::Read;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{OnceLock, mpsc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use atlas_kernels::{ELEMENTWISE_FATBIN, cubin_for_model, ptx_for_model};
use atlas_registry::{
    AtlasError, AtlasRegistry, BlobKind, CudaStream, DeviceBuffer, DeviceLimits, FunctionCache,
    LaunchConfig, NotFoundKind, device_count, host, release, sniff,
};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

// ---------------------------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------------------------

/// What a GPU test says when it cannot get what it needs.
const NEEDS_GPU: &str = "this test needs an NVIDIA GPU and its driver";

/// xorshift64*: a tiny PRNG, seeded from the clock so every run sees fresh data.
struct Rng(u64);

impl Rng {
    /// A generator for `test`, seeded from `RELIABILITY_SEED` or the clock; prints the seed.
    fn new(test: &str) -> Self {
        let seed = std::env::var("RELIABILITY_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0x9E37_79B9_7F4A_7C15, |d| d.as_nanos() as u64)
            });
        println!("{test}: seed {seed} (RELIABILITY_SEED={seed} repeats this run)");
        Self::from_seed(seed)
    }

    fn from_seed(seed: u64) -> Self {
        // xorshift must not start at 0.
        Self(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }

    /// A generator for another thread, seeded from this one.
    fn fork(&mut self) -> Self {
        Self::from_seed(self.next_u64())
    }

    fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Uniform in `[lo, hi)`.
    fn f32_in(&mut self, lo: f32, hi: f32) -> f32 {
        let unit = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * unit
    }

    fn f32s(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.f32_in(lo, hi)).collect()
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

/// Loads `model`'s PTX modules on device 0; panics (failing the test) without a GPU.
fn load(model: &str) -> AtlasRegistry {
    AtlasRegistry::load(0, ptx_for_model(model).expect("a model of atlas-kernels"))
        .unwrap_or_else(|e| panic!("loading model `{model}` on device 0 ({NEEDS_GPU}): {e}"))
}

/// The blob of module `module` of `model`.
fn blob_of(blobs: &'static [(&'static str, &'static [u8])], module: &str) -> &'static [u8] {
    blobs
        .iter()
        .find(|(name, _)| *name == module)
        .map(|(_, blob)| *blob)
        .unwrap_or_else(|| panic!("no module `{module}`"))
}

/// Runs `elementwise::scale` of `registry` on fresh random data and checks every element against
/// the CPU, and that nothing past `n` (poisoned with NaN) was written.
fn scale_and_check(registry: &AtlasRegistry, rng: &mut Rng) {
    let stream = registry.stream();
    let n = 1000 + rng.below(4000);
    let input = rng.f32s(n, -1000.0, 1000.0);
    let factor = rng.f32_in(1.5, 4.0);
    let mut poisoned = input.clone();
    poisoned.extend(std::iter::repeat_n(f32::NAN, 61));
    let mut x = DeviceBuffer::from_slice(registry.ctx(), stream, &poisoned).expect("upload");
    let scale = registry
        .function_cached("elementwise", "scale")
        .expect("elementwise::scale");
    // SAFETY: `x` holds `n` floats and 61 NaNs after them; `scale` touches the first `n`. It
    // outlives the launch (`to_vec` below synchronizes the stream).
    unsafe {
        scale.launch(
            stream,
            &LaunchConfig::for_elements(n as u32, 256),
            (&mut x, factor, n as u32),
        )
    }
    .expect("launch elementwise::scale");
    let out = x.to_vec(stream).expect("download");
    for (i, (&got, &given)) in out.iter().zip(&input).enumerate() {
        let want = given * factor;
        assert_eq!(
            got.to_bits(),
            want.to_bits(),
            "element {i}: {given} * {factor} = {want}, the GPU says {got}"
        );
    }
    assert!(
        out[n..].iter().all(|v| v.is_nan()),
        "scale wrote past its {n} elements"
    );
}

/// `model`'s `transform` (model_a: `x * 2 + 1`, model_b: `x * -3 + 0.5`) on the CPU.
fn transform_reference(model: &str, x: f32) -> f32 {
    match model {
        "model_a" => x.mul_add(2.0, 1.0),
        "model_b" => x.mul_add(-3.0, 0.5),
        other => panic!("no reference for {other}"),
    }
}

/// Runs `model::transform` of `registry` (loaded from `model`) on fresh data into a NaN-poisoned
/// output and checks it against the CPU: a kernel of another model would give other numbers.
fn transform_and_check(registry: &AtlasRegistry, model: &str, rng: &mut Rng) {
    static TRANSFORM: FunctionCache = FunctionCache::new("model", "transform");
    let stream = registry.stream();
    let n = 64 + rng.below(512);
    let input = rng.f32s(n, -100.0, 100.0);
    let x = DeviceBuffer::from_slice(registry.ctx(), stream, &input).expect("upload");
    let mut out =
        DeviceBuffer::from_slice(registry.ctx(), stream, &vec![f32::NAN; n]).expect("poison");
    // SAFETY: `x` and `out` each hold `n` floats, all that transform reads and writes; both
    // outlive the launch (`to_vec` below synchronizes the stream).
    unsafe {
        TRANSFORM.get(registry).expect("model::transform").launch(
            stream,
            &LaunchConfig::for_elements(n as u32, 128),
            (&x, &mut out, n as u32),
        )
    }
    .expect("launch model::transform");
    let got = out.to_vec(stream).expect("download");
    for (i, (&g, &x)) in got.iter().zip(&input).enumerate() {
        let want = transform_reference(model, x);
        assert_eq!(g.to_bits(), want.to_bits(), "{model} element {i}: {x}");
    }
}

/// The resident set size of this process, from `/proc/self/status`.
fn rss_bytes() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kib: usize = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("a VmRSS line");
    kib * 1024
}

/// Free device memory of `registry`'s device (`cuMemGetInfo_v2`, its context bound first).
fn device_free_bytes(registry: &AtlasRegistry) -> usize {
    registry.ctx().bind().expect("bind the context");
    let cuda = atlas_registry::sys::driver().expect("the driver");
    let get_info =
        atlas_registry::sys::entry!(cuda, cuMemGetInfo_v2).expect("cuMemGetInfo_v2 exported");
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: both out-pointers are live locals; the registry's context is current on this thread
    // (bound just above).
    let status = unsafe { get_info(&mut free, &mut total) };
    assert_eq!(
        status,
        atlas_registry::sys::CUresult::CUDA_SUCCESS,
        "cuMemGetInfo_v2"
    );
    free
}

/// Sets its flag when dropped, so that a helper thread stops even when the test panics.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

// ---------------------------------------------------------------------------------------------
// Child processes
// ---------------------------------------------------------------------------------------------

/// The variable that tells `child_process` what to do.
const CHILD_VAR: &str = "ATLAS_RELIABILITY_CHILD";
/// The longest a child may run before it counts as hung.
const CHILD_DEADLINE: Duration = Duration::from_secs(90);

/// Re-executes this test binary on `child_process` with `task`; returns its exit status, stdout
/// and stderr. A child that outlives [`CHILD_DEADLINE`] is killed and the test fails as hung.
fn run_child(task: &str) -> (ExitStatus, String, String) {
    let mut child = Command::new(std::env::current_exe().expect("the test binary's path"))
        .args([
            "child_process",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_VAR, task)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the child process");
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let stdout = drain(Box::new(child.stdout.take().expect("piped stdout")));
    let stderr = drain(Box::new(child.stderr.take().expect("piped stderr")));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            break status;
        }
        if started.elapsed() > CHILD_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "child `{task}` hung: killed after {CHILD_DEADLINE:?}\nstdout:\n{}\nstderr:\n{}",
                stdout.join().unwrap_or_default(),
                stderr.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (stdout, stderr) = (
        stdout.join().unwrap_or_default(),
        stderr.join().unwrap_or_default(),
    );
    println!(
        "child `{task}`: {status}\nstdout (end):\n{}\nstderr (end):\n{}",
        tail(&stdout, 60),
        tail(&stderr, 60)
    );
    (status, stdout, stderr)
}

/// The last `lines` lines of `text`.
fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Not a test of its own: the body of the child processes that other tests start (see
/// [`run_child`]). Without `ATLAS_RELIABILITY_CHILD` it does nothing, so `--include-ignored`
/// runs it harmlessly.
#[test]
#[ignore = "helper: run in a child process by the reliability tests; does nothing on its own"]
fn child_process() {
    let Ok(task) = std::env::var(CHILD_VAR) else {
        return;
    };
    match task.as_str() {
        "trap" | "write_far" => child_sticky_fault(&task),
        "teardown" => child_teardown(false),
        "teardown_exit" => child_teardown(true),
        "random_blobs" => child_random_blobs(),
        other => panic!("unknown child task `{other}`"),
    }
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
    record("synchronize", demo.stream_synchronize());
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

/// Loads a good registry, then throws 1,000 random blobs at `AtlasRegistry::load`: raw bytes,
/// bytes behind a bare ELF or fatbin magic, behind ELF and fatbin headers that pass Atlas's header
/// checks, and PTX-looking garbage. Each must be refused with an error naming its module; then the
/// registry and a fresh load must still work. Prints `BLOB i` before each load, so that a parent
/// can tell which blob killed the process.
fn child_random_blobs() {
    let mut rng = Rng::new("child_random_blobs");
    let registry = load("demo");
    scale_and_check(&registry, &mut rng);
    let mut driver_refused = [0usize; 6];
    for i in 0..1000 {
        let len = rng.below(4096);
        let body = rng.bytes(len);
        let blob = match i % 6 {
            0 => body,
            1 => [b"\x7fELF".as_slice(), &body].concat(),
            2 => [0xBA55_ED50u32.to_le_bytes().as_slice(), &body].concat(),
            3 => plausible_elf(&body),
            4 => plausible_fatbin(&body),
            _ => {
                // No `/`, so no comment can hide the garbage, and a stray `}` first, so that it
                // can never be valid PTX.
                let garbage: String = body
                    .iter()
                    .map(|&b| match char::from(b' ' + b % 95) {
                        '/' => '|',
                        c => c,
                    })
                    .collect();
                format!(".version 9.0\n.target sm_90\n.address_size 64\n}} {garbage}").into_bytes()
            }
        };
        let name = format!("fuzz_{i}");
        println!(
            "BLOB {i}: {} ({:?}, {} bytes)",
            RANDOM_BLOB_KINDS[i % 6],
            sniff(&blob),
            blob.len()
        );
        let e = load_err(&[(name.as_str(), &blob)]);
        assert!(
            matches!(
                e,
                AtlasError::InvalidModule { .. } | AtlasError::ModuleLoad { .. }
            ),
            "blob {i} ({}, {} bytes): {e:?}",
            RANDOM_BLOB_KINDS[i % 6],
            blob.len()
        );
        assert!(e.to_string().contains(&name), "blob {i}: {e}");
        // A bad blob is the blob's fault: the context is fine, and nobody should restart for it.
        assert!(
            !e.is_context_lost(),
            "blob {i} ({}): a bad blob reported as a lost context: {e:?}",
            RANDOM_BLOB_KINDS[i % 6]
        );
        driver_refused[i % 6] += usize::from(matches!(e, AtlasError::ModuleLoad { .. }));
    }
    println!("CHILD refused by the driver rather than by Atlas, by kind: {driver_refused:?}");
    scale_and_check(&registry, &mut rng);
    scale_and_check(&load("demo"), &mut rng);
    println!("CHILD done");
}

/// What each of `child_random_blobs`'s six kinds of blob is.
const RANDOM_BLOB_KINDS: [&str; 6] = [
    "random bytes",
    "random bytes behind \\x7fELF",
    "random bytes behind the fatbin magic",
    "random bytes behind an ELF header that passes Atlas's checks",
    "random bytes behind a fatbin header that passes Atlas's checks",
    "PTX-looking garbage",
];

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

/// Leaves registries, buffers and streams in statics (never dropped), in this thread's
/// thread-locals, in the thread-locals of a thread that ended, and of one still running at exit;
/// then exits, by returning to the harness or by `std::process::exit`.
fn child_teardown(exit_now: bool) {
    let mut rng = Rng::new("child_teardown");
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
    registry.stream_synchronize().expect("synchronize");
    println!("CHILD teardown ready, exit_now={exit_now}");
    if exit_now {
        std::process::exit(0);
    }
}

/// Asserts that a child ran to its end, did not panic, and that Atlas printed nothing.
fn assert_quiet_exit(task: &str) {
    let (status, stdout, stderr) = run_child(task);
    assert!(
        status.success(),
        "child `{task}` failed ({status}):\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("CHILD teardown ready"),
        "child `{task}` did not get to its end:\n{stdout}\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    let atlas_lines: Vec<_> = stderr
        .lines()
        .chain(stdout.lines())
        .filter(|l| l.starts_with("atlas:"))
        .collect();
    assert!(
        atlas_lines.is_empty(),
        "Atlas printed at exit:\n{}",
        atlas_lines.join("\n")
    );
}

/// Runs a child that launches the faulting kernel `kind` and checks what it printed.
fn assert_sticky_fault_reported(kind: &str) {
    let count = device_count().expect(NEEDS_GPU);
    assert!(count >= 1, "{NEEDS_GPU}: the driver reports no device");
    let started = Instant::now();
    let (status, stdout, stderr) = run_child(kind);
    let report: Vec<_> = stdout.lines().filter(|l| l.starts_with("CHILD ")).collect();
    let report = report.join("\n");
    assert!(
        !stderr.contains("panicked") && !stdout.contains("panicked"),
        "the child panicked:\n{stdout}\n{stderr}"
    );
    assert!(
        status.success(),
        "child `{kind}` failed ({status}):\n{stdout}\n{stderr}"
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

// ---------------------------------------------------------------------------------------------
// CPU tests: no GPU, no driver needed
// ---------------------------------------------------------------------------------------------

/// What `sniff` must say, written from its documentation: magic numbers first, then UTF-8.
fn expected_kind(blob: &[u8]) -> BlobKind {
    if blob.starts_with(b"\x7fELF") {
        BlobKind::Cubin
    } else if blob.starts_with(&[0x50, 0xED, 0x55, 0xBA]) {
        BlobKind::Fatbin
    } else if blob.starts_with(b"__CLANG_OFFLOAD_BUNDLE__") {
        BlobKind::OffloadBundle
    } else if std::str::from_utf8(blob).is_ok() {
        BlobKind::Ptx
    } else {
        BlobKind::Binary
    }
}

/// Headers a blob may start with: the three magics, their truncations, and PTX-looking text.
fn header() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(b"\x7fELF".to_vec()),
        Just(b"\x7fELF\x02\x01\x01".to_vec()),
        Just(0xBA55_ED50u32.to_le_bytes().to_vec()),
        Just(vec![0x50, 0xED, 0x55, 0xBA, 0x01, 0x00, 0x10, 0x00]),
        Just(b"__CLANG_OFFLOAD_BUNDLE__".to_vec()),
        Just(b"\x7fEL".to_vec()),
        Just(vec![0x50, 0xED, 0x55]),
        Just(b".version 9.0\n.target sm_90\n".to_vec()),
        Just(Vec::new()),
    ]
}

proptest! {
    // Cases: 256 by default, `PROPTEST_CASES` for more. A failure is saved beside this file, in
    // `reliability.proptest-regressions`, and tried first on later runs.
    #![proptest_config(ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    /// Arbitrary bytes: `sniff` never panics, and says what its documentation says.
    #[test]
    fn sniff_classifies_arbitrary_bytes(blob in proptest::collection::vec(any::<u8>(), 0..4096)) {
        prop_assert_eq!(sniff(&blob), expected_kind(&blob));
        prop_assert_eq!(sniff(&blob), sniff(&blob));
    }

    /// Arbitrary bytes behind an ELF, fatbin or bundle header (or a truncated one): the header
    /// decides, whatever follows; a magic's kind survives any tail.
    #[test]
    fn sniff_classifies_headers_whatever_follows(
        head in header(),
        tail in proptest::collection::vec(any::<u8>(), 0..2048),
    ) {
        let mut blob = head.clone();
        blob.extend_from_slice(&tail);
        let kind = sniff(&blob);
        prop_assert_eq!(kind, expected_kind(&blob));
        if matches!(sniff(&head), BlobKind::Cubin | BlobKind::Fatbin | BlobKind::OffloadBundle) {
            prop_assert_eq!(kind, sniff(&head));
        }
    }

    /// Any text is PTX unless it starts with a magic that happens to be ASCII.
    #[test]
    fn sniff_calls_text_ptx(text in any::<String>()) {
        let kind = sniff(text.as_bytes());
        prop_assert_eq!(kind, expected_kind(text.as_bytes()));
        prop_assert_ne!(kind, BlobKind::Binary);
        prop_assert_ne!(kind, BlobKind::Fatbin);
    }

    /// Any module name, NULs and control characters included, given twice: refused before the
    /// driver is involved, naming the module escaped; never a panic.
    #[test]
    fn duplicate_names_of_any_shape_are_refused_naming_them(
        name in any::<String>(),
        other in any::<String>(),
    ) {
        let blob: &[u8] = b".version 9.0\n";
        for err in [
            AtlasRegistry::load(0, &[(name.as_str(), blob), (other.as_str(), blob), (name.as_str(), blob)])
                .unwrap_err(),
            atlas_registry::AtlasLibrary::load(&[(name.as_str(), blob), (name.as_str(), blob)]).unwrap_err(),
        ] {
            let first_duplicate = if other == name { &other } else { &name };
            match &err {
                AtlasError::InvalidModule { module, reason } => {
                    prop_assert_eq!(module, &first_duplicate.escape_debug().to_string());
                    prop_assert!(reason.contains("twice"), "{}", reason);
                }
                _ => prop_assert!(false, "expected InvalidModule, got {}", err),
            }
        }
    }

    /// Any launch configuration: the check never panics, and refuses exactly the ones that break
    /// a limit, naming it.
    #[test]
    fn launch_check_refuses_exactly_what_breaks_a_limit(
        grid in (dim(), dim(), dim()),
        block in (dim(), dim(), dim()),
        shared_mem_bytes in prop_oneof![Just(0u32), Just(48 * 1024), Just(232_448), Just(232_449), any::<u32>()],
    ) {
        let limits = h200_limits();
        let cfg = LaunchConfig { grid, block, shared_mem_bytes };
        match limits.check(&cfg) {
            Ok(()) => prop_assert!(fits(&limits, &cfg), "{cfg:?} passed the check"),
            Err(reason) => {
                prop_assert!(!fits(&limits, &cfg), "{cfg:?} refused: {reason}");
                prop_assert!(
                    ["grid", "block", "shared memory"].iter().any(|w| reason.contains(w)),
                    "the reason names no limit: {reason}"
                );
            }
        }
    }
}

/// Launch dimensions, edges included.
fn dim() -> impl Strategy<Value = u32> {
    prop_oneof![
        Just(0u32),
        Just(1),
        Just(64),
        Just(1024),
        Just(1025),
        Just(65535),
        Just(65536),
        1..=4096u32,
        any::<u32>(),
    ]
}

/// An H200's launch limits.
fn h200_limits() -> DeviceLimits {
    DeviceLimits {
        max_threads_per_block: 1024,
        max_block: (1024, 1024, 64),
        max_grid: (i32::MAX as u32, 65535, 65535),
        max_shared_mem_optin: 232_448,
    }
}

/// Whether `cfg` fits `l`, written from the CUDA limits.
fn fits(l: &DeviceLimits, cfg: &LaunchConfig) -> bool {
    let (g, b) = (cfg.grid, cfg.block);
    let dims = [g.0, g.1, g.2, b.0, b.1, b.2];
    dims.iter().all(|&d| d > 0)
        && b.0 <= l.max_block.0
        && b.1 <= l.max_block.1
        && b.2 <= l.max_block.2
        && u64::from(b.0) * u64::from(b.1) * u64::from(b.2) <= u64::from(l.max_threads_per_block)
        && g.0 <= l.max_grid.0
        && g.1 <= l.max_grid.1
        && g.2 <= l.max_grid.2
        && cfg.shared_mem_bytes <= l.max_shared_mem_optin
}

#[test]
fn every_prefix_of_the_real_blobs_is_classified_without_panic() {
    let mut blobs: Vec<&[u8]> = vec![ELEMENTWISE_FATBIN];
    for model in atlas_kernels::MODELS {
        blobs.extend(ptx_for_model(model).unwrap().iter().map(|(_, b)| *b));
        for sm in atlas_kernels::CUBIN_ARCHS {
            blobs.extend(cubin_for_model(model, *sm).unwrap().iter().map(|(_, b)| *b));
        }
    }
    for blob in blobs {
        for len in 0..=blob.len() {
            assert_eq!(sniff(&blob[..len]), expected_kind(&blob[..len]), "{len}");
        }
    }
    assert_eq!(sniff(ELEMENTWISE_FATBIN), BlobKind::Fatbin);
    assert_eq!(
        sniff(cubin_for_model("demo", 90).unwrap()[0].1),
        BlobKind::Cubin
    );
    assert_eq!(sniff(ptx_for_model("demo").unwrap()[0].1), BlobKind::Ptx);
}

#[test]
fn bad_launch_configurations_name_the_limit() {
    let l = h200_limits();
    let ok = LaunchConfig::for_elements(1 << 20, 256);
    assert_eq!(l.check(&ok), Ok(()));
    let cases = [
        (
            LaunchConfig {
                block: (2048, 1, 1),
                ..ok
            },
            "largest block dimensions (1024, 1024, 64)",
        ),
        (
            LaunchConfig {
                block: (64, 32, 1),
                ..ok
            },
            "2048 threads, more than the device's 1024",
        ),
        (
            LaunchConfig {
                grid: (0, 1, 1),
                ..ok
            },
            "zero dimension",
        ),
        (
            LaunchConfig {
                grid: (1, 65536, 1),
                ..ok
            },
            "largest grid dimensions",
        ),
        (
            ok.with_shared_mem(232_449),
            "232449 B of dynamic shared memory exceeds the device's maximum of 232448 B",
        ),
    ];
    for (cfg, says) in cases {
        let reason = l.check(&cfg).unwrap_err();
        assert!(reason.contains(says), "{cfg:?}: {reason}");
    }
}

#[test]
fn duplicate_module_names_are_refused_before_the_driver() {
    // No driver is needed: the names are checked first.
    let ptx = blob_of(ptx_for_model("demo").unwrap(), "noop");
    let e = AtlasRegistry::load(0, &[("noop", ptx), ("noop", ptx)]).unwrap_err();
    assert!(
        matches!(&e, AtlasError::InvalidModule { module, reason } if module == "noop" && reason.contains("twice")),
        "{e:?}"
    );
    let e = AtlasRegistry::load(0, &[("a\0b", ptx), ("a\0b", ptx)]).unwrap_err();
    assert!(e.to_string().contains("module `a\\0b`"), "{e}");
}

#[test]
fn bad_ordinals_are_typed_errors_with_or_without_a_driver() {
    let demo = ptx_for_model("demo").unwrap();
    for ordinal in [99, usize::MAX] {
        let e = AtlasRegistry::load(ordinal, demo).unwrap_err();
        if atlas_registry::sys::driver().is_err() {
            // No driver here: the error says so, and lists where it looked.
            assert!(matches!(e, AtlasError::DriverUnavailable(_)), "{e:?}");
            assert!(e.to_string().contains("libcuda"), "{e}");
        } else {
            assert!(
                matches!(e, AtlasError::InvalidDevice { ordinal: o, .. } if o == ordinal),
                "{e:?}"
            );
        }
        let e = host(ordinal).unwrap_err();
        assert!(
            matches!(
                e,
                AtlasError::DriverUnavailable(_) | AtlasError::InvalidDevice { .. }
            ),
            "{e:?}"
        );
    }
}

#[test]
fn a_lost_context_error_says_to_restart() {
    let e = AtlasError::ContextLost {
        call: "cuStreamSynchronize",
        subject: String::new(),
        code: 719,
        text: "CUDA_ERROR_LAUNCH_FAILED (719): unspecified launch failure".into(),
    };
    assert!(e.is_context_lost());
    let text = e.to_string();
    assert!(
        text.contains("cuStreamSynchronize failed")
            && text.contains("context")
            && text.contains("restart"),
        "{text}"
    );
}

// ---------------------------------------------------------------------------------------------
// GPU tests
// ---------------------------------------------------------------------------------------------

/// A 64-byte ELF header that passes Atlas's header checks (64-bit, little-endian, CUDA, no
/// header tables), followed by `body`.
fn plausible_elf(body: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; 64];
    b[..4].copy_from_slice(b"\x7fELF");
    b[4] = 2;
    b[5] = 1;
    b[6] = 1;
    b[18..20].copy_from_slice(&190u16.to_le_bytes());
    b.extend_from_slice(body);
    b
}

/// A 16-byte fatbin header whose declared size is exactly `body`, followed by `body`.
fn plausible_fatbin(body: &[u8]) -> Vec<u8> {
    let mut b = 0xBA55_ED50u32.to_le_bytes().to_vec();
    b.extend_from_slice(&1u16.to_le_bytes());
    b.extend_from_slice(&16u16.to_le_bytes());
    b.extend_from_slice(&(body.len() as u64).to_le_bytes());
    b.extend_from_slice(body);
    b
}

/// Loading `blobs` must fail; returns the error.
fn load_err(blobs: &[(&str, &[u8])]) -> AtlasError {
    match AtlasRegistry::load(0, blobs) {
        Ok(r) => panic!(
            "loading {:?} succeeded",
            r.module_names().collect::<Vec<_>>()
        ),
        Err(e) => e,
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn bad_blobs_and_names_are_typed_errors_and_the_registry_keeps_working() {
    let mut rng = Rng::new("bad_blobs");
    let registry = load("demo");
    scale_and_check(&registry, &mut rng);
    let ptx = blob_of(ptx_for_model("demo").unwrap(), "elementwise");
    let (major, minor) = registry.host().compute_capability();
    let cubin = blob_of(
        cubin_for_model("demo", major * 10 + minor).unwrap(),
        "elementwise",
    );

    // An empty blob, PTX with a NUL inside: refused before the driver, naming the module.
    let e = load_err(&[("empty_mod", &b""[..])]);
    assert!(
        matches!(&e, AtlasError::InvalidModule { module, reason } if module == "empty_mod" && reason.contains("empty")),
        "{e:?}"
    );
    let mut with_nul = ptx.to_vec();
    with_nul[100] = 0;
    let e = load_err(&[("nul_mod", &with_nul)]);
    assert!(
        matches!(&e, AtlasError::InvalidModule { module, reason } if module == "nul_mod" && reason.contains("offset 100")),
        "{e:?}"
    );
    // A module name with a NUL inside is escaped in the error.
    let e = load_err(&[("bad\0name", &b""[..])]);
    assert!(e.to_string().contains("bad\\0name"), "{e}");

    // Truncated cubin and fatbin: their headers point past the end.
    for cut in [10, 63, 64, cubin.len() / 2, cubin.len() - 1] {
        let e = load_err(&[("cut_cubin", &cubin[..cut])]);
        assert!(
            matches!(&e, AtlasError::InvalidModule { module, reason } if module == "cut_cubin" && reason.contains("truncated")),
            "cut at {cut}: {e:?}"
        );
    }
    for cut in [
        5,
        15,
        16,
        ELEMENTWISE_FATBIN.len() / 2,
        ELEMENTWISE_FATBIN.len() - 1,
    ] {
        let e = load_err(&[("cut_fatbin", &ELEMENTWISE_FATBIN[..cut])]);
        assert!(
            matches!(&e, AtlasError::InvalidModule { module, reason } if module == "cut_fatbin" && reason.contains("truncated")),
            "cut at {cut}: {e:?}"
        );
    }
    // An ELF file for another machine (x86-64).
    let mut x86 = cubin.to_vec();
    x86[18..20].copy_from_slice(&62u16.to_le_bytes());
    let e = load_err(&[("x86_mod", &x86)]);
    assert!(
        matches!(&e, AtlasError::InvalidModule { module, reason } if module == "x86_mod" && reason.contains("machine 62")),
        "{e:?}"
    );

    // Truncated PTX: the JIT fails, naming the module, with its log.
    let e = load_err(&[("cut_ptx", &ptx[..ptx.len() / 2])]);
    assert!(
        matches!(&e, AtlasError::ModuleLoad { module, .. } if module == "cut_ptx"),
        "{e:?}"
    );
    assert!(e.to_string().contains("cut_ptx"), "{e}");

    // A syntax error: the JIT log names its line.
    let text = std::str::from_utf8(ptx).expect("PTX is text");
    let mut lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with(".address_size"))
        .expect("an .address_size line")
        + 1;
    lines.insert(at, "this is not ptx;");
    let broken = lines.join("\n");
    let e = load_err(&[("syntax_mod", broken.as_bytes())]);
    match &e {
        AtlasError::ModuleLoad {
            module, jit_log, ..
        } => {
            assert_eq!(module, "syntax_mod");
            assert!(
                jit_log.contains(&format!("line {}", at + 1)),
                "the JIT log must name line {}: {jit_log:?}",
                at + 1
            );
        }
        other => panic!("expected ModuleLoad, got {other:?}"),
    }
    assert!(e.to_string().contains("JIT log"), "{e}");

    // A good module before a bad one: the load fails as a whole, naming the bad one.
    let e = load_err(&[("good", ptx), ("bad_second", &ptx[..ptx.len() / 3])]);
    assert!(e.to_string().contains("bad_second"), "{e}");

    // Unknown names and names with a NUL: NotFound, naming them.
    let not_found = |e: AtlasError, kind: NotFoundKind, name: &str| {
        assert!(
            matches!(&e, AtlasError::NotFound { kind: k, name: n, .. } if *k == kind && n == name),
            "expected {kind} `{name}` not found, got {e:?}"
        );
        assert!(e.to_string().contains(name), "{e}");
    };
    not_found(
        registry.function("no_such_module", "scale").unwrap_err(),
        NotFoundKind::Module,
        "no_such_module",
    );
    let e = registry
        .function_cached("no_such_module", "scale")
        .unwrap_err();
    assert!(
        e.to_string().contains("elementwise"),
        "lists the modules: {e}"
    );
    not_found(e, NotFoundKind::Module, "no_such_module");
    not_found(
        registry.function("elementwise", "no_such_fn").unwrap_err(),
        NotFoundKind::Function,
        "elementwise::no_such_fn",
    );
    not_found(
        registry
            .raw_function_cached("elementwise", "no_such_fn")
            .unwrap_err(),
        NotFoundKind::Function,
        "elementwise::no_such_fn",
    );
    not_found(
        registry.function("noop", "scale").unwrap_err(),
        NotFoundKind::Function,
        "noop::scale",
    );
    static MISSING: FunctionCache = FunctionCache::new("elementwise", "missing");
    not_found(
        MISSING.get(&registry).unwrap_err(),
        NotFoundKind::Function,
        "elementwise::missing",
    );
    not_found(
        registry
            .device_symbol("device_global", "no_such_symbol")
            .unwrap_err(),
        NotFoundKind::Symbol,
        "device_global::no_such_symbol",
    );
    not_found(
        registry
            .device_symbol("no_such_module", "bias")
            .unwrap_err(),
        NotFoundKind::Module,
        "no_such_module",
    );
    not_found(
        registry.function("elementwise", "sc\0ale").unwrap_err(),
        NotFoundKind::Function,
        "elementwise::sc\\0ale",
    );
    not_found(
        registry
            .function_cached("elementwise", "sc\0ale")
            .unwrap_err(),
        NotFoundKind::Function,
        "elementwise::sc\\0ale",
    );
    not_found(
        registry
            .device_symbol("device_global", "bi\0as")
            .unwrap_err(),
        NotFoundKind::Symbol,
        "device_global::bi\\0as",
    );
    not_found(
        registry.function("element\0wise", "scale").unwrap_err(),
        NotFoundKind::Module,
        "element\\0wise",
    );
    assert!(
        registry
            .function("elementwise", "sc\0ale")
            .unwrap_err()
            .to_string()
            .contains("NUL"),
        "says why"
    );

    // After all of that, the registry, the device and new loads still work.
    scale_and_check(&registry, &mut rng);
    let again = load("demo");
    scale_and_check(&again, &mut rng);
    let bias = again.device_symbol("device_global", "bias").expect("bias");
    bias.write(&[0.25f32]).expect("write bias");
    let mut read = [0f32];
    bias.read(&mut read).expect("read bias");
    assert_eq!(read, [0.25]);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_thousand_random_blobs_are_refused_without_a_crash() {
    // In a child process: a blob that crashes the driver takes the child down, not this harness.
    assert!(device_count().expect(NEEDS_GPU) >= 1, "{NEEDS_GPU}");
    let (status, stdout, stderr) = run_child("random_blobs");
    let last_blob = stdout
        .lines()
        .rfind(|l| l.starts_with("BLOB "))
        .unwrap_or("(none)");
    let seed = stdout
        .lines()
        .find(|l| l.contains("RELIABILITY_SEED="))
        .unwrap_or("(no seed printed)");
    assert!(
        status.success() && stdout.contains("CHILD done"),
        "the child failed ({status}); the last blob it started loading: {last_blob}; {seed}\n{}",
        tail(&stderr, 30)
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn bad_launches_are_refused_before_the_driver_naming_the_limit() {
    let mut rng = Rng::new("bad_launches");
    let registry = load("demo");
    let limits = registry.host().limits().clone();
    println!("device 0 limits: {limits:?}");
    let stream = registry.stream();
    let n = 4096u32;
    let input = rng.f32s(n as usize, -10.0, 10.0);
    let mut x = DeviceBuffer::from_slice(registry.ctx(), stream, &input).expect("upload");
    let scale = registry
        .function_cached("elementwise", "scale")
        .expect("elementwise::scale");
    let raw = registry
        .raw_function_cached("elementwise", "scale")
        .expect("raw elementwise::scale");
    let ok = LaunchConfig::for_elements(n, 256);
    let max_shared = limits.max_shared_mem_optin;
    let cases = [
        (
            LaunchConfig {
                block: (2048, 1, 1),
                ..ok
            },
            "block (2048, 1, 1)".to_string(),
        ),
        (
            LaunchConfig {
                block: (32, 32, 2),
                ..ok
            },
            format!(
                "2048 threads, more than the device's {}",
                limits.max_threads_per_block
            ),
        ),
        (
            LaunchConfig {
                grid: (0, 1, 1),
                ..ok
            },
            "grid (0, 1, 1) has a zero dimension".to_string(),
        ),
        (
            LaunchConfig {
                block: (256, 0, 1),
                ..ok
            },
            "zero dimension".to_string(),
        ),
        (
            LaunchConfig {
                grid: (1, limits.max_grid.1 + 1, 1),
                ..ok
            },
            "largest grid dimensions".to_string(),
        ),
        (
            ok.with_shared_mem(max_shared + 1),
            format!(
                "{} B of dynamic shared memory exceeds the device's maximum of {max_shared} B",
                max_shared + 1
            ),
        ),
        (
            ok.with_shared_mem(u32::MAX),
            format!("maximum of {max_shared} B"),
        ),
    ];
    for (cfg, says) in &cases {
        for e in [
            // SAFETY: refused before the driver is called (each case breaks a device limit), so
            // the kernel never runs; `x` holds the `n` floats it would touch anyway.
            unsafe { scale.launch(stream, cfg, (&mut x, 2.0f32, n)) }.unwrap_err(),
            {
                let (mut ptr, mut factor, mut len) = (x.device_ptr(), 2.0f32, n);
                let mut params: [*mut std::ffi::c_void; 3] = [
                    (&raw mut ptr).cast(),
                    (&raw mut factor).cast(),
                    (&raw mut len).cast(),
                ];
                // SAFETY: `raw` is this registry's elementwise::scale, the stream is the
                // registry's, and the three parameters are a device pointer, an f32 and a u32, as
                // the kernel takes them (the launch is refused before the driver anyway).
                unsafe { registry.launch_on_stream(raw, cfg, stream.raw(), &mut params) }
                    .unwrap_err()
            },
        ] {
            match &e {
                AtlasError::InvalidLaunch { function, reason } => {
                    assert_eq!(function, "elementwise::scale");
                    assert!(reason.contains(says.as_str()), "{cfg:?}: {reason}");
                }
                other => panic!("{cfg:?}: expected InvalidLaunch, got {other:?}"),
            }
        }
    }
    // Wrong arguments for the kernel (when the driver can tell its parameters).
    if scale.param_sizes().expect("param sizes").is_some() {
        // SAFETY: refused before the driver is called (two arguments for three parameters), so
        // the kernel never runs.
        let e = unsafe { scale.launch(stream, &ok, (&mut x, 2.0f32)) }.unwrap_err();
        assert!(
            matches!(&e, AtlasError::InvalidLaunch { reason, .. } if reason.contains("parameter")),
            "{e:?}"
        );
        // SAFETY: refused before the driver is called (an 8-byte factor for a 4-byte
        // parameter), so the kernel never runs.
        let e = unsafe { scale.launch(stream, &ok, (&mut x, 2.0f64, n)) }.unwrap_err();
        assert!(matches!(e, AtlasError::InvalidLaunch { .. }), "{e:?}");
    }
    // None of them ran: the data is as it was.
    let untouched = x.to_vec(stream).expect("download");
    assert_eq!(untouched, input, "a refused launch must not run");

    // Ordinals out of range.
    let count = device_count().expect("device count");
    for ordinal in [count, 99] {
        let e = AtlasRegistry::load(ordinal, ptx_for_model("demo").unwrap()).unwrap_err();
        assert!(
            matches!(e, AtlasError::InvalidDevice { ordinal: o, count: c } if o == ordinal && c == count),
            "{e:?}"
        );
        assert!(
            e.to_string()
                .contains(&format!("device {ordinal} does not exist")),
            "{e}"
        );
    }

    // The largest legal launch of each kind still works afterwards.
    let max_block = LaunchConfig::for_elements(n, limits.max_threads_per_block);
    // SAFETY: `x` holds `n` floats, all that `scale` touches; it outlives the launch (`to_vec`
    // below synchronizes the stream).
    unsafe { scale.launch(stream, &max_block, (&mut x, 2.0f32, n)) }.expect("a full block");
    let doubled = x.to_vec(stream).expect("download");
    for (i, (&got, &was)) in doubled.iter().zip(&input).enumerate() {
        assert_eq!(got.to_bits(), (was * 2.0).to_bits(), "element {i}");
    }
    scale_and_check(&registry, &mut rng);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_trapping_kernel_loses_the_context_and_every_next_call_says_restart() {
    assert_sticky_fault_reported("trap");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn an_out_of_bounds_write_loses_the_context_and_every_next_call_says_restart() {
    assert_sticky_fault_reported("write_far");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn exit_with_registries_in_statics_and_thread_locals_prints_nothing() {
    assert!(device_count().expect(NEEDS_GPU) >= 1, "{NEEDS_GPU}");
    assert_quiet_exit("teardown");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn process_exit_from_a_test_with_live_registries_prints_nothing() {
    assert!(device_count().expect(NEEDS_GPU) >= 1, "{NEEDS_GPU}");
    assert_quiet_exit("teardown_exit");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn release_returns_errors_as_values_and_unloads_nothing_while_in_use() {
    let mut rng = Rng::new("release");
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

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn sixteen_threads_launch_through_one_registry_while_models_load_and_drop() {
    const THREADS: usize = 16;
    const LAUNCHES: usize = 10_000;
    static SCALE: FunctionCache = FunctionCache::new("elementwise", "scale");
    let mut rng = Rng::new("concurrency");
    let registry = load("demo");
    let finished = AtomicUsize::new(0);
    let loader_cycles = AtomicUsize::new(0);
    let started = Instant::now();

    /// Counts a worker as finished even when it panics, so the loader never waits forever.
    struct Finished<'a>(&'a AtomicUsize);
    impl Drop for Finished<'_> {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::Release);
        }
    }

    std::thread::scope(|s| {
        let mut loader_rng = rng.fork();
        let (finished, loader_cycles) = (&finished, &loader_cycles);
        s.spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(120);
            while finished.load(Ordering::Acquire) < THREADS && Instant::now() < deadline {
                for model in ["model_a", "model_b"] {
                    let other = load(model);
                    transform_and_check(&other, model, &mut loader_rng);
                    drop(other);
                }
                loader_cycles.fetch_add(1, Ordering::Relaxed);
            }
        });
        for t in 0..THREADS {
            let mut rng = rng.fork();
            let registry = &registry;
            s.spawn(move || {
                let _finished = Finished(finished);
                let stream = CudaStream::new(registry.ctx()).expect("a stream per thread");
                let n = 200 + t * 7;
                let input = rng.f32s(n, 1.0, 2.0);
                let mut poisoned = input.clone();
                poisoned.extend(std::iter::repeat_n(f32::NAN, 32));
                let mut x =
                    DeviceBuffer::from_slice(registry.ctx(), &stream, &poisoned).expect("upload");
                let cfg = LaunchConfig::for_elements(n as u32, 64);
                // Powers of two, never 1: exact in f32, and a lost or doubled launch shows.
                let mut exponent = 0i32;
                let mut factors = Vec::with_capacity(LAUNCHES + 1);
                for _ in 0..LAUNCHES {
                    let mut step = [-2, -1, 1, 2][rng.below(4)];
                    if (exponent + step).abs() > 20 {
                        step = -step;
                    }
                    exponent += step;
                    factors.push(2f32.powi(step));
                }
                if exponent == 0 {
                    // End away from 1, so that a run where nothing happened cannot pass.
                    exponent += 2;
                    factors.push(4.0);
                }
                for (i, &factor) in factors.iter().enumerate() {
                    // SAFETY: `x` holds `n` floats and 32 NaNs after them; `scale` touches the
                    // first `n`. It outlives the launches (synchronized after the loop).
                    unsafe {
                        SCALE
                            .get(registry)
                            .expect("cached elementwise::scale")
                            .launch(&stream, &cfg, (&mut x, factor, n as u32))
                    }
                    .unwrap_or_else(|e| panic!("thread {t}, launch {i}: {e}"));
                }
                stream.synchronize().expect("synchronize");
                let out = x.to_vec(&stream).expect("download");
                for (i, &given) in input.iter().enumerate() {
                    let want = factors.iter().fold(given, |v, &f| v * f);
                    assert_eq!(
                        out[i].to_bits(),
                        want.to_bits(),
                        "thread {t} element {i}: {given} * 2^{exponent}"
                    );
                }
                assert!(
                    out[n..].iter().all(|v| v.is_nan()),
                    "thread {t} wrote past n"
                );
            });
        }
    });
    let cycles = loader_cycles.load(Ordering::Relaxed);
    println!(
        "{THREADS} threads x {LAUNCHES} launches in {:?}, {cycles} load/drop cycles of model_a and model_b beside them",
        started.elapsed()
    );
    assert!(cycles >= 1, "the loader thread never finished a cycle");
    scale_and_check(&registry, &mut rng);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_thousand_load_drop_cycles_keep_device_and_host_memory_flat() {
    const CYCLES: usize = 1000;
    const DEVICE_WARMUP: usize = 1;
    const HOST_WARMUP: usize = 50;
    const DEVICE_SLACK: usize = 1 << 20;
    const HOST_SLACK: usize = 8 << 20;
    static SOAK_SCALE: FunctionCache = FunctionCache::new("elementwise", "scale");
    let mut rng = Rng::new("soak");
    let blobs = ptx_for_model("demo").unwrap();
    let long_lived = load("demo");
    let stop = AtomicBool::new(false);
    let started = Instant::now();

    std::thread::scope(|s| {
        // Launches on the long-lived registry, on its own stream, for as long as the cycles run.
        let (long_lived, stop) = (&long_lived, &stop);
        let mut launcher_rng = rng.fork();
        let launcher = s.spawn(move || {
            let stream = CudaStream::new(long_lived.ctx()).expect("a stream");
            let n = 300;
            let input = launcher_rng.f32s(n, 1.0, 2.0);
            let mut x =
                DeviceBuffer::from_slice(long_lived.ctx(), &stream, &input).expect("upload");
            let cfg = LaunchConfig::for_elements(n as u32, 128);
            let mut launches = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for factor in [2.0f32, 0.5, 4.0, 0.25] {
                    // SAFETY: `x` holds `n` floats, all that `scale` touches; it outlives the
                    // launch (the stream is synchronized after each group of four).
                    unsafe {
                        SOAK_SCALE
                            .get(long_lived)
                            .expect("elementwise::scale")
                            .launch(&stream, &cfg, (&mut x, factor, n as u32))
                    }
                    .expect("launch");
                }
                launches += 4;
                stream.synchronize().expect("synchronize");
            }
            // Each group of four multiplies by 1: the data must be back where it started, exactly.
            let out = x.to_vec(&stream).expect("download");
            assert_eq!(
                out, input,
                "after {launches} launches beside the load/drop cycles"
            );
            launches
        });

        // Stops the launcher however this thread leaves the scope, a failed assertion included.
        let stop_launcher = SetOnDrop(stop);
        let mut device_start = 0;
        let mut host_start = 0;
        for cycle in 0..CYCLES {
            let registry = AtlasRegistry::load(0, blobs)
                .unwrap_or_else(|e| panic!("cycle {cycle}: load: {e}"));
            let n = 64 + rng.below(64);
            let input = rng.f32s(n, -8.0, 8.0);
            let factor = rng.f32_in(1.5, 3.0);
            let mut y = DeviceBuffer::from_slice(registry.ctx(), registry.stream(), &input)
                .expect("upload");
            // SAFETY: `y` holds `n` floats, all that `scale` touches; it outlives the launch
            // (`to_vec` below synchronizes the stream before `y` is dropped).
            unsafe {
                SOAK_SCALE
                    .get(&registry)
                    .expect("elementwise::scale")
                    .launch(
                        registry.stream(),
                        &LaunchConfig::for_elements(n as u32, 64),
                        (&mut y, factor, n as u32),
                    )
            }
            .expect("launch");
            let out = y.to_vec(registry.stream()).expect("download");
            for (i, (&got, &was)) in out.iter().zip(&input).enumerate() {
                assert_eq!(
                    got.to_bits(),
                    (was * factor).to_bits(),
                    "cycle {cycle}, element {i}"
                );
            }
            drop(y);
            if cycle % 2 == 0 {
                drop(registry);
            } else {
                release(registry).unwrap_or_else(|e| panic!("cycle {cycle}: release: {e}"));
            }
            if cycle + 1 == DEVICE_WARMUP {
                device_start = device_free_bytes(long_lived);
            }
            if cycle + 1 == HOST_WARMUP {
                host_start = rss_bytes();
            }
        }
        let device_end = device_free_bytes(long_lived);
        let host_end = rss_bytes();
        drop(stop_launcher);
        let launches = launcher.join().expect("the launcher thread");
        println!(
            "{CYCLES} cycles in {:?} beside {launches} launches; device free {device_start} -> {device_end} B, host RSS {host_start} -> {host_end} B",
            started.elapsed()
        );
        assert!(launches > 0, "the launcher thread never launched");
        assert!(
            device_end.abs_diff(device_start) <= DEVICE_SLACK,
            "device memory moved by {} B over {CYCLES} cycles (free {device_start} -> {device_end})",
            device_end as i64 - device_start as i64
        );
        assert!(
            host_end <= host_start + HOST_SLACK,
            "host memory grew by {} B over {CYCLES} cycles (RSS {host_start} -> {host_end})",
            host_end as i64 - host_start as i64
        );
    });
}

#[test]
#[ignore = "needs two NVIDIA GPUs"]
fn two_gpus_are_independent() {
    let count = device_count().expect(NEEDS_GPU);
    assert!(
        count >= 2,
        "this test needs two NVIDIA GPUs; the driver reports {count}"
    );
    let mut rng = Rng::new("two_devices");
    let (h0, h1) = (host(0).expect("host 0"), host(1).expect("host 1"));
    assert_eq!((h0.ordinal(), h1.ordinal()), (0, 1));
    assert_ne!(h0.context().raw(), h1.context().raw(), "one context each");
    assert_ne!(h0.stream().raw(), h1.stream().raw(), "one stream each");

    let load_on = |ordinal: usize, model: &str| {
        AtlasRegistry::load(ordinal, ptx_for_model(model).unwrap())
            .unwrap_or_else(|e| panic!("{model} on device {ordinal}: {e}"))
    };
    let demo = [load_on(0, "demo"), load_on(1, "demo")];
    let models = [load_on(0, "model_a"), load_on(1, "model_b")];
    for (ordinal, registry) in demo.iter().enumerate() {
        assert_eq!(registry.host().ordinal(), ordinal);
    }
    // Interleaved on one thread: each call binds its own device's context.
    for _ in 0..3 {
        scale_and_check(&demo[0], &mut rng);
        scale_and_check(&demo[1], &mut rng);
        transform_and_check(&models[0], "model_a", &mut rng);
        transform_and_check(&models[1], "model_b", &mut rng);
    }
    // At once from two threads, one per device.
    std::thread::scope(|s| {
        for registry in &demo {
            let mut rng = rng.fork();
            s.spawn(move || {
                for _ in 0..20 {
                    scale_and_check(registry, &mut rng);
                }
            });
        }
    });
    // Dropping device 1's registries leaves device 0's working.
    let [demo0, demo1] = demo;
    drop(demo1);
    drop(models);
    scale_and_check(&demo0, &mut rng);

    // An ordinal past the last device is a clear error.
    let e = AtlasRegistry::load(count, ptx_for_model("demo").unwrap()).unwrap_err();
    assert!(
        matches!(e, AtlasError::InvalidDevice { ordinal, count: c } if ordinal == count && c == count),
        "{e:?}"
    );
    assert!(
        e.to_string().contains(&format!("has {count} device(s)")),
        "{e}"
    );
}
