//! Run-time compilation without a GPU: NVRTC 12 (the pinned wheel CI fetches) compiles for
//! sm_75–sm_90, and the stand-in libcuda loads and runs what it made. Compile errors and their
//! logs, cache keys, hits and misses, corrupt entries, eviction, publication by several processes
//! at once, preloading and a missing NVRTC.
//!
//! Every body runs in a child process (`support::nvrtc::run`), whose NVRTC is chosen by
//! `ATLAS_NVRTC_PATH` and whose cache directory is the parent's fresh one (`CACHE_VAR`).
//!
//! The tests that compile need NVRTC, and are ignored by a plain `cargo test`: fetch the pinned
//! NVRTC 12.0 with `python3 kernels/nvrtc.py --fetch` (or set `ATLAS_NVRTC_PATH`), then run
//! `cargo test -p atlas-registry --test compile -- --ignored`; without an NVRTC they fail, saying
//! how to get one (`support::nvrtc`). None needs a GPU: the driver is the stand-in.

mod support;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use atlas_registry::{
    AtlasError, AtlasLibrary, AtlasRegistry, BlobKind, CacheOutcome, CompileCache, CompileTarget,
    Compiler, CudaSource, DeviceBuffer, LaunchConfig, Model, validate_blob,
};
use support::scratch::Scratch;
use support::standin::probe;
use support::{child, logger, nvrtc};

child::bodies!(
    compiles_for_every_architecture,
    a_compile_error_carries_the_log,
    refuses_what_nvrtc_must_not_see,
    name_expressions_have_lowered_names,
    a_second_compile_hits_the_cache,
    corrupt_entries_are_compiled_again,
    eviction_removes_the_least_recently_used,
    an_unwritable_cache_still_compiles,
    publish_while_others_read,
    compiled_modules_launch_with_preload,
    compiled_modules_launch_without_preload,
    compiled_modules_launch_with_preload_from_blobs,
    a_library_compiles_once_per_architecture,
    a_missing_nvrtc_is_one_error,
    a_compile_error_fails_the_model_load,
    an_nvrtc_newer_than_the_driver_is_refused,
    a_changed_header_on_disk_is_compiled_again,
);

/// The cache directory a child uses, chosen by its parent.
const CACHE_VAR: &str = "ATLAS_TEST_COMPILE_CACHE";

/// A template kernel (looked up by its C++ name) and an `extern "C"` one.
const KERNELS: &str = r#"
template <int F> __global__ void scale_by(float *x, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= F;
}
extern "C" __global__ void scale(float *x, float factor, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= factor;
}
"#;

/// What NVRTC lowers `scale_by<2>` to (the stand-in runs a kernel of that name).
const SCALE_BY_2: &str = "_Z8scale_byILi2EEvPfj";

fn kernels() -> CudaSource {
    CudaSource::new("kernels.cu", KERNELS).name_expression("scale_by<2>")
}

/// A fresh, empty directory for one test, removed with what it holds when dropped.
fn fresh_dir(test: &str) -> Scratch {
    Scratch::new(&format!("atlas-compile-{test}"))
}

/// In a child: the cache its parent chose.
fn cache() -> CompileCache {
    CompileCache::at(std::env::var_os(CACHE_VAR).expect("the parent names the cache"))
}

fn cache_dir() -> PathBuf {
    PathBuf::from(std::env::var_os(CACHE_VAR).expect("the parent names the cache"))
}

/// The cache's entries.
fn entries(dir: &Path, extension: &str) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|listing| listing.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    found.retain(|p| p.extension().is_some_and(|e| e == extension));
    found.sort();
    found
}

/// Runs `body` with the stand-in (of `variant`) and NVRTC, its cache in a fresh directory.
#[track_caller]
fn run_in_cache<F: Fn()>(body: F, variant: &[&str], test: &str) -> Scratch {
    let dir = fresh_dir(test);
    nvrtc::run(body, variant, &[(CACHE_VAR, dir.as_os_str())]);
    dir
}

const SM_90: CompileTarget = CompileTarget::Cubin { arch: 90 };

// ---------------------------------------------------------------------------------------------
// Compiling.

#[test]
#[ignore = "needs NVRTC: `python3 kernels/nvrtc.py --fetch`, then `cargo test -p atlas-registry --test compile -- --ignored`"]
fn nvrtc_compiles_cubins_for_sm_75_to_sm_90_and_ptx() {
    run_in_cache(compiles_for_every_architecture, &[], "archs");
}

