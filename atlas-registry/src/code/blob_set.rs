//! [`BlobSet`]: one module given as blobs for several architectures, cubins and PTX, of which each
//! device loads the one it runs best ([`fit::best`]): the way Atlas's own kernels are shipped.

use std::borrow::Cow;

use crate::code::blob::{self, BlobKind, code_targets, sm_arch, sniff};
use crate::code::fit::{self, Runs, Unfit};
use crate::code::target::Devices;
use crate::error::{AtlasError, Result};

/// One module as cubins for several architectures and PTX, of which each device loads the best
/// it runs: its own SASS (a cubin built for exactly its compute capability), else SASS of an older
/// minor version of its architecture (an `sm_86` cubin on an 8.9 device; not on Tegra GPUs such
/// as Orin, which run SASS of their own compute capability only), else PTX that its driver
/// JIT-compiles (an ISA version the driver takes, for the newest architecture the device runs).
///
/// Architecture-specific ("a") code runs on its own compute capability only: an `sm_100a` cubin,
/// or `compute_100a` PTX, on 10.0 and not on 10.3; of two cubins for the device's own SM, the
/// "a" one is chosen (built for everything that device has). The cubin says it is "a" code
/// (CUDA 12 and 12.9 in `e_flags`, CUDA 13 in its `.nv.compat` section) and is given with its SM
/// number (`cubin(100, sm_100a)`). Family ("f") PTX (`compute_100f`) is JIT-compiled only within
/// its family, its major version's devices of the same or a newer minor one (10.0 and 10.3, not
/// 12.0). An "f" cubin (`sm_100f`) says nothing of it: it is taken as plain SASS of its SM, which
/// runs on the same devices, those of its family.
///
/// Added to a [`Model`](crate::Model) with [`Model::blob_set`](crate::Model::blob_set):
/// [`AtlasRegistry::load_model`](crate::AtlasRegistry::load_model) chooses for its device, and
/// [`AtlasLibrary::load_model`](crate::AtlasLibrary::load_model) for each device present (each
/// chosen blob loaded once, however many devices run it). Every blob of the set is checked at load
/// as [`validate_blob`](crate::validate_blob) checks it, whichever one the device chooses, and a
/// cubin must be built for the SM it is given for, so a packaging mistake is refused on every
/// machine, not only on the one device that would have loaded the wrong blob. A device that runs
/// none of them is refused before the driver is called, with an
/// [`AtlasError::NoBinaryForDevice`] naming what the set holds, or an [`AtlasError::PtxTooNew`]
/// when its PTX is of a newer ISA version than the driver JIT-compiles.
///
/// ```
/// use atlas_registry::BlobSet;
///
/// let module = |sm| atlas_kernels::cubin_for_model("demo", sm).unwrap()[1].1; // `elementwise`
/// let ptx = atlas_kernels::ptx_for_model("demo").unwrap()[1].1; // compute_75, PTX ISA 8.0
/// let set = BlobSet::new().cubin(80, module(80)).cubin(90, module(90)).ptx(ptx);
/// assert_eq!(set.choose((9, 0), None), Some(module(90))); // its own SASS
/// assert_eq!(set.choose((8, 6), None), Some(module(80))); // SASS of an older minor version
/// assert_eq!(set.choose((8, 7), None), Some(ptx)); // Orin (Tegra) runs sm_87 SASS only
/// assert_eq!(set.choose((7, 5), None), Some(ptx)); // PTX, JIT-compiled at load
/// assert_eq!(set.choose((12, 0), Some((12, 4))), Some(ptx));
/// assert_eq!(set.choose((12, 0), Some((11, 8))), None); // PTX ISA 8.0 needs CUDA 12.0
/// assert_eq!(set.choose((7, 0), None), None); // older than everything in it
/// ```
///
/// "a" code, for one compute capability, and "f" code, for a family (nvcc 13.0's cubins of the
/// same kernel for `-arch=sm_100a` and `-arch=sm_100f`):
///
/// ```
/// use atlas_registry::BlobSet;
///
/// # macro_rules! fixture {
/// #     ($name:literal) => {
/// #         include_bytes!(concat!(
/// #             env!("CARGO_MANIFEST_DIR"),
/// #             "/tests/fixtures/arch_variants/",
/// #             $name
/// #         ))
/// #     };
/// # }
/// let sm_100a: &[u8] = fixture!("k.sm_100a.cubin");
/// let sm_100f: &[u8] = fixture!("k.sm_100f.cubin");
/// let set = BlobSet::new().cubin(100, sm_100f).cubin(100, sm_100a);
/// assert_eq!(set.choose((10, 0), None), Some(sm_100a)); // B200: built for exactly it
/// assert_eq!(set.choose((10, 3), None), Some(sm_100f)); // B300: sm_100a does not run there
/// assert_eq!(set.choose((12, 0), None), None); // another family
/// ```
#[derive(Debug, Clone, Default)]
pub struct BlobSet<'a> {
    offered: Vec<Offered<'a>>,
}

