//! Parameter layouts of a third-party CUDA project's kernels, read by Atlas, against the driver's
//! own (`cuFuncGetParamInfo`). The project is NVIDIA's cuda-samples: `tests/third_party.sh`
//! builds each of its `.cu` files that nvcc alone builds into PTX for compute_90 and a cubin for
//! sm_90, into a directory that is not committed (`ATLAS_THIRD_PARTY` names it; default
//! `.corpus/cuda-samples` under the repository root):
//!
//! ```text
//! atlas-registry/tests/third_party.sh <cuda-samples checkout or git dir> .corpus/cuda-samples
//! ```
//!
//! - `third_party_layouts_are_readable` (`#[ignore]`d; needs no GPU): `kernel_layouts` of every
//!   module; prints how many modules and kernels it read, and fails on any module it cannot
//!   read, or whose PTX and cubin (of one source file) declare different layouts.
//! - `third_party_layouts_match_the_driver` (`#[ignore]`d; needs an NVIDIA GPU): every module is
//!   loaded by the plain driver in a child process (`support/pool.rs`), which lists its kernels
//!   (`cuModuleEnumerateFunctions`) with their parameters as `cuFuncGetParamInfo` gives them;
//!   each must equal Atlas's layout of that kernel (count, offsets, sizes), and Atlas must know
//!   every kernel the driver lists. Prints how many kernels matched; modules the driver does not
//!   load are listed, with the driver's error, and left out.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use atlas_registry::{KernelLayout, ParamSlot, device_count, kernel_layouts};
use support::blobs::NEEDS_GPU;
use support::child;
use support::pool::{self, Outcome};
use support::raw::{self, Raw};

child::bodies!(driver_layouts);

/// The modules (`.ptx`, `.cubin`) of the project's build, in name order.
fn modules() -> (PathBuf, Vec<PathBuf>) {
    let dir = match std::env::var("ATLAS_THIRD_PARTY") {
        Ok(dir) => PathBuf::from(dir),
        // The repository root is the working directory of packed test binaries, the package's
        // that of `cargo test`.
        Err(_) => [".corpus/cuda-samples", "../.corpus/cuda-samples"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_dir())
            .unwrap_or_else(|| {
                panic!(
                    "no .corpus/cuda-samples: build it with atlas-registry/tests/third_party.sh, \
                     or name the directory in ATLAS_THIRD_PARTY"
                )
            }),
    };
    let mut modules: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "ptx" || e == "cubin"))
        .collect();
    modules.sort();
    assert!(
        !modules.is_empty(),
        "no .ptx or .cubin in {}",
        dir.display()
    );
    (dir, modules)
}

fn name(path: &Path) -> String {
    path.file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
}

/// Atlas's layouts of every module: the layouts, or why a module cannot be read.
fn atlas_layouts(modules: &[PathBuf]) -> Vec<Result<Vec<KernelLayout>, String>> {
    modules
        .iter()
        .map(|path| {
            let blob = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            kernel_layouts(&blob).map_err(|e| e.to_string())
        })
        .collect()
}

#[test]
#[ignore = "reads the kernels tests/third_party.sh builds; needs no GPU"]
fn third_party_layouts_are_readable() {
    let (dir, modules) = modules();
    let layouts = atlas_layouts(&modules);
    let mut kernels = [0usize; 2];
    let mut unreadable = Vec::new();
    for (path, layouts) in modules.iter().zip(&layouts) {
        match layouts {
            Ok(l) => kernels[usize::from(name(path).ends_with(".cubin"))] += l.len(),
            Err(e) => unreadable.push(format!("{}: {e}", name(path))),
        }
    }
    println!(
        "{}: {} modules, {} read: {} kernels in PTX, {} in cubins",
        dir.display(),
        modules.len(),
        modules.len() - unreadable.len(),
        kernels[0],
        kernels[1]
    );
    for line in &unreadable {
        println!("  unreadable: {line}");
    }
    // The PTX and the cubin of one source file declare the same kernels, laid out the same.
    let by_path: BTreeMap<&Path, &Vec<KernelLayout>> = modules
        .iter()
        .zip(&layouts)
        .filter_map(|(path, layouts)| Some((path.as_path(), layouts.as_ref().ok()?)))
        .collect();
    let (mut pairs, mut differ) = (0usize, Vec::new());
    for (path, ptx) in &by_path {
        let Some(stem) = name(path).strip_suffix(".ptx").map(str::to_owned) else {
            continue;
        };
        let Some(cubin) = by_path.get(dir.join(format!("{stem}.sm_90.cubin")).as_path()) else {
            continue;
        };
        let sorted = |layouts: &Vec<KernelLayout>| {
            let mut layouts = layouts.clone();
            layouts.sort_by(|a, b| a.name.cmp(&b.name));
            layouts
        };
        pairs += 1;
        if sorted(ptx) != sorted(cubin) {
            differ.push(stem);
        }
    }
    println!(
        "{pairs} sources as PTX and cubin: {} declare different layouts",
        differ.len()
    );
    for stem in &differ {
        println!("  PTX and cubin differ: {stem}");
    }
    assert!(
        unreadable.is_empty(),
        "{} modules unreadable",
        unreadable.len()
    );
    assert!(
        differ.is_empty(),
        "{} sources' PTX and cubin differ",
        differ.len()
    );
    assert!(
        kernels[0] > 0 && kernels[1] > 0,
        "kernels in PTX and cubins"
    );
}

