//! Whether a device runs a checked blob under its driver, and what of it: its own SASS, SASS of an
//! older minor version of its architecture, or PTX the driver JIT-compiles. Told before the driver
//! sees the blob, so that the two loading errors users meet most, PTX newer than the driver
//! (`CUDA_ERROR_UNSUPPORTED_PTX_VERSION`) and code for other architectures only
//! (`CUDA_ERROR_NO_BINARY_FOR_GPU`: "a" code of another compute capability, "f" code of another
//! family, included), are refused naming the module, what it holds, the device and the driver
//! ([`Unfit`]); and blob sets load the best fit of their blobs ([`best`]).
//!
//! Atlas refuses only what the driver would refuse: which SASS and PTX a device may load is
//! [`target`](crate::code::target)'s rule, a superset of what the driver picks, and whether the
//! driver JIT-compiles PTX is [`isa`]'s table, which leaves ISA versions it does
//! not know to the driver. Of a fatbin, SASS the device runs wins over PTX (the driver takes it
//! too), and the fatbin is refused only when no entry the device may load remains. Code that
//! Atlas does not read for this (an AMD GPU code object, a clang offload bundle, bytes of an
//! unknown format, a fatbin entry of a kind Atlas does not know) is the driver's to judge.

use atlas_sys::CUresult;

use crate::code::blob::{BlobKind, code_targets, cubin_arch, fatbin, ptx};
use crate::code::isa::{self, Verdict};
use crate::code::target::{Arch, Code, Devices};
use crate::device::host::CudaHost;
use crate::driver::calls;
use crate::error::AtlasError;

/// What of a blob a device runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Runs {
    /// SASS for this architecture: the device's own, or that of an older minor version of its
    /// architecture (plain or "f").
    Sass(Arch),
    /// PTX that the driver JIT-compiles (or that only the driver can judge), for the virtual
    /// architecture `target` of ISA version `isa` (`None`: the text does not say).
    Ptx {
        /// The architecture of its `.target` (of a fatbin entry, the one its header names).
        target: Option<Arch>,
        /// Its `.version`.
        isa: Option<(u32, u32)>,
    },
    /// Code that Atlas does not read for this: the driver judges.
    Unread,
}

impl Runs {
    /// How good a choice it is, higher better: SASS over PTX (no JIT at load, code built for the
    /// device), SASS of a newer minor version and PTX of a newer architecture over older ones, of
    /// one SM "a" code over "f" code over plain (built for more of what the device has), code
    /// Atlas cannot judge last.
    fn rank(self) -> (u8, Option<Arch>) {
        match self {
            Self::Sass(arch) => (2, Some(arch)),
            Self::Ptx { target, .. } => (1, target),
            Self::Unread => (0, None),
        }
    }

    /// The ISA version of the PTX the driver JIT-compiles, when it compiles PTX and the text says.
    fn ptx_isa(self) -> Option<(u32, u32)> {
        match self {
            Self::Ptx { isa, .. } => isa,
            _ => None,
        }
    }
}

/// Why a device cannot run a blob; refused before the driver sees it ([`error`](Self::error)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Unfit {
    /// No code the device may load: SASS of other architectures, PTX for newer ones.
    NoCode {
        /// What the blob holds (`sm_80 SASS, compute_90 PTX`).
        holds: String,
    },
    /// PTX is all the device may load, and the driver is too old to JIT-compile it.
    PtxTooNew {
        /// The PTX's ISA version.
        isa: (u32, u32),
        /// The oldest CUDA release whose driver JIT-compiles it (at least).
        needs: (u32, u32),
        /// The driver's CUDA release.
        driver: (u32, u32),
    },
}

impl Unfit {
    /// The refusal of module `module` on `host`'s device.
    #[cold]
    pub(crate) fn error(&self, module: &str, host: &CudaHost) -> AtlasError {
        match self {
            Self::NoCode { holds } => no_binary_for(host, module, holds.clone()),
            &Self::PtxTooNew { isa, needs, driver } => {
                ptx_too_new(host, module, isa, Some(needs), driver, String::new())
            }
        }
    }
}

