//! Bad blobs and bad names on a real GPU: each refused with a typed error naming the module (or
//! `module::name`), and the registry, the device and new loads keep working afterwards; a
//! thousand random blobs are refused without a crash.
//!
//! Every case is a test of its own (all under one module, so that filtering on
//! `bad_blobs_and_names_are_typed_errors_and_the_registry_keeps_working` runs them all), each
//! followed by the same checks that nothing else suffered.
//!
//! GPU: `cargo test -p atlas-registry --test bad_blobs -- --include-ignored`.

mod support;

use atlas_registry::{AtlasError, device_count, sniff};
use support::blobs::{NEEDS_GPU, load, load_err, plausible_elf, plausible_fatbin};
use support::child::{self, Ending};
use support::reference::scale_and_check;
use support::rng::Rng;

child::bodies!(throw_random_blobs);

mod bad_blobs_and_names_are_typed_errors_and_the_registry_keeps_working {
    use atlas_kernels::{ELEMENTWISE_FATBIN, cubin_for_model, ptx_for_model};
    use atlas_registry::{AtlasError, AtlasRegistry, FunctionCache, NotFoundKind};

    use crate::support::blobs::{blob_of, load, load_err};
    use crate::support::reference::scale_and_check;
    use crate::support::rng::Rng;

    /// What a case works with: the demo model loaded on device 0 (checked against the CPU before
    /// the case), and the `elementwise` module as PTX and as a cubin for this device.
    struct Demo {
        registry: AtlasRegistry,
        ptx: &'static [u8],
        cubin: &'static [u8],
    }

    /// Runs `case`, then checks that the registry, the device and new loads still work.
    fn after(case: impl FnOnce(&Demo)) {
        let mut rng = Rng::new();
        let registry = load("demo");
        scale_and_check(&registry, &mut rng);
        let ptx = blob_of(ptx_for_model("demo").unwrap(), "elementwise");
        let (major, minor) = registry.host().compute_capability();
        let cubin = blob_of(
            cubin_for_model("demo", major * 10 + minor).unwrap(),
            "elementwise",
        );
        let demo = Demo {
            registry,
            ptx,
            cubin,
        };
        case(&demo);
        scale_and_check(&demo.registry, &mut rng);
        let again = load("demo");
        scale_and_check(&again, &mut rng);
        let bias = again.device_symbol("device_global", "bias").expect("bias");
        bias.write(&[0.25f32]).expect("write bias");
        let mut read = [0f32];
        bias.read(&mut read).expect("read bias");
        assert_eq!(read, [0.25]);
    }

    /// `e` is `InvalidModule` naming `module`, and its reason says `says`.
    #[track_caller]
    fn assert_invalid(e: &AtlasError, module: &str, says: &str) {
        assert!(matches!(e, AtlasError::InvalidModule { .. }), "{e:?}");
        let text = e.to_string();
        assert!(
            text.contains(&format!("module `{module}`: ")) && text.contains(says),
            "expected module `{module}` refused saying {says:?}: {text}"
        );
    }

