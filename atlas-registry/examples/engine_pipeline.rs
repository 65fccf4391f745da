//! An inference engine's data path, with Atlas alone: a copy stream and a compute stream ordered by
//! events; chunks of input, waiting in page-locked (pinned) memory as a loader leaves them,
//! uploaded into two device buffers in turn (double buffering) while the compute stream runs
//! kernels on the chunk before; each chunk's result written into its view of one large output
//! buffer; everything timed with events.
//!
//! It checks every result against the CPU, then times the pipeline against its parts run one
//! after the other (the uploads alone, the kernels alone): with the copies overlapped, the
//! pipeline takes less than their sum.
//!
//! `cargo run --release -p atlas-registry --example engine_pipeline [CHUNKS] [CHUNK_MIB]`. Without
//! a GPU or driver it prints one line saying why and exits with status 1.

use std::process::ExitCode;
use std::time::Duration;

use atlas_registry::{
    AtlasRegistry, CudaEvent, CudaStream, DeviceBuffer, DeviceMemoryMut, FunctionCache,
    LaunchConfig, PinnedBuffer, PinnedFlags,
};

/// `y = a * x + y`, over `n` floats.
static AXPY: FunctionCache = FunctionCache::new("elementwise", "axpy");

/// Kernel passes per chunk: enough device work per chunk to be worth overlapping with its upload.
const PASSES: usize = 24;
/// The `a` of every pass: a chunk's result is `PASSES * A * x`.
const A: f32 = 0.5;

/// What a run measured.
struct Timing {
    pipeline: Duration,
    uploads: Duration,
    kernels: Duration,
}

