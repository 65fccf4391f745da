//! A libcuda in front of another one: how a test plays an older driver or a profiler's injection
//! library on a real GPU ([`build`]: entry points left out), and how it sees every driver call
//! that fails ([`recorder`]).
//!
//! [`build`]'s shim exports every driver function that atlas-sys declares, except the hidden ones,
//! each as a trampoline of a few instructions that jumps through a table filled in when the shim
//! is loaded (from the real `libcuda.so.1`, or the library [`hiding`] is given, opened with
//! `dlopen`). A function the driver behind lacks jumps to a stub that returns
//! `CUDA_ERROR_NOT_FOUND`. Point `ATLAS_LIBCUDA_PATH` at it in a child process.
//!
//! The trampolines are assembly, for x86-64 and AArch64 Linux (the GPU machines the tests run on
//! are of both kinds). The AArch64 ones start with a `bti c` landing pad (a no-op where the
//! processor has no branch target identification), since the C compiler may mark the library as
//! protected by it, and Atlas reaches every entry point through a function pointer.

use std::ffi::{CStr, c_char, c_uint, c_ulonglong};
use std::path::{Path, PathBuf};

use super::cc;

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

/// The shim's C source: every function of [`driver_functions`] but `hidden`, in front of `target`
/// (a path, or `libcuda.so.1` for the real driver).
pub fn source(target: &str, hidden: &[&str]) -> String {
    let names: Vec<&str> = driver_functions()
        .into_iter()
        .filter(|name| !hidden.contains(name))
        .collect();
    let mut c = format!(
        "#include <dlfcn.h>\n\
         static int missing(void) {{ return 500; /* CUDA_ERROR_NOT_FOUND */ }}\n\
         static const char *const target = \"{}\";\n",
        target.escape_default()
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
          \x20   void *real = dlopen(target, RTLD_NOW | RTLD_LOCAL);\n\
          \x20   for (unsigned i = 0; i < sizeof names / sizeof names[0]; i++) {\n\
          \x20       void *f = real ? dlsym(real, names[i]) : 0;\n\
          \x20       atlas_shim_slots[i] = f ? f : (void *)missing;\n\
          \x20   }\n\
          }\n";
    let mut asm = String::new();
    for (i, name) in names.iter().enumerate() {
        asm += &format!("{}{}\n", function(name), jump_through_slot(i));
    }
    c += &top_level_asm(&asm);
    c
}

/// The assembler's lines that start the exported function `name`.
fn function(name: &str) -> String {
    format!(".globl {name}\n.type {name},%function\n{name}:\n{LANDING_PAD}")
}

/// The first instruction of every trampoline, where an indirect call lands.
#[cfg(target_arch = "x86_64")]
const LANDING_PAD: &str = "";
/// The first instruction of every trampoline, where an indirect call lands: `bti c`, written as
/// the hint it is so that any assembler takes it.
#[cfg(target_arch = "aarch64")]
const LANDING_PAD: &str = "  hint #34\n";

/// A tail jump to the function in slot `i` of `atlas_shim_slots`, the arguments untouched.
#[cfg(target_arch = "x86_64")]
fn jump_through_slot(i: usize) -> String {
    format!("  jmp *atlas_shim_slots+{}(%rip)", i * 8)
}

/// A tail jump to the function in slot `i` of `atlas_shim_slots`, the arguments untouched: through
/// `x16`, the register the procedure call standard leaves to veneers like this one.
#[cfg(target_arch = "aarch64")]
fn jump_through_slot(i: usize) -> String {
    let slot = format!("atlas_shim_slots+{}", i * 8);
    format!("  adrp x16, {slot}\n  ldr x16, [x16, #:lo12:{slot}]\n  br x16")
}

/// `asm` (assembler lines) as a top-level `__asm__` statement of C, in the text section.
fn top_level_asm(asm: &str) -> String {
    let mut c = String::from("__asm__(\n    \".text\\n\"\n");
    for line in asm.lines() {
        c += &format!("    \"{}\\n\"\n", line.replace('"', "\\\""));
    }
    c += ");\n";
    c
}

/// Builds the shim hiding `hidden` in front of the real driver and returns its path.
/// `ATLAS_CUDA_SHIM` names a prebuilt one instead (for machines without a C compiler).
pub fn build(hidden: &[&str]) -> PathBuf {
    if let Some(prebuilt) = std::env::var_os("ATLAS_CUDA_SHIM") {
        return PathBuf::from(prebuilt);
    }
    hiding(Path::new("libcuda.so.1"), hidden)
}

