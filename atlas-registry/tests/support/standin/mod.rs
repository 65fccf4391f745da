//! A stand-in libcuda (`standin.c`) for tests that need no GPU: built at test time, and made the
//! driver of a child process (see [`super::child`]) that runs one test body.
//!
//! ```ignore
//! mod support;
//! use support::{child, standin};
//!
//! child::bodies!(launch_counts_one, no_param_info_means_none);
//!
//! #[test]
//! fn launch_is_counted() {
//!     standin::run(launch_counts_one, &[]);
//! }
//!
//! #[test]
//! fn older_driver_has_no_param_info() {
//!     standin::run(no_param_info_means_none, &["-DSTANDIN_NO_PARAM_INFO"]);
//! }
//!
//! fn launch_counts_one() {
//!     // ... Atlas calls; the stand-in is the driver here ...
//!     assert_eq!(standin::probe().launches(), 1);
//! }
//! # fn no_param_info_means_none() {}
//! ```
//!
//! [`run`] asserts that the child passed; [`run_any`] returns how it ended
//! ([`Ending`](super::child::Ending)), for tests that tell a crash from a refusal or read what the
//! child printed. Variants are `-D` switches of `standin.c` (its header lists them):
//! `-DSTANDIN_DEVICES=2`, `-DSTANDIN_NO_PARAM_INFO`, `-DSTANDIN_NO_LIBRARY`,
//! `-DSTANDIN_NO_MEMORY_POOLS`, `-DSTANDIN_NO_MEMORY_POOL_API`,
//! `-DSTANDIN_NO_LAUNCH_EX`, `-DSTANDIN_CC_MAJOR=8`, `-DSTANDIN_CC_MINOR=6`, `-DSTANDIN_CC1=80`,
//! `-DSTANDIN_DRIVER_VERSION=12040`, `-DSTANDIN_NO_COOPERATIVE`,
//! `-DSTANDIN_NO_CONDITIONAL`, `-DSTANDIN_NO_UUID_V2`, `-DSTANDIN_NO_PEER_ACCESS`,
//! `-DSTANDIN_NO_POSIX_FD`, `-DSTANDIN_NO_IPC`, `-DSTANDIN_NO_VIRTUAL_MEMORY_API`,
//! `-DSTANDIN_NO_VIRTUAL_MEMORY`, `-DSTANDIN_NO_GREEN_CONTEXTS`. Inside a child,
//! [`probe`] reads what the stand-in saw (calls, contexts, limits) and injects failures.

use std::any::type_name;
use std::ffi::{CString, c_char, c_int, c_longlong, c_uint};
use std::path::PathBuf;
use std::sync::OnceLock;

use atlas_registry::sys::{CUcontext, CUdeviceptr, CUfunction, CUmodule, LIBCUDA_PATH_VAR};

use super::cc;
use super::child::{self, Child, Ending};

/// The stand-in's C source, compiled at test time.
const SOURCE: &str = include_str!("standin.c");
/// The stand-in library built with `variant` (`-D` switches, e.g. `["-DSTANDIN_DEVICES=2"]`).
///
/// Built once per variant and C compiler under `target/` (see [`cc`]) and reused by later runs
/// and other test binaries. Panics, saying what to install, when there is no C compiler.
pub fn build(variant: &[&str]) -> PathBuf {
    for flag in variant {
        assert!(
            flag.starts_with("-D"),
            "stand-in variants are -D switches of standin.c, not `{flag}`"
        );
    }
    let mut flags = vec!["-O1", "-Wall", "-Wextra", "-pthread"];
    flags.extend_from_slice(variant);
    cc::library("the stand-in libcuda", "cuda-standin", SOURCE, &flags)
}