fn compiles_for_every_architecture() {
    let compiler = Compiler::with_cache(CompileCache::disabled()).unwrap();
    let supported = compiler.supported_archs();
    for arch in [75, 80, 86, 89, 90] {
        assert!(
            supported.contains(&arch),
            "NVRTC {:?}: {supported:?}",
            compiler.version()
        );
        let target = compiler
            .target_for("kernels", (arch / 10, arch % 10))
            .unwrap();
        assert_eq!(target, CompileTarget::Cubin { arch });
        let code = compiler.compile(&kernels(), target).unwrap();
        assert_eq!(code.kind(), BlobKind::Cubin);
        assert_eq!(
            validate_blob("kernels", code.image()).unwrap(),
            BlobKind::Cubin
        );
        // The ELF header's e_flags name the architecture: its low byte in CUDA 12's ELF ABI
        // (version 7), the byte above it in CUDA 13's (version 8).
        let image = code.image();
        let e_flags = u32::from_le_bytes([image[48], image[49], image[50], image[51]]);
        let elf_arch = if image[8] == 7 {
            e_flags & 0xff
        } else {
            (e_flags >> 8) & 0xff
        };
        assert_eq!(elf_arch, arch, "sm_{arch}");
        assert_eq!(code.cache_outcome(), &CacheOutcome::Off);
    }
    // A device newer than every architecture gets PTX of the newest below it.
    let newest = *supported.last().unwrap();
    let target = compiler
        .target_for("kernels", (newest / 10 + 1, 0))
        .unwrap();
    assert_eq!(target, CompileTarget::Ptx { arch: newest });
    let ptx = compiler.compile(&kernels(), target).unwrap();
    assert_eq!(ptx.kind(), BlobKind::Ptx);
    assert!(
        ptx.image().ends_with(b"\0"),
        "PTX is handed over NUL-terminated"
    );
    let text = String::from_utf8_lossy(ptx.image());
    assert!(text.contains(&format!(".target sm_{newest}")), "{text}");
    assert!(text.contains(".entry scale("), "{text}");
    // A device older than every architecture is refused, naming both.
    let e = compiler.target_for("kernels", (3, 0)).unwrap_err();
    assert!(matches!(e, AtlasError::CannotCompile { .. }), "{e}");
    assert!(e.to_string().contains("sm_30"), "{e}");
}

#[test]
#[ignore = "needs NVRTC: `python3 kernels/nvrtc.py --fetch`, then `cargo test -p atlas-registry --test compile -- --ignored`"]
fn a_compile_error_is_an_error_carrying_nvrtcs_log() {
    run_in_cache(a_compile_error_carries_the_log, &[], "log");
}

fn a_compile_error_carries_the_log() {
    let compiler = Compiler::with_cache(cache()).unwrap();
    let broken = CudaSource::new(
        "broken.cu",
        "extern \"C\" __global__ void k(float *x) {\n  x[0] = no_such_thing;\n}\n",
    );
    let e = compiler.compile(&broken, SM_90).unwrap_err();
    let AtlasError::Compile {
        module,
        target,
        code,
        log,
    } = &e
    else {
        panic!("not a compile error: {e:?}");
    };
    assert_eq!(module, "broken.cu");
    assert_eq!(target, "sm_90 SASS");
    assert_eq!(*code, 6, "NVRTC_ERROR_COMPILATION");
    assert!(
        log.contains("broken.cu(2)") && log.contains("no_such_thing"),
        "{log}"
    );
    let text = e.to_string();
    assert!(
        text.starts_with(
            "compiling `broken.cu` for sm_90 SASS failed: NVRTC_ERROR_COMPILATION (6)"
        ) && text.contains("NVRTC log:\n")
            && text.contains("no_such_thing"),
        "{text}"
    );
    // Nothing was stored for it.
    assert!(entries(&cache_dir(), "atlas").is_empty());
    // A warning is kept in the log of a compile that succeeds.
    let warns = CudaSource::new(
        "warns.cu",
        "extern \"C\" __global__ void k(float *x) { int unused = 1; x[0] = 1.0f; }",
    );
    let code = compiler.compile(&warns, SM_90).unwrap();
    assert!(code.log().contains("unused"), "{}", code.log());
}

#[test]
#[ignore = "needs NVRTC: `python3 kernels/nvrtc.py --fetch`, then `cargo test -p atlas-registry --test compile -- --ignored`"]
fn sources_nvrtc_must_not_see_are_refused_before_it() {
    run_in_cache(refuses_what_nvrtc_must_not_see, &[], "refused");
}

