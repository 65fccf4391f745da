//! Fuzzing what compressed fatbin entries hold: the cubin inside an entry is decompressed,
//! mutated as the blob fuzzer mutates cubins (section headers, symbols, string tables,
//! relocations, `.nv.info` records, random bytes, truncations; `support/mutate.rs`), compressed
//! again with the entry's own scheme (LZ4 for flag 0x2000, zstd for 0x8000) and the entry's header
//! rewritten to the new sizes. Its *twin* is the same fatbin with the mutated cubin stored
//! uncompressed.
//!
//! The sources are the compressed sm_90 cubins of the committed fixtures (`tests/fixtures/`:
//! nvcc 13's `-arch=sm_90 -Xfatbin=-compress-all` fatbins, zstd in the default mode and LZ4 in
//! `-compress-mode=speed`, and the sm_90 entries of the other fixtures), each alone in a fatbin
//! of its one entry; on a GPU also those of small fatbins of the corpus `ATLAS_CORPUS` names
//! (default `/usr/local/cuda/lib64`; up to `ATLAS_CFUZZ_CORPUS_SOURCES` per scheme, default 16).
//! A *foreign* mutant mutates, in a multi-architecture fatbin whose sm_90 entry is left as it is,
//! one of the entries an sm_90 device never picks (sm_100, sm_120).
//!
//! Without a GPU (CI):
//! - `uncompressed_twins_get_the_same_verdict` (`ATLAS_CFUZZ_CPU_MUTANTS`, default 3,000, of
//!   each kind): `validate_blob` passes a mutant exactly when it passes its twin, but for one
//!   difference by design: a compressed cubin that declares more bytes than its headers describe
//!   (a mutant that zeroes `e_phnum`, or adds bytes at the end) is refused, since those bytes
//!   would be allocated for nothing, while its twin holds them already. It fails while
//!   Atlas checks compressed entries as containers only (what they hold passes unseen: the
//!   twins of most mutants are refused, the mutants are not).
//! - `mutants_replay_from_their_seed`, `validation_never_panics_on_compressed_mutants`.
//! - `crash_fixtures_are_refused`: the three mutants of the first GPU run that
//!   Atlas passed and that crashed the driver (`tests/fixtures/crashes/`, see `CRASHES`), and the
//!   fault each is refused for alone, are refused; `crash_fixtures_are_the_mutants_of_their_seeds`
//!   makes them again from their seeds and sources (and, with `ATLAS_WRITE_CRASH_FIXTURES=1`,
//!   writes them).
//!
//! With an NVIDIA GPU (`#[ignore]`d, fail without one), in child processes (`support/pool.rs`,
//! `ATLAS_CFUZZ_JOBS` at once, default the available parallelism):
//! - `compressed_mutants_load_without_crashing`: `ATLAS_CFUZZ_MUTANTS` mutants (default 10,000,
//!   seeds from `ATLAS_CFUZZ_SEED`, default 0, or those `ATLAS_CFUZZ_SEEDS` lists, e.g.
//!   `2426,5270,9481`) through `AtlasRegistry::load(0, ..)`; prints
//!   loaded / refused by Atlas / driver error (by `CUresult`) / crash / hung and fails on any
//!   crash, hang or panic. Every source, unmutated but compressed again here, must load.
//! - `foreign_entry_mutants_and_the_driver`: `ATLAS_CFUZZ_FOREIGN_MUTANTS` foreign mutants
//!   (default 2,000) handed to a plain `cuModuleLoadData`: loaded / driver error / crash. Mutants
//!   that load or crash tell that the driver parses entries of other architectures, so that
//!   checking only the entries a device can pick would not be enough; the test prints the split
//!   and fails if a mutant that Atlas passes crashes the driver.
//! - `crash_fixtures_crash_the_plain_driver_and_atlas_refuses_them`: the crash fixtures, their
//!   sources, and each group of a mutant's changes alone, on the plain driver (as the fatbin, and
//!   as its cubin, which is what a registry hands over) and through Atlas; fails unless each
//!   mutant, and the fault it is refused for alone, crashes the plain driver in one form or the
//!   other and is refused by Atlas, whatever else crashes the driver is refused too, and the
//!   sources load.

mod support;

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::time::Duration;

use atlas_registry::{
    AtlasError, AtlasRegistry, device_count, validate_blob, validate_blob_for_device,
};
use support::blobs::NEEDS_GPU;
use support::fatbin::{Entry, Fatbin, KIND_ELF, Scheme};
use support::fixtures::{CRASHES, Crash, FIXTURES};
use support::pool::{self, Outcome};
use support::raw::Raw;
use support::rng::Rng;
use support::scratch::Scratch;
use support::{child, corpus, mutate};

