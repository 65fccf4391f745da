//! The CUDA kernels of Atlas as embedded blobs, so that loading a model needs no file or compiler;
//! built by NVRTC 12.0 so that they run on every GPU from sm_75 on under any CUDA 12.0+ driver.
//!
//! Sources are `kernels/*.cu`; `kernels/nvrtc.py` compiles them into `kernels/gen/` (committed,
//! reproducible: `python3 kernels/nvrtc.py --check` rebuilds and compares). A model is a named set
//! of `(module name, blob)` pairs, as `AtlasRegistry::load` takes it.
//!
//! | model     | modules                                                   |
//! |-----------|-----------------------------------------------------------|
//! | `demo`    | `noop`, `elementwise`, `block_reduce`, `device_global`    |
//! | `model_a` | `model` (`transform`: `out = in * 2 + 1`)                 |
//! | `model_b` | `model` (`transform`: `out = in * -3 + 0.5`)              |
//! | `faults`  | `faults` (`trap`, `write_far`: kernels that fail on purpose) |
//! | `launch`  | `pdl` (`pdl_step`), `cluster` (`cluster_shape`, `cluster_shape_pair`), `cooperative` (`coop_sum`): kernels for launch attributes; their Hopper instructions are in the `sm_90` cubin only |
//! | `hopper`  | `tma` (`tma_tiles`: boxes of a matrix loaded through a TMA descriptor passed by value), `smid` (`smid_items`: the multiprocessor each work item runs on); TMA needs the `sm_90` cubin (the other builds write NaN sums) |
//! | `conditional` | `conditional` (`loop_step`, `host_step`, `reset_counter`, `set_condition`: conditional graph nodes) |
//!
//! Every model of [`MODELS`] comes as PTX and as cubins for each architecture in
//! [`CUBIN_ARCHS`]; [`PARTIAL_MODELS`] do not. `conditional` calls the CUDA 12.3 device function `cudaGraphSetConditional`:
//! its PTX (NVRTC 12.0, the call left extern) loads on drivers of CUDA 12.3 or newer, which resolve
//! the call when they JIT-compile it; NVRTC 12.0 cannot make its cubins, so its only cubin is
//! `sm_90`, built by nvcc 12.3+ (`kernels/regen.sh`) and embedded when `kernels/gen/` holds it
//! ([`CONDITIONAL_SM_90`] says whether this build has it; a cubin of nvcc 13 loads on CUDA 13+
//! drivers only).
//!
//! | blob | built for | needs |
//! |------|-----------|-------|
//! | [`ptx_for_model`] | `compute_75`, PTX ISA 8.0 | a GPU of compute capability 7.5 or newer and a driver of CUDA 12.0 or newer, which JIT-compiles it when the module loads |
//! | [`cubin_for_model`]`(model, sm)` | `sm_75`, `sm_80`, `sm_86`, `sm_89`, `sm_90` (SASS) | a GPU of that major compute capability with an equal or higher minor (`sm_80` runs on 8.0 and 8.6, not on 9.0), any CUDA 12.0+ driver; no JIT |
//! | [`ELEMENTWISE_FATBIN`] | all five cubins and the PTX, in one blob | what the PTX needs: the driver takes the device's SASS when there is one and JIT-compiles the PTX otherwise |
//!
//! [`model`] gives a model as the registry's [`BlobSet`]s, of which
//! each device loads the best it runs: its own SASS when there is a cubin for exactly its compute
//! capability (no JIT, nothing to compile at load), else (on a desktop GPU) SASS of an older minor
//! version of its architecture, else the PTX. [`blobs_for_device`] makes the same choice for one device.
//!
//! ```no_run
//! let model = atlas_kernels::model("demo").expect("demo is one of MODELS");
//! let registry = atlas_registry::AtlasRegistry::load_model(0, &model)?;
//! // Or one load for every GPU, each device with the blobs it runs best:
//! let library = atlas_registry::AtlasLibrary::load_model(&model)?;
//!
//! let host = atlas_registry::host(0)?;
//! let blobs = atlas_kernels::blobs_for_device("demo", host.compute_capability())
//!     .expect("demo is one of MODELS");
//! let registry = atlas_registry::AtlasRegistry::load(0, blobs)?;
//! # Ok::<(), atlas_registry::AtlasError>(())
//! ```

use atlas_registry::BlobSet;

/// Names of every model with PTX and a cubin for every architecture of [`CUBIN_ARCHS`], in the
/// order of the table above.
pub const MODELS: &[&str] = &["demo", "model_a", "model_b", "faults", "launch", "hopper"];