/// A blob of a set, as it was given.
#[derive(Debug, Clone, Copy)]
enum Offered<'a> {
    /// A cubin said to be built for this SM.
    Cubin(u32, &'a [u8]),
    /// PTX.
    Ptx(&'a [u8]),
}

impl<'a> Offered<'a> {
    fn bytes(self) -> &'a [u8] {
        match self {
            Self::Cubin(_, bytes) | Self::Ptx(bytes) => bytes,
        }
    }
}

impl<'a> BlobSet<'a> {
    /// A set without blobs.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `cubin`, an ELF cubin built for SM `sm` (`10 * major + minor` of the compute
    /// capability: 90 for `sm_90` and `sm_90a`, 100 for `sm_100f`); checked at load to be one.
    pub fn cubin(mut self, sm: u32, cubin: &'a [u8]) -> Self {
        self.offered.push(Offered::Cubin(sm, cubin));
        self
    }

    /// Adds `ptx`, PTX text (NUL-terminated or not); checked at load to be PTX.
    pub fn ptx(mut self, ptx: &'a [u8]) -> Self {
        self.offered.push(Offered::Ptx(ptx));
        self
    }

    /// The blob a device of compute capability `compute_capability` loads of this set, as a load
    /// chooses it, under a driver of CUDA release `driver` (`(12, 4)`; `None`: a driver that
    /// JIT-compiles PTX of every ISA version); `None` when the device runs none of them, or
    /// `compute_capability` is none (a minor version of 10 or more). Pure: no driver or GPU is
    /// needed, and the blobs are not checked here (a load checks them).
    pub fn choose(
        &self,
        compute_capability: (u32, u32),
        driver: Option<(u32, u32)>,
    ) -> Option<&'a [u8]> {
        Devices::of(compute_capability)?;
        let fits = self.offered.iter().map(|offered| {
            let bytes = offered.bytes();
            (
                bytes,
                fit::fit(sniff(bytes), bytes, compute_capability, driver),
            )
        });
        match fit::best(fits) {
            Some((bytes, Ok(_))) => Some(bytes),
            _ => None,
        }
    }

    /// Checks every blob of the set as a load checks a blob, and each against what it was given
    /// as: for each, its kind and the bytes to hand to the driver.
    pub(crate) fn check(&self, module: &str) -> Result<Vec<(BlobKind, Cow<'a, [u8]>)>> {
        if self.offered.is_empty() {
            return Err(refused(
                module,
                "the blob set holds no blob: give it cubins (`cubin(sm, bytes)`) or PTX \
                 (`ptx(bytes)`)"
                    .into(),
            ));
        }
        self.offered
            .iter()
            .enumerate()
            .map(|(i, &offered)| {
                let bytes = offered.bytes();
                let checked = blob::prepare(module, bytes, false).map_err(|e| match e {
                    AtlasError::InvalidModule { module, reason } => AtlasError::InvalidModule {
                        module,
                        reason: format!("blob {i} of the blob set: {reason}"),
                    },
                    other => other,
                })?;
                let wrong = match offered {
                    Offered::Cubin(sm, _) => sm_arch(bytes) != Some(sm),
                    Offered::Ptx(_) => checked.0 != BlobKind::Ptx,
                };
                if wrong {
                    return Err(mislabelled(module, i, offered));
                }
                Ok(checked)
            })
            .collect()
    }
}

/// The blob a device of compute capability `cc` loads of a set's `checked` blobs (from
/// [`BlobSet::check`]) under a driver of CUDA release `driver`, with what it runs of it; or why
/// it runs none, naming all of them.
pub(crate) fn choose<'a>(
    mut checked: Vec<(BlobKind, Cow<'a, [u8]>)>,
    cc: (u32, u32),
    driver: Option<(u32, u32)>,
) -> std::result::Result<(BlobKind, Cow<'a, [u8]>, Runs), Unfit> {
    let fits = checked
        .iter()
        .enumerate()
        .map(|(i, (kind, image))| (i, fit::fit(*kind, image, cc, driver)));
    match fit::best(fits) {
        Some((i, Ok(runs))) => {
            let (kind, image) = checked.swap_remove(i);
            Ok((kind, image, runs))
        }
        Some((_, Err(Unfit::NoCode { .. }))) | None => Err(Unfit::NoCode {
            holds: checked
                .iter()
                .map(|(_, image)| code_targets(image))
                .collect::<Vec<_>>()
                .join(", "),
        }),
        Some((_, Err(too_new))) => Err(too_new),
    }
}

/// The refusal of blob `i` of a set, `offered`, which is not what it was given as.
#[cold]
fn mislabelled(module: &str, i: usize, offered: Offered<'_>) -> AtlasError {
    let given = match offered {
        Offered::Cubin(sm, _) => format!("cubin for sm_{sm}"),
        Offered::Ptx(_) => "PTX".into(),
    };
    refused(
        module,
        format!(
            "blob {i} of the blob set, given as its {given}, holds {}: give each cubin the SM it \
             is built for, and PTX as PTX",
            code_targets(offered.bytes())
        ),
    )
}

fn refused(module: &str, reason: String) -> AtlasError {
    AtlasError::InvalidModule {
        module: module.escape_debug().to_string(),
        reason,
    }
}
