//! Compiles a kernel specialised for a size given on the command line, launches it, checks the
//! result on the CPU, and says whether the compile came from Atlas's compile cache.
//!
//! `cargo run --release -p atlas-registry --example specialize -- 100000` (the size; 100000 when
//! none is given). The first run for a size compiles with NVRTC and stores the code; the second
//! finds it in the cache (`ATLAS_CACHE_DIR`, else the user's cache directory;
//! `ATLAS_CACHE_DISABLE=1` turns it off). NVRTC is found as `ATLAS_NVRTC_PATH` says, else as
//! `libnvrtc.so.13`, `libnvrtc.so.12`, `libnvrtc.so`. Without a GPU, a driver or NVRTC it prints
//! one line saying why and exits with status 1.

use std::process::ExitCode;
use std::time::Instant;

use atlas_registry::{AtlasRegistry, CudaSource, DeviceBuffer, LaunchConfig, Model};

/// `y[i] = x[i] * x[i] + OFFSET` for the first `N` elements, `N` fixed at compile time.
const SOURCE: &str = r#"
template <unsigned N> __global__ void square_plus(const float *x, float *y) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) y[i] = x[i] * x[i] + OFFSET;
}
"#;

fn run(n: u32) -> atlas_registry::Result<()> {
    let kernel = format!("square_plus<{n}u>");
    let model = Model::new().source(
        "square",
        CudaSource::new("square_plus.cu", SOURCE)
            .option("-DOFFSET=0.25f")
            .name_expression(&kernel),
    );
    let started = Instant::now();
    let registry = AtlasRegistry::load_model(0, &model)?;
    let loaded = started.elapsed();
    let host = registry.host();
    let (major, minor) = host.compute_capability();
    println!(
        "device 0: {} (sm_{major}{minor}); `{kernel}` compiled as {:?} and loaded in {:.2} ms; \
         compile cache: {:?}",
        host.name(),
        registry
            .module_kind("square")
            .expect("the model's one module"),
        loaded.as_secs_f64() * 1e3,
        registry.cache_outcome("square").expect("a compiled module"),
    );

    let input: Vec<f32> = (0..n).map(|i| (i % 977) as f32 * 0.125 - 30.0).collect();
    let stream = registry.stream();
    let x = DeviceBuffer::from_slice(registry.ctx(), stream, &input)?;
    let mut y = DeviceBuffer::from_slice(registry.ctx(), stream, &vec![f32::NAN; n as usize])?;
    let square = registry.function_cached("square", &kernel)?;
    // SAFETY: the kernel reads and writes the first `n` floats of `x` and `y`, which hold exactly
    // `n`; both outlive the launch (`to_vec` below synchronizes the stream).
    unsafe { square.launch(stream, &LaunchConfig::for_elements(n, 256), (&x, &mut y)) }?;
    let out = y.to_vec(stream)?;
    let wrong = out
        .iter()
        .zip(&input)
        .filter(|(got, v)| **got != **v * **v + 0.25)
        .count();
    println!("{n} elements: {wrong} differ from the CPU");
    if wrong == 0 {
        Ok(())
    } else {
        std::process::exit(2)
    }
}

/// What `--help` and `-h` print.
const USAGE: &str = "\
usage: specialize [SIZE]

Compiles a kernel for SIZE elements (100000 when none is given) with NVRTC, launches it on GPU 0,
checks the result on the CPU, and says whether the compile came from the compile cache
(ATLAS_CACHE_DIR, else the user's cache directory; ATLAS_CACHE_DISABLE=1 turns it off). NVRTC is
ATLAS_NVRTC_PATH, else libnvrtc.so.13, libnvrtc.so.12, libnvrtc.so. Without a GPU, a driver or
NVRTC it prints one line saying why and exits with status 1.

cargo run --release -p atlas-registry --example specialize -- SIZE";

fn main() -> ExitCode {
    if std::env::args().skip(1).any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let n = match std::env::args().nth(1).map(|a| a.parse::<u32>()) {
        None => 100_000,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("error: the size must be a whole number above 0");
            return ExitCode::FAILURE;
        }
    };
    match run(n) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
