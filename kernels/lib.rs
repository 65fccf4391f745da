//! The CUDA kernels of Atlas, as the blobs each model loads.
//!
//! Sources are `kernels/*.cu`; the PTX (compute_75) and sm_90 cubins built from them are committed
//! under `kernels/gen/` and embedded here (`build.rs` rebuilds them when an nvcc is available).
//! A model is a named set of `(module name, blob)` pairs, as `AtlasRegistry::load` takes it.
//!
//! | model     | modules                                                   |
//! |-----------|-----------------------------------------------------------|
//! | `demo`    | `noop`, `elementwise`, `block_reduce`, `device_global`    |
//! | `model_a` | `model` (`transform`: `out = in * 2 + 1`)                 |
//! | `model_b` | `model` (`transform`: `out = in * -3 + 0.5`)              |
//! | `faults`  | `faults` (`trap`, `write_far`: kernels that fail on purpose) |
//!
//! PTX written by nvcc 13 (`.version 9.0`) is JIT-compiled only by CUDA 13+ drivers; the cubins
//! run on sm_90 devices (H100, H200) with any driver that supports them.

/// Names of every model, in the order of the table above.
pub const MODELS: &[&str] = &["demo", "model_a", "model_b", "faults"];

macro_rules! blob {
    ($file:literal) => {
        include_bytes!(concat!(env!("ATLAS_KERNEL_DIR"), "/", $file)).as_slice()
    };
}

/// PTX text, embedded with a NUL at the end, as the driver takes it (so loading copies nothing).
macro_rules! ptx {
    ($file:literal) => {
        concat!(
            include_str!(concat!(env!("ATLAS_KERNEL_DIR"), "/", $file)),
            "\0"
        )
        .as_bytes()
    };
}

/// The elementwise module (`scale`, `axpy`) as a fatbin: sm_90 SASS and compute_90 PTX.
pub const ELEMENTWISE_FATBIN: &[u8] = blob!("elementwise.fatbin");

/// A model's modules: `(module name, blob)` pairs.
pub type Blobs = &'static [(&'static str, &'static [u8])];

/// Each model: its name, its PTX modules, the same modules as sm_90 cubins.
const TABLE: &[(&str, Blobs, Blobs)] = &[
    (
        "demo",
        &[
            ("noop", ptx!("noop.ptx")),
            ("elementwise", ptx!("elementwise.ptx")),
            ("block_reduce", ptx!("block_reduce.ptx")),
            ("device_global", ptx!("device_global.ptx")),
        ],
        &[
            ("noop", blob!("noop.sm_90.cubin")),
            ("elementwise", blob!("elementwise.sm_90.cubin")),
            ("block_reduce", blob!("block_reduce.sm_90.cubin")),
            ("device_global", blob!("device_global.sm_90.cubin")),
        ],
    ),
    (
        "model_a",
        &[("model", ptx!("model_a.ptx"))],
        &[("model", blob!("model_a.sm_90.cubin"))],
    ),
    (
        "model_b",
        &[("model", ptx!("model_b.ptx"))],
        &[("model", blob!("model_b.sm_90.cubin"))],
    ),
    (
        "faults",
        &[("faults", ptx!("faults.ptx"))],
        &[("faults", blob!("faults.sm_90.cubin"))],
    ),
];

/// The PTX modules of `model`, as `(module name, PTX text)` pairs, each text ending in a NUL;
/// `None` for an unknown model.
pub fn ptx_for_model(model: &str) -> Option<Blobs> {
    TABLE
        .iter()
        .find(|(name, _, _)| *name == model)
        .map(|(_, ptx, _)| *ptx)
}

/// The same modules as [`ptx_for_model`], as sm_90 cubins (H100/H200); `None` for an unknown model.
pub fn cubin_for_model(model: &str) -> Option<Blobs> {
    TABLE
        .iter()
        .find(|(name, _, _)| *name == model)
        .map(|(_, _, cubin)| *cubin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_lists_the_table() {
        assert_eq!(
            MODELS,
            TABLE.iter().map(|(name, _, _)| *name).collect::<Vec<_>>()
        );
    }

    #[test]
    fn every_model_has_ptx_and_cubin_with_the_same_modules() {
        for model in MODELS {
            let ptx = ptx_for_model(model).expect("listed model has PTX");
            let cubin = cubin_for_model(model).expect("listed model has cubins");
            let names = |blobs: Blobs| blobs.iter().map(|(n, _)| *n).collect::<Vec<_>>();
            assert_eq!(names(ptx), names(cubin), "{model}");
            for (name, text) in ptx {
                let text = std::str::from_utf8(text).expect("PTX is text");
                assert!(text.contains(".entry"), "{model}/{name} has no kernel");
            }
            for (name, elf) in cubin {
                assert_eq!(&elf[..4], b"\x7fELF", "{model}/{name} is not an ELF cubin");
            }
        }
        assert!(ptx_for_model("no_such_model").is_none());
    }

    #[test]
    fn tagged_models_share_function_names_but_not_constants() {
        let a = std::str::from_utf8(ptx_for_model("model_a").unwrap()[0].1).unwrap();
        let b = std::str::from_utf8(ptx_for_model("model_b").unwrap()[0].1).unwrap();
        assert!(a.contains(".entry transform") && b.contains(".entry transform"));
        assert_ne!(a, b);
    }

    #[test]
    fn fatbin_has_its_magic() {
        assert_eq!(&ELEMENTWISE_FATBIN[..4], &0xBA55_ED50u32.to_le_bytes());
    }
}
