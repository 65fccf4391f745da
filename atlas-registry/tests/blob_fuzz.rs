//! The blob fuzzer: seeded mutants of every committed blob (the cubins of every architecture, the
//! fatbin, PTX, and fatbins made from the fatbin's PTX entry; see `support/mutate.rs`) thrown at Atlas's
//! structural checks, and on a GPU at the driver behind them.
//!
//! Without a GPU (CI): `cargo test -p atlas-registry --test blob_fuzz`. The unmutated blobs pass
//! the checks, a seed always makes the same mutant, and the checks never panic on 20,000
//! mutants (`ATLAS_FUZZ_CPU_MUTANTS=N` for more).
//!
//! With an NVIDIA GPU: `fuzz_mutants_load_without_crashing` (`#[ignore]`d, fails without a GPU)
//! loads `ATLAS_FUZZ_MUTANTS` mutants (default 10,000, seeds from `ATLAS_FUZZ_SEED`, default 0)
//! through `AtlasRegistry::load(0, ..)` and through `AtlasLibrary::load(..)` then `registry(0)`,
//! in child processes of this binary (`ATLAS_FUZZ_JOBS` at once, default the available
//! parallelism up to 8), each running a batch: a child prints `MUTANT <seed>` before each load
//! and `OUTCOME <seed> <loaded|error|panic>` after; when one dies, the mutant it had started is a
//! crash and a new child goes on from the next seed. The test prints the totals (loaded / clean
//! error / panic / crash) and every crashing or panicking seed, and fails if there is any.
//! `ATLAS_FUZZ_REPLAY=<seed>` runs one mutant in this process instead and prints what happened
//! at each step (`ATLAS_FUZZ_SAVE=<dir>` also writes its bytes there).

mod support;

use std::io::{BufRead, BufReader, Write};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::{ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use atlas_registry::{
    AtlasError, AtlasLibrary, AtlasRegistry, BlobKind, device_count, sniff, validate_blob,
};
use support::child;
use support::mutate::{self, Kind, Mutant, Source, corpus, mutant};

/// The environment variable that makes `fuzz_child` a child: `START..END`, the seeds to load.
const CHILD_ENV: &str = "ATLAS_FUZZ_CHILD";
/// The test that a child runs.
const CHILD_TEST: &str = "fuzz_child";
/// The test that runs the children (and replays).
const PARENT_TEST: &str = "fuzz_mutants_load_without_crashing";
/// A child that prints nothing for this long is stuck on the mutant it started.
const HANG: Duration = Duration::from_secs(120);
const NEEDS_GPU: &str = "this test needs an NVIDIA GPU and its driver";

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(value) => value
            .trim()
            .replace('_', "")
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value:?} is not a number")),
        Err(_) => default,
    }
}

/// Prints a line straight to standard output, past the test harness's capture, at once: a
/// parent reads children's lines as they come, and the totals show however the test is run.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

// ---------------------------------------------------------------------------------------------
// CPU
// ---------------------------------------------------------------------------------------------

#[test]
fn committed_blobs_pass_validation() {
    let corpus = corpus();
    assert_eq!(
        corpus.len(),
        12 * 5 + 12 + 1 + 2,
        "12 modules' cubins for 5 architectures, 12 PTX modules, the fatbin, its PTX entry alone \
         (plain and zstd-compressed) in fatbins made by the test"
    );
    for source in &corpus {
        let expected = match source.kind {
            Kind::Cubin => BlobKind::Cubin,
            Kind::Fatbin => BlobKind::Fatbin,
            Kind::Ptx => BlobKind::Ptx,
        };
        assert_eq!(
            validate_blob(&source.name, source.blob).map_err(|e| e.to_string()),
            Ok(expected),
            "{}",
            source.name
        );
    }
}

/// The generator behind the mutants is SplitMix64 (its published first outputs for seed 0): the
/// seeds this file lists, and those earlier runs printed, make the same mutants only with it.
#[test]
fn mutants_come_from_splitmix64() {
    let mut rng = support::rng::Rng::from_seed(0);
    assert_eq!(
        [rng.next_u64(), rng.next_u64(), rng.next_u64()],
        [
            0xE220_A839_7B1D_CDAF,
            0x6E78_9E6A_A1B9_65F4,
            0x06C4_5D18_8009_454F
        ]
    );
}

