//! What NVIDIA's driver follows in a cubin beside its ELF structure, swept one field at a time on
//! a real driver: every value of each byte of `e_flags` but the SM number's (bits 0-7 and 16-31
//! in ABI version 8, bits 8-31 in version 7), and every attribute number (0 to 0x7f) given to a `.nv.info` record that
//! holds a parameter description (`KPARAM_INFO`, sized), with its value as written and with its
//! value zeroed. The sources are sm_90 cubins of three toolchains: nvcc 13.0 (`fixtures/`), NVIDIA's
//! cuBLASLt 13.1 (`fixtures/crashes/`) and NVRTC 12.0 (atlas-kernels).
//!
//! `gpu_no_variant_atlas_passes_crashes_the_driver` (`#[ignore]`d: it needs an NVIDIA GPU) hands
//! each variant to a plain `cuModuleLoadData` in child processes (`support/pool.rs`) and asks
//! `validate_blob` about it; it prints, per sweep, the values that crash the driver and what
//! Atlas says of them, and fails if Atlas passes a variant that crashes the driver. Without a GPU,
//! `variants_are_what_they_say` checks that the sweeps change what they name.

mod support;

use std::time::Duration;

use atlas_registry::validate_blob;
use support::blobs::NEEDS_GPU;
use support::fatbin::{Fatbin, KIND_ELF};
use support::pool::{self, Outcome};
use support::raw::Raw;
use support::{child, mutate};

child::bodies!(load_variants);

/// `KPARAM_INFO`: a kernel parameter's description, a sized record of three words.
const KPARAM_INFO: u8 = 0x17;

/// The sm_90 cubin inside the sm_90 entry of `fatbin`.
fn sm90_cubin(fatbin: &[u8]) -> Vec<u8> {
    let fatbin = Fatbin::parse(fatbin).expect("a fatbin");
    let entry = fatbin
        .entries
        .iter()
        .find(|e| e.kind() == KIND_ELF && e.arch() == 90)
        .expect("an sm_90 entry");
    entry.contents().expect("its cubin")
}

/// The source cubins: `(name, cubin)`.
fn sources() -> Vec<(&'static str, Vec<u8>)> {
    let nvrtc = atlas_kernels::cubin_for_model("demo", 90)
        .expect("the demo's sm_90 cubins")
        .iter()
        .find(|(name, _)| *name == "elementwise")
        .expect("elementwise")
        .1;
    vec![
        (
            "nvcc 13.0 sm_90 (ABI 8)",
            sm90_cubin(include_bytes!("fixtures/elementwise.sm_90.zstd.fatbin")),
        ),
        (
            "cuBLASLt 13.1 sm_90 (ABI 8)",
            sm90_cubin(include_bytes!(
                "fixtures/crashes/cublasLt-13.1.0.3.fatbin-1323.fatbin"
            )),
        ),
        ("NVRTC 12.0 sm_90 (ABI 7)", nvrtc.to_vec()),
    ]
}

/// One changed cubin: its source, the sweep it belongs to, the value it sets, and the bytes.
struct Variant {
    source: &'static str,
    sweep: &'static str,
    value: u32,
    cubin: Vec<u8>,
}

/// Every variant of every source, in a fixed order (a child makes the same list).
fn variants() -> Vec<Variant> {
    let mut all = Vec::new();
    for (source, cubin) in sources() {
        // Every byte of e_flags (at 48) but the SM number's: bits 0-7 in ABI 8, bits 8-15 in 7.
        let bytes = if cubin[8] == 8 {
            [
                (48, "e_flags bits 0-7"),
                (50, "e_flags bits 16-23"),
                (51, "e_flags bits 24-31"),
            ]
        } else {
            [
                (49, "e_flags bits 8-15"),
                (50, "e_flags bits 16-23"),
                (51, "e_flags bits 24-31"),
            ]
        };
        for (at, sweep) in bytes {
            for value in 0..=255u8 {
                if value == cubin[at] {
                    continue;
                }
                let mut changed = cubin.clone();
                changed[at] = value;
                all.push(Variant {
                    source,
                    sweep,
                    value: u32::from(value),
                    cubin: changed,
                });
            }
        }
        let (record, ..) = mutate::info_records(&cubin)
            .into_iter()
            .find(|&(_, format, attribute, _)| format == 4 && attribute == KPARAM_INFO)
            .expect("a KPARAM_INFO record");
        for attribute in 0..=0x7fu8 {
            if attribute == KPARAM_INFO {
                continue;
            }
            let mut relabelled = cubin.clone();
            relabelled[record + 1] = attribute;
            let mut zeroed = relabelled.clone();
            zeroed[record + 4..record + 16].fill(0);
            for (sweep, cubin) in [
                ("attribute of a KPARAM_INFO record", relabelled),
                ("attribute of a KPARAM_INFO record, value zeroed", zeroed),
            ] {
                all.push(Variant {
                    source,
                    sweep,
                    value: u32::from(attribute),
                    cubin,
                });
            }
        }
    }
    all
}

