//! Code built for one compute capability ("a", architecture-specific: `sm_90a`, `compute_100a`)
//! or one family ("f": `sm_100f`, `compute_120f`) runs only there: "a" code on its own compute
//! capability alone, "f" code on the devices of its major version and the same or a newer minor
//! one (CUDA Programming Guide, "Feature Set Compiler Targets", Table 28: `compute_100f` on 10.0
//! and 10.3, `compute_120f` on 12.0 and 12.1, `compute_103f` on 10.3). Atlas chooses, hands over
//! and refuses by that rule: a blob set's choice, the cubin a registry hands the driver in place
//! of a fatbin, and the refusal of a module a device runs none of.
//!
//! The fixtures (`fixtures/arch_variants/`, made by `make.sh` there with nvcc 13.0) are
//! `k.cu`'s `add_one` for every architecture from sm_90 to sm_121f; `h200_verdicts.tsv` is what
//! the plain driver answered for each on an H200 (9.0). [`RUNS_ON`] says where each runs, by the
//! documented rule; on 9.0 it agrees with the H200 ([`the_table_agrees_with_the_h200`]).
//! Against the stand-in libcuda playing devices of 9.0, 10.0, 10.3, 11.0, 12.0 and 12.1, each
//! fixture loads where it runs and is refused elsewhere before the driver is called:
//! `cargo test -p atlas-registry --test arch_variants`. On the H200 (`--include-ignored`), Atlas
//! loads what the driver loads, refuses the rest, and the sm_90a code computes `add_one`.

mod support;

use atlas_registry::{
    AtlasError, AtlasLibrary, AtlasRegistry, BlobKind, BlobSet, DeviceBuffer, LaunchConfig, Model,
    host, validate_blob_for_device,
};
use support::child::{self, Ending};
use support::fatbin::Fatbin;
use support::rng::Rng;
use support::standin::{self, probe};

child::bodies!(
    each_fixture_loads_where_it_runs,
    a_library_chooses_per_device_within_a_family,
    gpu_loads_what_the_h200_loads,
);

macro_rules! fixtures {
    ($($name:literal),* $(,)?) => {
        /// Every fixture, by file name.
        const FIXTURES: &[(&str, &[u8])] = &[$(
            ($name, include_bytes!(concat!("fixtures/arch_variants/", $name))),
        )*];
    };
}

fixtures!(
    "k.sm_90.cubin",
    "k.sm_90a.cubin",
    "k.sm_100.cubin",
    "k.sm_100a.cubin",
    "k.sm_100f.cubin",
    "k.sm_103.cubin",
    "k.sm_103a.cubin",
    "k.sm_103f.cubin",
    "k.sm_110.cubin",
    "k.sm_110f.cubin",
    "k.sm_120.cubin",
    "k.sm_120a.cubin",
    "k.sm_120f.cubin",
    "k.sm_121.cubin",
    "k.sm_121a.cubin",
    "k.sm_121f.cubin",
    "k.sm_90.fatbin",
    "k.sm_90a.fatbin",
    "k.sm_100.fatbin",
    "k.sm_100a.fatbin",
    "k.sm_100f.fatbin",
    "k.sm_103.fatbin",
    "k.sm_103a.fatbin",
    "k.sm_103f.fatbin",
    "k.sm_110.fatbin",
    "k.sm_110f.fatbin",
    "k.sm_120.fatbin",
    "k.sm_120a.fatbin",
    "k.sm_120f.fatbin",
    "k.sm_121.fatbin",
    "k.sm_121a.fatbin",
    "k.sm_121f.fatbin",
    "k.compute_90.fatbin",
    "k.compute_90a.fatbin",
    "k.compute_100.fatbin",
    "k.compute_100a.fatbin",
    "k.compute_100f.fatbin",
    "k.compute_103.fatbin",
    "k.compute_103a.fatbin",
    "k.compute_103f.fatbin",
    "k.compute_110.fatbin",
    "k.compute_110f.fatbin",
    "k.compute_120.fatbin",
    "k.compute_120a.fatbin",
    "k.compute_120f.fatbin",
    "k.compute_121.fatbin",
    "k.compute_121a.fatbin",
    "k.compute_121f.fatbin",
    "k.compute_90.ptx",
    "k.compute_90a.ptx",
    "k.compute_100.ptx",
    "k.compute_100a.ptx",
    "k.compute_100f.ptx",
    "k.compute_103.ptx",
    "k.compute_103a.ptx",
    "k.compute_103f.ptx",
    "k.compute_110.ptx",
    "k.compute_110f.ptx",
    "k.compute_120.ptx",
    "k.compute_120a.ptx",
    "k.compute_120f.ptx",
    "k.compute_121.ptx",
    "k.compute_121a.ptx",
    "k.compute_121f.ptx",
    "k.mixed.fatbin",
    "k.sm_90a+compute_90.fatbin",
);