fn run() -> atlas_registry::Result<()> {
    let mut args = std::env::args().skip(1);
    let chunks: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(32);
    let chunk_mib: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(16);
    let host = atlas_registry::host(0)?;
    let blobs = atlas_kernels::blobs_for_device("demo", host.compute_capability())
        .expect("the demo model is built in");
    let registry = AtlasRegistry::load(0, blobs)?;
    let ctx = registry.ctx();
    let chunk = chunk_mib << 20 >> 2; // floats
    let total = chunks * chunk;
    println!(
        "device 0: {}; {chunks} chunks of {chunk_mib} MiB ({total} floats), {PASSES} axpy passes each",
        host.name()
    );

    // Fresh input on the host, and its CPU result.
    let mut seed = 0x9E37_79B9_7F4A_7C15u64 ^ u64::from(std::process::id());
    let input: Vec<f32> = (0..total)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect();
    let want: Vec<f32> = input
        .iter()
        .map(|x| (0..PASSES).fold(0.0, |y, _| A * x + y))
        .collect();

    let (copies, compute) = (CudaStream::new(ctx)?, CudaStream::new(ctx)?);
    let axpy = AXPY.get(&registry)?;
    // The input as a loader leaves it: in page-locked memory, one buffer per chunk.
    let mut staged = input
        .chunks(chunk)
        .map(|data| PinnedBuffer::from_slice(ctx, data, PinnedFlags::new()))
        .collect::<atlas_registry::Result<Vec<_>>>()?;
    let mut inputs = [
        DeviceBuffer::<f32>::alloc(ctx, chunk)?,
        DeviceBuffer::<f32>::alloc(ctx, chunk)?,
    ];
    let mut output = DeviceBuffer::<f32>::alloc(ctx, total)?;
    let mut uploaded = [CudaEvent::new(ctx)?, CudaEvent::new(ctx)?];
    let mut consumed = [CudaEvent::new(ctx)?, CudaEvent::new(ctx)?];
    let (mut start, mut end) = (CudaEvent::timing(ctx)?, CudaEvent::timing(ctx)?);
    let cfg = LaunchConfig::for_elements(chunk as u32, 256);
    let n = chunk as u32;

    let mut timing = Timing {
        pipeline: Duration::ZERO,
        uploads: Duration::ZERO,
        kernels: Duration::ZERO,
    };
    // Twice: the first run warms up (module load, clocks), the second is timed.
    for round in 0..2 {
        output.fill(&compute, f32::NAN)?; // poisoned: every element must be written
        output.fill(&compute, 0.0)?;
        compute.synchronize()?;
        start.record(&copies)?;
        for (i, staged) in staged.iter_mut().enumerate() {
            let b = i % 2;
            if i >= 2 {
                copies.wait(&consumed[b])?; // the kernels of chunk i - 2 have read inputs[b]
            }
            staged.copy_to_device(&copies, &mut inputs[b])?;
            uploaded[b].record(&copies)?;
            compute.wait(&uploaded[b])?;
            let mut view = output.range_mut(i * chunk..(i + 1) * chunk)?;
            for _ in 0..PASSES {
                // SAFETY: axpy reads the `n` floats of `inputs[b]` and writes the `n` of the view;
                // both stay allocated and unchanged until the kernel has run: `inputs[b]` is not
                // written again before `consumed[b]`, recorded below, and the output is read only
                // after the compute stream is synchronized.
                unsafe { axpy.launch(&compute, &cfg, (&inputs[b], &mut view, A, n))? };
            }
            consumed[b].record(&compute)?;
        }
        end.record(&compute)?;
        end.synchronize()?;
        if round == 1 {
            timing.pipeline = end.elapsed_since(&start)?;
        }
    }
    let got = output.to_vec(&compute)?;
    let wrong = got
        .iter()
        .zip(&want)
        // NaN (a result never written) counts as wrong: its difference is no number.
        .filter(|(g, w)| (*g - *w).abs().is_nan() || (*g - *w).abs() > 1e-5 * w.abs().max(1.0))
        .count();
    println!("checked {total} results against the CPU: {wrong} differ");
    if wrong != 0 {
        std::process::exit(2);
    }

    // The parts alone: every upload, one after the other; every chunk's kernels on resident data.
    start.record(&copies)?;
    for (i, staged) in staged.iter_mut().enumerate() {
        staged.copy_to_device(&copies, &mut inputs[i % 2])?;
    }
    end.record(&copies)?;
    end.synchronize()?;
    timing.uploads = end.elapsed_since(&start)?;
    start.record(&compute)?;
    for i in 0..chunks {
        let mut view = output.range_mut(i * chunk..(i + 1) * chunk)?;
        for _ in 0..PASSES {
            // SAFETY: as in the pipeline; `inputs[0]` is not written meanwhile.
            unsafe { axpy.launch(&compute, &cfg, (&inputs[0], &mut view, A, n))? };
        }
    }
    end.record(&compute)?;
    end.synchronize()?;
    timing.kernels = end.elapsed_since(&start)?;

    let gib = (total * 4) as f64 / f64::from(1u32 << 30);
    let sum = timing.uploads + timing.kernels;
    println!(
        "uploads alone {:.2} ms ({:.1} GiB/s), kernels alone {:.2} ms, sum {:.2} ms",
        ms(timing.uploads),
        gib / timing.uploads.as_secs_f64(),
        ms(timing.kernels),
        ms(sum)
    );
    println!(
        "pipeline {:.2} ms: {:.0} % of the sum, {:.2} ms hidden by overlap",
        ms(timing.pipeline),
        100.0 * timing.pipeline.as_secs_f64() / sum.as_secs_f64(),
        ms(sum.saturating_sub(timing.pipeline))
    );
    if timing.pipeline >= sum {
        println!("no overlap: the pipeline took as long as its parts");
        std::process::exit(3);
    }
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// What `--help` and `-h` print.
const USAGE: &str = "\
usage: engine_pipeline [CHUNKS [CHUNK_MIB]]

An inference engine's data path on GPU 0: CHUNKS chunks (32) of CHUNK_MIB MiB (16) uploaded from
pinned memory on a copy stream while a compute stream runs kernels on the chunk before, every
result checked against the CPU, then timed against the uploads and the kernels alone. Without a
GPU or driver it prints one line saying why and exits with status 1.

cargo run --release -p atlas-registry --example engine_pipeline -- CHUNKS CHUNK_MIB";

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