#[test]
fn variants_are_what_they_say() {
    let sources = sources();
    let variants = variants();
    for (name, cubin) in &sources {
        let of: Vec<&Variant> = variants.iter().filter(|v| v.source == *name).collect();
        assert_eq!(of.len(), 3 * 255 + 2 * 127, "{name}");
        for v in of {
            let changed: Vec<usize> = (0..cubin.len())
                .filter(|&i| cubin[i] != v.cubin[i])
                .collect();
            assert!(!changed.is_empty(), "{name}, {} {:#x}", v.sweep, v.value);
            assert!(
                changed
                    .iter()
                    .all(|&i| changed[0] <= i && i < changed[0] + 16),
                "{name}, {} {:#x}: bytes {changed:?}",
                v.sweep,
                v.value
            );
        }
    }
}

/// A child: for each task `I`, hands variant `I` to a plain `cuModuleLoadData`; answers the code.
fn load_variants() {
    let variants = variants();
    let mut raw: Option<Raw> = None;
    pool::serve(|task| {
        let index: usize = task.trim().parse().expect("a variant index");
        let raw =
            raw.get_or_insert_with(|| Raw::new().unwrap_or_else(|e| panic!("{NEEDS_GPU}: {e}")));
        let code = raw.load_and_unload(&variants[index].cubin);
        (format!("{code}"), code == 0 || raw.usable())
    });
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_no_variant_atlas_passes_crashes_the_driver() {
    let variants = variants();
    let tasks: Vec<String> = (0..variants.len()).map(|i| i.to_string()).collect();
    let jobs = std::thread::available_parallelism().map_or(4, |n| n.get());
    let run = pool::run(load_variants, &[], &tasks, jobs, Duration::from_secs(60));
    println!(
        "{} variants in {:.1} s, {} child processes",
        variants.len(),
        run.elapsed.as_secs_f64(),
        run.children
    );
    let mut failures = Vec::new();
    let mut sweeps: Vec<(&str, &str)> = Vec::new();
    for v in &variants {
        if !sweeps.contains(&(v.source, v.sweep)) {
            sweeps.push((v.source, v.sweep));
        }
    }
    let mut table = Vec::new();
    for (source, sweep) in sweeps {
        let (mut loaded, mut errors, mut crashed, mut refused) = (0, Vec::new(), Vec::new(), 0);
        for (v, outcome) in variants.iter().zip(&run.outcomes) {
            if (v.source, v.sweep) != (source, sweep) {
                continue;
            }
            let passes = validate_blob("variant", &v.cubin).is_ok();
            match outcome {
                Outcome::Answered(code) if code == "0" => loaded += 1,
                Outcome::Answered(code) => errors.push(format!("{:#x}:{code}", v.value)),
                other => {
                    crashed.push(format!("{:#x}", v.value));
                    if passes {
                        failures.push(format!("{source}, {sweep} {:#x}: {other:?}", v.value));
                    } else {
                        refused += 1;
                    }
                }
            }
        }
        table.push(format!(
            "{source}, {sweep}: {loaded} load, {} driver errors, {} crash the driver ({refused} of \
             them refused by Atlas)\n    errors (value:code): {}\n    crashes: {}",
            errors.len(),
            crashed.len(),
            errors.join(" "),
            crashed.join(" ")
        ));
    }
    for line in &table {
        println!("{line}");
    }
    assert!(
        failures.is_empty(),
        "{} variants Atlas passes crash the driver, the first: {:?}",
        failures.len(),
        &failures[..failures.len().min(8)]
    );
}
