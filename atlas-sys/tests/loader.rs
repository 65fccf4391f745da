//! Loading libcuda without a GPU: real libraries built by the test stand in for the driver.
//!
//! The libraries are built with `TARGET_CC`, else `CC`, else `cc` (the C compiler of the machine
//! the tests run for: a cross compiler when they run under an emulator), each in a directory of
//! its own under `target/` that is removed when the test ends. Children are this test binary
//! again, started through `ATLAS_TEST_RUNNER` when it is set (an emulator such as `qemu-aarch64`
//! that the kernel does not apply by itself). `atlas-registry/tests/support/` does the same for
//! the registry's tests.

use std::path::{Path, PathBuf};
use std::process::Command;

use atlas_sys::{CUresult, CudaDriver, LoadError, Nvrtc, entry, nvrtcResult};

/// A stand-in driver: exports cuInit and cuDriverGetVersion, and nothing else.
const FAKE_DRIVER: &str = r#"
int cuInit(unsigned int flags) { return flags == 0 ? 0 : 1; }
int cuDriverGetVersion(int *version) { *version = 12090; return 0; }
"#;

/// A stand-in NVRTC: exports nvrtcVersion, and nothing else.
const FAKE_NVRTC: &str = r#"
int nvrtcVersion(int *major, int *minor) { *major = 12; *minor = 9; return 0; }
"#;

/// A shared library that has nothing to do with CUDA.
const NOT_CUDA: &str = "int not_cuda(void) { return 7; }\n";

