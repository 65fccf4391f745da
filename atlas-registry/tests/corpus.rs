//! The real-world corpus: every blob that real code ships, judged by Atlas and, on a GPU, loaded by
//! the plain driver. Atlas must pass every blob the driver loads, and no blob it passes may crash
//! the driver.
//!
//! The blobs are found under the paths `ATLAS_CORPUS` names (`:`-separated files and directories;
//! default `/usr/local/cuda/lib64`, the CUDA toolkit's libraries): the fatbins of every
//! `.nv_fatbin` and `__nv_relfatbin` section of every ELF file there, and blob files (`.fatbin`,
//! `.cubin`, `.ptx`); see `support/corpus.rs`. With `ATLAS_CORPUS_DATA=1` also the fatbins that
//! libraries keep in their data sections and load themselves (cuFFT 12: about 24,000 in
//! `.ldata`, many of them LTO-IR and PTX). `tests/nvcc_corpus.sh` builds nvcc's outputs of the
//! project's kernels into a directory to add to the list.
//!
//! - `finds_fatbins_in_elf_sections_and_blob_files`, `refusal_reasons_group_without_their_numbers`
//!   (CI): the finder, on an ELF file and blob files made here;
//!   `the_pool_outlives_crashing_children` (CI): the pool of children, on tasks that crash, hang
//!   and end their child.
//! - `corpus_passes_atlas` (`#[ignore]`d; no GPU needed): Atlas's verdict on every blob
//!   (`ATLAS_CORPUS_SM`, default 90, is the device it is judged for); prints the refusals grouped
//!   by reason and fails if there is any.
//! - `corpus_loads_as_the_driver_does` (`#[ignore]`d; needs an NVIDIA GPU): the same verdicts for
//!   device 0, then every blob (`ATLAS_CORPUS_LOAD=refused`: only those Atlas refuses) handed to a
//!   plain `cuModuleLoadData` and unloaded again, in `ATLAS_CORPUS_JOBS` child processes at once
//!   (default: the available parallelism), each taking blobs one at a time; a child that dies on
//!   a blob marks it a crash and a new child goes on (`support/pool.rs`), one silent for
//!   `ATLAS_CORPUS_HANG_S` seconds (default 120) on one is killed and marks it hung. Prints, for
//!   each path and in all, the table of Atlas's verdict (passes / refuses) against the driver's
//!   (loaded / error / crash / hung), the driver's errors by `CUresult`, the refusals by reason,
//!   and fails if any blob the driver loads is refused or any blob Atlas passes crashes or hangs.
//!   The children load eagerly (`CUDA_MODULE_LOADING=EAGER` unless set otherwise): every kernel
//!   of a blob is loaded by `cuModuleLoadData` itself.

mod support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use atlas_registry::{BlobKind, device_count, sniff};
use support::blobs::{NEEDS_GPU, plausible_fatbin};
use support::corpus::{self, Blob, Found, atlas_verdict, reason_group};
use support::pool::{self, Outcome};
use support::raw::{self, Raw};
use support::scratch::Scratch;
use support::{child, fatbin};

child::bodies!(load_blobs, echo_crash_or_quit);

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name).map_or(default, |v| {
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
    })
}

