//! Names and ordinals: module names given twice (any shape, NULs included) are refused before the
//! driver, device ordinals out of range are typed errors, and names a registry does not have are
//! `AtlasError::NotFound` naming `module` or `module::name`.
//!
//! The duplicate and ordinal tests need no driver; the lookups run against the stand-in libcuda
//! (`support/standin`), each in a child process: `cargo test -p atlas-registry --test names`.

mod support;

use atlas_kernels::ptx_for_model;
use atlas_registry::{AtlasError, AtlasRegistry, NotFoundKind, host};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use support::blobs::blob_of;
use support::child;
use support::standin::{self, probe};

child::bodies!(
    unknown_functions_and_symbols_are_not_found,
    names_with_a_nul_are_not_found_without_the_driver,
    misspelled_names_list_the_closest_first,
);

proptest! {
    // Cases: 256 by default, `PROPTEST_CASES` for more. A failure is saved beside this file, in
    // `names.proptest-regressions`, and tried first on later runs.
    #![proptest_config(ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    /// Any module name, NULs and control characters included, given twice: refused before the
    /// driver is involved, naming the module escaped; never a panic.
    #[test]
    fn duplicate_names_of_any_shape_are_refused_naming_them(
        name in any::<String>(),
        other in any::<String>(),
    ) {
        let blob: &[u8] = b".version 9.0\n";
        for err in [
            AtlasRegistry::load(0, &[(name.as_str(), blob), (other.as_str(), blob), (name.as_str(), blob)])
                .unwrap_err(),
            atlas_registry::AtlasLibrary::load(&[(name.as_str(), blob), (name.as_str(), blob)]).unwrap_err(),
        ] {
            let first_duplicate = if other == name { &other } else { &name };
            match &err {
                AtlasError::InvalidModule { module, reason } => {
                    prop_assert_eq!(module, &first_duplicate.escape_debug().to_string());
                    prop_assert!(reason.contains("twice"), "{}", reason);
                }
                _ => prop_assert!(false, "expected InvalidModule, got {}", err),
            }
        }
    }
}

#[test]
fn duplicate_module_names_are_refused_before_the_driver() {
    // No driver is needed: the names are checked first.
    let ptx = blob_of(ptx_for_model("demo").unwrap(), "noop");
    let e = AtlasRegistry::load(0, &[("noop", ptx), ("noop", ptx)]).unwrap_err();
    assert!(
        matches!(&e, AtlasError::InvalidModule { module, reason } if module == "noop" && reason.contains("twice")),
        "{e:?}"
    );
    let e = AtlasRegistry::load(0, &[("a\0b", ptx), ("a\0b", ptx)]).unwrap_err();
    assert!(e.to_string().contains("module `a\\0b`"), "{e}");
}