/// What a device of compute capability `cc` runs of `image`, a checked blob of `kind`, under a
/// driver of CUDA release `driver` (`None`: one that JIT-compiles every ISA version).
pub(crate) fn fit(
    kind: BlobKind,
    image: &[u8],
    cc: (u32, u32),
    driver: Option<(u32, u32)>,
) -> Result<Runs, Unfit> {
    fit_checked(kind, image, cc, driver, None)
}

/// [`fit`], where `fatbin_ptx` holds, of a fatbin, the PTX entries the device may load as its
/// check for the device handed them over (`None`: they are read here), so that a load
/// decompresses no entry a second time.
pub(crate) fn fit_checked(
    kind: BlobKind,
    image: &[u8],
    cc: (u32, u32),
    driver: Option<(u32, u32)>,
    fatbin_ptx: Option<&FatbinPtx>,
) -> Result<Runs, Unfit> {
    let Some(device) = Devices::of(cc) else {
        return Ok(Runs::Unread);
    };
    let no_code = || Unfit::NoCode {
        holds: code_targets(image),
    };
    match kind {
        BlobKind::Cubin => match cubin_arch(image) {
            Some(arch) if device.runs_sass(arch) => Ok(Runs::Sass(arch)),
            // SASS of an older minor version on a Tegra GPU: the driver's to judge.
            Some(arch) if device.may_load(Code::Sass(arch)) => Ok(Runs::Unread),
            Some(_) => Err(no_code()),
            None => Ok(Runs::Unread),
        },
        BlobKind::Ptx => {
            let header = ptx::header(image);
            match header.target {
                Some(target) if !device.may_load(Code::Ptx(target)) => Err(no_code()),
                _ => jit(header, driver),
            }
        }
        BlobKind::Fatbin => {
            fatbin_fit(image, device, driver, fatbin_ptx).unwrap_or_else(|| Err(no_code()))
        }
        BlobKind::OffloadBundle | BlobKind::Binary => Ok(Runs::Unread),
    }
}

/// Whether the driver JIT-compiles PTX of `header`, which the device may load.
fn jit(header: ptx::Header, driver: Option<(u32, u32)>) -> Result<Runs, Unfit> {
    let runs = Runs::Ptx {
        target: header.target,
        isa: header.isa,
    };
    match (header.isa, driver) {
        (Some(isa), Some(driver)) => match isa::verdict(isa, driver) {
            Verdict::Refuses { needs } => Err(Unfit::PtxTooNew { isa, needs, driver }),
            Verdict::Takes | Verdict::DriverJudges => Ok(runs),
        },
        _ => Ok(runs),
    }
}

/// What `device` runs of fatbin `image`: its best SASS, else its best PTX that the driver
/// JIT-compiles, else (entries of unknown kinds, SASS the device may load but does not surely
/// run) the driver's judgement, else the refusal of its PTX; `None` when it holds nothing the
/// device may load.
fn fatbin_fit(
    image: &[u8],
    device: Devices,
    driver: Option<(u32, u32)>,
    fatbin_ptx: Option<&FatbinPtx>,
) -> Option<Result<Runs, Unfit>> {
    let (mut sass, mut ptx, mut unknown) = (None, false, false);
    for code in fatbin::codes(image) {
        match code {
            None => unknown = true,
            Some(code) if !device.may_load(code) => {}
            Some(Code::Sass(arch)) if device.runs_sass(arch) => sass = sass.max(Some(arch)),
            Some(Code::Sass(_)) => unknown = true,
            Some(Code::Ptx(_)) => ptx = true,
        }
    }
    if let Some(arch) = sass {
        return Some(Ok(Runs::Sass(arch)));
    }
    let read;
    let entries = match fatbin_ptx {
        Some(entries) => entries,
        None => match FatbinPtx::read(image, device) {
            Some(entries) => {
                read = entries;
                &read
            }
            // Checked before (the code of every entry the device may pick): not reached.
            None => return Some(Ok(Runs::Unread)),
        },
    };
    let best_ptx = best(entries.0.iter().map(|&header| ((), jit(header, driver))));
    match best_ptx {
        Some((_, Ok(runs))) => Some(Ok(runs)),
        _ if unknown => Some(Ok(Runs::Unread)),
        Some((_, unfit)) => Some(unfit),
        None if ptx => Some(Ok(Runs::Unread)),
        None => None,
    }
}