fn jobs() -> usize {
    let parallel = std::thread::available_parallelism().map_or(1, |n| n.get());
    env_number("ATLAS_CORPUS_JOBS", parallel).max(1)
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

// ---------------------------------------------------------------------------------------------
// Finding and judging
// ---------------------------------------------------------------------------------------------

/// The corpus `ATLAS_CORPUS` names, found, with what was found said.
fn corpus_from_env() -> (Vec<PathBuf>, Found) {
    let roots = corpus::paths(&env_or("ATLAS_CORPUS", "/usr/local/cuda/lib64"));
    assert!(!roots.is_empty(), "ATLAS_CORPUS names no path");
    let start = Instant::now();
    // Fatbins that libraries keep in data sections and load themselves, when asked.
    let data = env_or("ATLAS_CORPUS_DATA", "0") == "1";
    let found = corpus::find(&roots, data).unwrap_or_else(|e| panic!("reading {roots:?}: {e}"));
    let bytes: u64 = found.blobs.iter().map(|b| b.len).sum();
    println!(
        "corpus: {} blobs, {:.1} MB ({} in sections of {} ELF files, {} blob files; {} other \
         files) under {}; found in {:.2} s",
        found.blobs.len(),
        mb(bytes),
        found.blobs.iter().filter(|b| b.place != "file").count(),
        found.elf_files,
        found.blob_files,
        found.skipped,
        roots
            .iter()
            .map(|r| r.display().to_string())
            .collect::<Vec<_>>()
            .join(":"),
        start.elapsed().as_secs_f64()
    );
    for (place, words) in &found.stray {
        println!("  {words} 8-byte words that start no fatbin in {place}");
    }
    assert!(
        !found.blobs.is_empty(),
        "no blob under {roots:?}: point ATLAS_CORPUS at CUDA libraries or blob files"
    );
    (roots, found)
}

/// Atlas's verdict on every blob, judged in `jobs` threads.
fn judge(blobs: &[Blob], sm: u32, jobs: usize) -> Vec<Result<BlobKind, String>> {
    let start = Instant::now();
    let next = AtomicUsize::new(0);
    let verdicts = Mutex::new(vec![None; blobs.len()]);
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(blob) = blobs.get(i) else { break };
                    let bytes = blob
                        .read()
                        .unwrap_or_else(|e| panic!("reading {}: {e}", blob.name()));
                    let verdict = atlas_verdict(&blob.name(), &bytes, sm);
                    verdicts.lock().expect("the verdicts")[i] = Some(verdict);
                }
            });
        }
    });
    let verdicts: Vec<_> = verdicts
        .into_inner()
        .expect("no thread panicked holding the verdicts")
        .into_iter()
        .map(|v| v.expect("every blob is judged"))
        .collect();
    let bytes: u64 = blobs.iter().map(|b| b.len).sum();
    let elapsed = start.elapsed().as_secs_f64();
    let refused = verdicts.iter().filter(|v| v.is_err()).count();
    println!(
        "Atlas's verdict for sm_{sm}: {} pass, {refused} refused; {:.2} s in {jobs} threads \
         ({:.0} MB/s)",
        blobs.len() - refused,
        elapsed,
        mb(bytes) / elapsed.max(1e-9)
    );
    verdicts
}

/// Prints the refusals among `verdicts` grouped by reason, most frequent first, each group with
/// its count, how many of its blobs the driver loaded (when known), and one blob of it.
fn print_refusals(blobs: &[Blob], verdicts: &[Result<BlobKind, String>], loaded: &[Option<bool>]) {
    let mut groups: BTreeMap<String, (usize, usize, usize)> = BTreeMap::new();
    for (i, verdict) in verdicts.iter().enumerate() {
        if let Err(reason) = verdict {
            let group = groups.entry(reason_group(reason)).or_insert((0, 0, i));
            group.0 += 1;
            group.1 += usize::from(loaded[i] == Some(true));
        }
    }
    if groups.is_empty() {
        return;
    }
    let mut groups: Vec<_> = groups.into_iter().collect();
    groups.sort_by(|a, b| b.1.0.cmp(&a.1.0).then_with(|| a.0.cmp(&b.0)));
    println!("refusals by reason (numbers as #):");
    let known = loaded.iter().any(Option::is_some);
    for (reason, (count, driver_loaded, example)) in groups {
        let loads = if known {
            format!(", {driver_loaded} loaded by the driver")
        } else {
            String::new()
        };
        println!("  {count:>6}x{loads}: {reason}");
        println!(
            "          e.g. {}: {}",
            blobs[example].name(),
            verdicts[example].as_ref().err().map_or("", String::as_str)
        );
    }
}