#[test]
fn mutants_replay_from_their_seed() {
    let corpus = corpus();
    for seed in [0, 1, 2, 41, 1 << 40, u64::MAX] {
        assert_eq!(mutant(&corpus, seed), mutant(&corpus, seed), "seed {seed}");
    }
    let mutants: Vec<Mutant> = (0..3000).map(|seed| mutant(&corpus, seed)).collect();
    // Every blob is mutated, and the mutants differ from it.
    for (index, source) in corpus.iter().enumerate() {
        assert!(
            mutants.iter().any(|m| m.source == index),
            "no mutant of {}",
            source.name
        );
    }
    let unchanged = mutants
        .iter()
        .filter(|m| m.bytes == corpus[m.source].blob)
        .count();
    assert!(
        unchanged * 100 < mutants.len(),
        "{unchanged} mutants unchanged"
    );
    // Every sort of mutation is made.
    for sort in [
        "random byte(s) changed",
        "truncated to",
        "random bytes",
        "first 64 bytes",
        "e_shoff",
        "sh_name",
        "sh_offset",
        "sh_size",
        "sh_link",
        "sh_info",
        "sh_entsize",
        "sh_type",
        "st_shndx",
        "st_name",
        "relocation",
        ".nv.info record",
        "fatbin header",
        "fatbin entry",
        "ELF at 1864: section",
        "ELF at 17256: section",
        "NUL inserted",
        "line at",
        ".target set",
        "PTX entry at 16",
    ] {
        assert!(
            mutants.iter().any(|m| m.what.contains(sort)),
            "no mutation {sort:?} in 3,000 seeds"
        );
    }
    assert_ne!(mutant(&corpus, 7).what, mutant(&corpus, 8).what);
}