/// Runs `body` in a child process whose driver is the stand-in built with `variant`, and asserts
/// that it passed (printing its output when not). `body` must be listed in
/// [`bodies!`](super::child::bodies).
#[track_caller]
pub fn run<F: Fn()>(body: F, variant: &[&str]) -> Child {
    let child = run_any(body, variant);
    assert_eq!(
        child.ending,
        Ending::Passed,
        "stand-in body `{}` with {variant:?}: {child}",
        type_name::<F>()
    );
    child
}

/// As [`run`], without the assertion: how the child ended and what it wrote.
pub fn run_any<F: Fn()>(body: F, variant: &[&str]) -> Child {
    child::run_on(body, Some(&build(variant)))
}

/// The stand-in's inspection functions, reached from inside a child (see [`probe`]).
pub struct Probe {
    count: unsafe extern "C" fn(*const c_char) -> c_longlong,
    inject: unsafe extern "C" fn(*const c_char, c_uint, c_uint) -> c_int,
    reset: unsafe extern "C" fn(),
    primary_context: unsafe extern "C" fn(c_int) -> CUcontext,
    last_alloc_context: unsafe extern "C" fn() -> CUcontext,
    last_module_context: unsafe extern "C" fn() -> CUcontext,
    last_copy_context: unsafe extern "C" fn() -> CUcontext,
    last_launch_context: unsafe extern "C" fn() -> CUcontext,
    pointer_context: unsafe extern "C" fn(CUdeviceptr) -> CUcontext,
    max_dynamic_shared: unsafe extern "C" fn(CUfunction) -> c_int,
    module_image: unsafe extern "C" fn(CUmodule) -> *const std::ffi::c_void,
    init: unsafe extern "C" fn(c_uint) -> c_uint,
    ctx_create: unsafe extern "C" fn(*mut CUcontext, c_uint, c_int) -> c_uint,
    ctx_get_current: unsafe extern "C" fn(*mut CUcontext) -> c_uint,
    last_attribute: unsafe extern "C" fn(c_int, *mut c_longlong) -> c_int,
    peer_enabled: unsafe extern "C" fn(c_int, c_int) -> c_int,
    /// Keeps the functions above loaded; the probe lives in a static, so they always are.
    _library: libloading::Library,
}

/// The stand-in this child process runs with: the library `ATLAS_LIBCUDA_PATH` names, opened again
/// (the loader hands back the very library Atlas uses). Panics outside a stand-in child.
pub fn probe() -> &'static Probe {
    static PROBE: OnceLock<Probe> = OnceLock::new();
    PROBE.get_or_init(|| {
        let path = std::env::var_os(LIBCUDA_PATH_VAR)
            .expect("standin::probe() works inside a body run by standin::run");
        // SAFETY: the path names the stand-in built by `build`, whose loading runs no initialiser.
        let library = unsafe { libloading::Library::new(&path) }
            .unwrap_or_else(|e| panic!("cannot open the stand-in {path:?}: {e}"));
        fn get<T: Copy>(library: &libloading::Library, name: &str) -> T {
            // SAFETY: each `T` asked for below is the C signature of `name` in standin.c (or, for
            // the cu* names, in cuda.h, which standin.c follows).
            let symbol = unsafe { library.get::<T>(name.as_bytes()) };
            *symbol.unwrap_or_else(|e| panic!("the stand-in lacks {name}: {e}"))
        }
        Probe {
            count: get(&library, "standin_count"),
            inject: get(&library, "standin_inject"),
            reset: get(&library, "standin_reset"),
            primary_context: get(&library, "standin_primary_context"),
            last_alloc_context: get(&library, "standin_last_alloc_context"),
            last_module_context: get(&library, "standin_last_module_context"),
            last_copy_context: get(&library, "standin_last_copy_context"),
            last_launch_context: get(&library, "standin_last_launch_context"),
            pointer_context: get(&library, "standin_pointer_context"),
            max_dynamic_shared: get(&library, "standin_max_dynamic_shared"),
            module_image: get(&library, "standin_module_image"),
            init: get(&library, "cuInit"),
            ctx_create: get(&library, "cuCtxCreate_v2"),
            ctx_get_current: get(&library, "cuCtxGetCurrent"),
            last_attribute: get(&library, "standin_last_attribute"),
            peer_enabled: get(&library, "standin_peer_enabled"),
            _library: library,
        }
    })
}