/// How long decompressing every compressed entry of the corpus takes (with the tests' own
/// decompressors, in `jobs` threads): the least a check of what those entries hold costs.
fn print_decompression_cost(blobs: &[Blob], jobs: usize) {
    let start = Instant::now();
    let next = AtomicUsize::new(0);
    let totals = Mutex::new((0usize, 0usize, 0usize));
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            scope.spawn(|| {
                let (mut entries, mut bytes, mut failed) = (0, 0, 0);
                while let Some(blob) = blobs.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let Ok(fatbin) = blob.read().map(|b| fatbin::Fatbin::parse(&b)) else {
                        continue;
                    };
                    for entry in fatbin.iter().flat_map(|f| &f.entries) {
                        if entry.scheme() == Some(fatbin::Scheme::Plain) {
                            continue;
                        }
                        entries += 1;
                        match entry.contents() {
                            Ok(c) => bytes += c.len(),
                            Err(_) => failed += 1,
                        }
                    }
                }
                let mut t = totals.lock().expect("the totals");
                (t.0, t.1, t.2) = (t.0 + entries, t.1 + bytes, t.2 + failed);
            });
        }
    });
    let (entries, bytes, failed) = totals.into_inner().expect("the totals");
    println!(
        "decompressing its {entries} compressed entries ({failed} unreadable here) to {:.1} MB \
         took {:.2} s in {jobs} threads",
        mb(bytes as u64),
        start.elapsed().as_secs_f64()
    );
}

#[test]
#[ignore = "reads the blobs ATLAS_CORPUS names (default /usr/local/cuda/lib64); needs no GPU"]
fn corpus_passes_atlas() {
    let (_, found) = corpus_from_env();
    let sm = env_number("ATLAS_CORPUS_SM", 90) as u32;
    let verdicts = judge(&found.blobs, sm, jobs());
    print_refusals(&found.blobs, &verdicts, &vec![None; verdicts.len()]);
    print_decompression_cost(&found.blobs, jobs());
    let refused = verdicts.iter().filter(|v| v.is_err()).count();
    assert_eq!(
        refused,
        0,
        "Atlas refuses {refused} of {} real-world blobs (reasons above)",
        verdicts.len()
    );
}

// ---------------------------------------------------------------------------------------------
// The driver (GPU)
// ---------------------------------------------------------------------------------------------

/// A child: loads and unloads each blob it is handed with the plain driver, answering the
/// `CUresult` code (0 for loaded), followed by `lost` when the context no longer works after it.
fn load_blobs() {
    let raw = Raw::new().unwrap_or_else(|e| panic!("{NEEDS_GPU}: {e}"));
    pool::serve(|line| {
        let image = raw::as_image(corpus::read_line(line).expect("reading the blob"));
        let code = raw.load_and_unload(&image);
        let usable = code == 0 || raw.usable();
        let answer = if usable {
            code.to_string()
        } else {
            format!("{code} lost")
        };
        (answer, usable)
    });
}

/// What the driver did with one blob.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Driver {
    Loaded,
    Error(u32),
    Crashed(String),
    Hung,
    NotLoaded,
}

impl Driver {
    fn column(&self) -> usize {
        match self {
            Self::Loaded => 0,
            Self::Error(_) => 1,
            Self::Crashed(_) => 2,
            Self::Hung => 3,
            Self::NotLoaded => 4,
        }
    }
}

const COLUMNS: [&str; 5] = ["loaded", "driver error", "crash", "hung", "not loaded"];

/// `CUDA_ERROR_NO_BINARY_FOR_GPU (209)`.
fn error_name(code: u32) -> String {
    let text = atlas_registry::cuda_error_text(code);
    text.split_once(": ")
        .map_or(text.clone(), |(name, _)| name.to_string())
}