/// Every mutant that crashed the driver (SIGSEGV inside `cuModuleLoadData`) when seeds 0 to
/// 9,999 were loaded on an H200 (driver 580, CUDA 13.0), with the mutation it was then: 62 of the
/// two fatbins made from the committed fatbin's PTX entry alone (fields of the entry header
/// Atlas did not check), 8 cubins of other architectures than the device's with garbage
/// `e_flags`. The seeds pick from the corpus as it was then: [`recorded_corpus`].
const DRIVER_CRASHES: &[(u64, &str)] = &[
    (
        27,
        "elementwise.fatbin's PTX entry alone, plain: fatbin entry at 16: name offset at 48: 0x0 -> 0xffffffff",
    ),
    (
        47,
        "elementwise.fatbin's PTX entry alone, zstd: fatbin entry at 16: extension word 0 at 80: 0x48 -> 0x7fffffff",
    ),
    (
        66,
        "elementwise.fatbin's PTX entry alone, zstd: fatbin entry at 16: name offset at 48: 0x0 -> 0x7fffffff",
    ),
    (
        131,
        "elementwise.fatbin's PTX entry alone, plain: first 64 bytes, then 2238 random bytes",
    ),
    (
        202,
        "elementwise.fatbin's PTX entry alone, plain: first 64 bytes, then 2177 random bytes",
    ),
    (
        279,
        "elementwise.fatbin's PTX entry alone, zstd: fatbin entry at 16: extension word 0 at 80: 0x48 -> 0xffffffff; then 3 random byte(s) changed at 818, 1591, 554",
    ),
    (
        583,
        "elementwise.fatbin's PTX entry alone, plain: fatbin entry at 16: extension word 2 at 88: 0x0 -> 0xb3f38d0acb413f99",
    ),
    (
        699,
        "elementwise.fatbin's PTX entry alone, plain: fatbin entry at 16: name offset at 48: 0x0 -> 0x1; then 5 random byte(s) changed at 986, 210, 1609, 1770, 83",
    ),
    (
        773,
        "elementwise.fatbin's PTX entry alone, zstd: fatbin entry at 16: name offset at 48: 0x0 -> 0x7fffffff",
    ),
    (
        812,
        "demo/noop.sm_89.cubin: e_flags at 48: 0x590559 -> 0xffffffff",
    ),
    (
        818,
        "elementwise.fatbin's PTX entry alone, zstd: fatbin entry at 16: extension word 0 at 80: 0x48 -> 0xffffffff",
    ),
    (
        880,
        "elementwise.fatbin's PTX entry alone, plain: fatbin entry at 16: extension word 0 at 80: 0x48 -> 0x14d",
    ),
    (
        1106,
        "elementwise.fatbin's PTX entry alone, plain: fatbin entry at 16: name offset at 48: 0x0 -> 0xffffffff",
    ),
    (
        1770,
        "elementwise.fatbin's PTX entry alone, plain: 7 random byte(s) changed at 359, 387, 83, 1020, 1060, 1074, 1466",
    ),
    (
        2110,
        "elementwise.fatbin's PTX entry alone, plain: fatbin entry at 16: extension word 2 at 88: 0x0 -> 0x7fffffffffffffff; then PTX entry at 16: byte at 1494 set to '['",
    ),
    (
        2478,
        "elementwise.fatbin's PTX entry alone, plain: fatbin entry at 16: extension word 2 at 88: 0x0 -> 0x7fffffffffffffff",
    ),
    (
        2496,
        "elementwise.fatbin's PTX entry alone, plain: first 64 bytes, then 3582 random bytes",
    ),
    (
        2661,
        "elementwise.fatbin's PTX entry alone, zstd: fatbin entry at 16: extension word 0 at 80: 0x48 -> 0x80000000",
    ),
    (
        2793,
        "elementwise.fatbin's PTX entry alone, plain: first 64 bytes, then 3773 random bytes",
    ),
    (
        2810,
        "elementwise.fatbin's PTX entry alone, zstd: fatbin entry at 16: extension word 0 at 80: 0x48 -> 0x7fffffff",
    ),
    (
        2978,
        "elementwise.fatbin's PTX entry alone, plain: fatbin entry at 16: name offset at 48: 0x0 -> 0xffffffff",
    ),
    (
        3005,
        "demo/block_reduce.sm_86.cubin: e_flags at 48: 0x560556 -> 0xffffffff",
    ),
    (
        3358,
        "elementwise.fatbin's PTX entry alone, plain: 7 random byte(s) changed at 397, 1750, 425, 1501, 39, 131, 819",
    ),
    (
        3423,
        "demo/elementwise.sm_80.cubin: e_flags at 48: 0x500550 -> 0xffffffff",
    ),
    (
        3487,
        "elementwise.fatbin's PTX entry alone, zstd: fatbin entry at 16: extension word 0 at 80: 0x48 -> 0x80000000",
    ),
    (
        3980,
        "elementwise.fatbin's PTX entry alone, plain: first 64 bytes, then 2999 random bytes",
    ),
    (
        4213,
        "elementwise.fatbin's PTX entry alone, plain: fatbin entry at 16: extension word 2 at 88: 0x0 -> 0x7fffffffffffffff",
    ),
    (
        4351,
        "elementwise.fatbin's PTX entry alone, zstd: fatbin entry at 16: name offset at 48: 0x0 -> 0x80000000",
    ),
    (
        4406,
        "elementwise.fatbin's PTX entry alone, zstd: 8 random byte(s) changed at 254, 1475, 1531, 1050, 1456, 529, 1157, 37",
    ),
    (
        4539,
        "demo/block_reduce.sm_86.cubin: e_flags at 48: 0x560556 -> 0xa893ec90",
    ),
    (
        4562,
        "elementwise.fatbin's PTX entry alone, zstd: fatbin entry at 16: name offset at 48: 0x0 -> 0x80000000",
    ),
    (
        4621,
        "elementwise.fatbin's PTX entry alone, zstd: fatbin entry at 16: flags at 56: 0x8011 -> 0x0; then first 64 bytes, then 3651 random bytes",
    ),
    (
        4647,
        "elementwise.fatbin's PTX entry alone, plain: 4 random byte(s) changed at 80, 908, 634, 176",
    ),
    (
        4942,
        "elementwise.fatbin's PTX entry alone, plain: fatbin entry at 16: name offset at 48: 0x0 -> 0x7fffffff",
    ),
    (
        4971,
        "elementwise.fatbin's PTX entry alone, plain: first 64 bytes, then 2098 random bytes",
    ),
    (
        4992,
        "elementwise.fatbin's PTX entry alone, plain: first 64 bytes, then 3593 random bytes; then PTX entry at 16: NUL inserted at 345",
    ),
    (
        5013,
        "elementwise.fatbin's PTX entry alone, plain: first 64 bytes, then 3547 random bytes",
    ),
    (
        5063,
        "elementwise.fatbin's PTX entry alone, plain: fatbin entry at 16: extension word 0 at 80: 0x48 -> 0xb88ca900",
    ),
    (
        5134,
        "elementwise.fatbin's PTX entry alone, plain: first 64 bytes, then 4096 random bytes; then PTX entry at 16: byte at 867 set to ';'",
    ),
    (
        5233,
        "elementwise.fatbin's PTX entry alone, plain: first 64 bytes, then 2682 random bytes",
    ),
    (
        5285,
        "elementwise.fatbin's PTX entry alone, plain: fatbin entry at 16: name offset at 48: 0x0 -> 0x116d696c",
    ),
    (
        5364,
        "elementwise.fatbin's PTX entry alone, plain: PTX entry at 16: number at 426 replaced by 1048599; then first 64 bytes, then 2940 random bytes",
    ),
    (
        5505,
        "elementwise.fatbin's PTX entry alone, zstd: 8 random byte(s) changed at 566, 999, 968, 1271, 1521, 457, 80, 1507",
    ),
    (
        5846,
        "elementwise.fatbin's PTX entry alone, zstd: fatbin entry at 16: name offset at 48: 0x0 -> 0xfffffff4",
    ),
    (
        5889,
        "elementwise.fatbin's PTX entry alone, plain: fatbin entry at 16: extension word 0 at 80: 0x48 -> 0xc063b485",
    ),
    (
        5913,
        "elementwise.fatbin's PTX entry alone, zstd: fatbin entry at 16: extension word 0 at 80: 0x48 -> 0x7fffffff",
    ),
    (
        5969,
        "elementwise.fatbin's PTX entry alone, plain: first 64 bytes, then 3130 random bytes",
    ),
    (
        6000,
        "demo/elementwise.sm_80.cubin: e_flags at 48: 0x500550 -> 0xffffffff",
    ),
    (
        6046,
        "elementwise.fatbin's PTX entry alone, zstd: 8 random byte(s) changed at 233, 329, 608, 479, 1106, 38, 808, 1788",
    ),
    (
        6154,
        "elementwise.fatbin's PTX entry alone, plain: fatbin entry at 16: extension word 2 at 88: 0x0 -> 0x251611d6db5ce1dc",
    ),
    (
        6353,
        "elementwise.fatbin's PTX entry alone, zstd: fatbin entry at 16: name offset at 48: 0x0 -> 0x8000000",
    ),
    (
        6714,
        "faults/faults.sm_75.cubin: e_flags at 48: 0x4b054b -> 0xffa9e3be",
    ),
    (
        6718,
        "elementwise.fatbin's PTX entry alone, plain: first 64 bytes, then 3278 random bytes",
    ),
    (
        6839,
        "demo/device_global.sm_75.cubin: e_flags at 48: 0x4b054b -> 0xffffffff",
    ),
    (
        7147,
        "elementwise.fatbin's PTX entry alone, plain: fatbin entry at 16: name offset at 48: 0x0 -> 0xffffffff",
    ),
    (
        7381,
        "elementwise.fatbin's PTX entry alone, plain: first 64 bytes, then 3689 random bytes",
    ),
    (
        7514,
        "elementwise.fatbin's PTX entry alone, plain: 4 random byte(s) changed at 1246, 1374, 80, 1472",
    ),
    (
        7815,
        "elementwise.fatbin's PTX entry alone, plain: first 64 bytes, then 3928 random bytes",
    ),
    (
        8002,
        "elementwise.fatbin's PTX entry alone, plain: fatbin entry at 16: extension word 0 at 80: 0x48 -> 0x26a6b6d3",
    ),
    (
        8115,
        "elementwise.fatbin's PTX entry alone, plain: PTX entry at 16: truncated to 1602 bytes, without its NUL; then fatbin entry at 16: extension word 2 at 88: 0x0 -> 0x7fffffffffffffff",
    ),
    (
        8374,
        "elementwise.fatbin's PTX entry alone, plain: fatbin entry at 16: extension word 0 at 80: 0x48 -> 0x56; then PTX entry at 16: .target set to \"99.9\"",
    ),
    (
        8470,
        "elementwise.fatbin's PTX entry alone, plain: fatbin entry at 16: extension word 0 at 80: 0x48 -> 0xffffffff",
    ),
    (
        8628,
        "elementwise.fatbin's PTX entry alone, plain: first 64 bytes, then 3711 random bytes",
    ),
    (
        8721,
        "elementwise.fatbin's PTX entry alone, plain: first 64 bytes, then 2623 random bytes",
    ),
    (
        8840,
        "elementwise.fatbin's PTX entry alone, zstd: 4 random byte(s) changed at 378, 39, 169, 863",
    ),
    (
        8975,
        "elementwise.fatbin's PTX entry alone, zstd: fatbin entry at 16: name offset at 48: 0x0 -> 0x57205dde",
    ),
    (
        8978,
        "elementwise.fatbin's PTX entry alone, plain: first 64 bytes, then 1765 random bytes",
    ),
    (
        9270,
        "model_a/model.sm_75.cubin: e_flags at 48: 0x4b054b -> 0xffffffff",
    ),
    (
        9661,
        "elementwise.fatbin's PTX entry alone, plain: first 64 bytes, then 2813 random bytes",
    ),
    (
        9711,
        "elementwise.fatbin's PTX entry alone, plain: first 64 bytes, then 3081 random bytes",
    ),
];

