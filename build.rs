//! Chooses the kernel blobs that `kernels/lib.rs` embeds.
//!
//! By default those are the committed files under `kernels/gen/`, built by `kernels/nvrtc.py`
//! (NVRTC 12.0, reproducible): every build embeds the same bytes, whatever is installed. Only when
//! `ATLAS_NVCC` names an nvcc are the blobs rebuilt from `kernels/*.cu` by `kernels/regen.sh` into
//! `OUT_DIR` and embedded from there; if that build fails, the committed blobs are used and a
//! warning says why. An nvcc on `PATH` is not used unless asked for.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const SOURCES: &[&str] = &[
    "kernels/noop.cu",
    "kernels/elementwise.cu",
    "kernels/block_reduce.cu",
    "kernels/device_global.cu",
    "kernels/model_tagged.cu",
    "kernels/faults.cu",
    "kernels/conditional.cu",
    "kernels/pdl.cu",
    "kernels/cluster.cu",
    "kernels/cooperative.cu",
    "kernels/tma.cu",
    "kernels/smid.cu",
    "kernels/regen.sh",
];

fn main() {
    for source in SOURCES {
        println!("cargo:rerun-if-changed={source}");
    }
    println!("cargo:rerun-if-changed=kernels/gen");
    println!("cargo:rerun-if-env-changed=ATLAS_NVCC");

    let committed =
        Path::new(&env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
            .join("kernels/gen");
    let dir = match env::var_os("ATLAS_NVCC").filter(|v| !v.is_empty()) {
        Some(nvcc) => rebuild(Path::new(&nvcc)).unwrap_or_else(|why| {
            println!("cargo:warning=using the committed kernel blobs: {why}");
            committed
        }),
        None => committed,
    };
    println!("cargo:rustc-env=ATLAS_KERNEL_DIR={}", dir.display());
    // The conditional module's sm_90 cubin comes from nvcc 12.3+ (NVRTC 12.0 cannot make it): it
    // is embedded when it is there.
    println!("cargo:rustc-check-cfg=cfg(atlas_conditional_sm90)");
    if dir.join("conditional.sm_90.cubin").is_file() {
        println!("cargo:rustc-cfg=atlas_conditional_sm90");
    }
}

fn rebuild(nvcc: &Path) -> Result<PathBuf, String> {
    let out = PathBuf::from(env::var("OUT_DIR").map_err(|e| e.to_string())?).join("kernels");
    let status = Command::new("bash")
        .arg("kernels/regen.sh")
        .arg(&out)
        .env("NVCC", nvcc)
        .status()
        .map_err(|e| format!("cannot run kernels/regen.sh: {e}"))?;
    if status.success() {
        Ok(out)
    } else {
        Err(format!(
            "kernels/regen.sh with {} failed ({status})",
            nvcc.display()
        ))
    }
}