fn refuses_what_nvrtc_must_not_see() {
    let compiler = Compiler::with_cache(cache()).unwrap();
    for (source, says) in [
        (kernels().option("-arch=sm_80"), "names an architecture"),
        (
            kernels().option("--gpu-architecture=compute_80"),
            "names an architecture",
        ),
        (
            CudaSource::new("nul.cu", "__global__ void k() {}\0"),
            "NUL byte",
        ),
        (kernels().header("a\0.h", ""), "NUL byte"),
    ] {
        let e = compiler.compile(&source, SM_90).unwrap_err();
        assert!(
            matches!(&e, AtlasError::InvalidModule { reason, .. } if reason.contains(says)),
            "{e}"
        );
    }
    // An option NVRTC does not know is its refusal, with its status.
    let e = compiler
        .compile(&kernels().option("--no-such-option"), SM_90)
        .unwrap_err();
    assert!(matches!(e, AtlasError::Compile { code: 5, .. }), "{e}");
    assert!(e.to_string().contains("NVRTC_ERROR_INVALID_OPTION"), "{e}");
}

#[test]
#[ignore = "needs NVRTC: `python3 kernels/nvrtc.py --fetch`, then `cargo test -p atlas-registry --test compile -- --ignored`"]
fn name_expressions_come_back_with_their_lowered_names() {
    run_in_cache(name_expressions_have_lowered_names, &[], "names");
}