/// What the plain driver answered for each fixture on the H200: file, status code, status name.
const H200_VERDICTS: &str = include_str!("fixtures/arch_variants/h200_verdicts.tsv");

type Cc = (u32, u32);

/// The compute capabilities the stand-in plays: Hopper, the two Blackwell data-center parts (one
/// family), Thor (a Tegra part, a family of its own), and the two 12.x parts (one family).
const CCS: [Cc; 6] = [(9, 0), (10, 0), (10, 3), (11, 0), (12, 0), (12, 1)];

/// Every compute capability of [`CCS`] from the first of `major`'s with a minor of `minor` or more
/// up: where plain PTX for `major.minor` runs.
const fn from(major: u32, minor: u32) -> &'static [Cc] {
    match (major, minor) {
        (9, 0) => &CCS,
        (10, 0) => &[(10, 0), (10, 3), (11, 0), (12, 0), (12, 1)],
        (10, 3) => &[(10, 3), (11, 0), (12, 0), (12, 1)],
        (11, 0) => &[(11, 0), (12, 0), (12, 1)],
        (12, 0) => &[(12, 0), (12, 1)],
        _ => &[(12, 1)],
    }
}

/// Where each fixture runs, of [`CCS`], by the documented rule: SASS on its major version's
/// devices of the same or a newer minor one (Tegra's only on its own: Thor, 11.0, is alone in
/// its major version here); "a" code on its own compute capability alone; "f" code within its
/// family; plain PTX on every device at least as new. An "f" cubin outside a fatbin is plain SASS
/// of its SM (nothing in it says "f"), which runs within its family anyway.
const RUNS_ON: &[(&str, &[Cc])] = &[
    ("k.sm_90.cubin", &[(9, 0)]),
    ("k.sm_90a.cubin", &[(9, 0)]),
    ("k.sm_100.cubin", &[(10, 0), (10, 3)]),
    ("k.sm_100a.cubin", &[(10, 0)]),
    ("k.sm_100f.cubin", &[(10, 0), (10, 3)]),
    ("k.sm_103.cubin", &[(10, 3)]),
    ("k.sm_103a.cubin", &[(10, 3)]),
    ("k.sm_103f.cubin", &[(10, 3)]),
    ("k.sm_110.cubin", &[(11, 0)]),
    ("k.sm_110f.cubin", &[(11, 0)]),
    ("k.sm_120.cubin", &[(12, 0), (12, 1)]),
    ("k.sm_120a.cubin", &[(12, 0)]),
    ("k.sm_120f.cubin", &[(12, 0), (12, 1)]),
    ("k.sm_121.cubin", &[(12, 1)]),
    ("k.sm_121a.cubin", &[(12, 1)]),
    ("k.sm_121f.cubin", &[(12, 1)]),
    ("k.sm_90.fatbin", &[(9, 0)]),
    ("k.sm_90a.fatbin", &[(9, 0)]),
    ("k.sm_100.fatbin", &[(10, 0), (10, 3)]),
    ("k.sm_100a.fatbin", &[(10, 0)]),
    ("k.sm_100f.fatbin", &[(10, 0), (10, 3)]),
    ("k.sm_103.fatbin", &[(10, 3)]),
    ("k.sm_103a.fatbin", &[(10, 3)]),
    ("k.sm_103f.fatbin", &[(10, 3)]),
    ("k.sm_110.fatbin", &[(11, 0)]),
    ("k.sm_110f.fatbin", &[(11, 0)]),
    ("k.sm_120.fatbin", &[(12, 0), (12, 1)]),
    ("k.sm_120a.fatbin", &[(12, 0)]),
    ("k.sm_120f.fatbin", &[(12, 0), (12, 1)]),
    ("k.sm_121.fatbin", &[(12, 1)]),
    ("k.sm_121a.fatbin", &[(12, 1)]),
    ("k.sm_121f.fatbin", &[(12, 1)]),
    ("k.compute_90.fatbin", from(9, 0)),
    ("k.compute_90a.fatbin", &[(9, 0)]),
    ("k.compute_100.fatbin", from(10, 0)),
    ("k.compute_100a.fatbin", &[(10, 0)]),
    ("k.compute_100f.fatbin", &[(10, 0), (10, 3)]),
    ("k.compute_103.fatbin", from(10, 3)),
    ("k.compute_103a.fatbin", &[(10, 3)]),
    ("k.compute_103f.fatbin", &[(10, 3)]),
    ("k.compute_110.fatbin", from(11, 0)),
    ("k.compute_110f.fatbin", &[(11, 0)]),
    ("k.compute_120.fatbin", from(12, 0)),
    ("k.compute_120a.fatbin", &[(12, 0)]),
    ("k.compute_120f.fatbin", &[(12, 0), (12, 1)]),
    ("k.compute_121.fatbin", &[(12, 1)]),
    ("k.compute_121a.fatbin", &[(12, 1)]),
    ("k.compute_121f.fatbin", &[(12, 1)]),
    ("k.compute_90.ptx", from(9, 0)),
    ("k.compute_90a.ptx", &[(9, 0)]),
    ("k.compute_100.ptx", from(10, 0)),
    ("k.compute_100a.ptx", &[(10, 0)]),
    ("k.compute_100f.ptx", &[(10, 0), (10, 3)]),
    ("k.compute_103.ptx", from(10, 3)),
    ("k.compute_103a.ptx", &[(10, 3)]),
    ("k.compute_103f.ptx", &[(10, 3)]),
    ("k.compute_110.ptx", from(11, 0)),
    ("k.compute_110f.ptx", &[(11, 0)]),
    ("k.compute_120.ptx", from(12, 0)),
    ("k.compute_120a.ptx", &[(12, 0)]),
    ("k.compute_120f.ptx", &[(12, 0), (12, 1)]),
    ("k.compute_121.ptx", &[(12, 1)]),
    ("k.compute_121a.ptx", &[(12, 1)]),
    ("k.compute_121f.ptx", &[(12, 1)]),
    // sm_100a, sm_100f, sm_120f, sm_90a SASS: no 11.x code.
    (
        "k.mixed.fatbin",
        &[(9, 0), (10, 0), (10, 3), (12, 0), (12, 1)],
    ),
    // The SASS on 9.0, the compute_90 PTX everywhere else.
    ("k.sm_90a+compute_90.fatbin", from(9, 0)),
];