/// Models that are not in [`MODELS`] because they lack cubins for most architectures: PTX, and
/// cubins only where nvcc built them (`conditional`: `sm_90`, see [`CONDITIONAL_SM_90`]).
pub const PARTIAL_MODELS: &[&str] = &["conditional"];

/// Whether this build embeds the `sm_90` cubin of the `conditional` model (built by nvcc 12.3+,
/// committed as `kernels/gen/conditional.sm_90.cubin`); without it, that model is PTX only.
pub const CONDITIONAL_SM_90: bool = cfg!(atlas_conditional_sm90);

/// The architectures every model has a cubin for, as `10 * major + minor` of the compute
/// capability: Turing (T4, RTX 20), A100, RTX 30 / A10 / A40, Ada (L4, L40, RTX 40), Hopper (H100,
/// H200).
pub const CUBIN_ARCHS: &[u32] = &[75, 80, 86, 89, 90];

/// A model's modules: `(module name, blob)` pairs.
pub type Blobs = &'static [(&'static str, &'static [u8])];

/// The elementwise module (`scale`, `axpy`) as a fatbin: SASS for every architecture in
/// [`CUBIN_ARCHS`] and the `compute_75` PTX.
pub const ELEMENTWISE_FATBIN: &[u8] =
    include_bytes!(concat!(env!("ATLAS_KERNEL_DIR"), "/elementwise.fatbin")).as_slice();

/// One model: its PTX modules and the same modules as cubins, one set per [`CUBIN_ARCHS`] entry.
struct Model {
    name: &'static str,
    ptx: Blobs,
    cubins: [Blobs; CUBIN_ARCHS.len()],
}

/// PTX text, embedded with a NUL at the end, as the driver takes it (so loading copies nothing).
macro_rules! ptx {
    ($file:literal) => {
        concat!(
            include_str!(concat!(env!("ATLAS_KERNEL_DIR"), "/", $file, ".ptx")),
            "\0"
        )
        .as_bytes()
    };
}

macro_rules! cubin {
    ($file:literal, $sm:literal) => {
        include_bytes!(concat!(
            env!("ATLAS_KERNEL_DIR"),
            "/",
            $file,
            ".sm_",
            $sm,
            ".cubin"
        ))
        .as_slice()
    };
}

/// `model!("name": "module" => "file", ...)`: a [`Model`] from `kernels/gen/file.*`. The
/// architectures are written out in the order of [`CUBIN_ARCHS`] (a test checks each cubin's own
/// ELF header against it).
macro_rules! model {
    ($name:literal: $($module:literal => $file:literal),+) => {
        Model {
            name: $name,
            ptx: &[$(($module, ptx!($file))),+],
            cubins: [
                &[$(($module, cubin!($file, 75))),+],
                &[$(($module, cubin!($file, 80))),+],
                &[$(($module, cubin!($file, 86))),+],
                &[$(($module, cubin!($file, 89))),+],
                &[$(($module, cubin!($file, 90))),+],
            ],
        }
    };
}

const TABLE: &[Model] = &[
    model!("demo":
        "noop" => "noop",
        "elementwise" => "elementwise",
        "block_reduce" => "block_reduce",
        "device_global" => "device_global"),
    model!("model_a": "model" => "model_a"),
    model!("model_b": "model" => "model_b"),
    model!("faults": "faults" => "faults"),
    model!("launch":
        "pdl" => "pdl",
        "cluster" => "cluster",
        "cooperative" => "cooperative"),
    model!("hopper":
        "tma" => "tma",
        "smid" => "smid"),
    Model {
        name: "conditional",
        ptx: &[("conditional", ptx!("conditional"))],
        cubins: [&[], &[], &[], &[], CONDITIONAL_SM_90_CUBIN],
    },
];

/// The nvcc-built `sm_90` cubin of the `conditional` model, when there is one (no cubin: empty).
#[cfg(atlas_conditional_sm90)]
const CONDITIONAL_SM_90_CUBIN: Blobs = &[("conditional", cubin!("conditional", 90))];
#[cfg(not(atlas_conditional_sm90))]
const CONDITIONAL_SM_90_CUBIN: Blobs = &[];

fn find(name: &str) -> Option<&'static Model> {
    TABLE.iter().find(|m| m.name == name)
}

/// The PTX modules of `model`, as `(module name, PTX text)` pairs, each text ending in a NUL;
/// `None` for an unknown model. PTX ISA 8.0 for `compute_75`: any GPU of compute capability 7.5 or
/// newer, under any driver of CUDA 12.0 or newer, which JIT-compiles it at load.
pub fn ptx_for_model(model_name: &str) -> Option<Blobs> {
    find(model_name).map(|m| m.ptx)
}