child::bodies!(load_mutants);

/// Names the directory of corpus sources a child reads (absent: the fixtures alone).
const SOURCES_ENV: &str = "ATLAS_CFUZZ_SOURCES";
/// A child silent this long on a mutant it started is stuck on it.
const HANG: Duration = Duration::from_secs(120);

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name).map_or(default, |v| {
        v.trim()
            .replace('_', "")
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
    })
}

// ---------------------------------------------------------------------------------------------
// Sources and mutants
// ---------------------------------------------------------------------------------------------

/// Which entries a mutant changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// The compressed sm_90 cubin, alone in its fatbin: what an sm_90 device loads.
    Candidate,
    /// A compressed cubin for another architecture, beside an intact sm_90 one.
    Foreign,
}

/// A fatbin to mutate, and the entries of it that may be mutated.
struct Source {
    name: String,
    fatbin: Fatbin,
    /// Indices of the compressed ELF entries to mutate, with what they hold.
    targets: Vec<(usize, Scheme, Vec<u8>)>,
}

/// The sources of `variant` among `fatbins` (name, bytes), in their order.
fn sources_of(variant: Variant, fatbins: &[(String, Vec<u8>)]) -> Vec<Source> {
    let mut sources = Vec::new();
    for (name, bytes) in fatbins {
        let Ok(fatbin) = Fatbin::parse(bytes) else {
            continue;
        };
        let compressed = |e: &Entry| {
            e.kind() == KIND_ELF && matches!(e.scheme(), Some(Scheme::Lz4 | Scheme::Zstd))
        };
        let sm_90 = fatbin
            .entries
            .iter()
            .position(|e| e.kind() == KIND_ELF && e.arch() == 90);
        match variant {
            Variant::Candidate => {
                let Some(i) = sm_90.filter(|&i| compressed(&fatbin.entries[i])) else {
                    continue;
                };
                let entry = &fatbin.entries[i];
                let Ok(contents) = entry.contents() else {
                    continue;
                };
                let scheme = entry.scheme().expect("a compressed entry's scheme");
                let alone = fatbin.with_entries(vec![entry.clone()]);
                sources.push(Source {
                    name: format!("{name} {}", entry.describe()),
                    fatbin: alone,
                    targets: vec![(0, scheme, contents)],
                });
            }
            Variant::Foreign => {
                if sm_90.is_none() {
                    continue;
                }
                let targets: Vec<_> = (0..fatbin.entries.len())
                    .filter(|&i| {
                        let e = &fatbin.entries[i];
                        compressed(e) && e.arch() >= 100
                    })
                    .filter_map(|i| {
                        let e = &fatbin.entries[i];
                        Some((i, e.scheme()?, e.contents().ok()?))
                    })
                    .collect();
                if !targets.is_empty() {
                    sources.push(Source {
                        name: name.clone(),
                        fatbin,
                        targets,
                    });
                }
            }
        }
    }
    sources
}

/// The fixtures, then the fatbins in `dir` (a child is told it in [`SOURCES_ENV`]).
fn fatbins(dir: Option<&Path>) -> Vec<(String, Vec<u8>)> {
    let mut all: Vec<(String, Vec<u8>)> = FIXTURES
        .iter()
        .map(|f| (f.name.to_string(), f.bytes.to_vec()))
        .collect();
    if let Some(dir) = dir {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
            .map(|e| e.expect("a directory entry").path())
            .collect();
        files.sort();
        for file in files {
            let name = file.file_name().expect("a file name").to_string_lossy();
            all.push((name.into_owned(), std::fs::read(&file).expect("a source")));
        }
    }
    all
}

/// A mutant and its twin.
struct Mutant {
    /// What was mutated, and how.
    what: String,
    /// The fatbin with the mutated cubin compressed with its entry's scheme.
    compressed: Vec<u8>,
    /// The same with the mutated cubin stored uncompressed.
    twin: Vec<u8>,
}

fn mutant(sources: &[Source], seed: u64) -> Mutant {
    let mut rng = Rng::from_seed(seed);
    let source = &sources[rng.index(sources.len())];
    let (i, scheme, contents) = &source.targets[rng.index(source.targets.len())];
    let mut cubin = contents.clone();
    let mut what = vec![mutate::mutate_cubin(&mut rng, &mut cubin)];
    if rng.chance(12) {
        what.push(mutate::mutate_cubin(&mut rng, &mut cubin));
    }
    let with = |scheme: Scheme| {
        let mut entries = source.fatbin.entries.clone();
        entries[*i] = entries[*i].restored(&cubin, scheme);
        source.fatbin.with_entries(entries).bytes()
    };
    Mutant {
        what: format!(
            "{}, entry {i} ({scheme:?}): {}",
            source.name,
            what.join("; then ")
        ),
        compressed: with(*scheme),
        twin: with(Scheme::Plain),
    }
}

