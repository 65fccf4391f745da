//! A libcuda in front of another one: how a test plays an older driver or a profiler's injection
//! library on a real GPU ([`build`]: entry points left out), and how it sees every driver call
//! that fails ([`recorder`]).
//!
//! [`build`]'s shim exports every driver function that atlas-sys declares, except the hidden ones,
//! each as a two-instruction trampoline that jumps through a table filled in when the shim is
//! loaded (from the real `libcuda.so.1`, opened with `dlopen`). A function the real driver lacks
//! jumps to a stub that returns `CUDA_ERROR_NOT_FOUND`. Point `ATLAS_LIBCUDA_PATH` at it in a
//! child process. x86-64 Linux only, like the GPU machines the tests run on.

use std::ffi::{CStr, c_char, c_uint, c_ulonglong};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The driver functions atlas-sys declares: the fields of its generated `CudaDriver` table.
fn driver_functions() -> Vec<&'static str> {
    const BINDINGS: &str = include_str!("../../../atlas-sys/src/bindings.rs");
    BINDINGS
        .lines()
        .skip_while(|line| !line.starts_with("pub struct CudaDriver {"))
        .take_while(|line| *line != "}")
        .filter_map(|line| line.strip_prefix("    pub "))
        .filter_map(|rest| rest.split_once(':').map(|(name, _)| name))
        .filter(|name| name.starts_with("cu"))
        .collect()
}

/// The shim's C source: every function of [`driver_functions`] but `hidden`.
pub fn source(hidden: &[&str]) -> String {
    let names: Vec<&str> = driver_functions()
        .into_iter()
        .filter(|name| !hidden.contains(name))
        .collect();
    let mut c = String::from(
        "#include <dlfcn.h>\n\
         static int missing(void) { return 500; /* CUDA_ERROR_NOT_FOUND */ }\n",
    );
    c += &format!(
        "__attribute__((visibility(\"hidden\"), used)) void *atlas_shim_slots[{}];\n",
        names.len()
    );
    c += "static const char *const names[] = {\n";
    for name in &names {
        c += &format!("    \"{name}\",\n");
    }
    c += "};\n";
    c += "__attribute__((constructor)) static void atlas_shim_load(void) {\n\
          \x20   void *real = dlopen(\"libcuda.so.1\", RTLD_NOW | RTLD_LOCAL);\n\
          \x20   for (unsigned i = 0; i < sizeof names / sizeof names[0]; i++) {\n\
          \x20       void *f = real ? dlsym(real, names[i]) : 0;\n\
          \x20       atlas_shim_slots[i] = f ? f : (void *)missing;\n\
          \x20   }\n\
          }\n";
    c += "__asm__(\n    \".text\\n\"\n";
    for (i, name) in names.iter().enumerate() {
        c += &format!(
            "    \".globl {name}\\n.type {name},@function\\n{name}: jmp *atlas_shim_slots+{}(%rip)\\n\"\n",
            i * 8
        );
    }
    c += ");\n";
    c
}

/// Builds the shim hiding `hidden` into a fresh directory and returns its path. `ATLAS_CUDA_SHIM`
/// names a prebuilt one instead (for machines without a C compiler).
pub fn build(hidden: &[&str]) -> PathBuf {
    if let Some(prebuilt) = std::env::var_os("ATLAS_CUDA_SHIM") {
        return PathBuf::from(prebuilt);
    }
    compile(&format!("shim-{}", hidden.join("-")), &source(hidden))
}

/// Compiles the C `source` into `libcuda-shim.so` in a fresh directory named after `what`.
fn compile(what: &str, source: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("atlas-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory for the shim");
    let (c, so) = (dir.join("shim.c"), dir.join("libcuda-shim.so"));
    std::fs::write(&c, source).expect("write the shim's source");
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&so)
        .arg(&c)
        .arg("-ldl")
        .status()
        .expect("a C compiler (cc) builds the libcuda shim");
    assert!(status.success(), "cc failed to build the libcuda shim");
    so
}

// ---------------------------------------------------------------------------------------------
// The recorder: every failed call, as the driver answered it
// ---------------------------------------------------------------------------------------------

