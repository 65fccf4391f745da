//! Times `validate_blob` on the committed blobs, or checks blob files given as arguments.
//!
//! `cargo run --release -p atlas-registry --example validate_blobs` prints the time one check of
//! each demo sm_90 cubin and of the fatbin takes (the median and the fastest of 15 rounds of
//! 20,000 calls).
//! `cargo run --release -p atlas-registry --example validate_blobs -- FILE...` checks each file
//! as `AtlasRegistry::load` would and prints its kind or why it is refused; the exit status is 1
//! when any is refused. `-- --count N FILE...` checks each file N times and prints nothing, for
//! instruction counters. Needs no GPU.

use std::hint::black_box;
use std::process::ExitCode;
use std::time::Instant;

use atlas_registry::validate_blob;

/// Calls per timed round, and rounds: the median round is reported.
const CALLS: u32 = 20_000;
const ROUNDS: usize = 15;

/// The fastest and the median round's time per check, in nanoseconds.
fn nanos_per_check(blob: &[u8]) -> (f64, f64) {
    let mut rounds: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..CALLS {
                let _ = black_box(validate_blob("m", black_box(blob)));
            }
            start.elapsed().as_nanos() as f64 / f64::from(CALLS)
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    (rounds[0], rounds[ROUNDS / 2])
}

fn check_files(paths: &[String]) -> ExitCode {
    let mut refused = false;
    for path in paths {
        match std::fs::read(path) {
            Ok(blob) => match validate_blob(path, &blob) {
                Ok(kind) => println!("{path}: {kind:?}, {} bytes, passes", blob.len()),
                Err(e) => {
                    // The error names the module, here the path: each path once.
                    refused = true;
                    println!("{e}");
                }
            },
            Err(e) => {
                refused = true;
                println!("{path}: cannot read it: {e}");
            }
        }
    }
    if refused {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// What `--help` and `-h` print.
const USAGE: &str = "\
usage: validate_blobs [FILE...]
       validate_blobs --count N FILE...

Checks each FILE as AtlasRegistry::load would (PTX, cubin, fatbin, clang offload bundle) and
prints its kind or why it is refused; exits with status 1 when any is refused. Needs no GPU.
With no FILE, times one check of each demo sm_90 cubin and of the fatbin (build with --release).
--count N checks each FILE N times and prints nothing, for instruction counters.

cargo run --release -p atlas-registry --example validate_blobs -- FILE...";

fn main() -> ExitCode {
    if std::env::args().skip(1).any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let mut paths: Vec<String> = std::env::args().skip(1).collect();
    if paths.first().is_some_and(|a| a == "--count") {
        // `--count N FILE...`: N checks of each file and nothing else, for instruction counters
        // (`valgrind --tool=callgrind --toggle-collect='*validate_blob*'`).
        let count: u32 = paths.get(1).and_then(|n| n.parse().ok()).unwrap_or(1);
        for path in &paths[2.min(paths.len())..] {
            let blob = std::fs::read(path).unwrap_or_default();
            for _ in 0..count {
                let _ = black_box(validate_blob("m", black_box(&blob)));
            }
        }
        return ExitCode::SUCCESS;
    }
    if !paths.is_empty() {
        return check_files(&std::mem::take(&mut paths));
    }
    if cfg!(debug_assertions) {
        println!("(a debug build: run with --release for the numbers that matter)");
    }
    let cubins = atlas_kernels::cubin_for_model("demo", 90).expect("the demo model is built in");
    let mut blobs: Vec<(String, &[u8])> = cubins
        .iter()
        .map(|(name, blob)| (format!("demo/{name}.sm_90.cubin"), *blob))
        .collect();
    blobs.push((
        "elementwise.fatbin".into(),
        atlas_kernels::ELEMENTWISE_FATBIN,
    ));
    for (name, blob) in &blobs {
        if let Err(e) = validate_blob(name, blob) {
            println!("{e}");
            return ExitCode::FAILURE;
        }
        let (fastest, median) = nanos_per_check(blob);
        println!(
            "{name}: {} bytes, {median:.0} ns per check (median round; fastest {fastest:.0} ns)",
            blob.len(),
        );
    }
    ExitCode::SUCCESS
}