/// Of a fatbin, the entry a registry hands the driver alone on a device of `cc` (the device's
/// own SASS settles what the driver loads): its index; `None` where the whole fatbin is handed
/// over. On 10.0 the mixed fatbin holds two entries of sm_100 SASS ("a" and "f"), so the driver
/// chooses; on 10.3 and 12.1 it holds none of exactly theirs.
fn handed_entry(name: &str, cc: Cc) -> Option<usize> {
    match (name, cc) {
        ("k.mixed.fatbin", (9, 0)) => Some(3),
        ("k.mixed.fatbin", (12, 0)) => Some(2),
        ("k.sm_90a+compute_90.fatbin", (9, 0)) => Some(0),
        _ if name.starts_with("k.sm_") && name.ends_with(".fatbin") => {
            let own = format!("k.sm_{}{}", cc.0, cc.1);
            let sm = name
                .trim_end_matches(".fatbin")
                .trim_end_matches(['a', 'f']);
            (sm == own).then_some(0)
        }
        _ => None,
    }
}

fn fixture(name: &str) -> &'static [u8] {
    FIXTURES
        .iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no fixture {name}"))
        .1
}

fn runs_on(name: &str) -> &'static [Cc] {
    RUNS_ON
        .iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("{name} is not in RUNS_ON"))
        .1
}