/// Builds a libcuda in front of `target` (a path, or `libcuda.so.1` for the real driver) that
/// records every call returning a status other than `CUDA_SUCCESS`, and returns its path: point
/// `ATLAS_LIBCUDA_PATH` at it in a child process and read [`failed_calls`] there.
///
/// It exports exactly the driver functions (of those atlas-sys declares) that `target` exports, so
/// Atlas sees the same driver. Each is a trampoline that keeps the caller's return address on a
/// per-thread stack, calls `target`'s function with the arguments untouched (registers and stack
/// as the caller left them), records a failure, and returns the status to the caller.
pub fn recorder(target: &Path) -> PathBuf {
    // SAFETY: `target` is the stand-in, whose loading runs no initialiser, or the real driver,
    // which initialises nothing before cuInit; the library is only asked which names it exports.
    let library = unsafe { libloading::Library::new(target) }
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", target.display()));
    let names: Vec<&str> = driver_functions()
        .into_iter()
        // SAFETY: the symbol is only looked up, never called.
        .filter(|name| unsafe { library.get::<*const ()>(name.as_bytes()) }.is_ok())
        .collect();
    let target = target.to_str().expect("a UTF-8 path");
    compile("recorder", &recorder_source(target, &names))
}

/// The recorder's C source, in front of `target`, exporting `names`.
fn recorder_source(target: &str, names: &[&str]) -> String {
    let mut c = format!(
        "{RECORDER}\nstatic const char *const target = \"{}\";\n",
        target.escape_default()
    );
    c += &format!(
        "#define ENTRIES {}\nconst char *const atlas_shim_names[] = {{\n",
        names.len()
    );
    for name in names {
        c += &format!("    \"{name}\",\n");
    }
    c += "};\n__attribute__((visibility(\"hidden\"), used)) void *atlas_shim_slots[ENTRIES];\n";
    c += RECORDER_LOAD;
    c += "__asm__(\n    \".text\\n\"\n";
    for (i, name) in names.iter().enumerate() {
        c += &format!(
            "    \".globl {name}\\n.type {name},@function\\n{name}: movl ${i}, %r11d\\n jmp atlas_shim_record\\n\"\n"
        );
    }
    c += RECORDER_TRAMPOLINE;
    c += ");\n";
    c
}

/// What the recorder keeps: the per-thread stack of callers and the failures, with the functions
/// the trampolines and the tests call.
const RECORDER: &str = r#"
#include <dlfcn.h>
#include <stdlib.h>

#define DEPTH 64
#define FAILURES 4096

/* The caller's return address and the entry point, per call in progress on this thread. */
static __thread struct { void *ret; unsigned entry; } frames[DEPTH];
static __thread unsigned depth;
static struct { unsigned entry, status; } failures[FAILURES];
static unsigned long long failure_count;
extern const char *const atlas_shim_names[];
extern __attribute__((visibility("hidden"))) void *atlas_shim_slots[];

/* Called by the trampoline before the call: keeps `ret`, returns the function to call. */
__attribute__((visibility("hidden"), used)) void *atlas_shim_enter(unsigned entry, void *ret) {
    if (depth == DEPTH) abort();
    frames[depth].ret = ret;
    frames[depth].entry = entry;
    depth++;
    return atlas_shim_slots[entry];
}

/* Called by the trampoline after the call: records a failure, returns where the caller goes on. */
__attribute__((visibility("hidden"), used)) void *atlas_shim_leave(unsigned status) {
    depth--;
    if (status != 0) {
        unsigned long long n = __atomic_fetch_add(&failure_count, 1, __ATOMIC_RELAXED);
        if (n < FAILURES) {
            failures[n].entry = frames[depth].entry;
            failures[n].status = status;
        }
    }
    return frames[depth].ret;
}

/* How many calls failed so far. */
unsigned long long atlas_shim_failure_count(void) {
    return __atomic_load_n(&failure_count, __ATOMIC_RELAXED);
}

/* The entry point and status of failure `i` (0 when it was not kept). */
unsigned atlas_shim_failure(unsigned long long i, const char **name) {
    if (i >= FAILURES || i >= atlas_shim_failure_count()) return 0;
    *name = atlas_shim_names[failures[i].entry];
    return failures[i].status;
}
"#;

