//! Loads the demo model, scales a vector on the GPU and checks it on the CPU.
//!
//! `cargo run -p atlas-registry --example quickstart`. Without a GPU or driver it prints one line
//! saying why and exits with status 1.

use std::process::ExitCode;

use atlas_registry::{AtlasRegistry, DeviceBuffer, FunctionCache, LaunchConfig};

static SCALE: FunctionCache = FunctionCache::new("elementwise", "scale");

fn run() -> atlas_registry::Result<()> {
    // The device's own SASS when atlas-kernels has cubins for its architecture, else the PTX.
    let host = atlas_registry::host(0)?;
    let (major, minor) = host.compute_capability();
    let blobs = atlas_kernels::blobs_for_device("demo", (major, minor))
        .expect("the demo model is built in");
    let registry = AtlasRegistry::load(0, blobs)?;
    let kind = registry
        .module_kind("elementwise")
        .map(|kind| format!("{kind:?}"))
        .unwrap_or_default();
    println!(
        "device 0: {} (sm_{major}{minor}); the demo model as {kind}: modules {:?}",
        host.name(),
        registry.module_names().collect::<Vec<_>>()
    );

    let input: Vec<f32> = (0..1_000_000).map(|i| (i % 1000) as f32 * 0.25).collect();
    let stream = registry.stream();
    let mut x = DeviceBuffer::from_slice(registry.ctx(), stream, &input)?;
    let n = x.len() as u32;
    let scale = SCALE.get(&registry)?;
    // SAFETY: `x` holds `n` floats, all that `scale` touches; it outlives the launch (`to_vec`
    // below synchronizes the stream).
    unsafe {
        scale.launch(
            stream,
            &LaunchConfig::for_elements(n, 256),
            (&mut x, 3.0f32, n),
        )
    }?;
    let out = x.to_vec(stream)?;

    let wrong = out
        .iter()
        .zip(&input)
        .filter(|(got, v)| **got != **v * 3.0)
        .count();
    println!("scaled {n} floats by 3 on the GPU: {wrong} differ from the CPU");
    if wrong == 0 {
        Ok(())
    } else {
        std::process::exit(2)
    }
}

/// What `--help` and `-h` print.
const USAGE: &str = "\
usage: quickstart

Loads the demo model on GPU 0, scales a million floats with it and checks them on the CPU.
Without a GPU or driver it prints one line saying why and exits with status 1;
ATLAS_LIBCUDA_PATH chooses the driver library.

cargo run -p atlas-registry --example quickstart";

fn main() -> ExitCode {
    if std::env::args().skip(1).any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