/// The models whose blobs made up the corpus when [`DRIVER_CRASHES`] was recorded.
const RECORDED_MODELS: &[&str] = &["demo", "model_a", "model_b", "faults"];

/// The corpus as it was when [`DRIVER_CRASHES`] was recorded: the blobs of models added since are
/// left out (they sit between the recorded models' and the fatbins, so the order is kept), and the
/// same seeds make the same mutants.
fn recorded_corpus() -> Vec<Source> {
    corpus()
        .into_iter()
        .filter(|s| match s.name.split_once('/') {
            Some((model, _)) => RECORDED_MODELS.contains(&model),
            None => true, // the fatbins
        })
        .collect()
}

#[test]
fn mutants_that_crashed_the_driver_are_refused() {
    let corpus = recorded_corpus();
    let mut refusals = Vec::new();
    for &(seed, what) in DRIVER_CRASHES {
        let m = mutant(&corpus, seed);
        assert_eq!(
            m.what, what,
            "seed {seed} no longer makes the mutant that crashed the driver"
        );
        match validate_blob("mutant", &m.bytes) {
            Err(AtlasError::InvalidModule { reason, .. }) => refusals.push((seed, reason)),
            other => panic!("seed {seed} ({what}) is not refused: {other:?}"),
        }
    }
    for (seed, reason) in &refusals {
        say(&format!("seed {seed}: {reason}"));
    }
    assert_eq!(refusals.len(), 70);
}