#[test]
fn bad_ordinals_are_typed_errors_with_or_without_a_driver() {
    let demo = ptx_for_model("demo").unwrap();
    for ordinal in [99, usize::MAX] {
        let e = AtlasRegistry::load(ordinal, demo).unwrap_err();
        if atlas_registry::sys::driver().is_err() {
            // No driver here: the error says so, and lists where it looked.
            assert!(matches!(e, AtlasError::DriverUnavailable(_)), "{e:?}");
            assert!(e.to_string().contains("libcuda"), "{e}");
        } else {
            assert!(
                matches!(e, AtlasError::InvalidDevice { ordinal: o, .. } if o == ordinal),
                "{e:?}"
            );
        }
        let e = host(ordinal).unwrap_err();
        assert!(
            matches!(
                e,
                AtlasError::DriverUnavailable(_) | AtlasError::InvalidDevice { .. }
            ),
            "{e:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Lookups, against the stand-in
// ---------------------------------------------------------------------------------------------

/// `e` is `NotFound` of `kind`, and its message names `name` (`module` or `module::name`).
#[track_caller]
fn assert_not_found(e: AtlasError, kind: NotFoundKind, name: &str) {
    assert!(
        matches!(&e, AtlasError::NotFound { kind: k, .. } if *k == kind),
        "expected {kind} `{name}` not found, got {e:?}"
    );
    let text = e.to_string();
    assert!(text.contains(&format!("`{name}`")), "{text}");
    assert!(text.contains("not found"), "{text}");
}

#[test]
fn unknown_functions_and_device_symbols_are_not_found_naming_module_and_name() {
    standin::run(unknown_functions_and_symbols_are_not_found, &[]);
}

fn unknown_functions_and_symbols_are_not_found() {
    let registry = AtlasRegistry::load(0, ptx_for_model("demo").unwrap()).unwrap();
    assert_not_found(
        registry.function("elementwise", "nope").unwrap_err(),
        NotFoundKind::Function,
        "elementwise::nope",
    );
    assert_not_found(
        registry.function_cached("elementwise", "nope").unwrap_err(),
        NotFoundKind::Function,
        "elementwise::nope",
    );
    assert_not_found(
        registry
            .raw_function_cached("elementwise", "nope")
            .unwrap_err(),
        NotFoundKind::Function,
        "elementwise::nope",
    );
    assert_not_found(
        registry.device_symbol("device_global", "nope").unwrap_err(),
        NotFoundKind::Symbol,
        "device_global::nope",
    );
    // The driver was asked, and said CUDA_ERROR_NOT_FOUND: that is what became NotFound.
    assert!(probe().count("cuModuleGetFunction") >= 1);
    assert!(probe().count("cuModuleGetGlobal_v2") >= 1);
    // An unknown module: NotFound naming it and listing the registry's modules.
    for e in [
        registry.function("no_such_module", "scale").unwrap_err(),
        registry
            .device_symbol("no_such_module", "bias")
            .unwrap_err(),
    ] {
        assert!(
            e.to_string().contains("elementwise"),
            "lists the modules: {e}"
        );
        assert_not_found(e, NotFoundKind::Module, "no_such_module");
    }
    // The names that exist still resolve after the misses.
    registry.function("elementwise", "scale").unwrap();
    registry.device_symbol("device_global", "bias").unwrap();
}

#[test]
fn a_misspelled_kernel_variable_or_module_lists_those_that_exist_closest_first() {
    standin::run(misspelled_names_list_the_closest_first, &[]);
}

#[test]
fn without_the_drivers_list_of_kernels_the_blobs_are_listed() {
    standin::run(
        misspelled_names_list_the_closest_first,
        &["-DSTANDIN_NO_ENUMERATE"],
    );
}

fn misspelled_names_list_the_closest_first() {
    let registry = AtlasRegistry::load(0, ptx_for_model("demo").unwrap()).unwrap();
    let e = registry.function("elementwise", "scal").unwrap_err();
    let AtlasError::NotFound { closest, .. } = &e else {
        panic!("expected NotFound, got {e:?}");
    };
    assert_eq!(closest.first().map(String::as_str), Some("scale"), "{e}");
    assert!(
        closest.iter().any(|k| k == "axpy"),
        "every kernel is listed: {e}"
    );
    let text = e.to_string();
    assert!(
        text.starts_with(
            "function `elementwise::scal` not found; the module has the kernels `scale`, "
        ) && text.ends_with(" (closest first)"),
        "{text}"
    );

    let e = registry.device_symbol("device_global", "bais").unwrap_err();
    let text = e.to_string();
    assert_eq!(
        text,
        "device symbol `device_global::bais` not found; the module has the variables `bias`"
    );

    let e = registry.function("elementwis", "scale").unwrap_err();
    let text = e.to_string();
    assert!(
        text.starts_with("module `elementwis` not found; the registry has `elementwise`"),
        "{text}"
    );
    let AtlasError::NotFound { closest, .. } = &e else {
        panic!("expected NotFound, got {e:?}");
    };
    let mut sorted = closest.to_vec();
    sorted.sort();
    let mut modules: Vec<String> = registry.module_names().map(str::to_owned).collect();
    modules.sort();
    assert_eq!(sorted, modules, "every module is listed");
}

#[test]
fn names_with_a_nul_are_not_found_before_the_driver_is_asked() {
    standin::run(names_with_a_nul_are_not_found_without_the_driver, &[]);
}

fn names_with_a_nul_are_not_found_without_the_driver() {
    let registry = AtlasRegistry::load(0, ptx_for_model("demo").unwrap()).unwrap();
    probe().reset();
    for (e, kind, name) in [
        (
            registry.function("elementwise", "sc\0ale").unwrap_err(),
            NotFoundKind::Function,
            "elementwise::sc\\0ale",
        ),
        (
            registry
                .function_cached("elementwise", "sc\0ale")
                .unwrap_err(),
            NotFoundKind::Function,
            "elementwise::sc\\0ale",
        ),
        (
            registry
                .device_symbol("device_global", "bi\0as")
                .unwrap_err(),
            NotFoundKind::Symbol,
            "device_global::bi\\0as",
        ),
        (
            registry.function("element\0wise", "scale").unwrap_err(),
            NotFoundKind::Module,
            "element\\0wise",
        ),
    ] {
        if kind != NotFoundKind::Module {
            assert!(e.to_string().contains("NUL"), "says why: {e}");
        }
        assert_not_found(e, kind, name);
    }
    assert_eq!(
        (
            probe().count("cuModuleGetFunction"),
            probe().count("cuModuleGetGlobal_v2")
        ),
        (0, 0),
        "a name with a NUL never reaches the driver"
    );
}