/// A child: loads each module it is handed with the plain driver and answers `ok` and its
/// kernels (`name=offset:size,offset:size;...`), or `error CODE`.
fn driver_layouts() {
    let raw = Raw::new().unwrap_or_else(|e| panic!("{NEEDS_GPU}: {e}"));
    pool::serve(|path| {
        let image = raw::as_image(std::fs::read(path).expect("reading the module"));
        match raw.load(&image) {
            Err(code) => (format!("error {code}"), raw.usable()),
            Ok(module) => match module.kernels() {
                Ok(kernels) => {
                    let listed: Vec<String> = kernels
                        .iter()
                        .map(|(name, slots)| {
                            let slots: Vec<String> = slots
                                .iter()
                                .map(|s| format!("{}:{}", s.offset, s.size))
                                .collect();
                            format!("{name}={}", slots.join(","))
                        })
                        .collect();
                    (format!("ok {}", listed.join(";")), true)
                }
                Err(e) => (format!("error listing: {e}"), true),
            },
        }
    });
}

/// A child's `ok` answer read back: kernel name to its parameters.
fn parse_kernels(listed: &str) -> BTreeMap<String, Vec<ParamSlot>> {
    listed
        .split(';')
        .filter(|k| !k.is_empty())
        .map(|kernel| {
            let (name, slots) = kernel.split_once('=').expect("name=slots");
            let slots = slots
                .split(',')
                .filter(|s| !s.is_empty())
                .map(|slot| {
                    let (offset, size) = slot.split_once(':').expect("offset:size");
                    ParamSlot {
                        offset: offset.parse().expect("an offset"),
                        size: size.parse().expect("a size"),
                    }
                })
                .collect();
            (name.to_string(), slots)
        })
        .collect()
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn third_party_layouts_match_the_driver() {
    let devices = device_count().unwrap_or_else(|e| panic!("{NEEDS_GPU}: {e}"));
    assert!(devices > 0, "{NEEDS_GPU}: the driver reports no device");
    let (dir, modules) = modules();
    let layouts = atlas_layouts(&modules);
    let tasks: Vec<String> = modules.iter().map(|p| p.display().to_string()).collect();
    let parallel = std::thread::available_parallelism().map_or(1, |n| n.get());
    let run = pool::run(
        driver_layouts,
        &raw::child_env(),
        &tasks,
        parallel,
        Duration::from_secs(300),
    );
    let (mut matched, mut kernels_by_kind) = (0usize, [0usize; 2]);
    let (mut failures, mut not_loaded) = (Vec::new(), Vec::new());
    for ((path, atlas), outcome) in modules.iter().zip(&layouts).zip(&run.outcomes) {
        let module = name(path);
        let listed = match outcome {
            Outcome::Answered(a) if a.starts_with("ok") => parse_kernels(a[2..].trim_start()),
            Outcome::Answered(a) => {
                not_loaded.push(format!("{module}: {a}"));
                continue;
            }
            other => {
                failures.push(format!("{module}: the driver {other:?}"));
                continue;
            }
        };
        let atlas: BTreeMap<&str, &Vec<ParamSlot>> = match atlas {
            Ok(l) => l.iter().map(|k| (k.name.as_str(), &k.params)).collect(),
            Err(e) => {
                failures.push(format!(
                    "{module}: Atlas cannot read it ({e}); the driver lists {} kernels",
                    listed.len()
                ));
                continue;
            }
        };
        for (kernel, slots) in &listed {
            match atlas.get(kernel.as_str()) {
                Some(ours) if *ours == slots => {
                    matched += 1;
                    kernels_by_kind[usize::from(module.ends_with(".cubin"))] += 1;
                }
                Some(ours) => failures.push(format!(
                    "{module}: {kernel}: Atlas {ours:?}, the driver {slots:?}"
                )),
                None => failures.push(format!("{module}: {kernel}: unknown to Atlas")),
            }
        }
        for kernel in atlas.keys().filter(|k| !listed.contains_key(**k)) {
            failures.push(format!(
                "{module}: {kernel}: Atlas has it, the driver does not list it"
            ));
        }
    }
    println!(
        "{}: {} modules; {matched} kernels' layouts equal the driver's ({} in PTX, {} in \
         cubins); {} modules the driver does not load; {} mismatches",
        dir.display(),
        modules.len(),
        kernels_by_kind[0],
        kernels_by_kind[1],
        not_loaded.len(),
        failures.len()
    );
    for line in &not_loaded {
        println!("  not loaded: {line}");
    }
    for line in &failures {
        println!("FAIL {line}");
    }
    assert!(
        failures.is_empty(),
        "{} kernels' layouts differ (above)",
        failures.len()
    );
    assert!(matched > 0, "no kernel compared");
}
