//! Shared libraries that the tests build from C at test time (the stand-in libcuda, the shims in
//! front of a driver), with the C compiler of the machine the tests run for.
//!
//! The compiler is `TARGET_CC`, else `CC`, else `cc`: when the tests are built for another
//! architecture and run under an emulator (`cargo test --target aarch64-unknown-linux-gnu` with
//! `qemu-aarch64` as the runner), `TARGET_CC` names the cross compiler (`aarch64-linux-gnu-gcc`),
//! as it does for the C code that build scripts compile for the target, and the test binary can
//! load what it builds.
//!
//! A library is built once for each source, flags and compiler, under [`scratch::dir`], and later
//! runs and other test binaries reuse it. Within a process one thread builds at a time (tests
//! running at once ask for the same library); between processes, each builds into files of its
//! own and renames the result into place.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, PoisonError};

use super::scratch;

/// The C compiler the tests build libraries with (see the module docs).
pub fn compiler() -> String {
    ["TARGET_CC", "CC"]
        .iter()
        .find_map(|var| std::env::var(var).ok().filter(|v| !v.is_empty()))
        .unwrap_or_else(|| "cc".into())
}

/// The shared library `lib<name>.so` built from the C `source` with `flags` (after `-shared -fPIC
/// -o <library> <source>`: `-D` switches, `-ldl`), for `what` (the words of a failure message). Panics, saying what to install, when
/// there is no C compiler, and with the compiler's messages when the source does not compile.
pub fn library(what: &str, name: &str, source: &str, flags: &[&str]) -> PathBuf {
    static BUILDING: Mutex<()> = Mutex::new(());
    let _one_at_a_time = BUILDING.lock().unwrap_or_else(PoisonError::into_inner);
    let compiler = compiler();
    let mut hasher = DefaultHasher::new();
    (source, flags, &compiler).hash(&mut hasher);
    let dir = scratch::dir().join(format!("atlas-{name}-{:016x}", hasher.finish()));
    let library = dir.join(format!("lib{name}.so"));
    if !library.exists() {
        compile(what, &compiler, source, flags, &dir, &library);
    }
    library
}

/// Compiles `source` into `library`, through files of this process's own, renamed into place at
/// the end, so that test binaries building the same library at once never see half a file.
fn compile(what: &str, compiler: &str, source: &str, flags: &[&str], dir: &Path, library: &Path) {
    std::fs::create_dir_all(dir)
        .unwrap_or_else(|e| panic!("cannot create {} for {what}: {e}", dir.display()));
    let pid = std::process::id();
    let c = dir.join(format!("source-{pid}.c"));
    let partial = dir.join(format!("partial-{pid}.so"));
    std::fs::write(&c, source).unwrap_or_else(|e| panic!("cannot write {}: {e}", c.display()));
    let output = Command::new(compiler)
        .args(["-shared", "-fPIC", "-o"])
        .arg(&partial)
        .arg(&c)
        .args(flags)
        .output();
    let _ = std::fs::remove_file(&c);
    let output = output.unwrap_or_else(|e| {
        panic!(
            "{what} is compiled at test time, and the C compiler `{compiler}` cannot be run \
             ({e}): install cc (e.g. gcc) or set CC (TARGET_CC for another architecture's tests) \
             to a C compiler"
        )
    });
    if !output.status.success() {
        let _ = std::fs::remove_file(&partial);
        panic!(
            "`{compiler}` failed to build {what} with {flags:?}:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    std::fs::rename(&partial, library)
        .unwrap_or_else(|e| panic!("cannot move {what} to {}: {e}", library.display()));
}