/// The same modules as [`ptx_for_model`], as cubins for `sm` (`10 * major + minor`, one of
/// [`CUBIN_ARCHS`]); `None` for an unknown model or an architecture without cubins (for
/// `conditional`, every architecture but `sm_90`, and `sm_90` too without [`CONDITIONAL_SM_90`]).
///
/// SASS runs only on GPUs of the same major compute capability with an equal or higher minor:
/// loading an `sm_80` cubin on an sm_90 device fails. [`blobs_for_device`] picks for a device.
pub fn cubin_for_model(model_name: &str, sm: u32) -> Option<Blobs> {
    let arch = CUBIN_ARCHS.iter().position(|&a| a == sm)?;
    find(model_name)
        .map(|m| m.cubins[arch])
        .filter(|cubins| !cubins.is_empty())
}

/// `model` as the registry loads it on every device: each module a
/// [`BlobSet`] of its cubins and its PTX, of which each device loads the best it runs (see
/// [`BlobSet`]); `None` for an unknown model.
///
/// ```no_run
/// let model = atlas_kernels::model("demo").unwrap();
/// let registry = atlas_registry::AtlasRegistry::load_model(0, &model)?;
/// # Ok::<(), atlas_registry::AtlasError>(())
/// ```
pub fn model(model_name: &str) -> Option<atlas_registry::Model<'static>> {
    let found = find(model_name)?;
    let model = (0..found.ptx.len()).fold(atlas_registry::Model::new(), |model, i| {
        model.blob_set(found.ptx[i].0, blob_set(found, i))
    });
    Some(model)
}