/// A fresh directory under `target/` (cargo's `CARGO_TARGET_TMPDIR`, or `target/tmp` of the
/// current directory for test binaries carried to another machine), removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let built = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let root = if built.is_dir() {
            built
        } else {
            Path::new("target/tmp")
        };
        let dir = root.join(format!("atlas-sys-loader-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A shared library built by the test, removed (with its directory) when dropped; a library
/// loaded from it stays usable.
struct Built {
    path: PathBuf,
    _dir: Scratch,
}

/// Compiles `source` into a shared library named `name` in a fresh directory.
fn build_library(name: &str, source: &str) -> Built {
    let dir = Scratch::new(name);
    let c = dir.0.join(format!("{name}.c"));
    let so = dir.0.join(format!("lib{name}.so"));
    std::fs::write(&c, source).unwrap();
    let compiler = ["TARGET_CC", "CC"]
        .iter()
        .find_map(|var| std::env::var(var).ok().filter(|v| !v.is_empty()))
        .unwrap_or_else(|| "cc".into());
    let status = Command::new(&compiler)
        .args(["-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(&c)
        .status()
        .unwrap_or_else(|e| panic!("a C compiler (`{compiler}`) builds the stand-ins: {e}"));
    assert!(status.success(), "`{compiler}` failed for {name}");
    Built {
        path: so,
        _dir: dir,
    }
}

fn load(path: &Path) -> Result<CudaDriver, LoadError> {
    // SAFETY: the libraries loaded here are the test's own, with no initialisers, or do not exist.
    unsafe { CudaDriver::load_from(path) }
}

#[test]
fn nonexistent_path_is_a_typed_error_naming_it() {
    let path = Path::new("/nonexistent/atlas/libcuda.so");
    let err = load(path).err().expect("loading a missing file fails");
    assert_eq!(err.attempts.len(), 1);
    assert_eq!(err.attempts[0].path, path);
    let text = err.to_string();
    assert!(text.contains("/nonexistent/atlas/libcuda.so"), "{text}");
    assert!(
        text.contains("cannot load the CUDA driver library"),
        "{text}"
    );
}

#[test]
fn file_that_is_not_a_library_is_a_typed_error_naming_it() {
    let dir = Scratch::new("text");
    let path = dir.0.join("text.so");
    std::fs::write(&path, "this is not a shared library\n").unwrap();
    let text = load(&path)
        .err()
        .expect("loading a text file fails")
        .to_string();
    assert!(text.contains(&*path.to_string_lossy()), "{text}");
}

#[test]
fn library_that_is_not_cuda_is_rejected_naming_it() {
    let built = build_library("notcuda", NOT_CUDA);
    let path = &built.path;
    let text = load(path)
        .err()
        .expect("a library without cuInit is not a driver")
        .to_string();
    assert!(text.contains(&*path.to_string_lossy()), "{text}");
    assert!(text.contains("not a CUDA driver library"), "{text}");
}

#[test]
fn present_symbols_work_and_a_missing_one_is_named() {
    let driver = load(&build_library("fakecuda", FAKE_DRIVER).path).expect("the stand-in loads");
    let init = entry!(driver, cuInit).expect("cuInit is exported");
    // SAFETY: the stand-in's cuInit takes flags by value.
    assert_eq!(unsafe { init(0) }, CUresult::CUDA_SUCCESS);
    let version = entry!(driver, cuDriverGetVersion).expect("cuDriverGetVersion is exported");
    let mut v = 0;
    // SAFETY: the pointer is to a live c_int.
    assert_eq!(unsafe { version(&mut v) }, CUresult::CUDA_SUCCESS);
    assert_eq!(v, 12090);

    let missing = entry!(driver, cuMemGetInfo_v2)
        .err()
        .expect("the stand-in lacks cuMemGetInfo_v2");
    assert_eq!(missing.name, "cuMemGetInfo_v2");
    assert!(
        missing
            .to_string()
            .contains("does not export cuMemGetInfo_v2"),
        "{missing}"
    );
}

#[test]
fn generated_method_for_a_missing_symbol_returns_not_found() {
    let driver =
        load(&build_library("fakecuda-methods", FAKE_DRIVER).path).expect("the stand-in loads");
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: the pointers are to live usizes; the stand-in lacks the function, so nothing is called.
    let status = unsafe { driver.cuMemGetInfo_v2(&mut free, &mut total) };
    assert_eq!(status, CUresult::CUDA_ERROR_NOT_FOUND);
    assert_eq!((free, total), (0, 0), "nothing was called");

    // The methods of exported functions call them.
    // SAFETY: the stand-in's cuInit takes flags by value.
    assert_eq!(unsafe { driver.cuInit(0) }, CUresult::CUDA_SUCCESS);
    let mut v = 0;
    // SAFETY: the pointer is to a live c_int.
    let status = unsafe { driver.cuDriverGetVersion(&mut v) };
    assert_eq!(status, CUresult::CUDA_SUCCESS);
    assert_eq!(v, 12090);
}

/// Runs in a child process (see `process_wide_driver_honours_the_override`): prints what
/// `driver()` returned.
#[test]
#[ignore = "run by process_wide_driver_honours_the_override in a child process"]
fn child_print_driver_outcome() {
    match atlas_sys::driver() {
        Ok(_) => println!("OUTCOME: loaded"),
        Err(e) => println!("OUTCOME: {e}"),
    }
}

/// Runs the ignored test `child` in a child process with `var` set to `value`, and returns the
/// outcome it printed.
fn child_outcome(child: &str, var: &str, value: &str) -> String {
    let exe = std::env::current_exe().unwrap();
    let runner = std::env::var("ATLAS_TEST_RUNNER").unwrap_or_default();
    let mut words = runner.split_whitespace();
    let mut command = match words.next() {
        Some(program) => {
            let mut command = Command::new(program);
            command.args(words).arg(exe);
            command
        }
        None => Command::new(exe),
    };
    let out = command
        .args([
            child,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(var, value)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed: {stdout}{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stdout
        .lines()
        .find_map(|l| {
            l.split_once("OUTCOME: ")
                .map(|(_, outcome)| outcome.to_string())
        })
        .unwrap_or_else(|| panic!("child printed no outcome: {stdout}{stderr}"))
}

#[test]
fn process_wide_driver_honours_the_override() {
    let line = child_outcome(
        "child_print_driver_outcome",
        atlas_sys::LIBCUDA_PATH_VAR,
        "/nonexistent/libcuda.so",
    );
    assert!(line.contains("/nonexistent/libcuda.so"), "{line}");
    assert!(
        !line.contains("libcuda.so.1"),
        "the override must replace the search: {line}"
    );
}

#[test]
fn nvrtc_loads_through_the_same_search_and_names_a_missing_entry_point() {
    let built = build_library("fakenvrtc", FAKE_NVRTC);
    // SAFETY: the stand-in has no initialisers and its one function has nvrtc.h's signature.
    let nvrtc = unsafe { Nvrtc::load_from(&built.path) }.expect("the stand-in NVRTC loads");
    let version = entry!(nvrtc, nvrtcVersion).expect("nvrtcVersion is exported");
    let (mut major, mut minor) = (0, 0);
    // SAFETY: both pointers are to live c_ints.
    let status = unsafe { version(&mut major, &mut minor) };
    assert_eq!(status, nvrtcResult::NVRTC_SUCCESS);
    assert_eq!((major, minor), (12, 9));

    let missing = entry!(nvrtc, nvrtcCompileProgram)
        .err()
        .expect("the stand-in lacks nvrtcCompileProgram");
    assert_eq!(missing.name, "nvrtcCompileProgram");
    assert_eq!(missing.library, "NVRTC");
    assert!(
        missing
            .to_string()
            .starts_with("NVRTC does not export nvrtcCompileProgram"),
        "{missing}"
    );
    // The generated methods return an error status instead of calling nothing.
    // SAFETY: the stand-in lacks the function, so nothing is called.
    let status = unsafe { nvrtc.nvrtcCompileProgram(std::ptr::null_mut(), 0, std::ptr::null()) };
    assert_eq!(status, nvrtcResult::NVRTC_ERROR_INTERNAL_ERROR);
    // SAFETY: as above.
    assert!(unsafe { nvrtc.nvrtcGetErrorString(nvrtcResult::NVRTC_SUCCESS) }.is_null());

    // The driver's missing-symbol text is as it was.
    let driver =
        load(&build_library("fakecuda-named", FAKE_DRIVER).path).expect("the stand-in loads");
    let missing = entry!(driver, cuMemAlloc_v2).err().expect("missing");
    assert!(
        missing
            .to_string()
            .starts_with("the CUDA driver library does not export cuMemAlloc_v2"),
        "{missing}"
    );
}

#[test]
fn a_library_that_is_not_nvrtc_is_rejected_naming_it() {
    let built = build_library("notnvrtc", NOT_CUDA);
    let path = &built.path;
    // SAFETY: the library is the test's own, with no initialisers.
    let err = unsafe { Nvrtc::load_from(path) }
        .err()
        .expect("a library without nvrtcVersion is not NVRTC");
    let text = err.to_string();
    assert!(text.contains(&*path.to_string_lossy()), "{text}");
    assert!(text.contains("not an NVRTC library"), "{text}");
    // A path given to `load_from` was chosen by the caller: no advice about the search.
    assert!(!text.contains(atlas_sys::NVRTC_PATH_VAR), "{text}");
}

/// Runs in a child process (see `process_wide_nvrtc_honours_the_override`).
#[test]
#[ignore = "run by process_wide_nvrtc_honours_the_override in a child process"]
fn child_print_nvrtc_outcome() {
    match atlas_sys::nvrtc() {
        Ok(_) => println!("OUTCOME: loaded"),
        Err(e) => println!("OUTCOME: {e}"),
    }
}

#[test]
fn process_wide_nvrtc_honours_the_override() {
    let line = child_outcome(
        "child_print_nvrtc_outcome",
        atlas_sys::NVRTC_PATH_VAR,
        "/nonexistent/libnvrtc.so.12",
    );
    assert!(line.starts_with("cannot load NVRTC"), "{line}");
    assert!(line.contains("/nonexistent/libnvrtc.so.12"), "{line}");
    assert!(
        !line.contains("libnvrtc.so.13"),
        "the override must replace the search: {line}"
    );
}