    /// `e` is `NotFound` of `kind`, and its message names `name` (`module` or `module::name`).
    #[track_caller]
    fn assert_not_found(e: AtlasError, kind: NotFoundKind, name: &str) {
        assert!(
            matches!(&e, AtlasError::NotFound { kind: k, .. } if *k == kind),
            "expected {kind} `{name}` not found, got {e:?}"
        );
        assert!(e.to_string().contains(&format!("`{name}`")), "{e}");
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn an_empty_blob_is_refused_before_the_driver() {
        after(|_| assert_invalid(&load_err(&[("empty_mod", &b""[..])]), "empty_mod", "empty"));
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn ptx_with_a_nul_inside_is_refused_naming_the_offset() {
        after(|demo| {
            let mut with_nul = demo.ptx.to_vec();
            with_nul[100] = 0;
            assert_invalid(
                &load_err(&[("nul_mod", &with_nul)]),
                "nul_mod",
                "offset 100",
            );
        });
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn a_module_name_with_a_nul_is_escaped_in_the_error() {
        after(|_| {
            let e = load_err(&[("bad\0name", &b""[..])]);
            assert!(e.to_string().contains("bad\\0name"), "{e}");
        });
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn truncated_cubins_are_refused() {
        after(|demo| {
            let cubin = demo.cubin;
            for cut in [10, 63, 64, cubin.len() / 2, cubin.len() - 1] {
                let e = load_err(&[("cut_cubin", &cubin[..cut])]);
                assert_invalid(&e, "cut_cubin", "truncated");
            }
        });
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn truncated_fatbins_are_refused() {
        after(|_| {
            let fatbin = ELEMENTWISE_FATBIN;
            for cut in [5, 15, 16, fatbin.len() / 2, fatbin.len() - 1] {
                let e = load_err(&[("cut_fatbin", &fatbin[..cut])]);
                assert_invalid(&e, "cut_fatbin", "truncated");
            }
        });
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn an_elf_file_for_another_machine_is_refused() {
        after(|demo| {
            let mut x86 = demo.cubin.to_vec();
            x86[18..20].copy_from_slice(&62u16.to_le_bytes());
            assert_invalid(&load_err(&[("x86_mod", &x86)]), "x86_mod", "machine 62");
        });
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn truncated_ptx_fails_to_load_naming_the_module() {
        after(|demo| {
            let e = load_err(&[("cut_ptx", &demo.ptx[..demo.ptx.len() / 2])]);
            assert!(matches!(&e, AtlasError::ModuleLoad { .. }), "{e:?}");
            assert!(e.to_string().contains("module `cut_ptx`"), "{e}");
        });
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn a_ptx_syntax_error_gives_a_jit_log_naming_the_line() {
        after(|demo| {
            let text = std::str::from_utf8(demo.ptx).expect("PTX is text");
            let mut lines: Vec<&str> = text.lines().collect();
            let at = lines
                .iter()
                .position(|l| l.starts_with(".address_size"))
                .expect("an .address_size line")
                + 1;
            lines.insert(at, "this is not ptx;");
            let broken = lines.join("\n");
            let e = load_err(&[("syntax_mod", broken.as_bytes())]);
            assert!(matches!(&e, AtlasError::ModuleLoad { .. }), "{e:?}");
            let text = e.to_string();
            assert!(text.contains("module `syntax_mod`"), "{text}");
            let (_, log) = text
                .split_once("JIT log")
                .unwrap_or_else(|| panic!("the message shows no JIT log: {text}"));
            assert!(
                log.contains(&format!("line {}", at + 1)),
                "the JIT log must name line {}: {log:?}",
                at + 1
            );
        });
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn a_good_module_then_a_bad_one_fails_naming_the_bad_one() {
        after(|demo| {
            let e = load_err(&[
                ("good", demo.ptx),
                ("bad_second", &demo.ptx[..demo.ptx.len() / 3]),
            ]);
            assert!(e.to_string().contains("bad_second"), "{e}");
        });
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn an_unknown_module_is_not_found_listing_the_modules() {
        after(|demo| {
            let registry = &demo.registry;
            assert_not_found(
                registry.function("no_such_module", "scale").unwrap_err(),
                NotFoundKind::Module,
                "no_such_module",
            );
            let e = registry
                .function_cached("no_such_module", "scale")
                .unwrap_err();
            assert!(
                e.to_string().contains("elementwise"),
                "lists the modules: {e}"
            );
            assert_not_found(e, NotFoundKind::Module, "no_such_module");
            assert_not_found(
                registry
                    .device_symbol("no_such_module", "bias")
                    .unwrap_err(),
                NotFoundKind::Module,
                "no_such_module",
            );
        });
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn an_unknown_function_is_not_found_naming_module_and_name() {
        static MISSING: FunctionCache = FunctionCache::new("elementwise", "missing");
        after(|demo| {
            let registry = &demo.registry;
            assert_not_found(
                registry.function("elementwise", "no_such_fn").unwrap_err(),
                NotFoundKind::Function,
                "elementwise::no_such_fn",
            );
            assert_not_found(
                registry
                    .raw_function_cached("elementwise", "no_such_fn")
                    .unwrap_err(),
                NotFoundKind::Function,
                "elementwise::no_such_fn",
            );
            assert_not_found(
                MISSING.get(registry).unwrap_err(),
                NotFoundKind::Function,
                "elementwise::missing",
            );
        });
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn a_function_of_another_module_is_not_found() {
        after(|demo| {
            assert_not_found(
                demo.registry.function("noop", "scale").unwrap_err(),
                NotFoundKind::Function,
                "noop::scale",
            );
        });
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn an_unknown_device_symbol_is_not_found_naming_module_and_name() {
        after(|demo| {
            assert_not_found(
                demo.registry
                    .device_symbol("device_global", "no_such_symbol")
                    .unwrap_err(),
                NotFoundKind::Symbol,
                "device_global::no_such_symbol",
            );
        });
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn names_with_a_nul_are_not_found_escaped() {
        after(|demo| {
            let registry = &demo.registry;
            assert_not_found(
                registry.function("elementwise", "sc\0ale").unwrap_err(),
                NotFoundKind::Function,
                "elementwise::sc\\0ale",
            );
            assert_not_found(
                registry
                    .function_cached("elementwise", "sc\0ale")
                    .unwrap_err(),
                NotFoundKind::Function,
                "elementwise::sc\\0ale",
            );
            assert_not_found(
                registry
                    .device_symbol("device_global", "bi\0as")
                    .unwrap_err(),
                NotFoundKind::Symbol,
                "device_global::bi\\0as",
            );
            assert_not_found(
                registry.function("element\0wise", "scale").unwrap_err(),
                NotFoundKind::Module,
                "element\\0wise",
            );
            assert!(
                registry
                    .function("elementwise", "sc\0ale")
                    .unwrap_err()
                    .to_string()
                    .contains("NUL"),
                "says why"
            );
        });
    }
}

// ---------------------------------------------------------------------------------------------
// A thousand random blobs (child process)
// ---------------------------------------------------------------------------------------------

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_thousand_random_blobs_are_refused_without_a_crash() {
    // In a child process: a blob that crashes the driver takes the child down, not this harness.
    assert!(device_count().expect(NEEDS_GPU) >= 1, "{NEEDS_GPU}");
    let child = child::run_on(throw_random_blobs, None);
    child.print_tail("random_blobs");
    let (stdout, stderr) = (&child.stdout, &child.stderr);
    let last_blob = stdout
        .lines()
        .rfind(|l| l.starts_with("BLOB "))
        .unwrap_or("(none)");
    let seed = stdout
        .lines()
        .find(|l| l.contains("ATLAS_TEST_SEED="))
        .unwrap_or("(no seed printed)");
    assert!(
        child.ending == Ending::Passed && stdout.contains("CHILD done"),
        "the child failed ({:?}); the last blob it started loading: {last_blob}; {seed}\n{}",
        child.ending,
        child::tail(stderr, 30)
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// Loads a good registry, then throws 1,000 random blobs at `AtlasRegistry::load`: raw bytes,
/// bytes behind a bare ELF or fatbin magic, behind ELF and fatbin headers that pass Atlas's header
/// checks, and PTX-looking garbage. Each must be refused with an error naming its module; then the
/// registry and a fresh load must still work. Prints `BLOB i` before each load, so that a parent
/// can tell which blob killed the process.
fn throw_random_blobs() {
    let mut rng = Rng::new();
    let registry = load("demo");
    scale_and_check(&registry, &mut rng);
    let mut driver_refused = [0usize; 6];
    for i in 0..1000 {
        let len = rng.index(4096);
        let body = rng.bytes(len);
        let blob = match i % 6 {
            0 => body,
            1 => [b"\x7fELF".as_slice(), &body].concat(),
            2 => [0xBA55_ED50u32.to_le_bytes().as_slice(), &body].concat(),
            3 => plausible_elf(&body),
            4 => plausible_fatbin(&body),
            _ => {
                // No `/`, so no comment can hide the garbage, and a stray `}` first, so that it
                // can never be valid PTX.
                let garbage: String = body
                    .iter()
                    .map(|&b| match char::from(b' ' + b % 95) {
                        '/' => '|',
                        c => c,
                    })
                    .collect();
                format!(".version 9.0\n.target sm_90\n.address_size 64\n}} {garbage}").into_bytes()
            }
        };
        let name = format!("fuzz_{i}");
        println!(
            "BLOB {i}: {} ({:?}, {} bytes)",
            RANDOM_BLOB_KINDS[i % 6],
            sniff(&blob),
            blob.len()
        );
        let e = load_err(&[(name.as_str(), &blob)]);
        assert!(
            matches!(
                e,
                AtlasError::InvalidModule { .. }
                    | AtlasError::TooLargeToCheck { .. }
                    | AtlasError::ModuleLoad { .. }
            ),
            "blob {i} ({}, {} bytes): {e:?}",
            RANDOM_BLOB_KINDS[i % 6],
            blob.len()
        );
        assert!(e.to_string().contains(&name), "blob {i}: {e}");
        // A bad blob is the blob's fault: the context is fine, and nobody should restart for it.
        assert!(
            !e.is_context_lost(),
            "blob {i} ({}): a bad blob reported as a lost context: {e:?}",
            RANDOM_BLOB_KINDS[i % 6]
        );
        driver_refused[i % 6] += usize::from(matches!(e, AtlasError::ModuleLoad { .. }));
    }
    println!("CHILD refused by the driver rather than by Atlas, by kind: {driver_refused:?}");
    scale_and_check(&registry, &mut rng);
    scale_and_check(&load("demo"), &mut rng);
    println!("CHILD done");
}

/// What each of `child_random_blobs`'s six kinds of blob is.
const RANDOM_BLOB_KINDS: [&str; 6] = [
    "random bytes",
    "random bytes behind \\x7fELF",
    "random bytes behind the fatbin magic",
    "random bytes behind an ELF header that passes Atlas's checks",
    "random bytes behind a fatbin header that passes Atlas's checks",
    "PTX-looking garbage",
];