fn print_table(title: &str, rows: &[(bool, &Driver)]) {
    let mut table = [[0usize; 5]; 2];
    for (refused, driver) in rows {
        table[usize::from(*refused)][driver.column()] += 1;
    }
    println!("{title}: {} blobs", rows.len());
    println!(
        "  {:<14}{}",
        "",
        COLUMNS.map(|c| format!("{c:>13}")).concat()
    );
    for (row, name) in table.iter().zip(["Atlas passes", "Atlas refuses"]) {
        println!("  {name:<14}{}", row.map(|n| format!("{n:>13}")).concat());
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn corpus_loads_as_the_driver_does() {
    let devices = device_count().unwrap_or_else(|e| panic!("{NEEDS_GPU}: {e}"));
    assert!(devices > 0, "{NEEDS_GPU}: the driver reports no device");
    let (major, minor) = atlas_registry::host(0)
        .unwrap_or_else(|e| panic!("{NEEDS_GPU}: {e}"))
        .compute_capability();
    let sm = major * 10 + minor;
    let (roots, found) = corpus_from_env();
    let jobs = jobs();
    let verdicts = judge(&found.blobs, sm, jobs);
    let blobs = &found.blobs;

    let only_refused = match env_or("ATLAS_CORPUS_LOAD", "all").as_str() {
        "all" => false,
        "refused" => true,
        other => panic!("ATLAS_CORPUS_LOAD={other:?}: all or refused"),
    };
    // The largest first, so that no child is left with a large one at the end.
    let mut order: Vec<usize> = (0..blobs.len())
        .filter(|&i| !only_refused || verdicts[i].is_err())
        .collect();
    order.sort_by_key(|&i| std::cmp::Reverse(blobs[i].len));
    let tasks: Vec<String> = order.iter().map(|&i| blobs[i].line()).collect();
    let hang = Duration::from_secs(env_number("ATLAS_CORPUS_HANG_S", 120) as u64);
    let run = pool::run(load_blobs, &raw::child_env(), &tasks, jobs, hang);
    let mut driver = vec![Driver::NotLoaded; blobs.len()];
    let mut lost = Vec::new();
    for (&i, outcome) in order.iter().zip(&run.outcomes) {
        driver[i] = match outcome {
            Outcome::Answered(answer) => {
                let mut words = answer.split_whitespace();
                let code: u32 = words
                    .next()
                    .and_then(|c| c.parse().ok())
                    .unwrap_or_else(|| panic!("a child answered {answer:?}"));
                if words.next() == Some("lost") {
                    lost.push(i);
                }
                if code == 0 {
                    Driver::Loaded
                } else {
                    Driver::Error(code)
                }
            }
            Outcome::Crashed(how) => Driver::Crashed(how.clone()),
            Outcome::Hung => Driver::Hung,
        };
    }
    let loaded_bytes: u64 = order.iter().map(|&i| blobs[i].len).sum();
    println!(
        "the driver: {} blobs ({:.1} MB) loaded and unloaded in {:.1} s by {} child processes, \
         {jobs} at once",
        order.len(),
        mb(loaded_bytes),
        run.elapsed.as_secs_f64(),
        run.children
    );

    let rows: Vec<(bool, &Driver)> = (0..blobs.len())
        .map(|i| (verdicts[i].is_err(), &driver[i]))
        .collect();
    for (r, root) in roots.iter().enumerate() {
        let of_root: Vec<_> = (0..blobs.len())
            .filter(|&i| blobs[i].root == r)
            .map(|i| rows[i])
            .collect();
        if roots.len() > 1 {
            print_table(&root.display().to_string(), &of_root);
        }
    }
    print_table("all", &rows);
    let mut errors: BTreeMap<u32, [usize; 2]> = BTreeMap::new();
    for (refused, d) in &rows {
        if let Driver::Error(code) = d {
            errors.entry(*code).or_default()[usize::from(*refused)] += 1;
        }
    }
    if !errors.is_empty() {
        println!("driver errors:");
        for (code, [passed, refused]) in &errors {
            println!(
                "  {:>6}x {} ({passed} Atlas passes, {refused} it refuses)",
                passed + refused,
                error_name(*code)
            );
        }
    }
    let loaded: Vec<Option<bool>> = driver
        .iter()
        .map(|d| (*d != Driver::NotLoaded).then_some(*d == Driver::Loaded))
        .collect();
    print_refusals(blobs, &verdicts, &loaded);
    for (i, d) in driver.iter().enumerate() {
        if matches!(d, Driver::Crashed(_) | Driver::Hung) {
            println!(
                "{} {:?}: {} ({})",
                if verdicts[i].is_ok() {
                    "FAIL"
                } else {
                    "refused, then"
                },
                d,
                blobs[i].name(),
                verdicts[i]
                    .as_ref()
                    .err()
                    .map_or("Atlas passes it", String::as_str)
            );
        }
    }
    for &i in &lost {
        println!("the context was lost after {}", blobs[i].name());
    }

    let wrongly_refused: Vec<usize> = (0..blobs.len())
        .filter(|&i| verdicts[i].is_err() && driver[i] == Driver::Loaded)
        .collect();
    let passed_and_crashed: Vec<usize> = (0..blobs.len())
        .filter(|&i| verdicts[i].is_ok() && matches!(driver[i], Driver::Crashed(_) | Driver::Hung))
        .collect();
    for &i in wrongly_refused.iter().take(20) {
        println!(
            "refused, but the driver loads it: {}: {}",
            blobs[i].name(),
            verdicts[i].as_ref().err().map_or("", String::as_str)
        );
    }
    assert!(
        wrongly_refused.is_empty() && passed_and_crashed.is_empty(),
        "{} blobs the driver loads are refused by Atlas; {} blobs Atlas passes crash or hang the \
         driver (above)",
        wrongly_refused.len(),
        passed_and_crashed.len()
    );
    if !only_refused {
        assert!(
            driver.contains(&Driver::Loaded),
            "the driver loads none of the corpus: is it for this device?"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The finder (CI)
// ---------------------------------------------------------------------------------------------

/// An x86-64 ELF file whose sections are `sections` (name, type, bytes), after a null section
/// and the section name table, each 8-byte aligned.
fn elf_with(sections: &[(&str, u32, &[u8])]) -> (Vec<u8>, Vec<u64>) {
    let mut names = vec![0u8];
    let mut name_at = Vec::new();
    for (name, _, _) in [(".shstrtab", 3, &[][..])].iter().chain(sections) {
        name_at.push(names.len() as u32);
        names.extend_from_slice(name.as_bytes());
        names.push(0);
    }
    let mut file = vec![0u8; 64];
    let mut headers = vec![[0u8; 64]];
    let mut offsets = Vec::new();
    let contents = [(".shstrtab", 3, &names[..])];
    for (i, (_, kind, bytes)) in contents.iter().chain(sections).enumerate() {
        file.resize(file.len().div_ceil(8) * 8, 0);
        let mut h = [0u8; 64];
        h[0..4].copy_from_slice(&name_at[i].to_le_bytes());
        h[4..8].copy_from_slice(&kind.to_le_bytes());
        h[24..32].copy_from_slice(&(file.len() as u64).to_le_bytes());
        h[32..40].copy_from_slice(&(bytes.len() as u64).to_le_bytes());
        h[48..56].copy_from_slice(&8u64.to_le_bytes());
        offsets.push(file.len() as u64);
        if *kind != 8 {
            file.extend_from_slice(bytes);
        }
        headers.push(h);
    }
    file.resize(file.len().div_ceil(8) * 8, 0);
    let shoff = file.len() as u64;
    for h in &headers {
        file.extend_from_slice(h);
    }
    file[..4].copy_from_slice(b"\x7fELF");
    file[4] = 2;
    file[5] = 1;
    file[6] = 1;
    file[16] = 3; // ET_DYN
    file[18..20].copy_from_slice(&62u16.to_le_bytes()); // EM_X86_64
    file[40..48].copy_from_slice(&shoff.to_le_bytes());
    file[52..54].copy_from_slice(&64u16.to_le_bytes());
    file[58..60].copy_from_slice(&64u16.to_le_bytes());
    file[60..62].copy_from_slice(&(headers.len() as u16).to_le_bytes());
    file[62..64].copy_from_slice(&1u16.to_le_bytes());
    (file, offsets[1..].to_vec())
}

#[test]
fn finds_fatbins_in_elf_sections_and_blob_files() {
    let a = atlas_kernels::ELEMENTWISE_FATBIN;
    let b = plausible_fatbin(&[7u8; 12]); // 28 bytes: the next fatbin starts at 32
    let c = plausible_fatbin(&[9u8; 48]);
    // .nv_fatbin: a, b, padding, c, 8 bytes that start no fatbin, 16 bytes of padding.
    let mut section = a.to_vec();
    section.extend_from_slice(&b);
    section.resize(section.len() + 4, 0);
    let at_c = section.len() as u64;
    section.extend_from_slice(&c);
    section.extend_from_slice(b"not fat!");
    section.extend_from_slice(&[0u8; 16]);
    // .ldata: data, a fatbin header of another version, then a fatbin, then data.
    let mut data = b"some data".to_vec();
    data.resize(16, 0);
    data.extend_from_slice(&plausible_fatbin(&[0u8; 64])[..16]);
    data[20] = 2;
    let at_data_fatbin = data.len() as u64;
    data.extend_from_slice(a);
    data.extend_from_slice(b"more data");
    let (elf, offsets) = elf_with(&[
        (".text", 1, b"\xc3\0\0\0\0\0\0\0"),
        (".nv_fatbin", 1, &section),
        ("__nv_relfatbin", 1, a),
        (".nv_fatbin", 8, &[0u8; 64]), // SHT_NOBITS: nothing in the file
        (".ldata", 1, &data),
    ]);
    let dir = Scratch::new("atlas-corpus-finder");
    std::fs::write(dir.join("libk.so"), &elf).unwrap();
    std::os::unix::fs::symlink(dir.join("libk.so"), dir.join("libk.so.1")).unwrap();
    let (_, cubin) = atlas_kernels::cubin_for_model("demo", 90).unwrap()[0];
    let (_, ptx) = atlas_kernels::ptx_for_model("demo").unwrap()[0];
    std::fs::create_dir(dir.join("sub")).unwrap();
    std::fs::write(dir.join("sub/k.cubin"), cubin).unwrap();
    std::fs::write(dir.join("sub/k_no_extension"), cubin).unwrap();
    std::fs::write(dir.join("sub/k.ptx"), ptx).unwrap();
    std::fs::write(dir.join("sub/x.fatbin"), b"garbage").unwrap();
    std::fs::write(dir.join("sub/notes.txt"), b"not a blob").unwrap();

    let found = corpus::find(&[dir.join("sub/k.ptx"), dir.to_path_buf()], false).unwrap();
    let sub = std::fs::canonicalize(dir.join("sub")).unwrap();
    let lib = std::fs::canonicalize(dir.join("libk.so")).unwrap();
    let got: Vec<(PathBuf, usize, u64, u64, String)> = found
        .blobs
        .iter()
        .map(|b| (b.file.clone(), b.root, b.offset, b.len, b.place.clone()))
        .collect();
    let (nv, rel) = (offsets[1], offsets[2]);
    let blob = |file: &PathBuf, root, offset, len: usize, place: &str| {
        (file.clone(), root, offset, len as u64, place.to_string())
    };
    assert_eq!(
        got,
        [
            blob(&sub.join("k.ptx"), 0, 0, ptx.len(), "file"),
            blob(&lib, 1, nv, a.len(), ".nv_fatbin fatbin 0"),
            blob(&lib, 1, nv + a.len() as u64, b.len(), ".nv_fatbin fatbin 1"),
            blob(&lib, 1, nv + at_c, c.len(), ".nv_fatbin fatbin 2"),
            blob(&lib, 1, rel, a.len(), "__nv_relfatbin fatbin 0"),
            blob(&sub.join("k.cubin"), 1, 0, cubin.len(), "file"),
            blob(&sub.join("k_no_extension"), 1, 0, cubin.len(), "file"),
            blob(&sub.join("x.fatbin"), 1, 0, 7, "file"),
        ]
    );
    assert_eq!(
        (found.elf_files, found.blob_files, found.skipped),
        (1, 4, 1)
    );
    assert_eq!(found.stray.len(), 1, "{:?}", found.stray);
    assert_eq!(found.stray[0].1, 1);
    let read: Vec<Vec<u8>> = found.blobs.iter().map(|b| b.read().unwrap()).collect();
    assert_eq!(read[1], a);
    assert_eq!(read[2], b);
    assert_eq!(read[3], c);
    assert_eq!(read[5], cubin);
    for blob in &found.blobs {
        assert_eq!(
            corpus::read_line(&blob.line()).unwrap(),
            blob.read().unwrap()
        );
    }
    // Asked to, it finds the fatbin in the data section too.
    let with_data = corpus::find(&[dir.join("libk.so")], true).unwrap();
    let last = with_data.blobs.last().unwrap();
    assert_eq!(with_data.blobs.len(), 5);
    assert_eq!(
        (last.offset, last.len, last.place.as_str()),
        (
            offsets[4] + at_data_fatbin,
            a.len() as u64,
            ".ldata fatbin 0"
        )
    );
    assert_eq!(last.read().unwrap(), a);
    // What the finder found is what a fatbin reader reads.
    assert_eq!(fatbin::Fatbin::parse(&read[1]).unwrap().bytes(), a);
    assert_eq!(sniff(&read[0]), BlobKind::Ptx);
}

#[test]
fn refusal_reasons_group_without_their_numbers() {
    for (reason, group) in [
        (
            "fatbin entry 2 (ELF sm_120 at offset 17256): flags 0x1208011 have bits 0x200000 \
             that no CUDA toolchain sets",
            "fatbin entry # (ELF sm_120 at offset #): flags 0x1208011 have bits 0x200000 that \
             no CUDA toolchain sets",
        ),
        (
            "section 7 (.nv.info.scale): offset 4500 + size 88 is past the end of the 4,584-byte \
             blob",
            "section # (.nv.info.scale): offset # + size # is past the end of the #-byte blob",
        ),
        ("entries 1, 2 and 3", "entries #, # and #"),
        ("compute_90 and sm_90a", "compute_90 and sm_90a"),
    ] {
        assert_eq!(reason_group(reason), group);
    }
}

// ---------------------------------------------------------------------------------------------
// The pool of children (CI)
// ---------------------------------------------------------------------------------------------

/// A child of the pool test: `echo X` answers X, `quit X` answers X and ends the child, `crash`
/// aborts, `hang` sleeps past the hang limit. With `ATLAS_POOL_TEST_NO_START` set it dies before
/// it takes a task.
fn echo_crash_or_quit() {
    assert!(
        std::env::var_os("ATLAS_POOL_TEST_NO_START").is_none(),
        "this child cannot start"
    );
    pool::serve(|task| match task.split_once(' ') {
        Some(("echo", x)) => (x.to_string(), true),
        Some(("quit", x)) => (x.to_string(), false),
        _ if task == "crash" => std::process::abort(),
        _ if task == "hang" => {
            std::thread::sleep(Duration::from_secs(30));
            ("woke".into(), true)
        }
        _ => panic!("task {task:?}"),
    });
}

#[test]
fn the_pool_outlives_crashing_children() {
    let mut tasks: Vec<String> = (0..40).map(|i| format!("echo {i} and more")).collect();
    tasks[5] = "crash".into();
    tasks[17] = "quit 17".into();
    tasks[18] = "quit 18".into();
    tasks[19] = "quit 19".into();
    tasks[30] = "hang".into();
    tasks[31] = "crash".into();
    for jobs in [1, 3] {
        let run = pool::run(
            echo_crash_or_quit,
            &[],
            &tasks,
            jobs,
            Duration::from_secs(1),
        );
        for (i, outcome) in run.outcomes.iter().enumerate() {
            let expected = match i {
                5 | 31 => Outcome::Crashed("killed by signal 6 (SIGABRT)".into()),
                30 => Outcome::Hung,
                17..=19 => Outcome::Answered(i.to_string()),
                _ => Outcome::Answered(format!("{i} and more")),
            };
            assert_eq!(*outcome, expected, "task {i}, {jobs} jobs");
        }
        // One child, and one more after each crash, hang and quit (each has tasks after it).
        if jobs == 1 {
            assert_eq!(run.children, 1 + 6);
        }
    }

    // Children that cannot start fail the run, with what they said.
    let env = [("ATLAS_POOL_TEST_NO_START", "1".to_string())];
    let failed = std::panic::catch_unwind(|| {
        pool::run(
            echo_crash_or_quit,
            &env,
            &tasks[..2],
            1,
            Duration::from_secs(2),
        )
    });
    let message = failed.expect_err("the run fails");
    let message = message.downcast_ref::<String>().map_or("", String::as_str);
    assert!(
        message.contains("children die before they take a task")
            && message.contains("this child cannot start"),
        "{message}"
    );
}