/// The headers of the PTX entries of a fatbin that a device may load, in order, each with the
/// architecture its entry's header names (by which the driver picks it), taken from the code as
/// the fatbin's check for the device handed it over ([`add`](Self::add)).
#[derive(Debug, Default)]
pub(crate) struct FatbinPtx(Vec<ptx::Header>);

impl FatbinPtx {
    /// Takes a checked entry's `code` and its `bytes` (decompressed): of PTX, its header.
    pub(crate) fn add(&mut self, code: Code, bytes: &[u8]) {
        if let Code::Ptx(arch) = code {
            let header = ptx::header(bytes);
            self.0.push(ptx::Header {
                target: Some(arch),
                ..header
            });
        }
    }

    /// Those of fatbin `image` on `device`, read now by checking its entries for it; `None` when
    /// the check refuses one.
    fn read(image: &[u8], device: Devices) -> Option<Self> {
        let mut entries = Self::default();
        fatbin::check_picked(image, Some(device), |code, bytes, _| {
            entries.add(code, bytes)
        })
        .ok()?;
        Some(entries)
    }
}

/// The best of `fits`: the best-ranked code that runs (the first of equals); when none runs, PTX
/// that is too new over no code at all (it says what to build instead), the one that needs the
/// oldest driver first. `None` for no fits.
pub(crate) fn best<T>(
    fits: impl IntoIterator<Item = (T, Result<Runs, Unfit>)>,
) -> Option<(T, Result<Runs, Unfit>)> {
    let order = |fit: &Result<Runs, Unfit>| match fit {
        Ok(runs) => (2, runs.rank(), 0),
        // The oldest release needed ranks highest.
        Err(Unfit::PtxTooNew { needs, .. }) => (
            1,
            (0, None),
            u32::MAX - needs.0.saturating_mul(100).saturating_add(needs.1),
        ),
        Err(Unfit::NoCode { .. }) => (0, (0, None), 0),
    };
    fits.into_iter().fold(
        None,
        |chosen: Option<(T, Result<Runs, Unfit>)>, next| match chosen {
            Some(chosen) if order(&chosen.1) >= order(&next.1) => Some(chosen),
            _ => Some(next),
        },
    )
}

/// The error for a load of module `module` that failed with `error` after [`fit`] said the
/// device runs `runs` of it: the driver's `CUDA_ERROR_UNSUPPORTED_PTX_VERSION` for PTX whose ISA
/// version Atlas knows becomes [`AtlasError::PtxTooNew`], carrying the JIT log; anything else
/// stays `error`.
#[cold]
pub(crate) fn explain(error: AtlasError, module: &str, runs: Runs, host: &CudaHost) -> AtlasError {
    let unsupported = error.cuda_code() == Some(CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION.0);
    let (Some(isa), true, Ok(driver)) = (runs.ptx_isa(), unsupported, calls::cuda_version()) else {
        return error;
    };
    let jit_log = match error {
        AtlasError::ModuleLoad { jit_log, .. } => jit_log,
        _ => String::new(),
    };
    ptx_too_new(host, module, isa, None, driver, jit_log)
}