/// Module `i` of `model` as a blob set: its cubin of each architecture that has one, and its PTX.
fn blob_set(model: &'static Model, i: usize) -> BlobSet<'static> {
    let cubins = CUBIN_ARCHS.iter().zip(model.cubins);
    let set = cubins.fold(BlobSet::new(), |set, (&sm, cubins)| match cubins.get(i) {
        Some(&(_, cubin)) => set.cubin(sm, cubin),
        None => set,
    });
    set.ptx(model.ptx[i].1)
}

/// The best blobs of `model` for a device of `compute_capability` (`(major, minor)`, as
/// `CudaHost::compute_capability` gives it), as the registry chooses from [`model`]'s blob sets
/// ([`BlobSet::choose`]): the cubins of the device's own architecture (no JIT at load), else,
/// on a desktop GPU, those of an older minor version of it, else the PTX. `None` only for an
/// unknown model.
///
/// A device older than 7.5 gets the PTX too, and the driver refuses it at load: nothing here runs
/// there.
pub fn blobs_for_device(model_name: &str, compute_capability: (u32, u32)) -> Option<Blobs> {
    let found = find(model_name)?;
    // Every module has cubins for the same architectures: the choice for the first is the model's.
    let chosen = blob_set(found, 0).choose(compute_capability, None);
    let cubins = found.cubins.iter().find(|cubins| {
        cubins
            .first()
            .is_some_and(|&(_, cubin)| chosen.is_some_and(|c| std::ptr::eq(c, cubin)))
    });
    Some(cubins.copied().unwrap_or(found.ptx))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(blobs: Blobs) -> Vec<&'static str> {
        blobs.iter().map(|(n, _)| *n).collect()
    }

    fn ptx_text(blob: &'static [u8]) -> &'static str {
        let text = blob
            .strip_suffix(b"\0")
            .expect("PTX is embedded NUL-terminated");
        std::str::from_utf8(text).expect("PTX is text")
    }

    /// The SM architecture of a CUDA 12 cubin (ELF ABI version 7): the low byte of `e_flags`.
    fn elf_arch(elf: &[u8]) -> u32 {
        assert_eq!(&elf[..4], b"\x7fELF", "not an ELF file");
        assert_eq!(
            elf[8], 7,
            "not a CUDA 12 cubin (ELF ABI version {})",
            elf[8]
        );
        u32::from(elf[48])
    }

    /// The models NVRTC 12.0 makes cubins of, for every architecture.
    fn full_models() -> impl Iterator<Item = &'static str> {
        MODELS.iter().copied()
    }

    #[test]
    fn models_lists_the_table() {
        let listed: Vec<_> = MODELS.iter().chain(PARTIAL_MODELS).copied().collect();
        assert_eq!(listed, TABLE.iter().map(|m| m.name).collect::<Vec<_>>());
    }

    #[test]
    fn conditional_is_ptx_with_an_extern_set_conditional_and_at_most_an_sm_90_cubin() {
        let ptx = ptx_for_model("conditional").unwrap();
        assert_eq!(names(ptx), ["conditional"]);
        let text = ptx_text(ptx[0].1);
        assert!(
            text.contains(".extern .func cudaGraphSetConditional"),
            "the device call stays extern, for the driver's JIT to resolve"
        );
        for entry in ["loop_step", "host_step", "reset_counter", "set_condition"] {
            assert!(text.contains(&format!(".entry {entry}(")), "{entry}");
        }
        for &sm in &CUBIN_ARCHS[..CUBIN_ARCHS.len() - 1] {
            assert!(cubin_for_model("conditional", sm).is_none(), "sm_{sm}");
        }
        let sm90 = cubin_for_model("conditional", 90);
        assert_eq!(sm90.is_some(), CONDITIONAL_SM_90);
        if let Some(cubin) = sm90 {
            assert_eq!(names(cubin), ["conditional"]);
            let elf = cubin[0].1;
            assert_eq!(&elf[..4], b"\x7fELF");
            // ABI version 7 (CUDA 12) keeps the SM number in e_flags' low byte, 8 (CUDA 13) in the
            // next one.
            let flags = u32::from_le_bytes(elf[48..52].try_into().unwrap());
            let sm = match elf[8] {
                7 => flags & 0xff,
                8 => (flags >> 8) & 0xff,
                abi => panic!("conditional.sm_90.cubin: ELF ABI version {abi}"),
            };
            assert_eq!(sm, 90, "conditional.sm_90.cubin is built for sm_{sm}");
        }
    }

    #[test]
    fn every_model_has_a_cubin_for_every_arch_with_the_ptx_modules() {
        for model in full_models() {
            let ptx = ptx_for_model(model).expect("listed model has PTX");
            for (name, text) in ptx {
                assert!(
                    ptx_text(text).contains(".entry"),
                    "{model}/{name} has no kernel"
                );
            }
            for &sm in CUBIN_ARCHS {
                let cubin = cubin_for_model(model, sm).expect("a cubin for every arch");
                assert_eq!(names(ptx), names(cubin), "{model} sm_{sm}");
                for (name, elf) in cubin {
                    assert_eq!(elf_arch(elf), sm, "{model}/{name}.sm_{sm}.cubin");
                }
            }
        }
        assert!(ptx_for_model("no_such_model").is_none());
        assert!(cubin_for_model("no_such_model", 90).is_none());
        for sm in [0, 70, 87, 100, 120] {
            assert!(cubin_for_model("demo", sm).is_none(), "sm_{sm}");
        }
    }

    #[test]
    fn every_ptx_is_isa_8_0_for_sm_75() {
        for model in MODELS.iter().chain(PARTIAL_MODELS) {
            for (name, blob) in ptx_for_model(model).unwrap() {
                let text = ptx_text(blob);
                assert!(text.starts_with("//"), "{model}/{name}: no comment header");
                let mut code = text
                    .lines()
                    .filter(|l| !l.is_empty() && !l.starts_with("//"));
                assert_eq!(
                    code.next(),
                    Some(".version 8.0"),
                    "{model}/{name}: PTX ISA 8.0 is what every CUDA 12.0+ driver can JIT; rebuild with kernels/nvrtc.py"
                );
                assert_eq!(code.next(), Some(".target sm_75"), "{model}/{name}");
                assert!(
                    !text.contains('\0'),
                    "{model}/{name}: a NUL inside the text"
                );
            }
        }
    }

    #[test]
    fn blobs_for_device_takes_its_own_cubin_else_an_older_minor_else_the_ptx() {
        for model in full_models() {
            let ptx = ptx_for_model(model).unwrap();
            for &sm in CUBIN_ARCHS {
                let got = blobs_for_device(model, (sm / 10, sm % 10)).unwrap();
                let cubin = cubin_for_model(model, sm).unwrap();
                assert!(std::ptr::eq(got, cubin), "{model} on {sm}: not its cubins");
                assert!(!std::ptr::eq(got, ptx));
            }
            // A desktop GPU of a later minor version (9.1) runs sm_90 SASS.
            let got = blobs_for_device(model, (9, 1)).unwrap();
            let cubin = cubin_for_model(model, 90).unwrap();
            assert!(
                std::ptr::eq(got, cubin),
                "{model} on 9.1: not the sm_90 cubins"
            );
            // Newer (Blackwell 10.0, 12.0), older (Volta 7.0), Tegra (Orin 8.7, which runs SASS
            // of its own compute capability only) and nonsense: no cubin surely runs, so the PTX.
            for cc in [
                (12, 0),
                (10, 0),
                (7, 0),
                (8, 7),
                (0, 0),
                (8, 10),
                (u32::MAX, 9),
            ] {
                let got = blobs_for_device(model, cc).unwrap();
                assert!(std::ptr::eq(got, ptx), "{model} on {cc:?}: not the PTX");
            }
        }
        assert!(blobs_for_device("no_such_model", (9, 0)).is_none());
        assert!(blobs_for_device("no_such_model", (12, 0)).is_none());
    }

    #[test]
    fn model_is_a_blob_set_per_module_choosing_as_blobs_for_device() {
        for name in MODELS.iter().chain(PARTIAL_MODELS) {
            let model = model(name).unwrap();
            let ptx = ptx_for_model(name).unwrap();
            assert_eq!(model.module_names().collect::<Vec<_>>(), names(ptx));
            let entry = find(name).unwrap();
            for cc in [(9, 0), (8, 6), (8, 7), (7, 5), (10, 0), (7, 0)] {
                let blobs = blobs_for_device(name, cc).unwrap();
                for (i, &(module, blob)) in blobs.iter().enumerate() {
                    let chosen = blob_set(entry, i).choose(cc, None);
                    // The PTX is what a device that runs nothing else gets here.
                    let want = chosen.unwrap_or(ptx[i].1);
                    assert!(std::ptr::eq(blob, want), "{name}/{module} on {cc:?}");
                }
            }
        }
        assert!(model("no_such_model").is_none());
    }

    #[test]
    fn tagged_models_share_function_names_but_not_constants() {
        let a = ptx_text(ptx_for_model("model_a").unwrap()[0].1);
        let b = ptx_text(ptx_for_model("model_b").unwrap()[0].1);
        assert!(a.contains(".entry transform") && b.contains(".entry transform"));
        assert_ne!(a, b);
        for &sm in CUBIN_ARCHS {
            let a = cubin_for_model("model_a", sm).unwrap()[0].1;
            let b = cubin_for_model("model_b", sm).unwrap()[0].1;
            assert_ne!(a, b, "sm_{sm}");
        }
    }

    /// The fatbin holds the elementwise PTX and every elementwise cubin, byte for byte, each in
    /// an uncompressed entry labelled with its architecture.
    #[test]
    fn fatbin_holds_the_elementwise_ptx_and_every_cubin() {
        let b = ELEMENTWISE_FATBIN;
        let u16_at = |at: usize| u16::from_le_bytes([b[at], b[at + 1]]);
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap()) as usize;
        assert_eq!(u32_at(0), 0xBA55_ED50);
        assert_eq!((u16_at(4), u16_at(6)), (1, 16));
        assert_eq!(16 + u64_at(8), b.len());
        let mut entries = Vec::new();
        let mut at = 16;
        while at < b.len() {
            let (kind, header, size) = (u16_at(at), u32_at(at + 4) as usize, u64_at(at + 8));
            assert_eq!(u32_at(at + 16), 0, "entry at {at} is compressed");
            let payload = &b[at + header..at + header + size];
            entries.push((kind, u32_at(at + 28), payload));
            at += header + size;
        }
        assert_eq!(at, b.len());
        let ptx = ptx_for_model("demo").unwrap()[1];
        assert_eq!(ptx.0, "elementwise");
        let (kind, arch, payload) = entries[0];
        assert_eq!((kind, arch), (1, 75), "the PTX entry comes first");
        assert_padded(payload, ptx.1, "the PTX entry");
        assert_eq!(entries.len(), 1 + CUBIN_ARCHS.len());
        for (&(kind, arch, payload), &sm) in entries[1..].iter().zip(CUBIN_ARCHS) {
            let elf = cubin_for_model("demo", sm).unwrap()[1].1;
            assert_eq!((kind, arch), (2, sm));
            assert_padded(payload, elf, &format!("the sm_{sm} entry"));
        }
    }

    /// `payload` is `blob` followed by fewer than 8 zero bytes.
    fn assert_padded(payload: &[u8], blob: &[u8], what: &str) {
        assert!(payload.len() >= blob.len(), "{what} is too short");
        let (head, pad) = payload.split_at(blob.len());
        assert_eq!(head, blob, "{what}");
        assert!(
            pad.len() < 8 && pad.iter().all(|&z| z == 0),
            "{what}: padding"
        );
    }
}