impl Probe {
    /// How many times entry point `what` was called (`"cuLaunchKernel"`, failed calls included;
    /// `"calls"`: every entry point), how often an event happened (`"stale_handle"`: a destroyed
    /// or unloaded handle was used; `"context_mismatch"`: a launch on a stream of another context
    /// than the function's, or a copy or fill of memory of another context than its stream's;
    /// `"fault"`: a kernel, or a replayed copy or fill, touched what it may not and lost its
    /// context; `"graph_race"`: two calls used one graph at once; `"copy_overlap"`: a copy between
    /// overlapping memory), or how many of a thing are alive (`"live_allocations"`,
    /// `"live_modules"`, `"live_graphs"`, `"live_execs"`, `"live_pools"`: pools made by
    /// `cuMemPoolCreate`, `"live_imports"`: pointers imported from pools; of virtual memory
    /// `"live_reservations"`, `"live_physical"`, `"live_mappings"`). Counts run from the start or the last
    /// [`reset`](Self::reset).
    pub fn count(&self, what: &str) -> u64 {
        let name = CString::new(what).expect("a name without NUL");
        // SAFETY: standin_count reads the NUL-terminated string, which lives across the call.
        let n = unsafe { (self.count)(name.as_ptr()) };
        u64::try_from(n).unwrap_or_else(|_| panic!("the stand-in does not count `{what}`"))
    }

    /// How many times `cuLaunchKernel` was called.
    pub fn launches(&self) -> u64 {
        self.count("cuLaunchKernel")
    }

    /// Makes the next `times` calls of entry point `entry` fail with `code`, doing nothing else.
    pub fn inject(&self, entry: &str, code: u32, times: u32) {
        let name = CString::new(entry).expect("a name without NUL");
        // SAFETY: as for `count`; the other arguments are plain integers.
        let known = unsafe { (self.inject)(name.as_ptr(), code, times) };
        assert_eq!(known, 0, "the stand-in has no entry point `{entry}`");
    }

    /// Zeroes every counter and last-context record and cancels pending injections.
    pub fn reset(&self) {
        // SAFETY: no arguments; the stand-in locks its own state.
        unsafe { (self.reset)() }
    }

    /// The primary context of `device` (null before Atlas or anyone retained it).
    pub fn primary_context(&self, device: i32) -> CUcontext {
        // SAFETY: any integer is accepted; out-of-range devices give null.
        unsafe { (self.primary_context)(device) }
    }

    /// The context current at the last successful `cuMemAlloc_v2`.
    pub fn last_alloc_context(&self) -> CUcontext {
        // SAFETY: no arguments.
        unsafe { (self.last_alloc_context)() }
    }

    /// The context of the last successful module load (`cuModuleLoadData`/`Ex`, or the first
    /// `cuLibraryGetModule` of a library in a context).
    pub fn last_module_context(&self) -> CUcontext {
        // SAFETY: no arguments.
        unsafe { (self.last_module_context)() }
    }

    /// The context current on the calling thread at the last successful host/device copy.
    pub fn last_copy_context(&self) -> CUcontext {
        // SAFETY: no arguments.
        unsafe { (self.last_copy_context)() }
    }

    /// The context the last launch that reached a kernel ran in (its stream's).
    pub fn last_launch_context(&self) -> CUcontext {
        // SAFETY: no arguments.
        unsafe { (self.last_launch_context)() }
    }

    /// The context of the live allocation (or `__device__` variable) holding `ptr`; null if none.
    pub fn pointer_context(&self, ptr: CUdeviceptr) -> CUcontext {
        // SAFETY: the stand-in only compares the address with its allocation table.
        unsafe { (self.pointer_context)(ptr) }
    }