#[test]
fn validation_never_panics_on_mutants() {
    let count = env_u64("ATLAS_FUZZ_CPU_MUTANTS", 20_000);
    let corpus = corpus();
    let start = Instant::now();
    let (mut passed, mut refused, mut panicked) = (0u64, 0u64, Vec::new());
    for seed in 0..count {
        let m = mutant(&corpus, seed);
        match catch_unwind(|| validate_blob("mutant", &m.bytes)) {
            Ok(Ok(_)) => passed += 1,
            Ok(Err(AtlasError::InvalidModule { module, reason })) => {
                assert!(module == "mutant" && !reason.is_empty());
                refused += 1;
            }
            Ok(Err(AtlasError::TooLargeToCheck {
                module,
                declared,
                limit,
                ..
            })) => {
                assert!(module == "mutant" && declared > limit);
                refused += 1;
            }
            Ok(Err(other)) => panic!("seed {seed}: not a refusal of the blob: {other:?}"),
            Err(_) => panicked.push(seed),
        }
    }
    say(&format!(
        "{count} mutants in {:.2?}: {passed} pass the checks, {refused} refused, {} panicked",
        start.elapsed(),
        panicked.len()
    ));
    assert!(
        panicked.is_empty(),
        "validate_blob panicked on seeds {panicked:?} (mutate::mutant(&corpus(), seed) rebuilds one)"
    );
    // Both ways out are taken: mutants get past the checks, and the checks refuse many.
    if count >= 1000 {
        assert!(
            refused > count / 5 && passed > count / 50,
            "{passed} passed, {refused} refused"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// GPU
// ---------------------------------------------------------------------------------------------

/// What one load path did with a mutant.
enum Load {
    Loaded,
    Refused(AtlasError),
    Panicked(String),
}

impl Load {
    fn run(load: impl FnOnce() -> atlas_registry::Result<()>) -> Self {
        match catch_unwind(AssertUnwindSafe(load)) {
            Ok(Ok(())) => Self::Loaded,
            Ok(Err(e)) => Self::Refused(e),
            Err(payload) => Self::Panicked(
                payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default(),
            ),
        }
    }

    fn lost_context(&self) -> bool {
        matches!(self, Self::Refused(e) if e.is_context_lost())
    }

    fn describe(&self) -> String {
        match self {
            Self::Loaded => "loaded".into(),
            Self::Refused(e) => format!("error: {e}"),
            Self::Panicked(message) => format!("PANIC: {message}"),
        }
    }
}

/// Loads `bytes` as a module through both doors: `AtlasRegistry::load` and `AtlasLibrary::load`
/// with a registry for device 0 from it. Everything loaded is dropped (unloaded) again.
fn load_both(bytes: &[u8]) -> [Load; 2] {
    let blobs: &[(&str, &[u8])] = &[("mutant", bytes)];
    [
        Load::run(|| AtlasRegistry::load(0, blobs).map(drop)),
        Load::run(|| {
            AtlasLibrary::load(blobs)
                .and_then(|library| library.registry(0))
                .map(drop)
        }),
    ]
}

fn outcome(loads: &[Load]) -> &'static str {
    if loads.iter().any(|l| matches!(l, Load::Panicked(_))) {
        "panic"
    } else if loads.iter().all(|l| matches!(l, Load::Loaded)) {
        "loaded"
    } else {
        "error"
    }
}

/// A child: loads the mutants of the seeds in `ATLAS_FUZZ_CHILD=START..END`, saying which before
/// and how it went after. Does nothing without that variable.
#[test]
#[ignore = "a child process of fuzz_mutants_load_without_crashing; does nothing on its own"]
fn fuzz_child() {
    let Ok(range) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (start, end) = range
        .split_once("..")
        .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)))
        .unwrap_or_else(|| panic!("{CHILD_ENV}={range:?} is not START..END"));
    let corpus = corpus();
    for seed in start..end {
        let m = mutant(&corpus, seed);
        say(&format!("MUTANT {seed}"));
        let loads = load_both(&m.bytes);
        say(&format!("OUTCOME {seed} {}", outcome(&loads)));
        if loads.iter().any(Load::lost_context) {
            // Every later load in this process would fail the same way: a new child goes on.
            say(&format!("LOST {seed}"));
            std::process::exit(3);
        }
    }
}