/// Builds the shim hiding `hidden` in front of `target` (a path, or `libcuda.so.1` for the real
/// driver) and returns its path.
pub fn hiding(target: &Path, hidden: &[&str]) -> PathBuf {
    let target = target.to_str().expect("a UTF-8 path");
    cc::library(
        "the libcuda shim",
        "cuda-shim",
        &source(target, hidden),
        &["-O1", "-ldl"],
    )
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
    cc::library(
        "the libcuda recorder",
        "cuda-recorder",
        &recorder_source(target, &names),
        &["-O1", "-ldl"],
    )
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
    let mut asm = String::new();
    for (i, name) in names.iter().enumerate() {
        asm += &format!("{}{}\n", function(name), record_entry(i));
    }
    asm += RECORDER_TRAMPOLINE;
    c += &top_level_asm(&asm);
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

/// The start of the recorder's trampoline of entry point `i`: its index in `r11d`, for
/// [`RECORDER_TRAMPOLINE`].
#[cfg(target_arch = "x86_64")]
fn record_entry(i: usize) -> String {
    format!("  movl ${i}, %r11d\n  jmp atlas_shim_record")
}

/// The start of the recorder's trampoline of entry point `i`: its index in `w17`, for
/// [`RECORDER_TRAMPOLINE`].
#[cfg(target_arch = "aarch64")]
fn record_entry(i: usize) -> String {
    format!("  mov w17, #{i}\n  b atlas_shim_record")
}

/// The common part of every trampoline, entered with the entry point's index in `r11d`: the
/// argument registers (integer and vector) are kept across `atlas_shim_enter`, the caller's return
/// address is taken off the stack so that the callee finds its stack arguments where the caller
/// put them, and after the call `atlas_shim_leave` gives the return address back.
#[cfg(target_arch = "x86_64")]
const RECORDER_TRAMPOLINE: &str = "atlas_shim_record:
  pushq %rdi
  pushq %rsi
  pushq %rdx
  pushq %rcx
  pushq %r8
  pushq %r9
  subq $136, %rsp
  movdqu %xmm0, 0(%rsp)
  movdqu %xmm1, 16(%rsp)
  movdqu %xmm2, 32(%rsp)
  movdqu %xmm3, 48(%rsp)
  movdqu %xmm4, 64(%rsp)
  movdqu %xmm5, 80(%rsp)
  movdqu %xmm6, 96(%rsp)
  movdqu %xmm7, 112(%rsp)
  movl %r11d, %edi
  movq 184(%rsp), %rsi
  call atlas_shim_enter
  movq %rax, %r11
  movdqu 0(%rsp), %xmm0
  movdqu 16(%rsp), %xmm1
  movdqu 32(%rsp), %xmm2
  movdqu 48(%rsp), %xmm3
  movdqu 64(%rsp), %xmm4
  movdqu 80(%rsp), %xmm5
  movdqu 96(%rsp), %xmm6
  movdqu 112(%rsp), %xmm7
  addq $136, %rsp
  popq %r9
  popq %r8
  popq %rcx
  popq %rdx
  popq %rsi
  popq %rdi
  addq $8, %rsp
  call *%r11
  subq $8, %rsp
  pushq %rax
  movl %eax, %edi
  call atlas_shim_leave
  movq %rax, 8(%rsp)
  popq %rax
  ret
";

/// The common part of every trampoline, entered with the entry point's index in `w17` and the
/// caller's return address in the link register: the argument registers (`x0`-`x7`, `x8` for a
/// returned structure, `q0`-`q7`) are kept across `atlas_shim_enter`, the stack pointer is back
/// where the caller left it (its stack arguments where it put them) when the callee is called,
/// and after the call `atlas_shim_leave` gives the return address back. The stack pointer stays
/// 16-byte aligned throughout, as the procedure call standard requires.
#[cfg(target_arch = "aarch64")]
const RECORDER_TRAMPOLINE: &str = "atlas_shim_record:
  sub sp, sp, #208
  stp x0, x1, [sp, #0]
  stp x2, x3, [sp, #16]
  stp x4, x5, [sp, #32]
  stp x6, x7, [sp, #48]
  str x8, [sp, #64]
  stp q0, q1, [sp, #80]
  stp q2, q3, [sp, #112]
  stp q4, q5, [sp, #144]
  stp q6, q7, [sp, #176]
  mov w0, w17
  mov x1, x30
  bl atlas_shim_enter
  mov x16, x0
  ldp q6, q7, [sp, #176]
  ldp q4, q5, [sp, #144]
  ldp q2, q3, [sp, #112]
  ldp q0, q1, [sp, #80]
  ldr x8, [sp, #64]
  ldp x6, x7, [sp, #48]
  ldp x4, x5, [sp, #32]
  ldp x2, x3, [sp, #16]
  ldp x0, x1, [sp, #0]
  add sp, sp, #208
  blr x16
  sub sp, sp, #16
  str x0, [sp]
  bl atlas_shim_leave
  mov x30, x0
  ldr x0, [sp]
  add sp, sp, #16
  ret
";

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