fn name_expressions_have_lowered_names() {
    let compiler = Compiler::with_cache(cache()).unwrap();
    let source = CudaSource::new(
        "names.cu",
        "#include \"factor.h\"\n\
         namespace ns { template <typename T, int N> __global__ void fill(T *x) { x[N] = FACTOR; } }\n",
    )
    .header("factor.h", "#define FACTOR 3")
    .name_expression("ns::fill<float, 4>")
    .name_expression("ns::fill<int, 1>");
    let code = compiler.compile(&source, SM_90).unwrap();
    assert_eq!(
        code.lowered_name("ns::fill<float, 4>"),
        Some("_ZN2ns4fillIfLi4EEEvPT_")
    );
    assert_eq!(
        code.lowered_name("ns::fill<int, 1>"),
        Some("_ZN2ns4fillIiLi1EEEvPT_")
    );
    assert_eq!(code.lowered_names().len(), 2);
    assert_eq!(code.lowered_name("ns::fill<char, 0>"), None);
    let scaled = compiler.compile(&kernels(), SM_90).unwrap();
    assert_eq!(scaled.lowered_name("scale_by<2>"), Some(SCALE_BY_2));
    // An expression that names nothing fails the compile, with NVRTC's words.
    let e = compiler
        .compile(&kernels().name_expression("no_such_kernel<1>"), SM_90)
        .unwrap_err();
    assert!(matches!(e, AtlasError::Compile { .. }), "{e}");
    assert!(e.to_string().contains("no_such_kernel"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// The cache.

#[test]
#[ignore = "needs NVRTC: `python3 kernels/nvrtc.py --fetch`, then `cargo test -p atlas-registry --test compile -- --ignored`"]
fn a_second_compile_is_a_hit_and_each_input_changes_the_key() {
    let dir = run_in_cache(a_second_compile_hits_the_cache, &[], "hits");
    assert!(entries(&dir, "tmp").is_empty(), "no temporary file is left");
}

fn a_second_compile_hits_the_cache() {
    let compiler = Compiler::with_cache(cache()).unwrap();
    let first = compiler.compile(&kernels(), SM_90).unwrap();
    assert_eq!(first.cache_outcome(), &CacheOutcome::Stored);
    let second = compiler.compile(&kernels(), SM_90).unwrap();
    assert_eq!(second.cache_outcome(), &CacheOutcome::Hit);
    assert_eq!(second.image(), first.image());
    assert_eq!(second.lowered_names(), first.lowered_names());
    assert_eq!(entries(&cache_dir(), "atlas").len(), 1);
    // Each thing that changes the output is a miss, and a new entry.
    let changed = [
        (kernels().option("-DX=1"), SM_90),
        (kernels().header("unused.h", "#define Y 2"), SM_90),
        (kernels().name_expression("scale_by<3>"), SM_90),
        (
            CudaSource::new("kernels.cu", format!("{KERNELS}\n")).name_expression("scale_by<2>"),
            SM_90,
        ),
        (
            CudaSource::new("other.cu", KERNELS).name_expression("scale_by<2>"),
            SM_90,
        ),
        (kernels(), CompileTarget::Cubin { arch: 80 }),
        (kernels(), CompileTarget::Ptx { arch: 90 }),
    ];
    for (i, (source, target)) in changed.iter().enumerate() {
        let code = compiler.compile(source, *target).unwrap();
        assert_eq!(code.cache_outcome(), &CacheOutcome::Stored, "change {i}");
        assert_eq!(entries(&cache_dir(), "atlas").len(), 2 + i, "change {i}");
    }
    for (i, (source, target)) in changed.iter().enumerate() {
        let code = compiler.compile(source, *target).unwrap();
        assert_eq!(
            code.cache_outcome(),
            &CacheOutcome::Hit,
            "change {i}, again"
        );
    }
    // The same source through a disabled cache compiles and stores nothing.
    let off = Compiler::with_cache(CompileCache::disabled()).unwrap();
    let code = off.compile(&kernels(), SM_90).unwrap();
    assert_eq!(code.cache_outcome(), &CacheOutcome::Off);
    assert_eq!(
        code.image(),
        first.image(),
        "NVRTC's output is the same every time"
    );
}

#[test]
#[ignore = "needs NVRTC: `python3 kernels/nvrtc.py --fetch`, then `cargo test -p atlas-registry --test compile -- --ignored`"]
fn a_header_read_from_disk_that_changed_is_no_stale_hit() {
    let headers = fresh_dir("disk-headers");
    let dir = fresh_dir("disk-header-cache");
    nvrtc::run(
        a_changed_header_on_disk_is_compiled_again,
        &[],
        &[
            (CACHE_VAR, dir.as_os_str()),
            (HEADERS_VAR, headers.as_os_str()),
        ],
    );
}

/// The directory of the headers a child reads from disk, chosen by its parent.
const HEADERS_VAR: &str = "ATLAS_TEST_COMPILE_HEADERS";

/// A kernel that stores `VALUE`, which a header defines.
const STORES_VALUE: &str = "extern \"C\" __global__ void value(unsigned *x) { x[0] = VALUE; }\n";

fn a_changed_header_on_disk_is_compiled_again() {
    let compiler = Compiler::with_cache(cache()).unwrap();
    let dir = PathBuf::from(std::env::var_os(HEADERS_VAR).expect("the parent names it"));
    let header = dir.join("value.h");
    let ptx = CompileTarget::Ptx { arch: 75 };
    let with_include = |name: String, include: &str| {
        CudaSource::new(name, format!("#include \"{include}\"\n{STORES_VALUE}"))
    };
    let every_way = [
        (
            "-I",
            with_include("value.cu".into(), "value.h").option(format!("-I{}", dir.display())),
        ),
        (
            "--include-path",
            with_include("value.cu".into(), "value.h")
                .option(format!("--include-path={}", dir.display())),
        ),
        (
            "--pre-include",
            CudaSource::new("value.cu", STORES_VALUE)
                .option(format!("--pre-include={}", header.display())),
        ),
        (
            "-include",
            CudaSource::new("value.cu", STORES_VALUE)
                .option("-include")
                .option(header.display().to_string()),
        ),
        (
            "#include of an absolute path",
            with_include("value.cu".into(), &header.display().to_string()),
        ),
        (
            "#include beside the program",
            with_include(dir.join("value.cu").display().to_string(), "value.h"),
        ),
    ];
    for (i, (how, source)) in every_way.iter().enumerate() {
        for value in [1_000_000 + i, 2_000_000 + i] {
            std::fs::write(&header, format!("#define VALUE {value}\n")).unwrap();
            let code = compiler.compile(source, ptx).unwrap();
            let text = String::from_utf8_lossy(code.image());
            assert!(
                text.contains(&format!(", {value};")),
                "{how}: the header says {value}, the code does not ({:?}):\n{text}",
                code.cache_outcome()
            );
            assert!(
                matches!(code.cache_outcome(), CacheOutcome::ReadsFiles { .. }),
                "{how}: {:?}",
                code.cache_outcome()
            );
        }
    }
    assert!(
        entries(&cache_dir(), "atlas").is_empty(),
        "nothing was stored"
    );
    // A header given in memory is what NVRTC reads, even beside a file of its name on disk: why
    // a source whose includes all name its headers may be cached.
    let in_memory = with_include(dir.join("value.cu").display().to_string(), "value.h")
        .header("value.h", "#define VALUE 3000000\n");
    for (value_on_disk, outcome) in [(1, CacheOutcome::Stored), (2, CacheOutcome::Hit)] {
        std::fs::write(&header, format!("#define VALUE {value_on_disk}\n")).unwrap();
        let code = compiler.compile(&in_memory, ptx).unwrap();
        let text = String::from_utf8_lossy(code.image());
        assert!(text.contains(", 3000000;"), "{text}");
        assert_eq!(code.cache_outcome(), &outcome);
    }
}

#[test]
#[ignore = "needs NVRTC: `python3 kernels/nvrtc.py --fetch`, then `cargo test -p atlas-registry --test compile -- --ignored`"]
fn corrupt_or_truncated_entries_are_compiled_again_and_replaced() {
    run_in_cache(corrupt_entries_are_compiled_again, &[], "corrupt");
}

fn corrupt_entries_are_compiled_again() {
    let compiler = Compiler::with_cache(cache()).unwrap();
    let good = compiler.compile(&kernels(), SM_90).unwrap();
    let [entry] = entries(&cache_dir(), "atlas").try_into().unwrap();
    let bytes = std::fs::read(&entry).unwrap();
    let damages: [(&str, Vec<u8>, &str); 5] = [
        (
            "a byte of the code flipped",
            {
                let mut b = bytes.clone();
                let at = b.len() - 100;
                b[at] ^= 0x40;
                b
            },
            "checksum",
        ),
        (
            "cut in half",
            bytes[..bytes.len() / 2].to_vec(),
            "truncated",
        ),
        ("cut inside the header", bytes[..20].to_vec(), "truncated"),
        ("empty", Vec::new(), "truncated"),
        (
            "another format",
            b"ATLASNVC\x09\0\0\0"
                .iter()
                .copied()
                .chain([0; 32])
                .collect(),
            "format",
        ),
    ];
    for (what, damaged, says) in damages {
        std::fs::write(&entry, &damaged).unwrap();
        let code = compiler.compile(&kernels(), SM_90).unwrap();
        match code.cache_outcome() {
            CacheOutcome::Replaced { reason } => assert!(reason.contains(says), "{what}: {reason}"),
            other => panic!("{what}: {other:?}"),
        }
        assert_eq!(code.image(), good.image(), "{what}");
        assert_eq!(
            std::fs::read(&entry).unwrap(),
            bytes,
            "{what}: the entry is whole again"
        );
        assert_eq!(
            compiler.compile(&kernels(), SM_90).unwrap().cache_outcome(),
            &CacheOutcome::Hit,
            "{what}"
        );
    }
}

#[test]
#[ignore = "needs NVRTC: `python3 kernels/nvrtc.py --fetch`, then `cargo test -p atlas-registry --test compile -- --ignored`"]
fn eviction_keeps_the_cache_within_its_bound_least_recently_used_first() {
    run_in_cache(eviction_removes_the_least_recently_used, &[], "evict");
}

fn eviction_removes_the_least_recently_used() {
    let source =
        |name: &str| CudaSource::new(format!("{name}.cu"), KERNELS).name_expression("scale_by<2>");
    let probe = Compiler::with_cache(cache()).unwrap();
    probe.compile(&source("a"), SM_90).unwrap();
    let [entry] = entries(&cache_dir(), "atlas").try_into().unwrap();
    let size = std::fs::metadata(&entry).unwrap().len();
    // Room for two entries and a half.
    let compiler = Compiler::with_cache(cache().max_bytes(size * 5 / 2)).unwrap();
    let outcome = |name: &str| {
        compiler
            .compile(&source(name), SM_90)
            .unwrap()
            .cache_outcome()
            .clone()
    };
    let pause = || std::thread::sleep(std::time::Duration::from_millis(20));
    pause();
    assert_eq!(outcome("b"), CacheOutcome::Stored);
    pause();
    assert_eq!(
        outcome("a"),
        CacheOutcome::Hit,
        "a is now used more recently than b"
    );
    pause();
    assert_eq!(outcome("c"), CacheOutcome::Stored);
    assert_eq!(entries(&cache_dir(), "atlas").len(), 2, "b was evicted");
    assert_eq!(outcome("a"), CacheOutcome::Hit);
    assert_eq!(outcome("c"), CacheOutcome::Hit);
    pause();
    assert_eq!(outcome("b"), CacheOutcome::Stored, "b was gone");
    let total: u64 = entries(&cache_dir(), "atlas")
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    assert!(
        total <= size * 5 / 2,
        "{total} bytes in a cache of {}",
        size * 5 / 2
    );
    // A bound smaller than one entry keeps only the entry just stored.
    let tiny = Compiler::with_cache(cache().max_bytes(1)).unwrap();
    assert_eq!(
        tiny.compile(&source("d"), SM_90).unwrap().cache_outcome(),
        &CacheOutcome::Stored
    );
    assert_eq!(entries(&cache_dir(), "atlas").len(), 1);
    assert_eq!(
        tiny.compile(&source("d"), SM_90).unwrap().cache_outcome(),
        &CacheOutcome::Hit
    );
}

#[test]
#[ignore = "needs NVRTC: `python3 kernels/nvrtc.py --fetch`, then `cargo test -p atlas-registry --test compile -- --ignored`"]
fn a_cache_that_cannot_be_written_does_not_fail_the_compile() {
    run_in_cache(an_unwritable_cache_still_compiles, &[], "unwritable");
}

fn an_unwritable_cache_still_compiles() {
    // The cache "directory" is a file: nothing can be created in it.
    let file = cache_dir().join("not-a-directory");
    std::fs::write(&file, b"x").unwrap();
    let compiler = Compiler::with_cache(CompileCache::at(&file)).unwrap();
    logger::install();
    let code = compiler.compile(&kernels(), SM_90).unwrap();
    match code.cache_outcome() {
        CacheOutcome::NotStored { reason } => {
            assert!(reason.contains("not-a-directory"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    // The application's logger hears of it too.
    let records = logger::records();
    assert!(
        records
            .iter()
            .any(|(level, target, text)| *level == log::Level::Warn
                && target.starts_with("atlas_registry::compile")
                && text.starts_with("compiled code was not cached: ")
                && text.contains("not-a-directory")),
        "{records:?}"
    );
    assert_eq!(validate_blob("k", code.image()).unwrap(), BlobKind::Cubin);
}

#[test]
#[ignore = "needs NVRTC: `python3 kernels/nvrtc.py --fetch`, then `cargo test -p atlas-registry --test compile -- --ignored`"]
fn processes_compiling_the_same_sources_at_once_never_see_a_partial_entry() {
    let library = nvrtc::library();
    let dir = fresh_dir("concurrent");
    let children: Vec<_> = (0..4)
        .map(|_| {
            let (library, dir) = (library.clone(), dir.to_path_buf());
            std::thread::spawn(move || {
                nvrtc::run_any(
                    publish_while_others_read,
                    &[],
                    &library,
                    &[(CACHE_VAR, dir.as_os_str())],
                )
            })
        })
        .collect();
    for child in children {
        let child = child.join().unwrap();
        assert_eq!(child.ending, child::Ending::Passed, "{child}");
    }
    assert!(entries(&dir, "tmp").is_empty(), "no temporary file is left");
    assert!(!entries(&dir, "atlas").is_empty());
}

/// Two threads, each compiling three sources in turn through a cache that holds one entry: every
/// store evicts the other entries, so reads race with writes and removals of the same files, in
/// this process and the other children.
fn publish_while_others_read() {
    let sources: Vec<CudaSource> = (0..3)
        .map(|i| CudaSource::new("k.cu", KERNELS).option(format!("-DVARIANT={i}")))
        .collect();
    let fresh = Compiler::with_cache(CompileCache::disabled()).unwrap();
    let want: Vec<Vec<u8>> = sources
        .iter()
        .map(|s| fresh.compile(s, SM_90).unwrap().image().to_vec())
        .collect();
    let compiler = Compiler::with_cache(cache().max_bytes(1)).unwrap();
    std::thread::scope(|scope| {
        for thread in 0..2 {
            let (sources, want, compiler) = (&sources, &want, &compiler);
            scope.spawn(move || {
                for round in 0..24 {
                    let i = (round + thread) % 3;
                    let code = compiler.compile(&sources[i], SM_90).unwrap();
                    assert!(
                        matches!(
                            code.cache_outcome(),
                            CacheOutcome::Hit | CacheOutcome::Stored
                        ),
                        "round {round}: {:?}",
                        code.cache_outcome()
                    );
                    assert_eq!(code.image(), want[i], "round {round}");
                }
            });
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Compiled modules in a registry and a library, on the stand-in driver.

/// Launches `scaled::scale_by<2>` and `scaled::scale` through the registry and checks them.
fn launch_both(registry: &AtlasRegistry) {
    let stream = registry.stream();
    let input: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5 - 3.0).collect();
    let n = input.len() as u32;
    let cfg = LaunchConfig::for_elements(n, 128);
    let mut x = DeviceBuffer::from_slice(registry.ctx(), stream, &input).unwrap();
    let by_2 = registry.function_cached("scaled", "scale_by<2>").unwrap();
    assert_eq!(by_2.name(), "scaled::scale_by<2>");
    // SAFETY: the kernel touches the `n` floats of `x`, which outlives the launch (`to_vec`).
    unsafe { by_2.launch(stream, &cfg, (&mut x, n)) }.unwrap();
    let scale = registry.function_cached("scaled", "scale").unwrap();
    // SAFETY: as above.
    unsafe { scale.launch(stream, &cfg, (&mut x, 1.5f32, n)) }.unwrap();
    let want: Vec<f32> = input.iter().map(|v| v * 2.0 * 1.5).collect();
    assert_eq!(x.to_vec(stream).unwrap(), want);
    // The C++ name and the symbol name the same kernel.
    let by_symbol = registry.function("scaled", SCALE_BY_2).unwrap();
    assert_eq!(by_symbol.raw().raw(), by_2.raw().raw());
    // A wrong argument list is refused against the compiled kernel's real layout.
    // SAFETY: refused before the driver.
    let e = unsafe { by_2.launch(stream, &cfg, (&mut x, 1.0f32, n)) }.unwrap_err();
    assert!(matches!(e, AtlasError::InvalidLaunch { .. }), "{e}");
}

fn model(preload: bool) -> Model<'static> {
    Model::new()
        .blobs(atlas_kernels::ptx_for_model("demo").unwrap())
        .source("scaled", kernels())
        .preload(preload)
        .cache(cache())
}

#[test]
#[ignore = "needs NVRTC: `python3 kernels/nvrtc.py --fetch`, then `cargo test -p atlas-registry --test compile -- --ignored`"]
fn compiled_modules_are_registry_modules_and_preload_fills_the_table() {
    run_in_cache(compiled_modules_launch_with_preload, &[], "preload");
}

fn compiled_modules_launch_with_preload() {
    let registry = AtlasRegistry::load_model(0, &model(true)).unwrap();
    assert_eq!(
        registry.module_names().collect::<Vec<_>>(),
        [
            "noop",
            "elementwise",
            "block_reduce",
            "device_global",
            "scaled"
        ]
    );
    assert_eq!(
        registry.module_kind("scaled"),
        Some(BlobKind::Cubin),
        "sm_90: the device's SASS"
    );
    assert_eq!(
        registry.cache_outcome("scaled"),
        Some(&CacheOutcome::Stored)
    );
    assert_eq!(registry.cache_outcome("noop"), None, "a blob");
    assert!(
        probe().count("cuModuleEnumerateFunctions") >= 5,
        "every module was listed"
    );
    let lookups = probe().count("cuModuleGetFunction");
    launch_both(&registry);
    // SAFETY: `noop` takes no arguments.
    unsafe {
        registry.function_cached("noop", "noop").unwrap().launch(
            registry.stream(),
            &LaunchConfig::for_elements(1, 1),
            (),
        )
    }
    .unwrap();
    assert_eq!(
        probe().count("cuModuleGetFunction") - lookups,
        1,
        "only the lookup by symbol (`function`) asks the driver: every cached lookup was preloaded"
    );
    drop(registry);
    // The second load takes the module from the cache.
    let again = AtlasRegistry::load_model(0, &model(true)).unwrap();
    assert_eq!(again.cache_outcome("scaled"), Some(&CacheOutcome::Hit));
    launch_both(&again);
}

#[test]
#[ignore = "needs NVRTC: `python3 kernels/nvrtc.py --fetch`, then `cargo test -p atlas-registry --test compile -- --ignored`"]
fn compiled_modules_launch_without_preload_and_preload_reads_blobs_on_older_drivers() {
    run_in_cache(compiled_modules_launch_without_preload, &[], "lazy");
    run_in_cache(
        compiled_modules_launch_with_preload_from_blobs,
        &["-DSTANDIN_NO_ENUMERATE"],
        "preload-from-blobs",
    );
}

fn compiled_modules_launch_without_preload() {
    let registry = AtlasRegistry::load_model(0, &model(false)).unwrap();
    assert_eq!(probe().count("cuModuleEnumerateFunctions"), 0);
    let lookups = probe().count("cuModuleGetFunction");
    launch_both(&registry);
    assert_eq!(
        probe().count("cuModuleGetFunction") - lookups,
        3,
        "each kernel looked up on first use"
    );
}

fn compiled_modules_launch_with_preload_from_blobs() {
    let registry = AtlasRegistry::load_model(0, &model(true)).unwrap();
    let lookups = probe().count("cuModuleGetFunction");
    launch_both(&registry);
    assert_eq!(
        probe().count("cuModuleGetFunction") - lookups,
        1,
        "preloaded from the blobs' kernel lists"
    );
}

#[test]
#[ignore = "needs NVRTC: `python3 kernels/nvrtc.py --fetch`, then `cargo test -p atlas-registry --test compile -- --ignored`"]
fn a_library_compiles_a_source_once_per_architecture_present() {
    run_in_cache(
        a_library_compiles_once_per_architecture,
        &["-DSTANDIN_DEVICES=2"],
        "library",
    );
}

fn a_library_compiles_once_per_architecture() {
    let library = AtlasLibrary::load_model(&model(true)).unwrap();
    let entries_made = entries(&cache_dir(), "atlas").len();
    assert_eq!(
        entries_made, 1,
        "two devices of one architecture: one compile"
    );
    for ordinal in 0..2 {
        let registry = library.registry(ordinal).unwrap();
        assert_eq!(
            registry.cache_outcome("scaled"),
            Some(&CacheOutcome::Stored)
        );
        launch_both(&registry);
    }
}

#[test]
fn a_missing_nvrtc_is_one_error_naming_what_was_tried() {
    let dir = fresh_dir("missing");
    let child = child::run_with_env(
        a_missing_nvrtc_is_one_error,
        Some(&support::standin::build(&[])),
        &[
            (
                "ATLAS_NVRTC_PATH",
                OsStr::new("/nonexistent/libnvrtc.so.12"),
            ),
            (CACHE_VAR, dir.as_os_str()),
        ],
    );
    assert_eq!(child.ending, child::Ending::Passed, "{child}");
}

fn a_missing_nvrtc_is_one_error() {
    for e in [
        Compiler::new().unwrap_err(),
        AtlasRegistry::load_model(0, &model(false)).unwrap_err(),
    ] {
        assert!(matches!(e, AtlasError::NvrtcUnavailable(_)), "{e:?}");
        let text = e.to_string();
        assert!(text.starts_with("cannot load NVRTC"), "{text}");
        assert!(text.contains("/nonexistent/libnvrtc.so.12"), "{text}");
        assert!(
            !text.contains("libnvrtc.so.13"),
            "the override is the only one tried: {text}"
        );
        assert_eq!(text.lines().count(), 1, "{text}");
    }
    // A model of blobs never needs NVRTC.
    let blobs = Model::new()
        .blobs(atlas_kernels::ptx_for_model("demo").unwrap())
        .preload(true);
    let registry = AtlasRegistry::load_model(0, &blobs).unwrap();
    assert!(registry.has_module("elementwise"));
}

#[test]
#[ignore = "needs NVRTC: `python3 kernels/nvrtc.py --fetch`, then `cargo test -p atlas-registry --test compile -- --ignored`"]
fn a_compile_error_fails_the_model_load_with_nvrtcs_log() {
    run_in_cache(a_compile_error_fails_the_model_load, &[], "load-error");
}

fn a_compile_error_fails_the_model_load() {
    let broken = Model::new()
        .blobs(atlas_kernels::ptx_for_model("demo").unwrap())
        .source(
            "broken",
            CudaSource::new("broken.cu", "__global__ void k() { undefined(); }"),
        )
        .cache(cache());
    let e = AtlasRegistry::load_model(0, &broken).unwrap_err();
    assert!(
        matches!(&e, AtlasError::Compile { log, .. } if log.contains("undefined")),
        "{e}"
    );
    assert_eq!(probe().count("live_modules"), 0, "nothing was loaded");
    // A malformed blob is refused before anything is compiled.
    let bad = Model::new()
        .blob("bad", b"\x7fELF\x02\x01\x01")
        .source("scaled", kernels())
        .cache(cache());
    let e = AtlasRegistry::load_model(0, &bad).unwrap_err();
    assert!(
        matches!(&e, AtlasError::InvalidModule { module, .. } if module == "bad"),
        "{e}"
    );
    assert!(
        entries(&cache_dir(), "atlas").is_empty(),
        "nothing was compiled"
    );
}

#[test]
#[ignore = "needs NVRTC: `python3 kernels/nvrtc.py --fetch`, then `cargo test -p atlas-registry --test compile -- --ignored`"]
fn an_nvrtc_of_a_newer_cuda_than_the_driver_is_refused_naming_both() {
    // A CUDA 11.8 driver: older than any NVRTC the tests use.
    run_in_cache(
        an_nvrtc_newer_than_the_driver_is_refused,
        &["-DSTANDIN_DRIVER_VERSION=11080"],
        "newer",
    );
}

fn an_nvrtc_newer_than_the_driver_is_refused() {
    let e = AtlasRegistry::load_model(0, &model(false)).unwrap_err();
    let AtlasError::CannotCompile { module, reason } = &e else {
        panic!("{e:?}");
    };
    assert_eq!(module, "scaled");
    assert!(
        matches!(
            reason,
            atlas_registry::CompileRefusal::NewerThanDriver {
                driver: (11, 8),
                ..
            }
        ),
        "{reason:?}"
    );
    let text = e.to_string();
    assert!(
        text.contains("this driver is CUDA 11.8") && text.contains("ATLAS_NVRTC_PATH"),
        "{text}"
    );
    assert!(
        entries(&cache_dir(), "atlas").is_empty(),
        "nothing was compiled"
    );
}