// ---------------------------------------------------------------------------------------------
// CPU
// ---------------------------------------------------------------------------------------------

#[test]
fn the_fixtures_give_sources_of_both_schemes_and_both_variants() {
    let fatbins = fatbins(None);
    let candidates = sources_of(Variant::Candidate, &fatbins);
    let foreign = sources_of(Variant::Foreign, &fatbins);
    let schemes = |sources: &[Source]| {
        let mut s: Vec<Scheme> = sources
            .iter()
            .flat_map(|s| s.targets.iter().map(|t| t.1))
            .collect();
        s.sort();
        s.dedup();
        s
    };
    assert_eq!(schemes(&candidates), [Scheme::Lz4, Scheme::Zstd]);
    assert_eq!(schemes(&foreign), [Scheme::Lz4, Scheme::Zstd]);
    assert!(candidates.len() >= 12, "{} sources", candidates.len());
    // Each source, compressed again unchanged, holds the cubin it held.
    for source in candidates.iter().chain(&foreign) {
        for (i, scheme, contents) in &source.targets {
            let again = source.fatbin.entries[*i].restored(contents, *scheme);
            assert_eq!(&again.contents().unwrap(), contents, "{}", source.name);
            assert!(contents.starts_with(b"\x7fELF"), "{}", source.name);
        }
    }
}

#[test]
fn mutants_replay_from_their_seed() {
    let sources = sources_of(Variant::Candidate, &fatbins(None));
    for seed in [0, 1, 7, 1 << 40, u64::MAX] {
        let (a, b) = (mutant(&sources, seed), mutant(&sources, seed));
        assert_eq!(
            (a.what, a.compressed, a.twin),
            (b.what, b.compressed, b.twin)
        );
    }
    let whats: Vec<String> = (0..2000).map(|s| mutant(&sources, s).what).collect();
    for sort in [
        "sh_offset",
        "st_name",
        "relocation",
        ".nv.info",
        "Lz4",
        "Zstd",
    ] {
        assert!(whats.iter().any(|w| w.contains(sort)), "no {sort} mutant");
    }
}

#[test]
fn validation_never_panics_on_compressed_mutants() {
    for variant in [Variant::Candidate, Variant::Foreign] {
        let sources = sources_of(variant, &fatbins(None));
        for seed in 0..env_number("ATLAS_CFUZZ_CPU_MUTANTS", 3000) {
            let m = mutant(&sources, seed);
            for blob in [&m.compressed, &m.twin] {
                let verdict = catch_unwind(|| validate_blob("mutant", blob));
                assert!(
                    verdict.is_ok(),
                    "{variant:?} seed {seed} panics: {}",
                    m.what
                );
            }
        }
    }
}