/// The recorder's constructor: each slot is `target`'s function of that name.
const RECORDER_LOAD: &str = r#"
__attribute__((constructor)) static void atlas_shim_load(void) {
    void *real = dlopen(target, RTLD_NOW | RTLD_LOCAL);
    if (real == NULL) abort();
    for (unsigned i = 0; i < ENTRIES; i++) {
        atlas_shim_slots[i] = dlsym(real, atlas_shim_names[i]);
        if (atlas_shim_slots[i] == NULL) abort();
    }
}
"#;

/// The common part of every trampoline, entered with the entry point's index in `r11d`: the
/// argument registers (integer and vector) are kept across `atlas_shim_enter`, the caller's return
/// address is taken off the stack so that the callee finds its stack arguments where the caller
/// put them, and after the call `atlas_shim_leave` gives the return address back.
const RECORDER_TRAMPOLINE: &str = r#"    "atlas_shim_record:\n"
    "  pushq %rdi\n  pushq %rsi\n  pushq %rdx\n  pushq %rcx\n  pushq %r8\n  pushq %r9\n"
    "  subq $136, %rsp\n"
    "  movdqu %xmm0, 0(%rsp)\n  movdqu %xmm1, 16(%rsp)\n  movdqu %xmm2, 32(%rsp)\n"
    "  movdqu %xmm3, 48(%rsp)\n  movdqu %xmm4, 64(%rsp)\n  movdqu %xmm5, 80(%rsp)\n"
    "  movdqu %xmm6, 96(%rsp)\n  movdqu %xmm7, 112(%rsp)\n"
    "  movl %r11d, %edi\n  movq 184(%rsp), %rsi\n  call atlas_shim_enter\n  movq %rax, %r11\n"
    "  movdqu 0(%rsp), %xmm0\n  movdqu 16(%rsp), %xmm1\n  movdqu 32(%rsp), %xmm2\n"
    "  movdqu 48(%rsp), %xmm3\n  movdqu 64(%rsp), %xmm4\n  movdqu 80(%rsp), %xmm5\n"
    "  movdqu 96(%rsp), %xmm6\n  movdqu 112(%rsp), %xmm7\n"
    "  addq $136, %rsp\n"
    "  popq %r9\n  popq %r8\n  popq %rcx\n  popq %rdx\n  popq %rsi\n  popq %rdi\n"
    "  addq $8, %rsp\n"
    "  call *%r11\n"
    "  subq $8, %rsp\n  pushq %rax\n  movl %eax, %edi\n  call atlas_shim_leave\n"
    "  movq %rax, 8(%rsp)\n  popq %rax\n  ret\n"
"#;

/// Every call that failed so far in this process, as `(entry point, status)`, in order, read from
/// the recorder this child runs on (the library `ATLAS_LIBCUDA_PATH` names). Panics outside a
/// child run on a [`recorder`].
pub fn failed_calls() -> Vec<(String, u32)> {
    let path = std::env::var_os(atlas_registry::sys::LIBCUDA_PATH_VAR)
        .expect("failed_calls() works inside a body run on shim::recorder");
    // SAFETY: the path names the recorder this process already loaded (the loader hands back the
    // same library); its constructor has run.
    let library = unsafe { libloading::Library::new(&path) }
        .unwrap_or_else(|e| panic!("cannot open the recorder {path:?}: {e}"));
    // SAFETY: the two functions have these C signatures in RECORDER.
    let (count, failure) = unsafe {
        (
            *library
                .get::<unsafe extern "C" fn() -> c_ulonglong>(b"atlas_shim_failure_count")
                .expect("a recorder"),
            *library
                .get::<unsafe extern "C" fn(c_ulonglong, *mut *const c_char) -> c_uint>(
                    b"atlas_shim_failure",
                )
                .expect("a recorder"),
        )
    };
    // SAFETY: no arguments.
    let n = unsafe { count() };
    (0..n)
        .map(|i| {
            let mut name: *const c_char = std::ptr::null();
            // SAFETY: `name` is a live out-pointer; the recorder writes a pointer to one of its
            // static NUL-terminated names, or nothing (then it answers 0).
            let status = unsafe { failure(i, &mut name) };
            let name = if name.is_null() {
                "(not kept)".to_string()
            } else {
                // SAFETY: a static NUL-terminated name of the recorder, which stays loaded.
                unsafe { CStr::from_ptr(name) }
                    .to_string_lossy()
                    .into_owned()
            };
            (name, status)
        })
        .collect()
}