/// [`AtlasError::PtxTooNew`] for module `module` on `host`'s device.
fn ptx_too_new(
    host: &CudaHost,
    module: &str,
    isa: (u32, u32),
    needs: Option<(u32, u32)>,
    driver: (u32, u32),
    jit_log: String,
) -> AtlasError {
    AtlasError::PtxTooNew {
        module: module.escape_debug().to_string(),
        isa,
        needs,
        driver,
        driver_takes: isa::newest_for(driver),
        device: host.ordinal(),
        arch: arch(host),
        jit_log,
    }
}

/// The refusal of module `name`, which `holds` only code that `host`'s device cannot run.
#[cold]
pub(crate) fn no_binary_for(host: &CudaHost, name: &str, holds: String) -> AtlasError {
    AtlasError::NoBinaryForDevice {
        module: name.escape_debug().to_string(),
        holds,
        device: host.ordinal(),
        arch: arch(host),
    }
}

/// `sm_90`: the architecture of `host`'s device.
fn arch(host: &CudaHost) -> String {
    let (major, minor) = host.compute_capability();
    format!("sm_{major}{minor}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use atlas_kernels::{ELEMENTWISE_FATBIN, cubin_for_model, ptx_for_model};

    const NVCC13_LZ4: &[u8] = include_bytes!("blob/testdata/nvcc13.0.elementwise.lz4.fatbin");
    const NVCC13_ZSTD: &[u8] = include_bytes!("blob/testdata/nvcc13.0.elementwise.zstd.fatbin");
    const CUDA13: &[u8] = include_bytes!("blob/testdata/cuda13.elementwise.fatbin");

    fn cubin(sm: u32) -> &'static [u8] {
        cubin_for_model("demo", sm).unwrap()[1].1
    }

    fn too_new(isa: (u32, u32), needs: (u32, u32), driver: (u32, u32)) -> Result<Runs, Unfit> {
        Err(Unfit::PtxTooNew { isa, needs, driver })
    }

    #[test]
    fn a_cubin_runs_on_its_architecture_and_newer_minors_only() {
        assert_eq!(
            fit(BlobKind::Cubin, cubin(80), (8, 0), None),
            Ok(Runs::Sass(Arch::baseline(80)))
        );
        assert_eq!(
            fit(BlobKind::Cubin, cubin(80), (8, 9), None),
            Ok(Runs::Sass(Arch::baseline(80)))
        );
        // On Tegra (Orin) only its own SASS surely runs; the driver judges the rest.
        assert_eq!(
            fit(BlobKind::Cubin, cubin(86), (8, 7), None),
            Ok(Runs::Unread)
        );
        for cc in [(9, 0), (7, 5), (8, 10)] {
            let fits = fit(BlobKind::Cubin, cubin(86), cc, None);
            let holds = "sm_86 SASS".to_string();
            let want = if cc == (8, 10) {
                Ok(Runs::Unread)
            } else {
                Err(Unfit::NoCode { holds })
            };
            assert_eq!(fits, want, "{cc:?}");
        }
    }

    #[test]
    fn ptx_runs_on_its_target_and_newer_under_a_driver_of_its_isa() {
        let ptx = ptx_for_model("demo").unwrap()[1].1; // ISA 8.0, sm_75
        let runs = Ok(Runs::Ptx {
            target: Some(Arch::baseline(75)),
            isa: Some((8, 0)),
        });
        for cc in [(7, 5), (9, 0), (12, 1)] {
            assert_eq!(fit(BlobKind::Ptx, ptx, cc, Some((12, 0))), runs, "{cc:?}");
        }
        assert_eq!(fit(BlobKind::Ptx, ptx, (9, 0), None), runs);
        assert_eq!(
            fit(BlobKind::Ptx, ptx, (9, 0), Some((11, 8))),
            too_new((8, 0), (12, 0), (11, 8))
        );
        assert!(matches!(
            fit(BlobKind::Ptx, ptx, (7, 0), Some((12, 0))),
            Err(Unfit::NoCode { .. })
        ));
        // Text that does not say is the driver's to judge.
        let unsaid = b".version 9.0\n.address_size 64\n";
        assert_eq!(
            fit(BlobKind::Ptx, unsaid, (5, 0), Some((13, 0))),
            Ok(Runs::Ptx {
                target: None,
                isa: Some((9, 0))
            })
        );
    }

    #[test]
    fn a_fatbin_runs_its_best_sass_else_its_ptx_else_is_refused() {
        let fatbin = ELEMENTWISE_FATBIN; // compute_75 PTX (ISA 8.0), sm_75 to sm_90 SASS
        let ptx = Ok(Runs::Ptx {
            target: Some(Arch::baseline(75)),
            isa: Some((8, 0)),
        });
        for (cc, driver, want) in [
            ((9, 0), (11, 8), Ok(Runs::Sass(Arch::baseline(90)))),
            ((8, 9), (11, 8), Ok(Runs::Sass(Arch::baseline(89)))),
            // Orin runs the PTX; whether it runs the sm_86 SASS is the driver's to say.
            ((8, 7), (12, 0), ptx.clone()),
            ((8, 7), (11, 8), Ok(Runs::Unread)),
            ((10, 0), (12, 0), ptx),
            ((10, 0), (11, 8), too_new((8, 0), (12, 0), (11, 8))),
        ] {
            assert_eq!(
                fit(BlobKind::Fatbin, fatbin, cc, Some(driver)),
                want,
                "{cc:?} {driver:?}"
            );
        }
        let none = fit(BlobKind::Fatbin, fatbin, (7, 0), Some((13, 0)));
        let holds = "compute_75 PTX, sm_75 SASS, sm_80 SASS, sm_86 SASS, sm_89 SASS, sm_90 SASS";
        assert_eq!(
            none,
            Err(Unfit::NoCode {
                holds: holds.into()
            })
        );
        // CUDA 13's nvFatbin: compute_75 PTX beside sm_75, sm_90 and sm_100 SASS.
        assert_eq!(
            fit(BlobKind::Fatbin, CUDA13, (10, 3), Some((12, 0))),
            Ok(Runs::Sass(Arch::baseline(100)))
        );
    }

    #[test]
    fn compressed_ptx_entries_are_read_for_their_isa() {
        // nvcc 13.0: compute_90 PTX of ISA 9.0 and sm_90 SASS, both compressed.
        for fatbin in [NVCC13_LZ4, NVCC13_ZSTD] {
            assert_eq!(
                fit(BlobKind::Fatbin, fatbin, (9, 0), Some((12, 4))),
                Ok(Runs::Sass(Arch::baseline(90)))
            );
            assert_eq!(
                fit(BlobKind::Fatbin, fatbin, (10, 0), Some((12, 4))),
                too_new((9, 0), (13, 0), (12, 4))
            );
            assert_eq!(
                fit(BlobKind::Fatbin, fatbin, (10, 0), Some((13, 0))),
                Ok(Runs::Ptx {
                    target: Some(Arch::baseline(90)),
                    isa: Some((9, 0))
                })
            );
        }
    }

    #[test]
    fn the_best_fit_runs_and_ranks_highest_else_needs_the_oldest_driver() {
        let sass = |sm| Ok(Runs::Sass(Arch::baseline(sm)));
        let ptx = |target| {
            Ok(Runs::Ptx {
                target: Some(Arch::baseline(target)),
                isa: Some((8, 0)),
            })
        };
        let no_code = || {
            Err(Unfit::NoCode {
                holds: String::new(),
            })
        };
        let pick =
            |fits: Vec<Result<Runs, Unfit>>| best(fits.into_iter().enumerate()).map(|(i, _)| i);
        assert_eq!(pick(vec![ptx(90), sass(80), sass(86), no_code()]), Some(2));
        assert_eq!(pick(vec![Ok(Runs::Unread), ptx(75), ptx(80)]), Some(2));
        assert_eq!(
            pick(vec![
                no_code(),
                too_new((9, 0), (13, 0), (12, 4)),
                too_new((8, 5), (12, 5), (12, 4))
            ]),
            Some(2)
        );
        assert_eq!(
            pick(vec![too_new((9, 0), (13, 0), (12, 4)), Ok(Runs::Unread)]),
            Some(1)
        );
        assert_eq!(
            pick(vec![sass(90), sass(90)]),
            Some(0),
            "the first of equals"
        );
        assert_eq!(pick(vec![]), None);
    }

    /// `tests/fixtures/arch_variants/`'s file `name` (nvcc 13.0).
    macro_rules! arch_variant {
        ($name:literal) => {
            include_bytes!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/fixtures/arch_variants/",
                $name
            ))
        };
    }

    #[test]
    fn a_code_fits_its_own_compute_capability_f_code_its_family() {
        use crate::code::target::Features::{Family, Specific};
        let arch = |sm, features| Arch { sm, features };
        let no_code = |holds: &str| {
            Err(Unfit::NoCode {
                holds: holds.into(),
            })
        };
        let driver = Some((13, 0));
        // sm_100a, sm_100f, sm_120f, sm_90a SASS: of one SM, "a" ranks over "f".
        let mixed = arch_variant!("k.mixed.fatbin");
        for (cc, want) in [
            ((9, 0), Ok(Runs::Sass(arch(90, Specific)))),
            ((10, 0), Ok(Runs::Sass(arch(100, Specific)))),
            ((10, 3), Ok(Runs::Sass(arch(100, Family)))),
            ((12, 0), Ok(Runs::Sass(arch(120, Family)))),
            ((12, 1), Ok(Runs::Sass(arch(120, Family)))),
            (
                (11, 0),
                no_code("sm_100a SASS, sm_100f SASS, sm_120f SASS, sm_90a SASS"),
            ),
        ] {
            assert_eq!(fit(BlobKind::Fatbin, mixed, cc, driver), want, "{cc:?}");
        }
        let sm_100a = arch_variant!("k.sm_100a.cubin");
        assert_eq!(
            fit(BlobKind::Cubin, sm_100a, (10, 0), driver),
            Ok(Runs::Sass(arch(100, Specific)))
        );
        assert_eq!(
            fit(BlobKind::Cubin, sm_100a, (10, 3), driver),
            no_code("sm_100a SASS")
        );
        // PTX: compute_90a is JIT-compiled for 9.0 alone, compute_100f within its family.
        let compute_90a = arch_variant!("k.compute_90a.ptx");
        assert_eq!(
            fit(BlobKind::Ptx, compute_90a, (9, 0), driver),
            Ok(Runs::Ptx {
                target: Some(arch(90, Specific)),
                isa: Some((9, 0))
            })
        );
        assert_eq!(
            fit(BlobKind::Ptx, compute_90a, (10, 0), driver),
            no_code("compute_90a PTX (ISA 9.0)")
        );
        let compute_100f = arch_variant!("k.compute_100f.fatbin");
        assert_eq!(
            fit(BlobKind::Fatbin, compute_100f, (10, 3), driver),
            Ok(Runs::Ptx {
                target: Some(arch(100, Family)),
                isa: Some((9, 0))
            })
        );
        assert_eq!(
            fit(BlobKind::Fatbin, compute_100f, (12, 0), driver),
            no_code("compute_100f PTX")
        );
        // sm_90a SASS beside compute_90 PTX: the SASS on 9.0, the PTX on the others.
        let both = arch_variant!("k.sm_90a+compute_90.fatbin");
        assert_eq!(
            fit(BlobKind::Fatbin, both, (9, 0), driver),
            Ok(Runs::Sass(arch(90, Specific)))
        );
        assert_eq!(
            fit(BlobKind::Fatbin, both, (10, 3), driver),
            Ok(Runs::Ptx {
                target: Some(Arch::baseline(90)),
                isa: Some((9, 0))
            })
        );
    }
}