#[test]
fn uncompressed_twins_get_the_same_verdict() {
    let mut report = Vec::new();
    let mut differ = Vec::new();
    for variant in [Variant::Candidate, Variant::Foreign] {
        let sources = sources_of(variant, &fatbins(None));
        let count = env_number("ATLAS_CFUZZ_CPU_MUTANTS", 3000);
        // [compressed passes][twin passes]
        let mut table = [[0u64; 2]; 2];
        let mut past_end = 0;
        for seed in 0..count {
            let m = mutant(&sources, seed);
            let compressed = validate_blob("mutant", &m.compressed);
            let twin = validate_blob("twin", &m.twin).is_ok();
            // Refused only where compressed: what it declares past its headers' end.
            let past_its_end = matches!(
                &compressed,
                Err(AtlasError::InvalidModule { reason, .. })
                    if reason.contains("the cubin's headers describe")
            );
            let compressed = compressed.is_ok();
            table[usize::from(compressed)][usize::from(twin)] += 1;
            past_end += u64::from(past_its_end);
            if compressed != twin && !(twin && past_its_end) && differ.len() < 20 {
                let verdict = |blob: &[u8]| match validate_blob("m", blob) {
                    Ok(_) => "passes".to_string(),
                    Err(AtlasError::InvalidModule { reason, .. }) => reason,
                    Err(e) => e.to_string(),
                };
                differ.push(format!(
                    "{variant:?} seed {seed}: {}\n    compressed: {}\n    twin: {}",
                    m.what,
                    verdict(&m.compressed),
                    verdict(&m.twin)
                ));
            }
        }
        report.push(format!(
            "{variant:?}: {count} mutants: both pass {}, both refused {}, only the compressed \
             passes {}, only the twin passes {} ({past_end} compressed ones declaring more than \
             their headers describe)",
            table[1][1], table[0][0], table[1][0], table[0][1]
        ));
    }
    println!("{}", report.join("\n"));
    assert!(
        differ.is_empty(),
        "mutants and their uncompressed twins get different verdicts:\n{}\n{}",
        report.join("\n"),
        differ.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// GPU
// ---------------------------------------------------------------------------------------------

/// A child: for each task `candidate SEED`, loads that mutant through `AtlasRegistry::load(0,
/// ..)` and answers `loaded`, `refused`, `error CODE`, `error other: ...` or `panic: ...`; for
/// `foreign SEED`, hands that mutant to a plain `cuModuleLoadData` and answers the code; for
/// `source VARIANT I`, does the same with source I unmutated (compressed again here); for `crash
/// atlas I` and `crash raw I`, loads blob I of [`crash_blobs`] the one way or the other.
fn load_mutants() {
    let dir = std::env::var_os(SOURCES_ENV).map(PathBuf::from);
    let fatbins = fatbins(dir.as_deref());
    let candidates = sources_of(Variant::Candidate, &fatbins);
    let foreign = sources_of(Variant::Foreign, &fatbins);
    let mut raw: Option<Raw> = None;
    pool::serve(|task| {
        let words: Vec<&str> = task.split_whitespace().collect();
        let number = |i: usize| -> u64 { words[i].parse().expect("a number") };
        // Candidates load through Atlas, the rest on the plain driver.
        let (through_atlas, blob) = match words[..] {
            ["candidate", _] => (true, mutant(&candidates, number(1)).compressed),
            ["foreign", _] => (false, mutant(&foreign, number(1)).compressed),
            ["source", kind, _] => {
                let (through_atlas, sources) = match kind {
                    "candidate" => (true, &candidates),
                    _ => (false, &foreign),
                };
                let source = &sources[number(2) as usize];
                let mut entries = source.fatbin.entries.clone();
                for (i, scheme, contents) in &source.targets {
                    entries[*i] = entries[*i].restored(contents, *scheme);
                }
                (through_atlas, source.fatbin.with_entries(entries).bytes())
            }
            ["crash", how, _] => {
                let blob = crash_blobs().swap_remove(number(2) as usize).blob;
                match how {
                    // What a registry hands the driver of these one-entry sm_90 fatbins.
                    "cubin" => (false, sole_contents(&blob)),
                    _ => (how == "atlas", blob),
                }
            }
            _ => panic!("a task {task:?}"),
        };
        if through_atlas {
            let blobs: &[(&str, &[u8])] = &[("mutant", &blob)];
            match catch_unwind(AssertUnwindSafe(|| AtlasRegistry::load(0, blobs).map(drop))) {
                Ok(Ok(())) => ("loaded".into(), true),
                Ok(Err(AtlasError::InvalidModule { .. } | AtlasError::TooLargeToCheck { .. })) => {
                    ("refused".into(), true)
                }
                Ok(Err(AtlasError::NoBinaryForDevice { .. })) => ("error 209".into(), true),
                Ok(Err(e)) => match e.cuda_code() {
                    Some(code) => (format!("error {code}"), !e.is_context_lost()),
                    None => (format!("error other: {e}"), true),
                },
                Err(_) => ("panic".into(), false),
            }
        } else {
            let raw = raw
                .get_or_insert_with(|| Raw::new().unwrap_or_else(|e| panic!("{NEEDS_GPU}: {e}")));
            let code = raw.load_and_unload(&blob);
            (format!("{code}"), code == 0 || raw.usable())
        }
    });
}

/// Small fatbins of the corpus with compressed sm_90 cubins (candidate sources) or with
/// compressed cubins beside an sm_90 one (foreign sources), up to `per_scheme` of each scheme
/// for each, spread over the corpus; written to a fresh directory for the children.
fn corpus_sources(per_scheme: usize) -> Option<Scratch> {
    let roots = corpus::paths(
        &std::env::var("ATLAS_CORPUS").unwrap_or_else(|_| "/usr/local/cuda/lib64".into()),
    );
    if per_scheme == 0 || roots.is_empty() {
        return None;
    }
    let found = corpus::find(&roots, false).unwrap_or_else(|e| panic!("reading {roots:?}: {e}"));
    let small: Vec<(String, Vec<u8>)> = found
        .blobs
        .iter()
        .filter(|b| b.len <= 64 << 10)
        .filter_map(|b| Some((b.name(), b.read().ok()?)))
        .collect();
    let dir = Scratch::new("atlas-cfuzz");
    let mut written = 0;
    for variant in [Variant::Candidate, Variant::Foreign] {
        for scheme in [Scheme::Lz4, Scheme::Zstd] {
            let mut of_scheme: Vec<&(String, Vec<u8>)> = Vec::new();
            for fatbin in &small {
                let sources = sources_of(variant, std::slice::from_ref(fatbin));
                if sources.first().is_some_and(|s| s.targets[0].1 == scheme) {
                    of_scheme.push(fatbin);
                }
            }
            let step = of_scheme.len().div_ceil(per_scheme).max(1);
            for (name, bytes) in of_scheme.iter().step_by(step) {
                let file: String = name
                    .chars()
                    .map(|c| {
                        if c.is_ascii_alphanumeric() || c == '.' {
                            c
                        } else {
                            '_'
                        }
                    })
                    .collect();
                std::fs::write(dir.join(format!("{written:03}-{file}.fatbin")), bytes)
                    .expect("writing a source");
                written += 1;
            }
        }
    }
    println!(
        "{written} corpus fatbins of {} small ones under {roots:?} added as sources",
        small.len()
    );
    Some(dir)
}

/// Runs `tasks` in children; the outcomes.
fn run(tasks: &[String], sources: Option<&Path>) -> Vec<Outcome> {
    let parallel = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    let jobs = env_number("ATLAS_CFUZZ_JOBS", parallel) as usize;
    let mut env = support::raw::child_env();
    if let Some(dir) = sources {
        env.push((SOURCES_ENV, dir.display().to_string()));
    }
    let run = pool::run(load_mutants, &env, tasks, jobs, HANG);
    println!(
        "  {} tasks in {:.1} s, {} child processes",
        tasks.len(),
        run.elapsed.as_secs_f64(),
        run.children
    );
    run.outcomes
}

fn error_name(code: &str) -> String {
    code.parse::<u32>().map_or(code.to_string(), |c| {
        let text = atlas_registry::cuda_error_text(c);
        text.split_once(": ")
            .map_or(text.clone(), |(n, _)| n.into())
    })
}

/// The unmutated sources of `variant` that, compressed again here, do not load: each must.
fn sources_that_do_not_load(name: &str, count: usize, sources: Option<&Path>) -> Vec<String> {
    let tasks: Vec<String> = (0..count).map(|i| format!("source {name} {i}")).collect();
    run(&tasks, sources)
        .iter()
        .enumerate()
        .filter(|(_, o)| !matches!(o, Outcome::Answered(a) if a == "loaded" || a == "0"))
        .map(|(i, o)| format!("source {i}: {o:?}"))
        .collect()
}

/// What a GPU test of `variant` starts from: the directory of corpus sources for the children,
/// the sources, and those of them that do not load unmutated (compressed again here).
fn gpu_sources(variant: Variant) -> (Option<Scratch>, Vec<Source>, Vec<String>) {
    let devices = device_count().unwrap_or_else(|e| panic!("{NEEDS_GPU}: {e}"));
    assert!(devices > 0, "{NEEDS_GPU}: the driver reports no device");
    let dir = corpus_sources(env_number("ATLAS_CFUZZ_CORPUS_SOURCES", 16) as usize);
    let sources = sources_of(variant, &fatbins(dir.as_deref()));
    println!("{} {variant:?} sources", sources.len());
    let name = match variant {
        Variant::Candidate => "candidate",
        Variant::Foreign => "foreign",
    };
    let unloaded = sources_that_do_not_load(name, sources.len(), dir.as_deref());
    (dir, sources, unloaded)
}

/// The seeds of `compressed_mutants_load_without_crashing`: those `ATLAS_CFUZZ_SEEDS` lists
/// (`2426,5270,9481`), else `ATLAS_CFUZZ_MUTANTS` of them from `ATLAS_CFUZZ_SEED` on.
fn candidate_seeds() -> Vec<u64> {
    if let Ok(list) = std::env::var("ATLAS_CFUZZ_SEEDS") {
        let seeds: Vec<u64> = list
            .split(',')
            .map(|s| {
                s.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("ATLAS_CFUZZ_SEEDS={list:?}: {s:?} is not a seed"))
            })
            .collect();
        assert!(!seeds.is_empty(), "ATLAS_CFUZZ_SEEDS is empty");
        return seeds;
    }
    let first = env_number("ATLAS_CFUZZ_SEED", 0);
    (first..first + env_number("ATLAS_CFUZZ_MUTANTS", 10_000)).collect()
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn compressed_mutants_load_without_crashing() {
    let (dir, sources, unloaded) = gpu_sources(Variant::Candidate);
    let seeds = candidate_seeds();
    let tasks: Vec<String> = seeds.iter().map(|s| format!("candidate {s}")).collect();
    let outcomes = run(&tasks, dir.as_deref());
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    let mut failures = Vec::new();
    for (seed, outcome) in seeds.iter().zip(&outcomes) {
        let key = match outcome {
            Outcome::Answered(a) if a.starts_with("error ") => {
                format!("driver error {}", error_name(&a[6..]))
            }
            Outcome::Answered(a) if a == "loaded" || a == "refused" => a.clone(),
            other => {
                failures.push(format!(
                    "seed {seed}: {other:?}: {}",
                    mutant(&sources, *seed).what
                ));
                format!("{other:?}")
            }
        };
        *counts.entry(key).or_default() += 1;
    }
    let count = |k: &str| counts.get(k).copied().unwrap_or(0);
    let errors: u64 = counts
        .iter()
        .filter(|(k, _)| k.starts_with("driver error"))
        .map(|(_, n)| n)
        .sum();
    let shown = match seeds[..] {
        [first, .., last] if last - first + 1 == seeds.len() as u64 => {
            format!("{first}..{}", last + 1)
        }
        _ => format!("{seeds:?}"),
    };
    println!(
        "compressed fuzz: {} mutants (seeds {shown}): loaded {} / refused by Atlas {} / driver \
         error {errors} / crash or hang {}",
        seeds.len(),
        count("loaded"),
        count("refused"),
        failures.len()
    );
    for (key, n) in &counts {
        println!("  {n:>6}  {key}");
    }
    for failure in &failures {
        println!("FAIL {failure}");
    }
    assert!(
        failures.is_empty(),
        "{} mutants crashed, hung or panicked",
        failures.len()
    );
    assert!(
        unloaded.is_empty(),
        "sources compressed again here do not load through Atlas: {unloaded:?}"
    );
    if seeds.len() >= 1000 {
        assert!(
            count("loaded") > 0 && errors > 0,
            "mutants reach the driver"
        );
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn foreign_entry_mutants_and_the_driver() {
    let (dir, sources, unloaded) = gpu_sources(Variant::Foreign);
    let total = env_number("ATLAS_CFUZZ_FOREIGN_MUTANTS", 2000);
    let tasks: Vec<String> = (0..total).map(|s| format!("foreign {s}")).collect();
    let outcomes = run(&tasks, dir.as_deref());
    let mut counts: BTreeMap<String, [u64; 2]> = BTreeMap::new();
    let mut passed_and_crashed = Vec::new();
    for (seed, outcome) in (0..total).zip(&outcomes) {
        let m = mutant(&sources, seed);
        let passes = validate_blob("mutant", &m.compressed).is_ok();
        let key = match outcome {
            Outcome::Answered(code) if code == "0" => "loaded".to_string(),
            Outcome::Answered(code) => format!("driver error {}", error_name(code)),
            Outcome::Crashed(how) => format!("crash ({how})"),
            Outcome::Hung => "hung".into(),
        };
        if passes && matches!(outcome, Outcome::Crashed(_) | Outcome::Hung) {
            passed_and_crashed.push(format!("seed {seed}: {key}: {}", m.what));
        }
        counts.entry(key).or_default()[usize::from(passes)] += 1;
    }
    println!(
        "foreign-entry mutants: {total} fatbins whose sm_90 cubin is intact and one cubin of \
         another architecture is mutated, loaded by the plain driver:"
    );
    for (key, [refused, passed]) in &counts {
        println!(
            "  {:>6}  {key} (Atlas passes {passed}, refuses {refused})",
            passed + refused
        );
    }
    let loaded: u64 = counts.get("loaded").map_or(0, |c| c[0] + c[1]);
    println!(
        "{}",
        if loaded == total {
            "the driver loaded every one: it did not trip over the other architectures' entries"
        } else {
            "the driver refused or crashed on some: it parses entries of other architectures, so \
             checking only the device's candidate entries is not enough"
        }
    );
    for line in &passed_and_crashed {
        println!("FAIL {line}");
    }
    assert!(
        passed_and_crashed.is_empty(),
        "{} mutants that Atlas passes crash or hang the driver",
        passed_and_crashed.len()
    );
    assert!(
        unloaded.is_empty(),
        "sources compressed again here do not load: {unloaded:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// The mutants that crashed the driver
// ---------------------------------------------------------------------------------------------

/// How many candidate sources the GPU run that found the crash fixtures had: the 16 of the
/// fixtures, then 32 of the corpus. A seed picks one of them, so a list of that many copies of a
/// crash fixture's source gives the seed's mutant of that source.
const CRASH_RUN_SOURCES: usize = 48;

/// The mutant of `crash`'s seed, made again from its committed source.
fn replayed(crash: &Crash) -> Mutant {
    let fatbins = vec![(crash.source_name.to_string(), crash.source.to_vec()); CRASH_RUN_SOURCES];
    mutant(&sources_of(Variant::Candidate, &fatbins), crash.seed)
}

/// What the one entry of fatbin `blob` holds, decompressed.
fn sole_contents(blob: &[u8]) -> Vec<u8> {
    let fatbin = Fatbin::parse(blob).expect("a fatbin");
    assert_eq!(fatbin.entries.len(), 1, "a fatbin of one entry");
    fatbin.entries[0]
        .contents()
        .expect("an entry that decompresses")
}

/// A blob made from a crash fixture, for the GPU test.
struct CrashBlob {
    /// `seed 2426: the mutant`, `seed 2426: the tool name ... alone`.
    what: String,
    blob: Vec<u8>,
    /// The words of Atlas's refusal of it; `None` where Atlas passes it (the source, and the
    /// changes that are not what Atlas refuses the mutant for).
    refused_for: Option<&'static str>,
}

/// For each crash fixture: its source's sm_90 entry alone, unmutated (compressed again here); the
/// mutant as committed; and the source's entry with each group of the mutant's changes alone, so
/// that the GPU test can tell which of them crashes the driver.
fn crash_blobs() -> Vec<CrashBlob> {
    let mut blobs = Vec::new();
    for crash in CRASHES {
        let fatbins = [(crash.source_name.to_string(), crash.source.to_vec())];
        let [source] = &sources_of(Variant::Candidate, &fatbins)[..] else {
            panic!("seed {}: a source of one sm_90 entry", crash.seed);
        };
        let (_, scheme, original) = &source.targets[0];
        let mutated = sole_contents(crash.mutant);
        let with = |cubin: &[u8]| {
            let entry = source.fatbin.entries[0].restored(cubin, *scheme);
            source.fatbin.with_entries(vec![entry]).bytes()
        };
        let seed = crash.seed;
        blobs.push(CrashBlob {
            what: format!("seed {seed}: the source"),
            blob: with(original),
            refused_for: None,
        });
        let refused_for = crash.faults.iter().find_map(|f| f.2);
        blobs.push(CrashBlob {
            what: format!("seed {seed}: the mutant"),
            blob: crash.mutant.to_vec(),
            refused_for,
        });
        for &(what, offsets, refused_for) in crash.faults {
            let mut cubin = original.clone();
            for &at in offsets {
                cubin[at] = mutated[at];
            }
            blobs.push(CrashBlob {
                what: format!("seed {seed}: {what}, alone"),
                blob: with(&cubin),
                refused_for,
            });
        }
    }
    blobs
}

/// Writes the crash fixtures' mutants again with `ATLAS_WRITE_CRASH_FIXTURES=1`; without it,
/// checks that each committed mutant is what its seed makes of its source, as the fuzz described
/// it, and that its fault groups are exactly the bytes the seed changed.
#[test]
fn crash_fixtures_are_the_mutants_of_their_seeds() {
    let write = std::env::var_os("ATLAS_WRITE_CRASH_FIXTURES").is_some();
    for crash in CRASHES {
        let m = replayed(crash);
        assert_eq!(m.what, format!("{} {}", crash.source_name, crash.what));
        if write {
            let path = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join(format!("tests/fixtures/crashes/seed{}.fatbin", crash.seed));
            std::fs::write(&path, &m.compressed).expect("writing a crash fixture");
            println!("wrote {}", path.display());
            continue;
        }
        let cubin = sole_contents(crash.mutant);
        assert_eq!(cubin, sole_contents(&m.compressed), "seed {}", crash.seed);
        assert_eq!(cubin, sole_contents(&m.twin), "seed {}", crash.seed);
        let fatbins = [(crash.source_name.to_string(), crash.source.to_vec())];
        let original = &sources_of(Variant::Candidate, &fatbins)[0].targets[0].2;
        let changed: Vec<usize> = (0..cubin.len())
            .filter(|&i| cubin[i] != original[i])
            .collect();
        let mut grouped: Vec<usize> = crash.faults.iter().flat_map(|f| f.1.to_vec()).collect();
        grouped.sort_unstable();
        assert_eq!(changed, grouped, "seed {}: the changed bytes", crash.seed);
    }
}

/// The three mutants that Atlas passed and that crashed the driver (seeds 2426, 5270, 9481 of the
/// first GPU run) are refused, compressed and uncompressed, for any device and for sm_90; and so
/// is the fault Atlas refuses each for, alone. Fails before `.note.nv.tkinfo`'s string offsets
/// and the shape of `.nv.info`'s symbol-index records were checked.
#[test]
fn crash_fixtures_are_refused() {
    let mut blobs = crash_blobs();
    for crash in CRASHES {
        blobs.push(CrashBlob {
            what: format!("seed {}: the mutant, uncompressed", crash.seed),
            blob: replayed(crash).twin,
            refused_for: crash.faults.iter().find_map(|f| f.2),
        });
    }
    for b in &blobs {
        for verdict in [
            validate_blob("crash", &b.blob),
            validate_blob_for_device("crash", &b.blob, (9, 0)),
        ] {
            match (b.refused_for, verdict) {
                (Some(words), Err(AtlasError::InvalidModule { reason, .. })) => {
                    assert!(
                        reason.contains(words),
                        "{}: {reason:?} says no {words:?}",
                        b.what
                    );
                }
                (Some(_), verdict) => panic!("{} is not refused: {verdict:?}", b.what),
                (None, verdict) => assert!(verdict.is_ok(), "{}: {verdict:?}", b.what),
            }
        }
    }
}

/// The crash fixtures on the plain driver (the fatbin, and its cubin: what a registry hands over
/// of these one-entry sm_90 fatbins) and through Atlas, each in a child process: each mutant
/// crashes the plain driver in one form or the other (seeds 33202 and 39170 only as the cubin:
/// the driver loads them as fatbins) and is refused by Atlas, and so is the fault Atlas refuses it
/// for, alone; the sources load. The mutants' other changes are loaded alone too, to tell which
/// change crashes the driver: any of them that crashes it must be refused as well.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn crash_fixtures_crash_the_plain_driver_and_atlas_refuses_them() {
    let devices = device_count().unwrap_or_else(|e| panic!("{NEEDS_GPU}: {e}"));
    assert!(devices > 0, "{NEEDS_GPU}: the driver reports no device");
    let blobs = crash_blobs();
    let tasks: Vec<String> = ["raw", "cubin", "atlas"]
        .iter()
        .flat_map(|how| (0..blobs.len()).map(move |i| format!("crash {how} {i}")))
        .collect();
    let outcomes = run(&tasks, None);
    let (raw, rest) = outcomes.split_at(blobs.len());
    let (cubin, atlas) = rest.split_at(blobs.len());
    let mut failures = Vec::new();
    for (((b, raw), cubin), atlas) in blobs.iter().zip(raw).zip(cubin).zip(atlas) {
        // The plain driver is handed the fatbin, as a library or a forced JIT hands it over,
        // and its cubin, as a registry does: a crash in either is the driver's.
        let crashes = |o: &Outcome| matches!(o, Outcome::Crashed(_) | Outcome::Hung);
        let crashed = crashes(raw) || crashes(cubin);
        let text = |o: &Outcome| match o {
            Outcome::Answered(code) => match code.parse::<u32>() {
                Ok(0) => "loads".to_string(),
                _ => format!("driver error {}", error_name(code)),
            },
            other => format!("{other:?}"),
        };
        let raw_text = if text(raw) == text(cubin) {
            text(raw)
        } else {
            format!("{} (the fatbin), {} (its cubin)", text(raw), text(cubin))
        };
        let atlas_text = match atlas {
            Outcome::Answered(a) => a.clone(),
            other => format!("{other:?}"),
        };
        println!("{}: plain driver {raw_text}; Atlas {atlas_text}", b.what);
        let refused = atlas_text == "refused";
        let fault = b.refused_for.is_some();
        if fault && !crashed {
            failures.push(format!(
                "{} does not crash the plain driver ({raw_text}): the fixture no longer \
                 reproduces the crash, or the fault is elsewhere",
                b.what
            ));
        }
        if (crashed || fault) && !refused {
            failures.push(format!(
                "{} crashes the driver, and Atlas: {atlas_text}",
                b.what
            ));
        }
        if b.what.ends_with("the source") && !(raw_text == "loads" && atlas_text == "loaded") {
            failures.push(format!(
                "{} does not load: {raw_text}, Atlas {atlas_text}",
                b.what
            ));
        }
    }
    for failure in &failures {
        println!("FAIL {failure}");
    }
    assert!(failures.is_empty(), "{} failures", failures.len());
}