    /// The function's current `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` (49152 until
    /// someone sets it), or `None` when `func` is not a function handle of the stand-in.
    pub fn max_dynamic_shared(&self, func: CUfunction) -> Option<u32> {
        // SAFETY: the stand-in checks that the handle is one of its own before reading it.
        let value = unsafe { (self.max_dynamic_shared)(func) };
        u32::try_from(value).ok()
    }

    /// The address of the image `module` was loaded from (its library's, for a module of a
    /// library), or null when `module` is not a module of the stand-in.
    pub fn module_image(&self, module: CUmodule) -> *const u8 {
        // SAFETY: the stand-in checks that the handle is one of its own before reading it.
        unsafe { (self.module_image)(module) }.cast()
    }

    /// The context current on the calling thread (null if none).
    pub fn current_context(&self) -> CUcontext {
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: `ctx` is a live out-pointer.
        let status = unsafe { (self.ctx_get_current)(&mut ctx) };
        assert_eq!(status, 0, "cuCtxGetCurrent");
        ctx
    }

    /// How many attributes the last `cuLaunchKernelEx` that reached a kernel carried.
    pub fn launch_attribute_count(&self) -> u32 {
        // SAFETY: id -1 asks for the count; no out-pointer is written.
        let n = unsafe { (self.last_attribute)(-1, std::ptr::null_mut()) };
        u32::try_from(n).expect("a count")
    }

    /// The value of attribute `id` (a `CUlaunchAttributeID`) of the last `cuLaunchKernelEx` that
    /// reached a kernel, or `None` when it did not carry it: a scalar in `[0]`, a cluster's
    /// dimensions in `[0..3]`, an event's (is set, flags, trigger at block start).
    pub fn launch_attribute(&self, id: u32) -> Option<[i64; 3]> {
        let mut out = [0 as c_longlong; 3];
        let id = c_int::try_from(id).expect("an attribute id");
        // SAFETY: `out` has room for the three values the stand-in writes.
        let found = unsafe { (self.last_attribute)(id, out.as_mut_ptr()) };
        (found == 1).then_some(out)
    }

    /// Whether the context of `device` enabled direct access to the memory of device `peer`
    /// (`cuCtxEnablePeerAccess`).
    pub fn peer_enabled(&self, device: i32, peer: i32) -> bool {
        // SAFETY: any integers are accepted; out-of-range devices give 0.
        unsafe { (self.peer_enabled)(device, peer) != 0 }
    }

    /// Plays another library: creates a new context on `device` and makes it current on the
    /// calling thread (`cuCtxCreate_v2`), behind Atlas's back. Returns it.
    pub fn foreign_context(&self, device: i32) -> CUcontext {
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: cuInit takes flags by value and may be called again; `ctx` is a live out-pointer.
        let status = unsafe {
            assert_eq!((self.init)(0), 0, "cuInit");
            (self.ctx_create)(&mut ctx, 0, device)
        };
        assert_eq!(status, 0, "cuCtxCreate_v2 on device {device}");
        ctx
    }
}

/// Batched copies (`cuMemcpyBatchAsync`).
impl Probe {
    /// Makes the next `cuMemcpyBatchAsync` of more than `index` copies fail at copy `index` with
    /// `code`, reporting `index` as its `failIdx`, as the driver does for a copy it refuses.
    pub fn fail_batch_at(&self, index: usize, code: u32) {
        // SAFETY: the signature of standin_fail_batch_at in standin.c.
        let fail = unsafe {
            self._library
                .get::<unsafe extern "C" fn(usize, c_uint)>(b"standin_fail_batch_at")
        }
        .unwrap_or_else(|e| panic!("the stand-in lacks standin_fail_batch_at: {e}"));
        // SAFETY: plain integers; the stand-in locks its own state.
        unsafe { fail(index, code) }
    }
}
