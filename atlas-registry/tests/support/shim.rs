//! A libcuda that forwards to the real driver but leaves entry points out: how a test plays an
//! older driver or a profiler's injection library on a real GPU.
//!
//! The shim exports every driver function that atlas-sys declares, except the hidden ones, each as
//! a two-instruction trampoline that jumps through a table filled in when the shim is loaded (from
//! the real `libcuda.so.1`, opened with `dlopen`). A function the real driver lacks jumps to a stub
//! that returns `CUDA_ERROR_NOT_FOUND`. Point `ATLAS_LIBCUDA_PATH` at it in a child process.
//! x86-64 Linux only, like the GPU machines the tests run on.

use std::path::PathBuf;
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
    let dir = std::env::temp_dir().join(format!(
        "atlas-shim-{}-{}",
        std::process::id(),
        hidden.join("-")
    ));
    std::fs::create_dir_all(&dir).expect("a directory for the shim");
    let (c, so) = (dir.join("shim.c"), dir.join("libcuda-shim.so"));
    std::fs::write(&c, source(hidden)).expect("write the shim's source");
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
