//! Where the tests put the files they make: under `target/`, never the system's temporary
//! directory, which a test run would otherwise fill a little more each time.
//!
//! [`dir`] is cargo's `CARGO_TARGET_TMPDIR` (`target/tmp`), where libraries built once are kept
//! for later runs ([`super::cc`]); a [`Scratch`] is a fresh directory under it, removed with what
//! it holds when dropped.

use std::path::{Path, PathBuf};

/// The tests' directory: `CARGO_TARGET_TMPDIR` of the build, or, for test binaries carried to a
/// machine without that checkout (a GPU machine without a toolchain, which runs them from the
/// repository root), `target/tmp` of the current directory. Created if missing.
pub fn dir() -> PathBuf {
    let built = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let dir = if built.is_dir() {
        built.to_path_buf()
    } else {
        PathBuf::from("target/tmp")
    };
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("cannot create {} for the tests: {e}", dir.display()));
    dir
}

/// A fresh, empty directory under [`dir`], named after `what` and this process; removed with
/// everything in it when dropped.
pub struct Scratch(PathBuf);

impl Scratch {
    /// Makes the directory (emptied first, should a crashed run of the same process id have left
    /// it behind).
    pub fn new(what: &str) -> Self {
        let path = dir().join(format!("{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
        Self(path)
    }
}

impl std::ops::Deref for Scratch {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