/// The SM number a cubin fixture is built for (`k.sm_100a.cubin`: 100).
fn sm_of(name: &str) -> u32 {
    let digits: String = name["k.sm_".len()..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().unwrap()
}

/// The H200's verdict on each fixture: the driver's status code and name.
fn h200_verdicts() -> Vec<(&'static str, u32, &'static str)> {
    H200_VERDICTS
        .lines()
        .filter(|line| !line.is_empty())
        .map(|line| {
            let fields: Vec<&str> = line.split('\t').collect();
            assert_eq!(fields.len(), 3, "{line}");
            (fields[0], fields[1].parse().unwrap(), fields[2])
        })
        .collect()
}

#[test]
fn the_table_agrees_with_the_h200() {
    let verdicts = h200_verdicts();
    assert_eq!(verdicts.len(), FIXTURES.len());
    assert_eq!(RUNS_ON.len(), FIXTURES.len());
    for (name, code, status) in verdicts {
        fixture(name);
        let loads = code == 0;
        assert_eq!(
            runs_on(name).contains(&(9, 0)),
            loads,
            "{name}: the H200 answered {status}"
        );
        if !loads {
            // What the H200 refused: code of no architecture it runs (a fatbin, a cubin), or PTX
            // for a newer architecture than its own, which its JIT compiler refuses.
            let want = if name.ends_with(".ptx") {
                "CUDA_ERROR_INVALID_PTX"
            } else {
                "CUDA_ERROR_NO_BINARY_FOR_GPU"
            };
            assert_eq!(status, want, "{name}");
        }
    }
}

/// A blob set chooses "a" code only for its own compute capability and "f" code only within its
/// family; of two cubins for the device's SM, the "a" one, built for exactly that device.
#[test]
fn blob_sets_choose_code_only_for_the_devices_that_run_it() {
    let driver = Some((13, 0));
    for &(name, bytes) in FIXTURES {
        let set = if name.ends_with(".cubin") {
            BlobSet::new().cubin(sm_of(name), bytes)
        } else if name.ends_with(".ptx") {
            BlobSet::new().ptx(bytes)
        } else {
            continue;
        };
        for cc in CCS {
            let chosen = set.choose(cc, driver);
            let runs = runs_on(name).contains(&cc);
            assert_eq!(chosen.is_some(), runs, "{name} on {cc:?}");
        }
    }
    let (a, f) = (fixture("k.sm_100a.cubin"), fixture("k.sm_100f.cubin"));
    for set in [
        BlobSet::new().cubin(100, f).cubin(100, a),
        BlobSet::new().cubin(100, a).cubin(100, f),
    ] {
        assert_eq!(set.choose((10, 0), driver), Some(a));
        assert_eq!(set.choose((10, 3), driver), Some(f));
        assert_eq!(set.choose((12, 0), driver), None);
    }
    // sm_103 SASS of its own over sm_100f of an older minor; no "a" code of another.
    let set = BlobSet::new()
        .cubin(100, a)
        .cubin(103, fixture("k.sm_103.cubin"))
        .cubin(120, fixture("k.sm_120a.cubin"));
    assert_eq!(set.choose((10, 3), driver), Some(fixture("k.sm_103.cubin")));
    assert_eq!(set.choose((12, 1), driver), None);
    // PTX: compute_100f on its family, the plain compute_90 elsewhere.
    let (ptx100f, ptx90) = (fixture("k.compute_100f.ptx"), fixture("k.compute_90.ptx"));
    let set = BlobSet::new().ptx(ptx90).ptx(ptx100f);
    assert_eq!(set.choose((10, 3), driver), Some(ptx100f));
    assert_eq!(set.choose((12, 0), driver), Some(ptx90));
    assert_eq!(set.choose((11, 0), driver), Some(ptx90));
}

/// A fatbin's check for a device reads the code of the entries the device may load: "a" code of
/// its own compute capability alone, "f" code of its family. A broken sm_100a entry sinks the
/// mixed fatbin on 10.0, not on 10.3 (which loads its sm_100f entry), nor on 12.0; a broken
/// sm_100f one sinks it on both 10.x devices.
#[test]
fn a_fatbin_is_checked_for_a_device_by_the_entries_it_may_load() {
    let broken = |index: usize| {
        let mut parsed = Fatbin::parse(fixture("k.mixed.fatbin")).unwrap();
        // e_shoff past the end of the cubin.
        parsed.entries[index].payload[40..48].copy_from_slice(&u64::MAX.to_le_bytes());
        parsed.bytes()
    };
    let (a, f) = (broken(0), broken(1));
    for (cc, a_refused, f_refused) in [
        ((9, 0), false, false),
        ((10, 0), true, true),
        ((10, 3), false, true),
        ((12, 0), false, false),
    ] {
        for (bytes, refused, entry) in [(&a, a_refused, 0), (&f, f_refused, 1)] {
            match validate_blob_for_device("k", bytes, cc) {
                Ok(kind) => {
                    assert!(!refused, "entry {entry} broken, on {cc:?}: passed");
                    assert_eq!(kind, BlobKind::Fatbin);
                }
                Err(e) => {
                    assert!(refused, "entry {entry} broken, on {cc:?}: {e}");
                    let says = format!("fatbin entry {entry} (ELF sm_100");
                    assert!(e.to_string().contains(&says), "{e}");
                }
            }
        }
    }
    assert!(atlas_registry::validate_blob("k", &a).is_err());
}

#[test]
fn each_fixture_loads_where_it_runs_and_is_refused_elsewhere() {
    for (major, minor) in CCS {
        let variant = [
            format!("-DSTANDIN_CC_MAJOR={major}"),
            format!("-DSTANDIN_CC_MINOR={minor}"),
            "-DSTANDIN_DRIVER_VERSION=13000".to_string(),
        ];
        let variant: Vec<&str> = variant.iter().map(String::as_str).collect();
        standin::run(each_fixture_loads_where_it_runs, &variant);
    }
}

/// Where, in `fatbin`, the payload of its entry `index` starts.
fn payload_at(fatbin: &[u8], index: usize) -> usize {
    let parsed = Fatbin::parse(fatbin).unwrap();
    let before: usize = parsed.entries[..index]
        .iter()
        .map(|entry| entry.header.len() + entry.payload.len())
        .sum();
    parsed.header.len() + before + parsed.entries[index].header.len()
}

/// On the stand-in's device: each fixture that runs there loads, a fatbin handed over whole or
/// as the entry [`handed_entry`] names; each that does not is refused as having no code for the
/// device, and the driver never sees it. A registry and a library agree.
fn each_fixture_loads_where_it_runs() {
    let cc = host(0).unwrap().compute_capability();
    let p = probe();
    for &(name, bytes) in FIXTURES {
        p.reset();
        let runs = runs_on(name).contains(&cc);
        match AtlasRegistry::load(0, &[("k", bytes)]) {
            Ok(registry) => {
                assert!(runs, "{name} loaded on {cc:?}");
                let image = p.module_image(registry.raw_module("k").unwrap());
                if name.ends_with(".fatbin") {
                    let want = match handed_entry(name, cc) {
                        Some(index) => bytes[payload_at(bytes, index)..].as_ptr(),
                        None => bytes.as_ptr(),
                    };
                    assert_eq!(image, want, "{name} on {cc:?}: what the driver was handed");
                    assert_eq!(registry.module_kind("k"), Some(BlobKind::Fatbin));
                }
            }
            Err(e) => {
                assert!(!runs, "{name} refused on {cc:?}: {e}");
                assert!(
                    matches!(&e, AtlasError::NoBinaryForDevice { arch, .. }
                        if *arch == format!("sm_{}{}", cc.0, cc.1)),
                    "{name} on {cc:?}: {e:?}"
                );
                let loads = p.count("cuModuleLoadData") + p.count("cuModuleLoadDataEx");
                assert_eq!(loads, 0, "{name} on {cc:?}: refused before the driver");
            }
        }
        let library = AtlasLibrary::load(&[("k", bytes)]).unwrap();
        let registry = library.registry(0);
        assert_eq!(registry.is_ok(), runs, "{name} on {cc:?}, library");
    }
    // sm_100a SASS beside sm_103 SASS: on 10.3 the sm_103 entry settles what the driver loads
    // (the sm_100a one is not SASS it may load), so that entry alone is handed over; on 10.0 the
    // sm_100a entry is.
    let a_and_103 = joined(&["k.sm_100a.fatbin", "k.sm_103.fatbin"]);
    let handed = match cc {
        (10, 3) => Some(1),
        (10, 0) => Some(0),
        _ => None,
    };
    match AtlasRegistry::load(0, &[("k", &a_and_103)]) {
        Ok(registry) => {
            let index = handed.unwrap_or_else(|| panic!("sm_100a + sm_103 loaded on {cc:?}"));
            let want = a_and_103[payload_at(&a_and_103, index)..].as_ptr();
            let image = p.module_image(registry.raw_module("k").unwrap());
            assert_eq!(
                image, want,
                "sm_100a + sm_103 on {cc:?}: what the driver was handed"
            );
        }
        Err(e) => assert!(
            handed.is_none() && matches!(e, AtlasError::NoBinaryForDevice { .. }),
            "sm_100a + sm_103 on {cc:?}: {e:?}"
        ),
    }
}

/// One fatbin of the entries of the fixture fatbins `names`, in order.
fn joined(names: &[&str]) -> Vec<u8> {
    let parsed: Vec<Fatbin> = names
        .iter()
        .map(|name| Fatbin::parse(fixture(name)).unwrap())
        .collect();
    let entries = parsed.iter().flat_map(|f| f.entries.clone()).collect();
    parsed[0].with_entries(entries).bytes()
}

#[test]
fn a_library_chooses_for_each_device_within_a_family() {
    standin::run(
        a_library_chooses_per_device_within_a_family,
        &[
            "-DSTANDIN_DEVICES=2",
            "-DSTANDIN_CC_MAJOR=10",
            "-DSTANDIN_CC1=103",
            "-DSTANDIN_DRIVER_VERSION=13000",
        ],
    );
}

/// Device 0 is 10.0, device 1 is 10.3: of sm_100a and sm_100f cubins, each device loads its own
/// choice; a library of the sm_100a cubin alone serves device 0 and refuses device 1.
fn a_library_chooses_per_device_within_a_family() {
    assert_eq!(host(1).unwrap().compute_capability(), (10, 3));
    let (a, f) = (fixture("k.sm_100a.cubin"), fixture("k.sm_100f.cubin"));
    let p = probe();
    p.reset();
    let model = Model::new().blob_set("k", BlobSet::new().cubin(100, a).cubin(100, f));
    let library = AtlasLibrary::load_model(&model).unwrap();
    assert_eq!(p.count("cuLibraryLoadData"), 2, "one load per blob chosen");
    for (ordinal, want) in [(0, a), (1, f)] {
        let registry = library.registry(ordinal).unwrap();
        assert_eq!(
            p.module_image(registry.raw_module("k").unwrap()),
            want.as_ptr(),
            "device {ordinal}"
        );
        let registry = AtlasRegistry::load_model(ordinal, &model).unwrap();
        assert_eq!(
            p.module_image(registry.raw_module("k").unwrap()),
            want.as_ptr(),
            "device {ordinal}, a registry"
        );
    }
    let library = AtlasLibrary::load(&[("k", a)]).unwrap();
    assert!(library.registry(0).is_ok());
    let e = library.registry(1).unwrap_err();
    assert!(
        matches!(&e, AtlasError::NoBinaryForDevice { device: 1, holds, arch, .. }
            if holds == "sm_100a SASS" && arch == "sm_103"),
        "{e:?}"
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_atlas_loads_what_the_h200_loads_and_runs_the_sm_90a_code() {
    let env: Vec<(&str, String)> = support::raw::child_env();
    let env: Vec<(&str, &std::ffi::OsStr)> = env
        .iter()
        .map(|(name, value)| (*name, std::ffi::OsStr::new(value)))
        .collect();
    let child = child::run_with_env(gpu_loads_what_the_h200_loads, None, &env);
    assert_eq!(child.ending, Ending::Passed, "{child}");
}

/// On the H200: the plain driver answers each fixture as `h200_verdicts.tsv` says; Atlas loads
/// each that the driver loads (and `add_one` computes what the CPU does) and refuses each other
/// one, with its typed refusal before the driver or with the driver's own status. The sm_90a
/// cubin, the sm_90a fatbin and the sm_90a SASS beside compute_90 PTX are among those it runs.
fn gpu_loads_what_the_h200_loads() {
    let cc = host(0)
        .expect(support::blobs::NEEDS_GPU)
        .compute_capability();
    assert_eq!(cc, (9, 0), "the verdicts are an H200's");
    let raw = support::raw::Raw::new().unwrap();
    let mut rng = Rng::new();
    let mut ran = Vec::new();
    for (name, code, status) in h200_verdicts() {
        let bytes = fixture(name);
        let plain = raw.load_and_unload(&support::raw::as_image(bytes.to_vec()));
        assert_eq!(
            plain, code,
            "{name}: the plain driver, against the H200's {status}"
        );
        match AtlasRegistry::load(0, &[("k", bytes)]) {
            Ok(registry) => {
                assert_eq!(
                    code, 0,
                    "{name}: Atlas loaded what the driver refused ({status})"
                );
                add_one_and_check(&registry, &mut rng, name);
                ran.push(name);
            }
            Err(AtlasError::NoBinaryForDevice { .. }) => {
                assert_ne!(code, 0, "{name}: Atlas refused what the driver loads");
            }
            Err(e) => {
                assert_ne!(code, 0, "{name}: Atlas refused what the driver loads: {e}");
                assert_eq!(e.cuda_code(), Some(code), "{name}: {e}");
            }
        }
    }
    for name in [
        "k.sm_90a.cubin",
        "k.sm_90a.fatbin",
        "k.sm_90a+compute_90.fatbin",
    ] {
        assert!(ran.contains(&name), "{name} did not run: ran {ran:?}");
    }
}

/// Runs `k::add_one` of `registry` over fresh random floats with a NaN tail, and checks every
/// element against the CPU bit for bit and that the tail was not written.
fn add_one_and_check(registry: &AtlasRegistry, rng: &mut Rng, what: &str) {
    const TAIL: usize = 61;
    let n = 1000 + rng.index(100_000);
    let input = rng.f32s(n, -1000.0, 1000.0);
    let mut host = input.clone();
    host.extend([f32::NAN; TAIL]);
    let stream = registry.stream();
    let mut x = DeviceBuffer::from_slice(registry.ctx(), stream, &host).unwrap();
    let add_one = registry.function("k", "add_one").unwrap();
    // SAFETY: `x` holds `n + TAIL` floats and `add_one` touches the first `n`; `x` lives until
    // `to_vec` below has waited for the launch on the same stream.
    unsafe {
        add_one.launch(
            stream,
            &LaunchConfig::for_elements(n as u32, 256),
            (&mut x, n as u32),
        )
    }
    .unwrap();
    let got = x.to_vec(stream).unwrap();
    for (i, (&g, &v)) in got.iter().zip(&input).enumerate() {
        assert_eq!(
            g.to_bits(),
            (v + 1.0).to_bits(),
            "{what}: element {i}: {v} + 1"
        );
    }
    assert!(
        got[n..].iter().all(|v| v.is_nan()),
        "{what}: add_one wrote past its {n} elements"
    );
}