/// What the children of one batch of seeds did.
#[derive(Default)]
struct Tally {
    loaded: u64,
    /// Refused by Atlas's checks, before the driver.
    refused_by_atlas: u64,
    /// Passed the checks, refused by the driver.
    refused_by_driver: u64,
    panics: Vec<u64>,
    /// Seeds whose child died (or hung) on them, and how.
    crashes: Vec<(u64, String)>,
    /// Seeds after which the context was lost (the child was replaced).
    lost: Vec<u64>,
    children: u64,
}

fn describe_exit(status: ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            let name = match signal {
                4 => " (SIGILL)",
                6 => " (SIGABRT)",
                7 => " (SIGBUS)",
                8 => " (SIGFPE)",
                9 => " (SIGKILL)",
                11 => " (SIGSEGV)",
                _ => "",
            };
            return format!("killed by signal {signal}{name}");
        }
    }
    format!("exited: {status}")
}

/// Runs the seeds `start..end` in children, one after another, replacing each that dies.
fn run_batch(start: u64, end: u64, corpus: &[mutate::Source]) -> Tally {
    let mut tally = Tally::default();
    let mut next = start;
    let mut stuck = 0;
    while next < end {
        let mut child = child::this_binary()
            .args([
                CHILD_TEST,
                "--exact",
                "--include-ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, format!("{next}..{end}"))
            // Every mutant is new: caching JIT results would only write them to disk.
            .env("CUDA_CACHE_DISABLE", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting a child process");
        tally.children += 1;
        let stdout = child.stdout.take().expect("the child's piped stdout");
        let (lines, receiver) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if lines.send(line).is_err() {
                    break;
                }
            }
        });
        let before = next;
        let mut started = None;
        let mut hung = false;
        loop {
            match receiver.recv_timeout(HANG) {
                Ok(line) => {
                    let mut words = line.split_whitespace();
                    let (tag, seed) = (words.next(), words.next().and_then(|s| s.parse().ok()));
                    match (tag, seed) {
                        (Some("MUTANT"), Some(seed)) => started = Some(seed),
                        (Some("OUTCOME"), Some(seed)) => {
                            started = None;
                            next = seed + 1;
                            match words.next() {
                                Some("loaded") => tally.loaded += 1,
                                Some("panic") => tally.panics.push(seed),
                                _ => {
                                    let m = mutant(corpus, seed);
                                    if validate_blob("mutant", &m.bytes).is_err() {
                                        tally.refused_by_atlas += 1;
                                    } else {
                                        tally.refused_by_driver += 1;
                                    }
                                }
                            }
                        }
                        (Some("LOST"), Some(seed)) => tally.lost.push(seed),
                        _ => {}
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    hung = true;
                    let _ = child.kill();
                    break;
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        let status = child.wait().expect("waiting for a child process");
        let _ = reader.join();
        if let Some(seed) = started {
            let how = if hung {
                format!("hung for {} s", HANG.as_secs())
            } else {
                describe_exit(status)
            };
            tally.crashes.push((seed, how));
            next = seed + 1;
        } else if next == before {
            stuck += 1;
            assert!(
                stuck < 3,
                "children die before loading any mutant ({}); run the child by hand: \
                 {CHILD_ENV}={next}..{end} {} {CHILD_TEST} --exact --include-ignored --nocapture",
                describe_exit(status),
                this_binary_path()
            );
        }
    }
    tally
}

/// This test binary's path, for the replay commands printed.
fn this_binary_path() -> String {
    std::env::current_exe().map_or_else(|_| "<test binary>".into(), |p| p.display().to_string())
}

/// Loads one mutant in this process and says what each step did.
fn replay(seed: u64) {
    let corpus = corpus();
    let m = mutant(&corpus, seed);
    say(&format!("mutant {seed}: {}", m.what));
    say(&format!("{} bytes, {:?}", m.bytes.len(), sniff(&m.bytes)));
    if let Ok(dir) = std::env::var("ATLAS_FUZZ_SAVE") {
        let path = std::path::Path::new(&dir).join(format!("mutant-{seed}.bin"));
        std::fs::write(&path, &m.bytes).expect("writing the mutant");
        say(&format!("written to {}", path.display()));
    }
    match validate_blob("mutant", &m.bytes) {
        Ok(kind) => say(&format!("validate_blob: passes ({kind:?})")),
        Err(e) => say(&format!("validate_blob: {e}")),
    }
    let blobs: &[(&str, &[u8])] = &[("mutant", &m.bytes)];
    say("AtlasRegistry::load(0, ..) ...");
    say(&format!(
        "  {}",
        Load::run(|| AtlasRegistry::load(0, blobs).map(drop)).describe()
    ));
    say("AtlasLibrary::load(..) ...");
    let mut library = None;
    say(&format!(
        "  {}",
        Load::run(|| AtlasLibrary::load(blobs).map(|l| library = Some(l))).describe()
    ));
    if let Some(library) = library {
        say("library.registry(0) ...");
        say(&format!(
            "  {}",
            Load::run(|| library.registry(0).map(drop)).describe()
        ));
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn fuzz_mutants_load_without_crashing() {
    if let Ok(seed) = std::env::var("ATLAS_FUZZ_REPLAY") {
        replay(seed.trim().parse().expect("ATLAS_FUZZ_REPLAY=<seed>"));
        return;
    }
    let devices = device_count().unwrap_or_else(|e| panic!("{NEEDS_GPU}: {e}"));
    assert!(devices > 0, "{NEEDS_GPU}: the driver reports no device");
    let corpus = corpus();
    let (major, minor) = atlas_registry::host(0)
        .unwrap_or_else(|e| panic!("{NEEDS_GPU}: {e}"))
        .compute_capability();
    let own_cubin = format!(".sm_{}.cubin", major * 10 + minor);
    // The committed blobs this device runs load through both doors: otherwise every mutant would
    // count as a clean error and the test would prove nothing. (Whether the fatbins made here and
    // the cubins of other architectures load is reported.)
    for source in &corpus {
        let must_load =
            source.committed && (source.kind != Kind::Cubin || source.name.ends_with(&own_cubin));
        for (door, load) in ["AtlasRegistry::load", "AtlasLibrary::load"]
            .iter()
            .zip(load_both(source.blob))
        {
            if must_load {
                assert!(
                    matches!(load, Load::Loaded),
                    "{} does not load through {door}: {}",
                    source.name,
                    load.describe()
                );
            } else {
                say(&format!(
                    "unmutated {} through {door}: {}",
                    source.name,
                    load.describe()
                ));
            }
        }
    }

    let total = env_u64("ATLAS_FUZZ_MUTANTS", 10_000);
    let first = env_u64("ATLAS_FUZZ_SEED", 0);
    let parallel = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    let jobs = env_u64("ATLAS_FUZZ_JOBS", parallel.min(8)).clamp(1, total.max(1));
    let end = first
        .checked_add(total)
        .expect("ATLAS_FUZZ_SEED + ATLAS_FUZZ_MUTANTS overflows");
    let per_job = total.div_ceil(jobs);
    let start = Instant::now();
    let tallies: Vec<Tally> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..jobs)
            .map(|job| {
                let from = (first + job * per_job).min(end);
                let to = (from + per_job).min(end);
                let corpus = &corpus;
                scope.spawn(move || run_batch(from, to, corpus))
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("a batch runner panicked"))
            .collect()
    });
    let elapsed = start.elapsed();

    let mut all = Tally::default();
    for t in tallies {
        all.loaded += t.loaded;
        all.refused_by_atlas += t.refused_by_atlas;
        all.refused_by_driver += t.refused_by_driver;
        all.panics.extend(t.panics);
        all.crashes.extend(t.crashes);
        all.lost.extend(t.lost);
        all.children += t.children;
    }
    all.panics.sort_unstable();
    all.crashes.sort_unstable();
    all.lost.sort_unstable();
    let errors = all.refused_by_atlas + all.refused_by_driver;
    say(&format!(
        "blob fuzz: {total} mutants (seeds {first}..{end}) in {:.1} s, {jobs} jobs, {} child \
         processes: loaded {} / clean error {errors} / panic {} / crash {}",
        elapsed.as_secs_f64(),
        all.children,
        all.loaded,
        all.panics.len(),
        all.crashes.len()
    ));
    say(&format!(
        "clean errors: {} refused by Atlas's checks, {} by the driver",
        all.refused_by_atlas, all.refused_by_driver
    ));
    for (seed, how) in &all.crashes {
        say(&format!(
            "CRASH seed {seed} ({how}): {}",
            mutant(&corpus, *seed).what
        ));
    }
    for seed in &all.panics {
        say(&format!(
            "PANIC seed {seed}: {}",
            mutant(&corpus, *seed).what
        ));
    }
    for seed in &all.lost {
        say(&format!(
            "context lost after seed {seed}: {}",
            mutant(&corpus, *seed).what
        ));
    }
    if !all.crashes.is_empty() || !all.panics.is_empty() {
        say(&format!(
            "replay one in this process: ATLAS_FUZZ_REPLAY=<seed> {} {PARENT_TEST} --exact \
             --include-ignored --nocapture",
            this_binary_path()
        ));
    }
    assert!(
        all.crashes.is_empty() && all.panics.is_empty(),
        "{} crash(es), {} panic(s): seeds above",
        all.crashes.len(),
        all.panics.len()
    );
    assert_eq!(
        all.loaded + errors + all.panics.len() as u64 + all.crashes.len() as u64,
        total,
        "every mutant is counted once"
    );
    if total >= 1000 {
        assert!(
            all.loaded > 0 && all.refused_by_driver > 0,
            "mutants reach the driver"
        );
    }
}
